//! MSCCL XML: lowering plans to files an MSCCL executor loads, reading such
//! files back into the Plan IR, and a symbolic model of the executor.
//!
//! Owns: the XML element tree ([`Algo`] > [`Gpu`] > [`Tb`] > [`Step`]), the
//! executor's limits, chunk quantisation of skewed plans (spec §11), the
//! writer, the reader and the symbolic executor. Knows nothing of how a plan
//! was scheduled or what it costs. The format and every limit used here are
//! described in docs/msccl.md and in the shared MSCCL XML spec.
//!
//! - [`fit`]: whether a plan (or, before planning, an algorithm on a
//!   cluster) fits an executor's threadblocks, from the peers of each gpu.
//! - [`lower`]: Plan → [`Algo`] (threadblocks, channels, steps, dependencies).
//! - [`write`](mod@write): [`Algo`] → text, in the executor's lexical rules.
//! - [`read`]: text → [`Algo`] → [`crate::Plan`].
//! - [`exec`]: lexical rules, loader rules and a symbolic run of the text.
//! - [`laps`]: phase timings under `SWITCHYARD_TIMINGS` (a debug aid).
//! - `pack`: a send and a receive list per threadblock where a gpu has
//!   more threadblocks than its executor loads.
//! - [`xsim`]: the executor's run rules (calls, FIFO window, staged sends)
//!   as a plan the simulator prices.

pub mod chunk;
pub mod depth;
pub mod exec;
pub mod fit;
mod gather;
mod handoff;
pub mod laps;
pub mod lower;
mod ops;
mod pack;
pub mod parse;
pub mod read;
pub mod schedules;
mod spread;
mod trace;
pub mod write;
pub mod xsim;

use std::fmt;
use std::str::FromStr;

use crate::error::Error;
pub use exec::ExecReport;
pub use lower::{to_xml, to_xml_windows, ExecutorPrice, Pacing, XmlOptions, XmlPlan};
pub use parse::parse_algo;
pub use read::{assign_paths, parse_xml, parse_xml_implied, xml_traffic};
pub use read::{check_executable, check_executable_with};

/// An [`Error::Unsupported`] of the XML lowering.
pub(crate) fn unsupported(reason: String) -> Error {
    Error::Unsupported {
        algorithm: "msccl-xml".into(),
        reason,
    }
}

/// Steps per threadblock the executor accepts (`MSCCL_MAX_NUM_STEPS`).
pub const MAX_STEPS_PER_TB: usize = 64;
/// Largest `cnt` of one step (`MSCCL_MAX_COUNT` is 72, exclusive).
pub const MAX_CNT: u32 = 71;
/// `depid` is stored as int8: threadblock ids beyond 127 cannot be waited on.
pub const MAX_TBS_PER_GPU: usize = 128;
/// Lanes per GPU a plan bound for XML may run at once
/// (`sched::Options::max_lanes_per_gpu`): the lowering gives lanes at most
/// 108 threadblocks per GPU, all resident at once (an A100's SMs), and one
/// of those goes to a GPU's local copy; this leaves one more to spare.
pub const PLAN_LANES_PER_GPU: u32 = 106;
/// Channels (`MAXCHANNELS`).
pub const MAX_CHANNELS: u32 = 32;
/// Threadblocks with a send (or a receive) peer per channel.
pub const MAX_PEER_TBS_PER_CHANNEL: usize = 32;
/// Elements one parse may hold (`MAX_NODES`).
pub const MAX_NODES: usize = 4096;
/// Chunk offsets are stored as int16.
pub const MAX_OFFSET: i64 = i16::MAX as i64;
/// Largest chunk a file may declare or a plan be lowered with: 2^38 bytes
/// (256 GB). A buffer holds at most `MAX_OFFSET + 1` = 2^15 chunks, so every
/// byte offset in one stays under 2^53, the most a traffic matrix carries
/// ([`crate::traffic::MAX_TOTAL_BYTES`]), and byte arithmetic cannot overflow.
pub const MAX_CHUNK_BYTES: u64 = 1 << 38;
/// Attributes the executor keeps per element.
pub const MAX_ATTRS: usize = 16;

