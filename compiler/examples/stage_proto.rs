//! Issue 25: a cheaper node-stage decomposition, prototyped on the node
//! matrix alone, against today's (the stages `fast` plans with).
//!
//! Today's decomposition (stages.rs) completes every stage's matching by
//! Kuhn's augmenting searches, which dominate its cost at 512 nodes. The
//! prototype here drops them: each free row takes its heaviest free
//! column of at least θ, else its heaviest free positive column (of real
//! bytes plus padding), else idles; the rest as today (warm start from the
//! previous stage's matching, `w = max(min matched, θ)`, the same padding
//! and θ = ⌈M / (4 (N − 1))⌉). Stages stay partial permutations.
//!
//! A second candidate, the rotation: stage `k` (1 to N − 1) is every node
//! `a` sending node `(a + k) mod N` its whole pair: O(N²) for the node
//! matrix, O(N) for one node's stages, no search at all.
//!
//! Quality proxy: the sum over stages of the stage's largest pair (real
//! bytes), over the largest row or column sum of the node matrix (1 is a
//! perfect decomposition; lower is better).
//!
//! `cargo run --release --example stage_proto -- [nodes...] [--reps K]`
//!
//! Prints per case: stages and proxy of today's (`Planner::stages` after a
//! rank's program) and of the prototype, and the prototype's time.

use std::time::Instant;

use switchyard_compiler::generate::{generate, Pattern, TrafficSpec};
use switchyard_compiler::planner::{Planner, PlannerOptions};
use switchyard_compiler::rank::{LocalProgram, LocalTraffic};
use switchyard_compiler::{Algorithm, Topology};

/// Largest row or column sum of the off-diagonal `n x n` matrix `t`.
fn max_line(n: usize, t: &[u64]) -> u64 {
    let mut best = 0;
    for a in 0..n {
        let row: u64 = (0..n).filter(|&b| b != a).map(|b| t[a * n + b]).sum();
        let col: u64 = (0..n).filter(|&b| b != a).map(|b| t[b * n + a]).sum();
        best = best.max(row).max(col);
    }
    best
}

/// Sum over stages of the largest pair, from (stage, bytes) pairs.
fn stage_time(pairs: impl Iterator<Item = (u32, u64)>) -> u64 {
    let mut dur: Vec<u64> = Vec::new();
    for (s, b) in pairs {
        let s = s as usize;
        if dur.len() <= s {
            dur.resize(s + 1, 0);
        }
        dur[s] = dur[s].max(b);
    }
    dur.iter().sum()
}

/// The greedy prototype: (stage, src, dst, real bytes) and the stage count.
#[inline(never)]
fn proto_decompose(n: usize, t: &[u64], per: f64) -> (Vec<(u32, u32, u32, u64)>, u32) {
    const NONE: usize = usize::MAX;
    let mut real = t.to_vec();
    for a in 0..n {
        real[a * n + a] = 0;
    }
    let mut real_left: u64 = real.iter().sum();
    let mut out = Vec::new();
    if real_left == 0 {
        return (out, 0);
    }
    // Padding as today: the diagonal first, then the north-west corner.
    let mut pad = vec![0u64; n * n];
    let mut row_def: Vec<u64> = (0..n)
        .map(|a| real[a * n..(a + 1) * n].iter().sum())
        .collect();
    let mut col_def: Vec<u64> = (0..n)
        .map(|b| (0..n).map(|a| real[a * n + b]).sum())
        .collect();
    let m = row_def.iter().chain(&col_def).copied().max().unwrap_or(0);
    for a in 0..n {
        row_def[a] = m - row_def[a];
        col_def[a] = m - col_def[a];
        let d = row_def[a].min(col_def[a]);
        pad[a * n + a] = d;
        row_def[a] -= d;
        col_def[a] -= d;
    }
    let (mut a, mut b) = (0, 0);
    while a < n && b < n {
        let x = row_def[a].min(col_def[b]);
        pad[a * n + b] += x;
        row_def[a] -= x;
        col_def[b] -= x;
        if row_def[a] == 0 {
            a += 1;
        } else {
            b += 1;
        }
    }
    let theta = ((m as f64 / per).ceil() as u64).max(1);
    let (mut mr, mut mc) = (vec![NONE; n], vec![NONE; n]);
    let mut stage = 0u32;
    while real_left > 0 {
        for a in 0..n {
            if mr[a] != NONE {
                continue;
            }
            let (mut best, mut best_big) = ((0, NONE), (0, NONE));
            for b in 0..n {
                if mc[b] != NONE {
                    continue;
                }
                let x = real[a * n + b] + pad[a * n + b];
                if x > best.0 {
                    best = (x, b);
                }
                if x >= theta && x > best_big.0 {
                    best_big = (x, b);
                }
            }
            let b = if best_big.1 != NONE {
                best_big.1
            } else {
                best.1
            };
            if b != NONE {
                mr[a] = b;
                mc[b] = a;
            }
        }
        let w = (0..n)
            .filter(|&a| mr[a] != NONE)
            .map(|a| real[a * n + mr[a]] + pad[a * n + mr[a]])
            .min()
            .unwrap_or(u64::MAX)
            .max(theta);
        let mut any = false;
        for (a, row_match) in mr.iter_mut().enumerate() {
            let b = *row_match;
            if b == NONE {
                continue;
            }
            let i = a * n + b;
            let r = real[i].min(w);
            real[i] -= r;
            pad[i] -= pad[i].min(w - r);
            real_left -= r;
            if real[i] + pad[i] == 0 {
                *row_match = NONE;
                mc[b] = NONE;
            }
            if r > 0 {
                any = true;
                out.push((stage, a as u32, b as u32, r));
            }
        }
        stage += u32::from(any);
    }
    (out, stage)
}

