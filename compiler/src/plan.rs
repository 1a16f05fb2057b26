//! The Plan IR: the single currency between schedulers, the verifier, the
//! simulator, the MSCCL lowering and the runtime.
//!
//! A plan is a list of transfers, each copying a contiguous byte range from a
//! buffer of one rank to a buffer of another (or the same) rank over a named
//! path, grouped into steps, with explicit dependencies. It says nothing about
//! time: only the simulator turns bytes into time.

use serde::{Deserialize, Serialize};
use smallvec::SmallVec;

use crate::error::{check_no_bom, clip, json_error, read_file, InputError, Result};
use crate::topology::Topology;

/// A rank's buffers. `input` and `output` follow the all-to-all(v) layout
/// ([`crate::traffic::Layout`]); `scratch` holds relayed data.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Buffer {
    Input,
    Output,
    Scratch,
}

impl Buffer {
    pub fn name(self) -> &'static str {
        match self {
            Buffer::Input => "input",
            Buffer::Output => "output",
            Buffer::Scratch => "scratch",
        }
    }
}

/// How a transfer travels.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(tag = "kind", rename_all = "lowercase", try_from = "PathFields")]
pub enum Path {
    /// A copy inside one GPU's memory (`src == dst`).
    Local,
    /// Intra-node fabric (NVLink through NVSwitch, or a mesh link).
    Nvlink,
    /// Between nodes, leaving through NIC `nic` of the sender's node (its
    /// rail) and entering through the receiver's rail NIC.
    Rdma { nic: u32 },
}

/// A path as the JSON spells it. serde's internally tagged enums ignore
/// unknown fields beside a unit variant's tag (`{"kind":"local","x":1}`
/// was read as local), so a path is read as these fields and checked.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PathFields {
    kind: PathKind,
    nic: Option<u32>,
}

#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
enum PathKind {
    Local,
    Nvlink,
    Rdma,
}

impl TryFrom<PathFields> for Path {
    type Error = String;

    fn try_from(p: PathFields) -> std::result::Result<Path, String> {
        match (p.kind, p.nic) {
            (PathKind::Local, None) => Ok(Path::Local),
            (PathKind::Nvlink, None) => Ok(Path::Nvlink),
            (PathKind::Rdma, Some(nic)) => Ok(Path::Rdma { nic }),
            (PathKind::Rdma, None) => Err("missing field `nic` in an rdma path".into()),
            (_, Some(_)) => Err("`nic` belongs to an rdma path only".into()),
        }
    }
}

/// Dependencies of one transfer: indices of transfers that must finish first.
/// Most transfers have at most a few, so they live inline.
pub type Deps = SmallVec<[u32; 4]>;

/// One contiguous copy.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Transfer {
    pub src: u32,
    pub src_buf: Buffer,
    pub src_off: u64,
    pub dst: u32,
    pub dst_buf: Buffer,
    pub dst_off: u64,
    pub bytes: u64,
    pub path: Path,
    /// Logical step (stage) the scheduler put this transfer in; informational
    /// for the simulator, used by the MSCCL lowering to order threadblock steps.
    pub step: u32,
    #[serde(default, skip_serializing_if = "SmallVec::is_empty")]
    pub deps: Deps,
}

/// A schedule for one all-to-all(v).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    /// The algorithm that made it (`direct`, `fast`, …, or `msccl-xml`).
    pub algorithm: String,
    pub ranks: u32,
    pub gpus_per_node: u32,
    /// Scratch bytes each rank needs (`scratch[r]`); empty means none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scratch: Vec<u64>,
    pub transfers: Vec<Transfer>,
    /// Chunking facts when the plan came from or goes to MSCCL XML.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunking: Option<Chunking>,
    /// [`crate::traffic::TrafficMatrix::fingerprint`] of the matrix the plan was made
    /// for; `verify` and `run` against another matrix refuse the plan with
    /// that reason before any byte-level check. Absent in plans from
    /// elsewhere (then nothing is checked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traffic_fingerprint: Option<String>,
}

