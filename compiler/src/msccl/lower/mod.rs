//! Lowering: a verified Plan to an MSCCL [`Algo`] and its text.
//!
//! 1. Quantise: pick a chunk size `u`, count `K[s][d] = ceil(M[s][d] / u)`
//!    chunks per pair and place them by the layout (spec §11).
//! 2. Trace: replay the plan's transfers in dependency order, earliest start
//!    in the plan's simulated run first, following every byte back to the
//!    block it came from; chunk `c` of a block goes with the transfer that
//!    carries its middle byte. A transfer becomes one operation per
//!    contiguous run of chunks (at most 71), relays go through freshly
//!    allocated scratch chunks.
//! 3. Threadblocks: one per (gpu, peer, direction, channel), local copies in
//!    tbs of their own. A connection's channels are its lanes: the runs of
//!    one transfer go on one lane back to back, transfers the plan runs at
//!    once on different lanes as far as the tb budget allows. Every tb lists
//!    its steps in one global topological order of the operations, so the
//!    k-th send of a connection meets its k-th receive and the lowest
//!    unfinished operation can always run: no deadlock, whatever the FIFO
//!    depth. A tb that would pass 64 steps moves its lane to a further
//!    channel.
//! 4. Dependencies: a step waits, per tb of its own gpu, for the latest
//!    step it must follow (extra waits as nops before it); dependencies
//!    between operations on other gpus are followed through to the ones
//!    that touch this gpu. Waits MSCCL cannot express (between gpus with no
//!    operation between them) are dropped and counted.
//!
//! The written text is then loaded and run by [`super::exec`], and read back
//! into the requantised plan it encodes.

use std::collections::HashMap;

use super::exec;
use super::laps::Laps;
use super::parse::parse_algo;
use super::read::trace_to_plan;
use super::spread::{rate_lanes, stream_groups, OpCalls};
use super::write::write_algo;
use super::MAX_CHUNK_BYTES;
use super::{fit, pack, unsupported};
use super::{Algo, BufRef, ChunkMap, Gpu, Layout, NameFacts, Protocol, Step, Tb};
use super::{Executor, MAX_NODES, MAX_OFFSET};
use crate::error::{Error, InputError, Result};
use crate::plan::{Buffer, Plan};
use crate::sim::{simulate, SimOptions, TransferTime};
use crate::topology::Topology;
use crate::traffic::TrafficMatrix;

mod chunk_trace;
mod cuts;
mod lanes;
mod tbs;
#[cfg(test)]
mod tests;
mod walks;

use super::ops::ChunkOp;
use chunk_trace::{trace_chunks, Pieces};
use cuts::{cut_for_pacing, paced_waits, Paced, PacedWaits};
use lanes::{LaneShare, MAX_LANES};
use tbs::{build_tbs, uncut_gpus, SendChain, UNCUT_ABOVE};

/// Per-peer message size up to which LL is chosen (the msccl-scheduler
/// ships LL plans up to 32.5 KiB per peer for 8 GPUs).
pub const LL_MAX_PER_PEER: u64 = 32 << 10;
/// Per-peer message size up to which LL128 is chosen; Simple above.
pub const LL128_MAX_PER_PEER: u64 = 512 << 10;

/// How to lower a plan.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct XmlOptions {
    /// `padded` (default, a drop-in for `ncclAllToAll`) or `packed`.
    pub layout: Layout,
    /// `None`: chosen by message size (LL, LL128, Simple).
    pub protocol: Option<Protocol>,
    /// `None`: the smallest multiple of
    /// [`CHUNK_ALIGN`](super::chunk::CHUNK_ALIGN) that puts the largest pair
    /// in [`CHUNKS_PER_LARGEST_PAIR`](super::chunk::CHUNKS_PER_LARGEST_PAIR)
    /// chunks, doubled until the
    /// executor's limits hold; for plans other than `fast`'s and `spray`'s
    /// whose whole-chunk padding would exceed 1% of a rank's bytes, also
    /// up to 4 times as many (`super::chunk::default_chunk_bytes`), kept
    /// when the executor's rules (`super::xsim`) price that file faster.
    pub chunk_bytes: Option<u64>,
    /// Whose limits the file must meet (threadblocks, channels).
    pub executor: Executor,
    /// Whether sends that other sends wait for are cut so that the
    /// executor's FIFO window holds those waits (default) or written whole.
    pub pacing: Pacing,
}

/// How the lowering writes a plan's waits that the executor would not
/// hold: a send that waits for another send of its gpu (a send is done when
/// staged in the FIFO, not when it has arrived), or whose wait can only be
/// written on its receiver (docs/msccl.md, "Pacing").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Pacing {
    /// Cut the operations involved so that the FIFO window's back-pressure
    /// holds the wait: an awaited send ends with `window` one-chunk steps
    /// (its last step is staged only once its body has been taken by the
    /// receiver), a send whose wait sits on its receiver starts with
    /// `window` one-chunk steps (its body waits until the receiver, held by
    /// its wait, takes the first of them). In a file with no such cut,
    /// transfers longer than one connection's window are spread over lanes
    /// (`super::spread`); a file whose protocol was chosen by size takes
    /// Simple where LL128's window would leave more waits unheld.
    #[default]
    Cut,
    /// Write every operation whole on one lane per transfer, in the
    /// protocol its size chooses, as files were written before pacing;
    /// such waits do not hold (`unheld_deps`).
    Off,
}

/// A written file and what it means for the application.
#[derive(Clone, Debug)]
pub struct XmlPlan {
    pub text: String,
    pub algo: Algo,
    pub chunk_bytes: u64,
    pub layout: Layout,
    pub protocol: Protocol,
    pub nchunksperloop: u32,
    /// Bytes per destination the application passes to `ncclAllToAll`
    /// (`count * sizeof(type)`): `nchunksperloop / ngpus` chunks.
    pub count_bytes: u64,
    /// Bytes of each rank's send and receive buffer (`count_bytes * ngpus`).
    pub buffer_bytes: u64,
    /// Largest scratch any rank needs, in bytes (the executor allocates it).
    pub scratch_bytes: u64,
    pub min_bytes: u64,
    pub max_bytes: u64,
    pub channels: u32,
    pub max_tbs_per_gpu: usize,
    pub max_steps_per_tb: usize,
    /// Dependencies between operations MSCCL cannot express (no operation
    /// links the two gpus in between); the XML runs without them.
    pub dropped_deps: usize,
    /// Dependencies between the plan's transfers (pairs) that the file
    /// writes but the executor does not hold: the waiting send's gpu only
    /// waits for a send (done when staged in the FIFO), or only its
    /// receiver waits (docs/msccl.md, "The executor's rules").
    pub unheld_deps: usize,
    /// Operations cut so the executor holds a wait ([`Pacing::Cut`]): the
    /// steps added to the file.
    pub pacing_steps: usize,
    /// Tails of paced transfers handed to the head that follows them on
    /// their lane (`super::handoff`), each `window` steps fewer.
    pub handoffs: usize,
    /// Paced heads (operations) held back until shortly before their
    /// transfer's planned start ([`HEAD_LEAD_US`]; 0 unless `fast`'s
    /// released-head file was kept).
    pub released_heads: usize,
    /// Transfers the plan runs at once that the file runs one after another
    /// on a shared lane, because the threadblock budget has no lane left
    /// for them (0: the file runs at once all the plan runs at once).
    pub lanes_short: usize,
    /// Threadblocks the busiest gpu would need to run at once everything
    /// the plan runs at once (its local-copy tbs included).
    pub tbs_wanted: usize,
    /// What the file costs against its plan by the executor's rules, where
    /// the lowering priced its candidate files to choose one (clusters of
    /// up to [`super::chunk::MAX_RANKS_PRICED`] ranks without a caller's
    /// chunk); `None` where it kept its only file unpriced.
    pub executor_price: Option<ExecutorPrice>,
    /// The plan the file encodes, on the original matrix: transfers are its
    /// operations, byte ranges requantised to chunk boundaries.
    pub plan: Plan,
    pub report: exec::ExecReport,
}

