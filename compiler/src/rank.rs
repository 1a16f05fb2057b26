//! A rank's own program, planned without the whole plan (per-batch
//! planning at thousands of GPUs, where each rank executes about 1/R of the
//! plan).
//!
//! A plan names its transfers by their index, and that index depends on
//! every transfer planned before: a rank cannot know it without planning
//! them all. So a rank's own program names each transfer by what both of
//! its ends can compute alone: **where it writes**, a [`TransferKey`]
//! (destination rank, buffer, offset). In a plan the verifier accepts, no
//! byte is written twice, so every transfer that moves bytes has its own key.
//!
//! **Identical** means: stitching every rank's [`LocalProgram`] back into a
//! plan ([`stitch`]) gives exactly the whole plan put in canonical form
//! ([`canonical`]): the transfers that move bytes, sorted by key, each with
//! every field equal and its dependencies renumbered to the new indices and
//! sorted. Transfers of zero bytes move nothing and have no key: both forms
//! leave them out, with any dependency on them. The canonical form is the
//! same plan up to the order of its transfers, so the verifier, the
//! simulator and every quality figure hold for it unchanged.
//!
//! Owns: [`TransferKey`], [`LocalOp`], [`LocalProgram`], [`slice_into`] (a
//! rank's part of a whole plan, the reference), [`stitch`], [`canonical`],
//! and the per-rank planners of `direct` and `hierarchical`, which read
//! only the matrix entries their rank's transfers depend on. Knows nothing
//! of time; the `Planner` facade (planner.rs) chooses among them.

use std::collections::HashMap;

use serde::Serialize;

use crate::error::{InputError, Result};
use crate::plan::{Buffer, Deps, Path, Plan, Transfer};
use crate::program::OpKind;
use crate::topology::Topology;
use crate::traffic::TrafficMatrix;

/// The name of a transfer both its ends know: the place it writes.
#[derive(Serialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TransferKey {
    pub rank: u32,
    pub buf: Buffer,
    pub off: u64,
}

impl TransferKey {
    fn of(t: &Transfer) -> TransferKey {
        TransferKey {
            rank: t.dst,
            buf: t.dst_buf,
            off: t.dst_off,
        }
    }
}

/// One rank's side of one transfer (a whole local copy when both ends are
/// the rank). Both ends of the transfer are given, as in the plan.
#[derive(Serialize, Clone, Debug, PartialEq, Eq)]
pub struct LocalOp {
    pub op: OpKind,
    /// The other rank (the rank itself for a copy).
    pub peer: u32,
    pub bytes: u64,
    pub src_buf: Buffer,
    pub src_off: u64,
    pub dst_buf: Buffer,
    pub dst_off: u64,
    pub path: Path,
    pub step: u32,
    /// The transfers that must finish first, by key, sorted: on this rank
    /// or elsewhere.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub deps: Vec<TransferKey>,
}

impl LocalOp {
    /// The transfer's key, as seen from rank `me`.
    pub fn key(&self, me: u32) -> TransferKey {
        TransferKey {
            rank: if self.op == OpKind::Send {
                self.peer
            } else {
                me
            },
            buf: self.dst_buf,
            off: self.dst_off,
        }
    }

    /// The whole transfer, as seen from rank `me`, with no dependencies.
    fn transfer(&self, me: u32) -> Transfer {
        let (src, dst) = match self.op {
            OpKind::Send => (me, self.peer),
            OpKind::Recv => (self.peer, me),
            OpKind::Copy => (me, me),
        };
        Transfer {
            src,
            src_buf: self.src_buf,
            src_off: self.src_off,
            dst,
            dst_buf: self.dst_buf,
            dst_off: self.dst_off,
            bytes: self.bytes,
            path: self.path,
            step: self.step,
            deps: Deps::new(),
        }
    }
}

/// Everything one rank executes for one all-to-all: its sends, receives and
/// copies, sorted by key (so the transfers between two ranks come in the
/// same order on both), with their dependencies.
#[derive(Serialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct LocalProgram {
    /// The algorithm that planned it.
    pub algorithm: String,
    pub rank: u32,
    pub ranks: u32,
    pub gpus_per_node: u32,
    /// Scratch bytes this rank needs.
    pub scratch_bytes: u64,
    pub ops: Vec<LocalOp>,
}

