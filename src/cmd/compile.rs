//! `compile` and `verify`.

use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::Args;
use switchyard::compiler::import::is_import;
use switchyard::compiler::import::ImportOptions;
use switchyard::compiler::lp::{lower_bound, LpOptions, SolveStatus};
use switchyard::compiler::msccl::chunk::buffer_bytes as msccl_buffer_bytes;
use switchyard::compiler::msccl::depth::shallower_fast;
use switchyard::compiler::msccl::laps::Laps;
use switchyard::compiler::msccl::{
    assign_paths, fit, parse_xml, parse_xml_implied, to_xml, Executor, Layout, Protocol,
    XmlOptions, XmlPlan, MAX_CHUNK_BYTES,
};
use switchyard::compiler::planner::{Planner, PlannerOptions};
use switchyard::compiler::program::OpKind;
use switchyard::compiler::rank::{slice_into, LocalProgram, LocalTraffic};
use switchyard::compiler::report::Report;
use switchyard::compiler::sched::auto::{choose, AutoChoice};
use switchyard::compiler::sched::{auto, lp_with_report, schedule, Options};
use switchyard::compiler::sim::{Network, SimOptions};
use switchyard::compiler::{verify_on, Algorithm, Error, Plan, Topology, TrafficMatrix};

use super::progress::SimProgress;
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
    /// fast for this matrix by the cost model's estimates, for `--network`;
    /// candidates the estimates cannot separate are simulated).
    #[arg(long, default_value = "auto")]
    algorithm: String,
    /// Output plan: `.json` writes the plan IR, `.xml` MSCCL XML (then `lp`
    /// runs at most 106 lanes at once per GPU, so the file's threadblocks can run them all);
    /// `-` writes the JSON plan to stdout.
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
    /// MSCCL XML: the executor whose limits the file meets, `msccl`
    /// (NCCL-MSCCL: 108 threadblocks per GPU, 32 channels) or `rccl` (64
    /// threadblocks, 128 channels). Default: `rccl` for MI300X topologies, else `msccl`.
    #[arg(long)]
    executor: Option<String>,
    /// Write a JSON report here.
    #[arg(long)]
    report: Option<PathBuf>,
    /// Network mode the plan is made for and the report's simulation runs in: calibrated (fitted to measured clusters), ideal (line rate), congested, or stress (a harsh incast assumption).
    #[arg(long, default_value = "calibrated")]
    network: String,
    /// LP time limit in seconds: `lp`'s solve, building the model included
    /// (the best plan found by then is kept), then the LP bound of a `links`
    /// topology on the summary line gets what is left.
    #[arg(long, default_value_t = 60.0)]
    time_limit: f64,
    /// `lp`: print the solver's log.
    #[arg(long)]
    verbose: bool,
    /// Write only this rank's own program (JSON, docs/formats.md "Rank
    /// program"), planned without the whole plan where the algorithm can
    /// (`direct`, `hierarchical`, `fast`, `spray`, `pxn`, `deepep`; `auto`
    /// after its choice, unless the call is close).
    #[arg(long)]
    rank: Option<usize>,
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
    if let Some(rank) = a.rank {
        return compile_rank(&a, alg, rank);
    }
    let (topo, m) = load_inputs(&a.topology, &a.traffic, a.nodes)?;
    let executor = match &a.executor {
        Some(e) => e
            .parse::<Executor>()
            .map_err(|e| CliError::Input(format!("--executor: {e}")))?,
        None => Executor::default_for(&topo),
    };
    // `lp` may solve for a minute: a path it cannot write fails first.
    let to_stdout = super::is_stdout(&a.out);
    for p in std::iter::once(&a.out).chain(&a.report) {
        super::check_out_dir(p)?;
    }
    // A cluster too large for the executor's threadblocks is refused
    // before any planning, saying what fits (docs/msccl.md, "Cluster size").
    let xml_out = is_xml(&a.out) && !to_stdout;
    if xml_out {
        // What the user asked for cannot exist: bad input (exit 2).
        fit::check_before_planning(alg, &topo, &m, executor)
            .map_err(|e| CliError::Input(e.to_string()))?;
    }
    let t0 = Instant::now();
    let mut laps = Laps::start("compile");
    // An MSCCL file runs at most the executor's threadblocks per GPU (108,
    // RCCL 64): a plan for one must not run more lanes at once than that
    // (only `lp` would).
    // A file's plan asks only for the waits an executor holds (`pairwise`).
    let base = if is_xml(&a.out) {
        Options::for_msccl(executor.plan_lanes_per_gpu())
    } else {
        Options::default()
    };
    // `lp` for a file routes rail to rail where the executor's
    // threadblocks cannot hold a peer per GPU (refused above where even
    // that cannot fit); made for the ideal network, also where one lane
    // per peer passes the threadblocks the lowering gives out (8 x 8:
    // its relays' lanes would run one after another; with a per-message
    // cost the rail-aligned plan's many slices cost more than that).
    let rail_check = |lanes: bool| {
        if lanes {
            fit::lp_rail_aligned_for_lanes(&topo, &m, executor)
        } else {
            fit::lp_rail_aligned(&topo, &m, executor)
        }
        .map_err(|e| CliError::Input(e.to_string()))
    };
    let lp_xml = xml_out && alg == Algorithm::Lp;
    let rails_for_peers = lp_xml && rail_check(false)?;
    let lp_rail_aligned =
        rails_for_peers || lp_xml && network == Network::Ideal && rail_check(true)?;
    let opts = Options {
        time_limit_s: a.time_limit,
        verbose: a.verbose,
        network,
        lp_rail_aligned,
        ..base
    };
    // The solver can take seconds to minutes: show that it is working (a
    // spinner on a terminal, nothing when stderr is redirected).
    let spinner = (alg == Algorithm::Lp).then(|| {
        let bar = indicatif::ProgressBar::new_spinner();
        bar.set_message(format!("lp: solving (time limit {} s)", a.time_limit));
        bar.enable_steady_tick(std::time::Duration::from_millis(120));
        bar
    });
    // `lp` also says how its solve ended, for the summary line; `auto`
    // what it chose and why.
    let (plan, lp_status, choice) = if alg == Algorithm::Lp {
        let lp_opts = LpOptions {
            time_limit_s: opts.time_limit_s,
            verbose: opts.verbose,
            max_lanes_per_gpu: opts.max_lanes_per_gpu,
            rail_aligned: opts.lp_rail_aligned,
        };
        match lp_with_report(&topo, &m, &lp_opts) {
            Ok((plan, r)) => (Ok(plan), Some(r.status), None),
            Err(e) => (Err(e), None, None),
        }
    } else if alg == Algorithm::Auto && xml_out {
        // For a file, the best estimate among the candidates whose file
        // fits the executor's threadblocks on this cluster.
        let mut choice = choose(&topo, &m, network);
        let fits = fit::fitting(&topo, &m, executor);
        let ok = |name: &str| name.parse::<Algorithm>().is_ok_and(|a| fits.contains(&a));
        if !ok(&choice.chosen) {
            let Some(e) = choice.estimates.iter().find(|e| ok(&e.algorithm)) else {
                return Err(CliError::Input(format!(
                    "auto: no candidate's MSCCL file fits {executor} on {} ranks (too many peers per GPU for its threadblocks); try --executor msccl or a JSON plan",
                    m.ranks()
                )));
            };
            eprintln!(
                "auto: {} does not fit {executor} on {} ranks; taking {}, the best that does",
                choice.chosen,
                m.ranks(),
                e.algorithm
            );
            choice.chosen = e.algorithm.clone();
        }
        match schedule(choice.algorithm(), &topo, &m, &opts) {
            Ok(plan) => (Ok(plan), None, Some(choice)),
            Err(e) => (Err(e), None, None),
        }
    } else if alg == Algorithm::Auto {
        match auto(&topo, &m, network) {
            Ok((plan, choice)) => (Ok(plan), None, Some(choice)),
            Err(e) => (Err(e), None, None),
        }
    } else {
        (schedule(alg, &topo, &m, &opts), None, None)
    };
    if let Some(bar) = spinner {
        bar.finish_and_clear();
    }
    let mut plan = plan?;
    // Every written plan names the matrix it was made for (`lp`'s solve
    // with its report, like the per-batch planner, leaves that to us).
    if plan.traffic_fingerprint.is_none() {
        plan.traffic_fingerprint = Some(m.fingerprint());
    }
    // The plan carries the chosen scheduler's name; the report says who chose.
    let alg = match &choice {
        Some(c) => c.algorithm(),
        None => alg,
    };
    let compile_us = t0.elapsed().as_secs_f64() * 1e6;
    verify_on(&plan, &m, &topo)
        .map_err(|e| CliError::Failed(format!("internal error: {alg} made a wrong plan: {e}")))?;
    // For XML the plan that runs is the one requantised to chunks: report that one.
    let format = if to_stdout {
        Some("json".to_string())
    } else {
        extension(&a.out)
    };
    let mut buffers = None;
    let mut priced = None;
    let mut shallower = None;
    let mut lowered = None;
    let (text, plan, msccl) = match format.as_deref() {
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
                executor,
                ..XmlOptions::default()
            };
            laps.lap("plan");
            let lowering = std::time::Instant::now();
            let xml = to_xml(&plan, &topo, &m, &opts)?;
            laps.lap("lowering");
            // `fast`'s file short of threadblocks and behind its plan: the
            // plan one send shallower in flight is priced too.
            let (xml, swap) = shallower_fast(&plan, xml, &topo, &m, network, &opts)?;
            laps.lap("shallower plan");
            // `compile_us` is the planning; this is the file's making
            // (lowering, pricing its candidates, a shallower plan).
            let lower_us = lowering.elapsed().as_secs_f64() * 1e6;
            let mut facts = xml.report_json();
            facts["executor"] = executor.name().into();
            facts["lower_us"] = lower_us.into();
            lowered = Some(lower_us);
            if let Some(w) = swap {
                facts["shallower"] = serde_json::json!({
                    "pipeline_depth": w.depth,
                    "default_depth": w.default_depth,
                    "default_file_us": w.default_file_us,
                });
                shallower = Some(format!(
                    "fast planned with {} sends in flight per GPU, not {}: its file by the executor's rules {:.1} us against {:.1} us",
                    w.depth,
                    w.default_depth,
                    xml.executor_price.map_or(f64::NAN, |p| p.file_us),
                    w.default_file_us
                ));
            }
            buffers = Some(buffer_note(&xml, &m));
            priced = price_note(&xml, executor);
            (xml.text, xml.plan, Some(facts))
        }
        _ => {
            return Err(CliError::Input(format!(
                "{}: unknown plan format (use .json or .xml, or - for JSON on stdout)",
                a.out.display()
            )))
        }
    };
    write_out(Some(&a.out), &text)?;
    // Every compile is simulated, so its summary says how good the plan is.
    // A file's plan runs each threadblock's steps one after another: most
    // of its events are arrivals, grouped like finishes where the plan is
    // large enough to be grouped (docs/cost-model.md §1).
    let sim_opts = SimOptions {
        group_arrivals: msccl.is_some(),
        ..SimOptions::new(network)
    };
    // On a `links` topology the bound is an LP too: it gets what is left of
    // --time-limit (an unproven LP bound is left out, the cut bound stays).
    let left = (a.time_limit - t0.elapsed().as_secs_f64()).max(1e-3);
    let bound = lower_bound(
        &topo,
        &m,
        &LpOptions {
            time_limit_s: left,
            ..LpOptions::default()
        },
    )?;
    laps.lap("write and bound");
    let mut progress = SimProgress::new(format!("simulating {} transfers", plan.transfers.len()));
    let sim = Report::simulate(&topo, &m, &plan, &sim_opts, &mut progress.callback());
    progress.finish();
    laps.lap("report's simulation");
    let mut report = Report::assemble(
        alg.name(),
        &topo,
        &m,
        &plan,
        &sim?,
        Some(&bound),
        Some(compile_us),
        &sim_opts,
    );
    report.auto = choice.clone();
    if let Some(r) = &a.report {
        let mut json =
            serde_json::to_value(&report).map_err(|e| CliError::Failed(e.to_string()))?;
        if let (Some(facts), Some(obj)) = (msccl, json.as_object_mut()) {
            obj.insert("msccl".into(), facts);
        }
        let text =
            serde_json::to_string_pretty(&json).map_err(|e| CliError::Failed(e.to_string()))?;
        write_out(Some(r), &(text + "\n"))?;
    }
    let mut parts = vec![
        format!(
            "{}: {} transfers in {} steps, {}",
            if to_stdout {
                "<stdout>".to_string()
            } else {
                a.out.display().to_string()
            },
            plan.transfers.len(),
            plan.steps(),
            // An XML file's planning and its lowering, apart.
            match lowered {
                Some(us) => format!(
                    "planned in {compile_us:.0} us, lowered to XML in {:.1} ms",
                    us / 1e3
                ),
                None => format!("compiled in {compile_us:.0} us"),
            }
        ),
        format!(
            "simulated {:.1} us ({} network), lower bound {:.1} us, ratio {:.3}",
            report.completion_us, network, report.lower_bound_us, report.ratio_to_bound
        ),
    ];
    if let Some(b) = buffers {
        parts.push(b.trim_start_matches("; ").to_string());
    }
    parts.extend(priced);
    parts.extend(shallower);
    if rails_for_peers {
        parts.push(format!(
            "lp: routed rail to rail ({executor} loads at most {} threadblocks per GPU, fewer than the {} peers any route may use)",
            executor.max_tbs_per_gpu(),
            m.ranks() - 1
        ));
    } else if lp_rail_aligned {
        parts.push(format!(
            "lp: routed rail to rail (a lane to each of the {} peers any route may use needs more than the {} threadblocks per GPU the file gives out, so its lanes would run one after another)",
            m.ranks() - 1,
            executor.tb_budget()
        ));
    }
    match lp_status {
        Some(SolveStatus::TimeLimit) => parts.push(format!(
            "lp: the time limit of {} s ran out before HiGHS proved its flow optimal (the best flow found is kept)",
            a.time_limit
        )),
        Some(SolveStatus::NoFlow) => parts.push(format!(
            "lp: the time limit of {} s ran out before HiGHS held a flow, so every block goes {} (raise --time-limit)",
            a.time_limit,
            if lp_rail_aligned {
                "over NVLink to its destination's rail, then rail to rail"
            } else {
                "on its topology path"
            }
        )),
        _ => {}
    }
    if let Some(c) = &choice {
        say_choice(c);
    }
    eprintln!("{}", parts.join("; "));
    Ok(())
}

