//! `fast` and `spray` for one rank, from that rank's
//! [`LocalTraffic`](crate::rank::LocalTraffic) only. The merged plan (one
//! stage of direct sends, chosen when the exchange is latency-bound or
//! every node sends through one NIC to few peers) is `direct` with
//! `fast`'s rails. The staged plan (and `spray`) runs the whole plan's
//! steps (balancing, stages, the emitter) over a view of the rank's blocks
//! ([`super::blocks::RankBlocks`]), emitting into a
//! [`RankSink`](super::rank_state::RankSink) (rank_state.rs): only the
//! lanes whose transfers or chains the rank's program names, and of its
//! rail only the stage pairs whose sends its chains reach
//! ([`Emitter::rank_pairs`]; on the chunked rotation, given the stage
//! inputs, read piece by piece without writing the stage pairs,
//! [`Emitter::rank_pairs_rotated`], and lane `rail` of the other pairs
//! read from the lane sums, [`Emitter::place_rail_lanes`]).

use super::balance::Lane;
use super::blocks::Blocks;
use super::emit::Emitter;
use super::rank_state::{rank_lane_index, ChainLane, RankPair, RankPairs, RankSink};
use super::sends::lane_slice;
use super::sink::Sink;
use super::slots::NONE;
use crate::error::{Error, InputError, Result};
use crate::plan::{Buffer, Path};
use crate::rank::{direct_local, gathers_more, LaneSums, LocalProgram, LocalTraffic, StageInputs};
use crate::sched::fast::stages::StagePair;

impl Emitter {
    /// True when the busiest NIC, loaded with what each GPU (`(out, in)`
    /// bytes to and from other nodes, in rank order) sends and receives,
    /// needs less than one inter-node latency (see `is_latency_bound`).
    pub(super) fn busiest_within_latency(&self, per_gpu: impl Iterator<Item = (u64, u64)>) -> bool {
        let g = self.gpus;
        let (mut busiest_out, mut busiest_in) = (0u64, 0u64);
        for (s, (out, inn)) in per_gpu.enumerate() {
            let share = self.weights.sharing[s % g];
            busiest_out = busiest_out.max(out * share);
            busiest_in = busiest_in.max(inn * share);
        }
        // GPUs sharing a rail are taken as equally loaded (an estimate).
        busiest_out.max(busiest_in) as f64 / self.nic_rate <= self.inter_latency
    }

    /// Rank `t.rank`'s program of the plan [`Emitter::plan_into`] makes for
    /// the traffic `t` is part of, made by the same steps as the whole plan
    /// but emitting only what the rank needs
    /// ([`RankSink`](super::rank_state::RankSink)). Errors
    /// ([`Error::NeedsWholeMatrix`]) where it cannot: a staged or `spray`
    /// plan when `t` has no [`crate::rank::NodeSplits`], on a mesh (the relief pass moves
    /// transfers of the whole plan), and when every node pair is sent
    /// directly (a direct lane's receives wait on the chains of every
    /// rail); and ([`Error::Input`]) when `t` does not fit the topology
    /// (checked by the caller).
    pub(crate) fn program_local_into(
        &mut self,
        t: &LocalTraffic,
        out: &mut LocalProgram,
    ) -> Result<()> {
        let name = if self.opts.staged { "fast" } else { "spray" };
        let refuse = |reason: &str| {
            Err(Error::NeedsWholeMatrix {
                algorithm: name.into(),
                reason: reason.into(),
            })
        };
        let g = self.gpus;
        if self.merged_for(t) {
            let path = |s: usize, d: usize| {
                if s == d {
                    Path::Local
                } else if s / g == d / g {
                    Path::Nvlink
                } else {
                    Path::Rdma {
                        nic: self.rail[s % g],
                    }
                }
            };
            direct_local(t, name, path, out);
            return Ok(());
        }
        // Lane sums with stage inputs, else `node_splits` (the reference).
        let given = t.stage_inputs.as_ref().filter(|_| t.lane_sums.is_some());
        let splits = t.node_splits.as_ref();
        let inter_blocks =
            match (given, splits) {
                (Some(given), _) => given.inter_blocks,
                (None, Some(splits)) => splits.inter_blocks,
                (None, None) => return refuse(
                    "the rank's traffic has neither `node_splits` (what every rank sends every \
                     node) nor lane sums with stage inputs, which its staged plan balances by",
                ),
            };
        if self.mesh {
            return refuse("its mesh relief pass reroutes transfers of the whole plan");
        }
        self.inter_blocks = inter_blocks;
        let (node, rail) = (t.rank / g, t.rank % g);
        let mut bufs = std::mem::take(&mut self.rank_bufs);
        let v = bufs.view(t, if given.is_some() { None } else { splits });
        // From the stage inputs, the chunked rotation is read piece by
        // piece, not written (`rotated_rank`), and lane `rail` of the
        // other pairs from the lane sums (`lazy`: the rank's chains read a
        // few of them).
        self.decompose_rank(&t.node_bytes, given.is_some());
        let sums = t.lane_sums.as_ref();
        let lazy = self.rotated_rank;
        // Read whole where the lanes are not placed lazily; lazily, each
        // lane where it is read (`place_rail_lanes`).
        if let (false, Some(s)) = (lazy, sums) {
            if let Err(e) = s.check_gathered(self.nodes) {
                self.rank_bufs = bufs;
                return Err(e);
            }
        }
        let Some(scratch) = self.balance_rank(&v, node, rail, sums, given, lazy) else {
            self.rank_bufs = bufs;
            return refuse(
                "every node pair is sent directly, and a direct lane's receives wait on \
                 the chains of every rail",
            );
        };
        let mut sink = std::mem::take(&mut self.rank_sink);
        sink.reset(t.rank, g);
        self.prepare_sends();
        if self.rotated_rank && self.window_back() > MAX_WINDOW {
            // Every slice of the rail: the pairs are all read anyway.
            self.rotation
                .write_pairs(&self.node_bytes, &mut self.stages);
            self.rotated_rank = false;
            self.last_pairs();
        }
        // Lane `rail` of the other pairs: their lengths in the sums.
        let rail_len = match sums {
            Some(s) if self.rail_lanes.from_sums => &s.rail_len[..],
            _ => &[],
        };
        if self.rotated_rank {
            self.rank_pairs_rotated(node, rail, &mut sink.pairs, rail_len);
        } else {
            self.rank_pairs(node, rail, &mut sink.pairs, rail_len);
        }
        match given {
            Some(given) => {
                let checked = if self.rotated_rank {
                    self.given_first_slices_rotated(given, node, &sink.pairs.pieces)
                } else {
                    self.given_first_slices(given, node, &sink.pairs.own)
                };
                if let Err(e) = checked {
                    self.rank_sink = sink;
                    self.rank_bufs = bufs;
                    return Err(e);
                }
            }
            None => self.first_slices_rank(&v, node, rail),
        }
        if let (true, Some(sums)) = (self.rail_lanes.from_sums, sums) {
            // Every chain pair: none of their lanes is direct.
            let chain = self.chain_shape(node);
            let placed = self.place_rail_lanes(sums, node, &sink.pairs.pairs, |x| chain(&x.pair));
            if let Err(e) = placed {
                self.rank_sink = sink;
                self.rank_bufs = bufs;
                return Err(e);
            }
        }
        // Emptied before the transfers are emitted: the last program's
        // dependency lists are freed before the new ones are allocated.
        out.reset(name, t.rank, t.ranks(), g);
        sink.write_into(out);
        for k in 0..sink.pairs.pairs.len() {
            let RankPair { pair, key, before } = sink.pairs.pairs[k];
            if self.is_chain_pair(node, rail, &pair) {
                let x = (k, pair, key as usize, before);
                self.emit_chain_pair(&v, &mut sink, rail, x);
            } else {
                self.emit_pair(&v, &mut sink, pair, key as usize, before);
            }
        }
        self.emit_intra_node(&v, &mut sink);
        out.scratch_bytes = scratch;
        sink.finish(out);
        self.rank_sink = sink;
        self.rank_bufs = bufs;
        Ok(())
    }
}