/// Channels the loosest executor accepts (RCCL's `MAXCHANNELS`, 128); the
/// symbolic loader holds every file to this, and a profile
/// ([`Executor::max_channels`]) to its own.
pub const MAX_CHANNELS_ANY: u32 = 128;

/// Which executor a file is written for: its limits differ (from the
/// executors' sources, docs/msccl.md "Executor profiles").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Executor {
    /// `Azure/msccl-executor-nccl`: `MAXCHANNELS` 32 (`device.h`),
    /// `MSCCL_MAX_NUM_THREAD_BLOCKS` 32 x 32 but `depid` an int8, so 128
    /// threadblocks can be waited on; all must be resident (108 SMs on an A100).
    #[default]
    Msccl,
    /// RCCL's copy (`ROCm/rccl` `src/include/msccl/msccl_struct.h`):
    /// `MSCCL_MAX_NUM_THREAD_BLOCKS` 64 ("too many thread blocks are
    /// requested. Max thread blocks: 64" in `msccl_parser.cc`), `MAXCHANNELS` 128.
    Rccl,
}

impl Executor {
    pub const ALL: [Executor; 2] = [Executor::Msccl, Executor::Rccl];

    pub fn name(self) -> &'static str {
        match self {
            Executor::Msccl => "msccl",
            Executor::Rccl => "rccl",
        }
    }

    /// Threadblocks per gpu the loader accepts.
    pub fn max_tbs_per_gpu(self) -> usize {
        match self {
            Executor::Msccl => MAX_TBS_PER_GPU,
            Executor::Rccl => 64,
        }
    }

    /// Threadblocks per gpu the lowering gives out: they spin on each other,
    /// so all must be resident at once (108: an A100's SMs; an MI300X has
    /// 304 CUs, so RCCL's loader limit is the binding one).
    pub fn tb_budget(self) -> usize {
        match self {
            Executor::Msccl => 108,
            Executor::Rccl => 64,
        }
    }

    /// Channels a file may use.
    pub fn max_channels(self) -> u32 {
        match self {
            Executor::Msccl => MAX_CHANNELS,
            Executor::Rccl => MAX_CHANNELS_ANY,
        }
    }

    /// Lanes per gpu a plan bound for this executor may run at once
    /// (`sched::Options::max_lanes_per_gpu`): the budget less a local-copy
    /// tb and one to spare.
    pub fn plan_lanes_per_gpu(self) -> u32 {
        self.tb_budget() as u32 - 2
    }

    /// The executor a cluster's users load plans with: RCCL on AMD GPUs
    /// (a topology named after an MI300X, as the `mi300x` preset is),
    /// NCCL-MSCCL otherwise.
    pub fn default_for(topo: &crate::Topology) -> Executor {
        let name = topo.name().to_ascii_lowercase();
        if name.contains("mi300") || name.contains("mi250") || name.contains("amd") {
            Executor::Rccl
        } else {
            Executor::Msccl
        }
    }

    /// Whether a checked file loads in this executor; the reason if not.
    pub fn check(self, r: &ExecReport) -> std::result::Result<(), String> {
        if r.max_tbs_per_gpu > self.max_tbs_per_gpu() {
            return Err(format!(
                "{} threadblocks on a gpu; {} loads at most {}",
                r.max_tbs_per_gpu,
                self.name(),
                self.max_tbs_per_gpu()
            ));
        }
        if r.nchannels > self.max_channels() as usize {
            return Err(format!(
                "{} channels; {} has at most {}",
                r.nchannels,
                self.name(),
                self.max_channels()
            ));
        }
        Ok(())
    }
}

