//! The executor-rule pricing of an MSCCL file (`msccl::xsim`) on
//! hand-built files: a FIFO window of two calls holds a third call back
//! until the receiver takes the first; a wait written on a receive does not
//! hold its sender; a step moves whole chunks, padding included.

use switchyard::compiler::msccl::exec::run;
use switchyard::compiler::msccl::xsim::{calls, executor_plan};
use switchyard::compiler::msccl::{assign_paths, parse_algo, Protocol};
use switchyard::compiler::sim::{simulate, SimOptions};
use switchyard::compiler::Topology;

/// A chunk of 450 kB: 1 us on a 450 GB/s NVLink port; 4 chunks a call.
const U: u64 = 450_000;

/// The ignored sweeps' skewed matrices (docs/benchmarks.md): name, pattern
/// and matrix (seeds 1-5, or 1-5 plus `XSIM_SEED_SHIFT`; 256 KiB mean pair, 512 tokens per rank) on
/// `topo`; `XSIM_PATTERNS` (names or their prefixes, any case) narrows them.
fn sweep_matrices(
    topo: &Topology,
) -> Vec<(
    &'static str,
    switchyard::compiler::generate::Pattern,
    switchyard::compiler::TrafficMatrix,
)> {
    use switchyard::compiler::generate::Pattern;
    let only = std::env::var("XSIM_PATTERNS")
        .ok()
        .map(|v| v.to_lowercase());
    [
        ("moe", 1, Pattern::Moe),
        ("zipf", 2, Pattern::Zipf(1.2)),
        ("lognormal", 3, Pattern::Lognormal(1.0)),
        ("hotspot", 4, Pattern::Hotspot(0.3)),
        ("intraskew", 5, Pattern::IntraSkew(1.2)),
    ]
    .into_iter()
    .filter(|(name, _, _)| {
        only.as_ref()
            .is_none_or(|v| v.split(',').any(|p| name.starts_with(p)))
    })
    .map(|(name, seed, pattern)| {
        // `XSIM_SEED_SHIFT=k`: seeds k+1..k+5 (held-out matrices).
        let shift: u64 = std::env::var("XSIM_SEED_SHIFT").map_or(0, |v| v.parse().unwrap());
        (
            name,
            pattern,
            sweep_matrix(topo.ranks(), pattern, seed + shift),
        )
    })
    .collect()
}

/// The diagnostics' knobs: `XSIM_NODES` (else `default_nodes`) and
/// `XSIM_LAYOUT` (`packed`, else padded).
fn diag_shape(default_nodes: usize) -> (usize, switchyard::compiler::msccl::Layout) {
    use switchyard::compiler::msccl::Layout;
    let env = |k: &str| std::env::var(k).ok();
    let nodes = env("XSIM_NODES").map_or(default_nodes, |v| v.parse().unwrap());
    let layout = match env("XSIM_LAYOUT").as_deref() {
        Some("packed") => Layout::Packed,
        _ => Layout::Padded,
    };
    (nodes, layout)
}

/// Whether `XSIM_ALGS` (comma-separated names; unset: all) asks for `alg`.
fn diag_wants(alg: switchyard::compiler::Algorithm) -> bool {
    std::env::var("XSIM_ALGS").map_or(true, |v| v.split(',').any(|a| a == alg.name()))
}

/// The schedulers' options of the ignored sweeps: plans that fit a file's
/// lanes, `lp` cut at 20 s.
/// `fast`'s plan of the sweep's 4x8 log-normal case (the sweep's seed is
/// 3; 256 KiB mean pair) and its simulated time, for the tests of its files.
fn fast_4x8_lognormal(
    seed: u64,
) -> (
    SimOptions,
    Topology,
    switchyard::compiler::TrafficMatrix,
    switchyard::compiler::Plan,
    f64,
) {
    use switchyard::compiler::generate::Pattern;
    use switchyard::compiler::sched::schedule;
    use switchyard::compiler::Algorithm;
    let sim = SimOptions::default();
    let topo = Topology::preset("dgx-h100", 4, None).unwrap();
    let m = sweep_matrix(topo.ranks(), Pattern::Lognormal(1.0), seed);
    let plan = schedule(Algorithm::Fast, &topo, &m, &sweep_sched()).unwrap();
    let want = simulate(&topo, &plan, &sim).unwrap().completion_us;
    (sim, topo, m, plan, want)
}

/// The sweep's matrix: `pattern` over `ranks` ranks, 256 KiB mean pair,
/// 512 MoE tokens per rank, seed `seed`.
fn sweep_matrix(
    ranks: usize,
    pattern: switchyard::compiler::generate::Pattern,
    seed: u64,
) -> switchyard::compiler::TrafficMatrix {
    use switchyard::compiler::generate::{generate, TrafficSpec};
    let mut spec = TrafficSpec::new(ranks, pattern);
    spec.seed = seed;
    spec.bytes = 256 << 10;
    spec.moe.tokens_per_rank = 512;
    generate(&spec).unwrap()
}

fn sweep_sched() -> switchyard::compiler::sched::Options {
    switchyard::compiler::sched::Options {
        time_limit_s: 20.0,
        ..switchyard::compiler::sched::Options::for_msccl(
            switchyard::compiler::msccl::PLAN_LANES_PER_GPU,
        )
    }
}

/// The sweeps' executor profile: `XSIM_EXECUTOR=rccl`, else NCCL-MSCCL.
fn sweep_executor() -> switchyard::compiler::msccl::Executor {
    use switchyard::compiler::msccl::Executor;
    match std::env::var("XSIM_EXECUTOR").as_deref() {
        Ok("rccl") => Executor::Rccl,
        _ => Executor::Msccl,
    }
}

/// [`sweep_sched`] for `alg` on `m`, as `compile --out f.xml` plans it for
/// [`sweep_executor`] on the ideal network (the sweeps' `SimOptions`):
/// its lanes per gpu, and `lp` routed rail to rail where
/// `fit::lp_rail_aligned_for_lanes` says so; `XSIM_LP_ANY=1` keeps any
/// route where every peer fits (the files before 2026-12-05).
fn sweep_sched_for(
    alg: switchyard::compiler::Algorithm,
    topo: &Topology,
    m: &switchyard::compiler::TrafficMatrix,
) -> switchyard::compiler::sched::Options {
    use switchyard::compiler::msccl::fit;
    let executor = sweep_executor();
    let any = std::env::var("XSIM_LP_ANY").is_ok()
        && fit::check(
            &fit::Peers {
                conns: (0..m.ranks())
                    .flat_map(|s| (0..m.ranks()).filter(move |&d| d != s).map(move |d| (s, d)))
                    .collect(),
                local: (0..m.ranks()).map(|s| m.get(s, s) > 0).collect(),
            },
            "lp",
            topo,
            m,
            executor,
        )
        .is_ok();
    let lp_rail_aligned = alg == switchyard::compiler::Algorithm::Lp
        && !any
        && fit::lp_rail_aligned_for_lanes(topo, m, executor).unwrap();
    let base = switchyard::compiler::sched::Options::for_msccl(executor.plan_lanes_per_gpu());
    switchyard::compiler::sched::Options {
        lp_rail_aligned,
        max_lanes_per_gpu: base.max_lanes_per_gpu,
        ..sweep_sched()
    }
}

fn step(
    s: usize,
    ty: &str,
    src: u32,
    dst: u32,
    cnt: u32,
    dep: Option<(u32, u32)>,
    hasdep: bool,
) -> String {
    let (depid, deps) = dep.map_or((-1, -1), |(t, q)| (t as i64, q as i64));
    let (sb, db) = ("i", "o");
    format!(
        "      <step s=\"{s}\" type=\"{ty}\" srcbuf=\"{sb}\" srcoff=\"{src}\" dstbuf=\"{db}\" dstoff=\"{dst}\" cnt=\"{cnt}\" depid=\"{depid}\" deps=\"{deps}\" hasdep=\"{}\"/>\n",
        u8::from(hasdep)
    )
}

fn tb(id: u32, send: i32, recv: i32, steps: &[String]) -> String {
    format!(
        "    <tb id=\"{id}\" send=\"{send}\" recv=\"{recv}\" chan=\"0\">\n{}    </tb>\n",
        steps.concat()
    )
}

/// Three GPUs, three chunks per pair. GPU 0 sends its three chunks for GPU
/// 1 as three one-chunk steps (S1, S2, S3) on one connection; GPU 1's
/// receive of S1 waits for its receive of B, GPU 2's three chunks (one
/// step). Every other pair moves in one step, local blocks are copied.
fn file() -> String {
    let mut x = format!(
        "<algo name=\"switchyard hand layout=padded chunk_bytes={U} gpus_per_node=3\" proto=\"Simple\" nchannels=\"1\" nchunksperloop=\"9\" ngpus=\"3\" coll=\"alltoall\" inplace=\"0\" outofplace=\"1\" minBytes=\"0\" maxBytes=\"0\">\n"
    );
    let gpu = |g: u32, tbs: Vec<String>| {
        format!(
            "  <gpu id=\"{g}\" i_chunks=\"9\" o_chunks=\"9\" s_chunks=\"0\">\n{}  </gpu>\n",
            tbs.concat()
        )
    };
    x += &gpu(
        0,
        vec![
            tb(
                0,
                1,
                -1,
                &[
                    step(0, "s", 3, 0, 1, None, false),
                    step(1, "s", 4, 1, 1, None, false),
                    step(2, "s", 5, 2, 1, None, false),
                ],
            ),
            tb(1, 2, -1, &[step(0, "s", 6, 0, 3, None, false)]),
            tb(2, -1, 1, &[step(0, "r", 0, 3, 3, None, false)]),
            tb(3, -1, 2, &[step(0, "r", 0, 6, 3, None, false)]),
            tb(4, -1, -1, &[step(0, "cpy", 0, 0, 3, None, false)]),
        ],
    );
    x += &gpu(
        1,
        vec![
            // B: from GPU 2; S1's receive waits for it.
            tb(0, -1, 2, &[step(0, "r", 3, 6, 3, None, true)]),
            tb(
                1,
                -1,
                0,
                &[
                    step(0, "r", 3, 0, 1, Some((0, 0)), false),
                    step(1, "r", 4, 1, 1, None, false),
                    step(2, "r", 5, 2, 1, None, false),
                ],
            ),
            tb(2, 0, -1, &[step(0, "s", 0, 3, 3, None, false)]),
            tb(3, 2, -1, &[step(0, "s", 6, 3, 3, None, false)]),
            tb(4, -1, -1, &[step(0, "cpy", 3, 3, 3, None, false)]),
        ],
    );
    x += &gpu(
        2,
        vec![
            tb(0, 1, -1, &[step(0, "s", 3, 6, 3, None, false)]),
            tb(1, 0, -1, &[step(0, "s", 0, 6, 3, None, false)]),
            tb(2, -1, 0, &[step(0, "r", 6, 0, 3, None, false)]),
            tb(3, -1, 1, &[step(0, "r", 6, 3, 3, None, false)]),
            tb(4, -1, -1, &[step(0, "cpy", 6, 6, 3, None, false)]),
        ],
    );
    x + "</algo>\n"
}

