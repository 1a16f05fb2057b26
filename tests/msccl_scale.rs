//! Cluster size and MSCCL files: a cluster whose GPUs talk to more peers
//! than the executor has threadblocks for is refused before any planning,
//! the peer model the refusal rests on covers every plan, and a 16 x 8
//! cluster lowers by packing a send and a receive list per threadblock
//! (docs/msccl.md, "Cluster size"). Bigger clusters: `--ignored` tests and
//! the commands in docs/benchmarks.md.

use std::time::Instant;

use switchyard::compiler::generate::{generate, Pattern, TrafficSpec};
use switchyard::compiler::msccl::fit::{
    check_before_planning, fitting, lp_rail_aligned, lp_rail_aligned_for_lanes, Peers,
};
use switchyard::compiler::msccl::{check_executable, to_xml, Executor, XmlOptions};
use switchyard::compiler::sched::{schedule, Options};
use switchyard::compiler::{verify_on, Algorithm, Topology, TrafficMatrix};

fn skewed(topo: &Topology, seed: u64, pattern: Pattern) -> TrafficMatrix {
    let mut spec = TrafficSpec::new(topo.ranks(), pattern);
    spec.seed = seed;
    spec.bytes = 64 << 10;
    spec.moe.tokens_per_rank = 256;
    generate(&spec).unwrap()
}

#[test]
fn a_cluster_too_large_is_refused_before_planning() {
    // 64 x 8: no plan is made, only the peer model is counted.
    let topo = Topology::preset("dgx-h100", 64, None).unwrap();
    let m = TrafficMatrix::uniform(topo.ranks(), 4096);
    let t0 = Instant::now();
    for (alg, executor, need) in [
        (Algorithm::Direct, Executor::Msccl, 511),
        (Algorithm::Pairwise, Executor::Rccl, 511),
        (Algorithm::Hierarchical, Executor::Rccl, 77),
        (Algorithm::Fast, Executor::Rccl, 77),
    ] {
        let e = check_before_planning(alg, &topo, &m, executor)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!("needs at least {need} threadblocks")),
            "{alg} {executor}: {e}"
        );
        assert!(
            e.contains(&format!(
                "{executor} loads at most {}",
                executor.max_tbs_per_gpu()
            )),
            "{e}"
        );
        // What fits instead: the rail-aligned schedulers with NCCL-MSCCL.
        if executor == Executor::Msccl {
            assert!(
                e.contains("Fits this cluster with msccl: hierarchical, fast"),
                "{e}"
            );
        } else {
            assert!(e.contains("Fits this cluster with rccl: none"), "{e}");
        }
    }
    // The rail-aligned ones fit NCCL-MSCCL's 128 at this size.
    for alg in [Algorithm::Hierarchical, Algorithm::Fast, Algorithm::Deepep] {
        check_before_planning(alg, &topo, &m, Executor::Msccl).unwrap();
    }
    assert!(fitting(&topo, &m, Executor::Rccl).is_empty());
    let took = t0.elapsed().as_secs_f64();
    assert!(took < 3.0, "the refusals took {took:.2} s");
}

