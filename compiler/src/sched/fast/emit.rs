//! `fast`'s emitter: the per-plan state of the planner and the pipeline
//! that turns one traffic matrix into a plan ([`Emitter::plan_into`]):
//! offsets, balancing, scratch layout, stages, then the transfers. It owns
//! the whole matrix's block offsets ([`Emitter::offsets`]) and the merged
//! plan of direct sends (latency-bound exchanges). Data flows one way: what
//! the emitter holds lives in files below it, which do not name it:
//! `blocks` (where the blocks sit, in the whole matrix or one rank's view),
//! `sink` ([`Sink`], where the steps write: the whole plan, [`Emit`], the
//! transfer list written over the previous plan's, or one rank's program),
//! `rank_state` (what one rank's program keeps), beside `balance`,
//! `stages`, `leaves` and `mesh`. The steps live in the files above it,
//! which add `impl Emitter` methods: `layout` (scratch), `lanes`
//! (balancing every node pair), `sends`, `chunks`, `tail` and `window` (the
//! staged inter-node sends, their chunks and their pacing), `forwards`,
//! `intra` (intra-node blocks) and `rank` (one rank's program); `slots`
//! holds the dependency ids. The kinds of transfers are those of
//! docs/algorithms.md, `fast`; `crate::planner::Planner` is the public face
//! of this type.

use super::arith::{max_line, max_line_with_rows};
use super::balance::{Lane, LaneWeights, Piece, RowLens};
use super::blocks::{Blocks, RankBuffers, WholeBlocks};
use super::leaves::LeafStages;
use super::mesh::MeshRelief;
use super::rank_state::{RailLanes, RankSink, StageMemo};
use super::replay::REPLAY_MAX_PAIRS;
use super::rotation::RotationStages;
use super::sink::{Emit, Sink};
use super::stages::{Decomposer, StageChains, StagePair};
use crate::error::{num, Error, Result};
use crate::plan::{Buffer, Deps, Path, Plan, Transfer};
use crate::topology::{FabricKind, IntraKind, Topology};
use crate::traffic::TrafficMatrix;

/// With a per-message cost `p`, the stage floor `θ` is at least what a
/// node's lanes send in this many `p` (see [`Emitter::decompose`]).
const STAGE_MESSAGES: f64 = 4.0;

/// Fewest sends in flight per GPU (and so into each receiving GPU, whose
/// chain has the same depth). Stages of a coarsened decomposition carry
/// unequal bytes per pair, so nodes drift apart; each send in flight beyond
/// the two the alpha-beta rule needs absorbs some of that drift. Four is the
/// most distinct senders a receiving NIC takes before incast costs
/// throughput (`K` of the congested model, docs/cost-model.md), so the
/// extra depth is free there. Measured on the full bench suite (skewed,
/// full-bisection cases): depth 3 gave median 1.048 and 16x8 log-normal 0.5
/// 5% slower than `direct`; depth 4 median 1.046 and none slower.
pub(crate) const MIN_DEPTH: u32 = 4;

/// `fast` cuts the node matrix into rotation stages (stage `k` sends every
/// node's whole pair to node `(a + k) mod N`) instead of its decomposition's
/// where their stage chains ([`StageChains`]) end before this fraction of
/// the decomposition's, and where the chains describe how both lists run
/// ([`NodeStages::chains_hold`]) wherever they end sooner at all. Below 1
/// because elsewhere the chains rank the two poorly when they are close: on
/// the dgx-h100 sweeps the rotations priced 0.936 to 1 of the
/// decomposition were about as often slower as faster, by up to 12% (4x8
/// log-normal at 64 KB, where a node's window holds its whole pairs),
/// while all those priced below 0.93 but one (+0.6%) were faster
/// (docs/algorithms.md, `fast` (2), "Rotation stages"; docs/benchmarks.md).
pub(crate) const ROTATION_MARGIN: f64 = 0.93;

/// A hot receiver's split stages (leaves.rs, `hot_receiver_split`) give
/// way to the plain decomposition where it ends before this fraction of
/// their stage chains' end.
const SPLIT_MARGIN: f64 = 0.93;

/// Where the stage chains rank the two lists ([`NodeStages::chains_hold`]),
/// the rotation is taken wherever its chains end sooner than the
/// decomposition's by more than this fraction: the rounding of two sums of
/// a few dozen pair times, not a margin (both lists often end exactly on
/// the critical line, and then the decomposition is kept).
const CHAINS_TIE: f64 = 1e-9;

/// From this many nodes on (switch nodes, no leaf uplink that can bind,
/// not a mesh), `fast` cuts the node matrix into the chunked rotation
/// ([`super::stages::chunked_rotation`]) instead of its decomposition: no
/// augmenting search, so each rank's share of the planning grows with the
/// matrix, not with the decomposition's paths. Its pairs are cut into
/// pieces of at most the decomposition's floor `θ` (a hot node's pairs
/// interleave with the others', as the decomposition's stages of `θ` do)
/// but none under a latency- or message-bound chunk on each GPU
/// (`NodeStages::least_piece`: small pairs go whole). On the DGX-H100
/// sweep (`fast_sweep dgx-h100 N`, ideal and calibrated) it is no worse
/// than the decomposition by more than 2.1% in any case at 32, 64 and 128
/// nodes, and better on the geometric mean; at 16 nodes it lost up to 6%
/// (docs/benchmarks.md, issue 25, "The chunked rotation adopted").
pub(crate) const CHUNKED_ROTATION_NODES: usize = 32;

