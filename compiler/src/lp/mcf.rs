//! The concurrent multi-commodity flow LP on the topology graph, built with
//! good_lp and solved by HiGHS. The equations are those of
//! docs/algorithms-lp.md, numbered there and in the comments below.
//!
//! Commodities are aggregated per source GPU: commodity `s` leaves GPU `s`
//! with the whole off-diagonal row `M[s][·]` and is absorbed by every
//! destination. A single-source commodity decomposes into paths to its
//! destinations, so this is exact (no relaxation), and it keeps the model to
//! `sources × links` flow variables.

use std::time::Instant;

use good_lp::{
    constraint, highs, variable, Expression, ProblemVariables, ResolutionError, Solution,
    SolutionStatus, SolverModel, Variable,
};
use petgraph::graph::NodeIndex;
use petgraph::visit::EdgeRef;
use petgraph::Direction;

use crate::error::{Error, Result};
use crate::topology::{LinkId, Topology, Vertex};
use crate::traffic::TrafficMatrix;

use super::LpOptions;

/// Relative weight of the routing tie-break (eq. 4) against the makespan.
const TIE_BREAK: f64 = 1e-4;

/// How the solve ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SolveStatus {
    Optimal,
    /// The time limit ran out; the flow is feasible but maybe not optimal.
    TimeLimit,
    /// The time limit ran out before any feasible flow was found: `flows`
    /// is empty and `makespan_us` infinite.
    NoFlow,
}

/// The flow of one commodity (one source GPU), in bytes per link.
#[derive(Clone, Debug)]
pub struct CommodityFlow {
    pub source: usize,
    /// `(link, bytes)` for every link that carries more than a negligible flow.
    pub links: Vec<(LinkId, f64)>,
}

/// An optimal (or, at the time limit, feasible) concurrent flow.
#[derive(Clone, Debug)]
pub struct McfSolution {
    /// Optimum makespan `T` of eq. (1), microseconds, without latency.
    pub makespan_us: f64,
    pub flows: Vec<CommodityFlow>,
    pub status: SolveStatus,
    pub solve_s: f64,
    pub variables: usize,
    pub constraints: usize,
}

/// What the LP minimises.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Objective {
    /// Eq. (1) alone: the lower bound.
    Makespan,
    /// Eq. (1) plus the small routing tie-break of eq. (4), so that links the
    /// optimum does not need carry no detours: the scheduler's model.
    MakespanThenRouting,
}

