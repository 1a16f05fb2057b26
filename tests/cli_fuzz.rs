//! Defects a fuzzer found (issue 23, section 1), each checked end to end
//! through the binary: bad input gets one line naming the file, the place
//! and the reason, and exit code 2; nothing panics or grows without bound.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

/// A scratch directory unique to one test.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("switchyard-fuzz-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
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

/// A preset topology written to `dir`.
fn preset(dir: &Path, nodes: usize, gpus: usize) -> String {
    let text = ok(&[
        "topology",
        "--preset",
        "dgx-h100",
        "--nodes",
        &nodes.to_string(),
        "--gpus",
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
