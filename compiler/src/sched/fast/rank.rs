//! `fast` and `spray` for one rank, from that rank's
//! [`LocalTraffic`](crate::rank::LocalTraffic) only. Today: the merged plan
//! (one stage of direct sends, chosen when the exchange is latency-bound or
//! every node sends through one NIC to few peers), which is `direct` with
//! `fast`'s rails. The staged plan needs the whole matrix (its chains of
//! sends tie every GPU of a rail to every other): the caller slices the
//! whole plan instead.

use super::emit::Emitter;
use crate::error::{Error, Result};
use crate::plan::Path;
use crate::rank::{direct_local, LocalProgram, LocalTraffic};

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
    /// the traffic `t` is part of. Errors ([`Error::NeedsWholeMatrix`]) when
    /// that plan is staged, and ([`Error::Input`]) when `t` does not fit
    /// the topology (checked by the caller).
    pub(crate) fn program_local_into(
        &self,
        t: &LocalTraffic,
        out: &mut LocalProgram,
    ) -> Result<()> {
        let name = if self.opts.staged { "fast" } else { "spray" };
        let nn = self.nodes;
        let latency_bound = self.opts.staged
            && nn >= 2
            && self.busiest_within_latency(
                t.inter_out.iter().copied().zip(t.inter_in.iter().copied()),
            );
        let merged = latency_bound || (self.opts.staged && self.one_nic_few_peers);
        if !merged {
            return Err(Error::NeedsWholeMatrix {
                algorithm: name.into(),
                reason:
                    "its staged plan chains every send of a rail to the sends of every other node"
                        .into(),
            });
        }
        let g = self.gpus;
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
        Ok(())
    }
}