#[test]
fn fifo_window_receive_waits_and_whole_chunks() {
    let text = file();
    let algo = parse_algo(&text, "hand.xml").unwrap();
    let trace = run(&algo, "hand.xml").unwrap();
    let topo = Topology::preset("dgx-h100", 1, Some(3)).unwrap();
    let mut x = executor_plan(&algo, &trace, U);
    assign_paths(&mut x.plan, &topo);
    let sim = x.simulate(&topo, &SimOptions::default()).unwrap();
    // The transfer of the operation sent by `gpu`'s tb `tb`, step `pos`.
    let op = |gpu: u32, tb: u32, pos: u32| {
        let i = trace
            .ops
            .iter()
            .position(|o| o.from.gpu == gpu && o.from.tb == tb && o.from.pos == pos)
            .unwrap();
        let t = x.op_transfer[i].unwrap() as usize;
        (&x.plan.transfers[t], sim.transfers[t])
    };
    let (s1, s1t) = op(0, 0, 0);
    let (_, s2t) = op(0, 0, 1);
    let (_, s3t) = op(0, 0, 2);
    let (b, bt) = op(2, 0, 0);
    // Whole chunks: every operation moves cnt x 450 kB.
    assert_eq!(s1.bytes, U);
    assert_eq!(b.bytes, 3 * U);
    // One call per step here (4 chunks a call): S1-S3 and five one-step
    // blocks between GPUs.
    assert_eq!(calls(Protocol::Simple, 3, U), 1);
    assert_eq!(x.calls, 3 + 5);
    // S1's receive waits for B, but S1 and S2 leave at once: a send is
    // done when staged, and a wait on a receive does not hold its sender.
    assert_eq!(s1t.start_us, 0.0);
    assert_eq!(s2t.start_us, 0.0);
    assert!(
        s2t.end_us < bt.end_us,
        "S2 arrives before B: {s2t:?} {bt:?}"
    );
    // The FIFO holds two calls: S3 waits until GPU 1 takes S1, which is
    // after B has arrived.
    assert!(
        s3t.start_us >= bt.end_us,
        "S3 {s3t:?} must wait for B {bt:?}"
    );
    // By hand: B shares GPU 2's 450 GB/s port with GPU 2's block for GPU 0
    // (both leave at once), so it gets at most 225 GB/s: it arrives no
    // earlier than 1 us latency + 3 x 450 kB / 225 GB/s = 7 us, and S3
    // (1 us latency, then its chunk) ends after 8 us. Without the window
    // S3 would have left at 0 with S1 and S2.
    assert!(bt.end_us >= 7.0 - 1e-6, "B ends at {}", bt.end_us);
    assert!(s3t.end_us >= 8.0, "S3 ends at {}", s3t.end_us);
    assert!(
        sim.completion_us >= bt.end_us + 1.0 + 1.0 - 1e-6,
        "{}",
        sim.completion_us
    );
}

/// `direct` has no waits between transfers; `hierarchical`'s are relays
/// (the waiting send's gpu received the data), which the executor holds.
/// `fast`'s pacing ("send k waits for send k-D of its gpu") is a wait on a
/// send, done when staged: the lowering counts those it writes but the
/// executor does not hold.
#[test]
fn waits_the_executor_does_not_hold_are_counted() {
    use switchyard::compiler::generate::{generate, Pattern, TrafficSpec};
    use switchyard::compiler::msccl::{to_xml, Pacing, XmlOptions};
    use switchyard::compiler::sched::{schedule, Options};
    use switchyard::compiler::Algorithm;
    let topo = Topology::preset("dgx-h100", 2, None).unwrap();
    let mut spec = TrafficSpec::new(topo.ranks(), Pattern::Lognormal(1.0));
    spec.seed = 3;
    spec.bytes = 256 << 10;
    let m = generate(&spec).unwrap();
    let unheld = |alg, pacing| {
        let plan = schedule(alg, &topo, &m, &Options::default()).unwrap();
        let opts = XmlOptions {
            pacing,
            ..XmlOptions::default()
        };
        let x = to_xml(&plan, &topo, &m, &opts).unwrap();
        (x.unheld_deps, x.pacing_steps)
    };
    assert_eq!(unheld(Algorithm::Direct, Pacing::Off), (0, 0));
    assert_eq!(unheld(Algorithm::Hierarchical, Pacing::Off), (0, 0));
    assert_eq!(unheld(Algorithm::Direct, Pacing::Cut), (0, 0));
    let (off, _) = unheld(Algorithm::Fast, Pacing::Off);
    assert!(off > 0);
    // Cut: most of them now hold (only transfers too short to cut keep
    // theirs), at the cost of the steps added.
    let (cut, steps) = unheld(Algorithm::Fast, Pacing::Cut);
    assert!(cut * 4 < off, "unheld {cut} of {off}");
    assert!(steps > 0);
}

/// The sweep recorded in docs/benchmarks.md: every algorithm's XML priced
/// by the executor's rules against its source plan, on skewed matrices for
/// 2x8, 4x8 and 8x8 DGX-H100, both layouts.
/// `cargo test --test msccl_executor executor_rule_sweep -- --ignored --nocapture`
/// (`XSIM_NODES=2,4`, `XSIM_ALGS=fast,direct`, `XSIM_PATTERNS=Lognormal,Moe`
/// and `XSIM_PROTO=Simple` narrow it or force a protocol;
/// `XSIM_CUT_ONLY=1` skips `Pacing::Off`; `XSIM_BASE_CHUNK=1` takes the chunk of the largest pair in 284 chunks,
/// the default before `msccl::chunk`; `lp` runs at 8x8 only when
/// `XSIM_ALGS` names it).
#[test]
#[ignore]
fn executor_rule_sweep() {
    use switchyard::compiler::msccl::chunk::base_chunk_bytes;
    use switchyard::compiler::msccl::depth::shallower_fast;
    use switchyard::compiler::msccl::xsim::simulate_executor;
    use switchyard::compiler::msccl::{to_xml, Layout, Pacing, XmlOptions};
    use switchyard::compiler::sched::schedule;
    use switchyard::compiler::Algorithm;
    let sim = SimOptions::default();
    let nodes: Vec<usize> = std::env::var("XSIM_NODES").ok().map_or(vec![2, 4, 8], |v| {
        v.split(',').map(|x| x.parse().unwrap()).collect()
    });
    for nodes in nodes {
        let topo = Topology::preset("dgx-h100", nodes, None).unwrap();
        for (_, pattern, m) in sweep_matrices(&topo) {
            for &alg in Algorithm::ALL {
                // `lp` at 8x8 only when `XSIM_ALGS` names it (its LP is
                // cut at 20 s per matrix).
                let algs = std::env::var("XSIM_ALGS");
                if nodes == 8 && alg == Algorithm::Lp && algs.is_err()
                    || algs.is_ok_and(|v| !v.split(',').any(|a| a == alg.name()))
                {
                    continue;
                }
                let plan = schedule(alg, &topo, &m, &sweep_sched_for(alg, &topo, &m)).unwrap();
                let want = simulate(&topo, &plan, &sim).unwrap().completion_us;
                for (pacing, layout) in [
                    (Pacing::Off, Layout::Padded),
                    (Pacing::Cut, Layout::Padded),
                    (Pacing::Off, Layout::Packed),
                    (Pacing::Cut, Layout::Packed),
                ] {
                    // `XSIM_CUT_ONLY=1`: only the default (`Pacing::Cut`).
                    if pacing == Pacing::Off && std::env::var("XSIM_CUT_ONLY").is_ok() {
                        continue;
                    }
                    let opts = XmlOptions {
                        layout,
                        pacing,
                        protocol: std::env::var("XSIM_PROTO").ok().map(|p| p.parse().unwrap()),
                        executor: sweep_executor(),
                        chunk_bytes: std::env::var("XSIM_BASE_CHUNK")
                            .is_ok()
                            .then(|| base_chunk_bytes(&m)),
                    };
                    // As `compile` writes it: `fast`'s file short of
                    // threadblocks and behind its plan priced against the
                    // plan one send shallower too, and then compared with
                    // the plan it keeps (`executor_price`'s, this plan's
                    // `want` where the file is its own).
                    let file = to_xml(&plan, &topo, &m, &opts)
                        .and_then(|x| shallower_fast(&plan, x, &topo, &m, sim.network, &opts))
                        .map(|(x, _)| x);
                    match file {
                        Ok(x) => {
                            let want = x.executor_price.map_or(want, |p| p.plan_us);
                            let (us, _) =
                                simulate_executor(&x.text, "sweep", &m, &topo, &sim).unwrap();
                            println!(
                                "{nodes}x8 {pattern:?} {alg} {layout} {pacing:?}: executor/plan {:+.2}% ({us:.1} / {want:.1} us) unheld {} handoffs {} released heads {} chunk {} B",
                                100.0 * (us / want - 1.0),
                                x.unheld_deps,
                                x.handoffs,
                                x.released_heads,
                                x.chunk_bytes
                            );
                        }
                        Err(e) => println!("{nodes}x8 {pattern:?} {alg} {layout}: {e}"),
                    }
                }
            }
        }
    }
}

