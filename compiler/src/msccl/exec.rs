//! The symbolic executor: an MSCCL XML file judged as the executor would
//! load and run it, without a GPU.
//!
//! Three layers, each naming the line, gpu, threadblock and step at fault:
//! 1. lexical: the hand-written reader's rules (spec §2) and Switchyard's
//!    stricter writing rules (one tag per line, plain decimal numbers);
//! 2. loader: what the executor checks or silently gets wrong (spec §3, §8):
//!    ids, peers, channels, one owner tb per connection, step limits, `cnt`,
//!    `depid`, nops, buffer bounds;
//! 3. run: threadblocks execute their steps in order; the k-th send on a
//!    connection `(chan, A -> B)` meets the k-th receive; a step first waits
//!    for its dependency flags; a connection's FIFO holds 2 (Simple) or 8
//!    (LL, LL128) undelivered operations. The run is done twice, with one
//!    operation per step and with one per chunk (small and large buffers,
//!    spec §5), and stops with a deadlock report when nothing can move. Every
//!    chunk carries the input chunk it holds, and the outputs are checked
//!    against the all-to-all layout (spec §10, §11).
//!
//! Unordered accesses (spec §14 item 8) are left to [`verify`](fn@crate::verify), run on
//! the plan the trace converts to.

use smallvec::SmallVec;
use std::collections::{HashMap, VecDeque};

use super::{parse, Algo, BufRef, ChunkMap, Layout, NameFacts, Protocol, StepKind};
use super::{MAX_CHANNELS_ANY, MAX_CNT, MAX_NODES, MAX_OFFSET, MAX_PEER_TBS_PER_CHANNEL};
use super::{MAX_STEPS_PER_TB, MAX_TBS_PER_GPU};
use crate::error::{InputError, Result};
use crate::verify::VerifyError;

/// What a checked file does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecReport {
    pub name: String,
    pub ngpus: usize,
    pub proto: Protocol,
    pub nchannels: usize,
    pub nchunksperloop: usize,
    pub layout: Layout,
    /// From the file's name, when Switchyard wrote it.
    pub chunk_bytes: Option<u64>,
    pub min_bytes: u64,
    pub max_bytes: u64,
    /// Largest number of threadblocks on one gpu.
    pub max_tbs_per_gpu: usize,
    pub max_steps_per_tb: usize,
    /// `<step>` elements, nops included.
    pub steps: usize,
    pub nops: usize,
    /// Send/receive pairs and local copies.
    pub operations: usize,
    /// Chunks that changed gpu.
    pub chunks_moved: u64,
    /// Harmless oddities (a `hasdep` nobody waits for, many threadblocks).
    pub warnings: Vec<String>,
}

/// Which input chunk a buffer chunk holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Origin {
    pub rank: u32,
    pub idx: u32,
}

/// A step by place: indices into `algo.gpus` and its `tbs`, and the position.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StepRef {
    pub gpu: u32,
    pub tb: u32,
    pub pos: u32,
}

impl StepRef {
    /// Step `p` of tb `ti` on gpu `gi`, from the loader's indices.
    fn of(gi: usize, ti: usize, p: usize) -> StepRef {
        StepRef {
            gpu: gi as u32,
            tb: ti as u32,
            pos: p as u32,
        }
    }
}

/// One data movement: a send/receive pair or a local copy.
#[derive(Clone, Debug)]
pub struct Op {
    pub src: u32,
    pub src_buf: BufRef,
    pub src_off: u32,
    pub dst: u32,
    pub dst_buf: BufRef,
    pub dst_off: u32,
    pub cnt: u32,
    /// Operations that complete before this one starts (program order in
    /// both tbs, dependency flags, the receive of a forwarding step).
    pub deps: Vec<u32>,
    /// What the moved chunks hold.
    pub data: Vec<Origin>,
    /// The sending (or copying) step and the receiving step.
    pub from: StepRef,
    pub to: StepRef,
}

/// A checked run: the operations and what the file says about chunks.
#[derive(Clone, Debug)]
pub struct Trace {
    pub ops: Vec<Op>,
    pub map: ChunkMap,
    pub facts: NameFacts,
    pub report: ExecReport,
    /// Per step `[gpu][tb][position]`: the operations it receives, sends or
    /// copies, and the `(tb, position)` steps it waits for (nops folded in).
    pub(crate) step_ops: PerStep<StepOps>,
    pub(crate) waits: PerStep<Vec<(u32, u32)>>,
}

/// Per step: the operation it receives, sends or copies.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct StepOps {
    pub(crate) recv: Option<u32>,
    pub(crate) send: Option<u32>,
    pub(crate) local: Option<u32>,
}

impl StepOps {
    /// The operation complete when this step is. A send step finishes once
    /// its data is in the FIFO; with `delivered` it is taken to finish when
    /// the data arrives, as it nearly does for messages larger than the FIFO.
    fn done(&self, delivered: bool) -> Option<u32> {
        if delivered {
            self.local.or(self.send).or(self.recv)
        } else {
            self.local.or(self.recv)
        }
    }
}

/// A value per step: `[gpu][tb][position]`.
pub(crate) type PerStep<T> = Vec<Vec<Vec<T>>>;

/// `value` at every step of `algo`.
pub(crate) fn per_step<T: Clone>(algo: &Algo, value: T) -> PerStep<T> {
    algo.gpus
        .iter()
        .map(|g| {
            g.tbs
                .iter()
                .map(|t| vec![value.clone(); t.steps.len()])
                .collect()
        })
        .collect()
}

/// The structure the loader builds: indices, pairing, dependencies.
struct Loaded<'a> {
    algo: &'a Algo,
    file: &'a str,
    step_ops: PerStep<StepOps>,
    ops: Vec<Op>,
    /// Per step: `(tb index, position)` flags it waits for, nops folded in.
    waits: PerStep<Vec<(u32, u32)>>,
    /// Per connection `(chan, from gpu, to gpu)`: the owning tbs.
    fifo_ids: HashMap<(u32, u32, u32), usize>,
    /// Steps in the order the one-operation-per-step run completed them.
    step_log: Vec<(u32, u32, u32)>,
    map: ChunkMap,
    warnings: Vec<String>,
}

fn step_line(algo: &Algo, g: usize, t: usize, p: usize) -> usize {
    algo.gpus[g].tbs[t].steps[p].line
}

/// `gpu 3, tb 5, step 2`
fn at(algo: &Algo, r: StepRef) -> String {
    let gpu = &algo.gpus[r.gpu as usize];
    format!(
        "gpu {}, tb {}, step {}",
        gpu.id, gpu.tbs[r.tb as usize].id, r.pos
    )
}

/// Validates, pairs, runs and checks a parsed file.
pub fn run(algo: &Algo, file: &str) -> Result<Trace> {
    let mut l = loaded_run(algo, file, Order::Worklist)?;
    let facts = algo.facts();
    let steps: usize = algo
        .gpus
        .iter()
        .flat_map(|g| &g.tbs)
        .map(|t| t.steps.len())
        .sum();
    let nops = algo
        .gpus
        .iter()
        .flat_map(|g| &g.tbs)
        .flat_map(|t| &t.steps)
        .filter(|s| s.kind == StepKind::Nop)
        .count();
    let report = ExecReport {
        name: algo.name.clone(),
        ngpus: algo.ngpus as usize,
        proto: algo.proto,
        nchannels: algo.nchannels as usize,
        nchunksperloop: algo.nchunksperloop as usize,
        layout: l.map.layout,
        chunk_bytes: facts.chunk_bytes,
        min_bytes: algo.min_bytes as u64,
        max_bytes: algo.max_bytes as u64,
        max_tbs_per_gpu: algo.gpus.iter().map(|g| g.tbs.len()).max().unwrap_or(0),
        max_steps_per_tb: algo
            .gpus
            .iter()
            .flat_map(|g| &g.tbs)
            .map(|t| t.steps.len())
            .max()
            .unwrap_or(0),
        steps,
        nops,
        operations: l.ops.len(),
        chunks_moved: l
            .ops
            .iter()
            .filter(|o| o.src != o.dst)
            .map(|o| o.cnt as u64)
            .sum(),
        warnings: std::mem::take(&mut l.warnings),
    };
    Ok(Trace {
        ops: l.ops,
        map: l.map,
        facts,
        report,
        step_ops: l.step_ops,
        waits: l.waits,
    })
}

