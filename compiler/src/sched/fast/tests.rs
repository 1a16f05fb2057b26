//! The emitter's tests: every plan verifies, stages are permutations, and
//! the measured behaviours of docs/algorithms.md (`fast`) hold.

use super::emit::{node_rate, Emitter, NodeStages, PlannerOptions, MIN_DEPTH, ROTATION_MARGIN};
use super::stages::{check_partial_permutation, Decomposer, StageChains, StagePair};
use crate::bound::cut_bound;
use crate::error::Error;
use crate::generate::{generate, Pattern, TrafficSpec};
use crate::plan::{Buffer, Path, Plan, Transfer};
use crate::sim::{simulate, Network, SimOptions};
use crate::topology::{IntraKind, IntraSpec, NicSpec, Topology, TopologySpec};
use crate::traffic::TrafficMatrix;
use crate::verify::verify_on;
use proptest::prelude::*;

fn topo(nodes: usize, gpus: usize, nics: usize, kind: IntraKind) -> Topology {
    let spec = TopologySpec {
        name: "t".into(),
        nodes,
        gpus_per_node: gpus,
        intra: Some(IntraSpec {
            kind,
            bandwidth_gbps: 450.0,
            latency_us: 1.0,
        }),
        nic: Some(NicSpec {
            per_node: nics,
            bandwidth_gbps: 50.0,
            latency_us: 3.0,
            gpu_nic: None,
        }),
        fabric: None,
        links: None,
    };
    Topology::from_spec(spec, "t").unwrap()
}

/// The node pairs of every inter-node transfer, by step.
fn rdma_stages(plan: &Plan, g: usize) -> Vec<StagePair> {
    plan.transfers
        .iter()
        .filter(|t| matches!(t.path, Path::Rdma { .. }))
        .map(|t| StagePair {
            stage: t.step,
            src_node: t.src / g as u32,
            dst_node: t.dst / g as u32,
            bytes: t.bytes,
        })
        .collect()
}

/// `fast`'s plan with sends of at most `chunk` bytes, checked by the
/// verifier.
fn verified_plan_with_chunk(t: &Topology, m: &TrafficMatrix, chunk: u64) -> Plan {
    let opts = PlannerOptions {
        chunk_bytes: Some(chunk),
        ..PlannerOptions::default()
    };
    let plan = Emitter::new(t, opts).unwrap().plan(m).unwrap();
    verify_on(&plan, m, t).unwrap();
    plan
}

/// The balancing moves of `plan` (NVLink copies into a scratch that a
/// send depends on) that start at once: no send gates them.
fn early_moves(plan: &Plan) -> Vec<usize> {
    let is_send = |x: &Transfer| matches!(x.path, Path::Rdma { .. });
    let mut feeds_a_send = vec![false; plan.transfers.len()];
    for x in plan.transfers.iter().filter(|x| is_send(x)) {
        for &d in &x.deps {
            feeds_a_send[d as usize] = true;
        }
    }
    (0..plan.transfers.len())
        .filter(|&j| {
            let x = &plan.transfers[j];
            feeds_a_send[j]
                && x.path == Path::Nvlink
                && (x.src_buf, x.dst_buf) == (Buffer::Input, Buffer::Scratch)
                && !x.deps.iter().any(|&d| is_send(&plan.transfers[d as usize]))
        })
        .collect()
}

/// The `auto_sweep` example's matrix of pattern `pattern` (as the CLI
/// spells it) drawn with `seed` for topology `t`.
fn sweep_traffic(t: &Topology, pattern: &str, seed: u64) -> TrafficMatrix {
    let mut ts = TrafficSpec::new(t.ranks(), pattern.parse::<Pattern>().unwrap());
    ts.seed = seed;
    ts.gpus_per_node = t.gpus_per_node();
    ts.bytes = 1 << 20;
    ts.moe.tokens_per_rank = 1024;
    generate(&ts).unwrap()
}

fn moe(ranks: usize, seed: u64) -> TrafficMatrix {
    let mut spec = TrafficSpec::new(ranks, Pattern::Zipf(1.0));
    spec.seed = seed;
    spec.moe.tokens_per_rank = 256;
    spec.moe.hidden = 128;
    generate(&spec).unwrap()
}

#[test]
fn fast_and_spray_verify_on_presets() {
    for (preset, nodes) in [
        ("dgx-h100", 2),
        ("dgx-h100", 4),
        ("mi300x", 3),
        ("dgx-a100", 1),
    ] {
        let t = Topology::preset(preset, nodes, None).unwrap();
        let m = moe(t.ranks(), 7);
        for staged in [true, false] {
            let opts = PlannerOptions {
                staged,
                ..PlannerOptions::default()
            };
            let mut p = Emitter::new(&t, opts).unwrap();
            let plan = p.plan(&m).unwrap();
            verify_on(&plan, &m, &t).unwrap_or_else(|e| panic!("{preset} {nodes}: {e}"));
            if staged {
                check_partial_permutation(&rdma_stages(&plan, 8), nodes).unwrap();
                check_partial_permutation(p.stages(), nodes).unwrap();
            }
        }
    }
}

#[test]
fn stages_stay_near_node_count() {
    let t = Topology::preset("dgx-h100", 8, None).unwrap();
    let m = moe(t.ranks(), 3);
    let mut p = Emitter::new(&t, PlannerOptions::default()).unwrap();
    let plan = p.plan(&m).unwrap();
    verify_on(&plan, &m, &t).unwrap();
    let k = p.stage_count() as usize;
    // About stages_per_node * (N - 1), far below the exact decomposition's N^2 - 2N + 2.
    assert!((7..=5 * 8).contains(&k), "{k} stages");
    assert_eq!(plan.steps(), k + 1); // forwards of the last stage run one step later
                                     // Every pair's bytes appear in the stages exactly.
    let mut moved = vec![0u64; 64];
    for s in p.stages() {
        moved[(s.src_node * 8 + s.dst_node) as usize] += s.bytes;
    }
    for a in 0..8 {
        for b in 0..8 {
            let want: u64 = if a == b {
                0
            } else {
                (0..8)
                    .flat_map(|i| (0..8).map(move |j| (a * 8 + i, b * 8 + j)))
                    .map(|(s, d)| m.get(s, d))
                    .sum()
            };
            assert_eq!(moved[a * 8 + b], want);
        }
    }
}

#[test]
fn sends_are_balanced_over_rails() {
    // Node 0's GPU 0 sends everything; its 4 NICs must share it evenly.
    let t = topo(2, 4, 4, IntraKind::Switch);
    let mut m = TrafficMatrix::zeros(8);
    m.set(0, 5, 4_000_000);
    m.set(1, 6, 8);
    let mut p = Emitter::new(&t, PlannerOptions::default()).unwrap();
    let plan = p.plan(&m).unwrap();
    verify_on(&plan, &m, &t).unwrap();
    let mut per_nic = [0u64; 4];
    for tr in &plan.transfers {
        if let Path::Rdma { nic } = tr.path {
            per_nic[nic as usize] += tr.bytes;
        }
    }
    assert_eq!(per_nic.iter().sum::<u64>(), 4_000_008);
    assert!(per_nic.iter().all(|&b| b == 1_000_002), "{per_nic:?}");
    // Without balancing, one NIC carries it all.
    let opts = PlannerOptions {
        balance: false,
        ..PlannerOptions::default()
    };
    let plan = Emitter::new(&t, opts).unwrap().plan(&m).unwrap();
    verify_on(&plan, &m, &t).unwrap();
    let on_nic0: u64 = plan
        .transfers
        .iter()
        .filter(|tr| tr.path == Path::Rdma { nic: 0 })
        .map(|tr| tr.bytes)
        .sum();
    assert_eq!(on_nic0, 4_000_000);
}

