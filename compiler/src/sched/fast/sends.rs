//! The inter-node sends: each stage pair's bytes cut pro rata over its
//! lanes, each slice sent in chunks (rail-aligned into the receiver's
//! scratch, or block by block for direct lanes), chained to the sends
//! before it on the same GPU and into the same receiver, after the
//! balancing moves that feed it.

use super::arith::{mul_div, Divisor};
use super::balance::{Lane, Piece};
use super::blocks::Blocks;
use super::emit::{Emitter, MIN_DEPTH};
use super::sink::Sink;
use super::slots::{add_ops, deps_of, FewIds, NONE, RANGE};
use super::stages::StagePair;
use crate::plan::{Buffer, Path, Transfer};

impl Emitter {
    pub(super) fn emit_inter_node(&mut self, v: &impl Blocks, out: &mut impl Sink) {
        self.prepare_sends();
        self.first_slices();
        let nn = self.nodes;
        self.taken.clear();
        self.taken.resize(nn * nn, 0);
        for i in 0..self.stages.len() {
            let p = self.stages[i];
            let at = p.src_node as usize * nn + p.dst_node as usize;
            let before = self.taken[at];
            self.taken[at] = before + p.bytes;
            self.emit_pair(v, out, p, i, before);
        }
    }

    /// What the sends of every stage pair share: the chunk size, the depth,
    /// the window unit, empty chains and the last pair of each node (then
    /// each GPU's first slice: [`Emitter::first_slices`], or for one
    /// rank's lanes `first_slices_rank`).
    pub(super) fn prepare_sends(&mut self) {
        let nn = self.nodes;
        // The chunk size and the window unit both follow from them.
        let bounds = self.bounds.take().unwrap_or_else(|| self.chunk_bounds());
        self.chunk = self.chunk_size(bounds);
        self.depth = self.depth_for_chunks();
        for s in self.slots.iter_mut().chain(&mut self.rslots) {
            s.clear();
        }
        for s in self.out_bytes.iter_mut().chain(&mut self.in_bytes) {
            s.clear();
        }
        if !self.opts.staged {
            let mut depths = std::mem::take(&mut self.spray_depths);
            depths.clear();
            depths.extend((0..nn).map(|a| self.spray_depth(a)));
            self.spray_depths = depths;
        }
        self.in_from.iter_mut().for_each(Vec::clear);
        self.unit = self.window_unit(bounds);
        self.last_move.clear();
        self.last_move.resize(self.ranks(), NONE);
        self.early_move.clear();
        self.early_out.clear();
        self.early_in.clear();
        if self.opts.staged {
            if self.mesh {
                self.early_move.resize(self.ranks() * self.gpus, NONE);
            } else {
                self.early_out.resize(self.ranks(), NONE);
                self.early_in.resize(self.ranks(), NONE);
            }
        }
        self.last_pairs();
    }

    /// The last pair each node sends and receives, into `last_pair`: their
    /// final chunks taper.
    pub(super) fn last_pairs(&mut self) {
        let nn = self.nodes;
        // From the last pair back, until every node that sends or receives
        // has its last (the last stages are usually full permutations).
        self.last_pair.clear();
        self.last_pair.resize(2 * nn, usize::MAX);
        if self.rotated_rank {
            // Stage numbers (`rotated_rank`): the rotation knows them.
            let r = &self.rotation;
            let of = |x: u32| {
                if x == u32::MAX {
                    usize::MAX
                } else {
                    x as usize
                }
            };
            for a in 0..nn {
                self.last_pair[a] = of(r.last_from(a));
                self.last_pair[nn + a] = of(r.last_into(a));
            }
            return;
        }
        let mut unset = 2 * nn;
        for (i, p) in self.stages.iter().enumerate().rev() {
            for at in [p.src_node as usize, nn + p.dst_node as usize] {
                if self.last_pair[at] == usize::MAX {
                    self.last_pair[at] = i;
                    unset -= 1;
                }
            }
            if unset == 0 {
                break;
            }
        }
    }

