"""switchyard.torch.AllToAll against torch.distributed.all_to_all_single, in
real processes on this machine (torchrun, gloo backend)."""

import json

import pytest

from conftest import torchrun


def _assert_all_ok(results):
    for r in results:
        assert r["ok"], f"rank {r['rank']} failed:\n{r.get('error')}"


@pytest.mark.parametrize("nproc,nodes", [(8, 2), (16, 4)], ids=["2x4", "4x4"])
def test_matches_all_to_all_single(tmp_path, nproc, nodes):
    proc, results = torchrun(nproc, ["match", f"--nodes={nodes}"], tmp_path)
    _assert_all_ok(results)
    assert proc.returncode == 0, proc.stderr[-4000:]
    for r in results:
        algs = r["algorithms"]
        expected = {"direct", "pairwise", "hierarchical", "fast", "spray", "fast/levels"}
        if nproc <= 8:
            expected.add("lp")
        assert set(algs) == expected
        assert algs["fast"]["executor"] == "dataflow"  # gloo's default
        assert algs["fast/levels"]["executor"] == "levels"
        for name, st in algs.items():
            iters = 1 if name == "lp" else 30
            # every changing matrix is planned once; the repeated one hits the cache
            assert st["calls"] == iters + 3
            assert st["cache_hits"] >= 1
            assert st["cache_misses"] <= iters + 2
            assert st["plan_seconds"] > 0 and st["comm_seconds"] > 0
    # relays happen: fast's programs have more than one level
    assert max(r["levels_max"] for r in results) > 1


def _local_bytes(world, nodes, deepep=False, lanes=False, staged=False):
    """What the local exchange delivers into a rank per call, in bytes: from
    every peer a 3-value header, g + 4 node summaries (g more for deepep)
    and its split sizes towards this node (its whole row from this node's
    GPUs), then the node matrix and one flag from the all-reduce; for fast
    and spray (``lanes``) two more counts in the all-reduce and, where the
    plan is staged, the lane round: 4 values from every peer and 2 N from
    each rank of this rank's rail."""
    g = world // nodes
    summaries = g + 4 + (g if deepep else 0)
    values = world * (3 + summaries) + g * world + (world - g) * g + nodes * nodes + 1
    if lanes:
        values += 2
    if staged:
        values += 4 * world + 2 * nodes * nodes
    return 8 * values


@pytest.mark.parametrize("nproc,nodes", [(8, 2), (16, 4)], ids=["2x4", "4x4"])
def test_local_gather(tmp_path, nproc, nodes):
    """direct, hierarchical and fast gather only their programs' inputs
    (equal to the compiler's own cut of the whole matrix; fast's here are
    latency-bound, so merged) and match all_to_all_single; pairwise
    gathers the whole matrix."""
    proc, results = torchrun(nproc, ["local", f"--nodes={nodes}", "--iters=8"], tmp_path)
    _assert_all_ok(results)
    whole = 8 * nproc * (5 + 2 * nproc)  # an all-gather of 5 + 2R values per rank
    local = _local_bytes(nproc, nodes)
    assert local < whole
    for r in results:
        algs = r["algorithms"]
        for name in ("direct", "hierarchical", "hierarchical/levels"):
            assert algs[name]["gather"] == "local", (name, algs[name])
            assert algs[name]["bytes_per_call"] == [local], (name, algs[name])
        assert algs["fast"]["gather"] == "local", algs["fast"]
        # latency-bound here: merged, so no lane round
        assert algs["fast"]["bytes_per_call"] == [_local_bytes(nproc, nodes, lanes=True)]
        assert algs["pairwise"]["gather"] == "whole", algs["pairwise"]
        assert algs["pairwise"]["bytes_per_call"] == [whole], algs["pairwise"]
        for st in algs.values():
            assert st["calls"] == 8 and st["cache_misses"] >= 1


@pytest.mark.parametrize("alg", ["pxn", "deepep"])
def test_local_gather_relays(tmp_path, alg):
    """pxn and deepep plan from the local gather too (2 nodes of 2, so
    pxn relays between rails and deepep forwards inside the node): what
    they gather equals the compiler's cut and they match
    all_to_all_single."""
    proc, results = torchrun(4, ["local", "--nodes=2", "--iters=6", f"--algorithms={alg}"], tmp_path)
    _assert_all_ok(results)
    for r in results:
        st = r["algorithms"][alg]
        assert st["gather"] == "local", st
        assert st["bytes_per_call"] == [_local_bytes(4, 2, alg == "deepep")], st
        assert st["calls"] == 6 and st["cache_misses"] >= 1