#[test]
fn tiny_messages_are_not_balanced() {
    let t = topo(2, 4, 4, IntraKind::Switch);
    let mut m = TrafficMatrix::zeros(8);
    m.set(0, 5, 4000); // 0.08 us on a NIC: not worth a 1 us NVLink hop
    let plan = Emitter::new(&t, PlannerOptions::default())
        .unwrap()
        .plan(&m)
        .unwrap();
    verify_on(&plan, &m, &t).unwrap();
    assert!(plan.transfers.iter().all(|tr| tr.src_buf != Buffer::Scratch
        || tr.path != Path::Nvlink
        || tr.dst_buf == Buffer::Output));
    let rdma: Vec<_> = plan
        .transfers
        .iter()
        .filter(|tr| matches!(tr.path, Path::Rdma { .. }))
        .collect();
    assert_eq!(rdma.len(), 1);
    assert_eq!(rdma[0].src, 0);
}

#[test]
fn balanced_pairs_are_sent_directly() {
    // Uniform traffic: every pair is balanced already, so every block
    // goes straight from its source GPU to its destination's output,
    // still in permutation stages.
    let t = topo(3, 4, 4, IntraKind::Switch);
    let mut m = TrafficMatrix::zeros(12);
    for s in 0..12 {
        for d in 0..12 {
            m.set(s, d, 3_000_000);
        }
    }
    let mut p = Emitter::new(&t, PlannerOptions::default()).unwrap();
    let plan = p.plan(&m).unwrap();
    verify_on(&plan, &m, &t).unwrap();
    assert!(!p.latency_bound());
    check_partial_permutation(&rdma_stages(&plan, 4), 3).unwrap();
    let rdma: Vec<&Transfer> = plan
        .transfers
        .iter()
        .filter(|tr| matches!(tr.path, Path::Rdma { .. }))
        .collect();
    assert!(rdma
        .iter()
        .all(|tr| tr.src_buf == Buffer::Input && tr.dst_buf == Buffer::Output));
    assert!(plan
        .transfers
        .iter()
        .all(|tr| tr.src_buf != Buffer::Scratch));
    // Lanes start at different destination GPUs.
    let firsts: Vec<u32> = (0..4)
        .map(|l| rdma.iter().find(|tr| tr.src == l).unwrap().dst)
        .collect();
    assert_eq!(firsts.len(), 4);
    assert!(
        firsts.iter().enumerate().all(|(l, &d)| d % 4 == l as u32),
        "{firsts:?}"
    );
}

#[test]
fn short_balanced_blocks_go_through_rail_aligned_lanes() {
    // The same uniform exchange with blocks shorter than one inter-node
    // latency on a NIC (but not latency-bound as a whole): direct lanes
    // would send latency-bound blocks fanning out to every NIC, so the
    // pairs are balanced and sent rail-aligned into scratch instead.
    let t = topo(3, 4, 4, IntraKind::Switch);
    let lane_rate = t.nic_bandwidth();
    let block = (0.5 * t.path_latency(0, 4) * lane_rate) as u64;
    let m = TrafficMatrix::uniform(12, block);
    let mut p = Emitter::new(&t, PlannerOptions::default()).unwrap();
    let plan = p.plan(&m).unwrap();
    verify_on(&plan, &m, &t).unwrap();
    assert!(!p.latency_bound());
    let rdma: Vec<&Transfer> = plan
        .transfers
        .iter()
        .filter(|tr| matches!(tr.path, Path::Rdma { .. }))
        .collect();
    assert!(!rdma.is_empty());
    assert!(rdma
        .iter()
        .all(|tr| tr.dst_buf == Buffer::Scratch && tr.src % 4 == tr.dst % 4));
}

#[test]
fn moves_are_cut_like_the_sends_they_feed() {
    // GPU 0's tail is one piece per carrier; each send moves only its
    // part of it, so a carrier's first send does not wait for the whole.
    let t = topo(2, 4, 4, IntraKind::Switch);
    let mut m = TrafficMatrix::zeros(8);
    m.set(0, 5, 4_000_000);
    let plan = verified_plan_with_chunk(&t, &m, 100_000);
    let moves: Vec<&Transfer> = plan
        .transfers
        .iter()
        .filter(|tr| tr.path == Path::Nvlink && tr.dst_buf == Buffer::Scratch)
        .collect();
    assert!(moves.len() >= 3 * 7, "{} moves", moves.len());
    assert!(moves.iter().all(|tr| tr.bytes <= 100_000));
    assert_eq!(moves.iter().map(|tr| tr.bytes).sum::<u64>(), 3_000_000);
}

#[test]
fn mesh_intra_node_traffic_waits_for_the_first_moves_on_its_link() {
    // 2x4 MI300X-like mesh: GPU 1 of each node is hot, towards the other
    // node (so its bytes are moved to the carriers) and inside its node
    // (a big block, partly relayed by the relief pass).
    let t = Topology::preset("mi300x", 2, Some(4)).unwrap();
    let mut m = TrafficMatrix::uniform(8, 200_000);
    for s in [1usize, 5] {
        for d in 0..8 {
            m.set(s, d, if d / 4 == s / 4 { 3_000_000 } else { 4_000_000 });
        }
    }
    let plan = verified_plan_with_chunk(&t, &m, 250_000);
    let is_move_or_hop = |x: &Transfer| {
        x.path == Path::Nvlink && x.src_buf == Buffer::Input && x.dst_buf == Buffer::Scratch
    };
    let early = early_moves(&plan);
    let mut relay_hop = vec![false; plan.transfers.len()];
    for x in &plan.transfers {
        if x.path == Path::Nvlink && x.src_buf == Buffer::Scratch && x.dst_buf == Buffer::Output {
            for &d in &x.deps {
                relay_hop[d as usize] |= is_move_or_hop(&plan.transfers[d as usize]);
            }
        }
    }
    let r = simulate(&t, &plan, &SimOptions::new(Network::Ideal)).unwrap();
    let mut checked = 0;
    for (i, x) in plan.transfers.iter().enumerate() {
        let block =
            x.path == Path::Nvlink && x.src_buf == Buffer::Input && x.dst_buf == Buffer::Output;
        if !(block || relay_hop[i]) {
            continue;
        }
        for &j in &early {
            let mv = &plan.transfers[j];
            if (mv.src, mv.dst) != (x.src, x.dst) {
                continue;
            }
            assert!(
                r.transfers[i].start_us >= r.transfers[j].end_us - 1e-9,
                "{x:?} starts before {mv:?} ends"
            );
            checked += 1;
        }
    }
    assert!(checked > 0);
    assert!(
        relay_hop.iter().any(|&h| h),
        "the relief pass relayed nothing"
    );
}

