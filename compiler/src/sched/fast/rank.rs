//! `fast` and `spray` for one rank, from that rank's
//! [`LocalTraffic`](crate::rank::LocalTraffic) only. The merged plan (one
//! stage of direct sends, chosen when the exchange is latency-bound or
//! every node sends through one NIC to few peers) is `direct` with
//! `fast`'s rails. The staged plan (and `spray`) runs the whole plan's
//! steps (balancing, stages, the emitter) over a view of the rank's blocks
//! ([`super::blocks::RankBlocks`]), emitting into a [`RankSink`]: only the
//! lanes whose transfers or chains the rank's program names.

use std::ops::Range;

use super::emit::{Emitter, Sink};
use crate::error::{Error, Result};
use crate::plan::{Path, Transfer};
use crate::rank::{direct_local, LocalProgram, LocalTraffic, TransferKey};

impl Emitter {
    /// True when the busiest NIC, loaded with what each GPU (`(out, in)`
    /// bytes to and from other nodes, in rank order) sends and receives,
    /// needs less than one inter-node latency (see `is_latency_bound`).
    pub(super) fn busiest_within_latency(&self, per_gpu: impl Iterator<Item = (u64, u64)>) -> bool {
        let g = self.gpus;
        let (mut busiest_out, mut busiest_in) = (0u64, 0u64);
        for (s, (out, inn)) in per_gpu.enumerate() {
            let share = self.weights.sharing[s % g];
            busiest_out = busiest_out.max(out * share);
            busiest_in = busiest_in.max(inn * share);
        }
        // GPUs sharing a rail are taken as equally loaded (an estimate).
        busiest_out.max(busiest_in) as f64 / self.nic_rate <= self.inter_latency
    }

    /// Rank `t.rank`'s program of the plan [`Emitter::plan_into`] makes for
    /// the traffic `t` is part of, made by the same steps as the whole plan
    /// but emitting only what the rank needs ([`RankSink`]). Errors
    /// ([`Error::NeedsWholeMatrix`]) where it cannot: a staged or `spray`
    /// plan when `t` has no [`crate::rank::NodeSplits`], on a mesh (the relief pass moves
    /// transfers of the whole plan), and when every node pair is sent
    /// directly (a direct lane's receives wait on the chains of every
    /// rail); and ([`Error::Input`]) when `t` does not fit the topology
    /// (checked by the caller).
    pub(crate) fn program_local_into(
        &mut self,
        t: &LocalTraffic,
        out: &mut LocalProgram,
    ) -> Result<()> {
        let name = if self.opts.staged { "fast" } else { "spray" };
        let nn = self.nodes;
        let refuse = |reason: &str| {
            Err(Error::NeedsWholeMatrix {
                algorithm: name.into(),
                reason: reason.into(),
            })
        };
        self.latency_bound = self.opts.staged
            && nn >= 2
            && self.busiest_within_latency(
                t.inter_out.iter().copied().zip(t.inter_in.iter().copied()),
            );
        self.merged = self.latency_bound || (self.opts.staged && self.one_nic_few_peers);
        let g = self.gpus;
        if self.merged {
            let path = |s: usize, d: usize| {
                if s == d {
                    Path::Local
                } else if s / g == d / g {
                    Path::Nvlink
                } else {
                    Path::Rdma {
                        nic: self.rail[s % g],
                    }
                }
            };
            direct_local(t, name, path, out);
            return Ok(());
        }
        let Some(splits) = t.node_splits.as_ref() else {
            return refuse(
                "the rank's traffic has no `node_splits` (what every rank sends every node), \
                 which its staged plan balances",
            );
        };
        if self.mesh {
            return refuse("its mesh relief pass reroutes transfers of the whole plan");
        }
        self.node_bytes.clear();
        self.node_bytes.extend_from_slice(&t.node_bytes);
        self.inter_blocks = splits.inter_blocks;
        let mut bufs = std::mem::take(&mut self.rank_bufs);
        let v = bufs.view(t, splits);
        self.balance(&v);
        if self.all_direct {
            self.rank_bufs = bufs;
            return refuse(
                "every node pair is sent directly, and a direct lane's receives wait on \
                 the chains of every rail",
            );
        }
        let mut scratch = std::mem::take(&mut self.rank_scratch);
        self.layout_scratch(&mut scratch);
        self.decompose();
        let mut sink = std::mem::take(&mut self.rank_sink);
        sink.reset(t.rank, g);
        self.emit_inter_node(&v, &mut sink);
        self.emit_intra_node(&v, &mut sink);
        out.reset(name, t.rank, t.ranks(), g);
        out.scratch_bytes = scratch.get(t.rank).copied().unwrap_or(0);
        sink.finish(out);
        self.rank_sink = sink;
        self.rank_scratch = scratch;
        self.rank_bufs = bufs;
        Ok(())
    }
}

/// Where the emitter writes one rank's program: the key of every transfer
/// it emits (dependencies name transfers by their emission ids), and the
/// transfers that start or end at the rank. It asks for the lanes whose
/// transfers, or whose chains, the rank's program names:
/// - every lane of its rail (lane `j` of every node pair): its sends and
///   receives wait on the send `depth` places back in the chains of the
///   GPUs of its rail, wherever the stage order put them;
/// - every lane of its node: its balancing moves out wait on the sends of
///   the carrier they feed, and its intra-node blocks on the early moves
///   of its node;
/// - every lane into its node: it receives their forwards.
///
/// and only the forwards and intra-node blocks of its node.
#[derive(Clone, Debug, Default)]
pub(crate) struct RankSink {
    rank: u32,
    node: usize,
    rail: usize,
    /// Key of each transfer emitted, by id (`rank: u32::MAX`: moves no bytes).
    keys: Vec<TransferKey>,
    /// The transfers of the rank, dependencies still as ids.
    kept: Vec<Transfer>,
}

impl RankSink {
    fn reset(&mut self, rank: usize, gpus: usize) {
        self.rank = rank as u32;
        self.node = rank / gpus;
        self.rail = rank % gpus;
        self.keys.clear();
        self.kept.clear();
    }

    /// The rank's side of each kept transfer, dependencies by key (those on
    /// transfers of no bytes left out, as in the canonical plan), sorted.
    fn finish(&mut self, out: &mut LocalProgram) {
        for t in self.kept.drain(..) {
            let keys = &self.keys;
            let deps = t.deps.iter().map(|&d| keys[d as usize]);
            out.push(&t, deps.filter(|k| k.rank != u32::MAX));
        }
        out.sort();
    }
}

impl Sink for RankSink {
    fn len(&self) -> usize {
        self.keys.len()
    }

    fn push(&mut self, t: Transfer) -> u32 {
        let key = if t.bytes == 0 {
            TransferKey {
                rank: u32::MAX,
                ..TransferKey::of(&t)
            }
        } else {
            TransferKey::of(&t)
        };
        self.keys.push(key);
        if t.bytes > 0 && (t.src == self.rank || t.dst == self.rank) {
            self.kept.push(t);
        }
        (self.keys.len() - 1) as u32
    }

    fn lanes(&self, a: usize, b: usize, g: usize) -> Range<usize> {
        if a == self.node || b == self.node {
            0..g
        } else {
            self.rail..self.rail + 1
        }
    }

    fn forwards_at(&self, b: usize) -> bool {
        b == self.node
    }

    fn intra_nodes(&self, _: usize) -> Range<usize> {
        self.node..self.node + 1
    }
}
