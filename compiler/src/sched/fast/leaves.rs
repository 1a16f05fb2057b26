//! Stages that know the fabric: where the uplinks of a fat-tree's leaves
//! (or the spine links of a rail-optimized fabric's groups) are the cut.
//!
//! Node permutations load a leaf's uplinks unevenly: one stage pairs every
//! node of a leaf with a node of another leaf (the uplinks carry `n_ℓ`
//! node-rates of traffic and stretch the stage), the next pairs nodes inside
//! their leaves and leaves the uplinks idle. When the uplinks bind, that
//! idle time is lost. So the node matrix is split into its two layers, the
//! pairs inside a leaf and the pairs across leaves, each is decomposed into
//! permutation stages on its own ([`Decomposer`]), and the two sequences are
//! interleaved in proportion to their estimated durations (a crossing
//! stage lasts as long as its busiest uplink or downlink needs). Consecutive
//! stages overlap in the pipeline (several stages in flight per GPU), so the
//! crossing stages run back to back under the intra-leaf ones: the uplinks
//! carry crossing traffic from the first stage to the last, and the NIC
//! time the crossing sends leave free (they run at the uplink's share)
//! carries the intra-leaf traffic. Every stage is still a partial
//! permutation of nodes. See docs/algorithms.md, `fast` (2b).
//!
//! On a rail-optimized fabric `fast`'s lanes are rail-aligned and balanced
//! over the rails, so each rail switch's spine link carries `1/R` of its
//! group's crossing traffic: the group is the leaf, its spine links
//! together its uplink.

use super::arith::mul_div;
use super::replay::fluid_stage_end;
use super::stages::{Decomposer, StagePair};
use crate::topology::{LinkClass, Topology, Vertex};

/// The layers are interleaved only where the uplink cut is at least this
/// fraction of the NIC cut; below it the uplinks have slack enough for any
/// stage order and the plain node decomposition is kept.
const MIN_PRESSURE: f64 = 0.9;

/// Nor where a node's NICs carry more than this multiple of the average
/// node's (its busiest line over the mean line): there that node binds,
/// and the plain decomposition matches it to real bytes in every stage,
/// while split into two layers its line has stages in both where it idles.
/// Measured (8x8, fat-tree 4:1, MoE Zipf 1.0 with hot receivers in one
/// leaf): plain 1.014-1.095 of the bound, layered 1.121-1.125; on log-normal
/// and intra-node-skewed traffic (even node lines) layered was better in
/// every case (docs/benchmarks.md).
const MAX_SKEW: f64 = 1.25;

/// Where the plain decomposition is kept because a receiver binds, its
/// in-leaf receipts are paired with crossing receipts of its leaf-mates
/// ([`LeafStages::hot_receiver_split`]) when its leaf's downlinks carry at
/// least this fraction of that receiver's NIC cut.
const HOT_DOWNLINK: f64 = 0.9;

/// The crossing receipts of the hot receiver's leaf-mates paired with its
/// in-leaf receipts, as a multiple of what the downlink carries while the
/// hot node takes those at its node rate. Measured on fat-tree 4:1 16x8
/// MoE Zipf 1.2 (seeds 1 and 2, both modes): 0.7, 1.0, 1.1, 1.2, 1.3, 1.5
/// and 2.0 gave a calibrated seed-1 ratio of 1.162, 1.177, 1.154, 1.149,
/// 1.175, 1.202 and 1.193; 1.1 had the best sum over the four
/// (docs/benchmarks.md).
const PAIRED_FILL: f64 = 1.1;

/// The leaves of the fabric and the buffers of the layered decomposition.
#[derive(Clone, Debug)]
pub(crate) struct LeafStages {
    /// Leaf (rail group) of each node.
    leaf: Vec<u32>,
    /// Bytes/us of each leaf's uplinks together (its downlinks are the same).
    up_rate: Vec<f64>,
    /// Bytes/us of one node's NICs together.
    node_rate: f64,
    layer: Vec<u64>,
    cross: Vec<StagePair>,
    intra: Vec<StagePair>,
    /// The layers' stages cut into parts ([`split`]) and the parts'
    /// estimated durations.
    cross_parts: Vec<StagePair>,
    intra_parts: Vec<StagePair>,
    cross_time: Vec<f64>,
    intra_time: Vec<f64>,
    time: Vec<f64>,
    out_load: Vec<u64>,
    in_load: Vec<u64>,
    line: Vec<u64>,
    /// The two parts of [`LeafStages::hot_receiver_split`].
    rest: Vec<u64>,
    paired: Vec<u64>,
    mates: Vec<(u64, u32)>,
}

