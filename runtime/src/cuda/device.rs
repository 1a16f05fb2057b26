//! The part of the CUDA backend that talks to the driver and to NCCL
//! (cudarc, loaded at run time, so it builds without CUDA installed).
//!
//! Every driver and NCCL result is checked and turned into a
//! [`RuntimeError`]; the library's presence is tested before the first call,
//! because cudarc panics when it cannot load a library. Event tracking of
//! cudarc is switched off: this module orders the work itself, with the events
//! [`schedule`](super::schedule) assigns.

use std::collections::HashMap;
use std::ffi::c_char;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use cudarc::driver::{
    result, sys, CudaContext, CudaEvent, CudaGraph, CudaSlice, CudaStream, DevicePtr, DriverError,
};
use cudarc::nccl::{group_end, group_start, Comm, Id};
use switchyard_compiler::{Buffer, Layout, Plan, TrafficMatrix};

use super::bootstrap::{fnv1a, GroupEnv, RankVerdict, Rendezvous, ID_LEN};
use super::schedule::{nccl_stages, stream_schedule, StreamSchedule};
use crate::pattern::{check_output, Verdict};
use crate::{iterations, precheck, BackendKind, Mode, RunOptions, RunReport, RuntimeError};

const POISON: u8 = 0xA5;

fn cu(what: &'static str) -> impl Fn(DriverError) -> RuntimeError {
    move |e| RuntimeError::Device(format!("CUDA {what} failed: {e}"))
}

fn nccl(what: &'static str) -> impl Fn(cudarc::nccl::result::NcclError) -> RuntimeError {
    move |e| RuntimeError::Device(format!("NCCL {what} failed: {:?}", e.0))
}

fn slot(b: Buffer) -> usize {
    match b {
        Buffer::Input => 0,
        Buffer::Output => 1,
        Buffer::Scratch => 2,
    }
}

/// Checks that the driver library loads and a device is visible.
fn open_driver() -> Result<usize, RuntimeError> {
    // SAFETY: only tries to dlopen the library; nothing is called through it.
    if !unsafe { sys::is_culib_present() } {
        return Err(RuntimeError::Unavailable(
            "no CUDA driver: libcuda could not be loaded (the cuda backend needs an NVIDIA GPU and driver)"
                .into(),
        ));
    }
    let n = CudaContext::device_count().map_err(|e| {
        RuntimeError::Unavailable(format!("the CUDA driver is present but unusable: {e}"))
    })?;
    if n <= 0 {
        return Err(RuntimeError::Unavailable(
            "no CUDA device is visible".into(),
        ));
    }
    Ok(n as usize)
}

/// Device runs of one process take turns. A graph capture in progress
/// makes context-wide synchronisation (`cuCtxSynchronize`, synchronous
/// copies and frees) fail in every other thread using the device, so two
/// runs at once, one of them capturing, would break each other.
static DEVICE_TURN: Mutex<()> = Mutex::new(());

fn take_turn() -> MutexGuard<'static, ()> {
    // A run that panicked left no state behind the lock: it only orders runs.
    DEVICE_TURN.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs the plan: one process for every rank, or one rank of a process group.
pub fn run(
    plan: &Plan,
    traffic: &TrafficMatrix,
    opts: &RunOptions,
) -> Result<RunReport, RuntimeError> {
    if let Some(f) = opts.inject {
        return Err(RuntimeError::Unavailable(format!(
            "--inject {f} is a test aid of the cpu backend"
        )));
    }
    let devices = open_driver()?;
    let _turn = take_turn();
    match GroupEnv::from_env()? {
        Some(env) if env.world > 1 => run_group(plan, traffic, opts, &env, devices),
        _ => run_single(plan, traffic, opts, devices),
    }
}

/// A process-group rank's three buffers (cudarc slices, which NCCL calls
/// take), with their base addresses.
struct DeviceRank {
    bufs: Vec<CudaSlice<u8>>,
    base: [sys::CUdeviceptr; 3],
}