/// Loads and runs a file both ways (one operation per step, then per
/// chunk), linking the operations' dependencies in between.
fn loaded_run<'a>(algo: &'a Algo, file: &'a str, order: Order) -> Result<Loaded<'a>> {
    let mut l = load(algo, file)?;
    execute(&mut l, Mode::PerStep, order)?;
    link_deps(&mut l);
    execute(&mut l, Mode::PerChunk, order)?;
    check_outputs(&l)?;
    Ok(l)
}

fn load<'a>(algo: &'a Algo, file: &'a str) -> Result<Loaded<'a>> {
    let err = |line: usize, reason: String| -> crate::error::Error {
        InputError::at(file, format!("line {line}"), reason).into()
    };
    let n = algo.ngpus;
    if n < 1 {
        return Err(err(algo.line, format!("ngpus=\"{n}\" must be at least 1")));
    }
    if algo.coll != "alltoall" {
        let known = [
            "reduce",
            "broadcast",
            "allreduce",
            "reducescatter",
            "allgather",
            "send",
            "recv",
            "gather",
            "scatter",
            "alltoallv",
        ];
        let why = if known.contains(&algo.coll.as_str()) {
            "only all-to-all plans are read"
        } else {
            "the executor knows no such collective"
        };
        return Err(err(
            algo.line,
            format!("coll=\"{}\": {why}", crate::error::clip(&algo.coll)),
        ));
    }
    if algo.nchunksperloop < 1 || algo.nchunksperloop > MAX_OFFSET + 1 {
        return Err(err(
            algo.line,
            format!(
                "nchunksperloop=\"{}\" must be in 1..={}",
                algo.nchunksperloop,
                MAX_OFFSET + 1
            ),
        ));
    }
    // RCCL's limit; NCCL-MSCCL's 32 is a profile's (`Executor::check`).
    if algo.nchannels < 1 || algo.nchannels > MAX_CHANNELS_ANY as i64 {
        return Err(err(
            algo.line,
            format!(
                "nchannels=\"{}\" must be in 1..={MAX_CHANNELS_ANY}",
                algo.nchannels
            ),
        ));
    }
    if algo.min_bytes < 0
        || algo.max_bytes < 0
        || (algo.max_bytes != 0 && algo.max_bytes < algo.min_bytes)
    {
        return Err(err(
            algo.line,
            format!(
                "size window minBytes=\"{}\" maxBytes=\"{}\" selects no message",
                algo.min_bytes, algo.max_bytes
            ),
        ));
    }
    if !algo.inplace && !algo.outofplace {
        return Err(err(
            algo.line,
            "inplace=\"0\" and outofplace=\"0\": no call can use the plan".into(),
        ));
    }
    let map = parse::chunk_map(algo, file)?;
    // gpus: ids exactly 0..n-1, sorted by id for indexing.
    let mut gpu_at = vec![usize::MAX; n as usize];
    for (gi, g) in algo.gpus.iter().enumerate() {
        if g.id < 0 || g.id >= n {
            return Err(err(
                g.line,
                format!("gpu id=\"{}\" is not a rank of ngpus=\"{n}\"", g.id),
            ));
        }
        if gpu_at[g.id as usize] != usize::MAX {
            return Err(err(
                g.line,
                format!("gpu {} appears twice (the executor overlays them)", g.id),
            ));
        }
        gpu_at[g.id as usize] = gi;
    }
    if let Some(missing) = gpu_at.iter().position(|&x| x == usize::MAX) {
        return Err(err(
            algo.line,
            format!("no <gpu id=\"{missing}\">: that rank would run nothing"),
        ));
    }
    if algo.gpus.iter().enumerate().any(|(i, g)| g.id != i as i64) {
        return Err(err(
            algo.line,
            "gpus must be listed in rank order 0..ngpus-1".into(),
        ));
    }
    let mut warnings = Vec::new();
    let mut tb_of_id = Vec::with_capacity(n as usize);
    // (chan, from, to) -> owning send tb (g, t) and receive tb.
    let mut senders: HashMap<(u32, u32, u32), (u32, u32)> = HashMap::new();
    let mut receivers: HashMap<(u32, u32, u32), (u32, u32)> = HashMap::new();
    for (gi, g) in algo.gpus.iter().enumerate() {
        let nchunks = algo.nchunksperloop;
        for (what, v) in [("i_chunks", g.i_chunks), ("o_chunks", g.o_chunks)] {
            if v < 0 || v > nchunks {
                return Err(err(g.line, format!("gpu {}: {what}=\"{v}\" must be in 0..={nchunks}, the real buffer of an all-to-all", g.id)));
            }
        }
        if g.s_chunks < 0 || g.s_chunks > MAX_OFFSET + 1 {
            return Err(err(
                g.line,
                format!("gpu {}: s_chunks=\"{}\" out of range", g.id, g.s_chunks),
            ));
        }
        let steps: usize = g.tbs.iter().map(|t| t.steps.len()).sum();
        let nodes = 1 + algo.gpus.len() + g.tbs.len() + steps;
        if nodes > MAX_NODES {
            return Err(err(g.line, format!("gpu {}: {nodes} elements in one parse (algo, every gpu, its tbs and steps); the executor allows {MAX_NODES}", g.id)));
        }
        let k = g.tbs.len();
        if k > MAX_TBS_PER_GPU {
            return Err(err(g.line, format!("gpu {}: {k} threadblocks; depid is stored in 8 bits, so at most {MAX_TBS_PER_GPU}", g.id)));
        }
        if k > 108 {
            warnings.push(format!("gpu {}: {k} threadblocks, more than an A100 has SMs (108): they must all be resident", g.id));
        }
        let mut ids = vec![u32::MAX; k];
        let mut per_chan_send = HashMap::<i64, usize>::new();
        let mut per_chan_recv = HashMap::<i64, usize>::new();
        for (ti, tb) in g.tbs.iter().enumerate() {
            let here = format!("gpu {}, tb {}", g.id, tb.id);
            if tb.id < 0 || tb.id >= k as i64 {
                return Err(err(
                    tb.line,
                    format!(
                        "{here}: tb ids must be 0..{} (the executor rejects holes)",
                        k - 1
                    ),
                ));
            }
            if ids[tb.id as usize] != u32::MAX {
                return Err(err(tb.line, format!("{here}: duplicate tb id")));
            }
            ids[tb.id as usize] = ti as u32;
            for (what, p) in [("send", tb.send), ("recv", tb.recv)] {
                if p < -1 || p >= n || p == g.id {
                    return Err(err(
                        tb.line,
                        format!("{here}: {what}=\"{p}\" must be -1 or another rank below {n}"),
                    ));
                }
            }
            if tb.chan < 0 || tb.chan >= algo.nchannels {
                return Err(err(tb.line, format!("{here}: chan=\"{}\" must be below nchannels=\"{}\" (only those channels are connected)", tb.chan, algo.nchannels)));
            }
            let chan = tb.chan as u32;
            if tb.send >= 0 {
                let key = (chan, g.id as u32, tb.send as u32);
                if let Some((_, other)) = senders.insert(key, (gi as u32, ti as u32)) {
                    return Err(err(tb.line, format!("{here}: tb {} also sends to gpu {} on channel {chan}; one connection has one owner", g.tbs[other as usize].id, tb.send)));
                }
                *per_chan_send.entry(tb.chan).or_default() += 1;
            }
            if tb.recv >= 0 {
                let key = (chan, tb.recv as u32, g.id as u32);
                if let Some((_, other)) = receivers.insert(key, (gi as u32, ti as u32)) {
                    return Err(err(tb.line, format!("{here}: tb {} also receives from gpu {} on channel {chan}; one connection has one owner", g.tbs[other as usize].id, tb.recv)));
                }
                *per_chan_recv.entry(tb.chan).or_default() += 1;
            }
            if tb.steps.len() > MAX_STEPS_PER_TB {
                return Err(err(
                    tb.line,
                    format!(
                        "{here}: {} steps; the executor allows {MAX_STEPS_PER_TB} per tb",
                        tb.steps.len()
                    ),
                ));
            }
        }
        for (c, cnt) in per_chan_send.iter().chain(per_chan_recv.iter()) {
            if *cnt > MAX_PEER_TBS_PER_CHANNEL {
                return Err(err(g.line, format!("gpu {}: {cnt} tbs with a peer in one direction on channel {c}; the executor allows {MAX_PEER_TBS_PER_CHANNEL}", g.id)));
            }
        }
        tb_of_id.push(ids);
    }
    // Steps: attributes, bounds, nops, dependencies.
    let mut waits: PerStep<Vec<(u32, u32)>> = Vec::with_capacity(algo.gpus.len());
    // Per gpu, tb and step: whether some step waits for it.
    let mut targets: PerStep<bool> = per_step(algo, false);
    for (gi, g) in algo.gpus.iter().enumerate() {
        let mut gw = Vec::with_capacity(g.tbs.len());
        for (ti, tb) in g.tbs.iter().enumerate() {
            let mut tw = Vec::with_capacity(tb.steps.len());
            let mut pending: Vec<(u32, u32)> = Vec::new();
            for (p, st) in tb.steps.iter().enumerate() {
                // Where, formatted only for an error (a million steps at 64 x 8).
                let e = |reason: String| {
                    let here = at(algo, StepRef::of(gi, ti, p));
                    err(st.line, format!("{here}: {reason}"))
                };
                if st.s != p as i64 {
                    return Err(e(format!("s=\"{}\" but it is step {p} of its tb: the kernel numbers steps by position, so a step is missing or out of order", st.s)));
                }
                if st.kind.reduces() {
                    return Err(e(format!(
                        "type=\"{}\" reduces: not an all-to-all step",
                        st.kind.code()
                    )));
                }
                if st.cnt < 0 || st.cnt > MAX_CNT as i64 {
                    return Err(e(format!("cnt=\"{}\" must be in 0..={MAX_CNT}", st.cnt)));
                }
                if st.kind.sends() && tb.send < 0 {
                    return Err(e(format!(
                        "type=\"{}\" sends but the tb has send=\"-1\"",
                        st.kind.code()
                    )));
                }
                if st.kind.recvs() && tb.recv < 0 {
                    return Err(e(format!(
                        "type=\"{}\" receives but the tb has recv=\"-1\"",
                        st.kind.code()
                    )));
                }
                let size = |b: BufRef| match b {
                    BufRef::Input => g.i_chunks,
                    BufRef::Output => g.o_chunks,
                    BufRef::Scratch => g.s_chunks,
                };
                if st.kind != StepKind::Nop && st.cnt > 0 {
                    let mut operands: SmallVec<[(&str, BufRef, i64); 2]> = SmallVec::new();
                    if st.kind.reads_src() {
                        operands.push(("src", st.srcbuf, st.srcoff));
                    }
                    if st.kind.writes_dst() {
                        operands.push(("dst", st.dstbuf, st.dstoff));
                        if st.dstbuf == BufRef::Input && !algo.inplace {
                            return Err(e("writes the input buffer, the caller's send buffer of an out-of-place call".into()));
                        }
                    }
                    if st.kind.sends() && !st.kind.reads_src() && st.dstbuf == BufRef::Input {
                        return Err(e(
                            "forwards from the input buffer it would have to write".into()
                        ));
                    }
                    for (what, b, off) in operands {
                        let sz = size(b);
                        // `cnt` is in 0..=MAX_CNT here, so `sz - cnt` cannot
                        // overflow where `off + cnt` could (off is the file's i64).
                        if off < 0 || off > sz - st.cnt {
                            return Err(e(format!(
                                "{what} chunks {off}..{} lie outside {} ({sz} chunks)",
                                off.saturating_add(st.cnt),
                                b.name()
                            )));
                        }
                    }
                }
                if st.depid < -1 || st.depid >= g.tbs.len() as i64 {
                    return Err(e(format!(
                        "depid=\"{}\" is not a tb of gpu {}",
                        st.depid, g.id
                    )));
                }
                if st.depid >= 0 {
                    let target = tb_of_id[gi][st.depid as usize];
                    let tsteps = g.tbs[target as usize].steps.len() as i64;
                    if st.deps < 0 || st.deps >= tsteps {
                        return Err(e(format!(
                            "deps=\"{}\" but tb {} has {tsteps} steps",
                            st.deps, st.depid
                        )));
                    }
                    // The wait ends at the first step at or after `deps` that signals.
                    let steps = &g.tbs[target as usize].steps;
                    let Some(sig) = (st.deps as usize..steps.len())
                        .find(|&q| steps[q].hasdep && steps[q].kind != StepKind::Nop)
                    else {
                        return Err(e(format!("waits for tb {} step {}, but no step of tb {} from there on has hasdep=\"1\": it would wait forever", st.depid, st.deps, st.depid)));
                    };
                    targets[gi][target as usize][sig] = true;
                    pending.push((target, st.deps as u32));
                }
                if st.kind == StepKind::Nop {
                    if st.depid < 0 {
                        return Err(e("nop without a dependency: the executor drops it and every later step of the tb shifts by one".into()));
                    }
                    tw.push(Vec::new());
                    continue;
                }
                if !pending.is_empty() && st.depid < 0 {
                    return Err(e(
                        "follows nops but has no dependency itself; the executor rejects that"
                            .into(),
                    ));
                }
                tw.push(std::mem::take(&mut pending));
            }
            gw.push(tw);
        }
        waits.push(gw);
    }
    for (gi, g) in algo.gpus.iter().enumerate() {
        for (ti, tb) in g.tbs.iter().enumerate() {
            for (p, st) in tb.steps.iter().enumerate() {
                if st.hasdep && st.kind != StepKind::Nop && !targets[gi][ti][p] {
                    warnings.push(format!(
                        "{} (line {}): hasdep=\"1\" but no step waits for it",
                        at(algo, StepRef::of(gi, ti, p)),
                        st.line
                    ));
                }
            }
        }
    }
    let mut l = Loaded {
        algo,
        file,
        step_ops: algo
            .gpus
            .iter()
            .map(|g| {
                g.tbs
                    .iter()
                    .map(|t| vec![StepOps::default(); t.steps.len()])
                    .collect()
            })
            .collect(),
        ops: Vec::new(),
        waits,
        fifo_ids: HashMap::new(),
        step_log: Vec::new(),
        map,
        warnings,
    };
    pair(&mut l, &senders, &receivers)?;
    Ok(l)
}

