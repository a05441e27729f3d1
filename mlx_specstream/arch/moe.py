"""Sparse mixture-of-experts MLPs: a router gives each row its ``top_k`` experts, whose SwiGLU
MLPs run as products gathered from stacked weights (``mx.gather_mm``, or ``mx.gather_qmm`` once
quantized), their outputs summed with the router's probabilities of them (renormalized over the
k where ``norm_topk_prob``), as transformers' Qwen3-MoE computes them.

Shapes (B sequences, T rows, D hidden, E experts, k per row): router logits (B, T, E), the
experts a row uses (B, T, k); each stacked weight is (E, out, in), as ``nn.Linear`` keeps one;
the rows go in as (B, T, 1, 1, D), so that each meets its k experts' weights: (B, T, k, 1, out).
Example: E = 4, k = 2, a row whose router probabilities are [0.1, 0.5, 0.3, 0.1] runs experts
1 and 2 and sums their outputs with weights 0.5 and 0.3 (0.625 and 0.375 when renormalized).

The router is an ``nn.Linear`` (``gate``): a stream-only LoRA of the MSA layers reaches it, so
stream rows may route otherwise than main rows; the experts take none.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from ..errors import UnsupportedModelError
from ..lora import project
from .base import activation


class SwitchLinear(nn.Module):
    """``n_experts`` linear layers without bias, stacked: ``weight`` (E, out, in)."""

    def __init__(self, dims_in: int, dims_out: int, n_experts: int):
        super().__init__()
        self.weight = mx.zeros((n_experts, dims_out, dims_in))

    def __call__(self, x: mx.array, experts: mx.array, grouped: bool = False) -> mx.array:
        return mx.gather_mm(x, self.weight.swapaxes(-1, -2), rhs_indices=experts, sorted_indices=grouped)

    def to_quantized(self, group_size: int = 64, bits: int = 4, mode: str = "affine", **options) -> nn.Module:
        """The layer quantized as ``nn.quantize`` quantizes a linear layer (each expert's rows), in
        MLX's affine mode (the others, and their options, are refused by name)."""
        if mode != "affine" or options:
            raise UnsupportedModelError(f"the experts of a mixture are quantized in affine mode only, not "
                                        f"{mode}{' with ' + ', '.join(options) if options else ''}")
        return QuantizedSwitchLinear(self.weight, group_size, bits)


class QuantizedSwitchLinear(nn.Module):
    """:class:`SwitchLinear` with MLX's group-wise quantized weights (``scales``, ``biases``)."""

    def __init__(self, weight: mx.array, group_size: int = 64, bits: int = 4):
        super().__init__()
        self.group_size, self.bits = group_size, bits
        self.weight, self.scales, self.biases = mx.quantize(weight, group_size=group_size, bits=bits)
        self.freeze()  # as nn.QuantizedLinear: its integers are not trained

    def __call__(self, x: mx.array, experts: mx.array, grouped: bool = False) -> mx.array:
        return mx.gather_qmm(x, self.weight, self.scales, self.biases, rhs_indices=experts, transpose=True,
                             group_size=self.group_size, bits=self.bits, sorted_indices=grouped)


GROUPED_FROM = 64  # (row, expert) pairs from which they run grouped by expert (mlx-lm's threshold)


class Experts(nn.Module):
    """The experts' SwiGLU MLPs, stacked (``gate_proj``, ``up_proj``, ``down_proj``)."""

    def __init__(self, dim: int, hidden: int, n_experts: int, act: str):
        super().__init__()
        self.gate_proj = SwitchLinear(dim, hidden, n_experts)
        self.up_proj = SwitchLinear(dim, hidden, n_experts)
        self.down_proj = SwitchLinear(hidden, dim, n_experts)
        self.act = activation(act)

    def __call__(self, x: mx.array, experts: mx.array) -> mx.array:
        """x (B, T, D), experts (B, T, k) -> each row through each of its experts (B, T, k, D).

        From :data:`GROUPED_FROM` (row, expert) pairs on (prefills, training, large trees), the
        pairs run grouped by expert, each expert's weights read once, then are put back in order:
        the same values (each pair is its own product), several times faster."""
        if experts.size < GROUPED_FROM:
            x = x[..., None, None, :]
            h = self.act(self.gate_proj(x, experts)) * self.up_proj(x, experts)
            return self.down_proj(h, experts).squeeze(-2)
        k, flat = experts.shape[-1], experts.flatten()
        order = mx.argsort(flat)
        rows, by_expert = x.reshape(-1, 1, x.shape[-1])[order // k], flat[order]  # (N·k, 1, D), (N·k,)
        h = self.act(self.gate_proj(rows, by_expert, True)) * self.up_proj(rows, by_expert, True)
        out = self.down_proj(h, by_expert, True)[mx.argsort(order)]
        return out.reshape(*experts.shape, x.shape[-1])


class SparseMoE(nn.Module):
    """The router (``gate``) and the :class:`Experts` (``switch_mlp``, mlx-lm's name)."""

    def __init__(self, dim: int, hidden: int, n_experts: int, top_k: int, norm_topk_prob: bool, act: str,
                 weights_in_float32: bool = False):
        super().__init__()
        self.gate = nn.Linear(dim, n_experts, bias=False)
        self.switch_mlp = Experts(dim, hidden, n_experts, act)
        self.top_k, self.norm_topk_prob = top_k, norm_topk_prob
        self.weights_in_float32 = weights_in_float32  # Mixtral's; Qwen3-MoE's are cast to the model's dtype

    def __call__(self, x: mx.array, n_main: int | None = None) -> mx.array:
        probs = mx.softmax(project(self.gate, x, n_main).astype(mx.float32), axis=-1)
        experts = mx.stop_gradient(mx.argpartition(-probs, kth=self.top_k - 1, axis=-1)[..., : self.top_k])
        weights = mx.take_along_axis(probs, experts, axis=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(axis=-1, keepdims=True)
        out = self.switch_mlp(x, experts)
        if self.weights_in_float32:  # each expert's share in float32, then in the model's dtype
            return (out * weights[..., None]).astype(out.dtype).sum(axis=-2)
        return (out * weights.astype(out.dtype)[..., None]).sum(axis=-2)


ROUTER_QUANTIZATION = {"group_size": 64, "bits": 8}  # mlx-lm's: the router picks the experts


def router_quantization(model: nn.Module) -> dict[str, dict | bool]:
    """Each router's quantization, by module path, whatever bits the rest of ``model`` is quantized
    to: :data:`ROUTER_QUANTIZATION`, as mlx-lm quantizes Qwen3-MoE's, or float (``False``) where
    the hidden size does not divide into its groups."""
    return {f"{path}.gate": ROUTER_QUANTIZATION
            if m.gate.weight.shape[-1] % ROUTER_QUANTIZATION["group_size"] == 0 else False
            for path, m in model.named_modules() if isinstance(m, SparseMoE)}


def stack_experts(weights: dict[str, mx.array], n_experts: int, layers: int, prefix: str,
                  names: dict[str, str]) -> dict[str, mx.array]:
    """A Hugging Face checkpoint's per-expert weights (``{prefix}.experts.{e}.{name}.weight``, for
    each layer's ``prefix`` with ``{i}`` in it) stacked into :class:`Experts`' (``names``: theirs ->
    ours); an mlx-lm directory's, stacked already, are left as they are."""
    out = dict(weights)
    for i in range(layers):
        at = prefix.format(i=i)
        for theirs, ours in names.items():
            keys = [f"{at}.experts.{e}.{theirs}.weight" for e in range(n_experts)]
            if all(k in out for k in keys):  # (some missing: loading says which of ours is)
                out[f"{at}.switch_mlp.{ours}.weight"] = mx.stack([out.pop(k) for k in keys])
    return out
