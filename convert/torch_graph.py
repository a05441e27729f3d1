"""The Speculative Streaming step as a PyTorch graph, built from an MLX model's own weights.

This is what coremltools converts (torch is needed at export time only). One module,
:class:`SpecStreamGraph`, holds the weights, the rotary tables and the main stream's KV cache as
registered buffers (Core ML states) and computes two functions, selected by ``mode`` before
tracing:

``prefill(tokens[C], start[1], length[1])``
    A chunk of prompt tokens at positions ``start..start+C-1`` (the first ``length`` are real):
    causal attention over the cache, main-stream K/V written at slots ``start..``. No streams:
    the last prompt token goes through ``step`` as a one-node tree, which gives the first root
    and the first draft exactly as the MLX engine's prefill does (its streams sit on the last
    prompt token only; earlier prompt rows never see streams). Output: the main stream's top
    token after the last real token.

``step(tokens[T], positions[T], tree_mask[T,T], valid[T], accepted[A], n_accepted[1])``
    First commits the previous step's accepted path (``accepted[:n_accepted]``, node indices of
    the previous tree) by compaction: K/V rows ``prev + accepted[i]`` move to ``prev + i``
    (``prev = positions[0] - n_accepted``) in every layer. Then runs a fixed-size flattened tree
    (node 0 is the root at position ``n = positions[0]``; ``tree_mask[v, u]`` = u is v or an
    ancestor of v; ``valid`` masks padding nodes) as in docs/design.md#decode-step with streams on every node
    (the engine's ``streams="tree"`` policy): tree-masked layers, optional early-exit pruning
    (``node_kept``), gamma streams per node in the top ``msa_layers`` layers, heads. Nodes are
    kept in place: the tree's main K/V is written at slots ``n..n+T-1``; the next call's commit
    keeps the accepted ones.

Rotary embeddings gather cos/sin from tables computed by MLX itself (fp16 arithmetic on positions
drifts); all attention is explicit matmul + masked softmax over the whole cache (fixed shapes).

Each layer is read off the MLX block (:meth:`SpecStreamGraph._read_block`): its projections and
norms, q/k norms (Qwen3, Gemma 3), its rotary table or none (SmolLM3's NoPE layers), its scale,
score soft-cap (Gemma 2) and sliding window (Gemma 2 and 3: the window applies to main and stream
rows by key position, as ``arch.base.window_mask`` does). Gemma's ``1 + w`` norms are exported as
their effective weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from .. import layout
from ..errors import UnsupportedModelError

LLAMA_FAMILY = ("llama", "mistral", "qwen2", "phi3", "qwen3", "smollm3")
GEMMA_FAMILY = ("gemma", "gemma2", "gemma3_text")
EXPORTABLE = (*LLAMA_FAMILY, *GEMMA_FAMILY)


@dataclass
class QuantizedWeight:
    """MLX's affine group-wise quantization of one weight: ``w = scales * q + biases`` per group."""

    q: np.ndarray  # (out, in) uint8, values in [0, 2**bits)
    scales: np.ndarray  # (out, in // group_size)
    biases: np.ndarray  # (out, in // group_size)
    bits: int
    group_size: int

    def dequantize(self) -> np.ndarray:
        s = np.repeat(self.scales.astype(np.float32), self.group_size, axis=1)
        b = np.repeat(self.biases.astype(np.float32), self.group_size, axis=1)
        return s * self.q.astype(np.float32) + b


@dataclass
class Linear:
    weight: np.ndarray  # (out, in) float32 (dequantized when quantized)
    bias: np.ndarray | None = None
    quant: QuantizedWeight | None = None
    lora: tuple[np.ndarray, np.ndarray, float, bool] | None = None  # (a, b, scale, streams_only)


