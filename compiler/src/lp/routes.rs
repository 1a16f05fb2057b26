//! Flow decomposition: one commodity's link flows become GPU-to-GPU routes.
//!
//! A route is the list of GPUs a share of block `(s, d)` visits: `[s, d]`
//! goes straight, `[s, j, d]` is relayed through `j`'s scratch. Switches,
//! NICs and leaves between two GPUs need no relay, so they vanish here.

use std::collections::BTreeMap;

use petgraph::graph::EdgeIndex;
use petgraph::visit::EdgeRef;

use crate::topology::{Topology, Vertex};
use crate::traffic::TrafficMatrix;

use super::mcf::CommodityFlow;

/// A share of one block along a sequence of GPUs.
#[derive(Clone, Debug, PartialEq)]
pub struct Route {
    /// GPUs visited, from the block's source to its destination.
    pub gpus: Vec<usize>,
    pub bytes: f64,
}

/// Decomposes the flow of commodity `flow.source` into routes, grouped per
/// destination: `result[d]` is the routes of block `(source, d)`, merged when
/// they visit the same GPUs, in a deterministic order. Demand the flow does
/// not explain (solver round-off) goes straight, `[s, d]`.
pub fn decompose(topo: &Topology, traffic: &TrafficMatrix, flow: &CommodityFlow) -> Vec<Vec<Route>> {
    let g = topo.graph();
    let n = traffic.ranks();
    let s = flow.source;
    let mut rest = vec![0.0; g.edge_count()];
    for &(e, x) in &flow.links {
        rest[e as usize] = x;
    }
    let mut demand: Vec<f64> = (0..n)
        .map(|d| if d == s { 0.0 } else { traffic.get(s, d) as f64 })
        .collect();
    let total: f64 = demand.iter().sum();
    let tol = total * 1e-9;
    let rank_of = |v: petgraph::graph::NodeIndex| match &g[v] {
        Vertex::Gpu(r) if *r < n => Some(*r),
        _ => None,
    };
    let source_v = topo.gpu_vertex(s);
    let mut found: BTreeMap<(usize, Vec<usize>), f64> = BTreeMap::new();
    // Every pass ends a path (zeroing a link or a demand) or cancels a cycle
    // (zeroing a link), so passes are bounded by links + destinations.
    for _ in 0..(g.edge_count() + n + 1) * 2 {
        if demand.iter().all(|&r| r <= tol) {
            break;
        }
        let mut stack = vec![source_v];
        let mut edges: Vec<EdgeIndex> = Vec::new();
        let end = loop {
            let v = *stack.last().expect("walk starts at the source");
            if let Some(r) = rank_of(v) {
                if r != s && demand[r] > tol {
                    break Some(r);
                }
            }
            // Follow the fullest outgoing link (ties: lowest id).
            let next = g
                .edges(v)
                .filter(|e| rest[e.id().index()] > tol)
                .max_by(|a, b| {
                    rest[a.id().index()]
                        .total_cmp(&rest[b.id().index()])
                        .then(b.id().cmp(&a.id()))
                });
            let Some(e) = next else { break None };
            let w = e.target();
            if let Some(pos) = stack.iter().position(|&x| x == w) {
                // A cycle: cancel it and walk again.
                let mut cycle: Vec<EdgeIndex> = edges[pos..].to_vec();
                cycle.push(e.id());
                let m = cycle
                    .iter()
                    .map(|c| rest[c.index()])
                    .fold(f64::INFINITY, f64::min);
                for c in cycle {
                    rest[c.index()] -= m;
                }
                stack.truncate(pos + 1);
                edges.truncate(pos);
                continue;
            }
            stack.push(w);
            edges.push(e.id());
        };
        let Some(d) = end else { break };
        let amount = edges
            .iter()
            .map(|e| rest[e.index()])
            .fold(demand[d], f64::min);
        for e in &edges {
            rest[e.index()] -= amount;
        }
        demand[d] -= amount;
        let gpus: Vec<usize> = stack.iter().filter_map(|&v| rank_of(v)).collect();
        *found.entry((d, gpus)).or_insert(0.0) += amount;
    }
    for (d, &r) in demand.iter().enumerate() {
        if r > tol {
            *found.entry((d, vec![s, d])).or_insert(0.0) += r;
        }
    }
    let mut per_dst = vec![Vec::new(); n];
    for ((d, gpus), bytes) in found {
        per_dst[d].push(Route { gpus, bytes });
    }
    per_dst
}
