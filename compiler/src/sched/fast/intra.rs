//! Intra-node traffic: one NVLink (or local) transfer per block, held
//! back only by the early balancing moves that share its NVLink ports.

use super::blocks::Blocks;
use super::emit::Emitter;
use super::sink::Sink;
use super::slots::{add_op, deps_of};
use crate::plan::Path;

impl Emitter {
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
    #[inline(never)]
    pub(super) fn emit_intra_node(&mut self, v: &impl Blocks, out: &mut impl Sink) {
        let g = self.gpus;
        let mut ids = std::mem::take(&mut self.chain_buf);
        let nodes = out.intra_nodes(self.nodes);
        for s in nodes.start * g..nodes.end * g {
            let first = s / g * g;
            for d in first..first + g {
                let bytes = v.send_at(s, d + 1) - v.send_at(s, d);
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
                out.push(Self::whole_block(v, s, d, bytes, path, deps_of(&ids)));
            }
        }
        self.chain_buf = ids;
    }
}
