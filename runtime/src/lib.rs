//! Switchyard's runtime: executes a [`Plan`] on real buffers and checks every
//! byte it delivers.
//!
//! Owns: the [`Backend`] trait, the CPU reference backend ([`cpu`]), the CUDA
//! backend ([`cuda`], device code behind the `cuda` feature), the input
//! pattern and the byte-for-byte check ([`pattern`]), and the dependency-graph
//! helpers both backends share ([`dag`]). It knows plans and buffers, never how
//! a plan was scheduled, and it never turns bytes into modelled time (the
//! simulator does that): the seconds it reports are measured.
//!
//! Safety contract: before moving a byte, every backend runs the compiler's
//! verifier on the plan itself ([`precheck`]); callers need not verify. A plan
//! whose ranges lie outside their buffers is refused, a plan with a dependency
//! cycle is reported as a deadlock, a plan that could race (two writers of one
//! byte, or a read not ordered after its write) runs one transfer at a time,
//! and a plan that merely puts bytes in the wrong place runs normally and fails
//! the output check.

pub mod cpu;
pub mod cuda;
pub mod dag;
pub mod pattern;

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::Serialize;
use switchyard_compiler::{verify, Layout, Path, Plan, TrafficMatrix, VerifyError};
use thiserror::Error;

pub use pattern::BadRange;

/// Why a run could not produce a verdict. A run that completes but delivers
/// wrong bytes is not an error: it is a [`RunReport`] with `verified: false`.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum RuntimeError {
    #[error("plan is for {plan} ranks but the traffic has {traffic}")]
    Ranks { plan: usize, traffic: usize },
    /// The plan cannot be executed at all (a range outside its buffer, a
    /// dependency on a transfer that does not exist).
    #[error("plan cannot run: {0}")]
    InvalidPlan(String),
    /// Transfers that can never start: a dependency cycle.
    #[error("deadlock: {stuck} of {total} transfers can never start ({reason})")]
    Deadlock {
        stuck: usize,
        total: usize,
        reason: String,
    },
    /// The watchdog saw nothing finish for too long: `done` of `total`
    /// transfers (CPU) or streams (CUDA) had finished.
    #[error("watchdog: nothing finished for {seconds:.1} s ({done} of {total} finished)")]
    Timeout {
        seconds: f64,
        done: usize,
        total: usize,
    },
    /// The backend cannot run here (not built, no driver, no GPU).
    #[error("{0}")]
    Unavailable(String),
    /// A host buffer the plan needs cannot be allocated.
    #[error("cannot allocate {bytes} bytes for {what}")]
    Memory { what: String, bytes: u64 },
    /// The run needs more memory than is available, found before any
    /// buffer is allocated.
    #[error(
        "{what} need {need} bytes ({}) of {place}, but only {available} bytes ({}) are available",
        human_bytes(*.need),
        human_bytes(*.available)
    )]
    NotEnoughMemory {
        what: String,
        need: u64,
        available: u64,
        place: String,
    },
    /// A CUDA driver or NCCL call failed.
    #[error("{0}")]
    Device(String),
    /// Process-group bootstrap (environment, TCP exchange) failed.
    #[error("bootstrap: {0}")]
    Bootstrap(String),
}

/// Which backend runs the plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    Cpu,
    Cuda,
}

impl BackendKind {
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Cpu => "cpu",
            BackendKind::Cuda => "cuda",
        }
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for BackendKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "cpu" => Ok(BackendKind::Cpu),
            "cuda" => Ok(BackendKind::Cuda),
            _ => Err(format!("unknown backend `{s}` (known: cpu, cuda)")),
        }
    }
}

/// A deliberate fault, injected to prove that the output check catches what
/// it exists to catch (a test aid; `switchyard run --inject`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Inject {
    /// Run the transfers one at a time in reverse plan order, ignoring their
    /// dependencies: a transfer that relays bytes out of scratch then runs
    /// before the transfer that fills that scratch, as a missing wait would
    /// let it. Plans without relays still verify (their transfers touch
    /// disjoint bytes), so a failure means the check saw the ordering.
    ReverseOrder,
}

impl Inject {
    pub fn name(self) -> &'static str {
        match self {
            Inject::ReverseOrder => "reverse-order",
        }
    }
}

impl fmt::Display for Inject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Inject {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "reverse-order" => Ok(Inject::ReverseOrder),
            _ => Err(format!("unknown fault `{s}` (known: reverse-order)")),
        }
    }
}

