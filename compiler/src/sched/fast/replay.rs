//! `fast`'s node stages replayed as fluid flows over the NICs and a
//! fat-tree's leaf links: for `fast`'s estimate where a leaf's uplinks can
//! bind (`auto`'s `Estimator::fast_stage_replay`), and for
//! [`super::emit::NodeStages`]' choice of a hot receiver's split stages.

use crate::sched::fast::stages::StagePair;

/// At most this many stage pairs are replayed ([`fluid_stage_end`]): its
/// work grows with the pairs times the flows moving at once (several per
/// node where a layered list's parts are smaller than a lane's sends in
/// flight). At 8x8 DGX-H100 on a 2:1 fat-tree in `ideal` (callgrind,
/// instructions of `auto`'s `choose` over the sweep's seven matrices) the
/// replay adds 22% with this cap and 194% without one, where the sweep's
/// picks are the same (four `fast` estimates at 4x8 and 8x8 move, by at
/// most 0.8%) (docs/benchmarks.md, "`auto`'s `fast` estimate replays its
/// stages"); one replay of 181 pairs costs about 9.9 million instructions,
/// seven times `fast`'s whole plan at 8x8.
pub(crate) const REPLAY_MAX_PAIRS: usize = 128;

/// `fast`'s node stages replayed as fluid flows (`pairs` sorted by stage):
/// each pair is one flow of its bytes, from its
/// sending node's NICs (`rate` bytes/us together) to its receiving node's,
/// over its leaves' uplink and downlink where the two nodes are on
/// different leaves (`leaf[a]`, `fabric[l]` bytes/us each way; no fabric
/// link where `fabric` is empty). A flow starts once every earlier flow of
/// its sender and of its receiver has started and those still moving hold
/// at most `window` bytes (the lanes' sends in flight), and the flows
/// moving share each NIC side and fabric link max-min fairly, as the
/// simulator shares a link between transfers. Returns when the last flow
/// ends, us. Where no fabric link is shared this is the stage chains'
/// dataflow ([`StageChains`](crate::sched::fast::stages::StageChains));
/// where a leaf's downlink carries a hot receiver's crossing pair beside
/// its leaf-mates' crossing pairs, the hot receiver's NICs idle for the
/// share they lose (4x8 fat-tree Zipf 1.5: docs/benchmarks.md, "`auto`'s
/// `fast` estimate replays its stages").
/// One event per flow end and per node whose bytes in flight fall to the
/// window, each a max-min fill over the moving flows.
pub(crate) fn fluid_stage_end(
    nodes: usize,
    pairs: &[StagePair],
    leaf: &[usize],
    fabric: &[f64],
    rate: f64,
    window: f64,
) -> f64 {
    if nodes < 2 || pairs.is_empty() || rate <= 0.0 {
        return 0.0;
    }
    let f = pairs.len();
    let leaves = fabric.len();
    // Resources: NIC egress per node, NIC ingress per node, then uplinks
    // and downlinks per leaf; each flow's (two, or four when it crosses).
    let nr = 2 * nodes + 2 * leaves;
    let none = usize::MAX;
    let res: Vec<[usize; 4]> = pairs
        .iter()
        .map(|p| {
            let (a, b) = (p.src_node as usize, p.dst_node as usize);
            if leaves > 0 && leaf[a] != leaf[b] {
                [
                    a,
                    nodes + b,
                    2 * nodes + leaf[a],
                    2 * nodes + leaves + leaf[b],
                ]
            } else {
                [a, nodes + b, none, none]
            }
        })
        .collect();
    // Each node's flows out and in, in stage order, and the next to start.
    let mut out_q: Vec<Vec<usize>> = vec![Vec::new(); nodes];
    let mut in_q: Vec<Vec<usize>> = vec![Vec::new(); nodes];
    for (i, p) in pairs.iter().enumerate() {
        out_q[p.src_node as usize].push(i);
        in_q[p.dst_node as usize].push(i);
    }
    let (mut out_next, mut in_next) = (vec![0usize; nodes], vec![0usize; nodes]);
    let mut rem: Vec<f64> = pairs.iter().map(|p| p.bytes as f64).collect();
    // Bytes still to move out of / into each node (flows started, not
    // done), and the rate they move at.
    let mut held = vec![0.0f64; 2 * nodes];
    let mut held_rate = vec![0.0f64; 2 * nodes];
    let mut moving: Vec<usize> = Vec::with_capacity(4 * nodes);
    let mut flow_rate = vec![0.0f64; f];
    let mut frozen: Vec<bool> = Vec::with_capacity(4 * nodes);
    let (mut start, mut fill) = (vec![0usize; nr + 1], vec![0usize; nr]);
    let mut on: Vec<usize> = Vec::new();
    let mut share = vec![0.0f64; nr];
    let mut cap = vec![0.0f64; nr];
    let mut count = vec![0usize; nr];
    // What rounding leaves of a flow's or a node's bytes: a billionth of
    // the largest pair (events are exact, so this only absorbs rounding).
    let eps = 1e-9 * rem.iter().copied().fold(1.0, f64::max);
    let mut now = 0.0f64;
    let mut done = 0usize;
    // Each event ends a flow or brings what a node holds down to the
    // window, once per flow started at the node as sender or receiver:
    // at most `3 f` (the bound only guards against rounding).
    let mut events = 0;
    while done < f && events <= 3 * f + 2 {
        events += 1;
        // Start every flow that may start, in passes over the senders
        // until none starts: a start makes its flow no longer the next of
        // its receiver, which can let an earlier sender's next flow start.
        let mut started = true;
        while started {
            started = false;
            for a in 0..nodes {
                while let Some(&i) = out_q[a].get(out_next[a]) {
                    let b = pairs[i].dst_node as usize;
                    if in_q[b].get(in_next[b]) != Some(&i)
                        || held[a] > window + eps
                        || held[nodes + b] > window + eps
                    {
                        break;
                    }
                    out_next[a] += 1;
                    in_next[b] += 1;
                    held[a] += rem[i];
                    held[nodes + b] += rem[i];
                    moving.push(i);
                    started = true;
                }
            }
        }
        if moving.is_empty() {
            break;
        }
        // Max-min rates: the flows' rates rise together; every resource
        // whose share is the lowest freezes its flows at it.
        cap[..2 * nodes].fill(rate);
        cap[2 * nodes..2 * nodes + leaves].copy_from_slice(fabric);
        cap[2 * nodes + leaves..].copy_from_slice(fabric);
        count.fill(0);
        for &i in &moving {
            for &r in res[i].iter().filter(|&&r| r != none) {
                count[r] += 1;
            }
        }
        // Each resource's moving flows (by their place in `moving`).
        start[0] = 0;
        for r in 0..nr {
            start[r + 1] = start[r] + count[r];
        }
        fill[..nr].copy_from_slice(&start[..nr]);
        on.resize(start[nr], 0);
        for (k, &i) in moving.iter().enumerate() {
            for &r in res[i].iter().filter(|&&r| r != none) {
                on[fill[r]] = k;
                fill[r] += 1;
            }
        }
        frozen.clear();
        frozen.resize(moving.len(), false);
        for r in 0..nr {
            share[r] = if count[r] > 0 {
                cap[r] / count[r] as f64
            } else {
                f64::INFINITY
            };
        }
        loop {
            let low = share.iter().copied().fold(f64::INFINITY, f64::min);
            if !low.is_finite() {
                break;
            }
            // Every resource at the lowest share (ties are common: idle
            // NICs) freezes its flows at it; the others' shares only rise.
            let tight = low * (1.0 + 1e-12);
            for r0 in 0..nr {
                if share[r0] > tight {
                    continue;
                }
                for &k in &on[start[r0]..start[r0 + 1]] {
                    if frozen[k] {
                        continue;
                    }
                    frozen[k] = true;
                    let i = moving[k];
                    flow_rate[i] = low;
                    for &r in res[i].iter().filter(|&&r| r != none) {
                        cap[r] -= low;
                        count[r] -= 1;
                        share[r] = if count[r] > 0 {
                            cap[r].max(0.0) / count[r] as f64
                        } else {
                            f64::INFINITY
                        };
                    }
                }
            }
        }
        // The next event: a flow ends, or what a node holds falls to the
        // window so that its next flow may start.
        held_rate.fill(0.0);
        let mut dt = f64::INFINITY;
        for &i in &moving {
            let v = flow_rate[i];
            if v > 0.0 {
                dt = dt.min(rem[i] / v);
            }
            held_rate[pairs[i].src_node as usize] += v;
            held_rate[nodes + pairs[i].dst_node as usize] += v;
        }
        for (h, v) in held.iter().zip(&held_rate) {
            if *h > window + eps && *v > 0.0 {
                dt = dt.min((h - window) / v);
            }
        }
        if !dt.is_finite() {
            break;
        }
        now += dt;
        moving.retain(|&i| {
            let moved = (flow_rate[i] * dt).min(rem[i]);
            rem[i] -= moved;
            let (a, b) = (
                pairs[i].src_node as usize,
                nodes + pairs[i].dst_node as usize,
            );
            held[a] = (held[a] - moved).max(0.0);
            held[b] = (held[b] - moved).max(0.0);
            if rem[i] <= eps {
                done += 1;
                false
            } else {
                true
            }
        });
    }
    now
}
