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

/// Division by one divisor, rounded up, for many dividends: a widening
/// multiply by `floor((2^64 - 1) / d)` and one correction in place of a
/// hardware division (tens of cycles each, once per node pair in the
/// chunked rotation's build).
#[derive(Clone, Copy, Debug)]
pub(crate) struct CeilDiv {
    d: u64,
    m: u64,
}

impl CeilDiv {
    /// Dividing by `d` (at least 1).
    pub(crate) fn new(d: u64) -> Self {
        let d = d.max(1);
        Self { d, m: u64::MAX / d }
    }

    /// `x.div_ceil(d)`. The estimate `q = x m / 2^64` is `x / d` rounded
    /// down or one less (`m > 2^64 / d - 1`, so `x m / 2^64 > x / d - 1`),
    /// so the remainder `x - q d` is below `2d` and one step fixes it.
    #[inline]
    pub(crate) fn ceil(self, x: u64) -> u64 {
        let q = ((u128::from(x) * u128::from(self.m)) >> 64) as u64;
        let r = x - q * self.d;
        let over = u64::from(r >= self.d);
        let (q, r) = (q + over, r - over * self.d);
        q + u64::from(r != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The multiply-and-correct division is `div_ceil` for every
        /// dividend and divisor, the extremes included.
        #[test]
        fn ceil_div_is_div_ceil(x in any::<u64>(), d in 1u64.., small in 1u64..70) {
            for (x, d) in [(x, d), (x, small), (u64::MAX, d), (0, d), (x, 1), (x, u64::MAX)] {
                prop_assert_eq!(CeilDiv::new(d).ceil(x), x.div_ceil(d), "{} / {}", x, d);
            }
        }
    }

    #[test]
    fn ceil_div_at_the_edges_of_a_multiple() {
        for d in [1u64, 2, 3, 7, 64, 1 << 20, (1 << 33) + 1, u64::MAX / 3] {
            let div = CeilDiv::new(d);
            for k in [0u64, 1, 2, 1000] {
                let Some(x) = d.checked_mul(k) else { continue };
                assert_eq!(div.ceil(x), k);
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
