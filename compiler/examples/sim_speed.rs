//! Times the simulator on a large plan: `direct` on a 64-node DGX-H100
//! cluster (512 ranks) with MoE traffic, in both network modes.
//!
//! `cargo run --release -p switchyard-compiler --example sim_speed [nodes] [tolerance]`
//! (docs/cost-model.md records the result).

use std::time::Instant;

use switchyard_compiler::bound::cut_bound;
use switchyard_compiler::generate::{generate, Pattern, TrafficSpec};
use switchyard_compiler::sched::direct;
use switchyard_compiler::sim::{simulate, Network, SimOptions};
use switchyard_compiler::Topology;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let nodes: usize = args.next().map_or(Ok(64), |a| a.parse())?;
    let tolerance: Option<f64> = args.next().map(|a| a.parse()).transpose()?;
    let topo = Topology::preset("dgx-h100", nodes, None)?;
    let mut spec = TrafficSpec::new(topo.ranks(), Pattern::Moe);
    spec.seed = 1;
    let m = generate(&spec)?;
    let plan = direct(&topo, &m);
    let bound = cut_bound(&topo, &m);
    println!(
        "{}: {} ranks, {} transfers, cut bound {:.1} us ({})",
        topo.name(),
        topo.ranks(),
        plan.transfers.len(),
        bound.cut_us,
        bound.cut
    );
    for network in [Network::Ideal, Network::Congested] {
        let opts = SimOptions {
            tolerance,
            ..SimOptions::new(network)
        };
        let t0 = Instant::now();
        let r = simulate(&topo, &plan, &opts)?;
        let secs = t0.elapsed().as_secs_f64();
        println!(
            "{network:>9}: completion {:.1} us, ratio {:.3}, {} rate recomputes, tolerance {}, {:.2} s",
            r.completion_us,
            r.completion_us / bound.cut_us,
            r.events,
            opts.tolerance_for(plan.transfers.len()),
            secs
        );
    }
    Ok(())
}
