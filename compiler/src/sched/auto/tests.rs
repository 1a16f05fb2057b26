//! `auto`'s tests: the choice, its settling and its stickiness, and the
//! estimates against the simulator on hand-checked cases.

use super::estimate::{FAST_ENDS, FAST_TAPER, FAST_TAPER_PATH, ROTATION_DRIFT};
use super::*;
use crate::bound::cut_bound;
use crate::generate::{generate, Pattern, TrafficSpec};
use crate::sched::fast::emit::node_rate;
use crate::sched::fast::replay::fluid_stage_end;
use crate::sched::fast::stages::{StageChains, StagePair};
use crate::sched::{schedule, Options};
use crate::topology::{LinkClass, LinkId};
use crate::verify::verify_on;

fn traffic(ranks: usize, pattern: Pattern, seed: u64) -> TrafficMatrix {
    let mut spec = TrafficSpec::new(ranks, pattern);
    spec.seed = seed;
    spec.gpus_per_node = 4;
    spec.bytes = 1 << 20;
    spec.moe.tokens_per_rank = 1024;
    generate(&spec).unwrap()
}

#[test]
fn the_plan_is_the_named_algorithms_own() {
    let topo = Topology::preset("dgx-h100", 3, Some(4)).unwrap();
    for (i, pattern) in [
        Pattern::Zipf(0.0),
        Pattern::Zipf(1.2),
        Pattern::Hotspot(0.4),
    ]
    .into_iter()
    .enumerate()
    {
        let m = traffic(12, pattern, i as u64);
        for net in [Network::Ideal, Network::Congested] {
            let (plan, choice) = auto(&topo, &m, net).unwrap();
            // For the same network: `fast` sizes its chunks by its
            // per-message cost.
            let opts = Options {
                network: net,
                ..Options::default()
            };
            let named = schedule(choice.algorithm(), &topo, &m, &opts).unwrap();
            assert_eq!(plan, named, "{}", choice.chosen);
            assert_eq!(plan.algorithm, choice.chosen);
            assert_eq!(choice.estimates.len(), CANDIDATES.len());
            assert!(choice
                .estimates
                .windows(2)
                .all(|w| w[0].estimate_us <= w[1].estimate_us));
            verify_on(&plan, &m, &topo).unwrap();
        }
    }
}

/// Candidate `a`'s plan for `m`, simulated.
/// Planned for the mode, as `auto` plans it (`fast`'s chunks).
fn simulated_us(topo: &Topology, m: &TrafficMatrix, opts: &SimOptions, a: Algorithm) -> f64 {
    let plan_opts = Options {
        network: opts.network,
        ..Options::default()
    };
    let p = schedule(a, topo, m, &plan_opts).unwrap();
    simulate(topo, &p, opts).unwrap().completion_us
}

/// The estimates alone (`choose`) pick a plan that simulates within 1%
/// of the best candidate's.
fn assert_alone_within_1pct(topo: &Topology, m: &TrafficMatrix, net: Network) {
    let opts = SimOptions::new(net);
    let best = best_candidate_us(topo, m, &opts);
    let alone = choose(topo, m, net);
    let got = simulated_us(topo, m, &opts, alone.algorithm());
    assert!(got <= best * 1.01, "{} {got} vs best {best}", alone.chosen);
}

/// The fastest of the candidates' plans for `m`, simulated.
fn best_candidate_us(topo: &Topology, m: &TrafficMatrix, opts: &SimOptions) -> f64 {
    CANDIDATES
        .iter()
        .map(|&a| simulated_us(topo, m, opts, a))
        .fold(f64::INFINITY, f64::min)
}

#[test]
fn picks_what_the_simulator_says_is_best() {
    let topo = Topology::preset("dgx-h100", 2, Some(4)).unwrap();
    // Uniform: nothing to balance, `direct` finishes first. One hot
    // receiver: balancing (`fast`) wins by far.
    let mut hot = TrafficMatrix::uniform(8, 64 << 10);
    for s in 0..4 {
        hot.set(s, 5, 8 << 20);
    }
    for m in [TrafficMatrix::uniform(8, 1 << 20), hot] {
        for net in [Network::Ideal, Network::Calibrated, Network::Stress] {
            let opts = SimOptions::new(net);
            let time = |a: Algorithm| simulated_us(&topo, &m, &opts, a);
            let best = best_candidate_us(&topo, &m, &opts);
            let choice = choose(&topo, &m, net);
            let got = time(choice.algorithm());
            assert!(
                got <= best * 1.01,
                "{net}: {} {got} vs best {best}: {choice:?}",
                choice.chosen
            );
            assert!(got >= cut_bound(&topo, &m).cut_us * (1.0 - 1e-9));
        }
    }
}

/// The aggregated network routing (NIC sums, one path per (leaf or
/// group, rail) pair) loads every link and hears every sender as one
/// path per NIC pair does.
#[test]
fn aggregated_routing_matches_a_path_per_nic_pair() {
    use crate::topology::{FabricSpec, TopologySpec};
    for (fabric, nodes) in [
        (None, 3),
        (Some(FabricSpec::fat_tree(2, 2.0, 1.0)), 4),
        (Some(FabricSpec::rail_optimized(Some(2), 2.0, 1.0)), 4),
    ] {
        let mut spec = TopologySpec::preset("dgx-h100", nodes, Some(4)).unwrap();
        spec.fabric = fabric;
        let topo = Topology::from_spec(spec, "t").unwrap();
        let m = traffic(topo.ranks(), Pattern::Hotspot(0.4), 3);
        let mut e = Estimator::new(&topo, &m, Network::Stress);
        // Bytes only: no per-message cost on the egress links.
        e.per_message_us = 0.0;
        e.route_direct();
        e.flush_net();
        let np = e.nodes * e.p;
        let mut load = vec![0.0; topo.num_links()];
        let mut senders = vec![Vec::new(); topo.num_links()];
        for x in 0..np {
            for y in 0..np {
                let b = e.rail_bytes[x * np + y];
                if b == 0.0 {
                    continue;
                }
                let path = topo.path(e.rep[x], e.rep[y]);
                for &l in &path {
                    match topo.link(l).class {
                        LinkClass::PcieIn | LinkClass::PcieOut => {}
                        LinkClass::NicRx => {
                            senders[l as usize].push(path[1]);
                            load[l as usize] += b;
                        }
                        _ => load[l as usize] += b,
                    }
                }
            }
        }
        assert!(load.iter().any(|&b| b > 0.0));
        for (l, (&a, &w)) in e.load.iter().zip(&load).enumerate() {
            assert!((a - w).abs() <= 1e-9 * w.max(1.0), "link {l}: {a} vs {w}");
            assert_eq!(e.senders[l], senders[l], "link {l}");
        }
    }
}

