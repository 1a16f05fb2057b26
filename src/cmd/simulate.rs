//! `simulate`: the cost model on a finished plan.

use std::path::PathBuf;

use clap::Args;
use switchyard::compiler::lp::{lower_bound, LpOptions};
use switchyard::compiler::report::Report;
use switchyard::compiler::sim::{Network, SimOptions};
use switchyard::compiler::verify_on;

use super::compile::{load_inputs, load_plan};
use super::{CliError, CliResult};

#[derive(Args)]
// A negative number is a value to reject with its reason, not an unknown flag.
#[command(allow_negative_numbers = true)]
pub struct SimulateArgs {
    /// Topology JSON, or one node's NCCL/RCCL topology XML or `nvidia-smi topo -m` text.
    #[arg(long)]
    topology: PathBuf,
    /// Nodes of an imported node description (default: the traffic's ranks / its GPUs).
    #[arg(long)]
    nodes: Option<usize>,
    #[arg(long)]
    traffic: PathBuf,
    /// The plan: `.json` (plan IR) or `.xml` (MSCCL XML, from Switchyard or another tool).
    #[arg(long)]
    plan: PathBuf,
    /// Print the JSON report instead of a summary.
    #[arg(long)]
    json: bool,
    /// calibrated (fitted to measured clusters), ideal (line rate), congested, or stress (a harsh incast assumption).
    #[arg(long, default_value = "calibrated")]
    network: String,
    #[command(flatten)]
    calibration: CalibrationArgs,
}

/// Your own cluster's calibration (`bench --measure-against` suggests both).
#[derive(clap::Args)]
pub struct CalibrationArgs {
    /// NIC goodput, a fraction of line rate in (0, 1] (default 0.86); not with --network ideal.
    #[arg(long, value_name = "F")]
    nic_goodput: Option<f64>,
    /// Per-message cost in us (default 3.0); not with --network ideal.
    #[arg(long, value_name = "US")]
    per_message_us: Option<f64>,
}

impl CalibrationArgs {
    /// `network`'s options with the given calibration.
    pub fn options(&self, network: Network) -> Result<SimOptions, CliError> {
        let mut opts = SimOptions::new(network);
        if network == Network::Ideal
            && (self.nic_goodput.is_some() || self.per_message_us.is_some())
        {
            return Err(CliError::Input(
                "--nic-goodput/--per-message-us: the ideal network runs at line rate; use --network calibrated".into(),
            ));
        }
        if let Some(g) = self.nic_goodput {
            opts.calibration.nic_goodput = g;
        }
        if let Some(c) = self.per_message_us {
            opts.calibration.per_message_us = c;
        }
        Ok(opts)
    }
}

pub fn simulate(a: SimulateArgs) -> CliResult {
    let network: Network = a.network.parse()?;
    let opts = a.calibration.options(network)?;
    let (topo, m) = load_inputs(&a.topology, &a.traffic, a.nodes)?;
    let plan = load_plan(&a.plan, Some(&m), Some(&topo))?;
    verify_on(&plan, &m, &topo)
        .map_err(|e| CliError::Failed(format!("{}: {e}", a.plan.display())))?;
    // A plan read from a file has no compile time: the report says null.
    let report = Report::measure(
        &plan.algorithm,
        &topo,
        &m,
        &plan,
        Some(&lower_bound(&topo, &m, &LpOptions::default())?),
        None,
        &opts,
    )?;
    if a.json {
        println!("{}", report.to_json());
    } else {
        print!("{}", summary(&report));
    }
    Ok(())
}

/// A few human lines: completion, bound, ratio, hottest links.
pub fn summary(r: &Report) -> String {
    let mut s = format!(
        "{} on {}: {} transfers in {} steps, {:.1} MiB moved between ranks\n",
        r.algorithm,
        r.topology,
        r.transfers,
        r.steps,
        r.bytes_moved as f64 / (1 << 20) as f64
    );
    s += &format!(
        "completion {:.1} us ({} network), lower bound {:.1} us ({}), ratio {:.3}\n",
        r.completion_us, r.network, r.lower_bound_us, r.bound_cut, r.ratio_to_bound
    );
    let hot: Vec<String> = r
        .hottest_links
        .iter()
        .map(|h| format!("{} {:.1}%", h.link, 100.0 * h.utilisation))
        .collect();
    if !hot.is_empty() {
        s += &format!("hottest links: {}\n", hot.join(", "));
    }
    s
}
