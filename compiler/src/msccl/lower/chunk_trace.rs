//! Tracing (step 2 of the lowering): replays a plan's transfers and cuts
//! them into chunk operations ([`ChunkOp`]) in a topological order, with
//! the scratch chunks each rank needs.

use crate::msccl::ops::ChunkOp;
use crate::msccl::trace::{chunk_mid, chunks_of, trace_pieces, Piece};
use crate::msccl::unsupported;
use crate::msccl::ChunkMap;
use crate::msccl::MAX_CNT;
use crate::plan::{Buffer, Plan};
use crate::sim::TransferTime;
use crate::traffic::TrafficMatrix;

use super::walks::FastMap;
use super::{bufref, LowerError};

/// The plan's transfers in the order they are traced, with the origin
/// pieces each carries ([`trace_pieces`]): they depend on the plan and its
/// timeline, not on the chunk, so once `to_xml`'s `lower_from` doubles a
/// chunk it has traced ([`Pieces::keep`]) its later lowerings trace them
/// once (64 x 8 `fast` MoE traces five chunks; the replay was about a
/// fifth of each trace). Not kept before (a file that fits the first chunk
/// it traces holds no more memory than before: 20-30 MB at 64 x 8), and
/// dropped with [`Pieces::clear`] once a file is kept.
#[derive(Default)]
pub(super) struct Pieces {
    held: std::cell::RefCell<Option<Replay>>,
    keep: std::cell::Cell<bool>,
    /// A trace ran since the last [`Pieces::clear`].
    traced: std::cell::Cell<bool>,
}

/// [`trace_pieces`]' transfers and pieces in three arrays (a list per
/// transfer cost 64 x 8 `fast` MoE 60 MB more peak while kept).
struct Replay {
    /// Transfer indices in traced order.
    order: Vec<u32>,
    /// `pieces[off[k]..off[k + 1]]` are the `k`th traced transfer's.
    off: Vec<usize>,
    pieces: Vec<Piece>,
}

impl Replay {
    fn new(traced: Vec<(usize, Vec<Piece>)>) -> Self {
        let mut r = Replay {
            order: Vec::with_capacity(traced.len()),
            off: Vec::with_capacity(traced.len() + 1),
            pieces: Vec::with_capacity(traced.iter().map(|(_, p)| p.len()).sum()),
        };
        r.off.push(0);
        for (i, p) in traced {
            r.order.push(i as u32);
            r.pieces.extend_from_slice(&p);
            r.off.push(r.pieces.len());
        }
        r
    }

    /// (transfer, its pieces) in traced order.
    fn iter(&self) -> impl Iterator<Item = (usize, &[Piece])> {
        self.order
            .iter()
            .zip(self.off.windows(2))
            .map(|(&i, w)| (i as usize, &self.pieces[w[0]..w[1]]))
    }
}

impl Pieces {
    /// Forgets the traced pieces (the next trace replays the plan again),
    /// and keeps none until asked again.
    pub(super) fn clear(&self) {
        self.held.borrow_mut().take();
        self.keep.set(false);
        self.traced.set(false);
    }

    /// Where a trace ran since [`Pieces::clear`] (a chunk missed after
    /// its trace, not one refused before it), the next trace keeps its
    /// replay for those after it.
    pub(super) fn keep(&self) {
        if self.traced.get() {
            self.keep.set(true);
        }
    }

    /// Whether a replay is held.
    #[cfg(test)]
    pub(super) fn holds(&self) -> bool {
        self.held.borrow().is_some()
    }
}

