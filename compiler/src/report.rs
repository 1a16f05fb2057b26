//! The report of one plan: what `compile --report`, `simulate --json` and
//! the benchmark write (DESIGN.md "CLI"). One constructor, so the commands
//! cannot disagree: the same plan on the same inputs gives the same numbers.
//!
//! `compile_us` is known only to whoever compiled the plan: `compile` fills
//! it in, `simulate` (which reads a finished plan) writes `null`.

use serde::{Deserialize, Serialize};

use crate::bound::{cut_bound_goodput, LowerBound};
use crate::error::Result;
use crate::plan::Plan;
use crate::sched::AutoChoice;
use crate::sim::{simulate_with_progress, Network, SimOptions, SimResult};
use crate::topology::Topology;
use crate::traffic::TrafficMatrix;

/// One link among the hottest.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct HotLink {
    pub link: String,
    /// Bytes over (bandwidth × completion).
    pub utilisation: f64,
}

/// Everything a report states about one plan.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Report {
    pub algorithm: String,
    pub topology: String,
    pub ranks: usize,
    /// Bytes of the traffic matrix, diagonal included.
    pub total_bytes: u64,
    /// Bytes the plan copies between different ranks (relays count twice).
    pub bytes_moved: u64,
    pub network: Network,
    pub completion_us: f64,
    /// The best lower bound: the larger of the cut and LP bounds.
    pub lower_bound_us: f64,
    pub cut_bound_us: f64,
    /// The binding cut, in words.
    pub bound_cut: String,
    pub lp_bound_us: Option<f64>,
    /// completion / lower bound (1 when the bound is 0: no traffic between ranks).
    pub ratio_to_bound: f64,
    /// Time the scheduler took; `null` when the plan was read from a file.
    pub compile_us: Option<f64>,
    pub steps: usize,
    pub transfers: usize,
    /// The three links of highest utilisation.
    pub hottest_links: Vec<HotLink>,
    /// When `auto` chose the plan: what it chose, for which network mode,
    /// and every candidate's estimate (`algorithm` is then the chosen one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto: Option<AutoChoice>,
}

impl Report {
    /// Assembles a report from a simulation and a bound already computed.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        algorithm: &str,
        topo: &Topology,
        traffic: &TrafficMatrix,
        plan: &Plan,
        sim: &SimResult,
        bound: &LowerBound,
        compile_us: Option<f64>,
        network: Network,
    ) -> Report {
        let lower = bound.best_us();
        // With nothing to move between ranks the bound is 0; any plan for
        // such traffic is optimal up to latency, so the ratio is 1.
        let ratio = if lower > 0.0 {
            sim.completion_us / lower
        } else {
            1.0
        };
        Report {
            algorithm: algorithm.to_string(),
            topology: topo.name().to_string(),
            ranks: traffic.ranks(),
            total_bytes: traffic.total(),
            bytes_moved: plan.bytes_moved(),
            network,
            completion_us: sim.completion_us,
            lower_bound_us: lower,
            cut_bound_us: bound.cut_us,
            bound_cut: bound.cut.clone(),
            lp_bound_us: bound.lp_us,
            ratio_to_bound: ratio,
            compile_us,
            steps: plan.steps(),
            transfers: plan.transfers.len(),
            hottest_links: sim
                .hottest_links(topo, 3)
                .into_iter()
                .map(|(_, link, utilisation)| HotLink { link, utilisation })
                .collect(),
            auto: None,
        }
    }

    /// Simulates `plan` and bounds `traffic`, then assembles the report.
    /// `bound` may carry an LP figure computed by the caller; without one the
    /// cut bound is computed here.
    pub fn measure(
        algorithm: &str,
        topo: &Topology,
        traffic: &TrafficMatrix,
        plan: &Plan,
        bound: Option<&LowerBound>,
        compile_us: Option<f64>,
        opts: &SimOptions,
    ) -> Result<Report> {
        let sim = Self::simulate(topo, traffic, plan, opts, &mut |_, _| {})?;
        Ok(Self::assemble(
            algorithm, topo, traffic, plan, &sim, bound, compile_us, opts,
        ))
    }

    /// Simulates `plan` for a report, calling `progress(finished, total)`
    /// as it goes; [`Report::assemble`] then makes the report from it.
    pub fn simulate(
        topo: &Topology,
        traffic: &TrafficMatrix,
        plan: &Plan,
        opts: &SimOptions,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<SimResult> {
        traffic.check_ranks(topo.ranks(), "traffic")?;
        simulate_with_progress(topo, plan, opts, progress)
    }

    /// The report of a simulation already run; without a `bound` the cut
    /// bound is computed here.
    #[allow(clippy::too_many_arguments)]
    pub fn assemble(
        algorithm: &str,
        topo: &Topology,
        traffic: &TrafficMatrix,
        plan: &Plan,
        sim: &SimResult,
        bound: Option<&LowerBound>,
        compile_us: Option<f64>,
        opts: &SimOptions,
    ) -> Report {
        let own;
        // Outside `ideal` the cut bound uses the simulated NIC goodput; a
        // caller's LP figure (line rate) stays a valid, looser bound.
        let goodput = opts.nic_goodput();
        let bound = match bound {
            Some(b) if goodput == 1.0 => b,
            b => {
                own = LowerBound {
                    lp_us: b.and_then(|b| b.lp_us),
                    ..cut_bound_goodput(topo, traffic, goodput)
                };
                &own
            }
        };
        Report::new(
            algorithm,
            topo,
            traffic,
            plan,
            sim,
            bound,
            compile_us,
            opts.network,
        )
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("report serialises")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sched::direct;

    #[test]
    fn report_round_trips_and_has_the_fields() {
        let topo = Topology::preset("dgx-h100", 2, Some(2)).unwrap();
        let m = TrafficMatrix::uniform(4, 1 << 20);
        let plan = direct(&topo, &m);
        let r = Report::measure(
            "direct",
            &topo,
            &m,
            &plan,
            None,
            Some(12.0),
            &SimOptions::default(),
        )
        .unwrap();
        assert!(r.ratio_to_bound >= 1.0 - 1e-9, "{r:?}");
        assert_eq!(r.transfers, 16); // 12 between ranks, 4 local copies
        let text = r.to_json();
        for key in [
            "algorithm",
            "ranks",
            "total_bytes",
            "completion_us",
            "lower_bound_us",
            "ratio_to_bound",
            "compile_us",
            "steps",
            "transfers",
            "network",
        ] {
            assert!(
                text.contains(&format!("\"{key}\"")),
                "{key} missing: {text}"
            );
        }
        assert!(text.contains("\"network\": \"ideal\""), "{text}");
        // serde_json parses floats to within an ulp, not always exactly.
        let back: Report = serde_json::from_str(&text).unwrap();
        assert_eq!(back.bound_cut, r.bound_cut);
        assert_eq!(back.hottest_links.len(), 3);
        assert!((back.completion_us - r.completion_us).abs() <= 1e-12 * r.completion_us);
    }
}
