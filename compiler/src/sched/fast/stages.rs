//! Node-level permutation stages: a coarsened Birkhoff–von Neumann
//! decomposition of the node traffic matrix.
//!
//! The node matrix `T` (bytes from node A to node B, diagonal excluded) is
//! padded to `T + Q` whose every row and column sums to `M`, the largest line
//! sum (a scaled doubly-stochastic matrix; padding goes to the diagonal first,
//! where it costs nothing). Each stage is a perfect matching on the support of
//! the remaining matrix, found by augmenting paths that try heavy entries
//! first, warm-started from the previous stage's matching. A stage lasts
//! `w = max(min matched entry, θ)`: every matched pair moves up to `w` real
//! bytes (then padding). The floor `θ` coarsens the decomposition so that the
//! stage count stays near the node count instead of growing towards
//! `N² − 2N + 2`; it costs at most `θ` of idle time on a line per absorbed
//! entry, which the per-NIC pipelining hides (see docs/algorithms.md).
//! Every stage is a partial permutation of nodes by construction.

#[cfg(test)]
use super::rotation::RotationStages;

/// One node pair of one stage.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StagePair {
    pub stage: u32,
    pub src_node: u32,
    pub dst_node: u32,
    /// Real bytes the pair moves in this stage.
    pub bytes: u64,
}

/// Where rotation `k` of `n` nodes runs: the swap (`2k = n`, where every
/// node's partner sends back to it) first, then each rotation beside its
/// inverse, nearest first: `n/2, 1, n-1, 2, n-2, ..`. Sorting by this
/// key is the rotations' order (`Decomposer::rotation_order`). It replaced
/// lightest first (by bytes), which on near-uniform node matrices is an
/// arbitrary order; its lanes drift apart where stages change partners and
/// that order lost up to 7% to this one on the sweep's 4x8 and 8x8 Zipf 0
/// matrices (docs/benchmarks.md, issue 20 §5 of 2026-12-04, "the
/// rotations' order").
pub(super) fn rotation_rank(n: usize, k: usize) -> (bool, usize, usize) {
    (2 * k != n, k.min(n - k), k)
}

/// Reusable buffers of the decomposition.
#[derive(Clone, Debug, Default)]
pub(crate) struct Decomposer {
    /// Entry (a, b) at `a * n + b`: its real bytes left and its total
    /// left (real plus padding), side by side: the searches, the greedy
    /// step and the stage's `w` read the total alone. While (a, b) is row
    /// `a`'s match, its value is in `held[a]` instead (stale here), and
    /// is written back when the match ends.
    cells: Vec<[u64; 2]>,
    row_def: Vec<u64>,
    col_def: Vec<u64>,
    match_row: Vec<u32>,
    match_col: Vec<u32>,
    /// Each matched row's entry: its real bytes left and its total left
    /// plus `drained` (the stages' `w` so far): every stage takes `w` off
    /// every matched total (or all of it), so the second value stays as
    /// it is until the entry runs out (at most `drained`), and a stage
    /// writes only the rows holding real bytes. The search reads a row's
    /// total back (less `drained`) when the row's match moves. An
    /// unmatched row holds `[0, u64::MAX]`. Side by side: the per-stage
    /// passes read these `n` entries, not `n` scattered cells.
    held: Vec<[u64; 2]>,
    /// The stages' `w` added up (see `held`); less than `u64::MAX - cap`
    /// at a stage's start (`cap`: the largest total or `w`), so neither a
    /// held total nor the next stage's sum overflows (else `held` is
    /// rebased: see `rebase_held`).
    drained: u64,
    #[cfg(test)]
    rebased: u32,
    /// The side of the matrix and θ, for the current decomposition.
    n: usize,
    theta: u64,
    /// Words per row of the bit sets below (`ceil(n / 64)`).
    words: usize,
    /// Bit `b` of row `a` (words `a * words..`): entry (a, b)'s total is
    /// positive. The searches visit only these entries.
    live: Vec<u64>,
    /// Columns the current augmenting search has visited.
    seen: Vec<u64>,
    /// Columns the failed searches of this stage closed (see `augment`).
    dead: Vec<u64>,
    /// Free columns (kept as the matching changes).
    free: Vec<u64>,
    /// Bit `b` of row `a`: entry (a, b)'s total is at least θ, so
    /// the greedy step may take it (entries only decrease: once below, it
    /// stays below). Cleared when the entry is written back from `held`:
    /// only free rows' bits are read, and a row's matched entry is
    /// written back before the row is free again.
    big: Vec<u64>,
    /// Live entries per row (bits of `live`). A row without any is out
    /// of the decomposition for good (entries never grow): it is dropped
    /// from `free_rows` instead of being tried, and failing, every stage.
    row_live: Vec<u32>,
    /// Bit `k` of row `a`: word `k` of the row's `live` bits is not zero
    /// (`masked`: where a row has 4 to 64 words; at 2 words the plain scan
    /// costs less): the searches skip the empty words of a row, which grow
    /// as its entries are exhausted.
    live_words: Vec<u64>,
    masked: bool,
    /// Free rows in increasing order (the next stage's greedy step), and
    /// the rows whose search failed / whose match was exhausted this stage.
    free_rows: Vec<u32>,
    order: Vec<u32>,
    /// The search's stack (`try_row`).
    path: Vec<[u32; 3]>,
    exhausted: Vec<u32>,
    /// Stage reordering: where each stage starts, its real bytes and the
    /// new order.
    stage_at: Vec<usize>,
    stage_bytes: Vec<u64>,
    stage_order: Vec<u32>,
    /// Tests' reference of the two steps (`decompose`, then
    /// `order_light_first`): `(start, end, count)` of the stages the last
    /// `decompose` appended to its `out`, whose `stage_at` and
    /// `stage_bytes` it left (the next `order_light_first` of exactly
    /// those stages does not count them again), and the reordered pairs.
    #[cfg(test)]
    recorded: Option<(usize, usize, u32)>,
    #[cfg(test)]
    reordered: Vec<StagePair>,
    /// The pairs of the last extraction ([`Decomposer::extract`]), in
    /// extraction order, each stage from `stage_at[s]` on: 16 bytes a
    /// pair, not a [`StagePair`]'s 24, and written into the caller's
    /// stages once, in their final order
    /// ([`Decomposer::decompose_light_first_with`]).
    drawn: Vec<Drawn>,
    /// How many pairs the last extraction drew: `drawn` is released once
    /// the stages are written (at 512 nodes up to 1.15 million pairs, 18 MB
    /// of pairs, 34 MB of capacity grown by doubling, no longer held while
    /// the rank's program is emitted) and the next extraction reserves
    /// this many at once.
    drawn_hint: usize,
}

/// One pair of an extraction: its stage is where it sits
/// (`Decomposer::stage_at`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Drawn {
    src: u32,
    dst: u32,
    bytes: u64,
}

impl Drawn {
    fn pair(&self, stage: u32) -> StagePair {
        StagePair {
            stage,
            src_node: self.src,
            dst_node: self.dst,
            bytes: self.bytes,
        }
    }
}

const NONE: u32 = u32::MAX;

impl Decomposer {
    /// Decomposes the `n x n` node matrix `t` (row-major) into stages appended
    /// to `out`, in extraction order; `stage_floor(max_line)` gives θ.
    /// Returns the stage count. The tests' reference:
    /// [`Decomposer::decompose_light_first_with`] plans.
    #[cfg(test)]
    pub fn decompose(
        &mut self,
        n: usize,
        t: &[u64],
        stage_floor: impl Fn(u64) -> u64,
        out: &mut Vec<StagePair>,
    ) -> u32 {
        let start = out.len();
        let count = self.extract(n, t, stage_floor);
        out.reserve_exact(self.drawn.len());
        for s in 0..count as usize {
            let (lo, hi) = (self.stage_at[s], self.stage_at[s + 1]);
            out.extend(self.drawn[lo..hi].iter().map(|d| d.pair(s as u32)));
        }
        self.recorded = Some((start, out.len(), count));
        count
    }

