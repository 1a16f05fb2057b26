//! `topology` and `traffic`: print input files for presets and patterns.

use std::path::PathBuf;

use clap::Args;
use switchyard::compiler::error::read_file;
use switchyard::compiler::generate::{generate, Pattern, TrafficSpec};
use switchyard::compiler::import::{read_node, ImportOptions};
use switchyard::compiler::topology::{FabricKind, FabricSpec, Topology, TopologySpec};

use super::{write_out, CliResult};

#[derive(Args)]
// A negative number is a value to reject with its reason, not an unknown flag.
#[command(allow_negative_numbers = true)]
pub struct TopologyArgs {
    /// dgx-a100, dgx-h100, dgx-h200, dgx-b200, gb200-nvl72 or mi300x.
    #[arg(long, required_unless_present_any = ["from_nccl", "from_nvidia_smi"], conflicts_with_all = ["from_nccl", "from_nvidia_smi"])]
    preset: Option<String>,
    /// Build the cluster from one node's NCCL (or RCCL) topology XML
    /// (NCCL_TOPO_DUMP_FILE or NCCL_TOPO_FILE); what it lacks is assumed and said on stderr.
    #[arg(long, value_name = "FILE", conflicts_with = "from_nvidia_smi")]
    from_nccl: Option<PathBuf>,
    /// Build the cluster from one node's `nvidia-smi topo -m` output.
    #[arg(long, value_name = "FILE")]
    from_nvidia_smi: Option<PathBuf>,
    /// With --from-*: NIC bandwidth in GB/s per direction (instead of the file's or the default).
    #[arg(long, value_name = "GBPS")]
    nic_gbps: Option<f64>,
    /// With --from-*: intra-node bandwidth in GB/s, per GPU (NVSwitch) or per pair (mesh).
    #[arg(long, value_name = "GBPS")]
    intra_gbps: Option<f64>,
    #[arg(long, default_value_t = 1)]
    nodes: usize,
    /// GPUs per node; the preset's by default. (`--gpus` is a deprecated alias.)
    #[arg(long, alias = "gpus")]
    gpus_per_node: Option<usize>,
    /// NICs per node; the preset's by default (at most one per GPU).
    #[arg(long)]
    nics_per_node: Option<usize>,
    /// Inter-node fabric: fat-tree (with --nodes-per-leaf) or rail-optimized.
    #[arg(long)]
    fabric: Option<String>,
    /// Fat-tree: nodes per leaf switch (alone, it implies --fabric fat-tree).
    #[arg(long)]
    nodes_per_leaf: Option<usize>,
    /// Rail-optimized: nodes per rail group (default: all nodes in one group).
    #[arg(long)]
    nodes_per_group: Option<usize>,
    /// Spine oversubscription of the fabric, e.g. 2 or 4.
    #[arg(long, default_value_t = 1.0)]
    oversubscription: f64,
    #[arg(long)]
    out: Option<PathBuf>,
}

pub fn topology(a: TopologyArgs) -> CliResult {
    let mut spec = match (
        &a.preset,
        a.from_nccl.as_ref().or(a.from_nvidia_smi.as_ref()),
    ) {
        (Some(preset), _) => {
            if a.nic_gbps.is_some() || a.intra_gbps.is_some() {
                return Err(super::CliError::Input(
                    "--nic-gbps and --intra-gbps apply to --from-nccl / --from-nvidia-smi".into(),
                ));
            }
            TopologySpec::preset_shape(preset, a.nodes, a.gpus_per_node, a.nics_per_node)?
        }
        (None, Some(path)) => imported(&a, path)?,
        (None, None) => {
            return Err(super::CliError::Input(
                "give --preset, --from-nccl or --from-nvidia-smi".into(),
            ))
        }
    };
    let input = |s: &str| super::CliError::Input(s.to_string());
    let kind = match (a.fabric.as_deref(), a.nodes_per_leaf) {
        (Some("fat-tree"), _) | (None, Some(_)) => Some(FabricKind::FatTree),
        (Some("rail-optimized"), _) => Some(FabricKind::RailOptimized),
        (Some(other), _) => {
            return Err(super::CliError::Input(format!(
                "--fabric: unknown fabric `{other}` (known: fat-tree, rail-optimized)"
            )))
        }
        (None, None) => None,
    };
    let fabric = match kind {
        None if a.nodes_per_group.is_some() => {
            return Err(input(
                "--nodes-per-group: applies to a rail-optimized fabric; give --fabric rail-optimized too",
            ))
        }
        None if a.oversubscription != 1.0 => {
            return Err(input(
                "--oversubscription: applies to a fabric; give --fabric rail-optimized or --nodes-per-leaf too",
            ))
        }
        None => None,
        Some(FabricKind::FatTree) => {
            if a.nodes_per_group.is_some() {
                return Err(input(
                    "--nodes-per-group: a fat-tree has leaves, not rail groups; use --nodes-per-leaf",
                ));
            }
            let k = a.nodes_per_leaf.ok_or_else(|| {
                input("--fabric fat-tree: give --nodes-per-leaf (nodes under each leaf switch)")
            })?;
            spec.name = format!("{} (fat-tree, {k} nodes/leaf, {}:1)", spec.name, a.oversubscription);
            Some(FabricSpec::fat_tree(k, a.oversubscription, 1.0))
        }
        Some(FabricKind::RailOptimized) => {
            if a.nodes_per_leaf.is_some() {
                return Err(input(
                    "--nodes-per-leaf: a rail-optimized fabric has rail groups, not leaves; use --nodes-per-group",
                ));
            }
            let groups = a
                .nodes_per_group
                .map_or(String::new(), |k| format!(", {k} nodes/group"));
            spec.name = format!(
                "{} (rail-optimized{groups}, {}:1)",
                spec.name, a.oversubscription
            );
            Some(FabricSpec::rail_optimized(
                a.nodes_per_group,
                a.oversubscription,
                1.0,
            ))
        }
    };
    if fabric.is_some() {
        spec.fabric = fabric;
        Topology::from_spec(spec.clone(), "<flags>")?;
    }
    write_out(a.out.as_deref(), &(spec.to_json() + "\n"))
}

