//! `pairwise`: N−1 shifted rounds, rank r sends to r+k in round k (MPI's
//! pairwise exchange). Each rank starts round k only when its round k−1 send
//! and receive are both done, as a blocking sendrecv would.

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
}