/// Matches the k-th send on each connection with its k-th receive, and
/// numbers local copies.
fn pair(
    l: &mut Loaded<'_>,
    senders: &HashMap<(u32, u32, u32), (u32, u32)>,
    receivers: &HashMap<(u32, u32, u32), (u32, u32)>,
) -> Result<()> {
    let algo = l.algo;
    let err = |line: usize, reason: String| -> crate::error::Error {
        InputError::at(l.file, format!("line {line}"), reason).into()
    };
    let moving = |g: u32, t: u32, f: fn(StepKind) -> bool| -> Vec<u32> {
        let steps = &algo.gpus[g as usize].tbs[t as usize].steps;
        (0..steps.len() as u32)
            .filter(|&p| f(steps[p as usize].kind) && steps[p as usize].cnt > 0)
            .collect()
    };
    let mut keys: Vec<_> = senders.keys().chain(receivers.keys()).copied().collect();
    keys.sort_unstable();
    keys.dedup();
    for key in keys {
        let (chan, from, to) = key;
        let (s, r) = (senders.get(&key), receivers.get(&key));
        let sends = s.map_or_else(Vec::new, |&(g, t)| moving(g, t, StepKind::sends));
        let recvs = r.map_or_else(Vec::new, |&(g, t)| moving(g, t, StepKind::recvs));
        let fid = l.fifo_ids.len();
        l.fifo_ids.insert(key, fid);
        if sends.len() != recvs.len() {
            let (lonely, side, peer, verb) = if sends.len() > recvs.len() {
                let &(g, t) = s.expect("more sends than receives means a sender");
                (
                    StepRef {
                        gpu: g,
                        tb: t,
                        pos: sends[recvs.len()],
                    },
                    "sends",
                    to,
                    "receives",
                )
            } else {
                let &(g, t) = r.expect("more receives than sends means a receiver");
                (
                    StepRef {
                        gpu: g,
                        tb: t,
                        pos: recvs[sends.len()],
                    },
                    "receives",
                    from,
                    "sends",
                )
            };
            let other = if side == "sends" { r } else { s };
            let other_tb = match other {
                Some(&(g, t)) => format!("its tb {} ", algo.gpus[g as usize].tbs[t as usize].id),
                None => "no tb ".into(),
            };
            let (have, want) = if side == "sends" {
                (recvs.len(), sends.len())
            } else {
                (sends.len(), recvs.len())
            };
            return Err(err(
                step_line(algo, lonely.gpu as usize, lonely.tb as usize, lonely.pos as usize),
                format!(
                    "{}: operation {} it {side} on channel {chan} ({from} -> {to}) has no partner: gpu {peer} {verb} {have} of {want} there ({other_tb}on that channel)",
                    at(algo, lonely),
                    have + 1,
                ),
            ));
        }
        let (Some(&(sg, st)), Some(&(rg, rt))) = (s, r) else {
            continue; // both lists empty: a declared but unused connection
        };
        for (k, (&ps, &pr)) in sends.iter().zip(&recvs).enumerate() {
            let a = &algo.gpus[sg as usize].tbs[st as usize].steps[ps as usize];
            let b = &algo.gpus[rg as usize].tbs[rt as usize].steps[pr as usize];
            let from_ref = StepRef {
                gpu: sg,
                tb: st,
                pos: ps,
            };
            let to_ref = StepRef {
                gpu: rg,
                tb: rt,
                pos: pr,
            };
            if a.cnt != b.cnt {
                return Err(err(b.line, format!(
                    "{}: receive {k} on channel {chan} from gpu {from} has cnt=\"{}\" but its send ({}, line {}) has cnt=\"{}\"",
                    at(algo, to_ref), b.cnt, at(algo, from_ref), a.line, a.cnt
                )));
            }
            // A forwarding step sends what it just wrote into its dst.
            let (src_buf, src_off) = if a.kind.reads_src() {
                (a.srcbuf, a.srcoff)
            } else {
                (a.dstbuf, a.dstoff)
            };
            let id = l.ops.len() as u32;
            l.ops.push(Op {
                src: from,
                src_buf,
                src_off: src_off as u32,
                dst: to,
                dst_buf: b.dstbuf,
                dst_off: b.dstoff as u32,
                cnt: a.cnt as u32,
                deps: Vec::new(),
                data: Vec::new(),
                from: from_ref,
                to: to_ref,
            });
            l.step_ops[sg as usize][st as usize][ps as usize].send = Some(id);
            l.step_ops[rg as usize][rt as usize][pr as usize].recv = Some(id);
        }
    }
    for (gi, g) in algo.gpus.iter().enumerate() {
        for (ti, tb) in g.tbs.iter().enumerate() {
            for (p, st) in tb.steps.iter().enumerate() {
                if st.kind == StepKind::Copy && st.cnt > 0 {
                    let here = StepRef::of(gi, ti, p);
                    let id = l.ops.len() as u32;
                    l.ops.push(Op {
                        src: g.id as u32,
                        src_buf: st.srcbuf,
                        src_off: st.srcoff as u32,
                        dst: g.id as u32,
                        dst_buf: st.dstbuf,
                        dst_off: st.dstoff as u32,
                        cnt: st.cnt as u32,
                        deps: Vec::new(),
                        data: Vec::new(),
                        from: here,
                        to: here,
                    });
                    l.step_ops[gi][ti][p].local = Some(id);
                }
            }
        }
    }
    Ok(())
}

