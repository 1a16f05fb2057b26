//! `switchyard._native`: the compiler crate's types as Python classes.
//!
//! This layer only converts: Python values to the compiler's inputs, results
//! to Python values, and the compiler's typed errors to Python exceptions with
//! the same one-line message the CLI prints (bad input: `ValueError`; a plan
//! that fails the verifier: `VerificationError`; a file that cannot be read:
//! `OSError`; a solver failure: `RuntimeError`). Every algorithm is the
//! compiler's; the idiomatic surface (array conversion, the torch all-to-all)
//! is the pure-Python package around it (python/switchyard/).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use switchyard_compiler::import::ImportOptions;
use switchyard_compiler::job::JobInputs;
use switchyard_compiler::lp::{lower_bound, LpOptions};
use switchyard_compiler::msccl::depth::shallower_fast;
use switchyard_compiler::msccl::{
    fit, to_xml, Executor, Layout, Protocol, XmlOptions, MAX_CHUNK_BYTES,
};
use switchyard_compiler::planner::{Planner as FastPlanner, PlannerOptions, Settle};
use switchyard_compiler::program::{from_local, program, OpKind, RankProgram};
use switchyard_compiler::rank::{LaneSums, LocalTraffic, NodeSplits, StageInputs};
use switchyard_compiler::report::Report;
use switchyard_compiler::sched::{schedule, Options, Target};
use switchyard_compiler::sim::{Network, SimOptions};
use switchyard_compiler::{
    verify_on, Algorithm, Buffer, Error, InputError, Plan, Topology, TopologySpec, TrafficMatrix,
};

create_exception!(
    _native,
    VerificationError,
    PyException,
    "A plan that is not a correct all-to-all for its traffic matrix."
);

/// The compiler's error as the Python exception of its kind, same message.
fn py_err(e: Error) -> PyErr {
    match e {
        Error::Input(_) | Error::Unsupported { .. } | Error::NeedsWholeMatrix { .. } => {
            PyValueError::new_err(e.to_string())
        }
        Error::Verify(_) => VerificationError::new_err(e.to_string()),
        Error::Io { .. } => PyOSError::new_err(e.to_string()),
        _ => PyRuntimeError::new_err(e.to_string()),
    }
}

/// An argument's error: the CLI names its flags (`--network`), Python its
/// parameters (`network`).
fn arg_err(mut e: InputError, name: &str) -> PyErr {
    e.file = name.to_string();
    PyValueError::new_err(e.to_string())
}

fn bad_arg(name: &str, reason: impl Into<String>) -> PyErr {
    arg_err(InputError::new(name, reason), name)
}

/// A count from Python (which may be negative) as a `usize`.
fn count(v: i64, name: &str, least: i64) -> PyResult<usize> {
    if v < least {
        return Err(bad_arg(name, format!("must be at least {least}, got {v}")));
    }
    usize::try_from(v).map_err(|_| bad_arg(name, format!("{v} is too large")))
}

/// Parses JSON text that this module wrote into Python objects.
fn json_to_py<'py>(py: Python<'py>, text: &str) -> PyResult<Bound<'py, PyAny>> {
    py.import("json")?.call_method1("loads", (text,))
}

/// A cluster topology (DESIGN.md "Ranks and topology").
#[pyclass(name = "Topology", module = "switchyard._native", frozen)]
struct PyTopology {
    inner: Arc<Topology>,
    /// What an import from NCCL XML or `nvidia-smi topo -m` assumed (empty otherwise).
    assumed: Vec<String>,
}

#[pymethods]
impl PyTopology {
    /// A built-in cluster (`dgx-a100`, `dgx-h100`, `dgx-h200`, `dgx-b200`,
    /// `gb200-nvl72`, `mi300x`) of `nodes` nodes; `gpus_per_node` and
    /// `nics_per_node` override the machine's (NICs: one per GPU, at most the
    /// machine's count, when only `gpus_per_node` is given).
    #[staticmethod]
    #[pyo3(signature = (name, nodes, gpus_per_node=None, nics_per_node=None))]
    fn preset(
        name: &str,
        nodes: i64,
        gpus_per_node: Option<i64>,
        nics_per_node: Option<i64>,
    ) -> PyResult<Self> {
        let nodes = count(nodes, "nodes", 1)?;
        let gpus = gpus_per_node
            .map(|g| count(g, "gpus_per_node", 1))
            .transpose()?;
        let nics = nics_per_node
            .map(|k| count(k, "nics_per_node", 1))
            .transpose()?;
        let spec = TopologySpec::preset_shape(name, nodes, gpus, nics).map_err(py_err)?;
        let topo = Topology::from_spec(spec, &format!("<preset {name}>")).map_err(py_err)?;
        Ok(PyTopology {
            inner: Arc::new(topo),
            assumed: Vec::new(),
        })
    }

    /// A topology from a JSON file's path (`str` or `os.PathLike`), or from
    /// JSON text itself (a string that starts with `{`).
    #[staticmethod]
    fn from_json(path_or_text: &Bound<'_, PyAny>) -> PyResult<Self> {
        if let Ok(s) = path_or_text.extract::<String>() {
            if s.trim_start().starts_with('{') {
                return Self::from_json_text(&s, "<topology>");
            }
            return Self::load(PathBuf::from(s), None, None);
        }
        let path: PathBuf = path_or_text.extract().map_err(|_| {
            bad_arg(
                "path_or_text",
                "must be a path (str or os.PathLike) or topology JSON text",
            )
        })?;
        Self::load(path, None, None)
    }

