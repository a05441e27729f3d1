"""Llama family: ``llama``, ``mistral``, ``qwen2``, ``phi3`` (pre-norm RMSNorm, SwiGLU, RoPE, GQA)."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from ..lora import project
from .base import CausalLM, SelfAttention, activation, make_rope


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int, bias: bool, act: str):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=bias)
        self.up_proj = nn.Linear(dim, hidden, bias=bias)
        self.down_proj = nn.Linear(hidden, dim, bias=bias)
        self.act = activation(act)

    def __call__(self, x, n_main=None):
        g = self.act(project(self.gate_proj, x, n_main)) * project(self.up_proj, x, n_main)
        return project(self.down_proj, g, n_main)


class Block(nn.Module):
    def __init__(self, cfg: dict, rope):
        super().__init__()
        dim, heads = cfg["hidden_size"], cfg["num_attention_heads"]
        kv = cfg.get("num_key_value_heads") or heads
        head_dim = cfg.get("head_dim") or dim // heads
        qkv_bias = cfg["model_type"] == "qwen2" or cfg.get("attention_bias", False)
        o_bias = cfg.get("attention_bias", False) and cfg["model_type"] != "qwen2"
        self.self_attn = SelfAttention(dim, heads, kv, head_dim, qkv_bias, o_bias, rope)
        self.mlp = MLP(dim, cfg["intermediate_size"], cfg.get("mlp_bias", False),
                       cfg.get("hidden_act", "silu"))
        eps = cfg.get("rms_norm_eps", 1e-6)
        self.input_layernorm = nn.RMSNorm(dim, eps=eps)
        self.post_attention_layernorm = nn.RMSNorm(dim, eps=eps)

    def __call__(self, x, positions, mask=None, cache=None, n_main=None):
        h = x + self.self_attn(self.input_layernorm(x), positions, mask, cache, n_main)
        return h + self.mlp(self.post_attention_layernorm(h), n_main)


class Inner(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        dim = cfg["hidden_size"]
        head_dim = cfg.get("head_dim") or dim // cfg["num_attention_heads"]
        rope = make_rope(cfg, head_dim)
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], dim)
        self.layers = [Block(cfg, rope) for _ in range(cfg["num_hidden_layers"])]
        self.norm = nn.RMSNorm(dim, eps=cfg.get("rms_norm_eps", 1e-6))


class Model(CausalLM):
    def __init__(self, cfg: dict):
        super().__init__()
        self.config = cfg
        self.model = Inner(cfg)
        self.tied = cfg.get("tie_word_embeddings", False)
        if not self.tied:
            self.lm_head = nn.Linear(cfg["hidden_size"], cfg["vocab_size"], bias=False)

    @property
    def layers(self):
        return self.model.layers

    def embed(self, tokens, positions):
        return self.model.embed_tokens(tokens)

    def head(self, h):
        h = self.model.norm(h)
        return self.model.embed_tokens.as_linear(h) if self.tied else self.lm_head(h)

    def sanitize(self, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        """HF names -> ours: drop rotary buffers and tied heads, split phi3's fused projections."""
        cfg = self.config
        out = {}
        heads, dim = cfg["num_attention_heads"], cfg["hidden_size"]
        head_dim = cfg.get("head_dim") or dim // heads
        kv = cfg.get("num_key_value_heads") or heads
        for name, w in weights.items():
            if "rotary_emb" in name or (self.tied and name.startswith("lm_head.")):
                continue
            if ".qkv_proj." in name:
                q, k = heads * head_dim, kv * head_dim
                for part, (a, b) in zip("qkv", [(0, q), (q, q + k), (q + k, q + 2 * k)]):
                    out[name.replace("qkv_proj", f"{part}_proj")] = w[a:b]
            elif ".gate_up_proj." in name:
                half = w.shape[0] // 2
                out[name.replace("gate_up_proj", "gate_proj")] = w[:half]
                out[name.replace("gate_up_proj", "up_proj")] = w[half:]
            else:
                out[name] = w
        return out
