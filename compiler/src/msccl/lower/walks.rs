//! Dependency walks: the packed operation graph ([`OpGraph`]) and the
//! memoised walks ([`Walks`]) to the ancestors of an operation on a gpu.

use std::collections::HashMap;

use crate::msccl::ops::ChunkOp;

/// Memoised walks per operation of the plan (see `build_tbs`).
pub(super) const WALKS_PER_OP: usize = 32;

/// A cheap hash for the walk memo's `(operation, gpu)` keys (a splitmix64
/// finish): the standard SipHash took a fifth of a large lowering.
#[derive(Default, Clone, Copy)]
pub(super) struct FastHasher(u64);

impl std::hash::Hasher for FastHasher {
    fn finish(&self) -> u64 {
        // A multiply only moves low bits up; the table indexes by low bits.
        let z = (self.0 ^ (self.0 >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z ^ (z >> 31)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(5) ^ x).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
    // Integers a word each (the default goes byte by byte).
    fn write_u8(&mut self, x: u8) {
        self.write_u64(u64::from(x));
    }
    fn write_u32(&mut self, x: u32) {
        self.write_u64(u64::from(x));
    }
    fn write_usize(&mut self, x: usize) {
        self.write_u64(x as u64);
    }
}

pub(super) type FastHash = std::hash::BuildHasherDefault<FastHasher>;

/// A map with [`FastHasher`]'s hash, for the lowering's maps of small
/// integer keys that are only looked up (never iterated in an order that
/// matters): SipHash was 6% of 64 x 8 `fast` MoE's compile.
pub(super) type FastMap<K, V> = HashMap<K, V, FastHash>;

/// Memoised [`ancestors_on`] walks: per `(operation, gpu)` key, its sorted
/// list. A large lowering holds millions of them (16 x 8 `fast`: 2.6
/// million, the walks a fifth of the compile, bound by the table's cache
/// misses), most empty: those are one bit of a per-gpu set over the
/// operations, the others a range of one shared array (a `Vec` each cost
/// an allocation and a bucket twice the size).
pub(super) struct Walks {
    /// Key -> (start in `lists`, length), lists not empty.
    index: HashMap<u64, (u32, u32), FastHash>,
    lists: Vec<u32>,
    /// Per gpu, a bit per operation: its walk is held and empty.
    empty: Vec<Vec<u64>>,
    /// Empty walks held.
    empties: usize,
    /// Operations of the plan.
    nops: usize,
}

impl Walks {
    pub(super) fn new(nops: usize) -> Self {
        Walks {
            index: HashMap::default(),
            lists: Vec::new(),
            empty: Vec::new(),
            empties: 0,
            nops,
        }
    }

    /// Walks held.
    pub(super) fn len(&self) -> usize {
        self.index.len() + self.empties
    }

    fn is_empty_walk(&self, x: u32, g: u32) -> bool {
        self.empty
            .get(g as usize)
            .and_then(|b| b.get(x as usize / 64))
            .is_some_and(|w| w >> (x % 64) & 1 == 1)
    }

    fn hold_empty(&mut self, x: u32, g: u32) {
        let g = g as usize;
        if self.empty.len() <= g {
            self.empty.resize_with(g + 1, Vec::new);
        }
        let b = &mut self.empty[g];
        if b.is_empty() {
            *b = vec![0; self.nops.div_ceil(64)];
        }
        b[x as usize / 64] |= 1 << (x % 64);
        self.empties += 1;
    }
}

/// What the dependency walks read of the operations, packed: per
/// operation its gpus and its deps' range in one array (16 bytes an
/// operation, where a `ChunkOp` is about 90 and its deps a separate
/// allocation), so a walk through scattered operations misses the cache
/// less. The same walks, in the same order.
pub(super) struct OpGraph {
    /// (src, dst, first dep, end of deps) per operation.
    node: Vec<[u32; 4]>,
    deps: Vec<u32>,
}

impl OpGraph {
    pub(super) fn new(ops: &[ChunkOp]) -> Self {
        let mut deps = Vec::with_capacity(ops.iter().map(|o| o.deps.len()).sum());
        let node = ops
            .iter()
            .map(|o| {
                let a = deps.len() as u32;
                deps.extend_from_slice(&o.deps);
                [o.src, o.dst, a, deps.len() as u32]
            })
            .collect();
        OpGraph { node, deps }
    }
}

/// The operations on gpu `g` among `x` and its ancestors, stopping at the
/// first that touches `g` on every path (its own waits cover the rest).
/// Once `memo` holds `cap` walks, new ones are not started. Appends to
/// `out` (which the nested walks share: each sorts its own tail).
pub(super) fn ancestors_on(
    ops: &OpGraph,
    x: u32,
    g: u32,
    memo: &mut Walks,
    cap: usize,
    out: &mut Vec<u32>,
) {
    let [src, dst, a, b] = ops.node[x as usize];
    if src == g || dst == g {
        out.push(x);
        return;
    }
    if memo.is_empty_walk(x, g) {
        return;
    }
    let key = u64::from(x) << 32 | u64::from(g);
    if let Some(&(at, len)) = memo.index.get(&key) {
        let at = at as usize;
        out.extend_from_slice(&memo.lists[at..at + len as usize]);
        return;
    }
    if memo.len() >= cap {
        return;
    }
    let start = out.len();
    for i in a..b {
        ancestors_on(ops, ops.deps[i as usize], g, memo, cap, out);
    }
    let v = &mut out[start..];
    v.sort_unstable();
    // Dedup the tail in place.
    let mut w = 0;
    for r in 0..v.len() {
        if w == 0 || v[r] != v[w - 1] {
            v[w] = v[r];
            w += 1;
        }
    }
    out.truncate(start + w);
    let v = &out[start..];
    if v.is_empty() {
        memo.hold_empty(x, g);
        return;
    }
    // Offsets past `u32` (16 GiB of lists) are not memoised: the walk is
    // then repeated, with the same result.
    if u32::try_from(memo.lists.len() + v.len()).is_ok() {
        let (at, len) = (memo.lists.len() as u32, v.len() as u32);
        memo.lists.extend_from_slice(v);
        memo.index.insert(key, (at, len));
    }
}
