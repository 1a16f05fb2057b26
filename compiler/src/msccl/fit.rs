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
use crate::lp;
use crate::plan::Plan;
use crate::sched::Algorithm;
use crate::topology::Topology;
use crate::traffic::TrafficMatrix;

use super::{MAX_NODES, MAX_PEER_TBS_PER_CHANNEL};

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

    /// The connections a rail-aligned `lp` plan
    /// ([`crate::lp::LpOptions::rail_aligned`]) can use at most: every
    /// pair of a node, and every pair on the same rail (NIC index) of two
    /// nodes, whatever the flow; a local copy where the matrix has one.
    pub fn lp_rail_aligned(topo: &Topology, traffic: &TrafficMatrix) -> Peers {
        let n = traffic.ranks();
        let conns = (0..n)
            .flat_map(|s| {
                (0..n)
                    .filter(move |&d| {
                        d != s
                            && (topo.node_of(s) == topo.node_of(d)
                                || topo.rail_of(s) == topo.rail_of(d))
                    })
                    .map(move |d| (s, d))
            })
            .collect();
        Peers {
            conns,
            local: (0..n).map(|s| traffic.get(s, s) > 0).collect(),
        }
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

/// The least a file of these peers needs that no chunk size changes,
/// against `executor`'s limits: `None` when it fits, else why not (the
/// first limit it misses, in the order threadblocks, channels, elements).
fn unmet(peers: &Peers, executor: Executor) -> Option<Unmet> {
    let n = peers.local.len();
    let need = peers.tbs_needed();
    let (g, &t) = need
        .iter()
        .enumerate()
        .max_by_key(|&(g, &t)| (t, std::cmp::Reverse(g)))?;
    if t > executor.max_tbs_per_gpu() {
        return Some(Unmet::Tbs { gpu: g, tbs: t });
    }
    // Channel groups: one channel each at least, whatever the chunk.
    let cg = ChannelGroups::new(n, peers.conns.iter().copied());
    if cg.groups > executor.max_channels() {
        let mut used = vec![false; n];
        for &(s, d) in &peers.conns {
            used[(d + n - s) % n] = true;
        }
        return Some(Unmet::Channels {
            distances: used.iter().filter(|&&u| u).count(),
            groups: cg.groups,
        });
    }
    // Elements of one gpu's parse: the `<algo>`, every `<gpu>`, its tbs,
    // and at least one step per connection it sends or receives on (and
    // one for its local copies), however large the chunks.
    let mut steps: Vec<usize> = peers.local.iter().map(|&l| usize::from(l)).collect();
    for &(s, d) in &peers.conns {
        steps[s] += 1;
        steps[d] += 1;
    }
    let (g, elements) = (0..n)
        .map(|g| (g, 1 + n + need[g] + steps[g]))
        .max_by_key(|&(g, e)| (e, std::cmp::Reverse(g)))?;
    (elements > MAX_NODES).then_some(Unmet::Elements { gpu: g, elements })
}

/// A limit no chunk size meets.
enum Unmet {
    Tbs { gpu: usize, tbs: usize },
    Channels { distances: usize, groups: u32 },
    Elements { gpu: usize, elements: usize },
}

/// The algorithms whose plan's file fits `executor` on this cluster by
/// their peer model, in `Algorithm::ALL`'s order.
pub fn fitting(topo: &Topology, traffic: &TrafficMatrix, executor: Executor) -> Vec<Algorithm> {
    Algorithm::ALL
        .iter()
        .copied()
        .filter(|&a| Peers::model(a, topo, traffic).is_some_and(|p| unmet(&p, executor).is_none()))
        .collect()
}

/// Refuses `peers` (of `alg`'s plan, or its model) when its file would
/// miss a limit of `executor` that no chunk size changes (threadblocks
/// for its peers, channel groups for its ring distances, the parse's
/// elements), naming the limit and what fits this cluster instead.
pub fn check(
    peers: &Peers,
    alg: &str,
    topo: &Topology,
    traffic: &TrafficMatrix,
    executor: Executor,
) -> Result<()> {
    let Some(why) = unmet(peers, executor) else {
        return Ok(());
    };
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
        .filter(|&&e| e != executor && unmet(peers, e).is_none())
        .map(|e| format!("--executor {e} loads it"))
        .collect();
    let other = if others.is_empty() {
        String::new()
    } else {
        format!("; {}", others.join(", "))
    };
    let n = traffic.ranks();
    let what = match why {
        Unmet::Tbs { gpu: g, tbs: t } => {
            let out = peers.conns.iter().filter(|c| c.0 == g).count();
            let inn = peers.conns.iter().filter(|c| c.1 == g).count();
            format!(
                "rank {g} sends to {out} peers and receives from {inn}, so its file needs at least {t} threadblocks \
                 (a threadblock has one send and one receive peer, a channel 32 of each); \
                 {executor} loads at most {} per GPU",
                executor.max_tbs_per_gpu()
            )
        }
        Unmet::Channels { distances, groups } => format!(
            "its connections span {distances} ring distances, so its file needs at least {groups} channels \
             (a channel holds 32 send and 32 receive peers of a GPU, one per distance); \
             {executor} has {} (at most {} distances)",
            executor.max_channels(),
            executor.max_channels() as usize * MAX_PEER_TBS_PER_CHANNEL
        ),
        Unmet::Elements { gpu: g, elements } => format!(
            "rank {g}'s part of the file holds at least {elements} elements \
             (the <algo>, {n} <gpu>, its threadblocks and a step per connection); \
             the executor parses at most {MAX_NODES}"
        ),
    };
    Err(refused(format!(
        "`{alg}` on {n} ranks: {what}. Fits this cluster with {executor}: {here}{other}"
    )))
}

/// Refuses, before planning, an algorithm whose plan cannot fit
/// `executor` on this cluster by its peer model (`auto` is not refused
/// here: it picks among those that fit; `lp` is refused where even its
/// rail-aligned routes cannot fit, [`lp_rail_aligned`]).
pub fn check_before_planning(
    alg: Algorithm,
    topo: &Topology,
    traffic: &TrafficMatrix,
    executor: Executor,
) -> Result<()> {
    if alg == Algorithm::Lp {
        return lp_rail_aligned(topo, traffic, executor).map(|_| ());
    }
    match Peers::model(alg, topo, traffic) {
        Some(p) => check(&p, alg.name(), topo, traffic, executor),
        None => Ok(()),
    }
}

/// Whether `lp`'s plan for a file of `executor` must route every
/// inter-node hop rail to rail, decided before its solve from the
/// cluster alone. Its routes may relay through any GPU, so a plan with
/// any routes may talk to every other GPU: where that fits, `false` (any
/// route; the plan's own peers are checked once it has planned). Else, on
/// a hierarchical cluster of several nodes, `true` when the rail-aligned
/// peers ([`Peers::lp_rail_aligned`]) fit, and refused at once when even
/// they do not (naming the limit and what fits). A `links` topology has
/// no rails: `false`, checked after planning as before.
/// [`lp_rail_aligned_for_lanes`] also routes rail to rail where lanes
/// are short (plans for the ideal network).
pub fn lp_rail_aligned(
    topo: &Topology,
    traffic: &TrafficMatrix,
    executor: Executor,
) -> Result<bool> {
    lp_rail_aligned_with(topo, traffic, executor, false)
}

/// [`lp_rail_aligned`], and also `true` on clusters of at most
/// [`super::chunk::MAX_RANKS_PRICED`] ranks where every peer fits but one
/// lane per connection and a relay's two pass the lanes a plan may run
/// at once ([`leaves_lanes`]: 7 x 8 and 8 x 8 with `msccl`, 4 x 8 to 8 x 8 with
/// `rccl`). For plans priced on the ideal network (`compile --network
/// ideal`): there the files of the 8 x 8 sweep are within 3% of their
/// plans and 1.3-9.0% faster rail to rail, but rail to rail relays most
/// inter-node blocks in slices, 3.7-9.9 times the messages, which a
/// per-message cost (the calibrated network) prices 26-107% slower
/// (docs/benchmarks.md, issue 22 item 2, 2026-12-05).
pub fn lp_rail_aligned_for_lanes(
    topo: &Topology,
    traffic: &TrafficMatrix,
    executor: Executor,
) -> Result<bool> {
    lp_rail_aligned_with(topo, traffic, executor, true)
}

fn lp_rail_aligned_with(
    topo: &Topology,
    traffic: &TrafficMatrix,
    executor: Executor,
    lanes: bool,
) -> Result<bool> {
    let n = traffic.ranks();
    let any = Peers {
        conns: (0..n)
            .flat_map(|s| (0..n).filter(move |&d| d != s).map(move |d| (s, d)))
            .collect(),
        local: (0..n).map(|s| traffic.get(s, s) > 0).collect(),
    };
    let lanes_fit = !lanes || n > super::chunk::MAX_RANKS_PRICED || leaves_lanes(&any, executor);
    if unmet(&any, executor).is_none() && lanes_fit || !topo.is_hierarchical() || topo.nodes() < 2 {
        return Ok(false);
    }
    // The LP's size first: where it is too large for any profile, the
    // peers' refusal would offer the other profile, which refuses it too.
    let vars = lp::model_variables(topo, traffic, lp::Formulation::Rails);
    if vars > MAX_LP_VARIABLES {
        let fits: Vec<&str> = fitting(topo, traffic, executor)
            .iter()
            .map(|a| a.name())
            .collect();
        return Err(refused(format!(
            "`lp` on {n} ranks: its rail-aligned flow LP has {vars} variables, more than the {MAX_LP_VARIABLES} \
             it solves in seconds (16 x 8: 98049 variables, 7 s; 24 x 8: 220801, 45 s; 32 x 8: 392705, \
             not within 60 s; docs/algorithms-lp.md). Fits this cluster with {executor}: {}",
            if fits.is_empty() {
                "none".to_string()
            } else {
                fits.join(", ")
            }
        )));
    }
    let rails = Peers::lp_rail_aligned(topo, traffic);
    check(&rails, "lp (routed rail to rail)", topo, traffic, executor)?;
    Ok(true)
}

/// Whether one lane per connection of `peers`, and the two lanes of one
/// relay, fit the lanes a plan for `executor` may run at once on every
/// gpu ([`Executor::plan_lanes_per_gpu`], the cap `lp` sizes its lanes
/// to; local copies take none, as there). The lowering gives every
/// connection one send and one receive tb (and local copies one) before
/// any second lane, and second lanes only while both gpus stay within
/// [`Executor::tb_budget`] (docs/msccl.md, "Lowering" step 2). Past that,
/// the lanes a plan runs side by side on one connection run one after
/// another in its file: an `lp` plan with any routes on 8 x 8 (126 tbs
/// for one lane each, budget 108) had 155 lanes short, its relays'
/// forwards queued on one tb behind late arrivals, and its Zipf and
/// log-normal files were 3-4% behind their plans (docs/benchmarks.md,
/// issue 22 item 2, 2026-12-05). A relay through a gpu takes a receive
/// and a send lane there beside its own connections: where the cap holds
/// one lane per connection but not a relay's two (RCCL at 4 x 8: 62
/// connections, cap 62), `lp`'s lanes cannot be held to it
/// (`sched::lp`'s capped lanes exceed it whatever their size) and its
/// relays ran one after another: 4 x 8 hotspot 4.7% behind its plan
/// (docs/benchmarks.md, issue 22 items 2 and 3, 2026-12-05).
pub fn leaves_lanes(peers: &Peers, executor: Executor) -> bool {
    let mut lanes = vec![0usize; peers.local.len()];
    for &(s, d) in &peers.conns {
        lanes[s] += 1;
        lanes[d] += 1;
    }
    let cap = executor.plan_lanes_per_gpu() as usize;
    lanes.into_iter().all(|l| l + 2 <= cap)
}

/// The largest rail-aligned flow LP [`lp_rail_aligned`] lets `lp` solve
/// for a file, in variables (sources x arcs): above it the solve takes
/// minutes, not seconds (docs/algorithms-lp.md, "Scale").
pub const MAX_LP_VARIABLES: usize = 150_000;

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

    #[test]
    fn lp_rail_aligned_peers_are_the_node_and_the_rail() {
        use crate::topology::TopologySpec;
        // 3 nodes of 4 GPUs, 2 NICs: GPUs 0 and 2 of a node share rail 0.
        let spec = TopologySpec::preset_shape("dgx-h100", 3, Some(4), Some(2)).unwrap();
        let topo = Topology::from_spec(spec, "t").unwrap();
        let mut m = TrafficMatrix::uniform(12, 1);
        m.set(5, 5, 0);
        let p = Peers::lp_rail_aligned(&topo, &m);
        let of =
            |s: usize| -> Vec<usize> { p.conns.iter().filter(|c| c.0 == s).map(|c| c.1).collect() };
        // Its node (1, 2, 3), then rail 0 on nodes 1 and 2 (4, 6, 8, 10).
        assert_eq!(of(0), vec![1, 2, 3, 4, 6, 8, 10]);
        assert_eq!(of(5), vec![1, 3, 4, 6, 7, 9, 11]);
        assert!(p.local[0] && !p.local[5]);
        // Both directions: a receive peer for every send peer.
        assert!(p.conns.iter().all(|&(s, d)| p.conns.contains(&(d, s))));
    }

    #[test]
    fn lp_routes_rail_to_rail_where_one_lane_per_peer_passes_the_tb_budget() {
        // Plans for the ideal network (`lp_rail_aligned_for_lanes`). Any
        // route: 2 (n - 1) tbs for one lane per connection, and one for
        // the local copies. NCCL-MSCCL's loader takes 8 x 8's 127
        // (packed: 63), but the lowering's budget is 108, so 7 x 8 (111)
        // and 8 x 8 route rail to rail (29 tbs); RCCL's budget is 64 (its
        // plans' lanes 62), so from 4 x 8 (62 lanes, no room for a
        // relay's two) on. Above 64 ranks unchanged: any route where
        // every peer fits the loader (16 x 8 with NCCL-MSCCL).
        for (nodes, msccl, rccl) in [
            (2, false, false),
            (4, false, true),
            (5, false, true),
            (6, false, true),
            (7, true, true),
            (8, true, true),
            (16, false, true),
        ] {
            let topo = Topology::preset("dgx-h100", nodes, None).unwrap();
            let m = TrafficMatrix::uniform(topo.ranks(), 4096);
            assert_eq!(
                lp_rail_aligned_for_lanes(&topo, &m, Executor::Msccl).unwrap(),
                msccl,
                "{nodes} x 8 msccl"
            );
            assert_eq!(
                lp_rail_aligned_for_lanes(&topo, &m, Executor::Rccl).unwrap(),
                rccl,
                "{nodes} x 8 rccl"
            );
            // Without the lanes (a per-message cost): only where a peer
            // each cannot fit, as before (16 x 8 with `rccl`).
            assert_eq!(
                lp_rail_aligned(&topo, &m, Executor::Msccl).unwrap()
                    || lp_rail_aligned(&topo, &m, Executor::Rccl).unwrap(),
                nodes == 16,
                "{nodes} x 8"
            );
        }
        // No local copy: 8 x 8 any route takes 126, still over 108.
        let topo = Topology::preset("dgx-h100", 8, None).unwrap();
        let mut m = TrafficMatrix::uniform(64, 4096);
        for g in 0..64 {
            m.set(g, g, 0);
        }
        assert!(lp_rail_aligned_for_lanes(&topo, &m, Executor::Msccl).unwrap());
        // The threshold: 53 ranks (104 lanes, and a relay's 2) fit
        // NCCL-MSCCL's 106 plan lanes and 54 (106) do not; RCCL's 62: 31
        // ranks (60) and 32 (62).
        let any = |n: usize| Peers {
            conns: (0..n)
                .flat_map(|s| (0..n).filter(move |&d| d != s).map(move |d| (s, d)))
                .collect(),
            local: vec![false; n],
        };
        assert!(leaves_lanes(&any(53), Executor::Msccl));
        assert!(!leaves_lanes(&any(54), Executor::Msccl));
        assert!(leaves_lanes(&any(31), Executor::Rccl));
        assert!(!leaves_lanes(&any(32), Executor::Rccl));
    }

    /// Rank `s` sends to the rank `s + 1` further on: one peer each way
    /// per gpu, but as many ring distances as ranks.
    fn every_distance_once(n: usize) -> Peers {
        Peers {
            conns: (0..n - 1).map(|s| (s, (2 * s + 1) % n)).collect(),
            local: vec![false; n],
        }
    }

    #[test]
    fn channels_no_chunk_size_can_give_are_refused_by_the_peers_alone() {
        // 1100 ranks, a few peers per gpu, 1099 distances: 35 channel
        // groups, more than NCCL-MSCCL's 32 channels; RCCL has 128.
        let p = every_distance_once(1100);
        assert!(p.tbs_needed().iter().all(|&t| t <= 4));
        match unmet(&p, Executor::Msccl) {
            Some(Unmet::Channels { distances, groups }) => {
                assert_eq!((distances, groups), (1099, 35));
            }
            _ => panic!("channels should be refused"),
        }
        assert!(unmet(&p, Executor::Rccl).is_none());
        // Within 32 groups it fits.
        assert!(unmet(&every_distance_once(1000), Executor::Msccl).is_none());
    }

    #[test]
    fn a_parse_too_large_for_one_step_per_connection_is_refused() {
        // 4000 ranks: the `<algo>` and 4000 `<gpu>` elements leave 95 for
        // rank 0's tbs and steps; 60 send peers take 60 tbs and 60 steps.
        let n = 4000;
        let mut p = Peers {
            conns: (1..=60).map(|d| (0, d)).collect(),
            local: vec![false; n],
        };
        match unmet(&p, Executor::Msccl) {
            Some(Unmet::Elements { gpu, elements }) => {
                assert_eq!((gpu, elements), (0, 1 + n + 60 + 60));
            }
            _ => panic!("the parse budget should be refused"),
        }
        // 40 peers: 4081 elements.
        p.conns.truncate(40);
        assert!(unmet(&p, Executor::Msccl).is_none());
    }
}
