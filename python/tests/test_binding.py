"""The binding itself: types, errors, and the same results as the CLI."""

import json
import subprocess

import numpy as np
import pytest
import torch

import switchyard
from switchyard import Planner, Topology, VerificationError


def skewed(ranks, seed=0):
    rng = np.random.default_rng(seed)
    m = rng.integers(0, 1 << 16, size=(ranks, ranks), dtype=np.int64)
    m[0, ranks - 1] = 1 << 22  # one hot pair between nodes
    return m


def test_topology_preset_and_properties():
    t = Topology.preset("dgx-h100", 2, gpus_per_node=4, nics_per_node=2)
    assert (t.ranks, t.nodes, t.gpus_per_node, t.nics_per_node) == (8, 2, 4, 2)
    assert t.name == "2x DGX-H100 (4 GPUs, 2 NICs per node)"
    assert Topology.preset("gb200-nvl72", 2).name == "2x GB200-NVL72"
    again = Topology.from_json(t.to_json())
    assert again.to_json() == t.to_json()


def test_topology_errors_are_value_errors(tmp_path):
    with pytest.raises(ValueError, match=r"unknown preset \(known: dgx-a100, dgx-h100, dgx-h200"):
        Topology.preset("dgx-x", 2)
    with pytest.raises(ValueError, match="nodes: must be at least 1"):
        Topology.preset("dgx-h100", 0)
    bad = tmp_path / "t.json"
    bad.write_text('{"name": "x", "nodes": 2}')
    with pytest.raises(ValueError, match=str(bad)):
        Topology.from_json(bad)
    with pytest.raises(ValueError, match="no such file"):
        Topology.from_json(tmp_path / "missing.json")
    xml = tmp_path / "nccl.xml"
    xml.write_text('<system version="1">\n</system>\n')
    # NCCL XML is imported now: a file without GPUs says so.
    with pytest.raises(ValueError, match="has no GPU"):
        Topology.from_json(str(xml))


def test_planner_errors():
    t = Topology.preset("dgx-h100", 2, gpus_per_node=4)
    with pytest.raises(ValueError, match=r"algorithm: unknown algorithm `nope`"):
        Planner(t, "nope")
    with pytest.raises(ValueError, match="time_limit_s: is not an option of `fast`"):
        Planner(t, "fast", time_limit_s=1.0)
    p = Planner(t, "fast")
    with pytest.raises(ValueError, match="row 1, column 2: negative byte count -5"):
        m = np.zeros((8, 8), dtype=np.int64)
        m[1, 2] = -5
        p.plan(m)
    with pytest.raises(ValueError, match="fractional byte count 0.5"):
        p.plan(np.full((8, 8), 0.5))
    with pytest.raises(ValueError, match="must be square"):
        p.plan(np.zeros((8, 7), dtype=np.int64))
    with pytest.raises(ValueError, match="must be square"):
        p.plan([[1, 2], [3]])
    with pytest.raises(ValueError, match="not a byte count"):
        p.plan(np.full((8, 8), np.nan))
    with pytest.raises(ValueError, match="traffic has 4 ranks but the topology has 8 GPUs"):
        p.plan(np.zeros((4, 4), dtype=np.int64))
    with pytest.raises(ValueError, match="byte counts"):
        p.plan([["a"] * 8] * 8)
    plan = p.plan(np.ones((8, 8), dtype=np.int64))
    with pytest.raises(ValueError, match="rank: 8 is not a rank"):
        plan.program(8)
    with pytest.raises(ValueError, match="network: unknown network mode"):
        plan.simulate("lossy")
    with pytest.raises(ValueError, match="layout: unknown layout"):
        plan.to_msccl_xml(layout="weird")


def test_array_likes_give_one_plan():
    t = Topology.preset("dgx-h100", 2, gpus_per_node=4)
    p = Planner(t, "fast")
    m = skewed(8)
    a = p.plan(m).to_json()
    assert p.plan(m.tolist()).to_json() == a
    assert p.plan(torch.from_numpy(m)).to_json() == a
    assert p.plan(m.astype(np.float64)).to_json() == a  # whole floats, as tensor.tolist() gives
    assert p.plan(m.astype(np.uint64)).to_json() == a


