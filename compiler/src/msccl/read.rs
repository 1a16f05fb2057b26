//! The reader: MSCCL XML (Switchyard's and other tools') into an [`Algo`],
//! and through a symbolic run into the Plan IR.
//!
//! A file must first pass the executor reader's lexical rules
//! ([`super::exec::check_lexical`]: no prolog, BOM, tab, DOCTYPE or entity,
//! one tag per line, ...), on read as on write, since one file the executor
//! refuses disables MSCCL for every communicator. The element tree is then
//! read with quick-xml; numbers must be plain decimal, since the executor
//! would read `010` as 8.
//! A plan's transfers are the file's operations (a send met by its receive,
//! or a local copy), found by [`super::exec::run`], with byte ranges from the
//! chunk size and the traffic matrix.

use std::collections::HashMap;

use quick_xml::events::{BytesStart, Event};
use quick_xml::Reader;

use super::exec::{self, Trace};
use super::{Algo, BufRef, ChunkMap, Gpu, NameFacts, Protocol, Step, StepKind, Tb};
use super::{MAX_CHUNK_BYTES, MAX_NODES, MAX_OFFSET};
use crate::error::{clip, InputError, Result};
use crate::plan::{Buffer, Chunking, Deps, Path, Plan, Transfer};
use crate::topology::Topology;
use crate::traffic::{Layout as ByteLayout, TrafficMatrix, MAX_TOTAL_BYTES};

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

