//! Pacing cuts ([`super::Pacing::Cut`]): cuts the awaited sends and the
//! sends that wait into one-chunk heads and tails so the executor holds
//! the waits it would not (docs/msccl.md, "Pacing").

use std::collections::HashMap;

use crate::msccl::ops::{ChunkOp, Part};
use crate::sim::TransferTime;

use super::walks::{ancestors_on, OpGraph, Walks, WALKS_PER_OP};

/// Operations cut for pacing ([`Pacing::Cut`](super::Pacing::Cut)).
pub(super) struct Paced {
    pub(super) ops: Vec<ChunkOp>,
    /// What part of its operation each of `ops` is.
    pub(super) parts: Vec<Part>,
    /// Steps the cuts add.
    pub(super) steps: usize,
    /// Pairs of plan transfers whose wait still does not hold (operations
    /// too short to cut), replacing the count of [`build_tbs`](super::tbs::build_tbs).
    pub(super) unheld: Option<usize>,
    /// Transfers cut here: their operations stay on one connection.
    pub(super) pinned: std::collections::HashSet<u32>,
    /// Operations whose head steps got a wait that holds them until
    /// shortly before their transfer's planned start (`release`).
    pub(super) released: usize,
}

/// What [`cut_for_pacing`] cuts, found by the dependency walks: which
/// transfers get a head or a tail and which waits each holds. It depends on
/// the operations alone, not on the window, the released heads or the
/// uncut gpus, so one walk serves every cut of the same operations (LL128's
/// and Simple's windows; at 64 x 8 a padded chunk whose cut file missed the
/// parse, lowered again uncut: 9-13 s of walks each, docs/benchmarks.md
/// "The cut lowering's walks and trace kept for its uncut retry").
pub(super) struct PacedWaits {
    /// Per operation, the first and last operation of its transfer.
    first: Vec<u32>,
    last: Vec<u32>,
    /// Per transfer (its first operation): whether it needs a head, a tail.
    head: Vec<bool>,
    tail: Vec<bool>,
    /// Per transfer (its first operation), the deps only its receiver can
    /// hold; transfers with none are left out (kept for the uncut retry,
    /// this is held beside the operations: a list per operation was 48
    /// bytes each).
    recv_only: HashMap<u32, Vec<u32>>,
    /// Per transfer, the deps held through a tail on its sending gpu.
    send_only: HashMap<u32, Vec<u32>>,
    /// (awaited transfer, waiting transfer, the cut transfer that holds
    /// the wait, whether by a head).
    pairs: Vec<(u32, u32, usize, bool)>,
}

