//! Lanes: spreads each connection's operations over its channels as the
//! plan's concurrency and the threadblock budget allow.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use crate::msccl::ops::{ChunkOp, Part};
use crate::msccl::spread::spread_lanes;
use crate::msccl::MAX_STEPS_PER_TB;
use crate::sim::TransferTime;

/// Lanes (channels) one connection's operations are spread over at most.
pub(super) const MAX_LANES: u32 = 32;
/// When the tb budget cannot give every transfer the plan runs at once a
/// lane of its own, a transfer may follow one on a lane that, in the plan,
/// is still running for up to this fraction of its own duration.
const SHARE_SLACK: f64 = 0.2;

/// Lanes of every operation, and how many lanes each connection has.
pub(super) struct Lanes {
    pub(super) of_op: Vec<u32>,
    pub(super) per_conn: HashMap<(u32, u32), u32>,
    /// Lanes the plan's concurrency wants beyond those the budget gave.
    pub(super) short: usize,
    /// Largest number of tbs a gpu needs to run at once every transfer the
    /// plan runs at once.
    pub(super) tbs_wanted: usize,
}

/// How the threadblock budget's lanes beyond one per connection are shared
/// among the connections whose plan runs more transfers at once than one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) enum LaneShare {
    /// To the connection with the most lanes wanted per lane it has: every
    /// lane the plan's concurrency wants counts the same.
    #[default]
    Wanted,
    /// To the connection whose next lane the plan keeps busy longest (the
    /// summed planned durations of the transfers the greedy cover puts on
    /// it): a lane of short transfers the plan starts together (`spray`'s
    /// balancing moves on a hot GPU's NVLink) counts for less than one of a
    /// long stream beside another on a NIC, which, serialised, runs its
    /// plan's two streams one after another.
    Busy,
}

/// Plans with more transfers than this get their lanes without the
/// ancestor test (its bit sets take transfers² / 8 bytes).
const MAX_ANCESTOR_TRANSFERS: usize = 16_384;

