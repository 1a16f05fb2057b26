//! The per-batch Planner: `fast` (and its ablation `spray`) as a reusable
//! object for training and inference loops that re-plan every batch.
//!
//! [`Planner::new`] derives everything that depends on the topology only
//! (lane weights, rates, latencies); [`Planner::plan_into`] turns one traffic
//! matrix into a [`Plan`], reusing every buffer of the previous call, the
//! plan's own vectors included, so a steady-state call allocates nothing but
//! the rare dependency lists longer than four.
//!
//! The plan has five kinds of transfers (docs/algorithms.md, `fast`):
//! - intra-node traffic, NVLink (or a local copy), each block after the
//!   early balancing moves on its NVLink ports (`sched/fast/intra.rs`);
//! - direct sends, when every node pair is balanced already (within
//!   `DIRECT_SLACK`, 2%): RDMA from each block's source GPU straight into its
//!   destination's output, still in permutation stages;
//! - balancing moves ("pieces"): NVLink from a GPU with more than its share of
//!   what its node sends to one node, into the scratch of a GPU with less;
//! - inter-node sends, one or two per (GPU, stage): rail-aligned RDMA from GPU
//!   `l` of node A to GPU `l` of node B, into B's scratch;
//! - forwards: NVLink (or local) copies from that scratch to the final outputs.
//!
//! A thin facade: the emitter that writes the plan (`sched/fast/emit.rs`)
//! and [`PlannerOptions`] live in `sched/fast/`, which knows nothing of
//! this module.

use crate::error::Result;
use crate::plan::Plan;
use crate::sched::auto::{choose, AutoChoice};
use crate::sched::fast::emit::Emitter;
pub use crate::sched::fast::emit::PlannerOptions;
pub use crate::sched::fast::stages::{check_partial_permutation, StagePair};
use crate::sched::{schedule, Algorithm, Options};
use crate::sim::Network;
use crate::topology::Topology;
use crate::traffic::TrafficMatrix;

/// Reusable planner for one topology: build it once per cluster, then call
/// [`Planner::plan_into`] once per batch with that batch's traffic matrix.
///
/// Plans are not verified here (the verifier costs more than planning):
/// check them with [`crate::verify_on`] in tests; the runtime's backends run
/// the verifier themselves before moving a byte.
///
/// ```
/// use switchyard_compiler::generate::{generate, Pattern, TrafficSpec};
/// use switchyard_compiler::planner::{Planner, PlannerOptions};
/// use switchyard_compiler::{verify_on, Plan, Topology};
///
/// let topo = Topology::preset("dgx-h100", 2, None)?; // 2 nodes x 8 GPUs
/// let mut planner = Planner::new(&topo, PlannerOptions::default())?; // once per cluster
/// let mut plan = Plan::new("", 0, 0);
/// for seed in 0..3 {
///     // One batch's expert routing: MoE traffic with Zipf(1.0) popularity.
///     let mut spec = TrafficSpec::new(topo.ranks(), Pattern::Zipf(1.0));
///     spec.seed = seed;
///     spec.moe.tokens_per_rank = 256;
///     let traffic = generate(&spec)?;
///     planner.plan_into(&traffic, &mut plan)?; // once per batch, reusing `plan`
///     assert_eq!(plan.algorithm, "fast");
///     verify_on(&plan, &traffic, &topo)?;
/// }
/// # Ok::<(), switchyard_compiler::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct Planner {
    emitter: Emitter,
    /// Set by [`Planner::auto`]: the topology and network mode `auto` picks for.
    auto: Option<(Box<Topology>, Network)>,
    last_choice: Option<AutoChoice>,
}

impl Planner {
    /// Precomputes what depends on the topology. Errors
    /// ([`Error::Unsupported`](crate::Error::Unsupported)) for a `links`
    /// topology (the planner needs nodes, rails and an intra-node fabric:
    /// use `lp` there) and for a `stages_per_node` that is not a positive
    /// number.
    pub fn new(topo: &Topology, opts: PlannerOptions) -> Result<Planner> {
        Emitter::new(topo, opts).map(|emitter| Planner {
            emitter,
            auto: None,
            last_choice: None,
        })
    }

