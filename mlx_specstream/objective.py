"""The training objective: the losses of every mode and of the pruning adapter, the training
passes they are computed on, one gradient step, and the validation metrics that choose the
adapter kept.

Losses (extended paper, eq. 6). Token ``t`` of a sequence carries the main stream, which predicts
token ``t+1``, and streams ``j = 1..gamma``; stream ``j`` predicts token ``t+j+1``. Only positions
whose main target is a completion token carry streams (the last prompt token and the completion
tokens but the last), which is also where the engine runs them: a prefill puts streams on the
last prompt token only, every later token gets them. The loss is

    alpha_0 * CE(main) + sum_j alpha_j * CE(stream j) + prune_weight * CE(early exit)

each CE averaged over its valid positions in the global batch. Lossless mode: the base is frozen
and alpha_0 = 0; only the stream parameters train (stream embeddings P, the optional stream init
f, the stream-only LoRA of the MSA layers) and main rows never see streams, so greedy decoding
stays the base model's. Shared mode: LoRA in every layer (all rows) plus the streams; main rows
in MSA layers also see the streams of their own token; alpha_0 = 1 and alpha_j = 0.1 by default.
The pruning adapter o_theta learns next-token prediction from early-exit logits
``H(o_theta(h_l))`` at the pruning layer, jointly, on detached hidden states (so it never moves
the rest of the adapter).

Memory (extended paper, appendix I, "segment attention"). Prompts carry no streams. In lossless
mode the main stream is the frozen base, so one pass without gradients computes the hidden states
entering the MSA layers and the main keys/values of every MSA layer; the stream rows are then
built ``segment_len`` completion positions at a time, each segment attending to the cached main
keys and its own streams (only the stream rows with a target in some row of the batch:
``Batch.stream_rows``), and the gradients of the segments are summed. Peak memory grows with
``segment_len * gamma`` instead of ``seq_len * gamma``. In shared mode main rows depend on the
streams, so the whole sequence (streams on completion positions only) runs in one pass. The
``lora`` mode is the next-token baseline the benchmark compares against: shared-mode LoRA trained
on the main loss alone, no streams."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_map

from . import layout
from .arch.base import causal_mask
from .base_states import FixedKV, base_states, msa_start
from .data import Dataset
from .kernels import host_math
from .train_batches import Batch, segments

if TYPE_CHECKING:
    from .trainer import TrainConfig


# -- training passes --------------------------------------------------------------------------


def _rows(x: mx.array, t: np.ndarray) -> mx.array:
    """Rows of ``x`` (B, T, ...) at positions ``t`` (B, L), clipped to the sequence."""
    idx = np.minimum(t, x.shape[1] - 1).astype(np.int32)
    return mx.take_along_axis(x, mx.array(idx).reshape(*idx.shape, *([1] * (x.ndim - 2))), axis=1)


def segment_layout(t: np.ndarray, gamma: int, n_keys: int, rows: np.ndarray | None = None
                   ) -> tuple[mx.array, mx.array]:
    """Rotary positions (B, C) and mask (B, 1, C, n_keys + C) of the stream rows of positions ``t``
    (B, L), node-major (``layout.pass_mask`` without main rows, main keys by position): all
    ``C = L*gamma`` of them, or the node-major indices ``rows`` (closed under the stream keys a
    row sees: ``Batch.stream_rows``), which are then also the stream keys.

    Row (t, j) sees the main keys 0..t and streams (t, 1..j); keys are
    ``[main 0..n_keys-1 | streams]``. Example, t = [[2, 3]], gamma = 2: rows (2,1) (2,2) (3,1)
    (3,2) at positions 3 4 4 5; row (3,2) sees main keys 0..3 and the streams (3,1) (3,2).
    """
    mask = layout.pass_mask(layout.keys_by_position(t, n_keys), np.arange(t.shape[1]), gamma, main_rows=False)
    pos = layout.stream_positions(t, gamma)
    if rows is not None:
        pos, mask = pos[:, rows], mask[:, rows][..., np.concatenate([np.arange(n_keys), n_keys + rows])]
    return mx.array(pos.astype(np.int32)), mx.array(mask[:, None])


def stream_hidden_segment(model, h_msa: mx.array, kvs, t: np.ndarray, gamma: int,
                          rows: np.ndarray | None = None) -> mx.array:
    """Lossless mode: final stream hidden states (B, L, gamma, h) of positions ``t`` (B, L); with
    ``rows`` (``Batch.stream_rows``) only those are computed and the others are zero."""
    B, L = t.shape
    s = model.adapter.init_streams(_rows(h_msa, t), gamma)
    n_keys = min(int(t.max()) + 1, h_msa.shape[1])
    pos, mask = segment_layout(t, gamma, n_keys, rows)
    if rows is not None:
        if not len(rows):
            return mx.zeros((B, L, gamma, s.shape[-1]), s.dtype)
        idx = mx.array(rows.astype(np.int32))
        s = s[:, idx]
    for layer, (k, v) in zip(model.layers[msa_start(model):], kvs):
        s = layer(s, pos, mask, FixedKV(k[:, :, :n_keys], v[:, :, :n_keys]), n_main=0)
    if rows is not None:
        s = mx.zeros((B, L * gamma, s.shape[-1]), s.dtype).at[:, idx].add(s)
    return s.reshape(B, L, gamma, -1)


def shared_layout(batch: Batch, gamma: int) -> tuple[mx.array, mx.array]:
    """Positions and per-row mask (B, 1, R, R) of a shared-mode pass: T main rows, then the
    streams of positions ``[w0, w1)`` node-major (``layout.pass_mask``, main keys by position).
    Main row t sees its own streams only where the row's prompt has ended (t >= n_prompt - 1), as
    at generation time."""
    B, T = batch.tokens.shape
    w0, w1 = batch.window
    t = np.arange(T)
    own = t[None, :] >= batch.n_prompt[:, None] - 1  # (B, T)
    sees = layout.keys_by_position(np.broadcast_to(t, (B, T)), T)  # (B, T, T): causal
    mask = layout.pass_mask(sees, np.arange(w0, w1), gamma, own=own)
    pos = layout.pass_positions(t, np.arange(w0, w1), gamma)
    return mx.array(pos.astype(np.int32)), mx.array(mask[:, None])


def shared_hidden(model, batch: Batch, gamma: int) -> tuple[mx.array, mx.array | None, mx.array]:
    """Shared mode (with gradients): final main hidden states (B, W, h) and stream hidden states
    (B, W, gamma, h) of the window, and the detached hidden states entering the pruning layer."""
    cfg = model.adapter_config
    tokens = mx.array(batch.tokens)
    B, T = batch.tokens.shape
    w0, w1 = batch.window
    pos = mx.arange(T)
    mask = causal_mask(T, 0) if T > 1 else None
    msa = msa_start(model) if gamma else len(model.layers)  # gamma 0: the LoRA baseline
    h = model.embed(tokens, pos)
    h_prune = None
    for i, layer in enumerate(model.layers[:msa]):
        if i == cfg.prune_layer:
            h_prune = h
        h = layer(h, pos, mask, None)
    if h_prune is None:
        h_prune = h
    if gamma == 0:
        return h[:, w0:w1], None, mx.stop_gradient(h_prune[:, w0:w1])
    s = model.adapter.init_streams(h[:, w0:w1], gamma)
    x = mx.concatenate([h, s], axis=1)
    pos_all, mask_all = shared_layout(batch, gamma)
    for layer in model.layers[msa:]:
        x = layer(x, pos_all, mask_all, None, n_main=T)
    streams = x[:, T:].reshape(B, w1 - w0, gamma, -1)
    return x[:, w0:w1], streams, mx.stop_gradient(h_prune[:, w0:w1])


# -- losses and metrics ----------------------------------------------------------------------

def _segments_of(batch: Batch, tc: TrainConfig) -> list[tuple[int, int] | None]:
    """Lossless: the completion slots in segments; shared and LoRA: one pass (None)."""
    return segments(batch.span, tc.segment_len) if tc.mode == "lossless" else [None]


def _terms(model, batch: Batch, tc: TrainConfig, seg: tuple[int, int] | None, states=None):
    """``(t, main_h, stream_h, prune_h)`` of one segment: the positions (B, L), final hidden states
    of the main rows (None in lossless training), (B, L, gamma, h) of the stream rows, and the
    hidden states entering the pruning layer. Lossless: stream rows of completion slots
    ``[a, b)`` over the precomputed base ``states``, each row from its own last prompt token;
    shared: the whole window in one pass."""
    if seg is None:
        w0, w1 = batch.window
        t = np.broadcast_to(np.arange(w0, w1), (len(batch.tokens), w1 - w0))
        return (t, *shared_hidden(model, batch, tc.gamma))
    h_prune, h_msa, kvs = states[:3]
    t = batch.at(*seg)
    stream_h = stream_hidden_segment(model, h_msa, kvs, t, tc.gamma, batch.stream_rows(t, tc.gamma))
    return t, None, stream_h, _rows(h_prune, t)


def _take(x: mx.array, idx: np.ndarray) -> mx.array:
    return x.reshape(-1, x.shape[-1])[mx.array(idx.astype(np.int32))]


def _valid_logits(model, batch: Batch, t: np.ndarray, g: int, main_h, stream_h, prune_h) -> dict:
    """Logits and targets of the rows that have a target, only (the LM head and the softmax,
    the costly part over a large vocabulary, never run on the others): name -> (logits (n, V),
    targets (n,), stream index of each row (streams only))."""
    tm, ts, vm, vs = batch.targets(t, g)
    out = {}
    iv = np.flatnonzero(vs.reshape(-1))
    if len(iv):
        out["streams"] = (model.head(_take(stream_h, iv)), ts.reshape(-1)[iv], iv % g)
    im = np.flatnonzero(vm.reshape(-1))
    if len(im):
        out["prune"] = (model.head(model.adapter.early_exit(_take(prune_h, im))), tm.reshape(-1)[im])
        if main_h is not None:
            out["main"] = (model.head(_take(main_h, im)), tm.reshape(-1)[im])
    return out


def _weighted_loss(model, batch, t, main_h, stream_h, prune_h, tc: TrainConfig,
                   norms: np.ndarray) -> mx.array:
    """Sum of the weighted CE terms of one segment, each normalised by its global count."""
    alphas = np.asarray(tc.alphas, np.float64)
    inv = np.where(norms > 0, 1.0 / np.maximum(norms, 1), 0.0)
    if not (main_h is not None and alphas[0]):
        main_h = None
    terms = _valid_logits(model, batch, t, tc.gamma, main_h, stream_h, prune_h)
    loss = mx.array(0.0)
    if "streams" in terms:
        logits, tgt, j = terms["streams"]
        w = (alphas[1:] * inv[1:])[j].astype(np.float32)
        loss = loss + (host_math.cross_entropy(logits, mx.array(tgt)) * mx.array(w)).sum()
    if "prune" in terms and tc.prune_weight:
        logits, tgt = terms["prune"]
        loss = loss + host_math.cross_entropy(logits, mx.array(tgt)).sum() * float(tc.prune_weight * inv[0])
    if "main" in terms:
        logits, tgt = terms["main"]
        loss = loss + host_math.cross_entropy(logits, mx.array(tgt)).sum() * float(alphas[0] * inv[0])
    return loss


def _zeros_like_trainable(model):
    return tree_map(mx.zeros_like, model.trainable_parameters())


@host_math.enabled()
def grad_step(model, batch: Batch | None, tc: TrainConfig, norms: np.ndarray, states=None
              ) -> tuple[mx.array, dict]:
    """Loss (this process's share) and gradients of one (shard of a) global batch; lossless
    ``states``: the base's ``(h_prune, h_msa, kvs)`` of the batch when already known."""
    if batch is None:
        return mx.array(0.0), _zeros_like_trainable(model)
    if tc.mode == "lossless" and states is None:
        states = base_states(model, mx.array(batch.tokens))
    total, grads = mx.array(0.0), None
    for seg in _segments_of(batch, tc):
        def loss_fn(seg=seg):
            return _weighted_loss(model, batch, *_terms(model, batch, tc, seg, states), tc, norms)

        loss, g = nn.value_and_grad(model, loss_fn)()
        grads = g if grads is None else tree_map(mx.add, grads, g)
        total = total + loss
        mx.eval(total, grads)
    return total, grads


@host_math.enabled()
def evaluate(model, dataset: Dataset, tc: TrainConfig, batch_size: int | None = None,
             max_batches: int | None = None, group=None) -> dict:
    """Validation loss, per-stream top-1 accuracy (stream j predicting token t+j+1), main-stream
    and early-exit (pruning adapter) top-1 accuracy. Batches are shared out between processes."""
    g = tc.gamma
    bs = batch_size or tc.batch_size
    rank, size = (group.rank(), group.size()) if group is not None else (0, 1)
    idx = np.arange(len(dataset))
    batches = [idx[i: i + bs] for i in range(0, len(idx), bs)]
    if max_batches:
        batches = batches[:max_batches]
    # sums: ce_main, ce_prune, ce_s[g], ok_main, ok_prune, ok_s[g], n_main, n_s[g]
    sums = np.zeros(3 * g + 5)
    for k, ids in enumerate(batches):
        if k % size != rank:
            continue
        batch = Batch.of([dataset.examples[i] for i in ids])
        states = None
        if tc.mode == "lossless":
            states = base_states(model, mx.array(batch.tokens))
        for seg in _segments_of(batch, tc):
            t, main_h, stream_h, prune_h = _terms(model, batch, tc, seg, states)
            if main_h is None:  # lossless: the main stream is the base's last hidden state
                main_h = _rows(states[3], t)
            terms = _valid_logits(model, batch, t, g, main_h, stream_h, prune_h)
            if "main" in terms:
                for i, name in ((0, "main"), (1, "prune")):
                    logits, tgt = terms[name]
                    tgt = mx.array(tgt)
                    sums[i] += host_math.cross_entropy(logits, tgt).sum().item()
                    sums[2 + g + i] += (mx.argmax(logits, -1) == tgt).sum().item()
            if "streams" in terms:
                logits, tgt, j = terms["streams"]
                tgt = mx.array(tgt)
                ce = np.array(host_math.cross_entropy(logits, tgt))
                ok = np.array(mx.argmax(logits, -1) == tgt)
                sums[2: 2 + g] += np.bincount(j, weights=ce, minlength=g)
                sums[4 + g: 4 + 2 * g] += np.bincount(j, weights=ok, minlength=g)
        sums[2 * g + 4:] += batch.counts(g)
    if size > 1:
        sums = np.array(group.all_sum(mx.array(sums.astype(np.float32))),
                        dtype=np.float64)
    ce_m, ce_p, ce_s = sums[0], sums[1], sums[2: 2 + g]
    ok_m, ok_p, ok_s = sums[2 + g], sums[3 + g], sums[4 + g: 4 + 2 * g]
    n_m, n_s = sums[4 + 2 * g], sums[5 + 2 * g:]

    def div(x, n):
        return float(x / n) if n else float("nan")

    alphas = [float(a) for a in tc.alphas]
    loss = sum(alphas[j + 1] * div(ce_s[j], n_s[j]) for j in range(g) if n_s[j])
    loss += tc.prune_weight * div(ce_p, n_m) + (alphas[0] * div(ce_m, n_m) if alphas[0] else 0.0)
    loss = float(loss)
    return {
        "loss": round(loss, 6),
        "stream_loss": [round(div(ce_s[j], n_s[j]), 6) for j in range(g)],
        "stream_acc": [round(div(ok_s[j], n_s[j]), 6) for j in range(g)],
        "main_loss": round(div(ce_m, n_m), 6),
        "main_acc": round(div(ok_m, n_m), 6),
        "prune_loss": round(div(ce_p, n_m), 6),
        "prune_acc": round(div(ok_p, n_m), 6),
        "targets": int(n_m),
    }


def acceptance(model, prompts: list[list[int]], max_tokens: int, eos: frozenset[int], group=None
               ) -> tuple[float, list[float]]:
    """Mean accepted tokens per forward pass of greedy Speculative Streaming on ``prompts``,
    through the engine's own decode loop, and each prompt's own. The drafts are the streams' and
    prompt lookup's, without the n-gram table (written at the end, the same for every step): the
    number judges the streams. The prompts are shared out between the processes of ``group``."""
    from .engine import DecodeOptions, Decoder

    rank, size = (group.rank(), group.size()) if group is not None else (0, 1)
    table = np.zeros((len(prompts), 3))  # advanced, passes, mean: one process per row
    for i in range(rank, len(prompts), size):
        decoder = Decoder(model, prompts[i], DecodeOptions(max_tokens=max_tokens, eos_token_ids=eos,
                                                                 ngrams=False))
        for _ in decoder.steps():
            pass
        lengths = decoder.stats.accepted_lengths
        table[i] = (sum(k * c for k, c in lengths.items()), sum(lengths.values()),
                    round(decoder.stats.mean_accepted_tokens, 4))
    if size > 1:
        table = np.array(group.all_sum(mx.array(table.astype(np.float32))), dtype=np.float64)
    advanced, passes = table[:, 0].sum(), table[:, 1].sum()
    return (round(float(advanced / passes), 4) if passes else 0.0), [round(float(m), 4) for m in table[:, 2]]


def drafts_better(new: dict, best: dict, by: str = "loss") -> bool:
    """Whether an evaluation's adapter (``mean_accepted_tokens``, ``per_prompt``, and the loss
    ``by``) replaces the best so far: more tokens per pass by more than the standard error of the
    difference of the two means over prompts, or as many within that error and a lower
    validation loss ``by``: the whole loss, or in shared mode, where the adapter writes the
    output, the main stream's (``main_loss``), so that a tie in drafting goes to the better output.

    The few validation prompts are a sample of the prompts the adapter will meet, and a noisy
    one: on 8 of them an adapter of step 300 read 2.47 tokens per pass and that of step 1600 2.42,
    while on 200 sql test prompts they drafted 2.42 and 2.52. Within that noise the validation
    loss (hundreds of examples) decides; the paired per-prompt differences would not do, as most
    prompts decode alike at neighbouring steps and one prompt's swing reads as significant.
    """
    if best["step"] is None:
        return True
    gain = new["mean_accepted_tokens"] - best["mean_accepted_tokens"]
    se = math.sqrt(sum(np.var(p, ddof=1) / len(p) for p in (new["per_prompt"], best.get("per_prompt", []))
                       if len(p) > 1))
    if gain > se:
        return True
    return gain >= -se and new[by] < best.get(by, math.inf)
