//! One rank's staged `fast` program (`Planner::program_local_into`) on a
//! DGX-H100 cluster with `generate` seed 1: a hash of every op and
//! dependency of the program, the peak bytes the planner and its first
//! call allocate beyond what is live before them (a counting allocator),
//! and the time per call.
//! Issue 25 checks that its changes keep the programs byte for byte
//! (docs/benchmarks.md records the output).
//!
//! `cargo run --release -p switchyard-compiler --example rank_hash -- [nodes...] [--calls K] [--ranks middle|all3] [--pattern zipf|lognormal] [--sums | --inputs] [--callgrind]`
//!
//! `--sums`: the rank's `LocalTraffic` carries its `LaneSums`, assembled
//! (before the planner is made and timed) from every node's lanes as a job
//! would gather them (`JobInputs::lane_sums`), so the call balances only
//! its node's pairs.
//! `--inputs`: what `switchyard.torch.AllToAll` gathers for `fast`: the
//! sums and the `StageInputs` from every node's `NodeParts` and every
//! rank's first slice, without `node_splits` (`JobInputs::local`); each
//! timed call is the rank's `Planner::first_slice` (which decomposes the
//! node matrix) then its program (which reuses those stages), as the
//! criterion bench `rank_local/fast-*-inputs` measures it.
//!
//! `--callgrind`: before each case's timed calls (after its setup), asks
//! callgrind to start instrumenting (its `START_INSTRUMENTATION` client
//! request; nothing outside valgrind, x86-64 only), so a run under
//! `valgrind --tool=callgrind --instr-atstart=no` skips the setup (at
//! 512x8 `--inputs`, every node's parts and every rank's first slice:
//! minutes under instrumentation).
//!
//! Prints one line per case: nodes, pattern, rank, ops, scratch bytes,
//! hash, first-call peak allocation, median time of the calls after the
//! first.

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use switchyard_compiler::generate::{generate, Pattern, TrafficSpec};
use switchyard_compiler::job::JobInputs;
use switchyard_compiler::planner::{Planner, PlannerOptions};
use switchyard_compiler::rank::{LocalProgram, LocalTraffic};
use switchyard_compiler::{Algorithm, Topology};

/// The system allocator, counting the bytes live and their peak.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn note(add: usize, sub: usize) {
    let live = LIVE.fetch_add(add, Ordering::Relaxed) + add - sub;
    LIVE.fetch_sub(sub, Ordering::Relaxed);
    PEAK.fetch_max(live, Ordering::Relaxed);
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size(), 0);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        note(0, layout.size());
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size(), 0);
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size, layout.size());
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Callgrind's `START_INSTRUMENTATION` client request (valgrind's
/// callgrind.h: tool base `'C' 'T'` plus 4), through the x86-64 magic
/// sequence: outside valgrind the rotations come back to `rdi` and the
/// exchange of `rbx` with itself does nothing.
fn callgrind_start() {
    #[cfg(target_arch = "x86_64")]
    {
        let args: [u64; 6] = [
            ((b'C' as u64) << 24 | (b'T' as u64) << 16) + 4,
            0,
            0,
            0,
            0,
            0,
        ];
        let mut res = 0u64;
        // SAFETY: the sequence only rotates `rdi` by 128 bits in all (so
        // back to its value) and exchanges `rbx` with itself; under valgrind
        // it reads `args` and writes `rdx`, both declared.
        unsafe {
            std::arch::asm!(
                "rol rdi, 3", "rol rdi, 13", "rol rdi, 61", "rol rdi, 51", "xchg rbx, rbx",
                in("rax") args.as_ptr(),
                inout("rdx") res,
                inout("rdi") 0u64 => _,
            );
        }
        std::hint::black_box(res);
    }
}

