//! A rank's own program, planned without the whole plan (per-batch
//! planning at thousands of GPUs, where each rank executes about 1/R of the
//! plan).
//!
//! A plan names its transfers by their index, and that index depends on
//! every transfer planned before: a rank cannot know it without planning
//! them all. So a rank's own program names each transfer by what both of
//! its ends can compute alone: **where it writes**, a [`TransferKey`]
//! (destination rank, buffer, offset). In a plan the verifier accepts, no
//! byte is written twice, so every transfer that moves bytes has its own key.
//!
//! **Identical** means: stitching every rank's [`LocalProgram`] back into a
//! plan ([`stitch`]) gives exactly the whole plan put in canonical form
//! ([`canonical`]): the transfers that move bytes, sorted by key, each with
//! every field equal and its dependencies renumbered to the new indices and
//! sorted. Transfers of zero bytes move nothing and have no key: both forms
//! leave them out, with any dependency on them. The canonical form is the
//! same plan up to the order of its transfers, so the verifier, the
//! simulator and every quality figure hold for it unchanged.
//!
//! What a rank knows is a [`LocalTraffic`]: its node's rows and columns of
//! the matrix, the N x N node matrix and a few prefix sums, O(R) numbers
//! where the matrix has R^2. A per-rank planner reads nothing else, so a
//! job gathers that instead of the whole matrix.
//!
//! Owns: [`TransferKey`], [`LocalOp`], [`LocalProgram`], [`LocalTraffic`],
//! [`slice_into`] (a rank's part of a whole plan, the reference),
//! [`stitch`], [`canonical`], and the per-rank planners of `direct` and
//! `hierarchical` (from a [`LocalTraffic`] alone); those of `pxn` and
//! `deepep` live beside their whole-plan schedulers (sched/pxn.rs,
//! sched/deepep.rs), which share their offset arithmetic. Knows nothing of
//! time; the `Planner` facade (planner.rs) chooses among them. What a job
//! gathers for staged `fast` and `spray`, computed from the whole matrix
//! through the `Planner`'s entry points, is `crate::job::JobInputs`, above
//! the planner (for tests, benches and examples).

use std::collections::HashMap;

use serde::Serialize;
use smallvec::SmallVec;

use crate::error::{Error, InputError, Result};
use crate::plan::{Buffer, Deps, Path, Plan, Transfer};
use crate::topology::Topology;
use crate::traffic::TrafficMatrix;

/// What a rank does in one operation.
#[derive(Serialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum OpKind {
    /// Send `bytes` from `src_buf` at `src_off` of this rank to `peer`.
    Send,
    /// Receive `bytes` from `peer` into `dst_buf` at `dst_off` of this rank.
    Recv,
    /// Copy `bytes` inside this rank's memory (`peer` is the rank itself).
    Copy,
}

impl OpKind {
    /// What rank `me` does in `t`, a transfer that starts or ends at `me`,
    /// and with whom (itself for a copy).
    pub(crate) fn side(t: &Transfer, me: u32) -> (OpKind, u32) {
        OpKind::between(t.src, t.dst, me)
    }

    /// [`OpKind::side`] of a transfer from rank `src` to rank `dst`.
    #[inline]
    pub(crate) fn between(src: u32, dst: u32, me: u32) -> (OpKind, u32) {
        if src == dst {
            (OpKind::Copy, me)
        } else if src == me {
            (OpKind::Send, dst)
        } else {
            (OpKind::Recv, src)
        }
    }
}

/// The name of a transfer both its ends know: the place it writes.
#[derive(Serialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TransferKey {
    pub rank: u32,
    pub buf: Buffer,
    pub off: u64,
}

impl TransferKey {
    pub(crate) fn of(t: &Transfer) -> TransferKey {
        TransferKey {
            rank: t.dst,
            buf: t.dst_buf,
            off: t.dst_off,
        }
    }

    /// The key as one number, ordered as the key is (rank, then buffer,
    /// then offset): sorting by it is sorting by the key, with cheaper
    /// comparisons.
    pub(crate) fn packed(self) -> u128 {
        (u128::from(self.rank) << 72) | (u128::from(self.buf as u8) << 64) | u128::from(self.off)
    }
}

/// One rank's side of one transfer (a whole local copy when both ends are
/// the rank). Both ends of the transfer are given, as in the plan.
#[derive(Serialize, Clone, Debug, PartialEq, Eq)]
pub struct LocalOp {
    pub op: OpKind,
    /// The other rank (the rank itself for a copy).
    pub peer: u32,
    pub bytes: u64,
    pub src_buf: Buffer,
    pub src_off: u64,
    pub dst_buf: Buffer,
    pub dst_off: u64,
    pub path: Path,
    pub step: u32,
    /// The transfers that must finish first, by key, sorted: on this rank
    /// or elsewhere.
    #[serde(skip_serializing_if = "SmallVec::is_empty")]
    pub deps: KeyDeps,
}

/// A [`LocalOp`]'s dependencies: up to four inline, so nearly no op
/// allocates. One rank's staged `fast` program (`rank_hash --inputs`,
/// 128x8 and 512x8, Zipf and log-normal 1.0) has 65-78% of its ops with
/// one dependency, 7-24% with two, 7-9% with three and 1-2% with more
/// than four; with one inline a third of the ops allocated (1,525 a
/// 128x8 log-normal call), and four inline made that call 3% faster and
/// the 512x8 one 5% (criterion `rank_local/fast-*-inputs`; two inline
/// were between). An op is 120 bytes instead of 72.
pub type KeyDeps = SmallVec<[TransferKey; 4]>;

impl LocalOp {
    /// Rank `me`'s side of `t`, a transfer that moves bytes and starts or
    /// ends at `me` ([`LocalProgram::push`] leaves out the others), with
    /// its dependencies `deps` (by key).
    pub(crate) fn side_of(t: &Transfer, me: u32, deps: KeyDeps) -> LocalOp {
        let (op, peer) = OpKind::side(t, me);
        LocalOp {
            op,
            peer,
            bytes: t.bytes,
            src_buf: t.src_buf,
            src_off: t.src_off,
            dst_buf: t.dst_buf,
            dst_off: t.dst_off,
            path: t.path,
            step: t.step,
            deps,
        }
    }

    /// The transfer's key, as seen from rank `me`.
    pub fn key(&self, me: u32) -> TransferKey {
        TransferKey {
            rank: if self.op == OpKind::Send {
                self.peer
            } else {
                me
            },
            buf: self.dst_buf,
            off: self.dst_off,
        }
    }

    /// The whole transfer, as seen from rank `me`, with no dependencies.
    fn transfer(&self, me: u32) -> Transfer {
        let (src, dst) = match self.op {
            OpKind::Send => (me, self.peer),
            OpKind::Recv => (self.peer, me),
            OpKind::Copy => (me, me),
        };
        Transfer {
            src,
            src_buf: self.src_buf,
            src_off: self.src_off,
            dst,
            dst_buf: self.dst_buf,
            dst_off: self.dst_off,
            bytes: self.bytes,
            path: self.path,
            step: self.step,
            deps: Deps::new(),
        }
    }
}

/// Everything one rank executes for one all-to-all: its sends, receives and
/// copies, sorted by key (so the transfers between two ranks come in the
/// same order on both), with their dependencies.
#[derive(Serialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct LocalProgram {
    /// The algorithm that planned it.
    pub algorithm: String,
    pub rank: u32,
    pub ranks: u32,
    pub gpus_per_node: u32,
    /// Scratch bytes this rank needs.
    pub scratch_bytes: u64,
    pub ops: Vec<LocalOp>,
}

