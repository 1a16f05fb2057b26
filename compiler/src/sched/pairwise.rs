//! `pairwise`: N−1 shifted rounds, rank r sends to r+k in round k (MPI's
//! pairwise exchange). Each rank starts round k only when its round k−1 send
//! and receive are both done, as a blocking sendrecv would.
//!
//! [`pairwise_held`] is the same exchange with only the waits an MSCCL
//! executor can hold, for plans that become MSCCL XML.

use smallvec::smallvec;

use super::direct::block_transfer;
use crate::plan::{Deps, Plan};
use crate::topology::Topology;
use crate::traffic::{Layout, TrafficMatrix};

pub fn pairwise(topo: &Topology, traffic: &TrafficMatrix) -> Plan {
    let n = traffic.ranks();
    let layout = Layout::new(traffic);
    let mut plan = Plan::new("pairwise", n, topo.gpus_per_node());
    // Last transfer each rank sent or received (empty blocks are skipped, so
    // the chain links the rounds that move data).
    let mut last_send: Vec<Option<u32>> = vec![None; n];
    let mut last_recv: Vec<Option<u32>> = vec![None; n];
    let mut new_send = vec![None; n];
    let mut new_recv = vec![None; n];
    for k in 0..n {
        new_send.copy_from_slice(&last_send);
        new_recv.copy_from_slice(&last_recv);
        for s in 0..n {
            let d = (s + k) % n;
            let bytes = traffic.get(s, d);
            if bytes == 0 {
                continue;
            }
            let mut deps: Deps = smallvec![];
            // The sender waits for its own previous round, the receiver for its own.
            for prev in [last_send[s], last_recv[s], last_send[d], last_recv[d]]
                .into_iter()
                .flatten()
            {
                if !deps.contains(&prev) {
                    deps.push(prev);
                }
            }
            let id = plan.push(block_transfer(topo, &layout, traffic, s, d, k as u32, deps));
            new_send[s] = Some(id);
            new_recv[d] = Some(id);
        }
        last_send.copy_from_slice(&new_send);
        last_recv.copy_from_slice(&new_recv);
    }
    plan
}

/// `pairwise` as an MSCCL executor runs it (`sched::Target::Msccl`: the
/// plan goes to XML). The executor holds a send back only for
/// steps of its own gpu, and a send step is done once its data is staged
/// in the connection's FIFO: so neither the receiver's previous round nor
/// the arrival of the sender's own previous send can be waited for
/// (`msccl::xsim`). A rank starts round k once every block it received in
/// the rounds before k has arrived, as a blocking `sendrecv` whose send is
/// buffered would; the plan has no "round done" event, so each transfer
/// lists all of them (N²/2 per rank; the lowering writes two waits per
/// send, `SendChain` in `msccl/lower/tbs.rs`).
pub fn pairwise_held(topo: &Topology, traffic: &TrafficMatrix) -> Plan {
    let n = traffic.ranks();
    let layout = Layout::new(traffic);
    let mut plan = Plan::new("pairwise", n, topo.gpus_per_node());
    // Every transfer each rank has received so far, in round order (empty
    // blocks are skipped). The last receive alone would let a rank whose
    // earlier block is late run its rounds out of order.
    let mut received: Vec<Vec<u32>> = vec![Vec::new(); n];
    let mut arrived: Vec<(usize, u32)> = Vec::with_capacity(n);
    for k in 0..n {
        for (s, got) in received.iter().enumerate() {
            let d = (s + k) % n;
            let bytes = traffic.get(s, d);
            if bytes == 0 {
                continue;
            }
            let deps: Deps = got.iter().copied().collect();
            let id = plan.push(block_transfer(topo, &layout, traffic, s, d, k as u32, deps));
            arrived.push((d, id));
        }
        for (d, id) in arrived.drain(..) {
            received[d].push(id);
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::verify_on;

    #[test]
    fn rounds_are_chained() {
        let topo = Topology::preset("dgx-h100", 2, Some(2)).unwrap();
        let mut m = TrafficMatrix::uniform(4, 10);
        m.set(1, 2, 0);
        let p = pairwise(&topo, &m);
        assert_eq!(p.steps(), 4);
        assert_eq!(p.transfers.len(), 15);
        verify_on(&p, &m, &topo).unwrap();
        // Round 1 of rank 0 (0 -> 1) waits for round 0 of ranks 0 and 1.
        let t = p
            .transfers
            .iter()
            .find(|t| t.src == 0 && t.dst == 1)
            .unwrap();
        assert_eq!(t.step, 1);
        assert_eq!(t.deps.len(), 2);
    }

    #[test]
    fn held_rounds_wait_for_every_earlier_receive_only() {
        let topo = Topology::preset("dgx-h100", 2, Some(2)).unwrap();
        let mut m = TrafficMatrix::uniform(4, 10);
        m.set(1, 2, 0);
        let p = pairwise_held(&topo, &m);
        assert_eq!(p.steps(), 4);
        assert_eq!(p.transfers.len(), 15);
        verify_on(&p, &m, &topo).unwrap();
        let find = |s: u32, d: u32| {
            p.transfers
                .iter()
                .position(|t| t.src == s && t.dst == d)
                .unwrap() as u32
        };
        // Round 1 of rank 0 (0 -> 1) waits for its own round-0 copy only,
        // not for its receiver's round 0.
        let t = &p.transfers[find(0, 1) as usize];
        assert_eq!(t.step, 1);
        assert_eq!(t.deps.as_slice(), &[find(0, 0)]);
        // Round 3 of rank 2 (2 -> 1) waits for what 2 received in rounds
        // 0 and 2 (2 -> 2, 0 -> 2; round 1's block 1 -> 2 is empty), not
        // for its own sends.
        let t = &p.transfers[find(2, 1) as usize];
        assert_eq!(t.step, 3);
        let mut deps = t.deps.to_vec();
        deps.sort_unstable();
        assert_eq!(deps, vec![find(2, 2), find(0, 2)]);
    }
}
