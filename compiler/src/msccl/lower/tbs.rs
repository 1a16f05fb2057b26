//! Threadblocks and their waits (steps 3 and 4 of the lowering): puts the
//! chunk operations into tbs, one global order, and gives every step the
//! waits it needs, dropping those its gpu's own order implies; the
//! elements floor and the gpus left uncut.

use std::collections::{BTreeMap, HashMap};

use crate::msccl::fit;
use crate::msccl::ops::{ChunkOp, Part};
use crate::msccl::MAX_STEPS_PER_TB;
use crate::msccl::{BufRef, Step, StepKind, Tb};
use crate::msccl::{Executor, MAX_NODES};
use crate::sim::TransferTime;

use super::lanes::{assign_lanes, LaneShare, Lanes, MAX_LANES};
use super::walks::{ancestors_on, FastMap, OpGraph, Walks, WALKS_PER_OP};
use super::LowerError;

/// Which tb a step goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) enum TbKey {
    /// Sends to `peer` on `chan`.
    Send { peer: u32, chan: u32 },
    /// Receives from `peer` on `chan`.
    Recv { peer: u32, chan: u32 },
    /// Local copies, the `k`-th such tb.
    Local { k: u32 },
}

pub(super) struct Built {
    pub(super) tbs: Vec<Vec<Tb>>,
    /// Per gpu, tb and step: the operation the step belongs to (a nop
    /// belongs to the operation it waits before), in the order of `tbs`.
    pub(super) op_of: Vec<Vec<Vec<u32>>>,
    pub(super) channels: u32,
    pub(super) dropped: usize,
    pub(super) unheld: usize,
    pub(super) lanes_short: usize,
    pub(super) tbs_wanted: usize,
    /// Tails handed to the next head (`super::handoff`).
    pub(super) handoffs: usize,
    /// Per operation (the indices of `op_of`): when the plan's timeline
    /// starts its first chunk and delivers its last ([`planned_spans`]);
    /// empty where some operation's transfer is not on the timeline.
    pub(super) spans: Vec<(f64, f64)>,
}

/// `pairwise`'s waits as its executor holds them: a round's send waits for
/// every block its gpu received in earlier rounds (`sched::pairwise`),
/// and receives wait for nothing (a receive-side wait never holds its
/// sender, and every block goes from input to output with no relay). Written
/// as is, a send of round `k` would wait for `k` receive tbs, one nop
/// each (127 at 16 x 8, more than a tb's 64 steps). Instead each send also
/// waits for the previous transfer's send on its gpu, which waited for all
/// older receives, so `drop_implied_waits` leaves two waits: the newest
/// receive and the previous send. That wait costs nothing the plan does
/// not ask for: the previous send started no later (its receives are a
/// subset) and is done once staged.
pub(super) struct SendChain {
    /// Per operation: a send of at most a FIFO window of calls, staged as
    /// soon as it starts when it is the first on its connection. A longer
    /// one is staged only when its receiver has taken all but the window:
    /// waiting for it would hold the next round back, so the chain skips
    /// such a transfer and the receives it waited for are waited for
    /// directly.
    short: Vec<bool>,
    /// Per gpu: the transfer (`ChunkOp::from`) of its latest send, that
    /// transfer's first operation if short, and the operation the
    /// transfer's sends follow.
    last: Vec<Option<ChainLink>>,
}

/// A gpu's latest send in [`SendChain`]: its transfer, that transfer's
/// first operation if short, and the operation its sends follow.
type ChainLink = (u32, Option<u32>, Option<u32>);

impl SendChain {
    pub(super) fn new(short: Vec<bool>, n: usize) -> Self {
        SendChain {
            short,
            last: vec![None; n],
        }
    }

    /// The operation the send `o` (of transfer `from`, on gpu `g`) waits
    /// for: the short first send of the latest earlier transfer that has
    /// one. Operations of one transfer (its lanes and chunk runs) do not
    /// wait for each other.
    fn follow(&mut self, g: u32, from: u32, o: u32) -> Option<u32> {
        let slot = &mut self.last[g as usize];
        match *slot {
            Some((f, _, target)) if f == from => target,
            prev => {
                let target = prev.and_then(|(_, first, target)| first.or(target));
                let short = self.short.get(o as usize).copied().unwrap_or(false);
                *slot = Some((from, short.then_some(o), target));
                target
            }
        }
    }
}

