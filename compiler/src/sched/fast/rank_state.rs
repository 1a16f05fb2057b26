//! What the emitter keeps for one rank's program (`rank.rs`), data and
//! their own methods only: the [`RankSink`] its steps write the program
//! through, with the [`RankPairs`] that names the stage pairs it asks for;
//! where the lanes it keeps sit ([`rank_lane_index`]); and the
//! [`StageMemo`], the stages its GPU's first slice decomposed. The steps
//! that fill them are `impl Emitter` in `rank.rs` and `lanes.rs`.

use std::ops::Range;

use super::rotation::RotationStages;
use super::sink::{key_of, Forward, Sink};
use super::stages::StagePair;
use crate::plan::{Buffer, Transfer};
use crate::rank::{collect_deps, KeyDeps, LocalOp, LocalProgram, OpKind, SortBuffers, TransferKey};

/// Where lane `l` of node pair `(a, b)` sits in the lanes of rank
/// `(node, rail)`'s program (`Emitter::balance_rank`): its node's row
/// (`(node, b, l)`) and column (`(a, node, l)`), then the `N²` lanes
/// `rail` of every pair (at `2 N G + a N + b`; not kept where they are
/// read from the lane sums, `Emitter::place_rail_lanes`). Other lanes are
/// not kept.
#[inline(always)]
pub(super) fn rank_lane_index(
    nodes: usize,
    gpus: usize,
    node: usize,
    rail: usize,
    a: usize,
    b: usize,
    l: usize,
) -> usize {
    if a == node {
        b * gpus + l
    } else if b == node {
        (nodes + a) * gpus + l
    } else {
        debug_assert_eq!(l, rail, "lane {l} of ({a}, {b}) is not kept");
        2 * nodes * gpus + a * nodes + b
    }
}

/// Lane `rail` of the node pairs away from a rank's node, read from the
/// lane sums where the rank's program does not keep them
/// (`Emitter::balance_rank` with `lazy`; none of them is direct: only the
/// rank's node's pairs are balanced or sent directly): their lengths are
/// the sums' `rail_len` (read in place); `gather[b]`: what GPU `(b, rail)`
/// gathers (its landing regions come after); `node_len[b]`: the length
/// of the rank's node's own lane `rail` to `b`. The lanes the rank's chain
/// pairs use are placed once they are picked
/// (`Emitter::place_rail_lanes`, into `chain`): no `N²` lanes or running
/// sums are written.
#[derive(Clone, Debug, Default)]
pub(crate) struct RailLanes {
    pub(super) from_sums: bool,
    pub(super) gather: Vec<u64>,
    pub(super) node_len: Vec<u64>,
    /// Per stage pair of the rank (`RankPairs::pairs`, by index): its lane
    /// where it is a chain pair.
    pub(super) chain: Vec<ChainLane>,
    /// The chain pairs by sending node (`(receiving node, index)`), each
    /// node's from `rows[a]`; the columns' running sums.
    pub(super) order: Vec<(u32, u32)>,
    pub(super) rows: Vec<u32>,
    pub(super) land: Vec<u64>,
}

/// What a chain pair's emission reads of its lane (`Emitter::emit_chain_pair`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ChainLane {
    /// Its carrier's own bytes (sent before the gathered ones).
    pub(super) own: u64,
    /// Own and gathered bytes.
    pub(super) len: u64,
    /// Where it lands in the receiver's scratch.
    pub(super) recv_base: u64,
    /// The bytes of its node pair (read with the lane, in row order).
    pub(super) total: u64,
}

/// The stages `Emitter::first_slice_of` decomposed for a rank, kept for
/// its program on the same node matrix (`Emitter::decompose_rank`): a
/// job needs them twice per call, for its GPU's first slice and then for
/// its program.
#[derive(Clone, Debug, Default)]
pub(crate) struct StageMemo {
    pub(super) node_bytes: Vec<u64>,
    pub(super) stages: Vec<StagePair>,
    /// The stages are the chunked rotation, kept as `rotation`
    /// (`Emitter::rotated_rank`), `stages` empty.
    pub(super) rotated: bool,
    pub(super) rotation: RotationStages,
    pub(super) stage_count: u32,
    /// Their [`Emitter::chunk_bounds`](super::emit::Emitter).
    pub(super) bounds: Option<(f64, f64)>,
    pub(super) valid: bool,
}

/// A stage pair one rank's program emits: the pair, its key (its index
/// in `stages`, or with `Emitter::rotated_rank` its stage number: what
/// `first_slice` and `last_pair` hold) and the bytes its node pair sent
/// in the stage pairs before it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RankPair {
    pub(super) pair: StagePair,
    pub(super) key: u32,
    pub(super) before: u64,
}