impl fmt::Display for Executor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Executor {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "msccl" => Ok(Executor::Msccl),
            "rccl" => Ok(Executor::Rccl),
            _ => Err(format!(
                "unknown executor `{}` (known: msccl, rccl)",
                crate::error::clip(s)
            )),
        }
    }
}

/// The executor's protocol (`proto`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Protocol {
    Simple,
    LL,
    LL128,
}

impl Protocol {
    pub const ALL: [Protocol; 3] = [Protocol::LL, Protocol::LL128, Protocol::Simple];

    pub fn name(self) -> &'static str {
        match self {
            Protocol::Simple => "Simple",
            Protocol::LL => "LL",
            Protocol::LL128 => "LL128",
        }
    }

    /// Undelivered operations one connection holds before the sender blocks
    /// (spec §5: a Simple operation takes 4 of NCCL's 8 slots, LL/LL128 one).
    pub fn fifo_depth(self) -> usize {
        match self {
            Protocol::Simple => 2,
            Protocol::LL | Protocol::LL128 => 8,
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Protocol {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "Simple" => Ok(Protocol::Simple),
            "LL" => Ok(Protocol::LL),
            "LL128" => Ok(Protocol::LL128),
            _ => Err(format!(
                "unknown protocol `{}` (the executor knows Simple, LL, LL128, spelled exactly)",
                crate::error::clip(s)
            )),
        }
    }
}

/// Where a skewed plan puts each peer's chunks (spec §11).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Layout {
    /// Every peer block sized to the largest pair, valid chunks first: the
    /// `ncclAllToAll` layout, a drop-in.
    #[default]
    Padded,
    /// Blocks back to back in rank order: smaller buffers, the application
    /// packs and unpacks.
    Packed,
}

impl Layout {
    pub fn name(self) -> &'static str {
        match self {
            Layout::Padded => "padded",
            Layout::Packed => "packed",
        }
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Layout {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "padded" => Ok(Layout::Padded),
            "packed" => Ok(Layout::Packed),
            _ => Err(format!("unknown layout `{s}` (known: padded, packed)")),
        }
    }
}

/// A buffer as the XML names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BufRef {
    Input,
    Output,
    Scratch,
}

impl BufRef {
    pub fn letter(self) -> &'static str {
        match self {
            BufRef::Input => "i",
            BufRef::Output => "o",
            BufRef::Scratch => "s",
        }
    }
    pub fn parse(s: &str) -> Option<BufRef> {
        match s {
            "i" => Some(BufRef::Input),
            "o" => Some(BufRef::Output),
            "s" => Some(BufRef::Scratch),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            BufRef::Input => "input",
            BufRef::Output => "output",
            BufRef::Scratch => "scratch",
        }
    }
}

/// A step's `type` (spec §4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StepKind {
    Send,
    Recv,
    RecvCopySend,
    RecvReduceSend,
    RecvReduceCopy,
    RecvReduceCopySend,
    Copy,
    Reduce,
    Nop,
}

