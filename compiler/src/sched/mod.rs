//! Schedulers: each turns (topology, traffic) into a [`Plan`] and nothing else.
//!
//! Every scheduler is a pure function of its inputs (deterministic), returns a
//! plan the verifier accepts, and knows nothing of time, XML or runtimes: it
//! may consult the topology's bandwidths and latencies to make choices.

pub mod auto;
mod deepep;
mod direct;
pub mod fast;
mod hierarchical;
mod lp;
mod pairwise;
mod pxn;
mod spray;

use std::fmt;
use std::str::FromStr;

use crate::error::{InputError, Result};
use crate::plan::Plan;
use crate::sim::Network;
use crate::topology::Topology;
use crate::traffic::TrafficMatrix;

pub use auto::{auto, AutoChoice};
pub use deepep::{deepep, deepep_peer};
pub(crate) use deepep::{deepep_into, deepep_local};
pub use direct::{block_transfer, direct, path_between};
pub use fast::fast;
pub use hierarchical::hierarchical;
pub use lp::{lp, lp_with_report, LpReport};
pub use pairwise::{pairwise, pairwise_held, pairwise_msccl};
pub use pxn::{pxn, pxn_relay};
pub(crate) use pxn::{pxn_into, pxn_local};
pub use spray::spray;

/// The algorithms the CLI knows (DESIGN.md "Algorithms").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algorithm {
    Direct,
    Pairwise,
    Hierarchical,
    Fast,
    Spray,
    Lp,
    /// NCCL with PXN: relay over NVLink to the destination's rail.
    Pxn,
    /// DeepEP normal-mode dispatch: rail-aligned write, NVLink forward.
    Deepep,
    /// The best of the others for this matrix, by the cost model's estimates.
    Auto,
}

impl Algorithm {
    /// Every algorithm, in the order reports list them.
    pub const ALL: &'static [Algorithm] = &[
        Algorithm::Direct,
        Algorithm::Pairwise,
        Algorithm::Hierarchical,
        Algorithm::Fast,
        Algorithm::Spray,
        Algorithm::Lp,
        Algorithm::Pxn,
        Algorithm::Deepep,
        Algorithm::Auto,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Direct => "direct",
            Algorithm::Pairwise => "pairwise",
            Algorithm::Hierarchical => "hierarchical",
            Algorithm::Fast => "fast",
            Algorithm::Spray => "spray",
            Algorithm::Lp => "lp",
            Algorithm::Pxn => "pxn",
            Algorithm::Deepep => "deepep",
            Algorithm::Auto => "auto",
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Algorithm {
    type Err = InputError;
    fn from_str(s: &str) -> std::result::Result<Self, InputError> {
        Algorithm::ALL
            .iter()
            .copied()
            .find(|a| a.name() == s)
            .ok_or_else(|| {
                let known: Vec<&str> = Algorithm::ALL.iter().map(|a| a.name()).collect();
                InputError::new(
                    "--algorithm",
                    format!("unknown algorithm `{s}` (known: {})", known.join(", ")),
                )
            })
    }
}

/// Where a plan goes, so that a scheduler asks only for what will hold there.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Target {
    /// Switchyard's runtime or simulator: every dependency of the plan holds.
    #[default]
    Runtime,
    /// An MSCCL executor's XML (`compile --out plan.xml`): a send's wait holds
    /// only on its own GPU's steps and a send is done once staged
    /// (docs/msccl.md). `pairwise` then plans [`pairwise_msccl`]; the other
    /// schedulers' plans fit the lowering already and are the same.
    Msccl,
}

/// Knobs shared by the schedulers; each uses what concerns it.
#[derive(Clone, Debug)]
pub struct Options {
    /// `lp`: the solver's wall-clock limit, seconds.
    pub time_limit_s: f64,
    /// `lp`: print the solver's log.
    pub verbose: bool,
    /// `lp`: run at most this many lanes at once on any GPU, counted as the
    /// MSCCL lowering counts threadblocks (per GPU, one per connection,
    /// direction and lane). `None` (the default): no cap, the best plan for
    /// the simulator. [`Options::for_msccl`] sets it to the executor's
    /// lanes ([`crate::msccl::PLAN_LANES_PER_GPU`] for NCCL-MSCCL), so the
    /// file runs every lane the plan runs at once; it costs the plan itself
    /// a little (docs/algorithms-lp.md). The other schedulers fit the
    /// lowering already and ignore it.
    pub max_lanes_per_gpu: Option<u32>,
    /// `lp`: route every inter-node hop rail to rail
    /// ([`crate::lp::LpOptions::rail_aligned`]), so a GPU's peers are its
    /// node's GPUs and its rail's elsewhere: what `compile` asks for an
    /// MSCCL file where the executor's threadblocks cannot hold a peer per
    /// GPU ([`crate::msccl::fit::lp_rail_aligned`]). `false` by default.
    pub lp_rail_aligned: bool,
    /// Where the plan goes ([`Target::Msccl`]: `pairwise` asks only for the
    /// waits an MSCCL executor holds, [`pairwise_msccl`]).
    pub target: Target,
    /// `auto`: the network mode whose completion it minimises.
    pub network: Network,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            time_limit_s: 60.0,
            verbose: false,
            max_lanes_per_gpu: None,
            lp_rail_aligned: false,
            target: Target::Runtime,
            network: Network::Ideal,
        }
    }
}