/// Device memory from `cuMemAlloc` (not a stream-ordered pool), so that
/// `cuCtxEnablePeerAccess` covers it and peer copies go straight over NVLink.
struct DevBuf {
    ctx: Arc<CudaContext>,
    ptr: sys::CUdeviceptr,
}

impl DevBuf {
    /// `len` bytes (at least one) on `ctx`'s device, every byte set to `fill`.
    fn new(ctx: &Arc<CudaContext>, len: usize, fill: u8) -> Result<DevBuf, RuntimeError> {
        ctx.bind_to_thread().map_err(cu("cuCtxSetCurrent"))?;
        // SAFETY: plain allocation; the memset below initialises every byte.
        let ptr = unsafe { result::malloc_sync(len.max(1)) }.map_err(cu("cuMemAlloc"))?;
        let buf = DevBuf {
            ctx: ctx.clone(),
            ptr,
        };
        // SAFETY: `ptr` starts an allocation of at least `len` bytes.
        unsafe { result::memset_d8_sync(ptr, fill, len.max(1)) }.map_err(cu("cuMemsetD8"))?;
        Ok(buf)
    }

    fn upload(&self, host: &[u8]) -> Result<(), RuntimeError> {
        if host.is_empty() {
            return Ok(());
        }
        self.ctx.bind_to_thread().map_err(cu("cuCtxSetCurrent"))?;
        // SAFETY: the allocation holds `host.len()` bytes; the copy is synchronous.
        unsafe { result::memcpy_htod_sync(self.ptr, host) }.map_err(cu("cuMemcpyHtoD"))
    }

    fn download(&self, len: usize) -> Result<Vec<u8>, RuntimeError> {
        let mut host = vec![0u8; len];
        if len > 0 {
            self.ctx.bind_to_thread().map_err(cu("cuCtxSetCurrent"))?;
            // SAFETY: the allocation holds `len` bytes; the copy is synchronous.
            unsafe { result::memcpy_dtoh_sync(&mut host, self.ptr) }.map_err(cu("cuMemcpyDtoH"))?;
        }
        Ok(host)
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        // Errors cannot be reported from here; a failed free leaks device
        // memory until the process ends.
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: allocated by `malloc_sync`, freed once; callers finish
            // every stream that uses it before dropping it.
            let _ = unsafe { result::free_sync(self.ptr) };
        }
    }
}

/// A rank of a single-process run: its device and its three buffers.
struct SingleRank {
    dev: usize,
    bufs: [DevBuf; 3],
}

impl SingleRank {
    fn base(&self, b: Buffer) -> sys::CUdeviceptr {
        self.bufs[slot(b)].ptr
    }
}

/// Allocates a rank's buffers on `stream`'s device, uploads its input and
/// poisons output and scratch. The host input must outlive the upload: the
/// caller synchronises `stream` before dropping `input`.
fn alloc_rank(
    stream: &Arc<CudaStream>,
    input: &[u8],
    sizes: [usize; 3],
) -> Result<DeviceRank, RuntimeError> {
    let mut bufs = Vec::with_capacity(3);
    let mut base = [0; 3];
    for (k, &len) in sizes.iter().enumerate() {
        // SAFETY: the memory is written (upload or memset) before anything reads it.
        let mut s = unsafe { stream.alloc::<u8>(len.max(1)) }.map_err(cu("cuMemAlloc"))?;
        let (ptr, _) = s.device_ptr(stream);
        base[k] = ptr;
        if k == 0 {
            if !input.is_empty() {
                stream
                    .memcpy_htod(input, &mut s)
                    .map_err(cu("cuMemcpyHtoDAsync"))?;
            }
        } else if len > 0 {
            stream
                .context()
                .bind_to_thread()
                .map_err(cu("cuCtxSetCurrent"))?;
            // SAFETY: `ptr` is the start of an allocation of `len` bytes.
            unsafe { result::memset_d8_async(ptr, POISON, len, stream.cu_stream()) }
                .map_err(cu("cuMemsetD8Async"))?;
        }
        bufs.push(s);
    }
    Ok(DeviceRank { bufs, base })
}

