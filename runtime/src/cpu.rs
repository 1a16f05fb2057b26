//! The CPU reference backend: every rank is a set of real host buffers
//! (input, output, scratch), transfers are `memmove`s run by a pool of worker
//! threads over a ready queue in dependency order, and every output byte is
//! checked afterwards.
//!
//! Soundness: workers write through raw pointers into shared buffers. That is
//! sound because [`crate::precheck`] has run the verifier first:
//! in [`Mode::Concurrent`] no two transfers write one byte and every read of
//! output or scratch is ordered after the transfer that writes it, so
//! transfers that run at the same time touch disjoint bytes (inputs are only
//! read). A plan that breaks those rules runs on one worker ([`Mode::Serial`]).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use switchyard_compiler::{Buffer, Layout, Plan, TrafficMatrix, Transfer};

use crate::dag::Dag;
use crate::pattern::{check_output, Verdict};
use crate::{
    available_host_memory, check_memory, host_buffer, input_buffer, iterations, precheck,
    rank_bytes, Backend, BackendKind, Checks, Inject, LinkBytes, Mode, RunOptions, RunReport,
    RuntimeError,
};

/// Byte written into output and scratch before a run, so that pages are
/// touched outside the timed region and unwritten bytes are not zero.
const POISON: u8 = 0xA5;

/// The CPU backend (stateless).
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuBackend;

/// One rank's buffers.
pub struct RankBuffers {
    pub input: Vec<u8>,
    pub output: Vec<u8>,
    pub scratch: Vec<u8>,
}

impl RankBuffers {
    /// Buffers of every rank, inputs filled with the pattern; an error when
    /// the host cannot hold them.
    pub fn for_plan(
        plan: &Plan,
        traffic: &TrafficMatrix,
        layout: &Layout,
    ) -> Result<Vec<RankBuffers>, RuntimeError> {
        (0..traffic.ranks())
            .map(|r| {
                Ok(RankBuffers {
                    input: input_buffer(traffic, layout, r)?,
                    output: host_buffer(
                        layout.output_size(r),
                        POISON,
                        &format!("the output of rank {r}"),
                    )?,
                    scratch: host_buffer(
                        plan.scratch_bytes(r),
                        POISON,
                        &format!("the scratch of rank {r}"),
                    )?,
                })
            })
            .collect()
    }
}

impl Backend for CpuBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Cpu
    }

    fn run(
        &mut self,
        plan: &Plan,
        traffic: &TrafficMatrix,
        opts: &RunOptions,
    ) -> Result<RunReport, RuntimeError> {
        let mode = precheck(plan, traffic)?;
        let layout = Layout::new(traffic);
        let n = traffic.ranks();
        // Refuse at once, with the figure, a run the host cannot hold,
        // instead of filling buffer after buffer until one allocation fails.
        let reference = if opts.reference {
            LinkBytes::of(plan).total().saturating_mul(2)
        } else {
            0
        };
        let need = (0..n)
            .map(|r| rank_bytes(plan, &layout, r))
            .fold(reference, u64::saturating_add);
        check_memory(
            || {
                format!(
                    "the input, output and scratch buffers of {n} ranks{}",
                    if opts.reference {
                        " and the reference copy"
                    } else {
                        ""
                    }
                )
            },
            need,
            available_host_memory(),
            "host memory (MemAvailable)",
        )?;
        let mut bufs = RankBuffers::for_plan(plan, traffic, &layout)?;
        let lanes = match (mode, opts.inject) {
            (_, Some(Inject::ReverseOrder)) | (Mode::Serial, _) => 1,
            (Mode::Concurrent, None) => worker_count(opts.threads),
        };
        // With a reference, plan runs and plain copies alternate, so that both
        // see the same machine (other processes, frequency, caches).
        let mut probe = if opts.reference {
            Some(MemcpyProbe::new(LinkBytes::of(plan).total())?)
        } else {
            None
        };
        let mut seconds = f64::INFINITY;
        let mut reference = f64::INFINITY;
        let mut checks = Checks::default();
        for it in 0..iterations(mode, opts) {
            // Every iteration starts from poison (outside the timed region),
            // so a transfer that reads scratch before it is written reads
            // poison, not what the previous iteration left there.
            if it > 0 {
                for b in bufs.iter_mut() {
                    b.output.fill(POISON);
                    b.scratch.fill(POISON);
                }
            }
            let t0 = Instant::now();
            match opts.inject {
                Some(Inject::ReverseOrder) => run_reversed(plan, &mut bufs),
                None => run_transfers(
                    plan,
                    &mut bufs,
                    lanes,
                    mode == Mode::Concurrent,
                    opts.timeout,
                )?,
            }
            seconds = seconds.min(t0.elapsed().as_secs_f64());
            if let Some(p) = probe.as_mut() {
                reference = reference.min(p.once());
            }
            let mut verdict = Verdict::default();
            for (d, b) in bufs.iter().enumerate() {
                verdict.merge(check_output(&b.output, traffic, &layout, d));
            }
            if !checks.record(verdict) {
                break;
            }
        }
        let mut report = RunReport::new(BackendKind::Cpu, plan, mode);
        report.lanes = lanes;
        checks.finish(&mut report, seconds);
        if let Some(p) = probe {
            report.reference_gbps = Some(p.bytes as f64 / reference.max(1e-9) / 1e9);
        }
        Ok(report)
    }
}

