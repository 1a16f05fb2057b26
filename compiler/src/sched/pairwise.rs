//! `pairwise`: N−1 shifted rounds, rank r sends to r+k in round k (MPI's
//! pairwise exchange). Each rank starts round k only when its round k−1 send
//! and receive are both done, as a blocking sendrecv would.
//!
//! [`pairwise_held`] is the same exchange with only the waits an MSCCL
//! executor can hold, for plans that become MSCCL XML; [`pairwise_msccl`]
//! also sends the longest blocks as parallel flows where the plan's
//! simulator prices that sooner (the lanes an MSCCL file spreads them over).

use smallvec::smallvec;

use super::direct::block_transfer;
use crate::error::Result;
use crate::plan::{Deps, Plan};
use crate::sim::{simulate, Network, SimOptions};
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
    held_split(topo, traffic, 0)
}

/// The piece sizes [`pairwise_msccl`] tries, as divisors of the largest
/// block: a block longer than `max / k` goes as `ceil(bytes / (max / k))`
/// parallel flows (so at most `k`). Eighths were tried too and left out:
/// their plans price sooner where the files cannot follow (2x8 Zipf 1.2:
/// the plan 5.6% sooner, its file 10.1% behind it; docs/benchmarks.md,
/// "`pairwise`'s long blocks as parallel flows").
const SPLITS: [u64; 2] = [2, 4];

/// How much sooner a split plan must finish than the one-flow plan to be
/// taken: the 3% within which an MSCCL file is held to its plan. Smaller
/// gains (2x8 hotspot 0.3: 2.2% with halves) sit inside the spread of the
/// executor's price over neighbouring chunks and moved that file 3.6%
/// ahead of its plan.
const SPLIT_GAIN: f64 = 0.03;

/// `pairwise` for MSCCL XML (`sched::Target::Msccl`): [`pairwise_held`],
/// or the same exchange with every block longer than a half or a quarter
/// of the largest sent as parallel flows, the one the plan's simulator (in
/// `network`'s mode) prices soonest where that beats the one-flow plan by
/// 3% (`SPLIT_GAIN`). The lowering spreads a block longer than a connection's
/// FIFO window over lanes of its own, each a flow with its own share of the
/// links (`msccl::spread`), so a file of the one-flow plan ran up to 7%
/// ahead of it (4x8 log-normal padded); the split plan prices the flows the
/// file runs, and where they make the plan sooner the file is sooner too.
/// A split plan must also fit `lanes_per_gpu` (`sched::Options::
/// max_lanes_per_gpu`, the lanes a file can run at once on a gpu): each
/// flow between gpus is a lane of its own on both of its gpus, and where
/// the file has no lane for a flow it serialises it behind another (8x8
/// intra-skew, seed 15: a plan 8.7% sooner whose file ran 6.9% behind it;
/// every gpu there already has 126 connections for 106 lanes). Above
/// `msccl::chunk::MAX_RANKS_PRICED` ranks, where no file is priced either,
/// the one-flow plan without a simulation.
pub fn pairwise_msccl(
    topo: &Topology,
    traffic: &TrafficMatrix,
    network: Network,
    lanes_per_gpu: Option<u32>,
) -> Result<Plan> {
    let one = pairwise_held(topo, traffic);
    if traffic.ranks() > crate::msccl::chunk::MAX_RANKS_PRICED {
        return Ok(one);
    }
    let sim = SimOptions::new(network);
    let mut best_us = simulate(topo, &one, &sim)?.completion_us * (1.0 - SPLIT_GAIN);
    let mut best = one;
    for k in SPLITS {
        let piece = traffic.max_entry() / k;
        let plan = held_split(topo, traffic, piece);
        if plan.transfers.len() == best.transfers.len() || !fits(&plan, lanes_per_gpu) {
            continue;
        }
        let us = simulate(topo, &plan, &sim)?.completion_us;
        if us < best_us {
            (best, best_us) = (plan, us);
        }
    }
    Ok(best)
}

/// Whether every gpu of `plan` has at most `lanes` flows to and from other
/// gpus (in `pairwise` each connection carries one block, so each flow is
/// a lane the file needs at once). `None`: no limit.
fn fits(plan: &Plan, lanes: Option<u32>) -> bool {
    let Some(lanes) = lanes else { return true };
    let mut per = vec![0u32; plan.ranks as usize];
    for t in plan.transfers.iter().filter(|t| t.src != t.dst) {
        per[t.src as usize] += 1;
        per[t.dst as usize] += 1;
    }
    per.into_iter().all(|l| l <= lanes)
}

