//! Synthesis time of the per-batch Planner (issue 4 targets: 8x8 <= 40 us,
//! 16x8 <= 200 us, 32x8 <= 1 ms, 64x8 <= 10 ms), on MoE zipf s=1.0 traffic
//! over dgx-h100 clusters. One `plan_into` per iteration, buffers reused, as
//! a training loop calls it. `store_only` is the floor under it: storing as
//! many transfers as the `fast` plan has into a reused buffer, nothing
//! computed. `fast-lognormal-64KB` plans a decode-size exchange (log-normal
//! traffic, 64 KB per pair), whose byte-counted pipeline windows cost more
//! per send.
//!
//! `fast-intraskew` and `fast-intraskew-fat-tree-2to1` (8x8, 16x8): one
//! intra-node-skewed matrix on full bisection (the plain decomposition) and
//! on a 2:1 fat-tree of 4 nodes per leaf (the layered stages of
//! sched/fast/leaves.rs). `fast-mi300x-intraskew` and its `-calibrated`
//! twin (8x8, 16x8): the same pattern on an MI300X mesh, planned for line
//! rate and for 3 us per message (the mesh tail search of
//! sched/fast/tail.rs runs only in the latter).
//!
//! Issue 25's figures (targets: one rank's program at 128x8 <= 1 ms, at
//! 512x8 <= 5 ms, MoE Zipf 1.0 and log-normal 1.0) are
//! `rank_local/fast-zipf1.0-inputs` and `rank_local/fast-lognormal1.0-inputs`
//! (128x8, 512x8): staged `fast` for the middle rank from what
//! `switchyard.torch.AllToAll` gathers (lane sums and stage inputs, no
//! `node_splits`: `job::JobInputs`), each iteration the rank's
//! `Planner::first_slice` then `Planner::program_local_into`, the call
//! the example `rank_hash --inputs` times (docs/benchmarks.md). The
//! other `rank_program` and `rank_local` figures are for comparison.
//!
//! `rank_program`: one rank's own program (`Planner::plan_rank_into`,
//! buffers reused) on the same traffic, from the whole matrix
//! (`LocalTraffic::from_matrix`, then the rank's own planner: `direct`,
//! `hierarchical` and staged `fast` from its `node_splits`).
//!
//! `rank_local`: the same from the rank's `LocalTraffic` alone
//! (`Planner::program_local`), the per-rank planning a job runs after its
//! gather; staged `fast` from its `node_splits` (`fast-*`), from what a job
//! gathers instead (`fast-*-inputs`, issue 25's figures), and sliced from
//! its whole plan, for comparison.
//!
//! `rank_local/auto-*-program` (128x8 only): `auto` per rank from the
//! matrix (`Planner::program`: its choice, then the chosen algorithm's own
//! program).
//!
//! `auto_choose` and `auto` (8x8 only): `auto`'s estimates alone, and
//! estimates plus the chosen plan through `Planner::auto`.
//!
//! cargo bench --workspace --bench compile
//! cargo bench --workspace --bench compile -- rank_program
//! cargo bench --workspace --bench compile -- 'rank_local/fast-.*-inputs'
//!
//! (`--workspace` keeps the workspace's feature set, so HiGHS is not built
//! again; from the root a plain `cargo bench --bench compile` finds no
//! such bench in the CLI package.)

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use switchyard_compiler::generate::{generate, Pattern, TrafficSpec};
use switchyard_compiler::job::JobInputs;
use switchyard_compiler::plan::{Buffer, Deps, Path, Transfer};
use switchyard_compiler::planner::{Planner, PlannerOptions};
use switchyard_compiler::rank::{slice_into, LocalProgram, LocalTraffic};
use switchyard_compiler::sched::auto::choose;
use switchyard_compiler::sim::Network;
use switchyard_compiler::topology::{FabricSpec, TopologySpec};
use switchyard_compiler::{Algorithm, Plan, Topology, TrafficMatrix};

