//! Topology import on the real NCCL/RCCL files of `shared/refdata/nccl-topo/`
//! (each checked against what that directory's README derives by hand), on
//! broken copies of them, and on the `nvidia-smi topo -m` samples.

use std::path::PathBuf;

use switchyard_compiler::import::{read_node, ImportOptions, NodeShape};
use switchyard_compiler::sched::{schedule, Options};
use switchyard_compiler::topology::IntraKind;
use switchyard_compiler::{verify_on, Algorithm, Topology, TrafficMatrix};

/// The reference files: `$SWITCHYARD_REFDATA/nccl-topo`, else
/// `../shared/refdata/nccl-topo` beside the checkout (as the CLI tests find
/// their reference data); `None` when neither exists.
fn refdata_dir() -> Option<PathBuf> {
    Some(refdata()).filter(|p| p.is_dir())
}

/// Returns from the test (which passes, saying why) without the reference files.
macro_rules! need_refdata {
    () => {
        if refdata_dir().is_none() {
            eprintln!("skipped: no shared/refdata/nccl-topo (set SWITCHYARD_REFDATA)");
            return;
        }
    };
}

fn refdata() -> PathBuf {
    std::env::var_os("SWITCHYARD_REFDATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/refdata"))
        .join("nccl-topo")
}

fn read(name: &str) -> String {
    std::fs::read_to_string(refdata().join(name)).expect(name)
}

