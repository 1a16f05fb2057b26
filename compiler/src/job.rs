//! What a job gathers for staged `fast` and `spray` in place of
//! `node_splits`, computed from the whole matrix: [`JobInputs`], the one
//! setup that the tests, the benches and the examples share (issue 25).
//!
//! A job gathers these over the network instead (python/switchyard/torch.py,
//! docs/python.md "What a rank gathers"); this module reads the whole
//! matrix, O(R²), so it is the gather's reference, not a per-batch path.
//! It stands above the [`Planner`] (which knows nothing of it): every
//! number it holds comes from the planner's own entry points, as a job's
//! ranks call them.

use crate::error::{Error, InputError, Result};
use crate::planner::Planner;
use crate::rank::{check_rank, LaneSums, LocalTraffic, NodeLanes, NodeParts, StageInputs};
use crate::topology::Topology;
use crate::traffic::TrafficMatrix;

/// What a job gathers for staged `fast` and `spray` in place of
/// `node_splits`, for every rank of one matrix at once: every node's
/// [`NodeParts`] (`Planner::node_parts` from the node's rows and
/// columns), and the [`StageInputs`] every rank shares (every rank's
/// `Planner::first_slice`, the non-empty blocks between nodes, the nodes'
/// direct verdicts AND-ed). [`JobInputs::local`] then gives any rank's
/// [`LocalTraffic`] as the job delivers it: its [`LaneSums`]
/// (`LaneSums::assemble` from every node's lanes, `land_before` from the
/// lanes into each node before the rank's) and the stage inputs, without
/// `node_splits`.
///
/// Where the plan is the merged one (a latency-bound exchange, or one NIC
/// with few peers), no rank reads lanes: the job gathers neither, and
/// [`JobInputs::local`] gives neither (as `switchyard.torch.AllToAll`
/// does, whose second round is skipped).
///
/// Computed from the whole matrix: O(R²) time (the matrix is read once
/// for the shared parts and once for every node's columns, plus each
/// rank's first slice), O(N² G) numbers kept (every node's parts). For
/// tests, benches and examples; a job gathers the same numbers over the
/// network (python/), each rank computing its own share.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobInputs {
    nodes: usize,
    gpus: usize,
    /// The node matrix the inputs were computed for, to tell a different
    /// matrix given to [`JobInputs::local`].
    node_bytes: Vec<u64>,
    parts: Vec<NodeParts>,
    /// `None`: the merged plan.
    stage_inputs: Option<StageInputs>,
}

impl JobInputs {
    /// What a job gathers for `m` on `topo` for `planner`'s staged `fast`
    /// or `spray`, through its entry points (`node_parts` for every node,
    /// `first_slice` for every rank; the planner keeps the stages of the
    /// last rank's first slice). `Ok(None)` where the planner plans no
    /// staged rank ([`Error::NeedsWholeMatrix`] from `node_parts`: other
    /// algorithms, `auto`, a mesh): a job gathers none of this there.
    /// Errors ([`Error::Input`]) when `m` does not fit `topo`, or `topo`'s
    /// shape not the planner's; other errors of the planner as they come.
    pub fn from_matrix(
        planner: &mut Planner,
        topo: &Topology,
        m: &TrafficMatrix,
    ) -> Result<Option<JobInputs>> {
        let n = m.ranks();
        m.check_ranks(topo.ranks(), "traffic")?;
        let (nodes, g) = (topo.nodes(), topo.gpus_per_node());
        // The parts every rank holds alike (the node matrix, what each
        // rank sends and receives across nodes) and the count of blocks
        // between nodes, from one pass over the matrix.
        let mut shared = LocalTraffic::from_matrix(m, 0, topo)?;
        let inter_blocks = shared
            .node_splits
            .take()
            .map_or(0, |splits| splits.inter_blocks);
        // Every node's parts from its rows and columns, as any of its
        // ranks has them.
        let mut parts = Vec::with_capacity(nodes);
        let mut cols = Vec::with_capacity(n * g);
        for a in 0..nodes {
            let rows = &m.as_slice()[a * g * n..(a + 1) * g * n];
            cols.clear();
            for s in 0..n {
                cols.extend_from_slice(&m.row(s)[a * g..(a + 1) * g]);
            }
            match planner.node_parts(a, rows, &cols) {
                Ok(p) => parts.push(p),
                Err(Error::NeedsWholeMatrix { .. }) => return Ok(None),
                Err(e) => return Err(e),
            }
        }
        // Every rank's first slice: it reads the node matrix and what
        // every rank sends and receives across nodes, which every rank
        // holds alike, so one rank's traffic serves with its rank changed.
        // `None` (the merged plan) for one rank is `None` for all.
        let mut first_slices = Vec::with_capacity(n);
        for r in 0..n {
            shared.rank = r;
            match planner.first_slice(&shared, &parts[r / g].lanes.len)? {
                Some(first) => first_slices.push(first),
                None => {
                    first_slices.clear();
                    break;
                }
            }
        }
        let stage_inputs = (first_slices.len() == n).then(|| StageInputs {
            inter_blocks,
            pairs_direct: parts.iter().all(|p| p.direct),
            first_slices,
        });
        Ok(Some(JobInputs {
            nodes,
            gpus: g,
            node_bytes: shared.node_bytes,
            parts,
            stage_inputs,
        }))
    }