impl LocalProgram {
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a local program serialises")
    }

    /// Empties the program for `rank`, keeping its allocations.
    pub(crate) fn reset(&mut self, algorithm: &str, rank: usize, ranks: usize, gpus: usize) {
        self.algorithm.clear();
        self.algorithm.push_str(algorithm);
        self.rank = rank as u32;
        self.ranks = ranks as u32;
        self.gpus_per_node = gpus as u32;
        self.scratch_bytes = 0;
        self.ops.clear();
    }

    /// Adds rank `self.rank`'s side of `t` (deps given as keys) unless it
    /// moves nothing or does not concern the rank.
    pub(crate) fn push(&mut self, t: &Transfer, deps: impl IntoIterator<Item = TransferKey>) {
        let me = self.rank;
        if t.bytes == 0 || (t.src != me && t.dst != me) {
            return;
        }
        self.ops.push(LocalOp::side_of(t, me, collect_deps(deps)));
    }

    /// Puts the ops in key order ([`LocalOp::key`], stable), each op's
    /// dependencies in order.
    pub(crate) fn sort(&mut self) {
        self.sort_with(&mut SortBuffers::default());
    }

    /// [`LocalProgram::sort`] with buffers kept from call to call.
    pub(crate) fn sort_with(&mut self, bufs: &mut SortBuffers) {
        let me = self.rank;
        // Most ops have one dependency or two: no call into the sort.
        for o in &mut self.ops {
            match &mut o.deps[..] {
                [] | [_] => {}
                [x, y] => {
                    if *y < *x {
                        std::mem::swap(x, y);
                    }
                }
                deps => deps.sort_unstable(),
            }
        }
        // Sorting the keys with their indices, then moving each op once, is
        // cheaper than sorting the ops (120 bytes each, the key recomputed
        // at every comparison); copying each into a second list cost more
        // than the swaps.
        if !packed_keys(&self.ops, me, &mut bufs.keys) {
            self.ops.sort_by_cached_key(|o| o.key(me).packed());
            return;
        }
        radix_sort(&mut bufs.keys, &mut bufs.tmp);
        permute(&mut self.ops, &mut bufs.keys);
    }
}

/// The buffers [`LocalProgram::sort_with`] reuses: the ops' packed keys
/// and the radix sort's second array.
#[derive(Clone, Debug, Default)]
pub(crate) struct SortBuffers {
    keys: Vec<(u64, u32)>,
    tmp: Vec<(u64, u32)>,
}

/// Puts `ops` in the order `order` gives (each entry's second member the
/// index of the op that goes there), each op swapped into place once:
/// the permutation `slice::sort_by_cached_key` applies.
fn permute<T>(ops: &mut [T], order: &mut [(u64, u32)]) {
    for i in 0..ops.len() {
        let mut index = order[i].1;
        while (index as usize) < i {
            index = order[index as usize].1;
        }
        order[i].1 = index;
        ops.swap(i, index as usize);
    }
}

/// Each op's key ([`LocalOp::key`]) as one `u64` ordered as the key is
/// (rank, then buffer, then offset), each field in as many bits as its
/// largest value needs, with the op's index, into `out`; false where the
/// three do not fit in 64 bits (or there are more than `u32::MAX` ops).
fn packed_keys(ops: &[LocalOp], me: u32, out: &mut Vec<(u64, u32)>) -> bool {
    out.clear();
    if u32::try_from(ops.len()).is_err() {
        return false;
    }
    let (mut rank, mut buf, mut off) = (0u32, 0u8, 0u64);
    for o in ops {
        let k = o.key(me);
        rank |= k.rank;
        buf |= k.buf as u8;
        off |= k.off;
    }
    let off_bits = u64::BITS - off.leading_zeros();
    let buf_bits = u8::BITS - buf.leading_zeros();
    let rank_bits = u32::BITS - rank.leading_zeros();
    if off_bits + buf_bits + rank_bits > u64::BITS {
        return false;
    }
    // A field shifted by 64 has no bits: it is 0 for every op.
    let pack = |k: TransferKey| {
        let rank = u64::from(k.rank).checked_shl(buf_bits + off_bits);
        let buf = u64::from(k.buf as u8).checked_shl(off_bits);
        rank.unwrap_or(0) | buf.unwrap_or(0) | k.off
    };
    out.extend(
        ops.iter()
            .enumerate()
            .map(|(i, o)| (pack(o.key(me)), i as u32)),
    );
    true
}

/// Bits of one digit of [`radix_sort`].
const DIGIT_BITS: u32 = 11;

/// Sorts `keys` by key, equal keys by their order in `keys` (stable), as
/// sorting the pairs themselves does where the second members are the
/// indices: least significant digit ([`DIGIT_BITS`]) first, one counting
/// pass a digit up to the highest bit set, skipping the digits every key
/// shares.
pub(crate) fn radix_sort(keys: &mut Vec<(u64, u32)>, tmp: &mut Vec<(u64, u32)>) {
    const BUCKETS: usize = 1 << DIGIT_BITS;
    const MASK: u64 = BUCKETS as u64 - 1;
    let n = keys.len();
    let top = keys.iter().fold(0u64, |m, &(k, _)| m | k);
    let digits = (u64::BITS - top.leading_zeros()).div_ceil(DIGIT_BITS);
    let mut counts = vec![[0u32; BUCKETS]; digits as usize];
    for &(k, _) in keys.iter() {
        for (d, c) in (0..).zip(counts.iter_mut()) {
            c[((k >> (DIGIT_BITS * d)) & MASK) as usize] += 1;
        }
    }
    tmp.clear();
    tmp.resize(n, (0, 0));
    for (d, c) in (0..).zip(counts.iter_mut()) {
        if c.iter().any(|&x| x as usize == n) {
            continue;
        }
        // Each bucket's start, in place of its count.
        let mut sum = 0;
        for x in c.iter_mut() {
            (*x, sum) = (sum, sum + *x);
        }
        for &(k, i) in keys.iter() {
            let at = &mut c[((k >> (DIGIT_BITS * d)) & MASK) as usize];
            tmp[*at as usize] = (k, i);
            *at += 1;
        }
        std::mem::swap(keys, tmp);
    }
}

/// `deps` as [`KeyDeps`], allocated once for all of them (at most 16 at
/// once) where collecting grew the vector one by one (1, 2, 4, ...).
pub(crate) fn collect_deps(deps: impl IntoIterator<Item = TransferKey>) -> KeyDeps {
    let deps = deps.into_iter();
    let (least, most) = deps.size_hint();
    let mut out = KeyDeps::with_capacity(most.unwrap_or(least).min(16));
    out.extend(deps);
    out
}

pub(crate) fn check_rank(rank: usize, ranks: usize) -> Result<()> {
    if rank >= ranks {
        return Err(InputError::new(
            "rank",
            format!("{rank} is not a rank of the cluster (it has {ranks})"),
        )
        .into());
    }
    Ok(())
}

