//! Synthetic traffic: the patterns benchmarks and tests run on.
//!
//! Owns the generator behind `switchyard traffic`. Every pattern is
//! deterministic for a seed (ChaCha8). `moe` models expert routing: each rank
//! holds `tokens_per_rank` tokens, each token picks `top_k` distinct experts
//! with Zipf popularity (`skew`, 0 = uniform) over experts shuffled by the
//! seed, and sends `hidden * bytes_per_elem` bytes to the rank owning each.

use std::str::FromStr;

use rand::distr::weighted::WeightedIndex;
use rand::distr::Distribution;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::StandardNormal;

use crate::error::{InputError, Result};
use crate::traffic::{TrafficMatrix, MAX_TOTAL_BYTES};

/// Most ranks the generator makes a matrix for: `ranks^2` cells are held and
/// printed, 16 M of them here.
pub const MAX_GENERATED_RANKS: usize = 4096;
/// Most expert choices `moe` draws (`ranks * tokens * top_k`), each a random
/// sample: beyond this the generator would run for minutes.
pub const MAX_ROUTING_DECISIONS: u64 = 1 << 30;

/// A traffic pattern (`--pattern`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Pattern {
    /// `bytes` between every pair.
    Uniform,
    /// MoE routing with expert popularity Zipf(s): `moe` with `skew = s`.
    Zipf(f64),
    /// A fraction `f` of every rank's traffic goes to one hot rank.
    Hotspot(f64),
    /// Every pair independently log-normal with mean `bytes` and sigma `s`.
    Lognormal(f64),
    /// MoE routing with the [`MoeParams`] given.
    Moe,
    /// Every node pair carries the same bytes, but inside each node the
    /// senders and receivers are skewed Zipf(s) (balanced across nodes,
    /// skewed inside them).
    IntraSkew(f64),
}

impl FromStr for Pattern {
    type Err = InputError;
    fn from_str(s: &str) -> std::result::Result<Self, InputError> {
        let bad = |reason: String| InputError::new("--pattern", reason);
        let (name, arg) = match s.split_once(':') {
            Some((n, a)) => (n, Some(a)),
            None => (s, None),
        };
        let num = |what: &str| -> std::result::Result<f64, InputError> {
            let a = arg.ok_or_else(|| bad(format!("`{name}` needs a parameter: {name}:{what}")))?;
            let x: f64 = a
                .parse()
                .map_err(|_| bad(format!("`{a}` is not a number in `{s}`")))?;
            if !x.is_finite() || x < 0.0 {
                return Err(bad(format!("{what} must be zero or positive in `{s}`")));
            }
            Ok(x)
        };
        let p = match name {
            "uniform" => Pattern::Uniform,
            "moe" => Pattern::Moe,
            "zipf" => Pattern::Zipf(num("S")?),
            "hotspot" => {
                let f = num("F")?;
                if f > 1.0 {
                    return Err(bad(format!("hotspot fraction must be in [0, 1] in `{s}`")));
                }
                Pattern::Hotspot(f)
            }
            "lognormal" => Pattern::Lognormal(num("SIGMA")?),
            "intra-skew" => Pattern::IntraSkew(num("S")?),
            _ => {
                return Err(bad(format!(
                    "unknown pattern `{s}` (known: uniform, zipf:S, hotspot:F, lognormal:SIGMA, moe, intra-skew:S)"
                )))
            }
        };
        if arg.is_some() && matches!(p, Pattern::Uniform | Pattern::Moe) {
            return Err(bad(format!("`{name}` takes no parameter")));
        }
        Ok(p)
    }
}

/// Expert-routing parameters of the `moe` and `zipf:S` patterns.
#[derive(Clone, Debug, PartialEq)]
pub struct MoeParams {
    pub experts_per_gpu: usize,
    pub top_k: usize,
    pub tokens_per_rank: usize,
    pub hidden: usize,
    pub bytes_per_elem: usize,
    /// Zipf exponent of expert popularity (0 = every expert equally popular).
    pub skew: f64,
}

impl Default for MoeParams {
    fn default() -> Self {
        MoeParams {
            experts_per_gpu: 4,
            top_k: 2,
            tokens_per_rank: 4096,
            hidden: 4096,
            bytes_per_elem: 2,
            skew: 1.0,
        }
    }
}

/// Everything the generator needs.
#[derive(Clone, Debug, PartialEq)]
pub struct TrafficSpec {
    pub ranks: usize,
    pub pattern: Pattern,
    pub seed: u64,
    /// Mean bytes per pair for `uniform`, `hotspot`, `lognormal`, `intra-skew`.
    pub bytes: u64,
    /// GPUs per node, for `intra-skew`.
    pub gpus_per_node: usize,
    pub moe: MoeParams,
}

