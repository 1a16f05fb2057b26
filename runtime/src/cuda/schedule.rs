//! How a plan maps onto CUDA streams, events and NCCL groups. Pure data, no
//! device: built and tested on any machine, consumed by the device code.
//!
//! Single process ([`stream_schedule`]): a transfer is issued by its source
//! rank on one of that rank's `channels` streams (channel = destination rank
//! mod `channels`, so the copies to different peers overlap). Transfers on one
//! stream run in issue order (a topological order), so a dependency on the
//! same stream costs nothing; a dependency on another stream becomes an event
//! recorded after the dependency and waited for before the dependent. A wait
//! is skipped when the stream already waited for a later event of that stream.
//!
//! One process per GPU ([`nccl_stages`]): transfers are grouped by level (the
//! longest dependency chain before them); per level, a rank issues its local
//! copies, then all its sends and receives inside one NCCL group. Every rank
//! lists the transfers between a pair of ranks in plan order, so both sides
//! post them in the same order, as NCCL's point-to-point matching requires.

use std::collections::HashMap;

use switchyard_compiler::Plan;

use crate::dag::Dag;
use crate::RuntimeError;

/// The channel (stream index within its issuing rank) of a transfer.
pub fn channel_of(dst: u32, channels: usize) -> usize {
    dst as usize % channels.max(1)
}

/// One copy to issue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamOp {
    pub transfer: u32,
    /// Global stream index: `issuer rank * channels + channel`.
    pub stream: u32,
    /// Events to wait for before the copy.
    pub wait: Vec<u32>,
    /// Event to record after the copy, when another stream depends on it.
    pub record: Option<u32>,
}

/// Every copy of a plan, in issue order, with its stream and events.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamSchedule {
    pub channels: usize,
    pub ops: Vec<StreamOp>,
    /// Number of distinct events (`0..events`).
    pub events: usize,
}

impl StreamSchedule {
    /// Streams that carry at least one op, in increasing order.
    pub fn used_streams(&self) -> Vec<u32> {
        let mut s: Vec<u32> = self.ops.iter().map(|o| o.stream).collect();
        s.sort_unstable();
        s.dedup();
        s
    }

    /// The rank that issues on global stream `stream`.
    pub fn issuer(&self, stream: u32) -> usize {
        stream as usize / self.channels.max(1)
    }
}

/// Assigns streams and events. `serial` puts every copy on stream 0 (the plan
/// could race, so copies must not overlap); zero-byte transfers are dropped
/// but their dependencies carry through.
pub fn stream_schedule(
    plan: &Plan,
    channels: usize,
    serial: bool,
) -> Result<StreamSchedule, RuntimeError> {
    let channels = channels.max(1);
    let dag = Dag::new(plan)?;
    let order = dag.topo_order()?;
    let n = plan.transfers.len();
    let stream_of = |i: usize| -> u32 {
        if serial {
            return 0;
        }
        let t = &plan.transfers[i];
        (t.src as usize * channels + channel_of(t.dst, channels)) as u32
    };
    // Position of each issued transfer: (op index, sequence number on its stream).
    let mut op_of: Vec<Option<usize>> = vec![None; n];
    let mut seq_of = vec![0u32; n];
    let mut next_seq: HashMap<u32, u32> = HashMap::new();
    // For an empty transfer: the issued transfers it stands for (its dependencies, transitively).
    let mut stand_in: Vec<Vec<u32>> = vec![Vec::new(); n];
    // waited[(a, b)] = highest sequence number of stream b that stream a already waited for.
    let mut waited: HashMap<(u32, u32), u32> = HashMap::new();
    let mut ops: Vec<StreamOp> = Vec::with_capacity(n);
    let mut events = 0usize;
    for &i in &order {
        let i = i as usize;
        let t = &plan.transfers[i];
        let mut deps: Vec<u32> = Vec::new();
        for &d in &t.deps {
            if op_of[d as usize].is_some() {
                deps.push(d);
            } else {
                deps.extend_from_slice(&stand_in[d as usize]);
            }
        }
        if t.bytes == 0 {
            deps.sort_unstable();
            deps.dedup();
            stand_in[i] = deps;
            continue;
        }
        let stream = stream_of(i);
        let mut wait = Vec::new();
        // Latest dependency per other stream: one wait covers the earlier ones.
        let mut latest: HashMap<u32, u32> = HashMap::new();
        for &d in &deps {
            let ds = ops[op_of[d as usize].unwrap_or_default()].stream;
            if ds == stream {
                continue;
            }
            let e = latest.entry(ds).or_insert(d);
            if seq_of[d as usize] > seq_of[*e as usize] {
                *e = d;
            }
        }
        let mut latest: Vec<(u32, u32)> = latest.into_iter().collect();
        latest.sort_unstable();
        for (ds, d) in latest {
            let seen = waited.entry((stream, ds)).or_insert(0);
            // Sequence numbers start at 1, so 0 means "never waited".
            if *seen >= seq_of[d as usize] {
                continue;
            }
            *seen = seq_of[d as usize];
            let op = &mut ops[op_of[d as usize].unwrap_or_default()];
            let ev = *op.record.get_or_insert_with(|| {
                events += 1;
                (events - 1) as u32
            });
            wait.push(ev);
        }
        let seq = next_seq.entry(stream).or_insert(0);
        *seq += 1;
        seq_of[i] = *seq;
        op_of[i] = Some(ops.len());
        ops.push(StreamOp {
            transfer: i as u32,
            stream,
            wait,
            record: None,
        });
    }
    Ok(StreamSchedule {
        channels,
        ops,
        events,
    })
}