/// Solves the concurrent MCF of `traffic` on `topo`. `Ok(None)` when no byte
/// leaves its rank (the makespan is 0 and there is nothing to route).
pub fn solve_mcf(
    topo: &Topology,
    traffic: &TrafficMatrix,
    opts: &LpOptions,
    objective: Objective,
) -> Result<Option<McfSolution>> {
    let n = traffic.ranks();
    let sources: Vec<usize> = (0..n)
        .filter(|&s| (0..n).any(|d| d != s && traffic.get(s, d) > 0))
        .collect();
    if sources.is_empty() {
        return Ok(None);
    }
    if !(opts.time_limit_s > 0.0) {
        return Err(Error::Solver(format!(
            "time limit must be positive, got {} s",
            opts.time_limit_s
        )));
    }
    let g = topo.graph();
    let links = g.edge_count();
    // Scale to O(1) numbers: flow in units of the mean off-diagonal row, time
    // in units of that row over the fastest link.
    let unit_bytes = traffic.off_diagonal_total() as f64 / sources.len() as f64;
    let bw_ref = g
        .edge_weights()
        .map(|l| l.bandwidth)
        .fold(0.0_f64, f64::max);
    let unit_us = unit_bytes / bw_ref;
    let cap: Vec<f64> = g.edge_weights().map(|l| l.bandwidth / bw_ref).collect();

    let mut vars = ProblemVariables::new();
    let t = vars.add(variable().min(0.0));
    // f[k][e]: flow of commodity k on link e (None: pruned, the link enters
    // the commodity's own source and could only carry a cycle).
    let mut f: Vec<Vec<Option<Variable>>> = Vec::with_capacity(sources.len());
    for &s in &sources {
        let src_v = topo.gpu_vertex(s);
        f.push(
            g.edge_references()
                .map(|e| (e.target() != src_v).then(|| vars.add(variable().min(0.0))))
                .collect(),
        );
    }
    let variables = 1 + f.iter().flatten().flatten().count();

    // (1) minimise T; (4) plus a tie-break on link time used, weighted so it
    // can never be worth more than a TIE_BREAK fraction of the makespan.
    let mut obj: Expression = t.into();
    if objective == Objective::MakespanThenRouting {
        let w = TIE_BREAK / (links as f64 * sources.len() as f64);
        for fk in &f {
            for (e, v) in fk.iter().enumerate() {
                if let Some(v) = v {
                    obj += (w / cap[e]) * *v;
                }
            }
        }
    }
    let mut model = highs(vars.minimise(obj))
        .set_time_limit(opts.time_limit_s)
        .set_option("random_seed", 0);
    model.set_verbose(opts.verbose);
    let mut constraints = 0;

    // (2) conservation: for every commodity k and vertex v,
    //     Σ_{e ∈ out(v)} f_ke − Σ_{e ∈ in(v)} f_ke = b_k(v),
    //     b_k(s_k) = Σ_d M[s_k][d], b_k(gpu d) = −M[s_k][d], 0 elsewhere.
    for (k, &s) in sources.iter().enumerate() {
        for v in g.node_indices() {
            let mut flow = Expression::from(0.0);
            let mut any = false;
            for e in g.edges_directed(v, Direction::Outgoing) {
                if let Some(x) = f[k][e.id().index()] {
                    flow += x;
                    any = true;
                }
            }
            for e in g.edges_directed(v, Direction::Incoming) {
                if let Some(x) = f[k][e.id().index()] {
                    flow -= x;
                    any = true;
                }
            }
            let supply = supply_of(topo, traffic, s, v) / unit_bytes;
            if !any {
                if supply != 0.0 {
                    return Err(Error::Solver(format!(
                        "gpu{} has traffic but no link in the commodity of gpu{s}",
                        vertex_rank(&g[v]).unwrap_or(usize::MAX)
                    )));
                }
                continue;
            }
            model.add_constraint(constraint!(flow == supply));
            constraints += 1;
        }
    }
    // (3) capacity: for every link e, Σ_k f_ke ≤ c_e · T.
    for e in 0..links {
        let mut load = Expression::from(0.0);
        let mut any = false;
        for fk in &f {
            if let Some(x) = fk[e] {
                load += x;
                any = true;
            }
        }
        if any {
            model.add_constraint(constraint!(load <= cap[e] * t));
            constraints += 1;
        }
    }

    let started = Instant::now();
    let solution = match model.solve() {
        Ok(sol) => sol,
        // HiGHS stopped (time limit) holding no primal-feasible point.
        Err(ResolutionError::Other("NoSolutionFound")) => {
            return Ok(Some(McfSolution {
                makespan_us: f64::INFINITY,
                flows: Vec::new(),
                status: SolveStatus::NoFlow,
                solve_s: started.elapsed().as_secs_f64(),
                variables,
                constraints,
            }))
        }
        Err(other) => return Err(Error::Solver(format!("HiGHS: {other}"))),
    };
    let solve_s = started.elapsed().as_secs_f64();
    let status = match solution.status() {
        SolutionStatus::TimeLimit => SolveStatus::TimeLimit,
        _ => SolveStatus::Optimal,
    };
    // Flows below this are solver noise, not routing decisions.
    let eps = 1e-9;
    let flows = sources
        .iter()
        .zip(&f)
        .map(|(&s, fk)| CommodityFlow {
            source: s,
            links: fk
                .iter()
                .enumerate()
                .filter_map(|(e, v)| {
                    let x = solution.value((*v)?);
                    (x > eps).then(|| (e as LinkId, x * unit_bytes))
                })
                .collect(),
        })
        .collect();
    Ok(Some(McfSolution {
        makespan_us: solution.value(t) * unit_us,
        flows,
        status,
        solve_s,
        variables,
        constraints,
    }))
}

/// `b_k(v)` of eq. (2) in bytes: what commodity `s` injects at vertex `v`.
fn supply_of(topo: &Topology, traffic: &TrafficMatrix, s: usize, v: NodeIndex) -> f64 {
    match vertex_rank(&topo.graph()[v]) {
        Some(r) if r == s => (0..traffic.ranks())
            .filter(|&d| d != s)
            .map(|d| traffic.get(s, d) as f64)
            .sum(),
        Some(r) if r < traffic.ranks() => -(traffic.get(s, r) as f64),
        _ => 0.0,
    }
}

fn vertex_rank(v: &Vertex) -> Option<usize> {
    match v {
        Vertex::Gpu(r) => Some(*r),
        _ => None,
    }
}