    /// The sends of stage pair `p` (`i`: its index in `stages`, or with
    /// `rotated_rank` its stage number: what `first_slice` and `last_pair`
    /// hold), whose node pair has sent `before` bytes in the pairs before
    /// it, on the lanes `out` asks for; [`Emitter::prepare_sends`] first.
    #[inline(always)]
    pub(super) fn emit_pair(
        &mut self,
        v: &impl Blocks,
        out: &mut impl Sink,
        p: StagePair,
        i: usize,
        before: u64,
    ) {
        let nn = self.nodes;
        let (a, b) = (p.src_node as usize, p.dst_node as usize);
        let taper = self.last_pair[a] == i || self.last_pair[nn + b] == i;
        let after = before + p.bytes;
        let total = self.node_bytes[a * nn + b];
        let by = (total, Divisor::new(total));
        let lanes = out.lanes(a, b, self.gpus);
        // The lanes of a pair sit in a row of `lanes` (`Sink::lane_index`).
        let li0 = out.lane_index(nn, self.gpus, a, b, lanes.start);
        for l in lanes.clone() {
            let li = li0 + (l - lanes.start);
            debug_assert_eq!(li, out.lane_index(nn, self.gpus, a, b, l));
            let lane = self.lanes[li];
            let (from, to) = lane_slice_by(before, after, by, lane.len());
            let c = a * self.gpus + l;
            if self.unit > 0 && to > from {
                self.nominal = (to - from) / (to - from).div_ceil(self.chunk);
            }
            let first = self.first_slice[c] == i as u32;
            // Most slices are one send, whole: what `cut_chunks` makes of a
            // balanced lane's slice of at most a chunk that is neither its
            // GPU's first nor tapered (off a mesh), without its buffer.
            let whole = !lane.direct
                && !self.mesh
                && !taper
                && !first
                && to > from
                && to - from <= self.chunk;
            let sends = if whole {
                1
            } else {
                if self.mesh && !lane.direct {
                    // On a mesh, the slice ends on the bytes with the
                    // shortest forward (tail.rs).
                    self.cut_mesh_slice(v, (li, c, b, l), (from, to), taper, first);
                } else {
                    self.cut_chunks(v, (c, b, l, from, to), lane.direct, None, first);
                    if taper && !lane.direct {
                        self.taper_last_chunks();
                    }
                }
                self.chunks.len()
            };
            // `spray`: the slice's sends are chained from this slot on.
            self.slice_start = self.slots[c].len();
            for k in 0..sends {
                let (lo, hi) = if whole { (from, to) } else { self.chunks[k] };
                self.emit_slice(v, out, li, (a, b, l), lo, hi, p.stage);
            }
        }
    }

    /// For every GPU, the index in `stages` of its first lane slice that
    /// carries bytes, into `first_slice` ([`NONE`] if none): the first send
    /// of a GPU is split (`cut_chunks`). A function of the stages and the
    /// lanes alone, so a rank's program finds it for GPUs whose earlier
    /// slices it does not emit.
    pub(super) fn first_slices(&mut self) {
        let (nn, g) = (self.nodes, self.gpus);
        self.first_slice.clear();
        self.first_slice.resize(self.ranks(), NONE);
        self.taken.clear();
        self.taken.resize(nn * nn, 0);
        // GPUs of each node still without a slice; nodes still with one.
        self.sent.clear();
        self.sent.resize(nn, g as u64);
        let mut nodes_left = nn;
        for (i, p) in self.stages.iter().enumerate() {
            if nodes_left == 0 {
                break;
            }
            let (a, b) = (p.src_node as usize, p.dst_node as usize);
            let before = self.taken[a * nn + b];
            let after = before + p.bytes;
            self.taken[a * nn + b] = after;
            if self.sent[a] == 0 {
                continue;
            }
            let total = self.node_bytes[a * nn + b];
            for l in 0..g {
                let c = a * g + l;
                let len = self.lanes[self.lane_index(a, b, l)].len();
                let (from, to) = lane_slice(before, after, total, len);
                if self.first_slice[c] == NONE && to > from {
                    self.first_slice[c] = i as u32;
                    self.sent[a] -= 1;
                    if self.sent[a] == 0 {
                        nodes_left -= 1;
                    }
                }
            }
        }
    }