/// A tb under construction.
pub(super) struct TbDraft {
    key: TbKey,
    steps: Vec<Step>,
    /// The operation of each step.
    ops: Vec<u32>,
    /// Latest position of each other tb this tb has waited for.
    waited: HashMap<u32, u32>,
}

#[allow(clippy::too_many_arguments)]
pub(super) fn build_tbs(
    ops: &[ChunkOp],
    n: usize,
    timeline: &[TransferTime],
    executor: Executor,
    split: &[u32],
    parts: &[Part],
    hand: Option<(&[Part], u32)>,
    mut chain: Option<SendChain>,
    share: LaneShare,
) -> std::result::Result<Built, LowerError> {
    let max_channels = executor.max_channels();
    // Threadblocks built before packing (`super::pack`) brings a gpu down
    // to the profile's limit: the loader's own array bound.
    let max_tbs = MAX_TBS_BUILT;
    // Channel groups keep at most 32 peer tbs per channel per direction
    // (`super::fit::ChannelGroups`).
    let cg = fit::ChannelGroups::new(
        n,
        ops.iter()
            .filter(|o| o.src != o.dst)
            .map(|o| (o.src as usize, o.dst as usize)),
    );
    let groups = cg.groups;
    // Gpus with more single-direction tbs than the profile loads: their
    // tbs are packed two to one (`super::pack`) only where both are
    // short, so their steps' waits are reduced (step 4) even when they fit.
    let packed: Vec<bool> = {
        let mut conns: Vec<(u32, u32)> = ops
            .iter()
            .filter(|o| o.src != o.dst)
            .map(|o| (o.src, o.dst))
            .collect();
        conns.sort_unstable();
        conns.dedup();
        let mut tbs = vec![0usize; n];
        for &(s, d) in &conns {
            tbs[s as usize] += 1;
            tbs[d as usize] += 1;
        }
        tbs.iter()
            .map(|&t| t + 1 > executor.max_tbs_per_gpu())
            .collect()
    };
    let mut tbs: Vec<Vec<TbDraft>> = (0..n).map(|_| Vec::new()).collect();
    let mut tb_index: Vec<FastMap<TbKey, u32>> = vec![FastMap::default(); n];
    // Lanes a connection may have in all: half the channels its group can
    // reach, the rest left for tbs that pass 64 steps.
    let max_per_conn = (max_channels / groups.max(1) / 2).clamp(1, MAX_LANES);
    let lanes = assign_lanes(
        ops,
        n,
        timeline,
        executor.tb_budget(),
        split,
        parts,
        max_per_conn,
        share,
    );
    // A paced transfer's tail handed to the head that follows it on its
    // lane (`super::handoff`): the operations change, the lanes stay.
    let handed = hand.and_then(|(parts, window)| {
        crate::msccl::handoff::hand_off(ops, parts, window, &lanes.of_op, timeline)
    });
    let (ops, lanes) = match &handed {
        Some((o, of_op, _)) => (
            &o[..],
            Lanes {
                of_op: of_op.clone(),
                ..lanes
            },
        ),
        None => (ops, lanes),
    };
    let handoffs = handed.as_ref().map_or(0, |h| h.2);
    // Elements each gpu's file will hold at least (`elements_floor`),
    // raised by every nop written: a chunk whose file cannot fit the
    // parser is refused as soon as that shows, not after every wait is
    // walked (64 x 8 `fast`: its first lowering fails there).
    let graph = OpGraph::new(ops);
    let mut floor = elements_floor(ops, n, executor.max_tbs_per_gpu());
    if let Some(why) = over_elements(&floor) {
        return Err(LowerError::Limit(why));
    }
    // Channel of each (src, dst, lane); lane `l` starts at group `l`.
    let mut chan_of: FastMap<(u32, u32, u32), u32> = FastMap::default();
    let mut local_k = vec![0u32; n];
    // Where each operation's step sits on each gpu it touches, its sending
    // gpu first: (tb, pos).
    let mut at: Vec<[(u32, u32); 2]> = vec![[(u32::MAX, 0); 2]; ops.len()];
    let side_of = |x: u32, g: u32| usize::from(ops[x as usize].src != g);
    let mut anc = Walks::new(ops.len());
    // The walks through other gpus' operations are memoised per (operation,
    // gpu); past this many the rest are not followed (their waits dropped
    // and counted), so memory stays proportional to the plan.
    let walk_cap = WALKS_PER_OP * ops.len() + (1 << 16);
    let mut dropped = 0usize;
    let mut unheld: std::collections::HashSet<(u32, u32)> = std::collections::HashSet::new();
    let mut channels = 1u32;
    // The last operation whose deps were walked, its lists and drops.
    let mut last_need: Option<(u32, Vec<Vec<u32>>, usize)> = None;
    for (o, op) in ops.iter().enumerate() {
        let o = o as u32;
        let gpus: Vec<u32> = if op.src == op.dst {
            vec![op.src]
        } else {
            vec![op.src, op.dst]
        };
        // A chained plan's receives wait for nothing (`SendChain`): only
        // the sending gpu's operations are looked for.
        let walked = if chain.is_some() {
            &gpus[..1]
        } else {
            &gpus[..]
        };
        // Operations on each side's gpu this one must follow. The
        // operations of one transfer (its runs, its pacing cuts) mostly
        // share their deps: the walks would find the same lists again
        // (the memo only grows, so even capped walks repeat), and the
        // waits they add, dropped or unheld, are the same.
        let same = last_need.as_ref().filter(|(p, _, _)| {
            let q = &ops[*p as usize];
            (q.src, q.dst, q.from) == (op.src, op.dst, op.from)
                && q.deps == op.deps
                && q.recv_deps == op.recv_deps
        });
        let need = if let Some((_, need, d)) = same {
            dropped += d;
            need.clone()
        } else {
            let dropped_before = dropped;
            let mut need = walk_deps(
                ops,
                &graph,
                op,
                walked,
                &mut anc,
                walk_cap,
                &mut dropped,
                &mut unheld,
            );
            need.resize(gpus.len(), Vec::new());
            last_need = Some((o, need.clone(), dropped - dropped_before));
            need
        };
        // The send this one follows on its gpu (`SendChain`).
        let after = match chain.as_mut() {
            Some(c) if op.src != op.dst => c.follow(op.src, op.from, o),
            _ => None,
        };
        let lane = lanes.of_op[o as usize];
        loop {
            let keys: Vec<TbKey> = if op.src == op.dst {
                vec![TbKey::Local {
                    k: local_k[op.src as usize],
                }]
            } else {
                let c = *chan_of
                    .entry((op.src, op.dst, lane))
                    .or_insert_with(|| cg.of(op.src as usize, op.dst as usize) + groups * lane);
                if c >= max_channels {
                    return Err(LowerError::Limit(format!(
                        "operations from rank {} to rank {} need more than {max_channels} channels of {MAX_STEPS_PER_TB} steps",
                        op.src, op.dst
                    )));
                }
                vec![
                    TbKey::Send {
                        peer: op.dst,
                        chan: c,
                    },
                    TbKey::Recv {
                        peer: op.src,
                        chan: c,
                    },
                ]
            };
            // Waits per side: (tb, pos) targets, own tb and implied ones removed.
            let mut fits = true;
            let mut plans = Vec::new();
            for (side, (&g, &key)) in gpus.iter().zip(&keys).enumerate() {
                let gi = g as usize;
                let own = tb_index[gi].get(&key).copied();
                let mut latest: BTreeMap<u32, u32> = BTreeMap::new();
                for &x in &need[side] {
                    // `x` touches `g` and precedes this operation: placed.
                    let (tb, pos) = at[x as usize][side_of(x, g)];
                    if Some(tb) == own {
                        continue;
                    }
                    let e = latest.entry(tb).or_insert(pos);
                    *e = (*e).max(pos);
                }
                if let Some(t) = own {
                    let w = &tbs[gi][t as usize].waited;
                    latest.retain(|tb, pos| w.get(tb).is_none_or(|&p| p < *pos));
                }
                if let (0, Some(y)) = (side, after) {
                    // The previous transfer's send: its waits (and theirs)
                    // hold this one's older receives.
                    let (tb, pos) = at[y as usize][0];
                    if Some(tb) != own {
                        let e = latest.entry(tb).or_insert(pos);
                        *e = (*e).max(pos);
                    }
                }
                if chain.is_some() && side == 0 {
                    drop_implied_waits(&tbs[gi], own, &mut latest);
                }
                let len = own.map_or(0, |t| tbs[gi][t as usize].steps.len());
                // Many waits, or more than the tb holds: first those the
                // gpu's own order already implies go (each costs a step,
                // and long tbs cannot be packed), then (a fresh tb that
                // still cannot hold them) the oldest, dropped and counted.
                let mut lost = 0;
                if (packed[gi] && latest.len() > MAX_WAITS_UNREDUCED)
                    || len + latest.len().max(1) > MAX_STEPS_PER_TB
                {
                    drop_implied_waits(&tbs[gi], own, &mut latest);
                    if own.is_none() {
                        lost = drop_oldest_waits(&tbs[gi], &mut latest, MAX_STEPS_PER_TB);
                    }
                }
                if len + latest.len().max(1) > MAX_STEPS_PER_TB {
                    fits = false;
                }
                plans.push((gi, key, latest, lost));
            }
            if !fits {
                if op.src == op.dst {
                    local_k[op.src as usize] += 1;
                } else {
                    *chan_of.get_mut(&(op.src, op.dst, lane)).expect("set above") +=
                        groups * lanes.per_conn[&(op.src, op.dst)];
                }
                continue;
            }
            for (side, (gi, key, latest, lost)) in plans.into_iter().enumerate() {
                dropped += lost;
                let t = match tb_index[gi].get(&key) {
                    Some(&t) => t,
                    None => {
                        let t = tbs[gi].len() as u32;
                        if t as usize >= max_tbs {
                            return Err(LowerError::Limit(format!(
                                "rank {gi} needs more than {max_tbs} threadblocks ({executor})"
                            )));
                        }
                        tbs[gi].push(TbDraft {
                            key,
                            steps: Vec::new(),
                            ops: Vec::new(),
                            waited: HashMap::new(),
                        });
                        tb_index[gi].insert(key, t);
                        t
                    }
                };
                if let TbKey::Send { chan, .. } = key {
                    channels = channels.max(chan + 1);
                }
                let kind = match (op.src == op.dst, side) {
                    (true, _) => StepKind::Copy,
                    (false, 0) => StepKind::Send,
                    (false, _) => StepKind::Recv,
                };
                let waits: Vec<(u32, u32)> = latest.into_iter().collect();
                let draft = &mut tbs[gi][t as usize];
                if waits.len() > 1 {
                    floor[gi] += waits.len() - 1;
                    if floor[gi] > MAX_NODES {
                        return Err(LowerError::Limit(over_elements_message(gi, floor[gi])));
                    }
                }
                for (idx, &(tb, pos)) in waits.iter().enumerate() {
                    draft.waited.insert(tb, pos);
                    let is_last = idx + 1 == waits.len();
                    let s = draft.steps.len() as i64;
                    draft.steps.push(Step {
                        s,
                        kind: if is_last { kind } else { StepKind::Nop },
                        srcbuf: if is_last { op.src_buf } else { BufRef::Input },
                        srcoff: if is_last { op.src_off as i64 } else { -1 },
                        dstbuf: if is_last { op.dst_buf } else { BufRef::Output },
                        dstoff: if is_last { op.dst_off as i64 } else { -1 },
                        cnt: if is_last { op.cnt as i64 } else { 0 },
                        depid: tb as i64,
                        deps: pos as i64,
                        hasdep: false,
                        line: 0,
                    });
                }
                if waits.is_empty() {
                    let s = draft.steps.len() as i64;
                    draft.steps.push(Step {
                        s,
                        kind,
                        srcbuf: op.src_buf,
                        srcoff: op.src_off as i64,
                        dstbuf: op.dst_buf,
                        dstoff: op.dst_off as i64,
                        cnt: op.cnt as i64,
                        depid: -1,
                        deps: -1,
                        hasdep: false,
                        line: 0,
                    });
                }
                draft.ops.resize(draft.steps.len(), o);
                let pos = draft.steps.len() as u32 - 1;
                at[o as usize][side] = (t, pos);
                for (tb, p) in waits {
                    tbs[gi][tb as usize].steps[p as usize].hasdep = true;
                }
            }
            break;
        }
    }
    // Number tbs as msccl-tools does, by (send, recv, chan), local ones first.
    let mut out = Vec::with_capacity(n);
    let mut op_of = Vec::with_capacity(n);
    for (g, drafts) in tbs.into_iter().enumerate() {
        let mut order: Vec<usize> = (0..drafts.len()).collect();
        let sort_key = |k: &TbKey| -> (i64, i64, u32) {
            match *k {
                TbKey::Local { k } => (-1, -1, k),
                TbKey::Send { peer, chan } => (peer as i64, -1, chan),
                TbKey::Recv { peer, chan } => (-1, peer as i64, chan),
            }
        };
        order.sort_by_key(|&i| sort_key(&drafts[i].key));
        let mut new_id = vec![0i64; drafts.len()];
        for (new, &old) in order.iter().enumerate() {
            new_id[old] = new as i64;
        }
        let mut tbv: Vec<Tb> = Vec::with_capacity(drafts.len());
        let mut opv: Vec<Vec<u32>> = Vec::with_capacity(drafts.len());
        let mut drafts: Vec<Option<TbDraft>> = drafts.into_iter().map(Some).collect();
        for &old in &order {
            let d = drafts[old].take().expect("each tb once");
            let (send, recv, chan) = match d.key {
                TbKey::Send { peer, chan } => (peer as i64, -1, chan as i64),
                TbKey::Recv { peer, chan } => (-1, peer as i64, chan as i64),
                TbKey::Local { .. } => (-1, -1, 0),
            };
            let steps = d
                .steps
                .into_iter()
                .map(|mut s| {
                    if s.depid >= 0 {
                        s.depid = new_id[s.depid as usize];
                    }
                    s
                })
                .collect();
            opv.push(d.ops);
            tbv.push(Tb {
                id: new_id[old],
                send,
                recv,
                chan,
                steps,
                line: 0,
            });
        }
        let _ = g;
        out.push(tbv);
        op_of.push(opv);
    }
    Ok(Built {
        tbs: out,
        op_of,
        spans: planned_spans(ops, timeline).unwrap_or_default(),
        channels,
        dropped,
        unheld: unheld.len(),
        lanes_short: lanes.short,
        tbs_wanted: lanes.tbs_wanted,
        handoffs,
    })
}

