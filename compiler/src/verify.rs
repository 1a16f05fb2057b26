//! The verifier: the one check every plan must pass, whoever made it.
//!
//! It replays the plan symbolically in dependency order, tracking for every
//! written byte range which input byte it holds (its origin), and proves that
//! every byte of `M[s][d]` ends in `output` of `d` at its all-to-all(v) place,
//! exactly once; that nothing is read before it is written (the writer must
//! be an ancestor of the reader in the dependency graph); that no two
//! transfers write one byte; that the dependencies have no cycle; and that
//! every range lies inside its buffer. Errors name the transfer and the bytes.

use std::collections::BTreeMap;

use crate::plan::{Buffer, DepGraph, Path, Plan, Transfer};
use crate::topology::Topology;
use crate::traffic::{Layout, TrafficMatrix};

pub use crate::error::VerifyError;

/// What a verified plan does, for reports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VerifyStats {
    pub transfers: usize,
    /// Bytes copied between different ranks.
    pub bytes_moved: u64,
    /// Bytes of the all-to-all that changed rank (the traffic off the diagonal).
    pub payload_bytes: u64,
    /// Longest dependency chain, in transfers.
    pub depth: usize,
}

/// A written range: where its bytes came from and who wrote them.
#[derive(Clone, Copy, Debug)]
struct Seg {
    end: u64,
    origin_rank: u32,
    origin_off: u64,
    writer: u32,
}

/// Checks that `plan` is a correct all-to-all(v) of `traffic` (see the
/// module comment for every rule); on success, what the plan moves. Paths are
/// checked against the plan's own `gpus_per_node` only; [`verify_on`] also
/// checks them against a topology (the sender's rail NIC).
///
/// ```
/// use switchyard_compiler::sched::direct;
/// use switchyard_compiler::{verify, Topology, TrafficMatrix};
///
/// let topo = Topology::preset("dgx-h100", 1, Some(4))?; // one node of 4 GPUs
/// let traffic = TrafficMatrix::uniform(4, 100);
/// let mut plan = direct(&topo, &traffic);
/// let stats = verify(&plan, &traffic)?;
/// assert_eq!(stats.payload_bytes, 12 * 100); // the 12 off-diagonal blocks
///
/// plan.transfers[1].dst_off += 1; // put one block a byte off its place
/// let err = verify(&plan, &traffic).unwrap_err();
/// println!("{err}"); // names the transfer and the bytes
/// # Ok::<(), switchyard_compiler::Error>(())
/// ```
pub fn verify(plan: &Plan, traffic: &TrafficMatrix) -> Result<VerifyStats, VerifyError> {
    Verifier::new(plan, traffic)?.run()
}

/// [`verify`], and also that every path is one the topology has (NVLink only
/// inside a node, RDMA only between nodes through the sender's rail NIC).
pub fn verify_on(
    plan: &Plan,
    traffic: &TrafficMatrix,
    topo: &Topology,
) -> Result<VerifyStats, VerifyError> {
    if plan.gpus_per_node as usize != topo.gpus_per_node() || plan.ranks as usize != topo.ranks() {
        return Err(VerifyError::Transfer {
            index: 0,
            reason: format!(
                "plan is for {} ranks of {} GPUs per node, the topology has {} of {}",
                plan.ranks,
                plan.gpus_per_node,
                topo.ranks(),
                topo.gpus_per_node()
            ),
        });
    }
    if topo.is_hierarchical() && topo.nics_per_node() > 0 {
        for (i, t) in plan.transfers.iter().enumerate() {
            if let Path::Rdma { nic } = t.path {
                let rail = topo.rail_of(t.src as usize);
                if nic as usize != rail {
                    return Err(VerifyError::Transfer {
                        index: i,
                        reason: format!(
                            "uses NIC {nic} but rank {} sends through its rail NIC {rail}",
                            t.src
                        ),
                    });
                }
            }
        }
    }
    verify(plan, traffic)
}