impl LeafStages {
    /// The fabric's leaves, or `None` when no uplink can be the cut: a
    /// single leaf or rail group, or uplinks as fast as the NICs below them.
    pub fn from_topology(topo: &Topology, node_rate: f64) -> Option<LeafStages> {
        if !topo.is_hierarchical() || topo.leaves() < 2 || node_rate <= 0.0 {
            return None;
        }
        let leaves = topo.leaves();
        let mut up_rate = vec![0.0; leaves];
        for e in topo.graph().edge_indices() {
            let link = topo.link(e.index() as u32);
            if link.class != LinkClass::Uplink {
                continue;
            }
            match topo.link_ends(e.index() as u32).0 {
                Vertex::Leaf(l) | Vertex::Rail(l, _) if *l < leaves => {
                    up_rate[*l] += link.bandwidth
                }
                _ => {}
            }
        }
        let leaf: Vec<u32> = (0..topo.nodes()).map(|a| topo.leaf_of(a) as u32).collect();
        let mut nodes_in = vec![0usize; leaves];
        for &l in &leaf {
            nodes_in[l as usize] += 1;
        }
        let can_bind = (0..leaves).any(|l| up_rate[l] < nodes_in[l] as f64 * node_rate * 0.999);
        can_bind.then(|| LeafStages {
            leaf,
            up_rate,
            node_rate,
            layer: Vec::new(),
            cross: Vec::new(),
            intra: Vec::new(),
            cross_parts: Vec::new(),
            intra_parts: Vec::new(),
            cross_time: Vec::new(),
            intra_time: Vec::new(),
            time: Vec::new(),
            out_load: vec![0; leaves],
            in_load: vec![0; leaves],
            line: Vec::new(),
            rest: Vec::new(),
            paired: Vec::new(),
            mates: Vec::new(),
        })
    }

    /// Whether the last [`LeafStages::decompose`] found no intra-leaf
    /// stages (every node pair crosses the uplinks).
    pub(crate) fn crossing_only(&self) -> bool {
        self.intra_time.is_empty()
    }

    fn crosses(&self, a: usize, b: usize) -> bool {
        self.leaf[a] != self.leaf[b]
    }

    /// The uplink cut over the NIC cut of the node matrix `t` (`n x n`,
    /// row-major; the diagonal is ignored), above 1 where the uplinks bind,
    /// and the busiest node line (row or column sum) over the mean line.
    pub fn pressure(&mut self, n: usize, t: &[u64]) -> (f64, f64) {
        self.out_load.fill(0);
        self.in_load.fill(0);
        let mut line = std::mem::take(&mut self.line);
        line.clear();
        line.resize(2 * n, 0);
        for a in 0..n {
            for b in (0..n).filter(|&b| b != a) {
                let x = t[a * n + b];
                line[a] += x;
                line[n + b] += x;
                if self.crosses(a, b) {
                    self.out_load[self.leaf[a] as usize] += x;
                    self.in_load[self.leaf[b] as usize] += x;
                }
            }
        }
        let busiest = line.iter().copied().max().unwrap_or(0) as f64;
        let mean = line.iter().sum::<u64>() as f64 / line.len().max(1) as f64;
        let nic = busiest / self.node_rate;
        self.line = line;
        let up = (0..self.up_rate.len())
            .map(|l| self.out_load[l].max(self.in_load[l]) as f64 / self.up_rate[l])
            .fold(0.0, f64::max);
        if nic > 0.0 {
            (up / nic, busiest / mean)
        } else {
            (0.0, 0.0)
        }
    }

