//! Whether a plan's file can fit an executor's threadblock limit, from the
//! peers each gpu talks to, before any lowering (and, for the schedulers
//! whose peers follow from the topology, before planning).
//!
//! The executor's rules (NCCL-MSCCL `src/include/msccl/msccl_struct.h`,
//! `src/misc/msccl/msccl_parser.cc`): a threadblock has one send peer and
//! one receive peer; a channel holds at most 32 tbs with a send peer and 32
//! with a receive peer per gpu (`MSCCL_MAX_NUM_THREAD_BLOCKS_PER_CHANNEL`,
//! "too many sends per channel"); a gpu loads at most its profile's tbs
//! ([`Executor::max_tbs_per_gpu`]). Connections go on channels by their
//! ring distance (`ChannelGroups`), so a gpu needs, per channel group,
//! as many tbs as it has send or receive peers there, whichever is more,
//! plus one for its local copies: the least any file of the plan can use
//! (`msccl::pack` packs down to it where the step limits allow).

use super::Executor;
use crate::error::{Error, Result};
use crate::plan::Plan;
use crate::sched::Algorithm;
use crate::topology::Topology;
use crate::traffic::TrafficMatrix;

use super::MAX_PEER_TBS_PER_CHANNEL;

/// Channel groups: the ring distances `(dst - src) mod n` the connections
/// use, numbered in order, 32 to a group, so no gpu has more than 32 send
/// (or receive) peers in one group: its peers at distinct distances are
/// distinct. Where every distance is used (`direct`) this is groups of 32
/// consecutive distances; a rail-optimized plan's few distances fill few
/// groups, which leaves channels for lanes. Up to 33 ranks: one group.
pub(crate) struct ChannelGroups {
    pub groups: u32,
    n: usize,
    group_of_dist: Vec<u32>,
}

impl ChannelGroups {
    pub fn new(n: usize, conns: impl Iterator<Item = (usize, usize)>) -> Self {
        let mut used = vec![false; n.max(1)];
        for (s, d) in conns {
            used[(d + n - s) % n] = true;
        }
        let mut group_of_dist = vec![0u32; n.max(1)];
        let mut k = 0usize;
        for (dist, &u) in used.iter().enumerate().skip(1) {
            if u {
                group_of_dist[dist] = (k / MAX_PEER_TBS_PER_CHANNEL) as u32;
                k += 1;
            }
        }
        ChannelGroups {
            groups: k.div_ceil(MAX_PEER_TBS_PER_CHANNEL).max(1) as u32,
            n,
            group_of_dist,
        }
    }

    /// The group (first channel) of connection `src -> dst`.
    pub fn of(&self, src: usize, dst: usize) -> u32 {
        self.group_of_dist[(dst + self.n - src) % self.n]
    }
}

/// Who each gpu sends to and receives from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peers {
    /// Connections `(src, dst)`, `src != dst`, each once.
    pub conns: Vec<(usize, usize)>,
    /// Whether each gpu copies locally.
    pub local: Vec<bool>,
}

impl Peers {
    /// The connections a plan's transfers use.
    pub fn of_plan(plan: &Plan) -> Peers {
        let n = plan.ranks as usize;
        let mut local = vec![false; n];
        let mut conns: Vec<(usize, usize)> = Vec::new();
        for t in &plan.transfers {
            let (s, d) = (t.src as usize, t.dst as usize);
            if s == d {
                local[s] = true;
            } else {
                conns.push((s, d));
            }
        }
        conns.sort_unstable();
        conns.dedup();
        Peers { conns, local }
    }

    /// The connections `alg`'s plan uses at most, from the topology and
    /// the matrix alone (no planning): `direct` and `pairwise` every pair
    /// with data; the rail-aligned schedulers (`hierarchical`, `fast`,
    /// `spray`, `pxn`, `deepep`) the gpus of a node and each gpu's rail
    /// peer (same local index) on every other node. `None` for `lp`
    /// (routes are the solver's) and `auto` (it picks one of the others).
    pub fn model(alg: Algorithm, topo: &Topology, traffic: &TrafficMatrix) -> Option<Peers> {
        let n = traffic.ranks();
        let rail_aligned = matches!(
            alg,
            Algorithm::Hierarchical
                | Algorithm::Fast
                | Algorithm::Spray
                | Algorithm::Pxn
                | Algorithm::Deepep
        ) && topo.is_hierarchical()
            && topo.nodes() > 1;
        let mut conns = Vec::new();
        let mut local = vec![false; n];
        match alg {
            Algorithm::Lp | Algorithm::Auto => return None,
            _ if rail_aligned => {
                let g = topo.gpus_per_node();
                local.fill(true);
                for s in 0..n {
                    let (node, j) = (s / g, s % g);
                    conns.extend((0..g).filter(|&k| k != j).map(|k| (s, node * g + k)));
                    conns.extend(
                        (0..topo.nodes())
                            .filter(|&b| b != node)
                            .map(|b| (s, b * g + j)),
                    );
                }
            }
            _ => {
                for (s, l) in local.iter_mut().enumerate() {
                    *l = traffic.get(s, s) > 0;
                    conns.extend(
                        (0..n)
                            .filter(|&d| d != s && traffic.get(s, d) > 0)
                            .map(|d| (s, d)),
                    );
                }
            }
        }
        Some(Peers { conns, local })
    }

