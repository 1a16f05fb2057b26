//! `demo`: the main job on a built-in cluster.

use std::time::Instant;

use clap::Args;
use switchyard::compiler::generate::{generate, Pattern, TrafficSpec};
use switchyard::compiler::sched::{schedule, Options};
use switchyard::compiler::{verify_on, Algorithm, Topology};

use super::{CliError, CliResult};

#[derive(Args)]
pub struct DemoArgs {
    /// Nodes of the built-in DGX-H100 cluster.
    #[arg(long, default_value_t = 4)]
    nodes: usize,
    /// Zipf exponent of expert popularity.
    #[arg(long, default_value_t = 1.0)]
    skew: f64,
    #[arg(long, default_value_t = 7)]
    seed: u64,
}

pub fn run(a: DemoArgs) -> CliResult {
    let topo = Topology::preset("dgx-h100", a.nodes, None)?;
    let mut spec = TrafficSpec::new(topo.ranks(), Pattern::Zipf(a.skew));
    spec.seed = a.seed;
    let m = generate(&spec)?;
    println!(
        "cluster: {} ({} GPUs); traffic: MoE top-{} zipf {} ({:.1} MiB across ranks, hottest receiver {:.1} MiB)",
        topo.name(),
        topo.ranks(),
        spec.moe.top_k,
        a.skew,
        m.off_diagonal_total() as f64 / (1 << 20) as f64,
        (0..m.ranks()).map(|d| m.col_sum(d)).max().unwrap_or(0) as f64 / (1 << 20) as f64,
    );
    println!(
        "{:<14} {:>10} {:>7} {:>12} {:>9}",
        "algorithm", "transfers", "steps", "compile_us", "verified"
    );
    for &alg in Algorithm::ALL {
        let t0 = Instant::now();
        let plan = schedule(alg, &topo, &m, &Options::default())?;
        let us = t0.elapsed().as_secs_f64() * 1e6;
        verify_on(&plan, &m, &topo).map_err(|e| CliError::Failed(format!("{alg}: {e}")))?;
        println!(
            "{:<14} {:>10} {:>7} {:>12.0} {:>9}",
            alg.name(),
            plan.transfers.len(),
            plan.steps(),
            us,
            "yes"
        );
    }
    Ok(())
}
