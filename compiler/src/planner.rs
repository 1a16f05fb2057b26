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
//! [`Planner::for_algorithm`] also plans `direct` and `hierarchical` (their
//! one-shot schedulers, no buffers reused) and `pxn` and `deepep` (into the
//! plan's own vectors), so that [`Planner::program`], one rank's own
//! program (module [`crate::rank`]), has one entry for the six algorithms
//! that have rank programs.
//!
//! A thin facade: the emitter that writes the plan (`sched/fast/emit.rs`)
//! and [`PlannerOptions`] live in `sched/fast/`, which knows nothing of
//! this module.

use crate::error::{Error, InputError, Result};
use crate::plan::Plan;
use crate::rank::{self, LocalProgram, LocalTraffic};
use crate::sched::auto::{choose, settle_and_build, AutoChoice, Sticky, StickyRule};
use crate::sched::fast::emit::Emitter;
pub use crate::sched::fast::emit::PlannerOptions;
pub use crate::sched::fast::stages::{check_partial_permutation, StagePair};
use crate::sched::{
    deepep_into, deepep_local, direct, hierarchical, path_between, pxn_into, pxn_local, schedule,
    Algorithm, Options,
};
use crate::sim::Network;
use crate::topology::{IntraKind, Topology};
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
/// let mut planner = Planner::new(&topo, PlannerOptions::default())?; // once per cluster: `auto`
/// let mut plan = Plan::new("", 0, 0);
/// for seed in 0..3 {
///     // One batch's expert routing: MoE traffic with Zipf(1.0) popularity.
///     let mut spec = TrafficSpec::new(topo.ranks(), Pattern::Zipf(1.0));
///     spec.seed = seed;
///     spec.moe.tokens_per_rank = 256;
///     let traffic = generate(&spec)?;
///     planner.plan_into(&traffic, &mut plan)?; // once per batch, reusing `plan`
///     // `auto` planned with the scheduler it chose, and says which.
///     assert_eq!(Some(plan.algorithm.as_str()), planner.last_choice().map(|c| c.chosen.as_str()));
///     verify_on(&plan, &traffic, &topo)?;
/// }
/// # Ok::<(), switchyard_compiler::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct Planner {
    /// `fast` and `spray` only.
    emitter: Option<Emitter>,
    opts: PlannerOptions,
    /// The algorithm it plans ([`Planner::for_algorithm`]).
    algorithm: Algorithm,
    topo: Topology,
    /// The whole plan a rank's program is sliced from where the algorithm
    /// has no per-rank planner for this plan (`auto`; `fast` on a mesh or
    /// with every pair direct).
    whole: Plan,
    /// Set by [`Planner::auto`]: the network mode `auto` picks for.
    auto: Option<Network>,
    /// `auto` only: the `spray` emitter its own programs use when it
    /// chooses `spray` (the default options, as `sched::spray`), made on
    /// first use.
    spray: Option<Box<Emitter>>,
    /// `auto` only: how close calls are settled ([`Settle`]).
    settle: Settle,
    /// `auto` with [`Settle::Sticky`]: the last settle, kept while it holds.
    sticky: Sticky,
    last_choice: Option<AutoChoice>,
    /// Whether [`Planner::plan_rank_into`]'s last program was sliced from
    /// the whole plan ([`Planner::rank_sliced`]).
    rank_sliced: bool,
}

