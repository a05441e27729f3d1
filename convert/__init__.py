"""Conversions: Hugging Face / PyTorch checkpoints into MLX, and MLX models out to Core ML."""

from __future__ import annotations


def __getattr__(name: str):
    # Lazy, so importing the package does not pull in mlx or torch.
    if name == "convert_hf":
        from .hf_import import convert

        return convert
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