def test_local_gather_staged_fast(tmp_path):
    """Staged fast and spray plan each rank's own program from the local
    gather with their lane round (NICs slow enough that no exchange is
    latency-bound): what they gather equals the compiler's cut, each
    program is exactly the rank's part of the whole plan, with balanced
    network hops (data level 1, so 3 levels), and every output matches
    all_to_all_single, with both executors."""
    topo = tmp_path / "slow-nics.json"
    topo.write_text(json.dumps({
        "name": "2 nodes of 4, slow NICs", "nodes": 2, "gpus_per_node": 4,
        "intra": {"kind": "switch", "bandwidth_GBps": 450.0, "latency_us": 1.0},
        "nic": {"per_node": 4, "bandwidth_GBps": 0.001, "latency_us": 3.0},
    }))
    algs = "fast,spray,fast/levels"
    proc, results = torchrun(8, ["local", "--iters=6", f"--algorithms={algs}"], tmp_path / "out",
                             env={"SWITCHYARD_TOPOLOGY": str(topo)})
    _assert_all_ok(results)
    for r in results:
        for name in algs.split(","):
            st = r["algorithms"][name]
            assert st["gather"] == "local", (name, st)
            assert st["whole_fallbacks"] == 0, (name, st)
            assert st["bytes_per_call"] == [_local_bytes(8, 2, lanes=True, staged=True)], (name, st)
            assert st["compared"] == 6, (name, st)
    # Some rank's fast program has a balanced network hop (scratch to scratch).
    assert max(r["algorithms"]["fast"]["levels_max"] for r in results) == 3


def test_topology_from_environment(tmp_path):
    """SWITCHYARD_TOPOLOGY names the cluster; the 8 processes run as 4 x 2."""
    topo = tmp_path / "cluster.json"
    topo.write_text(json.dumps({
        "name": "4 nodes of 2", "nodes": 4, "gpus_per_node": 2,
        "intra": {"kind": "switch", "bandwidth_GBps": 450.0, "latency_us": 1.0},
        "nic": {"per_node": 2, "bandwidth_GBps": 50.0, "latency_us": 3.0},
    }))
    proc, results = torchrun(8, ["errors"], tmp_path / "out", env={"SWITCHYARD_TOPOLOGY": str(topo)})
    _assert_all_ok(results)
    assert '"nodes": 4' in results[0]["topology_from_env"]
    _check_errors(results)


def _check_errors(results):
    cases = ("disagree", "output_too_small", "input_splits", "dtype", "world_size")
    for r in results:
        # fast through the whole-matrix gather, direct through the local one
        assert r["fast:gather"] == "whole" and r["direct:gather"] == "local", r
        for case in [f"{alg}:{c}" for alg in ("fast", "direct") for c in cases] + ["topology"]:
            c = r[case]
            assert c["raised"] == "ValueError", (r["rank"], case, c)
            assert c["ok"], (r["rank"], case, c["message"])
            assert c["seconds"] < 10, (r["rank"], case, c)
        for alg in ("fast", "direct"):
            assert r[f"{alg}:after"], f"rank {r['rank']}: the group did not work after the errors"


def test_errors_raise_on_every_rank(tmp_path):
    proc, results = torchrun(8, ["errors", "--nodes=2"], tmp_path)
    _assert_all_ok(results)
    _check_errors(results)
    # the rank whose arguments were bad is named the same way everywhere
    for case in ("fast:output_too_small", "direct:output_too_small", "direct:disagree"):
        msgs = {r[case]["message"].replace(" (this rank)", "") for r in results}
        assert len(msgs) == 1, msgs


def test_missing_rank_times_out(tmp_path):
    proc, results = torchrun(4, ["timeout", "--nodes=1", "--timeout=3"], tmp_path)
    assert results[0]["skipped"]
    for r in results[1:]:
        assert r["ok"], r.get("error")
        assert r["timeout"]["raised"] is not None, r
        assert r["timeout"]["seconds"] < 30, r
