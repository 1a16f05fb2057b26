//! The run: threadblocks execute their steps in order, a step first waits
//! for its dependency flags, a connection's FIFO holds `fifo_depth`
//! undelivered operations; a worklist runs each tb when something it may
//! wait for has moved, and a run that stops short is reported as a deadlock.

use std::collections::VecDeque;

use super::data::{move_data, Bufs};
use super::load::{at, step_line, Loaded, Origin, StepRef};
use crate::error::Result;
use crate::msccl::StepKind;
use crate::verify::VerifyError;

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// Small buffers: one FIFO operation per step.
    PerStep,
    /// Large buffers: one FIFO operation per chunk.
    PerChunk,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::PerStep => "one operation per step (small messages)",
            Mode::PerChunk => "one operation per chunk (large messages)",
        }
    }
}

/// How [`execute`] picks the next tb to run. The run's end state does not
/// depend on it: a blocked tb only becomes ready through what others do
/// (a flag it waits for, data in its incoming FIFO, room in its outgoing
/// one), never less ready, so every order ends with each tb as far as it
/// can go, and the dependencies read from the run are the same.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Order {
    /// Run a tb when something it may wait for has moved: every step and
    /// chunk is visited a bounded number of times.
    Worklist,
    /// Sweep every tb until a sweep moves nothing (the first model; a test
    /// holds the worklist to it). A sweep moves a connection by as little as
    /// a FIFO's depth of chunks, so large files took minutes.
    #[cfg(test)]
    Sweep,
}

/// The run's state: per tb its next step, the parts of that step done and
/// the last step it signalled; per connection its FIFO; the buffers
/// (`PerStep` only).
struct RunState {
    fifos: Vec<VecDeque<(u32, u32)>>,
    pc: Vec<Vec<usize>>,
    sub: Vec<Vec<u32>>,
    flag: Vec<Vec<i64>>,
    bufs: Bufs,
    /// Per tb, the connection it receives on and the one it sends on.
    fifo_of: Vec<Vec<(Option<usize>, Option<usize>)>>,
    /// `Loaded::waits` laid out flat, a tb's steps one after another (the
    /// run reads the waits of every step it reaches, in tb order):
    /// gpu `gi`'s tb `ti` is tb `tb_base[gi] + ti`, its step `p` is step
    /// `step_base[tb] + p`, whose waits are `wait_at[wait_off[s]..wait_off[s + 1]]`.
    tb_base: Vec<usize>,
    step_base: Vec<usize>,
    wait_off: Vec<u32>,
    wait_at: Vec<(u32, u32)>,
    /// Per tb (as `step_base`): one more than the step whose waits were
    /// last found met (0: none). Flags only rise, so they stay met: a tb
    /// woken again at that step (its FIFO moved) does not read them again.
    met: Vec<usize>,
}

/// What one turn of a tb changed.
#[derive(Default, Clone, Copy)]
struct Moved {
    any: bool,
    /// It put data in its outgoing FIFO (its receiver may move).
    pushed: bool,
    /// It took data from its incoming FIFO (its sender may move).
    popped: bool,
    /// It raised its flag (tbs waiting for it may move).
    flagged: bool,
}

impl RunState {
    fn new(l: &Loaded<'_>, mode: Mode) -> RunState {
        let algo = l.algo;
        // Only a `PerStep` run moves data.
        let moves = mode == Mode::PerStep;
        let bufs = algo
            .gpus
            .iter()
            .filter(|_| moves)
            .map(|g| {
                let input = (0..g.i_chunks as u32)
                    .map(|idx| {
                        Some(Origin {
                            rank: g.id as u32,
                            idx,
                        })
                    })
                    .collect();
                [
                    input,
                    vec![None; g.o_chunks as usize],
                    vec![None; g.s_chunks as usize],
                ]
            })
            .collect();
        // gpus are in rank order (`load`), so a gpu's index is its id.
        let fifo_of = algo
            .gpus
            .iter()
            .enumerate()
            .map(|(gi, g)| {
                g.tbs
                    .iter()
                    .map(|tb| {
                        let c = tb.chan as u32;
                        let fid = |from: i64, to: i64| {
                            (from >= 0 && to >= 0)
                                .then(|| l.fifo_ids.get(&(c, from as u32, to as u32)).copied())
                                .flatten()
                        };
                        (fid(tb.recv, gi as i64), fid(gi as i64, tb.send))
                    })
                    .collect()
            })
            .collect();
        let mut tb_base = Vec::with_capacity(algo.gpus.len());
        let mut step_base = Vec::new();
        let mut wait_off = vec![0u32];
        let mut wait_at = Vec::new();
        for gw in &l.waits {
            tb_base.push(step_base.len());
            for tw in gw {
                step_base.push(wait_off.len() - 1);
                for w in tw {
                    wait_at.extend_from_slice(w);
                    wait_off.push(wait_at.len() as u32);
                }
            }
        }
        RunState {
            met: vec![0; step_base.len()],
            tb_base,
            step_base,
            wait_off,
            wait_at,
            fifos: vec![VecDeque::new(); l.fifo_ids.len()],
            pc: algo.gpus.iter().map(|g| vec![0; g.tbs.len()]).collect(),
            sub: algo.gpus.iter().map(|g| vec![0; g.tbs.len()]).collect(),
            flag: algo.gpus.iter().map(|g| vec![-1; g.tbs.len()]).collect(),
            bufs,
            fifo_of,
        }
    }

