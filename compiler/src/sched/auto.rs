//! `auto`: picks, for one traffic matrix on one topology, the scheduler
//! whose plan the cost model expects to finish first, and builds only that
//! plan.
//!
//! Simulating every candidate would cost milliseconds at 64 GPUs, so `auto`
//! estimates instead: it routes each candidate's traffic, aggregated to
//! (node, rail) pairs for the network and to GPU pairs inside a node, over
//! the topology's own paths, and prices the most loaded link as the
//! simulator would over the whole run (bytes / capacity, the capacity of a
//! NIC ingress cut by the congested mode's incast efficiency for the number
//! of NICs that send to it at once), plus what each candidate adds on top
//! of its busiest link: the NVLink hop a relay waits for before its network
//! hop, `fast`'s stage pipeline, path latencies; outside `ideal`, NIC
//! links at the calibrated goodput and each message's cost on its NIC's
//! egress. No path is walked per NIC pair: NIC links take row and column
//! sums, fabric links one path per (leaf or group, rail) pair. docs/algorithms.md
//! (`auto`) gives the equations and the measurements behind the constants.
//!
//! The estimates only rank: their error (up to ~25% either way on the
//! sweep) is larger than the gaps between the best candidates. When the
//! best few are within [`TIE_MARGIN`] of each other, their plans are built
//! and simulated ([`settle_and_build`]) and the fastest wins.
//!
//! Candidates: `direct`, `pxn`, `deepep`, `hierarchical`, `fast`, `spray`.
//! `pairwise` never wins in the cost model (its rounds only add latency to
//! what `direct` sends at once) and `lp` costs seconds, so neither is one.

use serde::{Deserialize, Serialize};

use super::fast::emit::{node_rate, NodeStages, PlannerOptions, MIN_DEPTH};
use super::fast::stages::{StageChains, StagePair};
use super::{deepep, direct, hierarchical, pxn, pxn_relay, spray, Algorithm};
use crate::error::Result;
use crate::plan::Plan;
use crate::sim::{simulate, CongestionModel, Network, SimOptions};
use crate::topology::{LinkClass, LinkId, Topology, Vertex};
use crate::traffic::TrafficMatrix;

/// The schedulers `auto` chooses from, in the order it lists them (on a tie
/// the first wins: the simpler plan).
pub const CANDIDATES: &[Algorithm] = &[
    Algorithm::Direct,
    Algorithm::Pxn,
    Algorithm::Deepep,
    Algorithm::Hierarchical,
    Algorithm::Spray,
    Algorithm::Fast,
];

/// One candidate's estimate.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Estimate {
    pub algorithm: String,
    /// Expected completion, microseconds.
    pub estimate_us: f64,
    /// The link (or term) that sets it, in words.
    pub limit: String,
}

/// Estimates within this factor of the best one are closer than the
/// estimates' measured error can separate (docs/algorithms.md, `auto`):
/// those candidates' plans are built and simulated, and the fastest wins.
pub const TIE_MARGIN: f64 = 1.2;
/// At most this many candidates are simulated to settle a tie.
pub const TIE_MAX: usize = 4;

/// A contender's plan, simulated to settle a tie.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Simulated {
    pub algorithm: String,
    /// Simulated completion in the choice's network mode, microseconds.
    pub completion_us: f64,
}

/// What `auto` chose and why: every candidate's estimate, best first, and
/// the simulated plans that settled a tie (none when the estimates decided).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct AutoChoice {
    pub chosen: String,
    pub network: Network,
    pub estimates: Vec<Estimate>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub simulated: Vec<Simulated>,
    /// Per batch ([`Sticky`]): the winner of a tie settled this many calls
    /// earlier, kept because this matrix's estimates cannot have flipped
    /// it (no simulation this call). `None` when this call's estimates or
    /// its own simulations decided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept_for: Option<u32>,
}

impl AutoChoice {
    /// The algorithm chosen.
    pub fn algorithm(&self) -> Algorithm {
        self.chosen.parse().unwrap_or(Algorithm::Direct)
    }

    /// This choice's estimate of `alg`, us (`None`: not estimated).
    pub fn estimate_of(&self, alg: Algorithm) -> Option<f64> {
        self.estimates
            .iter()
            .find(|e| e.algorithm == alg.name())
            .map(|e| e.estimate_us)
    }

    /// The candidates the estimates cannot separate: those within
    /// [`TIE_MARGIN`] of the best estimate, best first, at most
    /// [`TIE_MAX`]. One when the estimates decide alone.
    pub fn contenders(&self) -> Vec<Algorithm> {
        let best = self.estimates.first().map_or(0.0, |e| e.estimate_us);
        let mut out: Vec<Algorithm> = self
            .estimates
            .iter()
            .take(TIE_MAX)
            .take_while(|e| e.estimate_us <= best * TIE_MARGIN)
            .filter_map(|e| e.algorithm.parse().ok())
            .collect();
        if out.is_empty() {
            out.push(self.algorithm());
        }
        out
    }

    /// Settles a tie between the [`AutoChoice::contenders`]: `time(alg)`
    /// is that candidate's completion (its plan, simulated); the fastest
    /// becomes the choice (on equal times, the better estimate). Nothing
    /// is priced when the estimates decide alone.
    pub fn settle(&mut self, mut time: impl FnMut(Algorithm) -> Result<f64>) -> Result<()> {
        let contenders = self.contenders();
        if contenders.len() < 2 {
            return Ok(());
        }
        self.simulated.clear();
        for alg in contenders {
            let completion_us = time(alg)?;
            self.simulated.push(Simulated {
                algorithm: alg.name().into(),
                completion_us,
            });
        }
        if let Some(best) = self
            .simulated
            .iter()
            .min_by(|a, b| a.completion_us.total_cmp(&b.completion_us))
        {
            self.chosen = best.algorithm.clone();
        }
        Ok(())
    }
}

/// Chooses and plans: [`choose`]'s estimates, then, when they leave a tie,
/// each contender's plan from `build`, simulated in `network`'s mode (the
/// plan `auto` must build anyway is one of them). Returns the chosen plan.
pub fn settle_and_build(
    topo: &Topology,
    network: Network,
    choice: &mut AutoChoice,
    mut build: impl FnMut(Algorithm) -> Result<Plan>,
) -> Result<Plan> {
    let opts = SimOptions::new(network);
    let mut plans: Vec<(Algorithm, Plan)> = Vec::new();
    choice.settle(|alg| {
        let plan = build(alg)?;
        let t = simulate(topo, &plan, &opts)?.completion_us;
        plans.push((alg, plan));
        Ok(t)
    })?;
    let alg = choice.algorithm();
    match plans.into_iter().find(|(a, _)| *a == alg) {
        Some((_, plan)) => Ok(plan),
        None => build(alg),
    }
}

/// When a per-batch planner ([`Sticky`]) settles again instead of keeping
/// the winner of its last settle (docs/algorithms.md, `auto`, "Per
/// batch"). Every figure is a ratio of estimates: the simulated times of
/// the last settle, scaled by how much each contender's estimate moved
/// since, predict this matrix's.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StickyRule {
    /// Settle again when a contender's predicted time is within this
    /// factor of the kept winner's (predicted over the winner's, below
    /// `1 + lead`): it may have overtaken it, the estimates' error being
    /// what it is. Negative tolerates a predicted loss that small (the
    /// goal is 1%).
    pub lead: f64,
    /// ... and only once that ratio has also fallen by more than this
    /// fraction since the settle: a contender that simulated within
    /// `lead` of the winner (a near tie: either will do) is settled again
    /// only when the estimates move towards it, not on every call.
    pub slack: f64,
    /// Settle again when a contender's estimate moved by more than this
    /// factor either way since the settle: the matrix changed too much for
    /// the old simulations to say anything.
    pub drift: f64,
    /// Settle again after this many kept calls whatever the estimates say
    /// (what they miss may have moved).
    pub calls: u32,
}

impl Default for StickyRule {
    /// The rule measured in docs/benchmarks.md ("`auto` per batch").
    fn default() -> Self {
        StickyRule {
            lead: 0.02,
            slack: 0.0,
            drift: 1.5,
            calls: 1000,
        }
    }
}

/// A per-batch planner's memory of its last settle: the contenders'
/// estimates and simulated times, and the winner. A training job's
/// matrices drift slowly batch to batch, so a tie settled once usually
/// holds for many batches: [`Sticky::keep`] keeps the winner, without a
/// simulation, until the estimates have moved enough (by [`StickyRule`])
/// that another contender could have overtaken it.
#[derive(Clone, Debug, Default)]
pub struct Sticky {
    rule: StickyRule,
    /// (contender, simulated us, estimate us) at the last settle.
    settled: Vec<(Algorithm, f64, f64)>,
    winner: Option<Algorithm>,
    /// Calls kept since the last settle.
    kept: u32,
    /// Why the last call was not kept.
    last: Option<Resettle>,
}

/// Why a per-batch planner settled a close call again instead of keeping
/// the last settle's winner ([`Sticky::keep`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Resettle {
    /// Nothing settled yet.
    First,
    /// [`StickyRule::calls`] calls kept since the settle.
    Calls,
    /// The winner is no contender any more (its estimate fell behind).
    Dropped,
    /// A contender was not simulated at the settle.
    Unsimulated,
    /// A contender's estimate moved more than [`StickyRule::drift`].
    Drift,
    /// A contender is predicted within [`StickyRule::lead`] of the winner.
    Flip,
}

impl Sticky {
    pub fn new(rule: StickyRule) -> Sticky {
        Sticky {
            rule,
            ..Sticky::default()
        }
    }

    pub fn rule(&self) -> StickyRule {
        self.rule
    }

    /// The winner of the last settle if it still holds for `choice` (a
    /// tie: two contenders or more), noted in `choice` (`chosen`,
    /// `kept_for`); `None` when the tie must be settled again: no settle
    /// yet, a contender not simulated then, an estimate moved more than
    /// `rule.drift`, a contender predicted within `rule.lead` of the
    /// winner, or `rule.calls` calls kept already.
    pub fn keep(&mut self, choice: &mut AutoChoice) -> Option<Algorithm> {
        match self.check(choice) {
            Ok(w) => {
                self.kept += 1;
                self.last = None;
                choice.chosen = w.name().into();
                choice.kept_for = Some(self.kept);
                Some(w)
            }
            Err(why) => {
                self.last = Some(why);
                None
            }
        }
    }

    /// Why the last [`Sticky::keep`] did not keep (`None` when it kept).
    pub fn last_resettle(&self) -> Option<Resettle> {
        self.last
    }

    fn check(&self, choice: &AutoChoice) -> std::result::Result<Algorithm, Resettle> {
        let w = self.winner.ok_or(Resettle::First)?;
        if self.kept >= self.rule.calls {
            return Err(Resettle::Calls);
        }
        let contenders = choice.contenders();
        if !contenders.contains(&w) {
            return Err(Resettle::Dropped);
        }
        // Each contender's time now, predicted: its simulated time scaled
        // by how far its estimate moved.
        let mut predicted = Vec::with_capacity(contenders.len());
        let mut mine = (f64::NAN, f64::NAN);
        for &a in &contenders {
            let &(_, sim, was) = self
                .settled
                .iter()
                .find(|x| x.0 == a)
                .ok_or(Resettle::Unsimulated)?;
            let moved = choice.estimate_of(a).unwrap_or(f64::NAN) / was;
            // (NaN, from an estimate missing or zero, is never contained.)
            if !(1.0 / self.rule.drift..=self.rule.drift).contains(&moved) {
                return Err(Resettle::Drift);
            }
            if a == w {
                mine = (sim, sim * moved);
            }
            predicted.push((a, sim, sim * moved));
        }
        // Over the winner's: predicted now, and simulated at the settle.
        let flips = predicted.iter().any(|&(a, was, now)| {
            let ratio = now / mine.1;
            a != w && ratio < (1.0 + self.rule.lead).min(was / mine.0 * (1.0 - self.rule.slack))
        });
        if flips {
            return Err(Resettle::Flip);
        }
        Ok(w)
    }

    /// Remembers a settled `choice` (its `simulated` contenders and
    /// their estimates); a choice without simulations leaves the memory
    /// as it was.
    pub fn remember(&mut self, choice: &AutoChoice) {
        let settled: Vec<(Algorithm, f64, f64)> = choice
            .simulated
            .iter()
            .filter_map(|s| {
                let a: Algorithm = s.algorithm.parse().ok()?;
                Some((a, s.completion_us, choice.estimate_of(a)?))
            })
            .collect();
        if settled.is_empty() {
            return;
        }
        self.settled = settled;
        self.winner = Some(choice.algorithm());
        self.kept = 0;
    }
}

/// Plans with the candidate that finishes first: the estimates' pick, or,
/// when they are too close to call, the fastest contender in the
/// simulator ([`settle_and_build`]). The plan is the chosen
/// scheduler's own, `algorithm` included (`fast`, not `auto`): whoever
/// reads it knows what runs; the choice and its reasons are in the
/// [`AutoChoice`] (the report's `auto` field).
pub fn auto(
    topo: &Topology,
    traffic: &TrafficMatrix,
    network: Network,
) -> Result<(Plan, AutoChoice)> {
    traffic.check_ranks(topo.ranks(), "traffic")?;
    let mut choice = choose(topo, traffic, network);
    let mut plan = settle_and_build(topo, network, &mut choice, |alg| {
        build(alg, topo, traffic, network)
    })?;
    // As `sched::schedule` does: the plan names the matrix it was made for.
    plan.traffic_fingerprint = Some(traffic.fingerprint());
    Ok((plan, choice))
}

fn build(
    alg: Algorithm,
    topo: &Topology,
    traffic: &TrafficMatrix,
    network: Network,
) -> Result<Plan> {
    Ok(match alg {
        Algorithm::Pxn => pxn(topo, traffic),
        Algorithm::Deepep => deepep(topo, traffic),
        Algorithm::Hierarchical => hierarchical(topo, traffic),
        Algorithm::Fast => {
            super::fast::fast_with(topo, traffic, PlannerOptions::for_network(network))?
        }
        Algorithm::Spray => spray(topo, traffic)?,
        _ => direct(topo, traffic),
    })
}

/// Estimates every candidate and picks the smallest estimate. A `links`
/// topology has no rails or nodes to relay through: `direct` it is.
pub fn choose(topo: &Topology, traffic: &TrafficMatrix, network: Network) -> AutoChoice {
    let mut estimates = if topo.is_hierarchical() && topo.nics_per_node() > 0 && topo.nodes() > 1 {
        Estimator::new(topo, traffic, network).all()
    } else {
        vec![Estimate {
            algorithm: "direct".into(),
            estimate_us: 0.0,
            limit: "no rails to balance over (a links topology or one node)".into(),
        }]
    };
    estimates.sort_by(|a, b| a.estimate_us.total_cmp(&b.estimate_us));
    AutoChoice {
        chosen: estimates[0].algorithm.clone(),
        network,
        estimates,
        simulated: Vec::new(),
        kept_for: None,
    }
}

/// The per-link loads of one candidate and what they take.
struct Estimator<'a> {
    topo: &'a Topology,
    traffic: &'a TrafficMatrix,
    congested: bool,
    model: CongestionModel,
    g: usize,
    p: usize,
    nodes: usize,
    /// Bytes per link of the candidate being priced.
    load: Vec<f64>,
    /// Per NIC ingress link: the NIC egress links that send to it (congested mode).
    senders: Vec<Vec<LinkId>>,
    touched: Vec<LinkId>,
    path: Vec<LinkId>,
    /// A GPU of each (node, rail): `rep[node * p + k]`.
    rep: Vec<usize>,
    /// Bytes from (node, rail) to (node, rail) between different nodes:
    /// `rail_bytes[(a * p + k) * nodes * p + b * p + j]`.
    rail_bytes: Vec<f64>,
    /// Bytes from GPU `s` to GPUs of local index `j` on other nodes: `to_local[s * g + j]`.
    to_local: Vec<f64>,
    /// Bytes into GPU `d` from GPUs of local index `i` on other nodes: `from_local[d * g + i]`.
    from_local: Vec<f64>,
    /// Node-to-node bytes: `node_bytes[a * nodes + b]`.
    node_bytes: Vec<f64>,
    /// Latency of an inter-node path and of an intra-node hop, us.
    inter_latency: f64,
    intra_latency: f64,
    /// True for a mesh node (a link per GPU pair), false for a switch.
    mesh: bool,
    /// Bytes/us a GPU moves inside its node: its NVLink, or all its mesh links.
    gpu_rate: f64,
    /// Each (node, rail)'s NIC egress and ingress links (`None`: no GPU on that rail).
    nic_tx: Vec<Option<LinkId>>,
    nic_rx: Vec<Option<LinkId>>,
    /// Network bytes routed since the last pricing, aggregated: out of and
    /// into each NIC, and between (leaf or group, rail) pairs (`fab[fx *
    /// lp + fy]`, with one NIC pair that carries them and the pairs used).
    net_tx: Vec<f64>,
    net_rx: Vec<f64>,
    /// Messages out of each NIC since the last pricing (the calibrated
    /// modes charge each `per_message_us` of NIC egress time).
    net_msgs: Vec<f64>,
    /// The mode's NIC goodput (1 in `ideal`) and per-message cost, us.
    goodput: f64,
    per_message_us: f64,
    /// Non-empty blocks from (node, rail) to (node, rail) on other nodes,
    /// as `rail_bytes`; and from a (node, rail)'s GPUs to each other node
    /// (`rail_node_msgs[x * nodes + b]`).
    rail_msgs: Vec<f64>,
    rail_node_msgs: Vec<f64>,
    /// `fast`'s chunk size (docs/algorithms.md, `fast`), bytes, planned
    /// for the mode; `spray` is always planned for the ideal network.
    chunk: f64,
    chunk_ideal: f64,
    /// Bytes/us of one node's NICs together (`fast`'s node rate).
    node_rate: f64,
    fab: Vec<f64>,
    fab_pair: Vec<(usize, usize)>,
    fab_used: Vec<usize>,
    /// Each (node, rail)'s (leaf or group, rail), and their count.
    fab_of: Vec<usize>,
    lp: usize,
    /// Scratch for pricing: each link's incast efficiency (1 = none).
    eff: Vec<f64>,
    /// Bytes from GPU `s` to node `b` and into GPU `d` from node `a`
    /// (other nodes only): `to_node[s * nodes + b]`, `from_node[d * nodes + a]`.
    to_node: Vec<f64>,
    from_node: Vec<f64>,
    /// The intra-node blocks' link loads, the same for every candidate
    /// (routed once).
    intra_blocks: Option<Vec<(LinkId, f64)>>,
    /// The network flows routed since the candidate's estimate began:
    /// (sending NIC, receiving NIC, bytes, transfers that share it),
    /// for [`Self::fabric_tail`].
    flows: Vec<(usize, usize, f64, f64)>,
    /// On a mesh node, the link from GPU `s` to local GPU `j`:
    /// `mesh_link[s * g + j]` (empty on a switch).
    mesh_link: Vec<LinkId>,
    /// Bytes each GPU sends to and receives from the other GPUs of its
    /// node (the intra-node blocks).
    intra_out: Vec<f64>,
    intra_in: Vec<f64>,
}

