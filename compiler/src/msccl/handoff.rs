//! A paced transfer's tail handed to the next transfer's head on the same
//! lane (docs/msccl.md, "Pacing").
//!
//! [`super::lower`]'s pacing cuts end an awaited send `A` in `window`
//! one-chunk tail steps (its last one is staged only once the receiver has
//! taken `A`'s body) and start a send `B` whose wait only its receiver can
//! hold with `window` one-chunk head steps (`B`'s body waits until the
//! receiver, held by that wait, takes the first). When `B` follows `A` on
//! the same lane, the connection's stream is `[A body, A tail.., B head..,
//! B body]`: `B`'s first head step is `window` calls after `A`'s body's last
//! one, so it is staged only once that body has been taken, arrives a
//! latency later, and `B`'s body, which waits for it to be taken, starts a
//! latency after the plan's (4x8 log-normal: `g17->g9` 46.9 -> 50.8 us).
//!
//! Once lanes are known, such a pair is written `[A body and tail as one,
//! B head.., B body]`: `B`'s last head step is `window` calls after `A`'s
//! last, so it is staged only once `A` has been taken, and it stands for
//! `A`'s tail. Waits on `A`'s tail on its sending gpu wait for it; waits
//! elsewhere (its receiver, readers of the tail's chunks) wait for `A`'s
//! now whole operation. `B`'s first head step is one call after `A`, staged
//! with it, and `B`'s body waits only for its receiver's wait.
//!
//! A pair is handed off only where this keeps the file what the plan asks:
//! the tail's chunks need no data the body's do not, `B`'s head data was
//! there in the plan when `A` ended (its sending gpu's waits on `A` now also
//! wait for `B`'s head steps to be staged), and every operation that waits
//! on the sending gpu for `A`'s tail comes, in the operations' order, after
//! what `B`'s head waits for (the head steps move up to there).

use std::collections::{HashMap, HashSet};

use super::ops::{ChunkOp, Part};
use super::MAX_CNT;
use crate::sim::TransferTime;

/// Slack on the plan's times when checking that `B`'s head data was there
/// when `A` ended (microseconds).
const SLACK_US: f64 = 1e-3;

/// One tail handed to the next head.
struct HandOff {
    /// `A`'s body (it takes the tail's chunks).
    body: usize,
    /// `A`'s tail steps.
    tail: Vec<usize>,
    /// `B`'s head steps, in order; the last stands for `A`'s tail.
    head: Vec<usize>,
    /// The head steps move to just after this operation.
    slot: usize,
}

