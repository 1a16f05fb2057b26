//! Lower bounds on the completion time of an all-to-all: the physical limit
//! of the cost model, which no schedule (relaying ones included) can beat.
//!
//! The cut bound: for a set of links that every byte of some traffic must
//! cross, those bytes need bytes / (total bandwidth) of moving time, and none
//! of them moves before the smallest path latency of any transfer that
//! crosses the set. The bound is the largest such figure over the cuts the
//! topology has (docs/cost-model.md, "Lower bound"):
//! - each GPU's egress and ingress (all its links: NVLink and PCIe to its NIC),
//!   crossed by all it sends or receives; and, for a GPU with a NIC of its
//!   own, its intra-node links together with that NIC's egress (ingress):
//!   the NIC at its goodput, a mesh GPU's pair links plus its NIC;
//! - each node's NIC egress and ingress, and its GPUs' PCIe links to the NICs,
//!   crossed by all that leaves or enters the node;
//! - each leaf's uplink and downlink, crossed by all that leaves or enters
//!   the leaf; on a rail-optimized fabric, each rail group's spine uplinks
//!   and downlinks (all its rail switches' together), crossed by all that
//!   leaves or enters the group. One rail switch's spine links alone are no
//!   cut: a schedule may first move bytes over NVLink to a GPU of another
//!   rail (PXN) and leave through that rail's switch, or stay inside the
//!   group on the destination's rail;
//! - around each hub (a switch of a `links` topology and the GPUs that hang
//!   only off it), its links to the rest of the graph;
//!
//! and at least the longest shortest-latency path of a non-empty pair.
//! The LP bound for `links` topologies (`lp_us`) is computed elsewhere.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use petgraph::visit::EdgeRef;
use petgraph::Direction;
use serde::{Deserialize, Serialize};

use crate::topology::{FabricKind, LinkClass, LinkId, Topology, Vertex};
use crate::traffic::TrafficMatrix;

/// A lower bound on completion time, microseconds.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct LowerBound {
    /// The cut bound.
    pub cut_us: f64,
    /// The binding cut, in words (`NIC egress of node 3`).
    pub cut: String,
    /// The multi-commodity-flow LP bound, when computed.
    pub lp_us: Option<f64>,
}

impl LowerBound {
    /// The tighter of the two bounds.
    pub fn best_us(&self) -> f64 {
        self.lp_us.map_or(self.cut_us, |lp| lp.max(self.cut_us))
    }
}

/// One cut: the links and the bytes that must cross them.
struct Cut {
    name: String,
    links: Vec<LinkId>,
    bytes: u64,
}

/// The cut bound of `traffic` on `topo`. The traffic should have the
/// topology's ranks (callers check with `TrafficMatrix::check_ranks`); extra
/// ranks on either side are ignored.
pub fn cut_bound(topo: &Topology, traffic: &TrafficMatrix) -> LowerBound {
    cut_bound_goodput(topo, traffic, 1.0)
}

/// The cut bound with every NIC link at `nic_goodput` of its line rate: the
/// bound of the calibrated network modes (their simulator uses the same NIC
/// capacities and only adds per-message costs, so it stays a lower bound).
pub fn cut_bound_goodput(topo: &Topology, traffic: &TrafficMatrix, nic_goodput: f64) -> LowerBound {
    let cap = |l: LinkId| {
        let link = topo.link(l);
        match link.class {
            LinkClass::NicTx | LinkClass::NicRx => link.bandwidth * nic_goodput,
            _ => link.bandwidth,
        }
    };
    let ranks = topo.ranks().min(traffic.ranks());
    let minlat = min_latency_per_link(topo, ranks);
    let mut best = LowerBound {
        cut_us: 0.0,
        cut: "none (no traffic between ranks)".to_string(),
        lp_us: None,
    };
    for cut in cuts(topo, traffic, ranks) {
        // A link no rank-to-rank route crosses (the PCIe of a lone node)
        // carries nothing in the model: it adds no capacity to a cut.
        let links: Vec<LinkId> = cut
            .links
            .iter()
            .copied()
            .filter(|&l| minlat[l as usize].is_finite())
            .collect();
        if cut.bytes == 0 || links.is_empty() {
            continue;
        }
        let bw: f64 = links.iter().map(|&l| cap(l)).sum();
        let lat = links
            .iter()
            .map(|&l| minlat[l as usize])
            .fold(f64::INFINITY, f64::min);
        let t = cut.bytes as f64 / bw + lat;
        if t > best.cut_us {
            best.cut_us = t;
            best.cut = cut.name;
        }
    }
    if let Some((lat, s, d)) = longest_pair_latency(topo, traffic, ranks) {
        if lat > best.cut_us {
            best.cut_us = lat;
            best.cut = format!("latency from rank {s} to rank {d}");
        }
    }
    best
}