/// Knobs of a run; each backend uses what concerns it.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// CPU worker threads; 0 means one per available core.
    pub threads: usize,
    /// Watchdog: fail when no transfer finishes for this long.
    pub timeout: Duration,
    /// CUDA: streams (channels) per issuing rank.
    pub channels: usize,
    /// CUDA, single process: how many devices to spread the ranks over
    /// (rank `r` lives on device `r % devices`); 0 means every visible device.
    pub devices: usize,
    /// Run the transfers this many times (outputs are simply rewritten) and
    /// report the fastest; the first run pays for page mapping and warm-up.
    pub iterations: usize,
    /// Also measure a plain copy of the same number of bytes
    /// ([`RunReport::reference_gbps`]).
    pub reference: bool,
    /// CUDA, one process on one device: issue the copies once into a CUDA
    /// graph and replay it for every iteration, so that the time measured is
    /// the copies' and not the host's issuing them (a plan that is run many
    /// times pays the issuing once). Ignored by the CPU backend.
    pub graph: bool,
    /// A deliberate fault (test aid): see [`Inject`].
    pub inject: Option<Inject>,
    /// CUDA, one process (test aid for one-GPU machines): every rank gets a
    /// context of its own (a non-primary one), so that copies between ranks
    /// go through the peer-copy call and event waits cross contexts even
    /// when every rank is on one GPU, as they cross devices on several.
    pub context_per_rank: bool,
    /// CUDA (test aid for one-GPU machines): run a one-rank plan as a
    /// one-process NCCL group whose copies are NCCL sends to itself, so that
    /// the communicator, its groups and send/recv run without a second GPU.
    pub nccl_loopback: bool,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            threads: 0,
            timeout: Duration::from_secs(60),
            channels: 4,
            devices: 0,
            iterations: 1,
            reference: false,
            graph: false,
            inject: None,
            context_per_rank: false,
            nccl_loopback: false,
        }
    }
}

/// Bytes per link class.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LinkBytes {
    /// Copies inside one rank's memory.
    pub local: u64,
    /// Intra-node copies between ranks.
    pub nvlink: u64,
    /// Inter-node transfers.
    pub rdma: u64,
}

impl LinkBytes {
    /// Sums saturate: a plan that copies one range many times (it may, when
    /// it runs serially) must not overflow a report.
    pub fn of(plan: &Plan) -> Self {
        let mut b = LinkBytes::default();
        for t in &plan.transfers {
            let slot = match t.path {
                Path::Local => &mut b.local,
                Path::Nvlink => &mut b.nvlink,
                Path::Rdma { .. } => &mut b.rdma,
            };
            *slot = slot.saturating_add(t.bytes);
        }
        b
    }

    pub fn total(&self) -> u64 {
        self.local
            .saturating_add(self.nvlink)
            .saturating_add(self.rdma)
    }
}

/// `bytes` for a person: `1.5 GB` (decimal units, as the rest of the reports).
pub fn human_bytes(bytes: u64) -> String {
    let b = bytes as f64;
    match bytes {
        0..=999_999 => format!("{:.1} kB", b / 1e3),
        1_000_000..=999_999_999 => format!("{:.1} MB", b / 1e6),
        1_000_000_000..=999_999_999_999 => format!("{:.1} GB", b / 1e9),
        _ => format!("{:.1} TB", b / 1e12),
    }
}

/// `MemAvailable` of a `/proc/meminfo` text, in bytes.
fn parse_mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?;
    let mut words = line.split_whitespace();
    let kib: u64 = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") | None => kib.checked_mul(1024),
        Some(_) => None,
    }
}

/// Host memory available without swapping (`MemAvailable` of
/// `/proc/meminfo`); `None` where that is not known (not Linux).
pub fn available_host_memory() -> Option<u64> {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| parse_mem_available(&t))
}

/// Refuses a run whose buffers (`what`, `need` bytes) cannot fit in the
/// `available` bytes of `place`, before anything is allocated; passes when
/// availability is unknown (allocation failures are still reported).
pub(crate) fn check_memory(
    what: impl FnOnce() -> String,
    need: u64,
    available: Option<u64>,
    place: &str,
) -> Result<(), RuntimeError> {
    match available {
        Some(available) if need > available => Err(RuntimeError::NotEnoughMemory {
            what: what(),
            need,
            available,
            place: place.to_string(),
        }),
        _ => Ok(()),
    }
}

/// Bytes of rank `r`'s three buffers (each at least one byte, as backends
/// allocate them), saturating.
pub(crate) fn rank_bytes(plan: &Plan, layout: &Layout, r: usize) -> u64 {
    [
        layout.input_size(r),
        layout.output_size(r),
        plan.scratch_bytes(r),
    ]
    .iter()
    .fold(0u64, |a, &b| a.saturating_add(b.max(1)))
}

