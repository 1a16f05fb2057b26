//! Cluster topology: the JSON forms (hierarchical and `links`), presets, and
//! the one capacity graph every other module reasons about.
//!
//! Owns: parsing and validating topology files, building the petgraph graph
//! (vertices: GPUs, NVSwitches, NICs, leaves, spine; edges: directed links with
//! a bandwidth and a latency) and the path function that names the links a
//! transfer crosses. It knows nothing of traffic, plans or time.
//!
//! Units inside: bandwidth in bytes per microsecond (1 GB/s = 1000 B/us),
//! latency in microseconds.

use std::collections::HashMap;

use petgraph::graph::{DiGraph, EdgeIndex, NodeIndex};
use serde::{Deserialize, Serialize};

use crate::error::{clip, num, InputError, Result};

/// Bytes per microsecond in one GB/s.
pub const BYTES_PER_US_PER_GBPS: f64 = 1_000.0;

/// Bandwidths a file may give, GB/s: 1 MB/s to 1 PB/s. Outside, the LP's
/// coefficients lose precision and the simulator's rates underflow or
/// overflow, so the value is a typo, not a link.
pub const BANDWIDTH_RANGE_GBPS: (f64, f64) = (1e-3, 1e6);
/// Largest ratio of the fastest to the slowest link of one topology
/// (uplinks included): a span of 1e9 made the LP bound infeasible in HiGHS,
/// 1e8 still solved.
pub const MAX_BANDWIDTH_SPAN: f64 = 1e6;
/// Largest latency a file may give, microseconds (1000 s).
pub const MAX_LATENCY_US: f64 = 1e9;
/// Oversubscription ratios a file may give.
pub const OVERSUBSCRIPTION_RANGE: (f64, f64) = (1e-3, 1e6);
/// GPUs (and NICs) of one cluster.
pub const MAX_GPUS: usize = 1 << 20;
/// GPUs of a `links` topology: all-pairs paths are kept, `ranks^2` of them.
pub const MAX_LINKS_GPUS: usize = 1024;
/// Links of an `intra.kind = "mesh"` cluster, which has one per ordered
/// pair of a node's GPUs (2^20 GPUs in nodes of 16 fit).
pub const MAX_MESH_LINKS: usize = 1 << 24;

/// Intra-node fabric kind.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum IntraKind {
    /// Non-blocking switch (NVSwitch): each GPU has `bandwidth_GBps` out and in.
    Switch,
    /// Direct link of `bandwidth_GBps` between every pair of GPUs (xGMI).
    Mesh,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct IntraSpec {
    pub kind: IntraKind,
    #[serde(rename = "bandwidth_GBps")]
    pub bandwidth_gbps: f64,
    pub latency_us: f64,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NicSpec {
    pub per_node: usize,
    #[serde(rename = "bandwidth_GBps")]
    pub bandwidth_gbps: f64,
    pub latency_us: f64,
    /// The rail map: the NIC (`0..per_node`) each local GPU sends and
    /// receives through, one entry per GPU of a node. Absent: GPU `l` uses
    /// NIC `l % per_node`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_nic: Option<Vec<usize>>,
}

/// The inter-node fabric's shape.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum FabricKind {
    /// Leaves of `nodes_per_leaf` whole nodes, joined by a spine.
    #[serde(rename = "fat-tree")]
    FatTree,
    /// NIC `k` of every node of a group of `nodes_per_group` nodes on that
    /// group's rail switch `k`; rail switches joined by a spine.
    #[serde(rename = "rail-optimized")]
    RailOptimized,
}

impl FabricKind {
    /// The name the topology file uses.
    pub fn as_str(self) -> &'static str {
        match self {
            FabricKind::FatTree => "fat-tree",
            FabricKind::RailOptimized => "rail-optimized",
        }
    }
}

/// The `fabric` object. Each kind has its own size field: `nodes_per_leaf`
/// for `fat-tree` (required), `nodes_per_group` for `rail-optimized`
/// (optional: all nodes); the other kind's field is an error naming it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FabricSpec {
    pub kind: FabricKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes_per_leaf: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes_per_group: Option<usize>,
    #[serde(default = "one")]
    pub oversubscription: f64,
    #[serde(default)]
    pub latency_us: f64,
}

impl FabricSpec {
    /// A fat-tree of leaves of `nodes_per_leaf` nodes.
    pub fn fat_tree(nodes_per_leaf: usize, oversubscription: f64, latency_us: f64) -> FabricSpec {
        FabricSpec {
            kind: FabricKind::FatTree,
            nodes_per_leaf: Some(nodes_per_leaf),
            nodes_per_group: None,
            oversubscription,
            latency_us,
        }
    }

    /// A rail-optimized fabric of groups of `nodes_per_group` nodes (`None`: one group).
    pub fn rail_optimized(
        nodes_per_group: Option<usize>,
        oversubscription: f64,
        latency_us: f64,
    ) -> FabricSpec {
        FabricSpec {
            kind: FabricKind::RailOptimized,
            nodes_per_leaf: None,
            nodes_per_group,
            oversubscription,
            latency_us,
        }
    }
}

fn one() -> f64 {
    1.0
}

/// One directed link of the general `links` form, over named vertices.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LinkSpec {
    pub from: String,
    pub to: String,
    #[serde(rename = "bandwidth_GBps")]
    pub bandwidth_gbps: f64,
    #[serde(default)]
    pub latency_us: f64,
    /// Links are directed; `true` adds the reverse link too.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub bidirectional: bool,
}

/// The topology file, as written (DESIGN.md "Ranks and topology").
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TopologySpec {
    pub name: String,
    pub nodes: usize,
    pub gpus_per_node: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intra: Option<IntraSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nic: Option<NicSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fabric: Option<FabricSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub links: Option<Vec<LinkSpec>>,
}

/// A vertex of the topology graph.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Vertex {
    Gpu(usize),
    /// The NVSwitch of a node (`switch` intra-node fabric only).
    Switch(usize),
    /// NIC `k` of node `n`.
    Nic(usize, usize),
    Leaf(usize),
    /// Rail switch `k` of group `g` (rail-optimized fabric): `Rail(g, k)`.
    Rail(usize, usize),
    Spine,
    /// Any other vertex of a `links` topology.
    Named(String),
}

/// What a link is, for reports and for the simulator's congestion model.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "kebab-case")]
pub enum LinkClass {
    /// GPU to NVSwitch or to a peer GPU (mesh).
    NvlinkOut,
    /// NVSwitch to GPU.
    NvlinkIn,
    /// GPU to its rail NIC (PCIe).
    PcieOut,
    /// NIC to GPU (PCIe).
    PcieIn,
    /// NIC egress into the fabric (its leaf or rail switch).
    NicTx,
    /// Fabric into a NIC (ingress).
    NicRx,
    /// Leaf or rail switch to spine.
    Uplink,
    /// Spine to leaf or rail switch.
    Downlink,
    /// A link of a `links` topology.
    Generic,
}

/// A directed link with its capacity.
#[derive(Clone, Debug, PartialEq)]
pub struct Link {
    /// Bytes per microsecond.
    pub bandwidth: f64,
    pub latency_us: f64,
    pub class: LinkClass,
}

/// Index of a link (an edge of the graph).
pub type LinkId = u32;

/// A validated topology and its capacity graph.
#[derive(Clone, Debug)]
pub struct Topology {
    spec: TopologySpec,
    graph: DiGraph<Vertex, Link>,
    gpu_vertex: Vec<NodeIndex>,
    form: Form,
}

#[derive(Clone, Debug)]
enum Form {
    Hierarchical(Box<Hier>),
    /// All-pairs GPU paths of a `links` topology, `paths[s * n + d]`.
    Links {
        paths: Vec<Vec<LinkId>>,
    },
}