/// A kept file's completion by the executor's rules against its source
/// plan's, both in the ideal network (`xsim::simulate_traced` and the
/// simulator's timeline the lowering follows).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ExecutorPrice {
    /// The file, run by the executor's rules (docs/msccl.md, "The
    /// executor's rules"), us.
    pub file_us: f64,
    /// The plan it was lowered from, us.
    pub plan_us: f64,
}

impl ExecutorPrice {
    /// How much longer the file runs than its plan (0.05: 5% longer).
    pub fn over_plan(&self) -> f64 {
        self.file_us / self.plan_us - 1.0
    }
}

impl XmlPlan {
    /// The facts a `--report` carries, as JSON.
    pub fn report_json(&self) -> serde_json::Value {
        let price = self.executor_price.map(|p| {
            serde_json::json!({
                "file_us": p.file_us,
                "plan_us": p.plan_us,
                "over_plan": p.over_plan(),
            })
        });
        serde_json::json!({
            "chunk_bytes": self.chunk_bytes,
            "layout": self.layout.name(),
            "protocol": self.protocol.name(),
            "nchunksperloop": self.nchunksperloop,
            "count_bytes": self.count_bytes,
            "buffer_bytes": self.buffer_bytes,
            "scratch_bytes": self.scratch_bytes,
            "min_bytes": self.min_bytes,
            "max_bytes": self.max_bytes,
            "channels": self.channels,
            "max_tbs_per_gpu": self.max_tbs_per_gpu,
            "max_steps_per_tb": self.max_steps_per_tb,
            "dropped_deps": self.dropped_deps,
            "unheld_deps": self.unheld_deps,
            "pacing_steps": self.pacing_steps,
            "handoffs": self.handoffs,
            "released_heads": self.released_heads,
            "lanes_short": self.lanes_short,
            "tbs_wanted": self.tbs_wanted,
            "executor_price": price,
        })
    }
}

/// How long before its transfer's planned start a paced head may leave
/// in `fast`'s released-head candidate (`cut_for_pacing`): it waits for
/// the send of its gpu whose planned start is at least this much earlier.
/// Measured on 4x8 log-normal (padded): 2 us +17.5%, 5 us +8.2%, 10 us
/// +4.3%, 20 us +3.4%, 30 us +3.4%, 40 us +5.3%, 60 us +4.6% over the
/// plan, against +4.6% with heads leaving at once.
pub const HEAD_LEAD_US: f64 = 20.0;

/// A `fast` file priced more than this fraction behind its plan (the
/// executor's rules against the plan's ideal run) gets the finer chunks of
/// `chunk::scored_chunk_bytes` tried too (the target of docs/msccl.md:
/// every file within 3% of its plan).
pub const SCORED_ABOVE: f64 = 0.03;

/// The simulator's options for the lowering's timeline (the plan's ideal
/// run) on `n` ranks. Up to [`super::chunk::MAX_RANKS_PRICED`] ranks, where
/// candidate files are priced against it, the simulator's default (exact up
/// to `sim::EXACT_TRANSFERS` transfers). Above, the timeline only orders
/// the steps and shares the lanes, and events are grouped whatever the
/// plan's size: finishes within [`TIMELINE_TOLERANCE`] of a transfer's
/// duration, and arrivals (`SimOptions::group_arrivals`) within as much of
/// their shortest duration. 16 x 8 `hierarchical`'s 18304 transfers took
/// 18175 events exactly and 788 grouped at 0.01 (docs/benchmarks.md,
/// "Every algorithm at 32 x 8 and 64 x 8"); at 0.1 with grouped arrivals
/// the files' simulated completions at 32 x 8 and 64 x 8 moved by at most
/// a few tenths of a percent ("Every algorithm's file at 64 x 8 in about a
/// minute").
pub(crate) fn timeline_options(n: usize) -> SimOptions {
    let grouped = n > super::chunk::MAX_RANKS_PRICED;
    SimOptions {
        tolerance: grouped.then_some(TIMELINE_TOLERANCE),
        group_arrivals: grouped,
        ..SimOptions::default()
    }
}

/// Grouping tolerance of the lowering's timeline above
/// [`super::chunk::MAX_RANKS_PRICED`] ranks (`timeline_options`).
pub const TIMELINE_TOLERANCE: f64 = 0.1;

