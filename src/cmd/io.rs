//! `topology` and `traffic`: print input files for presets and patterns.

use std::path::PathBuf;

use clap::Args;
use switchyard::compiler::generate::{generate, Pattern, TrafficSpec};
use switchyard::compiler::topology::{FabricKind, FabricSpec, Topology, TopologySpec};

use super::{write_out, CliResult};

#[derive(Args)]
// A negative number is a value to reject with its reason, not an unknown flag.
#[command(allow_negative_numbers = true)]
pub struct TopologyArgs {
    /// dgx-a100, dgx-h100, dgx-h200, dgx-b200, gb200-nvl72 or mi300x.
    #[arg(long)]
    preset: String,
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
    let mut spec =
        TopologySpec::preset_shape(&a.preset, a.nodes, a.gpus_per_node, a.nics_per_node)?;
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
