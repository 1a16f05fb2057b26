//! Hand-computable cases and invariants of the simulator.

use proptest::prelude::*;

use super::*;
use crate::bound::cut_bound;
use crate::generate::{generate, Pattern, TrafficSpec};
use crate::plan::{Buffer, Deps, Path, Transfer};
use crate::sched::direct;
use crate::topology::{FabricSpec, IntraKind, TopologySpec};
use crate::traffic::TrafficMatrix;
use crate::Error;

pub(super) fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

pub(super) fn transfer(src: u32, dst: u32, bytes: u64, deps: &[u32]) -> Transfer {
    Transfer {
        src,
        src_buf: Buffer::Input,
        src_off: 0,
        dst,
        dst_buf: Buffer::Output,
        dst_off: 0,
        bytes,
        path: Path::Nvlink,
        step: 0,
        deps: Deps::from_slice(deps),
    }
}

pub(super) fn plan_of(topo: &Topology, ts: Vec<Transfer>) -> Plan {
    let mut p = Plan::new("test", topo.ranks(), topo.gpus_per_node());
    p.transfers = ts;
    p
}

fn ideal(topo: &Topology, plan: &Plan) -> SimResult {
    simulate(topo, plan, &SimOptions::default()).unwrap()
}

#[test]
fn one_transfer_pays_latency_then_bytes_over_bandwidth() {
    // Two DGX-H100 nodes of one GPU: PCIe, NIC (3 us), NIC, PCIe at 50 GB/s.
    let topo = Topology::preset("dgx-h100", 2, Some(1)).unwrap();
    let r = ideal(&topo, &plan_of(&topo, vec![transfer(0, 1, 5_000_000, &[])]));
    assert!(
        close(r.completion_us, 3.0 + 5e6 / 50_000.0),
        "{}",
        r.completion_us
    );
    assert_eq!(r.transfers[0].start_us, 0.0);
    let path = topo.path(0, 1);
    for &l in &path {
        assert!(close(r.links[l as usize].bytes, 5e6));
        assert!(close(r.links[l as usize].busy_us, 100.0));
        assert!(close(r.utilisation(l), 100.0 / 103.0));
    }
    let hot = r.hottest_links(&topo, 3);
    assert_eq!(hot.len(), 3);
    assert!(hot[0].1.contains("->"));
}

#[test]
fn two_transfers_share_one_link_at_half_rate() {
    // GPU 0 sends to GPUs 1 and 2 of its node: both cross GPU 0's NVLink egress.
    let topo = Topology::preset("dgx-h100", 1, Some(4)).unwrap();
    let b = 9_000_000u64;
    let r = ideal(
        &topo,
        &plan_of(&topo, vec![transfer(0, 1, b, &[]), transfer(0, 2, b, &[])]),
    );
    let each = 1.0 + b as f64 / 225_000.0;
    assert!(close(r.transfers[0].end_us, each));
    assert!(close(r.transfers[1].end_us, each));
    // A third transfer that waits on the first starts when it ends.
    let r = ideal(
        &topo,
        &plan_of(
            &topo,
            vec![
                transfer(0, 1, b, &[]),
                transfer(0, 2, b, &[]),
                transfer(3, 0, b, &[0]),
            ],
        ),
    );
    assert!(close(r.transfers[2].start_us, each));
    assert!(close(r.completion_us, each + 1.0 + b as f64 / 450_000.0));
}

#[test]
fn local_copies_are_instant_and_zero_bytes_pay_latency() {
    let topo = Topology::preset("dgx-h100", 2, Some(1)).unwrap();
    let r = ideal(
        &topo,
        &plan_of(
            &topo,
            vec![transfer(0, 0, 1 << 30, &[]), transfer(0, 1, 0, &[0])],
        ),
    );
    assert_eq!(r.transfers[0].end_us, 0.0);
    assert!(close(r.transfers[1].end_us, 3.0));
    assert!(r.links.iter().all(|l| l.bytes == 0.0));
}

