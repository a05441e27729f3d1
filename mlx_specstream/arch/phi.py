"""Phi (phi-1, phi-1.5, phi-2): parallel attention + MLP on one LayerNorm, partial rotary, GELU."""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

from ..errors import UnsupportedModelError
from ..lora import project
from .base import BaseArgs, CausalLM, SelfAttention, activation, make_rope


@dataclass
class Args(BaseArgs):
    hidden_size: int
    num_attention_heads: int
    intermediate_size: int
    num_hidden_layers: int
    vocab_size: int
    num_key_value_heads: int | None = None
    layer_norm_eps: float = 1e-5
    hidden_act: str = "gelu_new"
    qk_layernorm: bool = False

    def __post_init__(self):
        if self.qk_layernorm:
            raise UnsupportedModelError("phi with qk_layernorm is not supported")
        self.num_key_value_heads = self.num_key_value_heads or self.num_attention_heads


class Block(nn.Module):
    def __init__(self, a: Args, rope):
        super().__init__()
        dim, heads = a.hidden_size, a.num_attention_heads
        kv = a.num_key_value_heads
        self.self_attn = SelfAttention(dim, heads, kv, dim // heads, True, True, rope, "dense")
        self.input_layernorm = nn.LayerNorm(dim, eps=a.layer_norm_eps)
        self.mlp = PhiMLP(a)

    def __call__(self, x, positions, mask=None, cache=None, n_main=None):
        h = self.input_layernorm(x)
        return x + self.self_attn(h, positions, mask, cache, n_main) + self.mlp(h, n_main)


class PhiMLP(nn.Module):
    def __init__(self, a: Args):
        super().__init__()
        self.fc1 = nn.Linear(a.hidden_size, a.intermediate_size)
        self.fc2 = nn.Linear(a.intermediate_size, a.hidden_size)
        self.act = activation(a.hidden_act)

    def __call__(self, x, n_main=None):
        return project(self.fc2, self.act(project(self.fc1, x, n_main)), n_main)


class Inner(nn.Module):
    def __init__(self, a: Args, rope):
        super().__init__()
        self.embed_tokens = nn.Embedding(a.vocab_size, a.hidden_size)
        self.layers = [Block(a, rope) for _ in range(a.num_hidden_layers)]
        self.final_layernorm = nn.LayerNorm(a.hidden_size, eps=a.layer_norm_eps)


class Model(CausalLM):
    def __init__(self, cfg: dict):
        super().__init__()
        self.config = cfg
        self.args = args = Args.from_dict(cfg)
        rope = make_rope(cfg, args.hidden_size // args.num_attention_heads, default_partial=0.5)
        self.model = Inner(args, rope)
        self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=True)

    def embed(self, tokens, positions):
        return self.model.embed_tokens(tokens)

    def head(self, h):
        return self.lm_head(self.model.final_layernorm(h))

    def sanitize(self, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        return {k: v for k, v in weights.items() if "rotary_emb" not in k}
