//! The dependency graph of a plan, as both backends need it: successor lists,
//! a topological order and each transfer's level (longest chain of
//! dependencies before it). Dependencies are checked here too, so a plan that
//! skipped the verifier still cannot index out of bounds.

use switchyard_compiler::Plan;

use crate::RuntimeError;

/// Successors of every transfer in compressed form: those of `i` are
/// `succ[start[i]..start[i + 1]]`.
#[derive(Clone, Debug)]
pub struct Dag {
    start: Vec<u32>,
    succ: Vec<u32>,
    /// Number of dependencies of each transfer.
    pub indegree: Vec<u32>,
}

impl Dag {
    /// Builds the graph; fails on a dependency that names no transfer or itself.
    pub fn new(plan: &Plan) -> Result<Dag, RuntimeError> {
        let n = plan.transfers.len();
        let mut start = vec![0u32; n + 1];
        let mut indegree = vec![0u32; n];
        for (i, t) in plan.transfers.iter().enumerate() {
            for &d in &t.deps {
                if d as usize >= n || d as usize == i {
                    return Err(RuntimeError::InvalidPlan(format!(
                        "transfer {i} depends on transfer {d}, which does not exist or is itself"
                    )));
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
        Ok(Dag {
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

    pub fn successors(&self, i: usize) -> &[u32] {
        &self.succ[self.start[i] as usize..self.start[i + 1] as usize]
    }

    /// Kahn's algorithm, lowest index first among ready transfers at each
    /// round; a cycle is a [`RuntimeError::Deadlock`].
    pub fn topo_order(&self) -> Result<Vec<u32>, RuntimeError> {
        let n = self.len();
        let mut indeg = self.indegree.clone();
        let mut order: Vec<u32> = (0..n as u32).filter(|&i| indeg[i as usize] == 0).collect();
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
        if order.len() < n {
            let first = indeg.iter().position(|&d| d > 0).unwrap_or(0);
            return Err(RuntimeError::Deadlock {
                stuck: n - order.len(),
                total: n,
                reason: format!("dependency cycle, e.g. through transfer {first}"),
            });
        }
        Ok(order)
    }

    /// Level of every transfer: 0 without dependencies, else one more than its
    /// deepest dependency.
    pub fn levels(&self, plan: &Plan) -> Result<Vec<u32>, RuntimeError> {
        let order = self.topo_order()?;
        let mut level = vec![0u32; self.len()];
        for &i in &order {
            let t = &plan.transfers[i as usize];
            level[i as usize] = t
                .deps
                .iter()
                .map(|&d| level[d as usize] + 1)
                .max()
                .unwrap_or(0);
        }
        Ok(level)
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
