//! The CPU backend's speed target: a 2 x 8 plan moving at least 256 MiB must
//! copy at >= 0.7 of this machine's single-thread `memcpy` rate.
//!
//! `cargo run --release -p switchyard-runtime --example cpu_rate [-- THREADS]`
//!
//! Prints, for a uniform and a skewed (Zipf 1.2 MoE) matrix on 2 x DGX-H100,
//! the plan's copy rate (best of 10 runs), one thread's memcpy of the same
//! bytes (best of 10) and their ratio.

use std::time::Duration;

use switchyard_compiler::generate::{generate, Pattern, TrafficSpec};
use switchyard_compiler::sched::direct;
use switchyard_compiler::{Topology, TrafficMatrix};
use switchyard_runtime::{execute, BackendKind, RunOptions};

fn main() {
    let threads: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(0);
    let topo = Topology::preset("dgx-h100", 2, None).expect("preset");
    let uniform = TrafficMatrix::uniform(16, 1 << 20);
    let mut spec = TrafficSpec::new(16, Pattern::Zipf(1.2));
    spec.moe.tokens_per_rank = 1024;
    spec.seed = 7;
    let skewed = generate(&spec).expect("traffic");
    let opts = RunOptions {
        threads,
        timeout: Duration::from_secs(60),
        iterations: 10,
        reference: true,
        ..RunOptions::default()
    };
    println!("| traffic | MiB | threads | plan GB/s | memcpy GB/s (1 thread) | ratio | verified |");
    println!("|---|---|---|---|---|---|---|");
    for (name, m) in [("uniform 1 MiB/pair", &uniform), ("moe zipf:1.2", &skewed)] {
        let plan = direct(&topo, m);
        let r = execute(&plan, m, BackendKind::Cpu, &opts).expect("run");
        let reference = r.reference_gbps.unwrap_or(f64::NAN);
        println!(
            "| {name} | {:.0} | {} | {:.2} | {:.2} | {:.2} | {} |",
            r.link_bytes.total() as f64 / (1 << 20) as f64,
            r.lanes,
            r.copy_rate_gbps,
            reference,
            r.copy_rate_gbps / reference,
            r.verified
        );
    }
}