    /// Decomposes the node matrix `t` into stages appended to `out` (which
    /// must hold no stages yet), numbered from 0, when the uplinks are (near)
    /// the cut; returns the stage count, or `None` (nothing appended) when
    /// the plain node decomposition should be used. `stages_per_node` is
    /// the floor's `s` of docs/algorithms.md (3), applied to each layer
    /// with its own peer count.
    pub fn decompose(
        &mut self,
        dec: &mut Decomposer,
        n: usize,
        t: &[u64],
        stages_per_node: f64,
        part: u64,
        out: &mut Vec<StagePair>,
    ) -> Option<u32> {
        if n != self.leaf.len() {
            return None;
        }
        let (pressure, skew) = self.pressure(n, t);
        if pressure < MIN_PRESSURE || skew > MAX_SKEW {
            return None;
        }
        // Peers of a node in each layer, at most: the floors' divisors.
        let mut nodes_in = vec![0usize; self.up_rate.len()];
        for &l in &self.leaf {
            nodes_in[l as usize] += 1;
        }
        let largest = nodes_in.iter().copied().max().unwrap_or(1);
        let smallest = nodes_in.iter().copied().min().unwrap_or(1);
        let mut layer = std::mem::take(&mut self.layer);
        let mut counts = [0u32; 2];
        for (k, crossing) in [true, false].into_iter().enumerate() {
            layer.clear();
            layer.extend((0..n * n).map(|i| {
                if self.crosses(i / n, i % n) == crossing {
                    t[i]
                } else {
                    0
                }
            }));
            let peers = if crossing { n - smallest } else { largest - 1 };
            let per = stages_per_node * peers.max(1) as f64;
            let buf = if crossing {
                &mut self.cross
            } else {
                &mut self.intra
            };
            buf.clear();
            let floor = |m: u64| (m as f64 / per).ceil() as u64;
            let count = dec.decompose_light_first_with(n, &layer, floor, buf, |_| {});
            counts[k] = count;
        }
        self.layer = layer;
        for (k, crossing) in [true, false].into_iter().enumerate() {
            let mut time = std::mem::take(&mut self.time);
            let pairs = std::mem::take(if crossing {
                &mut self.cross
            } else {
                &mut self.intra
            });
            self.durations(&pairs, counts[k], &mut time);
            let (parts, part_time) = if crossing {
                self.cross = pairs;
                (&mut self.cross_parts, &mut self.cross_time)
            } else {
                self.intra = pairs;
                (&mut self.intra_parts, &mut self.intra_time)
            };
            let pairs = if crossing { &self.cross } else { &self.intra };
            split(pairs, &time, part.max(1), parts, part_time);
            self.time = time;
        }
        Some(self.interleave(out))
    }

    /// The stages `pairs` (sorted by stage) of an `n`-node matrix replayed
    /// as fluid flows over the nodes' NICs (`rate` bytes/us a node) and
    /// these leaves' links, `window` bytes in flight a node
    /// ([`fluid_stage_end`]).
    pub fn replay(&self, n: usize, pairs: &[StagePair], rate: f64, window: f64) -> f64 {
        let leaf: Vec<usize> = self.leaf.iter().map(|&l| l as usize).collect();
        fluid_stage_end(n, pairs, &leaf, &self.up_rate, rate, window)
    }

