"""Peak memory of one lossless or shared training step against sequence length and gamma: the
naive layout (streams on every token), completion-only streams, segments (the default) and
shared mode, on a model directory or a random Llama (docs/training.md, "Memory").

    .venv/bin/python scripts/train_memory.py --seq-lens 128,256,512 --gammas 1,4,8 --batch-size 2
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import mlx_specstream  # noqa: E402,F401  (first: the optimized BLAS before MLX)

# isort: split
import mlx.core as mx  # noqa: E402
from mlx.utils import tree_flatten  # noqa: E402

from mlx_specstream.arch import build_model  # noqa: E402
from mlx_specstream.loader import load_model  # noqa: E402
from mlx_specstream.trainer import measure_peak_memory  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description="peak training memory against sequence length and gamma")
    ap.add_argument("--model", type=Path, help="model directory (default: a random Llama config)")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--msa-layers", type=int, default=2)
    ap.add_argument("--seq-lens", default="128,256,512,1024")
    ap.add_argument("--gammas", default="1,4,8")
    ap.add_argument("--segment-len", type=int, default=32)
    a = ap.parse_args()
    if a.model:
        model = load_model(a.model)
        desc = str(a.model)
    else:
        cfg = dict(model_type="llama", hidden_size=a.hidden, num_attention_heads=8,
                   num_key_value_heads=4, intermediate_size=a.hidden * 8 // 3 // 64 * 64,
                   num_hidden_layers=a.layers, vocab_size=a.vocab)
        mx.random.seed(0)
        model = build_model(cfg)
        mx.eval(model.parameters())
        desc = f"random llama h={a.hidden} layers={a.layers} vocab={a.vocab}"
    mx.clear_cache()
    mx.reset_peak_memory()
    mx.eval(model.parameters())
    weights = sum(v.nbytes for _, v in tree_flatten(model.parameters()))
    print(f"model: {desc}; fp32 weights {weights / 2**20:.1f} MiB; batch {a.batch_size}; "
          f"{a.msa_layers} MSA layers; prompt = first half of each sequence")
    print("| seq len | gamma | lossless, naive: streams on every token | lossless, completion only | "
          f"lossless, segments of {a.segment_len} (default) | shared (completion only) |")
    print("|---:|---:|---:|---:|---:|---:|")
    runs = ((1, None, "lossless"), (None, None, "lossless"), (None, a.segment_len, "lossless"),
            (None, None, "shared"))
    for T in [int(x) for x in a.seq_lens.split(",")]:
        for g in [int(x) for x in a.gammas.split(",")]:
            row = []
            for prompt_len, seg, mode in runs:
                peak = measure_peak_memory(model, seq_len=T, gamma=g, batch_size=a.batch_size,
                                           prompt_len=prompt_len, segment_len=seg, mode=mode,
                                           msa_layers=a.msa_layers)
                row.append(f"{peak / 2**20:.0f} MiB")
            print(f"| {T} | {g} | " + " | ".join(row) + " |", flush=True)


if __name__ == "__main__":
    main()
