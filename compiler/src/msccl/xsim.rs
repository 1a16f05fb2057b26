//! The executor's rules as a plan to price: what NCCL-MSCCL (and RCCL's
//! copy) does with a file, written as transfers the simulator can time.
//!
//! From the executor's source (docs/msccl.md, "The executor's rules"):
//! - a step moves whole chunks, padding included, as calls of at most
//!   `maxAllowedCount` chunks (`msccl_kernel.cu`, `msccl_setup.cc`);
//! - a connection `(chan, A -> B)` is one in-order stream whose FIFO holds
//!   `Protocol::fifo_depth` calls: the sender's call `k` waits until the
//!   receiver has taken call `k - depth` (`prims_simple.h`);
//! - a send step is done once its data is staged in the FIFO, not when it
//!   has arrived (the proxy, `net.cc`, moves it on);
//! - a wait (`depid`/`deps`) holds only the step it is written on, on its
//!   own gpu: a wait on a receive never holds the sender.
//!
//! Each primitive call of an operation becomes one transfer of its share
//! of the whole chunks; each step gets a zero-byte local transfer for
//! "ready" (its tb's previous step and its waits are done), each call one
//! for "staged" (the call before it staged, and the call `window` places
//! earlier on the connection taken by the receiver: arrived, and its
//! receive step ready). A send step is done when its last call is staged,
//! a receive step when all its calls have arrived. Approximation: chunks
//! larger than a call are run as `passes` calls each, operation by
//! operation (the kernel repeats the whole program per slice).

use super::exec::Trace;
use super::{Algo, Protocol};
use crate::plan::{Buffer, Deps, Path, Plan, Transfer};

/// `NCCL_BUFFSIZE`'s default, the Simple protocol's FIFO per connection.
pub const SIMPLE_BUFF_BYTES: u64 = 4 << 20;
/// NCCL's `DEFAULT_LL_BUFFSIZE` (8 lines x 512 threads x 8 steps x 16 bytes).
pub const LL_BUFF_BYTES: u64 = 8 * 512 * 8 * 16;
/// NCCL's `DEFAULT_LL128_BUFFSIZE` (120 elements x 640 threads x 8 steps x 8 bytes).
pub const LL128_BUFF_BYTES: u64 = 120 * 640 * 8 * 8;
/// `NCCL_STEPS`: slots of a connection's FIFO.
pub const NCCL_STEPS: u64 = 8;

/// Bytes one primitive call moves at most (`chunkEffectiveSize` in
/// `mscclSetupCount`): Simple takes 4 of the 8 steps (`MSCCL_CHUNKSTEPS`),
/// LL one step of which half is flags, LL128 one step of which 15/16 is data.
pub fn call_bytes(proto: Protocol) -> u64 {
    match proto {
        Protocol::Simple => SIMPLE_BUFF_BYTES / NCCL_STEPS * (NCCL_STEPS / 2),
        Protocol::LL => LL_BUFF_BYTES / NCCL_STEPS / 2,
        Protocol::LL128 => LL128_BUFF_BYTES / NCCL_STEPS / 16 * 15,
    }
}

/// `maxAllowedCount` for chunks of `chunk_bytes`: `max(1, call / chunk)`,
/// at most 71 (`MSCCL_MAX_COUNT - 1`).
pub fn max_allowed_count(proto: Protocol, chunk_bytes: u64) -> u64 {
    (call_bytes(proto) / chunk_bytes.max(1)).clamp(1, super::MAX_CNT as u64)
}

/// Calls an operation of `cnt` chunks takes: `ceil(cnt / maxAllowedCount)`,
/// times the passes over chunks larger than a call (the kernel's
/// `gridOffset` loop).
pub fn calls(proto: Protocol, cnt: u64, chunk_bytes: u64) -> u64 {
    let passes = chunk_bytes.div_ceil(call_bytes(proto)).max(1);
    cnt.div_ceil(max_allowed_count(proto, chunk_bytes)) * passes
}

