//! The chunked rotation of a node matrix as a structure, before (or
//! instead of) its stage pairs are written: rotation `k` sends node `a` to
//! `(a + k) mod n`; each pair is cut into pieces of at most `cap` bytes,
//! the partial piece first and the whole ones aligned at the rotation's
//! end, so local stage `t` of rotation `k` holds a piece of every pair of
//! `k` with more than `most[k] - t - 1` pieces; then every stage is
//! numbered by its bytes, lightest first ([`super::stages::chunked_rotation`]
//! writes the pairs in that order).
//!
//! Built in O(n² + stages) from one read of the matrix (each pair's first
//! piece tallied by rotation and piece count; two more where a pair has
//! more than [`TALLIED`] pieces), without the pairs (about
//! `P` = the pieces of every pair: 1.15 million at 512 nodes of log-normal
//! traffic) or their piece counts: one rank's program asks only for the pieces of its node's
//! pairs and for those its chains reach, which [`RotationStages::piece`]
//! gives from the stage's number in O(1); the index of a piece in the
//! written list (what a job exchanges as a GPU's first slice) costs
//! O(n).

use super::arith::Divisor;
use super::stages::{rotation_rank, StagePair};
use crate::rank::radix_sort;

/// The chunked rotation of one node matrix ([`RotationStages::build`]).
#[derive(Clone, Debug, Default)]
pub(crate) struct RotationStages {
    n: usize,
    cap: u64,
    /// Division by `cap`. A pair's pieces (`ceil(x / cap)`, 0 on the
    /// diagonal) are computed where asked from its bytes, not kept: the
    /// matrix itself is not kept either, the queries that need it take it
    /// (`m`, the one it was built from), and a walk down a column reads
    /// one N x N array, not two.
    div: Divisor,
    /// Per rotation: its largest pair's bytes, where the tallies do not
    /// reach its piece count ([`RotationStages::build`]).
    top: Vec<u64>,
    /// Each pair's first piece by (piece count, rotation): its bytes and
    /// how many pairs ([`RotationStages::tally`]).
    tally: Vec<[u64; 2]>,
    /// Per rotation: its first local stage's id and its stage count (its
    /// largest pair's pieces).
    first: Vec<u32>,
    most: Vec<u32>,
    /// Per stage id (rotations in [`rotation_rank`] order, local stages in
    /// order): its rotation, bytes, pairs and stage number.
    rot: Vec<u32>,
    bytes: Vec<u64>,
    count: Vec<u32>,
    number: Vec<u32>,
    /// Per stage number: its stage id, and the index in the written list of
    /// its first pair (one more entry: the pair count).
    id: Vec<u32>,
    starts: Vec<usize>,
    /// Per node: the number of the last stage it sends in (`[a]`) and
    /// receives in (`[n + a]`), `u32::MAX` if none.
    last: Vec<u32>,
    /// The stages' (bytes, id), the radix sort's keys and its second array.
    keys: Vec<(u64, u32)>,
    tmp: Vec<(u64, u32)>,
}

/// The piece counts [`RotationStages::build`] tallies in its one pass: the
/// rotations of the 32- to 512-node MoE Zipf and log-normal 1.0 matrices
/// of `rank_hash` have at most 5 and 16 stages.
const TALLIED: usize = 32;

impl RotationStages {
    /// The chunked rotation of the `n x n` node matrix `t` (row-major, the
    /// diagonal ignored) with pieces of at most `cap` bytes (at least 1),
    /// its buffers reused. Usually one pass over `t`: each pair's first
    /// piece (its bytes and a count) tallied by its rotation and its piece
    /// count, up to [`TALLIED`] pieces; each rotation's stage count is its
    /// largest piece count tallied (its largest pair's: `ceil` is
    /// monotone), and its stages' tallies are read off by piece count. A
    /// pair of more pieces (a hot pair under a small cap) costs two more
    /// passes: each rotation's largest pair, then each pair's first piece
    /// added to its stage ([`RotationStages::tally_by_stage`]).
    pub(crate) fn build(&mut self, n: usize, t: &[u64], cap: u64) {
        self.build_tallying(n, t, cap, TALLIED);
    }

