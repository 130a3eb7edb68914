#!/usr/bin/env bash
# Builds `ostinato` with candle's CUDA backend and runs the bench presets on GPU 0
# (bf16 weights, f32 LoRA/optimizer, as the precision policy), checkpointing off and on.
# One process per configuration. Needs nvcc for candle-kernels: without a CUDA toolkit on
# PATH it takes one from PyPI wheels (bench/cuda-toolchain.sh). On a GPU machine without
# Rust or a network, build here (`cargo build --release -p ostinato-cli --features cuda`
# with CUDA_COMPUTE_CAP set for the GPU) and name the binary in OSTINATO_BIN.
#
#   [OSTINATO_BIN=path] bench/gpu.sh [--steps N] [--warmup N] [PRESET ...]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
steps=5 warmup=2 presets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps="$2"; shift 2 ;;
    --warmup) warmup="$2"; shift 2 ;;
    *) presets+=("$1"); shift ;;
  esac
done
[ ${#presets[@]} -gt 0 ] || presets=(small-30s small-240s full-layer full-pair-240s)
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
bin="${OSTINATO_BIN:-}"
if [ -z "$bin" ]; then
  if ! command -v nvcc >/dev/null; then toolchain="$("$root/bench/cuda-toolchain.sh")"; eval "$toolchain"; fi
  # candle-kernels compiles for the GPU it finds unless CUDA_COMPUTE_CAP is set.
  cargo build --release -p ostinato-cli --features cuda
  bin="$CARGO_TARGET_DIR/release/ostinato"
fi
mkdir -p "$root/bench/results"
out="$root/bench/results/gpu-$(date +%Y%m%d-%H%M%S).jsonl"
for p in "${presets[@]}"; do
  for ckpt in off on; do
    echo "== $p, gradient checkpointing $ckpt" >&2
    # Peak GPU memory: candle has no device probe yet, so sample nvidia-smi meanwhile.
    smi="$(mktemp)"
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > "$smi" 2>/dev/null &
    smi_pid=$!
    json="$("$bin" bench --preset "$p" --gradient-checkpointing "$ckpt" \
      --warmup "$warmup" --steps "$steps" --json)"
    kill "$smi_pid" 2>/dev/null || true
    peak_mib="$(sort -n "$smi" | tail -1)"; rm -f "$smi"
    echo "${json%\}},\"gpu_memory_used_peak_mib\":${peak_mib:-null}}" | tee -a "$out"
  done
done
python3 - "$out" <<'PY'
import json, sys
print(f"{'preset':>16} {'ckpt':>5} {'s/step':>9} {'samples/s':>10} {'GPU MiB':>9}")
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(f"{r['preset']:>16} {('on' if r['gradient_checkpointing'] else 'off'):>5} "
          f"{r['median_s_per_step']:9.4f} {r['samples_per_sec']:10.3f} {r.get('gpu_memory_used_peak_mib')!s:>9}")
PY
echo "raw: $out (peak_rss_bytes is host RSS; gpu_memory_used_peak_mib is nvidia-smi's whole-GPU figure)" >&2