#[test]
fn switch_intra_node_traffic_waits_for_early_moves_not_for_sends() {
    // 2x4 NVSwitch nodes: GPU 1 of each node is hot towards the other
    // node, so its bytes are moved to the carriers first; every GPU also
    // has 1 MB for each GPU of its own node.
    let t = Topology::preset("dgx-h100", 2, Some(4)).unwrap();
    let mut m = TrafficMatrix::uniform(8, 1_000_000);
    for s in [1usize, 5] {
        for d in 0..8 {
            if d / 4 != s / 4 {
                m.set(s, d, 4_000_000);
            }
        }
    }
    let plan = verified_plan_with_chunk(&t, &m, 250_000);
    let is_send = |x: &Transfer| matches!(x.path, Path::Rdma { .. });
    let early = early_moves(&plan);
    assert!(!early.is_empty());
    let r = simulate(&t, &plan, &SimOptions::new(Network::Ideal)).unwrap();
    // The end of each GPU's first inter-node send.
    let mut first_send_end = [f64::INFINITY; 8];
    for (i, x) in plan.transfers.iter().enumerate() {
        let s = x.src as usize;
        if is_send(x) && first_send_end[s].is_infinite() {
            first_send_end[s] = r.transfers[i].end_us;
        }
    }
    let (mut checked, mut ahead_of_sends) = (0, 0);
    for (i, x) in plan.transfers.iter().enumerate() {
        if !(x.path == Path::Nvlink && x.src_buf == Buffer::Input && x.dst_buf == Buffer::Output) {
            continue;
        }
        // A block shares the sending GPU's NVLink egress with its moves
        // out, and the receiving GPU's ingress with its moves in.
        for &j in &early {
            let mv = &plan.transfers[j];
            if mv.src == x.src || mv.dst == x.dst {
                assert!(
                    r.transfers[i].start_us >= r.transfers[j].end_us - 1e-9,
                    "{x:?} starts before {mv:?} ends"
                );
                checked += 1;
            }
        }
        if r.transfers[i].start_us < first_send_end[x.src as usize] {
            ahead_of_sends += 1;
        }
    }
    assert!(checked > 0);
    // Blocks no longer wait for their GPU's first send: some start
    // before it lands.
    assert!(ahead_of_sends > 0, "every block waited for a send");
}

#[test]
fn mesh_lanes_without_moved_bytes_end_on_their_own_receiver() {
    // 2x4 mesh. GPU 2 sends most of node 0's bytes to node 1 (its lane
    // gives its excess away and gathers nothing): a small block to GPU
    // 6, the GPU its lane lands on, early in its row, and a big one to
    // GPU 7 after it. The lane's chunks start at the chunk that holds
    // the end of the block for GPU 6, so its last send (the second half
    // of its first chunk) carries bytes that need no forward over a
    // link. Rotated by lane index instead, it started (and ended) in
    // the block for GPU 7.
    let t = Topology::preset("mi300x", 2, Some(4)).unwrap();
    let mut m = TrafficMatrix::uniform(8, 200_000);
    m.set(2, 4, 50_000);
    m.set(2, 5, 50_000);
    m.set(2, 6, 1_000_000);
    m.set(2, 7, 6_000_000);
    let plan = verified_plan_with_chunk(&t, &m, 250_000);
    let moved_in = plan
        .transfers
        .iter()
        .any(|x| x.dst == 2 && x.path == Path::Nvlink && x.dst_buf == Buffer::Scratch);
    assert!(!moved_in, "GPU 2's lane gathers nothing");
    let last = (0..plan.transfers.len())
        .rev()
        .find(|&i| {
            let x = &plan.transfers[i];
            x.src == 2 && matches!(x.path, Path::Rdma { .. })
        })
        .unwrap() as u32;
    assert_eq!(plan.transfers[last as usize].dst, 6);
    let forwards: Vec<&Transfer> = plan
        .transfers
        .iter()
        .filter(|x| x.deps.as_slice().contains(&last))
        .collect();
    assert!(
        forwards.iter().any(|x| x.path == Path::Local && x.dst == 6),
        "{forwards:?}"
    );
}

#[test]
fn planner_reuse_gives_the_same_plans() {
    let t = Topology::preset("dgx-h100", 4, Some(4)).unwrap();
    let (m1, m2) = (moe(16, 1), moe(16, 2));
    let mut p = Emitter::new(&t, PlannerOptions::default()).unwrap();
    let mut plan = Plan::new("", 0, 0);
    p.plan_into(&m1, &mut plan).unwrap();
    p.plan_into(&m2, &mut plan).unwrap();
    let fresh = Emitter::new(&t, PlannerOptions::default())
        .unwrap()
        .plan(&m2)
        .unwrap();
    assert_eq!(plan, fresh);
    verify_on(&plan, &m2, &t).unwrap();
}

#[test]
fn a_latency_bound_plan_reports_its_own_chunk_and_depth() {
    let t = topo(2, 4, 4, IntraKind::Switch);
    let mut big = TrafficMatrix::zeros(8);
    for (s, d) in (0..8).flat_map(|s| (0..8).map(move |d| (s, d))) {
        big.set(s, d, (1 << 20) + 4096 * (s * d) as u64);
    }
    let mut tiny = TrafficMatrix::zeros(8);
    tiny.set(0, 5, 4000);
    let mut p = Emitter::new(&t, PlannerOptions::default()).unwrap();
    let mut plan = Plan::new("", 0, 0);
    p.plan_into(&big, &mut plan).unwrap();
    let (chunk, depth) = (p.chunk_bytes(), p.pipeline_depth());
    assert!(!p.latency_bound() && chunk < u64::MAX && depth < u32::MAX);
    p.plan_into(&tiny, &mut plan).unwrap();
    assert!(p.latency_bound());
    assert_eq!((p.chunk_bytes(), p.pipeline_depth()), (u64::MAX, u32::MAX));
    p.plan_into(&big, &mut plan).unwrap();
    assert_eq!((p.chunk_bytes(), p.pipeline_depth()), (chunk, depth));
}

#[test]
fn one_nic_and_few_peers_send_everything_at_once() {
    for (nodes, merged) in [(5, true), (6, false)] {
        let t = topo(nodes, 4, 1, IntraKind::Switch);
        let m = moe(nodes * 4, 7);
        let mut p = Emitter::new(&t, PlannerOptions::default()).unwrap();
        let plan = p.plan(&m).unwrap();
        verify_on(&plan, &m, &t).unwrap();
        assert_eq!(p.merged(), merged, "{nodes} nodes");
        assert!(!p.latency_bound());
        if merged {
            // `direct`'s transfers: one per block, no relay, no chain.
            let d = crate::sched::direct(&t, &m);
            assert_eq!(plan.transfers, d.transfers);
            assert!(plan.scratch.is_empty());
        } else {
            assert!(plan.transfers.iter().any(|x| !x.deps.is_empty()));
        }
    }
    // Two NICs: which GPU holds the bytes matters, so it stays staged.
    let t = topo(3, 4, 2, IntraKind::Switch);
    let mut p = Emitter::new(&t, PlannerOptions::default()).unwrap();
    p.plan(&moe(12, 7)).unwrap();
    assert!(!p.merged());
}

#[test]
fn only_even_stages_of_direct_pairs_take_the_shallower_pipeline() {
    // One GPU per node: every pair is direct, skewed or not.
    let t = topo(8, 1, 1, IntraKind::Switch);
    let mut p = Emitter::new(&t, PlannerOptions::default()).unwrap();
    p.plan(&TrafficMatrix::uniform(8, 1 << 20)).unwrap();
    assert!(p.stage_count() > 1 && p.stages_are_even());
    assert_eq!(p.pipeline_depth(), 3);
    let mut spec = TrafficSpec::new(8, Pattern::Lognormal(0.5));
    spec.seed = 3;
    let m = generate(&spec).unwrap();
    let plan = p.plan(&m).unwrap();
    verify_on(&plan, &m, &t).unwrap();
    assert!(!p.stages_are_even());
    assert_eq!(p.pipeline_depth(), MIN_DEPTH);
}

