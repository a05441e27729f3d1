"""Qwen3-MoE: the Qwen3 block (:mod:`.qwen3`) with a sparse mixture-of-experts MLP (:mod:`.moe`) in
the layers transformers gives one (those ``decoder_sparse_step`` picks, but ``mlp_only_layers``:
every layer, as released); a sliding window, where ``use_sliding_window``, on every layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

from . import moe, qwen3
from .base import Rope


@dataclass
class Args(qwen3.Args):
    """Defaults are ``Qwen3MoeConfig``'s."""

    num_experts: int = 128
    num_experts_per_tok: int = 8
    moe_intermediate_size: int = 768
    norm_topk_prob: bool = False
    decoder_sparse_step: int = 1
    mlp_only_layers: list[int] | None = None
    use_sliding_window: bool | None = False

    def sparse(self, layer: int) -> bool:
        """Whether layer ``layer``'s MLP is the experts'."""
        return (layer not in (self.mlp_only_layers or []) and self.num_experts > 0
                and (layer + 1) % self.decoder_sparse_step == 0)

    def window(self, layer: int) -> int | None:
        return self.sliding_window if self.use_sliding_window and self.sliding_window else None


class Model(qwen3.Model):
    Args = Args

    def __init__(self, cfg: dict):
        if "num_experts" not in cfg and "num_local_experts" in cfg:  # transformers 5 writes this name,
            cfg = {**cfg, "num_experts": cfg["num_local_experts"]}  # and the MLX config both (mlx-lm's)
        super().__init__(cfg)

    def block(self, args: Args, i: int, rope: Rope, **options) -> nn.Module:
        experts = None
        if args.sparse(i):
            experts = moe.SparseMoE(args.hidden_size, args.moe_intermediate_size, args.num_experts,
                                    args.num_experts_per_tok, args.norm_topk_prob, args.hidden_act)
        return super().block(args, i, rope, mlp=experts, **options)

    def sanitize(self, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        """HF names -> ours: each layer's experts stacked (mlx-lm's names), then as Qwen3's."""
        names = {n: n for n in ("gate_proj", "up_proj", "down_proj")}
        weights = moe.stack_experts(weights, self.args.num_experts, self.args.num_hidden_layers,
                                    "model.layers.{i}.mlp", names)
        return super().sanitize(weights)