/// Copies a rank's output back to the host.
fn download_output(
    stream: &Arc<CudaStream>,
    r: &DeviceRank,
    len: usize,
) -> Result<Vec<u8>, RuntimeError> {
    let mut host = vec![0u8; len];
    if len > 0 {
        stream
            .memcpy_dtoh(&r.bufs[1], &mut host[..])
            .map_err(cu("cuMemcpyDtoHAsync"))?;
        stream.synchronize().map_err(cu("cuStreamSynchronize"))?;
    }
    Ok(host)
}

fn enable_peer_access(ctxs: &[Arc<CudaContext>]) -> Result<(), RuntimeError> {
    for a in ctxs {
        for b in ctxs {
            if a.ordinal() == b.ordinal() {
                continue;
            }
            let mut can = 0;
            // SAFETY: both are valid device handles; `can` is a valid out pointer.
            unsafe { sys::cuDeviceCanAccessPeer(&mut can, a.cu_device(), b.cu_device()) }
                .result()
                .map_err(cu("cuDeviceCanAccessPeer"))?;
            if can == 0 {
                // cuMemcpyPeerAsync still works, staged through the host.
                continue;
            }
            a.bind_to_thread().map_err(cu("cuCtxSetCurrent"))?;
            // SAFETY: `b` is a live context.
            match unsafe { sys::cuCtxEnablePeerAccess(b.cu_ctx(), 0) }.result() {
                Ok(())
                | Err(DriverError(sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED)) => {}
                Err(e) => return Err(cu("cuCtxEnablePeerAccess")(e)),
            }
        }
    }
    Ok(())
}

/// Polls `done` until every event completed, or fails after `timeout`.
fn wait_all(done: &[CudaEvent], timeout: Duration) -> Result<(), RuntimeError> {
    let t0 = Instant::now();
    loop {
        let mut finished = 0;
        for e in done {
            if e.try_is_complete().map_err(cu("cuEventQuery"))? {
                finished += 1;
            }
        }
        if finished == done.len() {
            return Ok(());
        }
        if t0.elapsed() > timeout {
            return Err(RuntimeError::Timeout {
                seconds: t0.elapsed().as_secs_f64(),
                done: finished,
                total: done.len(),
            });
        }
        std::thread::yield_now();
    }
}