    /// The waits of a kept send of GPU `c` into GPU `r` (its slot `slot`
    /// of `c`'s chain), of lane `lane` of node `a`'s pair, bytes
    /// `from..to`: for its own bytes and for its gathered bytes.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn send_waits(
        &self,
        c: usize,
        r: usize,
        slot: usize,
        a: usize,
        lane: &Lane,
        from: u64,
        to: u64,
    ) -> (FewIds, FewIds) {
        let depth = self.depth as usize;
        // The slots of a balanced lane hold one or two sends (never a range:
        // lanes are all direct or none are).
        let mut chain = FewIds::default();
        if self.opts.staged {
            if let Some(j) = self.sender_wait(c, depth) {
                chain.add_ops(self.slots[c][j]);
            }
            // The receiving NIC too takes one stage at a time: a sender
            // that runs ahead (its previous pair was light) waits rather
            // than joining another sender at its next receiver (incast).
            if let Some(j) = self.receiver_wait(r, c, depth) {
                chain.add_ops(self.rslots[r][j]);
            }
            return (chain, chain);
        }
        // `spray`: a lane's slice goes in order, each of its sends after
        // the send `spray_depth` before it, the carrier's own bytes and
        // its gathered bytes as two streams (the gathered wait for their
        // moves, which must not hold the own back), so the first sends land
        // and their forwards run while the rest are on the NIC.
        // Only the streams this send has are looked up: the own bytes are
        // the slice's prefix and the gathered its suffix, so a lookup of
        // the other stream would scan the whole slice back for nothing.
        let (mut own_chain, mut gathered_chain) = (chain, chain);
        let d = self.spray_depths[a];
        let back = |k: usize| {
            (self.slice_start..slot)
                .rev()
                .map(|j| self.slots[c][j][k])
                .filter(|&op| op != NONE)
                .nth(d - 1)
        };
        if from < lane.own {
            if let Some(op) = back(0) {
                own_chain.add(op);
            }
        }
        if to > lane.own {
            if let Some(op) = back(1) {
                gathered_chain.add(op);
            }
        }
        (own_chain, gathered_chain)
    }

    /// How many sends before its own a send's balancing moves may start:
    /// as the GPU's previous send starts (`depth + 1`) on a switch; a whole
    /// window earlier (`2 depth + 1`) on a mesh. There a carrier's moves
    /// from one GPU cross the one link between them, hardly faster than the
    /// NIC (MI300X: 64 against 50 GB/s) and shared with that GPU's
    /// intra-node blocks and forwards, so just-in-time moves fell behind
    /// the sends that carry them (4x8 MI300X intra-skew 1.2: the first
    /// moves ran at 20-30 GB/s and a NIC idled for 55 us). Measured on
    /// MI300X 2-8 nodes, 9 patterns, 2 seeds, default and 64 KB pairs,
    /// stages ordered light first: 16 of 108 cases better by more than 1%
    /// and one worse (8x8 log-normal 0.5 at 64 KB: 1.255 -> 1.275); the
    /// bench suite's MI300X intra-skew 1.180 -> 1.117. On a switch (DGX-H100) the longer lead moved cases by 1-2%
    /// either way (suite median 1.047 -> 1.046, 2x8 log-normal 1.0 1.027
    /// -> 1.044), so it is kept to meshes.
    fn move_lead(&self, depth: usize) -> usize {
        if self.mesh {
            depth.saturating_mul(2).saturating_add(1)
        } else {
            depth.saturating_add(1)
        }
    }

    /// The sends of bytes `from..to` of lane `l` of pair (a, b) (index `li`
    /// in `lanes`) in stage `stage`, the balancing moves they need first,
    /// and the forwards after.
    #[allow(clippy::too_many_arguments)]
    fn emit_slice(
        &mut self,
        v: &impl Blocks,
        out: &mut impl Sink,
        li: usize,
        (a, b, l): (usize, usize, usize),
        from: u64,
        to: u64,
        stage: u32,
    ) {
        let g = self.gpus;
        let (c, r) = (a * g + l, b * g + l);
        let lane = self.lanes[li];
        if lane.direct {
            self.emit_direct_slice(v, out, (a, b, l), from, to, stage);
            return;
        }
        let slot = self.slots[c].len();
        let depth = self.depth as usize;
        // The sends' waits, where `out` keeps them (a rank's program names
        // the other sends only as what its own transfers wait on).
        let keep = out.keeps(c, r);
        let (own_chain, gathered_chain) = if keep {
            self.send_waits(c, r, slot, a, &lane, from, to)
        } else {
            (FewIds::default(), FewIds::default())
        };
        let path = || Path::Rdma { nic: self.rail[l] };
        let mut ops = [NONE; 2];
        // A transfer `out` does not keep is written as its key alone (its
        // source and dependencies are not looked up).
        if from < lane.own {
            let end = to.min(lane.own);
            let off = lane.recv_base + from;
            ops[0] = if keep {
                let base = v.send_at(c, b * g);
                out.push(Transfer {
                    src: c as u32,
                    src_buf: Buffer::Input,
                    src_off: base + from,
                    dst: r as u32,
                    dst_buf: Buffer::Scratch,
                    dst_off: off,
                    bytes: end - from,
                    path: path(),
                    step: stage,
                    deps: own_chain.deps(),
                })
            } else {
                out.push_key(r, Buffer::Scratch, off, end - from)
            };
        }
        if to > lane.own {
            let (g0, g1) = (from.max(lane.own) - lane.own, to - lane.own);
            let mut deps = gathered_chain.deps();
            let lead = self.move_lead(depth);
            let mut last_move = self.last_move[c];
            let pieces = if out.moves_for(a, r) {
                &self.pieces[lane.pieces_start as usize..lane.pieces_end as usize]
            } else {
                &[]
            };
            // Each send moves just the part of each piece it carries: a
            // piece can be most of a lane's share, and moved whole it kept
            // the carrier's NIC idle until all of it had arrived (2x8
            // intra-skew: 1.43x -> 1.04x the bound).
            for (piece, p0, lo, hi) in clip_pieces(pieces, g0, g1) {
                let off = lane.gather_base + lo;
                let idx = if out.keeps(piece.src as usize, c) {
                    let base = v.send_at(piece.src as usize, b * g);
                    // A carrier's moves arrive in the order its sends use
                    // them, so the first send's bytes do not share NVLink
                    // with moves needed much later.
                    let mut move_deps = FewIds::default();
                    // Moves for this slot start as the previous slot
                    // starts; on a mesh, a window earlier (see
                    // `move_lead`).
                    if self.opts.staged {
                        if slot >= lead {
                            move_deps.add_ops(self.slots[c][slot - lead]);
                        }
                        move_deps.add(last_move);
                    }
                    out.push(Transfer {
                        src: piece.src,
                        src_buf: Buffer::Input,
                        src_off: base + piece.row_off + (lo - p0),
                        dst: c as u32,
                        dst_buf: Buffer::Scratch,
                        dst_off: off,
                        bytes: hi - lo,
                        path: Path::Nvlink,
                        step: stage,
                        deps: move_deps.deps(),
                    })
                } else {
                    out.push_key(c, Buffer::Scratch, off, hi - lo)
                };
                last_move = idx;
                if slot < lead {
                    if !self.early_move.is_empty() {
                        self.early_move[piece.src as usize * g + l] = idx;
                    } else if !self.early_out.is_empty() {
                        self.early_out[piece.src as usize] = idx;
                        self.early_in[c] = idx;
                    }
                }
                if keep {
                    deps.push(idx);
                }
            }
            self.last_move[c] = last_move;
            let off = lane.recv_base + lane.own + g0;
            ops[1] = if keep {
                out.push(Transfer {
                    src: c as u32,
                    src_buf: Buffer::Scratch,
                    src_off: lane.gather_base + g0,
                    dst: r as u32,
                    dst_buf: Buffer::Scratch,
                    dst_off: off,
                    bytes: g1 - g0,
                    path: path(),
                    step: stage,
                    deps,
                })
            } else {
                out.push_key(r, Buffer::Scratch, off, g1 - g0)
            };
        }
        self.push_send(c, r, ops, out.chains(a, l));
        if !out.forwards_at(b) {
            return;
        }
        if ops[0] != NONE {
            self.emit_forwards(
                v,
                out,
                &lane,
                a,
                b,
                l,
                from,
                to.min(lane.own),
                ops[0],
                stage,
            );
        }
        if ops[1] != NONE {
            self.emit_forwards(
                v,
                out,
                &lane,
                a,
                b,
                l,
                from.max(lane.own),
                to,
                ops[1],
                stage,
            );
        }
    }

    /// `spray`: the sends of a lane's slice into one node in flight at once
    /// (each stream of the slice, the carrier's own bytes and its gathered
    /// bytes, chained with this depth): enough that each GPU keeps
    /// [`MIN_DEPTH`] sends of each stream in flight over the nodes node
    /// `a` sends to, `ceil(MIN_DEPTH / peers)`, as `fast` keeps at least
    /// [`MIN_DEPTH`] in flight per GPU. Chained one deep a 2x8 lane is
    /// one send at a time with its latency un-hidden (2x8 log-normal 50.4
    /// -> 60.2 us); sent all at once (the plan before), every send on a NIC
    /// ends with the NIC phase and the forwards queue after it (8x8
    /// hotspot 1462.6 us, chained one deep 1045.1 us). docs/benchmarks.md,
    /// "`spray` pipelines each relayed block into its forward".
    fn spray_depth(&self, a: usize) -> usize {
        let nn = self.nodes;
        let row = &self.node_bytes[a * nn..(a + 1) * nn];
        let peers = (0..nn).filter(|&b| b != a && row[b] > 0).count().max(1);
        (MIN_DEPTH as usize).div_ceil(peers)
    }

    /// The sends of bytes `from..to` of GPU `l` of node `a`'s row range for
    /// node `b`, sent directly: one transfer per destination block, straight
    /// into the outputs. They form one slot of the sender's chain and one of
    /// the chain of GPU `l` of `b`, as the balanced lane's send would.
    #[allow(clippy::too_many_arguments)]
    #[inline(never)]
    fn emit_direct_slice(
        &mut self,
        v: &impl Blocks,
        out: &mut impl Sink,
        (a, b, l): (usize, usize, usize),
        from: u64,
        to: u64,
        stage: u32,
    ) {
        let g = self.gpus;
        let c = a * g + l;
        let depth = self.depth as usize;
        // The chains are those of the balanced lane (GPU `l` of `b` stands
        // for the receiving node's lane), so stages keep their order; a
        // sink that leaves chains empty has no direct lanes.
        debug_assert_eq!(
            out.chains(a, l),
            (true, true),
            "a direct lane reads its chains"
        );
        let r = b * g + l;
        let mut chain = std::mem::take(&mut self.chain_buf);
        chain.clear();
        if self.opts.staged {
            if let Some(j) = self.sender_wait(c, depth) {
                add_ops(&mut chain, self.slots[c][j]);
            }
            if let Some(j) = self.receiver_wait(r, c, depth) {
                add_ops(&mut chain, self.rslots[r][j]);
            }
        }
        let path = Path::Rdma { nic: self.rail[l] };
        let row = b * g;
        let base = v.send_at(c, row);
        let first = out.len() as u32;
        for j in 0..g {
            let (b0, b1) = (
                v.send_at(c, row + j) - base,
                v.send_at(c, row + j + 1) - base,
            );
            if b1 <= from || b0 == b1 {
                continue;
            }
            if b0 >= to {
                break;
            }
            let (lo, hi) = (from.max(b0), to.min(b1));
            let d = b * g + j;
            out.push(Transfer {
                src: c as u32,
                src_buf: Buffer::Input,
                src_off: base + lo,
                dst: d as u32,
                dst_buf: Buffer::Output,
                dst_off: v.recv_at(c, d) + (lo - b0),
                bytes: hi - lo,
                path,
                step: stage,
                deps: deps_of(&chain),
            });
        }
        self.chain_buf = chain;
        let last = out.len() as u32;
        if last == first {
            return;
        }
        let ops = [first, (last - 1) | RANGE];
        self.push_send(c, r, ops, (true, true));
    }
}

