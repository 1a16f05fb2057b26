//! `simulate`: the cost model on a finished plan, and pictures of it.

use std::io::Write;
use std::path::PathBuf;

use clap::Args;
use switchyard::compiler::lp::{lower_bound, LpOptions};
use switchyard::compiler::msccl::xsim::simulate_executor;
use switchyard::compiler::report::Report;
use switchyard::compiler::sim::{Network, SimOptions};
use switchyard::compiler::timeline::write_chrome_trace;
use switchyard::compiler::verify_on;

use super::compile::load_plan;
use super::progress::SimProgress;
use super::{write_out, CliError, CliResult};
use switchyard::compiler::msccl::assign_paths;

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
    /// The traffic the plan delivers; for XML without it, the matrix the
    /// file implies (as for `verify`).
    #[arg(long)]
    traffic: Option<PathBuf>,
    /// The plan: `.json` (plan IR) or `.xml` (MSCCL XML, from Switchyard or another tool).
    #[arg(long)]
    plan: PathBuf,
    /// Print the JSON report instead of a summary.
    #[arg(long)]
    json: bool,
    /// calibrated (fitted to measured clusters), ideal (line rate), congested, or stress (a harsh incast assumption).
    #[arg(long, default_value = "calibrated")]
    network: String,
    /// Write the simulated timeline here in the Chrome trace event format
    /// (open it in https://ui.perfetto.dev or chrome://tracing).
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// Write a one-page SVG here: the busiest GPUs and NICs over time and
    /// the links' utilisation as a heatmap.
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
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
    for p in a.trace.iter().chain(&a.svg) {
        super::check_out_dir(p)?;
    }
    let (topo, m, traffic_name, implied) =
        super::compile::plan_inputs(Some(&a.topology), a.nodes, &a.plan, a.traffic.as_deref())?;
    let topo = topo.ok_or_else(|| CliError::Input("--topology is required".into()))?;
    m.check_ranks(topo.ranks(), &traffic_name)?;
    let plan = match implied {
        Some(mut plan) => {
            assign_paths(&mut plan, &topo);
            plan
        }
        None => load_plan(&a.plan, Some(&m), Some(&topo))?,
    };
    verify_on(&plan, &m, &topo)
        .map_err(|e| CliError::Failed(format!("{}: {e}", a.plan.display())))?;
    let bound = lower_bound(&topo, &m, &LpOptions::default())?;
    let mut progress = SimProgress::new(format!("simulating {} transfers", plan.transfers.len()));
    let sim = Report::simulate(&topo, &m, &plan, &opts, &mut progress.callback());
    progress.finish();
    let sim = sim?;
    // A plan read from a file has no compile time: the report says null.
    let report = Report::assemble(
        &plan.algorithm,
        &topo,
        &m,
        &plan,
        &sim,
        Some(&bound),
        None,
        &opts,
    );
    // An MSCCL file is also priced by the executor's own rules (whole
    // chunks, calls, the FIFO window, sends done when staged).
    let executor = if a
        .plan
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("xml"))
    {
        let text = switchyard::compiler::error::read_file(&a.plan)?;
        let (us, x) = simulate_executor(&text, &a.plan.display().to_string(), &m, &topo, &opts)?;
        Some(serde_json::json!({
            "completion_us": us,
            "ratio_to_plan": us / report.completion_us.max(f64::MIN_POSITIVE),
            "ratio_to_bound": us / report.lower_bound_us.max(f64::MIN_POSITIVE),
            "calls": x.calls,
            "chunk_bytes": x.chunk_bytes,
        }))
    } else {
        None
    };
    if let Some(p) = &a.trace {
        let title = format!("{} on {} ({network})", plan.algorithm, topo.name());
        let cannot =
            |e: std::io::Error| CliError::Input(format!("{}: cannot write: {e}", p.display()));
        let mut out: Box<dyn Write> = if super::is_stdout(p) {
            Box::new(std::io::stdout().lock())
        } else {
            Box::new(std::fs::File::create(p).map_err(cannot)?)
        };
        let mut out = std::io::BufWriter::new(&mut out);
        write_chrome_trace(&mut out, &topo, &plan, &sim, &title)
            .and_then(|()| out.flush())
            .map_err(cannot)?;
    }
    if let Some(p) = &a.svg {
        write_out(
            Some(p),
            &super::picture::render(&topo, &plan, &sim, &report),
        )?;
    }
    // A trace or picture on stdout keeps it to itself: the report goes to stderr.
    let text = if a.json {
        match executor {
            Some(e) => {
                let mut v: serde_json::Value = serde_json::from_str(&report.to_json())
                    .map_err(|e| CliError::Failed(e.to_string()))?;
                v["msccl_executor"] = e;
                format!("{v}\n")
            }
            None => report.to_json() + "\n",
        }
    } else {
        let mut text = summary(&report);
        if let Some(e) = executor {
            text += &format!(
                "executor rules (whole chunks, {} calls, FIFO window, sends done when staged): completion {:.1} us, {:.3} of the plan read from the file, ratio {:.3}\n",
                e["calls"],
                e["completion_us"].as_f64().unwrap_or(0.0),
                e["ratio_to_plan"].as_f64().unwrap_or(0.0),
                e["ratio_to_bound"].as_f64().unwrap_or(0.0)
            );
        }
        text
    };
    if a.trace.iter().chain(&a.svg).any(|p| super::is_stdout(p)) {
        eprint!("{text}");
    } else {
        print!("{text}");
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
