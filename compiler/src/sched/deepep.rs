//! `deepep`: DeepEP's normal-mode dispatch, what MoE teams run today.
//! Each GPU sends everything it has for another node in one RDMA write to
//! the GPU of that node with its own local index (its rail peer, so the
//! write never changes rail), into that GPU's scratch; the receiving GPU
//! then forwards each block over NVLink to its destination GPU (a local
//! copy for its own). Intra-node and local blocks go as in `direct`. No
//! balancing across GPUs, no stages: every send starts at once, and a
//! forward waits only for the write it forwards from.
//!
//! A GPU's scratch holds the writes it receives in source order, so what a
//! rank receives, forwards and is forwarded follows from its node's
//! columns alone, and where its own writes land from one N x G prefix sum
//! (`rail_into_before` of [`LocalTraffic`]): [`deepep_local`] plans one
//! rank's program from those. The whole plan and the per-rank planner
//! share the transfers' shapes.

use smallvec::smallvec;

use super::direct::path_between;
use crate::plan::{Buffer, Path, Plan, Transfer};
use crate::rank::{block, from_scratch, to_scratch, LocalProgram, LocalTraffic, TransferKey};
use crate::topology::Topology;
use crate::traffic::TrafficMatrix;

/// The GPU of node `node` that receives `src`'s write: the one with `src`'s
/// local index (the same rail whenever the nodes share a rail map).
pub fn deepep_peer(topo: &Topology, src: usize, node: usize) -> usize {
    node * topo.gpus_per_node() + topo.local_of(src)
}

/// The write of everything `s` has for `peer`'s node, on `s`'s rail, into
/// `peer`'s scratch at `at`.
fn write(topo: &Topology, s: usize, peer: usize, bytes: u64, src_off: u64, at: u64) -> Transfer {
    let nic = topo.rail_of(s) as u32;
    to_scratch(Path::Rdma { nic }, s, peer, bytes, src_off, at)
}

/// One RDMA write per (source GPU, other node) with traffic, then one
/// forward per block it carries.
pub fn deepep(topo: &Topology, traffic: &TrafficMatrix) -> Plan {
    let mut plan = Plan::new("deepep", 0, 0);
    deepep_into(topo, traffic, &mut plan);
    plan
}

/// [`deepep`] into `plan`, reusing its allocations (the per-batch
/// `Planner`). `traffic` must have the topology's ranks.
pub(crate) fn deepep_into(topo: &Topology, traffic: &TrafficMatrix, plan: &mut Plan) {
    let (n, g) = (traffic.ranks(), topo.gpus_per_node());
    plan.clear();
    plan.algorithm.clear();
    plan.algorithm.push_str("deepep");
    plan.ranks = n as u32;
    plan.gpus_per_node = g as u32;
    // `landed[d]`: what the ranks before the current one send `d`.
    let mut landed = vec![0u64; n];
    let mut scratch_end = vec![0u64; n];
    for s in 0..n {
        let a = topo.node_of(s);
        let row = traffic.row(s);
        let mut src_off = 0u64;
        for (b, part) in row.chunks_exact(g).enumerate() {
            let bytes: u64 = part.iter().sum();
            if b == a {
                let mut off = src_off;
                for (d, &block_bytes) in (b * g..).zip(part) {
                    if block_bytes > 0 {
                        let path = path_between(topo, s, d);
                        plan.push(block(path, s, d, block_bytes, off, landed[d]));
                    }
                    off += block_bytes;
                }
            } else if bytes > 0 {
                // The blocks of `s` for node `b` are adjacent in its input
                // (destination order), so one write carries them all.
                let peer = deepep_peer(topo, s, b);
                let at = scratch_end[peer];
                scratch_end[peer] += bytes;
                let w = plan.push(write(topo, s, peer, bytes, src_off, at));
                let mut off = at;
                for (d, &block_bytes) in (b * g..).zip(part) {
                    if block_bytes > 0 {
                        let path = path_between(topo, peer, d);
                        let mut fwd = from_scratch(path, peer, d, block_bytes, off, landed[d]);
                        fwd.deps = smallvec![w];
                        plan.push(fwd);
                    }
                    off += block_bytes;
                }
            }
            src_off += bytes;
        }
        for (acc, &bytes) in landed.iter_mut().zip(row) {
            *acc += bytes;
        }
    }
    if scratch_end.iter().any(|&bytes| bytes > 0) {
        plan.scratch = scratch_end;
    }
}

