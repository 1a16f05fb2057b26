//! The plans checked in under `schedules/` are what the code produces now,
//! and each loads and runs under the symbolic executor.

use std::path::PathBuf;

use switchyard::compiler::msccl::schedules::{reference_schedules, skewed_traffic};
use switchyard::compiler::msccl::{check_executable_with, parse_xml};
use switchyard::compiler::{verify_on, Topology, TrafficMatrix};

const REGEN: &str = "cargo run --example regen_schedules";

#[test]
fn checked_in_schedules_are_current() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("schedules");
    let expected = reference_schedules().unwrap();
    for f in &expected {
        let path = dir.join(&f.name);
        let on_disk = std::fs::read_to_string(&path)
            .unwrap_or_else(|_| panic!("schedules/{} is missing: run `{REGEN}`", f.name));
        assert!(
            on_disk == f.text,
            "schedules/{} is stale: run `{REGEN}`",
            f.name
        );
    }
    // No leftovers from algorithms or clusters that are gone.
    for entry in std::fs::read_dir(&dir).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().to_string();
        assert!(
            name == "README.md" || expected.iter().any(|f| f.name == name),
            "schedules/{name} is not produced any more: delete it and run `{REGEN}`"
        );
    }
}

#[test]
fn checked_in_schedules_run_and_verify() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("schedules");
    let skewed = skewed_traffic().unwrap();
    let on_file = TrafficMatrix::load(&dir.join("dgx-h100-2x8-moe.traffic.json")).unwrap();
    assert_eq!(on_file, skewed);
    for f in reference_schedules().unwrap() {
        if !f.name.ends_with(".xml") {
            continue;
        }
        let report = check_executable_with(&f.text, &f.name).unwrap();
        assert!(
            report.warnings.is_empty(),
            "{}: {:?}",
            f.name,
            report.warnings
        );
        let nodes = if f.name.contains("4x8") { 4 } else { 2 };
        let topo = Topology::preset("dgx-h100", nodes, None).unwrap();
        let m = if f.name.contains("moe") {
            skewed.clone()
        } else {
            TrafficMatrix::uniform(topo.ranks(), 1 << 20)
        };
        let plan = parse_xml(&f.text, &f.name, Some(&m)).unwrap();
        verify_on(&plan, &m, &topo).unwrap_or_else(|e| panic!("{}: {e}", f.name));
    }
}
