//! Relief of hot links on a mesh intra-node fabric (MI300X xGMI: one
//! point-to-point link per GPU pair).
//!
//! On a switch, a GPU's NVLink traffic shares one port and only its total
//! matters; on a mesh, every byte from GPU `x` to GPU `y` crosses the one link
//! `x → y`. With intra-node skew, the link from the hottest sender to the
//! hottest receiver carries the biggest intra-node block, the balancing moves
//! out of the hot sender and the forwards into the hot receiver at once (4x8
//! intra-skew: 43.5 MB against 17 MB on the next link), and that link, not
//! the NICs, sets the completion time. The relief pass reroutes part of the
//! transfers on the busiest links through a third GPU's scratch
//! (`x → z → y`). Only transfers nothing waits for can move this way (intra-
//! node blocks and forwards into the outputs): a relayed move would delay the
//! send behind it. Intra-node blocks go first (they have the whole exchange
//! to arrive), then forwards in plan order (the earliest are the furthest
//! from the end of the exchange).
//!
//! Water-filling, per node: take the most loaded link `x → y`; each relay `z`
//! has a level `m_z = max(L(x,z), L(z,y))` (its busier link); fill the relays
//! to the level `w` that solves `Σ_z max(0, w − m_z) = L(x,y) − w`, which
//! leaves `x → y` level with them, moving at most what its candidates hold.
//! Repeat on the next busiest link; stop when it has nothing to move, or a
//! step would move less than [`MIN_RELAY_BYTES`] or [`MIN_GAIN`] of its load.

use super::arith::mul_div;
use crate::plan::{Buffer, Deps, Path, Plan, Transfer};

/// No relay moves fewer bytes (each costs two transfers and a latency).
const MIN_RELAY_BYTES: u64 = 64 << 10;
/// A step must lower the busiest link by at least this fraction of its load.
const MIN_GAIN: f64 = 0.01;

/// Reusable buffers of the relief pass.
#[derive(Clone, Debug, Default)]
pub(crate) struct MeshRelief {
    /// Bytes per directed link, `(node * g + x) * g + y`.
    load: Vec<u64>,
    /// Bytes on each link that may be relayed.
    room: Vec<u64>,
    /// Transfers something depends on (they stay where they are).
    waited: Vec<bool>,
    /// Relayable transfers: (link, preference, index), sorted.
    cands: Vec<(u32, u8, u32)>,
    /// Relays chosen: (link, relay GPU, bytes).
    relays: Vec<(u32, u32, u64)>,
    /// Candidate relays of one link: (level, GPU).
    levels: Vec<(u64, usize)>,
}

impl MeshRelief {
    /// Reroutes part of the traffic on each node's busiest NVLink links
    /// through relays, in pieces of at most `chunk` bytes (and about
    /// [`MIN_RELAY_BYTES`] at least). `g` is the GPUs per node. `early[x *
    /// g + z % g]` is the last balancing move over link `x → z` that starts
    /// at once (`u32::MAX`: none; an empty slice: no moves): a relay's first
    /// hop over that link waits for it, as the planner's intra-node blocks
    /// wait for theirs.
    pub fn relieve(&mut self, plan: &mut Plan, g: usize, chunk: u64, early: &[u32]) {
        if g < 3 {
            return;
        }
        let nodes = plan.ranks as usize / g;
        let link = |t: &Transfer| {
            let n = t.src as usize / g;
            ((n * g + t.src as usize % g) * g + t.dst as usize % g) as u32
        };
        let on_node_link =
            |t: &Transfer| t.path == Path::Nvlink && t.src as usize / g == t.dst as usize / g;
        self.waited.clear();
        self.waited.resize(plan.transfers.len(), false);
        for t in &plan.transfers {
            for &d in &t.deps {
                self.waited[d as usize] = true;
            }
        }
        self.load.clear();
        self.load.resize(nodes * g * g, 0);
        self.room.clear();
        self.room.resize(nodes * g * g, 0);
        self.cands.clear();
        for (i, t) in plan.transfers.iter().enumerate() {
            if !on_node_link(t) {
                continue;
            }
            let k = link(t);
            self.load[k as usize] += t.bytes;
            if t.dst_buf == Buffer::Output && !self.waited[i] {
                self.room[k as usize] += t.bytes;
                let preference = u8::from(t.src_buf != Buffer::Input);
                self.cands.push((k, preference, i as u32));
            }
        }
        // The direct link keeps some bytes (no link is emptied for nothing).
        for r in &mut self.room {
            *r = r.saturating_sub(MIN_RELAY_BYTES);
        }
        self.relays.clear();
        for n in 0..nodes {
            self.level_node(n, g);
        }
        if !self.relays.is_empty() {
            self.cands.sort_unstable();
            self.apply(plan, g, chunk, early);
        }
    }