#[test]
fn uniform_all_to_all_on_full_bisection_meets_the_bound() {
    let topo = Topology::preset("dgx-h100", 4, None).unwrap();
    let b = 1 << 20;
    let m = TrafficMatrix::uniform(32, b);
    let r = ideal(&topo, &direct(&topo, &m));
    let lb = cut_bound(&topo, &m);
    // Each NIC carries its GPU's 24 remote blocks at 50 GB/s after 3 us.
    let want = 3.0 + 24.0 * b as f64 / 50_000.0;
    assert!(
        (r.completion_us - want).abs() <= 1e-6 * want,
        "{}",
        r.completion_us
    );
    assert!((lb.cut_us - want).abs() <= 1e-6 * want, "{lb:?}");
}

fn two_leaf_4_to_1() -> Topology {
    let mut spec = TopologySpec::preset("dgx-h100", 4, Some(1)).unwrap();
    spec.fabric = Some(FabricSpec::fat_tree(2, 4.0, 1.0));
    Topology::from_spec(spec, "t").unwrap()
}

#[test]
fn cross_rail_flows_share_the_rail_switch_uplink() {
    // 2 nodes x 2 GPUs x 2 NICs, one rail group, 2:1: rail switch spine
    // links of 2 x 50 / 2 = 50 GB/s.
    let mut spec = TopologySpec::preset("dgx-h100", 2, Some(2)).unwrap();
    spec.fabric = Some(FabricSpec::rail_optimized(None, 2.0, 1.0));
    let topo = Topology::from_spec(spec, "t").unwrap();
    let b = 1_000_000u64;
    // Rank 0 (rail 0) -> rank 3 (rail 1) and rank 2 (rail 0) -> rank 1
    // (rail 1): both climb rail switch 0's one uplink, at 25 GB/s each.
    let mut m = TrafficMatrix::zeros(4);
    m.set(0, 3, b);
    m.set(2, 1, b);
    let plan = direct(&topo, &m);
    let want = 5.0 + 2.0 * b as f64 / 50_000.0;
    for network in [Network::Ideal, Network::Congested, Network::Stress] {
        let opts = SimOptions::uncalibrated(network);
        let r = simulate(&topo, &plan, &opts).unwrap();
        assert!(
            close(r.completion_us, want),
            "{network:?}: {}",
            r.completion_us
        );
    }
    // Same rail: one switch, the NICs' own rate.
    let mut m = TrafficMatrix::zeros(4);
    m.set(0, 2, b);
    m.set(1, 3, b);
    let r = ideal(&topo, &direct(&topo, &m));
    assert!(
        close(r.completion_us, 4.0 + b as f64 / 50_000.0),
        "{}",
        r.completion_us
    );
}

#[test]
fn oversubscribed_uplink_is_the_bottleneck() {
    let topo = two_leaf_4_to_1();
    let b = 2_000_000u64;
    let m = TrafficMatrix::uniform(4, b);
    let r = ideal(&topo, &direct(&topo, &m));
    // Four cross-leaf flows share an uplink of 2 x 50 / 4 = 25 GB/s; path
    // latency 3 + 1 (NIC, fabric) + 1 (uplink).
    let want = 5.0 + 4.0 * b as f64 / 25_000.0;
    assert!(close(r.completion_us, want), "{}", r.completion_us);
    let lb = cut_bound(&topo, &m);
    assert!(close(lb.cut_us, want), "{lb:?}");
    let hot = r.hottest_links(&topo, 1);
    assert!(
        hot[0].1.contains("spine"),
        "hottest link should be an uplink or downlink: {hot:?}"
    );
}

/// Nine one-GPU nodes: `incast` sends 8 x `b` into rank 0 from ranks 1..=8;
/// `permutation` sends the same 8 x `b` from rank 1 to rank 0 in one transfer.
fn incast_and_permutation(b: u64) -> (Topology, Plan, Plan) {
    let topo = Topology::preset("dgx-h100", 9, Some(1)).unwrap();
    let incast = plan_of(&topo, (1..=8).map(|s| transfer(s, 0, b, &[])).collect());
    let perm = plan_of(&topo, vec![transfer(1, 0, 8 * b, &[])]);
    (topo, incast, perm)
}