impl StepKind {
    pub fn code(self) -> &'static str {
        match self {
            StepKind::Send => "s",
            StepKind::Recv => "r",
            StepKind::RecvCopySend => "rcs",
            StepKind::RecvReduceSend => "rrs",
            StepKind::RecvReduceCopy => "rrc",
            StepKind::RecvReduceCopySend => "rrcs",
            StepKind::Copy => "cpy",
            StepKind::Reduce => "re",
            StepKind::Nop => "nop",
        }
    }
    pub fn parse(s: &str) -> Option<StepKind> {
        Some(match s {
            "s" => StepKind::Send,
            "r" => StepKind::Recv,
            "rcs" => StepKind::RecvCopySend,
            "rrs" => StepKind::RecvReduceSend,
            "rrc" => StepKind::RecvReduceCopy,
            "rrcs" => StepKind::RecvReduceCopySend,
            "cpy" => StepKind::Copy,
            "re" => StepKind::Reduce,
            "nop" => StepKind::Nop,
            _ => return None,
        })
    }
    /// Has a send part (uses the tb's `send` peer).
    pub fn sends(self) -> bool {
        matches!(
            self,
            StepKind::Send
                | StepKind::RecvCopySend
                | StepKind::RecvReduceSend
                | StepKind::RecvReduceCopySend
        )
    }
    /// Has a receive part (uses the tb's `recv` peer).
    pub fn recvs(self) -> bool {
        matches!(
            self,
            StepKind::Recv
                | StepKind::RecvCopySend
                | StepKind::RecvReduceSend
                | StepKind::RecvReduceCopy
                | StepKind::RecvReduceCopySend
        )
    }
    pub fn reduces(self) -> bool {
        matches!(
            self,
            StepKind::RecvReduceSend
                | StepKind::RecvReduceCopy
                | StepKind::RecvReduceCopySend
                | StepKind::Reduce
        )
    }
    /// Reads `src` (bound-checked by the executor).
    pub fn reads_src(self) -> bool {
        matches!(
            self,
            StepKind::Send
                | StepKind::Copy
                | StepKind::Reduce
                | StepKind::RecvReduceSend
                | StepKind::RecvReduceCopySend
        )
    }
    /// Writes `dst`.
    pub fn writes_dst(self) -> bool {
        matches!(
            self,
            StepKind::Recv
                | StepKind::RecvCopySend
                | StepKind::RecvReduceCopy
                | StepKind::RecvReduceCopySend
                | StepKind::Copy
                | StepKind::Reduce
        )
    }
}

/// One `<step>`. Numbers are kept as read (signed, wide) so the loader
/// rules can name a bad value rather than lose it in a conversion.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    pub s: i64,
    pub kind: StepKind,
    pub srcbuf: BufRef,
    pub srcoff: i64,
    pub dstbuf: BufRef,
    pub dstoff: i64,
    pub cnt: i64,
    pub depid: i64,
    pub deps: i64,
    pub hasdep: bool,
    /// Line in the file (1-based), 0 when built in memory.
    pub line: usize,
}

/// One `<tb>`: a sequential program with one send and one receive peer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tb {
    pub id: i64,
    pub send: i64,
    pub recv: i64,
    pub chan: i64,
    pub steps: Vec<Step>,
    pub line: usize,
}

/// One `<gpu>`: a rank's threadblocks and buffer sizes in chunks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gpu {
    pub id: i64,
    pub i_chunks: i64,
    pub o_chunks: i64,
    pub s_chunks: i64,
    pub tbs: Vec<Tb>,
    pub line: usize,
}

/// The whole file: one `<algo>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Algo {
    pub name: String,
    pub proto: Protocol,
    pub nchannels: i64,
    pub nchunksperloop: i64,
    pub ngpus: i64,
    pub coll: String,
    pub inplace: bool,
    pub outofplace: bool,
    pub min_bytes: i64,
    pub max_bytes: i64,
    pub gpus: Vec<Gpu>,
    /// `chunks[s][d]`: whole chunks rank `s` sends to `d`, when the file says
    /// (Switchyard writes it in comments for skewed plans, §11); `None` for a
    /// uniform all-to-all of `nchunksperloop / ngpus` chunks per pair.
    pub chunks: Option<Vec<Vec<u32>>>,
    pub line: usize,
}

impl Algo {
    /// The facts of the name. [`parse_algo`] rejects a file whose name's
    /// facts are malformed; a name that fails [`NameFacts::parse`] has none.
    pub fn facts(&self) -> NameFacts {
        NameFacts::parse(&self.name).unwrap_or_default()
    }
}

/// Facts Switchyard writes into an XML's `name`: `switchyard ALG layout=L
/// chunk_bytes=U gpus_per_node=G [matrix=F]`, `F` the
/// [`crate::TrafficMatrix::fingerprint`] of the matrix a skewed file was
/// made for. Other tools' names yield `None`s.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NameFacts {
    pub algorithm: Option<String>,
    pub layout: Option<Layout>,
    pub chunk_bytes: Option<u64>,
    pub gpus_per_node: Option<u32>,
    pub matrix: Option<String>,
}

