"""Lossless greedy decoding: Speculative Streaming output == autoregressive output."""

import itertools

import mlx.core as mx
import numpy as np
import pytest
from helpers import tiny_model

from mlx_specstream.adapter import detach, new_adapter
from mlx_specstream.api import generate
from mlx_specstream.device import on_gpu
from mlx_specstream.engine import DecodeOptions, Decoder
from mlx_specstream.kv_cache import make_cache


def divergence(model, prompt, a, b):
    """Where two outputs first differ and the base model's top-2 logit margin there."""
    i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    logits = model(mx.array([list(prompt) + list(a[:i])]))[0, -1]
    top = np.sort(np.array(logits))[-2:]
    return f"first difference at token {i}: {a[i:i + 3]} vs {b[i:i + 3]}, margin {top[1] - top[0]:.2e}"


def check_lossless(model, prompt, n=200, **kw):
    ar = generate(model, None, prompt, max_tokens=n, mode="ar")
    ss = generate(model, None, prompt, max_tokens=n, **kw)
    assert ss.tokens == ar.tokens, divergence(model, prompt, ar.tokens, ss.tokens)
    assert len(ss.tokens) == n
    return ss


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama", seed=3, scale=2.0)


GRID = list(itertools.product([1, 2, 4], [1, 3], [0.0, 0.2], [6, 32], ["tree", "deferred"]))


@pytest.mark.parametrize("gamma,branch,threshold,budget,streams", GRID)
def test_lossless_greedy_llama(llama, gamma, branch, threshold, budget, streams):
    new_adapter(llama, gamma=4, msa_layers=2, seed=gamma * 7 + branch)
    ss = check_lossless(llama, [5, 9, 2, 7], gamma=gamma, branch=branch, prune_threshold=threshold,
                        tree_budget=budget, streams=streams, node_cost=0.0, lookup=False)
    expected_nodes = min(budget, 1 + sum(branch**g for g in range(1, gamma + 1)))
    assert ss.stats.tree_nodes == expected_nodes * ss.stats.calls
    if threshold == 0:
        assert ss.stats.kept_nodes == ss.stats.tree_nodes


def test_tree_size_follows_node_cost(llama):
    """Dearer nodes, smaller trees; the output stays the base model's at every size."""
    new_adapter(llama, gamma=4, msa_layers=2, seed=5)
    sizes = []
    for cost in (0.0, 0.05, 0.3, 100.0):
        ss = check_lossless(llama, [2, 8], n=120, branch=3, tree_budget=16, node_cost=cost, lookup=False)
        sizes.append(ss.stats.tree_nodes / ss.stats.calls)
    assert sizes[0] == 16 and sizes[-1] == 1  # the whole budget; the root alone (AR with streams)
    assert sizes == sorted(sizes, reverse=True) and sizes[1] > sizes[2]
    with pytest.raises(ValueError, match="node_cost"):
        generate(llama, None, [1], max_tokens=2, node_cost=-1.0)


def test_the_rejected_draft_is_one_the_pass_ran():
    """--verbose's red draft is the best branch of the tree below the last accepted node: a
    verified and rejected draft, never the token just written (it once was the streams' top
    candidates, whether or not the cut tree held them), and none where the tree ended there."""
    from mlx_specstream.api import stream_generate

    model = tiny_model()  # (whose drafts are often wrong)
    new_adapter(model, gamma=4, msa_layers=2, seed=5)
    for cost in (0.0, 100.0):
        steps = list(stream_generate(model, None, [2, 8], max_tokens=60, branch=3, tree_budget=16,
                                     node_cost=cost, lookup=False))
        assert all(s.rejected[0] != s.tokens[-1] for s in steps if s.rejected and s.finish_reason is None)
        if cost == 100.0:  # the root alone: nothing below it was run
            assert all(not s.rejected for s in steps)
        else:
            assert any(s.rejected for s in steps)


def test_default_node_cost_is_the_machines():
    from mlx_specstream.engine import CPU_NODE_COST

    model = tiny_model("llama")
    new_adapter(model, gamma=2, msa_layers=2)
    for streams in ("tree", "deferred"):
        d = Decoder(model, [1, 2], DecodeOptions(streams=streams))
        assert d.node_cost == (0.0 if on_gpu() else CPU_NODE_COST[streams])
    assert Decoder(model, [1, 2], DecodeOptions(node_cost=0.25)).node_cost == 0.25
    assert Decoder(model, [1, 2], DecodeOptions(mode="ar")).node_cost == 0.0


