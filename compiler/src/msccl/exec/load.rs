//! Loading a parsed file as the executor does: the loader's checks (ids,
//! peers, channels, one owner tb per connection, step limits, `cnt`,
//! `depid`, nops, buffer bounds), the k-th send on each connection paired
//! with its k-th receive, and the dependencies between the operations once
//! a run has ordered the steps.

use smallvec::SmallVec;
use std::collections::HashMap;

use crate::error::{InputError, Result};
use crate::msccl::{parse, Algo, BufRef, ChunkMap, StepKind};
use crate::msccl::{MAX_CHANNELS_ANY, MAX_CNT, MAX_NODES, MAX_OFFSET, MAX_PEER_TBS_PER_CHANNEL};
use crate::msccl::{MAX_STEPS_PER_TB, MAX_TBS_PER_GPU};

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
    pub(super) fn of(gi: usize, ti: usize, p: usize) -> StepRef {
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

impl Op {
    /// `cnt` chunks from (gpu, buffer, offset) to (gpu, buffer, offset),
    /// moved by the (sending or copying, receiving) steps; its dependencies
    /// and data come later. (Offsets and counts are checked against the
    /// buffers before pairing.)
    fn new(
        (src, src_buf, src_off): (u32, BufRef, i64),
        (dst, dst_buf, dst_off): (u32, BufRef, i64),
        cnt: i64,
        (from, to): (StepRef, StepRef),
    ) -> Op {
        Op {
            src,
            src_buf,
            src_off: src_off as u32,
            dst,
            dst_buf,
            dst_off: dst_off as u32,
            cnt: cnt as u32,
            deps: Vec::new(),
            data: Vec::new(),
            from,
            to,
        }
    }
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

/// Per step: the `(tb index, position)` flags it waits for.
pub(crate) type StepWaits = PerStep<Vec<(u32, u32)>>;

/// The structure the loader builds: indices, pairing, dependencies.
pub(super) struct Loaded<'a> {
    pub(super) algo: &'a Algo,
    pub(super) file: &'a str,
    pub(super) step_ops: PerStep<StepOps>,
    pub(super) ops: Vec<Op>,
    /// Per step: `(tb index, position)` flags it waits for, nops folded in.
    pub(super) waits: StepWaits,
    /// Per connection `(chan, from gpu, to gpu)`: the owning tbs.
    pub(super) fifo_ids: HashMap<(u32, u32, u32), usize>,
    /// Steps in the order the one-operation-per-step run completed them.
    pub(super) step_log: Vec<(u32, u32, u32)>,
    pub(super) map: ChunkMap,
    pub(super) warnings: Vec<String>,
}

pub(super) fn step_line(algo: &Algo, g: usize, t: usize, p: usize) -> usize {
    algo.gpus[g].tbs[t].steps[p].line
}

/// `gpu 3, tb 5, step 2`
pub(super) fn at(algo: &Algo, r: StepRef) -> String {
    let gpu = &algo.gpus[r.gpu as usize];
    format!(
        "gpu {}, tb {}, step {}",
        gpu.id, gpu.tbs[r.tb as usize].id, r.pos
    )
}

pub(super) fn load<'a>(algo: &'a Algo, file: &'a str) -> Result<Loaded<'a>> {
    check_header(algo, file)?;
    let map = parse::chunk_map(algo, file)?;
    check_gpu_ids(algo, file)?;
    let conns = check_tbs(algo, file)?;
    let mut warnings = conns.warnings;
    let (waits, targets) = check_steps(algo, file, &conns.tb_of_id)?;
    warn_unwaited(algo, &targets, &mut warnings);
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
    pair(&mut l, &conns.senders, &conns.receivers)?;
    Ok(l)
}

/// An input error at `line` of `file`.
fn at_line(file: &str, line: usize, reason: String) -> crate::error::Error {
    InputError::at(file, format!("line {line}"), reason).into()
}

/// The `<algo>` element's own attributes: ranks, collective, chunks per
/// loop, channels, size window, in-place flags.
fn check_header(algo: &Algo, file: &str) -> Result<()> {
    let err = |line: usize, reason: String| at_line(file, line, reason);
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
    Ok(())
}

/// Every rank has exactly one `<gpu>`, listed in rank order.
fn check_gpu_ids(algo: &Algo, file: &str) -> Result<()> {
    let err = |line: usize, reason: String| at_line(file, line, reason);
    let n = algo.ngpus;
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
    Ok(())
}

/// What the tbs' checks leave: tb index by id per gpu, each connection's
/// owners, and warnings.
struct Connections {
    /// Per gpu: the tb index of each tb id.
    tb_of_id: Vec<Vec<u32>>,
    /// `(chan, from, to)` -> the owning send tb `(g, t)`.
    senders: HashMap<(u32, u32, u32), (u32, u32)>,
    /// `(chan, from, to)` -> the owning receive tb `(g, t)`.
    receivers: HashMap<(u32, u32, u32), (u32, u32)>,
    warnings: Vec<String>,
}

/// Every gpu's buffers, element count and tbs: ids, peers, channels, one
/// owner per connection, steps per tb, peer tbs per channel.
fn check_tbs(algo: &Algo, file: &str) -> Result<Connections> {
    let err = |line: usize, reason: String| at_line(file, line, reason);
    let n = algo.ngpus;
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
    Ok(Connections {
        tb_of_id,
        senders,
        receivers,
        warnings,
    })
}

/// Every step: position, kind, `cnt`, peers, buffer bounds, `depid`,
/// nops. Returns each step's waits (nops folded in) and, per step,
/// whether some step waits for it.
fn check_steps(
    algo: &Algo,
    file: &str,
    tb_of_id: &[Vec<u32>],
) -> Result<(StepWaits, PerStep<bool>)> {
    let err = |line: usize, reason: String| at_line(file, line, reason);
    // Steps: attributes, bounds, nops, dependencies.
    let mut waits: StepWaits = Vec::with_capacity(algo.gpus.len());
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
    Ok((waits, targets))
}

/// A warning for each signalling step (`hasdep="1"`) no step waits for.
fn warn_unwaited(algo: &Algo, targets: &PerStep<bool>, warnings: &mut Vec<String>) {
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
}

/// Matches the k-th send on each connection with its k-th receive, and
/// numbers local copies.
fn pair(
    l: &mut Loaded<'_>,
    senders: &HashMap<(u32, u32, u32), (u32, u32)>,
    receivers: &HashMap<(u32, u32, u32), (u32, u32)>,
) -> Result<()> {
    let algo = l.algo;
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
        let (s, r) = (senders.get(&key).copied(), receivers.get(&key).copied());
        let sends = s.map_or_else(Vec::new, |(g, t)| moving(g, t, StepKind::sends));
        let recvs = r.map_or_else(Vec::new, |(g, t)| moving(g, t, StepKind::recvs));
        let fid = l.fifo_ids.len();
        l.fifo_ids.insert(key, fid);
        if sends.len() != recvs.len() {
            return Err(unpaired(l, key, (s, &sends), (r, &recvs)));
        }
        let (Some(s), Some(r)) = (s, r) else {
            continue; // both lists empty: a declared but unused connection
        };
        pair_connection(l, key, (s, &sends), (r, &recvs))?;
    }
    number_copies(l);
    Ok(())
}