    /// [`RotationStages::build`], tallying piece counts up to `tallied`
    /// (the tests compare both ways).
    fn build_tallying(&mut self, n: usize, t: &[u64], cap: u64, tallied: usize) {
        let cap = cap.max(1);
        (self.n, self.cap, self.div) = (n, cap, Divisor::new(cap));
        for v in [
            &mut self.first,
            &mut self.most,
            &mut self.rot,
            &mut self.count,
        ] {
            v.clear();
        }
        for v in [&mut self.number, &mut self.id, &mut self.last] {
            v.clear();
        }
        self.bytes.clear();
        self.starts.clear();
        if n < 2 {
            self.starts.push(0);
            self.last.resize(2 * n, u32::MAX);
            return;
        }
        let div = self.div;
        // Tallies by (piece count `p`, rotation `k`) at `p n + k`: a row's
        // entries are its rotations in order, each write next to the last
        // one of its piece count.
        let tallied = if self.tally(n, t, tallied) {
            tallied
        } else {
            0
        };
        self.first.resize(n, 0);
        self.most.resize(n, 0);
        if tallied > 0 {
            let tally = &self.tally;
            for (k, most) in self.most.iter_mut().enumerate().skip(1) {
                *most = (1..=tallied)
                    .rev()
                    .find(|&p| tally[p * n + k][1] > 0)
                    .unwrap_or(0) as u32;
            }
        } else {
            // Each rotation's largest pair; piece counts fit in 32 bits:
            // the cap is at least the matrix's largest line over its
            // stages per node (`NodeStages::chunked_cap`).
            let top = &mut self.top;
            top.clear();
            top.resize(n, 0);
            for (a, row) in t[..n * n].chunks_exact(n).enumerate() {
                let (up, down) = top[1..].split_at_mut(n - a - 1);
                for (h, &x) in up.iter_mut().zip(&row[a + 1..]) {
                    *h = (*h).max(x);
                }
                for (h, &x) in down.iter_mut().zip(&row[..a]) {
                    *h = (*h).max(x);
                }
            }
            for (most, &x) in self.most.iter_mut().zip(&self.top).skip(1) {
                *most = div.ceil(x) as u32;
            }
        }
        // The rotations' stages, in their order; where a pair of `p`
        // pieces starts (`end[k] - p`, `end[k]` one past rotation `k`'s
        // last stage id).
        let mut ks: Vec<usize> = (1..n).collect();
        ks.sort_unstable_by_key(|&k| rotation_rank(n, k));
        let mut end = vec![0usize; n];
        for &k in &ks {
            let (f, hi) = (self.bytes.len(), self.most[k] as usize);
            self.first[k] = f as u32;
            end[k] = f + hi;
            self.bytes.resize(f + hi, 0);
            self.count.resize(f + hi, 0);
            self.rot.resize(f + hi, k as u32);
        }
        // A pair of `p` pieces starts at stage `hi - p` of its rotation
        // with its partial piece and sends `cap` in each stage after it:
        // its first piece here, the whole ones by the sums below.
        if tallied > 0 {
            for &k in &ks {
                for p in 1..=self.most[k] as usize {
                    let [bytes, count] = self.tally[p * n + k];
                    // At most `n` pairs.
                    (self.bytes[end[k] - p], self.count[end[k] - p]) = (bytes, count as u32);
                }
            }
        } else {
            self.tally_by_stage(n, t, &end);
        }
        let (bs, cs) = (&mut self.bytes[..], &mut self.count[..]);
        for &k in &ks {
            let (f, hi) = (self.first[k] as usize, self.most[k] as usize);
            let mut started = 0u32;
            for (b, c) in bs[f..f + hi].iter_mut().zip(&mut cs[f..f + hi]) {
                let here = *c;
                *b += u64::from(started) * cap;
                *c += started;
                started += here;
            }
        }
        // Lightest first, ties by id: a stable radix sort of (bytes, id)
        // in id order.
        let stages = self.bytes.len();
        self.keys.clear();
        self.keys.extend(
            self.bytes
                .iter()
                .zip(0..stages as u32)
                .map(|(&b, s)| (b, s)),
        );
        radix_sort(&mut self.keys, &mut self.tmp);
        self.id.extend(self.keys.iter().map(|&(_, s)| s));
        self.number.resize(stages, 0);
        let mut pos = 0;
        for (new, &s) in self.id.iter().enumerate() {
            self.number[s as usize] = new as u32;
            self.starts.push(pos);
            pos += self.count[s as usize] as usize;
        }
        self.starts.push(pos);
        // A rotation's last stage holds a piece of each of its pairs: the
        // rotations by their last stage, latest first, until every node
        // that sends or receives has its last (usually a few rotations).
        self.last.resize(2 * n, u32::MAX);
        ks.retain(|&k| self.most[k] > 0);
        let end = |k: usize| self.number[(self.first[k] + self.most[k] - 1) as usize];
        ks.sort_unstable_by_key(|&k| std::cmp::Reverse(end(k)));
        let mut unset = 2 * n;
        for &k in &ks {
            let e = end(k);
            for a in 0..n {
                let b = if a + k < n { a + k } else { a + k - n };
                if t[a * n + b] > 0 {
                    for at in [a, n + b] {
                        if self.last[at] == u32::MAX {
                            self.last[at] = e;
                            unset -= 1;
                        }
                    }
                }
            }
            if unset == 0 {
                break;
            }
        }
    }