/// The walks of [`cut_for_pacing`] ([`PacedWaits`]).
pub(super) fn paced_waits(ops: &[ChunkOp]) -> PacedWaits {
    let n = ops.len();
    let remote = |o: &ChunkOp| o.src != o.dst;
    // Transfers: runs of operations with the same `from`.
    let mut first = vec![0u32; n];
    let mut last = vec![0u32; n];
    // A transfer's local copies (gathered runs, `super::gather`) are not
    // part of its remote run.
    let same = |a: &ChunkOp, b: &ChunkOp| a.from == b.from && remote(a) == remote(b);
    for i in 0..n {
        first[i] = if i > 0 && same(&ops[i - 1], &ops[i]) {
            first[i - 1]
        } else {
            i as u32
        };
    }
    for i in (0..n).rev() {
        last[i] = if i + 1 < n && same(&ops[i + 1], &ops[i]) {
            last[i + 1]
        } else {
            i as u32
        };
    }
    // Per transfer (its first operation): head, tail, and which of its
    // deps only its receiver can hold.
    let mut head = vec![false; n];
    let mut tail = vec![false; n];
    let mut recv_only: HashMap<u32, Vec<u32>> = HashMap::new();
    // Deps held through a tail on the sending gpu (sends of that gpu, never
    // data the transfer reads): its head does not wait for them.
    let mut send_only: HashMap<u32, Vec<u32>> = HashMap::new();
    let mut pairs: Vec<(u32, u32, usize, bool)> = Vec::new();
    let mut memo = Walks::new(n);
    // The same cap on memoised walks as `build_tbs` (memory proportional to
    // the plan); a walk past it finds nothing, and that wait is not cut.
    let walk_cap = WALKS_PER_OP * n + (1 << 16);
    let graph = OpGraph::new(ops);
    for (yi, y) in ops.iter().enumerate() {
        if !remote(y) || first[yi] as usize != yi {
            continue;
        }
        for &x in &y.deps {
            let xo = &ops[x as usize];
            if xo.from == y.from {
                continue;
            }
            // Data (or a wait) that arrives on the sending gpu: held.
            if xo.dst == y.src {
                continue;
            }
            // A send of the same gpu, or a transfer into the same receiver:
            // the wait is on that operation itself.
            let mut on_src = Vec::new();
            let mut on_dst = Vec::new();
            if xo.src == y.src {
                on_src.push(x);
            } else if xo.dst == y.dst {
                on_dst.push(x);
            } else {
                ancestors_on(&graph, x, y.src, &mut memo, walk_cap, &mut on_src);
                if on_src.iter().any(|&z| ops[z as usize].dst == y.src) {
                    continue;
                }
                ancestors_on(&graph, x, y.dst, &mut memo, walk_cap, &mut on_dst);
            }
            for &z in &on_src {
                let zi = z as usize;
                if remote(&ops[zi]) && ops[zi].src == y.src && last[zi] == z {
                    let f = first[zi] as usize;
                    tail[f] = true;
                    pairs.push((xo.from, y.from, f, false));
                    let sent = send_only.entry(yi as u32).or_default();
                    if !sent.contains(&x) {
                        sent.push(x);
                    }
                }
            }
            if !on_dst.is_empty() {
                head[yi] = true;
                recv_only.entry(yi as u32).or_default().push(x);
                pairs.push((xo.from, y.from, yi, true));
            }
        }
    }
    PacedWaits {
        first,
        last,
        head,
        tail,
        recv_only,
        send_only,
        pairs,
    }
}

