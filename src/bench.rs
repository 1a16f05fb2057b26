//! The benchmark suite behind `switchyard bench`: which clusters, which
//! workloads, and how every algorithm is judged (simulated completion over
//! the lower bound at line rate (`ideal`) and in the `calibrated` model,
//! speedup over `direct`, and in the calibrated model over `pxn` and
//! `deepep`, compile time).
//! docs/benchmarks.md describes the suite and records its results.

use std::time::Instant;

use serde::{Deserialize, Serialize};
use switchyard_compiler::bound::{cut_bound, cut_bound_goodput};
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

/// One algorithm on one case (`bench --json` writes these; the plot can
/// read them back).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Row {
    pub cluster: String,
    pub workload: String,
    pub skew: Option<f64>,
    pub algorithm: String,
    pub ranks: usize,
    pub total_bytes: u64,
    pub lower_bound_us: f64,
    pub ideal_us: f64,
    pub calibrated_us: f64,
    pub ratio_ideal: f64,
    pub ratio_calibrated: f64,
    /// `direct`'s completion over this algorithm's (above 1 = faster than direct).
    pub speedup_ideal: f64,
    pub speedup_calibrated: f64,
    /// The cut bound at the calibrated NIC goodput (`ratio_calibrated`'s).
    pub lower_bound_calibrated_us: f64,
    /// In the calibrated model: `pxn`'s (NCCL's default) and `deepep`'s
    /// completion over this algorithm's (0 when that baseline was not run).
    pub speedup_pxn: f64,
    pub speedup_deepep: f64,
    pub compile_us: f64,
    pub steps: usize,
    pub transfers: usize,
}

/// An oversubscribed fabric of the suite: leaves (or rail groups) of
/// `nodes` nodes, `over`:1.
#[derive(Clone, Copy)]
enum Fabric {
    FatTree { nodes: usize, over: f64 },
    Rail { nodes: usize, over: f64 },
}

fn cluster(preset: &str, nodes: usize, fabric: Option<Fabric>) -> Result<(String, Topology)> {
    let mut spec = TopologySpec::preset(preset, nodes, None)?;
    let mut name = format!("{preset} {nodes}x8");
    match fabric {
        Some(Fabric::FatTree { nodes: k, over }) => {
            spec.fabric = Some(FabricSpec::fat_tree(k, over, 1.0));
            name = format!("{name} fat-tree {over}:1");
        }
        Some(Fabric::Rail { nodes: k, over }) => {
            spec.fabric = Some(FabricSpec::rail_optimized(Some(k), over, 1.0));
            name = format!("{name} rail {over}:1");
        }
        None => {}
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
    let fat_tree = |over| Some(Fabric::FatTree { nodes: 4, over });
    if quick {
        clusters.push(cluster("dgx-h100", 8, fat_tree(4.0))?);
        clusters.push(cluster("mi300x", 2, None)?);
    } else {
        clusters.push(cluster("dgx-h100", 8, fat_tree(2.0))?);
        clusters.push(cluster("dgx-h100", 8, fat_tree(4.0))?);
        // Rail groups of 4 nodes whose spine links carry half their NICs'
        // bandwidth: the group's spine cut binds as a 2:1 leaf's uplinks do.
        let rail = Some(Fabric::Rail {
            nodes: 4,
            over: 2.0,
        });
        clusters.push(cluster("dgx-h100", 8, rail)?);
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
    let cal_opts = SimOptions::new(Network::Calibrated);
    let cal_bound = cut_bound_goodput(&case.topo, &case.traffic, cal_opts.nic_goodput()).best_us();
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
        let cal_plan = match alg {
            Algorithm::Auto => auto(&case.topo, &case.traffic, Network::Calibrated)?.0,
            _ => plan.clone(),
        };
        let calibrated = simulate(&case.topo, &cal_plan, &cal_opts)?.completion_us;
        rows.push(Row {
            cluster: case.cluster.clone(),
            workload: case.workload.clone(),
            skew: case.skew,
            algorithm: alg.name().to_string(),
            ranks: case.topo.ranks(),
            total_bytes: case.traffic.total(),
            lower_bound_us: bound,
            ideal_us: ideal,
            calibrated_us: calibrated,
            ratio_ideal: ideal / bound,
            ratio_calibrated: calibrated / cal_bound,
            speedup_ideal: 0.0,
            speedup_calibrated: 0.0,
            lower_bound_calibrated_us: cal_bound,
            speedup_pxn: 0.0,
            speedup_deepep: 0.0,
            compile_us,
            steps: plan.steps(),
            transfers: plan.transfers.len(),
        });
    }
    if let Some(d) = rows.iter().find(|r| r.algorithm == "direct").cloned() {
        for r in &mut rows {
            r.speedup_ideal = d.ideal_us / r.ideal_us;
            r.speedup_calibrated = d.calibrated_us / r.calibrated_us;
        }
    }
    for base in ["pxn", "deepep"] {
        let Some(b) = rows
            .iter()
            .find(|r| r.algorithm == base)
            .map(|r| r.calibrated_us)
        else {
            continue;
        };
        for r in &mut rows {
            let x = b / r.calibrated_us;
            if base == "pxn" {
                r.speedup_pxn = x;
            } else {
                r.speedup_deepep = x;
            }
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
