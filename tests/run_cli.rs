//! `switchyard run` end to end, through the built binary.

use std::path::Path;
use std::process::{Command, Output};

mod common;
use common::Scratch;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_switchyard"))
}

/// A fresh directory with a 2 x 4 topology, a skewed traffic matrix and the
/// `direct` plan for them.
fn setup(name: &str) -> Scratch {
    let dir = Scratch::new(&format!("run-{name}"));
    let ok = |o: Output| assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    ok(bin()
        .args([
            "topology",
            "--preset",
            "dgx-h100",
            "--nodes",
            "2",
            "--gpus-per-node",
            "4",
            "--out",
        ])
        .arg(dir.join("topo.json"))
        .output()
        .unwrap());
    ok(bin()
        .args([
            "traffic",
            "--ranks",
            "8",
            "--pattern",
            "zipf:1.5",
            "--tokens",
            "64",
            "--hidden",
            "96",
        ])
        .arg("--out")
        .arg(dir.join("m.json"))
        .output()
        .unwrap());
    ok(bin()
        .arg("compile")
        .arg("--topology")
        .arg(dir.join("topo.json"))
        .arg("--traffic")
        .arg(dir.join("m.json"))
        .arg("--out")
        .arg(dir.join("plan.json"))
        .output()
        .unwrap());
    dir
}

fn run(dir: &Path, plan: &str, extra: &[&str]) -> Output {
    bin()
        .arg("run")
        .arg("--plan")
        .arg(dir.join(plan))
        .arg("--traffic")
        .arg(dir.join("m.json"))
        .args(extra)
        .output()
        .unwrap()
}

#[test]
fn cpu_run_verifies_and_prints_json() {
    let dir = setup("ok");
    let o = run(&dir, "plan.json", &["--backend", "cpu", "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["verified"], true);
    assert!(v["bytes_moved"].as_u64().unwrap() > 0);
    assert!(v["seconds"].as_f64().unwrap() > 0.0);
    assert!(v["link_bytes"]["rdma"].as_u64().unwrap() > 0);
}

#[test]
fn a_corrupted_plan_fails_with_the_first_bad_range() {
    let dir = setup("bad");
    let text = std::fs::read_to_string(dir.join("plan.json")).unwrap();
    let mut plan: serde_json::Value = serde_json::from_str(&text).unwrap();
    // Shift the read of the largest inter-node transfer by one byte.
    let ts = plan["transfers"].as_array_mut().unwrap();
    let t = ts
        .iter_mut()
        .filter(|t| t["path"]["kind"] == "rdma" && t["src_off"].as_u64().unwrap() > 0)
        .max_by_key(|t| t["bytes"].as_u64().unwrap())
        .unwrap();
    let (dst, off) = (t["dst"].as_u64().unwrap(), t["dst_off"].as_u64().unwrap());
    t["src_off"] = (t["src_off"].as_u64().unwrap() - 1).into();
    std::fs::write(dir.join("bad.json"), plan.to_string()).unwrap();
    let o = run(&dir, "bad.json", &["--json"]);
    assert_eq!(o.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["verified"], false);
    let first = v["first_bad"].as_str().unwrap();
    assert!(
        first.starts_with(&format!("output of rank {dst} bytes {off}..")),
        "{first}"
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("verification failed"), "{err}");
}

#[test]
fn cuda_without_a_gpu_fails_cleanly() {
    let dir = setup("cuda");
    let o = run(&dir, "plan.json", &["--backend", "cuda"]);
    let err = String::from_utf8_lossy(&o.stderr);
    if o.status.success() {
        // A machine with a GPU (and the cuda feature): then it must verify.
        assert!(String::from_utf8_lossy(&o.stdout).contains("every output byte verified"));
        return;
    }
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(
        err.contains("not built") || err.contains("CUDA") || err.contains("NCCL"),
        "{err}"
    );
}

#[test]
fn bad_arguments_exit_2() {
    let dir = setup("args");
    let o = run(&dir, "plan.json", &["--backend", "tpu"]);
    assert_eq!(o.status.code(), Some(2));
    let o = run(&dir, "missing.json", &[]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn cuda_only_flags_need_the_cuda_backend() {
    let dir = setup("graph");
    for flag in ["--graph", "--context-per-rank", "--nccl-loopback"] {
        let o = run(&dir, "plan.json", &[flag]);
        assert_eq!(o.status.code(), Some(2), "{flag}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(flag), "{err}");
    }
}

/// A 2 x 8 `fast` plan that relays through scratch, and its small MoE matrix.
fn setup_fast_2x8(name: &str) -> Scratch {
    let dir = Scratch::new(&format!("run-{name}"));
    let ok = |o: Output| assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    ok(bin()
        .args(["topology", "--preset", "dgx-h100", "--nodes", "2", "--out"])
        .arg(dir.join("topo.json"))
        .output()
        .unwrap());
    ok(bin()
        .args(["traffic", "--ranks", "16", "--pattern", "zipf:1.2"])
        .args(["--tokens", "64", "--hidden", "512", "--out"])
        .arg(dir.join("m.json"))
        .output()
        .unwrap());
    ok(bin()
        .args(["compile", "--algorithm", "fast", "--topology"])
        .arg(dir.join("topo.json"))
        .arg("--traffic")
        .arg(dir.join("m.json"))
        .arg("--out")
        .arg(dir.join("plan.json"))
        .output()
        .unwrap());
    let plan: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("plan.json")).unwrap()).unwrap();
    let relays = plan["transfers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["src_buf"] == "scratch")
        .count();
    assert!(relays > 0, "the fast plan relays nothing through scratch");
    dir
}

#[test]
fn reverse_order_is_reported_wrong_on_every_iteration_count() {
    let dir = setup_fast_2x8("reverse");
    for iterations in ["1", "5"] {
        for _ in 0..2 {
            let o = run(
                &dir,
                "plan.json",
                &[
                    "--inject",
                    "reverse-order",
                    "--iterations",
                    iterations,
                    "--json",
                ],
            );
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(1), "--iterations {iterations}: {err}");
            let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
            assert_eq!(v["verified"], false, "--iterations {iterations}");
            assert_eq!(err.lines().count(), 1, "{err}");
        }
    }
    // The same plan without the fault verifies.
    let o = run(&dir, "plan.json", &["--iterations", "5"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn an_unknown_fault_is_bad_input() {
    let dir = setup("inject");
    let o = run(&dir, "plan.json", &["--inject", "sideways"]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--inject") && err.contains("reverse-order"),
        "{err}"
    );
}

#[test]
fn a_plan_the_host_cannot_hold_is_refused_at_once_with_the_figure() {
    let dir = setup("memory");
    let text = std::fs::read_to_string(dir.join("plan.json")).unwrap();
    let mut plan: serde_json::Value = serde_json::from_str(&text).unwrap();
    // A petabyte of scratch on rank 3; the others keep what the plan
    // (whichever algorithm `auto` chose) needs.
    let mut scratch = plan["scratch"].as_array().cloned().unwrap_or_default();
    scratch.resize(8, serde_json::Value::from(0u64));
    scratch[3] = (1u64 << 50).into();
    plan["scratch"] = scratch.into();
    std::fs::write(dir.join("huge.json"), plan.to_string()).unwrap();
    let t0 = std::time::Instant::now();
    let o = run(&dir, "huge.json", &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(t0.elapsed() < std::time::Duration::from_secs(5));
    if cfg!(target_os = "linux") {
        assert!(err.contains("need 1125899"), "{err}");
        assert!(err.contains("but only"), "{err}");
    } else {
        assert!(err.contains("cannot allocate"), "{err}");
    }
}