/// The rotation's proxy numerator: the sum over `k` of the largest pair
/// `(a, a + k mod N)`.
#[inline(never)]
fn rotation_time(n: usize, t: &[u64]) -> u64 {
    (1..n)
        .map(|k| (0..n).map(|a| t[a * n + (a + k) % n]).max().unwrap_or(0))
        .sum()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut nodes = Vec::new();
    let mut reps = 5usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--reps" => reps = args.next().ok_or("--reps K")?.parse()?,
            _ => nodes.push(a.parse::<usize>()?),
        }
    }
    if nodes.is_empty() {
        nodes = vec![16, 32, 128];
    }
    for &nn in &nodes {
        let topo = Topology::preset("dgx-h100", nn, None)?;
        let n = topo.ranks();
        for (pattern, name) in [
            (Pattern::Zipf(1.0), "zipf1.0"),
            (Pattern::Lognormal(1.0), "lognormal1.0"),
        ] {
            let mut spec = TrafficSpec::new(n, pattern);
            spec.seed = 1;
            let traffic = generate(&spec)?;
            let local = LocalTraffic::from_matrix(&traffic, n / 2, &topo)?;
            let t = &local.node_bytes;
            let line = max_line(nn, t).max(1) as f64;
            let mut planner =
                Planner::for_algorithm(&topo, Algorithm::Fast, PlannerOptions::default())?;
            let mut prog = LocalProgram::default();
            planner.program_local_into(&local, &mut prog)?;
            let today = planner.stages();
            let today_stages = today.iter().map(|p| p.stage + 1).max().unwrap_or(0);
            let today_proxy = stage_time(today.iter().map(|p| (p.stage, p.bytes))) as f64 / line;
            // Today's θ: M / (stages_per_node (N - 1)), M the padded line.
            let per = PlannerOptions::default().stages_per_node * (nn - 1).max(1) as f64;
            let mut times = Vec::new();
            let mut proto = (Vec::new(), 0);
            for _ in 0..reps.max(1) {
                let t0 = Instant::now();
                proto = proto_decompose(nn, t, per);
                times.push(t0.elapsed().as_secs_f64());
            }
            times.sort_by(f64::total_cmp);
            let proxy = stage_time(proto.0.iter().map(|p| (p.0, p.3))) as f64 / line;
            let t0 = Instant::now();
            let rotation = rotation_time(nn, t) as f64 / line;
            let rotation_ms = t0.elapsed().as_secs_f64() * 1e3;
            println!(
                "{nn} nodes {name}: today {today_stages} stages, proxy {today_proxy:.3}; \
                 greedy {} stages, proxy {proxy:.3}, {:.3} ms; \
                 rotation {} stages, proxy {rotation:.3}, {rotation_ms:.3} ms",
                proto.1,
                times[times.len() / 2] * 1e3,
                nn - 1,
            );
        }
    }
    Ok(())
}
