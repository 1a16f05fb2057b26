//! Property tests of the verifier: it accepts every baseline plan on random
//! clusters and matrices, and rejects a plan with one transfer dropped,
//! duplicated, mis-addressed or made cyclic.

use proptest::prelude::*;
use switchyard_compiler::sched::{schedule, Options};
use switchyard_compiler::topology::{IntraKind, IntraSpec, NicSpec, TopologySpec};
use switchyard_compiler::{verify_on, Algorithm, Plan, Topology, TrafficMatrix};

fn cluster() -> impl Strategy<Value = Topology> {
    // Half the clusters with a random rail map (several GPUs may share a NIC, some NICs idle).
    let rails = prop::option::of(prop::array::uniform4(0usize..8));
    (1usize..4, 1usize..5, any::<bool>(), 1usize..5, rails).prop_map(
        |(nodes, gpus, mesh, nics, rails)| {
            let spec = TopologySpec {
                name: "random".into(),
                nodes,
                gpus_per_node: gpus,
                intra: Some(IntraSpec {
                    kind: if mesh {
                        IntraKind::Mesh
                    } else {
                        IntraKind::Switch
                    },
                    bandwidth_gbps: 300.0,
                    latency_us: 1.0,
                }),
                nic: Some(NicSpec {
                    per_node: nics,
                    bandwidth_gbps: 50.0,
                    latency_us: 3.0,
                    gpu_nic: rails.map(|r| r[..gpus].iter().map(|k| k % nics).collect()),
                }),
                fabric: None,
                links: None,
            };
            Topology::from_spec(spec, "random").expect("valid random cluster")
        },
    )
}

fn case() -> impl Strategy<Value = (Topology, TrafficMatrix, usize)> {
    cluster().prop_flat_map(|topo| {
        let n = topo.ranks();
        // A third of the blocks empty, the rest up to 4 KiB.
        let cells = prop::collection::vec(prop_oneof![Just(0u64), 1u64..4096, 1u64..4096], n * n);
        (Just(topo), cells, 0..Algorithm::ALL.len()).prop_map(move |(topo, cells, alg)| {
            let rows = cells.chunks(n).map(<[u64]>::to_vec).collect();
            (topo, TrafficMatrix::from_rows(rows), alg)
        })
    })
}

fn plan_for(topo: &Topology, m: &TrafficMatrix, alg: usize) -> Plan {
    schedule(Algorithm::ALL[alg], topo, m, &Options::default())
        .expect("baselines schedule any cluster")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn accepts_every_baseline_plan((topo, m, alg) in case()) {
        let plan = plan_for(&topo, &m, alg);
        prop_assert!(verify_on(&plan, &m, &topo).is_ok(), "{:?}", verify_on(&plan, &m, &topo));
    }

    #[test]
    fn rejects_a_dropped_transfer((topo, m, alg) in case(), pick in any::<prop::sample::Index>()) {
        let mut plan = plan_for(&topo, &m, alg);
        let moving: Vec<usize> = (0..plan.transfers.len()).filter(|&i| plan.transfers[i].bytes > 0).collect();
        prop_assume!(!moving.is_empty());
        // Dropping by zeroing keeps every dependency index valid.
        plan.transfers[moving[pick.index(moving.len())]].bytes = 0;
        prop_assert!(verify_on(&plan, &m, &topo).is_err());
    }

    #[test]
    fn rejects_a_duplicated_transfer((topo, m, alg) in case(), pick in any::<prop::sample::Index>()) {
        let mut plan = plan_for(&topo, &m, alg);
        prop_assume!(!plan.transfers.is_empty());
        let t = plan.transfers[pick.index(plan.transfers.len())].clone();
        prop_assume!(t.bytes > 0);
        plan.transfers.push(t);
        prop_assert!(verify_on(&plan, &m, &topo).is_err());
    }

    #[test]
    fn rejects_a_misaddressed_transfer((topo, m, alg) in case(), pick in any::<prop::sample::Index>(), shift in 1u64..64) {
        let mut plan = plan_for(&topo, &m, alg);
        prop_assume!(!plan.transfers.is_empty());
        let i = pick.index(plan.transfers.len());
        prop_assume!(plan.transfers[i].bytes > 0);
        plan.transfers[i].dst_off += shift;
        prop_assert!(verify_on(&plan, &m, &topo).is_err());
    }

    #[test]
    fn rejects_a_cycle((topo, m, alg) in case(), a in any::<prop::sample::Index>(), b in any::<prop::sample::Index>()) {
        let mut plan = plan_for(&topo, &m, alg);
        let n = plan.transfers.len();
        prop_assume!(n >= 2);
        let (a, b) = (a.index(n), b.index(n));
        prop_assume!(a != b);
        plan.transfers[a].deps.push(b as u32);
        plan.transfers[b].deps.push(a as u32);
        let e = verify_on(&plan, &m, &topo).unwrap_err();
        prop_assert!(e.to_string().contains("cycle"), "{}", e);
    }
}

#[test]
fn verifies_a_64x8_direct_plan_quickly() {
    // The verifier must be cheap enough to run on every plan; this is the
    // size of the largest bench cluster (a correctness test, not a timing).
    let topo = Topology::preset("dgx-h100", 64, None).unwrap();
    let m = TrafficMatrix::uniform(512, 4096);
    let plan = schedule(Algorithm::Direct, &topo, &m, &Options::default()).unwrap();
    assert_eq!(plan.transfers.len(), 512 * 512);
    verify_on(&plan, &m, &topo).unwrap();
}
