//! The real MSCCL plans in shared/refdata/msccl-examples load, verify and
//! survive the symbolic executor; copies with one step removed are rejected
//! with a message naming the gpu, threadblock and step.

mod common;

use std::path::PathBuf;

use switchyard::compiler::msccl::{check_executable_with, parse_xml, xml_traffic};
use switchyard::compiler::{verify, TrafficMatrix};

const FILES: [&str; 6] = [
    "alltoall_a100_three_step_2x8_inst1.xml",
    "alltoall_a100_three_step_4x8_inst1.xml",
    "alltoall_a100_two_step_2x8.xml",
    "alltoall_a100_two_step_4x8.xml",
    "msccl-scheduler_ndv4_a2a2ll.xml",
    "msccl-scheduler_ndv4_a2a4ll.xml",
];

/// The examples live in the shared reference data (`common::refdata_dir`).
fn examples_dir() -> Option<PathBuf> {
    common::refdata_dir()
        .map(|p| p.join("msccl-examples"))
        .filter(|p| p.join(FILES[0]).is_file())
}

fn load(name: &str) -> Option<String> {
    let dir = examples_dir()?;
    Some(std::fs::read_to_string(dir.join(name)).expect("example readable"))
}

#[test]
fn real_plans_load_run_and_verify() {
    let Some(_) = examples_dir() else {
        eprintln!("skipped: msccl-examples not found (set SWITCHYARD_REFDATA)");
        return;
    };
    for name in FILES {
        let text = load(name).unwrap();
        let report = check_executable_with(&text, name).unwrap_or_else(|e| panic!("{e}"));
        assert!(report.warnings.is_empty(), "{name}: {:?}", report.warnings);
        let m = xml_traffic(&text, name).unwrap();
        let plan = parse_xml(&text, name, None).unwrap();
        verify(&plan, &m).unwrap_or_else(|e| panic!("{name}: {e}"));
        // A skewed matrix that fits in the file's chunks reads and verifies too.
        let n = m.ranks();
        let mut skew = m.clone();
        for s in 0..n {
            for d in 0..n {
                skew.set(s, d, m.get(s, d) * ((s * 7 + d * 3) % 5) as u64 / 4);
            }
        }
        let plan = parse_xml(&text, name, Some(&skew)).unwrap();
        verify(&plan, &skew).unwrap_or_else(|e| panic!("{name} skewed: {e}"));
        eprintln!(
            "{name}: {} ranks, {} steps ({} nop), {} operations, {} chunks moved, {} transfers",
            report.ngpus,
            report.steps,
            report.nops,
            report.operations,
            report.chunks_moved,
            plan.transfers.len()
        );
    }
}

#[test]
fn uniform_traffic_given_explicitly() {
    let Some(text) = load(FILES[4]) else { return };
    // a2a2ll: 8 ranks, 2 chunks per pair, maxBytes 40959.
    let m = TrafficMatrix::uniform(8, 1000);
    let plan = parse_xml(&text, FILES[4], Some(&m)).unwrap();
    verify(&plan, &m).unwrap();
    assert_eq!(plan.chunking.as_ref().unwrap().chunk_bytes, 500);
    let wrong = TrafficMatrix::uniform(4, 1000);
    let e = parse_xml(&text, FILES[4], Some(&wrong))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("the plan is for 8 ranks but the traffic has 4"),
        "{e}"
    );
}

/// Removes the `k`-th `<step>` line.
fn without_step(text: &str, k: usize) -> (String, usize) {
    let mut seen = 0;
    let mut line_no = 0;
    let mut out = String::with_capacity(text.len());
    for (i, l) in text.lines().enumerate() {
        if l.trim_start().starts_with("<step ") {
            if seen == k {
                line_no = i + 1;
                seen += 1;
                continue;
            }
            seen += 1;
        }
        out.push_str(l);
        out.push('\n');
    }
    (out, line_no)
}

#[test]
fn removing_any_step_is_caught() {
    for name in FILES {
        let Some(text) = load(name) else { return };
        let steps = text.matches("<step ").count();
        // A spread of positions, the first and the last included.
        let picks: Vec<usize> = (0..12).map(|i| i * (steps - 1) / 11).collect();
        for k in picks {
            let (broken, line) = without_step(&text, k);
            let e = match check_executable_with(&broken, name) {
                Ok(_) => panic!("{name}: removing step {k} (line {line}) went unnoticed"),
                Err(e) => e.to_string(),
            };
            // The step that lost its partner or its place, or (a removed
            // local copy) the output chunk nobody writes and whose it is.
            let precise = (e.contains("gpu ") && e.contains(", tb ") && e.contains(", step "))
                || (e.contains("output chunk")
                    && e.contains("is never written; it should hold input chunk"));
            assert!(precise, "{name}, step {k} removed: imprecise message: {e}");
            assert!(parse_xml(&broken, name, None).is_err());
        }
    }
}

#[test]
fn removed_receive_names_the_sender_and_peer() {
    let Some(text) = load(FILES[4]) else { return };
    // Line 4 is gpu 0's first receive (from gpu 1, channel 0).
    let mut lines: Vec<&str> = text.lines().collect();
    assert!(lines[3].contains("type=\"r\""));
    lines.remove(3);
    let broken = lines.join("\n");
    let e = check_executable_with(&broken, "a2a2ll.xml")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("gpu 1, tb ")
            && e.contains("sends on channel 0 (1 -> 0) has no partner: gpu 0 receives 0 of 1"),
        "{e}"
    );
}