/// For every link, the smallest latency of a transfer whose path crosses it
/// (infinite when no rank-to-rank path does).
fn min_latency_per_link(topo: &Topology, ranks: usize) -> Vec<f64> {
    let mut minlat = vec![f64::INFINITY; topo.num_links()];
    let mut path = Vec::with_capacity(8);
    for s in 0..ranks {
        for d in 0..ranks {
            if s == d {
                continue;
            }
            path.clear();
            topo.path_into(s, d, &mut path);
            let lat: f64 = path.iter().map(|&l| topo.link(l).latency_us).sum();
            for &l in &path {
                let m = &mut minlat[l as usize];
                *m = m.min(lat);
            }
        }
    }
    minlat
}

fn cuts(topo: &Topology, m: &TrafficMatrix, ranks: usize) -> Vec<Cut> {
    let g = topo.gpus_per_node();
    let graph = topo.graph();
    let edges_of = |r: usize, dir: Direction| -> Vec<LinkId> {
        graph
            .edges_directed(topo.gpu_vertex(r), dir)
            .map(|e| e.id().index() as LinkId)
            .collect()
    };
    let mut out = Vec::new();
    for r in 0..ranks {
        let diag = m.get(r, r);
        out.push(Cut {
            name: format!("egress of GPU {r}"),
            links: edges_of(r, Direction::Outgoing),
            bytes: (0..ranks).map(|d| m.get(r, d)).sum::<u64>() - diag,
        });
        out.push(Cut {
            name: format!("ingress of GPU {r}"),
            links: edges_of(r, Direction::Incoming),
            bytes: (0..ranks).map(|s| m.get(s, r)).sum::<u64>() - diag,
        });
    }
    out.extend(hub_cuts(topo, m, ranks));
    if !topo.is_hierarchical() || topo.nodes() < 2 {
        return out;
    }
    // Group the node- and leaf-level links by what they belong to.
    let (nodes, leaves) = (topo.nodes(), topo.leaves());
    let mut nic_tx = vec![Vec::new(); nodes];
    let mut nic_rx = vec![Vec::new(); nodes];
    let mut pcie_out = vec![Vec::new(); nodes];
    let mut pcie_in = vec![Vec::new(); nodes];
    let mut up = vec![Vec::new(); leaves];
    let mut down = vec![Vec::new(); leaves];
    for e in graph.edge_references() {
        let id = e.id().index() as LinkId;
        let (a, b) = (&graph[e.source()], &graph[e.target()]);
        match (e.weight().class, a, b) {
            (LinkClass::NicTx, Vertex::Nic(n, _), _) => nic_tx[*n].push(id),
            (LinkClass::NicRx, _, Vertex::Nic(n, _)) => nic_rx[*n].push(id),
            (LinkClass::PcieOut, Vertex::Gpu(r), _) => pcie_out[r / g].push(id),
            (LinkClass::PcieIn, _, Vertex::Gpu(r)) => pcie_in[r / g].push(id),
            (LinkClass::Uplink, Vertex::Leaf(l), _) => up[*l].push(id),
            (LinkClass::Downlink, _, Vertex::Leaf(l)) => down[*l].push(id),
            // A rail group's cut is all its rail switches' spine links together.
            (LinkClass::Uplink, Vertex::Rail(grp, _), _) => up[*grp].push(id),
            (LinkClass::Downlink, _, Vertex::Rail(grp, _)) => down[*grp].push(id),
            _ => {}
        }
    }
    out.extend(gpu_nic_cuts(topo, m, ranks));
    // Bytes between groups of ranks: node-level and leaf-level matrices.
    let mut node_m = vec![0u64; nodes * nodes];
    for s in 0..ranks {
        for d in 0..ranks {
            node_m[(s / g) * nodes + d / g] += m.get(s, d);
        }
    }
    let leaf_of: Vec<usize> = (0..nodes).map(|n| topo.leaf_of(n)).collect();
    let mut leaf_out = vec![0u64; leaves];
    let mut leaf_in = vec![0u64; leaves];
    let mut node_out = vec![0u64; nodes];
    let mut node_in = vec![0u64; nodes];
    for a in 0..nodes {
        for b in 0..nodes {
            let x = node_m[a * nodes + b];
            if a != b {
                node_out[a] += x;
                node_in[b] += x;
            }
            if leaf_of[a] != leaf_of[b] {
                leaf_out[leaf_of[a]] += x;
                leaf_in[leaf_of[b]] += x;
            }
        }
    }
    for n in 0..nodes {
        let node_cuts = [
            ("NIC egress", &nic_tx[n], node_out[n]),
            ("NIC ingress", &nic_rx[n], node_in[n]),
            ("PCIe egress", &pcie_out[n], node_out[n]),
            ("PCIe ingress", &pcie_in[n], node_in[n]),
        ];
        for (what, links, bytes) in node_cuts {
            out.push(Cut {
                name: format!("{what} of node {n}"),
                links: links.clone(),
                bytes,
            });
        }
    }
    let rails = topo.fabric_kind() == Some(FabricKind::RailOptimized);
    for l in 0..leaves {
        let (up_name, down_name) = if rails {
            (
                format!("spine uplinks of rail group {l}"),
                format!("spine downlinks of rail group {l}"),
            )
        } else {
            (
                format!("uplink of leaf {l}"),
                format!("downlink of leaf {l}"),
            )
        };
        out.push(Cut {
            name: up_name,
            links: up[l].clone(),
            bytes: leaf_out[l],
        });
        out.push(Cut {
            name: down_name,
            links: down[l].clone(),
            bytes: leaf_in[l],
        });
    }
    out
}

