//! `auto`: picks, for one traffic matrix on one topology, the scheduler
//! whose plan the cost model expects to finish first, and builds only that
//! plan.
//!
//! Simulating every candidate would cost milliseconds at 64 GPUs, so `auto`
//! estimates instead: it routes each candidate's traffic, aggregated to
//! (node, rail) pairs for the network and to GPU pairs inside a node, over
//! the topology's own paths, and prices the most loaded link as the
//! simulator would over the whole run (bytes / capacity, the capacity of a
//! NIC ingress cut by the congested mode's incast efficiency for the number
//! of NICs that send to it at once), plus what each candidate adds on top
//! of its busiest link: the NVLink hop a relay waits for before its network
//! hop, `fast`'s stage pipeline, path latencies; outside `ideal`, NIC
//! links at the calibrated goodput and each message's cost on its NIC's
//! egress. No path is walked per NIC pair: NIC links take row and column
//! sums, fabric links one path per (leaf or group, rail) pair. docs/algorithms.md
//! (`auto`) gives the equations and the measurements behind the constants.
//!
//! The estimates only rank: their error (up to ~25% either way on the
//! sweep) is larger than the gaps between the best candidates. When the
//! best few are within [`TIE_MARGIN`] of each other, their plans are built
//! and simulated ([`settle_and_build`]) and the fastest wins.
//!
//! Candidates: `direct`, `pxn`, `deepep`, `hierarchical`, `fast`, `spray`.
//! `pairwise` never wins in the cost model (its rounds only add latency to
//! what `direct` sends at once) and `lp` costs seconds, so neither is one.

use serde::{Deserialize, Serialize};

use super::fast::emit::PlannerOptions;
use super::{deepep, direct, hierarchical, pxn, spray, Algorithm};
use crate::error::Result;
use crate::plan::Plan;
use crate::sim::{simulate, Network, SimOptions};
use crate::topology::Topology;
use crate::traffic::TrafficMatrix;
use estimate::Estimator;

mod estimate;
#[cfg(test)]
mod tests;

/// The schedulers `auto` chooses from, in the order it lists them (on a tie
/// the first wins: the simpler plan).
pub const CANDIDATES: &[Algorithm] = &[
    Algorithm::Direct,
    Algorithm::Pxn,
    Algorithm::Deepep,
    Algorithm::Hierarchical,
    Algorithm::Spray,
    Algorithm::Fast,
];

/// One candidate's estimate.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Estimate {
    pub algorithm: String,
    /// Expected completion, microseconds.
    pub estimate_us: f64,
    /// The link (or term) that sets it, in words.
    pub limit: String,
}

/// Estimates within this factor of the best one are closer than the
/// estimates' measured error can separate (docs/algorithms.md, `auto`):
/// those candidates' plans are built and simulated, and the fastest wins.
pub const TIE_MARGIN: f64 = 1.2;
/// At most this many candidates are simulated to settle a tie.
pub const TIE_MAX: usize = 4;

/// A contender's plan, simulated to settle a tie.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Simulated {
    pub algorithm: String,
    /// Simulated completion in the choice's network mode, microseconds.
    pub completion_us: f64,
}

/// What `auto` chose and why: every candidate's estimate, best first, and
/// the simulated plans that settled a tie (none when the estimates decided).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct AutoChoice {
    pub chosen: String,
    pub network: Network,
    pub estimates: Vec<Estimate>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub simulated: Vec<Simulated>,
    /// Per batch ([`Sticky`]): the winner of a tie settled this many calls
    /// earlier, kept because this matrix's estimates cannot have flipped
    /// it (no simulation this call). `None` when this call's estimates or
    /// its own simulations decided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept_for: Option<u32>,
}

impl AutoChoice {
    /// The algorithm chosen.
    pub fn algorithm(&self) -> Algorithm {
        self.chosen.parse().unwrap_or(Algorithm::Direct)
    }

    /// This choice's estimate of `alg`, us (`None`: not estimated).
    pub fn estimate_of(&self, alg: Algorithm) -> Option<f64> {
        self.estimates
            .iter()
            .find(|e| e.algorithm == alg.name())
            .map(|e| e.estimate_us)
    }

    /// The candidates the estimates cannot separate: those within
    /// [`TIE_MARGIN`] of the best estimate, best first, at most
    /// [`TIE_MAX`]. One when the estimates decide alone.
    pub fn contenders(&self) -> Vec<Algorithm> {
        let best = self.estimates.first().map_or(0.0, |e| e.estimate_us);
        let mut out: Vec<Algorithm> = self
            .estimates
            .iter()
            .take(TIE_MAX)
            .take_while(|e| e.estimate_us <= best * TIE_MARGIN)
            .filter_map(|e| e.algorithm.parse().ok())
            .collect();
        if out.is_empty() {
            out.push(self.algorithm());
        }
        out
    }

