//! Long streams spread over lanes: a transfer of more primitive calls than
//! its connection's FIFO window holds is latency-bound in the executor (a
//! sender runs only `fifo_depth` calls ahead of its receiver, so every
//! further `fifo_depth` calls wait a round trip; docs/msccl.md, "The
//! executor's rules"). Its operations are cut into groups of at most the
//! window's calls, and the groups go on lanes (channels) of their own, each
//! one connection with its own window, where the threadblock budget has
//! room after every lane the plan's own concurrency wants. How many
//! groups: one per window's worth of calls, or only as many as the rate
//! the plan gives the transfer needs ([`rate_lanes`]: more lanes than that
//! take more max-min shares of links the plan shares with other
//! transfers); `to_xml` prices both and keeps the faster.

use std::collections::{BinaryHeap, HashMap};

/// What [`stream_groups`] needs of an operation.
#[derive(Clone, Copy, Debug)]
pub(super) struct OpCalls {
    /// The plan transfer the operation comes from.
    pub from: u32,
    /// Primitive calls it takes between gpus (0 for a local copy).
    pub calls: u64,
    /// Its transfer must stay on one connection (a pacing cut relies on
    /// the window of that connection).
    pub pinned: bool,
}

/// The group of each operation within its transfer (operations of one
/// transfer are consecutive). A transfer of `c` calls on a connection whose
/// FIFO holds `window` calls would take `rounds = ceil(c / window)` round
/// trips on one connection; `lanes(transfer, rounds)` says how many groups
/// it wants (`rounds`: one lane per window's worth of calls; fewer: the
/// lanes its planned rate needs, [`rate_lanes`]), and it gets
/// `min(lanes, rounds, cap)` groups of consecutive operations, balanced by
/// calls. One that fits the window, or is pinned, is one group (0).
pub(super) fn stream_groups(
    ops: &[OpCalls],
    window: u64,
    cap: u32,
    lanes: impl Fn(u32, u64) -> u64,
) -> Vec<u32> {
    let mut group = vec![0u32; ops.len()];
    let mut i = 0;
    while i < ops.len() {
        let mut j = i;
        while j < ops.len() && ops[j].from == ops[i].from {
            j += 1;
        }
        let run = &ops[i..j];
        let total: u64 = run.iter().map(|o| o.calls).sum();
        let rounds = total.div_ceil(window.max(1));
        let pinned = run.iter().any(|o| o.pinned);
        let want = if rounds > 1 && run.len() > 1 && !pinned {
            lanes(ops[i].from, rounds)
                .min(rounds)
                .min(u64::from(cap.max(1)))
        } else {
            1
        };
        if want > 1 {
            // Group k takes the operations whose calls start in its share
            // `[k * total / want, (k + 1) * total / want)`.
            let mut before = 0u64;
            for (g, o) in group[i..j].iter_mut().zip(run) {
                *g = (before * want / total) as u32;
                before += o.calls;
            }
        }
        i = j;
    }
    group
}

/// Lanes a stream of `rounds` FIFO windows needs to keep the rate its plan
/// gives it: one connection delivers a window's calls per round trip (the
/// path's `latency_us`, then the window's bytes at the stream's rate), so
/// a transfer the plan runs in `planned_us` needs `rounds * latency_us /
/// planned_us` windows in flight beyond the one that streams. A transfer
/// the plan gives no time (or no latency) to hides nothing: `rounds`.
pub(super) fn rate_lanes(rounds: u64, latency_us: f64, planned_us: f64) -> u64 {
    if !(planned_us > 0.0 && latency_us > 0.0) {
        return rounds;
    }
    let extra = (rounds as f64 * latency_us / planned_us).ceil();
    (extra as u64).saturating_add(1).min(rounds)
}