    /// Whether step `p` of tb `ti` on `gi` still waits for a flag.
    fn waiting(&self, gi: usize, ti: usize, p: usize) -> Option<(u32, u32)> {
        if self.sub[gi][ti] != 0 {
            return None;
        }
        let at = self.step_base[self.tb_base[gi] + ti] + p;
        let (a, b) = (self.wait_off[at] as usize, self.wait_off[at + 1] as usize);
        self.wait_at[a..b]
            .iter()
            .copied()
            .find(|&(t, q)| self.flag[gi][t as usize] < q as i64)
    }

    /// [`RunState::waiting`], remembering a step whose waits are met.
    fn still_waiting(&mut self, gi: usize, ti: usize, p: usize) -> bool {
        let tb = self.tb_base[gi] + ti;
        if self.met[tb] == p + 1 {
            return false;
        }
        let waits = self.waiting(gi, ti, p).is_some();
        if !waits && self.sub[gi][ti] == 0 {
            self.met[tb] = p + 1;
        }
        waits
    }

    /// Runs tb `ti` of `gi` as far as it can go now.
    fn advance(
        &mut self,
        l: &mut Loaded<'_>,
        mode: Mode,
        depth: usize,
        gi: usize,
        ti: usize,
    ) -> Result<Moved> {
        let algo = l.algo;
        let tb = &algo.gpus[gi].tbs[ti];
        let (tb_in, tb_out) = self.fifo_of[gi][ti];
        let mut moved = Moved::default();
        while self.pc[gi][ti] < tb.steps.len() {
            let p = self.pc[gi][ti];
            let st = &tb.steps[p];
            if self.still_waiting(gi, ti, p) {
                break;
            }
            let so = l.step_ops[gi][ti][p];
            let parts = match (mode, st.kind) {
                (_, StepKind::Nop) => 0,
                (_, _) if st.cnt == 0 => 0,
                (Mode::PerStep, _) => 1,
                (Mode::PerChunk, _) => st.cnt as u32,
            };
            let in_fifo = so.recv.and(tb_in);
            let out_fifo = so.send.and(tb_out);
            while self.sub[gi][ti] < parts {
                let k = self.sub[gi][ti];
                if let Some(f) = in_fifo {
                    if self.fifos[f].front() != Some(&(so.recv.expect("paired"), k)) {
                        return Ok(moved);
                    }
                }
                if let Some(f) = out_fifo {
                    if self.fifos[f].len() >= depth {
                        return Ok(moved);
                    }
                }
                if let Some(f) = in_fifo {
                    self.fifos[f].pop_front();
                    moved.popped = true;
                }
                if mode == Mode::PerStep {
                    move_data(l, &mut self.bufs, gi, ti, p, so)?;
                }
                if let Some(f) = out_fifo {
                    self.fifos[f].push_back((so.send.expect("paired"), k));
                    moved.pushed = true;
                }
                self.sub[gi][ti] += 1;
                moved.any = true;
            }
            if st.hasdep && st.kind != StepKind::Nop {
                self.flag[gi][ti] = p as i64;
                moved.flagged = true;
            }
            if mode == Mode::PerStep {
                l.step_log.push((gi as u32, ti as u32, p as u32));
            }
            self.pc[gi][ti] += 1;
            self.sub[gi][ti] = 0;
            moved.any = true;
        }
        Ok(moved)
    }
}