/// What one rank knows of one all-to-all's traffic: every number its own
/// program depends on for the algorithms that plan one rank alone, and
/// nothing that grows with R x R. A rank gathers it instead of the whole
/// R x R matrix (docs/algorithms.md, "Own programs per rank"):
///
/// | field | size | what | how a job gathers it |
/// |---|---|---|---|
/// | `node_bytes` | N x N | bytes node `a` sends node `b` (row-major) | all-reduce of each node's row sums |
/// | `rows` | G x R | what each GPU of this rank's node sends every rank | all-gather inside the node |
/// | `cols` | R x G | what every rank sends each GPU of this rank's node | the split-size exchange (all-to-all), then all-gather inside the node |
/// | `above` | R | bytes the ranks before this node's first rank send each rank | exclusive prefix sum (scan) over nodes of the node row sums |
/// | `before` | R | bytes each rank sends the ranks before this node's first rank | from each rank's row, one number per (rank, node): an all-to-all of N numbers per rank |
/// | `rail_before` | N x G | bytes node `b`'s GPUs send GPU `l` of the nodes other than `b` before this node | as `before`, summed per node |
/// | `inter_out`, `inter_in` | R each | bytes each rank sends to / receives from other nodes | all-gather of two numbers per rank |
/// | `node_splits` | 2 N R + 1 | what each rank sends each node and each node each rank, the count of inter-node blocks ([`NodeSplits`]) | all-gathers of N numbers per rank, an all-reduce |
/// | `lane_sums` | 3 R + 2 N² | optional: sums of `fast`'s balanced lanes that place this rank's ([`LaneSums`]) | from each node's [`NodeLanes`]: all-gathers, all-to-alls (its own table) |
/// | `stage_inputs` | R + 2 | optional, with `lane_sums` in place of `node_splits`: each GPU's first slice, the all-direct test's inputs ([`StageInputs`]) | its own table |
/// | `rank_rail_before` | R x G | bytes rank `s` sends GPU `l` of the nodes other than its own before this node | as `rail_before`, not summed |
/// | `rail_into_before` | N x G | bytes GPU `l` of the nodes other than `b` before this node send node `b` | from each rank's column, G numbers per (rank, node), summed per node |
///
/// The first six (`rank` to `cols`) are the fields every per-rank planner
/// reads; their names are stable. The others exist because a rank's
/// program names places in other ranks' buffers: `above` is where this
/// node's blocks land in every rank's output (the all-to-all(v) layout puts
/// block (s, d) after everything ranks below `s` send `d`), `before` is
/// where the blocks for this node sit in every rank's input (its row's
/// prefix), `rail_before` is where `hierarchical`'s relays on other nodes
/// keep what they send this node (their scratch regions are laid out node
/// by node), and `inter_out`/`inter_in` decide whether `fast` is
/// latency-bound (its busiest NIC, which may be anywhere).
/// `rank_rail_before` is where `pxn`'s relays on other nodes keep the
/// blocks they send this node (their scratch is laid out by destination,
/// and which blocks a relay carries depends on each source's rail), and
/// `rail_into_before` where `deepep`'s writes from this node land in the
/// scratch of their receivers (after the writes of the same rail from the
/// nodes before). Memory: N^2 + 3GR + 3R + 2NG numbers, O(R) for a fixed
/// node size and N <= sqrt(R); `node_splits` (staged `fast` only) adds 2NR,
/// `lane_sums` 3R + 2N^2, `stage_inputs` R + 2 (which, with `lane_sums`,
/// replace `node_splits`).
#[derive(Serialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct LocalTraffic {
    pub rank: usize,
    pub nodes: usize,
    pub gpus_per_node: usize,
    /// N x N, row-major: bytes node `a` sends node `b` (`a == b`: inside `a`).
    pub node_bytes: Vec<u64>,
    /// G x R: `rows[i * R + d]`, bytes GPU `i` of this rank's node sends rank `d`.
    pub rows: Vec<u64>,
    /// R x G: `cols[s * G + i]`, bytes rank `s` sends GPU `i` of this rank's node.
    pub cols: Vec<u64>,
    /// R: `above[d]`, bytes ranks `0..first` send rank `d`, where `first`
    /// is this node's first rank.
    pub above: Vec<u64>,
    /// R: `before[s]`, bytes rank `s` sends ranks `0..first`.
    pub before: Vec<u64>,
    /// N x G: `rail_before[b * G + l]`, bytes the GPUs of node `b` send GPU
    /// `l` of nodes `0..this node`, node `b` itself left out.
    pub rail_before: Vec<u64>,
    /// R: bytes each rank sends to ranks of other nodes.
    pub inter_out: Vec<u64>,
    /// R: bytes each rank receives from ranks of other nodes.
    pub inter_in: Vec<u64>,
    /// R x G: `rank_rail_before[s * G + l]`, bytes rank `s` sends GPU `l`
    /// of nodes `0..this node`, its own node left out (`rail_before` is
    /// its sum over each node's ranks).
    pub rank_rail_before: Vec<u64>,
    /// N x G: `rail_into_before[b * G + l]`, bytes GPU `l` of nodes
    /// `0..this node`, node `b` left out, sends the GPUs of node `b`. Only
    /// `deepep` reads it: empty means not gathered.
    pub rail_into_before: Vec<u64>,
    /// What staged `fast` and `spray` also read (their lanes balance every
    /// node pair); `None` where the job did not gather it, and then they
    /// refuse to plan the rank alone.
    pub node_splits: Option<NodeSplits>,
    /// The sums of the balanced lanes that place the rank's lanes in their
    /// scratch ([`LaneSums`], staged `fast` and `spray` only): given, the
    /// rank balances only its node's pairs (O(R + N²) instead of O(N² G));
    /// `None`: it balances every pair from `node_splits` itself. They
    /// depend on the planner's options: [`LaneSums::assemble`] from each
    /// node's [`NodeLanes`] (`Planner::node_lanes`) of the same planner.
    pub lane_sums: Option<LaneSums>,
    /// What staged `fast` and `spray` read of other nodes beyond
    /// `lane_sums` ([`StageInputs`]): given with `lane_sums`, the rank is
    /// planned without `node_splits` (which is then not read); `None`:
    /// `node_splits` is needed.
    pub stage_inputs: Option<StageInputs>,
}

/// What staged `fast` and `spray` read of other nodes besides the
/// [`LaneSums`]: with them, a rank's program needs no [`NodeSplits`]
/// (docs/algorithms.md, "What a rank reads of the lanes"). `R + 2`
/// numbers:
///
/// | field | size | what | who computes it, how a job gathers it |
/// |---|---|---|---|
/// | `inter_blocks` | 1 | non-empty blocks between ranks of different nodes | each rank counts its row's; summed (all-reduce) |
/// | `pairs_direct` | 1 | every node pair passes the direct test or is empty | each node from its rows ([`NodeParts::direct`]); AND-ed (an all-reduce of a count) |
/// | `first_slices` | R | each GPU's first lane slice that carries bytes: its index in the stages ([`u32::MAX`]: none) | each rank for its own GPU ([`crate::planner::Planner::first_slice`]: the stage decomposition and its node's lanes), once the node matrix is known; all-gathered (a second round) |
#[derive(Serialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct StageInputs {
    pub inter_blocks: u64,
    pub pairs_direct: bool,
    pub first_slices: Vec<u32>,
}

/// What one node contributes to every rank's [`LaneSums`] and
/// [`StageInputs`], computed by any of its ranks from its node's rows and
/// columns alone ([`crate::planner::Planner::node_parts`], O(R) for a node
/// of fixed size).
#[derive(Serialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeParts {
    /// The lanes of the pairs the node sends.
    pub lanes: NodeLanes,
    /// N x G: `into_len[a * G + l]`, bytes lane `l` of pair `(a, node)`
    /// sends (the lanes into the node, balanced from what every rank sends
    /// it; pair `(node, node)` empty). Their sums over the sending nodes
    /// before each node are that node's `land_before` ([`LaneSums`]).
    pub into_len: Vec<u64>,
    /// Every pair `(node, b)` passes the direct test or sends nothing.
    pub direct: bool,
}

/// The lanes of the node pairs one node sends (`fast`'s balancing of each
/// pair `(a, b)` for every `b`, module `sched::fast::balance`): computed by
/// node `a` alone from what its GPUs send each node (`Planner::node_lanes`,
/// O(R) for a node of fixed size), what it contributes to every rank's
/// [`LaneSums`]. `len[l * N + b]`: bytes lane `l` of pair `(a, b)` sends
/// (its GPU's own and those it gathers), `gathered[l * N + b]` those it
/// gathers from the other GPUs of `a`; pair `(a, a)` empty.
#[derive(Serialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeLanes {
    pub len: Vec<u64>,
    pub gathered: Vec<u64>,
}

