//! The data a run moves: per gpu its input, output and scratch chunks,
//! each holding the input chunk it came from; a step's data movement; and
//! the check that every output chunk holds the chunk an all-to-all puts there.

use super::load::{at, step_line, Loaded, Origin, StepOps, StepRef};
use crate::error::Result;
use crate::msccl::BufRef;
use crate::verify::VerifyError;

pub(super) type Bufs = Vec<[Vec<Option<Origin>>; 3]>;

fn buf_index(b: BufRef) -> usize {
    match b {
        BufRef::Input => 0,
        BufRef::Output => 1,
        BufRef::Scratch => 2,
    }
}

/// Performs step `p`'s data movement in `PerStep` mode.
pub(super) fn move_data(
    l: &mut Loaded<'_>,
    bufs: &mut Bufs,
    gi: usize,
    ti: usize,
    p: usize,
    so: StepOps,
) -> Result<()> {
    let bi = buf_index;
    let algo = l.algo;
    let st = &algo.gpus[gi].tbs[ti].steps[p];
    let here = StepRef::of(gi, ti, p);
    let cnt = st.cnt as usize;
    let read = |bufs: &Bufs, b: BufRef, off: i64| -> Result<Vec<Origin>> {
        let cells = &bufs[gi][bi(b)][off as usize..off as usize + cnt];
        cells
            .iter()
            .enumerate()
            .map(|(j, c)| {
                c.ok_or_else(|| {
                    VerifyError::Xml {
                        file: l.file.to_string(),
                        line: st.line,
                        reason: format!(
                            "{}: reads {} chunk {} before anything is written there",
                            at(algo, here),
                            b.name(),
                            off as usize + j
                        ),
                    }
                    .into()
                })
            })
            .collect()
    };
    let data = match so.recv {
        Some(op) => l.ops[op as usize].data.clone(),
        None => read(bufs, st.srcbuf, st.srcoff)?,
    };
    if st.kind.writes_dst() {
        let off = st.dstoff as usize;
        for (j, v) in data.iter().enumerate() {
            bufs[gi][bi(st.dstbuf)][off + j] = Some(*v);
        }
    }
    for op in [so.send, so.local].into_iter().flatten() {
        l.ops[op as usize].data = data.clone();
    }
    Ok(())
}

/// Every valid output chunk holds its input chunk (spec §10, §11).
pub(super) fn check_outputs(l: &Loaded<'_>) -> Result<()> {
    let algo = l.algo;
    let map = &l.map;
    let n = map.n;
    // Final output contents from the operations in any valid order: each
    // output chunk's last writer (double writes are the verifier's to report).
    let mut out: Vec<Vec<Option<(Origin, StepRef)>>> = algo
        .gpus
        .iter()
        .map(|g| vec![None; g.o_chunks as usize])
        .collect();
    for op in &l.ops {
        if op.dst_buf == BufRef::Output {
            for (j, v) in op.data.iter().enumerate() {
                out[op.dst as usize][op.dst_off as usize + j] = Some((*v, op.to));
            }
        }
    }
    for (r, out_r) in out.iter().enumerate() {
        for s in 0..n {
            for c in 0..map.chunks(s, r) {
                let pos = map.output_chunk(s, r, c) as usize;
                let want = Origin {
                    rank: s as u32,
                    idx: map.input_chunk(s, r, c),
                };
                let line = algo.gpus[r].line;
                match out_r.get(pos).copied().flatten() {
                    // The file is well formed but not the all-to-all: a
                    // failed check (exit 1), as a wrong JSON plan is.
                    None => {
                        return Err(VerifyError::Xml {
                            file: l.file.to_string(),
                            line,
                            reason: format!("gpu {r}: output chunk {pos} is never written; it should hold input chunk {} of gpu {s}", want.idx),
                        }
                        .into())
                    }
                    Some((got, by)) if got != want => {
                        return Err(VerifyError::Xml {
                            file: l.file.to_string(),
                            line: step_line(algo, by.gpu as usize, by.tb as usize, by.pos as usize),
                            reason: format!("{}: writes input chunk {} of gpu {} into output chunk {pos} of gpu {r}, which should hold input chunk {} of gpu {s}", at(algo, by), got.idx, got.rank, want.idx),
                        }
                        .into())
                    }
                    Some(_) => {}
                }
            }
        }
    }
    Ok(())
}
