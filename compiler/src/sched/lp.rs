//! `lp`: solver-based scheduling for any topology graph.
//!
//! 1. Solve the concurrent multi-commodity flow LP (`crate::lp`, eq. 1-4 of
//!    docs/algorithms-lp.md): the routing that minimises the makespan.
//! 2. Decompose each source's flow into routes (GPU sequences); a route
//!    through a GPU is a relay through that GPU's scratch.
//! 3. Split each block over its routes in proportion to the flow, and each
//!    route into lanes of about equal size, so the simulator's max-min
//!    sharing gives every route a rate in proportion to its bytes, as the LP
//!    does (eq. 5). A relayed lane is cut into slices that run one after the
//!    other, so that each hop of a slice overlaps the previous hop of the next
//!    slice (a pipeline) instead of waiting for the whole lane.
//! 4. Optionally (`LpOptions::max_lanes_per_gpu`, for MSCCL XML), size lanes
//!    by the slack of their routes and coarsen them until no GPU runs more
//!    lanes at once than the cap (eq. 6).

use crate::error::Result;
use crate::lp::{
    decompose, solve_mcf, Formulation, LpOptions, McfSolution, Objective, Route, SolveStatus,
};
use crate::plan::{Buffer, Deps, Plan, Transfer};
use crate::topology::Topology;
use crate::traffic::{Layout, TrafficMatrix};

use super::path_between;

/// Routes carrying less than this share of their block are folded into the
/// others: they would cost a transfer each and change almost nothing.
const MIN_ROUTE_SHARE: f64 = 0.02;
/// Lanes per non-empty block on average (eq. 5). Measured on the 8x8
/// fat-trees: 1 is as good as 2 to 8 and makes the fewest transfers.
const LANES_PER_BLOCK: f64 = 1.0;
/// Most slices per relayed lane: the depth of its pipeline. Measured on the
/// 8x8 fat-trees: 4 slices lose up to 10% to the LP bound, 8 up to 4%,
/// 16 up to 2.4%.
const SLICES: u64 = 16;
/// A slice must move for at least this many times its route's latency:
/// slices of a lane run one after the other and each pays the latency.
const SLICE_OVER_LATENCY: f64 = 10.0;
/// No lane or slice is cut below this, in bytes.
const MIN_PIECE: u64 = 4096;

/// What the solve found, for reports and tests.
#[derive(Clone, Debug)]
pub struct LpReport {
    /// Optimum (or best at the time limit) LP makespan without latency, us;
    /// infinite when the solver found no flow and the plan fell back to
    /// direct routes.
    pub makespan_us: f64,
    pub status: SolveStatus,
    pub solve_s: f64,
    pub variables: usize,
    pub constraints: usize,
    /// Bytes that pass through a relay GPU (counted once per block share).
    pub relayed_bytes: u64,
}

/// The `lp` schedule of `traffic` on `topo`.
pub fn lp(topo: &Topology, traffic: &TrafficMatrix, opts: &LpOptions) -> Result<Plan> {
    lp_with_report(topo, traffic, opts).map(|(plan, _)| plan)
}