/// What the executor-rule plan adds up to.
#[derive(Clone, Debug)]
pub struct ExecutorPlan {
    /// Transfers: one per operation (whole chunks), zero-byte local joins
    /// for steps; paths unset (see [`super::assign_paths`]).
    pub plan: Plan,
    /// Primitive calls between gpus.
    pub calls: u64,
    /// The chunk size the operations were priced with.
    pub chunk_bytes: u64,
    /// The transfer of each operation of the trace (`None` if the run
    /// never reached it).
    pub op_transfer: Vec<Option<u32>>,
    /// Per transfer of `plan`: the call it continues on its connection's
    /// stream (`sim::simulate_streams`); all `None` without
    /// [`Rules::streams`].
    pub after: Vec<Option<u32>>,
}

impl ExecutorPlan {
    /// Simulates the plan with its connections as streams (paths from
    /// `topo`'s routes; [`super::assign_paths`] sets the plan's own).
    pub fn simulate(
        &self,
        topo: &crate::Topology,
        opts: &crate::sim::SimOptions,
    ) -> crate::error::Result<crate::sim::SimResult> {
        crate::sim::simulate_streams(topo, &self.plan, &self.after, opts)
    }
}

/// Which of the executor's rules a pricing applies. [`Rules::EXECUTOR`]
/// is the executor; the others switch one rule back to the plan's, to
/// measure what each rule costs a file (docs/msccl.md, "Where a file's
/// time goes"). Only [`Rules::EXECUTOR`] says what the executor does.
#[derive(Clone, Copy, Debug)]
pub struct Rules<'a> {
    /// A send step is done once staged in the FIFO (the executor); `false`:
    /// when its data has arrived (the plan's rule).
    pub staged_sends: bool,
    /// A connection holds `Protocol::fifo_depth` calls (the executor);
    /// `false`: no limit.
    pub fifo_window: bool,
    /// `None`: operations move whole chunks (the executor); `Some(m)`:
    /// only the bytes of `m` the chunks hold (a block's last chunk short).
    pub real_bytes: Option<&'a crate::TrafficMatrix>,
    /// A connection is one in-order stream (the executor): a call moves
    /// its first byte once the call before it on the connection has
    /// delivered its last, so a connection takes one share of a link and
    /// a ready call's latency hides under the bytes before it; `false`:
    /// each call in flight is a flow of its own (the pricing until
    /// 2026-12-04).
    pub streams: bool,
}

impl Rules<'_> {
    /// The executor's own rules.
    pub const EXECUTOR: Rules<'static> = Rules {
        staged_sends: true,
        fifo_window: true,
        real_bytes: None,
        streams: true,
    };
}

/// The plan the executor runs for `algo` (checked and traced by
/// [`super::exec::run`]) with chunks of `chunk_bytes` bytes.
pub fn executor_plan(algo: &Algo, trace: &Trace, chunk_bytes: u64) -> ExecutorPlan {
    executor_plan_with(algo, trace, chunk_bytes, &Rules::EXECUTOR)
}

