//! The per-batch `auto` planner on a sequence of matrices that drift the way
//! MoE routing does (docs/benchmarks.md, "`auto` per batch"): how often
//! it settles (simulates the contenders' plans), what a call costs, and how
//! far its pick is from the best candidate, against the estimates alone
//! and against settling every close call.
//!
//! Drifts (`--drift`):
//! - `seeds`: every batch a fresh draw of the same pattern (seed `t`): the
//!   hot experts move every batch (the hard case);
//! - `mix`: `0.8 ((1 - a) A + a B) + 0.2 C_t`, `a` from 0 to 1 over the
//!   sequence, with `A`, `B` two draws of the pattern and `C_t` a fresh one
//!   per batch: the popular experts move slowly, plus per-batch noise.
//!
//! Every call also simulates every candidate's plan (not timed) to know the
//! best; the time columns are `Planner::plan_into` alone (the choice, the
//! settles, the chosen plan).
//!
//! cargo run --release --example auto_batches -- [--nodes 2,4,8] [--presets dgx-h100]
//!     [--fabrics full,fat-tree,rail] [--patterns zipf:0,...] [--modes ideal,calibrated]
//!     [--drift seeds,mix] [--calls 40] [--lead 0.02] [--slack 0] [--drift-limit 1.5] [--every 1000]
//!     [--check-every 1] [--choose-calls 0]
//!
//! `--check-every K`: simulate every candidate (to know the best) on every
//! K-th call only (the other calls count in the settles and times, not in
//! the columns against the best), for long sequences at 64 GPUs.
//!
//! `--choose-calls K`: only time `sched::auto::choose` K times per cluster
//! (median, p90) and each mode's settle of one matrix, no sequences.

use std::time::Instant;

use switchyard::compiler::generate::{generate, Pattern, TrafficSpec};
use switchyard::compiler::planner::{Planner, PlannerOptions, Settle};
use switchyard::compiler::sched::auto::{auto, choose, StickyRule, CANDIDATES};
use switchyard::compiler::sched::{schedule, Algorithm, Options};
use switchyard::compiler::sim::{simulate, Network, SimOptions};
use switchyard::compiler::{Plan, Topology, TrafficMatrix};

#[path = "common/sweep.rs"]
mod sweep;
use sweep::{cluster, list, parsed, Res};

fn num<T: std::str::FromStr>(args: &[String], flag: &str, default: T) -> Res<T>
where
    T::Err: std::error::Error + 'static,
{
    match args.iter().position(|a| a == flag) {
        Some(i) => Ok(args
            .get(i + 1)
            .ok_or(format!("{flag} needs a value"))?
            .parse()?),
        None => Ok(default),
    }
}

/// One draw of `pattern` (the sweep's sizes: 1 MiB per pair, 1024 tokens per rank).
fn draw(topo: &Topology, pattern: Pattern, seed: u64) -> Res<TrafficMatrix> {
    let mut spec = TrafficSpec::new(topo.ranks(), pattern);
    spec.seed = seed;
    spec.gpus_per_node = topo.gpus_per_node();
    spec.bytes = 1 << 20;
    spec.moe.tokens_per_rank = 1024;
    Ok(generate(&spec)?)
}

/// `sum of w * m`, rounded.
fn blend(parts: &[(f64, &TrafficMatrix)]) -> TrafficMatrix {
    let n = parts[0].1.ranks();
    let mut out = TrafficMatrix::zeros(n);
    for s in 0..n {
        for d in 0..n {
            let b: f64 = parts.iter().map(|(w, m)| w * m.get(s, d) as f64).sum();
            out.set(s, d, b.round() as u64);
        }
    }
    out
}

/// Batch `t` of `calls` of a drift.
fn batch(
    topo: &Topology,
    pattern: Pattern,
    drift: &str,
    t: usize,
    calls: usize,
) -> Res<TrafficMatrix> {
    let fresh = draw(topo, pattern, 1000 + t as u64)?;
    if drift == "seeds" {
        return Ok(fresh);
    }
    let (a, b) = (draw(topo, pattern, 1)?, draw(topo, pattern, 2)?);
    let x = t as f64 / (calls.max(2) - 1) as f64;
    Ok(blend(&[
        (0.8 * (1.0 - x), &a),
        (0.8 * x, &b),
        (0.2, &fresh),
    ]))
}

fn quantile(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(((v.len() as f64 - 1.0) * q).round() as usize)
        .copied()
        .unwrap_or(f64::NAN)
}

fn sim_opts(net: Network) -> (SimOptions, Options) {
    (
        SimOptions::new(net),
        Options {
            network: net,
            ..Options::default()
        },
    )
}