impl TrafficSpec {
    pub fn new(ranks: usize, pattern: Pattern) -> Self {
        TrafficSpec {
            ranks,
            pattern,
            seed: 0,
            bytes: 1 << 20,
            gpus_per_node: 8,
            moe: MoeParams::default(),
        }
    }

    /// Sets the mean bytes per GPU pair for every pattern: `bytes` for the
    /// byte-sized ones, and the MoE tokens per rank so that a `moe` or
    /// `zipf` matrix's mean pair is near `pair_bytes` too (at least one
    /// token per rank).
    pub fn set_mean_pair_bytes(&mut self, pair_bytes: u64) {
        self.bytes = pair_bytes;
        let per_token = (self.moe.top_k * self.moe.hidden * self.moe.bytes_per_elem).max(1);
        self.moe.tokens_per_rank = (pair_bytes as usize * self.ranks / per_token).max(1);
    }
}

/// Generates a traffic matrix; the same spec always gives the same matrix.
pub fn generate(spec: &TrafficSpec) -> Result<TrafficMatrix> {
    let n = spec.ranks;
    let bad = |place: &str, reason: String| InputError::at("<generator>", place, reason);
    if n == 0 {
        return Err(bad("--ranks", "must be at least 1".into()).into());
    }
    if n > MAX_GENERATED_RANKS {
        return Err(bad(
            "--ranks",
            format!("{n} ranks; the generator makes matrices of at most {MAX_GENERATED_RANKS}"),
        )
        .into());
    }
    let too_much = || {
        bad(
            "--bytes",
            "the matrix would carry more than 2^53 bytes (9 PB), the most one all-to-all may carry"
                .into(),
        )
    };
    // The mean matrix, n^2 pairs of `bytes`, must fit before any cell is drawn
    // (cells are computed in f64 and saturate; the total is checked at the end).
    let n2 = (n * n) as u64;
    if !matches!(spec.pattern, Pattern::Moe | Pattern::Zipf(_))
        && spec
            .bytes
            .checked_mul(n2)
            .is_none_or(|t| t > MAX_TOTAL_BYTES)
    {
        return Err(too_much().into());
    }
    let mut rng = ChaCha8Rng::seed_from_u64(spec.seed);
    let mut m = TrafficMatrix::zeros(n);
    let mean = spec.bytes as f64;
    match spec.pattern {
        Pattern::Uniform => m = TrafficMatrix::uniform(n, spec.bytes),
        Pattern::Lognormal(sigma) => {
            for s in 0..n {
                for d in 0..n {
                    let z: f64 = StandardNormal.sample(&mut rng);
                    m.set(
                        s,
                        d,
                        (mean * (sigma * z - sigma * sigma / 2.0).exp()).round() as u64,
                    );
                }
            }
        }
        Pattern::Hotspot(f) => {
            let hot = (rng.next_u64_below(n as u64)) as usize;
            let row_total = mean * n as f64;
            let base = ((1.0 - f) * row_total / n as f64).round() as u64;
            let extra = (f * row_total).round() as u64;
            for s in 0..n {
                for d in 0..n {
                    m.set(s, d, base.saturating_add(if d == hot { extra } else { 0 }));
                }
            }
        }
        Pattern::IntraSkew(skew) => {
            let g = spec.gpus_per_node;
            if g == 0 || n % g != 0 {
                return Err(bad(
                    "--gpus",
                    format!("{n} ranks do not split into nodes of {g} GPUs"),
                )
                .into());
            }
            let nodes = n / g;
            let weights = |rng: &mut ChaCha8Rng| -> Vec<f64> {
                let mut w = zipf_weights(g, skew);
                w.shuffle(rng);
                w
            };
            let send_w: Vec<Vec<f64>> = (0..nodes).map(|_| weights(&mut rng)).collect();
            let recv_w: Vec<Vec<f64>> = (0..nodes).map(|_| weights(&mut rng)).collect();
            let pair_total = mean * (g * g) as f64;
            for s in 0..n {
                for d in 0..n {
                    let (a, b) = (s / g, d / g);
                    let w = send_w[a][s % g] * recv_w[b][d % g];
                    m.set(s, d, (pair_total * w).round() as u64);
                }
            }
        }
        Pattern::Moe => moe(&mut m, &spec.moe, &mut rng)?,
        Pattern::Zipf(skew) => {
            let p = MoeParams {
                skew,
                ..spec.moe.clone()
            };
            moe(&mut m, &p, &mut rng)?
        }
    }
    // Log-normal tails and rounding can pass the mean's total.
    let total = m.as_slice().iter().try_fold(0u64, |t, &b| t.checked_add(b));
    if total.is_none_or(|t| t > MAX_TOTAL_BYTES) {
        return Err(too_much().into());
    }
    Ok(m)
}

