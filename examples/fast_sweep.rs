//! The sweeps that docs/algorithms.md and docs/benchmarks.md quote for
//! changes to `fast`. With a preset: that cluster at 2, 4 and 8 nodes (or
//! the given counts), nine traffic patterns, seeds 1 and 2, the generator's
//! default sizes and 64 KB per pair (108 cases at three node counts). With
//! `shapes`: 90 cases of other node shapes (2-8 nodes of 8 to 72 GPUs, 4 to
//! 32 NICs, NVSwitch at 450 GB/s and 50 GB/s NICs), MoE Zipf 1.0,
//! log-normal 0.5 and hotspot 0.3, seeds 1-3, 1024 MoE tokens per rank.
//! Prints each case's simulated completion over the bound (the bench's
//! bound, `CutBound::best_us`), then the median, the worst and the
//! geometric mean. Compare two builds line by line.
//!
//! `--calibrated` (or `--congested`) simulates in that network mode, against
//! the bound at its NIC goodput, and plans for it (the planner is told the
//! mode's per-message cost); the default is `ideal`. Each line ends with the
//! simulated completion in us, so that runs against different bounds can be
//! compared.
//!
//! cargo run --release --example fast_sweep -- [PRESET | shapes] [NODES,..] [--calibrated | --congested]

use switchyard::compiler::bound::cut_bound_goodput;
use switchyard::compiler::generate::{generate, Pattern, TrafficSpec};
use switchyard::compiler::planner::{Planner, PlannerOptions};
use switchyard::compiler::sim::{simulate, Network, SimOptions};
use switchyard::compiler::topology::TopologySpec;
use switchyard::compiler::Topology;

/// The node shapes of the `shapes` sweep: (nodes, GPUs per node, NICs per
/// node).
const SHAPES: [(usize, usize, usize); 10] = [
    (4, 8, 8),
    (8, 8, 8),
    (4, 8, 4),
    (4, 16, 16),
    (8, 16, 16),
    (4, 16, 8),
    (8, 16, 8),
    (4, 32, 32),
    (4, 72, 18),
    (2, 16, 16),
];

/// `nodes` nodes of `gpus` GPUs with DGX-H100's NVSwitch and NICs, `nics`
/// NICs per node.
fn shape(nodes: usize, gpus: usize, nics: usize) -> Result<Topology, Box<dyn std::error::Error>> {
    let mut spec = TopologySpec::preset("dgx-h100", nodes, Some(gpus))?;
    if let Some(nic) = spec.nic.as_mut() {
        nic.per_node = nics;
    }
    Ok(Topology::from_spec(spec, "shapes")?)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    switchyard::restore_sigpipe();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let congested = args.iter().any(|a| a == "--congested");
    let calibrated = args.iter().any(|a| a == "--calibrated");
    let mut plain = args.iter().filter(|a| !a.starts_with("--"));
    let preset = plain.next().map_or("mi300x", String::as_str);
    let nodes: Vec<usize> = match plain.next() {
        Some(a) => a.split(',').map(str::parse).collect::<Result<_, _>>()?,
        None => vec![2, 4, 8],
    };
    let net = if congested {
        Network::Congested
    } else if calibrated {
        Network::Calibrated
    } else {
        Network::Ideal
    };
    let sim = SimOptions::new(net);
    // Each topology with the (label, traffic spec) of its cases.
    let mut groups: Vec<(Topology, Vec<(String, TrafficSpec)>)> = Vec::new();
    if preset == "shapes" {
        for (n, gpus, nics) in SHAPES {
            let topo = shape(n, gpus, nics)?;
            let mut cases = Vec::new();
            for p in [
                Pattern::Zipf(1.0),
                Pattern::Lognormal(0.5),
                Pattern::Hotspot(0.3),
            ] {
                for seed in 1u64..=3 {
                    let mut spec = TrafficSpec::new(topo.ranks(), p);
                    spec.seed = seed;
                    spec.gpus_per_node = gpus;
                    spec.moe.tokens_per_rank = 1024;
                    let label = format!("{n}x{gpus}/{nics} {:16} seed {seed}", format!("{p:?}"));
                    cases.push((label, spec));
                }
            }
            groups.push((topo, cases));
        }
    } else {
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
        for &n in &nodes {
            let topo = Topology::preset(preset, n, None)?;
            let mut cases = Vec::new();
            for p in patterns {
                for seed in [1u64, 2] {
                    for pair_bytes in [None, Some(65536u64)] {
                        let mut spec = TrafficSpec::new(topo.ranks(), p);
                        spec.seed = seed;
                        if let Some(b) = pair_bytes {
                            spec.set_mean_pair_bytes(b);
                        }
                        let size = pair_bytes.map_or("default".to_string(), |b| format!("{b} B"));
                        let label = format!(
                            "{n}x{} {:16} seed {seed} {:10}",
                            topo.gpus_per_node(),
                            format!("{p:?}"),
                            size
                        );
                        cases.push((label, spec));
                    }
                }
            }
            groups.push((topo, cases));
        }
    }
    let mut ratios = Vec::new();
    for (topo, cases) in &groups {
        // One planner per topology, re-planning each case as a training loop
        // would.
        let mut planner = Planner::fast(topo, PlannerOptions::for_sim(&sim))?;
        for (label, spec) in cases {
            let m = generate(spec)?;
            let bound = cut_bound_goodput(topo, &m, sim.nic_goodput()).best_us();
            let plan = planner.plan(&m)?;
            let t = simulate(topo, &plan, &sim)?.completion_us;
            println!("{label} {:.3} {t:.1}", t / bound);
            ratios.push(t / bound);
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