/// Cuts around a GPU and a NIC of its own (no other GPU's PCIe reaches
/// it): everything the GPU sends leaves over its intra-node links (NVLink,
/// or every xGMI pair link of a mesh) and that NIC's egress, and likewise
/// in. Against the GPU's own cut (its intra-node links and its PCIe) this
/// counts the NIC at its goodput outside `ideal`, and at its own rate where
/// PCIe is faster than the NIC: on a mesh, a GPU's total egress over its
/// pair links plus its NIC.
fn gpu_nic_cuts(topo: &Topology, m: &TrafficMatrix, ranks: usize) -> Vec<Cut> {
    let graph = topo.graph();
    // The GPUs whose PCIe reaches each NIC vertex.
    let mut gpus_of: std::collections::BTreeMap<usize, Vec<usize>> = Default::default();
    for e in graph.edge_references() {
        if let (LinkClass::PcieOut, Vertex::Gpu(r)) = (e.weight().class, &graph[e.source()]) {
            gpus_of.entry(e.target().index()).or_default().push(*r);
        }
    }
    let mut out = Vec::new();
    for (nic, gpus) in gpus_of {
        let &[r] = gpus.as_slice() else {
            continue;
        };
        if r >= ranks {
            continue;
        }
        let nic = petgraph::graph::NodeIndex::new(nic);
        let gpu = topo.gpu_vertex(r);
        let links = |dir: Direction, pcie: LinkClass, nic_class: LinkClass| -> Vec<LinkId> {
            graph
                .edges_directed(gpu, dir)
                .filter(|e| e.weight().class != pcie)
                .chain(
                    graph
                        .edges_directed(nic, dir)
                        .filter(|e| e.weight().class == nic_class),
                )
                .map(|e| e.id().index() as LinkId)
                .collect()
        };
        let diag = m.get(r, r);
        out.push(Cut {
            name: format!("egress of GPU {r} and its NIC"),
            links: links(Direction::Outgoing, LinkClass::PcieOut, LinkClass::NicTx),
            bytes: (0..ranks).map(|d| m.get(r, d)).sum::<u64>() - diag,
        });
        out.push(Cut {
            name: format!("ingress of GPU {r} and its NIC"),
            links: links(Direction::Incoming, LinkClass::PcieIn, LinkClass::NicRx),
            bytes: (0..ranks).map(|s| m.get(s, r)).sum::<u64>() - diag,
        });
    }
    out
}

