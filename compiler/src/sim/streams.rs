//! Streams: transfers that follow one another through one in-order pipe.
//!
//! A transfer `t` with `after[t] = Some(p)` continues `p` on the same
//! connection (same source and destination, so the same route). Once
//! ready it waits its path latency like any transfer, but it moves its
//! first byte only once `p` has delivered its last: at most one transfer
//! of a stream moves at a time, so a stream takes one max-min share of its
//! links, not one per transfer in flight, its transfers finish one after
//! another, and the latency of a successor that became ready early is
//! hidden under its predecessor's bytes. This is how a (channel, peer)
//! connection of NCCL moves its FIFO steps (docs/msccl.md, "The executor's
//! rules"); `msccl::xsim` prices an MSCCL file's primitive calls with it.

use super::{simulate_inner, Plan, Result, SimOptions, SimResult, Topology, TransferTime};
use crate::error::InputError;

/// No transfer.
const NONE: u32 = u32::MAX;

/// The streams of a run: who continues whom, and the successors held.
pub(super) struct Streams {
    /// The transfer each one continues (`NONE`: none).
    after: Vec<u32>,
    /// The transfer continuing each one (`NONE`: none).
    next: Vec<u32>,
    /// When a held successor's latency ended (NaN: not held).
    held: Vec<f64>,
}

impl Streams {
    /// Checks `after` against `plan`: one entry per transfer, each naming
    /// another transfer between the same two ranks, none continued twice.
    fn new(plan: &Plan, after: &[Option<u32>]) -> Result<Self> {
        let n = plan.transfers.len();
        let bad = |reason: String| InputError::new("plan", reason);
        if after.len() != n {
            return Err(bad(format!(
                "{} stream predecessors for {n} transfers",
                after.len()
            ))
            .into());
        }
        let mut a = vec![NONE; n];
        let mut next = vec![NONE; n];
        for (t, p) in after.iter().enumerate() {
            let Some(p) = *p else { continue };
            let (pu, x) = (p as usize, &plan.transfers[t]);
            if pu >= n || pu == t {
                return Err(bad(format!(
                    "transfer {t}: continues transfer {p}, which {}",
                    if pu == t {
                        "is itself"
                    } else {
                        "does not exist"
                    }
                ))
                .into());
            }
            let y = &plan.transfers[pu];
            if (x.src, x.dst) != (y.src, y.dst) {
                return Err(bad(format!(
                    "transfer {t} ({} -> {}) continues transfer {p} ({} -> {}): a stream joins two ranks",
                    x.src, x.dst, y.src, y.dst
                ))
                .into());
            }
            if next[pu] != NONE {
                return Err(bad(format!(
                    "transfer {p} is continued by both {} and {t}",
                    next[pu]
                ))
                .into());
            }
            a[t] = p;
            next[pu] = t as u32;
        }
        Ok(Streams {
            after: a,
            next,
            held: vec![f64::NAN; n],
        })
    }

    /// `t` is ready and its latency ends at `at`: whether it is held
    /// because the transfer it continues has not finished (it is released,
    /// by [`Streams::release`], when that one does).
    pub(super) fn hold(&mut self, t: u32, at: f64, times: &[TransferTime]) -> bool {
        let p = self.after[t as usize];
        if p == NONE || !times[p as usize].end_us.is_nan() {
            return false;
        }
        self.held[t as usize] = at;
        true
    }

    /// `t` finished at `time`: its held successor, if any, and when it
    /// starts moving (its latency's end, or `time` if later).
    pub(super) fn release(&mut self, t: u32, time: f64) -> Option<(u32, f64)> {
        let c = self.next[t as usize];
        if c == NONE {
            return None;
        }
        let at = std::mem::replace(&mut self.held[c as usize], f64::NAN);
        (!at.is_nan()).then(|| (c, at.max(time)))
    }
}

