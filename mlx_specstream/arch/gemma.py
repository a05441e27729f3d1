"""Gemma (1): the llama block with Gemma's RMS norm (``x / rms(x) * (1 + weight)``, the weight
stored as an offset from 1), embeddings scaled by sqrt(hidden), a GELU (tanh) MLP, heads of
``head_dim`` and tied embeddings. Gemma 2 and 3 (:mod:`.gemma2`, :mod:`.gemma3`) build on the norm.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

from . import llama
from .base import BaseArgs, CausalLM, make_rope


@dataclass
class Args(BaseArgs):
    """Defaults are ``GemmaConfig``'s."""

    vocab_size: int = 256_000
    hidden_size: int = 3072
    intermediate_size: int = 24_576
    num_hidden_layers: int = 28
    num_attention_heads: int = 16
    num_key_value_heads: int = 16
    head_dim: int = 256
    hidden_act: str = "gelu_pytorch_tanh"
    hidden_activation: str | None = None  # transformers < 5 read this one first
    rms_norm_eps: float = 1e-6
    attention_bias: bool = False
    tie_word_embeddings: bool = True

    def __post_init__(self):
        self.hidden_act = self.activation()

    @property
    def qkv_bias(self) -> bool:
        return self.attention_bias

    o_bias = qkv_bias
    mlp_bias = False  # (the llama block's names)

    def activation(self) -> str:
        """The MLP's activation: the released configs' ``"gelu"`` is read as transformers reads it
        for Gemma (1), as the tanh form they were trained with."""
        act = self.hidden_activation or self.hidden_act
        return "gelu_pytorch_tanh" if act == "gelu" else act


class RMSNorm(nn.Module):
    """Gemma's RMS norm: ``x / rms(x) * (1 + weight)``, the weight stored as an offset from 1."""

    def __init__(self, dims: int, eps: float = 1e-6):
        super().__init__()
        self.weight = mx.zeros((dims,))
        self.eps = eps

    def __call__(self, x):  # in float32, as transformers computes it (1 + w in bf16 would round w away)
        return mx.fast.rms_norm(x.astype(mx.float32), 1.0 + self.weight.astype(mx.float32),
                                self.eps).astype(x.dtype)


class Model(CausalLM):
    """A Gemma model; subclasses (:mod:`.gemma2`) give their own ``Args`` and :meth:`blocks`."""

    Args = Args

    def __init__(self, cfg: dict):
        super().__init__()
        self.config = cfg = self.text_config(cfg)
        self.args = args = self.Args.from_dict(cfg)
        self.model = llama.Inner(args, self.blocks(args), norm=RMSNorm)
        self.tied = args.tie_word_embeddings
        if not self.tied:
            self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)

    @staticmethod
    def text_config(cfg: dict) -> dict:
        """The config the model is built from (a multimodal checkpoint's: its text model's)."""
        return cfg

    def blocks(self, args: Args) -> list[nn.Module]:
        """The layers (the one place they are made)."""
        rope = make_rope(self.config, args.head_dim)
        return [llama.Block(args, rope, norm=RMSNorm) for _ in range(args.num_hidden_layers)]

    @property
    def embed_scale(self) -> float:
        """What embeddings are multiplied by: sqrt(hidden) (in their dtype, as transformers has it)."""
        return self.args.hidden_size**0.5

    def embed(self, tokens, positions):
        h = self.model.embed_tokens(tokens)
        return h * mx.array(self.embed_scale, h.dtype)

    def head(self, h):
        h = self.model.norm(h)
        logits = self.model.embed_tokens.as_linear(h) if self.tied else self.lm_head(h)
        cap = getattr(self.args, "final_logit_softcapping", None)
        return logits if cap is None else mx.tanh(logits / cap) * cap

    def sanitize(self, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        """HF names -> ours: tied heads and rotary buffers dropped."""
        return {name: w for name, w in weights.items()
                if "rotary_emb" not in name and not (self.tied and name.startswith("lm_head."))}
