"""Switchyard: an all-to-all schedule compiler for skewed Mixture-of-Experts traffic.

The classes here are thin bindings of the Rust compiler (no algorithm is
written in Python):

>>> import switchyard
>>> topo = switchyard.Topology.preset("dgx-h100", nodes=2, gpus_per_node=4)
>>> planner = switchyard.Planner(topo, algorithm="fast")
>>> plan = planner.plan([[1 << 20] * 8 for _ in range(8)])
>>> plan.verify()["transfers"] == plan.num_transfers
True

``switchyard.torch.AllToAll`` is a drop-in for
``torch.distributed.all_to_all_single`` that re-plans every batch (import
``switchyard.torch`` explicitly; it needs PyTorch). See docs/python.md.
"""

from __future__ import annotations

import os
from typing import Any, Optional, Tuple

import numpy as np

from . import _native
from ._native import Plan, Topology, VerificationError, __version__, algorithms

__all__ = [
    "LANE_FIELDS",
    "LOCAL_FIELDS",
    "NODE_SPLIT_FIELDS",
    "Plan",
    "Planner",
    "Topology",
    "VerificationError",
    "__version__",
    "algorithms",
    "local_traffic",
    "plan_from_json",
    "topology_from_env",
]


class Planner(_native.Planner):
    """Makes plans for one topology with one algorithm.

    ``Planner(topology, algorithm="auto", **options)``. ``auto`` (the
    default) picks, per matrix, the plan of ``direct``, ``pxn``, ``deepep``,
    ``hierarchical``, ``spray`` or ``fast`` that the cost model expects to
    finish first; the plan's ``algorithm`` names the one it chose.
    ``network`` (``calibrated``, the default as for ``Plan.simulate``,
    ``ideal``, ``congested`` or ``stress``) is the mode the plans are for:
    ``auto`` picks for it and ``fast`` sizes its chunks by its per-message
    cost. ``settle`` (``auto`` only): ``"always"`` (the default, as
    ``compile``: close calls are settled by simulating the contenders,
    milliseconds to seconds), ``"sticky"`` (settle once, keep the winner
    while the estimates say it holds) or ``"never"`` (the estimates alone,
    well under a millisecond at 64 GPUs; what ``AllToAll`` uses). Options
    by algorithm:
    ``fast``: ``pipeline_depth``, ``stages_per_node``, ``balance``,
    ``chunk_bytes``; ``spray``: ``balance``, ``chunk_bytes``; ``lp``:
    ``time_limit_s``, ``max_lanes_per_gpu``. An option the algorithm does not
    take raises ``ValueError``. ``target`` (every algorithm): ``"runtime"``
    (the default: plans for Switchyard's runtime and simulator) or
    ``"msccl"`` (plans for ``Plan.to_msccl_xml``, as ``compile --out
    plan.xml`` does: ``lp`` within the executor's lanes per GPU,
    ``pairwise`` with only the waits an MSCCL executor holds; the others'
    plans are the same). ``fast`` and ``spray`` keep their buffers
    between calls, as the Rust ``Planner`` does.
    """

    def plan(self, matrix: Any) -> Plan:
        """Plans one all-to-all(v) for ``matrix``: bytes from rank ``s`` (row)
        to rank ``d`` (column), any R x R array-like of non-negative integers
        (numpy array, torch tensor, list of lists)."""
        data, ranks = matrix_bytes(matrix)
        return self._plan_bytes(data, ranks)

    def program(self, rank: int, matrix: Any) -> dict:
        """Rank ``rank``'s own program for ``matrix`` (docs/formats.md, "Rank
        program"): its sends, receives and copies, each transfer named by
        where it writes. ``direct``, ``hierarchical``, ``pxn`` and ``deepep``
        plan it without the whole plan; ``fast`` and ``spray`` slice their whole plan; other
        algorithms raise ``ValueError``."""
        data, ranks = matrix_bytes(matrix)
        return self._program_bytes(data, ranks, rank)

    def program_local(
        self,
        rank: int,
        node_bytes: Any,
        rows: Any,
        cols: Any,
        above: Any,
        before: Any,
        rail_before: Any,
        inter_out: Any,
        inter_in: Any,
        rank_rail_before: Any,
        rail_into_before: Any,
        node_splits: Optional[Tuple[Any, Any, Any]] = None,
        lanes: Optional[Tuple[Any, ...]] = None,
    ) -> dict:
        """Rank ``rank``'s own program from what that rank gathered alone
        (``LOCAL_FIELDS``; ``local_traffic`` computes them from a whole
        matrix, docs/python.md "What a rank gathers"): the same program as
        ``program(rank, matrix)``, planned without the matrix. Array-likes of
        non-negative integers, any shape of the right size. ``node_splits``:
        ``(to_nodes, from_nodes, inter_blocks)`` (``NODE_SPLIT_FIELDS``),
        which staged ``fast`` and ``spray`` also read, or in their place
        ``lanes``: the eight ``LANE_FIELDS`` (lane sums and stage inputs,
        what ``AllToAll`` gathers; ``_lane_inputs`` computes them from a
        whole matrix). Raises ``ValueError`` for an algorithm that needs
        the whole matrix (``fast`` and ``spray`` when staged without
        either, on a mesh or when every node pair goes direct; ``auto``;
        the one-shot ones)."""
        fields = (node_bytes, rows, cols, above, before, rail_before, inter_out, inter_in,
                  rank_rail_before, rail_into_before)
        names = LOCAL_FIELDS
        if node_splits is not None and lanes is not None:
            raise ValueError("node_splits, lanes: give one of them")
        if node_splits is not None:
            fields += tuple(node_splits)
            names += NODE_SPLIT_FIELDS
        if lanes is not None:
            fields += tuple(lanes)
            names += LANE_FIELDS
        parts = [_u64_bytes(x, name) for x, name in zip(fields, names)]
        return self._program_local_bytes(rank, parts)