    /// Chooses the relays of node `n`.
    fn level_node(&mut self, n: usize, g: usize) {
        let base = n * g * g;
        for _ in 0..g * g {
            let (mut hot, mut hot_load) = (usize::MAX, 0u64);
            for k in 0..g * g {
                if self.load[base + k] > hot_load {
                    (hot, hot_load) = (k, self.load[base + k]);
                }
            }
            if hot == usize::MAX {
                return;
            }
            let (x, y) = (hot / g, hot % g);
            let room = self.room[base + hot];
            // Each relay's level: its busier link.
            self.levels.clear();
            self.levels
                .extend((0..g).filter(|&z| z != x && z != y).map(|z| {
                    (
                        self.load[base + x * g + z].max(self.load[base + z * g + y]),
                        z,
                    )
                }));
            self.levels.sort_unstable();
            // Water level `w` with `Σ_z max(0, w − m_z) = L − w`.
            let (mut w, mut sum) = (hot_load as f64, 0.0);
            for (k, &(m, _)) in self.levels.iter().enumerate() {
                if m as f64 >= w {
                    break;
                }
                sum += m as f64;
                w = (hot_load as f64 + sum) / (k + 2) as f64;
            }
            let mut total = hot_load as f64 - w;
            if total > room as f64 {
                // Only `room` bytes can move: the level `v` with
                // `Σ_z max(0, v − m_z) = room`.
                let (mut v, mut sum) = (0.0, 0.0);
                for (k, &(m, _)) in self.levels.iter().enumerate() {
                    sum += m as f64;
                    v = (room as f64 + sum) / (k + 1) as f64;
                    if self
                        .levels
                        .get(k + 1)
                        .is_none_or(|&(next, _)| v <= next as f64)
                    {
                        break;
                    }
                }
                w = v;
                total = room as f64;
            }
            if total < MIN_RELAY_BYTES as f64 || total < MIN_GAIN * hot_load as f64 {
                return;
            }
            let mut any = false;
            for k in 0..self.levels.len() {
                let (m, z) = self.levels[k];
                let delta = ((w - m as f64).max(0.0) as u64).min(self.room[base + hot]);
                if delta < MIN_RELAY_BYTES {
                    continue;
                }
                any = true;
                let key = (base + hot) as u32;
                match self
                    .relays
                    .iter_mut()
                    .find(|r| r.0 == key && r.1 == z as u32)
                {
                    Some(r) => r.2 += delta,
                    None => self.relays.push((key, z as u32, delta)),
                }
                self.room[base + hot] -= delta;
                self.load[base + hot] -= delta;
                self.load[base + x * g + z] += delta;
                self.load[base + z * g + y] += delta;
            }
            if !any {
                return;
            }
        }
    }

