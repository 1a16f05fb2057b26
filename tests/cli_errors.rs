//! Every kind of bad input gets one line naming the file, the place and the
//! reason, and exit code 2; a failed check exits 1; nothing panics.

mod common;
use common::Scratch;

use std::path::PathBuf;
use std::process::Command;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_switchyard"))
}

fn example(rel: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(rel)
        .display()
        .to_string()
}

/// A scratch directory for one test, removed when it passes.
fn scratch(name: &str) -> Scratch {
    Scratch::new(&format!("cli-{name}"))
}

fn write(dir: &std::path::Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

/// Runs the binary and returns (exit code, stderr), asserting one line and no panic.
fn run(args: &[&str]) -> (i32, String) {
    let out = bin().args(args).output().expect("binary runs");
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!err.contains("panicked"), "panic: {err}");
    let code = out.status.code().expect("exited normally");
    if code != 0 {
        assert_eq!(err.trim_end().lines().count(), 1, "not one line: {err}");
    }
    (code, err)
}

/// `compile` that must succeed: the files other checks start from.
fn compile_ok(topology: &str, traffic: &str, out: &str) {
    let (code, err) = run(&[
        "compile",
        "--topology",
        topology,
        "--traffic",
        traffic,
        "--out",
        out,
    ]);
    assert_eq!(code, 0, "{err}");
}

fn expect_input_error(args: &[&str], needles: &[&str]) {
    let (code, err) = run(args);
    assert_eq!(code, 2, "exit code for {args:?}: {err}");
    for n in needles {
        assert!(err.contains(n), "{err:?} lacks {n:?}");
    }
}

fn compile_with_traffic(dir: &std::path::Path, traffic: &str) -> Vec<String> {
    let topo = example("topologies/dgx-h100-2x8.json");
    let out = dir.join("plan.json").display().to_string();
    vec![
        "compile".into(),
        "--topology".into(),
        topo,
        "--traffic".into(),
        traffic.into(),
        "--out".into(),
        out,
    ]
}