def test_grid_exercises_multi_token_acceptance(llama):
    new_adapter(llama, gamma=4, msa_layers=2, seed=0)
    longest = 0
    for prompt in ([1], [3, 3], [8, 1, 2]):
        ss = check_lossless(llama, prompt, n=150, branch=3, node_cost=0.0)
        longest = max(longest, max(ss.stats.accepted_lengths))
    assert longest >= 3, "random streams never got a draft accepted: the test would be vacuous"


@pytest.mark.parametrize("arch", ["qwen2", "opt", "phi"])
def test_lossless_greedy_other_architectures(arch):
    model = tiny_model(arch, seed=1, scale=2.0)
    new_adapter(model, gamma=3, msa_layers=2, seed=4)
    check_lossless(model, [4, 1, 6], branch=3, prune_threshold=0.1, streams="tree")
    check_lossless(model, [4, 1, 6], branch=3, prune_threshold=0.1, streams="deferred")
    check_lossless(model, [4], n=100, branch=1)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_lossless_with_the_attention_of_cuda(arch, monkeypatch):
    """On CUDA decode passes run ``matmul_attention`` instead of cuDNN's (``device.on_cuda``),
    taken here as on an NVIDIA GPU: greedy SS with a tree and streams on every node (the GPU
    policy) still gives AR's tokens, and the path was used."""
    from mlx_specstream.kernels import attention

    used = []
    monkeypatch.setattr(attention, "on_cuda", lambda: True)
    monkeypatch.setattr(attention, "matmul_attention",
                        lambda *a, f=attention.matmul_attention: used.append(a[0].shape[2]) or f(*a))
    model = tiny_model(arch, seed=1, scale=2.0)
    new_adapter(model, gamma=3, msa_layers=2, seed=4)
    check_lossless(model, [4, 1, 6], n=120, branch=3, streams="tree", node_cost=0.0)
    assert max(used) > 4


@pytest.mark.parametrize("streams", ["tree", "deferred"])
def test_long_prompt_prefilled_through_the_host_softmax_is_lossless(llama, streams):
    """A prompt longer than a decode-sized pass prefills through ``attention.sdpa``'s NumPy softmax
    on a CPU (kernels/host_math.py); plain and speculative decoding still give the same tokens."""
    new_adapter(llama, gamma=3, msa_layers=2, seed=11)
    prompt = [int(t) for t in np.random.default_rng(4).integers(1, 60, 100)]
    ss = check_lossless(llama, prompt, n=120, branch=3, streams=streams, node_cost=0.0)
    assert max(ss.stats.accepted_lengths) >= 2


def test_deferred_and_tree_streams_draft_the_same(llama):
    new_adapter(llama, gamma=3, msa_layers=2, seed=8)
    a = generate(llama, None, [2, 7], max_tokens=80, branch=3, streams="tree", node_cost=0.1, lookup=False)
    b = generate(llama, None, [2, 7], max_tokens=80, branch=3, streams="deferred", node_cost=0.1,
                 lookup=False)
    assert [s.accepted for s in a.steps] == [s.accepted for s in b.steps]


def test_one_token_prompt_and_msa_layers(llama):
    for msa in (1, 4):
        new_adapter(llama, gamma=2, msa_layers=msa, seed=msa)
        check_lossless(llama, [0], branch=2, streams="tree")
        check_lossless(llama, [0], branch=2, streams="deferred")


def test_stream_init_and_pruning_layer_options(llama):
    new_adapter(llama, gamma=3, msa_layers=2, seed=5, stream_init_rank=4, prune_layer=1)
    check_lossless(llama, [2, 2], branch=3, prune_threshold=0.3)