/// Where a file's time goes under the executor's rules: each rule of
/// `xsim::Rules` switched back to the plan's, one at a time, for `fast`
/// and `direct` (docs/msccl.md, "Where a file's time goes").
/// `cargo test --test msccl_executor executor_rule_breakdown -- --ignored --nocapture`
/// (`XSIM_LAYOUT=padded` for the padded layout; packed by default).
#[test]
#[ignore]
fn executor_rule_breakdown() {
    use switchyard::compiler::generate::Pattern;
    use switchyard::compiler::msccl::xsim::{executor_plan_with, Rules};
    use switchyard::compiler::msccl::{to_xml, Layout, Pacing, XmlOptions};
    use switchyard::compiler::sched::schedule;
    use switchyard::compiler::Algorithm;
    let sim = SimOptions::default();
    let nodes: Vec<usize> = std::env::var("XSIM_NODES").ok().map_or(vec![2, 4], |v| {
        v.split(',').map(|x| x.parse().unwrap()).collect()
    });
    for nodes in nodes {
        let topo = Topology::preset("dgx-h100", nodes, None).unwrap();
        // `XSIM_PATTERNS`: the sweep's matrices it names instead.
        let cases: Vec<(Pattern, switchyard::compiler::TrafficMatrix)> =
            if std::env::var("XSIM_PATTERNS").is_ok() {
                sweep_matrices(&topo)
                    .into_iter()
                    .map(|(_, p, m)| (p, m))
                    .collect()
            } else {
                [
                    (2, Pattern::Zipf(1.2)),
                    (3, Pattern::Lognormal(1.0)),
                    (4, Pattern::Hotspot(0.3)),
                ]
                .into_iter()
                .map(|(seed, pattern)| (pattern, sweep_matrix(topo.ranks(), pattern, seed)))
                .collect()
            };
        for (pattern, m) in cases {
            for &alg in Algorithm::ALL {
                if std::env::var("XSIM_ALGS").is_ok_and(|v| !v.split(',').any(|a| a == alg.name()))
                {
                    continue;
                }
                let plan = schedule(alg, &topo, &m, &sweep_sched_for(alg, &topo, &m)).unwrap();
                let want = simulate(&topo, &plan, &sim).unwrap().completion_us;
                for pacing in [Pacing::Off, Pacing::Cut] {
                    let opts = XmlOptions {
                        layout: if std::env::var("XSIM_LAYOUT").is_ok_and(|l| l == "padded") {
                            Layout::Padded
                        } else {
                            Layout::Packed
                        },
                        pacing,
                        executor: sweep_executor(),
                        ..XmlOptions::default()
                    };
                    let x = to_xml(&plan, &topo, &m, &opts).unwrap();
                    let enc = simulate(&topo, &x.plan, &sim).unwrap().completion_us;
                    let algo = parse_algo(&x.text, "b").unwrap();
                    let trace = run(&algo, "b").unwrap();
                    let price =
                        |staged_sends: bool, fifo_window: bool, real: bool, streams: bool| {
                            let rules = Rules {
                                staged_sends,
                                fifo_window,
                                real_bytes: real.then_some(&m),
                                streams,
                            };
                            let mut p = executor_plan_with(&algo, &trace, x.chunk_bytes, &rules);
                            assign_paths(&mut p.plan, &topo);
                            let us = p.simulate(&topo, &sim).unwrap().completion_us;
                            format!("{:+.1}%", 100.0 * (us / want - 1.0))
                        };
                    println!(
                    "{nodes}x8 {pattern:?} {alg} {pacing:?} unheld {}: encoded {:+.1}% | plan rules {} | +whole chunks {} | +window {} | +staged sends {} | +window, staged (calls apart) {} | executor {}",
                    x.unheld_deps,
                    100.0 * (enc / want - 1.0),
                    price(false, false, true, false),
                    price(false, false, false, false),
                    price(false, true, false, false),
                    price(true, false, false, false),
                    price(true, true, false, false),
                    price(true, true, false, true),
                );
                }
            }
        }
    }
}

/// Issue 22 item 2: with its pacing cut into the file (`Pacing::Cut`, the
/// default), `fast`'s XML priced by the executor's rules is within 3% of
/// its plan on these skewed 2x8 and 4x8 cases; written whole
/// (`Pacing::Off`) it is not on every one of them (the test can fail).
/// The 2x8 log-normal packed file is LL128 by size, whose 8-call window
/// leaves 73 waits unheld; it is written with Simple (13 unheld). 2x8
/// intra-skew padded (+5.5% before) and 4x8 MoE and Zipf padded (+4.0%,
/// +3.0%) hold since a tail's latency is off the receiving chain, heads
/// leave before their sending chain's wait and input runs go out as one
/// send (`msccl::gather`). 2x8 hotspot padded, which this list held
/// before, now runs 4.5% *faster* than its plan, as the packed file did
/// already. 4x8 intra-skew (+7.2% / +3.2% before), 4x8 hotspot padded
/// (+3.7%) and 2x8 intra-skew packed (+3.4%) hold since gathering copies
/// run first on their gpu's local tb and a cut piece (head, body, tail)
/// waits only for the data it reads (`own_data` in `msccl/lower/cuts.rs`).
/// Cases that miss 3% are listed in docs/benchmarks.md.
const PACED_CASES: [(
    usize,
    u64,
    switchyard::compiler::generate::Pattern,
    switchyard::compiler::msccl::Layout,
); 13] = {
    use switchyard::compiler::generate::Pattern;
    use switchyard::compiler::msccl::Layout;
    [
        (2, 1, Pattern::Moe, Layout::Padded),
        (2, 2, Pattern::Zipf(1.2), Layout::Packed),
        (2, 3, Pattern::Lognormal(1.0), Layout::Padded),
        (2, 3, Pattern::Lognormal(1.0), Layout::Packed),
        (2, 5, Pattern::IntraSkew(1.2), Layout::Padded),
        (2, 5, Pattern::IntraSkew(1.2), Layout::Packed),
        (4, 1, Pattern::Moe, Layout::Padded),
        (4, 2, Pattern::Zipf(1.2), Layout::Padded),
        (4, 2, Pattern::Zipf(1.2), Layout::Packed),
        (4, 4, Pattern::Hotspot(0.3), Layout::Padded),
        (4, 4, Pattern::Hotspot(0.3), Layout::Packed),
        (4, 5, Pattern::IntraSkew(1.2), Layout::Padded),
        (4, 5, Pattern::IntraSkew(1.2), Layout::Packed),
    ]
};

/// The diagnosis' critical path: from transfer `t`, each transfer and the
/// dependency of `pt[t]` that ends last, back to one with none (`times`:
/// a simulation of `pt`).
fn print_path(
    pt: &[switchyard::compiler::plan::Transfer],
    times: &[switchyard::compiler::sim::TransferTime],
    mut t: usize,
) {
    loop {
        let tt = times[t];
        println!(
            "    {:>8.1}..{:>8.1} t{t} g{}->g{} {} B {:?}[{}] -> {:?}[{}]",
            tt.start_us,
            tt.end_us,
            pt[t].src,
            pt[t].dst,
            pt[t].bytes,
            pt[t].src_buf,
            pt[t].src_off,
            pt[t].dst_buf,
            pt[t].dst_off
        );
        let Some(&d) = pt[t].deps.iter().max_by(|&&a, &&b| {
            times[a as usize]
                .end_us
                .total_cmp(&times[b as usize].end_us)
        }) else {
            break;
        };
        t = d as usize;
    }
}

/// The executor-rule completion of `alg`'s file over its plan's, on the
/// sweep's matrix `(seed, pattern)` for `nodes` x 8 DGX-H100.
fn executor_over_plan(
    nodes: usize,
    seed: u64,
    pattern: switchyard::compiler::generate::Pattern,
    alg: switchyard::compiler::Algorithm,
    opts: &switchyard::compiler::msccl::XmlOptions,
) -> f64 {
    use switchyard::compiler::msccl::to_xml;
    use switchyard::compiler::msccl::xsim::simulate_executor;
    use switchyard::compiler::sched::{schedule, Options};
    let sim = SimOptions::default();
    let topo = Topology::preset("dgx-h100", nodes, None).unwrap();
    let m = sweep_matrix(topo.ranks(), pattern, seed);
    let plan = schedule(alg, &topo, &m, &Options::default()).unwrap();
    let want = simulate(&topo, &plan, &sim).unwrap().completion_us;
    let x = to_xml(&plan, &topo, &m, opts).unwrap();
    let (us, _) = simulate_executor(&x.text, "case", &m, &topo, &sim).unwrap();
    us / want
}

/// `r`, a file's executor-rule completion over its plan's (`what` names
/// the case), is within 3%.
fn assert_as_planned(r: f64, what: impl std::fmt::Display) {
    assert!((0.97..=1.03).contains(&r), "{what}: executor/plan {r:.4}");
}

/// The `rccl` executor's limits (64 threadblocks a gpu), the rest default.
fn rccl() -> switchyard::compiler::msccl::XmlOptions {
    switchyard::compiler::msccl::XmlOptions {
        executor: switchyard::compiler::msccl::Executor::Rccl,
        ..Default::default()
    }
}

#[test]
fn paced_xml_runs_as_planned() {
    use switchyard::compiler::msccl::{Pacing, XmlOptions};
    use switchyard::compiler::Algorithm;
    let mut worst_off: f64 = 0.0;
    for (nodes, seed, pattern, layout) in PACED_CASES {
        let alg = Algorithm::Fast;
        let ratio = |pacing| {
            let opts = XmlOptions {
                layout,
                pacing,
                ..XmlOptions::default()
            };
            executor_over_plan(nodes, seed, pattern, alg, &opts)
        };
        let r = ratio(Pacing::Cut);
        assert_as_planned(r, format!("{nodes}x8 {pattern:?} {alg} {layout}"));
        worst_off = worst_off.max(ratio(Pacing::Off));
    }
    assert!(
        worst_off > 1.03,
        "unpaced files within 3% too: {worst_off:.3}"
    );
}

/// Issue 22 item 2: on 4x8 log-normal (padded) `fast`'s paced transfers
/// that follow an awaited one on its lane paid a latency on the critical
/// path (their first head step was staged only once the previous tail
/// was, +5.26% over the plan). With the tails handed to the heads
/// (`msccl::handoff`) the file runs within 5% of its plan, and it is the
/// file the executor's rules price faster than the one without them.
#[test]
fn handed_off_tails_shorten_4x8_lognormal() {
    use switchyard::compiler::msccl::xsim::simulate_executor;
    use switchyard::compiler::msccl::{to_xml, XmlOptions};
    let (sim, topo, m, plan, want) = fast_4x8_lognormal(3);
    let x = to_xml(&plan, &topo, &m, &XmlOptions::default()).unwrap();
    assert!(x.handoffs > 0, "no tail handed off");
    assert_eq!(x.report_json()["handoffs"], x.handoffs);
    let (us, _) = simulate_executor(&x.text, "case", &m, &topo, &sim).unwrap();
    let r = us / want;
    assert!(r < 1.05, "4x8 log-normal fast padded: executor/plan {r:.4}");
}

/// Issue 22 item 2: `hierarchical`'s and `deepep`'s inter-node transfers
/// are many one-call operations on one connection, which the FIFO window
/// (two calls ahead of the receiver) made latency-bound: +3..18% over
/// their plans at 2x8. Spread over lanes of their own (`msccl::spread`)
/// they run within 3% on every 2x8 case of the sweep, and `direct` and
/// `pxn` on the log-normal padded case that whole chunks had put at +4.5%.
#[test]
fn spread_xml_runs_as_planned() {
    use switchyard::compiler::generate::Pattern;
    use switchyard::compiler::msccl::{Layout, XmlOptions};
    use switchyard::compiler::Algorithm;
    let cases = [
        (1, Pattern::Moe, Layout::Padded),
        (2, Pattern::Zipf(1.2), Layout::Packed),
        (3, Pattern::Lognormal(1.0), Layout::Padded),
        (4, Pattern::Hotspot(0.3), Layout::Packed),
        (5, Pattern::IntraSkew(1.2), Layout::Padded),
    ];
    for (seed, pattern, layout) in cases {
        for alg in [Algorithm::Hierarchical, Algorithm::Deepep] {
            let opts = XmlOptions {
                layout,
                ..XmlOptions::default()
            };
            let r = executor_over_plan(2, seed, pattern, alg, &opts);
            assert_as_planned(r, format!("2x8 {pattern:?} {alg} {layout}"));
        }
    }
    for alg in [Algorithm::Direct, Algorithm::Pxn] {
        let r = executor_over_plan(2, 3, Pattern::Lognormal(1.0), alg, &XmlOptions::default());
        assert_as_planned(r, format!("2x8 log-normal {alg}"));
    }
}

