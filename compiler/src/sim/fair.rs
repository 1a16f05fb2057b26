//! Max-min fair rates by progressive filling (water-filling).
//!
//! Owns the per-recompute work of the simulator: indexing the active flows
//! by link, and raising every flow's rate together until a link (or a flow's
//! own cap) saturates, freezing the flows it carries, and repeating. Buffers
//! are kept between calls: a recompute allocates nothing once warm.
//!
//! Cost per call: O(F·p) to freeze F flows of p links each (walking each
//! flow's links from a per-position copy, not the transfers' scattered
//! paths), O(A·p) to append the A flows that arrived (the whole index is
//! rebuilt only when the caller compacts its list), plus O(L log L) heap
//! work over the L links in use. Link shares only grow as
//! flows freeze (a flow frozen at the smallest share s takes at most s from a
//! link whose share is at least s), so stale heap keys are refreshed lazily
//! when popped instead of on every update.
//!
//! Between events most flows keep their rates: max-min rates on a set of
//! links depend only on the flows connected to it through shared links, so
//! [`Filler::refill`] fills again only the component of the links whose
//! flows changed (at 32 x 8 on DGX-H100, rails and nodes are separate
//! components: about 6% of the moving flows per event for `spray` and
//! `fast`), with the same floating-point operations a whole fill makes.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::topology::LinkId;

/// The links of every transfer, flattened: `links[off[t]..off[t + 1]]`.
#[derive(Clone, Debug, Default)]
pub(crate) struct Paths {
    pub off: Vec<u32>,
    pub links: Vec<LinkId>,
}

impl Paths {
    pub fn of(&self, t: u32) -> &[LinkId] {
        &self.links[self.off[t as usize] as usize..self.off[t as usize + 1] as usize]
    }
}

/// A totally ordered f64 key for the heaps (no NaN ever enters them).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Key(pub f64);

impl Eq for Key {}
impl PartialOrd for Key {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Key {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// Reusable state of the water-filling. Flows are named by their position in
/// the active list passed to [`Filler::index`].
#[derive(Debug, Default)]
pub(crate) struct Filler {
    /// Per link: indexed flows crossing it, by position (removed ones too,
    /// until the next [`Filler::index`] or a refill that walks the link),
    /// and how many are not removed.
    on: Vec<Vec<u32>>,
    alive: Vec<u32>,
    /// Per link: whether it is in `touched` (its `on` may have emptied).
    in_touched: Vec<bool>,
    /// Per link during a fill: capacity not yet given out, flows not yet frozen.
    rem_cap: Vec<f64>,
    unfrozen: Vec<u32>,
    /// Links with at least one indexed flow, in first-seen order.
    touched: Vec<LinkId>,
    /// The indexed flows' links by position, contiguous
    /// (`pos_links[pos_off[pos]..pos_off[pos + 1]]`): the fill walks them
    /// in position order, not the transfers' scattered order.
    pos_off: Vec<u32>,
    pos_links: Vec<LinkId>,
    frozen: Vec<bool>,
    /// Flows not yet frozen during a fill.
    left: usize,
    heap: BinaryHeap<Reverse<(Key, LinkId)>>,
    capped: Vec<(f64, u32)>,
    /// Links whose flows changed (a flow appended or removed) since the
    /// last fill, for [`Filler::refill`]; `all_dirty` after a re-index
    /// (positions renumbered) or a fill of other capacities.
    dirty: Vec<LinkId>,
    all_dirty: bool,
    /// Per link and per position: the stamp of the last refill that put
    /// it in the component it recomputes.
    link_seen: Vec<u32>,
    pos_seen: Vec<u32>,
    seen: u32,
    /// The links and flows of that component.
    comp_links: Vec<LinkId>,
    comp_flows: Vec<u32>,
    /// Whether the last fill was a whole one ([`Filler::refilled`]).
    whole: bool,
}

impl Filler {
    pub fn new(num_links: usize) -> Self {
        Filler {
            on: vec![Vec::new(); num_links],
            alive: vec![0; num_links],
            in_touched: vec![false; num_links],
            rem_cap: vec![0.0; num_links],
            unfrozen: vec![0; num_links],
            pos_off: vec![0],
            link_seen: vec![0; num_links],
            all_dirty: true,
            whole: true,
            ..Filler::default()
        }
    }

