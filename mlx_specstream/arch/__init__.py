"""Architectures: ``model_type`` -> model class. Each model exposes ``embed``, ``layers``, ``head``."""

from __future__ import annotations

from ..errors import UnsupportedModelError
from . import gemma, gemma2, gemma3, llama, mixtral, opt, phi, qwen3, qwen3_moe, smollm3
from .base import CausalLM, max_positions

ARCHITECTURES = {
    "llama": llama.Model,
    "mistral": llama.Model,
    "mixtral": mixtral.Model,
    "qwen2": llama.Model,
    "phi3": llama.Model,
    "opt": opt.Model,
    "phi": phi.Model,
    "qwen3": qwen3.Model,
    "qwen3_moe": qwen3_moe.Model,
    "smollm3": smollm3.Model,
    "gemma": gemma.Model,
    "gemma2": gemma2.Model,
    "gemma3_text": gemma3.Model,
    "gemma3": gemma3.Model,
}


def build_model(config: dict) -> CausalLM:
    """Instantiate the (uninitialised) model a HF-style config describes."""
    model_type = config.get("model_type")
    if not model_type:
        raise UnsupportedModelError("config.json has no 'model_type'")
    if not isinstance(model_type, str):
        raise UnsupportedModelError(f"config.json: model_type is {model_type!r}, not a name")
    if model_type not in ARCHITECTURES:
        raise UnsupportedModelError(
            f"unknown model_type '{model_type}' (supported: {', '.join(sorted(ARCHITECTURES))})"
        )
    max_positions(config)  # checked here: the engine reads it from the config, not a family's args
    return ARCHITECTURES[model_type](config)


__all__ = ["ARCHITECTURES", "CausalLM", "UnsupportedModelError", "build_model"]