/// Issue 22 item 2: `pairwise`'s plan for XML (`sched::Options::for_msccl`,
/// as `compile --out f.xml` schedules) waits only for
/// what an executor holds, a rank's earlier receives, and its file runs
/// within 3% of it on the sweep's 2x8 MoE and intra-skew matrices. The
/// default plan also waits for the receiver's previous round and for the
/// arrival of the sender's own previous send, which no file can hold: its
/// file runs 9.75% ahead of it on MoE (the test can fail).
#[test]
fn pairwise_xml_runs_as_planned() {
    use switchyard::compiler::generate::Pattern;
    use switchyard::compiler::msccl::xsim::simulate_executor;
    use switchyard::compiler::msccl::{to_xml, XmlOptions};
    use switchyard::compiler::sched::{schedule, Options};
    use switchyard::compiler::Algorithm;
    let sim = SimOptions::default();
    let topo = Topology::preset("dgx-h100", 2, None).unwrap();
    for (seed, pattern) in [(1, Pattern::Moe), (5, Pattern::IntraSkew(1.2))] {
        let m = sweep_matrix(topo.ranks(), pattern, seed);
        let ratio = |opts: &Options| {
            let plan = schedule(Algorithm::Pairwise, &topo, &m, opts).unwrap();
            let want = simulate(&topo, &plan, &sim).unwrap().completion_us;
            let x = to_xml(&plan, &topo, &m, &XmlOptions::default()).unwrap();
            let (us, _) = simulate_executor(&x.text, "pairwise", &m, &topo, &sim).unwrap();
            (us / want, x.unheld_deps)
        };
        let (r, unheld) = ratio(&sweep_sched());
        assert!(
            (0.97..=1.03).contains(&r) && unheld == 0,
            "2x8 {pattern:?} pairwise for XML: executor/plan {r:.4}, {unheld} waits unheld"
        );
        if pattern == Pattern::Moe {
            let (r, unheld) = ratio(&Options::default());
            assert!(
                r < 0.97 && unheld > 0,
                "2x8 MoE default pairwise: executor/plan {r:.4}, {unheld} unheld"
            );
        }
    }
}

/// Issue 22 item 2: the sweep's 4x8 log-normal matrix, padded. The
/// one-flow plan (`sched::pairwise_held`) sends each block as one flow;
/// its file spreads the blocks longer than a connection's FIFO window over
/// lanes of their own, each its own share of a contended NIC, and ran
/// 7.03% ahead of it. The plan for XML (`sched::pairwise_msccl`) sends
/// those blocks as parallel flows where that prices the plan more than 3%
/// sooner: its file is within 3% of it and no slower than the one-flow
/// plan's file (the test can fail: the one-flow plan's file must be more
/// than 3% ahead of its plan).
#[test]
fn pairwise_long_blocks_run_as_planned_flows() {
    use switchyard::compiler::generate::Pattern;
    use switchyard::compiler::msccl::xsim::simulate_executor;
    use switchyard::compiler::msccl::{to_xml, Layout, XmlOptions};
    use switchyard::compiler::sched::{pairwise_held, schedule};
    use switchyard::compiler::Algorithm;
    let sim = SimOptions::default();
    let topo = Topology::preset("dgx-h100", 4, None).unwrap();
    let m = sweep_matrix(topo.ranks(), Pattern::Lognormal(1.0), 3);
    let opts = XmlOptions {
        layout: Layout::Padded,
        ..XmlOptions::default()
    };
    // (plan us, file us under the executor's rules)
    let price = |plan: &switchyard::compiler::Plan| {
        let want = simulate(&topo, plan, &sim).unwrap().completion_us;
        let x = to_xml(plan, &topo, &m, &opts).unwrap();
        let (us, _) = simulate_executor(&x.text, "pairwise", &m, &topo, &sim).unwrap();
        (want, us)
    };
    let (one, one_file) = price(&pairwise_held(&topo, &m));
    assert!(
        one_file < one * 0.97,
        "one flow: file {one_file:.1} against {one:.1} us"
    );
    let plan = schedule(Algorithm::Pairwise, &topo, &m, &sweep_sched()).unwrap();
    let (want, us) = price(&plan);
    assert!(
        (0.97..=1.03).contains(&(us / want)) && us <= one_file,
        "flows: file {us:.1} against {want:.1} us (one flow: {one_file:.1} against {one:.1})"
    );
}

/// Issue 22 item 2: 4x8 MoE `deepep`'s long inter-node writes, spread one
/// lane per FIFO window's worth of calls, took several max-min shares of
/// the NICs their node's other writes share: +4.25% (padded) and +4.14%
/// (packed) over the plan. `to_xml` also prices files whose streams get
/// only the lanes their planned rate needs (`msccl::spread::rate_lanes`)
/// and keeps the fastest: within 3% in both layouts.
#[test]
fn rate_lanes_hold_4x8_moe_deepep() {
    use switchyard::compiler::generate::Pattern;
    use switchyard::compiler::msccl::{Layout, XmlOptions};
    use switchyard::compiler::Algorithm;
    for layout in [Layout::Padded, Layout::Packed] {
        let opts = XmlOptions {
            layout,
            ..XmlOptions::default()
        };
        let r = executor_over_plan(4, 1, Pattern::Moe, Algorithm::Deepep, &opts);
        assert_as_planned(r, format!("4x8 MoE deepep {layout}"));
    }
}

/// Issue 22 items 2 and 3: under `rccl` (64 tbs a gpu) every 8x8 `direct`
/// gpu runs its 63 send and 63 receive lists two to a tb
/// (`msccl::pack`). Merged in the lowering's operation order a gpu's
/// receive from a lower rank held its send on the same tb, whose receiver
/// held its own send, and so on (+12.5% behind the plan on the sweep's
/// log-normal matrix); merged in the plan's order (`pack::merge_order`),
/// the file is within 3% of its plan.
#[test]
fn rccl_packed_direct_runs_as_planned() {
    use switchyard::compiler::generate::Pattern;
    use switchyard::compiler::Algorithm;
    let opts = rccl();
    let r = executor_over_plan(8, 3, Pattern::Lognormal(1.0), Algorithm::Direct, &opts);
    assert_as_planned(r, "8x8 log-normal direct under rccl");
}

/// Issue 22 items 2 and 3: under `rccl` (64 tbs a gpu) 8x8 intra-skew
/// `spray`'s plan runs up to 164 transfers at once on a gpu. Sharing the
/// spare lanes by lanes wanted gave them to a hot gpu's balancing moves
/// (29 short ones at once on one NVLink connection) and left a rail
/// connection one lane for its plan's two streams (+8.4% behind the
/// plan); the file whose spare lanes go where the plan keeps them busy
/// longest (`LaneShare::Busy`, priced against the other) is within 3%.
#[test]
fn rccl_spray_intraskew_runs_as_planned() {
    use switchyard::compiler::generate::Pattern;
    use switchyard::compiler::Algorithm;
    let opts = rccl();
    let r = executor_over_plan(8, 5, Pattern::IntraSkew(1.2), Algorithm::Spray, &opts);
    assert_as_planned(r, "8x8 intra-skew spray under rccl");
}

/// Issue 22 items 2 and 3: under `rccl` (a plan's 62 lanes a gpu) a
/// 4x8 gpu talking to its 31 peers both ways fills the cap with one lane
/// per connection, so `lp`'s relays (two lanes each at their relay gpu)
/// could not be held to it and their lanes ran one after another: the
/// hotspot file was 4.7% behind its plan. Its plan for the ideal network
/// is now routed rail to rail (`fit::leaves_lanes`), as `compile` plans
/// it, and the file is within 3% of its plan.
#[test]
fn rccl_4x8_lp_hotspot_runs_as_planned() {
    use switchyard::compiler::generate::Pattern;
    use switchyard::compiler::msccl::xsim::simulate_executor;
    use switchyard::compiler::msccl::{fit, to_xml, Executor, XmlOptions};
    use switchyard::compiler::sched::{schedule, Options};
    use switchyard::compiler::Algorithm;
    let sim = SimOptions::default();
    let topo = Topology::preset("dgx-h100", 4, None).unwrap();
    let m = sweep_matrix(topo.ranks(), Pattern::Hotspot(0.3), 4);
    let executor = Executor::Rccl;
    assert!(fit::lp_rail_aligned_for_lanes(&topo, &m, executor).unwrap());
    let sched = Options {
        time_limit_s: 20.0,
        lp_rail_aligned: true,
        ..Options::for_msccl(executor.plan_lanes_per_gpu())
    };
    let plan = schedule(Algorithm::Lp, &topo, &m, &sched).unwrap();
    let want = simulate(&topo, &plan, &sim).unwrap().completion_us;
    let opts = XmlOptions {
        executor,
        ..XmlOptions::default()
    };
    let x = to_xml(&plan, &topo, &m, &opts).unwrap();
    assert!(executor.check(&x.report).is_ok());
    let (us, _) = simulate_executor(&x.text, "lp", &m, &topo, &sim).unwrap();
    let r = us / want;
    assert_as_planned(
        r,
        format!("4x8 hotspot lp under rccl ({us:.1} / {want:.1} us)"),
    );
}

/// An all-to-all of `ngpus` GPUs on one node, `c` chunks of 450 kB per
/// pair: every GPU sends each peer its block as one step on its own
/// connection (tb per peer, channel 0), receives each peer's block on
/// another tb and copies its own block.
fn uniform_file(ngpus: u32, c: u32) -> String {
    let n = ngpus * c;
    let mut x = format!(
        "<algo name=\"switchyard uniform layout=padded chunk_bytes={U} gpus_per_node={ngpus}\" proto=\"Simple\" nchannels=\"1\" nchunksperloop=\"{n}\" ngpus=\"{ngpus}\" coll=\"alltoall\" inplace=\"0\" outofplace=\"1\" minBytes=\"0\" maxBytes=\"0\">\n"
    );
    for g in 0..ngpus {
        let mut tbs = Vec::new();
        let peers: Vec<u32> = (0..ngpus).filter(|&p| p != g).collect();
        for (i, &p) in peers.iter().enumerate() {
            let s = step(0, "s", p * c, g * c, c, None, false);
            tbs.push(tb(i as u32, p as i32, -1, &[s]));
        }
        for (i, &p) in peers.iter().enumerate() {
            let r = step(0, "r", g * c, p * c, c, None, false);
            tbs.push(tb((peers.len() + i) as u32, -1, p as i32, &[r]));
        }
        let cp = step(0, "cpy", g * c, g * c, c, None, false);
        tbs.push(tb(2 * peers.len() as u32, -1, -1, &[cp]));
        x += &format!(
            "  <gpu id=\"{g}\" i_chunks=\"{n}\" o_chunks=\"{n}\" s_chunks=\"0\">\n{}  </gpu>\n",
            tbs.concat()
        );
    }
    x + "</algo>\n"
}