/// Knobs of the planner. The defaults are what `fast` uses;
/// `PlannerOptions { staged: false, ..Default::default() }` is `spray`.
#[derive(Clone, Debug, PartialEq)]
pub struct PlannerOptions {
    /// Inter-node sends in flight per GPU: a GPU's send `k` waits for its own
    /// send `k - depth` and for send `k - depth` into its receiving GPU
    /// (docs/algorithms.md, eq. 5). `None` derives it from the alpha-beta
    /// cost: `2 + ceil(latency / send time)`, at least 4 (3 when every node
    /// pair is sent directly over several stages). Unused when `staged` is
    /// `false`.
    pub pipeline_depth: Option<u32>,
    /// Target stages per node: the decomposition's stage floor is
    /// `θ = M / (stages_per_node · (N − 1))`; larger means finer, exacter stages.
    pub stages_per_node: f64,
    /// Balance each node's traffic over its GPUs and NICs (`false`: every GPU
    /// sends its own bytes, an ablation).
    pub balance: bool,
    /// Permutation stages (`false`: every inter-node send at once: `spray`).
    pub staged: bool,
    /// Largest inter-node send: a GPU's share of a stage is cut into chunks
    /// of at most this many bytes, so the NVLink hops before the first chunk
    /// and after the last are short. `None` derives it from the cost model.
    pub chunk_bytes: Option<u64>,
    /// Serial cost of each inter-node message, us: the `per_message_us` of
    /// the network mode the plan is for (0 in `ideal`, 3 in the calibrated
    /// modes: [`PlannerOptions::for_network`]). With a cost per message the
    /// derived chunks are larger and the last sends are cut only where that
    /// pays (docs/algorithms.md, eq. 4).
    pub per_message_us: f64,
}

impl PlannerOptions {
    /// The defaults, for a plan simulated in `network` with its default
    /// calibration (its per-message cost).
    pub fn for_network(network: crate::sim::Network) -> Self {
        Self::for_sim(&crate::sim::SimOptions::new(network))
    }

    /// The defaults, for a plan simulated with `sim` (its per-message cost,
    /// none in `ideal`).
    pub fn for_sim(sim: &crate::sim::SimOptions) -> Self {
        PlannerOptions {
            per_message_us: match sim.network {
                crate::sim::Network::Ideal => 0.0,
                _ => sim.calibration.per_message_us,
            },
            ..Self::default()
        }
    }
}

impl Default for PlannerOptions {
    fn default() -> Self {
        PlannerOptions {
            pipeline_depth: None,
            stages_per_node: 4.0,
            balance: true,
            staged: true,
            chunk_bytes: None,
            per_message_us: 0.0,
        }
    }
}

