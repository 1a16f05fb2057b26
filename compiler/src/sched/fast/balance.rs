//! Intra-node balancing of one node pair: which GPU (lane) of the sending
//! node carries which bytes of what the node sends to one other node.
//!
//! Lane `l` of node pair (A, B) is GPU `l` of A sending to GPU `l` of B over
//! rail `rail_of(l)` (`l % nics` without a rail map; rail-aligned, so no NIC sees two rails' traffic). Each
//! lane's target share is equal per rail: `T_AB / (R * c_l)`, with `R` the
//! rails in use and `c_l` the GPUs sharing lane `l`'s rail. A lane keeps the
//! head of its own bytes up to its target; the excess tails move over NVLink
//! to the lanes below target (pieces). Knows nothing of stages or transfers.

use super::arith::mul_div;

/// Bytes a lane sends that another GPU of its node hands over first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Piece {
    /// The rank whose input holds the bytes.
    pub src: u32,
    /// Offset inside `src`'s contiguous block range for the destination node.
    pub row_off: u64,
    pub len: u64,
}

/// What one lane of one node pair sends: first `own` bytes of its own range
/// (from its input), then `gathered` bytes of pieces (from its scratch).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Lane {
    pub own: u64,
    pub gathered: u64,
    pub pieces_start: u32,
    pub pieces_end: u32,
    /// Offset of this lane's gather region in the carrier's scratch.
    pub gather_base: u64,
    /// Offset of this lane's landing region in the receiver's scratch.
    pub recv_base: u64,
    /// The pair is sent directly: each block from its source GPU straight to
    /// its destination GPU's output (no move, no landing region, no forward).
    pub direct: bool,
}

impl Lane {
    pub fn len(&self) -> u64 {
        self.own + self.gathered
    }
}

/// Rail-derived weights, fixed by the topology.
#[derive(Clone, Debug)]
pub(crate) struct LaneWeights {
    /// Prefix sums of the lanes' integer weights (length `G + 1`); lane
    /// `l`'s target is `T * w_l / total`.
    pub cum: Vec<u64>,
    /// GPUs sharing each lane's rail (its NIC bandwidth is divided by this).
    pub sharing: Vec<u64>,
    /// `log2` of the weights' total when it is a power of two (every GPU
    /// with a NIC of its own, 8 of them: 8): targets then divide by a shift.
    shift: Option<u32>,
}

impl LaneWeights {
    /// GPU `l` on rail `l % nics`.
    #[cfg(test)]
    pub fn new(gpus: usize, nics: usize) -> Self {
        let nics = nics.clamp(1, gpus);
        let rail: Vec<u32> = (0..gpus).map(|l| (l % nics) as u32).collect();
        Self::from_rails(&rail)
    }

    /// GPU `l` on rail `rail[l]` (the topology's rail map).
    pub fn from_rails(rail: &[u32]) -> Self {
        let gpus = rail.len();
        let sharing: Vec<u64> = rail
            .iter()
            .map(|r| rail.iter().filter(|&x| x == r).count() as u64)
            .collect();
        // The least common multiple of the sharing counts (each at most G,
        // and few distinct ones), so every rail's weights sum to it.
        let common = sharing.iter().fold(1u64, |acc, &c| acc / gcd(acc, c) * c);
        let weight: Vec<u64> = sharing.iter().map(|&c| common / c).collect();
        let mut cum = Vec::with_capacity(gpus + 1);
        cum.push(0);
        for &w in &weight {
            cum.push(cum.last().copied().unwrap_or(0) + w);
        }
        let all = *cum.last().unwrap_or(&1);
        let shift = all.is_power_of_two().then(|| all.trailing_zeros());
        LaneWeights {
            cum,
            sharing,
            shift,
        }
    }

    /// Target bytes of lane `l` when the pair carries `total` bytes (the
    /// targets of all lanes sum to `total` exactly).
    #[cfg(test)]
    pub fn target(&self, total: u64, l: usize) -> u64 {
        self.upto(total, l + 1) - self.upto(total, l)
    }