/// `auto`'s choice and why, one line on stderr.
fn say_choice(c: &AutoChoice) {
    let why: Vec<String> = c
        .estimates
        .iter()
        .map(|e| format!("{} {:.1} us", e.algorithm, e.estimate_us))
        .collect();
    let tie: Vec<String> = c
        .simulated
        .iter()
        .map(|s| format!("{} {:.1} us", s.algorithm, s.completion_us))
        .collect();
    let settled = if tie.is_empty() {
        String::new()
    } else {
        format!("; too close to call, simulated: {}", tie.join(", "))
    };
    eprintln!(
        "auto chose {} (estimates: {}{settled})",
        c.chosen,
        why.join(", ")
    );
}

/// `compile --rank R`: one rank's own program and a report of what it does.
fn compile_rank(a: &CompileArgs, alg: Algorithm, rank: usize) -> CliResult {
    if extension(&a.out).as_deref() != Some("json") {
        return Err(CliError::Input(format!(
            "{}: --rank writes a rank program as JSON (use .json)",
            a.out.display()
        )));
    }
    if !matches!(
        alg,
        Algorithm::Direct
            | Algorithm::Hierarchical
            | Algorithm::Fast
            | Algorithm::Spray
            | Algorithm::Pxn
            | Algorithm::Deepep
            | Algorithm::Auto
    ) {
        return Err(CliError::Input(format!(
            "--rank: `{alg}` has no rank programs (use auto, direct, hierarchical, fast, spray, pxn or deepep)"
        )));
    }
    let network: Network = a.network.parse()?;
    let (topo, m) = load_inputs(&a.topology, &a.traffic, a.nodes)?;
    for p in std::iter::once(&a.out).chain(&a.report) {
        super::check_out_dir(p)?;
    }
    // What the rank knows is gathered in a job, not planned: it is built
    // before the clock starts (from the whole matrix here, O(R^2)).
    let local = LocalTraffic::from_matrix(&m, rank, &topo)?;
    let mut planner = if alg == Algorithm::Auto {
        // As `compile` plans it: a close call settled by simulating the
        // contenders, so that the program is the rank's part of its plan.
        match Planner::auto(&topo, PlannerOptions::for_network(network), network) {
            Ok(planner) => planner.settling(true),
            // A `links` graph has no per-batch planner: `compile`'s one-shot
            // choice there, its whole plan sliced.
            Err(Error::Unsupported { .. }) => {
                let t0 = Instant::now();
                let (plan, choice) = auto(&topo, &m, network)?;
                let mut prog = LocalProgram::default();
                slice_into(&plan, rank, &mut prog)?;
                let compile_us = t0.elapsed().as_secs_f64() * 1e6;
                say_choice(&choice);
                return finish_rank(a, alg, rank, &topo, prog, compile_us, "whole plan");
            }
            Err(e) => return Err(e.into()),
        }
    } else {
        // `spray`, the ablation, keeps line-rate chunks (as `schedule` plans it).
        let opts = if alg == Algorithm::Spray {
            PlannerOptions::default()
        } else {
            PlannerOptions::for_network(network)
        };
        Planner::for_algorithm(&topo, alg, opts)?
    };
    // `compile_us` times the per-rank planning, or the whole plan and its
    // slicing where the algorithm needs the whole matrix (`planned`).
    // `auto` chooses from the whole matrix's estimates (timed), then plans
    // the chosen algorithm's program for the rank, or, on a close call,
    // the whole plan.
    let mut t0 = Instant::now();
    let own = (alg != Algorithm::Auto).then(|| planner.program_local(&local));
    let (prog, planned) = match own {
        Some(Ok(prog)) => (prog, "rank"),
        Some(Err(e)) if !matches!(e, Error::NeedsWholeMatrix { .. }) => return Err(e.into()),
        // `auto`, or an algorithm with no per-rank planner for this plan:
        // from the matrix (the clock restarted).
        _ => {
            t0 = Instant::now();
            let prog = planner.program(rank, &m)?;
            let planned = if planner.rank_sliced() {
                "whole plan"
            } else {
                "rank"
            };
            (prog, planned)
        }
    };
    let compile_us = t0.elapsed().as_secs_f64() * 1e6;
    if let Some(c) = planner.last_choice() {
        say_choice(c);
    }
    finish_rank(a, alg, rank, &topo, prog, compile_us, planned)
}

