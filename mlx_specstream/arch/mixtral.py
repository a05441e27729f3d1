"""Mixtral: the llama block with a sparse mixture of experts (:mod:`.moe`) in every layer, each
row's ``num_experts_per_tok`` experts weighted by their router probabilities renormalized; a
sliding window, where the config sets one, on every layer. The checkpoint's ``block_sparse_moe``
(experts' ``w1``, ``w3``, ``w2``) is read as the block's ``mlp`` (``gate_proj``, ``up_proj``,
``down_proj``, stacked), an mlx-lm directory's too; our directories keep mlx-lm's names.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

from . import llama, moe
from .base import Rope

THEIRS, OURS = ".block_sparse_moe.", ".mlp."  # the checkpoint's name of each layer's mixture, ours


@dataclass
class Args(llama.Args):
    """Defaults are ``MixtralConfig``'s for the experts (the llama family's otherwise: the import
    writes the checkpoint's own, transformers' where it leaves them out)."""

    num_local_experts: int = 8
    num_experts_per_tok: int = 2

    def window(self, layer: int) -> int | None:
        return self.sliding_window or None


class Model(llama.Model):
    Args = Args

    def block(self, args: Args, i: int, rope: Rope, **options) -> nn.Module:
        experts = moe.SparseMoE(args.hidden_size, args.intermediate_size, args.num_local_experts,
                                args.num_experts_per_tok, True, args.hidden_act, weights_in_float32=True)
        return super().block(args, i, rope, mlp=experts, **options)

    def saved_name(self, path: str) -> str:
        """Ours -> mlx-lm's: the ``mlp`` is saved as ``block_sparse_moe``, which its Mixtral reads."""
        return path.replace(OURS, THEIRS)

    def sanitize(self, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        """HF (or mlx-lm) names -> ours: ``block_sparse_moe`` is the ``mlp``, its experts stacked."""
        weights = {k.replace(THEIRS, OURS): v for k, v in weights.items()}
        names = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
        weights = moe.stack_experts(weights, self.args.num_local_experts, self.args.num_hidden_layers,
                                    "model.layers.{i}.mlp", names)
        return super().sanitize(weights)
