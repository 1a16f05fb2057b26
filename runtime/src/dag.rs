//! The dependency graph of a plan, as both backends need it: successor lists,
//! a topological order and each transfer's level (longest chain of
//! dependencies before it). Dependencies are checked here too, so a plan that
//! skipped the verifier still cannot index out of bounds.

use switchyard_compiler::plan::DepGraph;
use switchyard_compiler::Plan;

use crate::RuntimeError;

/// A plan's [`DepGraph`], with its failures turned into runtime errors.
#[derive(Clone, Debug)]
pub struct Dag {
    graph: DepGraph,
}

impl Dag {
    /// Builds the graph; fails on a dependency that names no transfer or itself.
    pub fn new(plan: &Plan) -> Result<Dag, RuntimeError> {
        let graph = DepGraph::new(plan).map_err(|(i, d)| {
            RuntimeError::InvalidPlan(format!(
                "transfer {i} depends on transfer {d}, which does not exist or is itself"
            ))
        })?;
        Ok(Dag { graph })
    }

    pub fn len(&self) -> usize {
        self.graph.len()
    }

    pub fn is_empty(&self) -> bool {
        self.graph.is_empty()
    }

    /// Number of dependencies of each transfer.
    pub fn indegree(&self) -> &[u32] {
        self.graph.indegree()
    }

    pub fn successors(&self, i: usize) -> &[u32] {
        self.graph.successors(i)
    }

    /// Kahn's algorithm, lowest index first among ready transfers at each
    /// round; a cycle is a [`RuntimeError::Deadlock`].
    pub fn topo_order(&self) -> Result<Vec<u32>, RuntimeError> {
        self.graph
            .topo_order()
            .map_err(|indeg| self.deadlock(&indeg))
    }

    /// The in-degrees a cycle left, as the error a run reports.
    fn deadlock(&self, indeg: &[u32]) -> RuntimeError {
        let stuck = indeg.iter().filter(|&&d| d > 0).count();
        let first = indeg.iter().position(|&d| d > 0).unwrap_or(0);
        RuntimeError::Deadlock {
            stuck,
            total: self.len(),
            reason: format!("dependency cycle, e.g. through transfer {first}"),
        }
    }

    /// Level of every transfer: 0 without dependencies, else one more than its
    /// deepest dependency.
    pub fn levels(&self, plan: &Plan) -> Result<Vec<u32>, RuntimeError> {
        self.graph
            .levels(plan)
            .map_err(|indeg| self.deadlock(&indeg))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use switchyard_compiler::{Buffer, Path, Transfer};

    /// A plan of `n` one-byte local copies on rank 0 with the given dependencies.
    pub(crate) fn chain_plan(deps: &[&[u32]]) -> Plan {
        let mut p = Plan::new("test", 1, 1);
        for (i, d) in deps.iter().enumerate() {
            p.push(Transfer {
                src: 0,
                src_buf: Buffer::Input,
                src_off: i as u64,
                dst: 0,
                dst_buf: Buffer::Output,
                dst_off: i as u64,
                bytes: 1,
                path: Path::Local,
                step: 0,
                deps: d.iter().copied().collect(),
            });
        }
        p
    }

    #[test]
    fn order_and_levels() {
        let p = chain_plan(&[&[], &[0], &[0], &[1, 2], &[]]);
        let dag = Dag::new(&p).unwrap();
        assert_eq!(dag.topo_order().unwrap(), vec![0, 4, 1, 2, 3]);
        assert_eq!(dag.levels(&p).unwrap(), vec![0, 1, 1, 2, 0]);
        assert_eq!(dag.successors(0), &[1, 2]);
    }

    #[test]
    fn cycles_and_bad_deps_are_errors() {
        let p = chain_plan(&[&[], &[2], &[1]]);
        let e = Dag::new(&p).unwrap().topo_order().unwrap_err();
        assert!(
            matches!(
                e,
                RuntimeError::Deadlock {
                    stuck: 2,
                    total: 3,
                    ..
                }
            ),
            "{e}"
        );
        let p = chain_plan(&[&[7]]);
        assert!(matches!(
            Dag::new(&p).unwrap_err(),
            RuntimeError::InvalidPlan(_)
        ));
    }
}