/// `fast`'s planner state for one topology: what [`Emitter::new`] derives
/// from the topology, and the buffers each plan reuses.
#[derive(Clone, Debug)]
pub(crate) struct Emitter {
    pub(super) opts: PlannerOptions,
    pub(super) nodes: usize,
    pub(super) gpus: usize,
    pub(super) weights: LaneWeights,
    /// GPU `l` sends through its rail NIC `rail[l]` (Topology::rail_of).
    pub(super) rail: Vec<u32>,
    /// Bytes/us of one NIC, and of all the NICs a node uses.
    pub(super) nic_rate: f64,
    pub(super) node_rate: f64,
    /// Latency of one inter-node transfer and of one NVLink hop, us.
    pub(super) inter_latency: f64,
    pub(super) intra_latency: f64,
    /// Bytes/us of one GPU's NVLink (switch) or one mesh link.
    pub(super) intra_rate: f64,
    /// The intra-node fabric is a full mesh of point-to-point links: a GPU's
    /// balancing moves are spread over all its links (balance.rs).
    pub(super) mesh: bool,
    // Per-plan buffers, kept between calls.
    /// Block offsets of the whole matrix (whole plans).
    pub(super) whole: WholeBlocks,
    /// Block offsets one rank's program reads (`rank.rs`).
    pub(super) rank_bufs: RankBuffers,
    /// Keys of the transfers a rank's program emits (`rank.rs`).
    pub(super) rank_sink: RankSink,
    /// A rank's program: lane `rail` of the other pairs, from the lane
    /// sums (`balance_rank` with `lazy`).
    pub(super) rail_lanes: RailLanes,
    /// The stages of a rank's last node matrix (`rank.rs`).
    pub(super) stage_memo: StageMemo,
    pub(super) node_bytes: Vec<u64>,
    /// Non-empty blocks between different nodes.
    pub(super) inter_blocks: u64,
    /// The lanes of every node pair, `(a, b, l)` at `(a N + b) G + l`; for
    /// a rank's program only those it reads (`rank_lane_index`).
    pub(super) lanes: Vec<Lane>,
    /// A rank's program: running sums per GPU that place the lanes it
    /// keeps, and one pair's lanes that it does not keep.
    pub(super) rank_sums: Vec<u64>,
    /// A rank's program: the lanes' bytes of one node's pairs (`balance_rank`).
    pub(super) row_lens: RowLens,
    /// A rank's program given no [`crate::rank::LaneSums`]: those it
    /// computes from every pair's lanes.
    pub(super) own_sums: crate::rank::LaneSums,
    pub(super) lane_tmp: Vec<Lane>,
    pub(super) pieces: Vec<Piece>,
    pub(super) sent: Vec<u64>,
    pub(super) targets: Vec<u64>,
    pub(super) scratch_gather: Vec<u64>,
    /// The node-stage decomposition (stages.rs, leaves.rs).
    pub(super) node_stages: NodeStages,
    pub(super) stages: Vec<StagePair>,
    /// One rank's program: its stages are the chunked rotation, kept as
    /// `rotation` (not written into `stages`); then `first_slice` and
    /// `last_pair` hold stage numbers, not indices in `stages` (a node
    /// sends and receives at most one pair per stage).
    pub(super) rotated_rank: bool,
    pub(super) rotation: RotationStages,
    pub(super) stage_count: u32,
    pub(super) depth: u32,
    pub(super) chunk: u64,
    pub(super) taken: Vec<u64>,
    /// Index in `stages` of each GPU's first non-empty lane slice
    /// ([`NONE`] if it sends nothing): its first send is split.
    pub(super) first_slice: Vec<u32>,
    /// Inter-node sends of each GPU, per stage slot (second is NONE if one).
    pub(super) slots: Vec<Vec<[u32; 2]>>,
    /// Inter-node sends into each GPU, per slot (the receive-side chain).
    pub(super) rslots: Vec<Vec<[u32; 2]>>,
    /// Windows counted in bytes ([`Emitter::window_unit`]): the reference
    /// send, 0 when windows count sends.
    pub(super) unit: u64,
    /// The sends of the lane slice being emitted, at their nominal size
    /// (before the first-send split and the taper).
    pub(super) nominal: u64,
    /// With `unit > 0`: running total of the bytes each GPU's slots count
    /// for (`out_bytes`), of those into each GPU (`in_bytes`), and the
    /// sending GPU of each of the latter (`in_from`).
    pub(super) out_bytes: Vec<Vec<u64>>,
    pub(super) in_bytes: Vec<Vec<u64>>,
    pub(super) in_from: Vec<Vec<u32>>,
    /// The last plan was latency-bound ([`Emitter::is_latency_bound`]).
    pub(super) latency_bound: bool,
    /// The last plan was one merged stage of direct sends (see
    /// [`Emitter::merged`]).
    pub(super) merged: bool,
    /// Each node sends through one NIC and has at most [`MIN_DEPTH`] peers
    /// (see [`Emitter::merged`]).
    pub(super) one_nic_few_peers: bool,
    /// Every node pair of the last plan was sent directly (no balancing).
    pub(super) all_direct: bool,
    /// A send from one rail to another crosses an oversubscribed spine
    /// (rail-optimized fabric): direct lanes, which are not rail-aligned,
    /// would load it where balanced lanes never touch it.
    pub(super) cross_rail_spine: bool,
    /// Last balancing move into each GPU's scratch.
    pub(super) last_move: Vec<u32>,
    /// Mesh only: the last balancing move over each intra-node link `s → d`
    /// (index `s * g + d % g`) among those that start at once, before the
    /// move gate of `emit_slice` holds them back (see `emit_intra_node`).
    pub(super) early_move: Vec<u32>,
    /// Switch only: the last of those early moves out of each GPU
    /// (`early_out`) and into each GPU (`early_in`).
    pub(super) early_out: Vec<u32>,
    pub(super) early_in: Vec<u32>,
    /// Chunks of the lane slice being emitted.
    pub(super) chunks: Vec<(u64, u64)>,
    /// The chunks being tapered.
    pub(super) tail: Vec<(u64, u64)>,
    /// Mesh only: bytes per destination GPU of a lane's last sends, and the
    /// best rotation's sends so far (tail.rs).
    pub(super) tail_dest: Vec<u64>,
    pub(super) tail_best: Vec<(u64, u64)>,
    /// The mesh relief pass (mesh fabrics only).
    pub(super) relief: MeshRelief,
    /// Index in `stages` of the last pair each node sends (first half) and
    /// receives (second half).
    pub(super) last_pair: Vec<usize>,
    /// Dependencies being collected for a transfer (direct sends, intra-node
    /// blocks: their slots may be ranges).
    pub(super) chain_buf: Vec<u32>,
    /// `spray`: the slot of its GPU's chain where the lane slice being
    /// emitted starts (its sends are chained from there: `emit_slice`).
    pub(super) slice_start: usize,
    /// `spray`: each sending node's chain depth ([`Emitter::spray_depth`]),
    /// set once per plan by `prepare_sends`.
    pub(super) spray_depths: Vec<usize>,
    /// [`Emitter::chunk_bounds`] of the node matrix [`Emitter::decompose`]
    /// last cut into stages, for the [`Emitter::prepare_sends`] that
    /// follows (which takes it: each reads every node pair's bytes).
    pub(super) bounds: Option<(f64, f64)>,
}

