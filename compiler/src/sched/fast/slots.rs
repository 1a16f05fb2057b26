//! Slots: the one or two sends (or the range of a direct slice's sends)
//! that one link of a GPU's send or receive chain holds, and the
//! dependency lists built from them.

use crate::plan::Deps;

/// No transfer (an empty second op of a slot, or nothing recorded yet).
pub(super) const NONE: u32 = u32::MAX;

/// Marks `ops[1]` of a slot as the last of the range `ops[0]..=ops[1]` (the
/// per-block sends of a direct slice) rather than a second op.
pub(super) const RANGE: u32 = 1 << 31;

/// The dependencies of a balanced lane's send (its two chains: at most two
/// slots of at most two sends) or of a move (one slot and the last move),
/// deduplicated, in a fixed array.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct FewIds {
    ids: [u32; 4],
    len: usize,
}

impl FewIds {
    /// Adds `op` unless it is [`NONE`] or there already.
    #[inline]
    #[allow(clippy::manual_contains)]
    pub(super) fn add(&mut self, op: u32) {
        if op != NONE && !self.ids[..self.len].iter().any(|&x| x == op) {
            self.ids[self.len] = op;
            self.len += 1;
        }
    }

    /// Adds the sends of a slot of one or two sends (not a range).
    #[inline]
    pub(super) fn add_ops(&mut self, ops: [u32; 2]) {
        debug_assert!(ops[1] == NONE || ops[1] & RANGE == 0, "a range slot");
        self.add(ops[0]);
        self.add(ops[1]);
    }

    pub(super) fn deps(&self) -> Deps {
        Deps::from_buf_and_len(self.ids, self.len)
    }
}

/// Adds the transfers of a slot to `ids`, skipping those already there.
#[inline]
pub(super) fn add_ops(ids: &mut Vec<u32>, ops: [u32; 2]) {
    if ops[1] != NONE && ops[1] & RANGE != 0 {
        for op in ops[0]..=ops[1] & !RANGE {
            add_op(ids, op);
        }
        return;
    }
    add_op(ids, ops[0]);
    add_op(ids, ops[1]);
}

/// Adds `op` unless it is [`NONE`] or there already. The lists are short:
/// a plain scan beats `contains`, which is built for long slices.
#[inline]
#[allow(clippy::manual_contains)]
pub(super) fn add_op(ids: &mut Vec<u32>, op: u32) {
    if op != NONE && !ids.iter().any(|&x| x == op) {
        ids.push(op);
    }
}

/// A transfer's dependency list from collected ids; inline (no allocation)
/// up to four.
#[inline]
pub(super) fn deps_of(ids: &[u32]) -> Deps {
    match *ids {
        [] => Deps::new(),
        [x] => Deps::from_buf_and_len([x, 0, 0, 0], 1),
        [x, y] => Deps::from_buf_and_len([x, y, 0, 0], 2),
        [x, y, z] => Deps::from_buf_and_len([x, y, z, 0], 3),
        [x, y, z, w] => Deps::from_buf_and_len([x, y, z, w], 4),
        _ => Deps::from_slice(ids),
    }
}
