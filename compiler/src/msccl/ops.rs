//! The lowering's operations: what `lower.rs` makes from a plan's
//! transfers and what the passes after it (`gather`, `handoff`) rewrite,
//! before threadblocks and steps are built. Its own module so that those
//! passes depend on it and not on the lowering.

use super::BufRef;

/// One MSCCL operation: `cnt` chunks from one buffer place to another.
#[derive(Clone, Debug)]
pub(super) struct ChunkOp {
    pub(super) src: u32,
    pub(super) src_buf: BufRef,
    pub(super) src_off: u32,
    pub(super) dst: u32,
    pub(super) dst_buf: BufRef,
    pub(super) dst_off: u32,
    pub(super) cnt: u32,
    pub(super) deps: Vec<u32>,
    /// Operations only the receiving side waits for (a pacing head, see
    /// `lower::cut_for_pacing`); the sending side does not.
    pub(super) recv_deps: Vec<u32>,
    /// The plan transfer this operation comes from.
    pub(super) from: u32,
}

impl ChunkOp {
    /// The same operation waiting for nothing: its fields but the deps,
    /// without copying those (the passes that rewrite operations give each
    /// new one its own deps; a `clone` copied two lists only to drop them).
    pub(super) fn without_deps(&self) -> Self {
        ChunkOp {
            src: self.src,
            src_buf: self.src_buf,
            src_off: self.src_off,
            dst: self.dst,
            dst_buf: self.dst_buf,
            dst_off: self.dst_off,
            cnt: self.cnt,
            deps: Vec::new(),
            recv_deps: Vec::new(),
            from: self.from,
        }
    }
}

/// Test operations: `cnt` chunks from `src`'s input at `src_off` into
/// `dst`'s scratch at `dst_off`, for plan transfer `from`, waiting for
/// nothing until told.
#[cfg(test)]
impl ChunkOp {
    pub(super) fn test(
        src: u32,
        src_off: u32,
        dst: u32,
        dst_off: u32,
        cnt: u32,
        from: u32,
    ) -> Self {
        ChunkOp {
            src,
            src_buf: BufRef::Input,
            src_off,
            dst,
            dst_buf: BufRef::Scratch,
            dst_off,
            cnt,
            deps: Vec::new(),
            recv_deps: Vec::new(),
            from,
        }
    }

    /// The same operation reading `buf` instead of the input.
    pub(super) fn reading(mut self, buf: BufRef) -> Self {
        self.src_buf = buf;
        self
    }

    /// The same operation waiting for `deps` (both sides) and `recv_deps`
    /// (the receiving side only).
    pub(super) fn after(mut self, deps: Vec<u32>, recv_deps: Vec<u32>) -> Self {
        self.deps = deps;
        self.recv_deps = recv_deps;
        self
    }
}

/// What part of a cut operation a new operation is (`lower::cut_for_pacing`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Part {
    /// Not cut.
    Whole,
    /// A one-chunk step of a transfer's head.
    Head,
    /// What is left between head and tail.
    Body,
    /// A one-chunk step of a transfer's tail.
    Tail,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_deps_keeps_every_field_but_the_deps() {
        let mut o = ChunkOp::test(3, 7, 5, 11, 4, 9)
            .reading(BufRef::Output)
            .after(vec![1, 2], vec![3]);
        o.dst_buf = BufRef::Output;
        let w = o.without_deps();
        assert!(w.deps.is_empty() && w.recv_deps.is_empty());
        let mut c = o.clone();
        c.deps.clear();
        c.recv_deps.clear();
        assert_eq!(format!("{w:?}"), format!("{c:?}"));
    }
}