struct Verifier<'a> {
    plan: &'a Plan,
    traffic: &'a TrafficMatrix,
    layout: Layout,
    n: usize,
}

impl<'a> Verifier<'a> {
    fn new(plan: &'a Plan, traffic: &'a TrafficMatrix) -> Result<Self, VerifyError> {
        let n = traffic.ranks();
        if plan.ranks as usize != n {
            return Err(VerifyError::Ranks {
                plan: plan.ranks as usize,
                traffic: n,
            });
        }
        Ok(Verifier {
            plan,
            traffic,
            layout: Layout::new(traffic),
            n,
        })
    }

    fn buffer_size(&self, rank: usize, buf: Buffer) -> u64 {
        match buf {
            Buffer::Input => self.layout.input_size(rank),
            Buffer::Output => self.layout.output_size(rank),
            Buffer::Scratch => self.plan.scratch_bytes(rank),
        }
    }

    fn check_transfer(&self, i: usize, t: &Transfer) -> Result<(), VerifyError> {
        let bad = |reason: String| VerifyError::Transfer { index: i, reason };
        let (src, dst) = (t.src as usize, t.dst as usize);
        if src >= self.n || dst >= self.n {
            return Err(bad(format!(
                "rank {} does not exist ({} ranks)",
                src.max(dst),
                self.n
            )));
        }
        let g = self.plan.gpus_per_node.max(1) as usize;
        let same_node = src / g == dst / g;
        match t.path {
            Path::Local if src != dst => {
                return Err(bad(format!("local path between ranks {src} and {dst}")))
            }
            Path::Nvlink if !same_node || src == dst => {
                return Err(bad(format!(
                    "NVLink path from rank {src} to rank {dst}, not two GPUs of one node"
                )))
            }
            Path::Rdma { .. } if same_node => {
                return Err(bad(format!(
                    "RDMA path from rank {src} to rank {dst} inside one node"
                )))
            }
            _ => {}
        }
        if t.dst_buf == Buffer::Input {
            return Err(bad("writes into an input buffer".into()));
        }
        for (rank, buf, off) in [(src, t.src_buf, t.src_off), (dst, t.dst_buf, t.dst_off)] {
            let size = self.buffer_size(rank, buf);
            if off.checked_add(t.bytes).is_none_or(|end| end > size) {
                return Err(bad(format!(
                    "bytes {off}..{} lie outside {} of rank {rank} ({size} bytes)",
                    off.saturating_add(t.bytes),
                    buf.name()
                )));
            }
        }
        for &d in &t.deps {
            if d as usize >= self.plan.transfers.len() || d as usize == i {
                return Err(bad(format!(
                    "depends on transfer {d}, which does not exist or is itself"
                )));
            }
        }
        Ok(())
    }

    /// The dependency order and each transfer's position in it.
    fn topo_order(&self) -> Result<(Vec<u32>, Vec<u32>), VerifyError> {
        let graph = DepGraph::new(self.plan).map_err(|(index, d)| VerifyError::Transfer {
            index,
            reason: format!("depends on transfer {d}, which does not exist or is itself"),
        })?;
        let order = graph.topo_order().map_err(|indeg| VerifyError::Cycle {
            cycle: find_cycle(self.plan, &indeg),
        })?;
        let mut pos = vec![0u32; order.len()];
        for (p, &v) in order.iter().enumerate() {
            pos[v as usize] = p as u32;
        }
        Ok((order, pos))
    }

