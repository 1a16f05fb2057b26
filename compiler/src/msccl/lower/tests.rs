//! Unit tests of the lowering and its parts.

use super::tbs::{elements_floor, over_elements};
use super::walks::{ancestors_on, OpGraph, Walks};
use super::*;
use crate::msccl::ops::ChunkOp;
use crate::msccl::MAX_STEPS_PER_TB;
use crate::sched::direct;
use crate::verify::verify_on;

#[allow(clippy::too_many_arguments)]
fn op(
    src: u32,
    src_buf: BufRef,
    src_off: u32,
    dst: u32,
    dst_off: u32,
    cnt: u32,
    deps: Vec<u32>,
    from: u32,
) -> ChunkOp {
    ChunkOp::test(src, src_off, dst, dst_off, cnt, from)
        .reading(src_buf)
        .after(deps, Vec::new())
}

/// The memo as it was, a `Vec` per walk: the reference `Walks` must
/// match, lists and cap alike.
fn ancestors_on_vec_memo(
    ops: &[ChunkOp],
    x: u32,
    g: u32,
    memo: &mut HashMap<u64, Vec<u32>>,
    cap: usize,
    out: &mut Vec<u32>,
) {
    let op = &ops[x as usize];
    if op.src == g || op.dst == g {
        out.push(x);
        return;
    }
    let key = u64::from(x) << 32 | u64::from(g);
    if let Some(v) = memo.get(&key) {
        out.extend_from_slice(v);
        return;
    }
    if memo.len() >= cap {
        return;
    }
    let mut v = Vec::new();
    for &y in &op.deps {
        ancestors_on_vec_memo(ops, y, g, memo, cap, &mut v);
    }
    v.sort_unstable();
    v.dedup();
    out.extend_from_slice(&v);
    memo.insert(key, v);
}

/// `cut_for_pacing` with its own walks.
fn cut_own(
    ops: &[ChunkOp],
    window: u32,
    release: Option<(&[TransferTime], f64)>,
    uncut: &[bool],
) -> Paced {
    cut_for_pacing(ops, &paced_waits(ops), window, release, uncut)
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
    /// Random dependency graphs over a few gpus, walked for random
    /// (operation, gpu) pairs in turn with one memo: the same lists
    /// (in the same order, appended after what `out` holds) and the
    /// same walks held as the `Vec`-per-walk memo, whatever the cap.
    #[test]
    fn walks_memo_matches_a_vec_per_walk(
        edges in proptest::collection::vec((0u32..6, 0u32..6, proptest::collection::vec(0u32..1000, 0..4)), 1..60),
        queries in proptest::collection::vec((0u32..1000, 0u32..6), 1..40),
        cap in 0usize..40,
    ) {
        let ops: Vec<ChunkOp> = edges
            .iter()
            .enumerate()
            .map(|(i, (s, d, deps))| {
                let deps = if i == 0 {
                    Vec::new()
                } else {
                    deps.iter().map(|&p| p % i as u32).collect()
                };
                op(*s, BufRef::Input, 0, *d, 0, 1, deps, i as u32)
            })
            .collect();
        let graph = OpGraph::new(&ops);
        let mut walks = Walks::new(ops.len());
        let mut vecs: HashMap<u64, Vec<u32>> = HashMap::new();
        let (mut a, mut b) = (vec![7u32], vec![7u32]);
        for &(x, g) in &queries {
            let x = x % ops.len() as u32;
            ancestors_on(&graph, x, g, &mut walks, cap, &mut a);
            ancestors_on_vec_memo(&ops, x, g, &mut vecs, cap, &mut b);
            proptest::prop_assert_eq!(&a, &b);
            proptest::prop_assert_eq!(walks.len(), vecs.len());
        }
    }
}

#[test]
fn cut_pieces_wait_only_for_their_own_data() {
    let ops = vec![
        // Gpu 0's scratch 0..2 from gpu 1, 2..10 from gpu 2.
        op(1, BufRef::Input, 0, 0, 0, 2, vec![], 0),
        op(2, BufRef::Input, 0, 0, 2, 8, vec![], 1),
        // A transfer into gpu 5, which the forward's receiver waits for.
        op(4, BufRef::Input, 0, 5, 0, 5, vec![], 2),
        // The forward of gpu 0's scratch 0..10 to gpu 5: a head of two
        // one-chunk steps (Simple's window) carries the receiver's wait.
        op(0, BufRef::Scratch, 0, 5, 5, 10, vec![0, 1, 2], 3),
    ];
    let paced = cut_own(&ops, 2, None, &[]);
    let fwd: Vec<&ChunkOp> = paced.ops.iter().filter(|o| o.from == 3).collect();
    assert_eq!(fwd.iter().map(|o| o.cnt).collect::<Vec<_>>(), vec![1, 1, 8]);
    // The head steps read chunks 0 and 1, written by operation 0 only:
    // they leave once those are there, not with the body's data.
    for h in &fwd[..2] {
        assert_eq!(h.deps, vec![0]);
        assert_eq!(h.recv_deps, vec![2]);
    }
    // The body reads chunks 2..10 (operation 1) and keeps the wait on
    // gpu 5's transfer; it does not wait for the head's data.
    assert_eq!(fwd[2].deps, vec![1, 2]);
    assert!(fwd[2].recv_deps.is_empty());
}

