//! `compile` and `verify`.

use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::Args;
use switchyard::compiler::import::ImportOptions;
use switchyard::compiler::lp::{lower_bound, LpOptions};
use switchyard::compiler::msccl::{
    assign_paths, parse_xml, to_xml, xml_traffic, Layout, Protocol, XmlOptions, MAX_CHUNK_BYTES,
    PLAN_LANES_PER_GPU,
};
use switchyard::compiler::report::Report;
use switchyard::compiler::sched::{auto, schedule, Options};
use switchyard::compiler::sim::{Network, SimOptions};
use switchyard::compiler::topology::is_import;
use switchyard::compiler::{verify_on, Algorithm, Plan, Topology, TrafficMatrix};

use super::{write_out, CliError, CliResult};

#[derive(Args)]
// A negative number is a value to reject with its reason, not an unknown flag.
#[command(allow_negative_numbers = true)]
pub struct CompileArgs {
    /// Topology JSON, or one node's NCCL/RCCL topology XML or `nvidia-smi topo -m` text.
    #[arg(long)]
    topology: PathBuf,
    /// Nodes of an imported node description (default: the traffic's ranks / its GPUs).
    #[arg(long)]
    nodes: Option<usize>,
    #[arg(long)]
    traffic: PathBuf,
    /// direct, pairwise, hierarchical, fast, spray, lp, pxn, deepep, or auto
    /// (the default: the best of direct, pxn, deepep, hierarchical, spray and
    /// fast for this matrix by the cost model's estimates, for `--network`).
    #[arg(long, default_value = "auto")]
    algorithm: String,
    /// Output plan: `.json` writes the plan IR, `.xml` MSCCL XML (then `lp`
    /// runs at most 106 lanes at once per GPU, so the file's threadblocks can run them all).
    #[arg(long)]
    out: PathBuf,
    /// MSCCL XML: `padded` (every peer block sized to the largest pair, a
    /// drop-in for ncclAllToAll) or `packed`.
    #[arg(long, default_value = "padded")]
    layout: String,
    /// MSCCL XML: Simple, LL or LL128 (default: chosen by message size).
    #[arg(long)]
    protocol: Option<String>,
    /// MSCCL XML: chunk size in bytes (default: chosen from the matrix and the executor's limits).
    #[arg(long)]
    chunk_bytes: Option<u64>,
    /// Write a JSON report here.
    #[arg(long)]
    report: Option<PathBuf>,
    /// Network mode of the report's simulation: calibrated (fitted to measured clusters), ideal (line rate), congested, or stress (a harsh incast assumption).
    #[arg(long, default_value = "calibrated")]
    network: String,
    /// `lp`: the solver's time limit in seconds (the best plan found by then is kept).
    #[arg(long, default_value_t = 60.0)]
    time_limit: f64,
    /// `lp`: print the solver's log.
    #[arg(long)]
    verbose: bool,
}

/// Reads a topology and a traffic matrix that must fit it. A topology given
/// as one node's NCCL XML (or `nvidia-smi topo -m` text) has `nodes` nodes,
/// or as many as the traffic's ranks fill; what the import assumed goes to stderr.
pub fn load_inputs(
    topology: &Path,
    traffic: &Path,
    nodes: Option<usize>,
) -> Result<(Topology, TrafficMatrix), CliError> {
    let text = switchyard::compiler::error::read_file(topology)?;
    let file = topology.display().to_string();
    let (topo, m) = if is_import(&text) {
        let m = TrafficMatrix::load(traffic)?;
        let topo = load_topology_text(&text, &file, nodes, Some(m.ranks()))?;
        (topo, m)
    } else {
        let topo = load_topology_text(&text, &file, nodes, None)?;
        (topo, TrafficMatrix::load(traffic)?)
    };
    m.check_ranks(topo.ranks(), &traffic.display().to_string())?;
    Ok((topo, m))
}

/// A topology of any form; an import's assumptions are printed to stderr.
pub fn load_topology_text(
    text: &str,
    file: &str,
    nodes: Option<usize>,
    ranks: Option<usize>,
) -> Result<Topology, CliError> {
    let (topo, assumed) = Topology::from_text(text, file, nodes, ranks, &ImportOptions::default())?;
    print_assumptions(file, &assumed);
    Ok(topo)
}

