//! The reader: an MSCCL XML file (Switchyard's and other tools') into the
//! Plan IR. The file is parsed ([`super::parse`]: the executor reader's
//! lexical rules, then the element tree), run symbolically
//! ([`super::exec::run`]), and the run's operations (a send met by its
//! receive, or a local copy) become the plan's transfers, with byte ranges
//! from the chunk size and the traffic matrix.

use super::exec::{self, ExecReport, PerStep, Trace};
use super::parse::{chunk_map, parse_algo};
use super::MAX_CHUNK_BYTES;
use super::{Algo, BufRef, ChunkMap};
use crate::error::{InputError, Result};
use crate::plan::{Buffer, Chunking, Deps, Path, Plan, Transfer};
use crate::topology::Topology;
use crate::traffic::{Layout as ByteLayout, TrafficMatrix, MAX_TOTAL_BYTES};

/// No operation at a step (`trace_to_plan`'s `step_op`).
const NO_OP: u32 = u32::MAX;

/// Bytes of one peer block assumed when neither a traffic matrix nor the
/// file says how large a chunk is (the traffic generator's default pair size).
pub const DEFAULT_BLOCK_BYTES: u64 = 1 << 20;

/// Reads an MSCCL XML all-to-all into a plan. With `traffic`, chunk `c` of
/// block `(s, d)` carries bytes `c*u .. min((c+1)*u, M[s][d])` of that block
/// (`u` from the file's name, else the largest pair over the chunks per
/// block); without, the plan is for the matrix [`xml_traffic`] gives.
/// Errors name the line: [`InputError`]s for a malformed file,
/// [`crate::verify::VerifyError::Xml`] for a well-formed one that is not a
/// correct all-to-all (its run deadlocks, reads an unwritten chunk, or leaves
/// an output chunk unwritten or wrong).
pub fn parse_xml(text: &str, file: &str, traffic: Option<&TrafficMatrix>) -> Result<Plan> {
    let algo = parse_algo(text, file)?;
    read_algo(&algo, file, traffic, true)
}

/// The matrix the file implies ([`xml_traffic`]) and the file read on it.
/// The implied matrix is the made-for one rounded to whole chunks, so the
/// name's fingerprint is not checked against it.
pub fn parse_xml_implied(text: &str, file: &str) -> Result<(TrafficMatrix, Plan)> {
    let algo = parse_algo(text, file)?;
    let map = chunk_map(&algo, file)?;
    let u = check_chunk_bytes(&algo, default_chunk_bytes(&algo, &map), file)?;
    let m = implied_matrix(&map, u, &algo, file)?;
    let plan = read_algo(&algo, file, Some(&m), false)?;
    Ok((m, plan))
}

fn read_algo(
    algo: &Algo,
    file: &str,
    traffic: Option<&TrafficMatrix>,
    check_matrix: bool,
) -> Result<Plan> {
    // A file made for one matrix moves that matrix's amounts: against
    // another one, say so before anything byte-level.
    let fingerprint = algo.facts().matrix;
    if let (Some(f), Some(m), true) = (&fingerprint, traffic, check_matrix) {
        if *f != m.fingerprint() {
            return Err(InputError::at(
                file,
                format!("line {}", algo.line),
                format!(
                    "this plan was made for another traffic matrix (fingerprint {f} in its name; the traffic given has {})",
                    m.fingerprint()
                ),
            )
            .into());
        }
    }
    let trace = exec::run(algo, file)?;
    let mut plan = trace_to_plan(algo, &trace, traffic, None, file)?.0;
    plan.traffic_fingerprint = fingerprint;
    Ok(plan)
}

/// The traffic matrix a file implies: its chunks per pair (uniform, or the
/// counts Switchyard writes in comments) times its chunk size (from the
/// name; else `maxBytes / nchunksperloop` when a window is set; else a
/// 1 MiB peer block).
pub fn xml_traffic(text: &str, file: &str) -> Result<TrafficMatrix> {
    let algo = parse_algo(text, file)?;
    let map = chunk_map(&algo, file)?;
    let u = check_chunk_bytes(&algo, default_chunk_bytes(&algo, &map), file)?;
    implied_matrix(&map, u, &algo, file)
}