/// How a skewed plan was quantised into MSCCL chunks (DESIGN.md "MSCCL XML").
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Chunking {
    pub chunk_bytes: u64,
    /// `padded` or `packed`.
    pub layout: String,
}

impl Plan {
    pub fn new(algorithm: impl Into<String>, ranks: usize, gpus_per_node: usize) -> Self {
        Plan {
            algorithm: algorithm.into(),
            ranks: ranks as u32,
            gpus_per_node: gpus_per_node as u32,
            scratch: Vec::new(),
            transfers: Vec::new(),
            chunking: None,
            traffic_fingerprint: None,
        }
    }

    /// Empties the plan for reuse, keeping its allocations (per-batch planning).
    pub fn clear(&mut self) {
        self.transfers.clear();
        self.scratch.clear();
        self.chunking = None;
        self.traffic_fingerprint = None;
    }

    /// Adds a transfer and returns its index.
    pub fn push(&mut self, t: Transfer) -> u32 {
        self.transfers.push(t);
        (self.transfers.len() - 1) as u32
    }

    /// Scratch bytes of a rank (0 when the plan uses none).
    pub fn scratch_bytes(&self, rank: usize) -> u64 {
        self.scratch.get(rank).copied().unwrap_or(0)
    }

    /// Makes sure rank `rank` has at least `bytes` of scratch.
    pub fn need_scratch(&mut self, rank: usize, bytes: u64) {
        if self.scratch.len() < self.ranks as usize {
            self.scratch.resize(self.ranks as usize, 0);
        }
        let s = &mut self.scratch[rank];
        *s = (*s).max(bytes);
    }

    /// Number of steps (highest step + 1).
    pub fn steps(&self) -> usize {
        self.transfers
            .iter()
            .map(|t| t.step as usize + 1)
            .max()
            .unwrap_or(0)
    }

    /// Bytes moved between different ranks. The sum saturates: a plan read
    /// from a file may copy one range any number of times.
    pub fn bytes_moved(&self) -> u64 {
        self.transfers
            .iter()
            .filter(|t| t.src != t.dst)
            .fold(0u64, |sum, t| sum.saturating_add(t.bytes))
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("plan serialises")
    }

    /// Parses the IR's JSON form and checks that it is a plan at all
    /// ([`Plan::check_structure`]); whether it is a correct all-to-all is
    /// the verifier's question.
    pub fn from_json_str(text: &str, file: &str) -> Result<Plan> {
        check_no_bom(text, file)?;
        let plan: Plan = serde_json::from_str(text).map_err(|e| json_error(file, &e))?;
        plan.check_structure(file)?;
        Ok(plan)
    }

