//! `pxn`: NCCL's all-to-all with PXN (PCI × NVLink), the baseline most
//! clusters run today. A block for a GPU of another node first moves over
//! NVLink to the GPU of its own node whose NIC is on the destination's rail
//! (into that GPU's scratch), which then sends it over the network on that
//! rail: inter-node traffic never changes rail, so on a rail-optimized fabric
//! it never crosses the spine. Intra-node and local blocks go as in
//! `direct`. Everything starts at once; only a relayed block's network hop
//! waits, for its own NVLink hop.
//!
//! A relay's scratch holds the blocks it carries by destination rank, and
//! for one destination by source: so the rank a block is for finds where
//! it sits from its own node's columns and the per-rail prefix sums of
//! [`LocalTraffic`] (`rank_rail_before`), without the senders' rows, and
//! [`pxn_local`] plans one rank's program from those alone. The whole plan
//! and the per-rank planner share the layout ([`relay_layout`]) and the
//! transfers' shapes.

use smallvec::smallvec;

use super::direct::path_between;
use crate::plan::{Buffer, Path, Plan, Transfer};
use crate::rank::{block, from_scratch, to_scratch, LocalProgram, LocalTraffic, TransferKey};
use crate::topology::Topology;
use crate::traffic::TrafficMatrix;

/// The GPU of `src`'s node that sends a block for `dst` over the network:
/// `src` itself when it is on `dst`'s rail (or `dst` is on its node);
/// otherwise the GPU of the same local index as `dst` when its NIC is on
/// that rail, else the first GPU of the node on that rail. A node without a
/// GPU on that rail (a NIC that serves none) sends from `src`. For a `dst`
/// on another node it depends on `dst`'s local index only.
pub fn pxn_relay(topo: &Topology, src: usize, dst: usize) -> usize {
    let (a, g) = (topo.node_of(src), topo.gpus_per_node());
    let rail = topo.rail_of(dst);
    if topo.node_of(dst) == a || topo.rail_of(src) == rail {
        return src;
    }
    let same_local = a * g + topo.local_of(dst);
    if topo.rail_of(same_local) == rail {
        return same_local;
    }
    (a * g..(a + 1) * g)
        .find(|&r| topo.rail_of(r) == rail)
        .unwrap_or(src)
}

/// [`pxn_relay`] between GPUs of different nodes, by local index:
/// `table[i * G + l]` is the local index of the GPU of GPU `i`'s node that
/// relays its blocks for GPU `l` of any other node (`i` itself when none
/// does): it depends on the two local indices alone. The planners' inner
/// loops read this table instead of the topology.
fn relay_table(topo: &Topology) -> Vec<usize> {
    let g = topo.gpus_per_node();
    if topo.nodes() < 2 {
        return (0..g * g).map(|k| k / g).collect();
    }
    (0..g * g)
        .map(|k| topo.local_of(pxn_relay(topo, k / g, g + k % g)))
        .collect()
}

/// Where the relays of node `b` keep the blocks they carry, from the rows
/// of its GPUs (`rows[i]`, GPU `i`'s) and the [`relay_table`]:
/// `at[i * R + d]` is the offset of block (GPU `i` of `b`, `d`) in its
/// relay's scratch (left at 0 for blocks that go straight), `ends[l]` the
/// scratch GPU `l` of `b` needs. By destination, then by source (module
/// header).
fn relay_layout(
    b: usize,
    rows: &[&[u64]],
    table: &[usize],
    at: &mut Vec<u64>,
    ends: &mut Vec<u64>,
) {
    let g = rows.len();
    let n = rows.first().map_or(0, |r| r.len());
    at.clear();
    at.resize(g * n, 0);
    ends.clear();
    ends.resize(g, 0);
    for d in (0..n).filter(|&d| d / g != b) {
        let l = d % g;
        for (i, row) in rows.iter().enumerate() {
            let relay = table[i * g + l];
            if relay != i && row[d] > 0 {
                at[i * n + d] = ends[relay];
                ends[relay] += row[d];
            }
        }
    }
}

/// The network hop of a relayed block, on the relay's rail (the
/// destination's), from the offset `at` of the relay's scratch.
fn rail_send(
    topo: &Topology,
    relay: usize,
    d: usize,
    bytes: u64,
    at: u64,
    dst_off: u64,
) -> Transfer {
    let nic = topo.rail_of(relay) as u32;
    from_scratch(Path::Rdma { nic }, relay, d, bytes, at, dst_off)
}