    /// Every node's parts (`parts()[a]`: node `a`'s, from its rows and
    /// columns).
    pub fn parts(&self) -> &[NodeParts] {
        &self.parts
    }

    /// The stage inputs every rank reads; `None` where the plan is the
    /// merged one (no rank reads them).
    pub fn stage_inputs(&self) -> Option<&StageInputs> {
        self.stage_inputs.as_ref()
    }

    /// Whether the plan is the merged one: no rank reads lane sums or
    /// stage inputs, and a job gathers neither.
    pub fn merged(&self) -> bool {
        self.stage_inputs.is_none()
    }

    /// The lane lengths of rank `rank`'s node ([`NodeLanes::len`]): what
    /// `Planner::first_slice` takes for that rank. Errors
    /// ([`Error::Input`]) when `rank` is not a rank of the cluster.
    pub fn own_lens(&self, rank: usize) -> Result<&[u64]> {
        check_rank(rank, self.nodes * self.gpus)?;
        Ok(&self.parts[rank / self.gpus].lanes.len)
    }

    /// Rank `rank`'s [`LaneSums`] as a job delivers them from the nodes'
    /// parts: `gather`, `gather_before` and the rail lanes from the
    /// sending nodes' lanes ([`LaneSums::assemble`]), `land_before` from
    /// the lanes into each receiving node (its `into_len`, summed over the
    /// sending nodes before `rank`'s node). Errors ([`Error::Input`]) when
    /// `rank` is not a rank of the cluster.
    pub fn lane_sums(&self, rank: usize) -> Result<LaneSums> {
        let (nn, g) = (self.nodes, self.gpus);
        let lanes: Vec<NodeLanes> = self.parts.iter().map(|p| p.lanes.clone()).collect();
        let mut sums = LaneSums::assemble(&lanes, rank, nn, g)?;
        let node = rank / g;
        for (b, p) in self.parts.iter().enumerate() {
            for l in 0..g {
                sums.land_before[b * g + l] = (0..node).map(|a| p.into_len[a * g + l]).sum();
            }
        }
        Ok(sums)
    }

    /// What the job delivers to rank `rank` in place of `node_splits`:
    /// its [`LaneSums`] ([`JobInputs::lane_sums`]) and the
    /// [`StageInputs`]; `None` where the plan is the merged one. Errors
    /// ([`Error::Input`]) when `rank` is not a rank of the cluster.
    pub fn rank_inputs(&self, rank: usize) -> Result<Option<(LaneSums, StageInputs)>> {
        check_rank(rank, self.nodes * self.gpus)?;
        match &self.stage_inputs {
            Some(inputs) => Ok(Some((self.lane_sums(rank)?, inputs.clone()))),
            None => Ok(None),
        }
    }

    /// Rank `rank`'s [`LocalTraffic`] of `m` as the job delivers it:
    /// `node_splits` taken away, and, unless the plan is the merged one,
    /// its [`LaneSums`] ([`JobInputs::lane_sums`]) and the
    /// [`StageInputs`] set. O(R²) (`LocalTraffic::from_matrix`). Errors
    /// ([`Error::Input`]) when `m` or `topo` does not fit, or `m` is not
    /// the matrix these inputs were computed from (its node matrix
    /// differs).
    pub fn local(&self, m: &TrafficMatrix, rank: usize, topo: &Topology) -> Result<LocalTraffic> {
        if topo.nodes() != self.nodes || topo.gpus_per_node() != self.gpus {
            return Err(InputError::new(
                "job inputs",
                format!(
                    "are for {} nodes of {} GPUs but the topology has {} of {}",
                    self.nodes,
                    self.gpus,
                    topo.nodes(),
                    topo.gpus_per_node()
                ),
            )
            .into());
        }
        let mut local = LocalTraffic::from_matrix(m, rank, topo)?;
        if local.node_bytes != self.node_bytes {
            return Err(InputError::new(
                "job inputs",
                "were computed from another matrix (its node matrix differs)",
            )
            .into());
        }
        local.node_splits = None;
        if let Some((sums, inputs)) = self.rank_inputs(rank)? {
            local.lane_sums = Some(sums);
            local.stage_inputs = Some(inputs);
        }
        Ok(local)
    }
}
