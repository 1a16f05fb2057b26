//! `run`: execute a plan on real buffers (CPU or CUDA) and check every byte.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use switchyard::compiler::TrafficMatrix;
use switchyard_runtime::{execute, BackendKind, Inject, RunOptions, RuntimeError};

use super::compile::load_plan;
use super::{CliError, CliResult};

/// Most CPU worker threads a run may ask for (each is an OS thread).
const MAX_THREADS: usize = 1024;

#[derive(Args)]
// A negative number is a value to reject with its reason, not an unknown flag.
#[command(allow_negative_numbers = true)]
pub struct RunArgs {
    /// The plan: `.json` (plan IR) or `.xml` (MSCCL XML).
    #[arg(long)]
    plan: PathBuf,
    /// The traffic matrix the plan was made for.
    #[arg(long)]
    traffic: PathBuf,
    /// cpu or cuda.
    #[arg(long, default_value = "cpu")]
    backend: String,
    /// Print the report as one JSON object.
    #[arg(long)]
    json: bool,
    /// CPU worker threads (0 = one per core).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// CUDA streams per rank.
    #[arg(long, default_value_t = 4)]
    channels: usize,
    /// CUDA, single process: spread ranks over this many devices (0 = all visible).
    #[arg(long, default_value_t = 0)]
    devices: usize,
    /// Run the transfers this many times and report the fastest.
    #[arg(long, default_value_t = 1)]
    iterations: usize,
    /// Also time a plain copy of the same bytes (one-thread memcpy, or one device copy).
    #[arg(long)]
    reference: bool,
    /// CUDA, one device: issue the copies once into a CUDA graph and replay
    /// it for every iteration (times the copies, not the issuing).
    #[arg(long)]
    graph: bool,
    /// Watchdog: fail when nothing finishes for this many seconds.
    #[arg(long, default_value_t = 60.0)]
    timeout: f64,
    /// Test aid: inject a fault the check must catch. `reverse-order` runs
    /// the transfers one at a time in reverse plan order, ignoring their
    /// dependencies (a plan that relays through scratch must then fail).
    #[arg(long, value_name = "FAULT")]
    inject: Option<String>,
    /// CUDA test aid, one process: give every rank a context of its own, so
    /// copies between ranks use the peer-copy call even on one GPU.
    #[arg(long)]
    context_per_rank: bool,
    /// CUDA test aid: run a one-rank plan as a one-process NCCL group that
    /// sends to itself (exercises NCCL without a second GPU).
    #[arg(long)]
    nccl_loopback: bool,
}

pub fn run(a: RunArgs) -> CliResult {
    let kind: BackendKind = a
        .backend
        .parse()
        .map_err(|e: String| CliError::Input(format!("--backend: {e}")))?;
    let timeout = Duration::try_from_secs_f64(a.timeout)
        .ok()
        .filter(|t| !t.is_zero())
        .ok_or_else(|| {
            CliError::Input(format!(
                "--timeout: must be a positive number of seconds, got {}",
                switchyard::compiler::error::num(a.timeout)
            ))
        })?;
    if a.threads > MAX_THREADS {
        return Err(CliError::Input(format!(
            "--threads: {} worker threads; at most {MAX_THREADS}",
            a.threads
        )));
    }
    for (set, flag) in [
        (a.graph, "--graph"),
        (a.context_per_rank, "--context-per-rank"),
        (a.nccl_loopback, "--nccl-loopback"),
    ] {
        if set && kind != BackendKind::Cuda {
            return Err(CliError::Input(format!("{flag}: needs --backend cuda")));
        }
    }
    let inject = a
        .inject
        .as_deref()
        .map(str::parse::<Inject>)
        .transpose()
        .map_err(|e| CliError::Input(format!("--inject: {e}")))?;
    let m = TrafficMatrix::load(&a.traffic)?;
    let plan = load_plan(&a.plan, Some(&m), None)?;
    let opts = RunOptions {
        threads: a.threads,
        timeout,
        channels: a.channels.max(1),
        devices: a.devices,
        iterations: a.iterations.max(1),
        reference: a.reference,
        graph: a.graph,
        inject,
        context_per_rank: a.context_per_rank,
        nccl_loopback: a.nccl_loopback,
    };
    let spinner = super::progress::Spinner::start(format!(
        "running {} transfers on {kind}",
        plan.transfers.len()
    ));
    let report = execute(&plan, &m, kind, &opts);
    drop(spinner);
    let report = report.map_err(|e| match e {
        RuntimeError::Ranks { .. } => CliError::Input(format!("{}: {e}", a.traffic.display())),
        e => CliError::Failed(format!("{} ({kind}): {e}", a.plan.display())),
    })?;
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).unwrap_or_default()
        );
    } else {
        let mut line = format!(
            "{}: {} transfers, {} bytes moved between ranks ({} local, {} nvlink, {} rdma) in {:.3} ms = {:.2} GB/s on {} {}",
            kind,
            report.transfers,
            report.bytes_moved,
            report.link_bytes.local,
            report.link_bytes.nvlink,
            report.link_bytes.rdma,
            report.seconds * 1e3,
            report.copy_rate_gbps,
            report.lanes,
            if kind == BackendKind::Cpu { "threads" } else { "streams" },
        );
        if let Some(r) = report.reference_gbps {
            line += &format!(
                "; a plain copy of the same bytes: {r:.2} GB/s (ratio {:.2})",
                report.copy_rate_gbps / r
            );
        }
        if let Some(c) = report.capture_seconds {
            line += &format!(
                "; replayed from a CUDA graph (issuing and capturing it took {:.3} ms)",
                c * 1e3
            );
        }
        if report.serial {
            line += "; the plan could race, so it ran one transfer at a time";
        }
        println!("{line}");
    }
    match report.first_bad {
        None => {
            if !a.json {
                println!("ok: every output byte verified");
            }
            Ok(())
        }
        Some(bad) => Err(CliError::Failed(format!(
            "{}: verification failed ({} wrong bytes): {bad}",
            a.plan.display(),
            report.bad_bytes
        ))),
    }
}