/// `text` priced by the executor's rules on one node of its GPUs, with
/// connections as streams or (`streams: false`) every call its own flow:
/// the completion and, per (src, dst), the end of each call in order.
fn price_uniform(
    text: &str,
    ngpus: usize,
    streams: bool,
) -> (f64, std::collections::BTreeMap<(u32, u32), Vec<f64>>) {
    use switchyard::compiler::msccl::xsim::{executor_plan_with, Rules};
    let algo = parse_algo(text, "uniform").unwrap();
    let trace = run(&algo, "uniform").unwrap();
    let topo = Topology::preset("dgx-h100", 1, Some(ngpus)).unwrap();
    let rules = Rules {
        streams,
        ..Rules::EXECUTOR
    };
    let mut x = executor_plan_with(&algo, &trace, U, &rules);
    assign_paths(&mut x.plan, &topo);
    let r = x.simulate(&topo, &SimOptions::default()).unwrap();
    let mut calls: std::collections::BTreeMap<(u32, u32), Vec<f64>> = Default::default();
    for (t, tt) in x.plan.transfers.iter().zip(&r.transfers) {
        if t.src != t.dst && t.bytes > 0 {
            calls.entry((t.src, t.dst)).or_default().push(tt.end_us);
        }
    }
    for v in calls.values_mut() {
        v.sort_by(f64::total_cmp);
    }
    (r.completion_us, calls)
}

fn near(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-6 * b.abs().max(1.0)
}

/// A connection is one in-order stream (`prims_simple.h`: a sender's FIFO
/// steps go out one after another): one step of `m` calls of 4 chunks of
/// 450 kB (4 us each on a 450 GB/s NVLink port, 1 us latency), nothing else
/// on the link, keeps the link busy after the first latency: 1 + 4m us,
/// the FIFO window (2 calls) hiding each later call's latency under the
/// calls before it. With every call its own flow (the pricing before),
/// the two calls in the window run side by side and end together, and the
/// next one pays its latency with the link idle: 5, 9, 14, 27 us.
#[test]
fn a_connection_streams_its_calls_in_order() {
    for (m, apart) in [(1u32, 5.0), (2, 9.0), (3, 14.0), (6, 27.0)] {
        let text = uniform_file(2, 4 * m);
        let (us, calls) = price_uniform(&text, 2, true);
        assert!(near(us, 1.0 + 4.0 * f64::from(m)), "{m} calls: {us}");
        // Calls end one after another, 4 us apart.
        let ends = &calls[&(0, 1)];
        assert_eq!(ends.len(), m as usize);
        for (k, &e) in ends.iter().enumerate() {
            assert!(near(e, 5.0 + 4.0 * k as f64), "{m} calls: {ends:?}");
        }
        let (old, _) = price_uniform(&text, 2, false);
        assert!(near(old, apart), "{m} calls apart: {old}");
    }
}

/// Two connections leave one GPU port (3 GPUs, each sends each peer 8
/// chunks: 2 calls on each connection): as streams each connection has one
/// call moving at a time and gets half the port, 225 GB/s: its first call
/// ends at 1 + 1.8 MB / 225 GB/s = 9 us, its second at 9 + 8 = 17 us. With
/// every call its own flow, the port's four calls take a quarter each and
/// all end at 17 us: a connection with two calls in flight took two
/// shares.
#[test]
fn a_stream_takes_one_share_of_a_link() {
    let text = uniform_file(3, 8);
    let (us, calls) = price_uniform(&text, 3, true);
    assert!(near(us, 17.0), "{us}");
    assert_eq!(calls.len(), 6);
    for ends in calls.values() {
        assert!(near(ends[0], 9.0) && near(ends[1], 17.0), "{ends:?}");
    }
    let (old, calls) = price_uniform(&text, 3, false);
    assert!(near(old, 17.0), "{old}");
    for ends in calls.values() {
        assert!(ends.iter().all(|&e| near(e, 17.0)), "{ends:?}");
    }
}

/// The files an earlier lowering rescued (issue 22 item 2) ran over 3%
/// only while each call in flight took its own share of a link: 2x8
/// log-normal `pxn` packed in LL128 at the base chunk (+4.03%: a relay
/// stream of 7 calls in flight took most of its forwarding GPU's NVLink
/// ingress), 8x8 MoE `pairwise` at the base chunk (+3.50%: 327 operations
/// past 71 chunks between nodes), 4x8 log-normal `pairwise` packed in
/// LL128 (+3.47% at 3024 B; +6.52% at the base chunk tried here). With
/// one stream per connection each is within 3% of its plan (+1.02%,
/// +0.45%, -2.72%), and priced with calls apart it is not (+4.03%, +3.50%,
/// +6.52%, the first two the figures recorded before; the test can fail).
#[test]
fn streams_hold_the_files_once_rescued() {
    use switchyard::compiler::generate::Pattern;
    use switchyard::compiler::msccl::chunk::base_chunk_bytes;
    use switchyard::compiler::msccl::xsim::{executor_plan_with, Rules};
    use switchyard::compiler::msccl::{to_xml, Layout, XmlOptions};
    use switchyard::compiler::sched::schedule;
    use switchyard::compiler::Algorithm;
    let sim = SimOptions::default();
    for (nodes, seed, pattern, layout, alg, protocol) in [
        (
            2,
            3,
            Pattern::Lognormal(1.0),
            Layout::Packed,
            Algorithm::Pxn,
            Some(Protocol::LL128),
        ),
        (
            8,
            1,
            Pattern::Moe,
            Layout::Padded,
            Algorithm::Pairwise,
            None,
        ),
        (
            4,
            3,
            Pattern::Lognormal(1.0),
            Layout::Packed,
            Algorithm::Pairwise,
            Some(Protocol::LL128),
        ),
    ] {
        let topo = Topology::preset("dgx-h100", nodes, None).unwrap();
        let m = sweep_matrix(topo.ranks(), pattern, seed);
        let plan = schedule(alg, &topo, &m, &sweep_sched()).unwrap();
        let want = simulate(&topo, &plan, &sim).unwrap().completion_us;
        let opts = XmlOptions {
            layout,
            protocol,
            chunk_bytes: Some(base_chunk_bytes(&m)),
            ..XmlOptions::default()
        };
        let x = to_xml(&plan, &topo, &m, &opts).unwrap();
        let algo = parse_algo(&x.text, "rescued").unwrap();
        let trace = run(&algo, "rescued").unwrap();
        let price = |streams: bool| {
            let rules = Rules {
                streams,
                ..Rules::EXECUTOR
            };
            let mut p = executor_plan_with(&algo, &trace, x.chunk_bytes, &rules);
            assign_paths(&mut p.plan, &topo);
            p.simulate(&topo, &sim).unwrap().completion_us / want
        };
        let (r, apart) = (price(true), price(false));
        let case = format!("{nodes}x8 {pattern:?} {alg} {layout} {:?}", x.protocol);
        assert_as_planned(r, &case);
        assert!(apart > 1.03, "{case}: calls apart {apart:.4}");
    }
}

/// Where an executor-rule file loses time against its plan, link by link:
/// for the links the executor keeps busiest, the bytes and busy time of
/// the plan's simulation against those of the file under the executor's
/// rules (more bytes: whole-chunk padding; more busy time for the same
/// bytes: the link shared or idle differently; a completion later than the
/// busiest link's busy time: waits, calls or the FIFO window).
/// `XSIM_NODES=8 XSIM_ALGS=direct cargo test --test msccl_executor executor_rule_links -- --ignored --nocapture`
/// (`XSIM_PATTERNS=lognormal,moe,zipf,hotspot,intra` narrows the matrices;
/// `XSIM_LAYOUT=packed`).
#[test]
#[ignore]
fn executor_rule_links() {
    use switchyard::compiler::msccl::chunk::base_chunk_bytes;
    use switchyard::compiler::msccl::xsim::simulate_executor;
    use switchyard::compiler::msccl::{to_xml, XmlOptions};
    use switchyard::compiler::sched::schedule;
    use switchyard::compiler::Algorithm;
    let sim = SimOptions::default();
    let env_list = |k: &str| std::env::var(k).ok();
    let (nodes, layout) = diag_shape(8);
    // `XSIM_BASE_CHUNK=1`: the largest pair in 284 chunks whatever the
    // padding (the default before `msccl::chunk`).
    let base = env_list("XSIM_BASE_CHUNK").is_some();
    let topo = Topology::preset("dgx-h100", nodes, None).unwrap();
    for (name, _, m) in sweep_matrices(&topo) {
        for &alg in Algorithm::ALL {
            if !diag_wants(alg) {
                continue;
            }
            let plan = schedule(alg, &topo, &m, &sweep_sched_for(alg, &topo, &m)).unwrap();
            let p = simulate(&topo, &plan, &sim).unwrap();
            let opts = XmlOptions {
                layout,
                chunk_bytes: base.then(|| base_chunk_bytes(&m)),
                ..XmlOptions::default()
            };
            let x = to_xml(&plan, &topo, &m, &opts).unwrap();
            let (us, mut xp) = simulate_executor(&x.text, "links", &m, &topo, &sim).unwrap();
            assign_paths(&mut xp.plan, &topo);
            let e = xp.simulate(&topo, &sim).unwrap();
            let real: u64 = m.as_slice().iter().sum();
            let moved: u64 = xp.plan.transfers.iter().map(|t| t.bytes).sum();
            println!(
                "{nodes}x8 {name} {alg} {layout}: plan {:.1} us, executor {us:.1} us ({:+.2}%), chunk {} B, bytes moved / real {:.4}, calls {}",
                p.completion_us,
                100.0 * (us / p.completion_us - 1.0),
                x.chunk_bytes,
                moved as f64 / real as f64,
                xp.calls,
            );
            let mut order: Vec<usize> = (0..e.links.len()).collect();
            order.sort_by(|&a, &b| e.links[b].busy_us.total_cmp(&e.links[a].busy_us));
            for &l in order.iter().take(6) {
                let (pl, el) = (p.links[l], e.links[l]);
                println!(
                    "  {:<28} plan {:>10.0} B busy {:>7.1} us | executor {:>10.0} B ({:+.2}%) busy {:>7.1} us ({:+.2}%)",
                    topo.link_name(l as u32),
                    pl.bytes,
                    pl.busy_us,
                    el.bytes,
                    100.0 * (el.bytes / pl.bytes.max(1.0) - 1.0),
                    el.busy_us,
                    100.0 * (el.busy_us / pl.busy_us.max(1e-9) - 1.0),
                );
            }
        }
    }
}

