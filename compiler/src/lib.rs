//! Switchyard's compiler: from a traffic matrix and a cluster topology to a
//! verified all-to-all schedule (the Plan IR), its simulated cost, and MSCCL XML.
//!
//! Data flows one way: inputs ([`topology`], [`traffic`], [`generate`]) →
//! schedulers ([`sched`]) → [`plan::Plan`] → consumers ([`verify`], the
//! simulator, the lower bounds, the MSCCL lowering). No module reaches back
//! upstream. See docs/architecture.md for the code map.

pub mod bound;
pub mod error;
pub mod generate;
pub mod lp;
pub mod msccl;
pub mod plan;
pub mod planner;
pub mod report;
pub mod sched;
pub mod sim;
pub mod topology;
pub mod traffic;
pub mod verify;

pub use error::{Error, InputError, Result};
pub use plan::{Buffer, Path, Plan, Transfer};
pub use sched::Algorithm;
pub use topology::{Topology, TopologySpec};
pub use traffic::{Layout, TrafficMatrix};
pub use verify::{verify, verify_on, VerifyError};
