//! Property tests of the inter-node fabrics: on random small rail-optimized
//! and fat-tree clusters, every scheduler's plan verifies, and simulates at
//! or above the cut bound in both network modes (and, on tiny cases, at or
//! above the LP bound, and `lp` plans too).

use proptest::prelude::*;
use switchyard_compiler::bound::{cut_bound, cut_bound_goodput};
use switchyard_compiler::generate::{generate, Pattern, TrafficSpec};
use switchyard_compiler::lp::{lp_bound, LpOptions};
use switchyard_compiler::planner::{Planner, PlannerOptions};
use switchyard_compiler::sched::{schedule, Options};
use switchyard_compiler::sim::{simulate, Network, SimOptions};
use switchyard_compiler::topology::{FabricKind, FabricSpec, TopologySpec};
use switchyard_compiler::{verify_on, Algorithm, Topology, TrafficMatrix};

/// Ranks up to which `lp` plans and the LP bound are checked too (slow).
const LP_RANKS: usize = 6;

fn cluster() -> impl Strategy<Value = Topology> {
    (
        2usize..=4,
        1usize..=4,
        1usize..=4,
        any::<bool>(),
        1usize..=4,
        prop::sample::select(vec![1.0, 2.0, 4.0]),
    )
        .prop_map(|(nodes, gpus, nics, rails, group, over)| {
            let nics = nics.min(gpus);
            let mut spec =
                TopologySpec::preset_shape("dgx-h100", nodes, Some(gpus), Some(nics)).unwrap();
            let group = group.min(nodes);
            spec.fabric = Some(if rails {
                FabricSpec::rail_optimized(Some(group), over, 0.5)
            } else {
                FabricSpec::fat_tree(group, over, 0.5)
            });
            Topology::from_spec(spec, "prop").unwrap()
        })
}