    /// Settles a tie between the [`AutoChoice::contenders`]: `time(alg)`
    /// is that candidate's completion (its plan, simulated); the fastest
    /// becomes the choice (on equal times, the better estimate). Nothing
    /// is priced when the estimates decide alone.
    pub fn settle(&mut self, mut time: impl FnMut(Algorithm) -> Result<f64>) -> Result<()> {
        let contenders = self.contenders();
        if contenders.len() < 2 {
            return Ok(());
        }
        self.simulated.clear();
        for alg in contenders {
            let completion_us = time(alg)?;
            self.simulated.push(Simulated {
                algorithm: alg.name().into(),
                completion_us,
            });
        }
        if let Some(best) = self
            .simulated
            .iter()
            .min_by(|a, b| a.completion_us.total_cmp(&b.completion_us))
        {
            self.chosen = best.algorithm.clone();
        }
        Ok(())
    }
}

/// Chooses and plans: [`choose`]'s estimates, then, when they leave a tie,
/// each contender's plan from `build`, simulated in `network`'s mode (the
/// plan `auto` must build anyway is one of them). Returns the chosen plan.
pub fn settle_and_build(
    topo: &Topology,
    network: Network,
    choice: &mut AutoChoice,
    mut build: impl FnMut(Algorithm) -> Result<Plan>,
) -> Result<Plan> {
    let opts = SimOptions::new(network);
    let mut plans: Vec<(Algorithm, Plan)> = Vec::new();
    choice.settle(|alg| {
        let plan = build(alg)?;
        let t = simulate(topo, &plan, &opts)?.completion_us;
        plans.push((alg, plan));
        Ok(t)
    })?;
    let alg = choice.algorithm();
    match plans.into_iter().find(|(a, _)| *a == alg) {
        Some((_, plan)) => Ok(plan),
        None => build(alg),
    }
}

/// When a per-batch planner ([`Sticky`]) settles again instead of keeping
/// the winner of its last settle (docs/algorithms.md, `auto`, "Per
/// batch"). Every figure is a ratio of estimates: the simulated times of
/// the last settle, scaled by how much each contender's estimate moved
/// since, predict this matrix's.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StickyRule {
    /// Settle again when a contender's predicted time is within this
    /// factor of the kept winner's (predicted over the winner's, below
    /// `1 + lead`): it may have overtaken it, the estimates' error being
    /// what it is. Negative tolerates a predicted loss that small (the
    /// goal is 1%).
    pub lead: f64,
    /// ... and only once that ratio has also fallen by more than this
    /// fraction since the settle: a contender that simulated within
    /// `lead` of the winner (a near tie: either will do) is settled again
    /// only when the estimates move towards it, not on every call.
    pub slack: f64,
    /// Settle again when a contender's estimate moved by more than this
    /// factor either way since the settle: the matrix changed too much for
    /// the old simulations to say anything.
    pub drift: f64,
    /// Settle again after this many kept calls whatever the estimates say
    /// (what they miss may have moved).
    pub calls: u32,
}

impl Default for StickyRule {
    /// The rule measured in docs/benchmarks.md ("`auto` per batch").
    fn default() -> Self {
        StickyRule {
            lead: 0.02,
            slack: 0.0,
            drift: 1.5,
            calls: 1000,
        }
    }
}

/// A per-batch planner's memory of its last settle: the contenders'
/// estimates and simulated times, and the winner. A training job's
/// matrices drift slowly batch to batch, so a tie settled once usually
/// holds for many batches: [`Sticky::keep`] keeps the winner, without a
/// simulation, until the estimates have moved enough (by [`StickyRule`])
/// that another contender could have overtaken it.
#[derive(Clone, Debug, Default)]
pub struct Sticky {
    rule: StickyRule,
    /// (contender, simulated us, estimate us) at the last settle.
    settled: Vec<(Algorithm, f64, f64)>,
    winner: Option<Algorithm>,
    /// Calls kept since the last settle.
    kept: u32,
    /// Why the last call was not kept.
    last: Option<Resettle>,
}

/// Why a per-batch planner settled a close call again instead of keeping
/// the last settle's winner ([`Sticky::keep`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Resettle {
    /// Nothing settled yet.
    First,
    /// [`StickyRule::calls`] calls kept since the settle.
    Calls,
    /// The winner is no contender any more (its estimate fell behind).
    Dropped,
    /// A contender was not simulated at the settle.
    Unsimulated,
    /// A contender's estimate moved more than [`StickyRule::drift`].
    Drift,
    /// A contender is predicted within [`StickyRule::lead`] of the winner.
    Flip,
}

impl Sticky {
    pub fn new(rule: StickyRule) -> Sticky {
        Sticky {
            rule,
            ..Sticky::default()
        }
    }

    pub fn rule(&self) -> StickyRule {
        self.rule
    }

    /// The winner of the last settle if it still holds for `choice` (a
    /// tie: two contenders or more), noted in `choice` (`chosen`,
    /// `kept_for`); `None` when the tie must be settled again: no settle
    /// yet, a contender not simulated then, an estimate moved more than
    /// `rule.drift`, a contender predicted within `rule.lead` of the
    /// winner, or `rule.calls` calls kept already.
    pub fn keep(&mut self, choice: &mut AutoChoice) -> Option<Algorithm> {
        match self.check(choice) {
            Ok(w) => {
                self.kept += 1;
                self.last = None;
                choice.chosen = w.name().into();
                choice.kept_for = Some(self.kept);
                Some(w)
            }
            Err(why) => {
                self.last = Some(why);
                None
            }
        }
    }