/// Times `choose` `k` times on one matrix per pattern (item 1 of the
/// brief: the choice at 64 GPUs), and one `auto` with its settle.
fn time_choice(topo: &Topology, patterns: &[Pattern], modes: &[Network], k: usize) -> Res<()> {
    for &net in modes {
        let mut us = Vec::new();
        let mut settle_us = Vec::new();
        for (i, &pattern) in patterns.iter().enumerate() {
            let m = draw(topo, pattern, 7 + i as u64)?;
            for _ in 0..k {
                let t0 = Instant::now();
                let c = choose(topo, &m, net);
                us.push(t0.elapsed().as_secs_f64() * 1e6);
                std::hint::black_box(c);
            }
            let t0 = Instant::now();
            let (_, c) = auto(topo, &m, net)?;
            if !c.simulated.is_empty() {
                settle_us.push(t0.elapsed().as_secs_f64() * 1e6);
            }
        }
        let ties = settle_us.len();
        println!(
            "{}\t{}\tchoose: median {:.1} us, p90 {:.1} us ({} calls)\tauto with its settle: median {:.0} us, max {:.0} us ({ties} ties of {})",
            topo.name(),
            net.name(),
            quantile(&mut us, 0.5),
            quantile(&mut us, 0.9),
            us.len(),
            quantile(&mut settle_us, 0.5),
            quantile(&mut settle_us, 1.0),
            patterns.len()
        );
    }
    Ok(())
}

/// What one sequence gave.
#[derive(Default)]
struct Seq {
    calls: usize,
    settles: usize,
    /// Per call: the sticky planner's time, us, and whether it settled.
    call_us: Vec<f64>,
    settled: Vec<bool>,
    /// Why each settle settled (`Resettle`, by name).
    why: std::collections::BTreeMap<String, usize>,
    /// Per call, pick over best: sticky, estimates alone, settle every tie.
    sticky: Vec<f64>,
    alone: Vec<f64>,
    always: Vec<f64>,
}

fn run_seq(
    topo: &Topology,
    pattern: Pattern,
    drift: &str,
    net: Network,
    calls: usize,
    rule: StickyRule,
    check_every: usize,
) -> Res<Seq> {
    let (sim, opts) = sim_opts(net);
    let mut planner = Planner::auto(topo, PlannerOptions::for_network(net), net)?
        .with_settle(Settle::Sticky(rule));
    let mut plan = Plan::new("", 0, 0);
    let mut out = Seq::default();
    for t in 0..calls {
        let m = batch(topo, pattern, drift, t, calls)?;
        let t0 = Instant::now();
        planner.plan_into(&m, &mut plan)?;
        out.call_us.push(t0.elapsed().as_secs_f64() * 1e6);
        let choice = planner.last_choice().ok_or("auto made no choice")?.clone();
        if plan.algorithm != choice.chosen {
            return Err(format!("plan {} but choice {}", plan.algorithm, choice.chosen).into());
        }
        out.calls += 1;
        out.settled.push(!choice.simulated.is_empty());
        if !choice.simulated.is_empty() {
            out.settles += 1;
            let why = planner.sticky().last_resettle();
            *out.why.entry(format!("{why:?}")).or_default() += 1;
        }
        if t % check_every.max(1) != 0 {
            continue;
        }
        // Every candidate, simulated: the best, and the other policies' picks.
        let times: Vec<(Algorithm, f64)> = CANDIDATES
            .iter()
            .map(|&a| {
                let p = schedule(a, topo, &m, &opts)?;
                Ok((a, simulate(topo, &p, &sim)?.completion_us))
            })
            .collect::<Res<_>>()?;
        let time = |a: Algorithm| times.iter().find(|x| x.0 == a).map_or(f64::NAN, |x| x.1);
        let best = times.iter().map(|x| x.1).fold(f64::INFINITY, f64::min);
        let mut alone = choose(topo, &m, net);
        out.alone.push(time(alone.algorithm()) / best);
        alone.settle(|a| Ok(time(a)))?;
        out.always.push(time(alone.algorithm()) / best);
        out.sticky.push(time(choice.algorithm()) / best);
    }
    Ok(out)
}

/// Mean us per call, and the median of the kept calls and of the settles.
fn call_times(s: &Seq) -> (f64, f64, f64) {
    let mean = s.call_us.iter().sum::<f64>() / s.calls.max(1) as f64;
    let mut split = [Vec::new(), Vec::new()];
    for (&u, &settled) in s.call_us.iter().zip(&s.settled) {
        split[usize::from(settled)].push(u);
    }
    let [mut kept, mut settles] = split;
    (mean, quantile(&mut kept, 0.5), quantile(&mut settles, 0.5))
}