/// Issue 22 item 2: on 8x8 log-normal traffic a block's last chunk, moved
/// whole, put `direct`'s file 3.9% behind its plan (the busiest NIC carried
/// 2.9% more bytes than planned, `executor_rule_links`). Where padding
/// costs a rank over 1% of its bytes, `to_xml` also writes the file with
/// finer chunks (`msccl::chunk`) and keeps the one the executor's rules
/// price faster: within 3% here, and the base chunk is not (the test can
/// fail).
#[test]
fn fine_chunks_hold_8x8_lognormal() {
    use switchyard::compiler::generate::{generate, Pattern, TrafficSpec};
    use switchyard::compiler::msccl::chunk::{base_chunk_bytes, padding_ratio, PAD_TARGET};
    use switchyard::compiler::msccl::{Layout, XmlOptions};
    use switchyard::compiler::Algorithm;
    let pattern = Pattern::Lognormal(1.0);
    let mut spec = TrafficSpec::new(64, pattern);
    spec.seed = 3;
    spec.bytes = 256 << 10;
    let m = generate(&spec).unwrap();
    let base = base_chunk_bytes(&m);
    assert!(padding_ratio(&m, base) > PAD_TARGET);
    let opts = XmlOptions {
        layout: Layout::Padded,
        ..XmlOptions::default()
    };
    let r = executor_over_plan(8, 3, pattern, Algorithm::Direct, &opts);
    assert_as_planned(r, "direct");
    let before = XmlOptions {
        chunk_bytes: Some(base),
        ..opts
    };
    let b = executor_over_plan(8, 3, pattern, Algorithm::Direct, &before);
    assert!(b > 1.03 && r < b, "base chunk {b:.4}, default {r:.4}");
}

/// The critical path of a file under the executor's rules: from the last
/// transfer to finish, each transfer's latest dependency followed back,
/// printing the operations (sends, receives, copies) on it with their
/// steps and times, and the latency each adds (start to first byte is the
/// path latency; a gap between a dependency's end and a start is none
/// here: the simulator starts a transfer when its last dependency ends).
/// `XSIM_NODES=4 XSIM_ALGS=fast XSIM_PATTERNS=lognormal XSIM_LAYOUT=padded cargo test --test msccl_executor executor_rule_path -- --ignored --nocapture`
#[test]
#[ignore]
fn executor_rule_path() {
    use switchyard::compiler::msccl::xsim::simulate_executor;
    use switchyard::compiler::msccl::{to_xml, XmlOptions};
    use switchyard::compiler::sched::schedule;
    use switchyard::compiler::Algorithm;
    let sim = SimOptions::default();
    let env = |k: &str| std::env::var(k).ok();
    let (nodes, layout) = diag_shape(4);
    let topo = Topology::preset("dgx-h100", nodes, None).unwrap();
    for (name, _, m) in sweep_matrices(&topo) {
        for &alg in Algorithm::ALL {
            if !diag_wants(alg) {
                continue;
            }
            let plan = schedule(alg, &topo, &m, &sweep_sched_for(alg, &topo, &m)).unwrap();
            let p = simulate(&topo, &plan, &sim).unwrap();
            let opts = XmlOptions {
                layout,
                executor: sweep_executor(),
                ..XmlOptions::default()
            };
            let x = to_xml(&plan, &topo, &m, &opts).unwrap();
            let (us, mut xp) = simulate_executor(&x.text, "path", &m, &topo, &sim).unwrap();
            let algo = parse_algo(&x.text, "path").unwrap();
            let trace = run(&algo, "path").unwrap();
            assign_paths(&mut xp.plan, &topo);
            let e = xp.simulate(&topo, &sim).unwrap();
            println!(
                "{nodes}x8 {name} {alg} {layout}: plan {:.1} us, executor {us:.1} us ({:+.2}%), {} ops",
                p.completion_us,
                100.0 * (us / p.completion_us - 1.0),
                trace.ops.len()
            );
            // The operation (and call) each data transfer belongs to.
            let ts = &xp.plan.transfers;
            let mut label: Vec<Option<(usize, usize)>> = vec![None; ts.len()];
            for (i, t) in xp.op_transfer.iter().enumerate() {
                let Some(t) = *t else { continue };
                let t = t as usize;
                if ts[t].bytes == 0 && trace.ops[i].src != trace.ops[i].dst {
                    for (k, &d) in ts[t].deps.iter().enumerate() {
                        label[d as usize] = Some((i, k));
                    }
                } else {
                    label[t] = Some((i, 0));
                }
            }
            // `XSIM_FROM=t`: the path to the file's transfer `t` instead.
            let mut t = env("XSIM_FROM")
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| {
                    (0..ts.len())
                        .max_by(|&a, &b| e.transfers[a].end_us.total_cmp(&e.transfers[b].end_us))
                        .unwrap()
                });
            loop {
                if let Some((i, k)) = label[t] {
                    let o = &trace.ops[i];
                    let tt = e.transfers[t];
                    println!(
                        "  {:>8.1}..{:>8.1} op {i} g{}->g{} cnt {} call {k} ({} B) step g{}/tb{}/{} -> g{}/tb{}/{} {}[{}]",
                        tt.start_us,
                        tt.end_us,
                        o.src,
                        o.dst,
                        o.cnt,
                        ts[t].bytes,
                        o.from.gpu,
                        o.from.tb,
                        o.from.pos,
                        o.to.gpu,
                        o.to.tb,
                        o.to.pos,
                        o.src_buf.letter(),
                        o.src_off,
                    );
                } else if env("XSIM_JOINS").is_some() {
                    println!(
                        "  {:>8.1}           join g{} of {} deps",
                        e.transfers[t].end_us,
                        ts[t].src,
                        ts[t].deps.len()
                    );
                }
                let Some(&d) = ts[t].deps.iter().max_by(|&&a, &&b| {
                    e.transfers[a as usize]
                        .end_us
                        .total_cmp(&e.transfers[b as usize].end_us)
                }) else {
                    break;
                };
                t = d as usize;
            }
            // `XSIM_TB=g/tb,...`: every operation sent or received by those
            // tbs, in program order, with its times.
            for want in env("XSIM_TB").iter().flat_map(|v| v.split(',')) {
                let (g, tb) = want.split_once('/').unwrap();
                let (g, tb): (u32, u32) = (g.parse().unwrap(), tb.parse().unwrap());
                let mut on: Vec<(u32, usize)> = trace
                    .ops
                    .iter()
                    .enumerate()
                    .filter_map(|(i, o)| {
                        if (o.from.gpu, o.from.tb) == (g, tb) {
                            Some((o.from.pos, i))
                        } else if (o.to.gpu, o.to.tb) == (g, tb) {
                            Some((o.to.pos, i))
                        } else {
                            None
                        }
                    })
                    .collect();
                on.sort_unstable();
                println!("  tb g{g}/tb{tb}:");
                for (pos, i) in on {
                    let o = &trace.ops[i];
                    let Some(t) = xp.op_transfer[i] else { continue };
                    let tt = e.transfers[t as usize];
                    println!(
                        "    {pos:>3} op {i} g{}->g{} cnt {} arrives {:>8.1} (last call from {:>8.1}) {}[{}] -> {}[{}]",
                        o.src,
                        o.dst,
                        o.cnt,
                        tt.end_us,
                        tt.start_us,
                        o.src_buf.letter(),
                        o.src_off,
                        o.dst_buf.letter(),
                        o.dst_off,
                    );
                }
            }
            // `XSIM_PAIRS=s-d,...`: the plan's transfers from s to d, and
            // the inter-node transfers that leave s or enter d, in both
            // the plan and the file, with their times.
            for pair in env("XSIM_PAIRS").iter().flat_map(|v| v.split(',')) {
                let (s, d) = pair.split_once('-').unwrap();
                let (s, d): (u32, u32) = (s.parse().unwrap(), d.parse().unwrap());
                let node = |g: u32| g / 8;
                let show =
                    |name: &str,
                     ts: &[switchyard::compiler::plan::Transfer],
                     r: &[switchyard::compiler::sim::TransferTime]| {
                        println!("  {name} g{s}->g{d}:");
                        let mut v: Vec<usize> = (0..ts.len())
                            .filter(|&t| {
                                let x = &ts[t];
                                x.bytes > 0
                                    && (x.src == s && x.dst == d
                                        || node(x.src) != node(x.dst) && (x.src == s || x.dst == d))
                            })
                            .collect();
                        v.sort_by(|&a, &b| r[a].start_us.total_cmp(&r[b].start_us));
                        for t in v {
                            let x = &ts[t];
                            println!(
                                "    {}{:>8.1}..{:>8.1} t{t} g{}->g{} {} B",
                                if x.src == s && x.dst == d { "*" } else { " " },
                                r[t].start_us,
                                r[t].end_us,
                                x.src,
                                x.dst,
                                x.bytes
                            );
                        }
                    };
                show("plan", &plan.transfers, &p.transfers);
                show("file", &xp.plan.transfers, &e.transfers);
            }
            // `XSIM_PLAN_PATH=1` (or a transfer of the plan to start from).
            if let Some(from) = env("XSIM_PLAN_PATH") {
                let pt = &plan.transfers;
                let t = from
                    .parse()
                    .ok()
                    .filter(|&t: &usize| t < pt.len() && from != "1")
                    .unwrap_or_else(|| {
                        (0..pt.len())
                            .max_by(|&a, &b| {
                                p.transfers[a].end_us.total_cmp(&p.transfers[b].end_us)
                            })
                            .unwrap()
                    });
                println!("  plan path:");
                print_path(pt, &p.transfers, t);
            }
            // `XSIM_ENCODED=1`: the critical path of the plan the file
            // encodes (`XmlPlan::plan`, the lowering's own plan) under the
            // plan's simulator, no executor rule.
            if env("XSIM_ENCODED").is_some() {
                let pt = &x.plan.transfers;
                let r = simulate(&topo, &x.plan, &sim).unwrap();
                println!(
                    "  encoded plan {:.1} us (chunk {} B, lanes short {}, tbs wanted {}, channels {}, max tbs {}), path:",
                    r.completion_us,
                    x.chunk_bytes,
                    x.lanes_short,
                    x.tbs_wanted,
                    x.channels,
                    x.max_tbs_per_gpu
                );
                let t = (0..pt.len())
                    .max_by(|&a, &b| r.transfers[a].end_us.total_cmp(&r.transfers[b].end_us))
                    .unwrap();
                print_path(pt, &r.transfers, t);
            }
        }
    }
}