def test_plan_surface():
    t = Topology.preset("dgx-h100", 2, gpus_per_node=4)
    plan = Planner(t, "fast").plan(skewed(8))
    assert plan.algorithm == "fast" and plan.ranks == 8
    assert plan.num_transfers == len(json.loads(plan.to_json())["transfers"])
    summary = plan.verify()
    assert summary["transfers"] == plan.num_transfers
    report = plan.simulate()
    for key in ("algorithm", "ranks", "total_bytes", "completion_us", "lower_bound_us",
                "ratio_to_bound", "compile_us", "steps", "transfers", "network"):
        assert key in report
    assert report["ratio_to_bound"] >= 1.0
    assert plan.simulate("congested")["network"] == "congested"
    assert plan.to_msccl_xml().startswith("<algo")


def test_target_msccl_plans_for_the_file():
    """``target="msccl"`` plans ``pairwise`` with only the waits an executor
    holds (a different plan from the round barriers) and ``lp``
    within the executor's lanes; other algorithms' plans are the same; an
    unknown target is an error naming the parameter."""
    t = Topology.preset("dgx-h100", 2, gpus_per_node=4)
    with pytest.raises(ValueError, match="target: unknown value"):
        Planner(t, "direct", target="nccl")
    m = skewed(8, seed=3)
    held = json.loads(Planner(t, "pairwise", target="msccl").plan(m).to_json())
    barrier = json.loads(Planner(t, "pairwise").plan(m).to_json())
    assert held != barrier
    assert held["transfers"] and len(held["transfers"]) == len(barrier["transfers"])
    for alg in ("direct", "fast", "auto"):
        assert (Planner(t, alg, target="msccl").plan(m).to_json()
                == Planner(t, alg).plan(m).to_json())
    Planner(t, "lp", target="msccl", time_limit_s=20).plan(m).verify()