    /// Parses topology JSON; `source` names it in errors.
    #[staticmethod]
    #[pyo3(signature = (text, source="<topology>"))]
    fn from_json_text(text: &str, source: &str) -> PyResult<Self> {
        let topo = Topology::from_json_str(text, source).map_err(py_err)?;
        Ok(PyTopology {
            inner: Arc::new(topo),
            assumed: Vec::new(),
        })
    }

    /// Reads a topology file: Switchyard's JSON, or one node's NCCL/RCCL
    /// topology XML or `nvidia-smi topo -m` text, which then makes `nodes`
    /// nodes (default: `world_size` / the node's GPUs, else 1).
    #[staticmethod]
    #[pyo3(signature = (path, nodes=None, world_size=None))]
    fn load(path: PathBuf, nodes: Option<i64>, world_size: Option<i64>) -> PyResult<Self> {
        let nodes = nodes.map(|n| count(n, "nodes", 1)).transpose()?;
        let ranks = world_size.map(|n| count(n, "world_size", 1)).transpose()?;
        let (topo, assumed) =
            Topology::load_sized(&path, nodes, ranks, &ImportOptions::default()).map_err(py_err)?;
        Ok(PyTopology {
            inner: Arc::new(topo),
            assumed,
        })
    }

    /// `nodes` nodes as one node's NCCL (or RCCL) topology XML describes
    /// (the file `NCCL_TOPO_DUMP_FILE` writes, or an `NCCL_TOPO_FILE`); what
    /// the file lacks is assumed and listed in `assumptions`.
    #[staticmethod]
    fn from_nccl(path: PathBuf, nodes: i64) -> PyResult<Self> {
        let nodes = count(nodes, "nodes", 1)?;
        let (topo, assumed) = Topology::from_nccl(&path, nodes).map_err(py_err)?;
        Ok(PyTopology {
            inner: Arc::new(topo),
            assumed,
        })
    }

    /// The defaults an import used, in words (empty for a JSON topology or a preset).
    #[getter]
    fn assumptions(&self) -> Vec<String> {
        self.assumed.clone()
    }

    #[getter]
    fn name(&self) -> &str {
        self.inner.name()
    }
    #[getter]
    fn ranks(&self) -> usize {
        self.inner.ranks()
    }
    #[getter]
    fn nodes(&self) -> usize {
        self.inner.nodes()
    }
    #[getter]
    fn gpus_per_node(&self) -> usize {
        self.inner.gpus_per_node()
    }
    #[getter]
    fn nics_per_node(&self) -> usize {
        self.inner.nics_per_node()
    }

    /// The topology file (the same JSON `switchyard topology` prints).
    fn to_json(&self) -> String {
        self.inner.spec().to_json()
    }

    fn __repr__(&self) -> String {
        format!(
            "Topology({:?}, nodes={}, gpus_per_node={})",
            self.inner.name(),
            self.inner.nodes(),
            self.inner.gpus_per_node()
        )
    }
}

/// How a Planner makes plans: `fast` and `spray` keep the reusable planner
/// (its buffers live between calls), the others call their scheduler.
enum Engine {
    Reusable(Box<FastPlanner>),
    OneShot(Options),
}

/// Makes plans for one topology and one algorithm, one traffic matrix at a time.
#[pyclass(name = "Planner", module = "switchyard._native", subclass)]
struct PyPlanner {
    topo: Arc<Topology>,
    algorithm: Algorithm,
    engine: Engine,
    /// The network its plans are for where `to_msccl_xml` may also price
    /// `fast`'s plan one send shallower, as `compile` does
    /// (`msccl::depth::shallower_fast`): `target="msccl"` with `auto`, or
    /// with `fast` at its default options (a caller's own options are
    /// kept as given).
    shallower: Option<Network>,
    /// The per-rank planner of a one-shot algorithm (`direct`,
    /// `hierarchical`, `pxn`, `deepep`), made on the first own program.
    local: Option<Box<FastPlanner>>,
}

/// The fields of [`LocalTraffic`] after `rank`, `nodes` and
/// `gpus_per_node`, in order: their names in errors.
const LOCAL_FIELDS: [&str; 10] = [
    "node_bytes",
    "rows",
    "cols",
    "above",
    "before",
    "rail_before",
    "inter_out",
    "inter_in",
    "rank_rail_before",
    "rail_into_before",
];

/// The fields of [`NodeSplits`] (staged `fast` and `spray` only), which
/// may follow [`LOCAL_FIELDS`]: `inter_blocks` is one value.
const SPLIT_FIELDS: [&str; 3] = ["to_nodes", "from_nodes", "inter_blocks"];

/// `_node_parts`' answer: a node's lane lengths, their gathered bytes
/// and the lengths of the lanes into it (little-endian u64 bytes each),
/// and whether its pairs pass the direct test.
type NodePartsTuple<'py> = (
    Bound<'py, PyBytes>,
    Bound<'py, PyBytes>,
    Bound<'py, PyBytes>,
    bool,
);

/// The fields of [`LaneSums`] then [`StageInputs`] (staged `fast` and
/// `spray` only), which may follow [`LOCAL_FIELDS`] in place of
/// [`SPLIT_FIELDS`]: `inter_blocks` and `pairs_direct` are one value each,
/// `first_slices` `R` (`u32::MAX`: none).
const LANE_FIELDS: [&str; 8] = [
    "gather",
    "gather_before",
    "land_before",
    "rail_len",
    "rail_gathered",
    "inter_blocks",
    "pairs_direct",
    "first_slices",
];

