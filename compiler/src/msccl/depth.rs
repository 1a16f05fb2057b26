//! `fast`'s file for an executor with fewer threadblocks than its plan
//! wants: the plan made again one send shallower in flight, kept where the
//! executor's rules price its file faster.
//!
//! A staged `fast` plan keeps `D` inter-node sends in flight per GPU
//! (`PlannerOptions::pipeline_depth`); at 8 x 8 under RCCL's 64
//! threadblocks its files run those sends partly one after another
//! (`lanes_short`). One send fewer in flight wants fewer lanes, which
//! helps some files and hurts others (docs/benchmarks.md, "Spare lanes
//! where the plan keeps them busy": 8 x 8 intra-skew 10% faster, log-normal
//! 1-2% slower), so both files are priced, as the lowering prices chunk
//! sizes and packings, and the faster kept.

use super::lower::SCORED_ABOVE;
use super::{to_xml, XmlOptions, XmlPlan};
use crate::error::Result;
use crate::plan::Plan;
use crate::sched::fast::emit::{Emitter, PlannerOptions};
use crate::sim::Network;
use crate::topology::Topology;
use crate::traffic::TrafficMatrix;
use crate::verify::verify_on;

/// Whether `fast`'s file `x` is one a shallower plan may help: priced
/// more than [`SCORED_ABOVE`] behind its plan, and short of lanes.
pub fn may_go_shallower(plan: &Plan, x: &XmlPlan) -> bool {
    plan.algorithm == "fast"
        && x.lanes_short > 0
        && x.executor_price
            .is_some_and(|p| p.over_plan() > SCORED_ABOVE)
}

/// A shallower plan's file kept in place of the default one.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Shallower {
    /// Inter-node sends in flight per GPU of the kept file's plan.
    pub depth: u32,
    /// Those of the plan `fast` makes by default, whose file was replaced.
    pub default_depth: u32,
    /// The replaced file's completion by the executor's rules, us.
    pub default_file_us: f64,
}

/// The faster of `kept`, the file of `fast`'s `plan` (planned for
/// `network` as `sched::schedule` plans it), and the file of the same
/// matrix planned one send shallower in flight, both priced by the
/// executor's rules ([`XmlPlan::executor_price`]); [`Shallower`] where the
/// shallower one is kept. `kept` is returned untouched unless
/// [`may_go_shallower`] holds and the plan is staged with a depth above 1;
/// a shallower plan whose file misses a limit is no candidate.
pub fn shallower_fast(
    plan: &Plan,
    kept: XmlPlan,
    topo: &Topology,
    traffic: &TrafficMatrix,
    network: Network,
    opts: &XmlOptions,
) -> Result<(XmlPlan, Option<Shallower>)> {
    if !may_go_shallower(plan, &kept) {
        return Ok((kept, None));
    }
    // The depth `plan` was made with is not in the plan: planning it again
    // (milliseconds, against the seconds of the lowering below) says it.
    let base = PlannerOptions::for_network(network);
    let mut emitter = Emitter::new(topo, base.clone())?;
    emitter.plan(traffic)?;
    let depth = emitter.pipeline_depth();
    if depth <= 1 || depth == u32::MAX {
        return Ok((kept, None));
    }
    let mut shallow = Emitter::new(
        topo,
        PlannerOptions {
            pipeline_depth: Some(depth - 1),
            ..base
        },
    )?
    .plan(traffic)?;
    shallow.traffic_fingerprint = Some(traffic.fingerprint());
    verify_on(&shallow, traffic, topo)?;
    let Ok(x) = to_xml(&shallow, topo, traffic, opts) else {
        return Ok((kept, None));
    };
    let price = |x: &XmlPlan| x.executor_price.map_or(f64::INFINITY, |p| p.file_us);
    Ok(if price(&x) < price(&kept) {
        let swap = Shallower {
            depth: depth - 1,
            default_depth: depth,
            default_file_us: price(&kept),
        };
        (x, Some(swap))
    } else {
        (kept, None)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::{generate, Pattern, TrafficSpec};
    use crate::msccl::Executor;
    use crate::sched::{schedule, Algorithm, Options};

    #[test]
    fn a_file_within_its_plan_or_not_fast_is_kept_as_it_is() {
        let topo = Topology::preset("dgx-h100", 2, None).unwrap();
        let mut spec = TrafficSpec::new(16, Pattern::Zipf(1.2));
        spec.bytes = 32 << 10;
        let m = generate(&spec).unwrap();
        let opts = XmlOptions {
            executor: Executor::Rccl,
            ..XmlOptions::default()
        };
        for alg in [Algorithm::Fast, Algorithm::Direct] {
            let plan = schedule(alg, &topo, &m, &Options::for_msccl(62)).unwrap();
            let x = to_xml(&plan, &topo, &m, &opts).unwrap();
            // 2 x 8 files fit 64 tbs and run within 3% of their plans.
            assert!(
                !may_go_shallower(&plan, &x),
                "{alg:?}: {:?}",
                x.executor_price
            );
            let text = x.text.clone();
            let (y, swap) = shallower_fast(&plan, x, &topo, &m, Network::Ideal, &opts).unwrap();
            assert_eq!((y.text, swap), (text, None), "{alg:?}");
        }
    }

    #[test]
    #[ignore = "two 8 x 8 lowerings, about 35 s in release: cargo test --release -p switchyard-compiler --lib msccl::depth -- --ignored"]
    fn a_fast_file_short_of_lanes_and_behind_keeps_the_faster_depth() {
        // 8 x 8 intra-skew under RCCL (the executor-rule sweep's case):
        // the depth-4 file runs 13% behind its plan; the depth-3 one is
        // priced too and the faster kept.
        let topo = Topology::preset("dgx-h100", 8, None).unwrap();
        let mut spec = TrafficSpec::new(64, Pattern::IntraSkew(1.2));
        spec.seed = 5;
        spec.bytes = 256 << 10;
        let m = generate(&spec).unwrap();
        let opts = XmlOptions {
            executor: Executor::Rccl,
            ..XmlOptions::default()
        };
        let mut sched = Options::for_msccl(Executor::Rccl.plan_lanes_per_gpu());
        sched.network = Network::Ideal;
        let plan = schedule(Algorithm::Fast, &topo, &m, &sched).unwrap();
        let x = to_xml(&plan, &topo, &m, &opts).unwrap();
        assert!(may_go_shallower(&plan, &x), "{:?}", x.executor_price);
        let before = x.executor_price.unwrap().file_us;
        let (y, swap) = shallower_fast(&plan, x, &topo, &m, Network::Ideal, &opts).unwrap();
        let after = y.executor_price.unwrap();
        assert!(after.file_us < before, "{} -> {}", before, after.file_us);
        let swap = swap.expect("the shallower file is kept");
        assert_eq!((swap.depth, swap.default_depth), (3, 4));
        assert_eq!(swap.default_file_us, before);
        // The kept file encodes the shallower plan (its own price against it).
        assert!(after.over_plan() < SCORED_ABOVE + 0.01, "{after:?}");
    }
}