    /// Where a hot receiver binds (the plain decomposition is kept: uplink
    /// pressure at least `MIN_PRESSURE`, busiest line more than `MAX_SKEW`
    /// of the mean, and that line a column) and its leaf's downlinks carry
    /// at least `HOT_DOWNLINK` of its NIC cut: splits `t` into `rest` and
    /// `paired`, decomposed one after the other (`paired` first). `paired` holds what
    /// the hot node `h` receives from its own leaf, and crossing receipts
    /// of its leaf-mates, `PAIRED_FILL · C_ℓ / node rate` times as many bytes,
    /// spread over the mates by water-filling (none above `h`'s in-leaf
    /// bytes) and over each mate's senders pro rata. In the stages of
    /// `paired` the hot node takes in-leaf bytes while the downlink carries
    /// its mates' crossing bytes; in those of `rest` it takes crossing bytes
    /// with fewer mates' receipts beside it on the downlink. Returns the
    /// busiest line `M*` of `t` and the two parts, or `None`.
    pub fn hot_receiver_split(&mut self, n: usize, t: &[u64]) -> Option<(u64, &[u64], &[u64])> {
        if n != self.leaf.len() {
            return None;
        }
        let (pressure, skew) = self.pressure(n, t);
        if pressure < MIN_PRESSURE || skew <= MAX_SKEW {
            return None;
        }
        let (busiest, m_star) =
            self.line
                .iter()
                .copied()
                .enumerate()
                .fold(
                    (0, 0),
                    |best, (i, x)| if x > best.1 { (i, x) } else { best },
                );
        if busiest < n || m_star == 0 {
            return None; // a sender binds
        }
        let h = busiest - n;
        let l = self.leaf[h] as usize;
        let nic = m_star as f64 / self.node_rate;
        if (self.in_load[l] as f64 / self.up_rate[l]) < HOT_DOWNLINK * nic {
            return None;
        }
        let inner: u64 = (0..n)
            .filter(|&a| a != h && !self.crosses(a, h))
            .map(|a| t[a * n + h])
            .sum();
        self.mates.clear();
        for b in (0..n).filter(|&b| b != h && self.leaf[b] as usize == l) {
            let col: u64 = (0..n)
                .filter(|&a| self.crosses(a, b))
                .map(|a| t[a * n + b])
                .sum();
            if col > 0 {
                self.mates.push((col, b as u32));
            }
        }
        if inner == 0 || self.mates.is_empty() {
            return None;
        }
        // Water-fill `want` bytes over the mates' crossing columns, at most
        // `inner` each.
        let want = (PAIRED_FILL * inner as f64 * self.up_rate[l] / self.node_rate) as u64;
        self.mates.sort_unstable();
        let mut left = want;
        let mut share = vec![0u64; self.mates.len()];
        for (k, &(col, _)) in self.mates.iter().enumerate() {
            let others = (self.mates.len() - k) as u64;
            let s = col.min(inner).min(left / others);
            share[k] = s;
            left -= s;
        }
        let leaf = &self.leaf;
        let paired = &mut self.paired;
        paired.clear();
        paired.resize(n * n, 0);
        for a in (0..n).filter(|&a| a != h && leaf[a] == leaf[h]) {
            paired[a * n + h] = t[a * n + h];
        }
        for (k, &(col, b)) in self.mates.iter().enumerate() {
            let b = b as usize;
            for a in (0..n).filter(|&a| leaf[a] != leaf[b]) {
                paired[a * n + b] = mul_div(t[a * n + b], share[k], col);
            }
        }
        self.rest.clear();
        self.rest
            .extend(t.iter().zip(&self.paired).map(|(&x, &y)| x - y));
        for a in 0..n {
            self.rest[a * n + a] = 0;
        }
        Some((m_star, &self.rest, &self.paired))
    }

    /// Estimated duration of each stage of `pairs` (numbered `0..count`),
    /// us: its heaviest pair at the node rate, or the bytes a leaf sends or
    /// receives across its uplinks in the stage at their rate, if longer.
    fn durations(&mut self, pairs: &[StagePair], count: u32, time: &mut Vec<f64>) {
        time.clear();
        time.resize(count as usize, 0.0);
        for stage in pairs.chunk_by(|x, y| x.stage == y.stage) {
            let s = stage[0].stage as usize;
            let heaviest = stage.iter().map(|p| p.bytes).max().unwrap_or(0);
            let mut d = heaviest as f64 / self.node_rate;
            self.out_load.fill(0);
            self.in_load.fill(0);
            for p in stage {
                let (a, b) = (p.src_node as usize, p.dst_node as usize);
                if self.crosses(a, b) {
                    self.out_load[self.leaf[a] as usize] += p.bytes;
                    self.in_load[self.leaf[b] as usize] += p.bytes;
                }
            }
            for l in 0..self.up_rate.len() {
                let bytes = self.out_load[l].max(self.in_load[l]);
                d = d.max(bytes as f64 / self.up_rate[l]);
            }
            if let Some(x) = time.get_mut(s) {
                *x = d;
            }
        }
    }