#[test]
fn lp_that_cannot_fit_or_solve_in_seconds_is_refused_before_solving() {
    // `lp` may relay through any GPU, so only its rail-aligned routes
    // bound its peers before the solve: 1 + 69 on 70 nodes of 2 GPUs
    // (71 tbs), more than RCCL's 64 (NCCL-MSCCL's 128 hold them, and that LP
    // is small); and its LP at 64 x 8 (1.57 M variables), like 32 x 8's,
    // is far past what solves in seconds. Nothing is built or solved.
    let t0 = Instant::now();
    for (nodes, gpus, executor, why) in [
        (70, 2, Executor::Rccl, "needs at least 71 threadblocks"),
        (64, 8, Executor::Rccl, "1571841 variables"),
        (64, 8, Executor::Msccl, "1571841 variables"),
        (32, 8, Executor::Rccl, "392705 variables"),
        (32, 8, Executor::Msccl, "392705 variables"),
    ] {
        let topo = Topology::preset("dgx-h100", nodes, Some(gpus)).unwrap();
        let m = TrafficMatrix::uniform(topo.ranks(), 4096);
        let e = check_before_planning(Algorithm::Lp, &topo, &m, executor)
            .unwrap_err()
            .to_string();
        assert!(e.contains(why), "{nodes}x{gpus} {executor}: {e}");
        assert!(
            e.contains(&format!("Fits this cluster with {executor}:")),
            "{e}"
        );
        assert_eq!(
            e,
            lp_rail_aligned(&topo, &m, executor)
                .unwrap_err()
                .to_string()
        );
    }
    let topo = Topology::preset("dgx-h100", 70, Some(2)).unwrap();
    let m = TrafficMatrix::uniform(topo.ranks(), 4096);
    assert!(lp_rail_aligned(&topo, &m, Executor::Msccl).unwrap());
    // 16 x 8: every peer fits NCCL-MSCCL's 128 (any route); RCCL's 64
    // only rail to rail, whose LP is small enough.
    let topo = Topology::preset("dgx-h100", 16, None).unwrap();
    let m = TrafficMatrix::uniform(topo.ranks(), 4096);
    assert!(!lp_rail_aligned(&topo, &m, Executor::Msccl).unwrap());
    assert!(lp_rail_aligned(&topo, &m, Executor::Rccl).unwrap());
    let took = t0.elapsed().as_secs_f64();
    assert!(took < 5.0, "the refusals took {took:.2} s");
}

#[test]
fn lp_past_every_peer_fits_rail_to_rail() {
    // 9 x 8 for RCCL: a plan with any routes may talk to 71 peers, more
    // than its 64 tbs; rail to rail it talks to 7 + 8, and its file loads.
    let topo = Topology::preset("dgx-h100", 9, None).unwrap();
    let m = skewed(&topo, 5, Pattern::Moe);
    assert!(!lp_rail_aligned(&topo, &m, Executor::Msccl).unwrap());
    assert!(lp_rail_aligned(&topo, &m, Executor::Rccl).unwrap());
    let sched = Options {
        time_limit_s: 60.0,
        lp_rail_aligned: true,
        ..Options::for_msccl(Executor::Rccl.plan_lanes_per_gpu())
    };
    let plan = schedule(Algorithm::Lp, &topo, &m, &sched).unwrap();
    verify_on(&plan, &m, &topo).unwrap();
    let model = Peers::lp_rail_aligned(&topo, &m);
    let have = Peers::of_plan(&plan);
    assert!(have.conns.iter().all(|c| model.conns.contains(c)));
    assert!(
        have.tbs_needed().iter().all(|&t| t <= 16),
        "{:?}",
        have.tbs_needed()
    );
    let opts = XmlOptions {
        executor: Executor::Rccl,
        ..XmlOptions::default()
    };
    let x = to_xml(&plan, &topo, &m, &opts).unwrap();
    assert!(Executor::Rccl.check(&x.report).is_ok());
    assert!(x.max_tbs_per_gpu <= 64, "{}", x.max_tbs_per_gpu);
    check_executable(&x.text).unwrap();
    verify_on(&x.plan, &m, &topo).unwrap();
}

#[test]
fn lp_routes_rail_to_rail_where_one_lane_per_peer_passes_the_budget() {
    use switchyard::compiler::msccl::xsim::simulate_executor;
    use switchyard::compiler::sim::{simulate, SimOptions};
    // 5 x 8 for RCCL: a plan with any routes fits its loader (39 packed
    // tbs of 64), but one lane per connection takes 79 tbs, past the
    // lowering's 64, so no connection gets a second lane: each of the
    // 39 connections is one stream whatever its plan's lanes
    // (`fit::leaves_lanes`). Rail to rail (7 + 4 peers) every inter-node
    // connection is a pair of NICs whose load the LP balanced; priced by
    // the executor's rules its file is within 3% of its plan and faster
    // than the file of the plan with any route (Zipf 1.2, 256 KiB mean
    // pair, the sweep's matrix: 291.3 us, +2.06%, against 296.3 us,
    // +3.39%; docs/benchmarks.md 2026-12-05).
    let topo = Topology::preset("dgx-h100", 5, None).unwrap();
    let mut spec = TrafficSpec::new(topo.ranks(), Pattern::Zipf(1.2));
    spec.seed = 2;
    spec.bytes = 256 << 10;
    spec.moe.tokens_per_rank = 512;
    let m = generate(&spec).unwrap();
    assert!(lp_rail_aligned_for_lanes(&topo, &m, Executor::Rccl).unwrap());
    assert!(!lp_rail_aligned(&topo, &m, Executor::Rccl).unwrap());
    let opts = XmlOptions {
        executor: Executor::Rccl,
        ..XmlOptions::default()
    };
    // The ideal network, which `lp_rail_aligned_for_lanes` is for.
    let sim = SimOptions::default();
    // (file us, plan us) of the plan routed rail to rail or not.
    let file = |rails: bool| {
        let sched = Options {
            time_limit_s: 60.0,
            lp_rail_aligned: rails,
            ..Options::for_msccl(Executor::Rccl.plan_lanes_per_gpu())
        };
        let plan = schedule(Algorithm::Lp, &topo, &m, &sched).unwrap();
        let want = simulate(&topo, &plan, &sim).unwrap().completion_us;
        let x = to_xml(&plan, &topo, &m, &opts).unwrap();
        assert!(Executor::Rccl.check(&x.report).is_ok());
        let (us, _) = simulate_executor(&x.text, "lp", &m, &topo, &sim).unwrap();
        (us, want)
    };
    let (rails, any) = (file(true), file(false));
    assert!(rails.0 <= rails.1 * 1.03, "rail to rail {rails:?}");
    assert!(rails.0 < any.0, "rail to rail {rails:?}, any route {any:?}");
}