/// Dependencies between operations: program order in each tb, the
/// dependency flags, and a forwarding step's receive before its send. Sends
/// count as delivered when they finish (what a plan's transfer means, and
/// what the lowering intends) unless that makes a cycle, which a file whose
/// sends only run ahead in the FIFO can have; then a send is only known to
/// have left.
fn link_deps(l: &mut Loaded<'_>) {
    let strong = deps_with(l, true);
    let deps = if acyclic(&strong) {
        strong
    } else {
        deps_with(l, false)
    };
    for (op, d) in l.ops.iter_mut().zip(deps) {
        op.deps = d;
    }
}

fn acyclic(deps: &[Vec<u32>]) -> bool {
    let mut indeg: Vec<usize> = deps.iter().map(Vec::len).collect();
    let mut succ: Vec<Vec<u32>> = vec![Vec::new(); deps.len()];
    for (i, d) in deps.iter().enumerate() {
        for &x in d {
            succ[x as usize].push(i as u32);
        }
    }
    let mut ready: Vec<u32> = (0..deps.len() as u32)
        .filter(|&i| indeg[i as usize] == 0)
        .collect();
    let mut seen = 0;
    while let Some(v) = ready.pop() {
        seen += 1;
        for &w in &succ[v as usize] {
            indeg[w as usize] -= 1;
            if indeg[w as usize] == 0 {
                ready.push(w);
            }
        }
    }
    seen == deps.len()
}

fn deps_with(l: &Loaded<'_>, delivered: bool) -> Vec<Vec<u32>> {
    let mut deps: Vec<Vec<u32>> = vec![Vec::new(); l.ops.len()];
    // Per step: operations known done when it completes. Steps are visited
    // in the order the run completed them, so every wait's target is known.
    // (Inline: most steps stand for one operation.)
    let mut after: PerStep<SmallVec<[u32; 4]>> = l
        .step_ops
        .iter()
        .map(|g| g.iter().map(|t| vec![SmallVec::new(); t.len()]).collect())
        .collect();
    for &(gi, ti, p) in &l.step_log {
        let (gi, ti, p) = (gi as usize, ti as usize, p as usize);
        let so = l.step_ops[gi][ti][p];
        let mut before: SmallVec<[u32; 4]> = if p > 0 {
            after[gi][ti][p - 1].clone()
        } else {
            SmallVec::new()
        };
        for &(target, q) in &l.waits[gi][ti][p] {
            before.extend_from_slice(&after[gi][target as usize][q as usize]);
        }
        before.sort_unstable();
        before.dedup();
        for op in [so.recv, so.local, so.send].into_iter().flatten() {
            deps[op as usize].extend(&before);
        }
        if let (Some(r), Some(s)) = (so.recv, so.send) {
            deps[s as usize].push(r);
        }
        // A step that completes an operation stands for everything before
        // it; a send-only step or a nop passes its knowledge on.
        after[gi][ti][p] = match so.done(delivered) {
            Some(done) => smallvec::smallvec![done],
            None => before,
        };
    }
    for d in &mut deps {
        d.sort_unstable();
        d.dedup();
    }
    deps
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Small buffers: one FIFO operation per step.
    PerStep,
    /// Large buffers: one FIFO operation per chunk.
    PerChunk,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::PerStep => "one operation per step (small messages)",
            Mode::PerChunk => "one operation per chunk (large messages)",
        }
    }
}