/// Every rank in this process: rank `r` on device `r % devices`.
fn run_single(
    plan: &Plan,
    traffic: &TrafficMatrix,
    opts: &RunOptions,
    visible: usize,
) -> Result<RunReport, RuntimeError> {
    let mode = precheck(plan, traffic)?;
    let layout = Layout::new(traffic);
    let ndev = if opts.devices == 0 {
        visible
    } else {
        opts.devices.min(visible)
    };
    if opts.graph && ndev != 1 {
        return Err(RuntimeError::Unavailable(format!(
            "CUDA graphs are built for runs on one device; this run spreads the ranks over {ndev} (use --devices 1)"
        )));
    }
    let ctxs: Vec<Arc<CudaContext>> = (0..ndev)
        .map(|d| CudaContext::new(d).map_err(cu("context creation")))
        .collect::<Result<_, _>>()?;
    for c in &ctxs {
        // SAFETY: this module orders every use of the buffers with its own
        // events and synchronises before freeing them.
        unsafe { c.disable_event_tracking() };
    }
    enable_peer_access(&ctxs)?;
    let n = plan.ranks as usize;
    let mut ranks = Vec::with_capacity(n);
    for r in 0..n {
        let dev = r % ndev;
        let input = crate::input_buffer(traffic, &layout, r)?;
        let ctx = &ctxs[dev];
        let bufs = [
            DevBuf::new(ctx, input.len(), 0)?,
            DevBuf::new(ctx, layout.output_size(r) as usize, POISON)?,
            DevBuf::new(ctx, plan.scratch_bytes(r) as usize, POISON)?,
        ];
        bufs[0].upload(&input)?;
        ranks.push(SingleRank { dev, bufs });
    }
    // The "synchronous" memset and upload may still be in flight on the
    // legacy stream, which the (non-blocking) copy streams do not wait for.
    for c in &ctxs {
        c.synchronize().map_err(cu("cuCtxSynchronize"))?;
    }
    let sched = stream_schedule(plan, opts.channels, mode == Mode::Serial)?;
    let mut streams: HashMap<u32, Arc<CudaStream>> = HashMap::new();
    for s in sched.used_streams() {
        let dev = ranks[sched.issuer(s)].dev;
        streams.insert(s, ctxs[dev].new_stream().map_err(cu("cuStreamCreate"))?);
    }
    let mut events: Vec<Option<CudaEvent>> = (0..sched.events).map(|_| None).collect();
    for op in &sched.ops {
        if let Some(e) = op.record {
            let ctx = streams[&op.stream].context();
            events[e as usize] = Some(ctx.new_event(None).map_err(cu("cuEventCreate"))?);
        }
    }
    let copies = Copies {
        plan,
        sched: &sched,
        streams: &streams,
        events: &events,
        ranks: &ranks,
        ctxs: &ctxs,
    };
    let mut capture_seconds = None;
    let graph = if opts.graph {
        let t0 = Instant::now();
        let captured = copies.capture()?;
        capture_seconds = Some(t0.elapsed().as_secs_f64());
        Some(captured)
    } else {
        None
    };
    let mut best = f64::INFINITY;
    for _ in 0..iterations(mode, opts) {
        let t0 = Instant::now();
        let done: Vec<CudaEvent> = match &graph {
            Some((origin, graph)) => {
                graph.launch().map_err(cu("cuGraphLaunch"))?;
                vec![origin.record_event(None).map_err(cu("cuEventRecord"))?]
            }
            None => {
                copies.issue_all()?;
                streams
                    .values()
                    .map(|s| s.record_event(None).map_err(cu("cuEventRecord")))
                    .collect::<Result<_, _>>()?
            }
        };
        wait_all(&done, opts.timeout)?;
        best = best.min(t0.elapsed().as_secs_f64());
    }
    let mut verdict = Verdict::default();
    for (r, rank) in ranks.iter().enumerate() {
        let out = rank.bufs[1].download(layout.output_size(r) as usize)?;
        verdict.merge(check_output(&out, traffic, &layout, r));
    }
    let mut report = RunReport::new(BackendKind::Cuda, plan, mode);
    report.lanes = streams.len();
    report.capture_seconds = capture_seconds;
    report.finish(best, verdict);
    if opts.reference {
        report.reference_gbps = Some(copy_rate_now(report.link_bytes.total())?);
    }
    Ok(report)
}

/// A single-process run's copies: the plan, its stream schedule, and the
/// streams, events, buffers and contexts they run on.
#[derive(Clone, Copy)]
struct Copies<'a> {
    plan: &'a Plan,
    sched: &'a StreamSchedule,
    streams: &'a HashMap<u32, Arc<CudaStream>>,
    events: &'a [Option<CudaEvent>],
    ranks: &'a [SingleRank],
    ctxs: &'a [Arc<CudaContext>],
}

