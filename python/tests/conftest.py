"""Shared fixtures: the repository root, the CLI binary, and a torchrun launcher."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def cli() -> Path:
    """The `switchyard` binary the round-trip tests compare against
    (SWITCHYARD_BIN, else target/debug/switchyard; `scripts/test.sh` builds it)."""
    path = Path(os.environ.get("SWITCHYARD_BIN", ROOT / "target" / "debug" / "switchyard"))
    if not path.exists():
        pytest.fail(f"{path}: no switchyard binary; run `cargo build` (or set SWITCHYARD_BIN)")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(nproc: int, args, out_dir: Path, env=None, timeout: float = 600):
    """Runs tests/dist_worker.py on `nproc` local processes (gloo) and
    returns each rank's JSON result, rank order."""
    out_dir.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes=1", f"--nproc_per_node={nproc}",
        "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}",
        str(Path(__file__).with_name("dist_worker.py")), *args, str(out_dir),
    ]
    full_env = dict(os.environ)
    full_env.update({"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"})
    full_env.update(env or {})
    proc = subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=timeout)
    results = []
    for r in range(nproc):
        f = out_dir / f"rank{r}.json"
        if not f.exists():
            pytest.fail(
                f"rank {r} wrote no result (torchrun exit {proc.returncode})\n"
                f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
            )
        results.append(json.loads(f.read_text()))
    return proc, results