/// One transfer per block that needs no relay; two (NVLink into the relay's
/// scratch, then RDMA on the destination's rail) per block that does.
pub fn pxn(topo: &Topology, traffic: &TrafficMatrix) -> Plan {
    let mut plan = Plan::new("pxn", 0, 0);
    pxn_into(topo, traffic, &mut plan);
    plan
}

/// [`pxn`] into `plan`, reusing its allocations (the per-batch `Planner`).
/// `traffic` must have the topology's ranks.
pub(crate) fn pxn_into(topo: &Topology, traffic: &TrafficMatrix, plan: &mut Plan) {
    let (n, g) = (traffic.ranks(), topo.gpus_per_node());
    plan.clear();
    plan.algorithm.clear();
    plan.algorithm.push_str("pxn");
    plan.ranks = n as u32;
    plan.gpus_per_node = g as u32;
    // `landed[d]`: what the ranks before the current one send `d`, where
    // the current one's block lands.
    let mut landed = vec![0u64; n];
    let table = relay_table(topo);
    let (mut at, mut ends) = (Vec::new(), Vec::new());
    for b in 0..topo.nodes() {
        let rows: Vec<&[u64]> = (b * g..(b + 1) * g).map(|s| traffic.row(s)).collect();
        relay_layout(b, &rows, &table, &mut at, &mut ends);
        for (l, &bytes) in ends.iter().enumerate() {
            if bytes > 0 {
                plan.need_scratch(b * g + l, bytes);
            }
        }
        for (i, row) in rows.iter().enumerate() {
            let s = b * g + i;
            let mut src_off = 0u64;
            for (d, &bytes) in row.iter().enumerate() {
                if bytes > 0 {
                    let relay = if d / g == b {
                        s
                    } else {
                        b * g + table[i * g + d % g]
                    };
                    if relay == s {
                        let path = path_between(topo, s, d);
                        plan.push(block(path, s, d, bytes, src_off, landed[d]));
                    } else {
                        let off = at[i * n + d];
                        let path = path_between(topo, s, relay);
                        let hop = plan.push(to_scratch(path, s, relay, bytes, src_off, off));
                        let mut send = rail_send(topo, relay, d, bytes, off, landed[d]);
                        send.deps = smallvec![hop];
                        plan.push(send);
                    }
                }
                src_off += bytes;
                landed[d] += bytes;
            }
        }
    }
}

