//! `simulate`: the cost model on a finished plan.

use std::path::PathBuf;

use clap::Args;
use switchyard::compiler::lp::{lower_bound, LpOptions};
use switchyard::compiler::msccl::xsim::simulate_executor;
use switchyard::compiler::report::Report;
use switchyard::compiler::sim::{Network, SimOptions};
use switchyard::compiler::verify_on;

use super::compile::{load_inputs, load_plan};
use super::{CliError, CliResult};

#[derive(Args)]
pub struct SimulateArgs {
    #[arg(long)]
    topology: PathBuf,
    #[arg(long)]
    traffic: PathBuf,
    /// The plan: `.json` (plan IR) or `.xml` (MSCCL XML, from Switchyard or another tool).
    #[arg(long)]
    plan: PathBuf,
    /// Print the JSON report instead of a summary.
    #[arg(long)]
    json: bool,
    /// ideal or congested.
    #[arg(long, default_value = "ideal")]
    network: String,
}

pub fn simulate(a: SimulateArgs) -> CliResult {
    let network: Network = a.network.parse()?;
    let (topo, m) = load_inputs(&a.topology, &a.traffic)?;
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
        &SimOptions::new(network),
    )?;
    // An MSCCL file is also priced by the executor's own rules (whole
    // chunks, calls, the FIFO window, sends done when staged).
    let executor = if a
        .plan
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("xml"))
    {
        let text = switchyard::compiler::error::read_file(&a.plan)?;
        let (us, x) = simulate_executor(
            &text,
            &a.plan.display().to_string(),
            &m,
            &topo,
            &SimOptions::new(network),
        )?;
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
    if a.json {
        match executor {
            Some(e) => {
                let mut v: serde_json::Value = serde_json::from_str(&report.to_json())
                    .map_err(|e| CliError::Failed(e.to_string()))?;
                v["msccl_executor"] = e;
                println!("{v}");
            }
            None => println!("{}", report.to_json()),
        }
    } else {
        print!("{}", summary(&report));
        if let Some(e) = executor {
            println!(
                "executor rules (whole chunks, {} calls, FIFO window, sends done when staged): completion {:.1} us, {:.3} of the plan read from the file, ratio {:.3}",
                e["calls"], e["completion_us"].as_f64().unwrap_or(0.0),
                e["ratio_to_plan"].as_f64().unwrap_or(0.0),
                e["ratio_to_bound"].as_f64().unwrap_or(0.0)
            );
        }
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