/// Normalised Zipf weights `1/(k+1)^s` for `k` in `0..n`.
fn zipf_weights(n: usize, s: f64) -> Vec<f64> {
    let w: Vec<f64> = (0..n).map(|k| 1.0 / ((k + 1) as f64).powf(s)).collect();
    let total: f64 = w.iter().sum();
    w.into_iter().map(|x| x / total).collect()
}

fn moe(m: &mut TrafficMatrix, p: &MoeParams, rng: &mut ChaCha8Rng) -> Result<()> {
    let n = m.ranks();
    let bad = |place: &str, reason: &str| InputError::at("<generator>", place, reason);
    if p.experts_per_gpu == 0 {
        return Err(bad("--experts-per-gpu", "must be at least 1").into());
    }
    if !p.skew.is_finite() || p.skew < 0.0 {
        return Err(bad("--skew", "must be zero or positive").into());
    }
    // One popularity weight per expert is held: at most 2^24 of them.
    let experts = n
        .checked_mul(p.experts_per_gpu)
        .filter(|&e| e <= 1 << 24)
        .ok_or_else(|| bad("--experts-per-gpu", "more than 2^24 experts in all"))?;
    if p.top_k == 0 || p.top_k > experts {
        return Err(bad(
            "--top-k",
            &format!("must be between 1 and the number of experts ({experts})"),
        )
        .into());
    }
    let decisions = (n as u64)
        .checked_mul(p.tokens_per_rank as u64)
        .and_then(|x| x.checked_mul(p.top_k as u64))
        .filter(|&x| x <= MAX_ROUTING_DECISIONS);
    let Some(decisions) = decisions else {
        return Err(bad(
            "--tokens",
            "ranks x tokens x top-k is more than 2^30 expert choices to draw",
        )
        .into());
    };
    // Every choice sends one token: the total must fit before any is added.
    let token_bytes = (p.hidden as u64)
        .checked_mul(p.bytes_per_elem as u64)
        .filter(|&b| {
            decisions
                .checked_mul(b)
                .is_some_and(|t| t <= MAX_TOTAL_BYTES)
        })
        .ok_or_else(|| {
            bad(
                "--hidden",
                "the tokens would carry more than 2^53 bytes (9 PB), the most one all-to-all may carry",
            )
        })?;
    let mut popularity = zipf_weights(experts, p.skew);
    popularity.shuffle(rng);
    let dist = WeightedIndex::new(&popularity).map_err(|e| bad("--skew", &e.to_string()))?;
    let mut picked: Vec<usize> = Vec::with_capacity(p.top_k);
    for s in 0..n {
        for _ in 0..p.tokens_per_rank {
            picked.clear();
            // Distinct experts per token: redraw duplicates (top_k << experts in practice;
            // after many misses fall back to the next free expert so this always ends).
            let mut misses = 0;
            while picked.len() < p.top_k {
                let mut e = dist.sample(rng);
                if picked.contains(&e) {
                    misses += 1;
                    if misses < 64 {
                        continue;
                    }
                    while picked.contains(&e) {
                        e = (e + 1) % experts;
                    }
                }
                picked.push(e);
            }
            for &e in &picked {
                m.add(s, e / p.experts_per_gpu, token_bytes);
            }
        }
    }
    Ok(())
}

trait BelowExt {
    fn next_u64_below(&mut self, n: u64) -> u64;
}