/// Prices of one candidate's routing.
#[derive(Clone, Debug, Default)]
struct Priced {
    /// Largest network link time (bytes / effective capacity), us.
    net: f64,
    net_link: Option<LinkId>,
    /// Largest intra-node link time, us.
    intra: f64,
    intra_link: Option<LinkId>,
}

impl<'a> Estimator<'a> {
    fn new(topo: &'a Topology, traffic: &'a TrafficMatrix, network: Network) -> Self {
        let (g, p, nodes) = (topo.gpus_per_node(), topo.nics_per_node(), topo.nodes());
        let n = topo.ranks();
        let mut rep = vec![usize::MAX; nodes * p];
        for r in (0..n).rev() {
            rep[topo.node_of(r) * p + topo.rail_of(r)] = r;
        }
        let np = nodes * p;
        let mut rail_bytes = vec![0.0; np * np];
        let mut rail_msgs = vec![0.0; np * np];
        let mut to_local = vec![0.0; n * g];
        let mut from_local = vec![0.0; n * g];
        let mut node_bytes = vec![0.0; nodes * nodes];
        let mut to_node = vec![0.0; n * nodes];
        let mut from_node = vec![0.0; n * nodes];
        let (mut intra_out, mut intra_in) = (vec![0.0; n], vec![0.0; n]);
        let rail: Vec<usize> = (0..n).map(|r| topo.rail_of(r)).collect();
        for s in 0..n {
            let (a, i) = (s / g, s % g);
            let row = traffic.row(s);
            let src = (a * p + rail[s]) * np;
            for (d, &bytes) in row.iter().enumerate().take(n) {
                if bytes == 0 || d == s {
                    continue;
                }
                if d / g == a {
                    intra_out[s] += bytes as f64;
                    intra_in[d] += bytes as f64;
                    continue;
                }
                let b = bytes as f64;
                let (nb, j) = (d / g, d % g);
                rail_bytes[src + nb * p + rail[d]] += b;
                rail_msgs[src + nb * p + rail[d]] += 1.0;
                to_local[s * g + j] += b;
                from_local[d * g + i] += b;
                node_bytes[a * nodes + nb] += b;
                to_node[s * nodes + nb] += b;
                from_node[d * nodes + a] += b;
            }
        }
        let mesh = topo.intra_kind() == Some(crate::topology::IntraKind::Mesh);
        let gpu_rate = topo.intra_bandwidth() * if mesh { (g - 1).max(1) as f64 } else { 1.0 };
        let inter_latency = if n > g { topo.path_latency(0, g) } else { 0.0 };
        let intra_latency = if g > 1 { topo.path_latency(0, 1) } else { 0.0 };
        let lp = topo.leaves() * p;
        let mut rail_node_msgs = vec![0.0; np * nodes];
        for s in 0..n {
            for b in 0..nodes {
                if to_node[s * nodes + b] > 0.0 {
                    rail_node_msgs[((s / g) * p + rail[s]) * nodes + b] += 1.0;
                }
            }
        }
        // `fast`'s chunk: the larger of half a percent of the exchange's
        // NVLink time and four inter-node latencies at a NIC's rate.
        let nic_rate = topo.nic_bandwidth();
        let line = (0..nodes)
            .map(|a| {
                let (r, c) = (0..nodes).fold((0.0, 0.0), |(r, c), b| {
                    (r + node_bytes[a * nodes + b], c + node_bytes[b * nodes + a])
                });
                f64::max(r, c)
            })
            .fold(0.0, f64::max);
        let rails = rail
            .iter()
            .take(g)
            .collect::<std::collections::BTreeSet<_>>()
            .len();
        let exchange_us = line / (nic_rate * rails as f64).max(f64::MIN_POSITIVE);
        let sim = SimOptions::new(network);
        let (goodput, per_message_us) = if network == Network::Ideal {
            (1.0, 0.0)
        } else {
            (sim.calibration.nic_goodput, sim.calibration.per_message_us)
        };
        // With a per-message cost, `fast` plans larger chunks (eq. 4').
        let by_message = (exchange_us * nic_rate * per_message_us * topo.intra_bandwidth()).sqrt();
        let chunk_ideal = (0.005 * exchange_us * topo.intra_bandwidth())
            .max(4.0 * inter_latency * nic_rate)
            .max(1.0);
        let chunk = chunk_ideal.max(by_message);
        // Each NIC's links, from one path to (or from) another node.
        let (mut nic_tx, mut nic_rx) = (vec![None; nodes * p], vec![None; nodes * p]);
        let mut path = Vec::with_capacity(8);
        for (x, &r) in rep.iter().enumerate() {
            if r == usize::MAX || nodes < 2 {
                continue;
            }
            let other = ((x / p + 1) % nodes) * g;
            for (s, d) in [(r, other), (other, r)] {
                path.clear();
                topo.path_into(s, d, &mut path);
                for &l in &path {
                    match topo.link(l).class {
                        LinkClass::NicTx if s == r => nic_tx[x] = Some(l),
                        LinkClass::NicRx if d == r => nic_rx[x] = Some(l),
                        _ => {}
                    }
                }
            }
        }
        let mut mesh_link = Vec::new();
        if mesh {
            mesh_link.resize(n * g, LinkId::MAX);
            for s in 0..n {
                for j in (0..g).filter(|&j| j != s % g) {
                    path.clear();
                    topo.path_into(s, (s / g) * g + j, &mut path);
                    if let Some(&l) = path.first() {
                        mesh_link[s * g + j] = l;
                    }
                }
            }
        }
        Estimator {
            topo,
            traffic,
            congested: network.has_incast(),
            model: if network == Network::Stress {
                CongestionModel::stress()
            } else {
                CongestionModel::default()
            },
            g,
            p,
            nodes,
            load: vec![0.0; topo.num_links()],
            senders: vec![Vec::new(); topo.num_links()],
            touched: Vec::new(),
            path: Vec::with_capacity(8),
            rep,
            rail_bytes,
            to_local,
            from_local,
            node_bytes,
            inter_latency,
            intra_latency,
            mesh,
            gpu_rate,
            nic_tx,
            nic_rx,
            net_tx: vec![0.0; nodes * p],
            net_rx: vec![0.0; nodes * p],
            net_msgs: vec![0.0; nodes * p],
            goodput,
            per_message_us,
            rail_msgs,
            rail_node_msgs,
            chunk,
            chunk_ideal,
            node_rate: node_rate(topo),
            fab: vec![0.0; lp * lp],
            fab_pair: vec![(usize::MAX, usize::MAX); lp * lp],
            fab_used: Vec::new(),
            fab_of: (0..nodes * p)
                .map(|x| topo.leaf_of(x / p) * p + x % p)
                .collect(),
            lp,
            eff: vec![1.0; topo.num_links()],
            to_node,
            from_node,
            intra_blocks: None,
            flows: Vec::new(),
            mesh_link,
            intra_out,
            intra_in,
        }
    }

    fn all(&mut self) -> Vec<Estimate> {
        CANDIDATES.iter().map(|&a| self.estimate(a)).collect()
    }

    fn estimate(&mut self, alg: Algorithm) -> Estimate {
        let (g, p, nodes) = (self.g, self.p, self.nodes);
        let np = nodes * p;
        let n = g * nodes;
        let (inter, hop) = (self.inter_latency, self.intra_latency);
        self.flows.clear();
        // Intra-node blocks: every candidate sends them straight.
        self.route_intra_blocks();
        let (us, limit) = match alg {
            Algorithm::Direct => {
                self.route_direct();
                let c = self.price();
                let (base, limit) = self.with_fabric_tail(&c);
                (base + inter, limit)
            }
            Algorithm::Pxn | Algorithm::Hierarchical => {
                // The network hop runs on the destination's rail; the NVLink
                // hop goes from the source to its node's GPU on that rail.
                // Per GPU: bytes relayed out and in over NVLink, and (`pxn`)
                // what it sends over the network itself, from the start.
                let (mut relay_out, mut relay_in) = (vec![0.0f64; n], vec![0.0f64; n]);
                let mut own = vec![0.0f64; n];
                for s in 0..n {
                    let a = s / g;
                    for j in 0..g {
                        let b = self.to_local[s * g + j];
                        if b == 0.0 {
                            continue;
                        }
                        let b_node = if a == 0 { 1 } else { 0 };
                        let relay = if alg == Algorithm::Pxn {
                            pxn_relay(self.topo, s, b_node * g + j)
                        } else {
                            a * g + j
                        };
                        if relay != s {
                            self.route_gpu(s, relay, b);
                            relay_out[s] += b;
                            relay_in[relay] += b;
                        } else {
                            own[s] += b;
                        }
                    }
                }
                // One flow per (source node, receiving NIC): the sum over
                // the node's sending rails (one path each, not one per rail).
                for a in 0..nodes {
                    for y in 0..np {
                        let b: f64 = (0..p).map(|k| self.rail_bytes[(a * p + k) * np + y]).sum();
                        // `pxn` sends a message per block, `hierarchical` one
                        // per (relay, destination GPU).
                        let msgs = if alg == Algorithm::Pxn {
                            (0..p).map(|k| self.rail_msgs[(a * p + k) * np + y]).sum()
                        } else {
                            1.0
                        };
                        self.route_net(a * p + y % p, y, b, msgs);
                    }
                }
                let c = self.price();
                let (base, limit) = self.with_fabric_tail(&c);
                let lag = self.relay_lag(alg, &relay_out, &relay_in, &own, base);
                (base + lag + inter + hop, limit)
            }
            Algorithm::Deepep => {
                // One flow per (sending NIC, destination node).
                for x in 0..np {
                    let k = x % p;
                    for bn in 0..nodes {
                        let row = x * np + bn * p;
                        let b: f64 = self.rail_bytes[row..row + p].iter().sum();
                        let msgs = self.rail_node_msgs[x * nodes + bn];
                        self.route_net(x, bn * p + k, b, msgs);
                    }
                }
                for d in 0..n {
                    let bn = d / g;
                    for i in 0..g {
                        let b = self.from_local[d * g + i];
                        let peer = bn * g + i;
                        if b > 0.0 && peer != d {
                            self.route_gpu(peer, d, b);
                        }
                    }
                }
                let mut c = self.price();
                // A shared fabric link (`L'`, as `direct`'s): where it
                // outlasts the busiest link, the writes land that much later.
                let (shared, shared_limit) = self.with_fabric_tail(&c);
                if shared > c.net.max(c.intra) {
                    c.net = shared;
                }
                // Each forward waits for the whole write it comes in:
                // when the writes land and how the forwards then queue on
                // the NVLink links, rather than the old `½ X_fwd / b_gpu`.
                let (fwd, fwd_link) = self.deepep_forwards(c.net, c.net_link);
                let base = shared;
                let limit = if fwd > base {
                    format!("forwards on {fwd_link} end at {fwd:.1} us")
                } else {
                    shared_limit
                };
                (base.max(fwd) + inter + hop, limit)
            }
            Algorithm::Fast | Algorithm::Spray => {
                // Balanced: each node pair's bytes spread over every lane,
                // GPU l of A to GPU l of B; the excess of a GPU over its
                // share moves over NVLink first, a receiver's share of
                // others' bytes after. `fast`'s stages are permutations of
                // nodes: no NIC hears two senders at once, so no incast.
                let staged = alg == Algorithm::Fast;
                let congested = self.congested;
                self.congested = congested && !staged;
                // `fast`'s taper messages that ride the whole path (the
                // simulator charges a message's overhead on every link it
                // crosses), spread over a lane's node pairs by their bytes.
                // `fast`'s node stages (its own decomposition), once.
                let stages = if staged && nodes > 1 {
                    Some(self.fast_stages())
                } else {
                    None
                };
                let one_stage = stages
                    .as_ref()
                    .is_some_and(|(pairs, _)| pairs.last().is_none_or(|p| p.stage == 0));
                let on_path = if !staged {
                    0.0
                } else if one_stage {
                    FAST_TAPER_PATH_ONE_STAGE
                } else {
                    FAST_TAPER_PATH
                };
                for a in 0..nodes {
                    let row = &self.node_bytes[a * nodes..(a + 1) * nodes];
                    let out: f64 = row.iter().sum::<f64>() - row[a];
                    for b in (0..nodes).filter(|&b| b != a) {
                        let share = self.node_bytes[a * nodes + b] / g as f64;
                        if share == 0.0 {
                            continue;
                        }
                        let tapered = on_path * self.node_bytes[a * nodes + b] / out;
                        for l in 0..g {
                            let (s, d) = (a * g + l, b * g + l);
                            let (x, y) =
                                (a * p + self.topo.rail_of(s), b * p + self.topo.rail_of(d));
                            let chunk = if staged { self.chunk } else { self.chunk_ideal };
                            let msgs = (share / chunk).ceil() + tapered;
                            self.route_net(x, y, share, msgs);
                        }
                    }
                }
                // The taper: each of a lane's last sends in flight (`fast`'s
                // pipeline depth, about 4; one for `spray`) cut in three,
                // on the sending NIC (`fast`: less those routed above).
                let taper = if staged { FAST_TAPER - on_path } else { 2.0 };
                for a in 0..nodes {
                    if (0..nodes).any(|b| b != a && self.node_bytes[a * nodes + b] > 0.0) {
                        for l in 0..g {
                            let x = a * p + self.topo.rail_of(a * g + l);
                            self.net_msgs[x] += taper;
                        }
                    }
                }
                self.route_balancing_moves();
                // On a mesh, their relief pass moves intra-node blocks and
                // forwards off the busiest links (`mesh_relief`).
                let relief = if self.mesh {
                    Some(self.mesh_relief())
                } else {
                    None
                };
                let mut c = self.price();
                self.congested = congested;
                let mut relieved = None;
                if let Some((t, at)) = relief {
                    if t < c.intra {
                        c.intra = t;
                        relieved = Some(format!("{at} busy {t:.1} us after relief"));
                    }
                }
                let limit_of = |e: &Self, c: &Priced| {
                    if c.intra > c.net {
                        if let Some(r) = &relieved {
                            return r.clone();
                        }
                    }
                    e.limit_of(c)
                };
                let base = c.net.max(c.intra);
                // `fast`: the pipeline's ends (its first sends wait for
                // their balancing moves and its last ones are forwarded
                // after; measured ~3%, docs/algorithms.md, `auto`).
                // `spray`: ~10% more in the congested mode once NICs hear
                // more senders than the incast threshold (head-of-line
                // blocking, which the estimate's incast term misses); its
                // receivers' forwards are `spray_forwards`.
                let overhead = if staged {
                    FAST_ENDS
                } else if congested && nodes - 1 > self.model.incast_threshold as usize {
                    0.1
                } else {
                    0.0
                };
                if !staged {
                    let (fwd, at) = self.spray_forwards(c.net);
                    let busy = (base * (1.0 + SPRAY_ENDS)).max(fwd) * (1.0 + overhead);
                    let limit = if fwd > base {
                        format!("forwards into {at} end at {fwd:.1} us")
                    } else {
                        limit_of(self, &c)
                    };
                    let limit = if overhead > 0.0 {
                        format!("{limit} (+{:.0}% head-of-line blocking)", overhead * 100.0)
                    } else {
                        limit
                    };
                    return Estimate {
                        algorithm: alg.name().into(),
                        estimate_us: busy + inter + 2.0 * hop,
                        limit,
                    };
                }
                // Stages cost messages the routing above does not count,
                // and they run as a dataflow whose chains can leave a node
                // waiting for its next partner (`fast_stage_flow`).
                let (stage_messages, flow) = match &stages {
                    Some((pairs, rotated)) => (
                        self.fast_stage_messages(pairs),
                        self.fast_stage_flow(pairs, *rotated),
                    ),
                    None => (0.0, 0.0),
                };
                // One stage (the pair never changes partner) on a NIC or
                // NVLink link: its pipeline's ends alone.
                let fabric_bound = c.net >= c.intra && self.fabric_link(c.net_link).is_some();
                let overhead = if one_stage && !fabric_bound {
                    FAST_ENDS_ONE_STAGE
                } else {
                    overhead
                };
                let busy = (base + stage_messages) * (1.0 + overhead);
                let messages = if stage_messages > 0.0 {
                    format!(", +{stage_messages:.1} us stage messages")
                } else {
                    String::new()
                };
                // Where a leaf's fabric links can bind, the stages replayed
                // as flows that share them (`fast_stage_replay`): a hot
                // receiver's crossing pairs share its leaf's downlink with
                // its leaf-mates', which the chains and the busiest link
                // do not see.
                let replay = match &stages {
                    Some((pairs, _)) => self.fast_stage_replay(pairs) * (1.0 + overhead),
                    None => 0.0,
                };
                if replay > busy.max(flow) {
                    return Estimate {
                        algorithm: alg.name().into(),
                        estimate_us: replay + inter + 2.0 * hop,
                        limit: format!(
                            "stages' flows over NICs and leaf links end at {replay:.1} us \
                             (+{:.1}% pipeline ends)",
                            overhead * 100.0
                        ),
                    };
                }
                let limit = if flow > busy {
                    format!("stages' chains end at {flow:.1} us{messages}")
                } else {
                    format!(
                        "{} (+{:.1}% pipeline ends{messages})",
                        limit_of(self, &c),
                        overhead * 100.0
                    )
                };
                (busy.max(flow) + inter + 2.0 * hop, limit)
            }
            _ => (f64::INFINITY, "not a candidate".into()),
        };
        Estimate {
            algorithm: alg.name().into(),
            estimate_us: us,
            limit,
        }
    }

