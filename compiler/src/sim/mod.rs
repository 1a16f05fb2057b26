//! The cost model: an event-driven fluid simulator of a plan on a topology.
//!
//! Owns the only place where bytes become time (DESIGN.md "Cost model",
//! docs/cost-model.md). A transfer becomes ready when all its dependencies
//! have finished, waits its path latency (the sum of its links' latencies),
//! then moves its bytes at its max-min fair rate over the links of its path;
//! rates are recomputed whenever the set of moving transfers changes. Local
//! copies (`src == dst`) cross no link and are modelled as instantaneous;
//! zero-byte transfers finish after their latency.
//!
//! The route of a transfer is the topology's ([`Topology::path_into`]); the
//! plan's `path` field is checked by the verifier, not here.

mod congestion;
mod fair;
mod routes;
mod streams;
#[cfg(test)]
mod tests;

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use congestion::Congestion;
pub use congestion::CongestionModel;
/// Totally ordered f64 for heaps, shared with the bounds.
pub(crate) use fair::Key as OrdKey;
use fair::{Filler, Key, Paths};
pub use streams::simulate_streams;

use crate::error::{Error, InputError, Result};
use crate::plan::Plan;
use crate::topology::{LinkClass, LinkId, Topology};
use crate::verify::VerifyError;

/// Network mode of the cost model (DESIGN.md "Cost model",
/// docs/cost-model.md "Calibration"). The CLI's default is `calibrated`;
/// the library's `Default` stays `ideal`, the line-rate model the bounds
/// are exact for.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum Network {
    /// Max-min fair sharing at line rate only.
    #[default]
    Ideal,
    /// Max-min fair sharing with the measured NIC goodput and per-message
    /// cost ([`Calibration`]): the model fitted to real clusters.
    Calibrated,
    /// `calibrated` plus the small fan-in penalty the measurements allow
    /// ([`SimOptions::congestion`]).
    Congested,
    /// `calibrated` plus a harsh incast and PFC head-of-line model
    /// ([`CongestionModel::stress`], through [`SimOptions::new`]): an
    /// assumption no measurement here supports, for what-if studies only.
    Stress,
}

impl Network {
    pub fn name(self) -> &'static str {
        match self {
            Network::Ideal => "ideal",
            Network::Calibrated => "calibrated",
            Network::Congested => "congested",
            Network::Stress => "stress",
        }
    }

    /// Modes that apply the incast model to NIC ingress links.
    pub fn has_incast(self) -> bool {
        matches!(self, Network::Congested | Network::Stress)
    }
}

impl fmt::Display for Network {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Network {
    type Err = InputError;
    fn from_str(s: &str) -> std::result::Result<Self, InputError> {
        match s {
            "ideal" => Ok(Network::Ideal),
            "calibrated" => Ok(Network::Calibrated),
            "congested" => Ok(Network::Congested),
            "stress" => Ok(Network::Stress),
            other => Err(InputError::new(
                "--network",
                format!(
                    "unknown network mode `{other}` (known: ideal, calibrated, congested, stress)"
                ),
            )),
        }
    }
}

/// Plans with at most this many transfers are simulated exactly by default.
pub const EXACT_TRANSFERS: usize = 20_000;
/// Default grouping tolerance above [`EXACT_TRANSFERS`].
pub const DEFAULT_TOLERANCE: f64 = 0.01;

/// Knobs of the simulator.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SimOptions {
    pub network: Network,
    /// Event-grouping tolerance ε ≥ 0: a transfer may be finished together
    /// with others up to ε of its own duration after its true finish (never
    /// before it). `None`: 0 (exact) for plans of at most
    /// [`EXACT_TRANSFERS`] transfers, [`DEFAULT_TOLERANCE`] above.
    pub tolerance: Option<f64>,
    /// With a tolerance ε > 0, arrivals are grouped too: a transfer whose
    /// latency has elapsed may start moving up to ε of its shortest
    /// possible duration (its bytes, per-message cost included, at its
    /// path's slowest link) later, with the next event, instead of in a
    /// rate recomputation of its own. Off (`false`, the default): every
    /// arrival is an event, as before. Plans that run each threadblock's
    /// steps one after another (MSCCL files) have more arrivals than
    /// finishes; the MSCCL lowering's timeline and `compile`'s simulation
    /// of a file's plan group them (docs/cost-model.md §1).
    pub group_arrivals: bool,
    /// Parameters of the incast model of `congested` and `stress`
    /// ([`SimOptions::new`] gives `stress` [`CongestionModel::stress`]).
    pub congestion: CongestionModel,
    /// NIC goodput and per-message cost of every mode but `ideal`.
    pub calibration: Calibration,
}

/// What real clusters lose against line rate (docs/cost-model.md
/// "Calibration" gives the measurements and the fit).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq)]
pub struct Calibration {
    /// Fraction of a NIC's line rate that all-to-all traffic gets, in (0, 1].
    pub nic_goodput: f64,
    /// Serial cost of each message a NIC sends, microseconds: charged as NIC
    /// egress time (the message's bytes plus this much time at the NIC's rate).
    pub per_message_us: f64,
}