#[test]
fn latency_scale_sends_fill_the_binding_nic() {
    // 2x8 hotspot at 64 KB per pair: the chunks are set by the latency
    // bound and the lanes of the hot pair carry unequal bytes; counted
    // in sends, the windows held light sends and the NICs of the
    // binding node idled (1.263 of the bound; 1.095 counted in bytes).
    let t = Topology::preset("dgx-h100", 2, None).unwrap();
    let mut spec = TrafficSpec::new(t.ranks(), Pattern::Hotspot(0.3));
    spec.seed = 1;
    spec.set_mean_pair_bytes(65536);
    let m = generate(&spec).unwrap();
    let mut planner = Emitter::new(&t, PlannerOptions::default()).unwrap();
    let plan = planner.plan(&m).unwrap();
    assert!(planner.unit > 0, "windows count bytes here");
    verify_on(&plan, &m, &t).unwrap();
    let bound = cut_bound(&t, &m).best_us();
    let ratio = simulate(&t, &plan, &SimOptions::new(Network::Ideal))
        .unwrap()
        .completion_us
        / bound;
    assert!(ratio < 1.15, "{ratio}");
    // Chunks set by the NVLink hop keep counting sends.
    spec.set_mean_pair_bytes(4 << 20);
    planner.plan(&generate(&spec).unwrap()).unwrap();
    assert_eq!(planner.unit, 0);
}

#[test]
fn stages_beat_spray_under_congestion() {
    let t = Topology::preset("dgx-h100", 8, Some(2)).unwrap();
    let mut spec = TrafficSpec::new(16, Pattern::Zipf(1.0));
    spec.moe.tokens_per_rank = 2048;
    spec.moe.hidden = 1024;
    let m = generate(&spec).unwrap();
    let bound = cut_bound(&t, &m).cut_us;
    let run = |staged, net| {
        let opts = PlannerOptions {
            staged,
            ..PlannerOptions::default()
        };
        let plan = Emitter::new(&t, opts).unwrap().plan(&m).unwrap();
        simulate(&t, &plan, &SimOptions::uncalibrated(net))
            .unwrap()
            .completion_us
            / bound
    };
    let fast = run(true, Network::Stress);
    let spray = run(false, Network::Stress);
    let direct = simulate(
        &t,
        &crate::sched::direct(&t, &m),
        &SimOptions::uncalibrated(Network::Stress),
    )
    .unwrap()
    .completion_us
        / bound;
    eprintln!("fast {fast} spray {spray} direct {direct}");
    assert!(fast < 1.3, "fast {fast}");
    assert!(
        fast < spray && fast < direct,
        "fast {fast} spray {spray} direct {direct}"
    );
}

#[test]
fn rejects_links_topologies_and_wrong_sizes() {
    let text = r#"{"name":"ring","nodes":2,"gpus_per_node":1,"links":[
        {"from":"gpu0","to":"gpu1","bandwidth_GBps":10,"bidirectional":true}]}"#;
    let t = Topology::from_json_str(text, "ring.json").unwrap();
    let e = Emitter::new(&t, PlannerOptions::default()).unwrap_err();
    assert!(matches!(e, Error::Unsupported { .. }), "{e}");
    let t = Topology::preset("dgx-h100", 2, None).unwrap();
    let mut p = Emitter::new(&t, PlannerOptions::default()).unwrap();
    let e = p.plan(&TrafficMatrix::zeros(4)).unwrap_err();
    assert!(e.is_bad_input(), "{e}");
}

#[test]
fn the_sends_in_flight_at_the_end_are_tapered() {
    let t = topo(2, 4, 4, IntraKind::Switch);
    let mut p = Emitter::new(&t, PlannerOptions::default()).unwrap();
    let whole: Vec<(u64, u64)> = (0..5).map(|k| (k * 100_000, (k + 1) * 100_000)).collect();
    p.depth = 3;
    p.chunks = whole.clone();
    p.taper_last_chunks();
    // The first two sends stay; each of the last three (one per send in
    // flight) goes as a half and two quarters; nothing is lost.
    assert_eq!(p.chunks[..2], whole[..2]);
    let sizes: Vec<u64> = p.chunks[2..].iter().map(|&(lo, hi)| hi - lo).collect();
    assert_eq!(sizes, [50_000, 25_000, 25_000].repeat(3));
    assert!(p.chunks.windows(2).all(|w| w[0].1 == w[1].0));
    assert_eq!((p.chunks[0].0, p.chunks.last().unwrap().1), (0, 500_000));
    // Without chains (`spray`) only the last send is cut.
    p.depth = u32::MAX;
    p.chunks = whole.clone();
    p.taper_last_chunks();
    assert_eq!(p.chunks.len(), 7);
    // Fewer sends than the depth: all of them.
    p.depth = 8;
    p.chunks = whole[..2].to_vec();
    p.taper_last_chunks();
    assert_eq!(p.chunks.len(), 6);
}

#[test]
fn explicit_depth_one_chains_every_stage() {
    let t = Topology::preset("dgx-h100", 4, Some(2)).unwrap();
    let m = moe(8, 5);
    let opts = PlannerOptions {
        pipeline_depth: Some(1),
        ..PlannerOptions::default()
    };
    let mut p = Emitter::new(&t, opts).unwrap();
    let plan = p.plan(&m).unwrap();
    verify_on(&plan, &m, &t).unwrap();
    // A send waits only for a send of the same GPU or into the same GPU
    // (the chains), never for a later stage.
    let mut chained = 0;
    for tr in plan
        .transfers
        .iter()
        .filter(|t| matches!(t.path, Path::Rdma { .. }))
    {
        for &d in &tr.deps {
            let dep = &plan.transfers[d as usize];
            if matches!(dep.path, Path::Rdma { .. }) {
                assert!(dep.src == tr.src || dep.dst == tr.dst, "{dep:?} -> {tr:?}");
                assert!(dep.step <= tr.step);
                chained += 1;
            }
        }
    }
    assert!(chained > 0);
}

