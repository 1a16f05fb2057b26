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

/// What [`merge_order`] runs first among the operations it may place:
/// the one the plan starts first (then ends first), or ends first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum MergeKey {
    Start,
    End,
}

/// The order merged tbs run their steps in: a position per operation
/// (`op_of[g][t][p]`: the operation of step `p` of tb `t` on gpu `g`,
/// tb `t`'s id being `t`), by `key` of `spans` (when the plan starts the
/// operation's first chunk and delivers its last) among the operations
/// every earlier one of which, on its tbs and in its waits, is placed. So it is a topological
/// order of what the executor holds (each tb's steps one after another,
/// each wait, a send and its receive as one): merged in it, every tb still
/// runs a subsequence of one order, and no tb runs a step the plan
/// delivers late ahead of one it delivers early unless the other waits
/// for it. A receive and a send paired on one tb then go out as the plan
/// has them finish, not in the lowering's operation order, which puts a
/// gpu's receives from lower ranks ahead of its own sends and chains
/// transfers the plan runs side by side (docs/benchmarks.md, "Packed
/// threadblocks merged in the plan's order"). `None` (the operation order) where `spans` does
/// not cover the operations.
pub(super) fn merge_order(
    tbs: &[Vec<Tb>],
    op_of: &[Vec<Vec<u32>>],
    spans: &[(f64, f64)],
    key: MergeKey,
) -> Option<Vec<u32>> {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    let n = spans.len();
    let mut out_edges: Vec<Vec<u32>> = vec![Vec::new(); n];
    let mut indeg = vec![0u32; n];
    let mut used = vec![false; n];
    let mut edge = |a: u32, b: u32, out_edges: &mut Vec<Vec<u32>>| -> Option<()> {
        if a as usize >= n || b as usize >= n {
            return None;
        }
        if a != b {
            out_edges[a as usize].push(b);
            indeg[b as usize] += 1;
        }
        Some(())
    };
    for (gtbs, gops) in tbs.iter().zip(op_of) {
        for (tb, ops) in gtbs.iter().zip(gops) {
            for (p, &o) in ops.iter().enumerate() {
                if o as usize >= n {
                    return None;
                }
                used[o as usize] = true;
                if p > 0 {
                    edge(ops[p - 1], o, &mut out_edges)?;
                }
                let st = tb.steps.get(p)?;
                if st.depid >= 0 {
                    let a = *gops.get(st.depid as usize)?.get(st.deps as usize)?;
                    edge(a, o, &mut out_edges)?;
                }
            }
        }
    }
    // Non-negative finite floats order as their bits do.
    let key = |o: usize| {
        let (a, b) = spans[o];
        let (a, b) = (a.max(0.0).to_bits(), b.max(0.0).to_bits());
        match key {
            MergeKey::Start => (a, b, o as u32),
            MergeKey::End => (b, a, o as u32),
        }
    };
    let mut ready: BinaryHeap<Reverse<(u64, u64, u32)>> = (0..n)
        .filter(|&o| used[o] && indeg[o] == 0)
        .map(|o| Reverse(key(o)))
        .collect();
    let mut rank = vec![u32::MAX; n];
    let mut next = 0u32;
    while let Some(Reverse((_, _, o))) = ready.pop() {
        rank[o as usize] = next;
        next += 1;
        for &b in &out_edges[o as usize] {
            indeg[b as usize] -= 1;
            if indeg[b as usize] == 0 {
                ready.push(Reverse(key(b as usize)));
            }
        }
    }
    // A cycle (none in a lowering's waits) leaves operations unplaced.
    (next as usize == used.iter().filter(|&&u| u).count()).then_some(rank)
}