/// Writes a rank's program and its report (`planned`: "rank" when planned
/// from what the rank knows, "whole plan" when sliced from it).
fn finish_rank(
    a: &CompileArgs,
    alg: Algorithm,
    rank: usize,
    topo: &Topology,
    prog: LocalProgram,
    compile_us: f64,
    planned: &str,
) -> CliResult {
    write_out(Some(&a.out), &prog.to_json())?;
    let sum = |kind: OpKind| -> (usize, u64) {
        prog.ops
            .iter()
            .filter(|o| o.op == kind)
            .fold((0, 0), |(n, b), o| (n + 1, b + o.bytes))
    };
    let ((sends, sent), (recvs, received), (copies, copied)) =
        (sum(OpKind::Send), sum(OpKind::Recv), sum(OpKind::Copy));
    if let Some(r) = &a.report {
        let json = serde_json::json!({
            "algorithm": alg.name(),
            "rank": rank,
            "ranks": topo.ranks(),
            "compile_us": compile_us,
            "planned_from": planned,
            "ops": prog.ops.len(),
            "sends": sends,
            "receives": recvs,
            "copies": copies,
            "bytes_sent": sent,
            "bytes_received": received,
            "bytes_copied": copied,
            "scratch_bytes": prog.scratch_bytes,
        });
        let text =
            serde_json::to_string_pretty(&json).map_err(|e| CliError::Failed(e.to_string()))?;
        write_out(Some(r), &(text + "\n"))?;
    }
    eprintln!(
        "{}: rank {rank}: {} ops ({sends} sends, {recvs} receives, {copies} copies), compiled in {compile_us:.0} us",
        a.out.display(),
        prog.ops.len(),
    );
    Ok(())
}

