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

use super::lower::{buffer_bytes, CHUNKS_PER_LARGEST_PAIR, CHUNK_ALIGN};
use super::{Layout, MAX_OFFSET};
use crate::traffic::TrafficMatrix;

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