/// How a per-batch `auto` planner settles close calls, the candidates its
/// estimates cannot separate (docs/algorithms.md, `auto`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum Settle {
    /// The default (the per-batch time budget): the estimates alone, never a simulation: the choice
    /// costs well under a millisecond at 64 GPUs. On the acceptance sweep
    /// (672 case-modes, 2-16 nodes) it picks within 1% of the best
    /// candidate in 651 (worst 1.041x: since `spray` pipelines its relays
    /// it is often within a few percent of `fast`, closer than the two
    /// estimates' errors); on a held-out seed in 196 of 210 (worst
    /// 1.067x) (docs/algorithms.md, `auto`, "Limits").
    #[default]
    Never,
    /// Every close call: the contenders' plans built and simulated on every
    /// call that has one, as `compile` does (tens to hundreds of
    /// milliseconds at 64 GPUs).
    Always,
    /// Settle a close call once, then keep its winner, without
    /// simulating, while the estimates of later matrices say it still holds
    /// ([`StickyRule`]); settle again when they do not. Far closer to the
    /// best than the estimates alone, but on matrices that drift batch to
    /// batch 1-19% of calls still settle, which at 64 GPUs averages tens
    /// to hundreds of milliseconds per call (docs/benchmarks.md, "`auto`
    /// per batch"): not the default.
    Sticky(StickyRule),
}

impl Planner {
    /// The default planner: `auto` for the ideal network
    /// ([`Planner::auto`], by its estimates alone unless
    /// [`Planner::with_settle`]), `fast` with `opts` when `auto` picks it.
    /// Precomputes what depends on the topology. Errors
    /// ([`Error::Unsupported`]) for a `links`
    /// topology (the planner needs nodes, rails and an intra-node fabric:
    /// use `lp` there) and for a `stages_per_node` that is not a positive
    /// number.
    pub fn new(topo: &Topology, opts: PlannerOptions) -> Result<Planner> {
        Planner::auto(topo, opts, Network::Ideal)
    }

    /// A `fast` planner with `opts` (`spray`, its unstaged ablation, when
    /// `opts.staged` is false). Errors as [`Planner::new`] does.
    pub fn fast(topo: &Topology, opts: PlannerOptions) -> Result<Planner> {
        let algorithm = if opts.staged {
            Algorithm::Fast
        } else {
            Algorithm::Spray
        };
        Emitter::new(topo, opts.clone())
            .map(|emitter| Planner::bare(topo, algorithm, opts, Some(emitter)))
    }

    /// A planner of `algorithm` with nothing planned yet and no `auto`
    /// state: `emitter` is `fast`'s (none for the baselines).
    fn bare(
        topo: &Topology,
        algorithm: Algorithm,
        opts: PlannerOptions,
        emitter: Option<Emitter>,
    ) -> Planner {
        Planner {
            emitter,
            opts,
            algorithm,
            topo: topo.clone(),
            whole: Plan::new("", 0, 0),
            auto: None,
            spray: None,
            settle: Settle::default(),
            sticky: Sticky::default(),
            last_choice: None,
            rank_sliced: false,
        }
    }

    /// A planner for `alg`: `fast` and `spray` with `opts` (its `staged` is
    /// set by the algorithm), `auto` for the ideal network
    /// ([`Planner::auto`]), `direct`, `hierarchical`, `pxn` and `deepep`
    /// (on any topology; they ignore `opts`). Errors
    /// ([`Error::Unsupported`]) for the other algorithms (`pairwise`,
    /// `lp`), and as [`Planner::new`] does.
    pub fn for_algorithm(topo: &Topology, alg: Algorithm, opts: PlannerOptions) -> Result<Planner> {
        match alg {
            Algorithm::Auto => Planner::auto(topo, opts, Network::Ideal),
            Algorithm::Fast | Algorithm::Spray => Planner::fast(
                topo,
                PlannerOptions {
                    staged: alg == Algorithm::Fast,
                    ..opts
                },
            ),
            Algorithm::Direct | Algorithm::Hierarchical | Algorithm::Pxn | Algorithm::Deepep => {
                Ok(Planner::bare(topo, alg, opts, None))
            }
            _ => Err(Error::Unsupported {
                algorithm: alg.name().into(),
                reason: "has no per-batch planner (use sched::schedule)".into(),
            }),
        }
    }

