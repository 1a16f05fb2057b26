//! `pxn`: NCCL's all-to-all with PXN (PCI × NVLink), the baseline most
//! clusters run today. A block for a GPU of another node first moves over
//! NVLink to the GPU of its own node whose NIC is on the destination's rail
//! (into that GPU's scratch), which then sends it over the network on that
//! rail: inter-node traffic never changes rail, so on a rail-optimized fabric
//! it never crosses the spine. Intra-node and local blocks go as in
//! `direct`. Everything starts at once; only a relayed block's network hop
//! waits, for its own NVLink hop.

use smallvec::smallvec;

use super::direct::{block_transfer, path_between};
use crate::plan::{Buffer, Deps, Path, Plan, Transfer};
use crate::topology::Topology;
use crate::traffic::{Layout, TrafficMatrix};

/// The GPU of `src`'s node that sends a block for `dst` over the network:
/// `src` itself when it is on `dst`'s rail (or `dst` is on its node);
/// otherwise the GPU of the same local index as `dst` when its NIC is on
/// that rail, else the first GPU of the node on that rail. A node without a
/// GPU on that rail (a NIC that serves none) sends from `src`.
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

/// One transfer per block that needs no relay; two (NVLink into the relay's
/// scratch, then RDMA on the destination's rail) per block that does.
pub fn pxn(topo: &Topology, traffic: &TrafficMatrix) -> Plan {
    let n = traffic.ranks();
    let layout = Layout::new(traffic);
    let mut plan = Plan::new("pxn", n, topo.gpus_per_node());
    let mut scratch_end = vec![0u64; n];
    for s in 0..n {
        for d in 0..n {
            let bytes = traffic.get(s, d);
            if bytes == 0 {
                continue;
            }
            let relay = pxn_relay(topo, s, d);
            if relay == s {
                plan.push(block_transfer(topo, &layout, traffic, s, d, 0, Deps::new()));
                continue;
            }
            let at = scratch_end[relay];
            scratch_end[relay] += bytes;
            let hop = plan.push(Transfer {
                src: s as u32,
                src_buf: Buffer::Input,
                src_off: layout.send_offset(s, d),
                dst: relay as u32,
                dst_buf: Buffer::Scratch,
                dst_off: at,
                bytes,
                path: path_between(topo, s, relay),
                step: 0,
                deps: Deps::new(),
            });
            plan.push(Transfer {
                src: relay as u32,
                src_buf: Buffer::Scratch,
                src_off: at,
                dst: d as u32,
                dst_buf: Buffer::Output,
                dst_off: layout.recv_offset(s, d),
                bytes,
                path: Path::Rdma {
                    nic: topo.rail_of(relay) as u32,
                },
                step: 1,
                deps: smallvec![hop],
            });
        }
    }
    for (r, &bytes) in scratch_end.iter().enumerate() {
        if bytes > 0 {
            plan.need_scratch(r, bytes);
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::{generate, Pattern, TrafficSpec};
    use crate::verify::verify_on;

    #[test]
    fn relays_pick_the_destination_rail() {
        let topo = Topology::preset("dgx-h100", 3, Some(4)).unwrap();
        let mut spec = TrafficSpec::new(12, Pattern::Zipf(1.0));
        spec.moe.tokens_per_rank = 64;
        let m = generate(&spec).unwrap();
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