    /// One pass over `t`: each pair's first piece (its bytes, and 1 in
    /// the count) added to `tally[p n + k]` (zeroed first) for a pair of
    /// rotation `k` and `p` pieces, where `p` is at most `tallied`; pairs
    /// of no pieces in row 0, and of more than `tallied` in row `tallied +
    /// 1`, so that no entry takes a branch. False where that last row is
    /// not empty.
    fn tally(&mut self, n: usize, t: &[u64], tallied: usize) -> bool {
        let tally = &mut self.tally;
        tally.clear();
        if tallied == 0 {
            return false;
        }
        tally.resize((tallied + 2) * n, [0, 0]);
        let (div, over) = (self.div, tallied as u64 + 1);
        for (a, row) in t[..n * n].chunks_exact(n).enumerate() {
            // Row `a`'s entries `b > a` are rotations `1..n - a`, those
            // `b < a` rotations `n - a..n`.
            let mut add = |(&x, k): (&u64, usize)| {
                let (p, partial) = div.pieces(x);
                let at = &mut tally[p.min(over) as usize * n + k];
                // Rows 0 and `tallied + 1` are not read: theirs may wrap.
                at[0] = at[0].wrapping_add(partial);
                at[1] += 1;
            };
            row[a + 1..].iter().zip(1..).for_each(&mut add);
            row[..a].iter().zip(n - a..).for_each(&mut add);
        }
        tally[(tallied + 1) * n..].iter().all(|at| at[1] == 0)
    }

    /// Each pair's first piece of `t` added to its stage (`end[k] - p` for
    /// a pair of rotation `k` and `p` pieces), where the tallies do not
    /// reach its piece count.
    fn tally_by_stage(&mut self, n: usize, t: &[u64], end: &[usize]) {
        let div = self.div;
        let (bs, cs) = (&mut self.bytes[..], &mut self.count[..]);
        for (a, row) in t[..n * n].chunks_exact(n).enumerate() {
            let (up, down) = end[1..].split_at(n - a - 1);
            let mut add = |(&x, &e): (&u64, &usize)| {
                let (p, partial) = div.pieces(x);
                if p > 0 {
                    let at = e - p as usize;
                    bs[at] += partial;
                    cs[at] += 1;
                }
            };
            row[a + 1..].iter().zip(up).for_each(&mut add);
            row[..a].iter().zip(down).for_each(&mut add);
        }
    }

    /// Pair `(a, b)`'s pieces (`a != b`; 0 where it sends nothing), from
    /// `m`, the matrix the rotation was built from.
    #[inline]
    fn pieces(&self, m: &[u64], a: usize, b: usize) -> u32 {
        debug_assert_ne!(a, b, "the diagonal is no pair");
        self.div.ceil(m[a * self.n + b]) as u32
    }

    /// The stage pairs, appended to `out` in stage order (within a stage
    /// by sending node): the list [`super::stages::chunked_rotation`]
    /// returns. Returns the stage count.
    pub(crate) fn write_pairs(&self, m: &[u64], out: &mut Vec<StagePair>) -> u32 {
        let (n, cap) = (self.n, self.cap);
        let stages = self.bytes.len();
        let base = out.len();
        out.resize(base + self.pairs(), StagePair::default());
        // Where each stage's next pair goes, by stage id.
        let mut at: Vec<usize> = (0..stages)
            .map(|s| base + self.starts[self.number[s] as usize])
            .collect();
        // Row by row: within a stage, by sending node.
        for a in 0..n {
            for b in (0..n).filter(|&b| b != a) {
                let (p, mut w) = self.div.pieces(m[a * n + b]);
                let p = p as usize;
                if p == 0 {
                    continue;
                }
                let k = if b > a { b - a } else { b + n - a };
                let (f, hi) = (self.first[k] as usize, self.most[k] as usize);
                let (at, number) = (&mut at[f..f + hi], &self.number[f..f + hi]);
                for (pos, &stage) in at[hi - p..].iter_mut().zip(&number[hi - p..]) {
                    out[*pos] = StagePair {
                        stage,
                        src_node: a as u32,
                        dst_node: b as u32,
                        bytes: w,
                    };
                    *pos += 1;
                    w = cap;
                }
            }
        }
        stages as u32
    }