#[test]
fn a_limit_no_chunk_fixes_is_refused_before_tracing() {
    // 138 x 8 ranks, rank s sending only to 2s + 1: two peers a gpu, but
    // 1103 ring distances, 35 channel groups of 32 peers: more than
    // NCCL-MSCCL's 32 channels whatever the chunk size. Before, `to_xml`
    // simulated and traced the plan at ten chunk sizes and then said
    // "needs more than 32 channels of 64 steps ... try a larger
    // --chunk-bytes"; now the fit check says so before any of it.
    let topo = Topology::preset("dgx-h100", 138, None).unwrap();
    let n = topo.ranks();
    let mut m = TrafficMatrix::zeros(n);
    for s in 0..n - 1 {
        m.set(s, (2 * s + 1) % n, 4096);
    }
    let e = check_before_planning(Algorithm::Direct, &topo, &m, Executor::Msccl)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("span 1103 ring distances, so its file needs at least 35 channels"),
        "{e}"
    );
    assert!(e.contains("msccl has 32 (at most 1024 distances)"), "{e}");
    assert!(e.contains("--executor rccl loads it"), "{e}");
    // `to_xml` refuses the plan itself the same way, before simulating it.
    let plan = schedule(Algorithm::Direct, &topo, &m, &Options::default()).unwrap();
    let t0 = Instant::now();
    let e = to_xml(&plan, &topo, &m, &XmlOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("needs at least 35 channels"), "{e}");
    let took = t0.elapsed().as_secs_f64();
    assert!(took < 5.0, "the refusal took {took:.2} s");
}

#[test]
fn the_peer_model_covers_every_plan() {
    // The refusal above rests on the model: no plan may talk to a peer the
    // model leaves out, or a cluster could be refused that would fit.
    for nodes in [2, 4] {
        let topo = Topology::preset("dgx-h100", nodes, None).unwrap();
        for (seed, pattern) in [(1, Pattern::Moe), (2, Pattern::Zipf(1.2))] {
            let m = skewed(&topo, seed, pattern);
            for &alg in Algorithm::ALL {
                let Some(model) = Peers::model(alg, &topo, &m) else {
                    continue;
                };
                let plan = schedule(alg, &topo, &m, &Options::default()).unwrap();
                let have = Peers::of_plan(&plan);
                for c in &have.conns {
                    assert!(
                        model.conns.contains(c),
                        "{nodes}x8 {alg}: {} -> {} is not in the model",
                        c.0,
                        c.1
                    );
                }
                let (need, model_need) = (have.tbs_needed(), model.tbs_needed());
                assert!(need.iter().zip(&model_need).all(|(a, b)| a <= b));
            }
        }
    }
}

