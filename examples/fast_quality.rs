//! Quality harness for `fast` and `spray` (issue 4): simulated completion
//! over the cut lower bound, in both network modes, next to `direct`, on the
//! skewed workloads of the bench (MoE zipf 1.0, log-normal, hotspot,
//! intra-node skew) and uniform, on full-bisection DGX-H100 clusters.
//!
//! cargo run --release --example fast_quality -- [NODES,..] [BYTES_PER_PAIR]

use switchyard::compiler::bound::cut_bound;
use switchyard::compiler::generate::{generate, Pattern, TrafficSpec};
use switchyard::compiler::planner::{Planner, PlannerOptions};
use switchyard::compiler::sched::direct;
use switchyard::compiler::sim::{simulate, Network, SimOptions};
use switchyard::compiler::{Plan, Topology};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    switchyard::restore_sigpipe();
    let mut args = std::env::args().skip(1);
    let nodes: Vec<usize> = match args.next() {
        Some(a) => a.split(',').map(str::parse).collect::<Result<_, _>>()?,
        None => vec![2, 4, 8, 16],
    };
    let bytes: Option<u64> = args.next().map(|a| a.parse()).transpose()?;
    let patterns = [
        Pattern::Zipf(1.0),
        Pattern::Lognormal(1.0),
        Pattern::Hotspot(0.3),
        Pattern::IntraSkew(1.0),
        Pattern::Uniform,
    ];
    println!("cluster  pattern          network    direct   spray    fast  stages  (x cut bound)");
    for &n in &nodes {
        let topo = Topology::preset("dgx-h100", n, None)?;
        for p in patterns {
            let mut spec = TrafficSpec::new(topo.ranks(), p);
            spec.seed = 1;
            if let Some(b) = bytes {
                spec.set_mean_pair_bytes(b);
            }
            let m = generate(&spec)?;
            let bound = cut_bound(&topo, &m).cut_us;
            let plan_of = |staged| -> Result<(Plan, u32), Box<dyn std::error::Error>> {
                let opts = PlannerOptions {
                    staged,
                    ..PlannerOptions::default()
                };
                let mut planner = Planner::fast(&topo, opts)?;
                let plan = planner.plan(&m)?;
                Ok((plan, planner.stage_count()))
            };
            let (fast, stages) = plan_of(true)?;
            let (spray, _) = plan_of(false)?;
            let base = direct(&topo, &m);
            for net in [Network::Ideal, Network::Congested] {
                let ratio = |plan: &Plan| -> Result<f64, Box<dyn std::error::Error>> {
                    Ok(simulate(&topo, plan, &SimOptions::new(net))?.completion_us / bound)
                };
                println!(
                    "{n:2}x8     {:16} {:9} {:7.3} {:7.3} {:7.3} {stages:7}",
                    format!("{p:?}"),
                    net.name(),
                    ratio(&base)?,
                    ratio(&spray)?,
                    ratio(&fast)?
                );
            }
        }
    }
    Ok(())
}
