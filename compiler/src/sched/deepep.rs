//! `deepep`: DeepEP's normal-mode dispatch, what MoE teams run today.
//! Each GPU sends everything it has for another node in one RDMA write to
//! the GPU of that node with its own local index (its rail peer, so the
//! write never changes rail), into that GPU's scratch; the receiving GPU
//! then forwards each block over NVLink to its destination GPU (a local
//! copy for its own). Intra-node and local blocks go as in `direct`. No
//! balancing across GPUs, no stages: every send starts at once, and a
//! forward waits only for the write it forwards from.

use smallvec::smallvec;

use super::direct::{block_transfer, path_between};
use crate::plan::{Buffer, Deps, Path, Plan, Transfer};
use crate::topology::Topology;
use crate::traffic::{Layout, TrafficMatrix};

/// The GPU of node `node` that receives `src`'s write: the one with `src`'s
/// local index (the same rail whenever the nodes share a rail map).
pub fn deepep_peer(topo: &Topology, src: usize, node: usize) -> usize {
    node * topo.gpus_per_node() + topo.local_of(src)
}

/// One RDMA write per (source GPU, other node) with traffic, then one
/// forward per block it carries.
pub fn deepep(topo: &Topology, traffic: &TrafficMatrix) -> Plan {
    let n = traffic.ranks();
    let g = topo.gpus_per_node();
    let layout = Layout::new(traffic);
    let mut plan = Plan::new("deepep", n, g);
    let mut scratch_end = vec![0u64; n];
    for s in 0..n {
        let a = topo.node_of(s);
        for b in 0..topo.nodes() {
            let dsts = b * g..(b + 1) * g;
            if b == a {
                for d in dsts.filter(|&d| traffic.get(s, d) > 0) {
                    plan.push(block_transfer(topo, &layout, traffic, s, d, 0, Deps::new()));
                }
                continue;
            }
            let bytes: u64 = dsts.clone().map(|d| traffic.get(s, d)).sum();
            if bytes == 0 {
                continue;
            }
            // The blocks of `s` for node `b` are adjacent in its input
            // (destination order), so one write carries them all.
            let peer = deepep_peer(topo, s, b);
            let at = scratch_end[peer];
            scratch_end[peer] += bytes;
            let write = plan.push(Transfer {
                src: s as u32,
                src_buf: Buffer::Input,
                src_off: layout.send_offset(s, b * g),
                dst: peer as u32,
                dst_buf: Buffer::Scratch,
                dst_off: at,
                bytes,
                path: Path::Rdma {
                    nic: topo.rail_of(s) as u32,
                },
                step: 0,
                deps: Deps::new(),
            });
            let mut off = at;
            for d in dsts {
                let block = traffic.get(s, d);
                if block == 0 {
                    continue;
                }
                plan.push(Transfer {
                    src: peer as u32,
                    src_buf: Buffer::Scratch,
                    src_off: off,
                    dst: d as u32,
                    dst_buf: Buffer::Output,
                    dst_off: layout.recv_offset(s, d),
                    bytes: block,
                    path: path_between(topo, peer, d),
                    step: 1,
                    deps: smallvec![write],
                });
                off += block;
            }
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
    fn writes_are_rail_aligned_and_forwards_stay_on_the_destination_node() {
        let topo = Topology::preset("dgx-h100", 3, Some(4)).unwrap();
        let mut spec = TrafficSpec::new(12, Pattern::Zipf(1.0));
        spec.moe.tokens_per_rank = 64;
        let m = generate(&spec).unwrap();
        let p = deepep(&topo, &m);
        verify_on(&p, &m, &topo).unwrap();
        let mut writes = 0;
        for t in &p.transfers {
            if let Path::Rdma { .. } = t.path {
                writes += 1;
                assert_eq!(t.src % 4, t.dst % 4, "same local index");
                assert_eq!(t.dst_buf, Buffer::Scratch);
            }
            if t.src_buf == Buffer::Scratch {
                let write = &p.transfers[t.deps[0] as usize];
                assert!(matches!(write.path, Path::Rdma { .. }));
                assert_eq!(write.dst, t.src);
                // The forward happens on the destination's node.
                assert_eq!(t.src / 4, t.dst / 4);
                assert_ne!(t.path, Path::Rdma { nic: 0 });
            }
        }
        // At most one write per (source GPU, other node).
        assert!(writes > 0 && writes <= 12 * 2, "{writes}");
    }

    #[test]
    fn mesh_nodes_verify() {
        let topo = Topology::preset("mi300x", 2, Some(4)).unwrap();
        let mut m = TrafficMatrix::uniform(8, 4096);
        m.set(1, 6, 0);
        m.set(2, 5, 77);
        verify_on(&deepep(&topo, &m), &m, &topo).unwrap();
    }
}