#[test]
fn transfers_of_an_uncut_gpu_are_written_whole() {
    let ops = || {
        vec![
            op(1, BufRef::Input, 0, 0, 0, 2, vec![], 0),
            op(2, BufRef::Input, 0, 0, 2, 8, vec![], 1),
            op(4, BufRef::Input, 0, 5, 0, 5, vec![], 2),
            // The forward into gpu 5 whose receiver waits for
            // operation 2: cut into a head of two steps and a body.
            op(0, BufRef::Scratch, 0, 5, 5, 10, vec![0, 1, 2], 3),
        ]
    };
    let cnts = |p: &Paced| -> Vec<u32> {
        p.ops
            .iter()
            .filter(|o| o.from == 3)
            .map(|o| o.cnt)
            .collect()
    };
    let cut = cut_own(&ops(), 2, None, &[]);
    assert_eq!(cnts(&cut), [1, 1, 8]);
    assert_eq!(cut.unheld, Some(0));
    // An uncut gpu elsewhere changes nothing.
    let mut uncut = vec![false; 6];
    uncut[3] = true;
    let other = cut_own(&ops(), 2, None, &uncut);
    assert_eq!(cnts(&other), [1, 1, 8]);
    assert_eq!(other.unheld, Some(0));
    // Gpu 5 uncut: the forward it receives stays one operation, and
    // its receiver's wait is counted as unheld.
    uncut[5] = true;
    let whole = cut_own(&ops(), 2, None, &uncut);
    assert_eq!(cnts(&whole), [10]);
    assert_eq!(whole.unheld, Some(1));
    assert_eq!(whole.steps, 0);
    assert!(whole.pinned.is_empty());
}

#[test]
fn a_chunk_missed_after_cuts_is_lowered_uncut_before_it_is_doubled() {
    // Up to 64 ranks (or no cuts asked): always doubled, as before.
    let mut r = Retry::new(false);
    assert_eq!([r.missed(true), r.missed(false)], [Next::Doubled; 2]);
    assert!(!r.uncut);
    // A miss before any cut (offsets): doubled, cut.
    let mut r = Retry::new(true);
    assert_eq!(r.missed(false), Next::Doubled);
    assert!(!r.uncut);
    // After cuts: the same chunk uncut; that fits or misses.
    assert_eq!(r.missed(true), Next::Uncut);
    assert!(r.uncut);
    // Missed uncut too: doubled, cut, and never uncut again.
    assert_eq!(r.missed(false), Next::Doubled);
    assert!(!r.uncut);
    assert_eq!([r.missed(true), r.missed(true)], [Next::Doubled; 2]);
    assert!(!r.uncut);
}

/// 2x8 DGX-H100, Zipf 1.2 of 32 KiB pairs: the matrix, its `fast` plan
/// and the plan's timeline as `to_xml` simulates it.
fn zipf_fast_2x8() -> (Topology, TrafficMatrix, Plan, Vec<TransferTime>) {
    let topo = Topology::preset("dgx-h100", 2, None).unwrap();
    let mut spec = crate::generate::TrafficSpec::new(16, crate::generate::Pattern::Zipf(1.2));
    spec.bytes = 32 << 10;
    let m = crate::generate::generate(&spec).unwrap();
    let plan = crate::sched::schedule(
        crate::sched::Algorithm::Fast,
        &topo,
        &m,
        &crate::sched::Options::default(),
    )
    .unwrap();
    let timeline = simulate(&topo, &plan, &timeline_options(16))
        .unwrap()
        .transfers;
    (topo, m, plan, timeline)
}