/// How [`execute`] picks the next tb to run. The run's end state does not
/// depend on it: a blocked tb only becomes ready through what others do
/// (a flag it waits for, data in its incoming FIFO, room in its outgoing
/// one), never less ready, so every order ends with each tb as far as it
/// can go, and the dependencies read from the run are the same.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Order {
    /// Run a tb when something it may wait for has moved: every step and
    /// chunk is visited a bounded number of times.
    Worklist,
    /// Sweep every tb until a sweep moves nothing (the first model; a test
    /// holds the worklist to it). A sweep moves a connection by as little as
    /// a FIFO's depth of chunks, so large files took minutes.
    #[cfg(test)]
    Sweep,
}

/// The run's state: per tb its next step, the parts of that step done and
/// the last step it signalled; per connection its FIFO; the buffers
/// (`PerStep` only).
struct RunState {
    fifos: Vec<VecDeque<(u32, u32)>>,
    pc: Vec<Vec<usize>>,
    sub: Vec<Vec<u32>>,
    flag: Vec<Vec<i64>>,
    bufs: Bufs,
    /// Per tb, the connection it receives on and the one it sends on.
    fifo_of: Vec<Vec<(Option<usize>, Option<usize>)>>,
    /// `Loaded::waits` laid out flat, a tb's steps one after another (the
    /// run reads the waits of every step it reaches, in tb order):
    /// gpu `gi`'s tb `ti` is tb `tb_base[gi] + ti`, its step `p` is step
    /// `step_base[tb] + p`, whose waits are `wait_at[wait_off[s]..wait_off[s + 1]]`.
    tb_base: Vec<usize>,
    step_base: Vec<usize>,
    wait_off: Vec<u32>,
    wait_at: Vec<(u32, u32)>,
    /// Per tb (as `step_base`): one more than the step whose waits were
    /// last found met (0: none). Flags only rise, so they stay met: a tb
    /// woken again at that step (its FIFO moved) does not read them again.
    met: Vec<usize>,
}

/// What one turn of a tb changed.
#[derive(Default, Clone, Copy)]
struct Moved {
    any: bool,
    /// It put data in its outgoing FIFO (its receiver may move).
    pushed: bool,
    /// It took data from its incoming FIFO (its sender may move).
    popped: bool,
    /// It raised its flag (tbs waiting for it may move).
    flagged: bool,
}

impl RunState {
    fn new(l: &Loaded<'_>, mode: Mode) -> RunState {
        let algo = l.algo;
        // Only a `PerStep` run moves data.
        let moves = mode == Mode::PerStep;
        let bufs = algo
            .gpus
            .iter()
            .filter(|_| moves)
            .map(|g| {
                let input = (0..g.i_chunks as u32)
                    .map(|idx| {
                        Some(Origin {
                            rank: g.id as u32,
                            idx,
                        })
                    })
                    .collect();
                [
                    input,
                    vec![None; g.o_chunks as usize],
                    vec![None; g.s_chunks as usize],
                ]
            })
            .collect();
        // gpus are in rank order (`load`), so a gpu's index is its id.
        let fifo_of = algo
            .gpus
            .iter()
            .enumerate()
            .map(|(gi, g)| {
                g.tbs
                    .iter()
                    .map(|tb| {
                        let c = tb.chan as u32;
                        let fid = |from: i64, to: i64| {
                            (from >= 0 && to >= 0)
                                .then(|| l.fifo_ids.get(&(c, from as u32, to as u32)).copied())
                                .flatten()
                        };
                        (fid(tb.recv, gi as i64), fid(gi as i64, tb.send))
                    })
                    .collect()
            })
            .collect();
        let mut tb_base = Vec::with_capacity(algo.gpus.len());
        let mut step_base = Vec::new();
        let mut wait_off = vec![0u32];
        let mut wait_at = Vec::new();
        for gw in &l.waits {
            tb_base.push(step_base.len());
            for tw in gw {
                step_base.push(wait_off.len() - 1);
                for w in tw {
                    wait_at.extend_from_slice(w);
                    wait_off.push(wait_at.len() as u32);
                }
            }
        }
        RunState {
            met: vec![0; step_base.len()],
            tb_base,
            step_base,
            wait_off,
            wait_at,
            fifos: vec![VecDeque::new(); l.fifo_ids.len()],
            pc: algo.gpus.iter().map(|g| vec![0; g.tbs.len()]).collect(),
            sub: algo.gpus.iter().map(|g| vec![0; g.tbs.len()]).collect(),
            flag: algo.gpus.iter().map(|g| vec![-1; g.tbs.len()]).collect(),
            bufs,
            fifo_of,
        }
    }

    /// Whether step `p` of tb `ti` on `gi` still waits for a flag.
    fn waiting(&self, gi: usize, ti: usize, p: usize) -> Option<(u32, u32)> {
        if self.sub[gi][ti] != 0 {
            return None;
        }
        let at = self.step_base[self.tb_base[gi] + ti] + p;
        let (a, b) = (self.wait_off[at] as usize, self.wait_off[at + 1] as usize);
        self.wait_at[a..b]
            .iter()
            .copied()
            .find(|&(t, q)| self.flag[gi][t as usize] < q as i64)
    }

    /// [`RunState::waiting`], remembering a step whose waits are met.
    fn still_waiting(&mut self, gi: usize, ti: usize, p: usize) -> bool {
        let tb = self.tb_base[gi] + ti;
        if self.met[tb] == p + 1 {
            return false;
        }
        let waits = self.waiting(gi, ti, p).is_some();
        if !waits && self.sub[gi][ti] == 0 {
            self.met[tb] = p + 1;
        }
        waits
    }

    /// Runs tb `ti` of `gi` as far as it can go now.
    fn advance(
        &mut self,
        l: &mut Loaded<'_>,
        mode: Mode,
        depth: usize,
        gi: usize,
        ti: usize,
    ) -> Result<Moved> {
        let algo = l.algo;
        let tb = &algo.gpus[gi].tbs[ti];
        let (tb_in, tb_out) = self.fifo_of[gi][ti];
        let mut moved = Moved::default();
        while self.pc[gi][ti] < tb.steps.len() {
            let p = self.pc[gi][ti];
            let st = &tb.steps[p];
            if self.still_waiting(gi, ti, p) {
                break;
            }
            let so = l.step_ops[gi][ti][p];
            let parts = match (mode, st.kind) {
                (_, StepKind::Nop) => 0,
                (_, _) if st.cnt == 0 => 0,
                (Mode::PerStep, _) => 1,
                (Mode::PerChunk, _) => st.cnt as u32,
            };
            let in_fifo = so.recv.and(tb_in);
            let out_fifo = so.send.and(tb_out);
            while self.sub[gi][ti] < parts {
                let k = self.sub[gi][ti];
                if let Some(f) = in_fifo {
                    if self.fifos[f].front() != Some(&(so.recv.expect("paired"), k)) {
                        return Ok(moved);
                    }
                }
                if let Some(f) = out_fifo {
                    if self.fifos[f].len() >= depth {
                        return Ok(moved);
                    }
                }
                if let Some(f) = in_fifo {
                    self.fifos[f].pop_front();
                    moved.popped = true;
                }
                if mode == Mode::PerStep {
                    move_data(l, &mut self.bufs, gi, ti, p, so)?;
                }
                if let Some(f) = out_fifo {
                    self.fifos[f].push_back((so.send.expect("paired"), k));
                    moved.pushed = true;
                }
                self.sub[gi][ti] += 1;
                moved.any = true;
            }
            if st.hasdep && st.kind != StepKind::Nop {
                self.flag[gi][ti] = p as i64;
                moved.flagged = true;
            }
            if mode == Mode::PerStep {
                l.step_log.push((gi as u32, ti as u32, p as u32));
            }
            self.pc[gi][ti] += 1;
            self.sub[gi][ti] = 0;
            moved.any = true;
        }
        Ok(moved)
    }
}