    /// `fast`'s node stages: the stages its planner cuts this matrix's
    /// node matrix into ([`NodeStages`], `sched::fast`'s own
    /// decomposition, planned for this mode's per-message cost), in the
    /// order they run. The decomposition's work (N = nodes), a few
    /// microseconds at 8 nodes. With them, whether they are the rotation
    /// stages ([`NodeStages::rotated`]).
    fn fast_stages(&self) -> (Vec<StagePair>, bool) {
        let nodes = self.nodes;
        let t: Vec<u64> = self.node_bytes.iter().map(|&b| b as u64).collect();
        let opts = PlannerOptions {
            per_message_us: self.per_message_us,
            ..PlannerOptions::default()
        };
        let mut pairs = Vec::with_capacity(4 * nodes * nodes);
        let part = (self.chunk * self.g as f64) as u64;
        let mut stages = NodeStages::new(self.topo);
        stages.decompose(nodes, &t, &opts, part, &mut pairs);
        // Numbered in the order they run (stable: already in that order).
        pairs.sort_by_key(|p| p.stage);
        (pairs, stages.rotated())
    }

    /// What `fast`'s stages (`pairs`, [`Self::fast_stages`]) add to its
    /// messages, us of the busiest sending NIC: each stage costs each
    /// lane a message at least, `⌈w / G / c⌉` for a pair's `w` bytes in
    /// the stage (`c` `fast`'s chunk), where the pricing of its routing
    /// counts `⌈T[A][B] / G / c⌉` per node pair, as if the pair were sent
    /// in one piece. The node whose lanes send the most extra messages
    /// sets it, at `per_message_us` each and the GPUs that share a NIC. 0
    /// in `ideal` (no per-message cost). `N x N` work.
    fn fast_stage_messages(&self, pairs: &[StagePair]) -> f64 {
        if self.per_message_us <= 0.0 || self.nodes < 2 {
            return 0.0;
        }
        let (g, nodes) = (self.g as f64, self.nodes);
        let per_lane = |bytes: f64| (bytes / g / self.chunk).ceil();
        // Per sending node: messages per lane, staged minus in one piece.
        let mut extra = vec![0.0f64; nodes];
        for p in pairs {
            extra[p.src_node as usize] += per_lane(p.bytes as f64);
        }
        for (a, x) in extra.iter_mut().enumerate() {
            *x -= (0..nodes)
                .filter(|&b| b != a)
                .map(|b| per_lane(self.node_bytes[a * nodes + b]))
                .sum::<f64>();
        }
        let worst = extra.iter().copied().fold(0.0, f64::max);
        // GPUs per NIC: the lanes whose messages one NIC sends.
        let sharing = g * self.topo.nic_bandwidth() / self.node_rate;
        worst * self.per_message_us * sharing
    }

    /// When `fast`'s stages end, run as its plan runs them: a dataflow
    /// without barriers (docs/algorithms.md, `fast`: a GPU's send waits
    /// for its own earlier sends and for the earlier sends into its
    /// receiver), so node pair `(a, b)` of a stage starts once `a` has
    /// sent its earlier stages and `b` has received its own, and takes its
    /// bytes over a node's NICs (at the mode's goodput) plus, outside
    /// `ideal`, a message per lane and chunk. The stages are
    /// [`NodeStages`]' own (the decomposition `fast`'s planner emits for
    /// this node matrix and this mode's per-message cost,
    /// [`Self::fast_stages`]), in their order. Returns the critical path
    /// of those chains, us: where a stage's pairs are uneven, a node that
    /// ends early waits for its next partner, and the exchange ends later
    /// than the busiest link says. One pass over the stages' pairs
    /// ([`StageChains`], which `NodeStages` also picks its stages with).
    ///
    /// `rotated`: the stages are the rotation's (whole node pairs, `N - 1`
    /// stages), whose lanes drift apart at every change of partner, which
    /// the node chains do not see: each pair is stretched by
    /// [`ROTATION_DRIFT`] of its bytes, up to what a lane's sends in
    /// flight hold ([`StageChains::end_drifting`]).
    fn fast_stage_flow(&self, pairs: &[StagePair], rotated: bool) -> f64 {
        let g = self.g as f64;
        // A lane's message costs its NIC `per_message_us`, and a NIC
        // carries this many lanes.
        let per_msg = self.per_message_us * g * self.topo.nic_bandwidth() / self.node_rate;
        let rate = self.node_rate * self.goodput;
        let stretch = if rotated { ROTATION_DRIFT } else { 0.0 };
        // What a node's lanes hold in flight: `fast`'s fewest sends in
        // flight, each of a chunk, on every lane.
        let in_flight = f64::from(MIN_DEPTH) * self.chunk * g;
        StageChains::default().end_drifting(
            self.nodes, pairs, rate, g, self.chunk, per_msg, stretch, in_flight,
        )
    }

    /// [`fluid_stage_end`] of `fast`'s stages `pairs` (the node pairs
    /// of [`Self::fast_stages`], in order) at the node's rate, each
    /// crossing pair also over its leaves' uplinks and downlinks, with a
    /// node's lanes' sends in flight (`MIN_DEPTH` chunks per lane, as
    /// [`Self::fast_stage_flow`]) as the window by which its next pair
    /// may overlap its last. 0 where no leaf's uplinks can bind (one leaf
    /// or rail group, or uplinks as fast as their nodes' NICs: the replay
    /// is then the stage chains), with a per-message cost (the busiest
    /// link's messages already price `fast` above the replay there: on
    /// the sweep's calibrated cases it moved no estimate, so its cost is
    /// not paid), and beyond [`REPLAY_MAX_PAIRS`] pairs (docs/benchmarks.md,
    /// "`auto`'s `fast` estimate replays its stages"). `O(pairs)` events,
    /// each a max-min fill over the flows moving.
    fn fast_stage_replay(&self, pairs: &[StagePair]) -> f64 {
        let topo = self.topo;
        let leaves = topo.leaves();
        if self.per_message_us > 0.0 || leaves < 2 {
            return 0.0;
        }
        let mut fabric = vec![0.0; leaves];
        for l in 0..topo.num_links() as LinkId {
            if topo.link(l).class != LinkClass::Uplink {
                continue;
            }
            if let Vertex::Leaf(x) | Vertex::Rail(x, _) = topo.link_ends(l).0 {
                if let Some(f) = fabric.get_mut(*x) {
                    *f += topo.link(l).bandwidth;
                }
            }
        }
        let leaf: Vec<usize> = (0..self.nodes).map(|a| topo.leaf_of(a)).collect();
        let mut nodes_in = vec![0usize; leaves];
        for &l in &leaf {
            nodes_in[l] += 1;
        }
        let rate = self.node_rate * self.goodput;
        let can_bind = (0..leaves).any(|l| fabric[l] < nodes_in[l] as f64 * rate * 0.999);
        if !can_bind {
            return 0.0;
        }
        if pairs.len() > REPLAY_MAX_PAIRS {
            return 0.0;
        }
        let window = f64::from(MIN_DEPTH) * self.chunk * self.g as f64;
        fluid_stage_end(self.nodes, pairs, &leaf, &fabric, rate, window)
    }

    /// [`Self::deepep_forwards`]' landings (`land[s * nodes + b]`, the
    /// write of GPU `s` to node `b`) where fabric link `u` binds at
    /// `net_busy` us: the writes whose path crosses `u` are stretched so
    /// the latest of them lands at `net_busy`; the rest keep their NICs'
    /// times. Whether a write crosses `u` depends on the (leaf or group,
    /// rail) of its two NICs: one path per such pair, as
    /// [`Self::fabric_tail`] walks them. (4x8 fat-tree 2:1 with two nodes
    /// per leaf: every landing stretched put `deepep` at 0.975-0.988 of
    /// its simulated time, medians by preset and mode, and ahead of
    /// `fast` where it was 2.1% slower; issue 20 §5 of 2026-12-04 in
    /// docs/benchmarks.md.)
    fn stretch_over(&self, u: LinkId, net_busy: f64, land: &mut [f64]) {
        let (g, p, nodes, lp) = (self.g, self.p, self.nodes, self.lp);
        let mut rep_of = vec![usize::MAX; lp];
        for x in 0..nodes * p {
            if self.rep[x] != usize::MAX && rep_of[self.fab_of[x]] == usize::MAX {
                rep_of[self.fab_of[x]] = self.rep[x];
            }
        }
        // Per (leaf or group, rail) pair: 0 unknown, 1 crosses `u`, 2 not.
        let mut crosses = vec![0u8; lp * lp];
        let mut path = Vec::with_capacity(8);
        let mut over = vec![false; land.len()];
        let mut latest = 0.0f64;
        for s in 0..g * nodes {
            let a = s / g;
            let fx = self.fab_of[a * p + self.topo.rail_of(s)];
            for b in (0..nodes).filter(|&b| b != a) {
                let w = s * nodes + b;
                if land[w] == 0.0 {
                    continue;
                }
                let fy = self.fab_of[b * p + self.topo.rail_of(b * g + s % g)];
                let f = fx * lp + fy;
                if crosses[f] == 0 {
                    path.clear();
                    self.topo.path_into(rep_of[fx], rep_of[fy], &mut path);
                    crosses[f] = if path.contains(&u) { 1 } else { 2 };
                }
                if crosses[f] == 1 {
                    over[w] = true;
                    latest = latest.max(land[w]);
                }
            }
        }
        if latest > 0.0 && net_busy > latest {
            let stretch = net_busy / latest;
            for (t, _) in land.iter_mut().zip(&over).filter(|(_, &o)| o) {
                *t *= stretch;
            }
        }
    }

    /// The busiest mesh link's time, us, and its name, after `fast`'s (and
    /// `spray`'s) relief pass (sched/fast/mesh.rs) as that pass runs it, on
    /// the loads routed so far: per node, take the busiest link `x -> y`;
    /// each relay `z` stands at `m_z = max(L(x,z), L(z,y))`; fill the
    /// relays to the level `w` with `Σ_z max(0, w - m_z) = L(x,y) - w`,
    /// moving at most what the link holds that may be relayed (its
    /// intra-node block and the forwards into `y`; the balancing moves
    /// stay); repeat until a step would move less than 64 KiB or 1% of the
    /// link, as the pass stops. `O(G log G)` per step, at most `4 G²`
    /// steps per node; only on mesh nodes.
    fn mesh_relief(&self) -> (f64, String) {
        let (g, nodes) = (self.g, self.nodes);
        let bw = self.topo.intra_bandwidth().max(f64::MIN_POSITIVE);
        let (mut load, mut room) = (vec![0.0f64; g * g], vec![0.0f64; g * g]);
        let mut m: Vec<(f64, usize)> = Vec::with_capacity(g);
        let (mut worst, mut at) = (0.0f64, String::new());
        let busiest = |load: &[f64]| {
            load.iter()
                .copied()
                .enumerate()
                .fold((0, 0.0), |b, (k, v)| if v > b.1 { (k, v) } else { b })
        };
        for a in 0..nodes {
            for x in 0..g {
                for y in (0..g).filter(|&y| y != x) {
                    let (s, d) = (a * g + x, a * g + y);
                    let l = self.mesh_link[s * g + y];
                    load[x * g + y] = if l == LinkId::MAX {
                        0.0
                    } else {
                        self.load[l as usize]
                    };
                    room[x * g + y] = self.traffic.get(s, d) as f64;
                }
            }
            // The forwards into `y`, spread over its links as
            // `route_balancing_moves` routes them.
            for y in 0..g {
                let d = a * g + y;
                let fwd: f64 = (0..nodes)
                    .filter(|&b| b != a)
                    .map(|b| {
                        let share = self.node_bytes[b * nodes + a] / g as f64;
                        (self.from_node[d * nodes + b] - share).max(0.0)
                    })
                    .sum();
                for x in (0..g).filter(|&x| x != y) {
                    room[x * g + y] += fwd / (g - 1) as f64;
                }
            }
            for _ in 0..4 * g * g {
                let (k, l0) = busiest(&load);
                let (x, y) = (k / g, k % g);
                m.clear();
                m.extend(
                    (0..g)
                        .filter(|&z| z != x && z != y)
                        .map(|z| (load[x * g + z].max(load[z * g + y]), z)),
                );
                m.sort_unstable_by(|u, v| u.0.total_cmp(&v.0));
                let (mut w, mut sum) = (l0, 0.0);
                for (j, &(mz, _)) in m.iter().enumerate() {
                    if mz >= w {
                        break;
                    }
                    sum += mz;
                    w = (l0 + sum) / (j + 2) as f64;
                }
                let moved = (l0 - w).min(room[k]);
                if l0 - w <= 0.0 || moved < MESH_MIN_RELAY || moved < MESH_MIN_GAIN * l0 {
                    break;
                }
                let scale = moved / (l0 - w);
                load[k] -= moved;
                room[k] -= moved;
                for &(mz, z) in &m {
                    if mz < w {
                        let add = (w - mz) * scale;
                        load[x * g + z] += add;
                        load[z * g + y] += add;
                    }
                }
            }
            let (k, l) = busiest(&load);
            if l / bw > worst {
                worst = l / bw;
                at = format!("gpu{}->gpu{}", a * g + k / g, a * g + k % g);
            }
        }
        (worst, at)
    }

