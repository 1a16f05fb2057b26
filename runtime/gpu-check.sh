#!/usr/bin/env bash
# GPU check of the CUDA backend on a machine with NVIDIA GPUs (docs/runtime.md
# says what it proves and what it cannot). Every step runs even when an
# earlier one failed; each prints why it failed, and one table comes last.
# Exit status: 0 when every step that ran passed, 1 otherwise.
#
# Steps (GPU count from CUDA_VISIBLE_DEVICES when it is set, else nvidia-smi):
#  - the runtime's tests on the device (runtime/tests/cuda_plans.rs: random
#    plans, every scheduler, XML read back, graph replays, --devices 0,
#    --inject reverse-order; each checked against the CPU backend);
#  - the CLI: the check catches an ordering bug on the device
#    (--inject reverse-order, --iterations 1 and 5, must fail);
#  - one process, one GPU: 2 x DGX-H100 `direct` and `fast` plans (16
#    ranks), 1 and 8 streams per rank and replayed from a CUDA graph, with
#    their copy rate next to one device-to-device copy (the rate table);
#  - one GPU, every rank in a context of its own (--context-per-rank), so
#    copies between ranks take the peer-copy call and event waits cross
#    contexts;
#  - NCCL on one GPU: a one-rank plan as a one-process NCCL group that sends
#    to itself (--nccl-loopback): communicator, groups, send/recv, teardown;
#  - two or more GPUs: every visible device in one process (--devices 0),
#    2 x 1 process groups (`direct`, `fast`) and a 1 x N `fast` plan through
#    NCCL groups, one process per GPU;
#  - error paths, each one line and exit 1: no visible device, no libnccl
#    (only where it is missing), two ranks on one GPU, a missing rank, a
#    plan the device cannot hold.
#
#   runtime/gpu-check.sh            # or: MIB_PER_RANK=64 runtime/gpu-check.sh
#
# On a GPU machine without cargo, build where cargo is and pass the executables
# (the time budget, under 5 minutes on one H200, assumes this):
#   cargo build --release --features cuda --bin switchyard
#   cargo test --release --features cuda -p switchyard-runtime --no-run
#   SWITCHYARD_BIN=.../switchyard SWITCHYARD_TESTS=".../cuda_plans-<hash> .../switchyard_runtime-<hash>" runtime/gpu-check.sh
#
# cudarc loads NCCL as libnccl.so; where only libnccl.so.2 exists (pip's
# nvidia-nccl wheels, some images), this script links it in a temporary
# directory on LD_LIBRARY_PATH.
set -o pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
export CARGO_TERM_COLOR=never
MIB_PER_RANK="${MIB_PER_RANK:-128}"
W="$(mktemp -d)"
trap 'rm -rf "$W"' EXIT
T0=$(date +%s)
rows=()
failed=0
nstep=0

# step NAME CMD...: runs CMD with its output in a log; records ok or FAIL
# (with the reason: the last line of its output) in the table.
step() {
  local name="$1"
  shift
  nstep=$((nstep + 1))
  local log="$W/step.$nstep.log"
  local t0 t1 rc
  echo "== $name"
  t0=$(date +%s.%N)
  "$@" >"$log" 2>&1
  rc=$?
  t1=$(date +%s.%N)
  local secs
  secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
  if [ "$rc" -eq 0 ]; then
    tail -n 3 "$log"
    rows+=("| $name | ok | $secs | $(tail -n 1 "$log" | cut -c1-120 | tr '|' '/') |")
  else
    failed=1
    echo "-- FAILED (exit $rc); last lines:"
    tail -n 20 "$log"
    rows+=("| $name | FAIL | $secs | exit $rc: $(grep -v '^$' "$log" | tail -n 1 | cut -c1-160 | tr '|' '/') |")
  fi
}

skip() {
  echo "== $1: skipped ($2)"
  rows+=("| $1 | skip | - | $2 |")
}