impl Calibration {
    /// Median of the healthy large-message points (0.853), rounded up so the
    /// 6-node lower-bound point (above 50 GB/s) holds.
    pub const NIC_GOODPUT: f64 = 0.86;
    /// Fitted from one point: 8 MiB on 8 x 8 H800 (NVIDIA/nccl#1531),
    /// 337.8 us measured against 190.1 us modelled without it; each us of
    /// it adds 50.5 us there (56 messages per NIC with `pxn`): 2.92 us.
    pub const PER_MESSAGE_US: f64 = 3.0;

    /// Line rate and no per-message cost (the `ideal` mode's).
    pub fn none() -> Self {
        Calibration {
            nic_goodput: 1.0,
            per_message_us: 0.0,
        }
    }
}

impl Default for Calibration {
    fn default() -> Self {
        Calibration {
            nic_goodput: Calibration::NIC_GOODPUT,
            per_message_us: Calibration::PER_MESSAGE_US,
        }
    }
}

impl SimOptions {
    /// The mode's defaults; `stress` gets [`CongestionModel::stress`].
    pub fn new(network: Network) -> Self {
        SimOptions {
            network,
            congestion: match network {
                Network::Stress => CongestionModel::stress(),
                _ => CongestionModel::default(),
            },
            ..SimOptions::default()
        }
    }

    /// `network` at line rate, without per-message costs: the incast model
    /// alone (tests and what-if studies).
    pub fn uncalibrated(network: Network) -> Self {
        SimOptions {
            calibration: Calibration::none(),
            ..SimOptions::new(network)
        }
    }

    /// The NIC goodput this mode simulates with (1 for `ideal`).
    pub fn nic_goodput(&self) -> f64 {
        match self.network {
            Network::Ideal => 1.0,
            _ => self.calibration.nic_goodput,
        }
    }

    /// The tolerance used for a plan of `transfers` transfers.
    pub fn tolerance_for(&self, transfers: usize) -> f64 {
        match self.tolerance {
            Some(e) => e,
            None if transfers <= EXACT_TRANSFERS => 0.0,
            None => DEFAULT_TOLERANCE,
        }
    }
}

/// When one transfer ran, microseconds from the start of the collective.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq)]
pub struct TransferTime {
    /// All dependencies done.
    pub start_us: f64,
    /// Last byte delivered.
    pub end_us: f64,
}

/// What one link carried.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq)]
pub struct LinkUsage {
    pub bytes: f64,
    /// Time during which some transfer moved bytes over the link.
    pub busy_us: f64,
}

/// The simulator's answer.
#[derive(Clone, Debug, PartialEq)]
pub struct SimResult {
    /// When the last transfer finished (0 for an empty plan).
    pub completion_us: f64,
    /// Indexed like the plan's transfers.
    pub transfers: Vec<TransferTime>,
    /// Indexed by [`LinkId`].
    pub links: Vec<LinkUsage>,
    /// Nominal bandwidth of every link, bytes/us (for utilisation).
    bandwidth: Vec<f64>,
    /// Path latency of every transfer, us (indexed like `transfers`); for
    /// a stream's transfer held behind the one it continues
    /// ([`simulate_streams`]), the time from its start until it moved.
    latency: Vec<f64>,
    /// Rate recomputations the run needed (a measure of its cost).
    pub events: usize,
}

impl SimResult {
    /// Mean fraction of a link's capacity used over the whole collective:
    /// bytes / (bandwidth × completion).
    pub fn utilisation(&self, link: LinkId) -> f64 {
        let (Some(u), Some(&bw)) = (
            self.links.get(link as usize),
            self.bandwidth.get(link as usize),
        ) else {
            return 0.0;
        };
        if self.completion_us <= 0.0 {
            return 0.0;
        }
        u.bytes / (bw * self.completion_us)
    }

    /// When transfer `i` began to move bytes: its start plus its path latency
    /// (its start for a local copy; for a stream's transfer, when the one it
    /// continues had delivered its last byte, if later).
    pub fn moving_from_us(&self, i: usize) -> f64 {
        let t = self.transfers[i];
        (t.start_us + self.latency.get(i).copied().unwrap_or(0.0)).min(t.end_us)
    }

    /// Average rate of transfer `i`, bytes/us (= MB/s), over the time it
    /// moved bytes: `bytes / (end − moving_from)`. `None` for a transfer
    /// that took no time moving (local copies, zero bytes).
    pub fn average_rate(&self, i: usize, bytes: u64) -> Option<f64> {
        let moving = self.transfers[i].end_us - self.moving_from_us(i);
        (moving > 0.0 && bytes > 0).then(|| bytes as f64 / moving)
    }

    /// Nominal bandwidth of a link, bytes/us.
    pub fn bandwidth(&self, link: LinkId) -> f64 {
        self.bandwidth.get(link as usize).copied().unwrap_or(0.0)
    }