/// Packs one gpu's tbs (`op_of[t][p]`: the operation of step `p` of tb
/// `t`, non-decreasing along a tb) down to `limit` tbs where pairs allow;
/// returns the tbs, renumbered by `(send, recv, chan)` as the lowering
/// numbers them, and their operations. A merged tb runs its steps by
/// `rank` of their operations ([`merge_order`]; `None`: the operation
/// order). With `busy_spans` (the plan's span of each operation) tbs pair
/// by the time the plan keeps them busy, else by steps. A gpu within
/// `limit` is returned as it is.
pub(super) fn pack_gpu(
    tbs: Vec<Tb>,
    op_of: Vec<Vec<u32>>,
    limit: usize,
    rank: Option<&[u32]>,
    busy_spans: Option<&[(f64, f64)]>,
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
    // Pairs (merged tbs) by the time the plan keeps both tbs busy, their
    // operations' spans (`busy_spans`; without it, or where it cannot give
    // `excess` pairs within 64 steps, by steps): within a channel the
    // tbs the plan keeps busiest are paired with the least busy of the
    // other direction, so no merged tb runs two long lists one after the
    // other; then the pairs least busy in all go first.
    let busy: Option<Vec<f64>> = busy_spans.map(|spans| {
        (0..k)
            .map(|t| {
                let mut ops: Vec<u32> = op_of[t].clone();
                ops.dedup();
                ops.iter()
                    .map(|&o| {
                        spans
                            .get(o as usize)
                            .map_or(0.0, |&(a, b)| (b - a).max(0.0))
                    })
                    .sum()
            })
            .collect()
    });
    let mut pairs: Vec<(f64, usize, usize)> = Vec::new();
    if let Some(busy) = &busy {
        for (sends, recvs) in by_chan.values() {
            let by_busy = |v: &[usize]| {
                let mut v = v.to_vec();
                v.sort_by(|&a, &b| busy[a].total_cmp(&busy[b]).then(a.cmp(&b)));
                v
            };
            let (s, r) = (by_busy(sends), by_busy(recvs));
            let m = s.len().min(r.len());
            for i in 0..m {
                let (a, b) = (s[i], r[m - 1 - i]);
                if len(a) + len(b) <= MAX_STEPS_PER_TB {
                    pairs.push((busy[a] + busy[b], a, b));
                }
            }
        }
        if pairs.len() < excess {
            pairs.clear();
        }
    }
    if pairs.is_empty() {
        for (sends, recvs) in by_chan.values_mut() {
            sends.sort_by_key(|&t| (len(t), t));
            recvs.sort_by_key(|&t| (len(t), t));
            for (&a, &b) in sends.iter().zip(recvs.iter()) {
                if len(a) + len(b) <= MAX_STEPS_PER_TB {
                    pairs.push(((len(a) + len(b)) as f64, a, b));
                }
            }
        }
    }
    pairs.sort_by(|x, y| x.0.total_cmp(&y.0).then((x.1, x.2).cmp(&(y.1, y.2))));
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
        let at = |o: u32| rank.map_or(o, |r| r[o as usize]);
        items.sort_unstable_by_key(|&(o, t, p)| (at(o), t, p));
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
        let (same, _) = pack_gpu(tbs.clone(), ops.clone(), 3, None, None);
        assert_eq!(same, tbs, "within the limit nothing changes");
        let (out, out_ops) = pack_gpu(tbs, ops, 2, None, None);
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
        let (out, _) = pack_gpu(tbs, ops, 1, None, None);
        // Channel 0 pairs its smallest send (1 step) with its receive (40);
        // 40 + 40 would pass 64, and channel 1's receive has no send.
        assert_eq!(out.len(), 3);
        assert!(out.iter().all(|t| t.steps.len() <= MAX_STEPS_PER_TB));
        let merged: Vec<&Tb> = out.iter().filter(|t| t.send >= 0 && t.recv >= 0).collect();
        assert_eq!(merged.len(), 1);
        assert_eq!((merged[0].send, merged[0].recv, merged[0].chan), (2, 1, 0));
        assert_eq!(merged[0].steps.len(), 41);
    }

    #[test]
    fn merged_steps_run_as_the_plan_finishes_them_unless_a_wait_says_otherwise() {
        use StepKind::{Recv, Send};
        // Gpu 1 receives a long transfer from gpu 0 (op 0, planned 0-200 us)
        // and sends a short one to gpu 2 (op 1, planned 0-30 us); packed to
        // one tb, the operation order would hold the send behind the
        // receive, which the plan runs beside it.
        let gpu = |send_waits: bool| {
            vec![
                tb(0, -1, 0, 0, vec![step(0, Recv, -1, -1, false)]),
                tb(
                    1,
                    2,
                    -1,
                    0,
                    vec![if send_waits {
                        step(0, Send, 0, 0, false)
                    } else {
                        step(0, Send, -1, -1, false)
                    }],
                ),
            ]
        };
        let others = |g1: Vec<Tb>| {
            vec![
                vec![tb(0, 1, -1, 0, vec![step(0, Send, -1, -1, false)])],
                g1,
                vec![tb(0, -1, 1, 0, vec![step(0, Recv, -1, -1, false)])],
            ]
        };
        let op_of = vec![vec![vec![0]], vec![vec![0], vec![1]], vec![vec![1]]];
        let spans = [(0.0, 200.0), (0.0, 30.0)];
        let kinds = |tbs: &[Tb]| -> Vec<StepKind> { tbs[0].steps.iter().map(|s| s.kind).collect() };
        let (plain, _) = pack_gpu(gpu(false), op_of[1].clone(), 1, None, None);
        assert_eq!(kinds(&plain), vec![Recv, Send]);
        for key in [MergeKey::Start, MergeKey::End] {
            let rank = merge_order(&others(gpu(false)), &op_of, &spans, key).unwrap();
            assert_eq!(rank, vec![1, 0]);
            let (out, ops) = pack_gpu(gpu(false), op_of[1].clone(), 1, Some(&rank), None);
            assert_eq!(kinds(&out), vec![Send, Recv]);
            assert_eq!(ops[0], vec![1, 0]);
            // A send that waits for the receive stays behind it.
            let rank = merge_order(&others(gpu(true)), &op_of, &spans, key).unwrap();
            assert_eq!(rank, vec![0, 1]);
            let (out, _) = pack_gpu(gpu(true), op_of[1].clone(), 1, Some(&rank), None);
            assert_eq!(kinds(&out), vec![Recv, Send]);
            assert_eq!((out[0].steps[1].depid, out[0].steps[1].deps), (0, 0));
        }
        // Spans that do not cover the operations: no order.
        assert!(merge_order(&others(gpu(false)), &op_of, &spans[..1], MergeKey::Start).is_none());
    }

    #[test]
    fn busy_tbs_pair_with_idle_ones() {
        use StepKind::{Recv, Send};
        // Sends to 1 (op 0, 100 us) and 2 (op 1, 10 us), receives from 1
        // (op 2, 100 us) and 2 (op 3, 10 us), one channel, packed to two.
        let tbs = vec![
            tb(0, 1, -1, 0, vec![step(0, Send, -1, -1, false)]),
            tb(1, 2, -1, 0, vec![step(0, Send, -1, -1, false)]),
            tb(2, -1, 1, 0, vec![step(0, Recv, -1, -1, false)]),
            tb(3, -1, 2, 0, vec![step(0, Recv, -1, -1, false)]),
        ];
        let ops = vec![vec![0], vec![1], vec![2], vec![3]];
        let spans = [(0.0, 100.0), (0.0, 10.0), (0.0, 100.0), (0.0, 10.0)];
        let pairs =
            |out: &[Tb]| -> Vec<(i64, i64)> { out.iter().map(|t| (t.send, t.recv)).collect() };
        let (by_steps, _) = pack_gpu(tbs.clone(), ops.clone(), 2, None, None);
        assert_eq!(pairs(&by_steps), vec![(1, 1), (2, 2)]);
        let (by_busy, _) = pack_gpu(tbs, ops, 2, None, Some(&spans));
        assert_eq!(pairs(&by_busy), vec![(1, 2), (2, 1)]);
    }
}
