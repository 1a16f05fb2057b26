#!/usr/bin/env bash
# GPU check of the CUDA backend on a machine with NVIDIA GPUs (docs/runtime.md).
#
# 1. Runs the runtime's tests on the device (runtime/tests/cuda_plans.rs:
#    random plans, every scheduler, XML read back, CUDA-graph replays, each
#    checked against the CPU backend).
# 2. With two or more GPUs: runs a 2 x 1 plan as a process group, one process
#    per GPU (WORLD_SIZE=2, NCCL send/recv between them), and verifies it.
# 3. Maps all 16 ranks of 2 x DGX-H100 `direct` and `fast` plans onto GPU 0
#    (copies on 1 or 8 streams per rank, events for dependencies; and
#    replayed from a CUDA graph), verifies every output byte, and prints the
#    copy rate next to one plain device-to-device copy of the same bytes. A
#    CPU run of the smallest plan cross-checks the result.
# Takes a few minutes, most of it the release build; the table comes last.
#
#   runtime/gpu-check.sh            # or: MIB_PER_RANK=64 runtime/gpu-check.sh
#
# On a GPU machine without cargo, build where cargo is and pass the executables:
#   cargo build --release --features cuda --bin switchyard
#   cargo test --release --features cuda -p switchyard-runtime --no-run
#   SWITCHYARD_BIN=.../switchyard SWITCHYARD_TESTS=".../cuda_plans-<hash> ..." runtime/gpu-check.sh
#
# cudarc loads NCCL as libnccl.so; where only libnccl.so.2 exists (pip's
# nvidia-nccl wheels, some images), this script links it in a temporary
# directory on LD_LIBRARY_PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
export CARGO_TERM_COLOR=never
MIB_PER_RANK="${MIB_PER_RANK:-256}"

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
if [ -n "${SWITCHYARD_BIN:-}" ]; then
  S="$SWITCHYARD_BIN"
else
  echo "== build (release, --features cuda)"
  cargo build --release --features cuda --bin switchyard 2>&1 | tail -n 2
  S="$CARGO_TARGET_DIR/release/switchyard"
fi
status=0
echo "== runtime tests on the device"
if [ -n "${SWITCHYARD_TESTS:-}" ]; then
  for t in $SWITCHYARD_TESTS; do
    echo "-- $(basename "$t")"
    timeout 600 "$t" --nocapture 2>&1 | grep -v '^$' | tail -n 20 || status=1
  done
else
  timeout 1200 cargo test --release --features cuda -p switchyard-runtime 2>&1 | grep -E '^test |test result|skipping|panicked' || status=1
fi
W="$(mktemp -d)"
trap 'rm -rf "$W"' EXIT

if ! ldconfig -p 2>/dev/null | grep -q 'libnccl\.so '; then
  lib=$(ldconfig -p 2>/dev/null | sed -n 's/.*libnccl\.so\.2 .*=> //p' | head -n 1)
  [ -n "$lib" ] || lib=$(find /usr /opt -name 'libnccl.so.2' 2>/dev/null | head -n 1)
  if [ -n "$lib" ]; then
    mkdir -p "$W/nccl" && ln -sf "$lib" "$W/nccl/libnccl.so"
    export LD_LIBRARY_PATH="$W/nccl${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
fi

GPUS=$( (nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null || true) | wc -l)
if [ "$GPUS" -ge 2 ]; then
  echo "== process group: 2 x 1 plan, one process per GPU, NCCL between them"
  $S topology --preset dgx-h100 --nodes 2 --gpus 1 --out "$W/g.topo.json"
  $S traffic --ranks 2 --pattern lognormal:1.0 --bytes 4194304 --out "$W/g.json"
  for alg in direct fast; do
    $S compile --topology "$W/g.topo.json" --traffic "$W/g.json" --algorithm "$alg" \
      --out "$W/g.$alg.plan.json" 2>/dev/null
    pids=()
    for r in 1 0; do
      RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 SWITCHYARD_PORT=29617 \
        timeout 120 $S run --plan "$W/g.$alg.plan.json" --traffic "$W/g.json" --backend cuda \
        --iterations 3 --timeout 60 >"$W/g.$alg.$r.out" 2>&1 &
      pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || status=1; done
    echo "-- $alg, rank 0:"; cat "$W/g.$alg.0.out"; echo "-- $alg, rank 1:"; cat "$W/g.$alg.1.out"
  done