    /// The number of stages.
    pub(crate) fn stage_count(&self) -> u32 {
        self.bytes.len() as u32
    }

    /// The number of stage pairs (every pair's pieces).
    pub(crate) fn pairs(&self) -> usize {
        self.starts.last().copied().unwrap_or(0)
    }

    /// The bytes of every stage together (the matrix off its diagonal).
    pub(crate) fn moved(&self) -> u64 {
        self.bytes.iter().sum()
    }

    /// True when the pieces of every stage carry the same bytes, to within
    /// 1/64 (`Emitter::stages_are_even` of the written pairs). Every local
    /// stage after a rotation's first holds a whole piece (`cap`) of its
    /// largest pair, and the partial pieces that start there.
    pub(crate) fn stages_are_even(&self, m: &[u64]) -> bool {
        let n = self.n;
        let stages = self.bytes.len();
        let (mut lo, mut hi) = (vec![u64::MAX; stages], vec![0u64; stages]);
        for k in 1..n {
            let (f, most) = (self.first[k] as usize, self.most[k] as usize);
            for t in 1..most {
                (lo[f + t], hi[f + t]) = (self.cap, self.cap);
            }
            for a in 0..n {
                let b = if a + k < n { a + k } else { a + k - n };
                let (p, partial) = self.div.pieces(m[a * n + b]);
                if p > 0 {
                    let s = f + most - p as usize;
                    (lo[s], hi[s]) = (lo[s].min(partial), hi[s].max(partial));
                }
            }
        }
        lo.iter().zip(&hi).all(|(&lo, &hi)| hi - lo <= hi / 64)
    }

    /// The rotation and local stage of stage number `q`.
    #[inline]
    pub(crate) fn stage_at(&self, q: u32) -> (usize, u32) {
        let s = self.id[q as usize];
        let k = self.rot[s as usize] as usize;
        (k, s - self.first[k])
    }

    /// The piece of pair `(a, (a + k) mod n)` in local stage `t` of
    /// rotation `k`, if it has one, and the bytes its pair sent in the
    /// pieces before it.
    #[inline]
    pub(crate) fn piece(&self, m: &[u64], k: usize, a: usize, t: u32) -> Option<(StagePair, u64)> {
        let n = self.n;
        let b = if a + k < n { a + k } else { a + k - n };
        self.piece_of(m[a * n + b], k, a, b, t)
    }

    /// [`RotationStages::piece`] of pair `(a, b)` of rotation `k` (`b =
    /// (a + k) mod n`), given its bytes `x` (the matrix entry, read by the
    /// caller).
    #[inline]
    pub(crate) fn piece_of(
        &self,
        x: u64,
        k: usize,
        a: usize,
        b: usize,
        t: u32,
    ) -> Option<(StagePair, u64)> {
        let (p, partial) = self.div.pieces(x);
        let (p, hi) = (p as u32, self.most[k]);
        if p == 0 || t + p < hi {
            return None;
        }
        // The pair's `w`-th piece (0: the partial one).
        let w = u64::from(t + p - hi);
        let (bytes, before) = if w == 0 {
            (partial, 0)
        } else {
            (self.cap, partial + (w - 1) * self.cap)
        };
        let pair = StagePair {
            stage: self.number[(self.first[k] + t) as usize],
            src_node: a as u32,
            dst_node: b as u32,
            bytes,
        };
        Some((pair, before))
    }