/// Sets the plan's GPUs per node and every transfer's path as `topo` has
/// them (a file read without a topology assumes 8 GPUs per node and rail
/// NICs).
pub fn assign_paths(plan: &mut Plan, topo: &Topology) {
    plan.gpus_per_node = topo.gpus_per_node() as u32;
    for t in &mut plan.transfers {
        t.path = crate::plan::path_between(topo, t.src as usize, t.dst as usize);
    }
}

/// The matrix of `map`'s chunks of `u` bytes; more than
/// [`MAX_TOTAL_BYTES`] in all is an error naming the `<algo>` line.
fn implied_matrix(map: &ChunkMap, u: u64, algo: &Algo, file: &str) -> Result<TrafficMatrix> {
    let chunks: u64 = map.k.iter().map(|&k| u64::from(k)).sum();
    if chunks.checked_mul(u).is_none_or(|t| t > MAX_TOTAL_BYTES) {
        return Err(InputError::at(
            file,
            format!("line {}", algo.line),
            format!(
                "{chunks} chunks of {u} bytes are more than 2^53 bytes, the most one all-to-all may carry"
            ),
        )
        .into());
    }
    let rows = map
        .rows()
        .into_iter()
        .map(|r| r.into_iter().map(|k| u64::from(k) * u).collect())
        .collect();
    Ok(TrafficMatrix::from_rows(rows))
}

/// A chunk size the byte arithmetic can hold ([`MAX_CHUNK_BYTES`]).
fn check_chunk_bytes(algo: &Algo, u: u64, file: &str) -> Result<u64> {
    if u > MAX_CHUNK_BYTES {
        return Err(InputError::at(
            file,
            format!("line {}", algo.line),
            format!("chunks of {u} bytes; at most 2^38 bytes (256 GB) per chunk"),
        )
        .into());
    }
    Ok(u)
}

fn default_chunk_bytes(algo: &Algo, map: &ChunkMap) -> u64 {
    if let Some(u) = algo.facts().chunk_bytes {
        return u.max(1);
    }
    if algo.max_bytes > 0 {
        return (algo.max_bytes as u64 / map.nchunksperloop as u64).max(1);
    }
    let b = map.k.iter().copied().max().unwrap_or(1).max(1) as u64;
    (DEFAULT_BLOCK_BYTES / b).max(1)
}

/// Checks a file with every rule the executor applies and runs it
/// symbolically; the error names the line, gpu, threadblock and step. A
/// malformed file is an [`InputError`]; a well-formed one whose run fails
/// or that is not the all-to-all is a [`crate::verify::VerifyError::Xml`].
pub fn check_executable(text: &str) -> Result<ExecReport> {
    check_executable_with(text, "<xml>")
}

/// [`check_executable`] with the file's name for messages.
pub fn check_executable_with(text: &str, file: &str) -> Result<ExecReport> {
    let algo = parse_algo(text, file)?;
    let trace = exec::run(&algo, file)?;
    // Ordering (spec §14 item 8): the verifier proves every read of a chunk
    // depends on its write and no chunk is written twice, at one byte a chunk.
    let (plan, traffic) = trace_to_plan(&algo, &trace, None, Some(1), file)?;
    crate::verify::verify(&plan, &traffic).map_err(|e| {
        InputError::new(
            file,
            format!(
                "{e} (transfers are the file's operations in execution order, one byte per chunk)"
            ),
        )
    })?;
    Ok(trace.report)
}

