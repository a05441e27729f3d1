"""The families beyond llama/opt/phi (``FAMILIES``): import from Hugging Face directories,
parity with ``transformers``, lossless Speculative Streaming, adapter training and int8/int4
loading on each family.

Tiny random fp32 models are made with ``transformers`` from configs (no download); their norm
weights are randomised too (HF initialises them to one or zero, which would hide Gemma's
``1 + w``). Gemma 2's and 3's sliding window (8) is shorter than the prompts, so every check below
also covers windowed layers, on main rows and on stream rows; Gemma 2's attention soft-cap (3) is
small enough to change every score.

Core ML export: the torch graph that coremltools converts equals the engine on every family
(fp32 cache, fast); the saved package, run by the package evaluator, equals the engine with an
fp16 cache (Gemma in the default suite, the others with ``-m slow``: an export takes ~15 s).
"""

import json
import shutil

import mlx.core as mx
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_import import convert_ok, mlx_lm_dir, mlx_logits, torch_logits  # noqa: E402
from test_train import lossless_stream_logits  # noqa: E402

from mlx_specstream import load  # noqa: E402
from mlx_specstream.adapter import adapter_weights, detach, new_adapter  # noqa: E402
from mlx_specstream.api import generate  # noqa: E402
from mlx_specstream.convert.hf_import import convert  # noqa: E402
from mlx_specstream.data import Dataset, Example  # noqa: E402
from mlx_specstream.loader import load_model  # noqa: E402
from mlx_specstream.streams import forward, stream_pass  # noqa: E402
from mlx_specstream.trainer import train  # noqa: E402
from mlx_specstream.tree import chain  # noqa: E402

TOL = 1e-4
WINDOW = 8
SMALL = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=128,
             num_hidden_layers=4, vocab_size=100, initializer_range=0.2, pad_token_id=0, bos_token_id=1,
             eos_token_id=None)  # no EOS: every generation runs its whole length
SLIDING, GLOBAL = "sliding_attention", "full_attention"

# name: (config, how the checkpoint is saved)
FAMILIES = {
    "smollm3": (lambda: transformers.SmolLM3Config(**SMALL, no_rope_layer_interval=2), "sharded"),
    "gemma3": (lambda: transformers.Gemma3TextConfig(  # (an attention cap transformers does not apply)
        **SMALL, sliding_window=WINDOW, layer_types=[SLIDING, GLOBAL, SLIDING, SLIDING],
        query_pre_attn_scalar=24, final_logit_softcapping=30.0, attn_logit_softcapping=3.0,
        rope_parameters={GLOBAL: {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6},
                         SLIDING: {"rope_type": "default", "rope_theta": 1e4}}), "safetensors"),
    "qwen3": (lambda: transformers.Qwen3Config(**SMALL, tie_word_embeddings=True), "safetensors"),
    "qwen3_moe": (lambda: transformers.Qwen3MoeConfig(  # the second layer dense, as mlp_only_layers can
        **SMALL, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True,
        mlp_only_layers=[1]), "safetensors"),
    "mixtral": (lambda: transformers.MixtralConfig(**SMALL, num_local_experts=4, num_experts_per_tok=2,
                                                   sliding_window=WINDOW), "safetensors"),
    "gemma": (lambda: transformers.GemmaConfig(**SMALL, hidden_act="gelu"), "safetensors"),
    "gemma2": (lambda: transformers.Gemma2Config(
        **SMALL, sliding_window=WINDOW, query_pre_attn_scalar=24, attn_logit_softcapping=3.0,
        final_logit_softcapping=30.0), "safetensors"),
}
MIXTURES = ("qwen3_moe", "mixtral")  # of experts: no Core ML export
EXPORTED = [n for n in FAMILIES if n not in MIXTURES]
PROMPT = np.random.default_rng(1).integers(0, 100, (1, 20))  # longer than the window