/// The error for connection `key` = (channel, from, to) whose sender's
/// `sends` and receiver's `recvs` (step positions in their tbs, `s` and
/// `r`) differ in number: the first operation without a partner.
fn unpaired(
    l: &Loaded<'_>,
    (chan, from, to): (u32, u32, u32),
    (s, sends): (Option<(u32, u32)>, &[u32]),
    (r, recvs): (Option<(u32, u32)>, &[u32]),
) -> crate::error::Error {
    let algo = l.algo;
    // (the tb with one too many, the position of its first lonely step,
    // what it does, its peer, what the peer does, the peer's tb, how many
    // the peer has, how many it would need)
    let (mine, pos, side, peer, verb, other, have, want) = if sends.len() > recvs.len() {
        (
            s,
            sends[recvs.len()],
            "sends",
            to,
            "receives",
            r,
            recvs.len(),
            sends.len(),
        )
    } else {
        (
            r,
            recvs[sends.len()],
            "receives",
            from,
            "sends",
            s,
            sends.len(),
            recvs.len(),
        )
    };
    // A side with steps has a tb.
    let (g, t) = mine.unwrap_or_default();
    let lonely = StepRef { gpu: g, tb: t, pos };
    let other_tb = match other {
        Some((g, t)) => format!("its tb {} ", algo.gpus[g as usize].tbs[t as usize].id),
        None => "no tb ".into(),
    };
    InputError::at(
        l.file,
        format!(
            "line {}",
            step_line(algo, g as usize, t as usize, pos as usize)
        ),
        format!(
            "{}: operation {} it {side} on channel {chan} ({from} -> {to}) has no partner: gpu {peer} {verb} {have} of {want} there ({other_tb}on that channel)",
            at(algo, lonely),
            have + 1,
        ),
    )
    .into()
}