/// Lowers a verified plan of `traffic` on `topo` to MSCCL XML. The file is
/// checked by the symbolic executor before it is returned.
pub fn to_xml(
    plan: &Plan,
    topo: &Topology,
    traffic: &TrafficMatrix,
    opts: &XmlOptions,
) -> Result<XmlPlan> {
    let n = traffic.ranks();
    if plan.ranks as usize != n || topo.ranks() != n {
        return Err(unsupported(format!(
            "plan for {} ranks, traffic for {n}, topology for {}",
            plan.ranks,
            topo.ranks()
        )));
    }
    let base = match opts.chunk_bytes {
        Some(0) => {
            return Err(Error::Input(InputError::new(
                "--chunk-bytes",
                "chunk size of 0 bytes",
            )))
        }
        Some(u) if u > MAX_CHUNK_BYTES => {
            return Err(Error::Input(InputError::new(
                "--chunk-bytes",
                format!("chunk size of {u} bytes; at most 2^38 bytes (256 GB)"),
            )))
        }
        Some(u) => u,
        None => super::chunk::base_chunk_bytes(traffic),
    };
    // When the plan's transfers run (the simulator's ideal network): steps
    // are ordered and lanes shared so that the file runs them as the plan does.
    if base > MAX_CHUNK_BYTES {
        return Err(unsupported(format!(
            "pairs of up to {} bytes need chunks of more than 2^38 bytes (256 GB), the most a file may declare",
            traffic.max_entry()
        )));
    }
    let mut laps = Laps::start("to_xml");
    fit::check_plan(plan, topo, traffic, opts.executor)?;
    let timeline = simulate(topo, plan, &timeline_options(n))?.transfers;
    // The plan's replay, kept across the doubled chunks of a `lower_from`
    // (`Pieces`).
    let pieces = Pieces::default();
    let inp = Inputs {
        plan,
        topo,
        traffic,
        opts,
        timeline: &timeline,
        pieces: &pieces,
    };
    laps.lap("ideal simulation of the plan");
    // Above `chunk::MAX_RANKS_PRICED` ranks (no candidate is priced there)
    // a padded file's chunk whose file with pacing cuts misses a limit is
    // lowered again without cuts before it is doubled, until a file without
    // cuts misses too (docs/msccl.md, "Cluster size"). 64x8 log-normal
    // `fast` by the executor's rules: padded 31977 -> 17594 us (its cut
    // file needed 4 times the chunk), but packed 11197 -> 12789 us (cut at
    // 8 times its base chunk, the padded base chunk, against uncut at the
    // base): packed files are not retried uncut (docs/benchmarks.md, "A
    // missed chunk lowered again without pacing cuts").
    let uncut_retry = opts.chunk_bytes.is_none()
        && opts.pacing == Pacing::Cut
        && opts.layout == Layout::Padded
        && n > super::chunk::MAX_RANKS_PRICED;
    let lower_from = |start: u64,
                      handoff: bool,
                      lead: Option<f64>,
                      (late, share): (bool, LaneShare),
                      laps: &mut Laps| {
        let mut u = start;
        let mut retry = Retry::new(uncut_retry);
        // What a cut lowering keeps for its uncut retry (`Traced`).
        let mut traced: Option<Traced> = None;
        loop {
            let v = Variant {
                handoff,
                head_lead_us: lead,
                late_lanes: late,
                share,
                uncut_all: retry.uncut,
                ..Variant::WINDOW
            };
            let (why, after_cuts) =
                match lower_with(&inp, u, v, laps, retry.may_uncut.then_some(&mut traced)) {
                    Ok(x) => {
                        // Kept: the next `lower_from` (other candidates, up
                        // to 64 ranks) traces again, this memory freed.
                        pieces.clear();
                        return Ok(x);
                    }
                    Err(LowerError::Other(e)) => return Err(e),
                    Err(LowerError::Limit(why)) => (why, false),
                    Err(LowerError::CutLimit(why)) => (why, true),
                };
            // The caller's chunk size is too small for the executor: bad
            // input.
            if opts.chunk_bytes.is_some() {
                return Err(chunk_too_small(u, opts.executor, &why));
            }
            // The failed lowering's cost shows in the laps above; say
            // which limit it missed.
            if retry.missed(after_cuts) == Next::Uncut {
                laps.note(&format!(
                    "chunk {u} bytes missed a limit after pacing cuts ({why}); \
                     lowering it again without cuts"
                ));
            } else if u < start << 10 && u * 2 <= MAX_CHUNK_BYTES {
                laps.note(&format!("chunk {u} bytes missed a limit ({why}); doubling"));
                traced = None;
                // After a traced miss, the doubled chunk's trace keeps the
                // plan's replay for the chunks after it (`Pieces`).
                pieces.keep();
                u *= 2;
            } else {
                return Err(unsupported(format!(
                    "{why} (chunk size {u} bytes); try a larger --chunk-bytes"
                )));
            }
        }
    };
    // Every file the executor's rules price against this one: finer
    // chunks, and rate lanes where a stream was spread (below).
    let first = lower_from(base, true, None, (false, LaneShare::Wanted), &mut laps)?;
    // Each with the symbolic executor's run the lowering made of it.
    let mut cands: Vec<Lowered> = Vec::new();
    // Tails handed to the next head (`super::handoff`) start the heads'
    // bodies a latency earlier, which moves the bandwidth shares the plan's
    // other transfers get: 4x8 log-normal +5.3% -> +4.6% of its plan, 4x8
    // hotspot +3.0% -> +4.0% (docs/benchmarks.md, issue 22). Where there
    // are any, the file without them is priced too (first: it wins a tie).
    if first.x.handoffs > 0 && n <= super::chunk::MAX_RANKS_PRICED {
        if let Ok(plain) = lower_from(base, false, None, (false, LaneShare::Wanted), &mut laps) {
            cands.push(plain);
        }
    }
    // Long streams: one lane per FIFO window's worth of calls keeps every
    // window busy but gives a stream several max-min shares of links its
    // plan shares with other transfers (8x8 MoE `deepep`: +3.5% -> +4.1%,
    // docs/benchmarks.md issue 22). Where a stream was spread, files with
    // only the lanes each stream's planned rate needs
    // (`super::spread::rate_lanes`), at two caps, are priced too.
    let with_rates = |l: Lowered, cands: &mut Vec<Lowered>, laps: &mut Laps| {
        let (u, spread) = (l.x.chunk_bytes, l.spread);
        cands.push(l);
        if !spread || opts.pacing != Pacing::Cut || n > super::chunk::MAX_RANKS_PRICED {
            return;
        }
        for c in RATE_CAPS {
            // The same chunk as the window file, or none.
            let v = Variant {
                streams: Streams::Rate(c),
                ..Variant::WINDOW
            };
            let r = lower_with(&inp, u, v, laps, None);
            if let Ok(r) = r {
                if cands.iter().all(|y| y.x.text != r.x.text) {
                    cands.push(r);
                }
            }
        }
    };
    let base_u = first.x.chunk_bytes;
    with_rates(first, &mut cands, &mut laps);
    // Whole-chunk padding: where it would cost a rank more than 1% of its
    // bytes, a file with finer chunks is written too and the one the
    // executor's rules price faster is kept (`super::chunk`). Finer chunks
    // also mean more primitive calls (at most 71 chunks a call), which
    // costs small messages more than the padding saves (2x8 `pxn`
    // intra-skew: +0.6% -> +14%), hence the pricing. The `fast` emitter's
    // plans (`fast`, `spray`) keep the base chunk: `fast`'s pacing cuts are
    // sized in chunks, and finer chunks moved `spray`'s 8x8 files further
    // from their plans as often as closer (docs/benchmarks.md, issue 22).
    let fine = super::chunk::default_chunk_bytes(traffic, opts.layout, true);
    let is_fast = plan.algorithm == "fast";
    if !(opts.chunk_bytes.is_some()
        || n > super::chunk::MAX_RANKS_PRICED
        || fine >= base_u
        || is_fast
        || plan.algorithm == "spray")
    {
        if let Ok(y) = lower_from(fine, true, None, (false, LaneShare::Wanted), &mut laps) {
            if y.x.chunk_bytes < base_u {
                with_rates(y, &mut cands, &mut laps);
            }
        }
    }
    // `fast`'s paced files: heads held back to shortly before their
    // transfer's planned start, at the base chunk and, where padding costs,
    // at a quarter and a half finer ones (docs/msccl.md, "Pacing", "Heads released
    // near their start"). Their NICs are the plan's bottleneck: a head sent
    // at once takes shares from the bodies the plan runs then, and every
    // pair's last chunk moves whole (4x8 log-normal: +2 of the +4.6 points).
    let fast_priced = is_fast && opts.pacing == Pacing::Cut && n <= super::chunk::MAX_RANKS_PRICED;
    // (hand-offs, head lead) of a `fast` file.
    let files_at = |u: u64,
                    files: &[(bool, Option<f64>)],
                    lanes: (bool, LaneShare),
                    cands: &mut Vec<Lowered>,
                    laps: &mut Laps| {
        for &(handoff, lead) in files {
            if let Ok(y) = lower_from(u, handoff, lead, lanes, laps) {
                if y.x.chunk_bytes == u && cands.iter().all(|c| c.x.text != y.x.text) {
                    cands.push(y);
                }
            }
        }
    };
    if fast_priced {
        files_at(
            base_u,
            &[(true, Some(HEAD_LEAD_US))],
            (false, LaneShare::Wanted),
            &mut cands,
            &mut laps,
        );
        if opts.chunk_bytes.is_none() {
            for u in super::chunk::near_chunk_bytes(traffic, opts.layout) {
                files_at(
                    u,
                    &[(true, None), (true, Some(HEAD_LEAD_US))],
                    (false, LaneShare::Wanted),
                    &mut cands,
                    &mut laps,
                );
            }
        }
    }
    // Files other than `fast`'s (which has its own, below) still over
    // [`SCORED_ABOVE`] try more chunks (`chunk::rescue_chunk_bytes`).
    let rescue = !is_fast && opts.chunk_bytes.is_none() && n <= super::chunk::MAX_RANKS_PRICED;
    // One file and nothing else to try: no pricing.
    if cands.len() == 1 && !simple_may_help(opts, &cands[0].x, n) && !rescue {
        return read_back(cands.remove(0), traffic, &mut laps);
    }
    // The plan's own completion; a file more than [`SCORED_ABOVE`] behind
    // it is "over", and the steps below try more files while the best is.
    let plan_us = timeline.iter().map(|t| t.end_us).fold(0.0, f64::max);
    let over = |us: f64| us > plan_us * (1.0 + SCORED_ABOVE);
    let sim = SimOptions::default();
    // (A lowering that chose among packings priced its file already.)
    let price = |c: &Lowered| -> Result<f64> {
        if let Some(us) = c.priced {
            return Ok(us);
        }
        let (us, _) =
            super::xsim::simulate_traced(&c.x.algo, &c.trace, c.x.chunk_bytes, topo, &sim)?;
        Ok(us)
    };
    // The fastest; on a tie the earlier (the window file, the base chunk).
    let mut best = 0;
    let mut best_us = f64::INFINITY;
    let mut priced = 0;
    let mut price_new = |cands: &[Lowered], best: &mut usize, best_us: &mut f64| -> Result<()> {
        for (i, c) in cands.iter().enumerate().skip(priced) {
            let us = price(c)?;
            if us < *best_us {
                (*best, *best_us) = (i, us);
            }
        }
        priced = cands.len();
        Ok(())
    };
    price_new(&cands, &mut best, &mut best_us)?;
    // `fast`'s files still over [`SCORED_ABOVE`] behind the plan: the
    // finer chunks the plan's inter-node transfers score best at, one
    // after another while the best file is still over
    // (`chunk::scored_chunk_bytes`: whole chunks on the busiest NIC,
    // operations past 71 chunks; 8x8 log-normal, where the base, 5/4 and
    // 3/2 chunks were +4.8% / +4.5%, docs/benchmarks.md issue 22).
    if fast_priced && opts.chunk_bytes.is_none() && over(best_us) {
        let tried: Vec<u64> = cands.iter().map(|c| c.x.chunk_bytes).collect();
        let scored = super::chunk::scored_chunk_bytes(plan, traffic, opts.layout, 2)?;
        for u in scored.into_iter().filter(|u| !tried.contains(u)) {
            if !over(best_us) {
                break;
            }
            let files = [(true, None), (false, None), (true, Some(HEAD_LEAD_US))];
            files_at(u, &files, (false, LaneShare::Wanted), &mut cands, &mut laps);
            price_new(&cands, &mut best, &mut best_us)?;
        }
    }
    // `fast`'s files still over: a transfer that reads a cut transfer's
    // tail chunks starts a flight after its plan's start (the tail is
    // staged once the body has been taken), so a transfer that follows it
    // on a lane only because the plan ends it first waits that flight too
    // (2x8 intra-skew, held out: the forward of a tail's chunk held the
    // hot gpu's next send 2 us, +5.5%). The files at the best one's chunk
    // with such transfers followed only by their descendants
    // (`lanes::assign_lanes`' `late`) are priced too (docs/msccl.md,
    // "Pacing", "Lanes behind a tail").
    if fast_priced && opts.chunk_bytes.is_none() && over(best_us) {
        let files = [(true, None), (false, None), (true, Some(HEAD_LEAD_US))];
        files_at(
            cands[best].x.chunk_bytes,
            &files,
            (true, LaneShare::Wanted),
            &mut cands,
            &mut laps,
        );
        price_new(&cands, &mut best, &mut best_us)?;
    }
    // The window file at chunk `u` lowered with options `o`, and where it
    // spreads a stream, its rate-lane files (as `with_rates`).
    let files_with =
        |o: &XmlOptions, u: u64, share: LaneShare, cands: &mut Vec<Lowered>, laps: &mut Laps| {
            for streams in [
                Streams::Window,
                Streams::Rate(RATE_CAPS[0]),
                Streams::Rate(RATE_CAPS[1]),
            ] {
                let v = Variant {
                    streams,
                    share,
                    ..Variant::WINDOW
                };
                match lower_with(&inp.with_options(o), u, v, laps, None) {
                    Ok(y) if y.x.chunk_bytes == u && cands.iter().all(|c| c.x.text != y.x.text) => {
                        let spread = y.spread;
                        cands.push(y);
                        if !spread {
                            break;
                        }
                    }
                    _ => break,
                }
            }
        };
    // A file still over [`SCORED_ABOVE`] whose protocol was chosen by size
    // (LL128 or LL: every packed file of the sweep's matrices) and whose
    // window is its own size whatever the protocol: the same lowering in
    // Simple is priced too (`simple_candidates`; 2x8 log-normal `pxn`
    // packed, docs/benchmarks.md issue 22 item 2).
    let simple = simple_candidates(opts, &cands[best].x, over(best_us), n);
    if let Some(o) = &simple {
        files_with(
            o,
            cands[best].x.chunk_bytes,
            LaneShare::Wanted,
            &mut cands,
            &mut laps,
        );
        price_new(&cands, &mut best, &mut best_us)?;
    }
    // Files still over [`SCORED_ABOVE`] (not `fast`'s, above): more
    // chunks, one after another while the best file is still over
    // (`chunk::rescue_chunk_bytes`: `spray`'s finer default, the 5/4 and
    // 3/2 chunks, the two the plan's inter-node transfers score best at,
    // then 3/4, 5/8, 1/2 and 3/8 of the base; then the coarser
    // `chunk::coarse_chunk_bytes`), in Simple where that won above.
    // Neighbouring chunks move
    // max-min shares (8x8 Zipf `deepep` packed: +3.99% at 7424 B, +6.05%
    // at 6000, -0.58% at 5296, +3.70% at 4800, +1.29% at 3712), so only the
    // executor's price decides, and files within 3% are not touched
    // (docs/benchmarks.md issue 22 item 2).
    if rescue && over(best_us) {
        let o = match simple {
            Some(o) if cands[best].x.protocol == Protocol::Simple => o,
            _ => opts.clone(),
        };
        let tried: Vec<u64> = cands.iter().map(|c| c.x.chunk_bytes).collect();
        let mut more = super::chunk::rescue_chunk_bytes(plan, traffic, opts.layout, fine)?;
        more.extend(super::chunk::coarse_chunk_bytes(
            traffic,
            opts.layout,
            base_u,
        ));
        for u in more.into_iter().filter(|u| !tried.contains(u)) {
            if !over(best_us) {
                break;
            }
            files_with(&o, u, LaneShare::Wanted, &mut cands, &mut laps);
            price_new(&cands, &mut best, &mut best_us)?;
        }
    }
    // A cut file still over [`SCORED_ABOVE`]: the file written whole
    // (`Pacing::Off`) at the default chunks is priced too. Where the
    // executor's limits forced the cut file's chunk coarser than the
    // default (the cuts' steps: 8x8 intra-skew `lp` needed 4 times the base
    // chunk to keep a connection within 32 channels of 64 steps, and its
    // transfers were then too short to cut, 6895 waits unheld, +6.44%):
    // -2.98% / -1.28% there. With a connection priced as one stream, 8x8
    // Zipf `lp`'s cut file is +4.13% at every chunk tried and written
    // whole +3.08% (docs/benchmarks.md issue 22 item 2, 2026-12-04).
    // (Without a caller's chunk, `base` is the default chunk.)
    if over(best_us)
        && opts.pacing == Pacing::Cut
        && opts.chunk_bytes.is_none()
        && n <= super::chunk::MAX_RANKS_PRICED
    {
        let whole = XmlOptions {
            pacing: Pacing::Off,
            ..opts.clone()
        };
        let mut us = vec![base, fine];
        us.dedup();
        for u in us {
            if u <= base_u {
                files_with(&whole, u, LaneShare::Wanted, &mut cands, &mut laps);
            }
        }
        price_new(&cands, &mut best, &mut best_us)?;
    }
    // A file still over [`SCORED_ABOVE`] whose plan runs more transfers at
    // once on some gpu than the threadblock budget has lanes for
    // (`lanes_short`): the files at the best one's chunk (then at the
    // base chunk) with the lanes beyond one per connection given to the
    // connections whose next lane the plan keeps busy longest
    // ([`LaneShare::Busy`]) instead of those that want the most, one chunk
    // after another while the best file is still over. On 8 x 8 under
    // `rccl` (64 tbs a gpu) a hot gpu's short balancing moves (`spray`
    // intra-skew: 29 at once on one NVLink connection) took the spare
    // lanes, and a rail connection ran its plan's two streams one after
    // another (+8.4%, now -0.2%); `fast` log-normal +4.0% -> +2.2%.
    // Neither sharing wins every file (8 x 8 intra-skew `fast` is slower
    // by busy time), hence the pricing, and only here: applied to every
    // step above, it moved files within 3% (an earlier, busy-shared file
    // stops the chunk search sooner). At every chunk tried it cost 8 x 8
    // intra-skew `fast` 78% more CPU for no better file; the four files it
    // speeds up won at the best one's chunk (docs/benchmarks.md, issue 22
    // items 2 and 3, "Spare lanes where the plan keeps them busy").
    if over(best_us) && cands[best].x.lanes_short > 0 && n <= super::chunk::MAX_RANKS_PRICED {
        let mut us = vec![cands[best].x.chunk_bytes, base_u];
        us.dedup();
        for u in us {
            if !over(best_us) {
                break;
            }
            if fast_priced {
                let files = [(true, None), (true, Some(HEAD_LEAD_US))];
                files_at(u, &files, (false, LaneShare::Busy), &mut cands, &mut laps);
            } else {
                files_with(opts, u, LaneShare::Busy, &mut cands, &mut laps);
            }
            price_new(&cands, &mut best, &mut best_us)?;
        }
    }
    laps.lap("pricing the candidate files");
    let mut kept = cands.swap_remove(best);
    kept.x.executor_price = Some(ExecutorPrice {
        file_us: best_us,
        plan_us,
    });
    read_back(kept, traffic, &mut laps)
}