def make_hf(name, root, **overrides):
    config_fn, fmt = FAMILIES[name]
    torch.manual_seed(0)
    config = config_fn()
    for key, value in overrides.items():
        setattr(config, key, value)
    if getattr(config, "no_rope_layers", None):  # SmolLM3's, one per layer: as many as are left
        config.no_rope_layers = config.no_rope_layers[:config.num_hidden_layers]
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.copy_(torch.randn_like(p) * 0.3 + (0.0 if name.startswith("gemma") else 1.0))
    path = root / name
    model.save_pretrained(path, **({"max_shard_size": "40KB"} if fmt == "sharded" else {}))
    assert (path / "model.safetensors.index.json").is_file() == (fmt == "sharded")
    return model, path


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    """name -> (torch model, HF dir, converted MLX dir); sharded checkpoints go through the CLI."""
    root = tmp_path_factory.mktemp("families")
    out = {}
    for name in FAMILIES:
        hf, path = make_hf(name, root)
        dest = root / f"{name}-mlx"
        if FAMILIES[name][1] == "sharded":
            convert_ok(path, dest)
        else:
            convert(path, dest)
        out[name] = (hf, path, dest)
    return out


@pytest.mark.parametrize("name", list(FAMILIES))
def test_logits_match_transformers(families, name):
    hf, _, dst = families[name]
    model, _ = load(dst)
    ref = torch_logits(hf, PROMPT)
    for prefill in (None, 5, 1):  # whole prompt; prefill then token-by-token decoding
        got = mlx_logits(model, PROMPT, prefill)
        err = np.abs(got - ref).max()
        assert err < TOL, f"{name} (prefill {prefill}): differs by {err}"


def test_windows_norms_and_caps_are_exercised(families, monkeypatch):
    """The oracle would not catch a missing window, (1 + w) or soft-cap if they made no difference."""
    hf, _, dst = families["gemma3"]
    model, _ = load(dst)
    assert [layer.self_attn.window for layer in model.layers] == [WINDOW, None, WINDOW, WINDOW]
    ref = torch_logits(hf, PROMPT)
    for layer in model.layers:
        layer.self_attn.window = None
    assert np.abs(mlx_logits(model, PROMPT) - ref).max() > 100 * TOL
    hf, _, dst = families["gemma2"]
    model, _ = load(dst)
    assert [layer.self_attn.window for layer in model.layers] == [WINDOW, None] * 2
    assert {layer.self_attn.softcap for layer in model.layers} == {3.0}
    ref = torch_logits(hf, PROMPT)
    from mlx_specstream.kernels import attention

    monkeypatch.setattr(attention, "CAPPED_ROWS", 7)  # a prefill in blocks of rows (three here)
    assert np.abs(mlx_logits(model, PROMPT) - ref).max() < TOL
    monkeypatch.undo()
    for layer in model.layers:
        layer.self_attn.softcap = None
    assert np.abs(mlx_logits(model, PROMPT) - ref).max() > 100 * TOL
    smol, _ = load(families["smollm3"][2])
    assert [layer.self_attn.rope is None for layer in smol.layers] == [False, True, False, True]


def test_unsupported_option_is_one_line(families, tmp_path):
    from test_import import bad

    src = tmp_path / "src"
    shutil.copytree(families["gemma3"][1], src)
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**cfg, "use_bidirectional_attention": True}))
    bad(src, tmp_path / "out", "Gemma with use_bidirectional_attention is not supported")


def test_gemma_reads_gelu_as_transformers_does(families, tmp_path):
    """The released Gemma configs say ``"hidden_act": "gelu"``; transformers runs the tanh form
    they were trained with, and so does the import."""
    _, path, _ = families["gemma"]
    src = tmp_path / "src"
    shutil.copytree(path, src)
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**cfg, "hidden_act": "gelu"}))
    hf = transformers.AutoModelForCausalLM.from_pretrained(src).eval()
    model, _ = load(convert(src, tmp_path / "out"))
    assert np.abs(mlx_logits(model, PROMPT) - torch_logits(hf, PROMPT)).max() < TOL