/// The error of lane sums whose lane `rail` of pair `(a, b)` gathers more
/// than it sends.
pub(crate) fn gathers_more(a: usize, b: usize) -> Error {
    InputError::new(
        "local traffic",
        format!("`lane_sums.rail_gathered` exceeds `lane_sums.rail_len` at pair ({a}, {b})"),
    )
    .into()
}

/// What staged `fast` needs of the lanes of node pairs away from rank
/// `(node, rail)`'s node (docs/algorithms.md, "One rank's own program"):
/// the sums that place its node's lanes in their GPUs' scratch, and lane
/// `rail` of every pair. `3 R + 2 N²` numbers, each a sum of the
/// [`NodeLanes`] of some nodes:
///
/// | field | size | what | how a job gathers it |
/// |---|---|---|---|
/// | `gather` | R | bytes GPU `(a, l)` gathers for all its pairs (its gather regions) | each node's `G` sums, all-gathered |
/// | `gather_before` | R | the same for the pairs `(a, b)` with `b` before `node` | node `a`'s `G` sums for node `node`: an all-to-all |
/// | `land_before` | R | bytes the lanes from nodes before `node` land in GPU `(b, l)` | exclusive scan over nodes of each node's lane lengths (or node `b`, from its column, to each node: an all-to-all) |
/// | `rail_len`, `rail_gathered` | N x N each | lane `rail` of every pair `(a, b)` at `a N + b` | each node's `2 N` numbers, all-gathered among the ranks of rail `rail` |
#[derive(Serialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct LaneSums {
    pub gather: Vec<u64>,
    pub gather_before: Vec<u64>,
    pub land_before: Vec<u64>,
    pub rail_len: Vec<u64>,
    pub rail_gathered: Vec<u64>,
}

impl LaneSums {
    /// Checks that no lane `rail` of the `nodes x nodes` pairs gathers more
    /// than it sends (`rail_gathered <= rail_len`, entry by entry).
    pub(crate) fn check_gathered(&self, nodes: usize) -> Result<()> {
        let mut pairs = self.rail_gathered.iter().zip(&self.rail_len);
        match pairs.position(|(gathered, len)| gathered > len) {
            Some(at) => Err(gathers_more(at / nodes, at % nodes)),
            None => Ok(()),
        }
    }

    /// Empty sums of `nodes` nodes of `gpus` GPUs, keeping the
    /// allocations: [`LaneSums::add_node`] each node next. Without `rail`,
    /// the rail lanes are left empty (not kept).
    pub(crate) fn reset(&mut self, nodes: usize, gpus: usize, rail: bool) {
        let n = nodes * gpus;
        for v in [
            &mut self.gather,
            &mut self.gather_before,
            &mut self.land_before,
        ] {
            v.clear();
            v.resize(n, 0);
        }
        for v in [&mut self.rail_len, &mut self.rail_gathered] {
            v.clear();
            v.resize(if rail { nodes * nodes } else { 0 }, 0);
        }
    }

    /// Adds node `a`'s lanes (`len`, `gathered`: [`NodeLanes`]' layout, `G`
    /// rows of `N`) to the sums of rank `(node, rail)` (to its rail lanes
    /// where they are kept).
    pub(crate) fn add_node(
        &mut self,
        a: usize,
        (len, gathered): (&[u64], &[u64]),
        (node, rail): (usize, usize),
        (nodes, gpus): (usize, usize),
    ) {
        let nn = nodes;
        for (l, (gathered, lens)) in gathered
            .chunks_exact(nn)
            .zip(len.chunks_exact(nn))
            .take(gpus)
            .enumerate()
        {
            self.gather[a * gpus + l] = gathered.iter().sum();
            self.gather_before[a * gpus + l] = gathered[..node].iter().sum();
            if a < node {
                for (b, &len) in lens.iter().enumerate() {
                    self.land_before[b * gpus + l] += len;
                }
            }
        }
        if !self.rail_len.is_empty() {
            let (to, from) = (a * nn..(a + 1) * nn, rail * nn..(rail + 1) * nn);
            self.rail_len[to.clone()].copy_from_slice(&len[from.clone()]);
            self.rail_gathered[to].copy_from_slice(&gathered[from]);
        }
    }

    /// Rank `rank`'s sums from every node's lanes (`parts[a]`: node `a`'s),
    /// what the collectives of the table above deliver. Errors
    /// ([`crate::error::Error::Input`]) when `parts` is not one [`NodeLanes`] of
    /// `N G` numbers per node.
    pub fn assemble(
        parts: &[NodeLanes],
        rank: usize,
        nodes: usize,
        gpus: usize,
    ) -> Result<LaneSums> {
        check_rank(rank, nodes * gpus)?;
        if parts.len() != nodes {
            return Err(InputError::new(
                "node lanes",
                format!("{} nodes' lanes given, not {nodes}", parts.len()),
            )
            .into());
        }
        for (a, p) in parts.iter().enumerate() {
            if p.len.len() != nodes * gpus || p.gathered.len() != nodes * gpus {
                return Err(InputError::new(
                    "node lanes",
                    format!("node {a}'s lanes are not {} numbers each", nodes * gpus),
                )
                .into());
            }
        }
        let mut s = LaneSums::default();
        s.reset(nodes, gpus, true);
        let at = (rank / gpus, rank % gpus);
        for (a, p) in parts.iter().enumerate() {
            s.add_node(a, (&p.len, &p.gathered), at, (nodes, gpus));
        }
        Ok(s)
    }
}

/// The node-level split sizes of every rank, O(N R) numbers: what staged
/// `fast` needs beyond [`LocalTraffic`]'s other fields to balance every node
/// pair (each GPU's share of what its node sends another) and to decide
/// whether every pair goes direct.
#[derive(Serialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeSplits {
    /// R x N: `to_nodes[s * N + b]`, bytes rank `s` sends node `b` (each
    /// rank's row summed per node: an all-gather of N numbers per rank).
    pub to_nodes: Vec<u64>,
    /// N x R: `from_nodes[b * R + d]`, bytes node `b`'s ranks send rank `d`
    /// (each rank's column summed per node: N numbers per rank, all-gathered).
    pub from_nodes: Vec<u64>,
    /// Non-empty blocks between ranks of different nodes (a sum over ranks).
    pub inter_blocks: u64,
}