    /// Decomposes the `n x n` node matrix `t` (row-major) into stages
    /// appended to `out`, lightest first; `stage_floor(max_line)` gives θ.
    /// Returns the stage count, and gives `f` each pair as it is written,
    /// in order (the stages priced in the same pass that writes them).
    ///
    /// The extraction ([`Decomposer::extract`]) draws the stages in a
    /// ragged order: heavy full permutations alternate with partial stages
    /// of a few pairs, and the last stages are the decomposition's
    /// leftovers, a few uneven pairs. Run last, those make a ragged finish
    /// (some nodes done, others still sending) that nothing can fill; run
    /// first, when every node starts together, their gaps are filled by
    /// the stages behind them in the pipeline, and the exchange ends on the
    /// heaviest stages, full permutations whose pairs carry near-equal
    /// bytes and finish together. Stages of similar weight also end up next
    /// to each other, so the sends in flight at once are of similar length.
    /// See docs/algorithms.md (3) for the measurements. So the stages are
    /// written in order of their real bytes, lightest first (ties keep the
    /// extraction order), numbered `0..count` in that order, each
    /// contiguous: what `decompose` then `order_light_first` give (the
    /// tests' reference), written once, from the extraction's pairs of 16
    /// bytes, without the stages in extraction order in `out` (at 512
    /// nodes, 1.15 million pairs: 18 MB, not 28 MB again).
    pub(crate) fn decompose_light_first_with(
        &mut self,
        n: usize,
        t: &[u64],
        stage_floor: impl Fn(u64) -> u64,
        out: &mut Vec<StagePair>,
        mut f: impl FnMut(&StagePair),
    ) -> u32 {
        let count = self.extract(n, t, stage_floor);
        out.reserve_exact(self.drawn.len());
        let k = count as usize;
        let mut write = |out: &mut Vec<StagePair>, lo: usize, hi: usize, stage: usize| {
            let from = out.len();
            out.extend(self.drawn[lo..hi].iter().map(|d| d.pair(stage as u32)));
            out[from..].iter().for_each(&mut f);
        };
        if k < 2 {
            // Nothing to reorder: the extraction's own order.
            for s in 0..k {
                write(out, self.stage_at[s], self.stage_at[s + 1], s);
            }
            self.release_drawn();
            return count;
        }
        self.stage_order.clear();
        self.stage_order.extend(0..count);
        let bytes = &self.stage_bytes;
        self.stage_order
            .sort_unstable_by_key(|&s| (bytes[s as usize], s));
        for (new, &s) in self.stage_order.iter().enumerate() {
            let (lo, hi) = (self.stage_at[s as usize], self.stage_at[s as usize + 1]);
            write(out, lo, hi, new);
        }
        self.release_drawn();
        count
    }

    /// Frees the extraction's pairs once written, keeping their count for
    /// the next extraction's reservation (`drawn_hint`).
    fn release_drawn(&mut self) {
        self.drawn_hint = self.drawn.len();
        self.drawn = Vec::new();
    }

    /// The extraction of [`Decomposer::decompose`]: its stages' pairs into
    /// `drawn`, where each stage starts (`stage_at`) and its real bytes
    /// (`stage_bytes`). Returns the stage count.
    ///
    /// Per stage it touches the matched rows' entries (`held`, side by
    /// side), the rows whose match ended (exhausted, or still unmatched)
    /// and the columns their searches visit; no pass over the matrix.
    fn extract(&mut self, n: usize, t: &[u64], stage_floor: impl Fn(u64) -> u64) -> u32 {
        #[cfg(test)]
        {
            self.recorded = None;
            self.rebased = 0;
        }
        self.drawn.clear();
        if self.drawn.capacity() == 0 {
            // Released by the last decomposition: as many as it drew, at once.
            self.drawn.reserve_exact(self.drawn_hint);
        }
        self.cells.clear();
        // (Real, total): the padding is added to the total.
        self.cells.extend(t.iter().map(|&x| [x, x]));
        for a in 0..n {
            self.cells[a * n + a] = [0, 0];
        }
        let mut real_left: u64 = self.cells.iter().map(|c| c[0]).sum();
        if real_left == 0 {
            // No stage (and none for the next `order_light_first` to
            // count, in the tests' reference).
            self.stage_at.clear();
            self.stage_at.push(0);
            self.stage_bytes.clear();
            return 0;
        }
        let m = self.pad_to_doubly_stochastic(n);
        let theta = stage_floor(m).max(1);
        self.n = n;
        self.theta = theta;
        self.match_row.clear();
        self.match_row.resize(n, NONE);
        self.match_col.clear();
        self.match_col.resize(n, NONE);
        self.held.clear();
        self.held.resize(n, [0, u64::MAX]);
        self.drained = 0;
        // The largest total or `w` (see `drained`).
        let cap = m.max(theta);
        let words = n.div_ceil(64);
        self.words = words;
        self.live.clear();
        self.live.resize(n * words, 0);
        self.big.clear();
        self.big.resize(n * words, 0);
        self.row_live.clear();
        self.row_live.resize(n, 0);
        self.masked = (4..=64).contains(&words);
        self.live_words.clear();
        self.live_words.resize(n, 0);
        for a in 0..n {
            let row = &self.cells[a * n..(a + 1) * n];
            let (live, big) = (
                &mut self.live[a * words..(a + 1) * words],
                &mut self.big[a * words..(a + 1) * words],
            );
            // A word of bits per 64 columns, each built in a register.
            for ((chunk, live), big) in row.chunks(64).zip(live.iter_mut()).zip(big.iter_mut()) {
                let (mut l, mut g) = (0u64, 0u64);
                for (i, &[_, x]) in chunk.iter().enumerate() {
                    l |= u64::from(x > 0) << i;
                    g |= u64::from(x >= theta) << i;
                }
                (*live, *big) = (l, g);
            }
            self.row_live[a] = live.iter().map(|w| w.count_ones()).sum();
            if self.masked {
                self.live_words[a] = live
                    .iter()
                    .enumerate()
                    .filter(|&(_, &w)| w != 0)
                    .fold(0, |m, (k, _)| m | 1 << k);
            }
        }
        self.seen.clear();
        self.seen.resize(words, 0);
        self.dead.clear();
        self.dead.resize(words, 0);
        self.free.clear();
        self.free.resize(words, 0);
        for b in 0..n {
            self.free[b / 64] |= 1 << (b % 64);
        }
        self.free_rows.clear();
        self.free_rows.extend(0..n as u32);
        self.path.clear();
        self.path.resize(n + 1, [0; 3]);
        let mut stage = 0u32;
        self.stage_at.clear();
        self.stage_at.push(0);
        self.stage_bytes.clear();
        while real_left > 0 {
            if self.drained >= u64::MAX - cap {
                self.rebase_held();
            }
            self.augment();
            // The stage's `w`: the least matched total (unmatched rows hold
            // `u64::MAX`).
            let least = self.held.iter().map(|h| h[1]).min().unwrap_or(u64::MAX);
            if least == u64::MAX && self.match_row.iter().all(|&b| b == NONE) {
                break; // nothing left to match (cannot happen while real bytes remain)
            }
            let w = least - self.drained;
            if w == u64::MAX {
                break; // as the plain statement does
            }
            let w = w.max(theta);
            let mut stage_sum = 0;
            self.exhausted.clear();
            // Every matched total less `w` (or all of it): `drained` plus
            // `w`. Rows holding real bytes take `r` of them (then padding
            // up to `w`); rows holding padding only are read only where
            // they run out.
            let drained = self.drained + w;
            let (drawn, exhausted) = (&mut self.drawn, &mut self.exhausted);
            let (match_row, held) = (&self.match_row[..n], &mut self.held[..n]);
            for (a, h) in held.iter_mut().enumerate() {
                let [real, total] = *h;
                if real == 0 && total > drained {
                    continue;
                }
                let r = real.min(w);
                if r > 0 {
                    stage_sum += r;
                    drawn.push(Drawn {
                        src: a as u32,
                        dst: match_row[a],
                        bytes: r,
                    });
                }
                if total <= drained {
                    *h = [0, u64::MAX];
                    exhausted.push(a as u32);
                } else {
                    h[0] = real - r;
                }
            }
            self.drained = drained;
            real_left -= stage_sum;
            let any = stage_sum > 0;
            // Exhausted: out of the support and of the matching (the next
            // stage matches the row again, if it has live entries left).
            // Over the fields as slices, bound once for the stage; the rows
            // left without live entries dropped from the list in place.
            let masked = self.masked;
            let (row_live, match_row) = (&mut self.row_live[..n], &mut self.match_row[..n]);
            let (match_col, free) = (&mut self.match_col[..n], &mut self.free[..words]);
            let (live, big) = (&mut self.live[..n * words], &mut self.big[..n * words]);
            let (cells, live_words) = (&mut self.cells[..n * n], &mut self.live_words[..n]);
            let mut kept = 0;
            for i in 0..self.exhausted.len() {
                let a = self.exhausted[i] as usize;
                let b = match_row[a] as usize;
                cells[a * n + b] = [0, 0];
                let (k, bit) = (b / 64, 1u64 << (b % 64));
                let word = a * words + k;
                live[word] &= !bit;
                if masked && live[word] == 0 {
                    live_words[a] &= !(1 << k);
                }
                big[word] &= !bit;
                match_row[a] = NONE;
                match_col[b] = NONE;
                free[k] |= bit;
                row_live[a] -= 1;
                // A row without live entries stays free for good.
                if row_live[a] > 0 {
                    self.exhausted[kept] = a as u32;
                    kept += 1;
                }
            }
            self.exhausted.truncate(kept);
            if any {
                stage += 1;
                self.stage_bytes.push(stage_sum);
                self.stage_at.push(self.drawn.len());
            }
            // The next stage's free rows, in order: those still unmatched
            // (in `free_rows`, increasing) and those just exhausted, less
            // the rows without live entries (no greedy entry, and a search
            // that visits nothing: they stay free for good; dropped above).
            if !self.exhausted.is_empty() {
                if self.free_rows.is_empty() {
                    std::mem::swap(&mut self.free_rows, &mut self.exhausted);
                } else {
                    self.order.clear();
                    merge_sorted(&self.free_rows, &self.exhausted, &mut self.order);
                    std::mem::swap(&mut self.free_rows, &mut self.order);
                }
            }
        }
        stage
    }