    /// Targets of lanes `0..i` together.
    pub fn upto(&self, total: u64, i: usize) -> u64 {
        match (total.checked_mul(self.cum[i]), self.shift) {
            (Some(x), Some(shift)) => x >> shift,
            _ => mul_div(total, self.cum[i], *self.cum.last().unwrap_or(&1)),
        }
    }

    /// The most GPUs sharing one NIC.
    pub fn max_sharing(&self) -> u64 {
        self.sharing.iter().copied().max().unwrap_or(1)
    }

    /// Every lane's target, into `out`.
    pub fn targets(&self, total: u64, out: &mut Vec<u64>) {
        out.clear();
        let mut prev = 0;
        for i in 1..self.cum.len() {
            let at = self.upto(total, i);
            out.push(at - prev);
            prev = at;
        }
    }
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Balances one node pair. `sent[l]` is what GPU `l` of the sending node has
/// for the receiving node; `first_rank` the rank of its GPU 0. Appends the
/// pieces to `pieces` and fills `lanes` (one per GPU); `targets` is a
/// reusable buffer. Balancing is skipped
/// (every lane sends its own bytes) when the time it saves on the slowest
/// lane, at `lane_rate` bytes/us per unshared NIC, is below `min_gain_us`.
/// With `lens_only` (and not `spread`) the lanes get their `own` and
/// `gathered` bytes but no pieces: what a rank's program needs of the pairs
/// whose moves it never emits (each lane below target gathers exactly its
/// need, as the pieces below give it).
#[allow(clippy::too_many_arguments)]
pub(crate) fn balance_pair(
    sent: &[u64],
    first_rank: u32,
    weights: &LaneWeights,
    nic_rate: f64,
    min_gain_us: f64,
    spread: bool,
    lens_only: bool,
    lanes: &mut [Lane],
    pieces: &mut Vec<Piece>,
    targets: &mut Vec<u64>,
) {
    let total: u64 = sent.iter().sum();
    let g = sent.len();
    weights.targets(total, targets);
    let slowest = |x: &[u64]| {
        x.iter()
            .zip(&weights.sharing)
            .map(|(&b, &c)| b * c)
            .max()
            .unwrap_or(0) as f64
            / nic_rate
    };
    let gain = slowest(sent) - slowest(targets);
    if gain <= min_gain_us {
        for (lane, &x) in lanes.iter_mut().zip(sent) {
            let at = pieces.len() as u32;
            *lane = Lane {
                own: x,
                pieces_start: at,
                pieces_end: at,
                ..Lane::default()
            };
        }
        return;
    }
    if spread {
        spread_excess(sent, first_rank, targets, lanes, pieces);
        return;
    }
    if lens_only {
        let at = pieces.len() as u32;
        for ((lane, &x), &target) in lanes.iter_mut().zip(sent).zip(targets.iter()) {
            *lane = Lane {
                own: x.min(target),
                gathered: target.saturating_sub(x),
                pieces_start: at,
                pieces_end: at,
                ..Lane::default()
            };
        }
        return;
    }
    // Two pointers: deficit lanes outermost, so each lane's pieces are contiguous.
    let mut e = 0usize;
    let mut moved_from_e = 0u64;
    let excess = |l: usize| sent[l].saturating_sub(targets[l]);
    for d in 0..g {
        let target = targets[d];
        let start = pieces.len() as u32;
        let mut need = target.saturating_sub(sent[d]);
        let mut gathered = 0;
        while need > 0 && e < g {
            let avail = excess(e) - moved_from_e;
            if avail == 0 {
                e += 1;
                moved_from_e = 0;
                continue;
            }
            let take = avail.min(need);
            pieces.push(Piece {
                src: first_rank + e as u32,
                row_off: targets[e] + moved_from_e,
                len: take,
            });
            moved_from_e += take;
            need -= take;
            gathered += take;
        }
        lanes[d] = Lane {
            own: sent[d].min(target),
            gathered,
            pieces_start: start,
            pieces_end: pieces.len() as u32,
            ..Lane::default()
        };
    }
}

/// The `own` and `gathered` bytes of each lane (into `out`, one per GPU)
/// that [`balance_pair`] gives with `lens_only` and without `spread`, with
/// no buffer: a rank's program needs these of every node pair (they place
/// the gather and landing regions), N² G lanes, so this runs in one pass.
/// [`RowLens`] does it for a whole row of pairs; this is its reference.
#[cfg(test)]
pub(crate) fn pair_lens(
    sent: &[u64],
    weights: &LaneWeights,
    nic_rate: f64,
    min_gain_us: f64,
    out: &mut [(u64, u64)],
) {
    let total: u64 = sent.iter().sum();
    let (mut busiest, mut busiest_target) = (0u64, 0u64);
    let mut prev = 0;
    for (l, ((&x, &c), slot)) in sent.iter().zip(&weights.sharing).zip(&mut *out).enumerate() {
        let at = weights.upto(total, l + 1);
        let target = at - prev;
        prev = at;
        busiest = busiest.max(x * c);
        busiest_target = busiest_target.max(target * c);
        *slot = (x.min(target), target.saturating_sub(x));
    }
    let gain = busiest as f64 / nic_rate - busiest_target as f64 / nic_rate;
    if gain <= min_gain_us {
        for (slot, &x) in out.iter_mut().zip(sent) {
            *slot = (x, 0);
        }
    }
}

/// [`pair_lens`] of every pair one node sends, at once: lane by lane over
/// the row of receiving nodes, in loops over the nodes without branches
/// (which the compiler vectorises), instead of pair by pair. A rank's
/// program needs these bytes of every node pair (N² G lanes: they place the
/// gather and landing regions); pair by pair they cost about 100
/// instructions a lane.
#[derive(Clone, Debug, Default)]
pub(crate) struct RowLens {
    /// Per receiving node: the pair's bytes, its busiest lane's load
    /// (bytes times the GPUs sharing its NIC) as sent and as balanced, and
    /// all ones where the pair is balanced (0 where it is not).
    total: Vec<u64>,
    busiest: Vec<u64>,
    busiest_target: Vec<u64>,
    balanced: Vec<u64>,
    /// Lane `l` of the pair with node `b` at `l * n + b`: the bytes it
    /// gathers, and its length (own and gathered bytes).
    pub gathered: Vec<u64>,
    pub len: Vec<u64>,
}

impl RowLens {
    /// The lanes of node pairs `(a, b)` for every `b` in `0..n`, with
    /// `rows[l * n + b]` what GPU `l` of `a` sends node `b` (`G` rows of
    /// `n`): lane `l` of pair `b` gathers `gathered[l * n + b]` bytes and
    /// owns `len[l * n + b]` less those, as [`pair_lens`] gives. Pair
    /// `skip` (`a` itself) gets empty lanes.
    pub fn balance(
        &mut self,
        rows: &[u64],
        n: usize,
        weights: &LaneWeights,
        nic_rate: f64,
        min_gain_us: f64,
        skip: usize,
    ) {
        let g = weights.sharing.len();
        debug_assert_eq!(rows.len(), g * n);
        // Every entry is written below (by pair or by lane).
        self.gathered.resize(g * n, 0);
        self.len.resize(g * n, 0);
        // Eight and four GPUs a node: a pair's lanes in registers (the loops
        // over lanes unrolled), about 20 instructions a lane.
        match g {
            8 => self.balance_fixed::<8>(rows, n, weights, nic_rate, min_gain_us),
            4 => self.balance_fixed::<4>(rows, n, weights, nic_rate, min_gain_us),
            _ => self.balance_any(rows, n, weights, nic_rate, min_gain_us),
        }
        for l in 0..g {
            self.len[l * n + skip] = 0;
            self.gathered[l * n + skip] = 0;
        }
    }

