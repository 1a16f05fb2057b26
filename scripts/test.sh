#!/usr/bin/env bash
# The whole test suite: the Rust workspace (cargo test) and the Python
# package (pytest, including real multi-process torch.distributed runs on
# the gloo backend). Makes a virtual environment under target/venv the first
# time (PyTorch's wheel is large: pip's cache keeps it for the next clone),
# builds the package into it with maturin (the dev profile: it reuses the
# workspace's debug build), then runs both suites.
set -euo pipefail
cd "$(dirname "$0")/.."

venv="${SWITCHYARD_VENV:-target/venv}"
py="$venv/bin/python"
if [ ! -x "$py" ]; then
  echo "== python: making $venv"
  python3 -m venv "$venv"
fi
if ! "$py" -c "import maturin, numpy, pytest, torch" 2>/dev/null; then
  echo "== python: installing maturin, numpy, pytest, torch into $venv"
  "$py" -m pip install -q --upgrade pip
  "$py" -m pip install -q -r python/requirements-test.txt
fi

echo "== rust: cargo test --workspace"
cargo test --workspace

echo "== python: building the switchyard package (maturin develop)"
PATH="$(cd "$venv" && pwd)/bin:$PATH" VIRTUAL_ENV="$(cd "$venv" && pwd)" "$venv/bin/maturin" develop -q -m python/Cargo.toml

echo "== python: pytest"
# The tests compare against the CLI binary `cargo test` has just built.
target_dir="${CARGO_TARGET_DIR:-target}"
SWITCHYARD_BIN="$(cd "$target_dir" && pwd)/debug/switchyard" "$py" -m pytest -q python/tests