# expect_fail PATTERN CMD...: passes when CMD exits 1 with exactly one line
# on stderr, containing PATTERN, and no panic.
expect_fail() {
  local pat="$1"
  shift
  local err="$W/expect.$RANDOM.err" rc lines
  "$@" >/dev/null 2>"$err"
  rc=$?
  lines=$(grep -c . "$err")
  if [ "$rc" -eq 1 ] && [ "$lines" -eq 1 ] && grep -q -- "$pat" "$err" && ! grep -q panicked "$err"; then
    cat "$err"
    return 0
  fi
  echo "expected exit 1 and one line containing '$pat'; got exit $rc and $lines lines: $(head -c 400 "$err" | tr '\n' ' ')"
  return 1
}

# group N EXPECT PLAN TRAFFIC [ARGS...]: one process per rank (RANK =
# LOCAL_RANK = 0..N-1, WORLD_SIZE = N, a fresh SWITCHYARD_PORT). EXPECT
# `ok`: every rank exits 0 and verifies; otherwise a pattern that every
# rank's one-line error must contain (exit 1). GROUP_ENV (VAR=value words)
# is added to every rank's environment; ONLY_RANK, when set, starts that
# rank alone.
GROUP_ENV=()
ONLY_RANK=
group() {
  local n="$1" expect="$2" plan="$3" traffic="$4"
  shift 4
  local port=$((29600 + RANDOM % 3000)) pids=() ranks=() r rc bad=0
  for r in $(seq 0 $((n - 1))); do
    if [ -n "$ONLY_RANK" ] && [ "$r" != "$ONLY_RANK" ]; then continue; fi
    env "${GROUP_ENV[@]}" RANK=$r LOCAL_RANK=$r WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 SWITCHYARD_PORT=$port \
      timeout 180 "$S" run --plan "$plan" --traffic "$traffic" --backend cuda "$@" \
      >"$W/g.$r.out" 2>"$W/g.$r.err" &
    pids+=($!)
    ranks+=("$r")
  done
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}"
    rc=$?
    r=${ranks[$i]}
    if [ "$expect" = ok ]; then
      if [ "$rc" -ne 0 ] || ! grep -q "every output byte verified" "$W/g.$r.out"; then
        bad=1
        echo "rank $r: exit $rc: $(head -c 400 "$W/g.$r.err" | tr '\n' ' ')"
      fi
    elif [ "$rc" -ne 1 ] || [ "$(grep -c . "$W/g.$r.err")" -ne 1 ] || ! grep -q -- "$expect" "$W/g.$r.err"; then
      bad=1
      echo "rank $r: expected exit 1 and one line containing '$expect'; got exit $rc: $(head -c 400 "$W/g.$r.err" | tr '\n' ' ')"
    fi
  done
  for r in "${ranks[@]}"; do
    echo "rank $r: $(tail -n 1 "$W/g.$r.out" 2>/dev/null) $(head -n 1 "$W/g.$r.err")"
  done
  return $bad
}