/// [`lp`], and what the solver did.
pub fn lp_with_report(
    topo: &Topology,
    traffic: &TrafficMatrix,
    opts: &LpOptions,
) -> Result<(Plan, LpReport)> {
    traffic.check_ranks(topo.ranks(), "traffic")?;
    let n = traffic.ranks();
    // In the hierarchical form every GPU-to-GPU stretch of a graph path is
    // the topology's own path (or NVLink where the flow looped through the
    // fabric), so the flow on the graph is a plan; a `links` topology routes
    // a transfer on its fixed path, so there the flow routes over those hops.
    // Rail-aligned (an executor's threadblocks): the fabric split by rail.
    let rail_aligned = opts.rail_aligned && topo.is_hierarchical();
    let formulation = if !topo.is_hierarchical() {
        Formulation::Hops
    } else if rail_aligned {
        Formulation::Rails
    } else {
        Formulation::Links
    };
    let sol = solve_mcf(
        topo,
        traffic,
        opts,
        formulation,
        Objective::MakespanThenRouting,
    )?;
    let mut routes: Vec<Vec<Vec<Route>>> = vec![Vec::new(); n];
    if let Some(sol) = &sol {
        if opts.verbose {
            eprintln!(
                "lp: {} variables, {} constraints, {:?} in {:.3} s, makespan {:.3} us",
                sol.variables, sol.constraints, sol.status, sol.solve_s, sol.makespan_us
            );
        }
        for flow in &sol.flows {
            routes[flow.source] = decompose(&sol.network, traffic, flow);
        }
    }
    let report = make_report(sol.as_ref());
    let mut plan = Plan::new("lp", n, topo.gpus_per_node());
    let makespan = if report.makespan_us.is_finite() {
        report.makespan_us
    } else {
        0.0
    };
    let mut shares: Vec<(Vec<usize>, u64)> = Vec::new();
    for (s, from_s) in routes.iter().enumerate() {
        for d in 0..n {
            let bytes = traffic.get(s, d);
            if bytes == 0 {
                continue;
            }
            let mine = from_s.get(d).map_or(&[][..], |r| r.as_slice());
            if rail_aligned {
                // Only rail-aligned routes; none (no flow, or the
                // decomposition's round-off going straight): via the
                // GPU of the destination's rail on the source's node.
                let kept: Vec<Route> = mine
                    .iter()
                    .filter(|r| r.gpus.windows(2).all(|w| rail_hop(topo, w[0], w[1])))
                    .cloned()
                    .collect();
                let got = apportion(s, d, bytes, &kept);
                if got.len() == 1 && got[0].0 == [s, d] && !rail_hop(topo, s, d) {
                    shares.push((rail_route(topo, s, d), bytes));
                } else {
                    shares.extend(got);
                }
            } else {
                shares.extend(apportion(s, d, bytes, mine));
            }
        }
    }
    let mut builder = Builder::new(topo, traffic, &mut plan, makespan);
    let lane_bytes = match opts.max_lanes_per_gpu {
        None => vec![builder.lane_bytes; shares.len()],
        Some(cap) => capped_lanes(topo, &shares, builder.lane_bytes, cap),
    };
    for ((gpus, share), lane) in shares.iter().zip(lane_bytes) {
        builder.route(gpus, *share, lane);
    }
    let relayed = builder.relayed;
    let report = LpReport {
        relayed_bytes: relayed,
        ..report
    };
    Ok((plan, report))
}

fn make_report(sol: Option<&McfSolution>) -> LpReport {
    match sol {
        Some(s) => LpReport {
            makespan_us: s.makespan_us,
            status: s.status,
            solve_s: s.solve_s,
            variables: s.variables,
            constraints: s.constraints,
            relayed_bytes: 0,
        },
        None => LpReport {
            makespan_us: 0.0,
            status: SolveStatus::Optimal,
            solve_s: 0.0,
            variables: 0,
            constraints: 0,
            relayed_bytes: 0,
        },
    }
}

/// Whether `a` may send to `b` in a rail-aligned plan: same node (NVLink),
/// or the same rail on another node.
fn rail_hop(topo: &Topology, a: usize, b: usize) -> bool {
    topo.node_of(a) == topo.node_of(b) || topo.rail_of(a) == topo.rail_of(b)
}

/// The rail-aligned route of block `(s, d)` without a flow: over NVLink
/// to the GPU of `s`'s node with `d`'s local index (so `d`'s rail), then
/// rail to rail (`[s, d]` where that is `s`).
fn rail_route(topo: &Topology, s: usize, d: usize) -> Vec<usize> {
    let g = topo.gpus_per_node();
    let j = topo.node_of(s) * g + topo.local_of(d);
    if j == s || topo.node_of(s) == topo.node_of(d) {
        vec![s, d]
    } else {
        vec![s, j, d]
    }
}