#[test]
fn incast_is_free_in_ideal_mode_and_slow_in_stress_mode() {
    let b = 4_000_000;
    let (topo, incast, perm) = incast_and_permutation(b);
    let want = 3.0 + 8.0 * b as f64 / 50_000.0;
    let i = ideal(&topo, &incast).completion_us;
    let p = ideal(&topo, &perm).completion_us;
    assert!(close(i, want) && close(p, want), "{i} {p} {want}");
    let cong = SimOptions::uncalibrated(Network::Stress);
    let ic = simulate(&topo, &incast, &cong).unwrap().completion_us;
    let pc = simulate(&topo, &perm, &cong).unwrap().completion_us;
    assert!(close(pc, want), "a single sender is no incast: {pc}");
    let eff = cong.congestion.efficiency(8);
    assert!(close(ic, 3.0 + 8.0 * b as f64 / (50_000.0 * eff)), "{ic}");
    assert!(ic > 1.2 * i, "incast should be clearly slower: {ic} vs {i}");
}

#[test]
fn head_of_line_blocking_slows_a_senders_other_flows() {
    // Ranks 1..=8 all send to rank 0 (incast); rank 1 also sends to rank 2,
    // which is uncongested but shares rank 1's NIC queue.
    let b = 4_000_000;
    let (topo, mut plan, _) = incast_and_permutation(b);
    plan.transfers.push(transfer(1, 2, 8 * b, &[]));
    let victim = plan.transfers.len() - 1;
    let i = ideal(&topo, &plan).transfers[victim].end_us;
    let cong = simulate(&topo, &plan, &SimOptions::uncalibrated(Network::Stress)).unwrap();
    let c = cong.transfers[victim].end_us;
    assert!(c > 1.5 * i, "victim flow should slow down: {c} vs {i}");
    let mut no_hol = SimOptions::uncalibrated(Network::Stress);
    no_hol.congestion.head_of_line = false;
    let n = simulate(&topo, &plan, &no_hol).unwrap().transfers[victim].end_us;
    assert!(n < c, "{n} {c}");
}

#[test]
fn bad_plans_are_errors() {
    let topo = Topology::preset("dgx-h100", 2, Some(1)).unwrap();
    let cyc = plan_of(
        &topo,
        vec![transfer(0, 1, 1, &[1]), transfer(1, 0, 1, &[0])],
    );
    let e = simulate(&topo, &cyc, &SimOptions::default()).unwrap_err();
    assert!(e.to_string().contains("cycle"), "{e}");
    let out = plan_of(&topo, vec![transfer(0, 1, 1, &[7])]);
    let e = simulate(&topo, &out, &SimOptions::default()).unwrap_err();
    assert!(e.to_string().contains("does not exist"), "{e}");
    let other = Topology::preset("dgx-h100", 3, Some(1)).unwrap();
    let e = simulate(&other, &cyc, &SimOptions::default()).unwrap_err();
    assert!(e.to_string().contains("ranks"), "{e}");
    assert!("fast".parse::<Network>().is_err());
    assert_eq!("congested".parse::<Network>().unwrap(), Network::Congested);
    assert_eq!(
        "calibrated".parse::<Network>().unwrap(),
        Network::Calibrated
    );
    assert_eq!("stress".parse::<Network>().unwrap(), Network::Stress);
}

#[test]
fn grouping_tolerance_never_finishes_early() {
    let topo = Topology::preset("dgx-h100", 4, Some(4)).unwrap();
    let mut spec = TrafficSpec::new(16, Pattern::Zipf(1.2));
    spec.seed = 3;
    spec.moe.tokens_per_rank = 256;
    let m = generate(&spec).unwrap();
    let plan = direct(&topo, &m);
    let exact = ideal(&topo, &plan);
    let opts = SimOptions {
        tolerance: Some(0.05),
        ..SimOptions::default()
    };
    let grouped = simulate(&topo, &plan, &opts).unwrap();
    assert!(grouped.events <= exact.events);
    let (e, g) = (exact.completion_us, grouped.completion_us);
    assert!(g >= cut_bound(&topo, &m).cut_us * (1.0 - 1e-9));
    assert!((g - e).abs() <= 0.05 * e, "{g} vs {e}");
}