impl Copies<'_> {
    /// Issues every copy of the schedule once into a CUDA graph: a new stream
    /// on the (one) device starts the capture, every copy stream joins it by
    /// waiting for an event of that stream, the copies are issued as for a
    /// plain run, and the origin waits for every copy stream before the capture
    /// ends. Returns the origin stream (replays go there) and the instantiated,
    /// uploaded graph.
    fn capture(&self) -> Result<(Arc<CudaStream>, CudaGraph), RuntimeError> {
        let streams = self.streams;
        let ctx = &self.ctxs[0];
        let origin = ctx.new_stream().map_err(cu("cuStreamCreate"))?;
        let fork = ctx.new_event(None).map_err(cu("cuEventCreate"))?;
        let joins: Vec<CudaEvent> = streams
            .values()
            .map(|_| ctx.new_event(None).map_err(cu("cuEventCreate")))
            .collect::<Result<_, _>>()?;
        origin
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
            .map_err(cu("cuStreamBeginCapture"))?;
        let issued = (|| {
            fork.record(&origin).map_err(cu("cuEventRecord"))?;
            for s in streams.values() {
                s.wait(&fork).map_err(cu("cuStreamWaitEvent"))?;
            }
            self.issue_all()?;
            for (s, join) in streams.values().zip(&joins) {
                join.record(s).map_err(cu("cuEventRecord"))?;
                origin.wait(join).map_err(cu("cuStreamWaitEvent"))?;
            }
            Ok(())
        })();
        // End the capture on every path, so a failed issue leaves no stream
        // capturing.
        let graph = origin.end_capture(sys::CUgraphInstantiate_flags(0));
        issued?;
        let graph = graph
            .map_err(cu("cuStreamEndCapture"))?
            .ok_or_else(|| RuntimeError::Device("the captured CUDA graph is empty".into()))?;
        graph.upload().map_err(cu("cuGraphUpload"))?;
        origin.synchronize().map_err(cu("cuStreamSynchronize"))?;
        Ok((origin, graph))
    }

    /// Issues every copy of the schedule, with its event waits and records.
    fn issue_all(&self) -> Result<(), RuntimeError> {
        let Copies {
            plan,
            sched,
            streams,
            events,
            ranks,
            ctxs,
        } = *self;
        let event = |e: u32| -> Result<&CudaEvent, RuntimeError> {
            events[e as usize]
                .as_ref()
                .ok_or_else(|| RuntimeError::Device(format!("event {e} was never created")))
        };
        for op in &sched.ops {
            let t = &plan.transfers[op.transfer as usize];
            let stream = &streams[&op.stream];
            for &e in &op.wait {
                stream.wait(event(e)?).map_err(cu("cuStreamWaitEvent"))?;
            }
            let (s, d) = (&ranks[t.src as usize], &ranks[t.dst as usize]);
            let src = s.base(t.src_buf) + t.src_off;
            let dst = d.base(t.dst_buf) + t.dst_off;
            stream
                .context()
                .bind_to_thread()
                .map_err(cu("cuCtxSetCurrent"))?;
            // SAFETY: `precheck` verified that both ranges lie inside their
            // allocations; the buffers live until every stream has finished.
            unsafe {
                if s.dev == d.dev {
                    result::memcpy_dtod_async(dst, src, t.bytes as usize, stream.cu_stream())
                        .map_err(cu("cuMemcpyDtoDAsync"))?;
                } else {
                    result::memcpy_peer_async(
                        ctxs[d.dev].cu_ctx(),
                        dst,
                        ctxs[s.dev].cu_ctx(),
                        src,
                        t.bytes as usize,
                        stream.cu_stream(),
                    )
                    .map_err(cu("cuMemcpyPeerAsync"))?;
                }
            }
            if let Some(e) = op.record {
                event(e)?.record(stream).map_err(cu("cuEventRecord"))?;
            }
        }
        Ok(())
    }
}