/// Per operation, when the plan starts sending its first chunk and
/// delivers its last: its transfer's timeline interpolated by the chunks
/// of that transfer (between the same gpus) before and up to this
/// operation, in operation order (a transfer's runs and cut pieces go in
/// byte order). `None` if an operation's transfer is not on the timeline.
pub(super) fn planned_spans(ops: &[ChunkOp], timeline: &[TransferTime]) -> Option<Vec<(f64, f64)>> {
    let mut total: HashMap<(u32, u32, u32), u64> = HashMap::new();
    for o in ops {
        timeline.get(o.from as usize)?;
        *total.entry((o.from, o.src, o.dst)).or_default() += u64::from(o.cnt);
    }
    let mut done: HashMap<(u32, u32, u32), u64> = HashMap::new();
    let clean = |x: f64| if x.is_finite() { x.max(0.0) } else { 0.0 };
    Some(
        ops.iter()
            .map(|o| {
                let key = (o.from, o.src, o.dst);
                let d = done.entry(key).or_default();
                let all = total[&key].max(1) as f64;
                let t = timeline[o.from as usize];
                let at = |c: u64| t.start_us + c as f64 / all * (t.end_us - t.start_us);
                let first = at(*d);
                *d += u64::from(o.cnt);
                (clean(first), clean(at(*d)))
            })
            .collect(),
    )
}