/// The [`Inject::ReverseOrder`](crate::Inject::ReverseOrder) fault: every
/// non-empty transfer on one stream (rank 0's first), last transfer of the
/// plan first, no event waits: dependencies ignored.
pub fn reversed_schedule(plan: &Plan) -> StreamSchedule {
    StreamSchedule {
        channels: 1,
        ops: (0..plan.transfers.len() as u32)
            .rev()
            .filter(|&i| plan.transfers[i as usize].bytes > 0)
            .map(|i| StreamOp {
                transfer: i,
                stream: 0,
                wait: Vec::new(),
                record: None,
            })
            .collect(),
        events: 0,
    }
}

/// What one rank issues in one level.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NcclStage {
    pub level: u32,
    /// Copies inside this rank (source and destination both this rank).
    pub local: Vec<u32>,
    /// `(transfer, peer)`: this rank sends.
    pub sends: Vec<(u32, u32)>,
    /// `(transfer, peer)`: this rank receives.
    pub recvs: Vec<(u32, u32)>,
}

/// The stages rank `me` runs, in level order; levels where it has nothing to
/// do are left out. Zero-byte transfers are left out on both sides.
pub fn nccl_stages(plan: &Plan, me: u32) -> Result<Vec<NcclStage>, RuntimeError> {
    let dag = Dag::new(plan)?;
    let levels = dag.levels(plan)?;
    let depth = levels.iter().copied().max().map_or(0, |l| l as usize + 1);
    let mut stages: Vec<NcclStage> = (0..depth)
        .map(|l| NcclStage {
            level: l as u32,
            ..NcclStage::default()
        })
        .collect();
    for (i, t) in plan.transfers.iter().enumerate() {
        if t.bytes == 0 || (t.src != me && t.dst != me) {
            continue;
        }
        let s = &mut stages[levels[i] as usize];
        if t.src == me && t.dst == me {
            s.local.push(i as u32);
        } else if t.src == me {
            s.sends.push((i as u32, t.dst));
        } else {
            s.recvs.push((i as u32, t.src));
        }
    }
    stages.retain(|s| !(s.local.is_empty() && s.sends.is_empty() && s.recvs.is_empty()));
    Ok(stages)
}

