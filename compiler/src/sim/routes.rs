//! Routes as the simulator's rates see them: the links each transfer
//! crosses, its path latency, and the twin links the water-filling may skip.

use std::collections::HashMap;

use super::fair::Paths;
use crate::plan::Plan;
use crate::topology::{LinkClass, LinkId, Topology};

/// The topology's route and path latency of every transfer.
pub(super) fn routes(topo: &Topology, plan: &Plan) -> (Paths, Vec<f64>) {
    let n = plan.transfers.len();
    let mut paths = Paths {
        off: Vec::with_capacity(n + 1),
        links: Vec::with_capacity(n * 4),
    };
    paths.off.push(0);
    let mut latency = Vec::with_capacity(n);
    for t in &plan.transfers {
        let before = paths.links.len();
        topo.path_into(t.src as usize, t.dst as usize, &mut paths.links);
        latency.push(
            paths.links[before..]
                .iter()
                .map(|&l| topo.link(l).latency_us)
                .sum(),
        );
        paths.off.push(paths.links.len() as u32);
    }
    (paths, latency)
}

/// `paths` without the dropped side of every twin pair.
pub(super) fn without(paths: &Paths, twins: &[(LinkId, LinkId)], links: usize) -> Paths {
    let mut drop = vec![false; links];
    for &(d, _) in twins {
        drop[d as usize] = true;
    }
    let n = paths.off.len().saturating_sub(1);
    let mut kept = Paths {
        off: Vec::with_capacity(n + 1),
        links: Vec::with_capacity(paths.links.len()),
    };
    kept.off.push(0);
    for t in 0..n as u32 {
        kept.links
            .extend(paths.of(t).iter().filter(|&&l| !drop[l as usize]));
        kept.off.push(kept.links.len() as u32);
    }
    kept
}

/// Links crossed by exactly the same transfers as another link of no more
/// capacity: at every instant they carry the same flows and the other one
/// binds first, so the water-filling can skip them (on a DGX, a GPU's PCIe
/// link to its own NIC twins the NIC's egress: half the work). Returns
/// (dropped, kept) pairs. In congested mode NIC links are never dropped: the
/// incast model acts on them.
pub(super) fn twin_links(topo: &Topology, paths: &Paths, congested: bool) -> Vec<(LinkId, LinkId)> {
    // A set signature: count and two independent sums of mixed transfer ids.
    let mix = |x: u64, k: u64| {
        let mut z = x.wrapping_add(k).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let links = topo.num_links();
    let mut sig = vec![(0u64, 0u64, 0u64); links];
    for t in 0..paths.off.len().saturating_sub(1) {
        let (h1, h2) = (mix(t as u64, 1), mix(t as u64, 2));
        for &l in paths.of(t as u32) {
            let s = &mut sig[l as usize];
            s.0 += 1;
            s.1 = s.1.wrapping_add(h1);
            s.2 = s.2.wrapping_add(h2);
        }
    }
    let nic = |l: LinkId| matches!(topo.link(l).class, LinkClass::NicTx | LinkClass::NicRx);
    let mut groups: HashMap<(u64, u64, u64), Vec<LinkId>> = HashMap::new();
    for l in 0..links as LinkId {
        if sig[l as usize].0 > 0 {
            groups.entry(sig[l as usize]).or_default().push(l);
        }
    }
    let mut twins = Vec::new();
    for (_, mut g) in groups {
        if g.len() < 2 {
            continue;
        }
        // Keep the smallest capacity; on a tie, a NIC link (the incast model's).
        g.sort_by(|&a, &b| {
            topo.link(a)
                .bandwidth
                .total_cmp(&topo.link(b).bandwidth)
                .then(nic(b).cmp(&nic(a)))
                .then(a.cmp(&b))
        });
        let keep = g[0];
        for &d in &g[1..] {
            if congested && nic(d) {
                continue;
            }
            twins.push((d, keep));
        }
    }
    twins.sort_unstable();
    twins
}
