//! The default chunk size of a file: the executor moves whole chunks,
//! padding included (`sizePerMscclChunk`, docs/msccl.md "The executor's
//! rules"), so every pair's last chunk carries up to a chunk of bytes the
//! plan does not move. With the largest pair in
//! [`CHUNKS_PER_LARGEST_PAIR`] chunks that is a few percent of a skewed
//! matrix's typical pair (log-normal on 8 x 8: the largest pair is about 20
//! times the mean, so half a chunk is 3.5% of it), and a NIC carries that
//! much more than its plan. A file whose busiest rank pads more than
//! [`PAD_TARGET`] of its bytes takes finer chunks, as far as the buffer's
//! chunk offsets (2^15 per buffer) allow.
//!
//! `fast`'s files (`lower::to_xml`) try chunks a quarter and a half finer
//! than the base ([`near_chunk_bytes`]) and, where the best of those is
//! still more than 3% behind the plan, chunks chosen by a score counted
//! from the plan alone ([`chunk_costs`], [`scored_chunk_bytes`]): the plan
//! is traced once in bytes, and each chunk size then costs one pass over
//! the traced pieces, so hundreds of sizes are scored for the price of
//! part of one lowering.

use super::trace::{chunks_of, trace_pieces, Piece};
use super::{ChunkMap, Layout, MAX_CNT, MAX_OFFSET};
use crate::error::Result;
use crate::plan::Plan;
use crate::traffic::TrafficMatrix;

/// Chunk sizes are multiples of this many bytes, so `count` is whole for
/// every element type up to 16 bytes.
pub const CHUNK_ALIGN: u64 = 16;
/// Chunks the largest pair is cut into by default: two steps of at most 71
/// chunks, so that split points, which move to chunk boundaries, move by
/// little against the pieces schedulers cut blocks into.
pub const CHUNKS_PER_LARGEST_PAIR: u64 = 4 * MAX_CNT as u64;

/// Bytes of each rank's send (and receive) buffer when `traffic` is cut
/// into chunks of `u` bytes and laid out as `layout` says.
pub fn buffer_bytes(traffic: &TrafficMatrix, layout: Layout, u: u64) -> u64 {
    let n = traffic.ranks();
    let k: Vec<Vec<u32>> = (0..n)
        .map(|s| {
            (0..n)
                .map(|d| {
                    traffic
                        .get(s, d)
                        .div_ceil(u.max(1))
                        .min(u64::from(u32::MAX)) as u32
                })
                .collect()
        })
        .collect();
    u64::from(ChunkMap::new(k, layout).nchunksperloop) * u
}

/// Padding a rank's sends or receives may carry over their real bytes
/// before the chunk is made finer.
pub const PAD_TARGET: f64 = 0.01;
/// Clusters up to this many ranks get the finer candidate (measured up to
/// 8 x 8): it costs a second lowering and two executor-rule simulations,
/// which on the large clusters of docs/msccl.md "Cluster size" would
/// multiply the lowering's minutes.
pub const MAX_RANKS_PRICED: usize = 64;
/// The finest default: the largest pair in at most this many times
/// [`CHUNKS_PER_LARGEST_PAIR`] chunks.
pub const MAX_REFINE: u64 = 4;

/// The smallest multiple of [`CHUNK_ALIGN`] that puts `max_entry` bytes in
/// at most `chunks` chunks.
pub fn aligned_chunk(max_entry: u64, chunks: u64) -> u64 {
    max_entry
        .div_ceil(chunks.max(1))
        .div_ceil(CHUNK_ALIGN)
        .max(1)
        * CHUNK_ALIGN
}

/// The chunk the default has always been: the largest pair in
/// [`CHUNKS_PER_LARGEST_PAIR`] chunks.
pub fn base_chunk_bytes(traffic: &TrafficMatrix) -> u64 {
    aligned_chunk(traffic.max_entry(), CHUNKS_PER_LARGEST_PAIR)
}