fn arb_case() -> impl Strategy<Value = (usize, usize, usize, bool, Vec<u64>)> {
    (1usize..=4, 1usize..=4, 1usize..=4, any::<bool>()).prop_flat_map(|(n, g, p, mesh)| {
        let r = n * g;
        let cell = prop_oneof![3 => Just(0u64), 3 => 0u64..64, 2 => 0u64..5_000_000];
        (
            Just(n),
            Just(g),
            Just(p),
            Just(mesh),
            prop::collection::vec(cell, r * r),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]
    #[test]
    fn every_plan_verifies_and_stages_are_permutations(
        (n, g, p, mesh, cells) in arb_case(),
        staged in any::<bool>(),
        depth in prop::option::of(1u32..4),
        chunk in prop::option::of(1u64..200_000),
    ) {
        let kind = if mesh { IntraKind::Mesh } else { IntraKind::Switch };
        let t = topo(n, g, p, kind);
        let r = n * g;
        let m = TrafficMatrix::from_rows(cells.chunks(r).map(<[u64]>::to_vec).collect());
        let opts = PlannerOptions {
            staged,
            pipeline_depth: depth,
            chunk_bytes: chunk,
            ..PlannerOptions::default()
        };
        let mut planner = Emitter::new(&t, opts).unwrap();
        let plan = planner.plan(&m).unwrap();
        let stats = verify_on(&plan, &m, &t);
        prop_assert!(stats.is_ok(), "{:?}", stats);
        let bound = cut_bound(&t, &m).cut_us;
        for net in [Network::Ideal, Network::Congested] {
            let done = simulate(&t, &plan, &SimOptions::uncalibrated(net)).unwrap().completion_us;
            prop_assert!(done >= bound * (1.0 - 1e-9), "{net}: {done} < bound {bound}");
        }
        if staged && !planner.merged() {
            prop_assert!(check_partial_permutation(&rdma_stages(&plan, g), n).is_ok());
            prop_assert!(check_partial_permutation(planner.stages(), n).is_ok());
        }
    }
}

/// Planned for the calibrated network (3 us per message), `fast` sends
/// fewer, larger messages and finishes sooner there than its line-rate
/// plan; its stages stay permutations and the plan verifies.
#[test]
fn per_message_cost_coarsens_the_sends() {
    let t = Topology::preset("dgx-h100", 3, Some(4)).unwrap();
    let mut spec = TrafficSpec::new(t.ranks(), Pattern::Zipf(1.0));
    spec.seed = 3;
    spec.gpus_per_node = 4;
    spec.moe.tokens_per_rank = 1024;
    let m = generate(&spec).unwrap();
    let cal = SimOptions::new(Network::Calibrated);
    let ideal_opts = PlannerOptions::default();
    let cal_opts = PlannerOptions::for_sim(&cal);
    assert_eq!(cal_opts.per_message_us, cal.calibration.per_message_us);
    assert_eq!(PlannerOptions::for_network(Network::Ideal), ideal_opts);
    let sends = |p: &Plan| {
        let mut per_gpu = vec![0usize; t.ranks()];
        for x in p
            .transfers
            .iter()
            .filter(|x| matches!(x.path, Path::Rdma { .. }))
        {
            per_gpu[x.src as usize] += 1;
        }
        per_gpu.into_iter().max().unwrap_or(0)
    };
    let mut line = Emitter::new(&t, ideal_opts).unwrap();
    let mut coarse = Emitter::new(&t, cal_opts).unwrap();
    let (a, b) = (line.plan(&m).unwrap(), coarse.plan(&m).unwrap());
    verify_on(&b, &m, &t).unwrap();
    check_partial_permutation(&rdma_stages(&b, 4), 3).unwrap();
    assert!(
        coarse.chunk > line.chunk,
        "{} vs {}",
        coarse.chunk,
        line.chunk
    );
    assert!(
        sends(&b) < sends(&a),
        "{} vs {} sends",
        sends(&b),
        sends(&a)
    );
    let time = |p: &Plan| simulate(&t, p, &cal).unwrap().completion_us;
    assert!(time(&b) < time(&a), "{} vs {} us", time(&b), time(&a));
    // A negative or non-finite cost is refused.
    for bad in [-1.0, f64::NAN] {
        let opts = PlannerOptions {
            per_message_us: bad,
            ..PlannerOptions::default()
        };
        assert!(matches!(
            Emitter::new(&t, opts),
            Err(Error::Unsupported { .. })
        ));
    }
}

/// What a rank's program reads of the lanes ([`Emitter::balance_rank`]:
/// its node's row and column in full, lane `rail` of every other pair, and
/// each GPU's first slice) is the whole plan's (`balance`,
/// `layout_scratch`, `first_slices`), field for field; and so is the rank's
/// scratch size. Pieces are compared by content (their indices differ:
/// the rank keeps only its node's).
fn rank_lanes_match_the_whole(t: &Topology, m: &TrafficMatrix, opts: &PlannerOptions) -> usize {
    use super::blocks::{RankBuffers, WholeBlocks};
    use super::rank_state::{rank_lane_index, RankPair};
    use crate::rank::{LaneSums, LocalTraffic};
    let (nn, g) = (t.nodes(), t.gpus_per_node());
    let mut whole = Emitter::new(t, opts.clone()).unwrap();
    let mut w = WholeBlocks::default();
    whole.offsets(m, &mut w);
    whole.balance(&w);
    let mut scratch = Vec::new();
    whole.layout_scratch(&mut scratch);
    whole.decompose();
    whole.prepare_sends();
    whole.first_slices();
    let mut e = Emitter::new(t, opts.clone()).unwrap();
    let mut bufs = RankBuffers::default();
    // Each node's lanes from what its GPUs send each node (its ranks' own
    // rows), for the sums a job would gather.
    let parts: Vec<_> = (0..nn)
        .map(|a| {
            let lt = LocalTraffic::from_matrix(m, a * g, t).unwrap();
            let to_nodes = &lt.node_splits.as_ref().unwrap().to_nodes;
            assert_eq!(lt.node_sends(), to_nodes[a * g * nn..(a + 1) * g * nn]);
            e.node_lanes(a, &lt.node_sends())
        })
        .collect();
    // Ranks whose pairs were also read from the rotation's structure.
    let mut rotated = 0;
    for (rank, with_sums) in (0..nn * g).flat_map(|r| [(r, false), (r, true)]) {
        let (node, rail) = (rank / g, rank % g);
        let lt = LocalTraffic::from_matrix(m, rank, t).unwrap();
        let splits = lt.node_splits.as_ref().unwrap();
        e.node_bytes.clone_from(&lt.node_bytes);
        e.inter_blocks = splits.inter_blocks;
        let v = bufs.view(&lt, Some(splits));
        let sums = with_sums.then(|| LaneSums::assemble(&parts, rank, nn, g).unwrap());
        let got = e.balance_rank(&v, node, rail, sums.as_ref(), None, false);
        assert_eq!(e.all_direct, whole.all_direct);
        let Some(got) = got else {
            continue;
        };
        assert_eq!(got, scratch.get(rank).copied().unwrap_or(0), "rank {rank}");
        for a in 0..nn {
            // A node's lanes to itself are empty and never read.
            for b in (0..nn).filter(|&b| b != a) {
                let lanes = if a == node || b == node {
                    0..g
                } else {
                    rail..rail + 1
                };
                for l in lanes {
                    let x = e.lanes[rank_lane_index(nn, g, node, rail, a, b, l)];
                    let y = whole.lanes[whole.lane_index(a, b, l)];
                    let pieces = |e: &Emitter, x: &super::balance::Lane| {
                        e.pieces[x.pieces_start as usize..x.pieces_end as usize].to_vec()
                    };
                    let mine = a == node || b == node;
                    assert_eq!(
                        (x.own, x.gathered, x.recv_base, x.gather_base, x.direct),
                        (y.own, y.gathered, y.recv_base, y.gather_base, y.direct),
                        "rank {rank}, lane {l} of ({a}, {b})"
                    );
                    if mine {
                        assert_eq!(pieces(&e, &x), pieces(&whole, &y), "rank {rank}");
                    }
                }
            }
        }
        // Given the sums, lane `rail` of the other pairs read from them
        // (`lazy`) is the lane kept, field for field.
        if let Some(sums) = &sums {
            let kept: Vec<_> = e.lanes.clone();
            let again = e.balance_rank(&v, node, rail, Some(sums), None, true);
            assert_eq!(again, Some(got));
            assert_eq!(e.lanes.len(), 2 * nn * g);
            assert_eq!(e.lanes[..], kept[..2 * nn * g], "rank {rank}");
            // Every pair away from the node as a chain pair, placed in an
            // order that is not the rows' (every receiver first).
            let others: Vec<RankPair> = (0..nn)
                .rev()
                .flat_map(|b| (0..nn).map(move |a| (a, b)))
                .filter(|&(a, b)| a != node && b != node && b != a)
                .map(|(a, b)| RankPair {
                    pair: StagePair {
                        stage: 0,
                        src_node: a as u32,
                        dst_node: b as u32,
                        bytes: 1,
                    },
                    ..RankPair::default()
                })
                .collect();
            e.place_rail_lanes(sums, node, &others, |_| true).unwrap();
            assert_eq!(e.rail_lanes.chain.len(), others.len());
            for (x, p) in e.rail_lanes.chain.iter().zip(&others) {
                let (a, b) = (p.pair.src_node as usize, p.pair.dst_node as usize);
                let y = kept[rank_lane_index(nn, g, node, rail, a, b, rail)];
                assert!(!y.direct);
                assert_eq!(x.total, e.node_bytes[a * nn + b]);
                assert_eq!(
                    (x.own, x.len, x.recv_base),
                    (y.own, y.len(), y.recv_base),
                    "rank {rank}, lane {rail} of ({a}, {b}) from the sums"
                );
            }
            e.balance_rank(&v, node, rail, Some(sums), None, false);
        }
        e.decompose();
        e.prepare_sends();
        e.first_slices_rank(&v, node, rail);
        assert_eq!(e.first_slice, whole.first_slice, "rank {rank}");
        // The stage pairs the rank emits, by its own pairs and their
        // chains' windows, are those the pass over every pair with a ring
        // per chain picks (run twice: the buffers reused).
        let mut rp = super::rank_state::RankPairs::default();
        let keyed = |rp: &super::rank_state::RankPairs| -> Vec<(u32, u64)> {
            rp.pairs.iter().map(|x| (x.key, x.before)).collect()
        };
        let rings = e.rank_pairs_by_rings(node, rail);
        for _ in 0..2 {
            e.rank_pairs(node, rail, &mut rp, &[]);
            assert_eq!(keyed(&rp), rings, "rank {rank}");
        }
        // Where the stages are the chunked rotation, the same pairs read
        // piece by piece (keys are stage numbers: mapped back to indices).
        let (depth, unit) = (e.depth, e.unit);
        e.decompose_as(true);
        if e.rotated_rank && e.window_back() <= super::rank::MAX_WINDOW {
            (e.depth, e.unit) = (depth, unit);
            e.last_pairs();
            for _ in 0..2 {
                e.rank_pairs_rotated(node, rail, &mut rp, &[]);
                let got: Vec<(u32, u64)> = rp
                    .pairs
                    .iter()
                    .map(|x| (e.rotation.index_of(&e.node_bytes, &x.pair) as u32, x.before))
                    .collect();
                assert_eq!(got, rings, "rank {rank}, rotated");
                assert!(rp.pairs.iter().all(|x| x.key == x.pair.stage));
            }
            rotated += 1;
            e.decompose();
        }
        // The rank's own first slice from its node's lanes alone (what it
        // contributes to every rank's stage inputs).
        let lens = &parts[node].len[rail * nn..(rail + 1) * nn];
        let own = e.first_slice_of(&lt.node_bytes, node, lens);
        assert_eq!(
            own, whole.first_slice[rank],
            "rank {rank}'s own first slice"
        );
    }
    rotated
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn a_ranks_lanes_are_the_whole_plans(
        (n, g, p, _mesh, cells) in arb_case(),
        balance in any::<bool>(),
        per_message in any::<bool>(),
    ) {
        let t = topo(n, g, p, IntraKind::Switch);
        let r = n * g;
        let m = TrafficMatrix::from_rows(cells.chunks(r).map(<[u64]>::to_vec).collect());
        let opts = PlannerOptions {
            balance,
            per_message_us: if per_message { 3.0 } else { 0.0 },
            ..PlannerOptions::default()
        };
        rank_lanes_match_the_whole(&t, &m, &opts);
    }
}

/// From `CHUNKED_ROTATION_NODES` nodes on: the chunked rotation read
/// piece by piece gives a rank the pairs the written list does, with
/// count windows and byte windows (decode-size blocks), shallow and deep
/// pipelines.
#[test]
fn a_ranks_lanes_are_the_whole_plans_on_the_chunked_rotation() {
    let nodes = super::emit::CHUNKED_ROTATION_NODES;
    let t = topo(nodes, 2, 2, IntraKind::Switch);
    let mut cut = 0;
    for (scale, depth) in [
        (1 << 20, None),
        (2048, None),
        (1 << 16, Some(1)),
        (1 << 16, Some(3)),
    ] {
        // Skewed: every seventh GPU receives eight times as much.
        let r = nodes * 2;
        let m = TrafficMatrix::from_rows(
            (0..r)
                .map(|s| {
                    (0..r)
                        .map(|d| {
                            let hot = if d % 7 == 0 { 8 } else { 1 };
                            scale * (1 + (s as u64 * 31 + d as u64 * 17) % 23) * hot
                        })
                        .collect()
                })
                .collect(),
        );
        let opts = PlannerOptions {
            pipeline_depth: depth,
            ..PlannerOptions::default()
        };
        let rotated = rank_lanes_match_the_whole(&t, &m, &opts);
        assert_eq!(rotated, 2 * t.ranks(), "scale {scale}, depth {depth:?}");
        let mut e = Emitter::new(&t, opts).unwrap();
        e.plan(&m).unwrap();
        cut += usize::from(e.stages().len() > nodes * (nodes - 1));
    }
    assert!(cut > 0, "no pair was cut into pieces");
}

#[test]
fn a_ranks_lanes_are_the_whole_plans_on_moe_traffic() {
    for (nodes, nics) in [(6, 8), (5, 4), (7, 2)] {
        let t = topo(nodes, 8, nics, IntraKind::Switch);
        let m = moe(nodes * 8, nodes as u64);
        rank_lanes_match_the_whole(&t, &m, &PlannerOptions::default());
    }
    // Windows of 2 to 64 slots, and a pipeline too deep for them (every
    // slice of the rail); `spray` (no chains).
    let t = topo(6, 8, 8, IntraKind::Switch);
    let m = moe(48, 6);
    for depth in [1, 2, 7, 32, 33] {
        let opts = PlannerOptions {
            pipeline_depth: Some(depth),
            ..PlannerOptions::default()
        };
        rank_lanes_match_the_whole(&t, &m, &opts);
    }
    let spray = PlannerOptions {
        staged: false,
        ..PlannerOptions::default()
    };
    rank_lanes_match_the_whole(&t, &m, &spray);
}

/// A node matrix of log-normal pairs (`sigma` about the deviation of their
/// log), from a seed.
fn lognormal_node_matrix(n: usize, seed: u64, sigma: f64) -> Vec<u64> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut uniform = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 11) as f64 / (1u64 << 53) as f64
    };
    (0..n * n)
        .map(|i| {
            let z = ((0..4).map(|_| uniform()).sum::<f64>() - 2.0) * 3f64.sqrt();
            if i / n == i % n {
                0
            } else {
                ((z * sigma).exp() * 1e6) as u64
            }
        })
        .collect()
}