/// [`super::simulate`] where `after[t] = Some(p)` makes transfer `t`
/// continue transfer `p` as one in-order stream (module docs): `t` moves
/// no byte before `p` has delivered its last. `after` has one entry per
/// transfer; a stream joins one source to one destination, and a transfer
/// is continued by at most one other (errors otherwise). With every entry
/// `None` this is [`super::simulate`].
///
/// ```
/// use switchyard_compiler::plan::{Buffer, Deps, Path, Plan, Transfer};
/// use switchyard_compiler::sim::{simulate, simulate_streams, SimOptions};
/// use switchyard_compiler::Topology;
///
/// // Two nodes of one GPU: 50 GB/s, 3 us. Two 5 MB transfers, ready at 0.
/// let topo = Topology::preset("dgx-h100", 2, Some(1))?;
/// let t = Transfer {
///     src: 0, src_buf: Buffer::Input, src_off: 0,
///     dst: 1, dst_buf: Buffer::Output, dst_off: 0,
///     bytes: 5_000_000, path: Path::Rdma { nic: 0 }, step: 0, deps: Deps::new(),
/// };
/// let mut plan = Plan::new("two", 2, 1);
/// plan.transfers = vec![t.clone(), t];
/// let opts = SimOptions::default();
/// // Side by side they share the link and end together at 203 us; as one
/// // stream the second follows the first (103 us), its latency hidden.
/// let apart = simulate(&topo, &plan, &opts)?;
/// let stream = simulate_streams(&topo, &plan, &[None, Some(0)], &opts)?;
/// assert_eq!(apart.transfers[0].end_us, 203.0);
/// assert_eq!(stream.transfers[0].end_us, 103.0);
/// assert_eq!(stream.transfers[1].end_us, 203.0);
/// # Ok::<(), switchyard_compiler::Error>(())
/// ```
pub fn simulate_streams(
    topo: &Topology,
    plan: &Plan,
    after: &[Option<u32>],
    opts: &SimOptions,
) -> Result<SimResult> {
    let streams = Streams::new(plan, after)?;
    simulate_inner(topo, plan, opts, Some(streams), &mut |_, _| {})
}

#[cfg(test)]
mod tests {
    use super::super::simulate;
    use super::super::tests::{close, plan_of, transfer};
    use super::*;
    use crate::plan::{Deps, Path, Transfer};

    fn ends(r: &SimResult) -> Vec<f64> {
        r.transfers.iter().map(|t| t.end_us).collect()
    }

    #[test]
    fn a_stream_takes_one_share_against_another_connection() {
        // GPU 0 of one node sends 9 MB to GPU 1 as a stream of two
        // transfers (A0, A1) and 9 MB to GPU 2 (C): one 450 GB/s egress,
        // 1 us latency. As a stream, A0 and C share it at 225 GB/s and end
        // at 1 + 40 = 41 us, then A1 (its latency long over) has it alone:
        // 41 + 20 = 61 us. Side by side, three flows take 150 GB/s each
        // and all end at 1 + 60 = 61 us: the connection got two thirds.
        let topo = Topology::preset("dgx-h100", 1, Some(4)).unwrap();
        let b = 9_000_000;
        let plan = plan_of(
            &topo,
            vec![
                transfer(0, 1, b, &[]),
                transfer(0, 1, b, &[]),
                transfer(0, 2, b, &[]),
            ],
        );
        let o = SimOptions::default();
        let s = simulate_streams(&topo, &plan, &[None, Some(0), None], &o).unwrap();
        let want = [41.0, 61.0, 41.0];
        assert!(
            ends(&s).iter().zip(want).all(|(&a, b)| close(a, b)),
            "{:?}",
            ends(&s)
        );
        // A1 was ready at 0 and waited in its stream (its latency ended at
        // 1 us), not for a dependency: it moved from 41 us.
        assert_eq!(s.transfers[1].start_us, 0.0);
        assert!(close(s.moving_from_us(1), 41.0));
        assert!(close(s.average_rate(1, b).unwrap(), 450_000.0));
        let apart = simulate(&topo, &plan, &o).unwrap();
        assert!(ends(&apart).iter().all(|&e| close(e, 61.0)));
        // Every entry `None`: the plain simulation, exactly.
        let none = simulate_streams(&topo, &plan, &[None; 3], &o).unwrap();
        assert_eq!(none, apart);
    }