/// Tbs `(gpu, tb)` to run, each at most once in the queue, first in first out.
struct Worklist {
    queue: VecDeque<(usize, usize)>,
    queued: Vec<Vec<bool>>,
}

impl Worklist {
    /// Every tb queued, in order (`tbs`: the tbs of each gpu).
    fn new(tbs: impl Iterator<Item = usize>) -> Worklist {
        let queued: Vec<Vec<bool>> = tbs.map(|k| vec![true; k]).collect();
        let queue = queued
            .iter()
            .enumerate()
            .flat_map(|(g, q)| (0..q.len()).map(move |t| (g, t)))
            .collect();
        Worklist { queue, queued }
    }

    fn push(&mut self, (g, t): (usize, usize)) {
        if !self.queued[g][t] {
            self.queued[g][t] = true;
            self.queue.push_back((g, t));
        }
    }

    fn pop(&mut self) -> Option<(usize, usize)> {
        let (g, t) = self.queue.pop_front()?;
        self.queued[g][t] = false;
        Some((g, t))
    }
}

/// Runs every tb to completion or reports a deadlock. In `PerStep` mode it
/// also moves data (filling `Op::data`) and checks that nothing is read
/// before it is written.
fn execute(l: &mut Loaded<'_>, mode: Mode, order: Order) -> Result<()> {
    let algo = l.algo;
    let depth = algo.proto.fifo_depth();
    let mut state = RunState::new(l, mode);
    let all = || {
        algo.gpus
            .iter()
            .enumerate()
            .flat_map(|(gi, g)| (0..g.tbs.len()).map(move |ti| (gi, ti)))
    };
    match order {
        Order::Worklist => {
            // Who to wake: each connection's two tbs, and per tb the tbs
            // of its gpu that wait for it.
            let mut ends: Vec<[(usize, usize); 2]> = vec![[(0, 0); 2]; state.fifos.len()];
            let mut waiters: Vec<Vec<Vec<u32>>> = algo
                .gpus
                .iter()
                .map(|g| vec![Vec::new(); g.tbs.len()])
                .collect();
            for (gi, ti) in all() {
                let (fin, fout) = state.fifo_of[gi][ti];
                if let Some(f) = fin {
                    ends[f][1] = (gi, ti);
                }
                if let Some(f) = fout {
                    ends[f][0] = (gi, ti);
                }
                let mut on: Vec<u32> = l.waits[gi][ti].iter().flatten().map(|w| w.0).collect();
                on.sort_unstable();
                on.dedup();
                for t in on {
                    waiters[gi][t as usize].push(ti as u32);
                }
            }
            let mut queue = Worklist::new(algo.gpus.iter().map(|g| g.tbs.len()));
            while let Some((gi, ti)) = queue.pop() {
                let m = state.advance(l, mode, depth, gi, ti)?;
                let (fin, fout) = state.fifo_of[gi][ti];
                if let (true, Some(f)) = (m.popped, fin) {
                    queue.push(ends[f][0]);
                }
                if let (true, Some(f)) = (m.pushed, fout) {
                    queue.push(ends[f][1]);
                }
                if m.flagged {
                    for &t in &waiters[gi][ti] {
                        queue.push((gi, t as usize));
                    }
                }
            }
        }
        #[cfg(test)]
        Order::Sweep => loop {
            let mut progress = false;
            for (gi, ti) in all() {
                progress |= state.advance(l, mode, depth, gi, ti)?.any;
            }
            if !progress {
                break;
            }
        },
    }
    deadlock(l, &state, mode, depth)
}

/// The deadlock report of a run that ended with tbs unfinished.
fn deadlock(l: &Loaded<'_>, state: &RunState, mode: Mode, depth: usize) -> Result<()> {
    let algo = l.algo;
    let ng = algo.gpus.len();
    let stuck: Vec<(usize, usize)> = (0..ng)
        .flat_map(|gi| (0..algo.gpus[gi].tbs.len()).map(move |ti| (gi, ti)))
        .filter(|&(gi, ti)| state.pc[gi][ti] < algo.gpus[gi].tbs[ti].steps.len())
        .collect();
    if stuck.is_empty() {
        return Ok(());
    }
    let mut lines = Vec::new();
    for &(gi, ti) in stuck.iter().take(4) {
        let p = state.pc[gi][ti];
        let tb = &algo.gpus[gi].tbs[ti];
        let here = at(algo, StepRef::of(gi, ti, p));
        let so = l.step_ops[gi][ti][p];
        let in_fifo = state.fifo_of[gi][ti].0;
        let why = if let Some((t, q)) = state.waiting(gi, ti, p) {
            format!(
                "waits for tb {} to finish step {q}",
                algo.gpus[gi].tbs[t as usize].id
            )
        } else if let Some(op) = so.recv.filter(|&op| {
            in_fifo.is_none_or(|f| state.fifos[f].front() != Some(&(op, state.sub[gi][ti])))
        }) {
            format!(
                "waits for data from gpu {} on channel {}",
                l.ops[op as usize].src, tb.chan
            )
        } else {
            format!("cannot send to gpu {} on channel {}: its FIFO holds {depth} undelivered operations", tb.send, tb.chan)
        };
        lines.push(format!("{here} (line {}) {why}", tb.steps[p].line));
    }
    let (gi, ti) = stuck[0];
    // A well-formed file that cannot finish: a failed check, as a JSON
    // plan's dependency cycle is.
    Err(VerifyError::Xml {
        file: l.file.to_string(),
        line: step_line(algo, gi, ti, state.pc[gi][ti]),
        reason: format!(
            "deadlock with {} ({} FIFO depth {depth}): {} tbs cannot finish; {}",
            mode.name(),
            algo.proto,
            stuck.len(),
            lines.join("; ")
        ),
    }
    .into())
}

type Bufs = Vec<[Vec<Option<Origin>>; 3]>;

fn buf_index(b: BufRef) -> usize {
    match b {
        BufRef::Input => 0,
        BufRef::Output => 1,
        BufRef::Scratch => 2,
    }
}