/// Removes from `latest` (the waits of a step about to go on tb `own` of
/// one gpu, or on a new tb: awaited tb -> position) every wait the gpu's
/// own order already holds: the tb's earlier steps, the other awaited
/// steps' predecessors in their tbs, and, transitively, whatever those
/// steps waited for. The executor holds each removed wait through the
/// ones kept; nothing across gpus is assumed. One walk over the gpu's
/// steps, at most once each.
pub(super) fn drop_implied_waits(
    drafts: &[TbDraft],
    own: Option<u32>,
    latest: &mut BTreeMap<u32, u32>,
) {
    // Per tb, the last step known to be done before the new step.
    let mut done: Vec<i64> = vec![-1; drafts.len()];
    let mut stack: Vec<(u32, u32)> = Vec::new();
    let seed = |tb: u32, pos: u32, stack: &mut Vec<(u32, u32)>| {
        let st = &drafts[tb as usize].steps[pos as usize];
        if pos > 0 {
            stack.push((tb, pos - 1));
        }
        if st.depid >= 0 {
            stack.push((st.depid as u32, st.deps as u32));
        }
    };
    if let Some(t) = own {
        let len = drafts[t as usize].steps.len() as u32;
        if len > 0 {
            stack.push((t, len - 1));
        }
    }
    for (&tb, &pos) in latest.iter() {
        seed(tb, pos, &mut stack);
    }
    // A walk cut short implies less: sound, only fewer waits go.
    let mut budget = DFS_STEPS;
    while let Some((t, p)) = stack.pop() {
        let from = done[t as usize] + 1;
        if i64::from(p) < from {
            continue;
        }
        let span = (i64::from(p) + 1 - from) as usize;
        if span > budget {
            break;
        }
        budget -= span;
        for st in &drafts[t as usize].steps[from as usize..=p as usize] {
            if st.depid >= 0 {
                stack.push((st.depid as u32, st.deps as u32));
            }
        }
        done[t as usize] = i64::from(p);
    }
    latest.retain(|&tb, &mut pos| done[tb as usize] < i64::from(pos));
}