@pytest.mark.parametrize("family", ["qwen3", "llama", "qwen2"])
def test_head_dim_default_follows_transformers(family):
    """A config without ``head_dim`` gets the head size ``transformers`` gives it (Qwen3: 128,
    not hidden_size / heads)."""
    from mlx_specstream.arch import qwen3

    hf = transformers.AutoConfig.for_model(family, hidden_size=64, num_attention_heads=4)
    cfg = {k: v for k, v in hf.to_dict().items() if k != "head_dim"}
    args = (qwen3.Args if family == "qwen3" else qwen3.llama.Args).from_dict(cfg)
    assert args.head_dim == (getattr(hf, "head_dim", None) or 64 // 4)


def test_mistral_sliding_window(tmp_path):
    """Mistral's ``sliding_window`` covers every layer (its configs have no ``layer_types``)."""
    torch.manual_seed(0)
    cfg = transformers.MistralConfig(**{**SMALL, "head_dim": None}, sliding_window=WINDOW)
    hf = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    hf.save_pretrained(tmp_path / "hf")
    model, _ = load(convert(tmp_path / "hf", tmp_path / "mlx"))
    assert {layer.self_attn.window for layer in model.layers} == {WINDOW}
    ref = torch_logits(hf, PROMPT)
    for prefill in (None, 5):
        assert np.abs(mlx_logits(model, PROMPT, prefill) - ref).max() < TOL


def test_phi3_longrope(tmp_path):
    """Phi-3.5's and Phi-4-mini's LongRoPE (here with a partial rotary, as Phi-4-mini's): within its
    original context the short factors and the attention factor, equal to transformers; the
    model holds that many tokens (past them transformers switches to the long factors for each
    call's every position, keys already cached by the short ones)."""
    torch.manual_seed(0)
    rope = {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0, 1.5, 2.0, 3.0],
            "long_factor": [5.0, 6.0, 7.0, 8.0], "original_max_position_embeddings": 32}
    cfg = transformers.Phi3Config(**SMALL, max_position_embeddings=128,
                                  original_max_position_embeddings=32, partial_rotary_factor=0.5,
                                  rope_parameters=rope)
    hf = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    hf.save_pretrained(tmp_path / "hf")
    model, _ = load(convert(tmp_path / "hf", tmp_path / "mlx"))
    assert model.max_positions == 32 and model.layers[0].self_attn.rope.attention_factor > 1
    ref = torch_logits(hf, PROMPT)
    for prefill in (None, 5):
        assert np.abs(mlx_logits(model, PROMPT, prefill) - ref).max() < TOL
    out = generate(model, None, PROMPT[0].tolist(), max_tokens=-1, mode="ar")
    assert len(PROMPT[0]) + len(out.tokens) == 32  # to the end of the context it holds


def test_gemma3_multimodal_checkpoint(families, tmp_path):
    """A ``gemma3`` checkpoint: the text model of its ``text_config`` (vision weights dropped)."""
    hf, path, _ = families["gemma3"]
    text = json.loads((path / "config.json").read_text())
    cfg = {"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"], "text_config": text,
           "vision_config": {"model_type": "siglip_vision_model"}, "mm_tokens_per_image": 4}
    src = tmp_path / "mm"
    src.mkdir()
    (src / "config.json").write_text(json.dumps(cfg))
    weights = mx.load(str(path / "model.safetensors"))
    weights = {k.replace("model.", "language_model.model.", 1): v for k, v in weights.items()}
    weights["vision_tower.vision_model.post_layernorm.weight"] = mx.zeros((8,))
    weights["multi_modal_projector.mm_soft_emb_norm.weight"] = mx.zeros((8,))
    mx.save_safetensors(str(src / "model.safetensors"), weights)
    model, _ = load(convert(src, tmp_path / "mm-mlx"))
    assert json.loads((tmp_path / "mm-mlx" / "config.json").read_text())["model_type"] == "gemma3_text"
    assert np.abs(mlx_logits(model, PROMPT) - torch_logits(hf, PROMPT)).max() < TOL