/// Cuts around a hub: a non-GPU vertex `w` and the GPUs whose every outgoing
/// (incoming) link goes to (comes from) `w`, such as a switch of a `links`
/// topology with its GPUs. Whatever those GPUs send outside the group must
/// leave through `w`'s links to the rest of the graph (and likewise in).
fn hub_cuts(topo: &Topology, m: &TrafficMatrix, ranks: usize) -> Vec<Cut> {
    let graph = topo.graph();
    let only_neighbour = |r: usize, dir: Direction| {
        let mut ends = graph
            .edges_directed(topo.gpu_vertex(r), dir)
            .map(|e| match dir {
                Direction::Outgoing => e.target(),
                Direction::Incoming => e.source(),
            });
        let first = ends.next()?;
        let single = ends.all(|v| v == first) && !matches!(graph[first], Vertex::Gpu(_));
        single.then_some(first)
    };
    let mut out = Vec::new();
    for (dir, what) in [
        (Direction::Outgoing, "egress"),
        (Direction::Incoming, "ingress"),
    ] {
        let mut groups: std::collections::BTreeMap<usize, Vec<usize>> = Default::default();
        for r in 0..ranks {
            if let Some(w) = only_neighbour(r, dir) {
                groups.entry(w.index()).or_default().push(r);
            }
        }
        for (w, gpus) in groups {
            let hub = petgraph::graph::NodeIndex::new(w);
            let mut inside = vec![false; ranks];
            gpus.iter().for_each(|&r| inside[r] = true);
            let is_inside = |v: petgraph::graph::NodeIndex| match graph[v] {
                Vertex::Gpu(r) => r < ranks && inside[r],
                _ => v == hub,
            };
            let links: Vec<LinkId> = graph
                .edges_directed(hub, dir)
                .filter(|e| {
                    !is_inside(match dir {
                        Direction::Outgoing => e.target(),
                        Direction::Incoming => e.source(),
                    })
                })
                .map(|e| e.id().index() as LinkId)
                .collect();
            let mut bytes = 0u64;
            for &r in &gpus {
                for x in (0..ranks).filter(|&x| !inside[x]) {
                    bytes += match dir {
                        Direction::Outgoing => m.get(r, x),
                        Direction::Incoming => m.get(x, r),
                    };
                }
            }
            out.push(Cut {
                name: format!(
                    "{what} of the {} GPUs at {}",
                    gpus.len(),
                    crate::topology::vertex_name(&graph[hub])
                ),
                links,
                bytes,
            });
        }
    }
    out
}