/// [`pairwise_held`] with every block between gpus longer than `piece`
/// bytes (`0`: none) sent as `ceil(bytes / piece)` parallel flows of about
/// equal size (cut at 16-byte boundaries), all started by the same waits;
/// a later round waits for every flow of a block it waits for.
fn held_split(topo: &Topology, traffic: &TrafficMatrix, piece: u64) -> Plan {
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
            let block = block_transfer(topo, &layout, traffic, s, d, k as u32, deps);
            let flows = if s != d && piece > 0 && bytes > piece {
                bytes.div_ceil(piece)
            } else {
                1
            };
            let mut done = 0;
            for f in 1..=flows {
                let end = if f == flows {
                    bytes
                } else {
                    bytes * f / flows / 16 * 16
                };
                // Pieces under 16 bytes join the next.
                if end == done {
                    continue;
                }
                let mut t = block.clone();
                t.src_off += done;
                t.dst_off += done;
                t.bytes = end - done;
                done = end;
                arrived.push((d, plan.push(t)));
            }
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

    #[test]
    fn split_blocks_are_parallel_flows_a_later_round_waits_for() {
        let topo = Topology::preset("dgx-h100", 2, Some(2)).unwrap();
        let mut m = TrafficMatrix::uniform(4, 100);
        m.set(0, 2, 1000);
        let p = held_split(&topo, &m, 300);
        verify_on(&p, &m, &topo).unwrap();
        // 0 -> 2 goes as 4 flows (ceil(1000 / 300)), cut at 16 bytes, in
        // order over the block, all started by the same waits.
        let flows: Vec<u32> = (0..p.transfers.len() as u32)
            .filter(|&i| p.transfers[i as usize].src == 0 && p.transfers[i as usize].dst == 2)
            .collect();
        let sizes: Vec<u64> = flows
            .iter()
            .map(|&i| p.transfers[i as usize].bytes)
            .collect();
        assert_eq!(sizes, vec![240, 256, 240, 264]);
        let first = &p.transfers[flows[0] as usize];
        let mut off = first.src_off;
        for &i in &flows {
            let t = &p.transfers[i as usize];
            assert_eq!((t.src_off, t.step, &t.deps), (off, first.step, &first.deps));
            off += t.bytes;
        }
        // A block of at most `piece` bytes stays one flow: 15 + 3 transfers.
        assert_eq!(p.transfers.len(), 19);
        // Pieces shorter than 16 bytes are not written: 30 bytes in pieces
        // of 7 are 5 flows by count, but cut at 16 bytes only 16 + 14.
        m.set(0, 2, 30);
        let small = held_split(&topo, &m, 7);
        verify_on(&small, &m, &topo).unwrap();
        let sizes: Vec<u64> = small
            .transfers
            .iter()
            .filter(|t| (t.src, t.dst) == (0, 2))
            .map(|t| t.bytes)
            .collect();
        assert_eq!(sizes, vec![16, 14]);
        // Rank 2's next round (2 -> 1, round 3) waits for every flow.
        let t = p
            .transfers
            .iter()
            .find(|t| t.src == 2 && t.dst == 1)
            .unwrap();
        assert!(flows.iter().all(|f| t.deps.contains(f)), "{:?}", t.deps);
    }

    /// The sweep's 4x8 log-normal matrix (docs/benchmarks.md): its long
    /// blocks as parallel flows price more than 3% sooner, and the MSCCL
    /// plan takes them, unless the gpus have no lanes to spare; on its MoE
    /// matrix no split gains 3% and the plan is the one-flow plan (the
    /// test can fail either way).
    #[test]
    fn msccl_plan_splits_where_the_plan_is_sooner() {
        use crate::generate::{generate, Pattern, TrafficSpec};
        let topo = Topology::preset("dgx-h100", 4, None).unwrap();
        let sim = SimOptions::default();
        for (seed, pattern, splits) in
            [(3, Pattern::Lognormal(1.0), true), (1, Pattern::Moe, false)]
        {
            let mut spec = TrafficSpec::new(topo.ranks(), pattern);
            spec.seed = seed;
            spec.bytes = 256 << 10;
            spec.moe.tokens_per_rank = 512;
            let m = generate(&spec).unwrap();
            let one = pairwise_held(&topo, &m);
            let p = pairwise_msccl(&topo, &m, Network::Ideal, Some(106)).unwrap();
            verify_on(&p, &m, &topo).unwrap();
            let (a, b) = (
                simulate(&topo, &one, &sim).unwrap().completion_us,
                simulate(&topo, &p, &sim).unwrap().completion_us,
            );
            if splits {
                assert!(p.transfers.len() > one.transfers.len());
                assert!(
                    b < a * (1.0 - SPLIT_GAIN),
                    "{pattern:?}: {b:.1} against {a:.1} us"
                );
                // No lane to spare on a gpu (62: its 31 peers both ways):
                // no split.
                let tight = pairwise_msccl(&topo, &m, Network::Ideal, Some(62)).unwrap();
                assert_eq!(tight, one);
            } else {
                assert_eq!(p, one, "{pattern:?}");
            }
        }
    }
}