def test_converted_directories_load_in_mlx_lm(families, tmp_path):
    """mlx-lm reads our converted directories and computes the same logits (its Gemma 3 takes
    the every-6th-layer-global pattern and has no logit softcap, as released Gemma 3 models; its
    Gemma 2 has no sliding window, so the window here holds the prompt; its Gemma 1 computes the
    exact GELU where transformers computes the tanh form)."""
    from mlx_lm.utils import load_model as mlx_lm_load

    _, src = make_hf("gemma3", tmp_path, num_hidden_layers=6, layer_types=[SLIDING] * 5 + [GLOBAL],
                     final_logit_softcapping=None)
    _, src2 = make_hf("gemma2", tmp_path, sliding_window=PROMPT.shape[1])
    dirs = [families["qwen3"][2], families["smollm3"][2], families["qwen3_moe"][2],
            convert(src, tmp_path / "gemma3-mlx"), convert(src2, tmp_path / "gemma2-mlx")]
    for dst in dirs:
        ours, _ = load(dst)
        theirs, _ = mlx_lm_load(dst)
        assert np.abs(mlx_logits(ours, PROMPT) - np.array(theirs(mx.array(PROMPT)))).max() < 1e-5, dst


def test_qwen3_moe_weights_as_given(tmp_path):
    """``norm_topk_prob: false`` (transformers' default): the chosen experts' router probabilities
    as they are, not renormalized (FAMILIES' model renormalizes)."""
    hf, src = make_hf("qwen3_moe", tmp_path, norm_topk_prob=False)
    model, _ = load(convert(src, tmp_path / "mlx"))
    assert model.layers[0].mlp.norm_topk_prob is False
    assert np.abs(mlx_logits(model, PROMPT) - torch_logits(hf, PROMPT)).max() < TOL


@pytest.mark.parametrize("name", MIXTURES)
@pytest.mark.parametrize("bits", [None, 4, "mixed_3_6"])
def test_loads_mlx_lm_mixtures(families, tmp_path, name, bits):
    """A mixture of experts as mlx-lm writes it (read from the checkpoint, its experts stacked
    under its names, quantized by it too: Qwen3-MoE's router at 8 bits, a mixed-precision recipe's
    settings under Mixtral's ``block_sparse_moe``) loads here with mlx-lm's logits (a prompt within
    Mixtral's window: mlx-lm's Mixtral has none)."""
    _, src, dst = families[name]
    # (mlx-lm does not read a transformers-5 Qwen3-MoE config: it reads ours)
    theirs = mlx_lm_dir(src if name == "mixtral" else dst, tmp_path / "mlx-lm", bits)
    if name == "mixtral":  # and ours of Mixtral, which keep its names
        assert np.abs(np.array(mlx_lm_dir(dst, tmp_path / "ours", bits)(mx.array(PROMPT[:, :WINDOW])))
                      - np.array(theirs(mx.array(PROMPT[:, :WINDOW])))).max() < 1e-5
    ours, _ = load(tmp_path / "mlx-lm")
    ids = PROMPT[:, :WINDOW]
    assert np.abs(mlx_logits(ours, ids) - np.array(theirs(mx.array(ids)))).max() < 1e-5


def check_lossless(model, prompt, n=48, **kw):
    ar = generate(model, None, prompt, max_tokens=n, mode="ar")
    ss = generate(model, None, prompt, max_tokens=n, node_cost=0.0, **kw)
    assert ss.tokens == ar.tokens
    return ss


@pytest.mark.parametrize("name", [n for n in FAMILIES if n not in ("qwen3", "gemma")])  # (no window)
def test_batched_greedy_decoding_equals_decoding_alone(families, name):
    """Self-distillation's batch (left-padded, each sequence at its own positions) continues each
    prompt as plain decoding alone does, past the window too (a walkthrough found 5 of 6 continuations
    differing where the windows were measured from the padded slots)."""
    from mlx_specstream.batch import greedy_batch

    model, _ = load(families[name][2])
    prompts = [PROMPT[0, :n].tolist() for n in (3, 11, 20, 7)]
    alone = [generate(model, None, p, max_tokens=14, mode="ar").tokens for p in prompts]
    assert greedy_batch(model, prompts, [14] * 4, set()) == alone