# GPUs visible to this script's processes: CUDA_VISIBLE_DEVICES decides
# where it is set (empty: none), nvidia-smi otherwise.
smi_gpus=$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU ')
if [ -n "${CUDA_VISIBLE_DEVICES+x}" ]; then
  GPUS=$(printf '%s' "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c .)
  [ "$smi_gpus" -gt 0 ] && [ "$GPUS" -gt "$smi_gpus" ] && GPUS=$smi_gpus
else
  GPUS=$smi_gpus
fi
(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true) | head -n 8
echo "visible GPUs: $GPUS (CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset})"

if [ -n "${SWITCHYARD_BIN:-}" ]; then
  S="$SWITCHYARD_BIN"
else
  build() { cargo build --release --features cuda --bin switchyard 2>&1 | tail -n 3; }
  step "build (release, --features cuda)" build
  S="$CARGO_TARGET_DIR/release/switchyard"
fi
if [ ! -x "$S" ]; then
  echo "no switchyard executable at $S"
  exit 1
fi

if ! ldconfig -p 2>/dev/null | grep -q 'libnccl\.so '; then
  lib=$(ldconfig -p 2>/dev/null | sed -n 's/.*libnccl\.so\.2 .*=> //p' | head -n 1)
  [ -n "$lib" ] || lib=$(find /usr /opt -name 'libnccl.so.2' 2>/dev/null | head -n 1)
  if [ -n "$lib" ]; then
    mkdir -p "$W/nccl" && ln -sf "$lib" "$W/nccl/libnccl.so"
    export LD_LIBRARY_PATH="$W/nccl${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
fi
NCCL=1
ldconfig -p 2>/dev/null | grep -q 'libnccl\.so ' || [ -e "$W/nccl/libnccl.so" ] || NCCL=0

# Ends with one line naming every test binary's result (the table keeps the
# last line), so the table says which tests ran, not only the last binary.
runtime_tests() {
  local t rc=0 log="$W/tests.log" summary=()
  if [ -n "${SWITCHYARD_TESTS:-}" ]; then
    for t in $SWITCHYARD_TESTS; do
      echo "-- $(basename "$t")"
      timeout 240 "$t" >"$log" 2>&1 || rc=1
      grep -E '^test |test result|skipping|panicked' "$log"
      summary+=("$(basename "$t" | sed 's/-[0-9a-f]*$//'): $(grep -o '[0-9]* passed; [0-9]* failed' "$log" | tail -n 1)")
    done
  else
    timeout 300 cargo test --release --features cuda -p switchyard-runtime >"$log" 2>&1 || rc=1
    grep -E '^test |test result|skipping|panicked|^error|Running' "$log"
    summary+=("$(grep -o '[0-9]* passed; [0-9]* failed' "$log" | awk '{ p += $1; f += $3 } END { printf "%d passed; %d failed", p, f }')")
  fi
  local joined
  joined=$(printf '%s, ' "${summary[@]}")
  echo "${joined%, }"
  return $rc
}
step "runtime tests on the device" runtime_tests

# Inputs: 2 x DGX-H100 (16 ranks) at three sizes, a 2 x 1 and a 1 x N
# cluster for process groups, one rank for NCCL loopback.
mk() { "$S" "$@" >/dev/null 2>&1 || echo "setup failed: $*"; }
mk topology --preset dgx-h100 --nodes 2 --out "$W/topo.json"
PAIR=$((MIB_PER_RANK * 1024 * 1024 / 16))
TOKENS=$((MIB_PER_RANK * 1024 * 1024 / (2 * 4096 * 2)))
mk traffic --ranks 16 --pattern uniform --bytes "$PAIR" --out "$W/uniform.json"
mk traffic --ranks 16 --pattern zipf:1.2 --tokens "$TOKENS" --hidden 4096 --bytes-per-elem 2 --out "$W/moe.json"
mk traffic --ranks 16 --pattern zipf:1.2 --tokens 64 --hidden 512 --out "$W/small.json"
for m in uniform moe small; do
  for alg in direct fast; do
    mk compile --topology "$W/topo.json" --traffic "$W/$m.json" --algorithm "$alg" --out "$W/$m.$alg.plan.json"
  done
done
mk topology --preset dgx-h100 --nodes 1 --gpus-per-node 1 --out "$W/one.topo.json"
mk traffic --ranks 1 --pattern uniform --bytes 4194304 --out "$W/one.json"
mk compile --topology "$W/one.topo.json" --traffic "$W/one.json" --algorithm direct --out "$W/one.plan.json"

step "cpu cross-check (small fast plan)" \
  timeout 120 "$S" run --plan "$W/small.fast.plan.json" --traffic "$W/small.json" --backend cpu

reverse() {
  local it
  for it in 1 5; do
    expect_fail "verification failed" timeout 120 "$S" run --plan "$W/small.fast.plan.json" \
      --traffic "$W/small.json" --backend cuda --devices 1 --inject reverse-order --iterations "$it" || return 1
    expect_fail "verification failed" timeout 120 "$S" run --plan "$W/small.fast.plan.json" \
      --traffic "$W/small.json" --backend cuda --devices 1 --inject reverse-order --iterations "$it" --graph || return 1
  done
}
step "cuda: --inject reverse-order is caught (iterations 1 and 5, graph too)" reverse

step "cuda: one context per rank on GPU 0 (peer-copy call, cross-context events)" \
  timeout 120 "$S" run --plan "$W/small.fast.plan.json" --traffic "$W/small.json" --backend cuda \
  --devices 1 --context-per-rank --channels 2 --iterations 3

if [ "$NCCL" -eq 1 ]; then
  step "nccl: one-rank group sending to itself (--nccl-loopback)" \
    timeout 120 "$S" run --plan "$W/one.plan.json" --traffic "$W/one.json" --backend cuda \
    --nccl-loopback --iterations 3 --timeout 60
else
  skip "nccl: one-rank group sending to itself (--nccl-loopback)" "no libnccl"
fi

if [ "$GPUS" -ge 2 ]; then
  multi() {
    local alg
    for alg in direct fast; do
      timeout 120 "$S" run --plan "$W/small.$alg.plan.json" --traffic "$W/small.json" --backend cuda \
        --devices 0 --iterations 3 || return 1
    done
  }
  step "cuda: every visible device in one process (--devices 0, $GPUS GPUs)" multi
  if [ "$NCCL" -eq 1 ]; then
    mk topology --preset dgx-h100 --nodes 2 --gpus-per-node 1 --out "$W/g.topo.json"
    mk traffic --ranks 2 --pattern lognormal:1.0 --bytes 4194304 --out "$W/g.json"
    N=$((GPUS < 8 ? GPUS : 8))
    mk topology --preset dgx-h100 --nodes 1 --gpus-per-node "$N" --out "$W/n.topo.json"
    mk traffic --ranks "$N" --pattern zipf:1.2 --tokens 256 --hidden 1024 --out "$W/n.json"
    for alg in direct fast; do
      mk compile --topology "$W/g.topo.json" --traffic "$W/g.json" --algorithm "$alg" --out "$W/g.$alg.plan.json"
      step "nccl: 2 x 1 $alg, two processes" group 2 ok "$W/g.$alg.plan.json" "$W/g.json" --iterations 3 --timeout 60
    done
    mk compile --topology "$W/n.topo.json" --traffic "$W/n.json" --algorithm fast --out "$W/n.fast.plan.json"
    step "nccl: 1 x $N fast, $N processes (NCCL groups per level)" \
      group "$N" ok "$W/n.fast.plan.json" "$W/n.json" --iterations 3 --timeout 60
  else
    skip "nccl: process groups" "no libnccl"
  fi
else
  skip "cuda: every visible device in one process (--devices 0)" "needs two GPUs"
  skip "nccl: process groups (2 x 1, 1 x N)" "needs two GPUs"
fi

# Error paths: each one line, exit 1, no hang.
no_device() {
  expect_fail "no CUDA device is visible" env CUDA_VISIBLE_DEVICES= timeout 60 "$S" run \
    --plan "$W/small.direct.plan.json" --traffic "$W/small.json" --backend cuda
}
step "error: no visible device" no_device
if [ "$NCCL" -eq 0 ]; then
  no_nccl() {
    expect_fail "NCCL could not be loaded" env RANK=0 WORLD_SIZE=2 SWITCHYARD_PORT=29599 timeout 60 "$S" run \
      --plan "$W/e.plan.json" --traffic "$W/e.json" --backend cuda
  }
else
  skip "error: no libnccl" "libnccl is installed (cannot hide it)"
fi
mk topology --preset dgx-h100 --nodes 2 --gpus-per-node 1 --out "$W/g.topo.json"
mk traffic --ranks 2 --pattern uniform --bytes 65536 --out "$W/e.json"
mk compile --topology "$W/g.topo.json" --traffic "$W/e.json" --algorithm direct --out "$W/e.plan.json"
[ "$NCCL" -eq 0 ] && step "error: no libnccl" no_nccl
if [ "$NCCL" -eq 1 ]; then
  first_gpu=${CUDA_VISIBLE_DEVICES:-0}
  first_gpu=${first_gpu%%,*}
  two_on_one() {
    GROUP_ENV=(CUDA_VISIBLE_DEVICES="$first_gpu")
    group 2 CUDA_VISIBLE_DEVICES "$W/e.plan.json" "$W/e.json" --timeout 20
    local rc=$?
    GROUP_ENV=()
    return $rc
  }
  step "error: two ranks on one GPU (refused before NCCL, naming CUDA_VISIBLE_DEVICES)" two_on_one
  alone() {
    ONLY_RANK=$1
    group 2 "$2" "$W/e.plan.json" "$W/e.json" --timeout 5
    local rc=$?
    ONLY_RANK=
    return $rc
  }
  step "error: a missing rank (rank 0 alone, --timeout 5)" alone 0 "only 1 of 2 ranks joined"
  step "error: rank 0 missing (rank 1 alone, --timeout 5)" alone 1 "cannot reach rank 0"
else
  skip "error: two ranks on one GPU, a missing rank" "no libnccl"
fi
python3 - "$W/small.direct.plan.json" "$W/huge.plan.json" <<'PY' 2>/dev/null || cp "$W/small.direct.plan.json" "$W/huge.plan.json"
import json, sys
p = json.load(open(sys.argv[1]))
p["scratch"] = [1 << 50] + [0] * (p["ranks"] - 1)
json.dump(p, open(sys.argv[2], "w"))
PY
step "error: a plan the device cannot hold (1 PB of scratch)" \
  expect_fail "memory on device 0" timeout 60 "$S" run --plan "$W/huge.plan.json" --traffic "$W/small.json" \
  --backend cuda --devices 1

# The rate table: all 16 ranks on GPU 0.
field() { sed -n "s/^  \"$2\": \([^,]*\),\{0,1\}$/\1/p" "$1"; }
rates=()
rate_runs() {
  local m alg how ch out bytes
  local -a graph
  for m in small uniform moe; do
    for alg in direct fast; do
      for how in 1 8 8g; do
        ch=${how%g}
        graph=()
        [ "$how" = "$ch" ] || graph=(--graph)
        out="$W/$m.$alg.$how.json"
        if ! timeout 300 "$S" run --plan "$W/$m.$alg.plan.json" --traffic "$W/$m.json" --backend cuda \
          --devices 1 --channels "$ch" --iterations 3 --reference "${graph[@]}" --json >"$out" 2>"$W/err"; then
          echo "$m $alg $how: $(cat "$W/err")"
          rates+=("| $m | $alg | - | $how | run failed | - | - | - |")
          continue
        fi
        bytes=$(awk '/^    "(local|nvlink|rdma)":/ { gsub(/[^0-9]/, "", $2); s += $2 } END { print s + 0 }' "$out")
        rates+=("$(awk -v m="$m $alg" -v b="$bytes" -v l="$(field "$out" lanes)${graph[*]:+ graph}" -v v="$(field "$out" verified)" \
          -v r="$(field "$out" copy_rate_gbps)" -v ref="$(field "$out" reference_gbps)" \
          'BEGIN { split(m, ma, " "); printf "| %s | %s | %.0f | %s | %s | %.1f | %.1f | %.2f |", ma[1], ma[2], b / 1048576, l, v, r, ref, (ref > 0 ? r / ref : 0) }')")
      done
    done
  done
  printf '%s\n' "${rates[@]}" | grep -q 'run failed\|false' && return 1
  echo "${#rates[@]} runs verified"
}
step "cuda: 2 x DGX-H100 plans on GPU 0, rates ($MIB_PER_RANK MiB per rank)" rate_runs

echo
echo "Copy rates: all 16 ranks of 2 x DGX-H100 plans on one GPU (best of 3 runs, each checked; graph: replayed from a CUDA graph)"
echo "| traffic | algorithm | MiB | streams | verified | plan GB/s | one d2d copy GB/s | ratio |"
echo "|---|---|---|---|---|---|---|---|"
printf '%s\n' "${rates[@]}"
echo
echo "GPU check: $GPUS visible GPU(s), $(($(date +%s) - T0)) s"
echo "| step | result | seconds | note |"
echo "|---|---|---|---|"
printf '%s\n' "${rows[@]}"
exit $failed