    /// Why the last [`Sticky::keep`] did not keep (`None` when it kept).
    pub fn last_resettle(&self) -> Option<Resettle> {
        self.last
    }

    fn check(&self, choice: &AutoChoice) -> std::result::Result<Algorithm, Resettle> {
        let w = self.winner.ok_or(Resettle::First)?;
        if self.kept >= self.rule.calls {
            return Err(Resettle::Calls);
        }
        let contenders = choice.contenders();
        if !contenders.contains(&w) {
            return Err(Resettle::Dropped);
        }
        // Each contender's time now, predicted: its simulated time scaled
        // by how far its estimate moved.
        let mut predicted = Vec::with_capacity(contenders.len());
        let mut mine = (f64::NAN, f64::NAN);
        for &a in &contenders {
            let &(_, sim, was) = self
                .settled
                .iter()
                .find(|x| x.0 == a)
                .ok_or(Resettle::Unsimulated)?;
            let moved = choice.estimate_of(a).unwrap_or(f64::NAN) / was;
            // (NaN, from an estimate missing or zero, is never contained.)
            if !(1.0 / self.rule.drift..=self.rule.drift).contains(&moved) {
                return Err(Resettle::Drift);
            }
            if a == w {
                mine = (sim, sim * moved);
            }
            predicted.push((a, sim, sim * moved));
        }
        // Over the winner's: predicted now, and simulated at the settle.
        let flips = predicted.iter().any(|&(a, was, now)| {
            let ratio = now / mine.1;
            a != w && ratio < (1.0 + self.rule.lead).min(was / mine.0 * (1.0 - self.rule.slack))
        });
        if flips {
            return Err(Resettle::Flip);
        }
        Ok(w)
    }

    /// Remembers a settled `choice` (its `simulated` contenders and
    /// their estimates); a choice without simulations leaves the memory
    /// as it was.
    pub fn remember(&mut self, choice: &AutoChoice) {
        let settled: Vec<(Algorithm, f64, f64)> = choice
            .simulated
            .iter()
            .filter_map(|s| {
                let a: Algorithm = s.algorithm.parse().ok()?;
                Some((a, s.completion_us, choice.estimate_of(a)?))
            })
            .collect();
        if settled.is_empty() {
            return;
        }
        self.settled = settled;
        self.winner = Some(choice.algorithm());
        self.kept = 0;
    }
}

/// Plans with the candidate that finishes first: the estimates' pick, or,
/// when they are too close to call, the fastest contender in the
/// simulator ([`settle_and_build`]). The plan is the chosen
/// scheduler's own, `algorithm` included (`fast`, not `auto`): whoever
/// reads it knows what runs; the choice and its reasons are in the
/// [`AutoChoice`] (the report's `auto` field).
pub fn auto(
    topo: &Topology,
    traffic: &TrafficMatrix,
    network: Network,
) -> Result<(Plan, AutoChoice)> {
    traffic.check_ranks(topo.ranks(), "traffic")?;
    let mut choice = choose(topo, traffic, network);
    let mut plan = settle_and_build(topo, network, &mut choice, |alg| {
        build(alg, topo, traffic, network)
    })?;
    // As `sched::schedule` does: the plan names the matrix it was made for.
    plan.traffic_fingerprint = Some(traffic.fingerprint());
    Ok((plan, choice))
}

fn build(
    alg: Algorithm,
    topo: &Topology,
    traffic: &TrafficMatrix,
    network: Network,
) -> Result<Plan> {
    Ok(match alg {
        Algorithm::Pxn => pxn(topo, traffic),
        Algorithm::Deepep => deepep(topo, traffic),
        Algorithm::Hierarchical => hierarchical(topo, traffic),
        Algorithm::Fast => {
            super::fast::fast_with(topo, traffic, PlannerOptions::for_network(network))?
        }
        Algorithm::Spray => spray(topo, traffic)?,
        _ => direct(topo, traffic),
    })
}

/// Estimates every candidate and picks the smallest estimate. A `links`
/// topology has no rails or nodes to relay through: `direct` it is.
pub fn choose(topo: &Topology, traffic: &TrafficMatrix, network: Network) -> AutoChoice {
    let mut estimates = if topo.is_hierarchical() && topo.nics_per_node() > 0 && topo.nodes() > 1 {
        Estimator::new(topo, traffic, network).all()
    } else {
        vec![Estimate {
            algorithm: "direct".into(),
            estimate_us: 0.0,
            limit: "no rails to balance over (a links topology or one node)".into(),
        }]
    };
    estimates.sort_by(|a, b| a.estimate_us.total_cmp(&b.estimate_us));
    AutoChoice {
        chosen: estimates[0].algorithm.clone(),
        network,
        estimates,
        simulated: Vec::new(),
        kept_for: None,
    }
}
