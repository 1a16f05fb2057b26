//! Executor profiles and size windows: every algorithm's XML for an MI300X
//! cluster loads in RCCL (at most 64 threadblocks per GPU), a skewed file is
//! picked by the executor's selection rule for its own buffer size only, and
//! a cluster too large for a profile is refused at once, naming the limit.

use std::time::Instant;

use switchyard::compiler::generate::{generate, Pattern, TrafficSpec};
use switchyard::compiler::msccl::{to_xml, Executor, Layout, XmlOptions};
use switchyard::compiler::sched::{schedule, Options};
use switchyard::compiler::{Algorithm, Topology, TrafficMatrix};

fn skewed(topo: &Topology, seed: u64, pattern: Pattern) -> TrafficMatrix {
    let mut spec = TrafficSpec::new(topo.ranks(), pattern);
    spec.seed = seed;
    spec.bytes = 256 << 10;
    spec.moe.tokens_per_rank = 512;
    generate(&spec).unwrap()
}

#[test]
fn mi300x_files_load_in_rccl() {
    for nodes in [2, 4] {
        let topo = Topology::preset("mi300x", nodes, None).unwrap();
        let executor = Executor::default_for(&topo);
        assert_eq!(
            executor,
            Executor::Rccl,
            "MI300X users load plans with RCCL"
        );
        let m = skewed(&topo, 7, Pattern::Zipf(1.2));
        // As `compile --out plan.xml` schedules for this executor.
        let sched = Options {
            time_limit_s: 20.0,
            ..Options::for_msccl(executor.plan_lanes_per_gpu())
        };
        for &alg in Algorithm::ALL {
            let plan = schedule(alg, &topo, &m, &sched).unwrap();
            let opts = XmlOptions {
                executor,
                ..XmlOptions::default()
            };
            let x =
                to_xml(&plan, &topo, &m, &opts).unwrap_or_else(|e| panic!("{nodes}x8 {alg}: {e}"));
            assert!(
                x.max_tbs_per_gpu <= 64,
                "{nodes}x8 {alg}: {} threadblocks on a gpu, RCCL loads 64",
                x.max_tbs_per_gpu
            );
            assert!(Executor::Rccl.check(&x.report).is_ok());
            // The same file would not always fit NCCL-MSCCL's channels, but
            // the tb count is what RCCL refused before the profile existed.
            eprintln!(
                "{nodes}x8 {alg}: {} tbs (wanted {}), {} channels, lanes short {}",
                x.max_tbs_per_gpu, x.tbs_wanted, x.channels, x.lanes_short
            );
        }
    }
}

#[test]
fn the_default_profile_is_nccl_msccl_off_amd() {
    let topo = Topology::preset("dgx-h100", 2, None).unwrap();
    assert_eq!(Executor::default_for(&topo), Executor::Msccl);
    assert_eq!("rccl".parse::<Executor>(), Ok(Executor::Rccl));
    assert!("nccl"
        .parse::<Executor>()
        .unwrap_err()
        .contains("msccl, rccl"));
}

/// `msccl_lifecycle.cc` (`mscclInternalSchedulerSelectAlgo`): a file is
/// picked for `count` elements of `type_size` bytes when `count > 0`,
/// `count * ngpus` is a multiple of `nchunksperloop` and
/// `minBytes <= count * type_size * ngpus <= maxBytes` (`maxBytes` 0: no limit).
fn picks(x: &switchyard::compiler::msccl::XmlPlan, n: u64, count: u64, type_size: u64) -> bool {
    let nbytes = count * type_size * n;
    count > 0
        && (count * n) % u64::from(x.nchunksperloop) == 0
        && nbytes >= x.min_bytes
        && (x.max_bytes == 0 || nbytes <= x.max_bytes)
}

#[test]
fn a_skewed_file_is_picked_for_its_own_size_only() {
    let topo = Topology::preset("dgx-h100", 2, None).unwrap();
    let n = topo.ranks() as u64;
    let m = skewed(&topo, 3, Pattern::Moe);
    let plan = schedule(Algorithm::Direct, &topo, &m, &Options::default()).unwrap();
    for layout in [Layout::Padded, Layout::Packed] {
        let opts = XmlOptions {
            layout,
            ..XmlOptions::default()
        };
        let x = to_xml(&plan, &topo, &m, &opts).unwrap();
        assert_eq!(x.min_bytes, x.buffer_bytes);
        assert_eq!(x.max_bytes, x.buffer_bytes);
        assert!(x.text.contains(&format!("matrix={}", m.fingerprint())));
        // Its own size, in every element type whose count is whole.
        for ts in [1, 2, 4, 8, 16] {
            assert!(
                picks(&x, n, x.count_bytes / ts, ts),
                "{layout} type size {ts}"
            );
        }
        // Every other size: one element more or less, a chunk more or less,
        // twice, half, and every size up to a few buffers in steps of 16 bytes.
        let own = x.count_bytes;
        let others = [
            own - 16,
            own + 16,
            own - x.chunk_bytes,
            own + x.chunk_bytes,
            own * 2,
            own / 2,
        ];
        for c in others
            .into_iter()
            .chain((16..own * 3).step_by(16).filter(|&c| c != own))
        {
            for ts in [1, 2, 4, 8, 16] {
                if c % ts == 0 {
                    assert!(
                        !picks(&x, n, c / ts, ts),
                        "{layout}: picked for {c} bytes per peer"
                    );
                }
            }
        }
    }
    // A uniform matrix keeps its protocol's window: the file is a correct
    // all-to-all of any size there.
    let u = TrafficMatrix::uniform(n as usize, 1 << 20);
    let plan = schedule(Algorithm::Direct, &topo, &u, &Options::default()).unwrap();
    let x = to_xml(&plan, &topo, &u, &XmlOptions::default()).unwrap();
    assert_eq!(x.max_bytes, 0);
    assert!(!x.text.contains("matrix="));
}

#[test]
fn a_cluster_too_large_for_the_profile_is_refused_at_once() {
    // 512 ranks: `direct` connects every pair: 511 peers each way, so 511
    // threadblocks per gpu even with a send and a receive list in each.
    let topo = Topology::preset("dgx-h100", 64, None).unwrap();
    let m = TrafficMatrix::uniform(topo.ranks(), 4096);
    let plan = schedule(Algorithm::Direct, &topo, &m, &Options::default()).unwrap();
    for executor in Executor::ALL {
        let t0 = Instant::now();
        let e = to_xml(
            &plan,
            &topo,
            &m,
            &XmlOptions {
                executor,
                ..XmlOptions::default()
            },
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("needs at least 511 threadblocks"), "{e}");
        assert!(
            e.contains(&format!(
                "{executor} loads at most {}",
                executor.max_tbs_per_gpu()
            )),
            "{e}"
        );
        assert!(t0.elapsed().as_secs_f64() < 5.0, "took {:?}", t0.elapsed());
    }
}