    /// A planner that runs `auto` every batch (the default algorithm of the
    /// CLI and of the Python `Planner`): the candidate the cost model's
    /// estimates pick for `network`, `fast` with `opts` (through this
    /// planner's reused buffers) when it is the one. The others build a
    /// fresh plan. [`Planner::last_choice`] says what it chose and why.
    /// By default it goes by the estimates alone ([`Settle::Never`]: the
    /// per-batch time budget); [`Planner::with_settle`] settles close calls
    /// by simulation as [`crate::sched::auto()`] does, every time
    /// ([`Settle::Always`]) or once and kept while later matrices'
    /// estimates say the winner holds ([`Settle::Sticky`]).
    pub fn auto(topo: &Topology, opts: PlannerOptions, network: Network) -> Result<Planner> {
        let opts = PlannerOptions {
            staged: true,
            ..opts
        };
        let mut p = Planner::fast(topo, opts)?;
        p.algorithm = Algorithm::Auto;
        p.auto = Some(network);
        Ok(p)
    }

    /// How this `auto` planner settles close calls ([`Settle`]; the
    /// default is [`Settle::Never`]); forgets any settle it remembered.
    /// No effect on other planners.
    pub fn with_settle(mut self, settle: Settle) -> Planner {
        self.settle = settle;
        self.sticky = match settle {
            Settle::Sticky(rule) => Sticky::new(rule),
            _ => Sticky::default(),
        };
        self
    }

    /// [`Settle::Always`] (`on`) or [`Settle::Never`].
    pub fn settling(self, on: bool) -> Planner {
        self.with_settle(if on { Settle::Always } else { Settle::Never })
    }

    /// An `auto` planner's memory of its last settle ([`Settle::Sticky`]):
    /// why the last call settled again, if it did
    /// ([`Sticky::last_resettle`]).
    pub fn sticky(&self) -> &Sticky {
        &self.sticky
    }

    /// What `auto` chose for the last plan (`None` for any other planner).
    pub fn last_choice(&self) -> Option<&AutoChoice> {
        self.last_choice.as_ref()
    }

    /// Whether the last [`Planner::program`] (or
    /// [`Planner::plan_rank_into`]) planned the whole plan and sliced the
    /// rank's program from it (an algorithm without a per-rank planner
    /// for this plan, an `auto` close call settled by simulating whole
    /// plans), rather than planning the rank's program from its own
    /// traffic (`auto`: after its choice by the estimates).
    pub fn rank_sliced(&self) -> bool {
        self.rank_sliced
    }

    /// The algorithm this planner plans (`auto` for [`Planner::auto`]).
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    pub fn options(&self) -> &PlannerOptions {
        self.opts_of()
    }

    fn opts_of(&self) -> &PlannerOptions {
        self.emitter.as_ref().map_or(&self.opts, Emitter::options)
    }

    /// Plans one all-to-all (allocates a fresh plan; see [`Planner::plan_into`]).
    pub fn plan(&mut self, traffic: &TrafficMatrix) -> Result<Plan> {
        let mut plan = Plan::new("", 0, 0);
        self.plan_into(traffic, &mut plan)?;
        Ok(plan)
    }

