//! `fast`'s emitter: the per-plan state of the planner and the pipeline
//! that turns one traffic matrix into a plan ([`Emitter::plan_into`]):
//! offsets, balancing, scratch layout, stages, then the transfers (the
//! kinds of docs/algorithms.md, `fast`). `crate::planner::Planner` is the
//! public face of this type.

use crate::error::{num, Error, Result};
use crate::plan::{Buffer, Deps, Path, Plan, Transfer};
use crate::sched::fast::balance::{balance_pair, Lane, LaneWeights, Piece};
use crate::sched::fast::mesh::MeshRelief;
use crate::sched::fast::mul_div;
use crate::sched::fast::stages::{Decomposer, StagePair};
use crate::topology::{IntraKind, Topology};
use crate::traffic::TrafficMatrix;

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
}

impl Default for PlannerOptions {
    fn default() -> Self {
        PlannerOptions {
            pipeline_depth: None,
            stages_per_node: 4.0,
            balance: true,
            staged: true,
            chunk_bytes: None,
        }
    }
}

/// `fast`'s planner state for one topology: what [`Emitter::new`] derives
/// from the topology, and the buffers each plan reuses.
#[derive(Clone, Debug)]
pub(crate) struct Emitter {
    opts: PlannerOptions,
    nodes: usize,
    gpus: usize,
    weights: LaneWeights,
    /// GPU `l` sends through its rail NIC `rail[l] = l % nics` (Topology::rail_of).
    rail: Vec<u32>,
    /// Bytes/us of one NIC, and of all the NICs a node uses.
    nic_rate: f64,
    node_rate: f64,
    /// Latency of one inter-node transfer and of one NVLink hop, us.
    inter_latency: f64,
    intra_latency: f64,
    /// Bytes/us of one GPU's NVLink (switch) or one mesh link.
    intra_rate: f64,
    /// The intra-node fabric is a full mesh of point-to-point links: a GPU's
    /// balancing moves are spread over all its links (balance.rs).
    mesh: bool,
    // Per-plan buffers, kept between calls.
    /// `send_off[s * (n + 1) + d]`: offset of block (s, d) in input of s; the
    /// last entry of a row is the row's total.
    send_off: Vec<u64>,
    /// `recv_off[s * n + d]`: offset of block (s, d) in output of d.
    recv_off: Vec<u64>,
    col_acc: Vec<u64>,
    node_bytes: Vec<u64>,
    /// Non-empty blocks between different nodes.
    inter_blocks: u64,
    lanes: Vec<Lane>,
    pieces: Vec<Piece>,
    sent: Vec<u64>,
    targets: Vec<u64>,
    scratch_gather: Vec<u64>,
    decomposer: Decomposer,
    stages: Vec<StagePair>,
    stage_count: u32,
    depth: u32,
    chunk: u64,
    taken: Vec<u64>,
    /// Where each lane's last slice ended (its share of `taken`).
    lane_cut: Vec<u64>,
    /// Inter-node sends of each GPU, per stage slot (second is NONE if one).
    slots: Vec<Vec<[u32; 2]>>,
    /// Inter-node sends into each GPU, per slot (the receive-side chain).
    rslots: Vec<Vec<[u32; 2]>>,
    /// Windows counted in bytes ([`Emitter::window_unit`]): the reference
    /// send, 0 when windows count sends.
    unit: u64,
    /// The sends of the lane slice being emitted, at their nominal size
    /// (before the first-send split and the taper).
    nominal: u64,
    /// With `unit > 0`: running total of the bytes each GPU's slots count
    /// for (`out_bytes`), of those into each GPU (`in_bytes`), and the
    /// sending GPU of each of the latter (`in_from`).
    out_bytes: Vec<Vec<u64>>,
    in_bytes: Vec<Vec<u64>>,
    in_from: Vec<Vec<u32>>,
    /// The last plan was latency-bound ([`Emitter::is_latency_bound`]).
    latency_bound: bool,
    /// The last plan was one merged stage of direct sends (see
    /// [`Emitter::merged`]).
    merged: bool,
    /// Each node sends through one NIC and has at most [`MIN_DEPTH`] peers
    /// (see [`Emitter::merged`]).
    one_nic_few_peers: bool,
    /// Every node pair of the last plan was sent directly (no balancing).
    all_direct: bool,
    /// Last balancing move into each GPU's scratch.
    last_move: Vec<u32>,
    /// Mesh only: the last balancing move over each intra-node link `s → d`
    /// (index `s * g + d % g`) among those that start at once, before the
    /// move gate of `emit_slice` holds them back (see `emit_intra_node`).
    early_move: Vec<u32>,
    /// Switch only: the last of those early moves out of each GPU
    /// (`early_out`) and into each GPU (`early_in`).
    early_out: Vec<u32>,
    early_in: Vec<u32>,
    /// Chunks of the lane slice being emitted.
    chunks: Vec<(u64, u64)>,
    /// The chunks being tapered.
    tail: Vec<(u64, u64)>,
    /// The mesh relief pass (mesh fabrics only).
    relief: MeshRelief,
    /// Index in `stages` of the last pair each node sends (first half) and
    /// receives (second half).
    last_pair: Vec<usize>,
    /// Dependencies being collected for a transfer (direct sends, intra-node
    /// blocks: their slots may be ranges).
    chain_buf: Vec<u32>,
}

const NONE: u32 = u32::MAX;

/// Halvings of each of a lane's last sends (see `Emitter::taper_last_chunks`).
const TAPER_SPLITS: u32 = 2;
/// No tapered send is cut below this many bytes.
const MIN_TAPER_BYTES: u64 = 4096;

/// Fewest sends in flight per GPU (and so into each receiving GPU, whose
/// chain has the same depth). Stages of a coarsened decomposition carry
/// unequal bytes per pair, so nodes drift apart; each send in flight beyond
/// the two the alpha-beta rule needs absorbs some of that drift. Four is the
/// most distinct senders a receiving NIC takes before incast costs
/// throughput (`K` of the congested model, docs/cost-model.md), so the
/// extra depth is free there. Measured on the full bench suite (skewed,
/// full-bisection cases): depth 3 gave median 1.048 and 16x8 log-normal 0.5
/// 5% slower than `direct`; depth 4 median 1.046 and none slower.
const MIN_DEPTH: u32 = 4;