/// `fast` takes the rotation stages exactly where their stage chains end
/// before ROTATION_MARGIN of the decomposition's, keeps the decomposition
/// elsewhere, and never rotates with a per-message cost.
#[test]
fn rotation_stages_where_their_chains_end_clearly_sooner() {
    let (mut rotated, mut kept) = (0, 0);
    for (i, &n) in [5usize, 8, 12, 16].iter().cycle().take(24).enumerate() {
        let topo = Topology::preset("dgx-h100", n, Some(2)).unwrap();
        let t = lognormal_node_matrix(n, i as u64, 0.02 + 0.03 * (i % 6) as f64);
        let mut stages = NodeStages::new(&topo);
        let ideal = PlannerOptions::default();
        let mut got = Vec::new();
        stages.decompose(n, &t, &ideal, 1 << 20, &mut got);
        // A per-message cost too small to move the decomposition's floor:
        // the decomposition alone.
        let tiny = PlannerOptions {
            per_message_us: 1e-12,
            ..PlannerOptions::default()
        };
        let mut plain = Vec::new();
        stages.decompose(n, &t, &tiny, 1 << 20, &mut plain);
        let mut rotation = Vec::new();
        Decomposer::default().rotate(n, &t, &mut rotation);
        let rate = node_rate(&topo);
        let mut chains = StageChains::default();
        let plain_end = chains.end(n, &plain, rate, 1.0, 1.0, 0.0);
        let rotation_end = chains.end(n, &rotation, rate, 1.0, 1.0, 0.0);
        stages.decompose(n, &t, &ideal, 1 << 20, &mut Vec::new());
        let said = stages.rotated();
        if rotation_end < ROTATION_MARGIN * plain_end {
            assert_eq!(got, rotation, "case {i}");
            assert!(said, "case {i}");
            rotated += 1;
        } else {
            assert_eq!(got, plain, "case {i}");
            assert!(!said, "case {i}");
            kept += 1;
        }
        check_partial_permutation(&got, n).unwrap();
        // With the calibrated per-message cost: never the rotation.
        let mut calibrated = Vec::new();
        let opts = PlannerOptions::for_network(Network::Calibrated);
        stages.decompose(n, &t, &opts, 1 << 20, &mut calibrated);
        assert!(calibrated != rotation || n < 3, "case {i}");
    }
    assert!(rotated > 0 && kept > 0, "rotated {rotated}, kept {kept}");
}

