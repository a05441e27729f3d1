"""Qwen3 (dense): the llama block with an RMS norm on every head's queries and keys."""

from __future__ import annotations

from functools import partial

import mlx.nn as nn

from . import llama
from .base import Rope


class Model(llama.Model):
    def block(self, args: llama.Args, i: int, rope: Rope) -> nn.Module:
        qk_norm = partial(nn.RMSNorm, eps=args.rms_norm_eps)
        return llama.Block(args, rope, window=args.window(i), qk_norm=qk_norm)