/// Edge tables of the hierarchical form: a path is a handful of lookups.
#[derive(Clone, Debug)]
struct Hier {
    gpus_per_node: usize,
    nics_per_node: usize,
    /// The rail of each local GPU (see [`Topology::rail_of`]).
    rail: Vec<usize>,
    /// Nodes per leaf (fat-tree) or per group (rail-optimized).
    nodes_per_group: usize,
    /// Rail-optimized: a switch per group and rail, and `uplink`/`downlink`
    /// are per rail switch (`group * nics_per_node + k`), not per leaf.
    rails: bool,
    intra_kind: IntraKind,
    /// `switch`: GPU to NVSwitch and back, per rank.
    gpu_out: Vec<LinkId>,
    gpu_in: Vec<LinkId>,
    /// `mesh`: link from rank `s` to local peer `j`, at `s * gpus_per_node + j`.
    mesh: Vec<LinkId>,
    /// GPU to its rail NIC and back, per rank (empty for a single node without NICs).
    pcie_out: Vec<LinkId>,
    pcie_in: Vec<LinkId>,
    /// Per NIC (`node * nics_per_node + k`).
    nic_tx: Vec<LinkId>,
    nic_rx: Vec<LinkId>,
    /// Per leaf (only when there is more than one leaf), or per rail switch
    /// (only when some pair of NICs is on different rails or groups).
    uplink: Vec<LinkId>,
    downlink: Vec<LinkId>,
}

/// A built-in machine: one node's published figures, per direction
/// (docs/formats.md, "Presets", cites the source of each).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Machine {
    /// The preset's name on the command line.
    pub key: &'static str,
    /// The machine's name in a topology's `name`.
    pub title: &'static str,
    pub gpus_per_node: usize,
    pub intra: IntraKind,
    /// NVLink (switch) per GPU, or xGMI (mesh) per pair, GB/s per direction.
    pub intra_gbps: f64,
    pub nics_per_node: usize,
    /// One NIC, GB/s per direction.
    pub nic_gbps: f64,
}

/// The presets (`switchyard topology --preset KEY`).
pub const PRESETS: [Machine; 6] = [
    Machine {
        key: "dgx-a100",
        title: "DGX-A100",
        gpus_per_node: 8,
        intra: IntraKind::Switch,
        intra_gbps: 300.0,
        nics_per_node: 8,
        nic_gbps: 25.0,
    },
    Machine {
        key: "dgx-h100",
        title: "DGX-H100",
        gpus_per_node: 8,
        intra: IntraKind::Switch,
        intra_gbps: 450.0,
        nics_per_node: 8,
        nic_gbps: 50.0,
    },
    Machine {
        key: "dgx-h200",
        title: "DGX-H200",
        gpus_per_node: 8,
        intra: IntraKind::Switch,
        intra_gbps: 450.0,
        nics_per_node: 8,
        nic_gbps: 50.0,
    },
    Machine {
        key: "dgx-b200",
        title: "DGX-B200",
        gpus_per_node: 8,
        intra: IntraKind::Switch,
        intra_gbps: 900.0,
        nics_per_node: 8,
        nic_gbps: 50.0,
    },
    Machine {
        key: "gb200-nvl72",
        title: "GB200-NVL72",
        gpus_per_node: 72,
        intra: IntraKind::Switch,
        intra_gbps: 900.0,
        nics_per_node: 72,
        nic_gbps: 50.0,
    },
    Machine {
        key: "mi300x",
        title: "MI300X",
        gpus_per_node: 8,
        intra: IntraKind::Mesh,
        intra_gbps: 64.0,
        nics_per_node: 8,
        nic_gbps: 50.0,
    },
];

impl TopologySpec {
    /// A built-in cluster by name (see [`PRESETS`]). `gpus` overrides the
    /// GPUs per node; the NICs follow at one per GPU up to the machine's
    /// count (a scaled-down node). See [`TopologySpec::preset_shape`] to set
    /// both.
    pub fn preset(name: &str, nodes: usize, gpus: Option<usize>) -> Result<TopologySpec> {
        TopologySpec::preset_shape(name, nodes, gpus, None)
    }

    /// A built-in cluster with `gpus` GPUs and `nics` NICs per node, each
    /// defaulting to the machine's (NICs: one per GPU, at most the
    /// machine's count, when only `gpus` is given). The name says the
    /// shape when it is not the machine's own: `4x DGX-H100 (4 GPUs, 2 NICs
    /// per node)`.
    pub fn preset_shape(
        name: &str,
        nodes: usize,
        gpus: Option<usize>,
        nics: Option<usize>,
    ) -> Result<TopologySpec> {
        let Some(m) = PRESETS.iter().find(|m| m.key == name) else {
            let known: Vec<&str> = PRESETS.iter().map(|m| m.key).collect();
            return Err(InputError::new(
                format!("<preset {}>", clip(name)),
                format!("unknown preset (known: {})", known.join(", ")),
            )
            .into());
        };
        let g = gpus.unwrap_or(m.gpus_per_node);
        let k = nics.unwrap_or(m.nics_per_node.min(g));
        let title = if g == m.gpus_per_node && k == m.nics_per_node {
            format!("{nodes}x {}", m.title)
        } else {
            let plural =
                |x: usize, what: &str| format!("{x} {what}{}", if x == 1 { "" } else { "s" });
            format!(
                "{nodes}x {} ({}, {} per node)",
                m.title,
                plural(g, "GPU"),
                plural(k, "NIC")
            )
        };
        let spec = TopologySpec {
            name: title,
            nodes,
            gpus_per_node: g,
            intra: Some(IntraSpec {
                kind: m.intra,
                bandwidth_gbps: m.intra_gbps,
                latency_us: 1.0,
            }),
            nic: Some(NicSpec {
                per_node: k,
                bandwidth_gbps: m.nic_gbps,
                latency_us: 3.0,
                gpu_nic: None,
            }),
            fabric: None,
            links: None,
        };
        // Validate through the same path as a file, so a bad --nodes is caught here.
        Topology::from_spec(spec.clone(), &format!("<preset {name}>"))?;
        Ok(spec)
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("topology spec serialises")
    }
}

impl Topology {
    /// A built-in cluster (see [`TopologySpec::preset`]).
    pub fn preset(name: &str, nodes: usize, gpus: Option<usize>) -> Result<Topology> {
        let spec = TopologySpec::preset(name, nodes, gpus)?;
        Topology::from_spec(spec, &format!("<preset {name}>"))
    }

    /// Validates a spec and builds its graph.
    pub fn from_spec(spec: TopologySpec, file: &str) -> Result<Topology> {
        let bad = |place: &str, reason: String| InputError::at(file, place, reason);
        if spec.nodes == 0 {
            return Err(bad("nodes", "must be at least 1".into()).into());
        }
        if spec.gpus_per_node == 0 {
            return Err(bad("gpus_per_node", "must be at least 1".into()).into());
        }
        let ranks = spec
            .nodes
            .checked_mul(spec.gpus_per_node)
            .filter(|&r| r <= MAX_GPUS);
        if ranks.is_none() {
            return Err(bad("nodes", "cluster too large (at most 2^20 GPUs)".into()).into());
        }
        if let Some(links) = &spec.links {
            if spec.nodes * spec.gpus_per_node > MAX_LINKS_GPUS {
                return Err(bad(
                    "nodes",
                    format!(
                        "a `links` topology has at most {MAX_LINKS_GPUS} GPUs (every pair's path is precomputed)"
                    ),
                )
                .into());
            }
            if spec.intra.is_some() || spec.nic.is_some() || spec.fabric.is_some() {
                return Err(bad(
                    "links",
                    "a `links` topology must not also have `intra`, `nic` or `fabric`".into(),
                )
                .into());
            }
            return build_links(spec.clone(), links.clone(), file);
        }
        build_hierarchical(spec, file)
    }