    /// Links carrying at least one indexed flow (valid after [`Filler::index`]).
    pub fn touched(&self) -> &[LinkId] {
        &self.touched
    }

    /// Positions of the indexed flows crossing link `l`, in position order.
    pub fn flows_on(&self, l: LinkId) -> &[u32] {
        &self.on[l as usize]
    }

    /// The flows the last fill recomputed: `None` after a whole fill
    /// (every indexed flow), or the flows (positions) of the component a
    /// refill filled again; every other flow kept its rate.
    pub fn refilled(&self) -> Option<&[u32]> {
        (!self.whole).then_some(&self.comp_flows[..])
    }

    /// Rate in use on link `l` after the last fill: capacity minus what is left.
    pub fn used(&self, l: LinkId, cap: f64) -> f64 {
        (cap - self.rem_cap[l as usize]).max(0.0)
    }

    /// Groups the active flows (transfer ids) by the links they cross.
    pub fn index(&mut self, flows: &[u32], paths: &Paths) {
        for &l in &self.touched {
            self.on[l as usize].clear();
            self.alive[l as usize] = 0;
            self.in_touched[l as usize] = false;
        }
        self.touched.clear();
        self.pos_off.clear();
        self.pos_links.clear();
        self.pos_off.push(0);
        self.all_dirty = true;
        self.append(flows, 0, paths);
    }

    /// Adds the flows at positions `from..` (arrived since the last index)
    /// to the index; the earlier positions keep their entries.
    pub fn append(&mut self, flows: &[u32], from: usize, paths: &Paths) {
        debug_assert_eq!(self.pos_off.len(), from + 1);
        for (pos, &t) in flows.iter().enumerate().skip(from) {
            for &l in paths.of(t) {
                if !self.in_touched[l as usize] {
                    self.in_touched[l as usize] = true;
                    self.touched.push(l);
                }
                self.on[l as usize].push(pos as u32);
                self.alive[l as usize] += 1;
                self.pos_links.push(l);
                self.dirty.push(l);
            }
            self.pos_off.push(self.pos_links.len() as u32);
        }
    }

    /// Takes the indexed flow at `pos` out of the link counts without
    /// re-indexing: the caller marks its position dead for [`Filler::fill`].
    pub fn remove(&mut self, pos: u32) {
        let (a, b) = (
            self.pos_off[pos as usize] as usize,
            self.pos_off[pos as usize + 1] as usize,
        );
        for &l in &self.pos_links[a..b] {
            self.alive[l as usize] -= 1;
            self.dirty.push(l);
        }
    }

