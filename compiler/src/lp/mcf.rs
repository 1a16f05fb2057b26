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

/// The variables of the flow LP of `traffic` on `topo` in `formulation`
/// (the makespan and one per commodity and arc that does not enter the
/// commodity's source), from the flow network alone: what a solve would
/// build, known before building it.
pub fn model_variables(
    topo: &Topology,
    traffic: &TrafficMatrix,
    formulation: Formulation,
) -> usize {
    let n = traffic.ranks();
    let net = FlowNetwork::new(topo, formulation);
    let mut into = vec![0usize; net.vertices()];
    for a in &net.arcs {
        into[a.to] += 1;
    }
    1 + (0..n)
        .filter(|&s| (0..n).any(|d| d != s && traffic.get(s, d) > 0))
        .map(|s| net.arcs.len() - into[net.gpu[s]])
        .sum::<usize>()
}

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
    /// Links, with the fabric (leaves, rail switches, spine) split into one
    /// plane per rail: a NIC of rail `r` reaches only the NICs of rail `r`
    /// on other nodes. Every inter-node hop of a route is then rail to rail,
    /// so a GPU's peers are the GPUs of its node and those of its rail
    /// elsewhere, whatever the flow (an MSCCL file's threadblocks). The
    /// planes share the fabric's links, so its capacities hold as in
    /// Links; only routes are removed, so the optimum can be higher.
    Rails,
}