/// Converts a checked run into a plan (and the matrix it is a plan for).
/// `chunk_bytes` overrides the chunk size (the executor model uses 1).
pub(crate) fn trace_to_plan(
    algo: &Algo,
    trace: &Trace,
    traffic: Option<&TrafficMatrix>,
    chunk_bytes: Option<u64>,
    file: &str,
) -> Result<(Plan, TrafficMatrix)> {
    let map = &trace.map;
    let n = map.n;
    let bmax = map.k.iter().copied().max().unwrap_or(0).max(1) as u64;
    let u = match (chunk_bytes, trace.facts.chunk_bytes, traffic) {
        (Some(u), _, _) | (None, Some(u), _) => u.max(1),
        (None, None, Some(m)) => m.max_entry().div_ceil(bmax).max(1),
        (None, None, None) => default_chunk_bytes(algo, map),
    };
    let u = check_chunk_bytes(algo, u, file)?;
    let m = match traffic {
        Some(m) => {
            if m.ranks() != n {
                return Err(InputError::new(
                    file,
                    format!(
                        "the plan is for {n} ranks but the traffic has {}",
                        m.ranks()
                    ),
                )
                .into());
            }
            for s in 0..n {
                for d in 0..n {
                    let cap = u64::from(map.chunks(s, d)) * u;
                    if m.get(s, d) > cap {
                        return Err(InputError::new(
                            file,
                            format!(
                                "the traffic sends {} bytes from rank {s} to rank {d} but the plan carries {} chunks of {u} bytes there",
                                m.get(s, d),
                                map.chunks(s, d)
                            ),
                        )
                        .into());
                    }
                }
            }
            m.clone()
        }
        None => implied_matrix(map, u, algo, file)?,
    };
    let layout = ByteLayout::new(&m);
    let gpn = trace
        .facts
        .gpus_per_node
        .map(|g| g as usize)
        .unwrap_or(if n % 8 == 0 { 8 } else { n });
    let mut plan = Plan::new("msccl-xml", n, gpn);
    let scratch_at = scratch_offsets(algo, trace, &m, u);
    for (g, at) in algo.gpus.iter().zip(&scratch_at) {
        let need = at.last().copied().unwrap_or(0);
        if need > 0 {
            plan.need_scratch(g.id as usize, need);
        }
    }
    plan.chunking = Some(Chunking {
        chunk_bytes: u,
        layout: map.layout.name().to_string(),
    });
    let places = Places {
        map,
        m: &m,
        layout: &layout,
        u,
        scratch_at: &scratch_at,
    };
    let order = topo_order(trace);
    // The operation each step sends, receives or copies (the last one
    // listed where a step does two), by place: `streamed_after` reads the
    // one of the step just before a step.
    let mut step_op: PerStep<u32> = exec::per_step(algo, NO_OP);
    for (j, op) in trace.ops.iter().enumerate() {
        for r in [op.from, op.to] {
            step_op[r.gpu as usize][r.tb as usize][r.pos as usize] = j as u32;
        }
    }
    let mut level = vec![0u32; trace.ops.len()];
    // Transfers an operation stands for; an empty one stands for its deps.
    let mut eff: Vec<Vec<u32>> = vec![Vec::new(); trace.ops.len()];
    for &i in &order {
        let op = &trace.ops[i as usize];
        level[i as usize] = op
            .deps
            .iter()
            .map(|&d| level[d as usize] + 1)
            .max()
            .unwrap_or(0);
        let mut deps: Vec<u32> = op
            .deps
            .iter()
            .flat_map(|&d| eff[d as usize].iter().copied())
            .collect();
        deps.sort_unstable();
        deps.dedup();
        let pieces = op_pieces(algo, op, &places, file)?;
        if pieces.is_empty() {
            eff[i as usize] = deps;
            continue;
        }
        if let Some(t) = streamed_after(algo, trace, &step_op, i, &eff) {
            let last = &mut plan.transfers[t as usize];
            if let [(src_off, dst_off, bytes)] = pieces[..] {
                if (last.src, last.dst) == (op.src, op.dst)
                    && last.src_buf == buffer(op.src_buf)
                    && last.dst_buf == buffer(op.dst_buf)
                    && last.src_off + last.bytes == src_off
                    && last.dst_off + last.bytes == dst_off
                {
                    last.bytes += bytes;
                    eff[i as usize] = vec![t];
                    continue;
                }
            }
        }
        let path = path_of(op.src as usize, op.dst as usize, gpn);
        for (src_off, dst_off, bytes) in pieces {
            let t = plan.push(Transfer {
                src: op.src,
                src_buf: buffer(op.src_buf),
                src_off,
                dst: op.dst,
                dst_buf: buffer(op.dst_buf),
                dst_off,
                bytes,
                path,
                step: level[i as usize],
                deps: Deps::from_slice(&deps),
            });
            eff[i as usize].push(t);
        }
    }
    Ok((plan, m))
}