/// One stderr line per default an import used.
pub fn print_assumptions(file: &str, assumed: &[String]) {
    for a in assumed {
        eprintln!("{file}: assumed {a}");
    }
}

pub fn compile(a: CompileArgs) -> CliResult {
    let alg: Algorithm = a.algorithm.parse()?;
    let network: Network = a.network.parse()?;
    if let Some(u) = a.chunk_bytes {
        if u == 0 || u > MAX_CHUNK_BYTES {
            return Err(CliError::Input(format!(
                "--chunk-bytes: must be in 1..={MAX_CHUNK_BYTES} (2^38), got {u}"
            )));
        }
    }
    let (topo, m) = load_inputs(&a.topology, &a.traffic, a.nodes)?;
    // `lp` may solve for a minute: a path it cannot write fails first.
    for p in std::iter::once(&a.out).chain(&a.report) {
        super::check_out_dir(p)?;
    }
    let t0 = Instant::now();
    // An MSCCL file runs at most ~108 threadblocks per GPU: a plan for one
    // must not run more lanes at once than that (only `lp` would).
    let opts = Options {
        time_limit_s: a.time_limit,
        verbose: a.verbose,
        max_lanes_per_gpu: is_xml(&a.out).then_some(PLAN_LANES_PER_GPU),
        network,
    };
    // The solver can take seconds to minutes: show that it is working (a
    // spinner on a terminal, nothing when stderr is redirected).
    let spinner = (alg == Algorithm::Lp).then(|| {
        let bar = indicatif::ProgressBar::new_spinner();
        bar.set_message(format!("lp: solving (time limit {} s)", a.time_limit));
        bar.enable_steady_tick(std::time::Duration::from_millis(120));
        bar
    });
    let (plan, choice) = if alg == Algorithm::Auto {
        let (plan, choice) = auto(&topo, &m, network)?;
        (Ok(plan), Some(choice))
    } else {
        (schedule(alg, &topo, &m, &opts), None)
    };
    if let Some(bar) = spinner {
        bar.finish_and_clear();
    }
    let plan = plan?;
    // The plan carries the chosen scheduler's name; the report says who chose.
    let alg = match &choice {
        Some(c) => c.algorithm(),
        None => alg,
    };
    let compile_us = t0.elapsed().as_secs_f64() * 1e6;
    verify_on(&plan, &m, &topo)
        .map_err(|e| CliError::Failed(format!("internal error: {alg} made a wrong plan: {e}")))?;
    // For XML the plan that runs is the one requantised to chunks: report that one.
    let (text, plan, msccl) = match extension(&a.out).as_deref() {
        Some("json") => (plan.to_json(), plan, None),
        Some("xml") => {
            let opts = XmlOptions {
                layout: a
                    .layout
                    .parse::<Layout>()
                    .map_err(|e| CliError::Input(format!("--layout: {e}")))?,
                protocol: match &a.protocol {
                    Some(p) => Some(
                        p.parse::<Protocol>()
                            .map_err(|e| CliError::Input(format!("--protocol: {e}")))?,
                    ),
                    None => None,
                },
                chunk_bytes: a.chunk_bytes,
            };
            let xml = to_xml(&plan, &topo, &m, &opts)?;
            let facts = xml.report_json();
            (xml.text, xml.plan, Some(facts))
        }
        _ => {
            return Err(CliError::Input(format!(
                "{}: unknown plan format (use .json or .xml)",
                a.out.display()
            )))
        }
    };
    write_out(Some(&a.out), &text)?;
    if let Some(r) = &a.report {
        let mut report = Report::measure(
            alg.name(),
            &topo,
            &m,
            &plan,
            Some(&lower_bound(&topo, &m, &LpOptions::default())?),
            Some(compile_us),
            &SimOptions::new(network),
        )?;
        report.auto = choice.clone();
        let mut json =
            serde_json::to_value(&report).map_err(|e| CliError::Failed(e.to_string()))?;
        if let (Some(facts), Some(obj)) = (msccl, json.as_object_mut()) {
            obj.insert("msccl".into(), facts);
        }
        let text =
            serde_json::to_string_pretty(&json).map_err(|e| CliError::Failed(e.to_string()))?;
        write_out(Some(r), &(text + "\n"))?;
    }
    if let Some(c) = &choice {
        let why: Vec<String> = c
            .estimates
            .iter()
            .map(|e| format!("{} {:.1} us", e.algorithm, e.estimate_us))
            .collect();
        eprintln!("auto chose {} (estimates: {})", c.chosen, why.join(", "));
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
    /// The plan: `.json` (plan IR) or `.xml` (MSCCL XML, from Switchyard or another tool).
    #[arg(long)]
    plan: PathBuf,
    /// The traffic the plan must deliver; for XML without it, the matrix the
    /// file implies (docs/msccl.md, "Reading").
    #[arg(long)]
    traffic: Option<PathBuf>,
    /// Also check paths against this topology (JSON, NCCL XML or `nvidia-smi topo -m`).
    #[arg(long)]
    topology: Option<PathBuf>,
    /// Nodes of an imported node description (default: the traffic's ranks / its GPUs).
    #[arg(long)]
    nodes: Option<usize>,
}

/// A file's extension in lower case: `plan.JSON` is a JSON plan.
fn extension(path: &Path) -> Option<String> {
    path.extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase)
}