impl NameFacts {
    /// The facts of a name. A name that does not start with the word
    /// `switchyard` (another tool's) has none. One that does is held to
    /// what Switchyard writes, as a JSON plan's `chunking` is: a malformed
    /// fact (`chunk_bytes=abc`, `-16`, `0`, `layout=weird`), an unknown or
    /// repeated one, or a second bare word is an error, not a fact silently
    /// dropped (which read the file as another layout or chunk size).
    pub fn parse(name: &str) -> Result<NameFacts, String> {
        let mut words = name.split(' ');
        let mut f = NameFacts::default();
        if words.next() != Some("switchyard") {
            return Ok(f);
        }
        let count = |key: &str, v: &str| -> Result<u64, String> {
            match v.parse::<u64>() {
                Ok(x) if x >= 1 && v.bytes().all(|b| b.is_ascii_digit()) => Ok(x),
                _ => Err(format!(
                    "{key}={} in the name is not a whole number from 1 to 2^64 - 1",
                    crate::error::clip(v)
                )),
            }
        };
        for w in words {
            let (key, v) = match w.split_once('=') {
                None if f.algorithm.is_none() => {
                    f.algorithm = Some(w.to_string());
                    continue;
                }
                None => {
                    return Err(format!(
                        "`{}` in the name: a Switchyard name is `switchyard ALGORITHM layout=L chunk_bytes=U gpus_per_node=G`",
                        crate::error::clip(w)
                    ))
                }
                Some(kv) => kv,
            };
            let fresh = match key {
                "layout" => f
                    .layout
                    .replace(v.parse().map_err(|e| format!("layout in the name: {e}"))?)
                    .is_none(),
                "chunk_bytes" => f.chunk_bytes.replace(count(key, v)?).is_none(),
                "matrix" if crate::TrafficMatrix::is_fingerprint(v) => {
                    f.matrix.replace(v.to_string()).is_none()
                }
                "matrix" => {
                    return Err(format!(
                        "matrix={} in the name is not a fingerprint (16 lowercase hex digits)",
                        crate::error::clip(v)
                    ))
                }
                "gpus_per_node" => {
                    let g = u32::try_from(count(key, v)?).map_err(|_| {
                        format!("gpus_per_node={v} in the name: more GPUs than any cluster has")
                    })?;
                    f.gpus_per_node.replace(g).is_none()
                }
                _ => {
                    return Err(format!(
                        "unknown fact `{}` in the name (known: layout, chunk_bytes, gpus_per_node, matrix)",
                        crate::error::clip(key)
                    ))
                }
            };
            if !fresh {
                return Err(format!("the name gives {key} twice"));
            }
        }
        Ok(f)
    }

    /// The name [`NameFacts::parse`] reads back. A plan's algorithm is any
    /// string (a JSON plan names its own): it is written as one word of
    /// letters, digits and `-_.+`, anything else becoming `-`.
    pub fn format(
        algorithm: &str,
        layout: Layout,
        chunk_bytes: u64,
        gpus_per_node: u32,
        matrix: Option<&str>,
    ) -> String {
        let word: String = algorithm
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || "-_.+".contains(c) {
                    c
                } else {
                    '-'
                }
            })
            .collect();
        let word = if word.is_empty() { "-".into() } else { word };
        let mut name = format!(
            "switchyard {word} layout={layout} chunk_bytes={chunk_bytes} gpus_per_node={gpus_per_node}"
        );
        if let Some(m) = matrix {
            name += &format!(" matrix={m}");
        }
        name
    }
}