@dataclass
class GraphConfig:
    """Everything about the model and the package's fixed shapes that the graph needs."""

    hidden: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    n_layers: int
    vocab: int
    eps: float
    act: str
    rope_dims: int
    context: int
    tree_size: int
    chunk: int
    gamma: int = 0
    branch: int = 1
    msa_layers: int = 0
    prune_layer: int = 0
    prune_threshold: float = 0.0
    shared: bool = False
    sampling: bool = False  # also output full main/stream logits (sampling needs them)
    embed_scale: float = 1.0  # Gemma: embeddings times sqrt(hidden)
    logit_softcap: float | None = None  # Gemma: logits -> tanh(logits / cap) * cap

    @property
    def accept_max(self) -> int:
        """Longest accepted path: root plus one node per stream level (and within the tree); a
        plain model's drafts are prompt-lookup chains, as deep as its tree."""
        return min(self.tree_size, self.gamma + 1) if self.gamma else self.tree_size


def _np(a) -> np.ndarray:
    import mlx.core as mx

    if a.dtype == mx.bfloat16:
        a = a.astype(mx.float32)
    return np.array(a)


def check_exportable(layer) -> None:
    """An UnsupportedModelError unless Core ML can carry ``layer``: a quantized layer affine, 4 or
    8 bits (an mlx-lm mixed-bit model may hold 6-bit layers); no fine-tune left under an
    adapter's LoRA (a tuned or split shared adapter's, which ``fuse`` folds into float weights only)."""
    from ..lora import LoRALinear

    if isinstance(layer, LoRALinear) and isinstance(layer.base, LoRALinear):
        raise UnsupportedModelError("an adapter with a fine-tune under its streams (a tuned or split "
                                    "shared adapter) must have it folded into float weights before "
                                    "export: export from the float model, with --q-bits to quantize")
    if getattr(layer, "bits", None) is None:
        return
    mode = getattr(layer, "mode", "affine")
    if mode != "affine":
        raise UnsupportedModelError(f"quantization mode '{mode}' cannot be exported (supported: affine)")
    if layer.bits not in (4, 8):
        raise UnsupportedModelError(f"{layer.bits}-bit weights cannot be exported (supported: 4, 8)")


def unpack_quantized(layer) -> QuantizedWeight:
    """The integer values, scales and biases of an MLX QuantizedLinear/QuantizedEmbedding."""
    check_exportable(layer)
    bits, gs = layer.bits, layer.group_size
    packed = _np(layer.weight).view(np.uint32)
    per = 32 // bits
    shifts = (bits * np.arange(per, dtype=np.uint32))
    q = ((packed[..., None] >> shifts) & np.uint32(2**bits - 1)).astype(np.uint8)
    q = q.reshape(packed.shape[0], packed.shape[1] * per)
    return QuantizedWeight(q, _np(layer.scales), _np(layer.biases), bits, gs)


def _norm_weight(norm) -> np.ndarray:
    """The effective weight of an RMS norm (Gemma's stores ``w - 1``)."""
    import mlx.core as mx

    from ..arch import gemma

    w = 1.0 + norm.weight.astype(mx.float32) if isinstance(norm, gemma.RMSNorm) else norm.weight
    return _np(w)


def _linear(layer) -> Linear:
    import mlx.nn as nn

    from ..lora import LoRALinear

    check_exportable(layer)  # a fine-tune folded into the weights (load_for_export checks first)
    lora = None
    if isinstance(layer, LoRALinear):
        lora = (_np(layer.lora_a).astype(np.float32), _np(layer.lora_b).astype(np.float32),
                float(layer.scale), bool(layer.streams_only))
        layer = layer.base
    bias = _np(layer.bias).astype(np.float32) if "bias" in layer else None
    if isinstance(layer, (nn.QuantizedLinear, nn.QuantizedEmbedding)):
        qw = unpack_quantized(layer)
        return Linear(qw.dequantize(), bias, qw, lora)
    if isinstance(layer, (nn.Linear, nn.Embedding)):
        return Linear(_np(layer.weight).astype(np.float32), bias, None, lora)
    raise UnsupportedModelError(f"cannot export a layer of type {type(layer).__name__}")