/// The options of `to_xml`'s Simple candidate, where the best file so far
/// (`best`; `over`: more than [`SCORED_ABOVE`] behind the plan) may gain
/// from Simple ([`simple_may_help`]), its protocol (LL or LL128) was chosen by size, its window is its
/// own buffer size (a file made for one matrix: the window is the same
/// whatever the protocol) and the cluster has at most
/// `chunk::MAX_RANKS_PRICED` ranks. Added while `xsim` priced each call
/// in flight as a flow of its own: LL128's window is 8 calls, so a relay
/// stream of a few operations kept all its calls in flight, each with its
/// own max-min share (2x8 log-normal `pxn` packed: +4.03% -> +1.55% in
/// Simple). With a connection priced as one stream (2026-12-04) that
/// LL128 file is +1.02%; the step stays for files still over.
fn simple_candidates(
    opts: &XmlOptions,
    best: &XmlPlan,
    over: bool,
    n: usize,
) -> Option<XmlOptions> {
    let wanted = over && simple_may_help(opts, best, n) && best.min_bytes == best.max_bytes;
    wanted.then(|| XmlOptions {
        protocol: Some(Protocol::Simple),
        ..opts.clone()
    })
}

/// Whether a Simple file could be tried beside `file` before any pricing:
/// the protocol was not forced, the cluster is priced (at most
/// `chunk::MAX_RANKS_PRICED` ranks) and `file` is not in Simple already.
fn simple_may_help(opts: &XmlOptions, file: &XmlPlan, n: usize) -> bool {
    opts.protocol.is_none()
        && n <= super::chunk::MAX_RANKS_PRICED
        && file.protocol != Protocol::Simple
}