    /// The `k` links of highest utilisation, hottest first, with their names.
    pub fn hottest_links(&self, topo: &Topology, k: usize) -> Vec<(LinkId, String, f64)> {
        let mut v: Vec<(LinkId, f64)> = (0..self.links.len() as LinkId)
            .filter(|&l| self.links[l as usize].bytes > 0.0)
            .map(|l| (l, self.utilisation(l)))
            .collect();
        v.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        v.truncate(k);
        v.into_iter()
            .map(|(l, u)| (l, topo.link_name(l), u))
            .collect()
    }
}

/// Simulates `plan` on `topo`: when every transfer runs, what every link
/// carries, and the completion time. Errors if the plan does not fit the
/// topology or its dependencies are malformed (an index out of range, a
/// cycle). It prices any plan and checks nothing else: verify plans first.
///
/// ```
/// use switchyard_compiler::bound::cut_bound;
/// use switchyard_compiler::sched::direct;
/// use switchyard_compiler::sim::{simulate, Network, SimOptions};
/// use switchyard_compiler::{Topology, TrafficMatrix};
///
/// let topo = Topology::preset("dgx-h100", 2, None)?;
/// let mut traffic = TrafficMatrix::uniform(topo.ranks(), 1 << 20);
/// for s in 0..topo.ranks() {
///     traffic.set(s, 15, 8 << 20); // everyone sends 8 MiB to rank 15: incast
/// }
/// let plan = direct(&topo, &traffic);
/// let ideal = simulate(&topo, &plan, &SimOptions::default())?;
/// let stress = simulate(&topo, &plan, &SimOptions::uncalibrated(Network::Stress))?;
/// let bound = cut_bound(&topo, &traffic).best_us();
/// assert!(ideal.completion_us >= bound); // no plan beats the lower bound
/// assert!(stress.completion_us > ideal.completion_us); // incast costs (an assumption)
/// # Ok::<(), switchyard_compiler::Error>(())
/// ```
pub fn simulate(topo: &Topology, plan: &Plan, opts: &SimOptions) -> Result<SimResult> {
    simulate_with_progress(topo, plan, opts, &mut |_, _| {})
}

