"""One rank of the multi-process tests: run under torchrun (gloo backend).

    torchrun --standalone --nproc_per_node=8 dist_worker.py MODE OUT_DIR [--nodes N]

Modes:
- ``match``: every algorithm but ``lp`` (and ``lp`` once), 30 iterations each
  with changing skewed splits, float32/bfloat16/int8, 1-D and 2-D inputs, zero
  splits; every output must equal ``dist.all_to_all_single``'s byte for byte.
- ``local``: the gather of what each rank's own program depends on:
  ``direct``, ``hierarchical`` (both executors) and ``fast`` gather locally
  (``fast`` and ``spray`` with their lane sums and stage inputs where the
  plan is staged; their programs must also be the whole plan's parts), ``pairwise`` the whole matrix; every output must equal
  ``dist.all_to_all_single``'s, every gathered part the compiler's own
  ``local_traffic`` of the whole matrix, and ``stats()`` counts the bytes.
- ``errors``: each bad call must raise on every rank, and the group must stay
  usable after each, for the whole-matrix gather (``fast``) and the local one
  (``direct``).
- ``timeout``: rank 0 never calls; every other rank must raise within the
  timeout instead of hanging.

Each rank writes OUT_DIR/rank<r>.json with what it saw; the pytest side reads
them all.
"""

import argparse
import json
import os
import sys
import time
import traceback

import numpy as np
import torch
import torch.distributed as dist

import switchyard
from switchyard.torch import AllToAll

DTYPES = [torch.float32, torch.bfloat16, torch.int8]


def fill(rows, trailing, dtype, rank, it):
    """Distinct values per rank and iteration (int8 wraps, which is fine)."""
    n = rows * (trailing if trailing else 1)
    base = torch.arange(n, dtype=torch.int64) * 7 + rank * 1000 + it * 31
    t = (base % 251 - 125).to(dtype)
    return t.reshape(rows, trailing) if trailing else t


def splits_for(rng, world, rank_zero_send, rank_zero_recv):
    """A skewed split matrix in rows (Zipf-like popularity of destinations),
    with one rank that sends nothing and one that receives nothing."""
    pop = 1.0 / torch.arange(1, world + 1, dtype=torch.float64) ** 1.2
    pop = pop[torch.randperm(world, generator=rng)]
    m = torch.zeros(world, world, dtype=torch.int64)
    for s in range(world):
        total = int(torch.randint(0, 48, (1,), generator=rng))
        draws = torch.multinomial(pop, total, replacement=True, generator=rng) if total else []
        for d in draws:
            m[s, int(d)] += 1
    m[rank_zero_send, :] = 0
    m[:, rank_zero_recv] = 0
    return m


def check_equal(ours, ref, what):
    a = ours.reshape(-1).view(torch.uint8) if ours.numel() else ours
    b = ref.reshape(-1).view(torch.uint8) if ref.numel() else ref
    if not torch.equal(a, b):
        bad = (a != b).nonzero()
        raise AssertionError(f"{what}: outputs differ from all_to_all_single at byte {int(bad[0])}")