/// [`executor_plan`] under `rules`.
pub fn executor_plan_with(
    algo: &Algo,
    trace: &Trace,
    chunk_bytes: u64,
    rules: &Rules,
) -> ExecutorPlan {
    let proto = algo.proto;
    let window = if rules.fifo_window {
        proto.fifo_depth() as u64
    } else {
        u64::MAX
    };
    // Bytes an operation moves: whole chunks, or what they hold.
    let op_bytes = |o: &super::exec::Op| -> u64 {
        let Some(m) = rules.real_bytes else {
            return u64::from(o.cnt) * chunk_bytes;
        };
        o.data
            .iter()
            .filter_map(|x| {
                let (d, c) = trace.map.input_origin(x.rank as usize, x.idx)?;
                let len = m.get(x.rank as usize, d);
                Some(
                    len.saturating_sub(u64::from(c) * chunk_bytes)
                        .min(chunk_bytes),
                )
            })
            .sum()
    };
    let ops = &trace.ops;
    let mut plan = Plan::new("msccl-executor", algo.ngpus as usize, 8);
    let join = |plan: &mut Plan, gpu: u32, deps: Vec<u32>| -> u32 {
        let mut d: Vec<u32> = deps;
        d.sort_unstable();
        d.dedup();
        plan.push(Transfer {
            src: gpu,
            src_buf: Buffer::Output,
            src_off: 0,
            dst: gpu,
            dst_buf: Buffer::Output,
            dst_off: 0,
            bytes: 0,
            path: Path::Local,
            step: 0,
            deps: Deps::from_vec(d),
        })
    };
    let ncalls: Vec<u64> = ops
        .iter()
        .map(|o| calls(proto, u64::from(o.cnt), chunk_bytes))
        .collect();
    // Stream position of each remote operation's first call on its
    // connection, and the operation holding each call position.
    let mut first_call = vec![0u64; ops.len()];
    let mut streams: std::collections::HashMap<(i64, u32, u32), Vec<(u64, u32)>> =
        std::collections::HashMap::new();
    // Sends in the order their tb runs them = the connection's order.
    for (gi, g) in trace.step_ops.iter().enumerate() {
        for (ti, tb) in g.iter().enumerate() {
            let chan = algo.gpus[gi].tbs[ti].chan;
            for so in tb {
                if let Some(x) = so.send {
                    let o = &ops[x as usize];
                    let s = streams.entry((chan, o.src, o.dst)).or_default();
                    let pos = s.last().map_or(0, |&(p, y)| p + ncalls[y as usize]);
                    first_call[x as usize] = pos;
                    s.push((pos, x));
                }
            }
        }
    }
    // Which operation (on the same stream) holds call position `p`.
    let holder = |s: &[(u64, u32)], p: u64| -> u32 {
        let i = s.partition_point(|&(q, _)| q <= p);
        s[i - 1].1
    };
    let stream_of = |x: u32| -> (i64, u32, u32) {
        let o = &ops[x as usize];
        (
            algo.gpus[o.from.gpu as usize].tbs[o.from.tb as usize].chan,
            o.src,
            o.dst,
        )
    };
    // Steps are processed in the order the symbolic run completed them
    // (the step log order is not kept; program order per tb plus waits is
    // acyclic for a file that ran), so a worklist over steps.
    let ng = trace.step_ops.len();
    let mut ready: Vec<Vec<Vec<Option<u32>>>> = trace
        .step_ops
        .iter()
        .map(|g| g.iter().map(|t| vec![None; t.len()]).collect())
        .collect();
    let mut done = ready.clone();
    // Per operation: its transfer, "receiver ready" and "staged" joins.
    let mut t_of: Vec<Option<u32>> = vec![None; ops.len()];
    let mut rr_of: Vec<Option<u32>> = vec![None; ops.len()];
    // Per operation: the transfer of each of its calls.
    let mut call_t: Vec<Vec<u32>> = vec![Vec::new(); ops.len()];
    let mut recv_done: Vec<Option<u32>> = vec![None; ops.len()];
    // (call, the call it continues on its stream).
    let mut after: Vec<(u32, u32)> = Vec::new();
    let mut progress = true;
    while progress {
        progress = false;
        for gi in 0..ng {
            for ti in 0..trace.step_ops[gi].len() {
                for p in 0..trace.step_ops[gi][ti].len() {
                    if done[gi][ti][p].is_some() {
                        continue;
                    }
                    // Ready: the previous step and every awaited step done.
                    let mut deps = Vec::new();
                    if p > 0 {
                        match done[gi][ti][p - 1] {
                            Some(d) => deps.push(d),
                            None => break,
                        }
                    }
                    let mut blocked = false;
                    for &(t, q) in &trace.waits[gi][ti][p] {
                        match done[gi][t as usize][q as usize] {
                            Some(d) => deps.push(d),
                            None => blocked = true,
                        }
                    }
                    if blocked {
                        break;
                    }
                    let so = trace.step_ops[gi][ti][p];
                    let r =
                        *ready[gi][ti][p].get_or_insert_with(|| join(&mut plan, gi as u32, deps));
                    // The receive part: the receiver is ready at `r`; the
                    // step's receive is done when the data is there too.
                    let mut send_ready = r;
                    if let Some(x) = so.recv {
                        let xi = x as usize;
                        rr_of[xi] = Some(r);
                        match t_of[xi] {
                            Some(t) => {
                                let d = join(&mut plan, gi as u32, vec![t, r]);
                                recv_done[xi] = Some(d);
                                send_ready = d;
                            }
                            // Its sender has not started: come back later.
                            None => break,
                        }
                    }
                    let d = if let Some(x) = so.local {
                        let o = &ops[x as usize];
                        let t = plan.push(Transfer {
                            src: o.src,
                            src_buf: Buffer::Input,
                            src_off: 0,
                            dst: o.dst,
                            dst_buf: Buffer::Output,
                            dst_off: 0,
                            bytes: op_bytes(o),
                            path: Path::Local,
                            step: 0,
                            deps: Deps::from_vec(vec![send_ready]),
                        });
                        t_of[x as usize] = Some(t);
                        t
                    } else if let Some(x) = so.send {
                        let xi = x as usize;
                        let o = &ops[xi];
                        let n = ncalls[xi];
                        // FIFO window: call `p` waits until the receiver has
                        // taken call `p - window` of the stream (its data there
                        // and its receive step ready). Calls past the window
                        // need this operation's receiver to exist.
                        let s = &streams[&stream_of(x)];
                        let first = first_call[xi];
                        let needs_receiver =
                            !rules.staged_sends || (window != u64::MAX && n > window);
                        if needs_receiver && rr_of[xi].is_none() {
                            break;
                        }
                        let mut holders = Vec::with_capacity(n as usize);
                        let mut blocked = false;
                        for j in 0..n {
                            let p = first + j;
                            if window == u64::MAX || p < window {
                                holders.push(None);
                                continue;
                            }
                            let y = holder(s, p - window) as usize;
                            let jy = (p - window - first_call[y]) as usize;
                            let taken = if y == xi {
                                // An earlier call of this operation: made below.
                                Some((None, rr_of[xi]))
                            } else {
                                match (call_t[y].get(jy), rr_of[y]) {
                                    (Some(&t), Some(rr)) => Some((Some(t), Some(rr))),
                                    _ => None,
                                }
                            };
                            match taken {
                                Some(h) => holders.push(Some((h, jy))),
                                None => {
                                    blocked = true;
                                    break;
                                }
                            }
                        }
                        if blocked {
                            break;
                        }
                        // The stream: the first call continues the last call
                        // of the operation before it on the connection.
                        let prev = if rules.streams && first > 0 {
                            let y = holder(s, first - 1) as usize;
                            match call_t[y].last() {
                                Some(&t) => Some(t),
                                None => break,
                            }
                        } else {
                            None
                        };
                        // Each call moves its share of the whole chunks (or
                        // of the bytes they hold), staged one after another.
                        let bytes = op_bytes(o);
                        let mut staged = send_ready;
                        let mut ts: Vec<u32> = Vec::with_capacity(n as usize);
                        for (j, h) in holders.into_iter().enumerate() {
                            let mut tdeps = vec![staged];
                            if let Some(((t, rr), jy)) = h {
                                tdeps.push(t.unwrap_or_else(|| ts[jy]));
                                tdeps.extend(rr);
                            }
                            if !rules.staged_sends {
                                tdeps.extend(rr_of[xi]);
                            }
                            staged = join(&mut plan, gi as u32, tdeps);
                            let (a, b) = (bytes * j as u64 / n, bytes * (j as u64 + 1) / n);
                            let t = plan.push(Transfer {
                                src: o.src,
                                src_buf: Buffer::Input,
                                src_off: 0,
                                dst: o.dst,
                                dst_buf: Buffer::Output,
                                dst_off: 0,
                                bytes: b - a,
                                path: Path::Local,
                                step: 0,
                                deps: Deps::from_vec(vec![staged]),
                            });
                            let before = if j == 0 { prev } else { ts.last().copied() };
                            if let Some(p) = before.filter(|_| rules.streams) {
                                after.push((t, p));
                            }
                            ts.push(t);
                        }
                        let arrived = match ts.as_slice() {
                            [t] => *t,
                            _ => join(&mut plan, o.dst, ts.clone()),
                        };
                        t_of[xi] = Some(arrived);
                        call_t[xi] = ts;
                        // Done once its last call is staged (the plan's rule:
                        // once it has arrived).
                        if rules.staged_sends {
                            staged
                        } else {
                            arrived
                        }
                    } else {
                        send_ready
                    };
                    done[gi][ti][p] = Some(d);
                    progress = true;
                }
            }
        }
    }
    let calls_total = ops
        .iter()
        .zip(&ncalls)
        .filter(|(o, _)| o.src != o.dst)
        .map(|(_, &c)| c)
        .sum();
    let mut after_of = vec![None; plan.transfers.len()];
    for (t, p) in after {
        after_of[t as usize] = Some(p);
    }
    ExecutorPlan {
        plan,
        calls: calls_total,
        chunk_bytes,
        op_transfer: t_of,
        after: after_of,
    }
}

