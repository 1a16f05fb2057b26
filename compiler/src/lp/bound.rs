//! The LP lower bound: the optimum of the concurrent multi-commodity flow on
//! the topology graph (eq. 1-3 of docs/algorithms-lp.md) plus the smallest
//! path latency. No schedule on this topology, whatever its routes, relays
//! or timing, finishes sooner in the fluid model.

use crate::bound::{cut_bound, LowerBound};
use crate::error::{Error, Result};
use crate::topology::Topology;
use crate::traffic::TrafficMatrix;

use super::mcf::{solve_mcf, Formulation, Objective, SolveStatus};
use super::LpOptions;

/// Optimum makespan of the concurrent MCF plus the smallest path latency
/// among the pairs that exchange bytes, in microseconds. 0 when no byte
/// leaves its rank. A solve cut short by the time limit is an
/// [`crate::Error::Solver`]: an unproven optimum is no bound.
pub fn lp_bound(topo: &Topology, traffic: &TrafficMatrix, opts: &LpOptions) -> Result<f64> {
    traffic.check_ranks(topo.ranks(), "traffic")?;
    let Some(sol) = solve_mcf(topo, traffic, opts, Formulation::Links, Objective::Makespan)? else {
        return Ok(0.0);
    };
    if sol.status != SolveStatus::Optimal {
        return Err(Error::Solver(format!(
            "LP bound not proven optimal within the time limit of {} s",
            opts.time_limit_s
        )));
    }
    Ok(sol.makespan_us + min_latency(topo, traffic))
}

/// The report's bound: the cut bound, and for a `links` topology (whose
/// cuts the cut bound does not know beyond each GPU) the LP bound too. In
/// the hierarchical form the LP adds a second of solving for a figure
/// that equals the cut bound's moving time, so it is left out there. A
/// solve that does not prove its optimum in time leaves the LP figure out
/// rather than failing the report; bad input is still an error.
pub fn lower_bound(
    topo: &Topology,
    traffic: &TrafficMatrix,
    opts: &LpOptions,
) -> Result<LowerBound> {
    let mut b = cut_bound(topo, traffic);
    if !topo.is_hierarchical() {
        b.lp_us = match lp_bound(topo, traffic, opts) {
            Ok(lp) => Some(lp),
            // Not proven optimal in time: report the cut bound alone.
            Err(Error::Solver(_)) => None,
            Err(e) => return Err(e),
        };
    }
    Ok(b)
}

/// Smallest latency of any route between a pair with traffic, microseconds.
/// In the hierarchical form a route's latency is its path's (relays only add
/// hops); a `links` graph may have a faster route than the fewest-hops path,
/// so there the latency-shortest route is searched.
pub fn min_latency(topo: &Topology, traffic: &TrafficMatrix) -> f64 {
    let n = traffic.ranks();
    let mut best = f64::INFINITY;
    for s in 0..n {
        let dests: Vec<usize> = (0..n)
            .filter(|&d| d != s && traffic.get(s, d) > 0)
            .collect();
        if dests.is_empty() {
            continue;
        }
        if topo.is_hierarchical() {
            for d in dests {
                best = best.min(topo.path_latency(s, d));
            }
        } else {
            let dist = petgraph::algo::dijkstra(topo.graph(), topo.gpu_vertex(s), None, |e| {
                e.weight().latency_us
            });
            for d in dests {
                if let Some(&l) = dist.get(&topo.gpu_vertex(d)) {
                    best = best.min(l);
                }
            }
        }
    }
    if best.is_finite() {
        best
    } else {
        0.0
    }
}
