"""``AllToAll``: a drop-in for ``torch.distributed.all_to_all_single`` that
runs a Switchyard plan, re-planned for every batch's split sizes.

Each call:

1. the split sizes are exchanged. With a per-rank planner (``gather="local"``,
   the default where the algorithm has one) a rank gathers only what its own
   program depends on: one ``all_to_all_single`` gives it, from every rank, a
   3-value header (whether that rank's arguments are valid, its dtype, its
   row size) and that rank's split sizes towards this rank's node (its whole
   row from the node's own GPUs), and one ``all_reduce`` sums the N x N node
   matrix (staged ``fast`` and ``spray`` then exchange the sums of their
   balanced lanes and each GPU's first slice in a second
   ``all_to_all_single``). Every rank sees every header, so bad arguments on any rank raise
   ``ValueError`` on every rank before any data moves; split sizes that
   disagree are found by their receiver and counted in the ``all_reduce``.
   Otherwise (``gather="whole"``) one all-gather of every rank's split sizes
   gives every rank the whole R x R matrix;
2. the rank's program is planned (from what it gathered: the node matrix,
   its node's rows and the columns into its node; or from the whole
   matrix), or taken from an LRU cache keyed by exactly those inputs;
3. the rank runs its program: on NCCL level by level, the sends and
   receives of a level posted as one ``batch_isend_irecv`` group (both sides
   of every transfer are on the same level, so the groups always match); on
   gloo as a dataflow, every receive posted at once and each send or copy
   waiting only for the receives whose bytes it reads. Local copies are
   tensor copies, relays go through a scratch buffer cached by size.

See docs/python.md.
"""

from __future__ import annotations

import collections
import datetime
import math
import time
import zlib
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.distributed as dist

from . import Planner, Topology, topology_from_env

__all__ = ["AllToAll"]

# Op kinds of Plan._program_tuples (its buffer codes, 0 input, 1 output,
# 2 scratch, index the executors' buffer tuple directly).
_SEND, _RECV, _COPY = 0, 1, 2

# Layout of the whole-matrix gather's vector: a header, then the input
# splits, then the output splits (world entries each).
_H_STATUS, _H_TOPO, _H_RANKS, _H_ROW_BYTES, _H_DTYPE, _HEADER = 0, 1, 2, 3, 4, 5

# The header every rank sends every peer in the local gather.
_L_STATUS, _L_DTYPE, _L_ROW_BYTES, _LHEADER = 0, 1, 2, 3

# Status codes a rank reports for its own arguments.
_STATUS_TEXT = {
    1: "its input_split_sizes do not fit its input",
    2: "its output_split_sizes do not fit its output",
    3: "its input and output differ in dtype, trailing shape or device",
}


class _Program:
    """One rank's program for one matrix, in the form its executor runs.

    ``levels`` executor: ``steps``, per level the local copies and the
    point-to-point operations as byte ranges. ``dataflow`` executor:
    ``flat``, every op in program order with the ops it must wait for."""

    __slots__ = ("levels", "scratch_bytes", "steps", "flat", "ops")

    def __init__(
        self, levels: int, scratch_bytes: int, ops: Sequence[Tuple], peers: List[int], executor: str
    ):
        self.levels = levels
        self.scratch_bytes = scratch_bytes
        self.ops = len(ops)
        self.steps: List[Tuple[list, list]] = []
        self.flat: List[Tuple] = []
        if executor == "dataflow":
            self.flat = [
                (kind, peers[peer], nbytes, sbuf, soff, dbuf, doff, transfer, after)
                for kind, _level, peer, nbytes, sbuf, soff, dbuf, doff, transfer, after in ops
            ]
            return
        by_level: Dict[int, Tuple[list, list]] = {}
        for kind, level, peer, nbytes, sbuf, soff, dbuf, doff, transfer, _after in ops:
            copies, p2p = by_level.setdefault(level, ([], []))
            if kind == _COPY:
                copies.append((sbuf, soff, dbuf, doff, nbytes))
            elif kind == _SEND:
                p2p.append((True, sbuf, soff, nbytes, peers[peer], transfer))
            else:
                p2p.append((False, dbuf, doff, nbytes, peers[peer], transfer))
        self.steps = [by_level[level] for level in sorted(by_level)]


class _Work:
    """The handle ``async_op=True`` returns: ``wait()`` finishes the last level."""

    def __init__(self, reqs: list, finish, timeout: Optional[datetime.timedelta]):
        self._reqs = reqs
        self._finish = finish
        self._timeout = timeout
        self._done = False

    def wait(self, timeout: Optional[datetime.timedelta] = None) -> bool:
        if not self._done:
            _wait_all(self._reqs, timeout or self._timeout)
            self._finish()
            self._done = True
        return True

    def is_completed(self) -> bool:
        return self._done