    /// [`Filler::fill`] without per-flow caps, recomputing only what the
    /// changes since the last fill can move: max-min rates on one set of
    /// links are independent of the flows that share no link with it
    /// (transitively), so the flows connected to a link that gained or
    /// lost a flow are filled again and every other flow keeps its rate
    /// (and every other link its usage). `cap` must be the capacities of
    /// the last fill. The fill of a component makes the same
    /// floating-point operations in the same order as a whole fill does
    /// on it: pops come in (share, link) order and a link's share reads
    /// only its own component's freezes, so the rates are the same values.
    /// `rate` must be the vector the last fill wrote (positions past its
    /// end are new; a removed position keeps its last rate, which the
    /// caller ignores with `dead`).
    pub fn refill(&mut self, cap: &[f64], dead: &[bool], rate: &mut Vec<f64>) {
        let n = self.pos_off.len() - 1;
        if self.all_dirty || rate.len() > n || self.frozen.len() > n {
            self.fill(cap, None, dead, rate);
            return;
        }
        // The component of the changed links: flows crossing them, their
        // links, and so on.
        self.seen = self.seen.wrapping_add(1);
        if self.seen == 0 {
            self.link_seen.iter_mut().for_each(|s| *s = 0);
            self.pos_seen.iter_mut().for_each(|s| *s = 0);
            self.seen = 1;
        }
        let stamp = self.seen;
        self.pos_seen.resize(n, 0);
        self.comp_links.clear();
        self.comp_flows.clear();
        for &l in &self.dirty {
            if self.link_seen[l as usize] != stamp {
                self.link_seen[l as usize] = stamp;
                self.comp_links.push(l);
            }
        }
        self.dirty.clear();
        // Removed flows' entries are dropped from the links walked (the
        // others keep their order, the order a fill freezes them in).
        let mut i = 0;
        while i < self.comp_links.len() {
            let l = self.comp_links[i];
            i += 1;
            let mut on = std::mem::take(&mut self.on[l as usize]);
            let mut keep = 0;
            for j in 0..on.len() {
                let pos = on[j];
                let p = pos as usize;
                if dead[p] {
                    continue;
                }
                on[keep] = pos;
                keep += 1;
                if self.pos_seen[p] == stamp {
                    continue;
                }
                self.pos_seen[p] = stamp;
                self.comp_flows.push(pos);
                let (a, b) = (self.pos_off[p] as usize, self.pos_off[p + 1] as usize);
                for &m in &self.pos_links[a..b] {
                    if self.link_seen[m as usize] != stamp {
                        self.link_seen[m as usize] = stamp;
                        self.comp_links.push(m);
                    }
                }
            }
            on.truncate(keep);
            self.on[l as usize] = on;
        }
        rate.resize(n, 0.0);
        // Flows outside the component stay frozen at their rates.
        self.frozen.resize(n, true);
        for &pos in &self.comp_flows {
            self.frozen[pos as usize] = false;
        }
        self.left = self.comp_flows.len();
        self.whole = false;
        let links = std::mem::take(&mut self.comp_links);
        self.reset_links(cap, &links);
        self.comp_links = links;
        self.capped.clear();
        self.water(rate);
    }

    /// Each of `links` back at its capacity in `cap` with every flow on it
    /// unfrozen, and the heap made of their shares. Built whole (O(L)), not
    /// pushed one by one: the pops depend only on the set of (share, link)
    /// keys.
    fn reset_links(&mut self, cap: &[f64], links: &[LinkId]) {
        let mut keys = std::mem::take(&mut self.heap).into_vec();
        keys.clear();
        for &l in links {
            let (c, k) = (cap[l as usize], self.alive[l as usize]);
            self.rem_cap[l as usize] = c;
            self.unfrozen[l as usize] = k;
            if k > 0 {
                keys.push(Reverse((Key(c / k as f64), l)));
            }
        }
        self.heap = BinaryHeap::from(keys);
    }

    /// Max-min fair rates of the indexed flows into `rate` (by position), on
    /// link capacities `cap` (indexed by link), each flow also held to
    /// `flow_cap[pos]` when given. Positions marked `dead` get rate 0.
    pub fn fill(
        &mut self,
        cap: &[f64],
        flow_cap: Option<&[f64]>,
        dead: &[bool],
        rate: &mut Vec<f64>,
    ) {
        let n = self.pos_off.len() - 1;
        rate.clear();
        rate.resize(n, 0.0);
        self.frozen.clear();
        self.frozen.extend_from_slice(dead);
        self.left = dead.iter().filter(|&&d| !d).count();
        self.whole = true;
        let links = std::mem::take(&mut self.touched);
        self.reset_links(cap, &links);
        self.touched = links;
        self.capped.clear();
        self.dirty.clear();
        // A refill may follow only a fill of the same capacities.
        self.all_dirty = flow_cap.is_some();
        if let Some(fc) = flow_cap {
            self.capped.extend(
                fc.iter()
                    .enumerate()
                    .filter(|(_, c)| c.is_finite())
                    .map(|(p, &c)| (c, p as u32)),
            );
            self.capped.sort_by(|a, b| a.0.total_cmp(&b.0));
        }
        self.water(rate);
    }

