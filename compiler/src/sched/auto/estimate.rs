//! `auto`'s estimates (docs/algorithms.md, `auto`): each candidate's
//! traffic routed over the topology's own paths, aggregated to (node, rail)
//! pairs and GPU pairs inside a node, priced by its busiest link plus what
//! the candidate adds on top of it (relay hops, `fast`'s stage pipeline,
//! `spray`'s forwards, latencies and, outside `ideal`, each message's cost).

use super::{Estimate, CANDIDATES};
use crate::sched::fast::emit::{node_rate, NodeStages, PlannerOptions, MIN_DEPTH};
use crate::sched::fast::replay::{fluid_stage_end, REPLAY_MAX_PAIRS};
use crate::sched::fast::stages::{StageChains, StagePair};
use crate::sched::{pxn_relay, Algorithm};
use crate::sim::{CongestionModel, Network, SimOptions};
use crate::topology::{LinkClass, LinkId, Topology, Vertex};
use crate::traffic::TrafficMatrix;

/// The per-link loads of one candidate and what they take.
pub(super) struct Estimator<'a> {
    topo: &'a Topology,
    traffic: &'a TrafficMatrix,
    congested: bool,
    model: CongestionModel,
    g: usize,
    pub(super) p: usize,
    pub(super) nodes: usize,
    /// Bytes per link of the candidate being priced.
    pub(super) load: Vec<f64>,
    /// Per NIC ingress link: the NIC egress links that send to it (congested mode).
    pub(super) senders: Vec<Vec<LinkId>>,
    touched: Vec<LinkId>,
    path: Vec<LinkId>,
    /// A GPU of each (node, rail): `rep[node * p + k]`.
    pub(super) rep: Vec<usize>,
    /// Bytes from (node, rail) to (node, rail) between different nodes:
    /// `rail_bytes[(a * p + k) * nodes * p + b * p + j]`.
    pub(super) rail_bytes: Vec<f64>,
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
    pub(super) per_message_us: f64,
    /// Non-empty blocks from (node, rail) to (node, rail) on other nodes,
    /// as `rail_bytes`; and from a (node, rail)'s GPUs to each other node
    /// (`rail_node_msgs[x * nodes + b]`).
    rail_msgs: Vec<f64>,
    rail_node_msgs: Vec<f64>,
    /// `fast`'s chunk size (docs/algorithms.md, `fast`), bytes, planned
    /// for the mode; `spray` is always planned for the ideal network.
    pub(super) chunk: f64,
    chunk_ideal: f64,
    /// The least piece of a pair in `fast`'s chunked rotation (bytes):
    /// four latencies' or, with a per-message cost, the messages' chunk
    /// on each of a node's GPUs (`NodeStages::least_piece`), by this
    /// estimator's chunk formulas (a lane at the NIC's rate: the planner's
    /// own where each GPU has a NIC of its own).
    least_piece: f64,
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
    pub(super) fn new(topo: &'a Topology, traffic: &'a TrafficMatrix, network: Network) -> Self {
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
        let least_piece = (4.0 * inter_latency * nic_rate).max(by_message) * g as f64;
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
            least_piece,
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

    pub(super) fn all(&mut self) -> Vec<Estimate> {
        CANDIDATES.iter().map(|&a| self.estimate(a)).collect()
    }

    pub(super) fn estimate(&mut self, alg: Algorithm) -> Estimate {
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
                // With a per-message cost, the chains halfway to the
                // replay (whose window lets a node's next pair overlap its
                // last) where it ends sooner: the replay alone, with the
                // larger window of the calibrated chunk, undershot.
                let (flow, replay) = if self.per_message_us > 0.0 {
                    let flow = if replay > 0.0 && replay < flow {
                        0.5 * (flow + replay)
                    } else {
                        flow
                    };
                    (flow, 0.0)
                } else {
                    (flow, replay)
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
    pub(super) fn fast_stages(&self) -> (Vec<StagePair>, bool) {
        let nodes = self.nodes;
        let t: Vec<u64> = self.node_bytes.iter().map(|&b| b as u64).collect();
        let opts = PlannerOptions {
            per_message_us: self.per_message_us,
            ..PlannerOptions::default()
        };
        let mut pairs = Vec::with_capacity(4 * nodes * nodes);
        let part = (self.chunk * self.g as f64) as u64;
        let mut stages = NodeStages::new(self.topo);
        stages.least_piece = self.least_piece as u64;
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
    pub(super) fn fast_stage_messages(&self, pairs: &[StagePair]) -> f64 {
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
    pub(super) fn fast_stage_flow(&self, pairs: &[StagePair], rotated: bool) -> f64 {
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
    /// may overlap its last; with a per-message cost, each pair's
    /// messages added to its bytes at the node's rate (as
    /// [`Self::fast_stage_flow`] adds them to its time). 0 where no leaf's
    /// uplinks can bind (one leaf or rail group, or uplinks as fast as
    /// their nodes' NICs: the replay is then the stage chains), and beyond
    /// [`REPLAY_MAX_PAIRS`] pairs (docs/benchmarks.md,
    /// "`auto`'s `fast` estimate replays its stages"). `O(pairs)` events,
    /// each a max-min fill over the flows moving.
    fn fast_stage_replay(&self, pairs: &[StagePair]) -> f64 {
        let topo = self.topo;
        let leaves = topo.leaves();
        if leaves < 2 {
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
        if self.per_message_us > 0.0 {
            // Each pair's messages as bytes at the node's rate, as
            // `fast_stage_flow` adds them to its time.
            let g = self.g as f64;
            let per_msg = self.per_message_us * g * self.topo.nic_bandwidth() / self.node_rate;
            let priced: Vec<StagePair> = pairs
                .iter()
                .map(|p| {
                    let w = p.bytes as f64;
                    let msgs = (w / g / self.chunk.max(1.0)).ceil() * per_msg;
                    StagePair {
                        bytes: (w + msgs * rate) as u64,
                        ..*p
                    }
                })
                .collect();
            return fluid_stage_end(self.nodes, &priced, &leaf, &fabric, rate, window);
        }
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
    pub(super) fn stretch_over(&self, u: LinkId, net_busy: f64, land: &mut [f64]) {
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
    pub(super) fn route_direct(&mut self) {
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
    pub(super) fn flush_net(&mut self) {
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

/// `fast`'s pipeline ends over its busiest link (docs/algorithms.md, `auto`).
pub(super) const FAST_ENDS: f64 = 0.03;

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
pub(super) const ROTATION_DRIFT: f64 = 0.055;

/// `fast`'s taper: messages per lane its last sends in flight add to its
/// sending NIC, and how many of them are priced on the whole path (the
/// receiving NIC and the fabric links too, which the simulator charges a
/// message's overhead on). On the 2:1 fat-trees the plans send 2.5-3 more
/// messages per lane over the uplinks than `⌈w / G / c⌉` (docs/algorithms.md,
/// `auto`, "Messages per NIC").
pub(super) const FAST_TAPER: f64 = 8.0;
pub(super) const FAST_TAPER_PATH: f64 = 2.0;

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
