//! Packing threadblocks: fewer tbs per gpu for clusters with many peers.
//!
//! The lowering gives every connection direction its own tb (a send tb on
//! the sending gpu, a receive tb on the receiving one), so a gpu that talks
//! to `P` peers both ways needs `2P` tbs. The executor's tb has one send
//! peer and one receive peer (`mscclThreadBlock::sendPeer`, `recvPeer` in
//! `src/include/msccl/msccl_struct.h`; `msccl_parser.cc` reads both from
//! `<tb send= recv=>`), so a send-only and a receive-only tb of the same
//! channel can be one tb that runs both step lists, merged in the global
//! order the lowering lists steps in. That keeps the lowering's
//! no-deadlock argument (every tb runs a subsequence of one topological
//! order), costs the two lists their concurrency (one tb runs them one
//! step after another) and nothing else: the connections, channels,
//! operations and waits are the same. So it is done only where a gpu has
//! more tbs than its profile loads, smallest pairs first, and never
//! beyond 64 steps per tb. Local-copy tbs join the smallest tb last.

use super::{Tb, MAX_STEPS_PER_TB};

/// A merged threadblock: the tb, its steps' operations, and where each
/// step came from (threadblock, step).
type Merged = (Tb, Vec<u32>, Vec<(usize, usize)>);

