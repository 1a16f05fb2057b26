//! The input pattern and the output check.
//!
//! Byte `k` of block (s, d), the bytes rank `s` sends to rank `d`, holds a
//! byte of a hash of (s, d, k / 8): every block is distinct from every other
//! and from any shifted copy of itself, so a byte delivered to the wrong rank,
//! the wrong offset or from the wrong source is caught. Filling and checking
//! work eight bytes at a time.

use std::fmt;

use switchyard_compiler::{Layout, TrafficMatrix};

/// SplitMix64's finaliser: a cheap, well-mixed 64-bit hash.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn block_key(src: usize, dst: usize) -> u64 {
    mix(((src as u64) << 32) ^ dst as u64 ^ 0x5357_5944)
}

/// Eight pattern bytes of block (src, dst) starting at byte `8 * word`.
fn word(key: u64, word: u64) -> [u8; 8] {
    mix(key ^ word.wrapping_mul(0xD6E8_FEB8_6659_FD93)).to_le_bytes()
}

/// The pattern byte at offset `k` of block (src, dst).
pub fn byte(src: usize, dst: usize, k: u64) -> u8 {
    word(block_key(src, dst), k / 8)[(k % 8) as usize]
}

/// Writes block (src, dst)'s pattern into `buf` (the whole block).
pub fn fill_block(buf: &mut [u8], src: usize, dst: usize) {
    let key = block_key(src, dst);
    for (w, chunk) in buf.chunks_mut(8).enumerate() {
        chunk.copy_from_slice(&word(key, w as u64)[..chunk.len()]);
    }
}

/// Fills rank `src`'s input buffer: every block it sends, in layout order.
pub fn fill_input(input: &mut [u8], traffic: &TrafficMatrix, layout: &Layout, src: usize) {
    for dst in 0..traffic.ranks() {
        let off = layout.send_offset(src, dst) as usize;
        let len = traffic.get(src, dst) as usize;
        fill_block(&mut input[off..off + len], src, dst);
    }
}

/// A run of wrong bytes in one rank's output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadRange {
    /// The receiving rank.
    pub rank: usize,
    /// Output offsets `start..end` (end exclusive) are wrong.
    pub start: u64,
    pub end: u64,
    /// They belong to the block from rank `src`, at its input offsets from `src_start`.
    pub src: usize,
    pub src_start: u64,
}

impl fmt::Display for BadRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "output of rank {} bytes {}..{} are wrong: they should hold input bytes {}..{} of rank {}",
            self.rank,
            self.start,
            self.end,
            self.src_start,
            self.src_start + (self.end - self.start),
            self.src
        )
    }
}

/// The result of checking every output byte.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Verdict {
    pub first_bad: Option<BadRange>,
    pub bad_bytes: u64,
}

impl Verdict {
    /// Folds another rank's verdict in (ranks checked in increasing order).
    pub fn merge(&mut self, other: Verdict) {
        if self.first_bad.is_none() {
            self.first_bad = other.first_bad;
        }
        self.bad_bytes += other.bad_bytes;
    }
}

/// Checks block (src, dst) held in `got`; returns the first wrong range
/// (offsets relative to the block) and the number of wrong bytes. A range
/// ends at a wrong byte followed by at least eight right ones, so that a
/// byte of misplaced data that happens to equal the expected one does not
/// split it.
fn check_block(got: &[u8], src: usize, dst: usize) -> (Option<(u64, u64)>, u64) {
    const GAP: u64 = 8;
    let key = block_key(src, dst);
    let mut first: Option<(u64, u64)> = None;
    let mut bad = 0u64;
    // The first wrong range while it is still open: (start, last wrong byte).
    let mut open: Option<(u64, u64)> = None;
    for (w, chunk) in got.chunks(8).enumerate() {
        let want = word(key, w as u64);
        let want = &want[..chunk.len()];
        if chunk == want && open.is_none() {
            continue;
        }
        for (i, (&g, &e)) in chunk.iter().zip(want).enumerate() {
            let k = (w * 8 + i) as u64;
            if g != e {
                bad += 1;
                if first.is_none() {
                    let start = open.map_or(k, |o| o.0);
                    open = Some((start, k));
                }
            } else if let Some((start, last)) = open {
                if k - last > GAP {
                    first = Some((start, last + 1));
                    open = None;
                }
            }
        }
    }
    if let Some((start, last)) = open {
        first = Some((start, last + 1));
    }
    (first, bad)
}

/// Checks rank `dst`'s whole output buffer against the all-to-all(v) layout.
pub fn check_output(
    output: &[u8],
    traffic: &TrafficMatrix,
    layout: &Layout,
    dst: usize,
) -> Verdict {
    let mut v = Verdict::default();
    for src in 0..traffic.ranks() {
        let off = layout.recv_offset(src, dst);
        let len = traffic.get(src, dst);
        let block = &output[off as usize..(off + len) as usize];
        let (first, bad) = check_block(block, src, dst);
        v.bad_bytes += bad;
        if let (None, Some((a, b))) = (&v.first_bad, first) {
            v.first_bad = Some(BadRange {
                rank: dst,
                start: off + a,
                end: off + b,
                src,
                src_start: layout.send_offset(src, dst) + a,
            });
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_then_check_is_clean_and_corruption_is_located() {
        let m = TrafficMatrix::from_rows(vec![vec![3, 20], vec![17, 0]]);
        let layout = Layout::new(&m);
        // Deliver by hand: output of rank 1 = block (0,1) then block (1,1) (empty).
        let mut input0 = vec![0u8; layout.input_size(0) as usize];
        fill_input(&mut input0, &m, &layout, 0);
        let mut out1 = input0[3..23].to_vec();
        assert_eq!(check_output(&out1, &m, &layout, 1), Verdict::default());
        out1[9] ^= 1;
        out1[10] ^= 0xff;
        let v = check_output(&out1, &m, &layout, 1);
        assert_eq!(v.bad_bytes, 2);
        let b = v.first_bad.unwrap();
        assert_eq!(
            (b.rank, b.start, b.end, b.src, b.src_start),
            (1, 9, 11, 0, 12)
        );
        assert_eq!(
            b.to_string(),
            "output of rank 1 bytes 9..11 are wrong: they should hold input bytes 12..14 of rank 0"
        );
    }

    #[test]
    fn blocks_differ_from_each_other_and_from_shifts() {
        let mut a = vec![0u8; 64];
        let mut b = vec![0u8; 64];
        fill_block(&mut a, 0, 1);
        fill_block(&mut b, 1, 0);
        assert_ne!(a, b);
        assert_ne!(a[1..], a[..63]);
        assert_eq!(byte(0, 1, 13), a[13]);
    }
}