impl Emitter {
    /// Precomputes what depends on the topology. Errors
    /// ([`Error::Unsupported`]) for a `links` topology (the planner needs
    /// nodes, rails and an intra-node fabric: use `lp` there) and for a
    /// `stages_per_node` that is not a positive number.
    pub(crate) fn new(topo: &Topology, opts: PlannerOptions) -> Result<Emitter> {
        let name = if opts.staged { "fast" } else { "spray" };
        if !topo.is_hierarchical() {
            return Err(Error::Unsupported {
                algorithm: name.into(),
                reason: "needs a hierarchical topology (intra, nic, fabric), not a `links` graph; use `lp`".into(),
            });
        }
        if !(opts.per_message_us.is_finite() && opts.per_message_us >= 0.0) {
            return Err(Error::Unsupported {
                algorithm: name.into(),
                reason: format!(
                    "per_message_us must be zero or positive, got {}",
                    num(opts.per_message_us)
                ),
            });
        }
        if !(opts.stages_per_node.is_finite() && opts.stages_per_node > 0.0) {
            return Err(Error::Unsupported {
                algorithm: name.into(),
                reason: format!(
                    "stages_per_node must be positive, got {}",
                    num(opts.stages_per_node)
                ),
            });
        }
        let (nodes, gpus) = (topo.nodes(), topo.gpus_per_node());
        // The topology's rail map (`nic.gpu_nic`, else `l % nics`); the rails
        // in use are the distinct NICs it names.
        let rail: Vec<u32> = (0..gpus).map(|l| topo.rail_of(l) as u32).collect();
        let rails = rail.iter().collect::<std::collections::BTreeSet<_>>().len() as f64;
        let nic_rate = topo.nic_bandwidth().max(f64::MIN_POSITIVE);
        let inter_latency = if nodes > 1 {
            topo.path_latency(0, gpus)
        } else {
            0.0
        };
        let intra_latency = if gpus > 1 {
            topo.path_latency(0, 1)
        } else {
            0.0
        };
        let ranks = nodes * gpus;
        Ok(Emitter {
            nodes,
            gpus,
            weights: LaneWeights::from_rails(&rail),
            rail,
            nic_rate,
            node_rate: nic_rate * rails,
            inter_latency,
            intra_latency,
            intra_rate: topo.intra_bandwidth().max(f64::MIN_POSITIVE),
            mesh: topo.intra_kind() == Some(IntraKind::Mesh),
            whole: WholeBlocks::default(),
            rank_bufs: RankBuffers::default(),
            rank_sink: RankSink::default(),
            rail_lanes: RailLanes::default(),
            stage_memo: StageMemo::default(),
            node_bytes: Vec::with_capacity(nodes * nodes),
            inter_blocks: 0,
            lanes: Vec::new(),
            rank_sums: Vec::new(),
            row_lens: RowLens::default(),
            own_sums: crate::rank::LaneSums::default(),
            lane_tmp: Vec::new(),
            pieces: Vec::new(),
            sent: Vec::with_capacity(gpus),
            targets: Vec::with_capacity(gpus),
            scratch_gather: Vec::with_capacity(ranks),
            node_stages: NodeStages::new(topo),
            stages: Vec::new(),
            rotated_rank: false,
            rotation: RotationStages::default(),
            stage_count: 0,
            depth: 1,
            chunk: u64::MAX,
            taken: Vec::with_capacity(nodes * nodes),
            first_slice: Vec::with_capacity(ranks),
            slots: vec![Vec::new(); ranks],
            rslots: vec![Vec::new(); ranks],
            unit: 0,
            nominal: 0,
            out_bytes: vec![Vec::new(); ranks],
            in_bytes: vec![Vec::new(); ranks],
            in_from: vec![Vec::new(); ranks],
            latency_bound: false,
            merged: false,
            one_nic_few_peers: rails == 1.0 && nodes.saturating_sub(1) <= MIN_DEPTH as usize,
            all_direct: false,
            cross_rail_spine: rails > 1.0
                && topo.spec().fabric.as_ref().is_some_and(|f| {
                    f.kind == FabricKind::RailOptimized && f.oversubscription > 1.0
                }),
            last_move: Vec::with_capacity(ranks),
            early_move: Vec::new(),
            early_out: Vec::new(),
            early_in: Vec::new(),
            chunks: Vec::new(),
            tail: Vec::new(),
            tail_dest: Vec::new(),
            tail_best: Vec::new(),
            last_pair: Vec::with_capacity(2 * nodes),
            relief: MeshRelief::default(),
            chain_buf: Vec::new(),
            slice_start: 0,
            spray_depths: Vec::new(),
            bounds: None,
            opts,
        })
    }

    pub(crate) fn options(&self) -> &PlannerOptions {
        &self.opts
    }

    pub(super) fn ranks(&self) -> usize {
        self.nodes * self.gpus
    }

    /// Plans one all-to-all (allocates a fresh plan; see [`Emitter::plan_into`]).
    pub(crate) fn plan(&mut self, traffic: &TrafficMatrix) -> Result<Plan> {
        let mut plan = Plan::new("", 0, 0);
        self.plan_into(traffic, &mut plan)?;
        Ok(plan)
    }

    /// Plans one all-to-all into `out`, reusing its allocations (and this
    /// planner's): in steady state a call allocates almost nothing. Whatever
    /// `out` held is replaced. Errors ([`Error::Input`]) when `traffic` does
    /// not have the topology's number of ranks.
    pub(crate) fn plan_into(&mut self, traffic: &TrafficMatrix, out: &mut Plan) -> Result<()> {
        traffic.check_ranks(self.ranks(), "traffic")?;
        // The previous plan's transfers are overwritten in place (see `Emit`).
        out.scratch.clear();
        out.chunking = None;
        out.algorithm.clear();
        out.algorithm
            .push_str(if self.opts.staged { "fast" } else { "spray" });
        out.ranks = self.ranks() as u32;
        out.gpus_per_node = self.gpus as u32;
        // Taken out of `self` while the emitter's steps read it.
        let mut whole = std::mem::take(&mut self.whole);
        self.offsets(traffic, &mut whole);
        self.stages.clear();
        self.slots.iter_mut().for_each(Vec::clear);
        self.latency_bound = self.opts.staged && self.is_latency_bound(&whole);
        self.merged = self.latency_bound || (self.opts.staged && self.one_nic_few_peers);
        let mut emit = Emit::new(&mut out.transfers);
        if self.merged {
            // One merged stage of direct sends: no relay hop, no stage latency.
            self.stage_count = u32::from(self.inter_node_bytes() > 0);
            // Blocks go whole and none waits for another.
            self.chunk = u64::MAX;
            self.depth = u32::MAX;
            self.emit_direct(&whole, traffic, &mut emit);
            emit.finish();
            self.whole = whole;
            return Ok(());
        }
        self.balance(&whole);
        self.layout_scratch(&mut out.scratch);
        self.decompose();
        self.emit_inter_node(&whole, &mut emit);
        self.emit_intra_node(&whole, &mut emit);
        emit.finish();
        self.whole = whole;
        if self.mesh {
            self.relief
                .relieve(out, self.gpus, self.chunk, &self.early_move);
        }
        Ok(())
    }