/// The largest, over pairs with bytes to move, of the least latency of any
/// walk between them in the graph: a relayed chain of transfers pays at
/// least that much, since latencies add along the chain.
fn longest_pair_latency(
    topo: &Topology,
    m: &TrafficMatrix,
    ranks: usize,
) -> Option<(f64, usize, usize)> {
    let graph = topo.graph();
    let mut best: Option<(f64, usize, usize)> = None;
    let mut dist = vec![f64::INFINITY; graph.node_count()];
    let mut heap = BinaryHeap::new();
    for s in 0..ranks {
        if (0..ranks).all(|d| d == s || m.get(s, d) == 0) {
            continue;
        }
        dist.iter_mut().for_each(|x| *x = f64::INFINITY);
        let src = topo.gpu_vertex(s).index();
        dist[src] = 0.0;
        heap.push(Reverse((crate::sim::OrdKey(0.0), src)));
        while let Some(Reverse((crate::sim::OrdKey(dv), v))) = heap.pop() {
            if dv > dist[v] {
                continue;
            }
            for e in graph.edges(petgraph::graph::NodeIndex::new(v)) {
                let w = e.target().index();
                let nd = dv + e.weight().latency_us;
                if nd < dist[w] {
                    dist[w] = nd;
                    heap.push(Reverse((crate::sim::OrdKey(nd), w)));
                }
            }
        }
        for d in 0..ranks {
            if d == s || m.get(s, d) == 0 {
                continue;
            }
            let lat = dist[topo.gpu_vertex(d).index()];
            if lat.is_finite() && best.is_none_or(|b| lat > b.0) {
                best = Some((lat, s, d));
            }
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::{FabricSpec, TopologySpec};

    #[test]
    fn uniform_two_nodes_nic_binds() {
        let t = Topology::preset("dgx-h100", 2, None).unwrap();
        let b = 1_000_000u64;
        let m = TrafficMatrix::uniform(16, b);
        let lb = cut_bound(&t, &m);
        // Node egress: 8 GPUs x 8 remote peers x b over 8 NICs of 50 GB/s, + 3 us.
        let want = 64.0 * b as f64 / (8.0 * 50_000.0) + 3.0;
        assert!((lb.cut_us - want).abs() < 1e-9 * want, "{lb:?}");
        assert!(lb.cut.contains("node"), "{}", lb.cut);
        assert_eq!(lb.best_us(), lb.cut_us);
    }

    #[test]
    fn relays_cannot_beat_gpu_egress() {
        // One GPU sends everything: its NVLink and PCIe together are the cut.
        let t = Topology::preset("dgx-h100", 2, Some(2)).unwrap();
        let mut m = TrafficMatrix::zeros(4);
        for d in 1..4 {
            m.set(0, d, 5_000_000);
        }
        let lb = cut_bound(&t, &m);
        // GPU 0 egress: 15 MB over 450 + 50 GB/s, + 1 us (its NVLink path).
        let gpu: f64 = 15e6 / 500_000.0 + 1.0;
        // Node 0 NIC egress: 10 MB over 2 NICs, + 3 us.
        let nic = 10e6 / 100_000.0 + 3.0;
        assert!((lb.cut_us - gpu.max(nic)).abs() < 1e-9, "{lb:?}");
        assert_eq!(lb.cut, "NIC egress of node 0");
    }

    #[test]
    fn oversubscribed_uplink_binds() {
        let mut spec = TopologySpec::preset("dgx-h100", 4, Some(1)).unwrap();
        spec.fabric = Some(FabricSpec::fat_tree(2, 4.0, 1.0));
        let t = Topology::from_spec(spec, "t").unwrap();
        let m = TrafficMatrix::uniform(4, 1_000_000);
        let lb = cut_bound(&t, &m);
        // Leaf 0 sends 4 MB across an uplink of 2 x 50 / 4 GB/s; path 3 + 1 + 1 us.
        let want = 4e6 / 25_000.0 + 5.0;
        assert!((lb.cut_us - want).abs() < 1e-9, "{lb:?}");
        assert!(lb.cut.contains("leaf"), "{}", lb.cut);
    }

    #[test]
    fn rail_group_spine_cut_binds() {
        // 4 nodes x 2 GPUs x 2 NICs of 50 GB/s; rail groups of 2 nodes, 2:1.
        let mut spec = TopologySpec::preset("dgx-h100", 4, Some(2)).unwrap();
        spec.fabric = Some(FabricSpec::rail_optimized(Some(2), 2.0, 1.0));
        let t = Topology::from_spec(spec, "t").unwrap();
        let m = TrafficMatrix::uniform(8, 1_000_000);
        let lb = cut_bound(&t, &m);
        // Group 0's 4 GPUs send 4 x 4 MB to group 1 over 2 rail switches'
        // uplinks of 2 x 50 / 2 GB/s each; the path pays 3 + 1 (NIC) + 1 (uplink) us.
        // (Node 0's NICs: 12 MB over 100 GB/s + 4 us = 124 us, less.)
        let want = 16e6 / 100_000.0 + 5.0;
        assert!((lb.cut_us - want).abs() < 1e-9, "{lb:?}");
        assert_eq!(lb.cut, "spine uplinks of rail group 0");
        // Traffic inside one group needs no spine, whatever its rails:
        // relaying over NVLink to the destination's rail avoids it.
        let mut m = TrafficMatrix::zeros(8);
        m.set(0, 3, 8_000_000); // node 0 rail 0 -> node 1 rail 1
        let lb = cut_bound(&t, &m);
        assert!(!lb.cut.contains("spine"), "{lb:?}");
    }

    #[test]
    fn links_topology_hub_cut_binds() {
        // Two switches of two GPUs each (100 GB/s), joined by a 10 GB/s link.
        let text = r#"{"name":"two-switch","nodes":4,"gpus_per_node":1,"links":[
            {"from":"gpu0","to":"sw0","bandwidth_GBps":100,"latency_us":1,"bidirectional":true},
            {"from":"gpu1","to":"sw0","bandwidth_GBps":100,"latency_us":1,"bidirectional":true},
            {"from":"gpu2","to":"sw1","bandwidth_GBps":100,"latency_us":1,"bidirectional":true},
            {"from":"gpu3","to":"sw1","bandwidth_GBps":100,"latency_us":1,"bidirectional":true},
            {"from":"sw0","to":"sw1","bandwidth_GBps":10,"latency_us":2,"bidirectional":true}]}"#;
        let t = Topology::from_json_str(text, "t.json").unwrap();
        let b = 1_000_000u64;
        let m = TrafficMatrix::uniform(4, b);
        let lb = cut_bound(&t, &m);
        // 4 blocks cross the 10 GB/s link; a crossing route pays 1 + 2 + 1 us.
        let want = 4.0 * b as f64 / 10_000.0 + 4.0;
        assert!((lb.cut_us - want).abs() < 1e-9, "{lb:?}");
        assert_eq!(lb.cut, "egress of the 2 GPUs at sw0");
        let plan = crate::sched::direct(&t, &m);
        let r = crate::sim::simulate(&t, &plan, &Default::default()).unwrap();
        assert!(
            (r.completion_us - want).abs() < 1e-9 * want,
            "{}",
            r.completion_us
        );
    }

    #[test]
    fn mesh_gpu_and_its_nic_bind_at_goodput() {
        // 2 x 4 MI300X: GPU 0 sends 10 MB to each of its 3 mesh peers and to
        // each of the 4 GPUs of node 1.
        let t = Topology::preset("mi300x", 2, Some(4)).unwrap();
        let mut m = TrafficMatrix::zeros(8);
        for d in 1..8 {
            m.set(0, d, 10_000_000);
        }
        let lat = t.path_latency(0, 1);
        // Line rate: the PCIe to its NIC is at the NIC's rate, so the GPU's
        // own cut and the GPU-and-NIC cut agree.
        let ideal = cut_bound(&t, &m);
        let want = 70e6 / (3.0 * 64_000.0 + 50_000.0) + lat;
        assert!((ideal.cut_us - want).abs() < 1e-6, "{ideal:?}");
        // At goodput 0.86 only the NIC slows: the GPU with its NIC binds.
        let lb = cut_bound_goodput(&t, &m, 0.86);
        let want = 70e6 / (3.0 * 64_000.0 + 0.86 * 50_000.0) + lat;
        assert!((lb.cut_us - want).abs() < 1e-6, "{lb:?}");
        assert_eq!(lb.cut, "egress of GPU 0 and its NIC");
        // A NIC shared by two GPUs is no GPU's own: no such cut.
        let spec = TopologySpec::preset_shape("mi300x", 2, Some(4), Some(2)).unwrap();
        let shared = Topology::from_spec(spec, "t").unwrap();
        let lb = cut_bound_goodput(&shared, &m, 0.86);
        assert!(!lb.cut.contains("its NIC"), "{lb:?}");
    }

    #[test]
    fn mesh_gpu_egress_and_pair_latency() {
        let t = Topology::preset("mi300x", 1, Some(4)).unwrap();
        let mut m = TrafficMatrix::zeros(4);
        m.set(0, 1, 1);
        let lb = cut_bound(&t, &m);
        // One byte: the 1 us link latency dominates.
        assert!(
            (lb.cut_us - (1.0 + 1.0 / 64_000.0 / 3.0)).abs() < 1e-9,
            "{lb:?}"
        );
        let empty = cut_bound(&t, &TrafficMatrix::zeros(4));
        assert_eq!(empty.cut_us, 0.0);
    }
}