def test_eos_inside_an_accepted_draft(llama):
    new_adapter(llama, gamma=4, msa_layers=2, seed=0)
    found = None
    for prompt in ([1], [3, 3], [8, 1, 2], [5]):
        ss = generate(llama, None, prompt, max_tokens=150, branch=3, node_cost=0.0)
        seen = set()
        for step in ss.steps:
            for i, t in enumerate(step.accepted[:-1] if len(step.accepted) > 1 else []):
                if t not in seen and t not in prompt and all(t != x for x in step.accepted[:i]):
                    found = (prompt, t)
                    break
            seen.update(step.tokens)
            if found:
                break
        if found:
            break
    assert found, "no multi-token accepted draft to put an EOS in"
    prompt, eos = found

    class Tok:
        eos_token_ids = {eos}

        def detokenizer(self):
            return None

    ar = generate(llama, Tok(), prompt, max_tokens=150, mode="ar")
    ss = generate(llama, Tok(), prompt, max_tokens=150, branch=3, node_cost=0.0)
    assert ss.tokens == ar.tokens and ss.finish_reason == ar.finish_reason == "stop"
    assert eos not in ss.tokens


@pytest.mark.parametrize("mode", ["ss", "ar"])
def test_a_generation_refuses_to_go_on_once_its_model_has_another_adapter(mode, tmp_path):
    """A paused generator resumed after ``new_adapter``/``detach`` on its model: one clear error,
    not a crash deep in the engine or a silent switch of adapter half-way through the text."""
    from mlx_specstream.api import stream_generate
    from mlx_specstream.errors import AdapterError

    model = tiny_model("llama", seed=0)
    for change in (lambda: new_adapter(model, gamma=2, msa_layers=2, seed=1), lambda: detach(model)):
        new_adapter(model, gamma=2, msa_layers=2, seed=0)
        steps = stream_generate(model, None, [5, 6], max_tokens=40, mode=mode, node_cost=0.0)
        next(steps)
        change()
        with pytest.raises(AdapterError, match="adapter changed during this generation"):
            list(steps)
    # a load that fails half-way leaves the adapter the generation began with: it goes on
    from mlx_specstream.adapter import load_adapter, save_adapter

    new_adapter(model, gamma=2, msa_layers=2, seed=3)
    save_adapter(model, tmp_path / "bad")
    (tmp_path / "bad" / "ngrams.npz").write_bytes(b"not a table")  # read after the weights are attached
    new_adapter(model, gamma=2, msa_layers=2, seed=0)
    whole = generate(model, None, [5, 6], max_tokens=40, mode=mode, node_cost=0.0).tokens
    steps = stream_generate(model, None, [5, 6], max_tokens=40, mode=mode, node_cost=0.0)
    first = next(steps).tokens
    with pytest.raises(AdapterError, match="corrupt n-gram table"):
        load_adapter(model, tmp_path / "bad")
    assert first + [t for s in steps for t in s.tokens] == whole


def test_an_eos_past_the_limit_in_an_accepted_draft_is_a_length_finish(llama):
    """A pass that accepts the limit's last token and an EOS after it ends as plain decoding
    does, which never writes that EOS: "length". Each pass counts the tokens it advanced the
    output by, none past the limit. Without a tokenizer, each pass's tokens stream as it ends."""
    from mlx_specstream.api import stream_generate

    new_adapter(llama, gamma=4, msa_layers=2, seed=0)
    steps = list(stream_generate(llama, None, [5], max_tokens=60, branch=3, node_cost=0.0))
    passes = [r.tokens for r in steps]
    out = [t for p in passes for t in p]
    # each step's statistics are those up to it, as mlx-lm's responses (not one shared, final object)
    assert [r.stats.generated_tokens for r in steps] == list(np.cumsum([len(p) for p in passes]))
    assert out == generate(llama, None, [5], max_tokens=60, mode="ar").tokens and len(passes) > 10
    # a pass of two or more tokens whose last token is new in the output: that token as EOS
    start = [sum(map(len, passes[:i])) for i in range(len(passes))]
    end = next(s + len(p) - 1 for s, p in zip(start, passes) if len(p) > 1 and s > 0
               and p[-1] not in out[:s + len(p) - 1])

    class Tok:
        eos_token_ids = {out[end]}

        def detokenizer(self):
            return None

    ar = generate(llama, Tok(), [5], max_tokens=end, mode="ar")
    ss = generate(llama, Tok(), [5], max_tokens=end, branch=3, node_cost=0.0)
    assert ss.tokens == ar.tokens == out[:end] and ss.finish_reason == ar.finish_reason == "length"
    for res in (ar, ss):
        advanced = sum(k * c for k, c in res.stats.accepted_lengths.items())
        assert advanced == res.stats.generated_tokens - 1


