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
use petgraph::visit::EdgeRef;

use crate::error::{num, Error, InputError, Result};
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

/// The graph the flow lives on: vertices, and arcs that each load one or
/// more topology links.
#[derive(Clone, Debug)]
pub struct FlowNetwork {
    /// Rank of each vertex that is a GPU.
    pub rank: Vec<Option<usize>>,
    /// Vertex of each rank.
    pub gpu: Vec<usize>,
    pub arcs: Vec<Arc>,
}

/// One arc of a [`FlowNetwork`].
#[derive(Clone, Debug)]
pub struct Arc {
    pub from: usize,
    pub to: usize,
    /// The topology links a byte on this arc crosses.
    pub links: Vec<LinkId>,
}

/// Which network the LP routes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Formulation {
    /// Every link of the topology graph is an arc: the unrestricted flow,
    /// hence the lower bound.
    Links,
    /// Arcs are GPU-to-GPU hops along the topology's own paths (those that
    /// pass no other GPU): the routes a plan can take on a `links` topology,
    /// where a transfer follows its fixed path and may only relay at GPUs.
    Hops,
}

impl FlowNetwork {
    pub fn new(topo: &Topology, formulation: Formulation) -> FlowNetwork {
        let g = topo.graph();
        let n = topo.ranks();
        match formulation {
            Formulation::Links => FlowNetwork {
                rank: g.node_weights().map(vertex_rank).collect(),
                gpu: (0..n).map(|r| topo.gpu_vertex(r).index()).collect(),
                arcs: g
                    .edge_references()
                    .map(|e| Arc {
                        from: e.source().index(),
                        to: e.target().index(),
                        links: vec![e.id().index() as LinkId],
                    })
                    .collect(),
            },
            Formulation::Hops => {
                let mut arcs = Vec::new();
                for a in 0..n {
                    for b in 0..n {
                        if a == b {
                            continue;
                        }
                        let links = topo.path(a, b);
                        let through_gpu = links.iter().any(|&l| {
                            let (_, v) = topo.link_ends(l);
                            matches!(v, Vertex::Gpu(r) if *r != b)
                        });
                        if !through_gpu {
                            arcs.push(Arc {
                                from: a,
                                to: b,
                                links,
                            });
                        }
                    }
                }
                FlowNetwork {
                    rank: (0..n).map(Some).collect(),
                    gpu: (0..n).collect(),
                    arcs,
                }
            }
        }
    }

    pub fn vertices(&self) -> usize {
        self.rank.len()
    }
}

/// The flow of one commodity (one source GPU), in bytes per arc.
#[derive(Clone, Debug)]
pub struct CommodityFlow {
    pub source: usize,
    /// `(arc, bytes)` for every arc that carries more than a negligible flow.
    pub arcs: Vec<(usize, f64)>,
}

