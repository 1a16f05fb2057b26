"""Per-call overhead of switchyard.torch.AllToAll, and its time against
torch.distributed.all_to_all_single, on this machine's processes.

    torchrun --nproc_per_node=8 examples/python/bench_alltoall.py --nodes 2
    python examples/python/bench_alltoall.py --plan-only --ranks 64 --nodes 8

With torchrun: for each size (MiB sent per rank), MoE-skewed splits (Zipf
popularity of destination ranks, a new matrix every iteration), alternating
AllToAll and all_to_all_single calls on the same tensors, and then the same
matrix again for cache hits. Rank 0 prints one line per size: the split
exchange, planning on a cache miss, the whole call on a miss and on a hit,
the all_to_all_single call, and the ratio of the two (medians over the
iterations). On CPUs gloo is the engine, so this measures the executor's
overhead, not a network.

With --exchange-only (torchrun): the split-size exchange alone, per call:
today's all-gather of every rank's header and splits (what AllToAll does)
against what a `direct` own program needs (docs/python.md, "Own programs"):
an all-reduce of the header and one all_to_all_single of two offsets per
peer. Rank 0 prints the bytes each rank receives and the median times.

With --split-exchange (torchrun): AllToAll's split-size exchange and
planning per call, the whole-matrix gather (gather="whole": an all-gather of
every rank's split sizes, the whole plan on every rank) against the local
one (gather="local": each rank gathers and plans only its own program), on
small tensors with a new skewed matrix every call (--row-bytes sets the
bytes per row: `fast` plans a staged exchange, not a latency-bound one, once
rows are large); rank 0 prints the bytes the exchange delivered into it and
the median seconds of the exchange and of planning (AllToAll.stats()).

With --plan-only (no torchrun): the planning part of a cache miss at any
rank count in one process: Planner.plan on the bytes matrix plus this rank's
program, as AllToAll does it.
"""

import argparse
import statistics
import time

import numpy as np


def skewed_rows(rng, world, rows_per_rank, zipf):
    pop = 1.0 / np.arange(1, world + 1) ** zipf
    m = np.zeros((world, world), dtype=np.int64)
    for s in range(world):
        p = np.roll(pop, rng.integers(world))
        m[s] = rng.multinomial(rows_per_rank, p / p.sum())
    return m