def test_max_tokens_is_exact(llama):
    new_adapter(llama, gamma=4, msa_layers=2, seed=0)
    for n in (1, 2, 5, 17):
        out = generate(llama, None, [1, 2], max_tokens=n, branch=3, streams="deferred")
        assert len(out.tokens) == n and out.finish_reason == "length"
        # a pass advances by what it emits, and no stream pass drafts for a step that never comes
        assert sum(k * c for k, c in out.stats.accepted_lengths.items()) == n - 1
        assert out.stats.stream_passes <= out.stats.calls
    out = generate(llama, None, [1, 2], max_tokens=9, streams="deferred", tree_budget=1, lookup=False)
    assert out.stats.stream_passes == 0  # a tree of one node holds no draft


def test_kv_commit_equals_recomputed_cache(llama):
    new_adapter(llama, gamma=3, msa_layers=2, seed=2)
    prompt = [3, 1, 4, 1, 5]
    dec = Decoder(llama, prompt, DecodeOptions(max_tokens=60, branch=3, prune_threshold=0.1,
                                               streams="tree"))
    emitted = []
    for step in dec.steps():
        emitted += step.tokens
    # the cache holds the prompt and every emitted token except the last root
    seq = prompt + emitted[:-1]
    assert dec.runner.n == len(seq)
    fresh = make_cache(llama)
    detach_cfg = llama.adapter_config
    llama(mx.array([seq]), cache=fresh)
    assert detach_cfg is llama.adapter_config
    for c_ss, c_ref in zip(dec.runner.caches, fresh):
        k1, v1 = c_ss.state
        k2, v2 = c_ref.state
        np.testing.assert_allclose(np.array(k1), np.array(k2), atol=1e-5)
        np.testing.assert_allclose(np.array(v1), np.array(v2), atol=1e-5)


def test_ss_without_adapter_is_a_clear_error():
    model = tiny_model("llama")
    with pytest.raises(ValueError, match="adapter"):
        generate(model, None, [1], max_tokens=3)
    assert len(generate(model, None, [1], max_tokens=3, mode="ar").tokens) == 3
    with pytest.raises(ValueError, match="empty"):
        generate(model, None, [], max_tokens=3, mode="ar")


def test_ar_with_lossless_adapter_equals_base(llama):
    detach(llama)
    base = generate(llama, None, [7, 7], max_tokens=50, mode="ar").tokens
    new_adapter(llama, gamma=2, msa_layers=2, seed=9)
    assert generate(llama, None, [7, 7], max_tokens=50, mode="ar").tokens == base
    assert generate(llama, None, [7, 7], max_tokens=50, branch=2).tokens == base


def test_prompt_lookup_is_lossless_and_drafts_from_history():
    from mlx_specstream.lookup import lookup_match

    def prompt_lookup(history, num_draft):
        return lookup_match(history, 3, num_draft)[0]

    assert prompt_lookup([1, 2, 3, 9, 1, 2], num_draft=2) == [3, 9]
    assert prompt_lookup([5, 6, 7], num_draft=3) == []
    model = tiny_model("llama", seed=3, scale=2.0)
    ar = generate(model, None, [1, 2, 3, 1, 2], max_tokens=120, mode="ar")
    pl = generate(model, None, [1, 2, 3, 1, 2], max_tokens=120, mode="lookup")
    assert pl.tokens == ar.tokens
    assert pl.stats.calls < ar.stats.calls  # repetitive random-model output is easy to look up


def test_hybrid_drafts_are_lossless_and_add_lookup_candidates(llama):
    """Prompt-lookup candidates merged into the streams' tree (the default): the output is still
    the base model's, and on the repetitive output of a random model they are accepted, so more
    tokens advance per pass than with the (random) streams alone."""
    new_adapter(llama, gamma=3, msa_layers=2, seed=4)
    prompt = [1, 2, 3, 1, 2]
    both = check_lossless(llama, prompt, n=120, branch=2, tree_budget=12)
    streams = check_lossless(llama, prompt, n=120, branch=2, tree_budget=12, lookup=False)
    assert both.stats.mean_accepted_tokens > streams.stats.mean_accepted_tokens
    # sampling runs too (exact in distribution: tests/test_sampling.py)
    assert len(generate(llama, None, prompt, max_tokens=40, temperature=0.7, seed=1).tokens) == 40


