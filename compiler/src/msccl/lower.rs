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

use std::cmp::Reverse;
use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, BinaryHeap, HashMap};

use super::exec;
use super::laps::Laps;
use super::ops::{ChunkOp, Part};
use super::parse::parse_algo;
use super::read::trace_to_plan;
use super::spread::{rate_lanes, spread_lanes, stream_groups, OpCalls};
use super::trace::{chunk_mid, chunks_of, trace_pieces};
use super::write::write_algo;
use super::{fit, pack, unsupported};
use super::{Algo, BufRef, ChunkMap, Gpu, Layout, NameFacts, Protocol, Step, StepKind, Tb};
use super::{Executor, MAX_CNT, MAX_NODES, MAX_OFFSET};
use super::{MAX_CHUNK_BYTES, MAX_STEPS_PER_TB};
use crate::error::{Error, InputError, Result};
use crate::plan::{Buffer, Plan};
use crate::sim::{simulate, SimOptions, TransferTime};
use crate::topology::Topology;
use crate::traffic::TrafficMatrix;

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
    /// The plan the file encodes, on the original matrix: transfers are its
    /// operations, byte ranges requantised to chunk boundaries.
    pub plan: Plan,
    pub report: exec::ExecReport,
}

impl XmlPlan {
    /// The facts a `--report` carries, as JSON.
    pub fn report_json(&self) -> serde_json::Value {
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
    let lower_from =
        |start: u64, handoff: bool, lead: Option<f64>, laps: &mut Laps| -> Result<Lowered> {
            let mut u = start;
            let mut retry = Retry::new(uncut_retry);
            loop {
                let (why, after_cuts) = match lower_with(
                    plan,
                    topo,
                    traffic,
                    opts,
                    u,
                    &timeline,
                    Streams::Window,
                    laps,
                    handoff,
                    lead,
                    retry.uncut,
                ) {
                    Ok(x) => return Ok(x),
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
    let first = lower_from(base, true, None, &mut laps)?;
    // Each with the symbolic executor's run the lowering made of it.
    let mut cands: Vec<(XmlPlan, exec::Trace)> = Vec::new();
    // Tails handed to the next head (`super::handoff`) start the heads'
    // bodies a latency earlier, which moves the bandwidth shares the plan's
    // other transfers get: 4x8 log-normal +5.3% -> +4.6% of its plan, 4x8
    // hotspot +3.0% -> +4.0% (docs/benchmarks.md, issue 22). Where there
    // are any, the file without them is priced too (first: it wins a tie).
    if first.x.handoffs > 0 && n <= super::chunk::MAX_RANKS_PRICED {
        if let Ok(plain) = lower_from(base, false, None, &mut laps) {
            cands.push((plain.x, plain.trace));
        }
    }
    // Long streams: one lane per FIFO window's worth of calls keeps every
    // window busy but gives a stream several max-min shares of links its
    // plan shares with other transfers (8x8 MoE `deepep`: +3.5% -> +4.1%,
    // docs/benchmarks.md issue 22). Where a stream was spread, files with
    // only the lanes each stream's planned rate needs
    // (`super::spread::rate_lanes`), at two caps, are priced too.
    let with_rates = |l: Lowered, cands: &mut Vec<(XmlPlan, exec::Trace)>, laps: &mut Laps| {
        let (u, spread) = (l.x.chunk_bytes, l.spread);
        cands.push((l.x, l.trace));
        if !spread || opts.pacing != Pacing::Cut || n > super::chunk::MAX_RANKS_PRICED {
            return;
        }
        for c in RATE_CAPS {
            // The same chunk as the window file, or none.
            let r = lower_with(
                plan,
                topo,
                traffic,
                opts,
                u,
                &timeline,
                Streams::Rate(c),
                laps,
                true,
                None,
                false,
            );
            if let Ok(r) = r {
                if cands.iter().all(|y| y.0.text != r.x.text) {
                    cands.push((r.x, r.trace));
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
        if let Ok(y) = lower_from(fine, true, None, &mut laps) {
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
                    cands: &mut Vec<(XmlPlan, exec::Trace)>,
                    laps: &mut Laps| {
        for &(handoff, lead) in files {
            if let Ok(y) = lower_from(u, handoff, lead, laps) {
                if y.x.chunk_bytes == u && cands.iter().all(|c| c.0.text != y.x.text) {
                    cands.push((y.x, y.trace));
                }
            }
        }
    };
    if fast_priced {
        files_at(base_u, &[(true, Some(HEAD_LEAD_US))], &mut cands, &mut laps);
        if opts.chunk_bytes.is_none() {
            for u in super::chunk::near_chunk_bytes(traffic, opts.layout) {
                files_at(
                    u,
                    &[(true, None), (true, Some(HEAD_LEAD_US))],
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
    if cands.len() == 1 && !simple_may_help(opts, &cands[0].0, n) && !rescue {
        return read_back(cands.remove(0), traffic, &mut laps);
    }
    // The plan's own completion; a file more than [`SCORED_ABOVE`] behind
    // it is "over", and the steps below try more files while the best is.
    let plan_us = timeline.iter().map(|t| t.end_us).fold(0.0, f64::max);
    let over = |us: f64| us > plan_us * (1.0 + SCORED_ABOVE);
    let sim = SimOptions::default();
    let price = |(p, trace): &(XmlPlan, exec::Trace)| -> Result<f64> {
        let (us, _) = super::xsim::simulate_traced(&p.algo, trace, p.chunk_bytes, topo, &sim)?;
        Ok(us)
    };
    // The fastest; on a tie the earlier (the window file, the base chunk).
    let mut best = 0;
    let mut best_us = f64::INFINITY;
    let mut priced = 0;
    let mut price_new =
        |cands: &[(XmlPlan, exec::Trace)], best: &mut usize, best_us: &mut f64| -> Result<()> {
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
        let tried: Vec<u64> = cands.iter().map(|c| c.0.chunk_bytes).collect();
        let scored = super::chunk::scored_chunk_bytes(plan, traffic, opts.layout, 2)?;
        for u in scored.into_iter().filter(|u| !tried.contains(u)) {
            if !over(best_us) {
                break;
            }
            let files = [(true, None), (false, None), (true, Some(HEAD_LEAD_US))];
            files_at(u, &files, &mut cands, &mut laps);
            price_new(&cands, &mut best, &mut best_us)?;
        }
    }
    // The window file at chunk `u` lowered with options `o`, and where it
    // spreads a stream, its rate-lane files (as `with_rates`).
    let files_with =
        |o: &XmlOptions, u: u64, cands: &mut Vec<(XmlPlan, exec::Trace)>, laps: &mut Laps| {
            for streams in [
                Streams::Window,
                Streams::Rate(RATE_CAPS[0]),
                Streams::Rate(RATE_CAPS[1]),
            ] {
                match lower_with(
                    plan, topo, traffic, o, u, &timeline, streams, laps, true, None, false,
                ) {
                    Ok(y) if y.x.chunk_bytes == u && cands.iter().all(|c| c.0.text != y.x.text) => {
                        let spread = y.spread;
                        cands.push((y.x, y.trace));
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
    let simple = simple_candidates(opts, &cands[best].0, over(best_us), n);
    if let Some(o) = &simple {
        files_with(o, cands[best].0.chunk_bytes, &mut cands, &mut laps);
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
            Some(o) if cands[best].0.protocol == Protocol::Simple => o,
            _ => opts.clone(),
        };
        let tried: Vec<u64> = cands.iter().map(|c| c.0.chunk_bytes).collect();
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
            files_with(&o, u, &mut cands, &mut laps);
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
                files_with(&whole, u, &mut cands, &mut laps);
            }
        }
        price_new(&cands, &mut best, &mut best_us)?;
    }
    laps.lap("pricing the candidate files");
    read_back(cands.swap_remove(best), traffic, &mut laps)
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

/// A lowered file, and whether it spread some stream over lanes.
struct Lowered {
    x: XmlPlan,
    spread: bool,
    /// The symbolic executor's run of the written file, for its pricing.
    trace: exec::Trace,
}

#[allow(clippy::too_many_arguments)]
fn lower_with(
    plan: &Plan,
    topo: &Topology,
    traffic: &TrafficMatrix,
    opts: &XmlOptions,
    u: u64,
    timeline: &[TransferTime],
    streams: Streams,
    laps: &mut Laps,
    handoff: bool,
    head_lead_us: Option<f64>,
    uncut_all: bool,
) -> std::result::Result<Lowered, LowerError> {
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
    let (ops, mut scratch) = trace_chunks(plan, traffic, &map, u, timeline)?;
    laps.lap("trace chunks");
    // `fast`'s sends that read several blocks of their input go out as one
    // run (`super::gather`). Measured for `fast` only: `lp`'s files use
    // most of the threadblock budget for lanes, which copies would share.
    let ops = if opts.pacing == Pacing::Cut && plan.algorithm == "fast" {
        super::gather::gather_sources(ops, &mut scratch)
    } else {
        ops
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
    let paced = match pacing {
        Pacing::Cut => {
            // LL and LL128 hold 8 calls per connection, so a cut needs 8
            // one-chunk steps where Simple needs 2: a transfer too short
            // for LL128's cut may still fit Simple's. A file made for one
            // matrix (its window is its own size whatever the protocol)
            // whose protocol was chosen by size takes Simple when that
            // holds more of the plan's waits (docs/msccl.md, "Pacing").
            let retry = (opts.protocol.is_none()
                && !uncut_all
                && exact_matrix
                && proto.fifo_depth() > Protocol::Simple.fifo_depth())
            .then(|| ops.clone());
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
            let first = cut_for_pacing(ops, proto.fifo_depth() as u32, release, &uncut);
            match retry {
                Some(ops) if first.unheld.unwrap_or(0) > 0 => {
                    let simple =
                        cut_for_pacing(ops, Protocol::Simple.fifo_depth() as u32, release, &uncut);
                    if simple.unheld < first.unheld {
                        proto = Protocol::Simple;
                        simple
                    } else {
                        first
                    }
                }
                _ => first,
            }
        }
        Pacing::Off => Paced {
            parts: Vec::new(),
            ops,
            steps: 0,
            unheld: None,
            pinned: std::collections::HashSet::new(),
            released: 0,
        },
    };
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
    let mut built =
        build_tbs(&ops, n, timeline, opts.executor, &groups, hand, chain).map_err(after_cuts)?;
    laps.lap("threadblocks and waits");
    if let Some(unheld) = paced.unheld {
        built.unheld = unheld;
    }
    // A gpu with more tbs than the profile loads runs a send and a
    // receive list per tb (`super::pack`).
    let limit = opts.executor.max_tbs_per_gpu();
    let op_of = std::mem::take(&mut built.op_of);
    built.tbs = built
        .tbs
        .into_iter()
        .zip(op_of)
        .map(|(tbs, op_of)| pack::pack_gpu(tbs, op_of, limit).0)
        .collect();
    if let Some((g, tbs)) = built.tbs.iter().enumerate().find(|(_, t)| t.len() > limit) {
        return Err(after_cuts(LowerError::Limit(format!(
            "rank {g} needs {} threadblocks even with a send and a receive list per tb; {} loads at most {limit}",
            tbs.len(),
            opts.executor
        ))));
    }
    let (min_bytes, max_bytes) = if exact_matrix {
        (nbytes, nbytes)
    } else {
        window(proto, n as u64)
    };
    let fingerprint = exact_matrix.then(|| traffic.fingerprint());
    let algo = Algo {
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
        gpus: built
            .tbs
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
        chunks: (!uniform_padded).then_some(k),
        line: 0,
    };
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
    laps.lap("packing");
    let text = write_algo(&algo);
    laps.lap("write");
    let file = "<written XML>";
    // The file as written is read back only if it is kept (`read_back`).
    let trace = exec::run(&algo, file).map_err(internal)?;
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
        // Filled by `read_back` once the file is kept.
        plan: Plan::new(&plan.algorithm, 0, 0),
        report: trace.report.clone(),
        algo,
    };
    Ok(Lowered { x, spread, trace })
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
    (mut x, lowered_run): (XmlPlan, exec::Trace),
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

/// Replays the plan and cuts it into chunk operations; returns them (in a
/// topological order) and the scratch chunks each rank needs.
fn trace_chunks(
    plan: &Plan,
    traffic: &TrafficMatrix,
    map: &ChunkMap,
    u: u64,
    timeline: &[TransferTime],
) -> std::result::Result<(Vec<ChunkOp>, Vec<u32>), LowerError> {
    let n = traffic.ranks();
    let ts = &plan.transfers;
    let bad = |i: usize, why: String| -> LowerError {
        LowerError::Other(unsupported(format!(
            "transfer {i}: {why} (is the plan verified?)"
        )))
    };
    let traced = trace_pieces(plan, traffic, timeline)?;
    // Scratch chunk holding chunk `c` of block (s, d), per rank.
    let mut slot: HashMap<(u32, u32, u32, u32), u32> = HashMap::new();
    let mut scratch = vec![0u32; n];
    let mut ops: Vec<ChunkOp> = Vec::new();
    // Operations a transfer stands for (its deps' when it moves no chunk).
    let mut eff: Vec<Vec<u32>> = vec![Vec::new(); ts.len()];
    // Scratch chunks in the order of the plan's scratch bytes, so a range the
    // plan reads in one piece is one run of chunks.
    let mut writes: Vec<(u32, u64, usize, u32, u32, u32)> = Vec::new();
    for (order, (i, pieces)) in traced.iter().enumerate() {
        let t = &ts[*i];
        if t.dst_buf != Buffer::Scratch {
            continue;
        }
        let mut at = t.dst_off;
        for &(s, d, a, b) in pieces {
            let len = traffic.get(s as usize, d as usize);
            for c in chunks_of(a, b, u, len) {
                writes.push((
                    t.dst,
                    at + (chunk_mid(c, u, len) - a),
                    order,
                    s,
                    d,
                    c as u32,
                ));
            }
            at += b - a;
        }
    }
    writes.sort_unstable();
    let mut slot_of: HashMap<(usize, u32, u32, u32), u32> = HashMap::new();
    for &(r, _, order, s, d, c) in &writes {
        let x = scratch[r as usize];
        scratch[r as usize] += 1;
        slot_of.insert((order, s, d, c), x);
    }
    for (order, (i, pieces)) in traced.into_iter().enumerate() {
        let t = &ts[i];
        let mut deps: Vec<u32> = t
            .deps
            .iter()
            .flat_map(|&d| eff[d as usize].iter().copied())
            .collect();
        deps.sort_unstable();
        deps.dedup();
        // Chunk pairs (src index, dst index); chunk c goes with its first byte.
        let mut pairs: Vec<(u32, u32)> = Vec::new();
        for &(s, d, a, b) in &pieces {
            for c in chunks_of(a, b, u, traffic.get(s as usize, d as usize)) {
                let c = c as u32;
                let (su, du) = (s as usize, d as usize);
                let src_idx = match t.src_buf {
                    Buffer::Input => map.input_chunk(su, du, c),
                    Buffer::Output => map.output_chunk(su, du, c),
                    Buffer::Scratch => *slot.get(&(t.src, s, d, c)).ok_or_else(|| {
                        bad(
                            i,
                            format!(
                                "chunk {c} of block {s}->{d} is not in scratch of rank {}",
                                t.src
                            ),
                        )
                    })?,
                };
                let dst_idx = match t.dst_buf {
                    Buffer::Output => {
                        if t.dst != d {
                            return Err(bad(
                                i,
                                format!("puts data for rank {d} into output of rank {}", t.dst),
                            ));
                        }
                        map.output_chunk(su, du, c)
                    }
                    Buffer::Scratch => {
                        let x = slot_of[&(order, s, d, c)];
                        slot.insert((t.dst, s, d, c), x);
                        x
                    }
                    Buffer::Input => return Err(bad(i, "writes an input buffer".into())),
                };
                pairs.push((src_idx, dst_idx));
            }
        }
        // Runs of consecutive chunks, at most MAX_CNT each.
        let mut j = 0;
        while j < pairs.len() {
            let mut len = 1;
            while j + len < pairs.len()
                && len < MAX_CNT as usize
                && pairs[j + len] == (pairs[j].0 + len as u32, pairs[j].1 + len as u32)
            {
                len += 1;
            }
            eff[i].push(ops.len() as u32);
            ops.push(ChunkOp {
                src: t.src,
                src_buf: bufref(t.src_buf),
                src_off: pairs[j].0,
                dst: t.dst,
                dst_buf: bufref(t.dst_buf),
                dst_off: pairs[j].1,
                cnt: len as u32,
                deps: deps.clone(),
                recv_deps: Vec::new(),
                from: i as u32,
            });
            j += len;
        }
        if eff[i].is_empty() {
            eff[i] = deps;
        }
    }
    Ok((ops, scratch))
}

/// Operations cut for pacing ([`Pacing::Cut`]).
struct Paced {
    ops: Vec<ChunkOp>,
    /// What part of its operation each of `ops` is.
    parts: Vec<Part>,
    /// Steps the cuts add.
    steps: usize,
    /// Pairs of plan transfers whose wait still does not hold (operations
    /// too short to cut), replacing the count of [`build_tbs`].
    unheld: Option<usize>,
    /// Transfers cut here: their operations stay on one connection.
    pinned: std::collections::HashSet<u32>,
    /// Operations whose head steps got a wait that holds them until
    /// shortly before their transfer's planned start (`release`).
    released: usize,
}

/// Makes the executor hold the waits it would not (docs/msccl.md,
/// "Pacing"). A wait of send `y` (from gpu `g`) on transfer `x` holds when
/// some operation `x` leads to arrives on `g` (a receive or copy there is
/// done when its data is). Otherwise it lands on sends of `g` (done when
/// staged) and on `y`'s receiver (which holds only its receive). Then:
/// - each awaited send of `g` (the last operation of its transfer) ends in
///   `window` one-chunk steps: its last step is staged only once the
///   receiver has taken the call `window` places before it, the body's
///   last call, so its gpu's wait now ends when the body has arrived;
/// - `y` (the first operation of its transfer) starts with `window`
///   one-chunk steps when its receiver has a wait: the body's first call
///   waits until the receiver takes the first of them, which its wait holds.
///
/// The leak is `window` chunks each way. Operations keep their transfer
/// (`from`), so lanes keep them together and a reader streams them as one.
///
/// `release = Some((timeline, lead_us))` (the plan's timeline): a head
/// also waits for the latest earlier send of its gpu that the plan starts
/// at least `lead_us` before the head's transfer, so it leaves shortly
/// before its body's planned start rather than as soon as its data is
/// there, when it takes NIC shares from the bodies the plan runs then.
///
/// `uncut` (per gpu; empty: none) marks gpus whose transfers, sent or
/// received, are not cut ([`uncut_gpus`]); their waits that only a cut
/// would hold count as unheld.
fn cut_for_pacing(
    ops: Vec<ChunkOp>,
    window: u32,
    release: Option<(&[TransferTime], f64)>,
    uncut: &[bool],
) -> Paced {
    let n = ops.len();
    let remote = |o: &ChunkOp| o.src != o.dst;
    // Transfers: runs of operations with the same `from`.
    let mut first = vec![0usize; n];
    let mut last = vec![0usize; n];
    // A transfer's local copies (gathered runs, `super::gather`) are not
    // part of its remote run.
    let same = |a: &ChunkOp, b: &ChunkOp| a.from == b.from && remote(a) == remote(b);
    for i in 0..n {
        first[i] = if i > 0 && same(&ops[i - 1], &ops[i]) {
            first[i - 1]
        } else {
            i
        };
    }
    for i in (0..n).rev() {
        last[i] = if i + 1 < n && same(&ops[i + 1], &ops[i]) {
            last[i + 1]
        } else {
            i
        };
    }
    // Per transfer (its first operation): head, tail, and which of its
    // deps only its receiver can hold.
    let mut head = vec![false; n];
    let mut tail = vec![false; n];
    let mut recv_only: Vec<Vec<u32>> = vec![Vec::new(); n];
    // Deps held through a tail on the sending gpu (sends of that gpu, never
    // data the transfer reads): its head does not wait for them.
    let mut send_only: Vec<Vec<u32>> = vec![Vec::new(); n];
    let mut pairs: Vec<(u32, u32, usize, bool)> = Vec::new();
    let mut memo = Walks::new(n);
    // The same cap on memoised walks as `build_tbs` (memory proportional to
    // the plan); a walk past it finds nothing, and that wait is not cut.
    let walk_cap = WALKS_PER_OP * n + (1 << 16);
    let graph = OpGraph::new(&ops);
    for (yi, y) in ops.iter().enumerate() {
        if !remote(y) || first[yi] != yi {
            continue;
        }
        for &x in &y.deps {
            let xo = &ops[x as usize];
            if xo.from == y.from {
                continue;
            }
            // Data (or a wait) that arrives on the sending gpu: held.
            if xo.dst == y.src {
                continue;
            }
            // A send of the same gpu, or a transfer into the same receiver:
            // the wait is on that operation itself.
            let mut on_src = Vec::new();
            let mut on_dst = Vec::new();
            if xo.src == y.src {
                on_src.push(x);
            } else if xo.dst == y.dst {
                on_dst.push(x);
            } else {
                ancestors_on(&graph, x, y.src, &mut memo, walk_cap, &mut on_src);
                if on_src.iter().any(|&z| ops[z as usize].dst == y.src) {
                    continue;
                }
                ancestors_on(&graph, x, y.dst, &mut memo, walk_cap, &mut on_dst);
            }
            for &z in &on_src {
                let zi = z as usize;
                if remote(&ops[zi]) && ops[zi].src == y.src && last[zi] == zi {
                    tail[first[zi]] = true;
                    pairs.push((xo.from, y.from, first[zi], false));
                    if !send_only[yi].contains(&x) {
                        send_only[yi].push(x);
                    }
                }
            }
            if !on_dst.is_empty() {
                head[yi] = true;
                recv_only[yi].push(x);
                pairs.push((xo.from, y.from, yi, true));
            }
        }
    }
    // One-chunk steps to split off each operation's start and end: the
    // first `window` chunks of a transfer with a head, the last `window` of
    // one with a tail (operations of one chunk count as they are).
    let mut lead = vec![0u32; n];
    let mut trail = vec![0u32; n];
    let mut cut_ok = vec![true; n];
    let mut i = 0;
    while i < n {
        let (f, l) = (i, last[i]);
        let total: u64 = ops[f..=l].iter().map(|o| u64::from(o.cnt)).sum();
        let w = u64::from(window);
        // The tail first (it holds the sending gpu's own waits), then the
        // head, each of up to `window` chunks, leaving a body of at least
        // one chunk; a short transfer gets what fits.
        let whole = !uncut.is_empty()
            && remote(&ops[f])
            && (uncut[ops[f].src as usize] || uncut[ops[f].dst as usize]);
        let t = if tail[f] && !whole {
            w.min(total - 1)
        } else {
            0
        };
        let h = if head[f] && !whole {
            w.min(total - 1 - t)
        } else {
            0
        };
        cut_ok[f] = (!tail[f] || t == w) && (!head[f] || h == w);
        let mut left = h as u32;
        for j in f..=l {
            if left == 0 {
                break;
            }
            let k = left.min(ops[j].cnt);
            lead[j] = k;
            left -= k;
        }
        let mut left = t as u32;
        for j in (f..=l).rev() {
            if left == 0 {
                break;
            }
            let k = left.min(ops[j].cnt - lead[j]);
            trail[j] = k;
            left -= k;
        }
        i = l + 1;
    }
    // Cut, and map each old operation to its new ones. A head's steps wait
    // only for the transfer's data (deps its sending gpu holds): the waits
    // on sends of its own gpu (held by their tails) and those only its
    // receiver can hold are the body's, so the head leaves as soon as its
    // data is there and the body does not pay the head's latency after
    // its sending chain's wait (4x8 log-normal: +7.1% -> +5.4%, packed).
    let mut out: Vec<ChunkOp> = Vec::with_capacity(n);
    let mut new_of: Vec<std::ops::Range<u32>> = Vec::with_capacity(n);
    // Steps split off as a tail, per new operation.
    let mut is_tail: Vec<bool> = Vec::with_capacity(n);
    let mut parts: Vec<Part> = Vec::with_capacity(n);
    let mut steps = 0;
    let mut released = 0;
    // Per gpu, the first operations of its remote transfers, in order.
    let mut sends_of: Vec<Vec<usize>> = Vec::new();
    if release.is_some() {
        for (i, o) in ops.iter().enumerate() {
            if first[i] == i && remote(o) {
                let g = o.src as usize;
                if sends_of.len() <= g {
                    sends_of.resize(g + 1, Vec::new());
                }
                sends_of[g].push(i);
            }
        }
    }
    for (i, op) in ops.iter().enumerate() {
        // Deps on a tail step only where they need it (`tail_dep_needed`).
        let map = |d: &[u32]| -> Vec<u32> {
            d.iter()
                .flat_map(|&d| new_of[d as usize].clone())
                .filter(|&p| !is_tail[p as usize] || tail_dep_needed(op, &out[p as usize]))
                .collect()
        };
        let deps = map(&op.deps);
        let f = first[i];
        let (held, recv): (Vec<u32>, Vec<u32>) = if lead[i] > 0 {
            let r = &recv_only[f];
            let sent = &send_only[f];
            let held: Vec<u32> = op
                .deps
                .iter()
                .copied()
                .filter(|d| !r.contains(d) && !sent.contains(d))
                .collect();
            let mut held = map(&held);
            // Released heads: also wait for the latest earlier send of this
            // gpu that the plan starts `lead_us` or more before this
            // transfer (a send is done once staged, so about when it
            // starts): the head leaves about `lead_us` before its body's
            // planned start instead of at once.
            if let Some(z) = release.and_then(|(tl, lead_us)| {
                let start = tl.get(op.from as usize)?.start_us - lead_us;
                let mine = &sends_of[op.src as usize];
                let before = mine.partition_point(|&z| z < f);
                mine[..before].iter().rev().copied().find(|&z| {
                    ops[z].from != op.from
                        && tl
                            .get(ops[z].from as usize)
                            .is_some_and(|t| t.start_us <= start)
                })
            }) {
                let p = new_of[z].start;
                if !held.contains(&p) {
                    held.push(p);
                    released += 1;
                }
            }
            (held, map(r))
        } else {
            (deps.clone(), Vec::new())
        };
        let mid = op.cnt - lead[i] - trail[i];
        let mut sizes: Vec<(u32, bool)> = vec![(1, true); lead[i] as usize];
        if mid > 0 {
            sizes.push((mid, false));
        }
        sizes.extend(std::iter::repeat_n((1, false), trail[i] as usize));
        steps += sizes.len() - 1;
        let start = out.len() as u32;
        let mut at = 0;
        let tail_from = sizes.len() - trail[i] as usize;
        let cut = sizes.len() > 1;
        for (k, (c, is_head)) in sizes.into_iter().enumerate() {
            let piece = if is_head { &held } else { &deps };
            // A piece of a cut operation waits only for the data it reads
            // (`own_data`), not for what writes the other pieces' chunks.
            let piece = if cut {
                own_data(op, op.src_off + at, c, piece, &out)
            } else {
                piece.clone()
            };
            is_tail.push(k >= tail_from);
            parts.push(if !cut {
                Part::Whole
            } else if is_head {
                Part::Head
            } else if k >= tail_from {
                Part::Tail
            } else {
                Part::Body
            });
            out.push(ChunkOp {
                src_off: op.src_off + at,
                dst_off: op.dst_off + at,
                cnt: c,
                deps: piece,
                recv_deps: if is_head { recv.clone() } else { Vec::new() },
                ..op.clone()
            });
            at += c;
        }
        new_of.push(start..out.len() as u32);
    }
    let unheld: std::collections::HashSet<(u32, u32)> = pairs
        .iter()
        .filter(|&&(_, _, z, _)| !cut_ok[z])
        .map(|&(a, b, _, _)| (a, b))
        .collect();
    let pinned = (0..n)
        .filter(|&i| lead[i] > 0 || trail[i] > 0)
        .map(|i| ops[i].from)
        .collect();
    Paced {
        ops: out,
        parts,
        steps,
        unheld: Some(unheld.len()),
        pinned,
        released,
    }
}

/// The deps (operations of `out`) of a piece of `op` that reads chunks
/// `off..off + cnt` of its source: all of `deps` but those that write, on
/// `op`'s sending gpu, only chunks `op` reads and the piece does not (the
/// data of `op`'s other pieces). A head then leaves once its own chunks are
/// there, as the plan's transfer starts with the data that is: with every
/// data dep of its transfer, a forward's head left only with the body's
/// data, and the body paid the head's flight after it (4x8 log-normal
/// padded: 3.8 us on the critical path); and a body no longer waits for
/// the tail of the transfer that brought a tail's chunks.
fn own_data(op: &ChunkOp, off: u32, cnt: u32, deps: &[u32], out: &[ChunkOp]) -> Vec<u32> {
    let overlaps = |a: u32, n: u32, b: u32, m: u32| a < b + m && b < a + n;
    deps.iter()
        .copied()
        .filter(|&p| {
            let w = &out[p as usize];
            let other_data = w.dst == op.src
                && w.dst_buf == op.src_buf
                && overlaps(w.dst_off, w.cnt, op.src_off, op.cnt)
                && !overlaps(w.dst_off, w.cnt, off, cnt);
            !other_data
        })
        .collect()
}

/// Whether `op` must wait for the tail step `t` (a one-chunk step an
/// awaited transfer ends in, [`cut_for_pacing`]) rather than for the body
/// before it: on `t`'s sending gpu (the wait the tail is there for: done
/// when staged, so once the body has been taken), or where `op` reads
/// what `t` writes. Anywhere else the body is enough: a tail is staged
/// only once its body has been taken, so it arrives a latency after the
/// body, and a receiver (or a forward of other chunks) waiting for it
/// would start a latency later than the plan does, once per link of a
/// chain of waits (4x8 MoE: the receiving chain into the last GPU paid 5
/// such latencies). The tail's chunks are the leak the cut allows anyway.
fn tail_dep_needed(op: &ChunkOp, t: &ChunkOp) -> bool {
    op.src == t.src
        || op.dst == t.src
        || (op.src == t.dst
            && op.src_buf == t.dst_buf
            && op.src_off < t.dst_off + t.cnt
            && t.dst_off < op.src_off + op.cnt)
}

/// Which tb a step goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum TbKey {
    /// Sends to `peer` on `chan`.
    Send { peer: u32, chan: u32 },
    /// Receives from `peer` on `chan`.
    Recv { peer: u32, chan: u32 },
    /// Local copies, the `k`-th such tb.
    Local { k: u32 },
}

struct Built {
    tbs: Vec<Vec<Tb>>,
    /// Per gpu, tb and step: the operation the step belongs to (a nop
    /// belongs to the operation it waits before), in the order of `tbs`.
    op_of: Vec<Vec<Vec<u32>>>,
    channels: u32,
    dropped: usize,
    unheld: usize,
    lanes_short: usize,
    tbs_wanted: usize,
    /// Tails handed to the next head (`super::handoff`).
    handoffs: usize,
}

/// `pairwise`'s waits as its executor holds them: a round's send waits for
/// every block its gpu received in earlier rounds (`sched::pairwise`),
/// and receives wait for nothing (a receive-side wait never holds its
/// sender, and every block goes from input to output with no relay). Written
/// as is, a send of round `k` would wait for `k` receive tbs, one nop
/// each (127 at 16 x 8, more than a tb's 64 steps). Instead each send also
/// waits for the previous transfer's send on its gpu, which waited for all
/// older receives, so `drop_implied_waits` leaves two waits: the newest
/// receive and the previous send. That wait costs nothing the plan does
/// not ask for: the previous send started no later (its receives are a
/// subset) and is done once staged.
struct SendChain {
    /// Per operation: a send of at most a FIFO window of calls, staged as
    /// soon as it starts when it is the first on its connection. A longer
    /// one is staged only when its receiver has taken all but the window:
    /// waiting for it would hold the next round back, so the chain skips
    /// such a transfer and the receives it waited for are waited for
    /// directly.
    short: Vec<bool>,
    /// Per gpu: the transfer (`ChunkOp::from`) of its latest send, that
    /// transfer's first operation if short, and the operation the
    /// transfer's sends follow.
    last: Vec<Option<ChainLink>>,
}

/// A gpu's latest send in [`SendChain`]: its transfer, that transfer's
/// first operation if short, and the operation its sends follow.
type ChainLink = (u32, Option<u32>, Option<u32>);

impl SendChain {
    fn new(short: Vec<bool>, n: usize) -> Self {
        SendChain {
            short,
            last: vec![None; n],
        }
    }

    /// The operation the send `o` (of transfer `from`, on gpu `g`) waits
    /// for: the short first send of the latest earlier transfer that has
    /// one. Operations of one transfer (its lanes and chunk runs) do not
    /// wait for each other.
    fn follow(&mut self, g: u32, from: u32, o: u32) -> Option<u32> {
        let slot = &mut self.last[g as usize];
        match *slot {
            Some((f, _, target)) if f == from => target,
            prev => {
                let target = prev.and_then(|(_, first, target)| first.or(target));
                let short = self.short.get(o as usize).copied().unwrap_or(false);
                *slot = Some((from, short.then_some(o), target));
                target
            }
        }
    }
}

/// A tb under construction.
struct TbDraft {
    key: TbKey,
    steps: Vec<Step>,
    /// The operation of each step.
    ops: Vec<u32>,
    /// Latest position of each other tb this tb has waited for.
    waited: HashMap<u32, u32>,
}

fn build_tbs(
    ops: &[ChunkOp],
    n: usize,
    timeline: &[TransferTime],
    executor: Executor,
    split: &[u32],
    hand: Option<(&[Part], u32)>,
    mut chain: Option<SendChain>,
) -> std::result::Result<Built, LowerError> {
    let max_channels = executor.max_channels();
    // Threadblocks built before packing (`super::pack`) brings a gpu down
    // to the profile's limit: the loader's own array bound.
    let max_tbs = MAX_TBS_BUILT;
    // Channel groups keep at most 32 peer tbs per channel per direction
    // (`super::fit::ChannelGroups`).
    let cg = fit::ChannelGroups::new(
        n,
        ops.iter()
            .filter(|o| o.src != o.dst)
            .map(|o| (o.src as usize, o.dst as usize)),
    );
    let groups = cg.groups;
    // Gpus with more single-direction tbs than the profile loads: their
    // tbs are packed two to one (`super::pack`) only where both are
    // short, so their steps' waits are reduced (step 4) even when they fit.
    let packed: Vec<bool> = {
        let mut conns: Vec<(u32, u32)> = ops
            .iter()
            .filter(|o| o.src != o.dst)
            .map(|o| (o.src, o.dst))
            .collect();
        conns.sort_unstable();
        conns.dedup();
        let mut tbs = vec![0usize; n];
        for &(s, d) in &conns {
            tbs[s as usize] += 1;
            tbs[d as usize] += 1;
        }
        tbs.iter()
            .map(|&t| t + 1 > executor.max_tbs_per_gpu())
            .collect()
    };
    let mut tbs: Vec<Vec<TbDraft>> = (0..n).map(|_| Vec::new()).collect();
    let mut tb_index: Vec<HashMap<TbKey, u32>> = vec![HashMap::new(); n];
    // Lanes a connection may have in all: half the channels its group can
    // reach, the rest left for tbs that pass 64 steps.
    let max_per_conn = (max_channels / groups.max(1) / 2).clamp(1, MAX_LANES);
    let lanes = assign_lanes(ops, n, timeline, executor.tb_budget(), split, max_per_conn);
    // A paced transfer's tail handed to the head that follows it on its
    // lane (`super::handoff`): the operations change, the lanes stay.
    let handed = hand.and_then(|(parts, window)| {
        super::handoff::hand_off(ops, parts, window, &lanes.of_op, timeline)
    });
    let (ops, lanes) = match &handed {
        Some((o, of_op, _)) => (
            &o[..],
            Lanes {
                of_op: of_op.clone(),
                ..lanes
            },
        ),
        None => (ops, lanes),
    };
    let handoffs = handed.as_ref().map_or(0, |h| h.2);
    // Elements each gpu's file will hold at least (`elements_floor`),
    // raised by every nop written: a chunk whose file cannot fit the
    // parser is refused as soon as that shows, not after every wait is
    // walked (64 x 8 `fast`: its first lowering fails there).
    let graph = OpGraph::new(ops);
    let mut floor = elements_floor(ops, n, executor.max_tbs_per_gpu());
    if let Some(why) = over_elements(&floor) {
        return Err(LowerError::Limit(why));
    }
    // Channel of each (src, dst, lane); lane `l` starts at group `l`.
    let mut chan_of: HashMap<(u32, u32, u32), u32> = HashMap::new();
    let mut local_k = vec![0u32; n];
    // Where each operation's step sits on each gpu it touches, its sending
    // gpu first: (tb, pos).
    let mut at: Vec<[(u32, u32); 2]> = vec![[(u32::MAX, 0); 2]; ops.len()];
    let side_of = |x: u32, g: u32| usize::from(ops[x as usize].src != g);
    let mut anc = Walks::new(ops.len());
    // The walks through other gpus' operations are memoised per (operation,
    // gpu); past this many the rest are not followed (their waits dropped
    // and counted), so memory stays proportional to the plan.
    let walk_cap = WALKS_PER_OP * ops.len() + (1 << 16);
    let mut dropped = 0usize;
    let mut unheld: std::collections::HashSet<(u32, u32)> = std::collections::HashSet::new();
    let mut channels = 1u32;
    // The last operation whose deps were walked, its lists and drops.
    let mut last_need: Option<(u32, Vec<Vec<u32>>, usize)> = None;
    for (o, op) in ops.iter().enumerate() {
        let o = o as u32;
        let gpus: Vec<u32> = if op.src == op.dst {
            vec![op.src]
        } else {
            vec![op.src, op.dst]
        };
        // A chained plan's receives wait for nothing (`SendChain`): only
        // the sending gpu's operations are looked for.
        let walked = if chain.is_some() {
            &gpus[..1]
        } else {
            &gpus[..]
        };
        // Operations on each side's gpu this one must follow. The
        // operations of one transfer (its runs, its pacing cuts) mostly
        // share their deps: the walks would find the same lists again
        // (the memo only grows, so even capped walks repeat), and the
        // waits they add, dropped or unheld, are the same.
        let same = last_need.as_ref().filter(|(p, _, _)| {
            let q = &ops[*p as usize];
            (q.src, q.dst, q.from) == (op.src, op.dst, op.from)
                && q.deps == op.deps
                && q.recv_deps == op.recv_deps
        });
        let need = if let Some((_, need, d)) = same {
            dropped += d;
            need.clone()
        } else {
            let dropped_before = dropped;
            let mut need = walk_deps(
                ops,
                &graph,
                op,
                walked,
                &mut anc,
                walk_cap,
                &mut dropped,
                &mut unheld,
            );
            need.resize(gpus.len(), Vec::new());
            last_need = Some((o, need.clone(), dropped - dropped_before));
            need
        };
        // The send this one follows on its gpu (`SendChain`).
        let after = match chain.as_mut() {
            Some(c) if op.src != op.dst => c.follow(op.src, op.from, o),
            _ => None,
        };
        let lane = lanes.of_op[o as usize];
        loop {
            let keys: Vec<TbKey> = if op.src == op.dst {
                vec![TbKey::Local {
                    k: local_k[op.src as usize],
                }]
            } else {
                let c = *chan_of
                    .entry((op.src, op.dst, lane))
                    .or_insert_with(|| cg.of(op.src as usize, op.dst as usize) + groups * lane);
                if c >= max_channels {
                    return Err(LowerError::Limit(format!(
                        "operations from rank {} to rank {} need more than {max_channels} channels of {MAX_STEPS_PER_TB} steps",
                        op.src, op.dst
                    )));
                }
                vec![
                    TbKey::Send {
                        peer: op.dst,
                        chan: c,
                    },
                    TbKey::Recv {
                        peer: op.src,
                        chan: c,
                    },
                ]
            };
            // Waits per side: (tb, pos) targets, own tb and implied ones removed.
            let mut fits = true;
            let mut plans = Vec::new();
            for (side, (&g, &key)) in gpus.iter().zip(&keys).enumerate() {
                let gi = g as usize;
                let own = tb_index[gi].get(&key).copied();
                let mut latest: BTreeMap<u32, u32> = BTreeMap::new();
                for &x in &need[side] {
                    // `x` touches `g` and precedes this operation: placed.
                    let (tb, pos) = at[x as usize][side_of(x, g)];
                    if Some(tb) == own {
                        continue;
                    }
                    let e = latest.entry(tb).or_insert(pos);
                    *e = (*e).max(pos);
                }
                if let Some(t) = own {
                    let w = &tbs[gi][t as usize].waited;
                    latest.retain(|tb, pos| w.get(tb).is_none_or(|&p| p < *pos));
                }
                if let (0, Some(y)) = (side, after) {
                    // The previous transfer's send: its waits (and theirs)
                    // hold this one's older receives.
                    let (tb, pos) = at[y as usize][0];
                    if Some(tb) != own {
                        let e = latest.entry(tb).or_insert(pos);
                        *e = (*e).max(pos);
                    }
                }
                if chain.is_some() && side == 0 {
                    drop_implied_waits(&tbs[gi], own, &mut latest);
                }
                let len = own.map_or(0, |t| tbs[gi][t as usize].steps.len());
                // Many waits, or more than the tb holds: first those the
                // gpu's own order already implies go (each costs a step,
                // and long tbs cannot be packed), then (a fresh tb that
                // still cannot hold them) the oldest, dropped and counted.
                let mut lost = 0;
                if (packed[gi] && latest.len() > MAX_WAITS_UNREDUCED)
                    || len + latest.len().max(1) > MAX_STEPS_PER_TB
                {
                    drop_implied_waits(&tbs[gi], own, &mut latest);
                    if own.is_none() {
                        lost = drop_oldest_waits(&tbs[gi], &mut latest, MAX_STEPS_PER_TB);
                    }
                }
                if len + latest.len().max(1) > MAX_STEPS_PER_TB {
                    fits = false;
                }
                plans.push((gi, key, latest, lost));
            }
            if !fits {
                if op.src == op.dst {
                    local_k[op.src as usize] += 1;
                } else {
                    *chan_of.get_mut(&(op.src, op.dst, lane)).expect("set above") +=
                        groups * lanes.per_conn[&(op.src, op.dst)];
                }
                continue;
            }
            for (side, (gi, key, latest, lost)) in plans.into_iter().enumerate() {
                dropped += lost;
                let t = match tb_index[gi].get(&key) {
                    Some(&t) => t,
                    None => {
                        let t = tbs[gi].len() as u32;
                        if t as usize >= max_tbs {
                            return Err(LowerError::Limit(format!(
                                "rank {gi} needs more than {max_tbs} threadblocks ({executor})"
                            )));
                        }
                        tbs[gi].push(TbDraft {
                            key,
                            steps: Vec::new(),
                            ops: Vec::new(),
                            waited: HashMap::new(),
                        });
                        tb_index[gi].insert(key, t);
                        t
                    }
                };
                if let TbKey::Send { chan, .. } = key {
                    channels = channels.max(chan + 1);
                }
                let kind = match (op.src == op.dst, side) {
                    (true, _) => StepKind::Copy,
                    (false, 0) => StepKind::Send,
                    (false, _) => StepKind::Recv,
                };
                let waits: Vec<(u32, u32)> = latest.into_iter().collect();
                let draft = &mut tbs[gi][t as usize];
                if waits.len() > 1 {
                    floor[gi] += waits.len() - 1;
                    if floor[gi] > MAX_NODES {
                        return Err(LowerError::Limit(over_elements_message(gi, floor[gi])));
                    }
                }
                for (idx, &(tb, pos)) in waits.iter().enumerate() {
                    draft.waited.insert(tb, pos);
                    let is_last = idx + 1 == waits.len();
                    let s = draft.steps.len() as i64;
                    draft.steps.push(Step {
                        s,
                        kind: if is_last { kind } else { StepKind::Nop },
                        srcbuf: if is_last { op.src_buf } else { BufRef::Input },
                        srcoff: if is_last { op.src_off as i64 } else { -1 },
                        dstbuf: if is_last { op.dst_buf } else { BufRef::Output },
                        dstoff: if is_last { op.dst_off as i64 } else { -1 },
                        cnt: if is_last { op.cnt as i64 } else { 0 },
                        depid: tb as i64,
                        deps: pos as i64,
                        hasdep: false,
                        line: 0,
                    });
                }
                if waits.is_empty() {
                    let s = draft.steps.len() as i64;
                    draft.steps.push(Step {
                        s,
                        kind,
                        srcbuf: op.src_buf,
                        srcoff: op.src_off as i64,
                        dstbuf: op.dst_buf,
                        dstoff: op.dst_off as i64,
                        cnt: op.cnt as i64,
                        depid: -1,
                        deps: -1,
                        hasdep: false,
                        line: 0,
                    });
                }
                draft.ops.resize(draft.steps.len(), o);
                let pos = draft.steps.len() as u32 - 1;
                at[o as usize][side] = (t, pos);
                for (tb, p) in waits {
                    tbs[gi][tb as usize].steps[p as usize].hasdep = true;
                }
            }
            break;
        }
    }
    // Number tbs as msccl-tools does, by (send, recv, chan), local ones first.
    let mut out = Vec::with_capacity(n);
    let mut op_of = Vec::with_capacity(n);
    for (g, drafts) in tbs.into_iter().enumerate() {
        let mut order: Vec<usize> = (0..drafts.len()).collect();
        let sort_key = |k: &TbKey| -> (i64, i64, u32) {
            match *k {
                TbKey::Local { k } => (-1, -1, k),
                TbKey::Send { peer, chan } => (peer as i64, -1, chan),
                TbKey::Recv { peer, chan } => (-1, peer as i64, chan),
            }
        };
        order.sort_by_key(|&i| sort_key(&drafts[i].key));
        let mut new_id = vec![0i64; drafts.len()];
        for (new, &old) in order.iter().enumerate() {
            new_id[old] = new as i64;
        }
        let mut tbv: Vec<Tb> = Vec::with_capacity(drafts.len());
        let mut opv: Vec<Vec<u32>> = Vec::with_capacity(drafts.len());
        let mut drafts: Vec<Option<TbDraft>> = drafts.into_iter().map(Some).collect();
        for &old in &order {
            let d = drafts[old].take().expect("each tb once");
            let (send, recv, chan) = match d.key {
                TbKey::Send { peer, chan } => (peer as i64, -1, chan as i64),
                TbKey::Recv { peer, chan } => (-1, peer as i64, chan as i64),
                TbKey::Local { .. } => (-1, -1, 0),
            };
            let steps = d
                .steps
                .into_iter()
                .map(|mut s| {
                    if s.depid >= 0 {
                        s.depid = new_id[s.depid as usize];
                    }
                    s
                })
                .collect();
            opv.push(d.ops);
            tbv.push(Tb {
                id: new_id[old],
                send,
                recv,
                chan,
                steps,
                line: 0,
            });
        }
        let _ = g;
        out.push(tbv);
        op_of.push(opv);
    }
    Ok(Built {
        tbs: out,
        op_of,
        channels,
        dropped,
        unheld: unheld.len(),
        lanes_short: lanes.short,
        tbs_wanted: lanes.tbs_wanted,
        handoffs,
    })
}

/// Removes from `latest` (the waits of a step about to go on tb `own` of
/// one gpu, or on a new tb: awaited tb -> position) every wait the gpu's
/// own order already holds: the tb's earlier steps, the other awaited
/// steps' predecessors in their tbs, and, transitively, whatever those
/// steps waited for. The executor holds each removed wait through the
/// ones kept; nothing across gpus is assumed. One walk over the gpu's
/// steps, at most once each.
fn drop_implied_waits(drafts: &[TbDraft], own: Option<u32>, latest: &mut BTreeMap<u32, u32>) {
    // Per tb, the last step known to be done before the new step.
    let mut done: Vec<i64> = vec![-1; drafts.len()];
    let mut stack: Vec<(u32, u32)> = Vec::new();
    let seed = |tb: u32, pos: u32, stack: &mut Vec<(u32, u32)>| {
        let st = &drafts[tb as usize].steps[pos as usize];
        if pos > 0 {
            stack.push((tb, pos - 1));
        }
        if st.depid >= 0 {
            stack.push((st.depid as u32, st.deps as u32));
        }
    };
    if let Some(t) = own {
        let len = drafts[t as usize].steps.len() as u32;
        if len > 0 {
            stack.push((t, len - 1));
        }
    }
    for (&tb, &pos) in latest.iter() {
        seed(tb, pos, &mut stack);
    }
    // A walk cut short implies less: sound, only fewer waits go.
    let mut budget = DFS_STEPS;
    while let Some((t, p)) = stack.pop() {
        let from = done[t as usize] + 1;
        if i64::from(p) < from {
            continue;
        }
        let span = (i64::from(p) + 1 - from) as usize;
        if span > budget {
            break;
        }
        budget -= span;
        for st in &drafts[t as usize].steps[from as usize..=p as usize] {
            if st.depid >= 0 {
                stack.push((st.depid as u32, st.deps as u32));
            }
        }
        done[t as usize] = i64::from(p);
    }
    latest.retain(|&tb, &mut pos| done[tb as usize] < i64::from(pos));
}

/// A floor on the elements each gpu's file would hold (`1 + n + tbs +
/// steps`, what the executor's parser counts against [`MAX_NODES`]), from
/// the operations alone, before pacing cuts and threadblocks: every
/// operation is a step on each gpu it touches (waits only add nops before
/// it), and the passes after this one only add operations between the same
/// gpus (`cut_for_pacing` cuts one into several; `super::handoff` merges a
/// tail it cut back into its body); a connection direction's steps (and a
/// gpu's local copies) fill tbs of at most [`MAX_STEPS_PER_TB`] steps;
/// packing (`super::pack`) leaves `limit` tbs or more where a gpu has more.
/// A chunk whose floor is over the limit fails it anyway: the lowering
/// refuses it before the costly passes.
fn elements_floor(ops: &[ChunkOp], n: usize, limit: usize) -> Vec<usize> {
    let mut steps = vec![0usize; n];
    // (gpu, peer, side: 0 send, 1 receive, 2 local copy) -> steps.
    let mut conn: HashMap<(u32, u32, u8), usize> = HashMap::new();
    for o in ops {
        if o.src == o.dst {
            steps[o.src as usize] += 1;
            *conn.entry((o.src, o.src, 2)).or_default() += 1;
        } else {
            steps[o.src as usize] += 1;
            steps[o.dst as usize] += 1;
            *conn.entry((o.src, o.dst, 0)).or_default() += 1;
            *conn.entry((o.dst, o.src, 1)).or_default() += 1;
        }
    }
    let mut tbs = vec![0usize; n];
    for (&(g, _, _), &c) in &conn {
        tbs[g as usize] += c.div_ceil(MAX_STEPS_PER_TB);
    }
    (0..n)
        .map(|g| 1 + n + tbs[g].min(limit) + steps[g])
        .collect()
}

/// Elements before pacing cuts ([`elements_floor`]) above which a gpu's
/// transfers are not cut ([`uncut_gpus`]): 7/8 of [`MAX_NODES`], 512 left
/// for the cuts' steps and the nops of the waits. At 64 x 8 `fast`
/// (dgx-h100, 512 ranks) a hot receiver's gpu had 3760 (Zipf 1.2) and
/// 3951 (MoE) elements before the cuts, about 1190 more after them and
/// 320-390 nops; every other gpu fewer than 3400 (log-normal: at most
/// 2958). Cut anyway, the lowering doubled every gpu's chunk four times,
/// until that gpu's transfers were too short to cut: Zipf's file at 16
/// times the base chunk, 146x buffers, priced by the executor's rules at
/// 13.6 times its plan. With that gpu written whole it fits at twice the
/// base chunk, 110x, 2.0 times its plan, in two lowerings instead of five
/// (docs/benchmarks.md, "A hot gpu's transfers written whole").
const UNCUT_ABOVE: usize = MAX_NODES / 8 * 7;

/// Per gpu, whether its file's elements before any pacing cut
/// ([`elements_floor`] of `ops`) are over [`UNCUT_ABOVE`]; empty where
/// none is. Files of up to 64 ranks hold at most a few hundred.
fn uncut_gpus(ops: &[ChunkOp], n: usize, limit: usize) -> Vec<bool> {
    let floor = elements_floor(ops, n, limit);
    if floor.iter().all(|&e| e <= UNCUT_ABOVE) {
        return Vec::new();
    }
    floor.iter().map(|&e| e > UNCUT_ABOVE).collect()
}

/// The first gpu whose floor ([`elements_floor`]) is over [`MAX_NODES`],
/// as the limit the lowering reports.
fn over_elements(floor: &[usize]) -> Option<String> {
    floor
        .iter()
        .enumerate()
        .find(|&(_, &e)| e > MAX_NODES)
        .map(|(g, &e)| over_elements_message(g, e))
}

/// The limit gpu `g` misses with a floor of `e` elements.
fn over_elements_message(g: usize, e: usize) -> String {
    format!("gpu {g} would hold at least {e} elements, the executor parses at most {MAX_NODES}")
}

/// Steps one `drop_implied_waits` walk visits at most (a 16 x 8
/// `pairwise` gpu has about 1300).
const DFS_STEPS: usize = 1 << 14;

/// Keeps the `max` waits of `latest` on the latest operations (in the
/// global order) and drops the rest, returning how many were dropped:
/// what a fresh tb of `max` steps cannot hold even after
/// `drop_implied_waits` (none of `pairwise`'s 65-tb barriers at 16 x 8
/// need it). The step then starts once its latest predecessors on this
/// gpu are done.
fn drop_oldest_waits(drafts: &[TbDraft], latest: &mut BTreeMap<u32, u32>, max: usize) -> usize {
    if latest.len() <= max {
        return 0;
    }
    let mut by_op: Vec<(u32, u32)> = latest
        .iter()
        .map(|(&tb, &pos)| (drafts[tb as usize].ops[pos as usize], tb))
        .collect();
    by_op.sort_unstable();
    let extra = latest.len() - max;
    for &(_, tb) in &by_op[..extra] {
        latest.remove(&tb);
    }
    extra
}

/// The operations on each of `gpus` (an operation's sending gpu first)
/// that `op` must follow, sorted: its deps walked back to the operations
/// that touch each gpu. A dep found on neither counts as dropped; a send's
/// wait met on its own gpu only by sends goes into `unheld`.
#[allow(clippy::too_many_arguments)]
fn walk_deps(
    ops: &[ChunkOp],
    graph: &OpGraph,
    op: &ChunkOp,
    gpus: &[u32],
    anc: &mut Walks,
    walk_cap: usize,
    dropped: &mut usize,
    unheld: &mut std::collections::HashSet<(u32, u32)>,
) -> Vec<Vec<u32>> {
    let mut need: Vec<Vec<u32>> = vec![Vec::new(); gpus.len()];
    for &x in &op.deps {
        let mut found = false;
        // What `x` adds on the sending gpu (`gpus[0]` is `op.src`).
        let mut on_src = 0..0;
        for (side, &g) in gpus.iter().enumerate() {
            let before = need[side].len();
            ancestors_on(graph, x, g, anc, walk_cap, &mut need[side]);
            found |= need[side].len() > before;
            if side == 0 {
                on_src = before..need[0].len();
            }
        }
        if !found {
            *dropped += 1;
            continue;
        }
        // The executor holds a send back only until the data it waits
        // for has arrived on its own gpu: a wait met by a receive or a
        // copy there. A wait only on a send of its gpu (a send is done
        // when staged) or only on the receiving side does not hold it.
        let xo = &ops[x as usize];
        if op.src != op.dst
            && xo.from != op.from
            && !need[0][on_src]
                .iter()
                .any(|&y| ops[y as usize].dst == op.src)
        {
            unheld.insert((xo.from, op.from));
        }
    }
    if let Some(v) = need.get_mut(1) {
        for &x in &op.recv_deps {
            ancestors_on(graph, x, op.dst, anc, walk_cap, v);
        }
    }
    for v in &mut need {
        v.sort_unstable();
        v.dedup();
    }
    need
}

/// A step with more waits than this, on a gpu whose tbs will be packed,
/// has those its gpu's own order implies removed (`drop_implied_waits`;
/// on other gpus only when they overflow the tb). `pairwise`'s stage barriers
/// reach a gpu through every other gpu's earlier rounds: at 16 x 8 its
/// operations wait for up to 65 tbs, all but a few implied by the waits
/// of the gpu's previous round, and tbs that long cannot be packed two
/// to a threadblock (143 tbs on rank 0 against `msccl`'s 128).
const MAX_WAITS_UNREDUCED: usize = 8;

/// Threadblocks per gpu the lowering may build before packing: the
/// loader's array of them (`MSCCL_MAX_NUM_THREAD_BLOCKS`, 32 per channel
/// times NCCL-MSCCL's 32 channels, `msccl_struct.h`).
const MAX_TBS_BUILT: usize = 1024;

/// Lanes (channels) one connection's operations are spread over at most.
const MAX_LANES: u32 = 32;
/// When the tb budget cannot give every transfer the plan runs at once a
/// lane of its own, a transfer may follow one on a lane that, in the plan,
/// is still running for up to this fraction of its own duration.
const SHARE_SLACK: f64 = 0.2;

/// Lanes of every operation, and how many lanes each connection has.
struct Lanes {
    of_op: Vec<u32>,
    per_conn: HashMap<(u32, u32), u32>,
    /// Lanes the plan's concurrency wants beyond those the budget gave.
    short: usize,
    /// Largest number of tbs a gpu needs to run at once every transfer the
    /// plan runs at once.
    tbs_wanted: usize,
}

/// Plans with more transfers than this get their lanes without the
/// ancestor test (its bit sets take transfers² / 8 bytes).
const MAX_ANCESTOR_TRANSFERS: usize = 16_384;

/// Puts every operation on a lane (a channel of its connection, each lane
/// one send tb and one receive tb, run one step after another). The runs of
/// one plan transfer go on one lane back to back, so the executor streams
/// them as the one flow the transfer is. A transfer goes on a lane whose
/// last transfer is one of its ancestors in the plan (then the lane's order
/// adds no wait the plan does not have); failing that on a new lane, so
/// transfers the plan runs side by side move side by side. Lanes are
/// limited by the threadblock budget: every connection has one, and extra
/// ones go, one at a time, to the connection that wants the most more than
/// it has, while both its gpus stay within `budget` tbs
/// ([`Executor::tb_budget`]). A transfer
/// that finds no free lane takes the one with the fewest bytes.
fn assign_lanes(
    ops: &[ChunkOp],
    n: usize,
    timeline: &[TransferTime],
    budget: usize,
    groups: &[u32],
    max_per_conn: u32,
) -> Lanes {
    // Source transfers in the order of their remote operations (then those
    // with local copies only), with the ops of each: the copies that gather
    // a send's runs come first in `ops` (`super::gather`) but do not move
    // their transfer ahead of the others here.
    let mut order: Vec<u32> = Vec::new();
    let mut dense: HashMap<u32, usize> = HashMap::new();
    let remote_first = ops
        .iter()
        .filter(|o| o.src != o.dst)
        .chain(ops.iter().filter(|o| o.src == o.dst));
    for op in remote_first {
        if let Entry::Vacant(e) = dense.entry(op.from) {
            e.insert(order.len());
            order.push(op.from);
        }
    }
    let nt = order.len();
    let words = nt.div_ceil(64);
    let exact = nt <= MAX_ANCESTOR_TRANSFERS;
    // Ancestors of each transfer (dense indices), from the ops' deps.
    let mut anc: Vec<Vec<u64>> = if exact {
        vec![vec![0u64; words]; nt]
    } else {
        Vec::new()
    };
    if exact {
        let mut seen = vec![false; nt];
        for op in ops {
            let t = dense[&op.from];
            if seen[t] {
                continue;
            }
            seen[t] = true;
            let mut a = vec![0u64; words];
            for &d in &op.deps {
                let x = dense[&ops[d as usize].from];
                if x == t {
                    continue;
                }
                a[x / 64] |= 1 << (x % 64);
                for (w, v) in a.iter_mut().zip(&anc[x]) {
                    *w |= v;
                }
            }
            anc[t] = a;
        }
    }
    let time = |t: usize| {
        timeline
            .get(order[t] as usize)
            .map_or((0.0, 0.0), |x| (x.start_us, x.end_us))
    };
    let mut conn_of = vec![(0u32, 0u32); nt];
    for op in ops {
        conn_of[dense[&op.from]] = (op.src, op.dst);
    }
    let remote: Vec<usize> = (0..nt).filter(|&t| conn_of[t].0 != conn_of[t].1).collect();
    let mut base = vec![0usize; n];
    let mut locals = vec![0usize; n];
    for op in ops.iter().filter(|o| o.src == o.dst) {
        locals[op.src as usize] += 1;
    }
    for (g, &l) in locals.iter().enumerate() {
        base[g] += l.div_ceil(MAX_STEPS_PER_TB);
    }
    // Lanes with `of_op` per transfer (dense index).
    let attempt = |slack: f64| -> Lanes {
        // `t` may follow `x` on a lane: the plan orders them, or runs `x`
        // to its end before `t` starts (or has done all but `slack` of
        // `t`'s duration by then).
        let free = |x: usize, t: usize| {
            let ((_, xe), (ts, te)) = (time(x), time(t));
            (exact && anc[t][x / 64] >> (x % 64) & 1 == 1) || xe <= ts + slack * (te - ts)
        };
        // Lanes each connection wants: the greedy cover in start order.
        let mut want: HashMap<(u32, u32), Vec<usize>> = HashMap::new();
        for &t in &remote {
            let lanes = want.entry(conn_of[t]).or_default();
            match lanes.iter_mut().find(|last| free(**last, t)) {
                Some(last) => *last = t,
                None => lanes.push(t),
            }
        }
        // Share the tb budget, one lane at a time, to the connection with
        // the most wanted lanes per lane it has.
        let mut tbs = base.clone();
        let mut per_conn: HashMap<(u32, u32), u32> = HashMap::new();
        let mut heap: BinaryHeap<(u64, Reverse<(u32, u32)>)> = BinaryHeap::new();
        for (&(s, d), w) in &want {
            per_conn.insert((s, d), 1);
            tbs[s as usize] += 1;
            tbs[d as usize] += 1;
            heap.push((w.len() as u64 * 1000, Reverse((s, d))));
        }
        while let Some((_, Reverse((s, d)))) = heap.pop() {
            let (w, l) = (want[&(s, d)].len() as u32, per_conn[&(s, d)]);
            if l >= MAX_LANES.min(w) || tbs[s as usize] >= budget || tbs[d as usize] >= budget {
                continue;
            }
            per_conn.insert((s, d), l + 1);
            tbs[s as usize] += 1;
            tbs[d as usize] += 1;
            heap.push((w as u64 * 1000 / (l as u64 + 1), Reverse((s, d))));
        }
        let short = want
            .iter()
            .map(|(c, w)| w.len().saturating_sub(per_conn[c] as usize))
            .sum();
        let mut wanted = base.clone();
        for (&(s, d), w) in &want {
            wanted[s as usize] += w.len();
            wanted[d as usize] += w.len();
        }
        let wanted = wanted.into_iter().max().unwrap_or(0);
        // Assign, within the lanes each connection got.
        let mut lane_of = vec![0u32; nt];
        let mut open: HashMap<(u32, u32), Vec<usize>> = HashMap::new();
        for &t in &remote {
            let c = conn_of[t];
            let lanes = open.entry(c).or_default();
            let l = match lanes.iter().position(|&last| free(last, t)) {
                Some(l) => l,
                None if lanes.len() < per_conn[&c] as usize => {
                    lanes.push(t);
                    lanes.len() - 1
                }
                // The lane whose last transfer ends first in the plan.
                None => (0..lanes.len())
                    .min_by(|&a, &b| time(lanes[a]).1.total_cmp(&time(lanes[b]).1))
                    .expect("a connection has a lane"),
            };
            lanes[l] = t;
            lane_of[t] = l as u32;
        }
        Lanes {
            of_op: lane_of,
            per_conn,
            short,
            tbs_wanted: wanted,
        }
    };
    let exact_lanes = attempt(0.0);
    let mut lanes = if exact_lanes.short > 0 {
        // Not every transfer the plan runs at once gets a lane: let those
        // that overlap a little share one, to leave lanes for the rest.
        Lanes {
            short: exact_lanes.short,
            tbs_wanted: exact_lanes.tbs_wanted,
            ..attempt(SHARE_SLACK)
        }
    } else {
        exact_lanes
    };
    lanes.of_op = ops.iter().map(|op| lanes.of_op[dense[&op.from]]).collect();
    // What the budget has left goes to long streams (`super::spread`).
    let mut used = base;
    for (&(s, d), &l) in &lanes.per_conn {
        used[s as usize] += l as usize;
        used[d as usize] += l as usize;
    }
    let conn: Vec<(u32, u32)> = ops.iter().map(|o| (o.src, o.dst)).collect();
    let from: Vec<u32> = ops.iter().map(|o| o.from).collect();
    spread_lanes(
        &mut lanes.of_op,
        &mut lanes.per_conn,
        &conn,
        &from,
        groups,
        used,
        budget,
        max_per_conn,
    );
    lanes
}

/// Memoised walks per operation of the plan (see `build_tbs`).
const WALKS_PER_OP: usize = 32;

/// A cheap hash for the walk memo's `(operation, gpu)` keys (a splitmix64
/// finish): the standard SipHash took a fifth of a large lowering.
#[derive(Default, Clone, Copy)]
struct FastHasher(u64);

impl std::hash::Hasher for FastHasher {
    fn finish(&self) -> u64 {
        // A multiply only moves low bits up; the table indexes by low bits.
        let z = (self.0 ^ (self.0 >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z ^ (z >> 31)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(5) ^ x).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

type FastHash = std::hash::BuildHasherDefault<FastHasher>;

/// Memoised [`ancestors_on`] walks: per `(operation, gpu)` key, its sorted
/// list. A large lowering holds millions of them (16 x 8 `fast`: 2.6
/// million, the walks a fifth of the compile, bound by the table's cache
/// misses), most empty: those are one bit of a per-gpu set over the
/// operations, the others a range of one shared array (a `Vec` each cost
/// an allocation and a bucket twice the size).
struct Walks {
    /// Key -> (start in `lists`, length), lists not empty.
    index: HashMap<u64, (u32, u32), FastHash>,
    lists: Vec<u32>,
    /// Per gpu, a bit per operation: its walk is held and empty.
    empty: Vec<Vec<u64>>,
    /// Empty walks held.
    empties: usize,
    /// Operations of the plan.
    nops: usize,
}

impl Walks {
    fn new(nops: usize) -> Self {
        Walks {
            index: HashMap::default(),
            lists: Vec::new(),
            empty: Vec::new(),
            empties: 0,
            nops,
        }
    }

    /// Walks held.
    fn len(&self) -> usize {
        self.index.len() + self.empties
    }

    fn is_empty_walk(&self, x: u32, g: u32) -> bool {
        self.empty
            .get(g as usize)
            .and_then(|b| b.get(x as usize / 64))
            .is_some_and(|w| w >> (x % 64) & 1 == 1)
    }

    fn hold_empty(&mut self, x: u32, g: u32) {
        let g = g as usize;
        if self.empty.len() <= g {
            self.empty.resize_with(g + 1, Vec::new);
        }
        let b = &mut self.empty[g];
        if b.is_empty() {
            *b = vec![0; self.nops.div_ceil(64)];
        }
        b[x as usize / 64] |= 1 << (x % 64);
        self.empties += 1;
    }
}

/// What the dependency walks read of the operations, packed: per
/// operation its gpus and its deps' range in one array (16 bytes an
/// operation, where a `ChunkOp` is about 90 and its deps a separate
/// allocation), so a walk through scattered operations misses the cache
/// less. The same walks, in the same order.
pub(super) struct OpGraph {
    /// (src, dst, first dep, end of deps) per operation.
    node: Vec<[u32; 4]>,
    deps: Vec<u32>,
}

impl OpGraph {
    pub(super) fn new(ops: &[ChunkOp]) -> Self {
        let mut deps = Vec::with_capacity(ops.iter().map(|o| o.deps.len()).sum());
        let node = ops
            .iter()
            .map(|o| {
                let a = deps.len() as u32;
                deps.extend_from_slice(&o.deps);
                [o.src, o.dst, a, deps.len() as u32]
            })
            .collect();
        OpGraph { node, deps }
    }
}

/// The operations on gpu `g` among `x` and its ancestors, stopping at the
/// first that touches `g` on every path (its own waits cover the rest).
/// Once `memo` holds `cap` walks, new ones are not started. Appends to
/// `out` (which the nested walks share: each sorts its own tail).
fn ancestors_on(ops: &OpGraph, x: u32, g: u32, memo: &mut Walks, cap: usize, out: &mut Vec<u32>) {
    let [src, dst, a, b] = ops.node[x as usize];
    if src == g || dst == g {
        out.push(x);
        return;
    }
    if memo.is_empty_walk(x, g) {
        return;
    }
    let key = u64::from(x) << 32 | u64::from(g);
    if let Some(&(at, len)) = memo.index.get(&key) {
        let at = at as usize;
        out.extend_from_slice(&memo.lists[at..at + len as usize]);
        return;
    }
    if memo.len() >= cap {
        return;
    }
    let start = out.len();
    for i in a..b {
        ancestors_on(ops, ops.deps[i as usize], g, memo, cap, out);
    }
    let v = &mut out[start..];
    v.sort_unstable();
    // Dedup the tail in place.
    let mut w = 0;
    for r in 0..v.len() {
        if w == 0 || v[r] != v[w - 1] {
            v[w] = v[r];
            w += 1;
        }
    }
    out.truncate(start + w);
    let v = &out[start..];
    if v.is_empty() {
        memo.hold_empty(x, g);
        return;
    }
    // Offsets past `u32` (16 GiB of lists) are not memoised: the walk is
    // then repeated, with the same result.
    if u32::try_from(memo.lists.len() + v.len()).is_ok() {
        let (at, len) = (memo.lists.len() as u32, v.len() as u32);
        memo.lists.extend_from_slice(v);
        memo.index.insert(key, (at, len));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sched::direct;
    use crate::verify::verify_on;

    /// A draft tb whose steps wait as `waits` says (`None`: no wait) and
    /// belong to operations `ops`.
    fn draft(waits: &[Option<(u32, u32)>], ops: &[u32]) -> TbDraft {
        let steps = waits
            .iter()
            .enumerate()
            .map(|(i, w)| Step {
                s: i as i64,
                kind: StepKind::Send,
                srcbuf: BufRef::Input,
                srcoff: 0,
                dstbuf: BufRef::Output,
                dstoff: 0,
                cnt: 1,
                depid: w.map_or(-1, |w| i64::from(w.0)),
                deps: w.map_or(-1, |w| i64::from(w.1)),
                hasdep: false,
                line: 0,
            })
            .collect();
        TbDraft {
            key: TbKey::Local { k: 0 },
            steps,
            ops: ops.to_vec(),
            waited: HashMap::new(),
        }
    }

    #[test]
    fn waits_the_gpus_own_order_holds_are_dropped() {
        // tb 1's step 1 waits for tb 0's step 0; tb 2's step 0 for tb 1's
        // step 0 only. A step waiting for (0, 0), (1, 1) and (2, 0) needs
        // only the last two: (1, 1) holds (0, 0).
        let drafts = vec![
            draft(&[None, None], &[0, 3]),
            draft(&[None, Some((0, 0))], &[1, 2]),
            draft(&[Some((1, 0))], &[4]),
        ];
        let mut latest: BTreeMap<u32, u32> = [(0, 0), (1, 1), (2, 0)].into();
        drop_implied_waits(&drafts, None, &mut latest);
        assert_eq!(latest, [(1, 1), (2, 0)].into());
        // tb 0's step 1 is not held by anything: it stays.
        let mut latest: BTreeMap<u32, u32> = [(0, 1), (1, 1)].into();
        drop_implied_waits(&drafts, None, &mut latest);
        assert_eq!(latest, [(0, 1), (1, 1)].into());
        // On tb 2 itself, after its step 0 (which waited for (1, 0)):
        // a wait for (1, 0) is held by program order and that wait.
        let mut latest: BTreeMap<u32, u32> = [(1, 0), (0, 1)].into();
        drop_implied_waits(&drafts, Some(2), &mut latest);
        assert_eq!(latest, [(0, 1)].into());
        // A fresh tb of 2 steps keeps the waits on the latest operations.
        let mut latest: BTreeMap<u32, u32> = [(0, 1), (1, 1), (2, 0)].into();
        assert_eq!(drop_oldest_waits(&drafts, &mut latest, 2), 1);
        assert_eq!(latest, [(0, 1), (2, 0)].into());
    }

    #[allow(clippy::too_many_arguments)]
    fn op(
        src: u32,
        src_buf: BufRef,
        src_off: u32,
        dst: u32,
        dst_off: u32,
        cnt: u32,
        deps: Vec<u32>,
        from: u32,
    ) -> ChunkOp {
        ChunkOp::test(src, src_off, dst, dst_off, cnt, from)
            .reading(src_buf)
            .after(deps, Vec::new())
    }

    /// The memo as it was, a `Vec` per walk: the reference `Walks` must
    /// match, lists and cap alike.
    fn ancestors_on_vec_memo(
        ops: &[ChunkOp],
        x: u32,
        g: u32,
        memo: &mut HashMap<u64, Vec<u32>>,
        cap: usize,
        out: &mut Vec<u32>,
    ) {
        let op = &ops[x as usize];
        if op.src == g || op.dst == g {
            out.push(x);
            return;
        }
        let key = u64::from(x) << 32 | u64::from(g);
        if let Some(v) = memo.get(&key) {
            out.extend_from_slice(v);
            return;
        }
        if memo.len() >= cap {
            return;
        }
        let mut v = Vec::new();
        for &y in &op.deps {
            ancestors_on_vec_memo(ops, y, g, memo, cap, &mut v);
        }
        v.sort_unstable();
        v.dedup();
        out.extend_from_slice(&v);
        memo.insert(key, v);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        /// Random dependency graphs over a few gpus, walked for random
        /// (operation, gpu) pairs in turn with one memo: the same lists
        /// (in the same order, appended after what `out` holds) and the
        /// same walks held as the `Vec`-per-walk memo, whatever the cap.
        #[test]
        fn walks_memo_matches_a_vec_per_walk(
            edges in proptest::collection::vec((0u32..6, 0u32..6, proptest::collection::vec(0u32..1000, 0..4)), 1..60),
            queries in proptest::collection::vec((0u32..1000, 0u32..6), 1..40),
            cap in 0usize..40,
        ) {
            let ops: Vec<ChunkOp> = edges
                .iter()
                .enumerate()
                .map(|(i, (s, d, deps))| {
                    let deps = if i == 0 {
                        Vec::new()
                    } else {
                        deps.iter().map(|&p| p % i as u32).collect()
                    };
                    op(*s, BufRef::Input, 0, *d, 0, 1, deps, i as u32)
                })
                .collect();
            let graph = OpGraph::new(&ops);
            let mut walks = Walks::new(ops.len());
            let mut vecs: HashMap<u64, Vec<u32>> = HashMap::new();
            let (mut a, mut b) = (vec![7u32], vec![7u32]);
            for &(x, g) in &queries {
                let x = x % ops.len() as u32;
                ancestors_on(&graph, x, g, &mut walks, cap, &mut a);
                ancestors_on_vec_memo(&ops, x, g, &mut vecs, cap, &mut b);
                proptest::prop_assert_eq!(&a, &b);
                proptest::prop_assert_eq!(walks.len(), vecs.len());
            }
        }
    }

    #[test]
    fn cut_pieces_wait_only_for_their_own_data() {
        let ops = vec![
            // Gpu 0's scratch 0..2 from gpu 1, 2..10 from gpu 2.
            op(1, BufRef::Input, 0, 0, 0, 2, vec![], 0),
            op(2, BufRef::Input, 0, 0, 2, 8, vec![], 1),
            // A transfer into gpu 5, which the forward's receiver waits for.
            op(4, BufRef::Input, 0, 5, 0, 5, vec![], 2),
            // The forward of gpu 0's scratch 0..10 to gpu 5: a head of two
            // one-chunk steps (Simple's window) carries the receiver's wait.
            op(0, BufRef::Scratch, 0, 5, 5, 10, vec![0, 1, 2], 3),
        ];
        let paced = cut_for_pacing(ops, 2, None, &[]);
        let fwd: Vec<&ChunkOp> = paced.ops.iter().filter(|o| o.from == 3).collect();
        assert_eq!(fwd.iter().map(|o| o.cnt).collect::<Vec<_>>(), vec![1, 1, 8]);
        // The head steps read chunks 0 and 1, written by operation 0 only:
        // they leave once those are there, not with the body's data.
        for h in &fwd[..2] {
            assert_eq!(h.deps, vec![0]);
            assert_eq!(h.recv_deps, vec![2]);
        }
        // The body reads chunks 2..10 (operation 1) and keeps the wait on
        // gpu 5's transfer; it does not wait for the head's data.
        assert_eq!(fwd[2].deps, vec![1, 2]);
        assert!(fwd[2].recv_deps.is_empty());
    }

    #[test]
    fn transfers_of_an_uncut_gpu_are_written_whole() {
        let ops = || {
            vec![
                op(1, BufRef::Input, 0, 0, 0, 2, vec![], 0),
                op(2, BufRef::Input, 0, 0, 2, 8, vec![], 1),
                op(4, BufRef::Input, 0, 5, 0, 5, vec![], 2),
                // The forward into gpu 5 whose receiver waits for
                // operation 2: cut into a head of two steps and a body.
                op(0, BufRef::Scratch, 0, 5, 5, 10, vec![0, 1, 2], 3),
            ]
        };
        let cnts = |p: &Paced| -> Vec<u32> {
            p.ops
                .iter()
                .filter(|o| o.from == 3)
                .map(|o| o.cnt)
                .collect()
        };
        let cut = cut_for_pacing(ops(), 2, None, &[]);
        assert_eq!(cnts(&cut), [1, 1, 8]);
        assert_eq!(cut.unheld, Some(0));
        // An uncut gpu elsewhere changes nothing.
        let mut uncut = vec![false; 6];
        uncut[3] = true;
        let other = cut_for_pacing(ops(), 2, None, &uncut);
        assert_eq!(cnts(&other), [1, 1, 8]);
        assert_eq!(other.unheld, Some(0));
        // Gpu 5 uncut: the forward it receives stays one operation, and
        // its receiver's wait is counted as unheld.
        uncut[5] = true;
        let whole = cut_for_pacing(ops(), 2, None, &uncut);
        assert_eq!(cnts(&whole), [10]);
        assert_eq!(whole.unheld, Some(1));
        assert_eq!(whole.steps, 0);
        assert!(whole.pinned.is_empty());
    }

    #[test]
    fn a_chunk_missed_after_cuts_is_lowered_uncut_before_it_is_doubled() {
        // Up to 64 ranks (or no cuts asked): always doubled, as before.
        let mut r = Retry::new(false);
        assert_eq!([r.missed(true), r.missed(false)], [Next::Doubled; 2]);
        assert!(!r.uncut);
        // A miss before any cut (offsets): doubled, cut.
        let mut r = Retry::new(true);
        assert_eq!(r.missed(false), Next::Doubled);
        assert!(!r.uncut);
        // After cuts: the same chunk uncut; that fits or misses.
        assert_eq!(r.missed(true), Next::Uncut);
        assert!(r.uncut);
        // Missed uncut too: doubled, cut, and never uncut again.
        assert_eq!(r.missed(false), Next::Doubled);
        assert!(!r.uncut);
        assert_eq!([r.missed(true), r.missed(true)], [Next::Doubled; 2]);
        assert!(!r.uncut);
    }

    #[test]
    fn gpus_nearly_full_before_the_cuts_are_uncut() {
        // Gpu 1 sends gpu 0 as many one-chunk operations as leave both
        // exactly at the threshold (1 + n + tbs + steps), then one more.
        let n = 4;
        let steps = UNCUT_ABOVE - 1 - n - UNCUT_ABOVE.div_ceil(MAX_STEPS_PER_TB);
        let mut ops = vec![ChunkOp::test(1, 0, 0, 0, 1, 0); steps];
        ops.push(ChunkOp::test(2, 0, 3, 0, 1, 1));
        assert_eq!(elements_floor(&ops, n, 1024)[..2], [UNCUT_ABOVE; 2]);
        assert!(uncut_gpus(&ops, n, 1024).is_empty());
        ops.push(ChunkOp::test(1, 0, 0, 0, 1, 0));
        assert_eq!(uncut_gpus(&ops, n, 1024), [true, true, false, false]);
    }

    #[test]
    fn released_heads_wait_for_a_send_planned_lead_us_earlier() {
        let ops = vec![
            // Two earlier sends of gpu 0, planned at 0 and 15 us.
            op(0, BufRef::Input, 0, 6, 0, 4, vec![], 4),
            op(0, BufRef::Input, 4, 7, 0, 4, vec![], 5),
            // Gpu 0's scratch from gpus 1 and 2; a transfer into gpu 5.
            op(1, BufRef::Input, 0, 0, 0, 2, vec![], 0),
            op(2, BufRef::Input, 0, 0, 2, 8, vec![], 1),
            op(4, BufRef::Input, 0, 5, 0, 5, vec![], 2),
            // The forward to gpu 5, planned at 30 us: a head of two steps.
            op(0, BufRef::Scratch, 0, 5, 5, 10, vec![2, 3, 4], 3),
        ];
        let at = |start_us| TransferTime {
            start_us,
            end_us: start_us + 1.0,
        };
        let timeline = [at(0.0), at(0.0), at(0.0), at(30.0), at(0.0), at(15.0)];
        let heads = |release: Option<f64>| {
            let paced = cut_for_pacing(ops.clone(), 2, release.map(|l| (&timeline[..], l)), &[]);
            let fwd: Vec<ChunkOp> = paced.ops.into_iter().filter(|o| o.from == 3).collect();
            assert_eq!(fwd.iter().map(|o| o.cnt).collect::<Vec<_>>(), vec![1, 1, 8]);
            // The body never gets the release wait.
            assert_eq!(fwd[2].deps, vec![3, 4]);
            let mut d = fwd[0].deps.clone();
            d.sort_unstable();
            assert_eq!(fwd[1].deps.len(), d.len());
            (d, paced.released)
        };
        // As before: the head waits only for its data.
        assert_eq!(heads(None), (vec![2], 0));
        // 20 us ahead: the send planned at 0 (the one at 15 is too late).
        assert_eq!(heads(Some(20.0)), (vec![0, 2], 1));
        // 10 us ahead: the latest send planned by 20 us, the one at 15.
        assert_eq!(heads(Some(10.0)), (vec![1, 2], 1));
        // Nothing planned 40 us ahead: no wait added.
        assert_eq!(heads(Some(40.0)), (vec![2], 0));
    }

    #[test]
    fn direct_uniform_lowers_and_reads_back() {
        let topo = Topology::preset("dgx-h100", 2, Some(4)).unwrap();
        let m = TrafficMatrix::uniform(8, 4096);
        let plan = direct(&topo, &m);
        let x = to_xml(&plan, &topo, &m, &XmlOptions::default()).unwrap();
        assert!(x.text.starts_with("<algo name=\"switchyard direct layout=padded chunk_bytes=16 gpus_per_node=4\" proto=\"LL\""), "{}", &x.text[..200]);
        assert_eq!(x.nchunksperloop, 8 * 256);
        assert_eq!(x.count_bytes, 4096);
        assert!(x.report.warnings.is_empty(), "{:?}", x.report.warnings);
        verify_on(&x.plan, &m, &topo).unwrap();
        assert_eq!(x.plan.transfers.len(), plan.transfers.len());
        let back = super::super::parse_xml(&x.text, "x.xml", Some(&m)).unwrap();
        verify_on(&back, &m, &topo).unwrap();
        super::super::check_executable(&x.text).unwrap();
    }

    #[test]
    fn simple_is_tried_only_for_an_over_file_of_a_protocol_chosen_by_size() {
        // A small skewed file: LL by size, its window its own size.
        let topo = Topology::preset("dgx-h100", 2, Some(4)).unwrap();
        let mut m = TrafficMatrix::uniform(8, 1000);
        m.set(1, 6, 77_777);
        let plan = direct(&topo, &m);
        let opts = XmlOptions::default();
        let x = to_xml(&plan, &topo, &m, &opts).unwrap();
        assert_ne!(x.protocol, Protocol::Simple);
        assert_eq!(x.min_bytes, x.max_bytes);
        let o = simple_candidates(&opts, &x, true, 8).unwrap();
        assert_eq!(o.protocol, Some(Protocol::Simple));
        assert_eq!((o.layout, o.pacing), (opts.layout, opts.pacing));
        // Within 3%, a protocol forced, a cluster too large to price, or a
        // file in Simple already: nothing to try.
        assert!(simple_candidates(&opts, &x, false, 8).is_none());
        let forced = XmlOptions {
            protocol: Some(x.protocol),
            ..opts.clone()
        };
        assert!(simple_candidates(&forced, &x, true, 8).is_none());
        let big = super::super::chunk::MAX_RANKS_PRICED + 1;
        assert!(simple_candidates(&opts, &x, true, big).is_none());
        let simple = to_xml(&plan, &topo, &m, &o).unwrap();
        assert_eq!(simple.protocol, Protocol::Simple);
        assert!(simple_candidates(&opts, &simple, true, 8).is_none());
    }

    #[test]
    fn skewed_direct_in_both_layouts() {
        let topo = Topology::preset("dgx-h100", 2, Some(4)).unwrap();
        let mut m = TrafficMatrix::uniform(8, 1000);
        m.set(1, 6, 77_777);
        m.set(2, 2, 0);
        m.set(5, 3, 0);
        m.set(7, 0, 1);
        let plan = direct(&topo, &m);
        for layout in [Layout::Padded, Layout::Packed] {
            let opts = XmlOptions {
                layout,
                ..Default::default()
            };
            let x = to_xml(&plan, &topo, &m, &opts).unwrap();
            verify_on(&x.plan, &m, &topo).unwrap();
            let r = super::super::check_executable(&x.text).unwrap();
            assert_eq!(r.layout, layout);
            let back = super::super::parse_xml(&x.text, "x.xml", Some(&m)).unwrap();
            verify_on(&back, &m, &topo).unwrap();
        }
    }

    #[test]
    fn a_file_read_back_as_lowered_keeps_the_lowered_run() {
        let topo = Topology::preset("dgx-h100", 2, Some(4)).unwrap();
        let mut m = TrafficMatrix::uniform(8, 1000);
        m.set(1, 6, 77_777);
        m.set(5, 3, 0);
        let plan = direct(&topo, &m);
        let x = to_xml(&plan, &topo, &m, &XmlOptions::default()).unwrap();
        let parsed = parse_algo(&x.text, "x.xml").unwrap();
        // Read back, only the lines differ.
        assert_ne!(parsed, x.algo);
        assert!(same_elements(&parsed, &x.algo));
        // And the run of either encodes the same plan, the one kept.
        let file = "x.xml";
        let of = |a: &Algo| {
            let t = exec::run(a, file).unwrap();
            trace_to_plan(a, &t, Some(&m), Some(x.chunk_bytes), file)
                .unwrap()
                .0
        };
        let lowered = of(&x.algo);
        assert_eq!(lowered.transfers, of(&parsed).transfers);
        assert_eq!(lowered.transfers, x.plan.transfers);
        // Any attribute that differs is a different file.
        let mut other = parsed.clone();
        other.gpus[3].tbs[0].steps[0].cnt += 1;
        assert!(!same_elements(&other, &x.algo));
        let mut other = parsed.clone();
        other.gpus[7].tbs.last_mut().unwrap().chan += 1;
        assert!(!same_elements(&other, &x.algo));
        let mut other = parsed;
        other.max_bytes += 1;
        assert!(!same_elements(&other, &x.algo));
    }

    /// Every operation is a step on each gpu it touches; a connection
    /// direction's (or a gpu's local) steps need a tb per 64; packing
    /// leaves at least `limit` tbs.
    #[test]
    fn the_elements_floor_counts_steps_and_tbs() {
        let mut ops = vec![ChunkOp::test(0, 0, 1, 0, 1, 0); 3];
        ops.push(ChunkOp::test(1, 0, 0, 0, 1, 1));
        ops.extend(vec![ChunkOp::test(2, 0, 2, 0, 1, 2); 70]);
        // 1 + n + tbs + steps.
        assert_eq!(elements_floor(&ops, 4, 128), [11, 11, 77, 5]);
        assert_eq!(elements_floor(&ops, 4, 1), [10, 10, 76, 5]);
        assert_eq!(over_elements(&[5, MAX_NODES, 7]), None);
        let why = over_elements(&[5, MAX_NODES + 1, MAX_NODES + 2]).unwrap();
        assert!(
            why.starts_with("gpu 1 would hold at least 4097 elements"),
            "{why}"
        );
    }

    #[test]
    fn the_timeline_is_exact_where_files_are_priced_and_grouped_above() {
        let exact = timeline_options(super::super::chunk::MAX_RANKS_PRICED);
        assert_eq!(exact, SimOptions::default());
        assert_eq!(exact.tolerance_for(1), 0.0);
        let big = timeline_options(128);
        assert_eq!(big.tolerance_for(1), TIMELINE_TOLERANCE);
        assert!(big.group_arrivals);
        assert_eq!(big.network, SimOptions::default().network);
    }
}
