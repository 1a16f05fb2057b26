//! The CLI on imported topologies: `topology --from-nccl` / `--from-nvidia-smi`
//! writes JSON that `compile` takes, and `compile`, `simulate` and `verify`
//! take the XML (or nvidia-smi text) itself as `--topology`.

mod common;
use common::{root, run, Scratch};

/// A hand-written NCCL_TOPO_FILE: 4 A100s, 2 NICs of 200 Gb/s, each under the
/// PCIe switch of two GPUs; the NICs are listed so that GPU 0's is `dev 1`.
const NODE: &str = r#"<system version="1">
  <cpu numaid="0" arch="x86_64">
    <pci busid="0000:10:00.0" class="0x060400">
      <pci busid="0000:11:00.0" class="0x030200"><gpu dev="0" sm="80" rank="0"><nvlink target="0000:f0:00.0" count="12" tclass="0x068000"/></gpu></pci>
      <pci busid="0000:12:00.0" class="0x030200"><gpu dev="1" sm="80" rank="1"><nvlink target="0000:f0:00.0" count="12" tclass="0x068000"/></gpu></pci>
      <pci busid="0000:13:00.0" class="0x020000"><nic><net name="mlx5_1" dev="1" speed="200000" port="1"/></nic></pci>
    </pci>
    <pci busid="0000:20:00.0" class="0x060400">
      <pci busid="0000:21:00.0" class="0x030200"><gpu dev="2" sm="80" rank="2"><nvlink target="0000:f0:00.0" count="12" tclass="0x068000"/></gpu></pci>
      <pci busid="0000:22:00.0" class="0x030200"><gpu dev="3" sm="80" rank="3"><nvlink target="0000:f0:00.0" count="12" tclass="0x068000"/></gpu></pci>
      <pci busid="0000:23:00.0" class="0x020000"><nic><net name="mlx5_0" dev="0" speed="200000" port="1"/></nic></pci>
    </pci>
  </cpu>
</system>
"#;

fn dir(name: &str) -> Scratch {
    Scratch::new(&format!("nccl-cli-{name}"))
}

fn traffic(path: &str, ranks: usize) {
    let (code, _, err) = run(&[
        "traffic",
        "--ranks",
        &ranks.to_string(),
        "--pattern",
        "zipf:1",
        "--tokens",
        "64",
        "--out",
        path,
    ]);
    assert_eq!(code, 0, "{err}");
}

#[test]
fn topology_from_nccl_then_compile_and_the_xml_directly() {
    let d = dir("xml");
    let xml = d.join("node.xml").display().to_string();
    std::fs::write(&xml, NODE).unwrap();
    let json = d.join("t.json").display().to_string();
    let (code, _, err) = run(&[
        "topology",
        "--from-nccl",
        &xml,
        "--nodes",
        "3",
        "--out",
        &json,
    ]);
    assert_eq!(code, 0, "{err}");
    // What the file lacks is said on stderr, one line each.
    assert!(
        err.contains("node.xml: assumed latencies not stated"),
        "{err}"
    );
    let spec: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(spec["nodes"], 3);
    assert_eq!(spec["gpus_per_node"], 4);
    assert_eq!(spec["intra"]["bandwidth_GBps"], 300.0);
    assert_eq!(spec["nic"]["per_node"], 2);
    assert_eq!(spec["nic"]["bandwidth_GBps"], 25.0);
    // NICs in NCCL's order (mlx5_0 first): GPUs 0, 1 use NIC 1.
    assert_eq!(spec["nic"]["gpu_nic"], serde_json::json!([1, 1, 0, 0]));

    let tr = d.join("m.json").display().to_string();
    traffic(&tr, 12);
    for (topo, extra) in [(&json, None), (&xml, None), (&xml, Some("3"))] {
        let plan = d.join("p.json").display().to_string();
        let mut args = vec![
            "compile",
            "--topology",
            topo,
            "--traffic",
            &tr,
            "--algorithm",
            "fast",
            "--out",
            &plan,
        ];
        if let Some(n) = extra {
            args.extend(["--nodes", n]);
        }
        let (code, _, err) = run(&args);
        assert_eq!(code, 0, "{topo}: {err}");
        assert!(err.contains("transfers in"), "{err}");
        let (code, _, err) = run(&[
            "simulate",
            "--topology",
            topo,
            "--traffic",
            &tr,
            "--plan",
            &plan,
        ]);
        assert_eq!(code, 0, "{err}");
        let (code, out, err) = run(&[
            "verify",
            "--plan",
            &plan,
            "--traffic",
            &tr,
            "--topology",
            topo,
        ]);
        assert_eq!(code, 0, "{err}");
        assert!(out.starts_with("ok:"), "{out}");
    }
    // 12 ranks are not 2 nodes of 4 GPUs; 10 ranks are no whole number of nodes.
    let plan = d.join("p.json").display().to_string();
    let (code, _, err) = run(&[
        "compile",
        "--topology",
        &xml,
        "--traffic",
        &tr,
        "--nodes",
        "2",
        "--out",
        &plan,
    ]);
    assert_eq!(code, 2, "{err}");
    assert_eq!(
        err.lines().filter(|l| !l.contains("assumed")).count(),
        1,
        "{err}"
    );
    traffic(&tr, 10);
    let (code, _, err) = run(&[
        "compile",
        "--topology",
        &xml,
        "--traffic",
        &tr,
        "--out",
        &plan,
    ]);
    assert_eq!(code, 2);
    assert!(
        err.contains("the traffic has 10 ranks, not a whole number of such nodes (give --nodes)"),
        "{err}"
    );
}

