//! The pipeline's pacing: how many inter-node sends each GPU keeps in
//! flight (the depth), and the windows of the sending and receiving chains
//! that hold a send back, counted in sends or, for decode-size exchanges,
//! in bytes.

use super::emit::{Emitter, MIN_DEPTH};

impl Emitter {
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
    pub(super) fn window_unit(&self, (by_hop, by_latency): (f64, f64)) -> u64 {
        if !self.opts.staged || self.depth == u32::MAX || self.weights.max_sharing() > 1 {
            return 0;
        }
        if by_hop >= by_latency {
            return 0;
        }
        let (moved, pairs) = self.stage_totals();
        let sends = pairs as u64 * self.gpus as u64;
        let share = moved.checked_div(sends).unwrap_or(0);
        if share == 0 {
            return 0;
        }
        share / share.div_ceil(self.chunk)
    }

    /// The slot of GPU `c`'s chain its next send waits for, if any.
    pub(super) fn sender_wait(&self, c: usize, depth: usize) -> Option<usize> {
        if self.unit == 0 {
            return self.slots[c].len().checked_sub(depth);
        }
        window_start(&self.out_bytes[c], depth, self.unit)
    }

    /// The slot of GPU `r`'s receive chain the next send into it (from GPU
    /// `c`) waits for, if any. Counted in bytes, the window also holds at
    /// most `depth` distinct senders, as one of `depth` sends does: more
    /// than four sending NICs at one receiver is incast (docs/cost-model.md).
    pub(super) fn receiver_wait(&self, r: usize, c: usize, depth: usize) -> Option<usize> {
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

    /// Records a send of GPU `c` into GPU `r` in its slots, `ops` (its
    /// ids: `NONE` where it has no such part), and in the byte-counted
    /// windows, of the chains `chains` says to keep ([`Sink::chains`]: `c`'s
    /// send chain, `r`'s receive chain).
    #[inline(always)]
    pub(super) fn push_send(&mut self, c: usize, r: usize, ops: [u32; 2], chains: (bool, bool)) {
        if chains.0 {
            self.slots[c].push(ops);
        }
        if chains.1 {
            self.rslots[r].push(ops);
        }
        self.count_send_on(c, r, chains);
    }

    /// The byte-counted windows' part of [`Emitter::push_send`] (none
    /// without them: the test inline, the rest out of line).
    #[inline(always)]
    fn count_send_on(&mut self, c: usize, r: usize, chains: (bool, bool)) {
        if self.unit > 0 {
            self.count_send_bytes(c, r, chains);
        }
    }

    #[inline(never)]
    fn count_send_bytes(&mut self, c: usize, r: usize, (send, receive): (bool, bool)) {
        let bytes = self.nominal.min(self.unit);
        let add = |cum: &mut Vec<u64>| {
            let total = cum.last().copied().unwrap_or(0) + bytes;
            cum.push(total);
        };
        if send {
            add(&mut self.out_bytes[c]);
        }
        if receive {
            add(&mut self.in_bytes[r]);
            self.in_from[r].push(c as u32);
        }
    }

    /// Sends in flight per GPU: enough that one send's transfer time covers
    /// the next one's latency (alpha-beta: `ceil(alpha / beta)` with beta the
    /// time of an average send on its NIC), plus two: one in transfer, one to
    /// absorb the jitter between the sending and the receiving chain.
    /// Tiny, latency-bound sends get a deep pipeline, i.e. the stages merge;
    /// large ones keep [`MIN_DEPTH`] in flight.
    pub(super) fn depth_for_chunks(&self) -> u32 {
        if !self.opts.staged {
            return u32::MAX;
        }
        if let Some(d) = self.opts.pipeline_depth {
            return d.max(1);
        }
        let (moved, pairs) = self.stage_totals();
        let pairs = pairs.max(1) as f64;
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
    pub(super) fn stages_are_even(&self) -> bool {
        if self.rotated_rank {
            return self.rotation.stages_are_even(&self.node_bytes);
        }
        self.stages
            .chunk_by(|x, y| x.stage == y.stage)
            .all(|stage| {
                let (lo, hi) = stage.iter().fold((u64::MAX, 0), |(lo, hi), p| {
                    (lo.min(p.bytes), hi.max(p.bytes))
                });
                hi - lo <= hi / 64
            })
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
