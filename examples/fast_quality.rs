//! Quality harness for `fast` and `spray` (issue 4): simulated completion
//! over the cut lower bound, in both network modes, next to `direct`, on the
//! skewed workloads of the bench (MoE zipf 1.0, log-normal, hotspot,
//! intra-node skew) and uniform, on full-bisection DGX-H100 clusters.
//!
//! With `--fabric`, the fabric-bound sweep of issue 24 instead: DGX-H100
//! nodes (8 and 16 by default) on each fabric named, MoE Zipf 0.8, 1.0 and
//! 1.2, log-normal 1.0, hotspot 0.3 and intra-node skew 1.2, seeds 1 and 2,
//! in the `ideal` and `calibrated` modes (`fast` planned for the mode, as
//! `compile --network` plans it; each against its own bound, the
//! calibrated one at the NIC goodput), `direct` beside `fast`, then the
//! median and worst of `fast` per fabric and mode, and every case where
//! `fast` is more than 1% slower than `direct`. Fabrics:
//! `fat-tree:OVER[:NODES_PER_LEAF]` and `rail:OVER[:NODES_PER_GROUP]`
//! (4 nodes per leaf or rail group unless given; `rail:2:0` is one group).
//! `--patterns` narrows the sweep to the patterns listed (as `generate`
//! spells them: `zipf:1.2,intra-skew:1.2`).
//!
//! cargo run --release --example fast_quality -- [NODES,..] [BYTES_PER_PAIR]
//! cargo run --release --example fast_quality -- [NODES,..] --fabric fat-tree:2,fat-tree:4,rail:2 [--patterns P,..]

use switchyard::compiler::bound::{cut_bound, cut_bound_goodput};
use switchyard::compiler::generate::{generate, Pattern, TrafficSpec};
use switchyard::compiler::planner::{Planner, PlannerOptions};
use switchyard::compiler::sched::direct;
use switchyard::compiler::sim::{simulate, Network, SimOptions};
use switchyard::compiler::topology::{FabricSpec, TopologySpec};
use switchyard::compiler::{Plan, Topology};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn main() -> Res<()> {
    switchyard::restore_sigpipe();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let fabrics = match args.iter().position(|a| a == "--fabric") {
        Some(i) => Some(args.get(i + 1).ok_or("--fabric needs a list")?.clone()),
        None => None,
    };
    let patterns: Option<Vec<Pattern>> = match args.iter().position(|a| a == "--patterns") {
        Some(i) => Some(
            args.get(i + 1)
                .ok_or("--patterns needs a list")?
                .split(',')
                .map(str::parse)
                .collect::<Result<_, _>>()?,
        ),
        None => None,
    };
    let mut plain = args
        .iter()
        .enumerate()
        .filter(|&(i, a)| {
            !a.starts_with("--") && (i == 0 || !["--fabric", "--patterns"].contains(&&*args[i - 1]))
        })
        .map(|(_, a)| a);
    let nodes: Option<Vec<usize>> = plain
        .next()
        .map(|a| a.split(',').map(str::parse).collect::<Result<_, _>>())
        .transpose()?;
    if let Some(list) = fabrics {
        return fabric_sweep(
            &list,
            &nodes.unwrap_or_else(|| vec![8, 16]),
            patterns.as_deref(),
        );
    }
    let nodes = nodes.unwrap_or_else(|| vec![2, 4, 8, 16]);
    let bytes: Option<u64> = plain.next().map(|a| a.parse()).transpose()?;
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
            let plan_of = |staged| -> Res<(Plan, u32)> {
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
                let ratio = |plan: &Plan| -> Res<f64> {
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

/// A DGX-H100 cluster of `nodes` nodes on the fabric `name` (see the header).
fn fabric_topology(name: &str, nodes: usize) -> Res<Topology> {
    let parts: Vec<&str> = name.split(':').collect();
    let over: f64 = parts.get(1).ok_or("fabric needs `:OVER`")?.parse()?;
    let size: usize = parts.get(2).map_or(Ok(4), |s| s.parse())?;
    let mut spec = TopologySpec::preset("dgx-h100", nodes, None)?;
    spec.fabric = Some(match parts[0] {
        "fat-tree" => FabricSpec::fat_tree(size, over, 1.0),
        "rail" => FabricSpec::rail_optimized((size > 0).then_some(size), over, 1.0),
        other => return Err(format!("unknown fabric `{other}`").into()),
    });
    Ok(Topology::from_spec(spec, name)?)
}

fn fabric_sweep(list: &str, nodes: &[usize], only: Option<&[Pattern]>) -> Res<()> {
    let all = [
        Pattern::Zipf(0.8),
        Pattern::Zipf(1.0),
        Pattern::Zipf(1.2),
        Pattern::Lognormal(1.0),
        Pattern::Hotspot(0.3),
        Pattern::IntraSkew(1.2),
    ];
    let patterns = only.unwrap_or(&all);
    let modes = [Network::Ideal, Network::Calibrated];
    let mut slower = Vec::new();
    let mut summary = Vec::new();
    println!("fabric        cluster pattern          seed  stages  network     direct    fast  (x bound)  binding cut");
    for fabric in list.split(',') {
        let mut ratios: Vec<Vec<f64>> = vec![Vec::new(); modes.len()];
        for &n in nodes {
            let topo = fabric_topology(fabric, n)?;
            // `fast` is planned for the mode it runs in (its per-message
            // cost), as `compile --network` and the Python planner do.
            let mut planners = modes
                .iter()
                .map(|&net| Planner::fast(&topo, PlannerOptions::for_network(net)))
                .collect::<Result<Vec<_>, _>>()?;
            for &p in patterns {
                for seed in [1u64, 2] {
                    let mut spec = TrafficSpec::new(topo.ranks(), p);
                    spec.seed = seed;
                    let m = generate(&spec)?;
                    let base = direct(&topo, &m);
                    for (k, &net) in modes.iter().enumerate() {
                        let planner = &mut planners[k];
                        let fast = planner.plan(&m)?;
                        let opts = SimOptions::new(net);
                        let lb = cut_bound_goodput(&topo, &m, opts.nic_goodput());
                        let bound = lb.best_us();
                        let d = simulate(&topo, &base, &opts)?.completion_us;
                        let f = simulate(&topo, &fast, &opts)?.completion_us;
                        let label =
                            format!("{fabric:13} {n:2}x8    {:16} {seed:4}", format!("{p:?}"));
                        println!(
                            "{label} {:7}  {:10} {:7.3} {:7.3}  {}",
                            planner.stage_count(),
                            net.name(),
                            d / bound,
                            f / bound,
                            lb.cut
                        );
                        ratios[k].push(f / bound);
                        if f > 1.01 * d {
                            slower.push(format!(
                                "{label} {}: fast {:.3} direct {:.3}",
                                net.name(),
                                f / bound,
                                d / bound
                            ));
                        }
                    }
                }
            }
        }
        for (k, r) in ratios.iter_mut().enumerate() {
            r.sort_by(f64::total_cmp);
            let c = r.len();
            let median = if c % 2 == 1 {
                r[c / 2]
            } else {
                (r[c / 2 - 1] + r[c / 2]) / 2.0
            };
            summary.push(format!(
                "{fabric:13} {:10} {c} cases: fast median {median:.3}, worst {:.3}",
                modes[k].name(),
                r[c - 1]
            ));
        }
    }
    println!();
    for s in summary {
        println!("{s}");
    }
    println!("fast more than 1% slower than direct: {}", slower.len());
    for s in slower {
        println!("  {s}");
    }
    Ok(())
}