/// One value of `field`, else a `ValueError`.
fn one_value(field: Option<Vec<u64>>, name: &str) -> PyResult<u64> {
    match field.as_deref() {
        Some(&[x]) => Ok(x),
        other => Err(bad_arg(
            name,
            format!("{} values given, 1 expected", other.map_or(0, <[u64]>::len)),
        )),
    }
}

/// u64 values as little-endian bytes (the inverse of what
/// `local_from_bytes` reads).
fn to_le_bytes(v: &[u64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// `raw` (little-endian bytes) as u64 values, else a `ValueError` naming `name`.
fn u64s(raw: &[u8], name: &str) -> PyResult<Vec<u64>> {
    if raw.len() % 8 != 0 {
        return Err(bad_arg(
            name,
            format!("{} bytes do not hold u64 values", raw.len()),
        ));
    }
    Ok(raw
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
        .collect())
}

/// A rank's [`LocalTraffic`] from its fields as little-endian u64 bytes
/// (the Python side converts arrays): [`LOCAL_FIELDS`], then optionally
/// [`SPLIT_FIELDS`] (its `node_splits`) or [`LANE_FIELDS`] (its lane sums
/// and stage inputs); each field's length is checked by the planner
/// against the topology.
fn local_from_bytes(topo: &Topology, rank: i64, parts: &[Vec<u8>]) -> PyResult<LocalTraffic> {
    let (n, m, k) = (LOCAL_FIELDS.len(), SPLIT_FIELDS.len(), LANE_FIELDS.len());
    if parts.len() != n && parts.len() != n + m && parts.len() != n + k {
        return Err(bad_arg(
            "local",
            format!(
                "{} parts given, {n} expected ({}), or {} with {}, or {} with {}",
                parts.len(),
                LOCAL_FIELDS.join(", "),
                n + m,
                SPLIT_FIELDS.join(", "),
                n + k,
                LANE_FIELDS.join(", ")
            ),
        ));
    }
    let tail: &[&str] = if parts.len() == n + k {
        &LANE_FIELDS
    } else {
        &SPLIT_FIELDS
    };
    let mut fields = Vec::with_capacity(parts.len());
    for (raw, name) in parts.iter().zip(LOCAL_FIELDS.iter().chain(tail)) {
        if raw.len() % 8 != 0 {
            return Err(bad_arg(
                name,
                format!("{} bytes do not hold u64 values", raw.len()),
            ));
        }
        let v: Vec<u64> = raw
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
            .collect();
        fields.push(v);
    }
    let mut lanes = None;
    if fields.len() == n + k {
        let mut tail = fields.split_off(n).into_iter();
        let mut next = || tail.next().unwrap_or_default();
        let sums = LaneSums {
            gather: next(),
            gather_before: next(),
            land_before: next(),
            rail_len: next(),
            rail_gathered: next(),
        };
        let inter_blocks = one_value(Some(next()), "inter_blocks")?;
        let pairs_direct = one_value(Some(next()), "pairs_direct")? != 0;
        let first_slices = next()
            .into_iter()
            .map(|x| {
                u32::try_from(x).map_err(|_| {
                    bad_arg(
                        "first_slices",
                        format!("{x} is not a stage pair index (u32::MAX: none)"),
                    )
                })
            })
            .collect::<PyResult<Vec<u32>>>()?;
        lanes = Some((
            sums,
            StageInputs {
                inter_blocks,
                pairs_direct,
                first_slices,
            },
        ));
    }
    let splits = if fields.len() == n + m {
        let mut tail = fields.split_off(n).into_iter();
        let (to_nodes, from_nodes) = (
            tail.next().unwrap_or_default(),
            tail.next().unwrap_or_default(),
        );
        let inter_blocks = match tail.next().as_deref() {
            Some(&[count]) => count,
            other => {
                return Err(bad_arg(
                    "inter_blocks",
                    format!("{} values given, 1 expected", other.map_or(0, <[u64]>::len)),
                ))
            }
        };
        Some(NodeSplits {
            to_nodes,
            from_nodes,
            inter_blocks,
        })
    } else {
        None
    };
    let mut it = fields.into_iter();
    let mut next = || it.next().unwrap_or_default();
    Ok(LocalTraffic {
        rank: count(rank, "rank", 0)?,
        nodes: topo.nodes(),
        gpus_per_node: topo.gpus_per_node(),
        node_bytes: next(),
        rows: next(),
        cols: next(),
        above: next(),
        before: next(),
        rail_before: next(),
        inter_out: next(),
        inter_in: next(),
        node_splits: splits,
        lane_sums: lanes.as_ref().map(|l| l.0.clone()),
        stage_inputs: lanes.map(|l| l.1),
        rank_rail_before: next(),
        rail_into_before: next(),
    })
}

#[pymethods]
impl PyPlanner {
    #[new]
    #[pyo3(signature = (
        topology, algorithm="auto", *, pipeline_depth=None, stages_per_node=None,
        balance=None, chunk_bytes=None, time_limit_s=None, max_lanes_per_gpu=None,
        network="calibrated", settle=None, target="runtime"
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        topology: PyRef<'_, PyTopology>,
        algorithm: &str,
        pipeline_depth: Option<i64>,
        stages_per_node: Option<f64>,
        balance: Option<bool>,
        chunk_bytes: Option<i64>,
        time_limit_s: Option<f64>,
        max_lanes_per_gpu: Option<i64>,
        network: &str,
        settle: Option<&str>,
        target: &str,
    ) -> PyResult<Self> {
        let alg: Algorithm = algorithm.parse().map_err(|e| arg_err(e, "algorithm"))?;
        // Where the plans go: `msccl` plans `lp` and `pairwise` as
        // `compile --out plan.xml` does (for the topology's default executor,
        // the one `to_msccl_xml` lowers for).
        let target = match target {
            "runtime" => Target::Runtime,
            "msccl" => Target::Msccl,
            other => {
                return Err(bad_arg(
                    "target",
                    format!("unknown value {other:?} (known: runtime, msccl)"),
                ))
            }
        };
        // The mode the plans are for (as `Plan.simulate`'s): `fast` sizes its
        // chunks by its per-message cost, `auto` picks for it.
        let network: Network = network.parse().map_err(|e| arg_err(e, "network"))?;
        let fast_like = matches!(alg, Algorithm::Fast | Algorithm::Spray);
        let is_lp = alg == Algorithm::Lp;
        let is_fast = alg == Algorithm::Fast;
        // (option, given, whether `alg` takes it)
        let options = [
            ("pipeline_depth", pipeline_depth.is_some(), is_fast),
            ("stages_per_node", stages_per_node.is_some(), is_fast),
            ("balance", balance.is_some(), fast_like),
            ("chunk_bytes", chunk_bytes.is_some(), fast_like),
            ("time_limit_s", time_limit_s.is_some(), is_lp),
            ("max_lanes_per_gpu", max_lanes_per_gpu.is_some(), is_lp),
            ("settle", settle.is_some(), alg == Algorithm::Auto),
        ];
        if let Some((name, _, _)) = options.iter().find(|(_, set, takes)| *set && !takes) {
            return Err(bad_arg(
                name,
                format!("is not an option of `{alg}` (see the Planner's documentation)"),
            ));
        }
        let engine = if alg == Algorithm::Auto {
            // `auto` per call, reusing `fast`'s buffers when it picks `fast`;
            // close calls settled as `settle` says (`always`: as `compile`).
            let settle = match settle.unwrap_or("always") {
                "always" => Settle::Always,
                "never" => Settle::Never,
                "sticky" => Settle::Sticky(Default::default()),
                other => {
                    return Err(bad_arg(
                        "settle",
                        format!("unknown value {other:?} (known: always, never, sticky)"),
                    ))
                }
            };
            match FastPlanner::auto(
                &topology.inner,
                PlannerOptions::for_network(network),
                network,
            ) {
                Ok(planner) => Engine::Reusable(Box::new(planner.with_settle(settle))),
                // A `links` topology has no per-batch planner: `auto` there
                // goes through the one-shot scheduler, which settles.
                Err(Error::Unsupported { .. }) => Engine::OneShot(Options {
                    network,
                    target,
                    ..Options::default()
                }),
                Err(e) => return Err(py_err(e)),
            }
        } else if fast_like {
            let defaults = PlannerOptions::for_network(network);
            let opts = PlannerOptions {
                pipeline_depth: pipeline_depth
                    .map(|d| count(d, "pipeline_depth", 1).map(|d| d.min(u32::MAX as usize) as u32))
                    .transpose()?,
                stages_per_node: stages_per_node.unwrap_or(defaults.stages_per_node),
                balance: balance.unwrap_or(defaults.balance),
                staged: alg == Algorithm::Fast,
                chunk_bytes: chunk_bytes
                    .map(|c| count(c, "chunk_bytes", 1).map(|c| c as u64))
                    .transpose()?,
                // `spray`, the ablation, keeps line-rate chunks (as the CLI's).
                per_message_us: if is_fast {
                    defaults.per_message_us
                } else {
                    0.0
                },
            };
            Engine::Reusable(Box::new(
                FastPlanner::fast(&topology.inner, opts).map_err(py_err)?,
            ))
        } else {
            let mut opts = Options {
                network,
                ..Options::default()
            };
            if target == Target::Msccl {
                let lanes = Executor::default_for(&topology.inner).plan_lanes_per_gpu();
                opts = Options {
                    network,
                    ..Options::for_msccl(lanes)
                };
            }
            if let Some(t) = time_limit_s {
                if !(t.is_finite() && t > 0.0) {
                    return Err(bad_arg(
                        "time_limit_s",
                        format!("must be positive, got {t}"),
                    ));
                }
                opts.time_limit_s = t;
            }
            if let Some(k) = max_lanes_per_gpu {
                let k = count(k, "max_lanes_per_gpu", 1)?;
                opts.max_lanes_per_gpu = Some(k.min(u32::MAX as usize) as u32);
            }
            Engine::OneShot(opts)
        };
        let fast_defaults = pipeline_depth.is_none()
            && stages_per_node.is_none()
            && balance.is_none()
            && chunk_bytes.is_none();
        let shallower = (target == Target::Msccl
            && (alg == Algorithm::Auto || is_fast && fast_defaults))
            .then_some(network);
        Ok(PyPlanner {
            topo: topology.inner.clone(),
            algorithm: alg,
            engine,
            shallower,
            local: None,
        })
    }

    #[getter]
    fn algorithm(&self) -> &'static str {
        self.algorithm.name()
    }

    #[getter]
    fn topology(&self) -> PyTopology {
        PyTopology {
            inner: self.topo.clone(),
            assumed: Vec::new(),
        }
    }

    /// Plans the traffic given as `ranks * ranks` little-endian u64 byte
    /// counts, row-major (the Python `Planner.plan` converts array-likes).
    fn _plan_bytes(
        &mut self,
        py: Python<'_>,
        matrix: &Bound<'_, PyBytes>,
        ranks: i64,
    ) -> PyResult<PyPlan> {
        let traffic = traffic_from_bytes(matrix, ranks, &self.topo)?;
        let (alg, topo) = (self.algorithm, self.topo.clone());
        let engine = &mut self.engine;
        let (plan, compile_us) = py.detach(|| {
            let t0 = Instant::now();
            let plan = match engine {
                Engine::Reusable(p) => p.plan(&traffic),
                // `lp` for a file routes rail to rail where the executor's
                // threadblocks cannot hold a peer per GPU, and is refused
                // before its solve where even that cannot fit, as `compile
                // --out plan.xml` does (`fit::lp_rail_aligned`).
                Engine::OneShot(opts) if alg == Algorithm::Lp && opts.target == Target::Msccl => {
                    fit::lp_rail_aligned(&topo, &traffic, Executor::default_for(&topo)).and_then(
                        |rail_aligned| {
                            let opts = Options {
                                lp_rail_aligned: rail_aligned,
                                ..opts.clone()
                            };
                            schedule(alg, &topo, &traffic, &opts)
                        },
                    )
                }
                Engine::OneShot(opts) => schedule(alg, &topo, &traffic, opts),
            };
            (plan, t0.elapsed().as_secs_f64() * 1e6)
        });
        // A plan names the matrix it was made for, as the CLI's do (the
        // per-batch planner leaves that to its caller).
        let mut plan = plan.map_err(py_err)?;
        if plan.traffic_fingerprint.is_none() {
            plan.traffic_fingerprint = Some(traffic.fingerprint());
        }
        Ok(PyPlan {
            plan,
            topo,
            traffic: Arc::new(traffic),
            compile_us: Some(compile_us),
            shallower: self.shallower,
        })
    }

    /// Rank `rank`'s own program for the traffic (as `_plan_bytes` takes
    /// it), as plain data: module `rank` of the compiler (docs/formats.md,
    /// "Rank program"). `direct` and `hierarchical` plan it without the
    /// whole plan; `fast` and `spray` slice theirs.
    fn _program_bytes<'py>(
        &mut self,
        py: Python<'py>,
        matrix: &Bound<'_, PyBytes>,
        ranks: i64,
        rank: i64,
    ) -> PyResult<Bound<'py, PyAny>> {
        let traffic = traffic_from_bytes(matrix, ranks, &self.topo)?;
        let rank = usize::try_from(rank)
            .map_err(|_| bad_arg("rank", format!("must be at least 0, got {rank}")))?;
        let (alg, topo) = (self.algorithm, self.topo.clone());
        let engine = &mut self.engine;
        let text = py
            .detach(|| {
                let prog = match engine {
                    Engine::Reusable(p) => p.program(rank, &traffic),
                    Engine::OneShot(_) => {
                        FastPlanner::for_algorithm(&topo, alg, PlannerOptions::default())
                            .and_then(|mut p| p.program(rank, &traffic))
                    }
                };
                prog.map(|p| p.to_json())
            })
            .map_err(py_err)?;
        json_to_py(py, &text)
    }

    /// Rank `rank`'s own program from what that rank gathered (the fields
    /// of the compiler's `LocalTraffic` after `rank`, as little-endian u64
    /// bytes; the Python `Planner.program_local` converts arrays), as plain
    /// data (docs/formats.md, "Rank program").
    fn _program_local_bytes<'py>(
        &mut self,
        py: Python<'py>,
        rank: i64,
        parts: Vec<Vec<u8>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let local = local_from_bytes(&self.topo, rank, &parts)?;
        let planner = self.local_planner()?;
        let text = py
            .detach(|| planner.program_local(&local).map(|p| p.to_json()))
            .map_err(py_err)?;
        json_to_py(py, &text)
    }

    /// The executor's form (as `Plan._program_tuples`) of rank `rank`'s own
    /// program from what it gathered (as `_program_local_bytes` takes it):
    /// levels are the plan's steps, or for `fast` and `spray` the data
    /// levels (`program::from_local`). `None` where the planner needs the
    /// whole matrix for this traffic (staged `fast` when every node pair
    /// goes direct): the same answer on every rank, which all gathered
    /// the same shared parts, so they fall back together.
    fn _program_local_tuples(
        &mut self,
        py: Python<'_>,
        rank: i64,
        parts: Vec<Vec<u8>>,
    ) -> PyResult<Option<(u32, u64, Vec<OpTuple>)>> {
        let local = local_from_bytes(&self.topo, rank, &parts)?;
        let planner = self.local_planner()?;
        match py.detach(|| planner.program_local(&local).and_then(|p| from_local(&p))) {
            Ok(prog) => Ok(Some(program_tuples(prog))),
            Err(Error::NeedsWholeMatrix { .. }) => Ok(None),
            Err(e) => Err(py_err(e)),
        }
    }

    /// Node `node`'s part of every rank's lane sums and stage inputs
    /// (staged `fast` and `spray`; the compiler's `Planner::node_parts`)
    /// from its rows (`G x R`) and columns (`R x G`) as little-endian u64
    /// bytes: `(len, gathered, into_len, direct)`, the first three as
    /// little-endian u64 bytes. `None` where this planner plans no staged
    /// rank (a mesh, other algorithms).
    fn _node_parts<'py>(
        &mut self,
        py: Python<'py>,
        node: i64,
        rows: Vec<u8>,
        cols: Vec<u8>,
    ) -> PyResult<Option<NodePartsTuple<'py>>> {
        let node = count(node, "node", 0)?;
        let (rows, cols) = (u64s(&rows, "rows")?, u64s(&cols, "cols")?);
        let planner = self.local_planner()?;
        match py.detach(|| planner.node_parts(node, &rows, &cols)) {
            Ok(p) => Ok(Some((
                PyBytes::new(py, &to_le_bytes(&p.lanes.len)),
                PyBytes::new(py, &to_le_bytes(&p.lanes.gathered)),
                PyBytes::new(py, &to_le_bytes(&p.into_len)),
                p.direct,
            ))),
            Err(Error::NeedsWholeMatrix { .. }) => Ok(None),
            Err(e) => Err(py_err(e)),
        }
    }

    /// Rank `rank`'s first slice (the compiler's `Planner::first_slice`)
    /// from what it gathered (the [`LOCAL_FIELDS`] as `_program_local_bytes`
    /// takes them) and its node's lane lengths (`len` of `_node_parts`,
    /// little-endian u64 bytes): the index of its first lane slice in the
    /// stages (`u32::MAX`: none), or `None` where the plan is the merged
    /// one and no rank reads first slices or lane sums (every rank decides
    /// alike). The stages are kept for the rank's program.
    fn _first_slice(
        &mut self,
        py: Python<'_>,
        rank: i64,
        parts: Vec<Vec<u8>>,
        len: Vec<u8>,
    ) -> PyResult<Option<u32>> {
        let local = local_from_bytes(&self.topo, rank, &parts)?;
        let len = u64s(&len, "len")?;
        let planner = self.local_planner()?;
        py.detach(|| planner.first_slice(&local, &len))
            .map_err(py_err)
    }

    /// What `AllToAll`'s gather delivers to rank `rank` for staged `fast`
    /// and `spray` in place of `node_splits` (the compiler's
    /// `job::JobInputs`, the rank's share), from the whole matrix (`ranks * ranks`
    /// little-endian u64 byte counts): the [`LANE_FIELDS`] as lists, in
    /// order, or `None` where the plan is the merged one or this planner
    /// plans no staged rank. The reference of the gather.
    fn _lane_inputs(
        &mut self,
        py: Python<'_>,
        matrix: &Bound<'_, PyBytes>,
        ranks: i64,
        rank: i64,
    ) -> PyResult<Option<Vec<Vec<u64>>>> {
        let traffic = traffic_from_bytes(matrix, ranks, &self.topo)?;
        let rank = count(rank, "rank", 0)?;
        let topo = self.topo.clone();
        if rank >= topo.ranks() {
            return Err(PyValueError::new_err(format!(
                "rank {rank} is not a rank of the cluster (it has {})",
                topo.ranks()
            )));
        }
        let planner = self.local_planner()?;
        let share = |planner: &mut FastPlanner| -> Result<Option<(LaneSums, StageInputs)>, Error> {
            match JobInputs::from_matrix(planner, &topo, &traffic)? {
                Some(job) => job.rank_inputs(rank),
                None => Ok(None),
            }
        };
        match py.detach(|| share(planner)) {
            Ok(Some((s, i))) => Ok(Some(vec![
                s.gather,
                s.gather_before,
                s.land_before,
                s.rail_len,
                s.rail_gathered,
                vec![i.inter_blocks],
                vec![u64::from(i.pairs_direct)],
                i.first_slices.into_iter().map(u64::from).collect(),
            ])),
            Ok(None) | Err(Error::NeedsWholeMatrix { .. }) => Ok(None),
            Err(e) => Err(py_err(e)),
        }
    }

    /// True when this planner plans each rank's program from that rank's
    /// own gathered traffic: the compiler's `Planner::plans_locally` for
    /// this topology and algorithm (`_program_local_tuples` still says, per
    /// call, when a matrix needs the whole of it).
    fn _plans_locally(&self) -> bool {
        match &self.engine {
            Engine::Reusable(p) => p.plans_locally(),
            Engine::OneShot(_) => {
                FastPlanner::for_algorithm(&self.topo, self.algorithm, PlannerOptions::default())
                    .is_ok_and(|p| p.plans_locally())
            }
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "Planner({:?}, algorithm={:?})",
            self.topo.name(),
            self.algorithm.name()
        )
    }
}

