"""Conversions: Hugging Face / PyTorch checkpoints into MLX, and MLX models out to Core ML."""