/// Padding over real bytes on the rank whose sends or receives chunks of
/// `u` bytes inflate most (ranks that send or receive nothing excluded).
pub fn padding_ratio(traffic: &TrafficMatrix, u: u64) -> f64 {
    let n = traffic.ranks();
    let u = u.max(1);
    let mut col = vec![(0u64, 0u64); n];
    let mut worst = 0.0f64;
    let ratio = |(pad, real): (u64, u64)| {
        if real == 0 {
            0.0
        } else {
            pad as f64 / real as f64
        }
    };
    for s in 0..n {
        let mut row = (0u64, 0u64);
        for (d, c) in col.iter_mut().enumerate() {
            let m = traffic.get(s, d);
            let pad = m.div_ceil(u) * u - m;
            row.0 += pad;
            row.1 += m;
            c.0 += pad;
            c.1 += m;
        }
        worst = worst.max(ratio(row));
    }
    col.into_iter().map(ratio).fold(worst, f64::max)
}

/// The default chunk of a file made for `traffic` in `layout`: the base
/// chunk ([`base_chunk_bytes`]) when `refine` is false or its padding is
/// within [`PAD_TARGET`]; otherwise the coarsest of the largest pair in
/// `CHUNKS_PER_LARGEST_PAIR x (1 + k/4)` chunks, `k = 1..=12` (at most
/// [`MAX_REFINE`] times as many), whose padding is within the target, or
/// the least padding of those whose buffer still has at most 2^15 chunks.
/// The lowering doubles a chunk the executor's other limits refuse.
pub fn default_chunk_bytes(traffic: &TrafficMatrix, layout: Layout, refine: bool) -> u64 {
    let max = traffic.max_entry();
    let base = base_chunk_bytes(traffic);
    if !refine {
        return base;
    }
    let (mut best, mut best_pad) = (base, padding_ratio(traffic, base));
    let quarters = 4 * MAX_REFINE;
    for k in 5..=quarters {
        if best_pad <= PAD_TARGET {
            break;
        }
        let u = aligned_chunk(max, CHUNKS_PER_LARGEST_PAIR * k / 4);
        if u >= best {
            continue;
        }
        // Finer chunks only make the buffer longer.
        if buffer_bytes(traffic, layout, u) / u > (MAX_OFFSET + 1) as u64 {
            break;
        }
        let pad = padding_ratio(traffic, u);
        if pad < best_pad {
            (best, best_pad) = (u, pad);
        }
    }
    best
}

/// Chunks a quarter and a half finer than the base (the largest pair in
/// 5/4 and 3/2 x [`CHUNKS_PER_LARGEST_PAIR`] chunks), for `fast`'s files:
/// `fast`'s inter-node transfers are mostly one primitive call at the base
/// chunk, and much finer chunks make them several calls, each a flow of
/// its own (4x8 log-normal at 3x finer: +7.3% over the plan against
/// +4.6%). None where the base chunk's padding is within [`PAD_TARGET`];
/// only those whose buffer has at most 2^15 chunks.
pub fn near_chunk_bytes(traffic: &TrafficMatrix, layout: Layout) -> Vec<u64> {
    let base = base_chunk_bytes(traffic);
    if padding_ratio(traffic, base) <= PAD_TARGET {
        return Vec::new();
    }
    let mut out: Vec<u64> = Vec::new();
    for quarters in [5, 6] {
        let u = aligned_chunk(traffic.max_entry(), CHUNKS_PER_LARGEST_PAIR * quarters / 4);
        if u < base
            && !out.contains(&u)
            && buffer_bytes(traffic, layout, u) / u <= (MAX_OFFSET + 1) as u64
        {
            out.push(u);
        }
    }
    out
}

/// The last chunks [`rescue_chunk_bytes`] tries: the base chunk times
/// these eighths (3/4, 5/8, 1/2 and 3/8 of it).
pub const RESCUE_EIGHTHS: [u64; 4] = [6, 5, 4, 3];