    pub fn spec(&self) -> &TopologySpec {
        &self.spec
    }
    pub fn name(&self) -> &str {
        &self.spec.name
    }
    pub fn ranks(&self) -> usize {
        self.spec.nodes * self.spec.gpus_per_node
    }
    pub fn nodes(&self) -> usize {
        self.spec.nodes
    }
    pub fn gpus_per_node(&self) -> usize {
        self.spec.gpus_per_node
    }
    pub fn node_of(&self, rank: usize) -> usize {
        rank / self.spec.gpus_per_node
    }
    pub fn local_of(&self, rank: usize) -> usize {
        rank % self.spec.gpus_per_node
    }
    /// True for the hierarchical form (intra/nic/fabric), false for `links`.
    pub fn is_hierarchical(&self) -> bool {
        matches!(self.form, Form::Hierarchical(_))
    }
    /// NICs per node (0 for a `links` topology or a single node without NICs).
    pub fn nics_per_node(&self) -> usize {
        self.spec.nic.as_ref().map_or(0, |n| n.per_node)
    }
    /// The NIC (rail) a rank sends and receives through: the `nic.gpu_nic`
    /// map's entry for its local index, or `local % per_node` without one.
    pub fn rail_of(&self, rank: usize) -> usize {
        let Some(nic) = self.spec.nic.as_ref() else {
            return 0;
        };
        let local = self.local_of(rank);
        match &nic.gpu_nic {
            Some(map) => map[local],
            None => local % nic.per_node,
        }
    }
    /// The fabric's kind (`None` without a `fabric`: one full-bisection leaf).
    pub fn fabric_kind(&self) -> Option<FabricKind> {
        self.spec.fabric.as_ref().map(|f| f.kind)
    }
    /// Leaf switch (fat-tree) or rail group (rail-optimized) of a node; 0
    /// without a fabric.
    pub fn leaf_of(&self, node: usize) -> usize {
        match &self.form {
            Form::Hierarchical(h) => node / h.nodes_per_group,
            Form::Links { .. } => 0,
        }
    }
    /// Leaves (fat-tree) or rail groups (rail-optimized).
    pub fn leaves(&self) -> usize {
        match &self.form {
            Form::Hierarchical(h) => self.spec.nodes.div_ceil(h.nodes_per_group),
            Form::Links { .. } => 1,
        }
    }
    /// Intra-node bandwidth per GPU (switch) or per pair (mesh), bytes/us.
    pub fn intra_bandwidth(&self) -> f64 {
        self.spec
            .intra
            .as_ref()
            .map_or(0.0, |i| i.bandwidth_gbps * BYTES_PER_US_PER_GBPS)
    }
    pub fn intra_kind(&self) -> Option<IntraKind> {
        self.spec.intra.as_ref().map(|i| i.kind)
    }
    /// Bandwidth of one NIC, bytes/us.
    pub fn nic_bandwidth(&self) -> f64 {
        self.spec
            .nic
            .as_ref()
            .map_or(0.0, |n| n.bandwidth_gbps * BYTES_PER_US_PER_GBPS)
    }

    pub fn graph(&self) -> &DiGraph<Vertex, Link> {
        &self.graph
    }
    pub fn num_links(&self) -> usize {
        self.graph.edge_count()
    }
    pub fn link(&self, id: LinkId) -> &Link {
        &self.graph[EdgeIndex::new(id as usize)]
    }
    /// The vertices a link joins.
    pub fn link_ends(&self, id: LinkId) -> (&Vertex, &Vertex) {
        let (a, b) = self
            .graph
            .edge_endpoints(EdgeIndex::new(id as usize))
            .expect("link id from this topology");
        (&self.graph[a], &self.graph[b])
    }
    /// A short name for a link: `gpu3->nvswitch0`, `nic1.2->leaf0`.
    pub fn link_name(&self, id: LinkId) -> String {
        let (a, b) = self.link_ends(id);
        format!("{}->{}", vertex_name(a), vertex_name(b))
    }
    pub fn gpu_vertex(&self, rank: usize) -> NodeIndex {
        self.gpu_vertex[rank]
    }

    /// Appends to `out` the links a transfer from `src` to `dst` crosses.
    /// A local copy (`src == dst`) crosses none. In the hierarchical form an
    /// inter-node transfer leaves through the sender's rail NIC and enters
    /// through the receiver's rail NIC.
    pub fn path_into(&self, src: usize, dst: usize, out: &mut Vec<LinkId>) {
        if src == dst {
            return;
        }
        match &self.form {
            Form::Links { paths } => out.extend_from_slice(&paths[src * self.ranks() + dst]),
            Form::Hierarchical(h) => {
                let g = h.gpus_per_node;
                let (ns, nd) = (src / g, dst / g);
                if ns == nd {
                    match h.intra_kind {
                        IntraKind::Switch => {
                            out.push(h.gpu_out[src]);
                            out.push(h.gpu_in[dst]);
                        }
                        IntraKind::Mesh => out.push(h.mesh[src * g + dst % g]),
                    }
                    return;
                }
                let p = h.nics_per_node;
                let (ks, kd) = (h.rail[src % g], h.rail[dst % g]);
                out.push(h.pcie_out[src]);
                out.push(h.nic_tx[ns * p + ks]);
                let (ls, ld) = (ns / h.nodes_per_group, nd / h.nodes_per_group);
                if h.rails {
                    // Same rail in the same group: the rail switch alone.
                    if ls != ld || ks != kd {
                        out.push(h.uplink[ls * p + ks]);
                        out.push(h.downlink[ld * p + kd]);
                    }
                } else if ls != ld {
                    out.push(h.uplink[ls]);
                    out.push(h.downlink[ld]);
                }
                out.push(h.nic_rx[nd * p + kd]);
                out.push(h.pcie_in[dst]);
            }
        }
    }

    /// The links from `src` to `dst` (allocates; see [`Topology::path_into`]).
    pub fn path(&self, src: usize, dst: usize) -> Vec<LinkId> {
        let mut v = Vec::new();
        self.path_into(src, dst, &mut v);
        v
    }

    /// Sum of link latencies on the path from `src` to `dst`, microseconds.
    pub fn path_latency(&self, src: usize, dst: usize) -> f64 {
        let mut v = Vec::with_capacity(8);
        self.path_into(src, dst, &mut v);
        v.iter().map(|&l| self.link(l).latency_us).sum()
    }
}

/// The name a vertex has in a `links` file.
pub fn vertex_name(v: &Vertex) -> String {
    match v {
        Vertex::Gpu(r) => format!("gpu{r}"),
        Vertex::Switch(n) => format!("nvswitch{n}"),
        Vertex::Nic(n, k) => format!("nic{n}.{k}"),
        Vertex::Leaf(l) => format!("leaf{l}"),
        Vertex::Rail(g, k) => format!("rail{g}.{k}"),
        Vertex::Spine => "spine".to_string(),
        Vertex::Named(s) => s.clone(),
    }
}

/// The fastest link is at most [`MAX_BANDWIDTH_SPAN`] times the slowest:
/// beyond, HiGHS calls the LP bound's flow problem infeasible. `links` are
/// `(place, GB/s)`; the error names the fastest.
fn check_bandwidth_span(file: &str, links: impl Iterator<Item = (String, f64)>) -> Result<()> {
    let mut slow: Option<(String, f64)> = None;
    let mut fast: Option<(String, f64)> = None;
    for (place, bw) in links {
        if slow.as_ref().is_none_or(|s| bw < s.1) {
            slow = Some((place.clone(), bw));
        }
        if fast.as_ref().is_none_or(|f| bw > f.1) {
            fast = Some((place, bw));
        }
    }
    if let (Some((slow_at, lo)), Some((fast_at, hi))) = (slow, fast) {
        if hi > lo * MAX_BANDWIDTH_SPAN {
            return Err(InputError::at(
                file,
                fast_at,
                format!(
                    "a link of {} GB/s is more than {MAX_BANDWIDTH_SPAN:e} times the slowest, {} GB/s ({slow_at}); the LP bound cannot solve across that span",
                    num(hi),
                    num(lo)
                ),
            )
            .into());
        }
    }
    Ok(())
}