/// NCCL loopback (a one-rank group): every local copy becomes a send to
/// this rank and a receive from it, in the same NCCL group, so that one
/// process exercises NCCL's send/recv. Both lists keep plan order, which
/// is how NCCL pairs a rank's sends to itself with its receives.
pub fn loopback(stages: Vec<NcclStage>, me: u32) -> Vec<NcclStage> {
    stages
        .into_iter()
        .map(|mut st| {
            let local = std::mem::take(&mut st.local);
            st.sends.extend(local.iter().map(|&i| (i, me)));
            st.recvs.extend(local.iter().map(|&i| (i, me)));
            st
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_compiler::sched::direct;
    use switchyard_compiler::{Buffer, Path, Topology, TrafficMatrix, Transfer};

    fn t(src: u32, dst: u32, bytes: u64, deps: &[u32]) -> Transfer {
        Transfer {
            src,
            src_buf: Buffer::Input,
            src_off: 0,
            dst,
            dst_buf: Buffer::Output,
            dst_off: 0,
            bytes,
            path: if src == dst {
                Path::Local
            } else {
                Path::Nvlink
            },
            step: 0,
            deps: deps.iter().copied().collect(),
        }
    }

    fn plan(ts: Vec<Transfer>) -> Plan {
        let mut p = Plan::new("test", 4, 4);
        p.transfers = ts;
        p
    }

    #[test]
    fn direct_plan_needs_no_events() {
        let topo = Topology::preset("dgx-h100", 2, Some(4)).unwrap();
        let m = TrafficMatrix::uniform(8, 10);
        let p = direct(&topo, &m);
        let s = stream_schedule(&p, 4, false).unwrap();
        assert_eq!(s.events, 0);
        assert_eq!(s.ops.len(), 64);
        // Rank 3's copies to ranks 1 and 5 share channel 1; 8 ranks x 4 channels.
        assert_eq!(s.used_streams().len(), 32);
        for op in &s.ops {
            let tr = &p.transfers[op.transfer as usize];
            assert_eq!(s.issuer(op.stream), tr.src as usize);
            assert_eq!(op.stream as usize % 4, tr.dst as usize % 4);
        }
    }

    #[test]
    fn cross_stream_dependencies_become_events() {
        // 0: 0->1 (stream 0*4+1), 1: 1->2 after 0 (stream 1*4+2), 2: 1->2 after 0 again
        // (same stream as 1: already waited), 3: 0->1 after 0 (same stream as 0: no event).
        let p = plan(vec![
            t(0, 1, 8, &[]),
            t(1, 2, 8, &[0]),
            t(1, 2, 8, &[0]),
            t(0, 1, 8, &[0]),
        ]);
        let s = stream_schedule(&p, 4, false).unwrap();
        let by_t = |i: u32| s.ops.iter().find(|o| o.transfer == i).unwrap().clone();
        assert_eq!(s.events, 1);
        assert_eq!(by_t(0).record, Some(0));
        assert_eq!(by_t(1).wait, vec![0]);
        assert!(by_t(2).wait.is_empty());
        assert!(by_t(3).wait.is_empty());
        assert_eq!(by_t(1).stream, 6);
    }

    #[test]
    fn serial_uses_one_stream_and_empty_transfers_pass_dependencies_on() {
        // 1 is empty; 2 depends on 1, so it must wait for 0 through it.
        let p = plan(vec![t(0, 1, 8, &[]), t(2, 3, 0, &[0]), t(3, 0, 8, &[1])]);
        let s = stream_schedule(&p, 2, false).unwrap();
        assert_eq!(s.ops.len(), 2);
        assert_eq!(s.ops[1].transfer, 2);
        assert_eq!(s.ops[1].wait, vec![0]);
        let s = stream_schedule(&p, 2, true).unwrap();
        assert!(s.ops.iter().all(|o| o.stream == 0 && o.wait.is_empty()));
        assert_eq!(s.events, 0);
    }

    #[test]
    fn the_reversed_schedule_runs_everything_on_one_stream_last_first() {
        let p = plan(vec![t(0, 1, 8, &[]), t(2, 3, 0, &[0]), t(3, 0, 8, &[1])]);
        let s = reversed_schedule(&p);
        let order: Vec<u32> = s.ops.iter().map(|o| o.transfer).collect();
        assert_eq!(order, vec![2, 0]);
        assert_eq!(s.used_streams(), vec![0]);
        assert_eq!(s.issuer(0), 0);
        assert!(s
            .ops
            .iter()
            .all(|o| o.wait.is_empty() && o.record.is_none()));
    }

    #[test]
    fn loopback_turns_local_copies_into_sends_to_self() {
        let p = plan(vec![t(0, 0, 8, &[]), t(0, 0, 4, &[]), t(0, 0, 2, &[0])]);
        let st = loopback(nccl_stages(&p, 0).unwrap(), 0);
        assert_eq!(st.len(), 2);
        assert!(st.iter().all(|s| s.local.is_empty()));
        assert_eq!(st[0].sends, vec![(0, 0), (1, 0)]);
        assert_eq!(st[0].recvs, st[0].sends);
        assert_eq!(st[1].sends, vec![(2, 0)]);
    }

    #[test]
    fn cycles_are_refused() {
        let p = plan(vec![t(0, 1, 8, &[1]), t(1, 0, 8, &[0])]);
        assert!(matches!(
            stream_schedule(&p, 2, false),
            Err(RuntimeError::Deadlock { .. })
        ));
    }

    #[test]
    fn nccl_groups_per_level_and_pairs_match() {
        // Level 0: 0->2 (rdma-like), 1->1 local; level 1: 2->3 relay after 0, 3->0.
        let p = plan(vec![
            t(0, 2, 8, &[]),
            t(1, 1, 8, &[]),
            t(2, 3, 8, &[0]),
            t(3, 0, 4, &[2]),
            t(0, 2, 0, &[]),
        ]);
        let s2 = nccl_stages(&p, 2).unwrap();
        assert_eq!(s2.len(), 2);
        assert_eq!(s2[0].recvs, vec![(0, 0)]);
        assert_eq!(s2[1].sends, vec![(2, 3)]);
        let s1 = nccl_stages(&p, 1).unwrap();
        assert_eq!(s1.len(), 1);
        assert_eq!(s1[0].local, vec![1]);
        let s0 = nccl_stages(&p, 0).unwrap();
        assert_eq!((s0[0].level, s0[1].level), (0, 2));
        // Every send at a level has its receive at the same level, in the same order.
        let topo = Topology::preset("dgx-h100", 2, Some(2)).unwrap();
        let m = TrafficMatrix::uniform(4, 3);
        let d = direct(&topo, &m);
        let all: Vec<Vec<NcclStage>> = (0..4).map(|r| nccl_stages(&d, r).unwrap()).collect();
        for a in 0..4u32 {
            for b in 0..4u32 {
                let sends: Vec<u32> = all[a as usize][0]
                    .sends
                    .iter()
                    .filter(|s| s.1 == b)
                    .map(|s| s.0)
                    .collect();
                let recvs: Vec<u32> = all[b as usize][0]
                    .recvs
                    .iter()
                    .filter(|s| s.1 == a)
                    .map(|s| s.0)
                    .collect();
                assert_eq!(sends, recvs);
            }
        }
    }
}