/// The same schedule for every protocol, each with its size window
/// (several files a directory can hold side by side).
pub fn to_xml_windows(
    plan: &Plan,
    topo: &Topology,
    traffic: &TrafficMatrix,
    opts: &XmlOptions,
) -> Result<Vec<XmlPlan>> {
    Protocol::ALL
        .iter()
        .map(|&p| {
            let o = XmlOptions {
                protocol: Some(p),
                ..opts.clone()
            };
            to_xml(plan, topo, traffic, &o)
        })
        .collect()
}

/// `[minBytes, maxBytes]` of a protocol for `n` ranks (`maxBytes` 0 = no limit).
pub fn window(proto: Protocol, n: u64) -> (u64, u64) {
    match proto {
        Protocol::LL => (0, n * LL_MAX_PER_PEER),
        Protocol::LL128 => (n * LL_MAX_PER_PEER + 1, n * LL128_MAX_PER_PEER),
        Protocol::Simple => (n * LL128_MAX_PER_PEER + 1, 0),
    }
}

/// The protocol whose window holds a message of `nbytes` for `n` ranks.
pub fn protocol_for(nbytes: u64, n: u64) -> Protocol {
    Protocol::ALL
        .into_iter()
        .find(|&p| {
            let (lo, hi) = window(p, n);
            nbytes >= lo && (hi == 0 || nbytes <= hi)
        })
        .unwrap_or(Protocol::Simple)
}

/// A chunk size the caller chose that the executor's limits cannot take:
/// bad input (the CLI exits 2), named by the CLI's flag.
fn chunk_too_small(u: u64, executor: Executor, why: &str) -> Error {
    Error::Input(InputError::new(
        "--chunk-bytes",
        format!(
            "{u}-byte chunks are too small for {executor}: {why}; try a larger \
             --chunk-bytes (or none: the default is doubled until the file fits)"
        ),
    ))
}

/// What `to_xml`'s `lower_from` lowers after a chunk missed a limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Next {
    /// The same chunk without pacing cuts.
    Uncut,
    /// Twice the chunk (cut as asked).
    Doubled,
}

/// `lower_from`'s retries: where `may_uncut` (above
/// `chunk::MAX_RANKS_PRICED` ranks, padded, pacing cut), a chunk whose cut file
/// missed a limit after its cuts is lowered again without cuts before it
/// is doubled; once a file without cuts misses too, the chunks after it
/// are only doubled, cut (docs/msccl.md, "Cluster size").
#[derive(Debug, Clone, Copy)]
struct Retry {
    /// The next lowering is without cuts.
    uncut: bool,
    may_uncut: bool,
}

impl Retry {
    fn new(may_uncut: bool) -> Self {
        Retry {
            uncut: false,
            may_uncut,
        }
    }

    /// After a miss of the current lowering (`after_cuts`: its file had
    /// pacing cuts and missed after them).
    fn missed(&mut self, after_cuts: bool) -> Next {
        if after_cuts && self.may_uncut && !self.uncut {
            self.uncut = true;
            return Next::Uncut;
        }
        if self.uncut {
            self.uncut = false;
            self.may_uncut = false;
        }
        Next::Doubled
    }
}

/// Why a lowering failed. Limits that no chunk size fixes (threadblocks
/// for a gpu's peers, channel groups, the parse budget's steps that every
/// connection needs) are refused before any tracing (`fit::check_plan`);
/// a fresh tb always holds its waits (`drop_oldest_waits`), so what is
/// left here is what fewer, larger chunks can fix, and `to_xml` retries
/// only these (above `chunk::MAX_RANKS_PRICED` ranks, after pacing cuts, the
/// same chunk without cuts first: [`Retry`]).
enum LowerError {
    /// An executor limit: a larger chunk may help.
    Limit(String),
    /// An executor limit missed by a file with pacing cuts (after them):
    /// the same chunk without cuts may fit (`to_xml`'s `lower_from`).
    CutLimit(String),
    Other(Error),
}

impl From<Error> for LowerError {
    fn from(e: Error) -> Self {
        LowerError::Other(e)
    }
}

fn bufref(b: Buffer) -> BufRef {
    match b {
        Buffer::Input => BufRef::Input,
        Buffer::Output => BufRef::Output,
        Buffer::Scratch => BufRef::Scratch,
    }
}

/// How many lanes a long stream is spread over (`super::spread`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Streams {
    /// One lane per FIFO window's worth of calls, up to [`MAX_LANES`].
    Window,
    /// The lanes its planned rate needs (`super::spread::rate_lanes`), up
    /// to this many.
    Rate(u32),
}

/// Caps of the rate-lane candidates `to_xml` prices against
/// [`Streams::Window`] where a file spreads a stream.
const RATE_CAPS: [u32; 2] = [10, 30];

/// What every lowering of one [`to_xml`] call reads: the plan, its matrix
/// and cluster, the caller's options (a candidate may lower with others,
/// e.g. in Simple: [`Inputs::with_options`]), the plan's ideal timeline
/// and its replay kept across doubled chunks.
#[derive(Clone, Copy)]
struct Inputs<'a> {
    plan: &'a Plan,
    topo: &'a Topology,
    traffic: &'a TrafficMatrix,
    opts: &'a XmlOptions,
    timeline: &'a [TransferTime],
    pieces: &'a Pieces,
}