fn args(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[test]
fn bad_traffic_values_name_row_and_column() {
    let dir = scratch("traffic");
    let cases = [
        (
            "notsquare.json",
            r#"{"ranks":2,"matrix":[[1,2],[3]]}"#,
            vec!["notsquare.json", "row 1", "square"],
        ),
        (
            "negative.json",
            r#"{"ranks":2,"matrix":[[1,2],[3,-4]]}"#,
            vec!["row 1, column 1", "negative"],
        ),
        (
            "fraction.json",
            r#"{"ranks":2,"matrix":[[1,2.5],[3,4]]}"#,
            vec!["row 0, column 1", "fractional"],
        ),
        (
            "word.json",
            r#"{"ranks":2,"matrix":[[1,2],["x",4]]}"#,
            vec!["row 1, column 0", "not a byte count"],
        ),
        (
            "truncated.json",
            r#"{"ranks":2,"matrix":[[1,2],[3,4]"#,
            vec!["truncated.json", "line 1", "truncated"],
        ),
        (
            "bad.csv",
            "1,2\n3,four\n",
            vec!["bad.csv", "row 1, column 1", "not a byte count"],
        ),
    ];
    for (name, text, needles) in cases {
        let path = write(&dir, name, text);
        let a = compile_with_traffic(&dir, &path);
        expect_input_error(&args(&a), &needles);
    }
}

#[test]
fn ranks_must_match_the_topology() {
    let dir = scratch("ranks");
    let a = compile_with_traffic(&dir, &example("traffic/moe-32.json"));
    expect_input_error(&args(&a), &["moe-32.json", "32 ranks", "16 GPUs"]);
}

#[test]
fn bad_topologies() {
    let dir = scratch("topo");
    let traffic = example("traffic/lognormal-4.json");
    let base = r#""intra":{"kind":"switch","bandwidth_GBps":100,"latency_us":1},"nic":{"per_node":2,"bandwidth_GBps":BW,"latency_us":1}"#;
    let cases = [
        ("zero-bw.json", format!(r#"{{"name":"x","nodes":2,"gpus_per_node":2,{}}}"#, base.replace("BW", "0")), vec!["nic.bandwidth_GBps", "positive"]),
        ("neg-bw.json", format!(r#"{{"name":"x","nodes":2,"gpus_per_node":2,{}}}"#, base.replace("BW", "-5")), vec!["nic.bandwidth_GBps", "-5"]),
        ("zero-nodes.json", format!(r#"{{"name":"x","nodes":0,"gpus_per_node":2,{}}}"#, base.replace("BW", "5")), vec!["zero-nodes.json: nodes"]),
        ("zero-gpus.json", format!(r#"{{"name":"x","nodes":2,"gpus_per_node":0,{}}}"#, base.replace("BW", "5")), vec!["gpus_per_node"]),
        (
            "islands.json",
            r#"{"name":"x","nodes":4,"gpus_per_node":1,"links":[{"from":"gpu0","to":"gpu1","bandwidth_GBps":1,"bidirectional":true},{"from":"gpu2","to":"gpu3","bandwidth_GBps":1,"bidirectional":true}]}"#.to_string(),
            vec!["islands.json: links", "disconnected"],
        ),
        ("unknown-field.json", r#"{"name":"x","nodes":1,"gpus_per_node":4,"intra":{"kind":"switch","bandwidth_GBps":1,"latency_us":0},"nics":3}"#.to_string(), vec!["unknown field"]),
    ];
    for (name, text, needles) in cases {
        let topo = write(&dir, name, &text);
        let out = dir.join("p.json").display().to_string();
        expect_input_error(
            &[
                "compile",
                "--topology",
                &topo,
                "--traffic",
                &traffic,
                "--out",
                &out,
            ],
            &needles,
        );
    }
}

#[test]
fn missing_files_unknown_names() {
    let dir = scratch("names");
    let out = dir.join("p.json").display().to_string();
    let topo = example("topologies/dgx-h100-2x8.json");
    let traffic = example("traffic/moe-16.json");
    expect_input_error(
        &[
            "compile",
            "--topology",
            "/nonexistent/t.json",
            "--traffic",
            &traffic,
            "--out",
            &out,
        ],
        &["/nonexistent/t.json", "no such file"],
    );
    expect_input_error(
        &[
            "compile",
            "--topology",
            &topo,
            "--traffic",
            &traffic,
            "--algorithm",
            "magic",
            "--out",
            &out,
        ],
        &["unknown algorithm `magic`", "direct"],
    );
    expect_input_error(
        &["topology", "--preset", "tpu-v5", "--nodes", "2"],
        &["unknown preset"],
    );
    expect_input_error(
        &["topology", "--preset", "dgx-h100", "--nodes", "0"],
        &["nodes", "at least 1"],
    );
    expect_input_error(
        &["traffic", "--ranks", "4", "--pattern", "zipf"],
        &["--pattern", "needs a parameter"],
    );
    expect_input_error(
        &[
            "verify",
            "--plan",
            "/nonexistent/p.json",
            "--traffic",
            &traffic,
        ],
        &["no such file"],
    );
}

#[test]
fn wrong_plan_fails_verification_with_exit_1() {
    let dir = scratch("verify");
    let topo = example("topologies/dgx-h100-2x8.json");
    let traffic = example("traffic/moe-16.json");
    let out = dir.join("p.json").display().to_string();
    compile_ok(&topo, &traffic, &out);
    let (code, _) = run(&[
        "verify",
        "--plan",
        &out,
        "--traffic",
        &traffic,
        "--topology",
        &topo,
    ]);
    assert_eq!(code, 0);
    // Drop the last transfer: its bytes never arrive.
    let mut plan: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    plan["transfers"].as_array_mut().unwrap().pop();
    let broken = write(&dir, "broken.json", &plan.to_string());
    let (code, err) = run(&["verify", "--plan", &broken, "--traffic", &traffic]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("broken.json") && err.contains("never written"),
        "{err}"
    );
}

/// A one-node, two-GPU cluster and a 2x2 matrix, with a direct plan for them.
fn tiny(dir: &std::path::Path) -> (String, String, String) {
    let topo = write(
        dir,
        "t.json",
        r#"{"name":"x","nodes":1,"gpus_per_node":2,"intra":{"kind":"switch","bandwidth_GBps":100,"latency_us":1}}"#,
    );
    let traffic = write(dir, "m.json", r#"{"ranks":2,"matrix":[[10,20],[30,40]]}"#);
    let plan = dir.join("p.json").display().to_string();
    compile_ok(&topo, &traffic, &plan);
    (topo, traffic, plan)
}

#[test]
fn argument_errors_are_one_line() {
    // clap printed a usage block; a negative number was "an unexpected argument".
    expect_input_error(
        &["compile", "--topology", "t.json"],
        &["required arguments were not provided: --traffic <TRAFFIC>; --out <OUT>"],
    );
    expect_input_error(
        &["compile", "--frobnicate"],
        &["unexpected argument '--frobnicate'"],
    );
    expect_input_error(&[], &["no command given"]);
    let dir = scratch("args");
    let (topo, traffic, plan) = tiny(&dir);
    let out = dir.join("q.json").display().to_string();
    // An absurd value is quoted short, not with its 300 digits.
    for limit in ["-1", "-1e300"] {
        expect_input_error(
            &[
                "compile",
                "--topology",
                &topo,
                "--traffic",
                &traffic,
                "--algorithm",
                "lp",
                "--out",
                &out,
                "--time-limit",
                limit,
            ],
            &[&format!(
                "--time-limit: must be a positive number of seconds, got {limit}"
            )],
        );
    }
    expect_input_error(
        &["traffic", "--ranks", "4", "--skew", "-5"],
        &["--skew: must be zero or positive"],
    );
    expect_input_error(
        &[
            "topology",
            "--preset",
            "dgx-h100",
            "--nodes",
            "2",
            "--oversubscription",
            "-3",
        ],
        &["--oversubscription", "--nodes-per-leaf"],
    );
    // 1e300 s panicked converting to a Duration.
    expect_input_error(
        &[
            "run",
            "--plan",
            &plan,
            "--traffic",
            &traffic,
            "--timeout",
            "1e300",
        ],
        &["--timeout: must be a positive number of seconds, got 1e300"],
    );
    expect_input_error(
        &[
            "run",
            "--plan",
            &plan,
            "--traffic",
            &traffic,
            "--threads",
            "100000",
        ],
        &["--threads: 100000 worker threads; at most 1024"],
    );
    // 2^64 - 1 overflowed chunks x bytes; 0 was a failed run (exit 1).
    let xml = dir.join("q.xml").display().to_string();
    for bad in ["0", "18446744073709551615"] {
        expect_input_error(
            &[
                "compile",
                "--topology",
                &topo,
                "--traffic",
                &traffic,
                "--out",
                &xml,
                "--chunk-bytes",
                bad,
            ],
            &["--chunk-bytes: must be in 1..=274877906944"],
        );
    }
    // A chunk too small for the executor's offsets is the caller's choice:
    // bad input, said once, without the default's retries (was exit 1).
    let big = write(
        &dir,
        "big.json",
        r#"{"ranks":2,"matrix":[[0,40000],[10,0]]}"#,
    );
    expect_input_error(
        &[
            "compile",
            "--topology",
            &topo,
            "--traffic",
            &big,
            "--algorithm",
            "direct",
            "--out",
            &xml,
            "--chunk-bytes",
            "1",
        ],
        &[
            "--chunk-bytes: 1-byte chunks are too small for msccl",
            "more chunks than offsets can address",
        ],
    );
    // The whole suite (or the solver) ran before the path was found unwritable.
    expect_input_error(
        &["bench", "--quick", "--json", "/nonexistent/dir/b.json"],
        &["/nonexistent/dir/b.json: cannot write: /nonexistent/dir is not a directory"],
    );
    expect_input_error(
        &[
            "compile",
            "--topology",
            &topo,
            "--traffic",
            &traffic,
            "--algorithm",
            "lp",
            "--out",
            "/nonexistent/dir/p.json",
        ],
        &["/nonexistent/dir/p.json: cannot write"],
    );
    // ranks^2 cells were allocated for any --ranks; u64::MAX bytes overflowed.
    expect_input_error(
        &["traffic", "--ranks", "100000000"],
        &["--ranks", "at most 4096"],
    );
    expect_input_error(
        &[
            "traffic",
            "--ranks",
            "4",
            "--pattern",
            "hotspot:0.5",
            "--bytes",
            "18446744073709551615",
        ],
        &["--bytes", "2^53"],
    );
}

#[test]
fn absurd_sizes_are_input_errors() {
    let dir = scratch("absurd");
    let (topo, traffic, plan) = tiny(&dir);
    let out = dir.join("q.json").display().to_string();
    // Sums overflowed (a panic); a million empty rows allocated 8 TB.
    let max = write(
        &dir,
        "max.json",
        r#"{"matrix":[[18446744073709551615,1],[1,1]]}"#,
    );
    expect_input_error(
        &[
            "compile",
            "--topology",
            &topo,
            "--traffic",
            &max,
            "--out",
            &out,
        ],
        &["max.json: row 0, column 0", "past 2^53 bytes"],
    );
    let rows = write(&dir, "rows.csv", &"0\n".repeat(1_000_000));
    expect_input_error(
        &[
            "compile",
            "--topology",
            &topo,
            "--traffic",
            &rows,
            "--out",
            &out,
        ],
        &["rows.csv: is not square: 1000000 rows of 1 value"],
    );
    // 1e308 GB/s: the LP failed with "unexpected error" (exit 1).
    let fast = write(
        &dir,
        "fast.json",
        r#"{"name":"x","nodes":1,"gpus_per_node":2,"intra":{"kind":"switch","bandwidth_GBps":1e308,"latency_us":1}}"#,
    );
    expect_input_error(
        &[
            "compile",
            "--topology",
            &fast,
            "--traffic",
            &traffic,
            "--out",
            &out,
        ],
        &["fast.json: intra.bandwidth_GBps: must be between 1e-3 and 1e6, got 1e308"],
    );
    // A links graph of 2^20 GPUs allocated 2^40 paths.
    let big = write(
        &dir,
        "big.json",
        r#"{"name":"x","nodes":1048576,"gpus_per_node":1,"links":[{"from":"gpu0","to":"gpu1","bandwidth_GBps":1}]}"#,
    );
    expect_input_error(
        &[
            "compile",
            "--topology",
            &big,
            "--traffic",
            &traffic,
            "--out",
            &out,
        ],
        &["big.json: nodes: a `links` topology has at most 1024 GPUs"],
    );
    // Plans: structure errors are bad input (exit 2), named by JSON place.
    let mut p: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&plan).unwrap()).unwrap();
    p["transfers"][0]["deps"] = serde_json::json!([99]);
    let deps = write(&dir, "deps.json", &p.to_string());
    for cmd in ["verify", "run"] {
        expect_input_error(
            &[cmd, "--plan", &deps, "--traffic", &traffic],
            &["deps.json: transfers[0].deps: depends on transfer 99"],
        );
    }
    // XML: an offset near i64::MAX overflowed `off + cnt`.
    let xml = dir.join("q.xml").display().to_string();
    compile_ok(&topo, &traffic, &xml);
    let text = std::fs::read_to_string(&xml).unwrap();
    let at = text.find("srcoff=\"").unwrap() + "srcoff=\"".len();
    let end = at + text[at..].find('"').unwrap();
    let broken = format!("{}9223372036854775807{}", &text[..at], &text[end..]);
    let bad = write(&dir, "bad.xml", &broken);
    expect_input_error(
        &["verify", "--plan", &bad, "--traffic", &traffic],
        &["bad.xml: line ", "chunks 9223372036854775807.."],
    );
}

#[test]
fn a_run_that_cannot_allocate_fails_with_exit_1() {
    let dir = scratch("alloc");
    let (_, traffic, plan) = tiny(&dir);
    let mut p: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&plan).unwrap()).unwrap();
    p["scratch"] = serde_json::json!([u64::MAX, 0]);
    let huge = write(&dir, "huge.json", &p.to_string());
    let (code, err) = run(&["run", "--plan", &huge, "--traffic", &traffic]);
    assert_eq!(code, 1, "{err}");
    // Where the available memory is known, the run is refused before any
    // allocation, with both figures; elsewhere the allocation fails.
    let want = if cfg!(target_os = "linux") {
        "huge.json (cpu): the input, output and scratch buffers of 2 ranks need 18446744073709551615 bytes"
    } else {
        "huge.json (cpu): cannot allocate 18446744073709551615 bytes for the scratch of rank 0"
    };
    assert!(err.contains(want), "{err}");
}

#[test]
fn files_that_do_not_fit_each_other_are_input_errors() {
    // A JSON plan for 16 ranks against a 2-rank matrix was a failed check
    // (exit 1, "transfer 0: ...") in verify and simulate, and blamed the
    // traffic file in run.
    let dir = scratch("fit");
    let (topo, traffic, _) = tiny(&dir);
    let big = dir.join("big.json").display().to_string();
    compile_ok(
        &example("topologies/dgx-h100-2x8.json"),
        &example("traffic/moe-16.json"),
        &big,
    );
    for cmd in ["verify", "run"] {
        expect_input_error(
            &[cmd, "--plan", &big, "--traffic", &traffic],
            &["big.json: the plan is for 16 ranks but the traffic has 2"],
        );
    }
    expect_input_error(
        &[
            "simulate",
            "--plan",
            &big,
            "--traffic",
            &traffic,
            "--topology",
            &topo,
        ],
        &["big.json: the plan is for 16 ranks but the traffic has 2"],
    );
    // `P.JSON` and `P.XML` were "unknown plan format" (verify even read
    // `P.XML`'s traffic first, as XML).
    let upper = dir.join("P.JSON").display().to_string();
    compile_ok(&topo, &traffic, &upper);
    let (code, err) = run(&["verify", "--plan", &upper, "--traffic", &traffic]);
    assert_eq!(code, 0, "{err}");
    let upper_xml = dir.join("P.XML").display().to_string();
    compile_ok(&topo, &traffic, &upper_xml);
    let (code, err) = run(&["verify", "--plan", &upper_xml]);
    assert_eq!(code, 0, "{err}");
    // A links topology naming one GPU two ways built two vertices.
    let alias = write(
        &dir,
        "alias.json",
        r#"{"name":"x","nodes":2,"gpus_per_node":1,"links":[{"from":"gpu0","to":"gpu1","bandwidth_GBps":1},{"from":"gpu01","to":"gpu0","bandwidth_GBps":1}]}"#,
    );
    let m2 = write(&dir, "m2.json", r#"{"ranks":2,"matrix":[[0,1],[1,0]]}"#);
    let out = dir.join("q.json").display().to_string();
    expect_input_error(
        &[
            "compile",
            "--topology",
            &alias,
            "--traffic",
            &m2,
            "--out",
            &out,
        ],
        &["alias.json: links[1].from: `gpu01` is not a GPU's name; write gpu1"],
    );
}

/// `switchyard traffic ... | head -c 100`: when the reader goes away the
/// binary ends quietly (SIGPIPE), as other command-line tools do, instead of
/// panicking on the closed pipe.
#[cfg(unix)]
#[test]
fn a_closed_pipe_ends_quietly() {
    use std::io::Read;
    use std::os::unix::process::ExitStatusExt;
    use std::process::Stdio;
    // A 512-rank matrix is about 1.5 MB of JSON: far more than a pipe holds.
    let mut child = bin()
        .args(["traffic", "--pattern", "uniform", "--ranks", "512"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("binary runs");
    let mut head = [0u8; 100];
    child
        .stdout
        .take()
        .expect("stdout")
        .read_exact(&mut head)
        .expect("first bytes");
    // The read end is dropped here; the writer hits the closed pipe.
    let out = child.wait_with_output().expect("binary ends");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.is_empty(), "stderr: {err}");
    assert_eq!(out.status.signal(), Some(13), "{:?}", out.status);
}