impl LocalProgram {
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a local program serialises")
    }

    /// Empties the program for `rank`, keeping its allocations.
    fn reset(&mut self, algorithm: &str, rank: usize, ranks: usize, gpus: usize) {
        self.algorithm.clear();
        self.algorithm.push_str(algorithm);
        self.rank = rank as u32;
        self.ranks = ranks as u32;
        self.gpus_per_node = gpus as u32;
        self.scratch_bytes = 0;
        self.ops.clear();
    }

    /// Adds rank `self.rank`'s side of `t` (deps given as keys) unless it
    /// moves nothing or does not concern the rank.
    fn push(&mut self, t: &Transfer, deps: Vec<TransferKey>) {
        let me = self.rank;
        if t.bytes == 0 || (t.src != me && t.dst != me) {
            return;
        }
        let (op, peer) = if t.src == t.dst {
            (OpKind::Copy, me)
        } else if t.src == me {
            (OpKind::Send, t.dst)
        } else {
            (OpKind::Recv, t.src)
        };
        self.ops.push(LocalOp {
            op,
            peer,
            bytes: t.bytes,
            src_buf: t.src_buf,
            src_off: t.src_off,
            dst_buf: t.dst_buf,
            dst_off: t.dst_off,
            path: t.path,
            step: t.step,
            deps,
        });
    }

    fn sort(&mut self) {
        let me = self.rank;
        for o in &mut self.ops {
            o.deps.sort_unstable();
        }
        self.ops.sort_unstable_by_key(|o| o.key(me));
    }
}

pub(crate) fn check_rank(rank: usize, ranks: usize) -> Result<()> {
    if rank >= ranks {
        return Err(InputError::new(
            "rank",
            format!("{rank} is not a rank of the cluster (it has {ranks})"),
        )
        .into());
    }
    Ok(())
}

/// Rank `rank`'s part of a whole plan, into `out`: the reference every
/// per-rank planner must equal. Errors when the rank is not in the plan or
/// a dependency names no transfer.
pub fn slice_into(plan: &Plan, rank: usize, out: &mut LocalProgram) -> Result<()> {
    check_rank(rank, plan.ranks as usize)?;
    out.reset(
        &plan.algorithm,
        rank,
        plan.ranks as usize,
        plan.gpus_per_node as usize,
    );
    out.scratch_bytes = plan.scratch_bytes(rank);
    let me = rank as u32;
    for (i, t) in plan.transfers.iter().enumerate() {
        if t.bytes == 0 || (t.src != me && t.dst != me) {
            continue;
        }
        let mut deps = Vec::with_capacity(t.deps.len());
        for &d in &t.deps {
            let dep = plan.transfers.get(d as usize).ok_or_else(|| {
                InputError::new(
                    "plan",
                    format!("transfer {i} depends on transfer {d}, which does not exist"),
                )
            })?;
            if dep.bytes > 0 {
                deps.push(TransferKey::of(dep));
            }
        }
        out.push(t, deps);
    }
    out.sort();
    Ok(())
}

/// The whole plan in canonical form: the transfers that move bytes sorted
/// by key, dependencies renumbered and sorted (those on transfers of zero
/// bytes dropped).
pub fn canonical(plan: &Plan) -> Plan {
    let mut order: Vec<usize> = (0..plan.transfers.len())
        .filter(|&i| plan.transfers[i].bytes > 0)
        .collect();
    order.sort_unstable_by_key(|&i| TransferKey::of(&plan.transfers[i]));
    let mut new_index = vec![u32::MAX; plan.transfers.len()];
    for (k, &i) in order.iter().enumerate() {
        new_index[i] = k as u32;
    }
    let mut out = Plan {
        algorithm: plan.algorithm.clone(),
        ranks: plan.ranks,
        gpus_per_node: plan.gpus_per_node,
        scratch: plan.scratch.clone(),
        transfers: Vec::with_capacity(order.len()),
        chunking: plan.chunking.clone(),
        traffic_fingerprint: plan.traffic_fingerprint.clone(),
    };
    for &i in &order {
        let mut t = plan.transfers[i].clone();
        let mut deps: Vec<u32> = t
            .deps
            .iter()
            .filter_map(|&d| new_index.get(d as usize).copied())
            .filter(|&d| d != u32::MAX)
            .collect();
        deps.sort_unstable();
        t.deps = Deps::from_vec(deps);
        out.transfers.push(t);
    }
    out
}

