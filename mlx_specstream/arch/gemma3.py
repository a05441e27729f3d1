"""Gemma 3 text models (``gemma3_text``, and the text part of a ``gemma3`` checkpoint).

Differences from the llama block: embeddings scaled by sqrt(hidden), RMS norms that multiply by
``1 + weight``, a norm before and after both attention and MLP, q/k norms, queries scaled by
``query_pre_attn_scalar**-0.5``, GELU (tanh) MLP, and two kinds of layers: sliding-window layers
(local rotary base) and global layers (global base and scaling), as ``layer_types`` lists them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial

import mlx.core as mx
import mlx.nn as nn

from ..errors import ConfigError, UnsupportedModelError
from .base import BaseArgs, CausalLM, SelfAttention, make_rope
from .llama import MLP

SLIDING, GLOBAL = "sliding_attention", "full_attention"


@dataclass
class Args(BaseArgs):
    """Defaults are ``Gemma3TextConfig``'s: a ``gemma3`` checkpoint's ``text_config`` lists only
    the values that differ from them."""

    vocab_size: int = 262_208
    hidden_size: int = 2304
    intermediate_size: int = 9216
    num_hidden_layers: int = 26
    num_attention_heads: int = 8
    num_key_value_heads: int = 4
    head_dim: int = 256
    hidden_activation: str = "gelu_pytorch_tanh"
    max_position_embeddings: int = 131_072
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = True
    attention_bias: bool = False
    query_pre_attn_scalar: float = 256
    sliding_window: int = 4096
    sliding_window_pattern: int = 6
    layer_types: list[str] | None = None
    rope_parameters: dict | None = None
    rope_theta: float = 1_000_000.0
    rope_local_base_freq: float = 10_000.0
    rope_scaling: dict | None = None
    final_logit_softcapping: float | None = None
    attn_logit_softcapping: float | None = None
    use_bidirectional_attention: bool = False
    ropes: dict = field(init=False)

    def __post_init__(self):
        if self.attn_logit_softcapping is not None:
            raise UnsupportedModelError("gemma3 with attn_logit_softcapping is not supported")
        if self.use_bidirectional_attention:
            raise UnsupportedModelError("gemma3 with use_bidirectional_attention is not supported")
        if self.layer_types is None:
            self.layer_types = [SLIDING if (i + 1) % self.sliding_window_pattern else GLOBAL
                                for i in range(self.num_hidden_layers)]
        params = self.rope_parameters or {}
        if SLIDING not in params and GLOBAL not in params:  # transformers<5 keys
            params = {GLOBAL: {"rope_theta": self.rope_theta, **(self.rope_scaling or {})},
                      SLIDING: {"rope_theta": self.rope_local_base_freq}}
        # one rotary embedding per layer kind, built once
        self.ropes = {kind: make_rope({"rope_parameters": params.get(kind) or {"rope_type": "default"},
                                       "max_position_embeddings": self.max_position_embeddings},
                                      self.head_dim)
                      for kind in set(self.layer_types)}

    @property
    def hidden_act(self) -> str:
        """The MLP activation, under the name the llama family's configs use."""
        return self.hidden_activation


class RMSNorm(nn.Module):
    """Gemma's RMS norm: ``x / rms(x) * (1 + weight)``, the weight stored as an offset from 1."""

    def __init__(self, dims: int, eps: float):
        super().__init__()
        self.weight = mx.zeros((dims,))
        self.eps = eps

    def __call__(self, x):
        return mx.fast.rms_norm(x, 1.0 + self.weight, self.eps)


class Block(nn.Module):
    def __init__(self, args: Args, i: int):
        super().__init__()
        a, kind = args, args.layer_types[i]
        norm = partial(RMSNorm, eps=a.rms_norm_eps)
        self.self_attn = SelfAttention(
            a.hidden_size, a.num_attention_heads, a.num_key_value_heads, a.head_dim, a.attention_bias,
            a.attention_bias, a.ropes[kind], qk_norm=norm, scale=a.query_pre_attn_scalar**-0.5,
            window=a.sliding_window if kind == SLIDING else None)
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


class Inner(nn.Module):
    def __init__(self, args: Args):
        super().__init__()
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = [Block(args, i) for i in range(args.num_hidden_layers)]
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps)


def text_config(cfg: dict) -> dict:
    """The config of the text model, as a converted directory holds it: a ``gemma3`` config's
    ``text_config`` over its other keys; transformers-5 ``rope_parameters`` (per layer kind) also
    written under the older top-level keys, which mlx-lm reads."""
    if cfg.get("model_type") == "gemma3":
        text = cfg.get("text_config") or {}
        if not isinstance(text, dict):
            raise ConfigError(f"config.json: text_config is {text!r}, not an object")
        top = {k: v for k, v in cfg.items() if k not in ("text_config", "vision_config", "architectures")}
        cfg = {**top, **text, "model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"]}
    params = cfg.get("rope_parameters") or {}
    if GLOBAL in params and "rope_theta" not in cfg:
        glob = dict(params[GLOBAL])
        cfg = {**cfg, "rope_theta": glob.pop("rope_theta", Args.rope_theta)}
        if glob.get("rope_type", "default") != "default":
            cfg["rope_scaling"] = glob
    if SLIDING in params and "rope_local_base_freq" not in cfg:
        cfg = {**cfg, "rope_local_base_freq": params[SLIDING].get("rope_theta", Args.rope_local_base_freq)}
    return cfg


class Model(CausalLM):
    def __init__(self, cfg: dict):
        super().__init__()
        self.config = cfg = text_config(cfg)
        self.args = args = Args.from_dict(cfg)
        self.model = Inner(args)
        self.tied = args.tie_word_embeddings
        if not self.tied:
            self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)

    def embed(self, tokens, positions):
        h = self.model.embed_tokens(tokens)
        return h * mx.array(self.args.hidden_size**0.5, h.dtype)

    def head(self, h):
        h = self.model.norm(h)
        logits = self.model.embed_tokens.as_linear(h) if self.tied else self.lm_head(h)
        cap = self.args.final_logit_softcapping
        return logits if cap is None else mx.tanh(logits / cap) * cap

    def sanitize(self, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        """HF names -> ours: a ``gemma3`` checkpoint's language model only (both transformers
        layouts); tied heads and rotary buffers dropped."""
        out = {}
        for name, w in weights.items():
            for prefix in ("language_model.model.", "model.language_model."):
                name = "model." + name[len(prefix):] if name.startswith(prefix) else name
            name = name.removeprefix("language_model.")
            if (name.startswith(("vision_tower.", "multi_modal_projector.", "model.vision_tower.",
                                 "model.multi_modal_projector.")) or "rotary_emb" in name
                    or (self.tied and name.startswith("lm_head."))):
                continue
            out[name] = w
        return out
