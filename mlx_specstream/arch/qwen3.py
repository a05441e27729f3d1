"""Qwen3 (dense): the llama block with an RMS norm on every head's queries and keys."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import mlx.nn as nn

from . import llama
from .base import Rope


@dataclass
class Args(llama.Args):
    head_dim: int | None = 128  # transformers' Qwen3Config default, not hidden_size / heads


class Model(llama.Model):
    Args = Args

    def block(self, args: llama.Args, i: int, rope: Rope, **options) -> nn.Module:
        return super().block(args, i, rope, qk_norm=partial(nn.RMSNorm, eps=args.rms_norm_eps), **options)