/// One plan from every rank's program (in rank order), in canonical form.
/// Errors when the programs disagree: a transfer seen differently by its
/// two ends, one end missing, two transfers with one key, or a dependency
/// on a key no program has.
pub fn stitch(progs: &[LocalProgram]) -> Result<Plan> {
    let bad = |reason: String| -> crate::Error { InputError::new("programs", reason).into() };
    let first = progs.first().ok_or_else(|| bad("no programs".into()))?;
    let n = first.ranks as usize;
    if progs.len() != n {
        return Err(bad(format!("{} programs for {n} ranks", progs.len())));
    }
    let mut plan = Plan::new(first.algorithm.clone(), n, first.gpus_per_node as usize);
    // Every transfer with both of its ends: (key, transfer, deps, ends seen).
    let mut seen: HashMap<TransferKey, (Transfer, Vec<TransferKey>, u32)> = HashMap::new();
    for (r, p) in progs.iter().enumerate() {
        if p.rank as usize != r || p.ranks as usize != n || p.algorithm != first.algorithm {
            return Err(bad(format!(
                "program {r} is not rank {r}'s of the same plan"
            )));
        }
        if p.scratch_bytes > 0 {
            plan.need_scratch(r, p.scratch_bytes);
        }
        for o in &p.ops {
            let key = o.key(p.rank);
            let t = o.transfer(p.rank);
            let ends = if o.op == OpKind::Copy { 2 } else { 1 };
            match seen.get_mut(&key) {
                None => {
                    seen.insert(key, (t, o.deps.clone(), ends));
                }
                Some((t0, deps0, count)) => {
                    if *t0 != t || *deps0 != o.deps || *count + ends > 2 {
                        return Err(bad(format!(
                            "rank {r} and a peer disagree on the transfer into {key:?}"
                        )));
                    }
                    *count += ends;
                }
            }
        }
    }
    let mut all: Vec<(TransferKey, Transfer, Vec<TransferKey>, u32)> = seen
        .into_iter()
        .map(|(k, (t, d, c))| (k, t, d, c))
        .collect();
    all.sort_unstable_by_key(|x| x.0);
    let index: HashMap<TransferKey, u32> = all
        .iter()
        .enumerate()
        .map(|(i, x)| (x.0, i as u32))
        .collect();
    for (key, mut t, deps, ends) in all {
        if ends != 2 {
            return Err(bad(format!("the transfer into {key:?} has one end only")));
        }
        let mut ids = Vec::with_capacity(deps.len());
        for d in &deps {
            let id = index
                .get(d)
                .ok_or_else(|| bad(format!("a dependency on {d:?}, which no program has")))?;
            ids.push(*id);
        }
        ids.sort_unstable();
        t.deps = Deps::from_vec(ids);
        plan.transfers.push(t);
    }
    Ok(plan)
}

/// `direct` (sched/direct.rs) for one rank: its row and its column. The
/// offsets in the other ends' buffers need the column prefix of every
/// destination and the row prefix of every source: one pass over the rows
/// above the rank and one over each source's row up to the rank.
pub(crate) fn direct_into(
    topo: &Topology,
    m: &TrafficMatrix,
    rank: usize,
    out: &mut LocalProgram,
) -> Result<()> {
    let n = m.ranks();
    m.check_ranks(topo.ranks(), "traffic")?;
    check_rank(rank, n)?;
    out.reset("direct", rank, n, topo.gpus_per_node());
    let x = rank;
    // Where the rank's blocks land: the column sums above it.
    let mut above = vec![0u64; n];
    for s in 0..x {
        for (acc, &b) in above.iter_mut().zip(m.row(s)) {
            *acc += b;
        }
    }
    let mut src_off = 0u64;
    for (d, &bytes) in m.row(x).iter().enumerate() {
        if bytes > 0 {
            let t = block(topo, x, d, bytes, src_off, above[d]);
            out.push(&t, Vec::new());
        }
        src_off += bytes;
    }
    // What lands in the rank: each source's row up to the rank.
    let mut dst_off = 0u64;
    for s in 0..n {
        let row = m.row(s);
        let bytes = row[x];
        if bytes > 0 && s != x {
            let src_off = row[..x].iter().sum();
            let t = block(topo, s, x, bytes, src_off, dst_off);
            out.push(&t, Vec::new());
        }
        dst_off += bytes;
    }
    out.sort();
    Ok(())
}