fn over(v: &[f64]) -> (usize, f64) {
    (
        v.iter().filter(|&&r| r > 1.01).count(),
        v.iter().copied().fold(1.0, f64::max),
    )
}

fn main() -> Res<()> {
    switchyard::restore_sigpipe();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let nodes: Vec<usize> = parsed(&args, "--nodes", "2,4,8")?;
    let presets = list(&args, "--presets", "dgx-h100");
    let fabrics = list(&args, "--fabrics", "full,fat-tree,rail");
    let patterns: Vec<Pattern> = parsed(
        &args,
        "--patterns",
        "zipf:0,zipf:0.5,zipf:1.0,zipf:1.5,lognormal:1.0,hotspot:0.3,intra-skew:1.2",
    )?;
    let modes: Vec<Network> = parsed(&args, "--modes", "ideal,calibrated")?;
    let drifts = list(&args, "--drift", "seeds,mix");
    if let Some(d) = drifts
        .iter()
        .find(|d| !["seeds", "mix"].contains(&d.as_str()))
    {
        return Err(format!("unknown drift {d} (seeds, mix)").into());
    }
    let calls: usize = num(&args, "--calls", 40)?;
    let defaults = StickyRule::default();
    let rule = StickyRule {
        lead: num(&args, "--lead", defaults.lead)?,
        slack: num(&args, "--slack", defaults.slack)?,
        drift: num(&args, "--drift-limit", defaults.drift)?,
        calls: num(&args, "--every", defaults.calls)?,
    };
    let choose_calls: usize = num(&args, "--choose-calls", 0)?;
    let check_every: usize = num(&args, "--check-every", 1)?;
    if choose_calls > 0 {
        for preset in &presets {
            for fabric in &fabrics {
                for &n in &nodes {
                    time_choice(
                        &cluster(preset, n, fabric)?,
                        &patterns,
                        &modes,
                        choose_calls,
                    )?;
                }
            }
        }
        return Ok(());
    }
    println!("rule: {rule:?}");
    println!("cluster\tpattern\tdrift\tmode\tcalls\tsettles\tmean us/call\tmedian kept-call us\tsticky >1.01 (worst)\testimates alone >1.01 (worst)\tsettle-every-tie >1.01 (worst)");
    // Per mode: (calls, settles, time, sticky, alone, always).
    let mut total: Vec<(Network, Seq)> = modes.iter().map(|&m| (m, Seq::default())).collect();
    for preset in &presets {
        for fabric in &fabrics {
            for &n in &nodes {
                let topo = cluster(preset, n, fabric)?;
                for &pattern in &patterns {
                    for drift in &drifts {
                        for (net, sum) in total.iter_mut() {
                            let s = run_seq(&topo, pattern, drift, *net, calls, rule, check_every)?;
                            let (mean, kept, _) = call_times(&s);
                            let (a, b, c) = (over(&s.sticky), over(&s.alone), over(&s.always));
                            println!(
                                "{}\t{pattern:?}\t{drift}\t{}\t{}\t{}\t{mean:.0}\t{:.0}\t{} ({:.3})\t{} ({:.3})\t{} ({:.3})",
                                topo.name(),
                                net.name(),
                                s.calls,
                                s.settles,
                                kept,
                                a.0,
                                a.1,
                                b.0,
                                b.1,
                                c.0,
                                c.1
                            );
                            sum.calls += s.calls;
                            sum.settles += s.settles;
                            sum.call_us.extend(s.call_us);
                            sum.settled.extend(s.settled);
                            for (k, v) in s.why {
                                *sum.why.entry(k).or_default() += v;
                            }
                            sum.sticky.extend(s.sticky);
                            sum.alone.extend(s.alone);
                            sum.always.extend(s.always);
                        }
                    }
                }
            }
        }
    }
    println!();
    for (net, s) in total {
        let (mean, kept, settle) = call_times(&s);
        let (a, b, c) = (over(&s.sticky), over(&s.alone), over(&s.always));
        println!(
            "{}: {} calls, {} settles ({:.1}%), mean {mean:.0} us per call (kept calls median {kept:.0} us, settles median {settle:.0} us); above 1.01 of the best: sticky {} (worst {:.3}), estimates alone {} (worst {:.3}), settle every tie {} (worst {:.3})",
            net.name(),
            s.calls,
            s.settles,
            100.0 * s.settles as f64 / s.calls.max(1) as f64,
            a.0,
            a.1,
            b.0,
            b.1,
            c.0,
            c.1
        );
        println!("  why settled: {:?}", s.why);
    }
    Ok(())
}