/// `deepep` for rank `x` = GPU `j` of node `a`, from what it knows: its row
/// (its blocks inside the node, where they land from `above`, and its
/// writes, which land after the same rail's writes from the nodes before,
/// `rail_into_before`), and the columns of its node, source by source: the
/// writes into its node's GPUs fill their scratch in source order, so the
/// columns give every write the rank receives, every forward it makes
/// from them, and every forward into it from its node's other GPUs. O(G R)
/// time, O(R) memory.
pub(crate) fn deepep_local(topo: &Topology, t: &LocalTraffic, out: &mut LocalProgram) {
    let (n, g) = (t.ranks(), t.gpus_per_node);
    out.reset("deepep", t.rank, n, g);
    let x = t.rank;
    let (a, j) = (x / g, x % g);
    let mut land = Vec::new();
    crate::rank::landing(t, &mut land);
    let mut src_off = 0u64;
    for (b, part) in t.row(j).chunks_exact(g).enumerate() {
        let bytes: u64 = part.iter().sum();
        if b == a {
            let mut off = src_off;
            for (d, &block_bytes) in (b * g..).zip(part) {
                if block_bytes > 0 {
                    let path = path_between(topo, x, d);
                    out.push(&block(path, x, d, block_bytes, off, land[d]), []);
                }
                off += block_bytes;
            }
        } else if bytes > 0 {
            let peer = deepep_peer(topo, x, b);
            let at = t.rail_into_before[b * g + j];
            out.push(&write(topo, x, peer, bytes, src_off, at), []);
        }
        src_off += bytes;
    }
    // `written[i]`: the scratch GPU `i` of the node has filled so far;
    // `landed[i]`: its column so far.
    let mut written = vec![0u64; g];
    let mut landed = vec![0u64; g];
    for s in 0..n {
        let i = s % g;
        let cols = &t.cols[s * g..(s + 1) * g];
        if s / g == a {
            if s != x && cols[j] > 0 {
                let src_off = t.before[s] + cols[..j].iter().sum::<u64>();
                let path = path_between(topo, s, x);
                out.push(&block(path, s, x, cols[j], src_off, landed[j]), []);
            }
        } else {
            let bytes: u64 = cols.iter().sum();
            let peer = a * g + i;
            let at = written[i];
            written[i] += bytes;
            if i == j && bytes > 0 {
                out.push(&write(topo, s, x, bytes, t.before[s], at), []);
            }
            let w = TransferKey {
                rank: peer as u32,
                buf: Buffer::Scratch,
                off: at,
            };
            let mut off = at;
            for (l, &block_bytes) in cols.iter().enumerate() {
                if block_bytes > 0 && (i == j || l == j) {
                    let d = a * g + l;
                    let fwd = from_scratch(
                        path_between(topo, peer, d),
                        peer,
                        d,
                        block_bytes,
                        off,
                        landed[l],
                    );
                    out.push(&fwd, [w]);
                }
                off += block_bytes;
            }
        }
        for (acc, &bytes) in landed.iter_mut().zip(cols) {
            *acc += bytes;
        }
    }
    out.scratch_bytes = written[j];
    out.sort();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::verify_on;

    #[test]
    fn writes_are_rail_aligned_and_forwards_stay_on_the_destination_node() {
        let (topo, m) = crate::sched::moe_3x4();
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