/// Splits block `(s, d)` of `bytes` over its routes in proportion to their
/// flow, in whole bytes that sum to `bytes` (largest remainders). No route
/// (no flow, or a local copy): the block goes straight.
fn apportion(s: usize, d: usize, bytes: u64, routes: &[Route]) -> Vec<(Vec<usize>, u64)> {
    let flow: f64 = routes.iter().map(|r| r.bytes).sum();
    let kept: Vec<&Route> = routes
        .iter()
        .filter(|r| r.bytes >= MIN_ROUTE_SHARE * flow)
        .collect();
    if s == d || kept.is_empty() || flow.is_nan() || flow <= 0.0 {
        return vec![(vec![s, d], bytes)];
    }
    let kept_flow: f64 = kept.iter().map(|r| r.bytes).sum();
    let exact: Vec<f64> = kept
        .iter()
        .map(|r| r.bytes / kept_flow * bytes as f64)
        .collect();
    let mut whole: Vec<u64> = exact.iter().map(|x| x.floor() as u64).collect();
    let mut left = bytes.saturating_sub(whole.iter().sum());
    let mut order: Vec<usize> = (0..kept.len()).collect();
    order.sort_by(|&a, &b| {
        let (ra, rb) = (exact[a] - exact[a].floor(), exact[b] - exact[b].floor());
        rb.total_cmp(&ra).then(a.cmp(&b))
    });
    for &i in order.iter().cycle().take(kept.len() * 2) {
        if left == 0 {
            break;
        }
        whole[i] += 1;
        left -= 1;
    }
    // Rounding never leaves more than one byte per route, but stay exact.
    whole[order[0]] += left;
    kept.iter()
        .zip(whole)
        .filter(|(_, b)| *b > 0)
        .map(|(r, b)| (r.gpus.clone(), b))
        .collect()
}

/// Writes routes as transfers: offsets in the all-to-all layout, scratch for
/// relays, dependencies along each lane.
struct Builder<'a> {
    topo: &'a Topology,
    layout: Layout,
    plan: &'a mut Plan,
    /// Next free scratch byte per rank (scratch is never reused, so no byte
    /// is written twice).
    scratch_top: Vec<u64>,
    /// Block offset already planned, per (s, d), so shares follow each other.
    done: Vec<u64>,
    lane_bytes: u64,
    /// The LP makespan, us: a lane moves at about lane bytes per makespan.
    makespan_us: f64,
    relayed: u64,
}

impl<'a> Builder<'a> {
    fn new(
        topo: &'a Topology,
        traffic: &TrafficMatrix,
        plan: &'a mut Plan,
        makespan_us: f64,
    ) -> Self {
        let n = traffic.ranks();
        let blocks = (0..n * n)
            .filter(|&i| i / n != i % n && traffic.as_slice()[i] > 0)
            .count()
            .max(1);
        // Eq. (5): lanes of about equal size across the whole plan.
        let lane_bytes = ((traffic.off_diagonal_total() as f64 / (blocks as f64 * LANES_PER_BLOCK))
            as u64)
            .max(MIN_PIECE);
        Builder {
            topo,
            layout: Layout::new(traffic),
            plan,
            scratch_top: vec![0; n],
            done: vec![0; n * n],
            lane_bytes,
            makespan_us,
            relayed: 0,
        }
    }

    /// Plans `bytes` of block `(gpus[0], gpus.last())` along `gpus`, in
    /// lanes of about `lane_bytes`.
    fn route(&mut self, gpus: &[usize], bytes: u64, lane_bytes: u64) {
        let (s, d) = (gpus[0], gpus[gpus.len() - 1]);
        let n = self.layout.ranks();
        let start = self.done[s * n + d];
        self.done[s * n + d] += bytes;
        if gpus.len() > 2 {
            self.relayed += bytes;
        }
        // A rank's copy to itself is one transfer, as in every scheduler:
        // it shares no link, so lanes would only multiply transfers with
        // its bytes (a 1 GiB self-copy made 262,144 of them).
        let lanes = if s == d {
            1
        } else {
            bytes.div_ceil(lane_bytes.max(1)).max(1)
        };
        // A lane runs for about the makespan; its slices share that time.
        let latency: f64 = gpus
            .windows(2)
            .map(|w| self.topo.path_latency(w[0], w[1]))
            .sum();
        let by_latency = if latency > 0.0 {
            (self.makespan_us / (SLICE_OVER_LATENCY * latency)) as u64
        } else {
            SLICES
        };
        let mut off = start;
        for lane_len in split(bytes, lanes) {
            let slices = if gpus.len() > 2 {
                SLICES
                    .min(by_latency)
                    .min(lane_len.div_ceil(MIN_PIECE))
                    .max(1)
            } else {
                1
            };
            let mut prev_slice: Vec<u32> = Vec::new();
            for (slice, len) in split(lane_len, slices).into_iter().enumerate() {
                let mut this_slice = Vec::with_capacity(gpus.len() - 1);
                // Where the slice's bytes sit before each hop.
                let mut at = (Buffer::Input, self.layout.send_offset(s, d) + off);
                for hop in 0..gpus.len() - 1 {
                    let (a, b) = (gpus[hop], gpus[hop + 1]);
                    let to = if b == d {
                        (Buffer::Output, self.layout.recv_offset(s, d) + off)
                    } else {
                        let o = self.scratch_top[b];
                        self.scratch_top[b] += len;
                        self.plan.need_scratch(b, self.scratch_top[b]);
                        (Buffer::Scratch, o)
                    };
                    let mut deps = Deps::new();
                    if hop > 0 {
                        deps.push(this_slice[hop - 1]);
                    }
                    if let Some(&p) = prev_slice.get(hop) {
                        deps.push(p);
                    }
                    let id = self.plan.push(Transfer {
                        src: a as u32,
                        src_buf: at.0,
                        src_off: at.1,
                        dst: b as u32,
                        dst_buf: to.0,
                        dst_off: to.1,
                        bytes: len,
                        path: path_between(self.topo, a, b),
                        step: (slice + hop) as u32,
                        deps,
                    });
                    this_slice.push(id);
                    at = to;
                }
                prev_slice = this_slice;
                off += len;
            }
        }
    }
}

