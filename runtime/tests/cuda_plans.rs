//! The CUDA backend on a real device (feature `cuda`): random plans with
//! split blocks and scratch relays, every scheduler's plans, MSCCL XML read
//! back, a shifted read and a racy plan, each checked byte for byte against
//! what the CPU backend reports for the same plan.
//!
//! Without a driver or a visible device every test says so on stderr and
//! passes: CI has no GPU. `runtime/gpu-check.sh` runs this file on a GPU.
#![cfg(feature = "cuda")]

mod common;

use std::sync::OnceLock;
use std::time::Duration;

use proptest::prelude::*;

use common::{random_plan, shift_one_read, traffic};
use switchyard_compiler::generate::{generate, Pattern, TrafficSpec};
use switchyard_compiler::msccl::{assign_paths, parse_xml, to_xml, XmlOptions};
use switchyard_compiler::sched::{direct, schedule, Options};
use switchyard_compiler::{Algorithm, Plan, Topology, TrafficMatrix};
use switchyard_runtime::{execute, BackendKind, Inject, RunOptions, RunReport, RuntimeError};

/// Whether a CUDA device is usable here, probed once with a one-rank plan.
/// Only "unavailable" (no driver, no device) skips; any other failure of
/// the probe is a failure of the backend.
fn gpu() -> bool {
    static GPU: OnceLock<bool> = OnceLock::new();
    *GPU.get_or_init(|| {
        let m = TrafficMatrix::uniform(1, 64);
        let plan = direct(&Topology::preset("dgx-h100", 1, Some(1)).unwrap(), &m);
        match execute(&plan, &m, BackendKind::Cuda, &RunOptions::default()) {
            Ok(r) => {
                assert!(r.verified, "{:?}", r.first_bad);
                true
            }
            Err(RuntimeError::Unavailable(msg)) => {
                eprintln!("skipping the CUDA tests: {msg}");
                false
            }
            Err(e) => panic!("the CUDA backend failed on a one-rank plan: {e}"),
        }
    })
}

fn opts(channels: usize, graph: bool) -> RunOptions {
    RunOptions {
        threads: 2,
        channels,
        timeout: Duration::from_secs(30),
        iterations: 2,
        devices: 1,
        graph,
        ..RunOptions::default()
    }
}

/// Runs `plan` on both backends; the device must report what the CPU does.
fn both(plan: &Plan, m: &TrafficMatrix, channels: usize) -> RunReport {
    both_with(plan, m, opts(channels, false))
}

fn both_with(plan: &Plan, m: &TrafficMatrix, opts: RunOptions) -> RunReport {
    let cpu = execute(plan, m, BackendKind::Cpu, &opts).unwrap();
    let dev = execute(plan, m, BackendKind::Cuda, &opts).unwrap();
    assert_eq!(dev.capture_seconds.is_some(), opts.graph);
    assert_eq!(dev.verified, cpu.verified, "{:?}", dev.first_bad);
    assert_eq!(dev.bad_bytes, cpu.bad_bytes);
    assert_eq!(dev.first_bad, cpu.first_bad);
    assert_eq!(dev.serial, cpu.serial);
    assert_eq!(dev.link_bytes, cpu.link_bytes);
    dev
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    #[test]
    fn random_plans_verify_on_the_device((m, gpn) in traffic(), seed in any::<u64>(), ch in 1usize..=4, graph in any::<bool>()) {
        if gpu() {
            let plan = random_plan(&m, gpn, seed);
            let r = both_with(&plan, &m, opts(ch, graph));
            prop_assert!(r.verified, "{:?}", r.first_bad);
            prop_assert!(!r.serial);
        }
    }

    #[test]
    fn a_shifted_read_is_caught_on_the_device((m, gpn) in traffic(), seed in any::<u64>(), pick in any::<u64>()) {
        if gpu() {
            let mut plan = random_plan(&m, gpn, seed);
            prop_assume!(shift_one_read(&mut plan, &m, pick));
            let r = both(&plan, &m, 4);
            prop_assert!(!r.verified);
            prop_assert!(r.bad_bytes > 0);
        }
    }
}

/// Skewed traffic on 2 x 4 DGX-H100 and 2 x 4 MI300X (a mesh: `fast`
/// relays there), 256 KiB mean per pair so blocks are cut into chunks.
fn cases() -> Vec<(Topology, TrafficMatrix)> {
    let mut out = Vec::new();
    for preset in ["dgx-h100", "mi300x"] {
        let topo = Topology::preset(preset, 2, Some(4)).unwrap();
        for pattern in [Pattern::Zipf(1.2), Pattern::Lognormal(1.0)] {
            let mut spec = TrafficSpec::new(8, pattern);
            spec.bytes = 256 << 10;
            spec.gpus_per_node = 4;
            spec.moe.tokens_per_rank = 512;
            spec.moe.hidden = 1024;
            out.push((topo.clone(), generate(&spec).unwrap()));
        }
    }
    out
}