/// Chunks per pair and where they sit: from the file's chunk comments and
/// the layout in its name, else the uniform all-to-all.
pub(crate) fn chunk_map(algo: &Algo, file: &str) -> Result<ChunkMap> {
    let bad = |reason: String| -> crate::error::Error {
        InputError::at(file, format!("line {}", algo.line), reason).into()
    };
    // Bounds first: the map holds ngpus^2 counts, and offsets are int16.
    let n = algo.ngpus;
    if n < 1 || n > MAX_NODES as i64 {
        return Err(bad(format!(
            "ngpus=\"{n}\" must be in 1..={MAX_NODES} (the executor loads at most {MAX_NODES} elements)"
        )));
    }
    if algo.nchunksperloop < 1 || algo.nchunksperloop > MAX_OFFSET + 1 {
        return Err(bad(format!(
            "nchunksperloop=\"{}\" must be in 1..={}",
            algo.nchunksperloop,
            MAX_OFFSET + 1
        )));
    }
    let layout = algo.facts().layout.unwrap_or_default();
    match &algo.chunks {
        Some(rows) => {
            if rows.len() != n as usize || rows.iter().any(|r| r.len() != n as usize) {
                return Err(bad(format!(
                    "the chunk comments must give {n} rows of {n} counts"
                )));
            }
            let m = ChunkMap::new(rows.clone(), layout);
            if m.nchunksperloop as i64 != algo.nchunksperloop {
                return Err(bad(format!(
                    "nchunksperloop=\"{}\" but the chunk comments in {layout} layout need {}",
                    algo.nchunksperloop, m.nchunksperloop
                )));
            }
            Ok(m)
        }
        None => {
            if algo.nchunksperloop < 1 || algo.nchunksperloop % n != 0 {
                return Err(bad(format!(
                    "nchunksperloop=\"{}\" is not a positive multiple of ngpus=\"{n}\": all-to-all blocks would split chunks",
                    algo.nchunksperloop
                )));
            }
            Ok(ChunkMap::uniform(
                n as usize,
                (algo.nchunksperloop / n) as u32,
            ))
        }
    }
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
    // The operation whose send (receive) is the step just before each step.
    let mut prev_step: HashMap<(u32, u32, u32), u32> = HashMap::new();
    for (j, op) in trace.ops.iter().enumerate() {
        for r in [op.from, op.to] {
            prev_step.insert((r.gpu, r.tb, r.pos + 1), j as u32);
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
        if let Some(t) = streamed_after(algo, trace, &prev_step, i, &eff) {
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
    prev_step: &HashMap<(u32, u32, u32), u32>,
    i: u32,
    eff: &[Vec<u32>],
) -> Option<u32> {
    let op = &trace.ops[i as usize];
    let j = *prev_step.get(&(op.from.gpu, op.from.tb, op.from.pos))?;
    if prev_step.get(&(op.to.gpu, op.to.tb, op.to.pos)) != Some(&j) || op.deps != [j] {
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

/// Checks the executor's lexical rules ([`super::exec::check_lexical`])
/// and reads the element tree. Other elements are skipped with their
/// content, as the executor does; a missing attribute, a non-decimal
/// number or an element left open is an error with its line.
pub fn parse_algo(text: &str, file: &str) -> Result<Algo> {
    exec::check_lexical(text, file)?;
    let lines = LineIndex::new(text);
    let mut r = Reader::from_str(text);
    r.config_mut().trim_text(true);
    let mut algo: Option<Algo> = None;
    // Depth of the handled path: 0 outside, 1 algo, 2 gpu, 3 tb; `skip`
    // counts open unknown elements.
    let mut depth = 0usize;
    let mut skip = 0usize;
    let mut chunk_rows: Vec<(usize, Vec<u32>)> = Vec::new();
    // Elements not yet closed, with their lines: the executor's reader
    // fails at the end of a file that leaves one open.
    let mut open: Vec<(String, usize)> = Vec::new();
    loop {
        let before = r.buffer_position() as usize;
        let ev = r.read_event().map_err(|e| {
            let pos = r.error_position() as usize;
            InputError::at(
                file,
                format!("line {}", lines.line_of(text, pos)),
                format!("not well-formed XML: {e}"),
            )
        })?;
        let line = lines.line_of(text, before);
        let bad = |reason: String| -> crate::error::Error {
            InputError::at(file, format!("line {line}"), reason).into()
        };
        match ev {
            Event::Eof => break,
            Event::Start(ref e) | Event::Empty(ref e) => {
                let empty = matches!(ev, Event::Empty(_));
                let name = e.name();
                let name = name.as_ref().to_string();
                if !empty {
                    open.push((name.clone(), line));
                }
                if skip > 0 {
                    if !empty {
                        skip += 1;
                    }
                    continue;
                }
                let attrs = Attrs::new(e, line, file)?;
                match (depth, name.as_str()) {
                    (0, "algo") => {
                        if algo.is_some() {
                            return Err(bad("a second <algo>: one file holds one".into()));
                        }
                        algo = Some(read_algo_attrs(&attrs)?);
                    }
                    (1, "gpu") => {
                        let a = algo.as_mut().expect("depth 1 is inside algo");
                        a.gpus.push(Gpu {
                            id: attrs.int("id")?,
                            i_chunks: attrs.int("i_chunks")?,
                            o_chunks: attrs.int("o_chunks")?,
                            s_chunks: attrs.int("s_chunks")?,
                            tbs: Vec::new(),
                            line,
                        });
                    }
                    (2, "tb") => {
                        let gpu = last_gpu(&mut algo);
                        gpu.tbs.push(Tb {
                            id: attrs.int("id")?,
                            send: attrs.int("send")?,
                            recv: attrs.int("recv")?,
                            chan: attrs.int("chan")?,
                            steps: Vec::new(),
                            line,
                        });
                    }
                    (3, "step") => {
                        if !empty {
                            return Err(bad("<step> must be empty (`<step .../>`): the executor crashes on children of a step".into()));
                        }
                        let step = read_step(&attrs)?;
                        let tb = last_gpu(&mut algo)
                            .tbs
                            .last_mut()
                            .expect("depth 3 is inside tb");
                        tb.steps.push(step);
                        continue;
                    }
                    (0, _) => {
                        return Err(bad(format!("the first element is <{name}>, not <algo>")))
                    }
                    _ => {
                        if !empty {
                            skip = 1;
                        }
                        continue;
                    }
                }
                if empty {
                    continue;
                }
                depth += 1;
            }
            Event::End(_) => {
                open.pop();
                if skip > 0 {
                    skip -= 1;
                } else {
                    depth = depth.saturating_sub(1);
                }
            }
            Event::Comment(c) => {
                let body: &str = &c;
                if let Some(row) = parse_chunk_comment(body) {
                    let row = row.map_err(bad)?;
                    chunk_rows.push((line, row.1));
                    if row.0 != chunk_rows.len() - 1 {
                        return Err(bad(format!(
                            "chunk comment for rank {} where rank {} was expected",
                            row.0,
                            chunk_rows.len() - 1
                        )));
                    }
                }
            }
            Event::Text(t) => {
                if skip == 0 && !t.chars().all(char::is_whitespace) {
                    return Err(bad(
                        "text between elements: the executor's reader rejects it".into(),
                    ));
                }
            }
            Event::CData(_) => return Err(bad("CDATA: the executor's reader has none".into())),
            Event::Decl(_) | Event::PI(_) | Event::DocType(_) | Event::GeneralRef(_) => {}
        }
    }
    if let Some((name, line)) = open.last() {
        return Err(InputError::at(
            file,
            format!("line {line}"),
            format!("<{name}> is never closed (the file ends first)"),
        )
        .into());
    }
    let mut algo = algo.ok_or_else(|| InputError::new(file, "no <algo> element"))?;
    if !chunk_rows.is_empty() {
        algo.chunks = Some(chunk_rows.into_iter().map(|(_, r)| r).collect());
    }
    Ok(algo)
}

fn last_gpu(algo: &mut Option<Algo>) -> &mut Gpu {
    algo.as_mut()
        .and_then(|a| a.gpus.last_mut())
        .expect("depth 2 is inside gpu")
}

/// ` chunks from S: k0 k1 ... ` → `(S, [k...])`; `None` for any other
/// comment. A comment that starts like one but does not parse, or counts
/// more chunks than offsets address, is an error: it is a damaged file, and
/// reading it as uniform would check the wrong all-to-all.
fn parse_chunk_comment(body: &str) -> Option<std::result::Result<(usize, Vec<u32>), String>> {
    let rest = body.trim().strip_prefix("chunks from ")?;
    let malformed = || format!("malformed chunk comment `{}`", clip(body.trim()));
    let Some((s, cells)) = rest.split_once(':') else {
        return Some(Err(malformed()));
    };
    let Ok(s) = s.parse::<usize>() else {
        return Some(Err(malformed()));
    };
    let mut row = Vec::new();
    for c in cells.split_whitespace() {
        match c.parse::<u32>() {
            Ok(k) if i64::from(k) <= MAX_OFFSET + 1 => row.push(k),
            Ok(_) => {
                return Some(Err(format!(
                    "chunk comment for rank {s}: {k} chunks, more than offsets address ({})",
                    MAX_OFFSET + 1,
                    k = clip(c)
                )))
            }
            Err(_) => return Some(Err(malformed())),
        }
    }
    Some(Ok((s, row)))
}

fn read_algo_attrs(a: &Attrs) -> Result<Algo> {
    let proto = a.get("proto")?;
    let proto: Protocol = proto.parse().map_err(|e: String| a.bad(e))?;
    let name = a.opt("name").unwrap_or_default();
    let facts = NameFacts::parse(name).map_err(|e| a.bad(e))?;
    let ngpus = a.int("ngpus")?;
    if let Some(g) = facts.gpus_per_node.filter(|_| ngpus >= 1) {
        if ngpus % i64::from(g) != 0 {
            return Err(a
                .bad(format!(
                    "gpus_per_node={g} in the name does not split ngpus=\"{ngpus}\" into whole nodes"
                ))
                .into());
        }
    }
    Ok(Algo {
        name: name.to_string(),
        proto,
        nchannels: a.int("nchannels")?,
        nchunksperloop: a.int("nchunksperloop")?,
        ngpus,
        coll: a.get("coll")?.to_string(),
        inplace: a.flag("inplace")?,
        outofplace: a.flag("outofplace")?,
        min_bytes: a.int("minBytes")?,
        max_bytes: a.int("maxBytes")?,
        gpus: Vec::new(),
        chunks: None,
        line: a.line,
    })
}

fn read_step(a: &Attrs) -> Result<Step> {
    let kind = a.get("type")?;
    let kind = StepKind::parse(kind).ok_or_else(|| {
        a.bad(format!(
            "type=\"{}\" is not a step type (s r rcs rrs rrc rrcs cpy re nop)",
            clip(kind)
        ))
    })?;
    let buf = |key: &str| -> Result<BufRef> {
        let v = a.get(key)?;
        BufRef::parse(v).ok_or_else(|| {
            a.bad(format!("{key}=\"{}\" must be i, o or s", clip(v)))
                .into()
        })
    };
    Ok(Step {
        s: a.int("s")?,
        kind,
        srcbuf: buf("srcbuf")?,
        srcoff: a.int("srcoff")?,
        dstbuf: buf("dstbuf")?,
        dstoff: a.int("dstoff")?,
        cnt: a.int("cnt")?,
        depid: a.int("depid")?,
        deps: a.int("deps")?,
        hasdep: a.flag("hasdep")?,
        line: a.line,
    })
}

/// An element's attributes as raw strings (no entity decoding, as the
/// executor), first occurrence wins.
struct Attrs<'f> {
    element: String,
    pairs: Vec<(String, String)>,
    line: usize,
    file: &'f str,
}

impl<'f> Attrs<'f> {
    fn new(e: &BytesStart<'_>, line: usize, file: &'f str) -> Result<Attrs<'f>> {
        let element = e.name().as_ref().to_string();
        let mut pairs = Vec::new();
        for a in e.attributes() {
            let a = a.map_err(|err| {
                InputError::at(
                    file,
                    format!("line {line}"),
                    format!("<{element}>: bad attribute: {err}"),
                )
            })?;
            pairs.push((a.key.as_ref().to_string(), a.value.to_string()));
        }
        Ok(Attrs {
            element,
            pairs,
            line,
            file,
        })
    }

    fn bad(&self, reason: String) -> InputError {
        InputError::at(
            self.file,
            format!("line {}", self.line),
            format!("<{}>: {reason}", self.element),
        )
    }

    fn opt(&self, key: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    fn get(&self, key: &str) -> Result<&str> {
        self.opt(key).ok_or_else(|| {
            self.bad(format!(
                "lacks attribute `{key}`, which the executor requires"
            ))
            .into()
        })
    }

    /// A plain decimal integer: `strtol` would read `010` as octal and
    /// `0x10` as hex, and junk as 0 without complaint.
    fn int(&self, key: &str) -> Result<i64> {
        let v = self.get(key)?;
        let digits = v.strip_prefix('-').unwrap_or(v);
        let plain = !digits.is_empty()
            && digits.bytes().all(|b| b.is_ascii_digit())
            && (digits == "0" || !digits.starts_with('0'));
        match v.parse::<i64>() {
            Ok(x) if plain => Ok(x),
            _ => Err(self
                .bad(format!(
                    "{key}=\"{}\" is not a plain decimal number (the executor reads numbers with strtol)",
                    clip(v)
                ))
                .into()),
        }
    }

    fn flag(&self, key: &str) -> Result<bool> {
        match self.get(key)? {
            "0" => Ok(false),
            "1" => Ok(true),
            v => Err(self
                .bad(format!("{key}=\"{}\" must be 0 or 1", clip(v)))
                .into()),
        }
    }
}

/// Byte offset to line number.
struct LineIndex {
    starts: Vec<usize>,
}

impl LineIndex {
    fn new(text: &str) -> Self {
        let mut starts = vec![0];
        starts.extend(text.match_indices('\n').map(|(i, _)| i + 1));
        LineIndex { starts }
    }

    /// The line of the first non-blank byte at or after `pos`.
    fn line_of(&self, text: &str, pos: usize) -> usize {
        let skip = text
            .get(pos..)
            .map_or(0, |t| t.len() - t.trim_start().len());
        let p = pos + skip;
        self.starts.partition_point(|&s| s <= p).max(1)
    }
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