/// Bytes `from..to` of a lane of `len` bytes that a stage pair moving bytes
/// `before..after` of its node pair's `total` sends: its pro-rata share,
/// the lane's end when the pair's end is reached.
pub(super) fn lane_slice(before: u64, after: u64, total: u64, len: u64) -> (u64, u64) {
    slice_by(before, after, total, len, |x| mul_div(x, len, total))
}

/// [`lane_slice`] with `by`, the division by `total` that the lanes of a
/// stage pair share: a multiply per lane, not a hardware division.
#[inline]
pub(super) fn lane_slice_by(
    before: u64,
    after: u64,
    (total, by): (u64, Divisor),
    len: u64,
) -> (u64, u64) {
    slice_by(before, after, total, len, |x| by.mul_div(x, len))
}

#[inline(always)]
fn slice_by(
    before: u64,
    after: u64,
    total: u64,
    len: u64,
    share: impl Fn(u64) -> u64,
) -> (u64, u64) {
    let cut = |x: u64| if x == total { len } else { share(x) };
    (cut(before), cut(after))
}

/// The parts of `pieces`, laid end to end from offset 0 of a lane's stream,
/// that fall in `from..to`: each piece with its start `p0` in the stream and
/// its clipped range `lo..hi`.
pub(super) fn clip_pieces(
    pieces: &[Piece],
    from: u64,
    to: u64,
) -> impl Iterator<Item = (&Piece, u64, u64, u64)> {
    pieces
        .iter()
        .scan(0u64, |at, piece| {
            let p0 = *at;
            *at += piece.len;
            Some((piece, p0))
        })
        .filter(move |(piece, p0)| p0 + piece.len > from)
        .take_while(move |&(_, p0)| p0 < to)
        .map(move |(piece, p0)| (piece, p0, from.max(p0), to.min(p0 + piece.len)))
}