/// Where a node's pairs are longer than what it has in flight
/// (`MIN_DEPTH` sends of `part / G` bytes on each lane) and its GPUs share
/// a switch, `fast` takes the rotation wherever its stage chains end
/// sooner at all; with pairs no longer than that, or on a mesh, only
/// where they end before ROTATION_MARGIN of the decomposition's. On near-
/// uniform 3-6 node matrices some rotations are priced between the two.
#[test]
fn rotation_stages_wherever_their_chains_end_sooner_and_hold() {
    let switch = |n| Topology::preset("dgx-h100", n, Some(2)).unwrap();
    let mesh = |n| Topology::preset("mi300x", n, Some(2)).unwrap();
    let (mut banded, mut plain_kept) = (0, 0);
    for i in 0..40usize {
        let n = 3 + i % 4;
        let t = lognormal_node_matrix(n, 100 + i as u64, 0.05 + 0.05 * (i % 5) as f64);
        let ideal = PlannerOptions::default();
        // Pairs of about 1e6 bytes: `part` 1 KB keeps them far longer than a
        // window, 1 MB makes every pair shorter than one.
        for (topo, part, holds) in [
            (switch(n), 1u64 << 10, true),
            (switch(n), 1 << 20, false),
            (mesh(n), 1 << 10, false),
        ] {
            let mut stages = NodeStages::new(&topo);
            let mut got = Vec::new();
            stages.decompose(n, &t, &ideal, part, &mut got);
            let mut rotation = Vec::new();
            Decomposer::default().rotate(n, &t, &mut rotation);
            let tiny = PlannerOptions {
                per_message_us: 1e-12,
                ..PlannerOptions::default()
            };
            let mut plain = Vec::new();
            stages.decompose(n, &t, &tiny, part, &mut plain);
            let rate = node_rate(&topo);
            let mut chains = StageChains::default();
            let plain_end = chains.end(n, &plain, rate, 1.0, 1.0, 0.0);
            let rotation_end = chains.end(n, &rotation, rate, 1.0, 1.0, 0.0);
            let band = rotation_end >= ROTATION_MARGIN * plain_end
                && rotation_end < (1.0 - 1e-9) * plain_end;
            let rotate = rotation_end < ROTATION_MARGIN * plain_end || (band && holds);
            if rotate {
                assert_eq!(got, rotation, "case {i}, part {part}, holds {holds}");
            } else {
                assert_eq!(got, plain, "case {i}, part {part}, holds {holds}");
            }
            banded += usize::from(band && holds);
            plain_kept += usize::from(band && !holds);
            check_partial_permutation(&got, n).unwrap();
        }
    }
    assert!(
        banded > 0 && plain_kept > 0,
        "banded {banded}, kept {plain_kept}"
    );
}

/// `spray` chains each lane slice's sends (the carrier's own bytes and its
/// gathered bytes as two streams, `ceil(MIN_DEPTH / peers)` deep), so the
/// first sends land and are forwarded while the rest are on the NIC: each
/// inter-node send past its stream's first `depth` waits for an earlier
/// send of the same GPU pair and stream, and the plan ends sooner than the
/// same plan with those waits dropped (every send at once, the plan before
/// the chains) on a hot receiver.
#[test]
fn spray_chains_each_lane_slice_into_its_forwards() {
    let t = Topology::preset("dgx-h100", 2, None).unwrap();
    let mut spec = TrafficSpec::new(t.ranks(), Pattern::Hotspot(0.3));
    spec.seed = 4;
    spec.bytes = 256 << 10;
    let m = generate(&spec).unwrap();
    let opts = PlannerOptions {
        staged: false,
        ..PlannerOptions::default()
    };
    let plan = Emitter::new(&t, opts).unwrap().plan(&m).unwrap();
    verify_on(&plan, &m, &t).unwrap();
    // 2 nodes: one peer, so MIN_DEPTH sends of each stream in flight.
    let depth = MIN_DEPTH as usize;
    let rdma = |x: &Transfer| matches!(x.path, Path::Rdma { .. });
    let mut seen: std::collections::HashMap<(u32, u32, Buffer), usize> = Default::default();
    let mut chained = 0;
    for (i, x) in plan.transfers.iter().enumerate().filter(|(_, x)| rdma(x)) {
        let k = seen.entry((x.src, x.dst, x.src_buf)).or_insert(0);
        let on_stream: Vec<&Transfer> = x
            .deps
            .iter()
            .map(|&d| &plan.transfers[d as usize])
            .filter(|y| rdma(y) && (y.src, y.dst, y.src_buf) == (x.src, x.dst, x.src_buf))
            .collect();
        assert!(
            (on_stream.len() == 1) == (*k >= depth),
            "send {i} ({k} of its stream)"
        );
        chained += on_stream.len();
        *k += 1;
    }
    assert!(chained > 0);
    let mut at_once = plan.clone();
    let sends: Vec<bool> = at_once.transfers.iter().map(rdma).collect();
    for x in at_once.transfers.iter_mut().filter(|x| rdma(x)) {
        let kept: Vec<u32> = x
            .deps
            .iter()
            .copied()
            .filter(|&d| !sends[d as usize])
            .collect();
        x.deps = crate::plan::Deps::from_vec(kept);
    }
    let sim = SimOptions::default();
    let chained_us = simulate(&t, &plan, &sim).unwrap().completion_us;
    let at_once_us = simulate(&t, &at_once, &sim).unwrap().completion_us;
    assert!(
        chained_us < 0.95 * at_once_us,
        "chained {chained_us} us, at once {at_once_us} us"
    );
}