    fn run(&self) -> Result<VerifyStats, VerifyError> {
        for (i, t) in self.plan.transfers.iter().enumerate() {
            self.check_transfer(i, t)?;
        }
        let (order, pos) = self.topo_order()?;
        let mut anc = AncestorCheck::new(self.plan.transfers.len());
        // Written ranges of output (index 0) and scratch (index 1) per rank.
        let mut written: Vec<[BTreeMap<u64, Seg>; 2]> =
            (0..self.n).map(|_| Default::default()).collect();
        let mut depth = vec![0u32; self.plan.transfers.len()];
        let mut pieces: Vec<Seg> = Vec::new();
        for &i in &order {
            let i = i as usize;
            let t = &self.plan.transfers[i];
            depth[i] = 1 + t.deps.iter().map(|&d| depth[d as usize]).max().unwrap_or(0);
            if t.bytes == 0 {
                continue;
            }
            // Gather the origin of the bytes read, as pieces relative to src_off.
            pieces.clear();
            match t.src_buf {
                Buffer::Input => pieces.push(Seg {
                    end: t.bytes,
                    origin_rank: t.src,
                    origin_off: t.src_off,
                    writer: u32::MAX,
                }),
                buf => {
                    let map = &written[t.src as usize][slot(buf)];
                    self.read_pieces(i, t, map, &pos, &mut anc, &mut pieces)?;
                }
            }
            let map = &mut written[t.dst as usize][slot(t.dst_buf)];
            let (start, end) = (t.dst_off, t.dst_off + t.bytes);
            // Overlap with an existing range: the one starting before `end` with the largest start.
            if let Some((&s, seg)) = map.range(..end).next_back() {
                if seg.end > start {
                    return Err(VerifyError::DoubleWrite {
                        first: seg.writer as usize,
                        second: i,
                        rank: t.dst as usize,
                        buffer: t.dst_buf.name(),
                        start: s.max(start),
                        end: seg.end.min(end),
                    });
                }
            }
            let mut at = 0;
            for p in &pieces {
                map.insert(
                    start + at,
                    Seg {
                        end: start + p.end,
                        origin_rank: p.origin_rank,
                        origin_off: p.origin_off,
                        writer: i as u32,
                    },
                );
                at = p.end;
            }
        }
        self.check_outputs(&written)?;
        Ok(VerifyStats {
            transfers: self.plan.transfers.len(),
            bytes_moved: self.plan.bytes_moved(),
            payload_bytes: self.traffic.off_diagonal_total(),
            depth: depth.iter().copied().max().unwrap_or(0) as usize,
        })
    }

    /// Splits the range transfer `i` reads from output/scratch into pieces by
    /// origin (ends relative to `src_off`), checking each was written by an ancestor.
    fn read_pieces(
        &self,
        i: usize,
        t: &Transfer,
        map: &BTreeMap<u64, Seg>,
        pos: &[u32],
        anc: &mut AncestorCheck,
        pieces: &mut Vec<Seg>,
    ) -> Result<(), VerifyError> {
        let (start, end) = (t.src_off, t.src_off + t.bytes);
        let unwritten = |a: u64, b: u64, why: String| VerifyError::ReadBeforeWrite {
            reader: i,
            rank: t.src as usize,
            buffer: t.src_buf.name(),
            start: a,
            end: b,
            why,
        };
        let mut at = start;
        let first = map.range(..=start).next_back().map_or(start, |(&s, _)| s);
        for (&s, seg) in map.range(first..end) {
            if seg.end <= at {
                continue;
            }
            if s > at {
                return Err(unwritten(at, s, "before any transfer writes them".into()));
            }
            let piece_end = seg.end.min(end);
            if !anc.is_ancestor(self.plan, seg.writer as usize, i, pos) {
                return Err(unwritten(
                    at,
                    piece_end,
                    format!(
                        "without depending on transfer {}, which writes them",
                        seg.writer
                    ),
                ));
            }
            pieces.push(Seg {
                end: piece_end - start,
                origin_rank: seg.origin_rank,
                origin_off: seg.origin_off + (at - s),
                writer: seg.writer,
            });
            at = piece_end;
            if at >= end {
                break;
            }
        }
        if at < end {
            return Err(unwritten(at, end, "before any transfer writes them".into()));
        }
        Ok(())
    }