impl Emitter {
    /// Lane `rail` of pair `(a, b)`, both away from rank `(node, rail)`'s
    /// node, kept in `lanes` ([`rank_lane_index`]; not where they are read
    /// from the lane sums: [`Emitter::chain_lane`]).
    #[inline]
    pub(super) fn rail_lane(&self, node: usize, rail: usize, a: usize, b: usize) -> Lane {
        debug_assert!(
            !self.rail_lanes.from_sums,
            "lane {rail} of ({a}, {b}) is not kept"
        );
        self.lanes[rank_lane_index(self.nodes, self.gpus, node, rail, a, b, rail)]
    }

    /// What chain pair `k` of the rank's pairs (`p`, emitted for rank
    /// `(node, rail)`) reads of its lane: placed from the lane sums
    /// ([`Emitter::place_rail_lanes`]) or kept ([`Emitter::rail_lane`]).
    #[inline]
    fn chain_lane(&self, k: usize, node: usize, rail: usize, p: &StagePair) -> ChainLane {
        if self.rail_lanes.from_sums {
            return self.rail_lanes.chain[k];
        }
        let (a, b) = (p.src_node as usize, p.dst_node as usize);
        let lane = self.rail_lane(node, rail, a, b);
        ChainLane {
            own: lane.own,
            len: lane.len(),
            recv_base: lane.recv_base,
            total: self.node_bytes[a * self.nodes + b],
        }
    }

    /// The pairs between two nodes other than `node` of a staged plan on a
    /// switch: [`Emitter::is_chain_pair`]'s test but for the lane, which
    /// where the lanes are read from the lane sums never is direct (so
    /// there every such pair is a chain pair).
    fn chain_shape(&self, node: usize) -> impl Fn(&StagePair) -> bool {
        let staged = self.opts.staged && !self.mesh;
        move |p: &StagePair| staged && p.src_node as usize != node && p.dst_node as usize != node
    }