#[test]
fn an_uncut_retry_from_kept_operations_writes_the_file_a_fresh_one_does() {
    let (topo, m, plan, timeline) = zipf_fast_2x8();
    let opts = XmlOptions::default();
    let u = crate::msccl::chunk::base_chunk_bytes(&m);
    let mut laps = Laps::start("test");
    let pieces = Pieces::default();
    let inp = Inputs {
        plan: &plan,
        topo: &topo,
        traffic: &m,
        opts: &opts,
        timeline: &timeline,
        pieces: &pieces,
    };
    let mut lower = |uncut_all: bool, traced: Option<&mut Option<Traced>>| match lower_with(
        &inp,
        u,
        Variant {
            uncut_all,
            ..Variant::WINDOW
        },
        &mut laps,
        traced,
    ) {
        Ok(l) => l.x,
        Err(_) => panic!("a 2x8 file misses a limit"),
    };
    // A cut file that meets every limit keeps nothing for a retry.
    let mut slot = None;
    let cut = lower(false, Some(&mut slot));
    assert!(cut.pacing_steps > 0);
    assert!(slot.is_none());
    // What a cut lowering that missed keeps: its operations and walks.
    let k = (0..16)
        .map(|s| (0..16).map(|d| m.get(s, d).div_ceil(u) as u32).collect())
        .collect();
    let map = ChunkMap::new(k, opts.layout);
    let kept = |u: u64| {
        let Ok((ops, scratch)) = traced_ops(&inp, &map, u, &mut Laps::start("test")) else {
            panic!("a 2x8 plan traces");
        };
        let waits = Some(paced_waits(&ops));
        Some(Traced {
            u,
            ops,
            scratch,
            waits,
        })
    };
    let fresh = lower(true, None);
    assert_eq!(fresh.pacing_steps, 0);
    let mut slot = kept(u);
    let retry = lower(true, Some(&mut slot));
    assert!(slot.is_none(), "taken by the retry");
    assert_eq!(retry.text, fresh.text);
    assert_eq!(retry.unheld_deps, fresh.unheld_deps);
    assert!(fresh.unheld_deps > 0);
    // Kept for another chunk: not used (the file of this chunk's trace).
    let mut slot = kept(u * 2);
    assert_eq!(lower(true, Some(&mut slot)).text, fresh.text);
}

#[test]
fn gpus_nearly_full_before_the_cuts_are_uncut() {
    // Gpu 1 sends gpu 0 as many one-chunk operations as leave both
    // exactly at the threshold (1 + n + tbs + steps), then one more.
    let n = 4;
    let steps = UNCUT_ABOVE - 1 - n - UNCUT_ABOVE.div_ceil(MAX_STEPS_PER_TB);
    let mut ops = vec![ChunkOp::test(1, 0, 0, 0, 1, 0); steps];
    ops.push(ChunkOp::test(2, 0, 3, 0, 1, 1));
    assert_eq!(elements_floor(&ops, n, 1024)[..2], [UNCUT_ABOVE; 2]);
    assert!(uncut_gpus(&ops, n, 1024).is_empty());
    ops.push(ChunkOp::test(1, 0, 0, 0, 1, 0));
    assert_eq!(uncut_gpus(&ops, n, 1024), [true, true, false, false]);
}

#[test]
fn released_heads_wait_for_a_send_planned_lead_us_earlier() {
    let ops = vec![
        // Two earlier sends of gpu 0, planned at 0 and 15 us.
        op(0, BufRef::Input, 0, 6, 0, 4, vec![], 4),
        op(0, BufRef::Input, 4, 7, 0, 4, vec![], 5),
        // Gpu 0's scratch from gpus 1 and 2; a transfer into gpu 5.
        op(1, BufRef::Input, 0, 0, 0, 2, vec![], 0),
        op(2, BufRef::Input, 0, 0, 2, 8, vec![], 1),
        op(4, BufRef::Input, 0, 5, 0, 5, vec![], 2),
        // The forward to gpu 5, planned at 30 us: a head of two steps.
        op(0, BufRef::Scratch, 0, 5, 5, 10, vec![2, 3, 4], 3),
    ];
    let at = |start_us| TransferTime {
        start_us,
        end_us: start_us + 1.0,
    };
    let timeline = [at(0.0), at(0.0), at(0.0), at(30.0), at(0.0), at(15.0)];
    let heads = |release: Option<f64>| {
        let paced = cut_own(&ops, 2, release.map(|l| (&timeline[..], l)), &[]);
        let fwd: Vec<ChunkOp> = paced.ops.into_iter().filter(|o| o.from == 3).collect();
        assert_eq!(fwd.iter().map(|o| o.cnt).collect::<Vec<_>>(), vec![1, 1, 8]);
        // The body never gets the release wait.
        assert_eq!(fwd[2].deps, vec![3, 4]);
        let mut d = fwd[0].deps.clone();
        d.sort_unstable();
        assert_eq!(fwd[1].deps.len(), d.len());
        (d, paced.released)
    };
    // As before: the head waits only for its data.
    assert_eq!(heads(None), (vec![2], 0));
    // 20 us ahead: the send planned at 0 (the one at 15 is too late).
    assert_eq!(heads(Some(20.0)), (vec![0, 2], 1));
    // 10 us ahead: the latest send planned by 20 us, the one at 15.
    assert_eq!(heads(Some(10.0)), (vec![1, 2], 1));
    // Nothing planned 40 us ahead: no wait added.
    assert_eq!(heads(Some(40.0)), (vec![2], 0));
}