fn traffic(ranks: usize) -> impl Strategy<Value = TrafficMatrix> {
    (0u64..1000, 0usize..4).prop_map(move |(seed, pat)| {
        let pattern = match pat {
            0 => Pattern::Uniform,
            1 => Pattern::Zipf(1.2),
            2 => Pattern::Hotspot(0.5),
            _ => Pattern::Lognormal(1.0),
        };
        let mut spec = TrafficSpec::new(ranks, pattern);
        spec.seed = seed;
        spec.bytes = 1 << 16;
        generate(&spec).unwrap()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn every_plan_verifies_and_respects_the_bound(
        (topo, m) in cluster().prop_flat_map(|t| {
            let r = t.ranks();
            (Just(t), traffic(r))
        })
    ) {
        let lb = cut_bound(&topo, &m);
        let tiny = topo.ranks() <= LP_RANKS;
        let lp = if tiny {
            Some(lp_bound(&topo, &m, &LpOptions::default()).unwrap())
        } else {
            None
        };
        let bound = lp.map_or(lb.cut_us, |x| x.max(lb.cut_us));
        let algs = [
            Algorithm::Direct,
            Algorithm::Pairwise,
            Algorithm::Hierarchical,
            Algorithm::Fast,
            Algorithm::Spray,
            Algorithm::Lp,
            Algorithm::Pxn,
            Algorithm::Deepep,
            Algorithm::Auto,
        ];
        for alg in algs.into_iter().filter(|&a| tiny || a != Algorithm::Lp) {
            let plan = schedule(alg, &topo, &m, &Options::default())
                .map_err(|e| TestCaseError::fail(format!("{alg}: {e}")))?;
            prop_assert!(verify_on(&plan, &m, &topo).is_ok(), "{alg}: {:?}", verify_on(&plan, &m, &topo));
            for network in [Network::Ideal, Network::Congested] {
                let opts = SimOptions { network, ..SimOptions::default() };
                let r = simulate(&topo, &plan, &opts).unwrap();
                prop_assert!(
                    r.completion_us >= bound * (1.0 - 1e-6),
                    "{alg} {network:?} on {:?}: completion {} below bound {} ({lb:?}, lp {lp:?})",
                    topo.fabric_kind(), r.completion_us, bound
                );
            }
        }
    }
}

/// The rail fabric's one-switch paths are what makes `hierarchical` (whose
/// inter-node sends stay on the destination's rail) beat `direct` (which
/// crosses rails through an oversubscribed spine) there, while on a
/// full-bisection fat-tree the two move the same bytes over the NICs.
#[test]
fn rail_aligned_plans_avoid_the_spine() {
    let mut spec = TopologySpec::preset("dgx-h100", 4, Some(4)).unwrap();
    spec.fabric = Some(FabricSpec::rail_optimized(None, 4.0, 0.5));
    let topo = Topology::from_spec(spec, "rail").unwrap();
    assert_eq!(topo.fabric_kind(), Some(FabricKind::RailOptimized));
    let m = TrafficMatrix::uniform(16, 1 << 20);
    let time = |alg| {
        let plan = schedule(alg, &topo, &m, &Options::default()).unwrap();
        simulate(&topo, &plan, &SimOptions::default())
            .unwrap()
            .completion_us
    };
    let (direct, hier) = (time(Algorithm::Direct), time(Algorithm::Hierarchical));
    assert!(
        hier < 0.75 * direct,
        "hierarchical {hier} vs direct {direct}"
    );
    let lb = cut_bound(&topo, &m);
    assert!(hier >= lb.cut_us);
}

/// The node pairs of each stage (`Transfer::step`) of a plan's inter-node
/// sends must form a partial permutation: no node sends to two nodes, or
/// receives from two, in one stage.
fn stages_are_permutations(plan: &switchyard_compiler::Plan, gpus: usize) -> Result<(), String> {
    use std::collections::HashMap;
    let mut out: HashMap<(u32, usize), usize> = HashMap::new();
    let mut inn: HashMap<(u32, usize), usize> = HashMap::new();
    for t in &plan.transfers {
        if !matches!(t.path, switchyard_compiler::plan::Path::Rdma { .. }) {
            continue;
        }
        let (a, b) = (t.src as usize / gpus, t.dst as usize / gpus);
        if *out.entry((t.step, a)).or_insert(b) != b || *inn.entry((t.step, b)).or_insert(a) != a {
            return Err(format!(
                "stage {}: node {a} -> {b} shares a NIC side",
                t.step
            ));
        }
    }
    Ok(())
}

/// Oversubscribed fabrics where the uplinks (or a rail group's spine
/// links) are the cut: 2 to 4 leaves or groups of 2 to 4 nodes, 2:1 and
/// 4:1, traffic that loads the uplinks (node pairs even, log-normal, MoE).
fn oversubscribed() -> impl Strategy<Value = Topology> {
    (
        2usize..=4,
        2usize..=4,
        prop::sample::select(vec![2usize, 4]),
        any::<bool>(),
        prop::sample::select(vec![2.0, 4.0]),
    )
        .prop_map(|(leaves, per_leaf, gpus, rails, over)| {
            let mut spec =
                TopologySpec::preset_shape("dgx-h100", leaves * per_leaf, Some(gpus), Some(gpus))
                    .unwrap();
            spec.fabric = Some(if rails {
                FabricSpec::rail_optimized(Some(per_leaf), over, 1.0)
            } else {
                FabricSpec::fat_tree(per_leaf, over, 1.0)
            });
            Topology::from_spec(spec, "oversubscribed").unwrap()
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// `fast` on fabrics whose uplinks bind (its fabric-aware stages,
    /// sched/fast/leaves.rs): the plan verifies, every stage is a partial
    /// permutation of nodes, and it completes at or above the bound in the
    /// ideal and calibrated modes (each against its own bound).
    #[test]
    fn fast_on_oversubscribed_fabrics(
        (topo, seed, pat) in (oversubscribed(), 0u64..1000, 0usize..3)
    ) {
        let pattern = match pat {
            0 => Pattern::IntraSkew(1.2),
            1 => Pattern::Lognormal(1.0),
            _ => Pattern::Zipf(1.0),
        };
        let mut spec = TrafficSpec::new(topo.ranks(), pattern);
        spec.seed = seed;
        spec.gpus_per_node = topo.gpus_per_node();
        spec.bytes = 1 << 20;
        spec.moe.tokens_per_rank = 256;
        let m = generate(&spec).unwrap();
        let mut planner = Planner::fast(&topo, PlannerOptions::default()).unwrap();
        let plan = planner.plan(&m).unwrap();
        prop_assert!(verify_on(&plan, &m, &topo).is_ok(), "{:?}", verify_on(&plan, &m, &topo));
        if !planner.merged() {
            let g = topo.gpus_per_node();
            prop_assert!(stages_are_permutations(&plan, g).is_ok(), "{:?}", stages_are_permutations(&plan, g));
        }
        for network in [Network::Ideal, Network::Calibrated] {
            let opts = SimOptions::new(network);
            let bound = cut_bound_goodput(&topo, &m, opts.nic_goodput()).best_us();
            let t = simulate(&topo, &plan, &opts).unwrap().completion_us;
            prop_assert!(t >= bound * (1.0 - 1e-6), "{network:?}: {t} below the bound {bound}");
        }
    }
}

/// Where the leaf uplinks are the cut and the node matrix is even (every
/// node pair carries the same bytes), node permutations alone left the
/// uplinks idle in every stage that paired nodes inside their leaves (8x8
/// fat-tree 2:1 intra-node skew: 1.39x the bound); the layered stages keep
/// them busy throughout.
/// 8x8 DGX-H100 on `fabric` with intra-node-skewed traffic (1.2, seed 1):
/// the case where oversubscribed uplinks bind.
fn intra_skew_8x8(fabric: FabricSpec) -> (Topology, TrafficMatrix) {
    let mut spec = TopologySpec::preset("dgx-h100", 8, None).unwrap();
    spec.fabric = Some(fabric);
    let topo = Topology::from_spec(spec, "leaves").unwrap();
    let mut spec = TrafficSpec::new(topo.ranks(), Pattern::IntraSkew(1.2));
    spec.seed = 1;
    let m = generate(&spec).unwrap();
    (topo, m)
}

#[test]
fn fast_keeps_oversubscribed_uplinks_busy() {
    for (over, fabric) in [
        (2.0, FabricSpec::fat_tree(4, 2.0, 1.0)),
        (4.0, FabricSpec::fat_tree(4, 4.0, 1.0)),
        (2.0, FabricSpec::rail_optimized(Some(4), 2.0, 1.0)),
    ] {
        let (topo, m) = intra_skew_8x8(fabric);
        let lb = cut_bound(&topo, &m);
        assert!(
            lb.cut.contains("uplink"),
            "{over}:1: the uplinks should bind, not {}",
            lb.cut
        );
        let plan = schedule(Algorithm::Fast, &topo, &m, &Options::default()).unwrap();
        verify_on(&plan, &m, &topo).unwrap();
        stages_are_permutations(&plan, 8).unwrap();
        let t = simulate(&topo, &plan, &SimOptions::default())
            .unwrap()
            .completion_us;
        let ratio = t / lb.best_us();
        assert!(
            (1.0..1.10).contains(&ratio),
            "{over}:1 {:?}: {ratio}",
            topo.fabric_kind()
        );
    }
}

/// On a rail-optimized fabric with an oversubscribed spine, `fast` keeps
/// every inter-node send on its rail, even for uniform traffic, where on
/// other fabrics it sends block by block from GPU to GPU (direct lanes,
/// 7/8 of which would cross rails and climb the spine).
#[test]
fn fast_stays_off_an_oversubscribed_spine() {
    let mut spec = TopologySpec::preset("dgx-h100", 4, None).unwrap();
    spec.fabric = Some(FabricSpec::rail_optimized(None, 2.0, 1.0));
    let topo = Topology::from_spec(spec, "rail").unwrap();
    let m = TrafficMatrix::uniform(32, 1 << 20);
    let plan = schedule(Algorithm::Fast, &topo, &m, &Options::default()).unwrap();
    verify_on(&plan, &m, &topo).unwrap();
    let g = topo.gpus_per_node();
    for t in &plan.transfers {
        if matches!(t.path, switchyard_compiler::plan::Path::Rdma { .. }) {
            assert_eq!(
                topo.rail_of(t.src as usize % g),
                topo.rail_of(t.dst as usize % g),
                "{t:?} crosses rails"
            );
        }
    }
    let t = simulate(&topo, &plan, &SimOptions::default())
        .unwrap()
        .completion_us;
    let ratio = t / cut_bound(&topo, &m).best_us();
    assert!(ratio < 1.10, "{ratio}");
}

/// Two of the calibrated mode's worst fabric-bound cases of issue 24 (8x8
/// intra-node skew 1.2 on fat-tree 2:1 and rail-optimized 2:1, leaf
/// uplinks or spine links the cut), planned for the mode they run in:
/// within 1.20 of the goodput bound. A plan made for line rate pays the
/// per-message cost on its many small sends (1.194 and 1.214 that way);
/// planned with `PlannerOptions::for_network` its sends are fewer and
/// larger (1.121 and 1.132; docs/benchmarks.md).
#[test]
fn fast_planned_for_calibrated_stays_near_the_bound_where_uplinks_bind() {
    let cal = SimOptions::new(Network::Calibrated);
    for fabric in [
        FabricSpec::fat_tree(4, 2.0, 1.0),
        FabricSpec::rail_optimized(Some(4), 2.0, 1.0),
    ] {
        let (topo, m) = intra_skew_8x8(fabric);
        let bound = cut_bound_goodput(&topo, &m, cal.nic_goodput()).best_us();
        let ratio = |opts: PlannerOptions| {
            let plan = Planner::fast(&topo, opts).unwrap().plan(&m).unwrap();
            verify_on(&plan, &m, &topo).unwrap();
            simulate(&topo, &plan, &cal).unwrap().completion_us / bound
        };
        let planned = ratio(PlannerOptions::for_network(Network::Calibrated));
        let line_rate = ratio(PlannerOptions::default());
        let kind = topo.fabric_kind();
        assert!((1.0..1.20).contains(&planned), "{kind:?}: {planned}");
        assert!(planned < line_rate, "{kind:?}: {planned} vs {line_rate}");
    }
}

/// The last calibrated case of issue 24's fabric sweep above 1.20: fat-tree
/// 4:1, 16x8 MoE Zipf 1.2 seed 1, where the downlink into the hot
/// receiver's leaf and that receiver's NICs are both within 2% of the
/// bound. With the plain stages the hot node took its in-leaf bytes last,
/// while the downlink idled (1.224); its in-leaf receipts now run first,
/// paired with its leaf-mates' crossing receipts (1.154; docs/benchmarks.md).
#[test]
fn fast_pairs_the_hot_receivers_in_leaf_stages_with_crossing_ones() {
    let mut spec = TopologySpec::preset("dgx-h100", 16, None).unwrap();
    spec.fabric = Some(FabricSpec::fat_tree(4, 4.0, 1.0));
    let topo = Topology::from_spec(spec, "fat-tree:4").unwrap();
    let mut spec = TrafficSpec::new(topo.ranks(), Pattern::Zipf(1.2));
    spec.seed = 1;
    let m = generate(&spec).unwrap();
    let cal = SimOptions::new(Network::Calibrated);
    let lb = cut_bound_goodput(&topo, &m, cal.nic_goodput());
    assert!(lb.cut.contains("downlink"), "{}", lb.cut);
    let plan = Planner::fast(&topo, PlannerOptions::for_network(Network::Calibrated))
        .unwrap()
        .plan(&m)
        .unwrap();
    verify_on(&plan, &m, &topo).unwrap();
    stages_are_permutations(&plan, 8).unwrap();
    let ratio = simulate(&topo, &plan, &cal).unwrap().completion_us / lb.best_us();
    assert!((1.0..1.20).contains(&ratio), "{ratio}");
}