/// Performs step `p`'s data movement in `PerStep` mode.
fn move_data(
    l: &mut Loaded<'_>,
    bufs: &mut Bufs,
    gi: usize,
    ti: usize,
    p: usize,
    so: StepOps,
) -> Result<()> {
    let bi = buf_index;
    let algo = l.algo;
    let st = &algo.gpus[gi].tbs[ti].steps[p];
    let here = StepRef::of(gi, ti, p);
    let cnt = st.cnt as usize;
    let read = |bufs: &Bufs, b: BufRef, off: i64| -> Result<Vec<Origin>> {
        let cells = &bufs[gi][bi(b)][off as usize..off as usize + cnt];
        cells
            .iter()
            .enumerate()
            .map(|(j, c)| {
                c.ok_or_else(|| {
                    VerifyError::Xml {
                        file: l.file.to_string(),
                        line: st.line,
                        reason: format!(
                            "{}: reads {} chunk {} before anything is written there",
                            at(algo, here),
                            b.name(),
                            off as usize + j
                        ),
                    }
                    .into()
                })
            })
            .collect()
    };
    let data = match so.recv {
        Some(op) => l.ops[op as usize].data.clone(),
        None => read(bufs, st.srcbuf, st.srcoff)?,
    };
    if st.kind.writes_dst() {
        let off = st.dstoff as usize;
        for (j, v) in data.iter().enumerate() {
            bufs[gi][bi(st.dstbuf)][off + j] = Some(*v);
        }
    }
    for op in [so.send, so.local].into_iter().flatten() {
        l.ops[op as usize].data = data.clone();
    }
    Ok(())
}