/// A floor on the elements each gpu's file would hold (`1 + n + tbs +
/// steps`, what the executor's parser counts against [`MAX_NODES`]), from
/// the operations alone, before pacing cuts and threadblocks: every
/// operation is a step on each gpu it touches (waits only add nops before
/// it), and the passes after this one only add operations between the same
/// gpus (`cut_for_pacing` cuts one into several; `super::handoff` merges a
/// tail it cut back into its body); a connection direction's steps (and a
/// gpu's local copies) fill tbs of at most [`MAX_STEPS_PER_TB`] steps;
/// packing (`super::pack`) leaves `limit` tbs or more where a gpu has more.
/// A chunk whose floor is over the limit fails it anyway: the lowering
/// refuses it before the costly passes.
pub(super) fn elements_floor(ops: &[ChunkOp], n: usize, limit: usize) -> Vec<usize> {
    let mut steps = vec![0usize; n];
    // (gpu, peer, side: 0 send, 1 receive, 2 local copy) -> steps.
    let mut conn: FastMap<(u32, u32, u8), usize> = FastMap::default();
    for o in ops {
        if o.src == o.dst {
            steps[o.src as usize] += 1;
            *conn.entry((o.src, o.src, 2)).or_default() += 1;
        } else {
            steps[o.src as usize] += 1;
            steps[o.dst as usize] += 1;
            *conn.entry((o.src, o.dst, 0)).or_default() += 1;
            *conn.entry((o.dst, o.src, 1)).or_default() += 1;
        }
    }
    let mut tbs = vec![0usize; n];
    for (&(g, _, _), &c) in &conn {
        tbs[g as usize] += c.div_ceil(MAX_STEPS_PER_TB);
    }
    (0..n)
        .map(|g| 1 + n + tbs[g].min(limit) + steps[g])
        .collect()
}

