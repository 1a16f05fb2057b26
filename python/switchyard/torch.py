"""``AllToAll``: a drop-in for ``torch.distributed.all_to_all_single`` that
runs a Switchyard plan, re-planned for every batch's split sizes.

Each call:

1. one all-gather of a small vector per rank (its split sizes, the bytes of a
   row, its dtype and topology, and whether its arguments are valid) gives
   every rank the same R x R bytes matrix and the same verdict: bad arguments
   on any rank raise ``ValueError`` on every rank before any data moves;
2. the plan for that matrix is made on every rank (plans are deterministic,
   so no broadcast is needed), or taken from an LRU cache keyed by the
   matrix; only this rank's program is kept;
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

# Layout of the gathered vector: a header, then the input splits, then the
# output splits (world entries each).
_H_STATUS, _H_TOPO, _H_RANKS, _H_ROW_BYTES, _H_DTYPE, _HEADER = 0, 1, 2, 3, 4, 5

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
    to ``switchyard.Planner``.
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
        self._stats = {
            "calls": 0,
            "cache_hits": 0,
            "cache_misses": 0,
            "gather_seconds": 0.0,
            "plan_seconds": 0.0,
            "comm_seconds": 0.0,
            "levels": 0,
            "ops": 0,
        }
        if topology.ranks != self.world:
            raise ValueError(
                f"topology: {topology.name!r} has {topology.ranks} GPUs but the process "
                f"group has {self.world} ranks"
            )

    @property
    def algorithm(self) -> str:
        return self._planner.algorithm

    @property
    def executor(self) -> str:
        """``levels`` or ``dataflow``: how this rank runs its programs."""
        return self._executor

    def stats(self) -> Dict[str, float]:
        """Counts and seconds since construction: ``calls``, ``cache_hits``,
        ``cache_misses``, ``gather_seconds`` (the split-size exchange),
        ``plan_seconds`` (planning on cache misses), ``comm_seconds`` (running
        the program), ``levels`` and ``ops`` (of the last call's program)."""
        return dict(self._stats)

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
        t0 = time.perf_counter()
        matrix = self._exchange(output, input, output_split_sizes, input_split_sizes)
        t1 = time.perf_counter()
        st["gather_seconds"] += t1 - t0
        prog = self._program(matrix)
        t2 = time.perf_counter()
        st["plan_seconds"] += t2 - t1
        st["levels"], st["ops"] = prog.levels, prog.ops
        work = self._run(prog, output, input, async_op)
        st["comm_seconds"] += time.perf_counter() - t2
        return work

    # -- 1. the exchange of split sizes --------------------------------------

    def _exchange(self, output, input, output_split_sizes, input_split_sizes) -> np.ndarray:
        """The bytes matrix every rank agrees on; ValueError on every rank if
        any rank's arguments are bad or the ranks disagree."""
        w = self.world
        status = 0
        ins = outs = None
        row_bytes = 0
        if not isinstance(input, torch.Tensor) or not isinstance(output, torch.Tensor):
            raise TypeError("output and input must be torch.Tensor")
        if (
            input.dtype != output.dtype
            or input.shape[1:] != output.shape[1:]
            or input.device != output.device
            or input.dim() == 0
        ):
            status = 3
        else:
            ins = _splits(input_split_sizes, input.shape[0], w)
            outs = _splits(output_split_sizes, output.shape[0], w)
            status = 1 if ins is None else 2 if outs is None else 0
            row_bytes = math.prod(input.shape[1:]) * input.element_size()
        local = torch.zeros(_HEADER + 2 * w, dtype=torch.int64)
        local[_H_STATUS] = status
        local[_H_TOPO] = self._topo_code
        local[_H_RANKS] = self.topology.ranks
        local[_H_ROW_BYTES] = row_bytes
        local[_H_DTYPE] = _dtype_code(input.dtype)
        if status == 0:
            local[_HEADER : _HEADER + w] = torch.tensor(ins, dtype=torch.int64)
            local[_HEADER + w :] = torch.tensor(outs, dtype=torch.int64)
        device = input.device if self._backend == "nccl" else torch.device("cpu")
        local = local.to(device)
        gathered = [torch.empty_like(local) for _ in range(w)]
        work = dist.all_gather(gathered, local, group=self.group, async_op=True)
        _wait_all([work], self._timeout)
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
            r = int(bad[0])
            mine = " (this rank)" if r == self.rank else ""
            why = _STATUS_TEXT.get(int(meta[r, _H_STATUS]), "bad arguments")
            raise ValueError(
                f"rank {r}{mine}: {why} (all_to_all_single semantics: split sizes are rows "
                f"of dim 0, one per rank, summing to the tensor's dim 0; None means equal splits)"
            )
        if (meta[:, _H_RANKS] != self.world).any() or (meta[:, _H_TOPO] != meta[0, _H_TOPO]).any():
            r = int(np.nonzero((meta[:, _H_RANKS] != self.world) | (meta[:, _H_TOPO] != meta[0, _H_TOPO]))[0][0])
            raise ValueError(
                f"topology: rank {r} uses a different topology ({int(meta[r, _H_RANKS])} GPUs) "
                f"than rank 0 ({int(meta[0, _H_RANKS])} GPUs) in a group of {self.world} ranks"
            )
        for col, what in ((_H_DTYPE, "dtype"), (_H_ROW_BYTES, "row size (trailing shape)")):
            if (meta[:, col] != meta[0, col]).any():
                r = int(np.nonzero(meta[:, col] != meta[0, col])[0][0])
                raise ValueError(f"rank {r} and rank 0 call with tensors of different {what}")

    # -- 2. the plan ---------------------------------------------------------

    def _program(self, matrix: np.ndarray) -> _Program:
        key = matrix.tobytes()
        prog = self._cache.get(key)
        if prog is not None:
            self._cache.move_to_end(key)
            self._stats["cache_hits"] += 1
            return prog
        self._stats["cache_misses"] += 1
        plan = self._planner._plan_bytes(
            np.ascontiguousarray(matrix, dtype="<u8").tobytes(), self.world
        )
        if self._verify:
            plan.verify()
        levels, scratch, ops = plan._program_tuples(self.rank)
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