/// Completion of `text` run by the executor's rules on `topo`: the file is
/// loaded and run symbolically, then [`executor_plan`] is simulated. The
/// chunk size is the name's `chunk_bytes`, else the largest entry of
/// `traffic` over the largest block's chunks (as the reader takes it).
pub fn simulate_executor(
    text: &str,
    file: &str,
    traffic: &crate::TrafficMatrix,
    topo: &crate::Topology,
    opts: &crate::sim::SimOptions,
) -> crate::error::Result<(f64, ExecutorPlan)> {
    let algo = super::parse_algo(text, file)?;
    simulate_algo(&algo, file, None, traffic, topo, opts)
}

/// [`simulate_executor`] of a parsed file; `chunk_bytes` where the caller
/// knows it (else the file's, else the largest entry over its chunks).
pub fn simulate_algo(
    algo: &Algo,
    file: &str,
    chunk_bytes: Option<u64>,
    traffic: &crate::TrafficMatrix,
    topo: &crate::Topology,
    opts: &crate::sim::SimOptions,
) -> crate::error::Result<(f64, ExecutorPlan)> {
    let trace = super::exec::run(algo, file)?;
    let b = u64::from(trace.map.k.iter().copied().max().unwrap_or(1).max(1));
    let u = chunk_bytes
        .or(trace.facts.chunk_bytes)
        .unwrap_or_else(|| traffic.max_entry().div_ceil(b).max(1));
    simulate_traced(algo, &trace, u, topo, opts)
}