def graph_config(model, context: int, tree_size: int, chunk: int, sampling: bool = False,
                 branch: int | None = None, prune_threshold: float | None = None) -> GraphConfig:
    """Read the model (and its attached adapter) into a :class:`GraphConfig`; checks the family."""
    from ..arch import gemma, llama

    cfg = model.config
    mt = cfg.get("model_type")
    if not isinstance(model, (llama.Model, gemma.Model)) or mt not in EXPORTABLE:
        raise UnsupportedModelError(f"Core ML export supports the llama family ({', '.join(LLAMA_FAMILY)}) "
                                    f"and the Gemma family ({', '.join(GEMMA_FAMILY)}), not '{mt}'")
    attn = model.layers[0].self_attn
    ropes = [layer.self_attn.rope for layer in model.layers if layer.self_attn.rope is not None]
    act = model.args.hidden_act
    if act not in ACTS:
        raise UnsupportedModelError(f"activation '{act}' cannot be exported (supported: {', '.join(ACTS)})")
    acfg = getattr(model, "adapter_config", None)
    if acfg is not None and acfg.mode not in ("lossless", "shared"):
        raise UnsupportedModelError(
            f"adapter mode '{acfg.mode}' has no speculative streams (export a lossless or shared adapter)")
    g = GraphConfig(
        hidden=cfg["hidden_size"], n_heads=attn.n_heads, n_kv_heads=attn.n_kv_heads,
        head_dim=attn.head_dim, n_layers=len(model.layers), vocab=cfg["vocab_size"],
        eps=float(model.model.norm.eps), act=act, rope_dims=ropes[0].dims if ropes else 0, context=context,
        tree_size=tree_size, chunk=chunk, sampling=sampling)
    if isinstance(model, gemma.Model):
        g.embed_scale = float(model.embed_scale)
        g.logit_softcap = getattr(model.args, "final_logit_softcapping", None)
    if acfg is not None:
        g.gamma, g.msa_layers = acfg.gamma, acfg.msa_layers
        g.branch = branch or acfg.branch
        g.prune_layer = acfg.prune_layer if acfg.prune_layer is not None else g.n_layers - g.msa_layers
        g.prune_threshold = acfg.prune_threshold if prune_threshold is None else prune_threshold
        g.shared = acfg.mode == "shared"
    else:
        g.branch = branch or 1
    g.branch = min(g.branch, g.vocab)
    return g


ACTS = {
    "silu": F.silu,
    "swish": F.silu,
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_fast": lambda x: F.gelu(x, approximate="tanh"),
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),
}


MASKED = 30000.0  # fits fp16; exp(-MASKED) is 0 in fp16 and fp32, as MLX's -inf mask


def additive(mask: torch.Tensor) -> torch.Tensor:
    """Boolean visibility -> additive mask (0 / -MASKED), computed once per call from inputs.

    (A ``where(mask, scores, -inf)`` per layer makes coremltools fold a broadcast -inf constant
    of the full score shape into the package, megabytes per layer.)
    """
    return (mask.to(torch.float32) - 1.0) * MASKED