/// Makes the executor hold the waits it would not (docs/msccl.md,
/// "Pacing"). A wait of send `y` (from gpu `g`) on transfer `x` holds when
/// some operation `x` leads to arrives on `g` (a receive or copy there is
/// done when its data is). Otherwise it lands on sends of `g` (done when
/// staged) and on `y`'s receiver (which holds only its receive). Then:
/// - each awaited send of `g` (the last operation of its transfer) ends in
///   `window` one-chunk steps: its last step is staged only once the
///   receiver has taken the call `window` places before it, the body's
///   last call, so its gpu's wait now ends when the body has arrived;
/// - `y` (the first operation of its transfer) starts with `window`
///   one-chunk steps when its receiver has a wait: the body's first call
///   waits until the receiver takes the first of them, which its wait holds.
///
/// The leak is `window` chunks each way. Operations keep their transfer
/// (`from`), so lanes keep them together and a reader streams them as one.
///
/// `release = Some((timeline, lead_us))` (the plan's timeline): a head
/// also waits for the latest earlier send of its gpu that the plan starts
/// at least `lead_us` before the head's transfer, so it leaves shortly
/// before its body's planned start rather than as soon as its data is
/// there, when it takes NIC shares from the bodies the plan runs then.
///
/// `uncut` (per gpu; empty: none) marks gpus whose transfers, sent or
/// received, are not cut ([`uncut_gpus`](super::tbs::uncut_gpus)); their waits that only a cut
/// would hold count as unheld.
///
/// `waits`: [`paced_waits`] of `ops` (the walks, which depend on nothing
/// else).
pub(super) fn cut_for_pacing(
    ops: &[ChunkOp],
    waits: &PacedWaits,
    window: u32,
    release: Option<(&[TransferTime], f64)>,
    uncut: &[bool],
) -> Paced {
    let n = ops.len();
    let remote = |o: &ChunkOp| o.src != o.dst;
    let PacedWaits {
        first,
        last,
        head,
        tail,
        recv_only,
        send_only,
        pairs,
    } = waits;
    debug_assert_eq!(first.len(), n, "waits found for other operations");
    // One-chunk steps to split off each operation's start and end: the
    // first `window` chunks of a transfer with a head, the last `window` of
    // one with a tail (operations of one chunk count as they are).
    let mut lead = vec![0u32; n];
    let mut trail = vec![0u32; n];
    let mut cut_ok = vec![true; n];
    let mut i = 0;
    while i < n {
        let (f, l) = (i, last[i] as usize);
        let total: u64 = ops[f..=l].iter().map(|o| u64::from(o.cnt)).sum();
        let w = u64::from(window);
        // The tail first (it holds the sending gpu's own waits), then the
        // head, each of up to `window` chunks, leaving a body of at least
        // one chunk; a short transfer gets what fits.
        let whole = !uncut.is_empty()
            && remote(&ops[f])
            && (uncut[ops[f].src as usize] || uncut[ops[f].dst as usize]);
        let t = if tail[f] && !whole {
            w.min(total - 1)
        } else {
            0
        };
        let h = if head[f] && !whole {
            w.min(total - 1 - t)
        } else {
            0
        };
        cut_ok[f] = (!tail[f] || t == w) && (!head[f] || h == w);
        let mut left = h as u32;
        for j in f..=l {
            if left == 0 {
                break;
            }
            let k = left.min(ops[j].cnt);
            lead[j] = k;
            left -= k;
        }
        let mut left = t as u32;
        for j in (f..=l).rev() {
            if left == 0 {
                break;
            }
            let k = left.min(ops[j].cnt - lead[j]);
            trail[j] = k;
            left -= k;
        }
        i = l + 1;
    }
    // Cut, and map each old operation to its new ones. A head's steps wait
    // only for the transfer's data (deps its sending gpu holds): the waits
    // on sends of its own gpu (held by their tails) and those only its
    // receiver can hold are the body's, so the head leaves as soon as its
    // data is there and the body does not pay the head's latency after
    // its sending chain's wait (4x8 log-normal: +7.1% -> +5.4%, packed).
    let mut out: Vec<ChunkOp> = Vec::with_capacity(n);
    let mut new_of: Vec<std::ops::Range<u32>> = Vec::with_capacity(n);
    // Steps split off as a tail, per new operation.
    let mut is_tail: Vec<bool> = Vec::with_capacity(n);
    let mut parts: Vec<Part> = Vec::with_capacity(n);
    let mut steps = 0;
    let mut released = 0;
    // Per gpu, the first operations of its remote transfers, in order.
    let mut sends_of: Vec<Vec<usize>> = Vec::new();
    if release.is_some() {
        for (i, o) in ops.iter().enumerate() {
            if first[i] as usize == i && remote(o) {
                let g = o.src as usize;
                if sends_of.len() <= g {
                    sends_of.resize(g + 1, Vec::new());
                }
                sends_of[g].push(i);
            }
        }
    }
    for (i, op) in ops.iter().enumerate() {
        // Deps on a tail step only where they need it (`tail_dep_needed`).
        let map = |d: &[u32]| -> Vec<u32> {
            d.iter()
                .flat_map(|&d| new_of[d as usize].clone())
                .filter(|&p| !is_tail[p as usize] || tail_dep_needed(op, &out[p as usize]))
                .collect()
        };
        let mut deps = map(&op.deps);
        let f = first[i] as usize;
        let (mut held, recv): (Vec<u32>, Vec<u32>) = if lead[i] > 0 {
            let none = Vec::new();
            let r = recv_only.get(&(f as u32)).unwrap_or(&none);
            let sent = send_only.get(&(f as u32)).unwrap_or(&none);
            let held: Vec<u32> = op
                .deps
                .iter()
                .copied()
                .filter(|d| !r.contains(d) && !sent.contains(d))
                .collect();
            let mut held = map(&held);
            // Released heads: also wait for the latest earlier send of this
            // gpu that the plan starts `lead_us` or more before this
            // transfer (a send is done once staged, so about when it
            // starts): the head leaves about `lead_us` before its body's
            // planned start instead of at once.
            if let Some(z) = release.and_then(|(tl, lead_us)| {
                let start = tl.get(op.from as usize)?.start_us - lead_us;
                let mine = &sends_of[op.src as usize];
                let before = mine.partition_point(|&z| z < f);
                mine[..before].iter().rev().copied().find(|&z| {
                    ops[z].from != op.from
                        && tl
                            .get(ops[z].from as usize)
                            .is_some_and(|t| t.start_us <= start)
                })
            }) {
                let p = new_of[z].start;
                if !held.contains(&p) {
                    held.push(p);
                    released += 1;
                }
            }
            (held, map(r))
        } else {
            // No head: nothing reads `held`.
            (Vec::new(), Vec::new())
        };
        let mid = op.cnt - lead[i] - trail[i];
        let mut sizes: Vec<(u32, bool)> = vec![(1, true); lead[i] as usize];
        if mid > 0 {
            sizes.push((mid, false));
        }
        sizes.extend(std::iter::repeat_n((1, false), trail[i] as usize));
        steps += sizes.len() - 1;
        let start = out.len() as u32;
        let mut at = 0;
        let tail_from = sizes.len() - trail[i] as usize;
        let cut = sizes.len() > 1;
        for (k, (c, is_head)) in sizes.into_iter().enumerate() {
            // A piece of a cut operation waits only for the data it reads
            // (`own_data`), not for what writes the other pieces' chunks;
            // an operation left whole (one piece) takes its list.
            let piece = match (cut, is_head) {
                (true, true) => own_data(op, op.src_off + at, c, &held, &out),
                (true, false) => own_data(op, op.src_off + at, c, &deps, &out),
                (false, true) => std::mem::take(&mut held),
                (false, false) => std::mem::take(&mut deps),
            };
            is_tail.push(k >= tail_from);
            parts.push(if !cut {
                Part::Whole
            } else if is_head {
                Part::Head
            } else if k >= tail_from {
                Part::Tail
            } else {
                Part::Body
            });
            out.push(ChunkOp {
                src_off: op.src_off + at,
                dst_off: op.dst_off + at,
                cnt: c,
                deps: piece,
                recv_deps: if is_head { recv.clone() } else { Vec::new() },
                ..op.without_deps()
            });
            at += c;
        }
        new_of.push(start..out.len() as u32);
    }
    let unheld: std::collections::HashSet<(u32, u32)> = pairs
        .iter()
        .filter(|&&(_, _, z, _)| !cut_ok[z])
        .map(|&(a, b, _, _)| (a, b))
        .collect();
    let pinned = (0..n)
        .filter(|&i| lead[i] > 0 || trail[i] > 0)
        .map(|i| ops[i].from)
        .collect();
    Paced {
        ops: out,
        parts,
        steps,
        unheld: Some(unheld.len()),
        pinned,
        released,
    }
}

