//! Where the emitter's steps write their transfers, and which of them they
//! write: the [`Sink`] trait the steps are written against, and [`Emit`],
//! the whole plan's transfers written over the previous plan's. One rank's
//! program is the other sink (`rank_state::RankSink`).

use std::ops::Range;

use crate::plan::{Buffer, Deps, Path, Transfer};
use crate::rank::TransferKey;

/// The transfers of the plan being written, over those of the previous
/// plan: each is overwritten in place, so a large plan's memory is read once
/// (as it is written) rather than first in a pass that drops every old
/// transfer and then again to write the new ones.
pub(super) struct Emit<'p> {
    pub(super) transfers: &'p mut Vec<Transfer>,
    pub(super) len: usize,
}

impl<'p> Emit<'p> {
    pub(super) fn new(transfers: &'p mut Vec<Transfer>) -> Self {
        Emit { transfers, len: 0 }
    }

    /// Drops what is left of the previous plan.
    pub(super) fn finish(self) {
        self.transfers.truncate(self.len);
    }
}

/// A forward ([`Sink::push_forward`]): bytes at `scratch_off` of GPU
/// `r`'s scratch into GPU `d`'s output at `dst_off`, `bytes` long, in step
/// `step`, after transfer `landed` (the send that brought them).
#[derive(Clone, Copy, Debug)]
pub(super) struct Forward {
    pub(super) r: usize,
    pub(super) scratch_off: u64,
    pub(super) d: usize,
    pub(super) dst_off: u64,
    pub(super) bytes: u64,
    pub(super) step: u32,
    pub(super) landed: u32,
}

impl Forward {
    /// A copy where it stays on the GPU, else over NVLink.
    pub(super) fn path(&self) -> Path {
        if self.d == self.r {
            Path::Local
        } else {
            Path::Nvlink
        }
    }
}

/// Where the emitter's steps write their transfers, and which of them they
/// write: the whole plan ([`Emit`]) or what one rank's program needs
/// (`rank_state::RankSink`). The steps are the same code for both.
pub(super) trait Sink {
    /// Transfers written so far (the next one's id).
    fn len(&self) -> usize;
    /// Writes the next transfer and returns its id (dependencies name
    /// transfers by these ids).
    fn push(&mut self, t: Transfer) -> u32;
    /// Writes the next transfer, a forward, and returns its id. What
    /// [`Sink::push`] writes of the transfer; a sink may write it without
    /// the transfer.
    #[inline(always)]
    fn push_forward(&mut self, f: Forward) -> u32 {
        self.push(Transfer {
            src: f.r as u32,
            src_buf: Buffer::Scratch,
            src_off: f.scratch_off,
            dst: f.d as u32,
            dst_buf: Buffer::Output,
            dst_off: f.dst_off,
            bytes: f.bytes,
            path: f.path(),
            step: f.step,
            deps: Deps::from_buf_and_len([f.landed, 0, 0, 0], 1),
        })
    }
    /// Writes the next transfer, one that [`Sink::keeps`] does not keep
    /// (of GPUs `src` and `dst` with `keeps(src, dst)` false), by its key
    /// alone: into GPU `dst`'s `buf` at `off`, `bytes` long
    /// ([`key_of`]). Returns its id. A whole plan keeps every transfer.
    fn push_key(&mut self, dst: usize, buf: Buffer, off: u64, bytes: u64) -> u32;
    /// The lanes of node pair `(a, b)` to emit (all `0..g` for a whole
    /// plan). A lane is emitted in every stage or in none.
    fn lanes(&self, a: usize, b: usize, g: usize) -> Range<usize>;
    /// Where lane `l` of node pair `(a, b)` sits in the emitter's `lanes`
    /// (of `nodes` nodes of `g` GPUs), for a lane [`Sink::lanes`] names:
    /// the lanes it names for a pair sit in a row, lane `l + 1` after lane
    /// `l` (`Emitter::emit_pair` finds the first alone).
    fn lane_index(&self, nodes: usize, g: usize, a: usize, b: usize, l: usize) -> usize;
    /// Whether to emit the forwards at node `b` (the receiving node).
    fn forwards_at(&self, b: usize) -> bool;
    /// Of the forwards out of GPU `r` (at a node [`Sink::forwards_at`]
    /// names), those into one GPU only: `Some(j)`, GPU `j` of the node;
    /// `None`, into every GPU.
    fn forwards_into(&self, r: usize) -> Option<usize>;
    /// Whether it keeps what a transfer from GPU `src` to GPU `dst` waits
    /// on (a transfer it does not keep may name other dependencies).
    fn keeps(&self, src: usize, dst: usize) -> bool;
    /// Whether to emit the balancing moves into GPU `c` (of node `a`) that
    /// feed a send to GPU `r`.
    fn moves_for(&self, a: usize, r: usize) -> bool;
    /// The nodes whose intra-node blocks to emit.
    fn intra_nodes(&self, nodes: usize) -> Range<usize>;
    /// Whether to keep the send chain of GPU `l` of node `a` and the
    /// receive chain of its peer (GPU `l` of the receiving node), their
    /// slots and byte-counted windows, as a send on lane `l` of a pair from
    /// node `a` is emitted: a chain that no kept transfer waits on, and no
    /// direct lane reads, may be left empty. A whole plan keeps every
    /// chain.
    #[inline(always)]
    fn chains(&self, _a: usize, _l: usize) -> (bool, bool) {
        (true, true)
    }
}

impl Sink for Emit<'_> {
    #[inline(always)]
    fn len(&self) -> usize {
        self.len
    }

    /// Writes the next transfer over the previous plan's and returns its index.
    #[inline(always)]
    fn push(&mut self, t: Transfer) -> u32 {
        put(self.transfers, self.len, t);
        self.len += 1;
        (self.len - 1) as u32
    }

    fn push_key(&mut self, _: usize, _: Buffer, _: u64, _: u64) -> u32 {
        unreachable!("a whole plan keeps every transfer")
    }

    #[inline(always)]
    fn lanes(&self, _: usize, _: usize, g: usize) -> Range<usize> {
        0..g
    }

    #[inline(always)]
    fn lane_index(&self, nodes: usize, g: usize, a: usize, b: usize, l: usize) -> usize {
        (a * nodes + b) * g + l
    }

    #[inline(always)]
    fn forwards_at(&self, _: usize) -> bool {
        true
    }

    #[inline(always)]
    fn forwards_into(&self, _: usize) -> Option<usize> {
        None
    }

    #[inline(always)]
    fn keeps(&self, _: usize, _: usize) -> bool {
        true
    }

    #[inline(always)]
    fn moves_for(&self, _: usize, _: usize) -> bool {
        true
    }

    fn intra_nodes(&self, nodes: usize) -> Range<usize> {
        0..nodes
    }
}

/// Writes transfer `at` (`at <= transfers.len()`): over the previous
/// plan's, or appended.
#[inline]
pub(super) fn put(transfers: &mut Vec<Transfer>, at: usize, t: Transfer) {
    match transfers.get_mut(at) {
        Some(old) => *old = t,
        None => transfers.push(t),
    }
}

/// The key of a transfer into GPU `dst`'s `buf` at `off`, `bytes` long, as
/// a rank's program names it ([`TransferKey::of`]), `rank: u32::MAX` when
/// it moves no bytes (its dependents leave it out).
#[inline(always)]
pub(super) fn key_of(dst: usize, buf: Buffer, off: u64, bytes: u64) -> TransferKey {
    TransferKey {
        rank: if bytes > 0 { dst as u32 } else { u32::MAX },
        buf,
        off,
    }
}