    /// [`RowLens::balance`] for `G` GPUs a node, pair by pair.
    fn balance_fixed<const G: usize>(
        &mut self,
        rows: &[u64],
        n: usize,
        weights: &LaneWeights,
        nic_rate: f64,
        min_gain_us: f64,
    ) {
        let all = weights.cum[G];
        let cum: [u64; G] = std::array::from_fn(|l| weights.cum[l + 1]);
        let share: [u64; G] = std::array::from_fn(|l| weights.sharing[l]);
        for b in 0..n {
            let x: [u64; G] = std::array::from_fn(|l| rows[l * n + b]);
            let total: u64 = x.iter().sum();
            let mut t = [0u64; G];
            let mut prev = 0;
            match (total.checked_mul(all), weights.shift) {
                (Some(_), Some(shift)) => {
                    for (t, &c) in t.iter_mut().zip(&cum) {
                        let at = (total * c) >> shift;
                        *t = at - prev;
                        prev = at;
                    }
                }
                _ => {
                    for (l, t) in t.iter_mut().enumerate() {
                        let at = weights.upto(total, l + 1);
                        *t = at - prev;
                        prev = at;
                    }
                }
            }
            let (mut busiest, mut busiest_target) = (0u64, 0u64);
            for ((&x, &t), &c) in x.iter().zip(&t).zip(&share) {
                busiest = busiest.max(x * c);
                busiest_target = busiest_target.max(t * c);
            }
            let gain = busiest as f64 / nic_rate - busiest_target as f64 / nic_rate;
            // Not worth a move: every lane sends its own bytes.
            let own_only = gain <= min_gain_us;
            for (l, (&x, &t)) in x.iter().zip(&t).enumerate() {
                let at = l * n + b;
                if own_only {
                    self.gathered[at] = 0;
                    self.len[at] = x;
                } else {
                    self.gathered[at] = t.saturating_sub(x);
                    self.len[at] = t;
                }
            }
        }
    }

