#!/usr/bin/env bash
# Train what ships beside the default model for its applications and the benchmark (issue 5):
#   adapters/sql (shared), adapters/sql-lossless, adapters/code (lossless),
#   adapters/sql-lora (next-token LoRA baseline, no streams), draft/ (two-model speculative decoding).
#
#   scripts/train_adapters.sh                        # all of it, as shipped
#   ITERS=2000 ONLY="sql" scripts/train_adapters.sh   # some of it, longer
#
# Iterations and learning rates default to those of the shipped adapters (their
# training_report.json records each run); ITERS and LR override them for every part. Each adapter
# run keeps checkpoints in adapters/NAME.train/; RESUME=1 continues them. The draft model is
# trained by scripts/train_base.py (same data, tokenizer and recipe as the base model, 2 layers x
# 128 wide) within DRAFT_MINUTES and converted to MLX fp32.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
M=${MODEL:-models/specstream-tiny/mlx}
ONLY=${ONLY:-"sql-lossless sql sql-lora code draft"}
[ -f data/sql/train.jsonl ] && [ -f data/code/train.jsonl ] || "$PY" scripts/make_data.py
AGAIN=$([ "${RESUME:-0}" = 1 ] && echo --resume || echo --overwrite)
train() {  # iters lr args...
  local iters=${ITERS:-$1} lr=${LR:-$2}
  shift 2
  # shellcheck disable=SC2086
  .venv/bin/specstream-mlx train --model "$M" --batch-size 8 --max-seq-len 384 --gamma 4 \
    --msa-layers 2 --iters "$iters" --lr "$lr" $AGAIN ${TRAIN_ARGS:-} "$@"
}
for what in $ONLY; do
  case $what in
    sql-lossless) train 600 1e-3 --data data/sql --mode lossless --out sql-lossless ;;
    sql) train 1200 1e-3 --data data/sql --mode shared --out sql ;;
    sql-lora) train 300 5e-4 --data data/sql --mode lora --out sql-lora ;;
    code) train 300 5e-4 --data data/code --mode lossless --out code ;;
    draft)
      "$PY" scripts/train_base.py train --out runs/draft/hf --work runs/draft/work \
        --tokenizer models/specstream-tiny/hf --hidden 128 --layers 2 --heads 4 --kv-heads 2 \
        --intermediate 352 --max-minutes "${DRAFT_MINUTES:-12}"
      .venv/bin/specstream-mlx convert --hf-path runs/draft/hf --mlx-path "$M/draft" --dtype float32 \
        --overwrite ;;
    *) echo "train_adapters: unknown part '$what'" >&2; exit 2 ;;
  esac
done
