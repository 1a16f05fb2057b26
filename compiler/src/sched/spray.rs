//! `spray`: `fast`'s intra-node balancing, then every inter-node send at once
//! (no stages, no pipeline dependencies). The ablation that shows what the
//! permutation stages buy (docs/algorithms.md, `spray`).

use crate::error::Result;
use crate::plan::Plan;
use crate::sched::fast::emit::{Emitter, PlannerOptions};
use crate::topology::Topology;
use crate::traffic::TrafficMatrix;

/// Plans one all-to-all: balanced like `fast`, sent all at once.
pub fn spray(topo: &Topology, traffic: &TrafficMatrix) -> Result<Plan> {
    let opts = PlannerOptions {
        staged: false,
        ..PlannerOptions::default()
    };
    Emitter::new(topo, opts)?.plan(traffic)
}