impl PyPlanner {
    /// The planner of this rank's own programs: the reusable one, or one
    /// made once for a one-shot algorithm.
    fn local_planner(&mut self) -> PyResult<&mut FastPlanner> {
        if let Engine::Reusable(p) = &mut self.engine {
            return Ok(p);
        }
        if self.local.is_none() {
            let p =
                FastPlanner::for_algorithm(&self.topo, self.algorithm, PlannerOptions::default())
                    .map_err(py_err)?;
            self.local = Some(Box::new(p));
        }
        match &mut self.local {
            Some(p) => Ok(p),
            None => Err(PyRuntimeError::new_err("no per-rank planner")),
        }
    }
}

/// Rank `rank`'s part of a matrix (as `_plan_bytes` takes it) on
/// `topology`: the compiler's `LocalTraffic`, as plain data (what the
/// gather of `switchyard.torch.AllToAll` must arrive at).
#[pyfunction]
fn _local_traffic_bytes<'py>(
    py: Python<'py>,
    matrix: &Bound<'_, PyBytes>,
    ranks: i64,
    rank: i64,
    topology: PyRef<'_, PyTopology>,
) -> PyResult<Bound<'py, PyAny>> {
    let traffic = traffic_from_bytes(matrix, ranks, &topology.inner)?;
    let rank = count(rank, "rank", 0)?;
    let local = LocalTraffic::from_matrix(&traffic, rank, &topology.inner).map_err(py_err)?;
    json_to_py(py, &serde_json::to_string(&local).unwrap_or_default())
}