fn shape(name: &str) -> NodeShape {
    read_node(&read(name), name, &ImportOptions::default())
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn err(text: &str) -> String {
    read_node(text, "broken.xml", &ImportOptions::default())
        .unwrap_err()
        .to_string()
}

/// GPUs, intra kind and GB/s, NICs, GB/s per NIC, the rail map.
fn check(
    name: &str,
    gpus: usize,
    kind: IntraKind,
    intra: f64,
    nics: usize,
    nic_gbps: f64,
    map: &[usize],
) -> NodeShape {
    let s = shape(name);
    assert_eq!(s.gpus, gpus, "{name}: GPUs");
    assert_eq!(s.intra.kind, kind, "{name}: intra kind");
    assert_eq!(s.intra.bandwidth_gbps, intra, "{name}: intra GB/s");
    let nic = s.nic.as_ref().expect("NICs");
    assert_eq!(nic.per_node, nics, "{name}: NICs");
    assert_eq!(nic.bandwidth_gbps, nic_gbps, "{name}: NIC GB/s");
    assert_eq!(nic.gpu_nic.as_deref(), Some(map), "{name}: rail map");
    // Every import makes a valid cluster of several nodes.
    let t = Topology::from_spec(s.spec(2).unwrap(), name).unwrap();
    assert_eq!(t.ranks(), 2 * gpus);
    for (l, &k) in map.iter().enumerate() {
        assert_eq!(t.rail_of(gpus + l), k, "{name}: rail of local GPU {l}");
    }
    s
}

fn said(s: &NodeShape, words: &str) -> bool {
    s.assumptions.iter().any(|a| a.contains(words))
}

#[test]
fn oci_h100_dump() {
    need_refdata!();
    // 18 NVLinks (5+5+4+4) to NVSwitches, 8 dual-port NICs of 2 x 180000 Mb/s.
    let s = check(
        "oci-bm-gpu-h100-8.xml",
        8,
        IntraKind::Switch,
        450.0,
        8,
        45.0,
        &[0, 1, 2, 3, 4, 5, 6, 7],
    );
    assert_eq!(s.gpu_name, "H100");
    assert_eq!(s.nic_names[0], "mlx5_0+mlx5_1");
    assert_eq!(s.nic_names[7], "mlx5_16+mlx5_17");
    assert_eq!(s.form, "NCCL topology dump");
    assert!(!said(&s, "NVLink:"), "{:?}", s.assumptions);
}

#[test]
fn ibm_h100_names_run_in_reverse() {
    need_refdata!();
    // GPU 0 -> mlx5_7 ... GPU 7 -> mlx5_0; 200000 Mb/s each.
    let s = check(
        "ibm-vpc-h100-vsi.xml",
        8,
        IntraKind::Switch,
        450.0,
        8,
        25.0,
        &[7, 6, 5, 4, 3, 2, 1, 0],
    );
    assert_eq!(s.nic_names[7], "mlx5_7");
}

#[test]
fn nebius_pci_only_with_nets() {
    need_refdata!();
    // GPUs by bus id 8d, 91, 95, 99, ab, af, b3, b7 -> mlx5_4..7, mlx5_0..3.
    let s = check(
        "nebius-h100-vm-v1.xml",
        8,
        IntraKind::Switch,
        450.0,
        8,
        50.0,
        &[4, 5, 6, 7, 0, 1, 2, 3],
    );
    assert_eq!(s.gpu_name, "H100", "PCI device 0x2330");
    assert!(
        said(&s, "NVLink: the file lists none"),
        "{:?}",
        s.assumptions
    );
    assert!(said(&s, "PCI bus id order"));
}

#[test]
fn azure_pci_classes_only() {
    need_refdata!();
    // Two GPUs and two NICs per switch (NDv4), one and one (NDv5); in bus id
    // order GPU i and NIC i share a switch.
    for name in ["azure-ndv4-topo.xml", "azure-ndv5-topo.xml"] {
        let s = check(
            name,
            8,
            IntraKind::Switch,
            450.0,
            8,
            50.0,
            &[0, 1, 2, 3, 4, 5, 6, 7],
        );
        assert_eq!(s.form, "NCCL_TOPO_FILE (PCI classes only)");
        assert!(said(&s, "GPU generation not stated"), "{:?}", s.assumptions);
        assert!(said(&s, "NIC speed not stated"), "{:?}", s.assumptions);
        assert!(s.nic_names[0].starts_with("0101:"), "{:?}", s.nic_names);
    }
}

#[test]
fn simai_a100_five_nics_two_gpus_each() {
    need_refdata!();
    // 12 NVLinks; mlx5_bond_0 hangs off the CPU and serves no GPU.
    let s = check(
        "simai-a100-8gpu-5nic.xml",
        8,
        IntraKind::Switch,
        300.0,
        4,
        25.0,
        &[0, 0, 1, 1, 2, 2, 3, 3],
    );
    assert_eq!(
        s.nic_names,
        ["mlx5_bond_1", "mlx5_bond_2", "mlx5_bond_3", "mlx5_bond_4"]
    );
    assert!(
        said(&s, "closest to no GPU not used: mlx5_bond_0"),
        "{:?}",
        s.assumptions
    );
}

#[test]
fn rccl_mi300x_xgmi_mesh() {
    need_refdata!();
    let s = check(
        "rccl-mi300x-8gpu.xml",
        8,
        IntraKind::Mesh,
        64.0,
        8,
        50.0,
        &[0, 1, 2, 3, 4, 5, 6, 7],
    );
    assert_eq!(s.gpu_name, "MI300X");
    assert_eq!(s.form, "RCCL topology");
}

#[test]
fn modal_b200_mixed_speeds() {
    need_refdata!();
    // 18 NVLink5 links; mlx5_0..4 (100 and 200 Gb/s) are slower than the 400 Gb/s rails.
    let s = check(
        "modal-b200-vm.xml",
        8,
        IntraKind::Switch,
        900.0,
        8,
        50.0,
        &[0, 1, 2, 3, 4, 5, 6, 7],
    );
    assert_eq!(s.nic_names[0], "mlx5_5");
    assert_eq!(s.nic_names[7], "mlx5_12");
    assert!(said(&s, "slower than the fastest"), "{:?}", s.assumptions);
}

#[test]
fn perlmutter_a100_peer_mesh_by_numa() {
    need_refdata!();
    // 4 links to each peer GPU; GPU 0 -> cxi3 ... GPU 3 -> cxi0.
    let s = check(
        "perlmutter-a100-4gpu.xml",
        4,
        IntraKind::Mesh,
        100.0,
        4,
        25.0,
        &[3, 2, 1, 0],
    );
    assert_eq!(s.nic_names, ["cxi0", "cxi1", "cxi2", "cxi3"]);
}

#[test]
fn gb300_two_trays_one_nvlink_domain() {
    need_refdata!();
    // 18 links to the NVSwitch (NVLink5), one 100 Gb/s NIC per tray, shared by its 4 GPUs.
    let s = check(
        "gb300-nvl72-2tray-mnnvl.xml",
        8,
        IntraKind::Switch,
        900.0,
        2,
        12.5,
        &[0, 0, 0, 0, 1, 1, 1, 1],
    );
    assert!(said(&s, "<c2c>"), "{:?}", s.assumptions);
}

#[test]
fn every_reference_file_is_tested() {
    need_refdata!();
    let mut files: Vec<String> = std::fs::read_dir(refdata())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|f| f.ends_with(".xml"))
        .collect();
    files.sort();
    assert_eq!(files.len(), 10, "{files:?}");
    let src = include_str!("nccl_import.rs");
    for f in files {
        assert!(src.contains(&format!("\"{f}\"")), "{f} has no test");
    }
}

#[test]
fn broken_copies_give_one_clear_line() {
    need_refdata!();
    let oci = read("oci-bm-gpu-h100-8.xml");
    let first_gpu = oci.find("<gpu ").unwrap();
    let gpu_end = first_gpu + oci[first_gpu..].find("</gpu>").unwrap() + "</gpu>".len();
    let cases: Vec<(String, &str)> = vec![
        (
            format!("{}{}", &oci[..first_gpu], &oci[gpu_end..]),
            "is a GPU (class 0x030200) but has no <gpu> element",
        ),
        (
            oci.replace("sm=\"90\"", "sm=\"42\""),
            "<gpu sm=\"42\">: unknown GPU generation",
        ),
        (
            oci.replacen(" speed=\"180000\"", "", 1),
            "<net name=\"mlx5_0\"> has no speed",
        ),
        (
            "<?xml version=\"1.0\"?>\n<algo name=\"x\"><gpu id=\"0\"/></algo>".into(),
            "the root element is <algo>, not <system>: not an NCCL topology",
        ),
        (oci[..oci.len() / 2].to_string(), "the file is truncated"),
        (
            oci.replacen("count=\"5\"", "count=\"1e300\"", 1),
            "<nvlink>: count must be a whole number of links, 1 to 1024, got 1e300",
        ),
        (
            "<system version=\"1\"><cpu numaid=\"0\"/></system>".into(),
            "has no GPU",
        ),
        (
            read("rccl-mi300x-8gpu.xml").replace("gfx942", "gfx999"),
            "<gpu gcn=\"gfx999\">: unknown AMD GPU",
        ),
    ];
    for (text, want) in cases {
        let e = err(&text);
        assert!(e.contains(want), "want {want:?}, got {e:?}");
        assert!(!e.contains('\n'), "{e}");
        assert!(e.starts_with("broken.xml: "), "{e}");
    }
}