/// Where a block's chunks sit in the input and output buffers, for both
/// layouts (spec §11). `None` chunk counts mean uniform.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkMap {
    pub n: usize,
    pub layout: Layout,
    /// `k[s * n + d]`: valid chunks from `s` to `d`.
    pub k: Vec<u32>,
    /// Input chunk of block (s, d) in rank `s`: `in_off[s * n + d]`.
    pub in_off: Vec<u32>,
    /// Output chunk of block (s, d) in rank `d`: `out_off[d * n + s]`.
    pub out_off: Vec<u32>,
    pub nchunksperloop: u32,
}

impl ChunkMap {
    /// `k[s][d]` chunks per pair in `layout`; `nchunksperloop` is the padded
    /// block times `n`, or for `packed` the largest row/column sum rounded up
    /// to a multiple of `n` (so both selection rules of spec §9 can hold).
    pub fn new(k: Vec<Vec<u32>>, layout: Layout) -> ChunkMap {
        let n = k.len();
        let flat: Vec<u32> = k.into_iter().flatten().collect();
        let mut in_off = vec![0u32; n * n];
        let mut out_off = vec![0u32; n * n];
        let b = flat.iter().copied().max().unwrap_or(0).max(1);
        let nchunks = match layout {
            Layout::Padded => {
                for s in 0..n {
                    for d in 0..n {
                        in_off[s * n + d] = d as u32 * b;
                        out_off[d * n + s] = s as u32 * b;
                    }
                }
                n as u32 * b
            }
            Layout::Packed => {
                let mut row = vec![0u32; n];
                let mut col = vec![0u32; n];
                for s in 0..n {
                    for d in 0..n {
                        let c = flat[s * n + d];
                        in_off[s * n + d] = row[s];
                        row[s] += c;
                        out_off[d * n + s] = col[d];
                        col[d] += c;
                    }
                }
                let m = row.iter().chain(&col).copied().max().unwrap_or(0).max(1);
                m.div_ceil(n.max(1) as u32) * n as u32
            }
        };
        ChunkMap {
            n,
            layout,
            k: flat,
            in_off,
            out_off,
            nchunksperloop: nchunks,
        }
    }

    /// The uniform all-to-all: `c` chunks per pair, the standard layout.
    pub fn uniform(n: usize, c: u32) -> ChunkMap {
        ChunkMap::new(vec![vec![c; n]; n], Layout::Padded)
    }