fn plan_time(c: &mut Criterion) {
    let mut group = c.benchmark_group("plan_into");
    for nodes in [8usize, 16, 32, 64] {
        let topo = Topology::preset("dgx-h100", nodes, None).expect("preset");
        let mut spec = TrafficSpec::new(topo.ranks(), Pattern::Zipf(1.0));
        spec.seed = 1;
        let traffic = generate(&spec).expect("traffic");
        group.bench_with_input(
            BenchmarkId::new("direct", format!("{nodes}x8")),
            &traffic,
            |b, m| b.iter(|| switchyard_compiler::sched::direct(&topo, m)),
        );
        // `auto` at 64 GPUs (issue 20: far under a millisecond): the choice
        // alone (its estimates), and the choice plus the chosen plan.
        if nodes == 8 {
            group.bench_with_input(
                BenchmarkId::new("auto_choose", format!("{nodes}x8")),
                &traffic,
                |b, m| b.iter(|| choose(&topo, m, Network::Ideal)),
            );
            let mut planner =
                Planner::auto(&topo, PlannerOptions::default(), Network::Ideal).expect("planner");
            let mut plan = Plan::new("", 0, 0);
            group.bench_with_input(
                BenchmarkId::new("auto", format!("{nodes}x8")),
                &traffic,
                |b, m| b.iter(|| planner.plan_into(m, &mut plan).expect("plan")),
            );
        }
        for (name, staged) in [("fast", true), ("spray", false)] {
            let opts = PlannerOptions {
                staged,
                ..PlannerOptions::default()
            };
            let (mut planner, mut plan) =
                first_plan(&topo, opts, &traffic, &format!("{name} {nodes}x8"));
            group.bench_with_input(
                BenchmarkId::new(name, format!("{nodes}x8")),
                &traffic,
                |b, m| b.iter(|| planner.plan_into(m, &mut plan).expect("plan")),
            );
            // The floor under any planner that writes a plan this long:
            // storing that many transfers into a reused buffer, each made
            // from its index, nothing computed or read.
            if staged {
                let n = plan.transfers.len();
                let mut out: Vec<Transfer> = Vec::with_capacity(n);
                group.bench_with_input(
                    BenchmarkId::new("store_only", format!("{nodes}x8")),
                    &n,
                    |b, &n| b.iter(|| store_only(&mut out, n)),
                );
            }
        }
        // Planned for the calibrated network (3 us per message): larger
        // chunks, fewer sends (docs/algorithms.md, eq. 4').
        if nodes == 8 || nodes == 32 {
            let (mut planner, mut plan) = first_plan(
                &topo,
                PlannerOptions::for_network(Network::Calibrated),
                &traffic,
                &format!("fast-calibrated {nodes}x8"),
            );
            group.bench_with_input(
                BenchmarkId::new("fast-calibrated", format!("{nodes}x8")),
                &traffic,
                |b, m| b.iter(|| planner.plan_into(m, &mut plan).expect("plan")),
            );
        }
        // Decode-size exchanges (64 KB per pair on average): the chunks are
        // set by the latency bound and the pipeline windows are counted in
        // bytes (docs/algorithms.md, section 3), which costs the planner more
        // per send.
        if nodes <= 16 {
            let mut spec = TrafficSpec::new(topo.ranks(), Pattern::Lognormal(0.5));
            spec.seed = 1;
            spec.set_mean_pair_bytes(64 << 10);
            let traffic = generate(&spec).expect("traffic");
            let (mut planner, mut plan) = first_plan(
                &topo,
                PlannerOptions::default(),
                &traffic,
                &format!("fast {nodes}x8 log-normal 64 KB"),
            );
            group.bench_with_input(
                BenchmarkId::new("fast-lognormal-64KB", format!("{nodes}x8")),
                &traffic,
                |b, m| b.iter(|| planner.plan_into(m, &mut plan).expect("plan")),
            );
        }
        // Where a fat-tree's leaf uplinks bind (4 nodes per leaf, 2:1, even
        // node lines), `fast` decomposes two layers and cuts them into parts
        // (sched/fast/leaves.rs); the same matrix on full bisection takes the
        // plain decomposition.
        if nodes <= 16 {
            let mut spec = TrafficSpec::new(topo.ranks(), Pattern::IntraSkew(1.2));
            spec.seed = 1;
            let traffic = generate(&spec).expect("traffic");
            let mut fat = TopologySpec::preset("dgx-h100", nodes, None).expect("preset");
            fat.fabric = Some(FabricSpec::fat_tree(4, 2.0, 1.0));
            let fat = Topology::from_spec(fat, "fat-tree 2:1").expect("topology");
            for (name, t) in [
                ("fast-intraskew", &topo),
                ("fast-intraskew-fat-tree-2to1", &fat),
            ] {
                let (mut planner, mut plan) = first_plan(
                    t,
                    PlannerOptions::default(),
                    &traffic,
                    &format!("{name} {nodes}x8"),
                );
                group.bench_with_input(
                    BenchmarkId::new(name, format!("{nodes}x8")),
                    &traffic,
                    |b, m| b.iter(|| planner.plan_into(m, &mut plan).expect("plan")),
                );
            }
        }
        // A mesh (MI300X: xGMI, 64 GB/s per GPU pair) with intra-node skew,
        // planned for line rate and for the calibrated network (3 us per
        // message: each mesh lane slice also searches its chunk rotation,
        // sched/fast/tail.rs).
        if nodes <= 16 {
            let mesh = Topology::preset("mi300x", nodes, None).expect("preset");
            let mut spec = TrafficSpec::new(mesh.ranks(), Pattern::IntraSkew(1.2));
            spec.seed = 1;
            let traffic = generate(&spec).expect("traffic");
            for (name, opts) in [
                ("fast-mi300x-intraskew", PlannerOptions::default()),
                (
                    "fast-mi300x-intraskew-calibrated",
                    PlannerOptions::for_network(Network::Calibrated),
                ),
            ] {
                let (mut planner, mut plan) =
                    first_plan(&mesh, opts, &traffic, &format!("{name} {nodes}x8"));
                group.bench_with_input(
                    BenchmarkId::new(name, format!("{nodes}x8")),
                    &traffic,
                    |b, m| b.iter(|| planner.plan_into(m, &mut plan).expect("plan")),
                );
            }
        }
    }
    group.finish();
}

