//! The part of the CUDA backend that talks to the driver and to NCCL
//! (cudarc, loaded at run time, so it builds without CUDA installed).
//!
//! Every driver and NCCL result is checked and turned into a
//! [`RuntimeError`]; the libraries' presence is tested before the first
//! call, because cudarc panics when it cannot load a library (and NCCL's
//! version before the first call that older NCCLs lack, since cudarc panics
//! on a missing symbol too). Event tracking of cudarc is switched off: this
//! module orders the work itself, with the events
//! [`schedule`](super::schedule) assigns.
//!
//! Nothing here waits without a limit. Copies and NCCL kernels are awaited
//! by polling events against the watchdog ([`Watchdog`]: nothing finished
//! for `--timeout`); NCCL's communicator is non-blocking, so its
//! initialisation, group ends and teardown are polled with
//! `ncclCommGetAsyncError` against the same limit, and it is aborted on any
//! failure. Device buffers belong to a [`Guard`], which frees them only
//! after every stream that may use them has finished, on every exit path.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use cudarc::driver::{result, sys, CudaContext, CudaEvent, CudaGraph, CudaStream, DriverError};
use cudarc::nccl::{result as nccl_result, sys as nccl_sys};
use switchyard_compiler::{Buffer, Layout, Plan, TrafficMatrix};

use super::bootstrap::{fnv1a, GroupEnv, RankVerdict, Rendezvous, KEY_LEN};
use super::schedule::{loopback, nccl_stages, reversed_schedule, stream_schedule, StreamSchedule};
use super::watchdog::Watchdog;
use super::{devices_to_open, nccl_version, visible_devices_var, NCCL_MIN};
use crate::pattern::{check_output, Verdict};
use crate::{
    available_host_memory, check_memory, iterations, precheck, rank_bytes, BackendKind, Checks,
    Inject, Mode, RunOptions, RunReport, RuntimeError,
};

const POISON: u8 = 0xA5;

fn cu(what: &'static str) -> impl Fn(DriverError) -> RuntimeError {
    move |e| RuntimeError::Device(format!("CUDA {what} failed: {e}"))
}

/// NCCL's own words for `r`: the enum name, `ncclGetErrorString`, and the
/// message of NCCL's last warning (`ncclGetLastError`) when it has one.
/// Only called once NCCL's version is known to have both (2.13 and later).
fn nccl_text(r: nccl_sys::ncclResult_t) -> String {
    let text = |p: *const c_char| {
        if p.is_null() {
            String::new()
        } else {
            // SAFETY: NCCL returns NUL-terminated strings it owns (static
            // strings, or its last-error buffer), or null.
            unsafe { CStr::from_ptr(p) }
                .to_string_lossy()
                .trim()
                .to_string()
        }
    };
    // SAFETY: plain queries; `ncclGetLastError` ignores its argument.
    let what = text(unsafe { nccl_sys::ncclGetErrorString(r) });
    let last = text(unsafe { nccl_sys::ncclGetLastError(std::ptr::null_mut()) });
    let mut s = format!("{r:?}: {what}");
    if !last.is_empty() {
        s += &format!(" (NCCL: {last})");
    }
    s
}

fn nccl_err(what: &str, r: nccl_sys::ncclResult_t) -> RuntimeError {
    RuntimeError::Device(format!("NCCL {what} failed: {}", nccl_text(r)))
}

fn slot(b: Buffer) -> usize {
    match b {
        Buffer::Input => 0,
        Buffer::Output => 1,
        Buffer::Scratch => 2,
    }
}