#[test]
fn every_scheduler_verifies_on_the_device() {
    if !gpu() {
        return;
    }
    for (topo, m) in cases() {
        for &alg in Algorithm::ALL {
            let plan = schedule(alg, &topo, &m, &Options::default()).unwrap();
            for ch in [1, 8] {
                let r = both(&plan, &m, ch);
                assert!(r.verified, "{} {alg}: {:?}", topo.name(), r.first_bad);
                assert!(!r.serial, "{} {alg}", topo.name());
            }
        }
    }
}

/// Replayed from a CUDA graph (captured once, run twice), every
/// scheduler's plans deliver what they deliver when issued copy by copy.
#[test]
fn graph_replays_verify_on_the_device() {
    if !gpu() {
        return;
    }
    for (topo, m) in cases().into_iter().step_by(2) {
        for &alg in Algorithm::ALL {
            let plan = schedule(alg, &topo, &m, &Options::default()).unwrap();
            let r = both_with(&plan, &m, opts(4, true));
            assert!(r.verified, "{} {alg}: {:?}", topo.name(), r.first_bad);
        }
    }
}

#[test]
fn msccl_xml_read_back_verifies_on_the_device() {
    if !gpu() {
        return;
    }
    for (topo, m) in cases().into_iter().take(2) {
        for alg in [Algorithm::Fast, Algorithm::Direct] {
            let plan = schedule(alg, &topo, &m, &Options::default()).unwrap();
            let x = to_xml(&plan, &topo, &m, &XmlOptions::default()).unwrap();
            let mut back = parse_xml(&x.text, "plan.xml", Some(&m)).unwrap();
            assign_paths(&mut back, &topo);
            let r = both(&back, &m, 4);
            assert!(r.verified, "{alg} XML: {:?}", r.first_bad);
        }
    }
}

/// A block written twice (same bytes): the verifier calls it a double
/// write, so both backends run the plan one transfer at a time, once.
#[test]
fn a_racy_plan_runs_serially_on_the_device() {
    if !gpu() {
        return;
    }
    let topo = Topology::preset("dgx-h100", 2, Some(2)).unwrap();
    let m = TrafficMatrix::uniform(4, 4096);
    let mut plan = direct(&topo, &m);
    let again = plan.transfers[1].clone();
    plan.push(again);
    for graph in [false, true] {
        let r = both_with(&plan, &m, opts(4, graph));
        assert!(r.serial);
        assert!(r.verified, "{:?}", r.first_bad);
    }
}

/// On every visible device (`--devices 0`): with two or more GPUs, copies
/// between ranks on different devices go through `cuMemcpyPeerAsync` and
/// events cross devices; with one, this repeats the one-device runs.
#[test]
fn every_scheduler_verifies_across_every_visible_device() {
    if !gpu() {
        return;
    }
    for (topo, m) in cases().into_iter().step_by(2) {
        for &alg in Algorithm::ALL {
            let plan = schedule(alg, &topo, &m, &Options::default()).unwrap();
            let o = RunOptions {
                devices: 0,
                ..opts(4, false)
            };
            let r = both_with(&plan, &m, o);
            assert!(r.verified, "{} {alg}: {:?}", topo.name(), r.first_bad);
        }
    }
}

/// Issue 21, item 1 on the device: a plan that relays through scratch,
/// issued last transfer first on one stream with no waits, is reported
/// wrong on the first iteration and with five, every time, issued copy by
/// copy and replayed from a graph; the device and the CPU find the same
/// bytes wrong.
#[test]
fn reverse_order_is_caught_on_the_device() {
    if !gpu() {
        return;
    }
    for (topo, m) in cases() {
        let plan = schedule(Algorithm::Fast, &topo, &m, &Options::default()).unwrap();
        if !plan
            .transfers
            .iter()
            .any(|t| t.src_buf == switchyard_compiler::Buffer::Scratch)
        {
            continue;
        }
        for iterations in [1, 5] {
            for graph in [false, true] {
                let o = RunOptions {
                    iterations,
                    inject: Some(Inject::ReverseOrder),
                    ..opts(4, graph)
                };
                let r = both_with(&plan, &m, o);
                assert!(!r.verified, "{} {iterations} {graph}", topo.name());
                assert_eq!(r.bad_iteration, Some(1));
            }
        }
    }
}