impl LocalTraffic {
    /// Rank `rank`'s part of `m` on `topo`. The node matrix and the prefix
    /// sums read the whole matrix once (what the gather computes in a job);
    /// the rest is O(R G). Errors ([`crate::error::Error::Input`]) when the matrix
    /// does not fit the topology or `rank` is not one of its ranks.
    pub fn from_matrix(m: &TrafficMatrix, rank: usize, topo: &Topology) -> Result<LocalTraffic> {
        let n = m.ranks();
        m.check_ranks(topo.ranks(), "traffic")?;
        check_rank(rank, n)?;
        let (nodes, g) = (topo.nodes(), topo.gpus_per_node());
        let a = rank / g;
        let first = a * g;
        let mut t = LocalTraffic {
            rank,
            nodes,
            gpus_per_node: g,
            node_bytes: vec![0; nodes * nodes],
            rows: m.as_slice()[first * n..(first + g) * n].to_vec(),
            cols: vec![0; n * g],
            above: vec![0; n],
            before: vec![0; n],
            rail_before: vec![0; nodes * g],
            inter_out: vec![0; n],
            inter_in: vec![0; n],
            rank_rail_before: vec![0; n * g],
            rail_into_before: vec![0; nodes * g],
            node_splits: None,
            lane_sums: None,
            stage_inputs: None,
        };
        let mut splits = NodeSplits {
            to_nodes: vec![0; n * nodes],
            from_nodes: vec![0; nodes * n],
            inter_blocks: 0,
        };
        // Column sums of the rows read so far: `above` is their value at
        // row `first`, `inter_in` their total less each node's own part.
        let mut col_sum = vec![0u64; n];
        for s in 0..n {
            if s == first {
                t.above.copy_from_slice(&col_sum);
            }
            let row = m.row(s);
            let b = s / g;
            t.cols[s * g..(s + 1) * g].copy_from_slice(&row[first..first + g]);
            t.before[s] = row[..first].iter().sum();
            for (acc, &x) in col_sum.iter_mut().zip(row) {
                *acc += x;
            }
            for (acc, &x) in t.inter_in[b * g..(b + 1) * g]
                .iter_mut()
                .zip(&row[b * g..(b + 1) * g])
            {
                *acc += x;
            }
            let node_row = &mut t.node_bytes[b * nodes..(b + 1) * nodes];
            let to_nodes = &mut splits.to_nodes[s * nodes..(s + 1) * nodes];
            let parts = node_row.iter_mut().zip(to_nodes).zip(row.chunks_exact(g));
            for (c, ((acc, to), part)) in parts.enumerate() {
                *to = part.iter().sum::<u64>();
                *acc += *to;
                // A rank of a node before this one writes node `c` (`deepep`).
                if s < first && c != b {
                    t.rail_into_before[c * g + s % g] += *to;
                }
            }
            for (acc, &x) in splits.from_nodes[b * n..(b + 1) * n].iter_mut().zip(row) {
                *acc += x;
            }
            let own = &row[b * g..(b + 1) * g];
            splits.inter_blocks += (row.iter().filter(|&&x| x > 0).count()
                - own.iter().filter(|&&x| x > 0).count()) as u64;
            t.inter_out[s] = row.iter().sum::<u64>() - row[b * g..(b + 1) * g].iter().sum::<u64>();
            // What rank `s` sends rail `l` of the nodes before this one, its
            // own node left out; and its node's sum.
            let rails = &mut t.rank_rail_before[s * g..(s + 1) * g];
            for (d_node, part) in row[..first].chunks_exact(g).enumerate() {
                if d_node != b {
                    for (acc, &x) in rails.iter_mut().zip(part) {
                        *acc += x;
                    }
                }
            }
            for (acc, &x) in t.rail_before[b * g..(b + 1) * g].iter_mut().zip(&*rails) {
                *acc += x;
            }
        }
        // So far `inter_in` holds what each rank receives from its own node.
        for (x, &col) in t.inter_in.iter_mut().zip(&col_sum) {
            *x = col - *x;
        }
        t.node_splits = Some(splits);
        Ok(t)
    }

    /// Number of ranks.
    pub fn ranks(&self) -> usize {
        self.nodes * self.gpus_per_node
    }

    /// This rank's node.
    pub fn node(&self) -> usize {
        self.rank / self.gpus_per_node.max(1)
    }

    /// Row of GPU `i` of this rank's node (what it sends every rank).
    pub fn row(&self, i: usize) -> &[u64] {
        let n = self.ranks();
        &self.rows[i * n..(i + 1) * n]
    }

    /// Bytes rank `s` sends GPU `i` of this rank's node.
    pub fn col(&self, s: usize, i: usize) -> u64 {
        self.cols[s * self.gpus_per_node + i]
    }

    /// What each GPU of this rank's node sends each node, `G` rows of `N`
    /// (`[l * N + b]`, from `rows`): the input of `Planner::node_lanes`.
    pub fn node_sends(&self) -> Vec<u64> {
        let g = self.gpus_per_node;
        let mut out = Vec::with_capacity(g * self.nodes);
        for i in 0..g {
            out.extend(
                self.row(i)
                    .chunks_exact(g.max(1))
                    .map(|p| p.iter().sum::<u64>()),
            );
        }
        out
    }

    /// Checks that this is one rank's traffic of a cluster shaped as
    /// `topo`: its shape, its rank, and every field's length, and that no
    /// lane of the lane sums gathers more than it sends. Errors
    /// ([`crate::error::Error::Input`]) name the field.
    pub fn check(&self, topo: &Topology) -> Result<()> {
        self.check_fields(topo, true)
    }

    /// [`LocalTraffic::check`] without reading the lane sums' `N²` values
    /// (their lengths are checked), which then costs O(1), not O(N²): for
    /// readers that do not read them (`Planner::first_slice`) or check the
    /// values they read (`Planner::program_local_into`: one rank's staged
    /// `fast` program reads lane `rail` of a few pairs, or of every pair
    /// below 32 nodes, where it checks them all).
    pub(crate) fn check_lengths(&self, topo: &Topology) -> Result<()> {
        self.check_fields(topo, false)
    }

    fn check_fields(&self, topo: &Topology, values: bool) -> Result<()> {
        let bad = |reason: String| -> crate::error::Error {
            InputError::new("local traffic", reason).into()
        };
        if self.nodes != topo.nodes() || self.gpus_per_node != topo.gpus_per_node() {
            return Err(bad(format!(
                "is for {} nodes of {} GPUs but the topology has {} of {}",
                self.nodes,
                self.gpus_per_node,
                topo.nodes(),
                topo.gpus_per_node()
            )));
        }
        let (n, nn, g) = (self.ranks(), self.nodes, self.gpus_per_node);
        check_rank(self.rank, n)?;
        // Only `deepep` reads `rail_into_before`, so a job gathers it for
        // `deepep` alone: elsewhere it may be empty.
        let into = if self.rail_into_before.is_empty() {
            0
        } else {
            nn * g
        };
        for (name, len, want) in [
            ("node_bytes", self.node_bytes.len(), nn * nn),
            ("rows", self.rows.len(), g * n),
            ("cols", self.cols.len(), n * g),
            ("above", self.above.len(), n),
            ("before", self.before.len(), n),
            ("rail_before", self.rail_before.len(), nn * g),
            ("inter_out", self.inter_out.len(), n),
            ("inter_in", self.inter_in.len(), n),
            ("rank_rail_before", self.rank_rail_before.len(), n * g),
            ("rail_into_before", self.rail_into_before.len(), into),
        ] {
            if len != want {
                return Err(bad(format!("`{name}` has {len} numbers, not {want}")));
            }
        }
        if let Some(s) = &self.lane_sums {
            for (name, len, want) in [
                ("lane_sums.gather", s.gather.len(), n),
                ("lane_sums.gather_before", s.gather_before.len(), n),
                ("lane_sums.land_before", s.land_before.len(), n),
                ("lane_sums.rail_len", s.rail_len.len(), nn * nn),
                ("lane_sums.rail_gathered", s.rail_gathered.len(), nn * nn),
            ] {
                if len != want {
                    return Err(bad(format!("`{name}` has {len} numbers, not {want}")));
                }
            }
            if values {
                s.check_gathered(nn)?;
            }
        }
        if let Some(inputs) = &self.stage_inputs {
            if self.lane_sums.is_none() {
                return Err(bad(
                    "`stage_inputs` given without `lane_sums`: without `node_splits` a rank \
                     places its lanes by their sums"
                        .into(),
                ));
            }
            let len = inputs.first_slices.len();
            if len != n {
                return Err(bad(format!(
                    "`stage_inputs.first_slices` has {len} numbers, not {n}"
                )));
            }
        }
        if let Some(splits) = &self.node_splits {
            for (name, len) in [
                ("node_splits.to_nodes", splits.to_nodes.len()),
                ("node_splits.from_nodes", splits.from_nodes.len()),
            ] {
                if len != n * nn {
                    return Err(bad(format!("`{name}` has {len} numbers, not {}", n * nn)));
                }
            }
        }
        Ok(())
    }
}