fn block(topo: &Topology, s: usize, d: usize, bytes: u64, src_off: u64, dst_off: u64) -> Transfer {
    Transfer {
        src: s as u32,
        src_buf: Buffer::Input,
        src_off,
        dst: d as u32,
        dst_buf: Buffer::Output,
        dst_off,
        bytes,
        path: crate::sched::path_between(topo, s, d),
        step: 0,
        deps: Deps::new(),
    }
}

/// `hierarchical` (sched/hierarchical.rs) for rank `x` = GPU `j` of node
/// `a`: the rows of its node (what it gathers and relays), its own column
/// (what lands in it) and the rail-`j` entries of the other nodes' rows
/// (where their relays keep what they send it).
pub(crate) fn hierarchical_into(
    topo: &Topology,
    m: &TrafficMatrix,
    rank: usize,
    out: &mut LocalProgram,
) -> Result<()> {
    let n = m.ranks();
    m.check_ranks(topo.ranks(), "traffic")?;
    check_rank(rank, n)?;
    let (g, nodes) = (topo.gpus_per_node(), topo.nodes());
    out.reset("hierarchical", rank, n, g);
    let x = rank;
    let (a, j) = (x / g, x % g);
    // Offset of node `b`'s region in the scratch of relay (src, rail): what
    // node `src` sends to GPU `rail` of the nodes before `b`. Read row by
    // row (a column walk misses the cache at every entry).
    let region_off = |src: usize, rail: usize, b: usize| -> u64 {
        (src * g..(src + 1) * g)
            .map(|s| {
                let row = m.row(s);
                (0..b)
                    .filter(|&b2| b2 != src)
                    .map(|b2| row[b2 * g + rail])
                    .sum::<u64>()
            })
            .sum()
    };
    // The same for the relays of the rank's own node, from its rows:
    // `regions[rail * nodes + b]`, and the rank's scratch.
    let mut regions = vec![0u64; g * nodes];
    for s in a * g..(a + 1) * g {
        for (d, &bytes) in m.row(s).iter().enumerate() {
            regions[(d % g) * nodes + d / g] += bytes;
        }
    }
    for rail in 0..g {
        let mut acc = 0u64;
        for b in 0..nodes {
            let at = &mut regions[rail * nodes + b];
            let bytes = if b == a { 0 } else { *at };
            *at = acc;
            acc += bytes;
        }
        if rail == j {
            out.scratch_bytes = acc;
        }
    }
    // Column sums of column `d` over rows `0..upto`: where block (upto, d) lands.
    let col_prefix = |d: usize, upto: usize| -> u64 { (0..upto).map(|s| m.get(s, d)).sum() };
    // Where the rank's phase-2 sends land: in GPU j of node b, after the
    // blocks from the nodes before `a` (`rail_above[b]`), row by row.
    let mut rail_above = vec![0u64; nodes];
    for s in 0..a * g {
        let row = m.row(s);
        for (b, acc) in rail_above.iter_mut().enumerate() {
            *acc += row[b * g + j];
        }
    }
    // The rank's own column, summed: `own_col[s]` is where block (s, x) lands.
    let mut own_col = Vec::with_capacity(n + 1);
    let mut acc = 0u64;
    for s in 0..n {
        own_col.push(acc);
        acc += m.get(s, x);
    }
    let key = |rank: usize, off: u64| TransferKey {
        rank: rank as u32,
        buf: Buffer::Scratch,
        off,
    };
    // Phase 1 from the rank: its row.
    let row = m.row(x);
    let mut src_off = 0u64;
    for (d, &bytes) in row.iter().enumerate() {
        let (b, jd) = (d / g, d % g);
        if bytes > 0 {
            let t = if b == a {
                block(topo, x, d, bytes, src_off, col_prefix(d, x))
            } else {
                let relay = a * g + jd;
                let before: u64 = (0..j).map(|i| m.get(a * g + i, d)).sum();
                phase1(
                    topo,
                    x,
                    relay,
                    bytes,
                    src_off,
                    regions[jd * nodes + b] + before,
                )
            };
            out.push(&t, Vec::new());
        }
        src_off += bytes;
    }
    // Phase 1 into the rank: intra-node blocks, and what it relays.
    for i in (0..g).filter(|&i| i != j) {
        let s = a * g + i;
        let row = m.row(s);
        let mut src_off = 0u64;
        for (d, &bytes) in row.iter().enumerate() {
            let (b, jd) = (d / g, d % g);
            if bytes > 0 && (d == x || (b != a && jd == j)) {
                let t = if d == x {
                    block(topo, s, d, bytes, src_off, own_col[s])
                } else {
                    let before: u64 = (0..i).map(|i2| m.get(a * g + i2, d)).sum();
                    phase1(topo, s, x, bytes, src_off, regions[j * nodes + b] + before)
                };
                out.push(&t, Vec::new());
            }
            src_off += bytes;
        }
    }
    // Phase 2 from the rank (relay (a, j)) to GPU j of every other node, and
    // into the rank from the relays of rail j of every other node.
    for b in (0..nodes).filter(|&b| b != a) {
        for (src_node, dst_node) in [(a, b), (b, a)] {
            let relay = src_node * g + j;
            let d = dst_node * g + j;
            let region = if src_node == a {
                regions[j * nodes + dst_node]
            } else {
                region_off(src_node, j, dst_node)
            };
            let mut deps = Vec::new();
            let mut bytes = 0u64;
            for i in 0..g {
                let part = m.get(src_node * g + i, d);
                if part > 0 {
                    deps.push(key(relay, region + bytes));
                }
                bytes += part;
            }
            if bytes == 0 {
                continue;
            }
            let t = Transfer {
                src: relay as u32,
                src_buf: Buffer::Scratch,
                src_off: region,
                dst: d as u32,
                dst_buf: Buffer::Output,
                dst_off: if d == x {
                    own_col[src_node * g]
                } else {
                    rail_above[dst_node]
                },
                bytes,
                path: Path::Rdma {
                    nic: topo.rail_of(relay) as u32,
                },
                step: 1,
                deps: Deps::new(),
            };
            out.push(&t, deps);
        }
    }
    out.sort();
    Ok(())
}