    /// Block offsets of the all-to-all(v) layout (into `w`), the node matrix
    /// and the count of non-empty blocks between nodes.
    pub(super) fn offsets(&mut self, m: &TrafficMatrix, w: &mut WholeBlocks) {
        let n = self.ranks();
        let (nn, g) = (self.nodes, self.gpus);
        w.ranks = n;
        w.gpus = g;
        // Every entry of the two offset tables is written below.
        w.send_off.resize(n * (n + 1), 0);
        w.recv_off.resize(n * n, 0);
        w.col_acc.clear();
        w.col_acc.resize(n, 0);
        self.node_bytes.clear();
        self.node_bytes.resize(nn * nn, 0);
        self.inter_blocks = 0;
        for s in 0..n {
            let row = m.row(s);
            let so = &mut w.send_off[s * (n + 1)..(s + 1) * (n + 1)];
            let recv = &mut w.recv_off[s * n..(s + 1) * n];
            // Two passes: the running sum is serial, the column sums are not
            // (this one vectorises).
            let mut acc = 0u64;
            let mut nonzero = 0u64;
            for (&b, off) in row.iter().zip(&mut so[..n]) {
                *off = acc;
                acc += b;
            }
            so[n] = acc;
            for ((&b, at), col) in row.iter().zip(recv).zip(&mut w.col_acc) {
                *at = *col;
                *col += b;
                nonzero += u64::from(b > 0);
            }
            let a = s / g;
            let own = &row[a * g..(a + 1) * g];
            self.inter_blocks += nonzero - own.iter().filter(|&&b| b > 0).count() as u64;
            let node_row = &mut self.node_bytes[a * nn..(a + 1) * nn];
            for (b, x) in node_row.iter_mut().enumerate() {
                *x += so[(b + 1) * g] - so[b * g];
            }
        }
    }

    /// True when the exchange is latency-bound: even sent directly, without
    /// balancing, the busiest NIC needs less than one inter-node latency
    /// (beta <= alpha). Then every relay hop and every stage only adds
    /// latency, and incast costs little on so few bytes: the plan merges all
    /// stages into one of direct sends.
    fn is_latency_bound(&self, w: &WholeBlocks) -> bool {
        if self.nodes < 2 {
            return false;
        }
        let (n, g) = (self.ranks(), self.gpus);
        // Per GPU: bytes it sends to and receives from other nodes; a NIC
        // carries the sum over the GPUs of its rail.
        self.busiest_within_latency((0..n).map(|s| {
            let a = s / g;
            let out = w.send_at(s, n) - w.to_node(s, a);
            let inn = w.col_acc[s] - w.node_to_rank(a, s);
            (out, inn)
        }))
    }

    pub(super) fn inter_node_bytes(&self) -> u64 {
        let nn = self.nodes;
        (0..nn)
            .flat_map(|a| {
                let row = &self.node_bytes[a * nn..(a + 1) * nn];
                row[..a].iter().chain(&row[a + 1..])
            })
            .sum()
    }

    /// Block `(s, d)` of `bytes` bytes, whole, from `s`'s input into its
    /// place in `d`'s output.
    pub(super) fn whole_block(
        v: &impl Blocks,
        s: usize,
        d: usize,
        bytes: u64,
        path: Path,
        deps: Deps,
    ) -> Transfer {
        Transfer {
            src: s as u32,
            src_buf: Buffer::Input,
            src_off: v.send_at(s, d),
            dst: d as u32,
            dst_buf: Buffer::Output,
            dst_off: v.recv_at(s, d),
            bytes,
            path,
            step: 0,
            deps,
        }
    }

    /// Every block straight from its source to its destination, at once.
    fn emit_direct(&self, w: &WholeBlocks, m: &TrafficMatrix, out: &mut Emit) {
        let (n, g) = (self.ranks(), self.gpus);
        for s in 0..n {
            let node = s / g * g..(s / g + 1) * g;
            let nic = self.rail[s - node.start];
            for (d, &bytes) in m.row(s).iter().enumerate() {
                if bytes == 0 {
                    continue;
                }
                let path = if s == d {
                    Path::Local
                } else if node.contains(&d) {
                    Path::Nvlink
                } else {
                    Path::Rdma { nic }
                };
                out.push(Self::whole_block(w, s, d, bytes, path, Deps::new()));
            }
        }
    }

    /// The last plan was latency-bound ([`Emitter::is_latency_bound`]).
    pub(crate) fn latency_bound(&self) -> bool {
        self.latency_bound
    }