/// The matrix `Planner.plan` passes: `ranks * ranks` little-endian u64
/// byte counts, row-major, for a cluster of `topo`'s size.
fn traffic_from_bytes(
    matrix: &Bound<'_, PyBytes>,
    ranks: i64,
    topo: &Topology,
) -> PyResult<TrafficMatrix> {
    let ranks = count(ranks, "matrix", 1)?;
    let raw = matrix.as_bytes();
    if ranks.checked_mul(ranks).and_then(|n| n.checked_mul(8)) != Some(raw.len()) {
        return Err(bad_arg(
            "matrix",
            format!(
                "{} bytes do not hold {ranks} x {ranks} u64 values",
                raw.len()
            ),
        ));
    }
    let cells: Vec<u64> = raw
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
        .collect();
    let traffic = TrafficMatrix::from_row_major(ranks, cells, "matrix").map_err(py_err)?;
    traffic
        .check_ranks(topo.ranks(), "matrix")
        .map_err(py_err)?;
    Ok(traffic)
}

/// A plan in the IR's JSON form (as `compile --out plan.json` writes it),
/// for `topology` and the matrix it is meant to deliver (the Python
/// `switchyard.plan_from_json` converts the matrix).
#[pyfunction]
fn _plan_from_json(
    text: &str,
    topology: PyRef<'_, PyTopology>,
    matrix: &Bound<'_, PyBytes>,
    ranks: i64,
) -> PyResult<PyPlan> {
    let traffic = traffic_from_bytes(matrix, ranks, &topology.inner)?;
    let plan = Plan::from_json_str(text, "plan").map_err(py_err)?;
    if plan.ranks as usize != traffic.ranks()
        || plan.gpus_per_node as usize != topology.inner.gpus_per_node()
    {
        return Err(bad_arg(
            "plan",
            format!(
                "is for {} ranks in nodes of {} GPUs, but the topology has {} in nodes of {}",
                plan.ranks,
                plan.gpus_per_node,
                topology.inner.ranks(),
                topology.inner.gpus_per_node()
            ),
        ));
    }
    Ok(PyPlan {
        plan,
        topo: topology.inner.clone(),
        traffic: Arc::new(traffic),
        compile_us: None,
        shallower: None,
    })
}

