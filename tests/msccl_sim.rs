//! The plan an MSCCL XML file encodes costs what the plan it was lowered from
//! costs: for every scheduler, on skewed matrices for 2x8 and 4x8
//! DGX-H100, scheduled as `compile --out plan.xml` schedules (`lp` within
//! `PLAN_LANES_PER_GPU` lanes per gpu), the simulated completion times agree
//! within 2%.

use switchyard::compiler::generate::{generate, Pattern, TrafficSpec};
use switchyard::compiler::msccl::{
    assign_paths, parse_xml, to_xml, Layout, XmlOptions, PLAN_LANES_PER_GPU,
};
use switchyard::compiler::sched::{schedule, Options};
use switchyard::compiler::sim::{simulate, SimOptions};
use switchyard::compiler::{Algorithm, Topology};

#[test]
fn xml_plans_simulate_within_two_percent() {
    let sim = SimOptions::default();
    // As `compile --out plan.xml` schedules.
    let sched = Options {
        max_lanes_per_gpu: Some(PLAN_LANES_PER_GPU),
        ..Options::default()
    };
    let mut worst: f64 = 0.0;
    for nodes in [2, 4] {
        let topo = Topology::preset("dgx-h100", nodes, None).unwrap();
        for (seed, pattern) in [
            (1, Pattern::Moe),
            (2, Pattern::Zipf(1.2)),
            (3, Pattern::Lognormal(1.0)),
        ] {
            let mut spec = TrafficSpec::new(topo.ranks(), pattern);
            spec.seed = seed;
            spec.bytes = 256 << 10;
            spec.moe.tokens_per_rank = 512;
            let m = generate(&spec).unwrap();
            for &alg in Algorithm::ALL {
                let plan = schedule(alg, &topo, &m, &sched).unwrap();
                let want = simulate(&topo, &plan, &sim).unwrap().completion_us;
                for layout in [Layout::Padded, Layout::Packed] {
                    let opts = XmlOptions {
                        layout,
                        ..Default::default()
                    };
                    let x = to_xml(&plan, &topo, &m, &opts).unwrap();
                    if alg == Algorithm::Lp {
                        // The cap is there so the file runs every lane the
                        // plan runs at once.
                        assert_eq!(
                            x.lanes_short, 0,
                            "{nodes}x8 {pattern:?} lp: {} tbs wanted",
                            x.tbs_wanted
                        );
                    }
                    // The encoded plan, and the file read back with a topology.
                    let mut back = parse_xml(&x.text, "plan.xml", Some(&m)).unwrap();
                    assign_paths(&mut back, &topo);
                    for (what, p) in [("encoded", &x.plan), ("read back", &back)] {
                        let got = simulate(&topo, p, &sim).unwrap().completion_us;
                        let err = (got - want).abs() / want;
                        eprintln!("{nodes}x8 {pattern:?} {alg} {layout} {what}: {want:.1} us -> {got:.1} us ({:+.2}%), {} dropped deps, {} tbs per gpu ({} wanted, {} lanes short)", 100.0 * (got - want) / want, x.dropped_deps, x.max_tbs_per_gpu, x.tbs_wanted, x.lanes_short);
                        worst = worst.max(err);
                        assert!(err <= 0.02, "{nodes}x8 {pattern:?} {alg} {layout} {what}: plan {want:.2} us, XML {got:.2} us");
                    }
                }
            }
        }
    }
    eprintln!("worst difference {:.3}%", 100.0 * worst);
}
