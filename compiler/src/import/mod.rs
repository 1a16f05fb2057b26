//! Topology import: one node's description as the cluster already states it
//! (NCCL's or RCCL's topology XML, `nvidia-smi topo -m` text) turned into a
//! [`TopologySpec`] for `nodes` such nodes.
//!
//! Owns: reading those files ([`nccl`], [`smi`]), the per-link rate table,
//! the defaults for what a file does not say (each one it uses is returned
//! as an assumption, in words), and the rail map from "closest NIC" data.
//! It knows nothing of graphs, traffic or plans: the spec it returns goes
//! through [`Topology::from_spec`](crate::Topology::from_spec) like any file.
//! Its private `load` module gives `Topology` its constructors from files of every form
//! (`Topology::load`, `load_sized`, `from_text`, `from_json_str`,
//! `from_nccl`), so the topology model itself never calls the import.
//! docs/formats.md ("Importing a topology") states the rules.

mod load;
pub mod nccl;
pub mod smi;

pub use load::is_import;

use crate::error::{num, InputError, Result};
use crate::topology::{IntraSpec, NicSpec, TopologySpec};

/// Intra-node link latency the import assumes, microseconds (as the presets).
pub const DEFAULT_INTRA_LATENCY_US: f64 = 1.0;
/// NIC latency the import assumes, microseconds (as the presets).
pub const DEFAULT_NIC_LATENCY_US: f64 = 3.0;
/// NIC speed assumed where a file names NICs but no speed: 400 Gb/s
/// (ConnectX-7 / NDR, the NIC of H100 and later nodes), in GB/s per direction.
pub const DEFAULT_NIC_GBPS: f64 = 50.0;
/// NIC speed assumed for an A100 node (ConnectX-6 / HDR, 200 Gb/s).
pub const DEFAULT_NIC_GBPS_A100: f64 = 25.0;
/// PCIe bandwidth assumed between GPUs that have no NVLink or xGMI and whose
/// PCIe link the file does not state (Gen4 x16), GB/s per direction.
pub const DEFAULT_PCIE_GBPS: f64 = 32.0;

/// Per-link, per-direction NVLink rate in GB/s by the GPU's `sm` (compute
/// capability x 10), with the generation's name. Sources in docs/formats.md:
/// NVIDIA's P100, V100, A100, H100 and Blackwell whitepapers/datasheets give
/// the total over all links (160, 300, 600, 900, 1800 GB/s bidirectional
/// over 4, 6, 12, 18, 18 links).
pub const NVLINK_RATES: &[(u32, &str, f64, usize)] = &[
    // (sm, GPU, GB/s per link per direction, links per GPU)
    (60, "P100", 20.0, 4),
    (70, "V100", 25.0, 6),
    (80, "A100", 25.0, 12),
    (90, "H100", 25.0, 18),
    (100, "B200", 50.0, 18),
    (103, "B300", 50.0, 18),
];

/// Per-link, per-direction xGMI rate in GB/s by the AMD GPU's `gcn`, with the
/// GPU's name: MI300X's datasheet gives 128 GB/s per link, bidirectional;
/// MI250X's 100 GB/s.
pub const XGMI_RATES: &[(&str, &str, f64)] =
    &[("gfx942", "MI300X", 64.0), ("gfx90a", "MI250X", 50.0)];

/// What the import may be told instead of assuming.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ImportOptions {
    /// NIC bandwidth, GB/s per direction (overrides the file and the default).
    pub nic_gbps: Option<f64>,
    /// Intra-node bandwidth, GB/s: per GPU (switch) or per pair (mesh);
    /// overrides the per-link rate table.
    pub intra_gbps: Option<f64>,
}

/// One node as a file describes it.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeShape {
    /// What the file is: `NCCL topology dump`, `NCCL_TOPO_FILE (PCI classes only)`, …
    pub form: String,
    /// The GPU's name when the file says it (`H100`, `MI300X`), else `GPU`.
    pub gpu_name: String,
    pub gpus: usize,
    pub intra: IntraSpec,
    /// NICs with `gpu_nic`, the rail map (None: the file has no NIC).
    pub nic: Option<NicSpec>,
    /// The NIC names (or PCI bus ids) in rail order.
    pub nic_names: Vec<String>,
    /// Every default the import used, in words.
    pub assumptions: Vec<String>,
    /// The file's name, for the topology's name.
    pub source: String,
}