    fn check_outputs(&self, written: &[[BTreeMap<u64, Seg>; 2]]) -> Result<(), VerifyError> {
        for (d, bufs) in written.iter().enumerate() {
            let segs = &bufs[0];
            let mut iter = segs.iter().peekable();
            for s in 0..self.n {
                let block = self.traffic.get(s, d);
                if block == 0 {
                    continue;
                }
                let (b0, b1) = (
                    self.layout.recv_offset(s, d),
                    self.layout.recv_offset(s, d) + block,
                );
                let expect0 = self.layout.send_offset(s, d);
                let mut at = b0;
                while at < b1 {
                    let Some((&start, seg)) = iter.peek().map(|(a, b)| (*a, *b)) else {
                        return Err(VerifyError::Missing {
                            rank: d,
                            src: s,
                            start: at,
                            end: b1,
                        });
                    };
                    if start > at {
                        return Err(VerifyError::Missing {
                            rank: d,
                            src: s,
                            start: at,
                            end: start.min(b1),
                        });
                    }
                    let expected = expect0 + (at - b0);
                    if seg.origin_rank as usize != s || seg.origin_off != expected || seg.end > b1 {
                        return Err(VerifyError::Misplaced {
                            writer: seg.writer as usize,
                            rank: d,
                            start,
                            end: seg.end,
                            origin_rank: seg.origin_rank as usize,
                            origin_start: seg.origin_off,
                            expected_rank: s,
                            expected_start: expected,
                        });
                    }
                    at = seg.end;
                    iter.next();
                }
            }
        }
        Ok(())
    }
}

fn slot(buf: Buffer) -> usize {
    match buf {
        Buffer::Output => 0,
        _ => 1,
    }
}

/// Answers "is `a` an ancestor of `b`?" by a backward search from `b`, pruned
/// at transfers that come before `a` in topological order, with epoch marks
/// so repeated queries allocate nothing.
struct AncestorCheck {
    mark: Vec<u32>,
    epoch: u32,
    stack: Vec<u32>,
}

impl AncestorCheck {
    fn new(n: usize) -> Self {
        AncestorCheck {
            mark: vec![0; n],
            epoch: 0,
            stack: Vec::new(),
        }
    }

    fn is_ancestor(&mut self, plan: &Plan, a: usize, b: usize, pos: &[u32]) -> bool {
        let deps = &plan.transfers[b].deps;
        if deps.iter().any(|&d| d as usize == a) {
            return true;
        }
        self.epoch += 1;
        self.stack.clear();
        self.stack.push(b as u32);
        let limit = pos[a];
        while let Some(v) = self.stack.pop() {
            for &d in &plan.transfers[v as usize].deps {
                if d as usize == a {
                    return true;
                }
                let du = d as usize;
                if pos[du] > limit && self.mark[du] != self.epoch {
                    self.mark[du] = self.epoch;
                    self.stack.push(d);
                }
            }
        }
        false
    }
}

