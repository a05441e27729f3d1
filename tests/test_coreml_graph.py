"""The PyTorch export graph computes the MLX engine's step (fp32, <= 1e-4 on logits).

No coremltools here: the graph that coremltools converts is run by torch itself, with an fp32
cache, against the engine's recorded forward passes (prefill, one-node first step, tree steps
with commit, pruning, streams on every node).
"""

import numpy as np
import pytest
from helpers import tiny_model
from test_coreml_common import record_engine, replay, torch_runner

from mlx_specstream.adapter import fuse, new_adapter
from mlx_specstream.coreml_driver import commit_inputs, prefill_chunks, tree_inputs
from mlx_specstream.errors import UnsupportedModelError
from mlx_specstream.tree import build_tree, chain

torch = pytest.importorskip("torch")
from mlx_specstream.convert.torch_graph import SpecStreamGraph, graph_config  # noqa: E402

PROMPT = [5, 9, 2, 7, 11, 3, 8, 1, 4]


def check_graph(model, tree_size=16, chunk=4, context=96, max_tokens=32, tol=1e-4):
    rec = record_engine(model, PROMPT, max_tokens=max_tokens, tree_budget=tree_size)
    gc = graph_config(model, context, tree_size, chunk, sampling=True)
    graph = SpecStreamGraph(model, gc, cache_dtype=torch.float32).eval()
    err = replay(torch_runner(graph), rec, PROMPT, tree_size=tree_size, chunk=chunk, context=context,
                 accept_max=gc.accept_max)
    assert err["steps"] >= 8
    assert err["prefill"] <= tol and err["main"] <= tol and err["stream"] <= tol, err
    return rec, err


@pytest.mark.parametrize("mode,threshold", [("lossless", 0.0), ("lossless", 0.05), ("shared", 0.0),
                                            ("shared", 0.05)])
def test_graph_equals_engine(mode, threshold):
    model = tiny_model("llama", seed=3, scale=2.0)
    new_adapter(model, mode=mode, gamma=3, msa_layers=2, seed=1, prune_threshold=threshold)
    rec, _ = check_graph(model)
    if threshold > 0:
        assert any(len(p["out"].kept) < len(p["tree"]) for p in rec.passes[1:]), "pruning never happened"


@pytest.mark.parametrize("mode", ["lossless", "shared"])
def test_tuned_adapter_exports_with_its_fine_tune_folded(mode):
    """A tuned lossless or split shared adapter (every-row LoRA under the streams' stream-only
    LoRA): refused while the every-row LoRA is nested, equal to the engine once ``fuse`` folds it
    into the weights."""
    model = tiny_model("llama", seed=3, scale=2.0)
    new_adapter(model, mode=mode, gamma=3, msa_layers=2, seed=1, main_rank=4)
    with pytest.raises(UnsupportedModelError, match="folded"):
        SpecStreamGraph(model, graph_config(model, 64, 8, 4))
    assert fuse(model)
    check_graph(model, tree_size=8)


def test_graph_equals_engine_qwen2_tied_and_init():
    """qwen2 (q/k/v biases, tied head), a stream-init adapter and the prune layer below N - N_s."""
    model = tiny_model("qwen2", seed=2, scale=2.0)
    new_adapter(model, mode="lossless", gamma=2, msa_layers=2, seed=4, stream_init_rank=4, prune_layer=1,
                prune_threshold=0.02)
    check_graph(model, tree_size=8)


@pytest.mark.parametrize("bits", [4, 8])
def test_graph_equals_quantized_engine(bits):
    """The graph runs MLX's dequantized values; MLX runs its quantized kernels."""
    from mlx_specstream.loader import quantize_model

    model = tiny_model("llama", seed=3, scale=2.0)
    new_adapter(model, mode="shared", gamma=3, msa_layers=2, seed=1)
    quantize_model(model, bits, 32)
    graph = SpecStreamGraph(model, graph_config(model, 64, 8, 4))
    assert len(graph.quantized_weights()) == 4 * 7 + 2
    check_graph(model, tree_size=8, max_tokens=20)


