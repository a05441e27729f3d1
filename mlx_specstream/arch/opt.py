"""OPT: learned positions (offset 2), pre- or post-LayerNorm, ReLU MLP, optional project_in/out."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from ..lora import project
from .base import CausalLM, SelfAttention, activation


class Block(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        dim, heads = cfg["hidden_size"], cfg["num_attention_heads"]
        bias = cfg.get("enable_bias", True)
        self.self_attn = SelfAttention(dim, heads, heads, dim // heads, bias, bias, None, "out_proj")
        ln_affine = cfg.get("layer_norm_elementwise_affine", True)
        self.self_attn_layer_norm = nn.LayerNorm(dim, affine=ln_affine)
        self.final_layer_norm = nn.LayerNorm(dim, affine=ln_affine)
        self.fc1 = nn.Linear(dim, cfg["ffn_dim"], bias=bias)
        self.fc2 = nn.Linear(cfg["ffn_dim"], dim, bias=bias)
        self.act = activation(cfg.get("activation_function", "relu"))
        self.pre_norm = cfg.get("do_layer_norm_before", True)

    def __call__(self, x, positions, mask=None, cache=None, n_main=None):
        h = self.self_attn_layer_norm(x) if self.pre_norm else x
        h = x + self.self_attn(h, positions, mask, cache, n_main)
        if not self.pre_norm:
            h = self.self_attn_layer_norm(h)
        m = self.final_layer_norm(h) if self.pre_norm else h
        h = h + project(self.fc2, self.act(project(self.fc1, m, n_main)), n_main)
        return h if self.pre_norm else self.final_layer_norm(h)


class Decoder(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        dim, proj = cfg["hidden_size"], cfg.get("word_embed_proj_dim") or cfg["hidden_size"]
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], proj)
        self.embed_positions = nn.Embedding(cfg["max_position_embeddings"] + 2, dim)
        if proj != dim:
            self.project_in = nn.Linear(proj, dim, bias=False)
            self.project_out = nn.Linear(dim, proj, bias=False)
        if cfg.get("do_layer_norm_before", True) and not cfg.get("_remove_final_layer_norm", False):
            self.final_layer_norm = nn.LayerNorm(dim, affine=cfg.get("layer_norm_elementwise_affine", True))
        self.layers = [Block(cfg) for _ in range(cfg["num_hidden_layers"])]


class Model(CausalLM):
    def __init__(self, cfg: dict):
        super().__init__()
        self.config = cfg
        self.model = Decoder(cfg)
        self.tied = cfg.get("tie_word_embeddings", True)
        if not self.tied:
            proj = cfg.get("word_embed_proj_dim") or cfg["hidden_size"]
            self.lm_head = nn.Linear(proj, cfg["vocab_size"], bias=False)

    @property
    def layers(self):
        return self.model.layers

    def embed(self, tokens, positions):
        d = self.model
        h = d.embed_tokens(tokens)
        if "project_in" in d:
            h = d.project_in(h)
        return h + d.embed_positions(positions + 2)

    def head(self, h):
        d = self.model
        if "final_layer_norm" in d:
            h = d.final_layer_norm(h)
        if "project_out" in d:
            h = d.project_out(h)
        return d.embed_tokens.as_linear(h) if self.tied else self.lm_head(h)

    def sanitize(self, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        out = {}
        for name, w in weights.items():
            name = name.replace("model.decoder.", "model.")
            if name.startswith("decoder."):
                name = "model." + name[len("decoder."):]
            if self.tied and name.startswith("lm_head."):
                continue
            out[name] = w
        return out
