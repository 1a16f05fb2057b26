//! The lanes of every node pair: balanced by [`super::balance`] (each GPU's
//! share of what its node sends to another, and the pieces moved to reach
//! it), or all sent directly when every pair is balanced already.

use super::balance::{balance_pair, Lane};
use super::blocks::{Blocks, RankBlocks};
use super::emit::Emitter;
use super::rank_state::rank_lane_index;
use crate::rank::{LaneSums, NodeLanes, StageInputs};

/// A pair goes direct only if its busiest lane carries at most this fraction
/// more than balanced lanes would (measured: 2% keeps 4x8 log-normal at 4 KB
/// per pair at 1.42x the bound, 10% and no limit give 1.49x).
const DIRECT_SLACK: f64 = 0.02;

impl Emitter {
    /// True when the average block between nodes takes at least one
    /// inter-node latency on its NIC. Direct lanes send block by block to
    /// every GPU of the receiving node, so shorter blocks make each send
    /// latency-bound (the chain of sends pays the latency again every
    /// `depth` sends), and merged into one send they fan out to many
    /// receiving NICs at once (incast). Measured on uniform traffic, ratio to
    /// the bound with direct lanes / balanced lanes, 2x8..16x8 (ideal and
    /// congested agree for both): 512 KB per pair 1.000 / 1.004-1.048; 128 KB
    /// 1.011-1.078 / 1.008-1.090; 64 KB 1.23-1.25 / 1.09-1.23; 16 KB
    /// 1.55-1.69 (2.3-2.8 congested) / 1.31-1.39.
    fn blocks_are_long(&self) -> bool {
        let (bytes, blocks) = (self.inter_node_bytes(), self.inter_blocks);
        let lane_rate = self.nic_rate / self.weights.max_sharing() as f64;
        blocks > 0 && bytes as f64 / blocks as f64 >= self.inter_latency * lane_rate
    }

    pub(super) fn lane_index(&self, a: usize, b: usize, l: usize) -> usize {
        (a * self.nodes + b) * self.gpus + l
    }

    /// A balancing move is worth it when it saves more than the extra
    /// NVLink hop costs (never, without balancing).
    pub(super) fn min_gain(&self) -> f64 {
        if self.opts.balance {
            self.intra_latency
        } else {
            f64::INFINITY
        }
    }

    /// What each GPU of node `a` sends node `b`, into `self.sent`.
    pub(super) fn sent_to(&mut self, v: &impl Blocks, a: usize, b: usize) {
        self.sent.clear();
        self.sent
            .extend((0..self.gpus).map(|l| v.to_node(a * self.gpus + l, b)));
    }

    /// Balances the node pair whose bytes [`Emitter::sent_to`] put in
    /// `self.sent` (sent by node `a`; module
    /// [`crate::sched::fast::balance`]) into the lanes at `self.lanes[at..]`
    /// (`at` given) or into `tmp`; `bytes_only`: the lanes' bytes, no
    /// pieces.
    pub(super) fn balance_sent(
        &mut self,
        a: usize,
        min_gain: f64,
        bytes_only: bool,
        at: Option<usize>,
        tmp: &mut [Lane],
    ) {
        let g = self.gpus;
        let lanes = match at {
            Some(at) => &mut self.lanes[at..at + g],
            None => tmp,
        };
        balance_pair(
            &self.sent,
            (a * g) as u32,
            &self.weights,
            self.nic_rate,
            min_gain,
            self.mesh,
            bytes_only,
            lanes,
            &mut self.pieces,
            &mut self.targets,
        );
    }