    /// A planner that runs `auto` every batch (the default algorithm of the
    /// CLI and of the Python `Planner`): the candidate the cost model's
    /// estimates pick for `network`, `fast` with `opts` (through this
    /// planner's reused buffers) when it is the one. The others build a
    /// fresh plan. [`Planner::last_choice`] says what it chose and why.
    pub fn auto(topo: &Topology, opts: PlannerOptions, network: Network) -> Result<Planner> {
        let opts = PlannerOptions {
            staged: true,
            ..opts
        };
        let mut p = Planner::new(topo, opts)?;
        p.auto = Some((Box::new(topo.clone()), network));
        Ok(p)
    }

    /// What `auto` chose for the last plan (`None` for a `fast` or `spray` planner).
    pub fn last_choice(&self) -> Option<&AutoChoice> {
        self.last_choice.as_ref()
    }

    pub fn options(&self) -> &PlannerOptions {
        self.emitter.options()
    }

    /// Plans one all-to-all (allocates a fresh plan; see [`Planner::plan_into`]).
    pub fn plan(&mut self, traffic: &TrafficMatrix) -> Result<Plan> {
        let mut plan = Plan::new("", 0, 0);
        self.plan_into(traffic, &mut plan)?;
        Ok(plan)
    }

    /// Plans one all-to-all into `out`, reusing its allocations (and this
    /// planner's): in steady state a call allocates almost nothing. Whatever
    /// `out` held is replaced. Errors ([`Error::Input`](crate::Error::Input))
    /// when `traffic` does not have the topology's number of ranks.
    pub fn plan_into(&mut self, traffic: &TrafficMatrix, out: &mut Plan) -> Result<()> {
        let Some((topo, network)) = &self.auto else {
            return self.emitter.plan_into(traffic, out);
        };
        traffic.check_ranks(topo.ranks(), "traffic")?;
        let choice = choose(topo, traffic, *network);
        let alg = choice.algorithm();
        if alg == Algorithm::Fast {
            self.emitter.plan_into(traffic, out)?;
        } else {
            *out = schedule(alg, topo, traffic, &Options::default())?;
        }
        self.last_choice = Some(choice);
        Ok(())
    }

    /// True when the last plan was latency-bound, and so sent as one merged
    /// stage of direct sends.
    pub fn latency_bound(&self) -> bool {
        self.emitter.latency_bound()
    }

    /// True when the last plan was one merged stage of direct sends (its
    /// stage is then not a permutation): the exchange was latency-bound
    /// ([`Planner::latency_bound`]), or every node sends through a single NIC
    /// and has at most four peers (`fast` only). Then there is
    /// nothing to balance (a node's GPUs share its one NIC whichever of them
    /// holds the bytes), and sent all at once no receiving NIC hears from more
    /// than four sending NICs, the incast threshold the depth is built on:
    /// stages would only add their latencies and drift. Measured with
    /// `examples/fast_shapes.rs` (2026-12-01, seed 3, 1 MiB per pair): 4x8
    /// with one NIC per node 1.012-1.049 of the bound staged, 1.000 merged
    /// in both network modes; 4x1 1.002-1.027 staged, 1.000 merged.
    pub fn merged(&self) -> bool {
        self.emitter.merged()
    }

    /// The stages of the last plan: node pairs with their bytes, in stage order.
    pub fn stages(&self) -> &[StagePair] {
        self.emitter.stages()
    }

    /// Number of stages of the last plan.
    pub fn stage_count(&self) -> u32 {
        self.emitter.stage_count()
    }

    /// Chunk size the last plan used (bytes); `u64::MAX` for a merged plan
    /// ([`Planner::merged`]), whose blocks go whole.
    pub fn chunk_bytes(&self) -> u64 {
        self.emitter.chunk_bytes()
    }

    /// Pipeline depth the last plan used (inter-node sends in flight per GPU,
    /// see [`PlannerOptions::pipeline_depth`]; `u32::MAX` for `spray`, whose
    /// sends do not wait for one another, and for a merged plan
    /// ([`Planner::merged`]), whose sends all start at once).
    pub fn pipeline_depth(&self) -> u32 {
        self.emitter.pipeline_depth()
    }
}