    /// Plans one all-to-all into `out`, reusing its allocations (and this
    /// planner's): in steady state a call allocates almost nothing. Whatever
    /// `out` held is replaced. Errors ([`Error::Input`])
    /// when `traffic` does not have the topology's number of ranks.
    pub fn plan_into(&mut self, traffic: &TrafficMatrix, out: &mut Plan) -> Result<()> {
        if let Some(network) = self.auto {
            traffic.check_ranks(self.topo.ranks(), "traffic")?;
            let mut choice = choose(&self.topo, traffic, network);
            let tie = choice.contenders().len() >= 2;
            let settle = match self.settle {
                Settle::Never => false,
                Settle::Always => tie,
                Settle::Sticky(_) => tie && self.sticky.keep(&mut choice).is_none(),
            };
            let (topo, emitter) = (&self.topo, &mut self.emitter);
            if !settle {
                // The estimates decide: plan the winner into `out`'s buffers.
                match (emitter, choice.algorithm()) {
                    (Some(emitter), Algorithm::Fast) => emitter.plan_into(traffic, out)?,
                    (_, alg) => *out = schedule(alg, topo, traffic, &Options::default())?,
                }
            } else {
                *out = settle_and_build(topo, network, &mut choice, |alg| {
                    match (&mut *emitter, alg) {
                        (Some(emitter), Algorithm::Fast) => emitter.plan(traffic),
                        _ => schedule(alg, topo, traffic, &Options::default()),
                    }
                })?;
                if matches!(self.settle, Settle::Sticky(_)) {
                    self.sticky.remember(&choice);
                }
            }
            self.last_choice = Some(choice);
            return Ok(());
        }
        match &mut self.emitter {
            Some(emitter) => emitter.plan_into(traffic, out),
            None => {
                traffic.check_ranks(self.topo.ranks(), "traffic")?;
                match self.algorithm {
                    Algorithm::Direct => *out = direct(&self.topo, traffic),
                    Algorithm::Pxn => pxn_into(&self.topo, traffic, out),
                    Algorithm::Deepep => deepep_into(&self.topo, traffic, out),
                    _ => *out = hierarchical(&self.topo, traffic),
                }
                Ok(())
            }
        }
    }

    /// Rank `rank`'s own program for one all-to-all: exactly its part of
    /// [`Planner::plan_into`]'s plan (module [`crate::rank`] says what
    /// "exactly" means and how the parts stitch back together).
    ///
    /// It is [`LocalTraffic::from_matrix`] then [`Planner::program_local`]
    /// wherever the algorithm plans one rank alone (`direct`,
    /// `hierarchical`, `pxn`, `deepep`, `fast` and `spray`), which shows the
    /// program depends on nothing else. `auto` makes its choice from the
    /// matrix's estimates, as [`Planner::plan_into`] does, then plans the
    /// chosen algorithm's program the same way. Otherwise (`fast` on a
    /// mesh or with every pair sent directly, and an `auto` close call that
    /// [`Settle::Always`] or [`Settle::Sticky`] settles by simulating whole
    /// plans) it plans the whole plan (into a buffer this planner keeps)
    /// and slices it: the same program at the cost of the whole plan.
    /// Errors ([`Error::Input`]) when `rank` is not a rank of the topology
    /// or `traffic` does not fit it.
    pub fn program(&mut self, rank: usize, traffic: &TrafficMatrix) -> Result<LocalProgram> {
        let mut out = LocalProgram::default();
        self.plan_rank_into(rank, traffic, &mut out)?;
        Ok(out)
    }

    /// [`Planner::program`] into `out`, reusing its allocations.
    pub fn plan_rank_into(
        &mut self,
        rank: usize,
        traffic: &TrafficMatrix,
        out: &mut LocalProgram,
    ) -> Result<()> {
        // A bad rank or matrix is told before any planning.
        traffic.check_ranks(self.topo.ranks(), "traffic")?;
        rank::check_rank(rank, self.topo.ranks())?;
        self.rank_sliced = false;
        if let Some(network) = self.auto {
            // The choice `plan_into` makes, from the estimates alone; a
            // close call it would settle by simulating whole plans is left
            // to the whole plan below.
            let choice = choose(&self.topo, traffic, network);
            if self.settle == Settle::Never || choice.contenders().len() < 2 {
                let local = LocalTraffic::from_matrix(traffic, rank, &self.topo)?;
                match self.local_of(choice.algorithm(), &local, out) {
                    Err(Error::NeedsWholeMatrix { .. }) => {}
                    done => {
                        self.last_choice = Some(choice);
                        return done;
                    }
                }
            }
        } else {
            let local = LocalTraffic::from_matrix(traffic, rank, &self.topo)?;
            match self.program_local_into(&local, out) {
                Err(Error::NeedsWholeMatrix { .. }) => {}
                done => return done,
            }
        }
        self.rank_sliced = true;
        if self.auto.is_some() {
            let mut whole = std::mem::replace(&mut self.whole, Plan::new("", 0, 0));
            let planned = self.plan_into(traffic, &mut whole);
            self.whole = whole;
            planned?;
        } else if let Some(emitter) = &mut self.emitter {
            emitter.plan_into(traffic, &mut self.whole)?;
        }
        rank::slice_into(&self.whole, rank, out)
    }

