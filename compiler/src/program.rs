//! One rank's part of a plan, as plain data any executor can run: what the
//! rank sends, receives and copies, each with the level it belongs to.
//!
//! Levels come from the plan's dependencies ([`DepGraph::levels`]): a
//! transfer's level is one more than its deepest dependency's. An executor
//! that runs level after level, every operation of a level at once and all of
//! them finished before the next level starts, honours every dependency of the
//! plan, because a transfer's dependencies all sit on lower levels. Both sides
//! of a transfer see it on the same level, so a rank that posts a level's sends
//! and receives as one group (NCCL's `ncclGroupStart`/`End`, torch's
//! `batch_isend_irecv`) is always matched by its peers' groups: no deadlock.
//! Inside a level, operations are in plan order, the same on every rank, so
//! several transfers between one pair of ranks match in order.
//!
//! A rank's own program (module [`crate::rank`], planned without the whole
//! plan) becomes the same form through [`from_local`]. Its transfers have no
//! plan index, so `transfer` is then the transfer's place among those
//! between the same two ranks in the same direction, which both ends
//! compute alike (own programs are sorted by the place each transfer
//! writes). Its levels are the plan's steps, which both ends also know,
//! for the algorithms whose steps order every dependency
//! ([`steps_are_levels`]); for the others no order that both ends agree on
//! and that follows the dependencies is known without the whole plan (the
//! longest dependency chain through a transfer is a whole-plan quantity),
//! so they run their whole plan's programs.
//!
//! Owns: [`RankProgram`], [`Op`], [`program`], [`programs`], [`from_local`].
//! Knows nothing of time, topologies or how the plan was made.

use serde::Serialize;

use crate::error::{Error, InputError, Result};
use crate::plan::{Buffer, DepGraph, Path, Plan};
use crate::rank::LocalProgram;
pub use crate::rank::OpKind;

/// One operation of a rank: one side of a plan transfer, or a whole local copy.
/// Both ends of the transfer are given on both sides, so either side can
/// check the other.
#[derive(Serialize, Clone, Debug, PartialEq, Eq)]
pub struct Op {
    pub op: OpKind,
    /// Level of the transfer: every operation of a lower level must finish first.
    pub level: u32,
    /// Index of the transfer in the plan.
    pub transfer: u32,
    /// The other rank (the rank itself for a copy).
    pub peer: u32,
    pub bytes: u64,
    pub src_buf: Buffer,
    pub src_off: u64,
    pub dst_buf: Buffer,
    pub dst_off: u64,
    pub path: Path,
    /// Indices (in this program's `ops`) of the receives and copies that
    /// write bytes this op reads: its data dependencies on this rank. An
    /// executor that does not run level by level waits for these before it
    /// sends or copies (docs/python.md, "Rank programs"). Empty for ops that
    /// read only what the plan never writes (a rank's input).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub after: Vec<u32>,
}

/// Everything one rank executes for a plan, level by level.
#[derive(Serialize, Clone, Debug, PartialEq, Eq)]
pub struct RankProgram {
    pub rank: u32,
    pub ranks: u32,
    /// Levels of the whole plan: an executor runs levels `0..levels`; this
    /// rank may have nothing to do on some of them.
    pub levels: u32,
    /// Scratch bytes this rank needs.
    pub scratch_bytes: u64,
    /// Sorted by level, then by transfer index. Transfers of zero bytes are
    /// left out: they move nothing, and levels already order what follows them.
    pub ops: Vec<Op>,
}

impl RankProgram {
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a rank program serialises")
    }
}

/// The program of rank `rank`. Errors when the rank is not in the plan or the
/// plan's dependencies are broken (a dependency that names no transfer, or a
/// cycle): such a plan has no order to run in.
pub fn program(plan: &Plan, rank: usize) -> Result<RankProgram> {
    if rank >= plan.ranks as usize {
        return Err(InputError::new(
            "rank",
            format!("{rank} is not a rank of the plan (it has {})", plan.ranks),
        )
        .into());
    }
    let levels = plan_levels(plan)?;
    let mut prog = empty(plan, rank, &levels);
    for (i, t) in plan.transfers.iter().enumerate() {
        if t.bytes > 0 && (t.src as usize == rank || t.dst as usize == rank) {
            push_side(&mut prog, plan, i, levels[i], rank as u32);
        }
    }
    sort(&mut prog);
    Ok(prog)
}