    /// Merges the two layers' stages into `out`, each taken when the middle
    /// of its estimated duration comes first as a fraction of its layer's
    /// total, so that both layers run from the first stage to the last.
    /// Returns the stage count.
    fn interleave(&self, out: &mut Vec<StagePair>) -> u32 {
        let total = |t: &[f64]| t.iter().sum::<f64>().max(f64::MIN_POSITIVE);
        let (tx, ti) = (total(&self.cross_time), total(&self.intra_time));
        let (mut i, mut j) = (0usize, 0usize);
        let (mut done_x, mut done_i) = (0.0, 0.0);
        let (mut at_x, mut at_i) = (0usize, 0usize);
        let mut stage = 0u32;
        let (kx, ki) = (self.cross_time.len(), self.intra_time.len());
        while i < kx || j < ki {
            let mid_x = (done_x + self.cross_time.get(i).copied().unwrap_or(0.0) / 2.0) / tx;
            let mid_i = (done_i + self.intra_time.get(j).copied().unwrap_or(0.0) / 2.0) / ti;
            let take_cross = j >= ki || (i < kx && mid_x <= mid_i);
            let (pairs, at, s) = if take_cross {
                done_x += self.cross_time[i];
                i += 1;
                (&self.cross_parts, &mut at_x, i - 1)
            } else {
                done_i += self.intra_time[j];
                j += 1;
                (&self.intra_parts, &mut at_i, j - 1)
            };
            while *at < pairs.len() && pairs[*at].stage as usize == s {
                out.push(StagePair {
                    stage,
                    ..pairs[*at]
                });
                *at += 1;
            }
            stage += 1;
        }
        stage
    }
}