    /// Lane `rail` of the pairs of `pairs` that `placed` says (pairs away
    /// from rank `(node, rail)`'s node, not the same node twice) from the
    /// lane sums, into `rail_lanes.chain` by index (`balance_rank` with
    /// `lazy` first): its length and what it gathers read in place, its
    /// landing base after what the lanes `rail` of the nodes before its
    /// sender into its receiver carry. One pass down the rows of
    /// `sums.rail_len` to the last sender, the pairs put by sender first (a
    /// counting sort): nothing of `N²` is written. The rank's program
    /// places its chain pairs ([`Emitter::chain_shape`]). Errors
    /// ([`Error::Input`]) where a lane it reads gathers more than it sends
    /// (the sums are not checked whole: [`LaneSums::check_gathered`]).
    pub(super) fn place_rail_lanes(
        &mut self,
        sums: &LaneSums,
        node: usize,
        pairs: &[RankPair],
        placed: impl Fn(&RankPair) -> bool,
    ) -> Result<()> {
        let nn = self.nodes;
        debug_assert!(self.rail_lanes.from_sums);
        let mut r = std::mem::take(&mut self.rail_lanes);
        r.chain.clear();
        r.chain.resize(pairs.len(), ChainLane::default());
        r.rows.clear();
        r.rows.resize(nn + 2, 0);
        for x in pairs.iter().filter(|x| placed(x)) {
            r.rows[x.pair.src_node as usize + 2] += 1;
        }
        for a in 2..nn + 2 {
            r.rows[a] += r.rows[a - 1];
        }
        let found = r.rows[nn + 1] as usize;
        r.order.clear();
        r.order.resize(found, (0, 0));
        for (k, x) in pairs.iter().enumerate().filter(|(_, x)| placed(x)) {
            let at = &mut r.rows[x.pair.src_node as usize + 1];
            r.order[*at as usize] = (x.pair.dst_node, k as u32);
            *at += 1;
        }
        // `rows[a]..rows[a + 1]`: node `a`'s pairs. The running sums wrap
        // where a row is added whole and its two left-out entries taken
        // back: what is left is exact.
        let Some(last) = (0..nn).rev().find(|&a| r.rows[a + 1] > r.rows[a]) else {
            self.rail_lanes = r;
            return Ok(());
        };
        r.land.clear();
        r.land.resize(nn, 0);
        for a in 0..=last {
            let at = a * nn..(a + 1) * nn;
            let (lens, gathered) = (&sums.rail_len[at.clone()], &sums.rail_gathered[at.clone()]);
            let totals = &self.node_bytes[at];
            for &(b, k) in &r.order[r.rows[a] as usize..r.rows[a + 1] as usize] {
                let (b, len) = (b as usize, lens[b as usize]);
                let Some(own) = len.checked_sub(gathered[b]) else {
                    self.rail_lanes = r;
                    return Err(gathers_more(a, b));
                };
                r.chain[k as usize] = ChainLane {
                    own,
                    len,
                    recv_base: r.gather[b] + r.land[b],
                    total: totals[b],
                };
            }
            // Lanes from `node` are its kept ones.
            if a == node {
                for (x, &len) in r.land.iter_mut().zip(&r.node_len) {
                    *x += len;
                }
            } else {
                for (x, &len) in r.land.iter_mut().zip(lens) {
                    *x = x.wrapping_add(len);
                }
                r.land[a] = r.land[a].wrapping_sub(lens[a]);
                r.land[node] = r.land[node].wrapping_sub(lens[node]);
            }
        }
        self.rail_lanes = r;
        Ok(())
    }

    /// The length of lane `l` of pair `(s, d)` in rank `(a, j)`'s lanes:
    /// any lane of its node's pairs, lane `j` of the others
    /// ([`Emitter::rail_lane`]'s, read alone; where they are read from the
    /// lane sums, `rail_len`, the sums' lengths of lane `j`, else empty).
    #[inline]
    fn rank_lane_len(
        &self,
        a: usize,
        j: usize,
        (s, d, l): (usize, usize, usize),
        rail_len: &[u64],
    ) -> u64 {
        let nn = self.nodes;
        if s != a && d != a && self.rail_lanes.from_sums {
            return rail_len[s * nn + d];
        }
        self.lanes[rank_lane_index(nn, self.gpus, a, j, s, d, l)].len()
    }

    /// Whether stage pair `p`, emitted for rank `(node, rail)`, is one of
    /// [`Emitter::rank_pairs`]' chain pairs that
    /// [`Emitter::emit_chain_pair`] emits: between two other nodes, its
    /// rail's lane balanced (not direct), staged (`spray` takes no such
    /// pair) and on a switch (a mesh is refused before).
    fn is_chain_pair(&self, node: usize, rail: usize, p: &StagePair) -> bool {
        let (a, b) = (p.src_node as usize, p.dst_node as usize);
        self.chain_shape(node)(p)
            && (self.rail_lanes.from_sums || !self.rail_lane(node, rail, a, b).direct)
    }

    /// [`Emitter::emit_pair`] into `sink` for a chain pair `p`
    /// ([`Emitter::is_chain_pair`]; `i` its key, as `emit_pair`'s; its
    /// node pair sent `before` bytes in the pairs before it): lane `rail` alone, whose sends the rank
    /// neither keeps nor waits on through moves or forwards (none lands at
    /// it, nor on its node), so each chunk's sends are only their ids
    /// (their keys, [`Sink::push_key`]) in the slots of the sender's
    /// and the receiver's chains and the byte-counted windows, as
    /// `emit_slice` writes them: no transfer is built, no move or forward
    /// looked for. The lane slice, its chunks (the first send split, the
    /// taper) and the sends' ids, keys and slots are `emit_pair`'s.
    fn emit_chain_pair(
        &mut self,
        v: &impl Blocks,
        sink: &mut RankSink,
        rail: usize,
        (k, p, i, before): (usize, StagePair, usize, u64),
    ) {
        let (nn, g) = (self.nodes, self.gpus);
        let (a, b, l) = (p.src_node as usize, p.dst_node as usize, rail);
        let taper = self.last_pair[a] == i || self.last_pair[nn + b] == i;
        // Lane `rail` of a pair of two other nodes.
        let lane = self.chain_lane(k, sink.node, rail, &p);
        let (from, to) = lane_slice(before, before + p.bytes, lane.total, lane.len);
        let (c, r) = (a * g + l, b * g + l);
        if self.unit > 0 && to > from {
            self.nominal = (to - from) / (to - from).div_ceil(self.chunk);
        }
        let first = self.first_slice[c] == i as u32;
        self.cut_chunks(v, (c, b, l, from, to), false, None, first);
        if taper {
            self.taper_last_chunks();
        }
        self.slice_start = self.slots[c].len();
        for k in 0..self.chunks.len() {
            let (lo, hi) = self.chunks[k];
            let mut ops = [NONE; 2];
            if lo < lane.own {
                let bytes = hi.min(lane.own) - lo;
                ops[0] = sink.push_key(r, Buffer::Scratch, lane.recv_base + lo, bytes);
            }
            if hi > lane.own {
                let (g0, g1) = (lo.max(lane.own) - lane.own, hi - lane.own);
                let off = lane.recv_base + lane.own + g0;
                ops[1] = sink.push_key(r, Buffer::Scratch, off, g1 - g0);
            }
            self.push_send(c, r, ops, (true, true));
        }
    }