/// The programs of every rank, in rank order, in one pass over the plan.
pub fn programs(plan: &Plan) -> Result<Vec<RankProgram>> {
    let levels = plan_levels(plan)?;
    let mut progs: Vec<RankProgram> = (0..plan.ranks as usize)
        .map(|r| empty(plan, r, &levels))
        .collect();
    for (i, t) in plan.transfers.iter().enumerate() {
        if t.bytes == 0 {
            continue;
        }
        let (s, d) = (t.src as usize, t.dst as usize);
        if s >= progs.len() || d >= progs.len() {
            return Err(bad_plan(format!(
                "transfer {i} names rank {} of a plan of {} ranks",
                s.max(d),
                plan.ranks
            )));
        }
        push_side(&mut progs[s], plan, i, levels[i], t.src);
        if s != d {
            push_side(&mut progs[d], plan, i, levels[i], t.dst);
        }
    }
    for p in &mut progs {
        sort(p);
    }
    Ok(progs)
}

/// True when every plan of `algorithm` (its name, as a plan records it)
/// puts each transfer's dependencies on lower steps: its steps are then
/// levels an executor may run in order, and both ends of a transfer know
/// its step. `direct` (one step, no dependencies), `hierarchical`, `pxn`
/// and `deepep` (a relay step after the gathering step). Not `fast` and
/// `spray`: their pipelining and balancing moves depend on transfers of
/// the same stage. The test `steps_order_dependencies` checks this list.
pub fn steps_are_levels(algorithm: &str) -> bool {
    matches!(algorithm, "direct" | "hierarchical" | "pxn" | "deepep")
}

/// The executor form of a rank's own program: every op with its `after`
/// (the ops of this rank whose writes it reads), `transfer` the op's place
/// among the transfers between the same two ranks in the same direction
/// (the tag both ends agree on), and a level both ends know. Where the
/// algorithm's steps are levels ([`steps_are_levels`]) the level is the
/// step, and every dependency of the plan holds. Otherwise (`fast`,
/// `spray`) it is the op's data level ([`data_level`]): the plan's pacing
/// (which sends wait for which) is dropped, as the dataflow executor drops
/// it, and every op still comes after the writes it reads. Ops are in
/// level order, which is a topological order of those dependencies on
/// every rank: an executor that posts them in order (levels, or a dataflow
/// that waits for `after` before each send) never waits for a peer that
/// waits for it.
///
/// Errors ([`Error::Unsupported`]) when an op reads a write of its own
/// data level or above (a scratch-to-scratch hop reading another: no data
/// level orders it); ([`Error::Input`]) when a dependency inside the
/// program is not on a lower step where steps are levels.
pub fn from_local(local: &LocalProgram) -> Result<RankProgram> {
    let by_step = steps_are_levels(&local.algorithm);
    let me = local.rank;
    // Own programs are sorted by key: a dependency on an op of this program
    // is found by binary search.
    let keys: Vec<_> = local.ops.iter().map(|o| o.key(me)).collect();
    let mut next_tag: std::collections::HashMap<(u32, bool), u32> = Default::default();
    let mut ops = Vec::with_capacity(local.ops.len());
    for o in &local.ops {
        for d in o.deps.iter().filter(|_| by_step) {
            if let Ok(i) = keys.binary_search(d) {
                if local.ops[i].step >= o.step {
                    return Err(InputError::new(
                        "program",
                        format!(
                            "rank {me}: the transfer into {:?} (step {}) depends on one of \
                             step {}: its steps are not levels",
                            o.key(me),
                            o.step,
                            local.ops[i].step
                        ),
                    )
                    .into());
                }
            }
        }
        let tag = next_tag.entry((o.peer, o.op == OpKind::Send)).or_insert(0);
        ops.push(Op {
            op: o.op,
            level: if by_step {
                o.step
            } else {
                data_level(o.src_buf, o.dst_buf)
            },
            transfer: *tag,
            peer: o.peer,
            bytes: o.bytes,
            src_buf: o.src_buf,
            src_off: o.src_off,
            dst_buf: o.dst_buf,
            dst_off: o.dst_off,
            path: o.path,
            after: Vec::new(),
        });
        *tag += 1;
    }
    // Stable: inside a level the ops stay in key order, the same on both ends.
    ops.sort_by_key(|o| o.level);
    let mut prog = RankProgram {
        rank: me,
        ranks: local.ranks,
        levels: ops.iter().map(|o| o.level + 1).max().unwrap_or(0),
        scratch_bytes: local.scratch_bytes,
        ops,
    };
    link_writers(&mut prog);
    if !by_step {
        for o in &prog.ops {
            if let Some(&w) = o
                .after
                .iter()
                .find(|&&w| prog.ops[w as usize].level >= o.level)
            {
                let w = &prog.ops[w as usize];
                return Err(Error::Unsupported {
                    algorithm: local.algorithm.clone(),
                    reason: format!(
                        "rank {me}: a {:?} -> {:?} op reads what a {:?} -> {:?} op writes, \
                         which no data level orders",
                        o.src_buf, o.dst_buf, w.src_buf, w.dst_buf
                    ),
                });
            }
        }
    }
    Ok(prog)
}

