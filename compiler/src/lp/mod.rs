//! Linear programming on the topology graph: the concurrent multi-commodity
//! flow model (good_lp + HiGHS), the LP lower bound, and the decomposition of
//! a flow into GPU-to-GPU routes that the `lp` scheduler turns into a plan.
//!
//! Owns the LP and its reading; knows nothing of plans (the scheduler in
//! `sched::lp` does) or of time beyond the makespan the LP optimises.
//! The equations are written out, numbered, in docs/algorithms-lp.md.

mod bound;
mod mcf;
mod routes;
#[cfg(test)]
mod tests;

pub use bound::{lower_bound, lp_bound, min_latency};
pub use mcf::{
    model_variables, solve_mcf, Arc, CommodityFlow, FlowNetwork, Formulation, McfSolution,
    Objective, SolveStatus,
};
pub use routes::{decompose, Route};

/// Solver knobs.
#[derive(Clone, Debug, PartialEq)]
pub struct LpOptions {
    /// Wall-clock limit handed to HiGHS, seconds.
    pub time_limit_s: f64,
    /// Print the solver's log to the console.
    pub verbose: bool,
    /// The `lp` scheduler: most lanes (transfers running at once) per GPU,
    /// counted as the MSCCL lowering counts threadblocks. `None` (the
    /// default) sizes lanes for the plan alone; `Some` sizes them by the
    /// slack of their routes and coarsens them until every GPU is within
    /// the cap (docs/algorithms-lp.md, "MSCCL export").
    pub max_lanes_per_gpu: Option<u32>,
    /// The `lp` scheduler on a hierarchical topology: route every
    /// inter-node hop rail to rail ([`Formulation::Rails`]), so that a
    /// GPU's peers are its node's GPUs and its rail's GPUs on other nodes
    /// (for an MSCCL executor whose threadblocks cannot hold a peer per
    /// GPU of the cluster). `false` (the default): any route.
    pub rail_aligned: bool,
}

impl Default for LpOptions {
    fn default() -> Self {
        LpOptions {
            time_limit_s: 60.0,
            verbose: false,
            max_lanes_per_gpu: None,
            rail_aligned: false,
        }
    }
}