/// Gives the groups of [`stream_groups`] lanes of their own: each
/// connection's lanes are multiplied by a factor (up to the most groups
/// any of its transfers has), one step at a time to the connection whose
/// transfers want the most more than they have, while both its gpus stay
/// within `budget` threadblocks (`used` counts those already given out) and
/// the connection within `max_per_conn` lanes. Group `k` of a transfer with
/// `n` groups on plan lane `l` of a connection with `p` plan lanes and
/// factor `f` goes on lane `l + (k * f / n) * p` (groups that do not get a
/// lane of their own follow the previous one on its lane). `per_conn`
/// becomes the connection's lanes in all.
#[allow(clippy::too_many_arguments)]
pub(super) fn spread_lanes(
    of_op: &mut [u32],
    per_conn: &mut HashMap<(u32, u32), u32>,
    conn: &[(u32, u32)],
    from: &[u32],
    group: &[u32],
    mut used: Vec<usize>,
    budget: usize,
    max_per_conn: u32,
) {
    // Groups per transfer, and the most of any transfer per connection.
    let mut groups_of: HashMap<u32, u32> = HashMap::new();
    for (&f, &g) in from.iter().zip(group) {
        let e = groups_of.entry(f).or_insert(1);
        *e = (*e).max(g + 1);
    }
    let mut want: HashMap<(u32, u32), u32> = HashMap::new();
    for (o, &c) in conn.iter().enumerate() {
        if c.0 != c.1 {
            let e = want.entry(c).or_insert(1);
            *e = (*e).max(groups_of[&from[o]]);
        }
    }
    let mut factor: HashMap<(u32, u32), u32> = want.keys().map(|&c| (c, 1)).collect();
    let mut heap: BinaryHeap<(u64, std::cmp::Reverse<(u32, u32)>)> = want
        .iter()
        .filter(|(_, &w)| w > 1)
        .map(|(&c, &w)| (u64::from(w) * 1000, std::cmp::Reverse(c)))
        .collect();
    while let Some((_, std::cmp::Reverse(c))) = heap.pop() {
        let (f, p) = (factor[&c], per_conn[&c]);
        let (s, d) = (c.0 as usize, c.1 as usize);
        let extra = p as usize;
        if f >= want[&c]
            || p * (f + 1) > max_per_conn
            || used[s] + extra > budget
            || used[d] + extra > budget
        {
            continue;
        }
        used[s] += extra;
        used[d] += extra;
        factor.insert(c, f + 1);
        heap.push((
            u64::from(want[&c]) * 1000 / u64::from(f + 1),
            std::cmp::Reverse(c),
        ));
    }
    for (o, lane) in of_op.iter_mut().enumerate() {
        let c = conn[o];
        let Some(&f) = factor.get(&c) else { continue };
        if f > 1 {
            let n = groups_of[&from[o]];
            *lane += group[o] * f / n * per_conn[&c];
        }
    }
    for (c, f) in factor {
        if let Some(p) = per_conn.get_mut(&c) {
            *p *= f;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(from: u32, calls: u64) -> OpCalls {
        OpCalls {
            from,
            calls,
            pinned: false,
        }
    }

    #[test]
    fn groups_hold_a_window_each() {
        // Transfer 0: five one-call operations, window 2: three groups.
        // Transfer 1 fits the window; transfer 2 is pinned.
        let mut ops: Vec<OpCalls> = (0..5).map(|_| op(0, 1)).collect();
        ops.extend([op(1, 1), op(1, 1)]);
        ops.extend((0..4).map(|_| OpCalls {
            pinned: true,
            ..op(2, 1)
        }));
        let all = |_, rounds| rounds;
        let g = stream_groups(&ops, 2, 32, all);
        assert_eq!(g, vec![0, 0, 1, 1, 2, 0, 0, 0, 0, 0, 0]);
        // The cap bounds the groups.
        assert_eq!(stream_groups(&ops[..5], 2, 2, all), vec![0, 0, 0, 1, 1]);
        // Not worth it: one group.
        let one = |_, _| 1;
        assert_eq!(stream_groups(&ops[..5], 2, 32, one), vec![0; 5]);
        // Two lanes asked for: two groups balanced by calls.
        let two = |_, _| 2;
        assert_eq!(stream_groups(&ops[..5], 2, 32, two), vec![0, 0, 0, 1, 1]);
        // More than the rounds: one group per round at most.
        let many = |_, _| 99;
        assert_eq!(stream_groups(&ops[..5], 2, 32, many), g[..5].to_vec());
        // One operation of many calls stays whole.
        assert_eq!(stream_groups(&[op(0, 9)], 2, 32, all), vec![0]);
    }

    #[test]
    fn rate_lanes_cover_the_round_trips() {
        // 10 rounds of 4 us in a transfer planned for 20 us: 2 windows of
        // latency to hide, plus the one that streams.
        assert_eq!(rate_lanes(10, 4.0, 20.0), 3);
        // Planned slowly enough that one window keeps up (+1 for the ceil).
        assert_eq!(rate_lanes(10, 1.0, 100.0), 2);
        // Never more than one lane per round.
        assert_eq!(rate_lanes(3, 4.0, 1.0), 3);
        // No planned time: one lane per round.
        assert_eq!(rate_lanes(5, 4.0, 0.0), 5);
    }

    #[test]
    fn lanes_multiply_within_the_budget() {
        // Connection 0 -> 1 has one plan lane and a transfer of 3 groups;
        // 0 -> 2 a transfer of 2 groups. Gpu 0 has room for one more tb.
        let conn = [(0, 1), (0, 1), (0, 1), (0, 2), (0, 2)];
        let from = [7, 7, 7, 8, 8];
        let group = [0, 1, 2, 0, 1];
        let mut of_op = vec![0u32; 5];
        let mut per_conn: HashMap<(u32, u32), u32> = [((0, 1), 1), ((0, 2), 1)].into();
        spread_lanes(
            &mut of_op,
            &mut per_conn,
            &conn,
            &from,
            &group,
            vec![2, 1, 1],
            3,
            32,
        );
        // 0 -> 1 wants the most and gets the one extra lane: groups 0 and
        // 1 on lane 0 (k * 2 / 3 = 0, 0), group 2 on lane 1.
        assert_eq!(of_op, vec![0, 0, 1, 0, 0]);
        assert_eq!(per_conn[&(0, 1)], 2);
        assert_eq!(per_conn[&(0, 2)], 1);
    }
}