    /// Every piece node `a` sends or receives, appended to `out` with the
    /// bytes its pair sent before it, in stage order (within a stage the
    /// piece it receives first when its sender is the lower node, as the
    /// written list has them). A counting sort by stage number (`at`: its
    /// counts, a buffer reused): a node has at most two pieces a stage,
    /// one it sends and one it receives.
    pub(crate) fn pieces_of(
        &self,
        m: &[u64],
        a: usize,
        out: &mut Vec<(StagePair, u64)>,
        at: &mut Vec<u32>,
    ) {
        let n = self.n;
        let start = out.len();
        let stages = self.bytes.len();
        // Node `a`'s two pairs of rotation `k` and their piece counts.
        let pairs = |k: usize| {
            let to = if a + k < n { a + k } else { a + k - n };
            let from = if a >= k { a - k } else { a + n - k };
            [(a, self.pieces(m, a, to)), (from, self.pieces(m, from, a))]
        };
        at.clear();
        at.resize(stages + 1, 0);
        for k in 1..n {
            let (hi, f) = (self.most[k], self.first[k]);
            for (_, p) in pairs(k) {
                for t in hi - p..hi {
                    at[self.number[(f + t) as usize] as usize + 1] += 1;
                }
            }
        }
        for q in 0..stages {
            at[q + 1] += at[q];
        }
        let blank = (StagePair::default(), 0);
        out.resize(start + at[stages] as usize, blank);
        for k in 1..n {
            let hi = self.most[k];
            for (s, p) in pairs(k) {
                for t in hi - p..hi {
                    let x = self
                        .piece(m, k, s, t)
                        .expect("each stage from a pair's first piece holds one of it");
                    let q = &mut at[x.0.stage as usize];
                    out[start + *q as usize] = x;
                    *q += 1;
                }
            }
        }
        for i in start + 1..out.len() {
            let (x, y) = (&out[i - 1].0, &out[i].0);
            if x.stage == y.stage && x.src_node > y.src_node {
                out.swap(i - 1, i);
            }
        }
    }

    /// The first piece, in stage order, that node `a` sends and `carries`
    /// holds for (given the piece and the bytes its pair sent before it).
    pub(crate) fn first_piece_from(
        &self,
        m: &[u64],
        a: usize,
        mut carries: impl FnMut(&StagePair, u64) -> bool,
    ) -> Option<StagePair> {
        let n = self.n;
        let mut first: Option<StagePair> = None;
        for k in 1..n {
            let hi = self.most[k];
            let b = if a + k < n { a + k } else { a + k - n };
            let p = self.pieces(m, a, b);
            for t in hi - p..hi {
                let Some((x, before)) = self.piece(m, k, a, t) else {
                    continue;
                };
                if first.is_some_and(|f| f.stage < x.stage) {
                    // The pair's later pieces are in later stages of its
                    // rotation, not always later stage numbers: go on.
                    continue;
                }
                if carries(&x, before) {
                    first = Some(x);
                }
            }
        }
        first
    }

    /// The index in the written list ([`RotationStages::write_pairs`]) of
    /// `pair`, a piece of this rotation: its stage's first index plus the
    /// pieces of lower sending nodes in its stage. O(n).
    pub(crate) fn index_of(&self, m: &[u64], pair: &StagePair) -> usize {
        let (k, t) = self.stage_at(pair.stage);
        let n = self.n;
        let hi = self.most[k];
        let a = pair.src_node as usize;
        let lower = (0..a)
            .map(|s| self.pieces(m, s, if s + k < n { s + k } else { s + k - n }))
            .filter(|&p| p > 0 && t + p >= hi)
            .count();
        self.starts[pair.stage as usize] + lower
    }

    /// The number of the stage that holds pair index `i` of the written
    /// list, `None` if there is no such pair.
    pub(crate) fn stage_of_index(&self, i: usize) -> Option<u32> {
        if i >= self.pairs() {
            return None;
        }
        // The last stage that starts at or before `i` (empty stages do
        // not exist: every stage holds a piece).
        Some((self.starts.partition_point(|&s| s <= i) - 1) as u32)
    }

    /// The number of the last stage node `a` sends in, `u32::MAX` if none.
    pub(crate) fn last_from(&self, a: usize) -> u32 {
        self.last[a]
    }

    /// The number of the last stage node `b` receives in, `u32::MAX` if
    /// none.
    pub(crate) fn last_into(&self, b: usize) -> u32 {
        self.last[self.n + b]
    }
}

