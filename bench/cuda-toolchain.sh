#!/usr/bin/env bash
# A CUDA 13.0 compiler toolchain from PyPI wheels, for building `--features cuda` without
# a system CUDA toolkit: nvcc/cicc/ptxas, headers, and the libraries candle links
# (cudart, cublas, cublasLt, curand, nvrtc; ~1.2 GB installed). The wheels ship no
# libcuda, which comes with the NVIDIA driver: a link-time stub (lib/stubs/libcuda.so,
# soname libcuda.so.1) is generated from cuda.h so the build also links on a machine
# without a GPU; at run time the driver's libcuda.so.1 is used. Running the kernels
# needs a driver for CUDA >= 13.0 (R580+). Needs PyPI, python3 and a C compiler.
# Progress goes to stderr; stdout is the `export` lines, hence:
#
#   eval "$(bench/cuda-toolchain.sh [VENV_DIR])"   # default ~/.cache/ostinato/venv-cuda
set -euo pipefail
venv="${1:-${CUDA_VENV:-$HOME/.cache/ostinato/venv-cuda}}"
# cudarc 0.19 (candle 0.11) knows CUDA up to 13.4; 13.0 asks the least of the driver.
spec='cuda-toolkit[nvcc,crt,nvvm,cudart,cccl,cublas,curand,nvrtc]==13.0.2'
if [ ! -x "$venv/bin/python" ]; then
  echo "cuda-toolchain: creating $venv" >&2
  python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check "$spec" >&2
cu="$("$venv/bin/python" -c 'import nvidia, os; print(os.path.join(nvidia.__path__[0], "cu13"))')"
# Unversioned names for the linker (-lcublas etc.); the wheels ship only libX.so.N.
for l in cudart cublas cublasLt curand nvrtc; do
  [ -e "$cu/lib/lib$l.so" ] || ln -s "$(basename "$(ls "$cu/lib/lib$l.so."[0-9]* | head -1)")" "$cu/lib/lib$l.so"
done
if [ ! -e "$cu/lib/stubs/libcuda.so" ]; then
  mkdir -p "$cu/lib/stubs"
  # Every driver entry point the header declares (versioned names after macro expansion).
  { echo '#include <cuda.h>' | cc -E -P -I"$cu/include" - | grep -oE '\bcu[A-Z][A-Za-z0-9_]*[[:space:]]*\(' | tr -d '( '
    grep -ohE 'CUDAAPI[[:space:]]+cu[A-Za-z0-9_]+' "$cu/include/cuda.h" | awk '{print $2}'
  } | sort -u | sed 's/.*/int &(void) { return 100; }/' > "$cu/lib/stubs/libcuda-stub.c"
  cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$cu/lib/stubs/libcuda.so" "$cu/lib/stubs/libcuda-stub.c"
fi
"$cu/bin/nvcc" --version | tail -1 >&2
if command -v nvidia-smi >/dev/null; then
  drv="$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)" || drv=""
  [ -z "$drv" ] || [ "${drv%%.*}" -ge 580 ] || echo "cuda-toolchain: driver $drv is older than R580 (CUDA 13.0); the kernels will not load" >&2
fi
echo "export PATH=\"$cu/bin:\$PATH\" CUDA_ROOT=\"$cu\" CUDA_HOME=\"$cu\""
echo "export LD_LIBRARY_PATH=\"$cu/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}\""
# candle-kernels asks nvidia-smi for the target GPU; without one, build for Hopper (sm_90).
command -v nvidia-smi >/dev/null || echo "export CUDA_COMPUTE_CAP=\"\${CUDA_COMPUTE_CAP:-90}\""
