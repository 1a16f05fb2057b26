//! Switchyard's compiler: from a traffic matrix and a cluster topology to a
//! verified all-to-all schedule (the Plan IR), its simulated cost, and MSCCL XML.
//!
//! Data flows one way: inputs ([`topology`], [`traffic`], [`generate`]) →
//! schedulers ([`sched`]) → [`plan::Plan`] → consumers ([`verify`](mod@verify), the
//! simulator, the lower bounds, the MSCCL lowering). No module reaches back
//! upstream. See docs/architecture.md for the code map.
//!
//! The whole pipeline on a small cluster:
//!
//! ```
//! use switchyard_compiler::bound::cut_bound;
//! use switchyard_compiler::sched::{schedule, Options};
//! use switchyard_compiler::sim::{simulate, SimOptions};
//! use switchyard_compiler::{verify_on, Algorithm, Topology, TrafficMatrix};
//!
//! let topo = Topology::from_json_str(
//!     r#"{ "name": "2 nodes of 4 GPUs", "nodes": 2, "gpus_per_node": 4,
//!          "intra": { "kind": "switch", "bandwidth_GBps": 450.0, "latency_us": 1.0 },
//!          "nic":   { "per_node": 4, "bandwidth_GBps": 50.0, "latency_us": 3.0 } }"#,
//!     "topology.json",
//! )?;
//! let mut traffic = TrafficMatrix::uniform(8, 1 << 20);
//! traffic.set(0, 4, 16 << 20); // one hot pair between the nodes
//! let plan = schedule(Algorithm::Fast, &topo, &traffic, &Options::default())?;
//! verify_on(&plan, &traffic, &topo)?; // every byte lands once, in place
//! let sim = simulate(&topo, &plan, &SimOptions::default())?;
//! let ratio = sim.completion_us / cut_bound(&topo, &traffic).best_us();
//! assert!(ratio >= 1.0);
//! # Ok::<(), switchyard_compiler::Error>(())
//! ```

pub mod bound;
pub mod error;
pub mod generate;
pub mod import;
pub mod job;
pub mod lp;
pub mod msccl;
pub mod plan;
pub mod planner;
pub mod program;
pub mod rank;
pub mod report;
pub mod sched;
pub mod sim;
pub mod timeline;
pub mod topology;
pub mod traffic;
pub mod verify;

pub use error::{Error, InputError, Result};
pub use plan::{Buffer, Path, Plan, Transfer};
pub use program::RankProgram;
pub use sched::Algorithm;
pub use topology::{Topology, TopologySpec};
pub use traffic::{Layout, TrafficMatrix};
pub use verify::{verify, verify_on, VerifyError};
