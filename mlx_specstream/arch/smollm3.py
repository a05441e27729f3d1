"""SmolLM3: the llama block, with rotary embeddings left out of the layers ``no_rope_layers``
marks 0 (by default every ``no_rope_layer_interval``-th layer)."""

from __future__ import annotations

from dataclasses import dataclass

import mlx.nn as nn

from . import llama
from .base import Rope


@dataclass
class Args(llama.Args):
    tie_word_embeddings: bool = True  # transformers' SmolLM3Config default
    no_rope_layers: list[int] | None = None
    no_rope_layer_interval: int = 4

    def __post_init__(self):
        super().__post_init__()
        if self.no_rope_layers is None:
            self.no_rope_layers = [int((i + 1) % self.no_rope_layer_interval != 0)
                                   for i in range(self.num_hidden_layers)]

    def slides(self, layer: int) -> bool:
        """Without ``layer_types``, the layers without rotary embeddings slide (transformers)."""
        return not self.no_rope_layers[layer]


class Model(llama.Model):
    Args = Args

    def block(self, args: Args, i: int, rope: Rope) -> nn.Module:
        return llama.Block(args, rope if args.no_rope_layers[i] else None, window=args.window(i))
