//! Defects a fuzzer found (issue 23, section 1), each checked end to end
//! through the binary: bad input gets one line naming the file, the place
//! and the reason, and exit code 2; nothing panics or grows without bound.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{root, Scratch};

/// A scratch directory for one test, removed when it passes.
fn scratch(name: &str) -> Scratch {
    Scratch::new(&format!("fuzz-{name}"))
}

fn write(dir: &Path, name: &str, text: impl AsRef<[u8]>) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

/// Runs the binary with extra environment variables; returns (exit code,
/// stdout, stderr), asserting no panic and one line of error.
fn run_env(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("binary runs");
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!err.contains("panicked"), "panic: {err}");
    let code = out.status.code().expect("exited normally");
    if code != 0 {
        assert_eq!(err.trim_end().lines().count(), 1, "not one line: {err}");
    }
    (code, String::from_utf8_lossy(&out.stdout).to_string(), err)
}

fn run(args: &[&str]) -> (i32, String, String) {
    run_env(args, &[])
}

fn ok(args: &[&str]) -> String {
    let (code, out, err) = run(args);
    assert_eq!(code, 0, "{args:?}: {err}");
    out
}

fn input_error(args: &[&str], env: &[(&str, &str)], needles: &[&str]) {
    let (code, _, err) = run_env(args, env);
    assert_eq!(code, 2, "exit code for {args:?}: {err}");
    for n in needles {
        assert!(err.contains(n), "{err:?} lacks {n:?}");
    }
}

/// A preset topology written to `dir`.
fn preset(dir: &Path, nodes: usize, gpus: usize) -> String {
    let text = ok(&[
        "topology",
        "--preset",
        "dgx-h100",
        "--nodes",
        &nodes.to_string(),
        "--gpus-per-node",
        &gpus.to_string(),
    ]);
    write(dir, &format!("t{nodes}x{gpus}.json"), text)
}

fn transfers(plan: &str) -> usize {
    let text = std::fs::read_to_string(plan).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["transfers"].as_array().unwrap().len()
}

/// Item 1: `lp` cut a rank's copy to itself into 4 KiB lanes, so the plan
/// grew with the diagonal (64 MiB: 16,384 transfers; 8 TiB aborted).
#[test]
fn lp_self_copy_is_one_transfer() {
    let dir = scratch("lp-self");
    let plan = dir.join("p.json").display().to_string();
    let one = preset(&dir, 1, 1);
    let m = write(&dir, "m1.json", r#"{"ranks":1,"matrix":[[67108864]]}"#);
    ok(&[
        "compile",
        "--topology",
        &one,
        "--traffic",
        &m,
        "--algorithm",
        "lp",
        "--out",
        &plan,
    ]);
    assert_eq!(transfers(&plan), 1);
    // Beside other traffic, on two nodes: still a handful.
    let two = preset(&dir, 2, 1);
    let m = write(
        &dir,
        "m2.json",
        r#"{"ranks":2,"matrix":[[67108864,1000],[1000,67108864]]}"#,
    );
    ok(&[
        "compile",
        "--topology",
        &two,
        "--traffic",
        &m,
        "--algorithm",
        "lp",
        "--out",
        &plan,
    ]);
    assert!(transfers(&plan) <= 4, "{} transfers", transfers(&plan));
    ok(&[
        "verify",
        "--plan",
        &plan,
        "--traffic",
        &m,
        "--topology",
        &two,
    ]);
}

/// Item 2: input files were read whole with no bound (`/dev/zero` grew
/// until the host ran out of memory).
#[test]
fn input_files_are_read_within_a_limit() {
    let dir = scratch("limit");
    let topo = preset(&dir, 1, 2);
    // Larger than the topology, so that a limit just below it refuses it.
    let padded = format!(
        r#"{{"ranks":2,"matrix":[[1,2],[3,4]]}}{}"#,
        " ".repeat(4096)
    );
    let m = write(&dir, "m.json", padded);
    let plan = dir.join("p.json").display().to_string();
    let compile = |topo: &str, m: &str| -> Vec<String> {
        [
            "compile",
            "--topology",
            topo,
            "--traffic",
            m,
            "--out",
            &plan,
        ]
        .map(String::from)
        .to_vec()
    };
    let limit = |bytes: &str| [("SWITCHYARD_MAX_INPUT_BYTES", bytes.to_string())];
    let refused = |bytes: &str| {
        format!("larger than {bytes} bytes, the most an input file may hold (set SWITCHYARD_MAX_INPUT_BYTES to raise it)")
    };
    let check = |args: Vec<String>, bytes: &str, needles: &[&str]| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let env = limit(bytes);
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let (code, _, err) = run_env(&args, &env);
        if needles.is_empty() {
            assert_eq!(code, 0, "{err}");
        } else {
            assert_eq!(code, 2, "{err}");
            for n in needles {
                assert!(err.contains(n), "{err:?} lacks {n:?}");
            }
        }
    };
    if Path::new("/dev/zero").exists() {
        let why = refused("65536");
        check(compile(&topo, "/dev/zero"), "65536", &["/dev/zero: ", &why]);
        check(
            compile("/dev/urandom", &m),
            "65536",
            &["/dev/urandom: ", &why],
        );
    }
    // A regular file: the limit is on what is read, whatever its size says.
    let size = std::fs::metadata(&m).unwrap().len();
    check(compile(&topo, &m), &size.to_string(), &[]);
    let less = (size - 1).to_string();
    check(compile(&topo, &m), &less, &["m.json: ", &refused(&less)]);
    for bad in ["0", "-1", "1e9", "lots", ""] {
        check(
            compile(&topo, &m),
            bad,
            &["SWITCHYARD_MAX_INPUT_BYTES: ", "is not a byte count"],
        );
    }
}