    /// Takes `drained` off every matched row's held total, and sets it
    /// to zero (see `drained`).
    fn rebase_held(&mut self) {
        let drained = self.drained;
        for (&b, h) in self.match_row.iter().zip(&mut self.held) {
            if b != NONE {
                h[1] -= drained;
            }
        }
        self.drained = 0;
        #[cfg(test)]
        {
            self.rebased += 1;
        }
    }

    /// Puts the `count` stages appended to `out` from `start` on (numbered
    /// `0..count` in extraction order, each contiguous) in order of their
    /// real bytes, lightest first (ties keep the extraction order), and
    /// numbers them again in that order (why: see
    /// [`Decomposer::decompose_light_first_with`], which plans; this is the
    /// tests' reference).
    #[cfg(test)]
    pub fn order_light_first(&mut self, out: &mut Vec<StagePair>, start: usize, count: u32) {
        self.order_light_first_with(out, start, count, |_| {});
    }

    /// [`Decomposer::order_light_first`], giving `f` each pair in its new
    /// place, in order (every pair of `out[start..]` as it is where there
    /// is nothing to reorder): the reordered stages priced in the same pass
    /// that writes them.
    #[cfg(test)]
    pub(crate) fn order_light_first_with(
        &mut self,
        out: &mut Vec<StagePair>,
        start: usize,
        count: u32,
        mut f: impl FnMut(&StagePair),
    ) {
        let k = count as usize;
        let recorded = self.recorded.take() == Some((start, out.len(), count));
        if k < 2 {
            out[start..].iter().for_each(f);
            return;
        }
        if !recorded {
            self.stage_at.clear();
            self.stage_at.resize(k + 1, 0);
            self.stage_bytes.clear();
            self.stage_bytes.resize(k, 0);
            for p in &out[start..] {
                let s = p.stage as usize;
                self.stage_bytes[s] += p.bytes;
                self.stage_at[s + 1] += 1;
            }
            for s in 0..k {
                self.stage_at[s + 1] += self.stage_at[s];
            }
        }
        self.stage_order.clear();
        self.stage_order.extend(0..count);
        let bytes = &self.stage_bytes;
        self.stage_order
            .sort_unstable_by_key(|&s| (bytes[s as usize], s));
        // Written once: into `reordered` after a copy of what precedes
        // `start`, and the buffers swapped.
        self.reordered.clear();
        self.reordered.extend_from_slice(&out[..start]);
        for (new, &s) in self.stage_order.iter().enumerate() {
            let (lo, hi) = (self.stage_at[s as usize], self.stage_at[s as usize + 1]);
            let from = self.reordered.len();
            self.reordered
                .extend(out[start + lo..start + hi].iter().map(|p| StagePair {
                    stage: new as u32,
                    ..*p
                }));
            self.reordered[from..].iter().for_each(&mut f);
        }
        std::mem::swap(out, &mut self.reordered);
    }

    /// The rotation stages of the `n x n` node matrix `t` (row-major, the
    /// diagonal ignored), appended to `out`: stage `k` (for `k` in `1..n`)
    /// sends every node `a` its whole pair to node `(a + k) mod n`, so each
    /// stage is a permutation. The rotations run in [`rotation_rank`]'s
    /// order (the swap first, then each beside its inverse); stages
    /// without bytes are dropped. O(n²), no search. Returns the stage
    /// count.
    #[cfg(test)]
    pub fn rotate(&mut self, n: usize, t: &[u64], out: &mut Vec<StagePair>) -> u32 {
        self.rotation_order(n, t);
        self.rotation_pairs(n, t, |p| out.push(p))
    }

    /// Where [`Decomposer::rotate`]'s stages end as `chains` prices them
    /// ([`StageChains::end_of_permutations`]) at `rate`, without writing
    /// the stages; then [`Decomposer::rotation_pairs`] writes them.
    pub(crate) fn rotation_end(
        &mut self,
        n: usize,
        t: &[u64],
        chains: &mut StageChains,
        rate: f64,
    ) -> f64 {
        self.rotation_order(n, t);
        if !chains.start(n) {
            return 0.0;
        }
        // `rotation_pairs`' pairs, each priced as `chains.step` prices it.
        for &k in &self.stage_order {
            let k = k as usize;
            if self.stage_bytes[k] != 0 {
                chains.rotation(n, k, t, rate);
            }
        }
        chains.finish()
    }

    /// Each rotation's bytes (`stage_bytes`) and their order
    /// (`stage_order`, [`rotation_rank`]'s).
    fn rotation_order(&mut self, n: usize, t: &[u64]) {
        self.stage_bytes.clear();
        self.stage_bytes.resize(n, 0);
        // Row `a`'s entries past the diagonal are rotations `1..n - a`,
        // those before it `n - a..n`: two runs of adds, no branch.
        for a in 0..n {
            let row = &t[a * n..(a + 1) * n];
            let (after, before) = self.stage_bytes.split_at_mut(n - a);
            for (k, &x) in after[1..].iter_mut().zip(&row[a + 1..]) {
                *k += x;
            }
            for (k, &x) in before.iter_mut().zip(&row[..a]) {
                *k += x;
            }
        }
        self.stage_order.clear();
        self.stage_order.extend(1..n as u32);
        self.stage_order
            .sort_unstable_by_key(|&k| rotation_rank(n, k as usize));
    }

    /// The rotation stages in the order [`Decomposer::rotation_order`]
    /// left, each pair given to `f`; returns the stage count.
    pub(crate) fn rotation_pairs(&self, n: usize, t: &[u64], mut f: impl FnMut(StagePair)) -> u32 {
        let mut stage = 0u32;
        for &k in &self.stage_order {
            let k = k as usize;
            if self.stage_bytes[k] == 0 {
                continue;
            }
            for a in 0..n {
                let b = if a + k < n { a + k } else { a + k - n };
                let bytes = t[a * n + b];
                if bytes > 0 {
                    f(StagePair {
                        stage,
                        src_node: a as u32,
                        dst_node: b as u32,
                        bytes,
                    });
                }
            }
            stage += 1;
        }
        stage
    }

    /// Adds the padding to `cells[..][1]` (real bytes or, in the tests'
    /// reference, zero) so every line of real bytes plus padding sums to
    /// the largest line sum `M`, and returns `M`.
    fn pad_to_doubly_stochastic(&mut self, n: usize) -> u64 {
        self.row_def.clear();
        self.col_def.clear();
        self.col_def.resize(n, 0);
        for a in 0..n {
            let row = &self.cells[a * n..(a + 1) * n];
            self.row_def.push(row.iter().map(|c| c[0]).sum());
            for (c, &[x, _]) in self.col_def.iter_mut().zip(row) {
                *c += x;
            }
        }
        let m = self
            .row_def
            .iter()
            .chain(&self.col_def)
            .copied()
            .max()
            .unwrap_or(0);
        for a in 0..n {
            self.row_def[a] = m - self.row_def[a];
            self.col_def[a] = m - self.col_def[a];
            // Diagonal first: a node idling is free.
            let d = self.row_def[a].min(self.col_def[a]);
            self.cells[a * n + a][1] = d;
            self.row_def[a] -= d;
            self.col_def[a] -= d;
        }
        // North-west corner rule for the rest (the deficits sum to the same).
        let (mut a, mut b) = (0, 0);
        while a < n && b < n {
            let x = self.row_def[a].min(self.col_def[b]);
            self.cells[a * n + b][1] += x;
            self.row_def[a] -= x;
            self.col_def[b] -= x;
            if self.row_def[a] == 0 {
                a += 1;
            } else {
                b += 1;
            }
        }
        m
    }

    /// Completes the matching: each free row (in order) first takes its
    /// heaviest free column of at least `theta` (so stages take large, even
    /// amounts), then augmenting paths complete it. Leaves the rows still
    /// unmatched in `free_rows`, in order.
    fn augment(&mut self) {
        // Rows of one or two words (up to 128 nodes) with the word count a
        // constant: the scans over a row's words unrolled, without bounds
        // checks. The same steps.
        match (self.masked, self.words) {
            (false, 1) => self.augment_words::<1>(),
            (false, 2) => self.augment_words::<2>(),
            _ => self.augment_words::<0>(),
        }
    }

