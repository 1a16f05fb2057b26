//! `demo`: the main job on a built-in cluster — every algorithm compiled,
//! verified and simulated at line rate (`ideal`) and in the `calibrated`
//! model (fitted to measured clusters) against the lower bounds.

use std::time::Instant;

use clap::Args;
use switchyard::compiler::bound::{cut_bound, cut_bound_goodput};
use switchyard::compiler::generate::{generate, Pattern, TrafficSpec};
use switchyard::compiler::sched::{auto, schedule, Options};
use switchyard::compiler::sim::{simulate_with_progress, Network, SimOptions};
use switchyard::compiler::{verify_on, Algorithm, Error, Topology};

use super::progress::{SimProgress, Spinner};
use super::{CliError, CliResult};

#[derive(Args)]
// A negative number is a value to reject with its reason, not an unknown flag.
#[command(allow_negative_numbers = true)]
pub struct DemoArgs {
    /// Nodes of the built-in DGX-H100 cluster.
    #[arg(long, default_value_t = 4)]
    nodes: usize,
    /// Zipf exponent of expert popularity.
    #[arg(long, default_value_t = 1.0)]
    skew: f64,
    #[arg(long, default_value_t = 7)]
    seed: u64,
}

pub fn run(a: DemoArgs) -> CliResult {
    let topo = Topology::preset("dgx-h100", a.nodes, None)?;
    let mut spec = TrafficSpec::new(topo.ranks(), Pattern::Zipf(a.skew));
    spec.seed = a.seed;
    let m = generate(&spec)?;
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    println!(
        "cluster: {} ({} GPUs, NVSwitch {:.0} GB/s, {} x {:.0} GB/s NICs per node)",
        topo.name(),
        topo.ranks(),
        topo.intra_bandwidth() / 1e3,
        topo.nics_per_node(),
        topo.nic_bandwidth() / 1e3
    );
    println!(
        "traffic: MoE, {} tokens/rank, top-{}, expert popularity zipf {}: {:.0} MiB between ranks, hottest receiver {:.0} MiB (mean {:.0})",
        spec.moe.tokens_per_rank,
        spec.moe.top_k,
        a.skew,
        mib(m.off_diagonal_total()),
        mib((0..m.ranks()).map(|d| m.col_sum(d)).max().unwrap_or(0)),
        mib(m.total() / m.ranks() as u64),
    );
    let bound = cut_bound(&topo, &m);
    let cal_opts = SimOptions::new(Network::Calibrated);
    let cal_bound = cut_bound_goodput(&topo, &m, cal_opts.nic_goodput());
    println!(
        "lower bound: {:.1} us at line rate, {:.1} us at the calibrated NIC goodput ({})\n",
        bound.best_us(),
        cal_bound.best_us(),
        bound.cut
    );
    println!(
        "{:<13} {:>9} {:>6} {:>11} {:>11} {:>8} {:>13} {:>8} {:>9} {:>8}",
        "algorithm",
        "transfers",
        "steps",
        "compile_us",
        "ideal_us",
        "/bound",
        "calibrated_us",
        "/bound",
        "x pxn",
        "verified"
    );
    let mut rows = Vec::new();
    for &alg in Algorithm::ALL {
        let t0 = Instant::now();
        let spinner = Spinner::start(format!("{alg}: compiling"));
        let plan = schedule(alg, &topo, &m, &Options::default());
        drop(spinner);
        let plan = match plan {
            Ok(p) => p,
            Err(Error::Unsupported { .. }) => continue,
            Err(e) => return Err(e.into()),
        };
        let us = t0.elapsed().as_secs_f64() * 1e6;
        verify_on(&plan, &m, &topo).map_err(|e| CliError::Failed(format!("{alg}: {e}")))?;
        // Each plan is made for the network mode it is judged in, as
        // `compile --network` makes it (`fast` sizes its chunks and stages
        // for the per-message cost; `auto` chooses for the mode).
        let (congested_plan, name) = if alg == Algorithm::Auto {
            let (p, c) = auto(&topo, &m, Network::Calibrated)?;
            verify_on(&p, &m, &topo).map_err(|e| CliError::Failed(format!("{alg}: {e}")))?;
            let name = if c.chosen == plan.algorithm {
                format!("auto:{}", c.chosen)
            } else {
                format!("auto:{}/{}", plan.algorithm, c.chosen)
            };
            (p, name)
        } else {
            let opts = Options {
                network: Network::Calibrated,
                ..Options::default()
            };
            // One plan serves both modes where the scheduler does not
            // read the network (every one but `fast` here: `lp` is not
            // solved twice).
            let p = if opts.reads_network(alg) {
                let p = schedule(alg, &topo, &m, &opts)?;
                verify_on(&p, &m, &topo).map_err(|e| CliError::Failed(format!("{alg}: {e}")))?;
                p
            } else {
                plan.clone()
            };
            (p, alg.name().to_string())
        };
        let mut times = [0.0; 2];
        for (time, (opts, plan)) in times.iter_mut().zip([
            (SimOptions::new(Network::Ideal), &plan),
            (cal_opts.clone(), &congested_plan),
        ]) {
            let mut progress = SimProgress::new(format!("{alg}: simulating ({})", opts.network));
            let sim = simulate_with_progress(&topo, plan, &opts, &mut progress.callback());
            progress.finish();
            *time = sim?.completion_us;
        }
        let [ideal, calibrated] = times;
        rows.push((
            name,
            plan.transfers.len(),
            plan.steps(),
            us,
            ideal,
            calibrated,
        ));
    }
    let pxn_us = rows.iter().find(|r| r.0 == "pxn").map_or(f64::NAN, |r| r.5);
    for (name, transfers, steps, us, ideal, calibrated) in rows {
        println!(
            "{:<13} {:>9} {:>6} {:>11.0} {:>11.1} {:>8.3} {:>13.1} {:>8.3} {:>9.2} {:>8}",
            name,
            transfers,
            steps,
            us,
            ideal,
            ideal / bound.best_us(),
            calibrated,
            calibrated / cal_bound.best_us(),
            pxn_us / calibrated,
            "yes"
        );
    }
    // Only a debug build needs the warning about its compile times.
    let build_note = if cfg!(debug_assertions) {
        "; compile_us from a debug build is slower than release"
    } else {
        ""
    };
    println!("\n(auto:X/Y: `auto`, the default, chose X for the ideal network and Y for the calibrated one)");
    println!("(calibrated: NIC goodput and per-message cost fitted to published NCCL runs, docs/cost-model.md, each algorithm planned for it as `compile --network calibrated` plans; x pxn: speedup over `pxn`, NCCL's default, in the calibrated model{build_note}; times are simulated)");
    Ok(())
}