def _wait_all(reqs: list, timeout: Optional[datetime.timedelta]) -> None:
    for r in reqs:
        if timeout is None:
            r.wait()
        else:
            r.wait(timeout)


def _dtype_code(dtype: torch.dtype) -> int:
    return zlib.crc32(str(dtype).encode())


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's memory as a flat uint8 tensor (a view)."""
    flat = t.reshape(-1)
    return flat.view(torch.uint8) if flat.dtype != torch.uint8 else flat


def _splits(sizes: Optional[Sequence[int]], rows: int, world: int) -> Optional[List[int]]:
    """Split sizes in rows, as all_to_all_single reads them; None if they do not fit."""
    if sizes is None:
        return [rows // world] * world if rows % world == 0 else None
    try:
        out = [int(s) for s in sizes]
    except (TypeError, ValueError):
        return None
    if len(out) != world or any(s < 0 for s in out) or sum(out) != rows:
        return None
    return out


def _raise_status(rank: int, status: int, me: int) -> None:
    mine = " (this rank)" if rank == me else ""
    why = _STATUS_TEXT.get(status, "bad arguments")
    raise ValueError(
        f"rank {rank}{mine}: {why} (all_to_all_single semantics: split sizes are rows "
        f"of dim 0, one per rank, summing to the tensor's dim 0; None means equal splits)"
    )


def _check_same(dtypes: np.ndarray, row_bytes: np.ndarray) -> None:
    """Every rank's dtype and row size against rank 0's."""
    for col, what in ((dtypes, "dtype"), (row_bytes, "row size (trailing shape)")):
        if (col != col[0]).any():
            r = int(np.nonzero(col != col[0])[0][0])
            raise ValueError(f"rank {r} and rank 0 call with tensors of different {what}")


class AllToAll:
    """``a2a = AllToAll(topology=None, group=None, algorithm="auto", cache_size=64)``;
    then ``a2a(output, input, output_split_sizes=None, input_split_sizes=None)``
    with the semantics of ``torch.distributed.all_to_all_single``: ``input``
    is split along dim 0 into ``input_split_sizes`` rows for each rank in
    order (``None``: equal splits), ``output`` receives each rank's rows in
    rank order. Any dtype, any trailing shape.

    ``topology``: a ``switchyard.Topology`` of exactly the group's size;
    ``None`` reads it from the environment (``switchyard.topology_from_env``:
    ``SWITCHYARD_TOPOLOGY``, else ``WORLD_SIZE``/``LOCAL_WORLD_SIZE``).
    ``group``: ``None`` is the default process group. ``verify=True`` runs the
    verifier on every new plan (it costs more than planning). ``timeout``:
    seconds to wait for any one transfer or level (default: the process
    group's own timeout). ``executor``: ``levels`` (each level's sends and
    receives as one ``batch_isend_irecv`` group), ``dataflow`` (every receive
    posted at once, each send after the receives it reads), or ``auto``
    (``levels`` on NCCL, ``dataflow`` otherwise). Other keyword arguments go
    to ``switchyard.Planner``; with ``algorithm="auto"`` its ``settle``
    defaults to ``"never"`` here (each new matrix is chosen for by the
    estimates alone: planning stays a per-batch cost).

    ``gather``: how the split sizes are exchanged. ``local``: each rank
    gathers and plans only what its own program depends on (the node
    matrix, its node's rows, the columns into its node); ``whole``: every
    rank gathers the whole R x R matrix and plans the whole plan; ``auto``
    (the default): ``local`` where the algorithm has a per-rank planner,
    else ``whole``. Decided here, once: the construction is
    a collective call (it also checks that every rank has the same
    topology).
    """

    def __init__(
        self,
        topology: Optional[Topology] = None,
        group: Optional[Any] = None,
        algorithm: str = "auto",
        cache_size: int = 64,
        *,
        verify: bool = False,
        timeout: Optional[float] = None,
        executor: str = "auto",
        gather: str = "auto",
        **planner_options: Any,
    ) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(
                "switchyard.torch.AllToAll: torch.distributed is not initialised "
                "(call torch.distributed.init_process_group first)"
            )
        if cache_size < 0:
            raise ValueError(f"cache_size: must be at least 0, got {cache_size}")
        self.group = group
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        if topology is None:
            topology = topology_from_env(world_size=self.world)
        self.topology = topology
        self._topo_code = zlib.crc32(topology.to_json().encode())
        if algorithm == "auto":
            # Per batch: the estimates alone (well under a millisecond at 64
            # GPUs), not a simulation of every close call (up to seconds).
            planner_options.setdefault("settle", "never")
        self._planner = Planner(topology, algorithm, **planner_options)
        self._verify = verify
        self._timeout = None if timeout is None else datetime.timedelta(seconds=timeout)
        self._cache: "collections.OrderedDict[bytes, _Program]" = collections.OrderedDict()
        self._cache_size = cache_size
        self._scratch: Dict[torch.device, torch.Tensor] = {}
        self._peers = [
            r if group is None else dist.get_global_rank(group, r) for r in range(self.world)
        ]
        self._backend = str(dist.get_backend(group))
        if executor not in ("auto", "levels", "dataflow"):
            raise ValueError(f"executor: unknown executor {executor!r} (known: auto, levels, dataflow)")
        if executor == "auto":
            # NCCL: level groups, ordered on the stream without blocking the
            # host. gloo: point-to-point ops are independent and waits block,
            # so only the waits a byte needs.
            executor = "levels" if self._backend == "nccl" else "dataflow"
        self._executor = executor
        if gather not in ("auto", "local", "whole"):
            raise ValueError(f"gather: unknown gather {gather!r} (known: auto, local, whole)")
        self._check_topology(topology)
        local = gather != "whole" and self._planner._plans_locally()
        if gather == "local" and not local:
            raise ValueError(
                f"gather: `{self._planner.algorithm}` has no per-rank planner "
                f"(use gather='whole' or 'auto')"
            )
        self._gather = "local" if local and gather != "whole" else "whole"
        if self._gather == "local":
            self._local_layout()
        self._rust_seconds = 0.0
        self._stats = {
            "calls": 0,
            "cache_hits": 0,
            "cache_misses": 0,
            "gather_seconds": 0.0,
            "plan_seconds": 0.0,
            "comm_seconds": 0.0,
            "gather_bytes": 0,
            "whole_fallbacks": 0,
            "levels": 0,
            "ops": 0,
        }

    @property
    def algorithm(self) -> str:
        return self._planner.algorithm

    @property
    def executor(self) -> str:
        """``levels`` or ``dataflow``: how this rank runs its programs."""
        return self._executor

    @property
    def gather(self) -> str:
        """``local`` or ``whole``: what each call's split-size exchange gathers."""
        return self._gather

    def stats(self) -> Dict[str, float]:
        """Counts and seconds since construction: ``calls``, ``cache_hits``,
        ``cache_misses``, ``gather_seconds`` (the split-size exchange),
        ``gather_bytes`` (what the exchange delivered into this rank: the
        received parts of its collectives), ``whole_fallbacks`` (local
        calls whose traffic the per-rank planner could not plan alone, so
        the whole matrix was gathered too: staged ``fast`` when every node
        pair goes direct), ``plan_seconds`` (planning on cache misses),
        ``comm_seconds`` (running the program), ``levels`` and ``ops`` (of
        the last call's program)."""
        return dict(self._stats)

    def _check_topology(self, topology: Topology) -> None:
        """Raises on every rank unless every rank has a topology of the
        group's size, and the same one (one all-gather of two values)."""
        fits = topology.ranks == self.world
        local = torch.tensor([int(fits), self._topo_code], dtype=torch.int64)
        if self._backend == "nccl":
            local = local.to(torch.device("cuda", torch.cuda.current_device()))
        gathered = [torch.empty_like(local) for _ in range(self.world)]
        work = dist.all_gather(gathered, local, group=self.group, async_op=True)
        _wait_all([work], self._timeout)
        seen = torch.stack(gathered).cpu().numpy()
        if not fits:
            raise ValueError(
                f"topology: {topology.name!r} has {topology.ranks} GPUs but the process "
                f"group has {self.world} ranks"
            )
        bad = np.nonzero((seen[:, 0] == 0) | (seen[:, 1] != seen[0, 1]))[0]
        if len(bad):
            raise ValueError(
                f"topology: rank {int(bad[0])} uses a different topology than rank 0 "
                f"(this rank: {topology.name!r}, {topology.ranks} GPUs, in a group of {self.world} ranks)"
            )

    def __call__(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: Optional[Sequence[int]] = None,
        input_split_sizes: Optional[Sequence[int]] = None,
        group: Optional[Any] = None,
        async_op: bool = False,
    ):
        if group is not None and group is not self.group:
            raise ValueError("group: this AllToAll was made for another process group")
        st = self._stats
        st["calls"] += 1
        self._rust_seconds = 0.0
        t0 = time.perf_counter()
        local = self._gather == "local"
        args = (output, input, output_split_sizes, input_split_sizes)
        traffic = self._exchange_local(*args) if local else self._exchange(*args)
        t1 = time.perf_counter()
        # The planner's work between the exchange's rounds (fast's node
        # lanes and first slice) is planning, not exchange.
        st["gather_seconds"] += t1 - t0 - self._rust_seconds
        st["plan_seconds"] += self._rust_seconds
        prog = self._program(traffic, local)
        t2 = time.perf_counter()
        st["plan_seconds"] += t2 - t1
        if prog is None:
            # The per-rank planner needs the whole matrix for this traffic
            # (staged fast with every node pair direct): every rank decided
            # so from the same shared parts, so all gather it together.
            st["whole_fallbacks"] += 1
            traffic = self._exchange(*args)
            t1 = time.perf_counter()
            st["gather_seconds"] += t1 - t2
            prog = self._program(traffic, False)
            t2 = time.perf_counter()
            st["plan_seconds"] += t2 - t1
        st["levels"], st["ops"] = prog.levels, prog.ops
        work = self._run(prog, output, input, async_op)
        st["comm_seconds"] += time.perf_counter() - t2
        return work

    # -- 1. the exchange of split sizes --------------------------------------

    def _arguments(self, output, input, output_split_sizes, input_split_sizes):
        """This rank's verdict on its own arguments: (status, input splits,
        output splits, bytes of a row); the splits are None unless status is 0."""
        w = self.world
        if not isinstance(input, torch.Tensor) or not isinstance(output, torch.Tensor):
            raise TypeError("output and input must be torch.Tensor")
        if (
            input.dtype != output.dtype
            or input.shape[1:] != output.shape[1:]
            or input.device != output.device
            or input.dim() == 0
        ):
            return 3, None, None, 0
        ins = _splits(input_split_sizes, input.shape[0], w)
        outs = _splits(output_split_sizes, output.shape[0], w)
        status = 1 if ins is None else 2 if outs is None else 0
        row_bytes = math.prod(input.shape[1:]) * input.element_size()
        return status, ins, outs, row_bytes

    def _all_to_all(self, send: np.ndarray, sizes: List[int], total: int,
                    device: torch.device) -> np.ndarray:
        """One ``all_to_all_single`` of int64 values, ``sizes[p]`` to and
        from each peer ``p`` (``total`` received), waited for within the
        group's timeout; what this rank received."""
        recv_t = torch.empty(total, dtype=torch.int64, device=device)
        work = dist.all_to_all_single(
            recv_t,
            torch.from_numpy(send).to(device),
            sizes,
            sizes,
            group=self.group,
            async_op=True,
        )
        _wait_all([work], self._timeout)
        return recv_t.cpu().numpy()

    def _device(self, input: torch.Tensor) -> torch.device:
        return input.device if self._backend == "nccl" else torch.device("cpu")

    def _exchange(self, output, input, output_split_sizes, input_split_sizes) -> np.ndarray:
        """The bytes matrix every rank agrees on; ValueError on every rank if
        any rank's arguments are bad or the ranks disagree."""
        w = self.world
        status, ins, outs, row_bytes = self._arguments(
            output, input, output_split_sizes, input_split_sizes
        )
        local = torch.zeros(_HEADER + 2 * w, dtype=torch.int64)
        local[_H_STATUS] = status
        local[_H_TOPO] = self._topo_code
        local[_H_RANKS] = self.topology.ranks
        local[_H_ROW_BYTES] = row_bytes
        local[_H_DTYPE] = _dtype_code(input.dtype)
        if status == 0:
            local[_HEADER : _HEADER + w] = torch.tensor(ins, dtype=torch.int64)
            local[_HEADER + w :] = torch.tensor(outs, dtype=torch.int64)
        local = local.to(self._device(input))
        gathered = [torch.empty_like(local) for _ in range(w)]
        work = dist.all_gather(gathered, local, group=self.group, async_op=True)
        _wait_all([work], self._timeout)
        self._stats["gather_bytes"] += w * local.numel() * 8
        meta = torch.stack(gathered).cpu().numpy()
        self._check(meta)
        ins_all = meta[:, _HEADER : _HEADER + w]
        outs_all = meta[:, _HEADER + w :]
        if not np.array_equal(ins_all, outs_all.T):
            s, d = np.argwhere(ins_all != outs_all.T)[0]
            raise ValueError(
                f"split sizes disagree: rank {s} sends {ins_all[s, d]} rows to rank {d}, "
                f"whose output_split_sizes expect {outs_all[d, s]}"
            )
        return ins_all * meta[0, _H_ROW_BYTES]

    def _check(self, meta: np.ndarray) -> None:
        bad = np.nonzero(meta[:, _H_STATUS])[0]
        if len(bad):
            _raise_status(int(bad[0]), int(meta[bad[0], _H_STATUS]), self.rank)
        if (meta[:, _H_RANKS] != self.world).any() or (meta[:, _H_TOPO] != meta[0, _H_TOPO]).any():
            r = int(np.nonzero((meta[:, _H_RANKS] != self.world) | (meta[:, _H_TOPO] != meta[0, _H_TOPO]))[0][0])
            raise ValueError(
                f"topology: rank {r} uses a different topology ({int(meta[r, _H_RANKS])} GPUs) "
                f"than rank 0 ({int(meta[0, _H_RANKS])} GPUs) in a group of {self.world} ranks"
            )
        _check_same(meta[:, _H_DTYPE], meta[:, _H_ROW_BYTES])

    # -- 1'. the local exchange: only what this rank's program depends on ---

    def _local_layout(self) -> None:
        """Index arrays of the local exchange, made once.

        Every rank sends every peer: a header (``_LHEADER`` values: its
        status, dtype and row size); what the peer's node needs from it as a
        node-level summary (``g + 4`` values: its column summed over the
        ranks before that node, its row summed over them, its row per rail
        over the nodes before that node but its own, its row and its column
        summed over the other nodes; for ``deepep`` ``g`` more, its column
        per rail over the nodes before that node but its own); and its
        split sizes towards the peer's
        node: its whole row to the GPUs of its own node, the ``g`` values
        of the peer's node to the others. The exchange is symmetric, so
        what a rank receives from peer ``p`` has the size of what it sends
        ``p``. ``fast`` and ``spray`` (staged) also sum two counts in the
        all-reduce and exchange their lanes in a second all-to-all
        (``_lane_round``)."""
        w, g = self.world, self.topology.gpus_per_node
        n = w // g
        a, j = divmod(self.rank, g)
        # Only deepep places its writes by the column summaries; only fast
        # and spray read lane sums and stage inputs (`_lane_round`).
        self._l_into = self._planner.algorithm == "deepep"
        self._l_lanes = self._planner.algorithm in ("fast", "spray")
        extra = g + 4 + (g if self._l_into else 0)
        self._l_width = extra
        # The lane round: to every peer 4 values (this GPU's gather sum, its
        # gather before the peer's node, what the lanes of the nodes before
        # the peer's land in it, its first slice), and to the peers of its
        # rail its rail's lanes (2 N values: lengths, gathered bytes).
        lane_sizes = [4 + (2 * n if p % g == j else 0) for p in range(w)]
        self._lr_sizes = lane_sizes
        self._lr_total = int(sum(lane_sizes))
        lstarts = np.concatenate(([0], np.cumsum(lane_sizes)[:-1])).astype(np.int64)
        self._lr_head = lstarts[:, None] + np.arange(4)[None, :]
        # The rail peers (every node's GPU j) in node order: their lanes.
        rail_peers = np.arange(n) * g + j
        self._lr_rail = lstarts[rail_peers][:, None] + 4 + np.arange(2 * n)[None, :]
        sizes = [_LHEADER + extra + (w if p // g == a else g) for p in range(w)]
        starts = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
        self._l_sizes = sizes
        self._l_total = int(sum(sizes))
        self._l_nodes, self._l_gpus = n, g
        self._l_node_of = np.arange(w) // g
        self._l_head = starts[:, None] + np.arange(_LHEADER)[None, :]
        self._l_extra = starts[:, None] + _LHEADER + np.arange(extra)[None, :]
        # Payload: for every slot, the index of the split size (in this
        # rank's row) it carries.
        pay_pos, pay_src = [], []
        for p in range(w):
            first = starts[p] + _LHEADER + extra
            cols = np.arange(w) if p // g == a else np.arange((p // g) * g, (p // g + 1) * g)
            pay_pos.append(first + np.arange(len(cols)))
            pay_src.append(cols)
        self._l_pay_pos = np.concatenate(pay_pos)
        self._l_pay_src = np.concatenate(pay_src)
        # Receiving: the rows of this node's GPUs (g x w), every rank's split
        # sizes into this node (w x g).
        pay = starts + _LHEADER + extra
        self._l_rows = np.stack([pay[a * g + i] + np.arange(w) for i in range(g)])
        self._l_cols = np.stack(
            [pay[s] + (np.arange(a * g, (a + 1) * g) if s // g == a else np.arange(g)) for s in range(w)]
        )

    def _summaries(self, row: np.ndarray, col: np.ndarray) -> np.ndarray:
        """What each node needs from this rank beyond split sizes (N x (g +
        4), in rows, g more for deepep): its column over the ranks before
        the node, its row over them, its row per rail over the nodes before
        the node (its own node left out), its row and its column over the
        other nodes; for deepep its column per rail over the nodes before
        the node (its own left out)."""
        n, g = self._l_nodes, self._l_gpus
        a = self.rank // g
        row_nodes = row.reshape(n, g)
        col_nodes = col.reshape(n, g).sum(axis=1)
        out = np.zeros((n, self._l_width), dtype=np.int64)
        out[1:, 0] = np.cumsum(col_nodes)[:-1]
        out[1:, 1] = np.cumsum(row_nodes.sum(axis=1))[:-1]
        out[:, 2 : 2 + g] = self._rails_before(row)
        out[:, 2 + g] = row.sum() - row_nodes[a].sum()
        out[:, 3 + g] = col.sum() - col_nodes[a]
        k = 4 + g
        if self._l_into:
            out[:, k : k + g] = self._rails_before(col)
        return out

    def _rails_before(self, v: np.ndarray) -> np.ndarray:
        """N x g: this rank's split sizes ``v`` (a row or a column) per
        rail, summed over the nodes before each node, its own node left
        out."""
        n, g = self._l_nodes, self._l_gpus
        rails = v.reshape(n, g).copy()
        rails[self.rank // g] = 0
        out = np.zeros((n, g), dtype=np.int64)
        out[1:] = np.cumsum(rails, axis=0)[:-1]
        return out

    def _exchange_local(self, output, input, output_split_sizes, input_split_sizes):
        """What this rank's program depends on, in bytes, in the order of
        the native ``program_local``'s arguments: the node matrix (N x N),
        its node's rows (g x R), every rank's sends into its node (R x g),
        then the summaries (``above``, ``before``, ``rail_before``,
        ``inter_out``, ``inter_in``, ``rank_rail_before``,
        ``rail_into_before``, empty but for deepep; docs/python.md). ValueError on every
        rank if any rank's arguments are bad or the ranks disagree."""
        w, g, n = self.world, self._l_gpus, self._l_nodes
        a, j = divmod(self.rank, g)
        status, ins, outs, row_bytes = self._arguments(
            output, input, output_split_sizes, input_split_sizes
        )
        if status == 0:
            row, col = np.asarray(ins, dtype=np.int64), np.asarray(outs, dtype=np.int64)
        else:
            row = col = np.zeros(w, dtype=np.int64)
        send = np.zeros(self._l_total, dtype=np.int64)
        send[self._l_head] = [status, _dtype_code(input.dtype), row_bytes]
        send[self._l_extra] = self._summaries(row, col)[self._l_node_of]
        send[self._l_pay_pos] = row[self._l_pay_src]
        device = self._device(input)
        recv = self._all_to_all(send, self._l_sizes, self._l_total, device)
        # Every rank holds every header: the same verdict everywhere.
        head = recv[self._l_head]
        bad = np.nonzero(head[:, _L_STATUS])[0]
        if len(bad):
            _raise_status(int(bad[0]), int(head[bad[0], _L_STATUS]), self.rank)
        _check_same(head[:, _L_DTYPE], head[:, _L_ROW_BYTES])
        rows = recv[self._l_rows]
        cols = recv[self._l_cols]
        extra = recv[self._l_extra]
        # What each rank sends this rank, against what this rank expects.
        sent = cols[:, j]
        wrong = np.nonzero(sent != col)[0]
        rb = row_bytes
        lanes = None
        if self._l_lanes:
            # This node's lanes (from its rows), those into it (from its
            # columns) and whether its pairs go direct: for the counts in
            # the all-reduce and the lane round.
            t = time.perf_counter()
            lanes = self._planner._node_parts(
                a, np.ascontiguousarray(rows * rb, dtype="<u8").tobytes(),
                np.ascontiguousarray(cols * rb, dtype="<u8").tobytes(),
            )
            self._rust_seconds += time.perf_counter() - t
        # The node matrix (this rank's row summed by destination node), the
        # number of ranks whose split sizes disagree with a peer's; for
        # fast and spray the count of non-empty blocks between nodes (each
        # rank its row's) and of ranks whose node has a pair that does not
        # go direct.
        width = n * n + (3 if lanes is not None else 1)
        part = np.zeros(width, dtype=np.int64)
        part[a * n : (a + 1) * n] = row.reshape(n, g).sum(axis=1) * row_bytes
        part[n * n] = 1 if len(wrong) else 0
        if lanes is not None:
            others = np.ones(w, dtype=bool)
            others[a * g : (a + 1) * g] = False
            part[n * n + 1] = int((row[others] > 0).sum()) if row_bytes > 0 else 0
            part[n * n + 2] = 0 if lanes[3] else 1
        summed = torch.from_numpy(part).to(device)
        work = dist.all_reduce(summed, group=self.group, async_op=True)
        _wait_all([work], self._timeout)
        summed = summed.cpu().numpy()
        self._stats["gather_bytes"] += (self._l_total + width) * 8
        if summed[n * n]:
            self._raise_disagreement(wrong, sent, col, device)
        k = 4 + g + (g if self._l_into else 0)
        parts = (
            summed[: n * n].reshape(n, n),
            rows * rb,
            cols * rb,
            extra[:, 0] * rb,
            extra[:, 1] * rb,
            extra[:, 2 : 2 + g].reshape(n, g, g).sum(axis=1) * rb,
            extra[:, 2 + g] * rb,
            extra[:, 3 + g] * rb,
            extra[:, 2 : 2 + g] * rb,
            extra[:, 4 + g : k].reshape(-1, g, g).sum(axis=1) * rb,
        )
        if lanes is None:
            return parts
        return parts + self._lane_round(parts, lanes, summed[n * n + 1 :], device)

    def _lane_round(self, parts, lanes, counts, device) -> tuple:
        """Staged ``fast`` and ``spray``: what they read of other nodes'
        lanes, in the order of the native ``program_local``'s lane fields
        (lane sums, then stage inputs; docs/python.md, "What a rank
        gathers"), from a second all-to-all after this rank's first slice
        (which needs the node matrix) is known. Empty where the plan is the
        merged one (every rank decides alike from the shared parts, and
        then no rank reads lanes)."""
        w, g, n = self.world, self._l_gpus, self._l_nodes
        a, j = divmod(self.rank, g)
        base = [np.ascontiguousarray(x, dtype="<u8").tobytes() for x in parts]
        len_b, gathered_b, into_b, _direct = lanes
        t = time.perf_counter()
        first = self._planner._first_slice(self.rank, base, len_b)
        self._rust_seconds += time.perf_counter() - t
        if first is None:
            return ()
        length = np.frombuffer(len_b, dtype="<u8").astype(np.int64).reshape(g, n)
        gathered = np.frombuffer(gathered_b, dtype="<u8").astype(np.int64).reshape(g, n)
        into = np.frombuffer(into_b, dtype="<u8").astype(np.int64).reshape(n, g)
        # To every peer of node m: this GPU's gather regions in all and
        # before node m, what the lanes of nodes before m land in it, its
        # first slice; to the peers of its rail its lanes.
        gather_upto = np.concatenate(([0], np.cumsum(gathered[j])))
        land_upto = np.concatenate(([0], np.cumsum(into[:, j])))
        peer_node = self._l_node_of
        send = np.zeros(self._lr_total, dtype=np.int64)
        send[self._lr_head] = np.stack(
            [
                np.full(w, gather_upto[n]),
                gather_upto[peer_node],
                land_upto[peer_node],
                np.full(w, first),
            ],
            axis=1,
        )
        send[self._lr_rail] = np.concatenate((length[j], gathered[j]))[None, :]
        recv = self._all_to_all(send, self._lr_sizes, self._lr_total, device)
        self._stats["gather_bytes"] += self._lr_total * 8
        head = recv[self._lr_head]
        rail = recv[self._lr_rail]
        return (
            head[:, 0],
            head[:, 1],
            head[:, 2],
            rail[:, :n],
            rail[:, n:],
            counts[:1],
            np.array([1 if counts[1] == 0 else 0]),
            head[:, 3],
        )

    def _raise_disagreement(self, wrong, sent, outs, device) -> None:
        """Some rank's split sizes disagree with a peer's: every rank tells
        the first disagreement of the lowest rank that saw one (one more,
        small all-gather, on this error path only)."""
        mine = torch.tensor(
            [1, int(wrong[0]), int(sent[wrong[0]]), int(outs[wrong[0]])] if len(wrong) else [0, 0, 0, 0],
            dtype=torch.int64,
        ).to(device)
        gathered = [torch.empty_like(mine) for _ in range(self.world)]
        work = dist.all_gather(gathered, mine, group=self.group, async_op=True)
        _wait_all([work], self._timeout)
        seen = torch.stack(gathered).cpu().numpy()
        d = int(np.nonzero(seen[:, 0])[0][0])
        _, s, rows, expect = (int(v) for v in seen[d])
        raise ValueError(
            f"split sizes disagree: rank {s} sends {rows} rows to rank {d}, "
            f"whose output_split_sizes expect {expect}"
        )

    # -- 2. the plan ---------------------------------------------------------

    def _program(self, traffic, local: bool) -> Optional[_Program]:
        """This rank's program for what the exchange gathered (the whole
        matrix, or the local parts), from the cache if it was planned for
        the same inputs; None when the local parts do not determine it (the
        caller gathers the whole matrix)."""
        parts = [np.ascontiguousarray(x, dtype="<u8") for x in (traffic if local else (traffic,))]
        # A local key has several parts, a whole one a single one: the two never collide.
        key = b"".join(x.tobytes() for x in parts) + (b"L" if local else b"W")
        if key in self._cache:
            self._cache.move_to_end(key)
            self._stats["cache_hits"] += 1
            return self._cache[key]
        self._stats["cache_misses"] += 1
        if local:
            planned = self._planner._program_local_tuples(self.rank, [x.tobytes() for x in parts])
            if planned is None:
                prog = None
            else:
                levels, scratch, ops = planned
        else:
            plan = self._planner._plan_bytes(parts[0].tobytes(), self.world)
            if self._verify:
                plan.verify()
            levels, scratch, ops = plan._program_tuples(self.rank)
        if not local or planned is not None:
            prog = _Program(levels, scratch, ops, self._peers, self._executor)
        if self._cache_size:
            self._cache[key] = prog
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return prog

    # -- 3. running this rank's program --------------------------------------

    def _scratch_for(self, nbytes: int, device: torch.device) -> torch.Tensor:
        buf = self._scratch.get(device)
        if buf is None or buf.numel() < nbytes:
            buf = torch.empty(nbytes, dtype=torch.uint8, device=device)
            self._scratch[device] = buf
        return buf

    def _run(self, prog: _Program, output: torch.Tensor, input: torch.Tensor, async_op: bool):
        src = _as_bytes(input.contiguous())
        target = output if output.is_contiguous() else torch.empty_like(
            output, memory_format=torch.contiguous_format
        )
        dst = _as_bytes(target)
        bufs = (src, dst, self._scratch_for(prog.scratch_bytes, input.device))

        def finish() -> None:
            if target is not output:
                output.copy_(target)

        if self._executor == "dataflow":
            reqs = self._run_dataflow(prog, bufs)
        else:
            reqs = self._run_levels(prog, bufs)
        if async_op:
            return _Work(reqs, finish, self._timeout)
        _wait_all(reqs, self._timeout)
        finish()
        return None

    def _run_dataflow(self, prog: _Program, bufs) -> list:
        """Every receive posted at once (a verified plan writes each byte at
        most once, so no receive can overwrite what another op still reads);
        each send and copy waits only for the receives whose bytes it reads
        (its ``after``). Progress follows the plan's dependency order, so
        nothing waits in a cycle. Tags are transfer indices: matching does
        not depend on posting order. Returns the requests still open."""
        group, timeout = self.group, self._timeout
        reqs: list = [None] * len(prog.flat)
        for i, (kind, peer, n, _sb, _so, dbuf, doff, tag, _after) in enumerate(prog.flat):
            if kind == _RECV:
                reqs[i] = dist.irecv(bufs[dbuf][doff : doff + n], peer, group, tag)
        waited = [False] * len(prog.flat)
        for i, (kind, peer, n, sbuf, soff, dbuf, doff, tag, after) in enumerate(prog.flat):
            if kind == _RECV:
                continue
            for j in after:
                if reqs[j] is not None and not waited[j]:
                    _wait_all([reqs[j]], timeout)
                    waited[j] = True
            if kind == _COPY:
                bufs[dbuf][doff : doff + n].copy_(bufs[sbuf][soff : soff + n])
            else:
                reqs[i] = dist.isend(bufs[sbuf][soff : soff + n], peer, group, tag)
        return [r for i, r in enumerate(reqs) if r is not None and not waited[i]]

    def _run_levels(self, prog: _Program, bufs) -> list:
        """Level by level: each level's sends and receives as one
        ``batch_isend_irecv`` group, its copies as tensor copies, all of a
        level finished before the next starts. Returns the last level's
        requests."""
        reqs: list = []
        for copies, p2p in prog.steps:
            _wait_all(reqs, self._timeout)
            for sbuf, soff, dbuf, doff, n in copies:
                bufs[dbuf][doff : doff + n].copy_(bufs[sbuf][soff : soff + n])
            if p2p:
                ops = [
                    dist.P2POp(
                        dist.isend if is_send else dist.irecv,
                        bufs[buf][off : off + n],
                        peer,
                        self.group,
                        tag,
                    )
                    for is_send, buf, off, n, peer, tag in p2p
                ]
                reqs = dist.batch_isend_irecv(ops)
            else:
                reqs = []
        return reqs