    /// When `spray`'s forwards end, us, and where (docs/algorithms.md,
    /// `auto`, "`spray`'s forwards"). `spray` sends every lane's share of
    /// every node pair at once, so its lane writes `(A, l) -> (B, l)`
    /// (`T[A][B] / G` bytes each, every lane alike) share each node's NICs
    /// as max-min fairness shares one link: on the sending node's NICs and
    /// on the receiving node's, the write of `d_1 <= .. <= d_m` ends its
    /// `j`-th at `d_1 + .. + d_(j-1) + (m - j + 1) d_j`, and lands at the
    /// later of the two; where the busiest network link is slower than the
    /// NICs (a fabric link), every landing is stretched as much. What a
    /// lane carries for another GPU of the receiving node is then forwarded
    /// over NVLink (on a mesh, over all of `x`'s links: `spray`'s relief
    /// pass spreads them): into GPU `x`, the bytes `x` gets from node `A` less
    /// what lands on its own lane, released as `A`'s write lands (its
    /// sends are chained: one part per send, of `⌈T[A][B] / G / c⌉`, at
    /// most [`SPRAY_STEPS`], the `k`-th at `k / steps` of the landing),
    /// behind the intra-node blocks (released at once). A link that gets jobs of
    /// `b_i` bytes at `r_i` ends at `max_i (r_i + Σ_{r_j >= r_i} b_j / b)`,
    /// as for `deepep`'s forwards. The receivers a skewed matrix makes hot
    /// take their forwards last: this replaced a constant and a term in
    /// the log of the receiver skew. `O(N² log N + G N²)` (N = nodes).
    fn spray_forwards(&self, net_busy: f64) -> (f64, String) {
        let (g, nodes) = (self.g, self.nodes);
        let gf = g as f64;
        let rate = self.node_rate * self.goodput;
        // A lane's messages cost its NIC `per_message_us` each, and a NIC
        // carries this many lanes.
        let sharing = gf * self.topo.nic_bandwidth() / self.node_rate;
        let dur = |a: usize, b: usize| {
            let t = self.node_bytes[a * nodes + b];
            if t == 0.0 {
                return 0.0;
            }
            t / rate + (t / gf / self.chunk_ideal).ceil() * self.per_message_us * sharing
        };
        // Landing of node pair (a, b)'s writes: `land[a * nodes + b]`.
        let mut land = vec![0.0f64; nodes * nodes];
        let mut v: Vec<(f64, usize)> = Vec::with_capacity(nodes);
        for side in 0..2 {
            for u in 0..nodes {
                v.clear();
                for w in (0..nodes).filter(|&w| w != u) {
                    let k = if side == 0 {
                        u * nodes + w
                    } else {
                        w * nodes + u
                    };
                    let d = dur(k / nodes, k % nodes);
                    if d > 0.0 {
                        v.push((d, k));
                    }
                }
                v.sort_unstable_by(|x, y| x.0.total_cmp(&y.0));
                let m = v.len();
                let mut before = 0.0;
                for (j, &(d, k)) in v.iter().enumerate() {
                    land[k] = land[k].max(before + (m - j) as f64 * d);
                    before += d;
                }
            }
        }
        let latest = land.iter().copied().fold(0.0, f64::max);
        if latest > 0.0 && net_busy > latest {
            let s = net_busy / latest;
            land.iter_mut().for_each(|t| *t *= s);
        }
        // A switch port, or (a mesh) all of a GPU's links: `spray`'s mesh
        // relief (sched/fast/mesh.rs) spreads the forwards over them.
        let bw = self.gpu_rate.max(f64::MIN_POSITIVE);
        // `spray` chains each lane's slice of a node pair (sched/fast/
        // sends.rs, `Emitter::spray_depth`): its sends, of at most a chunk,
        // land one after another through the write (with several in
        // flight, each started a send's time after the one before), so
        // pair `(a, bn)`'s forwards are released in `steps` equal parts,
        // one per send, the `k`-th at `k / steps` of its landing.
        let (mut end, mut at) = (0.0f64, String::new());
        // Release time, sending node, and the part of its forwards.
        let mut rel: Vec<(f64, usize, f64)> = Vec::with_capacity(nodes);
        for bn in 0..nodes {
            rel.clear();
            for a in (0..nodes).filter(|&a| a != bn) {
                let t = self.node_bytes[a * nodes + bn];
                if t <= 0.0 {
                    continue;
                }
                let sends = (t / gf / self.chunk_ideal).ceil().max(1.0);
                let steps = sends.min(SPRAY_STEPS);
                let l = land[a * nodes + bn];
                rel.extend((1..=steps as u32).map(|k| (l * k as f64 / steps, a, 1.0 / steps)));
            }
            // Latest first: each link's queue is a suffix sum.
            rel.sort_unstable_by(|x, y| y.0.total_cmp(&x.0));
            for x in bn * g..(bn + 1) * g {
                // What `x` gets from node `a` over other lanes: lane `x`
                // carries its sender's own bytes first, up to its share.
                let fwd = |a: usize| {
                    let share = self.node_bytes[a * nodes + bn] / gf;
                    let own = self.traffic.get(a * g + x % g, x) as f64;
                    self.from_node[x * nodes + a] - own.min(share)
                };
                let queue = |per: f64, at_once: f64| {
                    let (mut q, mut t) = (0.0, 0.0f64);
                    for &(r, a, part) in &rel {
                        q += fwd(a) * part * per;
                        t = t.max(r + q / bw);
                    }
                    t.max((q + at_once) / bw)
                };
                let t = queue(1.0, self.intra_in[x]);
                if t > end {
                    (end, at) = (t, format!("gpu{x}"));
                }
            }
        }
        (end, at)
    }

    /// How much later than its busiest link `base` a relaying candidate
    /// ends, us: its NVLink hops start at once beside the intra-node
    /// blocks, so under the simulator's fair sharing a GPU's relay hops
    /// all land about when its NVLink links have carried both (`T_nv`,
    /// the node's largest `(relayed + intra-node bytes) / b_gpu`, out or
    /// in). `hierarchical`'s phase 2 waits for the whole of phase 1: its
    /// network starts `T_nv` late. `pxn`'s NIC sends the relay's own
    /// blocks from the start and each relayed block after its own hop:
    /// a NIC ends at `max(own, T_nv) + relayed` (its own and relayed
    /// bytes' time at the mode's goodput), which is later than `base`
    /// only when `T_nv` outlasts its own blocks.
    fn relay_lag(
        &self,
        alg: Algorithm,
        relay_out: &[f64],
        relay_in: &[f64],
        own: &[f64],
        base: f64,
    ) -> f64 {
        let (g, p) = (self.g, self.p);
        let rate = self.gpu_rate.max(1e-9);
        let mut lag = 0.0f64;
        let nic = self.topo.nic_bandwidth().max(1e-9) * self.goodput;
        let mut own_x = vec![0.0f64; p];
        let mut rel_x = vec![0.0f64; p];
        for a in 0..self.nodes {
            let t_nv = (a * g..(a + 1) * g)
                .map(|s| {
                    f64::max(
                        relay_out[s] + self.intra_out[s],
                        relay_in[s] + self.intra_in[s],
                    ) / rate
                })
                .fold(0.0, f64::max);
            if alg == Algorithm::Hierarchical {
                lag = lag.max(t_nv);
                continue;
            }
            own_x.iter_mut().for_each(|x| *x = 0.0);
            rel_x.iter_mut().for_each(|x| *x = 0.0);
            for s in a * g..(a + 1) * g {
                let k = self.topo.rail_of(s);
                own_x[k] += own[s];
                rel_x[k] += relay_in[s];
            }
            for k in 0..p {
                if rel_x[k] > 0.0 {
                    let end = (own_x[k] / nic).max(t_nv) + rel_x[k] / nic;
                    lag = lag.max(end - base);
                }
            }
        }
        lag.max(0.0)
    }

    /// The busiest link's time, or, where that is a fabric link (a leaf
    /// uplink or downlink, a spine) and the flows over it cannot keep it
    /// busy to the end, [`Self::fabric_tail`]'s longer one; with the limit
    /// in words.
    fn with_fabric_tail(&mut self, c: &Priced) -> (f64, String) {
        let base = c.net.max(c.intra);
        let tail = if c.net >= c.intra {
            self.fabric_tail(c.net_link)
        } else {
            0.0
        };
        if tail > base {
            let l = c
                .net_link
                .map_or_else(String::new, |l| self.topo.link_name(l));
            (tail, format!("{l} shared to {tail:.1} us"))
        } else {
            (base, self.limit_of(c))
        }
    }

    /// `l` if it is a fabric link (a leaf's uplink or downlink).
    fn fabric_link(&self, l: Option<LinkId>) -> Option<LinkId> {
        l.filter(|&l| {
            matches!(
                self.topo.link(l).class,
                LinkClass::Uplink | LinkClass::Downlink
            )
        })
    }

    /// How long fabric link `u` takes to carry the flows routed over it
    /// when it shares itself max-min fairly among their transfers, as the
    /// simulator does: grouped by receiving NIC (each group's rate capped
    /// by that NIC's ingress), the groups' rates are water-filled (each
    /// transfer an equal share, a group at most its NIC), and when a group
    /// ends the others share what it leaves. Longer than `u`'s bytes over
    /// its capacity when a few hot NICs receive much: they cannot take
    /// the link's whole rate once the rest has ended. 0 when `u` is no
    /// fabric link.
    fn fabric_tail(&mut self, u: Option<LinkId>) -> f64 {
        let Some(u) = self.fabric_link(u) else {
            return 0.0;
        };
        let cap = self.topo.link(u).bandwidth;
        let (np, lp) = (self.nodes * self.p, self.lp);
        let mut rep_of = vec![usize::MAX; lp];
        for x in 0..np {
            if self.rep[x] != usize::MAX && rep_of[self.fab_of[x]] == usize::MAX {
                rep_of[self.fab_of[x]] = self.rep[x];
            }
        }
        // Per (leaf or group, rail) pair: 0 unknown, 1 crosses `u`, 2 not.
        let mut crosses = vec![0u8; lp * lp];
        let (mut bytes, mut weight) = (vec![0.0; np], vec![0.0; np]);
        for i in 0..self.flows.len() {
            let (x, y, b, k) = self.flows[i];
            let (fx, fy) = (self.fab_of[x], self.fab_of[y]);
            let f = fx * lp + fy;
            if crosses[f] == 0 {
                self.path.clear();
                self.topo.path_into(rep_of[fx], rep_of[fy], &mut self.path);
                crosses[f] = if self.path.contains(&u) { 1 } else { 2 };
            }
            if crosses[f] == 1 {
                bytes[y] += b;
                weight[y] += k;
            }
        }
        // (bytes left, transfers, cap) per receiving NIC.
        let mut groups: Vec<(f64, f64, f64)> = (0..np)
            .filter(|&y| bytes[y] > 0.0)
            .filter_map(|y| {
                let rx = self.nic_rx[y]?;
                Some((
                    bytes[y],
                    weight[y],
                    self.topo.link(rx).bandwidth * self.goodput,
                ))
            })
            .collect();
        let mut t = 0.0;
        let mut rate = Vec::with_capacity(groups.len());
        // Capped first: the order stays as groups end (`retain` keeps it).
        groups.sort_unstable_by(|a, b| (a.2 / a.1).total_cmp(&(b.2 / b.1)));
        while !groups.is_empty() {
            let (mut left, mut w) = (cap, groups.iter().map(|g| g.1).sum::<f64>());
            rate.clear();
            for g in &groups {
                let fair = g.1 * left / w;
                let r = fair.min(g.2);
                rate.push(r);
                left -= r;
                w -= g.1;
            }
            let dt = groups
                .iter()
                .zip(&rate)
                .map(|(g, &r)| g.0 / r)
                .fold(f64::INFINITY, f64::min);
            if !dt.is_finite() {
                break;
            }
            t += dt;
            for (g, &r) in groups.iter_mut().zip(&rate) {
                g.0 -= r * dt;
            }
            groups.retain(|g| g.0 > 1e-9 * cap);
        }
        t
    }

    /// `deepep`'s forwards, each released when the write it comes in
    /// lands: the time the last one ends, us, and the NVLink link it ends
    /// on, in words. A write (all a GPU sends to one other node) shares
    /// its sending and its receiving NIC with the other writes there as
    /// max-min fairness shares one link (processor sharing: with
    /// durations `d_1 <= .. <= d_m` on one NIC, the `j`-th ends at
    /// `d_1 + .. + d_(j-1) + (m - j + 1) d_j`), and lands when both have
    /// carried it; where a fabric link or incast makes the network slower
    /// than the NICs (`net_busy`, the busiest network link's time,
    /// `net_link` that link), the landings are stretched as much: on a
    /// fabric link, only the writes whose path crosses it (the others
    /// are held by their NICs alone), on incast every one. The forwards
    /// then queue on each
    /// NVLink link behind what was released there no earlier (the
    /// intra-node blocks, released at once, included): a link ends at the
    /// largest `r + (bytes released at r or later) / bandwidth`, exact for
    /// one link fed by jobs with release times.
    fn deepep_forwards(&self, net_busy: f64, net_link: Option<LinkId>) -> (f64, String) {
        let (g, p, nodes) = (self.g, self.p, self.nodes);
        let n = g * nodes;
        // Writes `s * nodes + b`: duration on the sending and receiving NIC.
        let mut land = vec![0.0f64; n * nodes];
        let mut order: Vec<(usize, f64, usize)> = Vec::with_capacity(n * nodes);
        for side in 0..2 {
            order.clear();
            for s in 0..n {
                let a = s / g;
                for b in (0..nodes).filter(|&b| b != a) {
                    let bytes = self.to_node[s * nodes + b];
                    if bytes == 0.0 {
                        continue;
                    }
                    let peer = b * g + s % g;
                    let (x, link, extra) = if side == 0 {
                        let x = a * p + self.topo.rail_of(s);
                        (x, self.nic_tx[x], self.per_message_us)
                    } else {
                        let y = b * p + self.topo.rail_of(peer);
                        (y, self.nic_rx[y], self.per_message_us)
                    };
                    let Some(l) = link else { continue };
                    let rate = self.topo.link(l).bandwidth * self.goodput;
                    order.push((x, bytes / rate + extra, s * nodes + b));
                }
            }
            order.sort_unstable_by(|u, v| u.0.cmp(&v.0).then(u.1.total_cmp(&v.1)));
            let mut i = 0;
            while i < order.len() {
                let nic = order[i].0;
                let m = order[i..].iter().take_while(|w| w.0 == nic).count();
                let mut before = 0.0;
                for (j, &(_, d, w)) in order[i..i + m].iter().enumerate() {
                    land[w] = land[w].max(before + (m - j) as f64 * d);
                    before += d;
                }
                i += m;
            }
        }
        let latest = land.iter().copied().fold(0.0, f64::max);
        if latest > 0.0 && net_busy > latest {
            match self.fabric_link(net_link) {
                Some(u) => self.stretch_over(u, net_busy, &mut land),
                None => {
                    let stretch = net_busy / latest;
                    land.iter_mut().for_each(|t| *t *= stretch);
                }
            }
        }
        // Each NVLink link's queue, one link at a time and without a path
        // walk: on a switch, GPU `x`'s ingress (the forwards into `x` from
        // every peer) and its egress as a peer (its forwards); on a mesh,
        // the link from peer `x` to `d`. A link ends at the largest `r +
        // (bytes released at r or later) / bandwidth`: every node's writes
        // are sorted by landing once, latest first, and each link takes
        // its own from that order; the intra-node blocks, released at
        // once, come last.
        let bw = self.topo.intra_bandwidth().max(f64::MIN_POSITIVE);
        let (mut end, mut at) = (0.0f64, String::new());
        let mut writes: Vec<(f64, usize)> = Vec::with_capacity(n);
        for bn in 0..nodes {
            writes.clear();
            writes.extend(
                (0..n)
                    .filter(|&s| s / g != bn && self.to_node[s * nodes + bn] > 0.0)
                    .map(|s| (land[s * nodes + bn], s)),
            );
            writes.sort_unstable_by(|u, v| v.0.total_cmp(&u.0));
            let node = bn * g..(bn + 1) * g;
            // The queue's end on one link: `fwd(s)` bytes of write `s`,
            // then `at_once` bytes released at 0.
            let queue = |fwd: &dyn Fn(usize) -> u64, at_once: u64| {
                let (mut queued, mut t) = (0.0, 0.0f64);
                for &(r, s) in &writes {
                    let b = fwd(s);
                    if b > 0 {
                        queued += b as f64;
                        t = t.max(r + queued / bw);
                    }
                }
                t.max((queued + at_once as f64) / bw)
            };
            let tm = self.traffic;
            for x in node.clone() {
                let peer = |s: usize| bn * g + s % g;
                if self.mesh {
                    for d in node.clone().filter(|&d| d != x) {
                        let t = queue(
                            &|s| if peer(s) == x { tm.get(s, d) } else { 0 },
                            tm.get(x, d),
                        );
                        if t > end {
                            (end, at) = (t, format!("gpu{x}->gpu{d}"));
                        }
                    }
                    continue;
                }
                let into: u64 = node.clone().filter(|&q| q != x).map(|q| tm.get(q, x)).sum();
                let t = queue(&|s| if peer(s) != x { tm.get(s, x) } else { 0 }, into);
                if t > end {
                    (end, at) = (t, format!("NVLink into gpu{x}"));
                }
                let out: u64 = node.clone().filter(|&d| d != x).map(|d| tm.get(x, d)).sum();
                let t = queue(
                    &|s| {
                        if peer(s) == x {
                            node.clone().filter(|&d| d != x).map(|d| tm.get(s, d)).sum()
                        } else {
                            0
                        }
                    },
                    out,
                );
                if t > end {
                    (end, at) = (t, format!("NVLink out of gpu{x}"));
                }
            }
        }
        (end, at)
    }

    /// `direct`'s network traffic: every NIC pair's bytes, as
    /// [`Self::route_net`] routes them, a row of `rail_bytes` at a time.
    fn route_direct(&mut self) {
        let np = self.nodes * self.p;
        let lp = self.lp;
        for x in 0..np {
            let Some(tx) = self.nic_tx[x] else { continue };
            let per_msg = self.message_bytes(tx);
            let row = &self.rail_bytes[x * np..(x + 1) * np];
            let fx = self.fab_of[x] * lp;
            let mut sum = 0.0;
            for (y, &b) in row.iter().enumerate() {
                if b == 0.0 {
                    continue;
                }
                let Some(rx) = self.nic_rx[y] else { continue };
                sum += b;
                let msgs = self.rail_msgs[x * np + y];
                self.net_msgs[x] += msgs;
                // The messages' overhead rides the whole path (the
                // simulator adds it to the transfer's bytes).
                let b = b + msgs * per_msg;
                self.flows.push((x, y, b, msgs.max(1.0)));
                self.net_rx[y] += b;
                let f = fx + self.fab_of[y];
                if self.fab_pair[f].0 == usize::MAX {
                    self.fab_pair[f] = (x, y);
                    self.fab_used.push(f);
                }
                self.fab[f] += b;
                if self.congested {
                    self.senders[rx as usize].push(tx);
                }
            }
            self.net_tx[x] += sum;
        }
    }