    /// The program of rank `local.rank` planned from what that rank knows
    /// ([`LocalTraffic`]) alone: identical to its part of
    /// [`Planner::plan_into`]'s plan for the whole matrix. Memory and time
    /// proportional to the ranks, except staged `fast` and `spray`: O(N² + R G)
    /// memory (lane `rank % G` of every node pair), the stage
    /// decomposition and a walk over every stage pair, and O(N² G) time
    /// balancing every pair unless `local` carries its
    /// [`rank::LaneSums`] (docs/algorithms.md, "One rank's own program").
    /// Errors ([`Error::NeedsWholeMatrix`]) for `auto` (its choice
    /// compares whole-plan estimates), and for staged `fast` and `spray`
    /// when `local` has no `node_splits`, on a mesh, or when every node
    /// pair is sent directly: use [`Planner::program`] with the matrix
    /// there; ([`Error::Input`]) when `local` does not fit the topology.
    pub fn program_local(&mut self, local: &LocalTraffic) -> Result<LocalProgram> {
        let mut out = LocalProgram::default();
        self.program_local_into(local, &mut out)?;
        Ok(out)
    }

    /// Node `node`'s part of every rank's [`rank::LaneSums`] (staged
    /// `fast` and `spray`): the lanes of the pairs it sends, balanced from
    /// `sends` (`sends[l * N + b]`: bytes GPU `l` of the node sends node
    /// `b`; [`LocalTraffic::node_sends`] on any rank of the node). O(N G).
    /// A job gathers the sums of these ([`rank::LaneSums::assemble`] says
    /// which) so that [`Planner::program_local`] balances only its node's
    /// pairs. Errors ([`Error::NeedsWholeMatrix`]) where `program_local`
    /// plans no staged rank (no emitter: `auto` and the other algorithms;
    /// a mesh), ([`Error::Input`]) when `node` or `sends` does not fit.
    pub fn node_lanes(&mut self, node: usize, sends: &[u64]) -> Result<rank::NodeLanes> {
        let (nn, g) = (self.topo.nodes(), self.topo.gpus_per_node());
        if node >= nn || sends.len() != nn * g {
            return Err(InputError::new(
                "node sends",
                format!(
                    "node {node} with {} numbers, for {nn} nodes of {g} GPUs ({} numbers)",
                    sends.len(),
                    nn * g
                ),
            )
            .into());
        }
        Ok(self.lane_emitter()?.node_lanes(node, sends))
    }

    /// The emitter of a staged `fast` or `spray` planner off a mesh, for
    /// the per-node parts of a rank's inputs; else a refusal
    /// ([`Error::NeedsWholeMatrix`]), as `program_local` would.
    fn lane_emitter(&mut self) -> Result<&mut Emitter> {
        let refuse = |algorithm: Algorithm, reason: &str| {
            Err(Error::NeedsWholeMatrix {
                algorithm: algorithm.name().into(),
                reason: reason.into(),
            })
        };
        if self.topo.intra_kind() == Some(IntraKind::Mesh) {
            return refuse(
                self.algorithm,
                "its mesh relief pass reroutes transfers of the whole plan",
            );
        }
        match (&mut self.emitter, self.auto.is_some()) {
            (Some(e), false) => Ok(e),
            _ => refuse(
                self.algorithm,
                "only staged `fast` and `spray` balance lanes",
            ),
        }
    }