    /// What makes a file a plan, whatever the traffic: at least one rank,
    /// nodes that split the ranks, one scratch size per rank (or none),
    /// transfers between ranks that exist with byte ranges that do not
    /// overflow, dependencies on other transfers that exist, and chunking
    /// facts that mean something. The error names the JSON place.
    pub fn check_structure(&self, file: &str) -> Result<(), InputError> {
        let bad = |place: String, reason: String| InputError::at(file, place, reason);
        let n = self.ranks;
        if n == 0 {
            return Err(bad("ranks".into(), "must be at least 1".into()));
        }
        let g = self.gpus_per_node;
        if g == 0 || n % g != 0 {
            return Err(bad(
                "gpus_per_node".into(),
                format!("{g} does not split {n} ranks into whole nodes"),
            ));
        }
        if !self.scratch.is_empty() && self.scratch.len() != n as usize {
            return Err(bad(
                "scratch".into(),
                format!(
                    "has {} sizes for {n} ranks (give one per rank, or none)",
                    self.scratch.len()
                ),
            ));
        }
        let len = self.transfers.len();
        for (i, t) in self.transfers.iter().enumerate() {
            let at = |field: &str| format!("transfers[{i}].{field}");
            for (field, r) in [("src", t.src), ("dst", t.dst)] {
                if r >= n {
                    return Err(bad(
                        at(field),
                        format!("rank {r} does not exist (the plan has {n} ranks)"),
                    ));
                }
            }
            for (field, off) in [("src_off", t.src_off), ("dst_off", t.dst_off)] {
                if off.checked_add(t.bytes).is_none() {
                    return Err(bad(
                        at(field),
                        format!(
                            "offset {off} plus {} bytes passes the largest byte address (2^64 - 1)",
                            t.bytes
                        ),
                    ));
                }
            }
            if let Some(&d) = t
                .deps
                .iter()
                .find(|&&d| d as usize >= len || d as usize == i)
            {
                let why = if d as usize == i {
                    "itself".to_string()
                } else {
                    format!("a transfer that does not exist (the plan has {len})")
                };
                return Err(bad(at("deps"), format!("depends on transfer {d}, {why}")));
            }
        }
        if let Some(f) = &self.traffic_fingerprint {
            if !crate::traffic::TrafficMatrix::is_fingerprint(f) {
                return Err(bad(
                    "traffic_fingerprint".into(),
                    format!("`{}` is not 16 lowercase hex digits", clip(f)),
                ));
            }
        }
        if let Some(c) = &self.chunking {
            if c.chunk_bytes == 0 {
                return Err(bad(
                    "chunking.chunk_bytes".into(),
                    "must be at least 1".into(),
                ));
            }
            if c.layout != "padded" && c.layout != "packed" {
                return Err(bad(
                    "chunking.layout".into(),
                    format!("`{}` is not a layout (padded, packed)", clip(&c.layout)),
                ));
            }
        }
        Ok(())
    }

    /// Refuses `traffic` when the plan records the fingerprint of another
    /// matrix: a plan moves the amounts of the matrix it was made for, so
    /// against another one every byte-level message would only be a symptom.
    pub fn check_made_for(
        &self,
        traffic: &crate::traffic::TrafficMatrix,
        file: &str,
    ) -> Result<()> {
        match &self.traffic_fingerprint {
            Some(f) if *f != traffic.fingerprint() => Err(InputError::new(
                file,
                format!(
                    "this plan was made for another traffic matrix (fingerprint {f}; the traffic given has {})",
                    traffic.fingerprint()
                ),
            )
            .into()),
            _ => Ok(()),
        }
    }

    /// Reads a plan in the IR's JSON form.
    pub fn load_json(path: &std::path::Path) -> Result<Plan> {
        let text = read_file(path)?;
        Self::from_json_str(&text, &path.display().to_string())
    }
}

/// The dependency graph of a plan: successor lists in compressed form and a
/// topological order. The verifier and both runtime backends share it.
#[derive(Clone, Debug)]
pub struct DepGraph {
    /// Successors of `i` are `succ[start[i]..start[i + 1]]`.
    start: Vec<u32>,
    succ: Vec<u32>,
    indegree: Vec<u32>,
}

impl DepGraph {
    /// Builds the graph; on a dependency that names no transfer or the
    /// transfer itself, returns `(transfer, dependency)`.
    pub fn new(plan: &Plan) -> std::result::Result<DepGraph, (usize, u32)> {
        let n = plan.transfers.len();
        let mut start = vec![0u32; n + 1];
        let mut indegree = vec![0u32; n];
        for (i, t) in plan.transfers.iter().enumerate() {
            for &d in &t.deps {
                if d as usize >= n || d as usize == i {
                    return Err((i, d));
                }
                start[d as usize + 1] += 1;
            }
            indegree[i] = t.deps.len() as u32;
        }
        for i in 0..n {
            start[i + 1] += start[i];
        }
        let mut fill = start.clone();
        let mut succ = vec![0u32; start[n] as usize];
        for (i, t) in plan.transfers.iter().enumerate() {
            for &d in &t.deps {
                succ[fill[d as usize] as usize] = i as u32;
                fill[d as usize] += 1;
            }
        }
        Ok(DepGraph {
            start,
            succ,
            indegree,
        })
    }