    /// `node_bytes` into `self.node_bytes` and its [`Emitter::decompose_as`]
    /// (`keep_rotation`: a chunked rotation is kept as its structure), or
    /// the matrix and stages [`Emitter::first_slice_of`] kept for the same
    /// node matrix (moved out, not copied: the memo serves one program; a
    /// kept rotation is written out where `keep_rotation` is false).
    pub(super) fn decompose_rank(&mut self, node_bytes: &[u64], keep_rotation: bool) {
        let memo = &mut self.stage_memo;
        if memo.valid && memo.node_bytes == node_bytes {
            std::mem::swap(&mut self.node_bytes, &mut memo.node_bytes);
            std::mem::swap(&mut self.stages, &mut memo.stages);
            std::mem::swap(&mut self.rotation, &mut memo.rotation);
            self.rotated_rank = memo.rotated;
            self.stage_count = memo.stage_count;
            self.bounds = memo.bounds;
            memo.valid = false;
            if self.rotated_rank && !keep_rotation {
                self.stages.clear();
                self.rotation
                    .write_pairs(&self.node_bytes, &mut self.stages);
                self.rotated_rank = false;
            }
            return;
        }
        self.decompose_from(Some(node_bytes), keep_rotation);
    }

    /// The first slice of GPU `(node, rail)` ([`Emitter::first_slices`]):
    /// the index in the stages of `node_bytes` of its first lane slice that
    /// carries bytes ([`NONE`] if none), from the lengths of its lanes,
    /// `lens[b]` lane `rail` of pair `(node, b)`. Its part of every rank's
    /// [`StageInputs::first_slices`]. The stages are kept for the rank's
    /// program ([`Emitter::decompose_rank`]).
    pub(crate) fn first_slice_of(&mut self, node_bytes: &[u64], node: usize, lens: &[u64]) -> u32 {
        let nn = self.nodes;
        let memo = &self.stage_memo;
        if !(memo.valid && memo.node_bytes == node_bytes) {
            // Decomposed into the memo's buffers, not copied there; the
            // last plan's stages (`Planner::stages`) stay as they were.
            let (count, depth, bounds) = (self.stage_count, self.depth, self.bounds);
            let rotated = self.rotated_rank;
            std::mem::swap(&mut self.stages, &mut self.stage_memo.stages);
            std::mem::swap(&mut self.rotation, &mut self.stage_memo.rotation);
            self.decompose_from(Some(node_bytes), true);
            let memo = &mut self.stage_memo;
            std::mem::swap(&mut self.stages, &mut memo.stages);
            std::mem::swap(&mut self.rotation, &mut memo.rotation);
            memo.rotated = std::mem::replace(&mut self.rotated_rank, rotated);
            memo.stage_count = std::mem::replace(&mut self.stage_count, count);
            memo.bounds = std::mem::replace(&mut self.bounds, bounds);
            self.depth = depth;
            // Moved, not copied: `decompose_rank` moves it back.
            std::mem::swap(&mut memo.node_bytes, &mut self.node_bytes);
            memo.valid = true;
        }
        if self.stage_memo.rotated {
            return self.first_slice_rotated(node_bytes, node, lens);
        }
        self.taken.clear();
        self.taken.resize(nn, 0);
        for (i, p) in self.stage_memo.stages.iter().enumerate() {
            if p.src_node as usize != node {
                continue;
            }
            let b = p.dst_node as usize;
            let before = self.taken[b];
            self.taken[b] = before + p.bytes;
            if slice_carries(before, p.bytes, node_bytes[node * nn + b], lens[b]) {
                return i as u32;
            }
        }
        NONE
    }

    /// The first slices `given` ([`StageInputs`]), checked where the rank
    /// knows the lanes: every GPU of its own node. Errors
    /// ([`Error::Input`]) naming the first GPU whose given slice is not
    /// its own, or one past the stages. `pairs`: the stage pairs of its node,
    /// in order ([`RankPairs::own`]; those it sends are the ones read).
    fn given_first_slices(
        &mut self,
        given: &StageInputs,
        node: usize,
        pairs: &[u32],
    ) -> Result<()> {
        let (nn, g) = (self.nodes, self.gpus);
        first_slices_in_range(given, self.stages.len())?;
        self.first_slice.clear();
        self.first_slice.extend_from_slice(&given.first_slices);
        // The node's own GPUs, from its lanes (every lane of its pairs).
        let mut own = std::mem::take(&mut self.rank_sums);
        own.clear();
        own.resize(nn + g, 0);
        let (taken, found) = own.split_at_mut(nn);
        found.fill(u64::from(NONE));
        // Until every lane has found its slice (usually in the first
        // stages): the lanes found are not cut again.
        let mut left = g;
        for &i in pairs {
            if left == 0 {
                break;
            }
            let p = &self.stages[i as usize];
            if p.src_node as usize != node {
                continue;
            }
            let b = p.dst_node as usize;
            let before = taken[b];
            taken[b] = before + p.bytes;
            left -= self.own_slices(node, p, before, found, || u64::from(i));
        }
        let out = own_first_slices_agree(given, found, node);
        self.rank_sums = own;
        out
    }