/// What the file costs against its plan by the executor's rules, where the
/// lowering priced it, and the threadblocks its plan wanted where the
/// executor has fewer (so the file runs one after another some of what
/// the plan runs at once): issue 22's "report the cost".
fn price_note(xml: &XmlPlan, executor: Executor) -> Option<String> {
    let p = xml.executor_price?;
    let mut s = format!(
        "by {executor}'s executor rules {:.1} us, {:+.1}% against its plan's {:.1} us (ideal network)",
        p.file_us,
        100.0 * p.over_plan(),
        p.plan_us
    );
    if xml.tbs_wanted > xml.max_tbs_per_gpu {
        s += &format!(
            ", its plan wanting {} threadblocks on a GPU where the file has {}",
            xml.tbs_wanted, xml.max_tbs_per_gpu
        );
    }
    Some(s)
}

/// What an XML file's buffers cost against the data they carry: each rank
/// passes `ncclAllToAll` a send and a receive buffer of `buffer_bytes`, for
/// on average `total / n` bytes of its own. `packed` is recommended where
/// the caller lays out the data itself.
fn buffer_note(xml: &XmlPlan, m: &TrafficMatrix) -> String {
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    let n = m.ranks() as u64;
    let payload = m.total().div_ceil(n.max(1)).max(1);
    let ratio = |b: u64| b as f64 / payload as f64;
    let mut s = format!(
        "; buffers {:.2} MiB per GPU for {:.2} MiB of payload on average ({:.1}x, {})",
        mib(xml.buffer_bytes),
        mib(payload),
        ratio(xml.buffer_bytes),
        xml.layout
    );
    if xml.layout == Layout::Padded {
        let packed = msccl_buffer_bytes(m, Layout::Packed, xml.chunk_bytes);
        if packed < xml.buffer_bytes {
            s += &format!(
                "; --layout packed needs {:.2} MiB ({:.1}x) where the caller packs the data",
                mib(packed),
                ratio(packed)
            );
        }
    }
    s
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
            // Then the matrix it was made for, before any byte-level check.
            if let Some(m) = traffic {
                plan.check_made_for(m, &file)?;
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

/// The traffic a plan is checked against, its name for messages, and for
/// an XML plan given without a matrix the file read on the matrix it implies
/// (rounded to whole chunks, so the file's own fingerprint is not checked
/// against it). `verify` and `simulate` read their inputs the same way.
pub fn plan_traffic(
    plan: &Path,
    traffic: Option<&Path>,
) -> Result<(TrafficMatrix, String, Option<Plan>), CliError> {
    match traffic {
        Some(t) => Ok((TrafficMatrix::load(t)?, t.display().to_string(), None)),
        None if is_xml(plan) => {
            let text = switchyard::compiler::error::read_file(plan)?;
            let (m, p) = parse_xml_implied(&text, &plan.display().to_string())?;
            Ok((m, "<traffic implied by the XML>".to_string(), Some(p)))
        }
        None => Err(CliError::Input(
            "--traffic is required for a .json plan".into(),
        )),
    }
}

/// What a plan check reads: the topology (when given), the traffic, its
/// name, and an XML plan read on its implied matrix ([`plan_traffic`]).
pub type PlanInputs = (Option<Topology>, TrafficMatrix, String, Option<Plan>);

/// The topology (when given), the traffic and its name for a plan check:
/// a topology's own errors come first; an imported node description is
/// sized once the traffic's ranks are known.
pub fn plan_inputs(
    topology: Option<&Path>,
    nodes: Option<usize>,
    plan: &Path,
    traffic: Option<&Path>,
) -> Result<PlanInputs, CliError> {
    let topo_text = match topology {
        Some(p) => Some((
            switchyard::compiler::error::read_file(p)?,
            p.display().to_string(),
        )),
        None => None,
    };
    let mut topo = match &topo_text {
        Some((text, file)) if !is_import(text) => {
            Some(load_topology_text(text, file, nodes, None)?)
        }
        _ => None,
    };
    let (m, traffic_name, implied) = plan_traffic(plan, traffic)?;
    if let Some((text, file)) = topo_text.as_ref().filter(|(t, _)| is_import(t)) {
        topo = Some(load_topology_text(text, file, nodes, Some(m.ranks()))?);
    }
    Ok((topo, m, traffic_name, implied))
}

pub fn verify(a: VerifyArgs) -> CliResult {
    let (topo, m, traffic_name, implied) = plan_inputs(
        a.topology.as_deref(),
        a.nodes,
        &a.plan,
        a.traffic.as_deref(),
    )?;
    if let Some(t) = &topo {
        m.check_ranks(t.ranks(), &traffic_name)?;
    }
    let plan = match implied {
        Some(mut plan) => {
            if let Some(t) = &topo {
                assign_paths(&mut plan, t);
            }
            plan
        }
        None => load_plan(&a.plan, Some(&m), topo.as_ref())?,
    };
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