/// A schedule for one traffic matrix on one topology.
#[pyclass(name = "Plan", module = "switchyard._native", frozen)]
struct PyPlan {
    plan: Plan,
    topo: Arc<Topology>,
    traffic: Arc<TrafficMatrix>,
    compile_us: Option<f64>,
    /// The network `fast`'s plan was made for by default options, where
    /// `to_msccl_xml` also prices it one send shallower ([`PyPlanner`]).
    shallower: Option<Network>,
}

impl PyPlan {
    fn rank(&self, rank: i64) -> PyResult<usize> {
        let r = count(rank, "rank", 0)?;
        if r >= self.plan.ranks as usize {
            return Err(bad_arg(
                "rank",
                format!("{r} is not a rank of the plan (it has {})", self.plan.ranks),
            ));
        }
        Ok(r)
    }
}

fn buffer_code(b: Buffer) -> u8 {
    match b {
        Buffer::Input => 0,
        Buffer::Output => 1,
        Buffer::Scratch => 2,
    }
}

/// One op as the executor's tuple.
type OpTuple = (u8, u32, u32, u64, u8, u64, u8, u64, u32, Vec<u32>);

/// A rank program in the executor's compact form: `(levels,
/// scratch_bytes, ops)`.
fn program_tuples(prog: RankProgram) -> (u32, u64, Vec<OpTuple>) {
    let ops = prog
        .ops
        .into_iter()
        .map(|o| {
            let kind = match o.op {
                OpKind::Send => 0,
                OpKind::Recv => 1,
                OpKind::Copy => 2,
            };
            (
                kind,
                o.level,
                o.peer,
                o.bytes,
                buffer_code(o.src_buf),
                o.src_off,
                buffer_code(o.dst_buf),
                o.dst_off,
                o.transfer,
                o.after,
            )
        })
        .collect();
    (prog.levels, prog.scratch_bytes, ops)
}

