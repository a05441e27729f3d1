#!/usr/bin/env bash
# MLX's CUDA backend on a lent NVIDIA machine (docs/gpu.md), in two steps of one warm machine:
#
#   bash scripts/mlx_cuda.sh install          # join the wheel parts earlier calls left in /tmp/mlxparts
#                                              # (part0, part1, ... and the mlx, mlx-lm wheels), check
#                                              # the sha256, pip install --target /tmp/mlxsite
#   bash scripts/mlx_cuda.sh run CMD ARGS...  # run CMD (e.g. .venv/bin/specstream-mlx bench ...) with it
#
# `run` puts the adapters and draft model of a carried .gpuside/ folder in place first (every call
# re-sends the work tree, so what an earlier call moved is gone), makes .venv/bin/python and
# .venv/bin/specstream-mlx point at the machine's python3 with MLX-CUDA on PYTHONPATH, and checks
# that MLX's default device is the GPU. Needs only what the machine has (torch's CUDA 13 libraries).
set -euo pipefail
cd "$(dirname "$0")/.."
SITE=/tmp/mlxsite
PARTS=/tmp/mlxparts
WHEEL=mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl
SHA=94cb48fba73e5ee39467e51c35c51c691123359ca17bafd1a24cf92ad6732bee
case ${1:-} in
  install)
    cat "$PARTS"/part? > "$PARTS/$WHEEL"
    echo "$SHA  $PARTS/$WHEEL" | sha256sum -c -
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$PARTS/$WHEEL" \
      "$PARTS"/mlx-0.32.4-*.whl "$PARTS"/mlx_lm-*.whl
    # libmlx.so finds the CUDA libraries at $ORIGIN/../../nvidia: torch's copies
    ln -sfn "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/nvidia" "$SITE/nvidia"
    ;;
  run)
    shift
    [ $# -gt 0 ] || { echo "usage: scripts/mlx_cuda.sh run CMD [ARGS...]" >&2; exit 2; }
    if [ -d .gpuside/adapters ]; then
      mkdir -p models/specstream-tiny/mlx/adapters
      cp -r .gpuside/adapters/. models/specstream-tiny/mlx/adapters/
    fi
    [ ! -d .gpuside/draft ] || cp -r .gpuside/draft models/specstream-tiny/mlx/
    export PYTHONPATH=$SITE:$PWD SPECSTREAM_BLAS=reference PYTHONUNBUFFERED=1
    mkdir -p .venv/bin
    ln -sf "$(command -v python3)" .venv/bin/python
    printf '%s\n' '#!/bin/sh' \
      "exec python3 -c \"import sys; sys.argv[0] = 'specstream-mlx'; from mlx_specstream.cli import main; main()\" \"\$@\"" \
      > .venv/bin/specstream-mlx
    chmod +x .venv/bin/specstream-mlx
    python3 -c 'import mlx.core as mx; d = mx.default_device(); assert d.type == mx.DeviceType.gpu, d; print("MLX", mx.__version__, d)'
    "$@"
    ;;
  *) echo "usage: scripts/mlx_cuda.sh install | run CMD [ARGS...]" >&2; exit 2 ;;
esac