#[test]
fn direct_uniform_lowers_and_reads_back() {
    let topo = Topology::preset("dgx-h100", 2, Some(4)).unwrap();
    let m = TrafficMatrix::uniform(8, 4096);
    let plan = direct(&topo, &m);
    let x = to_xml(&plan, &topo, &m, &XmlOptions::default()).unwrap();
    assert!(x.text.starts_with("<algo name=\"switchyard direct layout=padded chunk_bytes=16 gpus_per_node=4\" proto=\"LL\""), "{}", &x.text[..200]);
    assert_eq!(x.nchunksperloop, 8 * 256);
    assert_eq!(x.count_bytes, 4096);
    assert!(x.report.warnings.is_empty(), "{:?}", x.report.warnings);
    verify_on(&x.plan, &m, &topo).unwrap();
    assert_eq!(x.plan.transfers.len(), plan.transfers.len());
    let back = crate::msccl::parse_xml(&x.text, "x.xml", Some(&m)).unwrap();
    verify_on(&back, &m, &topo).unwrap();
    crate::msccl::check_executable(&x.text).unwrap();
}

#[test]
fn simple_is_tried_only_for_an_over_file_of_a_protocol_chosen_by_size() {
    // A small skewed file: LL by size, its window its own size.
    let topo = Topology::preset("dgx-h100", 2, Some(4)).unwrap();
    let mut m = TrafficMatrix::uniform(8, 1000);
    m.set(1, 6, 77_777);
    let plan = direct(&topo, &m);
    let opts = XmlOptions::default();
    let x = to_xml(&plan, &topo, &m, &opts).unwrap();
    assert_ne!(x.protocol, Protocol::Simple);
    assert_eq!(x.min_bytes, x.max_bytes);
    let o = simple_candidates(&opts, &x, true, 8).unwrap();
    assert_eq!(o.protocol, Some(Protocol::Simple));
    assert_eq!((o.layout, o.pacing), (opts.layout, opts.pacing));
    // Within 3%, a protocol forced, a cluster too large to price, or a
    // file in Simple already: nothing to try.
    assert!(simple_candidates(&opts, &x, false, 8).is_none());
    let forced = XmlOptions {
        protocol: Some(x.protocol),
        ..opts.clone()
    };
    assert!(simple_candidates(&forced, &x, true, 8).is_none());
    let big = crate::msccl::chunk::MAX_RANKS_PRICED + 1;
    assert!(simple_candidates(&opts, &x, true, big).is_none());
    let simple = to_xml(&plan, &topo, &m, &o).unwrap();
    assert_eq!(simple.protocol, Protocol::Simple);
    assert!(simple_candidates(&opts, &simple, true, 8).is_none());
}

#[test]
fn skewed_direct_in_both_layouts() {
    let topo = Topology::preset("dgx-h100", 2, Some(4)).unwrap();
    let mut m = TrafficMatrix::uniform(8, 1000);
    m.set(1, 6, 77_777);
    m.set(2, 2, 0);
    m.set(5, 3, 0);
    m.set(7, 0, 1);
    let plan = direct(&topo, &m);
    for layout in [Layout::Padded, Layout::Packed] {
        let opts = XmlOptions {
            layout,
            ..Default::default()
        };
        let x = to_xml(&plan, &topo, &m, &opts).unwrap();
        verify_on(&x.plan, &m, &topo).unwrap();
        let r = crate::msccl::check_executable(&x.text).unwrap();
        assert_eq!(r.layout, layout);
        let back = crate::msccl::parse_xml(&x.text, "x.xml", Some(&m)).unwrap();
        verify_on(&back, &m, &topo).unwrap();
    }
}