#[cfg(test)]
mod tests {
    use super::super::stages::tests::skewed as matrix;
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// What the structure answers agrees with the pairs it writes:
        /// each stage's pieces, each node's pieces, each piece's index and
        /// its pair's bytes before it, and each node's last stages.
        #[test]
        fn answers_agree_with_the_written_pairs(
            n in 2usize..=24,
            seed in any::<u64>(),
            sparse in 0u64..4,
            cap in 1u64..20_000,
            uniform in any::<bool>(),
        ) {
            // Uniform: even stages (`stages_are_even`) where the cap cuts
            // whole pieces of every pair alike.
            let t = if uniform { vec![cap * 3; n * n] } else { matrix(n, seed, sparse) };
            let mut r = RotationStages::default();
            // Built twice: reused buffers answer as fresh ones.
            r.build(n + 3, &matrix(n + 3, seed ^ 5, 0), cap / 2 + 1);
            r.build(n, &t, cap);
            let mut pairs = Vec::new();
            let count = r.write_pairs(&t, &mut pairs);
            prop_assert_eq!(count, r.stage_count());
            prop_assert_eq!(pairs.len(), r.pairs());
            prop_assert_eq!(r.moved(), pairs.iter().map(|p| p.bytes).sum::<u64>());
            let mut sent = vec![0u64; n * n];
            let mut last = vec![u32::MAX; 2 * n];
            for (i, p) in pairs.iter().enumerate() {
                let (a, b) = (p.src_node as usize, p.dst_node as usize);
                let before = sent[a * n + b];
                sent[a * n + b] += p.bytes;
                let (k, local) = r.stage_at(p.stage);
                prop_assert_eq!((a + k) % n, b);
                prop_assert_eq!(r.piece(&t, k, a, local), Some((*p, before)));
                prop_assert_eq!(r.index_of(&t, p), i);
                prop_assert_eq!(r.stage_of_index(i), Some(p.stage));
                last[a] = p.stage;
                last[n + b] = p.stage;
            }
            prop_assert_eq!(r.stage_of_index(pairs.len()), None);
            for a in 0..n {
                prop_assert_eq!(r.last_from(a), last[a]);
                prop_assert_eq!(r.last_into(a), last[n + a]);
                let mut own = Vec::new();
                r.pieces_of(&t, a, &mut own, &mut Vec::new());
                let mut sent = vec![0u64; n * n];
                let want: Vec<(StagePair, u64)> = pairs
                    .iter()
                    .filter_map(|p| {
                        let at = p.src_node as usize * n + p.dst_node as usize;
                        let before = sent[at];
                        sent[at] += p.bytes;
                        (p.src_node as usize == a || p.dst_node as usize == a).then_some((*p, before))
                    })
                    .collect();
                prop_assert_eq!(own, want);
            }
            let even = pairs.chunk_by(|x, y| x.stage == y.stage).all(|stage| {
                let lo = stage.iter().map(|p| p.bytes).min().unwrap_or(0);
                let hi = stage.iter().map(|p| p.bytes).max().unwrap_or(0);
                hi - lo <= hi / 64
            });
            prop_assert_eq!(r.stages_are_even(&t), even);
            // No piece where the stage holds none of the pair.
            for q in 0..count {
                let (k, local) = r.stage_at(q);
                let held = (0..n).filter(|&a| r.piece(&t, k, a, local).is_some()).count();
                prop_assert_eq!(held, pairs.iter().filter(|p| p.stage == q).count());
            }
        }

        /// The one pass of tallies by piece count builds what adding each
        /// pair's first piece to its stage builds (two more passes, taken
        /// where a pair has more pieces than the tallies reach): the same
        /// stages, numbers and last stages, whatever the tallies reach.
        #[test]
        fn tallies_build_what_the_stage_pass_builds(
            n in 2usize..=20,
            seed in any::<u64>(),
            sparse in 0u64..4,
            pieces in 1u64..40,
        ) {
            let t = matrix(n, seed, sparse);
            // A cap that cuts the largest pair into about `pieces`.
            let cap = t.iter().max().copied().unwrap_or(0).div_ceil(pieces).max(1);
            let mut by_stage = RotationStages::default();
            by_stage.build_tallying(n, &t, cap, 0);
            let mut want = Vec::new();
            by_stage.write_pairs(&t, &mut want);
            let mut r = RotationStages::default();
            for tallied in [1, pieces as usize / 2, TALLIED, 64] {
                r.build_tallying(n, &t, cap, tallied);
                let mut pairs = Vec::new();
                prop_assert_eq!(r.write_pairs(&t, &mut pairs), by_stage.stage_count());
                prop_assert_eq!(&pairs, &want, "tallied {}", tallied);
                prop_assert_eq!(&r.most, &by_stage.most);
                prop_assert_eq!(&r.starts, &by_stage.starts);
                prop_assert_eq!(&r.last, &by_stage.last);
            }
        }
    }
}