/// Candidate `a`'s estimate and its plan's simulated completion on `m`.
fn estimated_and_simulated(
    topo: &Topology,
    m: &TrafficMatrix,
    net: Network,
    a: Algorithm,
) -> (f64, f64) {
    let choice = choose(topo, m, net);
    let est = choice.estimate_of(a).unwrap();
    (est, simulated_us(topo, m, &SimOptions::new(net), a))
}

/// Two 4-GPU nodes, one per leaf of a 2:1 fat-tree (the uplink carries
/// two NICs' rate), and four writes across it, each to its sender's own
/// local index: GPU 0 sends 4 MiB, GPUs 1-3 2 MiB each.
fn uplink_shared_by_four() -> (Topology, TrafficMatrix) {
    use crate::topology::{FabricSpec, TopologySpec};
    let mut spec = TopologySpec::preset("dgx-h100", 2, Some(4)).unwrap();
    spec.fabric = Some(FabricSpec::fat_tree(1, 2.0, 1.0));
    let topo = Topology::from_spec(spec, "t").unwrap();
    let mut m = TrafficMatrix::zeros(8);
    m.set(0, 4, 4 << 20);
    for s in 1..4 {
        m.set(s, 4 + s, 2 << 20);
    }
    (topo, m)
}

/// `deepep` over a 2:1 fat-tree with one node per leaf, every GPU
/// writing to its own local index (no forwards): its network is the
/// uplink shared max-min by the four receiving NICs, by hand: each gets
/// `U / 4 = b / 2` until the 2 MiB writes end at `4 MiB / b`, then the
/// hot one its NIC's `b` for its last 2 MiB: `6 MiB / b` in all, where
/// the uplink's bytes over its rate say `5 MiB / b`.
#[test]
fn deepep_shares_a_fabric_link_as_the_simulator_does() {
    let (topo, m) = uplink_shared_by_four();
    let b = topo.nic_bandwidth();
    let up = (0..topo.num_links() as LinkId)
        .find(|&l| topo.link(l).class == LinkClass::Uplink)
        .unwrap();
    assert_eq!(topo.link(up).bandwidth, 2.0 * b);
    let (inter, hop) = (topo.path_latency(0, 4), topo.path_latency(0, 1));
    let by_hand = (6u64 << 20) as f64 / b + inter + hop;
    let (est, sim) = estimated_and_simulated(&topo, &m, Network::Ideal, Algorithm::Deepep);
    assert!(
        (est - by_hand).abs() <= 1e-6 * by_hand,
        "{est} vs {by_hand}"
    );
    // The plan has no forwards: the simulator says the same, but the hop.
    assert!((est - hop - sim).abs() <= 1e-6 * sim, "{est} vs {sim}");
}

/// `fast` on a 2:1 fat-tree with one node per leaf (uniform 1 MiB
/// pairs, calibrated): the uplink binds, and it carries each lane's
/// `⌈w / G / c⌉` messages plus `FAST_TAPER_PATH` of its taper's (its
/// node stages are three), each `per_message_us` at its NIC's goodput
/// rate, as the simulator charges a message on every link of its path.
/// Where the node stages are one stage, `FAST_TAPER_PATH_ONE_STAGE`:
/// the sweep's 2x8 MI300X fat-tree Zipf 1.0 seed 209, calibrated
/// (`fast` was estimated ahead of `deepep`, 1.023x the best), is right
/// by the estimates alone.
#[test]
fn fast_taper_messages_ride_the_fabric_links() {
    use crate::topology::{FabricSpec, TopologySpec};
    let mut spec = TopologySpec::preset("dgx-h100", 2, None).unwrap();
    spec.fabric = Some(FabricSpec::fat_tree(1, 2.0, 1.0));
    let topo = Topology::from_spec(spec, "t").unwrap();
    let m = TrafficMatrix::uniform(16, 1 << 20);
    let net = Network::Calibrated;
    let e = Estimator::new(&topo, &m, net);
    let cal = SimOptions::new(net).calibration;
    let b = topo.nic_bandwidth();
    let up = (0..topo.num_links() as LinkId)
        .find(|&l| topo.link(l).class == LinkClass::Uplink)
        .unwrap();
    let u = topo.link(up).bandwidth;
    assert_eq!(u, 4.0 * b);
    // Node 0 sends node 1 64 MiB, 8 MiB per lane.
    let share = (8u64 << 20) as f64;
    let (pairs, rotated) = e.fast_stages();
    assert!(pairs.iter().any(|p| p.stage > 0), "stages: {pairs:?}");
    let msgs = (share / e.chunk).ceil() + FAST_TAPER_PATH;
    let message = cal.per_message_us * b * cal.nic_goodput;
    let uplink = ((64u64 << 20) as f64 + 8.0 * msgs * message) / u;
    // Above what the sending NIC takes (its data at goodput, 8 MiB,
    // and all its messages).
    let nic = share / (b * cal.nic_goodput)
        + ((share / e.chunk).ceil() + FAST_TAPER) * cal.per_message_us;
    assert!(uplink > nic, "{uplink} vs {nic}");
    let (p_st, chains) = (
        e.fast_stage_messages(&pairs),
        e.fast_stage_flow(&pairs, rotated),
    );
    let (inter, hop) = (topo.path_latency(0, 8), topo.path_latency(0, 1));
    let by_hand = ((uplink + p_st) * (1.0 + FAST_ENDS)).max(chains) + inter + 2.0 * hop;
    let est = choose(&topo, &m, net).estimate_of(Algorithm::Fast).unwrap();
    assert!(
        (est - by_hand).abs() <= 1e-6 * by_hand,
        "{est} vs {by_hand}"
    );
    // One stage, on the sweep's MI300X case.
    let mut spec = TopologySpec::preset("mi300x", 2, None).unwrap();
    spec.fabric = Some(FabricSpec::fat_tree(1, 2.0, 1.0));
    let topo = Topology::from_spec(spec, "t").unwrap();
    let m = sweep_traffic(&topo, Pattern::Zipf(1.0), 209);
    let e = Estimator::new(&topo, &m, net);
    assert!(e.fast_stages().0.iter().all(|p| p.stage == 0));
    assert_alone_within_1pct(&topo, &m, net);
}