/// Rank `r`'s input, filled with the test pattern, or an error when the
/// host cannot hold it.
pub(crate) fn input_buffer(
    traffic: &TrafficMatrix,
    layout: &Layout,
    r: usize,
) -> Result<Vec<u8>, RuntimeError> {
    let mut input = host_buffer(layout.input_size(r), 0, &format!("the input of rank {r}"))?;
    pattern::fill_input(&mut input, traffic, layout, r);
    Ok(input)
}

/// A host buffer of `len` bytes, each `fill`, or an error naming `what`
/// when the allocator refuses (a plan or matrix asking for petabytes).
pub(crate) fn host_buffer(len: u64, fill: u8, what: &str) -> Result<Vec<u8>, RuntimeError> {
    let fail = || RuntimeError::Memory {
        what: what.to_string(),
        bytes: len,
    };
    let n = usize::try_from(len).map_err(|_| fail())?;
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| fail())?;
    v.resize(n, fill);
    Ok(v)
}

/// What a run did and whether every output byte is right.
#[derive(Clone, Debug, Serialize)]
pub struct RunReport {
    pub backend: BackendKind,
    pub algorithm: String,
    pub ranks: usize,
    pub transfers: usize,
    /// Every output byte holds the input byte the all-to-all(v) layout puts there.
    pub verified: bool,
    /// The first wrong byte range, in rank then source order.
    pub first_bad: Option<String>,
    /// How many output bytes are wrong.
    pub bad_bytes: u64,
    /// Bytes moved between different ranks.
    pub bytes_moved: u64,
    /// Every byte copied, local copies included, by link class.
    pub link_bytes: LinkBytes,
    /// Measured wall time of the transfers (buffer set-up and the check excluded).
    pub seconds: f64,
    /// `link_bytes.total() / seconds`, in GB/s (1e9 bytes/s).
    pub copy_rate_gbps: f64,
    /// With [`RunOptions::reference`]: the rate of one plain copy of
    /// `link_bytes.total()` bytes on this machine (CPU: one thread's `memcpy`;
    /// CUDA: one device-to-device copy), in GB/s.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reference_gbps: Option<f64>,
    /// Workers (CPU threads) or streams (CUDA) the transfers ran on.
    pub lanes: usize,
    /// The plan could race, so it ran one transfer at a time (see [`precheck`]).
    pub serial: bool,
    /// With [`RunOptions::graph`]: seconds to issue the copies once into a
    /// CUDA graph and instantiate it (the cost the replays save).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capture_seconds: Option<f64>,
    /// The first iteration (from 1) whose output was wrong; absent when
    /// every iteration verified. Each iteration starts from poisoned output
    /// and scratch and is checked on its own, and the run stops at the
    /// first wrong one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bad_iteration: Option<usize>,
}

impl RunReport {
    fn new(backend: BackendKind, plan: &Plan, mode: Mode) -> Self {
        RunReport {
            backend,
            algorithm: plan.algorithm.clone(),
            ranks: plan.ranks as usize,
            transfers: plan.transfers.len(),
            verified: false,
            first_bad: None,
            bad_bytes: 0,
            bytes_moved: plan.bytes_moved(),
            link_bytes: LinkBytes::of(plan),
            seconds: 0.0,
            copy_rate_gbps: 0.0,
            reference_gbps: None,
            lanes: 0,
            serial: mode == Mode::Serial,
            capture_seconds: None,
            bad_iteration: None,
        }
    }

    fn finish(&mut self, seconds: f64, verdict: pattern::Verdict) {
        self.seconds = seconds;
        self.copy_rate_gbps = if seconds > 0.0 {
            self.link_bytes.total() as f64 / seconds / 1e9
        } else {
            0.0
        };
        self.verified = verdict.first_bad.is_none();
        self.bad_bytes = verdict.bad_bytes;
        self.first_bad = verdict.first_bad.map(|b| b.to_string());
    }
}

/// The verdicts of a run's iterations: each iteration starts from poisoned
/// output and scratch and is checked on its own; the first wrong one ends
/// the run and is the one reported.
#[derive(Debug, Default)]
pub(crate) struct Checks {
    iterations: usize,
    first_wrong: Option<(usize, pattern::Verdict)>,
}

impl Checks {
    /// Records the next iteration's verdict; `false` when it was wrong
    /// (then there is no point in running more).
    pub(crate) fn record(&mut self, v: pattern::Verdict) -> bool {
        self.iterations += 1;
        if v.first_bad.is_none() && v.bad_bytes == 0 {
            return true;
        }
        self.first_wrong.get_or_insert((self.iterations, v));
        false
    }