/// Rank `rank`'s part of a whole plan, into `out`: the reference every
/// per-rank planner must equal. Errors when the rank is not in the plan or
/// a dependency names no transfer.
pub fn slice_into(plan: &Plan, rank: usize, out: &mut LocalProgram) -> Result<()> {
    check_rank(rank, plan.ranks as usize)?;
    out.reset(
        &plan.algorithm,
        rank,
        plan.ranks as usize,
        plan.gpus_per_node as usize,
    );
    out.scratch_bytes = plan.scratch_bytes(rank);
    let me = rank as u32;
    for (i, t) in plan.transfers.iter().enumerate() {
        if t.bytes == 0 || (t.src != me && t.dst != me) {
            continue;
        }
        let mut deps = KeyDeps::new();
        for &d in &t.deps {
            let dep = plan.transfers.get(d as usize).ok_or_else(|| {
                InputError::new(
                    "plan",
                    format!("transfer {i} depends on transfer {d}, which does not exist"),
                )
            })?;
            if dep.bytes > 0 {
                deps.push(TransferKey::of(dep));
            }
        }
        out.push(t, deps);
    }
    out.sort();
    Ok(())
}

/// The whole plan in canonical form: the transfers that move bytes sorted
/// by key, dependencies renumbered and sorted (those on transfers of zero
/// bytes dropped).
pub fn canonical(plan: &Plan) -> Plan {
    let mut order: Vec<usize> = (0..plan.transfers.len())
        .filter(|&i| plan.transfers[i].bytes > 0)
        .collect();
    order.sort_unstable_by_key(|&i| TransferKey::of(&plan.transfers[i]));
    let mut new_index = vec![u32::MAX; plan.transfers.len()];
    for (k, &i) in order.iter().enumerate() {
        new_index[i] = k as u32;
    }
    let mut out = Plan {
        algorithm: plan.algorithm.clone(),
        ranks: plan.ranks,
        gpus_per_node: plan.gpus_per_node,
        scratch: plan.scratch.clone(),
        transfers: Vec::with_capacity(order.len()),
        chunking: plan.chunking.clone(),
        traffic_fingerprint: plan.traffic_fingerprint.clone(),
    };
    for &i in &order {
        let mut t = plan.transfers[i].clone();
        let mut deps: Vec<u32> = t
            .deps
            .iter()
            .filter_map(|&d| new_index.get(d as usize).copied())
            .filter(|&d| d != u32::MAX)
            .collect();
        deps.sort_unstable();
        t.deps = Deps::from_vec(deps);
        out.transfers.push(t);
    }
    out
}

/// One plan from every rank's program (in rank order), in canonical form.
/// Errors when the programs disagree: a transfer seen differently by its
/// two ends, one end missing, two transfers with one key, or a dependency
/// on a key no program has.
pub fn stitch(progs: &[LocalProgram]) -> Result<Plan> {
    let bad =
        |reason: String| -> crate::error::Error { InputError::new("programs", reason).into() };
    let first = progs.first().ok_or_else(|| bad("no programs".into()))?;
    let n = first.ranks as usize;
    if progs.len() != n {
        return Err(bad(format!("{} programs for {n} ranks", progs.len())));
    }
    let mut plan = Plan::new(first.algorithm.clone(), n, first.gpus_per_node as usize);
    // Every transfer with both of its ends: (key, transfer, deps, ends seen).
    let mut seen: HashMap<TransferKey, (Transfer, KeyDeps, u32)> = HashMap::new();
    for (r, p) in progs.iter().enumerate() {
        if p.rank as usize != r || p.ranks as usize != n || p.algorithm != first.algorithm {
            return Err(bad(format!(
                "program {r} is not rank {r}'s of the same plan"
            )));
        }
        if p.scratch_bytes > 0 {
            plan.need_scratch(r, p.scratch_bytes);
        }
        for o in &p.ops {
            let key = o.key(p.rank);
            let t = o.transfer(p.rank);
            let ends = if o.op == OpKind::Copy { 2 } else { 1 };
            match seen.get_mut(&key) {
                None => {
                    seen.insert(key, (t, o.deps.clone(), ends));
                }
                Some((t0, deps0, count)) => {
                    if *t0 != t || *deps0 != o.deps || *count + ends > 2 {
                        return Err(bad(format!(
                            "rank {r} and a peer disagree on the transfer into {key:?}"
                        )));
                    }
                    *count += ends;
                }
            }
        }
    }
    let mut all: Vec<(TransferKey, Transfer, KeyDeps, u32)> = seen
        .into_iter()
        .map(|(k, (t, d, c))| (k, t, d, c))
        .collect();
    all.sort_unstable_by_key(|x| x.0);
    let index: HashMap<TransferKey, u32> = all
        .iter()
        .enumerate()
        .map(|(i, x)| (x.0, i as u32))
        .collect();
    for (key, mut t, deps, ends) in all {
        if ends != 2 {
            return Err(bad(format!("the transfer into {key:?} has one end only")));
        }
        let mut ids = Vec::with_capacity(deps.len());
        for d in &deps {
            let id = index
                .get(d)
                .ok_or_else(|| bad(format!("a dependency on {d:?}, which no program has")))?;
            ids.push(*id);
        }
        ids.sort_unstable();
        t.deps = Deps::from_vec(ids);
        plan.transfers.push(t);
    }
    Ok(plan)
}

/// Where each block rank `x` sends lands: `land[d]` is the offset of block
/// (x, d) in `d`'s output, the column sums of the ranks above `x`.
pub(crate) fn landing(t: &LocalTraffic, land: &mut Vec<u64>) {
    let j = t.rank % t.gpus_per_node;
    land.clear();
    land.extend_from_slice(&t.above);
    for i in 0..j {
        for (acc, &b) in land.iter_mut().zip(t.row(i)) {
            *acc += b;
        }
    }
}

/// `direct` (sched/direct.rs) for one rank: its row and its column, the
/// offsets in the other ends' buffers from `above` (plus the rows of its
/// node's GPUs before it) and `before` (plus the columns before its own).
/// `name` and `path` are those of the plan it is a slice of (`fast`'s
/// merged plan is `direct` under another name).
pub(crate) fn direct_local(
    t: &LocalTraffic,
    name: &str,
    path: impl Fn(usize, usize) -> Path,
    out: &mut LocalProgram,
) {
    let (n, g) = (t.ranks(), t.gpus_per_node);
    out.reset(name, t.rank, n, g);
    let x = t.rank;
    let j = x % g;
    let mut land = Vec::new();
    landing(t, &mut land);
    let mut src_off = 0u64;
    for (d, &bytes) in t.row(j).iter().enumerate() {
        if bytes > 0 {
            out.push(
                &block(path(x, d), x, d, bytes, src_off, land[d]),
                Vec::new(),
            );
        }
        src_off += bytes;
    }
    // What lands in the rank: each source's row up to the rank.
    let mut dst_off = 0u64;
    for s in 0..n {
        let bytes = t.col(s, j);
        if bytes > 0 && s != x {
            let src_off = t.before[s] + (0..j).map(|i| t.col(s, i)).sum::<u64>();
            out.push(
                &block(path(s, x), s, x, bytes, src_off, dst_off),
                Vec::new(),
            );
        }
        dst_off += bytes;
    }
    out.sort();
}

/// Block (s, d) straight from `s`'s input to `d`'s output.
pub(crate) fn block(
    path: Path,
    s: usize,
    d: usize,
    bytes: u64,
    src_off: u64,
    dst_off: u64,
) -> Transfer {
    Transfer {
        src: s as u32,
        src_buf: Buffer::Input,
        src_off,
        dst: d as u32,
        dst_buf: Buffer::Output,
        dst_off,
        bytes,
        path,
        step: 0,
        deps: Deps::new(),
    }
}

