//! Sends gathered into one run: a transfer that reads its sender's input
//! buffer from several blocks is several operations, one primitive call
//! each, and the executor runs only `fifo_depth` calls of a connection
//! ahead of its receiver (docs/msccl.md, "The executor's rules"): every
//! further call waits a round trip, so a transfer of many short runs is
//! latency-bound where the plan streams it at its share of the link.
//! `fast`'s inter-node sends carry a piece of each block their GPU has for
//! the receiving node (up to one run per destination GPU); at 4x8 some
//! took 12 calls. Here the runs of such a transfer are first copied, on
//! the sending gpu, into consecutive scratch chunks, and the transfer
//! sends them as one run (at most [`MAX_CNT`] chunks per operation).

use super::ops::ChunkOp;
use super::{BufRef, MAX_CNT};

/// Operations with every remote transfer that reads the input buffer in
/// more than one run, and writes consecutive chunks on its receiver, sent
/// from consecutive scratch chunks of its sender filled by local copies.
/// `scratch` (chunks per rank) grows by the chunks gathered. Returns the
/// operations, still in a topological order, the copies first.
///
/// The copies wait for nothing: an input buffer is never written. The
/// send waits for its copies and for what the transfer waited for. Every
/// operation that waited for a run of the transfer waits for its copies and
/// its sends. The copies come before every other operation, so a gpu's
/// local tb runs them at the start: placed just before their send, they
/// sat behind the copies of received data to the output buffer, which
/// wait for their data, and held the send back until that data had
/// arrived (4x8 log-normal padded: a forward's head left 3.3 us late).
pub(super) fn gather_sources(ops: Vec<ChunkOp>, scratch: &mut [u32]) -> Vec<ChunkOp> {
    let n = ops.len();
    let mut out: Vec<ChunkOp> = Vec::with_capacity(n);
    let mut is_copy: Vec<bool> = Vec::with_capacity(n);
    let mut new_of: Vec<std::ops::Range<u32>> = Vec::with_capacity(n);
    let mut i = 0;
    while i < n {
        // A transfer: consecutive operations of one `from`.
        let mut l = i + 1;
        while l < n && ops[l].from == ops[i].from {
            l += 1;
        }
        let mut j = i;
        while j < l {
            // A segment: consecutive chunks on the receiving side.
            let mut e = j + 1;
            while e < l
                && ops[e].dst_buf == ops[j].dst_buf
                && ops[e].dst_off == ops[e - 1].dst_off + ops[e - 1].cnt
            {
                e += 1;
            }
            let seg = &ops[j..e];
            // The runs of a gathered segment share their new operations.
            let map = |d: &[u32], new_of: &[std::ops::Range<u32>]| -> Vec<u32> {
                let mut v: Vec<u32> = d.iter().flat_map(|&d| new_of[d as usize].clone()).collect();
                v.sort_unstable();
                v.dedup();
                v
            };
            let gather = seg.len() > 1
                && seg[0].src != seg[0].dst
                && seg.iter().all(|o| o.src_buf == BufRef::Input)
                && seg
                    .windows(2)
                    .any(|w| w[1].src_off != w[0].src_off + w[0].cnt);
            let start = out.len() as u32;
            if gather {
                let g = seg[0].src as usize;
                let base = scratch[g];
                let total: u32 = seg.iter().map(|o| o.cnt).sum();
                scratch[g] += total;
                let mut at = 0;
                let mut copy_ids = Vec::with_capacity(seg.len());
                for o in seg {
                    copy_ids.push(out.len() as u32);
                    is_copy.push(true);
                    out.push(ChunkOp {
                        dst: o.src,
                        dst_buf: BufRef::Scratch,
                        dst_off: base + at,
                        ..o.without_deps()
                    });
                    at += o.cnt;
                }
                let mut deps = map(&seg[0].deps, &new_of);
                deps.extend(copy_ids);
                let mut at = 0;
                while at < total {
                    let c = (total - at).min(MAX_CNT);
                    is_copy.push(false);
                    out.push(ChunkOp {
                        src_buf: BufRef::Scratch,
                        src_off: base + at,
                        dst_off: seg[0].dst_off + at,
                        cnt: c,
                        deps: deps.clone(),
                        ..seg[0].without_deps()
                    });
                    at += c;
                }
                let range = start..out.len() as u32;
                new_of.extend(std::iter::repeat_n(range, seg.len()));
            } else {
                for o in seg {
                    let s = out.len() as u32;
                    is_copy.push(false);
                    out.push(ChunkOp {
                        deps: map(&o.deps, &new_of),
                        recv_deps: map(&o.recv_deps, &new_of),
                        ..o.without_deps()
                    });
                    new_of.push(s..s + 1);
                }
            }
            j = e;
        }
        i = l;
    }
    copies_first(out, &is_copy)
}

