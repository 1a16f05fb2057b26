//! `hierarchical`: the two-phase 2D all-to-all of Tutel and DeepSpeed-MoE.
//!
//! Phase 1 (NVLink): every GPU sends what it has for GPU `j` of every other
//! node to its node's GPU `j` (the rail of the destination), which packs it
//! in scratch by destination node and source rank; intra-node blocks go
//! straight to their output. Phase 2 (RDMA): GPU `j` of node A sends one
//! transfer per peer node B, rail-aligned to GPU `j` of B. Because the ranks
//! of a node are consecutive, the packed block lands contiguously in the
//! destination's output.

use smallvec::smallvec;

use super::direct::{block_transfer, path_between};
use crate::plan::{Buffer, Deps, Path, Plan, Transfer};
use crate::topology::Topology;
use crate::traffic::{Layout, TrafficMatrix};

pub fn hierarchical(topo: &Topology, traffic: &TrafficMatrix) -> Plan {
    let n = traffic.ranks();
    let g = topo.gpus_per_node();
    let nodes = topo.nodes();
    let layout = Layout::new(traffic);
    let mut plan = Plan::new("hierarchical", n, g);
    // Scratch of GPU (A, j): one region per destination node B, holding the
    // blocks from (A, 0..g) to (B, j) in source order.
    let mut region_off = vec![0u64; n * nodes];
    for a in 0..nodes {
        for j in 0..g {
            let relay = a * g + j;
            let mut off = 0;
            for b in (0..nodes).filter(|&b| b != a) {
                region_off[relay * nodes + b] = off;
                off += (0..g)
                    .map(|i| traffic.get(a * g + i, b * g + j))
                    .sum::<u64>();
            }
            if off > 0 {
                plan.need_scratch(relay, off);
            }
        }
    }
    // Phase 1.
    let mut gathered: Vec<Deps> = vec![Deps::new(); n * nodes];
    for s in 0..n {
        let (a, i) = (s / g, s % g);
        for d in 0..n {
            let bytes = traffic.get(s, d);
            if bytes == 0 {
                continue;
            }
            let (b, j) = (d / g, d % g);
            let t = if a == b {
                block_transfer(topo, &layout, traffic, s, d, 0, Deps::new())
            } else {
                let relay = a * g + j;
                let before: u64 = (0..i).map(|i2| traffic.get(a * g + i2, d)).sum();
                Transfer {
                    src: s as u32,
                    src_buf: Buffer::Input,
                    src_off: layout.send_offset(s, d),
                    dst: relay as u32,
                    dst_buf: Buffer::Scratch,
                    dst_off: region_off[relay * nodes + b] + before,
                    bytes,
                    path: path_between(topo, s, relay),
                    step: 0,
                    deps: Deps::new(),
                }
            };
            let scratch = t.dst_buf == Buffer::Scratch;
            let id = plan.push(t);
            if scratch {
                gathered[(a * g + j) * nodes + b].push(id);
            }
        }
    }
    // Phase 2.
    for relay in 0..n {
        let (a, j) = (relay / g, relay % g);
        for b in (0..nodes).filter(|&b| b != a) {
            let d = b * g + j;
            let bytes: u64 = (0..g).map(|i| traffic.get(a * g + i, d)).sum();
            if bytes == 0 {
                continue;
            }
            let deps = std::mem::replace(&mut gathered[relay * nodes + b], smallvec![]);
            plan.push(Transfer {
                src: relay as u32,
                src_buf: Buffer::Scratch,
                src_off: region_off[relay * nodes + b],
                dst: d as u32,
                dst_buf: Buffer::Output,
                dst_off: layout.recv_offset(a * g, d),
                bytes,
                path: Path::Rdma {
                    nic: topo.rail_of(relay) as u32,
                },
                step: 1,
                deps,
            });
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
    fn two_phases_verify() {
        let topo = Topology::preset("dgx-h100", 3, Some(4)).unwrap();
        let mut spec = TrafficSpec::new(12, Pattern::Zipf(1.0));
        spec.moe.tokens_per_rank = 64;
        let m = generate(&spec).unwrap();
        let p = hierarchical(&topo, &m);
        verify_on(&p, &m, &topo).unwrap();
        assert_eq!(p.steps(), 2);
        // Phase 2 sends are rail-aligned: GPU j to GPU j.
        for t in p.transfers.iter().filter(|t| t.step == 1) {
            assert_eq!(t.src % 4, t.dst % 4);
            assert_ne!(t.src / 4, t.dst / 4);
        }
    }
}