#[pymethods]
impl PyPlan {
    #[getter]
    fn algorithm(&self) -> &str {
        &self.plan.algorithm
    }
    #[getter]
    fn ranks(&self) -> u32 {
        self.plan.ranks
    }
    #[getter]
    fn gpus_per_node(&self) -> u32 {
        self.plan.gpus_per_node
    }
    #[getter]
    fn num_transfers(&self) -> usize {
        self.plan.transfers.len()
    }
    #[getter]
    fn num_steps(&self) -> usize {
        self.plan.steps()
    }
    /// Microseconds the planner took for this plan.
    #[getter]
    fn compile_us(&self) -> Option<f64> {
        self.compile_us
    }

    /// Scratch bytes rank `rank` needs.
    fn scratch_bytes(&self, rank: i64) -> PyResult<u64> {
        Ok(self.plan.scratch_bytes(self.rank(rank)?))
    }

    /// The plan IR as JSON (the same text `compile --out plan.json` writes).
    fn to_json(&self) -> String {
        self.plan.to_json()
    }

    /// The traffic matrix the plan was made for, as `switchyard traffic` writes it.
    fn traffic_json(&self) -> String {
        self.traffic.to_json()
    }

    /// MSCCL XML (the same text `compile --out plan.xml` writes).
    #[pyo3(signature = (layout="padded", protocol=None, chunk_bytes=None))]
    fn to_msccl_xml(
        &self,
        py: Python<'_>,
        layout: &str,
        protocol: Option<&str>,
        chunk_bytes: Option<i64>,
    ) -> PyResult<String> {
        let layout: Layout = layout.parse().map_err(|e: String| bad_arg("layout", e))?;
        let protocol = protocol
            .map(|p| {
                p.parse::<Protocol>()
                    .map_err(|e: String| bad_arg("protocol", e))
            })
            .transpose()?;
        let chunk_bytes = match chunk_bytes {
            Some(c) if c < 1 || c as u64 > MAX_CHUNK_BYTES => {
                return Err(bad_arg(
                    "chunk_bytes",
                    format!("must be in 1..={MAX_CHUNK_BYTES} (2^38), got {c}"),
                ))
            }
            c => c.map(|c| c as u64),
        };
        let opts = XmlOptions {
            layout,
            protocol,
            chunk_bytes,
            executor: Executor::default_for(&self.topo),
            ..XmlOptions::default()
        };
        let xml = py.detach(|| {
            let x = to_xml(&self.plan, &self.topo, &self.traffic, &opts)?;
            match self.shallower {
                Some(network) => {
                    shallower_fast(&self.plan, x, &self.topo, &self.traffic, network, &opts)
                        .map(|(x, _)| x)
                }
                None => Ok(x),
            }
        });
        Ok(xml.map_err(py_err)?.text)
    }

