//! How a lane's slice of a stage is cut into inter-node sends: the chunk
//! size (from the NVLink hop and the latency), the order of a lane's
//! chunks (rotated, direct lanes by block, mesh lanes ending on their own
//! receiver), the split first send, and the taper of the last sends.

use super::arith::max_line;
use super::arith::mul_div;
use super::blocks::Blocks;
use super::emit::Emitter;

/// Halvings of each of a lane's last sends (see `Emitter::taper_last_chunks`).
const TAPER_SPLITS: u32 = 2;
/// No tapered send is cut below this many bytes.
const MIN_TAPER_BYTES: u64 = 4096;
/// With a per-message cost `p`, a tapered send is cut only while its halves
/// take at least this many `p` on the NIC, or at least what the NVLink hop
/// forwards in `p` (see [`Emitter::min_taper_bytes`]).
const TAPER_MESSAGES: f64 = 4.0;
/// On a mesh with a per-message cost, the chunk of eq. (4') times this:
/// the lanes' last sends end on the bytes with the shortest forward
/// (tail.rs), so a chunk's forward after the NICs finish is a fraction of
/// it and larger chunks (fewer messages) pay. Measured on MI300X 2 and 4
/// nodes, the classes, calibrated (docs/benchmarks.md, issue 24
/// mesh part): median 1.161 at 1, 1.167 at 0.7, 1.135 at 1.5, 1.158 at 2.
const MESH_TAIL_CHUNK: f64 = 1.5;

impl Emitter {
    /// The NIC-cut time of the exchange: the busiest node's inter-node bytes
    /// (sent or received) over all its rails, us.
    fn exchange_us(&self) -> f64 {
        max_line(self.nodes, &self.node_bytes) as f64 / self.node_rate
    }

    /// Chunk size: the un-overlapped NVLink hop before the first chunk and
    /// after the last should cost about half a percent of the whole exchange
    /// (`M / node_rate`), and a chunk should take a few latencies on its NIC so
    /// that the pipeline hides them (`bounds`: [`Emitter::chunk_bounds`]).
    pub(super) fn chunk_size(&self, (by_hop, by_latency): (f64, f64)) -> u64 {
        if let Some(c) = self.opts.chunk_bytes {
            return c.max(1);
        }
        by_hop.max(by_latency).max(self.chunk_by_message()).max(1.0) as u64
    }

    /// The chunk size that minimises what a lane pays for its messages and
    /// for the NVLink hop at the end of its pipeline: `n = B / chunk`
    /// messages cost `n · p` on the NIC, the last chunk's forward about
    /// `chunk / b_nv`, least at `chunk = sqrt(B · p · b_nv)` (`B` the bytes a
    /// lane sends in the exchange, `p` the per-message cost, `b_nv` a GPU's
    /// NVLink or one mesh link). 0 without a per-message cost. Measured
    /// (docs/benchmarks.md): a divisor of 2 or 4 under the root (smaller
    /// chunks) moved the calibrated DGX-H100 sweep's median up by 1%.
    pub(super) fn chunk_by_message(&self) -> f64 {
        let p = self.opts.per_message_us;
        if p <= 0.0 {
            return 0.0;
        }
        let lane_rate = self.nic_rate / self.weights.max_sharing() as f64;
        let lane_bytes = self.exchange_us() * lane_rate;
        let root = (lane_bytes * p * self.intra_rate).sqrt();
        if self.mesh {
            MESH_TAIL_CHUNK * root
        } else {
            root
        }
    }