impl BelowExt for ChaCha8Rng {
    fn next_u64_below(&mut self, n: u64) -> u64 {
        use rand::Rng;
        self.random_range(0..n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn mean_pair_bytes_scales_moe_tokens() {
        let mut spec = TrafficSpec::new(16, Pattern::Zipf(1.0));
        spec.set_mean_pair_bytes(65536);
        assert_eq!(spec.bytes, 65536);
        // 2 experts per token, 4096 bf16 elements: 16 KiB per token copy.
        assert_eq!(spec.moe.tokens_per_rank, 65536 * 16 / (2 * 4096 * 2));
        let m = generate(&spec).unwrap();
        let mean = m.total() as f64 / (16.0 * 16.0);
        assert!((mean / 65536.0 - 1.0).abs() < 0.05, "mean pair {mean}");
        spec.set_mean_pair_bytes(1);
        assert_eq!(spec.moe.tokens_per_rank, 1);
    }

    #[test]
    fn parses_patterns() {
        assert_eq!("zipf:1.2".parse::<Pattern>().unwrap(), Pattern::Zipf(1.2));
        assert_eq!(
            "hotspot:0.5".parse::<Pattern>().unwrap(),
            Pattern::Hotspot(0.5)
        );
        assert!("zipf"
            .parse::<Pattern>()
            .unwrap_err()
            .to_string()
            .contains("needs a parameter"));
        assert!("ring"
            .parse::<Pattern>()
            .unwrap_err()
            .to_string()
            .contains("unknown pattern"));
        assert!("hotspot:2".parse::<Pattern>().is_err());
    }

    #[test]
    fn moe_totals_are_exact() {
        let mut spec = TrafficSpec::new(16, Pattern::Zipf(1.0));
        spec.moe.tokens_per_rank = 128;
        let m = generate(&spec).unwrap();
        let per_rank = 128 * 2 * 4096 * 2;
        for s in 0..16 {
            assert_eq!(m.row_sum(s), per_rank);
        }
        // Skewed: the hottest receiver gets far more than the mean.
        let max_col = (0..16).map(|d| m.col_sum(d)).max().unwrap();
        assert!(max_col > 2 * per_rank, "{max_col}");
    }

    #[test]
    fn intra_skew_is_balanced_across_nodes() {
        let mut spec = TrafficSpec::new(16, Pattern::IntraSkew(1.5));
        spec.gpus_per_node = 4;
        let m = generate(&spec).unwrap();
        let node_pair = |a: usize, b: usize| -> u64 {
            (0..4)
                .flat_map(|i| (0..4).map(move |j| (i, j)))
                .map(|(i, j)| m.get(a * 4 + i, b * 4 + j))
                .sum()
        };
        let t = node_pair(0, 1) as f64;
        assert!((node_pair(2, 3) as f64 - t).abs() / t < 1e-3);
        assert!(m.get(0, 5) != m.get(1, 5) || m.get(0, 5) != m.get(0, 6));
    }

    #[test]
    fn parameters_that_overflow_or_never_end_are_rejected() {
        let err = |spec: &TrafficSpec| generate(spec).unwrap_err().to_string();
        // n^2 cells were allocated whatever n was.
        let e = err(&TrafficSpec::new(100_000_000, Pattern::Uniform));
        assert!(e.starts_with("<generator>: --ranks: 100000000 ranks; the generator makes matrices of at most 4096"), "{e}");
        // `base + extra` and the layout's sums overflowed.
        let mut spec = TrafficSpec::new(4, Pattern::Hotspot(0.5));
        spec.bytes = u64::MAX;
        assert!(err(&spec).contains("--bytes: the matrix would carry more than 2^53 bytes"));
        // `hidden * bytes_per_elem` overflowed; 2^64 tokens never ended.
        let mut spec = TrafficSpec::new(4, Pattern::Moe);
        spec.moe.hidden = usize::MAX;
        spec.moe.bytes_per_elem = 8;
        assert!(err(&spec).contains("--hidden"));
        let mut spec = TrafficSpec::new(4, Pattern::Moe);
        spec.moe.tokens_per_rank = usize::MAX;
        assert!(err(&spec).contains("--tokens"));
        let mut spec = TrafficSpec::new(4, Pattern::Moe);
        spec.moe.experts_per_gpu = 1 << 30;
        assert!(err(&spec).contains("--experts-per-gpu: more than 2^24 experts"));
        let mut spec = TrafficSpec::new(4, Pattern::Moe);
        spec.moe.skew = -5.0;
        assert!(err(&spec).contains("--skew: must be zero or positive"));
    }

    proptest! {
        #[test]
        fn deterministic_and_square(n in 1usize..12, seed in 0u64..1000, which in 0usize..6) {
            let pattern = [Pattern::Uniform, Pattern::Zipf(0.8), Pattern::Hotspot(0.3),
                           Pattern::Lognormal(1.0), Pattern::Moe, Pattern::IntraSkew(1.0)][which];
            let mut spec = TrafficSpec::new(n, pattern);
            spec.seed = seed;
            spec.gpus_per_node = 1;
            spec.moe.tokens_per_rank = 16;
            let a = generate(&spec).unwrap();
            let b = generate(&spec).unwrap();
            prop_assert_eq!(&a, &b);
            prop_assert_eq!(a.ranks(), n);
            if matches!(pattern, Pattern::Zipf(_) | Pattern::Moe) {
                let expect = (16 * 2 * 4096 * 2) as u64;
                for s in 0..n { prop_assert_eq!(a.row_sum(s), expect); }
            }
            if pattern == Pattern::Uniform {
                prop_assert_eq!(a.total(), (n * n) as u64 * (1 << 20));
            }
            if let Pattern::Hotspot(_) = pattern {
                let rows: Vec<u64> = (0..n).map(|s| a.row_sum(s)).collect();
                prop_assert!(rows.iter().all(|&r| r == rows[0]));
            }
        }
    }
}