/// Elements before pacing cuts ([`elements_floor`]) above which a gpu's
/// transfers are not cut ([`uncut_gpus`]): 7/8 of [`MAX_NODES`], 512 left
/// for the cuts' steps and the nops of the waits. At 64 x 8 `fast`
/// (dgx-h100, 512 ranks) a hot receiver's gpu had 3760 (Zipf 1.2) and
/// 3951 (MoE) elements before the cuts, about 1190 more after them and
/// 320-390 nops; every other gpu fewer than 3400 (log-normal: at most
/// 2958). Cut anyway, the lowering doubled every gpu's chunk four times,
/// until that gpu's transfers were too short to cut: Zipf's file at 16
/// times the base chunk, 146x buffers, priced by the executor's rules at
/// 13.6 times its plan. With that gpu written whole it fits at twice the
/// base chunk, 110x, 2.0 times its plan, in two lowerings instead of five
/// (docs/benchmarks.md, "A hot gpu's transfers written whole").
pub(super) const UNCUT_ABOVE: usize = MAX_NODES / 8 * 7;

/// Per gpu, whether its file's elements before any pacing cut
/// ([`elements_floor`] of `ops`) are over [`UNCUT_ABOVE`]; empty where
/// none is. Files of up to 64 ranks hold at most a few hundred.
pub(super) fn uncut_gpus(ops: &[ChunkOp], n: usize, limit: usize) -> Vec<bool> {
    let floor = elements_floor(ops, n, limit);
    if floor.iter().all(|&e| e <= UNCUT_ABOVE) {
        return Vec::new();
    }
    floor.iter().map(|&e| e > UNCUT_ABOVE).collect()
}