/// The deps (operations of `out`) of a piece of `op` that reads chunks
/// `off..off + cnt` of its source: all of `deps` but those that write, on
/// `op`'s sending gpu, only chunks `op` reads and the piece does not (the
/// data of `op`'s other pieces). A head then leaves once its own chunks are
/// there, as the plan's transfer starts with the data that is: with every
/// data dep of its transfer, a forward's head left only with the body's
/// data, and the body paid the head's flight after it (4x8 log-normal
/// padded: 3.8 us on the critical path); and a body no longer waits for
/// the tail of the transfer that brought a tail's chunks.
fn own_data(op: &ChunkOp, off: u32, cnt: u32, deps: &[u32], out: &[ChunkOp]) -> Vec<u32> {
    let overlaps = |a: u32, n: u32, b: u32, m: u32| a < b + m && b < a + n;
    deps.iter()
        .copied()
        .filter(|&p| {
            let w = &out[p as usize];
            let other_data = w.dst == op.src
                && w.dst_buf == op.src_buf
                && overlaps(w.dst_off, w.cnt, op.src_off, op.cnt)
                && !overlaps(w.dst_off, w.cnt, off, cnt);
            !other_data
        })
        .collect()
}

/// Whether `op` must wait for the tail step `t` (a one-chunk step an
/// awaited transfer ends in, [`cut_for_pacing`]) rather than for the body
/// before it: on `t`'s sending gpu (the wait the tail is there for: done
/// when staged, so once the body has been taken), or where `op` reads
/// what `t` writes. Anywhere else the body is enough: a tail is staged
/// only once its body has been taken, so it arrives a latency after the
/// body, and a receiver (or a forward of other chunks) waiting for it
/// would start a latency later than the plan does, once per link of a
/// chain of waits (4x8 MoE: the receiving chain into the last GPU paid 5
/// such latencies). The tail's chunks are the leak the cut allows anyway.
fn tail_dep_needed(op: &ChunkOp, t: &ChunkOp) -> bool {
    op.src == t.src
        || op.dst == t.src
        || (op.src == t.dst
            && op.src_buf == t.dst_buf
            && op.src_off < t.dst_off + t.cnt
            && t.dst_off < op.src_off + op.cnt)
}