/// A pair goes direct only if its busiest lane carries at most this fraction
/// more than balanced lanes would (measured: 2% keeps 4x8 log-normal at 4 KB
/// per pair at 1.42x the bound, 10% and no limit give 1.49x).
const DIRECT_SLACK: f64 = 0.02;

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
        let nics = topo.nics_per_node().max(1);
        let rails = nics.min(gpus) as f64;
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
            weights: LaneWeights::new(gpus, nics),
            rail: (0..gpus).map(|l| (l % nics) as u32).collect(),
            nic_rate,
            node_rate: nic_rate * rails,
            inter_latency,
            intra_latency,
            intra_rate: topo.intra_bandwidth().max(f64::MIN_POSITIVE),
            mesh: topo.intra_kind() == Some(IntraKind::Mesh),
            send_off: Vec::with_capacity(ranks * (ranks + 1)),
            recv_off: Vec::with_capacity(ranks * ranks),
            col_acc: Vec::with_capacity(ranks),
            node_bytes: Vec::with_capacity(nodes * nodes),
            inter_blocks: 0,
            lanes: Vec::with_capacity(nodes * nodes * gpus),
            pieces: Vec::new(),
            sent: Vec::with_capacity(gpus),
            targets: Vec::with_capacity(gpus),
            scratch_gather: Vec::with_capacity(ranks),
            decomposer: Decomposer::default(),
            stages: Vec::new(),
            stage_count: 0,
            depth: 1,
            chunk: u64::MAX,
            taken: Vec::with_capacity(nodes * nodes),
            lane_cut: Vec::with_capacity(nodes * nodes * gpus),
            slots: vec![Vec::new(); ranks],
            rslots: vec![Vec::new(); ranks],
            unit: 0,
            nominal: 0,
            out_bytes: vec![Vec::new(); ranks],
            in_bytes: vec![Vec::new(); ranks],
            in_from: vec![Vec::new(); ranks],
            latency_bound: false,
            merged: false,
            one_nic_few_peers: nics.min(gpus) == 1 && nodes.saturating_sub(1) <= MIN_DEPTH as usize,
            all_direct: false,
            last_move: Vec::with_capacity(ranks),
            early_move: Vec::new(),
            early_out: Vec::new(),
            early_in: Vec::new(),
            chunks: Vec::new(),
            tail: Vec::new(),
            last_pair: Vec::with_capacity(2 * nodes),
            relief: MeshRelief::default(),
            chain_buf: Vec::new(),
            opts,
        })
    }

    pub(crate) fn options(&self) -> &PlannerOptions {
        &self.opts
    }

    fn ranks(&self) -> usize {
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
        self.offsets(traffic);
        self.stages.clear();
        self.slots.iter_mut().for_each(Vec::clear);
        self.latency_bound = self.opts.staged && self.is_latency_bound();
        self.merged = self.latency_bound || (self.opts.staged && self.one_nic_few_peers);
        let mut emit = Emit::new(&mut out.transfers);
        if self.merged {
            // One merged stage of direct sends: no relay hop, no stage latency.
            self.stage_count = u32::from(self.inter_node_bytes() > 0);
            // Blocks go whole and none waits for another.
            self.chunk = u64::MAX;
            self.depth = u32::MAX;
            self.emit_direct(traffic, &mut emit);
            emit.finish();
            return Ok(());
        }
        self.balance();
        self.layout_scratch(&mut out.scratch);
        self.decompose();
        self.emit_inter_node(&mut emit);
        self.emit_intra_node(traffic, &mut emit);
        emit.finish();
        if self.mesh {
            self.relief
                .relieve(out, self.gpus, self.chunk, &self.early_move);
        }
        Ok(())
    }

    /// True when the exchange is latency-bound: even sent directly, without
    /// balancing, the busiest NIC needs less than one inter-node latency
    /// (beta <= alpha). Then every relay hop and every stage only adds
    /// latency, and incast costs little on so few bytes: the plan merges all
    /// stages into one of direct sends.
    fn is_latency_bound(&self) -> bool {
        if self.nodes < 2 {
            return false;
        }
        let (n, g) = (self.ranks(), self.gpus);
        // Per GPU: bytes it sends to and receives from other nodes; a NIC
        // carries the sum over the GPUs of its rail.
        let (mut busiest_out, mut busiest_in) = (0u64, 0u64);
        for s in 0..n {
            let row = &self.send_off[s * (n + 1)..(s + 1) * (n + 1)];
            let first = s / g * g;
            let out = row[n] - (row[first + g] - row[first]);
            let inn = self.col_acc[s]
                - (first..first + g)
                    .map(|x| self.send_off[x * (n + 1) + s + 1] - self.send_off[x * (n + 1) + s])
                    .sum::<u64>();
            let share = self.weights.sharing[s % g];
            busiest_out = busiest_out.max(out * share);
            busiest_in = busiest_in.max(inn * share);
        }
        // GPUs sharing a rail are taken as equally loaded (an estimate).
        busiest_out.max(busiest_in) as f64 / self.nic_rate <= self.inter_latency
    }

    /// True when the average block between nodes takes at least one
    /// inter-node latency on its NIC. Direct lanes send block by block to
    /// every GPU of the receiving node, so shorter blocks make each send
    /// latency-bound (the chain of sends pays the latency again every
    /// `depth` sends), and merged into one send they fan out to many
    /// receiving NICs at once (incast). Measured on uniform traffic, ratio to
    /// the bound with direct lanes / balanced lanes, 2x8..16x8 (ideal and
    /// congested agree for both): 512 KB per pair 1.000 / 1.004-1.048; 128 KB
    /// 1.011-1.078 / 1.008-1.090; 64 KB 1.23-1.25 / 1.09-1.23; 16 KB
    /// 1.55-1.69 (2.3-2.8 congested) / 1.31-1.39.
    fn blocks_are_long(&self) -> bool {
        let (bytes, blocks) = (self.inter_node_bytes(), self.inter_blocks);
        let lane_rate = self.nic_rate / self.weights.max_sharing() as f64;
        blocks > 0 && bytes as f64 / blocks as f64 >= self.inter_latency * lane_rate
    }

    fn inter_node_bytes(&self) -> u64 {
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
    fn whole_block(&self, s: usize, d: usize, bytes: u64, path: Path, deps: Deps) -> Transfer {
        let n = self.ranks();
        Transfer {
            src: s as u32,
            src_buf: Buffer::Input,
            src_off: self.send_off[s * (n + 1) + d],
            dst: d as u32,
            dst_buf: Buffer::Output,
            dst_off: self.recv_off[s * n + d],
            bytes,
            path,
            step: 0,
            deps,
        }
    }

    /// Every block straight from its source to its destination, at once.
    fn emit_direct(&self, m: &TrafficMatrix, out: &mut Emit) {
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
                out.push(self.whole_block(s, d, bytes, path, Deps::new()));
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

    /// Block offsets of the all-to-all(v) layout, the node matrix and the
    /// count of non-empty blocks between nodes.
    fn offsets(&mut self, m: &TrafficMatrix) {
        let n = self.ranks();
        let (nn, g) = (self.nodes, self.gpus);
        // Every entry of the two offset tables is written below.
        self.send_off.resize(n * (n + 1), 0);
        self.recv_off.resize(n * n, 0);
        self.col_acc.clear();
        self.col_acc.resize(n, 0);
        self.node_bytes.clear();
        self.node_bytes.resize(nn * nn, 0);
        self.inter_blocks = 0;
        for s in 0..n {
            let row = m.row(s);
            let so = &mut self.send_off[s * (n + 1)..(s + 1) * (n + 1)];
            let recv = &mut self.recv_off[s * n..(s + 1) * n];
            // Two passes: the running sum is serial, the column sums are not
            // (this one vectorises).
            let mut acc = 0u64;
            let mut nonzero = 0u64;
            for (&b, off) in row.iter().zip(&mut so[..n]) {
                *off = acc;
                acc += b;
            }
            so[n] = acc;
            for ((&b, at), col) in row.iter().zip(recv).zip(&mut self.col_acc) {
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

    /// Bytes rank `s` sends to node `b`: a contiguous range of its input.
    fn to_node(&self, s: usize, b: usize) -> (u64, u64) {
        let row = &self.send_off[s * (self.ranks() + 1)..];
        (
            row[b * self.gpus],
            row[(b + 1) * self.gpus] - row[b * self.gpus],
        )
    }

    /// Traffic inside a node: one transfer per block. NVLink has the whole
    /// exchange to carry these blocks, but the balancing moves that feed the
    /// first sends must not share it with them. So with stages, block
    /// `(s, d)` waits for the early moves (those of the first sends, which
    /// start at once) that share its NVLink ports: on a switch the last
    /// early move out of `s` and the last into `d` (`early_out`,
    /// `early_in`); on a mesh the early moves over its link `s → d`
    /// (`early_move`), where the link is hardly faster than a NIC and a hot
    /// GPU's big block took half of it while the moves crawled behind (4x8
    /// MI300X intra-skew 1.2: moves at 21-32 GB/s of 64, a carrier's NIC
    /// idle for 150 us, 1.118 of the bound; 1.068 with the wait, 1.060 when
    /// the relief pass's relays wait too, on their first hop).
    ///
    /// Blocks used to wait for their GPU's whole first inter-node send as
    /// well. With few sends per GPU (64 KB pairs) that send ends near the
    /// end of the exchange, and on big nodes the hot GPU's NVLink ingress
    /// then carried its node's blocks and the forwards of the last stages at
    /// once: 4x72 Zipf 1.0 1.411 -> 1.128 of the bound without that wait,
    /// 8x16 Zipf 1.0 1.179 -> 1.054, MI300X 2x8 intra-skew 1.2 at 64 KB
    /// 2.093 -> 1.579 (docs/algorithms.md, section 3).
    fn emit_intra_node(&mut self, m: &TrafficMatrix, out: &mut Emit) {
        let (n, g) = (self.ranks(), self.gpus);
        let mut ids = std::mem::take(&mut self.chain_buf);
        for s in 0..n {
            let first = s / g * g;
            for d in first..first + g {
                let bytes = m.get(s, d);
                if bytes == 0 {
                    continue;
                }
                ids.clear();
                if s != d {
                    if let Some(&mv) = self.early_move.get(s * g + d - first) {
                        add_op(&mut ids, mv);
                    }
                    if let (Some(&o), Some(&i)) = (self.early_out.get(s), self.early_in.get(d)) {
                        add_op(&mut ids, o);
                        add_op(&mut ids, i);
                    }
                }
                let path = if s == d { Path::Local } else { Path::Nvlink };
                out.push(self.whole_block(s, d, bytes, path, deps_of(&ids)));
            }
        }
        self.chain_buf = ids;
    }

    fn lane_index(&self, a: usize, b: usize, l: usize) -> usize {
        (a * self.nodes + b) * self.gpus + l
    }

    /// Balances every node pair (module [`crate::sched::fast::balance`]).
    fn balance(&mut self) {
        let (nn, g) = (self.nodes, self.gpus);
        self.lanes.clear();
        self.lanes.resize(nn * nn * g, Lane::default());
        self.pieces.clear();
        // A move is worth it when it saves more than the extra NVLink hop costs.
        let min_gain = if self.opts.balance {
            self.intra_latency
        } else {
            f64::INFINITY
        };
        // Direct sends only when every pair qualifies: a direct pair's lanes
        // are not rail-aligned, and next to balanced pairs (pipelined into
        // the same NICs) they made incast (congested 4x8 hotspot: 1.03x ->
        // 1.11x the bound). Only with stages: `spray` sent directly is
        // `direct` (congested uniform 4x8: 2.49x instead of 1.10x).
        let mut all_direct = self.opts.balance && self.opts.staged && self.blocks_are_long();
        'pairs: for a in 0..nn {
            for b in (0..nn).filter(|&b| b != a) {
                if !all_direct {
                    break 'pairs;
                }
                self.sent.clear();
                for l in 0..g {
                    let x = self.to_node(a * g + l, b).1;
                    self.sent.push(x);
                }
                all_direct =
                    self.sent.iter().all(|&x| x == 0) || self.direct_is_enough(a, b, min_gain);
            }
        }
        self.all_direct = all_direct;
        for a in 0..nn {
            for b in 0..nn {
                if a == b {
                    continue;
                }
                self.sent.clear();
                for l in 0..g {
                    let x = self.to_node(a * g + l, b).1;
                    self.sent.push(x);
                }
                let at = self.lane_index(a, b, 0);
                if all_direct {
                    for (l, lane) in self.lanes[at..at + g].iter_mut().enumerate() {
                        *lane = Lane {
                            own: self.sent[l],
                            pieces_start: self.pieces.len() as u32,
                            pieces_end: self.pieces.len() as u32,
                            direct: true,
                            ..Lane::default()
                        };
                    }
                    continue;
                }
                balance_pair(
                    &self.sent,
                    (a * g) as u32,
                    &self.weights,
                    self.nic_rate,
                    min_gain,
                    self.mesh,
                    &mut self.lanes[at..at + g],
                    &mut self.pieces,
                    &mut self.targets,
                );
            }
        }
    }

    /// True when sending pair (a, b) directly, block by block from source
    /// GPU to destination GPU, loads its busiest sending and receiving lane
    /// (NIC) at most `min_gain` us and at most [`DIRECT_SLACK`] more than
    /// balancing it would: then the relay hop and forward of balancing cost
    /// more than they save (alpha-beta, as (2) in docs/algorithms.md; the
    /// relative slack because a pair's excess is paid again in every stage
    /// it spans). `self.sent` holds what each GPU of `a` sends to `b`.
    fn direct_is_enough(&self, a: usize, b: usize, min_gain: f64) -> bool {
        let (n, g) = (self.ranks(), self.gpus);
        let total: u64 = self.sent.iter().sum();
        if total == 0 {
            return false;
        }
        let share = |l: usize| self.weights.sharing[l];
        // Balanced, lane l carries its target: at best total / R per rail.
        let mut balanced = 0u64;
        let mut prev = 0u64;
        for l in 0..g {
            let at = self.weights.upto(total, l + 1);
            balanced = balanced.max((at - prev) * share(l));
            prev = at;
        }
        let mut worst = 0u64;
        for l in 0..g {
            worst = worst.max(self.sent[l] * share(l));
            let d = b * g + l;
            let inn: u64 = (a * g..(a + 1) * g)
                .map(|s| self.send_off[s * (n + 1) + d + 1] - self.send_off[s * (n + 1) + d])
                .sum();
            worst = worst.max(inn * share(l));
        }
        let excess = (worst - balanced.min(worst)) as f64;
        excess / self.nic_rate <= min_gain && excess <= DIRECT_SLACK * balanced as f64
    }

    /// Scratch of each GPU: its gather regions (one per destination node),
    /// then its landing regions (one per source node).
    fn layout_scratch(&mut self, scratch: &mut Vec<u64>) {
        let (nn, g) = (self.nodes, self.gpus);
        // Both passes walk the lanes in memory order, (a, b, l), with one
        // running offset per GPU: the gather regions of GPU (a, l) in the
        // order of b, the landing regions of GPU (b, l) in the order of a.
        self.scratch_gather.clear();
        self.scratch_gather.resize(self.ranks(), 0);
        let rows = self.lanes.chunks_exact_mut(nn * g);
        for (row, gather) in rows.zip(self.scratch_gather.chunks_exact_mut(g)) {
            for pair in row.chunks_exact_mut(g) {
                for (lane, at) in pair.iter_mut().zip(gather.iter_mut()) {
                    lane.gather_base = *at;
                    *at += lane.gathered;
                }
            }
        }
        scratch.clear();
        scratch.extend_from_slice(&self.scratch_gather);
        for row in self.lanes.chunks_exact_mut(nn * g) {
            for (lane, at) in row.iter_mut().zip(scratch.iter_mut()) {
                lane.recv_base = *at;
                if !lane.direct {
                    *at += lane.len();
                }
            }
        }
        if scratch.iter().all(|&at| at == 0) {
            scratch.clear();
        }
    }

    /// Stages (or one stage of everything for `spray`) and the pipeline depth.
    fn decompose(&mut self) {
        self.stages.clear();
        let nn = self.nodes;
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
            return;
        }
        let per = self.opts.stages_per_node * (nn.saturating_sub(1)).max(1) as f64;
        self.stage_count = self.decomposer.decompose(
            nn,
            &self.node_bytes,
            |m| (m as f64 / per).ceil() as u64,
            &mut self.stages,
        );
        self.decomposer
            .order_light_first(&mut self.stages, 0, self.stage_count);
    }

    /// The NIC-cut time of the exchange: the busiest node's inter-node bytes
    /// (sent or received) over all its rails, us.
    fn exchange_us(&self) -> f64 {
        let nn = self.nodes;
        let max_line = (0..nn)
            .map(|a| {
                let (row, col) = (0..nn).fold((0, 0), |(r, c), b| {
                    (
                        r + self.node_bytes[a * nn + b],
                        c + self.node_bytes[b * nn + a],
                    )
                });
                let own = self.node_bytes[a * nn + a];
                (row - own).max(col - own)
            })
            .max()
            .unwrap_or(0);
        max_line as f64 / self.node_rate
    }

    /// Chunk size: the un-overlapped NVLink hop before the first chunk and
    /// after the last should cost about half a percent of the whole exchange
    /// (`M / node_rate`), and a chunk should take a few latencies on its NIC so
    /// that the pipeline hides them (`bounds`: [`Emitter::chunk_bounds`]).
    fn chunk_size(&self, (by_hop, by_latency): (f64, f64)) -> u64 {
        if let Some(c) = self.opts.chunk_bytes {
            return c.max(1);
        }
        by_hop.max(by_latency).max(1.0) as u64
    }

    /// The two lower bounds on the chunk size (bytes): by the NVLink hop
    /// (half a percent of the exchange) and by the latency (four inter-node
    /// latencies on a lane).
    fn chunk_bounds(&self) -> (f64, f64) {
        let lane_rate = self.nic_rate / self.weights.max_sharing() as f64;
        (
            0.005 * self.exchange_us() * self.intra_rate,
            4.0 * self.inter_latency * lane_rate,
        )
    }

    /// The reference send of windows counted in bytes, or 0 when windows
    /// count sends. A chain's window is `depth` sends, which holds
    /// `depth` sends' worth of bytes only when they are of about one size.
    /// Where a node pair's slice of a stage is light, its one short send
    /// takes a whole place in the window of its GPU and of its receiver,
    /// the NIC runs below its rate until the window moves on, and the line
    /// that binds the exchange loses that time. Counted in bytes, the
    /// window looks back past such light sends (never stopping short of
    /// `depth` sends back): a send waits for the send after which the
    /// window holds `depth - 1` reference sends (to within 1/8). Each send
    /// counts its nominal size (its slice over its chunks, before the
    /// first-send split and the taper), at most the reference. The
    /// reference is the nominal send of a stage pair of average bytes.
    ///
    /// The look-back stops `2 depth` slots back, which bounds its cost.
    ///
    /// Kept to exchanges whose chunks are set by the latency bound
    /// (sends a few latencies long, decode-size exchanges) and to one GPU
    /// per NIC. Measured (docs/algorithms.md, section 3): DGX-H100 2-16
    /// nodes, 7 patterns, 2 seeds, at 64 KB per pair 25 of 56 cases better
    /// by more than 1% and 2 worse (geometric mean -1.8%, up to -13% at
    /// 2x8); MI300X 2-8 nodes 22 better and 3 worse (-2.5%). With larger
    /// chunks (256 KB-1 MB per pair) it moved as many cases up as down
    /// and cost the congested model up to 4% (more senders per receiver);
    /// with NICs shared by several GPUs, whose other lanes fill a light
    /// send's gap, it made 4x72 with 18 NICs up to 13% slower.
    ///
    /// `bounds`: [`Emitter::chunk_bounds`].
    fn window_unit(&self, (by_hop, by_latency): (f64, f64)) -> u64 {
        if !self.opts.staged || self.depth == u32::MAX || self.weights.max_sharing() > 1 {
            return 0;
        }
        if by_hop >= by_latency {
            return 0;
        }
        let moved: u64 = self.stages.iter().map(|p| p.bytes).sum();
        let sends = self.stages.len() as u64 * self.gpus as u64;
        let share = moved.checked_div(sends).unwrap_or(0);
        if share == 0 {
            return 0;
        }
        share / share.div_ceil(self.chunk)
    }

    /// The slot of GPU `c`'s chain its next send waits for, if any.
    fn sender_wait(&self, c: usize, depth: usize) -> Option<usize> {
        if self.unit == 0 {
            return self.slots[c].len().checked_sub(depth);
        }
        window_start(&self.out_bytes[c], depth, self.unit)
    }

    /// The slot of GPU `r`'s receive chain the next send into it (from GPU
    /// `c`) waits for, if any. Counted in bytes, the window also holds at
    /// most `depth` distinct senders, as one of `depth` sends does: more
    /// than four sending NICs at one receiver is incast (docs/cost-model.md).
    fn receiver_wait(&self, r: usize, c: usize, depth: usize) -> Option<usize> {
        if self.unit == 0 {
            return self.rslots[r].len().checked_sub(depth);
        }
        receive_window_start(
            &self.in_bytes[r],
            &self.in_from[r],
            c as u32,
            depth,
            self.unit,
        )
    }

    /// Records a send of GPU `c` into GPU `r` in the byte-counted windows.
    fn count_send(&mut self, c: usize, r: usize) {
        if self.unit == 0 {
            return;
        }
        let bytes = self.nominal.min(self.unit);
        for cum in [&mut self.out_bytes[c], &mut self.in_bytes[r]] {
            let total = cum.last().copied().unwrap_or(0) + bytes;
            cum.push(total);
        }
        self.in_from[r].push(c as u32);
    }

    /// Sends in flight per GPU: enough that one send's transfer time covers
    /// the next one's latency (alpha-beta: `ceil(alpha / beta)` with beta the
    /// time of an average send on its NIC), plus two: one in transfer, one to
    /// absorb the jitter between the sending and the receiving chain.
    /// Tiny, latency-bound sends get a deep pipeline, i.e. the stages merge;
    /// large ones keep [`MIN_DEPTH`] in flight.
    fn depth_for_chunks(&self) -> u32 {
        if !self.opts.staged {
            return u32::MAX;
        }
        if let Some(d) = self.opts.pipeline_depth {
            return d.max(1);
        }
        let moved: u64 = self.stages.iter().map(|p| p.bytes).sum();
        let pairs = self.stages.len().max(1) as f64;
        let lane_share = moved as f64 / pairs / self.gpus as f64;
        let send = lane_share.min(self.chunk as f64);
        let lane_rate = self.nic_rate / self.weights.max_sharing() as f64;
        let beta = send / lane_rate;
        if beta <= 0.0 {
            return u32::MAX;
        }
        // Direct sends (every pair balanced already) whose stages move
        // equal bytes per pair: nothing drifts, and the extra send in
        // flight only reaches into the next stage's NICs (uniform 16x8:
        // 1.000 at depth 3, 1.021 at 4). With a single stage there is no
        // next stage, and the fourth send hides more latency (uniform 2x8:
        // 1.015 -> 1.004). Direct is not enough: with one GPU per node every
        // pair is direct, skewed or not, and there the stages drift (8x1
        // log-normal 0.5: 1.143 at depth 3, 1.045 at 4).
        let least = if self.all_direct && self.stage_count > 1 && self.stages_are_even() {
            3.0
        } else {
            MIN_DEPTH as f64
        };
        (2.0 + (self.inter_latency / beta).ceil()).clamp(least, 1e6) as u32
    }

    /// True when the pairs of every stage carry the same bytes, to within
    /// 1/64 (uniform traffic): then no node finishes a stage early.
    fn stages_are_even(&self) -> bool {
        self.stages
            .chunk_by(|x, y| x.stage == y.stage)
            .all(|stage| {
                let (lo, hi) = stage.iter().fold((u64::MAX, 0), |(lo, hi), p| {
                    (lo.min(p.bytes), hi.max(p.bytes))
                });
                hi - lo <= hi / 64
            })
    }

    fn emit_inter_node(&mut self, out: &mut Emit) {
        let nn = self.nodes;
        // The chunk size and the window unit both follow from them.
        let bounds = self.chunk_bounds();
        self.chunk = self.chunk_size(bounds);
        self.depth = self.depth_for_chunks();
        self.taken.clear();
        self.taken.resize(nn * nn, 0);
        self.lane_cut.clear();
        self.lane_cut.resize(self.lanes.len(), 0);
        for s in self.slots.iter_mut().chain(&mut self.rslots) {
            s.clear();
        }
        for s in self.out_bytes.iter_mut().chain(&mut self.in_bytes) {
            s.clear();
        }
        self.in_from.iter_mut().for_each(Vec::clear);
        self.unit = self.window_unit(bounds);
        self.last_move.clear();
        self.last_move.resize(self.ranks(), NONE);
        self.early_move.clear();
        self.early_out.clear();
        self.early_in.clear();
        if self.opts.staged {
            if self.mesh {
                self.early_move.resize(self.ranks() * self.gpus, NONE);
            } else {
                self.early_out.resize(self.ranks(), NONE);
                self.early_in.resize(self.ranks(), NONE);
            }
        }
        // The last pair each node sends and receives: their final chunks taper.
        self.last_pair.clear();
        self.last_pair.resize(2 * nn, usize::MAX);
        for (i, p) in self.stages.iter().enumerate() {
            self.last_pair[p.src_node as usize] = i;
            self.last_pair[nn + p.dst_node as usize] = i;
        }
        for i in 0..self.stages.len() {
            let p = self.stages[i];
            let (a, b) = (p.src_node as usize, p.dst_node as usize);
            let taper = self.last_pair[a] == i || self.last_pair[nn + b] == i;
            let before = self.taken[a * nn + b];
            let after = before + p.bytes;
            self.taken[a * nn + b] = after;
            let total = self.node_bytes[a * nn + b];
            for l in 0..self.gpus {
                let li = self.lane_index(a, b, l);
                let (len, direct) = (self.lanes[li].len(), self.lanes[li].direct);
                // Bytes `before..after` of the pair, pro rata on the lane:
                // the lane's cut of `before` is where its previous slice ended.
                let from = self.lane_cut[li];
                let to = if after == total {
                    len
                } else {
                    mul_div(after, len, total)
                };
                self.lane_cut[li] = to;
                let c = a * self.gpus + l;
                let row = c * (self.ranks() + 1) + b * self.gpus;
                let direct_row = direct.then_some(row);
                // On a mesh, a lane that carries only its own bytes ends its
                // slice on the block for its own receiving GPU (see
                // `cut_chunks`).
                let lane = &self.lanes[li];
                let own_block = (self.mesh && !direct && lane.gathered == 0).then(|| {
                    let start = self.send_off[row];
                    (
                        self.send_off[row + l] - start,
                        (self.send_off[row + l + 1] - start).min(lane.own),
                    )
                });
                if self.unit > 0 && to > from {
                    self.nominal = (to - from) / (to - from).div_ceil(self.chunk);
                }
                self.cut_chunks(c, l, from, to, direct_row, own_block);
                if taper && direct_row.is_none() {
                    self.taper_last_chunks();
                }
                for k in 0..self.chunks.len() {
                    let (lo, hi) = self.chunks[k];
                    self.emit_slice(out, li, (a, b, l), lo, hi, p.stage);
                }
            }
        }
    }

    /// Cuts each of the last sends of a lane's final slice, as many as the
    /// lane has in flight (`depth`; one for `spray`, which has no chains),
    /// into halves, quarters, ... ([`TAPER_SPLITS`] times). The last chunks
    /// to land are forwarded over NVLink after every NIC has finished, and
    /// the lanes' last chunks often carry bytes for the same hot GPU (2x8
    /// hotspot: eight 574 KB forwards into one GPU, a 10 us tail); smaller
    /// last chunks shorten that tail. With `depth` sends in flight the last
    /// `depth` sends end together, so each of them is cut, not only the
    /// last (MI300X 4x8 Zipf 1.0: the final stage's full-size sends landed
    /// 12 us before the end and their forwards into the hot GPU made the
    /// tail). Measured on the bench suite's skewed full-bisection cases:
    /// the last send only, against none, median 1.047 -> 1.044 (8x8 hotspot
    /// 1.097 -> 1.049); the last `depth` sends against the last one, median
    /// 1.038 -> 1.032, mean 1.042 -> 1.040; over DGX-H100 4-16 nodes and
    /// MI300X 2-8 nodes, 9 patterns, 2 seeds, default and 64 KB pairs, 24
    /// cases better by more than 1% and 6 worse (a few cases move by ±1.5%
    /// either way, as any change of the send order does).
    // Cold (once per lane); out of line so that it does not crowd
    // emit_inter_node's registers.
    #[inline(never)]
    fn taper_last_chunks(&mut self) {
        let k = if self.depth == u32::MAX {
            1
        } else {
            self.depth as usize
        };
        let k = k.min(self.chunks.len());
        self.tail.clear();
        let at = self.chunks.len() - k;
        self.tail.extend(self.chunks.drain(at..));
        for &(lo, hi) in &self.tail {
            let mut at = lo;
            for _ in 0..TAPER_SPLITS {
                let half = (hi - at) / 2;
                if half < MIN_TAPER_BYTES {
                    break;
                }
                self.chunks.push((at, at + half));
                at += half;
            }
            self.chunks.push((at, hi));
        }
    }

    /// Cuts bytes `from..to` of lane `l` (GPU `c`) into sends of at most a
    /// chunk, in the order they go. A direct lane (`direct_row`: where its
    /// row range for the destination node starts in `send_off`) starts at
    /// its block for GPU `l`, then `l + 1`, ... (wrapping): the lanes of a
    /// pair send into different GPUs (and NICs) at any time. Its sends are
    /// cut at block boundaries, but adjacent latency-bound blocks go as one
    /// send (a slot of several transfers). Inlined into its one caller:
    /// called apart it cost 1.5% of a plan's instructions at 8x8.
    ///
    /// `own_block` (mesh lanes that carry no moved bytes) is the range of
    /// the lane's bytes for its own receiving GPU. When the slice holds
    /// some of them, its chunks start at the last chunk that ends inside
    /// the range (or the one holding the range's end, if none does) and
    /// wrap, so the slice's last sends carry them. Those need no forward,
    /// while on a mesh the forwards after a lane's last sends all cross one
    /// 64 GB/s link (MI300X 2x8 Zipf 1.2: three 0.57 MB chunks for the hot
    /// GPU landed at once on one carrier, and their forwards ended 25 us
    /// after the NICs; 1.119 -> 1.075 of the bound). Lanes with moved bytes
    /// keep their order: started mid-stream, their first sends waited for
    /// moves (2x8 intra-skew 1.2: 1.130 -> 1.379).
    #[inline(always)]
    fn cut_chunks(
        &mut self,
        c: usize,
        l: usize,
        from: u64,
        to: u64,
        direct_row: Option<usize>,
        own_block: Option<(u64, u64)>,
    ) {
        self.chunks.clear();
        if from >= to {
            return;
        }
        let chunk = self.chunk;
        let split = |chunks: &mut Vec<(u64, u64)>, lo: u64, hi: u64| {
            let parts = (hi - lo).div_ceil(chunk);
            let at = |k: u64| lo + mul_div(hi - lo, k, parts);
            chunks.extend((0..parts).map(|k| (at(k), at(k + 1))));
        };
        if let Some(row) = direct_row {
            let (g, base) = (self.gpus, self.send_off[row]);
            // Blocks merge into one send while it stays latency-bound (under
            // half an inter-node latency on its NIC): merging saves latencies,
            // and so few bytes cost nothing at the receivers they share.
            let lane_rate = self.nic_rate / self.weights.max_sharing() as f64;
            let merge_below = ((0.5 * self.inter_latency * lane_rate) as u64).min(chunk);
            let mut pending = (0u64, 0u64);
            for k in 0..g {
                let j = (l + k) % g;
                let (b0, b1) = (
                    self.send_off[row + j] - base,
                    self.send_off[row + j + 1] - base,
                );
                let (lo, hi) = (from.max(b0), to.min(b1));
                if lo >= hi {
                    continue;
                }
                if pending.0 < pending.1 && pending.1 == lo && hi - pending.0 <= merge_below {
                    pending.1 = hi;
                    continue;
                }
                if pending.0 < pending.1 {
                    split(&mut self.chunks, pending.0, pending.1);
                }
                pending = (lo, hi);
            }
            if pending.0 < pending.1 {
                split(&mut self.chunks, pending.0, pending.1);
            }
        } else if to - from <= chunk {
            self.chunks.push((from, to));
        } else {
            // Lanes start at different chunks, so their last chunks (and the
            // forwards that follow them) go to different GPUs: the chunks of
            // `split`, rotated left by `first`.
            let parts = (to - from).div_ceil(chunk);
            let at = |k: u64| from + mul_div(to - from, k, parts);
            let mut first = l as u64 * parts / self.gpus as u64;
            if let Some((b0, b1)) = own_block {
                let (x0, x1) = (b0.max(from), b1.min(to));
                if x0 < x1 {
                    // The chunk holding byte x1 - 1: at(k) <= x1 - 1 < at(k + 1).
                    let x = x1 - 1;
                    let mut k = mul_div(x - from, parts, to - from).min(parts - 1);
                    while k > 0 && at(k) > x {
                        k -= 1;
                    }
                    while k + 1 < parts && at(k + 1) <= x {
                        k += 1;
                    }
                    // The chunk holding the range's last byte, or the one
                    // before it if it runs past the range: a GPU's first
                    // chunk is halved and its second half sent last, so
                    // the last bytes sent are then the range's.
                    if k > 0 && at(k) > x0 && at(k + 1) > x1 {
                        k -= 1;
                    }
                    first = k;
                }
            }
            let mut lo = at(first);
            for k in (first + 1..=parts).chain(1..=first) {
                let hi = if k == parts { to } else { at(k) };
                self.chunks.push((lo, hi));
                lo = if k == parts { from } else { hi };
            }
        }
        let parts = self.chunks.len();
        // A GPU's first send is cut in two, the halves going first and last:
        // with several sends in flight, a first send shorter than the next
        // staggers them, so one's latency overlaps another's transfer
        // instead of all starting (and waiting) in lockstep.
        if self.slots[c].is_empty() && self.depth >= 2 && self.depth != u32::MAX && parts >= 2 {
            let (lo, hi) = self.chunks[0];
            let mid = lo + (hi - lo) / 2;
            self.chunks[0] = (lo, mid);
            self.chunks.push((mid, hi));
        }
    }

    /// How many sends before its own a send's balancing moves may start:
    /// as the GPU's previous send starts (`depth + 1`) on a switch; a whole
    /// window earlier (`2 depth + 1`) on a mesh. There a carrier's moves
    /// from one GPU cross the one link between them, hardly faster than the
    /// NIC (MI300X: 64 against 50 GB/s) and shared with that GPU's
    /// intra-node blocks and forwards, so just-in-time moves fell behind
    /// the sends that carry them (4x8 MI300X intra-skew 1.2: the first
    /// moves ran at 20-30 GB/s and a NIC idled for 55 us). Measured on
    /// MI300X 2-8 nodes, 9 patterns, 2 seeds, default and 64 KB pairs,
    /// stages ordered light first: 16 of 108 cases better by more than 1%
    /// and one worse (8x8 log-normal 0.5 at 64 KB: 1.255 -> 1.275); the
    /// bench suite's MI300X intra-skew 1.180 -> 1.117. On a switch (DGX-H100) the longer lead moved cases by 1-2%
    /// either way (suite median 1.047 -> 1.046, 2x8 log-normal 1.0 1.027
    /// -> 1.044), so it is kept to meshes.
    fn move_lead(&self, depth: usize) -> usize {
        if self.mesh {
            depth.saturating_mul(2).saturating_add(1)
        } else {
            depth.saturating_add(1)
        }
    }

    /// The sends of bytes `from..to` of lane `l` of pair (a, b) (index `li`
    /// in `lanes`) in stage `stage`, the balancing moves they need first,
    /// and the forwards after.
    #[allow(clippy::too_many_arguments)]
    fn emit_slice(
        &mut self,
        out: &mut Emit,
        li: usize,
        (a, b, l): (usize, usize, usize),
        from: u64,
        to: u64,
        stage: u32,
    ) {
        let g = self.gpus;
        let (c, r) = (a * g + l, b * g + l);
        let lane = self.lanes[li];
        if lane.direct {
            self.emit_direct_slice(out, a, b, l, from, to, stage);
            return;
        }
        let slot = self.slots[c].len();
        let depth = self.depth as usize;
        // The slots of a balanced lane hold one or two sends (never a range:
        // lanes are all direct or none are).
        let mut chain = FewIds::default();
        let mut gate = FewIds::default();
        let lead = self.move_lead(depth);
        if self.opts.staged {
            if let Some(j) = self.sender_wait(c, depth) {
                chain.add_ops(self.slots[c][j]);
            }
            // The receiving NIC too takes one stage at a time: a sender that
            // runs ahead (its previous pair was light) waits rather than
            // joining another sender at its next receiver (incast).
            if let Some(j) = self.receiver_wait(r, c, depth) {
                chain.add_ops(self.rslots[r][j]);
            }
            // Moves for this slot start as the previous slot starts; on a
            // mesh, a window earlier (see `move_lead`).
            if slot >= lead {
                gate.add_ops(self.slots[c][slot - lead]);
            }
        }
        let path = Path::Rdma { nic: self.rail[l] };
        let mut ops = [NONE; 2];
        if from < lane.own {
            let end = to.min(lane.own);
            let base = self.send_off[c * (self.ranks() + 1) + b * g];
            ops[0] = out.push(Transfer {
                src: c as u32,
                src_buf: Buffer::Input,
                src_off: base + from,
                dst: r as u32,
                dst_buf: Buffer::Scratch,
                dst_off: lane.recv_base + from,
                bytes: end - from,
                path,
                step: stage,
                deps: chain.deps(),
            });
        }
        if to > lane.own {
            let (g0, g1) = (from.max(lane.own) - lane.own, to - lane.own);
            let mut deps = chain.deps();
            let mut last_move = self.last_move[c];
            let pieces = &self.pieces[lane.pieces_start as usize..lane.pieces_end as usize];
            // Each send moves just the part of each piece it carries: a
            // piece can be most of a lane's share, and moved whole it kept
            // the carrier's NIC idle until all of it had arrived (2x8
            // intra-skew: 1.43x -> 1.04x the bound).
            for (piece, p0, lo, hi) in clip_pieces(pieces, g0, g1) {
                let (base, _) = self.to_node(piece.src as usize, b);
                // A carrier's moves arrive in the order its sends use
                // them, so the first send's bytes do not share NVLink
                // with moves needed much later.
                let mut move_deps = gate;
                if self.opts.staged {
                    move_deps.add(last_move);
                }
                let idx = out.push(Transfer {
                    src: piece.src,
                    src_buf: Buffer::Input,
                    src_off: base + piece.row_off + (lo - p0),
                    dst: c as u32,
                    dst_buf: Buffer::Scratch,
                    dst_off: lane.gather_base + lo,
                    bytes: hi - lo,
                    path: Path::Nvlink,
                    step: stage,
                    deps: move_deps.deps(),
                });
                last_move = idx;
                if slot < lead {
                    if !self.early_move.is_empty() {
                        self.early_move[piece.src as usize * g + l] = idx;
                    } else if !self.early_out.is_empty() {
                        self.early_out[piece.src as usize] = idx;
                        self.early_in[c] = idx;
                    }
                }
                deps.push(idx);
            }
            self.last_move[c] = last_move;
            ops[1] = out.push(Transfer {
                src: c as u32,
                src_buf: Buffer::Scratch,
                src_off: lane.gather_base + g0,
                dst: r as u32,
                dst_buf: Buffer::Scratch,
                dst_off: lane.recv_base + lane.own + g0,
                bytes: g1 - g0,
                path,
                step: stage,
                deps,
            });
        }
        self.slots[c].push(ops);
        self.rslots[r].push(ops);
        self.count_send(c, r);
        if ops[0] != NONE {
            self.emit_forwards(out, &lane, a, b, l, from, to.min(lane.own), ops[0], stage);
        }
        if ops[1] != NONE {
            self.emit_forwards(out, &lane, a, b, l, from.max(lane.own), to, ops[1], stage);
        }
    }

    /// The sends of bytes `from..to` of GPU `l` of node `a`'s row range for
    /// node `b`, sent directly: one transfer per destination block, straight
    /// into the outputs. They form one slot of the sender's chain and one of
    /// the chain of GPU `l` of `b`, as the balanced lane's send would.
    #[allow(clippy::too_many_arguments)]
    #[inline(never)]
    fn emit_direct_slice(
        &mut self,
        out: &mut Emit,
        a: usize,
        b: usize,
        l: usize,
        from: u64,
        to: u64,
        stage: u32,
    ) {
        let (n, g) = (self.ranks(), self.gpus);
        let c = a * g + l;
        let depth = self.depth as usize;
        // The chains are those of the balanced lane (GPU `l` of `b` stands
        // for the receiving node's lane), so stages keep their order.
        let r = b * g + l;
        let mut chain = std::mem::take(&mut self.chain_buf);
        chain.clear();
        if self.opts.staged {
            if let Some(j) = self.sender_wait(c, depth) {
                add_ops(&mut chain, self.slots[c][j]);
            }
            if let Some(j) = self.receiver_wait(r, c, depth) {
                add_ops(&mut chain, self.rslots[r][j]);
            }
        }
        let path = Path::Rdma { nic: self.rail[l] };
        let row = c * (n + 1) + b * g;
        let base = self.send_off[row];
        let first = out.len() as u32;
        for j in 0..g {
            let (b0, b1) = (
                self.send_off[row + j] - base,
                self.send_off[row + j + 1] - base,
            );
            if b1 <= from || b0 == b1 {
                continue;
            }
            if b0 >= to {
                break;
            }
            let (lo, hi) = (from.max(b0), to.min(b1));
            let d = b * g + j;
            out.push(Transfer {
                src: c as u32,
                src_buf: Buffer::Input,
                src_off: base + lo,
                dst: d as u32,
                dst_buf: Buffer::Output,
                dst_off: self.recv_off[c * n + d] + (lo - b0),
                bytes: hi - lo,
                path,
                step: stage,
                deps: deps_of(&chain),
            });
        }
        self.chain_buf = chain;
        let last = out.len() as u32;
        if last == first {
            return;
        }
        let ops = [first, (last - 1) | RANGE];
        self.slots[c].push(ops);
        self.rslots[r].push(ops);
        self.count_send(c, r);
    }

    /// Copies bytes `from..to` of a lane's stream, landed in the receiver's
    /// scratch by transfer `landed`, to their places in the outputs. The
    /// stream is the carrier's own head, then the pieces in order.
    #[allow(clippy::too_many_arguments)]
    // Inlined into emit_slice (twice): measured 1.4% fewer instructions
    // per plan at 8x8 than the compiler's choice.
    #[inline(always)]
    fn emit_forwards(
        &self,
        out: &mut Emit,
        lane: &Lane,
        a: usize,
        b: usize,
        l: usize,
        from: u64,
        to: u64,
        landed: u32,
        stage: u32,
    ) {
        let g = self.gpus;
        let r = b * g + l;
        if from < lane.own {
            let hi = to.min(lane.own);
            self.forward_blocks(
                out,
                a * g + l,
                b,
                r,
                from,
                hi,
                lane.recv_base + from,
                landed,
                stage,
            );
        }
        if to <= lane.own {
            return;
        }
        let pieces = &self.pieces[lane.pieces_start as usize..lane.pieces_end as usize];
        for (piece, p0, lo, hi) in clip_pieces(pieces, from.max(lane.own) - lane.own, to - lane.own)
        {
            // Row range of the piece's source covered by lo..hi.
            let (u, v) = (piece.row_off + (lo - p0), piece.row_off + (hi - p0));
            self.forward_blocks(
                out,
                piece.src as usize,
                b,
                r,
                u,
                v,
                lane.recv_base + lane.own + lo,
                landed,
                stage,
            );
        }
    }

    /// Forwards row range `u..v` of what rank `s` sends to node `b`, sitting
    /// at `scratch_off` of rank `r`, block by block. The hot loop of the
    /// planner: most transfers of a plan are forwards.
    #[allow(clippy::too_many_arguments)]
    fn forward_blocks(
        &self,
        out: &mut Emit,
        s: usize,
        b: usize,
        r: usize,
        u: u64,
        v: u64,
        scratch_off: u64,
        landed: u32,
        stage: u32,
    ) {
        let (n, g) = (self.ranks(), self.gpus);
        let row = &self.send_off[s * (n + 1) + b * g..][..=g];
        let recv = &self.recv_off[s * n + b * g..][..g];
        // Absolute offsets in the input of `s`; the first block that ends
        // after `u`.
        let (u, v) = (row[0] + u, row[0] + v);
        let mut j = 0;
        while j < g && row[j + 1] <= u {
            j += 1;
        }
        // The write position in a local, not stored back per transfer.
        let Emit { transfers, len } = out;
        let mut at = *len;
        while j < g {
            let (b0, b1) = (row[j], row[j + 1]);
            if b0 >= v {
                break;
            }
            if b0 < b1 {
                let (lo, hi) = (u.max(b0), v.min(b1));
                let d = b * g + j;
                let t = Transfer {
                    src: r as u32,
                    src_buf: Buffer::Scratch,
                    src_off: scratch_off + (lo - u),
                    dst: d as u32,
                    dst_buf: Buffer::Output,
                    dst_off: recv[j] + (lo - b0),
                    bytes: hi - lo,
                    path: if d == r { Path::Local } else { Path::Nvlink },
                    step: stage + 1,
                    deps: Deps::from_buf_and_len([landed, 0, 0, 0], 1),
                };
                put(transfers, at, t);
                at += 1;
            }
            j += 1;
        }
        *len = at;
    }
}

/// Most distinct senders a receiver's byte-counted window tracks (its cap
/// is the depth, and at most this).
const MAX_TRACKED_SENDERS: usize = 32;

/// The slot a chain's next send waits for when its window is counted in
/// bytes (`cum`: running total of the counted bytes per slot): the last slot
/// after which the window holds `depth - 1` reference sends (`unit`) to
/// within 1/8, never one later than `depth` slots back and never one more
/// than `2 depth` back (once the chain is that long).
fn window_start(cum: &[u64], depth: usize, unit: u64) -> Option<usize> {
    let (k, depth) = (cum.len(), depth.max(1));
    let by_count = k.checked_sub(depth)?;
    let full = (depth as u64 - 1).saturating_mul(unit);
    let thr = cum[k - 1].checked_sub(full - full / 8);
    // Running totals rise: the last slot at or below `thr`, looking back at
    // most `depth` slots past `by_count`.
    let floor = by_count.saturating_sub(depth);
    let found = thr.and_then(|thr| (floor..=by_count).rev().find(|&j| cum[j] <= thr));
    found.or_else(|| {
        // Not within reach: the window holds less than `depth - 1` full
        // sends even `2 depth` back; wait there (if the chain is that long).
        (by_count >= depth).then_some(floor)
    })
}

/// [`window_start`] for a receiver's chain (`from`: the sender of each
/// slot), also stopping where the window would hold more than `depth`
/// distinct senders counting `sender`, the new send's (and never more than
/// [`MAX_TRACKED_SENDERS`]).
fn receive_window_start(
    cum: &[u64],
    from: &[u32],
    sender: u32,
    depth: usize,
    unit: u64,
) -> Option<usize> {
    let by_count = cum.len().checked_sub(depth.max(1))?;
    let by_bytes = window_start(cum, depth, unit);
    if by_bytes == Some(by_count) {
        // `depth - 1` slots and the new send: at most `depth` senders.
        return by_bytes;
    }
    let cap = depth.clamp(1, MAX_TRACKED_SENDERS);
    let mut seen = [sender; MAX_TRACKED_SENDERS];
    let mut n = 1;
    for i in (by_bytes.map_or(0, |j| j + 1)..cum.len()).rev() {
        if !seen[..n].contains(&from[i]) {
            if n == cap {
                return Some(i.min(by_count));
            }
            seen[n] = from[i];
            n += 1;
        }
    }
    by_bytes
}

/// The parts of `pieces`, laid end to end from offset 0 of a lane's stream,
/// that fall in `from..to`: each piece with its start `p0` in the stream and
/// its clipped range `lo..hi`.
fn clip_pieces(
    pieces: &[Piece],
    from: u64,
    to: u64,
) -> impl Iterator<Item = (&Piece, u64, u64, u64)> {
    pieces
        .iter()
        .scan(0u64, |at, piece| {
            let p0 = *at;
            *at += piece.len;
            Some((piece, p0))
        })
        .filter(move |(piece, p0)| p0 + piece.len > from)
        .take_while(move |&(_, p0)| p0 < to)
        .map(move |(piece, p0)| (piece, p0, from.max(p0), to.min(p0 + piece.len)))
}

/// The transfers of the plan being written, over those of the previous
/// plan: each is overwritten in place, so a large plan's memory is read once
/// (as it is written) rather than first in a pass that drops every old
/// transfer and then again to write the new ones.
struct Emit<'p> {
    transfers: &'p mut Vec<Transfer>,
    len: usize,
}

impl<'p> Emit<'p> {
    fn new(transfers: &'p mut Vec<Transfer>) -> Self {
        Emit { transfers, len: 0 }
    }

    /// Transfers written so far.
    fn len(&self) -> usize {
        self.len
    }

    /// Writes the next transfer and returns its index.
    #[inline]
    fn push(&mut self, t: Transfer) -> u32 {
        put(self.transfers, self.len, t);
        self.len += 1;
        (self.len - 1) as u32
    }

    /// Drops what is left of the previous plan.
    fn finish(self) {
        self.transfers.truncate(self.len);
    }
}

/// Writes transfer `at` (`at <= transfers.len()`): over the previous
/// plan's, or appended.
#[inline]
fn put(transfers: &mut Vec<Transfer>, at: usize, t: Transfer) {
    match transfers.get_mut(at) {
        Some(old) => *old = t,
        None => transfers.push(t),
    }
}

/// Marks `ops[1]` of a slot as the last of the range `ops[0]..=ops[1]` (the
/// per-block sends of a direct slice) rather than a second op.
const RANGE: u32 = 1 << 31;

/// The dependencies of a balanced lane's send (its two chains: at most two
/// slots of at most two sends) or of a move (one slot and the last move),
/// deduplicated, in a fixed array.
#[derive(Clone, Copy, Debug, Default)]
struct FewIds {
    ids: [u32; 4],
    len: usize,
}

impl FewIds {
    /// Adds `op` unless it is [`NONE`] or there already.
    #[inline]
    #[allow(clippy::manual_contains)]
    fn add(&mut self, op: u32) {
        if op != NONE && !self.ids[..self.len].iter().any(|&x| x == op) {
            self.ids[self.len] = op;
            self.len += 1;
        }
    }

    /// Adds the sends of a slot of one or two sends (not a range).
    #[inline]
    fn add_ops(&mut self, ops: [u32; 2]) {
        debug_assert!(ops[1] == NONE || ops[1] & RANGE == 0, "a range slot");
        self.add(ops[0]);
        self.add(ops[1]);
    }

    fn deps(&self) -> Deps {
        Deps::from_buf_and_len(self.ids, self.len)
    }
}

/// Adds the transfers of a slot to `ids`, skipping those already there.
#[inline]
fn add_ops(ids: &mut Vec<u32>, ops: [u32; 2]) {
    if ops[1] != NONE && ops[1] & RANGE != 0 {
        for op in ops[0]..=ops[1] & !RANGE {
            add_op(ids, op);
        }
        return;
    }
    add_op(ids, ops[0]);
    add_op(ids, ops[1]);
}

/// Adds `op` unless it is [`NONE`] or there already. The lists are short:
/// a plain scan beats `contains`, which is built for long slices.
#[inline]
#[allow(clippy::manual_contains)]
fn add_op(ids: &mut Vec<u32>, op: u32) {
    if op != NONE && !ids.iter().any(|&x| x == op) {
        ids.push(op);
    }
}

/// A transfer's dependency list from collected ids; inline (no allocation)
/// up to four.
#[inline]
fn deps_of(ids: &[u32]) -> Deps {
    match *ids {
        [] => Deps::new(),
        [x] => Deps::from_buf_and_len([x, 0, 0, 0], 1),
        [x, y] => Deps::from_buf_and_len([x, y, 0, 0], 2),
        [x, y, z] => Deps::from_buf_and_len([x, y, z, 0], 3),
        [x, y, z, w] => Deps::from_buf_and_len([x, y, z, w], 4),
        _ => Deps::from_slice(ids),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bound::cut_bound;
    use crate::generate::{generate, Pattern, TrafficSpec};
    use crate::sched::fast::stages::check_partial_permutation;
    use crate::sim::{simulate, Network, SimOptions};
    use crate::topology::{IntraKind, IntraSpec, NicSpec, TopologySpec};
    use crate::verify::verify_on;
    use proptest::prelude::*;

    fn topo(nodes: usize, gpus: usize, nics: usize, kind: IntraKind) -> Topology {
        let spec = TopologySpec {
            name: "t".into(),
            nodes,
            gpus_per_node: gpus,
            intra: Some(IntraSpec {
                kind,
                bandwidth_gbps: 450.0,
                latency_us: 1.0,
            }),
            nic: Some(NicSpec {
                per_node: nics,
                bandwidth_gbps: 50.0,
                latency_us: 3.0,
            }),
            fabric: None,
            links: None,
        };
        Topology::from_spec(spec, "t").unwrap()
    }

    /// The node pairs of every inter-node transfer, by step.
    fn rdma_stages(plan: &Plan, g: usize) -> Vec<StagePair> {
        plan.transfers
            .iter()
            .filter(|t| matches!(t.path, Path::Rdma { .. }))
            .map(|t| StagePair {
                stage: t.step,
                src_node: t.src / g as u32,
                dst_node: t.dst / g as u32,
                bytes: t.bytes,
            })
            .collect()
    }

    /// `fast`'s plan with sends of at most `chunk` bytes, checked by the
    /// verifier.
    fn verified_plan_with_chunk(t: &Topology, m: &TrafficMatrix, chunk: u64) -> Plan {
        let opts = PlannerOptions {
            chunk_bytes: Some(chunk),
            ..PlannerOptions::default()
        };
        let plan = Emitter::new(t, opts).unwrap().plan(m).unwrap();
        verify_on(&plan, m, t).unwrap();
        plan
    }

    /// The balancing moves of `plan` (NVLink copies into a scratch that a
    /// send depends on) that start at once: no send gates them.
    fn early_moves(plan: &Plan) -> Vec<usize> {
        let is_send = |x: &Transfer| matches!(x.path, Path::Rdma { .. });
        let mut feeds_a_send = vec![false; plan.transfers.len()];
        for x in plan.transfers.iter().filter(|x| is_send(x)) {
            for &d in &x.deps {
                feeds_a_send[d as usize] = true;
            }
        }
        (0..plan.transfers.len())
            .filter(|&j| {
                let x = &plan.transfers[j];
                feeds_a_send[j]
                    && x.path == Path::Nvlink
                    && (x.src_buf, x.dst_buf) == (Buffer::Input, Buffer::Scratch)
                    && !x.deps.iter().any(|&d| is_send(&plan.transfers[d as usize]))
            })
            .collect()
    }

    fn moe(ranks: usize, seed: u64) -> TrafficMatrix {
        let mut spec = TrafficSpec::new(ranks, Pattern::Zipf(1.0));
        spec.seed = seed;
        spec.moe.tokens_per_rank = 256;
        spec.moe.hidden = 128;
        generate(&spec).unwrap()
    }

    #[test]
    fn fast_and_spray_verify_on_presets() {
        for (preset, nodes) in [
            ("dgx-h100", 2),
            ("dgx-h100", 4),
            ("mi300x", 3),
            ("dgx-a100", 1),
        ] {
            let t = Topology::preset(preset, nodes, None).unwrap();
            let m = moe(t.ranks(), 7);
            for staged in [true, false] {
                let opts = PlannerOptions {
                    staged,
                    ..PlannerOptions::default()
                };
                let mut p = Emitter::new(&t, opts).unwrap();
                let plan = p.plan(&m).unwrap();
                verify_on(&plan, &m, &t).unwrap_or_else(|e| panic!("{preset} {nodes}: {e}"));
                if staged {
                    check_partial_permutation(&rdma_stages(&plan, 8), nodes).unwrap();
                    check_partial_permutation(p.stages(), nodes).unwrap();
                }
            }
        }
    }

    #[test]
    fn stages_stay_near_node_count() {
        let t = Topology::preset("dgx-h100", 8, None).unwrap();
        let m = moe(t.ranks(), 3);
        let mut p = Emitter::new(&t, PlannerOptions::default()).unwrap();
        let plan = p.plan(&m).unwrap();
        verify_on(&plan, &m, &t).unwrap();
        let k = p.stage_count() as usize;
        // About stages_per_node * (N - 1), far below the exact decomposition's N^2 - 2N + 2.
        assert!((7..=5 * 8).contains(&k), "{k} stages");
        assert_eq!(plan.steps(), k + 1); // forwards of the last stage run one step later
                                         // Every pair's bytes appear in the stages exactly.
        let mut moved = vec![0u64; 64];
        for s in p.stages() {
            moved[(s.src_node * 8 + s.dst_node) as usize] += s.bytes;
        }
        for a in 0..8 {
            for b in 0..8 {
                let want: u64 = if a == b {
                    0
                } else {
                    (0..8)
                        .flat_map(|i| (0..8).map(move |j| (a * 8 + i, b * 8 + j)))
                        .map(|(s, d)| m.get(s, d))
                        .sum()
                };
                assert_eq!(moved[a * 8 + b], want);
            }
        }
    }

    #[test]
    fn sends_are_balanced_over_rails() {
        // Node 0's GPU 0 sends everything; its 4 NICs must share it evenly.
        let t = topo(2, 4, 4, IntraKind::Switch);
        let mut m = TrafficMatrix::zeros(8);
        m.set(0, 5, 4_000_000);
        m.set(1, 6, 8);
        let mut p = Emitter::new(&t, PlannerOptions::default()).unwrap();
        let plan = p.plan(&m).unwrap();
        verify_on(&plan, &m, &t).unwrap();
        let mut per_nic = [0u64; 4];
        for tr in &plan.transfers {
            if let Path::Rdma { nic } = tr.path {
                per_nic[nic as usize] += tr.bytes;
            }
        }
        assert_eq!(per_nic.iter().sum::<u64>(), 4_000_008);
        assert!(per_nic.iter().all(|&b| b == 1_000_002), "{per_nic:?}");
        // Without balancing, one NIC carries it all.
        let opts = PlannerOptions {
            balance: false,
            ..PlannerOptions::default()
        };
        let plan = Emitter::new(&t, opts).unwrap().plan(&m).unwrap();
        verify_on(&plan, &m, &t).unwrap();
        let on_nic0: u64 = plan
            .transfers
            .iter()
            .filter(|tr| tr.path == Path::Rdma { nic: 0 })
            .map(|tr| tr.bytes)
            .sum();
        assert_eq!(on_nic0, 4_000_000);
    }

    #[test]
    fn tiny_messages_are_not_balanced() {
        let t = topo(2, 4, 4, IntraKind::Switch);
        let mut m = TrafficMatrix::zeros(8);
        m.set(0, 5, 4000); // 0.08 us on a NIC: not worth a 1 us NVLink hop
        let plan = Emitter::new(&t, PlannerOptions::default())
            .unwrap()
            .plan(&m)
            .unwrap();
        verify_on(&plan, &m, &t).unwrap();
        assert!(plan.transfers.iter().all(|tr| tr.src_buf != Buffer::Scratch
            || tr.path != Path::Nvlink
            || tr.dst_buf == Buffer::Output));
        let rdma: Vec<_> = plan
            .transfers
            .iter()
            .filter(|tr| matches!(tr.path, Path::Rdma { .. }))
            .collect();
        assert_eq!(rdma.len(), 1);
        assert_eq!(rdma[0].src, 0);
    }

    #[test]
    fn balanced_pairs_are_sent_directly() {
        // Uniform traffic: every pair is balanced already, so every block
        // goes straight from its source GPU to its destination's output,
        // still in permutation stages.
        let t = topo(3, 4, 4, IntraKind::Switch);
        let mut m = TrafficMatrix::zeros(12);
        for s in 0..12 {
            for d in 0..12 {
                m.set(s, d, 3_000_000);
            }
        }
        let mut p = Emitter::new(&t, PlannerOptions::default()).unwrap();
        let plan = p.plan(&m).unwrap();
        verify_on(&plan, &m, &t).unwrap();
        assert!(!p.latency_bound());
        check_partial_permutation(&rdma_stages(&plan, 4), 3).unwrap();
        let rdma: Vec<&Transfer> = plan
            .transfers
            .iter()
            .filter(|tr| matches!(tr.path, Path::Rdma { .. }))
            .collect();
        assert!(rdma
            .iter()
            .all(|tr| tr.src_buf == Buffer::Input && tr.dst_buf == Buffer::Output));
        assert!(plan
            .transfers
            .iter()
            .all(|tr| tr.src_buf != Buffer::Scratch));
        // Lanes start at different destination GPUs.
        let firsts: Vec<u32> = (0..4)
            .map(|l| rdma.iter().find(|tr| tr.src == l).unwrap().dst)
            .collect();
        assert_eq!(firsts.len(), 4);
        assert!(
            firsts.iter().enumerate().all(|(l, &d)| d % 4 == l as u32),
            "{firsts:?}"
        );
    }

    #[test]
    fn short_balanced_blocks_go_through_rail_aligned_lanes() {
        // The same uniform exchange with blocks shorter than one inter-node
        // latency on a NIC (but not latency-bound as a whole): direct lanes
        // would send latency-bound blocks fanning out to every NIC, so the
        // pairs are balanced and sent rail-aligned into scratch instead.
        let t = topo(3, 4, 4, IntraKind::Switch);
        let lane_rate = t.nic_bandwidth();
        let block = (0.5 * t.path_latency(0, 4) * lane_rate) as u64;
        let m = TrafficMatrix::uniform(12, block);
        let mut p = Emitter::new(&t, PlannerOptions::default()).unwrap();
        let plan = p.plan(&m).unwrap();
        verify_on(&plan, &m, &t).unwrap();
        assert!(!p.latency_bound());
        let rdma: Vec<&Transfer> = plan
            .transfers
            .iter()
            .filter(|tr| matches!(tr.path, Path::Rdma { .. }))
            .collect();
        assert!(!rdma.is_empty());
        assert!(rdma
            .iter()
            .all(|tr| tr.dst_buf == Buffer::Scratch && tr.src % 4 == tr.dst % 4));
    }

    #[test]
    fn moves_are_cut_like_the_sends_they_feed() {
        // GPU 0's tail is one piece per carrier; each send moves only its
        // part of it, so a carrier's first send does not wait for the whole.
        let t = topo(2, 4, 4, IntraKind::Switch);
        let mut m = TrafficMatrix::zeros(8);
        m.set(0, 5, 4_000_000);
        let plan = verified_plan_with_chunk(&t, &m, 100_000);
        let moves: Vec<&Transfer> = plan
            .transfers
            .iter()
            .filter(|tr| tr.path == Path::Nvlink && tr.dst_buf == Buffer::Scratch)
            .collect();
        assert!(moves.len() >= 3 * 7, "{} moves", moves.len());
        assert!(moves.iter().all(|tr| tr.bytes <= 100_000));
        assert_eq!(moves.iter().map(|tr| tr.bytes).sum::<u64>(), 3_000_000);
    }

    #[test]
    fn mesh_intra_node_traffic_waits_for_the_first_moves_on_its_link() {
        // 2x4 MI300X-like mesh: GPU 1 of each node is hot, towards the other
        // node (so its bytes are moved to the carriers) and inside its node
        // (a big block, partly relayed by the relief pass).
        let t = Topology::preset("mi300x", 2, Some(4)).unwrap();
        let mut m = TrafficMatrix::uniform(8, 200_000);
        for s in [1usize, 5] {
            for d in 0..8 {
                m.set(s, d, if d / 4 == s / 4 { 3_000_000 } else { 4_000_000 });
            }
        }
        let plan = verified_plan_with_chunk(&t, &m, 250_000);
        let is_move_or_hop = |x: &Transfer| {
            x.path == Path::Nvlink && x.src_buf == Buffer::Input && x.dst_buf == Buffer::Scratch
        };
        let early = early_moves(&plan);
        let mut relay_hop = vec![false; plan.transfers.len()];
        for x in &plan.transfers {
            if x.path == Path::Nvlink && x.src_buf == Buffer::Scratch && x.dst_buf == Buffer::Output
            {
                for &d in &x.deps {
                    relay_hop[d as usize] |= is_move_or_hop(&plan.transfers[d as usize]);
                }
            }
        }
        let r = simulate(&t, &plan, &SimOptions::new(Network::Ideal)).unwrap();
        let mut checked = 0;
        for (i, x) in plan.transfers.iter().enumerate() {
            let block =
                x.path == Path::Nvlink && x.src_buf == Buffer::Input && x.dst_buf == Buffer::Output;
            if !(block || relay_hop[i]) {
                continue;
            }
            for &j in &early {
                let mv = &plan.transfers[j];
                if (mv.src, mv.dst) != (x.src, x.dst) {
                    continue;
                }
                assert!(
                    r.transfers[i].start_us >= r.transfers[j].end_us - 1e-9,
                    "{x:?} starts before {mv:?} ends"
                );
                checked += 1;
            }
        }
        assert!(checked > 0);
        assert!(
            relay_hop.iter().any(|&h| h),
            "the relief pass relayed nothing"
        );
    }

    #[test]
    fn switch_intra_node_traffic_waits_for_early_moves_not_for_sends() {
        // 2x4 NVSwitch nodes: GPU 1 of each node is hot towards the other
        // node, so its bytes are moved to the carriers first; every GPU also
        // has 1 MB for each GPU of its own node.
        let t = Topology::preset("dgx-h100", 2, Some(4)).unwrap();
        let mut m = TrafficMatrix::uniform(8, 1_000_000);
        for s in [1usize, 5] {
            for d in 0..8 {
                if d / 4 != s / 4 {
                    m.set(s, d, 4_000_000);
                }
            }
        }
        let plan = verified_plan_with_chunk(&t, &m, 250_000);
        let is_send = |x: &Transfer| matches!(x.path, Path::Rdma { .. });
        let early = early_moves(&plan);
        assert!(!early.is_empty());
        let r = simulate(&t, &plan, &SimOptions::new(Network::Ideal)).unwrap();
        // The end of each GPU's first inter-node send.
        let mut first_send_end = [f64::INFINITY; 8];
        for (i, x) in plan.transfers.iter().enumerate() {
            let s = x.src as usize;
            if is_send(x) && first_send_end[s].is_infinite() {
                first_send_end[s] = r.transfers[i].end_us;
            }
        }
        let (mut checked, mut ahead_of_sends) = (0, 0);
        for (i, x) in plan.transfers.iter().enumerate() {
            if !(x.path == Path::Nvlink
                && x.src_buf == Buffer::Input
                && x.dst_buf == Buffer::Output)
            {
                continue;
            }
            // A block shares the sending GPU's NVLink egress with its moves
            // out, and the receiving GPU's ingress with its moves in.
            for &j in &early {
                let mv = &plan.transfers[j];
                if mv.src == x.src || mv.dst == x.dst {
                    assert!(
                        r.transfers[i].start_us >= r.transfers[j].end_us - 1e-9,
                        "{x:?} starts before {mv:?} ends"
                    );
                    checked += 1;
                }
            }
            if r.transfers[i].start_us < first_send_end[x.src as usize] {
                ahead_of_sends += 1;
            }
        }
        assert!(checked > 0);
        // Blocks no longer wait for their GPU's first send: some start
        // before it lands.
        assert!(ahead_of_sends > 0, "every block waited for a send");
    }

    #[test]
    fn mesh_lanes_without_moved_bytes_end_on_their_own_receiver() {
        // 2x4 mesh. GPU 2 sends most of node 0's bytes to node 1 (its lane
        // gives its excess away and gathers nothing): a small block to GPU
        // 6, the GPU its lane lands on, early in its row, and a big one to
        // GPU 7 after it. The lane's chunks start at the chunk that holds
        // the end of the block for GPU 6, so its last send (the second half
        // of its first chunk) carries bytes that need no forward over a
        // link. Rotated by lane index instead, it started (and ended) in
        // the block for GPU 7.
        let t = Topology::preset("mi300x", 2, Some(4)).unwrap();
        let mut m = TrafficMatrix::uniform(8, 200_000);
        m.set(2, 4, 50_000);
        m.set(2, 5, 50_000);
        m.set(2, 6, 1_000_000);
        m.set(2, 7, 6_000_000);
        let plan = verified_plan_with_chunk(&t, &m, 250_000);
        let moved_in = plan
            .transfers
            .iter()
            .any(|x| x.dst == 2 && x.path == Path::Nvlink && x.dst_buf == Buffer::Scratch);
        assert!(!moved_in, "GPU 2's lane gathers nothing");
        let last = (0..plan.transfers.len())
            .rev()
            .find(|&i| {
                let x = &plan.transfers[i];
                x.src == 2 && matches!(x.path, Path::Rdma { .. })
            })
            .unwrap() as u32;
        assert_eq!(plan.transfers[last as usize].dst, 6);
        let forwards: Vec<&Transfer> = plan
            .transfers
            .iter()
            .filter(|x| x.deps.as_slice().contains(&last))
            .collect();
        assert!(
            forwards.iter().any(|x| x.path == Path::Local && x.dst == 6),
            "{forwards:?}"
        );
    }

    #[test]
    fn planner_reuse_gives_the_same_plans() {
        let t = Topology::preset("dgx-h100", 4, Some(4)).unwrap();
        let (m1, m2) = (moe(16, 1), moe(16, 2));
        let mut p = Emitter::new(&t, PlannerOptions::default()).unwrap();
        let mut plan = Plan::new("", 0, 0);
        p.plan_into(&m1, &mut plan).unwrap();
        p.plan_into(&m2, &mut plan).unwrap();
        let fresh = Emitter::new(&t, PlannerOptions::default())
            .unwrap()
            .plan(&m2)
            .unwrap();
        assert_eq!(plan, fresh);
        verify_on(&plan, &m2, &t).unwrap();
    }

    #[test]
    fn a_latency_bound_plan_reports_its_own_chunk_and_depth() {
        let t = topo(2, 4, 4, IntraKind::Switch);
        let mut big = TrafficMatrix::zeros(8);
        for (s, d) in (0..8).flat_map(|s| (0..8).map(move |d| (s, d))) {
            big.set(s, d, (1 << 20) + 4096 * (s * d) as u64);
        }
        let mut tiny = TrafficMatrix::zeros(8);
        tiny.set(0, 5, 4000);
        let mut p = Emitter::new(&t, PlannerOptions::default()).unwrap();
        let mut plan = Plan::new("", 0, 0);
        p.plan_into(&big, &mut plan).unwrap();
        let (chunk, depth) = (p.chunk_bytes(), p.pipeline_depth());
        assert!(!p.latency_bound() && chunk < u64::MAX && depth < u32::MAX);
        p.plan_into(&tiny, &mut plan).unwrap();
        assert!(p.latency_bound());
        assert_eq!((p.chunk_bytes(), p.pipeline_depth()), (u64::MAX, u32::MAX));
        p.plan_into(&big, &mut plan).unwrap();
        assert_eq!((p.chunk_bytes(), p.pipeline_depth()), (chunk, depth));
    }

    #[test]
    fn one_nic_and_few_peers_send_everything_at_once() {
        for (nodes, merged) in [(5, true), (6, false)] {
            let t = topo(nodes, 4, 1, IntraKind::Switch);
            let m = moe(nodes * 4, 7);
            let mut p = Emitter::new(&t, PlannerOptions::default()).unwrap();
            let plan = p.plan(&m).unwrap();
            verify_on(&plan, &m, &t).unwrap();
            assert_eq!(p.merged(), merged, "{nodes} nodes");
            assert!(!p.latency_bound());
            if merged {
                // `direct`'s transfers: one per block, no relay, no chain.
                let d = crate::sched::direct(&t, &m);
                assert_eq!(plan.transfers, d.transfers);
                assert!(plan.scratch.is_empty());
            } else {
                assert!(plan.transfers.iter().any(|x| !x.deps.is_empty()));
            }
        }
        // Two NICs: which GPU holds the bytes matters, so it stays staged.
        let t = topo(3, 4, 2, IntraKind::Switch);
        let mut p = Emitter::new(&t, PlannerOptions::default()).unwrap();
        p.plan(&moe(12, 7)).unwrap();
        assert!(!p.merged());
    }

    #[test]
    fn only_even_stages_of_direct_pairs_take_the_shallower_pipeline() {
        // One GPU per node: every pair is direct, skewed or not.
        let t = topo(8, 1, 1, IntraKind::Switch);
        let mut p = Emitter::new(&t, PlannerOptions::default()).unwrap();
        p.plan(&TrafficMatrix::uniform(8, 1 << 20)).unwrap();
        assert!(p.stage_count() > 1 && p.stages_are_even());
        assert_eq!(p.pipeline_depth(), 3);
        let mut spec = TrafficSpec::new(8, Pattern::Lognormal(0.5));
        spec.seed = 3;
        let m = generate(&spec).unwrap();
        let plan = p.plan(&m).unwrap();
        verify_on(&plan, &m, &t).unwrap();
        assert!(!p.stages_are_even());
        assert_eq!(p.pipeline_depth(), MIN_DEPTH);
    }

    /// Running totals of sends of the given sizes.
    fn running(sizes: &[u64]) -> Vec<u64> {
        sizes
            .iter()
            .scan(0, |t, &x| {
                *t += x;
                Some(*t)
            })
            .collect()
    }

    #[test]
    fn byte_windows_look_back_past_light_sends_only() {
        let u = 1000;
        // Fewer sends than the depth: nothing to wait for.
        assert_eq!(window_start(&running(&[u, u, u]), 4, u), None);
        // Full sends: `depth` back, as a count would.
        assert_eq!(window_start(&running(&[u; 4]), 4, u), Some(0));
        assert_eq!(window_start(&running(&[u; 7]), 4, u), Some(3));
        // Within 1/8 of the reference counts as full.
        assert_eq!(window_start(&running(&[900; 7]), 4, u), Some(3));
        // Two light sends among the last three: the window reaches past them.
        assert_eq!(
            window_start(&running(&[u, u, u, u, 200, 200, u]), 4, u),
            Some(1)
        );
        // So light that even the whole chain holds less: no wait.
        assert_eq!(window_start(&running(&[100; 6]), 4, u), None);
        // Depth one waits for the previous send whatever its size.
        assert_eq!(window_start(&running(&[100, 100]), 1, u), Some(1));
    }

    #[test]
    fn receive_windows_hold_at_most_depth_senders() {
        let u = 1000;
        let cum = running(&[u, u, u, u, 100, 100, 100, 100]);
        // From two senders, the bytes decide: back to slot 0.
        let two = [0, 1, 0, 1, 0, 1, 0, 1];
        assert_eq!(window_start(&cum, 4, u), Some(0));
        assert_eq!(receive_window_start(&cum, &two, 1, 4, u), Some(0));
        // Eight senders: the window stops where a fifth would join.
        let eight = [0, 1, 2, 3, 4, 5, 6, 7];
        assert_eq!(receive_window_start(&cum, &eight, 9, 4, u), Some(4));
        // Never later than `depth` back.
        let cum = running(&[u; 6]);
        assert_eq!(
            receive_window_start(&cum, &[0, 1, 2, 3, 4, 5], 9, 4, u),
            Some(2)
        );
    }

    #[test]
    fn latency_scale_sends_fill_the_binding_nic() {
        // 2x8 hotspot at 64 KB per pair: the chunks are set by the latency
        // bound and the lanes of the hot pair carry unequal bytes; counted
        // in sends, the windows held light sends and the NICs of the
        // binding node idled (1.263 of the bound; 1.095 counted in bytes).
        let t = Topology::preset("dgx-h100", 2, None).unwrap();
        let mut spec = TrafficSpec::new(t.ranks(), Pattern::Hotspot(0.3));
        spec.seed = 1;
        spec.set_mean_pair_bytes(65536);
        let m = generate(&spec).unwrap();
        let mut planner = Emitter::new(&t, PlannerOptions::default()).unwrap();
        let plan = planner.plan(&m).unwrap();
        assert!(planner.unit > 0, "windows count bytes here");
        verify_on(&plan, &m, &t).unwrap();
        let bound = cut_bound(&t, &m).best_us();
        let ratio = simulate(&t, &plan, &SimOptions::new(Network::Ideal))
            .unwrap()
            .completion_us
            / bound;
        assert!(ratio < 1.15, "{ratio}");
        // Chunks set by the NVLink hop keep counting sends.
        spec.set_mean_pair_bytes(4 << 20);
        planner.plan(&generate(&spec).unwrap()).unwrap();
        assert_eq!(planner.unit, 0);
    }

    #[test]
    fn stages_beat_spray_under_congestion() {
        let t = Topology::preset("dgx-h100", 8, Some(2)).unwrap();
        let mut spec = TrafficSpec::new(16, Pattern::Zipf(1.0));
        spec.moe.tokens_per_rank = 2048;
        spec.moe.hidden = 1024;
        let m = generate(&spec).unwrap();
        let bound = cut_bound(&t, &m).cut_us;
        let run = |staged, net| {
            let opts = PlannerOptions {
                staged,
                ..PlannerOptions::default()
            };
            let plan = Emitter::new(&t, opts).unwrap().plan(&m).unwrap();
            simulate(&t, &plan, &SimOptions::new(net))
                .unwrap()
                .completion_us
                / bound
        };
        let fast = run(true, Network::Congested);
        let spray = run(false, Network::Congested);
        let direct = simulate(
            &t,
            &crate::sched::direct(&t, &m),
            &SimOptions::new(Network::Congested),
        )
        .unwrap()
        .completion_us
            / bound;
        eprintln!("fast {fast} spray {spray} direct {direct}");
        assert!(fast < 1.3, "fast {fast}");
        assert!(
            fast < spray && fast < direct,
            "fast {fast} spray {spray} direct {direct}"
        );
    }

    #[test]
    fn rejects_links_topologies_and_wrong_sizes() {
        let text = r#"{"name":"ring","nodes":2,"gpus_per_node":1,"links":[
            {"from":"gpu0","to":"gpu1","bandwidth_GBps":10,"bidirectional":true}]}"#;
        let t = Topology::from_json_str(text, "ring.json").unwrap();
        let e = Emitter::new(&t, PlannerOptions::default()).unwrap_err();
        assert!(matches!(e, Error::Unsupported { .. }), "{e}");
        let t = Topology::preset("dgx-h100", 2, None).unwrap();
        let mut p = Emitter::new(&t, PlannerOptions::default()).unwrap();
        let e = p.plan(&TrafficMatrix::zeros(4)).unwrap_err();
        assert!(e.is_bad_input(), "{e}");
    }

    #[test]
    fn the_sends_in_flight_at_the_end_are_tapered() {
        let t = topo(2, 4, 4, IntraKind::Switch);
        let mut p = Emitter::new(&t, PlannerOptions::default()).unwrap();
        let whole: Vec<(u64, u64)> = (0..5).map(|k| (k * 100_000, (k + 1) * 100_000)).collect();
        p.depth = 3;
        p.chunks = whole.clone();
        p.taper_last_chunks();
        // The first two sends stay; each of the last three (one per send in
        // flight) goes as a half and two quarters; nothing is lost.
        assert_eq!(p.chunks[..2], whole[..2]);
        let sizes: Vec<u64> = p.chunks[2..].iter().map(|&(lo, hi)| hi - lo).collect();
        assert_eq!(sizes, [50_000, 25_000, 25_000].repeat(3));
        assert!(p.chunks.windows(2).all(|w| w[0].1 == w[1].0));
        assert_eq!((p.chunks[0].0, p.chunks.last().unwrap().1), (0, 500_000));
        // Without chains (`spray`) only the last send is cut.
        p.depth = u32::MAX;
        p.chunks = whole.clone();
        p.taper_last_chunks();
        assert_eq!(p.chunks.len(), 7);
        // Fewer sends than the depth: all of them.
        p.depth = 8;
        p.chunks = whole[..2].to_vec();
        p.taper_last_chunks();
        assert_eq!(p.chunks.len(), 6);
    }

    #[test]
    fn explicit_depth_one_chains_every_stage() {
        let t = Topology::preset("dgx-h100", 4, Some(2)).unwrap();
        let m = moe(8, 5);
        let opts = PlannerOptions {
            pipeline_depth: Some(1),
            ..PlannerOptions::default()
        };
        let mut p = Emitter::new(&t, opts).unwrap();
        let plan = p.plan(&m).unwrap();
        verify_on(&plan, &m, &t).unwrap();
        // A send waits only for a send of the same GPU or into the same GPU
        // (the chains), never for a later stage.
        let mut chained = 0;
        for tr in plan
            .transfers
            .iter()
            .filter(|t| matches!(t.path, Path::Rdma { .. }))
        {
            for &d in &tr.deps {
                let dep = &plan.transfers[d as usize];
                if matches!(dep.path, Path::Rdma { .. }) {
                    assert!(dep.src == tr.src || dep.dst == tr.dst, "{dep:?} -> {tr:?}");
                    assert!(dep.step <= tr.step);
                    chained += 1;
                }
            }
        }
        assert!(chained > 0);
    }

    fn arb_case() -> impl Strategy<Value = (usize, usize, usize, bool, Vec<u64>)> {
        (1usize..=4, 1usize..=4, 1usize..=4, any::<bool>()).prop_flat_map(|(n, g, p, mesh)| {
            let r = n * g;
            let cell = prop_oneof![3 => Just(0u64), 3 => 0u64..64, 2 => 0u64..5_000_000];
            (
                Just(n),
                Just(g),
                Just(p),
                Just(mesh),
                prop::collection::vec(cell, r * r),
            )
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]
        #[test]
        fn every_plan_verifies_and_stages_are_permutations(
            (n, g, p, mesh, cells) in arb_case(),
            staged in any::<bool>(),
            depth in prop::option::of(1u32..4),
            chunk in prop::option::of(1u64..200_000),
        ) {
            let kind = if mesh { IntraKind::Mesh } else { IntraKind::Switch };
            let t = topo(n, g, p, kind);
            let r = n * g;
            let m = TrafficMatrix::from_rows(cells.chunks(r).map(<[u64]>::to_vec).collect());
            let opts = PlannerOptions {
                staged,
                pipeline_depth: depth,
                chunk_bytes: chunk,
                ..PlannerOptions::default()
            };
            let mut planner = Emitter::new(&t, opts).unwrap();
            let plan = planner.plan(&m).unwrap();
            let stats = verify_on(&plan, &m, &t);
            prop_assert!(stats.is_ok(), "{:?}", stats);
            let bound = cut_bound(&t, &m).cut_us;
            for net in [Network::Ideal, Network::Congested] {
                let done = simulate(&t, &plan, &SimOptions::new(net)).unwrap().completion_us;
                prop_assert!(done >= bound * (1.0 - 1e-9), "{net}: {done} < bound {bound}");
            }
            if staged && !planner.merged() {
                prop_assert!(check_partial_permutation(&rdma_stages(&plan, g), n).is_ok());
                prop_assert!(check_partial_permutation(planner.stages(), n).is_ok());
            }
        }
    }
}