@pytest.mark.parametrize("name", list(FAMILIES))
def test_lossless_greedy(families, name):
    """Streams on every layer kind; generation runs past the window (tree passes then see a
    windowed dense mask; at first their rows all fit inside it and the plan runs as is)."""
    model, _ = load(families[name][2])
    new_adapter(model, gamma=3, msa_layers=2, seed=4)
    accepted = 0
    for streams in ("tree", "deferred"):
        ss = check_lossless(model, [4, 1, 6], branch=3, prune_threshold=0.05, streams=streams, tree_budget=12)
        accepted = max(accepted, max(ss.stats.accepted_lengths))
    assert accepted >= 2, "no draft was ever accepted: the comparison would be vacuous"
    check_lossless(model, PROMPT[0].tolist(), n=16, branch=1)
    new_adapter(model, mode="shared", gamma=2, msa_layers=2, seed=5)
    shared = generate(model, None, [4, 1, 6], max_tokens=24, node_cost=0.0, branch=2)
    assert len(shared.tokens) == 24
    detach(model)


def test_stream_rows_see_the_window_alike_everywhere(families):
    """Gemma's stream rows (positions t + j, past the window): the training pass, the engine's
    tree pass and its deferred stream pass compute the same stream logits."""
    model, _ = load(families["gemma3"][2])
    new_adapter(model, gamma=3, msa_layers=2, seed=1)
    tokens = PROMPT[0, :16].tolist()
    ref = np.array(forward(model, chain(tokens), None, 0, gamma=3, stream_nodes="all").stream_logits)
    n = len(tokens) - 1
    np.testing.assert_allclose(lossless_stream_logits(model, tokens, 0, n, 3), ref[:n], atol=1e-5)
    np.testing.assert_allclose(lossless_stream_logits(model, tokens, 9, 12, 3), ref[9:12], atol=1e-5)
    from mlx_specstream.kv_cache import make_cache

    caches = make_cache(model)
    out = forward(model, chain(tokens), caches, 0)
    deferred = np.array(stream_pass(model, out.msa_input[-1], caches, len(tokens), 3))
    np.testing.assert_allclose(deferred, ref[-1], atol=1e-5)
    detach(model)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_adapter_trains(families, name):
    """Two optimizer steps: finite losses, the adapter moves at each step, the base stays."""
    from mlx.utils import tree_flatten

    model, _ = load(families[name][2])
    base = dict(tree_flatten(model.parameters()))
    rng = np.random.default_rng(0)
    ds = Dataset([Example(rng.integers(0, 100, 16).tolist(), 2) for _ in range(8)])
    seen = []

    def snapshot(step, info):
        seen.append({k: np.array(v) for k, v in adapter_weights(model).items()})

    report = train(model, (ds, None), mode="lossless", gamma=2, msa_layers=2, iters=2, batch_size=4,
                   self_distill=False, progress=False, log=lambda m: None, callback=snapshot)
    assert all(np.isfinite(h["loss"]) for h in report["history"]) and len(seen) == 2
    assert any(not np.array_equal(v, seen[1][k]) for k, v in seen[0].items())
    after = dict(tree_flatten(model.parameters()))
    for k, v in base.items():  # wrapped layers keep theirs under ``...base.weight``
        mod, leaf = k.rsplit(".", 1)
        assert np.array_equal(np.array(after.get(k, after.get(f"{mod}.base.{leaf}"))), np.array(v)), k