def test_target_msccl_routes_lp_rail_to_rail_where_peers_cannot_fit():
    """``lp`` for a file decides its routes before the solve, as ``compile
    --out plan.xml`` does: on 9 x 8 MI300X (RCCL: 64 threadblocks, 71 peers
    per GPU) every inter-node hop goes rail to rail and the file loads;
    on 32 x 8 its rail-aligned LP is refused at once as too large (not
    solved for its time limit first)."""
    t = Topology.preset("mi300x", 9)
    m = skewed(72, seed=5)
    plan = Planner(t, "lp", target="msccl", time_limit_s=30).plan(m)
    plan.verify()
    hops = [(tr["src"], tr["dst"]) for tr in json.loads(plan.to_json())["transfers"]]
    crossing = [(s, d) for s, d in hops if s // 8 != d // 8]
    assert crossing and all(s % 8 == d % 8 for s, d in crossing)
    assert plan.to_msccl_xml().startswith("<algo")
    # Without target="msccl" the routes are free: some hop leaves its rail.
    free = json.loads(Planner(t, "lp", time_limit_s=30).plan(m).to_json())["transfers"]
    assert any(tr["src"] // 8 != tr["dst"] // 8 and tr["src"] % 8 != tr["dst"] % 8 for tr in free)
    big = Topology.preset("dgx-h100", 32)
    with pytest.raises(ValueError, match="rail-aligned flow LP"):
        Planner(big, "lp", target="msccl", time_limit_s=5).plan(skewed(256, seed=3))


def test_auto_settle_modes():
    """``settle`` is an option of ``auto`` alone; each mode plans a plan that
    verifies, names the algorithm it chose, and (as a reused planner) plans
    again; ``always`` is never slower than the estimates alone."""
    t = Topology.preset("dgx-h100", 2, gpus_per_node=4)
    with pytest.raises(ValueError, match="settle: is not an option of `fast`"):
        Planner(t, "fast", settle="never")
    with pytest.raises(ValueError, match="settle: unknown value"):
        Planner(t, "auto", settle="sometimes")
    m = skewed(8, seed=5)
    times = {}
    for mode in ("never", "sticky", "always"):
        p = Planner(t, "auto", settle=mode, network="ideal")
        for _ in range(2):
            plan = p.plan(m)
            plan.verify()
        assert plan.algorithm in switchyard.algorithms() and plan.algorithm != "auto"
        times[mode] = plan.simulate("ideal")["completion_us"]
        assert p.program(3, m)["rank"] == 3
    assert times["always"] <= times["never"] * (1 + 1e-9)


def test_programs_cover_the_plan():
    """Every transfer appears on both of its ranks, at one level."""
    t = Topology.preset("dgx-h100", 2, gpus_per_node=4)
    plan = Planner(t, "fast").plan(skewed(8, seed=3))
    transfers = json.loads(plan.to_json())["transfers"]
    seen = {}
    for r in range(8):
        prog = plan.program(r)
        assert prog["rank"] == r and prog["scratch_bytes"] == plan.scratch_bytes(r)
        levels = [op["level"] for op in prog["ops"]]
        assert levels == sorted(levels)
        for op in prog["ops"]:
            seen.setdefault(op["transfer"], []).append((op["op"], r, op["level"]))
    for i, tr in enumerate(transfers):
        if tr["bytes"] == 0:
            continue
        sides = seen[i]
        if tr["src"] == tr["dst"]:
            assert [s[0] for s in sides] == ["copy"]
        else:
            assert sorted((s[0], s[1]) for s in sides) == [("recv", tr["dst"]), ("send", tr["src"])]
            assert sides[0][2] == sides[1][2]


@pytest.mark.parametrize("algorithm", ["direct", "hierarchical", "fast"])
def test_own_programs_are_the_plans_slices(algorithm):
    """Planner.program(rank, m): the rank's own transfers of the whole plan,
    named by where they write (docs/formats.md, "Rank program")."""
    t = Topology.preset("dgx-h100", 3, gpus_per_node=2)
    m = skewed(6, seed=5)
    planner = Planner(t, algorithm)
    plan = planner.plan(m)
    fields = ("op", "peer", "bytes", "src_buf", "src_off", "dst_buf", "dst_off")
    for r in range(6):
        own = planner.program(r, m)
        assert own["rank"] == r and own["scratch_bytes"] == plan.scratch_bytes(r)
        keys = [(o["peer"] if o["op"] == "send" else r, o["dst_buf"], o["dst_off"]) for o in own["ops"]]
        assert keys == sorted(keys, key=lambda k: (k[0], ["input", "output", "scratch"].index(k[1]), k[2]))
        got = sorted(tuple(o[f] for f in fields) for o in own["ops"])
        want = sorted(tuple(o[f] for f in fields) for o in plan.program(r)["ops"])
        assert got == want
    with pytest.raises(ValueError, match="not a rank"):
        planner.program(6, m)
    with pytest.raises(ValueError, match="no rank programs|per-batch planner"):
        Planner(t, "pairwise").program(0, m)


@pytest.mark.parametrize("algorithm", ["direct", "hierarchical", "pxn", "deepep"])
def test_program_local_is_the_own_program(algorithm):
    """Planner.program_local from a rank's gathered parts alone (what
    local_traffic cuts out of the matrix) is Planner.program's program."""
    t = Topology.preset("dgx-h100", 3, gpus_per_node=2)
    m = skewed(6, seed=9)
    planner = Planner(t, algorithm)
    assert planner._plans_locally()
    for r in range(6):
        parts = switchyard.local_traffic(m, r, t)
        assert parts["node_bytes"].shape == (3, 3) and parts["rows"].shape == (2, 6)
        assert parts["node_bytes"].sum() == m.sum()
        assert planner.program_local(r, *(parts[f] for f in switchyard.LOCAL_FIELDS)) == planner.program(r, m)
    # A part of the wrong size is a ValueError naming it, not a crash.
    parts = switchyard.local_traffic(m, 0, t)
    parts["cols"] = parts["cols"][:-1]
    with pytest.raises(ValueError, match="cols"):
        planner.program_local(0, *(parts[f] for f in switchyard.LOCAL_FIELDS))


@pytest.mark.parametrize("algorithm", ["fast", "spray"])
def test_program_local_of_staged_fast_needs_node_splits(algorithm):
    """Staged fast and spray plan a rank alone given node_splits (what
    local_traffic cuts out, NODE_SPLIT_FIELDS): the same program as
    Planner.program; without them they need the whole matrix."""
    t = Topology.preset("dgx-h100", 3, gpus_per_node=2)
    m = skewed(6, seed=9) * 1000  # large: a staged plan
    planner = Planner(t, algorithm)
    assert planner._plans_locally()
    for r in range(6):
        parts = switchyard.local_traffic(m, r, t)
        assert parts["to_nodes"].shape == (6, 3) and parts["from_nodes"].shape == (3, 6)
        assert parts["to_nodes"].sum() == m.sum() and parts["inter_blocks"].shape == (1,)
        splits = tuple(parts[f] for f in switchyard.NODE_SPLIT_FIELDS)
        own = planner.program_local(r, *(parts[f] for f in switchyard.LOCAL_FIELDS), node_splits=splits)
        assert own == planner.program(r, m)
        assert own["algorithm"] == algorithm and own["ops"]
    parts = switchyard.local_traffic(m, 0, t)
    with pytest.raises(ValueError, match="whole matrix"):
        planner.program_local(0, *(parts[f] for f in switchyard.LOCAL_FIELDS))
    with pytest.raises(ValueError, match="inter_blocks"):
        planner.program_local(0, *(parts[f] for f in switchyard.LOCAL_FIELDS),
                              node_splits=(parts["to_nodes"], parts["from_nodes"], [1, 2]))


@pytest.mark.parametrize("algorithm", ["fast", "spray"])
def test_program_local_of_staged_fast_from_lanes(algorithm):
    """Staged fast and spray plan a rank alone from their lane sums and
    stage inputs in place of node_splits (LANE_FIELDS, what AllToAll
    gathers; the native _lane_inputs computes them from a matrix): the same
    program as Planner.program. A wrong first slice of the rank's own node
    is refused; giving node_splits and lanes at once is an error."""
    t = Topology.preset("dgx-h100", 3, gpus_per_node=2)
    m = skewed(6, seed=9) * 1000  # large: a staged plan
    planner = Planner(t, algorithm)
    data = np.ascontiguousarray(m, dtype="<u8").tobytes()
    for r in range(6):
        parts = switchyard.local_traffic(m, r, t)
        lanes = planner._lane_inputs(data, 6, r)
        assert lanes is not None and len(lanes) == len(switchyard.LANE_FIELDS)
        base = [parts[f] for f in switchyard.LOCAL_FIELDS]
        assert planner.program_local(r, *base, lanes=lanes) == planner.program(r, m)
    wrong = [list(x) for x in lanes]
    wrong[-1][5] += 1  # rank 5's own first slice
    with pytest.raises(ValueError, match="first_slices"):
        planner.program_local(5, *base, lanes=wrong)
    splits = tuple(parts[f] for f in switchyard.NODE_SPLIT_FIELDS)
    with pytest.raises(ValueError, match="one of them"):
        planner.program_local(5, *base, node_splits=splits, lanes=lanes)


def test_verification_error_is_raised():
    t = Topology.preset("dgx-h100", 2, gpus_per_node=4)
    m = skewed(8, seed=2)
    good = Planner(t, "fast").plan(m)
    again = switchyard.plan_from_json(good.to_json(), t, m)
    assert again.verify() == good.verify()
    broken = json.loads(good.to_json())
    victim = next(tr for tr in broken["transfers"] if tr["dst_buf"] == "output" and tr["bytes"] > 1)
    victim["dst_off"] += 1  # one block lands a byte off
    plan = switchyard.plan_from_json(json.dumps(broken), t, m)
    with pytest.raises(VerificationError):
        plan.verify()
    with pytest.raises(ValueError, match="plan: .*line 1"):
        switchyard.plan_from_json("{", t, m)


@pytest.mark.parametrize(
    "algorithm", ["direct", "pairwise", "hierarchical", "fast", "spray", "lp", "pxn", "deepep"]
)
def test_same_as_cli(tmp_path, cli, algorithm):
    """topology -> planner -> plan -> JSON / XML / report, against `switchyard compile`."""
    topo = Topology.preset("dgx-h100", 2, gpus_per_node=4)
    m = skewed(8, seed=1)
    (tmp_path / "topo.json").write_text(topo.to_json())
    (tmp_path / "m.json").write_text(json.dumps({"ranks": 8, "matrix": m.tolist()}))
    base = [str(cli), "compile", "--topology", str(tmp_path / "topo.json"),
            "--traffic", str(tmp_path / "m.json"), "--algorithm", algorithm]
    subprocess.run(base + ["--out", str(tmp_path / "p.json"), "--report", str(tmp_path / "r.json")],
                   check=True, capture_output=True)
    plan = Planner(topo, algorithm).plan(m)
    assert json.loads(plan.to_json()) == json.loads((tmp_path / "p.json").read_text())
    ours, theirs = plan.simulate(), json.loads((tmp_path / "r.json").read_text())
    ours.pop("compile_us"), theirs.pop("compile_us")
    assert ours == theirs
    # For XML the CLI plans for the file (`target="msccl"`): lp with a lane
    # cap (PLAN_LANES_PER_GPU), pairwise with only the waits an executor
    # holds (`pairwise_held`); the others' plans are the same.
    subprocess.run(base + ["--out", str(tmp_path / "p.xml")], check=True, capture_output=True)
    for_xml = Planner(topo, algorithm, target="msccl").plan(m)
    assert for_xml.to_msccl_xml() == (tmp_path / "p.xml").read_text()
    if algorithm not in ("lp", "pairwise"):
        assert plan.to_msccl_xml() == (tmp_path / "p.xml").read_text()


def test_topology_from_env(monkeypatch, tmp_path):
    monkeypatch.delenv("SWITCHYARD_TOPOLOGY", raising=False)
    monkeypatch.setenv("WORLD_SIZE", "16")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    t = switchyard.topology_from_env()
    assert (t.nodes, t.gpus_per_node) == (2, 8)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "6")
    with pytest.raises(ValueError, match="not a whole number of nodes"):
        switchyard.topology_from_env()
    f = tmp_path / "t.json"
    f.write_text(Topology.preset("mi300x", 2).to_json())
    monkeypatch.setenv("SWITCHYARD_TOPOLOGY", str(f))
    assert switchyard.topology_from_env().ranks == 16
    # One node's NCCL topology XML: WORLD_SIZE / its GPUs nodes.
    x = tmp_path / "node.xml"
    x.write_text(NCCL_NODE)
    monkeypatch.setenv("SWITCHYARD_TOPOLOGY", str(x))
    t = switchyard.topology_from_env()
    assert (t.nodes, t.gpus_per_node, t.nics_per_node) == (8, 2, 1)
    assert any("latencies" in a for a in t.assumptions)
    monkeypatch.setenv("WORLD_SIZE", "15")
    with pytest.raises(ValueError, match="not a whole number of such nodes"):
        switchyard.topology_from_env()


# A hand-written NCCL_TOPO_FILE: two H100s and one 400 Gb/s NIC under one switch.
NCCL_NODE = """<system version="1">
  <cpu numaid="0" arch="x86_64">
    <pci busid="0000:01:00.0" class="0x060400">
      <pci busid="0000:02:00.0" class="0x030200"><gpu dev="0" sm="90" rank="0">
        <nvlink target="0000:09:00.0" count="18" tclass="0x068000"/></gpu></pci>
      <pci busid="0000:03:00.0" class="0x030200"><gpu dev="1" sm="90" rank="1">
        <nvlink target="0000:09:00.0" count="18" tclass="0x068000"/></gpu></pci>
      <pci busid="0000:04:00.0" class="0x020000"><nic>
        <net name="mlx5_0" dev="0" speed="400000" port="1"/></nic></pci>
    </pci>
  </cpu>
</system>
"""


def test_topology_from_nccl(tmp_path):
    x = tmp_path / "node.xml"
    x.write_text(NCCL_NODE)
    t = Topology.from_nccl(x, 3)
    assert (t.ranks, t.nics_per_node) == (6, 1)
    spec = json.loads(t.to_json())
    assert spec["intra"]["bandwidth_GBps"] == 450.0
    assert spec["nic"] == {"per_node": 1, "bandwidth_GBps": 50.0, "latency_us": 3.0, "gpu_nic": [0, 0]}
    assert any("latencies" in a for a in t.assumptions)
    assert Topology.preset("dgx-h100", 1).assumptions == []
    x.write_text(NCCL_NODE.replace(' speed="400000"', ""))
    with pytest.raises(ValueError, match='has no speed'):
        Topology.from_nccl(x, 2)


def test_module_docstring_example_runs():
    import doctest

    result = doctest.testmod(switchyard)
    assert result.attempted > 0 and result.failed == 0