/// The data level of a transfer by the buffers it reads and writes, which
/// both its ends know: 0 from an input (nothing writes inputs), 1 from a
/// scratch into a scratch (the network hop of a block a balancing move or
/// a relay put there), 2 from a scratch into an output (a forward, after
/// either). Every op of a `fast` or `spray` program reads only writes of
/// a lower data level ([`from_local`] checks it), so ordering each rank's
/// ops by it orders the data dependencies of the whole plan.
pub fn data_level(src: Buffer, dst: Buffer) -> u32 {
    match (src, dst) {
        (Buffer::Input, _) => 0,
        (_, Buffer::Scratch) => 1,
        _ => 2,
    }
}

fn bad_plan(reason: String) -> crate::error::Error {
    InputError::new("plan", reason).into()
}

fn plan_levels(plan: &Plan) -> Result<Vec<u32>> {
    let graph = DepGraph::new(plan).map_err(|(i, d)| {
        bad_plan(format!(
            "transfer {i} depends on transfer {d}, which does not exist or is itself"
        ))
    })?;
    graph.levels(plan).map_err(|indeg| {
        let first = indeg.iter().position(|&d| d > 0).unwrap_or(0);
        bad_plan(format!(
            "its dependencies form a cycle, e.g. through transfer {first}"
        ))
    })
}

fn empty(plan: &Plan, rank: usize, levels: &[u32]) -> RankProgram {
    RankProgram {
        rank: rank as u32,
        ranks: plan.ranks,
        levels: levels.iter().max().map_or(0, |&l| l + 1),
        scratch_bytes: plan.scratch_bytes(rank),
        ops: Vec::new(),
    }
}

/// Adds rank `me`'s side of transfer `i`.
fn push_side(prog: &mut RankProgram, plan: &Plan, i: usize, level: u32, me: u32) {
    let t = &plan.transfers[i];
    let (op, peer) = OpKind::side(t, me);
    prog.ops.push(Op {
        op,
        level,
        transfer: i as u32,
        peer,
        bytes: t.bytes,
        src_buf: t.src_buf,
        src_off: t.src_off,
        dst_buf: t.dst_buf,
        dst_off: t.dst_off,
        path: t.path,
        after: Vec::new(),
    });
}

/// Sorts the ops (level, then plan order) and finds their data dependencies.
fn sort(prog: &mut RankProgram) {
    prog.ops.sort_unstable_by_key(|o| (o.level, o.transfer));
    link_writers(prog);
}