/// Cuts each stage of `pairs` (numbered `0..`, contiguous; `time`: each
/// stage's estimated duration) into as many parts as its heaviest pair has
/// `part`s of bytes, appending them to `parts` (renumbered `0..`) and their
/// durations to `part_time`. A pair of `k` parts' worth of bytes goes in
/// `k` near-equal pieces spread over its stage's parts. Each part is still
/// a partial permutation, and a lane's slice of a part is about one send,
/// so that a GPU's sends in flight alternate between the two layers rather
/// than filling its window with one stage's sends.
fn split(
    pairs: &[StagePair],
    time: &[f64],
    part: u64,
    parts: &mut Vec<StagePair>,
    part_time: &mut Vec<f64>,
) {
    parts.clear();
    part_time.clear();
    let mut next = 0u32;
    for stage in pairs.chunk_by(|x, y| x.stage == y.stage) {
        let heaviest = stage.iter().map(|p| p.bytes).max().unwrap_or(0);
        let m = heaviest.div_ceil(part).max(1);
        let d = time.get(stage[0].stage as usize).copied().unwrap_or(0.0) / m as f64;
        for k in 0..m {
            for p in stage {
                let mp = p.bytes.div_ceil(part).clamp(1, m);
                // Piece `i` of the pair goes to part `i * m / mp`: part `k`
                // holds piece `i` when `i * m / mp == k`.
                let i = (k * mp).div_ceil(m);
                if i >= mp || i * m / mp != k {
                    continue;
                }
                let lo = mul_div(p.bytes, i, mp);
                let hi = mul_div(p.bytes, i + 1, mp);
                if hi > lo {
                    parts.push(StagePair {
                        stage: next,
                        bytes: hi - lo,
                        ..*p
                    });
                }
            }
            part_time.push(d);
            next += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sched::fast::stages::check_partial_permutation;
    use crate::topology::{FabricSpec, TopologySpec};

    fn cluster(nodes: usize, fabric: Option<FabricSpec>) -> Topology {
        let mut spec = TopologySpec::preset("dgx-h100", nodes, None).unwrap();
        spec.fabric = fabric;
        Topology::from_spec(spec, "t").unwrap()
    }

    const NODE_RATE: f64 = 8.0 * 50_000.0;

    /// Bytes of every node pair over a list of stage pairs.
    fn covered(n: usize, pairs: &[StagePair]) -> Vec<u64> {
        let mut c = vec![0; n * n];
        for p in pairs {
            c[p.src_node as usize * n + p.dst_node as usize] += p.bytes;
        }
        c
    }

    #[test]
    fn only_uplinks_that_can_bind_get_leaf_stages() {
        let leaves = |f| LeafStages::from_topology(&cluster(8, f), NODE_RATE).is_some();
        assert!(!leaves(None));
        assert!(!leaves(Some(FabricSpec::fat_tree(4, 1.0, 1.0))));
        assert!(!leaves(Some(FabricSpec::fat_tree(8, 4.0, 1.0))), "one leaf");
        assert!(
            !leaves(Some(FabricSpec::rail_optimized(None, 2.0, 1.0))),
            "one group"
        );
        assert!(leaves(Some(FabricSpec::fat_tree(4, 2.0, 1.0))));
        assert!(leaves(Some(FabricSpec::rail_optimized(Some(4), 2.0, 1.0))));
        let ls = LeafStages::from_topology(
            &cluster(8, Some(FabricSpec::rail_optimized(Some(4), 2.0, 1.0))),
            NODE_RATE,
        )
        .unwrap();
        // A group's 8 rail switches each carry 4 NICs at half rate.
        assert_eq!(ls.up_rate, vec![8.0 * 4.0 * 50_000.0 / 2.0; 2]);
        assert_eq!(ls.leaf, vec![0, 0, 0, 0, 1, 1, 1, 1]);
    }

    #[test]
    fn parts_keep_every_pair_and_every_permutation() {
        let p = |stage, a, b, bytes| StagePair {
            stage,
            src_node: a,
            dst_node: b,
            bytes,
        };
        let pairs = [p(0, 0, 1, 10), p(0, 1, 0, 3), p(1, 0, 2, 5)];
        let (mut parts, mut time) = (Vec::new(), Vec::new());
        split(&pairs, &[6.0, 2.0], 4, &mut parts, &mut time);
        // Stage 0: three parts (10 bytes in pieces of at most 4), stage 1 two.
        assert_eq!(time, vec![2.0, 2.0, 2.0, 1.0, 1.0]);
        assert_eq!(covered(3, &parts), covered(3, &pairs));
        assert!(parts.iter().all(|q| q.bytes <= 4 && q.bytes > 0));
        check_partial_permutation(&parts, 3).unwrap();
        assert!(parts.windows(2).all(|w| w[0].stage <= w[1].stage));
        assert_eq!(parts.last().unwrap().stage, 4);
    }

    #[test]
    fn even_node_matrix_interleaves_the_layers() {
        // 8 nodes in two leaves at 4:1, every pair 64 MB: the uplinks
        // need 16 pairs' time, the NICs 7.
        let topo = cluster(8, Some(FabricSpec::fat_tree(4, 4.0, 1.0)));
        let mut ls = LeafStages::from_topology(&topo, NODE_RATE).unwrap();
        let n = 8;
        let t: Vec<u64> = (0..n * n)
            .map(|i| if i / n == i % n { 0 } else { 64 << 20 })
            .collect();
        let (pressure, skew) = ls.pressure(n, &t);
        assert!((pressure - 16.0 / 7.0).abs() < 1e-9, "{pressure}");
        assert!((skew - 1.0).abs() < 1e-9, "{skew}");
        let mut dec = Decomposer::default();
        let mut out = Vec::new();
        let count = ls
            .decompose(&mut dec, n, &t, 4.0, 8 << 20, &mut out)
            .expect("the uplinks bind");
        check_partial_permutation(&out, n).unwrap();
        assert_eq!(covered(n, &out), t);
        assert_eq!(out.last().map(|p| p.stage + 1), Some(count));
        // The crossing layer needs more than twice the time of the other:
        // no two stages in a row without crossing pairs.
        let crossing = |s: u32| {
            out.iter()
                .any(|p| p.stage == s && p.src_node / 4 != p.dst_node / 4)
        };
        for s in 1..count {
            assert!(crossing(s - 1) || crossing(s), "stages {} and {s}", s - 1);
        }
        assert!((0..count).any(|s| !crossing(s)), "no intra-leaf stage");
    }

    #[test]
    fn hot_receiver_pairs_its_in_leaf_receipts_with_its_mates_crossing_ones() {
        // Fat-tree 4:1, two leaves of 4: node 0 receives 64 MB from every
        // node, its mates 1-3 32 MB from each node of the other leaf, the
        // rest 1 MB per pair. Leaf 0's downlink (256 + 384 MB at one node
        // rate) is the cut, node 0's NICs (448 MB) the busiest line.
        let topo = cluster(8, Some(FabricSpec::fat_tree(4, 4.0, 1.0)));
        let mut ls = LeafStages::from_topology(&topo, NODE_RATE).unwrap();
        let n = 8;
        let t: Vec<u64> = (0..n * n)
            .map(|i| match (i / n, i % n) {
                (a, b) if a == b => 0,
                (_, 0) => 64 << 20,
                (a, 1..=3) if a >= 4 => 32 << 20,
                _ => 1 << 20,
            })
            .collect();
        let (pressure, skew) = ls.pressure(n, &t);
        assert!(
            pressure >= MIN_PRESSURE && skew > MAX_SKEW,
            "{pressure} {skew}"
        );
        let (m, rest, paired) = ls.hot_receiver_split(n, &t).expect("a hot receiver");
        assert_eq!(m, 7 * (64 << 20));
        let (rest, paired) = (rest.to_vec(), paired.to_vec());
        for i in (0..n * n).filter(|&i| i / n != i % n) {
            assert_eq!(rest[i] + paired[i], t[i], "entry {i}");
        }
        // Node 0's in-leaf receipts all in `paired`, its crossing ones none.
        for a in 1..n {
            assert_eq!(paired[a * n], if a < 4 { 64 << 20 } else { 0 }, "{a}");
        }
        // Its mates' crossing receipts: 1.1 x its 192 MB in-leaf bytes,
        // evenly (70.4 MB of each mate's 128 MB), pro rata over the senders.
        let col = |b: usize| (4..n).map(|a| paired[a * n + b]).sum::<u64>();
        let inner = 3 * (64u64 << 20);
        let want = (PAIRED_FILL * inner as f64) as u64;
        let total: u64 = (1..4).map(col).sum();
        assert!(total <= want && total + 8 >= want, "{total} vs {want}");
        assert!((1..4).all(|b| col(b).abs_diff(col(1)) <= 4));
        // Nothing else: no in-leaf pair of the mates, no crossing sender.
        assert!((0..4).all(|a| (1..4).all(|b| paired[a * n + b] == 0)));
        assert!((0..n).all(|a| (4..n).all(|b| paired[a * n + b] == 0)));
        // Uniform traffic has no hot receiver.
        let even: Vec<u64> = (0..n * n)
            .map(|i| if i / n == i % n { 0 } else { 64 << 20 })
            .collect();
        assert!(ls.hot_receiver_split(n, &even).is_none());
    }

    #[test]
    fn nic_bound_matrix_keeps_the_plain_stages() {
        // One hot node receiving from everyone: its NICs are the cut.
        let topo = cluster(8, Some(FabricSpec::fat_tree(4, 2.0, 1.0)));
        let mut ls = LeafStages::from_topology(&topo, NODE_RATE).unwrap();
        let n = 8;
        let t: Vec<u64> = (0..n * n)
            .map(|i| match (i / n, i % n) {
                (a, b) if a == b => 0,
                (_, 0) => 64 << 20,
                _ => 1 << 20,
            })
            .collect();
        let (pressure, skew) = ls.pressure(n, &t);
        assert!(pressure < 1.0 && skew > 2.0, "{pressure} {skew}");
        let mut out = Vec::new();
        let got = ls.decompose(&mut Decomposer::default(), n, &t, 4.0, 8 << 20, &mut out);
        assert_eq!(got, None);
        assert!(out.is_empty());
    }
}