/// `pxn` for rank `x` = GPU `j` of node `a`, from what it knows: the rows
/// of its node give what it sends and relays (its node's relay layout, as
/// the whole plan makes it) and where those blocks land (`above`); what it
/// receives comes from its column, straight from the sources on its rail
/// (at `before`) or from the relays of the other nodes, whose offsets
/// follow from `rank_rail_before` (their blocks for the nodes before `a`)
/// and the columns of node `a` (for its GPUs before `x`, and the sources
/// before each). O(G R) time and memory. The loops walk nodes and local
/// indices (no division per block), take paths and rails from per-local
/// tables, and skip the nodes that send the rank nothing.
pub(crate) fn pxn_local(topo: &Topology, t: &LocalTraffic, out: &mut LocalProgram) {
    let (n, g) = (t.ranks(), t.gpus_per_node);
    out.reset("pxn", t.rank, n, g);
    let x = t.rank;
    let (a, j) = (x / g, x % g);
    let key = |relay: usize, off: u64| TransferKey {
        rank: relay as u32,
        buf: Buffer::Scratch,
        off,
    };
    // The rail of each local index: every node's GPU `l` has the same.
    let rail: Vec<Path> = (0..g)
        .map(|l| Path::Rdma {
            nic: topo.rail_of(l) as u32,
        })
        .collect();
    // The rows of the rank's node: what it sends, what it relays, and the
    // blocks from its node's other GPUs into it.
    let table = relay_table(topo);
    let (mut at, mut ends) = (Vec::new(), Vec::new());
    let rows: Vec<&[u64]> = (0..g).map(|i| t.row(i)).collect();
    relay_layout(a, &rows, &table, &mut at, &mut ends);
    out.scratch_bytes = ends[j];
    let mut landed = t.above.clone();
    for (i, row) in rows.iter().enumerate() {
        let s = a * g + i;
        let mut src_off = 0u64;
        let parts = row.chunks_exact(g).zip(landed.chunks_exact_mut(g));
        for (b, (part, land)) in parts.enumerate() {
            for (l, (&bytes, land)) in part.iter().zip(land).enumerate() {
                let d = b * g + l;
                if bytes > 0 {
                    let relay_i = if b == a { i } else { table[i * g + l] };
                    let relay = a * g + relay_i;
                    if relay == s && (s == x || d == x) {
                        let path = match (b == a, s == d) {
                            (true, true) => Path::Local,
                            (true, false) => Path::Nvlink,
                            _ => rail[i],
                        };
                        out.push(&block(path, s, d, bytes, src_off, *land), []);
                    } else if relay != s && (s == x || relay == x) {
                        let off = at[i * n + d];
                        let hop = to_scratch(Path::Nvlink, s, relay, bytes, src_off, off);
                        out.push(&hop, []);
                        if relay == x {
                            let send = from_scratch(rail[relay_i], relay, d, bytes, off, *land);
                            out.push(&send, [key(relay, off)]);
                        }
                    }
                }
                src_off += bytes;
                *land += bytes;
            }
        }
    }
    // What the other nodes send the rank, source by source; `own` is where
    // each block lands (the rank's column so far).
    let mut own = 0u64;
    let mut next = vec![0u64; g];
    for b in 0..t.nodes {
        let cols = &t.cols[b * g * g..(b + 1) * g * g];
        let into: u64 = cols.iter().skip(j).step_by(g).sum();
        if b == a || into == 0 {
            own += into;
            continue;
        }
        // Each relay of node `b` keeps the rank's blocks after those for
        // the ranks before it: on the nodes before `a` (but `b`) and on
        // GPUs `0..j` of node `a`.
        next.fill(0);
        let before = &t.rank_rail_before[b * g * g..(b + 1) * g * g];
        for (i, (col, ahead)) in cols.chunks_exact(g).zip(before.chunks_exact(g)).enumerate() {
            for (l, (&c, &r)) in col.iter().zip(ahead).enumerate() {
                let relay = table[i * g + l];
                if relay != i {
                    next[relay] += r + if l < j { c } else { 0 };
                }
            }
        }
        for (i, col) in cols.chunks_exact(g).enumerate() {
            let (s, bytes) = (b * g + i, col[j]);
            if bytes > 0 {
                let relay_i = table[i * g + j];
                if relay_i == i {
                    let src_off = t.before[s] + col[..j].iter().sum::<u64>();
                    out.push(&block(rail[i], s, x, bytes, src_off, own), []);
                } else {
                    let relay = b * g + relay_i;
                    let off = &mut next[relay_i];
                    let send = from_scratch(rail[relay_i], relay, x, bytes, *off, own);
                    out.push(&send, [key(relay, *off)]);
                    *off += bytes;
                }
            }
            own += bytes;
        }
    }
    out.sort();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::verify_on;

    #[test]
    fn relays_pick_the_destination_rail() {
        let (topo, m) = crate::sched::moe_3x4();
        let p = pxn(&topo, &m);
        verify_on(&p, &m, &topo).unwrap();
        let mut relayed = 0;
        for t in &p.transfers {
            match t.path {
                Path::Rdma { nic } => {
                    // Every network hop stays on one rail: the receiver's.
                    assert_eq!(nic as usize, topo.rail_of(t.dst as usize));
                    assert_eq!(topo.rail_of(t.src as usize), topo.rail_of(t.dst as usize));
                    if t.src_buf == Buffer::Scratch {
                        relayed += 1;
                        let hop = &p.transfers[t.deps[0] as usize];
                        assert_eq!(hop.path, Path::Nvlink);
                        assert_eq!(hop.dst, t.src);
                        assert_eq!(topo.node_of(hop.src as usize), topo.node_of(t.src as usize));
                    }
                }
                Path::Nvlink => assert_eq!(t.src / 4, t.dst / 4),
                Path::Local => assert_eq!(t.src, t.dst),
            }
        }
        // 3 of every 4 inter-node blocks change rail.
        assert!(relayed > 0);
    }

    /// A relay's scratch holds its blocks by destination, then by source,
    /// end to end (what `pxn_local`'s receivers rely on).
    #[test]
    fn relay_scratch_is_by_destination_then_source() {
        let (topo, m) = crate::sched::moe_3x4();
        let p = pxn(&topo, &m);
        // (relay, offset, destination, source, bytes) of every relayed block.
        let mut seen: Vec<(u32, u64, u32, u32, u64)> = p
            .transfers
            .iter()
            .filter(|t| t.src_buf == Buffer::Scratch)
            .map(|t| {
                let hop = &p.transfers[t.deps[0] as usize];
                (t.src, t.src_off, t.dst, hop.src, t.bytes)
            })
            .collect();
        seen.sort_unstable();
        assert!(!seen.is_empty());
        let mut end = (u32::MAX, 0u64);
        for &(relay, off, _, _, bytes) in &seen {
            if relay != end.0 {
                end = (relay, 0);
            }
            assert_eq!(off, end.1, "relay {relay}: a gap or an overlap");
            end.1 += bytes;
        }
        for w in seen.windows(2) {
            if w[0].0 == w[1].0 {
                assert!((w[0].2, w[0].3) < (w[1].2, w[1].3), "{w:?}");
            }
        }
        for r in 0..topo.ranks() as u32 {
            let held: u64 = seen.iter().filter(|x| x.0 == r).map(|x| x.4).sum();
            assert_eq!(held, p.scratch_bytes(r as usize), "rank {r}");
        }
    }

    #[test]
    fn relay_follows_the_rail_map_not_the_local_index() {
        // Two NICs for four GPUs: GPU 3's rail is NIC 1, served by GPU 1 too.
        let topo = Topology::from_json_str(
            r#"{ "name": "t", "nodes": 2, "gpus_per_node": 4,
                 "intra": { "kind": "switch", "bandwidth_GBps": 450.0, "latency_us": 1.0 },
                 "nic":   { "per_node": 2, "bandwidth_GBps": 50.0, "latency_us": 3.0 } }"#,
            "t",
        )
        .unwrap();
        // From GPU 0 (rail 0) to GPU 7 (rail 1): relay GPU 3 (same local index).
        assert_eq!(pxn_relay(&topo, 0, 7), 3);
        // From GPU 1 (rail 1) to GPU 7: already on the rail, no relay.
        assert_eq!(pxn_relay(&topo, 1, 7), 1);
        // Inside the node: none.
        assert_eq!(pxn_relay(&topo, 0, 3), 0);
        let m = TrafficMatrix::uniform(8, 1000);
        verify_on(&pxn(&topo, &m), &m, &topo).unwrap();
    }
}