fn is_xml(path: &Path) -> bool {
    extension(path).as_deref() == Some("xml")
}

/// Reads a plan file by its extension. An MSCCL XML file is read as the
/// transfers it performs on `traffic` (or on the matrix the file implies),
/// with paths assigned from `topo` when given.
pub fn load_plan(
    path: &Path,
    traffic: Option<&TrafficMatrix>,
    topo: Option<&Topology>,
) -> Result<Plan, CliError> {
    let file = path.display().to_string();
    match extension(path).as_deref() {
        Some("json") => {
            let plan = Plan::load_json(path)?;
            // Files that do not fit each other are bad input, as for XML;
            // the verifier's own check would call it a failed check.
            if let Some(m) = traffic.filter(|m| m.ranks() != plan.ranks as usize) {
                return Err(CliError::Input(format!(
                    "{file}: the plan is for {} ranks but the traffic has {}",
                    plan.ranks,
                    m.ranks()
                )));
            }
            if let Some(t) = topo.filter(|t| t.gpus_per_node() != plan.gpus_per_node as usize) {
                return Err(CliError::Input(format!(
                    "{file}: the plan is for nodes of {} GPUs but the topology has {}",
                    plan.gpus_per_node,
                    t.gpus_per_node()
                )));
            }
            Ok(plan)
        }
        Some("xml") => {
            let text = switchyard::compiler::error::read_file(path)?;
            let mut plan = parse_xml(&text, &file, traffic)?;
            if let Some(t) = topo {
                assign_paths(&mut plan, t);
            }
            Ok(plan)
        }
        _ => Err(CliError::Input(format!(
            "{file}: unknown plan format (use .json or .xml)"
        ))),
    }
}

pub fn verify(a: VerifyArgs) -> CliResult {
    // An imported topology's node count may come from the traffic: read the
    // topology first (its errors first), then size it once the traffic is known.
    let topo_text = match &a.topology {
        Some(p) => Some((
            switchyard::compiler::error::read_file(p)?,
            p.display().to_string(),
        )),
        None => None,
    };
    let mut topo = match &topo_text {
        Some((text, file)) if !is_import(text) => {
            Some(load_topology_text(text, file, a.nodes, None)?)
        }
        _ => None,
    };
    let m = match &a.traffic {
        Some(t) => TrafficMatrix::load(t)?,
        None if is_xml(&a.plan) => {
            let text = switchyard::compiler::error::read_file(&a.plan)?;
            xml_traffic(&text, &a.plan.display().to_string())?
        }
        None => {
            return Err(CliError::Input(
                "--traffic is required for a .json plan".into(),
            ))
        }
    };
    let traffic_name = a
        .traffic
        .as_ref()
        .map_or("<traffic implied by the XML>".to_string(), |p| {
            p.display().to_string()
        });
    if let Some((text, file)) = topo_text.as_ref().filter(|(t, _)| is_import(t)) {
        topo = Some(load_topology_text(text, file, a.nodes, Some(m.ranks()))?);
    }
    if let Some(t) = &topo {
        m.check_ranks(t.ranks(), &traffic_name)?;
    }
    let plan = load_plan(&a.plan, Some(&m), topo.as_ref())?;
    let result = match &topo {
        Some(t) => verify_on(&plan, &m, t),
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