/// One thread's `memcpy` between two touched buffers: the reference rate.
pub struct MemcpyProbe {
    bytes: usize,
    src: Vec<u8>,
    dst: Vec<u8>,
}

impl MemcpyProbe {
    pub fn new(bytes: u64) -> Result<Self, RuntimeError> {
        let what = "the reference copy";
        let src = host_buffer(bytes, 0x5A, what)?;
        Ok(MemcpyProbe {
            bytes: src.len(),
            dst: host_buffer(bytes, POISON, what)?,
            src,
        })
    }

    /// Seconds one copy of all the bytes takes.
    pub fn once(&mut self) -> f64 {
        let t0 = Instant::now();
        self.dst.copy_from_slice(std::hint::black_box(&self.src));
        let s = t0.elapsed().as_secs_f64();
        std::hint::black_box(&mut self.dst);
        s
    }
}

fn worker_count(requested: usize) -> usize {
    if requested > 0 {
        requested
    } else {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    }
}

/// Base pointer and length of every buffer of every rank.
struct Regions {
    bufs: Vec<[(*mut u8, usize); 3]>,
}

// SAFETY: the pointers are only dereferenced by `copy`, whose callers
// guarantee that concurrent copies touch disjoint bytes (module comment).
unsafe impl Sync for Regions {}

impl Regions {
    fn new(bufs: &mut [RankBuffers]) -> Regions {
        let raw = |v: &mut Vec<u8>| (v.as_mut_ptr(), v.len());
        Regions {
            bufs: bufs
                .iter_mut()
                .map(|b| [raw(&mut b.input), raw(&mut b.output), raw(&mut b.scratch)])
                .collect(),
        }
    }

    fn range(&self, rank: u32, buf: Buffer, off: u64, bytes: u64) -> *mut u8 {
        let slot = match buf {
            Buffer::Input => 0,
            Buffer::Output => 1,
            Buffer::Scratch => 2,
        };
        let (base, len) = self.bufs[rank as usize][slot];
        // Bounds were checked by the verifier; a violation here is a bug, not input.
        assert!(
            off.checked_add(bytes).is_some_and(|e| e <= len as u64),
            "transfer range outside its buffer"
        );
        // SAFETY: in bounds (asserted above).
        unsafe { base.add(off as usize) }
    }