/// One rank of a process group: NCCL between ranks, one group per level.
fn run_group(
    plan: &Plan,
    traffic: &TrafficMatrix,
    opts: &RunOptions,
    env: &GroupEnv,
    visible: usize,
) -> Result<RunReport, RuntimeError> {
    if env.world != plan.ranks as usize {
        return Err(RuntimeError::Bootstrap(format!(
            "WORLD_SIZE={} but the plan has {} ranks (one process per rank)",
            env.world, plan.ranks
        )));
    }
    // SAFETY: only tries to dlopen the library.
    if !unsafe { cudarc::nccl::sys::is_culib_present() } {
        return Err(RuntimeError::Unavailable(
            "NCCL could not be loaded: a process group needs `libnccl.so` on the library path (NCCL's development package installs it; with only `libnccl.so.2`, e.g. from pip's nvidia-nccl, link `libnccl.so` to it in a directory on LD_LIBRARY_PATH)".into(),
        ));
    }
    let mode = precheck(plan, traffic)?;
    if mode == Mode::Serial {
        return Err(RuntimeError::InvalidPlan(
            "the plan could race (a double write or an unordered read); across processes only race-free plans run (try the cpu backend to see the damage)".into(),
        ));
    }
    if opts.graph {
        return Err(RuntimeError::Unavailable(
            "CUDA graphs are built for one-process runs only (unset WORLD_SIZE)".into(),
        ));
    }
    let me = env.rank;
    let layout = Layout::new(traffic);
    let ctx = CudaContext::new(env.local_rank % visible).map_err(cu("context creation"))?;
    // SAFETY: one stream carries every use of the buffers, in order.
    unsafe { ctx.disable_event_tracking() };
    let stream = ctx.new_stream().map_err(cu("cuStreamCreate"))?;
    let hash =
        fnv1a(plan.to_json().as_bytes()) ^ fnv1a(traffic.to_json().as_bytes()).rotate_left(1);
    let key = ctx
        .uuid()
        .map_err(cu("cuDeviceGetUuid"))?
        .bytes
        .map(|b| b as u8);
    let (id, mut rendezvous) = Rendezvous::exchange(env, hash, key, opts.timeout, || {
        let id = Id::new().map_err(nccl("ncclGetUniqueId"))?;
        Ok(id.internal().map(|c| c as u8))
    })?;
    let id: [c_char; ID_LEN] = id.map(|b| b as c_char);
    let comm = Comm::from_rank(stream.clone(), me, env.world, Id::uninit(id))
        .map_err(nccl("ncclCommInitRank"))?;
    let input = crate::input_buffer(traffic, &layout, me)?;
    let sizes = [
        input.len(),
        layout.output_size(me) as usize,
        plan.scratch_bytes(me) as usize,
    ];
    let mut rank = alloc_rank(&stream, &input, sizes)?;
    stream.synchronize().map_err(cu("cuStreamSynchronize"))?;
    drop(input);
    let stages = nccl_stages(plan, me as u32)?;
    let mut best = f64::INFINITY;
    for _ in 0..opts.iterations.max(1) {
        let t0 = Instant::now();
        for st in &stages {
            ctx.bind_to_thread().map_err(cu("cuCtxSetCurrent"))?;
            for &i in &st.local {
                let t = &plan.transfers[i as usize];
                let src = rank.base[slot(t.src_buf)] + t.src_off;
                let dst = rank.base[slot(t.dst_buf)] + t.dst_off;
                // SAFETY: ranges verified by `precheck`; one stream orders all uses.
                unsafe {
                    result::memcpy_dtod_async(dst, src, t.bytes as usize, stream.cu_stream())
                }
                .map_err(cu("cuMemcpyDtoDAsync"))?;
            }
            group_start().map_err(nccl("ncclGroupStart"))?;
            for &(i, peer) in &st.sends {
                let t = &plan.transfers[i as usize];
                let (a, b) = (t.src_off as usize, (t.src_off + t.bytes) as usize);
                let view = rank.bufs[slot(t.src_buf)].slice(a..b);
                comm.send(&view, peer as i32).map_err(nccl("ncclSend"))?;
            }
            for &(i, peer) in &st.recvs {
                let t = &plan.transfers[i as usize];
                let (a, b) = (t.dst_off as usize, (t.dst_off + t.bytes) as usize);
                let mut view = rank.bufs[slot(t.dst_buf)].slice_mut(a..b);
                comm.recv(&mut view, peer as i32)
                    .map_err(nccl("ncclRecv"))?;
            }
            group_end().map_err(nccl("ncclGroupEnd"))?;
        }
        let done = stream.record_event(None).map_err(cu("cuEventRecord"))?;
        wait_all(std::slice::from_ref(&done), opts.timeout)?;
        best = best.min(t0.elapsed().as_secs_f64());
    }
    let out = download_output(&stream, &rank, layout.output_size(me) as usize)?;
    let mine = check_output(&out, traffic, &layout, me);
    let mine = RankVerdict {
        bad_bytes: mine.bad_bytes,
        first_bad: mine.first_bad.as_ref().map(|b| b.to_string()),
        bad_iteration: None,
    };
    // Every rank reports the group's verdict.
    let group = rendezvous.finish(&mine, opts.timeout)?;
    let mut report = RunReport::new(BackendKind::Cuda, plan, mode);
    report.lanes = 1;
    report.finish(best, Verdict::default());
    report.bad_bytes = group.bad_bytes;
    report.verified = group.first_bad.is_none() && group.bad_bytes == 0;
    report.first_bad = group.first_bad;
    rank.bufs.clear();
    drop(comm);
    Ok(report)
}

