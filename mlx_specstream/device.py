"""Whether this process computes on a GPU (Apple's Metal or NVIDIA's CUDA), not the CPU.

The rule behind every device-dependent default: on a GPU extra rows of a pass are nearly free
(a draft tree costs about what a chain does, streams go on every node, half-precision weights
stay half); on the CPU each row costs its own matrix-vector work (docs/engine.md).
"""

from __future__ import annotations

import mlx.core as mx


def on_gpu() -> bool:
    """True when MLX's default device is a GPU (an MLX build with Metal or CUDA)."""
    return mx.default_device().type == mx.DeviceType.gpu


def on_cuda() -> bool:
    """True on an NVIDIA GPU (MLX's CUDA backend). There ``mx.fast.scaled_dot_product_attention``
    of more than one query row goes through cuDNN, which builds an execution graph for each new
    set of shapes (an LRU of exact query, key and mask shapes): a decode pass, whose key length
    grows every pass, would build one every pass (the likely cause of the slow passes measured on
    an H100, docs/gpu.md), so such passes run their attention as plain matrix products there
    (``kernels.attention.sdpa``)."""
    return on_gpu() and not mx.metal.is_available()


def device_label() -> str:
    """What results files name as the device that computed: "cpu", or the GPU's name
    ("gpu: Apple M2 Max", "gpu: NVIDIA H100 80GB HBM3"; "gpu" when the name cannot be read)."""
    if not on_gpu():
        return "cpu"
    if mx.metal.is_available():
        return f"gpu: {mx.metal.device_info().get('device_name', 'Metal')}"
    import subprocess

    try:  # MLX's CUDA backend does not report the card's name; the driver's tool does
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10).stdout.split("\n")[0].strip()
    except (OSError, subprocess.SubprocessError):
        out = ""
    return f"gpu: {out}" if out else "gpu"