    /// Of the lanes of node `node`'s GPUs that have not found their first
    /// slice (`found[l]` [`NONE`]), those to which stage pair `p` (sent by
    /// `node`; `before` bytes of its node pair before it) gives a slice
    /// that carries bytes: each takes `index()`. Returns how many.
    fn own_slices(
        &self,
        node: usize,
        p: &StagePair,
        before: u64,
        found: &mut [u64],
        mut index: impl FnMut() -> u64,
    ) -> usize {
        let (nn, g) = (self.nodes, self.gpus);
        let b = p.dst_node as usize;
        let total = self.node_bytes[node * nn + b];
        let mut taken = 0;
        for (l, f) in found.iter_mut().enumerate() {
            if *f != u64::from(NONE) {
                continue;
            }
            let len = self.lanes[rank_lane_index(nn, g, node, 0, node, b, l)].len();
            if slice_carries(before, p.bytes, total, len) {
                *f = index();
                taken += 1;
            }
        }
        taken
    }

    /// [`Emitter::first_slice_of`] where the memo's stages are the chunked
    /// rotation: the node's pieces in stage order until one gives lane
    /// `rail` a slice that carries bytes; its index in the written list.
    fn first_slice_rotated(&self, node_bytes: &[u64], node: usize, lens: &[u64]) -> u32 {
        let nn = self.nodes;
        let r = &self.stage_memo.rotation;
        let first = r.first_piece_from(node_bytes, node, |p, before| {
            let b = p.dst_node as usize;
            slice_carries(before, p.bytes, node_bytes[node * nn + b], lens[b])
        });
        first.map_or(NONE, |p| r.index_of(node_bytes, &p) as u32)
    }

    /// [`Emitter::given_first_slices`] where the stages are the chunked
    /// rotation (`rotated_rank`), from the node's pieces in stage order
    /// (`pieces`, [`RankPairs::pieces`]): the own GPUs' checked against
    /// their indices in the written list, then every GPU's as the number
    /// of its stage, which `emit_pair` compares (a node sends at most one
    /// pair per stage).
    fn given_first_slices_rotated(
        &mut self,
        given: &StageInputs,
        node: usize,
        pieces: &[(StagePair, u64)],
    ) -> Result<()> {
        let g = self.gpus;
        first_slices_in_range(given, self.rotation.pairs())?;
        // The node's own GPUs, from its lanes (every lane of its pairs),
        // until every lane has found its slice.
        let mut found = std::mem::take(&mut self.rank_sums);
        found.clear();
        found.resize(g, u64::from(NONE));
        let mut left = g;
        for (p, before) in pieces {
            if left == 0 {
                break;
            }
            if p.src_node as usize != node {
                continue;
            }
            let mut index = None;
            let (r, m) = (&self.rotation, &self.node_bytes[..]);
            let at = || *index.get_or_insert_with(|| r.index_of(m, p) as u64);
            left -= self.own_slices(node, p, *before, &mut found, at);
        }
        let out = own_first_slices_agree(given, &found, node);
        self.rank_sums = found;
        out?;
        let r = &self.rotation;
        self.first_slice.clear();
        self.first_slice
            .extend(given.first_slices.iter().map(|&i| match i {
                NONE => NONE,
                i => r.stage_of_index(i as usize).unwrap_or(NONE),
            }));
        Ok(())
    }

    /// Whether the plan of the traffic `t` is part of is the merged one
    /// (see [`Emitter::merged`]): decided from what every rank sends and
    /// receives across nodes, which every rank's `t` holds alike. Sets
    /// `latency_bound` and `merged`.
    pub(crate) fn merged_for(&mut self, t: &LocalTraffic) -> bool {
        self.latency_bound = self.opts.staged
            && self.nodes >= 2
            && self.busiest_within_latency(
                t.inter_out.iter().copied().zip(t.inter_in.iter().copied()),
            );
        self.merged = self.latency_bound || (self.opts.staged && self.one_nic_few_peers);
        self.merged
    }

    /// [`Emitter::first_slices`] over the lanes of rank `(node, rail)`'s
    /// program ([`Emitter::balance_rank`]): the lanes it does not keep are
    /// balanced again, for their bytes, where the walk needs them (until
    /// every GPU has found its first slice, usually in the first stages).
    #[inline(never)]
    pub(super) fn first_slices_rank(&mut self, v: &impl Blocks, node: usize, rail: usize) {
        let (nn, g) = (self.nodes, self.gpus);
        let min_gain = self.min_gain();
        self.first_slice.clear();
        self.first_slice.resize(self.ranks(), NONE);
        self.taken.clear();
        self.taken.resize(nn * nn, 0);
        // GPUs of each node still without a slice; nodes still with one.
        let mut left = std::mem::take(&mut self.rank_sums);
        left.clear();
        left.resize(nn, g as u64);
        let mut tmp = std::mem::take(&mut self.lane_tmp);
        tmp.resize(g, Default::default());
        let mut nodes_left = nn;
        // The stages are read while pairs are balanced (which needs `self`).
        let stages = std::mem::take(&mut self.stages);
        for (i, p) in stages.iter().enumerate() {
            if nodes_left == 0 {
                break;
            }
            let (a, b) = (p.src_node as usize, p.dst_node as usize);
            let before = self.taken[a * nn + b];
            let after = before + p.bytes;
            self.taken[a * nn + b] = after;
            if left[a] == 0 {
                continue;
            }
            let mine = a == node || b == node;
            if !mine {
                self.sent_to(v, a, b);
                self.balance_sent(a, min_gain, true, None, &mut tmp);
            }
            let total = self.node_bytes[a * nn + b];
            for (l, other) in tmp.iter().enumerate() {
                let c = a * g + l;
                let len = if mine {
                    self.lanes[rank_lane_index(nn, g, node, rail, a, b, l)].len()
                } else {
                    other.len()
                };
                if self.first_slice[c] == NONE && slice_carries(before, after - before, total, len)
                {
                    self.first_slice[c] = i as u32;
                    left[a] -= 1;
                    if left[a] == 0 {
                        nodes_left -= 1;
                    }
                }
            }
        }
        self.stages = stages;
        self.rank_sums = left;
        self.lane_tmp = tmp;
    }
}