/// The spec of `--nodes` nodes as an NCCL XML or `nvidia-smi topo -m` file describes one.
fn imported(a: &TopologyArgs, path: &std::path::Path) -> Result<TopologySpec, super::CliError> {
    let file = path.display().to_string();
    if a.gpus_per_node.is_some() {
        return Err(super::CliError::Input(format!(
            "--gpus-per-node: the GPUs per node come from {file}"
        )));
    }
    if a.nics_per_node.is_some() {
        return Err(super::CliError::Input(format!(
            "--nics-per-node: the NICs per node come from {file}"
        )));
    }
    for (flag, v) in [("--nic-gbps", a.nic_gbps), ("--intra-gbps", a.intra_gbps)] {
        if let Some(x) = v.filter(|x| !(x.is_finite() && *x > 0.0)) {
            return Err(super::CliError::Input(format!(
                "{flag}: must be a positive number of GB/s, got {x}"
            )));
        }
    }
    let text = read_file(path)?;
    let is_xml = switchyard::compiler::import::is_xml(&text);
    if a.from_nccl.is_some() != is_xml {
        let (flag, want) = if is_xml {
            (
                "--from-nvidia-smi",
                "`nvidia-smi topo -m` text, but it is XML (use --from-nccl)",
            )
        } else {
            ("--from-nccl", "NCCL topology XML, but it does not start with `<` (use --from-nvidia-smi for `nvidia-smi topo -m` text)")
        };
        return Err(super::CliError::Input(format!(
            "{file}: {flag} needs {want}"
        )));
    }
    let opts = ImportOptions {
        nic_gbps: a.nic_gbps,
        intra_gbps: a.intra_gbps,
    };
    let shape = read_node(&text, &file, &opts)?;
    let spec = shape.spec(a.nodes)?;
    Topology::from_spec(spec.clone(), &file)?;
    super::compile::print_assumptions(&file, &shape.assumptions);
    Ok(spec)
}

#[derive(Args)]
// A negative number is a value to reject with its reason, not an unknown flag.
#[command(allow_negative_numbers = true)]
pub struct TrafficArgs {
    #[arg(long)]
    ranks: usize,
    /// uniform, zipf:S, hotspot:F, lognormal:SIGMA, moe or intra-skew:S.
    #[arg(long, default_value = "moe")]
    pattern: String,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Mean bytes per pair (uniform, hotspot, lognormal, intra-skew).
    #[arg(long, default_value_t = 1 << 20)]
    bytes: u64,
    /// GPUs per node (intra-skew).
    #[arg(long, default_value_t = 8)]
    gpus_per_node: usize,
    /// MoE: experts hosted by each GPU.
    #[arg(long, default_value_t = 4)]
    experts_per_gpu: usize,
    /// MoE: experts each token is routed to.
    #[arg(long, default_value_t = 2)]
    top_k: usize,
    /// MoE: tokens each rank routes.
    #[arg(long, default_value_t = 4096)]
    tokens: usize,
    /// MoE: hidden size (elements per token).
    #[arg(long, default_value_t = 4096)]
    hidden: usize,
    /// MoE: bytes per element (2 for bf16).
    #[arg(long, default_value_t = 2)]
    bytes_per_elem: usize,
    /// MoE: Zipf exponent of expert popularity (0 = uniform routing).
    #[arg(long, default_value_t = 1.0)]
    skew: f64,
    /// json or csv.
    #[arg(long, default_value = "json")]
    format: String,
    #[arg(long)]
    out: Option<PathBuf>,
}

pub fn traffic(a: TrafficArgs) -> CliResult {
    let pattern: Pattern = a.pattern.parse()?;
    let mut spec = TrafficSpec::new(a.ranks, pattern);
    spec.seed = a.seed;
    spec.bytes = a.bytes;
    spec.gpus_per_node = a.gpus_per_node;
    spec.moe.experts_per_gpu = a.experts_per_gpu;
    spec.moe.top_k = a.top_k;
    spec.moe.tokens_per_rank = a.tokens;
    spec.moe.hidden = a.hidden;
    spec.moe.bytes_per_elem = a.bytes_per_elem;
    spec.moe.skew = a.skew;
    let m = generate(&spec)?;
    let text = match a.format.as_str() {
        "json" => m.to_json(),
        "csv" => m.to_csv(),
        other => {
            return Err(super::CliError::Input(format!(
                "--format: unknown format `{other}` (known: json, csv)"
            )))
        }
    };
    write_out(a.out.as_deref(), &text)
}
