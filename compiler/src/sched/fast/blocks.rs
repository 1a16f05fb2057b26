//! Where the blocks of the all-to-all(v) layout sit, as the emitter reads
//! them: [`Blocks`], answered from the whole matrix ([`WholeBlocks`], for
//! the whole plan) or from one rank's [`LocalTraffic`] ([`RankBlocks`], for
//! that rank's own program). The emitter's code is the same for both; a
//! rank's view answers exactly for the blocks its own program touches
//! (those of its node's rows and columns) and the per-node split sizes
//! every node pair's balancing reads. Data only, below the emitter:
//! `Emitter::offsets` (emit.rs) fills [`WholeBlocks`].

use crate::rank::{LocalTraffic, NodeSplits};

/// The block offsets and split sizes the emitter reads.
pub(super) trait Blocks {
    /// Offset of block `(s, d)` in the input of `s` (`d` up to `R`: the
    /// end of the row).
    fn send_at(&self, s: usize, d: usize) -> u64;
    /// Offset of block `(s, d)` in the output of `d`.
    fn recv_at(&self, s: usize, d: usize) -> u64;
    /// The offsets of rank `s`'s blocks for the GPUs of node `b` in its
    /// input (`G + 1` of them: the last is where the next node's start).
    fn send_row(&self, s: usize, b: usize) -> &[u64];
    /// The offsets of rank `s`'s blocks for the GPUs of node `b` in their
    /// outputs (`G` of them).
    fn recv_row(&self, s: usize, b: usize) -> &[u64];
    /// Of rank `s`'s blocks for the GPUs of node `b`: where they start
    /// in its input, where the one for GPU `j` of `b` starts and ends
    /// there, and its offset in GPU `j`'s output (`send_row(s, b)[0]`,
    /// `[j]`, `[j + 1]` and `recv_row(s, b)[j]`).
    #[inline]
    fn send_block(&self, s: usize, b: usize, j: usize) -> [u64; 4] {
        let (row, recv) = (self.send_row(s, b), self.recv_row(s, b));
        [row[0], row[j], row[j + 1], recv[j]]
    }
    /// Bytes rank `s` sends node `b`.
    fn to_node(&self, s: usize, b: usize) -> u64;
    /// Bytes the ranks of node `a` send rank `d`.
    fn node_to_rank(&self, a: usize, d: usize) -> u64;
}

/// Every block offset, from the whole matrix: `R (R + 1) + R^2` numbers.
#[derive(Clone, Debug, Default)]
pub(super) struct WholeBlocks {
    pub(super) ranks: usize,
    pub(super) gpus: usize,
    /// `send_off[s * (n + 1) + d]`: offset of block (s, d) in input of s; the
    /// last entry of a row is the row's total.
    pub(super) send_off: Vec<u64>,
    /// `recv_off[s * n + d]`: offset of block (s, d) in output of d.
    pub(super) recv_off: Vec<u64>,
    /// Column sums: what each rank receives.
    pub(super) col_acc: Vec<u64>,
}

impl Blocks for WholeBlocks {
    #[inline(always)]
    fn send_at(&self, s: usize, d: usize) -> u64 {
        self.send_off[s * (self.ranks + 1) + d]
    }

    #[inline(always)]
    fn recv_at(&self, s: usize, d: usize) -> u64 {
        self.recv_off[s * self.ranks + d]
    }

    #[inline(always)]
    fn send_row(&self, s: usize, b: usize) -> &[u64] {
        &self.send_off[s * (self.ranks + 1) + b * self.gpus..][..=self.gpus]
    }

    #[inline(always)]
    fn recv_row(&self, s: usize, b: usize) -> &[u64] {
        &self.recv_off[s * self.ranks + b * self.gpus..][..self.gpus]
    }

    #[inline(always)]
    fn to_node(&self, s: usize, b: usize) -> u64 {
        let g = self.gpus;
        self.send_at(s, (b + 1) * g) - self.send_at(s, b * g)
    }

    fn node_to_rank(&self, a: usize, d: usize) -> u64 {
        let g = self.gpus;
        (a * g..(a + 1) * g)
            .map(|s| self.send_at(s, d + 1) - self.send_at(s, d))
            .sum()
    }
}

/// The blocks one rank's program touches, from its [`LocalTraffic`]: the
/// rows of its node (offsets in their inputs), its node's columns (offsets
/// of every rank's blocks for the node, in inputs and outputs), and the
/// per-node split sizes of every rank ([`NodeSplits`]). O(R (G + N))
/// numbers. Offsets of other blocks are not known and read as 0: only
/// transfers the rank does not keep name them (the emitter's rank sink
/// keeps a transfer's fields only when it starts or ends at the rank).
#[derive(Clone, Debug, Default)]
pub(super) struct RankBuffers {
    /// G x (R + 1): offsets in the inputs of the node's GPUs.
    row_off: Vec<u64>,
    /// R x (G + 1): offset in the input of rank `s` of its block for GPU
    /// `i` of the node (`i = G`: the end of the node's blocks).
    col_send: Vec<u64>,
    /// R x G: offset in the output of GPU `i` of the node of rank `s`'s block.
    col_recv: Vec<u64>,
    /// G + 1 zeros: the rows of blocks the rank does not know.
    zeros: Vec<u64>,
}

/// [`Blocks`] for one rank (see [`RankBuffers`]).
pub(super) struct RankBlocks<'t> {
    node: usize,
    /// The node's first rank (`node * gpus`).
    first: usize,
    ranks: usize,
    nodes: usize,
    gpus: usize,
    /// `None`: the rank was given lane sums and stage inputs instead, and
    /// split sizes are known only for its node's rows and columns.
    splits: Option<&'t NodeSplits>,
    bufs: &'t RankBuffers,
}