#[test]
fn overrides_replace_assumptions() {
    need_refdata!();
    let opts = ImportOptions {
        nic_gbps: Some(25.0),
        intra_gbps: Some(300.0),
    };
    let s = read_node(&read("azure-ndv4-topo.xml"), "ndv4", &opts).unwrap();
    assert_eq!(s.intra.bandwidth_gbps, 300.0);
    assert_eq!(s.nic.as_ref().unwrap().bandwidth_gbps, 25.0);
    assert!(
        !said(&s, "NIC speed not stated") && !said(&s, "generation"),
        "{:?}",
        s.assumptions
    );
}

fn smi(name: &str) -> NodeShape {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/data")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap();
    read_node(&text, name, &ImportOptions::default()).unwrap()
}

#[test]
fn nvidia_smi_samples() {
    let s = smi("smi-h100-8nic.txt");
    assert_eq!(s.gpus, 8);
    assert_eq!(s.intra.kind, IntraKind::Switch);
    assert_eq!(s.intra.bandwidth_gbps, 18.0 * 25.0);
    let nic = s.nic.as_ref().unwrap();
    assert_eq!(nic.per_node, 8);
    assert_eq!(nic.gpu_nic.as_deref(), Some(&[0, 1, 2, 3, 4, 5, 6, 7][..]));
    assert_eq!(s.nic_names[3], "mlx5_3");
    assert!(said(&s, "NIC speed not stated"));
    let s = smi("smi-h100-4nic.txt");
    let nic = s.nic.as_ref().unwrap();
    assert_eq!(nic.per_node, 4);
    assert_eq!(nic.gpu_nic.as_deref(), Some(&[0, 0, 1, 1, 2, 2, 3, 3][..]));
}

#[test]
fn nvidia_smi_mesh_and_errors() {
    let text = "\tGPU0\tGPU1\tGPU2\tGPU3\tmlx5_0\tCPU Affinity\n\
        GPU0\t X \tNV4\tNV4\tNV4\tSYS\t0-63\n\
        GPU1\tNV4\t X \tNV4\tNV4\tPHB\t0-63\n\
        GPU2\tNV4\tNV4\t X \tNV4\tSYS\t0-63\n\
        GPU3\tNV4\tNV4\tNV4\t X \tSYS\t0-63\n";
    let s = read_node(text, "t", &ImportOptions::default()).unwrap();
    assert_eq!(
        (s.intra.kind, s.intra.bandwidth_gbps),
        (IntraKind::Mesh, 100.0)
    );
    assert_eq!(s.nic.unwrap().gpu_nic, Some(vec![0, 0, 0, 0]));
    let e = read_node(
        &text.replace("GPU3\tNV4", "GPU3\tNVx"),
        "t",
        &ImportOptions::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("row GPU3, column GPU0: `NVx`"), "{e}");
    let e = read_node(
        &text.replace("GPU2\tNV4\tNV4\t X \tNV4\tSYS\t0-63\n", ""),
        "t",
        &ImportOptions::default(),
    )
    .unwrap_err()
    .to_string();
    assert_eq!(e, "t: has no row for GPU2");
    let e = read_node("hello", "t", &ImportOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("neither NCCL topology XML nor `nvidia-smi topo -m` output"),
        "{e}"
    );
}

/// Several GPUs sharing one NIC, on a rail map that is not `l % nics`:
/// every scheduler's plan verifies.
#[test]
fn shared_nics_plan_and_verify_with_every_scheduler() {
    need_refdata!();
    for (name, nodes) in [
        ("simai-a100-8gpu-5nic.xml", 2),
        ("gb300-nvl72-2tray-mnnvl.xml", 2),
    ] {
        let s = shape(name);
        let topo = Topology::from_spec(s.spec(nodes).unwrap(), name).unwrap();
        let n = topo.ranks();
        let mut m = TrafficMatrix::uniform(n, 4096);
        m.set(0, n - 1, 1 << 16);
        m.set(3, n / 2, 3 << 12);
        for alg in Algorithm::ALL {
            let opts = Options {
                time_limit_s: 20.0,
                ..Options::default()
            };
            let plan =
                schedule(*alg, &topo, &m, &opts).unwrap_or_else(|e| panic!("{name} {alg}: {e}"));
            verify_on(&plan, &m, &topo).unwrap_or_else(|e| panic!("{name} {alg}: {e}"));
        }
    }
}