/// A bandwidth in GB/s: positive and within [`BANDWIDTH_RANGE_GBPS`].
fn check_positive(file: &str, place: &str, x: f64) -> Result<()> {
    if !x.is_finite() || x <= 0.0 {
        return Err(InputError::at(
            file,
            place,
            format!("must be a positive number, got {}", num(x)),
        )
        .into());
    }
    check_range(file, place, x, BANDWIDTH_RANGE_GBPS)
}

fn check_range(file: &str, place: &str, x: f64, (lo, hi): (f64, f64)) -> Result<()> {
    if !x.is_finite() || x < lo || x > hi {
        return Err(InputError::at(
            file,
            place,
            format!("must be between {lo:e} and {hi:e}, got {}", num(x)),
        )
        .into());
    }
    Ok(())
}

fn check_latency(file: &str, place: &str, x: f64) -> Result<()> {
    if !x.is_finite() || x < 0.0 {
        return Err(InputError::at(
            file,
            place,
            format!("must be zero or positive, got {}", num(x)),
        )
        .into());
    }
    if x > MAX_LATENCY_US {
        return Err(InputError::at(
            file,
            place,
            format!("must be at most {MAX_LATENCY_US:e} us, got {}", num(x)),
        )
        .into());
    }
    Ok(())
}

/// A rail map has one entry per local GPU, each a NIC of the node.
fn check_rail_map(file: &str, map: &[usize], gpus: usize, nics: usize) -> Result<()> {
    if map.len() != gpus {
        return Err(InputError::at(
            file,
            "nic.gpu_nic",
            format!(
                "has {} entries; it needs one per GPU of a node ({gpus})",
                map.len()
            ),
        )
        .into());
    }
    if let Some((l, &k)) = map.iter().enumerate().find(|&(_, &k)| k >= nics) {
        return Err(InputError::at(
            file,
            format!("nic.gpu_nic[{l}]"),
            format!(
                "NIC {k} does not exist: a node has {nics} NICs (0..{})",
                nics - 1
            ),
        )
        .into());
    }
    Ok(())
}

/// Nodes per leaf (fat-tree) or per rail group (rail-optimized), checking
/// that the fabric gives its own kind's size field and not the other's.
fn fabric_group_size(f: &FabricSpec, nodes: usize, file: &str) -> Result<usize> {
    let (own, other) = match f.kind {
        FabricKind::FatTree => (
            ("nodes_per_leaf", f.nodes_per_leaf),
            ("nodes_per_group", f.nodes_per_group),
        ),
        FabricKind::RailOptimized => (
            ("nodes_per_group", f.nodes_per_group),
            ("nodes_per_leaf", f.nodes_per_leaf),
        ),
    };
    let kind = f.kind.as_str();
    if other.1.is_some() {
        return Err(InputError::at(
            file,
            format!("fabric.{}", other.0),
            format!(
                "is not a field of a {kind} fabric (its size field is `{}`)",
                own.0
            ),
        )
        .into());
    }
    let place = format!("fabric.{}", own.0);
    match own.1 {
        Some(0) => Err(InputError::at(file, place, "must be at least 1").into()),
        Some(k) => Ok(k),
        None if f.kind == FabricKind::RailOptimized => Ok(nodes),
        None => Err(InputError::at(
            file,
            place,
            format!("missing: a {kind} fabric needs the number of nodes under each leaf switch"),
        )
        .into()),
    }
}

fn build_hierarchical(spec: TopologySpec, file: &str) -> Result<Topology> {
    let g = spec.gpus_per_node;
    let n = spec.nodes;
    let intra = spec
        .intra
        .clone()
        .ok_or_else(|| InputError::at(file, "intra", "missing (or give a `links` list)"))?;
    check_positive(file, "intra.bandwidth_GBps", intra.bandwidth_gbps)?;
    check_latency(file, "intra.latency_us", intra.latency_us)?;
    // n <= 2^20 and g <= 2^20 (checked above), so this cannot overflow.
    let mesh_links = n * g * (g - 1);
    if intra.kind == IntraKind::Mesh && mesh_links > MAX_MESH_LINKS {
        return Err(InputError::at(
            file,
            "gpus_per_node",
            format!(
                "a full mesh of {g} GPUs in each of {n} nodes has {mesh_links} links; at most 2^24"
            ),
        )
        .into());
    }
    let nic = match (&spec.nic, n) {
        (Some(nic), _) => {
            if nic.per_node == 0 {
                return Err(InputError::at(file, "nic.per_node", "must be at least 1").into());
            }
            if nic.per_node.checked_mul(n).is_none_or(|x| x > MAX_GPUS) {
                return Err(InputError::at(
                    file,
                    "nic.per_node",
                    format!(
                        "{} NICs per node: at most 2^20 NICs in all, as for GPUs",
                        nic.per_node
                    ),
                )
                .into());
            }
            check_positive(file, "nic.bandwidth_GBps", nic.bandwidth_gbps)?;
            check_latency(file, "nic.latency_us", nic.latency_us)?;
            if let Some(map) = &nic.gpu_nic {
                check_rail_map(file, map, g, nic.per_node)?;
            }
            Some(nic.clone())
        }
        (None, 1) => None,
        (None, _) => {
            return Err(InputError::at(
                file,
                "nic",
                "missing: a cluster of several nodes needs NICs",
            )
            .into())
        }
    };
    let (nodes_per_group, rails) = match &spec.fabric {
        Some(f) => {
            let size = fabric_group_size(f, n, file)?;
            check_range(
                file,
                "fabric.oversubscription",
                f.oversubscription,
                OVERSUBSCRIPTION_RANGE,
            )?;
            check_latency(file, "fabric.latency_us", f.latency_us)?;
            (size, f.kind == FabricKind::RailOptimized)
        }
        None => (n, false),
    };
    let fabric_latency = spec.fabric.as_ref().map_or(0.0, |f| f.latency_us);

    let mut graph = DiGraph::new();
    let gpu_vertex: Vec<NodeIndex> = (0..n * g).map(|r| graph.add_node(Vertex::Gpu(r))).collect();
    let bw_intra = intra.bandwidth_gbps * BYTES_PER_US_PER_GBPS;
    let add = |graph: &mut DiGraph<Vertex, Link>, a, b, bandwidth, latency_us, class| {
        graph
            .add_edge(
                a,
                b,
                Link {
                    bandwidth,
                    latency_us,
                    class,
                },
            )
            .index() as LinkId
    };
    let mut h = Hier {
        gpus_per_node: g,
        nics_per_node: nic.as_ref().map_or(1, |x| x.per_node),
        rail: (0..g)
            .map(|l| match nic.as_ref() {
                Some(NicSpec {
                    gpu_nic: Some(map), ..
                }) => map[l],
                Some(x) => l % x.per_node,
                None => 0,
            })
            .collect(),
        nodes_per_group,
        rails,
        intra_kind: intra.kind,
        gpu_out: vec![],
        gpu_in: vec![],
        mesh: vec![],
        pcie_out: vec![],
        pcie_in: vec![],
        nic_tx: vec![],
        nic_rx: vec![],
        uplink: vec![],
        downlink: vec![],
    };
    for node in 0..n {
        match intra.kind {
            IntraKind::Switch => {
                let sw = graph.add_node(Vertex::Switch(node));
                for local in 0..g {
                    let v = gpu_vertex[node * g + local];
                    h.gpu_out.push(add(
                        &mut graph,
                        v,
                        sw,
                        bw_intra,
                        intra.latency_us,
                        LinkClass::NvlinkOut,
                    ));
                    h.gpu_in
                        .push(add(&mut graph, sw, v, bw_intra, 0.0, LinkClass::NvlinkIn));
                }
            }
            IntraKind::Mesh => {
                for i in 0..g {
                    for j in 0..g {
                        let (a, b) = (gpu_vertex[node * g + i], gpu_vertex[node * g + j]);
                        // The diagonal is never used; keep the table dense with a dummy id.
                        h.mesh.push(if i == j {
                            LinkId::MAX
                        } else {
                            add(
                                &mut graph,
                                a,
                                b,
                                bw_intra,
                                intra.latency_us,
                                LinkClass::NvlinkOut,
                            )
                        });
                    }
                }
            }
        }
    }
    // h.mesh is indexed by s * g + j with s a global rank.
    if let Some(nic) = &nic {
        let bw_nic = nic.bandwidth_gbps * BYTES_PER_US_PER_GBPS;
        let p = nic.per_node;
        let groups = n.div_ceil(nodes_per_group);
        // The switch each NIC plugs into: its leaf, or its group's rail switch.
        let switches = if rails { groups * p } else { groups };
        let switch_v: Vec<NodeIndex> = (0..switches)
            .map(|i| {
                graph.add_node(if rails {
                    Vertex::Rail(i / p, i % p)
                } else {
                    Vertex::Leaf(i)
                })
            })
            .collect();
        let switch_of = |node: usize, k: usize| {
            let group = node / nodes_per_group;
            if rails {
                group * p + k
            } else {
                group
            }
        };
        let mut nic_v = Vec::with_capacity(n * p);
        for node in 0..n {
            for k in 0..p {
                let v = graph.add_node(Vertex::Nic(node, k));
                nic_v.push(v);
                let sw = switch_v[switch_of(node, k)];
                h.nic_tx.push(add(
                    &mut graph,
                    v,
                    sw,
                    bw_nic,
                    nic.latency_us + fabric_latency,
                    LinkClass::NicTx,
                ));
                h.nic_rx
                    .push(add(&mut graph, sw, v, bw_nic, 0.0, LinkClass::NicRx));
            }
        }
        for r in 0..n * g {
            let nv = nic_v[(r / g) * p + h.rail[r % g]];
            // PCIe between a GPU and its NIC: modelled at the NIC's rate, so it
            // binds only when several GPUs share one NIC.
            h.pcie_out.push(add(
                &mut graph,
                gpu_vertex[r],
                nv,
                bw_nic,
                0.0,
                LinkClass::PcieOut,
            ));
            h.pcie_in.push(add(
                &mut graph,
                nv,
                gpu_vertex[r],
                bw_nic,
                0.0,
                LinkClass::PcieIn,
            ));
        }
        // A spine when some path needs one: several leaves, or (rail) several
        // rail switches.
        if switches > 1 {
            let spine = graph.add_node(Vertex::Spine);
            let over = spec.fabric.as_ref().map_or(1.0, |f| f.oversubscription);
            for (i, &sv) in switch_v.iter().enumerate() {
                let group = if rails { i / p } else { i };
                let nodes_here = nodes_per_group.min(n - group * nodes_per_group);
                // A leaf carries all its nodes' NICs, a rail switch one NIC of each.
                let nics_here = if rails { nodes_here } else { nodes_here * p };
                let bw = nics_here as f64 * bw_nic / over;
                h.uplink.push(add(
                    &mut graph,
                    sv,
                    spine,
                    bw,
                    fabric_latency,
                    LinkClass::Uplink,
                ));
                h.downlink
                    .push(add(&mut graph, spine, sv, bw, 0.0, LinkClass::Downlink));
            }
        }
    }
    let bandwidths = graph.edge_weights().map(|l| {
        let place = match l.class {
            LinkClass::NvlinkOut | LinkClass::NvlinkIn => "intra.bandwidth_GBps",
            LinkClass::Uplink | LinkClass::Downlink => "fabric.oversubscription",
            _ => "nic.bandwidth_GBps",
        };
        (place.to_string(), l.bandwidth / BYTES_PER_US_PER_GBPS)
    });
    check_bandwidth_span(file, bandwidths)?;
    Ok(Topology {
        spec,
        graph,
        gpu_vertex,
        form: Form::Hierarchical(Box::new(h)),
    })
}