    /// Performs one transfer.
    ///
    /// # Safety
    /// No other thread may write the bytes this transfer reads or touch the
    /// bytes it writes while it runs.
    unsafe fn copy(&self, t: &Transfer, lo: u64, hi: u64) {
        let len = (hi - lo) as usize;
        let src = self.range(t.src, t.src_buf, t.src_off + lo, hi - lo);
        let dst = self.range(t.dst, t.dst_buf, t.dst_off + lo, hi - lo);
        debug_assert!(t.dst_buf != Buffer::Input, "transfers never write inputs");
        let overlap = (src as usize) < dst as usize + len && (dst as usize) < src as usize + len;
        if overlap {
            // A serial-mode plan may read and write overlapping bytes: memmove.
            std::ptr::copy(src, dst, len);
        } else {
            copy_bytes(src, dst, len);
        }
    }
}

/// Transfers longer than this are split into pieces of this size that
/// workers take independently, so one large block does not leave the other
/// workers idle at the end of a run.
pub const PIECE: u64 = 1 << 20;

/// Executes every transfer of `plan` on `bufs` with `workers` threads.
/// `split` allows cutting large transfers into [`PIECE`]s (not for plans that
/// may copy between overlapping ranges: a split `memmove` is not a `memmove`).
/// Crate-private: it is only sound after [`precheck`] (more than one worker
/// only in [`Mode::Concurrent`]).
pub(crate) fn run_transfers(
    plan: &Plan,
    bufs: &mut [RankBuffers],
    workers: usize,
    split: bool,
    timeout: Duration,
) -> Result<(), RuntimeError> {
    let regions = Regions::new(bufs);
    let dag = Dag::new(plan)?;
    let pieces = |i: u32| -> u32 {
        let b = plan.transfers[i as usize].bytes;
        if split {
            b.div_ceil(PIECE).clamp(1, u32::MAX as u64) as u32
        } else {
            1
        }
    };
    // SAFETY: callers pass buffers sized for the plan, and `precheck` made sure
    // that transfers ready at the same time never touch the same bytes (or
    // asked for one worker); the pieces of one transfer are disjoint.
    run_dag(&dag, workers, timeout, pieces, |i, k| unsafe {
        let t = &plan.transfers[i as usize];
        if split {
            let lo = k as u64 * PIECE;
            regions.copy(t, lo, (lo + PIECE).min(t.bytes));
        } else {
            regions.copy(t, 0, t.bytes);
        }
    })
}

/// The [`Inject::ReverseOrder`] fault: every transfer, whole, on this thread,
/// last transfer of the plan first, dependencies ignored. Sound for any plan
/// whose ranges the verifier checked: one thread, and overlapping ranges
/// are copied as by `memmove`.
fn run_reversed(plan: &Plan, bufs: &mut [RankBuffers]) {
    let regions = Regions::new(bufs);
    for t in plan.transfers.iter().rev() {
        // SAFETY: no other thread touches the buffers; ranges are in bounds
        // (`precheck`, and asserted by `range`).
        unsafe { regions.copy(t, 0, t.bytes) };
    }
}

/// Copies `len` bytes between non-overlapping ranges. Large copies use
/// streaming (non-temporal) stores on x86-64, as glibc's `memcpy` does for
/// copies much larger than the cache: the destination is not read into the
/// cache first, which saves a third of the memory traffic. Pieces of a
/// [`PIECE`] are below glibc's own threshold, hence this.
///
/// # Safety
/// Both ranges are valid for `len` bytes and do not overlap.
unsafe fn copy_bytes(src: *const u8, dst: *mut u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    if len >= 64 * 1024 {
        if std::arch::is_x86_feature_detected!("avx") {
            stream_copy_avx(src, dst, len);
        } else {
            stream_copy(src, dst, len);
        }
        return;
    }
    std::ptr::copy_nonoverlapping(src, dst, len);
}

/// # Safety
/// As [`copy_bytes`].
#[cfg(target_arch = "x86_64")]
unsafe fn stream_copy(src: *const u8, dst: *mut u8, len: usize) {
    // SSE2 is part of the x86-64 baseline, so these need no feature detection.
    use std::arch::x86_64::_mm_sfence;
    let head = dst.align_offset(16).min(len);
    std::ptr::copy_nonoverlapping(src, dst, head);
    let (mut s, mut d, mut left) = (src.add(head), dst.add(head), len - head);
    while left >= 64 {
        line64(s, d);
        s = s.add(64);
        d = d.add(64);
        left -= 64;
    }
    std::ptr::copy_nonoverlapping(s, d, left);
    // Streaming stores are weakly ordered: fence before the transfer is
    // reported done, so that dependents (on other threads) see the bytes.
    _mm_sfence();
}