/// An error in what a job gave as `stage_inputs.first_slices`.
fn bad_first_slices(reason: String) -> Error {
    InputError::new(
        "local traffic",
        format!("`stage_inputs.first_slices`: {reason}"),
    )
    .into()
}

/// Every GPU's given first slice names one of `pairs` stage pairs (or
/// none).
fn first_slices_in_range(given: &StageInputs, pairs: usize) -> Result<()> {
    match given
        .first_slices
        .iter()
        .position(|&i| i != NONE && i as usize >= pairs)
    {
        Some(c) => Err(bad_first_slices(format!(
            "GPU {c}'s is stage pair {}, of {pairs}",
            given.first_slices[c]
        ))),
        None => Ok(()),
    }
}

/// The first slices of node `node`'s GPUs that their lanes say (`found`,
/// one per GPU) are those `given`.
fn own_first_slices_agree(given: &StageInputs, found: &[u64], node: usize) -> Result<()> {
    let at = node * found.len();
    match found
        .iter()
        .enumerate()
        .find(|&(l, &f)| f != u64::from(given.first_slices[at + l]))
    {
        Some((l, &f)) => Err(bad_first_slices(format!(
            "GPU {}'s is {}, its lanes say {}",
            at + l,
            given.first_slices[at + l],
            f
        ))),
        None => Ok(()),
    }
}

/// Longest window ([`Emitter::window_back`] slots) whose chains
/// [`Emitter::rank_pairs`] walks by window; a deeper pipeline takes every
/// slice of the rail.
pub(super) const MAX_WINDOW: usize = 64;

/// Whether the lane slice of a stage pair of `bytes` after `before` of its
/// node pair's `total`, on a lane of `len` bytes, carries bytes:
/// `lane_slice`'s `to > from`, its two divisions only where neither
/// shortcut decides. A slice that ends the pair carries what is left
/// (`len > 0`, `before < total`); one at least `total / len` long spans a
/// multiple of `total` in `x len` (its ends' shares differ by at least
/// one byte).
#[inline]
pub(super) fn slice_carries(before: u64, bytes: u64, total: u64, len: u64) -> bool {
    if len == 0 || bytes == 0 {
        return false;
    }
    let after = before + bytes;
    if after == total || u128::from(bytes) * u128::from(len) >= u128::from(total) {
        return true;
    }
    let (from, to) = lane_slice(before, after, total, len);
    to > from
}

/// `v` at `len` entries, those it keeps as they were (to be overwritten):
/// zeroed only where it grows, so a buffer reused at its size is not
/// written twice.
fn grow<T: Copy + Default>(v: &mut Vec<T>, len: usize) {
    if v.len() < len {
        v.resize(len, T::default());
    } else {
        v.truncate(len);
    }
}

impl Emitter {
    /// How many slots back in a chain a send's wait can reach
    /// ([`Emitter::prepare_sends`] first): `depth` where the windows count
    /// sends (`unit` 0: `sender_wait` and `receiver_wait` read the slot
    /// `depth` back), `2 depth` where they count bytes (`window_start`
    /// looks back that far at most).
    pub(super) fn window_back(&self) -> usize {
        let depth = self.depth as usize;
        if self.unit == 0 {
            depth
        } else {
            depth.saturating_mul(2)
        }
    }

    /// Whether stage pair `p`, whose node pair sent `before` bytes in the
    /// pairs before it, gives lane `j` of rank `(a, j)`'s lanes a slice
    /// that carries bytes (`lane_slice` not empty; `rail_len` as
    /// [`Emitter::rank_lane_len`]'s).
    #[inline]
    fn carries(&self, a: usize, j: usize, p: &StagePair, before: u64, rail_len: &[u64]) -> bool {
        let nn = self.nodes;
        let (s, d) = (p.src_node as usize, p.dst_node as usize);
        let len = self.rank_lane_len(a, j, (s, d, j), rail_len);
        slice_carries(before, p.bytes, self.node_bytes[s * nn + d], len)
    }