    #[test]
    fn a_stream_hides_a_ready_successors_latency_not_a_late_ones() {
        // Two nodes of one GPU: 50 GB/s, 3 us; 5 MB is 100 us. T0, T1 ready
        // at 0 and T2 once T0 has ended (the FIFO window of one call): T1
        // moves at 103 (its latency hidden), ends 203; T2 is ready at 103,
        // its latency ends at 106, before T1 ends: 203..303. T3 waits for
        // T2 by a dependency: ready at 303, it pays its latency, 306..406.
        let topo = Topology::preset("dgx-h100", 2, Some(1)).unwrap();
        let b = 5_000_000;
        let plan = plan_of(
            &topo,
            vec![
                transfer(0, 1, b, &[]),
                transfer(0, 1, b, &[]),
                transfer(0, 1, b, &[0]),
                transfer(0, 1, b, &[2]),
            ],
        );
        let o = SimOptions::default();
        let s = simulate_streams(&topo, &plan, &[None, Some(0), Some(1), Some(2)], &o).unwrap();
        let want = [103.0, 203.0, 303.0, 406.0];
        assert!(
            ends(&s).iter().zip(want).all(|(&a, b)| close(a, b)),
            "{:?}",
            ends(&s)
        );
        assert!(close(s.transfers[2].start_us, 103.0));
        // The link was never shared and never idle from 3 to 303 us.
        let l = topo.path(0, 1)[0] as usize;
        assert!(close(s.links[l].busy_us, 400.0));
        assert!(close(s.links[l].bytes, 4.0 * b as f64));
    }

    #[test]
    fn grouped_arrivals_bound_a_released_streams_start() {
        // Two nodes of two GPUs. A0 (GPU 0 -> 2, 5 MB RDMA: 50 GB/s, 3 us)
        // moves 3..103 (grouped: it may end up to 1 us later). A1 continues
        // it but waits for Y (GPU 1 -> 0, 45.675 MB on NVLink: 450 GB/s,
        // 1 us, ends 102.5): ready at 102.5, its latency ends at 105.5,
        // after A0 ended: released for 105.5, it moves 105.5..205.5.
        // L (GPU 3 -> 1, 50 MB) keeps the run busy until 1003. With grouped
        // arrivals A1 may start at most 1% of its 100 us later and end 1%
        // later again, not wait for the next event (L's end, 1003 us).
        let topo = Topology::preset("dgx-h100", 2, Some(2)).unwrap();
        let rdma = |src, dst, bytes, deps: &[u32]| Transfer {
            path: Path::Rdma { nic: 0 },
            ..transfer(src, dst, bytes, deps)
        };
        let plan = plan_of(
            &topo,
            vec![
                rdma(0, 2, 5_000_000, &[]),
                transfer(1, 0, 45_675_000, &[]),
                rdma(0, 2, 5_000_000, &[1]),
                rdma(3, 1, 50_000_000, &[]),
            ],
        );
        let after = [None, None, Some(0), None];
        let exact = simulate_streams(&topo, &plan, &after, &SimOptions::default()).unwrap();
        assert!(
            close(exact.transfers[2].end_us, 205.5),
            "{:?}",
            ends(&exact)
        );
        let grouped = SimOptions {
            tolerance: Some(0.01),
            group_arrivals: true,
            ..SimOptions::default()
        };
        let g = simulate_streams(&topo, &plan, &after, &grouped).unwrap();
        let end = g.transfers[2].end_us;
        assert!(
            (205.5 - 1e-6..=207.5 + 1e-6).contains(&end),
            "{:?}",
            ends(&g)
        );
    }