    /// Intra-node blocks, straight from source to destination: routed
    /// once, their link loads replayed for every later candidate.
    fn route_intra_blocks(&mut self) {
        if let Some(blocks) = self.intra_blocks.take() {
            for &(l, b) in &blocks {
                self.add(l, b);
            }
            self.intra_blocks = Some(blocks);
            return;
        }
        // Routed on their own: the loads touched now are the blocks' alone.
        let earlier = std::mem::take(&mut self.touched);
        let saved: Vec<(LinkId, f64)> = earlier
            .iter()
            .map(|&l| (l, std::mem::take(&mut self.load[l as usize])))
            .collect();
        let (g, n) = (self.g, self.g * self.nodes);
        for s in 0..n {
            let a = s / g;
            for d in a * g..(a + 1) * g {
                let b = self.traffic.get(s, d);
                if b > 0 && d != s {
                    self.route_gpu(s, d, b as f64);
                }
            }
        }
        let blocks: Vec<(LinkId, f64)> = self
            .touched
            .iter()
            .map(|&l| (l, self.load[l as usize]))
            .collect();
        for (l, b) in saved {
            self.add(l, b);
        }
        self.intra_blocks = Some(blocks);
    }

    /// `fast`'s balancing: what a GPU sends to a node beyond its share
    /// moves to a GPU of its node first; what a GPU receives beyond its
    /// share arrives through another GPU of its node.
    fn route_balancing_moves(&mut self) {
        let (g, nodes) = (self.g, self.nodes);
        for a in 0..nodes {
            for b in (0..nodes).filter(|&b| b != a) {
                let share = self.node_bytes[a * nodes + b] / g as f64;
                for l in 0..g {
                    let s = a * g + l;
                    let d = b * g + l;
                    let sent = self.to_node[s * nodes + b];
                    let recv = self.from_node[d * nodes + a];
                    // Over a switch any one peer will do; a mesh spreads
                    // the excess over every link of the GPU.
                    let peers = if self.mesh { g - 1 } else { 1 };
                    for k in 1..=peers {
                        if sent > share {
                            self.route_gpu(s, a * g + (l + k) % g, (sent - share) / peers as f64);
                        }
                        if recv > share {
                            self.route_gpu(b * g + (l + k) % g, d, (recv - share) / peers as f64);
                        }
                    }
                }
            }
        }
    }

    fn add(&mut self, l: LinkId, bytes: f64) {
        let slot = &mut self.load[l as usize];
        if *slot == 0.0 {
            self.touched.push(l);
        }
        *slot += bytes;
    }

    /// Bytes between two GPUs of one node.
    fn route_gpu(&mut self, s: usize, d: usize, bytes: f64) {
        self.path.clear();
        self.topo.path_into(s, d, &mut self.path);
        for i in 0..self.path.len() {
            let l = self.path[i];
            self.add(l, bytes);
        }
    }

    /// Bytes from NIC `x` to NIC `y` (`node * p + rail`) on different
    /// nodes, without a path walk: a NIC's egress carries what it sends, an
    /// ingress what it receives, and a fabric link (uplink, downlink)
    /// depends only on the (leaf or group, rail) of each end, so
    /// [`Self::flush_net`] prices the fabric with one path per such pair.
    fn route_net(&mut self, x: usize, y: usize, bytes: f64, msgs: f64) {
        if bytes == 0.0 {
            return;
        }
        let (Some(tx), Some(rx)) = (self.nic_tx[x], self.nic_rx[y]) else {
            return;
        };
        self.net_tx[x] += bytes;
        self.net_msgs[x] += msgs;
        // The egress gets the messages' overhead in `flush_net`; the rest
        // of the path carries it too.
        let bytes = bytes + msgs * self.message_bytes(tx);
        self.net_rx[y] += bytes;
        self.flows.push((x, y, bytes, msgs.max(1.0)));
        let f = self.fab_of[x] * self.lp + self.fab_of[y];
        if self.fab_pair[f].0 == usize::MAX {
            self.fab_pair[f] = (x, y);
            self.fab_used.push(f);
        }
        self.fab[f] += bytes;
        if self.congested {
            self.senders[rx as usize].push(tx);
        }
    }

    /// A message's overhead in bytes on NIC egress `tx`: `per_message_us`
    /// at its goodput, as the simulator charges it (0 in `ideal`).
    fn message_bytes(&self, tx: LinkId) -> f64 {
        self.per_message_us * self.topo.link(tx).bandwidth * self.goodput
    }

    /// Moves the aggregated network bytes onto their links.
    fn flush_net(&mut self) {
        for x in 0..self.net_tx.len() {
            let t = std::mem::take(&mut self.net_tx[x]);
            let m = std::mem::take(&mut self.net_msgs[x]);
            if let (true, Some(l)) = (t > 0.0, self.nic_tx[x]) {
                // Each message costs `per_message_us` of egress at goodput.
                let extra = m * self.per_message_us * self.topo.link(l).bandwidth * self.goodput;
                self.add(l, t + extra);
            }
            let r = std::mem::take(&mut self.net_rx[x]);
            if let (true, Some(l)) = (r > 0.0, self.nic_rx[x]) {
                self.add(l, r);
            }
        }
        let used = std::mem::take(&mut self.fab_used);
        for &f in &used {
            let (x, y) = std::mem::replace(&mut self.fab_pair[f], (usize::MAX, usize::MAX));
            let b = std::mem::take(&mut self.fab[f]);
            self.path.clear();
            self.topo
                .path_into(self.rep[x], self.rep[y], &mut self.path);
            for i in 0..self.path.len() {
                let l = self.path[i];
                if matches!(
                    self.topo.link(l).class,
                    LinkClass::Uplink | LinkClass::Downlink | LinkClass::Generic
                ) {
                    self.add(l, b);
                }
            }
        }
        self.fab_used = used;
        self.fab_used.clear();
    }

    /// The busiest network and intra-node links of the loads routed since
    /// the last call, which it clears.
    fn price(&mut self) -> Priced {
        self.flush_net();
        let mut c = Priced::default();
        let touched = std::mem::take(&mut self.touched);
        // Congested: a NIC ingress heard by more NICs at once than the
        // incast threshold delivers less, and (head-of-line blocking) holds
        // back the NICs sending to it as much.
        // Each link's efficiency: the lowest of its own ingress and of
        // the ingresses it sends to (one pass over the sender lists).
        if self.congested {
            for &l in &touched {
                let s = &mut self.senders[l as usize];
                if s.is_empty() {
                    continue;
                }
                s.sort_unstable();
                s.dedup();
                let x = self.model.efficiency(s.len() as u32);
                if x < 1.0 {
                    self.eff[l as usize] = self.eff[l as usize].min(x);
                    for &t in &self.senders[l as usize] {
                        self.eff[t as usize] = self.eff[t as usize].min(x);
                    }
                }
            }
        }
        for &l in &touched {
            let link = self.topo.link(l);
            let bytes = self.load[l as usize];
            match link.class {
                LinkClass::NvlinkIn | LinkClass::NvlinkOut => {
                    let t = bytes / link.bandwidth;
                    if t > c.intra {
                        c.intra = t;
                        c.intra_link = Some(l);
                    }
                }
                LinkClass::PcieIn | LinkClass::PcieOut => {}
                class => {
                    let e =
                        if self.congested && matches!(class, LinkClass::NicTx | LinkClass::NicRx) {
                            self.eff[l as usize]
                        } else {
                            1.0
                        };
                    let g = if matches!(class, LinkClass::NicTx | LinkClass::NicRx) {
                        self.goodput
                    } else {
                        1.0
                    };
                    let t = bytes / (link.bandwidth * g * e);
                    if t > c.net {
                        c.net = t;
                        c.net_link = Some(l);
                    }
                }
            }
        }
        for &l in &touched {
            self.load[l as usize] = 0.0;
            self.senders[l as usize].clear();
            self.eff[l as usize] = 1.0;
        }
        self.touched = touched;
        self.touched.clear();
        c
    }

    fn limit_of(&self, c: &Priced) -> String {
        let (l, t) = if c.net >= c.intra {
            (c.net_link, c.net)
        } else {
            (c.intra_link, c.intra)
        };
        match l {
            Some(l) => format!("{} busy {:.1} us", self.topo.link_name(l), t),
            None => "latency".into(),
        }
    }
}

/// `fast`'s node stages replayed as fluid flows (`pairs` sorted by stage):
/// each pair is one flow of its bytes, from its
/// sending node's NICs (`rate` bytes/us together) to its receiving node's,
/// over its leaves' uplink and downlink where the two nodes are on
/// different leaves (`leaf[a]`, `fabric[l]` bytes/us each way; no fabric
/// link where `fabric` is empty). A flow starts once every earlier flow of
/// its sender and of its receiver has started and those still moving hold
/// at most `window` bytes (the lanes' sends in flight), and the flows
/// moving share each NIC side and fabric link max-min fairly, as the
/// simulator shares a link between transfers. Returns when the last flow
/// ends, us. Where no fabric link is shared this is the stage chains'
/// dataflow ([`StageChains`]); where a leaf's downlink carries a hot
/// receiver's crossing pair beside its leaf-mates' crossing pairs, the hot
/// receiver's NICs idle for the share they lose (4x8 fat-tree Zipf 1.5:
/// docs/benchmarks.md, "`auto`'s `fast` estimate replays its stages").
/// One event per flow end and per node whose bytes in flight fall to the
/// window, each a max-min fill over the moving flows.
fn fluid_stage_end(
    nodes: usize,
    pairs: &[StagePair],
    leaf: &[usize],
    fabric: &[f64],
    rate: f64,
    window: f64,
) -> f64 {
    if nodes < 2 || pairs.is_empty() || rate <= 0.0 {
        return 0.0;
    }
    let f = pairs.len();
    let leaves = fabric.len();
    // Resources: NIC egress per node, NIC ingress per node, then uplinks
    // and downlinks per leaf; each flow's (two, or four when it crosses).
    let nr = 2 * nodes + 2 * leaves;
    let none = usize::MAX;
    let res: Vec<[usize; 4]> = pairs
        .iter()
        .map(|p| {
            let (a, b) = (p.src_node as usize, p.dst_node as usize);
            if leaves > 0 && leaf[a] != leaf[b] {
                [
                    a,
                    nodes + b,
                    2 * nodes + leaf[a],
                    2 * nodes + leaves + leaf[b],
                ]
            } else {
                [a, nodes + b, none, none]
            }
        })
        .collect();
    // Each node's flows out and in, in stage order, and the next to start.
    let mut out_q: Vec<Vec<usize>> = vec![Vec::new(); nodes];
    let mut in_q: Vec<Vec<usize>> = vec![Vec::new(); nodes];
    for (i, p) in pairs.iter().enumerate() {
        out_q[p.src_node as usize].push(i);
        in_q[p.dst_node as usize].push(i);
    }
    let (mut out_next, mut in_next) = (vec![0usize; nodes], vec![0usize; nodes]);
    let mut rem: Vec<f64> = pairs.iter().map(|p| p.bytes as f64).collect();
    // Bytes still to move out of / into each node (flows started, not
    // done), and the rate they move at.
    let mut held = vec![0.0f64; 2 * nodes];
    let mut held_rate = vec![0.0f64; 2 * nodes];
    let mut moving: Vec<usize> = Vec::with_capacity(4 * nodes);
    let mut flow_rate = vec![0.0f64; f];
    let mut frozen: Vec<bool> = Vec::with_capacity(4 * nodes);
    let (mut start, mut fill) = (vec![0usize; nr + 1], vec![0usize; nr]);
    let mut on: Vec<usize> = Vec::new();
    let mut share = vec![0.0f64; nr];
    let mut cap = vec![0.0f64; nr];
    let mut count = vec![0usize; nr];
    // What rounding leaves of a flow's or a node's bytes: a billionth of
    // the largest pair (events are exact, so this only absorbs rounding).
    let eps = 1e-9 * rem.iter().copied().fold(1.0, f64::max);
    let mut now = 0.0f64;
    let mut done = 0usize;
    // Each event ends a flow or brings what a node holds down to the
    // window, once per flow started at the node as sender or receiver:
    // at most `3 f` (the bound only guards against rounding).
    let mut events = 0;
    while done < f && events <= 3 * f + 2 {
        events += 1;
        // Start every flow that may start, in passes over the senders
        // until none starts: a start makes its flow no longer the next of
        // its receiver, which can let an earlier sender's next flow start.
        let mut started = true;
        while started {
            started = false;
            for a in 0..nodes {
                while let Some(&i) = out_q[a].get(out_next[a]) {
                    let b = pairs[i].dst_node as usize;
                    if in_q[b].get(in_next[b]) != Some(&i)
                        || held[a] > window + eps
                        || held[nodes + b] > window + eps
                    {
                        break;
                    }
                    out_next[a] += 1;
                    in_next[b] += 1;
                    held[a] += rem[i];
                    held[nodes + b] += rem[i];
                    moving.push(i);
                    started = true;
                }
            }
        }
        if moving.is_empty() {
            break;
        }
        // Max-min rates: the flows' rates rise together; every resource
        // whose share is the lowest freezes its flows at it.
        cap[..2 * nodes].fill(rate);
        cap[2 * nodes..2 * nodes + leaves].copy_from_slice(fabric);
        cap[2 * nodes + leaves..].copy_from_slice(fabric);
        count.fill(0);
        for &i in &moving {
            for &r in res[i].iter().filter(|&&r| r != none) {
                count[r] += 1;
            }
        }
        // Each resource's moving flows (by their place in `moving`).
        start[0] = 0;
        for r in 0..nr {
            start[r + 1] = start[r] + count[r];
        }
        fill[..nr].copy_from_slice(&start[..nr]);
        on.resize(start[nr], 0);
        for (k, &i) in moving.iter().enumerate() {
            for &r in res[i].iter().filter(|&&r| r != none) {
                on[fill[r]] = k;
                fill[r] += 1;
            }
        }
        frozen.clear();
        frozen.resize(moving.len(), false);
        for r in 0..nr {
            share[r] = if count[r] > 0 {
                cap[r] / count[r] as f64
            } else {
                f64::INFINITY
            };
        }
        loop {
            let low = share.iter().copied().fold(f64::INFINITY, f64::min);
            if !low.is_finite() {
                break;
            }
            // Every resource at the lowest share (ties are common: idle
            // NICs) freezes its flows at it; the others' shares only rise.
            let tight = low * (1.0 + 1e-12);
            for r0 in 0..nr {
                if share[r0] > tight {
                    continue;
                }
                for &k in &on[start[r0]..start[r0 + 1]] {
                    if frozen[k] {
                        continue;
                    }
                    frozen[k] = true;
                    let i = moving[k];
                    flow_rate[i] = low;
                    for &r in res[i].iter().filter(|&&r| r != none) {
                        cap[r] -= low;
                        count[r] -= 1;
                        share[r] = if count[r] > 0 {
                            cap[r].max(0.0) / count[r] as f64
                        } else {
                            f64::INFINITY
                        };
                    }
                }
            }
        }
        // The next event: a flow ends, or what a node holds falls to the
        // window so that its next flow may start.
        held_rate.fill(0.0);
        let mut dt = f64::INFINITY;
        for &i in &moving {
            let v = flow_rate[i];
            if v > 0.0 {
                dt = dt.min(rem[i] / v);
            }
            held_rate[pairs[i].src_node as usize] += v;
            held_rate[nodes + pairs[i].dst_node as usize] += v;
        }
        for (h, v) in held.iter().zip(&held_rate) {
            if *h > window + eps && *v > 0.0 {
                dt = dt.min((h - window) / v);
            }
        }
        if !dt.is_finite() {
            break;
        }
        now += dt;
        moving.retain(|&i| {
            let moved = (flow_rate[i] * dt).min(rem[i]);
            rem[i] -= moved;
            let (a, b) = (
                pairs[i].src_node as usize,
                nodes + pairs[i].dst_node as usize,
            );
            held[a] = (held[a] - moved).max(0.0);
            held[b] = (held[b] - moved).max(0.0);
            if rem[i] <= eps {
                done += 1;
                false
            } else {
                true
            }
        });
    }
    now
}

/// At most this many stage pairs are replayed ([`fluid_stage_end`]): its
/// work grows with the pairs times the flows moving at once (several per
/// node where a layered list's parts are smaller than a lane's sends in
/// flight). At 8x8 DGX-H100 on a 2:1 fat-tree in `ideal` (callgrind,
/// instructions of `choose` over the sweep's seven matrices) the replay
/// adds 22% with this cap and 194% without one, where the sweep's picks
/// are the same (four `fast` estimates at 4x8 and 8x8 move, by at most
/// 0.8%) (docs/benchmarks.md, "`auto`'s `fast` estimate replays its
/// stages").
const REPLAY_MAX_PAIRS: usize = 128;

/// `fast`'s pipeline ends over its busiest link (docs/algorithms.md, `auto`).
const FAST_ENDS: f64 = 0.03;

/// [`FAST_ENDS`] where `fast`'s node stages are one stage (two nodes, each
/// pair sent whole: no lane ever changes partner) and a NIC or NVLink link
/// binds: the pipeline's ends alone. On the sweep's 2x8 full-bisection and
/// rail cases of one stage (seeds 7, 107, 207) the simulator shows
/// 1.2-2.1% over the busiest link (medians by preset and mode), where 3%
/// put `fast` behind `direct` (2x8 DGX-H100 Zipf 0 seed 207, ideal) and
/// `deepep` (2x8 MI300X Zipf 0.5 seed 207, calibrated) by up to 1.5%
/// (docs/benchmarks.md, issue 20 §5 of 2026-12-04, "one stage"). Not on
/// a fabric link: on the 2:1 fat-trees one stage simulated 5-7% over the
/// uplink in the calibrated mode, its taper's messages on the uplink
/// ([`FAST_TAPER_PATH_ONE_STAGE`]), not a shorter pipeline end.
const FAST_ENDS_ONE_STAGE: f64 = 0.015;

