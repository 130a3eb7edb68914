#!/usr/bin/env bash
# Creates bench/reference/.venv with CPU PyTorch + diffusers 0.42.1 + peft from PyPI.
#
# PyPI's Linux torch wheel depends on ~3 GB of nvidia-* CUDA wheels. On CPU they are
# never loaded, so torch is installed with --no-deps plus its small pure-python deps.
# Measured: installing peft afterwards still re-resolves torch's requirements and
# pulls the nvidia-* wheels (the venv ends at ~5.7 GB, a few minutes on a fast link);
# CPU use works either way.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${VENV:-$here/.venv}"
python="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
pip="$venv/bin/pip"
"$pip" install --quiet --upgrade pip
if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
  "$pip" install --no-deps "torch${TORCH_VERSION:+==$TORCH_VERSION}"
  "$pip" install filelock typing-extensions sympy networkx jinja2 fsspec
fi
"$pip" install "diffusers==0.42.1" peft numpy
# peft pulls accelerate/transformers; make sure they did not replace torch with a CUDA build.
"$venv/bin/python" -c "import torch, diffusers, peft; print('torch', torch.__version__, 'diffusers', diffusers.__version__, 'peft', peft.__version__)"