class SpecStreamGraph(torch.nn.Module):
    """Prefill and tree step of an MLX llama-family model (+ adapter) as one torch module.

    ``cache_dtype`` float16 for export (Core ML states must be fp16); float32 for parity tests.
    Set ``mode`` to "prefill" or "step" before tracing; :meth:`example_inputs` gives inputs.
    """

    def __init__(self, model, gc: GraphConfig, cache_dtype=torch.float16):
        import mlx.core as mx

        super().__init__()
        self.gc = gc
        self.mode = "step"
        layers = model.layers
        self.embed = _linear(model.model.embed_tokens)
        self.tied = bool(getattr(model, "tied", False))
        self.lm_head = self.embed if self.tied else _linear(model.lm_head)
        self.linears: dict[str, Linear] = {"embed_tokens": self.embed, "lm_head": self.lm_head}
        self.params = torch.nn.ParameterDict()
        self._register("embed_tokens", self.embed)
        if not self.tied:
            self._register("lm_head", self.lm_head)
        self.norm_w = self._param("norm", _norm_weight(model.model.norm))
        # Rotary tables, computed by MLX exactly as the model computes its angles: one per
        # distinct rotary embedding (Gemma: local and global), shared by the layers that use it.
        self.rope_tables: dict[int, tuple[str, str]] = {}
        n_pos = table_size(gc)
        for blk in layers:
            rope = blk.self_attn.rope
            if rope is None or id(rope) in self.rope_tables:
                continue
            names = (f"rope_cos_{len(self.rope_tables)}", f"rope_sin_{len(self.rope_tables)}")
            ang = mx.arange(n_pos).astype(mx.float32)[:, None] * rope.inv_freq[None, :]
            self.register_buffer(names[0], torch.from_numpy(_np(mx.cos(ang) * rope.attention_factor)))
            self.register_buffer(names[1], torch.from_numpy(_np(mx.sin(ang) * rope.attention_factor)))
            self.rope_tables[id(rope)] = names
        self.blocks = [self._read_block(i, blk) for i, blk in enumerate(layers)]
        self.windows = sorted({b["window"] for b in self.blocks if b["window"] is not None})
        self.act = ACTS[gc.act]
        adapter = getattr(model, "adapter", None)
        if gc.gamma:
            self.stream_embed = self._param("stream_embed", _np(adapter.stream_embed)[: gc.gamma])
            self.init_lora = None
            if "init_a" in adapter:
                self.init_lora = (self._param("init_a", _np(adapter.init_a)),
                                  self._param("init_b", _np(adapter.init_b)))
            self.prune_a = self._param("prune_a", _np(adapter.prune_a))
            self.prune_b = self._param("prune_b", _np(adapter.prune_b))
        shape = (gc.n_layers, gc.n_kv_heads, gc.context, gc.head_dim)
        self.register_buffer("k_cache", torch.zeros(shape, dtype=cache_dtype))
        self.register_buffer("v_cache", torch.zeros(shape, dtype=cache_dtype))

    # -- parameters --------------------------------------------------------------------------
    def _read_block(self, i: int, blk) -> dict:
        """Layer ``i`` of the MLX model: names of its linears, its norm weights, rotary table,
        scale and window. Norms: ``ln1`` before attention, ``ln2`` before the MLP; ``attn_out``
        / ``mlp_out`` (Gemma) on the outputs of attention / MLP, before the residual add."""
        attn = blk.self_attn
        b = {"rope": self.rope_tables.get(id(attn.rope)), "scale": float(attn.scale), "window": attn.window,
             "softcap": attn.softcap}
        for parent, names in ((attn, ("q_proj", "k_proj", "v_proj", "o_proj")),
                              (blk.mlp, ("gate_proj", "up_proj", "down_proj"))):
            for name in names:
                b[name] = f"l{i}.{name}"
                self.linears[b[name]] = _linear(getattr(parent, name))
                self._register(b[name], self.linears[b[name]])
        norms = {"ln1": "input_layernorm", "q_norm": "self_attn.q_norm", "k_norm": "self_attn.k_norm"}
        if "pre_feedforward_layernorm" in blk:
            norms.update(attn_out="post_attention_layernorm", ln2="pre_feedforward_layernorm",
                         mlp_out="post_feedforward_layernorm")
        else:
            norms["ln2"] = "post_attention_layernorm"
        for key, path in norms.items():
            module = blk
            for part in path.split("."):
                module = module.get(part) if module is not None else None
            b[key] = self._param(f"l{i}.{key}", _norm_weight(module)) if module is not None else None
        return b

    def _param(self, name: str, value: np.ndarray) -> torch.nn.Parameter:
        p = torch.nn.Parameter(torch.from_numpy(np.ascontiguousarray(value, dtype=np.float32)),
                               requires_grad=False)
        self.params[name.replace(".", "_")] = p
        return p

    def _register(self, name: str, lin: Linear) -> None:
        lin.t_weight = self._param(name + ".weight", lin.weight)
        lin.t_bias = self._param(name + ".bias", lin.bias) if lin.bias is not None else None
        if lin.lora is not None:
            a, b, scale, streams_only = lin.lora
            lin.t_lora = (self._param(name + ".lora_a", a), self._param(name + ".lora_b", b), scale,
                          streams_only)

    def quantized_weights(self) -> list[QuantizedWeight]:
        """The quantized weights, each once (a tied head shares the embedding's)."""
        seen, out = set(), []
        for lin in self.linears.values():
            if lin.quant is not None and id(lin.quant) not in seen:
                seen.add(id(lin.quant))
                out.append(lin.quant)
        return out

    # -- building blocks ---------------------------------------------------------------------
    def reset_cache(self) -> None:
        self.k_cache.zero_()
        self.v_cache.zero_()

    def _lin(self, name: str, x: torch.Tensor, n_main: int | None) -> torch.Tensor:
        lin = self.linears[name]
        y = F.linear(x, lin.t_weight, lin.t_bias)
        if lin.lora is None:
            return y
        a, b, scale, streams_only = lin.t_lora
        if streams_only:
            if n_main is None or n_main >= x.shape[0]:
                return y
            delta = ((x[n_main:] @ a) @ b) * scale
            return torch.cat([y[:n_main], y[n_main:] + delta], dim=0)
        return y + ((x @ a) @ b) * scale

    def _norm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """RMS norm, computed on x divided by its largest magnitude (the norm does not change):
        in a float16 package the squares of the residual stream itself overflow (a value of 384
        squares to 147,456 > 65,504), the squares of x / max|x| never do."""
        s = x.abs().amax(-1, keepdim=True).clamp_min(1e-4)
        y = x / s
        return y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.gc.eps / s / s) * w

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # x: (H, R, D); cos/sin: (R, dims/2)
        d = self.gc.rope_dims
        half = d // 2
        rot, rest = x[..., :d], x[..., d:]
        x1, x2 = rot[..., :half], rot[..., half:]
        c = torch.cat([cos, cos], dim=-1)
        s = torch.cat([sin, sin], dim=-1)
        out = rot * c + torch.cat([-x2, x1], dim=-1) * s
        return torch.cat([out, rest], dim=-1) if d < self.gc.head_dim else out

    def head(self, h: torch.Tensor) -> torch.Tensor:
        h = self._norm(h, self.norm_w)
        logits = F.linear(h, self.lm_head.t_weight)
        cap = self.gc.logit_softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def _embed(self, tokens: torch.Tensor) -> torch.Tensor:
        h = F.embedding(tokens, self.embed.t_weight)
        return h * self.gc.embed_scale if self.gc.embed_scale != 1.0 else h

    def _tables(self, pos: torch.Tensor) -> dict:
        """cos/sin rows of each rotary table at ``pos``."""
        return {names: (getattr(self, names[0])[pos], getattr(self, names[1])[pos])
                for names in self.rope_tables.values()}

    def _biases(self, visible: torch.Tensor, qpos: torch.Tensor, kpos: torch.Tensor) -> dict:
        """Additive masks by window (None: no window) from boolean ``visible`` (R, S): a window
        also hides keys at ``window`` or more positions behind the row (``kpos`` per key)."""
        out = {None: additive(visible)}
        for w in self.windows:
            out[w] = additive(torch.logical_and(visible, (qpos[:, None] - kpos[None, :]) < w))
        return out

    def _layer(self, i: int, x, tables, biases, start, n_main: int) -> torch.Tensor:
        """One block. Rows [0, n_main) are main rows (K/V written to the cache at ``start``),
        the rest stream rows (attended, never cached). ``tables``: :meth:`_tables` of the rows;
        ``biases``: :meth:`_biases`, additive (R, context + R - n_main)."""
        gc, b = self.gc, self.blocks[i]
        R = x.shape[0]
        h = self._norm(x, b["ln1"])
        q = self._lin(b["q_proj"], h, n_main).reshape(R, gc.n_heads, gc.head_dim)
        k = self._lin(b["k_proj"], h, n_main).reshape(R, gc.n_kv_heads, gc.head_dim)
        if b["q_norm"] is not None:
            q, k = self._norm(q, b["q_norm"]), self._norm(k, b["k_norm"])
        q, k = q.transpose(0, 1), k.transpose(0, 1)
        v = self._lin(b["v_proj"], h, n_main).reshape(R, gc.n_kv_heads, gc.head_dim).transpose(0, 1)
        if b["rope"] is not None:
            cos, sin = tables[b["rope"]]
            q, k = self._rope(q, cos, sin), self._rope(k, cos, sin)
        dt = self.k_cache.dtype
        self.k_cache[i, :, start:start + n_main] = k[:, :n_main].to(dt)
        self.v_cache[i, :, start:start + n_main] = v[:, :n_main].to(dt)
        keys = self.k_cache[i].to(x.dtype)
        values = self.v_cache[i].to(x.dtype)
        if n_main < R:
            keys = torch.cat([keys, k[:, n_main:]], dim=1)
            values = torch.cat([values, v[:, n_main:]], dim=1)
        rep = gc.n_heads // gc.n_kv_heads
        qg = q.reshape(gc.n_kv_heads, rep * R, gc.head_dim)
        scores = (qg @ keys.transpose(1, 2)) * b["scale"]
        if b["softcap"] is not None:
            scores = torch.tanh(scores / b["softcap"]) * b["softcap"]
        scores = scores.reshape(gc.n_kv_heads, rep, R, -1)
        scores = scores + biases[b["window"]]  # additive: 0 where visible, -MASKED elsewhere
        p = torch.softmax(scores, dim=-1).reshape(gc.n_kv_heads, rep * R, -1)
        o = (p @ values).reshape(gc.n_heads, R, gc.head_dim).transpose(0, 1).reshape(R, -1)
        o = self._lin(b["o_proj"], o, n_main)
        h = x + (self._norm(o, b["attn_out"]) if b.get("attn_out") is not None else o)
        m = self._norm(h, b["ln2"])
        g = self.act(self._lin(b["gate_proj"], m, n_main)) * self._lin(b["up_proj"], m, n_main)
        d = self._lin(b["down_proj"], g, n_main)
        return h + (self._norm(d, b["mlp_out"]) if b.get("mlp_out") is not None else d)

    # -- the two functions -------------------------------------------------------------------
    def forward(self, *args):
        return self.prefill(*args) if self.mode == "prefill" else self.step(*args)

    def prefill(self, tokens: torch.Tensor, start: torch.Tensor, length: torch.Tensor):
        gc = self.gc
        n = tokens.shape[0]
        pos = start + torch.arange(n, dtype=torch.int32)
        slots = torch.arange(gc.context, dtype=torch.int32)  # prefill: a slot holds its position
        biases = self._biases(slots[None, :] <= pos[:, None], pos, slots)
        tables = self._tables(pos)
        h = self._embed(tokens)
        for i in range(gc.n_layers):
            h = self._layer(i, h, tables, biases, start, n)
        last = torch.index_select(h, 0, (length - 1).clamp(0, n - 1))
        logits = self.head(last)
        top = torch.argmax(logits, dim=-1).to(torch.int32)
        return (top, logits) if gc.sampling else (top,)

    def _commit(self, prev: torch.Tensor, accepted: torch.Tensor) -> None:
        gc = self.gc
        idx = (prev + accepted).clamp(0, gc.context - 1)
        a = accepted.shape[0]
        for cache in (self.k_cache, self.v_cache):
            rows = torch.index_select(cache, 2, idx)
            cache[:, :, prev:prev + a] = rows

    def step(self, tokens, positions, tree_mask, valid, accepted, n_accepted):
        gc = self.gc
        T, C, G = gc.tree_size, gc.context, gc.gamma
        n = positions[0:1]
        self._commit(n - n_accepted, accepted)

        eye = torch.eye(T, dtype=torch.bool)
        anc = torch.logical_or(torch.logical_and(tree_mask > 0, valid[None, :] > 0), eye)  # (T, T)
        rel = torch.arange(C, dtype=torch.int32) - n  # (C,)
        in_tree = torch.logical_and(rel >= 0, rel < T)
        cols = torch.index_select(anc.to(torch.int32), 1, rel.clamp(0, T - 1)) > 0  # (T, C)
        cmask = torch.logical_or((rel < 0)[None, :], torch.logical_and(in_tree[None, :], cols))
        # key positions of the cache slots: committed slots hold their position, tree slots
        # their node's (a window compares them with the row's position)
        kpos = torch.where(in_tree, torch.index_select(positions, 0, rel.clamp(0, T - 1)),
                           torch.arange(C, dtype=torch.int32))
        tables = self._tables(positions)
        cbias = self._biases(cmask, positions, kpos)

        h = self._embed(tokens)
        kept = valid > 0
        msa_start = gc.n_layers - gc.msa_layers if G else gc.n_layers
        for i in range(msa_start):
            if G and i == gc.prune_layer and gc.prune_threshold > 0 and T > 1:
                kept = self._prune(h, tokens, positions - n, anc, eye, kept)
            h = self._layer(i, h, tables, cbias, n, T)
        if G and gc.prune_layer >= msa_start and gc.prune_threshold > 0 and T > 1:
            kept = self._prune(h, tokens, positions - n, anc, eye, kept)
        outputs = {}
        if G:
            s = h
            if self.init_lora is not None:
                s = s + (s @ self.init_lora[0]) @ self.init_lora[1]
            s = (s[:, None, :] + self.stream_embed[None, :, :]).reshape(T * G, gc.hidden)
            h = torch.cat([h, s], dim=0)
            allpos = self._pass_positions(positions)
            spos = allpos[T:]
            tables = self._tables(allpos)
            biases = self._biases(self._stream_mask(cmask), allpos, torch.cat([kpos, spos]))
            for i in range(msa_start, gc.n_layers):
                h = self._layer(i, h, tables, biases, n, T)
            logits = self.head(h)
            main, streams = logits[:T], logits[T:]
            logp = torch.log_softmax(streams, dim=-1)
            vals, ids = torch.topk(logp, gc.branch, dim=-1)
            outputs["stream_tokens"] = ids.to(torch.int32).reshape(T, G, gc.branch)
            outputs["stream_logprobs"] = vals.reshape(T, G, gc.branch)
            if gc.sampling:
                outputs["stream_logits"] = streams.reshape(T, G, gc.vocab)
        else:
            for i in range(msa_start, gc.n_layers):
                h = self._layer(i, h, tables, cbias, n, T)
            main = self.head(h)
        outputs["main_token"] = torch.argmax(main, dim=-1).to(torch.int32)
        outputs["node_kept"] = kept.to(torch.int32)
        if gc.sampling:
            outputs["main_logits"] = main
        return tuple(outputs[k] for k in step_output_names(gc))

    def _rows(self) -> np.ndarray:
        """``layout.rows`` of the step: streams on every one of the T nodes."""
        gc = self.gc
        return layout.rows(gc.tree_size, np.arange(gc.tree_size), gc.gamma, own=gc.shared)

    def _pass_positions(self, positions: torch.Tensor) -> torch.Tensor:
        """Positions of main and stream rows (``layout.pass_positions``): the row's node's plus
        how far ahead it sits."""
        r = self._rows()
        node = torch.from_numpy(r[:, layout.NODE].astype(np.int32))
        return torch.index_select(positions, 0, node) + torch.from_numpy(r[:, layout.AHEAD].astype(np.int32))

    def _stream_mask(self, cmask: torch.Tensor) -> torch.Tensor:
        """``layout.pass_mask`` with the main keys of each node given by ``cmask`` (T, context)."""
        gc = self.gc
        r = self._rows()
        node = torch.from_numpy(r[:, layout.NODE].astype(np.int32))
        main = torch.index_select(cmask.to(torch.int32), 0, node) > 0
        streams = torch.from_numpy(layout.range_mask(r[:, layout.LO:], gc.tree_size * gc.gamma))
        return torch.cat([main, streams], dim=1)

    def _prune(self, h, tokens, depth, anc, eye, kept):
        """Early-exit pruning (docs/design.md#pruning) without dynamic shapes: a node is kept when
        it is valid and neither it nor an ancestor has a transition probability below the
        threshold. Its parent is its deepest strict ancestor."""
        gc = self.gc
        ee = h + (h @ self.prune_a) @ self.prune_b
        logp = torch.log_softmax(self.head(ee), dim=-1)  # (T, V)
        strict = torch.logical_and(anc, torch.logical_not(eye))
        score = strict.to(torch.int32) * (depth[None, :] + 1)
        parent = torch.argmax(score, dim=1)  # root: 0 (unused)
        tok_lp = torch.index_select(logp, 1, tokens)  # [u, v] = log p_u(token_v)
        trans = torch.gather(tok_lp, 0, parent[None, :])[0]
        bad = torch.logical_and(torch.exp(trans) < gc.prune_threshold, depth > 0)
        hit = torch.logical_and(anc, bad[None, :]).any(dim=1)
        return torch.logical_and(kept, torch.logical_not(hit))

    # -- inputs and outputs --------------------------------------------------------------------
    def example_inputs(self, mode: str | None = None):
        gc = self.gc
        mode = mode or self.mode
        i32 = torch.int32
        if mode == "prefill":
            return (torch.zeros(gc.chunk, dtype=i32), torch.zeros(1, dtype=i32),
                    torch.ones(1, dtype=i32))
        T = gc.tree_size
        return (torch.zeros(T, dtype=i32), torch.zeros(T, dtype=i32),
                torch.from_numpy(np.tril(np.ones((T, T), np.int32))), torch.ones(T, dtype=i32),
                torch.zeros(gc.accept_max, dtype=i32), torch.zeros(1, dtype=i32))


PREFILL_INPUTS = ("tokens", "start", "length")
STEP_INPUTS = ("tokens", "positions", "tree_mask", "valid", "accepted", "n_accepted")


def prefill_output_names(gc: GraphConfig) -> tuple[str, ...]:
    return ("main_token", "main_logits") if gc.sampling else ("main_token",)


def step_output_names(gc: GraphConfig) -> tuple[str, ...]:
    names = ["main_token", "node_kept"]
    if gc.gamma:
        names += ["stream_tokens", "stream_logprobs"]
    if gc.sampling:
        names += ["main_logits"] + (["stream_logits"] if gc.gamma else [])
    return tuple(names)


def full_tree_size(gamma: int, branch: int) -> int:
    return 1 + sum(branch**g for g in range(1, gamma + 1))


def table_size(gc: GraphConfig) -> int:
    """Positions the rotary tables cover: the context and γ + 1 more."""
    return gc.context + gc.gamma + 1


__all__ = ["GraphConfig", "Linear", "QuantizedWeight", "SpecStreamGraph", "full_tree_size",
           "graph_config", "prefill_output_names", "step_output_names"]
