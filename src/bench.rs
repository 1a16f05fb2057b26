//! The benchmark suite behind `switchyard bench`: which clusters, which
//! workloads, and how every algorithm is judged (simulated completion over
//! the lower bound in both network modes, speedup over `direct`, compile time).
//! docs/benchmarks.md describes the suite and records its results.

use std::time::Instant;

use serde::Serialize;
use switchyard_compiler::bound::cut_bound;
use switchyard_compiler::generate::{generate, Pattern, TrafficSpec};
use switchyard_compiler::sched::{auto, schedule, Options};
use switchyard_compiler::sim::{simulate, Network, SimOptions};
use switchyard_compiler::topology::{FabricSpec, TopologySpec};
use switchyard_compiler::{verify_on, Algorithm, Error, Result, Topology, TrafficMatrix};

/// One (cluster, workload) pair of the suite.
pub struct Case {
    pub cluster: String,
    pub topo: Topology,
    pub workload: String,
    /// Zipf exponent for the MoE workloads (the SVG's x axis).
    pub skew: Option<f64>,
    pub traffic: TrafficMatrix,
}

/// One algorithm on one case.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub cluster: String,
    pub workload: String,
    pub skew: Option<f64>,
    pub algorithm: String,
    pub ranks: usize,
    pub total_bytes: u64,
    pub lower_bound_us: f64,
    pub ideal_us: f64,
    pub congested_us: f64,
    pub ratio_ideal: f64,
    pub ratio_congested: f64,
    /// `direct`'s completion over this algorithm's (above 1 = faster than direct).
    pub speedup_ideal: f64,
    pub speedup_congested: f64,
    pub compile_us: f64,
    pub steps: usize,
    pub transfers: usize,
}

fn cluster(preset: &str, nodes: usize, leaf: Option<(usize, f64)>) -> Result<(String, Topology)> {
    let mut spec = TopologySpec::preset(preset, nodes, None)?;
    let mut name = format!("{preset} {nodes}x8");
    if let Some((k, over)) = leaf {
        spec.fabric = Some(FabricSpec::fat_tree(k, over, 1.0));
        name = format!("{name} fat-tree {over}:1");
    }
    let topo = Topology::from_spec(spec, &name)?;
    Ok((name, topo))
}

/// The workloads: (name, pattern, skew for the plot).
fn workloads(quick: bool) -> Vec<(String, Pattern, Option<f64>)> {
    let mut w = vec![("uniform".to_string(), Pattern::Uniform, None)];
    let skews: &[f64] = if quick {
        &[0.8, 1.2]
    } else {
        &[0.5, 0.8, 1.0, 1.2]
    };
    for &s in skews {
        w.push((format!("moe zipf {s}"), Pattern::Zipf(s), Some(s)));
    }
    if !quick {
        w.push(("lognormal 0.5".into(), Pattern::Lognormal(0.5), None));
    }
    w.push(("lognormal 1.0".into(), Pattern::Lognormal(1.0), None));
    w.push(("hotspot 0.3".into(), Pattern::Hotspot(0.3), None));
    w.push(("intra-skew 1.2".into(), Pattern::IntraSkew(1.2), None));
    w
}

/// The suite's cases (docs/benchmarks.md lists them).
pub fn suite(quick: bool) -> Result<Vec<Case>> {
    let mut clusters = Vec::new();
    let sizes: &[usize] = if quick { &[2, 4] } else { &[2, 4, 8, 16] };
    for &n in sizes {
        clusters.push(cluster("dgx-h100", n, None)?);
    }
    if quick {
        clusters.push(cluster("dgx-h100", 8, Some((4, 4.0)))?);
        clusters.push(cluster("mi300x", 2, None)?);
    } else {
        clusters.push(cluster("dgx-h100", 8, Some((4, 2.0)))?);
        clusters.push(cluster("dgx-h100", 8, Some((4, 4.0)))?);
        clusters.push(cluster("mi300x", 4, None)?);
    }
    let mut cases = Vec::new();
    for (cname, topo) in clusters {
        for (i, (wname, pattern, skew)) in workloads(quick).into_iter().enumerate() {
            let mut spec = TrafficSpec::new(topo.ranks(), pattern);
            spec.seed = 1000 + i as u64;
            spec.gpus_per_node = topo.gpus_per_node();
            // 1 MiB per pair on average for the non-MoE patterns; MoE: 1024
            // tokens of 4096 bf16 values per rank, top-2 (16 MiB per rank).
            spec.bytes = 1 << 20;
            spec.moe.tokens_per_rank = 1024;
            cases.push(Case {
                cluster: cname.clone(),
                topo: topo.clone(),
                workload: wname,
                skew,
                traffic: generate(&spec)?,
            });
        }
    }
    Ok(cases)
}

/// Runs every algorithm on one case; the rows come back in `algs` order.
pub fn run_case(case: &Case, algs: &[Algorithm]) -> Result<Vec<Row>> {
    let bound = cut_bound(&case.topo, &case.traffic).best_us();
    let mut rows = Vec::with_capacity(algs.len());
    for &alg in algs {
        let t0 = Instant::now();
        let plan = match schedule(alg, &case.topo, &case.traffic, &Options::default()) {
            Ok(p) => p,
            // An algorithm that does not apply to this cluster is left out.
            Err(Error::Unsupported { .. }) => continue,
            Err(e) => return Err(e),
        };
        let compile_us = t0.elapsed().as_secs_f64() * 1e6;
        verify_on(&plan, &case.traffic, &case.topo)?;
        let ideal = simulate(&case.topo, &plan, &SimOptions::default())?.completion_us;
        // `auto` chooses for the network mode it is judged in.
        let congested_plan = match alg {
            Algorithm::Auto => auto(&case.topo, &case.traffic, Network::Congested)?.0,
            _ => plan.clone(),
        };
        let congested = simulate(
            &case.topo,
            &congested_plan,
            &SimOptions {
                network: Network::Congested,
                ..SimOptions::default()
            },
        )?
        .completion_us;
        rows.push(Row {
            cluster: case.cluster.clone(),
            workload: case.workload.clone(),
            skew: case.skew,
            algorithm: alg.name().to_string(),
            ranks: case.topo.ranks(),
            total_bytes: case.traffic.total(),
            lower_bound_us: bound,
            ideal_us: ideal,
            congested_us: congested,
            ratio_ideal: ideal / bound,
            ratio_congested: congested / bound,
            speedup_ideal: 0.0,
            speedup_congested: 0.0,
            compile_us,
            steps: plan.steps(),
            transfers: plan.transfers.len(),
        });
    }
    if let Some(d) = rows.iter().find(|r| r.algorithm == "direct").cloned() {
        for r in &mut rows {
            r.speedup_ideal = d.ideal_us / r.ideal_us;
            r.speedup_congested = d.congested_us / r.congested_us;
        }
    }
    Ok(rows)
}

/// Median of a non-empty list.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}