# What a rank's own program depends on (the compiler's LocalTraffic), in
# the order of Planner.program_local's arguments.
LOCAL_FIELDS = (
    "node_bytes", "rows", "cols", "above", "before", "rail_before", "inter_out", "inter_in",
    "rank_rail_before", "rail_into_before",
)


# What staged fast and spray also read (the compiler's NodeSplits): what
# each rank sends each node (R x N), what each node sends each rank (N x R),
# and the count of non-empty blocks between nodes (one value).
NODE_SPLIT_FIELDS = ("to_nodes", "from_nodes", "inter_blocks")


# What staged fast and spray read in place of NODE_SPLIT_FIELDS (the
# compiler's LaneSums then StageInputs; docs/python.md "What a rank
# gathers"): sums of the balanced lanes (R, R, R, N x N, N x N), the count
# of non-empty blocks between nodes and whether every node pair goes direct
# (one value each), each GPU's first slice (R; 2**32 - 1: none).
LANE_FIELDS = (
    "gather", "gather_before", "land_before", "rail_len", "rail_gathered",
    "inter_blocks", "pairs_direct", "first_slices",
)


def local_traffic(matrix: Any, rank: int, topology: Topology) -> dict:
    """Rank ``rank``'s part of ``matrix`` on ``topology``: what its own
    program depends on, as numpy arrays of bytes (uint64) by name
    (``LOCAL_FIELDS``, then ``NODE_SPLIT_FIELDS``), computed from the whole
    matrix; what the gather of ``switchyard.torch.AllToAll`` arrives at
    without it."""
    data, ranks = matrix_bytes(matrix)
    t = _native._local_traffic_bytes(data, ranks, rank, topology)
    n, g = t["nodes"], t["gpus_per_node"]
    shapes = {
        "node_bytes": (n, n), "rows": (g, n * g), "cols": (n * g, g), "rail_before": (n, g),
        "rank_rail_before": (n * g, g), "rail_into_before": (n, g),
    }
    out = {k: np.asarray(t[k], dtype=np.uint64).reshape(shapes.get(k, (-1,))) for k in LOCAL_FIELDS}
    splits = t["node_splits"]
    out["to_nodes"] = np.asarray(splits["to_nodes"], dtype=np.uint64).reshape(n * g, n)
    out["from_nodes"] = np.asarray(splits["from_nodes"], dtype=np.uint64).reshape(n, n * g)
    out["inter_blocks"] = np.asarray([splits["inter_blocks"]], dtype=np.uint64)
    return out


def _u64_bytes(x: Any, name: str) -> bytes:
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # a torch tensor
        x = x.detach().cpu().numpy()
    a = np.asarray(x)
    if a.dtype.kind not in "iu":
        raise ValueError(f"{name}: must hold byte counts (integers), got dtype {a.dtype}")
    if a.dtype.kind == "i" and (a < 0).any():
        raise ValueError(f"{name}: negative byte count {a[a < 0].flat[0]}")
    return np.ascontiguousarray(a, dtype="<u8").tobytes()