/// `ops` (in a topological order) with those marked in `first`, which wait
/// for nothing, moved to the front, each group in its order; deps renumbered.
fn copies_first(ops: Vec<ChunkOp>, first: &[bool]) -> Vec<ChunkOp> {
    let copies = first.iter().filter(|&&f| f).count();
    let mut new_id = vec![0u32; ops.len()];
    let (mut c, mut r) = (0u32, copies as u32);
    for (i, &f) in first.iter().enumerate().take(ops.len()) {
        let k = if f { &mut c } else { &mut r };
        new_id[i] = *k;
        *k += 1;
    }
    // Renumbered in place, each list sorted again; the operations moved,
    // not rebuilt (the same operations in the same order). The new ids
    // keep the order within the copies and within the others, so a sorted
    // list is sorted again by moving its copies to the front (a stable
    // partition, no sort): the lists `gather_sources` makes are sorted
    // but for the copies a gathered send waits for, which come last.
    let mut hi: Vec<u32> = Vec::new();
    let mut renumber = |d: &mut Vec<u32>| {
        for x in d.iter_mut() {
            *x = new_id[*x as usize];
        }
        if d.is_sorted() {
            return;
        }
        hi.clear();
        let mut k = 0;
        for j in 0..d.len() {
            let x = d[j];
            if (x as usize) < copies {
                d[k] = x;
                k += 1;
            } else {
                hi.push(x);
            }
        }
        d.truncate(k);
        d.extend_from_slice(&hi);
        if !d.is_sorted() {
            d.sort_unstable();
        }
    };
    // (In place: as many operations held as before, not a third list.)
    let mut ops: Vec<Option<ChunkOp>> = ops.into_iter().map(Some).collect();
    let mut out: Vec<ChunkOp> = Vec::with_capacity(ops.len());
    for copy in [true, false] {
        for (i, slot) in ops.iter_mut().enumerate() {
            if first[i] != copy {
                continue;
            }
            let mut o = slot.take().expect("each operation once");
            debug_assert!(!copy || o.deps.is_empty());
            renumber(&mut o.deps);
            renumber(&mut o.recv_deps);
            out.push(o);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(src_off: u32, dst_off: u32, cnt: u32, deps: Vec<u32>, from: u32) -> ChunkOp {
        ChunkOp::test(0, src_off, 1, dst_off, cnt, from).after(deps, Vec::new())
    }

    #[test]
    fn input_runs_go_out_as_one_send_from_scratch() {
        // Transfer 0: one run. Transfer 1: three input runs (blocks 10, 40,
        // 70 of rank 0) into consecutive chunks 5.. of rank 1's scratch,
        // after transfer 0. Transfer 2 waits for transfer 1.
        let ops = vec![
            op(0, 0, 5, vec![], 0),
            op(10, 5, 2, vec![0], 1),
            op(40, 7, 3, vec![0], 1),
            op(70, 10, 1, vec![0], 1),
            op(80, 11, 1, vec![1, 2, 3], 2),
        ];
        let mut scratch = vec![4, 11];
        let out = gather_sources(ops, &mut scratch);
        // Rank 0 gained 6 scratch chunks (4..10).
        assert_eq!(scratch, vec![10, 11]);
        assert_eq!(out.len(), 1 + 3 + 1 + 1);
        // The copies first: rank 0's input runs to its scratch 4.., waiting
        // for nothing.
        for (k, (src_off, dst_off, cnt)) in [(10, 4, 2), (40, 6, 3), (70, 9, 1)].iter().enumerate()
        {
            let c = &out[k];
            assert_eq!(
                (c.src, c.dst, c.src_buf, c.dst_buf),
                (0, 0, BufRef::Input, BufRef::Scratch)
            );
            assert_eq!((c.src_off, c.dst_off, c.cnt), (*src_off, *dst_off, *cnt));
            assert!(c.deps.is_empty());
            assert_eq!(c.from, 1);
        }
        // Transfer 0, then one send of the 6 chunks after it and the copies.
        assert_eq!((out[3].src_off, out[3].cnt, out[3].from), (0, 5, 0));
        let s = &out[4];
        assert_eq!(
            (s.src, s.dst, s.src_buf, s.dst_buf),
            (0, 1, BufRef::Scratch, BufRef::Scratch)
        );
        assert_eq!((s.src_off, s.dst_off, s.cnt), (4, 5, 6));
        assert_eq!(s.deps, vec![0, 1, 2, 3]);
        // Transfer 2 is one run already; it waits for all of transfer 1.
        assert_eq!(out[5].src_off, 80);
        assert_eq!(out[5].deps, vec![0, 1, 2, 4]);
    }

    #[test]
    fn runs_that_are_not_consecutive_on_the_receiver_stay() {
        // Two input runs into scattered output chunks, and a scratch run:
        // nothing to gather.
        let mut a = op(0, 0, 2, vec![], 0);
        a.dst_buf = BufRef::Output;
        let mut b = op(10, 9, 2, vec![], 0);
        b.dst_buf = BufRef::Output;
        let mut c = op(3, 20, 2, vec![], 1);
        c.src_buf = BufRef::Scratch;
        let mut d = op(9, 22, 2, vec![], 1);
        d.src_buf = BufRef::Scratch;
        let mut scratch = vec![0, 0];
        let out = gather_sources(vec![a, b, c, d], &mut scratch);
        assert_eq!(out.len(), 4);
        assert_eq!(scratch, vec![0, 0]);
        assert_eq!(out[1].src_off, 10);
    }

    #[test]
    fn copies_first_renumbers_every_list_as_a_sort_would() {
        // The copies (ops 1, 4, 5) go first. Op 6's list is sorted but
        // for its copies last (a gathered send), op 7's is not sorted at
        // all, op 3's is sorted and stays so.
        let mut ops: Vec<ChunkOp> = (0..8).map(|i| op(i, i, 1, vec![], i)).collect();
        ops[2].deps = vec![0];
        ops[3].deps = vec![0, 2];
        ops[6].deps = vec![0, 3, 1, 4, 5];
        ops[6].recv_deps = vec![2, 5];
        ops[7].deps = vec![6, 1, 2, 0, 4];
        let first = [false, true, false, false, true, true, false, false];
        // What it did before: every list renumbered and sorted.
        let mut new_id = [0u32; 8];
        let order: Vec<usize> = (0..8)
            .filter(|&i| first[i])
            .chain((0..8).filter(|&i| !first[i]))
            .collect();
        for (k, &i) in order.iter().enumerate() {
            new_id[i] = k as u32;
        }
        let sorted = |d: &[u32]| {
            let mut v: Vec<u32> = d.iter().map(|&x| new_id[x as usize]).collect();
            v.sort_unstable();
            v
        };
        let want: Vec<(u32, Vec<u32>, Vec<u32>)> = order
            .iter()
            .map(|&i| (ops[i].from, sorted(&ops[i].deps), sorted(&ops[i].recv_deps)))
            .collect();
        let got: Vec<(u32, Vec<u32>, Vec<u32>)> = copies_first(ops, &first)
            .into_iter()
            .map(|o| (o.from, o.deps, o.recv_deps))
            .collect();
        assert_eq!(got, want);
        assert_eq!(got[7].1, vec![0, 1, 3, 4, 6]);
    }
}