/// Fills every op's `after`: the receives and copies of this rank that write
/// a byte the op reads. A verified plan writes no byte twice, so the ranges
/// written into one buffer are disjoint and a read finds its writers by
/// binary search.
fn link_writers(prog: &mut RankProgram) {
    // (buffer, start, end, op) of every write into this rank.
    let mut writes: Vec<(Buffer, u64, u64, u32)> = prog
        .ops
        .iter()
        .enumerate()
        .filter(|(_, o)| o.op != OpKind::Send)
        .map(|(i, o)| (o.dst_buf, o.dst_off, o.dst_off + o.bytes, i as u32))
        .collect();
    if writes.is_empty() {
        return;
    }
    writes.sort_unstable();
    for o in prog.ops.iter_mut().filter(|o| o.op != OpKind::Recv) {
        let (start, end) = (o.src_off, o.src_off + o.bytes);
        // Writes into this buffer that start before the read ends...
        let upto = writes.partition_point(|w| (w.0, w.1) < (o.src_buf, end));
        let from = writes.partition_point(|w| w.0 < o.src_buf);
        // ...and, going back from there, end after it starts.
        for w in writes[from..upto].iter().rev() {
            if w.2 <= start {
                break;
            }
            o.after.push(w.3);
        }
        o.after.sort_unstable();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sched::{schedule, Algorithm, Options};
    use crate::{Topology, TrafficMatrix, Transfer};

    fn t(src: u32, dst: u32, bytes: u64, deps: &[u32]) -> Transfer {
        Transfer {
            src,
            src_buf: Buffer::Input,
            src_off: 0,
            dst,
            dst_buf: Buffer::Scratch,
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

    #[test]
    fn levels_sides_and_order() {
        let mut p = Plan::new("test", 3, 3);
        p.push(t(0, 1, 8, &[])); // 0: level 0
        p.push(t(1, 2, 8, &[0])); // 1: level 1
        p.push(t(1, 1, 4, &[])); // 2: level 0, a copy
        p.push(t(2, 0, 0, &[1])); // 3: zero bytes, left out
        p.push(t(0, 1, 2, &[1, 2])); // 4: level 2
        let progs = programs(&p).unwrap();
        let one = &progs[1];
        assert_eq!(one.levels, 3);
        let seen: Vec<(OpKind, u32, u32, u32)> = one
            .ops
            .iter()
            .map(|o| (o.op, o.level, o.transfer, o.peer))
            .collect();
        assert_eq!(
            seen,
            vec![
                (OpKind::Recv, 0, 0, 0),
                (OpKind::Copy, 0, 2, 1),
                (OpKind::Send, 1, 1, 2),
                (OpKind::Recv, 2, 4, 0),
            ]
        );
        assert!(progs[2].ops.iter().all(|o| o.transfer != 3));
        for (r, prog) in progs.iter().enumerate() {
            assert_eq!(&program(&p, r).unwrap(), prog);
        }
    }

    #[test]
    fn errors_are_input_errors() {
        let mut p = Plan::new("test", 2, 2);
        p.push(t(0, 1, 8, &[1]));
        p.push(t(1, 0, 8, &[0]));
        let e = programs(&p).unwrap_err().to_string();
        assert!(e.contains("cycle"), "{e}");
        assert!(program(&Plan::new("x", 2, 2), 2)
            .unwrap_err()
            .to_string()
            .contains("not a rank"));
    }

    /// A program from a rank's own program has the ops of the whole plan's
    /// program for that rank, each reading after the same writes; its tags
    /// match between the two ends of every transfer; its levels are the
    /// steps where [`steps_are_levels`] says so.
    #[test]
    fn from_local_matches_the_whole_plans_programs() {
        use crate::rank::slice_into;
        let topo = Topology::preset("dgx-h100", 3, Some(4)).unwrap();
        let mut m = TrafficMatrix::uniform(12, 3000);
        m.set(0, 5, 300_000);
        m.set(7, 2, 90_000);
        m.set(4, 4, 0);
        for alg in [
            Algorithm::Direct,
            Algorithm::Hierarchical,
            Algorithm::Pxn,
            Algorithm::Fast,
            Algorithm::Spray,
        ] {
            let plan = schedule(alg, &topo, &m, &Options::default()).unwrap();
            let layered = steps_are_levels(&plan.algorithm);
            assert_eq!(
                layered,
                !matches!(alg, Algorithm::Fast | Algorithm::Spray),
                "{alg}"
            );
            let mut tags = std::collections::HashMap::new();
            // Ops from a scratch into a scratch (`fast`'s balanced network hops).
            let mut scratch_hops = 0;
            for r in 0..12 {
                let mut local = LocalProgram::default();
                slice_into(&plan, r, &mut local).unwrap();
                let ours = from_local(&local).unwrap();
                let whole = program(&plan, r).unwrap();
                assert_eq!(ours.ops.len(), whole.ops.len(), "{alg} rank {r}");
                assert_eq!(ours.scratch_bytes, whole.scratch_bytes);
                // The same ops (by where they write), the same writers read.
                let place = |p: &RankProgram, i: usize| {
                    let o = &p.ops[i];
                    (o.op as u8, o.peer, o.dst_buf, o.dst_off, o.src_off, o.bytes)
                };
                let norm = |p: &RankProgram| {
                    let mut v: Vec<_> = (0..p.ops.len())
                        .map(|i| {
                            let mut after: Vec<_> = p.ops[i]
                                .after
                                .iter()
                                .map(|&w| place(p, w as usize))
                                .collect();
                            after.sort_unstable();
                            (place(p, i), after)
                        })
                        .collect();
                    v.sort_unstable();
                    v
                };
                assert_eq!(norm(&ours), norm(&whole), "{alg} rank {r}");
                for o in &ours.ops {
                    {
                        let step = local
                            .ops
                            .iter()
                            .find(|l| {
                                l.op == o.op
                                    && l.peer == o.peer
                                    && l.dst_buf == o.dst_buf
                                    && l.dst_off == o.dst_off
                            })
                            .unwrap()
                            .step;
                        let want = if layered {
                            step
                        } else {
                            data_level(o.src_buf, o.dst_buf)
                        };
                        assert_eq!(o.level, want);
                    }
                    scratch_hops += usize::from(!layered && o.level == 1);
                    // Every write an op reads is on a lower level.
                    for &w in &o.after {
                        assert!(ours.ops[w as usize].level < o.level, "{alg} rank {r}");
                    }
                    if o.op == OpKind::Copy {
                        continue;
                    }
                    let (src, dst) = if o.op == OpKind::Send {
                        (r as u32, o.peer)
                    } else {
                        (o.peer, r as u32)
                    };
                    let seen = tags
                        .entry((src, dst, o.dst_buf, o.dst_off))
                        .or_insert(o.transfer);
                    assert_eq!(*seen, o.transfer, "{alg}: ends disagree on a tag");
                }
            }
            if alg == Algorithm::Fast {
                assert!(
                    scratch_hops > 0,
                    "no balanced network hop: data level 1 untested"
                );
            }
        }
    }

    /// What [`steps_are_levels`] claims, on plans with relays and skew: no
    /// dependency on a transfer of the same or a later step.
    #[test]
    fn steps_order_dependencies() {
        let topo = Topology::preset("dgx-h100", 4, Some(4)).unwrap();
        let mut m = TrafficMatrix::uniform(16, 5000);
        for (s, d) in [(0, 9), (3, 14), (12, 1), (6, 6)] {
            m.set(s, d, 400_000);
        }
        let mut checked = 0;
        for alg in Algorithm::ALL {
            if matches!(alg, Algorithm::Lp | Algorithm::Auto) {
                continue;
            }
            let plan = schedule(*alg, &topo, &m, &Options::default()).unwrap();
            if !steps_are_levels(&plan.algorithm) {
                continue;
            }
            checked += 1;
            for t in &plan.transfers {
                for &d in &t.deps {
                    assert!(plan.transfers[d as usize].step < t.step, "{alg}");
                }
            }
        }
        assert_eq!(checked, 4);
    }

    /// Every transfer with bytes appears once on each side (once for a
    /// copy), on one level on both sides, and above all its dependencies.
    #[test]
    fn fast_plan_sides_match() {
        let topo = Topology::preset("dgx-h100", 2, Some(4)).unwrap();
        let mut m = TrafficMatrix::uniform(8, 1000);
        m.set(0, 5, 300_000);
        let plan = schedule(Algorithm::Fast, &topo, &m, &Options::default()).unwrap();
        let progs = programs(&plan).unwrap();
        let mut sides = vec![0u32; plan.transfers.len()];
        let mut level = vec![u32::MAX; plan.transfers.len()];
        for p in &progs {
            for o in &p.ops {
                sides[o.transfer as usize] += 1;
                let l = &mut level[o.transfer as usize];
                assert!(*l == u32::MAX || *l == o.level);
                *l = o.level;
            }
        }
        // Every read of scratch or output waits for the writes it reads,
        // and those are on a lower level. (This plan relays through scratch.)
        assert!(progs
            .iter()
            .any(|p| p.ops.iter().any(|o| !o.after.is_empty())));
        for p in &progs {
            for o in p.ops.iter().filter(|o| o.op != OpKind::Recv) {
                let covered: u64 = o
                    .after
                    .iter()
                    .map(|&w| {
                        let w = &p.ops[w as usize];
                        assert!(w.level < o.level && w.dst_buf == o.src_buf);
                        let lo = w.dst_off.max(o.src_off);
                        let hi = (w.dst_off + w.bytes).min(o.src_off + o.bytes);
                        hi.saturating_sub(lo)
                    })
                    .sum();
                let want = if o.src_buf == Buffer::Input {
                    0
                } else {
                    o.bytes
                };
                assert_eq!(covered, want, "rank {} transfer {}", p.rank, o.transfer);
            }
        }
        for (i, tr) in plan.transfers.iter().enumerate() {
            let want = if tr.bytes == 0 {
                0
            } else if tr.src == tr.dst {
                1
            } else {
                2
            };
            assert_eq!(sides[i], want, "transfer {i}");
            for &d in &tr.deps {
                if plan.transfers[d as usize].bytes > 0 && tr.bytes > 0 {
                    assert!(level[d as usize] < level[i]);
                }
            }
        }
    }
}