@pytest.mark.parametrize("name", list(FAMILIES))
def test_quantized_load(families, tmp_path, name):
    """int8 at convert time, int4 at load time: every projection (a mixture's stacked experts
    too) and the embedding quantized; the model computes exactly its dequantized weights, and
    int8 stays closer to fp32 than int4."""
    import mlx.nn as nn

    from mlx_specstream.arch.moe import QuantizedSwitchLinear

    _, src, dst = families[name]
    ref = mlx_logits(load_model(dst), PROMPT)
    q8 = load_model(convert(src, tmp_path / "q8", q_bits=8, q_group_size=32))  # q_bits: quantize
    q4 = load_model(dst, quantize=(4, 32))
    rel = {}
    for bits, model in ((8, q8), (4, q4)):
        kinds = {type(m).__name__ for path, m in model.named_modules() if path.endswith("_proj")}
        assert kinds == {"QuantizedLinear"} | ({"QuantizedSwitchLinear"} if name in MIXTURES else set())
        assert isinstance(model.model.embed_tokens, nn.QuantizedEmbedding)
        dequantized = load_model(dst)
        dequantized.load_weights([
            (f"{path}.weight", mx.dequantize(m.weight, m.scales, m.biases, m.group_size, m.bits))
            for path, m in model.named_modules()
            if isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding, QuantizedSwitchLinear))
        ], strict=False)
        got = mlx_logits(model, PROMPT)
        assert np.abs(got - mlx_logits(dequantized, PROMPT)).max() < TOL
        rel[bits] = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    assert rel[8] < 0.1 and rel[8] < rel[4] / 4, rel


@pytest.mark.parametrize("name", MIXTURES)
def test_grouped_experts(families, name, monkeypatch):
    """Past ``GROUPED_FROM`` (row, expert) pairs, the pairs run grouped by expert: transformers'
    logits still, and the same values and gradients as the pairs run one by one, float and int4."""
    import mlx.nn as nn
    from mlx.utils import tree_flatten

    from mlx_specstream.arch import moe

    hf, _, dst = families[name]
    ids = np.random.default_rng(2).integers(0, 100, (2, 24))  # 96 pairs a layer
    assert ids.size * 2 >= moe.GROUPED_FROM
    model, _ = load(dst)
    assert np.abs(mlx_logits(model, ids) - torch_logits(hf, ids)).max() < TOL

    def loss(m, x):
        return nn.losses.cross_entropy(m(x)[:, :-1], x[:, 1:]).mean()

    for quantize in (None, (4, 32)):
        model = load_model(dst, quantize=quantize)
        x = mx.array(ids)
        grouped = nn.value_and_grad(model, loss)(model, x)
        monkeypatch.setattr(moe, "GROUPED_FROM", 10**9)
        one_by_one = nn.value_and_grad(model, loss)(model, x)
        monkeypatch.undo()
        for a, b in zip(tree_flatten(grouped), tree_flatten(one_by_one), strict=True):
            assert a[0] == b[0] and np.abs(np.array(a[1]) - np.array(b[1])).max() < 1e-6, a[0]
    new_adapter(model, gamma=3, msa_layers=2, seed=4)  # tree passes of up to 40 rows grouped, AR's not
    check_lossless(model, [4, 1, 6], n=24, branch=4, tree_budget=40)


@pytest.mark.parametrize("name", MIXTURES)
def test_quantized_mixture_keeps_routers_at_8_bits(families, tmp_path, name):
    """``-q`` at 4 bits quantizes a mixture's routers as mlx-lm does Qwen3-MoE's (8 bits, groups of
    64), at convert and at load time alike, and writes them in the config, which mlx-lm reads."""
    import mlx.nn as nn
    from mlx_lm.utils import load_model as mlx_lm_load

    _, src, dst = families[name]
    path = convert(src, tmp_path / "q4", q_bits=4, q_group_size=32)
    config = json.loads((path / "config.json").read_text())["quantization"]
    layers = range(4) if name == "mixtral" else (0, 2, 3)  # (Qwen3-MoE's second layer is dense)
    routers = [f"model.layers.{i}.mlp.gate" for i in layers]
    saved = [r.replace(".mlp.", ".block_sparse_moe.") if name == "mixtral" else r  # (mlx-lm's name)
             for r in routers]
    assert config == {"group_size": 32, "bits": 4, **{r: {"group_size": 64, "bits": 8} for r in saved}}
    for model in (load_model(path), load_model(dst, quantize=(4, 32))):
        modules = dict(model.named_modules())
        assert all(isinstance(modules[r], nn.QuantizedLinear)
                   and (modules[r].bits, modules[r].group_size) == (8, 64) for r in routers)
        assert modules["model.layers.0.mlp.switch_mlp.up_proj"].bits == 4
        assert np.abs(mlx_logits(model, PROMPT) - mlx_logits(load_model(path), PROMPT)).max() == 0
    theirs, _ = mlx_lm_load(path)
    ids = PROMPT[:, :WINDOW]  # (mlx-lm's Mixtral has no window)
    assert np.abs(mlx_logits(load_model(path), ids) - np.array(theirs(mx.array(ids)))).max() < 1e-5