/// Lane sizes for `shares` (routes and their bytes) that keep every GPU
/// within `cap` lanes at once (eq. 6 of docs/algorithms-lp.md).
///
/// A route whose fullest link is used to a share `u` of the makespan gets
/// lanes of `L / u` instead of `L` (`base`): its links have room, so fewer,
/// larger lanes still end within the makespan. If a GPU still runs more
/// than `cap` lanes, `L` grows to the smallest size that fits (lanes are
/// counted per GPU, connection and direction, as the MSCCL lowering counts
/// threadblocks: a lane's slices on one hop follow each other, so they take
/// one). Where even one lane per route is too many, routes get one lane
/// each.
fn capped_lanes(topo: &Topology, shares: &[(Vec<usize>, u64)], base: u64, cap: u32) -> Vec<u64> {
    let used = route_use(topo, shares);
    let sizes = |l: u64| -> Vec<u64> {
        used.iter()
            .map(|u| ((l as f64 / u.max(1e-3)) as u64).max(l))
            .collect()
    };
    let most = |l: u64| {
        lanes_per_gpu(topo.ranks(), shares, &sizes(l))
            .into_iter()
            .max()
            .unwrap_or(0)
    };
    let cap = cap as usize;
    if most(base) <= cap {
        return sizes(base);
    }
    let top = shares.iter().map(|x| x.1).max().unwrap_or(base).max(base);
    if most(top) > cap {
        return sizes(top);
    }
    // most(lo) > cap >= most(hi); lanes only shrink as `l` grows.
    let (mut lo, mut hi) = (base, top);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if most(mid) <= cap {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    sizes(hi)
}

/// For every share, the use of its route's fullest link: the load all
/// shares put on it over what it moves in the busiest link's time (1 on a
/// binding link).
fn route_use(topo: &Topology, shares: &[(Vec<usize>, u64)]) -> Vec<f64> {
    let mut load = vec![0.0f64; topo.num_links()];
    let mut path = Vec::new();
    let mut links_of = Vec::with_capacity(shares.len());
    for (gpus, bytes) in shares {
        let mut links = Vec::new();
        for w in gpus.windows(2) {
            path.clear();
            topo.path_into(w[0], w[1], &mut path);
            for &l in &path {
                load[l as usize] += *bytes as f64;
            }
            links.extend_from_slice(&path);
        }
        links_of.push(links);
    }
    let time = load
        .iter()
        .enumerate()
        .map(|(l, &x)| x / topo.link(l as u32).bandwidth)
        .fold(0.0f64, f64::max);
    links_of
        .iter()
        .map(|links| {
            let u = links
                .iter()
                .map(|&l| load[l as usize] / (topo.link(l).bandwidth * time))
                .fold(0.0f64, f64::max);
            if u.is_finite() && u > 0.0 {
                u.min(1.0)
            } else {
                1.0
            }
        })
        .collect()
}

/// Lanes each GPU runs at once when share `i` is cut into lanes of
/// `lane_bytes[i]`: every lane takes one per hop at both of its GPUs.
/// Local copies take none.
fn lanes_per_gpu(n: usize, shares: &[(Vec<usize>, u64)], lane_bytes: &[u64]) -> Vec<usize> {
    let mut per = vec![0usize; n];
    for ((gpus, bytes), &lane) in shares.iter().zip(lane_bytes) {
        let lanes = bytes.div_ceil(lane.max(1)).max(1) as usize;
        for w in gpus.windows(2).filter(|w| w[0] != w[1]) {
            per[w[0]] += lanes;
            per[w[1]] += lanes;
        }
    }
    per
}

/// `total` in `parts` whole pieces that differ by at most one byte.
fn split(total: u64, parts: u64) -> Vec<u64> {
    let parts = parts.clamp(1, total.max(1));
    let (q, r) = (total / parts, total % parts);
    (0..parts).map(|i| q + u64::from(i < r)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::verify_on;

    #[test]
    fn split_is_exact() {
        assert_eq!(split(10, 3), vec![4, 3, 3]);
        assert_eq!(split(2, 5), vec![1, 1]);
        assert_eq!(split(0, 3), vec![0]);
    }

    #[test]
    fn apportion_sums_to_block() {
        let r = |gpus: Vec<usize>, bytes| Route { gpus, bytes };
        let routes = [
            r(vec![0, 2], 1.0),
            r(vec![0, 1, 2], 2.0),
            r(vec![0, 3, 2], 0.001),
        ];
        let got = apportion(0, 2, 1000, &routes);
        assert_eq!(got.len(), 2, "the tiny route is folded in: {got:?}");
        assert_eq!(got.iter().map(|x| x.1).sum::<u64>(), 1000);
        assert_eq!(got[1], (vec![0, 1, 2], 667));
    }

    /// Lanes each GPU runs at once, read off the plan: a transfer starts a
    /// lane on its connection unless it waits for one on the same
    /// connection (the previous slice of its lane).
    fn plan_lanes_per_gpu(plan: &Plan) -> Vec<usize> {
        let mut per = vec![0usize; plan.ranks as usize];
        for t in plan.transfers.iter().filter(|t| t.src != t.dst) {
            let chained = t.deps.iter().any(|&p| {
                let p = &plan.transfers[p as usize];
                (p.src, p.dst) == (t.src, t.dst)
            });
            if !chained {
                per[t.src as usize] += 1;
                per[t.dst as usize] += 1;
            }
        }
        per
    }

    #[test]
    fn lane_cap_holds_and_plan_verifies() {
        use crate::generate::{generate, Pattern, TrafficSpec};
        let topo = Topology::preset("dgx-h100", 2, None).unwrap();
        let mut spec = TrafficSpec::new(16, Pattern::Zipf(1.2));
        spec.seed = 2;
        spec.bytes = 256 << 10;
        let m = generate(&spec).unwrap();
        let free = lp(&topo, &m, &LpOptions::default()).unwrap();
        let most = |p: &Plan| plan_lanes_per_gpu(p).into_iter().max().unwrap();
        let cap = 60;
        assert!(
            most(&free) > cap as usize,
            "the cap must bite: {}",
            most(&free)
        );
        let opts = LpOptions {
            max_lanes_per_gpu: Some(cap),
            ..LpOptions::default()
        };
        let capped = lp(&topo, &m, &opts).unwrap();
        verify_on(&capped, &m, &topo).unwrap();
        assert!(most(&capped) <= cap as usize, "{} lanes", most(&capped));
        // A cap the plan already meets still sizes lanes by route use, and
        // that plan is correct too.
        let loose = LpOptions {
            max_lanes_per_gpu: Some(10_000),
            ..LpOptions::default()
        };
        verify_on(&lp(&topo, &m, &loose).unwrap(), &m, &topo).unwrap();
    }

    /// A self-copy is one transfer however large (it was cut into 4 KiB
    /// lanes: 16,384 transfers for 64 MiB), and the other blocks' lanes and
    /// slices stop growing with the bytes once slices reach their most:
    /// scaling every entry by 2^10 or 2^20 gives plans of one size.
    #[test]
    fn transfers_do_not_grow_with_bytes() {
        let one = Topology::preset("dgx-h100", 1, Some(1)).unwrap();
        let m = TrafficMatrix::from_rows(vec![vec![64 << 20]]);
        let plan = lp(&one, &m, &LpOptions::default()).unwrap();
        verify_on(&plan, &m, &one).unwrap();
        assert_eq!(plan.transfers.len(), 1);
        let topo = Topology::preset("dgx-h100", 2, Some(4)).unwrap();
        let mut m = TrafficMatrix::uniform(8, 1_000);
        m.set(2, 2, 64 << 20);
        m.set(2, 6, 1_234_567);
        let count = |shift: u32, verify: bool| {
            let mut big = m.clone();
            for s in 0..8 {
                for d in 0..8 {
                    big.set(s, d, m.get(s, d) << shift);
                }
            }
            let plan = lp(&topo, &big, &LpOptions::default()).unwrap();
            if verify {
                verify_on(&plan, &big, &topo).unwrap();
            }
            plan.transfers.len()
        };
        let (small, large) = (count(10, true), count(20, false));
        assert_eq!(small, large);
        // 64 blocks, about one lane each, at most 16 slices of 2 hops.
        assert!(small < 64 * 2 * 16 * 2, "{small} transfers");
    }

    /// Whether every hop of `plan` is inside a node or rail to rail.
    fn rail_aligned(plan: &Plan, topo: &Topology) -> bool {
        plan.transfers
            .iter()
            .all(|t| rail_hop(topo, t.src as usize, t.dst as usize))
    }

    #[test]
    fn rail_aligned_plans_hop_rail_to_rail() {
        use crate::generate::{generate, Pattern, TrafficSpec};
        use crate::topology::{FabricSpec, TopologySpec};
        // 4 nodes of 4 GPUs, 2 NICs each (two GPUs a rail), on a 2:1 fat
        // tree of two leaves: the rail planes copy leaves and spine.
        let mut spec = TopologySpec::preset_shape("dgx-h100", 4, Some(4), Some(2)).unwrap();
        spec.fabric = Some(FabricSpec::fat_tree(2, 2.0, 1.0));
        let topo = Topology::from_spec(spec, "t").unwrap();
        let mut ts = TrafficSpec::new(16, Pattern::Zipf(1.2));
        ts.seed = 4;
        ts.bytes = 256 << 10;
        let m = generate(&ts).unwrap();
        let (free, free_r) = lp_with_report(&topo, &m, &LpOptions::default()).unwrap();
        let opts = LpOptions {
            rail_aligned: true,
            ..LpOptions::default()
        };
        let (rails, rails_r) = lp_with_report(&topo, &m, &opts).unwrap();
        verify_on(&free, &m, &topo).unwrap();
        verify_on(&rails, &m, &topo).unwrap();
        assert_eq!(rails_r.status, SolveStatus::Optimal);
        // The restriction bites: the free plan sends across rails.
        assert!(!rail_aligned(&free, &topo));
        assert!(rail_aligned(&rails, &topo));
        // Fewer routes: never a shorter makespan.
        assert!(
            rails_r.makespan_us >= free_r.makespan_us * (1.0 - 1e-6),
            "{} < {}",
            rails_r.makespan_us,
            free_r.makespan_us
        );
        // No flow at all (the limit gone before the network is built):
        // every block still goes rail to rail, relayed where it must be.
        let none = LpOptions {
            time_limit_s: 1e-12,
            ..opts
        };
        let (fallback, r) = lp_with_report(&topo, &m, &none).unwrap();
        assert_eq!(r.status, SolveStatus::NoFlow);
        verify_on(&fallback, &m, &topo).unwrap();
        assert!(rail_aligned(&fallback, &topo));
        assert!(r.relayed_bytes > 0);
    }

    #[test]
    fn small_cluster_is_verified() {
        let topo = Topology::preset("dgx-h100", 2, Some(4)).unwrap();
        let mut m = TrafficMatrix::uniform(8, 100_000);
        m.set(3, 5, 0);
        m.set(2, 6, 1_234_567);
        let (plan, report) = lp_with_report(&topo, &m, &LpOptions::default()).unwrap();
        verify_on(&plan, &m, &topo).unwrap();
        assert_eq!(report.status, SolveStatus::Optimal);
        // The hot pair (2, 6) is spread over other rails by relays.
        assert!(report.relayed_bytes > 0);
    }
}