/// The rank a `links` vertex name stands for: `Ok(Some(r))` for `gpu<r>`,
/// `Ok(None)` for a vertex of its own (`sw0`, `nic1.2`, `spine`). A name
/// that looks like a GPU, `gpu` in any case followed by digits, signs and
/// separators, but is not written `gpu<r>` for a rank `r` the cluster has
/// (`GPU0`, `gpu01`, `gpu-1`, `gpu_2`, `gpu99`) is an error: it used to
/// become a switch vertex, and the GPU it meant silently lost the link.
fn parse_vertex(name: &str, ranks: usize) -> std::result::Result<Option<usize>, String> {
    let separator = |b: u8| b"-+_.:# ".contains(&b);
    let t = name.trim();
    let rest = match t.get(..3) {
        Some(p) if p.eq_ignore_ascii_case("gpu") => &t[3..],
        _ => return Ok(None),
    };
    if !rest.bytes().any(|b| b.is_ascii_digit())
        || !rest.bytes().all(|b| b.is_ascii_digit() || separator(b))
    {
        return Ok(None);
    }
    let gpus = format!("the topology has {ranks} GPUs (gpu0..gpu{})", ranks - 1);
    let number: String = rest.chars().filter(char::is_ascii_digit).collect();
    let r = number.parse::<usize>().ok().filter(|&r| r < ranks);
    if name == format!("gpu{number}") && (number == "0" || !number.starts_with('0')) {
        return r
            .map(Some)
            .ok_or_else(|| format!("{} does not exist: {gpus}", clip(name)));
    }
    // `GPU1`, `gpu01`, `gpu_1`: one number, no sign; not `gpu1.2`.
    let plain = rest
        .trim_start_matches(|c: char| c != '-' && separator(c as u8))
        .bytes()
        .all(|b| b.is_ascii_digit());
    match r {
        Some(r) if plain => {
            Err(format!("`{}` is not a GPU's name; write gpu{r}", clip(name)))
        }
        _ => Err(format!(
            "`{}` looks like a GPU's name but is none: {gpus}, written in lower case with no sign, separator or leading zero",
            clip(name)
        )),
    }
}

fn build_links(spec: TopologySpec, links: Vec<LinkSpec>, file: &str) -> Result<Topology> {
    let ranks = spec.nodes * spec.gpus_per_node;
    if links.is_empty() {
        return Err(InputError::at(file, "links", "is empty").into());
    }
    let mut graph = DiGraph::new();
    let gpu_vertex: Vec<NodeIndex> = (0..ranks).map(|r| graph.add_node(Vertex::Gpu(r))).collect();
    let mut named: HashMap<String, NodeIndex> = HashMap::new();
    let mut vertex =
        |graph: &mut DiGraph<Vertex, Link>, name: &str, place: &str| -> Result<NodeIndex> {
            match parse_vertex(name, ranks) {
                Ok(Some(r)) => Ok(gpu_vertex[r]),
                Ok(None) => Ok(*named
                    .entry(name.to_string())
                    .or_insert_with(|| graph.add_node(Vertex::Named(name.to_string())))),
                Err(reason) => Err(InputError::at(file, place, reason).into()),
            }
        };
    for (i, l) in links.iter().enumerate() {
        check_positive(
            file,
            &format!("links[{i}].bandwidth_GBps"),
            l.bandwidth_gbps,
        )?;
    }
    check_bandwidth_span(
        file,
        links
            .iter()
            .enumerate()
            .map(|(i, l)| (format!("links[{i}].bandwidth_GBps"), l.bandwidth_gbps)),
    )?;
    for (i, l) in links.iter().enumerate() {
        let place = format!("links[{i}]");
        check_positive(file, &format!("{place}.bandwidth_GBps"), l.bandwidth_gbps)?;
        check_latency(file, &format!("{place}.latency_us"), l.latency_us)?;
        if l.from == l.to {
            return Err(
                InputError::at(file, &place, format!("link from {} to itself", l.from)).into(),
            );
        }
        let a = vertex(&mut graph, &l.from, &format!("{place}.from"))?;
        let b = vertex(&mut graph, &l.to, &format!("{place}.to"))?;
        let link = Link {
            bandwidth: l.bandwidth_gbps * BYTES_PER_US_PER_GBPS,
            latency_us: l.latency_us,
            class: LinkClass::Generic,
        };
        graph.add_edge(a, b, link.clone());
        if l.bidirectional {
            graph.add_edge(b, a, link);
        }
    }
    // All-pairs GPU paths: fewest hops, then least latency (Dijkstra on a
    // lexicographic cost). Any GPU that cannot reach another is an error.
    let mut paths = vec![Vec::new(); ranks * ranks];
    for s in 0..ranks {
        let pred = shortest_tree(&graph, gpu_vertex[s]);
        for d in 0..ranks {
            if s == d {
                continue;
            }
            let mut path = Vec::new();
            let mut v = gpu_vertex[d];
            while v != gpu_vertex[s] {
                match pred[v.index()] {
                    Some(e) => {
                        path.push(e.index() as LinkId);
                        v = graph.edge_endpoints(e).expect("edge").0;
                    }
                    None => {
                        return Err(InputError::at(
                            file,
                            "links",
                            format!("graph is disconnected: no path from gpu{s} to gpu{d}"),
                        )
                        .into())
                    }
                }
            }
            path.reverse();
            paths[s * ranks + d] = path;
        }
    }
    Ok(Topology {
        spec,
        graph,
        gpu_vertex,
        form: Form::Links { paths },
    })
}

