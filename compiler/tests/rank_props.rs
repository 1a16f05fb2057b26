//! Per-rank planning: every rank's own program, stitched back together, is
//! the whole plan (module `rank`: same transfers, fields and dependencies,
//! in canonical order), for every algorithm with a per-rank planner.

use proptest::prelude::*;
use switchyard_compiler::job::JobInputs;
use switchyard_compiler::planner::{Planner, PlannerOptions, StagePair};
use switchyard_compiler::program::OpKind;
use switchyard_compiler::rank::{
    canonical, stitch, LaneSums, LocalProgram, LocalTraffic, NodeLanes, StageInputs,
};
use switchyard_compiler::sched::auto::choose;
use switchyard_compiler::sim::Network;
use switchyard_compiler::topology::{FabricSpec, TopologySpec};
use switchyard_compiler::{verify_on, Algorithm, Error, Plan, Topology, TrafficMatrix};

const ALGORITHMS: [Algorithm; 6] = [
    Algorithm::Direct,
    Algorithm::Hierarchical,
    Algorithm::Pxn,
    Algorithm::Deepep,
    Algorithm::Spray,
    Algorithm::Fast,
];

/// A random matrix: each block empty with probability `sparsity`/8, else
/// up to `scale` bytes, a few blocks heavy (skew).
fn matrix(ranks: usize, seed: u64, sparsity: u64, scale: u64) -> TrafficMatrix {
    let mut state = seed | 1;
    let mut next = || {
        // splitmix64
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let mut m = TrafficMatrix::zeros(ranks);
    for s in 0..ranks {
        for d in 0..ranks {
            let r = next();
            if r % 8 < sparsity {
                continue;
            }
            let heavy = if (r >> 8) % 17 == 0 { 16 } else { 1 };
            m.set(s, d, 1 + (r >> 16) % scale * heavy);
        }
    }
    m
}

/// A near-uniform matrix: every block `base` bytes plus up to 40% more
/// (even node lines, so that an oversubscribed fabric's layered stages
/// apply, but no pair balanced to within 2%, so that lanes are balanced).
fn near_uniform(ranks: usize, seed: u64, base: u64) -> TrafficMatrix {
    let noise = matrix(ranks, seed, 0, 1000);
    let mut m = TrafficMatrix::zeros(ranks);
    for s in 0..ranks {
        for d in 0..ranks {
            m.set(s, d, base + base * (noise.get(s, d) % 1000) * 2 / 5 / 1000);
        }
    }
    m
}

/// Stitches every rank's program of `alg` and compares with the whole
/// plan; returns how many ranks were planned from their `LocalTraffic`.
fn check(topo: &Topology, m: &TrafficMatrix, alg: Algorithm) -> Result<usize, TestCaseError> {
    check_with(topo, m, alg, PlannerOptions::default())
}

/// [`check`] with planner options.
fn check_with(
    topo: &Topology,
    m: &TrafficMatrix,
    alg: Algorithm,
    opts: PlannerOptions,
) -> Result<usize, TestCaseError> {
    let mut planner = Planner::for_algorithm(topo, alg, opts).unwrap();
    let mut whole = Plan::new("", 0, 0);
    planner.plan_into(m, &mut whole).unwrap();
    prop_assert_eq!(whole.algorithm.as_str(), alg.name());
    verify_on(&whole, m, topo).unwrap();
    let mut progs = Vec::with_capacity(topo.ranks());
    let mut prog = LocalProgram::default();
    let mut local_prog = LocalProgram::default();
    let mut per_rank = 0;
    // Staged `fast` and `spray`: each node's lanes, as its ranks compute
    // them from their own rows (what a job gathers the sums of).
    let g = topo.gpus_per_node();
    let node_lanes: Option<Vec<NodeLanes>> = (0..topo.nodes())
        .map(|a| {
            let local = LocalTraffic::from_matrix(m, a * g, topo).unwrap();
            planner.node_lanes(a, &local.node_sends()).ok()
        })
        .collect();
    // And what a job gathers in place of `node_splits`: each node's parts
    // from its rows and columns, each rank's first slice (`None` where the
    // planner plans no staged rank).
    let job = JobInputs::from_matrix(&mut planner, topo, m).unwrap();
    for r in 0..topo.ranks() {
        planner.plan_rank_into(r, m, &mut prog).unwrap();
        // From what the rank knows alone: the same program, or (only where
        // the algorithm has no per-rank planner for this plan) a refusal.
        let mut local = LocalTraffic::from_matrix(m, r, topo).unwrap();
        match planner.program_local_into(&local, &mut local_prog) {
            Ok(()) => {
                prop_assert_eq!(&local_prog, &prog, "{} rank {}", alg, r);
                per_rank += 1;
                // Given the sums of every node's lanes, the same program.
                if let Some(parts) = &node_lanes {
                    let sums = LaneSums::assemble(parts, r, topo.nodes(), g).unwrap();
                    local.lane_sums = Some(sums);
                    planner.program_local_into(&local, &mut local_prog).unwrap();
                    prop_assert_eq!(&local_prog, &prog, "{} rank {} with lane sums", alg, r);
                }
                // Given the sums and the stage inputs, without `node_splits`.
                if let Some(job) = &job {
                    let sums = job.lane_sums(r).unwrap();
                    // The rank's own first slice says the plan is merged
                    // as the job's do.
                    let merged = planner
                        .first_slice(&local, job.own_lens(r).unwrap())
                        .unwrap()
                        .is_none();
                    prop_assert_eq!(merged, job.merged(), "rank {}: merged", r);
                    prop_assert_eq!(
                        Some(&sums),
                        local.lane_sums.as_ref(),
                        "rank {}: the sums from the nodes' parts",
                        r
                    );
                    // What the job delivers: no sums or stage inputs for
                    // a merged plan.
                    let mut given = job.local(m, r, topo).unwrap();
                    prop_assert!(given.node_splits.is_none());
                    prop_assert_eq!(given.lane_sums.is_none(), merged);
                    planner.program_local_into(&given, &mut local_prog).unwrap();
                    prop_assert_eq!(&local_prog, &prog, "{} rank {} with stage inputs", alg, r);
                    if merged {
                        // Given anyway (no first slices), the merged
                        // program reads none of them.
                        given.lane_sums = Some(sums);
                        given.stage_inputs = Some(StageInputs {
                            inter_blocks: local.node_splits.as_ref().map_or(0, |s| s.inter_blocks),
                            pairs_direct: job.parts().iter().all(|p| p.direct),
                            first_slices: vec![u32::MAX; topo.ranks()],
                        });
                        planner.program_local_into(&given, &mut local_prog).unwrap();
                        prop_assert_eq!(
                            &local_prog,
                            &prog,
                            "{} rank {} merged, inputs given",
                            alg,
                            r
                        );
                    }
                }
            }
            Err(Error::NeedsWholeMatrix { algorithm, .. }) => {
                // Refused from the stage inputs too (every pair direct).
                if let Some(job) = &job {
                    let given = job.local(m, r, topo).unwrap();
                    let again = planner.program_local_into(&given, &mut local_prog);
                    prop_assert!(
                        matches!(again, Err(Error::NeedsWholeMatrix { .. })),
                        "{} rank {}: planned from stage inputs, refused from node splits",
                        alg,
                        r
                    );
                }
                prop_assert!(
                    !matches!(
                        alg,
                        Algorithm::Direct
                            | Algorithm::Hierarchical
                            | Algorithm::Pxn
                            | Algorithm::Deepep
                    ),
                    "{} refused rank {}",
                    alg,
                    r
                );
                prop_assert_eq!(algorithm.as_str(), alg.name());
            }
            Err(e) => panic!("{alg} rank {r}: {e}"),
        }
        progs.push(prog.clone());
    }
    let stitched = stitch(&progs).unwrap();
    let want = canonical(&whole);
    prop_assert_eq!(stitched.transfers.len(), want.transfers.len(), "{}", alg);
    for (i, (got, want)) in stitched.transfers.iter().zip(&want.transfers).enumerate() {
        prop_assert_eq!(got, want, "{} transfer {}", alg, i);
    }
    prop_assert_eq!(&stitched, &want, "{}", alg);
    // The canonical form is the same all-to-all.
    verify_on(&stitched, m, topo).unwrap();
    Ok(per_rank)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Small clusters, every shape of node.
    #[test]
    fn stitched_programs_are_the_plan(
        nodes in 2usize..=6,
        gpus in 1usize..=4,
        seed in any::<u64>(),
        sparsity in 0u64..=6,
        scale in prop::sample::select(vec![64u64, 4096, 1 << 20]),
    ) {
        let topo = Topology::preset("dgx-h100", nodes, Some(gpus)).unwrap();
        let m = matrix(topo.ranks(), seed, sparsity, scale);
        for alg in ALGORITHMS {
            check(&topo, &m, alg)?;
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3, ..ProptestConfig::default() })]

    /// Up to 32 nodes: few cases, one GPU or two per node.
    #[test]
    fn stitched_programs_are_the_plan_at_32_nodes(
        nodes in 16usize..=32,
        gpus in 1usize..=2,
        seed in any::<u64>(),
        sparsity in 0u64..=4,
    ) {
        let topo = Topology::preset("dgx-h100", nodes, Some(gpus)).unwrap();
        let m = matrix(topo.ranks(), seed, sparsity, 1 << 16);
        for alg in ALGORITHMS {
            check(&topo, &m, alg)?;
        }
    }
}

