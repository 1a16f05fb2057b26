//! A training loop that re-plans its MoE all-to-all every batch.
//!
//! The expert routing changes from batch to batch, so the traffic matrix
//! does too; the Planner, built once for the cluster, turns each batch's
//! matrix into a fresh plan, reusing its buffers and the previous plan's.
//!
//! cargo run --release --example replan [NODES] [BATCHES]

use std::time::Instant;

use switchyard::compiler::generate::{generate, Pattern, TrafficSpec};
use switchyard::compiler::planner::{Planner, PlannerOptions};
use switchyard::compiler::{verify_on, Plan, Topology};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    switchyard::restore_sigpipe();
    let mut args = std::env::args().skip(1);
    let nodes: usize = args.next().map_or(Ok(4), |a| a.parse())?;
    let batches: u64 = args.next().map_or(Ok(10), |a| a.parse())?;
    let topo = Topology::preset("dgx-h100", nodes, None)?;
    let mut planner = Planner::fast(&topo, PlannerOptions::default())?;
    let mut plan = Plan::new("", 0, 0);
    println!(
        "{}: {} GPUs, re-planning {batches} batches",
        topo.name(),
        topo.ranks()
    );
    println!("batch  skew  total_MB  plan_us  stages  transfers");
    for batch in 0..batches {
        // The router's popularity skew drifts as training goes on.
        let skew = 0.6 + 0.1 * (batch % 8) as f64;
        let mut spec = TrafficSpec::new(topo.ranks(), Pattern::Zipf(skew));
        spec.seed = batch;
        spec.moe.tokens_per_rank = 2048;
        let traffic = generate(&spec)?;

        let start = Instant::now();
        planner.plan_into(&traffic, &mut plan)?;
        let plan_us = start.elapsed().as_secs_f64() * 1e6;

        // Check the first plan and every fifth one (the verifier is slower than planning).
        if batch % 5 == 0 {
            verify_on(&plan, &traffic, &topo)?;
        }
        println!(
            "{batch:5}  {skew:4.1}  {:8.1}  {plan_us:7.0}  {:6}  {:9}",
            traffic.off_diagonal_total() as f64 / 1e6,
            planner.stage_count(),
            plan.transfers.len()
        );
    }
    Ok(())
}