/// Item 6: "not UTF-8 text" named no place.
#[test]
fn non_utf8_names_its_byte_offset() {
    let dir = scratch("utf8");
    let topo = preset(&dir, 1, 2);
    let m = write(
        &dir,
        "m.json",
        b"{\"ranks\":2,\n\"matrix\":[[1,\xff],[3,4]]}",
    );
    let plan = dir.join("p.json").display().to_string();
    input_error(
        &[
            "compile",
            "--topology",
            &topo,
            "--traffic",
            &m,
            "--out",
            &plan,
        ],
        &[],
        &["m.json: line 2, byte offset 25: not UTF-8 text (byte 0xff)"],
    );
}

/// A small MSCCL file Switchyard wrote, its traffic and topology.
fn small_xml(dir: &Path) -> (String, String, String) {
    let topo = preset(dir, 1, 2);
    let m = write(
        dir,
        "m.json",
        r#"{"ranks":2,"matrix":[[4096,4096],[4096,4096]]}"#,
    );
    let xml = dir.join("s.xml").display().to_string();
    ok(&[
        "compile",
        "--topology",
        &topo,
        "--traffic",
        &m,
        "--out",
        &xml,
    ]);
    (std::fs::read_to_string(&xml).unwrap(), m, topo)
}

/// `verify`, `simulate` and `run` on `text` as `name`: all exit 2 with
/// every needle, or all succeed when there are none.
fn xml_commands(dir: &Path, name: &str, text: &str, m: &str, topo: &str, needles: &[&str]) {
    let p = write(dir, name, text);
    let commands: [Vec<&str>; 4] = [
        vec!["verify", "--plan", &p],
        vec!["verify", "--plan", &p, "--traffic", m],
        vec!["simulate", "--plan", &p, "--traffic", m, "--topology", topo],
        vec!["run", "--plan", &p, "--traffic", m, "--threads", "2"],
    ];
    for args in commands {
        if needles.is_empty() {
            ok(&args);
        } else {
            input_error(&args, &[], needles);
        }
    }
}

