//! What the simulator's grouping tolerance costs and changes on the large
//! plans the MSCCL lowering simulates (issue 22 item 5): `fast` on N x 8
//! DGX-H100 nodes, log-normal 1.0 pairs of 256 KiB mean (the
//! docs/benchmarks.md "MSCCL lowering at 16 x 8" inputs), simulated in the
//! ideal network (the lowering's timeline) with several tolerances: seconds,
//! events, completion, and how far start times move.
//!
//! cargo run --release --example sim_tolerance -- [NODES] [ALGORITHM]

use std::time::Instant;

use switchyard::compiler::generate::{generate, Pattern, TrafficSpec};
use switchyard::compiler::sched::{schedule, Options};
use switchyard::compiler::sim::{simulate, SimOptions};
use switchyard::compiler::{Algorithm, Topology};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn main() -> Res<()> {
    switchyard::restore_sigpipe();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let nodes: usize = args.first().map_or(Ok(16), |s| s.parse())?;
    let alg: Algorithm = args.get(1).map_or("fast", String::as_str).parse()?;
    let topo = Topology::preset("dgx-h100", nodes, None)?;
    let mut spec = TrafficSpec::new(topo.ranks(), Pattern::Lognormal(1.0));
    spec.bytes = 262_144;
    spec.seed = 3;
    let m = generate(&spec)?;
    let opts = Options::for_msccl(106);
    let plan = schedule(alg, &topo, &m, &opts)?;
    println!("{nodes} x 8 {alg}: {} transfers", plan.transfers.len());
    let mut base: Option<Vec<f64>> = None;
    for eps in [0.0, 0.01, 0.02, 0.05, 0.1] {
        if eps == 0.0 && plan.transfers.len() > 50_000 {
            continue;
        }
        let t0 = Instant::now();
        let sim = simulate(
            &topo,
            &plan,
            &SimOptions {
                tolerance: Some(eps),
                ..SimOptions::default()
            },
        )?;
        let took = t0.elapsed().as_secs_f64();
        let starts: Vec<f64> = sim.transfers.iter().map(|t| t.start_us).collect();
        let moved = base.as_ref().map_or(0.0, |b| {
            b.iter()
                .zip(&starts)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f64::max)
        });
        println!(
            "tolerance {eps}: {took:.2} s, {} events, completion {:.1} us, starts move by up to {moved:.1} us",
            sim.events, sim.completion_us
        );
        base.get_or_insert(starts);
    }
    Ok(())
}