    /// The last plan was one merged stage of direct sends: latency-bound, or
    /// one NIC per node and at most [`MIN_DEPTH`] peers (`fast` only). The
    /// public `Planner::merged` says why, with the measurements.
    pub(crate) fn merged(&self) -> bool {
        self.merged
    }

    /// The stages of the last plan, in stage order.
    pub(crate) fn stages(&self) -> &[StagePair] {
        &self.stages
    }

    /// Number of stages of the last plan.
    pub(crate) fn stage_count(&self) -> u32 {
        self.stage_count
    }

    /// Chunk size of the last plan (bytes; `u64::MAX` when merged).
    pub(crate) fn chunk_bytes(&self) -> u64 {
        self.chunk
    }

    /// Pipeline depth of the last plan (`u32::MAX` for `spray` and when merged).
    pub(crate) fn pipeline_depth(&self) -> u32 {
        self.depth
    }
    /// Stages (or one stage of everything for `spray`) and the pipeline depth.
    pub(super) fn decompose(&mut self) {
        self.decompose_as(false);
    }

    /// [`Emitter::decompose`]; with `keep_rotation`, where the stages are
    /// the chunked rotation, they are kept as its structure
    /// (`self.rotation`, `rotated_rank` set) and `stages` stays empty: one
    /// rank's program reads only the pieces it needs (rank.rs).
    pub(super) fn decompose_as(&mut self, keep_rotation: bool) {
        self.decompose_from(None, keep_rotation);
    }

    /// [`Emitter::decompose_as`] of `from` where given, copied into
    /// `node_bytes` first; where the rotation is kept, each row as its
    /// line sums are read ([`max_line_with_rows`]), so the matrix is read
    /// once for both.
    pub(super) fn decompose_from(&mut self, from: Option<&[u64]>, keep_rotation: bool) {
        self.stages.clear();
        self.rotated_rank = false;
        let nn = self.nodes;
        let measured = self.opts.staged && keep_rotation && self.node_stages.rotates(nn);
        let mut line = None;
        if let Some(from) = from {
            self.node_bytes.clear();
            if measured {
                let copy = &mut self.node_bytes;
                line = Some(max_line_with_rows(nn, from, |_, row| {
                    copy.extend_from_slice(row)
                }));
            } else {
                self.node_bytes.extend_from_slice(from);
            }
        }
        if !self.opts.staged {
            for a in 0..nn {
                for b in 0..nn {
                    let bytes = self.node_bytes[a * nn + b];
                    if a != b && bytes > 0 {
                        self.stages.push(StagePair {
                            stage: 0,
                            src_node: a as u32,
                            dst_node: b as u32,
                            bytes,
                        });
                    }
                }
            }
            self.stage_count = u32::from(!self.stages.is_empty());
            self.depth = u32::MAX;
            self.bounds = None;
            return;
        }
        // The largest line sum, read here once (the chunk's bound by the
        // NVLink hop and the rotation's cap both need it); where the rotation
        // is kept, in the same pass as the copy.
        let line = match line {
            Some(line) => line,
            None => max_line(nn, &self.node_bytes),
        };
        let bounds = self.chunk_bounds_at(line);
        self.bounds = Some(bounds);
        // About one send per lane and part (see leaves.rs).
        let part = self.chunk_size(bounds).saturating_mul(self.gpus as u64);
        self.node_stages.least_piece = if nn >= CHUNKED_ROTATION_NODES {
            let lane = bounds.1.max(self.chunk_by_message());
            (lane * self.gpus as f64) as u64
        } else {
            0
        };
        if keep_rotation {
            let cap = self.node_stages.chunked_cap(nn, || line, &self.opts);
            if let (Some(cap), true) = (cap, measured) {
                self.rotation.build(nn, &self.node_bytes, cap);
                self.stage_count = self.rotation.stage_count();
                self.rotated_rank = true;
                return;
            }
        }
        self.stage_count =
            self.node_stages
                .decompose(nn, &self.node_bytes, &self.opts, part, &mut self.stages);
    }

    /// The bytes of every stage pair together and the number of pairs.
    pub(super) fn stage_totals(&self) -> (u64, usize) {
        if self.rotated_rank {
            (self.rotation.moved(), self.rotation.pairs())
        } else {
            let moved = self.stages.iter().map(|p| p.bytes).sum();
            (moved, self.stages.len())
        }
    }
}

/// `fast`'s node-stage decomposition on one topology, given the node
/// matrix alone: the layered stages of leaves.rs where the fabric's
/// uplinks are (near) the cut, else the plain coarsened Birkhoff–von
/// Neumann stages of stages.rs, lightest first. [`Emitter::decompose`]
/// plans with it, and `auto`'s estimate of `fast` (sched/auto/estimate.rs) prices
/// the same stages, so the two cannot drift apart.
#[derive(Clone, Debug)]
pub(crate) struct NodeStages {
    decomposer: Decomposer,
    /// The fabric's leaves, where their uplinks can be the cut (leaves.rs).
    leaves: Option<LeafStages>,
    /// Bytes/us of one node's NICs together (its distinct rails).
    node_rate: f64,
    /// The pricing of stage lists.
    chains: StageChains,
    /// Whether the last [`NodeStages::decompose`] cut the rotation stages.
    rotated: bool,
    /// Whether the last [`NodeStages::decompose`] cut the layered stages.
    layered: bool,
    /// Whether the node's GPUs are a mesh of point-to-point links.
    mesh: bool,
    /// The least piece of a pair the chunked rotation cuts (bytes; 0: no
    /// least), set by the caller before [`NodeStages::decompose`]: a
    /// chunk that four latencies (or, with a per-message cost, the
    /// messages) do not dominate, on each of the node's GPUs
    /// (`Emitter::chunk_bounds`, `Emitter::chunk_by_message`).
    pub(crate) least_piece: u64,
    /// The chunked rotation's buffers.
    rotation: RotationStages,
}

