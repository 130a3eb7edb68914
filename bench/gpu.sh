#!/usr/bin/env bash
# Our training step against PyTorch's on the same GPU, in one call (issue 50): the 2B
# at 30 s and at 4 minutes and XL at 30 s (HOT-Step's setting: LoRA r16 on attention),
# checkpointing on and off, ours and PyTorch's interleaved A B A B, each a median over
# steps after warm-up. One process per configuration (GPU memory peaks are per
# process). Then a per-kernel-class profile of one 2B layer's step (ncu, where it reads
# the counters), and the CPU-side trace of the same step.
#
# Ours: `ostinato bench` with candle's CUDA backend (bf16 weights and compute, f32 LoRA
# and AdamW); its report carries the card's bf16 product rate measured in the same call
# and the fraction of it the step reached, and the GPU memory the driver reports.
# PyTorch: bench/reference/bench_torch.py --device cuda --dtype bf16 (diffusers'
# AceStepTransformer1DModel + PEFT LoRA, bf16 autocast, SDPA).
#
# Prepared here by bench/gpu-prepare.sh (the CUDA binary, gzipped, and the diffusers
# wheel, in .gpu/); on the GPU machine, carrying .gpu:
#
#   bench/gpu.sh [--rounds N] [--steps N] [--warmup N] [--only NAME] 2>&1 | tee $OUT/gpu.log
#
# Results: bench/results/gpu-<time>.jsonl (copy it to $OUT) and the table at the end.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
rounds=2 steps=5 warmup=2 only=""
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --warmup) warmup="$2"; shift 2 ;;
    --only) only="$2"; shift 2 ;;
    *) echo "gpu.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
gpu="$root/.gpu"
bin="${OSTINATO_BIN:-/tmp/ostinato}"
[ -x "$bin" ] || { gunzip -c "$gpu/ostinato.gz" > "$bin"; chmod +x "$bin"; }
# diffusers (pure Python) from its carried wheel; torch, peft and transformers are there.
if ! python3 -c 'import diffusers' 2>/dev/null; then
  mkdir -p /tmp/pydeps
  python3 -m pip install -q --no-deps --no-index --target /tmp/pydeps "$gpu"/wheels/*.whl
  export PYTHONPATH="/tmp/pydeps${PYTHONPATH:+:$PYTHONPATH}"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

# name | our flags | PyTorch's preset
configs=(
  "2b-30s|--preset full-layer --layers 24|full-30s"
  "2b-240s|--preset full-240s|full-240s"
  "xl-30s|--preset xl-30s|xl-30s"
)
mkdir -p "$root/bench/results"
out="$root/bench/results/gpu-$(date +%Y%m%d-%H%M%S).jsonl"
tag() { python3 -c 'import json,sys; r=json.loads(sys.argv[1]); r.update(name=sys.argv[2], impl=sys.argv[3], round=int(sys.argv[4])); print(json.dumps(r))' "$@"; }
for round in $(seq 1 "$rounds"); do
  for c in "${configs[@]}"; do
    IFS='|' read -r name ours torch_preset <<< "$c"
    [ -z "$only" ] || [ "$only" = "$name" ] || continue
    for ckpt in on off; do
      echo "== round $round: $name, checkpointing $ckpt" >&2
      # shellcheck disable=SC2086 # our flags are words
      if json="$("$bin" bench $ours --gradient-checkpointing "$ckpt" --warmup "$warmup" --steps "$steps" --json)"; then
        tag "$json" "$name" ours "$round" | tee -a "$out"
      else
        echo "{\"name\":\"$name\",\"impl\":\"ours\",\"round\":$round,\"gradient_checkpointing\":$([ $ckpt = on ] && echo true || echo false),\"failed\":true}" | tee -a "$out"
      fi
      if json="$(python3 "$root/bench/reference/bench_torch.py" --preset "$torch_preset" --device cuda --dtype bf16 \
        --gradient-checkpointing "$ckpt" --warmup "$warmup" --steps "$steps" --json)"; then
        tag "$json" "$name" pytorch "$round" | tee -a "$out"
      else
        echo "{\"name\":\"$name\",\"impl\":\"pytorch\",\"round\":$round,\"gradient_checkpointing\":$([ $ckpt = on ] && echo true || echo false),\"failed\":true}" | tee -a "$out"
      fi
    done
  done
done
python3 "$root/bench/gpu_table.py" "$out"

# Where our time goes: one 2B layer at 30 s, kernel by kernel (ncu serialises kernels:
# its times are each kernel alone). Two runs, one step and two steps after the same
# set-up: their difference is one step's kernels.
if command -v ncu >/dev/null && [ -z "$only" ]; then
  for n in 1 2; do
    ncu --clock-control none --metrics gpu__time_duration.sum --csv --page raw \
      "$bin" bench --preset full-layer --gradient-checkpointing on --warmup 0 --steps "$n" --json \
      > "/tmp/ncu-$n.csv" 2> "/tmp/ncu-$n.log" || { echo "ncu did not profile:" >&2; tail -5 "/tmp/ncu-$n.log" >&2; }
  done
  [ -s /tmp/ncu-2.csv ] && python3 "$root/bench/gpu_profile.py" /tmp/ncu-1.csv /tmp/ncu-2.csv
fi
"$bin" bench --preset full-layer --trace
echo "raw: $out" >&2