/// A planner for `topo` and its first plan of `traffic` (the cold call,
/// outside the measurement), with the plan's shape printed under `label`.
fn first_plan(
    topo: &Topology,
    opts: PlannerOptions,
    traffic: &TrafficMatrix,
    label: &str,
) -> (Planner, Plan) {
    let mut planner = Planner::fast(topo, opts).expect("planner");
    let mut plan = Plan::new("", 0, 0);
    planner.plan_into(traffic, &mut plan).expect("plan");
    eprintln!(
        "{label}: {} transfers, {} stages, depth {}, chunk {} B",
        plan.transfers.len(),
        planner.stage_count(),
        planner.pipeline_depth(),
        planner.chunk_bytes()
    );
    (planner, plan)
}

/// Stores `n` transfers into `out` (cleared, capacity kept).
fn store_only(out: &mut Vec<Transfer>, n: usize) {
    out.clear();
    for i in 0..n as u32 {
        out.push(Transfer {
            src: i & 63,
            src_buf: Buffer::Scratch,
            src_off: u64::from(i) << 12,
            dst: (i >> 6) & 63,
            dst_buf: Buffer::Output,
            dst_off: u64::from(i) * 77,
            bytes: 4096,
            path: Path::Nvlink,
            step: 3,
            deps: Deps::from_buf_and_len([i, 0, 0, 0], 1),
        });
    }
    std::hint::black_box(out);
}

fn rank_time(c: &mut Criterion) {
    let mut group = c.benchmark_group("rank_program");
    group.sample_size(10);
    for nodes in [128usize, 512] {
        let topo = Topology::preset("dgx-h100", nodes, None).expect("preset");
        // The middle rank: its column prefix reads half the matrix's rows.
        let rank = topo.ranks() / 2;
        for (pattern, name) in [
            (Pattern::Zipf(1.0), "zipf1.0"),
            (Pattern::Lognormal(1.0), "lognormal1.0"),
        ] {
            let mut spec = TrafficSpec::new(topo.ranks(), pattern);
            spec.seed = 1;
            let traffic = generate(&spec).expect("traffic");
            for alg in [Algorithm::Direct, Algorithm::Hierarchical, Algorithm::Fast] {
                let mut planner =
                    Planner::for_algorithm(&topo, alg, PlannerOptions::default()).expect("planner");
                let mut prog = LocalProgram::default();
                planner
                    .plan_rank_into(rank, &traffic, &mut prog)
                    .expect("program");
                eprintln!("{alg} {nodes}x8 {name} rank {rank}: {} ops", prog.ops.len());
                group.bench_with_input(
                    BenchmarkId::new(format!("{alg}-{name}"), format!("{nodes}x8")),
                    &traffic,
                    |b, m| b.iter(|| planner.plan_rank_into(rank, m, &mut prog).expect("program")),
                );
            }
        }
    }
    group.finish();
}