    /// [`Decomposer::augment`] with `W` words per row (`self.words`, and no
    /// mask of live words), or any count when `W` is 0.
    #[inline(always)]
    fn augment_words<const W: usize>(&mut self) {
        let n = self.n;
        let words = if W == 0 { self.words } else { W };
        self.order.clear();
        let mut rows = std::mem::take(&mut self.free_rows);
        // (Over the fields as slices: not reloaded per row.)
        let (big, cells, free) = (&self.big[..], &self.cells[..], &mut self.free[..words]);
        let (match_row, match_col) = (&mut self.match_row[..], &mut self.match_col[..]);
        let (held, order) = (&mut self.held[..], &mut self.order);
        let drained = self.drained;
        for &a in &rows {
            let a = a as usize;
            // The lowest column of the largest entry of at least `theta`.
            let mut best = (0, NONE);
            let row_big = &big[a * words..][..words];
            let row = &cells[a * n..][..n];
            for (k, (&big, &free)) in row_big.iter().zip(&*free).enumerate() {
                let mut cand = big & free;
                while cand != 0 {
                    let b = k * 64 + cand.trailing_zeros() as usize;
                    cand &= cand - 1;
                    let x = row[b][1];
                    if x > best.0 {
                        best = (x, b as u32);
                    }
                }
            }
            if best.1 != NONE {
                let b = best.1 as usize;
                match_row[a] = best.1;
                match_col[b] = a as u32;
                held[a] = [row[b][0], row[b][1] + drained];
                free[b / 64] &= !(1 << (b % 64));
            } else {
                order.push(a as u32);
            }
        }
        // A failed search explores every reachable row, so only one pass
        // through any positive entry: the greedy step already took the heavy ones.
        // A failed search leaves the matching as it was and marks a closed
        // set of columns (each matched, every live column of its owner in
        // the set). A later search's augmenting path cannot pass through
        // it, so its columns keep their owners and the set stays closed
        // for the rest of this stage, whatever the searches between
        // change: a later search entering it fails there and marks only
        // its columns. So every search starts with those columns seen
        // (`dead`, the union of the failed searches' sets) and finds the
        // same path as from nothing seen (the same lowest-column-first
        // search, less its dead ends).
        let order = std::mem::take(&mut self.order);
        self.dead.fill(0);
        rows.clear();
        for &a in &order {
            // A row whose live columns are all dead fails at once.
            let row_live = &self.live[a as usize * words..(a as usize + 1) * words];
            let dead = &self.dead[..words];
            if row_live.iter().zip(dead).all(|(&l, &d)| l & !d == 0) {
                rows.push(a);
                continue;
            }
            self.seen[..words].copy_from_slice(dead);
            if !self.try_row::<W>(a as usize) {
                self.dead[..words].copy_from_slice(&self.seen[..words]);
                rows.push(a);
            }
        }
        self.order = order;
        self.free_rows = rows;
    }

    /// Kuhn's augmenting path from row `a` through positive entries, lowest
    /// column first: a depth-first search on an explicit stack (`path`:
    /// each row on it below the one being scanned, the word its scan is
    /// at, and the column it went down through), the same visits in the
    /// same order as the recursive statement, each row resuming its scan
    /// where it was. The row being scanned and its word are held apart
    /// from the stack (written there when it goes down, read back when a
    /// row above it fails).
    /// `W`: as in [`Decomposer::augment_words`].
    #[inline(always)]
    fn try_row<const W: usize>(&mut self, a: usize) -> bool {
        let words = if W == 0 { self.words } else { W };
        let seen = &mut self.seen[..words];
        let (live, match_col) = (&self.live[..], &self.match_col[..]);
        let (masked, live_words) = (W == 0 && self.masked, &self.live_words[..]);
        // The stack holds each row at most once: `n + 1` entries, sized
        // once per decomposition, indexed by `depth` (no push or pop).
        let path = &mut self.path[..];
        // Words of `seen` below `lo` are full: no row finds a column there,
        // so the scans start at `lo` (seen only grows during a search).
        // Kept where the word count is not a constant: with one or two
        // words, skipping a full word costs less than keeping `lo`.
        let full = |w: u64| w == u64::MAX;
        let track = W == 0;
        let mut lo = if track {
            seen.iter().position(|&w| !full(w)).unwrap_or(words)
        } else {
            0
        };
        // The row being scanned, the word its scan resumes at, and its
        // place on the stack.
        let (mut row, mut at, mut depth) = (a, 0usize, 0usize);
        let (k, bit) = loop {
            let row_live = &live[row * words..][..words];
            let mut k = at.max(lo);
            let mut cand = 0;
            if masked {
                // Only the row's words with live bits (the same first
                // word with an unseen live column as the plain scan).
                let mut m = if k < 64 {
                    live_words[row] & (u64::MAX << k)
                } else {
                    0
                };
                k = words;
                while m != 0 {
                    let w = m.trailing_zeros() as usize;
                    cand = row_live[w] & !seen[w];
                    if cand != 0 {
                        k = w;
                        break;
                    }
                    m &= m - 1;
                }
            } else {
                while k < words {
                    cand = row_live[k] & !seen[k];
                    if cand != 0 {
                        break;
                    }
                    k += 1;
                }
            }
            if k >= words {
                // Every column of this row fails: back to its parent.
                if depth == 0 {
                    return false;
                }
                depth -= 1;
                let [parent, word, _] = path[depth];
                (row, at) = (parent as usize, word as usize);
                continue;
            }
            let bit = cand.trailing_zeros() as usize;
            seen[k] |= 1 << bit;
            if track && k == lo {
                while lo < words && full(seen[lo]) {
                    lo += 1;
                }
            }
            let b = k * 64 + bit;
            path[depth] = [row as u32, k as u32, b as u32];
            let owner = match_col[b];
            if owner == NONE {
                break (k, bit);
            }
            depth += 1;
            (row, at) = (owner as usize, 0);
        };
        // A free column: every row on the path takes the column it went
        // down through.
        self.free[k] &= !(1 << bit);
        // Each row matched to its column: its previous match's entry
        // written back from `held` (and its `big` bit cleared, if it fell
        // below θ), the new one's read into `held`. Each row and column is
        // on the path once, so the order does not matter: from the top,
        // where a row's previous match is the column the row above it went
        // down through (its owner was the row), and the search's row, free,
        // had none. Over the fields as slices, bound once for the path.
        let (n, theta) = (self.n, self.theta);
        let (cells, big, held) = (&mut self.cells[..], &mut self.big[..], &mut self.held[..]);
        let (match_row, match_col) = (&mut self.match_row[..], &mut self.match_col[..]);
        // Totals held plus `drained` (see `held`).
        let drained = self.drained;
        #[cfg(test)]
        assert_eq!(match_row[a], NONE, "the search's row is free");
        let mut old = NONE;
        for &[row, _, col] in &self.path[..=depth] {
            let (a, b) = (row as usize, col as usize);
            #[cfg(test)]
            assert_eq!(match_row[a], old, "row {a} owned the column above it");
            let cells = &mut cells[a * n..][..n];
            if old != NONE {
                let old = old as usize;
                let kept = [held[a][0], held[a][1] - drained];
                cells[old] = kept;
                if kept[1] < theta {
                    big[a * words + old / 64] &= !(1 << (old % 64));
                }
            }
            match_row[a] = col;
            match_col[b] = row;
            held[a] = [cells[b][0], cells[b][1] + drained];
            old = col;
        }
        true
    }
}

/// The chunked rotation of the `n x n` node matrix `t` (row-major, the
/// diagonal ignored), appended to `out` with stages numbered from 0:
/// rotation `k` (node `a` to `(a + k) mod n`, in [`rotation_rank`]'s order)
/// with each of its pairs cut into pieces of at most `cap` bytes, the
/// partial piece first and the whole ones aligned at the rotation's end,
/// so stage `(k, j)` holds piece `j` of every pair of rotation `k` that
/// has that many; then every stage ordered by its bytes, lightest first
/// (ties in that order), as the decomposition's stages are. No search:
/// O(n² + stage pairs) ([`RotationStages`], which one rank's program reads
/// without the pairs; docs/algorithms.md, `fast` (2), "The chunked
/// rotation"). Returns the stage count. The tests' form: the planner
/// keeps its [`RotationStages`] buffers (`NodeStages`).
#[cfg(test)]
pub(crate) fn chunked_rotation(n: usize, t: &[u64], cap: u64, out: &mut Vec<StagePair>) -> u32 {
    let mut r = RotationStages::default();
    r.build(n, t, cap);
    r.write_pairs(t, out)
}

/// Merges the increasing lists `x` and `y` (disjoint) into `out`.
fn merge_sorted(x: &[u32], y: &[u32], out: &mut Vec<u32>) {
    let (mut i, mut j) = (0, 0);
    while i < x.len() && j < y.len() {
        if x[i] < y[j] {
            out.push(x[i]);
            i += 1;
        } else {
            out.push(y[j]);
            j += 1;
        }
    }
    out.extend_from_slice(&x[i..]);
    out.extend_from_slice(&y[j..]);
}

/// When a list of stages ends, run as `fast`'s plan runs them: a dataflow
/// without barriers (docs/algorithms.md, `fast`: a GPU's send waits for its
/// own earlier sends and for the earlier sends into its receiver), so node
/// pair `(a, b)` of a stage starts once `a` has sent its earlier stages and
/// `b` has received its own, and takes its bytes at a node's `rate`
/// (bytes/us) plus a message per lane and chunk (`per_msg` us each on a
/// NIC). Where a stage's pairs are uneven, a node that ends early waits for
/// its next partner, and the exchange ends later than the busiest line
/// says. `auto`'s estimate of `fast` prices its stages with this, and
/// [`super::emit::NodeStages`] picks between its decompositions with it.
/// Reusable buffers; one pass over the pairs.
#[derive(Clone, Debug, Default)]
pub(crate) struct StageChains {
    sent: Vec<f64>,
    recv: Vec<f64>,
    ends: Vec<(usize, usize, f64)>,
}

