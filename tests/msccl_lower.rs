//! Lowering plans to MSCCL XML: every scheduler, random skewed matrices on
//! 2x8 and 4x8 DGX-H100, both layouts. Each written file passes the loader
//! rules and the symbolic executor, and the plan read back verifies.

use proptest::prelude::*;
use switchyard::compiler::generate::{generate, Pattern, TrafficSpec};
use switchyard::compiler::msccl::{
    check_executable, parse_xml, to_xml, to_xml_windows, xml_traffic, Layout, Protocol, XmlOptions,
};
use switchyard::compiler::plan::Deps;
use switchyard::compiler::sched::{path_between, schedule, Options};
use switchyard::compiler::{verify_on, Algorithm, Buffer, Plan, Topology, TrafficMatrix, Transfer};

/// A small deterministic generator (splitmix64), enough for test plans.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15)
    }
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `lo..hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo)
    }
    fn chance(&mut self, p: f64) -> bool {
        ((self.next() >> 11) as f64 / (1u64 << 53) as f64) < p
    }
}

fn skewed(ranks: usize, pattern: Pattern, seed: u64, bytes: u64) -> TrafficMatrix {
    let mut spec = TrafficSpec::new(ranks, pattern);
    spec.seed = seed;
    spec.bytes = bytes;
    spec.moe.tokens_per_rank = 256;
    spec.moe.hidden = 512;
    generate(&spec).unwrap()
}

/// Lowers, checks the file, reads it back and verifies; returns the file.
fn round_trip(plan: &Plan, topo: &Topology, m: &TrafficMatrix, opts: &XmlOptions) -> String {
    let x = to_xml(plan, topo, m, opts).unwrap_or_else(|e| panic!("{}: {e}", plan.algorithm));
    let report = check_executable(&x.text).unwrap_or_else(|e| panic!("{e}"));
    assert!(report.warnings.is_empty(), "{:?}", report.warnings);
    assert_eq!(report.layout, opts.layout);
    assert_eq!(report.chunk_bytes, Some(x.chunk_bytes));
    assert!(x.text.contains(&format!(
        "layout={} chunk_bytes={}",
        opts.layout, x.chunk_bytes
    )));
    verify_on(&x.plan, m, topo).unwrap_or_else(|e| panic!("encoded plan: {e}"));
    let back = parse_xml(&x.text, "plan.xml", Some(m)).unwrap();
    verify_on(&back, m, topo).unwrap_or_else(|e| panic!("read back: {e}"));
    assert_eq!(back.transfers.len(), x.plan.transfers.len());
    // The matrix the file implies is the quantised one, which it also moves.
    let implied = xml_traffic(&x.text, "plan.xml").unwrap();
    let plan_q = parse_xml(&x.text, "plan.xml", None).unwrap();
    verify_on(&plan_q, &implied, topo).unwrap();
    for s in 0..m.ranks() {
        for d in 0..m.ranks() {
            let q = implied.get(s, d);
            assert!(
                q >= m.get(s, d) && q < m.get(s, d) + x.chunk_bytes,
                "{s}->{d}"
            );
        }
    }
    x.text
}

#[test]
fn every_algorithm_on_skewed_2x8_and_4x8() {
    for nodes in [2, 4] {
        let topo = Topology::preset("dgx-h100", nodes, None).unwrap();
        let n = topo.ranks();
        let patterns = [
            (1, Pattern::Moe),
            (2, Pattern::Zipf(1.2)),
            (3, Pattern::Lognormal(1.0)),
            (4, Pattern::Hotspot(0.5)),
        ];
        // Two on 4x8 keep the test quick (pairwise files hold ~50k steps).
        for &(seed, pattern) in &patterns[..if nodes == 2 { 4 } else { 2 }] {
            let m = skewed(n, pattern, seed, 64 << 10);
            for &alg in Algorithm::ALL {
                let plan = schedule(alg, &topo, &m, &Options::default()).unwrap();
                for layout in [Layout::Padded, Layout::Packed] {
                    let opts = XmlOptions {
                        layout,
                        ..Default::default()
                    };
                    round_trip(&plan, &topo, &m, &opts);
                }
            }
        }
    }
}

/// `direct` with some blocks split, part of each relayed through a third
/// rank's scratch, and some extra dependencies between unrelated transfers.
fn relayed(topo: &Topology, m: &TrafficMatrix, seed: u64) -> Plan {
    let base = switchyard::compiler::sched::direct(topo, m);
    let mut rng = Rng::new(seed);
    let n = m.ranks();
    let mut plan = Plan::new("relay-test", n, topo.gpus_per_node());
    let mut scratch = vec![0u64; n];
    for t in base.transfers {
        if t.src == t.dst || t.bytes < 2 || n < 3 || !rng.chance(0.4) {
            let mut t = t;
            if !plan.transfers.is_empty() && rng.chance(0.1) {
                let dep = rng.range(0, plan.transfers.len() as u64) as u32;
                t.deps = Deps::from_slice(&[dep]);
            }
            plan.push(t);
            continue;
        }
        let cut = rng.range(1, t.bytes);
        let r = loop {
            let r = rng.range(0, n as u64) as u32;
            if r != t.src && r != t.dst {
                break r;
            }
        };
        plan.push(Transfer {
            bytes: cut,
            ..t.clone()
        });
        let off = scratch[r as usize];
        scratch[r as usize] += t.bytes - cut;
        let hop = |src: u32, dst: u32| path_between(topo, src as usize, dst as usize);
        let first = plan.push(Transfer {
            src: t.src,
            src_buf: Buffer::Input,
            src_off: t.src_off + cut,
            dst: r,
            dst_buf: Buffer::Scratch,
            dst_off: off,
            bytes: t.bytes - cut,
            path: hop(t.src, r),
            step: 0,
            deps: Deps::new(),
        });
        plan.push(Transfer {
            src: r,
            src_buf: Buffer::Scratch,
            src_off: off,
            dst: t.dst,
            dst_buf: Buffer::Output,
            dst_off: t.dst_off + cut,
            bytes: t.bytes - cut,
            path: hop(r, t.dst),
            step: 1,
            deps: Deps::from_slice(&[first]),
        });
    }
    for (r, &b) in scratch.iter().enumerate() {
        if b > 0 {
            plan.need_scratch(r, b);
        }
    }
    plan
}

#[test]
fn empty_and_diagonal_only_matrices() {
    let topo = Topology::preset("dgx-h100", 1, Some(4)).unwrap();
    let zero = TrafficMatrix::zeros(4);
    let plan = schedule(Algorithm::Direct, &topo, &zero, &Options::default()).unwrap();
    round_trip(&plan, &topo, &zero, &XmlOptions::default());
    let mut diag = TrafficMatrix::zeros(4);
    for r in 0..4 {
        diag.set(r, r, 100 * (r as u64 + 1));
    }
    let plan = schedule(Algorithm::Direct, &topo, &diag, &Options::default()).unwrap();
    round_trip(&plan, &topo, &diag, &XmlOptions::default());
}

#[test]
fn relays_through_scratch_on_2x8_and_4x8() {
    for nodes in [2, 4] {
        let topo = Topology::preset("dgx-h100", nodes, None).unwrap();
        let m = skewed(topo.ranks(), Pattern::Lognormal(1.0), 7, 32 << 10);
        let plan = relayed(&topo, &m, 11);
        verify_on(&plan, &m, &topo).unwrap();
        for layout in [Layout::Padded, Layout::Packed] {
            round_trip(
                &plan,
                &topo,
                &m,
                &XmlOptions {
                    layout,
                    ..Default::default()
                },
            );
        }
    }
}

#[test]
fn protocol_windows_and_forced_chunks() {
    let topo = Topology::preset("dgx-h100", 2, None).unwrap();
    let m = skewed(16, Pattern::Moe, 5, 0);
    let plan = schedule(Algorithm::Direct, &topo, &m, &Options::default()).unwrap();
    // A uniform file serves every size: its windows tile the sizes, LL up
    // to a, LL128 from a+1 to b, Simple from b+1.
    let uniform = TrafficMatrix::uniform(16, 64 << 10);
    let uplan = schedule(Algorithm::Direct, &topo, &uniform, &Options::default()).unwrap();
    let all = to_xml_windows(&uplan, &topo, &uniform, &XmlOptions::default()).unwrap();
    let protos: Vec<Protocol> = all.iter().map(|x| x.protocol).collect();
    assert_eq!(protos, [Protocol::LL, Protocol::LL128, Protocol::Simple]);
    assert_eq!(all[0].min_bytes, 0);
    assert_eq!(all[1].min_bytes, all[0].max_bytes + 1);
    assert_eq!(all[2].min_bytes, all[1].max_bytes + 1);
    assert_eq!(all[2].max_bytes, 0);
    for x in &all {
        check_executable(&x.text).unwrap();
        assert!(x.text.contains(&format!("proto=\"{}\"", x.protocol)));
    }
    // A skewed file serves its own buffer size only, whatever the protocol.
    for x in to_xml_windows(&plan, &topo, &m, &XmlOptions::default()).unwrap() {
        check_executable(&x.text).unwrap();
        assert_eq!((x.min_bytes, x.max_bytes), (x.buffer_bytes, x.buffer_bytes));
    }
    // Chosen by size: this matrix's buffer falls in exactly one window.
    let auto = to_xml(&plan, &topo, &m, &XmlOptions::default()).unwrap();
    assert!(auto.buffer_bytes >= auto.min_bytes);
    assert!(auto.max_bytes == 0 || auto.buffer_bytes <= auto.max_bytes);
    // A small forced chunk splits blocks into more steps of <= 71 chunks
    // than the base chunk (at most 4 x 71 chunks for the largest block;
    // the default may be finer where padding costs, `msccl::chunk`).
    let base = to_xml(
        &plan,
        &topo,
        &m,
        &XmlOptions {
            chunk_bytes: Some(switchyard::compiler::msccl::chunk::base_chunk_bytes(&m)),
            ..Default::default()
        },
    )
    .unwrap();
    let u = m.max_entry().div_ceil(400);
    let small = XmlOptions {
        chunk_bytes: Some(u),
        ..Default::default()
    };
    let x = to_xml(&plan, &topo, &m, &small).unwrap();
    assert_eq!(x.chunk_bytes, u);
    assert!(
        x.report.steps > base.report.steps,
        "the largest blocks take 6 steps, not 4"
    );
    assert!(x.text.lines().filter(|l| l.contains("<step ")).all(|l| {
        let cnt: u32 = l
            .split("cnt=\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        cnt <= 71
    }));
    check_executable(&x.text).unwrap();
    verify_on(&x.plan, &m, &topo).unwrap();
    // Too small a chunk for the offsets is refused with advice.
    let tiny = XmlOptions {
        chunk_bytes: Some(1),
        ..Default::default()
    };
    let e = to_xml(&plan, &topo, &m, &tiny).unwrap_err();
    // The caller chose it: bad input (the CLI exits 2).
    assert!(e.is_bad_input(), "{e}");
    let e = e.to_string();
    assert!(e.contains("try a larger --chunk-bytes"), "{e}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Any matrix on a small cluster, relayed or not, in either layout.
    #[test]
    fn any_small_plan_round_trips(
        nodes in 1usize..3,
        gpus in 2usize..5,
        seed in 0u64..1000,
        sigma in 0.0f64..2.5,
        zeros in 0usize..6,
        packed in any::<bool>(),
        // `Some(k)`: chunks of `ceil(max / k)` bytes, at most k per pair.
        chunks_per_max in prop_oneof![Just(None), (1u64..150).prop_map(Some)],
    ) {
        let topo = Topology::preset("dgx-h100", nodes, Some(gpus)).unwrap();
        let n = topo.ranks();
        let mut m = skewed(n, Pattern::Lognormal(sigma), seed, 3000);
        let mut rng = Rng::new(seed);
        for _ in 0..zeros {
            m.set(rng.range(0, n as u64) as usize, rng.range(0, n as u64) as usize, 0);
        }
        let plan = relayed(&topo, &m, seed);
        verify_on(&plan, &m, &topo).unwrap();
        let layout = if packed { Layout::Packed } else { Layout::Padded };
        let chunk = chunks_per_max.map(|k| m.max_entry().div_ceil(k).max(1));
        round_trip(&plan, &topo, &m, &XmlOptions { layout, chunk_bytes: chunk, ..Default::default() });
    }
}
