"""Training speculative adapters: the training forward equals the engine's, masks, learning a
synthetic task, losslessness, shared mode, save/load, resume, data parallel, CLI."""

import json
import os
import subprocess
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
import pytest
from helpers import CONFIGS, tiny_model
from mlx.utils import tree_flatten

from mlx_specstream.adapter import (
    adapter_size,
    adapter_weights,
    detach,
    fine_tune_keys,
    fine_tune_weights,
    fuse,
    load_adapter,
    new_adapter,
)
from mlx_specstream.api import generate
from mlx_specstream.base_states import base_states
from mlx_specstream.data import Dataset, Example
from mlx_specstream.errors import AdapterError, OptionError
from mlx_specstream.kv_cache import make_cache
from mlx_specstream.lora import LoRALinear
from mlx_specstream.objective import shared_hidden, shared_layout, stream_hidden_segment
from mlx_specstream.streams import forward
from mlx_specstream.train_batches import Batch, epoch_batches
from mlx_specstream.trainer import measure_peak_memory, train
from mlx_specstream.tree import chain


def stream_logits_segment(model, h_msa, kvs, t, gamma):
    """Lossless mode's stream logits (B, L, gamma, V) of positions ``t`` (B, L), as trained."""
    return model.head(stream_hidden_segment(model, h_msa, kvs, t, gamma))


def shared_forward(model, batch, gamma):
    """Shared mode's main and stream logits of the window, and the pruning layer's input."""
    main, streams, h_prune = shared_hidden(model, batch, gamma)
    return model.head(main), model.head(streams), h_prune

V, STEP = 64, 7
TOKENS = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8]


def arithmetic(n, rng, length=16, prompt=(2, 9)):
    """Sequences x, x+7, x+14, ... (mod 64): token t+j is a fixed function of token t."""
    out = []
    for _ in range(n):
        x0 = int(rng.integers(V))
        out.append(Example([(x0 + STEP * i) % V for i in range(length)], int(rng.integers(*prompt))))
    return Dataset(out)


def params(model):
    from mlx.utils import tree_flatten

    return {k: np.array(v) for k, v in tree_flatten(model.parameters())}


def lossless_stream_logits(model, tokens, a, b, gamma):
    batch = Batch.of([Example(tokens, 1)])
    _, h_msa, kvs, _ = base_states(model, mx.array(batch.tokens))
    return np.array(stream_logits_segment(model, h_msa, kvs, np.arange(a, b)[None], gamma)[0])


# -- the training forward is the engine's forward ----------------------------------------------

def test_batch_targets():
    b = Batch.of([Example([10, 11, 12, 13, 14], 2), Example([20, 21, 22], 1)])
    assert b.window == (0, 4) and b.span == 3
    tm, ts, vm, vs = b.targets(np.broadcast_to(np.arange(4), (2, 4)), 2)
    assert tm[0].tolist()[1:] == [12, 13, 14] and ts[0, 1].tolist() == [13, 14]  # t=1: t+2, t+3
    assert vm[0].tolist() == [False, True, True, True]  # position 0 is prompt context only
    assert vs[0].tolist() == [[False, False], [True, True], [True, False], [False, False]]
    assert vm[1].tolist() == [True, True, False, False] and vs[1, 0].tolist() == [True, False]
    assert b.counts(2).tolist() == [3 + 2, 2 + 1, 1 + 0]
    assert b.at(0, 3).tolist() == [[1, 2, 3], [0, 1, 2]]  # lossless slots: from each row's prompt end
    # stream rows a lossless segment computes: (slot 0, j 1..2) and (slot 1, j 1) of row 0
    assert b.stream_rows(b.at(0, 3), 2).tolist() == [0, 1, 2]
    assert Batch.of([Example([1, 2, 3, 4], 1)]).stream_rows(np.array([[0, 1, 2]]), 2).tolist() == [0, 1, 2]


def test_epoch_batches_cover_the_data_once_and_group_lengths():
    rng = np.random.default_rng(0)
    lengths = np.stack([rng.integers(1, 50, 200), rng.integers(60, 120, 200)], axis=1)
    for lens in (None, lengths):
        batches = epoch_batches(200, 8, seed=3, epoch=1, lengths=lens)
        assert sorted(i for b in batches for i in b) == list(range(200)) and len(batches) == 25
        assert batches == epoch_batches(200, 8, seed=3, epoch=1, lengths=lens)  # a function of the seed
        assert batches != epoch_batches(200, 8, seed=3, epoch=2, lengths=lens)
    spread = [np.ptp(lengths[b, 0]) for b in epoch_batches(200, 8, 3, 1, lengths)]
    assert np.mean(spread) < np.mean([np.ptp(lengths[b, 0]) for b in epoch_batches(200, 8, 3, 1)]) / 3


def test_lossless_training_forward_equals_engine_and_segments():
    model = tiny_model("llama", seed=1)
    new_adapter(model, gamma=3, msa_layers=2, seed=0)
    ref = np.array(forward(model, chain(TOKENS), None, 0, gamma=3, stream_nodes="all").stream_logits)
    n = len(TOKENS) - 1
    np.testing.assert_allclose(lossless_stream_logits(model, TOKENS, 0, n, 3), ref[:n], atol=1e-5)
    # a segment holding only positions [5, 7) gives the same rows: no row sees another token's streams
    np.testing.assert_allclose(lossless_stream_logits(model, TOKENS, 5, 7, 3), ref[5:7], atol=1e-5)


def test_lossless_step_equals_the_engine_forward(tmp_path):
    """The lossless step (stream rows packed per row from its own prompt end, in segments, over
    kept base states) has the loss and gradients of the objective written with the engine's own
    forward pass, one sequence at a time: every stream target, plus the early-exit targets."""
    from mlx.utils import tree_flatten

    from mlx_specstream.adapter import AdapterConfig, attach
    from mlx_specstream.arch.base import causal_mask
    from mlx_specstream.objective import grad_step
    from mlx_specstream.trainer import TrainConfig, _resolve_alphas, set_trainable

    g = 3
    model = tiny_model("llama", seed=4)
    attach(model, AdapterConfig(mode="lossless", gamma=g, msa_layers=2, stream_init_rank=4), seed=2)
    set_trainable(model)
    rng = np.random.default_rng(5)
    examples = [Example(rng.integers(1, 60, int(n)).tolist(), int(p))
                for n, p in ((14, 9), (9, 2), (12, 5), (6, 5))]
    batch = Batch.of(examples)
    norms = batch.counts(g)
    alphas = np.array(_resolve_alphas(None, "lossless", g), np.float64)

    def oracle():
        loss = mx.array(0.0)
        for e in examples:
            n, p = len(e.tokens), e.n_prompt
            s = forward(model, chain(e.tokens), None, 0, gamma=g, stream_nodes="all").stream_logits
            h = model.embed(mx.array([e.tokens]), mx.arange(n))
            for layer in model.layers[: model.adapter_config.prune_layer]:
                h = layer(h, mx.arange(n), causal_mask(n, 0))
            early = model.head(model.adapter.early_exit(h[0]))
            for t in range(p - 1, n - 1):
                loss = loss + nn.losses.cross_entropy(early[t], mx.array(e.tokens[t + 1])) / norms[0]
                for j in range(1, g + 1):
                    if t + 1 + j < n:
                        ce = nn.losses.cross_entropy(s[t, j - 1], mx.array(e.tokens[t + 1 + j]))
                        loss = loss + ce * float(alphas[j] / norms[j])
        return loss

    ref_loss, ref = nn.value_and_grad(model, oracle)()
    for seg in (None, 2):
        tc = TrainConfig(mode="lossless", gamma=g, msa_layers=2, alphas=list(alphas), segment_len=seg)
        loss, got = grad_step(model, batch, tc, norms)
        assert abs(loss.item() - ref_loss.item()) < 1e-5 * max(1.0, abs(ref_loss.item()))
        for (k, a), (_, b) in zip(tree_flatten(ref), tree_flatten(got)):
            np.testing.assert_allclose(np.array(b), np.array(a), atol=1e-6, rtol=1e-4, err_msg=k)
    detach(model)


@pytest.mark.parametrize("main_rank", [0, 4])
def test_shared_training_forward_equals_incremental_decoding(main_rank):
    """Shared mode: the batched training pass (streams from the last prompt token on, main rows
    seeing their own streams) equals the engine run token by token with a KV cache; also for a
    split shared adapter (``main_rank``: every-row LoRA under the streams' own stream-only LoRA)."""
    model = tiny_model("llama", seed=1)
    new_adapter(model, mode="shared", gamma=3, msa_layers=2, seed=0, main_rank=main_rank)
    nested = [m for m in model.modules() if isinstance(m, LoRALinear) and isinstance(m.base, LoRALinear)]
    assert len(nested) == (2 * 7 if main_rank else 0)
    p = 4
    caches = make_cache(model)
    out = forward(model, chain(TOKENS[:p]), caches, 0, gamma=3, stream_nodes="last")
    mains, streams = [np.array(out.main_logits[-1])], [np.array(out.stream_logits[-1])]
    for n in range(p, len(TOKENS) - 1):
        o = forward(model, chain([TOKENS[n]]), caches, n, gamma=3, stream_nodes="all")
        mains.append(np.array(o.main_logits[0]))
        streams.append(np.array(o.stream_logits[0]))
    # a second, shorter row with a shorter prompt widens the window; row 0 must not notice
    batch = Batch.of([Example(TOKENS, p), Example(TOKENS[:7], 2)])
    main, s, _ = shared_forward(model, batch, 3)
    w0 = batch.window[0]
    np.testing.assert_allclose(np.array(main[0, p - 1 - w0:]), np.stack(mains), atol=1e-5)
    np.testing.assert_allclose(np.array(s[0, p - 1 - w0:]), np.stack(streams), atol=1e-5)


# -- masks ------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["lossless", "shared"])
def test_stream_logits_never_see_later_tokens(mode):
    model = tiny_model("llama", seed=2)
    new_adapter(model, mode=mode, gamma=3, msa_layers=2, seed=0)

    def streams(tokens):
        if mode == "lossless":
            return lossless_stream_logits(model, tokens, 0, len(tokens) - 1, 3)
        return np.array(shared_forward(model, Batch.of([Example(tokens, 1)]), 3)[1][0])

    ref = streams(TOKENS)
    for t in (2, 6):
        changed = list(TOKENS)
        changed[t + 1:] = [(x + 17) % V for x in changed[t + 1:]]
        out = streams(changed)
        np.testing.assert_allclose(out[: t + 1], ref[: t + 1], atol=1e-5)  # streams of tokens <= t
        assert np.abs(out[t + 1:] - ref[t + 1:]).max() > 1e-4


@pytest.mark.parametrize("mode", ["lossless", "shared"])
def test_stream_j_never_sees_later_streams(mode):
    model = tiny_model("llama", seed=3)
    new_adapter(model, mode=mode, gamma=3, msa_layers=2, seed=0)

    def streams():
        if mode == "lossless":
            return lossless_stream_logits(model, TOKENS, 0, len(TOKENS) - 1, 3)
        return np.array(shared_forward(model, Batch.of([Example(TOKENS, 1)]), 3)[1][0])

    ref = streams()
    embed = model.adapter.stream_embed
    model.adapter.stream_embed = mx.concatenate([embed[:2], embed[2:] * 5 + 1])  # stream 3 only
    out = streams()
    if mode == "lossless":
        np.testing.assert_allclose(out[:, :2], ref[:, :2], atol=1e-5)
    else:  # shared: main rows see all streams of their token, so only streams of the same token
        assert np.abs(out[:, :2] - ref[:, :2]).max() > 0  # change through the main rows ...
    assert np.abs(out[:, 2] - ref[:, 2]).max() > 1e-4
    model.adapter.stream_embed = embed