/// `hierarchical` (sched/hierarchical.rs) for rank `x` = GPU `j` of node
/// `a`: the rows of its node (what it gathers and relays), its own column
/// (what lands in it), `above` (where its relayed blocks land) and
/// `rail_before` (where the relays of rail `j` on other nodes keep what
/// they send it).
pub(crate) fn hierarchical_local(topo: &Topology, t: &LocalTraffic, out: &mut LocalProgram) {
    let (n, g, nodes) = (t.ranks(), t.gpus_per_node, t.nodes);
    out.reset("hierarchical", t.rank, n, g);
    let x = t.rank;
    let (a, j) = (x / g, x % g);
    let path = |s: usize, d: usize| crate::plan::path_between(topo, s, d);
    // Offset of node `b`'s region in the scratch of the relays of the
    // rank's own node: `regions[rail * nodes + b]`, and the rank's scratch.
    let mut regions = vec![0u64; g * nodes];
    for i in 0..g {
        for (d, &bytes) in t.row(i).iter().enumerate() {
            regions[(d % g) * nodes + d / g] += bytes;
        }
    }
    for rail in 0..g {
        let mut acc = 0u64;
        for b in 0..nodes {
            let at = &mut regions[rail * nodes + b];
            let bytes = if b == a { 0 } else { *at };
            *at = acc;
            acc += bytes;
        }
        if rail == j {
            out.scratch_bytes = acc;
        }
    }
    // Where the blocks of the rank (and of its node's GPUs before it) land.
    let mut land = Vec::new();
    landing(t, &mut land);
    // The rank's own column, summed: `own_col[s]` is where block (s, x) lands.
    let mut own_col = Vec::with_capacity(n + 1);
    let mut acc = 0u64;
    for s in 0..n {
        own_col.push(acc);
        acc += t.col(s, j);
    }
    let key = |rank: usize, off: u64| TransferKey {
        rank: rank as u32,
        buf: Buffer::Scratch,
        off,
    };
    // What GPUs `0..i` of the rank's node send rank `d`.
    let node_before = |i: usize, d: usize| -> u64 { (0..i).map(|i2| t.row(i2)[d]).sum() };
    // Phase 1 from the rank: its row.
    let mut src_off = 0u64;
    for (d, &bytes) in t.row(j).iter().enumerate() {
        let (b, jd) = (d / g, d % g);
        if bytes > 0 {
            let tr = if b == a {
                block(path(x, d), x, d, bytes, src_off, land[d])
            } else {
                let relay = a * g + jd;
                let before = node_before(j, d);
                to_scratch(
                    path(x, relay),
                    x,
                    relay,
                    bytes,
                    src_off,
                    regions[jd * nodes + b] + before,
                )
            };
            out.push(&tr, []);
        }
        src_off += bytes;
    }
    // Phase 1 into the rank: intra-node blocks, and what it relays.
    for i in (0..g).filter(|&i| i != j) {
        let s = a * g + i;
        let mut src_off = 0u64;
        for (d, &bytes) in t.row(i).iter().enumerate() {
            let (b, jd) = (d / g, d % g);
            if bytes > 0 && (d == x || (b != a && jd == j)) {
                let tr = if d == x {
                    block(path(s, d), s, d, bytes, src_off, own_col[s])
                } else {
                    let before = node_before(i, d);
                    to_scratch(
                        path(s, x),
                        s,
                        x,
                        bytes,
                        src_off,
                        regions[j * nodes + b] + before,
                    )
                };
                out.push(&tr, []);
            }
            src_off += bytes;
        }
    }
    // Phase 2 from the rank (relay (a, j)) to GPU j of every other node, and
    // into the rank from the relays of rail j of every other node.
    for b in (0..nodes).filter(|&b| b != a) {
        for (src_node, dst_node) in [(a, b), (b, a)] {
            let relay = src_node * g + j;
            let d = dst_node * g + j;
            let region = if src_node == a {
                regions[j * nodes + dst_node]
            } else {
                t.rail_before[src_node * g + j]
            };
            let mut deps = KeyDeps::new();
            let mut bytes = 0u64;
            for i in 0..g {
                let part = if src_node == a {
                    t.row(i)[d]
                } else {
                    t.col(src_node * g + i, j)
                };
                if part > 0 {
                    deps.push(key(relay, region + bytes));
                }
                bytes += part;
            }
            if bytes == 0 {
                continue;
            }
            let dst_off = if d == x {
                own_col[src_node * g]
            } else {
                t.above[d]
            };
            let nic = topo.rail_of(relay) as u32;
            let tr = from_scratch(Path::Rdma { nic }, relay, d, bytes, region, dst_off);
            out.push(&tr, deps);
        }
    }
    out.sort();
}

/// A relay's first hop (`hierarchical`, `pxn`, `deepep`): from `s`'s input
/// into `relay`'s scratch, in step 0.
pub(crate) fn to_scratch(
    path: Path,
    s: usize,
    relay: usize,
    bytes: u64,
    src_off: u64,
    dst_off: u64,
) -> Transfer {
    Transfer {
        src: s as u32,
        src_buf: Buffer::Input,
        src_off,
        dst: relay as u32,
        dst_buf: Buffer::Scratch,
        dst_off,
        bytes,
        path,
        step: 0,
        deps: Deps::new(),
    }
}

