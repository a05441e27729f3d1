#!/usr/bin/env bash
# Train what ships beside the default model for its applications and the benchmark (issue 5):
#   adapters/sql (shared, split: started from sql-lora, streams with LoRA of their own in 4 MSA
#   layers), adapters/sql-lossless, adapters/code (lossless), adapters/sql-lora (next-token LoRA
#   baseline, no streams), adapters/sql-tuned (lossless streams over sql-lora, which it carries),
#   adapters/sql-split (sql's recipe with 2 MSA layers, stream rank 8, 1000 steps), draft/ (two-model
#   speculative decoding).
#
#   scripts/train_adapters.sh                        # all of it, as shipped
#   ITERS=2000 ONLY="sql" scripts/train_adapters.sh   # some of it, longer
#
# Iterations and learning rates default to those of the shipped adapters (their
# training_report.json records each run); ITERS and LR override them for every part. Some ran in
# stages ("600 2000": 600 iterations, then resumed to 2000, the cosine schedule restarting), or
# were trained further from their finished weights (`further`: --init, a fresh optimizer and schedule).
# Each adapter run keeps checkpoints in adapters/NAME.train/; RESUME=1 continues them (a `further`
# run too, once begun; a finished run is left as it is). The draft model is
# trained by scripts/train_base.py (same data, tokenizer and recipe as the base model, 2 layers x
# 128 wide) within DRAFT_MINUTES and converted to MLX fp32. On a CPU `train` runs in two processes
# by default (since 2026-11-25; the shipped adapters were trained in one, whose sums round
# differently, except sql's stages 2 and 3): TRAIN_ARGS="--processes 1" trains as they were.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
SS=${SPECSTREAM:-.venv/bin/specstream-mlx}  # the CLI (build_default_model.sh passes the one it found)
M=${MODEL:-models/specstream-tiny/mlx}
ONLY=${ONLY:-"sql-lossless sql-lora sql sql-tuned sql-split code draft"}
[ -f data/sql/train.jsonl ] && [ -f data/code/train.jsonl ] || "$PY" scripts/make_data.py
# RESUME=1: each adapter's run goes on from its checkpoints, or starts where it has none
AGAIN=$([ "${RESUME:-0}" = 1 ] && echo "--resume --overwrite" || echo --overwrite)
further_begun() {  # NAME: its last checkpoint is a `further` run's (one started with --init)
  local last
  last=$({ ls "$M/adapters/$1.train/checkpoints" 2>/dev/null || true; } | grep -E '^step-[0-9]{7,}$' |
    sort | tail -1)  # (a checkpoint's name; a copy under another name is the user's)
  [ -n "$last" ] && grep -q '"init": "' "$M/adapters/$1.train/checkpoints/$last/state.json"
}
# the sql adapters' decoding tree: 5 candidates a stream, 64 nodes (more tokens a pass where the
# whole tree runs, the same speed on a CPU: results/adapters/base4/tree/)
TREE="--branch 5 --tree-budget 64"
train() {  # NAME "iters [iters ...]" lr args...: later stages resume the run (a new cosine to their end)
  local name=$1 stages=${ITERS:-$2} lr=${LR:-$3} again=$AGAIN iters done=0
  shift 3
  if [ "${RESUME:-0}" = 1 ]; then
    further_begun "$name" && return  # the stages are done: the checkpoints are the next run's
    done=$({ ls "$M/adapters/$name.train/checkpoints" 2>/dev/null || true; } | grep -E '^step-[0-9]{7,}$' |
      sed -n 's/^step-0*//p' | sort -n | tail -1)
  fi
  for iters in $stages; do
    [ "$iters" -lt "${done:-0}" ] && continue  # a stage this run has already passed
    # shellcheck disable=SC2086
    "$SS" train --model "$M" --batch-size 8 --max-seq-len 384 \
      --iters "$iters" --lr "$lr" $again ${TRAIN_ARGS:-} --out "$name" "$@"
    again=--resume
  done
}
further() {  # NAME iters lr args...: train the finished adapter NAME further (--init; a fresh optimizer)
  local name=$1 iters=$2 lr=$3 again=--overwrite
  shift 3
  if [ "${RESUME:-0}" = 1 ] && further_begun "$name"; then again="--resume --overwrite"; fi
  # shellcheck disable=SC2086
  "$SS" train --model "$M" --batch-size 8 --max-seq-len 384 \
    --iters "$iters" --lr "$lr" --init "$name" $again ${TRAIN_ARGS:-} --out "$name" "$@"
}
for what in $ONLY; do
  case $what in
    sql-lossless)
      train sql-lossless 2000 1e-3 --data data/sql --mode lossless --no-self-distill --msa-layers 4 --rank 32 \
        $TREE
      further sql-lossless 1600 5e-4 --data data/sql --mode lossless --no-self-distill --msa-layers 4 \
        --rank 32 $TREE ;;
    sql) train sql "1000 2000 3000" 1e-3 --data data/sql --mode shared --over sql-lora --msa-layers 4 \
      --rank 32 --alphas "1 0.01" --accept-prompts 32 --fine-tune-lr 1e-5 $TREE ;;  # after sql-lora: a
      # split adapter started from that fine-tune; 32 validation prompts choose the step kept (8
      # chose step 2100 of 3000, which drafted 3.40 tokens per pass on the 500 valid prompts against
      # step 3000's 3.55). The fine-tune moves at 1e-5: at the streams' 1e-3 it lost exact match
      # (docs/training.md, 2026-11-26; the shipped sql came from warm starts, not from nothing)
    sql-lora) train sql-lora 600 1e-4 --data data/sql --mode lora --msa-layers 2 ;;
    sql-tuned) train sql-tuned 2000 1e-3 --data data/sql --mode lossless --over sql-lora \
      --no-self-distill --msa-layers 4 --rank 32 ;;  # after sql-lora: it carries that fine-tune
    sql-split) train sql-split 1000 1e-3 --data data/sql --mode shared --over sql-lora --msa-layers 2 \
      --alphas "1 0.01" --fine-tune-lr 1e-5 ;;  # after sql-lora: it starts from that fine-tune
    code) train code 300 5e-4 --data data/code --mode lossless --no-self-distill --msa-layers 2 ;;
    draft)
      [ -f data/pretrain.jsonl.gz ] || { echo "train_adapters: the draft model trains on data/pretrain.jsonl.gz:" \
        "make it with scripts/make_data.py here (and carry it to a GPU)" >&2; exit 2; }
      "$PY" scripts/train_base.py train --out runs/draft/hf --work runs/draft/work \
        --tokenizer models/specstream-tiny/hf --hidden 128 --layers 2 --heads 4 --kv-heads 2 \
        --intermediate 352 --max-minutes "${DRAFT_MINUTES:-12}"
      # converted beside the old one, then swapped in: convert replaces only what it wrote itself
      "$SS" convert --hf-path runs/draft/hf --mlx-path "$M/draft.new" --dtype float32 --overwrite
      rm -rf "$M/draft" && mv "$M/draft.new" "$M/draft" ;;
    *) echo "train_adapters: unknown part '$what'" >&2; exit 2 ;;
  esac
done
