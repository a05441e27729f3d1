"""Llama family: ``llama``, ``mistral``, ``qwen2``, ``phi3`` (pre-norm RMSNorm, SwiGLU, RoPE, GQA).

Families built on this block (Qwen3, SmolLM3) subclass :class:`Model` and override
:meth:`Model.block`, the one place a layer is made.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import mlx.core as mx
import mlx.nn as nn

from ..lora import project
from .base import BaseArgs, CausalLM, Rope, SelfAttention, activation, make_rope


@dataclass
class Args(BaseArgs):
    model_type: str
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    vocab_size: int
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    rms_norm_eps: float = 1e-6
    hidden_act: str = "silu"
    attention_bias: bool = False
    mlp_bias: bool = False
    tie_word_embeddings: bool = False
    sliding_window: int | None = None
    use_sliding_window: bool | None = None  # None: transformers' default for the family
    max_window_layers: int = 28  # qwen2/qwen3 without layer_types: the layers from here on slide
    layer_types: list[str] | None = None
    qkv_bias: bool = field(init=False)
    o_bias: bool = field(init=False)

    def __post_init__(self):
        self.num_key_value_heads = self.num_key_value_heads or self.num_attention_heads
        self.head_dim = self.head_dim or self.hidden_size // self.num_attention_heads
        qwen2 = self.model_type == "qwen2"  # biases on q/k/v only, whatever attention_bias says
        self.qkv_bias = qwen2 or self.attention_bias
        self.o_bias = self.attention_bias and not qwen2
        if self.use_sliding_window is None:  # a switch only Qwen's and SmolLM3's configs have, off there
            self.use_sliding_window = self.model_type not in ("qwen2", "qwen3", "smollm3")

    def slides(self, layer: int) -> bool:
        """Whether a layer slides in a config without ``layer_types``: as transformers derives
        them, qwen2/qwen3's layers from ``max_window_layers`` on."""
        return self.model_type in ("qwen2", "qwen3") and layer >= self.max_window_layers

    def window(self, layer: int) -> int | None:
        """The sliding window of a layer, as transformers reads the config: those ``layer_types``
        marks "sliding_attention" (a mistral config with them loads as Ministral, whose layers
        alternate), except phi3, whose model ignores them; every layer of mistral and phi3 without
        them; else :meth:`slides`; none unless ``use_sliding_window``."""
        if self.model_type == "phi3" or (self.model_type == "mistral" and self.layer_types is None):
            sliding = True
        elif self.layer_types is not None:
            sliding = self.layer_types[layer] == "sliding_attention"
        else:
            sliding = self.slides(layer)
        return self.sliding_window if sliding and self.use_sliding_window and self.sliding_window else None


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
    """Pre-norm attention + SwiGLU MLP; ``norm`` makes the norms (Gemma's its own), ``mlp`` stands
    in for the MLP (a mixture of experts); ``attn_options`` go to :class:`SelfAttention`."""

    def __init__(self, args: Args, rope: Rope | None, norm=nn.RMSNorm, mlp: nn.Module | None = None,
                 **attn_options):
        super().__init__()
        a = args
        self.self_attn = SelfAttention(a.hidden_size, a.num_attention_heads, a.num_key_value_heads,
                                       a.head_dim, a.qkv_bias, a.o_bias, rope, **attn_options)
        if mlp is None:
            mlp = MLP(a.hidden_size, a.intermediate_size, a.mlp_bias, a.hidden_act)
        self.mlp = mlp
        self.input_layernorm = norm(a.hidden_size, eps=a.rms_norm_eps)
        self.post_attention_layernorm = norm(a.hidden_size, eps=a.rms_norm_eps)

    def __call__(self, x, positions, mask=None, cache=None, n_main=None):
        h = x + self.self_attn(self.input_layernorm(x), positions, mask, cache, n_main)
        return h + self.mlp(self.post_attention_layernorm(h), n_main)


class Inner(nn.Module):
    def __init__(self, args: Args, layers: list[nn.Module], norm=nn.RMSNorm):
        super().__init__()
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = layers
        self.norm = norm(args.hidden_size, eps=args.rms_norm_eps)


class Model(CausalLM):
    Args = Args

    def __init__(self, cfg: dict):
        super().__init__()
        self.config = cfg
        self.args = args = self.Args.from_dict(cfg)
        rope = make_rope(cfg, args.head_dim)
        self.model = Inner(args, [self.block(args, i, rope) for i in range(args.num_hidden_layers)])
        self.tied = args.tie_word_embeddings
        if not self.tied:
            self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)

    def block(self, args: Args, i: int, rope: Rope, **options) -> nn.Module:
        """Layer ``i`` (subclasses add their per-layer ``options``)."""
        return Block(args, rope, window=args.window(i), **options)

    def embed(self, tokens, positions):
        return self.model.embed_tokens(tokens)

    def head(self, h):
        h = self.model.norm(h)
        return self.model.embed_tokens.as_linear(h) if self.tied else self.lm_head(h)

    def sanitize(self, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        """HF names -> ours: drop rotary buffers and tied heads, split phi3's fused projections."""
        a = self.args
        q, k = a.num_attention_heads * a.head_dim, a.num_key_value_heads * a.head_dim
        out = {}
        for name, w in weights.items():
            if "rotary_emb" in name or (self.tied and name.startswith("lm_head.")):
                continue
            if ".qkv_proj." in name:
                for part, (lo, hi) in zip("qkv", [(0, q), (q, q + k), (q + k, q + 2 * k)]):
                    out[name.replace("qkv_proj", f"{part}_proj")] = w[lo:hi]
            elif ".gate_up_proj." in name:
                half = w.shape[0] // 2
                out[name.replace("gate_up_proj", "gate_proj")] = w[:half]
                out[name.replace("gate_up_proj", "up_proj")] = w[half:]
            else:
                out[name] = w
        return out
