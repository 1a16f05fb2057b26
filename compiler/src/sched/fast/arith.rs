//! Integer arithmetic that the planner's pieces share, kept in a leaf so
//! that the modules below the emitter need not import `fast` itself.

/// `x * y / d`, rounded down, without overflow (in u64 when the product fits).
#[inline]
pub(crate) fn mul_div(x: u64, y: u64, d: u64) -> u64 {
    match x.checked_mul(y) {
        Some(p) => p / d,
        None => (x as u128 * y as u128 / d as u128) as u64,
    }
}

/// Division by one divisor for many dividends: a widening multiply by
/// `floor((2^64 - 1) / d)` and one correction in place of a hardware
/// division (tens of cycles each: once per node pair in the chunked
/// rotation's build, twice per lane of each of a rank's node's stage pairs
/// in the emitter).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Divisor {
    d: u64,
    m: u64,
}

impl Divisor {
    /// Dividing by `d` (at least 1).
    pub(crate) fn new(d: u64) -> Self {
        let d = d.max(1);
        Self { d, m: u64::MAX / d }
    }

    /// `x / d`, rounded down. The estimate `q = x m / 2^64` is `x / d`
    /// rounded down or one less (`m > 2^64 / d - 1`, so `x m / 2^64 > x /
    /// d - 1`), so the remainder `x - q d` is below `2d` and one step
    /// fixes it.
    #[inline]
    pub(crate) fn floor(self, x: u64) -> u64 {
        let q = ((u128::from(x) * u128::from(self.m)) >> 64) as u64;
        q + u64::from(x - q * self.d >= self.d)
    }

    /// `x.div_ceil(d)`.
    #[inline]
    pub(crate) fn ceil(self, x: u64) -> u64 {
        let q = self.floor(x);
        q + u64::from(x != q * self.d)
    }

    /// `x * y / d`, rounded down, as [`mul_div`] computes it.
    #[inline]
    pub(crate) fn mul_div(self, x: u64, y: u64) -> u64 {
        match x.checked_mul(y) {
            Some(p) => self.floor(p),
            None => (x as u128 * y as u128 / self.d as u128) as u64,
        }
    }

    /// A pair of `x` bytes cut into pieces of at most `d`: how many
    /// (`x.div_ceil(d)`) and the bytes of its first, partial piece (the
    /// rest are whole: `d` where `d` divides `x`; 0 where `x` is).
    /// From `q = (x - 1) / d`: `q + 1` pieces, the first `x - q d`.
    #[inline]
    pub(crate) fn pieces(self, x: u64) -> (u64, u64) {
        if x == 0 {
            return (0, 0);
        }
        let q = self.floor(x - 1);
        (q + 1, x - q * self.d)
    }
}

impl Default for Divisor {
    /// Dividing by 1.
    fn default() -> Self {
        Self::new(1)
    }
}

/// The largest line sum of the `n x n` matrix `t`, its diagonal left out:
/// what a node sends or receives at most (the decomposition's `M`, the
/// exchange's NIC cut in bytes).
pub(crate) fn max_line(n: usize, t: &[u64]) -> u64 {
    max_line_with_rows(n, t, |_, _| {})
}