/// A fat-tree leaf uplink shared max-min fairly: one node per leaf at
/// 2:1, one transfer per rail, the rail-0 receiver hot. While all four
/// move, each gets a quarter of the uplink (half a NIC); once the cold
/// ones end, the hot one alone is held to its NIC and the uplink idles
/// half. `direct`'s estimate follows that (not the uplink's bytes over
/// its capacity, which it exceeds) and equals the simulated time: one
/// link shared by transfers capped by their NICs is what the
/// water-filling computes exactly.
#[test]
fn a_shared_fabric_link_is_priced_as_the_simulator_shares_it() {
    let (topo, m) = uplink_shared_by_four();
    for net in [Network::Ideal, Network::Calibrated] {
        let (est, sim) = estimated_and_simulated(&topo, &m, net, Algorithm::Direct);
        assert!((est - sim).abs() <= 1e-6 * sim, "{net}: {est} vs {sim}");
    }
    // The uplink alone would say less: 10 MiB over two NICs' rate.
    let up = (0..topo.num_links() as LinkId)
        .find(|&l| topo.link(l).class == LinkClass::Uplink)
        .unwrap();
    let plain = (10u64 << 20) as f64 / topo.link(up).bandwidth + topo.path_latency(0, 4);
    let (est, _) = estimated_and_simulated(&topo, &m, Network::Ideal, Algorithm::Direct);
    assert!(est > 1.1 * plain, "{est} vs {plain}");
}

/// `deepep`'s forwards wait for the write they come in: two writes on
/// their own rails land at different times and both forward into GPU
/// 6, whose NVLink ingress takes them one after the other. The estimate
/// (writes, then forwards queued on that link by release time) equals
/// the simulated time; the old `½ X_fwd / b_gpu` lag was short of it.
#[test]
fn deepep_forwards_wait_for_their_writes() {
    let topo = Topology::preset("dgx-h100", 2, Some(4)).unwrap();
    let mut m = TrafficMatrix::zeros(8);
    m.set(0, 6, 1 << 20);
    m.set(1, 6, 3 << 20);
    for net in [Network::Ideal, Network::Calibrated] {
        let (est, sim) = estimated_and_simulated(&topo, &m, net, Algorithm::Deepep);
        assert!((est - sim).abs() <= 1e-6 * sim, "{net}: {est} vs {sim}");
    }
}

/// Regression (the sweep's 2x8 DGX-H100, MoE Zipf 0): in the calibrated
/// mode `fast`'s many chunks pay 3 us each and `deepep` wins; estimates
/// without the per-message cost chose `fast`, 1.20x the best.
#[test]
fn calibrated_mode_prices_messages() {
    let topo = Topology::preset("dgx-h100", 2, None).unwrap();
    let mut spec = TrafficSpec::new(topo.ranks(), Pattern::Zipf(0.0));
    spec.seed = 7;
    spec.gpus_per_node = topo.gpus_per_node();
    spec.bytes = 1 << 20;
    spec.moe.tokens_per_rank = 1024;
    let m = generate(&spec).unwrap();
    let opts = SimOptions::new(Network::Calibrated);
    let plan_opts = Options {
        network: Network::Calibrated,
        ..Options::default()
    };
    let time = |a: Algorithm| {
        let p = schedule(a, &topo, &m, &plan_opts).unwrap();
        simulate(&topo, &p, &opts).unwrap().completion_us
    };
    let best = CANDIDATES
        .iter()
        .map(|&a| time(a))
        .fold(f64::INFINITY, f64::min);
    let choice = choose(&topo, &m, Network::Calibrated);
    let got = time(choice.algorithm());
    assert!(got <= best * 1.01, "{} {got} vs best {best}", choice.chosen);
}

/// `fast`'s stages each cost every lane a message at least: on 8x8
/// DGX-H100, near-uniform MoE traffic (the sweep's Zipf 0), its ~25
/// stages send ~12% more NIC time in messages in the calibrated mode
/// than the node pairs sent in one piece would. Without that term the
/// estimate was 0.89 of the simulated time (where `fast` is 1.25x
/// `deepep`: an estimate that low can rank it first); with it,
/// within 4%. In `ideal` there is no per-message cost and the term
/// is 0.
#[test]
fn fast_pays_a_message_per_lane_and_stage() {
    let topo = Topology::preset("dgx-h100", 8, None).unwrap();
    let m = sweep_traffic(&topo, Pattern::Zipf(0.0), 7);
    let (est, sim) = estimated_and_simulated(&topo, &m, Network::Calibrated, Algorithm::Fast);
    assert!(
        (sim / est - 1.0).abs() < 0.04,
        "fast: estimated {est}, simulated {sim}"
    );
    let choice = choose(&topo, &m, Network::Calibrated);
    let fast = choice
        .estimates
        .iter()
        .find(|e| e.algorithm == "fast")
        .unwrap();
    assert!(fast.limit.contains("stage messages"), "{}", fast.limit);
    let mut e = Estimator::new(&topo, &m, Network::Ideal);
    assert_eq!(e.fast_stage_messages(&e.fast_stages().0), 0.0);
    e = Estimator::new(&topo, &m, Network::Calibrated);
    let base = e.estimate(Algorithm::Fast).estimate_us;
    let extra = e.fast_stage_messages(&e.fast_stages().0);
    assert!(
        extra > 0.08 * base && extra < 0.16 * base,
        "{extra} of {base}"
    );
}

