//! The 108-case sweep that docs/algorithms.md and docs/benchmarks.md quote
//! for changes to `fast`: one preset cluster at 2, 4 and 8 nodes (or the
//! given counts), nine traffic patterns, seeds 1 and 2, the generator's
//! default sizes and 64 KB per pair. Prints each case's simulated completion
//! over the bound (the bench's bound, `CutBound::best_us`), then the median,
//! the worst and the geometric mean. Compare two builds line by line.
//!
//! cargo run --release --example fast_sweep -- [PRESET] [NODES,..] [--congested]

use switchyard::compiler::bound::cut_bound;
use switchyard::compiler::generate::{generate, Pattern, TrafficSpec};
use switchyard::compiler::planner::{Planner, PlannerOptions};
use switchyard::compiler::sim::{simulate, Network, SimOptions};
use switchyard::compiler::Topology;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let congested = args.iter().any(|a| a == "--congested");
    let mut plain = args.iter().filter(|a| !a.starts_with("--"));
    let preset = plain.next().map_or("mi300x", String::as_str);
    let nodes: Vec<usize> = match plain.next() {
        Some(a) => a.split(',').map(str::parse).collect::<Result<_, _>>()?,
        None => vec![2, 4, 8],
    };
    let patterns = [
        Pattern::Zipf(0.5),
        Pattern::Zipf(1.0),
        Pattern::Zipf(1.2),
        Pattern::Lognormal(0.5),
        Pattern::Lognormal(1.0),
        Pattern::Hotspot(0.3),
        Pattern::IntraSkew(1.0),
        Pattern::IntraSkew(1.2),
        Pattern::Uniform,
    ];
    let net = if congested {
        Network::Congested
    } else {
        Network::Ideal
    };
    let mut ratios = Vec::new();
    for &n in &nodes {
        let topo = Topology::preset(preset, n, None)?;
        let mut planner = Planner::new(&topo, PlannerOptions::default())?;
        for p in patterns {
            for seed in [1u64, 2] {
                for pair_bytes in [None, Some(65536u64)] {
                    let mut spec = TrafficSpec::new(topo.ranks(), p);
                    spec.seed = seed;
                    if let Some(b) = pair_bytes {
                        spec.set_mean_pair_bytes(b);
                    }
                    let m = generate(&spec)?;
                    let bound = cut_bound(&topo, &m).best_us();
                    let plan = planner.plan(&m)?;
                    let t = simulate(&topo, &plan, &SimOptions::new(net))?.completion_us;
                    let size = pair_bytes.map_or("default".to_string(), |b| format!("{b} B"));
                    println!(
                        "{n}x{} {:16} seed {seed} {:10} {:.3}",
                        topo.gpus_per_node(),
                        format!("{p:?}"),
                        size,
                        t / bound
                    );
                    ratios.push(t / bound);
                }
            }
        }
    }
    if ratios.is_empty() {
        return Ok(());
    }
    ratios.sort_by(f64::total_cmp);
    let k = ratios.len();
    let median = if k % 2 == 1 {
        ratios[k / 2]
    } else {
        (ratios[k / 2 - 1] + ratios[k / 2]) / 2.0
    };
    let geomean = (ratios.iter().map(|r| r.ln()).sum::<f64>() / k as f64).exp();
    println!(
        "{k} cases ({net:?}): median {median:.4}, worst {:.4}, geometric mean {geomean:.4}",
        ratios[k - 1]
    );
    Ok(())
}