impl<'a> Inputs<'a> {
    fn with_options(self, opts: &'a XmlOptions) -> Inputs<'a> {
        Inputs { opts, ..self }
    }
}

/// How one candidate file is lowered: what [`to_xml`]'s candidates vary
/// besides the chunk.
#[derive(Clone, Copy, Debug)]
struct Variant {
    /// How many lanes a long stream gets.
    streams: Streams,
    /// Tails handed to the next head (`super::handoff`).
    handoff: bool,
    /// Heads held back to this long before their planned start, us
    /// (`None`: sent at once).
    head_lead_us: Option<f64>,
    /// Transfers behind a tail on their lane followed only by their
    /// descendants (`lanes::assign_lanes`' `late`).
    late_lanes: bool,
    /// How spare lanes are shared (`lanes::LaneShare`).
    share: LaneShare,
    /// Every gpu's transfers written whole (no pacing cuts).
    uncut_all: bool,
}

impl Variant {
    /// The window file: tails handed off, heads at once, lanes as wanted.
    const WINDOW: Variant = Variant {
        streams: Streams::Window,
        handoff: true,
        head_lead_us: None,
        late_lanes: false,
        share: LaneShare::Wanted,
        uncut_all: false,
    };
}

/// A chunk's operations before pacing cuts (traced, `fast`'s sources
/// gathered) and the cuts' walks, kept by a lowering with cuts that
/// `to_xml`'s `lower_from` may lower again uncut at the same chunk
/// ([`Retry`]): the retry traces and walks nothing (at 64 x 8 the trace
/// and the walks were about 15 s of a missed lowering's, docs/benchmarks.md
/// "The cut lowering's walks and trace kept for its uncut retry"). The
/// retry's file is the one a fresh trace would give: both depend on the
/// chunk alone.
struct Traced {
    u: u64,
    ops: Vec<ChunkOp>,
    scratch: Vec<u32>,
    waits: Option<PacedWaits>,
}

/// A lowered file, and whether it spread some stream over lanes.
struct Lowered {
    x: XmlPlan,
    spread: bool,
    /// The symbolic executor's run of the written file, for its pricing.
    trace: exec::Trace,
    /// The file's completion by the executor's rules, us, where the
    /// lowering priced it already (to choose among packings).
    priced: Option<f64>,
}

/// A chunk's operations before any pacing cut, and the scratch chunks per
/// rank they use: the plan traced through the chunk map, `fast`'s sources
/// gathered.
fn traced_ops(
    inp: &Inputs,
    map: &ChunkMap,
    u: u64,
    laps: &mut Laps,
) -> std::result::Result<(Vec<ChunkOp>, Vec<u32>), LowerError> {
    let Inputs {
        plan,
        traffic,
        opts,
        timeline,
        pieces,
        ..
    } = *inp;
    let (ops, mut scratch) = trace_chunks(plan, traffic, map, u, timeline, pieces)?;
    laps.lap("trace chunks");
    // `fast`'s sends that read several blocks of their input go out as one
    // run (`super::gather`). Measured for `fast` only: `lp`'s files use
    // most of the threadblock budget for lanes, which copies would share.
    let ops = if opts.pacing == Pacing::Cut && plan.algorithm == "fast" {
        super::gather::gather_sources(ops, &mut scratch)
    } else {
        ops
    };
    Ok((ops, scratch))
}

fn lower_with(
    inp: &Inputs,
    u: u64,
    v: Variant,
    laps: &mut Laps,
    mut traced: Option<&mut Option<Traced>>,
) -> std::result::Result<Lowered, LowerError> {
    let Inputs {
        plan,
        topo,
        traffic,
        opts,
        timeline,
        ..
    } = *inp;
    let Variant {
        streams,
        handoff,
        head_lead_us,
        late_lanes,
        share,
        uncut_all,
    } = v;
    let n = traffic.ranks();
    let k: Vec<Vec<u32>> = (0..n)
        .map(|s| {
            (0..n)
                .map(|d| traffic.get(s, d).div_ceil(u))
                .collect::<Vec<u64>>()
        })
        .map(|row| {
            row.into_iter()
                .map(|c| c.min(u32::MAX as u64) as u32)
                .collect()
        })
        .collect();
    if k.iter().flatten().any(|&c| c > MAX_OFFSET as u32) {
        return Err(LowerError::Limit(
            "a pair needs more chunks than offsets can address".into(),
        ));
    }
    let map = ChunkMap::new(k.clone(), opts.layout);
    if map.nchunksperloop as i64 > MAX_OFFSET + 1 {
        return Err(LowerError::Limit(format!(
            "{} chunks per buffer, more than offsets can address",
            map.nchunksperloop
        )));
    }
    // The same chunk's operations and walks, kept by the cut lowering
    // that missed a limit after its cuts (`Traced`).
    let kept = traced
        .as_deref_mut()
        .and_then(Option::take)
        .filter(|t| t.u == u);
    let (ops, scratch, mut waits) = match kept {
        Some(t) => {
            laps.note(&format!(
                "chunk {u} bytes: the operations and pacing walks of its lowering with cuts reused"
            ));
            (t.ops, t.scratch, t.waits)
        }
        None => {
            let (ops, scratch) = traced_ops(inp, &map, u, laps)?;
            (ops, scratch, None)
        }
    };
    let nchunks = map.nchunksperloop;
    let nbytes = nchunks as u64 * u;
    let mut proto = opts
        .protocol
        .unwrap_or_else(|| protocol_for(nbytes, n as u64));
    // Without chunk comments a reader assumes nchunksperloop / ngpus chunks
    // for every pair.
    let uniform_padded = opts.layout == Layout::Padded
        && k.iter()
            .flatten()
            .all(|&c| c as usize * n == nchunks as usize);
    // A uniform file is a correct all-to-all of any size in its protocol's
    // window. Any other file moves the amounts of one matrix: it gets the
    // narrowest window the executor allows (only this buffer size;
    // `maxBytes = 0` would mean no limit) and the matrix's fingerprint in
    // its name, so no other all-to-all picks it up by size.
    let exact_matrix = !(uniform_padded && traffic.as_slice().windows(2).all(|w| w[0] == w[1]));
    // `pairwise`'s waits are stage barriers: cutting them adds a latency
    // per stage on its critical path (its files ran 15-30% behind their
    // plan with cuts, docs/benchmarks.md "Pacing cut into MSCCL XML"), and
    // the walks behind the cuts grow with the square of its steps (18 GB
    // at 4x8 packed). Its files are written whole.
    let pacing = if plan.algorithm == "pairwise" {
        Pacing::Off
    } else {
        opts.pacing
    };
    // With cuts: the operations before them too (`Traced`).
    let (paced, before_cuts) = match pacing {
        Pacing::Cut => {
            // LL and LL128 hold 8 calls per connection, so a cut needs 8
            // one-chunk steps where Simple needs 2: a transfer too short
            // for LL128's cut may still fit Simple's. A file made for one
            // matrix (its window is its own size whatever the protocol)
            // whose protocol was chosen by size takes Simple when that
            // holds more of the plan's waits (docs/msccl.md, "Pacing").
            let retry = opts.protocol.is_none()
                && !uncut_all
                && exact_matrix
                && proto.fifo_depth() > Protocol::Simple.fifo_depth();
            let release = head_lead_us.map(|l| (timeline, l));
            // Gpus whose steps before any cut nearly fill the parse: their
            // transfers are written whole (`uncut_gpus`).
            // With `uncut_all`, every gpu's (`to_xml`'s `lower_from`).
            let uncut = if uncut_all {
                vec![true; n]
            } else {
                uncut_gpus(&ops, n, opts.executor.max_tbs_per_gpu())
            };
            let hot = uncut.iter().filter(|&&h| h).count();
            if hot > 0 && !uncut_all {
                laps.note(&format!(
                    "gpus holding over {UNCUT_ABOVE} elements before pacing cuts, their transfers not cut: {hot}"
                ));
            }
            // The walks depend on the operations alone: one set serves
            // both windows, and the uncut retry (`Traced`).
            let waits = waits.get_or_insert_with(|| paced_waits(&ops));
            let first = cut_for_pacing(&ops, waits, proto.fifo_depth() as u32, release, &uncut);
            let mut paced = first;
            if retry && paced.unheld.unwrap_or(0) > 0 {
                let simple = cut_for_pacing(
                    &ops,
                    waits,
                    Protocol::Simple.fifo_depth() as u32,
                    release,
                    &uncut,
                );
                if simple.unheld < paced.unheld {
                    proto = Protocol::Simple;
                    paced = simple;
                }
            }
            (paced, Some(ops))
        }
        Pacing::Off => (
            Paced {
                parts: Vec::new(),
                ops,
                steps: 0,
                unheld: None,
                pinned: std::collections::HashSet::new(),
                released: 0,
            },
            None,
        ),
    };
    // A file with cuts may miss a limit after them and be lowered again
    // uncut at this chunk: its operations and walks are kept for that.
    if let (Some(slot), Some(ops)) = (traced.as_deref_mut(), before_cuts) {
        if paced.steps > 0 {
            *slot = Some(Traced {
                u,
                ops,
                scratch: scratch.clone(),
                waits,
            });
        }
    }
    let ops = paced.ops;
    let fifo = proto.fifo_depth() as u32;
    laps.lap("pacing cuts");
    // A limit missed after pacing cuts were made: the same chunk without
    // them may fit.
    let cuts = paced.steps;
    let after_cuts = |e: LowerError| match e {
        LowerError::Limit(why) if cuts > 0 => LowerError::CutLimit(why),
        e => e,
    };
    // Transfers longer than one connection's FIFO window run on several
    // lanes where the budget allows (`super::spread`).
    let shapes: Vec<OpCalls> = ops
        .iter()
        .map(|o| OpCalls {
            from: o.from,
            calls: if o.src == o.dst {
                0
            } else {
                super::xsim::calls(proto, u64::from(o.cnt), u)
            },
            pinned: paced.pinned.contains(&o.from),
        })
        .collect();
    // A plan with pacing cuts counts on the bandwidth shares its transfers
    // get: on lanes of their own a transfer's groups would take several
    // shares of its links from the others (`fast` intra-skew: +5.5% ->
    // +9.8%). Such plans keep one lane per transfer, and so does a file
    // written as before (`Pacing::Off` asked for). `pairwise`, written
    // without cuts whatever was asked, is still spread: its long streams
    // otherwise wait a round trip per two calls (2x8: up to +32%).
    let spread = opts.pacing == Pacing::Cut && paced.pinned.is_empty();
    // Rate lanes: a transfer's planned time and its path's latency.
    let mut pair_of: HashMap<u32, (u32, u32)> = HashMap::new();
    if matches!(streams, Streams::Rate(_)) {
        for o in ops.iter().filter(|o| o.src != o.dst) {
            pair_of.entry(o.from).or_insert((o.src, o.dst));
        }
    }
    let lanes = |from: u32, rounds: u64| -> u64 {
        match streams {
            _ if !spread => 1,
            Streams::Window => rounds,
            Streams::Rate(_) => {
                let planned = timeline
                    .get(from as usize)
                    .map_or(0.0, |t| t.end_us - t.start_us);
                let latency = pair_of
                    .get(&from)
                    .map_or(0.0, |&(s, d)| topo.path_latency(s as usize, d as usize));
                rate_lanes(rounds, latency, planned)
            }
        }
    };
    let cap = match streams {
        Streams::Window => MAX_LANES,
        Streams::Rate(c) => c.min(MAX_LANES),
    };
    let groups = stream_groups(&shapes, proto.fifo_depth() as u64, cap, lanes);
    let spread = groups.iter().any(|&g| g > 0);
    let hand = (handoff && !paced.parts.is_empty()).then_some((&paced.parts[..], fifo));
    // Only a plan whose every wait is a receive into the sender
    // (`sched::pairwise_held`): the barrier plan's other waits are written
    // as before, where they do not hold (`unheld_deps`).
    let held = plan.algorithm == "pairwise"
        && plan.transfers.iter().all(|t| {
            t.deps.iter().all(|&d| {
                plan.transfers
                    .get(d as usize)
                    .is_some_and(|p| p.dst == t.src)
            })
        });
    let chain = held.then(|| {
        let short = shapes.iter().map(|s| s.calls <= fifo as u64).collect();
        SendChain::new(short, n)
    });
    let built = build_tbs(
        &ops,
        n,
        timeline,
        opts.executor,
        &groups,
        if late_lanes { &paced.parts } else { &[] },
        hand,
        chain,
        share,
    );
    // Timed whether it fits or not (a missed chunk's cost shows).
    laps.lap("threadblocks and waits");
    let mut built = built.map_err(after_cuts)?;
    if let Some(unheld) = paced.unheld {
        built.unheld = unheld;
    }
    // A gpu with more tbs than the profile loads runs a send and a
    // receive list per tb (`super::pack`).
    let limit = opts.executor.max_tbs_per_gpu();
    let op_of = std::mem::take(&mut built.op_of);
    let unpacked = std::mem::take(&mut built.tbs);
    let pack_all = |rank: Option<&[u32]>, busy: Option<&[(f64, f64)]>| -> Vec<Vec<Tb>> {
        unpacked
            .iter()
            .zip(&op_of)
            .map(|(tbs, op_of)| pack::pack_gpu(tbs.clone(), op_of.clone(), limit, rank, busy).0)
            .collect()
    };
    // The lowering's operation order, tbs paired by steps, first (it wins
    // a tie); where a gpu is packed and the cluster is small enough to
    // price files, merges in the plan's order too (`pack::merge_order`,
    // first started or first ended), tbs paired by steps or by the plan's
    // busy time: the fastest by the executor's rules is kept. Under `rccl`
    // at 8 x 8 every `direct` and `pairwise` gpu is packed; which merge
    // wins varies with the matrix (docs/benchmarks.md, "Packed
    // threadblocks merged in the plan's order").
    let mut packings = vec![pack_all(None, None)];
    if unpacked.iter().any(|t| t.len() > limit) && n <= super::chunk::MAX_RANKS_PRICED {
        for key in [pack::MergeKey::Start, pack::MergeKey::End] {
            if let Some(r) = pack::merge_order(&unpacked, &op_of, &built.spans, key) {
                packings.push(pack_all(Some(&r), None));
                packings.push(pack_all(Some(&r), Some(&built.spans)));
            }
        }
        packings.dedup();
    }
    drop(unpacked);
    if let Some((g, tbs)) = packings[0]
        .iter()
        .enumerate()
        .find(|(_, t)| t.len() > limit)
    {
        return Err(after_cuts(LowerError::Limit(format!(
            "rank {g} needs {} threadblocks even with a send and a receive list per tb; {} loads at most {limit}",
            tbs.len(),
            opts.executor
        ))));
    }
    // Pairing by busy time may leave a gpu over the limit where steps do
    // not: such a packing is not a file.
    packings.retain(|p| p.iter().all(|t| t.len() <= limit));
    let (min_bytes, max_bytes) = if exact_matrix {
        (nbytes, nbytes)
    } else {
        window(proto, n as u64)
    };
    let fingerprint = exact_matrix.then(|| traffic.fingerprint());
    let make_algo = |tbs: Vec<Vec<Tb>>| Algo {
        name: NameFacts::format(
            &plan.algorithm,
            opts.layout,
            u,
            topo.gpus_per_node() as u32,
            fingerprint.as_deref(),
        ),
        proto,
        nchannels: built.channels as i64,
        nchunksperloop: nchunks as i64,
        ngpus: n as i64,
        coll: "alltoall".into(),
        inplace: false,
        outofplace: true,
        min_bytes: min_bytes as i64,
        max_bytes: max_bytes as i64,
        gpus: tbs
            .into_iter()
            .enumerate()
            .map(|(g, tbs)| Gpu {
                id: g as i64,
                i_chunks: nchunks as i64,
                o_chunks: nchunks as i64,
                s_chunks: scratch[g] as i64,
                tbs,
                line: 0,
            })
            .collect(),
        chunks: (!uniform_padded).then_some(k.clone()),
        line: 0,
    };
    let file = "<written XML>";
    let mut packings = packings.into_iter();
    let mut algo = make_algo(packings.next().expect("the operation order's packing"));
    // The other packings: each run by the symbolic executor and priced.
    let mut kept: Option<(exec::Trace, f64)> = None;
    let sim = SimOptions::default();
    for tbs in packings {
        if kept.is_none() {
            let trace = exec::run(&algo, file).map_err(internal)?;
            let (us, _) = super::xsim::simulate_traced(&algo, &trace, u, topo, &sim)?;
            kept = Some((trace, us));
        }
        let other = make_algo(tbs);
        let trace = exec::run(&other, file).map_err(internal)?;
        let (us, _) = super::xsim::simulate_traced(&other, &trace, u, topo, &sim)?;
        if kept.as_ref().is_some_and(|(_, best)| us < *best) {
            algo = other;
            kept = Some((trace, us));
        }
    }
    laps.lap("packings priced");
    for g in &algo.gpus {
        let steps: usize = g.tbs.iter().map(|t| t.steps.len()).sum();
        if 1 + n + g.tbs.len() + steps > MAX_NODES {
            return Err(after_cuts(LowerError::Limit(format!(
                "gpu {} would hold {} elements, the executor parses at most {MAX_NODES}",
                g.id,
                1 + n + g.tbs.len() + steps
            ))));
        }
        if g.s_chunks > MAX_OFFSET + 1 {
            return Err(after_cuts(LowerError::Limit(format!(
                "gpu {} needs {} scratch chunks",
                g.id, g.s_chunks
            ))));
        }
    }
    // Every limit met: no retry of this chunk.
    if let Some(slot) = traced {
        *slot = None;
    }
    laps.lap("packing");
    let text = write_algo(&algo);
    laps.lap("write");
    // The file as written is read back only if it is kept (`read_back`).
    let (trace, priced) = match kept {
        Some((trace, us)) => (trace, Some(us)),
        None => (exec::run(&algo, file).map_err(internal)?, None),
    };
    laps.lap("symbolic executor");
    opts.executor.check(&trace.report).map_err(|why| {
        unsupported(format!(
            "internal error, the written XML exceeds the executor's limits: {why}"
        ))
    })?;
    let count_bytes = nbytes / n as u64;
    let x = XmlPlan {
        text,
        chunk_bytes: u,
        layout: opts.layout,
        protocol: proto,
        nchunksperloop: nchunks,
        count_bytes,
        buffer_bytes: nbytes,
        scratch_bytes: scratch.iter().copied().max().unwrap_or(0) as u64 * u,
        min_bytes,
        max_bytes,
        channels: built.channels,
        max_tbs_per_gpu: trace.report.max_tbs_per_gpu,
        max_steps_per_tb: trace.report.max_steps_per_tb,
        dropped_deps: built.dropped,
        unheld_deps: built.unheld,
        pacing_steps: paced.steps - built.handoffs * fifo as usize,
        handoffs: built.handoffs,
        released_heads: paced.released,
        lanes_short: built.lanes_short,
        tbs_wanted: built.tbs_wanted,
        // Set by `to_xml` where it prices the file it keeps.
        executor_price: None,
        // Filled by `read_back` once the file is kept.
        plan: Plan::new(&plan.algorithm, 0, 0),
        report: trace.report.clone(),
        algo,
    };
    Ok(Lowered {
        x,
        spread,
        trace,
        priced,
    })
}

fn internal(e: Error) -> Error {
    unsupported(format!(
        "internal error, the written XML fails its own check: {e}"
    ))
}

/// Checks the kept file as written: its text is read back and, where it
/// parses to anything but the lowered form, run again by the symbolic
/// executor; the plan it encodes (requantised to its chunks) becomes
/// `x.plan`. Candidate files are priced from the run of their lowered form
/// and only the kept one is read back. The executor's run depends on the
/// parsed elements alone, so a file that reads back as the lowered form
/// keeps that form's run (at 32 x 8 `fast`, 3 s of the lowering's 37).
fn read_back(
    Lowered {
        mut x,
        trace: lowered_run,
        ..
    }: Lowered,
    traffic: &TrafficMatrix,
    laps: &mut Laps,
) -> Result<XmlPlan> {
    let file = "<written XML>";
    let parsed = parse_algo(&x.text, file).map_err(internal)?;
    laps.lap("read back");
    let trace = if same_elements(&parsed, &x.algo) {
        lowered_run
    } else {
        exec::run(&parsed, file).map_err(internal)?
    };
    laps.lap("symbolic executor (kept file)");
    let (encoded, _) = trace_to_plan(&parsed, &trace, Some(traffic), Some(x.chunk_bytes), file)
        .map_err(internal)?;
    laps.lap("encoded plan");
    x.plan = encoded;
    Ok(x)
}

/// Whether two files hold the same elements with the same attributes,
/// wherever they were read from (`line` is where, and only error messages
/// and warnings quote it). Every field is named, so a new one is compared
/// or left out on purpose.
fn same_elements(a: &Algo, b: &Algo) -> bool {
    let Algo {
        name,
        proto,
        nchannels,
        nchunksperloop,
        ngpus,
        coll,
        inplace,
        outofplace,
        min_bytes,
        max_bytes,
        gpus,
        chunks,
        line: _,
    } = a;
    let same_step = |x: &Step, y: &Step| {
        let Step {
            s,
            kind,
            srcbuf,
            srcoff,
            dstbuf,
            dstoff,
            cnt,
            depid,
            deps,
            hasdep,
            line: _,
        } = x;
        (
            s, kind, srcbuf, srcoff, dstbuf, dstoff, cnt, depid, deps, hasdep,
        ) == (
            &y.s, &y.kind, &y.srcbuf, &y.srcoff, &y.dstbuf, &y.dstoff, &y.cnt, &y.depid, &y.deps,
            &y.hasdep,
        )
    };
    let same_tb = |x: &Tb, y: &Tb| {
        let Tb {
            id,
            send,
            recv,
            chan,
            steps,
            line: _,
        } = x;
        (id, send, recv, chan) == (&y.id, &y.send, &y.recv, &y.chan)
            && steps.len() == y.steps.len()
            && steps.iter().zip(&y.steps).all(|(p, q)| same_step(p, q))
    };
    let same_gpu = |x: &Gpu, y: &Gpu| {
        let Gpu {
            id,
            i_chunks,
            o_chunks,
            s_chunks,
            tbs,
            line: _,
        } = x;
        (id, i_chunks, o_chunks, s_chunks) == (&y.id, &y.i_chunks, &y.o_chunks, &y.s_chunks)
            && tbs.len() == y.tbs.len()
            && tbs.iter().zip(&y.tbs).all(|(p, q)| same_tb(p, q))
    };
    (
        name,
        proto,
        nchannels,
        nchunksperloop,
        ngpus,
        coll,
        inplace,
        outofplace,
        min_bytes,
        max_bytes,
        chunks,
    ) == (
        &b.name,
        &b.proto,
        &b.nchannels,
        &b.nchunksperloop,
        &b.ngpus,
        &b.coll,
        &b.inplace,
        &b.outofplace,
        &b.min_bytes,
        &b.max_bytes,
        &b.chunks,
    ) && gpus.len() == b.gpus.len()
        && gpus.iter().zip(&b.gpus).all(|(p, q)| same_gpu(p, q))
}