fn phase1(
    topo: &Topology,
    s: usize,
    relay: usize,
    bytes: u64,
    src_off: u64,
    dst_off: u64,
) -> Transfer {
    Transfer {
        src: s as u32,
        src_buf: Buffer::Input,
        src_off,
        dst: relay as u32,
        dst_buf: Buffer::Scratch,
        dst_off,
        bytes,
        path: crate::sched::path_between(topo, s, relay),
        step: 0,
        deps: Deps::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(src: u32, dst: u32, dst_buf: Buffer, dst_off: u64, bytes: u64, deps: &[u32]) -> Transfer {
        Transfer {
            src,
            src_buf: Buffer::Input,
            src_off: 0,
            dst,
            dst_buf,
            dst_off,
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

    /// Canonical order is by key; deps follow their transfers; transfers
    /// of zero bytes and deps on them go; slicing every rank and stitching
    /// gives the canonical plan back.
    #[test]
    fn canonical_and_round_trip() {
        let mut p = Plan::new("test", 2, 2);
        p.push(t(1, 0, Buffer::Output, 8, 4, &[])); // 0 -> key (0, output, 8)
        p.push(t(0, 1, Buffer::Scratch, 0, 0, &[])); // 1: zero bytes, dropped
        p.push(t(0, 0, Buffer::Output, 0, 8, &[1])); // 2 -> key (0, output, 0)
        p.push(t(0, 1, Buffer::Output, 0, 4, &[0, 2])); // 3 -> key (1, output, 0)
        p.need_scratch(1, 16);
        let c = canonical(&p);
        let seen: Vec<(u32, u64, Vec<u32>)> = c
            .transfers
            .iter()
            .map(|t| (t.dst, t.dst_off, t.deps.to_vec()))
            .collect();
        assert_eq!(
            seen,
            vec![(0, 0, vec![]), (0, 8, vec![]), (1, 0, vec![0, 1])]
        );
        let progs: Vec<LocalProgram> = (0..2)
            .map(|r| {
                let mut out = LocalProgram::default();
                slice_into(&p, r, &mut out).unwrap();
                out
            })
            .collect();
        assert_eq!(progs[0].ops[0].op, OpKind::Copy);
        assert_eq!(progs[1].scratch_bytes, 16);
        assert_eq!(stitch(&progs).unwrap(), c);
        // Two transfers writing one place cannot both be named.
        let mut twice = p.clone();
        twice.push(t(1, 0, Buffer::Output, 8, 4, &[]));
        let progs: Vec<LocalProgram> = (0..2)
            .map(|r| {
                let mut out = LocalProgram::default();
                slice_into(&twice, r, &mut out).unwrap();
                out
            })
            .collect();
        assert!(stitch(&progs).is_err());
    }
}