def test_without_a_seed_mlx_random_seed_repeats_a_sample(llama):
    """No ``seed``: each sample draws one from MLX's generator, so ``mx.random.seed`` repeats it as
    it repeats mlx-lm's sampling (a notebook walkthrough expected it), and the draws go on apart."""
    new_adapter(llama, gamma=3, msa_layers=2, seed=4)
    samples = []
    for reseed in (True, True, False):
        if reseed:
            mx.random.seed(42)
        samples.append(generate(llama, None, [1, 2, 3], max_tokens=40, temperature=1.0).tokens)
    assert samples[0] == samples[1] != samples[2]


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_lookup_chain_alone_skips_the_deferred_stream_pass_when_it_pays(llama, temperature):
    """With deferred streams, a step whose lookup chain promises more tokens per unit of cost than
    the steps drafted with streams so far drafts from the chain alone, with no stream pass; with
    streams that promise more, every step runs one. Greedy output stays the base model's."""
    from mlx_specstream.engine import _Rate

    new_adapter(llama, gamma=3, msa_layers=2, seed=4)
    prompt = [1, 2, 3, 1, 2]
    ar = generate(llama, None, prompt, max_tokens=100, mode="ar")
    runs = {}
    rates = {"streams pay": _Rate(1000.0, 1.0, weight=0.0), "chain pays": _Rate(0.0, 1.0, weight=0.0)}
    for name, rate in rates.items():
        dec = Decoder(llama, prompt, DecodeOptions(max_tokens=100, branch=2, streams="deferred",
                                                   temperature=temperature, seed=3))
        dec.stream_rate = rate
        tokens = [t for step in dec.steps() for t in step.tokens]
        assert len(tokens) == 100
        if temperature == 0:
            assert tokens == ar.tokens
        runs[name] = dec.stats
    # one after the prefill and after every pass but the last, which ends the generation
    assert runs["streams pay"].stream_passes == runs["streams pay"].calls
    assert 0 < runs["chain pays"].stream_passes < runs["chain pays"].calls / 2


def test_stream_rate_follows_the_steps_drafted_with_streams(llama):
    """The default: the steps drafted with streams update the running rate the chain is weighed
    against; on this repetitive output, lookup chains skip part of the stream passes."""
    new_adapter(llama, gamma=3, msa_layers=2, seed=4)
    dec = Decoder(llama, [1, 2, 3, 1, 2], DecodeOptions(max_tokens=100, branch=2, streams="deferred",
                                                        node_cost=0.15))
    prior = dec.stream_rate.value
    list(dec.steps())
    assert dec.stream_rate.value != prior
    assert 0 < dec.stats.stream_passes < dec.stats.calls + 1


@pytest.mark.parametrize("eos_at,max_tokens", [(None, 20), (6, 20), (0, 20), (None, 1)])
def test_greedy_ar_equals_recomputing_every_token(eos_at, max_tokens):
    """Greedy AR (pipelined: each pass is queued before the host reads the previous token) is
    the argmax of the whole sequence recomputed from scratch at every token; it stops at EOS and
    at max_tokens, and leaves the cache holding the prompt and every emitted token but the last."""
    model = tiny_model("llama", seed=3, scale=2.0)
    prompt = [5, 3, 9]
    seq = list(prompt)
    for _ in range(max_tokens):
        seq.append(int(mx.argmax(model(mx.array([seq]))[0, -1])))
    ref = seq[len(prompt):]
    eos = frozenset() if eos_at is None else frozenset([ref[eos_at]])
    if eos:
        ref = ref[: ref.index(ref[eos_at])]
    dec = Decoder(model, prompt, DecodeOptions(max_tokens=max_tokens, mode="ar", eos_token_ids=eos))
    steps = list(dec.steps())
    tokens = [t for s in steps for t in s.tokens]
    assert tokens == ref
    assert steps[-1].finished == ("stop" if eos else "length") and all(s.finished is None for s in steps[:-1])
    held = len(prompt) + len(tokens) - (0 if eos else 1)  # an EOS root is not cached either
    assert dec.runner.n == held and all(c.offset == held for c in dec.runner.caches)
    fresh = make_cache(model)
    model(mx.array([(prompt + tokens)[:held]]), cache=fresh)
    for c, f in zip(dec.runner.caches, fresh):
        np.testing.assert_allclose(np.array(c.state[0]), np.array(f.state[0]), atol=1e-5)