/// The operations with every tail that a head follows on its lane handed
/// off (see the module doc), and the lane of each; `None` when there is
/// none to hand off. `parts` and `lane` are per operation of `ops`.
pub(super) fn hand_off(
    ops: &[ChunkOp],
    parts: &[Part],
    window: u32,
    lane: &[u32],
    timeline: &[TransferTime],
) -> Option<(Vec<ChunkOp>, Vec<u32>, usize)> {
    let w = window as usize;
    if w == 0 || parts.len() != ops.len() {
        return None;
    }
    let end = |from: u32| timeline.get(from as usize).map(|t| t.end_us);
    // Each lane's operations in order.
    let mut lanes: HashMap<(u32, u32, u32), Vec<usize>> = HashMap::new();
    for (i, o) in ops.iter().enumerate() {
        if o.src != o.dst {
            lanes.entry((o.src, o.dst, lane[i])).or_default().push(i);
        }
    }
    let mut found: Vec<HandOff> = Vec::new();
    for seq in lanes.values() {
        for k in 0..seq.len().saturating_sub(2 * w) {
            let a = seq[k];
            let tail = &seq[k + 1..=k + w];
            let head = &seq[k + w + 1..=k + 2 * w];
            let (ao, bo) = (&ops[a], &ops[head[0]]);
            let shape = parts[a] == Part::Body
                && tail.iter().all(|&t| parts[t] == Part::Tail)
                && head.iter().all(|&h| parts[h] == Part::Head)
                && tail.iter().all(|&t| ops[t].from == ao.from)
                && head.iter().all(|&h| ops[h].from == bo.from)
                && bo.from != ao.from;
            if !shape {
                continue;
            }
            // The tail continues the body: consecutive operations, chunks.
            // (Each test below only where those before it hold: a large
            // lowering has hundreds of thousands of candidate pairs, and
            // the later tests walk deps.)
            let mut prev = a;
            let contiguous = tail.iter().all(|&t| {
                let (p, o) = (&ops[prev], &ops[t]);
                let ok = t == prev + 1
                    && o.src_buf == p.src_buf
                    && o.dst_buf == p.dst_buf
                    && o.src_off == p.src_off + p.cnt
                    && o.dst_off == p.dst_off + p.cnt;
                prev = t;
                ok
            });
            if !contiguous {
                continue;
            }
            // Whole, the operation is one step of at most `MAX_CNT` chunks.
            let whole = ao.cnt + tail.iter().map(|&t| ops[t].cnt).sum::<u32>();
            if whole > MAX_CNT {
                continue;
            }
            // Whole, the operation waits only for what its body did.
            let same_data = tail
                .iter()
                .all(|&t| ops[t].deps.iter().all(|d| ao.deps.contains(d)));
            if !same_data {
                continue;
            }
            // `B`'s head data was there when `A` ended, in the plan (the
            // gathering copies of its own transfer wait for nothing).
            let a_end = end(ao.from);
            let head_deps: Vec<u32> = head
                .iter()
                .flat_map(|&h| ops[h].deps.iter().chain(&ops[h].recv_deps))
                .copied()
                .collect();
            let early = head.iter().flat_map(|&h| &ops[h].deps).all(|&d| {
                let x = &ops[d as usize];
                (x.src == x.dst && x.from == bo.from)
                    || matches!((end(x.from), a_end), (Some(e), Some(f)) if e <= f + SLACK_US)
            });
            let clear = head_deps.iter().all(|&d| !tail.contains(&(d as usize)));
            if !(early && clear) {
                continue;
            }
            let slot = head_deps
                .iter()
                .map(|&d| d as usize)
                .max()
                .unwrap_or(0)
                .max(a);
            found.push(HandOff {
                body: a,
                tail: tail.to_vec(),
                head: head.to_vec(),
                slot,
            });
        }
    }
    if found.is_empty() {
        return None;
    }
    // Hand-offs that touch each other's moved or removed operations are
    // left as they are.
    let moved: HashSet<usize> = found.iter().flat_map(|f| f.head.iter().copied()).collect();
    let gone: HashSet<usize> = found.iter().flat_map(|f| f.tail.iter().copied()).collect();
    found.retain(|f| {
        let deps_clear = f.head.iter().all(|&h| {
            ops[h]
                .deps
                .iter()
                .chain(&ops[h].recv_deps)
                .all(|&d| !moved.contains(&(d as usize)) && !gone.contains(&(d as usize)))
        });
        deps_clear && !moved.contains(&f.slot) && !gone.contains(&f.slot)
    });
    // Who waits for each tail: the sending gpu's waiters must come after
    // the slot, and none may touch both ends of the connection.
    // (Per operation, `NONE` where it is no tail: every dep of every
    // operation is looked up.)
    const NONE: u32 = u32::MAX;
    let mut of_tail: Vec<u32> = vec![NONE; ops.len()];
    for (fi, f) in found.iter().enumerate() {
        for &t in &f.tail {
            of_tail[t] = fi as u32;
        }
    }
    let mut bad = vec![false; found.len()];
    for (x, o) in ops.iter().enumerate() {
        let sides = o
            .deps
            .iter()
            .map(|&d| (d, [o.src, o.dst]))
            .chain(o.recv_deps.iter().map(|&d| (d, [o.dst, o.dst])));
        for (d, gpus) in sides {
            let fi = of_tail[d as usize];
            if fi == NONE {
                continue;
            }
            let fi = fi as usize;
            let f = &found[fi];
            let a = &ops[f.body];
            let on_src = gpus.contains(&a.src);
            // On both ends, only an operation of the same lane (its
            // receive follows the head's anyway) may wait for the head
            // step: elsewhere its receiver's wait would hold it.
            let same_lane = (o.src, o.dst, lane[x]) == (a.src, a.dst, lane[f.body]);
            let both = on_src && gpus.contains(&a.dst) && !same_lane;
            if both || (on_src && x <= f.slot) || moved.contains(&x) {
                bad[fi] = true;
            }
        }
    }
    let found: Vec<HandOff> = found
        .into_iter()
        .zip(bad)
        .filter(|(_, b)| !b)
        .map(|(f, _)| f)
        .collect();
    if found.is_empty() {
        return None;
    }
    // The new order: tails out, heads just after their slot.
    let mut skip = vec![false; ops.len()];
    let mut after: HashMap<usize, Vec<usize>> = HashMap::new();
    let mut tail_of: Vec<u32> = vec![NONE; ops.len()];
    for (fi, f) in found.iter().enumerate() {
        for &t in &f.tail {
            skip[t] = true;
            tail_of[t] = fi as u32;
        }
        for &h in &f.head {
            skip[h] = true;
        }
        after.entry(f.slot).or_default().extend(&f.head);
    }
    let mut order: Vec<usize> = Vec::with_capacity(ops.len());
    for (i, &moved_or_gone) in skip.iter().enumerate() {
        if !moved_or_gone {
            order.push(i);
        }
        if let Some(v) = after.get_mut(&i) {
            v.sort_unstable();
            order.extend(v.iter().copied());
        }
    }
    let mut new_of = vec![u32::MAX; ops.len()];
    for (k, &i) in order.iter().enumerate() {
        new_of[i] = k as u32;
    }
    // A dep on a handed-off tail: the whole operation, and on the sending
    // gpu the head step that stands for the tail.
    // (Pushed onto the new list: no list per dep.)
    let remap = |v: &mut Vec<u32>, d: u32, gpus: [u32; 2]| {
        let fi = tail_of[d as usize];
        if fi == NONE {
            v.push(new_of[d as usize]);
            return;
        }
        let f = &found[fi as usize];
        v.push(new_of[f.body]);
        if gpus.contains(&ops[f.body].src) {
            v.push(new_of[*f.head.last().expect("a head")]);
        }
    };
    let mut out: Vec<ChunkOp> = Vec::with_capacity(order.len());
    let mut lanes_out: Vec<u32> = Vec::with_capacity(order.len());
    let mut body_of: Vec<u32> = vec![NONE; ops.len()];
    for (fi, f) in found.iter().enumerate() {
        body_of[f.body] = fi as u32;
    }
    for &i in &order {
        let o = &ops[i];
        let mut deps: Vec<u32> = Vec::with_capacity(o.deps.len());
        for &d in &o.deps {
            remap(&mut deps, d, [o.src, o.dst]);
        }
        let mut recv_deps: Vec<u32> = Vec::with_capacity(o.recv_deps.len());
        for &d in &o.recv_deps {
            remap(&mut recv_deps, d, [o.dst, o.dst]);
        }
        let mut cnt = o.cnt;
        if body_of[i] != NONE {
            for &t in &found[body_of[i] as usize].tail {
                cnt += ops[t].cnt;
            }
        }
        deps.sort_unstable();
        deps.dedup();
        recv_deps.sort_unstable();
        recv_deps.dedup();
        out.push(ChunkOp {
            cnt,
            deps,
            recv_deps,
            ..o.without_deps()
        });
        lanes_out.push(lane[i]);
    }
    Some((out, lanes_out, found.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[allow(clippy::too_many_arguments)]
    fn op(
        src: u32,
        src_off: u32,
        dst: u32,
        dst_off: u32,
        cnt: u32,
        deps: Vec<u32>,
        recv_deps: Vec<u32>,
        from: u32,
    ) -> ChunkOp {
        ChunkOp::test(src, src_off, dst, dst_off, cnt, from).after(deps, recv_deps)
    }

    fn at(end_us: f64) -> TransferTime {
        TransferTime {
            start_us: 0.0,
            end_us,
        }
    }

    /// Gpu 0 sends `A` (transfer 0: body of 4 chunks, tail of 2) and then,
    /// on the same lane, `B` (transfer 1: head of 2, body of 3), whose
    /// receiver waits for `Z` (transfer 2, gpu 2 -> gpu 1). `X` (transfer
    /// 3, gpu 0 -> gpu 2) waits for `A` on gpu 0; `Y` (transfer 4, gpu 1 ->
    /// gpu 3) forwards `A`'s last chunk.
    fn case() -> (Vec<ChunkOp>, Vec<Part>) {
        use Part::*;
        let ops = vec![
            op(0, 0, 1, 0, 4, vec![], vec![], 0),
            op(0, 4, 1, 4, 1, vec![], vec![], 0),
            op(0, 5, 1, 5, 1, vec![], vec![], 0),
            op(2, 0, 1, 20, 3, vec![], vec![], 2),
            op(0, 10, 1, 10, 1, vec![], vec![3], 1),
            op(0, 11, 1, 11, 1, vec![], vec![3], 1),
            op(0, 12, 1, 12, 3, vec![2, 3], vec![], 1),
            op(0, 20, 2, 0, 2, vec![2], vec![], 3),
            op(1, 5, 3, 0, 1, vec![2], vec![], 4),
        ];
        let parts = vec![Body, Tail, Tail, Whole, Head, Head, Body, Whole, Whole];
        (ops, parts)
    }

    #[test]
    fn a_tail_is_handed_to_the_next_head() {
        let (ops, parts) = case();
        let lanes = vec![0; ops.len()];
        let tl = vec![at(10.0), at(20.0), at(9.0), at(15.0), at(12.0)];
        let (out, lanes_out, n) = hand_off(&ops, &parts, 2, &lanes, &tl).expect("a hand-off");
        assert_eq!(n, 1);
        assert_eq!(lanes_out.len(), out.len());
        // A is one operation of 6 chunks; B's head steps come right after
        // it on the lane (Z, which the head's receiver waits for, first).
        let shape: Vec<(u32, u32)> = out.iter().map(|o| (o.from, o.cnt)).collect();
        assert_eq!(
            shape,
            vec![(0, 6), (2, 3), (1, 1), (1, 1), (1, 3), (3, 2), (4, 1)]
        );
        assert_eq!(out[2].recv_deps, vec![1]);
        // B's body waited for A's tail (gpu 0): now for A and B's last head
        // step; X likewise; Y (on gpu 1, A's receiver) for A only.
        assert_eq!(out[4].deps, vec![0, 1, 3]);
        assert_eq!(out[5].deps, vec![0, 3]);
        assert_eq!(out[6].deps, vec![0]);
    }

    #[test]
    fn no_hand_off_where_the_head_data_came_late_or_the_step_is_too_long() {
        let (mut ops, parts) = case();
        let lanes = vec![0; ops.len()];
        // B's head reads what Z brings, which ends after A in the plan.
        ops[3].dst = 0;
        ops[4].deps = vec![3];
        ops[4].recv_deps = vec![];
        let tl = vec![at(10.0), at(20.0), at(11.0), at(15.0), at(12.0)];
        assert!(hand_off(&ops, &parts, 2, &lanes, &tl).is_none());
        // A's body and tail would be a step of more than 71 chunks.
        let (mut ops, parts) = case();
        ops[0].cnt = 70;
        ops[1].src_off = 70;
        ops[1].dst_off = 70;
        ops[2].src_off = 71;
        ops[2].dst_off = 71;
        assert!(hand_off(&ops, &parts, 2, &lanes, &tl).is_none());
        // On another lane B does not follow A: nothing to hand off either.
        let (ops, parts) = case();
        let mut lanes = vec![0; ops.len()];
        lanes[4..7].fill(1);
        assert!(hand_off(&ops, &parts, 2, &lanes, &tl).is_none());
    }
}