    /// [`RowLens::balance`] for any number of GPUs, lane by lane over the
    /// row.
    fn balance_any(
        &mut self,
        rows: &[u64],
        n: usize,
        weights: &LaneWeights,
        nic_rate: f64,
        min_gain_us: f64,
    ) {
        let g = weights.sharing.len();
        self.total.clear();
        self.total.extend_from_slice(&rows[..n]);
        for row in rows.chunks_exact(n).skip(1) {
            for (t, &x) in self.total.iter_mut().zip(row) {
                *t += x;
            }
        }
        self.busiest.clear();
        self.busiest.resize(n, 0);
        self.busiest_target.clear();
        self.busiest_target.resize(n, 0);
        // The lanes' targets first (`LaneWeights::upto(total, l + 1)` less
        // `upto(total, l)`), their lengths below.
        let all = weights.cum[g];
        let largest = self.total.iter().copied().max().unwrap_or(0);
        // Every `total * cum[i]` fits: `upto` is that product over `all`.
        let fits = largest.checked_mul(all).is_some();
        let lanes = rows.chunks_exact(n).zip(self.len.chunks_exact_mut(n));
        for (l, (row, targets)) in lanes.enumerate() {
            let (lo, hi) = (weights.cum[l], weights.cum[l + 1]);
            let totals = targets.iter_mut().zip(&self.total);
            match (fits, weights.shift) {
                (true, Some(shift)) => {
                    for (t, &total) in totals {
                        *t = ((total * hi) >> shift) - ((total * lo) >> shift);
                    }
                }
                (true, None) => {
                    for (t, &total) in totals {
                        *t = total * hi / all - total * lo / all;
                    }
                }
                (false, _) => {
                    for (t, &total) in totals {
                        *t = weights.upto(total, l + 1) - weights.upto(total, l);
                    }
                }
            }
            let c = weights.sharing[l];
            let loads = self.busiest.iter_mut().zip(&mut self.busiest_target);
            for (((busiest, busiest_target), &x), &t) in loads.zip(row).zip(&*targets) {
                *busiest = (*busiest).max(x * c);
                *busiest_target = (*busiest_target).max(t * c);
            }
        }
        self.balanced.clear();
        let loads = self.busiest.iter().zip(&self.busiest_target);
        self.balanced
            .extend(loads.map(|(&busiest, &busiest_target)| {
                let gain = busiest as f64 / nic_rate - busiest_target as f64 / nic_rate;
                if gain <= min_gain_us {
                    0
                } else {
                    u64::MAX
                }
            }));
        let lanes = rows.chunks_exact(n).zip(self.len.chunks_exact_mut(n));
        for ((row, lens), gathered) in lanes.zip(self.gathered.chunks_exact_mut(n)) {
            let pairs = lens.iter_mut().zip(gathered.iter_mut());
            for (((len, gathered), &x), &m) in pairs.zip(row).zip(&self.balanced) {
                // Balanced: the target, `target - x` of it gathered; else
                // the lane's own bytes.
                let t = *len;
                *gathered = t.saturating_sub(x) & m;
                *len = (t & m) | (x & !m);
            }
        }
    }
}

/// Proportional balancing (mesh fabrics): every GPU with excess gives each
/// lane below target a share of it proportional to that lane's need, so the
/// moves of one GPU spread over all its point-to-point links instead of
/// filling one peer's need at a time. With `x_e` the excess of GPU `e`,
/// `y_d` the need of lane `d`, `E = Σ x_e = Σ y_d` and `Y_d = y_0 + … + y_d`,
/// the piece from `e` to `d` is `⌊x_e Y_d / E⌋ − ⌊x_e Y_{d−1} / E⌋` bytes:
/// each GPU's pieces tile its excess exactly, and each lane gathers its need
/// to within one byte per GPU.
fn spread_excess(
    sent: &[u64],
    first_rank: u32,
    targets: &[u64],
    lanes: &mut [Lane],
    pieces: &mut Vec<Piece>,
) {
    let excess = |l: usize| sent[l].saturating_sub(targets[l]);
    let total: u64 = (0..sent.len()).map(excess).sum();
    let cut = |x: u64, y: u64| mul_div(x, y, total.max(1));
    let mut need_before = 0u64;
    for (d, lane) in lanes.iter_mut().enumerate().take(sent.len()) {
        let need = targets[d].saturating_sub(sent[d]);
        let start = pieces.len() as u32;
        let mut gathered = 0;
        for (e, &keep) in targets.iter().enumerate().take(sent.len()) {
            let x = excess(e);
            let (lo, hi) = (cut(x, need_before), cut(x, need_before + need));
            if hi > lo {
                pieces.push(Piece {
                    src: first_rank + e as u32,
                    row_off: keep + lo,
                    len: hi - lo,
                });
                gathered += hi - lo;
            }
        }
        need_before += need;
        *lane = Lane {
            own: sent[d].min(targets[d]),
            gathered,
            pieces_start: start,
            pieces_end: pieces.len() as u32,
            ..Lane::default()
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(sent: &[u64], nics: usize, gain: f64) -> (Vec<Lane>, Vec<Piece>) {
        run_with(sent, nics, gain, false)
    }

    fn run_with(sent: &[u64], nics: usize, gain: f64, spread: bool) -> (Vec<Lane>, Vec<Piece>) {
        let w = LaneWeights::new(sent.len(), nics);
        let mut lanes = vec![Lane::default(); sent.len()];
        let mut pieces = Vec::new();
        balance_pair(
            sent,
            10,
            &w,
            50_000.0,
            gain,
            spread,
            false,
            &mut lanes,
            &mut pieces,
            &mut Vec::new(),
        );
        (lanes, pieces)
    }

    #[test]
    fn lens_only_gives_the_lanes_their_pieces_bytes() {
        let w = LaneWeights::new(4, 4);
        for sent in [
            [1000, 0, 0, 7],
            [0, 0, 0, 0],
            [5, 9, 1 << 20, 3],
            [7, 7, 7, 8],
        ] {
            for gain in [0.0, 1.0] {
                let (full, _) = run(&sent, 4, gain);
                let mut lanes = vec![Lane::default(); 4];
                let mut pieces = Vec::new();
                let args = (&sent[..], 10, &w, 50_000.0, gain, false, true);
                balance_pair(
                    args.0,
                    args.1,
                    args.2,
                    args.3,
                    args.4,
                    args.5,
                    args.6,
                    &mut lanes,
                    &mut pieces,
                    &mut Vec::new(),
                );
                assert!(pieces.is_empty());
                for (l, f) in lanes.iter().zip(&full) {
                    assert_eq!((l.own, l.gathered), (f.own, f.gathered), "{sent:?}");
                }
            }
        }
    }

    #[test]
    fn skewed_pair_is_balanced_exactly() {
        let sent = [1000, 0, 0, 7];
        let (lanes, pieces) = run(&sent, 4, 0.0);
        let lens: Vec<u64> = lanes.iter().map(Lane::len).collect();
        assert_eq!(lens.iter().sum::<u64>(), 1007);
        assert!(lens.iter().max().unwrap() - lens.iter().min().unwrap() <= 1);
        // Lane 0 keeps its head and gives its tail away.
        assert_eq!(lanes[0].own, lens[0]);
        assert!(pieces.iter().all(|p| p.src == 10));
        let moved: u64 = pieces.iter().map(|p| p.len).sum();
        assert_eq!(moved, 1000 - lens[0]);
        // Pieces tile lane 0's tail in order.
        let mut at = lens[0];
        for p in &pieces {
            assert_eq!(p.row_off, at);
            at += p.len;
        }
        assert_eq!(at, 1000);
    }

    #[test]
    fn mesh_spreads_one_gpus_excess_over_every_link() {
        // GPU 0 holds nearly everything; GPU 3 a little more than its share.
        let sent = [7000, 100, 0, 2500];
        let (lanes, pieces) = run_with(&sent, 4, 0.0, true);
        let lens: Vec<u64> = lanes.iter().map(Lane::len).collect();
        assert_eq!(lens.iter().sum::<u64>(), 9600);
        // Every lane ends within a byte per GPU of its target (2400).
        assert!(lens.iter().all(|&x| x.abs_diff(2400) <= 4), "{lens:?}");
        // GPU 0's excess goes to every lane below target, in proportion.
        let from0: Vec<u64> = (0..4)
            .map(|d| {
                pieces[lanes[d].pieces_start as usize..lanes[d].pieces_end as usize]
                    .iter()
                    .filter(|p| p.src == 10)
                    .map(|p| p.len)
                    .sum()
            })
            .collect();
        assert_eq!(from0[0], 0);
        assert!(from0[1] > 0 && from0[2] > 0, "{from0:?}");
        assert!(from0[2] > from0[1], "lane 2 needs more than lane 1");
        // Each GPU's pieces tile its excess in row order, without gaps.
        for (src, keep, excess) in [(10u32, 2400u64, 4600u64), (13, 2400, 100)] {
            let mut mine: Vec<&Piece> = pieces.iter().filter(|p| p.src == src).collect();
            mine.sort_by_key(|p| p.row_off);
            let mut at = keep;
            for p in mine {
                assert_eq!(p.row_off, at);
                at += p.len;
            }
            assert_eq!(at, keep + excess);
        }
    }

    #[test]
    fn small_gain_skips_balancing() {
        let (lanes, pieces) = run(&[100, 0], 2, 1.0);
        assert!(pieces.is_empty());
        assert_eq!(lanes[0].own, 100);
        assert_eq!(lanes[1].len(), 0);
    }

    #[test]
    fn shared_rails_get_smaller_shares() {
        // 3 GPUs on 2 NICs: GPUs 0 and 2 share NIC 0, GPU 1 has NIC 1 alone.
        let w = LaneWeights::new(3, 2);
        assert_eq!(w.sharing, vec![2, 1, 2]);
        assert_eq!(
            (0..3).map(|l| w.target(400, l)).collect::<Vec<_>>(),
            vec![100, 200, 100]
        );
        // More NICs than GPUs: every GPU has its own.
        let w = LaneWeights::new(2, 4);
        assert_eq!(w.sharing, vec![1, 1]);
    }

    /// `RowLens` gives every pair of a row the lanes `pair_lens` gives
    /// (balanced or not; with totals whose products with the weights
    /// overflow; weights that are not a power of two), and the pair of
    /// the node with itself none.
    #[test]
    fn row_lens_are_pair_lens() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut balanced = [0usize; 2];
        for case in 0..120 {
            let g = [8, 4, 2, 3][case % 4];
            let nics = [1, 2, g][case / 4 % 3];
            let n = 1 + case % 9;
            // Some rows so large that `total * cum` overflows (the path
            // through `LaneWeights::upto`'s 128-bit division).
            let bits = if case % 10 == 0 { 61 } else { 30 };
            let rows: Vec<u64> = (0..g * n)
                .map(|_| {
                    let r = next();
                    if r % 5 == 0 {
                        0
                    } else {
                        (r >> 3) % (1 << (r % bits))
                    }
                })
                .collect();
            let w = LaneWeights::new(g, nics);
            let gain = [0.0, 1.0, 50.0][case % 7 % 3];
            let skip = case % n;
            let mut row = RowLens::default();
            row.balance(&rows, n, &w, 50_000.0, gain, skip);
            let mut lens = vec![(0, 0); g];
            for b in 0..n {
                let sent: Vec<u64> = (0..g).map(|l| rows[l * n + b]).collect();
                pair_lens(&sent, &w, 50_000.0, gain, &mut lens);
                for (l, &(own, gathered)) in lens.iter().enumerate() {
                    let got = (row.len[l * n + b], row.gathered[l * n + b]);
                    let want = if b == skip {
                        (0, 0)
                    } else {
                        (own + gathered, gathered)
                    };
                    assert_eq!(got, want, "{sent:?} on {nics} NICs, gain {gain}, lane {l}");
                }
                if b != skip {
                    balanced[usize::from(lens.iter().any(|l| l.1 > 0))] += 1;
                }
            }
        }
        // Both outcomes of the gain test were exercised.
        assert!(balanced[0] > 20 && balanced[1] > 20, "{balanced:?}");
    }

    /// `pair_lens` gives the lanes' bytes `balance_pair` gives with
    /// `lens_only`, balanced or not (the gain decides), on 1-, 2- and
    /// 8-NIC nodes.
    #[test]
    fn pair_lens_are_balance_pairs_lens() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut balanced = [0usize; 2];
        for case in 0..600 {
            let g = [8, 4, 2][case % 3];
            let nics = [1, 2, g][case / 3 % 3];
            let sent: Vec<u64> = (0..g)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    if x % 5 == 0 {
                        0
                    } else {
                        (x >> 20) % (1 << (x % 30))
                    }
                })
                .collect();
            let w = LaneWeights::new(g, nics);
            let gain = [0.0, 1.0, 50.0][case % 7 % 3];
            let mut lanes = vec![Lane::default(); g];
            let (mut pieces, mut targets) = (vec![], vec![]);
            balance_pair(
                &sent,
                0,
                &w,
                50_000.0,
                gain,
                false,
                true,
                &mut lanes,
                &mut pieces,
                &mut targets,
            );
            let mut lens = vec![(0, 0); g];
            pair_lens(&sent, &w, 50_000.0, gain, &mut lens);
            let want: Vec<(u64, u64)> = lanes.iter().map(|l| (l.own, l.gathered)).collect();
            assert_eq!(lens, want, "{sent:?} on {nics} NICs, gain {gain}");
            balanced[usize::from(lens.iter().any(|l| l.1 > 0))] += 1;
        }
        // Both outcomes of the gain test were exercised.
        assert!(balanced[0] > 50 && balanced[1] > 50, "{balanced:?}");
    }
}