    /// The stage pairs rank `(a, j)`'s program emits, into `rp.pairs`:
    /// every pair of its node `a` (its sends, its receives, its node's
    /// moves and forwards: every lane), and of the other pairs (lane `j`
    /// only) those whose sends the rank's own sends and receives wait on or
    /// whose windows they read. A send of the rank into GPU `(b, j)` waits
    /// on a slot at most `W` slots back in that GPU's receive chain
    /// (`sender_wait`, `receiver_wait`; [`Emitter::window_back`]: `depth`
    /// where windows count sends, `2 depth` where they count bytes, which
    /// look back that far at most), and a send into the rank on one at most
    /// `W` back in its sender `(a', j)`'s chain; every slice that carries
    /// bytes holds at least one slot. So each of those chains needs only
    /// its last `W` slices that carry bytes before each slice of the rank
    /// (since the rank's last slice on that chain: those before were taken
    /// then): emitted in stage order with the rest, those chains end, at
    /// each of the rank's slices, in the same `W` slots as the whole
    /// plan's, and the chains' lengths agree up to `W` (all the checks
    /// read). `spray` has no chains and takes its node's pairs only; a
    /// window longer than `MAX_WINDOW` takes every slice of the rail.
    ///
    /// One pass over the stage pairs adds up what each node pair sent
    /// before each (no division) and links each pair to the pair before it
    /// on each of its two chains; each of the rank's pairs notes the last
    /// pair of the chain it meets. Then only the rank's own pairs are
    /// walked, each slice meeting its chain walking back from there along
    /// the links, over the chain's pairs since the last meeting, until
    /// `W` of them carry bytes: the lane slices (a division each)
    /// are cut for the rank's pairs and those, not for every pair of the
    /// rail.
    #[inline(never)]
    pub(super) fn rank_pairs(&self, a: usize, j: usize, rp: &mut RankPairs, rail_len: &[u64]) {
        let nn = self.nodes;
        let stages = &self.stages[..];
        rp.pairs.clear();
        let chains = self.opts.staged;
        let window = self.window_back();
        // A pipeline too deep for windows: every slice of the rail.
        let every = chains && window > MAX_WINDOW;
        let by_chain = chains && !every;
        let window = window.clamp(1, MAX_WINDOW);
        rp.picked.clear();
        rp.picked.resize(stages.len().div_ceil(64), 0);
        rp.sent.clear();
        rp.sent.resize(nn * nn, 0);
        rp.own.clear();
        rp.last.clear();
        rp.last.resize(2 * nn, NONE);
        // Every entry of `before` and `prev` is written below: they grow
        // (zeroed) only past their longest use so far.
        grow(&mut rp.before, stages.len());
        grow(&mut rp.prev, stages.len());
        // Each pair's bytes before it and the pairs before it on its two
        // chains; the rank's pairs. Over the buffers as slices: the only
        // pass over every stage pair. A pair of the rank's node is on no
        // chain of the rail (its links are the chain it meets, read
        // below), so it does not move the chains' last pairs.
        let (sent, own) = (&mut rp.sent[..], &mut rp.own);
        let (last_from, last_into) = rp.last.split_at_mut(nn);
        let pairs = stages
            .iter()
            .zip(rp.before.iter_mut().zip(&mut rp.prev[..]));
        for (i, (p, (before, prev))) in pairs.enumerate() {
            let (s, d) = (p.src_node as usize, p.dst_node as usize);
            let pair = &mut sent[s * nn + d];
            *before = *pair;
            *pair += p.bytes;
            *prev = [last_from[s], last_into[d]];
            if s == a || d == a {
                own.push(i as u32);
            } else {
                last_from[s] = i as u32;
                last_into[d] = i as u32;
            }
        }
        if every {
            for (i, p) in stages.iter().enumerate() {
                if self.carries(a, j, p, rp.before[i], rail_len) {
                    rp.pick(i as u32);
                }
            }
        }
        // From here `last` is one past each chain's last meeting.
        rp.last.fill(0);
        let own = std::mem::take(&mut rp.own);
        for &i in &own {
            rp.pick(i);
            if !by_chain {
                continue;
            }
            let p = &stages[i as usize];
            let (s, d) = (p.src_node as usize, p.dst_node as usize);
            if !self.carries(a, j, p, rp.before[i as usize], rail_len) {
                continue;
            }
            let (c, side) = if s == a { (nn + d, 1) } else { (s, 0) };
            let after = rp.last[c];
            // The chain's last pair before this one.
            let mut x = rp.prev[i as usize][side];
            let mut taken = 0;
            while x != NONE && x >= after && taken < window {
                if self.carries(a, j, &stages[x as usize], rp.before[x as usize], rail_len) {
                    rp.pick(x);
                    taken += 1;
                }
                x = rp.prev[x as usize][side];
            }
            rp.last[c] = i + 1;
        }
        rp.own = own;
        rp.collect(stages);
    }