    /// Threadblocks each gpu needs at least: per channel group, its send
    /// or receive peers there, whichever are more (local copies can join
    /// a peer tb; a gpu with no peer needs one tb for them).
    pub fn tbs_needed(&self) -> Vec<usize> {
        let n = self.local.len();
        let cg = ChannelGroups::new(n, self.conns.iter().copied());
        let groups = cg.groups as usize;
        let mut sends = vec![0usize; n * groups];
        let mut recvs = vec![0usize; n * groups];
        for &(s, d) in &self.conns {
            let c = cg.of(s, d) as usize;
            sends[s * groups + c] += 1;
            recvs[d * groups + c] += 1;
        }
        (0..n)
            .map(|g| {
                (0..groups)
                    .map(|c| sends[g * groups + c].max(recvs[g * groups + c]))
                    .sum::<usize>()
                    .max(usize::from(self.local[g]))
            })
            .collect()
    }
}

fn refused(reason: String) -> Error {
    Error::Unsupported {
        algorithm: "msccl-xml".into(),
        reason,
    }
}

/// The algorithms whose plan's file fits `executor` on this cluster by
/// their peer model, in `Algorithm::ALL`'s order.
pub fn fitting(topo: &Topology, traffic: &TrafficMatrix, executor: Executor) -> Vec<Algorithm> {
    Algorithm::ALL
        .iter()
        .copied()
        .filter(|&a| {
            Peers::model(a, topo, traffic).is_some_and(|p| {
                p.tbs_needed().into_iter().max().unwrap_or(0) <= executor.max_tbs_per_gpu()
            })
        })
        .collect()
}

/// Refuses `peers` (of `alg`'s plan, or its model) when some gpu needs
/// more threadblocks than `executor` loads, naming the limit and what
/// fits this cluster instead.
pub fn check(
    peers: &Peers,
    alg: &str,
    topo: &Topology,
    traffic: &TrafficMatrix,
    executor: Executor,
) -> Result<()> {
    let need = peers.tbs_needed();
    let max = executor.max_tbs_per_gpu();
    let Some((g, &t)) = need
        .iter()
        .enumerate()
        .max_by_key(|&(g, &t)| (t, std::cmp::Reverse(g)))
    else {
        return Ok(());
    };
    if t <= max {
        return Ok(());
    }
    let out = peers.conns.iter().filter(|c| c.0 == g).count();
    let inn = peers.conns.iter().filter(|c| c.1 == g).count();
    let names = |v: Vec<Algorithm>| -> String {
        if v.is_empty() {
            "none".into()
        } else {
            v.iter().map(|a| a.name()).collect::<Vec<_>>().join(", ")
        }
    };
    let here = names(fitting(topo, traffic, executor));
    let others: Vec<String> = Executor::ALL
        .iter()
        .filter(|&&e| e != executor && e.max_tbs_per_gpu() >= t)
        .map(|e| format!("--executor {e} loads it"))
        .collect();
    let other = if others.is_empty() {
        String::new()
    } else {
        format!("; {}", others.join(", "))
    };
    Err(refused(format!(
        "`{alg}` on {} ranks: rank {g} sends to {out} peers and receives from {inn}, so its file needs at least {t} threadblocks \
         (a threadblock has one send and one receive peer, a channel 32 of each); \
         {executor} loads at most {max} per GPU. Fits this cluster with {executor}: {here}{other}",
        traffic.ranks()
    )))
}

/// Refuses, before planning, an algorithm whose plan cannot fit
/// `executor` on this cluster by its peer model (`lp` and `auto` are not
/// refused here: `auto` picks among those that fit, `lp`'s peers are
/// checked once it has planned).
pub fn check_before_planning(
    alg: Algorithm,
    topo: &Topology,
    traffic: &TrafficMatrix,
    executor: Executor,
) -> Result<()> {
    match Peers::model(alg, topo, traffic) {
        Some(p) => check(&p, alg.name(), topo, traffic, executor),
        None => Ok(()),
    }
}

/// Refuses a plan whose gpus talk to more peers than `executor` has
/// threadblocks for, before it is simulated and lowered.
pub fn check_plan(
    plan: &Plan,
    topo: &Topology,
    traffic: &TrafficMatrix,
    executor: Executor,
) -> Result<()> {
    check(
        &Peers::of_plan(plan),
        &plan.algorithm,
        topo,
        traffic,
        executor,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channel_groups_hold_32_peers_a_direction() {
        // Every distance used: groups of 32 consecutive distances.
        let n = 100;
        let all = (0..n).flat_map(|s| (0..n).filter(move |&d| d != s).map(move |d| (s, d)));
        let cg = ChannelGroups::new(n, all);
        assert_eq!(cg.groups, 4);
        assert_eq!((cg.of(0, 32), cg.of(0, 33), cg.of(5, 4)), (0, 1, 3));
        // A rail pattern on 64 x 8: 14 intra distances and 63 rail ones.
        let topo = Topology::preset("dgx-h100", 64, None).unwrap();
        let m = TrafficMatrix::uniform(512, 1);
        let p = Peers::model(Algorithm::Fast, &topo, &m).unwrap();
        let cg = ChannelGroups::new(512, p.conns.iter().copied());
        assert_eq!(cg.groups, 3);
        let need = p.tbs_needed();
        // 70 peers each way; the groups cost a few more.
        assert!(need.iter().all(|&t| (71..=80).contains(&t)), "{need:?}");
    }
}