impl FlowNetwork {
    pub fn new(topo: &Topology, formulation: Formulation) -> FlowNetwork {
        let g = topo.graph();
        let n = topo.ranks();
        match formulation {
            Formulation::Links => {
                let keep = on_gpu_paths(g);
                FlowNetwork {
                    rank: g.node_weights().map(vertex_rank).collect(),
                    gpu: (0..n).map(|r| topo.gpu_vertex(r).index()).collect(),
                    arcs: g
                        .edge_references()
                        .filter(|e| keep[e.source().index()] && keep[e.target().index()])
                        .map(|e| Arc {
                            from: e.source().index(),
                            to: e.target().index(),
                            links: vec![e.id().index() as LinkId],
                        })
                        .collect(),
                }
            }
            Formulation::Rails => rail_planes(topo),
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

/// The [`Formulation::Rails`] network: the Links network, each fabric
/// vertex copied once per rail whose NICs reach it through the fabric
/// (the first such rail keeps the vertex itself), a NIC's links to and
/// from the fabric joined to its own rail's copy, and a link between two
/// fabric vertices an arc in every plane that holds both (all loading the
/// one link).
fn rail_planes(topo: &Topology) -> FlowNetwork {
    let g = topo.graph();
    let keep = on_gpu_paths(g);
    let nv = g.node_count();
    let rails = topo.nics_per_node().max(1);
    let fabric: Vec<bool> = g
        .node_weights()
        .map(|v| matches!(v, Vertex::Leaf(_) | Vertex::Rail(..) | Vertex::Spine))
        .collect();
    let mut rank: Vec<Option<usize>> = g.node_weights().map(vertex_rank).collect();
    // copy[v * rails + r]: fabric vertex v in rail r's plane.
    let mut copy: Vec<Option<usize>> = vec![None; nv * rails];
    let mut claimed = vec![false; nv];
    for r in 0..rails {
        let mut queue: Vec<usize> = g
            .edge_references()
            .filter(|e| {
                matches!(g[e.source()], Vertex::Nic(_, k) if k == r)
                    && fabric[e.target().index()]
                    && keep[e.source().index()]
                    && keep[e.target().index()]
            })
            .map(|e| e.target().index())
            .collect();
        while let Some(v) = queue.pop() {
            if copy[v * rails + r].is_some() {
                continue;
            }
            copy[v * rails + r] = Some(if claimed[v] {
                rank.push(None);
                rank.len() - 1
            } else {
                claimed[v] = true;
                v
            });
            queue.extend(
                g.neighbors(petgraph::graph::NodeIndex::new(v))
                    .map(|w| w.index())
                    .filter(|&w| fabric[w] && keep[w] && copy[w * rails + r].is_none()),
            );
        }
    }
    let nic_rail = |v: usize| match g[petgraph::graph::NodeIndex::new(v)] {
        Vertex::Nic(_, k) => Some(k),
        _ => None,
    };
    let mut arcs = Vec::new();
    for e in g.edge_references() {
        let (u, w) = (e.source().index(), e.target().index());
        if !(keep[u] && keep[w]) {
            continue;
        }
        let links = vec![e.id().index() as LinkId];
        match (fabric[u], fabric[w]) {
            (false, false) => arcs.push(Arc {
                from: u,
                to: w,
                links,
            }),
            (false, true) => {
                if let Some(to) = nic_rail(u).and_then(|k| copy[w * rails + k]) {
                    arcs.push(Arc { from: u, to, links });
                }
            }
            (true, false) => {
                if let Some(from) = nic_rail(w).and_then(|k| copy[u * rails + k]) {
                    arcs.push(Arc { from, to: w, links });
                }
            }
            (true, true) => {
                for r in 0..rails {
                    if let (Some(from), Some(to)) = (copy[u * rails + r], copy[w * rails + r]) {
                        arcs.push(Arc {
                            from,
                            to,
                            links: links.clone(),
                        });
                    }
                }
            }
        }
    }
    FlowNetwork {
        rank,
        gpu: (0..topo.ranks())
            .map(|r| topo.gpu_vertex(r).index())
            .collect(),
        arcs,
    }
}

/// The vertices a flow between GPUs can use: every GPU, and every other
/// vertex that some simple path from a GPU to another passes. A vertex
/// that is not a GPU is on such a path only if it has a live in-neighbour
/// and a live out-neighbour that differ; one without (a NIC no GPU uses,
/// hanging off its leaf) could only carry a cycle, so it is removed, and
/// then its neighbours are checked again. Without this, a legal topology
/// with 2^20 idle NICs made an LP of millions of variables that no time
/// limit stopped. Parallel links count twice, which only keeps more.
fn on_gpu_paths(g: &petgraph::graph::DiGraph<Vertex, crate::topology::Link>) -> Vec<bool> {
    use petgraph::Direction::{Incoming, Outgoing};
    let nv = g.node_count();
    let gpu: Vec<bool> = g
        .node_weights()
        .map(|v| matches!(v, Vertex::Gpu(_)))
        .collect();
    let mut live = vec![true; nv];
    let mut count = [vec![0usize; nv], vec![0usize; nv]];
    for e in g.edge_references().filter(|e| e.source() != e.target()) {
        count[0][e.target().index()] += 1;
        count[1][e.source().index()] += 1;
    }
    let node = petgraph::graph::NodeIndex::new;
    // The one live neighbour in a direction, when the count says one.
    let only = |live: &[bool], v: usize, dir| {
        g.neighbors_directed(node(v), dir)
            .find(|u| u.index() != v && live[u.index()])
    };
    let mut queue: Vec<usize> = (0..nv).filter(|&v| !gpu[v]).collect();
    while let Some(v) = queue.pop() {
        if !live[v] || gpu[v] {
            continue;
        }
        let (ins, outs) = (count[0][v], count[1][v]);
        let useful = ins >= 1
            && outs >= 1
            && (ins >= 2 || outs >= 2 || only(&live, v, Incoming) != only(&live, v, Outgoing));
        if useful {
            continue;
        }
        live[v] = false;
        for (dir, side) in [(Outgoing, 0), (Incoming, 1)] {
            for w in g.neighbors_directed(node(v), dir) {
                let w = w.index();
                if w != v {
                    count[side][w] -= 1;
                    if live[w] && !gpu[w] {
                        queue.push(w);
                    }
                }
            }
        }
    }
    live
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
///
/// `opts.time_limit_s` bounds the whole solve, building the model
/// included: when it runs out before HiGHS holds a feasible flow, the
/// status is [`SolveStatus::NoFlow`] (HiGHS gets only what is left of it).
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
    let started = Instant::now();
    let limit = opts.time_limit_s;
    let out_of_time = || started.elapsed().as_secs_f64() >= limit;
    // The limit ran out while building the model: no flow, as when HiGHS
    // stops holding none.
    let no_flow = |net: FlowNetwork, variables: usize, constraints: usize, phase: &str| {
        if opts.verbose {
            eprintln!(
                "lp: the time limit of {} s ran out while {phase} ({variables} variables, {constraints} constraints so far)",
                num(limit)
            );
        }
        Ok(Some(McfSolution {
            network: net,
            makespan_us: f64::INFINITY,
            flows: Vec::new(),
            status: SolveStatus::NoFlow,
            solve_s: started.elapsed().as_secs_f64(),
            variables,
            constraints,
        }))
    };
    let g = topo.graph();
    let links = g.edge_count();
    let net = FlowNetwork::new(topo, formulation);
    if out_of_time() {
        return no_flow(net, 0, 0, "building the flow network");
    }
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
    let mut variables = 1;
    for &s in &sources {
        if out_of_time() {
            return no_flow(net, variables, 0, "adding variables");
        }
        let src_v = net.gpu[s];
        f.push(
            net.arcs
                .iter()
                .map(|a| (a.to != src_v).then(|| vars.add(variable().min(0.0))))
                .collect(),
        );
        variables += f[f.len() - 1].iter().flatten().count();
    }

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
            if out_of_time() {
                return no_flow(net, variables, 0, "writing the objective");
            }
            for (a, v) in fk.iter().enumerate() {
                if let Some(v) = v {
                    obj += (w * arc_time[a]) * *v;
                }
            }
        }
    }
    let mut model = highs(vars.minimise(obj)).set_option("random_seed", 0);
    if formulation == Formulation::Rails {
        // Interior point, then crossover to a vertex (as simplex gives):
        // on 8 x 8 the Rails model took the dual simplex up to 30 s, this
        // 1.4-2.4 s; on 16 x 8, 7 s (docs/algorithms-lp.md). The other
        // formulations keep the simplex and their plans.
        model = model.set_option("solver", "ipm");
    }
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
        if out_of_time() {
            return no_flow(net, variables, constraints, "adding constraints");
        }
        for v in 0..net.vertices() {
            // A topology of a million NICs has a million vertices per
            // commodity: look at the clock inside the loop too.
            if v % 4096 == 4095 && out_of_time() {
                return no_flow(net, variables, constraints, "adding constraints");
            }
            let supply = supply_of(traffic, s, net.rank[v]) / unit_bytes;
            // A vertex no arc touches (pruned, or nothing there).
            if out_arcs[v].is_empty() && in_arcs[v].is_empty() && supply == 0.0 {
                continue;
            }
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
        if e % 1024 == 0 && out_of_time() {
            return no_flow(net, variables, constraints, "adding constraints");
        }
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

    // HiGHS gets what is left of the limit (its own copy of the model is
    // made inside `solve` and not counted).
    let left = limit - started.elapsed().as_secs_f64();
    if left <= 0.0 {
        return no_flow(net, variables, constraints, "adding constraints");
    }
    let model = model.set_time_limit(left);
    let solving = Instant::now();
    let solution = match model.solve() {
        Ok(sol) => sol,
        // HiGHS stopped (time limit) holding no primal-feasible point.
        Err(ResolutionError::Other("NoSolutionFound")) => {
            return Ok(Some(McfSolution {
                network: net,
                makespan_us: f64::INFINITY,
                flows: Vec::new(),
                status: SolveStatus::NoFlow,
                solve_s: solving.elapsed().as_secs_f64(),
                variables,
                constraints,
            }))
        }
        Err(other) => return Err(highs_failure(&other, variables, constraints)),
    };
    let solve_s = solving.elapsed().as_secs_f64();
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

/// What HiGHS's failure means, in words, with the model's size: good_lp
/// reports every failure as "An unexpected error occurred while running
/// the optimizer: SolveError", which says neither what failed nor why.
pub(super) fn highs_failure(e: &ResolutionError, variables: usize, constraints: usize) -> Error {
    let what = match e {
        ResolutionError::Infeasible | ResolutionError::Unbounded => format!(
            "found the flow LP {} (a bug: the LP always has a solution)",
            if *e == ResolutionError::Infeasible {
                "infeasible"
            } else {
                "unbounded"
            }
        ),
        ResolutionError::Other(s) => {
            let why = match *s {
                "SolveError" | "PresolveError" | "PostsolveError" => {
                    "its solver failed (out of memory, or numerical trouble)"
                }
                "LoadError" | "ModelError" => "it could not load the model",
                _ => "it ended in an unknown state",
            };
            format!("{why} (HiGHS status {s})")
        }
        ResolutionError::Str(s) => s.clone(),
    };
    Error::Solver(format!(
        "HiGHS could not solve the flow LP of {variables} variables and {constraints} constraints: {what}"
    ))
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