/// The stage pairs one rank's program emits (`Emitter::rank_pairs`), and
/// the buffers that find them.
#[derive(Clone, Debug, Default)]
pub(crate) struct RankPairs {
    /// Each pair to emit, in stage order.
    pub(super) pairs: Vec<RankPair>,
    /// With `Emitter::rotated_rank`: the pieces of the rank's node, in
    /// stage order, and the bytes their pairs sent before them.
    pub(super) pieces: Vec<(StagePair, u64)>,
    /// With `Emitter::rotated_rank`: the pairs picked, while they are put
    /// in stage order.
    pub(super) sorted: Vec<RankPair>,
    /// Per node pair: bytes sent so far.
    pub(super) sent: Vec<u64>,
    /// Per stage pair: the bytes its node pair sent before it.
    pub(super) before: Vec<u64>,
    /// Bit `i`: stage pair `i` is emitted (a pair can be picked several
    /// times, by its node and by both of its chains).
    pub(super) picked: Vec<u64>,
    /// The pairs of the rank's node (it sends or receives), in stage order.
    pub(super) own: Vec<u32>,
    /// Per pair, the last other pair before it on the chains of the rail
    /// it is on or meets: chain `s` (GPU `(s, j)` sending) at `[0]`,
    /// chain `N + d` (GPU `(d, j)` receiving) at `[1]`
    /// ([`NONE`](super::slots::NONE) if none). "Other": not of the rank's
    /// node, whose pairs are on no chain of the rail (they meet one).
    pub(super) prev: Vec<[u32; 2]>,
    /// Per chain: its last pair so far (while the pairs are read), then
    /// one past the rank's last meeting with it (a meeting takes only the
    /// pairs after that one: the earlier ones it left are behind a window
    /// already emitted).
    pub(super) last: Vec<u32>,
}

impl RankPairs {
    pub(super) fn pick(&mut self, i: u32) {
        self.picked[i as usize / 64] |= 1 << (i % 64);
    }

    /// The picked pairs of `stages` into `pairs`, in stage order.
    pub(super) fn collect(&mut self, stages: &[StagePair]) {
        self.pairs.clear();
        for (k, &word) in self.picked.iter().enumerate() {
            let mut bits = word;
            while bits != 0 {
                let i = k * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                self.pairs.push(RankPair {
                    pair: stages[i],
                    key: i as u32,
                    before: self.before[i],
                });
            }
        }
    }
}

/// Where the emitter writes one rank's program: the key of every transfer
/// it emits (dependencies name transfers by their emission ids), and the
/// rank's side of the transfers that start or end at it (its ops). It
/// asks for the lanes whose transfers, or whose chains, the rank's
/// program names:
/// - lane `j` (its rail) of the other node pairs, in the stage pairs
///   `Emitter::rank_pairs` picks: its sends and receives wait on sends
///   at most `depth` (windows counted in sends) or `2 depth` (in bytes)
///   slots back in the chains of the GPUs of its rail, wherever the stage
///   order put them;
/// - every lane of its node: its balancing moves out wait on the sends of
///   the carrier they feed, and its intra-node blocks on the early moves
///   of its node;
/// - every lane into its node: it receives their forwards.
///
/// and only the forwards and intra-node blocks of its node, of those
/// forwards only the rank's ([`Sink::forwards_into`]), and of the
/// balancing moves on other nodes only those its own receives wait on
/// ([`Sink::moves_for`]): nothing it keeps names the others.
#[derive(Clone, Debug, Default)]
pub(crate) struct RankSink {
    rank: u32,
    pub(super) node: usize,
    rail: usize,
    /// Key of each transfer emitted, by id (`rank: u32::MAX`: moves no bytes).
    keys: Vec<TransferKey>,
    /// The rank's side of each transfer that starts or ends at it, its
    /// dependencies by key (those on transfers of no bytes left out, as
    /// in the canonical plan): a transfer's dependencies are emitted
    /// before it, so their keys are known as it is pushed.
    ops: Vec<LocalOp>,
    /// The stage pairs it asks for.
    pub(super) pairs: RankPairs,
    /// The sort's buffers, kept from program to program.
    sort: SortBuffers,
}

impl RankSink {
    pub(super) fn reset(&mut self, rank: usize, gpus: usize) {
        self.rank = rank as u32;
        self.node = rank / gpus;
        self.rail = rank % gpus;
        self.keys.clear();
        self.ops.clear();
    }

    /// Takes the (empty) ops of `out`, where the rank's ops are written
    /// as they are emitted, so their buffer is the program's own.
    pub(super) fn write_into(&mut self, out: &mut LocalProgram) {
        debug_assert!(out.ops.is_empty());
        self.ops = std::mem::take(&mut out.ops);
        self.ops.clear();
    }

    /// The rank's ops back into `out` ([`RankSink::write_into`] first),
    /// sorted.
    pub(super) fn finish(&mut self, out: &mut LocalProgram) {
        out.ops = std::mem::take(&mut self.ops);
        out.sort_with(&mut self.sort);
    }
}