    pub fn chunks(&self, s: usize, d: usize) -> u32 {
        self.k[s * self.n + d]
    }
    pub fn input_chunk(&self, s: usize, d: usize, c: u32) -> u32 {
        self.in_off[s * self.n + d] + c
    }
    pub fn output_chunk(&self, s: usize, d: usize, c: u32) -> u32 {
        self.out_off[d * self.n + s] + c
    }
    /// Which block and chunk input chunk `idx` of rank `s` is, if valid data.
    pub fn input_origin(&self, s: usize, idx: u32) -> Option<(usize, u32)> {
        // A row's blocks lie in rank order, so offsets do not decrease: the
        // block holding `idx` is the last one starting at or before it
        // (empty blocks before it may start where it does; none after it).
        let row = self.in_off.get(s * self.n..(s + 1) * self.n)?;
        let d = row.partition_point(|&off| off <= idx).checked_sub(1)?;
        let off = row[d];
        (idx < off + self.chunks(s, d)).then(|| (d, idx - off))
    }
    pub fn rows(&self) -> Vec<Vec<u32>> {
        self.k.chunks(self.n.max(1)).map(<[u32]>::to_vec).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn name_facts_round_trip() {
        let n = NameFacts::format("direct", Layout::Packed, 4096, 8, Some("00ff00ff00ff00ff"));
        let f = NameFacts::parse(&n).unwrap();
        assert_eq!(f.matrix.as_deref(), Some("00ff00ff00ff00ff"));
        assert_eq!(f.algorithm.as_deref(), Some("direct"));
        assert_eq!(f.layout, Some(Layout::Packed));
        assert_eq!(f.chunk_bytes, Some(4096));
        assert_eq!(f.gpus_per_node, Some(8));
        assert_eq!(
            NameFacts::parse("alltoall_allpairs"),
            Ok(NameFacts::default())
        );
        // Other tools' names carry no facts, whatever they hold.
        let other = NameFacts::parse("hierarchical chunk_bytes=abc layout=weird");
        assert_eq!(other, Ok(NameFacts::default()));
        let bad =
            |facts: &str| NameFacts::parse(&format!("switchyard direct {facts}")).unwrap_err();
        for v in ["abc", "-16", "0", "+16", "0x10", "18446744073709551616", ""] {
            assert!(
                bad(&format!("chunk_bytes={v}")).contains("not a whole number"),
                "{v}"
            );
        }
        assert!(bad("layout=weird").contains("unknown layout `weird`"));
        for v in [
            "",
            "00FF00FF00FF00FF",
            "00ff",
            "00ff00ff00ff00ff0",
            "zzzzzzzzzzzzzzzz",
        ] {
            assert!(
                bad(&format!("matrix={v}")).contains("not a fingerprint"),
                "{v}"
            );
        }
        assert!(bad("gpus_per_node=0").contains("not a whole number"));
        assert!(bad("gpus_per_node=4294967296").contains("more GPUs"));
        assert!(bad("color=red").contains("unknown fact `color`"));
        assert!(bad("layout=padded layout=packed").contains("layout twice"));
        assert!(bad("extra").contains("a Switchyard name is"));
        // Whatever a plan calls its algorithm, the name reads back.
        let n = NameFacts::format("my alg=2 \"&<", Layout::Padded, 16, 1, None);
        assert_eq!(
            NameFacts::parse(&n).unwrap().algorithm.as_deref(),
            Some("my-alg-2----")
        );
        assert!(NameFacts::parse(&NameFacts::format("", Layout::Padded, 16, 1, None)).is_ok());
    }

    #[test]
    fn chunk_map_layouts() {
        let k = vec![vec![1, 3], vec![2, 0]];
        let p = ChunkMap::new(k.clone(), Layout::Padded);
        assert_eq!(p.nchunksperloop, 6);
        assert_eq!(p.input_chunk(0, 1, 2), 5);
        assert_eq!(p.output_chunk(1, 0, 1), 4);
        assert_eq!(p.input_origin(0, 4), Some((1, 1)));
        assert_eq!(p.input_origin(0, 1), None);
        assert_eq!(p.input_origin(1, 0), Some((0, 0)));
        assert_eq!(p.input_origin(1, 2), None);
        let q = ChunkMap::new(k, Layout::Packed);
        // Row sums 4, 2; column sums 3, 3: 4 rounded up to a multiple of 2.
        assert_eq!(q.nchunksperloop, 4);
        assert_eq!(q.input_chunk(0, 1, 0), 1);
        assert_eq!(q.output_chunk(1, 0, 0), 1);
        assert_eq!(q.output_chunk(0, 1, 2), 2);
        // Packed rows with empty blocks: the search finds the one holding it.
        let e = ChunkMap::new(
            vec![vec![0, 2, 0], vec![1, 0, 1], vec![0, 0, 0]],
            Layout::Packed,
        );
        assert_eq!(e.input_origin(0, 0), Some((1, 0)));
        assert_eq!(e.input_origin(0, 1), Some((1, 1)));
        assert_eq!(e.input_origin(0, 2), None);
        assert_eq!(e.input_origin(1, 1), Some((2, 0)));
        assert_eq!(e.input_origin(2, 0), None);
        assert_eq!(e.input_origin(3, 0), None);
        for s in 0..3 {
            for idx in 0..e.nchunksperloop {
                let linear = (0..3).find_map(|d| {
                    let off = e.input_chunk(s, d, 0);
                    (idx >= off && idx < off + e.chunks(s, d)).then(|| (d, idx - off))
                });
                assert_eq!(e.input_origin(s, idx), linear, "{s} {idx}");
            }
        }
    }
}
