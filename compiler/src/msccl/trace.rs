//! A plan's bytes followed back to their blocks: each transfer, replayed in
//! the order the lowering lists them, with the origin pieces `(s, d, a, b)`
//! it carries, and which chunks of a block go with a piece. Independent of
//! the chunk size, so the lowering (lower.rs) cuts its chunk operations from
//! it and the chunk scoring (chunk.rs) prices hundreds of chunk sizes from
//! one trace.
//!
//! Owns: [`trace_pieces`], [`chunks_of`], [`chunk_mid`], [`Piece`]. Depends on the plan,
//! the traffic's byte layout and the lowering's timeline; knows nothing of
//! threadblocks or XML.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};

use super::unsupported;
use crate::error::{Error, Result};
use crate::plan::{Buffer, Plan};
use crate::sim::TransferTime;
use crate::traffic::{Layout as ByteLayout, TrafficMatrix};

/// Where a written byte range came from: block `(s, d)`, byte `a` of it.
#[derive(Clone, Copy, Debug)]
struct Seg {
    end: u64,
    s: u32,
    d: u32,
    a: u64,
}

/// Bytes `a..b` of block `(s, d)`.
pub type Piece = (u32, u32, u64, u64);

/// The middle byte of chunk `c` (of a block of `len` bytes, `c*u < len`).
pub fn chunk_mid(c: u64, u: u64, len: u64) -> u64 {
    c * u + ((len - c * u).min(u) - 1) / 2
}

/// The chunks of a block of `len` bytes that go with its bytes `a..b`:
/// those whose middle byte lies there. Every chunk goes with exactly one
/// piece of a block cut into pieces, and a split point moves by at most half
/// a chunk either way (a chunk going with its first byte would move every
/// split point later, by half a chunk on average).
pub fn chunks_of(a: u64, b: u64, u: u64, len: u64) -> std::ops::Range<u64> {
    let k = len.div_ceil(u);
    let mid = |c: u64| chunk_mid(c, u, len);
    // First chunk whose middle is at or after byte x; mid(c) lies in chunk c.
    let first = |x: u64| -> u64 {
        let c = x / u;
        if c >= k {
            k
        } else if mid(c) >= x {
            c
        } else {
            c + 1
        }
    };
    first(a)..first(b)
}

/// Replays the plan's transfers in the order the lowering lists them
/// (dependency order, earliest planned start first) and follows every byte
/// back to its block: each transfer with the origin pieces `(s, d, a, b)`
/// it carries, in source order. Independent of the chunk size.
pub fn trace_pieces(
    plan: &Plan,
    traffic: &TrafficMatrix,
    timeline: &[TransferTime],
) -> Result<Vec<(usize, Vec<Piece>)>> {
    let n = traffic.ranks();
    let layout = ByteLayout::new(traffic);
    let ts = &plan.transfers;
    let bad = |i: usize, why: String| -> Error {
        unsupported(format!("transfer {i}: {why} (is the plan verified?)"))
    };
    // Kahn's order, earliest start in the plan's run first (then step,
    // index): the order tbs list steps in. Start times are not negative, so
    // their bits order as they do.
    let start = |i: usize| timeline.get(i).map_or(0, |t| t.start_us.max(0.0).to_bits());
    let mut indeg: Vec<u32> = ts.iter().map(|t| t.deps.len() as u32).collect();
    let mut succ: Vec<Vec<u32>> = vec![Vec::new(); ts.len()];
    for (i, t) in ts.iter().enumerate() {
        for &d in &t.deps {
            let Some(s) = succ.get_mut(d as usize) else {
                return Err(bad(i, format!("depends on missing transfer {d}")));
            };
            s.push(i as u32);
        }
    }
    let mut heap: BinaryHeap<Reverse<(u64, u32, u32)>> = (0..ts.len())
        .filter(|&i| indeg[i] == 0)
        .map(|i| Reverse((start(i), ts[i].step, i as u32)))
        .collect();
    // Written output/scratch ranges per (rank, buffer).
    let mut written: HashMap<(u32, Buffer), BTreeMap<u64, Seg>> = HashMap::new();
    let mut done = 0;
    // Transfers in order, with the origin pieces `(s, d, a, b)` they carry.
    let mut traced: Vec<(usize, Vec<Piece>)> = Vec::new();
    while let Some(Reverse((_, _, i))) = heap.pop() {
        let i = i as usize;
        done += 1;
        for &w in &succ[i] {
            indeg[w as usize] -= 1;
            if indeg[w as usize] == 0 {
                heap.push(Reverse((start(w as usize), ts[w as usize].step, w)));
            }
        }
        let t = &ts[i];
        // Origin pieces of the bytes read, in source order.
        let mut pieces: Vec<Piece> = Vec::new();
        let (start, end) = (t.src_off, t.src_off + t.bytes);
        match t.src_buf {
            Buffer::Input => {
                let s = t.src as usize;
                for d in 0..n {
                    let (lo, len) = (layout.send_offset(s, d), traffic.get(s, d));
                    let (a, b) = (start.max(lo), end.min(lo + len));
                    if a < b {
                        pieces.push((s as u32, d as u32, a - lo, b - lo));
                    }
                }
            }
            buf => {
                let m = written.get(&(t.src, buf));
                let mut at = start;
                if let Some(m) = m {
                    let first = m.range(..=start).next_back().map_or(start, |(&k, _)| k);
                    for (&k, seg) in m.range(first..end) {
                        if seg.end <= at {
                            continue;
                        }
                        if k > at {
                            break;
                        }
                        let e = seg.end.min(end);
                        pieces.push((seg.s, seg.d, seg.a + (at - k), seg.a + (e - k)));
                        at = e;
                    }
                }
                if at < end && t.bytes > 0 {
                    return Err(bad(
                        i,
                        format!(
                            "reads bytes {at}..{end} of {} of rank {} before they are written",
                            buf.name(),
                            t.src
                        ),
                    ));
                }
            }
        }
        // Record what the destination now holds.
        if t.dst_buf != Buffer::Input && t.bytes > 0 {
            let m = written.entry((t.dst, t.dst_buf)).or_default();
            let mut at = t.dst_off;
            for &(s, d, a, b) in &pieces {
                m.insert(
                    at,
                    Seg {
                        end: at + (b - a),
                        s,
                        d,
                        a,
                    },
                );
                at += b - a;
            }
        }
        traced.push((i, pieces));
    }
    if done < ts.len() {
        return Err(unsupported("the plan's dependencies have a cycle".into()));
    }
    Ok(traced)
}