def plan_only(args):
    import switchyard

    topo = switchyard.Topology.preset("dgx-h100", args.nodes, gpus_per_node=args.ranks // args.nodes)
    planner = switchyard.Planner(topo, args.algorithm)
    rng = np.random.default_rng(0)
    row = args.hidden * 2
    times, ops, levels = [], [], []
    for _ in range(args.iters):
        m = skewed_rows(rng, args.ranks, args.mib * 2**20 // row, args.zipf) * row
        t0 = time.perf_counter()
        plan = planner.plan(m)
        lv, _, prog = plan._program_tuples(0)
        times.append(time.perf_counter() - t0)
        ops.append(len(prog))
        levels.append(lv)
    print(
        f"plan-only {args.ranks} ranks ({args.nodes} x {args.ranks // args.nodes}), {args.algorithm}: "
        f"plan + rank program median {1e3 * statistics.median(times):.3f} ms "
        f"(min {1e3 * min(times):.3f}), {plan.num_transfers} transfers, "
        f"rank 0: {statistics.median(ops):.0f} ops on {statistics.median(levels):.0f} levels"
    )


def exchange_only(args):
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    header = 5
    today, own = [], []
    for it in range(args.iters + 1):
        local = torch.zeros(header + 2 * world, dtype=torch.int64)
        gathered = [torch.empty_like(local) for _ in range(world)]
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_gather(gathered, local)
        t1 = time.perf_counter()
        head = torch.zeros(header, dtype=torch.int64)
        offsets = torch.zeros(2 * world, dtype=torch.int64)
        theirs = torch.empty_like(offsets)
        dist.barrier()
        t2 = time.perf_counter()
        dist.all_reduce(head, op=dist.ReduceOp.MAX)
        dist.all_to_all_single(theirs, offsets)
        t3 = time.perf_counter()
        if it:
            today.append(t1 - t0)
            own.append(t3 - t2)
    if rank == 0:
        med = lambda v: 1e3 * statistics.median(v)  # noqa: E731
        print(
            f"{world} ranks, gloo, medians of {args.iters}: all-gather {world * (header + 2 * world) * 8} B "
            f"received, {med(today):.3f} ms; own-program exchange {2 * world * 8 + header * 8} B, "
            f"{med(own):.3f} ms"
        )
    dist.destroy_process_group()


def split_exchange(args):
    import torch
    import torch.distributed as dist

    import switchyard
    from switchyard.torch import AllToAll

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    topo = switchyard.Topology.preset("dgx-h100", args.nodes, gpus_per_node=world // args.nodes)
    rows = {}
    for gather in args.gather:
        a2a = AllToAll(topo, algorithm=args.algorithm, gather=gather)
        rng = np.random.default_rng(7)  # the same matrices on every rank, for both
        ex, plan, nbytes = [], [], []
        for it in range(args.iters + 1):
            m = skewed_rows(rng, world, 64, args.zipf)
            ins, outs = m[rank].tolist(), m[:, rank].tolist()
            x = torch.zeros(sum(ins), args.row_bytes, dtype=torch.int8)
            y = torch.empty(sum(outs), args.row_bytes, dtype=torch.int8)
            s0 = a2a.stats()
            dist.barrier()
            a2a(y, x, outs, ins)
            s1 = a2a.stats()
            if it == 0:
                continue  # warm-up
            ex.append(s1["gather_seconds"] - s0["gather_seconds"])
            plan.append(s1["plan_seconds"] - s0["plan_seconds"])
            nbytes.append(s1["gather_bytes"] - s0["gather_bytes"])
        st = a2a.stats()
        rows[gather] = (statistics.median(nbytes), statistics.median(ex), statistics.median(plan),
                        a2a.gather, st["whole_fallbacks"], st["levels"])
    if rank == 0:
        print(f"{world} ranks ({args.nodes} x {world // args.nodes}), {args.algorithm}, "
              f"{args.row_bytes} B per row, gloo, medians of {args.iters}")
        for gather, (b, e, p, got, falls, levels) in rows.items():
            print(f"  {gather:5s}: {b:9.0f} B received per call, exchange {1e3 * e:8.3f} ms, "
                  f"plan {1e3 * p:7.3f} ms (gathered {got}, {falls} whole fallbacks, last program {levels} levels)")
    dist.destroy_process_group()


def distributed(args):
    import torch
    import torch.distributed as dist

    import switchyard
    from switchyard.torch import AllToAll

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    topo = switchyard.Topology.preset("dgx-h100", args.nodes, gpus_per_node=world // args.nodes)
    a2a = AllToAll(topo, algorithm=args.algorithm, executor=args.executor)
    hidden = args.hidden
    row = hidden * 2  # bfloat16
    if rank == 0:
        print(
            f"{world} processes as {topo.name!r}, {a2a.algorithm}, gloo, {a2a.executor} executor; "
            f"medians of {args.iters}"
        )
        print("MiB/rank  gather_ms  plan_ms  miss_ms  hit_ms  ref_ms  miss/ref  hit/ref  levels")
    for mib in args.sizes:
        rng = np.random.default_rng(mib)  # the same matrices on every rank
        miss, hit, ref, gather, plan = [], [], [], [], []
        for it in range(args.iters + 1):
            m = skewed_rows(rng, world, mib * 2**20 // row, args.zipf)
            ins, outs = m[rank].tolist(), m[:, rank].tolist()
            x = torch.randn(sum(ins), hidden).to(torch.bfloat16)
            y = torch.empty(sum(outs), hidden, dtype=torch.bfloat16)
            z = torch.empty_like(y)
            s0 = a2a.stats()
            dist.barrier()
            t0 = time.perf_counter()
            a2a(y, x, outs, ins)
            t1 = time.perf_counter()
            s1 = a2a.stats()
            dist.barrier()
            t2 = time.perf_counter()
            dist.all_to_all_single(z, x, outs, ins)
            t3 = time.perf_counter()
            dist.barrier()
            t4 = time.perf_counter()
            a2a(y, x, outs, ins)  # the same matrix: a cache hit
            t5 = time.perf_counter()
            assert torch.equal(y, z)
            if it == 0:
                continue  # warm-up
            miss.append(t1 - t0)
            ref.append(t3 - t2)
            hit.append(t5 - t4)
            gather.append(s1["gather_seconds"] - s0["gather_seconds"])
            plan.append(s1["plan_seconds"] - s0["plan_seconds"])
        if rank == 0:
            med = lambda v: 1e3 * statistics.median(v)  # noqa: E731
            print(
                f"{mib:8d}  {med(gather):9.3f}  {med(plan):7.3f}  {med(miss):7.2f}  {med(hit):6.2f}  "
                f"{med(ref):6.2f}  {med(miss) / med(ref):8.2f}  {med(hit) / med(ref):7.2f}  "
                f"{a2a.stats()['levels']:6d}"
            )
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--algorithm", default="fast", help="with --split-exchange: use one with a per-rank planner (hierarchical)")
    ap.add_argument("--executor", default="auto", choices=["auto", "levels", "dataflow"])
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 4, 16, 64], help="MiB sent per rank")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--zipf", type=float, default=1.0)
    ap.add_argument("--plan-only", action="store_true")
    ap.add_argument("--exchange-only", action="store_true")
    ap.add_argument("--split-exchange", action="store_true")
    ap.add_argument("--gather", nargs="+", default=["whole", "local"], choices=["whole", "local"],
                    help="with --split-exchange: the exchanges to measure")
    ap.add_argument("--row-bytes", type=int, default=1,
                    help="with --split-exchange: bytes per row (large enough, fast's plan is staged, not latency-bound)")
    ap.add_argument("--ranks", type=int, default=64, help="with --plan-only")
    ap.add_argument("--mib", type=int, default=16, help="with --plan-only: MiB per rank")
    args = ap.parse_args()
    if args.plan_only:
        plan_only(args)
    elif args.exchange_only:
        exchange_only(args)
    elif args.split_exchange:
        split_exchange(args)
    else:
        distributed(args)


if __name__ == "__main__":
    main()