/// Checks that the driver library loads and a device is visible; returns
/// how many are.
fn open_driver() -> Result<usize, RuntimeError> {
    // SAFETY: only tries to dlopen the library; nothing is called through it.
    if !unsafe { sys::is_culib_present() } {
        return Err(RuntimeError::Unavailable(
            "no CUDA driver: libcuda could not be loaded (the cuda backend needs an NVIDIA GPU and driver)"
                .into(),
        ));
    }
    let none = || {
        RuntimeError::Unavailable(format!(
            "no CUDA device is visible (CUDA_VISIBLE_DEVICES={})",
            visible_devices_var()
        ))
    };
    let n = CudaContext::device_count().map_err(|e| match e {
        DriverError(sys::CUresult::CUDA_ERROR_NO_DEVICE) => none(),
        e => RuntimeError::Unavailable(format!("the CUDA driver is present but unusable: {e}")),
    })?;
    if n <= 0 {
        return Err(none());
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
    let devices = open_driver()?;
    let _turn = take_turn();
    match GroupEnv::from_env()? {
        Some(env) if env.world > 1 => run_group(plan, traffic, opts, &env, devices),
        _ if opts.nccl_loopback => run_group(plan, traffic, opts, &GroupEnv::alone(), devices),
        _ => run_single(plan, traffic, opts, devices),
    }
}

/// Device memory from `cuMemAlloc` (not a stream-ordered pool), so that
/// `cuCtxEnablePeerAccess` covers it and peer copies go straight over NVLink.
/// Only a [`Guard`] owns these.
struct DevBuf {
    ctx: Arc<CudaContext>,
    ptr: sys::CUdeviceptr,
    /// Bytes the plan uses (the allocation holds at least one).
    len: usize,
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
            len,
        };
        buf.fill(fill)?;
        Ok(buf)
    }

    /// Sets every byte to `byte`, on the context's legacy stream (callers
    /// wait for it with [`Guard::wait_legacy`] before issuing copies).
    fn fill(&self, byte: u8) -> Result<(), RuntimeError> {
        self.ctx.bind_to_thread().map_err(cu("cuCtxSetCurrent"))?;
        // SAFETY: `ptr` starts an allocation of at least `len.max(1)` bytes.
        unsafe { result::memset_d8_sync(self.ptr, byte, self.len.max(1)) }.map_err(cu("cuMemsetD8"))
    }

    fn upload(&self, host: &[u8]) -> Result<(), RuntimeError> {
        if host.is_empty() {
            return Ok(());
        }
        debug_assert!(host.len() <= self.len);
        self.ctx.bind_to_thread().map_err(cu("cuCtxSetCurrent"))?;
        // SAFETY: the allocation holds `host.len()` bytes; the copy is
        // synchronous for the host memory (the device side is awaited with
        // `Guard::wait_legacy`).
        unsafe { result::memcpy_htod_sync(self.ptr, host) }.map_err(cu("cuMemcpyHtoD"))
    }

    /// The first `len` bytes, copied to the host. Callers have waited for
    /// every stream that writes the buffer.
    fn download(&self, len: usize) -> Result<Vec<u8>, RuntimeError> {
        let mut host = crate::host_buffer(len as u64, 0, "a downloaded output")?;
        if len > 0 {
            debug_assert!(len <= self.len);
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
            // SAFETY: allocated by `malloc_sync`, freed once; the owning
            // `Guard` has seen every stream that may use it finish.
            let _ = unsafe { result::free_sync(self.ptr) };
        }
    }
}

/// Owns a run's device buffers, and the streams and NCCL communicator that
/// may use them, and releases them in a safe order on every exit path
/// (errors, timeouts and unwinding included): first the communicator is
/// aborted (so that NCCL kernels waiting for a peer quit), then the host
/// waits until every stream, and every context's legacy stream, has
/// finished, by the watchdog's rule (nothing finished for `grace`), and
/// only then are the buffers freed. When that wait fails (a copy hangs, a
/// context is broken), the buffers and their contexts are leaked instead:
/// freeing memory that a peer copy issued on another device's stream may
/// still read or write is undefined behaviour, and the process is about to
/// report an error anyway.
struct Guard {
    ctxs: Vec<Arc<CudaContext>>,
    streams: Vec<Arc<CudaStream>>,
    bufs: Vec<DevBuf>,
    comm: Option<NcclComm>,
    /// How long the final wait may see nothing finish.
    grace: Duration,
}

impl Guard {
    fn new(ctxs: Vec<Arc<CudaContext>>, grace: Duration) -> Guard {
        Guard {
            ctxs,
            streams: Vec::new(),
            bufs: Vec::new(),
            comm: None,
            grace,
        }
    }

    /// A new non-blocking stream on `ctx`, awaited before buffers are freed.
    fn stream(&mut self, ctx: &Arc<CudaContext>) -> Result<Arc<CudaStream>, RuntimeError> {
        let s = ctx.new_stream().map_err(cu("cuStreamCreate"))?;
        self.streams.push(s.clone());
        Ok(s)
    }

    /// A new buffer of `len` bytes set to `fill`; returns its index.
    fn buffer(
        &mut self,
        ctx: &Arc<CudaContext>,
        len: usize,
        fill: u8,
    ) -> Result<usize, RuntimeError> {
        self.bufs.push(DevBuf::new(ctx, len, fill)?);
        Ok(self.bufs.len() - 1)
    }

    /// Waits for the work on every context's legacy stream (memsets and
    /// uploads), which the non-blocking copy streams do not wait for.
    fn wait_legacy(&self, timeout: Duration) -> Result<(), RuntimeError> {
        let legacy: Vec<Arc<CudaStream>> = self.ctxs.iter().map(|c| c.default_stream()).collect();
        wait_streams(&legacy, timeout)
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        // Abort first: a kernel waiting for a peer that will never come ends.
        drop(self.comm.take());
        if self.bufs.is_empty() {
            return;
        }
        let all: Vec<Arc<CudaStream>> = self
            .streams
            .iter()
            .cloned()
            .chain(self.ctxs.iter().map(|c| c.default_stream()))
            .collect();
        if wait_streams(&all, self.grace).is_err() {
            // Each buffer holds its context, so the contexts stay too.
            std::mem::forget(std::mem::take(&mut self.bufs));
        }
    }
}

/// Waits until the work issued so far on every stream of `streams` has
/// finished, by the watchdog's rule.
fn wait_streams(streams: &[Arc<CudaStream>], timeout: Duration) -> Result<(), RuntimeError> {
    let done: Vec<CudaEvent> = streams
        .iter()
        .map(|s| s.record_event(None).map_err(cu("cuEventRecord")))
        .collect::<Result<_, _>>()?;
    wait_progress(&[], &done, timeout, || Ok(()))
}

