//! Where a plan's bytes sit: the block offsets of the all-to-all(v)
//! layout in every input and output, the node matrix, and each GPU's
//! scratch (gather regions for the balancing moves, landing regions for
//! the inter-node sends).

use super::emit::Emitter;
use crate::traffic::TrafficMatrix;

impl Emitter {
    /// Block offsets of the all-to-all(v) layout, the node matrix and the
    /// count of non-empty blocks between nodes.
    pub(super) fn offsets(&mut self, m: &TrafficMatrix) {
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
    pub(super) fn to_node(&self, s: usize, b: usize) -> (u64, u64) {
        let row = &self.send_off[s * (self.ranks() + 1)..];
        (
            row[b * self.gpus],
            row[(b + 1) * self.gpus] - row[b * self.gpus],
        )
    }

    /// Scratch of each GPU: its gather regions (one per destination node),
    /// then its landing regions (one per source node).
    pub(super) fn layout_scratch(&mut self, scratch: &mut Vec<u64>) {
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
}