/// A residual of the per-batch choice pinned (issue 20 §5): on the
/// sweep's 4x8 DGX-H100 fat-tree 2:1 with two nodes per leaf (Zipf
/// 0.5, ideal), `fast`'s estimate carried a fixed +15% for leaf
/// uplinks that bind (1.18x its busiest link, simulated 1.04x), so the
/// estimates alone chose `deepep`, 1.034x the best. `fast`'s layered
/// stages balance the uplinks; its estimate now follows its stages'
/// chains, and the estimates alone pick within 1% of the best
/// of the others. (Since `spray` chains each lane's sends its plan is
/// the best here, 366.7 us against `fast`'s 371.2, and the estimates
/// alone still pick `fast`, 1.2% behind: one of the misses recorded in
/// docs/benchmarks.md, "`spray` pipelines each relayed block into its
/// forward".)
#[test]
fn fast_on_leaf_pairs_is_estimated_by_its_stages() {
    use crate::topology::{FabricSpec, TopologySpec};
    let mut spec = TopologySpec::preset("dgx-h100", 4, None).unwrap();
    spec.fabric = Some(FabricSpec::fat_tree(2, 2.0, 1.0));
    let topo = Topology::from_spec(spec, "t").unwrap();
    let m = sweep_traffic(&topo, Pattern::Zipf(0.5), 8);
    let opts = SimOptions::new(Network::Ideal);
    let best = CANDIDATES
        .iter()
        .filter(|&&a| a != Algorithm::Spray)
        .map(|&a| simulated_us(&topo, &m, &opts, a))
        .fold(f64::INFINITY, f64::min);
    let alone = choose(&topo, &m, Network::Ideal);
    let got = simulated_us(&topo, &m, &opts, alone.algorithm());
    assert!(got <= best * 1.01, "{} {got} vs best {best}", alone.chosen);
    let (est, sim) = estimated_and_simulated(&topo, &m, Network::Ideal, Algorithm::Fast);
    assert!(
        (sim / est - 1.0).abs() < 0.05,
        "fast: estimated {est}, simulated {sim}"
    );
}

/// 4x8 DGX-H100 fat-tree 2:1 (two nodes per leaf), MoE Zipf 1.5 seed
/// 110, ideal: node 0 receives 202 MB (its NICs are the cut), 134 MB
/// of it from the other leaf, whose downlink (one node's rate) also
/// carries node 1's crossing receipts; in the stages where both run
/// the hot node's NICs take half their rate, and `fast` simulated
/// 1.170 of the bound where the busiest link and the stage chains
/// said 1.034 (the sweep's worst miss, issue 20 §5). Its stages
/// replayed as flows over the leaves' links (`fast_stage_replay`)
/// put it within 2%, and the estimates alone then pick within 1% of
/// the best (`spray`).
#[test]
fn a_hot_receivers_shared_downlink_is_in_fasts_estimate() {
    use crate::topology::{FabricSpec, TopologySpec};
    let mut spec = TopologySpec::preset("dgx-h100", 4, None).unwrap();
    spec.fabric = Some(FabricSpec::fat_tree(2, 2.0, 1.0));
    let topo = Topology::from_spec(spec, "t").unwrap();
    let m = sweep_traffic(&topo, Pattern::Zipf(1.5), 110);
    let (est, sim) = estimated_and_simulated(&topo, &m, Network::Ideal, Algorithm::Fast);
    assert!(
        (sim / est - 1.0).abs() < 0.02,
        "fast: estimated {est}, simulated {sim}"
    );
    let e = choose(&topo, &m, Network::Ideal);
    let fast = e.estimates.iter().find(|e| e.algorithm == "fast").unwrap();
    assert!(fast.limit.contains("leaf links"), "{}", fast.limit);
    assert_alone_within_1pct(&topo, &m, Network::Ideal);
}

/// [`fluid_stage_end`] by hand: two leaves of two nodes, each leaf's
/// fabric links one node's rate. Nodes 2 and 3 send `w` to nodes 0
/// and 1 at once: both cross into leaf 0, whose downlink halves them
/// (2w / rate). Without fabric links, w / rate. The same pair then
/// followed by node 0 sending to node 1 inside the leaf: it waits for
/// node 1's receipt unless the window lets it overlap.
#[test]
fn fluid_stage_end_shares_a_leafs_downlink() {
    let pair = |stage, src_node, dst_node, bytes| StagePair {
        stage,
        src_node,
        dst_node,
        bytes,
    };
    let (w, rate) = (1000u64, 10.0);
    let leaf = [0, 0, 1, 1];
    let crossing = [pair(0, 2, 0, w), pair(0, 3, 1, w)];
    let end = fluid_stage_end(4, &crossing, &leaf, &[rate; 2], rate, 0.0);
    assert!((end - 200.0).abs() < 1e-6, "{end}");
    let end = fluid_stage_end(4, &crossing, &leaf, &[], rate, 0.0);
    assert!((end - 100.0).abs() < 1e-6, "{end}");
    // One crossing pair alone gets the whole downlink.
    let end = fluid_stage_end(4, &crossing[..1], &leaf, &[rate; 2], rate, 0.0);
    assert!((end - 100.0).abs() < 1e-6, "{end}");
    // Then 0 -> 1 (in the leaf): after node 1's receipt, at 200 + 100.
    let mut then = crossing.to_vec();
    then.push(pair(1, 0, 1, w));
    let end = fluid_stage_end(4, &then, &leaf, &[rate; 2], rate, 0.0);
    assert!((end - 300.0).abs() < 1e-6, "{end}");
    // With a window of `w`, it starts at once and shares node 1's
    // ingress with 3 -> 1 (each 5): 3 -> 1 gets the downlink's other
    // 5, so both of node 1's flows and 2 -> 0 end at 200.
    let end = fluid_stage_end(4, &then, &leaf, &[rate; 2], rate, w as f64);
    assert!((end - 200.0).abs() < 1e-6, "{end}");
}

/// Without fabric links and without a window, [`fluid_stage_end`] is
/// the stage chains' dataflow ([`StageChains::end`]): each node sends
/// and receives one pair at a time, at the node's rate.
#[test]
fn fluid_stage_end_without_fabric_is_the_stage_chains() {
    let mut x = 12345u64;
    let mut next = |n: u64| {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (x >> 33) % n
    };
    for _ in 0..20 {
        let nodes = 5;
        let mut pairs = Vec::new();
        for stage in 0..8 {
            // A random partial permutation: a shifted identity, some
            // pairs left out.
            let k = 1 + next(nodes as u64 - 1) as u32;
            for a in 0..nodes as u32 {
                if next(4) > 0 {
                    pairs.push(StagePair {
                        stage,
                        src_node: a,
                        dst_node: (a + k) % nodes as u32,
                        bytes: 1 + next(1000),
                    });
                }
            }
        }
        let chains = StageChains::default().end(nodes, &pairs, 7.0, 8.0, 100.0, 0.0);
        let fluid = fluid_stage_end(nodes, &pairs, &[0; 5], &[], 7.0, 0.0);
        assert!(
            (fluid - chains).abs() < 1e-6 * chains,
            "{fluid} vs {chains}"
        );
    }
}