def test_graph_without_adapter_is_the_base_model():
    from mlx_specstream.api import generate

    model = tiny_model("llama", seed=5, scale=2.0)
    gc = graph_config(model, 64, 4, 4, sampling=True)
    assert gc.gamma == 0 and gc.branch == 1
    graph = SpecStreamGraph(model, gc, cache_dtype=torch.float32)
    run = torch_runner(graph)
    ar = generate(model, None, PROMPT, max_tokens=12, mode="ar").tokens
    for inputs in prefill_chunks(PROMPT[:-1], 4, 64):
        run("prefill", inputs)
    n, prev, tok, out_tokens = len(PROMPT) - 1, [], PROMPT[-1], []
    for _ in range(12):  # the root of each call is the previous token; its path is [0]
        out = run("step", {**tree_inputs(chain([tok]), n, 4), **commit_inputs(prev, gc.accept_max)})
        tok = int(out["main_token"][0])
        out_tokens.append(tok)
        n, prev = n + 1, [0]
    assert out_tokens == ar


@pytest.mark.parametrize("arch", ["opt", "phi"])
def test_other_architectures_are_refused(arch):
    model = tiny_model(arch)
    with pytest.raises(UnsupportedModelError, match="llama family"):
        graph_config(model, 64, 4, 4)


def test_lora_mode_adapter_is_refused():
    model = tiny_model("llama")
    new_adapter(model, mode="lora", msa_layers=2)
    with pytest.raises(UnsupportedModelError, match="no speculative streams"):
        graph_config(model, 64, 4, 4)


def test_fixed_size_inputs():
    tree = build_tree(7, [[1, 2], [3]], [[-0.1, -0.5], [-0.2]], 4)
    inp = tree_inputs(tree, 10, 6)
    assert inp["tokens"].tolist() == [7, 1, 2, 3, 0, 0]
    assert inp["positions"].tolist() == [10, 11, 11, 12, 10, 10]
    assert inp["valid"].tolist() == [1, 1, 1, 1, 0, 0]
    assert inp["tree_mask"][3].tolist() == [1, 1, 0, 1, 0, 0]
    assert not inp["tree_mask"][4:].any()
    c = commit_inputs([0, 1, 3], 5)
    assert c["accepted"].tolist() == [0, 1, 3, 0, 0] and c["n_accepted"].tolist() == [3]
    chunks = list(prefill_chunks(list(range(10)), 4, 12))
    assert [int(c["start"][0]) for c in chunks] == [0, 4, 8]
    assert [int(c["length"][0]) for c in chunks] == [4, 4, 2]
    # a last chunk that would pass the context moves back and re-feeds cached tokens
    chunks = list(prefill_chunks(list(range(10)), 4, 10))
    assert [(int(c["start"][0]), int(c["length"][0])) for c in chunks] == [(0, 4), (4, 4), (6, 4)]
    assert np.array_equal(chunks[-1]["tokens"], [6, 7, 8, 9])


def test_norm_holds_in_float16():
    """A float16 package's RMS norm of a residual stream with values in the hundreds (the shipped
    model's reach 384) stays finite and equals the float32 norm: its squares would not fit."""
    model = tiny_model("llama", seed=5)
    graph = SpecStreamGraph(model, graph_config(model, 64, 4, 4), cache_dtype=torch.float32)
    x = torch.tensor([[384.0, -300.0, 0.5] + [2.0] * (model.args.hidden_size - 3)])
    w = torch.full((model.args.hidden_size,), 1.5)
    assert not torch.isfinite(x.half().pow(2)).all()  # the plain formula overflows
    ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + graph.gc.eps) * w
    half = graph._norm(x.half(), w.half()).float()
    assert torch.isfinite(half).all() and torch.allclose(half, ref, rtol=2e-3, atol=2e-3)
    assert torch.allclose(graph._norm(x, w), ref, rtol=1e-6, atol=1e-6)
    zero = graph._norm(torch.zeros_like(x).half(), w.half())
    assert torch.equal(zero, torch.zeros_like(zero))
