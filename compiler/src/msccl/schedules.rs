//! The reference schedules checked in under `schedules/`: which clusters,
//! matrices and algorithms, and their exact file contents. The example
//! `regen_schedules` writes them; a test fails when the checked-in copies
//! differ from what this code produces.

use crate::error::Result;
use crate::generate::{generate, Pattern, TrafficSpec};
use crate::sched::{schedule, Algorithm, Options};
use crate::topology::Topology;
use crate::traffic::TrafficMatrix;

use super::{to_xml, XmlOptions, PLAN_LANES_PER_GPU};

/// Algorithms with checked-in plans, by CLI name; names not (yet) known to
/// [`Algorithm`] are skipped, so a scheduler that lands makes the set stale.
pub const ALGORITHMS: [&str; 3] = ["direct", "hierarchical", "fast"];

/// Bytes per pair of the uniform reference matrices.
pub const UNIFORM_BYTES: u64 = 1 << 20;

/// One file of `schedules/`: its name and content.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScheduleFile {
    pub name: String,
    pub text: String,
}

/// The skewed reference matrix: MoE routing (Zipf 1.0 expert popularity,
/// seed 42) over 16 ranks.
pub fn skewed_traffic() -> Result<TrafficMatrix> {
    let mut spec = TrafficSpec::new(16, Pattern::Moe);
    spec.seed = 42;
    spec.moe.tokens_per_rank = 1024;
    generate(&spec)
}

/// Every file of `schedules/` except its README, in a fixed order.
pub fn reference_schedules() -> Result<Vec<ScheduleFile>> {
    let mut out = Vec::new();
    // Scheduled as `compile --out plan.xml` schedules.
    let sched = Options::for_msccl(PLAN_LANES_PER_GPU);
    let algorithms: Vec<Algorithm> = ALGORITHMS.iter().filter_map(|a| a.parse().ok()).collect();
    for nodes in [2usize, 4] {
        let topo = Topology::preset("dgx-h100", nodes, None)?;
        let m = TrafficMatrix::uniform(topo.ranks(), UNIFORM_BYTES);
        // One chunk per pair: the file then serves every message size
        // whose protocol window it is in.
        let opts = XmlOptions {
            chunk_bytes: Some(UNIFORM_BYTES),
            ..XmlOptions::default()
        };
        for &alg in &algorithms {
            let plan = schedule(alg, &topo, &m, &sched)?;
            let x = to_xml(&plan, &topo, &m, &opts)?;
            out.push(ScheduleFile {
                name: format!("dgx-h100-{nodes}x8-uniform-{alg}.xml"),
                text: x.text,
            });
        }
    }
    let topo = Topology::preset("dgx-h100", 2, None)?;
    let m = skewed_traffic()?;
    out.push(ScheduleFile {
        name: "dgx-h100-2x8-moe.traffic.json".into(),
        text: m.to_json(),
    });
    for &alg in &algorithms {
        let plan = schedule(alg, &topo, &m, &sched)?;
        let x = to_xml(&plan, &topo, &m, &XmlOptions::default())?;
        out.push(ScheduleFile {
            name: format!("dgx-h100-2x8-moe-{alg}.xml"),
            text: x.text,
        });
    }
    Ok(out)
}