else
  echo "== process group: skipped (needs two GPUs; NCCL refuses two ranks on one)"
fi

$S topology --preset dgx-h100 --nodes 2 --out "$W/topo.json"
# uniform: MIB_PER_RANK spread evenly over the 16 peers; moe: Zipf 1.2 expert
# routing, tokens sized so every rank routes about MIB_PER_RANK MiB of bf16.
PAIR=$(( MIB_PER_RANK * 1024 * 1024 / 16 ))
TOKENS=$(( MIB_PER_RANK * 1024 * 1024 / (2 * 4096 * 2) ))
$S traffic --ranks 16 --pattern uniform --bytes "$PAIR" --out "$W/uniform.json"
$S traffic --ranks 16 --pattern zipf:1.2 --tokens "$TOKENS" --hidden 4096 --bytes-per-elem 2 --out "$W/moe.json"
$S traffic --ranks 16 --pattern zipf:1.2 --tokens 64 --hidden 512 --out "$W/small.json"
for m in uniform moe small; do
  for alg in direct fast; do
    $S compile --topology "$W/topo.json" --traffic "$W/$m.json" --algorithm "$alg" \
      --out "$W/$m.$alg.plan.json" 2>/dev/null
  done
done

field() { sed -n "s/^  \"$2\": \([^,]*\),\{0,1\}$/\1/p" "$1"; }

echo "== cpu cross-check (small plan)"
timeout 120 $S run --plan "$W/small.fast.plan.json" --traffic "$W/small.json" --backend cpu

rows=()
for m in small uniform moe; do
  for alg in direct fast; do
    # 1 and 8 streams per rank, issued copy by copy; 8 replayed from a CUDA graph.
    for how in 1 8 8g; do
      ch=${how%g}
      graph=()
      [ "$how" = "$ch" ] || graph=(--graph)
      out="$W/$m.$alg.$how.json"
      echo "== cuda: $m, $alg, $ch streams per rank ${graph[*]:-}"
      if ! timeout 300 $S run --plan "$W/$m.$alg.plan.json" --traffic "$W/$m.json" --backend cuda \
          --devices 1 --channels "$ch" --iterations 5 --reference "${graph[@]}" --json >"$out" 2>"$W/err"; then
        status=1
        cat "$W/err"
        # No driver or device: every other run would say the same.
        if grep -q "no CUDA\|not built\|driver is present but unusable" "$W/err"; then
          break 3
        fi
      fi
      cat "$out" 2>/dev/null | tr -d '\n' | cut -c1-700; echo
      [ -s "$out" ] || { rows+=("| $m | $alg | - | $how | run failed | - | - | - |"); continue; }
      bytes=$(awk '/^    "(local|nvlink|rdma)":/ { gsub(/[^0-9]/, "", $2); s += $2 } END { print s + 0 }' "$out")
      rows+=("$(awk -v m="$m $alg" -v b="$bytes" -v l="$(field "$out" lanes)${graph[*]:+ graph}" -v v="$(field "$out" verified)" \
        -v r="$(field "$out" copy_rate_gbps)" -v ref="$(field "$out" reference_gbps)" \
        'BEGIN { split(m, ma, " "); printf "| %s | %s | %.0f | %s | %s | %.1f | %.1f | %.2f |", ma[1], ma[2], b / 1048576, l, v, r, ref, (ref > 0 ? r / ref : 0) }')")
    done
  done
done

echo
echo "GPU check: all 16 ranks of 2 x DGX-H100 plans on one GPU (best of 5 runs; graph: replayed from a CUDA graph)"
echo "| traffic | algorithm | MiB | streams | verified | plan GB/s | one d2d copy GB/s | ratio |"
echo "|---|---|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
exit $status
