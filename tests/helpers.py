"""Tiny random models for tests (no downloads)."""

from __future__ import annotations

import mlx.core as mx

from mlx_specstream.arch import build_model

CONFIGS = {
    "llama": dict(model_type="llama", hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=128, num_hidden_layers=4, vocab_size=64),
    "qwen2": dict(model_type="qwen2", hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=128, num_hidden_layers=4, vocab_size=64, tie_word_embeddings=True),
    "opt": dict(model_type="opt", hidden_size=64, num_attention_heads=4, ffn_dim=128,
                num_hidden_layers=4, vocab_size=64, max_position_embeddings=512),
    "phi": dict(model_type="phi", hidden_size=64, num_attention_heads=4, intermediate_size=128,
                num_hidden_layers=4, vocab_size=64, max_position_embeddings=512),
}


def tiny_model(arch: str = "llama", seed: int = 0, scale: float = 1.0, **overrides):
    """A random fp32 model; ``scale`` multiplies the weights to sharpen its distributions."""
    mx.random.seed(seed)
    model = build_model({**CONFIGS[arch], **overrides})
    if scale != 1.0:
        from mlx.utils import tree_flatten, tree_unflatten

        params = [(k, v * scale if v.ndim > 1 else v) for k, v in tree_flatten(model.parameters())]
        model.update(tree_unflatten(params))
    mx.eval(model.parameters())
    model.eval()
    return model