impl RankBuffers {
    /// Fills the buffers from `t` and returns the view over them.
    pub(super) fn view<'t>(
        &'t mut self,
        t: &LocalTraffic,
        splits: Option<&'t NodeSplits>,
    ) -> RankBlocks<'t> {
        let (n, g) = (t.ranks(), t.gpus_per_node);
        // Each row's running sums, its total last. Every entry of the
        // three buffers is written below: they are only resized (zeroed
        // where they grow), not cleared.
        self.row_off.resize(g * (n + 1), 0);
        for (off, row) in self
            .row_off
            .chunks_exact_mut(n + 1)
            .zip(t.rows.chunks_exact(n))
        {
            let mut acc = 0u64;
            for (o, &x) in off.iter_mut().zip(row) {
                *o = acc;
                acc += x;
            }
            off[n] = acc;
        }
        self.col_send.resize(n * (g + 1), 0);
        self.col_recv.resize(n * g, 0);
        self.zeros.clear();
        self.zeros.resize(g + 1, 0);
        // What the ranks before `s` send each GPU of the node.
        let below = &mut self.zeros[..g];
        let sends = self.col_send.chunks_exact_mut(g + 1);
        let recvs = self.col_recv.chunks_exact_mut(g);
        for (((send, recv), col), &before) in
            sends.zip(recvs).zip(t.cols.chunks_exact(g)).zip(&t.before)
        {
            let mut at = before;
            for i in 0..g {
                let x = col[i];
                send[i] = at;
                at += x;
                recv[i] = below[i];
                below[i] += x;
            }
            send[g] = at;
        }
        below.fill(0);
        RankBlocks {
            node: t.node(),
            first: t.node() * g,
            ranks: n,
            nodes: t.nodes,
            gpus: g,
            splits,
            bufs: self,
        }
    }
}

impl RankBlocks<'_> {
    /// Whether rank `s` is of the rank's node (without a division).
    #[inline(always)]
    fn own(&self, s: usize) -> bool {
        s.wrapping_sub(self.first) < self.gpus
    }

    /// What each GPU of node `a` sends each node: `G` rows of `N`, GPU `l`'s
    /// at `l N` (each entry [`Blocks::to_node`]); `None` without
    /// [`NodeSplits`].
    pub(super) fn node_rows(&self, a: usize) -> Option<&[u64]> {
        let per_node = self.gpus * self.nodes;
        self.splits
            .map(|s| &s.to_nodes[a * per_node..(a + 1) * per_node])
    }
}

impl Blocks for RankBlocks<'_> {
    #[inline]
    fn send_at(&self, s: usize, d: usize) -> u64 {
        let (g, first) = (self.gpus, self.first);
        if self.own(s) {
            self.bufs.row_off[(s - first) * (self.ranks + 1) + d]
        } else if (first..=first + g).contains(&d) {
            self.bufs.col_send[s * (g + 1) + d - first]
        } else {
            0
        }
    }

    #[inline]
    fn recv_at(&self, s: usize, d: usize) -> u64 {
        if self.own(d) {
            self.bufs.col_recv[s * self.gpus + d - self.first]
        } else {
            0
        }
    }

    fn send_row(&self, s: usize, b: usize) -> &[u64] {
        let g = self.gpus;
        if self.own(s) {
            &self.bufs.row_off[(s - self.first) * (self.ranks + 1) + b * g..][..=g]
        } else if b == self.node {
            &self.bufs.col_send[s * (g + 1)..][..=g]
        } else {
            &self.bufs.zeros
        }
    }

    fn recv_row(&self, s: usize, b: usize) -> &[u64] {
        let g = self.gpus;
        if b == self.node {
            &self.bufs.col_recv[s * g..][..g]
        } else {
            &self.bufs.zeros[..g]
        }
    }

    /// Into the rank's node from another (a forward into the rank): read
    /// from its node's columns alone.
    #[inline]
    fn send_block(&self, s: usize, b: usize, j: usize) -> [u64; 4] {
        let g = self.gpus;
        if b == self.node && !self.own(s) {
            let at = s * (g + 1);
            let col = &self.bufs.col_send;
            return [
                col[at],
                col[at + j],
                col[at + j + 1],
                self.bufs.col_recv[s * g + j],
            ];
        }
        let (row, recv) = (self.send_row(s, b), self.recv_row(s, b));
        [row[0], row[j], row[j + 1], recv[j]]
    }

    /// From [`NodeSplits`] where given; else known for the rank's node's
    /// rows and its column only (0 elsewhere: no reader asks then).
    #[inline]
    fn to_node(&self, s: usize, b: usize) -> u64 {
        if let Some(splits) = self.splits {
            return splits.to_nodes[s * self.nodes + b];
        }
        let g = self.gpus;
        let row = self.send_row(s, b);
        debug_assert!(
            self.own(s) || b == self.node,
            "rank {s} to node {b} is not known"
        );
        row[g] - row[0]
    }

    /// From [`NodeSplits`] only (the all-direct test, which stage inputs
    /// answer instead): 0 without them.
    fn node_to_rank(&self, a: usize, d: usize) -> u64 {
        debug_assert!(self.splits.is_some(), "node {a} to rank {d} is not known");
        self.splits.map_or(0, |s| s.from_nodes[a * self.ranks + d])
    }
}