    /// [`Emitter::rank_pairs`] where the stages are the chunked rotation
    /// (`rotated_rank`), read piece by piece, not written: the pieces of
    /// the rank's node ([`RotationStages::pieces_of`](super::rotation::RotationStages::pieces_of)), and for each
    /// that carries bytes on lane `j` the last `W` pieces of its chain
    /// that carry bytes since the chain's last meeting, found stage by
    /// stage back from it (a node sends and receives at most one piece
    /// per stage, so a chain has at most one in each; which one,
    /// [`RotationStages::piece`](super::rotation::RotationStages::piece) says in O(1)). Keys are stage numbers. The
    /// pairs are those [`Emitter::rank_pairs`] picks from the written
    /// list, in the same order; it costs the rank's pieces and its walks
    /// (O(P / N) pieces and the stages between meetings), not the P stage
    /// pairs. Windows deeper than `MAX_WINDOW` are not walked (the caller
    /// writes the pairs).
    #[inline(never)]
    pub(super) fn rank_pairs_rotated(
        &self,
        a: usize,
        j: usize,
        rp: &mut RankPairs,
        rail_len: &[u64],
    ) {
        let nn = self.nodes;
        let r = &self.rotation;
        let window = self.window_back().clamp(1, MAX_WINDOW);
        rp.pairs.clear();
        rp.pieces.clear();
        let m = &self.node_bytes[..];
        // `last` is the counting sort's buffer until it is set below.
        r.pieces_of(m, a, &mut rp.pieces, &mut rp.last);
        // One past the stage of each chain's last meeting: chain `s` (GPU
        // `(s, j)` sending), chain `N + d` (GPU `(d, j)` receiving).
        rp.last.clear();
        rp.last.resize(2 * nn, 0);
        for &(p, before) in &rp.pieces {
            rp.pairs.push(RankPair {
                pair: p,
                key: p.stage,
                before,
            });
            if !self.carries(a, j, &p, before, rail_len) {
                continue;
            }
            let (s, d) = (p.src_node as usize, p.dst_node as usize);
            // The rank sends into `d`'s receive chain, or receives from
            // `s`'s send chain.
            let (c, into) = if s == a { (nn + d, true) } else { (s, false) };
            let after = rp.last[c];
            let (mut q, mut taken) = (p.stage, 0);
            while q > after && taken < window {
                q -= 1;
                let (k, t) = r.stage_at(q);
                let (src, dst) = if into {
                    (if d >= k { d - k } else { d + nn - k }, d)
                } else {
                    (s, if s + k < nn { s + k } else { s + k - nn })
                };
                // A piece of the rank's node is on no chain.
                if src == a || dst == a {
                    continue;
                }
                // The pair's bytes and, lazily placed, its lane's length
                // read together: down a column both are cache misses, and
                // the second waited on the piece's branch.
                let at = src * nn + dst;
                let total = m[at];
                let summed = match self.rail_lanes.from_sums {
                    true => rail_len.get(at).copied(),
                    false => None,
                };
                if let Some((x, xb)) = r.piece_of(total, k, src, dst, t) {
                    let len =
                        summed.unwrap_or_else(|| self.rank_lane_len(a, j, (src, dst, j), rail_len));
                    if slice_carries(xb, x.bytes, total, len) {
                        rp.pairs.push(RankPair {
                            pair: x,
                            key: x.stage,
                            before: xb,
                        });
                        taken += 1;
                    }
                }
            }
            rp.last[c] = p.stage + 1;
        }
        // In stage order (a counting sort: the stages are few), then by
        // sending node within a stage, once each.
        let stages = r.stage_count() as usize;
        let at = &mut rp.last;
        at.clear();
        at.resize(stages + 1, 0);
        for x in &rp.pairs {
            at[x.key as usize + 1] += 1;
        }
        for q in 0..stages {
            at[q + 1] += at[q];
        }
        let mut sorted = std::mem::take(&mut rp.sorted);
        sorted.clear();
        sorted.resize(
            rp.pairs.len(),
            rp.pairs.first().copied().unwrap_or_default(),
        );
        for x in &rp.pairs {
            let q = &mut at[x.key as usize];
            sorted[*q as usize] = *x;
            *q += 1;
        }
        for stage in sorted.chunk_by_mut(|x, y| x.key == y.key) {
            stage.sort_unstable_by_key(|x| x.pair.src_node);
        }
        sorted.dedup_by_key(|x| (x.key, x.pair.src_node));
        rp.sorted = std::mem::replace(&mut rp.pairs, sorted);
    }

    /// [`Emitter::rank_pairs`] as it was first written, the reference of
    /// the tests: one pass over every stage pair in order, cutting each
    /// one's lane slice, with a ring of the last `W` slices that carry
    /// bytes per chain of the rail ([`Emitter::window_back`]), emptied into the picked pairs
    /// when the rank's slice meets the chain.
    #[cfg(test)]
    pub(super) fn rank_pairs_by_rings(&self, a: usize, j: usize) -> Vec<(u32, u64)> {
        let nn = self.nodes;
        let chains = self.opts.staged;
        let window = self.window_back();
        let every = chains && window > MAX_WINDOW;
        let window = window.clamp(1, MAX_WINDOW);
        let mut rings: Vec<Vec<u32>> = vec![Vec::new(); 2 * nn];
        let mut held = vec![0usize; 2 * nn];
        let mut picked = vec![false; self.stages.len()];
        let mut before_of = vec![0; self.stages.len()];
        let mut sent = vec![0u64; nn * nn];
        let meet = |chain: usize, rings: &[Vec<u32>], held: &mut [usize], picked: &mut [bool]| {
            let r = &rings[chain];
            for &i in &r[r.len() - held[chain]..] {
                picked[i as usize] = true;
            }
            held[chain] = 0;
        };
        for (i, p) in self.stages.iter().enumerate() {
            let (s, d) = (p.src_node as usize, p.dst_node as usize);
            let before = sent[s * nn + d];
            sent[s * nn + d] += p.bytes;
            before_of[i] = before;
            let len = self.rank_lane_len(a, j, (s, d, j), &[]);
            let total = self.node_bytes[s * nn + d];
            let (from, to) = lane_slice(before, before + p.bytes, total, len);
            if s == a || d == a {
                picked[i] = true;
            }
            if !chains || to <= from {
                continue;
            }
            if every {
                picked[i] = true;
            } else if s == a {
                meet(nn + d, &rings, &mut held, &mut picked);
            } else if d == a {
                meet(s, &rings, &mut held, &mut picked);
            } else {
                for c in [s, nn + d] {
                    rings[c].push(i as u32);
                    held[c] = (held[c] + 1).min(window);
                }
            }
        }
        (0..self.stages.len())
            .filter(|&i| picked[i])
            .map(|i| (i as u32, before_of[i]))
            .collect()
    }
}