/// The first gpu whose floor ([`elements_floor`]) is over [`MAX_NODES`],
/// as the limit the lowering reports.
pub(super) fn over_elements(floor: &[usize]) -> Option<String> {
    floor
        .iter()
        .enumerate()
        .find(|&(_, &e)| e > MAX_NODES)
        .map(|(g, &e)| over_elements_message(g, e))
}

/// The limit gpu `g` misses with a floor of `e` elements.
fn over_elements_message(g: usize, e: usize) -> String {
    format!("gpu {g} would hold at least {e} elements, the executor parses at most {MAX_NODES}")
}

/// Steps one `drop_implied_waits` walk visits at most (a 16 x 8
/// `pairwise` gpu has about 1300).
const DFS_STEPS: usize = 1 << 14;

/// Keeps the `max` waits of `latest` on the latest operations (in the
/// global order) and drops the rest, returning how many were dropped:
/// what a fresh tb of `max` steps cannot hold even after
/// `drop_implied_waits` (none of `pairwise`'s 65-tb barriers at 16 x 8
/// need it). The step then starts once its latest predecessors on this
/// gpu are done.
pub(super) fn drop_oldest_waits(
    drafts: &[TbDraft],
    latest: &mut BTreeMap<u32, u32>,
    max: usize,
) -> usize {
    if latest.len() <= max {
        return 0;
    }
    let mut by_op: Vec<(u32, u32)> = latest
        .iter()
        .map(|(&tb, &pos)| (drafts[tb as usize].ops[pos as usize], tb))
        .collect();
    by_op.sort_unstable();
    let extra = latest.len() - max;
    for &(_, tb) in &by_op[..extra] {
        latest.remove(&tb);
    }
    extra
}

/// The operations on each of `gpus` (an operation's sending gpu first)
/// that `op` must follow, sorted: its deps walked back to the operations
/// that touch each gpu. A dep found on neither counts as dropped; a send's
/// wait met on its own gpu only by sends goes into `unheld`.
#[allow(clippy::too_many_arguments)]
fn walk_deps(
    ops: &[ChunkOp],
    graph: &OpGraph,
    op: &ChunkOp,
    gpus: &[u32],
    anc: &mut Walks,
    walk_cap: usize,
    dropped: &mut usize,
    unheld: &mut std::collections::HashSet<(u32, u32)>,
) -> Vec<Vec<u32>> {
    let mut need: Vec<Vec<u32>> = vec![Vec::new(); gpus.len()];
    for &x in &op.deps {
        let mut found = false;
        // What `x` adds on the sending gpu (`gpus[0]` is `op.src`).
        let mut on_src = 0..0;
        for (side, &g) in gpus.iter().enumerate() {
            let before = need[side].len();
            ancestors_on(graph, x, g, anc, walk_cap, &mut need[side]);
            found |= need[side].len() > before;
            if side == 0 {
                on_src = before..need[0].len();
            }
        }
        if !found {
            *dropped += 1;
            continue;
        }
        // The executor holds a send back only until the data it waits
        // for has arrived on its own gpu: a wait met by a receive or a
        // copy there. A wait only on a send of its gpu (a send is done
        // when staged) or only on the receiving side does not hold it.
        let xo = &ops[x as usize];
        if op.src != op.dst
            && xo.from != op.from
            && !need[0][on_src]
                .iter()
                .any(|&y| ops[y as usize].dst == op.src)
        {
            unheld.insert((xo.from, op.from));
        }
    }
    if let Some(v) = need.get_mut(1) {
        for &x in &op.recv_deps {
            ancestors_on(graph, x, op.dst, anc, walk_cap, v);
        }
    }
    for v in &mut need {
        v.sort_unstable();
        v.dedup();
    }
    need
}