def test_shared_layout_mask():
    batch = Batch.of([Example([1, 2, 3, 4, 5], 3), Example([1, 2, 3, 4], 1)])
    pos, mask = shared_layout(batch, 2)
    T, g = 5, 2
    w0, w1 = batch.window
    assert (w0, w1) == (0, 4)
    m = np.array(mask)[:, 0]
    assert np.array(pos).tolist() == [0, 1, 2, 3, 4] + [1, 2, 2, 3, 3, 4, 4, 5]
    for b, p in ((0, 3), (1, 1)):
        for t in range(w0, w1):
            for j in range(g):
                r = T + (t - w0) * g + j
                assert m[b, r, :T].tolist() == [k <= t for k in range(T)]  # main keys <= t
                own = [T + (t - w0) * g + i for i in range(g)]
                seen = set(np.nonzero(m[b, r, T:])[0] + T)
                assert seen == set(own[: j + 1])  # streams (t, 1..j) only
            main_sees = set(np.nonzero(m[b, t, T:])[0] + T)
            assert main_sees == (set(T + (t - w0) * g + i for i in range(g)) if t >= p - 1 else set())


def test_segments_cut_peak_memory():
    model = tiny_model("llama", seed=0, vocab_size=2048)
    naive = measure_peak_memory(model, seq_len=256, gamma=4, batch_size=2, prompt_len=1)
    seg = measure_peak_memory(model, seq_len=256, gamma=4, batch_size=2, segment_len=32)
    assert seg < naive / 2


# -- learning a synthetic task ------------------------------------------------------------------

def train_base(model, ds, steps=150, bs=32, lr=3e-3):
    """Plain next-token fine-tuning of the whole (tiny) base model."""
    opt = optim.AdamW(learning_rate=lr, weight_decay=0.0)

    def loss_fn(x):
        return nn.losses.cross_entropy(model(x[:, :-1]), x[:, 1:]).mean()

    step = nn.value_and_grad(model, loss_fn)
    rng = np.random.default_rng(1)
    for _ in range(steps):
        idx = rng.integers(0, len(ds), bs)
        loss, g = step(mx.array(np.array([ds.examples[i].tokens for i in idx], np.int32)))
        opt.update(model, g)
        mx.eval(model.parameters(), opt.state)
    model.eval()
    return float(loss)


@pytest.fixture(scope="module")
def synthetic():
    rng = np.random.default_rng(0)
    train_ds, valid_ds = arithmetic(512, rng), arithmetic(64, rng)
    model = tiny_model("llama", seed=0)
    assert train_base(model, train_ds) < 0.01
    return model, train_ds, valid_ds


def test_streams_learn_synthetic_task_and_stay_lossless(synthetic, tmp_path):
    model, train_ds, valid_ds = synthetic
    prompts = [[5, 12, 19], [40, 47], [1, 8, 15, 22]]
    base_out = [generate(model, None, p, max_tokens=12, mode="ar").tokens for p in prompts]
    before = params(model)
    report = train(model, (train_ds, valid_ds), mode="lossless", out=tmp_path / "arith", gamma=3,
                   msa_layers=3, stream_init_rank=8, iters=150, batch_size=16, lr=3e-3,
                   val_every=75, progress=False, log=lambda m: None)
    acc = report["valid"]["stream_acc"]
    assert min(acc) >= 0.9, acc
    assert report["valid"]["main_acc"] == 1.0
    assert report["history"][-1]["loss"] < report["history"][0]["loss"] / 5
    after = params(model)
    for k, v in before.items():  # base weights untouched (wrapped ones are now ``...base.weight``)
        mod, leaf = k.rsplit(".", 1)
        assert np.array_equal(after.get(k, after.get(f"{mod}.base.{leaf}")), v), k
    accepted = []
    for p, ref in zip(prompts, base_out):
        ss = generate(model, None, p, max_tokens=12, branch=1)
        assert ss.tokens == ref == generate(model, None, p, max_tokens=12, mode="ar").tokens
        assert generate(model, None, p, max_tokens=12, branch=3, tree_budget=10).tokens == ref
        accepted.append(ss.stats.mean_accepted_tokens)
    assert np.mean(accepted) > 2, accepted
    # acceptance measured while training: what the engine gives the kept adapter on the same
    # validation prompts (the first 8), and the best of the evaluations
    assert [v["step"] for v in report["val_history"]] == [75, 150]
    best = report["best"]
    hist = {v["step"]: v for v in report["val_history"]}
    kept, top = hist[best["step"]], max(hist.values(), key=lambda v: v["mean_accepted_tokens"])
    assert kept["mean_accepted_tokens"] == best["mean_accepted_tokens"] > 2
    # the kept adapter drafts the most, or as many within the prompts' noise with a lower loss
    assert kept is top or kept["loss"] < top["loss"], (kept, top)
    # (training judges the streams: its acceptance drafts without the n-gram table it writes at the end)
    runs = [generate(model, None, e.tokens[: e.n_prompt], max_tokens=48, ngrams=False)
            for e in valid_ds.examples[:8]]
    lengths = sum((r.stats.accepted_lengths for r in runs), Counter())
    engine = sum(k * n for k, n in lengths.items()) / sum(lengths.values())
    assert engine == pytest.approx(best["mean_accepted_tokens"], abs=1e-4)

    # save -> load -> identical outputs
    saved = json.loads((tmp_path / "arith" / "training_report.json").read_text())
    assert saved["valid"]["stream_acc"] == acc and saved["mode"] == "lossless"
    ref = generate(model, None, prompts[0], max_tokens=12, branch=3)
    detach(model)
    assert generate(model, None, prompts[0], max_tokens=12, mode="ar").tokens == base_out[0]
    load_adapter(model, tmp_path / "arith")
    again = generate(model, None, prompts[0], max_tokens=12, branch=3)
    assert again.tokens == ref.tokens and again.stats.accepted_lengths == ref.stats.accepted_lengths
    detach(model)


@pytest.mark.parametrize("scores,losses,kept_step", [
    ([(3.0, [3.0, 3.1, 2.9, 3.0]), (1.5, [1.5, 1.4, 1.6, 1.5])], [9.0, 8.0], 2),  # clearly better
    ([(2.47, [3.0, 2.0, 2.6, 2.3]), (2.42, [2.0, 3.0, 2.4, 2.3])], [9.0, 8.0], 4),  # within noise
    ([(2.47, [3.0, 2.0, 2.6, 2.3]), (2.42, [2.0, 3.0, 2.4, 2.3])], [8.0, 9.0], 2),
])
def test_the_adapter_that_drafts_best_is_kept(synthetic, monkeypatch, scores, losses, kept_step):
    """The adapter saved is the one that drafts best at an evaluation, not necessarily the last:
    more tokens per pass by more than the per-prompt noise wins; within it, the lower validation
    loss (``drafts_better``)."""
    import mlx_specstream.training_run as train_mod

    model, train_ds, valid_ds = synthetic
    scores, losses, evaluate = iter(scores), iter(losses), train_mod.evaluate
    monkeypatch.setattr(train_mod, "acceptance", lambda *a: next(scores))
    monkeypatch.setattr(train_mod, "evaluate", lambda *a, **k: {**evaluate(*a, **k), "loss": next(losses)})
    seen = {}
    report = train(model, (train_ds, valid_ds), mode="lossless", gamma=2, msa_layers=2, iters=4,
                   batch_size=8, lr=1e-2, val_every=2, val_batches=1, progress=False, log=lambda m: None,
                   callback=lambda step, info: seen.setdefault(step, {
                       k: np.array(v) for k, v in adapter_weights(model).items()}))
    assert report["best"]["step"] == report["kept_step"] == model.adapter_config.training["step"] == kept_step
    shown = repr(report)  # a notebook cell's last value: its outline, not every step's loss
    assert shown.startswith("Report(adapter=None, mode='lossless', iters=4, kept_step=") and len(shown) < 400
    assert [len(v["accepted_per_prompt"]) for v in report["val_history"]] == [4, 4]
    kept = {k: np.array(v) for k, v in adapter_weights(model).items()}
    other = 6 - kept_step
    assert all(np.array_equal(kept[k], seen[kept_step][k]) for k in kept)
    assert not all(np.array_equal(kept[k], seen[other][k]) for k in kept)
    detach(model)


def test_a_tie_in_drafting_goes_to_the_better_output_in_shared_mode():
    """Within the noise of tokens per pass, the lower validation loss decides: the whole loss, or in
    shared mode (``by="main_loss"``), where the adapter writes the output, the main stream's."""
    from mlx_specstream.objective import drafts_better

    best = {"step": 3, "mean_accepted_tokens": 1.11, "per_prompt": [1.0, 1.2, 1.1],
            "loss": 6.83, "main_loss": 0.473}
    new = {"step": 6, "mean_accepted_tokens": 1.07, "per_prompt": [1.1, 1.0, 1.1],
           "loss": 6.07, "main_loss": 1.031}  # lower in all, streams included; twice the main loss
    assert drafts_better(new, best) and not drafts_better(new, best, by="main_loss")
    assert drafts_better({**new, "mean_accepted_tokens": 2.5, "per_prompt": [2.4, 2.6, 2.5]}, best,
                         by="main_loss")  # clearly better drafts win whatever the loss


def alone(model, prompt, max_tokens, eos=frozenset()):
    """Greedy autoregressive decoding of one prompt through the engine, the EOS that ended it
    kept (as in training data)."""
    from mlx_specstream.engine import DecodeOptions, Decoder

    d = Decoder(model, prompt, DecodeOptions(max_tokens=max_tokens, mode="ar", eos_token_ids=eos))
    out = [t for step in d.steps() for t in step.tokens]
    return out + ([min(eos)] if d.stats.finish_reason == "stop" else [])


@pytest.mark.parametrize("family", ["llama", "opt"])
def test_batched_greedy_equals_decoding_alone(family):
    """Left-padded batches (positions per row, pads hidden) give each prompt its own greedy
    continuation, stopping at its budget or at EOS."""
    from mlx_specstream.batch import greedy_batch

    model = tiny_model(family, seed=1)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, 60, int(n)).tolist() for n in (3, 9, 1, 6, 12)]
    budgets = [10, 4, 12, 1, 7]
    ref = [alone(model, p, b) for p, b in zip(prompts, budgets)]
    assert greedy_batch(model, prompts, budgets, set()) == ref
    eos = {ref[0][2]}  # the first row stops at this token; the others may go on
    got = greedy_batch(model, prompts, budgets, eos)
    assert got == [alone(model, p, b, frozenset(eos)) for p, b in zip(prompts, budgets)]
    assert got[0] == ref[0][: ref[0].index(ref[0][2]) + 1]


def test_self_distill_targets_are_base_greedy(synthetic, tmp_path):
    model, _, _ = synthetic
    rng = np.random.default_rng(5)
    # completions that disagree with the base: distillation must replace them by its own output;
    # the last two are prompts given alone (a completion of EOS only): the base writes 5 tokens
    rows = [Example([int(x) for x in rng.integers(0, V, 3)] + [0] * 6, 3) for _ in range(4)]
    rows += [Example([int(x) for x in rng.integers(0, V, 3)] + [0], 3) for _ in range(2)]
    ds = Dataset(rows)
    report = train(model, (ds, ds), mode="lossless", out=tmp_path / "d", gamma=2, msa_layers=2,
                   iters=2, batch_size=3, distill_tokens=5, progress=False, log=lambda m: None)
    detach(model)
    assert report["config"]["self_distill"]  # the default in lossless mode
    cached = (tmp_path / "d.train" / "distilled" / "train.jsonl").read_text().splitlines()[1:]
    got = {r["i"]: r["completion"] for r in map(json.loads, cached)}
    assert sorted(got) == list(range(6))
    for i, ex in enumerate(rows):
        assert got[i] == alone(model, ex.tokens[:3], 6 if i < 4 else 5)
    assert report["valid"]["main_acc"] == 1.0  # targets are the base's own predictions