/// [`simulate_algo`] of a file already run by [`super::exec::run`] (the
/// lowering keeps its run, so pricing a candidate file does not repeat it).
pub fn simulate_traced(
    algo: &Algo,
    trace: &Trace,
    chunk_bytes: u64,
    topo: &crate::Topology,
    opts: &crate::sim::SimOptions,
) -> crate::error::Result<(f64, ExecutorPlan)> {
    let mut x = executor_plan(algo, trace, chunk_bytes);
    super::assign_paths(&mut x.plan, topo);
    let r = x.simulate(topo, opts)?;
    Ok((r.completion_us, x))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_follow_max_allowed_count() {
        // Simple: 2 MiB per call; 64 KiB chunks give 32 chunks a call.
        assert_eq!(call_bytes(Protocol::Simple), 2 << 20);
        assert_eq!(max_allowed_count(Protocol::Simple, 64 << 10), 32);
        assert_eq!(calls(Protocol::Simple, 71, 64 << 10), 3);
        // Tiny chunks: at most 71 a call.
        assert_eq!(max_allowed_count(Protocol::Simple, 16), 71);
        // A chunk larger than a call: one chunk a call, several passes.
        assert_eq!(calls(Protocol::Simple, 3, 5 << 20), 9);
        assert_eq!(call_bytes(Protocol::LL), 32 << 10);
    }
}
