//! The symbolic executor: an MSCCL XML file judged as the executor would
//! load and run it, without a GPU.
//!
//! Three layers, each naming the line, gpu, threadblock and step at fault:
//! 1. lexical: the hand-written reader's rules (spec §2) and Switchyard's
//!    stricter writing rules (one tag per line, plain decimal numbers);
//! 2. loader: what the executor checks or silently gets wrong (spec §3, §8):
//!    ids, peers, channels, one owner tb per connection, step limits, `cnt`,
//!    `depid`, nops, buffer bounds;
//! 3. run: threadblocks execute their steps in order; the k-th send on a
//!    connection `(chan, A -> B)` meets the k-th receive; a step first waits
//!    for its dependency flags; a connection's FIFO holds 2 (Simple) or 8
//!    (LL, LL128) undelivered operations. The run is done twice, with one
//!    operation per step and with one per chunk (small and large buffers,
//!    spec §5), and stops with a deadlock report when nothing can move. Every
//!    chunk carries the input chunk it holds, and the outputs are checked
//!    against the all-to-all layout (spec §10, §11).
//!
//! Unordered accesses (spec §14 item 8) are left to [`verify`](fn@crate::verify), run on
//! the plan the trace converts to.
//!
//! Its parts, each importing only those above it here:
//! - `load`: the loaded file ([`Op`], [`StepRef`], [`Origin`]): the
//!   loader's checks, the pairing of sends with receives, and the
//!   dependencies between operations;
//! - `data`: the buffers a run moves chunks through, and the output check;
//! - `state`: the run, a worklist of threadblocks, and the deadlock report.

mod data;
mod load;
mod state;
#[cfg(test)]
mod tests;

use super::{Algo, ChunkMap, Layout, NameFacts, Protocol, StepKind};
use crate::error::Result;
use data::check_outputs;
use load::{link_deps, load, Loaded};
use state::{execute, Mode, Order};

pub(crate) use load::{per_step, PerStep, StepOps, StepWaits};
pub use load::{Op, Origin, StepRef};

/// What a checked file does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecReport {
    pub name: String,
    pub ngpus: usize,
    pub proto: Protocol,
    pub nchannels: usize,
    pub nchunksperloop: usize,
    pub layout: Layout,
    /// From the file's name, when Switchyard wrote it.
    pub chunk_bytes: Option<u64>,
    pub min_bytes: u64,
    pub max_bytes: u64,
    /// Largest number of threadblocks on one gpu.
    pub max_tbs_per_gpu: usize,
    pub max_steps_per_tb: usize,
    /// `<step>` elements, nops included.
    pub steps: usize,
    pub nops: usize,
    /// Send/receive pairs and local copies.
    pub operations: usize,
    /// Chunks that changed gpu.
    pub chunks_moved: u64,
    /// Harmless oddities (a `hasdep` nobody waits for, many threadblocks).
    pub warnings: Vec<String>,
}

/// A checked run: the operations and what the file says about chunks.
#[derive(Clone, Debug)]
pub struct Trace {
    pub ops: Vec<Op>,
    pub map: ChunkMap,
    pub facts: NameFacts,
    pub report: ExecReport,
    /// Per step `[gpu][tb][position]`: the operations it receives, sends or
    /// copies, and the `(tb, position)` steps it waits for (nops folded in).
    pub(crate) step_ops: PerStep<StepOps>,
    pub(crate) waits: StepWaits,
}

/// Validates, pairs, runs and checks a parsed file.
pub fn run(algo: &Algo, file: &str) -> Result<Trace> {
    let mut l = loaded_run(algo, file, Order::Worklist)?;
    let facts = algo.facts();
    let steps: usize = algo
        .gpus
        .iter()
        .flat_map(|g| &g.tbs)
        .map(|t| t.steps.len())
        .sum();
    let nops = algo
        .gpus
        .iter()
        .flat_map(|g| &g.tbs)
        .flat_map(|t| &t.steps)
        .filter(|s| s.kind == StepKind::Nop)
        .count();
    let report = ExecReport {
        name: algo.name.clone(),
        ngpus: algo.ngpus as usize,
        proto: algo.proto,
        nchannels: algo.nchannels as usize,
        nchunksperloop: algo.nchunksperloop as usize,
        layout: l.map.layout,
        chunk_bytes: facts.chunk_bytes,
        min_bytes: algo.min_bytes as u64,
        max_bytes: algo.max_bytes as u64,
        max_tbs_per_gpu: algo.gpus.iter().map(|g| g.tbs.len()).max().unwrap_or(0),
        max_steps_per_tb: algo
            .gpus
            .iter()
            .flat_map(|g| &g.tbs)
            .map(|t| t.steps.len())
            .max()
            .unwrap_or(0),
        steps,
        nops,
        operations: l.ops.len(),
        chunks_moved: l
            .ops
            .iter()
            .filter(|o| o.src != o.dst)
            .map(|o| o.cnt as u64)
            .sum(),
        warnings: std::mem::take(&mut l.warnings),
    };
    Ok(Trace {
        ops: l.ops,
        map: l.map,
        facts,
        report,
        step_ops: l.step_ops,
        waits: l.waits,
    })
}

/// Loads and runs a file both ways (one operation per step, then per
/// chunk), linking the operations' dependencies in between.
fn loaded_run<'a>(algo: &'a Algo, file: &'a str, order: Order) -> Result<Loaded<'a>> {
    let mut l = load(algo, file)?;
    execute(&mut l, Mode::PerStep, order)?;
    link_deps(&mut l);
    execute(&mut l, Mode::PerChunk, order)?;
    check_outputs(&l)?;
    Ok(l)
}