/// [`max_line`], handing each row (`a`, its entries) to `row` as it is
/// read: what else the caller needs of every entry is read in the same
/// pass over the matrix (the chunked rotation's largest pairs).
#[inline]
pub(crate) fn max_line_with_rows(n: usize, t: &[u64], mut row: impl FnMut(usize, &[u64])) -> u64 {
    // Whole rows and columns, then the diagonal taken off: no test per
    // entry, so the sums vectorize (wrapping: the diagonal may push a sum
    // past `u64::MAX` on the way, what is left fits).
    if n == 0 {
        return 0;
    }
    let mut col = vec![0u64; n];
    let mut m = 0;
    for (a, r) in t[..n * n].chunks_exact(n).enumerate() {
        let mut sent = 0u64;
        for (c, &x) in col.iter_mut().zip(r) {
            *c = c.wrapping_add(x);
            sent = sent.wrapping_add(x);
        }
        m = m.max(sent.wrapping_sub(r[a]));
        col[a] = col[a].wrapping_sub(r[a]);
        row(a, r);
    }
    col.into_iter().fold(m, u64::max)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The multiply-and-correct division is `div_ceil` for every
        /// dividend and divisor, the extremes included.
        #[test]
        fn divisor_divides_as_division_does(x in any::<u64>(), d in 1u64.., small in 1u64..70) {
            for (x, d) in [(x, d), (x, small), (u64::MAX, d), (0, d), (x, 1), (x, u64::MAX)] {
                let div = Divisor::new(d);
                prop_assert_eq!(div.floor(x), x / d, "{} / {}", x, d);
                prop_assert_eq!(div.ceil(x), x.div_ceil(d), "{} / {}", x, d);
                prop_assert_eq!(div.mul_div(x, small), mul_div(x, small, d));
                prop_assert_eq!(div.mul_div(x, x), mul_div(x, x, d));
                // The first piece: what the whole ones after it leave.
                let (p, first) = div.pieces(x);
                prop_assert_eq!(p, x.div_ceil(d));
                let rest = u128::from(p.saturating_sub(1)) * u128::from(d);
                prop_assert_eq!(u128::from(first), u128::from(x) - rest, "{} / {}", x, d);
                prop_assert!(first <= d && (first > 0) == (x > 0));
            }
        }
    }

    /// The largest line sum as first written: a test per entry.
    fn by_entries(n: usize, t: &[u64]) -> u64 {
        (0..n)
            .flat_map(|a| {
                let row = (0..n)
                    .filter(|&b| b != a)
                    .map(|b| t[a * n + b])
                    .sum::<u64>();
                let col = (0..n)
                    .filter(|&b| b != a)
                    .map(|b| t[b * n + a])
                    .sum::<u64>();
                [row, col]
            })
            .max()
            .unwrap_or(0)
    }

    proptest! {
        /// Whole lines less the diagonal are the lines without it, also
        /// where the diagonal pushes a sum past `u64::MAX` on the way; each
        /// row is handed over once, in order.
        #[test]
        fn max_line_leaves_the_diagonal_out(
            n in 0usize..9,
            entries in prop::collection::vec(0u64..1 << 40, 81),
            huge in any::<bool>(),
        ) {
            let mut t = entries[..n * n].to_vec();
            if huge {
                for a in 0..n {
                    t[a * n + a] = u64::MAX - a as u64;
                }
            }
            prop_assert_eq!(max_line(n, &t), by_entries(n, &t));
            let mut rows = Vec::new();
            let line = max_line_with_rows(n, &t, |a, row| rows.push((a, row.to_vec())));
            prop_assert_eq!(line, by_entries(n, &t));
            let want: Vec<_> = (0..n).map(|a| (a, t[a * n..(a + 1) * n].to_vec())).collect();
            prop_assert_eq!(rows, want);
        }
    }

    #[test]
    fn divisor_at_the_edges_of_a_multiple() {
        for d in [1u64, 2, 3, 7, 64, 1 << 20, (1 << 33) + 1, u64::MAX / 3] {
            let div = Divisor::new(d);
            for k in [0u64, 1, 2, 1000] {
                let Some(x) = d.checked_mul(k) else { continue };
                assert_eq!((div.floor(x), div.ceil(x)), (k, k));
                if x > 0 {
                    assert_eq!(div.floor(x - 1), k - 1);
                }
                if let Some(y) = x.checked_add(1) {
                    assert_eq!(div.ceil(y), k + 1);
                }
                if x > 0 {
                    assert_eq!(div.ceil(x - 1), x.saturating_sub(1).div_ceil(d));
                }
            }
        }
    }
}