/// How much longer each pair of `fast`'s rotation stages (whole node pairs,
/// sched/fast/emit.rs `NodeStages`) takes than its bytes at the node's rate,
/// on at most what a lane's sends in flight hold
/// ([`StageChains::end_drifting`]): the lanes of a node drift apart at
/// every change of partner (8x8 DGX-H100 Zipf 0 seed 7: the last stage's
/// lanes end 307-318 us, a stage takes 45 us for 42 us of bytes). Fitted
/// on the sweep's rotation cases in `ideal` at 8 nodes (seeds 7 and 107,
/// 2.3 us per stage of 42 us on Zipf 0, 9.6 of 170 on log-normal) and 4x8
/// Zipf 0 seed 207 (4.8 of 85; seed 107: 1.7-2.7); docs/benchmarks.md,
/// issue 20 §5 of 2026-12-04.
const ROTATION_DRIFT: f64 = 0.055;

/// `fast`'s taper: messages per lane its last sends in flight add to its
/// sending NIC, and how many of them are priced on the whole path (the
/// receiving NIC and the fabric links too, which the simulator charges a
/// message's overhead on). On the 2:1 fat-trees the plans send 2.5-3 more
/// messages per lane over the uplinks than `⌈w / G / c⌉` (docs/algorithms.md,
/// `auto`, "Messages per NIC").
const FAST_TAPER: f64 = 8.0;
const FAST_TAPER_PATH: f64 = 2.0;

/// [`FAST_TAPER_PATH`] where `fast`'s node stages are one stage (two
/// nodes, each pair whole). On the sweep's 2x8 fat-trees, calibrated, one
/// stage simulated 1.4-4.1% over its estimate with 2 (the uplink binds,
/// and its plans send about 14 transfers per lane over it where the
/// estimate counted 10), 0.997-1.022 with 4; 3, 4 and 5 fix the sweep's
/// one such miss and leave no case worse, 6 and 8 move two and six cases
/// above 1% (seeds 7, 107, 207; held-out seed 307 unchanged at 3-5;
/// docs/benchmarks.md, issue 20 §5 of 2026-12-04). Fitted: the middle of
/// that range.
const FAST_TAPER_PATH_ONE_STAGE: f64 = 4.0;