/// Grouped arrivals: a transfer whose latency ends while another moves
/// starts moving up to ε of its shortest duration later, with the next
/// event, and no later; without grouping it starts at its latency's end.
#[test]
fn grouped_arrivals_start_at_most_eps_of_their_duration_late() {
    // Two nodes of two GPUs: a long NVLink transfer 0 -> 1 moves while a
    // short inter-node one 2 -> 0 arrives, on links of its own.
    let topo = Topology::preset("dgx-h100", 2, Some(2)).unwrap();
    let plan = plan_of(
        &topo,
        vec![
            transfer(0, 1, 400_000_000, &[]),
            transfer(2, 0, 5_000_000, &[]),
        ],
    );
    let eps = 0.5;
    let path = topo.path(2, 0);
    let slowest = path
        .iter()
        .map(|&l| topo.link(l).bandwidth)
        .fold(f64::INFINITY, f64::min);
    let (lat, d) = (topo.path_latency(2, 0), 5e6 / slowest);
    let run = |group_arrivals| {
        let opts = SimOptions {
            tolerance: Some(eps),
            group_arrivals,
            ..SimOptions::default()
        };
        simulate(&topo, &plan, &opts).unwrap()
    };
    let (plain, grouped) = (run(false), run(true));
    assert!(
        close(plain.transfers[1].end_us, lat + d),
        "{:?}",
        plain.transfers[1]
    );
    // Its latency ended while 0 -> 1 moved: it waited for its deadline.
    assert!(
        close(grouped.transfers[1].end_us, lat + (1.0 + eps) * d),
        "{:?}",
        grouped.transfers[1]
    );
    assert_eq!(grouped.transfers[1].start_us, 0.0);
    // The long transfer is not moved by the short one's arrival.
    assert!(close(
        grouped.transfers[0].end_us,
        plain.transfers[0].end_us
    ));
    // At ε = 0 grouping arrivals changes nothing.
    let exact = |group_arrivals| {
        let opts = SimOptions {
            tolerance: Some(0.0),
            group_arrivals,
            ..SimOptions::default()
        };
        simulate(&topo, &plan, &opts).unwrap()
    };
    assert_eq!(exact(true), exact(false));
}

/// On a plan with many arrivals (4 x 8 `fast`, log-normal): grouped
/// arrivals take fewer events, and the completion stays within ε of the
/// exact run's and above the bound; at ε = 0 the run is the exact one.
#[test]
fn grouped_arrivals_take_fewer_events_at_4x8() {
    let topo = Topology::preset("dgx-h100", 4, None).unwrap();
    let mut spec = TrafficSpec::new(topo.ranks(), Pattern::Lognormal(1.0));
    spec.bytes = 1 << 18;
    spec.seed = 3;
    let m = generate(&spec).unwrap();
    let alg: crate::sched::Algorithm = "fast".parse().unwrap();
    let plan = crate::sched::schedule(alg, &topo, &m, &Default::default()).unwrap();
    for network in [Network::Ideal, Network::Calibrated] {
        let run = |tolerance, group_arrivals| {
            let opts = SimOptions {
                tolerance: Some(tolerance),
                group_arrivals,
                ..SimOptions::new(network)
            };
            simulate(&topo, &plan, &opts).unwrap()
        };
        let exact = run(0.0, false);
        assert_eq!(run(0.0, true), exact);
        let finishes = run(0.01, false);
        let both = run(0.01, true);
        assert!(
            both.events < finishes.events,
            "{} vs {}",
            both.events,
            finishes.events
        );
        let (e, g) = (exact.completion_us, both.completion_us);
        assert!((g - e).abs() <= 0.01 * e, "{network}: {g} vs {e}");
        let bound =
            crate::bound::cut_bound_goodput(&topo, &m, SimOptions::new(network).nic_goodput());
        assert!(g >= bound.best_us() * (1.0 - 1e-9));
    }
}

fn small_topology() -> impl Strategy<Value = Topology> {
    (1usize..=4, 1usize..=4, any::<bool>(), 0usize..5).prop_map(|(nodes, g, mesh, fab)| {
        let mut spec =
            TopologySpec::preset(if mesh { "mi300x" } else { "dgx-h100" }, nodes, Some(g)).unwrap();
        if let Some(i) = spec.intra.as_mut() {
            i.kind = if mesh {
                IntraKind::Mesh
            } else {
                IntraKind::Switch
            };
        }
        if (1..3).contains(&fab) && nodes > 1 {
            spec.fabric = Some(FabricSpec::fat_tree(1 + nodes / 3, fab as f64 * 1.5, 0.5));
        }
        if fab >= 3 {
            let group = (fab == 3).then_some(1 + nodes / 3);
            spec.fabric = Some(FabricSpec::rail_optimized(group, 2.0, 0.5));
        }
        Topology::from_spec(spec, "prop").unwrap()
    })
}