    /// Node `node`'s part of every rank's [`rank::LaneSums`] and
    /// [`rank::StageInputs`] (staged `fast` and `spray`), from its rows
    /// (`rows`, `G x R`: what each of its GPUs sends every rank) and its
    /// columns (`cols`, `R x G`: what every rank sends each of its GPUs),
    /// as any rank of the node has them ([`LocalTraffic`]'s fields of the
    /// same names): its lanes ([`Planner::node_lanes`]), the lengths of
    /// the lanes into it, and whether its pairs pass the direct test. O(R
    /// G). Errors as [`Planner::node_lanes`] does.
    pub fn node_parts(
        &mut self,
        node: usize,
        rows: &[u64],
        cols: &[u64],
    ) -> Result<rank::NodeParts> {
        let (nn, g) = (self.topo.nodes(), self.topo.gpus_per_node());
        let n = nn * g;
        if node >= nn || rows.len() != g * n || cols.len() != n * g {
            return Err(InputError::new(
                "node rows and columns",
                format!(
                    "node {node} with {} and {} numbers, for {nn} nodes of {g} GPUs ({} each)",
                    rows.len(),
                    cols.len(),
                    n * g
                ),
            )
            .into());
        }
        let e = self.lane_emitter()?;
        let mut sends = Vec::with_capacity(g * nn);
        let mut to_ranks = vec![0u64; n];
        for row in rows.chunks_exact(n) {
            sends.extend(row.chunks_exact(g).map(|p| p.iter().sum::<u64>()));
            for (acc, &x) in to_ranks.iter_mut().zip(row) {
                *acc += x;
            }
        }
        let into: Vec<u64> = cols.chunks_exact(g).map(|c| c.iter().sum()).collect();
        Ok(rank::NodeParts {
            lanes: e.node_lanes(node, &sends),
            into_len: e.column_lens(node, &into),
            direct: e.node_direct(node, &sends, &to_ranks),
        })
    }

    /// Rank `local.rank`'s part of every rank's
    /// [`rank::StageInputs::first_slices`]: the index of its first lane
    /// slice that carries bytes in the stages of `local.node_bytes`
    /// (`u32::MAX` if none), from the lengths of its node's lanes (`len`:
    /// [`rank::NodeLanes::len`] of its node, [`Planner::node_parts`]).
    /// `None` where the plan is the merged one (latency-bound, or one NIC
    /// with few peers): its programs read no lanes, so a job needs neither
    /// the first slices nor the lane sums (every rank decides alike from
    /// the `inter_out` and `inter_in` all of them hold). `local` needs no
    /// `node_splits`, lane sums or stage inputs. It decomposes the node
    /// matrix and keeps the stages for the rank's program on the same
    /// matrix ([`Planner::program_local`] then skips the decomposition).
    /// Errors as [`Planner::node_lanes`] does, and ([`Error::Input`]) when
    /// `local` or `len` does not fit.
    pub fn first_slice(&mut self, local: &LocalTraffic, len: &[u64]) -> Result<Option<u32>> {
        // Lengths only: the lane sums' values are not read here.
        local.check_lengths(&self.topo)?;
        let (nn, g) = (self.topo.nodes(), self.topo.gpus_per_node());
        if len.len() != nn * g {
            return Err(InputError::new(
                "first slice",
                format!(
                    "{} lane lengths, for {nn} nodes of {g} GPUs ({})",
                    len.len(),
                    nn * g
                ),
            )
            .into());
        }
        let (node, rail) = (local.rank / g, local.rank % g);
        let e = self.lane_emitter()?;
        if e.merged_for(local) {
            return Ok(None);
        }
        let lens = &len[rail * nn..(rail + 1) * nn];
        Ok(Some(e.first_slice_of(&local.node_bytes, node, lens)))
    }