/// Polls until every event of `done` has completed. Fails with
/// [`RuntimeError::Timeout`] when neither a `done` event nor a progress
/// marker completes for `timeout` (the watchdog measures "nothing finished",
/// not total time), and with `poll`'s error (a failed NCCL communicator)
/// at once. Markers are polled every 10 ms, `done` continuously, so that
/// the time measured around this wait stays tight.
fn wait_progress(
    markers: &[&CudaEvent],
    done: &[CudaEvent],
    timeout: Duration,
    mut poll: impl FnMut() -> Result<(), RuntimeError>,
) -> Result<(), RuntimeError> {
    const MARKER_POLL: Duration = Duration::from_millis(10);
    let t0 = Instant::now();
    let mut dog = Watchdog::new(timeout, t0);
    let mut markers_seen = 0;
    let mut last_marker_poll = t0;
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
        let now = Instant::now();
        if now.duration_since(last_marker_poll) >= MARKER_POLL || dog.expired(now) {
            last_marker_poll = now;
            markers_seen = 0;
            for m in markers {
                if m.try_is_complete().map_err(cu("cuEventQuery"))? {
                    markers_seen += 1;
                }
            }
            poll()?;
            dog.observe(finished + markers_seen, now, finished, done.len())?;
        } else if finished > 0 {
            dog.observe(finished + markers_seen, now, finished, done.len())?;
        }
        std::thread::yield_now();
    }
}

/// A rank of a single-process run: where it lives (an index into the
/// run's contexts), its buffers (indices into the guard) and their bases.
struct SingleRank {
    place: usize,
    bufs: [usize; 3],
    base: [sys::CUdeviceptr; 3],
}