/// An optimal (or, at the time limit, feasible) concurrent flow.
#[derive(Clone, Debug)]
pub struct McfSolution {
    pub network: FlowNetwork,
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
    formulation: Formulation,
    objective: Objective,
) -> Result<Option<McfSolution>> {
    let n = traffic.ranks();
    let sources: Vec<usize> = (0..n)
        .filter(|&s| (0..n).any(|d| d != s && traffic.get(s, d) > 0))
        .collect();
    if sources.is_empty() {
        return Ok(None);
    }
    if opts.time_limit_s.is_nan() || opts.time_limit_s <= 0.0 {
        return Err(InputError::new(
            "--time-limit",
            format!(
                "must be a positive number of seconds, got {}",
                num(opts.time_limit_s)
            ),
        )
        .into());
    }
    let g = topo.graph();
    let links = g.edge_count();
    let net = FlowNetwork::new(topo, formulation);
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
    // f[k][a]: flow of commodity k on arc a (None: pruned, the arc enters
    // the commodity's own source and could only carry a cycle).
    let mut f: Vec<Vec<Option<Variable>>> = Vec::with_capacity(sources.len());
    for &s in &sources {
        let src_v = net.gpu[s];
        f.push(
            net.arcs
                .iter()
                .map(|a| (a.to != src_v).then(|| vars.add(variable().min(0.0))))
                .collect(),
        );
    }
    let variables = 1 + f.iter().flatten().flatten().count();

    // (1) minimise T; (4) plus a tie-break on link time used, weighted so it
    // can never be worth more than a TIE_BREAK fraction of the makespan.
    let mut obj: Expression = t.into();
    if objective == Objective::MakespanThenRouting {
        let w = TIE_BREAK / (links as f64 * sources.len() as f64);
        let arc_time: Vec<f64> = net
            .arcs
            .iter()
            .map(|a| a.links.iter().map(|&l| 1.0 / cap[l as usize]).sum())
            .collect();
        for fk in &f {
            for (a, v) in fk.iter().enumerate() {
                if let Some(v) = v {
                    obj += (w * arc_time[a]) * *v;
                }
            }
        }
    }
    let mut model = highs(vars.minimise(obj))
        .set_time_limit(opts.time_limit_s)
        .set_option("random_seed", 0);
    model.set_verbose(opts.verbose);
    let mut constraints = 0;

    let mut out_arcs = vec![Vec::new(); net.vertices()];
    let mut in_arcs = vec![Vec::new(); net.vertices()];
    for (i, a) in net.arcs.iter().enumerate() {
        out_arcs[a.from].push(i);
        in_arcs[a.to].push(i);
    }
    // (2) conservation: for every commodity k and vertex v,
    //     Σ_{a ∈ out(v)} f_ka − Σ_{a ∈ in(v)} f_ka = b_k(v),
    //     b_k(s_k) = Σ_d M[s_k][d], b_k(gpu d) = −M[s_k][d], 0 elsewhere.
    for (k, &s) in sources.iter().enumerate() {
        for v in 0..net.vertices() {
            let mut flow = Expression::from(0.0);
            let mut any = false;
            for &a in &out_arcs[v] {
                if let Some(x) = f[k][a] {
                    flow += x;
                    any = true;
                }
            }
            for &a in &in_arcs[v] {
                if let Some(x) = f[k][a] {
                    flow -= x;
                    any = true;
                }
            }
            let supply = supply_of(traffic, s, net.rank[v]) / unit_bytes;
            if !any {
                if supply != 0.0 {
                    return Err(Error::Solver(format!(
                        "gpu{} has traffic but no link in the commodity of gpu{s}",
                        net.rank[v].unwrap_or(usize::MAX)
                    )));
                }
                continue;
            }
            model.add_constraint(constraint!(flow == supply));
            constraints += 1;
        }
    }
    // (3) capacity: for every link e, Σ_k Σ_{a ∋ e} f_ka ≤ c_e · T.
    let mut on_link = vec![Vec::new(); links];
    for (i, a) in net.arcs.iter().enumerate() {
        for &l in &a.links {
            on_link[l as usize].push(i);
        }
    }
    for e in 0..links {
        let mut load = Expression::from(0.0);
        let mut any = false;
        for fk in &f {
            for &a in &on_link[e] {
                if let Some(x) = fk[a] {
                    load += x;
                    any = true;
                }
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
                network: net,
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
            arcs: fk
                .iter()
                .enumerate()
                .filter_map(|(a, v)| {
                    let x = solution.value((*v)?);
                    (x > eps).then_some((a, x * unit_bytes))
                })
                .collect(),
        })
        .collect();
    Ok(Some(McfSolution {
        network: net,
        makespan_us: solution.value(t) * unit_us,
        flows,
        status,
        solve_s,
        variables,
        constraints,
    }))
}

/// `b_k(v)` of eq. (2) in bytes: what commodity `s` injects at a vertex
/// (`v_rank`: its rank if it is a GPU).
fn supply_of(traffic: &TrafficMatrix, s: usize, v_rank: Option<usize>) -> f64 {
    match v_rank {
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
