//! `switchyard topology`: presets, independent GPU and NIC counts, the name
//! that says the shape, and fabric flags (a rail-optimized 2:1 cluster built
//! from the command line compiles and simulates at or above its bound).

mod common;
use common::{run, Scratch};

fn topology(args: &[&str]) -> serde_json::Value {
    let mut all = vec!["topology"];
    all.extend_from_slice(args);
    let (code, out, err) = run(&all);
    assert_eq!(code, 0, "{args:?}: {err}");
    serde_json::from_str(&out).unwrap()
}

fn input_error(args: &[&str], needle: &str) {
    let mut all = vec!["topology"];
    all.extend_from_slice(args);
    let (code, _, err) = run(&all);
    assert_eq!(code, 2, "{args:?}: {err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains(needle), "{err:?} lacks {needle:?}");
}

#[test]
fn presets_say_their_shape() {
    let t = topology(&["--preset", "dgx-h100", "--nodes", "4"]);
    assert_eq!(t["name"], "4x DGX-H100");
    assert_eq!(t["nic"]["per_node"], 8);
    let t = topology(&[
        "--preset",
        "dgx-h100",
        "--nodes",
        "4",
        "--gpus-per-node",
        "4",
        "--nics-per-node",
        "2",
    ]);
    assert_eq!(t["name"], "4x DGX-H100 (4 GPUs, 2 NICs per node)");
    assert_eq!(
        (t["gpus_per_node"].as_u64(), t["nic"]["per_node"].as_u64()),
        (Some(4), Some(2))
    );
    // NICs alone: the GPUs stay the machine's.
    let t = topology(&[
        "--preset",
        "dgx-b200",
        "--nodes",
        "2",
        "--nics-per-node",
        "4",
    ]);
    assert_eq!(t["gpus_per_node"], 8);
    assert_eq!(t["name"], "2x DGX-B200 (8 GPUs, 4 NICs per node)");
    assert_eq!(t["intra"]["bandwidth_GBps"], 900.0);
    // The deprecated --gpus is --gpus-per-node.
    let old = topology(&["--preset", "dgx-a100", "--nodes", "2", "--gpus", "2"]);
    let new = topology(&[
        "--preset",
        "dgx-a100",
        "--nodes",
        "2",
        "--gpus-per-node",
        "2",
    ]);
    assert_eq!(old, new);
    assert_eq!(new["name"], "2x DGX-A100 (2 GPUs, 2 NICs per node)");
    let t = topology(&["--preset", "gb200-nvl72", "--nodes", "2"]);
    assert_eq!(t["name"], "2x GB200-NVL72");
    assert_eq!(
        (t["gpus_per_node"].as_u64(), t["nic"]["per_node"].as_u64()),
        (Some(72), Some(72))
    );
    for p in ["dgx-h200", "mi300x"] {
        let t = topology(&["--preset", p, "--nodes", "1"]);
        assert!(t["name"].as_str().unwrap().starts_with("1x "), "{t}");
    }
}

#[test]
fn fabric_flags() {
    let t = topology(&[
        "--preset",
        "dgx-h100",
        "--nodes",
        "4",
        "--fabric",
        "rail-optimized",
        "--nodes-per-group",
        "2",
        "--oversubscription",
        "2",
    ]);
    assert_eq!(t["fabric"]["kind"], "rail-optimized");
    assert_eq!(t["fabric"]["nodes_per_group"], 2);
    assert!(t["fabric"].get("nodes_per_leaf").is_none(), "{t}");
    assert_eq!(
        t["name"],
        "4x DGX-H100 (rail-optimized, 2 nodes/group, 2:1)"
    );
    let t = topology(&[
        "--preset",
        "dgx-h100",
        "--nodes",
        "4",
        "--nodes-per-leaf",
        "2",
    ]);
    assert_eq!(t["fabric"]["kind"], "fat-tree");
    let base = ["--preset", "dgx-h100", "--nodes", "4"];
    let with = |extra: &[&'static str]| [&base[..], extra].concat();
    input_error(
        &with(&["--fabric", "rail-optimized", "--nodes-per-leaf", "2"]),
        "--nodes-per-leaf: a rail-optimized fabric has rail groups",
    );
    input_error(
        &with(&[
            "--fabric",
            "fat-tree",
            "--nodes-per-group",
            "2",
            "--nodes-per-leaf",
            "2",
        ]),
        "--nodes-per-group: a fat-tree has leaves",
    );
    input_error(&with(&["--fabric", "fat-tree"]), "give --nodes-per-leaf");
    input_error(&with(&["--fabric", "torus"]), "unknown fabric `torus`");
    input_error(
        &with(&["--nodes-per-group", "2"]),
        "give --fabric rail-optimized",
    );
    input_error(
        &with(&["--fabric", "rail-optimized", "--nodes-per-group", "0"]),
        "fabric.nodes_per_group: must be at least 1",
    );
    input_error(
        &with(&["--gpus-per-node", "0"]),
        "gpus_per_node: must be at least 1",
    );
    input_error(
        &["--preset", "dgx-h900"],
        "unknown preset (known: dgx-a100, dgx-h100",
    );
}

/// A rail-optimized 2:1 cluster from the flags alone compiles with every
/// rail-aligned scheduler and simulates at or above its bound.
#[test]
fn rail_optimized_cluster_from_flags_compiles() {
    let dir = Scratch::new("rail");
    let path = |n: &str| -> String { dir.join(n).display().to_string() };
    let (t, m) = (path("t.json"), path("m.json"));
    let flags = [
        "topology",
        "--preset",
        "dgx-h100",
        "--nodes",
        "2",
        "--gpus-per-node",
        "4",
        "--fabric",
        "rail-optimized",
        "--oversubscription",
        "2",
        "--out",
        &t,
    ];
    assert_eq!(run(&flags).0, 0);
    let (c, _, e) = run(&[
        "traffic",
        "--ranks",
        "8",
        "--pattern",
        "moe",
        "--tokens",
        "256",
        "--out",
        &m,
    ]);
    assert_eq!(c, 0, "{e}");
    for alg in ["direct", "hierarchical", "fast", "spray"] {
        let (plan, report) = (
            path(&format!("{alg}.json")),
            path(&format!("{alg}.report.json")),
        );
        for network in ["ideal", "congested"] {
            let (c, _, e) = run(&[
                "compile",
                "--topology",
                &t,
                "--traffic",
                &m,
                "--algorithm",
                alg,
                "--out",
                &plan,
                "--report",
                &report,
                "--network",
                network,
            ]);
            assert_eq!(c, 0, "{alg}: {e}");
            let r: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
            assert!(
                r["ratio_to_bound"].as_f64().unwrap() >= 1.0 - 1e-9,
                "{alg} {network}: {r}"
            );
        }
        let (c, _, e) = run(&["verify", "--plan", &plan, "--traffic", &m]);
        assert_eq!(c, 0, "{alg}: {e}");
    }
}