/// `spray` sends everything at once, so its hot receivers' forwards
/// wait for the writes that carry them and queue on their NVLink
/// ports after most of the network is done. On the sweep's 2x8
/// DGX-H100 (ideal, Zipf 1.0 and hotspot 0.3) the old `1.05 + 0.12 ln
/// ρ` put `spray` 1.10-1.12x short of its simulated time; the
/// forwards' queues (`spray_forwards`) were within 4%. Since `spray`
/// chains each lane's sends (its forwards released as the sends land)
/// its plans are 1.014 / 1.043 of the estimate (Zipf / hotspot): within 5%.
#[test]
fn spray_is_estimated_by_its_forwards() {
    let topo = Topology::preset("dgx-h100", 2, None).unwrap();
    for (pattern, seed) in [(Pattern::Zipf(1.0), 9), (Pattern::Hotspot(0.3), 12)] {
        let m = sweep_traffic(&topo, pattern, seed);
        let (est, sim) = estimated_and_simulated(&topo, &m, Network::Ideal, Algorithm::Spray);
        assert!(
            (sim / est - 1.0).abs() < 0.05,
            "{pattern:?}: spray estimated {est}, simulated {sim}"
        );
        let choice = choose(&topo, &m, Network::Ideal);
        let e = choice
            .estimates
            .iter()
            .find(|e| e.algorithm == "spray")
            .unwrap();
        assert!(e.limit.starts_with("forwards into gpu"), "{}", e.limit);
    }
}

/// On a mesh, `fast`'s and `spray`'s relief pass moves intra-node
/// blocks and forwards off the busiest links through a third GPU. On
/// the sweep's 2x8 MI300X intra-skew 1.2 (ideal) the hot GPU pair's
/// link, priced as routed, put `fast` at 0.67x its simulated time (and
/// `spray`, once its forwards replaced its old constant, ahead of
/// `fast`: 1.29x the best). Relieved as the pass relieves it, the
/// link falls below the NICs, `fast` is within 15% of its simulated
/// time, and the estimates alone pick within 1% of the best.
#[test]
fn mesh_links_are_priced_after_the_relief_pass() {
    let topo = Topology::preset("mi300x", 2, None).unwrap();
    let m = sweep_traffic(&topo, Pattern::IntraSkew(1.2), 13);
    let (est, sim) = estimated_and_simulated(&topo, &m, Network::Ideal, Algorithm::Fast);
    assert!(
        (sim / est - 1.0).abs() < 0.15,
        "fast: estimated {est}, simulated {sim}"
    );
    assert_alone_within_1pct(&topo, &m, Network::Ideal);
}

/// A residual pinned: on the sweep's 2x8 MI300X (calibrated, Zipf 0),
/// `hierarchical`'s relay lag counted only the relayed bytes, while its
/// phase 1 shares each mesh link with the intra-node block sent at
/// once: estimated 0.92x its simulated time, it was chosen at 1.072x
/// the best. With the intra-node blocks in the lag it is within 5%,
/// and the estimates alone pick within 1% of the best.
#[test]
fn relay_lag_counts_the_intra_node_blocks() {
    let topo = Topology::preset("mi300x", 2, None).unwrap();
    let m = sweep_traffic(&topo, Pattern::Zipf(0.0), 7);
    let net = Network::Calibrated;
    assert_alone_within_1pct(&topo, &m, net);
    let (est, sim) = estimated_and_simulated(&topo, &m, net, Algorithm::Hierarchical);
    assert!(
        (sim / est - 1.0).abs() < 0.05,
        "hierarchical: estimated {est}, simulated {sim}"
    );
}

/// `fast`'s rotation stages (whole node pairs) are priced on their
/// chains with each pair stretched by [`ROTATION_DRIFT`] of its bytes,
/// up to a lane's sends in flight (issue 20 §5): by hand on the
/// rotation of a circulant node matrix, whose every stage moves equal
/// pairs, so the chains run in lock-step and end at
/// `Σ_k (w_k + d min(w_k, 4 G c)) / rate`. And the sweep's 8x8
/// DGX-H100 Zipf 0 seed 7 (full bisection, ideal), where `fast` takes
/// the rotation: its estimate said 1.036x the bound against 1.069x
/// simulated, so the estimates alone chose it at 1.012x the best
/// (`direct`); now within 1%.
#[test]
fn fast_rotation_stages_are_priced_with_their_lanes_drift() {
    use crate::topology::TopologySpec;
    let mut spec = TopologySpec::preset("dgx-h100", 8, None).unwrap();
    spec.fabric = None;
    let topo = Topology::from_spec(spec, "t").unwrap();
    let m = sweep_traffic(&topo, Pattern::Zipf(0.0), 7);
    let e = Estimator::new(&topo, &m, Network::Ideal);
    assert!(e.fast_stages().1, "fast takes the rotation here");
    let n = 8u32;
    let mut pairs = Vec::new();
    let w: Vec<u64> = (1..n as u64).map(|k| k << 23).collect();
    for (s, &bytes) in w.iter().enumerate() {
        for a in 0..n {
            let (stage, k) = (s as u32, s as u32 + 1);
            pairs.push(StagePair {
                stage,
                src_node: a,
                dst_node: (a + k) % n,
                bytes,
            });
        }
    }
    let rate = node_rate(&topo);
    let plain: f64 = w.iter().map(|&x| x as f64 / rate).sum();
    // Lanes' sends in flight: 4 chunks of each of the 8 lanes. The
    // larger stages are held to them (the test's point: both kinds).
    let window = 4.0 * e.chunk * 8.0;
    assert!(w.iter().any(|&x| x as f64 > window) && (w[0] as f64) < window);
    let drift: f64 = w
        .iter()
        .map(|&x| ROTATION_DRIFT * (x as f64).min(window) / rate)
        .sum();
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b;
    let got = e.fast_stage_flow(&pairs, false);
    assert!(close(got, plain), "{got} vs {plain}");
    let got = e.fast_stage_flow(&pairs, true);
    assert!(close(got, plain + drift), "{got} vs {}", plain + drift);
    // The sweep's case: the estimates alone within 1% of the best.
    assert_alone_within_1pct(&topo, &m, Network::Ideal);
}

