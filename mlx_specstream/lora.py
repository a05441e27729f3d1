"""Low-rank adapters on linear layers.

A :class:`LoRALinear` wraps any linear layer (float or quantized). With ``streams_only`` it
changes only speculative-stream rows (rows at and after ``n_main``): the lossless mode's stream
adapters, which leave every main-stream computation exactly the base model's. A tuned lossless
adapter (``AdapterConfig.main_rank``) nests them: a stream-only LoRA over an every-row LoRA (the
fine-tune) over the base layer.
"""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn


class LoRALinear(nn.Module):
    def __init__(self, base: nn.Module, rank: int, alpha: float = 16.0, streams_only: bool = False,
                 key: mx.array | None = None):
        super().__init__()
        self.base = base
        out_dims, in_dims = _dims(base)
        bound = 1.0 / math.sqrt(in_dims)
        self.lora_a = mx.random.uniform(-bound, bound, (in_dims, rank), key=key)
        self.lora_b = mx.zeros((rank, out_dims))
        self.scale = alpha / rank
        self.streams_only = streams_only

    def __call__(self, x: mx.array, n_main: int | None = None) -> mx.array:
        y = self.base(x)
        if self.streams_only:
            if n_main is None or n_main >= x.shape[1]:  # no stream rows
                return y
            if n_main > 0:  # main rows first: they keep the base's output
                delta = self._delta(x[:, n_main:]).astype(y.dtype)
                return mx.concatenate([y[:, :n_main], y[:, n_main:] + delta], axis=1)
        return y + self._delta(x).astype(y.dtype)  # every row adapted (or stream rows only)

    def _delta(self, x: mx.array) -> mx.array:
        return ((x @ self.lora_a) @ self.lora_b) * self.scale

    def fused(self) -> nn.Linear:
        """A plain linear layer computing the same function, ``W + scale·(AB)ᵀ``: one matmul
        instead of three. Only for an adapter of every row on a float base."""
        if self.streams_only or not isinstance(self.base, nn.Linear):
            raise ValueError("only an every-row LoRA on a float linear layer can be fused")
        w = self.base.weight
        delta = (self.lora_a.astype(mx.float32) @ self.lora_b.astype(mx.float32)).T * self.scale
        out_dims, in_dims = w.shape
        layer = nn.Linear(in_dims, out_dims, bias="bias" in self.base)
        layer.weight = (w.astype(mx.float32) + delta).astype(w.dtype)
        if "bias" in self.base:
            layer.bias = self.base.bias
        return layer


def _dims(layer: nn.Module) -> tuple[int, int]:
    if isinstance(layer, LoRALinear):  # a stream-only LoRA over a fine-tune's every-row LoRA
        return _dims(layer.base)
    if isinstance(layer, nn.QuantizedLinear):
        return layer.weight.shape[0], layer.weight.shape[1] * 32 // layer.bits
    return layer.weight.shape


def project(layer: nn.Module, x: mx.array, n_main: int | None) -> mx.array:
    """Apply a (possibly adapted) linear layer, telling adapters where stream rows start."""
    return layer(x, n_main) if isinstance(layer, LoRALinear) else layer(x)