impl StageChains {
    /// The critical path, us, of the stages `pairs` (sorted by stage) of a
    /// `nodes`-node matrix: a pair of `w` bytes takes `w / rate +
    /// ceil(w / lanes / chunk) · per_msg` (`lanes` GPUs per node, each
    /// sending chunks of at most `chunk` bytes).
    #[cfg(test)]
    pub fn end(
        &mut self,
        nodes: usize,
        pairs: &[StagePair],
        rate: f64,
        lanes: f64,
        chunk: f64,
        per_msg: f64,
    ) -> f64 {
        self.end_drifting(nodes, pairs, rate, lanes, chunk, per_msg, 0.0, 0.0)
    }

    /// [`StageChains::end`] where every pair of `w` bytes also takes
    /// `stretch · min(w, in_flight) / rate` more: the node chains move a
    /// node pair's lanes together, but each lane waits on its own partners
    /// (its sender's and its receiver's lane), so at every change of
    /// partner the lanes of a node drift apart, by at most what its lanes'
    /// sends in flight hold (`in_flight` bytes), and the next pair waits
    /// for its slowest lane. `auto` prices the rotation's whole-pair stages
    /// with it (docs/algorithms.md, `auto`, "`fast`'s stage chains");
    /// `stretch` 0 is [`StageChains::end`].
    #[allow(clippy::too_many_arguments)]
    pub fn end_drifting(
        &mut self,
        nodes: usize,
        pairs: &[StagePair],
        rate: f64,
        lanes: f64,
        chunk: f64,
        per_msg: f64,
        stretch: f64,
        in_flight: f64,
    ) -> f64 {
        if nodes < 2 {
            return 0.0;
        }
        let (sent, recv) = (&mut self.sent, &mut self.recv);
        sent.clear();
        sent.resize(nodes, 0.0);
        recv.clear();
        recv.resize(nodes, 0.0);
        let mut i = 0;
        while i < pairs.len() {
            let stage = pairs[i].stage;
            self.ends.clear();
            while i < pairs.len() && pairs[i].stage == stage {
                let p = pairs[i];
                let (a, b) = (p.src_node as usize, p.dst_node as usize);
                let w = p.bytes as f64;
                let msgs = if per_msg > 0.0 {
                    (w / lanes / chunk.max(1.0)).ceil() * per_msg
                } else {
                    0.0
                };
                // A lane's drift at the partner change: at most what its
                // sends in flight hold.
                let drift = if stretch > 0.0 {
                    stretch * w.min(in_flight) / rate
                } else {
                    0.0
                };
                let d = w / rate + msgs + drift;
                self.ends.push((a, b, sent[a].max(recv[b]) + d));
                i += 1;
            }
            for &(a, b, e) in &self.ends {
                sent[a] = sent[a].max(e);
                recv[b] = recv[b].max(e);
            }
        }
        sent.iter().chain(recv.iter()).copied().fold(0.0, f64::max)
    }

    /// [`StageChains::end`] without a per-message cost, of stages that are
    /// partial permutations (as the decomposition's and the rotation's
    /// are): the same value, in one pass and no buffer. Within such a
    /// stage no pair reads the sender or receiver clock another pair
    /// writes, so each pair can move its clocks at once.
    pub(crate) fn end_of_permutations(
        &mut self,
        nodes: usize,
        pairs: &[StagePair],
        rate: f64,
    ) -> f64 {
        if !self.start(nodes) {
            return 0.0;
        }
        for p in pairs {
            self.step(p, rate);
        }
        self.finish()
    }

    /// Clocks at zero for `nodes` nodes; false (the end is 0) below two.
    pub(crate) fn start(&mut self, nodes: usize) -> bool {
        if nodes < 2 {
            return false;
        }
        self.sent.clear();
        self.sent.resize(nodes, 0.0);
        self.recv.clear();
        self.recv.resize(nodes, 0.0);
        true
    }

    /// One pair of a partial-permutation stage (see
    /// [`StageChains::end_of_permutations`]). The clocks are finite and
    /// non-negative and a pair's time too (`rate` is positive), so the
    /// pair's end is at least both clocks: both become it (what
    /// `f64::max` of each with it gives, without its NaN handling).
    #[inline]
    pub(crate) fn step(&mut self, p: &StagePair, rate: f64) {
        let (a, b) = (p.src_node as usize, p.dst_node as usize);
        let (s, r) = (self.sent[a], self.recv[b]);
        let e = if s >= r { s } else { r } + p.bytes as f64 / rate;
        self.sent[a] = e;
        self.recv[b] = e;
    }

    /// [`StageChains::step`] of rotation `k`'s pairs of the `n x n`
    /// matrix `t` (row-major), in order of their sender `a` (to `(a + k)
    /// mod n`), those without bytes skipped: the same values, in two runs
    /// (`a + k` below `n`, then past it) over the clocks and the entries,
    /// without an index per pair.
    pub(crate) fn rotation(&mut self, n: usize, k: usize, t: &[u64], rate: f64) {
        let (sent, recv) = (&mut self.sent[..n], &mut self.recv[..n]);
        // Entry (a, a + k) is at a (n + 1) + k; (a, a + k - n), for a from
        // n - k, at a (n + 1) + k - n, the first at n (n - k).
        let (low, high) = sent.split_at_mut(n - k);
        let (wrapped, straight) = recv.split_at_mut(k);
        for ((s, r), &x) in low
            .iter_mut()
            .zip(straight.iter_mut())
            .zip(t[k..].iter().step_by(n + 1))
        {
            rotation_step(s, r, x, rate);
        }
        for ((s, r), &x) in high
            .iter_mut()
            .zip(wrapped.iter_mut())
            .zip(t[n * (n - k)..].iter().step_by(n + 1))
        {
            rotation_step(s, r, x, rate);
        }
    }

    pub(crate) fn finish(&self) -> f64 {
        self.sent
            .iter()
            .chain(&self.recv)
            .copied()
            .fold(0.0, f64::max)
    }
}

/// [`StageChains::step`] of one pair of `x` bytes (none where `x` is 0)
/// between the sender's clock `s` and the receiver's `r`. `x` converted
/// as a signed value where it is one (one instruction; the same value).
#[inline(always)]
fn rotation_step(s: &mut f64, r: &mut f64, x: u64, rate: f64) {
    if x == 0 {
        return;
    }
    let bytes = if x <= i64::MAX as u64 {
        x as i64 as f64
    } else {
        x as f64
    };
    let e = (if *s >= *r { *s } else { *r }) + bytes / rate;
    *s = e;
    *r = e;
}