impl SingleRank {
    fn base(&self, b: Buffer) -> sys::CUdeviceptr {
        self.base[slot(b)]
    }
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

/// Every rank in this process: rank `r` on device `r % devices`.
fn run_single(
    plan: &Plan,
    traffic: &TrafficMatrix,
    opts: &RunOptions,
    visible: usize,
) -> Result<RunReport, RuntimeError> {
    let mode = precheck(plan, traffic)?;
    let layout = Layout::new(traffic);
    let n = plan.ranks as usize;
    // Only devices that get a rank are opened, and peer access is enabled
    // only among them.
    let ndev = devices_to_open(visible, opts.devices, n);
    if opts.graph && (ndev != 1 || (opts.context_per_rank && n > 1)) {
        return Err(RuntimeError::Unavailable(format!(
            "CUDA graphs are built for runs in one context on one device; this run uses {} (use --devices 1, without --context-per-rank)",
            if ndev != 1 {
                format!("{ndev} devices")
            } else {
                format!("{n} contexts")
            }
        )));
    }
    if opts.context_per_rank {
        // `CudaContext::new_non_primary` calls `cuCtxCreate_v4`: cudarc
        // would panic on an older driver that lacks it.
        let mut v = 0;
        // SAFETY: a valid out pointer; the driver library is loaded.
        unsafe { sys::cuDriverGetVersion(&mut v) }
            .result()
            .map_err(cu("cuDriverGetVersion"))?;
        if v < 12050 {
            return Err(RuntimeError::Unavailable(format!(
                "--context-per-rank needs a driver for CUDA 12.5 or newer (cuCtxCreate_v4); this one is for CUDA {}.{}",
                v / 1000,
                v % 1000 / 10
            )));
        }
    }
    // The host holds one rank's input and one rank's output at a time.
    let host_need = (0..n)
        .map(|r| layout.input_size(r))
        .max()
        .unwrap_or(0)
        .saturating_add((0..n).map(|r| layout.output_size(r)).max().unwrap_or(0));
    check_memory(
        || "one rank's input and one rank's output on the host".into(),
        host_need,
        available_host_memory(),
        "host memory (MemAvailable)",
    )?;
    // One context per device (its primary one), or with
    // `context_per_rank` one non-primary context per rank, rank r's on
    // device r % ndev. Rank r lives in context r % ctxs.len().
    let ctxs: Vec<Arc<CudaContext>> = if opts.context_per_rank {
        (0..n.max(1))
            .map(|r| CudaContext::new_non_primary(r % ndev, 0).map_err(cu("cuCtxCreate")))
            .collect::<Result<_, _>>()?
    } else {
        (0..ndev)
            .map(|d| CudaContext::new(d).map_err(cu("context creation")))
            .collect::<Result<_, _>>()?
    };
    for c in &ctxs {
        // SAFETY: this module orders every use of the buffers with its own
        // events, and the guard waits for every stream before freeing them.
        unsafe { c.disable_event_tracking() };
    }
    // Refuse at once, with the figure, what the devices cannot hold
    // (context d is on device d either way).
    for (d, ctx) in ctxs.iter().take(ndev).enumerate() {
        let on_d: Vec<usize> = (d..n).step_by(ndev).collect();
        let need = on_d
            .iter()
            .map(|&r| rank_bytes(plan, &layout, r))
            .fold(0u64, u64::saturating_add);
        let (free, _) = ctx.mem_get_info().map_err(cu("cuMemGetInfo"))?;
        check_memory(
            || format!("the buffers of the {} ranks on device {d}", on_d.len()),
            need,
            Some(free as u64),
            &format!("memory on device {d} (free, cuMemGetInfo)"),
        )?;
    }
    enable_peer_access(&ctxs)?;
    let mut guard = Guard::new(ctxs.clone(), opts.timeout);
    let result = single_runs(plan, traffic, opts, mode, &layout, &ctxs, &mut guard);
    if let Err(RuntimeError::Timeout { .. }) = result {
        // The copies already made no progress for the whole timeout: do not
        // wait for them again, leave their buffers be.
        guard.grace = Duration::ZERO;
    }
    drop(guard);
    result
}

/// The body of [`run_single`]: buffers, streams, events, the iterations
/// and the check. Everything that may touch device memory lives in `guard`.
fn single_runs(
    plan: &Plan,
    traffic: &TrafficMatrix,
    opts: &RunOptions,
    mode: Mode,
    layout: &Layout,
    ctxs: &[Arc<CudaContext>],
    guard: &mut Guard,
) -> Result<RunReport, RuntimeError> {
    let n = plan.ranks as usize;
    let mut ranks = Vec::with_capacity(n);
    for r in 0..n {
        let place = r % ctxs.len();
        let ctx = &ctxs[place];
        let input = crate::input_buffer(traffic, layout, r)?;
        let bufs = [
            guard.buffer(ctx, input.len(), 0)?,
            guard.buffer(ctx, layout.output_size(r) as usize, POISON)?,
            guard.buffer(ctx, plan.scratch_bytes(r) as usize, POISON)?,
        ];
        guard.bufs[bufs[0]].upload(&input)?;
        let base = bufs.map(|b| guard.bufs[b].ptr);
        ranks.push(SingleRank { place, bufs, base });
    }
    guard.wait_legacy(opts.timeout)?;
    let sched = match opts.inject {
        Some(Inject::ReverseOrder) => reversed_schedule(plan),
        None => stream_schedule(plan, opts.channels, mode == Mode::Serial)?,
    };
    let mut streams: HashMap<u32, Arc<CudaStream>> = HashMap::new();
    for s in sched.used_streams() {
        let place = ranks[sched.issuer(s)].place;
        streams.insert(s, guard.stream(&ctxs[place])?);
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
        ctxs,
    };
    let mut capture_seconds = None;
    let graph = if opts.graph {
        let t0 = Instant::now();
        let origin = guard.stream(&ctxs[0])?;
        let captured = copies.capture(origin, opts.timeout)?;
        capture_seconds = Some(t0.elapsed().as_secs_f64());
        Some(captured)
    } else {
        None
    };
    // Progress markers for the watchdog: the dependency events (inside a
    // graph they became edges, so a replay has only its end).
    let markers: Vec<&CudaEvent> = match graph {
        Some(_) => Vec::new(),
        None => events.iter().flatten().collect(),
    };
    let mut best = f64::INFINITY;
    let mut checks = Checks::default();
    for it in 0..iterations(mode, opts) {
        // Every iteration starts from poison (outside the timed region), so
        // a copy that reads scratch before it is written reads poison, not
        // what the previous iteration left there.
        if it > 0 {
            for rk in &ranks {
                guard.bufs[rk.bufs[1]].fill(POISON)?;
                guard.bufs[rk.bufs[2]].fill(POISON)?;
            }
            guard.wait_legacy(opts.timeout)?;
        }
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
        wait_progress(&markers, &done, opts.timeout, || Ok(()))?;
        best = best.min(t0.elapsed().as_secs_f64());
        let mut verdict = Verdict::default();
        for (r, rk) in ranks.iter().enumerate() {
            let out = guard.bufs[rk.bufs[1]].download(layout.output_size(r) as usize)?;
            verdict.merge(check_output(&out, traffic, layout, r));
        }
        if !checks.record(verdict) {
            break;
        }
    }
    let mut report = RunReport::new(BackendKind::Cuda, plan, mode);
    report.lanes = streams.len();
    report.capture_seconds = capture_seconds;
    checks.finish(&mut report, best);
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
    /// Issues every copy of the schedule once into a CUDA graph: `origin`
    /// (a new stream on the one device) starts the capture, every copy
    /// stream joins it by waiting for an event of that stream, the copies are
    /// issued as for a plain run, and the origin waits for every copy stream
    /// before the capture ends. Returns the origin stream (replays go there)
    /// and the instantiated, uploaded graph.
    fn capture(
        &self,
        origin: Arc<CudaStream>,
        timeout: Duration,
    ) -> Result<(Arc<CudaStream>, CudaGraph), RuntimeError> {
        let streams = self.streams;
        let ctx = &self.ctxs[0];
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
        wait_streams(std::slice::from_ref(&origin), timeout)?;
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
            // allocations; the guard keeps the buffers until every stream
            // has finished.
            unsafe {
                if s.place == d.place {
                    result::memcpy_dtod_async(dst, src, t.bytes as usize, stream.cu_stream())
                        .map_err(cu("cuMemcpyDtoDAsync"))?;
                } else {
                    result::memcpy_peer_async(
                        ctxs[d.place].cu_ctx(),
                        dst,
                        ctxs[s.place].cu_ctx(),
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

/// `NCCL_CONFIG_UNDEF_INT`: NCCL picks its default.
const NCCL_UNDEF_INT: c_int = c_int::MIN;

/// A non-blocking NCCL communicator (`ncclConfig_t::blocking = 0`): no NCCL
/// call blocks the thread, so every wait polls `ncclCommGetAsyncError`
/// against the run's watchdog and can give up. Aborted (`ncclCommAbort`)
/// when dropped, unless [`NcclComm::finish`] closed it gracefully.
struct NcclComm {
    comm: nccl_sys::ncclComm_t,
}

impl NcclComm {
    /// `ncclCommInitRankConfig` on the current device (the caller binds its
    /// context), then polled until ready, failed, or nothing happened for
    /// `timeout`.
    fn init(
        id: nccl_sys::ncclUniqueId,
        rank: usize,
        world: usize,
        timeout: Duration,
    ) -> Result<NcclComm, RuntimeError> {
        let (rank, world) = match (c_int::try_from(rank), c_int::try_from(world)) {
            (Ok(r), Ok(w)) => (r, w),
            _ => {
                return Err(RuntimeError::Bootstrap(format!(
                    "{world} ranks are too many for NCCL"
                )))
            }
        };
        // NCCL_CONFIG_INITIALIZER with `blocking = 0`. `version` says 2.14,
        // the first NCCL with this struct: NCCL reads the fields that
        // version had (size, magic, version, blocking) and gives every later
        // field its default, whatever NCCL 2.14 or newer runs here
        // (parseCommConfig in NCCL's init.cc). `size` is this struct's, of
        // which NCCL copies no more than its own.
        let mut config = nccl_sys::ncclConfig_t {
            size: std::mem::size_of::<nccl_sys::ncclConfig_t>(),
            magic: 0xcafe_beef,
            version: 21400,
            blocking: 0,
            cgaClusterSize: NCCL_UNDEF_INT,
            minCTAs: NCCL_UNDEF_INT,
            maxCTAs: NCCL_UNDEF_INT,
            netName: std::ptr::null(),
            splitShare: NCCL_UNDEF_INT,
            trafficClass: NCCL_UNDEF_INT,
            commName: std::ptr::null(),
            collnetEnable: NCCL_UNDEF_INT,
            CTAPolicy: NCCL_UNDEF_INT,
            shrinkShare: NCCL_UNDEF_INT,
            nvlsCTAs: NCCL_UNDEF_INT,
            nChannelsPerNetPeer: NCCL_UNDEF_INT,
            nvlinkCentricSched: NCCL_UNDEF_INT,
            graphUsageMode: NCCL_UNDEF_INT,
            numRmaCtx: NCCL_UNDEF_INT,
            maxP2pPeers: NCCL_UNDEF_INT,
        };
        let mut comm: nccl_sys::ncclComm_t = std::ptr::null_mut();
        // SAFETY: valid out pointer and config; the id is 128 plain bytes.
        let r =
            unsafe { nccl_sys::ncclCommInitRankConfig(&mut comm, world, id, rank, &mut config) };
        // From here on `this` aborts the communicator on every error path.
        let this = NcclComm { comm };
        progressing(r).map_err(|r| nccl_err("ncclCommInitRankConfig", r))?;
        if this.comm.is_null() {
            return Err(RuntimeError::Device(
                "NCCL ncclCommInitRankConfig returned no communicator".into(),
            ));
        }
        this.wait("ncclCommInitRankConfig (communicator set-up)", timeout)?;
        Ok(this)
    }

    /// The communicator's state: `Ok(true)` ready, `Ok(false)` an operation
    /// still in progress, or its error.
    fn state(&self, what: &str) -> Result<bool, RuntimeError> {
        let mut state = nccl_sys::ncclResult_t::ncclSuccess;
        // SAFETY: a live communicator and a valid out pointer.
        let r = unsafe { nccl_sys::ncclCommGetAsyncError(self.comm, &mut state) };
        if r != nccl_sys::ncclResult_t::ncclSuccess {
            return Err(nccl_err("ncclCommGetAsyncError", r));
        }
        match state {
            nccl_sys::ncclResult_t::ncclSuccess => Ok(true),
            nccl_sys::ncclResult_t::ncclInProgress => Ok(false),
            e => Err(nccl_err(what, e)),
        }
    }

    /// Fails when NCCL reported an error for the work in flight (a peer
    /// gone, a network error): polled while kernels run.
    fn check(&self) -> Result<(), RuntimeError> {
        self.state("a send or receive").map(|_| ())
    }

    /// Polls until the last NCCL call on this communicator has completed;
    /// fails on its error, or when it has not completed within `timeout`.
    fn wait(&self, what: &str, timeout: Duration) -> Result<(), RuntimeError> {
        let dog = Watchdog::new(timeout, Instant::now());
        loop {
            if self.state(what)? {
                return Ok(());
            }
            let now = Instant::now();
            if dog.expired(now) {
                return Err(RuntimeError::Device(format!(
                    "NCCL {what} did not complete within {:.1} s (--timeout); the communicator is aborted",
                    dog.idle(now)
                )));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// One NCCL group: `post` issues sends and receives inside
    /// `ncclGroupStart`/`ncclGroupEnd`. The group is closed on every path,
    /// `post`'s errors included (an open group would swallow the abort),
    /// and the group's launch is awaited against `timeout`.
    fn group(
        &self,
        timeout: Duration,
        post: impl FnOnce() -> Result<(), RuntimeError>,
    ) -> Result<(), RuntimeError> {
        // SAFETY: plain call; balanced by the `ncclGroupEnd` below.
        let r = unsafe { nccl_sys::ncclGroupStart() };
        progressing(r).map_err(|r| nccl_err("ncclGroupStart", r))?;
        let posted = post();
        // SAFETY: closes the group opened above, whatever `post` did.
        let ended = unsafe { nccl_sys::ncclGroupEnd() };
        posted?;
        progressing(ended).map_err(|r| nccl_err("ncclGroupEnd", r))?;
        self.wait(
            "ncclGroupEnd (posting a group of sends and receives)",
            timeout,
        )
    }

    /// Posts a send of `bytes` bytes at `buf` to `peer`, on `stream`.
    ///
    /// # Safety
    /// `buf` holds `bytes` bytes and stays allocated until the stream has
    /// finished the send.
    unsafe fn send(
        &self,
        buf: sys::CUdeviceptr,
        bytes: usize,
        peer: u32,
        stream: &CudaStream,
    ) -> Result<(), RuntimeError> {
        let r = nccl_sys::ncclSend(
            buf as usize as *const c_void,
            bytes,
            nccl_sys::ncclDataType_t::ncclUint8,
            peer as c_int,
            self.comm,
            stream.cu_stream() as nccl_sys::cudaStream_t,
        );
        progressing(r).map_err(|r| nccl_err("ncclSend", r))
    }

    /// Posts a receive of `bytes` bytes into `buf` from `peer`, on `stream`.
    ///
    /// # Safety
    /// As [`NcclComm::send`], and nothing else touches those bytes until
    /// the stream has finished the receive.
    unsafe fn recv(
        &self,
        buf: sys::CUdeviceptr,
        bytes: usize,
        peer: u32,
        stream: &CudaStream,
    ) -> Result<(), RuntimeError> {
        let r = nccl_sys::ncclRecv(
            buf as usize as *mut c_void,
            bytes,
            nccl_sys::ncclDataType_t::ncclUint8,
            peer as c_int,
            self.comm,
            stream.cu_stream() as nccl_sys::cudaStream_t,
        );
        progressing(r).map_err(|r| nccl_err("ncclRecv", r))
    }

    /// Closes the communicator gracefully once every rank is done (after
    /// the group's barrier): `ncclCommFinalize`, polled against `timeout`,
    /// then `ncclCommDestroy`. Any failure aborts it instead.
    fn finish(mut self, timeout: Duration) -> Result<(), RuntimeError> {
        // SAFETY: a live communicator with no operation in flight.
        let r = unsafe { nccl_sys::ncclCommFinalize(self.comm) };
        progressing(r).map_err(|r| nccl_err("ncclCommFinalize", r))?;
        self.wait("ncclCommFinalize", timeout)?;
        let comm = std::mem::replace(&mut self.comm, std::ptr::null_mut());
        // SAFETY: finalized above; not used again (the handle is cleared).
        let r = unsafe { nccl_sys::ncclCommDestroy(comm) };
        progressing(r).map_err(|r| nccl_err("ncclCommDestroy", r))
    }
}

impl Drop for NcclComm {
    fn drop(&mut self) {
        if !self.comm.is_null() {
            // SAFETY: a live communicator, never used again. Errors cannot
            // be reported from here.
            let _ = unsafe { nccl_sys::ncclCommAbort(self.comm) };
        }
    }
}

/// `ncclSuccess` and (for a non-blocking communicator) `ncclInProgress`
/// are not errors.
fn progressing(r: nccl_sys::ncclResult_t) -> Result<(), nccl_sys::ncclResult_t> {
    match r {
        nccl_sys::ncclResult_t::ncclSuccess | nccl_sys::ncclResult_t::ncclInProgress => Ok(()),
        e => Err(e),
    }
}

/// Checks that NCCL loads and is new enough, before any call that older
/// NCCLs lack (cudarc panics on a missing symbol).
fn open_nccl() -> Result<(), RuntimeError> {
    // SAFETY: only tries to dlopen the library.
    if !unsafe { nccl_sys::is_culib_present() } {
        return Err(RuntimeError::Unavailable(
            "NCCL could not be loaded: a process group needs `libnccl.so` on the library path (NCCL's development package installs it; with only `libnccl.so.2`, e.g. from pip's nvidia-nccl, link `libnccl.so` to it in a directory on LD_LIBRARY_PATH)".into(),
        ));
    }
    let code = nccl_result::get_nccl_version().map_err(|e| {
        RuntimeError::Unavailable(format!("NCCL loaded, but ncclGetVersion failed: {:?}", e.0))
    })?;
    let (major, minor, patch) = nccl_version(code);
    if (major, minor) < NCCL_MIN {
        return Err(RuntimeError::Unavailable(format!(
            "NCCL {major}.{minor}.{patch} is too old: a process group needs NCCL {}.{} or newer (non-blocking communicators, so that no NCCL call can block past --timeout)",
            NCCL_MIN.0, NCCL_MIN.1
        )));
    }
    Ok(())
}

/// One rank of a process group: NCCL between ranks, one group per level.
fn run_group(
    plan: &Plan,
    traffic: &TrafficMatrix,
    opts: &RunOptions,
    env: &GroupEnv,
    visible: usize,
) -> Result<RunReport, RuntimeError> {
    if opts.nccl_loopback && (env.world != 1 || plan.ranks != 1) {
        return Err(RuntimeError::Unavailable(format!(
            "--nccl-loopback runs a one-rank plan in one process; this is {} of {} processes and the plan has {} ranks",
            env.rank, env.world, plan.ranks
        )));
    }
    if env.world != plan.ranks as usize {
        return Err(RuntimeError::Bootstrap(format!(
            "WORLD_SIZE={} but the plan has {} ranks (one process per rank)",
            env.world, plan.ranks
        )));
    }
    if let Some(f) = opts.inject {
        return Err(RuntimeError::Unavailable(format!(
            "--inject {f} runs in one process only (unset WORLD_SIZE)"
        )));
    }
    if opts.graph {
        return Err(RuntimeError::Unavailable(
            "CUDA graphs are built for one-process runs only (unset WORLD_SIZE)".into(),
        ));
    }
    open_nccl()?;
    let mode = precheck(plan, traffic)?;
    if mode == Mode::Serial {
        return Err(RuntimeError::InvalidPlan(
            "the plan could race (a double write or an unordered read); across processes only race-free plans run (try the cpu backend to see the damage)".into(),
        ));
    }
    let me = env.rank;
    let layout = Layout::new(traffic);
    check_memory(
        || format!("rank {me}'s input and output on the host"),
        layout.input_size(me).saturating_add(layout.output_size(me)),
        available_host_memory(),
        "host memory (MemAvailable)",
    )?;
    let device = env.local_rank % visible;
    let ctx = CudaContext::new(device).map_err(cu("context creation"))?;
    // SAFETY: one stream carries every use of the buffers, in order, and
    // the guard waits for it before freeing them.
    unsafe { ctx.disable_event_tracking() };
    let (free, _) = ctx.mem_get_info().map_err(cu("cuMemGetInfo"))?;
    check_memory(
        || format!("rank {me}'s buffers"),
        rank_bytes(plan, &layout, me),
        Some(free as u64),
        &format!("memory on device {device} (free, cuMemGetInfo)"),
    )?;
    let key: [u8; KEY_LEN] = ctx
        .uuid()
        .map_err(cu("cuDeviceGetUuid"))?
        .bytes
        .map(|b| b as u8);
    let mut guard = Guard::new(vec![ctx.clone()], opts.timeout);
    let result = group_run(
        plan, traffic, opts, env, mode, &layout, key, &ctx, &mut guard,
    );
    match &result {
        // The communicator was aborted (the guard does it first): its
        // kernels quit, so a short wait lets the buffers go.
        Err(RuntimeError::Timeout { .. }) => {
            guard.grace = opts.timeout.min(Duration::from_secs(5));
        }
        Ok(_) => {
            // Every rank passed the barrier: close NCCL gracefully.
            if let Some(comm) = guard.comm.take() {
                comm.finish(opts.timeout)?;
            }
        }
        Err(_) => {}
    }
    drop(guard);
    result
}

/// The body of [`run_group`]: id exchange, communicator, buffers, the
/// iterations, the check, and the group's verdict (the barrier).
#[allow(clippy::too_many_arguments)]
fn group_run(
    plan: &Plan,
    traffic: &TrafficMatrix,
    opts: &RunOptions,
    env: &GroupEnv,
    mode: Mode,
    layout: &Layout,
    key: [u8; KEY_LEN],
    ctx: &Arc<CudaContext>,
    guard: &mut Guard,
) -> Result<RunReport, RuntimeError> {
    let me = env.rank;
    let stream = guard.stream(ctx)?;
    let hash =
        fnv1a(plan.to_json().as_bytes()) ^ fnv1a(traffic.to_json().as_bytes()).rotate_left(1);
    let (id, mut rendezvous) = Rendezvous::exchange(env, hash, key, opts.timeout, || {
        let id = nccl_result::get_uniqueid().map_err(|e| nccl_err("ncclGetUniqueId", e.0))?;
        Ok(id.internal.map(|c| c as u8))
    })?;
    let id = nccl_sys::ncclUniqueId {
        internal: id.map(|b| b as c_char),
    };
    // NCCL takes the device of the current context.
    ctx.bind_to_thread().map_err(cu("cuCtxSetCurrent"))?;
    guard.comm = Some(NcclComm::init(id, me, env.world, opts.timeout)?);
    let input = crate::input_buffer(traffic, layout, me)?;
    let bufs = [
        guard.buffer(ctx, input.len(), 0)?,
        guard.buffer(ctx, layout.output_size(me) as usize, POISON)?,
        guard.buffer(ctx, plan.scratch_bytes(me) as usize, POISON)?,
    ];
    guard.bufs[bufs[0]].upload(&input)?;
    drop(input);
    guard.wait_legacy(opts.timeout)?;
    let base = bufs.map(|b| guard.bufs[b].ptr);
    let mut stages = nccl_stages(plan, me as u32)?;
    if opts.nccl_loopback {
        stages = loopback(stages, me as u32);
    }
    // One progress marker per stage for the watchdog.
    let stage_done: Vec<CudaEvent> = stages
        .iter()
        .map(|_| ctx.new_event(None).map_err(cu("cuEventCreate")))
        .collect::<Result<_, _>>()?;
    let markers: Vec<&CudaEvent> = stage_done.iter().collect();
    let mut best = f64::INFINITY;
    let mut checks = Checks::default();
    for it in 0..iterations(mode, opts) {
        if it > 0 {
            // Every iteration starts from poison; this rank's receives of
            // the last iteration are done (its stream finished), and those
            // of the next are posted after the memsets have finished.
            guard.bufs[bufs[1]].fill(POISON)?;
            guard.bufs[bufs[2]].fill(POISON)?;
            guard.wait_legacy(opts.timeout)?;
        }
        let comm = guard
            .comm
            .as_ref()
            .ok_or_else(|| RuntimeError::Device("the NCCL communicator is gone".into()))?;
        let t0 = Instant::now();
        for (st, marker) in stages.iter().zip(&stage_done) {
            ctx.bind_to_thread().map_err(cu("cuCtxSetCurrent"))?;
            for &i in &st.local {
                let t = &plan.transfers[i as usize];
                let src = base[slot(t.src_buf)] + t.src_off;
                let dst = base[slot(t.dst_buf)] + t.dst_off;
                // SAFETY: ranges verified by `precheck`; one stream orders all uses.
                unsafe {
                    result::memcpy_dtod_async(dst, src, t.bytes as usize, stream.cu_stream())
                }
                .map_err(cu("cuMemcpyDtoDAsync"))?;
            }
            comm.group(opts.timeout, || {
                for &(i, peer) in &st.sends {
                    let t = &plan.transfers[i as usize];
                    // SAFETY: in bounds (`precheck`); the guard keeps the
                    // buffer until the stream has finished.
                    unsafe {
                        comm.send(
                            base[slot(t.src_buf)] + t.src_off,
                            t.bytes as usize,
                            peer,
                            &stream,
                        )
                    }?;
                }
                for &(i, peer) in &st.recvs {
                    let t = &plan.transfers[i as usize];
                    // SAFETY: as above; the verifier proved that no other
                    // transfer touches these bytes meanwhile.
                    unsafe {
                        comm.recv(
                            base[slot(t.dst_buf)] + t.dst_off,
                            t.bytes as usize,
                            peer,
                            &stream,
                        )
                    }?;
                }
                Ok(())
            })?;
            marker.record(&stream).map_err(cu("cuEventRecord"))?;
        }
        let done = stream.record_event(None).map_err(cu("cuEventRecord"))?;
        wait_progress(&markers, std::slice::from_ref(&done), opts.timeout, || {
            comm.check()
        })?;
        best = best.min(t0.elapsed().as_secs_f64());
        let out = guard.bufs[bufs[1]].download(layout.output_size(me) as usize)?;
        // Every rank runs every iteration (the others' sends wait for this
        // rank's receives); the first wrong one is kept.
        checks.record(check_output(&out, traffic, layout, me));
    }
    let mine = match checks.first_wrong() {
        Some((it, v)) => RankVerdict {
            bad_bytes: v.bad_bytes,
            first_bad: v.first_bad.as_ref().map(|b| b.to_string()),
            bad_iteration: Some(it as u32),
        },
        None => RankVerdict::default(),
    };
    // The barrier: no rank returns before every rank has sent its verdict,
    // i.e. finished its transfers; every rank reports the group's verdict.
    let group = rendezvous.finish(&mine, opts.timeout)?;
    let mut report = RunReport::new(BackendKind::Cuda, plan, mode);
    report.lanes = 1;
    report.finish(best, Verdict::default());
    report.bad_bytes = group.bad_bytes;
    report.verified = group.first_bad.is_none() && group.bad_bytes == 0;
    report.first_bad = group.first_bad;
    report.bad_iteration = group.bad_iteration.map(|i| i as usize);
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
    let len = usize::try_from(bytes)
        .map_err(|_| RuntimeError::Memory {
            what: "the reference copy".into(),
            bytes,
        })?
        .max(1);
    let ctx = CudaContext::new(0).map_err(cu("context creation"))?;
    let stream = ctx.new_stream().map_err(cu("cuStreamCreate"))?;
    // cudarc's slices free on their stream (stream-ordered): after the copies.
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

    /// NCCL's refusal of an old library is a message, not a panic; where
    /// NCCL is absent the group path says so before any NCCL call.
    #[test]
    fn missing_nccl_is_an_error_not_a_panic() {
        // SAFETY: only tries to dlopen the library.
        if unsafe { nccl_sys::is_culib_present() } {
            eprintln!("skipping: NCCL is installed here");
            return;
        }
        let e = open_nccl().unwrap_err().to_string();
        assert!(e.contains("libnccl.so"), "{e}");
    }
}