/// A cycle among the transfers Kahn's algorithm could not order.
fn find_cycle(plan: &Plan, indeg: &[u32]) -> Vec<usize> {
    let stuck = |i: usize| indeg[i] > 0;
    let Some(start) = (0..plan.transfers.len()).find(|&i| stuck(i)) else {
        return Vec::new();
    };
    // Walk backwards along stuck dependencies until a transfer repeats.
    let mut seen = vec![usize::MAX; plan.transfers.len()];
    let mut path = Vec::new();
    let mut v = start;
    while seen[v] == usize::MAX {
        seen[v] = path.len();
        path.push(v);
        v = match plan.transfers[v]
            .deps
            .iter()
            .map(|&d| d as usize)
            .find(|&d| stuck(d))
        {
            Some(d) => d,
            None => break,
        };
    }
    let mut cycle = path[seen[v].min(path.len() - 1)..].to_vec();
    cycle.reverse();
    cycle
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Deps;
    use smallvec::smallvec;

    #[allow(clippy::too_many_arguments)]
    fn t(
        src: u32,
        sb: Buffer,
        so: u64,
        dst: u32,
        db: Buffer,
        doff: u64,
        bytes: u64,
        deps: Deps,
    ) -> Transfer {
        let path = if src == dst {
            Path::Local
        } else {
            Path::Rdma { nic: 0 }
        };
        Transfer {
            src,
            src_buf: sb,
            src_off: so,
            dst,
            dst_buf: db,
            dst_off: doff,
            bytes,
            path,
            step: 0,
            deps,
        }
    }

    /// 2 ranks, one GPU per node; M = [[1, 2], [3, 4]].
    fn setup() -> (TrafficMatrix, Plan) {
        let m = TrafficMatrix::from_rows(vec![vec![1, 2], vec![3, 4]]);
        let mut p = Plan::new("test", 2, 1);
        use Buffer::*;
        p.push(t(0, Input, 0, 0, Output, 0, 1, Deps::new()));
        p.push(t(0, Input, 1, 1, Output, 0, 2, Deps::new()));
        p.push(t(1, Input, 0, 0, Output, 1, 3, Deps::new()));
        p.push(t(1, Input, 3, 1, Output, 2, 4, Deps::new()));
        (m, p)
    }

    #[test]
    fn accepts_direct() {
        let (m, p) = setup();
        let s = verify(&p, &m).unwrap();
        assert_eq!(s.bytes_moved, 5);
        assert_eq!(s.depth, 1);
    }

    #[test]
    fn relay_through_scratch_needs_dependency() {
        let (m, mut p) = setup();
        use Buffer::*;
        p.need_scratch(0, 3);
        // rank 1 -> scratch of 0 -> (local) output of 0
        p.transfers[2] = t(1, Input, 0, 0, Scratch, 0, 3, Deps::new());
        p.push(t(0, Scratch, 0, 0, Output, 1, 3, smallvec![2]));
        verify(&p, &m).unwrap();
        p.transfers[4].deps.clear();
        let e = verify(&p, &m).unwrap_err().to_string();
        assert_eq!(
            e,
            "transfer 4 reads bytes 0..3 of scratch of rank 0 without depending on transfer 2, which writes them"
        );
    }

    #[test]
    fn rejects_drop_duplicate_misplace_cycle() {
        let (m, p) = setup();
        let mut q = p.clone();
        q.transfers.remove(1);
        assert_eq!(
            verify(&q, &m).unwrap_err(),
            VerifyError::Missing {
                rank: 1,
                src: 0,
                start: 0,
                end: 2
            }
        );
        let mut q = p.clone();
        q.transfers.push(q.transfers[3].clone());
        assert!(matches!(
            verify(&q, &m).unwrap_err(),
            VerifyError::DoubleWrite {
                first: 3,
                second: 4,
                ..
            }
        ));
        let mut q = p.clone();
        q.transfers[1].src_off = 0;
        q.transfers[1].bytes = 1;
        q.transfers[0].dst_off = 0;
        let e = verify(&q, &m).unwrap_err().to_string();
        assert!(
            e.contains("never written") || e.contains("puts input bytes"),
            "{e}"
        );
        let mut q = p.clone();
        q.transfers[0].deps = smallvec![1];
        q.transfers[1].deps = smallvec![0];
        assert_eq!(
            verify(&q, &m).unwrap_err(),
            VerifyError::Cycle { cycle: vec![1, 0] }
        );
    }

    #[test]
    fn misaddressed_block_is_misplaced() {
        let (m, mut p) = setup();
        // rank 1's 3 bytes to rank 0 land at offset 1 of rank 0, as they must; move the
        // 4-byte self copy of rank 1 to read from the wrong place.
        p.transfers[3].src_off = 0;
        p.transfers[3].bytes = 3;
        p.transfers[3].dst_off = 3;
        let e = verify(&p, &m).unwrap_err();
        assert!(matches!(e, VerifyError::Missing { rank: 1, .. }), "{e}");
    }
}