impl Options {
    /// The options of a plan for MSCCL XML, as `compile --out plan.xml`
    /// schedules: [`Target::Msccl`], and `lp` running at most
    /// `lanes_per_gpu` lanes at once on a GPU (the executor's
    /// `plan_lanes_per_gpu`).
    pub fn for_msccl(lanes_per_gpu: u32) -> Options {
        Options {
            max_lanes_per_gpu: Some(lanes_per_gpu),
            target: Target::Msccl,
            ..Options::default()
        }
    }

    /// Whether [`schedule`]'s plan of `alg` with these options depends on
    /// their `network` (what it reads of it: `fast`'s chunks and stages
    /// for its per-message cost, `auto`'s choice, `pairwise`'s waits for
    /// MSCCL). Where it does not, one plan serves every mode.
    pub fn reads_network(&self, alg: Algorithm) -> bool {
        match alg {
            Algorithm::Fast | Algorithm::Auto => true,
            Algorithm::Pairwise => self.target == Target::Msccl,
            _ => false,
        }
    }
}

/// Runs one scheduler: the plan of `alg` for `traffic` on `topo`.
///
/// Errors when the traffic does not have the topology's ranks
/// ([`crate::Error::Input`]), when the algorithm cannot handle the topology
/// (`fast` and `spray` on a `links` graph: [`crate::Error::Unsupported`]), or
/// when the `lp` solver fails ([`crate::Error::Solver`]). For re-planning
/// `fast` every batch, keep a [`crate::planner::Planner`] instead: it reuses
/// its buffers.
///
/// ```
/// use switchyard_compiler::sched::{schedule, Options};
/// use switchyard_compiler::{verify_on, Algorithm, Topology, TrafficMatrix};
///
/// let topo = Topology::preset("dgx-h100", 2, None)?;
/// let traffic = TrafficMatrix::uniform(topo.ranks(), 1 << 20); // 1 MiB per pair
/// let plan = schedule(Algorithm::Hierarchical, &topo, &traffic, &Options::default())?;
/// assert_eq!(plan.algorithm, "hierarchical");
/// assert_eq!(plan.steps(), 2); // NVLink gather, then rail-aligned RDMA
/// verify_on(&plan, &traffic, &topo)?;
/// # Ok::<(), switchyard_compiler::Error>(())
/// ```
pub fn schedule(
    alg: Algorithm,
    topo: &Topology,
    traffic: &TrafficMatrix,
    opts: &Options,
) -> Result<Plan> {
    traffic.check_ranks(topo.ranks(), "traffic")?;
    let mut plan = match alg {
        Algorithm::Direct => Ok(direct(topo, traffic)),
        // A plan for MSCCL XML waits only where an executor can hold it.
        Algorithm::Pairwise if opts.target == Target::Msccl => {
            pairwise_msccl(topo, traffic, opts.network, opts.max_lanes_per_gpu)
        }
        Algorithm::Pairwise => Ok(pairwise(topo, traffic)),
        Algorithm::Hierarchical => Ok(hierarchical(topo, traffic)),
        // Chunked for the network the plan is for (its per-message cost).
        Algorithm::Fast => fast::fast_with(
            topo,
            traffic,
            crate::sched::fast::emit::PlannerOptions::for_network(opts.network),
        ),
        Algorithm::Spray => spray(topo, traffic),
        Algorithm::Pxn => Ok(pxn(topo, traffic)),
        Algorithm::Deepep => Ok(deepep(topo, traffic)),
        Algorithm::Auto => auto(topo, traffic, opts.network).map(|(plan, _)| plan),
        Algorithm::Lp => lp(
            topo,
            traffic,
            &crate::lp::LpOptions {
                time_limit_s: opts.time_limit_s,
                verbose: opts.verbose,
                max_lanes_per_gpu: opts.max_lanes_per_gpu,
                rail_aligned: opts.lp_rail_aligned,
            },
        ),
    }?;
    plan.traffic_fingerprint = Some(traffic.fingerprint());
    Ok(plan)
}

/// The relay schedulers' unit-test case: 3 nodes of 4 GPUs, MoE traffic
/// with Zipf(1.0) popularity (64 tokens per rank).
/// [`Options::reads_network`] holds wherever the plans differ: every
/// other algorithm's plan is the same for `ideal` and `calibrated`.
#[test]
fn plans_that_do_not_read_the_network_are_the_same_in_every_mode() {
    let (topo, m) = moe_3x4();
    for target in [Target::Runtime, Target::Msccl] {
        for &alg in Algorithm::ALL {
            let at = |network| Options {
                network,
                target,
                ..Options::default()
            };
            let (ideal, calibrated) = (at(Network::Ideal), at(Network::Calibrated));
            if ideal.reads_network(alg) {
                continue;
            }
            let plan = |o: &Options| schedule(alg, &topo, &m, o).unwrap();
            assert_eq!(plan(&ideal), plan(&calibrated), "{alg} {target:?}");
        }
    }
}

#[cfg(test)]
pub(crate) fn moe_3x4() -> (Topology, TrafficMatrix) {
    use crate::generate::{generate, Pattern, TrafficSpec};
    let topo = Topology::preset("dgx-h100", 3, Some(4)).unwrap();
    let mut spec = TrafficSpec::new(12, Pattern::Zipf(1.0));
    spec.moe.tokens_per_rank = 64;
    (topo, generate(&spec).unwrap())
}
