"""Pieces shared by every architecture: rotary embeddings at explicit positions, attention over
a KV cache plus uncached rows, and the default causal mask.

Every block takes ``positions`` (one position per row) and an optional ``n_main``: rows
``[0, n_main)`` are main-stream rows whose keys/values go to the cache; rows after them are
speculative-stream rows that attend like everything else but are never cached.

A layer with a sliding window sees, from every row (main or stream), only the keys fewer than
``window`` positions behind the row's own position, on top of whatever its mask allows. A layer
with a ``softcap`` (Gemma 2) bounds its attention scores to ``cap * tanh(score / cap)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ..errors import ConfigError, UnsupportedModelError
from ..kernels import host_math
from ..kernels.attention import (
    AttentionPlan,
    BatchPlan,
    attend_with_cache,
    cached_and_streams,
    capped_attention,
    sdpa,
)
from ..lora import project

# The scalar annotations :meth:`BaseArgs.from_dict` checks (bool fields also take 0 / 1).
_SCALARS = {"int": (int,), "float": (int, float), "bool": (bool, int), "str": (str,)}


def check_value(name: str, value, annotation: str, source: str = "config.json",
                error: type[Exception] = ConfigError) -> None:
    """Raise ``error`` unless ``value`` (of key ``name`` in file ``source``) fits ``annotation``
    ("int", "float | None", ...); annotations other than scalars (lists, dicts) are not checked."""
    kinds = [k.strip() for k in str(annotation).split("|")]
    if value is None and "None" in kinds:
        return
    for kind in kinds:
        if kind == "None":
            continue
        allowed = _SCALARS.get(kind)
        if allowed is None:
            return
        if isinstance(value, allowed) and not (isinstance(value, bool) and kind in ("int", "float")):
            return
    raise error(f"{source}: {name} is {value!r}, which is not {' or '.join(kinds)}")


# Keys that list one entry per layer.
PER_LAYER_KEYS = ("layer_types", "no_rope_layers")


def _check_meaning(name: str, value, n_layers) -> None:
    """A size, count or period (``hidden_size``, ``num_attention_heads``, ``*_interval``) is at
    least 1; a per-layer list has one entry per layer: otherwise a :class:`ConfigError`."""
    if (isinstance(value, int) and not isinstance(value, bool) and value < 1
            and (name.startswith("num_") or name.endswith(("_size", "_dim", "_interval", "_pattern")))):
        raise ConfigError(f"config.json: {name} is {value}, which is not at least 1")
    per_layer = isinstance(value, list) and len(value) == n_layers
    if name in PER_LAYER_KEYS and value is not None and not per_layer:
        shown = f"{len(value)} entries" if isinstance(value, list) else repr(value)
        raise ConfigError(f"config.json: {name} has {shown}, not one per layer ({n_layers})")


@dataclass
class BaseArgs:
    """A family's typed config: :meth:`from_dict` reads the fields it declares from a HF config
    and ignores every other key; derived values are computed once, in ``__post_init__``."""

    @classmethod
    def from_dict(cls, cfg: dict):
        """The fields ``cls`` declares, read from ``cfg``; a required one missing, or a value of
        the wrong type (``"hidden_size": "64"``), is a :class:`ConfigError` naming the key."""
        declared = [f for f in fields(cls) if f.init]
        missing = [f.name for f in declared if f.name not in cfg
                   and f.default is MISSING and f.default_factory is MISSING]
        if missing:
            raise ConfigError(f"config.json has no {', '.join(missing)} (a {cfg.get('model_type', '?')} "
                              "model needs it)")
        n_layers = cfg.get("num_hidden_layers", next(
            (f.default for f in declared if f.name == "num_hidden_layers"), None))
        for f in declared:
            if f.name in cfg:
                check_value(f.name, cfg[f.name], f.type)
                _check_meaning(f.name, cfg[f.name], n_layers)
        return cls(**{f.name: cfg[f.name] for f in declared if f.name in cfg})


@dataclass
class Rope:
    """Rotary embedding of the first ``dims`` features of each head (HF "rotate_half" layout).

    The cos/sin tables of a positions array are computed once and reused while the same array
    comes back: every layer of a pass, for its queries and its keys, gets the pass's one
    ``positions`` array (``streams.forward``)."""

    dims: int
    inv_freq: mx.array
    attention_factor: float = 1.0
    _tables: tuple | None = field(default=None, init=False, repr=False, compare=False)

    def tables(self, positions: mx.array, dtype: mx.Dtype) -> tuple[mx.array, mx.array]:
        """cos and sin, (T, dims) for (T,) positions or (B, 1, T, dims) for (B, T), in ``dtype``."""
        last = self._tables
        if last is not None and last[0] is positions and last[1] == dtype:
            return last[2], last[3]
        ang = positions.astype(mx.float32)[..., None] * self.inv_freq
        if ang.ndim == 3:
            ang = ang[:, None]  # (B, 1, T, D/2): shared by the heads
        ang = mx.concatenate([ang, ang], axis=-1)
        cos = (mx.cos(ang) * self.attention_factor).astype(dtype)
        sin = (mx.sin(ang) * self.attention_factor).astype(dtype)
        self._tables = (positions, dtype, cos, sin)
        return cos, sin

    def __call__(self, x: mx.array, positions: mx.array) -> mx.array:
        # x: (B, H, T, D); positions: (T,) int, or (B, T) where each sequence has its own
        cos, sin = self.tables(positions, x.dtype)
        rot, rest = x[..., : self.dims], x[..., self.dims :]
        half = self.dims // 2
        x1, x2 = rot[..., :half], rot[..., half:]
        rotated = rot * cos + mx.concatenate([-x2, x1], axis=-1) * sin
        return mx.concatenate([rotated, rest], axis=-1) if rest.shape[-1] else rotated


def rope_scaling(cfg: dict) -> tuple[dict, str]:
    """The rotary scaling a config asks for (``rope_scaling``, else transformers-5
    ``rope_parameters``; {} where neither is an object) and its kind (``rope_type``, or the older
    ``type``; "default")."""
    scaling = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    scaling = scaling if isinstance(scaling, dict) else {}
    return scaling, scaling.get("rope_type", scaling.get("type", "default"))


def make_rope(cfg: dict, head_dim: int, default_partial: float = 1.0) -> Rope:
    """Build the rotary embedding of a config, with the static scaling variants HF configs use.

    Reads both the transformers<5 keys (``rope_theta``, ``rope_scaling``,
    ``partial_rotary_factor``) and the transformers>=5 ``rope_parameters`` dict.
    """
    for key in ("rope_parameters", "rope_scaling"):
        if not isinstance(cfg.get(key) or {}, dict):
            raise ConfigError(f"config.json: {key} is {cfg[key]!r}, which is not an object")
    params = dict(cfg.get("rope_parameters") or {})
    scaling, kind = rope_scaling(cfg)

    def number(key: str, default=None, source: dict = scaling) -> float:
        """``source[key]`` (``default`` when absent), a positive number, or a ConfigError."""
        value = source.get(key, default)
        if value is None:
            raise ConfigError(f"config.json: rope scaling '{kind}' needs {key}")
        check_value(key, value, "float")
        if not value > 0:
            raise ConfigError(f"config.json: {key} is {value!r}, which is not positive")
        return value

    def given(key: str, default: float | None = None) -> float | None:
        """``scaling[key]`` checked by :func:`number` where set; ``default`` where absent or 0
        (transformers' ``get(key) or default``)."""
        return number(key) if scaling.get(key) else default

    base = number("rope_theta", cfg.get("rope_theta", 10000.0), params)
    partial = number("partial_rotary_factor", cfg.get("partial_rotary_factor", default_partial), params)
    dims = int(head_dim * partial)
    max_positions = cfg.get("max_position_embeddings", 4096)
    # On the host in float64 with libm's pow, rounded to float32 once at the end: the same bits on
    # every machine and device (NumPy's float32 pow differs in the last bit between CPUs, AVX-512
    # or not, and MLX's between devices), so a model's fingerprint (adapter.architecture) does not
    # depend on where it was built. transformers computes them in float32: within 5e-7 of these.
    inv = np.array([1.0 / math.pow(base, i / dims) for i in range(0, dims, 2)])
    if kind == "default":
        return Rope(dims, _float32(inv))
    if kind == "linear":
        return Rope(dims, _float32(inv / number("factor")))
    if kind == "llama3":
        factor, lo, hi = number("factor"), number("low_freq_factor"), number("high_freq_factor")
        old = number("original_max_position_embeddings")
        wavelen = 2 * math.pi / inv
        smooth = (old / wavelen - lo) / (hi - lo)
        mid = (1 - smooth) * inv / factor + smooth * inv
        out = np.where(wavelen > old / lo, inv / factor, inv)
        is_mid = (wavelen <= old / lo) & (wavelen >= old / hi)
        return Rope(dims, _float32(np.where(is_mid, mid, out)))
    if kind == "yarn":  # transformers' _compute_yarn_parameters
        old = number("original_max_position_embeddings", max_positions)
        factor = number("factor", max_positions / old)
        beta_fast, beta_slow = given("beta_fast", 32), given("beta_slow", 1)

        def corr(rot):
            return dims * math.log(old / (rot * 2 * math.pi)) / (2 * math.log(base))

        low, high = corr(beta_fast), corr(beta_slow)
        if scaling.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dims - 1)
        span = (high + 0.001 if high == low else high) - low  # no division by 0
        ramp = np.clip((np.arange(dims // 2, dtype=np.float64) - low) / span, 0, 1)
        extrapolation = 1 - ramp
        inv_y = (inv / factor) * (1 - extrapolation) + inv * extrapolation

        def mscale(scale: float, m: float = 1.0) -> float:
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        attention_factor = number("attention_factor") if scaling.get("attention_factor") is not None else None
        if attention_factor is None:
            m, m_all = given("mscale"), given("mscale_all_dim")
            attention_factor = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
        return Rope(dims, _float32(inv_y), float(attention_factor))
    if kind in LONGROPE:  # transformers' _compute_longrope_parameters, within the original context
        old = number("original_max_position_embeddings", cfg.get("original_max_position_embeddings"))
        short = scaling.get("short_factor")
        if not (isinstance(short, list) and len(short) == dims // 2 and all(
                isinstance(f, (int, float)) and not isinstance(f, bool) and f > 0 for f in short)):
            raise ConfigError(f"config.json: rope scaling '{kind}' needs short_factor, {dims // 2} positive "
                              "numbers")
        factor = number("factor") if scaling.get("factor") is not None else max_positions / old
        attention_factor = (number("attention_factor") if scaling.get("attention_factor") is not None
                            else 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(old)))
        return Rope(dims, _float32(inv / np.array(short, np.float64)), float(attention_factor))
    raise UnsupportedModelError(
        f"rope scaling '{kind}' is not supported (supported: default, linear, llama3, yarn, longrope)"
    )


def _float32(table: np.ndarray) -> mx.array:
    """A float64 rotary table as the float32 MLX array a Rope holds."""
    return mx.array(table.astype(np.float32))


def causal_mask(n_rows: int, offset: int) -> mx.array:
    """Boolean (n_rows, offset + n_rows) mask: row i sees keys 0..offset+i
    (:func:`layout.keys_by_position` of positions ``offset..``, built on the device)."""
    rows = mx.arange(n_rows)[:, None] + offset
    return mx.arange(offset + n_rows)[None, :] <= rows


def window_mask(mask: mx.array | None, positions: mx.array, n_earlier: int, window: int,
                start: mx.array | None = None) -> mx.array:
    """``mask`` further limited to keys fewer than ``window`` positions behind each row
    (``transformers``' ``kv > q - window``). Keys are the ``n_earlier`` cached ones, at positions
    ``0..n_earlier-1`` (from ``start``, (B,), per sequence where given: the cache's
    :attr:`~mlx_specstream.kv_cache.KVCache.start`), then this pass's rows at ``positions`` ((T,),
    or (B, T) per sequence).

    Example: window 4, a left-padded batch's sequence padded by 2 (start -2), decoding its row at
    position 6 (slot 8): the keys of slots 0..7 are at positions -2..5 (the padding's, below 0,
    masked by the caller), and it sees slots 5..8 (positions 3..6)."""
    earlier = mx.arange(n_earlier, dtype=positions.dtype)
    if start is not None:
        earlier = earlier[None, :] + start[:, None].astype(positions.dtype)
    keys = mx.concatenate([mx.broadcast_to(earlier, (*positions.shape[:-1], n_earlier)), positions], axis=-1)
    near = (positions[..., :, None] - keys[..., None, :]) < window
    if near.ndim == 3:
        near = near[:, None]  # (B, 1, T, S): per-sequence positions, shared by the heads
    if mask is None:
        return near
    if mask.dtype == mx.bool_:
        return mask & near
    return mx.where(near, mask, mx.array(-mx.inf, mask.dtype))


def attention(
    q: mx.array,
    k: mx.array,
    v: mx.array,
    cache,
    mask: mx.array | AttentionPlan | None,
    n_main: int | None,
    scale: float,
    positions: mx.array | None = None,
    window: int | None = None,
    softcap: float | None = None,
) -> mx.array:
    """Attention of all rows; the first ``n_main`` rows' keys/values are appended to ``cache``.

    q, k, v: (B, H, T, D). ``mask`` is boolean or additive with shape (T, S) where S counts the
    cache (after appending) followed by the uncached rows; None means "see every key"; an
    :class:`AttentionPlan` describes a tree / multi-stream pass. ``window`` (with the rows'
    ``positions``) applies a sliding window: a plan whose rows all lie inside the window runs as
    is (kernels or dense path), else its dense mask is windowed. A :class:`BatchPlan` runs each
    sequence of a batched pass with its own plan; ``cache`` is then one cache per sequence.
    ``softcap``: scores soft-capped before the mask (:func:`capped_attention`, the dense path: the
    kernels and ``mx.fast`` have no cap).
    """
    if isinstance(mask, BatchPlan):  # several sequences, each with its own cache and plan
        outs = []
        for b, plan in enumerate(mask.plans):
            pos = None if positions is None else mask.gather(positions, b, axis=-1)
            o = attention(mask.gather(q, b), mask.gather(k, b), mask.gather(v, b), cache[b], plan,
                          mask.main[b], scale, pos, window, softcap)
            outs.append(mask.scatter(o, b, q.shape[2]))
        return mx.concatenate(outs, axis=0)
    if isinstance(mask, AttentionPlan):  # tree / multi-stream structure: kernels or dense path
        if softcap is None and (window is None or mask.n_prefix + mask.n_rows <= window):
            return attend_with_cache(q, k, v, cache, mask, n_main, scale)
        mask = mask.mask
    if cache is not None:
        keys, values, ks, vs = cached_and_streams(k, v, cache, n_main)
        if ks is not None:  # the dense path sees the stream rows after the cache
            keys, values = mx.concatenate([keys, ks], axis=2), mx.concatenate([values, vs], axis=2)
    else:
        keys, values = k, v
    if window is not None:
        mask = window_mask(mask, positions, keys.shape[2] - k.shape[2], window, getattr(cache, "start", None))
    if mask is not None and mask.dtype != mx.bool_ and mask.dtype != q.dtype:
        mask = mask.astype(q.dtype)
    if softcap is not None:
        return capped_attention(q, keys, values, mask, scale, softcap)
    return sdpa(q, keys, values, mask, scale)


class SelfAttention(nn.Module):
    """Multi-head (GQA) self-attention with q/k/v/o projections and rotary positions.

    Options: ``qk_norm`` builds a norm over ``head_dim`` applied to every head's queries and keys
    before the rotary embedding (``q_norm``/``k_norm``); ``scale`` replaces ``head_dim**-0.5``;
    ``window`` makes it a sliding-window layer; ``softcap`` soft-caps its scores.
    """

    window: int | None = None  # class defaults: instances set them only when they have one
    softcap: float | None = None

    def __init__(self, dim, n_heads, n_kv_heads, head_dim, bias, out_bias, rope, out_name="o_proj", *,
                 qk_norm: Callable[[int], nn.Module] | None = None, scale: float | None = None,
                 window: int | None = None, softcap: float | None = None):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.scale = head_dim**-0.5 if scale is None else scale
        self.q_proj = nn.Linear(dim, n_heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(dim, n_kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(dim, n_kv_heads * head_dim, bias=bias)
        setattr(self, out_name, nn.Linear(n_heads * head_dim, dim, bias=out_bias))
        self._out = out_name
        self.rope = rope
        if qk_norm is not None:
            self.q_norm, self.k_norm = qk_norm(head_dim), qk_norm(head_dim)
        if window is not None:
            self.window = window
        if softcap is not None:
            self.softcap = softcap

    def __call__(self, x, positions, mask=None, cache=None, n_main=None):
        B, T, _ = x.shape
        q = project(self.q_proj, x, n_main).reshape(B, T, self.n_heads, -1)
        k = project(self.k_proj, x, n_main).reshape(B, T, self.n_kv_heads, -1)
        if "q_norm" in self:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3)
        v = project(self.v_proj, x, n_main).reshape(B, T, self.n_kv_heads, -1).transpose(0, 2, 1, 3)
        if self.rope is not None:
            q, k = self.rope(q, positions), self.rope(k, positions)
        o = attention(q, k, v, cache, mask, n_main, self.scale, positions, self.window, self.softcap)
        o = o.transpose(0, 2, 1, 3).reshape(B, T, -1)
        return project(getattr(self, self._out), o, n_main)


ACTIVATIONS = {
    "silu": host_math.silu,  # nn.silu, or NumPy's inside a CPU training step
    "swish": host_math.silu,
    "relu": nn.relu,
    "gelu": nn.gelu,
    "gelu_new": nn.gelu_approx,
    "gelu_pytorch_tanh": nn.gelu_approx,
    "gelu_fast": nn.gelu_approx,  # transformers' gelu_fast is the tanh form
    "quick_gelu": nn.gelu_fast_approx,  # x * sigmoid(1.702 x)
}


def activation(name: str):
    if name not in ACTIVATIONS:
        raise UnsupportedModelError(f"activation '{name}' is not supported")
    return ACTIVATIONS[name]


LONGROPE = ("longrope", "su")  # Phi-3.5's and Phi-4-mini's scaling ("su": its first name)


def max_positions(config: dict) -> int | None:
    """Tokens a model of ``config`` can hold (prompt + generated), or None where it sets none; a
    :class:`ConfigError` where it is not a whole number >= 1. With LongRoPE, its original context
    (``original_max_position_embeddings``): past it transformers rotates each call's every position
    by the long factors, keys already cached by the short ones (what a cache cannot reproduce)."""
    n = config.get("max_position_embeddings")
    if n is None:
        return None
    check_value("max_position_embeddings", n, "int")
    if n < 1:
        raise ConfigError(f"config.json: max_position_embeddings is {n}, which is not at least 1")
    scaling, kind = rope_scaling(config)
    if kind in LONGROPE:
        old = scaling.get("original_max_position_embeddings", config.get("original_max_position_embeddings"))
        if isinstance(old, int) and not isinstance(old, bool) and 0 < old < n:
            return old
    return n


class CausalLM(nn.Module):
    """The interface the engine relies on; each architecture fills in embed/head and keeps its
    backbone, whose ``layers`` are the decoder layers, in ``self.model``."""

    @property
    def layers(self) -> list:
        """The decoder layers, in order."""
        return self.model.layers

    @property
    def max_positions(self) -> int | None:
        """Tokens the model can hold (prompt + generated), or None when its config sets none."""
        return max_positions(self.config)

    def saved_name(self, path: str) -> str:
        """A parameter's or module's name in a directory we write: ours, which mlx-lm reads too
        (a family whose mlx-lm names differ says them here; ``sanitize`` reads them back)."""
        return path

    def embed(self, tokens: mx.array, positions: mx.array) -> mx.array:
        raise NotImplementedError

    def head(self, h: mx.array) -> mx.array:
        """Final norm and LM head: hidden states -> logits."""
        raise NotImplementedError

    def __call__(self, tokens: mx.array, cache=None, mask=None, positions=None) -> mx.array:
        """Logits (B, T, vocab). Default positions continue the cache; default mask is causal."""
        T = tokens.shape[1]
        if cache and hasattr(cache[0], "update_and_fetch") and not hasattr(cache[0], "append"):
            raise TypeError("this model is mlx-specstream's, and mlx-lm's caches are not its own: decode it "
                            "with mlx_specstream.generate or stream_generate (mlx-lm's load reads the same "
                            "directory into mlx-lm's model)")
        offset = cache[0].offset if cache is not None else 0
        if positions is None:
            positions = mx.arange(offset, offset + T)
        if mask is None and T > 1:
            mask = causal_mask(T, offset)
        h = self.embed(tokens, positions)
        for i, layer in enumerate(self.layers):
            h = layer(h, positions, mask, cache[i] if cache is not None else None)
        return self.head(h)