    /// The progressive filling proper, from the heap of link shares and
    /// the sorted flow caps set up by [`Filler::fill`] or [`Filler::refill`].
    fn water(&mut self, rate: &mut [f64]) {
        let mut ci = 0;
        // Once every flow is frozen, what is left in the heap are links
        // with no unfrozen flow, which the loop would only discard.
        while self.left > 0 {
            // The smallest current link share, refreshing stale keys.
            let link = loop {
                let Some(&Reverse((Key(key), l))) = self.heap.peek() else {
                    break None;
                };
                let u = self.unfrozen[l as usize];
                if u == 0 {
                    self.heap.pop();
                    continue;
                }
                let cur = (self.rem_cap[l as usize] / u as f64).max(0.0);
                if cur > key * (1.0 + 1e-12) {
                    // Raise the stale key in place: one sift-down, and the
                    // same order as a pop and a push (keys are unique pairs).
                    if let Some(mut top) = self.heap.peek_mut() {
                        *top = Reverse((Key(cur), l));
                    }
                    continue;
                }
                break Some((cur, l));
            };
            while ci < self.capped.len() && self.frozen[self.capped[ci].1 as usize] {
                ci += 1;
            }
            let cap_next = self.capped.get(ci).copied();
            match (link, cap_next) {
                (None, None) => break,
                (Some((share, _)), Some((c, pos))) if c <= share => {
                    self.freeze(pos, c, rate);
                    ci += 1;
                }
                (None, Some((c, pos))) => {
                    self.freeze(pos, c, rate);
                    ci += 1;
                }
                (Some((share, l)), _) => {
                    self.heap.pop();
                    let on = std::mem::take(&mut self.on[l as usize]);
                    for &pos in &on {
                        if !self.frozen[pos as usize] {
                            self.freeze(pos, share, rate);
                        }
                    }
                    self.on[l as usize] = on;
                }
            }
        }
    }