@pytest.mark.parametrize("name", EXPORTED)
def test_coreml_graph_equals_engine(families, name):
    """Prefill past the window, tree steps with commits, pruning and streams on every node."""
    from test_coreml_graph import check_graph

    model, _ = load(families[name][2])
    new_adapter(model, mode="lossless", gamma=3, msa_layers=2, seed=1, prune_threshold=0.05)
    check_graph(model, tree_size=8, context=64, max_tokens=36)
    detach(model)


@pytest.mark.parametrize("name", [pytest.param(n, marks=[] if n == "gemma3" else pytest.mark.slow)
                                  for n in EXPORTED])
def test_coreml_package_equals_engine(tmp_path, name):
    """Two layers (a conversion takes ~7 s a layer), the top one a sliding layer for Gemma 3."""
    pytest.importorskip("coremltools")
    from test_coreml_common import record_engine, replay

    from mlx_specstream.adapter import save_adapter
    from mlx_specstream.convert.coreml_export import export_coreml, load_for_export
    from mlx_specstream.convert.mil_eval import Package

    _, src = make_hf(name, tmp_path, num_hidden_layers=2, layer_types=[GLOBAL, SLIDING])
    dst = convert(src, tmp_path / "mlx")
    model, _ = load(dst)
    new_adapter(model, mode="lossless", gamma=3, msa_layers=1, seed=1)
    save_adapter(model, tmp_path / "adapter")
    sizes = dict(context=32, tree_size=8, chunk=4)
    res = export_coreml(dst, tmp_path / "m.mlpackage", adapter=tmp_path / "adapter", precision="float32",
                        sampling=True, progress=None, **sizes)
    assert res.metadata["specstream.model_type"] == model.config["model_type"]
    pkg = Package(res.package)
    state = pkg.new_state()
    model = load_for_export(dst, tmp_path / "adapter", precision="float32")
    prompt = PROMPT[0, :10].tolist()
    rec = record_engine(model, prompt, max_tokens=16, tree_budget=8, fp16_state=True)
    err = replay(lambda function, inputs: pkg.predict(inputs, state, function=function), rec, prompt,
                 accept_max=4, **sizes)
    # both sides round keys/values to fp16; a value on the other side of a rounding boundary moves
    # by one fp16 ulp, the logits (|x| <= 11 here) by ~1e-3; a wrong layer moves them by > 0.1
    assert err["steps"] >= 4 and max(err["prefill"], err["main"], err["stream"]) <= 5e-3, err


def test_coreml_export_refuses_other_families(families):
    from helpers import tiny_model

    from mlx_specstream.convert.torch_graph import graph_config
    from mlx_specstream.errors import UnsupportedModelError

    with pytest.raises(UnsupportedModelError, match=r"\(gemma, gemma2, gemma3_text\), not 'opt'"):
        graph_config(tiny_model("opt"), 64, 4, 4)
    with pytest.raises(UnsupportedModelError, match="not 'qwen3_moe'"):  # a mixture of experts
        graph_config(load(families["qwen3_moe"][2])[0], 64, 4, 4)
