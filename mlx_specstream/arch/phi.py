"""Phi (phi-1, phi-1.5, phi-2): parallel attention + MLP on one LayerNorm, partial rotary, GELU."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from ..lora import project
from .base import CausalLM, SelfAttention, UnsupportedModelError, activation, make_rope


class Block(nn.Module):
    def __init__(self, cfg: dict, rope):
        super().__init__()
        dim, heads = cfg["hidden_size"], cfg["num_attention_heads"]
        kv = cfg.get("num_key_value_heads") or heads
        if cfg.get("qk_layernorm", False):
            raise UnsupportedModelError("phi with qk_layernorm is not supported")
        self.self_attn = SelfAttention(dim, heads, kv, dim // heads, True, True, rope, "dense")
        self.input_layernorm = nn.LayerNorm(dim, eps=cfg.get("layer_norm_eps", 1e-5))
        self.mlp = PhiMLP(cfg)

    def __call__(self, x, positions, mask=None, cache=None, n_main=None):
        h = self.input_layernorm(x)
        return x + self.self_attn(h, positions, mask, cache, n_main) + self.mlp(h, n_main)


class PhiMLP(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        self.fc1 = nn.Linear(cfg["hidden_size"], cfg["intermediate_size"])
        self.fc2 = nn.Linear(cfg["intermediate_size"], cfg["hidden_size"])
        self.act = activation(cfg.get("hidden_act", "gelu_new"))

    def __call__(self, x, n_main=None):
        return project(self.fc2, self.act(project(self.fc1, x, n_main)), n_main)


class Inner(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        dim, heads = cfg["hidden_size"], cfg["num_attention_heads"]
        rope = make_rope(cfg, dim // heads, default_partial=0.5)
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], dim)
        self.layers = [Block(cfg, rope) for _ in range(cfg["num_hidden_layers"])]
        self.final_layernorm = nn.LayerNorm(dim, eps=cfg.get("layer_norm_eps", 1e-5))


class Model(CausalLM):
    def __init__(self, cfg: dict):
        super().__init__()
        self.config = cfg
        self.model = Inner(cfg)
        self.lm_head = nn.Linear(cfg["hidden_size"], cfg["vocab_size"], bias=True)

    @property
    def layers(self):
        return self.model.layers

    def embed(self, tokens, positions):
        return self.model.embed_tokens(tokens)

    def head(self, h):
        return self.lm_head(self.model.final_layernorm(h))

    def sanitize(self, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        return {k: v for k, v in weights.items() if "rotary_emb" not in k}