/// [`Decomposer::decompose_light_first_with`] of `t` into `out`, its
/// stages priced by their chains at `rate` as they are written
/// ([`StageChains::end_of_permutations`]'s value): the stage count and
/// the chains' end.
fn decompose_priced(
    dec: &mut Decomposer,
    chains: &mut StageChains,
    nn: usize,
    t: &[u64],
    floor: impl Fn(u64) -> u64,
    out: &mut Vec<StagePair>,
    rate: f64,
) -> (u32, f64) {
    chains.start(nn);
    let count = dec.decompose_light_first_with(nn, t, floor, out, |p| chains.step(p, rate));
    (count, chains.finish())
}

impl NodeStages {
    pub(crate) fn new(topo: &Topology) -> NodeStages {
        let node_rate = node_rate(topo);
        NodeStages {
            decomposer: Decomposer::default(),
            leaves: LeafStages::from_topology(topo, node_rate),
            node_rate,
            chains: StageChains::default(),
            rotated: false,
            layered: false,
            mesh: topo.intra_kind() == Some(IntraKind::Mesh),
            least_piece: 0,
            rotation: RotationStages::default(),
        }
    }

    /// Whether the last [`NodeStages::decompose`] cut the node matrix into
    /// the rotation stages (whole node pairs, `N - 1` permutations).
    pub(crate) fn rotated(&self) -> bool {
        self.rotated
    }

    /// Whether the last [`NodeStages::decompose`] cut layered stages that
    /// all cross the leaves' uplinks (no intra-leaf layer: one node per
    /// leaf).
    pub(crate) fn crossing_only(&self) -> bool {
        self.layered && self.leaves.as_ref().is_some_and(|l| l.crossing_only())
    }

    /// Decomposes the `nn x nn` node matrix `t` (row-major, the diagonal
    /// ignored) into stages appended to `out` (which must hold no stages
    /// yet), numbered from 0 in the order they run; `part` is about one
    /// send per lane (the layered stages are cut into parts of it).
    /// Returns the stage count.
    pub(crate) fn decompose(
        &mut self,
        nn: usize,
        t: &[u64],
        opts: &PlannerOptions,
        part: u64,
        out: &mut Vec<StagePair>,
    ) -> u32 {
        self.rotated = false;
        self.layered = false;
        if let Some(leaves) = self.leaves.as_mut() {
            let s = opts.stages_per_node;
            if let Some(count) = leaves.decompose(&mut self.decomposer, nn, t, s, part, out) {
                self.layered = true;
                return count;
            }
        }
        // The decomposition gives the floor its critical line `M*` (the
        // largest line sum), which the rotation's choice reads too.
        let critical = std::cell::Cell::new(0u64);
        let node_rate = self.node_rate;
        let floor = |m: u64| {
            critical.set(m);
            Self::floor(nn, opts, node_rate, m)
        };
        let start = out.len();
        // A hot receiver whose leaf's downlink binds too: its in-leaf
        // receipts, paired with its leaf-mates' crossing receipts, run first,
        // then the rest (leaves.rs, `hot_receiver_split`); both with the
        // floor of the whole matrix.
        if let Some(leaves) = self.leaves.as_mut() {
            if let Some((m, rest, paired)) = leaves.hot_receiver_split(nn, t) {
                let theta = floor(m);
                let dec = &mut self.decomposer;
                let first = dec.decompose_light_first_with(nn, paired, |_| theta, out, |_| {});
                let mid = out.len();
                let second = dec.decompose_light_first_with(nn, rest, |_| theta, out, |_| {});
                for p in &mut out[mid..] {
                    p.stage += first;
                }
                // The plain decomposition instead where it ends clearly
                // sooner (SPLIT_MARGIN): by its stage chains, and by its
                // stages replayed as flows over the leaves' links, which
                // the split is for (a hot receiver's crossing receipts
                // beside its leaf-mates' on the downlink) and which is run
                // only where the chains say so, and up to REPLAY_MAX_PAIRS
                // pairs (beyond, the chains decide). Both price the ideal
                // network: with a per-message cost the split is kept.
                if opts.per_message_us > 0.0 {
                    return first + second;
                }
                let chains = &mut self.chains;
                let split = chains.end_of_permutations(nn, &out[start..], node_rate);
                let end = out.len();
                let (plain, mut plain_end) =
                    decompose_priced(dec, chains, nn, t, floor, out, node_rate);
                if plain_end < SPLIT_MARGIN * split && out.len() - end <= REPLAY_MAX_PAIRS {
                    let window = f64::from(MIN_DEPTH) * part as f64;
                    plain_end = plain_end.max(leaves.replay(nn, &out[end..], node_rate, window));
                }
                if plain_end < SPLIT_MARGIN * split {
                    out.drain(start..end);
                    return plain;
                }
                out.truncate(end);
                return first + second;
            }
        }
        // Large clusters of switch nodes: the chunked rotation, pairs cut
        // into pieces of at most the floor, but none under `least_piece`.
        if self.rotates(nn) {
            if let Some(cap) = self.chunked_cap(nn, || max_line(nn, t), opts) {
                self.rotation.build(nn, t, cap);
                return self.rotation.write_pairs(t, out);
            }
        }
        // The rotation instead, where its stage chains end sooner: by any
        // amount where the chains describe how the two lists run
        // (`chains_hold`), else clearly sooner (ROTATION_MARGIN). From the
        // node matrix, the topology and the chunk alone, so every rank
        // makes the same choice as the whole plan. Not where leaves can
        // bind (their stages above) nor with a per-message cost, where the
        // chains misprice it (the calibrated sweep had rotations priced at
        // 0.8 of the decomposition run 12% slower).
        if self.leaves.is_none() && nn > 2 && opts.per_message_us <= 0.0 {
            // Both priced as `StageChains::end` would (lanes, chunk and
            // per-message cost out of it), in one pass each
            // (`StageChains::end_of_permutations`): today's stages as they
            // are written in their order, the rotation from the matrix,
            // written only if taken.
            let rate = self.node_rate;
            let dec = &mut self.decomposer;
            let (count, today) = decompose_priced(dec, &mut self.chains, nn, t, floor, out, rate);
            let rotation = dec.rotation_end(nn, t, &mut self.chains, rate);
            let sooner = rotation < ROTATION_MARGIN * today
                || (rotation < (1.0 - CHAINS_TIE) * today
                    && Self::chains_hold(self.mesh, nn, critical.get(), part));
            if sooner {
                self.rotated = true;
                out.truncate(start);
                return dec.rotation_pairs(nn, t, |p| out.push(p));
            }
            count
        } else {
            self.decomposer
                .decompose_light_first_with(nn, t, floor, out, |_| {})
        }
    }