#[test]
fn a_file_read_back_as_lowered_keeps_the_lowered_run() {
    let topo = Topology::preset("dgx-h100", 2, Some(4)).unwrap();
    let mut m = TrafficMatrix::uniform(8, 1000);
    m.set(1, 6, 77_777);
    m.set(5, 3, 0);
    let plan = direct(&topo, &m);
    let x = to_xml(&plan, &topo, &m, &XmlOptions::default()).unwrap();
    let parsed = parse_algo(&x.text, "x.xml").unwrap();
    // Read back, only the lines differ.
    assert_ne!(parsed, x.algo);
    assert!(same_elements(&parsed, &x.algo));
    // And the run of either encodes the same plan, the one kept.
    let file = "x.xml";
    let of = |a: &Algo| {
        let t = exec::run(a, file).unwrap();
        trace_to_plan(a, &t, Some(&m), Some(x.chunk_bytes), file)
            .unwrap()
            .0
    };
    let lowered = of(&x.algo);
    assert_eq!(lowered.transfers, of(&parsed).transfers);
    assert_eq!(lowered.transfers, x.plan.transfers);
    // Any attribute that differs is a different file.
    let mut other = parsed.clone();
    other.gpus[3].tbs[0].steps[0].cnt += 1;
    assert!(!same_elements(&other, &x.algo));
    let mut other = parsed.clone();
    other.gpus[7].tbs.last_mut().unwrap().chan += 1;
    assert!(!same_elements(&other, &x.algo));
    let mut other = parsed;
    other.max_bytes += 1;
    assert!(!same_elements(&other, &x.algo));
}

/// Every operation is a step on each gpu it touches; a connection
/// direction's (or a gpu's local) steps need a tb per 64; packing
/// leaves at least `limit` tbs.
#[test]
fn the_elements_floor_counts_steps_and_tbs() {
    let mut ops = vec![ChunkOp::test(0, 0, 1, 0, 1, 0); 3];
    ops.push(ChunkOp::test(1, 0, 0, 0, 1, 1));
    ops.extend(vec![ChunkOp::test(2, 0, 2, 0, 1, 2); 70]);
    // 1 + n + tbs + steps.
    assert_eq!(elements_floor(&ops, 4, 128), [11, 11, 77, 5]);
    assert_eq!(elements_floor(&ops, 4, 1), [10, 10, 76, 5]);
    assert_eq!(over_elements(&[5, MAX_NODES, 7]), None);
    let why = over_elements(&[5, MAX_NODES + 1, MAX_NODES + 2]).unwrap();
    assert!(
        why.starts_with("gpu 1 would hold at least 4097 elements"),
        "{why}"
    );
}

#[test]
fn the_timeline_is_exact_where_files_are_priced_and_grouped_above() {
    let exact = timeline_options(crate::msccl::chunk::MAX_RANKS_PRICED);
    assert_eq!(exact, SimOptions::default());
    assert_eq!(exact.tolerance_for(1), 0.0);
    let big = timeline_options(128);
    assert_eq!(big.tolerance_for(1), TIMELINE_TOLERANCE);
    assert!(big.group_arrivals);
    assert_eq!(big.network, SimOptions::default().network);
}

#[test]
fn a_replay_kept_across_chunks_traces_each_chunk_as_a_fresh_one() {
    // `fast` forwards through scratch: every chunk size traces its own
    // operations and slots from the one replay `lower_from` keeps.
    let (_, m, plan, timeline) = zipf_fast_2x8();
    let opts = XmlOptions::default();
    let base = crate::msccl::chunk::base_chunk_bytes(&m);
    let kept = Pieces::default();
    // Asked before any trace ran (a chunk refused before its trace):
    // nothing is kept.
    kept.keep();
    for (j, u) in [base, 2 * base, 4 * base, base].into_iter().enumerate() {
        let k = (0..16)
            .map(|s| (0..16).map(|d| m.get(s, d).div_ceil(u) as u32).collect())
            .collect();
        let map = ChunkMap::new(k, opts.layout);
        let traced = |p: &Pieces| {
            let Ok(x) = trace_chunks(&plan, &m, &map, u, &timeline, p) else {
                panic!("a 2x8 plan traces");
            };
            format!("{x:?}")
        };
        let reused = traced(&kept);
        // Kept from the second trace on: asked after the first.
        assert_eq!(kept.holds(), j > 0);
        kept.keep();
        assert_eq!(reused, traced(&Pieces::default()), "chunk {u}");
    }
    kept.clear();
    assert!(!kept.holds());
    // Until asked, a trace keeps nothing (a file that fits its first
    // chunk holds no more than before).
    let k = (0..16)
        .map(|s| (0..16).map(|d| m.get(s, d).div_ceil(base) as u32).collect())
        .collect();
    let map = ChunkMap::new(k, opts.layout);
    assert!(trace_chunks(&plan, &m, &map, base, &timeline, &kept).is_ok());
    assert!(!kept.holds());
}
