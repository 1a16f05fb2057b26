//! Each GPU's scratch: gather regions for the balancing moves, landing
//! regions for the inter-node sends (the block offsets of the
//! all-to-all(v) layout are `blocks.rs`).

use super::emit::Emitter;

impl Emitter {
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