/// The transfer operation `i` continues, if it streams right behind one
/// operation `j` on the same connection: `i`'s send and receive (or its
/// local copy) are the steps just after `j`'s in the same tbs, they wait
/// for nothing else, and nobody waits for `j` alone. The executor then
/// pushes `i`'s chunks through the connection right behind `j`'s, with no
/// pause and no second latency, which a transfer that starts when `j`'s has
/// arrived would add. The caller merges them when the byte ranges continue
/// on both sides.
fn streamed_after(
    algo: &Algo,
    trace: &Trace,
    step_op: &PerStep<u32>,
    i: u32,
    eff: &[Vec<u32>],
) -> Option<u32> {
    let op = &trace.ops[i as usize];
    // The operation of the step just before `r` in its tb.
    let prev = |r: exec::StepRef| -> Option<u32> {
        let p = r.pos.checked_sub(1)?;
        let j = step_op[r.gpu as usize][r.tb as usize][p as usize];
        (j != NO_OP).then_some(j)
    };
    let j = prev(op.from)?;
    if prev(op.to) != Some(j) || op.deps != [j] {
        return None;
    }
    let prev = &trace.ops[j as usize];
    let step =
        |r: exec::StepRef| &algo.gpus[r.gpu as usize].tbs[r.tb as usize].steps[r.pos as usize];
    if (prev.src, prev.dst) != (op.src, op.dst)
        || [prev.from, prev.to].into_iter().any(|r| step(r).hasdep)
        || [op.from, op.to].into_iter().any(|r| step(r).depid >= 0)
    {
        return None;
    }
    match eff[j as usize][..] {
        [t] => Some(t),
        _ => None,
    }
}

/// Kahn's order of the operations by their dependencies (the run finished,
/// so there is no cycle).
fn topo_order(trace: &Trace) -> Vec<u32> {
    let ops = &trace.ops;
    let mut indeg: Vec<u32> = ops.iter().map(|o| o.deps.len() as u32).collect();
    let mut succ: Vec<Vec<u32>> = vec![Vec::new(); ops.len()];
    for (i, o) in ops.iter().enumerate() {
        for &d in &o.deps {
            succ[d as usize].push(i as u32);
        }
    }
    let mut order: Vec<u32> = (0..ops.len() as u32)
        .filter(|&i| indeg[i as usize] == 0)
        .collect();
    let mut head = 0;
    while head < order.len() {
        let v = order[head] as usize;
        head += 1;
        for &w in &succ[v] {
            indeg[w as usize] -= 1;
            if indeg[w as usize] == 0 {
                order.push(w);
            }
        }
    }
    order
}

fn buffer(b: BufRef) -> Buffer {
    match b {
        BufRef::Input => Buffer::Input,
        BufRef::Output => Buffer::Output,
        BufRef::Scratch => Buffer::Scratch,
    }
}

fn path_of(src: usize, dst: usize, gpn: usize) -> Path {
    if src == dst {
        Path::Local
    } else if src / gpn == dst / gpn {
        Path::Nvlink
    } else {
        Path::Rdma {
            nic: (src % gpn) as u32,
        }
    }
}

/// Byte offset of every scratch chunk of every gpu (and the end): chunks
/// lie back to back, each as long as the data it holds (a block's last chunk
/// may be short), so that chunks a file fills in one run are one byte range,
/// as the plan it was lowered from had them. A gpu whose scratch chunk holds
/// data of different lengths at different times (reused scratch) gives every
/// chunk `u` bytes.
fn scratch_offsets(algo: &Algo, trace: &Trace, m: &TrafficMatrix, u: u64) -> Vec<Vec<u64>> {
    let map = &trace.map;
    let mut len: Vec<Vec<Option<u64>>> = algo
        .gpus
        .iter()
        .map(|g| vec![None; g.s_chunks.max(0) as usize])
        .collect();
    let mut reused = vec![false; algo.gpus.len()];
    for op in &trace.ops {
        if op.dst_buf != BufRef::Scratch {
            continue;
        }
        let g = op.dst as usize;
        for (j, origin) in op.data.iter().enumerate() {
            let l = map
                .input_origin(origin.rank as usize, origin.idx)
                .map_or(0, |(d, c)| {
                    m.get(origin.rank as usize, d)
                        .saturating_sub(c as u64 * u)
                        .min(u)
                });
            match len[g].get_mut(op.dst_off as usize + j) {
                Some(slot @ None) => *slot = Some(l),
                Some(Some(x)) if *x == l => {}
                _ => reused[g] = true,
            }
        }
    }
    len.into_iter()
        .zip(reused)
        .map(|(slots, reused)| {
            let mut at = Vec::with_capacity(slots.len() + 1);
            let mut x = 0u64;
            at.push(0);
            for l in &slots {
                x += if reused { u } else { l.unwrap_or(0) };
                at.push(x);
            }
            at
        })
        .collect()
}