impl NodeShape {
    /// The topology of `nodes` such nodes.
    pub fn spec(&self, nodes: usize) -> Result<TopologySpec> {
        if nodes > 1 && self.nic.is_none() {
            return Err(InputError::new(
                self.source.clone(),
                format!(
                    "names no NIC (no <net>, no PCI device of class 0x0200/0x0207), but {nodes} nodes need NICs"
                ),
            )
            .into());
        }
        let base = std::path::Path::new(&self.source)
            .file_name()
            .map_or(self.source.clone(), |f| f.to_string_lossy().into_owned());
        Ok(TopologySpec {
            name: format!(
                "{nodes}x {} {} ({}, from {base})",
                self.gpus,
                self.gpu_name,
                self.nic.as_ref().map_or("no NIC".to_string(), |n| format!(
                    "{} NICs of {} GB/s",
                    n.per_node,
                    num(n.bandwidth_gbps)
                )),
            ),
            nodes,
            gpus_per_node: self.gpus,
            intra: Some(self.intra.clone()),
            nic: self.nic.clone(),
            fabric: None,
            links: None,
        })
    }
}

/// True when `text` is XML (starts with `<` after blanks or a BOM-less blank line).
pub fn is_xml(text: &str) -> bool {
    text.trim_start().starts_with('<')
}

/// One node's shape from NCCL/RCCL XML or `nvidia-smi topo -m` text.
pub fn read_node(text: &str, file: &str, opts: &ImportOptions) -> Result<NodeShape> {
    if is_xml(text) {
        nccl::read(text, file, opts)
    } else {
        smi::read(text, file, opts)
    }
}

/// The node count of an imported topology: `nodes` when given, else the
/// traffic's `ranks` over the node's GPUs, else 1 (an assumption).
pub fn node_count(
    shape: &NodeShape,
    nodes: Option<usize>,
    ranks: Option<usize>,
    assumptions: &mut Vec<String>,
) -> Result<usize> {
    let g = shape.gpus;
    match (nodes, ranks) {
        (Some(n), _) => Ok(n),
        (None, Some(r)) if r > 0 && r % g == 0 => Ok(r / g),
        (None, Some(r)) => Err(InputError::new(
            shape.source.clone(),
            format!(
                "describes nodes of {g} GPUs, but the traffic has {r} ranks, not a whole number of such nodes (give --nodes)"
            ),
        )
        .into()),
        (None, None) => {
            assumptions.push("1 node (no node count given)".into());
            Ok(1)
        }
    }
}

/// The rail map from closeness: `score(g, k)` says how close NIC `k` is to
/// GPU `g` (higher is closer). Each GPU, in order, takes its closest NIC;
/// among equally close ones, the one serving the fewest GPUs so far, then the
/// lowest index (NCCL spreads GPUs over equally close NICs the same way).
/// Returns the map, renumbered over the NICs that serve some GPU, and the
/// kept NICs' old indices.
pub fn assign_rails<S: Ord>(
    gpus: usize,
    nics: usize,
    score: impl Fn(usize, usize) -> S,
) -> (Vec<usize>, Vec<usize>) {
    let mut load = vec![0usize; nics];
    let mut map = Vec::with_capacity(gpus);
    for g in 0..gpus {
        let best = (0..nics)
            .max_by(|&a, &b| {
                score(g, a)
                    .cmp(&score(g, b))
                    .then(load[b].cmp(&load[a]))
                    .then(b.cmp(&a))
            })
            .unwrap_or(0);
        load[best] += 1;
        map.push(best);
    }
    let kept: Vec<usize> = (0..nics).filter(|&k| load[k] > 0).collect();
    let renumber = |k: usize| kept.iter().position(|&x| x == k).unwrap_or(0);
    (map.into_iter().map(renumber).collect(), kept)
}

/// The intra-node spec from links per GPU (switch) or per pair (mesh), the
/// per-link rate, and the override.
fn intra(kind: crate::topology::IntraKind, gbps: f64) -> IntraSpec {
    IntraSpec {
        kind,
        bandwidth_gbps: gbps,
        latency_us: DEFAULT_INTRA_LATENCY_US,
    }
}

/// `1, 2, 3` or `1, 2, ... 9` (at most 6 items) for a one-line message.
fn list(items: &[String]) -> String {
    if items.len() <= 6 {
        items.join(", ")
    } else {
        format!(
            "{}, ... {} ({} in all)",
            items[..4].join(", "),
            items[items.len() - 1],
            items.len()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rails_spread_over_equally_close_nics_and_drop_unused_ones() {
        // 4 GPUs, 3 NICs: NIC 0 is close to nobody; NICs 1, 2 equally close to all.
        let (map, kept) = assign_rails(4, 3, |_, k| u8::from(k > 0));
        assert_eq!(map, [0, 1, 0, 1]);
        assert_eq!(kept, [1, 2]);
        // A strict order wins over load.
        let (map, kept) = assign_rails(3, 3, |g, k| u8::from(g == 2 - k));
        assert_eq!(map, [2, 1, 0]);
        assert_eq!(kept, [0, 1, 2]);
    }
}