/// Checks that every stage is a partial permutation of nodes: each node sends
/// to at most one node and receives from at most one. Returns the first
/// offending stage and node.
pub fn check_partial_permutation(pairs: &[StagePair], nodes: usize) -> Result<(), String> {
    let stages = pairs
        .iter()
        .map(|p| p.stage as usize + 1)
        .max()
        .unwrap_or(0);
    let mut out = vec![u32::MAX; stages * nodes];
    let mut inn = vec![u32::MAX; stages * nodes];
    for p in pairs {
        let (s, a, b) = (p.stage as usize, p.src_node as usize, p.dst_node as usize);
        if a == b {
            return Err(format!("stage {s}: node {a} sends to itself"));
        }
        for (slot, other, what) in [
            (&mut out[s * nodes + a], b, "sends"),
            (&mut inn[s * nodes + b], a, "receives"),
        ] {
            if *slot != u32::MAX && *slot as usize != other {
                let node = if what == "sends" { a } else { b };
                return Err(format!(
                    "stage {s}: node {node} {what} to/from both node {} and node {other}",
                    *slot
                ));
            }
            *slot = other as u32;
        }
    }
    Ok(())
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The decomposition as its doc says, on plain arrays: per stage, drop
    /// the exhausted matches, give each free row (in order) its largest
    /// free entry of at least `theta` (lowest column among equals), complete
    /// the matching by Kuhn's search (lowest column first), take
    /// `w = max(min matched, theta)`. The bit sets of `Decomposer` must
    /// find the same stages.
    fn reference(n: usize, t: &[u64], theta: u64) -> Vec<StagePair> {
        let mut real = t.to_vec();
        for a in 0..n {
            real[a * n + a] = 0;
        }
        let mut d = Decomposer {
            cells: real.iter().map(|&x| [x, 0]).collect(),
            ..Decomposer::default()
        };
        d.pad_to_doubly_stochastic(n);
        let mut pad: Vec<u64> = d.cells.iter().map(|c| c[1]).collect();
        let total = |real: &[u64], pad: &[u64], i: usize| real[i] + pad[i];
        fn kuhn(
            a: usize,
            n: usize,
            pos: &dyn Fn(usize) -> bool,
            seen: &mut [bool],
            mc: &mut [usize],
            mr: &mut [usize],
        ) -> bool {
            for b in 0..n {
                if !pos(a * n + b) || seen[b] {
                    continue;
                }
                seen[b] = true;
                if mc[b] == usize::MAX || kuhn(mc[b], n, pos, seen, mc, mr) {
                    mr[a] = b;
                    mc[b] = a;
                    return true;
                }
            }
            false
        }
        let (mut mr, mut mc) = (vec![usize::MAX; n], vec![usize::MAX; n]);
        let (mut out, mut stage) = (Vec::new(), 0);
        while real.iter().sum::<u64>() > 0 {
            for a in 0..n {
                if mr[a] != usize::MAX && total(&real, &pad, a * n + mr[a]) == 0 {
                    mc[mr[a]] = usize::MAX;
                    mr[a] = usize::MAX;
                }
            }
            let mut rest = Vec::new();
            let free_rows: Vec<usize> = (0..n).filter(|&a| mr[a] == usize::MAX).collect();
            for a in free_rows {
                let best = (0..n)
                    .filter(|&b| mc[b] == usize::MAX && total(&real, &pad, a * n + b) >= theta)
                    .max_by_key(|&b| (total(&real, &pad, a * n + b), std::cmp::Reverse(b)));
                match best {
                    Some(b) => (mr[a], mc[b]) = (b, a),
                    None => rest.push(a),
                }
            }
            for a in rest {
                let pos = |i: usize| real[i] + pad[i] > 0;
                kuhn(a, n, &pos, &mut vec![false; n], &mut mc, &mut mr);
            }
            // Stages floored at `theta` leave the lines unequal: some rows
            // may stay unmatched.
            let matched: Vec<usize> = (0..n).filter(|&a| mr[a] != usize::MAX).collect();
            let w = matched
                .iter()
                .map(|&a| total(&real, &pad, a * n + mr[a]))
                .min()
                .unwrap()
                .max(theta);
            let mut any = false;
            for &a in &matched {
                let i = a * n + mr[a];
                let r = real[i].min(w);
                real[i] -= r;
                pad[i] -= pad[i].min(w - r);
                if r > 0 {
                    any = true;
                    out.push(StagePair {
                        stage,
                        src_node: a as u32,
                        dst_node: mr[a] as u32,
                        bytes: r,
                    });
                }
            }
            stage += u32::from(any);
        }
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn decompose_matches_its_plain_statement(
            n in 2usize..=9,
            seed in any::<u64>(),
            sparse in 0u64..4,
            floor_div in 1u64..64,
        ) {
            let (got, want) = against_plain(n, seed, sparse, floor_div);
            prop_assert_eq!(got, want);
        }
    }

    /// The decomposition of a `skewed` matrix and its plain statement's, at
    /// θ = the largest line over `floor_div`.
    fn against_plain(
        n: usize,
        seed: u64,
        sparse: u64,
        floor_div: u64,
    ) -> (Vec<StagePair>, Vec<StagePair>) {
        let t = skewed(n, seed, sparse);
        let m = (0..n)
            .map(|a| {
                (0..n)
                    .filter(|&b| b != a)
                    .map(|b| t[a * n + b])
                    .sum::<u64>()
            })
            .max()
            .unwrap_or(0);
        let theta = (m / floor_div).max(1);
        (decompose(n, &t, theta).0, reference(n, &t, theta))
    }

    /// The chunked rotation's plain statement: rotation by rotation in
    /// [`rotation_rank`]'s order, piece `j` of every pair that has one,
    /// the partial piece first and the whole ones aligned at the
    /// rotation's end; then the stages sorted by bytes, lightest first
    /// (ties in generation order).
    fn chunked_reference(n: usize, t: &[u64], cap: u64) -> Vec<StagePair> {
        let mut ks: Vec<usize> = (1..n).collect();
        ks.sort_by_key(|&k| rotation_rank(n, k));
        let mut stages: Vec<Vec<(u32, u32, u64)>> = Vec::new();
        for k in ks {
            let pair = |a: usize| (a, (a + k) % n, t[a * n + (a + k) % n]);
            let most = (0..n).map(|a| pair(a).2.div_ceil(cap)).max().unwrap_or(0);
            for j in 0..most {
                let mut stage = Vec::new();
                for a in 0..n {
                    let (a, b, x) = pair(a);
                    let p = x.div_ceil(cap);
                    if j + p < most {
                        continue; // this pair's pieces start later
                    }
                    let i = j + p - most; // its own piece number
                    let w = if i == 0 { x - (p - 1) * cap } else { cap };
                    stage.push((a as u32, b as u32, w));
                }
                if !stage.is_empty() {
                    stages.push(stage);
                }
            }
        }
        let mut order: Vec<usize> = (0..stages.len()).collect();
        order.sort_by_key(|&s| (stages[s].iter().map(|p| p.2).sum::<u64>(), s));
        let mut out = Vec::new();
        for (new, &s) in order.iter().enumerate() {
            for &(a, b, w) in &stages[s] {
                out.push(StagePair {
                    stage: new as u32,
                    src_node: a,
                    dst_node: b,
                    bytes: w,
                });
            }
        }
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        /// Every stage a partial permutation within one rotation, every
        /// pair's bytes delivered in pieces of at most the cap, stages
        /// lightest first, and the stages of the plain statement, appended
        /// after what `out` held.
        #[test]
        fn chunked_rotation_matches_its_plain_statement(
            n in 2usize..=40,
            seed in any::<u64>(),
            sparse in 0u64..4,
            cap_div in 1u64..64,
        ) {
            let t = skewed(n, seed, sparse);
            let m = (0..n)
                .flat_map(|a| {
                    let out: u64 = (0..n).filter(|&b| b != a).map(|b| t[a * n + b]).sum();
                    let inn: u64 = (0..n).filter(|&b| b != a).map(|b| t[b * n + a]).sum();
                    [out, inn]
                })
                .max()
                .unwrap_or(0);
            let cap = (m / cap_div).max(1);
            let held = StagePair { stage: 7, src_node: 0, dst_node: 1, bytes: 5 };
            let mut out = vec![held];
            let count = chunked_rotation(n, &t, cap, &mut out);
            prop_assert_eq!(out[0], held);
            let got = &out[1..];
            prop_assert_eq!(got, &chunked_reference(n, &t, cap)[..]);
            prop_assert_eq!(count as usize, got.iter().map(|p| p.stage as usize + 1).max().unwrap_or(0));
            check_partial_permutation(got, n).map_err(TestCaseError::fail)?;
            let mut sent = vec![0u64; n * n];
            let mut per_stage = vec![0u64; count as usize];
            let mut diag = vec![usize::MAX; count as usize];
            for p in got {
                prop_assert!(p.bytes > 0 && p.bytes <= cap);
                prop_assert!(p.src_node != p.dst_node);
                let k = (p.dst_node as usize + n - p.src_node as usize) % n;
                let s = p.stage as usize;
                prop_assert!(diag[s] == usize::MAX || diag[s] == k);
                diag[s] = k;
                sent[p.src_node as usize * n + p.dst_node as usize] += p.bytes;
                per_stage[s] += p.bytes;
            }
            for a in 0..n {
                for b in 0..n {
                    let want = if a == b { 0 } else { t[a * n + b] };
                    prop_assert_eq!(sent[a * n + b], want);
                }
            }
            prop_assert!(per_stage.windows(2).all(|w| w[0] <= w[1]));
        }
    }

    /// Skewed entries, some zero (sparse supports make the searches work).
    pub(in crate::sched::fast) fn skewed(n: usize, seed: u64, sparse: u64) -> Vec<u64> {
        let mut x = seed | 1;
        (0..n * n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                if x % 4 < sparse {
                    0
                } else {
                    (x >> 40) % 1000 * (1 + x % 7).pow(3)
                }
            })
            .collect()
    }

    proptest! {
        // Bit sets of more than one word (n > 64): the scans across words,
        // the free columns and rows kept from stage to stage, the searches'
        // closed columns.
        #![proptest_config(ProptestConfig::with_cases(4))]
        #[test]
        fn decompose_matches_its_plain_statement_past_one_word(
            n in 65usize..=100,
            seed in any::<u64>(),
            sparse in 0u64..3,
            floor_div in 1u64..200,
        ) {
            let (got, want) = against_plain(n, seed, sparse, floor_div);
            prop_assert_eq!(got, want);
        }
    }

    /// The rotations' bytes added in two runs per row are each entry
    /// `(a, b)`, `b != a`, added to rotation `(b - a) mod n`.
    #[test]
    fn rotation_bytes_are_the_entries_by_offset() {
        for (n, seed) in [(2, 1), (3, 5), (7, 9), (16, 13), (33, 2)] {
            let t = skewed(n, seed, 1);
            let mut want = vec![0u64; n];
            for a in 0..n {
                for b in (0..n).filter(|&b| b != a) {
                    want[(b + n - a) % n] += t[a * n + b];
                }
            }
            let mut d = Decomposer::default();
            d.rotation_order(n, &t);
            assert_eq!(d.stage_bytes, want, "n {n}");
        }
    }

    /// The rotation's pricing with a pair past `i64::MAX` bytes (its
    /// conversion to `f64` unsigned): `StageChains::end` of its stages,
    /// bit for bit.
    #[test]
    fn rotation_end_past_signed_bytes_is_the_chains() {
        for (n, at) in [(2, 1), (3, 5), (5, 7), (6, 13)] {
            let mut t = skewed(n, at as u64, 1);
            t[at] = (1 << 63) + 12_345;
            let mut d = Decomposer::default();
            let mut rotation = Vec::new();
            d.rotate(n, &t, &mut rotation);
            let mut c = StageChains::default();
            let want = c.end(n, &rotation, 3.5, 1.0, 1.0, 0.0);
            assert_eq!(
                d.rotation_end(n, &t, &mut c, 3.5).to_bits(),
                want.to_bits(),
                "n {n}"
            );
        }
    }

    /// Rows of three words (`augment` with the word count at run time) and
    /// of four or more (its mask of live words, past 256 nodes too): past
    /// the one- and two-word constants it runs with up to 128 nodes. (The
    /// paths' rematches, from the top, are checked as they run: each row
    /// owned the column the row above it went down through.)
    #[test]
    fn decompose_matches_its_plain_statement_past_two_words() {
        for (n, seed, sparse, floor_div) in [
            (130, 7, 1, 150),
            (131, 11, 2, 40),
            (195, 3, 1, 190),
            (257, 5, 0, 260),
            (300, 13, 1, 100),
        ] {
            let (got, want) = against_plain(n, seed, sparse, floor_div);
            assert_eq!(got, want, "n {n}, seed {seed}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]
        /// The one-pass pricing of partial-permutation stages is
        /// `StageChains::end`'s, bit for bit: of the decomposition's stages
        /// and of the rotation's (priced from the matrix, unwritten).
        #[test]
        fn permutation_chains_are_the_chains(
            n in 2usize..=40,
            seed in any::<u64>(),
            sparse in 0u64..4,
            floor_div in 1u64..64,
            rate in 0.5f64..100.0,
        ) {
            let t = skewed(n, seed, sparse);
            let mut d = Decomposer::default();
            let mut pairs = Vec::new();
            let k = d.decompose(n, &t, |m| (m / floor_div).max(1), &mut pairs);
            d.order_light_first(&mut pairs, 0, k);
            let mut c = StageChains::default();
            let want = c.end(n, &pairs, rate, 1.0, 1.0, 0.0);
            prop_assert_eq!(c.end_of_permutations(n, &pairs, rate).to_bits(), want.to_bits());
            let mut rotation = Vec::new();
            let stages = d.rotate(n, &t, &mut rotation);
            let want = c.end(n, &rotation, rate, 1.0, 1.0, 0.0);
            prop_assert_eq!(d.rotation_end(n, &t, &mut c, rate).to_bits(), want.to_bits());
            let mut again = Vec::new();
            prop_assert_eq!(d.rotation_pairs(n, &t, |p| again.push(p)), stages);
            prop_assert_eq!(again, rotation);
        }

        /// `order_light_first_with` after `decompose` (the stage sums the
        /// decomposition recorded, the pairs priced as they are written)
        /// gives the stages `order_light_first` gives counting them itself,
        /// after pairs already in `out`, and the price `StageChains::end`
        /// gives them, bit for bit.
        #[test]
        fn priced_reorder_is_the_reorder_then_the_chains(
            n in 2usize..=40,
            seed in any::<u64>(),
            sparse in 0u64..4,
            floor_div in 1u64..64,
            rate in 0.5f64..100.0,
            before in 0usize..3,
        ) {
            let t = skewed(n, seed, sparse);
            let floor = |m: u64| (m / floor_div).max(1);
            let lead = StagePair { stage: 7, src_node: 0, dst_node: 1, bytes: 3 };
            let mut d = Decomposer::default();
            let mut plain = vec![lead; before];
            let k = d.decompose(n, &t, floor, &mut plain);
            d.recorded = None; // counted again by `order_light_first`
            d.order_light_first(&mut plain, before, k);
            let mut priced = vec![lead; before];
            prop_assert_eq!(d.decompose(n, &t, floor, &mut priced), k);
            prop_assert!(d.recorded.is_some());
            let mut c = StageChains::default();
            c.start(n.max(2));
            let mut seen = 0;
            d.order_light_first_with(&mut priced, before, k, |p| {
                seen += 1;
                c.step(p, rate);
            });
            let got = c.finish();
            prop_assert!(d.recorded.is_none());
            prop_assert_eq!(&priced, &plain);
            prop_assert_eq!(seen, plain.len() - before);
            let want = StageChains::default().end(n.max(2), &plain[before..], rate, 1.0, 1.0, 0.0);
            prop_assert_eq!(got.to_bits(), want.to_bits());
        }
    }

    proptest! {
        /// `decompose_light_first_with` (what plans) writes the stages
        /// `decompose` then `order_light_first_with` write, after pairs
        /// already in `out`, and gives its `f` the same pairs in the same
        /// order; with one stage or none too (`k < 2`, nothing reordered).
        #[test]
        fn fused_decomposition_is_the_two_steps(
            n in 2usize..=40,
            seed in any::<u64>(),
            sparse in 0u64..5,
            floor_div in 1u64..64,
            before in 0usize..3,
        ) {
            let t = if sparse == 4 {
                // At most one pair: one stage or none.
                let mut t = vec![0; n * n];
                t[1] = seed % 3;
                t
            } else {
                skewed(n, seed, sparse)
            };
            let floor = |m: u64| (m / floor_div).max(1);
            let lead = StagePair { stage: 7, src_node: 0, dst_node: 1, bytes: 3 };
            let mut d = Decomposer::default();
            let mut two = vec![lead; before];
            let k = d.decompose(n, &t, floor, &mut two);
            let mut seen_two = Vec::new();
            d.order_light_first_with(&mut two, before, k, |p| seen_two.push(*p));
            // The same decomposer again (its buffers reused), then a fresh one.
            for mut e in [d, Decomposer::default()] {
                let mut fused = vec![lead; before];
                let mut seen = Vec::new();
                let got = e.decompose_light_first_with(n, &t, floor, &mut fused, |p| seen.push(*p));
                prop_assert_eq!(got, k);
                prop_assert_eq!(&fused, &two);
                prop_assert_eq!(&seen, &seen_two);
                prop_assert_eq!(&seen[..], &fused[before..]);
            }
        }
    }

    /// One decomposer over matrices of more and fewer pairs (its drawn
    /// pairs released after each, the next extraction reserving the last
    /// count): the same stages as a fresh decomposer's each time.
    #[test]
    fn released_pairs_reserve_for_the_next_decomposition() {
        let mut d = Decomposer::default();
        for (n, seed, sparse, floor_div) in [
            (40, 1, 0, 60),
            (9, 2, 1, 8),
            (300, 3, 1, 300),
            (70, 4, 2, 50),
            (300, 5, 0, 100),
            (2, 6, 0, 1),
        ] {
            let t = skewed(n, seed, sparse);
            let floor = |m: u64| (m / floor_div).max(1);
            let (mut got, mut want) = (Vec::new(), Vec::new());
            let k = d.decompose_light_first_with(n, &t, floor, &mut got, |_| {});
            assert_eq!(d.drawn.capacity(), 0, "n {n}: released");
            assert_eq!(d.drawn_hint, got.len(), "n {n}");
            let mut fresh = Decomposer::default();
            let j = fresh.decompose_light_first_with(n, &t, floor, &mut want, |_| {});
            assert_eq!((k, &got), (j, &want), "n {n}");
        }
    }

    #[test]
    fn merge_sorted_keeps_the_order() {
        let mut out = Vec::new();
        merge_sorted(&[1, 4, 9], &[0, 2, 3, 10, 11], &mut out);
        assert_eq!(out, [0, 1, 2, 3, 4, 9, 10, 11]);
        out.clear();
        merge_sorted(&[], &[5], &mut out);
        assert_eq!(out, [5]);
    }

    /// The held totals carry the stages' `w` added up (`drained`), and are
    /// rebased before it could overflow: with θ (so every `w`) near
    /// `u64::MAX`, rebased every few stages, one decomposer reused; the
    /// same stages as the plain statement, on matrices of 2 to 300 nodes.
    #[test]
    fn held_totals_rebased_before_they_overflow() {
        let mut d = Decomposer::default();
        let mut rebased = 0;
        for (n, seed, sparse, shift) in [
            (2, 3, 0, 63),
            (4, 5, 1, 62),
            (5, 9, 0, 62),
            (7, 1, 2, 61),
            (9, 4, 1, 63),
            (70, 6, 1, 62),
            (130, 8, 1, 61),
            (300, 2, 2, 62),
        ] {
            let t = skewed(n, seed, sparse);
            let theta = (1u64 << shift) + seed;
            let mut got = Vec::new();
            d.decompose(n, &t, |_| theta, &mut got);
            assert_eq!(got, reference(n, &t, theta), "n {n}, seed {seed}");
            rebased += d.rebased;
        }
        assert!(rebased > 8, "rebased {rebased} times");
    }

    fn decompose(n: usize, t: &[u64], floor: u64) -> (Vec<StagePair>, u32) {
        let mut d = Decomposer::default();
        let mut out = Vec::new();
        let k = d.decompose(n, t, |_| floor, &mut out);
        (out, k)
    }

    fn covered(n: usize, pairs: &[StagePair]) -> Vec<u64> {
        let mut c = vec![0; n * n];
        for p in pairs {
            c[p.src_node as usize * n + p.dst_node as usize] += p.bytes;
        }
        c
    }

    #[test]
    fn exact_bvn_without_floor_takes_max_line_time() {
        let t = [0, 5, 3, 2, 0, 6, 4, 1, 0];
        let (pairs, k) = decompose(3, &t, 1);
        check_partial_permutation(&pairs, 3).unwrap();
        assert_eq!(covered(3, &pairs), t);
        // Stage durations (largest pair) add up to the largest line sum: 8 or 9.
        let mut dur = vec![0; k as usize];
        for p in &pairs {
            dur[p.stage as usize] = dur[p.stage as usize].max(p.bytes);
        }
        assert_eq!(dur.iter().sum::<u64>(), 9);
    }

    #[test]
    fn hotspot_column_is_busy_every_stage() {
        // Every node sends 10 to node 0 and 1 to each other node.
        let n = 4;
        let mut t = vec![1; n * n];
        for a in 0..n {
            t[a * n] = 10;
        }
        let (pairs, k) = decompose(n, &t, 1);
        check_partial_permutation(&pairs, n).unwrap();
        let mut c = covered(n, &pairs);
        for a in 0..n {
            c[a * n + a] = t[a * n + a]; // the diagonal is not inter-node traffic
        }
        assert_eq!(c, t);
        for s in 0..k {
            assert!(pairs.iter().any(|p| p.stage == s && p.dst_node == 0));
        }
    }

    #[test]
    fn floor_keeps_stages_near_node_count() {
        let n = 8;
        let t: Vec<u64> = (0..n * n).map(|i| 1000 + (i as u64 * 7919) % 977).collect();
        let (exact, k_exact) = decompose(n, &t, 1);
        let (coarse, k) = decompose(n, &t, 1000);
        check_partial_permutation(&exact, n).unwrap();
        check_partial_permutation(&coarse, n).unwrap();
        assert_eq!(covered(n, &coarse), covered(n, &exact));
        assert!(k < k_exact, "{k} vs {k_exact}");
        assert!(k as usize <= 2 * n, "{k} stages");
    }

    #[test]
    fn stages_are_ordered_light_first_and_renumbered() {
        let n = 8;
        let t: Vec<u64> = (0..n * n)
            .map(|i| 1000 + (i as u64 * 7919) % 977 + if i % 9 == 1 { 5000 } else { 0 })
            .collect();
        let mut d = Decomposer::default();
        let mut out = vec![StagePair {
            stage: 7,
            src_node: 0,
            dst_node: 1,
            bytes: 1,
        }];
        let k = d.decompose(n, &t, |_| 1000, &mut out);
        let before: Vec<StagePair> = out[1..].to_vec();
        let weight = |pairs: &[StagePair], s: u32| -> u64 {
            pairs.iter().filter(|p| p.stage == s).map(|p| p.bytes).sum()
        };
        let mut weights: Vec<u64> = (0..k).map(|s| weight(&before, s)).collect();
        assert!(
            weights.windows(2).any(|w| w[0] < w[1]),
            "extraction order already sorted: the test proves nothing {weights:?}"
        );
        d.order_light_first(&mut out, 1, k);
        // What was before `start` stays; the stages are the same pairs, in
        // non-decreasing weight, numbered 0..k, each contiguous.
        assert_eq!(out[0].stage, 7);
        let after = &out[1..];
        assert_eq!(after.len(), before.len());
        assert_eq!(covered(n, after), covered(n, &before));
        check_partial_permutation(after, n).unwrap();
        let got: Vec<u64> = (0..k).map(|s| weight(after, s)).collect();
        weights.sort_unstable();
        assert_eq!(got, weights);
        assert!(after.windows(2).all(|w| w[0].stage <= w[1].stage));
    }

    /// A hot receiver (node 0 takes `hot` from every node, the rest `1..`):
    /// its column is the largest line and holds the largest pair of every
    /// diagonal, so the rotation is perfect.
    fn hot_receiver(n: usize, hot: u64) -> Vec<u64> {
        (0..n * n)
            .map(|i| {
                if i % n == 0 {
                    hot
                } else {
                    1 + (i as u64 * 7919) % 13
                }
            })
            .collect()
    }

    #[test]
    fn rotation_stages_are_whole_pairs_in_permutations_inverses_together() {
        let n = 7;
        let mut t = hot_receiver(n, 1000);
        t[2 * n + 5] = 0; // a pair without bytes is in no stage
        let mut d = Decomposer::default();
        let mut out = Vec::new();
        let k = d.rotate(n, &t, &mut out);
        assert_eq!(k as usize, n - 1);
        check_partial_permutation(&out, n).unwrap();
        let mut want = t.clone();
        for a in 0..n {
            want[a * n + a] = 0;
        }
        assert_eq!(covered(n, &out), want);
        // Each pair once, whole, in the stage of its diagonal (renumbered).
        assert_eq!(out.len(), n * (n - 1) - 1);
        let mut diag_stage = vec![u32::MAX; n];
        for p in &out {
            let diag = (p.dst_node as usize + n - p.src_node as usize) % n;
            assert!(diag_stage[diag] == u32::MAX || diag_stage[diag] == p.stage);
            diag_stage[diag] = p.stage;
        }
        // Each rotation beside its inverse, nearest first (n odd: no swap),
        // whatever their bytes.
        let order: Vec<u32> = (0..k)
            .map(|s| diag_stage.iter().position(|&x| x == s).unwrap() as u32)
            .collect();
        assert_eq!(order, [1, 6, 2, 5, 3, 4]);
        assert!(out.windows(2).all(|w| w[0].stage <= w[1].stage));
        // Every stage keeps the hot receiver busy: lock-step time is M.
        let mut dur = vec![0; k as usize];
        for p in &out {
            dur[p.stage as usize] = dur[p.stage as usize].max(p.bytes);
        }
        assert_eq!(dur.iter().sum::<u64>(), 1000 * (n as u64 - 1));
    }

    /// With an even node count the swap (`k = n/2`) runs first, then each
    /// rotation beside its inverse; empty rotations are dropped and the
    /// stages renumbered in that order.
    #[test]
    fn rotation_order_is_swap_first_then_inverse_pairs() {
        let n = 8;
        let mut t: Vec<u64> = (0..n * n).map(|i| 1 + (i as u64 * 7919) % 13).collect();
        // Rotation 2 is empty: no stage for it.
        for a in 0..n {
            t[a * n + (a + 2) % n] = 0;
        }
        let mut d = Decomposer::default();
        let mut out = Vec::new();
        let k = d.rotate(n, &t, &mut out);
        assert_eq!(k, 6);
        let order: Vec<usize> = (0..k)
            .map(|s| {
                let p = out.iter().find(|p| p.stage == s).unwrap();
                (p.dst_node as usize + n - p.src_node as usize) % n
            })
            .collect();
        assert_eq!(order, [4, 1, 7, 6, 3, 5]);
        let mut ranks: Vec<usize> = (1..n).collect();
        ranks.sort_by_key(|&k| rotation_rank(n, k));
        assert_eq!(ranks, [4, 1, 7, 2, 6, 3, 5]);
    }

    /// A pair starts once its sender has sent and its receiver has
    /// received their earlier stages, and pays a message per lane and chunk.
    #[test]
    fn stage_chains_wait_for_sender_and_receiver() {
        let p = |stage, a, b, bytes| StagePair {
            stage,
            src_node: a,
            dst_node: b,
            bytes,
        };
        let mut c = StageChains::default();
        // Stage 1's pair shares no node with stage 0's: both start at 0.
        assert_eq!(
            c.end(3, &[p(0, 0, 1, 10), p(1, 1, 2, 10)], 1.0, 1.0, 1.0, 0.0),
            10.0
        );
        // It shares the sender: it waits for it.
        assert_eq!(
            c.end(3, &[p(0, 0, 1, 10), p(1, 0, 2, 10)], 1.0, 1.0, 1.0, 0.0),
            20.0
        );
        // Or the receiver.
        assert_eq!(
            c.end(3, &[p(0, 0, 1, 10), p(1, 2, 1, 6)], 2.0, 1.0, 1.0, 0.0),
            8.0
        );
        // 10 bytes over 2 lanes in chunks of 2: 3 messages a lane.
        assert_eq!(c.end(2, &[p(0, 0, 1, 10)], 1.0, 2.0, 2.0, 0.5), 11.5);
        // Pairs of one stage run side by side.
        assert_eq!(
            c.end(4, &[p(0, 0, 1, 10), p(0, 2, 3, 4)], 1.0, 1.0, 1.0, 0.0),
            10.0
        );
        assert_eq!(c.end(1, &[], 1.0, 1.0, 1.0, 0.0), 0.0);
    }

    #[test]
    fn checker_rejects_incast() {
        let p = |stage, a, b| StagePair {
            stage,
            src_node: a,
            dst_node: b,
            bytes: 1,
        };
        assert!(check_partial_permutation(&[p(0, 0, 1), p(0, 2, 1)], 3).is_err());
        assert!(check_partial_permutation(&[p(0, 0, 1), p(0, 0, 2)], 3).is_err());
        assert!(check_partial_permutation(&[p(0, 0, 1), p(1, 2, 1)], 3).is_ok());
    }
}