/// [`simulate`], calling `progress(finished, total)` with the count of
/// finished transfers after every rate recomputation (for a progress bar
/// on plans that take seconds: a call is nothing beside a recomputation,
/// which visits every moving transfer).
pub fn simulate_with_progress(
    topo: &Topology,
    plan: &Plan,
    opts: &SimOptions,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<SimResult> {
    simulate_inner(topo, plan, opts, None, progress)
}

/// [`simulate_with_progress`], with `streams` ([`simulate_streams`]).
fn simulate_inner(
    topo: &Topology,
    plan: &Plan,
    opts: &SimOptions,
    streams: Option<streams::Streams>,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<SimResult> {
    check_plan(topo, plan)?;
    let eps = opts.tolerance_for(plan.transfers.len());
    if !(eps.is_finite() && eps >= 0.0) {
        return Err(InputError::new(
            "--tolerance",
            format!("must be a non-negative number, got {eps}"),
        )
        .into());
    }
    let c = &opts.calibration;
    if !(c.nic_goodput > 0.0 && c.nic_goodput <= 1.0) {
        return Err(InputError::new(
            "--nic-goodput",
            format!("must be in (0, 1], got {}", c.nic_goodput),
        )
        .into());
    }
    if !(c.per_message_us.is_finite() && c.per_message_us >= 0.0) {
        return Err(InputError::new(
            "--per-message-us",
            format!("must be zero or positive, got {}", c.per_message_us),
        )
        .into());
    }
    let mut sim = Sim::new(topo, plan, opts, eps);
    sim.streams = streams;
    sim.run(progress)
}

/// What a test's reference run of [`simulate`] does the plain way.
#[cfg(test)]
#[derive(Clone, Copy, Debug)]
pub(crate) enum Reference {
    /// A whole fill at every recompute: what the incremental refill must
    /// reproduce exactly.
    WholeFills,
    /// Every moving flow's finish projected at every event: what the kept
    /// projections (`Proj`) must reproduce exactly.
    Sweep,
}

/// [`simulate`] the plain way `how` names (tests only).
#[cfg(test)]
pub(crate) fn simulate_reference(
    topo: &Topology,
    plan: &Plan,
    opts: &SimOptions,
    how: Reference,
) -> Result<SimResult> {
    check_plan(topo, plan)?;
    let eps = opts.tolerance_for(plan.transfers.len());
    let mut sim = Sim::new(topo, plan, opts, eps);
    match how {
        Reference::WholeFills => sim.whole_fills = true,
        Reference::Sweep => sim.sweep_every_flow = true,
    }
    sim.run(&mut |_, _| {})
}

fn check_plan(topo: &Topology, plan: &Plan) -> Result<()> {
    let bad = |reason: String| -> Error { InputError::new("plan", reason).into() };
    if plan.ranks as usize != topo.ranks() || plan.gpus_per_node as usize != topo.gpus_per_node() {
        return Err(bad(format!(
            "plan is for {} ranks of {} GPUs per node, the topology `{}` has {} of {}",
            plan.ranks,
            plan.gpus_per_node,
            topo.name(),
            topo.ranks(),
            topo.gpus_per_node()
        )));
    }
    let n = plan.transfers.len();
    if n >= u32::MAX as usize {
        return Err(bad(format!("too many transfers ({n})")));
    }
    for (i, t) in plan.transfers.iter().enumerate() {
        if t.src >= plan.ranks || t.dst >= plan.ranks {
            return Err(bad(format!(
                "transfer {i}: rank {} out of range (plan has {} ranks)",
                t.src.max(t.dst),
                plan.ranks
            )));
        }
        if let Some(&d) = t.deps.iter().find(|&&d| d as usize >= n || d as usize == i) {
            return Err(bad(format!(
                "transfer {i}: depends on transfer {d}, which {}",
                if d as usize == i {
                    "is itself"
                } else {
                    "does not exist"
                }
            )));
        }
    }
    Ok(())
}

/// Link capacities after `calib`'s NIC goodput, and each transfer's
/// per-message overhead in bytes: `per_message_us` at its NIC egress's
/// (goodput) rate, for every transfer that leaves through a NIC.
fn calibrated(
    topo: &Topology,
    paths: &Paths,
    nominal: &[f64],
    calib: &Calibration,
    n: usize,
) -> (Vec<f64>, Vec<f64>) {
    let is_nic = |l: LinkId| matches!(topo.link(l).class, LinkClass::NicTx | LinkClass::NicRx);
    let cap: Vec<f64> = nominal
        .iter()
        .enumerate()
        .map(|(l, &b)| {
            if is_nic(l as LinkId) {
                b * calib.nic_goodput
            } else {
                b
            }
        })
        .collect();
    let overhead = (0..n as u32)
        .map(|t| {
            paths
                .of(t)
                .iter()
                .find(|&&l| topo.link(l).class == LinkClass::NicTx)
                .map_or(0.0, |&l| calib.per_message_us * cap[l as usize])
        })
        .collect();
    (cap, overhead)
}

/// An arrival: a transfer whose latency ends at `time` and starts moving.
type Arrival = Reverse<(Key, u32)>;

/// Every moving flow's projected finish `f = now + R / x` and latest
/// grouped finish `g = f + ε (f − r)`, as of the last fill that reached it
/// (docs/cost-model.md §1, "Event loop"). Between fills a flow's rate is
/// constant, so these stay its projections up to the rounding of the
/// per-event decrements of its bytes left (relative 1e-16 an event); an
/// event takes their minima without a division per flow, then projects
/// again, exactly as a sweep does, only the flows within a margin of the
/// event's thresholds. The minima, the limit and the finishing flows are
/// therefore the sweep's own values (`Sim::sweep`, the tests' reference).
#[derive(Default)]
struct Proj {
    /// By position: the rate the flow moves at (0 once finished), its
    /// projected finish and latest grouped finish (infinite for a flow
    /// that finished or does not move).
    mv: Vec<f64>,
    fin: Vec<f64>,
    late: Vec<f64>,
    /// Flows near this event's thresholds: position, f, g.
    near: Vec<(u32, f64, f64)>,
    /// Events since every flow was projected again (bounds the drift).
    since: u32,
}

/// Events after which every moving flow is projected again, so that the
/// kept projections never drift by more than about 1e-11 relative.
const REPROJECT: u32 = 1 << 16;

impl Proj {
    /// A flow appended, not moving until its first fill.
    fn admit(&mut self) {
        self.mv.push(0.0);
        self.fin.push(f64::INFINITY);
        self.late.push(f64::INFINITY);
    }

    /// Compaction: position `from` moves to `to` (≤ `from`).
    fn keep(&mut self, from: usize, to: usize) {
        self.mv[to] = self.mv[from];
        self.fin[to] = self.fin[from];
        self.late[to] = self.late[from];
    }

    fn truncate(&mut self, n: usize) {
        self.mv.truncate(n);
        self.fin.truncate(n);
        self.late.truncate(n);
    }

    fn finish(&mut self, p: usize) {
        self.mv[p] = 0.0;
        self.fin[p] = f64::INFINITY;
        self.late[p] = f64::INFINITY;
    }

    /// Flow `p` moves at `r` from `now` with `rem` bytes left: the sweep's
    /// projections at this instant.
    fn project(&mut self, p: usize, r: f64, now: f64, rem: f64, start: f64, eps: f64) {
        self.mv[p] = r;
        if r > 0.0 {
            let f = now + rem / r;
            self.fin[p] = f;
            self.late[p] = f + eps * (f - start);
        } else {
            self.fin[p] = f64::INFINITY;
            self.late[p] = f64::INFINITY;
        }
    }

    /// [`Sim::sweep`]'s limit and candidates, from the kept projections:
    /// each is within `band` of what a sweep would compute now, so the
    /// flows that can be the earliest finish, the earliest latest finish
    /// or finish by the limit are those kept within a few bands of the
    /// kept minima; only they are projected again (the sweep's values).
    #[allow(clippy::too_many_arguments)]
    fn event(
        &mut self,
        now: f64,
        next_arrival: f64,
        eps: f64,
        rate: &[f64],
        rem: &[f64],
        start: &[f64],
        cands: &mut Vec<(u32, f64)>,
    ) -> f64 {
        cands.clear();
        self.since += 1;
        if self.since >= REPROJECT {
            self.since = 0;
            for p in 0..self.fin.len() {
                if self.fin[p].is_finite() {
                    self.project(p, rate[p], now, rem[p], start[p], eps);
                }
            }
        }
        let first_a = min_of(&self.fin);
        if first_a == f64::INFINITY {
            return next_arrival; // nothing moves: only an arrival
        }
        let late_a = min_of(&self.late);
        // The limit is at most max(min(next arrival, g_min), first (1 +
        // 1e-12)); g_min and first are within a band of the kept minima.
        let u = late_a
            .min(next_arrival)
            .max(first_a + first_a.abs() * 2e-12);
        let band = 1e-9 * (1.0 + eps) * (u.abs() + now.abs() + 1.0);
        let tf = u + 3.0 * band;
        let tg = if late_a <= next_arrival + 2.0 * band {
            late_a + 3.0 * band
        } else {
            f64::NEG_INFINITY // every g is past the next arrival
        };
        // Eight flows at a time (a branch-free test of the block first:
        // nearly every block has none).
        self.near.clear();
        let n = self.fin.len();
        let mut base = 0;
        while base < n {
            let end = (base + 8).min(n);
            let mut hit = false;
            for (&f, &g) in self.fin[base..end].iter().zip(&self.late[base..end]) {
                hit |= (f <= tf) | (g <= tg);
            }
            if hit {
                for p in base..end {
                    if self.fin[p] <= tf || self.late[p] <= tg {
                        self.project(p, rate[p], now, rem[p], start[p], eps);
                        self.near.push((p as u32, self.fin[p], self.late[p]));
                    }
                }
            }
            base = end;
        }
        let mut first = f64::INFINITY;
        let mut limit = next_arrival;
        for &(_, f, g) in &self.near {
            if f < first {
                first = f;
            }
            if g < limit {
                limit = g;
            }
        }
        if first < next_arrival {
            limit = limit.max(first + first.abs() * 1e-12).min(next_arrival);
        }
        cands.extend(
            self.near
                .iter()
                .filter(|&&(_, f, _)| f <= limit)
                .map(|&(p, f, _)| (p, f)),
        );
        limit
    }
}

/// The least of `v` (infinite if empty; no NaN in it): four running
/// minima, so the pass is not one chain of dependent comparisons.
fn min_of(v: &[f64]) -> f64 {
    let mut m = [f64::INFINITY; 4];
    let mut chunks = v.chunks_exact(4);
    for c in &mut chunks {
        for (m, &x) in m.iter_mut().zip(c) {
            if x < *m {
                *m = x;
            }
        }
    }
    for &x in chunks.remainder() {
        if x < m[0] {
            m[0] = x;
        }
    }
    m[0].min(m[1]).min(m[2].min(m[3]))
}

struct Sim<'a> {
    plan: &'a Plan,
    eps: f64,
    /// Routes as the rates see them: without twin links.
    paths: Paths,
    /// (dropped, kept): links that carry exactly the flows of a kept link of
    /// no more capacity, so never bind; they get the kept link's usage.
    twins: Vec<(LinkId, LinkId)>,
    latency: Vec<f64>,
    /// Transfers waiting on each transfer (CSR).
    child_off: Vec<u32>,
    children: Vec<u32>,
    waiting: Vec<u32>,
    /// Capacity per link (NIC links at goodput outside `ideal`).
    cap: Vec<f64>,
    /// Nominal (line-rate) capacity per link, for utilisation.
    nominal: Vec<f64>,
    /// Per transfer: bytes standing for its per-message cost (not data).
    overhead: Vec<f64>,
    filler: Filler,
    congestion: Option<Congestion>,
    times: Vec<TransferTime>,
    /// Bytes each transfer moves at its rate: its data plus `overhead`.
    remaining: Vec<f64>,
    arrivals: BinaryHeap<Arrival>,
    finished: usize,
    links: Vec<LinkUsage>,
    events: usize,
    /// Every recompute fills every moving flow (the reference the
    /// incremental refill is tested against).
    whole_fills: bool,
    /// Every event projects every moving flow's finish (a division per
    /// flow) instead of reading the kept projections (`Proj`): the
    /// reference they are tested against.
    sweep_every_flow: bool,
    /// Streams ([`simulate_streams`]): the transfer each one continues
    /// (`NONE`: none), the one continuing it, and when a ready successor's
    /// latency ended while its predecessor still moved (NaN: not held).
    streams: Option<streams::Streams>,
    /// ε of grouped arrivals ([`SimOptions::group_arrivals`]; 0: each
    /// arrival is an event).
    arrival_eps: f64,
    /// Pending arrivals by the latest time they may start moving (`at +
    /// arrival_eps x` shortest duration); admitted ones are dropped lazily.
    deadlines: BinaryHeap<Arrival>,
    admitted: Vec<bool>,
}

impl<'a> Sim<'a> {
    fn new(topo: &Topology, plan: &'a Plan, opts: &SimOptions, eps: f64) -> Self {
        let n = plan.transfers.len();
        let (mut paths, latency) = routes::routes(topo, plan);
        let mut child_off = vec![0u32; n + 1];
        for t in &plan.transfers {
            for &d in &t.deps {
                child_off[d as usize + 1] += 1;
            }
        }
        for i in 0..n {
            child_off[i + 1] += child_off[i];
        }
        let mut children = vec![0u32; child_off[n] as usize];
        let mut fill = child_off.clone();
        for (i, t) in plan.transfers.iter().enumerate() {
            for &d in &t.deps {
                children[fill[d as usize] as usize] = i as u32;
                fill[d as usize] += 1;
            }
        }
        let links = topo.num_links();
        let nominal: Vec<f64> = (0..links as LinkId)
            .map(|l| topo.link(l).bandwidth)
            .collect();
        let calib = match opts.network {
            Network::Ideal => Calibration::none(),
            _ => opts.calibration,
        };
        let (cap, overhead) = calibrated(topo, &paths, &nominal, &calib, n);
        let congestion = opts
            .network
            .has_incast()
            .then(|| Congestion::new(opts.congestion.clone(), topo, &paths, n));
        // NIC links are kept whenever their capacity differs from line rate.
        let twins = routes::twin_links(topo, &paths, opts.network != Network::Ideal);
        if !twins.is_empty() {
            paths = routes::without(&paths, &twins, links);
        }
        Sim {
            plan,
            eps,
            paths,
            twins,
            latency,
            child_off,
            children,
            waiting: plan.transfers.iter().map(|t| t.deps.len() as u32).collect(),
            cap,
            nominal,
            filler: Filler::new(links),
            congestion,
            times: vec![
                TransferTime {
                    start_us: f64::NAN,
                    end_us: f64::NAN,
                };
                n
            ],
            remaining: plan
                .transfers
                .iter()
                .zip(&overhead)
                .map(|(t, o)| t.bytes as f64 + o)
                .collect(),
            overhead,
            arrivals: BinaryHeap::new(),
            finished: 0,
            links: vec![LinkUsage::default(); links],
            events: 0,
            whole_fills: false,
            sweep_every_flow: false,
            streams: None,
            arrival_eps: if opts.group_arrivals { eps } else { 0.0 },
            deadlines: BinaryHeap::new(),
            admitted: if opts.group_arrivals && eps > 0.0 {
                vec![false; n]
            } else {
                Vec::new()
            },
        }
    }

    /// Marks `t` ready at `time`: local copies finish at once, the others
    /// start moving after their latency.
    fn ready(&mut self, t: u32, time: f64, stack: &mut Vec<(u32, f64)>) {
        self.times[t as usize].start_us = time;
        if self.paths.of(t).is_empty() {
            stack.push((t, time));
        } else {
            let at = time + self.latency[t as usize];
            // A stream's transfer moves its first byte after the one it
            // continues has moved its last (held until then).
            if let Some(s) = &mut self.streams {
                if s.hold(t, at, &self.times) {
                    return;
                }
            }
            self.arrive(t, at);
        }
    }

    /// `t` starts moving at `at` (its latency's end), or with grouped
    /// arrivals at the latest `arrival_eps` of its shortest duration later.
    fn arrive(&mut self, t: u32, at: f64) {
        self.arrivals.push(Reverse((Key(at), t)));
        if self.arrival_eps > 0.0 {
            // Its shortest duration: its bytes at its slowest link.
            let slow = self
                .paths
                .of(t)
                .iter()
                .map(|&l| self.cap[l as usize])
                .fold(f64::INFINITY, f64::min);
            let d = self.remaining[t as usize] / slow;
            self.deadlines
                .push(Reverse((Key(at + self.arrival_eps * d), t)));
        }
    }

    /// Finishes `t` at `time` and readies every transfer that was waiting
    /// only on it (and, transitively, local copies that then finish).
    fn finish(&mut self, t: u32, time: f64) {
        let mut stack = vec![(t, time)];
        while let Some((t, time)) = stack.pop() {
            self.times[t as usize].end_us = time;
            self.finished += 1;
            let released = self.streams.as_mut().and_then(|s| s.release(t, time));
            if let Some((c, at)) = released {
                // Its wait before moving, as the result reports it.
                self.latency[c as usize] = at - self.times[c as usize].start_us;
                self.arrive(c, at);
            }
            let (a, b) = (
                self.child_off[t as usize] as usize,
                self.child_off[t as usize + 1] as usize,
            );
            for k in a..b {
                let c = self.children[k];
                self.waiting[c as usize] -= 1;
                if self.waiting[c as usize] == 0 {
                    self.ready(c, time, &mut stack);
                }
            }
        }
    }

    fn run(mut self, progress: &mut dyn FnMut(usize, usize)) -> Result<SimResult> {
        let n = self.plan.transfers.len();
        let mut stack = Vec::new();
        for t in 0..n as u32 {
            if self.waiting[t as usize] == 0 {
                self.ready(t, 0.0, &mut stack);
            }
        }
        for (t, time) in std::mem::take(&mut stack) {
            self.finish(t, time);
        }
        // Moving transfers; finished ones stay as dead entries until half
        // are dead, so neither a finish nor an arrival rebuilds the link
        // index (arrivals are appended to it).
        let mut active: Vec<u32> = Vec::new();
        // By position beside `active`: bytes left and start time, kept
        // contiguous so the per-event sweeps read them in order.
        let mut rem: Vec<f64> = Vec::new();
        let mut start: Vec<f64> = Vec::new();
        let mut dead: Vec<bool> = Vec::new();
        let mut n_dead = 0usize;
        let mut reindex = false;
        // First position the filler has not indexed yet.
        let mut fresh = 0usize;
        let mut rate: Vec<f64> = Vec::new();
        // Flows that may finish in this event, by position, with their
        // projected finish.
        let mut cands: Vec<(u32, f64)> = Vec::new();
        let mut now = 0.0f64;
        let mut changed = false;
        let mut proj = Proj::default();
        loop {
            // Admit every transfer whose latency has elapsed.
            while let Some(&Reverse((Key(at), t))) = self.arrivals.peek() {
                if at > now {
                    break;
                }
                self.arrivals.pop();
                if let Some(a) = self.admitted.get_mut(t as usize) {
                    *a = true;
                }
                if self.plan.transfers[t as usize].bytes == 0 {
                    self.finish(t, at);
                } else {
                    active.push(t);
                    rem.push(self.remaining[t as usize]);
                    start.push(self.times[t as usize].start_us);
                    dead.push(false);
                    proj.admit();
                    changed = true;
                }
            }
            if n_dead * 2 > active.len() {
                let mut keep = 0;
                for pos in 0..active.len() {
                    if !dead[pos] {
                        active[keep] = active[pos];
                        rem[keep] = rem[pos];
                        start[keep] = start[pos];
                        proj.keep(pos, keep);
                        keep += 1;
                    }
                }
                active.truncate(keep);
                rem.truncate(keep);
                start.truncate(keep);
                proj.truncate(keep);
                dead.clear();
                dead.resize(keep, false);
                n_dead = 0;
                reindex = true;
            }
            if active.is_empty() {
                match self.arrivals.peek() {
                    Some(&Reverse((Key(at), _))) => {
                        now = now.max(at);
                        continue;
                    }
                    None => break,
                }
            }
            // A re-index renumbers positions: the filler must see it
            // before the next removal (arrivals and finishes set `changed`).
            debug_assert!(changed || !reindex);
            if changed {
                self.recompute(&active, &dead, reindex, fresh, &mut rate);
                fresh = active.len();
                // The flows whose rates the fill changed get projections as
                // of now (the sweep's values); a flow refilled to the same
                // rate keeps its projection.
                match self.filler.refilled() {
                    Some(flows) => {
                        for &pos in flows {
                            let p = pos as usize;
                            if rate[p].to_bits() != proj.mv[p].to_bits() {
                                proj.project(p, rate[p], now, rem[p], start[p], self.eps);
                            }
                        }
                    }
                    None => {
                        for p in (0..dead.len()).filter(|&p| !dead[p]) {
                            proj.project(p, rate[p], now, rem[p], start[p], self.eps);
                        }
                    }
                }
                self.events += 1;
                progress(self.finished, n);
                changed = false;
                reindex = false;
            }
            // The next event an arrival forces: its latency's end, or with
            // grouped arrivals the earliest latest start of those pending.
            let next_arrival = if self.arrival_eps > 0.0 {
                while let Some(&Reverse((_, t))) = self.deadlines.peek() {
                    if !self.admitted[t as usize] {
                        break;
                    }
                    self.deadlines.pop();
                }
                self.deadlines
                    .peek()
                    .map_or(f64::INFINITY, |&Reverse((Key(at), _))| at)
            } else {
                self.arrivals
                    .peek()
                    .map_or(f64::INFINITY, |&Reverse((Key(at), _))| at)
            };
            // Projected finishes, and the latest instant that delays no
            // transfer by more than eps of its own duration.
            let limit = if self.sweep_every_flow {
                self.sweep(now, next_arrival, &dead, &rate, &rem, &start, &mut cands)
            } else {
                proj.event(now, next_arrival, self.eps, &rate, &rem, &start, &mut cands)
            };
            if !limit.is_finite() {
                return Err(Error::Solver(
                    "simulator stalled: transfers with no bandwidth".to_string(),
                ));
            }
            // Every transfer projected to end by `limit` ends at the group's
            // latest projected finish (never before its own).
            let mut tau = f64::NEG_INFINITY;
            for &(_, f) in &cands {
                tau = tau.max(f);
            }
            if tau == f64::NEG_INFINITY {
                tau = limit; // only an arrival: advance to it
            }
            // Rounding can put a projected finish a hair before now.
            tau = tau.max(now);
            let dt = (tau - now).max(0.0);
            for &l in self.filler.touched() {
                let used = self.filler_used(l);
                if used > 0.0 {
                    let u = &mut self.links[l as usize];
                    u.bytes += used * dt;
                    u.busy_us += dt;
                }
            }
            // The finishing flows first, in position order (their credits
            // to shared links in the order of a sweep), then the others.
            for &(pos, _) in &cands {
                let pos = pos as usize;
                let t = active[pos];
                let moved = rate[pos] * dt;
                // Credit back what the flow did not need.
                let over = moved - rem[pos];
                if over != 0.0 {
                    for &l in self.paths.of(t) {
                        self.links[l as usize].bytes -= over;
                    }
                }
                rem[pos] = 0.0;
                dead[pos] = true;
                proj.finish(pos);
                n_dead += 1;
                self.filler.remove(pos as u32);
                stack.push((t, tau));
            }
            if self.sweep_every_flow {
                for ((left, &r), &d) in rem.iter_mut().zip(&rate).zip(&dead) {
                    if !d {
                        *left -= r * dt;
                    }
                }
            } else {
                // The same values: a finished flow's `mv` is 0, so its
                // bytes left stay, and the pass has no branch.
                for (left, &r) in rem.iter_mut().zip(&proj.mv) {
                    *left -= r * dt;
                }
            }
            now = tau;
            if !stack.is_empty() {
                changed = true;
                for (t, time) in std::mem::take(&mut stack) {
                    self.finish(t, time);
                }
            }
        }
        if self.finished < n {
            let stuck = (0..n).find(|&i| self.times[i].end_us.is_nan()).unwrap_or(0);
            return Err(VerifyError::Transfer {
                index: stuck,
                reason: "never becomes ready: its dependencies form a cycle".to_string(),
            }
            .into());
        }
        // The per-message overhead occupied the links but carried no data.
        for (t, &o) in self.overhead.iter().enumerate() {
            if o > 0.0 {
                for &l in self.paths.of(t as u32) {
                    self.links[l as usize].bytes -= o;
                }
            }
        }
        for &(d, k) in &self.twins {
            self.links[d as usize] = self.links[k as usize];
        }
        let completion_us = self.times.iter().map(|t| t.end_us).fold(0.0, f64::max);
        Ok(SimResult {
            completion_us,
            transfers: self.times,
            links: self.links,
            bandwidth: self.nominal,
            latency: self.latency,
            events: self.events,
        })
    }

    /// Projects every moving flow's finish: the earliest instant that
    /// delays no transfer by more than ε of its own duration (`limit`,
    /// returned) and the flows projected to finish by it (`cands`, in
    /// position order, with their projected finishes). The reference
    /// `Proj::event` reproduces (tests only).
    #[allow(clippy::too_many_arguments)]
    fn sweep(
        &self,
        now: f64,
        next_arrival: f64,
        dead: &[bool],
        rate: &[f64],
        rem: &[f64],
        start: &[f64],
        cands: &mut Vec<(u32, f64)>,
    ) -> f64 {
        // `limit` and `first` only fall during the sweep, and the final
        // limit is at most max(limit, first (1 + 1e-12)) at any point of
        // it, so a flow projected past that bound cannot finish in this
        // event: only the others are kept (in position order) as candidates.
        let mut limit = next_arrival;
        let mut first = f64::INFINITY;
        let eps = self.eps;
        cands.clear();
        for (pos, (((&d, &r), &left), &s0)) in dead.iter().zip(rate).zip(rem).zip(start).enumerate()
        {
            if d || r <= 0.0 {
                continue;
            }
            let f = now + left / r;
            // (Plain comparisons, not `f64::min`, whose NaN handling
            // chains every flow's step to the last one's; nothing here
            // is NaN, so the minima are the same values.)
            if f < first {
                first = f;
            }
            let g = f + eps * (f - s0);
            if g < limit {
                limit = g;
            }
            if f <= limit || f <= first + first.abs() * 1e-12 {
                cands.push((pos as u32, f));
            }
        }
        // Near-ties (rounding) finish together rather than one by one.
        if first < next_arrival {
            limit = limit.max(first + first.abs() * 1e-12).min(next_arrival);
        }
        cands.retain(|&(_, f)| f <= limit);
        limit
    }

    fn filler_used(&self, l: LinkId) -> f64 {
        // (capacities after goodput and incast: what the flows could use)
        let cap = match &self.congestion {
            Some(c) => c.cap[l as usize],
            None => self.cap[l as usize],
        };
        self.filler.used(l, cap)
    }

    /// Rates of the moving transfers; `reindex` after the active list was
    /// compacted (positions renumbered), otherwise the positions from
    /// `fresh` on arrived since the last call and are appended to the index.
    fn recompute(
        &mut self,
        active: &[u32],
        dead: &[bool],
        reindex: bool,
        fresh: usize,
        rate: &mut Vec<f64>,
    ) {
        if reindex {
            self.filler.index(active, &self.paths);
        } else if fresh < active.len() {
            self.filler.append(active, fresh, &self.paths);
        }
        match &mut self.congestion {
            Some(c) => c.fill(&mut self.filler, active, &self.cap, dead, rate),
            // The capacities never change: only the flows connected to
            // the ones that started or finished are filled again.
            None if !self.whole_fills => self.filler.refill(&self.cap, dead, rate),
            None => self.filler.fill(&self.cap, None, dead, rate),
        }
    }
}