#[test]
fn from_nvidia_smi_and_errors() {
    let d = dir("smi");
    let json = d.join("smi.json").display().to_string();
    let smi = root("tests/data/smi-h100-4nic.txt");
    let (code, _, err) = run(&[
        "topology",
        "--from-nvidia-smi",
        &smi,
        "--nodes",
        "2",
        "--nic-gbps",
        "50",
        "--out",
        &json,
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("NIC speed"), "--nic-gbps given: {err}");
    let spec: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(
        spec["nic"]["gpu_nic"],
        serde_json::json!([0, 0, 1, 1, 2, 2, 3, 3])
    );
    assert_eq!(spec["intra"]["bandwidth_GBps"], 450.0);
    // The wrong flag for the file, a foreign XML, a truncated one, no NIC for several nodes.
    let xml = d.join("foreign.xml").display().to_string();
    std::fs::write(&xml, "<html><body/></html>").unwrap();
    let cut = d.join("cut.xml").display().to_string();
    std::fs::write(&cut, &NODE[..NODE.len() - 40]).unwrap();
    let lonely = d.join("lonely.xml").display().to_string();
    std::fs::write(
        &lonely,
        NODE.replace("class=\"0x020000\"", "class=\"0x010000\"")
            .replace("<net ", "<x "),
    )
    .unwrap();
    for (args, want) in [
        (
            vec!["--from-nccl", smi.as_str()],
            "--from-nccl needs NCCL topology XML",
        ),
        (
            vec!["--from-nccl", xml.as_str()],
            "the root element is <html>, not <system>",
        ),
        (vec!["--from-nccl", cut.as_str()], "the file is truncated"),
        (
            vec!["--from-nccl", lonely.as_str(), "--nodes", "2"],
            "names no NIC",
        ),
        (
            vec!["--from-nccl", lonely.as_str(), "--gpus", "2"],
            "--gpus-per-node: the GPUs per node come from",
        ),
        (
            vec!["--from-nccl", lonely.as_str(), "--nics-per-node", "2"],
            "--nics-per-node: the NICs per node come from",
        ),
        (
            vec!["--preset", "dgx-h100", "--from-nccl", lonely.as_str()],
            "cannot be used with",
        ),
    ] {
        let mut all = vec!["topology"];
        all.extend(args);
        let (code, _, err) = run(&all);
        assert_eq!(code, 2, "{all:?}: {err}");
        assert!(err.contains(want), "{all:?}: want {want:?}, got {err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
}