/// Replays the plan and cuts it into chunk operations; returns them (in a
/// topological order) and the scratch chunks each rank needs. The replay
/// is `pieces`' where it holds one (of this plan and timeline), and kept
/// there.
pub(super) fn trace_chunks(
    plan: &Plan,
    traffic: &TrafficMatrix,
    map: &ChunkMap,
    u: u64,
    timeline: &[TransferTime],
    pieces: &Pieces,
) -> std::result::Result<(Vec<ChunkOp>, Vec<u32>), LowerError> {
    let n = traffic.ranks();
    let ts = &plan.transfers;
    let bad = |i: usize, why: String| -> LowerError {
        LowerError::Other(unsupported(format!(
            "transfer {i}: {why} (is the plan verified?)"
        )))
    };
    pieces.traced.set(true);
    let mut held = pieces.held.borrow_mut();
    if held.is_none() && pieces.keep.get() {
        *held = Some(Replay::new(trace_pieces(plan, traffic, timeline)?));
    }
    let fresh;
    let traced = match held.as_ref() {
        Some(r) => r,
        None => {
            fresh = Replay::new(trace_pieces(plan, traffic, timeline)?);
            &fresh
        }
    };
    // Scratch chunk holding chunk `c` of block (s, d), per rank.
    let mut slot: FastMap<(u32, u32, u32, u32), u32> = FastMap::default();
    let mut scratch = vec![0u32; n];
    let mut ops: Vec<ChunkOp> = Vec::new();
    // Operations a transfer stands for (its deps' when it moves no chunk).
    let mut eff: Vec<Vec<u32>> = vec![Vec::new(); ts.len()];
    // Scratch chunks in the order of the plan's scratch bytes, so a range the
    // plan reads in one piece is one run of chunks.
    let mut writes: Vec<(u32, u64, usize, u32, u32, u32)> = Vec::new();
    for (order, (i, pieces)) in traced.iter().enumerate() {
        let t = &ts[i];
        if t.dst_buf != Buffer::Scratch {
            continue;
        }
        let mut at = t.dst_off;
        for &(s, d, a, b) in pieces {
            let len = traffic.get(s as usize, d as usize);
            for c in chunks_of(a, b, u, len) {
                writes.push((
                    t.dst,
                    at + (chunk_mid(c, u, len) - a),
                    order,
                    s,
                    d,
                    c as u32,
                ));
            }
            at += b - a;
        }
    }
    writes.sort_unstable();
    let mut slot_of: FastMap<(usize, u32, u32, u32), u32> = FastMap::default();
    for &(r, _, order, s, d, c) in &writes {
        let x = scratch[r as usize];
        scratch[r as usize] += 1;
        slot_of.insert((order, s, d, c), x);
    }
    for (order, (i, pieces)) in traced.iter().enumerate() {
        let t = &ts[i];
        let mut deps: Vec<u32> = t
            .deps
            .iter()
            .flat_map(|&d| eff[d as usize].iter().copied())
            .collect();
        deps.sort_unstable();
        deps.dedup();
        // Chunk pairs (src index, dst index); chunk c goes with its first byte.
        let mut pairs: Vec<(u32, u32)> = Vec::new();
        for &(s, d, a, b) in pieces {
            for c in chunks_of(a, b, u, traffic.get(s as usize, d as usize)) {
                let c = c as u32;
                let (su, du) = (s as usize, d as usize);
                let src_idx = match t.src_buf {
                    Buffer::Input => map.input_chunk(su, du, c),
                    Buffer::Output => map.output_chunk(su, du, c),
                    Buffer::Scratch => *slot.get(&(t.src, s, d, c)).ok_or_else(|| {
                        bad(
                            i,
                            format!(
                                "chunk {c} of block {s}->{d} is not in scratch of rank {}",
                                t.src
                            ),
                        )
                    })?,
                };
                let dst_idx = match t.dst_buf {
                    Buffer::Output => {
                        if t.dst != d {
                            return Err(bad(
                                i,
                                format!("puts data for rank {d} into output of rank {}", t.dst),
                            ));
                        }
                        map.output_chunk(su, du, c)
                    }
                    Buffer::Scratch => {
                        let x = slot_of[&(order, s, d, c)];
                        slot.insert((t.dst, s, d, c), x);
                        x
                    }
                    Buffer::Input => return Err(bad(i, "writes an input buffer".into())),
                };
                pairs.push((src_idx, dst_idx));
            }
        }
        // Runs of consecutive chunks, at most MAX_CNT each.
        let mut j = 0;
        while j < pairs.len() {
            let mut len = 1;
            while j + len < pairs.len()
                && len < MAX_CNT as usize
                && pairs[j + len] == (pairs[j].0 + len as u32, pairs[j].1 + len as u32)
            {
                len += 1;
            }
            eff[i].push(ops.len() as u32);
            ops.push(ChunkOp {
                src: t.src,
                src_buf: bufref(t.src_buf),
                src_off: pairs[j].0,
                dst: t.dst,
                dst_buf: bufref(t.dst_buf),
                dst_off: pairs[j].1,
                cnt: len as u32,
                deps: deps.clone(),
                recv_deps: Vec::new(),
                from: i as u32,
            });
            j += len;
        }
        if eff[i].is_empty() {
            eff[i] = deps;
        }
    }
    Ok((ops, scratch))
}