    /// The decomposition's floor `θ` for a node matrix whose largest line
    /// sum is `m`: `m` over the stages per node times `nn - 1`, and with a
    /// per-message cost `p` no stage lighter than a node pair whose lanes
    /// each send for STAGE_MESSAGES `p`: every stage costs each lane at
    /// least one message (docs/algorithms.md, eq. 3').
    fn floor(nn: usize, opts: &PlannerOptions, node_rate: f64, m: u64) -> u64 {
        let per = opts.stages_per_node * (nn.saturating_sub(1)).max(1) as f64;
        let by_message = STAGE_MESSAGES * opts.per_message_us * node_rate;
        (m as f64 / per).max(by_message).ceil() as u64
    }

    /// The piece cap of the chunked rotation where [`NodeStages::decompose`]
    /// cuts it (large clusters of switch nodes, no leaves that can bind):
    /// the floor, but no less than `least_piece`; `None` elsewhere.
    /// `line`: the node matrix's largest line sum ([`max_line`]), read
    /// only where the rotation applies.
    pub(crate) fn chunked_cap(
        &self,
        nn: usize,
        line: impl FnOnce() -> u64,
        opts: &PlannerOptions,
    ) -> Option<u64> {
        self.rotates(nn)
            .then(|| Self::floor(nn, opts, self.node_rate, line()).max(self.least_piece))
    }

    /// Whether [`NodeStages::decompose`] cuts the chunked rotation of an
    /// `nn x nn` matrix: on large clusters of switch nodes, without leaves
    /// that can bind.
    pub(crate) fn rotates(&self, nn: usize) -> bool {
        self.leaves.is_none() && !self.mesh && nn >= CHUNKED_ROTATION_NODES
    }

    /// Whether [`StageChains`] rank the rotation against the
    /// decomposition of an `nn x nn` node matrix whose largest line sum
    /// (bytes a node sends or receives) is `critical` (`part`: about one
    /// send per lane, a chunk on each of the node's GPUs; `mesh`: the
    /// node's GPUs are a mesh). The chains run a node's pairs one after
    /// another, a pair starting when both its nodes have finished their
    /// earlier ones. A GPU keeps [`MIN_DEPTH`] sends in flight (sends of
    /// its next pairs among them), so that holds only where a pair is
    /// longer than what a node has in flight:
    /// where the critical line's average pair (its bytes over the `N - 1`
    /// pairs) exceeds `MIN_DEPTH · part`. Shorter pairs are all in flight
    /// at once, the stages overlap, and the chains misprice both lists
    /// (4x8 log-normal 1.0 at 64 KB a pair: the rotation priced 0.95 of
    /// the decomposition ran 9% slower). And only on a switch: the chains
    /// price the NICs, and on a mesh (64 GB/s links against 50 GB/s NICs)
    /// the forwards after the last stage, which differ between the two
    /// lists, do not hide under them (MI300X 4x8 Zipf 0.5 seed 8: priced
    /// 0.965, 1.3% slower). docs/algorithms.md, `fast` (2), "Rotation
    /// stages".
    fn chains_hold(mesh: bool, nn: usize, critical: u64, part: u64) -> bool {
        if mesh || nn < 2 {
            return false;
        }
        critical as f64 / (nn - 1) as f64 > f64::from(MIN_DEPTH) * part as f64
    }
}

/// Bytes/us of one node's NICs together: one NIC's rate times the distinct
/// rails its GPUs use (`Topology::rail_of`).
pub(crate) fn node_rate(topo: &Topology) -> f64 {
    let rails = (0..topo.gpus_per_node())
        .map(|l| topo.rail_of(l))
        .collect::<std::collections::BTreeSet<_>>()
        .len() as f64;
    topo.nic_bandwidth().max(f64::MIN_POSITIVE) * rails
}
