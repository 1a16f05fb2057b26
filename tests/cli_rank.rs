//! `compile --rank R`: one rank's own program, whose ops are exactly that
//! rank's transfers of the whole plan `compile` writes, and its report.

use std::path::Path;

use serde_json::Value;

mod common;
use common::{run, Scratch};

/// A scratch directory for one test, removed when it passes.
fn scratch(name: &str) -> Scratch {
    Scratch::new(&format!("rank-{name}"))
}

fn p(dir: &Path, name: &str) -> String {
    dir.join(name).display().to_string()
}

fn read(path: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn inputs(dir: &Path) -> (String, String) {
    let (t, m) = (p(dir, "t.json"), p(dir, "m.json"));
    let (c, _, e) = run(&[
        "topology", "--preset", "dgx-h100", "--nodes", "3", "--gpus", "2", "--out", &t,
    ]);
    assert_eq!(c, 0, "{e}");
    let (c, _, e) = run(&[
        "traffic",
        "--ranks",
        "6",
        "--pattern",
        "zipf:1.0",
        "--seed",
        "5",
        "--out",
        &m,
    ]);
    assert_eq!(c, 0, "{e}");
    (t, m)
}

/// A transfer as both files spell it: (src, dst, src_buf, src_off, dst_buf,
/// dst_off, bytes, path, step).
type Row = (u64, u64, String, u64, String, u64, u64, String, u64);

fn row(src: u64, dst: u64, t: &Value) -> Row {
    let s = |k: &str| t[k].as_str().unwrap().to_string();
    let u = |k: &str| t[k].as_u64().unwrap();
    (
        src,
        dst,
        s("src_buf"),
        u("src_off"),
        s("dst_buf"),
        u("dst_off"),
        u("bytes"),
        t["path"].to_string(),
        u("step"),
    )
}

#[test]
fn rank_programs_are_the_plans_slices() {
    let dir = scratch("slices");
    let (t, m) = inputs(&dir);
    let algs = [
        "direct",
        "hierarchical",
        "fast",
        "spray",
        "pxn",
        "deepep",
        "auto",
    ];
    for alg in algs {
        assert_slices(&dir, &t, &m, alg, &[0, 1, 2, 3, 4, 5]);
    }
}

/// `auto` on a close call (4 x DGX-H100, Zipf 1.0: `fast` by its estimates,
/// `spray` once both are simulated) writes the settled plan's program, as
/// `compile` writes that plan, not the program of the estimates' pick.
#[test]
fn auto_rank_programs_follow_the_settled_choice() {
    let dir = scratch("auto-close");
    let (t, m) = (p(&dir, "t.json"), p(&dir, "m.json"));
    let (c, _, e) = run(&[
        "topology", "--preset", "dgx-h100", "--nodes", "4", "--out", &t,
    ]);
    assert_eq!(c, 0, "{e}");
    let (c, _, e) = run(&[
        "traffic",
        "--ranks",
        "32",
        "--pattern",
        "zipf:1.0",
        "--out",
        &m,
    ]);
    assert_eq!(c, 0, "{e}");
    let e = assert_slices(&dir, &t, &m, "auto", &[3, 20]);
    assert!(e.contains("too close to call"), "{e}");
    let rep = read(&p(&dir, "rep.json"));
    assert_eq!(rep["planned_from"], "whole plan");
}

/// `base` then `extra`, as one argument list.
fn with<'a>(base: &[&'a str], extra: &[&'a str]) -> Vec<&'a str> {
    base.iter().chain(extra).copied().collect()
}

/// `auto` on a `links` graph, which has no per-batch planner: `compile`'s
/// one-shot choice, its whole plan sliced.
#[test]
fn auto_rank_programs_on_a_links_graph() {
    let dir = scratch("auto-links");
    let t = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/topologies/ring-4.json"
    );
    let m = p(&dir, "m.json");
    let (c, _, e) = run(&[
        "traffic",
        "--ranks",
        "4",
        "--pattern",
        "zipf:1.0",
        "--out",
        &m,
    ]);
    assert_eq!(c, 0, "{e}");
    assert_slices(&dir, t, &m, "auto", &[0, 1, 2, 3]);
    let rep = read(&p(&dir, "rep.json"));
    assert_eq!(rep["planned_from"], "whole plan");
}

