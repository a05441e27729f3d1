#!/usr/bin/env bash
# Rebuild the shipped model, models/specstream-tiny/, from nothing but this repository and the
# Python standard library on the machine:
#   data (scripts/make_data.py) -> tokenizer -> base model (scripts/train_base.py) -> test eval
#   -> MLX model (specstream-mlx convert) -> adapters and draft model (scripts/train_adapters.sh).
#
#   scripts/build_default_model.sh              # everything, on a CUDA GPU if there is one, else the CPU
#   RESUME=1 scripts/build_default_model.sh     # continue an interrupted base-model run (runs/base)
#   SKIP_TRAIN=1 scripts/build_default_model.sh # data + MLX conversion of the shipped weights and tokenizer
#   TRAIN_ARGS="--hidden 512 --layers 10" scripts/build_default_model.sh  # extra flags for train_base.py train
#   SKIP_ADAPTERS=1 scripts/build_default_model.sh   # the base model only
#
# The base model trains on SQL generated on the fly (scripts/sqlgen.py) and the stdlib code data
# until its held-out validation loss stops going down (train_base.py --patience), saving a
# checkpoint at every evaluation: an interrupted run loses at most --eval-every steps (RESUME=1).
# It is the same command on a GPU (bf16, minutes to an hour) and on a CPU (days for the default
# size on 2 cores; pass a smaller --hidden/--layers in TRAIN_ARGS there). docs/gpu.md
# gives the route through the lent GPU machines, whose calls last at most 10 minutes. The code
# data and the tokenizer depend on the Python version whose standard library is read
# (data/manifest.json).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
MODEL=models/specstream-tiny
HF=$MODEL/hf

"$PY" scripts/make_data.py
if [ "${SKIP_TRAIN:-0}" != 1 ]; then
  # a new base gets a new tokenizer; a resumed run keeps the one its checkpoint was trained with, and
  # the shipped weights keep theirs (the generator has changed since it was trained: a tokenizer
  # trained now would cut the text otherwise than the weights read it)
  [ "${RESUME:-0}" = 1 ] || "$PY" scripts/train_base.py tokenizer --out "$HF"
  DEVICE=gpu
  if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "build_default_model: no CUDA GPU; training on the CPU (slow: see the header)" >&2
    DEVICE=cpu
  fi
  # shellcheck disable=SC2086
  "$PY" scripts/train_base.py train --out "$HF" $([ "${RESUME:-0}" = 1 ] && echo --resume) ${TRAIN_ARGS:-}
  "$PY" scripts/train_base.py eval --model "$HF" --split test --n 500 --json "$MODEL/eval_test_$DEVICE.json"
fi
# the MLX model the project's CLI loads by default (same fp16 weights, MLX layout)
if command -v specstream-mlx >/dev/null || [ -x .venv/bin/specstream-mlx ]; then
  SS=$(command -v specstream-mlx || echo .venv/bin/specstream-mlx)
  "$SS" convert --hf-path "$HF" --mlx-path "$MODEL/mlx.new" --overwrite
  for keep in adapters draft; do  # kept until retrained (loading checks they match the base)
    if [ -d "$MODEL/mlx/$keep" ]; then mv "$MODEL/mlx/$keep" "$MODEL/mlx.new/"; fi
  done
  rm -rf "$MODEL/mlx" && mv "$MODEL/mlx.new" "$MODEL/mlx"
  # one copy of the weights in the repository: the MLX directory links to the HF files when they
  # hold the same tensors (fp16 both; MLX reads the HF file as it is)
  "$PY" - "$HF" "$MODEL/mlx" <<'EOF'
import sys
from pathlib import Path

from safetensors.numpy import load_file

hf, mlx = Path(sys.argv[1]), Path(sys.argv[2])
for name in ("model.safetensors", "tokenizer.json"):
    a, b = hf / name, mlx / name
    if name.endswith(".json"):
        same = a.read_bytes() == b.read_bytes()
    else:
        x, y = load_file(a), load_file(b)
        same = x.keys() == y.keys() and all(x[k].dtype == y[k].dtype and (x[k] == y[k]).all() for k in x)
    if same:
        b.unlink()
        b.symlink_to(Path("..") / hf.name / name)
EOF
  [ "${SKIP_ADAPTERS:-0}" = 1 ] || PYTHON="$PY" SPECSTREAM="$SS" bash scripts/train_adapters.sh
else
  echo "build_default_model: specstream-mlx not installed (scripts/setup.sh); skipped the MLX conversion" >&2
fi
