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