    /// [`Planner::program_local`] into `out`, reusing its allocations.
    pub fn program_local_into(
        &mut self,
        local: &LocalTraffic,
        out: &mut LocalProgram,
    ) -> Result<()> {
        // The lane sums' values are checked where they are read.
        local.check_lengths(&self.topo)?;
        if self.auto.is_some() {
            return Err(Error::NeedsWholeMatrix {
                algorithm: "auto".into(),
                reason: "its choice compares estimates of whole plans".into(),
            });
        }
        self.local_of(self.algorithm, local, out)
    }

    /// Rank `local.rank`'s program of `alg`, one of the algorithms this
    /// planner plans (`auto`'s choice for an `auto` planner) from the
    /// rank's traffic alone; `local` fits the topology.
    fn local_of(
        &mut self,
        alg: Algorithm,
        local: &LocalTraffic,
        out: &mut LocalProgram,
    ) -> Result<()> {
        match alg {
            Algorithm::Fast | Algorithm::Spray => {
                // `auto` plans `fast` with its own emitter and `spray` as
                // `sched::spray` does (the default options).
                if self.auto.is_some() && alg == Algorithm::Spray {
                    let spray = match &mut self.spray {
                        Some(e) => e,
                        None => self.spray.insert(Box::new(Emitter::new(
                            &self.topo,
                            PlannerOptions {
                                staged: false,
                                ..PlannerOptions::default()
                            },
                        )?)),
                    };
                    return spray.program_local_into(local, out);
                }
                match &mut self.emitter {
                    Some(emitter) => emitter.program_local_into(local, out),
                    None => Err(Error::NeedsWholeMatrix {
                        algorithm: alg.name().into(),
                        reason: "this planner has no emitter".into(),
                    }),
                }
            }
            Algorithm::Direct => {
                rank::direct_local(local, "direct", |s, d| path_between(&self.topo, s, d), out);
                Ok(())
            }
            Algorithm::Pxn => {
                pxn_local(&self.topo, local, out);
                Ok(())
            }
            Algorithm::Deepep => {
                if local.rail_into_before.is_empty() {
                    return Err(InputError::new(
                        "local traffic",
                        "`rail_into_before` is empty (not gathered): `deepep` places its writes by it",
                    )
                    .into());
                }
                deepep_local(&self.topo, local, out);
                Ok(())
            }
            Algorithm::Hierarchical => {
                rank::hierarchical_local(&self.topo, local, out);
                Ok(())
            }
            other => Err(Error::NeedsWholeMatrix {
                algorithm: other.name().into(),
                reason: "it has no per-rank planner".into(),
            }),
        }
    }

    /// True when [`Planner::program_local`] can plan one rank from its
    /// [`LocalTraffic`] alone with this planner: `direct`, `hierarchical`,
    /// `pxn` and `deepep` always; `fast` and `spray` on nodes that are not a
    /// mesh (for every matrix but those whose node pairs all go direct,
    /// which `program_local` reports per call); never `auto` (its choice
    /// compares whole-plan estimates) or the algorithms without a per-batch
    /// planner. Callers that gather traffic (`switchyard.torch.AllToAll`)
    /// ask this before choosing what to gather.
    pub fn plans_locally(&self) -> bool {
        if self.auto.is_some() {
            return false;
        }
        match self.algorithm {
            Algorithm::Direct | Algorithm::Hierarchical | Algorithm::Pxn | Algorithm::Deepep => {
                true
            }
            Algorithm::Fast | Algorithm::Spray => {
                self.emitter.is_some() && self.topo.intra_kind() != Some(IntraKind::Mesh)
            }
            _ => false,
        }
    }

    /// True when the last plan was latency-bound, and so sent as one merged
    /// stage of direct sends.
    pub fn latency_bound(&self) -> bool {
        self.emitter.as_ref().is_some_and(Emitter::latency_bound)
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
        self.emitter.as_ref().is_some_and(Emitter::merged)
    }

    /// The stages of the last plan: node pairs with their bytes, in stage order.
    pub fn stages(&self) -> &[StagePair] {
        self.emitter.as_ref().map_or(&[], Emitter::stages)
    }