impl RankSink {
    /// The keys of transfers `ids` (emitted before), those of transfers
    /// of no bytes left out: up to four written inline at once, more
    /// (rare) as `LocalProgram::push` collects them.
    #[inline]
    fn key_deps(&self, ids: &[u32]) -> KeyDeps {
        if ids.len() > 4 {
            let keys = ids.iter().map(|&d| self.keys[d as usize]);
            return collect_deps(keys.filter(|k| k.rank != u32::MAX));
        }
        let none = key_of(0, Buffer::Input, 0, 0);
        let mut buf = [none; 4];
        let mut n = 0;
        for &d in ids {
            let k = self.keys[d as usize];
            buf[n] = k;
            n += usize::from(k.rank != u32::MAX);
        }
        KeyDeps::from_buf_and_len(buf, n)
    }
}

impl Sink for RankSink {
    fn len(&self) -> usize {
        self.keys.len()
    }

    fn push(&mut self, t: Transfer) -> u32 {
        let id = self.keys.len() as u32;
        self.keys
            .push(key_of(t.dst as usize, t.dst_buf, t.dst_off, t.bytes));
        if t.bytes > 0 && (t.src == self.rank || t.dst == self.rank) {
            let deps = self.key_deps(&t.deps);
            self.ops.push(LocalOp::side_of(&t, self.rank, deps));
        }
        id
    }

    /// [`Sink::push`] of the forward, its op written from its fields.
    fn push_forward(&mut self, f: Forward) -> u32 {
        let id = self.keys.len() as u32;
        self.keys
            .push(key_of(f.d, Buffer::Output, f.dst_off, f.bytes));
        let me = self.rank as usize;
        if f.bytes > 0 && (f.r == me || f.d == me) {
            let (op, peer) = OpKind::between(f.r as u32, f.d as u32, self.rank);
            let k = self.keys[f.landed as usize];
            let deps = KeyDeps::from_buf_and_len([k; 4], usize::from(k.rank != u32::MAX));
            self.ops.push(LocalOp {
                op,
                peer,
                bytes: f.bytes,
                src_buf: Buffer::Scratch,
                src_off: f.scratch_off,
                dst_buf: Buffer::Output,
                dst_off: f.dst_off,
                path: f.path(),
                step: f.step,
                deps,
            });
        }
        id
    }

    #[inline]
    fn push_key(&mut self, dst: usize, buf: Buffer, off: u64, bytes: u64) -> u32 {
        self.keys.push(key_of(dst, buf, off, bytes));
        (self.keys.len() - 1) as u32
    }

    fn lanes(&self, a: usize, b: usize, g: usize) -> Range<usize> {
        if a == self.node || b == self.node {
            0..g
        } else {
            self.rail..self.rail + 1
        }
    }

    #[inline]
    fn lane_index(&self, nodes: usize, g: usize, a: usize, b: usize, l: usize) -> usize {
        rank_lane_index(nodes, g, self.node, self.rail, a, b, l)
    }

    fn forwards_at(&self, b: usize) -> bool {
        b == self.node
    }

    /// A forward out of another GPU of the node is the rank's only if it
    /// lands at the rank, and nothing waits on a forward.
    #[inline]
    fn forwards_into(&self, r: usize) -> Option<usize> {
        (r != self.rank as usize).then_some(self.rail)
    }

    /// Only the rank's transfers are kept with their dependencies.
    #[inline]
    fn keeps(&self, src: usize, dst: usize) -> bool {
        src == self.rank as usize || dst == self.rank as usize
    }

    /// A move on another node is the rank's only as a dependency of the
    /// send it feeds, where that send lands at the rank; on its own node
    /// the rank's moves out wait on the moves before them, and its
    /// intra-node blocks on the early moves.
    #[inline]
    fn moves_for(&self, a: usize, r: usize) -> bool {
        a == self.node || r == self.rank as usize
    }

    fn intra_nodes(&self, _: usize) -> Range<usize> {
        self.node..self.node + 1
    }

    /// Of the lanes other than the rank's rail, the send chains of its
    /// node's GPUs alone: the moves out of the rank wait on their slots,
    /// and their lengths say which moves into those GPUs are early (the
    /// rank's intra-node blocks wait on those). The rank's sends and
    /// receives are on lane `rail` (its own chains,
    /// and its peers' on the rail), the moves into the rank's peers on
    /// other nodes wait on their carriers' sends (of lane `rail`), and no
    /// lane of a rank's program is direct (a plan with one has every pair
    /// direct, which it refuses), so no direct slice reads a chain of
    /// another lane. The chains of those lanes on other nodes, and every
    /// receive chain of those lanes, stay empty.
    #[inline]
    fn chains(&self, a: usize, l: usize) -> (bool, bool) {
        (l == self.rail || a == self.node, l == self.rail)
    }
}
