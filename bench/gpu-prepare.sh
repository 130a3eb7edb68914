#!/usr/bin/env bash
# Prepares bench/gpu.sh's one call on a GPU machine, here: `ostinato` built with
# candle's CUDA backend for Hopper (sm_90; the PyPI toolchain, bench/cuda-toolchain.sh),
# stripped and gzipped (a call carries 64 MiB), and the diffusers wheel the machine lacks
# (pure Python; torch, peft and transformers are there), all in the ignored .gpu/.
# Then run bench/gpu.sh there with `carry: [".gpu"]`.
#
#   bench/gpu-prepare.sh      # CUDA_TARGET_DIR (default ../cuda-target) keeps the build
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
grep -qx '/.gpu/' "$root/.git/info/exclude" 2>/dev/null || echo '/.gpu/' >> "$root/.git/info/exclude"
eval "$("$root/bench/cuda-toolchain.sh")"
export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-90}" CARGO_TARGET_DIR="${CUDA_TARGET_DIR:-$root/../cuda-target}"
cargo build --release --locked -p ostinato-cli --features cuda
mkdir -p "$root/.gpu/wheels"
strip -o "$root/.gpu/ostinato" "$CARGO_TARGET_DIR/release/ostinato"
gzip -9f "$root/.gpu/ostinato"
# 0.42.1: its AceStepTransformer1DModel takes `encoder_hidden_size` (XL).
python3 -m pip download -q --no-deps --only-binary=:all: -d "$root/.gpu/wheels" "diffusers==0.42.1"
ls -l "$root/.gpu" "$root/.gpu/wheels"