/// Where a fabric link binds, `deepep`'s landings are stretched only
/// for the writes whose path crosses it: on a 4x8 fat-tree 2:1 (two
/// nodes per leaf), with leaf 1's uplink binding, the writes from
/// nodes 2 and 3 to nodes 0 and 1, so that the latest of them lands
/// with the link; every other write keeps its NICs' time. The
/// sweep's 4x8 MI300X fat-tree Zipf 0.5 seed 108, calibrated (`fast`
/// was estimated ahead of `deepep`, 1.021x the best), is right by the
/// estimates alone.
#[test]
fn deepep_landings_stretch_only_over_the_binding_fabric_link() {
    use crate::topology::{FabricSpec, TopologySpec};
    let cluster = |preset: &str| {
        let mut spec = TopologySpec::preset(preset, 4, None).unwrap();
        spec.fabric = Some(FabricSpec::fat_tree(2, 2.0, 1.0));
        Topology::from_spec(spec, "t").unwrap()
    };
    let topo = cluster("dgx-h100");
    let m = sweep_traffic(&topo, Pattern::Zipf(0.5), 108);
    let e = Estimator::new(&topo, &m, Network::Calibrated);
    let u = (0..topo.num_links() as LinkId)
        .find(|&l| topo.link_name(l) == "leaf1->spine")
        .unwrap();
    let (g, nodes) = (8, 4);
    let mut land = vec![0.0; g * nodes * nodes];
    for s in 0..g * nodes {
        for b in (0..nodes).filter(|&b| b != s / g) {
            land[s * nodes + b] = 10.0 + s as f64;
        }
    }
    let before = land.clone();
    e.stretch_over(u, 100.0, &mut land);
    // The latest crossing write: GPU 31 (node 3), 41 us.
    let stretch = 100.0 / 41.0;
    for s in 0..g * nodes {
        for b in (0..nodes).filter(|&b| b != s / g) {
            let w = s * nodes + b;
            let want = if s / g >= 2 && b < 2 {
                before[w] * stretch
            } else {
                before[w]
            };
            assert!(
                (land[w] - want).abs() < 1e-9,
                "{s} -> node {b}: {}",
                land[w]
            );
        }
    }
    let topo = cluster("mi300x");
    let m = sweep_traffic(&topo, Pattern::Zipf(0.5), 108);
    assert_alone_within_1pct(&topo, &m, Network::Calibrated);
}

/// `fast`'s node stages are one stage (2 nodes, each pair whole):
/// where a NIC binds, its pipeline ends cost [`FAST_ENDS_ONE_STAGE`],
/// not [`FAST_ENDS`]; on a 2:1 fat-tree, where the uplink binds, the
/// full ends stay. The sweep's 2x8 DGX-H100 full-bisection Zipf 0 seed
/// 207 (`direct` was estimated ahead of `fast`, 1.015x the best) is
/// right by the estimates alone.
#[test]
fn one_stage_fast_pays_its_pipeline_ends_alone() {
    use crate::topology::{FabricSpec, TopologySpec};
    let cluster = |fat_tree: bool| {
        let mut spec = TopologySpec::preset("dgx-h100", 2, None).unwrap();
        spec.fabric = fat_tree.then(|| FabricSpec::fat_tree(1, 2.0, 1.0));
        Topology::from_spec(spec, "t").unwrap()
    };
    let fast_limit = |topo: &Topology, m: &TrafficMatrix, net: Network| {
        let mut e = Estimator::new(topo, m, net);
        assert_eq!(e.fast_stages().0.iter().map(|p| p.stage).max(), Some(0));
        e.estimate(Algorithm::Fast).limit
    };
    let topo = cluster(false);
    let m = sweep_traffic(&topo, Pattern::Zipf(0.0), 207);
    let limit = fast_limit(&topo, &m, Network::Ideal);
    assert!(limit.contains("+1.5% pipeline ends"), "{limit}");
    assert_alone_within_1pct(&topo, &m, Network::Ideal);
    // One stage, the uplink binds: the full ends.
    let topo = cluster(true);
    let m = sweep_traffic(&topo, Pattern::Hotspot(0.3), 12);
    let limit = fast_limit(&topo, &m, Network::Calibrated);
    assert!(
        limit.contains("spine") && limit.contains("+3.0% pipeline ends"),
        "{limit}"
    );
}

/// The sweep's traffic (examples/auto_sweep.rs): 8 GPUs per node,
/// 1 MiB per pair on average, 1024 MoE tokens per rank.
fn sweep_traffic(topo: &Topology, pattern: Pattern, seed: u64) -> TrafficMatrix {
    let mut spec = TrafficSpec::new(topo.ranks(), pattern);
    spec.seed = seed;
    spec.gpus_per_node = topo.gpus_per_node();
    spec.bytes = 1 << 20;
    spec.moe.tokens_per_rank = 1024;
    generate(&spec).unwrap()
}

