//! Flow decomposition: one commodity's link flows become GPU-to-GPU routes.
//!
//! A route is the list of GPUs a share of block `(s, d)` visits: `[s, d]`
//! goes straight, `[s, j, d]` is relayed through `j`'s scratch. Switches,
//! NICs and leaves between two GPUs need no relay, so they vanish here.

use std::collections::BTreeMap;

use crate::traffic::TrafficMatrix;

use super::mcf::{CommodityFlow, FlowNetwork};

/// A share of one block along a sequence of GPUs.
#[derive(Clone, Debug, PartialEq)]
pub struct Route {
    /// GPUs visited, from the block's source to its destination.
    pub gpus: Vec<usize>,
    pub bytes: f64,
}

/// Decomposes the flow of commodity `flow.source` on `net` into routes,
/// grouped per destination: `result[d]` is the routes of block
/// `(source, d)`, merged when they visit the same GPUs, in a deterministic
/// order. Demand the flow does not explain (solver round-off) goes
/// straight, `[s, d]`.
pub fn decompose(
    net: &FlowNetwork,
    traffic: &TrafficMatrix,
    flow: &CommodityFlow,
) -> Vec<Vec<Route>> {
    let n = traffic.ranks();
    let s = flow.source;
    let mut rest = vec![0.0; net.arcs.len()];
    for &(a, x) in &flow.arcs {
        rest[a] = x;
    }
    let mut out_arcs = vec![Vec::new(); net.vertices()];
    for (i, a) in net.arcs.iter().enumerate() {
        out_arcs[a.from].push(i);
    }
    let mut demand: Vec<f64> = (0..n)
        .map(|d| {
            if d == s {
                0.0
            } else {
                traffic.get(s, d) as f64
            }
        })
        .collect();
    let total: f64 = demand.iter().sum();
    let tol = total * 1e-9;
    let rank_of = |v: usize| net.rank[v].filter(|&r| r < n);
    let source_v = net.gpu[s];
    let mut found: BTreeMap<(usize, Vec<usize>), f64> = BTreeMap::new();
    // Every pass ends a path (zeroing an arc or a demand) or cancels a cycle
    // (zeroing an arc), so passes are bounded by arcs + destinations.
    for _ in 0..(net.arcs.len() + n + 1) * 2 {
        if demand.iter().all(|&r| r <= tol) {
            break;
        }
        let mut stack = vec![source_v];
        let mut arcs: Vec<usize> = Vec::new();
        let end = loop {
            let v = *stack.last().expect("walk starts at the source");
            if let Some(r) = rank_of(v) {
                if r != s && demand[r] > tol {
                    break Some(r);
                }
            }
            // Follow the fullest outgoing arc (ties: lowest index).
            let next = out_arcs[v]
                .iter()
                .copied()
                .filter(|&a| rest[a] > tol)
                .max_by(|&a, &b| rest[a].total_cmp(&rest[b]).then(b.cmp(&a)));
            let Some(a) = next else { break None };
            let w = net.arcs[a].to;
            if let Some(pos) = stack.iter().position(|&x| x == w) {
                // A cycle: cancel it and walk again.
                let mut cycle: Vec<usize> = arcs[pos..].to_vec();
                cycle.push(a);
                let m = cycle.iter().map(|&c| rest[c]).fold(f64::INFINITY, f64::min);
                for c in cycle {
                    rest[c] -= m;
                }
                stack.truncate(pos + 1);
                arcs.truncate(pos);
                continue;
            }
            stack.push(w);
            arcs.push(a);
        };
        let Some(d) = end else { break };
        let amount = arcs.iter().map(|&a| rest[a]).fold(demand[d], f64::min);
        for &a in &arcs {
            rest[a] -= amount;
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
