//! Property tests of the inter-node fabrics: on random small rail-optimized
//! and fat-tree clusters, every scheduler's plan verifies, and simulates at
//! or above the cut bound in both network modes (and, on tiny cases, at or
//! above the LP bound, and `lp` plans too).

use proptest::prelude::*;
use switchyard_compiler::bound::cut_bound;
use switchyard_compiler::generate::{generate, Pattern, TrafficSpec};
use switchyard_compiler::lp::{lp_bound, LpOptions};
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
