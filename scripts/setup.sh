#!/usr/bin/env bash
# One-command set-up: a virtual environment in .venv with mlx-specstream and its test tools,
# plus an optimized BLAS on Linux (MLX's CPU wheel ships the slow reference BLAS).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
if [ "$(uname -s)" = "Linux" ]; then
  # torch (import of .bin checkpoints, Core ML export): the CPU build where pip finds one (this
  # project's machines have it on disk); PyPI's x86_64 wheel is the CUDA build, GBs. Elsewhere,
  # PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu picks the CPU one (2.13.0+cpu).
  .venv/bin/python -m pip install -q "torch==2.13.0"
  if [ ! -e /usr/lib/x86_64-linux-gnu/libopenblas.so.0 ] && [ ! -e /usr/lib/aarch64-linux-gnu/libopenblas.so.0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libopenblas0-pthread) >/dev/null \
        || echo "setup: could not install OpenBLAS with apt-get; MLX will use the reference BLAS"
    else
      echo "setup: no root/apt-get: install libopenblas0-pthread (or 'pip install mkl' into .venv) for fast CPU matmuls"
    fi
  fi
fi
.venv/bin/python -m pip install -q -e ".[dev]"
.venv/bin/specstream-mlx blas