/// [`stream_copy`] with 32-byte loads and stores.
///
/// # Safety
/// As [`copy_bytes`], and the CPU supports AVX.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn stream_copy_avx(src: *const u8, dst: *mut u8, len: usize) {
    use std::arch::x86_64::{__m256i, _mm256_loadu_si256, _mm256_stream_si256, _mm_sfence};
    let head = dst.align_offset(32).min(len);
    std::ptr::copy_nonoverlapping(src, dst, head);
    let (mut s, mut d, mut left) = (src.add(head), dst.add(head), len - head);
    while left >= 128 {
        let a = _mm256_loadu_si256(s as *const __m256i);
        let b = _mm256_loadu_si256(s.add(32) as *const __m256i);
        let c = _mm256_loadu_si256(s.add(64) as *const __m256i);
        let e = _mm256_loadu_si256(s.add(96) as *const __m256i);
        _mm256_stream_si256(d as *mut __m256i, a);
        _mm256_stream_si256(d.add(32) as *mut __m256i, b);
        _mm256_stream_si256(d.add(64) as *mut __m256i, c);
        _mm256_stream_si256(d.add(96) as *mut __m256i, e);
        s = s.add(128);
        d = d.add(128);
        left -= 128;
    }
    std::ptr::copy_nonoverlapping(s, d, left);
    _mm_sfence();
}

/// Copies one 64-byte line with streaming stores (`d` 16-byte aligned).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn line64(s: *const u8, d: *mut u8) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
    let a = _mm_loadu_si128(s as *const __m128i);
    let b = _mm_loadu_si128(s.add(16) as *const __m128i);
    let c = _mm_loadu_si128(s.add(32) as *const __m128i);
    let e = _mm_loadu_si128(s.add(48) as *const __m128i);
    _mm_stream_si128(d as *mut __m128i, a);
    _mm_stream_si128(d.add(16) as *mut __m128i, b);
    _mm_stream_si128(d.add(32) as *mut __m128i, c);
    _mm_stream_si128(d.add(48) as *mut __m128i, e);
}

/// State of the ready queue, under one lock.
struct Queue {
    /// `(transfer, piece)` pairs ready to run.
    ready: Vec<(u32, u32)>,
    /// Pieces of each transfer not finished yet.
    left: Vec<u32>,
    running: usize,
    done: usize,
    last_progress: Instant,
    failure: Option<RuntimeError>,
}

