//! `fast`: the skew-aware scheduler (docs/algorithms.md, `fast`).
//!
//! 1. `balance`: inside each node, spread what the node sends to each other
//!    node evenly over its GPUs and NICs through NVLink;
//! 2. `stages`: decompose the node matrix into few partial-permutation
//!    stages (coarsened Birkhoff–von Neumann), rail-aligned inside a stage;
//! 3. `mesh`: on a mesh fabric, part of the intra-node blocks on the
//!    busiest links go through a third GPU;
//! 4. `emit` and the files beside it emit the plan: balancing moves run
//!    under the previous stage's sends, forwards under the next, each GPU
//!    keeps a cost-derived number of stages in flight.
//!
//! The reusable `crate::planner::Planner` is the API, a thin facade over
//! the emitter; [`fast`] is the one-shot form the CLI uses. Nothing here
//! depends on the facade.

mod arith;
pub(crate) mod balance;
mod blocks;
mod chunks;
pub(crate) mod emit;
mod forwards;
mod intra;
mod lanes;
mod layout;
mod leaves;
pub(crate) mod mesh;
mod rank;
mod rank_state;
pub(crate) mod replay;
pub(crate) mod rotation;
mod sends;
mod sink;
mod slots;
pub(crate) mod stages;
mod tail;
#[cfg(test)]
mod tests;
mod window;

use crate::error::Result;
use crate::plan::Plan;
use crate::topology::Topology;
use crate::traffic::TrafficMatrix;
use emit::{Emitter, PlannerOptions};

/// Plans one all-to-all with `fast`'s default options (for the `ideal`
/// network: no per-message cost).
pub fn fast(topo: &Topology, traffic: &TrafficMatrix) -> Result<Plan> {
    fast_with(topo, traffic, PlannerOptions::default())
}

/// Plans one all-to-all with `fast` and `opts` (for example
/// [`PlannerOptions::for_network`]).
pub fn fast_with(topo: &Topology, traffic: &TrafficMatrix, opts: PlannerOptions) -> Result<Plan> {
    Emitter::new(topo, opts)?.plan(traffic)
}