/// A step with more waits than this, on a gpu whose tbs will be packed,
/// has those its gpu's own order implies removed (`drop_implied_waits`;
/// on other gpus only when they overflow the tb). `pairwise`'s stage barriers
/// reach a gpu through every other gpu's earlier rounds: at 16 x 8 its
/// operations wait for up to 65 tbs, all but a few implied by the waits
/// of the gpu's previous round, and tbs that long cannot be packed two
/// to a threadblock (143 tbs on rank 0 against `msccl`'s 128).
const MAX_WAITS_UNREDUCED: usize = 8;

/// Threadblocks per gpu the lowering may build before packing: the
/// loader's array of them (`MSCCL_MAX_NUM_THREAD_BLOCKS`, 32 per channel
/// times NCCL-MSCCL's 32 channels, `msccl_struct.h`).
const MAX_TBS_BUILT: usize = 1024;

#[cfg(test)]
mod tests {
    use super::*;

    /// A draft tb whose steps wait as `waits` says (`None`: no wait) and
    /// belong to operations `ops`.
    fn draft(waits: &[Option<(u32, u32)>], ops: &[u32]) -> TbDraft {
        let steps = waits
            .iter()
            .enumerate()
            .map(|(i, w)| Step {
                s: i as i64,
                kind: StepKind::Send,
                srcbuf: BufRef::Input,
                srcoff: 0,
                dstbuf: BufRef::Output,
                dstoff: 0,
                cnt: 1,
                depid: w.map_or(-1, |w| i64::from(w.0)),
                deps: w.map_or(-1, |w| i64::from(w.1)),
                hasdep: false,
                line: 0,
            })
            .collect();
        TbDraft {
            key: TbKey::Local { k: 0 },
            steps,
            ops: ops.to_vec(),
            waited: HashMap::new(),
        }
    }

    #[test]
    fn waits_the_gpus_own_order_holds_are_dropped() {
        // tb 1's step 1 waits for tb 0's step 0; tb 2's step 0 for tb 1's
        // step 0 only. A step waiting for (0, 0), (1, 1) and (2, 0) needs
        // only the last two: (1, 1) holds (0, 0).
        let drafts = vec![
            draft(&[None, None], &[0, 3]),
            draft(&[None, Some((0, 0))], &[1, 2]),
            draft(&[Some((1, 0))], &[4]),
        ];
        let mut latest: BTreeMap<u32, u32> = [(0, 0), (1, 1), (2, 0)].into();
        drop_implied_waits(&drafts, None, &mut latest);
        assert_eq!(latest, [(1, 1), (2, 0)].into());
        // tb 0's step 1 is not held by anything: it stays.
        let mut latest: BTreeMap<u32, u32> = [(0, 1), (1, 1)].into();
        drop_implied_waits(&drafts, None, &mut latest);
        assert_eq!(latest, [(0, 1), (1, 1)].into());
        // On tb 2 itself, after its step 0 (which waited for (1, 0)):
        // a wait for (1, 0) is held by program order and that wait.
        let mut latest: BTreeMap<u32, u32> = [(1, 0), (0, 1)].into();
        drop_implied_waits(&drafts, Some(2), &mut latest);
        assert_eq!(latest, [(0, 1)].into());
        // A fresh tb of 2 steps keeps the waits on the latest operations.
        let mut latest: BTreeMap<u32, u32> = [(0, 1), (1, 1), (2, 0)].into();
        assert_eq!(drop_oldest_waits(&drafts, &mut latest, 2), 1);
        assert_eq!(latest, [(0, 1), (2, 0)].into());
    }
}