/// Regressions (the sweep's misses by the estimates alone, 4x8
/// DGX-H100, calibrated): on a fat-tree 2:1 with two nodes per leaf,
/// `fast` estimated ahead where `deepep` wins (Zipf 0.5: 1.031x the
/// best) and where `spray` wins (log-normal: 1.028x); with full
/// bisection, `fast` over `deepep` (Zipf 0.5, seeds 8 and 108: up to
/// 1.013x); intra-skew on the fat-tree (the fat-tree Zipf 0.5 and the
/// full-bisection ones are right by the estimates alone since `fast`'s
/// taper rides the uplinks). With full bisection in `ideal`, Zipf 0
/// seed 207: `fast` (rotation stages) estimated ahead of `direct` at
/// 4x8 (1.017x the best), `direct` ahead of `fast` at 2x8 (1.015x);
/// both right by the estimates alone since `fast`'s rotations run the
/// swap first and its one-stage ends are 1.5%. Seed 307 (held out in
/// issue 20 §5 of 2026-12-04): 4x8 full bisection Zipf 0 in `ideal`,
/// `direct` ahead of `fast` (1.019x; right by the estimates alone since
/// `fast` takes its rotation stages there, issue 20 §5 of 2026-12-05),
/// Zipf 1.0 (seed 309) in `ideal`, `fast` ahead of `spray` (1.014x),
/// and the fat-tree log-normal (seed 311), calibrated, `fast` ahead of
/// `spray` (1.015x; right by the estimates alone since, with a
/// per-message cost, `fast`'s chains are taken halfway to its replay over
/// the leaf links where that ends sooner, issue 20 §5 of 2026-12-06); the
/// fat-tree Zipf 1.5 (seed 310) and hotspot 0.3 (seed 312), calibrated,
/// `fast` ahead of `spray` (1.021x, 1.011x).
/// The estimates put these within [`TIE_MARGIN`]; the contenders'
/// plans, simulated, settle them. At least two cases must need the
/// tie-break (else this test tests nothing).
#[test]
fn close_calls_are_settled_by_simulating_the_plans() {
    use crate::topology::{FabricSpec, TopologySpec};
    let cluster = |nodes: usize, per_leaf: Option<usize>| {
        let mut spec = TopologySpec::preset("dgx-h100", nodes, None).unwrap();
        spec.fabric = per_leaf.map(|k| FabricSpec::fat_tree(k, 2.0, 1.0));
        Topology::from_spec(spec, "t").unwrap()
    };
    let cases = [
        (
            cluster(4, Some(2)),
            Pattern::Zipf(0.5),
            8,
            Network::Calibrated,
        ),
        (
            cluster(4, Some(2)),
            Pattern::Lognormal(1.0),
            111,
            Network::Calibrated,
        ),
        (
            cluster(4, Some(2)),
            Pattern::IntraSkew(1.2),
            13,
            Network::Calibrated,
        ),
        (cluster(4, None), Pattern::Zipf(0.5), 8, Network::Calibrated),
        (
            cluster(4, None),
            Pattern::Zipf(0.5),
            108,
            Network::Calibrated,
        ),
        (cluster(4, None), Pattern::Zipf(0.0), 207, Network::Ideal),
        (cluster(2, None), Pattern::Zipf(0.0), 207, Network::Ideal),
        (cluster(4, None), Pattern::Zipf(0.0), 307, Network::Ideal),
        (cluster(4, None), Pattern::Zipf(1.0), 309, Network::Ideal),
        (
            cluster(4, Some(2)),
            Pattern::Lognormal(1.0),
            311,
            Network::Calibrated,
        ),
        (
            cluster(4, Some(2)),
            Pattern::Zipf(1.5),
            310,
            Network::Calibrated,
        ),
        (
            cluster(4, Some(2)),
            Pattern::Hotspot(0.3),
            312,
            Network::Calibrated,
        ),
    ];
    let mut settled = 0;
    for (topo, pattern, seed, net) in cases {
        let m = sweep_traffic(&topo, pattern, seed);
        let opts = SimOptions::new(net);
        let best = best_candidate_us(&topo, &m, &opts);
        let alone = choose(&topo, &m, net);
        let (plan, choice) = auto(&topo, &m, net).unwrap();
        let got = simulate(&topo, &plan, &opts).unwrap().completion_us;
        assert!(
            got <= best * 1.01,
            "{pattern:?} {net}: {} {got} vs best {best}: {choice:?}",
            choice.chosen
        );
        assert_eq!(plan.algorithm, choice.chosen);
        if simulated_us(&topo, &m, &opts, alone.algorithm()) > best * 1.01 {
            assert!(!choice.simulated.is_empty(), "{choice:?}");
            settled += 1;
        }
    }
    assert!(settled >= 2, "only {settled} cases needed the tie-break");
}

/// `Planner::new` is `auto` (issue 20): per batch it goes by
/// [`choose`]'s estimates alone (the per-batch time budget); with
/// [`Settle::Sticky`] it settles a close call as [`auto`] does,
/// tie-break included, then keeps that winner (no simulation) for a
/// matrix whose estimates say it holds, and settles again for one that
/// moved too far; `for_algorithm(Auto)` gives rank programs (what
/// `switchyard.torch.AllToAll` runs).
#[test]
fn the_default_planner_is_auto() {
    use crate::planner::{Planner, PlannerOptions, Settle};
    use crate::topology::{FabricSpec, TopologySpec};
    // A close call the estimates alone get wrong (the sweep's 4x8
    // MI300X, rail-optimized 2:1, Zipf 0, ideal: `fast` estimated
    // ahead, `pxn` best by 0.7%).
    let mut spec = TopologySpec::preset("mi300x", 4, None).unwrap();
    spec.fabric = Some(FabricSpec::rail_optimized(None, 2.0, 1.0));
    let topo = Topology::from_spec(spec, "t").unwrap();
    let m = sweep_traffic(&topo, Pattern::Zipf(0.0), 7);
    let mut plan = Plan::new("", 0, 0);
    let mut alone_planner = Planner::new(&topo, PlannerOptions::default()).unwrap();
    assert_eq!(alone_planner.algorithm(), Algorithm::Auto);
    alone_planner.plan_into(&m, &mut plan).unwrap();
    let alone = choose(&topo, &m, Network::Ideal);
    assert_eq!(alone_planner.last_choice(), Some(&alone));
    let want = schedule(alone.algorithm(), &topo, &m, &Options::default()).unwrap();
    assert_eq!(plan.transfers, want.transfers);
    // Sticky: the first call settles as `auto` does ...
    let mut planner = Planner::new(&topo, PlannerOptions::default())
        .unwrap()
        .with_settle(Settle::Sticky(StickyRule::default()));
    planner.plan_into(&m, &mut plan).unwrap();
    let (want, choice) = auto(&topo, &m, Network::Ideal).unwrap();
    assert!(!choice.simulated.is_empty(), "{choice:?}");
    assert_ne!(choice.chosen, alone.chosen, "the case needs the tie-break");
    assert_eq!(planner.last_choice(), Some(&choice));
    assert_eq!(plan.transfers, want.transfers);
    assert_eq!(plan.algorithm, choice.chosen);
    // ... the same estimates keep its winner without a simulation ...
    planner.plan_into(&m, &mut plan).unwrap();
    let kept = planner.last_choice().unwrap();
    assert!(kept.simulated.is_empty(), "{kept:?}");
    assert_eq!(
        (kept.chosen.as_str(), kept.kept_for),
        (choice.chosen.as_str(), Some(1))
    );
    assert_eq!(plan.transfers, want.transfers);
    // ... and a matrix whose estimates moved past the drift limit
    // (twice the bytes) is settled again.
    let mut twice = m.clone();
    for s in 0..m.ranks() {
        for d in 0..m.ranks() {
            twice.set(s, d, 2 * m.get(s, d));
        }
    }
    planner.plan_into(&twice, &mut plan).unwrap();
    let again = planner.last_choice().unwrap();
    assert_eq!(again.kept_for, None);
    assert_eq!(again, &auto(&topo, &twice, Network::Ideal).unwrap().1);
    let mut by_name =
        Planner::for_algorithm(&topo, Algorithm::Auto, PlannerOptions::default()).unwrap();
    let prog = by_name.program(3, &m).unwrap();
    assert!(!prog.ops.is_empty());
}