    /// Checks that the plan is a correct all-to-all for its matrix on its
    /// topology; raises `VerificationError` if not.
    fn verify<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let summary = py
            .detach(|| verify_on(&self.plan, &self.traffic, &self.topo))
            .map_err(|e| VerificationError::new_err(e.to_string()))?;
        let d = pyo3::types::PyDict::new(py);
        d.set_item("transfers", summary.transfers)?;
        d.set_item("bytes_moved", summary.bytes_moved)?;
        Ok(d.into_any())
    }

    /// Simulates the plan: the report `compile --report` writes, as a dict.
    /// `network`: calibrated (the default, as the CLI's), ideal, congested or stress.
    #[pyo3(signature = (network="calibrated"))]
    fn simulate<'py>(&self, py: Python<'py>, network: &str) -> PyResult<Bound<'py, PyAny>> {
        let network: Network = network.parse().map_err(|e| arg_err(e, "network"))?;
        let text = py
            .detach(|| {
                let bound = lower_bound(&self.topo, &self.traffic, &LpOptions::default())?;
                let report = Report::measure(
                    &self.plan.algorithm,
                    &self.topo,
                    &self.traffic,
                    &self.plan,
                    Some(&bound),
                    self.compile_us,
                    &SimOptions::new(network),
                )?;
                Ok::<_, Error>(serde_json::to_string(&report).unwrap_or_default())
            })
            .map_err(py_err)?;
        json_to_py(py, &text)
    }

    /// What rank `rank` executes, as plain data (docs/python.md, "Rank programs").
    fn program<'py>(&self, py: Python<'py>, rank: i64) -> PyResult<Bound<'py, PyAny>> {
        let prog = program(&self.plan, self.rank(rank)?).map_err(py_err)?;
        json_to_py(py, &prog.to_json())
    }

    /// The executor's compact form of `program(rank)`: `(levels,
    /// scratch_bytes, ops)` with each op `(kind, level, peer, bytes, src_buf,
    /// src_off, dst_buf, dst_off, transfer, after)`; kind 0 send, 1 recv,
    /// 2 copy; buffers 0 input, 1 output, 2 scratch; `after`: indices of the
    /// ops whose writes this op reads.
    fn _program_tuples(&self, rank: i64) -> PyResult<(u32, u64, Vec<OpTuple>)> {
        let prog = program(&self.plan, self.rank(rank)?).map_err(py_err)?;
        Ok(program_tuples(prog))
    }

    fn __repr__(&self) -> String {
        format!(
            "Plan(algorithm={:?}, ranks={}, transfers={}, steps={})",
            self.plan.algorithm,
            self.plan.ranks,
            self.plan.transfers.len(),
            self.plan.steps()
        )
    }
}

/// The names `Planner` accepts as `algorithm`.
#[pyfunction]
fn algorithms() -> Vec<&'static str> {
    Algorithm::ALL.iter().map(|a| a.name()).collect()
}

/// Switchyard's compiler, for Python.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyTopology>()?;
    m.add_class::<PyPlanner>()?;
    m.add_class::<PyPlan>()?;
    m.add_function(wrap_pyfunction!(algorithms, m)?)?;
    m.add_function(wrap_pyfunction!(_plan_from_json, m)?)?;
    m.add_function(wrap_pyfunction!(_local_traffic_bytes, m)?)?;
    m.add("VerificationError", m.py().get_type::<VerificationError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