fn program_hash(p: &LocalProgram) -> u64 {
    let mut h = DefaultHasher::new();
    (p.rank, p.ranks, p.gpus_per_node, p.scratch_bytes).hash(&mut h);
    p.algorithm.hash(&mut h);
    for op in &p.ops {
        // Every field of the op and every dependency, through its JSON.
        serde_json::to_string(op)
            .expect("an op serialises")
            .hash(&mut h);
    }
    h.finish()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut nodes = Vec::new();
    let mut calls = 3usize;
    let mut all3 = false;
    let mut only: Option<String> = None;
    let mut sums = false;
    let mut inputs = false;
    let mut callgrind = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--calls" => calls = args.next().ok_or("--calls K")?.parse()?,
            "--ranks" => all3 = args.next().ok_or("--ranks middle|all3")? == "all3",
            "--sums" => sums = true,
            "--inputs" => inputs = true,
            "--callgrind" => callgrind = true,
            "--pattern" => only = Some(args.next().ok_or("--pattern zipf|lognormal")?),
            _ => nodes.push(a.parse::<usize>()?),
        }
    }
    if nodes.is_empty() {
        nodes = vec![128, 512];
    }
    for &nn in &nodes {
        let topo = Topology::preset("dgx-h100", nn, None)?;
        let n = topo.ranks();
        let ranks = if all3 {
            vec![0, n / 2, n - 1]
        } else {
            vec![n / 2]
        };
        for (pattern, name) in [
            (Pattern::Zipf(1.0), "zipf1.0"),
            (Pattern::Lognormal(1.0), "lognormal1.0"),
        ] {
            if only.as_ref().is_some_and(|p| !name.starts_with(p.as_str())) {
                continue;
            }
            let mut spec = TrafficSpec::new(n, pattern);
            spec.seed = 1;
            let traffic = generate(&spec)?;
            // What a job gathers (before any planner is made and timed):
            // every node's parts and every rank's first slice.
            let job = if sums || inputs {
                let mut p =
                    Planner::for_algorithm(&topo, Algorithm::Fast, PlannerOptions::default())?;
                Some(
                    JobInputs::from_matrix(&mut p, &topo, &traffic)?
                        .ok_or("fast plans no staged rank on this topology")?,
                )
            } else {
                None
            };
            for &rank in &ranks {
                let mut own_lens = Vec::new();
                let local = match &job {
                    // The sums and the stage inputs, no `node_splits`.
                    Some(job) if inputs => {
                        own_lens.extend_from_slice(job.own_lens(rank)?);
                        job.local(&traffic, rank, &topo)?
                    }
                    // The sums alone, beside `node_splits`.
                    Some(job) => LocalTraffic {
                        lane_sums: Some(job.lane_sums(rank)?),
                        ..LocalTraffic::from_matrix(&traffic, rank, &topo)?
                    },
                    None => LocalTraffic::from_matrix(&traffic, rank, &topo)?,
                };
                // The planner's own buffers count (some are sized when
                // it is made).
                let base = LIVE.load(Ordering::Relaxed);
                PEAK.store(base, Ordering::Relaxed);
                let mut planner =
                    Planner::for_algorithm(&topo, Algorithm::Fast, PlannerOptions::default())?;
                let mut prog = LocalProgram::default();
                let call = |planner: &mut Planner,
                            prog: &mut LocalProgram|
                 -> Result<(), switchyard_compiler::Error> {
                    if inputs {
                        planner.first_slice(&local, &own_lens)?;
                    }
                    planner.program_local_into(&local, prog)
                };
                if callgrind {
                    callgrind_start();
                }
                let t0 = Instant::now();
                call(&mut planner, &mut prog)?;
                let first = t0.elapsed().as_secs_f64();
                let peak = PEAK.load(Ordering::Relaxed) - base;
                let mut times = Vec::new();
                for _ in 1..calls {
                    let t0 = Instant::now();
                    call(&mut planner, &mut prog)?;
                    times.push(t0.elapsed().as_secs_f64());
                }
                times.sort_by(f64::total_cmp);
                let median = times.get(times.len() / 2).copied().unwrap_or(first);
                println!(
                    "{nn}x8 {name} rank {rank}: {} ops, scratch {}, hash {:016x}, peak alloc {:.2} MB, first {:.1} ms, median {:.2} ms",
                    prog.ops.len(),
                    prog.scratch_bytes,
                    program_hash(&prog),
                    peak as f64 / 1e6,
                    first * 1e3,
                    median * 1e3,
                );
            }
        }
    }
    Ok(())
}
