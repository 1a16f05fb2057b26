"""A small Mixture-of-Experts layer whose dispatch and combine go through
switchyard.torch.AllToAll, checked every iteration against
torch.distributed.all_to_all_single.

    torchrun --nproc_per_node=8 examples/python/moe_dispatch.py [--nodes 2] [--iters 20]

Runs on CPUs (gloo) or GPUs (nccl, one per process) as torch.distributed
finds them. The router gives experts Zipf-distributed popularity and sends
every token to its top-2 experts, so the dispatch traffic is skewed and
changes every batch: every iteration is a new plan (a cache miss) unless a
matrix repeats. `--nodes N` describes the processes as N nodes of
WORLD_SIZE / N GPUs (default: the launcher's LOCAL_WORLD_SIZE, or the file
named by SWITCHYARD_TOPOLOGY).
"""

import argparse
import os
import time

import torch
import torch.distributed as dist

import switchyard
from switchyard.torch import AllToAll


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=None)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=256, help="tokens per rank per batch")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--experts-per-rank", type=int, default=2)
    ap.add_argument("--zipf", type=float, default=1.2, help="skew of expert popularity")
    ap.add_argument("--algorithm", default="fast")
    args = ap.parse_args()

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)

    if args.nodes:
        if world % args.nodes:
            raise SystemExit(f"--nodes {args.nodes} does not divide WORLD_SIZE {world}")
        topo = switchyard.Topology.preset("dgx-h100", args.nodes, gpus_per_node=world // args.nodes)
    else:
        topo = switchyard.topology_from_env(world_size=world)
    a2a = AllToAll(topo, algorithm=args.algorithm)
    if rank == 0:
        print(f"{world} ranks as {topo.name!r}, algorithm {a2a.algorithm}, backend {dist.get_backend()}")

    experts = world * args.experts_per_rank
    gen = torch.Generator().manual_seed(0)
    # Expert weights: the same on every rank (seeded), each rank uses its own.
    weights = torch.randn(experts, args.hidden, args.hidden, generator=gen) / args.hidden**0.5
    local_w = weights[rank * args.experts_per_rank : (rank + 1) * args.experts_per_rank].to(device)
    popularity = 1.0 / torch.arange(1, experts + 1, dtype=torch.float64) ** args.zipf

    for it in range(args.iters):
        step = torch.Generator().manual_seed(1000 * it + rank)
        x = torch.randn(args.tokens, args.hidden, generator=step).to(device)
        # Router: scores biased by a popularity that shifts every batch (hot experts move).
        shift = torch.randperm(experts, generator=torch.Generator().manual_seed(it))
        logits = torch.randn(args.tokens, experts, generator=step) + torch.log(popularity[shift]).float() * 4
        gate, chosen = torch.topk(torch.softmax(logits, dim=-1), k=2, dim=-1)  # top-2
        gate, chosen = gate.to(device), chosen.to(device)

        # Dispatch: one row per (token, chosen expert), grouped by the owning rank.
        flat_expert = chosen.reshape(-1)
        order = torch.argsort(flat_expert // args.experts_per_rank, stable=True)
        rows = x.repeat_interleave(2, dim=0)[order]
        ids = flat_expert[order]
        send_counts = torch.bincount(flat_expert // args.experts_per_rank, minlength=world)
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts)  # how many rows arrive from each rank
        in_splits, out_splits = send_counts.tolist(), recv_counts.tolist()

        recv_rows = torch.empty(sum(out_splits), args.hidden, device=device)
        recv_ids = torch.empty(sum(out_splits), dtype=ids.dtype, device=device)
        a2a(recv_rows, rows, out_splits, in_splits)
        a2a(recv_ids, ids, out_splits, in_splits)
        check(recv_rows, rows, out_splits, in_splits, "dispatch")

        # Experts: each received row through its expert's weight.
        local = recv_ids - rank * args.experts_per_rank
        y = torch.bmm(recv_rows.unsqueeze(1), local_w[local]).squeeze(1)

        # Combine: the reverse exchange, then the gate-weighted sum per token.
        back = torch.empty_like(rows)
        a2a(back, y, in_splits, out_splits)
        check(back, y, in_splits, out_splits, "combine")
        unsorted = torch.empty_like(back)
        unsorted[order] = back
        out = (unsorted.reshape(args.tokens, 2, args.hidden) * gate.unsqueeze(-1)).sum(1)
        assert out.shape == x.shape

        st = a2a.stats()
        if rank == 0:
            print(
                f"iter {it:3d}: rows sent {sum(in_splits):5d} (max to one rank {max(in_splits):4d}), "
                f"planning {1e3 * st['plan_seconds'] / st['calls']:.3f} ms/call, "
                f"cache hits {st['cache_hits']}/{st['calls']}, levels {st['levels']}, checked: same as all_to_all_single"
            )
    st = a2a.stats()
    if rank == 0:
        print(
            f"done: {st['calls']} calls, {st['cache_misses']} plans made, "
            f"gather {1e3 * st['gather_seconds'] / st['calls']:.3f} ms/call, "
            f"planning {1e3 * st['plan_seconds'] / st['calls']:.3f} ms/call, "
            f"communication {1e3 * st['comm_seconds'] / st['calls']:.3f} ms/call"
        )
    dist.destroy_process_group()


def check(ours, inp, out_splits, in_splits, what):
    ref = torch.empty_like(ours)
    dist.all_to_all_single(ref, inp, out_splits, in_splits)
    if not torch.equal(ours, ref):
        raise SystemExit(f"rank {dist.get_rank()}: {what} differs from all_to_all_single")


if __name__ == "__main__":
    main()