    /// The first wrong iteration (from 1) and its verdict.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn first_wrong(&self) -> Option<(usize, &pattern::Verdict)> {
        self.first_wrong.as_ref().map(|(i, v)| (*i, v))
    }

    pub(crate) fn finish(self, report: &mut RunReport, seconds: f64) {
        let (bad_iteration, verdict) = match self.first_wrong {
            Some((i, v)) => (Some(i), v),
            None => (None, pattern::Verdict::default()),
        };
        report.finish(seconds, verdict);
        report.bad_iteration = bad_iteration;
    }
}

/// A way to execute plans.
pub trait Backend {
    fn kind(&self) -> BackendKind;
    /// Runs `plan` as an all-to-all(v) of `traffic` and checks the result.
    fn run(
        &mut self,
        plan: &Plan,
        traffic: &TrafficMatrix,
        opts: &RunOptions,
    ) -> Result<RunReport, RuntimeError>;
}

/// Runs `plan` on the backend `kind` and checks every output byte.
pub fn execute(
    plan: &Plan,
    traffic: &TrafficMatrix,
    kind: BackendKind,
    opts: &RunOptions,
) -> Result<RunReport, RuntimeError> {
    match kind {
        BackendKind::Cpu => cpu::CpuBackend.run(plan, traffic, opts),
        BackendKind::Cuda => cuda::CudaBackend.run(plan, traffic, opts),
    }
}

/// How a plan may be executed, decided by [`precheck`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Race-free: transfers run concurrently as their dependencies allow.
    Concurrent,
    /// The plan has a double write or an unordered read: concurrent transfers
    /// could touch the same bytes, so they run one at a time, in dependency order.
    Serial,
}

/// How many times to run the transfers: a plan that could race runs once,
/// since running it again may read what a later transfer wrote last time.
pub(crate) fn iterations(mode: Mode, opts: &RunOptions) -> usize {
    match mode {
        Mode::Serial => 1,
        Mode::Concurrent => opts.iterations.max(1),
    }
}

/// Runs the verifier and decides whether and how the plan may run.
pub fn precheck(plan: &Plan, traffic: &TrafficMatrix) -> Result<Mode, RuntimeError> {
    match verify(plan, traffic) {
        Ok(_) | Err(VerifyError::Missing { .. }) | Err(VerifyError::Misplaced { .. }) => {
            // The replay finished: bounds, ordering and single writes all hold,
            // only the final placement is wrong, which the byte check will show.
            Ok(Mode::Concurrent)
        }
        Err(VerifyError::ReadBeforeWrite { .. }) | Err(VerifyError::DoubleWrite { .. }) => {
            Ok(Mode::Serial)
        }
        Err(VerifyError::Ranks { plan, traffic }) => Err(RuntimeError::Ranks { plan, traffic }),
        // `Xml` comes from reading a file, never from verifying a plan.
        Err(e @ (VerifyError::Transfer { .. } | VerifyError::Xml { .. })) => {
            Err(RuntimeError::InvalidPlan(e.to_string()))
        }
        Err(VerifyError::Cycle { cycle }) => Err(RuntimeError::Deadlock {
            stuck: cycle.len(),
            total: plan.transfers.len(),
            reason: format!("dependency cycle through transfers {cycle:?}"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_available_is_read_and_runs_that_cannot_fit_are_refused() {
        let text = "MemTotal:       32781636 kB\nMemFree:         1200000 kB\nMemAvailable:   20000000 kB\n";
        assert_eq!(parse_mem_available(text), Some(20_000_000 * 1024));
        assert_eq!(parse_mem_available("MemTotal: 5 kB\n"), None);
        assert_eq!(parse_mem_available("MemAvailable: lots\n"), None);
        assert!(check_memory(|| "x".into(), 10, Some(10), "host memory").is_ok());
        assert!(check_memory(|| "x".into(), u64::MAX, None, "host memory").is_ok());
        let e = check_memory(
            || "the buffers of 16 ranks".into(),
            3_000_000_000,
            Some(2_500_000_000),
            "host memory (MemAvailable)",
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "the buffers of 16 ranks need 3000000000 bytes (3.0 GB) of host memory (MemAvailable), but only 2500000000 bytes (2.5 GB) are available"
        );
        assert_eq!(human_bytes(999), "1.0 kB");
        assert_eq!(human_bytes(u64::MAX), "18446744.1 TB");
        if cfg!(target_os = "linux") {
            assert!(available_host_memory().is_some_and(|b| b > 0));
        }
    }

    #[test]
    fn backend_names_round_trip() {
        for k in [BackendKind::Cpu, BackendKind::Cuda] {
            assert_eq!(k.name().parse::<BackendKind>().unwrap(), k);
        }
        assert!("tpu".parse::<BackendKind>().is_err());
        let f = Inject::ReverseOrder;
        assert_eq!(f.name().parse::<Inject>().unwrap(), f);
        assert!("sideways".parse::<Inject>().is_err());
    }
}