/// Tbs `(gpu, tb)` to run, each at most once in the queue, first in first out.
struct Worklist {
    queue: VecDeque<(usize, usize)>,
    queued: Vec<Vec<bool>>,
}

impl Worklist {
    /// Every tb queued, in order (`tbs`: the tbs of each gpu).
    fn new(tbs: impl Iterator<Item = usize>) -> Worklist {
        let queued: Vec<Vec<bool>> = tbs.map(|k| vec![true; k]).collect();
        let queue = queued
            .iter()
            .enumerate()
            .flat_map(|(g, q)| (0..q.len()).map(move |t| (g, t)))
            .collect();
        Worklist { queue, queued }
    }

    fn push(&mut self, (g, t): (usize, usize)) {
        if !self.queued[g][t] {
            self.queued[g][t] = true;
            self.queue.push_back((g, t));
        }
    }

    fn pop(&mut self) -> Option<(usize, usize)> {
        let (g, t) = self.queue.pop_front()?;
        self.queued[g][t] = false;
        Some((g, t))
    }
}

/// Runs every tb to completion or reports a deadlock. In `PerStep` mode it
/// also moves data (filling `Op::data`) and checks that nothing is read
/// before it is written.
pub(super) fn execute(l: &mut Loaded<'_>, mode: Mode, order: Order) -> Result<()> {
    let algo = l.algo;
    let depth = algo.proto.fifo_depth();
    let mut state = RunState::new(l, mode);
    let all = || {
        algo.gpus
            .iter()
            .enumerate()
            .flat_map(|(gi, g)| (0..g.tbs.len()).map(move |ti| (gi, ti)))
    };
    match order {
        Order::Worklist => {
            // Who to wake: each connection's two tbs, and per tb the tbs
            // of its gpu that wait for it.
            let mut ends: Vec<[(usize, usize); 2]> = vec![[(0, 0); 2]; state.fifos.len()];
            let mut waiters: Vec<Vec<Vec<u32>>> = algo
                .gpus
                .iter()
                .map(|g| vec![Vec::new(); g.tbs.len()])
                .collect();
            for (gi, ti) in all() {
                let (fin, fout) = state.fifo_of[gi][ti];
                if let Some(f) = fin {
                    ends[f][1] = (gi, ti);
                }
                if let Some(f) = fout {
                    ends[f][0] = (gi, ti);
                }
                let mut on: Vec<u32> = l.waits[gi][ti].iter().flatten().map(|w| w.0).collect();
                on.sort_unstable();
                on.dedup();
                for t in on {
                    waiters[gi][t as usize].push(ti as u32);
                }
            }
            let mut queue = Worklist::new(algo.gpus.iter().map(|g| g.tbs.len()));
            while let Some((gi, ti)) = queue.pop() {
                let m = state.advance(l, mode, depth, gi, ti)?;
                let (fin, fout) = state.fifo_of[gi][ti];
                if let (true, Some(f)) = (m.popped, fin) {
                    queue.push(ends[f][0]);
                }
                if let (true, Some(f)) = (m.pushed, fout) {
                    queue.push(ends[f][1]);
                }
                if m.flagged {
                    for &t in &waiters[gi][ti] {
                        queue.push((gi, t as usize));
                    }
                }
            }
        }
        #[cfg(test)]
        Order::Sweep => loop {
            let mut progress = false;
            for (gi, ti) in all() {
                progress |= state.advance(l, mode, depth, gi, ti)?.any;
            }
            if !progress {
                break;
            }
        },
    }
    deadlock(l, &state, mode, depth)
}