    /// Moves each relay's bytes off its link, taking the link's candidates
    /// in preference order: a candidate's tail goes `x → z` (into `z`'s
    /// scratch, after what it already holds) then `z → y` (where the
    /// candidate wrote); a candidate taken whole becomes the first hop.
    fn apply(&mut self, plan: &mut Plan, g: usize, chunk: u64, early: &[u32]) {
        plan.scratch.resize(plan.ranks as usize, 0);
        self.relays.sort_unstable();
        let mut c = 0;
        for r in 0..self.relays.len() {
            let (key, z_local, mut left) = self.relays[r];
            while left > 0 {
                // Skip candidates of earlier links and exhausted ones.
                while c < self.cands.len()
                    && (self.cands[c].0 < key
                        || plan.transfers[self.cands[c].2 as usize].bytes == 0)
                {
                    c += 1;
                }
                let Some(&(k, _, i)) = self.cands.get(c) else {
                    break;
                };
                if k != key {
                    break;
                }
                let i = i as usize;
                let t = plan.transfers[i].clone();
                let z = t.src as usize / g * g + z_local as usize;
                let part = left.min(t.bytes);
                let keep = t.bytes - part;
                let at = plan.scratch[z];
                plan.scratch[z] += part;
                // The relayed bytes go in pieces of at most `chunk`, each
                // first hop after the previous one, so that each second hop
                // runs under the next first hop: store and forward of the
                // whole part would add its full transfer time again (2x8
                // intra-skew: a 5.4 MB block relayed whole ended 66 us after
                // the last inter-node byte).
                let pieces = part.div_ceil(chunk.max(MIN_RELAY_BYTES)).max(1);
                let mut prev = None;
                for p in 0..pieces {
                    let (lo, hi) = (mul_div(part, p, pieces), mul_div(part, p + 1, pieces));
                    let mut deps = t.deps.clone();
                    deps.extend(prev);
                    // The first hop waits for the early balancing moves on
                    // its link, as intra-node blocks do.
                    if let Some(&mv) = early.get(t.src as usize * g + z_local as usize) {
                        if mv != u32::MAX && !deps.as_slice().contains(&mv) {
                            deps.push(mv);
                        }
                    }
                    let hop = Transfer {
                        dst: z as u32,
                        dst_buf: Buffer::Scratch,
                        dst_off: at + lo,
                        src_off: t.src_off + keep + lo,
                        bytes: hi - lo,
                        deps,
                        ..t.clone()
                    };
                    let first = if p == 0 && keep == 0 {
                        plan.transfers[i] = hop;
                        // Taken whole: mark it used up for the cursor.
                        c += 1;
                        i as u32
                    } else {
                        plan.push(hop)
                    };
                    prev = Some(first);
                    let mut deps = Deps::new();
                    deps.push(first);
                    plan.push(Transfer {
                        src: z as u32,
                        src_buf: Buffer::Scratch,
                        src_off: at + lo,
                        dst_off: t.dst_off + keep + lo,
                        bytes: hi - lo,
                        deps,
                        ..t.clone()
                    });
                }
                if keep > 0 {
                    plan.transfers[i].bytes = keep;
                }
                left -= part;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sched::direct;
    use crate::topology::Topology;
    use crate::traffic::TrafficMatrix;
    use crate::verify::verify_on;

    fn link_loads(plan: &Plan, g: usize) -> Vec<u64> {
        let mut load = vec![0u64; g * g];
        for t in &plan.transfers {
            if t.path == Path::Nvlink {
                load[(t.src as usize % g) * g + t.dst as usize % g] += t.bytes;
            }
        }
        load
    }

    #[test]
    fn hot_block_is_spread_over_relays_and_still_delivered() {
        // One MI300X-like node of 4 GPUs: GPU 0 sends 8 MB to GPU 1, every
        // other pair 64 KB.
        let t = Topology::preset("mi300x", 1, Some(4)).unwrap();
        let mut m = TrafficMatrix::zeros(4);
        for s in 0..4 {
            for d in (0..4).filter(|&d| d != s) {
                m.set(s, d, 64 << 10);
            }
        }
        m.set(0, 1, 8 << 20);
        let mut plan = direct(&t, &m);
        let before = link_loads(&plan, 4);
        MeshRelief::default().relieve(&mut plan, 4, u64::MAX, &[]);
        verify_on(&plan, &m, &t).unwrap();
        let after = link_loads(&plan, 4);
        // The hot link levels with the relays' links: 8 MB over three paths.
        assert!(after[1] < before[1] / 2, "{before:?} -> {after:?}");
        let worst = *after.iter().max().unwrap();
        assert!(worst <= (8 << 20) / 3 + (200 << 10), "{after:?}");
        // Both relays (GPUs 2 and 3) carry part of it, through scratch.
        assert!(plan.scratch_bytes(2) > 0 && plan.scratch_bytes(3) > 0);
        assert_eq!(plan.scratch_bytes(0) + plan.scratch_bytes(1), 0);
    }

    #[test]
    fn relays_go_in_pipelined_pieces() {
        use crate::sim::{simulate, Network, SimOptions};
        let t = Topology::preset("mi300x", 1, Some(4)).unwrap();
        let mut m = TrafficMatrix::zeros(4);
        m.set(0, 1, 8 << 20);
        let chunk = 512 << 10;
        let mut whole = direct(&t, &m);
        MeshRelief::default().relieve(&mut whole, 4, u64::MAX, &[]);
        let mut cut = direct(&t, &m);
        MeshRelief::default().relieve(&mut cut, 4, chunk, &[]);
        verify_on(&cut, &m, &t).unwrap();
        // Every relayed piece is at most a chunk; each second hop waits for
        // its own first hop only, and each first hop after the first of a
        // relay for the one before it.
        let mut first_hops = vec![Vec::new(); 4];
        for (i, x) in cut.transfers.iter().enumerate() {
            match (x.src_buf, x.dst_buf) {
                (Buffer::Input, Buffer::Scratch) => {
                    assert!(x.bytes <= chunk, "{x:?}");
                    first_hops[x.dst as usize].push(i as u32);
                }
                (Buffer::Scratch, Buffer::Output) => {
                    assert!(x.bytes <= chunk, "{x:?}");
                    let d = x.deps.as_slice();
                    assert_eq!(d.len(), 1, "{x:?}");
                    let hop = &cut.transfers[d[0] as usize];
                    assert_eq!(
                        (hop.dst, hop.dst_off, hop.bytes),
                        (x.src, x.src_off, x.bytes)
                    );
                }
                _ => {}
            }
        }
        for hops in first_hops.iter().filter(|h| !h.is_empty()) {
            assert!(hops.len() > 2, "{hops:?}");
            for w in hops.windows(2) {
                assert_eq!(cut.transfers[w[1] as usize].deps.as_slice(), [w[0]]);
            }
        }
        // Pipelined, the second hops run under the first: the relayed
        // exchange ends well before store-and-forward of whole parts.
        let time = |p: &Plan| {
            simulate(&t, p, &SimOptions::new(Network::Ideal))
                .unwrap()
                .completion_us
        };
        let (tw, tc) = (time(&whole), time(&cut));
        assert!(tc < 0.8 * tw, "pieces {tc} us, whole {tw} us");
    }

    #[test]
    fn a_level_node_is_left_alone() {
        let t = Topology::preset("mi300x", 1, Some(4)).unwrap();
        let m = TrafficMatrix::uniform(4, 1 << 20);
        let mut plan = direct(&t, &m);
        let n = plan.transfers.len();
        MeshRelief::default().relieve(&mut plan, 4, u64::MAX, &[]);
        assert_eq!(plan.transfers.len(), n);
        assert!(plan.scratch.iter().all(|&s| s == 0));
    }
}