/// Rate of one plain device-to-device copy of `bytes` on device 0 (best of
/// three, timed with events), in GB/s.
pub fn copy_rate(bytes: u64) -> Result<f64, RuntimeError> {
    open_driver()?;
    let _turn = take_turn();
    copy_rate_now(bytes)
}

/// [`copy_rate`] inside a run that holds the turn already.
fn copy_rate_now(bytes: u64) -> Result<f64, RuntimeError> {
    let len = (bytes as usize).max(1);
    let ctx = CudaContext::new(0).map_err(cu("context creation"))?;
    let stream = ctx.new_stream().map_err(cu("cuStreamCreate"))?;
    let a = stream.alloc_zeros::<u8>(len).map_err(cu("cuMemAlloc"))?;
    let mut b = stream.alloc_zeros::<u8>(len).map_err(cu("cuMemAlloc"))?;
    let timing = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
    let mut best = f32::INFINITY;
    for _ in 0..4 {
        let start = stream.record_event(timing).map_err(cu("cuEventRecord"))?;
        stream
            .memcpy_dtod(&a, &mut b)
            .map_err(cu("cuMemcpyDtoDAsync"))?;
        let end = stream.record_event(timing).map_err(cu("cuEventRecord"))?;
        end.synchronize().map_err(cu("cuEventSynchronize"))?;
        best = best.min(start.elapsed_ms(&end).map_err(cu("cuEventElapsedTime"))?);
    }
    Ok(len as f64 / (best as f64 / 1e3) / 1e9)
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_compiler::sched::direct;
    use switchyard_compiler::Topology;

    /// Without a driver every entry point returns one clear error, no panic.
    /// (With a GPU the run must verify instead.)
    #[test]
    fn missing_driver_is_an_error_not_a_panic() {
        let topo = Topology::preset("dgx-h100", 1, Some(2)).unwrap();
        let m = TrafficMatrix::uniform(2, 64);
        let plan = direct(&topo, &m);
        // SAFETY: only tries to dlopen the library.
        let present = unsafe { sys::is_culib_present() };
        match run(&plan, &m, &RunOptions::default()) {
            Err(RuntimeError::Unavailable(msg)) => {
                assert!(msg.contains("CUDA"), "{msg}");
                assert!(matches!(copy_rate(64), Err(RuntimeError::Unavailable(_))));
            }
            Ok(r) => assert!(present && r.verified, "{:?}", r.first_bad),
            Err(e) => {
                panic!("the driver is present (libcuda loaded: {present}) but the run failed: {e}")
            }
        }
    }
}
