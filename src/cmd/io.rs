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
    /// dgx-h100, dgx-a100 or mi300x.
    #[arg(long)]
    preset: String,
    #[arg(long, default_value_t = 1)]
    nodes: usize,
    /// GPUs (and NICs) per node; the preset's 8 by default.
    #[arg(long)]
    gpus: Option<usize>,
    /// Add a fat-tree fabric with this many nodes per leaf switch.
    #[arg(long)]
    nodes_per_leaf: Option<usize>,
    /// Leaf uplink oversubscription (with --nodes-per-leaf), e.g. 2 or 4.
    #[arg(long, default_value_t = 1.0)]
    oversubscription: f64,
    #[arg(long)]
    out: Option<PathBuf>,
}

pub fn topology(a: TopologyArgs) -> CliResult {
    let mut spec = TopologySpec::preset(&a.preset, a.nodes, a.gpus)?;
    if a.nodes_per_leaf.is_none() && a.oversubscription != 1.0 {
        return Err(super::CliError::Input(
            "--oversubscription: applies to a fat-tree fabric; give --nodes-per-leaf too".into(),
        ));
    }
    if let Some(k) = a.nodes_per_leaf {
        spec.fabric = Some(FabricSpec {
            kind: FabricKind::FatTree,
            nodes_per_leaf: k,
            oversubscription: a.oversubscription,
            latency_us: 1.0,
        });
        spec.name = format!("{} ({k} nodes/leaf, {}:1)", spec.name, a.oversubscription);
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