/// Runs `work(i, k)` for every piece `k < pieces(i)` of every node `i` of
/// `dag` on `workers` threads, each node's pieces after all its
/// dependencies' pieces. Stops with [`RuntimeError::Deadlock`] as soon as
/// nothing is running or ready while work remains, and with
/// [`RuntimeError::Timeout`] when no piece finishes for `timeout`.
pub fn run_dag<P, F>(
    dag: &Dag,
    workers: usize,
    timeout: Duration,
    pieces: P,
    work: F,
) -> Result<(), RuntimeError>
where
    P: Fn(u32) -> u32 + Sync,
    F: Fn(u32, u32) + Sync,
{
    let n = dag.len();
    if n == 0 {
        return Ok(());
    }
    let indeg: Vec<AtomicU32> = dag.indegree().iter().map(|&d| AtomicU32::new(d)).collect();
    let left: Vec<u32> = (0..n as u32).map(|i| pieces(i).max(1)).collect();
    let mut ready = Vec::new();
    // Popped from the back: push in reverse to start with the lowest index.
    for i in (0..n as u32).rev() {
        if dag.indegree()[i as usize] == 0 {
            ready.extend((0..left[i as usize]).rev().map(|k| (i, k)));
        }
    }
    let queue = Mutex::new(Queue {
        ready,
        left,
        running: 0,
        done: 0,
        last_progress: Instant::now(),
        failure: None,
    });
    let wake = Condvar::new();
    let worker = || {
        let mut q = queue.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if q.failure.is_some() || q.done == n {
                return;
            }
            let Some((i, k)) = q.ready.pop() else {
                if q.running == 0 {
                    q.failure = Some(RuntimeError::Deadlock {
                        stuck: n - q.done,
                        total: n,
                        reason: "no transfer is running or ready; their dependencies form a cycle"
                            .into(),
                    });
                    wake.notify_all();
                    return;
                }
                let (guard, _) = wake
                    .wait_timeout(q, timeout.min(Duration::from_millis(100)))
                    .unwrap_or_else(|e| e.into_inner());
                q = guard;
                if q.failure.is_none() && q.done < n && q.last_progress.elapsed() > timeout {
                    q.failure = Some(RuntimeError::Timeout {
                        seconds: q.last_progress.elapsed().as_secs_f64(),
                        done: q.done,
                        total: n,
                    });
                    wake.notify_all();
                }
                continue;
            };
            q.running += 1;
            drop(q);
            work(i, k);
            q = queue.lock().unwrap_or_else(|e| e.into_inner());
            q.running -= 1;
            q.last_progress = Instant::now();
            q.left[i as usize] -= 1;
            if q.left[i as usize] > 0 {
                continue;
            }
            q.done += 1;
            let mut woke = 0;
            for &s in dag.successors(i as usize) {
                if indeg[s as usize].fetch_sub(1, Ordering::AcqRel) == 1 {
                    let p = q.left[s as usize];
                    q.ready.extend((0..p).rev().map(|k| (s, k)));
                    woke += p;
                }
            }
            if q.done == n || woke > 1 {
                wake.notify_all();
            } else if woke == 1 {
                wake.notify_one();
            }
        }
    };
    std::thread::scope(|scope| {
        for _ in 1..workers.max(1) {
            scope.spawn(worker);
        }
        worker();
    });
    let q = queue.into_inner().unwrap_or_else(|e| e.into_inner());
    match q.failure {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dag::tests::chain_plan;
    use crate::execute;
    use switchyard_compiler::generate::{generate, Pattern, TrafficSpec};
    use switchyard_compiler::sched::direct;
    use switchyard_compiler::{Path, Topology};

    fn opts() -> RunOptions {
        RunOptions {
            threads: 4,
            timeout: Duration::from_secs(5),
            ..RunOptions::default()
        }
    }

    fn skewed(ranks: usize, seed: u64) -> TrafficMatrix {
        let mut spec = TrafficSpec::new(ranks, Pattern::Zipf(1.2));
        spec.seed = seed;
        spec.moe.tokens_per_rank = 64;
        spec.moe.hidden = 37;
        spec.moe.bytes_per_elem = 1;
        generate(&spec).unwrap()
    }

    #[test]
    fn direct_plans_verify_on_skewed_traffic() {
        for (nodes, gpus, seed) in [(2, 4, 1), (2, 8, 2), (1, 8, 3), (4, 2, 4)] {
            let topo = Topology::preset("dgx-h100", nodes, Some(gpus)).unwrap();
            let m = skewed(nodes * gpus, seed);
            let plan = direct(&topo, &m);
            let r = execute(&plan, &m, BackendKind::Cpu, &opts()).unwrap();
            assert!(r.verified, "{:?}", r.first_bad);
            assert_eq!(r.bad_bytes, 0);
            assert_eq!(r.link_bytes.total(), m.total());
            assert_eq!(r.bytes_moved, m.off_diagonal_total());
            assert!(!r.serial);
        }
    }

    #[test]
    fn buffers_the_host_cannot_hold_are_refused_before_any_allocation() {
        // A plan may declare any scratch size; 2^64 - 1 bytes was a
        // capacity-overflow panic, 10^15 an allocation abort, and a plan
        // a little larger than memory filled buffer after buffer first.
        let topo = Topology::preset("dgx-h100", 1, Some(2)).unwrap();
        let m = TrafficMatrix::from_rows(vec![vec![1, 2], vec![3, 4]]);
        let mut plan = direct(&topo, &m);
        let Some(avail) = available_host_memory() else {
            eprintln!("skipping: no MemAvailable here");
            return;
        };
        for huge in [u64::MAX, 1 << 50, avail + 1] {
            plan.scratch = vec![huge, 0];
            let t0 = Instant::now();
            let e = execute(&plan, &m, BackendKind::Cpu, &opts()).unwrap_err();
            assert!(t0.elapsed() < Duration::from_secs(1), "it allocated first");
            let RuntimeError::NotEnoughMemory {
                need, available, ..
            } = &e
            else {
                panic!("{e}");
            };
            assert!(*need >= huge && *available > 0, "{e}");
            let msg = e.to_string();
            assert!(
                msg.starts_with("the input, output and scratch buffers of 2 ranks need "),
                "{msg}"
            );
            assert!(
                msg.contains("of host memory (MemAvailable), but only"),
                "{msg}"
            );
        }
    }

    #[test]
    fn an_allocation_the_host_refuses_is_an_error() {
        for huge in [u64::MAX, 1 << 62] {
            let e = host_buffer(huge, 0, "the scratch of rank 0").unwrap_err();
            assert_eq!(
                e,
                RuntimeError::Memory {
                    what: "the scratch of rank 0".into(),
                    bytes: huge
                }
            );
            assert_eq!(
                e.to_string(),
                format!("cannot allocate {huge} bytes for the scratch of rank 0")
            );
        }
    }

    #[test]
    fn large_unaligned_transfers_verify() {
        // Blocks above the streaming-store threshold and above one piece, at
        // odd offsets, so heads, tails and piece edges are all exercised.
        let topo = Topology::preset("dgx-h100", 1, Some(3)).unwrap();
        let rows: Vec<Vec<u64>> = (0..3u64)
            .map(|s| {
                (0..3u64)
                    .map(|d| (1 << 20) + 65_537 * (s * 3 + d) + 13)
                    .collect()
            })
            .collect();
        let m = TrafficMatrix::from_rows(rows);
        let plan = direct(&topo, &m);
        let r = execute(&plan, &m, BackendKind::Cpu, &opts()).unwrap();
        assert!(r.verified, "{:?}", r.first_bad);
        assert_eq!(r.link_bytes.total(), m.total());
    }

    #[test]
    fn every_algorithm_verifies_on_skewed_traffic() {
        use switchyard_compiler::sched::{schedule, Options};
        use switchyard_compiler::Algorithm;
        let topo = Topology::preset("dgx-h100", 2, Some(4)).unwrap();
        let m = skewed(8, 11);
        for &alg in Algorithm::ALL {
            let plan = schedule(alg, &topo, &m, &Options::default()).unwrap();
            let r = execute(&plan, &m, BackendKind::Cpu, &opts()).unwrap();
            assert!(r.verified, "{alg}: {:?}", r.first_bad);
        }
    }

    #[test]
    fn a_wrong_src_offset_is_located() {
        let topo = Topology::preset("dgx-h100", 2, Some(4)).unwrap();
        let m = TrafficMatrix::uniform(8, 1000);
        let mut plan = direct(&topo, &m);
        let i = plan
            .transfers
            .iter()
            .position(|t| t.src == 2 && t.dst == 5)
            .unwrap();
        plan.transfers[i].src_off += 8;
        let r = execute(&plan, &m, BackendKind::Cpu, &opts()).unwrap();
        assert!(!r.verified);
        // Misplaced bytes, but race-free: it ran concurrently.
        assert!(!r.serial);
        assert!(r.bad_bytes > 990 && r.bad_bytes <= 1000, "{}", r.bad_bytes);
        assert_eq!(
            r.first_bad.as_deref(),
            Some("output of rank 5 bytes 2000..3000 are wrong: they should hold input bytes 5000..6000 of rank 2")
        );
    }

    #[test]
    fn racy_plan_runs_serially_and_fails_the_check() {
        let topo = Topology::preset("dgx-h100", 1, Some(2)).unwrap();
        let m = TrafficMatrix::uniform(2, 16);
        let mut plan = direct(&topo, &m);
        // Transfer 1 (0 -> 1) now writes where transfer 3 (1 -> 1) writes: a double write.
        plan.transfers[1].dst_off = 16;
        let r = execute(&plan, &m, BackendKind::Cpu, &opts()).unwrap();
        assert!(r.serial);
        assert_eq!(r.lanes, 1);
        assert!(!r.verified);
    }

    #[test]
    fn cycles_and_bad_ranges_are_errors() {
        let m = TrafficMatrix::uniform(1, 3);
        let plan = chain_plan(&[&[], &[2], &[1]]);
        let e = execute(&plan, &m, BackendKind::Cpu, &opts()).unwrap_err();
        assert!(matches!(e, RuntimeError::Deadlock { .. }), "{e}");
        let mut plan = chain_plan(&[&[], &[], &[]]);
        plan.transfers[2].src_off = 3;
        let e = execute(&plan, &m, BackendKind::Cpu, &opts()).unwrap_err();
        assert!(matches!(e, RuntimeError::InvalidPlan(_)), "{e}");
    }

    #[test]
    fn pool_reports_deadlock_without_the_verifier() {
        // Straight to the pool: the cycle 1 <-> 2 is found once 0 has run.
        let plan = chain_plan(&[&[], &[2], &[1]]);
        let dag = Dag::new(&plan).unwrap();
        let t0 = Instant::now();
        let e = run_dag(&dag, 3, Duration::from_secs(30), |_| 1, |_, _| {}).unwrap_err();
        assert!(
            matches!(
                e,
                RuntimeError::Deadlock {
                    stuck: 2,
                    total: 3,
                    ..
                }
            ),
            "{e}"
        );
        assert!(t0.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn pool_watchdog_fires_on_a_stuck_transfer() {
        let plan = chain_plan(&[&[], &[0]]);
        let dag = Dag::new(&plan).unwrap();
        let e = run_dag(
            &dag,
            2,
            Duration::from_millis(50),
            |_| 1,
            |i, _| {
                if i == 0 {
                    std::thread::sleep(Duration::from_millis(400));
                }
            },
        )
        .unwrap_err();
        assert!(
            matches!(
                e,
                RuntimeError::Timeout {
                    done: 0,
                    total: 2,
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn pool_respects_dependencies() {
        let deps: Vec<Vec<u32>> = (0..200u32)
            .map(|i| if i < 10 { vec![] } else { vec![i - 10, i / 2] })
            .collect();
        let refs: Vec<&[u32]> = deps.iter().map(|d| d.as_slice()).collect();
        let plan = chain_plan(&refs);
        let dag = Dag::new(&plan).unwrap();
        let stamp: Vec<AtomicU32> = (0..200).map(|_| AtomicU32::new(0)).collect();
        let clock = AtomicU32::new(1);
        // Three pieces per transfer: a transfer is done when its last piece is.
        let pieces_done: Vec<AtomicU32> = (0..200).map(|_| AtomicU32::new(0)).collect();
        run_dag(
            &dag,
            4,
            Duration::from_secs(5),
            |_| 3,
            |i, _| {
                for &d in &deps[i as usize] {
                    assert!(
                        stamp[d as usize].load(Ordering::SeqCst) > 0,
                        "{i} before {d}"
                    );
                }
                if pieces_done[i as usize].fetch_add(1, Ordering::SeqCst) == 2 {
                    stamp[i as usize].store(clock.fetch_add(1, Ordering::SeqCst), Ordering::SeqCst);
                }
            },
        )
        .unwrap();
        assert!(stamp.iter().all(|s| s.load(Ordering::SeqCst) > 0));
    }

    /// `fast` plans for 2 x DGX-H100 (16 ranks), small enough for a test
    /// (2 to 4 MiB in all) yet relaying a third of their bytes through scratch.
    fn fast_plans_with_relays() -> Vec<(Plan, TrafficMatrix)> {
        use switchyard_compiler::sched::{schedule, Options};
        use switchyard_compiler::Algorithm;
        let topo = Topology::preset("dgx-h100", 2, None).unwrap();
        [
            (Pattern::Zipf(1.2), 1),
            (Pattern::Zipf(1.5), 2),
            (Pattern::Moe, 3),
        ]
        .into_iter()
        .map(|(pattern, seed)| {
            let mut spec = TrafficSpec::new(16, pattern);
            spec.seed = seed;
            spec.moe.tokens_per_rank = 64;
            spec.moe.hidden = 512;
            let m = generate(&spec).unwrap();
            let plan = schedule(Algorithm::Fast, &topo, &m, &Options::default()).unwrap();
            let relays = plan
                .transfers
                .iter()
                .filter(|t| t.src_buf == Buffer::Scratch)
                .count();
            assert!(relays > 0, "{pattern:?}: no relay through scratch");
            (plan, m)
        })
        .collect()
    }

    /// Item 1 of issue 21: a transfer that runs before the transfer it
    /// depends on must be caught on the first iteration and on later ones,
    /// where scratch still holds what the previous iteration put there.
    #[test]
    fn reverse_order_is_caught_on_every_iteration() {
        for (plan, m) in fast_plans_with_relays() {
            for iterations in [1, 5] {
                for _ in 0..2 {
                    let o = RunOptions {
                        iterations,
                        inject: Some(Inject::ReverseOrder),
                        ..opts()
                    };
                    let r = execute(&plan, &m, BackendKind::Cpu, &o).unwrap();
                    assert!(!r.verified, "{iterations} iterations: reported right");
                    assert!(r.bad_bytes > 0);
                    assert_eq!(r.bad_iteration, Some(1));
                    assert_eq!(r.lanes, 1);
                }
            }
            // Without the fault the same plans verify, on every iteration.
            let o = RunOptions {
                iterations: 3,
                ..opts()
            };
            let r = execute(&plan, &m, BackendKind::Cpu, &o).unwrap();
            assert!(r.verified, "{:?}", r.first_bad);
            assert_eq!(r.bad_iteration, None);
        }
    }

    #[test]
    fn reverse_order_leaves_plans_without_relays_right() {
        // Transfers of a `direct` plan touch disjoint bytes: any order is right.
        let topo = Topology::preset("dgx-h100", 2, Some(4)).unwrap();
        let m = skewed(8, 5);
        let plan = direct(&topo, &m);
        let o = RunOptions {
            iterations: 3,
            inject: Some(Inject::ReverseOrder),
            ..opts()
        };
        let r = execute(&plan, &m, BackendKind::Cpu, &o).unwrap();
        assert!(r.verified, "{:?}", r.first_bad);
    }

    #[test]
    fn relay_through_scratch_runs() {
        // Rank 0 -> scratch of rank 1 -> output of rank 1 (dependency), plus the rest direct.
        let topo = Topology::preset("dgx-h100", 1, Some(2)).unwrap();
        let m = TrafficMatrix::from_rows(vec![vec![5, 300], vec![7, 11]]);
        let mut plan = direct(&topo, &m);
        let i = plan
            .transfers
            .iter()
            .position(|t| t.src == 0 && t.dst == 1)
            .unwrap();
        let hop = plan.transfers[i].clone();
        plan.need_scratch(1, 300);
        plan.transfers[i].dst_buf = Buffer::Scratch;
        plan.transfers[i].dst_off = 0;
        let mut second = hop.clone();
        second.src = 1;
        second.src_buf = Buffer::Scratch;
        second.src_off = 0;
        second.path = Path::Local;
        second.step = 1;
        second.deps = [i as u32].into_iter().collect();
        plan.push(second);
        let r = execute(&plan, &m, BackendKind::Cpu, &opts()).unwrap();
        assert!(r.verified, "{:?}", r.first_bad);
        assert_eq!(r.link_bytes.local, 5 + 11 + 300);
    }
}