/// Chunks `to_xml` tries, in this order, for a file other than `fast`'s
/// whose best candidate is still more than 3% behind its
/// plan: the default finer chunk `fine` (which `spray` otherwise skips),
/// the 5/4 and 3/2 chunks ([`near_chunk_bytes`]), the two chunks the
/// plan's inter-node transfers score best at ([`scored_chunk_bytes`]) and
/// the grid of [`RESCUE_EIGHTHS`] (whose buffer fits); each once, and only
/// those finer than the base chunk. None where the
/// base chunk pads every rank within [`PAD_TARGET`].
pub fn rescue_chunk_bytes(
    plan: &Plan,
    traffic: &TrafficMatrix,
    layout: Layout,
    fine: u64,
) -> Result<Vec<u64>> {
    let base = base_chunk_bytes(traffic);
    if padding_ratio(traffic, base) <= PAD_TARGET {
        return Ok(Vec::new());
    }
    let mut out: Vec<u64> = Vec::new();
    let near = near_chunk_bytes(traffic, layout);
    let scored = scored_chunk_bytes(plan, traffic, layout, 2)?;
    let fits = |u: u64| buffer_bytes(traffic, layout, u) / u <= (MAX_OFFSET + 1) as u64;
    let grid = RESCUE_EIGHTHS
        .iter()
        .map(|&k| aligned_chunk(traffic.max_entry(), CHUNKS_PER_LARGEST_PAIR * 8 / k))
        .filter(|&u| fits(u));
    for u in std::iter::once(fine).chain(near).chain(scored).chain(grid) {
        if u < base && !out.contains(&u) {
            out.push(u);
        }
    }
    Ok(out)
}

/// Coarser chunks `to_xml` tries after [`rescue_chunk_bytes`]'s, for a file
/// other than `fast`'s still more than 3% behind its plan: the largest
/// pair in [`COARSE_OPS`] operations of at most 71 chunks (2 and 1: twice
/// and four times the base chunk), each once, only those coarser than
/// `above` (the chunk the file already has) whose buffer has at most 2^15
/// chunks and whose 71 chunks fit one Simple call (2 MiB: a larger chunk
/// only moves the same calls with more padding). A pair past 71 chunks is
/// several operations, each a primitive call and a flow of its own, and a
/// connection streams only two calls ahead of its receiver, so a stream of
/// short calls pays a round trip per two (8x8 MoE `pairwise`: +3.50% over
/// its plan at the base chunk, 327 extra operations between nodes; +2.64%
/// at twice it, +0.50% at four times, docs/benchmarks.md issue 22 item 2).
/// Independent of padding: it is the calls these chunks save.
pub fn coarse_chunk_bytes(traffic: &TrafficMatrix, layout: Layout, above: u64) -> Vec<u64> {
    let fits = |u: u64| buffer_bytes(traffic, layout, u) / u <= (MAX_OFFSET + 1) as u64;
    let one_call = super::xsim::call_bytes(super::Protocol::Simple) / MAX_CNT as u64;
    let mut out: Vec<u64> = Vec::new();
    for ops in COARSE_OPS {
        let u = aligned_chunk(traffic.max_entry(), ops * MAX_CNT as u64);
        if u > above && u <= one_call && fits(u) && !out.contains(&u) {
            out.push(u);
        }
    }
    out
}

/// Operations of at most 71 chunks the largest pair is cut into by
/// [`coarse_chunk_bytes`]'s chunks.
pub const COARSE_OPS: [u64; 2] = [2, 1];

/// Bytes [`ChunkCost::score`] adds per extra operation of an inter-node
/// transfer (see [`scored_chunk_bytes`]).
pub const RUN_BYTES: u64 = 16 << 10;
/// Finer chunks [`scored_chunk_bytes`] scores: from the base chunk down to
/// [`MAX_REFINE`] times finer, each this many thousandths finer than the
/// one before, and the finest of them whose buffer fits.
pub const SCAN_STEP_PERMILLE: u64 = 5;