/// On a fabric whose leaves hold one node each (2 nodes, fat-tree 2:1),
/// every layered stage crosses the uplinks and the parts are sends of one
/// size: a GPU's first send is cut into `D` graded pieces so that the
/// sends in flight end one at a time. Before, they ended together and the
/// uplink idled for a latency at every turn of the window (DGX-H100 2x8,
/// MoE Zipf 0: 1.052 of the cut bound in `ideal`, now 1.011-1.016).
#[test]
fn crossing_only_stages_grade_the_first_send() {
    use crate::topology::FabricSpec;
    let mut spec = TopologySpec::preset("dgx-h100", 2, None).unwrap();
    spec.fabric = Some(FabricSpec::fat_tree(1, 2.0, 1.0));
    let t = Topology::from_spec(spec, "t").unwrap();
    let m = sweep_traffic(&t, "zipf:0", 7);
    let mut em = Emitter::new(&t, PlannerOptions::default()).unwrap();
    let plan = em.plan(&m).unwrap();
    verify_on(&plan, &m, &t).unwrap();
    let depth = em.pipeline_depth() as usize;
    assert!((2..u32::MAX as usize).contains(&depth), "{depth}");
    // GPU 0's first `D` inter-node sends grow: 1, 2, ..., D shares.
    let sends: Vec<u64> = plan
        .transfers
        .iter()
        .filter(|x| x.src == 0 && matches!(x.path, Path::Rdma { .. }))
        .map(|x| x.bytes)
        .take(depth)
        .collect();
    assert_eq!(sends.len(), depth);
    assert!(sends.windows(2).all(|w| w[0] < w[1]), "{sends:?}");
    let r = simulate(&t, &plan, &SimOptions::new(Network::Ideal)).unwrap();
    let ratio = r.completion_us / cut_bound(&t, &m).best_us();
    assert!(ratio < 1.03, "{ratio}");
}

/// On a 2:1 fat-tree, a hot receiver's split stages (its in-leaf receipts
/// paired with its leaf-mates' crossing ones, leaves.rs) give way to the
/// plain decomposition where that ends clearly sooner in `ideal`: DGX-H100
/// 8x8 (four nodes a leaf), MoE Zipf 0.5, seed 8: the split's stage chains
/// end at 504.7 us, the plain ones at 412.7 (369.3 replayed over the leaf
/// links); `fast` ran 1.354 of the cut bound with the split, 1.117 now.
/// Where the plain stages' replay shows the hot receiver's downlink shared
/// (MI300X 4x8, Zipf 1.0, seed 309: chains 341.0 against the split's
/// 384.1, but replayed 380.6), the split stays: 1.189, where the plain
/// stages ran 1.221.
#[test]
fn a_hot_receivers_split_gives_way_where_plain_stages_end_sooner() {
    use crate::topology::FabricSpec;
    for (preset, nodes, skew, seed, most) in [
        ("dgx-h100", 8, "zipf:0.5", 8, 1.15),
        ("mi300x", 4, "zipf:1.0", 309, 1.2),
    ] {
        let mut spec = TopologySpec::preset(preset, nodes, None).unwrap();
        spec.fabric = Some(FabricSpec::fat_tree(nodes / 2, 2.0, 1.0));
        let t = Topology::from_spec(spec, "t").unwrap();
        let m = sweep_traffic(&t, skew, seed);
        let plan = Emitter::new(&t, PlannerOptions::default())
            .unwrap()
            .plan(&m)
            .unwrap();
        verify_on(&plan, &m, &t).unwrap();
        let r = simulate(&t, &plan, &SimOptions::new(Network::Ideal)).unwrap();
        let ratio = r.completion_us / cut_bound(&t, &m).best_us();
        assert!(ratio < most, "{preset} {nodes}x8 {skew}: {ratio}");
    }
}

/// A direct lane's stage slice takes its share of every destination
/// block: at 32 x 8 uniform the chunked rotation cuts each pair into
/// pieces of the floor (a quarter of a pair), and each piece still reaches
/// all eight receiving GPUs (with the blocks lying in its byte range it
/// reached two, whose NICs then took the stage: 1.99x the bound at 16
/// nodes). Every byte lands once and the plan runs at the bound.
#[test]
fn direct_stage_slices_reach_every_receiving_gpu() {
    let t = Topology::preset("dgx-h100", 32, None).unwrap();
    let g = t.gpus_per_node();
    let mut spec = TrafficSpec::new(t.ranks(), Pattern::Uniform);
    spec.seed = 1;
    let m = generate(&spec).unwrap();
    let plan = Emitter::new(&t, PlannerOptions::default())
        .unwrap()
        .plan(&m)
        .unwrap();
    verify_on(&plan, &m, &t).unwrap();
    let mut reached = std::collections::BTreeMap::new();
    for x in &plan.transfers {
        if matches!(x.path, Path::Rdma { .. }) {
            assert_eq!(x.dst_buf, Buffer::Output, "uniform lanes go direct");
            reached
                .entry((x.step, x.src, x.dst as usize / g))
                .or_insert_with(std::collections::BTreeSet::new)
                .insert(x.dst);
        }
    }
    assert!(reached.len() > 32 * 31 * g, "pairs are cut into pieces");
    assert!(reached.values().all(|d| d.len() == g));
    let sim = simulate(&t, &plan, &SimOptions::new(Network::Ideal)).unwrap();
    let bound = cut_bound(&t, &m).best_us();
    assert!(
        sim.completion_us < 1.01 * bound,
        "{} {bound}",
        sim.completion_us
    );
}

proptest! {
    /// `slice_carries` is `lane_slice`'s `to > from` for every slice of a
    /// node pair (small numbers, where the shortcuts and the divisions
    /// both decide, and large ones, where the product needs 128 bits).
    #[test]
    fn slice_carries_is_the_lane_slices_test(
        total in 0u64..2_000,
        cuts in (0u64..=1_000, 0u64..=1_000),
        len in 0u64..3_000,
        scale in prop::sample::select(vec![1u64, 1 << 20, 1 << 40]),
    ) {
        use super::rank::slice_carries;
        use super::sends::lane_slice;
        let total = total * scale;
        // Two cuts of the pair, as fractions of it: `before..after`.
        let at = |c: u64| (u128::from(total) * u128::from(c) / 1000) as u64;
        let (before, after) = (at(cuts.0.min(cuts.1)), at(cuts.0.max(cuts.1)));
        let len = len.min(total.saturating_mul(2)) * if scale > 1 { scale / 1024 } else { 1 };
        let (from, to) = lane_slice(before, after, total, len);
        prop_assert_eq!(
            slice_carries(before, after - before, total, len),
            to > from,
            "{}..{} of {} on a lane of {}", before, after, total, len
        );
        // The emitter's form, the division by `total` shared by the lanes.
        let by = (total, super::arith::Divisor::new(total));
        prop_assert_eq!(super::sends::lane_slice_by(before, after, by, len), (from, to));
    }
}