/// Lowers `alg` on `nodes` x 8 for `executor`, checks the file and the
/// plan it encodes; returns (tbs on the busiest gpu, seconds).
fn lowers(alg: Algorithm, nodes: usize, executor: Executor) -> (usize, f64) {
    let topo = Topology::preset("dgx-h100", nodes, None).unwrap();
    let m = skewed(&topo, 5, Pattern::Moe);
    let sched = Options {
        time_limit_s: 30.0,
        ..Options::for_msccl(executor.plan_lanes_per_gpu())
    };
    let plan = schedule(alg, &topo, &m, &sched).unwrap();
    let t0 = Instant::now();
    let opts = XmlOptions {
        executor,
        ..XmlOptions::default()
    };
    let x = to_xml(&plan, &topo, &m, &opts).unwrap_or_else(|e| panic!("{alg}: {e}"));
    let took = t0.elapsed().as_secs_f64();
    assert!(executor.check(&x.report).is_ok());
    assert!(x.max_tbs_per_gpu <= executor.max_tbs_per_gpu());
    check_executable(&x.text).unwrap();
    verify_on(&x.plan, &m, &topo).unwrap();
    (x.max_tbs_per_gpu, took)
}

#[test]
fn direct_at_16x8_packs_into_nccl_msccls_threadblocks() {
    // 127 peers each way: 254 single-direction tbs, 127 packed ones.
    let (tbs, took) = lowers(Algorithm::Direct, 16, Executor::Msccl);
    assert!(tbs <= 128, "{tbs}");
    assert!(tbs >= 127, "{tbs}: one per peer at least");
    eprintln!("16x8 direct: {tbs} tbs, lowered in {took:.1} s");
}

#[test]
fn pairwise_whose_barriers_reach_more_tbs_than_a_tb_has_steps_lowers() {
    // 5 x 8, log-normal: the first operation of a late round's connection
    // waits, through the other gpus' rounds, for more tbs than a tb has
    // steps (64). This failed after ten chunk sizes with "needs more than
    // 32 channels of 64 steps" (rccl: 128); the waits the gpu's own order
    // implies are dropped now, and none of the plan's own. With rccl its
    // 79 single-direction tbs are packed into 64, which needs short tbs.
    let topo = Topology::preset("dgx-h100", 5, None).unwrap();
    let mut spec = TrafficSpec::new(topo.ranks(), Pattern::Lognormal(1.0));
    spec.seed = 3;
    spec.bytes = 64 << 10;
    let m = generate(&spec).unwrap();
    let plan = schedule(Algorithm::Pairwise, &topo, &m, &Options::default()).unwrap();
    for executor in Executor::ALL {
        let opts = XmlOptions {
            executor,
            ..XmlOptions::default()
        };
        let x = to_xml(&plan, &topo, &m, &opts).unwrap_or_else(|e| panic!("{executor}: {e}"));
        assert!(executor.check(&x.report).is_ok());
        assert_eq!(x.dropped_deps, 0, "{executor}");
        if executor == Executor::Rccl {
            assert_eq!(x.max_tbs_per_gpu, 64);
            // A step waits for a few tbs, not one per earlier round.
            assert!(x.max_steps_per_tb <= 16, "{}", x.max_steps_per_tb);
        }
        check_executable(&x.text).unwrap();
        verify_on(&x.plan, &m, &topo).unwrap();
    }
}

#[test]
#[ignore = "a minute in the dev profile; run with --release"]
fn pairwise_at_16x8_packs_into_nccl_msccls_threadblocks() {
    // 127 peers each way and barriers reaching 65 tbs: refused after
    // ten chunk sizes before (docs/benchmarks.md, issue 22 item 5).
    let (tbs, took) = lowers(Algorithm::Pairwise, 16, Executor::Msccl);
    assert!(tbs <= 128, "{tbs}");
    eprintln!("16x8 pairwise: {tbs} tbs, lowered in {took:.1} s");
}

#[test]
#[ignore = "minutes in the dev profile; docs/benchmarks.md has release figures"]
fn every_algorithm_that_fits_lowers_at_16x8() {
    for executor in Executor::ALL {
        let topo = Topology::preset("dgx-h100", 16, None).unwrap();
        let m = skewed(&topo, 5, Pattern::Moe);
        let fits = fitting(&topo, &m, executor);
        for &alg in Algorithm::ALL {
            if !fits.contains(&alg) {
                continue;
            }
            let (tbs, took) = lowers(alg, 16, executor);
            eprintln!("16x8 {alg} {executor}: {tbs} tbs, lowered in {took:.1} s");
        }
    }
}