    pub fn len(&self) -> usize {
        self.indegree.len()
    }

    pub fn is_empty(&self) -> bool {
        self.indegree.is_empty()
    }

    /// Number of dependencies of each transfer.
    pub fn indegree(&self) -> &[u32] {
        &self.indegree
    }

    pub fn successors(&self, i: usize) -> &[u32] {
        &self.succ[self.start[i] as usize..self.start[i + 1] as usize]
    }

    /// Kahn's algorithm, lowest index first among the transfers ready at each
    /// round. On a cycle, returns the in-degrees left: the transfers with a
    /// non-zero one could never start.
    pub fn topo_order(&self) -> std::result::Result<Vec<u32>, Vec<u32>> {
        let mut indeg = self.indegree.clone();
        let mut order: Vec<u32> = (0..self.len() as u32)
            .filter(|&i| indeg[i as usize] == 0)
            .collect();
        let mut head = 0;
        while head < order.len() {
            let v = order[head] as usize;
            head += 1;
            for &w in self.successors(v) {
                indeg[w as usize] -= 1;
                if indeg[w as usize] == 0 {
                    order.push(w);
                }
            }
        }
        if order.len() < self.len() {
            return Err(indeg);
        }
        Ok(order)
    }

    /// Level of every transfer of `plan` (the plan this graph was built
    /// from): 0 without dependencies, else one more than its deepest
    /// dependency. Transfers of one level never depend on each other, so an
    /// executor may run a level all at once after the levels before it. On a
    /// cycle, returns what [`DepGraph::topo_order`] returns.
    pub fn levels(&self, plan: &Plan) -> std::result::Result<Vec<u32>, Vec<u32>> {
        let order = self.topo_order()?;
        let mut level = vec![0u32; self.len()];
        for &i in &order {
            level[i as usize] = plan.transfers[i as usize]
                .deps
                .iter()
                .map(|&d| level[d as usize] + 1)
                .max()
                .unwrap_or(0);
        }
        Ok(level)
    }
}