/// `Planner::program_local`: one rank's program from what the rank knows
/// (its `LocalTraffic`, built outside the measurement: from an R x R matrix
/// that is O(R^2) and the gather's job in a job, not planning's).
/// `fast-*-16B` is a latency-bound exchange (16 B per pair on average),
/// whose merged plan `fast` plans per rank; at the default sizes `fast`
/// is staged, planned per rank from the `LocalTraffic`'s node splits,
/// `fast-*-inputs` from what a job gathers instead (`JobInputs`, set up
/// outside the measurement; each iteration the rank's first slice, which
/// decomposes the node matrix, then its program: issue 25's figures), and
/// `fast-*-whole-sliced` is the same program cut from the whole plan.
fn rank_local_time(c: &mut Criterion) {
    let mut group = c.benchmark_group("rank_local");
    group.sample_size(20);
    for nodes in [128usize, 512] {
        let topo = Topology::preset("dgx-h100", nodes, None).expect("preset");
        let rank = topo.ranks() / 2;
        for (pattern, name, pair_bytes) in [
            (Pattern::Zipf(1.0), "zipf1.0", None),
            (Pattern::Lognormal(1.0), "lognormal1.0", None),
            (Pattern::Lognormal(1.0), "lognormal1.0-16B", Some(16)),
        ] {
            let mut spec = TrafficSpec::new(topo.ranks(), pattern);
            spec.seed = 1;
            if let Some(bytes) = pair_bytes {
                spec.set_mean_pair_bytes(bytes);
            }
            let traffic = generate(&spec).expect("traffic");
            let local = LocalTraffic::from_matrix(&traffic, rank, &topo).expect("local traffic");
            let algs: &[Algorithm] = if pair_bytes.is_some() {
                &[Algorithm::Fast]
            } else {
                &[
                    Algorithm::Direct,
                    Algorithm::Hierarchical,
                    Algorithm::Fast,
                    Algorithm::Pxn,
                    Algorithm::Deepep,
                ]
            };
            for &alg in algs {
                let mut planner =
                    Planner::for_algorithm(&topo, alg, PlannerOptions::default()).expect("planner");
                let mut prog = LocalProgram::default();
                if let Err(e) = planner.program_local_into(&local, &mut prog) {
                    eprintln!("{alg} {nodes}x8 {name}: {e}");
                    continue;
                }
                eprintln!("{alg} {nodes}x8 {name} rank {rank}: {} ops", prog.ops.len());
                group.bench_with_input(
                    BenchmarkId::new(format!("{alg}-{name}"), format!("{nodes}x8")),
                    &local,
                    |b, t| b.iter(|| planner.program_local_into(t, &mut prog).expect("program")),
                );
            }
            // Issue 25's figures: staged `fast` from what
            // `switchyard.torch.AllToAll` gathers (the lane sums and stage
            // inputs, no `node_splits`), each call the rank's first slice
            // then its program, as `rank_hash --inputs` times it.
            if pair_bytes.is_none() {
                let (given, own) = {
                    let mut setup =
                        Planner::for_algorithm(&topo, Algorithm::Fast, PlannerOptions::default())
                            .expect("planner");
                    let job = JobInputs::from_matrix(&mut setup, &topo, &traffic)
                        .expect("job inputs")
                        .expect("staged fast plans per rank");
                    let given = job.local(&traffic, rank, &topo).expect("local traffic");
                    (given, job.own_lens(rank).expect("lane lengths").to_vec())
                };
                let mut planner =
                    Planner::for_algorithm(&topo, Algorithm::Fast, PlannerOptions::default())
                        .expect("planner");
                let mut prog = LocalProgram::default();
                let mut call = |t: &LocalTraffic, prog: &mut LocalProgram| {
                    planner.first_slice(t, &own).expect("first slice");
                    planner.program_local_into(t, prog).expect("program")
                };
                call(&given, &mut prog);
                eprintln!(
                    "fast {nodes}x8 {name} rank {rank} from job inputs: {} ops",
                    prog.ops.len()
                );
                group.bench_with_input(
                    BenchmarkId::new(format!("fast-{name}-inputs"), format!("{nodes}x8")),
                    &given,
                    |b, t| b.iter(|| call(t, &mut prog)),
                );
            }
            // For comparison, staged `fast`'s program sliced from the whole
            // plan (128x8 only: the whole plan at 512x8 takes gigabytes).
            if nodes == 128 && pair_bytes.is_none() {
                let mut planner =
                    Planner::for_algorithm(&topo, Algorithm::Fast, PlannerOptions::default())
                        .expect("planner");
                let (mut plan, mut prog) = (Plan::new("", 0, 0), LocalProgram::default());
                group.bench_with_input(
                    BenchmarkId::new(format!("fast-{name}-whole-sliced"), format!("{nodes}x8")),
                    &traffic,
                    |b, m| {
                        b.iter(|| {
                            planner.plan_into(m, &mut plan).expect("plan");
                            slice_into(&plan, rank, &mut prog).expect("slice")
                        })
                    },
                );
                // `auto` per rank from the matrix (`Planner::program`): its
                // choice by the estimates (one pass over the matrix), the
                // rank's traffic cut out, the chosen algorithm's own program.
                let mut auto = Planner::auto(&topo, PlannerOptions::default(), Network::Ideal)
                    .expect("planner");
                let mut prog = LocalProgram::default();
                auto.plan_rank_into(rank, &traffic, &mut prog)
                    .expect("program");
                let chosen = auto
                    .last_choice()
                    .map_or("?", |c| c.chosen.as_str())
                    .to_string();
                eprintln!(
                    "auto {nodes}x8 {name} rank {rank}: {chosen}, {} ops",
                    prog.ops.len()
                );
                group.bench_with_input(
                    BenchmarkId::new(format!("auto-{name}-program"), format!("{nodes}x8")),
                    &traffic,
                    |b, m| b.iter(|| auto.plan_rank_into(rank, m, &mut prog).expect("program")),
                );
            }
        }
    }
    group.finish();
}

criterion_group!(benches, plan_time, rank_time, rank_local_time);
criterion_main!(benches);