/// `pairwise`'s rounds in its plan and in its file under the executor's
/// rules: per round k (rank r sends to r + k), when its first transfer
/// starts and its last one ends, and in how many of the plan's rounds a
/// gpu's round-k send starts before the round-(k-1) transfers the plan
/// makes it wait for have ended.
/// `XSIM_NODES=4 XSIM_PATTERNS=intraskew cargo test --release --workspace --test msccl_executor executor_rule_rounds -- --ignored --nocapture`
/// (`XSIM_LAYOUT=packed`).
#[test]
#[ignore]
fn executor_rule_rounds() {
    use switchyard::compiler::msccl::xsim::simulate_executor;
    use switchyard::compiler::msccl::{to_xml, XmlOptions};
    use switchyard::compiler::sched::schedule;
    use switchyard::compiler::Algorithm;
    let sim = SimOptions::default();
    let (nodes, layout) = diag_shape(4);
    let topo = Topology::preset("dgx-h100", nodes, None).unwrap();
    let n = topo.ranks();
    for (name, _, m) in sweep_matrices(&topo) {
        let plan = schedule(Algorithm::Pairwise, &topo, &m, &sweep_sched()).unwrap();
        let p = simulate(&topo, &plan, &sim).unwrap();
        let opts = XmlOptions {
            layout,
            ..XmlOptions::default()
        };
        let x = to_xml(&plan, &topo, &m, &opts).unwrap();
        let (us, mut xp) = simulate_executor(&x.text, "rounds", &m, &topo, &sim).unwrap();
        let algo = parse_algo(&x.text, "rounds").unwrap();
        let trace = run(&algo, "rounds").unwrap();
        assign_paths(&mut xp.plan, &topo);
        let e = xp.simulate(&topo, &sim).unwrap();
        println!(
            "{nodes}x8 {name} pairwise {layout}: plan {:.1} us, executor {us:.1} us ({:+.2}%), unheld {}",
            p.completion_us,
            100.0 * (us / p.completion_us - 1.0),
            x.unheld_deps
        );
        let round = |s: u32, d: u32| (d as usize + n - s as usize) % n;
        let inf = (f64::INFINITY, f64::NEG_INFINITY);
        let mut pr = vec![inf; n];
        let mut pcount = vec![0usize; n];
        for (t, tt) in plan.transfers.iter().zip(&p.transfers) {
            if t.src == t.dst || t.bytes == 0 {
                continue;
            }
            let k = round(t.src, t.dst);
            pr[k].0 = pr[k].0.min(tt.start_us);
            pr[k].1 = pr[k].1.max(tt.end_us);
            pcount[k] += 1;
        }
        let ts = &xp.plan.transfers;
        let mut fr = vec![inf; n];
        // Per gpu and round: the file's send start and arrival.
        let mut send_start = vec![vec![f64::NAN; n]; n];
        for (i, o) in trace.ops.iter().enumerate() {
            if o.src == o.dst {
                continue;
            }
            let Some(t) = xp.op_transfer[i] else { continue };
            let t = t as usize;
            let end = e.transfers[t].end_us;
            let start = if ts[t].bytes == 0 {
                ts[t]
                    .deps
                    .iter()
                    .map(|&d| e.transfers[d as usize].start_us)
                    .fold(f64::INFINITY, f64::min)
            } else {
                e.transfers[t].start_us
            };
            let k = round(o.src, o.dst);
            fr[k].0 = fr[k].0.min(start);
            fr[k].1 = fr[k].1.max(end);
            let s = &mut send_start[o.src as usize][k];
            *s = if s.is_nan() { start } else { s.min(start) };
        }
        // A round's send that starts before the plan's barrier for it.
        let mut early = vec![0usize; n];
        for (t, tt) in plan.transfers.iter().zip(&p.transfers) {
            if t.src == t.dst || t.bytes == 0 {
                continue;
            }
            let k = round(t.src, t.dst);
            let s = send_start[t.src as usize][k];
            if s + 1e-6 < tt.start_us {
                early[k] += 1;
            }
        }
        for k in 1..n {
            println!(
                "  round {k:>3}: plan {:>8.1}..{:>8.1} ({:>3} transfers)  file {:>8.1}..{:>8.1}  {:>3} sends before the plan's",
                pr[k].0, pr[k].1, pcount[k], fr[k].0, fr[k].1, early[k]
            );
        }
    }
}

/// Per-NIC timelines of a plan and of its file under the executor's
/// rules: the file priced with real bytes instead of whole chunks (what
/// padding costs), and for the inter-node pairs that finish latest against
/// the plan, when their bytes moved in the plan and in the file and the
/// mean number of flows moving over their sending and receiving NICs
/// while busy (the shares a NIC is cut into).
/// `XSIM_NODES=4 XSIM_ALGS=fast XSIM_PATTERNS=lognormal cargo test --release --workspace --test msccl_executor executor_rule_nics -- --ignored --nocapture`
/// (`XSIM_LAYOUT=packed`; `XSIM_SHOW=n`: pairs shown, 12 by default;
/// `XSIM_NIC=g`: every flow leaving gpu g, plan and file; `XSIM_ENDS=1`:
/// bytes and last end per NIC; `XSIM_CHUNK=bytes`: the file at that chunk).
#[test]
#[ignore]
fn executor_rule_nics() {
    use std::collections::BTreeMap;
    use switchyard::compiler::msccl::xsim::simulate_executor;
    use switchyard::compiler::msccl::{to_xml, XmlOptions};
    use switchyard::compiler::sched::schedule;
    use switchyard::compiler::Algorithm;
    let sim = SimOptions::default();
    let (nodes, layout) = diag_shape(4);
    let show: usize = std::env::var("XSIM_SHOW").map_or(12, |v| v.parse().unwrap());
    let topo = Topology::preset("dgx-h100", nodes, None).unwrap();
    let g = topo.gpus_per_node() as u32;
    for (name, _, m) in sweep_matrices(&topo) {
        for &alg in Algorithm::ALL {
            if !diag_wants(alg) {
                continue;
            }
            let plan = schedule(alg, &topo, &m, &sweep_sched_for(alg, &topo, &m)).unwrap();
            let p = simulate(&topo, &plan, &sim).unwrap();
            // `XSIM_CHUNK=bytes`: that chunk instead of the default.
            let opts = XmlOptions {
                layout,
                chunk_bytes: std::env::var("XSIM_CHUNK").ok().map(|v| v.parse().unwrap()),
                ..XmlOptions::default()
            };
            let x = to_xml(&plan, &topo, &m, &opts).unwrap();
            let (us, mut xp) = simulate_executor(&x.text, "nics", &m, &topo, &sim).unwrap();
            assign_paths(&mut xp.plan, &topo);
            let e = xp.simulate(&topo, &sim).unwrap();
            println!(
                "{nodes}x8 {name} {alg} {layout}: plan {:.1} us, executor {us:.1} us ({:+.2}%)",
                p.completion_us,
                100.0 * (us / p.completion_us - 1.0)
            );
            {
                use switchyard::compiler::msccl::xsim::{executor_plan_with, Rules};
                let algo = parse_algo(&x.text, "nics").unwrap();
                let trace = run(&algo, "nics").unwrap();
                let rules = Rules {
                    real_bytes: Some(&m),
                    ..Rules::EXECUTOR
                };
                let mut rp = executor_plan_with(&algo, &trace, x.chunk_bytes, &rules);
                assign_paths(&mut rp.plan, &topo);
                let r = rp.simulate(&topo, &sim).unwrap().completion_us;
                println!(
                    "  executor rules with real bytes (no padding): {r:.1} us ({:+.2}%)",
                    100.0 * (r / p.completion_us - 1.0)
                );
            }
            // Inter-node flows: (src, dst) -> [(moving from, end, bytes)].
            type Flows = BTreeMap<(u32, u32), Vec<(f64, f64, u64)>>;
            let flows = |ts: &[switchyard::compiler::plan::Transfer],
                         r: &switchyard::compiler::sim::SimResult|
             -> Flows {
                let mut f = Flows::new();
                for (i, t) in ts.iter().enumerate() {
                    if t.bytes > 0 && t.src / g != t.dst / g {
                        f.entry((t.src, t.dst)).or_default().push((
                            r.moving_from_us(i),
                            r.transfers[i].end_us,
                            t.bytes,
                        ));
                    }
                }
                f
            };
            let (pf, ef) = (flows(&plan.transfers, &p), flows(&xp.plan.transfers, &e));
            let span = |v: &[(f64, f64, u64)]| {
                let a = v.iter().map(|x| x.0).fold(f64::INFINITY, f64::min);
                let b = v.iter().map(|x| x.1).fold(0.0, f64::max);
                let by: u64 = v.iter().map(|x| x.2).sum();
                (a, b, by, v.len())
            };
            // Mean flows moving over a set of pairs' NIC while any moves,
            // and the time some moves.
            let share = |f: &Flows, keep: &dyn Fn(u32, u32) -> bool| -> (f64, f64) {
                let mut ev: Vec<(f64, i32)> = Vec::new();
                for (&(s, d), v) in f {
                    if keep(s, d) {
                        for &(a, b, _) in v {
                            if b > a {
                                ev.push((a, 1));
                                ev.push((b, -1));
                            }
                        }
                    }
                }
                ev.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
                let (mut live, mut last, mut busy, mut area) = (0i32, 0.0, 0.0, 0.0);
                for (t, k) in ev {
                    if live > 0 {
                        busy += t - last;
                        area += f64::from(live) * (t - last);
                    }
                    live += k;
                    last = t;
                }
                (area / busy.max(1e-9), busy)
            };
            // `XSIM_NIC=g`: every flow leaving gpu g, in both.
            if let Some(gs) = std::env::var("XSIM_NIC")
                .ok()
                .and_then(|v| v.parse::<u32>().ok())
            {
                for (what, f) in [("plan", &pf), ("file", &ef)] {
                    let mut v: Vec<(f64, f64, u64, u32)> = f
                        .iter()
                        .filter(|((s, _), _)| *s == gs)
                        .flat_map(|((_, d), v)| v.iter().map(move |&(a, b, by)| (a, b, by, *d)))
                        .collect();
                    v.sort_by(|a, b| a.0.total_cmp(&b.0));
                    println!("  {what} flows out of g{gs}:");
                    for (a, b, by, d) in v {
                        println!(
                            "    {a:7.2}..{b:7.2} ->g{d} {by:>8} B {:6.2} GB/s",
                            by as f64 / (b - a).max(1e-9) / 1e3
                        );
                    }
                }
            }
            // Per NIC (tx of a gpu, rx of a gpu): bytes, last end, in both.
            if std::env::var("XSIM_ENDS").is_ok() {
                let mut rows = Vec::new();
                for gpu in 0..topo.ranks() as u32 {
                    for (dir, keep) in [("tx", 0), ("rx", 1)] {
                        let end = |f: &Flows| {
                            let mut by = 0u64;
                            let mut b = 0.0f64;
                            for (&(s, d), v) in f {
                                if (keep == 0 && s == gpu) || (keep == 1 && d == gpu) {
                                    for x in v {
                                        by += x.2;
                                        b = b.max(x.1);
                                    }
                                }
                            }
                            (by, b)
                        };
                        let (pb, pe) = end(&pf);
                        let (eb, ee) = end(&ef);
                        rows.push((ee, format!("  {dir} g{gpu}: plan {pb} B end {pe:.1} | file {eb} B ({:+.2}%) end {ee:.1} ({:+.1} us)", 100.0 * (eb as f64 / pb.max(1) as f64 - 1.0), ee - pe)));
                    }
                }
                rows.sort_by(|a, b| b.0.total_cmp(&a.0));
                for (_, r) in rows.iter().take(12) {
                    println!("{r}");
                }
            }
            let mut late: Vec<((u32, u32), f64)> = pf
                .keys()
                .filter_map(|k| {
                    let (_, pb, _, _) = span(&pf[k]);
                    let (_, eb, _, _) = span(ef.get(k)?);
                    Some((*k, eb - pb))
                })
                .collect();
            late.sort_by(|a, b| b.1.total_cmp(&a.1));
            for &((s, d), dl) in late.iter().take(show) {
                let (pa, pb, pby, pn) = span(&pf[&(s, d)]);
                let (ea, eb, eby, en) = span(&ef[&(s, d)]);
                let (ptx, ptb) = share(&pf, &|a, _| a == s);
                let (etx, etb) = share(&ef, &|a, _| a == s);
                let (prx, prb) = share(&pf, &|_, b| b == d);
                let (erx, erb) = share(&ef, &|_, b| b == d);
                println!(
                    "  g{s}->g{d} late {dl:+6.1} us | plan {pa:6.1}..{pb:6.1} {pby} B in {pn} | file {ea:6.1}..{eb:6.1} {eby} B in {en} | tx flows {ptx:.2}/{ptb:.0}us -> {etx:.2}/{etb:.0}us, rx flows {prx:.2}/{prb:.0}us -> {erx:.2}/{erb:.0}us"
                );
            }
        }
    }
}

