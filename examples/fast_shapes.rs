//! `fast` on node shapes other than 8 GPUs with a NIC each (issue 4, item 5):
//! GPUs sharing NICs, 1 to 72 GPUs per node. Ratio of the
//! simulated completion to the cut bound, `fast` next to `direct`, in both
//! network modes; NVLink 450 GB/s through a switch, 50 GB/s NICs, 1 MiB per
//! pair on average (MoE: 1024 tokens per rank).
//!
//! cargo run --release --example fast_shapes -- [NODES,..] [SEED]

use switchyard::compiler::bound::cut_bound;
use switchyard::compiler::generate::{generate, Pattern, TrafficSpec};
use switchyard::compiler::planner::{Planner, PlannerOptions};
use switchyard::compiler::sched::direct;
use switchyard::compiler::sim::{simulate, Network, SimOptions};
use switchyard::compiler::topology::TopologySpec;
use switchyard::compiler::Topology;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    switchyard::restore_sigpipe();
    let mut args = std::env::args().skip(1);
    let nodes: Vec<usize> = match args.next() {
        Some(a) => a.split(',').map(str::parse).collect::<Result<_, _>>()?,
        None => vec![4, 8],
    };
    let seed: u64 = args.next().map(|a| a.parse()).transpose()?.unwrap_or(3);
    println!("shape (nodes x gpus, nics)  pattern          fast ideal / congested   direct ideal / congested");
    for (gpus, nics) in [
        (8, 8),
        (8, 4),
        (8, 2),
        (8, 1),
        (6, 3),
        (4, 4),
        (2, 2),
        (1, 1),
        (16, 16),
        (16, 8),
        (72, 18),
    ] {
        for &n in &nodes {
            // DGX-H100's NVSwitch and NICs, `nics` of them per node.
            let mut spec = TopologySpec::preset("dgx-h100", n, Some(gpus))?;
            if let Some(nic) = spec.nic.as_mut() {
                nic.per_node = nics;
            }
            let topo = Topology::from_spec(spec, "shape")?;
            for p in [
                Pattern::Zipf(1.0),
                Pattern::Lognormal(0.5),
                Pattern::Hotspot(0.3),
            ] {
                let mut spec = TrafficSpec::new(topo.ranks(), p);
                spec.seed = seed;
                spec.gpus_per_node = gpus;
                spec.moe.tokens_per_rank = 1024;
                let m = generate(&spec)?;
                let bound = cut_bound(&topo, &m).best_us();
                let fast = Planner::fast(&topo, PlannerOptions::default())?.plan(&m)?;
                let base = direct(&topo, &m);
                let mut cells = Vec::new();
                for plan in [&fast, &base] {
                    for net in [Network::Ideal, Network::Congested] {
                        let t = simulate(&topo, plan, &SimOptions::new(net))?.completion_us;
                        cells.push(t / bound);
                    }
                }
                println!(
                    "{n:>2}x{gpus}, {nics} NIC{}             {:16} {:.3} / {:.3}            {:.3} / {:.3}",
                    if nics == 1 { " " } else { "s" },
                    format!("{p:?}"),
                    cells[0],
                    cells[1],
                    cells[2],
                    cells[3]
                );
            }
        }
    }
    Ok(())
}