    /// Whether every node pair goes direct (see [`Emitter::balance`]):
    /// tested pair by pair from `v`, or, for a rank given its
    /// [`StageInputs`], from each node's verdict on its own pairs
    /// (`given.pairs_direct`, [`Emitter::node_direct`]).
    fn pairs_all_direct(
        &mut self,
        v: &impl Blocks,
        min_gain: f64,
        given: Option<&StageInputs>,
    ) -> bool {
        let (nn, g) = (self.nodes, self.gpus);
        // Direct sends only when every pair qualifies: a direct pair's lanes
        // are not rail-aligned, and next to balanced pairs (pipelined into
        // the same NICs) they made incast (congested 4x8 hotspot: 1.03x ->
        // 1.11x the bound). Only with stages: `spray` sent directly is
        // `direct` (congested uniform 4x8: 2.49x instead of 1.10x).
        // Nor where crossing rails costs spine bandwidth (rail-optimized,
        // oversubscribed): there 7/8 of a direct lane's bytes would climb
        // the spine (near-uniform 8x8 at 2:1: `direct` 1.75x the bound,
        // docs/benchmarks.md).
        //
        // With a per-message cost a direct lane sends one message per
        // destination GPU where a balanced lane sends one per chunk: on a
        // switch, whose NVLink hides the balancing moves, that decides
        // (calibrated DGX-H100 uniform 4x8 and 8x8: 1.127 and 1.125 -> 1.049
        // and 1.044 of the bound, with the chunks of eq. 4'). On a mesh the moves
        // cross 64 GB/s links, and direct pairs stay (MI300X calibrated
        // sweep median 1.142 with them, 1.174 without).
        let mut all_direct = self.opts.balance
            && self.opts.staged
            && !self.cross_rail_spine
            && self.blocks_are_long()
            && (self.mesh || self.opts.per_message_us * (g - 1) as f64 <= self.intra_latency);
        if let Some(given) = given {
            return all_direct && given.pairs_direct;
        }
        'pairs: for a in 0..nn {
            for b in (0..nn).filter(|&b| b != a) {
                if !all_direct {
                    break 'pairs;
                }
                self.sent_to(v, a, b);
                all_direct = self.sent.iter().all(|&x| x == 0)
                    || self.direct_is_enough(|d| v.node_to_rank(a, d), b, min_gain);
            }
        }
        all_direct
    }

    /// Whether every pair node `a` sends passes the direct test
    /// ([`Emitter::direct_is_enough`]) or sends nothing, from the node's
    /// rows alone: `sends[l * N + b]` what GPU `l` sends node `b`,
    /// `to_ranks[d]` what the node sends rank `d`. Node `a`'s part of
    /// [`StageInputs::pairs_direct`]. O(R).
    pub(crate) fn node_direct(&mut self, a: usize, sends: &[u64], to_ranks: &[u64]) -> bool {
        let (nn, g) = (self.nodes, self.gpus);
        let min_gain = self.min_gain();
        (0..nn).filter(|&b| b != a).all(|b| {
            self.sent.clear();
            self.sent.extend((0..g).map(|l| sends[l * nn + b]));
            self.sent.iter().all(|&x| x == 0) || self.direct_is_enough(|d| to_ranks[d], b, min_gain)
        })
    }

    /// The lengths of the lanes of every pair `(a, b)` into node `b`, from
    /// what every rank sends it (`into[s]`, `R` values): `N G` values,
    /// lane `l` of `(a, b)` at `a G + l` (pair `(b, b)` empty), each the
    /// `len` of [`Emitter::node_lanes`] of node `a` at `l N + b`.
    pub(crate) fn column_lens(&mut self, b: usize, into: &[u64]) -> Vec<u64> {
        let (nn, g) = (self.nodes, self.gpus);
        let min_gain = self.min_gain();
        let mut tmp = std::mem::take(&mut self.lane_tmp);
        tmp.resize(g, Default::default());
        let mut out = vec![0; nn * g];
        for a in (0..nn).filter(|&a| a != b) {
            self.sent.clear();
            self.sent.extend_from_slice(&into[a * g..(a + 1) * g]);
            self.balance_sent(a, min_gain, true, None, &mut tmp);
            for (l, lane) in tmp.iter().enumerate() {
                out[a * g + l] = lane.len();
            }
        }
        self.lane_tmp = tmp;
        out
    }

    /// Balances every node pair (module [`crate::sched::fast::balance`]).
    pub(super) fn balance(&mut self, v: &impl Blocks) {
        let (nn, g) = (self.nodes, self.gpus);
        // Every lane is written below (those of a node to itself as empty):
        // the previous plan's are overwritten rather than cleared first (at
        // 512x8 the lanes take 100 MB).
        self.lanes.resize(nn * nn * g, Lane::default());
        self.pieces.clear();
        let min_gain = self.min_gain();
        let all_direct = self.pairs_all_direct(v, min_gain, None);
        self.all_direct = all_direct;
        for a in 0..nn {
            for b in 0..nn {
                if a == b {
                    let at = self.lane_index(a, a, 0);
                    self.lanes[at..at + g].fill(Lane::default());
                    continue;
                }
                self.sent_to(v, a, b);
                let at = self.lane_index(a, b, 0);
                if all_direct {
                    for (l, lane) in self.lanes[at..at + g].iter_mut().enumerate() {
                        *lane = Lane {
                            own: self.sent[l],
                            pieces_start: self.pieces.len() as u32,
                            pieces_end: self.pieces.len() as u32,
                            direct: true,
                            ..Lane::default()
                        };
                    }
                    continue;
                }
                self.balance_sent(a, min_gain, false, Some(at), &mut []);
            }
        }
    }

    /// The lanes of the pairs node `a` sends (each GPU's bytes to each
    /// node in `sends`, `G` rows of `N`), for their bytes: node `a`'s part
    /// of every rank's [`LaneSums`]. O(N G).
    pub(crate) fn node_lanes(&mut self, a: usize, sends: &[u64]) -> NodeLanes {
        let nn = self.nodes;
        let min_gain = self.min_gain();
        let mut row = std::mem::take(&mut self.row_lens);
        row.balance(sends, nn, &self.weights, self.nic_rate, min_gain, a);
        let out = NodeLanes {
            len: row.len.clone(),
            gathered: row.gathered.clone(),
        };
        self.row_lens = row;
        out
    }

    /// The lanes rank `(node, rail)`'s program reads, balanced and laid out
    /// as [`Emitter::balance`] and [`Emitter::layout_scratch`] would, into
    /// `self.lanes` indexed by [`rank_lane_index`]: every lane of its node's
    /// pairs (with their pieces) and lane `rail` of the other pairs (their
    /// own and gathered bytes, no pieces), `N² + 2 N G` lanes instead of
    /// `N² G`. The others' lanes place the landing and gather regions of
    /// those: their sums per GPU and lane `rail` of every pair, `sums`
    /// ([`LaneSums`]), or, without them, found here by balancing every
    /// pair for its bytes. Given the sums it balances only its node's `2 N`
    /// pairs: O(R + N²). Returns the rank's scratch bytes, or `None`
    /// (nothing balanced) when every pair goes direct. Not on a mesh
    /// (`spread`).
    ///
    /// With `lazy` (and `sums`), lane `rail` of the other pairs is not
    /// written: their lengths are read from the sums, and the lanes of the
    /// rank's chain pairs are placed once those are picked
    /// ([`Emitter::place_rail_lanes`], [`RailLanes`]); `self.lanes` holds
    /// the node's `2 N G` lanes only, and nothing of `N²` is written.
    #[inline(never)]
    pub(super) fn balance_rank(
        &mut self,
        v: &RankBlocks<'_>,
        node: usize,
        rail: usize,
        sums: Option<&LaneSums>,
        given: Option<&StageInputs>,
        lazy: bool,
    ) -> Option<u64> {
        let (nn, g) = (self.nodes, self.gpus);
        debug_assert!(!self.mesh, "a mesh's lanes spread: no rank programs");
        self.pieces.clear();
        let min_gain = self.min_gain();
        self.all_direct = self.pairs_all_direct(v, min_gain, given);
        if self.all_direct {
            return None;
        }
        // Without the sums: every pair's lanes' bytes, a sending node's
        // pairs at once (`RowLens`), summed into `own` as a job would
        // (lane `rail` of each pair read in place, not kept).
        let mut own = std::mem::take(&mut self.own_sums);
        let mut row = std::mem::take(&mut self.row_lens);
        if sums.is_none() {
            own.reset(nn, g, false);
        }
        let lazy = lazy && sums.is_some();
        self.rail_lanes.from_sums = lazy;
        self.lanes.clear();
        let others = if lazy { 0 } else { nn * nn };
        self.lanes.resize(2 * nn * g + others, Lane::default());
        let idx = |a: usize, b: usize, l: usize| rank_lane_index(nn, g, node, rail, a, b, l);
        for a in 0..nn {
            // Lane `rail` of node `a`'s pairs.
            let (gathered, lens) = match sums {
                Some(s) => {
                    let at = a * nn..(a + 1) * nn;
                    (&s.rail_gathered[at.clone()], &s.rail_len[at])
                }
                None => {
                    let rows = v
                        .node_rows(a)
                        .expect("a rank without lane sums has node splits (program_local_into)");
                    row.balance(rows, nn, &self.weights, self.nic_rate, min_gain, a);
                    own.add_node(a, (&row.len, &row.gathered), (node, rail), (nn, g));
                    let at = rail * nn..(rail + 1) * nn;
                    (&row.gathered[at.clone()], &row.len[at])
                }
            };
            // Those away from `node`, gather bases running in the order of
            // `b` (placed later from the sums where `lazy`).
            let mut rail_gather = 0u64;
            if !lazy {
                for (b, (&gathered, &len)) in gathered.iter().zip(lens).enumerate() {
                    if a != node && b != node && b != a {
                        let at = self.pieces.len() as u32;
                        self.lanes[idx(a, b, rail)] = Lane {
                            own: len - gathered,
                            gathered,
                            pieces_start: at,
                            pieces_end: at,
                            gather_base: rail_gather,
                            ..Lane::default()
                        };
                    }
                    rail_gather += gathered;
                }
            }
            // The pairs of `node` (its row, else its column): every lane,
            // with pieces.
            let mut pair = |b: usize| {
                self.sent_to(v, a, b);
                let at = idx(a, b, 0);
                self.balance_sent(a, min_gain, false, Some(at), &mut []);
            };
            if a == node {
                (0..nn).filter(|&b| b != a).for_each(&mut pair);
            } else {
                pair(node);
            }
        }
        self.row_lens = row;
        // Per GPU: the bytes it gathers in all (`gather`); before column
        // `node` of its row (`gather_before`, the gather base of its lane
        // into the node); what lanes of the nodes before `node` land in it
        // (`land_before`, the landing base of the node's lanes into it).
        let sums = sums.unwrap_or(&own);
        let (gather, gather_before, land_before) =
            (&sums.gather, &sums.gather_before, &sums.land_before);
        // Landing regions: after the GPU's gather regions, in the order of
        // the sending node. Lane `rail` of the pairs away from `node`, by
        // column (`node`'s row among them); `land` is each column's
        // running sum.
        let mut land = std::mem::take(&mut self.rank_sums);
        land.clear();
        land.resize(nn, 0);
        if lazy {
            // What `place_rail_lanes` reads besides the sums.
            let rails = &mut self.rail_lanes;
            rails.gather.clear();
            rails.gather.extend((0..nn).map(|b| gather[b * g + rail]));
            rails.node_len.clear();
            rails.node_len.extend((0..nn).map(|b| {
                if b == node {
                    0
                } else {
                    self.lanes[idx(node, b, rail)].len()
                }
            }));
        } else {
            for a in 0..nn {
                for b in (0..nn).filter(|&b| b != node && b != a) {
                    let lane = &mut self.lanes[idx(a, b, rail)];
                    if a != node {
                        lane.recv_base = gather[b * g + rail] + land[b];
                    }
                    land[b] += lane.len();
                }
            }
        }
        self.rank_sums = land;
        // The pairs of `node` keep their bases in full.
        // Its row: gather regions in the order of `b`, landing after the
        // nodes before `node`.
        for l in 0..g {
            let mut at = 0u64;
            for b in 0..nn {
                let lane = &mut self.lanes[idx(node, b, l)];
                lane.gather_base = at;
                at += lane.gathered;
                lane.recv_base = gather[b * g + l] + land_before[b * g + l];
            }
        }
        // Its column: each sending GPU's gather regions before `node`'s, and
        // the landing regions in `node`'s GPUs in the order of `a`.
        let mut scratch = 0;
        for l in 0..g {
            let mut at = gather[node * g + l];
            for a in 0..nn {
                let lane = &mut self.lanes[idx(a, node, l)];
                if a != node {
                    lane.gather_base = gather_before[a * g + l];
                }
                lane.recv_base = at;
                at += lane.len();
            }
            if l == rail {
                scratch = at;
            }
        }
        self.own_sums = own;
        Some(scratch)
    }

    /// True when sending pair (a, b) directly, block by block from source
    /// GPU to destination GPU, loads its busiest sending and receiving lane
    /// (NIC) at most `min_gain` us and at most [`DIRECT_SLACK`] more than
    /// balancing it would: then the relay hop and forward of balancing cost
    /// more than they save (alpha-beta, as (2) in docs/algorithms.md; the
    /// relative slack because a pair's excess is paid again in every stage
    /// it spans). `self.sent` holds what each GPU of `a` sends to `b`.
    /// `into(d)`: bytes node `a` sends rank `d`.
    fn direct_is_enough(&self, into: impl Fn(usize) -> u64, b: usize, min_gain: f64) -> bool {
        let g = self.gpus;
        let total: u64 = self.sent.iter().sum();
        if total == 0 {
            return false;
        }
        let share = |l: usize| self.weights.sharing[l];
        // Balanced, lane l carries its target: at best total / R per rail.
        let mut balanced = 0u64;
        let mut prev = 0u64;
        for l in 0..g {
            let at = self.weights.upto(total, l + 1);
            balanced = balanced.max((at - prev) * share(l));
            prev = at;
        }
        let mut worst = 0u64;
        for l in 0..g {
            worst = worst.max(self.sent[l] * share(l));
            let d = b * g + l;
            let inn = into(d);
            worst = worst.max(inn * share(l));
        }
        let excess = (worst - balanced.min(worst)) as f64;
        excess / self.nic_rate <= min_gain && excess <= DIRECT_SLACK * balanced as f64
    }
}
