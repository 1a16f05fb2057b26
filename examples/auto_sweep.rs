//! The acceptance sweep of `auto` (docs/benchmarks.md, "auto"): near-uniform
//! to heavily skewed matrices (MoE Zipf 0, 0.5, 1.0, 1.5, log-normal 1.0,
//! hotspot 0.3, intra-skew 1.2), 2 to 16 nodes, switch (dgx-h100) and mesh
//! (mi300x) nodes, full-bisection, fat-tree 2:1 and rail-optimized 2:1
//! fabrics. Every case simulates
//! every candidate of `auto` in every network mode (`--modes`), then `auto`'s own pick
//! for that mode, and prints `auto`'s completion over the best candidate's.
//! The summary gives the worst case and the median per mode, and `fast`
//! over `pxn` and `deepep` per fabric and node count.
//!
//! cargo run --release --example auto_sweep -- [--quick] [--nodes 2,4,8,16] [--presets dgx-h100,mi300x]
//!     [--fabrics full,fat-tree,rail] [--patterns zipf:0,...]
//!     [--modes ideal,calibrated,congested,stress] [--estimates] [--seed 7]
//!     [--sim-cache FILE] [--ideal-plans]
//!
//! In each mode the candidates are the plans `auto` builds for that mode
//! (`fast` planned for its per-message cost outside `ideal`);
//! `--ideal-plans` simulates the ideal network's plans in every mode instead.
//! `--seed S`: pattern `i` is drawn with seed `S + i` (7 by default; another
//! base gives held-out matrices). `--sim-cache FILE`: the candidates'
//! simulated times are read from FILE where it has them (same cluster,
//! pattern, seed and mode) and the ones simulated are appended to it, so a
//! rerun after a change to the estimates alone prices only the estimates
//! (the plans and the simulator must be unchanged for the cache to hold);
//! after a change to one candidate's plans, remove its lines (of the modes
//! that changed) from a copy of FILE: only those are simulated again.
//!
//! One line per case and mode: cluster, pattern, mode, each candidate's
//! completion over the cut bound, auto's pick, auto / best.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::Instant;

use switchyard::compiler::bound::cut_bound;
use switchyard::compiler::generate::{generate, Pattern, TrafficSpec};
use switchyard::compiler::sched::auto::{choose, CANDIDATES};
use switchyard::compiler::sched::{schedule, Options};
use switchyard::compiler::sim::{simulate, Network, SimOptions};

#[path = "common/sweep.rs"]
mod sweep;
use sweep::{cluster, list, parsed, Res};