/// Where `fast`'s mesh relief stops (sched/fast/mesh.rs, `MIN_RELAY_BYTES`
/// and `MIN_GAIN`): a step moves at least 64 KiB and 1% of its link.
/// `spray`'s pipeline ends: its busiest link's time stretched by this
/// fraction (its first sends wait for their balancing moves, each lane's
/// chain pays its latencies, its last sends are forwarded after), as
/// `FAST_ENDS` for `fast`. On the `auto_sweep` estimates-alone sweep
/// (2-4 nodes seeds 7-307, 8 nodes seeds 7-307, 16 nodes seed 7; 882
/// case-modes), against `auto`'s picks before `spray` was pipelined: 0.04
/// put 30 picks more than 0.5% slower, 0.05 9 (35 faster), 0.06 5 (28
/// faster), none 45 (docs/benchmarks.md, "`spray` pipelines each relayed
/// block into its forward").
const SPRAY_ENDS: f64 = 0.05;
/// `spray`'s forwards: at most this many release times per node pair
/// (`spray_forwards`), which bounds the estimate's cost; a pair of more
/// sends is priced as released in this many equal parts.
const SPRAY_STEPS: f64 = 16.0;
const MESH_MIN_RELAY: f64 = (64 << 10) as f64;
const MESH_MIN_GAIN: f64 = 0.01;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bound::cut_bound;
    use crate::generate::{generate, Pattern, TrafficSpec};
    use crate::sched::{schedule, Options};
    use crate::verify::verify_on;

    fn traffic(ranks: usize, pattern: Pattern, seed: u64) -> TrafficMatrix {
        let mut spec = TrafficSpec::new(ranks, pattern);
        spec.seed = seed;
        spec.gpus_per_node = 4;
        spec.bytes = 1 << 20;
        spec.moe.tokens_per_rank = 1024;
        generate(&spec).unwrap()
    }

    #[test]
    fn the_plan_is_the_named_algorithms_own() {
        let topo = Topology::preset("dgx-h100", 3, Some(4)).unwrap();
        for (i, pattern) in [
            Pattern::Zipf(0.0),
            Pattern::Zipf(1.2),
            Pattern::Hotspot(0.4),
        ]
        .into_iter()
        .enumerate()
        {
            let m = traffic(12, pattern, i as u64);
            for net in [Network::Ideal, Network::Congested] {
                let (plan, choice) = auto(&topo, &m, net).unwrap();
                // For the same network: `fast` sizes its chunks by its
                // per-message cost.
                let opts = Options {
                    network: net,
                    ..Options::default()
                };
                let named = schedule(choice.algorithm(), &topo, &m, &opts).unwrap();
                assert_eq!(plan, named, "{}", choice.chosen);
                assert_eq!(plan.algorithm, choice.chosen);
                assert_eq!(choice.estimates.len(), CANDIDATES.len());
                assert!(choice
                    .estimates
                    .windows(2)
                    .all(|w| w[0].estimate_us <= w[1].estimate_us));
                verify_on(&plan, &m, &topo).unwrap();
            }
        }
    }

    /// Candidate `a`'s plan for `m`, simulated.
    /// Planned for the mode, as `auto` plans it (`fast`'s chunks).
    fn simulated_us(topo: &Topology, m: &TrafficMatrix, opts: &SimOptions, a: Algorithm) -> f64 {
        let plan_opts = Options {
            network: opts.network,
            ..Options::default()
        };
        let p = schedule(a, topo, m, &plan_opts).unwrap();
        simulate(topo, &p, opts).unwrap().completion_us
    }

    /// The estimates alone (`choose`) pick a plan that simulates within 1%
    /// of the best candidate's.
    fn assert_alone_within_1pct(topo: &Topology, m: &TrafficMatrix, net: Network) {
        let opts = SimOptions::new(net);
        let best = best_candidate_us(topo, m, &opts);
        let alone = choose(topo, m, net);
        let got = simulated_us(topo, m, &opts, alone.algorithm());
        assert!(got <= best * 1.01, "{} {got} vs best {best}", alone.chosen);
    }

    /// The fastest of the candidates' plans for `m`, simulated.
    fn best_candidate_us(topo: &Topology, m: &TrafficMatrix, opts: &SimOptions) -> f64 {
        CANDIDATES
            .iter()
            .map(|&a| simulated_us(topo, m, opts, a))
            .fold(f64::INFINITY, f64::min)
    }

    #[test]
    fn picks_what_the_simulator_says_is_best() {
        let topo = Topology::preset("dgx-h100", 2, Some(4)).unwrap();
        // Uniform: nothing to balance, `direct` finishes first. One hot
        // receiver: balancing (`fast`) wins by far.
        let mut hot = TrafficMatrix::uniform(8, 64 << 10);
        for s in 0..4 {
            hot.set(s, 5, 8 << 20);
        }
        for m in [TrafficMatrix::uniform(8, 1 << 20), hot] {
            for net in [Network::Ideal, Network::Calibrated, Network::Stress] {
                let opts = SimOptions::new(net);
                let time = |a: Algorithm| simulated_us(&topo, &m, &opts, a);
                let best = best_candidate_us(&topo, &m, &opts);
                let choice = choose(&topo, &m, net);
                let got = time(choice.algorithm());
                assert!(
                    got <= best * 1.01,
                    "{net}: {} {got} vs best {best}: {choice:?}",
                    choice.chosen
                );
                assert!(got >= cut_bound(&topo, &m).cut_us * (1.0 - 1e-9));
            }
        }
    }

    /// The aggregated network routing (NIC sums, one path per (leaf or
    /// group, rail) pair) loads every link and hears every sender as one
    /// path per NIC pair does.
    #[test]
    fn aggregated_routing_matches_a_path_per_nic_pair() {
        use crate::topology::{FabricSpec, TopologySpec};
        for (fabric, nodes) in [
            (None, 3),
            (Some(FabricSpec::fat_tree(2, 2.0, 1.0)), 4),
            (Some(FabricSpec::rail_optimized(Some(2), 2.0, 1.0)), 4),
        ] {
            let mut spec = TopologySpec::preset("dgx-h100", nodes, Some(4)).unwrap();
            spec.fabric = fabric;
            let topo = Topology::from_spec(spec, "t").unwrap();
            let m = traffic(topo.ranks(), Pattern::Hotspot(0.4), 3);
            let mut e = Estimator::new(&topo, &m, Network::Stress);
            // Bytes only: no per-message cost on the egress links.
            e.per_message_us = 0.0;
            e.route_direct();
            e.flush_net();
            let np = e.nodes * e.p;
            let mut load = vec![0.0; topo.num_links()];
            let mut senders = vec![Vec::new(); topo.num_links()];
            for x in 0..np {
                for y in 0..np {
                    let b = e.rail_bytes[x * np + y];
                    if b == 0.0 {
                        continue;
                    }
                    let path = topo.path(e.rep[x], e.rep[y]);
                    for &l in &path {
                        match topo.link(l).class {
                            LinkClass::PcieIn | LinkClass::PcieOut => {}
                            LinkClass::NicRx => {
                                senders[l as usize].push(path[1]);
                                load[l as usize] += b;
                            }
                            _ => load[l as usize] += b,
                        }
                    }
                }
            }
            assert!(load.iter().any(|&b| b > 0.0));
            for (l, (&a, &w)) in e.load.iter().zip(&load).enumerate() {
                assert!((a - w).abs() <= 1e-9 * w.max(1.0), "link {l}: {a} vs {w}");
                assert_eq!(e.senders[l], senders[l], "link {l}");
            }
        }
    }

    /// Candidate `a`'s estimate and its plan's simulated completion on `m`.
    fn estimated_and_simulated(
        topo: &Topology,
        m: &TrafficMatrix,
        net: Network,
        a: Algorithm,
    ) -> (f64, f64) {
        let choice = choose(topo, m, net);
        let est = choice.estimate_of(a).unwrap();
        (est, simulated_us(topo, m, &SimOptions::new(net), a))
    }

    /// Two 4-GPU nodes, one per leaf of a 2:1 fat-tree (the uplink carries
    /// two NICs' rate), and four writes across it, each to its sender's own
    /// local index: GPU 0 sends 4 MiB, GPUs 1-3 2 MiB each.
    fn uplink_shared_by_four() -> (Topology, TrafficMatrix) {
        use crate::topology::{FabricSpec, TopologySpec};
        let mut spec = TopologySpec::preset("dgx-h100", 2, Some(4)).unwrap();
        spec.fabric = Some(FabricSpec::fat_tree(1, 2.0, 1.0));
        let topo = Topology::from_spec(spec, "t").unwrap();
        let mut m = TrafficMatrix::zeros(8);
        m.set(0, 4, 4 << 20);
        for s in 1..4 {
            m.set(s, 4 + s, 2 << 20);
        }
        (topo, m)
    }

    /// `deepep` over a 2:1 fat-tree with one node per leaf, every GPU
    /// writing to its own local index (no forwards): its network is the
    /// uplink shared max-min by the four receiving NICs, by hand: each gets
    /// `U / 4 = b / 2` until the 2 MiB writes end at `4 MiB / b`, then the
    /// hot one its NIC's `b` for its last 2 MiB: `6 MiB / b` in all, where
    /// the uplink's bytes over its rate say `5 MiB / b`.
    #[test]
    fn deepep_shares_a_fabric_link_as_the_simulator_does() {
        let (topo, m) = uplink_shared_by_four();
        let b = topo.nic_bandwidth();
        let up = (0..topo.num_links() as LinkId)
            .find(|&l| topo.link(l).class == LinkClass::Uplink)
            .unwrap();
        assert_eq!(topo.link(up).bandwidth, 2.0 * b);
        let (inter, hop) = (topo.path_latency(0, 4), topo.path_latency(0, 1));
        let by_hand = (6u64 << 20) as f64 / b + inter + hop;
        let (est, sim) = estimated_and_simulated(&topo, &m, Network::Ideal, Algorithm::Deepep);
        assert!(
            (est - by_hand).abs() <= 1e-6 * by_hand,
            "{est} vs {by_hand}"
        );
        // The plan has no forwards: the simulator says the same, but the hop.
        assert!((est - hop - sim).abs() <= 1e-6 * sim, "{est} vs {sim}");
    }

    /// `fast` on a 2:1 fat-tree with one node per leaf (uniform 1 MiB
    /// pairs, calibrated): the uplink binds, and it carries each lane's
    /// `⌈w / G / c⌉` messages plus `FAST_TAPER_PATH` of its taper's (its
    /// node stages are three), each `per_message_us` at its NIC's goodput
    /// rate, as the simulator charges a message on every link of its path.
    /// Where the node stages are one stage, `FAST_TAPER_PATH_ONE_STAGE`:
    /// the sweep's 2x8 MI300X fat-tree Zipf 1.0 seed 209, calibrated
    /// (`fast` was estimated ahead of `deepep`, 1.023x the best), is right
    /// by the estimates alone.
    #[test]
    fn fast_taper_messages_ride_the_fabric_links() {
        use crate::topology::{FabricSpec, TopologySpec};
        let mut spec = TopologySpec::preset("dgx-h100", 2, None).unwrap();
        spec.fabric = Some(FabricSpec::fat_tree(1, 2.0, 1.0));
        let topo = Topology::from_spec(spec, "t").unwrap();
        let m = TrafficMatrix::uniform(16, 1 << 20);
        let net = Network::Calibrated;
        let e = Estimator::new(&topo, &m, net);
        let cal = SimOptions::new(net).calibration;
        let b = topo.nic_bandwidth();
        let up = (0..topo.num_links() as LinkId)
            .find(|&l| topo.link(l).class == LinkClass::Uplink)
            .unwrap();
        let u = topo.link(up).bandwidth;
        assert_eq!(u, 4.0 * b);
        // Node 0 sends node 1 64 MiB, 8 MiB per lane.
        let share = (8u64 << 20) as f64;
        let (pairs, rotated) = e.fast_stages();
        assert!(pairs.iter().any(|p| p.stage > 0), "stages: {pairs:?}");
        let msgs = (share / e.chunk).ceil() + FAST_TAPER_PATH;
        let message = cal.per_message_us * b * cal.nic_goodput;
        let uplink = ((64u64 << 20) as f64 + 8.0 * msgs * message) / u;
        // Above what the sending NIC takes (its data at goodput, 8 MiB,
        // and all its messages).
        let nic = share / (b * cal.nic_goodput)
            + ((share / e.chunk).ceil() + FAST_TAPER) * cal.per_message_us;
        assert!(uplink > nic, "{uplink} vs {nic}");
        let (p_st, chains) = (
            e.fast_stage_messages(&pairs),
            e.fast_stage_flow(&pairs, rotated),
        );
        let (inter, hop) = (topo.path_latency(0, 8), topo.path_latency(0, 1));
        let by_hand = ((uplink + p_st) * (1.0 + FAST_ENDS)).max(chains) + inter + 2.0 * hop;
        let est = choose(&topo, &m, net).estimate_of(Algorithm::Fast).unwrap();
        assert!(
            (est - by_hand).abs() <= 1e-6 * by_hand,
            "{est} vs {by_hand}"
        );
        // One stage, on the sweep's MI300X case.
        let mut spec = TopologySpec::preset("mi300x", 2, None).unwrap();
        spec.fabric = Some(FabricSpec::fat_tree(1, 2.0, 1.0));
        let topo = Topology::from_spec(spec, "t").unwrap();
        let m = sweep_traffic(&topo, Pattern::Zipf(1.0), 209);
        let e = Estimator::new(&topo, &m, net);
        assert!(e.fast_stages().0.iter().all(|p| p.stage == 0));
        assert_alone_within_1pct(&topo, &m, net);
    }

    /// A fat-tree leaf uplink shared max-min fairly: one node per leaf at
    /// 2:1, one transfer per rail, the rail-0 receiver hot. While all four
    /// move, each gets a quarter of the uplink (half a NIC); once the cold
    /// ones end, the hot one alone is held to its NIC and the uplink idles
    /// half. `direct`'s estimate follows that (not the uplink's bytes over
    /// its capacity, which it exceeds) and equals the simulated time: one
    /// link shared by transfers capped by their NICs is what the
    /// water-filling computes exactly.
    #[test]
    fn a_shared_fabric_link_is_priced_as_the_simulator_shares_it() {
        let (topo, m) = uplink_shared_by_four();
        for net in [Network::Ideal, Network::Calibrated] {
            let (est, sim) = estimated_and_simulated(&topo, &m, net, Algorithm::Direct);
            assert!((est - sim).abs() <= 1e-6 * sim, "{net}: {est} vs {sim}");
        }
        // The uplink alone would say less: 10 MiB over two NICs' rate.
        let up = (0..topo.num_links() as LinkId)
            .find(|&l| topo.link(l).class == LinkClass::Uplink)
            .unwrap();
        let plain = (10u64 << 20) as f64 / topo.link(up).bandwidth + topo.path_latency(0, 4);
        let (est, _) = estimated_and_simulated(&topo, &m, Network::Ideal, Algorithm::Direct);
        assert!(est > 1.1 * plain, "{est} vs {plain}");
    }

    /// `deepep`'s forwards wait for the write they come in: two writes on
    /// their own rails land at different times and both forward into GPU
    /// 6, whose NVLink ingress takes them one after the other. The estimate
    /// (writes, then forwards queued on that link by release time) equals
    /// the simulated time; the old `½ X_fwd / b_gpu` lag was short of it.
    #[test]
    fn deepep_forwards_wait_for_their_writes() {
        let topo = Topology::preset("dgx-h100", 2, Some(4)).unwrap();
        let mut m = TrafficMatrix::zeros(8);
        m.set(0, 6, 1 << 20);
        m.set(1, 6, 3 << 20);
        for net in [Network::Ideal, Network::Calibrated] {
            let (est, sim) = estimated_and_simulated(&topo, &m, net, Algorithm::Deepep);
            assert!((est - sim).abs() <= 1e-6 * sim, "{net}: {est} vs {sim}");
        }
    }

    /// Regression (the sweep's 2x8 DGX-H100, MoE Zipf 0): in the calibrated
    /// mode `fast`'s many chunks pay 3 us each and `deepep` wins; estimates
    /// without the per-message cost chose `fast`, 1.20x the best.
    #[test]
    fn calibrated_mode_prices_messages() {
        let topo = Topology::preset("dgx-h100", 2, None).unwrap();
        let mut spec = TrafficSpec::new(topo.ranks(), Pattern::Zipf(0.0));
        spec.seed = 7;
        spec.gpus_per_node = topo.gpus_per_node();
        spec.bytes = 1 << 20;
        spec.moe.tokens_per_rank = 1024;
        let m = generate(&spec).unwrap();
        let opts = SimOptions::new(Network::Calibrated);
        let plan_opts = Options {
            network: Network::Calibrated,
            ..Options::default()
        };
        let time = |a: Algorithm| {
            let p = schedule(a, &topo, &m, &plan_opts).unwrap();
            simulate(&topo, &p, &opts).unwrap().completion_us
        };
        let best = CANDIDATES
            .iter()
            .map(|&a| time(a))
            .fold(f64::INFINITY, f64::min);
        let choice = choose(&topo, &m, Network::Calibrated);
        let got = time(choice.algorithm());
        assert!(got <= best * 1.01, "{} {got} vs best {best}", choice.chosen);
    }

    /// `fast`'s stages each cost every lane a message at least: on 8x8
    /// DGX-H100, near-uniform MoE traffic (the sweep's Zipf 0), its ~25
    /// stages send ~12% more NIC time in messages in the calibrated mode
    /// than the node pairs sent in one piece would. Without that term the
    /// estimate was 0.89 of the simulated time (where `fast` is 1.25x
    /// `deepep`: an estimate that low can rank it first); with it,
    /// within 4%. In `ideal` there is no per-message cost and the term
    /// is 0.
    #[test]
    fn fast_pays_a_message_per_lane_and_stage() {
        let topo = Topology::preset("dgx-h100", 8, None).unwrap();
        let m = sweep_traffic(&topo, Pattern::Zipf(0.0), 7);
        let (est, sim) = estimated_and_simulated(&topo, &m, Network::Calibrated, Algorithm::Fast);
        assert!(
            (sim / est - 1.0).abs() < 0.04,
            "fast: estimated {est}, simulated {sim}"
        );
        let choice = choose(&topo, &m, Network::Calibrated);
        let fast = choice
            .estimates
            .iter()
            .find(|e| e.algorithm == "fast")
            .unwrap();
        assert!(fast.limit.contains("stage messages"), "{}", fast.limit);
        let mut e = Estimator::new(&topo, &m, Network::Ideal);
        assert_eq!(e.fast_stage_messages(&e.fast_stages().0), 0.0);
        e = Estimator::new(&topo, &m, Network::Calibrated);
        let base = e.estimate(Algorithm::Fast).estimate_us;
        let extra = e.fast_stage_messages(&e.fast_stages().0);
        assert!(
            extra > 0.08 * base && extra < 0.16 * base,
            "{extra} of {base}"
        );
    }

    /// A residual of the per-batch choice pinned (issue 20 §5): on the
    /// sweep's 4x8 DGX-H100 fat-tree 2:1 with two nodes per leaf (Zipf
    /// 0.5, ideal), `fast`'s estimate carried a fixed +15% for leaf
    /// uplinks that bind (1.18x its busiest link, simulated 1.04x), so the
    /// estimates alone chose `deepep`, 1.034x the best. `fast`'s layered
    /// stages balance the uplinks; its estimate now follows its stages'
    /// chains, and the estimates alone pick within 1% of the best
    /// of the others. (Since `spray` chains each lane's sends its plan is
    /// the best here, 366.7 us against `fast`'s 371.2, and the estimates
    /// alone still pick `fast`, 1.2% behind: one of the misses recorded in
    /// docs/benchmarks.md, "`spray` pipelines each relayed block into its
    /// forward".)
    #[test]
    fn fast_on_leaf_pairs_is_estimated_by_its_stages() {
        use crate::topology::{FabricSpec, TopologySpec};
        let mut spec = TopologySpec::preset("dgx-h100", 4, None).unwrap();
        spec.fabric = Some(FabricSpec::fat_tree(2, 2.0, 1.0));
        let topo = Topology::from_spec(spec, "t").unwrap();
        let m = sweep_traffic(&topo, Pattern::Zipf(0.5), 8);
        let opts = SimOptions::new(Network::Ideal);
        let best = CANDIDATES
            .iter()
            .filter(|&&a| a != Algorithm::Spray)
            .map(|&a| simulated_us(&topo, &m, &opts, a))
            .fold(f64::INFINITY, f64::min);
        let alone = choose(&topo, &m, Network::Ideal);
        let got = simulated_us(&topo, &m, &opts, alone.algorithm());
        assert!(got <= best * 1.01, "{} {got} vs best {best}", alone.chosen);
        let (est, sim) = estimated_and_simulated(&topo, &m, Network::Ideal, Algorithm::Fast);
        assert!(
            (sim / est - 1.0).abs() < 0.05,
            "fast: estimated {est}, simulated {sim}"
        );
    }

    /// 4x8 DGX-H100 fat-tree 2:1 (two nodes per leaf), MoE Zipf 1.5 seed
    /// 110, ideal: node 0 receives 202 MB (its NICs are the cut), 134 MB
    /// of it from the other leaf, whose downlink (one node's rate) also
    /// carries node 1's crossing receipts; in the stages where both run
    /// the hot node's NICs take half their rate, and `fast` simulated
    /// 1.170 of the bound where the busiest link and the stage chains
    /// said 1.034 (the sweep's worst miss, issue 20 §5). Its stages
    /// replayed as flows over the leaves' links (`fast_stage_replay`)
    /// put it within 2%, and the estimates alone then pick within 1% of
    /// the best (`spray`).
    #[test]
    fn a_hot_receivers_shared_downlink_is_in_fasts_estimate() {
        use crate::topology::{FabricSpec, TopologySpec};
        let mut spec = TopologySpec::preset("dgx-h100", 4, None).unwrap();
        spec.fabric = Some(FabricSpec::fat_tree(2, 2.0, 1.0));
        let topo = Topology::from_spec(spec, "t").unwrap();
        let m = sweep_traffic(&topo, Pattern::Zipf(1.5), 110);
        let (est, sim) = estimated_and_simulated(&topo, &m, Network::Ideal, Algorithm::Fast);
        assert!(
            (sim / est - 1.0).abs() < 0.02,
            "fast: estimated {est}, simulated {sim}"
        );
        let e = choose(&topo, &m, Network::Ideal);
        let fast = e.estimates.iter().find(|e| e.algorithm == "fast").unwrap();
        assert!(fast.limit.contains("leaf links"), "{}", fast.limit);
        assert_alone_within_1pct(&topo, &m, Network::Ideal);
    }

    /// [`fluid_stage_end`] by hand: two leaves of two nodes, each leaf's
    /// fabric links one node's rate. Nodes 2 and 3 send `w` to nodes 0
    /// and 1 at once: both cross into leaf 0, whose downlink halves them
    /// (2w / rate). Without fabric links, w / rate. The same pair then
    /// followed by node 0 sending to node 1 inside the leaf: it waits for
    /// node 1's receipt unless the window lets it overlap.
    #[test]
    fn fluid_stage_end_shares_a_leafs_downlink() {
        let pair = |stage, src_node, dst_node, bytes| StagePair {
            stage,
            src_node,
            dst_node,
            bytes,
        };
        let (w, rate) = (1000u64, 10.0);
        let leaf = [0, 0, 1, 1];
        let crossing = [pair(0, 2, 0, w), pair(0, 3, 1, w)];
        let end = fluid_stage_end(4, &crossing, &leaf, &[rate; 2], rate, 0.0);
        assert!((end - 200.0).abs() < 1e-6, "{end}");
        let end = fluid_stage_end(4, &crossing, &leaf, &[], rate, 0.0);
        assert!((end - 100.0).abs() < 1e-6, "{end}");
        // One crossing pair alone gets the whole downlink.
        let end = fluid_stage_end(4, &crossing[..1], &leaf, &[rate; 2], rate, 0.0);
        assert!((end - 100.0).abs() < 1e-6, "{end}");
        // Then 0 -> 1 (in the leaf): after node 1's receipt, at 200 + 100.
        let mut then = crossing.to_vec();
        then.push(pair(1, 0, 1, w));
        let end = fluid_stage_end(4, &then, &leaf, &[rate; 2], rate, 0.0);
        assert!((end - 300.0).abs() < 1e-6, "{end}");
        // With a window of `w`, it starts at once and shares node 1's
        // ingress with 3 -> 1 (each 5): 3 -> 1 gets the downlink's other
        // 5, so both of node 1's flows and 2 -> 0 end at 200.
        let end = fluid_stage_end(4, &then, &leaf, &[rate; 2], rate, w as f64);
        assert!((end - 200.0).abs() < 1e-6, "{end}");
    }

    /// Without fabric links and without a window, [`fluid_stage_end`] is
    /// the stage chains' dataflow ([`StageChains::end`]): each node sends
    /// and receives one pair at a time, at the node's rate.
    #[test]
    fn fluid_stage_end_without_fabric_is_the_stage_chains() {
        let mut x = 12345u64;
        let mut next = |n: u64| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33) % n
        };
        for _ in 0..20 {
            let nodes = 5;
            let mut pairs = Vec::new();
            for stage in 0..8 {
                // A random partial permutation: a shifted identity, some
                // pairs left out.
                let k = 1 + next(nodes as u64 - 1) as u32;
                for a in 0..nodes as u32 {
                    if next(4) > 0 {
                        pairs.push(StagePair {
                            stage,
                            src_node: a,
                            dst_node: (a + k) % nodes as u32,
                            bytes: 1 + next(1000),
                        });
                    }
                }
            }
            let chains = StageChains::default().end(nodes, &pairs, 7.0, 8.0, 100.0, 0.0);
            let fluid = fluid_stage_end(nodes, &pairs, &[0; 5], &[], 7.0, 0.0);
            assert!(
                (fluid - chains).abs() < 1e-6 * chains,
                "{fluid} vs {chains}"
            );
        }
    }

    /// `spray` sends everything at once, so its hot receivers' forwards
    /// wait for the writes that carry them and queue on their NVLink
    /// ports after most of the network is done. On the sweep's 2x8
    /// DGX-H100 (ideal, Zipf 1.0 and hotspot 0.3) the old `1.05 + 0.12 ln
    /// ρ` put `spray` 1.10-1.12x short of its simulated time; the
    /// forwards' queues (`spray_forwards`) were within 4%. Since `spray`
    /// chains each lane's sends (its forwards released as the sends land)
    /// its plans are 1.014 / 1.043 of the estimate (Zipf / hotspot): within 5%.
    #[test]
    fn spray_is_estimated_by_its_forwards() {
        let topo = Topology::preset("dgx-h100", 2, None).unwrap();
        for (pattern, seed) in [(Pattern::Zipf(1.0), 9), (Pattern::Hotspot(0.3), 12)] {
            let m = sweep_traffic(&topo, pattern, seed);
            let (est, sim) = estimated_and_simulated(&topo, &m, Network::Ideal, Algorithm::Spray);
            assert!(
                (sim / est - 1.0).abs() < 0.05,
                "{pattern:?}: spray estimated {est}, simulated {sim}"
            );
            let choice = choose(&topo, &m, Network::Ideal);
            let e = choice
                .estimates
                .iter()
                .find(|e| e.algorithm == "spray")
                .unwrap();
            assert!(e.limit.starts_with("forwards into gpu"), "{}", e.limit);
        }
    }

    /// On a mesh, `fast`'s and `spray`'s relief pass moves intra-node
    /// blocks and forwards off the busiest links through a third GPU. On
    /// the sweep's 2x8 MI300X intra-skew 1.2 (ideal) the hot GPU pair's
    /// link, priced as routed, put `fast` at 0.67x its simulated time (and
    /// `spray`, once its forwards replaced its old constant, ahead of
    /// `fast`: 1.29x the best). Relieved as the pass relieves it, the
    /// link falls below the NICs, `fast` is within 15% of its simulated
    /// time, and the estimates alone pick within 1% of the best.
    #[test]
    fn mesh_links_are_priced_after_the_relief_pass() {
        let topo = Topology::preset("mi300x", 2, None).unwrap();
        let m = sweep_traffic(&topo, Pattern::IntraSkew(1.2), 13);
        let (est, sim) = estimated_and_simulated(&topo, &m, Network::Ideal, Algorithm::Fast);
        assert!(
            (sim / est - 1.0).abs() < 0.15,
            "fast: estimated {est}, simulated {sim}"
        );
        assert_alone_within_1pct(&topo, &m, Network::Ideal);
    }

    /// A residual pinned: on the sweep's 2x8 MI300X (calibrated, Zipf 0),
    /// `hierarchical`'s relay lag counted only the relayed bytes, while its
    /// phase 1 shares each mesh link with the intra-node block sent at
    /// once: estimated 0.92x its simulated time, it was chosen at 1.072x
    /// the best. With the intra-node blocks in the lag it is within 5%,
    /// and the estimates alone pick within 1% of the best.
    #[test]
    fn relay_lag_counts_the_intra_node_blocks() {
        let topo = Topology::preset("mi300x", 2, None).unwrap();
        let m = sweep_traffic(&topo, Pattern::Zipf(0.0), 7);
        let net = Network::Calibrated;
        assert_alone_within_1pct(&topo, &m, net);
        let (est, sim) = estimated_and_simulated(&topo, &m, net, Algorithm::Hierarchical);
        assert!(
            (sim / est - 1.0).abs() < 0.05,
            "hierarchical: estimated {est}, simulated {sim}"
        );
    }

    /// `fast`'s rotation stages (whole node pairs) are priced on their
    /// chains with each pair stretched by [`ROTATION_DRIFT`] of its bytes,
    /// up to a lane's sends in flight (issue 20 §5): by hand on the
    /// rotation of a circulant node matrix, whose every stage moves equal
    /// pairs, so the chains run in lock-step and end at
    /// `Σ_k (w_k + d min(w_k, 4 G c)) / rate`. And the sweep's 8x8
    /// DGX-H100 Zipf 0 seed 7 (full bisection, ideal), where `fast` takes
    /// the rotation: its estimate said 1.036x the bound against 1.069x
    /// simulated, so the estimates alone chose it at 1.012x the best
    /// (`direct`); now within 1%.
    #[test]
    fn fast_rotation_stages_are_priced_with_their_lanes_drift() {
        use crate::topology::TopologySpec;
        let mut spec = TopologySpec::preset("dgx-h100", 8, None).unwrap();
        spec.fabric = None;
        let topo = Topology::from_spec(spec, "t").unwrap();
        let m = sweep_traffic(&topo, Pattern::Zipf(0.0), 7);
        let e = Estimator::new(&topo, &m, Network::Ideal);
        assert!(e.fast_stages().1, "fast takes the rotation here");
        let n = 8u32;
        let mut pairs = Vec::new();
        let w: Vec<u64> = (1..n as u64).map(|k| k << 23).collect();
        for (s, &bytes) in w.iter().enumerate() {
            for a in 0..n {
                let (stage, k) = (s as u32, s as u32 + 1);
                pairs.push(StagePair {
                    stage,
                    src_node: a,
                    dst_node: (a + k) % n,
                    bytes,
                });
            }
        }
        let rate = node_rate(&topo);
        let plain: f64 = w.iter().map(|&x| x as f64 / rate).sum();
        // Lanes' sends in flight: 4 chunks of each of the 8 lanes. The
        // larger stages are held to them (the test's point: both kinds).
        let window = 4.0 * e.chunk * 8.0;
        assert!(w.iter().any(|&x| x as f64 > window) && (w[0] as f64) < window);
        let drift: f64 = w
            .iter()
            .map(|&x| ROTATION_DRIFT * (x as f64).min(window) / rate)
            .sum();
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b;
        let got = e.fast_stage_flow(&pairs, false);
        assert!(close(got, plain), "{got} vs {plain}");
        let got = e.fast_stage_flow(&pairs, true);
        assert!(close(got, plain + drift), "{got} vs {}", plain + drift);
        // The sweep's case: the estimates alone within 1% of the best.
        assert_alone_within_1pct(&topo, &m, Network::Ideal);
    }

    /// Where a fabric link binds, `deepep`'s landings are stretched only
    /// for the writes whose path crosses it: on a 4x8 fat-tree 2:1 (two
    /// nodes per leaf), with leaf 1's uplink binding, the writes from
    /// nodes 2 and 3 to nodes 0 and 1, so that the latest of them lands
    /// with the link; every other write keeps its NICs' time. The
    /// sweep's 4x8 MI300X fat-tree Zipf 0.5 seed 108, calibrated (`fast`
    /// was estimated ahead of `deepep`, 1.021x the best), is right by the
    /// estimates alone.
    #[test]
    fn deepep_landings_stretch_only_over_the_binding_fabric_link() {
        use crate::topology::{FabricSpec, TopologySpec};
        let cluster = |preset: &str| {
            let mut spec = TopologySpec::preset(preset, 4, None).unwrap();
            spec.fabric = Some(FabricSpec::fat_tree(2, 2.0, 1.0));
            Topology::from_spec(spec, "t").unwrap()
        };
        let topo = cluster("dgx-h100");
        let m = sweep_traffic(&topo, Pattern::Zipf(0.5), 108);
        let e = Estimator::new(&topo, &m, Network::Calibrated);
        let u = (0..topo.num_links() as LinkId)
            .find(|&l| topo.link_name(l) == "leaf1->spine")
            .unwrap();
        let (g, nodes) = (8, 4);
        let mut land = vec![0.0; g * nodes * nodes];
        for s in 0..g * nodes {
            for b in (0..nodes).filter(|&b| b != s / g) {
                land[s * nodes + b] = 10.0 + s as f64;
            }
        }
        let before = land.clone();
        e.stretch_over(u, 100.0, &mut land);
        // The latest crossing write: GPU 31 (node 3), 41 us.
        let stretch = 100.0 / 41.0;
        for s in 0..g * nodes {
            for b in (0..nodes).filter(|&b| b != s / g) {
                let w = s * nodes + b;
                let want = if s / g >= 2 && b < 2 {
                    before[w] * stretch
                } else {
                    before[w]
                };
                assert!(
                    (land[w] - want).abs() < 1e-9,
                    "{s} -> node {b}: {}",
                    land[w]
                );
            }
        }
        let topo = cluster("mi300x");
        let m = sweep_traffic(&topo, Pattern::Zipf(0.5), 108);
        assert_alone_within_1pct(&topo, &m, Network::Calibrated);
    }

    /// `fast`'s node stages are one stage (2 nodes, each pair whole):
    /// where a NIC binds, its pipeline ends cost [`FAST_ENDS_ONE_STAGE`],
    /// not [`FAST_ENDS`]; on a 2:1 fat-tree, where the uplink binds, the
    /// full ends stay. The sweep's 2x8 DGX-H100 full-bisection Zipf 0 seed
    /// 207 (`direct` was estimated ahead of `fast`, 1.015x the best) is
    /// right by the estimates alone.
    #[test]
    fn one_stage_fast_pays_its_pipeline_ends_alone() {
        use crate::topology::{FabricSpec, TopologySpec};
        let cluster = |fat_tree: bool| {
            let mut spec = TopologySpec::preset("dgx-h100", 2, None).unwrap();
            spec.fabric = fat_tree.then(|| FabricSpec::fat_tree(1, 2.0, 1.0));
            Topology::from_spec(spec, "t").unwrap()
        };
        let fast_limit = |topo: &Topology, m: &TrafficMatrix, net: Network| {
            let mut e = Estimator::new(topo, m, net);
            assert_eq!(e.fast_stages().0.iter().map(|p| p.stage).max(), Some(0));
            e.estimate(Algorithm::Fast).limit
        };
        let topo = cluster(false);
        let m = sweep_traffic(&topo, Pattern::Zipf(0.0), 207);
        let limit = fast_limit(&topo, &m, Network::Ideal);
        assert!(limit.contains("+1.5% pipeline ends"), "{limit}");
        assert_alone_within_1pct(&topo, &m, Network::Ideal);
        // One stage, the uplink binds: the full ends.
        let topo = cluster(true);
        let m = sweep_traffic(&topo, Pattern::Hotspot(0.3), 12);
        let limit = fast_limit(&topo, &m, Network::Calibrated);
        assert!(
            limit.contains("spine") && limit.contains("+3.0% pipeline ends"),
            "{limit}"
        );
    }

    /// The sweep's traffic (examples/auto_sweep.rs): 8 GPUs per node,
    /// 1 MiB per pair on average, 1024 MoE tokens per rank.
    fn sweep_traffic(topo: &Topology, pattern: Pattern, seed: u64) -> TrafficMatrix {
        let mut spec = TrafficSpec::new(topo.ranks(), pattern);
        spec.seed = seed;
        spec.gpus_per_node = topo.gpus_per_node();
        spec.bytes = 1 << 20;
        spec.moe.tokens_per_rank = 1024;
        generate(&spec).unwrap()
    }

    /// Regressions (the sweep's misses by the estimates alone, 4x8
    /// DGX-H100, calibrated): on a fat-tree 2:1 with two nodes per leaf,
    /// `fast` estimated ahead where `deepep` wins (Zipf 0.5: 1.031x the
    /// best) and where `spray` wins (log-normal: 1.028x); with full
    /// bisection, `fast` over `deepep` (Zipf 0.5, seeds 8 and 108: up to
    /// 1.013x); intra-skew on the fat-tree (the fat-tree Zipf 0.5 and the
    /// full-bisection ones are right by the estimates alone since `fast`'s
    /// taper rides the uplinks). With full bisection in `ideal`, Zipf 0
    /// seed 207: `fast` (rotation stages) estimated ahead of `direct` at
    /// 4x8 (1.017x the best), `direct` ahead of `fast` at 2x8 (1.015x);
    /// both right by the estimates alone since `fast`'s rotations run the
    /// swap first and its one-stage ends are 1.5%. Seed 307 (held out in
    /// issue 20 §5 of 2026-12-04, still missed by the estimates alone):
    /// 4x8 full bisection Zipf 0 in `ideal`, `direct` ahead of `fast`
    /// (1.019x), and the fat-tree log-normal (seed 311), calibrated, `fast`
    /// ahead of `spray` (1.015x).
    /// The estimates put these within [`TIE_MARGIN`]; the contenders'
    /// plans, simulated, settle them. At least two cases must need the
    /// tie-break (else this test tests nothing).
    #[test]
    fn close_calls_are_settled_by_simulating_the_plans() {
        use crate::topology::{FabricSpec, TopologySpec};
        let cluster = |nodes: usize, per_leaf: Option<usize>| {
            let mut spec = TopologySpec::preset("dgx-h100", nodes, None).unwrap();
            spec.fabric = per_leaf.map(|k| FabricSpec::fat_tree(k, 2.0, 1.0));
            Topology::from_spec(spec, "t").unwrap()
        };
        let cases = [
            (
                cluster(4, Some(2)),
                Pattern::Zipf(0.5),
                8,
                Network::Calibrated,
            ),
            (
                cluster(4, Some(2)),
                Pattern::Lognormal(1.0),
                111,
                Network::Calibrated,
            ),
            (
                cluster(4, Some(2)),
                Pattern::IntraSkew(1.2),
                13,
                Network::Calibrated,
            ),
            (cluster(4, None), Pattern::Zipf(0.5), 8, Network::Calibrated),
            (
                cluster(4, None),
                Pattern::Zipf(0.5),
                108,
                Network::Calibrated,
            ),
            (cluster(4, None), Pattern::Zipf(0.0), 207, Network::Ideal),
            (cluster(2, None), Pattern::Zipf(0.0), 207, Network::Ideal),
            (cluster(4, None), Pattern::Zipf(0.0), 307, Network::Ideal),
            (
                cluster(4, Some(2)),
                Pattern::Lognormal(1.0),
                311,
                Network::Calibrated,
            ),
        ];
        let mut settled = 0;
        for (topo, pattern, seed, net) in cases {
            let m = sweep_traffic(&topo, pattern, seed);
            let opts = SimOptions::new(net);
            let best = best_candidate_us(&topo, &m, &opts);
            let alone = choose(&topo, &m, net);
            let (plan, choice) = auto(&topo, &m, net).unwrap();
            let got = simulate(&topo, &plan, &opts).unwrap().completion_us;
            assert!(
                got <= best * 1.01,
                "{pattern:?} {net}: {} {got} vs best {best}: {choice:?}",
                choice.chosen
            );
            assert_eq!(plan.algorithm, choice.chosen);
            if simulated_us(&topo, &m, &opts, alone.algorithm()) > best * 1.01 {
                assert!(!choice.simulated.is_empty(), "{choice:?}");
                settled += 1;
            }
        }
        assert!(settled >= 2, "only {settled} cases needed the tie-break");
    }

    /// `Planner::new` is `auto` (issue 20): per batch it goes by
    /// [`choose`]'s estimates alone (the per-batch time budget); with
    /// [`Settle::Sticky`] it settles a close call as [`auto`] does,
    /// tie-break included, then keeps that winner (no simulation) for a
    /// matrix whose estimates say it holds, and settles again for one that
    /// moved too far; `for_algorithm(Auto)` gives rank programs (what
    /// `switchyard.torch.AllToAll` runs).
    #[test]
    fn the_default_planner_is_auto() {
        use crate::planner::{Planner, PlannerOptions, Settle};
        use crate::topology::{FabricSpec, TopologySpec};
        // A close call the estimates alone get wrong (the sweep's 4x8
        // MI300X, rail-optimized 2:1, Zipf 0, ideal: `fast` estimated
        // ahead, `pxn` best by 0.7%).
        let mut spec = TopologySpec::preset("mi300x", 4, None).unwrap();
        spec.fabric = Some(FabricSpec::rail_optimized(None, 2.0, 1.0));
        let topo = Topology::from_spec(spec, "t").unwrap();
        let m = sweep_traffic(&topo, Pattern::Zipf(0.0), 7);
        let mut plan = Plan::new("", 0, 0);
        let mut alone_planner = Planner::new(&topo, PlannerOptions::default()).unwrap();
        assert_eq!(alone_planner.algorithm(), Algorithm::Auto);
        alone_planner.plan_into(&m, &mut plan).unwrap();
        let alone = choose(&topo, &m, Network::Ideal);
        assert_eq!(alone_planner.last_choice(), Some(&alone));
        let want = schedule(alone.algorithm(), &topo, &m, &Options::default()).unwrap();
        assert_eq!(plan.transfers, want.transfers);
        // Sticky: the first call settles as `auto` does ...
        let mut planner = Planner::new(&topo, PlannerOptions::default())
            .unwrap()
            .with_settle(Settle::Sticky(StickyRule::default()));
        planner.plan_into(&m, &mut plan).unwrap();
        let (want, choice) = auto(&topo, &m, Network::Ideal).unwrap();
        assert!(!choice.simulated.is_empty(), "{choice:?}");
        assert_ne!(choice.chosen, alone.chosen, "the case needs the tie-break");
        assert_eq!(planner.last_choice(), Some(&choice));
        assert_eq!(plan.transfers, want.transfers);
        assert_eq!(plan.algorithm, choice.chosen);
        // ... the same estimates keep its winner without a simulation ...
        planner.plan_into(&m, &mut plan).unwrap();
        let kept = planner.last_choice().unwrap();
        assert!(kept.simulated.is_empty(), "{kept:?}");
        assert_eq!(
            (kept.chosen.as_str(), kept.kept_for),
            (choice.chosen.as_str(), Some(1))
        );
        assert_eq!(plan.transfers, want.transfers);
        // ... and a matrix whose estimates moved past the drift limit
        // (twice the bytes) is settled again.
        let mut twice = m.clone();
        for s in 0..m.ranks() {
            for d in 0..m.ranks() {
                twice.set(s, d, 2 * m.get(s, d));
            }
        }
        planner.plan_into(&twice, &mut plan).unwrap();
        let again = planner.last_choice().unwrap();
        assert_eq!(again.kept_for, None);
        assert_eq!(again, &auto(&topo, &twice, Network::Ideal).unwrap().1);
        let mut by_name =
            Planner::for_algorithm(&topo, Algorithm::Auto, PlannerOptions::default()).unwrap();
        let prog = by_name.program(3, &m).unwrap();
        assert!(!prog.ops.is_empty());
    }

    /// A choice whose estimates are `est` (us), best first, for the
    /// [`Sticky`] tests.
    fn estimated(est: &[(Algorithm, f64)]) -> AutoChoice {
        let mut estimates: Vec<Estimate> = est
            .iter()
            .map(|&(a, us)| Estimate {
                algorithm: a.name().into(),
                estimate_us: us,
                limit: String::new(),
            })
            .collect();
        estimates.sort_by(|a, b| a.estimate_us.total_cmp(&b.estimate_us));
        AutoChoice {
            chosen: estimates[0].algorithm.clone(),
            network: Network::Ideal,
            estimates,
            simulated: Vec::new(),
            kept_for: None,
        }
    }

    /// The sticky rule: the winner of a settle is kept while the
    /// contenders' estimates, scaled to the settle's simulated times, say
    /// it still finishes first; a predicted flip, an estimate moved past
    /// the drift limit, a contender not simulated at the settle, or the
    /// call limit settles again.
    #[test]
    fn sticky_keeps_the_winner_until_it_could_flip() {
        use Algorithm::{Deepep, Direct, Fast};
        let rule = StickyRule {
            lead: 0.0,
            slack: 0.0,
            drift: 1.25,
            calls: 4,
        };
        let mut sticky = Sticky::new(rule);
        // Estimates say `deepep`, the simulations `fast` by 5%.
        let first = [(Deepep, 90.0), (Fast, 95.0), (Direct, 200.0)];
        assert_eq!(
            sticky.keep(&mut estimated(&first)),
            None,
            "nothing settled yet"
        );
        let mut settled = estimated(&first);
        settled
            .settle(|a| Ok(if a == Fast { 100.0 } else { 105.0 }))
            .unwrap();
        assert_eq!(settled.chosen, "fast");
        sticky.remember(&settled);
        // The same estimates, or all scaled alike: kept.
        for scale in [1.0, 1.2] {
            let mut c = estimated(&first.map(|(a, t)| (a, t * scale)));
            assert_eq!(sticky.keep(&mut c), Some(Fast));
            assert_eq!(c.chosen, "fast");
            assert!(c.kept_for.is_some());
        }
        // `deepep`'s estimate 4% lower (predicted 100.8 against 100): kept;
        // 6% lower (98.7): it may finish first now, so settle.
        let mut c = estimated(&[(Deepep, 86.4), (Fast, 95.0), (Direct, 200.0)]);
        assert_eq!(sticky.keep(&mut c), Some(Fast));
        let mut c = estimated(&[(Deepep, 84.6), (Fast, 95.0), (Direct, 200.0)]);
        assert_eq!(sticky.keep(&mut c), None);
        assert_eq!(c.chosen, "deepep", "an unkept choice is left as estimated");
        // Every estimate 30% up: past the drift limit.
        let mut c = estimated(&first.map(|(a, t)| (a, t * 1.3)));
        assert_eq!(sticky.keep(&mut c), None);
        // `direct` now a contender, never simulated: settle.
        let mut c = estimated(&[(Deepep, 90.0), (Fast, 95.0), (Direct, 100.0)]);
        assert_eq!(sticky.keep(&mut c), None);
        // Four calls kept (the limit): the fifth settles.
        assert_eq!(sticky.keep(&mut estimated(&first)), Some(Fast));
        assert_eq!(sticky.keep(&mut estimated(&first)), None);
        // A settle starts the count again; a choice without simulations
        // leaves the memory alone.
        sticky.remember(&settled);
        sticky.remember(&estimated(&first));
        let mut c = estimated(&first);
        assert_eq!(sticky.keep(&mut c), Some(Fast));
        assert_eq!(c.kept_for, Some(1));
        // A near tie (`deepep` simulated 0.5% behind) with a 2% lead and
        // 1% slack: kept while `deepep`'s estimate is 0.5% lower, settled
        // again once it is 2% lower.
        let mut sticky = Sticky::new(StickyRule {
            lead: 0.02,
            slack: 0.01,
            ..rule
        });
        let mut near = estimated(&first);
        near.settle(|a| Ok(if a == Fast { 100.0 } else { 100.5 }))
            .unwrap();
        sticky.remember(&near);
        let mut c = estimated(&[(Deepep, 89.55), (Fast, 95.0), (Direct, 200.0)]);
        assert_eq!(sticky.keep(&mut c), Some(Fast));
        let mut c = estimated(&[(Deepep, 88.2), (Fast, 95.0), (Direct, 200.0)]);
        assert_eq!(sticky.keep(&mut c), None);
        assert_eq!(sticky.last_resettle(), Some(Resettle::Flip));
    }

    #[test]
    fn a_links_topology_gets_direct() {
        let topo = Topology::from_json_str(
            r#"{ "name": "ring", "nodes": 1, "gpus_per_node": 2,
                 "links": [ { "from": "gpu0", "to": "gpu1", "bandwidth_GBps": 10.0, "latency_us": 1.0 },
                            { "from": "gpu1", "to": "gpu0", "bandwidth_GBps": 10.0, "latency_us": 1.0 } ] }"#,
            "ring",
        )
        .unwrap();
        let m = TrafficMatrix::uniform(2, 100);
        let (plan, choice) = auto(&topo, &m, Network::Ideal).unwrap();
        assert_eq!(choice.chosen, "direct");
        verify_on(&plan, &m, &topo).unwrap();
    }
}