/// Predecessor edge of every vertex on a fewest-hops-then-least-latency tree from `src`.
fn shortest_tree(graph: &DiGraph<Vertex, Link>, src: NodeIndex) -> Vec<Option<EdgeIndex>> {
    use petgraph::visit::EdgeRef;
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    let n = graph.node_count();
    let mut best: Vec<(u32, f64)> = vec![(u32::MAX, f64::INFINITY); n];
    let mut pred = vec![None; n];
    let mut heap = BinaryHeap::new();
    best[src.index()] = (0, 0.0);
    // Latency is compared in picoseconds as an integer so the heap key is Ord.
    heap.push(Reverse((0u32, 0u64, src.index())));
    while let Some(Reverse((hops, lat_ps, v))) = heap.pop() {
        let (bh, bl) = best[v];
        if (hops, lat_ps) > (bh, (bl * 1e6) as u64) {
            continue;
        }
        for e in graph.edges(NodeIndex::new(v)) {
            let w = e.target().index();
            let cand = (hops + 1, bl + e.weight().latency_us);
            if cand.0 < best[w].0 || (cand.0 == best[w].0 && cand.1 < best[w].1) {
                best[w] = cand;
                pred[w] = Some(e.id());
                heap.push(Reverse((cand.0, (cand.1 * 1e6) as u64, w)));
            }
        }
    }
    pred
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dgx_h100_paths() {
        let t = Topology::preset("dgx-h100", 2, None).unwrap();
        assert_eq!(t.ranks(), 16);
        // intra-node: GPU egress then ingress on the NVSwitch
        let p = t.path(0, 3);
        assert_eq!(p.len(), 2);
        assert_eq!(t.link(p[0]).class, LinkClass::NvlinkOut);
        assert_eq!(t.link(p[1]).class, LinkClass::NvlinkIn);
        assert_eq!(t.link(p[0]).bandwidth, 450_000.0);
        // inter-node: own rail out, peer's rail in
        let p = t.path(2, 13);
        let classes: Vec<_> = p.iter().map(|&l| t.link(l).class).collect();
        assert_eq!(
            classes,
            [
                LinkClass::PcieOut,
                LinkClass::NicTx,
                LinkClass::NicRx,
                LinkClass::PcieIn
            ]
        );
        assert_eq!(t.link_name(p[1]), "nic0.2->leaf0");
        assert_eq!(t.link_name(p[2]), "leaf0->nic1.5");
        assert_eq!(t.path(5, 5), Vec::<LinkId>::new());
        assert!((t.path_latency(2, 13) - 3.0).abs() < 1e-12);
    }

    #[test]
    fn fat_tree_uplinks() {
        let mut spec = TopologySpec::preset("dgx-h100", 8, None).unwrap();
        spec.fabric = Some(FabricSpec::fat_tree(4, 4.0, 1.0));
        let t = Topology::from_spec(spec, "t").unwrap();
        assert_eq!(t.leaves(), 2);
        assert_eq!(t.fabric_kind(), Some(FabricKind::FatTree));
        let p = t.path(0, 8 * 4);
        let up = p
            .iter()
            .find(|&&l| t.link(l).class == LinkClass::Uplink)
            .unwrap();
        // 4 nodes x 8 NICs x 50 GB/s / 4
        assert_eq!(t.link(*up).bandwidth, 4.0 * 8.0 * 50_000.0 / 4.0);
        // same leaf: no uplink
        assert!(t
            .path(0, 8)
            .iter()
            .all(|&l| t.link(l).class != LinkClass::Uplink));
    }

    /// 4 (or `nodes`) nodes of 2 GPUs and 2 NICs of 50 GB/s, rail groups of 2, 2:1.
    fn rail_2to1(nodes: usize) -> Topology {
        let mut spec = TopologySpec::preset("dgx-h100", nodes, Some(2)).unwrap();
        spec.fabric = Some(FabricSpec::rail_optimized(Some(2), 2.0, 1.0));
        Topology::from_spec(spec, "t").unwrap()
    }

    #[test]
    fn rail_optimized_paths() {
        let t = rail_2to1(4);
        assert_eq!(t.fabric_kind(), Some(FabricKind::RailOptimized));
        assert_eq!(t.leaves(), 2);
        let classes = |p: &[LinkId]| p.iter().map(|&l| t.link(l).class).collect::<Vec<_>>();
        let names = |p: &[LinkId]| p.iter().map(|&l| t.link_name(l)).collect::<Vec<_>>();
        // Same rail, same group: NIC -> rail switch -> NIC.
        let p = t.path(0, 2);
        assert_eq!(
            classes(&p),
            [
                LinkClass::PcieOut,
                LinkClass::NicTx,
                LinkClass::NicRx,
                LinkClass::PcieIn
            ]
        );
        assert_eq!(names(&p)[1..3], ["nic0.0->rail0.0", "rail0.0->nic1.0"]);
        assert!((t.path_latency(0, 2) - 4.0).abs() < 1e-12);
        // Another rail in the same group: up to the spine and down the other rail.
        let p = t.path(0, 3);
        assert_eq!(
            names(&p)[1..5],
            [
                "nic0.0->rail0.0",
                "rail0.0->spine",
                "spine->rail0.1",
                "rail0.1->nic1.1"
            ]
        );
        // The same rail in another group: the spine too.
        let p = t.path(1, 5);
        assert_eq!(
            names(&p)[1..5],
            [
                "nic0.1->rail0.1",
                "rail0.1->spine",
                "spine->rail1.1",
                "rail1.1->nic2.1"
            ]
        );
        assert!((t.path_latency(1, 5) - 5.0).abs() < 1e-12);
        // A rail switch's spine link: its group's 2 NICs on that rail x 50 GB/s / 2.
        assert_eq!(t.link(p[2]).class, LinkClass::Uplink);
        assert_eq!(t.link(p[2]).bandwidth, 50_000.0);
        assert_eq!(t.link(p[3]).bandwidth, 50_000.0);
        // A short last group has fewer NICs on each rail.
        let t5 = rail_2to1(5);
        let p = t5.path(8, 0);
        assert_eq!(t5.link_name(p[2]), "rail2.0->spine");
        assert_eq!(t5.link(p[2]).bandwidth, 25_000.0);
    }

    #[test]
    fn rail_optimized_one_rail_one_group_has_no_spine() {
        let mut spec = TopologySpec::preset("dgx-h100", 3, Some(1)).unwrap();
        spec.fabric = Some(FabricSpec::rail_optimized(None, 2.0, 1.0));
        let t = Topology::from_spec(spec, "t").unwrap();
        assert_eq!(t.leaves(), 1);
        assert!(t.graph().node_weights().all(|v| *v != Vertex::Spine));
        assert_eq!(t.path(0, 2).len(), 4);
        // Two rails: cross-rail traffic needs the spine even in one group.
        let mut spec = TopologySpec::preset("dgx-h100", 3, Some(2)).unwrap();
        spec.fabric = Some(FabricSpec::rail_optimized(None, 1.0, 0.0));
        let t = Topology::from_spec(spec, "t").unwrap();
        assert_eq!(t.path(0, 3).len(), 6);
        assert_eq!(t.path(0, 4).len(), 4);
    }

    #[test]
    fn fabric_json_round_trip_and_errors() {
        let head = r#"{"name":"x","nodes":4,"gpus_per_node":2,"intra":{"kind":"switch","bandwidth_GBps":450,"latency_us":1},"nic":{"per_node":2,"bandwidth_GBps":50,"latency_us":3},"fabric":"#;
        let with = |fabric: &str| format!("{head}{fabric}}}");
        let t = Topology::from_json_str(
            &with(r#"{"kind":"rail-optimized","nodes_per_group":2,"oversubscription":2.0,"latency_us":1.0}"#),
            "t.json",
        )
        .unwrap();
        assert_eq!(t.path(0, 4).len(), 6);
        let text = t.spec().to_json();
        assert!(text.contains(r#""kind": "rail-optimized""#), "{text}");
        assert!(!text.contains("nodes_per_leaf"), "{text}");
        let back = Topology::from_json_str(&text, "back.json").unwrap();
        assert_eq!(back.spec(), t.spec());
        // nodes_per_group omitted: one group of all nodes.
        let one = Topology::from_json_str(
            &with(r#"{"kind":"rail-optimized","oversubscription":2}"#),
            "t.json",
        )
        .unwrap();
        assert_eq!(one.leaves(), 1);
        assert_eq!(one.path(0, 4).len(), 4);
        // A fat-tree writes and reads back as before.
        let ft =
            Topology::from_json_str(&with(r#"{"kind":"fat-tree","nodes_per_leaf":2}"#), "t.json")
                .unwrap();
        let text = ft.spec().to_json();
        assert!(!text.contains("nodes_per_group"), "{text}");
        assert_eq!(
            Topology::from_json_str(&text, "b").unwrap().spec(),
            ft.spec()
        );
        let e = |fabric: &str| {
            Topology::from_json_str(&with(fabric), "t.json")
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            e(r#"{"kind":"rail-optimized","nodes_per_leaf":2}"#),
            "t.json: fabric.nodes_per_leaf: is not a field of a rail-optimized fabric (its size field is `nodes_per_group`)"
        );
        assert_eq!(
            e(r#"{"kind":"fat-tree","nodes_per_leaf":2,"nodes_per_group":2}"#),
            "t.json: fabric.nodes_per_group: is not a field of a fat-tree fabric (its size field is `nodes_per_leaf`)"
        );
        assert_eq!(
            e(r#"{"kind":"fat-tree"}"#),
            "t.json: fabric.nodes_per_leaf: missing: a fat-tree fabric needs the number of nodes under each leaf switch"
        );
        assert_eq!(
            e(r#"{"kind":"rail-optimized","nodes_per_group":0}"#),
            "t.json: fabric.nodes_per_group: must be at least 1"
        );
        assert!(e(r#"{"kind":"rail-optimized","oversubscription":0}"#)
            .contains("fabric.oversubscription: must be between"));
        assert!(e(r#"{"kind":"rail-optimised"}"#).contains("unknown variant"));
        assert!(e(r#"{"kind":"rail-optimized","nodes_per_grup":2}"#)
            .contains("unknown field `nodes_per_grup`"));
    }

    #[test]
    fn presets_have_their_figures_and_say_their_shape() {
        let spec = |name, g, k| TopologySpec::preset_shape(name, 4, g, k).unwrap();
        // (preset, GPUs, intra GB/s, NICs, NIC GB/s): docs/formats.md, "Presets".
        for (name, gpus, intra, nics, nic) in [
            ("dgx-a100", 8, 300.0, 8, 25.0),
            ("dgx-h100", 8, 450.0, 8, 50.0),
            ("dgx-h200", 8, 450.0, 8, 50.0),
            ("dgx-b200", 8, 900.0, 8, 50.0),
            ("gb200-nvl72", 72, 900.0, 72, 50.0),
            ("mi300x", 8, 64.0, 8, 50.0),
        ] {
            let s = spec(name, None, None);
            let (i, n) = (s.intra.as_ref().unwrap(), s.nic.as_ref().unwrap());
            assert_eq!(
                (
                    s.gpus_per_node,
                    i.bandwidth_gbps,
                    n.per_node,
                    n.bandwidth_gbps
                ),
                (gpus, intra, nics, nic),
                "{name}"
            );
            assert!(!s.name.contains('('), "{name}: {}", s.name);
        }
        assert_eq!(
            spec("mi300x", None, None).intra.unwrap().kind,
            IntraKind::Mesh
        );
        assert_eq!(spec("dgx-h100", None, None).name, "4x DGX-H100");
        assert_eq!(spec("gb200-nvl72", None, None).name, "4x GB200-NVL72");
        // GPUs and NICs are set independently, and the name says so.
        let s = spec("dgx-h100", Some(4), Some(2));
        assert_eq!((s.gpus_per_node, s.nic.as_ref().unwrap().per_node), (4, 2));
        assert_eq!(s.name, "4x DGX-H100 (4 GPUs, 2 NICs per node)");
        let s = spec("dgx-h100", None, Some(1));
        assert_eq!(s.gpus_per_node, 8);
        assert_eq!(s.name, "4x DGX-H100 (8 GPUs, 1 NIC per node)");
        // GPUs alone: one NIC each, at most the machine's count.
        assert_eq!(spec("dgx-h100", Some(2), None).nic.unwrap().per_node, 2);
        assert_eq!(spec("dgx-h100", Some(16), None).nic.unwrap().per_node, 8);
        let e = TopologySpec::preset_shape("dgx-h100", 2, None, Some(0))
            .unwrap_err()
            .to_string();
        assert_eq!(e, "<preset dgx-h100>: nic.per_node: must be at least 1");
    }

    #[test]
    fn mesh_has_pair_links() {
        let t = Topology::preset("mi300x", 1, None).unwrap();
        let p = t.path(1, 6);
        assert_eq!(p.len(), 1);
        assert_eq!(t.link_name(p[0]), "gpu1->gpu6");
        assert_ne!(t.path(6, 1), p);
    }

    #[test]
    fn links_ring() {
        let text = r#"{"name":"ring","nodes":4,"gpus_per_node":1,"links":[
            {"from":"gpu0","to":"gpu1","bandwidth_GBps":10,"latency_us":1,"bidirectional":true},
            {"from":"gpu1","to":"gpu2","bandwidth_GBps":10,"latency_us":1,"bidirectional":true},
            {"from":"gpu2","to":"gpu3","bandwidth_GBps":10,"latency_us":1,"bidirectional":true},
            {"from":"gpu3","to":"gpu0","bandwidth_GBps":10,"latency_us":1,"bidirectional":true}]}"#;
        let t = Topology::from_json_str(text, "ring.json").unwrap();
        assert_eq!(t.path(0, 2).len(), 2);
        assert_eq!(t.path(0, 1).len(), 1);
        assert!(!t.is_hierarchical());
    }

    #[test]
    fn disconnected_links_rejected() {
        let text = r#"{"name":"x","nodes":3,"gpus_per_node":1,"links":[
            {"from":"gpu0","to":"gpu1","bandwidth_GBps":10,"bidirectional":true}]}"#;
        let e = Topology::from_json_str(text, "x.json")
            .unwrap_err()
            .to_string();
        assert!(e.contains("disconnected"), "{e}");
        assert!(e.starts_with("x.json: links: "), "{e}");
    }

    #[test]
    fn absurd_sizes_and_values_rejected() {
        let e = |text: &str| {
            Topology::from_json_str(text, "t.json")
                .unwrap_err()
                .to_string()
        };
        let intra = r#""intra":{"kind":"switch","bandwidth_GBps":100,"latency_us":1}"#;
        let two = |nic: &str| {
            format!(r#"{{"name":"x","nodes":2,"gpus_per_node":2,{intra},"nic":{nic}}}"#)
        };
        // 1e308 GB/s became an infinite capacity (the LP failed); 1e-320 a rate of 0 (the simulator stalled).
        assert_eq!(
            e(&two(
                r#"{"per_node":2,"bandwidth_GBps":1e308,"latency_us":1}"#
            )),
            "t.json: nic.bandwidth_GBps: must be between 1e-3 and 1e6, got 1e308"
        );
        assert!(e(&two(
            r#"{"per_node":2,"bandwidth_GBps":1e-320,"latency_us":1}"#
        ))
        .contains("got 1e-320"));
        assert!(e(&two(
            r#"{"per_node":2,"bandwidth_GBps":50,"latency_us":1e308}"#
        ))
        .contains("nic.latency_us: must be at most 1e9 us, got 1e308"));
        // 10^12 NICs per node were allocated before anything used them.
        assert!(e(&two(
            r#"{"per_node":1000000000000,"bandwidth_GBps":50,"latency_us":1}"#
        ))
        .starts_with("t.json: nic.per_node: 1000000000000 NICs per node: at most 2^20"));
        let fabric = |over: &str| {
            format!(
                r#"{{"name":"x","nodes":2,"gpus_per_node":2,{intra},"nic":{{"per_node":2,"bandwidth_GBps":5,"latency_us":1}},"fabric":{{"kind":"fat-tree","nodes_per_leaf":1,"oversubscription":{over}}}}}"#
            )
        };
        assert!(e(&fabric("1e-300")).contains("fabric.oversubscription: must be between"));
        assert!(Topology::from_json_str(&fabric("4"), "t.json").is_ok());
        // A full mesh of 2^20 GPUs would be 2^40 links; all-pairs paths of 2^20 GPUs 2^40 paths.
        let mesh = r#"{"name":"x","nodes":1,"gpus_per_node":1048576,"intra":{"kind":"mesh","bandwidth_GBps":100,"latency_us":1}}"#;
        assert!(e(mesh)
            .starts_with("t.json: gpus_per_node: a full mesh of 1048576 GPUs in each of 1 nodes"));
        let links = r#"{"name":"x","nodes":1048576,"gpus_per_node":1,"links":[{"from":"gpu0","to":"gpu1","bandwidth_GBps":1}]}"#;
        assert!(e(links).starts_with("t.json: nodes: a `links` topology has at most 1024 GPUs"));
        // Links from 1e-3 to 1e6 GB/s made the LP bound infeasible in HiGHS.
        let span = r#"{"name":"x","nodes":2,"gpus_per_node":2,"intra":{"kind":"switch","bandwidth_GBps":1e6,"latency_us":0},"nic":{"per_node":2,"bandwidth_GBps":1e-3,"latency_us":1}}"#;
        assert_eq!(e(span), "t.json: intra.bandwidth_GBps: a link of 1000000 GB/s is more than 1e6 times the slowest, 0.001 GB/s (nic.bandwidth_GBps); the LP bound cannot solve across that span");
        assert!(Topology::from_json_str(&span.replace("1e6,", "1e3,"), "t.json").is_ok());
        let alias = r#"{"name":"x","nodes":2,"gpus_per_node":1,"links":[{"from":"gpu0","to":"gpu01","bandwidth_GBps":1,"bidirectional":true}]}"#;
        assert_eq!(
            e(alias),
            "t.json: links[0].to: `gpu01` is not a GPU's name; write gpu1"
        );
        // Names that look like GPUs but are not ones were switch vertices.
        let named = |to: &str| alias.replace("gpu01", to);
        for (to, why) in [
            ("GPU1", "`GPU1` is not a GPU's name; write gpu1"),
            ("gpu_1", "`gpu_1` is not a GPU's name; write gpu1"),
            (
                "gpu-1",
                "`gpu-1` looks like a GPU's name but is none: the topology has 2 GPUs (gpu0..gpu1)",
            ),
            ("Gpu7", "`Gpu7` looks like a GPU's name but is none"),
            (
                "gpu2",
                "gpu2 does not exist: the topology has 2 GPUs (gpu0..gpu1)",
            ),
            ("gpu99999999999999999999999", "does not exist"),
            ("gpu0.1", "`gpu0.1` looks like a GPU's name but is none"),
        ] {
            let got = e(&named(to));
            assert!(got.starts_with("t.json: links[0].to: "), "{got}");
            assert!(got.contains(why), "{to}: {got}");
        }
        for other in ["sw0", "nic1.2", "gpus", "gpu0nic", "gpu"] {
            let t = alias
                .replace("gpu01", other)
                .replace(r#"}]}"#, &format!(r#"}},{{"from":"{other}","to":"gpu1","bandwidth_GBps":1,"bidirectional":true}}]}}"#));
            assert!(Topology::from_json_str(&t, "t.json").is_ok(), "{other}");
        }
        let slow = r#"{"name":"x","nodes":2,"gpus_per_node":1,"links":[{"from":"gpu0","to":"gpu1","bandwidth_GBps":1,"latency_us":1e300,"bidirectional":true}]}"#;
        assert!(e(slow).contains("links[0].latency_us: must be at most 1e9 us"));
    }

    #[test]
    fn rail_map_routes_and_is_checked() {
        let text = |map: &str| {
            format!(
                r#"{{"name":"x","nodes":2,"gpus_per_node":4,"intra":{{"kind":"switch","bandwidth_GBps":450,"latency_us":1}},"nic":{{"per_node":2,"bandwidth_GBps":50,"latency_us":3{map}}}}}"#
            )
        };
        let t = Topology::from_json_str(&text(r#","gpu_nic":[1,1,0,0]"#), "t.json").unwrap();
        assert_eq!(
            (0..8).map(|r| t.rail_of(r)).collect::<Vec<_>>(),
            [1, 1, 0, 0, 1, 1, 0, 0]
        );
        // GPU 1 sends through NIC 1 of node 0; GPU 6 receives through NIC 0 of node 1.
        let p = t.path(1, 6);
        assert_eq!(t.link_name(p[0]), "gpu1->nic0.1");
        assert_eq!(t.link_name(p[3]), "nic1.0->gpu6");
        // Without a map, GPU l uses NIC l % 2.
        let plain = Topology::from_json_str(&text(""), "t.json").unwrap();
        assert_eq!(plain.rail_of(1), 1);
        assert_eq!(plain.rail_of(2), 0);
        let e = |map: &str| {
            Topology::from_json_str(&text(map), "t.json")
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            e(r#","gpu_nic":[0,1]"#),
            "t.json: nic.gpu_nic: has 2 entries; it needs one per GPU of a node (4)"
        );
        assert_eq!(
            e(r#","gpu_nic":[0,1,2,0]"#),
            "t.json: nic.gpu_nic[2]: NIC 2 does not exist: a node has 2 NICs (0..1)"
        );
    }

    #[test]
    fn bad_values_named() {
        let mut spec = TopologySpec::preset("dgx-h100", 2, None).unwrap();
        spec.nic.as_mut().unwrap().bandwidth_gbps = 0.0;
        let e = Topology::from_spec(spec, "t.json").unwrap_err().to_string();
        assert_eq!(
            e,
            "t.json: nic.bandwidth_GBps: must be a positive number, got 0"
        );
        let e = Topology::preset("dgx-h100", 0, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("nodes: must be at least 1"), "{e}");
        let e = Topology::preset("tpu", 2, None).unwrap_err().to_string();
        assert!(e.contains("unknown preset"), "{e}");
    }
}