fn main() -> Res<()> {
    switchyard::restore_sigpipe();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    // Each candidate's estimate over the bound beside its simulated ratio
    // (`sim~est`), and, in brackets, what sets `spray`'s and `fast`'s.
    let verbose = args.iter().any(|a| a == "--estimates");
    let nodes: Vec<usize> = parsed(&args, "--nodes", if quick { "2,4" } else { "2,4,8,16" })?;
    let presets = list(&args, "--presets", "dgx-h100,mi300x");
    let fabrics = list(&args, "--fabrics", "full,fat-tree,rail");
    let patterns: Vec<Pattern> = parsed(
        &args,
        "--patterns",
        "zipf:0,zipf:0.5,zipf:1.0,zipf:1.5,lognormal:1.0,hotspot:0.3,intra-skew:1.2",
    )?;
    let modes: Vec<Network> = parsed(&args, "--modes", "ideal,calibrated,congested,stress")?;
    let seed: u64 = parsed(&args, "--seed", "7")?[0];
    // `fast` in every mode planned for the ideal network (the sweep before
    // issue 20's per-batch round) instead of for the mode, as `auto` builds it.
    let ideal_plans = args.iter().any(|a| a == "--ideal-plans");
    let cache_path = args
        .iter()
        .position(|a| a == "--sim-cache")
        .and_then(|i| args.get(i + 1))
        .cloned();
    // (cluster, pattern, seed, mode, candidate) -> simulated us.
    let mut cache: BTreeMap<String, f64> = BTreeMap::new();
    if let Some(path) = &cache_path {
        if let Ok(text) = std::fs::read_to_string(path) {
            for line in text.lines() {
                if let Some((k, v)) = line.rsplit_once('\t') {
                    cache.insert(k.to_string(), v.parse()?);
                }
            }
        }
    }
    let mut cache_out = match &cache_path {
        Some(path) => Some(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)?,
        ),
        None => None,
    };
    let names: Vec<&str> = CANDIDATES.iter().map(|a| a.name()).collect();
    println!(
        "cluster\tpattern\tmode\t{}\tauto\tauto/best",
        names.join("\t")
    );
    // (estimates alone, settled, contenders) per mode and per (mode, fabric).
    let mut slow: BTreeMap<String, Vec<(f64, f64, usize)>> = BTreeMap::new();
    let mut ties: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut vs: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    let mut choose_us = Vec::new();
    for preset in &presets {
        for fabric in &fabrics {
            for &n in &nodes {
                let topo = cluster(preset, n, fabric)?;
                for (i, pattern) in patterns.iter().enumerate() {
                    let mut spec = TrafficSpec::new(topo.ranks(), *pattern);
                    spec.seed = seed + i as u64;
                    spec.gpus_per_node = topo.gpus_per_node();
                    spec.bytes = 1 << 20;
                    spec.moe.tokens_per_rank = 1024;
                    let m = generate(&spec)?;
                    let bound = cut_bound(&topo, &m).best_us();
                    // A plan built for `net` is keyed `name@mode`.
                    let key = |net: Network, a: &str| {
                        let a = if ideal_plans || a != "fast" || net == Network::Ideal {
                            a.to_string()
                        } else {
                            format!("{a}@{}", net.name())
                        };
                        format!(
                            "{}\t{pattern:?}\t{}\t{}\t{a}",
                            topo.name(),
                            spec.seed,
                            net.name()
                        )
                    };
                    // A candidate's plan is built only where one of its modes
                    // is not in the cache, and only those modes are simulated
                    // (a change to one candidate's plans in one mode
                    // re-simulates that one alone).
                    let missing: Vec<bool> = names
                        .iter()
                        .map(|a| !modes.iter().all(|&net| cache.contains_key(&key(net, a))))
                        .collect();
                    let mut build_us = vec![0.0; names.len()];
                    let mut plans = Vec::with_capacity(names.len());
                    for ((&a, us), &miss) in
                        CANDIDATES.iter().zip(build_us.iter_mut()).zip(&missing)
                    {
                        plans.push(if miss {
                            let t0 = Instant::now();
                            let p = schedule(a, &topo, &m, &Options::default())?;
                            *us = t0.elapsed().as_secs_f64() * 1e6;
                            Some(p)
                        } else {
                            None
                        });
                    }
                    for &net in &modes {
                        let opts = SimOptions::new(net);
                        let mut sim_us = vec![0.0; names.len()];
                        let mut times: Vec<f64> = Vec::with_capacity(plans.len());
                        for (((p, us), a), alg) in plans
                            .iter()
                            .zip(sim_us.iter_mut())
                            .zip(&names)
                            .zip(CANDIDATES)
                        {
                            let (Some(p), None) = (p, cache.get(&key(net, a))) else {
                                times.push(cache[&key(net, a)]);
                                continue;
                            };
                            // `fast` as `auto` builds it: planned for the mode.
                            let own = if ideal_plans || *a != "fast" || net == Network::Ideal {
                                None
                            } else {
                                let o = Options {
                                    network: net,
                                    ..Options::default()
                                };
                                Some(schedule(*alg, &topo, &m, &o)?)
                            };
                            let t0 = Instant::now();
                            let r =
                                simulate(&topo, own.as_ref().unwrap_or(p), &opts)?.completion_us;
                            *us = t0.elapsed().as_secs_f64() * 1e6;
                            if let Some(f) = cache_out.as_mut() {
                                writeln!(f, "{}\t{r}", key(net, a))?;
                            }
                            times.push(r);
                        }
                        let t0 = Instant::now();
                        let mut pick = choose(&topo, &m, net);
                        choose_us.push(t0.elapsed().as_secs_f64() * 1e6);
                        let idx = |name: &str| names.iter().position(|&x| x == name).unwrap_or(0);
                        let best = times.iter().copied().fold(f64::INFINITY, f64::min);
                        // Estimates alone (before the tie-break) ...
                        let before = times[idx(&pick.chosen)] / best;
                        // ... and settled as `auto` settles a tie: the
                        // contenders' simulated times (the same simulator
                        // and options, so the times above), and what
                        // building and simulating them cost here.
                        let contenders = pick.contenders();
                        pick.settle(|a| Ok(times[idx(a.name())]))?;
                        if contenders.len() > 1 {
                            let cost: f64 = contenders
                                .iter()
                                .map(|a| build_us[idx(a.name())] + sim_us[idx(a.name())])
                                .sum();
                            ties.entry(format!("{n} nodes")).or_default().push(cost);
                        }
                        let ratio = times[idx(&pick.chosen)] / best;
                        let key = format!("{} {fabric}", net.name());
                        slow.entry(net.name().to_string()).or_default().push((
                            before,
                            ratio,
                            contenders.len(),
                        ));
                        slow.entry(key)
                            .or_default()
                            .push((before, ratio, contenders.len()));
                        let mut cells: Vec<String> =
                            times.iter().map(|t| format!("{:.3}", t / bound)).collect();
                        if verbose {
                            for (c, name) in cells.iter_mut().zip(&names) {
                                let e = pick.estimates.iter().find(|e| e.algorithm == *name);
                                if let Some(e) = e {
                                    c.push_str(&format!("~{:.3}", e.estimate_us / bound));
                                    if *name == "spray" || *name == "fast" {
                                        c.push_str(&format!("[{}]", e.limit));
                                    }
                                }
                            }
                        }
                        println!(
                            "{}\t{pattern:?}\t{}\t{}\t{}\t{ratio:.4}\t(estimates alone {before:.4}, {} contenders)",
                            topo.name(),
                            net.name(),
                            cells.join("\t"),
                            pick.chosen,
                            contenders.len()
                        );
                        let fast = times[names.iter().position(|&x| x == "fast").unwrap_or(0)];
                        let pxn = times[names.iter().position(|&x| x == "pxn").unwrap_or(0)];
                        let dep = times[names.iter().position(|&x| x == "deepep").unwrap_or(0)];
                        vs.entry(format!("{preset} {fabric} {n} nodes {}", net.name()))
                            .or_default()
                            .push((pxn / fast, dep / fast));
                    }
                }
            }
        }
    }
    println!();
    let stats = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        let over = v.iter().filter(|&&r| r > 1.01).count();
        format!(
            "median {:.4}, worst {:.4}, {over} above 1.01",
            v[v.len() / 2],
            v.last().copied().unwrap_or(f64::NAN)
        )
    };
    for (set, v) in slow {
        let tied = v.iter().filter(|x| x.2 > 1).count();
        println!(
            "{set}: {} cases, auto / best: estimates alone {}; with the tie-break {}; {tied} ties",
            v.len(),
            stats(v.iter().map(|x| x.0).collect()),
            stats(v.iter().map(|x| x.1).collect()),
        );
    }
    for (k, mut v) in ties {
        v.sort_by(f64::total_cmp);
        println!(
            "tie-break cost (contenders' plans built and simulated), {k}: {} ties, median {:.0} us, max {:.0} us",
            v.len(),
            v[v.len() / 2],
            v.last().copied().unwrap_or(0.0)
        );
    }
    choose_us.sort_by(f64::total_cmp);
    println!(
        "choice time (estimates only): median {:.1} us, max {:.1} us",
        choose_us[choose_us.len() / 2],
        choose_us.last().copied().unwrap_or(0.0)
    );
    println!("\npxn / fast and deepep / fast (median, min over patterns):");
    for (k, v) in vs {
        let mut a: Vec<f64> = v.iter().map(|x| x.0).collect();
        let mut b: Vec<f64> = v.iter().map(|x| x.1).collect();
        a.sort_by(f64::total_cmp);
        b.sort_by(f64::total_cmp);
        println!(
            "{k}: pxn/fast median {:.3} min {:.3}; deepep/fast median {:.3} min {:.3}",
            a[a.len() / 2],
            a[0],
            b[b.len() / 2],
            b[0]
        );
    }
    Ok(())
}