/// One operation per (send, receive) of connection `key` = (channel,
/// from, to), the k-th send with the k-th receive; their counts must
/// agree.
fn pair_connection(
    l: &mut Loaded<'_>,
    (chan, from, to): (u32, u32, u32),
    ((sg, st), sends): ((u32, u32), &[u32]),
    ((rg, rt), recvs): ((u32, u32), &[u32]),
) -> Result<()> {
    let algo = l.algo;
    for (k, (&ps, &pr)) in sends.iter().zip(recvs).enumerate() {
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
            return Err(InputError::at(l.file, format!("line {}", b.line), format!(
                "{}: receive {k} on channel {chan} from gpu {from} has cnt=\"{}\" but its send ({}, line {}) has cnt=\"{}\"",
                at(algo, to_ref), b.cnt, at(algo, from_ref), a.line, a.cnt
            ))
            .into());
        }
        // A forwarding step sends what it just wrote into its dst.
        let (src_buf, src_off) = if a.kind.reads_src() {
            (a.srcbuf, a.srcoff)
        } else {
            (a.dstbuf, a.dstoff)
        };
        let id = l.ops.len() as u32;
        l.ops.push(Op::new(
            (from, src_buf, src_off),
            (to, b.dstbuf, b.dstoff),
            a.cnt,
            (from_ref, to_ref),
        ));
        l.step_ops[sg as usize][st as usize][ps as usize].send = Some(id);
        l.step_ops[rg as usize][rt as usize][pr as usize].recv = Some(id);
    }
    Ok(())
}

/// One operation per local copy that moves anything.
fn number_copies(l: &mut Loaded<'_>) {
    let algo = l.algo;
    for (gi, g) in algo.gpus.iter().enumerate() {
        for (ti, tb) in g.tbs.iter().enumerate() {
            for (p, st) in tb.steps.iter().enumerate() {
                if st.kind == StepKind::Copy && st.cnt > 0 {
                    let here = StepRef::of(gi, ti, p);
                    let id = l.ops.len() as u32;
                    let gpu = g.id as u32;
                    l.ops.push(Op::new(
                        (gpu, st.srcbuf, st.srcoff),
                        (gpu, st.dstbuf, st.dstoff),
                        st.cnt,
                        (here, here),
                    ));
                    l.step_ops[gi][ti][p].local = Some(id);
                }
            }
        }
    }
}

/// Dependencies between operations: program order in each tb, the
/// dependency flags, and a forwarding step's receive before its send. Sends
/// count as delivered when they finish (what a plan's transfer means, and
/// what the lowering intends) unless that makes a cycle, which a file whose
/// sends only run ahead in the FIFO can have; then a send is only known to
/// have left.
pub(super) fn link_deps(l: &mut Loaded<'_>) {
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