/// Where chunks lie in the plan's bytes.
struct Places<'a> {
    map: &'a ChunkMap,
    m: &'a TrafficMatrix,
    layout: &'a ByteLayout,
    /// Chunk size in bytes.
    u: u64,
    /// Per gpu, the byte offset of each scratch chunk ([`scratch_offsets`]).
    scratch_at: &'a [Vec<u64>],
}

/// An operation's byte ranges `(src_off, dst_off, bytes)`: one per chunk
/// that carries data, merged where both sides are contiguous.
fn op_pieces(
    algo: &Algo,
    op: &exec::Op,
    places: &Places<'_>,
    file: &str,
) -> Result<Vec<(u64, u64, u64)>> {
    let Places {
        map,
        m,
        layout,
        u,
        scratch_at,
    } = *places;
    let mut out: Vec<(u64, u64, u64)> = Vec::new();
    for (j, origin) in op.data.iter().enumerate() {
        let s = origin.rank as usize;
        let Some((d, c)) = map.input_origin(s, origin.idx) else {
            continue; // padding: no data
        };
        let len = m.get(s, d).saturating_sub(c as u64 * u).min(u);
        if len == 0 {
            continue;
        }
        let at = |rank: u32, buf: BufRef, pos: u32| -> Result<u64> {
            match buf {
                BufRef::Input => Ok(layout.send_offset(s, d) + c as u64 * u),
                BufRef::Scratch => Ok(scratch_at[rank as usize][pos as usize]),
                BufRef::Output => {
                    if rank as usize == d && pos == map.output_chunk(s, d, c) {
                        Ok(layout.recv_offset(s, d) + c as u64 * u)
                    } else {
                        let r = if buf == BufRef::Output && rank == op.dst {
                            op.to
                        } else {
                            op.from
                        };
                        let g = &algo.gpus[r.gpu as usize];
                        Err(InputError::at(
                            file,
                            format!("line {}", g.tbs[r.tb as usize].steps[r.pos as usize].line),
                            format!(
                                "gpu {}, tb {}, step {}: keeps input chunk {} of gpu {s} in output chunk {pos} of gpu {rank}, a place that belongs to other data; stage it in scratch",
                                g.id, g.tbs[r.tb as usize].id, r.pos, origin.idx
                            ),
                        )
                        .into())
                    }
                }
            }
        };
        let so = at(op.src, op.src_buf, op.src_off + j as u32)?;
        let dof = at(op.dst, op.dst_buf, op.dst_off + j as u32)?;
        match out.last_mut() {
            Some(last) if last.0 + last.2 == so && last.1 + last.2 == dof => last.2 += len,
            _ => out.push((so, dof, len)),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A correct 2-GPU all-to-all, one chunk per pair.
    const TWO: &str = r#"<algo name="t" proto="Simple" nchannels="1" nchunksperloop="2" ngpus="2" coll="alltoall" inplace="0" outofplace="1" minBytes="0" maxBytes="0">
  <gpu id="0" i_chunks="2" o_chunks="2" s_chunks="0">
    <tb id="0" send="-1" recv="-1" chan="0">
      <step s="0" type="cpy" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
    <tb id="1" send="1" recv="-1" chan="0">
      <step s="0" type="s" srcbuf="i" srcoff="1" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
    <tb id="2" send="-1" recv="1" chan="0">
      <step s="0" type="r" srcbuf="i" srcoff="0" dstbuf="o" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
  </gpu>
  <gpu id="1" i_chunks="2" o_chunks="2" s_chunks="0">
    <tb id="0" send="-1" recv="-1" chan="0">
      <step s="0" type="cpy" srcbuf="i" srcoff="1" dstbuf="o" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
    <tb id="1" send="0" recv="-1" chan="0">
      <step s="0" type="s" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
    <tb id="2" send="-1" recv="0" chan="0">
      <step s="0" type="r" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
  </gpu>
</algo>
"#;

    fn err(text: &str) -> String {
        let e = parse_xml(text, "f.xml", None).unwrap_err();
        assert!(e.is_bad_input(), "{e}");
        e.to_string()
    }

    #[test]
    fn numbers_from_the_file_cannot_overflow() {
        assert!(parse_xml(TWO, "f.xml", None).is_ok());
        // An offset near i64::MAX once overflowed `off + cnt`.
        let e = err(&TWO.replacen(
            r#"srcoff="1" dstbuf="o" dstoff="0""#,
            r#"srcoff="9223372036854775807" dstbuf="o" dstoff="0""#,
            1,
        ));
        assert!(
            e.starts_with("f.xml: line 7: gpu 0, tb 1, step 0: src chunks 9223372036854775807.."),
            "{e}"
        );
        // A chunk size near u64::MAX once overflowed chunks x bytes.
        let big = TWO.replace(r#"name="t""#, r#"name="switchyard direct layout=padded chunk_bytes=18446744073709551615 gpus_per_node=2""#);
        let e = err(&big);
        assert!(
            e.contains("line 1: chunks of 18446744073709551615 bytes; at most 2^38"),
            "{e}"
        );
        let e = xml_traffic(&big, "f.xml").unwrap_err().to_string();
        assert!(e.contains("at most 2^38"), "{e}");
        let zero = TWO.replace(
            r#"name="t""#,
            r#"name="switchyard direct layout=padded chunk_bytes=0 gpus_per_node=2""#,
        );
        assert!(err(&zero).contains("chunk_bytes=0"));
        // Chunk counts past int16 offsets once overflowed the chunk map.
        let rows = "  <!-- chunks from 0: 4294967295 1 -->\n  <!-- chunks from 1: 1 1 -->\n  <gpu id=\"0\"";
        let e = err(&TWO.replacen("  <gpu id=\"0\"", rows, 1));
        assert!(
            e.contains(
                "line 2: chunk comment for rank 0: 4294967295 chunks, more than offsets address"
            ),
            "{e}"
        );
    }

    #[test]
    fn damaged_chunk_comments_are_errors() {
        let e = err(&TWO.replacen(
            "  <gpu id=\"0\"",
            "  <!-- chunks from 0: 1 x -->\n  <gpu id=\"0\"",
            1,
        ));
        assert_eq!(
            e,
            "f.xml: line 2: malformed chunk comment `chunks from 0: 1 x`"
        );
        // Other comments are the file's business.
        let ok = TWO.replacen(
            "  <gpu id=\"0\"",
            "  <!-- chunks, as you like -->\n  <gpu id=\"0\"",
            1,
        );
        assert!(parse_xml(&ok, "f.xml", None).is_ok());
    }

    #[test]
    fn implied_traffic_is_bounded_before_it_is_allocated() {
        // ngpus x ngpus counts were allocated before any other check: 10^10 here.
        let huge = TWO
            .replace(r#"ngpus="2""#, r#"ngpus="100000""#)
            .replace(r#"nchunksperloop="2""#, r#"nchunksperloop="100000""#);
        let e = xml_traffic(&huge, "f.xml").unwrap_err().to_string();
        assert!(
            e.contains(r#"line 1: ngpus="100000" must be in 1..=4096"#),
            "{e}"
        );
        let e = xml_traffic(
            &TWO.replace(r#"nchunksperloop="2""#, r#"nchunksperloop="65536""#),
            "f.xml",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("must be in 1..=32768"), "{e}");
        // 2^38-byte chunks are allowed, but not so many that the matrix passes 2^53 bytes.
        let many = TWO
            .replace(r#"name="t""#, r#"name="switchyard direct layout=padded chunk_bytes=274877906944 gpus_per_node=2""#)
            .replace(r#"nchunksperloop="2""#, r#"nchunksperloop="32768""#);
        let e = xml_traffic(&many, "f.xml").unwrap_err().to_string();
        assert!(e.contains("more than 2^53 bytes"), "{e}");
    }

    #[test]
    fn long_values_are_clipped_in_messages() {
        let long = "c".repeat(100_000);
        let e = err(&TWO.replacen(r#"type="cpy""#, &format!(r#"type="{long}""#), 1));
        assert!(e.len() < 200, "{} bytes", e.len());
        assert_eq!(
            e,
            "f.xml: line 4: value of `type` is longer than the executor's 256-byte buffer"
        );
        let e = err(&TWO.replacen(r#"type="cpy""#, &format!(r#"type="{}""#, &long[..255]), 1));
        assert!(
            e.contains(r#"type="cccccccccccccccccccccccccccccccccccccccc...""#),
            "{e}"
        );
    }

    /// The executor's lexical rules hold on read as on write: every one of
    /// these files was read as "ok" although the executor refuses most of
    /// them (and one refused file disables MSCCL for every communicator).
    #[test]
    fn lexical_rules_hold_on_read() {
        let algo_line = TWO.lines().next().unwrap();
        let cases: Vec<(String, &str)> = vec![
            (
                format!("<?xml version=\"1.0\"?>\n{TWO}"),
                "line 1: XML prolog",
            ),
            (format!("\u{feff}{TWO}"), "line 1: byte-order mark"),
            (
                TWO.replacen("  <gpu", "\t<gpu", 1),
                "line 2: tab at column 1",
            ),
            (
                TWO.replacen("  <gpu id=\"0\"", "  <!--a=b-->\n  <gpu id=\"0\"", 1),
                "line 2: comment the executor misreads",
            ),
            (
                TWO.replacen("    </tb>\n", "    </tb><!-- x -->\n", 1),
                "line 5: ",
            ),
            (
                TWO.replacen(r#"name="t""#, &format!(r#"name="{}""#, "n".repeat(300)), 1),
                "line 1: value of `name` is longer",
            ),
            (
                TWO.replacen(
                    r#"name="t""#,
                    &format!("name=\"t\"{}", r#" x="1""#.repeat(7)),
                    1,
                ),
                "line 1: 17 attributes: the executor keeps only the first 16",
            ),
            (
                TWO.replacen(r#"name="t""#, r#"name="a&amp;b""#, 1),
                "line 1: value of `name` holds `&`",
            ),
            (
                TWO.replace("</algo>\n", ""),
                "line 1: <algo> is never closed",
            ),
            (
                format!(
                    "{algo_line}\n<!DOCTYPE algo>\n{}",
                    &TWO[algo_line.len() + 1..]
                ),
                "line 2: DOCTYPE",
            ),
            (
                TWO.replacen("\n    <tb id=\"1\"", "<tb id=\"1\"", 1),
                "line 5: ",
            ),
        ];
        for (text, want) in cases {
            let e = err(&text);
            assert!(e.starts_with(&format!("f.xml: {want}")), "{want}: {e}");
            assert!(xml_traffic(&text, "f.xml").is_err(), "{want}");
        }
    }

    #[test]
    fn numbers_must_be_plain_decimal() {
        let text = r#"<algo name="x" proto="LL" nchannels="1" nchunksperloop="0x2" ngpus="2" coll="alltoall" inplace="0" outofplace="1" minBytes="0" maxBytes="0">
</algo>"#;
        let e = parse_algo(text, "f.xml").unwrap_err().to_string();
        assert_eq!(e, "f.xml: line 1: <algo>: nchunksperloop=\"0x2\" is not a plain decimal number (the executor reads numbers with strtol)");
        let e = parse_algo(
            &text.replace(" coll=\"alltoall\"", "").replace("0x2", "2"),
            "f.xml",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("lacks attribute `coll`"), "{e}");
    }

    #[test]
    fn line_numbers_and_skipped_elements() {
        let text = "<algo name=\"x\" proto=\"LL\" nchannels=\"1\" nchunksperloop=\"2\" ngpus=\"2\" coll=\"alltoall\" inplace=\"0\" outofplace=\"1\" minBytes=\"0\" maxBytes=\"0\">\n  <meta>\n    <gpu id=\"9\"/>\n  </meta>\n  <gpu id=\"0\" i_chunks=\"2\" o_chunks=\"2\">\n  </gpu>\n</algo>\n";
        let e = parse_algo(text, "f.xml").unwrap_err().to_string();
        assert_eq!(
            e,
            "f.xml: line 5: <gpu>: lacks attribute `s_chunks`, which the executor requires"
        );
    }
}