/// Puts every operation on a lane (a channel of its connection, each lane
/// one send tb and one receive tb, run one step after another). The runs of
/// one plan transfer go on one lane back to back, so the executor streams
/// them as the one flow the transfer is. A transfer goes on a lane whose
/// last transfer is one of its ancestors in the plan (then the lane's order
/// adds no wait the plan does not have); failing that on a new lane, so
/// transfers the plan runs side by side move side by side. Lanes are
/// limited by the threadblock budget: every connection has one, and extra
/// ones go, one at a time, to the connection that wants the most more than
/// it has, while both its gpus stay within `budget` tbs
/// ([`Executor::tb_budget`](crate::msccl::Executor::tb_budget)). A transfer
/// that finds no free lane takes the one with the fewest bytes. With
/// `parts` (the pacing cuts' pieces of `ops`; empty: none), a transfer that
/// reads another's tail chunks is followed on its lane only by its
/// descendants (it starts a flight after its planned start). `share` says
/// which connection an extra lane goes to ([`LaneShare`]).
#[allow(clippy::too_many_arguments)]
pub(super) fn assign_lanes(
    ops: &[ChunkOp],
    n: usize,
    timeline: &[TransferTime],
    budget: usize,
    groups: &[u32],
    parts: &[Part],
    max_per_conn: u32,
    share: LaneShare,
) -> Lanes {
    // Source transfers in the order of their remote operations (then those
    // with local copies only), with the ops of each: the copies that gather
    // a send's runs come first in `ops` (`super::gather`) but do not move
    // their transfer ahead of the others here.
    let mut order: Vec<u32> = Vec::new();
    // (By transfer: an array, looked up for every operation and dep.)
    let mut dense: Vec<usize> =
        vec![usize::MAX; ops.iter().map(|o| o.from as usize + 1).max().unwrap_or(0)];
    let remote_first = ops
        .iter()
        .filter(|o| o.src != o.dst)
        .chain(ops.iter().filter(|o| o.src == o.dst));
    for op in remote_first {
        if dense[op.from as usize] == usize::MAX {
            dense[op.from as usize] = order.len();
            order.push(op.from);
        }
    }
    let nt = order.len();
    let words = nt.div_ceil(64);
    let exact = nt <= MAX_ANCESTOR_TRANSFERS;
    // Ancestors of each transfer (dense indices), from the ops' deps.
    let mut anc: Vec<Vec<u64>> = if exact {
        vec![vec![0u64; words]; nt]
    } else {
        Vec::new()
    };
    if exact {
        let mut seen = vec![false; nt];
        for op in ops {
            let t = dense[op.from as usize];
            if seen[t] {
                continue;
            }
            seen[t] = true;
            let mut a = vec![0u64; words];
            for &d in &op.deps {
                let x = dense[ops[d as usize].from as usize];
                if x == t {
                    continue;
                }
                a[x / 64] |= 1 << (x % 64);
                for (w, v) in a.iter_mut().zip(&anc[x]) {
                    *w |= v;
                }
            }
            anc[t] = a;
        }
    }
    // With `parts` (the cuts' pieces of `ops`): transfers that read the
    // chunks of another transfer's tail step. The tail is staged only once
    // its body has been taken (`super::cuts`), so it arrives a flight after
    // the body and these start that much later than the plan's timeline
    // says; a transfer follows them on a lane only if it descends from
    // them. (A wait of the tail's sending gpu on it ends when the body has
    // arrived, as planned: not late.)
    let mut late = vec![false; nt];
    if !parts.is_empty() {
        for op in ops {
            if op.deps.iter().any(|&d| {
                let x = &ops[d as usize];
                parts[d as usize] == Part::Tail && x.from != op.from && x.dst == op.src
            }) {
                late[dense[op.from as usize]] = true;
            }
        }
    }
    let time = |t: usize| {
        timeline
            .get(order[t] as usize)
            .map_or((0.0, 0.0), |x| (x.start_us, x.end_us))
    };
    let mut conn_of = vec![(0u32, 0u32); nt];
    for op in ops {
        conn_of[dense[op.from as usize]] = (op.src, op.dst);
    }
    let remote: Vec<usize> = (0..nt).filter(|&t| conn_of[t].0 != conn_of[t].1).collect();
    let mut base = vec![0usize; n];
    let mut locals = vec![0usize; n];
    for op in ops.iter().filter(|o| o.src == o.dst) {
        locals[op.src as usize] += 1;
    }
    for (g, &l) in locals.iter().enumerate() {
        base[g] += l.div_ceil(MAX_STEPS_PER_TB);
    }
    // Lanes with `of_op` per transfer (dense index).
    let attempt = |slack: f64| -> Lanes {
        // `t` may follow `x` on a lane: the plan orders them, or runs `x`
        // to its end before `t` starts (or has done all but `slack` of
        // `t`'s duration by then).
        let free = |x: usize, t: usize| {
            let ((_, xe), (ts, te)) = (time(x), time(t));
            (exact && anc[t][x / 64] >> (x % 64) & 1 == 1)
                || !late[x] && xe <= ts + slack * (te - ts)
        };
        // Lanes each connection wants: the greedy cover in start order,
        // with the planned time each of its lanes is busy.
        // (Busy times only where `share` reads them.)
        let by_busy = share == LaneShare::Busy;
        let mut want: HashMap<(u32, u32), Vec<usize>> = HashMap::new();
        let mut busy: HashMap<(u32, u32), Vec<f64>> = HashMap::new();
        for &t in &remote {
            let lanes = want.entry(conn_of[t]).or_default();
            let k = match lanes.iter().position(|&last| free(last, t)) {
                Some(k) => {
                    lanes[k] = t;
                    k
                }
                None => {
                    lanes.push(t);
                    lanes.len() - 1
                }
            };
            if by_busy {
                let (ts, te) = time(t);
                let busy = busy.entry(conn_of[t]).or_default();
                if k == busy.len() {
                    busy.push(0.0);
                }
                busy[k] += te - ts;
            }
        }
        for b in busy.values_mut() {
            b.sort_unstable_by(|x, y| y.total_cmp(x));
        }
        // The claim of a connection that has `l` lanes on one more.
        let claim = |c: &(u32, u32), l: u32| -> u64 {
            match share {
                LaneShare::Wanted => want[c].len() as u64 * 1000 / u64::from(l),
                // Nanoseconds of the plan's time.
                LaneShare::Busy => busy[c]
                    .get(l as usize)
                    .map_or(0, |&us| (us * 1000.0) as u64),
            }
        };
        // Share the tb budget, one lane at a time, to the connection with
        // the largest claim (by `share`: the most wanted lanes per lane it
        // has, or the longest busy next lane).
        let mut tbs = base.clone();
        let mut per_conn: HashMap<(u32, u32), u32> = HashMap::new();
        let mut heap: BinaryHeap<(u64, Reverse<(u32, u32)>)> = BinaryHeap::new();
        for &(s, d) in want.keys() {
            per_conn.insert((s, d), 1);
            tbs[s as usize] += 1;
            tbs[d as usize] += 1;
            heap.push((claim(&(s, d), 1), Reverse((s, d))));
        }
        while let Some((_, Reverse((s, d)))) = heap.pop() {
            let (w, l) = (want[&(s, d)].len() as u32, per_conn[&(s, d)]);
            if l >= MAX_LANES.min(w) || tbs[s as usize] >= budget || tbs[d as usize] >= budget {
                continue;
            }
            per_conn.insert((s, d), l + 1);
            tbs[s as usize] += 1;
            tbs[d as usize] += 1;
            heap.push((claim(&(s, d), l + 1), Reverse((s, d))));
        }
        let short = want
            .iter()
            .map(|(c, w)| w.len().saturating_sub(per_conn[c] as usize))
            .sum();
        let mut wanted = base.clone();
        for (&(s, d), w) in &want {
            wanted[s as usize] += w.len();
            wanted[d as usize] += w.len();
        }
        let wanted = wanted.into_iter().max().unwrap_or(0);
        // Assign, within the lanes each connection got.
        let mut lane_of = vec![0u32; nt];
        let mut open: HashMap<(u32, u32), Vec<usize>> = HashMap::new();
        for &t in &remote {
            let c = conn_of[t];
            let lanes = open.entry(c).or_default();
            let l = match lanes.iter().position(|&last| free(last, t)) {
                Some(l) => l,
                None if lanes.len() < per_conn[&c] as usize => {
                    lanes.push(t);
                    lanes.len() - 1
                }
                // The lane whose last transfer ends first in the plan.
                None => (0..lanes.len())
                    .min_by(|&a, &b| time(lanes[a]).1.total_cmp(&time(lanes[b]).1))
                    .expect("a connection has a lane"),
            };
            lanes[l] = t;
            lane_of[t] = l as u32;
        }
        Lanes {
            of_op: lane_of,
            per_conn,
            short,
            tbs_wanted: wanted,
        }
    };
    let exact_lanes = attempt(0.0);
    let mut lanes = if exact_lanes.short > 0 {
        // Not every transfer the plan runs at once gets a lane: let those
        // that overlap a little share one, to leave lanes for the rest.
        Lanes {
            short: exact_lanes.short,
            tbs_wanted: exact_lanes.tbs_wanted,
            ..attempt(SHARE_SLACK)
        }
    } else {
        exact_lanes
    };
    lanes.of_op = ops
        .iter()
        .map(|op| lanes.of_op[dense[op.from as usize]])
        .collect();
    // What the budget has left goes to long streams (`super::spread`).
    let mut used = base;
    for (&(s, d), &l) in &lanes.per_conn {
        used[s as usize] += l as usize;
        used[d as usize] += l as usize;
    }
    let conn: Vec<(u32, u32)> = ops.iter().map(|o| (o.src, o.dst)).collect();
    let from: Vec<u32> = ops.iter().map(|o| o.from).collect();
    spread_lanes(
        &mut lanes.of_op,
        &mut lanes.per_conn,
        &conn,
        &from,
        groups,
        used,
        budget,
        max_per_conn,
    );
    lanes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msccl::BufRef;

    /// Gpu 1 has one tb beyond a lane per connection. Four short
    /// transfers the plan starts together from gpu 0 want four lanes; two
    /// long ones from gpu 2 want two. By lanes wanted the spare goes to gpu
    /// 0's connection, which then runs one of its 1 us transfers after
    /// another; by planned busy time to gpu 2's, whose second lane is busy
    /// 10 us against 1 us.
    #[test]
    fn a_spare_lane_goes_where_the_plan_keeps_it_busy_longest() {
        let mut ops: Vec<ChunkOp> = (0..4).map(|t| ChunkOp::test(0, t, 1, t, 1, t)).collect();
        ops.extend((4..6).map(|t| ChunkOp::test(2, t, 1, t, 8, t)));
        let at = |start_us: f64, end_us: f64| TransferTime { start_us, end_us };
        let timeline = [
            at(0.0, 1.0),
            at(0.0, 1.0),
            at(0.0, 1.0),
            at(0.0, 1.0),
            at(0.0, 10.0),
            at(0.0, 10.0),
        ];
        let lanes = |share| assign_lanes(&ops, 3, &timeline, 3, &[0; 6], &[], 32, share);
        let wanted = lanes(LaneShare::Wanted);
        assert_eq!((wanted.per_conn[&(0, 1)], wanted.per_conn[&(2, 1)]), (2, 1));
        let busy = lanes(LaneShare::Busy);
        assert_eq!((busy.per_conn[&(0, 1)], busy.per_conn[&(2, 1)]), (1, 2));
        // The long transfers side by side, the short ones on one lane.
        assert_eq!(busy.of_op, vec![0, 0, 0, 0, 0, 1]);
        // What the plan wants is the same either way.
        assert_eq!(
            (busy.short, busy.tbs_wanted),
            (wanted.short, wanted.tbs_wanted)
        );
        assert_eq!((busy.short, busy.tbs_wanted), (3, 6));
    }

    /// A forward of a cut transfer's tail chunk ends, in the plan, before
    /// the next send of its connection starts; in the file it starts a
    /// flight late. With the cuts' pieces, that next send takes a lane of
    /// its own, and only a descendant of the forward follows it.
    #[test]
    fn a_transfer_reading_a_tail_is_followed_only_by_its_descendants() {
        let ops = vec![
            // Transfer 0, gpu 0 -> 1, cut: a body of 3 chunks, a tail of 1.
            ChunkOp::test(0, 0, 1, 0, 3, 0),
            ChunkOp::test(0, 3, 1, 3, 1, 0),
            // Transfer 1, gpu 1 -> 2: the tail's chunk forwarded.
            ChunkOp::test(1, 3, 2, 0, 1, 1)
                .reading(BufRef::Scratch)
                .after(vec![1], Vec::new()),
            // Transfer 2, gpu 1 -> 2: its own input, planned after 1 ends.
            ChunkOp::test(1, 0, 2, 1, 4, 2),
            // Transfer 3, gpu 1 -> 2: waits for the forward.
            ChunkOp::test(1, 4, 2, 5, 1, 3).after(vec![2], Vec::new()),
        ];
        let at = |start_us: f64, end_us: f64| TransferTime { start_us, end_us };
        let timeline = [at(0.0, 5.0), at(5.0, 6.0), at(7.0, 9.0), at(9.5, 10.0)];
        let parts = [
            Part::Body,
            Part::Tail,
            Part::Whole,
            Part::Whole,
            Part::Whole,
        ];
        let lanes = |parts: &[Part]| {
            assign_lanes(
                &ops,
                3,
                &timeline,
                108,
                &[0; 5],
                parts,
                32,
                LaneShare::Wanted,
            )
        };
        // Without the pieces: the plan's timeline alone, one lane.
        let plain = lanes(&[]);
        assert_eq!(plain.of_op, vec![0, 0, 0, 0, 0]);
        assert_eq!(plain.per_conn[&(1, 2)], 1);
        // With them: transfer 2 on a lane of its own, 3 after the forward.
        let late = lanes(&parts);
        assert_eq!(late.of_op, vec![0, 0, 0, 1, 0]);
        assert_eq!(late.per_conn[&(1, 2)], 2);
    }
}
