"""mlx-specstream: Speculative Streaming (single-model speculative decoding) for MLX."""

from __future__ import annotations

from .blas import preload_fast_blas

__version__ = "0.1.0"

preload_fast_blas()  # before anything imports MLX: an optimized BLAS on Linux (see blas.py)

_API = {
    "load": "mlx_specstream.api",
    "generate": "mlx_specstream.api",
    "stream_generate": "mlx_specstream.api",
    "GenerationResult": "mlx_specstream.api",  # what generate returns
    "StreamResponse": "mlx_specstream.api",  # what stream_generate yields, pass by pass
    "new_adapter": "mlx_specstream.adapter",
    "load_adapter": "mlx_specstream.adapter",
    "save_adapter": "mlx_specstream.adapter",
    "detach": "mlx_specstream.adapter",
    "train": "mlx_specstream.trainer",
    "parse_tool_calls": "mlx_specstream.tool_calls",  # a chat reply's tool calls, as OpenAI's
    "forced_calls": "mlx_specstream.tool_choice",  # constraint=: a reply that is tool calls
    "json_constraint": "mlx_specstream.json_grammar",  # constraint=: a reply that is JSON by a schema
}


def __getattr__(name: str):
    """Import the public API lazily, so ``import mlx_specstream`` stays cheap."""
    if name in _API:
        import importlib

        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'mlx_specstream' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The lazy API too, for a notebook's tab completion."""
    return sorted({*globals(), *_API})


__all__ = list(_API)