fn small_traffic(ranks: usize) -> impl Strategy<Value = TrafficMatrix> {
    (0u64..1000, 0usize..4).prop_map(move |(seed, pat)| {
        let pattern = match pat {
            0 => Pattern::Uniform,
            1 => Pattern::Zipf(1.0),
            2 => Pattern::Hotspot(0.5),
            _ => Pattern::Lognormal(1.0),
        };
        let mut spec = TrafficSpec::new(ranks, pattern);
        spec.seed = seed;
        spec.bytes = 1 << 16;
        spec.moe.tokens_per_rank = 64;
        spec.moe.hidden = 256;
        generate(&spec).unwrap()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// Every algorithm the crate has (schedulers that cannot handle an input
    /// say so and are skipped), both network modes, exact and grouped.
    #[test]
    fn completion_respects_the_bound_and_bytes_are_conserved(
        (topo, m, congested, grouped, arrivals) in small_topology()
            .prop_flat_map(|t| {
                let r = t.ranks();
                (Just(t), small_traffic(r), any::<bool>(), any::<bool>(), any::<bool>())
            })
    ) {
        let lb = cut_bound(&topo, &m);
        for &alg in crate::sched::Algorithm::ALL {
            let plan = match crate::sched::schedule(alg, &topo, &m, &Default::default()) {
                Ok(p) => p,
                Err(Error::Unsupported { .. }) => continue,
                Err(e) => return Err(TestCaseError::fail(format!("{alg}: {e}"))),
            };
            let tolerance = Some(if grouped { 0.05 } else { 0.0 });
            let opts = SimOptions {
                tolerance,
                group_arrivals: arrivals,
                ..SimOptions::new(if congested { Network::Stress } else { Network::Ideal })
            };
            let r = simulate(&topo, &plan, &opts).unwrap();
            prop_assert!(r.completion_us >= lb.best_us() * (1.0 - 1e-9),
                "{alg}: completion {} below bound {:?}", r.completion_us, lb);
            // The calibrated mode against its own (goodput) bound.
            let cal = SimOptions { tolerance, group_arrivals: arrivals, ..SimOptions::new(Network::Calibrated) };
            let c = simulate(&topo, &plan, &cal).unwrap();
            let clb = crate::bound::cut_bound_goodput(&topo, &m, cal.nic_goodput());
            prop_assert!(c.completion_us >= clb.best_us() * (1.0 - 1e-9),
                "{alg}: calibrated completion {} below bound {:?}", c.completion_us, clb);
            prop_assert!(c.completion_us >= r.completion_us * (1.0 - 1e-9) || congested);
            if alg == crate::sched::Algorithm::Fast {
                // `fast` planned for the calibrated network (its per-message
                // cost) stays above that network's bound too.
                let opts = crate::sched::Options { network: Network::Calibrated, ..Default::default() };
                let p = crate::sched::schedule(alg, &topo, &m, &opts).unwrap();
                let c = simulate(&topo, &p, &cal).unwrap();
                prop_assert!(c.completion_us >= clb.best_us() * (1.0 - 1e-9),
                    "fast for calibrated: completion {} below bound {:?}", c.completion_us, clb);
            }
            let mut want = vec![0.0f64; topo.num_links()];
            for t in &plan.transfers {
                for l in topo.path(t.src as usize, t.dst as usize) {
                    want[l as usize] += t.bytes as f64;
                }
            }
            for (l, w) in want.iter().enumerate() {
                let got = r.links[l].bytes;
                prop_assert!((got - w).abs() <= 1e-6 * w.max(1.0),
                    "{alg}: link {l}: {got} vs {w}");
            }
            for (i, t) in r.transfers.iter().enumerate() {
                prop_assert!(t.end_us >= t.start_us, "{alg}: transfer {i}");
                for &d in &plan.transfers[i].deps {
                    prop_assert!(t.start_us >= r.transfers[d as usize].end_us);
                }
            }
        }
    }
}

/// A ring of switches, each with a few GPUs, as a `links` topology.
fn ring_of_switches() -> impl Strategy<Value = Topology> {
    (
        2usize..=4,
        proptest::collection::vec((1usize..=3, 1u32..=100, 0u32..=3), 4),
    )
        .prop_map(|(k, spec)| {
            let mut links = Vec::new();
            let mut gpu = 0;
            for (s, &(gpus, bw, lat)) in spec.iter().take(k).enumerate() {
                for _ in 0..gpus {
                    links.push(format!(
                        r#"{{"from":"gpu{gpu}","to":"sw{s}","bandwidth_GBps":{},"latency_us":{lat},"bidirectional":true}}"#,
                        bw * 2
                    ));
                    gpu += 1;
                }
                links.push(format!(
                    r#"{{"from":"sw{s}","to":"sw{}","bandwidth_GBps":{bw},"latency_us":{lat},"bidirectional":true}}"#,
                    (s + 1) % k
                ));
            }
            let text = format!(
                r#"{{"name":"ring","nodes":{gpu},"gpus_per_node":1,"links":[{}]}}"#,
                links.join(",")
            );
            Topology::from_json_str(&text, "ring").unwrap()
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]
    /// The bound holds on `links` topologies too (GPU, hub and latency cuts).
    #[test]
    fn links_topologies_respect_the_bound(
        (topo, m) in ring_of_switches()
            .prop_flat_map(|t| { let r = t.ranks(); (Just(t), small_traffic(r)) })
    ) {
        let plan = direct(&topo, &m);
        let r = simulate(&topo, &plan, &SimOptions::default()).unwrap();
        let lb = cut_bound(&topo, &m);
        prop_assert!(r.completion_us >= lb.best_us() * (1.0 - 1e-9),
            "completion {} below bound {:?}", r.completion_us, lb);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]
    /// Filling only the flows connected to those that started or finished
    /// gives the same run, to the bit, as filling every moving flow at
    /// every recompute: every algorithm, exact and grouped, in the modes
    /// that refill (ideal and calibrated; congested and stress fill whole).
    #[test]
    fn refills_give_the_whole_fills_run(
        (topo, m, calibrated, grouped, arrivals) in small_topology()
            .prop_flat_map(|t| {
                let r = t.ranks();
                (Just(t), small_traffic(r), any::<bool>(), any::<bool>(), any::<bool>())
            })
    ) {
        for &alg in crate::sched::Algorithm::ALL {
            let plan = match crate::sched::schedule(alg, &topo, &m, &Default::default()) {
                Ok(p) => p,
                Err(Error::Unsupported { .. }) => continue,
                Err(e) => return Err(TestCaseError::fail(format!("{alg}: {e}"))),
            };
            let opts = SimOptions {
                tolerance: Some(if grouped { 0.02 } else { 0.0 }),
                group_arrivals: arrivals,
                ..SimOptions::new(if calibrated { Network::Calibrated } else { Network::Ideal })
            };
            let fast = simulate(&topo, &plan, &opts).unwrap();
            let whole = simulate_reference(&topo, &plan, &opts, Reference::WholeFills).unwrap();
            prop_assert!(fast == whole, "{alg}: refilled and whole-filled runs differ");
        }
    }
}

/// 4 x 8 DGX-H100 on log-normal traffic, and the plans of every
/// rail-aligned algorithm (their rails and nodes are separate components)
/// and `direct` (one component).
fn skewed_4x8_plans() -> (Topology, Vec<(crate::sched::Algorithm, Plan)>) {
    let topo = Topology::preset("dgx-h100", 4, None).unwrap();
    let mut spec = TrafficSpec::new(topo.ranks(), Pattern::Lognormal(1.0));
    spec.bytes = 1 << 18;
    spec.seed = 3;
    let m = generate(&spec).unwrap();
    let plans = ["direct", "hierarchical", "fast", "spray", "pxn"]
        .into_iter()
        .map(|alg| {
            let alg: crate::sched::Algorithm = alg.parse().unwrap();
            let plan = crate::sched::schedule(alg, &topo, &m, &Default::default()).unwrap();
            (alg, plan)
        })
        .collect();
    (topo, plans)
}

/// The same on plans of a size where components matter: 4 x 8 DGX-H100,
/// skewed traffic, every rail-aligned algorithm (their rails and nodes are
/// separate components) and `direct` (one component).
#[test]
fn refills_give_the_whole_fills_run_at_4x8() {
    let (topo, plans) = skewed_4x8_plans();
    for (alg, plan) in plans {
        for opts in [SimOptions::default(), SimOptions::new(Network::Calibrated)] {
            let fast = simulate(&topo, &plan, &opts).unwrap();
            let whole = simulate_reference(&topo, &plan, &opts, Reference::WholeFills).unwrap();
            assert!(fast == whole, "{alg} {}: runs differ", opts.network);
            assert!(fast.events > 100, "{alg}: {} events", fast.events);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]
    /// The kept projections (`Proj`) give the run of a sweep that projects
    /// every moving flow at every event, to the bit: every algorithm,
    /// exact and grouped (finishes, and arrivals too), every network mode
    /// (congested and stress fill whole at every event).
    #[test]
    fn kept_projections_give_the_sweeps_run(
        (topo, m, network, grouped, arrivals) in small_topology()
            .prop_flat_map(|t| {
                let r = t.ranks();
                (Just(t), small_traffic(r), 0usize..4, 0usize..3, any::<bool>())
            })
    ) {
        let network = [Network::Ideal, Network::Calibrated, Network::Congested, Network::Stress][network];
        for &alg in crate::sched::Algorithm::ALL {
            let plan = match crate::sched::schedule(alg, &topo, &m, &Default::default()) {
                Ok(p) => p,
                Err(Error::Unsupported { .. }) => continue,
                Err(e) => return Err(TestCaseError::fail(format!("{alg}: {e}"))),
            };
            let opts = SimOptions {
                tolerance: Some([0.0, 0.02, 0.5][grouped]),
                group_arrivals: arrivals,
                ..SimOptions::new(network)
            };
            let kept = simulate(&topo, &plan, &opts).unwrap();
            let sweep = simulate_reference(&topo, &plan, &opts, Reference::Sweep).unwrap();
            prop_assert!(kept == sweep, "{alg} {network}: runs differ");
        }
    }
}

/// The same at 4 x 8 on skewed traffic (thousands of events, flows that
/// keep their rates over many of them), and on one long chain of events
/// where a flow's projection is kept across more than `REPROJECT` of them.
#[test]
fn kept_projections_give_the_sweeps_run_at_4x8() {
    let (topo, plans) = skewed_4x8_plans();
    for (alg, plan) in plans {
        for network in [Network::Ideal, Network::Calibrated, Network::Congested] {
            for (tolerance, arrivals) in [(0.0, false), (0.01, false), (0.01, true)] {
                let opts = SimOptions {
                    tolerance: Some(tolerance),
                    group_arrivals: arrivals,
                    ..SimOptions::new(network)
                };
                let kept = simulate(&topo, &plan, &opts).unwrap();
                let sweep = simulate_reference(&topo, &plan, &opts, Reference::Sweep).unwrap();
                assert!(kept.events > 100, "{alg}: {} events", kept.events);
                assert!(
                    kept == sweep,
                    "{alg} {network} {tolerance} {arrivals}: runs differ"
                );
            }
        }
    }
    // One long transfer moving while a chain of short ones, one after
    // another on other links, makes an event each.
    let topo = Topology::preset("dgx-h100", 2, Some(2)).unwrap();
    let mut ts = vec![transfer(0, 1, 40_000_000_000, &[])];
    for i in 0..(REPROJECT + 500) {
        let deps: Vec<u32> = if i == 0 { vec![] } else { vec![i] };
        ts.push(transfer(2, 3, 1000 + u64::from(i % 7), &deps));
    }
    let plan = plan_of(&topo, ts);
    let opts = SimOptions::default();
    let kept = simulate(&topo, &plan, &opts).unwrap();
    assert!(kept.events > REPROJECT as usize, "{} events", kept.events);
    assert!(kept == simulate_reference(&topo, &plan, &opts, Reference::Sweep).unwrap());
}
