"""OPT: learned positions (offset 2), pre- or post-LayerNorm, ReLU MLP, optional project_in/out."""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

from ..lora import project
from .base import BaseArgs, CausalLM, SelfAttention, activation


@dataclass
class Args(BaseArgs):
    hidden_size: int
    num_attention_heads: int
    ffn_dim: int
    num_hidden_layers: int
    vocab_size: int
    max_position_embeddings: int
    word_embed_proj_dim: int | None = None
    enable_bias: bool = True
    layer_norm_elementwise_affine: bool = True
    do_layer_norm_before: bool = True
    activation_function: str = "relu"
    tie_word_embeddings: bool = True
    _remove_final_layer_norm: bool = False

    def __post_init__(self):
        self.word_embed_proj_dim = self.word_embed_proj_dim or self.hidden_size


class Block(nn.Module):
    def __init__(self, a: Args):
        super().__init__()
        dim, heads, bias = a.hidden_size, a.num_attention_heads, a.enable_bias
        self.self_attn = SelfAttention(dim, heads, heads, dim // heads, bias, bias, None, "out_proj")
        self.self_attn_layer_norm = nn.LayerNorm(dim, affine=a.layer_norm_elementwise_affine)
        self.final_layer_norm = nn.LayerNorm(dim, affine=a.layer_norm_elementwise_affine)
        self.fc1 = nn.Linear(dim, a.ffn_dim, bias=bias)
        self.fc2 = nn.Linear(a.ffn_dim, dim, bias=bias)
        self.act = activation(a.activation_function)
        self.pre_norm = a.do_layer_norm_before

    def __call__(self, x, positions, mask=None, cache=None, n_main=None):
        h = self.self_attn_layer_norm(x) if self.pre_norm else x
        h = x + self.self_attn(h, positions, mask, cache, n_main)
        if not self.pre_norm:
            h = self.self_attn_layer_norm(h)
        m = self.final_layer_norm(h) if self.pre_norm else h
        h = h + project(self.fc2, self.act(project(self.fc1, m, n_main)), n_main)
        return h if self.pre_norm else self.final_layer_norm(h)


class Decoder(nn.Module):
    def __init__(self, a: Args):
        super().__init__()
        dim, proj = a.hidden_size, a.word_embed_proj_dim
        self.embed_tokens = nn.Embedding(a.vocab_size, proj)
        self.embed_positions = nn.Embedding(a.max_position_embeddings + 2, dim)
        if proj != dim:
            self.project_in = nn.Linear(proj, dim, bias=False)
            self.project_out = nn.Linear(dim, proj, bias=False)
        if a.do_layer_norm_before and not a._remove_final_layer_norm:
            self.final_layer_norm = nn.LayerNorm(dim, affine=a.layer_norm_elementwise_affine)
        self.layers = [Block(a) for _ in range(a.num_hidden_layers)]


class Model(CausalLM):
    def __init__(self, cfg: dict):
        super().__init__()
        self.config = cfg
        self.args = args = Args.from_dict(cfg)
        self.model = Decoder(args)
        self.tied = args.tie_word_embeddings
        if not self.tied:
            self.lm_head = nn.Linear(args.word_embed_proj_dim, args.vocab_size, bias=False)

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