def test_default_length_scales_with_the_data():
    from mlx_specstream.train_batches import DEFAULT_STEPS, MAX_EPOCHS, default_iters

    assert default_iters(30000, 8) == 3750  # a large data set: one epoch
    assert default_iters(120, 8) == DEFAULT_STEPS  # a small one: many epochs, ~DEFAULT_STEPS steps
    assert default_iters(16, 8) == 2 * MAX_EPOCHS  # a tiny one: at most MAX_EPOCHS


def test_data_without_validation_holds_some_out():
    from mlx_specstream.train_batches import hold_out

    ds = Dataset([Example([i, i + 1, i + 2], 1) for i in range(120)], n_lines=120)
    train_ds, valid_ds = hold_out(ds, seed=3)
    assert (len(train_ds), len(valid_ds), train_ds.n_lines) == (108, 12, 120)
    seen = [e.tokens[0] for e in train_ds.examples + valid_ds.examples]
    assert sorted(seen) == list(range(120))  # a split: nothing lost, nothing twice
    assert [e.tokens for e in hold_out(ds, seed=3)[1].examples] == [e.tokens for e in valid_ds.examples]
    assert len(hold_out(Dataset(ds.examples * 10), seed=0)[1]) == 64  # at most 64
    assert hold_out(Dataset(ds.examples[:20]), seed=0)[1] is None  # too small to spare 8
    lines = Dataset([replace(e, line=i) for i, e in enumerate(ds.examples)])  # one example a line
    assert [e.tokens for e in hold_out(lines, seed=3)[1].examples] == [e.tokens for e in valid_ds.examples]
    talks = Dataset([replace(e, line=i // 3) for i, e in enumerate(ds.examples)])  # 3 replies a line
    train_ds, valid_ds = hold_out(talks, seed=3)
    held = {e.line for e in valid_ds.examples}
    assert len(valid_ds) >= 12 and len(valid_ds) == 3 * len(held)  # whole conversations
    assert not held & {e.line for e in train_ds.examples} and len(train_ds) + len(valid_ds) == 120
    for size in (40, 20):  # conversations too long to spare: a quarter at most, else no validation
        long = Dataset([replace(e, line=i // size) for i, e in enumerate(ds.examples[:40])])
        assert hold_out(long, seed=0) == (long, None)
    some = Dataset([replace(e, line=0 if i < 30 else i) for i, e in enumerate(ds.examples[:40])])
    train_ds, valid_ds = hold_out(some, seed=0)  # the long one stays in training
    assert len(valid_ds) == 8 and all(e.line != 0 for e in valid_ds.examples) and len(train_ds) == 32


def test_self_distill_resumes_and_distills_only_what_the_run_visits(tmp_path, monkeypatch):
    """Continuations are appended to the cache batch by batch: an interrupted distillation
    resumes where it stopped, a run over part of the data distills that part only, and the
    result equals one uninterrupted pass."""
    import mlx_specstream.batch as batch_mod
    from mlx_specstream.distill import distill_dataset

    model = tiny_model("llama", seed=1)
    rng = np.random.default_rng(2)
    ds = Dataset([Example(rng.integers(1, 60, int(n)).tolist() + [0], int(n))  # prompts alone
                  for n in rng.integers(3, 9, 40)])
    ref = distill_dataset(model, ds, None, 64, 4, progress=False)
    assert all(e.tokens[e.n_prompt:] == alone(model, e.tokens[: e.n_prompt], 4) for e in ref.examples)
    cache, calls = tmp_path / "train.jsonl", []
    real = batch_mod.greedy_batch

    def counted(model, prompts, budgets, eos):
        calls.append(len(prompts))
        if len(calls) == 2 and interrupt:
            raise KeyboardInterrupt
        return real(model, prompts, budgets, eos)

    monkeypatch.setattr(batch_mod, "greedy_batch", counted)
    interrupt = True
    with pytest.raises(KeyboardInterrupt):
        distill_dataset(model, ds, None, 64, 4, key={"k": 1}, cache=cache, progress=False)
    assert calls == [16, 16]
    kept = {json.loads(line)["i"] for line in cache.read_text().splitlines()[1:]}
    assert len(kept) == 16  # the first batch, written before the interruption
    with cache.open("a") as f:  # a line torn by a kill in the middle of an append
        f.write('{"i": 39, "compl')
    interrupt, calls[:] = False, []
    part = distill_dataset(model, ds, None, 64, 4, key={"k": 1}, indices=list(range(30)), cache=cache,
                           progress=False)
    assert sum(calls) == len(set(range(30)) - kept)  # what the cache held is reused
    assert part.examples[:30] == ref.examples[:30]
    assert part.examples[30:] == ds.examples[30:]  # never visited: left as given
    calls[:] = []
    full = distill_dataset(model, ds, None, 64, 4, key={"k": 1}, cache=cache, progress=False)
    assert sum(calls) == 40 - len(kept | set(range(30))) and full.examples == ref.examples
    calls[:] = []
    distill_dataset(model, ds, None, 64, 4, key={"k": 2}, cache=cache, progress=False)  # other base
    assert sum(calls) == 40


def tune_main_stream(mode, out):
    """A tiny model fine-tuned (main stream included) on the arithmetic task: the model, its logits
    on TOKENS before training, the training report and the data."""
    rng = np.random.default_rng(0)
    train_ds, valid_ds = arithmetic(64, rng, length=12), arithmetic(8, rng, length=12)
    model = tiny_model("llama", seed=0)
    base = np.array(model(mx.array([TOKENS]))[0])
    report = train(model, (train_ds, valid_ds), mode=mode, out=out, gamma=2, msa_layers=2, iters=12,
                   batch_size=8, lr=3e-3, val_every=0, progress=False, log=lambda m: None)
    return model, base, report, train_ds


def test_shared_mode_changes_main_logits_and_reloads(tmp_path):
    model, base, report, _ = tune_main_stream("shared", tmp_path / "sh")
    assert report["config"]["alphas"] == [1.0, 0.1, 0.1]
    assert report["history"][-1]["loss"] < report["history"][0]["loss"]
    assert report["valid"]["main_loss"] < 4.0  # learnt the task a little (chance: ln 64 = 4.16)
    out = forward(model, chain(TOKENS), None, 0, gamma=2)
    assert np.abs(np.array(out.main_logits) - base).max() > 1e-2
    ref = generate(model, None, [3, 10], max_tokens=10)
    load_adapter(model, tmp_path / "sh")
    assert model.adapter_config.mode == "shared"
    assert generate(model, None, [3, 10], max_tokens=10).tokens == ref.tokens


def test_lora_mode_is_a_next_token_baseline_without_streams(tmp_path):
    model, base, report, train_ds = tune_main_stream("lora", tmp_path / "lo")
    assert report["config"]["alphas"] == [1.0] and report["config"]["gamma"] == 0
    assert report["valid"]["stream_acc"] == []
    assert report["history"][-1]["loss"] < report["history"][0]["loss"]
    assert report["valid"]["main_loss"] < 4.0  # chance: ln 64 = 4.16
    tuned = np.array(model(mx.array([TOKENS]))[0])
    assert np.abs(tuned - base).max() > 1e-2

    # plain greedy over the tuned model's full-sequence logits is the oracle for mode="ar"
    ids = [3, 10]
    for _ in range(8):
        ids.append(int(np.argmax(np.array(model(mx.array([ids]))[0, -1]))))
    load_adapter(model, tmp_path / "lo")
    assert model.adapter_config.mode == "lora" and model.adapter_config.gamma == 0
    assert generate(model, None, [3, 10], max_tokens=8, mode="ar").tokens == ids[2:]
    with pytest.raises(ValueError, match="adapter with streams"):
        generate(model, None, [3, 10], max_tokens=8, mode="ss")
    with pytest.raises(ValueError, match="no alphas"):
        train(model, (train_ds, None), mode="lora", alphas="1,0.1", iters=1, progress=False)


def test_tuned_adapter_decodes_its_fine_tune_exactly(tmp_path):
    """Streams trained over a fine-tune (``over``, a lora-mode adapter): the fine-tune stays frozen
    and travels in the adapter, and every decoding equals plain greedy decoding of the fine-tuned
    model (full-sequence logits, the oracle), before and after saving, loading and fusing."""
    model, _, _, train_ds = tune_main_stream("lora", tmp_path / "lo")

    def greedy(prompt, n=10):
        ids = list(prompt)
        for _ in range(n):
            ids.append(int(np.argmax(np.array(model(mx.array([ids]))[0, -1]))))
        return ids[len(prompt):]

    prompts = [[3, 10], [7, 14, 21], [50]]
    oracle = [greedy(p) for p in prompts]
    tuned_logits = np.array(model(mx.array([TOKENS]))[0])
    fine_tune = {k: np.array(v) for k, v in adapter_weights(model).items()}
    report = train(model, (train_ds, None), mode="lossless", over=tmp_path / "lo", out=tmp_path / "tu",
                   gamma=2, msa_layers=2, iters=20, batch_size=8, lr=3e-3, val_every=0,
                   progress=False, log=lambda m: None)
    cfg = model.adapter_config
    assert (cfg.mode, cfg.main_rank, report["config"]["over"]) == ("lossless", 8, str(tmp_path / "lo"))
    assert report["history"][-1]["loss"] < report["history"][0]["loss"]
    loras = {name: m for name, m in model.named_modules() if isinstance(m, LoRALinear)}
    streams = [m for m in loras.values() if m.streams_only]
    assert len(streams) == 2 * 7 and all(isinstance(m.base, LoRALinear) for m in streams)
    own = sum(v.size for _, v in tree_flatten(model.adapter.parameters()))
    assert report["trainable_parameters"] == own + sum(m.lora_a.size + m.lora_b.size for m in streams)
    kept = {k: np.array(v) for k, v in fine_tune_weights(model).items()}
    assert kept.keys() == {k for k in fine_tune if ".lora_" in k}
    assert all(np.array_equal(v, fine_tune[k]) for k, v in kept.items())  # frozen, carried
    out = forward(model, chain(TOKENS), None, 0, gamma=2)
    np.testing.assert_allclose(np.array(out.main_logits), tuned_logits, atol=1e-5)

    def decodings():
        return [[generate(model, None, p, max_tokens=10, **o).tokens for p in prompts]
                for o in (dict(mode="ar"), dict(branch=1), dict(branch=3, tree_budget=8))]

    assert decodings() == [oracle] * 3
    detach(model)
    assert [generate(model, None, p, max_tokens=10, mode="ar").tokens for p in prompts] != oracle
    load_adapter(model, tmp_path / "tu")
    assert decodings() == [oracle] * 3
    size = adapter_size(model)
    assert fuse(model)  # the fine-tune folded into the weights; the stream-only LoRA stays
    assert decodings() == [oracle] * 3 and adapter_size(model) == size
    with pytest.raises(ValueError, match="lossless and shared"):
        train(tiny_model("llama", seed=0), (train_ds, None), mode="lora", over=tmp_path / "lo",
              iters=1, progress=False)
    with pytest.raises(AdapterError, match="lora"):
        train(tiny_model("llama", seed=0), (train_ds, None), over=tmp_path / "tu", iters=1,
              progress=False)


def test_split_shared_adapter_starts_from_its_fine_tune(tmp_path):
    """Shared mode ``over`` a fine-tune: the every-row LoRA starts as the fine-tune's (at learning
    rate 0 it stays so, with stream-only LoRA in the MSA layers only) and trains on with the
    streams (both change at a learning rate > 0); it saves, reloads and fuses to the same output."""
    model, _, _, train_ds = tune_main_stream("lora", tmp_path / "lo")
    fine_tune = {k: np.array(v) for k, v in adapter_weights(model).items() if ".lora_" in k}
    opts = dict(mode="shared", over=tmp_path / "lo", gamma=2, msa_layers=2, batch_size=8,
                val_every=0, progress=False, log=lambda m: None)
    train(model, (train_ds, None), iters=1, lr=0.0, **opts)
    assert (model.adapter_config.mode, model.adapter_config.main_rank) == ("shared", 8)
    assert all(np.array_equal(np.array(v), fine_tune[k]) for k, v in fine_tune_weights(model).items())
    streams = [m for m in model.modules() if isinstance(m, LoRALinear) and m.streams_only]
    assert len(streams) == 2 * 7 and all(isinstance(m.base, LoRALinear) for m in streams)
    report = train(model, (train_ds, None), iters=10, lr=3e-3, out=tmp_path / "sp", **opts)
    assert report["history"][-1]["loss"] < report["history"][0]["loss"]
    trained = fine_tune_weights(model)
    assert trained.keys() == fine_tune.keys()
    assert not all(np.array_equal(np.array(v), fine_tune[k]) for k, v in trained.items())
    streams = [m for m in model.modules() if isinstance(m, LoRALinear) and m.streams_only]
    assert all(np.abs(np.array(m.lora_b)).max() > 0 for m in streams)  # zero-initialised, trained
    ref = [generate(model, None, p, max_tokens=10).tokens for p in ([3, 10], [50])]
    load_adapter(model, tmp_path / "sp")
    assert [generate(model, None, p, max_tokens=10).tokens for p in ([3, 10], [50])] == ref
    assert fuse(model)  # the every-row LoRA folded; the streams' own stays
    assert [generate(model, None, p, max_tokens=10).tokens for p in ([3, 10], [50])] == ref


def test_shared_adapter_moves_its_fine_tune_at_its_own_rate(tmp_path):
    """``fine_tune_lr``: the every-row LoRA has a learning rate of its own (0: it stays the fine-tune
    it started from, bit for bit, while the streams train at ``lr``); it survives a resume; only
    shared mode takes it."""
    model, _, _, train_ds = tune_main_stream("lora", tmp_path / "lo")
    fine_tune = {k: np.array(v) for k, v in fine_tune_weights(model).items()}
    opts = dict(mode="shared", over=tmp_path / "lo", gamma=2, msa_layers=2, batch_size=8, iters=4,
                lr=3e-3, fine_tune_lr=0.0, val_every=0, save_every=2, progress=False, log=lambda m: None)

    def stop_at_3(step, info):
        if step == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(model, (train_ds, None), out=tmp_path / "sp", callback=stop_at_3, **opts)
    report = train(model, (train_ds, None), out=tmp_path / "sp", resume=True, **opts)
    assert report["start_step"] == 3
    assert all(np.array_equal(np.array(v), fine_tune[k]) for k, v in fine_tune_weights(model).items())
    streams = [m for m in model.modules() if isinstance(m, LoRALinear) and m.streams_only]
    assert streams and all(np.abs(np.array(m.lora_b)).max() > 0 for m in streams)
    with pytest.raises(ValueError, match="only shared mode"):
        train(model, (train_ds, None), **{**opts, "mode": "lossless", "iters": 1})


def test_init_starts_from_an_adapters_weights(tmp_path):
    """``init``: a run starts from a finished adapter's weights (at learning rate 0 it ends with
    them exactly, and its first loss is the finished adapter's, far below a fresh adapter's); an
    adapter of another shape is refused."""
    model, _, first, train_ds = tune_main_stream("lossless", tmp_path / "a")
    saved = mx.load(str(tmp_path / "a" / "adapter.safetensors"))
    opts = dict(mode="lossless", gamma=2, msa_layers=2, iters=1, batch_size=8, lr=0.0, val_every=0,
                progress=False, log=lambda m: None)
    again = train(model, (train_ds, None), init=tmp_path / "a", **opts)
    assert {k: np.array(v) for k, v in adapter_weights(model).items()}.keys() == saved.keys()
    assert all(np.array_equal(np.array(v), np.array(saved[k])) for k, v in adapter_weights(model).items())
    fresh = train(model, (train_ds, None), **opts)
    assert again["history"][0]["loss"] < 0.9 * fresh["history"][0]["loss"]
    assert again["history"][0]["loss"] <= 1.2 * first["history"][-1]["loss"]
    with pytest.raises(ValueError, match="trained with mode lossless, gamma 2, msa_layers 2"):
        train(model, (train_ds, None), init=tmp_path / "a", **{**opts, "gamma": 3})
    with pytest.raises(ValueError, match="'.*a' was trained in lossless mode: .* not in shared mode"):
        train(model, (train_ds, None), init=tmp_path / "a", **{**opts, "mode": "shared"})
    # a run taken further from its own adapter (--init OUT --resume, scripts/train_adapters.sh's
    # further stage) resumes once that adapter has changed: the weights are the checkpoint's
    def stop_at_2(step, info):
        if step == 2:
            raise KeyboardInterrupt

    train(model, (train_ds, None), init=tmp_path / "a", out=tmp_path / "a", overwrite=True,
          **dict(opts, lr=1e-3))
    run = dict(opts, iters=3, lr=1e-3, save_every=1)
    with pytest.raises(KeyboardInterrupt):
        train(model, (train_ds, None), init=tmp_path / "a", out=tmp_path / "a", overwrite=True,
              callback=stop_at_2, **run)
    rep = train(model, (train_ds, None), init=tmp_path / "a", out=tmp_path / "a", resume=True, **run)
    assert rep["start_step"] == 2


def test_init_from_an_adapter_of_another_base(tmp_path):
    """A base of the same shape with other weights (trained again, say) refuses to load another's
    adapter, but a run may start from it (``init``): at learning rate 0 it ends with those weights
    exactly, says so, and the adapter it saves records the new base and loads onto it."""
    _, _, _, train_ds = tune_main_stream("lossless", tmp_path / "a")
    saved = mx.load(str(tmp_path / "a" / "adapter.safetensors"))
    model = tiny_model("llama", seed=2)
    with pytest.raises(AdapterError, match="another base model"):
        load_adapter(model, tmp_path / "a")
    said = []
    train(model, (train_ds, None), init=tmp_path / "a", out=tmp_path / "b", mode="lossless", gamma=2,
          msa_layers=2, iters=1, batch_size=8, lr=0.0, val_every=0, progress=False, log=said.append)
    assert any("made for another base model" in m for m in said)
    assert all(np.array_equal(np.array(v), np.array(saved[k])) for k, v in adapter_weights(model).items())
    detach(model)
    load_adapter(model, tmp_path / "b")
    # a base of another shape (one layer, under the adapter's two stream layers): said as such
    shallow = tiny_model("llama", seed=2, num_hidden_layers=1)
    with pytest.raises(AdapterError, match="adapter 'a' does not fit this model"):
        train(shallow, (train_ds, None), init=tmp_path / "a", mode="lossless", gamma=2, msa_layers=1,
              iters=1, batch_size=8, val_every=0, progress=False, log=said.append)


@pytest.mark.parametrize("mode", ["lossless", "shared"])
def test_adapter_over_a_fine_tune_started_from_another_takes_overs_lora(tmp_path, mode):
    """A tuned or split shared adapter (``over``) started from one trained over another fine-tune
    (``init``): the streams come from ``init`` (learning rate 0: exactly), the every-row LoRA (the
    fine-tune carried, or where shared training starts) from ``over``."""
    model, _, _, train_ds = tune_main_stream("lora", tmp_path / "lo")
    opts = dict(gamma=2, msa_layers=2, batch_size=8, val_every=0, progress=False, log=lambda m: None)
    train(model, (train_ds, None), mode=mode, over=tmp_path / "lo", out=tmp_path / "tu", iters=5,
          lr=3e-3, **opts)
    started = {k: np.array(v) for k, v in adapter_weights(model).items()}
    detach(model)
    train(model, (train_ds, None), mode="lora", out=tmp_path / "lo2", iters=5, lr=1e-2, seed=1, **opts)
    other = {k: np.array(v) for k, v in fine_tune_weights(model).items()}
    detach(model)
    train(model, (train_ds, None), mode=mode, over=tmp_path / "lo2", init=tmp_path / "tu", iters=1,
          lr=0.0, **opts)
    carried = {k: np.array(v) for k, v in fine_tune_weights(model).items()}
    assert carried.keys() == other.keys() and all(np.array_equal(v, other[k]) for k, v in carried.items())
    streams = {k: np.array(v) for k, v in adapter_weights(model).items() if k not in fine_tune_keys(model)}
    assert streams and all(np.array_equal(v, started[k]) for k, v in streams.items())


def test_pruning_adapter_learns_next_token():
    rng = np.random.default_rng(0)
    ds = arithmetic(64, rng, length=12)
    model = tiny_model("llama", seed=0)
    report = train(model, (ds, ds), gamma=2, msa_layers=2, iters=30, batch_size=16, lr=1e-2,
                   val_every=30, progress=False, log=lambda m: None)
    assert report["val_history"][-1]["prune_loss"] < 3.0  # from ~ln 64 = 4.16 on a random base


# -- checkpoints, resume, output --------------------------------------------------------------

class Stop(Exception):
    pass


def test_a_callback_returning_false_ends_the_run_as_a_shorter_one(tmp_path):
    """``callback`` returns False at step 3 of 8: the run ends there as a 3-step run, its saved
    adapter the weights after step 3 (as the callback saw them), validated at step 3 and reported
    as 3 steps; ``resume`` with more steps goes on from there."""
    rng = np.random.default_rng(0)
    ds, valid = arithmetic(40, rng, length=10), arithmetic(16, rng, length=10)
    opts = dict(gamma=2, msa_layers=2, batch_size=8, lr=3e-3, save_every=2, val_every=2, progress=False)
    model, calls, said, seen = tiny_model("llama", seed=0), [], [], {}

    def until_3(step, info):
        calls.append(step)
        seen.update({k: np.array(v) for k, v in adapter_weights(model).items()})
        return step < 3

    stopped = train(model, (ds, valid), out=tmp_path / "stop", iters=8, callback=until_3, log=said.append,
                    **opts)
    assert calls == [1, 2, 3] and "the callback stopped the run at step 3 of 8" in said
    assert stopped["iters"] == 3 and [h["step"] for h in stopped["history"]] == [1, 2, 3]
    assert stopped["valid"]["step"] == 3 and [v["step"] for v in stopped["val_history"]] == [2, 3]
    assert json.loads((tmp_path / "stop" / "training_report.json").read_text())["iters"] == 3
    saved = mx.load(str(tmp_path / "stop" / "adapter.safetensors"))
    assert saved.keys() == seen.keys() and all(np.array_equal(np.array(saved[k]), v) for k, v in seen.items())
    more = train(tiny_model("llama", seed=0), (ds, valid), out=tmp_path / "stop", iters=5, resume=True,
                 log=lambda m: None, **opts)
    assert more["start_step"] == 3 and [h["step"] for h in more["history"]] == [1, 2, 3, 4, 5]


def test_resume_continues_from_checkpoint(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    ds = arithmetic(40, rng, length=10)
    opts = dict(gamma=2, msa_layers=2, iters=6, batch_size=8, lr=3e-3, save_every=2,
                val_every=0, progress=False, log=lambda m: None)
    model = tiny_model("llama", seed=0)
    full = train(model, (ds, None), out=tmp_path / "full", **opts)
    ref = {k: np.array(v) for k, v in mx.load(str(tmp_path / "full" / "adapter.safetensors")).items()}

    def stop_at_5(step, info):
        if step == 5:
            raise Stop

    model = tiny_model("llama", seed=0)
    with pytest.raises(Stop):
        train(model, (ds, None), out=tmp_path / "cut", callback=stop_at_5, **opts)
    ckpts = sorted(p.name for p in (tmp_path / "cut.train" / "checkpoints").iterdir())
    assert ckpts == ["step-0000002", "step-0000004"] and not (tmp_path / "cut").exists()
    with pytest.raises(FileExistsError, match="resume"):
        train(model, (ds, None), out=tmp_path / "cut", **opts)
    model = tiny_model("llama", seed=0)
    rep = train(model, (ds, None), out=tmp_path / "cut", resume=True, **opts)
    assert rep["start_step"] == 4 and rep["history"][-1]["step"] == 6
    assert [h["step"] for h in rep["history"]] == list(range(1, 7))
    got = mx.load(str(tmp_path / "cut" / "adapter.safetensors"))
    for k, v in ref.items():
        np.testing.assert_allclose(np.array(got[k]), v, atol=1e-6)
    assert [h["loss"] for h in rep["history"]] == pytest.approx([h["loss"] for h in full["history"]],
                                                                abs=1e-5)
    with pytest.raises(FileExistsError, match="already exists"):
        train(model, (ds, None), out=tmp_path / "cut", **opts)

    def interrupt_at_3(step, info):  # Ctrl-C or SIGTERM: a checkpoint of the steps done is written
        if step == 3:
            raise KeyboardInterrupt

    def terminate_at_2(step, info):
        if step == 2:
            import os
            import signal

            os.kill(os.getpid(), signal.SIGTERM)

    from mlx_specstream.outputs import Terminated

    with pytest.raises(Terminated):
        train(tiny_model("llama", seed=0), (ds, None), out=tmp_path / "term", callback=terminate_at_2,
              **{**opts, "save_every": 100})
    assert (tmp_path / "term.train" / "checkpoints" / "step-0000002" / "state.json").is_file()

    # a signal in the middle of step 3, after its update: the checkpoint is of step 3, the weights'
    import math
    import os
    import signal

    armed, isfinite = [], math.isfinite

    def signal_inside(x):  # train checks the step's loss with math.isfinite after the update
        if armed:
            armed.clear()
            os.kill(os.getpid(), signal.SIGTERM)
        return isfinite(x)

    monkeypatch.setattr(math, "isfinite", signal_inside)
    with pytest.raises(Terminated):
        train(tiny_model("llama", seed=0), (ds, None), out=tmp_path / "mid",
              callback=lambda step, info: armed.append(1) if step == 2 else None,
              **{**opts, "save_every": 100})
    assert [p.name for p in (tmp_path / "mid.train" / "checkpoints").iterdir()] == ["step-0000003"]
    import json

    state = json.loads((tmp_path / "mid.train" / "checkpoints" / "step-0000003" / "state.json").read_text())
    assert [h["loss"] for h in state["history"]] == pytest.approx([h["loss"] for h in full["history"][:3]],
                                                                  abs=1e-5)  # step 3's entry too

    model = tiny_model("llama", seed=0)
    said = []
    with pytest.raises(KeyboardInterrupt):
        train(model, (ds, None), out=tmp_path / "ctrl-c", callback=interrupt_at_3,
              **{**opts, "log": said.append})
    step3 = tmp_path / "ctrl-c.train" / "checkpoints" / "step-0000003"
    assert step3.is_dir()  # and the interrupt is left to the caller to say ("interrupted")
    assert said[-1] == f"saved {step3}; continue with resume=True", said
    # another training process stopped first (a SIGTERM to the whole group): rank 0 saves too
    from mlx_specstream.process_group import PeerStopped

    def peer_stops_at_2(step, info):
        if step == 2:
            raise PeerStopped("training process 1 of 2 stopped")

    with pytest.raises(PeerStopped):
        train(tiny_model("llama", seed=0), (ds, None), out=tmp_path / "peer", callback=peer_stops_at_2,
              **{**opts, "save_every": 100})
    assert (tmp_path / "peer.train" / "checkpoints" / "step-0000002" / "state.json").is_file()
    rep = train(tiny_model("llama", seed=0), (ds, None), out=tmp_path / "ctrl-c", resume=True, **opts)
    assert rep["start_step"] == 3
    got = mx.load(str(tmp_path / "ctrl-c" / "adapter.safetensors"))
    for k, v in ref.items():
        np.testing.assert_allclose(np.array(got[k]), v, atol=1e-6)
    with pytest.raises(ValueError, match=r"started otherwise: batch_size=8 \(now 4\)"):
        train(model, (ds, None), out=tmp_path / "cut", resume=True, **{**opts, "batch_size": 4})
    # the tree the best adapter was chosen with
    with pytest.raises(ValueError, match=r"tree_budget=32 \(now 64\)"):
        train(model, (ds, None), out=tmp_path / "cut", resume=True, **{**opts, "tree_budget": 64})
    with pytest.raises(ValueError, match="past iters"):
        train(model, (ds, None), out=tmp_path / "cut", resume=True, **{**opts, "iters": 5})
    other = Dataset(ds.examples[::-1], n_lines=len(ds))  # other data: not the batches it saw
    with pytest.raises(ValueError, match="data holds other training examples"):
        train(model, (other, None), out=tmp_path / "cut", resume=True, **opts)
    rep = train(tiny_model("llama", seed=0), (ds, None), out=tmp_path / "cut", resume=True,
                **{**opts, "iters": 8})  # a further stage: continues from step 6
    assert rep["start_step"] == 6 and [h["step"] for h in rep["history"]] == list(range(1, 9))


def test_a_stop_during_a_validation_runs_it_on_resume(tmp_path, monkeypatch):
    """Ctrl-C while step 2's validation decodes saves the checkpoint of step 2 without that
    evaluation: the resumed run evaluates step 2 first, so it chooses its adapter among the same
    steps as a run never stopped; it refuses other validation prompts than the best was chosen on."""
    import mlx_specstream.training_run as train_mod

    rng = np.random.default_rng(0)
    ds, valid = arithmetic(40, rng, length=10), arithmetic(8, rng, length=10)
    opts = dict(gamma=2, msa_layers=2, iters=4, batch_size=8, lr=3e-3, save_every=100, val_every=2,
                val_batches=1, accept_prompts=2, accept_tokens=8, progress=False, log=lambda m: None)
    full = train(tiny_model("llama", seed=0), (ds, valid), out=tmp_path / "full", **opts)
    real, calls = train_mod.acceptance, []

    def ctrl_c_in_the_first(*a, **k):
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(train_mod, "acceptance", ctrl_c_in_the_first)
    with pytest.raises(KeyboardInterrupt):
        train(tiny_model("llama", seed=0), (ds, valid), out=tmp_path / "cut", **opts)
    with pytest.raises(ValueError, match="accept_prompts"):
        train(tiny_model("llama", seed=0), (ds, valid), out=tmp_path / "cut", resume=True,
              **{**opts, "accept_prompts": 0})
    rep = train(tiny_model("llama", seed=0), (ds, valid), out=tmp_path / "cut", resume=True, **opts)
    assert [v["step"] for v in rep["val_history"]] == [v["step"] for v in full["val_history"]] == [2, 4]
    assert rep["best"]["step"] == full["best"]["step"]


def test_a_stop_in_the_final_evaluation_says_how_to_finish(tmp_path, monkeypatch):
    """Ctrl-C while the last step is evaluated: the run says its last checkpoint holds that step
    and that resuming finishes it, which it does."""
    import mlx_specstream.training_run as train_mod

    rng = np.random.default_rng(0)
    ds, valid = arithmetic(40, rng, length=10), arithmetic(8, rng, length=10)
    opts = dict(gamma=2, msa_layers=2, iters=4, batch_size=8, lr=3e-3, save_every=2, val_every=0,
                val_batches=1, accept_prompts=2, accept_tokens=8, progress=False)
    real = train_mod.acceptance

    def ctrl_c(*a, **k):
        raise KeyboardInterrupt

    said = []
    monkeypatch.setattr(train_mod, "acceptance", ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        train(tiny_model("llama", seed=0), (ds, valid), out=tmp_path / "a", log=said.append, **opts)
    from mlx_specstream.errors import said_in

    assert any("final evaluation" in m and "step-0000004" in m and "resume=True" in m
               and "--resume" in said_in(m, "cli") for m in said), said  # each in its caller's terms
    monkeypatch.setattr(train_mod, "acceptance", real)
    rep = train(tiny_model("llama", seed=0), (ds, valid), out=tmp_path / "a", resume=True,
                log=lambda m: None, **opts)
    assert rep["start_step"] == 4 and (tmp_path / "a" / "adapter.safetensors").is_file()


def test_a_resumed_run_keeps_its_length_warmup_and_validation(tmp_path):
    """Resumed as the Ctrl-C hint says (no iters), a run keeps the checkpoint's length and warmup
    (its learning-rate schedule), refuses another warmup or other validation examples, and passes
    over a damaged last checkpoint for the one before it."""
    rng = np.random.default_rng(0)
    ds, valid = arithmetic(40, rng, length=10), arithmetic(8, rng, length=10)
    opts = dict(gamma=2, msa_layers=2, batch_size=8, lr=3e-3, save_every=2, val_every=0,
                progress=False, log=lambda m: None)

    def stop_at_5(step, info):
        if step == 5:
            raise Stop

    with pytest.raises(Stop):
        train(tiny_model("llama", seed=0), (ds, valid), out=tmp_path / "cut", callback=stop_at_5,
              iters=9, warmup=3, **opts)
    for change in ({"warmup": 1}, {"iters": 9, "warmup": 0}):
        with pytest.raises(ValueError, match=r"warmup=3 \(now \d\)"):
            train(tiny_model("llama", seed=0), (ds, valid), out=tmp_path / "cut", resume=True,
                  **opts, **change)
    other_valid = arithmetic(8, np.random.default_rng(1), length=10)
    with pytest.raises(ValueError, match="other validation examples"):
        train(tiny_model("llama", seed=0), (ds, other_valid), out=tmp_path / "cut", resume=True, **opts)
    # refused before any of the run's work, saying how the run was made shorter than its step
    for change, said in [({"iters": 3}, r"past iters=3$"), ({"epochs": 0.5}, r"past the 3 steps of epochs$")]:
        with pytest.raises(ValueError, match=r"step-0000004: the run is already at step 4, " + said):
            train(tiny_model("llama", seed=0), (ds, valid), out=tmp_path / "cut", resume=True, **opts,
                  **change)
    other = tiny_model("llama", hidden_size=48)  # another shape: said before its weights fail to load
    with pytest.raises(ValueError, match=r"step-0000004: checkpoint was made on another base model "
                                         r"\(fingerprint \w+; this one \w+\): resume with the model"):
        train(other, (ds, valid), out=tmp_path / "cut", resume=True, **opts)
    last = tmp_path / "cut.train" / "checkpoints" / "step-0000004" / "optimizer.safetensors"
    last.write_bytes(last.read_bytes()[:1000])  # damaged on disk after it was written
    said = []
    rep = train(tiny_model("llama", seed=0), (ds, valid), out=tmp_path / "cut", resume=True,
                **{**opts, "log": said.append})
    assert rep["start_step"] == 2 and rep["history"][-1]["step"] == 9
    assert rep["config"]["iters"] == 9 and rep["config"]["warmup"] == 3
    assert any("step-0000004: unreadable checkpoint" in m and "before it" in m for m in said)


def test_options_are_checked(tmp_path):
    ds = arithmetic(8, np.random.default_rng(0), length=8)
    model = tiny_model("llama", seed=0)
    quiet = dict(progress=False, log=lambda m: None)
    with pytest.raises(ValueError, match="alpha_0 of alphas must be 0"):
        train(model, (ds, None), alphas=[1, 1, 1, 1, 1], **quiet)
    with pytest.raises(ValueError, match="alphas"):
        train(model, (ds, None), gamma=2, alphas=[0, 1, 1, 1], **quiet)
    with pytest.raises(ValueError, match="mode"):
        train(model, (ds, None), mode="medusa", **quiet)
    with pytest.raises(ValueError, match="either iters or epochs"):
        train(model, (ds, None), iters=2, epochs=1, **quiet)
    with pytest.raises(ValueError, match="bare adapter name"):
        train(model, (ds, None), out="sql", **quiet)
    for name in ("branch", "tree_budget"):
        with pytest.raises(OptionError, match=f"{name} must be a whole number >= 1, not 0"):
            train(model, (ds, None), **{name: 0}, **quiet)
    from mlx_specstream.loader import quantize_model

    said, quantized = [], tiny_model("llama", seed=0)
    quantize_model(quantized, 8, 64)
    train(quantized, (ds, None), gamma=2, msa_layers=2, iters=1, progress=False, log=said.append)
    from mlx_specstream.device import on_gpu

    assert any("the base is quantized" in str(m) for m in said) != on_gpu(), said  # a CPU's slowness
    said.clear()
    train(model, (ds, None), gamma=2, msa_layers=2, iters=1, progress=False, log=said.append)
    assert not any("quantized" in str(m) for m in said), said
    with pytest.raises(OptionError, match="system_prompt is a turn of the chat template: give chat_template"):
        train(model, (ds, None), system_prompt="Be brief.", **quiet)
    with pytest.raises(OptionError, match="system_prompt must be text, not 1"):
        train(model, (ds, None), system_prompt=1, chat_template=True, **quiet)
    rep = train(model, (ds, None), gamma=2, msa_layers=2, alphas="0,0.5", epochs=2, batch_size=3,
                **quiet)
    assert rep["iters"] == 6 and rep["config"]["alphas"] == [0.0, 0.5, 0.5] and rep["adapter"] is None
    # NumPy scalars are the numbers they are: checkpoints and the report are written as JSON
    rep = train(model, (ds, None), gamma=2, msa_layers=2, iters=np.int64(2), batch_size=np.int64(3),
                lr=np.float32(1e-3), seed=np.uint64(1), save_every=1, out=tmp_path / "np", **quiet)
    saved = json.loads((tmp_path / "np" / "training_report.json").read_text())
    assert saved["iters"] == 2 and saved["config"]["batch_size"] == 3 and saved["config"]["seed"] == 1
    assert (tmp_path / "np.train" / "checkpoints" / "step-0000002" / "state.json").is_file()
    import inspect

    import mlx_specstream
    from mlx_specstream import trainer

    for _ in range(2):  # the function, however often it is looked up (not its module after the first)
        assert mlx_specstream.train is trainer.train
        assert "mode" in inspect.signature(mlx_specstream.train).parameters
    assert {"load", "generate", "stream_generate", "train"} <= set(dir(mlx_specstream))  # tab completion


# -- command line and data parallel -------------------------------------------------------------

def make_model_dir(root: Path) -> Path:
    from mlx_specstream.loader import save_model

    model = tiny_model("llama", seed=0)
    (root / "model").mkdir(parents=True)
    save_model(model, CONFIGS["llama"], root / "model")
    rng = np.random.default_rng(0)
    (root / "data").mkdir()
    for split, n in (("train", 24), ("valid", 6)):
        with open(root / "data" / f"{split}.jsonl", "w") as f:
            for _ in range(n):
                x0, length, p = int(rng.integers(V)), int(rng.integers(8, 20)), int(rng.integers(1, 6))
                toks = [(x0 + STEP * i) % V for i in range(length)]
                f.write(json.dumps({"prompt": toks[:p], "completion": toks[p:]}) + "\n")
    return root / "model"


ARGS = ["--data", None, "--gamma", "3", "--msa-layers", "2", "--iters", "3", "--batch-size", "6",
        "--val-every", "3", "--save-every", "2", "--lr", "1e-3"]


def cli(*args, launch: int = 0, cwd=None):
    bindir = Path(sys.executable).parent
    cmd = [sys.executable, "-m", "mlx_specstream.cli", "train", *args]
    if launch:
        port = 20000 + (os.getpid() * 7) % 20000
        cmd = [str(bindir / "mlx.launch"), "-n", str(launch), "--backend", "ring",
               "--starting-port", str(port), *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=cwd)


def test_cli_resume_takes_the_runs_own_settings_and_a_checkpoint_is_an_adapter(tmp_path):
    """``train --resume`` continues a run started with other flags with those flags (said once),
    where Python's ``resume=True`` names each that differs in the options' own terms; and a
    checkpoint loads as an adapter before the run ends."""
    from mlx_specstream.api import load
    from mlx_specstream.trainer import run_settings

    model_dir = make_model_dir(tmp_path)

    def stop_at_2(step, info):
        if step == 2:
            raise KeyboardInterrupt

    opts = dict(gamma=3, msa_layers=2, iters=4, lr=1e-3, val_every=4, save_every=2, progress=False,
                log=lambda m: None, processes=1)
    with pytest.raises(KeyboardInterrupt):
        train(str(model_dir), tmp_path / "data", out="a", batch_size=4, accept_prompts=2, callback=stop_at_2,
              **opts)
    step2 = model_dir / "adapters" / "a.train" / "checkpoints" / "step-0000002"
    model, _ = load(model_dir, adapter=step2)
    assert model.adapter_config.gamma == 3
    assert run_settings(model_dir, "a")["batch_size"] == 4
    with pytest.raises(ValueError, match=r"batch_size=4 \(now 8\); accept_prompts=2 \(now 8\)"):
        train(str(model_dir), tmp_path / "data", out="a", resume=True, **opts)
    r = cli("--model", str(model_dir), "--data", str(tmp_path / "data"), "--out", "a", "--resume",
            "--processes", "1")
    assert r.returncode == 0, r.stderr
    said = ("resuming with the run's own settings: --gamma 3 --msa-layers 2 --batch-size 4 --val-every 4 "
            "--save-every 2 --accept-prompts 2\n")
    assert said in r.stderr, r.stderr
    report = json.loads((model_dir / "adapters" / "a" / "training_report.json").read_text())
    assert report["start_step"] == 2 and report["config"]["batch_size"] == 4 and report["iters"] == 4
    r = cli("--model", str(model_dir), "--data", str(tmp_path / "data"), "--out", "a", "--resume",
            "--batch-size", "8", "--iters", "6")  # what the command line gives is compared, as flags
    assert r.returncode == 1 and "started otherwise: --batch-size 4 (now 8)" in r.stderr, r.stderr
    r = cli("--model", str(model_dir), "--data", str(tmp_path / "data"), "--out", "b", "--resume")
    said = (f"no checkpoint in {model_dir / 'adapters' / 'b.train' / 'checkpoints'}: no run to resume "
            "here (a run keeps its checkpoints under the --model it was started with: give that one); "
            "--overwrite with --resume starts a run where there is none")  # not a new run on the wrong model
    assert (r.returncode, r.stderr.strip().splitlines()[-1]) == (1, f"error: {said}"), r.stderr
    assert not (model_dir / "adapters" / "b").exists() and not (model_dir / "adapters" / "b.train").exists()


def test_the_settings_a_resume_takes_and_says(tmp_path, capsys):
    """What ``--resume`` takes from a run (not what its mode ignores or sets itself, nor ``init``),
    said as options the command line has (a run's Python-only settings in Python's terms); what a
    resume that differs is told, in the caller's terms, None and switches included."""
    from mlx_specstream.checkpoint import check_same_run
    from mlx_specstream.cli import _run_settings
    from mlx_specstream.errors import OptionError
    from mlx_specstream.trainer import run_settings

    step = tmp_path / "m" / "adapters" / "a.train" / "checkpoints" / "step-0000001"
    step.mkdir(parents=True)
    settings = {"mode": "lora", "gamma": 0, "branch": 3, "alphas": [1.0], "batch_size": 4, "init": "x",
                "over": None, "lora_alpha": 32.0, "val_every": 2}
    (step / "state.json").write_text(json.dumps({"settings": settings, "config": {}}))
    assert run_settings(tmp_path / "m", "a") == {"mode": "lora", "batch_size": 4, "over": None,
                                                 "lora_alpha": 32.0, "val_every": 2}
    taken = _run_settings({"batch_size": 4, "chat_template": True, "fine_tune_lr": None, "segment_len": None,
                           "lora_alpha": 32.0, "iters": 9},
                          {"batch_size": 8, "chat_template": False, "fine_tune_lr": 5e-4, "segment_len": 32},
                          given=["fine_tune_lr"])
    assert taken == {"batch_size": 4, "chat_template": True, "segment_len": None, "lora_alpha": 32.0}
    assert ("resuming with the run's own settings: --batch-size 4 --chat-template --segment-len 0; set in "
            "Python: lora_alpha=32.0") in capsys.readouterr().err
    with pytest.raises(OptionError) as e:
        check_same_run(step, {"fine_tune_lr": None, "chat_template": False, "batch_size": 4},
                       {"fine_tune_lr": 5e-4, "chat_template": True, "batch_size": 8}, ())
    assert e.value.render("cli").endswith(
        "started otherwise: without --fine-tune-lr (now --fine-tune-lr 0.0005); without --chat-template "
        "(now --chat-template); --batch-size 4 (now 8). Resume it as it was started, or --overwrite without "
        "--resume to start again")
    assert "batch_size=4 (now 8)" in str(e.value) and "chat_template=True" in str(e.value)
    with pytest.raises(OptionError, match=r"segment_len=0 \(now 32\)"):
        check_same_run(step, {"segment_len": None}, {"segment_len": 32}, ())
    with pytest.raises(OptionError) as e:  # a switch that is on by default is said by its --no- form
        check_same_run(step, {"self_distill": False, "group_by_length": False},
                       {"self_distill": True, "group_by_length": True}, ())
    assert "--no-self-distill (now --self-distill); --no-group-by-length (now --group-by-length)" \
        in e.value.render("cli")


def test_cli_train_saves_named_adapter(tmp_path):
    model_dir = make_model_dir(tmp_path)
    args = [a if a is not None else str(tmp_path / "data") for a in ARGS]
    r = cli("--model", str(model_dir), "--out", "arith", "--branch", "4", "--tree-budget", "48", *args)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    from mlx_specstream.trainer import default_processes

    # the default: two processes on a CPU of 2 or more cores (their sum is tested below)
    assert summary["world_size"] == default_processes(str(model_dir), None, 6)
    assert summary["adapter"] == str(model_dir / "adapters" / "arith")
    assert len(summary["valid"]["stream_acc"]) == 3
    assert "train lossless" in r.stderr and "tok_s" in r.stderr  # the progress bar
    report = json.loads((model_dir / "adapters" / "arith" / "training_report.json").read_text())
    assert report["train"]["peak_memory_mb"] > 0
    from mlx_specstream.api import load

    model, _ = load(model_dir, adapter="arith")
    assert model.adapter_config.gamma == 3 and model.adapter_config.name == "arith"
    assert (model.adapter_config.branch, model.adapter_config.tree_budget) == (4, 48)  # decoding defaults
    # and the n-gram drafts of the data it learnt from: lossless mode's default self-distillation
    # replaced the completions of the examples the run visits by the base's own continuations
    from mlx_specstream.ngrams import NgramTable

    rows = [json.loads(line) for line in (tmp_path / "data" / "train.jsonl").read_text().splitlines()]
    lines = (model_dir / "adapters" / "arith.train" / "distilled" / "train.jsonl").read_text().splitlines()
    for d in map(json.loads, lines[1:]):  # after the header line
        rows[d["i"]]["completion"] = d["completion"]
    table = NgramTable.build((r["prompt"] + r["completion"], len(r["prompt"])) for r in rows)
    got = model.adapter_ngrams.next  # shares are stored as float32
    assert got and got.keys() == table.next.keys()
    assert all(got[c][0] == t and abs(got[c][1] - p) < 1e-6 for c, (t, p) in table.next.items())
    r = cli("--model", str(model_dir), "--out", "arith", *args)
    assert r.returncode == 1 and r.stderr.rstrip().endswith(  # in the command line's terms only
        "arith already exists: give another --out, or --overwrite to replace it, or --resume to continue "
        "its training"), r.stderr
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "train.jsonl").write_text('{"text": [1, 2]}\n{oops\n')
    r = cli("--model", str(model_dir), "--out", "x", *[str(bad) if a == str(tmp_path / "data") else a
                                                       for a in args])
    assert r.returncode == 1 and "train.jsonl:2: invalid JSON" in r.stderr


@pytest.mark.parametrize("how", ["mlx.launch", "--processes"])
@pytest.mark.parametrize("mode", ["lossless", "shared"])
def test_two_processes_equal_one(tmp_path, mode, how):
    """2 processes (under mlx.launch with the ring backend, or started by ``--processes 2``): the
    same parameters as 1 process on the same global batches."""
    model_dir = make_model_dir(tmp_path)
    args = [a if a is not None else str(tmp_path / "data") for a in ARGS] + ["--mode", mode] + (
        ["--segment-len", "4"] if mode == "lossless" else [])  # lossless mode's
    one = cli("--model", str(model_dir), "--out", str(tmp_path / "one"), *args, "--processes", "1")
    assert one.returncode == 0, one.stderr
    if how == "mlx.launch":
        two = cli("--model", str(model_dir), "--out", str(tmp_path / "two"), *args, launch=2)
        if two.returncode != 0 and "bind" in two.stdout + two.stderr:
            pytest.skip("the ring backend could not open its local ports")
    else:
        two = cli("--model", str(model_dir), "--out", str(tmp_path / "two"), *args, "--processes", "2")
    assert two.returncode == 0, two.stdout + two.stderr
    assert json.loads(two.stdout)["world_size"] == 2  # one summary: the first process's
    r1 = json.loads((tmp_path / "one" / "training_report.json").read_text())
    r2 = json.loads((tmp_path / "two" / "training_report.json").read_text())
    assert (r1["world_size"], r2["world_size"]) == (1, 2)
    assert [h["loss"] for h in r2["history"]] == pytest.approx([h["loss"] for h in r1["history"]],
                                                               rel=1e-5)
    assert r2["valid"]["loss"] == pytest.approx(r1["valid"]["loss"], rel=1e-5)
    # acceptance: the prompts decoded by both processes, gathered in order
    assert r2["valid"]["accepted_per_prompt"] == r1["valid"]["accepted_per_prompt"]
    a = mx.load(str(tmp_path / "one" / "adapter.safetensors"))
    b = mx.load(str(tmp_path / "two" / "adapter.safetensors"))
    assert set(a) == set(b)
    # Adam divides by the root of the squared gradients, so where a gradient is ~0 the rounding of
    # a sum over two processes shows up amplified, up to a step's length for a few elements: all
    # within 10 % of how far 3 steps at lr 1e-3 move a parameter (3e-3), and 99.9 % within 1 %. A
    # wrong reduction (a shard's gradient lost, a process on other batches) moves most by far more.
    diff = np.concatenate([np.abs(np.array(a[k]) - np.array(b[k])).ravel() for k in a])
    assert diff.max() < 3e-4 and np.mean(diff > 3e-5) < 1e-3, (diff.max(), np.mean(diff > 3e-5))


def test_default_processes(tmp_path):
    """Two processes only where they pay and can be started: MLX on a CPU of 2+ cores, the model a
    directory, no tokenizer object, a batch to share, no group (mlx.launch) given."""
    from mlx_specstream.process_group import threads_each
    from mlx_specstream.trainer import default_processes

    on_cpu = mx.default_device().type == mx.DeviceType.cpu
    assert default_processes("model_dir", None, 8) == (2 if on_cpu and threads_each(1) >= 2 else 1)
    assert default_processes(tiny_model("llama", seed=0), None, 8) == 1
    assert default_processes("model_dir", object(), 8) == 1
    assert default_processes("model_dir", None, 1) == 1
    assert default_processes("model_dir", None, 8, distributed=False) == 1
    # train() in Python: one process unless asked (spawn imports the calling script again)
    import inspect

    from mlx_specstream.trainer import train

    assert inspect.signature(train).parameters["processes"].default == 1


def test_processes_bad_input(tmp_path):
    model_dir = make_model_dir(tmp_path)
    args = [a if a is not None else str(tmp_path / "data") for a in ARGS]
    for n, says in (("0", "--processes must be a whole number >= 1, not 0"),
                    ("7", "--processes (7) must not exceed --batch-size (6)")):
        r = cli("--model", str(model_dir), "--out", "x", *args, "--processes", n)
        assert r.returncode == 1 and says in r.stderr and "Traceback" not in r.stderr, r.stderr
    # bad input every process meets: one line (rank 0's), not one traceback per process
    r = cli("--model", str(model_dir), "--out", "x", *args, "--processes", "2", "--alphas", "1,2,3")
    assert r.returncode == 1 and r.stderr.strip().count("\n") == 0 and "alphas" in r.stderr, r.stderr
    assert not (model_dir / "adapters" / "x").exists()
    (model_dir / "adapters" / "x").mkdir(parents=True)  # refused before the processes start
    (model_dir / "adapters" / "x" / "notes.txt").write_text("mine")
    r = cli("--model", str(model_dir), "--out", "x", *args, "--processes", "2")
    assert r.returncode == 1 and "did not write" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_base_state_cache_gives_the_same_step():
    """A lossless step on states assembled from kept per-example states (some kept, some fresh)
    has the uncached step's loss and gradients; memory stays within the bound."""
    from mlx.utils import tree_flatten

    from mlx_specstream.adapter import AdapterConfig, attach
    from mlx_specstream.base_states import BaseStateCache
    from mlx_specstream.objective import grad_step
    from mlx_specstream.trainer import TrainConfig, set_trainable

    rng = np.random.default_rng(3)
    model = tiny_model("llama", seed=2)
    attach(model, AdapterConfig(mode="lossless", gamma=3, msa_layers=2, stream_init_rank=4), seed=1)
    set_trainable(model)
    tc = TrainConfig(mode="lossless", gamma=3, msa_layers=2, alphas=[0, 1, 1, 1], segment_len=4)
    examples = [Example(rng.integers(1, 60, int(n)).tolist(), int(p))
                for n, p in zip(rng.integers(8, 20, 6), rng.integers(2, 6, 6))]
    cache = BaseStateCache(1 << 30)
    cache.states(model, [0, 2, 4], [examples[i] for i in (0, 2, 4)])  # kept from an earlier batch
    ids = [4, 1, 0, 5]
    batch = Batch.of([examples[i] for i in ids])
    ref_loss, ref = grad_step(model, batch, tc, batch.counts(3))
    loss, got = grad_step(model, batch, tc, batch.counts(3),
                          cache.states(model, ids, [examples[i] for i in ids]))
    assert abs(loss.item() - ref_loss.item()) < 1e-5 * max(1.0, abs(ref_loss.item()))
    for (k, a), (_, b) in zip(tree_flatten(ref), tree_flatten(got)):
        assert np.allclose(np.array(a), np.array(b), atol=1e-5, rtol=1e-4), k
    assert set(cache.kept) == {0, 1, 2, 4, 5}
    small = BaseStateCache(cache.used // 5)  # room for about one example
    small.states(model, ids, [examples[i] for i in ids])
    assert 0 < len(small.kept) < len(ids) and small.used <= small.max_bytes
    detach(model)


@pytest.mark.parametrize("early_main_loss,kept", [(2.0, "the final adapter"),
                                                (1.005, "the adapter of step 2")])
def test_shared_mode_keeps_an_earlier_adapter_only_as_good_in_quality(monkeypatch, early_main_loss, kept):
    """A shared adapter writes the output: an earlier checkpoint that drafts more is kept only if its
    main stream predicts the validation data within 1 % of the final one's (a lossless adapter's
    main stream is the base's, so there drafting alone decides)."""
    from mlx_specstream import training_run as train_module

    at = {2: (3.0, early_main_loss), 4: (1.5, 1.0)}  # step: (tokens per pass, main-stream loss)
    step = {"now": 0}

    def fake_evaluate(model, ds, tc, max_batches=None, group=None):
        step["now"] += 2
        return {"loss": 1.0, "main_loss": at[step["now"]][1], "stream_acc": [0.5, 0.5], "main_acc": 0.9,
                "prune_acc": 0.5}

    monkeypatch.setattr(train_module, "evaluate", fake_evaluate)
    monkeypatch.setattr(train_module, "acceptance",
                        lambda *a, **k: (at[step["now"]][0], [at[step["now"]][0]] * 4))
    rng = np.random.default_rng(0)
    ds = arithmetic(24, rng, length=10)
    said, weights = [], {}
    model = tiny_model("llama", seed=0)

    def snapshot(step, info):  # the adapter's weights after each step
        weights[step] = {k: np.array(v) for k, v in tree_flatten(model.trainable_parameters())}

    report = train(model, (ds, ds), mode="shared", gamma=2, msa_layers=1, iters=4, val_every=2,
                   batch_size=4, progress=False, log=said.append, callback=snapshot)
    assert any(m.startswith(f"keeping {kept}") for m in said), said
    kept_step = 4 if kept == "the final adapter" else 2  # the report says which (a walkthrough found
    assert report["kept_step"] == model.adapter_config.training["step"] == kept_step  # only "best")
    assert report["best"]["step"] == 2  # the evaluation that drafted best, kept or not
    want = weights[kept_step]
    got = {k: np.array(v) for k, v in tree_flatten(model.trainable_parameters())}
    assert any(not np.array_equal(weights[2][k], weights[4][k]) for k in want)  # they tell apart
    assert got.keys() == want.keys() and all(np.array_equal(got[k], want[k]) for k in want)


def test_a_new_user_is_told_early_and_exactly(tmp_path, monkeypatch):
    """Bad adapter settings are refused before the data is read; a resume with other settings
    before any self-distillation; a finished run resumed again is left as it is; the report's
    epochs are passes over the data; a lora adapter is generated with --mode ar."""
    import json

    import mlx_specstream.trainer as train_mod

    rng = np.random.default_rng(0)
    ds, valid = arithmetic(40, rng, length=10), arithmetic(8, rng, length=10)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "train.jsonl").write_text("not json\n")
    with pytest.raises(OptionError, match="rank must be a whole number >= 1, not 0"):  # not the data's error
        train(tiny_model("llama", seed=0), tmp_path / "bad", rank=0, iters=1, progress=False)
    from mlx_specstream.adapter import save_adapter

    other = tiny_model("llama", seed=0)
    new_adapter(other, gamma=2, msa_layers=2)
    save_adapter(other, tmp_path / "renamed")  # an adapter is named by its directory
    with pytest.raises(AdapterError, match="adapter 'renamed' is a lossless-mode adapter"):
        train(tiny_model("llama", seed=0), tmp_path / "bad", over=tmp_path / "renamed", iters=1,
              progress=False)
    foreign = tiny_model("llama", seed=1)
    new_adapter(foreign, mode="lora")
    save_adapter(foreign, tmp_path / "foreign")  # a fine-tune of another base
    kept = adapter_weights(other)
    with pytest.raises(AdapterError, match="made for another base model"):
        train(other, (ds, valid), over=tmp_path / "foreign", iters=1, progress=False)
    assert other.adapter_config.mode == "lossless" and all(  # a failed run leaves the adapter it had
        np.array_equal(np.array(v), np.array(kept[k])) for k, v in adapter_weights(other).items())
    opts = dict(gamma=2, msa_layers=2, iters=4, batch_size=12, lr=3e-3, val_every=0, save_every=2,
                progress=False, log=lambda m: None)
    rep = train(tiny_model("llama", seed=0), (ds, valid), out=tmp_path / "a", **opts)
    assert rep["epochs"] == 1.0  # 40 examples in batches of 12: 4 steps are one pass
    report = (tmp_path / "a" / "training_report.json").read_bytes()
    model = tiny_model("llama", seed=0)
    again = train(model, (ds, valid), out=tmp_path / "a", resume=True, **opts)
    assert again == json.loads(report) and (tmp_path / "a" / "training_report.json").read_bytes() == report
    saved = mx.load(str(tmp_path / "a" / "adapter.safetensors"))  # and the model holds what it saved
    assert all(np.array_equal(np.array(v), np.array(saved[k])) for k, v in adapter_weights(model).items())

    def stop_at_6(step, info):  # after step 6's checkpoint, before its adapter is saved
        if step == 6:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):  # a further stage, stopped at its end
        train(tiny_model("llama", seed=0), (ds, valid), out=tmp_path / "a", resume=True, callback=stop_at_6,
              **{**opts, "iters": 6})
    further = train(tiny_model("llama", seed=0), (ds, valid), out=tmp_path / "a", resume=True,
                    **{**opts, "iters": 6})  # finished now, not taken for the earlier stage's report
    assert further["iters"] == 6 and json.loads((tmp_path / "a" / "training_report.json").read_text())[
        "history"][-1]["step"] == 6

    def distilled(*a, **k):
        raise AssertionError("self-distillation ran before the settings were compared")

    monkeypatch.setattr(train_mod, "distill_dataset", distilled)
    with pytest.raises(ValueError, match=r"started otherwise: batch_size=12 \(now 8\)"):
        train(tiny_model("llama", seed=0), (ds, valid), out=tmp_path / "a", resume=True,
              **{**opts, "batch_size": 8, "iters": 8, "self_distill": True})
    said = []
    model = tiny_model("llama", seed=0)
    model.path = tmp_path / "m"
    train(model, (ds, valid), out="l", mode="lora", **{**opts, "log": said.append})
    assert any(f"(generate with --model {tmp_path / 'm'} --adapter l --mode ar)" in m for m in said), said
    said.clear()
    train(model, (ds, valid), out="my sql", mode="lora", **{**opts, "log": said.append})
    assert any("--adapter 'my sql' --mode ar)" in m for m in said), said  # pastes into a shell
    with pytest.raises(OptionError, match="/: out names no folder to save an adapter in"):
        train(model, (ds, valid), out="/", mode="lora", **opts)


def test_a_finished_run_asked_again_gives_the_model_its_saved_adapter(tmp_path, monkeypatch):
    """Resuming a finished run does nothing but leaves the model with the adapter the run saved,
    its best (here the first evaluation's), not its last checkpoint's weights."""
    import mlx_specstream.training_run as train_mod

    monkeypatch.setattr(train_mod, "drafts_better", lambda new, best, by="loss": best["step"] is None)
    rng = np.random.default_rng(0)
    ds, valid = arithmetic(24, rng, length=10), arithmetic(8, rng, length=10)
    opts = dict(gamma=2, msa_layers=2, iters=3, batch_size=8, lr=3e-2, val_every=1, save_every=1,
                accept_prompts=2, accept_tokens=4, progress=False, log=lambda m: None)
    train(tiny_model("llama", seed=0), (ds, valid), out=tmp_path / "a", **opts)
    model = tiny_model("llama", seed=0)
    train(model, (ds, valid), out=tmp_path / "a", resume=True, **opts)
    saved = mx.load(str(tmp_path / "a" / "adapter.safetensors"))
    assert all(np.array_equal(np.array(v), np.array(saved[k])) for k, v in adapter_weights(model).items())


def test_text_rows_are_trained_as_given_and_measured_from_their_first_half(tmp_path, monkeypatch):
    """Self-distillation continues prompts: a text row has none (its first token only), so it is
    kept as given, said once, instead of becoming the base model's continuation of a bare BOS;
    its acceptance is measured from its first half, not from that one token."""
    import mlx_specstream.training_run as train_mod

    rng = np.random.default_rng(0)
    rows = arithmetic(16, rng, length=12).examples
    text = [Example(e.tokens, 1, text=True) for e in rows[:6]]
    seen = []
    real = train_mod.acceptance

    def acceptance(model, prompts, *args):
        seen.extend(prompts)
        return real(model, prompts, *args)

    monkeypatch.setattr(train_mod, "acceptance", acceptance)
    said = []
    train(tiny_model("llama", seed=0), (Dataset(text + rows[6:]), Dataset(text[:2])), out=tmp_path / "a",
          gamma=2, msa_layers=2, iters=2, batch_size=16, val_every=2, accept_prompts=2, accept_tokens=4,
          progress=False, log=said.append)
    assert any("self-distill train: 6 text rows have no prompt for the base model" in m for m in said)
    lines = (tmp_path / "a.train" / "distilled" / "train.jsonl").read_text().splitlines()[1:]
    assert sorted(json.loads(line)["i"] for line in lines) == list(range(6, 16))  # only the prompted
    assert seen and all(p == e.tokens[:6] for p, e in zip(seen, text[:2] * len(seen)))


def test_an_existing_adapter_is_named_as_it_is_in_every_language(tmp_path):
    """The path comes through as it is (braces too, which option names are written in), the
    options in the caller's terms."""
    from mlx_specstream.errors import OutputExistsError

    rng = np.random.default_rng(0)
    ds = arithmetic(8, rng, length=10)
    out = tmp_path / "a{gamma}b"
    opts = dict(gamma=2, msa_layers=2, iters=1, batch_size=8, val_every=0, progress=False, log=lambda m: None)
    train(tiny_model("llama", seed=0), (ds, None), out=out, **opts)
    with pytest.raises(OutputExistsError) as e:
        train(tiny_model("llama", seed=0), (ds, None), out=out, **opts)
    assert str(e.value) == (f"{out} already exists: give another out, or overwrite=True to replace it, or "
                            "resume=True to continue its training")
    assert e.value.render("cli").startswith(f"{out} already exists: give another --out, or --overwrite")


def test_validation_time_is_not_training_throughput(tmp_path, monkeypatch):
    """Tokens per second count the training steps only: a slow validation (here 0.3 s a call,
    four calls) leaves them where they are."""
    import time

    import mlx_specstream.training_run as train_mod

    rng = np.random.default_rng(0)
    ds, valid = arithmetic(40, rng, length=10), arithmetic(8, rng, length=10)
    real = train_mod.evaluate

    def slow(*a, **k):
        time.sleep(0.3)
        return real(*a, **k)

    monkeypatch.setattr(train_mod, "evaluate", slow)
    rep = train(tiny_model("llama", seed=0), (ds, valid), gamma=2, msa_layers=2, iters=4, batch_size=10,
                val_every=1, accept_prompts=0, self_distill=False, progress=False, log=lambda m: None)
    tokens = sum(len(e.tokens) for e in ds.examples)  # 4 steps of 10: every example once
    assert rep["train"]["seconds"] > 1.2
    assert rep["train"]["tokens_per_second"] > 2 * tokens / rep["train"]["seconds"]


def test_the_plan_line_says_what_the_run_will_do():
    """The line a run starts with says the warmup it will have (cut to a short run's length) and
    when it validates (--val-every 0: at the end only, as it does)."""
    rng = np.random.default_rng(0)
    ds, valid = arithmetic(16, rng, length=10), arithmetic(4, rng, length=10)
    said = []
    train(tiny_model("llama", seed=0), (ds, valid), gamma=2, msa_layers=1, iters=2, warmup=100, val_every=0,
          batch_size=8, accept_prompts=0, progress=False, log=said.append)
    plan = next(m for m in said if m.startswith("train: "))
    assert "warmup 100 (cut to 1: the run has 2 steps), validation at the end" in plan, plan
    assert "2 steps (1 epoch of 2 batches of 8)" in plan, plan
    said.clear()
    train(tiny_model("llama", seed=0), (ds, valid), gamma=2, msa_layers=1, iters=1, warmup=3, val_every=0,
          batch_size=100, accept_prompts=0, progress=False, log=said.append)
    plan = next(m for m in said if m.startswith("train: "))
    assert "warmup 3 (none: the run has 1 step)" in plan, plan
    # a batch is at most the examples there are
    assert "(1 epoch of 1 batch of 16 (all the examples: fewer than the batch size, 100))" in plan, plan


def test_defaults_fit_a_small_model():
    """Left out, the longest example and the multi-stream layers fit the model (what it holds,
    every layer of a model with fewer than 4); given, beyond it, they are refused by name."""
    rng = np.random.default_rng(0)
    ds = arithmetic(8, rng, length=10)
    small = tiny_model("llama", num_hidden_layers=2, max_position_embeddings=24)
    rep = train(small, (ds, None), iters=1, batch_size=4, self_distill=False, progress=False,
                log=lambda m: None)
    assert (rep["config"]["max_seq_len"], rep["config"]["msa_layers"]) == (24, 2)
    with pytest.raises(OptionError, match="msa_layers must be at most the model's 2 layers, not 3"):
        train(small, (ds, None), iters=1, msa_layers=3, progress=False, log=lambda m: None)
    with pytest.raises(OptionError, match="max_seq_len is 32, beyond the 24 tokens the model holds"):
        train(small, (ds, None), iters=1, max_seq_len=32, progress=False, log=lambda m: None)
    rep = train(tiny_model("llama"), (ds, None), iters=1, batch_size=4, self_distill=False, progress=False,
                log=lambda m: None)  # no limit of its own, 4 layers: the usual defaults
    assert (rep["config"]["max_seq_len"], rep["config"]["msa_layers"]) == (512, 4)


def test_rows_given_in_python_train_as_the_same_file_does(tmp_path):
    """``train(model, rows)``: the dicts a train.jsonl holds, read as that file is (the oracle: the
    same rows written to a directory), validation held out alike; a bad row is said by its index."""
    from mlx_specstream.adapter import adapter_weights
    from mlx_specstream.data import DataError, rows_dataset

    ds = arithmetic(24, np.random.default_rng(1), length=10)
    rows = [{"prompt": e.tokens[:e.n_prompt], "completion": e.tokens[e.n_prompt:]} for e in ds.examples]
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    quiet = dict(gamma=2, msa_layers=2, iters=3, batch_size=4, self_distill=False, progress=False,
                 log=lambda m: None)
    weights = []
    for data in (tmp_path / "d", rows, (rows[:20], rows[20:]), (rows_dataset(rows[:20]), rows[20:])):
        model = tiny_model("llama", seed=0)
        train(model, data, **quiet)
        weights.append({k: np.array(v) for k, v in adapter_weights(model).items()})
    assert all(np.array_equal(weights[0][k], weights[1][k]) for k in weights[0])  # the file's own rows
    assert all(np.array_equal(weights[2][k], weights[3][k]) for k in weights[2])  # a list or its Dataset
    with pytest.raises(DataError, match=r"data\[1\]: has 'prompt' but no 'completion'"):  # as the list has it
        train(tiny_model("llama", seed=0), [rows[0], {"prompt": [1, 2]}], **quiet)
    with pytest.raises(DataError, match=r"data\[1\]\[0\]: expected a JSON object"):
        train(tiny_model("llama", seed=0), (rows, [None]), **quiet)
    with pytest.raises(DataError, match=r"data: no rows"):
        train(tiny_model("llama", seed=0), [], **quiet)
    model = tiny_model("llama", seed=0)  # a Dataset alone: validation held out of it, as of its rows
    train(model, rows_dataset(rows), **quiet)
    assert all(np.array_equal(np.array(v), weights[0][k]) for k, v in adapter_weights(model).items())


def test_a_run_whose_stderr_reader_goes_away_trains_to_its_end(tmp_path):
    """``train ... 2>&1 | head``: the progress bar's next write raised BrokenPipeError, which stopped
    the run without saving the steps since its last checkpoint. What is written after is dropped."""
    model_dir = make_model_dir(tmp_path)
    args = [a if a is not None else str(tmp_path / "data") for a in ARGS]
    args[args.index("--iters") + 1] = "8"
    proc = subprocess.Popen([sys.executable, "-m", "mlx_specstream.cli", "train", "--model", str(model_dir),
                             "--out", "x", *args, "-j", "1", "--no-self-distill"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    proc.stderr.read(1)  # the run has begun: its reader goes away
    proc.stderr.close()
    assert proc.wait(timeout=300) == 0
    assert (model_dir / "adapters" / "x" / "adapter.safetensors").is_file()
    report = json.loads((model_dir / "adapters" / "x" / "training_report.json").read_text())
    assert report["history"][-1]["step"] == 8