/// Chunks finer than the base for `fast`'s files, from the plan alone
/// ([`chunk_costs`] of every chunk scanned): the best [`ChunkCost::score`]
/// and then the finest chunk with no more extra operations than that one
/// (the least padding and fewest transfers too short for a pacing cut
/// without more calls), at most `keep`, each scoring below the base chunk.
/// None where the base chunk pads every rank within [`PAD_TARGET`]; only
/// chunks whose buffer has at most 2^15 chunks. Scored with Simple's
/// window (`fast`'s paced files take Simple where a cut needs it).
pub fn scored_chunk_bytes(
    plan: &Plan,
    traffic: &TrafficMatrix,
    layout: Layout,
    keep: usize,
) -> Result<Vec<u64>> {
    let base = base_chunk_bytes(traffic);
    if keep == 0 || padding_ratio(traffic, base) <= PAD_TARGET {
        return Ok(Vec::new());
    }
    let fits = |u: u64| buffer_bytes(traffic, layout, u) / u <= (MAX_OFFSET + 1) as u64;
    // The finest chunk scanned: at most MAX_REFINE times finer, and the
    // finest whose buffer fits (finer chunks only make it longer).
    let mut finest = aligned_chunk(traffic.max_entry(), CHUNKS_PER_LARGEST_PAIR * MAX_REFINE);
    if !fits(finest) {
        let (mut lo, mut hi) = (finest / CHUNK_ALIGN, base / CHUNK_ALIGN);
        if !fits(hi * CHUNK_ALIGN) {
            return Ok(Vec::new());
        }
        while hi - lo > 1 {
            let mid = (lo + hi) / 2;
            if fits(mid * CHUNK_ALIGN) {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        finest = hi * CHUNK_ALIGN;
    }
    let mut us = vec![base];
    let mut u = base;
    loop {
        let next = (u * (1000 - SCAN_STEP_PERMILLE) / 1000) / CHUNK_ALIGN * CHUNK_ALIGN;
        u = next.min(u - CHUNK_ALIGN);
        if u <= finest {
            break;
        }
        us.push(u);
    }
    if finest < base {
        us.push(finest);
    }
    let window = super::Protocol::Simple.fifo_depth() as u64;
    let costs = chunk_costs(plan, traffic, window, RUN_BYTES, &us)?;
    Ok(pick_scored(&costs, keep))
}

/// [`scored_chunk_bytes`]'s choice among `costs`, the base chunk's first.
fn pick_scored(costs: &[ChunkCost], keep: usize) -> Vec<u64> {
    let Some((base, finer)) = costs.split_first() else {
        return Vec::new();
    };
    let better = || finer.iter().filter(|c| c.score < base.score);
    let Some(best) = better().min_by_key(|c| (c.score, std::cmp::Reverse(c.u))) else {
        return Vec::new();
    };
    let mut out = vec![best.u];
    if let Some(f) = better()
        .filter(|c| c.extra_runs <= best.extra_runs)
        .min_by_key(|c| c.u)
    {
        if f.u != best.u {
            out.push(f.u);
        }
    }
    out.truncate(keep);
    out
}

/// What chunks of `u` bytes make of a plan's inter-node transfers,
/// counted from the plan's byte pieces alone, without lowering.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkCost {
    pub u: u64,
    /// Bytes the busiest gpu sends or receives between nodes, every
    /// transfer's chunks whole.
    pub nic_bytes: u64,
    /// Inter-node transfers of fewer than `2 window + 1` chunks: too short
    /// for a full pacing cut (head and tail), so their waits may leak.
    pub short: usize,
    /// Operations of inter-node transfers beyond one each: transfers of
    /// more than [`MAX_CNT`] chunks, each extra operation a step and a
    /// call of its own.
    pub extra_runs: usize,
    /// The score: the most any gpu sends or receives between nodes, whole
    /// chunks included, with `run_bytes` added per extra operation there.
    pub score: u64,
}

/// [`ChunkCost`] of each chunk of `us`, for `plan` on `traffic`, with a
/// connection window of `window` calls. The plan is traced once, in bytes
/// (`trace::trace_pieces`); each chunk then costs a pass over the pieces.
pub fn chunk_costs(
    plan: &Plan,
    traffic: &TrafficMatrix,
    window: u64,
    run_bytes: u64,
    us: &[u64],
) -> Result<Vec<ChunkCost>> {
    let pieces = trace_pieces(plan, traffic, &[])?;
    Ok(costs_of_pieces(
        plan, traffic, &pieces, window, run_bytes, us,
    ))
}

/// [`chunk_costs`] of traced pieces.
fn costs_of_pieces(
    plan: &Plan,
    traffic: &TrafficMatrix,
    pieces: &[(usize, Vec<Piece>)],
    window: u64,
    run_bytes: u64,
    us: &[u64],
) -> Vec<ChunkCost> {
    let n = traffic.ranks();
    let g = (plan.gpus_per_node as usize).max(1);
    // Inter-node transfers' pieces with their block lengths.
    // (sending rank, receiving rank, (a, b, block length) of each piece).
    type Inter = (usize, usize, Vec<(u64, u64, u64)>);
    let inter: Vec<Inter> = pieces
        .iter()
        .filter_map(|(i, ps)| {
            let t = plan.transfers.get(*i)?;
            let (s, d) = (t.src as usize, t.dst as usize);
            (s / g != d / g && s < n && d < n).then(|| {
                let ps = ps
                    .iter()
                    .map(|&(ps, pd, a, b)| (a, b, traffic.get(ps as usize, pd as usize)))
                    .collect();
                (s, d, ps)
            })
        })
        .collect();
    us.iter()
        .map(|&u| {
            let u = u.max(1);
            let mut tx = vec![0u64; n];
            let mut rx = vec![0u64; n];
            let mut runs = vec![(0u64, 0u64); n];
            let (mut short, mut extra_runs) = (0, 0);
            for (s, d, ps) in &inter {
                let c: u64 = ps
                    .iter()
                    .map(|&(a, b, len)| {
                        let r = chunks_of(a, b, u, len);
                        r.end - r.start
                    })
                    .sum();
                if c == 0 {
                    continue;
                }
                tx[*s] += c * u;
                rx[*d] += c * u;
                short += usize::from(c < 2 * window + 1);
                let extra = c.div_ceil(MAX_CNT as u64) - 1;
                extra_runs += extra as usize;
                runs[*s].0 += extra;
                runs[*d].1 += extra;
            }
            let score = (0..n)
                .map(|r| (tx[r] + run_bytes * runs[r].0).max(rx[r] + run_bytes * runs[r].1))
                .max()
                .unwrap_or(0);
            ChunkCost {
                u,
                nic_bytes: tx.into_iter().chain(rx).max().unwrap_or(0),
                short,
                extra_runs,
                score,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padding_is_counted_on_the_worst_rank() {
        // Rank 0 sends 100 and 30 bytes (u = 64: 28 + 34 padding over
        // 130); rank 1 sends 64 twice (none). Column 1 receives 30 + 64
        // (34 over 94), column 0 receives 100 + 64 (28 over 164).
        let m = TrafficMatrix::from_rows(vec![vec![100, 30], vec![64, 64]]);
        let r = padding_ratio(&m, 64);
        assert!((r - 62.0 / 130.0).abs() < 1e-12, "{r}");
        assert_eq!(padding_ratio(&m, 1), 0.0);
    }

    #[test]
    fn costs_count_whole_chunks_and_extra_runs_per_gpu() {
        use crate::sched::{schedule, Options};
        use crate::topology::Topology;
        use crate::Algorithm;
        // 2 x 8 ranks: rank 0 sends 1000 B to rank 8 and 250 B to rank 9
        // (other node), 300 B to rank 1 (same node: not counted).
        let topo = Topology::preset("dgx-h100", 2, None).unwrap();
        let mut rows = vec![vec![0u64; 16]; 16];
        rows[0][8] = 1000;
        rows[0][9] = 250;
        rows[0][1] = 300;
        let m = TrafficMatrix::from_rows(rows);
        let plan = schedule(Algorithm::Direct, &topo, &m, &Options::default()).unwrap();
        let c = chunk_costs(&plan, &m, 2, 100, &[64, 16, 8]).unwrap();
        // u = 64: 16 + 4 chunks leave rank 0 (1280 B); 250 B is 4 chunks,
        // short of a head and tail of 2 each (5 chunks).
        assert_eq!((c[0].u, c[0].nic_bytes, c[0].short), (64, 1280, 1));
        assert_eq!((c[0].extra_runs, c[0].score), (0, 1280));
        // u = 16: 63 + 16 chunks, 1264 B.
        assert_eq!((c[1].nic_bytes, c[1].short, c[1].extra_runs), (1264, 0, 0));
        // u = 8: 125 + 32 chunks (1256 B); 125 chunks are two operations
        // (71 at most each), one extra on rank 0's sends and rank 8's
        // receives: rank 0 scores 1256 + 100, rank 8 1000 + 100.
        assert_eq!((c[2].nic_bytes, c[2].extra_runs), (1256, 1));
        assert_eq!(c[2].score, 1356);
    }

    #[test]
    fn scored_picks_the_best_score_then_the_finest_without_more_runs() {
        let c = |u, score, extra_runs| ChunkCost {
            u,
            nic_bytes: score,
            short: 0,
            extra_runs,
            score,
        };
        // The base chunk (first) scores 1000; 60 scores worse and is never
        // taken. The best is 80 (two extra runs); the finest with at most
        // two is 70.
        let costs = [
            c(100, 1000, 0),
            c(90, 990, 0),
            c(80, 950, 2),
            c(70, 980, 0),
            c(60, 1010, 0),
        ];
        assert_eq!(pick_scored(&costs, 2), vec![80, 70]);
        assert_eq!(pick_scored(&costs, 1), vec![80]);
        // The best without extra runs: 80 (runs 1) is finer but adds one.
        let costs = [c(100, 1000, 0), c(90, 940, 0), c(85, 990, 0), c(80, 960, 1)];
        assert_eq!(pick_scored(&costs, 2), vec![90, 85]);
        // Nothing scores below the base: none.
        assert!(pick_scored(&[c(100, 1000, 0), c(90, 1000, 0)], 2).is_empty());
    }

    #[test]
    fn near_chunks_a_quarter_and_a_half_finer() {
        let u = TrafficMatrix::uniform(4, 1 << 20);
        assert!(near_chunk_bytes(&u, Layout::Padded).is_empty());
        let n = 8;
        let mut rows = vec![vec![3000u64; n]; n];
        rows[0][1] = 10_000_000;
        let m = TrafficMatrix::from_rows(rows);
        let base = base_chunk_bytes(&m);
        let near = near_chunk_bytes(&m, Layout::Packed);
        assert_eq!(
            near,
            vec![
                aligned_chunk(10_000_000, CHUNKS_PER_LARGEST_PAIR * 5 / 4),
                aligned_chunk(10_000_000, CHUNKS_PER_LARGEST_PAIR * 3 / 2)
            ]
        );
        assert!(near[0] < base && near[1] < near[0], "{near:?} vs {base}");
    }

    #[test]
    fn coarse_chunks_put_the_largest_pair_in_two_operations_then_one() {
        let mut rows = vec![vec![3000u64; 16]; 16];
        rows[0][9] = 1_000_000;
        let m = TrafficMatrix::from_rows(rows);
        let base = base_chunk_bytes(&m);
        // 1e6 B in 142 and in 71 chunks, aligned to 16 B.
        let (two, one) = (7056, 14096);
        assert_eq!(
            (aligned_chunk(1_000_000, 142), aligned_chunk(1_000_000, 71)),
            (two, one)
        );
        assert_eq!(coarse_chunk_bytes(&m, Layout::Packed, base), vec![two, one]);
        // Only those coarser than the file's chunk.
        assert_eq!(coarse_chunk_bytes(&m, Layout::Packed, two), vec![one]);
        assert!(coarse_chunk_bytes(&m, Layout::Packed, one).is_empty());
        // A pair past two Simple calls (2 MiB each): 71 chunks of the
        // coarse chunk would not fit one call, so none.
        let mut rows = vec![vec![3000u64; 16]; 16];
        rows[0][9] = 5_000_000;
        let m = TrafficMatrix::from_rows(rows);
        assert!(coarse_chunk_bytes(&m, Layout::Packed, base_chunk_bytes(&m)).is_empty());
    }

    #[test]
    fn rescue_chunks_fine_near_then_scored_each_once_below_the_base() {
        use crate::sched::{schedule, Options};
        use crate::topology::Topology;
        use crate::Algorithm;
        let topo = Topology::preset("dgx-h100", 2, None).unwrap();
        let opts = Options::default();
        // Uniform: nothing pads, nothing to rescue with.
        let u = TrafficMatrix::uniform(16, 1 << 20);
        let plan = schedule(Algorithm::Direct, &topo, &u, &opts).unwrap();
        assert!(rescue_chunk_bytes(&plan, &u, Layout::Packed, 4096)
            .unwrap()
            .is_empty());
        // One large pair (between nodes) and small ones: padding costs.
        let mut rows = vec![vec![3000u64; 16]; 16];
        rows[0][9] = 10_000_000;
        let m = TrafficMatrix::from_rows(rows);
        let plan = schedule(Algorithm::Direct, &topo, &m, &opts).unwrap();
        let base = base_chunk_bytes(&m);
        let fine = default_chunk_bytes(&m, Layout::Packed, true);
        let near = near_chunk_bytes(&m, Layout::Packed);
        let scored = scored_chunk_bytes(&plan, &m, Layout::Packed, 2).unwrap();
        let got = rescue_chunk_bytes(&plan, &m, Layout::Packed, fine).unwrap();
        let grid = RESCUE_EIGHTHS
            .iter()
            .map(|&k| aligned_chunk(10_000_000, CHUNKS_PER_LARGEST_PAIR * 8 / k));
        let mut want: Vec<u64> = Vec::new();
        for u in std::iter::once(fine).chain(near).chain(scored).chain(grid) {
            if u < base && !want.contains(&u) {
                want.push(u);
            }
        }
        assert!(fine < base && got[0] == fine, "{got:?}, fine {fine}");
        assert!(got.len() >= 6, "{got:?}");
        // The grid's last: 3/8 of the base (aligned).
        assert!(got.contains(&aligned_chunk(10_000_000, CHUNKS_PER_LARGEST_PAIR * 8 / 3)));
        assert_eq!(got, want);
        // A `fine` no finer than the base is left out.
        let got = rescue_chunk_bytes(&plan, &m, Layout::Packed, base).unwrap();
        assert!(!got.contains(&base) && got.iter().all(|&u| u < base));
    }

    #[test]
    fn finer_chunks_only_where_padding_costs() {
        // Uniform: no padding at the base chunk, which is kept.
        let u = TrafficMatrix::uniform(4, 1 << 20);
        assert_eq!(
            default_chunk_bytes(&u, Layout::Padded, true),
            base_chunk_bytes(&u)
        );
        // One large pair and many small ones whose last chunks are mostly
        // padding: a finer chunk, within the target where the buffer
        // allows, and the base chunk when not asked to refine.
        let n = 8;
        let mut rows = vec![vec![3000u64; n]; n];
        rows[0][1] = 10_000_000;
        let m = TrafficMatrix::from_rows(rows);
        let base = base_chunk_bytes(&m);
        assert!(padding_ratio(&m, base) > PAD_TARGET);
        assert_eq!(default_chunk_bytes(&m, Layout::Packed, false), base);
        let fine = default_chunk_bytes(&m, Layout::Packed, true);
        assert!(fine < base, "{fine} vs {base}");
        assert!(fine * MAX_REFINE + CHUNK_ALIGN * MAX_REFINE >= base);
        assert!(padding_ratio(&m, fine) < padding_ratio(&m, base));
        // The buffer limit holds whatever the layout.
        for layout in [Layout::Padded, Layout::Packed] {
            let u = default_chunk_bytes(&m, layout, true);
            assert!(buffer_bytes(&m, layout, u) / u <= (MAX_OFFSET + 1) as u64);
        }
    }
}
