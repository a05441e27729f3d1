#!/usr/bin/env bash
# Train the adapters shipped with the default model (issue 5). Resumable: each run keeps
# checkpoints beside its adapter and `--resume` continues it.
set -euo pipefail
cd "$(dirname "$0")/.."
M=${MODEL:-models/specstream-tiny/mlx}
ITERS=${ITERS:-300}
T=".venv/bin/specstream-mlx train --model $M --batch-size 8 --max-seq-len 384 --iters $ITERS --overwrite"
$T --data data/sql --mode lossless --out sql-lossless --gamma 4 --msa-layers 2
$T --data data/sql --mode shared --out sql --gamma 4 --msa-layers 2
$T --data data/code --mode lossless --out code --gamma 4 --msa-layers 2