    /// No tapered send is cut below this many bytes: [`MIN_TAPER_BYTES`],
    /// and with a per-message cost `p` the smaller of two sizes. Each cut
    /// adds a message (`p` on the NIC) and halves the forward of the
    /// piece that lands last, which pays when the piece's half takes longer
    /// than `p` on the NVLink hop: `2 p b_nv`, short on a mesh (64 GB/s per
    /// pair link, 384 KB at 3 us), long on NVSwitch (2.7 MB). On NVSwitch
    /// the last sends in flight still land together, so a piece taking
    /// [`TAPER_MESSAGES`] `p` on its NIC is cut too (600 KB on a 50 GB/s NIC).
    /// Measured on the calibrated sweeps (docs/benchmarks.md): no taper cost
    /// DGX-H100 2x8 hotspot 1.146 -> 1.301 of the bound (its four large last
    /// sends land together and are forwarded after the NICs finish); on
    /// MI300X 2x8 log-normal 1.0 the 600 KB threshold gave 1.356-1.406
    /// against 1.290 with 384 KB.
    fn min_taper_bytes(&self) -> u64 {
        let p = self.opts.per_message_us;
        let lane_rate = self.nic_rate / self.weights.max_sharing() as f64;
        let by_nic = TAPER_MESSAGES * p * lane_rate;
        let by_hop = 2.0 * p * self.intra_rate;
        MIN_TAPER_BYTES.max(by_nic.min(by_hop) as u64)
    }

    /// The two lower bounds on the chunk size (bytes): by the NVLink hop
    /// (half a percent of the exchange) and by the latency (four inter-node
    /// latencies on a lane).
    pub(super) fn chunk_bounds(&self) -> (f64, f64) {
        self.chunk_bounds_at(max_line(self.nodes, &self.node_bytes))
    }

    /// [`Emitter::chunk_bounds`] given the node matrix's largest line sum
    /// (`max_line`, which the caller has).
    pub(super) fn chunk_bounds_at(&self, line: u64) -> (f64, f64) {
        let lane_rate = self.nic_rate / self.weights.max_sharing() as f64;
        (
            0.005 * (line as f64 / self.node_rate) * self.intra_rate,
            4.0 * self.inter_latency * lane_rate,
        )
    }

    /// Cuts each of the last sends of a lane's final slice, as many as the
    /// lane has in flight (`depth`; one for `spray`, whose chains are per
    /// lane slice and stream, not `fast`'s),
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
    pub(super) fn taper_last_chunks(&mut self) {
        let k = if self.depth == u32::MAX {
            1
        } else {
            self.depth as usize
        };
        let k = k.min(self.chunks.len());
        self.tail.clear();
        let at = self.chunks.len() - k;
        self.tail.extend(self.chunks.drain(at..));
        let min_bytes = self.min_taper_bytes();
        for &(lo, hi) in &self.tail {
            let mut at = lo;
            for _ in 0..TAPER_SPLITS {
                let half = (hi - at) / 2;
                if half < min_bytes {
                    break;
                }
                self.chunks.push((at, at + half));
                at += half;
            }
            self.chunks.push((at, hi));
        }
    }