/// The path a direct transfer from `src` to `dst` takes: local, NVLink inside
/// a node, or RDMA through the sender's rail NIC.
pub fn path_between(topo: &Topology, src: usize, dst: usize) -> Path {
    if src == dst {
        Path::Local
    } else if topo.node_of(src) == topo.node_of(dst) {
        Path::Nvlink
    } else {
        Path::Rdma {
            nic: topo.rail_of(src) as u32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn structure_checked_when_read() {
        let mut p = Plan::new("direct", 2, 1);
        p.push(Transfer {
            src: 0,
            src_buf: Buffer::Input,
            src_off: 0,
            dst: 1,
            dst_buf: Buffer::Output,
            dst_off: 0,
            bytes: 4,
            path: Path::Rdma { nic: 0 },
            step: 0,
            deps: Deps::new(),
        });
        let base: serde_json::Value = serde_json::from_str(&p.to_json()).unwrap();
        let e = |edit: &dyn Fn(&mut serde_json::Value)| {
            let mut v = base.clone();
            edit(&mut v);
            Plan::from_json_str(&v.to_string(), "p.json")
                .unwrap_err()
                .to_string()
        };
        assert!(Plan::from_json_str(&base.to_string(), "p.json").is_ok());
        assert_eq!(
            e(&|v| v["transfers"][0]["dst"] = 7.into()),
            "p.json: transfers[0].dst: rank 7 does not exist (the plan has 2 ranks)"
        );
        assert_eq!(
            e(&|v| {
                v["transfers"][0]["src_off"] = u64::MAX.into();
            }),
            "p.json: transfers[0].src_off: offset 18446744073709551615 plus 4 bytes passes the largest byte address (2^64 - 1)"
        );
        assert_eq!(
            e(&|v| v["transfers"][0]["deps"] = serde_json::json!([0])),
            "p.json: transfers[0].deps: depends on transfer 0, itself"
        );
        assert!(e(&|v| v["transfers"][0]["deps"] = serde_json::json!([5]))
            .contains("depends on transfer 5, a transfer that does not exist (the plan has 1)"));
        assert_eq!(
            e(&|v| v["ranks"] = 0.into()),
            "p.json: ranks: must be at least 1"
        );
        assert!(e(&|v| v["gpus_per_node"] = 0.into())
            .starts_with("p.json: gpus_per_node: 0 does not split"));
        assert!(e(&|v| v["gpus_per_node"] = 3.into()).contains("3 does not split 2 ranks"));
        assert!(e(&|v| v["scratch"] = serde_json::json!([1, 2, 3]))
            .contains("scratch: has 3 sizes for 2 ranks"));
        assert!(
            e(&|v| v["chunking"] = serde_json::json!({"chunk_bytes": 0, "layout": "padded"}))
                .contains("chunking.chunk_bytes: must be at least 1")
        );
        assert!(
            e(&|v| v["chunking"] = serde_json::json!({"chunk_bytes": 8, "layout": "wavy"}))
                .contains("chunking.layout: `wavy` is not a layout")
        );
        // A misspelt field was silently dropped.
        assert!(e(&|v| v["transfers"][0]["byte"] = 4.into()).contains("unknown field `byte`"));
        assert!(e(&|v| v["scratchpad"] = 4.into()).contains("unknown field `scratchpad`"));
        // Inside a path too: a unit variant's tag hid them from serde.
        for path in [
            serde_json::json!({"kind": "local", "__proto__": 1}),
            serde_json::json!({"kind": "rdma", "nic": 0, "rail": 1}),
        ] {
            let got = e(&|v| v["transfers"][0]["path"] = path.clone());
            assert!(got.contains("unknown field"), "{got}");
        }
        assert!(
            e(&|v| v["transfers"][0]["path"] = serde_json::json!({"kind": "nvlink", "nic": 1}))
                .contains("`nic` belongs to an rdma path only")
        );
        assert!(
            e(&|v| v["transfers"][0]["path"] = serde_json::json!({"kind": "rdma"}))
                .contains("missing field `nic`")
        );
        assert!(
            e(&|v| v["transfers"][0]["path"] = serde_json::json!({"kind": "pcie"}))
                .contains("unknown variant `pcie`")
        );
    }

    #[test]
    fn bytes_moved_saturates() {
        let mut p = Plan::new("x", 2, 1);
        for _ in 0..3 {
            p.push(Transfer {
                src: 0,
                src_buf: Buffer::Scratch,
                src_off: 0,
                dst: 1,
                dst_buf: Buffer::Scratch,
                dst_off: 0,
                bytes: u64::MAX / 2,
                path: Path::Rdma { nic: 0 },
                step: 0,
                deps: Deps::new(),
            });
        }
        assert_eq!(p.bytes_moved(), u64::MAX);
    }

    #[test]
    fn json_round_trip() {
        let mut p = Plan::new("direct", 2, 1);
        p.push(Transfer {
            src: 0,
            src_buf: Buffer::Input,
            src_off: 0,
            dst: 1,
            dst_buf: Buffer::Output,
            dst_off: 4,
            bytes: 4,
            path: Path::Rdma { nic: 0 },
            step: 0,
            deps: Deps::new(),
        });
        let text = p.to_json();
        assert!(text.contains(r#""path":{"kind":"rdma","nic":0}"#), "{text}");
        assert_eq!(Plan::from_json_str(&text, "p").unwrap(), p);
    }
}