    /// Number of stages of the last plan.
    pub fn stage_count(&self) -> u32 {
        self.emitter.as_ref().map_or(0, Emitter::stage_count)
    }

    /// Chunk size the last plan used (bytes); `u64::MAX` for a merged plan
    /// ([`Planner::merged`]), whose blocks go whole.
    pub fn chunk_bytes(&self) -> u64 {
        self.emitter.as_ref().map_or(u64::MAX, Emitter::chunk_bytes)
    }

    /// Pipeline depth the last plan used (inter-node sends in flight per GPU,
    /// see [`PlannerOptions::pipeline_depth`]; `u32::MAX` for `spray`, whose
    /// sends do not wait for one another, and for a merged plan
    /// ([`Planner::merged`]), whose sends all start at once).
    pub fn pipeline_depth(&self) -> u32 {
        self.emitter
            .as_ref()
            .map_or(u32::MAX, Emitter::pipeline_depth)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::{generate, Pattern, TrafficSpec};

    /// `plans_locally` says exactly when `program_local` answers: on a
    /// switch node and a mesh node, for every algorithm with a per-batch
    /// planner, on a skewed matrix (not one whose node pairs all go direct).
    #[test]
    fn plans_locally_is_what_program_local_does() {
        for (preset, gpus) in [("dgx-h100", 4), ("mi300x", 4)] {
            let topo = Topology::preset(preset, 2, Some(gpus)).unwrap();
            let mut spec = TrafficSpec::new(topo.ranks(), Pattern::Zipf(1.0));
            spec.seed = 3;
            let m = generate(&spec).unwrap();
            let local = LocalTraffic::from_matrix(&m, 1, &topo).unwrap();
            let mut checked = 0;
            for alg in Algorithm::ALL {
                let Ok(mut p) = Planner::for_algorithm(&topo, *alg, PlannerOptions::default())
                else {
                    continue;
                };
                let answered = p.program_local(&local).is_ok();
                assert_eq!(p.plans_locally(), answered, "{preset} {}", alg.name());
                checked += 1;
            }
            assert!(checked >= 7, "{preset}: {checked} planners");
        }
    }

    /// `auto`'s own programs, when the estimates decide, come from the
    /// chosen algorithm's per-rank planner: the whole plan is never built
    /// (its buffer stays empty). A planner that settles close calls by
    /// simulation builds it when the call is close.
    #[test]
    fn auto_plans_a_rank_without_the_whole_plan() {
        let topo = Topology::preset("dgx-h100", 4, Some(4)).unwrap();
        for (pattern, seed) in [(Pattern::Zipf(1.0), 1), (Pattern::Lognormal(1.0), 2)] {
            let mut spec = TrafficSpec::new(topo.ranks(), pattern);
            spec.seed = seed;
            let m = generate(&spec).unwrap();
            let mut auto = Planner::auto(&topo, PlannerOptions::default(), Network::Ideal).unwrap();
            for r in 0..topo.ranks() {
                let prog = auto.program(r, &m).unwrap();
                assert_eq!(
                    Some(prog.algorithm.as_str()),
                    auto.last_choice().map(|c| c.chosen.as_str())
                );
                assert!(!auto.rank_sliced(), "{pattern:?} rank {r}");
            }
            assert!(
                auto.whole.transfers.is_empty(),
                "{pattern:?}: the whole plan was built"
            );
            let mut settling = Planner::auto(&topo, PlannerOptions::default(), Network::Ideal)
                .unwrap()
                .settling(true);
            settling.program(0, &m).unwrap();
            let close = choose(&topo, &m, Network::Ideal).contenders().len() >= 2;
            assert_eq!(!settling.whole.transfers.is_empty(), close, "{pattern:?}");
            assert_eq!(settling.rank_sliced(), close, "{pattern:?}");
        }
    }
}