/// Packs one gpu's tbs (`op_of[t][p]`: the operation of step `p` of tb
/// `t`, non-decreasing along a tb) down to `limit` tbs where pairs allow;
/// returns the tbs, renumbered by `(send, recv, chan)` as the lowering
/// numbers them, and their operations. A gpu within `limit` is returned
/// as it is.
pub(super) fn pack_gpu(
    tbs: Vec<Tb>,
    op_of: Vec<Vec<u32>>,
    limit: usize,
) -> (Vec<Tb>, Vec<Vec<u32>>) {
    let k = tbs.len();
    if k <= limit {
        return (tbs, op_of);
    }
    let mut excess = k - limit;
    let len = |t: usize| tbs[t].steps.len();
    // Groups of old tbs that become one tb; each old tb in one group.
    let mut group_of: Vec<usize> = (0..k).collect();
    let mut groups: Vec<Vec<usize>> = (0..k).map(|t| vec![t]).collect();
    // Send-only and receive-only tbs by channel, fewest steps first.
    let mut by_chan: std::collections::BTreeMap<i64, (Vec<usize>, Vec<usize>)> =
        std::collections::BTreeMap::new();
    for (t, tb) in tbs.iter().enumerate() {
        let e = by_chan.entry(tb.chan).or_default();
        match (tb.send >= 0, tb.recv >= 0) {
            (true, false) => e.0.push(t),
            (false, true) => e.1.push(t),
            _ => {}
        }
    }
    let mut pairs: Vec<(usize, usize, usize)> = Vec::new();
    for (sends, recvs) in by_chan.values_mut() {
        sends.sort_by_key(|&t| (len(t), t));
        recvs.sort_by_key(|&t| (len(t), t));
        for (&a, &b) in sends.iter().zip(recvs.iter()) {
            if len(a) + len(b) <= MAX_STEPS_PER_TB {
                pairs.push((len(a) + len(b), a, b));
            }
        }
    }
    pairs.sort_unstable();
    for &(_, a, b) in pairs.iter().take(excess) {
        groups[b].clear();
        groups[a].push(b);
        group_of[b] = a;
        excess -= 1;
    }
    // Local-copy tbs join the tb (group) with the fewest steps.
    let steps_of = |g: &Vec<usize>| g.iter().map(|&t| tbs[t].steps.len()).sum::<usize>();
    for t in 0..k {
        if excess == 0 {
            break;
        }
        let tb = &tbs[t];
        if tb.send >= 0 || tb.recv >= 0 || groups[t].len() != 1 {
            continue;
        }
        let best = (0..k)
            .filter(|&h| h != t && !groups[h].is_empty())
            .min_by_key(|&h| (steps_of(&groups[h]), h));
        if let Some(h) = best.filter(|&h| steps_of(&groups[h]) + len(t) <= MAX_STEPS_PER_TB) {
            groups[t].clear();
            groups[h].push(t);
            group_of[t] = h;
            excess -= 1;
        }
    }
    let _ = group_of;
    // Each group's steps, in the order of their operations.
    let mut merged: Vec<Merged> = Vec::new();
    for g in groups.iter().filter(|g| !g.is_empty()) {
        let mut items: Vec<(u32, usize, usize)> = g
            .iter()
            .flat_map(|&t| (0..tbs[t].steps.len()).map(move |p| (t, p)))
            .map(|(t, p)| (op_of[t][p], t, p))
            .collect();
        items.sort_unstable();
        let send = g.iter().map(|&t| tbs[t].send).max().unwrap_or(-1);
        let recv = g.iter().map(|&t| tbs[t].recv).max().unwrap_or(-1);
        // A peer tb's channel; local-copy tbs alone keep theirs.
        let chan = g
            .iter()
            .find(|&&t| tbs[t].send >= 0 || tbs[t].recv >= 0)
            .map_or(tbs[g[0]].chan, |&t| tbs[t].chan);
        let tb = Tb {
            id: 0,
            send,
            recv,
            chan,
            steps: Vec::with_capacity(items.len()),
            line: 0,
        };
        let ops = items.iter().map(|x| x.0).collect();
        let from = items.iter().map(|&(_, t, p)| (t, p)).collect();
        merged.push((tb, ops, from));
    }
    // Number as the lowering does: by (send, recv, chan), local ones first
    // (their send and recv are -1), ties in the old order.
    merged.sort_by_key(|(tb, _, from)| (tb.send, tb.recv, tb.chan, from.first().copied()));
    let mut new_at = vec![Vec::new(); k];
    for (t, tb) in tbs.iter().enumerate() {
        new_at[t] = vec![(0i64, 0i64); tb.steps.len()];
    }
    for (nt, (_, _, from)) in merged.iter().enumerate() {
        for (np, &(t, p)) in from.iter().enumerate() {
            new_at[t][p] = (nt as i64, np as i64);
        }
    }
    // Old ids to old indices (ids are positions after the lowering's sort,
    // but a caller may pass any numbering).
    let mut index_of = vec![0usize; k];
    for (t, tb) in tbs.iter().enumerate() {
        index_of[tb.id as usize] = t;
    }
    let mut out = Vec::with_capacity(merged.len());
    let mut out_ops = Vec::with_capacity(merged.len());
    for (nt, (mut tb, ops, from)) in merged.into_iter().enumerate() {
        tb.id = nt as i64;
        for (np, &(t, p)) in from.iter().enumerate() {
            let mut st = tbs[t].steps[p].clone();
            st.s = np as i64;
            if st.depid >= 0 {
                let (dt, dp) = new_at[index_of[st.depid as usize]][st.deps as usize];
                st.depid = dt;
                st.deps = dp;
            }
            tb.steps.push(st);
        }
        out.push(tb);
        out_ops.push(ops);
    }
    (out, out_ops)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msccl::{BufRef, Step, StepKind};

    fn step(s: i64, kind: StepKind, depid: i64, deps: i64, hasdep: bool) -> Step {
        Step {
            s,
            kind,
            srcbuf: BufRef::Input,
            srcoff: 0,
            dstbuf: BufRef::Output,
            dstoff: 0,
            cnt: 1,
            depid,
            deps,
            hasdep,
            line: 0,
        }
    }

    fn tb(id: i64, send: i64, recv: i64, chan: i64, steps: Vec<Step>) -> Tb {
        Tb {
            id,
            send,
            recv,
            chan,
            steps,
            line: 0,
        }
    }

    #[test]
    fn a_send_and_a_receive_tb_become_one_in_operation_order() {
        // tb 0 sends to 1 (ops 0, 3), tb 1 receives from 2 (ops 1, 2; the
        // second waits for tb 0's step 0), tb 2 receives from 3 on channel 1.
        let tbs = vec![
            tb(
                0,
                1,
                -1,
                0,
                vec![
                    step(0, StepKind::Send, -1, -1, true),
                    step(1, StepKind::Send, -1, -1, false),
                ],
            ),
            tb(
                1,
                -1,
                2,
                0,
                vec![
                    step(0, StepKind::Recv, -1, -1, false),
                    step(1, StepKind::Recv, 0, 0, false),
                ],
            ),
            tb(2, -1, 3, 1, vec![step(0, StepKind::Recv, -1, -1, false)]),
        ];
        let ops = vec![vec![0, 3], vec![1, 2], vec![4]];
        let (same, _) = pack_gpu(tbs.clone(), ops.clone(), 3);
        assert_eq!(same, tbs, "within the limit nothing changes");
        let (out, out_ops) = pack_gpu(tbs, ops, 2);
        assert_eq!(out.len(), 2);
        let m = &out[1];
        assert_eq!((m.send, m.recv, m.chan), (1, 2, 0));
        assert_eq!(out_ops[1], vec![0, 1, 2, 3]);
        let kinds: Vec<StepKind> = m.steps.iter().map(|s| s.kind).collect();
        use StepKind::{Recv, Send};
        assert_eq!(kinds, vec![Send, Recv, Recv, Send]);
        assert!(m.steps.iter().enumerate().all(|(p, s)| s.s == p as i64));
        // The wait on the old send tb's step 0 is now on this tb's step 0.
        assert_eq!((m.steps[2].depid, m.steps[2].deps), (1, 0));
        assert!(m.steps[0].hasdep);
        // The channel-1 receive could not pair: it stays, numbered first.
        assert_eq!((out[0].send, out[0].recv, out[0].chan), (-1, 3, 1));
    }

    #[test]
    fn no_tb_passes_64_steps_and_channels_never_mix() {
        let many = |kind| (0..40).map(|p| step(p, kind, -1, -1, false)).collect();
        let tbs = vec![
            tb(0, 1, -1, 0, many(StepKind::Send)),
            tb(1, -1, 1, 0, many(StepKind::Recv)),
            tb(2, 2, -1, 0, vec![step(0, StepKind::Send, -1, -1, false)]),
            tb(3, -1, 2, 1, vec![step(0, StepKind::Recv, -1, -1, false)]),
        ];
        let ops = vec![(0..40).collect(), (40..80).collect(), vec![80], vec![81]];
        let (out, _) = pack_gpu(tbs, ops, 1);
        // Channel 0 pairs its smallest send (1 step) with its receive (40);
        // 40 + 40 would pass 64, and channel 1's receive has no send.
        assert_eq!(out.len(), 3);
        assert!(out.iter().all(|t| t.steps.len() <= MAX_STEPS_PER_TB));
        let merged: Vec<&Tb> = out.iter().filter(|t| t.send >= 0 && t.recv >= 0).collect();
        assert_eq!(merged.len(), 1);
        assert_eq!((merged[0].send, merged[0].recv, merged[0].chan), (2, 1, 0));
        assert_eq!(merged[0].steps.len(), 41);
    }
}