/// Item 3: reading XML skipped the lexical rules the executor enforces
/// (and one refused file disables MSCCL for every communicator).
#[test]
fn xml_lexical_rules_hold_on_read() {
    let dir = scratch("xml-lex");
    let (text, m, topo) = small_xml(&dir);
    xml_commands(&dir, "good.xml", &text, &m, &topo, &[]);
    let first = text.lines().next().unwrap();
    let rest = &text[first.len() + 1..];
    let cases: Vec<(&str, String, &str)> = vec![
        (
            "prolog",
            format!("<?xml version=\"1.0\"?>\n{text}"),
            "line 1: XML prolog",
        ),
        ("bom", format!("\u{feff}{text}"), "line 1: byte-order mark"),
        (
            "tab",
            text.replacen("  <gpu", "\t<gpu", 1),
            "line 2: tab at column 1",
        ),
        (
            "comment",
            format!("{first}\n  <!--x=1-->\n{rest}"),
            "line 2: comment the executor misreads",
        ),
        (
            "twotags",
            text.replacen("\n    <tb id=\"1\"", "<tb id=\"1\"", 1),
            "line 8: ",
        ),
        (
            "longvalue",
            text.replacen(
                r#"proto="LL""#,
                &format!(r#"proto="{}""#, "L".repeat(300)),
                1,
            ),
            "line 1: value of `proto` is longer than the executor's 256-byte buffer",
        ),
        (
            "attrs",
            text.replacen(
                r#" proto="LL""#,
                &format!(r#" proto="LL"{}"#, r#" x="1""#.repeat(7)),
                1,
            ),
            "line 1: 17 attributes: the executor keeps only the first 16",
        ),
        (
            "entity",
            text.replacen("switchyard direct", "switchyard&amp;direct", 1),
            "line 1: value of `name` holds `&`",
        ),
        (
            "noclose",
            text.replace("</algo>\n", ""),
            "line 1: <algo> is never closed",
        ),
        (
            "doctype",
            format!("{first}\n<!DOCTYPE algo>\n{rest}"),
            "line 2: DOCTYPE",
        ),
    ];
    for (name, bad, want) in cases {
        let file = format!("{name}.xml");
        xml_commands(&dir, &file, &bad, &m, &topo, &[&format!("{file}: {want}")]);
    }
}

/// Item 3: every checked-in schedule and every real plan in the shared
/// reference data still loads and verifies through the CLI.
#[test]
fn real_xml_files_still_load() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(root("schedules"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "xml"))
        .collect();
    match common::refdata_dir() {
        Some(d) => files.extend(
            std::fs::read_dir(d.join("msccl-examples"))
                .unwrap()
                .map(|e| e.unwrap().path())
                .filter(|p| p.extension().is_some_and(|e| e == "xml")),
        ),
        None => eprintln!("skipped: no shared refdata (set SWITCHYARD_REFDATA)"),
    }
    assert!(files.len() >= 9);
    for f in files {
        let out = ok(&["verify", "--plan", &f.display().to_string()]);
        assert!(out.starts_with("ok:"), "{}: {out}", f.display());
    }
}

/// Item 4: malformed facts in a Switchyard name were silently dropped
/// (read as another chunk size, layout or node shape).
#[test]
fn xml_name_facts_are_checked() {
    let dir = scratch("xml-facts");
    let (text, m, topo) = small_xml(&dir);
    let named = |facts: &str| {
        text.replacen(
            "switchyard direct layout=padded chunk_bytes=16 gpus_per_node=2",
            facts,
            1,
        )
    };
    let cases = [
        (
            "chunk_bytes=abc",
            "chunk_bytes=abc in the name is not a whole number",
        ),
        (
            "chunk_bytes=-16",
            "chunk_bytes=-16 in the name is not a whole number",
        ),
        (
            "chunk_bytes=18446744073709551616",
            "chunk_bytes=18446744073709551616 in the name is not a whole number",
        ),
        (
            "chunk_bytes=0",
            "chunk_bytes=0 in the name is not a whole number",
        ),
        ("layout=weird", "layout in the name: unknown layout `weird`"),
        (
            "gpus_per_node=0",
            "gpus_per_node=0 in the name is not a whole number",
        ),
        (
            "gpus_per_node=3",
            "gpus_per_node=3 in the name does not split ngpus=\"2\" into whole nodes",
        ),
    ];
    for (i, (fact, want)) in cases.into_iter().enumerate() {
        let file = format!("f{i}.xml");
        let bad = named(&format!("switchyard direct {fact}"));
        xml_commands(
            &dir,
            &file,
            &bad,
            &m,
            &topo,
            &[&format!("{file}: line 1: <algo>: {want}")],
        );
    }
    // Names other tools write carry no Switchyard facts and still load.
    for (i, name) in ["alltoall_allpairs", "hierarchical chunk_bytes=abc", ""]
        .into_iter()
        .enumerate()
    {
        xml_commands(&dir, &format!("other{i}.xml"), &named(name), &m, &topo, &[]);
    }
}

/// Item 5: an unknown field inside a plan's `path` was accepted.
#[test]
fn unknown_field_in_a_path_is_rejected() {
    let dir = scratch("path");
    let topo = preset(&dir, 1, 2);
    let m = write(&dir, "m.json", r#"{"ranks":2,"matrix":[[1,2],[3,4]]}"#);
    let plan = dir.join("p.json").display().to_string();
    ok(&[
        "compile",
        "--topology",
        &topo,
        "--traffic",
        &m,
        "--out",
        &plan,
    ]);
    let text = std::fs::read_to_string(&plan).unwrap();
    assert!(text.contains(r#""path":{"kind":"local"}"#), "{text}");
    let bad = write(
        &dir,
        "bad.json",
        text.replacen(
            r#""path":{"kind":"local"}"#,
            r#""path":{"kind":"local","__proto__":1}"#,
            1,
        ),
    );
    input_error(
        &["verify", "--plan", &bad, "--traffic", &m],
        &[],
        &["bad.json: line 1, column", "unknown field `__proto__`"],
    );
}

/// Item 9: in a `links` topology, names such as `gpu-1` or `GPU0` became
/// switch vertices, and the GPU they meant silently lost the link.
#[test]
fn gpu_like_vertex_names_are_errors() {
    let dir = scratch("names");
    let m = write(&dir, "m.json", r#"{"ranks":2,"matrix":[[0,1],[1,0]]}"#);
    let plan = dir.join("p.json").display().to_string();
    let cases = [
        ("GPU1", "links[1].to: `GPU1` is not a GPU's name; write gpu1"),
        ("gpu-1", "links[1].to: `gpu-1` looks like a GPU's name but is none: the topology has 2 GPUs (gpu0..gpu1)"),
        ("gpu_1", "links[1].to: `gpu_1` is not a GPU's name; write gpu1"),
        ("gpu2", "links[1].to: gpu2 does not exist: the topology has 2 GPUs (gpu0..gpu1)"),
    ];
    for (i, (name, want)) in cases.into_iter().enumerate() {
        let text = format!(
            r#"{{"name":"x","nodes":2,"gpus_per_node":1,"links":[
                {{"from":"gpu0","to":"gpu1","bandwidth_GBps":10,"bidirectional":true}},
                {{"from":"gpu0","to":"{name}","bandwidth_GBps":10,"bidirectional":true}}]}}"#
        );
        let topo = write(&dir, &format!("t{i}.json"), text);
        input_error(
            &[
                "compile",
                "--topology",
                &topo,
                "--traffic",
                &m,
                "--out",
                &plan,
            ],
            &[],
            &[&format!("t{i}.json: {want}")],
        );
    }
}

/// Item 7: `lp` on a legal topology with many idle NICs built an LP of
/// millions of variables and ignored `--time-limit` (8.4 s against 3 s at
/// 2^16 NICs per node in the dev profile; 25.6 s against 5 s and a HiGHS
/// failure at 2^20).
#[test]
fn lp_honours_its_time_limit_with_idle_nics() {
    let dir = scratch("idle-nics");
    let topo = write(
        &dir,
        "t.json",
        r#"{"name":"idle","nodes":2,"gpus_per_node":1,
            "intra":{"kind":"switch","bandwidth_GBps":450,"latency_us":1},
            "nic":{"per_node":65536,"bandwidth_GBps":50,"latency_us":3}}"#,
    );
    let m = write(
        &dir,
        "m.json",
        r#"{"ranks":2,"matrix":[[0,1000000],[1000000,0]]}"#,
    );
    let plan = dir.join("p.json").display().to_string();
    for limit in ["3", "0.000001"] {
        let started = std::time::Instant::now();
        ok(&[
            "compile",
            "--topology",
            &topo,
            "--traffic",
            &m,
            "--algorithm",
            "lp",
            "--time-limit",
            limit,
            "--out",
            &plan,
        ]);
        let took = started.elapsed().as_secs_f64();
        assert!(took < 3.0, "--time-limit {limit}: {took:.1} s");
        ok(&[
            "verify",
            "--plan",
            &plan,
            "--traffic",
            &m,
            "--topology",
            &topo,
        ]);
    }
}