/// Staged `fast` and `spray` on fabrics: full bisection, a 4:1 fat-tree
/// of two-node leaves and a 4:1 rail-optimized fabric of two-node groups
/// (whose uplinks bind, so `fast` layers its stages), planned for the ideal
/// and the calibrated network. Every rank of the staged plans is planned
/// from its `LocalTraffic` (none refuses: no mesh, and balanced lanes with
/// two GPUs or more per node).
fn fabric_topo(nodes: usize, gpus: usize, fabric: usize) -> Topology {
    let mut spec = TopologySpec::preset("dgx-h100", nodes, Some(gpus)).unwrap();
    spec.fabric = match fabric {
        0 => None,
        1 => Some(FabricSpec::fat_tree(2, 4.0, 0.5)),
        _ => Some(FabricSpec::rail_optimized(Some(2), 4.0, 0.5)),
    };
    Topology::from_spec(spec, "fabric").unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    #[test]
    fn staged_fast_is_planned_per_rank_on_fabrics(
        nodes in 2usize..=8,
        gpus in 1usize..=4,
        fabric in 0usize..3,
        skewed in any::<bool>(),
        calibrated in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let topo = fabric_topo(nodes, gpus, fabric);
        let m = if skewed {
            matrix(topo.ranks(), seed, 1, 1 << 20)
        } else {
            near_uniform(topo.ranks(), seed, 1 << 18)
        };
        let opts = if calibrated {
            PlannerOptions::for_network(Network::Calibrated)
        } else {
            PlannerOptions::default()
        };
        for alg in [Algorithm::Fast, Algorithm::Spray] {
            let per_rank = check_with(&topo, &m, alg, opts.clone())?;
            // With one GPU per node every pair may go direct (then `fast`
            // refuses and slices the whole plan).
            if gpus > 1 || alg == Algorithm::Spray {
                prop_assert_eq!(per_rank, topo.ranks(), "{} on fabric {}", alg, fabric);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    /// `pxn` and `deepep` on 2 to 32 nodes, full-bisection or rail-optimized
    /// (in groups of two nodes where they divide), with as many NICs as
    /// GPUs or fewer: then GPUs share a rail, and `pxn` relays only the
    /// blocks whose source is on another rail than their destination.
    #[test]
    fn stitched_relay_programs_are_the_plan(
        (nodes, gpus, nics) in (2usize..=32)
            .prop_flat_map(|n| (Just(n), 1usize..=if n > 8 { 2 } else { 4 }))
            .prop_flat_map(|(n, g)| (Just(n), Just(g), 1usize..=g)),
        rail in any::<bool>(),
        seed in any::<u64>(),
        sparsity in 0u64..=6,
        scale in prop::sample::select(vec![64u64, 1 << 20]),
    ) {
        let mut spec = TopologySpec::preset_shape("dgx-h100", nodes, Some(gpus), Some(nics)).unwrap();
        if rail {
            let group = if nodes % 2 == 0 { Some(2) } else { None };
            spec.fabric = Some(FabricSpec::rail_optimized(group, 2.0, 1.0));
        }
        let topo = Topology::from_spec(spec, "t").unwrap();
        let m = matrix(topo.ranks(), seed, sparsity, scale);
        for alg in [Algorithm::Pxn, Algorithm::Deepep] {
            check(&topo, &m, alg)?;
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    /// A rank's program emits, of the pairs away from its node, only the
    /// last `depth` (count windows) or `2 depth` (byte windows) slices of
    /// each chain of its rail before each of its own
    /// (`Emitter::rank_pairs`): long chains (up to 24 nodes) against
    /// shallow pipelines (depth 1 to 3) and small chunks (several sends per
    /// slice), byte windows (decode-size blocks) and count windows, and
    /// pipelines too deep for the window (every slice of the rail: depth 40
    /// with byte windows, 70 with either).
    #[test]
    fn staged_fast_per_rank_windows(
        nodes in 6usize..=24,
        gpus in 2usize..=3,
        depth in prop::sample::select(vec![None, Some(1u32), Some(2), Some(3), Some(40), Some(70)]),
        chunk in prop::sample::select(vec![None, Some(4096u64)]),
        scale in prop::sample::select(vec![2048u64, 1 << 14, 1 << 20]),
        seed in any::<u64>(),
    ) {
        let topo = Topology::preset("dgx-h100", nodes, Some(gpus)).unwrap();
        let m = matrix(topo.ranks(), seed, 1, scale);
        let opts = PlannerOptions {
            pipeline_depth: depth,
            chunk_bytes: chunk,
            ..PlannerOptions::default()
        };
        check_with(&topo, &m, Algorithm::Fast, opts)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4, ..ProptestConfig::default() })]

    /// The same windows on the chunked rotation (32 nodes and more), which
    /// a rank given the stage inputs reads piece by piece
    /// (`Emitter::rank_pairs_rotated`) unless the window is too deep (depth
    /// 70: the pairs are written and walked as below 32 nodes).
    #[test]
    fn staged_fast_per_rank_windows_on_the_chunked_rotation(
        nodes in 32usize..=34,
        depth in prop::sample::select(vec![None, Some(1u32), Some(3), Some(70)]),
        scale in prop::sample::select(vec![2048u64, 1 << 16, 1 << 22]),
        seed in any::<u64>(),
    ) {
        let topo = Topology::preset("dgx-h100", nodes, Some(2)).unwrap();
        let m = matrix(topo.ranks(), seed, 1, scale);
        let opts = PlannerOptions {
            pipeline_depth: depth,
            ..PlannerOptions::default()
        };
        check_with(&topo, &m, Algorithm::Fast, opts)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    /// `auto` per rank (`Planner::program`, by the estimates alone): every
    /// rank's program is of the algorithm the whole-matrix choice picks,
    /// and stitched they are the plan `plan_into` makes, in both the ideal
    /// and the calibrated network (where the candidates differ most).
    #[test]
    fn stitched_auto_programs_are_the_plan(
        nodes in 2usize..=8,
        gpus in 1usize..=4,
        seed in any::<u64>(),
        sparsity in 0u64..=6,
        scale in prop::sample::select(vec![64u64, 4096, 1 << 20]),
        calibrated in any::<bool>(),
    ) {
        let topo = Topology::preset("dgx-h100", nodes, Some(gpus)).unwrap();
        let m = matrix(topo.ranks(), seed, sparsity, scale);
        let network = if calibrated { Network::Calibrated } else { Network::Ideal };
        let mut planner = Planner::auto(&topo, PlannerOptions::for_network(network), network).unwrap();
        let want = choose(&topo, &m, network);
        let mut whole = Plan::new("", 0, 0);
        planner.plan_into(&m, &mut whole).unwrap();
        prop_assert_eq!(&whole.algorithm, &want.chosen);
        let mut progs = Vec::with_capacity(topo.ranks());
        for r in 0..topo.ranks() {
            let prog = planner.program(r, &m).unwrap();
            prop_assert_eq!(&prog.algorithm, &want.chosen, "rank {}", r);
            prop_assert_eq!(planner.last_choice(), Some(&want), "rank {}", r);
            progs.push(prog);
        }
        // The one-shot schedulers name the matrix they planned; programs do not.
        let mut plan = canonical(&whole);
        plan.traffic_fingerprint = None;
        prop_assert_eq!(stitch(&progs).unwrap(), plan, "{}", want.chosen);
    }
}

/// A matrix whose node pairs carry log-normal weights (`sigma` hundredths
/// the deviation of their log),
/// each block of a pair within 10% of the others: a rotation-friendly load
/// (docs/algorithms.md, `fast`'s stages).
fn lognormal_nodes(topo: &Topology, seed: u64, sigma: u64) -> TrafficMatrix {
    let (n, g) = (topo.nodes(), topo.gpus_per_node());
    let noise = matrix(topo.ranks(), seed, 0, 1000);
    let weights = matrix(n, seed ^ 0x5eed, 0, 1 << 20);
    let mut m = TrafficMatrix::zeros(topo.ranks());
    for s in 0..topo.ranks() {
        for d in 0..topo.ranks() {
            // Four uniforms: about normal, mean 2, deviation 1/sqrt(3).
            let w = weights.get(s / g, d / g);
            let z = (0..4)
                .map(|k| ((w >> (5 * k)) & 31) as f64 / 31.0)
                .sum::<f64>()
                - 2.0;
            let scale = (z * 3f64.sqrt() * sigma as f64 / 100.0).exp();
            let x = (1 << 16) as f64 * scale * (1.0 + (noise.get(s, d) % 100) as f64 / 1000.0);
            m.set(s, d, x as u64);
        }
    }
    m
}

/// Whether staged `fast`'s node stages are the rotation: each stage one
/// diagonal `(a, (a + k) mod N)`, every pair whole in one stage.
fn is_rotation(stages: &[StagePair], n: usize) -> bool {
    let diag = |s: &StagePair| (s.dst_node as usize + n - s.src_node as usize) % n;
    stages.len() == n * (n - 1)
        && stages.iter().all(|s| {
            let first = stages.iter().find(|t| t.stage == s.stage).unwrap();
            diag(s) == diag(first)
        })
}

/// Staged `fast` planned for `network`: every rank's program, planned
/// alone, stitches into the whole plan; returns the whole plan's stages.
fn fast_stages_all_ranks_alone(
    topo: &Topology,
    m: &TrafficMatrix,
    network: Network,
) -> Vec<StagePair> {
    let opts = PlannerOptions::for_network(network);
    let per_rank = check_with(topo, m, Algorithm::Fast, opts.clone()).unwrap();
    assert_eq!(per_rank, topo.ranks());
    let mut p = Planner::for_algorithm(topo, Algorithm::Fast, opts).unwrap();
    p.plan(m).unwrap();
    p.stages().to_vec()
}

/// Node matrices where `fast` takes the rotation stages (and some where it
/// does not): every rank's program, planned alone, makes the same choice
/// and stitches into the whole plan. In `calibrated` the rotation is off.
#[test]
fn staged_fast_per_rank_rotation_stages() {
    let mut rotated = 0;
    for (i, &(nodes, sigma)) in [(8, 5), (12, 8), (16, 5), (6, 12), (9, 15)]
        .iter()
        .enumerate()
    {
        let topo = Topology::preset("dgx-h100", nodes, Some(2)).unwrap();
        let m = lognormal_nodes(&topo, i as u64, sigma);
        for network in [Network::Ideal, Network::Calibrated] {
            let stages = fast_stages_all_ranks_alone(&topo, &m, network);
            let rotation = is_rotation(&stages, nodes);
            assert!(
                !rotation || network == Network::Ideal,
                "{nodes} nodes {network:?}"
            );
            rotated += usize::from(rotation);
        }
    }
    assert!(rotated > 0, "no case rotated");
}

/// Up to 32 nodes of 2 GPUs on a layered fat-tree, every rank of staged
/// `fast` planned alone.
#[test]
fn staged_fast_per_rank_at_32_nodes_layered() {
    for (nodes, seed) in [(16, 11), (32, 12)] {
        let topo = fabric_topo(nodes, 2, 1);
        let m = near_uniform(topo.ranks(), seed, 1 << 16);
        let per_rank = check(&topo, &m, Algorithm::Fast).unwrap();
        assert_eq!(per_rank, topo.ranks());
        // The stages are the fabric's layers, not the plain decomposition.
        let stages = |topo: &Topology| {
            let mut p =
                Planner::for_algorithm(topo, Algorithm::Fast, PlannerOptions::default()).unwrap();
            p.plan(&m).unwrap();
            p.stages().to_vec()
        };
        assert_ne!(stages(&topo), stages(&fabric_topo(nodes, 2, 0)));
    }
}

/// A mesh fabric (fast's relief pass) and a program's errors.
#[test]
fn mesh_and_errors() {
    let topo = Topology::preset("mi300x", 2, Some(4)).unwrap();
    let m = matrix(8, 7, 1, 1 << 20);
    for alg in ALGORITHMS {
        check(&topo, &m, alg).unwrap();
        let mut planner = Planner::for_algorithm(&topo, alg, PlannerOptions::default()).unwrap();
        let e = planner.program(8, &m).unwrap_err().to_string();
        assert!(e.contains("not a rank"), "{alg}: {e}");
        let e = planner
            .program(0, &TrafficMatrix::uniform(4, 1))
            .unwrap_err()
            .to_string();
        assert!(e.contains("rank"), "{alg}: {e}");
    }
    assert!(Planner::for_algorithm(&topo, Algorithm::Lp, PlannerOptions::default()).is_err());
}

/// `fast`'s merged plan (a latency-bound exchange) and its staged plan are
/// planned per rank; staged `fast` refuses (naming the algorithm and why,
/// and `program` slices its whole plan instead) when every pair goes
/// direct or the rank's traffic lacks the node splits; `auto` refuses.
#[test]
fn which_plans_are_planned_per_rank() {
    let topo = Topology::preset("dgx-h100", 4, Some(2)).unwrap();
    let tiny = TrafficMatrix::uniform(8, 64);
    let big = TrafficMatrix::uniform(8, 1 << 20);
    let skewed = matrix(8, 5, 1, 1 << 20);
    let mut fast =
        Planner::for_algorithm(&topo, Algorithm::Fast, PlannerOptions::default()).unwrap();
    fast.plan(&tiny).unwrap();
    assert!(fast.merged());
    for r in 0..8 {
        let local = LocalTraffic::from_matrix(&tiny, r, &topo).unwrap();
        let prog = fast.program_local(&local).unwrap();
        assert_eq!(prog, fast.program(r, &tiny).unwrap());
        assert_eq!(prog.algorithm, "fast");
    }
    // Staged, balanced lanes: planned alone.
    let mut local = LocalTraffic::from_matrix(&skewed, 3, &topo).unwrap();
    let prog = fast.program_local(&local).unwrap();
    assert!(!fast.merged());
    assert_eq!(prog, fast.program(3, &skewed).unwrap());
    // Without the node splits it cannot balance the pairs.
    local.node_splits = None;
    let e = fast.program_local(&local).unwrap_err();
    assert!(
        matches!(&e, Error::NeedsWholeMatrix { algorithm, .. } if algorithm == "fast"),
        "{e}"
    );
    assert!(e.to_string().contains("node_splits"), "{e}");
    // Uniform: every pair direct, whose receives wait on every rail.
    let local = LocalTraffic::from_matrix(&big, 3, &topo).unwrap();
    let e = fast.program_local(&local).unwrap_err();
    assert!(e.to_string().contains("needs the whole matrix"), "{e}");
    assert!(e.to_string().contains("directly"), "{e}");
    assert_eq!(fast.program(3, &big).unwrap().rank, 3);
    let mut spray =
        Planner::for_algorithm(&topo, Algorithm::Spray, PlannerOptions::default()).unwrap();
    let local = LocalTraffic::from_matrix(&skewed, 3, &topo).unwrap();
    let prog = spray.program_local(&local).unwrap();
    assert_eq!(prog.algorithm, "spray");
    let mut auto = Planner::auto(&topo, PlannerOptions::default(), Network::Ideal).unwrap();
    let e = auto.program_local(&local).unwrap_err().to_string();
    assert!(e.starts_with("auto: needs the whole matrix"), "{e}");
    assert_eq!(auto.program(3, &tiny).unwrap().rank, 3);
    // A rank's traffic for another shape is bad input.
    let other = Topology::preset("dgx-h100", 2, Some(4)).unwrap();
    let mut direct =
        Planner::for_algorithm(&other, Algorithm::Direct, PlannerOptions::default()).unwrap();
    assert!(matches!(direct.program_local(&local), Err(Error::Input(_))));
}

/// A broken stitch is caught: a program that lost an op, or whose op
/// disagrees with its peer's.
#[test]
fn stitch_rejects_disagreeing_programs() {
    let topo = Topology::preset("dgx-h100", 2, Some(2)).unwrap();
    let m = matrix(4, 3, 0, 1000);
    let mut planner =
        Planner::for_algorithm(&topo, Algorithm::Hierarchical, PlannerOptions::default()).unwrap();
    let progs: Vec<LocalProgram> = (0..4).map(|r| planner.program(r, &m).unwrap()).collect();
    assert!(stitch(&progs).is_ok());
    let mut lost = progs.clone();
    lost[1].ops.pop();
    assert!(stitch(&lost).is_err());
    let mut changed = progs.clone();
    let at = changed[2]
        .ops
        .iter()
        .position(|o| o.op != OpKind::Copy)
        .unwrap();
    changed[2].ops[at].bytes += 1;
    assert!(stitch(&changed).is_err());
}

/// `rail_into_before` is gathered for `deepep` alone: the others plan
/// without it, `deepep` says it is missing.
#[test]
fn only_deepep_needs_rail_into_before() {
    let topo = Topology::preset("dgx-h100", 3, Some(2)).unwrap();
    let m = matrix(6, 5, 1, 4096);
    let mut local = LocalTraffic::from_matrix(&m, 2, &topo).unwrap();
    local.rail_into_before.clear();
    for alg in [Algorithm::Direct, Algorithm::Hierarchical, Algorithm::Pxn] {
        let mut planner = Planner::for_algorithm(&topo, alg, PlannerOptions::default()).unwrap();
        assert_eq!(
            planner.program_local(&local).unwrap(),
            planner.program(2, &m).unwrap()
        );
    }
    let mut deepep =
        Planner::for_algorithm(&topo, Algorithm::Deepep, PlannerOptions::default()).unwrap();
    let e = deepep.program_local(&local).unwrap_err().to_string();
    assert!(e.contains("rail_into_before"), "{e}");
}

/// Lane sums are checked where they enter: `node_lanes` only for a staged
/// emitter off a mesh and for a node's `G x N` sends, `assemble` only
/// from one `N G`-lane part per node, and a `LocalTraffic` whose sums
/// have the wrong length is bad input, named by field.
#[test]
fn lane_sums_inputs_are_checked() {
    let topo = Topology::preset("dgx-h100", 4, Some(2)).unwrap();
    let m = matrix(8, 5, 1, 1 << 20);
    let (nn, g) = (topo.nodes(), topo.gpus_per_node());
    let mut fast =
        Planner::for_algorithm(&topo, Algorithm::Fast, PlannerOptions::default()).unwrap();
    let sends = LocalTraffic::from_matrix(&m, 0, &topo)
        .unwrap()
        .node_sends();
    assert_eq!(sends.len(), nn * g);
    let part = fast.node_lanes(0, &sends).unwrap();
    assert!(matches!(fast.node_lanes(nn, &sends), Err(Error::Input(_))));
    assert!(matches!(
        fast.node_lanes(0, &sends[1..]),
        Err(Error::Input(_))
    ));
    for alg in [Algorithm::Auto, Algorithm::Direct] {
        let mut p = Planner::for_algorithm(&topo, alg, PlannerOptions::default()).unwrap();
        assert!(
            matches!(p.node_lanes(0, &sends), Err(Error::NeedsWholeMatrix { .. })),
            "{alg}"
        );
    }
    let mesh = Topology::preset("mi300x", 2, Some(4)).unwrap();
    let mut on_mesh =
        Planner::for_algorithm(&mesh, Algorithm::Fast, PlannerOptions::default()).unwrap();
    let mesh_sends = vec![0; mesh.ranks()];
    assert!(matches!(
        on_mesh.node_lanes(0, &mesh_sends),
        Err(Error::NeedsWholeMatrix { .. })
    ));
    let parts = vec![part.clone(); nn];
    assert!(LaneSums::assemble(&parts[1..], 0, nn, g).is_err());
    assert!(LaneSums::assemble(&parts, nn * g, nn, g).is_err());
    let mut short = parts.clone();
    short[2].len.pop();
    assert!(LaneSums::assemble(&short, 0, nn, g).is_err());
    let mut local = LocalTraffic::from_matrix(&m, 3, &topo).unwrap();
    let mut sums = LaneSums::assemble(&parts, 3, nn, g).unwrap();
    let whole = sums.clone();
    sums.rail_len.pop();
    local.lane_sums = Some(sums);
    let e = fast.program_local(&local).unwrap_err().to_string();
    assert!(e.contains("lane_sums.rail_len"), "{e}");
    // A lane that would gather more than it sends.
    let mut sums = whole;
    sums.rail_gathered[1] = sums.rail_len[1] + 1;
    local.lane_sums = Some(sums);
    let e = fast.program_local(&local).unwrap_err().to_string();
    assert!(e.contains("exceeds") && e.contains("(0, 1)"), "{e}");
}

/// Stage inputs are checked where they enter, and a wrong one does not go
/// unseen: `node_parts` and `first_slice` refuse misfit shapes; a
/// `LocalTraffic` with stage inputs but no lane sums, or first slices of the
/// wrong length, is bad input; a first slice past the stages, or one of the
/// rank's own node that its lanes contradict, is rejected; and the first
/// slices of other nodes, which the rank cannot check, change the programs
/// that read them.
#[test]
fn stage_inputs_are_checked() {
    let topo = Topology::preset("dgx-h100", 4, Some(4)).unwrap();
    let m = matrix(16, 7, 1, 1 << 20);
    let (nn, g) = (topo.nodes(), topo.gpus_per_node());
    let mut fast =
        Planner::for_algorithm(&topo, Algorithm::Fast, PlannerOptions::default()).unwrap();
    let one = LocalTraffic::from_matrix(&m, 0, &topo).unwrap();
    assert!(matches!(
        fast.node_parts(nn, &one.rows, &one.cols),
        Err(Error::Input(_))
    ));
    assert!(matches!(
        fast.node_parts(0, &one.rows[1..], &one.cols),
        Err(Error::Input(_))
    ));
    let mut direct =
        Planner::for_algorithm(&topo, Algorithm::Direct, PlannerOptions::default()).unwrap();
    assert!(matches!(
        direct.node_parts(0, &one.rows, &one.cols),
        Err(Error::NeedsWholeMatrix { .. })
    ));
    let job = JobInputs::from_matrix(&mut fast, &topo, &m)
        .unwrap()
        .unwrap();
    let inputs = job.stage_inputs().unwrap().clone();
    let len = job.own_lens(0).unwrap();
    let mut bad_rank = one.clone();
    bad_rank.rank = nn * g;
    assert!(matches!(
        fast.first_slice(&bad_rank, len),
        Err(Error::Input(_))
    ));
    assert!(matches!(
        fast.first_slice(&one, &len[1..]),
        Err(Error::Input(_))
    ));
    assert!(fast.first_slice(&one, len).unwrap().is_some());
    assert!(!inputs.pairs_direct);
    let local_of = |r: usize, inputs: &StageInputs| {
        let mut local = job.local(&m, r, &topo).unwrap();
        local.stage_inputs = Some(inputs.clone());
        local
    };
    let mut changed = 0;
    for r in 0..topo.ranks() {
        let want = fast.program(r, &m).unwrap();
        let local = local_of(r, &inputs);
        assert_eq!(fast.program_local(&local).unwrap(), want, "rank {r}");
        // Without lane sums, or with a slice too few.
        let mut bare = local.clone();
        bare.lane_sums = None;
        let e = fast.program_local(&bare).unwrap_err().to_string();
        assert!(e.contains("without `lane_sums`"), "{e}");
        let mut short = inputs.clone();
        short.first_slices.pop();
        let e = fast
            .program_local(&local_of(r, &short))
            .unwrap_err()
            .to_string();
        assert!(e.contains("first_slices` has"), "{e}");
        // A GPU of its own node: contradicted by its lanes.
        let node = r / g;
        let mut wrong = inputs.clone();
        let c = node * g + (r + 1) % g;
        wrong.first_slices[c] = wrong.first_slices[c].wrapping_add(1);
        let e = fast
            .program_local(&local_of(r, &wrong))
            .unwrap_err()
            .to_string();
        assert!(e.contains(&format!("GPU {c}'s")), "{e}");
        // Past the stages.
        let mut past = inputs.clone();
        let other = ((node + 1) % nn) * g;
        past.first_slices[other] = 1 << 30;
        let e = fast
            .program_local(&local_of(r, &past))
            .unwrap_err()
            .to_string();
        assert!(e.contains("first_slices") && e.contains("of "), "{e}");
        // Another node's GPUs: their first sends are no longer split.
        let mut none = inputs.clone();
        for (c, f) in none.first_slices.iter_mut().enumerate() {
            if c / g != node {
                *f = u32::MAX;
            }
        }
        if fast.program_local(&local_of(r, &none)).unwrap() != want {
            changed += 1;
        }
    }
    assert!(
        changed > 0,
        "no rank's program read another node's first slices"
    );
}

/// `JobInputs` (what a job gathers, from the whole matrix): none where
/// the planner plans no staged rank (other algorithms, a mesh); a matrix,
/// rank or topology that does not fit, or a matrix other than the one the
/// inputs were computed from, is bad input, not a panic; and a rank's
/// `LocalTraffic` from it carries no `node_splits`.
#[test]
fn job_inputs_are_checked() {
    let topo = Topology::preset("dgx-h100", 4, Some(2)).unwrap();
    let m = matrix(8, 11, 1, 1 << 20);
    for alg in [Algorithm::Direct, Algorithm::Pxn, Algorithm::Auto] {
        let mut p = Planner::for_algorithm(&topo, alg, PlannerOptions::default()).unwrap();
        assert_eq!(
            JobInputs::from_matrix(&mut p, &topo, &m).unwrap(),
            None,
            "{alg}"
        );
    }
    let mesh = Topology::preset("mi300x", 2, Some(4)).unwrap();
    let mut on_mesh =
        Planner::for_algorithm(&mesh, Algorithm::Fast, PlannerOptions::default()).unwrap();
    let mesh_m = matrix(8, 12, 1, 1 << 20);
    assert_eq!(
        JobInputs::from_matrix(&mut on_mesh, &mesh, &mesh_m).unwrap(),
        None
    );
    let mut fast =
        Planner::for_algorithm(&topo, Algorithm::Fast, PlannerOptions::default()).unwrap();
    assert!(matches!(
        JobInputs::from_matrix(&mut fast, &topo, &matrix(6, 1, 1, 100)),
        Err(Error::Input(_))
    ));
    let other = Topology::preset("dgx-h100", 2, Some(4)).unwrap();
    assert!(matches!(
        JobInputs::from_matrix(&mut fast, &other, &m),
        Err(Error::Input(_))
    ));
    let job = JobInputs::from_matrix(&mut fast, &topo, &m)
        .unwrap()
        .unwrap();
    assert!(!job.merged());
    assert_eq!(job.parts().len(), topo.nodes());
    let local = job.local(&m, 3, &topo).unwrap();
    assert!(local.node_splits.is_none());
    assert_eq!(local.lane_sums, Some(job.lane_sums(3).unwrap()));
    assert_eq!(local.stage_inputs.as_ref(), job.stage_inputs());
    assert_eq!(job.own_lens(3).unwrap(), &job.parts()[1].lanes.len[..]);
    for bad in [
        job.own_lens(8).map(|_| ()),
        job.lane_sums(8).map(|_| ()),
        job.local(&m, 8, &topo).map(|_| ()),
        job.local(&m, 0, &other).map(|_| ()),
        job.local(&matrix(8, 13, 1, 1 << 20), 0, &topo).map(|_| ()),
    ] {
        assert!(matches!(bad, Err(Error::Input(_))), "{bad:?}");
    }
}

/// On the chunked rotation (32 switch nodes), one rank's program reads
/// lane `rail` of a few pairs between other nodes from the lane sums and
/// checks what it reads: a lane that gathers more than it sends there is
/// bad input, named by pair; the rank's own node's row, which its program
/// balances from its own blocks and never reads from the sums, changes
/// nothing.
#[test]
fn lane_sums_are_checked_where_read_on_the_chunked_rotation() {
    let topo = Topology::preset("dgx-h100", 32, Some(2)).unwrap();
    let m = lognormal_nodes(&topo, 41, 100);
    let nn = topo.nodes();
    let mut fast =
        Planner::for_algorithm(&topo, Algorithm::Fast, PlannerOptions::default()).unwrap();
    let job = JobInputs::from_matrix(&mut fast, &topo, &m)
        .unwrap()
        .unwrap();
    let rank = 5;
    let node = rank / topo.gpus_per_node();
    let local = job.local(&m, rank, &topo).unwrap();
    let good = fast.program_local(&local).unwrap();
    // The rank's own row: not read.
    let mut own_row = local.clone();
    let sums = own_row.lane_sums.as_mut().unwrap();
    for b in (0..nn).filter(|&b| b != node) {
        sums.rail_gathered[node * nn + b] = sums.rail_len[node * nn + b] + 1;
    }
    assert!(own_row.check(&topo).is_err(), "the whole check reads it");
    assert_eq!(fast.program_local(&own_row).unwrap(), good);
    // Every pair between two other nodes: the program reads some.
    let mut others = local.clone();
    let sums = others.lane_sums.as_mut().unwrap();
    for a in (0..nn).filter(|&a| a != node) {
        for b in (0..nn).filter(|&b| b != node && b != a) {
            sums.rail_gathered[a * nn + b] = sums.rail_len[a * nn + b] + 1;
        }
    }
    let e = fast.program_local(&others).unwrap_err();
    assert!(matches!(e, Error::Input(_)), "{e}");
    assert!(e.to_string().contains("exceeds"), "{e}");
    // And the planner is not left broken by the refusal.
    assert_eq!(fast.program_local(&local).unwrap(), good);
}

/// From `CHUNKED_ROTATION_NODES` (32) switch nodes on, `fast`'s stages
/// are the chunked rotation: each stage one diagonal `(a, (a + k) mod N)`,
/// a pair's pieces in several stages where it is longer than the floor.
/// Every rank's program, planned alone, stitches into the whole plan, in
/// both modes.
#[test]
fn staged_fast_per_rank_chunked_rotation_at_32_nodes() {
    let nodes = 32;
    let topo = Topology::preset("dgx-h100", nodes, Some(2)).unwrap();
    let diag = |s: &StagePair| (s.dst_node as usize + nodes - s.src_node as usize) % nodes;
    let mut cut = 0;
    for (i, sigma) in [(0u64, 5u64), (1, 100)] {
        // Blocks of about 16 MB: pairs longer than the least piece.
        let mut m = lognormal_nodes(&topo, 40 + i, sigma);
        for s in 0..topo.ranks() {
            for d in 0..topo.ranks() {
                m.set(s, d, m.get(s, d) << 8);
            }
        }
        for network in [Network::Ideal, Network::Calibrated] {
            let stages = fast_stages_all_ranks_alone(&topo, &m, network);
            let mut of_stage = std::collections::BTreeMap::new();
            for s in &stages {
                let k = *of_stage.entry(s.stage).or_insert_with(|| diag(s));
                assert_eq!(k, diag(s), "stage {} mixes rotations", s.stage);
            }
            let pairs: std::collections::BTreeSet<_> =
                stages.iter().map(|s| (s.src_node, s.dst_node)).collect();
            cut += usize::from(pairs.len() < stages.len());
        }
    }
    assert!(cut > 0, "no pair was cut into pieces");
}