    /// Cuts bytes `from..to` of lane `l` (GPU `c`) of a node pair sending
    /// node `b` into sends of at most a chunk, in the order they go (`first`:
    /// the GPU's first slice that carries bytes). A direct lane starts at
    /// its block for GPU `l`, then `l + 1`, ... (wrapping): the lanes of a
    /// pair send into different GPUs (and NICs) at any time. Its slice
    /// `from..to` takes that share of every block (a stage's piece of a
    /// pair reaches every receiving GPU); its sends are cut at block
    /// boundaries, but adjacent latency-bound blocks go as one send (a
    /// slot of several transfers). Inlined into its one caller:
    /// called apart it cost 1.5% of a plan's instructions at 8x8.
    ///
    /// `start`, when given, is the chunk the rotation starts at (mesh
    /// lanes: see tail.rs); by default lane `l` starts at chunk
    /// `l · parts / G`.
    #[inline(always)]
    pub(super) fn cut_chunks(
        &mut self,
        v: &impl Blocks,
        (c, b, l, from, to): (usize, usize, usize, u64, u64),
        direct: bool,
        start: Option<u64>,
        first: bool,
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
        if direct {
            let row = b * self.gpus;
            let (g, base) = (self.gpus, v.send_at(c, row));
            // Blocks merge into one send while it stays latency-bound (under
            // half an inter-node latency on its NIC): merging saves latencies,
            // and so few bytes cost nothing at the receivers they share.
            let lane_rate = self.nic_rate / self.weights.max_sharing() as f64;
            let merge_below = ((0.5 * self.inter_latency * lane_rate) as u64).min(chunk);
            // The slice is `from..to` of the lane's `len` bytes for the
            // node: the same share of every destination block (not the
            // blocks that happen to lie in `from..to`, laid out by
            // destination GPU), so a stage's piece of a node pair reaches
            // every receiving GPU, and its NIC, in proportion. Each block's
            // cuts are `mul_div` of the same `from` / `to` the neighbouring
            // stages use, so every byte goes exactly once.
            let len = v.send_at(c, row + g) - base;
            let share = |x: u64, w: u64| if x >= len { w } else { mul_div(w, x, len) };
            let mut pending = (0u64, 0u64);
            for k in 0..g {
                let j = (l + k) % g;
                let (b0, b1) = (
                    v.send_at(c, row + j) - base,
                    v.send_at(c, row + j + 1) - base,
                );
                let (lo, hi) = (b0 + share(from, b1 - b0), b0 + share(to, b1 - b0));
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
            // `split`, rotated left by `start`.
            let parts = (to - from).div_ceil(chunk);
            let at = |k: u64| from + mul_div(to - from, k, parts);
            let start = start.map_or(l as u64 * parts / self.gpus as u64, |k| k.min(parts - 1));
            let mut lo = at(start);
            for k in (start + 1..=parts).chain(1..=start) {
                let hi = if k == parts { to } else { at(k) };
                self.chunks.push((lo, hi));
                lo = if k == parts { from } else { hi };
            }
        }
        // A GPU's first send is cut in two, the halves going first and last:
        // with several sends in flight, a first send shorter than the next
        // staggers them, so one's latency overlaps another's transfer
        // instead of all starting (and waiting) in lockstep.
        if !first || self.depth < 2 || self.depth == u32::MAX {
            return;
        }
        if self.graded_first_send() {
            // Where every stage crosses the leaves' uplinks (one node per
            // leaf: the layered stages have no intra-leaf layer), every
            // part is about one send of one size, and the `D` sends in
            // flight on the binding uplink share it evenly, end together,
            // and the next `D` start after a latency with the uplink idle.
            // The first send is cut into `D` pieces of 1, 2, ..., `D`
            // shares (sent smallest first): the window's sends then end one
            // at a time, each replaced while the other `D - 1` carry the
            // link, and each new send (a whole chunk) keeps the stagger.
            let d = self.depth as u64;
            let total = d * (d + 1) / 2;
            let (lo, hi) = self.chunks[0];
            let at = |k: u64| lo + mul_div(hi - lo, k * (k + 1) / 2, total);
            self.chunks.splice(
                0..1,
                (0..d).map(|k| (at(k), at(k + 1))).filter(|&(x, y)| y > x),
            );
        } else if self.chunks.len() >= 2 {
            let (lo, hi) = self.chunks[0];
            let mid = lo + (hi - lo) / 2;
            self.chunks[0] = (lo, mid);
            self.chunks.push((mid, hi));
        }
    }

    /// Whether a GPU's first send is cut into graded pieces rather than
    /// halved (`cut_chunks`): layered stages without an intra-leaf layer,
    /// planned without a per-message cost. Where both layers interleave,
    /// a GPU's window holds sends of unequal lengths (crossing sends at
    /// the uplink's share, intra-leaf ones at the NIC's) that stagger by
    /// themselves, and pieces of one first send would take the window
    /// places of the other layer's first sends; under a per-message cost
    /// every piece pays it and a lane's few large sends mostly fit in
    /// its window (docs/algorithms.md, 2b, measured).
    fn graded_first_send(&self) -> bool {
        !self.chunks.is_empty()
            && self.opts.per_message_us <= 0.0
            && self.node_stages.crossing_only()
    }
}