    /// Random transfers on two nodes of two GPUs (some waiting on earlier
    /// ones), each chained to the previous transfer of its (src, dst) pair
    /// when `chain` says so.
    fn random_case() -> impl Strategy<Value = (Vec<Transfer>, Vec<Option<u32>>)> {
        prop::collection::vec(
            (
                0u32..4,
                1u32..4,
                0u64..3_000_000,
                any::<bool>(),
                any::<bool>(),
            ),
            1..24,
        )
        .prop_map(|xs| {
            let mut ts = Vec::new();
            let mut after = Vec::new();
            let mut last: std::collections::HashMap<(u32, u32), u32> = Default::default();
            for (i, (src, d, bytes, dep, chain)) in xs.into_iter().enumerate() {
                let dst = (src + d) % 4;
                let deps: Vec<u32> = if dep && i > 0 {
                    vec![(i as u32 - 1) / 2]
                } else {
                    vec![]
                };
                ts.push(transfer(src, dst, bytes, &deps));
                after.push(if chain {
                    last.get(&(src, dst)).copied()
                } else {
                    None
                });
                last.insert((src, dst), i as u32);
            }
            (ts, after)
        })
    }

    use proptest::prelude::*;

    proptest! {
        /// A stream moves one transfer at a time, in order: a transfer
        /// moves no byte before the one it continues has delivered its
        /// last, never starts before its dependencies, and the links carry
        /// the same bytes as without streams.
        #[test]
        fn a_stream_moves_in_order((ts, after) in random_case()) {
            let topo = Topology::preset("dgx-h100", 2, Some(2)).unwrap();
            let plan = plan_of(&topo, ts);
            let o = SimOptions::default();
            let s = simulate_streams(&topo, &plan, &after, &o).unwrap();
            let plain = simulate(&topo, &plan, &o).unwrap();
            for (t, p) in after.iter().enumerate() {
                let x = s.transfers[t];
                for &d in &plan.transfers[t].deps {
                    prop_assert!(x.start_us >= s.transfers[d as usize].end_us);
                }
                if let Some(p) = p {
                    let e = s.transfers[*p as usize].end_us;
                    prop_assert!(x.end_us >= e, "{t} ends {} before {p} {e}", x.end_us);
                    if plan.transfers[t].bytes > 0 {
                        prop_assert!(s.moving_from_us(t) >= e - 1e-9 * e.max(1.0));
                    }
                }
            }
            for (a, b) in s.links.iter().zip(&plain.links) {
                prop_assert!(close(a.bytes, b.bytes), "{} vs {}", a.bytes, b.bytes);
            }
        }
    }

    #[test]
    fn malformed_streams_are_errors() {
        let topo = Topology::preset("dgx-h100", 1, Some(4)).unwrap();
        let plan = plan_of(
            &topo,
            vec![
                transfer(0, 1, 10, &[]),
                transfer(0, 1, 10, &[]),
                transfer(0, 2, 10, &[]),
                transfer(0, 1, 10, &[]),
            ],
        );
        let o = SimOptions::default();
        let err = |after: &[Option<u32>]| {
            simulate_streams(&topo, &plan, after, &o)
                .unwrap_err()
                .to_string()
        };
        assert!(err(&[None; 3]).contains("3 stream predecessors for 4"));
        assert!(err(&[None, Some(9), None, None]).contains("does not exist"));
        assert!(err(&[None, Some(1), None, None]).contains("itself"));
        assert!(err(&[None, None, Some(0), None]).contains("joins two ranks"));
        assert!(err(&[None, Some(0), None, Some(0)]).contains("continued by both"));
        // A stream against a dependency: T0 continues T1, which waits for T0.
        let mut cyc = plan.clone();
        cyc.transfers[1].deps = Deps::from_slice(&[0]);
        let e = simulate_streams(&topo, &cyc, &[Some(1), None, None, None], &o).unwrap_err();
        assert!(e.to_string().contains("cycle"), "{e}");
    }
}