/// Issue 22 item 2: `fast`'s 4x8 log-normal files ran +4.63% (padded) and
/// +4.79% (packed) over their plan under the executor's rules: their
/// paced heads left as soon as their data was there, taking NIC shares
/// from the bodies the plan runs then, and every pair's last chunk moved
/// whole (2 of the points; `executor_rule_nics`). `to_xml` also prices
/// files whose heads wait until shortly before their transfer's planned
/// start (`HEAD_LEAD_US`), at the base and finer chunks, and keeps the
/// fastest. Since `fast` takes rotation stages where they price sooner,
/// seed 3's plan no longer needs released heads; seed 6's padded file
/// still keeps them. Both seeds hold within 3% in both layouts.
#[test]
fn released_heads_hold_4x8_lognormal() {
    use switchyard::compiler::msccl::xsim::simulate_executor;
    use switchyard::compiler::msccl::{to_xml, Layout, XmlOptions};
    for seed in [3, 6] {
        let (sim, topo, m, plan, want) = fast_4x8_lognormal(seed);
        for layout in [Layout::Padded, Layout::Packed] {
            let opts = XmlOptions {
                layout,
                ..XmlOptions::default()
            };
            let x = to_xml(&plan, &topo, &m, &opts).unwrap();
            assert_eq!(x.report_json()["released_heads"], x.released_heads);
            if seed == 6 && layout == Layout::Padded {
                assert!(x.released_heads > 0, "seed 6 {layout}: no head released");
            }
            let (us, _) = simulate_executor(&x.text, "case", &m, &topo, &sim).unwrap();
            let r = us / want;
            assert_as_planned(r, format!("4x8 log-normal seed {seed} fast {layout}"));
        }
    }
}

/// `fast`'s file at forced chunk sizes, each priced by the executor's rules
/// over its plan (`to_xml` with `chunk_bytes`: the best of its files at
/// that chunk), to see how the price moves with the chunk.
/// `XSIM_NODES=8 XSIM_PATTERNS=lognormal XSIM_CHUNKS=14112,14128 cargo test --release --workspace --test msccl_executor executor_rule_chunks -- --ignored --nocapture`
/// (`XSIM_CHUNKS=lo:hi:step` for a range; `XSIM_LAYOUT=packed`).
#[test]
#[ignore]
fn executor_rule_chunks() {
    use switchyard::compiler::msccl::xsim::simulate_executor;
    use switchyard::compiler::msccl::{to_xml, XmlOptions};
    use switchyard::compiler::sched::schedule;
    use switchyard::compiler::Algorithm;
    let sim = SimOptions::default();
    let (nodes, layout) = diag_shape(8);
    let topo = Topology::preset("dgx-h100", nodes, None).unwrap();
    let spec = std::env::var("XSIM_CHUNKS").unwrap_or_default();
    let chunks: Vec<u64> = if let Some((lo, rest)) = spec.split_once(':') {
        let (hi, step) = rest.split_once(':').unwrap_or((rest, "16"));
        let (lo, hi, step): (u64, u64, u64) = (
            lo.parse().unwrap(),
            hi.parse().unwrap(),
            step.parse().unwrap(),
        );
        (lo..=hi).step_by(step as usize).collect()
    } else {
        spec.split(',').filter_map(|v| v.parse().ok()).collect()
    };
    // `XSIM_ALGS=a`: that algorithm's plan (`fast` by default);
    // `XSIM_PROTO=p`: that protocol.
    let alg = Algorithm::ALL
        .iter()
        .copied()
        .find(|&a| std::env::var("XSIM_ALGS").is_ok_and(|v| v == a.name()))
        .unwrap_or(Algorithm::Fast);
    let protocol = std::env::var("XSIM_PROTO").ok().map(|p| p.parse().unwrap());
    for (name, _, m) in sweep_matrices(&topo) {
        let plan = schedule(alg, &topo, &m, &sweep_sched_for(alg, &topo, &m)).unwrap();
        let want = simulate(&topo, &plan, &sim).unwrap().completion_us;
        // `XSIM_RUN_BYTES=b`: the score's bytes per extra operation;
        // `XSIM_BEST=k`: with `XSIM_COSTS_ONLY`, the k best-scored chunks.
        let run_bytes = std::env::var("XSIM_RUN_BYTES").map_or(0, |v| v.parse().unwrap());
        let costs =
            switchyard::compiler::msccl::chunk::chunk_costs(&plan, &m, 2, run_bytes, &chunks)
                .unwrap();
        if std::env::var("XSIM_COSTS_ONLY").is_ok() {
            use switchyard::compiler::msccl::chunk::{
                base_chunk_bytes, near_chunk_bytes, scored_chunk_bytes,
            };
            for layout in [
                switchyard::compiler::msccl::Layout::Padded,
                switchyard::compiler::msccl::Layout::Packed,
            ] {
                println!(
                    "{nodes}x8 {name} {layout}: base {} near {:?} scored {:?}",
                    base_chunk_bytes(&m),
                    near_chunk_bytes(&m, layout),
                    scored_chunk_bytes(&plan, &m, layout, 3).unwrap()
                );
            }
        }
        if let Ok(k) = std::env::var("XSIM_BEST") {
            let mut c = costs.clone();
            c.sort_by_key(|c| (c.score, std::cmp::Reverse(c.u)));
            for c in c.iter().take(k.parse().unwrap()) {
                println!("{nodes}x8 {name} best: {c:?}");
            }
            continue;
        }
        for (&u, c) in chunks.iter().zip(&costs) {
            // `XSIM_COSTS_ONLY=1`: the costs counted from the plan alone.
            if std::env::var("XSIM_COSTS_ONLY").is_ok() {
                println!(
                    "{nodes}x8 {name} fast chunk {u}: nic {} short {} extra runs {} score {}",
                    c.nic_bytes, c.short, c.extra_runs, c.score
                );
                continue;
            }
            let t = std::time::Instant::now();
            let opts = XmlOptions {
                layout,
                chunk_bytes: Some(u),
                protocol,
                ..XmlOptions::default()
            };
            match to_xml(&plan, &topo, &m, &opts) {
                Ok(x) => {
                    let (us, _) = simulate_executor(&x.text, "chunks", &m, &topo, &sim).unwrap();
                    println!(
                        "{nodes}x8 {name} {alg} {layout} {} chunk {u}: {:+.2}% released {} handoffs {} unheld {} nic {} short {} extra runs {} ({:.1} s)",
                        x.protocol.name(),
                        100.0 * (us / want - 1.0),
                        x.released_heads,
                        x.handoffs,
                        x.unheld_deps,
                        c.nic_bytes,
                        c.short,
                        c.extra_runs,
                        t.elapsed().as_secs_f64()
                    );
                }
                Err(e) => println!("{nodes}x8 {name} {alg} {layout} chunk {u}: {e}"),
            }
        }
    }
}

/// `spray`'s (and, for reference, `fast`'s) plan completion on the sweep's
/// matrices, in the ideal and calibrated network modes: the figures of
/// docs/benchmarks.md, "`spray` pipelines each relayed block into its
/// forward". `XSIM_NODES` and `XSIM_PATTERNS` narrow it.
/// `cargo test --release --workspace --test msccl_executor spray_plan_sweep -- --ignored --nocapture`
#[test]
#[ignore]
fn spray_plan_sweep() {
    use switchyard::compiler::sched::schedule;
    use switchyard::compiler::sim::Network;
    use switchyard::compiler::Algorithm;
    let nodes: Vec<usize> = std::env::var("XSIM_NODES").ok().map_or(vec![2, 4, 8], |v| {
        v.split(',').map(|x| x.parse().unwrap()).collect()
    });
    for nodes in nodes {
        let topo = Topology::preset("dgx-h100", nodes, None).unwrap();
        for (name, _, m) in sweep_matrices(&topo) {
            for alg in [Algorithm::Spray, Algorithm::Fast] {
                let plan = schedule(alg, &topo, &m, &sweep_sched()).unwrap();
                let us: Vec<f64> = [Network::Ideal, Network::Calibrated]
                    .into_iter()
                    .map(|n| {
                        simulate(&topo, &plan, &SimOptions::new(n))
                            .unwrap()
                            .completion_us
                    })
                    .collect();
                println!(
                    "{nodes}x8 {name} {}: ideal {:.1} us calibrated {:.1} us transfers {}",
                    alg.name(),
                    us[0],
                    us[1],
                    plan.transfers.len()
                );
            }
        }
    }
}
