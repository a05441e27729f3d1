"""Gemma 3 text models (``gemma3_text``, and the text part of a ``gemma3`` checkpoint): the Gemma 2
block (:mod:`.gemma2`) with q/k norms, no soft-capping by default, every ``sliding_window_pattern``-th
layer global, and a rotary base for each kind of layer (local, and global with its scaling).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import mlx.core as mx

from ..errors import ConfigError
from . import gemma2
from .base import Rope, make_rope
from .gemma2 import GLOBAL, SLIDING


@dataclass
class Args(gemma2.Args):
    """Defaults are ``Gemma3TextConfig``'s: a ``gemma3`` checkpoint's ``text_config`` lists only
    the values that differ from them."""

    vocab_size: int = 262_208
    max_position_embeddings: int = 131_072
    sliding_window_pattern: int = 6
    rope_parameters: dict | None = None
    rope_theta: float = 1_000_000.0
    rope_local_base_freq: float = 10_000.0
    rope_scaling: dict | None = None
    final_logit_softcapping: float | None = None
    attn_logit_softcapping: float | None = None
    ropes: dict = field(init=False)

    def __post_init__(self):
        super().__post_init__()
        params = self.rope_parameters or {}
        if SLIDING not in params and GLOBAL not in params:  # transformers<5 keys
            params = {GLOBAL: {"rope_theta": self.rope_theta, **(self.rope_scaling or {})},
                      SLIDING: {"rope_theta": self.rope_local_base_freq}}
        # one rotary embedding per layer kind, built once
        self.ropes = {kind: make_rope({"rope_parameters": params.get(kind) or {"rope_type": "default"},
                                       "max_position_embeddings": self.max_position_embeddings},
                                      self.head_dim)
                      for kind in set(self.layer_types)}


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


class Model(gemma2.Model):
    Args = Args
    qk_norm = True
    text_config = staticmethod(text_config)

    def ropes(self, args: Args) -> dict[str, Rope]:
        return args.ropes

    def softcap(self, args: Args) -> None:
        """None: transformers' Gemma 3 reads ``attn_logit_softcapping`` and applies it nowhere (as
        mlx-lm), so its scores are not capped here either (the released configs set none)."""
        return None

    def sanitize(self, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        """HF names -> ours: a ``gemma3`` checkpoint's language model only (both transformers
        layouts), then as Gemma's."""
        out = {}
        for name, w in weights.items():
            for prefix in ("language_model.model.", "model.language_model."):
                name = "model." + name[len(prefix):] if name.startswith(prefix) else name
            name = name.removeprefix("language_model.")
            if not name.startswith(("vision_tower.", "multi_modal_projector.", "model.vision_tower.",
                                    "model.multi_modal_projector.")):
                out[name] = w
        return super().sanitize(out)