    fn freeze(&mut self, pos: u32, r: f64, rate: &mut [f64]) {
        self.frozen[pos as usize] = true;
        self.left -= 1;
        rate[pos as usize] = r;
        let (a, b) = (
            self.pos_off[pos as usize] as usize,
            self.pos_off[pos as usize + 1] as usize,
        );
        for &l in &self.pos_links[a..b] {
            self.rem_cap[l as usize] -= r;
            self.unfrozen[l as usize] -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn paths(ps: &[&[LinkId]]) -> Paths {
        let mut p = Paths {
            off: vec![0],
            links: vec![],
        };
        for x in ps {
            p.links.extend_from_slice(x);
            p.off.push(p.links.len() as u32);
        }
        p
    }

    #[test]
    fn classic_max_min() {
        // Link 0 (cap 1): flows 0, 1. Link 1 (cap 2): flows 1, 2.
        // Max-min: flows 0 and 1 get 1/2 on link 0; flow 2 takes the rest, 3/2.
        let p = paths(&[&[0], &[0, 1], &[1]]);
        let flows = [0, 1, 2];
        let mut f = Filler::new(2);
        let mut rate = Vec::new();
        f.index(&flows, &p);
        f.fill(&[1.0, 2.0], None, &[false; 3], &mut rate);
        assert_eq!(rate, [0.5, 0.5, 1.5]);
        assert!((f.used(1, 2.0) - 2.0).abs() < 1e-12);
        // A cap on flow 0 frees link 0 for flow 1, which then splits link 1 evenly.
        f.fill(
            &[1.0, 2.0],
            Some(&[0.2, f64::INFINITY, f64::INFINITY]),
            &[false; 3],
            &mut rate,
        );
        assert!((rate[0] - 0.2).abs() < 1e-12);
        assert!((rate[1] - 0.8).abs() < 1e-12);
        assert!((rate[2] - 1.2).abs() < 1e-12);
    }

    #[test]
    fn reindex_after_removal() {
        let p = paths(&[&[0], &[0, 1], &[1]]);
        let mut f = Filler::new(2);
        let mut rate = Vec::new();
        f.index(&[0, 1, 2], &p);
        f.index(&[1, 2], &p);
        assert_eq!(f.flows_on(0), &[0]);
        f.fill(&[1.0, 2.0], None, &[false; 2], &mut rate);
        assert_eq!(rate, [1.0, 1.0]);
        // Removing flow 2 without re-indexing frees link 1 for flow 1 alone.
        f.remove(1);
        f.fill(&[1.0, 2.0], None, &[false, true], &mut rate);
        assert_eq!(rate, [1.0, 0.0]);
        f.remove(0);
        f.fill(&[1.0, 2.0], None, &[true, true], &mut rate);
        assert_eq!(rate, [0.0, 0.0]);
        assert_eq!(f.used(0, 1.0), 0.0);
    }

    /// Textbook progressive filling over the live flows: raise every
    /// unfrozen flow to the lowest link share or own cap, freeze what that
    /// saturates, repeat. O(F² L); the reference for [`Filler::fill`].
    fn plain_fill(ps: &[Vec<LinkId>], cap: &[f64], fcap: &[f64], dead: &[bool]) -> Vec<f64> {
        let n = ps.len();
        let mut rate = vec![0.0; n];
        let mut frozen = dead.to_vec();
        let mut rem = cap.to_vec();
        while frozen.iter().any(|&f| !f) {
            let users = |l: usize, frozen: &[bool]| {
                (0..n)
                    .filter(|&j| !frozen[j] && ps[j].contains(&(l as LinkId)))
                    .count()
            };
            let mut x = f64::INFINITY;
            for (l, &left) in rem.iter().enumerate() {
                let u = users(l, &frozen);
                if u > 0 {
                    x = x.min((left / u as f64).max(0.0));
                }
            }
            for j in 0..n {
                if !frozen[j] {
                    x = x.min(fcap[j]);
                }
            }
            let near = |v: f64| v <= x * (1.0 + 1e-12);
            let mut take: Vec<usize> = (0..n).filter(|&j| !frozen[j] && near(fcap[j])).collect();
            if take.is_empty() {
                for (l, &left) in rem.iter().enumerate() {
                    let u = users(l, &frozen);
                    if u > 0 && near((left / u as f64).max(0.0)) {
                        take.extend(
                            (0..n).filter(|&j| !frozen[j] && ps[j].contains(&(l as LinkId))),
                        );
                    }
                }
                take.sort_unstable();
                take.dedup();
            }
            for j in take {
                let r = fcap[j].min(x);
                rate[j] = r;
                frozen[j] = true;
                for &l in &ps[j] {
                    rem[l as usize] -= r;
                }
            }
        }
        rate
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// The filler (per-position link copies, appended arrivals, lazy
        /// heap keys) gives the rates of a plain progressive filling, with
        /// and without per-flow caps, after appends and removals.
        #[test]
        fn fill_matches_plain_progressive_filling(
            caps in proptest::collection::vec(1u32..=20, 1..=6),
            flows in proptest::collection::vec(
                (proptest::collection::vec(0usize..6, 1..=3), prop::option::of(1u32..=12), any::<bool>()),
                1..=24,
            ),
            split in 0usize..=24,
        ) {
            let nl = caps.len();
            let cap: Vec<f64> = caps.iter().map(|&c| c as f64 / 4.0).collect();
            let ps: Vec<Vec<LinkId>> = flows
                .iter()
                .map(|(ls, _, _)| {
                    let mut v: Vec<LinkId> = ls.iter().map(|&l| (l % nl) as LinkId).collect();
                    v.sort_unstable();
                    v.dedup();
                    v
                })
                .collect();
            let fcap: Vec<f64> = flows
                .iter()
                .map(|(_, c, _)| c.map_or(f64::INFINITY, |c| c as f64 / 8.0))
                .collect();
            let refs: Vec<&[LinkId]> = ps.iter().map(|v| v.as_slice()).collect();
            let p = paths(&refs);
            let ids: Vec<u32> = (0..ps.len() as u32).collect();
            let mut f = Filler::new(nl);
            // A stale index first, then the real one, part of it appended.
            f.index(&ids[..1], &p);
            let split = split.min(ids.len());
            f.index(&ids[..split], &p);
            f.append(&ids, split, &p);
            let mut dead = vec![false; ids.len()];
            for (pos, (_, _, gone)) in flows.iter().enumerate() {
                if *gone {
                    f.remove(pos as u32);
                    dead[pos] = true;
                }
            }
            let mut rate = Vec::new();
            for with_caps in [false, true] {
                let fc = if with_caps { fcap.clone() } else { vec![f64::INFINITY; ids.len()] };
                f.fill(&cap, with_caps.then_some(fc.as_slice()), &dead, &mut rate);
                let want = plain_fill(&ps, &cap, &fc, &dead);
                for j in 0..ids.len() {
                    prop_assert!(
                        (rate[j] - want[j]).abs() <= 1e-9 * want[j].max(1.0),
                        "flow {j}: {} against {} (caps {with_caps})", rate[j], want[j]
                    );
                }
            }
        }

        /// A refill after appends and removals gives every live flow the
        /// rate a whole fill gives it, to the bit, and every link the same
        /// usage.
        #[test]
        fn refill_matches_a_whole_fill(
            caps in proptest::collection::vec(1u32..=20, 1..=8),
            flows in proptest::collection::vec(proptest::collection::vec(0usize..8, 1..=3), 1..=30),
            steps in proptest::collection::vec((0usize..=3, proptest::collection::vec(any::<prop::sample::Index>(), 0..=3)), 1..=8),
        ) {
            let nl = caps.len();
            let cap: Vec<f64> = caps.iter().map(|&c| c as f64 / 3.0).collect();
            let ps: Vec<Vec<LinkId>> = flows
                .iter()
                .map(|ls| {
                    let mut v: Vec<LinkId> = ls.iter().map(|&l| (l % nl) as LinkId).collect();
                    v.sort_unstable();
                    v.dedup();
                    v
                })
                .collect();
            let refs: Vec<&[LinkId]> = ps.iter().map(|v| v.as_slice()).collect();
            let p = paths(&refs);
            let ids: Vec<u32> = (0..ps.len() as u32).collect();
            let (mut inc, mut whole) = (Filler::new(nl), Filler::new(nl));
            let (mut ri, mut rw) = (Vec::new(), Vec::new());
            let mut dead: Vec<bool> = Vec::new();
            let mut upto = 0usize;
            for (k, (arrive, gone)) in steps.iter().enumerate() {
                // Some flows arrive, some moving ones finish.
                let to = (upto + arrive).min(ids.len());
                if k == 0 {
                    inc.index(&ids[..to], &p);
                    whole.index(&ids[..to], &p);
                } else {
                    inc.append(&ids[..to], upto, &p);
                    whole.append(&ids[..to], upto, &p);
                }
                dead.resize(to, false);
                upto = to;
                if k > 0 {
                    for g in gone {
                        if upto == 0 {
                            break;
                        }
                        let pos = g.index(upto);
                        if !dead[pos] {
                            dead[pos] = true;
                            inc.remove(pos as u32);
                            whole.remove(pos as u32);
                        }
                    }
                }
                inc.refill(&cap, &dead, &mut ri);
                whole.fill(&cap, None, &dead, &mut rw);
                for pos in 0..upto {
                    if !dead[pos] {
                        prop_assert_eq!(ri[pos].to_bits(), rw[pos].to_bits(), "step {} flow {}", k, pos);
                    }
                }
                for l in 0..nl as LinkId {
                    prop_assert_eq!(inc.used(l, cap[l as usize]).to_bits(), whole.used(l, cap[l as usize]).to_bits());
                }
            }
        }
    }
}
