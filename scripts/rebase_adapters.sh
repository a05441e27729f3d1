#!/usr/bin/env bash
# Retrain the shipped adapters after the base model was trained further (same shape, new weights),
# each one that can be started from its predecessor's weights (`train --init`, a warm start):
# much shorter than scripts/train_adapters.sh's recipes from nothing. The earlier base's adapters
# are read from OLD (a copy: each run replaces the shipped adapter of its name); `--init` takes
# them whether or not they still load onto the new base.
#
#   scripts/rebase_adapters.sh OLD               # OLD: the earlier base's adapters directory
#   ONLY="sql-lora sql" scripts/rebase_adapters.sh OLD
#
# sql-lora and code train from nothing with train_adapters.sh's recipes (they are short). The
# streams of sql-lossless, sql, sql-tuned and sql-split start from OLD's adapter of the same name;
# over the new sql-lora, their every-row LoRA is the new sql-lora's (carried by sql-tuned, trained
# on gently by sql, --fine-tune-lr 2e-6, and sql-split, 1e-5; `train --init` with `--over`). The draft model is a model of its own
# (trained on the same data, not on the base) and stays.
set -euo pipefail
cd "$(dirname "$0")/.."
OLD=${1:?usage: scripts/rebase_adapters.sh OLD_ADAPTERS_DIR}
[ -d "$OLD" ] || { echo "rebase_adapters: $OLD is not a directory" >&2; exit 2; }
M=${MODEL:-models/specstream-tiny/mlx}
ONLY=${ONLY:-"sql-lora sql-lossless sql sql-tuned sql-split code"}
[ -f data/sql/train.jsonl ] && [ -f data/code/train.jsonl ] || "${PYTHON:-.venv/bin/python}" scripts/make_data.py
warm() {  # NAME iters lr args...: start from OLD/NAME
  local name=$1 iters=$2 lr=$3
  shift 3
  [ -d "$OLD/$name" ] || { echo "rebase_adapters: no $OLD/$name" >&2; exit 2; }
  # shellcheck disable=SC2086
  "${SPECSTREAM:-.venv/bin/specstream-mlx}" train --model "$M" --batch-size 8 --max-seq-len 384 \
    --iters "$iters" --lr "$lr" --init "$OLD/$name" --overwrite ${TRAIN_ARGS:-} --out "$name" "$@"
}
for what in $ONLY; do
  case $what in
    sql-lora|code) ONLY=$what bash scripts/train_adapters.sh ;;
    sql-tuned) warm sql-tuned 600 5e-4 --data data/sql --mode lossless --over sql-lora --no-self-distill \
      --msa-layers 4 --rank 32 ;;
    sql-lossless) warm sql-lossless 1600 5e-4 --data data/sql --mode lossless --no-self-distill \
      --msa-layers 4 --rank 32 --branch 5 --tree-budget 64 ;;
    sql) warm sql 600 1e-3 --data data/sql --mode shared --over sql-lora --msa-layers 4 --rank 32 \
      --alphas "1 0.01" --accept-prompts 32 --fine-tune-lr 2e-6 --branch 5 --tree-budget 64 ;;  # f
    sql-split) warm sql-split 500 1e-3 --data data/sql --mode shared --over sql-lora --msa-layers 2 \
      --alphas "1 0.01" --fine-tune-lr 1e-5 ;;
    *) echo "rebase_adapters: unknown part '$what'" >&2; exit 2 ;;
  esac
done