def plan_from_json(text: str, topology: Topology, matrix: Any) -> Plan:
    """A plan in the IR's JSON form (``compile --out plan.json``, or
    ``Plan.to_json()``), for ``topology`` and the traffic ``matrix`` it is
    meant to deliver; ``verify()`` then says whether it does."""
    data, ranks = matrix_bytes(matrix)
    return _native._plan_from_json(text, topology, data, ranks)


def matrix_bytes(matrix: Any) -> Tuple[bytes, int]:
    """``matrix`` as little-endian u64 bytes, row-major, and its rank count.

    Raises ``ValueError`` naming the place of the first bad value, as the CLI
    does for a traffic file."""
    if hasattr(matrix, "detach") and hasattr(matrix, "cpu"):  # a torch tensor
        matrix = matrix.detach().cpu().numpy()
    try:
        a = np.asarray(matrix)
    except ValueError as e:  # ragged rows
        raise ValueError(f"matrix: rows of different lengths: it must be square ({e})") from None
    if a.ndim != 2 or a.shape[0] != a.shape[1]:
        raise ValueError(f"matrix: must be square (R x R), got shape {tuple(a.shape)}")
    if a.shape[0] == 0:
        raise ValueError("matrix: is empty")
    kind = a.dtype.kind
    if kind == "O":
        try:
            a = a.astype(np.float64) if any(isinstance(v, float) for v in a.flat) else a.astype(np.int64)
        except (TypeError, ValueError, OverflowError):
            raise ValueError("matrix: must hold byte counts (integers)") from None
        kind = a.dtype.kind
    if kind not in "iuf":
        raise ValueError(f"matrix: must hold byte counts (integers), got dtype {a.dtype}")
    if kind == "f" and not np.isfinite(a).all():
        i, j = np.argwhere(~np.isfinite(a))[0]
        raise ValueError(f"matrix: row {i}, column {j}: not a byte count: {a[i, j]}")
    if kind in "if" and (a < 0).any():
        i, j = np.argwhere(a < 0)[0]
        raise ValueError(f"matrix: row {i}, column {j}: negative byte count {a[i, j]}")
    if kind == "f":
        frac = np.argwhere(a != np.floor(a))
        if len(frac):
            i, j = frac[0]
            raise ValueError(
                f"matrix: row {i}, column {j}: fractional byte count {a[i, j]}: bytes must be whole"
            )
        if (a >= 2.0**64).any():
            i, j = np.argwhere(a >= 2.0**64)[0]
            raise ValueError(f"matrix: row {i}, column {j}: byte count {a[i, j]} is too large")
    return np.ascontiguousarray(a, dtype="<u8").tobytes(), int(a.shape[0])


def topology_from_env(
    world_size: Optional[int] = None, local_world_size: Optional[int] = None
) -> Topology:
    """The cluster of a launcher's job.

    ``SWITCHYARD_TOPOLOGY`` names a topology file: Switchyard's JSON, or one
    node's NCCL topology XML (``NCCL_TOPO_DUMP_FILE`` / ``NCCL_TOPO_FILE``) or
    ``nvidia-smi topo -m`` text, which makes ``WORLD_SIZE`` / its GPUs nodes.
    Without it, the ``dgx-h100`` shape with ``LOCAL_WORLD_SIZE`` GPUs (and
    NICs) per node and ``WORLD_SIZE / LOCAL_WORLD_SIZE`` nodes (the variables
    torchrun sets; the arguments override them)."""
    world = world_size if world_size is not None else _env_int("WORLD_SIZE")
    path = os.environ.get("SWITCHYARD_TOPOLOGY")
    if path:
        return Topology.load(path, world_size=world)
    local = local_world_size if local_world_size is not None else _env_int("LOCAL_WORLD_SIZE")
    if world is None:
        raise ValueError(
            "topology: set SWITCHYARD_TOPOLOGY to a topology JSON file, or run under a "
            "launcher that sets WORLD_SIZE and LOCAL_WORLD_SIZE (torchrun)"
        )
    if local is None:
        local = world
    if local < 1 or world < 1 or world % local != 0:
        raise ValueError(
            f"topology: WORLD_SIZE {world} is not a whole number of nodes of "
            f"LOCAL_WORLD_SIZE {local} GPUs"
        )
    return Topology.preset("dgx-h100", world // local, gpus_per_node=local)


def _env_int(name: str) -> Optional[int]:
    v = os.environ.get(name)
    if v is None or v == "":
        return None
    try:
        return int(v)
    except ValueError:
        raise ValueError(f"{name}: not an integer: {v!r}") from None