/// A choice whose estimates are `est` (us), best first, for the
/// [`Sticky`] tests.
fn estimated(est: &[(Algorithm, f64)]) -> AutoChoice {
    let mut estimates: Vec<Estimate> = est
        .iter()
        .map(|&(a, us)| Estimate {
            algorithm: a.name().into(),
            estimate_us: us,
            limit: String::new(),
        })
        .collect();
    estimates.sort_by(|a, b| a.estimate_us.total_cmp(&b.estimate_us));
    AutoChoice {
        chosen: estimates[0].algorithm.clone(),
        network: Network::Ideal,
        estimates,
        simulated: Vec::new(),
        kept_for: None,
    }
}

/// The sticky rule: the winner of a settle is kept while the
/// contenders' estimates, scaled to the settle's simulated times, say
/// it still finishes first; a predicted flip, an estimate moved past
/// the drift limit, a contender not simulated at the settle, or the
/// call limit settles again.
#[test]
fn sticky_keeps_the_winner_until_it_could_flip() {
    use Algorithm::{Deepep, Direct, Fast};
    let rule = StickyRule {
        lead: 0.0,
        slack: 0.0,
        drift: 1.25,
        calls: 4,
    };
    let mut sticky = Sticky::new(rule);
    // Estimates say `deepep`, the simulations `fast` by 5%.
    let first = [(Deepep, 90.0), (Fast, 95.0), (Direct, 200.0)];
    assert_eq!(
        sticky.keep(&mut estimated(&first)),
        None,
        "nothing settled yet"
    );
    let mut settled = estimated(&first);
    settled
        .settle(|a| Ok(if a == Fast { 100.0 } else { 105.0 }))
        .unwrap();
    assert_eq!(settled.chosen, "fast");
    sticky.remember(&settled);
    // The same estimates, or all scaled alike: kept.
    for scale in [1.0, 1.2] {
        let mut c = estimated(&first.map(|(a, t)| (a, t * scale)));
        assert_eq!(sticky.keep(&mut c), Some(Fast));
        assert_eq!(c.chosen, "fast");
        assert!(c.kept_for.is_some());
    }
    // `deepep`'s estimate 4% lower (predicted 100.8 against 100): kept;
    // 6% lower (98.7): it may finish first now, so settle.
    let mut c = estimated(&[(Deepep, 86.4), (Fast, 95.0), (Direct, 200.0)]);
    assert_eq!(sticky.keep(&mut c), Some(Fast));
    let mut c = estimated(&[(Deepep, 84.6), (Fast, 95.0), (Direct, 200.0)]);
    assert_eq!(sticky.keep(&mut c), None);
    assert_eq!(c.chosen, "deepep", "an unkept choice is left as estimated");
    // Every estimate 30% up: past the drift limit.
    let mut c = estimated(&first.map(|(a, t)| (a, t * 1.3)));
    assert_eq!(sticky.keep(&mut c), None);
    // `direct` now a contender, never simulated: settle.
    let mut c = estimated(&[(Deepep, 90.0), (Fast, 95.0), (Direct, 100.0)]);
    assert_eq!(sticky.keep(&mut c), None);
    // Four calls kept (the limit): the fifth settles.
    assert_eq!(sticky.keep(&mut estimated(&first)), Some(Fast));
    assert_eq!(sticky.keep(&mut estimated(&first)), None);
    // A settle starts the count again; a choice without simulations
    // leaves the memory alone.
    sticky.remember(&settled);
    sticky.remember(&estimated(&first));
    let mut c = estimated(&first);
    assert_eq!(sticky.keep(&mut c), Some(Fast));
    assert_eq!(c.kept_for, Some(1));
    // A near tie (`deepep` simulated 0.5% behind) with a 2% lead and
    // 1% slack: kept while `deepep`'s estimate is 0.5% lower, settled
    // again once it is 2% lower.
    let mut sticky = Sticky::new(StickyRule {
        lead: 0.02,
        slack: 0.01,
        ..rule
    });
    let mut near = estimated(&first);
    near.settle(|a| Ok(if a == Fast { 100.0 } else { 100.5 }))
        .unwrap();
    sticky.remember(&near);
    let mut c = estimated(&[(Deepep, 89.55), (Fast, 95.0), (Direct, 200.0)]);
    assert_eq!(sticky.keep(&mut c), Some(Fast));
    let mut c = estimated(&[(Deepep, 88.2), (Fast, 95.0), (Direct, 200.0)]);
    assert_eq!(sticky.keep(&mut c), None);
    assert_eq!(sticky.last_resettle(), Some(Resettle::Flip));
}

#[test]
fn a_links_topology_gets_direct() {
    let topo = Topology::from_json_str(
        r#"{ "name": "ring", "nodes": 1, "gpus_per_node": 2,
             "links": [ { "from": "gpu0", "to": "gpu1", "bandwidth_GBps": 10.0, "latency_us": 1.0 },
                        { "from": "gpu1", "to": "gpu0", "bandwidth_GBps": 10.0, "latency_us": 1.0 } ] }"#,
        "ring",
    )
    .unwrap();
    let m = TrafficMatrix::uniform(2, 100);
    let (plan, choice) = auto(&topo, &m, Network::Ideal).unwrap();
    assert_eq!(choice.chosen, "direct");
    verify_on(&plan, &m, &topo).unwrap();
}
