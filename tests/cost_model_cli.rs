//! `compile --report` and `simulate --json` agree on the same plan; the
//! human summary and the network flag behave.

use std::path::Path;

mod common;
use common::{run, Scratch};

/// A scratch directory for one test, removed when it passes.
fn scratch(name: &str) -> Scratch {
    Scratch::new(&format!("cost-{name}"))
}

fn p(dir: &Path, name: &str) -> String {
    dir.join(name).display().to_string()
}

fn inputs(dir: &Path) -> (String, String) {
    let (t, m) = (p(dir, "t.json"), p(dir, "m.json"));
    let (c, _, e) = run(&[
        "topology",
        "--preset",
        "dgx-h100",
        "--nodes",
        "2",
        "--gpus-per-node",
        "4",
        "--out",
        &t,
    ]);
    assert_eq!(c, 0, "{e}");
    let (c, _, e) = run(&[
        "traffic",
        "--ranks",
        "8",
        "--pattern",
        "zipf:1.0",
        "--seed",
        "3",
        "--out",
        &m,
    ]);
    assert_eq!(c, 0, "{e}");
    (t, m)
}

#[test]
fn compile_report_and_simulate_json_agree() {
    let dir = scratch("agree");
    let (t, m) = inputs(&dir);
    for network in ["ideal", "congested"] {
        let (plan, rep) = (p(&dir, "p.json"), p(&dir, "r.json"));
        let args = [
            "compile",
            "--topology",
            &t,
            "--traffic",
            &m,
            "--algorithm",
            "direct",
            "--out",
            &plan,
            "--report",
            &rep,
            "--network",
            network,
        ];
        let (c, _, e) = run(&args);
        assert_eq!(c, 0, "{e}");
        let (c, out, e) = run(&[
            "simulate",
            "--topology",
            &t,
            "--traffic",
            &m,
            "--plan",
            &plan,
            "--json",
            "--network",
            network,
        ]);
        assert_eq!(c, 0, "{e}");
        let mut a: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&rep).unwrap()).unwrap();
        let mut b: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert!(a["compile_us"].as_f64().is_some(), "{a}");
        assert!(b["compile_us"].is_null(), "{b}");
        a["compile_us"] = serde_json::Value::Null;
        b["compile_us"] = serde_json::Value::Null;
        assert_eq!(a, b);
        assert_eq!(a["network"], network);
        assert!(a["ratio_to_bound"].as_f64().unwrap() >= 1.0 - 1e-9, "{a}");
    }
}

#[test]
fn simulate_summary_and_bad_network() {
    let dir = scratch("summary");
    let (t, m) = inputs(&dir);
    let plan = p(&dir, "p.json");
    let (c, _, e) = run(&["compile", "--topology", &t, "--traffic", &m, "--out", &plan]);
    assert_eq!(c, 0, "{e}");
    let (c, out, e) = run(&[
        "simulate",
        "--topology",
        &t,
        "--traffic",
        &m,
        "--plan",
        &plan,
    ]);
    assert_eq!(c, 0, "{e}");
    assert!(
        out.contains("completion") && out.contains("lower bound"),
        "{out}"
    );
    assert!(out.contains("hottest links"), "{out}");
    let (c, _, e) = run(&[
        "simulate",
        "--topology",
        &t,
        "--traffic",
        &m,
        "--plan",
        &plan,
        "--network",
        "lossy",
    ]);
    assert_eq!(c, 2, "{e}");
    assert!(e.contains("--network"), "{e}");
}