/// Plans `alg` whole with `compile`, then each of `ranks` with `compile
/// --rank`, and checks each program against its slice of the plan; the
/// last `--rank` run's stderr.
fn assert_slices(dir: &Path, t: &str, m: &str, alg: &str, ranks: &[u64]) -> String {
    let mut said = String::new();
    let plan_path = p(dir, &format!("{alg}.json"));
    let base = [
        "compile",
        "--topology",
        t,
        "--traffic",
        m,
        "--algorithm",
        alg,
    ];
    let (c, _, e) = run(&with(&base, &["--out", &plan_path]));
    assert_eq!(c, 0, "{e}");
    let plan = read(&plan_path);
    let transfers = plan["transfers"].as_array().unwrap();
    for &rank in ranks {
        let (out, rep) = (p(dir, "prog.json"), p(dir, "rep.json"));
        let r = rank.to_string();
        let (c, _, e) = run(&with(
            &base,
            &["--rank", &r, "--out", &out, "--report", &rep],
        ));
        assert_eq!(c, 0, "{e}");
        assert!(e.contains(&format!("rank {rank}")), "{e}");
        said.clone_from(&e);
        let prog = read(&out);
        assert_eq!(prog["rank"], rank);
        // `auto`'s program is its choice's, the whole plan's algorithm.
        assert_eq!(prog["algorithm"], plan["algorithm"], "{alg}");
        if alg == "auto" {
            assert!(e.contains("auto chose"), "{e}");
        } else {
            assert_eq!(prog["algorithm"], alg);
        }
        let mut got: Vec<Row> = prog["ops"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| {
                let peer = o["peer"].as_u64().unwrap();
                match o["op"].as_str().unwrap() {
                    "send" => row(rank, peer, o),
                    _ => row(peer, rank, o),
                }
            })
            .collect();
        let mut want: Vec<Row> = transfers
            .iter()
            .filter(|x| x["bytes"].as_u64().unwrap() > 0)
            .filter_map(|x| {
                let (s, d) = (x["src"].as_u64().unwrap(), x["dst"].as_u64().unwrap());
                (s == rank || d == rank).then(|| row(s, d, x))
            })
            .collect();
        got.sort();
        want.sort();
        assert!(!want.is_empty());
        assert_eq!(got, want, "{alg} rank {rank}");
        let scratch = plan["scratch"]
            .as_array()
            .map_or(0, |s| s[rank as usize].as_u64().unwrap());
        assert_eq!(prog["scratch_bytes"], scratch, "{alg} rank {rank}");
        let report = read(&rep);
        assert_eq!(report["rank"], rank);
        assert_eq!(report["ops"], got.len());
        assert!(report["compile_us"].as_f64().unwrap() > 0.0);
        // These plan from what the rank knows alone (staged `fast`
        // too, on a switch and unless every pair goes direct; `auto`
        // too, unless its call is close).
        if matches!(alg, "direct" | "hierarchical" | "spray" | "pxn" | "deepep") {
            assert_eq!(report["planned_from"], "rank", "{alg}");
        }
    }
    said
}

#[test]
fn rank_errors_are_bad_input() {
    let dir = scratch("errors");
    let (t, m) = inputs(&dir);
    let out = p(&dir, "prog.json");
    let base = ["compile", "--topology", &t, "--traffic", &m, "--out", &out];
    for (extra, want) in [
        (vec!["--rank", "6"], "not a rank"),
        (vec!["--rank", "0", "--algorithm", "lp"], "lp"),
    ] {
        let args: Vec<&str> = base.iter().copied().chain(extra).collect();
        let (c, _, e) = run(&args);
        assert_eq!(c, 2, "{e}");
        assert!(e.contains(want) && e.lines().count() == 1, "{e}");
    }
    let xml = p(&dir, "prog.xml");
    let (c, _, e) = run(&[
        "compile",
        "--topology",
        &t,
        "--traffic",
        &m,
        "--rank",
        "0",
        "--out",
        &xml,
    ]);
    assert_eq!(c, 2, "{e}");
    assert!(e.contains(".json"), "{e}");
}