/// A relay's second hop: from `relay`'s scratch into `d`'s output, in step 1.
pub(crate) fn from_scratch(
    path: Path,
    relay: usize,
    d: usize,
    bytes: u64,
    src_off: u64,
    dst_off: u64,
) -> Transfer {
    Transfer {
        src: relay as u32,
        src_buf: Buffer::Scratch,
        src_off,
        dst: d as u32,
        dst_buf: Buffer::Output,
        dst_off,
        bytes,
        path,
        step: 1,
        deps: Deps::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_keys_sort_as_the_keys() {
        let bufs = [Buffer::Scratch, Buffer::Input, Buffer::Output];
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut keys: Vec<TransferKey> = (0..500)
            .map(|i| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                TransferKey {
                    // Few ranks and offsets, so that ties on the first
                    // fields are common; the extremes too.
                    rank: [0, 1, 7, u32::MAX][(x % 4) as usize],
                    buf: bufs[(x >> 8) as usize % 3],
                    off: if i % 50 == 0 {
                        u64::MAX
                    } else {
                        (x >> 16) % 64
                    },
                }
            })
            .collect();
        let mut packed = keys.clone();
        keys.sort();
        packed.sort_by_key(|k| k.packed());
        assert_eq!(keys, packed);
    }

    fn t(src: u32, dst: u32, dst_buf: Buffer, dst_off: u64, bytes: u64, deps: &[u32]) -> Transfer {
        Transfer {
            src,
            src_buf: Buffer::Input,
            src_off: 0,
            dst,
            dst_buf,
            dst_off,
            bytes,
            path: if src == dst {
                Path::Local
            } else {
                Path::Nvlink
            },
            step: 0,
            deps: deps.iter().copied().collect(),
        }
    }

    /// Canonical order is by key; deps follow their transfers; transfers
    /// of zero bytes and deps on them go; slicing every rank and stitching
    /// gives the canonical plan back.
    #[test]
    fn canonical_and_round_trip() {
        let mut p = Plan::new("test", 2, 2);
        p.push(t(1, 0, Buffer::Output, 8, 4, &[])); // 0 -> key (0, output, 8)
        p.push(t(0, 1, Buffer::Scratch, 0, 0, &[])); // 1: zero bytes, dropped
        p.push(t(0, 0, Buffer::Output, 0, 8, &[1])); // 2 -> key (0, output, 0)
        p.push(t(0, 1, Buffer::Output, 0, 4, &[0, 2])); // 3 -> key (1, output, 0)
        p.need_scratch(1, 16);
        let c = canonical(&p);
        let seen: Vec<(u32, u64, Vec<u32>)> = c
            .transfers
            .iter()
            .map(|t| (t.dst, t.dst_off, t.deps.to_vec()))
            .collect();
        assert_eq!(
            seen,
            vec![(0, 0, vec![]), (0, 8, vec![]), (1, 0, vec![0, 1])]
        );
        let progs: Vec<LocalProgram> = (0..2)
            .map(|r| {
                let mut out = LocalProgram::default();
                slice_into(&p, r, &mut out).unwrap();
                out
            })
            .collect();
        assert_eq!(progs[0].ops[0].op, OpKind::Copy);
        assert_eq!(progs[1].scratch_bytes, 16);
        assert_eq!(stitch(&progs).unwrap(), c);
        // Two transfers writing one place cannot both be named.
        let mut twice = p.clone();
        twice.push(t(1, 0, Buffer::Output, 8, 4, &[]));
        let progs: Vec<LocalProgram> = (0..2)
            .map(|r| {
                let mut out = LocalProgram::default();
                slice_into(&twice, r, &mut out).unwrap();
                out
            })
            .collect();
        assert!(stitch(&progs).is_err());
    }
    /// Every field of a rank's traffic on 3 nodes of 2 GPUs, from a matrix
    /// whose entries say where they are (`10 s + d`), against sums written
    /// out by hand; and the shape checks.
    #[test]
    fn local_traffic_fields() {
        let topo = Topology::preset("dgx-h100", 3, Some(2)).unwrap();
        let mut m = TrafficMatrix::zeros(6);
        for s in 0..6 {
            for d in 0..6 {
                m.set(s, d, (10 * s + d) as u64);
            }
        }
        // Rank 3: GPU 1 of node 1, whose first rank is 2.
        let t = LocalTraffic::from_matrix(&m, 3, &topo).unwrap();
        let e = |s: usize, d: usize| (10 * s + d) as u64;
        assert_eq!(t.row(0), m.row(2));
        assert_eq!(t.row(1), m.row(3));
        assert_eq!(t.col(5, 0), e(5, 2));
        assert_eq!(t.col(0, 1), e(0, 3));
        // Node 2 to node 0: ranks 4, 5 to ranks 0, 1.
        assert_eq!(t.node_bytes[2 * 3], e(4, 0) + e(4, 1) + e(5, 0) + e(5, 1));
        assert_eq!(t.above[4], e(0, 4) + e(1, 4));
        assert_eq!(t.before[5], e(5, 0) + e(5, 1));
        // Node 2's GPUs to GPU 1 of node 0 (the only node before node 1).
        assert_eq!(t.rail_before[2 * 2 + 1], e(4, 1) + e(5, 1));
        // Node 0 is left out of its own regions.
        assert_eq!(t.rail_before[1], 0);
        assert_eq!(t.inter_out[0], (2..6).map(|d| e(0, d)).sum::<u64>());
        assert_eq!(t.inter_in[5], (0..4).map(|s| e(s, 5)).sum::<u64>());
        let splits = t.node_splits.as_ref().unwrap();
        // Rank 4 to node 0, node 2 to rank 1.
        assert_eq!(splits.to_nodes[4 * 3], e(4, 0) + e(4, 1));
        assert_eq!(splits.from_nodes[2 * 6 + 1], e(4, 1) + e(5, 1));
        // Every block but (0, 0) is non-empty; each rank has 2 of its 6
        // inside its node.
        assert_eq!(splits.inter_blocks, 36 - 12);
        // Rank 4 (node 2) to GPU 1 of node 0; node 0's ranks have no node
        // before theirs but their own.
        assert_eq!(t.rank_rail_before[4 * 2 + 1], e(4, 1));
        assert_eq!(t.rank_rail_before[..4], [0; 4]);
        // GPU 0 of node 0 (rank 0) to node 2; nothing before node 1 but
        // node 0 itself writes node 0.
        assert_eq!(t.rail_into_before[2 * 2], e(0, 4) + e(0, 5));
        assert_eq!(t.rail_into_before[..2], [0; 2]);
        t.check(&topo).unwrap();
        let mut bad_splits = t.clone();
        if let Some(s) = bad_splits.node_splits.as_mut() {
            s.from_nodes.pop();
        }
        let err = bad_splits.check(&topo).unwrap_err().to_string();
        assert!(err.contains("from_nodes"), "{err}");
        // Shapes that do not fit.
        let mut short = t.clone();
        short.above.pop();
        let err = short.check(&topo).unwrap_err().to_string();
        assert!(err.contains("`above`"), "{err}");
        let other = Topology::preset("dgx-h100", 2, Some(3)).unwrap();
        assert!(t.check(&other).is_err());
        assert!(LocalTraffic::from_matrix(&m, 6, &topo).is_err());
        assert!(LocalTraffic::from_matrix(&TrafficMatrix::zeros(4), 0, &topo).is_err());
    }

    /// `LocalProgram::sort` (the radix sort of packed keys, or the fallback
    /// past 64 bits) against sorting by the whole key with the ops' order
    /// breaking ties (what `sort_by_cached_key` gives): keys of few and of
    /// many bits, in each field, with repeats, so ties, skipped bytes and
    /// the fallback are all met.
    #[test]
    fn sort_is_the_stable_sort_by_key() {
        use proptest::prelude::*;
        use proptest::test_runner::{Config, TestRunner};
        let op = |peer: u32, send: bool, buf: u8, off: u64, tag: u64| LocalOp {
            op: if send { OpKind::Send } else { OpKind::Recv },
            peer,
            bytes: tag,
            src_buf: Buffer::Input,
            src_off: 0,
            dst_buf: [Buffer::Input, Buffer::Output, Buffer::Scratch][buf as usize],
            dst_off: off,
            path: Path::Nvlink,
            step: 0,
            deps: KeyDeps::new(),
        };
        // Per op: a small peer (or, in wide cases, one near `u32::MAX`), a
        // small offset shifted by the case's shift (or any `u64` in wide
        // cases), so keys repeat.
        let ops = prop::collection::vec(
            (
                0u32..6,
                any::<bool>(),
                any::<bool>(),
                0u8..3,
                0u64..5,
                any::<u64>(),
            ),
            0..300,
        );
        let mut runner = TestRunner::new(Config::with_cases(300));
        let case = (ops, 0u32..5, 0u32..64, any::<bool>(), any::<bool>());
        runner
            .run(&case, |(ops, me, shift, wide_rank, wide_off)| {
                let mut p = LocalProgram {
                    rank: me,
                    ..LocalProgram::default()
                };
                for (k, &(peer, send, far, buf, off, any_off)) in ops.iter().enumerate() {
                    let peer = if wide_rank && far {
                        u32::MAX - peer
                    } else {
                        peer
                    };
                    let off = if wide_off && far {
                        any_off
                    } else {
                        off << shift
                    };
                    p.ops.push(op(peer, send, buf, off, k as u64));
                }
                let mut want = p.ops.clone();
                want.sort_by_key(|x| x.key(me).packed());
                // Buffers reused from another program sort as fresh ones.
                let mut bufs = SortBuffers::default();
                let mut other = p.clone();
                other.ops.reverse();
                other.ops.truncate(p.ops.len() / 2 + 1);
                other.sort_with(&mut bufs);
                let mut again = p.clone();
                p.sort();
                again.sort_with(&mut bufs);
                prop_assert_eq!(&p.ops, &want);
                prop_assert_eq!(again.ops, want);
                Ok(())
            })
            .unwrap();
    }
}
