//! `compile` and `verify`.

use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::Args;
use switchyard::compiler::lp::{lower_bound, LpOptions};
use switchyard::compiler::report::Report;
use switchyard::compiler::sched::{schedule, Options};
use switchyard::compiler::sim::{Network, SimOptions};
use switchyard::compiler::{verify_on, Algorithm, Plan, Topology, TrafficMatrix};

use super::{write_out, CliError, CliResult};

#[derive(Args)]
pub struct CompileArgs {
    #[arg(long)]
    topology: PathBuf,
    #[arg(long)]
    traffic: PathBuf,
    #[arg(long, default_value = "direct")]
    algorithm: String,
    /// Output plan: `.json` writes the plan IR.
    #[arg(long)]
    out: PathBuf,
    /// Write a JSON report here.
    #[arg(long)]
    report: Option<PathBuf>,
    /// Network mode of the report's simulation: ideal or congested.
    #[arg(long, default_value = "ideal")]
    network: String,
    /// `lp`: the solver's time limit in seconds (the best plan found by then is kept).
    #[arg(long, default_value_t = 60.0)]
    time_limit: f64,
    /// `lp`: print the solver's log.
    #[arg(long)]
    verbose: bool,
}

/// Reads a topology and a traffic matrix that must fit it.
pub fn load_inputs(topology: &Path, traffic: &Path) -> Result<(Topology, TrafficMatrix), CliError> {
    let topo = Topology::load(topology)?;
    let m = TrafficMatrix::load(traffic)?;
    m.check_ranks(topo.ranks(), &traffic.display().to_string())?;
    Ok((topo, m))
}

pub fn compile(a: CompileArgs) -> CliResult {
    let alg: Algorithm = a.algorithm.parse()?;
    let network: Network = a.network.parse()?;
    let (topo, m) = load_inputs(&a.topology, &a.traffic)?;
    let t0 = Instant::now();
    let opts = Options {
        time_limit_s: a.time_limit,
        verbose: a.verbose,
    };
    let plan = schedule(alg, &topo, &m, &opts)?;
    let compile_us = t0.elapsed().as_secs_f64() * 1e6;
    verify_on(&plan, &m, &topo)
        .map_err(|e| CliError::Failed(format!("internal error: {alg} made a wrong plan: {e}")))?;
    let text = match a.out.extension().and_then(|e| e.to_str()) {
        Some("json") => plan.to_json(),
        _ => {
            return Err(CliError::Input(format!(
                "{}: unknown plan format (use .json)",
                a.out.display()
            )))
        }
    };
    write_out(Some(&a.out), &text)?;
    if let Some(r) = &a.report {
        let report = Report::measure(
            alg.name(),
            &topo,
            &m,
            &plan,
            Some(&lower_bound(&topo, &m, &LpOptions::default())?),
            Some(compile_us),
            &SimOptions::new(network),
        )?;
        write_out(Some(r), &(report.to_json() + "\n"))?;
    }
    eprintln!(
        "{}: {} transfers in {} steps, compiled in {:.0} us",
        a.out.display(),
        plan.transfers.len(),
        plan.steps(),
        compile_us
    );
    Ok(())
}

#[derive(Args)]
pub struct VerifyArgs {
    #[arg(long)]
    plan: PathBuf,
    #[arg(long)]
    traffic: PathBuf,
    /// Also check paths against this topology.
    #[arg(long)]
    topology: Option<PathBuf>,
}

/// Reads a plan file by its extension.
pub fn load_plan(path: &Path) -> Result<Plan, CliError> {
    match path.extension().and_then(|e| e.to_str()) {
        Some("json") => Ok(Plan::load_json(path)?),
        _ => Err(CliError::Input(format!(
            "{}: unknown plan format (use .json)",
            path.display()
        ))),
    }
}

pub fn verify(a: VerifyArgs) -> CliResult {
    let plan = load_plan(&a.plan)?;
    let m = TrafficMatrix::load(&a.traffic)?;
    let result = match &a.topology {
        Some(t) => {
            let topo = Topology::load(t)?;
            m.check_ranks(topo.ranks(), &a.traffic.display().to_string())?;
            verify_on(&plan, &m, &topo)
        }
        None => switchyard::compiler::verify(&plan, &m),
    };
    match result {
        Ok(s) => {
            println!(
                "ok: {} transfers move {} bytes; every byte of the all-to-all lands once, in place",
                s.transfers, s.bytes_moved
            );
            Ok(())
        }
        Err(e) => Err(CliError::Failed(format!("{}: {e}", a.plan.display()))),
    }
}
