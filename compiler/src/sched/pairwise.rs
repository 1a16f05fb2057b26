//! `pairwise`: N−1 shifted rounds, rank r sends to r+k in round k (MPI's
//! pairwise exchange, NCCL's send/receive order). Each rank starts round k
//! once every block it receives in rounds before k has arrived, as a
//! blocking `sendrecv` whose send is buffered (NCCL's and MSCCL's: a send
//! is done once its data is handed to the connection's FIFO) would. The
//! receiver's progress and the arrival of a rank's own earlier sends are
//! not waited for: no executor can hold those (docs/algorithms.md).

use super::direct::block_transfer;
use crate::plan::{Deps, Plan};
use crate::topology::Topology;
use crate::traffic::{Layout, TrafficMatrix};

pub fn pairwise(topo: &Topology, traffic: &TrafficMatrix) -> Plan {
    let n = traffic.ranks();
    let layout = Layout::new(traffic);
    let mut plan = Plan::new("pairwise", n, topo.gpus_per_node());
    // Every transfer each rank has received so far, in round order (empty
    // blocks are skipped). A round's sends wait for all of them: the plan
    // has no "round done" event, and the last receive alone would let a
    // rank whose earlier block is late run its rounds out of order.
    let mut received: Vec<Vec<u32>> = vec![Vec::new(); n];
    let mut arrived: Vec<(usize, u32)> = Vec::with_capacity(n);
    for k in 0..n {
        for s in 0..n {
            let d = (s + k) % n;
            let bytes = traffic.get(s, d);
            if bytes == 0 {
                continue;
            }
            let deps: Deps = received[s].iter().copied().collect();
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
    fn rounds_wait_for_every_earlier_receive() {
        let topo = Topology::preset("dgx-h100", 2, Some(2)).unwrap();
        let mut m = TrafficMatrix::uniform(4, 10);
        m.set(1, 2, 0);
        let p = pairwise(&topo, &m);
        assert_eq!(p.steps(), 4);
        assert_eq!(p.transfers.len(), 15);
        verify_on(&p, &m, &topo).unwrap();
        let find = |s: u32, d: u32| {
            p.transfers
                .iter()
                .position(|t| t.src == s && t.dst == d)
                .unwrap() as u32
        };
        // Round 1 of rank 0 (0 -> 1) waits for its own round-0 copy only:
        // not for its receiver's round 0.
        let t = &p.transfers[find(0, 1) as usize];
        assert_eq!(t.step, 1);
        assert_eq!(t.deps.as_slice(), &[find(0, 0)]);
        // Round 3 of rank 2 (2 -> 1) waits for what 2 received in rounds
        // 0 and 2 (2 -> 2, 0 -> 2); round 1's block (1 -> 2) is empty.
        let t = &p.transfers[find(2, 1) as usize];
        assert_eq!(t.step, 3);
        let mut deps = t.deps.to_vec();
        deps.sort_unstable();
        assert_eq!(deps, vec![find(2, 2), find(0, 2)]);
    }
}