def run_match(args, rank, world, topo):
    result = {"calls": 0, "algorithms": {}, "levels_max": 0}
    rng = torch.Generator().manual_seed(1234)  # the same on every rank
    # gloo's default executor is the dataflow one; `fast` runs by levels too
    # (what NCCL uses), so both executors are checked.
    plans = [(a, 30, "auto") for a in ("direct", "pairwise", "hierarchical", "fast", "spray")]
    plans.append(("fast", 30, "levels"))
    plans.append(("lp", 1 if world <= 8 else 0, "auto"))
    for alg, iters, executor in plans:
        if iters == 0:
            continue
        opts = {"time_limit_s": 30.0} if alg == "lp" else {}
        a2a = AllToAll(topo, algorithm=alg, verify=(alg == "lp"), executor=executor, **opts)
        name = alg if executor == "auto" else f"{alg}/{executor}"
        for it in range(iters):
            dtype = DTYPES[it % 3]
            trailing = 0 if (it // 3) % 2 == 0 else 5
            m = splits_for(rng, world, it % world, (it * 3 + 1) % world)
            in_splits = m[rank].tolist()
            out_splits = m[:, rank].tolist()
            inp = fill(sum(in_splits), trailing, dtype, rank, it)
            shape = (sum(out_splits), trailing) if trailing else (sum(out_splits),)
            out = torch.full(shape, 99, dtype=dtype)
            ref = torch.empty(shape, dtype=dtype)
            a2a(out, inp, out_splits, in_splits)
            dist.all_to_all_single(ref, inp, out_splits, in_splits)
            check_equal(out, ref, f"{name} iteration {it} ({dtype}, trailing {trailing})")
            result["calls"] += 1
            result["levels_max"] = max(result["levels_max"], a2a.stats()["levels"])
        # Equal splits (None), and the cache: the same matrix twice is one plan.
        inp = fill(world * 3, 0, torch.float32, rank, 0)
        out = torch.empty(world * 3)
        ref = torch.empty(world * 3)
        for _ in range(2):
            a2a(out, inp)
        dist.all_to_all_single(ref, inp)
        check_equal(out, ref, f"{alg} equal splits")
        # async_op returns a handle; a non-contiguous output is written in place.
        inp2 = fill(world * 2, 3, torch.float32, rank, 1)
        out2 = torch.zeros(3, world * 2).t()
        ref2 = torch.empty(world * 2, 3)
        work = a2a(out2, inp2, async_op=True)
        work.wait()
        dist.all_to_all_single(ref2, inp2)
        if not torch.equal(out2, ref2):
            raise AssertionError(f"{alg}: async_op with a non-contiguous output differs")
        st = a2a.stats()
        st["executor"] = a2a.executor
        result["algorithms"][name] = st
    return result


def run_local(args, rank, world, topo):
    result = {"algorithms": {}}
    rng = torch.Generator().manual_seed(99)  # the same on every rank
    cases = [("direct", "auto"), ("hierarchical", "auto"), ("hierarchical", "levels"),
             ("fast", "auto"), ("pairwise", "auto")]
    if args.algorithms:
        cases = [tuple((c.split("/") + ["auto"])[:2]) for c in args.algorithms.split(",")]
    for alg, executor in cases:
        a2a = AllToAll(topo, algorithm=alg, executor=executor)
        name = alg if executor == "auto" else f"{alg}/{executor}"
        gathered = []
        if a2a.gather == "local":
            # Keep what the exchange gathered, to compare with the compiler's.
            inner = a2a._exchange_local

            def keep(*a, _inner=inner):
                parts = _inner(*a)
                gathered.append(parts)
                return parts

            a2a._exchange_local = keep
        bytes_per_call, levels_max, compared = [], 0, 0
        for it in range(args.iters):
            dtype = DTYPES[it % 3]
            trailing = 0 if it % 2 == 0 else 3
            m = splits_for(rng, world, it % world, (it * 5 + 2) % world)
            in_splits, out_splits = m[rank].tolist(), m[:, rank].tolist()
            inp = fill(sum(in_splits), trailing, dtype, rank, it)
            shape = (sum(out_splits), trailing) if trailing else (sum(out_splits),)
            out = torch.full(shape, 99, dtype=dtype)
            ref = torch.empty(shape, dtype=dtype)
            before = a2a.stats()["gather_bytes"]
            a2a(out, inp, out_splits, in_splits)
            bytes_per_call.append(a2a.stats()["gather_bytes"] - before)
            dist.all_to_all_single(ref, inp, out_splits, in_splits)
            check_equal(out, ref, f"{name} iteration {it} ({dtype}, trailing {trailing})")
            levels_max = max(levels_max, a2a.stats()["levels"])
            if gathered:
                row_bytes = inp.element_size() * (trailing or 1)
                matrix = m.numpy() * row_bytes
                want = switchyard.local_traffic(matrix, rank, topo)
                fields = switchyard.LOCAL_FIELDS
                if alg in ("fast", "spray"):
                    # The lane sums and stage inputs, as the compiler
                    # computes them from the whole matrix (none where the
                    # plan is merged).
                    lanes = a2a._planner._lane_inputs(
                        np.ascontiguousarray(matrix, dtype="<u8").tobytes(), world, rank)
                    if lanes is not None:
                        fields += switchyard.LANE_FIELDS
                        want.update(zip(switchyard.LANE_FIELDS, (np.asarray(x, dtype=np.uint64) for x in lanes)))
                if len(gathered[-1]) != len(fields):
                    raise AssertionError(f"{name}: {len(gathered[-1])} parts gathered, {len(fields)} expected")
                for field, got in zip(fields, gathered[-1]):
                    if field == "rail_into_before" and alg != "deepep":
                        want[field] = want[field][:0]  # gathered for deepep alone
                    got = np.asarray(got, dtype=np.uint64)
                    if field in switchyard.LANE_FIELDS:
                        got = got.reshape(-1)
                    if not np.array_equal(got, want[field]):
                        raise AssertionError(f"{name} iteration {it}: gathered {field} differs")
                if alg in ("fast", "spray"):
                    compared += compare_with_whole_plan(a2a, rank, gathered[-1], matrix, name, it)
        st = a2a.stats()
        st["gather"] = a2a.gather
        st["bytes_per_call"] = sorted(set(bytes_per_call))
        st["levels_max"] = levels_max
        st["compared"] = compared
        result["algorithms"][name] = st
    return result


def compare_with_whole_plan(a2a, rank, parts, matrix, name, it):
    """The program this rank planned from its gathered parts has exactly
    the ops of its part of the whole plan (each op by both ends, buffers,
    offsets and bytes; tags and levels aside). 1 when compared, 0 when the
    parts did not determine the program (the call gathered the whole
    matrix instead)."""
    own = a2a._planner._program_local_tuples(
        rank, [np.ascontiguousarray(x, dtype="<u8").tobytes() for x in parts])
    if own is None:
        return 0
    _levels, scratch, ops = own
    _wlevels, wscratch, wops = a2a._planner.plan(matrix)._program_tuples(rank)
    body = lambda o: (o[0], o[2], o[3], o[4], o[5], o[6], o[7])  # noqa: E731
    if scratch != wscratch or sorted(map(body, ops)) != sorted(map(body, wops)):
        raise AssertionError(f"{name} iteration {it}: the own program is not the whole plan's part")
    return 1


def expect_error(a2a_call, contains, result, name):
    t0 = time.perf_counter()
    try:
        a2a_call()
    except (ValueError, RuntimeError) as e:
        ok = contains in str(e)
        result[name] = {"raised": type(e).__name__, "message": str(e), "ok": ok,
                        "seconds": time.perf_counter() - t0}
        return
    result[name] = {"raised": None, "ok": False, "seconds": time.perf_counter() - t0}


def run_errors(args, rank, world, topo):
    result = {}
    for alg in ("fast", "direct"):
        # fast through the whole-matrix gather, direct through the local one.
        a2a = AllToAll(topo, algorithm=alg, gather="whole" if alg == "fast" else "auto")
        result[f"{alg}:gather"] = a2a.gather
        bad_calls(a2a, rank, world, topo, result, f"{alg}:")
    # One rank with another topology of the same size: raised at construction.
    other = switchyard.Topology.preset("dgx-a100", 1, gpus_per_node=world) if rank == 0 else topo
    expect_error(lambda: AllToAll(other), "uses a different topology", result, "topology")
    return result


def bad_calls(a2a, rank, world, topo, result, prefix):
    ones = [1] * world
    # Split sizes that disagree between ranks: rank 1 expects 2 rows from rank 0.
    out_splits = list(ones)
    if rank == 1:
        out_splits[0] = 2
    expect_error(
        lambda: a2a(torch.empty(sum(out_splits)), torch.zeros(world), out_splits, ones),
        "split sizes disagree", result, prefix + "disagree")
    # An output too small on one rank only.
    out_rows = world - 1 if rank == 2 else world
    expect_error(
        lambda: a2a(torch.empty(out_rows), torch.zeros(world), None, None),
        "rank 2", result, prefix + "output_too_small")
    # Input splits that do not sum to the input on one rank.
    bad_in = [2] * world if rank == 3 else ones
    expect_error(
        lambda: a2a(torch.empty(world), torch.zeros(world), ones, bad_in),
        "input_split_sizes", result, prefix + "input_splits")
    # dtype differing between ranks.
    dt = torch.float64 if rank == 0 else torch.float32
    expect_error(
        lambda: a2a(torch.empty(world, dtype=dt), torch.zeros(world, dtype=dt)),
        "dtype", result, prefix + "dtype")
    # A topology of the wrong size: raised at construction on every rank.
    wrong = switchyard.Topology.preset("dgx-h100", 1, gpus_per_node=world * 2)
    expect_error(lambda: AllToAll(wrong), "process group has", result, prefix + "world_size")
    # The group still works after all of that.
    out = torch.empty(world)
    a2a(out, torch.full((world,), float(rank)))
    result[prefix + "after"] = out.tolist() == [float(r) for r in range(world)]


def run_timeout(args, rank, world, topo):
    result = {}
    if rank == 0:
        time.sleep(args.timeout * 3)  # never joins the call
        result["skipped"] = True
        return result
    # Building an AllToAll is collective too (every rank checks the
    # topology), so the missing rank may be noticed there or in the call.
    expect_error(
        lambda: AllToAll(topo, algorithm="fast", timeout=args.timeout)(
            torch.empty(world), torch.zeros(world)
        ),
        "",
        result,
        "timeout",
    )
    return result


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["match", "local", "errors", "timeout"])
    p.add_argument("out")
    p.add_argument("--nodes", type=int, default=None)
    p.add_argument("--timeout", type=float, default=3.0)
    p.add_argument("--iters", type=int, default=8)
    p.add_argument("--algorithms", default=None, help="local: these algorithms instead (comma list)")
    args = p.parse_args()
    if args.mode == "timeout":
        # gloo's own deadline too, so whatever waits in gloo gives up in time.
        import datetime

        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    else:
        dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.nodes:
        topo = switchyard.Topology.preset("dgx-h100", args.nodes, gpus_per_node=world // args.nodes)
    else:
        topo = None  # from the environment
    result = {"rank": rank, "world": world}
    try:
        if topo is None:
            topo = switchyard.topology_from_env(world_size=world)
            result["topology_from_env"] = topo.to_json()
        mode = {"match": run_match, "local": run_local, "errors": run_errors,
                "timeout": run_timeout}[args.mode]
        result.update(mode(args, rank, world, topo))
        result["ok"] = True
    except Exception as e:  # reported to pytest, which fails the test
        result["ok"] = False
        result["error"] = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    if args.mode != "timeout":
        dist.destroy_process_group()
    else:
        os._exit(0)  # the group is broken on purpose: do not wait on it


if __name__ == "__main__":
    sys.exit(main())
