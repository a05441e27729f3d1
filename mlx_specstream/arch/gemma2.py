"""Gemma 2: Gemma's norms and embeddings (:mod:`.gemma`) with a norm before and after both
attention and MLP, queries scaled by ``query_pre_attn_scalar**-0.5``, attention scores and logits
soft-capped (``cap * tanh(x / cap)``: ``attn_logit_softcapping``, ``final_logit_softcapping``),
and sliding-window layers (every other one, as ``layer_types`` lists them). Gemma 3
(:mod:`.gemma3`) builds on this block.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import mlx.nn as nn

from ..errors import UnsupportedModelError
from . import gemma
from .base import Rope, SelfAttention, make_rope
from .gemma import RMSNorm
from .llama import MLP

SLIDING, GLOBAL = "sliding_attention", "full_attention"


@dataclass
class Args(gemma.Args):
    """Defaults are ``Gemma2Config``'s (those not here, Gemma's)."""

    hidden_size: int = 2304
    intermediate_size: int = 9216
    num_hidden_layers: int = 26
    num_attention_heads: int = 8
    num_key_value_heads: int = 4
    hidden_activation: str | None = "gelu_pytorch_tanh"
    max_position_embeddings: int = 8192
    query_pre_attn_scalar: float = 256
    sliding_window: int | None = 4096
    sliding_window_pattern: int = 2  # without layer_types: every pattern-th layer global
    layer_types: list[str] | None = None
    final_logit_softcapping: float | None = 30.0
    attn_logit_softcapping: float | None = 50.0
    use_bidirectional_attention: bool | None = False

    def activation(self) -> str:
        """``hidden_activation`` as given (transformers' Gemma 2 and 3 read it so)."""
        return self.hidden_activation or self.hidden_act

    def __post_init__(self):
        super().__post_init__()
        if self.use_bidirectional_attention:
            raise UnsupportedModelError("Gemma with use_bidirectional_attention is not supported")
        if self.layer_types is None:
            self.layer_types = [SLIDING if (i + 1) % self.sliding_window_pattern else GLOBAL
                                for i in range(self.num_hidden_layers)]


class Block(nn.Module):
    """Norms before and after attention and MLP; ``qk_norm`` (Gemma 3) adds q/k norms; ``softcap``
    caps the attention scores."""

    def __init__(self, args: Args, kind: str, rope: Rope, qk_norm: bool = False,
                 softcap: float | None = None):
        super().__init__()
        a = args
        norm = partial(RMSNorm, eps=a.rms_norm_eps)
        self.self_attn = SelfAttention(
            a.hidden_size, a.num_attention_heads, a.num_key_value_heads, a.head_dim, a.attention_bias,
            a.attention_bias, rope, qk_norm=norm if qk_norm else None, scale=a.query_pre_attn_scalar**-0.5,
            window=a.sliding_window if kind == SLIDING else None, softcap=softcap)
        self.mlp = MLP(a.hidden_size, a.intermediate_size, False, a.hidden_act)
        self.input_layernorm = norm(a.hidden_size)
        self.post_attention_layernorm = norm(a.hidden_size)
        self.pre_feedforward_layernorm = norm(a.hidden_size)
        self.post_feedforward_layernorm = norm(a.hidden_size)

    def __call__(self, x, positions, mask=None, cache=None, n_main=None):
        h = self.self_attn(self.input_layernorm(x), positions, mask, cache, n_main)
        h = x + self.post_attention_layernorm(h)
        m = self.mlp(self.pre_feedforward_layernorm(h), n_main)
        return h + self.post_feedforward_layernorm(m)


class Model(gemma.Model):
    Args = Args
    qk_norm = False

    def softcap(self, args: Args) -> float | None:
        """The attention scores' soft-cap: ``attn_logit_softcapping``."""
        return args.attn_logit_softcapping

    def ropes(self, args: Args) -> dict[str, Rope]:
        """The rotary embedding of each kind of layer: one for both."""
        rope = make_rope(self.config, args.head_dim)
        return {SLIDING: rope, GLOBAL: rope}

    def blocks(self, args: Args) -> list[nn.Module]:
        ropes = self.ropes(args)
        return [Block(args, kind, ropes[kind], self.qk_norm, self.softcap(args)) for kind in args.layer_types]