/// Every valid output chunk holds its input chunk (spec §10, §11).
fn check_outputs(l: &Loaded<'_>) -> Result<()> {
    let algo = l.algo;
    let map = &l.map;
    let n = map.n;
    // Final output contents from the operations in any valid order: each
    // output chunk's last writer (double writes are the verifier's to report).
    let mut out: Vec<Vec<Option<(Origin, StepRef)>>> = algo
        .gpus
        .iter()
        .map(|g| vec![None; g.o_chunks as usize])
        .collect();
    for op in &l.ops {
        if op.dst_buf == BufRef::Output {
            for (j, v) in op.data.iter().enumerate() {
                out[op.dst as usize][op.dst_off as usize + j] = Some((*v, op.to));
            }
        }
    }
    for (r, out_r) in out.iter().enumerate() {
        for s in 0..n {
            for c in 0..map.chunks(s, r) {
                let pos = map.output_chunk(s, r, c) as usize;
                let want = Origin {
                    rank: s as u32,
                    idx: map.input_chunk(s, r, c),
                };
                let line = algo.gpus[r].line;
                match out_r.get(pos).copied().flatten() {
                    // The file is well formed but not the all-to-all: a
                    // failed check (exit 1), as a wrong JSON plan is.
                    None => {
                        return Err(VerifyError::Xml {
                            file: l.file.to_string(),
                            line,
                            reason: format!("gpu {r}: output chunk {pos} is never written; it should hold input chunk {} of gpu {s}", want.idx),
                        }
                        .into())
                    }
                    Some((got, by)) if got != want => {
                        return Err(VerifyError::Xml {
                            file: l.file.to_string(),
                            line: step_line(algo, by.gpu as usize, by.tb as usize, by.pos as usize),
                            reason: format!("{}: writes input chunk {} of gpu {} into output chunk {pos} of gpu {r}, which should hold input chunk {} of gpu {s}", at(algo, by), got.idx, got.rank, want.idx),
                        }
                        .into())
                    }
                    Some(_) => {}
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msccl::check_executable;

    const TINY: &str = r#"<algo name="t" proto="Simple" nchannels="1" nchunksperloop="2" ngpus="2" coll="alltoall" inplace="0" outofplace="1" minBytes="0" maxBytes="0">
  <gpu id="0" i_chunks="2" o_chunks="2" s_chunks="0">
    <tb id="0" send="1" recv="-1" chan="0">
      <step s="0" type="s" srcbuf="i" srcoff="1" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
    <tb id="1" send="-1" recv="1" chan="0">
      <step s="0" type="r" srcbuf="i" srcoff="0" dstbuf="o" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
    <tb id="2" send="-1" recv="-1" chan="0">
      <step s="0" type="cpy" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
  </gpu>
  <gpu id="1" i_chunks="2" o_chunks="2" s_chunks="0">
    <tb id="0" send="0" recv="-1" chan="0">
      <step s="0" type="s" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
    <tb id="1" send="-1" recv="0" chan="0">
      <step s="0" type="r" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
    <tb id="2" send="-1" recv="-1" chan="0">
      <step s="0" type="cpy" srcbuf="i" srcoff="1" dstbuf="o" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
  </gpu>
</algo>
"#;

    fn err(text: &str) -> String {
        check_executable(text).unwrap_err().to_string()
    }

    #[test]
    fn tiny_plan_runs() {
        let r = check_executable(TINY).unwrap();
        assert_eq!(r.operations, 4);
        assert_eq!(r.chunks_moved, 2);
        assert!(r.warnings.is_empty());
    }

    #[test]
    fn lexical_rules() {
        assert!(err(&format!("<?xml version=\"1.0\"?>\n{TINY}")).contains("line 1: XML prolog"));
        assert!(err(&TINY.replacen("  <gpu", "\t<gpu", 1)).contains("line 2: tab"));
        assert!(
            err(&TINY.replacen("name=\"t\" proto", "name=\"t\"  proto", 1))
                .contains("exactly one space")
        );
        assert!(err(&TINY.replacen("name=\"t\"", "name='t'", 1)).contains("double quotes"));
        assert!(err(&TINY.replacen("cnt=\"1\"", "cnt=\"01\"", 1)).contains("decimal"));
        assert!(err(&TINY.replacen("/>\n", "/><!-- x -->\n", 1)).contains("one tag per line"));
    }

    #[test]
    fn mispaired_and_wrong_plans_are_rejected() {
        // Gpu 0 receives into the wrong place.
        let e = err(&TINY.replacen("dstoff=\"1\" cnt=\"1\"", "dstoff=\"0\" cnt=\"1\"", 1));
        assert!(
            e.contains(
                "gpu 0: output chunk 1 is never written; it should hold input chunk 0 of gpu 1"
            ),
            "{e}"
        );
        // Gpu 0 sends the wrong chunk.
        let e = err(&TINY.replacen(
            "srcoff=\"1\" dstbuf=\"o\" dstoff=\"0\"",
            "srcoff=\"0\" dstbuf=\"o\" dstoff=\"0\"",
            1,
        ));
        assert!(e.contains("gpu 1, tb 1, step 0: writes input chunk 0 of gpu 0 into output chunk 0 of gpu 1, which should hold input chunk 1 of gpu 0"), "{e}");
        // One receive removed: the send has no partner.
        let no_recv = TINY.replacen(
            "      <step s=\"0\" type=\"r\" srcbuf=\"i\" srcoff=\"0\" dstbuf=\"o\" dstoff=\"1\" cnt=\"1\" depid=\"-1\" deps=\"-1\" hasdep=\"0\"/>\n",
            "",
            1,
        );
        let e = err(&no_recv);
        assert!(e.contains("gpu 1, tb 0, step 0: operation 1 it sends on channel 0 (1 -> 0) has no partner: gpu 0 receives 0 of 1"), "{e}");
        // A dependency on a step that never signals.
        let e = err(&TINY.replacen(
            "depid=\"-1\" deps=\"-1\" hasdep=\"0\"/>\n    </tb>\n    <tb id=\"2\"",
            "depid=\"0\" deps=\"0\" hasdep=\"0\"/>\n    </tb>\n    <tb id=\"2\"",
            1,
        ));
        assert!(e.contains("wait forever"), "{e}");
        assert!(err(&TINY.replacen("cnt=\"1\"", "cnt=\"72\"", 1)).contains("cnt=\"72\""));
    }

    /// Both gpus of two send `steps` steps of `cnt` chunks to each other,
    /// then receive as many, from one tb (three chunks each way).
    fn crossed_sends(proto: &str, steps: u32, cnt: u32) -> String {
        let mut text = format!(
            r#"<algo name="t" proto="{proto}" nchannels="1" nchunksperloop="6" ngpus="2" coll="alltoall" inplace="0" outofplace="1" minBytes="0" maxBytes="0">
"#
        );
        for g in 0..2 {
            let peer = 1 - g;
            text.push_str(&format!("  <gpu id=\"{g}\" i_chunks=\"6\" o_chunks=\"6\" s_chunks=\"0\">\n    <tb id=\"0\" send=\"{peer}\" recv=\"{peer}\" chan=\"0\">\n"));
            for k in 0..steps {
                text.push_str(&format!("      <step s=\"{k}\" type=\"s\" srcbuf=\"i\" srcoff=\"{}\" dstbuf=\"o\" dstoff=\"0\" cnt=\"{cnt}\" depid=\"-1\" deps=\"-1\" hasdep=\"0\"/>\n", peer * 3 + k * cnt));
            }
            for k in 0..steps {
                text.push_str(&format!("      <step s=\"{}\" type=\"r\" srcbuf=\"i\" srcoff=\"0\" dstbuf=\"o\" dstoff=\"{}\" cnt=\"{cnt}\" depid=\"-1\" deps=\"-1\" hasdep=\"0\"/>\n", steps + k, peer * 3 + k * cnt));
            }
            text.push_str(&format!("    </tb>\n    <tb id=\"1\" send=\"-1\" recv=\"-1\" chan=\"0\">\n      <step s=\"0\" type=\"cpy\" srcbuf=\"i\" srcoff=\"{0}\" dstbuf=\"o\" dstoff=\"{0}\" cnt=\"3\" depid=\"-1\" deps=\"-1\" hasdep=\"0\"/>\n    </tb>\n  </gpu>\n", g * 3));
        }
        text.push_str("</algo>\n");
        text
    }

    /// Each operation's dependencies and data after a run.
    type Outcome = Vec<(Vec<u32>, Vec<Origin>)>;

    /// What a run leaves: each operation's dependencies and data, or the error.
    fn outcome(text: &str, order: Order) -> std::result::Result<Outcome, String> {
        let algo = parse::parse_algo(text, "t.xml").map_err(|e| e.to_string())?;
        let l = loaded_run(&algo, "t.xml", order).map_err(|e| e.to_string())?;
        Ok(l.ops.into_iter().map(|o| (o.deps, o.data)).collect())
    }

    #[test]
    fn worklist_run_ends_as_the_sweep_does() {
        use crate::generate::{generate, Pattern, TrafficSpec};
        use crate::msccl::{to_xml, Protocol, XmlOptions};
        use crate::sched::{schedule, Algorithm, Options};
        // Hand-made files: one that runs, deadlocks with one operation per
        // step (Simple) and per chunk only (one 3-chunk step each way), and
        // the same with LL's deeper FIFO, which runs.
        let mut texts = vec![
            TINY.to_string(),
            crossed_sends("Simple", 3, 1),
            crossed_sends("Simple", 1, 3),
            crossed_sends("LL", 3, 1),
        ];
        // Lowered files with waits, relays and FIFO pressure (Simple).
        let topo = crate::Topology::preset("dgx-h100", 2, None).unwrap();
        let mut spec = TrafficSpec::new(16, Pattern::Zipf(1.2));
        spec.bytes = 32 << 10;
        let m = generate(&spec).unwrap();
        for alg in [Algorithm::Fast, Algorithm::Hierarchical] {
            let plan = schedule(alg, &topo, &m, &Options::default()).unwrap();
            let opts = XmlOptions {
                protocol: Some(Protocol::Simple),
                ..XmlOptions::default()
            };
            texts.push(to_xml(&plan, &topo, &m, &opts).unwrap().text);
        }
        for (i, t) in texts.iter().enumerate() {
            let w = outcome(t, Order::Worklist);
            assert_eq!(w, outcome(t, Order::Sweep), "file {i}");
            if let Err(e) = &w {
                assert!(i == 1 || i == 2, "file {i}: {e}");
                assert!(e.contains("deadlock with"), "{e}");
            }
        }
        let per_chunk = outcome(&texts[2], Order::Worklist).unwrap_err();
        assert!(per_chunk.contains("one operation per chunk"), "{per_chunk}");
        assert!(outcome(&texts[1], Order::Worklist).is_err());
        assert!(outcome(&texts[3], Order::Worklist).is_ok());
    }

    #[test]
    fn the_runs_flat_waits_are_each_steps_own_and_stay_met() {
        use crate::generate::{generate, Pattern, TrafficSpec};
        use crate::msccl::{to_xml, XmlOptions};
        use crate::sched::{schedule, Algorithm, Options};
        // A lowered 2x8 file with waits on other tbs.
        let topo = crate::Topology::preset("dgx-h100", 2, None).unwrap();
        let mut spec = TrafficSpec::new(16, Pattern::Zipf(1.2));
        spec.bytes = 32 << 10;
        let m = generate(&spec).unwrap();
        let plan = schedule(Algorithm::Fast, &topo, &m, &Options::default()).unwrap();
        let text = to_xml(&plan, &topo, &m, &XmlOptions::default())
            .unwrap()
            .text;
        let algo = parse::parse_algo(&text, "t.xml").unwrap();
        let l = load(&algo, "t.xml").unwrap();
        let mut state = RunState::new(&l, Mode::PerChunk);
        // Under no flag, half of each tb's and all: the flat layout gives
        // every step the waits `load` read for it.
        let mut waiting = 0;
        for raised in [0, 1, 2] {
            for (gi, g) in algo.gpus.iter().enumerate() {
                for (ti, tb) in g.tbs.iter().enumerate() {
                    state.flag[gi][ti] = tb.steps.len() as i64 * raised / 2 - 1;
                }
            }
            for (gi, g) in algo.gpus.iter().enumerate() {
                for (ti, tb) in g.tbs.iter().enumerate() {
                    for p in 0..tb.steps.len() {
                        let want = l.waits[gi][ti][p]
                            .iter()
                            .copied()
                            .find(|&(t, q)| state.flag[gi][t as usize] < q as i64);
                        assert_eq!(state.waiting(gi, ti, p), want, "gpu {gi} tb {ti} step {p}");
                        waiting += usize::from(want.is_some());
                    }
                }
            }
        }
        assert!(waiting > 0, "the file has waits");
        // Met once, a step's waits are not read again (flags only rise).
        let (gi, ti, p) = (0..algo.gpus.len())
            .flat_map(|gi| (0..algo.gpus[gi].tbs.len()).map(move |ti| (gi, ti)))
            .flat_map(|(gi, ti)| (0..l.waits[gi][ti].len()).map(move |p| (gi, ti, p)))
            .find(|&(gi, ti, p)| !l.waits[gi][ti][p].is_empty())
            .unwrap();
        assert!(!state.still_waiting(gi, ti, p));
        for f in state.flag.iter_mut().flatten() {
            *f = -1;
        }
        assert!(state.waiting(gi, ti, p).is_some());
        assert!(!state.still_waiting(gi, ti, p));
    }

    #[test]
    fn send_then_receive_in_one_tb_deadlocks() {
        // Both gpus send three chunks one by one to each other, then receive,
        // from one tb: with FIFO depth 2 neither reaches its receives.
        let text = crossed_sends("Simple", 3, 1);
        let e = err(&text);
        assert!(
            e.contains(
                "deadlock with one operation per step (small messages) (Simple FIFO depth 2)"
            ),
            "{e}"
        );
        assert!(e.contains("cannot send to gpu 1 on channel 0"), "{e}");
        // LL's FIFO of 8 holds all three.
        check_executable(&text.replacen("proto=\"Simple\"", "proto=\"LL\"", 1)).unwrap();
    }
}