/// The deadlock report of a run that ended with tbs unfinished.
fn deadlock(l: &Loaded<'_>, state: &RunState, mode: Mode, depth: usize) -> Result<()> {
    let algo = l.algo;
    let ng = algo.gpus.len();
    let stuck: Vec<(usize, usize)> = (0..ng)
        .flat_map(|gi| (0..algo.gpus[gi].tbs.len()).map(move |ti| (gi, ti)))
        .filter(|&(gi, ti)| state.pc[gi][ti] < algo.gpus[gi].tbs[ti].steps.len())
        .collect();
    if stuck.is_empty() {
        return Ok(());
    }
    let mut lines = Vec::new();
    for &(gi, ti) in stuck.iter().take(4) {
        let p = state.pc[gi][ti];
        let tb = &algo.gpus[gi].tbs[ti];
        let here = at(algo, StepRef::of(gi, ti, p));
        let so = l.step_ops[gi][ti][p];
        let in_fifo = state.fifo_of[gi][ti].0;
        let why = if let Some((t, q)) = state.waiting(gi, ti, p) {
            format!(
                "waits for tb {} to finish step {q}",
                algo.gpus[gi].tbs[t as usize].id
            )
        } else if let Some(op) = so.recv.filter(|&op| {
            in_fifo.is_none_or(|f| state.fifos[f].front() != Some(&(op, state.sub[gi][ti])))
        }) {
            format!(
                "waits for data from gpu {} on channel {}",
                l.ops[op as usize].src, tb.chan
            )
        } else {
            format!("cannot send to gpu {} on channel {}: its FIFO holds {depth} undelivered operations", tb.send, tb.chan)
        };
        lines.push(format!("{here} (line {}) {why}", tb.steps[p].line));
    }
    let (gi, ti) = stuck[0];
    // A well-formed file that cannot finish: a failed check, as a JSON
    // plan's dependency cycle is.
    Err(VerifyError::Xml {
        file: l.file.to_string(),
        line: step_line(algo, gi, ti, state.pc[gi][ti]),
        reason: format!(
            "deadlock with {} ({} FIFO depth {depth}): {} tbs cannot finish; {}",
            mode.name(),
            algo.proto,
            stuck.len(),
            lines.join("; ")
        ),
    }
    .into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msccl::exec::load::load;
    use crate::msccl::parse;

    #[test]
    fn the_runs_flat_waits_are_each_steps_own_and_stay_met() {
        use crate::generate::{generate, Pattern, TrafficSpec};
        use crate::msccl::{to_xml, XmlOptions};
        use crate::sched::{schedule, Algorithm, Options};
        // A lowered 2x8 file with waits on other tbs.
        let topo = crate::Topology::preset("dgx-h100", 2, None).unwrap();
        let mut spec = TrafficSpec::new(16, Pattern::Zipf(1.2));
        spec.bytes = 32 << 10;
        let m = generate(&spec).unwrap();
        let plan = schedule(Algorithm::Fast, &topo, &m, &Options::default()).unwrap();
        let text = to_xml(&plan, &topo, &m, &XmlOptions::default())
            .unwrap()
            .text;
        let algo = parse::parse_algo(&text, "t.xml").unwrap();
        let l = load(&algo, "t.xml").unwrap();
        let mut state = RunState::new(&l, Mode::PerChunk);
        // Under no flag, half of each tb's and all: the flat layout gives
        // every step the waits `load` read for it.
        let mut waiting = 0;
        for raised in [0, 1, 2] {
            for (gi, g) in algo.gpus.iter().enumerate() {
                for (ti, tb) in g.tbs.iter().enumerate() {
                    state.flag[gi][ti] = tb.steps.len() as i64 * raised / 2 - 1;
                }
            }
            for (gi, g) in algo.gpus.iter().enumerate() {
                for (ti, tb) in g.tbs.iter().enumerate() {
                    for p in 0..tb.steps.len() {
                        let want = l.waits[gi][ti][p]
                            .iter()
                            .copied()
                            .find(|&(t, q)| state.flag[gi][t as usize] < q as i64);
                        assert_eq!(state.waiting(gi, ti, p), want, "gpu {gi} tb {ti} step {p}");
                        waiting += usize::from(want.is_some());
                    }
                }
            }
        }
        assert!(waiting > 0, "the file has waits");
        // Met once, a step's waits are not read again (flags only rise).
        let (gi, ti, p) = (0..algo.gpus.len())
            .flat_map(|gi| (0..algo.gpus[gi].tbs.len()).map(move |ti| (gi, ti)))
            .flat_map(|(gi, ti)| (0..l.waits[gi][ti].len()).map(move |p| (gi, ti, p)))
            .find(|&(gi, ti, p)| !l.waits[gi][ti][p].is_empty())
            .unwrap();
        assert!(!state.still_waiting(gi, ti, p));
        for f in state.flag.iter_mut().flatten() {
            *f = -1;
        }
        assert!(state.waiting(gi, ti, p).is_some());
        assert!(!state.still_waiting(gi, ti, p));
    }
}