#[cfg(test)]
mod props {
    use proptest::prelude::*;

    use crate::bound::cut_bound;
    use crate::sched::{deepep, pxn};
    use crate::sim::{simulate, Network, SimOptions};
    use crate::topology::{IntraKind, IntraSpec, NicSpec, Topology, TopologySpec};
    use crate::traffic::TrafficMatrix;
    use crate::verify::verify_on;

    fn topo(nodes: usize, gpus: usize, nics: usize, mesh: bool) -> Topology {
        let spec = TopologySpec {
            name: "t".into(),
            nodes,
            gpus_per_node: gpus,
            intra: Some(IntraSpec {
                kind: if mesh {
                    IntraKind::Mesh
                } else {
                    IntraKind::Switch
                },
                bandwidth_gbps: 450.0,
                latency_us: 1.0,
            }),
            nic: Some(NicSpec {
                per_node: nics,
                bandwidth_gbps: 50.0,
                latency_us: 3.0,
                gpu_nic: None,
            }),
            fabric: None,
            links: None,
        };
        Topology::from_spec(spec, "t").unwrap()
    }

    fn arb_case() -> impl Strategy<Value = (usize, usize, usize, bool, Vec<u64>)> {
        (2usize..4, 1usize..5, any::<bool>()).prop_flat_map(|(n, g, mesh)| {
            let r = n * g;
            let cell = prop_oneof![Just(0u64), 1u64..5_000, 100_000u64..400_000];
            (
                Just(n),
                Just(g),
                1..=g,
                Just(mesh),
                prop::collection::vec(cell, r * r),
            )
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        #[test]
        fn pxn_and_deepep_verify_and_stay_above_the_bound((n, g, p, mesh, cells) in arb_case()) {
            let t = topo(n, g, p, mesh);
            let r = n * g;
            let m = TrafficMatrix::from_rows(cells.chunks(r).map(<[u64]>::to_vec).collect());
            let bound = cut_bound(&t, &m).cut_us;
            for plan in [pxn(&t, &m), deepep(&t, &m)] {
                let stats = verify_on(&plan, &m, &t);
                prop_assert!(stats.is_ok(), "{}: {:?}", plan.algorithm, stats);
                for net in [Network::Ideal, Network::Congested] {
                    let done = simulate(&t, &plan, &SimOptions::new(net)).unwrap().completion_us;
                    prop_assert!(done >= bound * (1.0 - 1e-9), "{net}: {done} < bound {bound}");
                }
            }
        }
    }
}
