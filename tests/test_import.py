"""Import of Hugging Face / PyTorch checkpoints: logits equal the transformers model's.

Tiny random models are made with ``transformers`` from configs (no download), saved in the
formats checkpoints come in (safetensors, sharded safetensors, pytorch_model.bin, sharded .bin),
converted by the CLI and loaded with ``mlx_specstream.load``.
"""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from mlx_specstream import load  # noqa: E402
from mlx_specstream.kv_cache import make_cache  # noqa: E402

TOL = 1e-4
SMALL = dict(hidden_size=64, num_attention_heads=4, num_hidden_layers=2, vocab_size=100)
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 32}

# name: (config, how the checkpoint is saved)
MODELS = {
    "llama3": (lambda: transformers.LlamaConfig(**SMALL, num_key_value_heads=2, intermediate_size=128,
                                                rope_scaling=LLAMA3_ROPE), "safetensors"),
    "llama": (lambda: transformers.LlamaConfig(**SMALL, num_key_value_heads=2, intermediate_size=128),
              "sharded"),
    "mistral": (lambda: transformers.MistralConfig(**SMALL, num_key_value_heads=2, intermediate_size=128),
                "bin"),
    "qwen2": (lambda: transformers.Qwen2Config(**SMALL, num_key_value_heads=2, intermediate_size=128,
                                               tie_word_embeddings=True), "bin_sharded"),
    "phi3": (lambda: transformers.Phi3Config(**SMALL, num_key_value_heads=2, intermediate_size=128,
                                             pad_token_id=0), "safetensors"),
    "opt_proj": (lambda: transformers.OPTConfig(**SMALL, ffn_dim=128, max_position_embeddings=64,
                                                word_embed_proj_dim=32), "safetensors"),
    "opt_post_ln": (lambda: transformers.OPTConfig(**SMALL, ffn_dim=128, max_position_embeddings=64,
                                                   do_layer_norm_before=False), "safetensors"),
    "phi": (lambda: transformers.PhiConfig(**SMALL, intermediate_size=128), "safetensors"),
}


def cli(*args):
    return subprocess.run([sys.executable, "-m", "mlx_specstream.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def convert_ok(src, dest, *extra):
    res = cli("convert", "--hf-path", src, "--mlx-path", dest, *extra)
    assert res.returncode == 0, res.stderr
    return dest


def save_bin(model, path: Path, shards: int = 1):
    """pytorch_model.bin (or shards + pytorch_model.bin.index.json), as transformers<5 wrote."""
    path.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(path)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if shards == 1:
        torch.save(state, path / "pytorch_model.bin")
        return
    names = sorted(state)
    weight_map = {}
    for i in range(shards):
        fname = f"pytorch_model-{i + 1:05d}-of-{shards:05d}.bin"
        part = {k: state[k] for k in names[i::shards]}
        torch.save(part, path / fname)
        weight_map.update(dict.fromkeys(part, fname))
    (path / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": weight_map}))


def make_hf(name: str, root: Path, seed: int = 0):
    config_fn, fmt = MODELS[name]
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config_fn()).eval()
    path = root / name
    if fmt == "safetensors":
        model.save_pretrained(path)
    elif fmt == "sharded":
        model.save_pretrained(path, max_shard_size="40KB")
        assert (path / "model.safetensors.index.json").is_file()
    else:
        save_bin(model, path, shards=2 if fmt == "bin_sharded" else 1)
    return model, path


def tiny_word_tokenizer(path: Path, vocab: int = 100):
    """A word-level tokenizer.json + tokenizer_config.json (to check they are copied)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tk = Tokenizer(models.WordLevel({f"w{i}": i for i in range(vocab)}, unk_token="w0"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tk.decoder = decoders.WordPiece(prefix="##")
    tk.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "w1", "eos_token": "w2",
                                                            "add_bos_token": True}))


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """name -> (torch model, HF dir, converted MLX dir), all converted by the CLI."""
    root = tmp_path_factory.mktemp("hf")
    out = {}
    for name in MODELS:
        model, path = make_hf(name, root)
        if name == "llama3":
            tiny_word_tokenizer(path)
        out[name] = (model, path, convert_ok(path, root / f"{name}-mlx"))
    return out


def torch_logits(model, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor(ids)).logits.float().numpy()


def mlx_logits(model, ids: np.ndarray, prefill: int | None = None) -> np.ndarray:
    """Full-prompt logits, or prefill + token-by-token decoding through the KV cache."""
    if prefill is None:
        return np.array(model(mx.array(ids)))
    cache = make_cache(model)
    steps = [np.array(model(mx.array(ids[:, :prefill]), cache=cache))]
    for t in range(prefill, ids.shape[1]):
        steps.append(np.array(model(mx.array(ids[:, t : t + 1]), cache=cache)))
    assert cache[0].offset == ids.shape[1]
    return np.concatenate(steps, axis=1)


@pytest.mark.parametrize("name", list(MODELS))
def test_logits_match_transformers(converted, name):
    hf, _, dst = converted[name]
    model, _ = load(dst)
    ids = np.random.default_rng(1).integers(0, 100, (1, 12))
    ref = torch_logits(hf, ids)
    full = mlx_logits(model, ids)
    assert full.shape == (1, 12, 100)
    assert np.abs(full - ref).max() < TOL, f"{name}: full prompt differs by {np.abs(full - ref).max()}"
    inc = mlx_logits(model, ids, prefill=5)
    assert np.abs(inc - ref).max() < TOL, f"{name}: cached decode differs by {np.abs(inc - ref).max()}"
    # a prompt of length 1, then decoding
    inc1 = mlx_logits(model, ids, prefill=1)
    assert np.abs(inc1 - ref).max() < TOL


def _drop(*keys):
    def edit(cfg):
        for key in keys:
            cfg.pop(key, None)
    return edit


def _rope_as_transformers_4(cfg):
    """A transformers-4 config: no rope keys but its own top-level partial rotary factor."""
    cfg.pop("rope_parameters", None)
    cfg.pop("rope_theta", None)
    cfg["partial_rotary_factor"] = 0.4


@pytest.mark.parametrize("config,edit,defaulted", [
    (lambda: transformers.SmolLM3Config(**SMALL, num_key_value_heads=2, intermediate_size=128, pad_token_id=0,
                                        rope_theta=2e6),
     _drop("rope_theta", "rope_parameters", "rope_scaling", "tie_word_embeddings"), ("tie_word_embeddings",)),
    (lambda: transformers.Phi3Config(**SMALL, num_key_value_heads=2, intermediate_size=128, pad_token_id=0,
                                     rms_norm_eps=1e-5), _drop("rms_norm_eps"), ("rms_norm_eps",)),
    (lambda: transformers.LlamaConfig(**SMALL, num_key_value_heads=2, intermediate_size=128),
     _drop("max_position_embeddings"), ("max_position_embeddings",)),  # the context: 2,048 there
    (lambda: transformers.MistralConfig(**SMALL, num_key_value_heads=2, intermediate_size=128,
                                        sliding_window=4096), _drop("sliding_window"), ("sliding_window",)),
    (lambda: transformers.PhiConfig(hidden_size=160, num_attention_heads=2, num_hidden_layers=2,
                                    vocab_size=100, intermediate_size=128, partial_rotary_factor=0.4),
     _rope_as_transformers_4, ()),
])
def test_settings_a_config_leaves_out_are_transformers_defaults(tmp_path, config, edit, defaulted):
    """A config.json without some settings: transformers builds the model with its family's
    defaults (SmolLM3's rope base 2e6 and tied embeddings, Phi-3's norm epsilon, Mistral's window),
    and so does the import, which writes them into the MLX config; what the config does say (a
    partial rotary factor beside no rotary base) stays."""
    torch.manual_seed(0)
    path = tmp_path / "hf"
    transformers.AutoModelForCausalLM.from_config(config()).save_pretrained(path)
    cfg = json.loads((path / "config.json").read_text())
    edit(cfg)
    (path / "config.json").write_text(json.dumps(cfg))
    hf = transformers.AutoModelForCausalLM.from_pretrained(path).eval()  # as transformers reads it
    model, _ = load(convert_ok(path, tmp_path / "mlx"))
    ids = np.random.default_rng(1).integers(0, 100, (1, 12))
    assert np.abs(mlx_logits(model, ids) - torch_logits(hf, ids)).max() < TOL
    written = json.loads((tmp_path / "mlx" / "config.json").read_text())
    for key in defaulted:
        assert written[key] == getattr(hf.config, key)
    if "max_position_embeddings" in defaulted:  # the context a generation stops at
        assert model.max_positions == hf.config.max_position_embeddings == 2048
    if "sliding_window" in defaulted:  # past 4,096 tokens the window shows; here it is said
        assert model.args.window(0) == hf.config.sliding_window == 4096


def test_output_directory(converted):
    _, src, dst = converted["llama3"]
    names = sorted(p.name for p in dst.iterdir())
    assert names == ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                     "tokenizer_config.json"]
    cfg = json.loads((dst / "config.json").read_text())
    assert cfg["model_type"] == "llama" and "quantization" not in cfg
    # mlx-lm reads the older top-level rope keys
    assert cfg["rope_scaling"]["rope_type"] == "llama3" and cfg["rope_theta"] == 10000.0
    _, tok = load(dst)
    assert tok is not None and tok.vocab_size == 100 and tok.bos_token_id == 1
    assert 2 in tok.eos_token_ids and tok.decode(tok.encode("w5 w6", add_special_tokens=False)) == "w5 w6"
    assert not [p for p in dst.parent.iterdir() if p.name.startswith(".")]  # no temp dirs left


@pytest.mark.parametrize("name", ["llama3", "llama"])
def test_llama_matches_mlx_lm(converted, name):
    """Our llama equals mlx-lm's implementation on the converted directory."""
    from mlx_lm.utils import load_model as mlx_lm_load

    _, _, dst = converted[name]
    theirs, _ = mlx_lm_load(dst)
    ours, _ = load(dst)
    ids = mx.array(np.random.default_rng(2).integers(0, 100, (1, 40)))
    assert np.abs(np.array(ours(ids)) - np.array(theirs(ids))).max() < 1e-5


def test_dtype_cast(converted, tmp_path):
    hf, src, _ = converted["phi3"]
    dst = convert_ok(src, tmp_path / "fp16", "--dtype", "float16")
    weights = mx.load(str(dst / "model.safetensors"))
    assert {w.dtype for w in weights.values()} == {mx.float16}
    model, _ = load(dst)
    ids = np.arange(10)[None] % 100
    err = np.abs(mlx_logits(model, ids).astype(np.float32) - torch_logits(hf, ids)).max()
    assert err < 2e-2


def test_bfloat16_bin(tmp_path):
    """bf16 tensors in a .bin (numpy has no bfloat16) keep their exact bits."""
    model, _ = make_hf("mistral", tmp_path / "f32")
    model = model.to(torch.bfloat16)
    save_bin(model, tmp_path / "bf16")
    dst = convert_ok(tmp_path / "bf16", tmp_path / "bf16-mlx")
    weights = mx.load(str(dst / "model.safetensors"))
    for k, v in model.state_dict().items():
        if "rotary" in k:
            continue
        assert weights[k].dtype == mx.bfloat16
        assert np.array_equal(np.array(weights[k].astype(mx.float32)), v.float().numpy()), k


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
def test_float64_checkpoints_become_float32(tmp_path, fmt):
    """float64 weights, which MLX's safetensors reader lacks, convert as float32 either way and
    compute transformers' logits."""
    model, _ = make_hf("llama", tmp_path / "f32")
    model = model.to(torch.float64)
    if fmt == "bin":
        save_bin(model, tmp_path / "f64")
    else:
        model.save_pretrained(tmp_path / "f64")
    dst = convert_ok(tmp_path / "f64", tmp_path / "f64-mlx")
    assert {v.dtype for v in mx.load(str(dst / "model.safetensors")).values()} == {mx.float32}
    ids = np.arange(10)[None] % 100
    assert np.abs(mlx_logits(load(dst)[0], ids) - torch_logits(model, ids)).max() < TOL


def test_python_api(converted, tmp_path):
    from mlx_specstream.convert.hf_import import convert

    _, src, _ = converted["opt_proj"]
    out = convert(src, tmp_path / "api-out")
    assert out == tmp_path / "api-out" and (out / "model.safetensors").is_file()


# --- mlx-lm directories -------------------------------------------------------------------

def mlx_lm_dir(src: Path, dest: Path, bits: int | str | None = None):
    """A directory written by mlx-lm from the model it reads at ``src``, with its own save
    utilities (quantized by it to ``bits``, groups of 32, where given; a string is one of its
    mixed-precision recipes, which lists per-layer settings in the config); returns its model."""
    from mlx_lm.convert import mixed_quant_predicate_builder
    from mlx_lm.utils import load_model as mlx_lm_load
    from mlx_lm.utils import quantize_model, save_config, save_model

    theirs, config = mlx_lm_load(src)
    if bits:
        recipe = mixed_quant_predicate_builder(bits, theirs, 32) if isinstance(bits, str) else None
        theirs, config = quantize_model(theirs, config, group_size=32, bits=4, quant_predicate=recipe) \
            if recipe else quantize_model(theirs, config, group_size=32, bits=bits)
    dest.mkdir()
    save_model(dest, theirs)
    save_config(dict(config), dest / "config.json")
    return theirs


@pytest.mark.parametrize("name", ["llama", "qwen2", "phi3"])
@pytest.mark.parametrize("bits", [None, 4, "mixed_3_6"])
def test_loads_mlx_lm_directories(converted, tmp_path, name, bits):
    """A directory written by mlx-lm (its own save utilities, optionally its own quantization,
    mixed-precision too: phi3's per-layer settings name its fused layers) loads with ours and gives
    mlx-lm's logits."""
    hf, src, dst = converted[name]
    # mlx-lm reads HF safetensors dirs and ours (same tensor names), except phi3, which mlx-lm
    # keeps fused (qkv_proj, gate_up_proj) and we split: it reads that one from the HF dir.
    lm_dir = tmp_path / "mlx-lm"
    theirs = mlx_lm_dir(src if name == "phi3" else dst, lm_dir, bits)
    if name == "phi3":  # mlx-lm keeps phi3's fused qkv_proj / gate_up_proj
        assert any("qkv_proj" in k for k in mx.load(str(next(lm_dir.glob("*.safetensors")))))
    ours, _ = load(lm_dir)
    ids = np.random.default_rng(3).integers(0, 100, (1, 12))
    ref = np.array(theirs(mx.array(ids)))
    assert np.abs(mlx_logits(ours, ids) - ref).max() < 1e-5
    assert np.abs(mlx_logits(ours, ids, prefill=4) - ref).max() < 1e-4
    if not bits:
        assert np.abs(ref - torch_logits(hf, ids)).max() < TOL


# --- bad input ----------------------------------------------------------------------------

def assert_clean_failure(res, dest: Path, fragment: str):
    assert res.returncode != 0
    assert "Traceback" not in res.stderr + res.stdout, res.stderr
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), res.stderr
    assert fragment in lines[0], lines[0]
    assert not dest.exists()
    if dest.parent.is_dir():
        assert not [p for p in dest.parent.iterdir() if p.name.startswith(f".{dest.name}.")]


def bad(src, dest, fragment, *extra):
    assert_clean_failure(cli("convert", "--hf-path", src, "--mlx-path", dest, *extra), Path(dest),
                         fragment)


@pytest.fixture
def llama_copy(converted, tmp_path):
    """A fresh copy of the llama3 checkpoint to break."""
    import shutil

    _, src, _ = converted["llama3"]
    d = tmp_path / "src"
    shutil.copytree(src, d)
    return d


def test_missing_source(llama_copy, tmp_path):
    bad(tmp_path / "nope", tmp_path / "out", "no such checkpoint directory")
    bad("meta-llama/Llama-3.2-1B", tmp_path / "out", "a Hugging Face repo id? nothing is downloaded here")
    bad(llama_copy / "config.json", tmp_path / "out", "config.json: not a directory")


def test_a_checkpoint_that_does_not_generate_text_says_so(tmp_path):
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, pad_token_id=0)
    transformers.LlamaForSequenceClassification(cfg).save_pretrained(tmp_path / "cls")
    bad(tmp_path / "cls", tmp_path / "out", "a LlamaForSequenceClassification checkpoint is not a causal "
                                            "language model")


def test_convert_takes_mlx_lms_model_flag(converted, tmp_path):
    """``mlx_lm.convert --model X`` is ``--hf-path X``: so it is here, with --to mlx."""
    _, src, _ = converted["llama3"]
    res = cli("convert", "--model", src, "--mlx-path", tmp_path / "out")
    assert res.returncode == 0 and (tmp_path / "out" / "config.json").is_file(), res.stderr
    bad(src, tmp_path / "out2", "give --hf-path or --model, not both", "--model", src)


def test_missing_config(llama_copy, tmp_path):
    (llama_copy / "config.json").unlink()
    bad(llama_copy, tmp_path / "out", "no config.json")


@pytest.mark.parametrize("model_type,fragment", [(None, "no 'model_type'"),
                                                 ("gptj", "unknown model_type 'gptj'")])
def test_bad_model_type(llama_copy, tmp_path, model_type, fragment):
    cfg = json.loads((llama_copy / "config.json").read_text())
    cfg.pop("model_type")
    if model_type:
        cfg["model_type"] = model_type
    (llama_copy / "config.json").write_text(json.dumps(cfg))
    bad(llama_copy, tmp_path / "out", fragment)


def test_invalid_config_json(llama_copy, tmp_path):
    (llama_copy / "config.json").write_text("{ not json")
    bad(llama_copy, tmp_path / "out", "invalid JSON")


def _set_config(src, edit):
    cfg = json.loads((src / "config.json").read_text())
    edit(cfg)
    (src / "config.json").write_text(json.dumps(cfg))


def test_a_stored_head_unlike_the_tied_embeddings_is_the_head(tmp_path):
    """A checkpoint that says its head is tied but stores one of its own, unlike the embeddings:
    transformers builds it with the stored head, and so does the import; a stored head equal to the
    embeddings stays tied."""
    from safetensors.numpy import load_file, save_file

    torch.manual_seed(0)
    path = tmp_path / "hf"
    config = transformers.Qwen2Config(**SMALL, num_key_value_heads=2, intermediate_size=128,
                                      tie_word_embeddings=True)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(path)
    tensors = load_file(path / "model.safetensors")
    ids = np.random.default_rng(1).integers(0, 100, (1, 12))
    for scale, tied in ((0.5, False), (1.0, True)):
        tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"] * scale
        save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
        hf = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
        model, _ = load(convert_ok(path, tmp_path / f"mlx{scale}"))
        assert np.abs(mlx_logits(model, ids) - torch_logits(hf, ids)).max() < TOL
        assert model.tied is tied


@pytest.mark.parametrize("break_it,fragment", [
    (lambda d: _set_config(d, lambda c: c.pop("hidden_size")), "config.json has no hidden_size"),
    (lambda d: _set_config(d, lambda c: c.update(hidden_size="64")), "hidden_size is '64', which is not int"),
    (lambda d: _set_config(d, lambda c: c.update(rms_norm_eps=True)), "rms_norm_eps is True"),
    (lambda d: _set_config(d, lambda c: c.update(max_position_embeddings="x")),
     "max_position_embeddings is 'x', which is not int"),
    (lambda d: _set_config(d, lambda c: c.update(max_position_embeddings=-5)),
     "max_position_embeddings is -5, which is not at least 1"),
    (lambda d: _set_config(d, lambda c: c.update(rope_parameters="oops")), "rope_parameters is 'oops'"),
    (lambda d: (d / "config.json").write_text("[1, 2]"), "a JSON object of settings was expected, not list"),
    (lambda d: _set_config(d, lambda c: c.update(model_type=["llama"])),
     "model_type is ['llama'], not a name"),
    (lambda d: _set_config(d, lambda c: c.update(model_type="gemma3", text_config="x")),
     "text_config is 'x', not an object"),
    (lambda d: (d / "config.json").write_bytes(b'{"model_type": "caf\xe9"}'), "config.json: invalid JSON"),
    (lambda d: (d / "model.safetensors.index.json").write_text('{"weight_map": 5}'),
     "model.safetensors.index.json: not a valid shard index"),
])
def test_broken_configs_are_one_line_errors(llama_copy, tmp_path, break_it, fragment):
    """A config.json or shard index that is malformed in any of these ways is refused with an
    error the CLI prints as one line, naming the file or key (in-process: no CLI start-up)."""
    from mlx_specstream.convert.hf_import import convert as hf_convert
    from mlx_specstream.errors import USER_ERRORS

    break_it(llama_copy)
    with pytest.raises(USER_ERRORS, match=re.escape(fragment)):
        hf_convert(llama_copy, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_integer_weights_for_a_float_parameter(llama_copy, tmp_path):
    from safetensors.numpy import load_file, save_file

    from mlx_specstream.convert.hf_import import convert as hf_convert

    weights = load_file(llama_copy / "model.safetensors")
    weights["model.norm.weight"] = weights["model.norm.weight"].astype(np.int32)
    save_file(weights, llama_copy / "model.safetensors")
    with pytest.raises(ValueError, match="model.norm.weight: a mlx.core.int32 tensor where the architecture"):
        hf_convert(llama_copy, tmp_path / "out")


def test_missing_weights_file(llama_copy, tmp_path):
    (llama_copy / "model.safetensors").unlink()
    bad(llama_copy, tmp_path / "out", "no weights")
    (llama_copy / "model.safetensors").symlink_to(tmp_path / "gone")  # a download's cache removed
    bad(llama_copy, tmp_path / "out", "model.safetensors: a link to a file that does not exist")


def test_fp8_weights_are_said(llama_copy, tmp_path):
    from safetensors.torch import load_file, save_file

    tensors = load_file(llama_copy / "model.safetensors")
    tensors["model.norm.weight"] = tensors["model.norm.weight"].to(torch.float8_e4m3fn)
    save_file(tensors, llama_copy / "model.safetensors")
    bad(llama_copy, tmp_path / "out", "F8_E4M3 (8-bit float) weights are not supported")


def test_a_quantized_checkpoint_is_said_by_its_method(llama_copy, tmp_path):
    for q, said in (({"quant_method": "gptq", "bits": 4}, "(gptq)"),
                    ({"load_in_4bit": True}, "(load_in_4bit)"), ({"bits": 4, "group_size": 64}, "(mlx)")):
        _set_config(llama_copy, lambda c, q=q: c.update(quantization_config=q))
        bad(llama_copy, tmp_path / "out", f"already-quantized checkpoints {said}")


def test_missing_tensor(llama_copy, tmp_path):
    w = mx.load(str(llama_copy / "model.safetensors"))
    del w["model.layers.1.mlp.up_proj.weight"]
    mx.save_safetensors(str(llama_copy / "model.safetensors"), w)
    bad(llama_copy, tmp_path / "out",
        f"{llama_copy}: missing weight tensors: model.layers.1.mlp.up_proj.weight")


def test_unexpected_tensor(llama_copy, tmp_path):
    w = mx.load(str(llama_copy / "model.safetensors"))
    w["model.layers.7.mlp.up_proj.weight"] = mx.zeros((2, 2))
    mx.save_safetensors(str(llama_copy / "model.safetensors"), w)
    bad(llama_copy, tmp_path / "out", "unexpected weight tensors")


def test_shape_mismatch(llama_copy, tmp_path):
    cfg = json.loads((llama_copy / "config.json").read_text())
    cfg["intermediate_size"] = 96
    (llama_copy / "config.json").write_text(json.dumps(cfg))
    bad(llama_copy, tmp_path / "out", "shape mismatch for model.layers.")


@pytest.mark.parametrize("how", ["truncated", "garbage", "empty"])
def test_corrupt_safetensors(llama_copy, tmp_path, how):
    f = llama_copy / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes({"truncated": data[: len(data) // 2], "garbage": b"\x07garbage" * 50, "empty": b""}[how])
    bad(llama_copy, tmp_path / "out", "corrupt safetensors file")


def test_missing_shard(converted, tmp_path):
    import shutil

    _, src, _ = converted["llama"]
    d = tmp_path / "src"
    shutil.copytree(src, d)
    next(d.glob("model-*.safetensors")).unlink()
    bad(d, tmp_path / "out", "lists missing shards")


def test_corrupt_bin(converted, tmp_path):
    import shutil

    _, src, _ = converted["mistral"]
    d = tmp_path / "src"
    shutil.copytree(src, d)
    (d / "pytorch_model.bin").write_bytes(b"PK\x03\x04 not really a zip")
    bad(d, tmp_path / "out", "corrupt PyTorch checkpoint")


class _Evil:
    """Unpickling this object runs a shell command (creates a marker file)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_malicious_bin_is_never_executed(converted, tmp_path):
    import shutil

    _, src, _ = converted["mistral"]
    d = tmp_path / "src"
    shutil.copytree(src, d)
    marker = tmp_path / "pwned"
    state = torch.load(d / "pytorch_model.bin", weights_only=True)
    state["model.norm.weight"] = _Evil(marker)
    torch.save(state, d / "pytorch_model.bin")
    bad(d, tmp_path / "out", "never executing pickled code")
    assert not marker.exists()
    # The file really is malicious: an unsafe load runs the command.
    torch.load(d / "pytorch_model.bin", weights_only=False)
    assert marker.exists()


def test_unwritable_destination(converted, tmp_path):
    _, src, _ = converted["llama3"]
    (tmp_path / "afile").write_text("x")
    res = cli("convert", "--hf-path", src, "--mlx-path", tmp_path / "afile" / "sub" / "out")
    assert_clean_failure(res, tmp_path / "afile" / "sub" / "out", "cannot write")
    assert (tmp_path / "afile").read_text() == "x"


def test_existing_destination(converted, tmp_path):
    _, src, _ = converted["llama3"]
    dest = tmp_path / "out"
    dest.mkdir()
    (dest / "keep.txt").write_text("mine")
    # --overwrite never deletes what the project did not write: said first, flag or not (no
    # "use --overwrite" that would then be refused); the user's file stays
    for flag in ((), ("--overwrite",)):
        res = cli("convert", "--hf-path", src, "--mlx-path", dest, *flag)
        assert res.returncode == 1 and "did not write" in res.stderr and "keep.txt" in res.stderr
        assert "--overwrite" not in res.stderr and res.stderr.strip().startswith("error:")
        assert "Traceback" not in res.stderr and (dest / "keep.txt").read_text() == "mine"
    assert sorted(p.name for p in dest.iterdir()) == ["keep.txt"]
    # a model directory the project wrote is replaced; convert says what its tokenizer files are
    model_dir = tmp_path / "model"
    res = cli("convert", "--hf-path", src, "--mlx-path", model_dir)
    assert res.returncode == 0 and "tokenizer" not in res.stdout and "wrote" in res.stdout
    bare = Path(shutil.copytree(src, tmp_path / "no-tokenizer", ignore=shutil.ignore_patterns("tokenizer*")))
    res = cli("convert", "--hf-path", bare, "--mlx-path", model_dir, "--overwrite")
    assert res.returncode == 0 and "(no tokenizer files: generate needs them" in res.stdout
    broken = Path(shutil.copytree(src, tmp_path / "broken-tokenizer"))
    (broken / "tokenizer.json").write_text("{not json")
    res = cli("convert", "--hf-path", broken, "--mlx-path", model_dir, "--overwrite")
    assert res.returncode == 0 and "(its tokenizer files do not load:" in res.stdout, res.stdout
    assert (model_dir / "model.safetensors").is_file()
    # ... but not a checkpoint of the user's with the same file names (a hub download, mlx-lm's)
    user = tmp_path / "user-ckpt"
    shutil.copytree(src, user)
    weights = {p.name: p.read_bytes() for p in user.glob("*.safetensors")}
    res = cli("convert", "--hf-path", src, "--mlx-path", user, "--overwrite")
    assert res.returncode == 1 and "did not write" in res.stderr and "safetensors" in res.stderr
    assert weights and {p.name: p.read_bytes() for p in user.glob("*.safetensors")} == weights
    # ... nor one that holds the user's trained adapters
    (model_dir / "adapters" / "sql").mkdir(parents=True)
    res = cli("convert", "--hf-path", src, "--mlx-path", model_dir, "--overwrite")
    assert res.returncode == 1 and "adapters" in res.stderr and (model_dir / "adapters" / "sql").is_dir()


def test_destination_inside_source(converted, tmp_path):
    _, src, _ = converted["llama3"]
    bad(src, src / "out", "must not be the checkpoint directory")


@pytest.mark.parametrize("args,fragment", [
    (["-q", "--q-bits", "3"], "--q-bits must be 4 or 8"),
    (["-q", "--q-group-size", "48"], "--q-group-size must be 32, 64 or 128"),
    (["--dtype", "float64"], "--dtype must be one of"),
    (["--to", "onnx"], "unknown output format"),
    (["--q-group-size", "7"], "--q-group-size must be 32, 64 or 128"),  # asked for without -q: checked
    (["--adapter", "sql", "--precision", "float32"], "--adapter, --precision: an option of --to coreml"),
    (["--precision", "float16"], "--precision: an option of --to coreml"),  # its default, said: refused too
])
def test_bad_options(converted, tmp_path, args, fragment):
    _, src, _ = converted["llama3"]
    bad(src, tmp_path / "out", fragment, *args)


def test_shipped_adapter_follows_its_base_through_a_transformers_resave(tmp_path):
    """Re-saving the shipped checkpoint with this transformers (which spells the rotary settings
    as ``rope_parameters``) and converting it again gives the same base: the adapter loads."""
    from mlx_specstream.adapter import fingerprint
    from mlx_specstream.api import DEFAULT_MODEL

    hf = DEFAULT_MODEL.parent / "hf"
    if not (hf / "config.json").exists() or not (DEFAULT_MODEL / "adapters" / "sql").is_dir():
        pytest.skip("the default model is not built")
    model = transformers.AutoModelForCausalLM.from_pretrained(hf)
    model.save_pretrained(tmp_path / "resaved")
    resaved = json.loads((tmp_path / "resaved" / "config.json").read_text())
    assert resaved != json.loads((hf / "config.json").read_text())  # spelled differently
    dest = convert_ok(tmp_path / "resaved", tmp_path / "mlx")
    m, _ = load(dest, adapter=DEFAULT_MODEL / "adapters" / "sql", fuse=False)
    assert m.adapter_config.name == "sql"
    # ... while a base that computes something else is told apart
    cfg = dict(resaved, rope_parameters={"rope_type": "default", "rope_theta": 500000.0}, rope_theta=500000.0)
    (tmp_path / "resaved" / "config.json").write_text(json.dumps(cfg))
    other = convert_ok(tmp_path / "resaved", tmp_path / "mlx-other")
    base, _ = load(dest)
    assert fingerprint(load(other)[0]) != fingerprint(base)


@pytest.mark.parametrize("theta", [10000.0, 500000.0])
@pytest.mark.parametrize("scaling", [
    None,
    {"rope_type": "linear", "factor": 4.0},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 8192},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768, "mscale": 0.707,
     "mscale_all_dim": 1.0},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768, "truncate": False},
    {"rope_type": "yarn", "factor": 1.0, "original_max_position_embeddings": 32768, "beta_fast": 16},
    {"rope_type": "longrope", "original_max_position_embeddings": 4096,  # Phi-3.5's (factor: 131072 / 4096)
     "short_factor": [1.0 + 0.03 * i for i in range(64)], "long_factor": [2.0 + 0.5 * i for i in range(64)]},
    {"rope_type": "longrope", "original_max_position_embeddings": 4096, "factor": 8.0,
     "attention_factor": 1.2, "short_factor": [1.5] * 64, "long_factor": [3.0] * 64},
])
def test_rotary_frequencies_match_transformers(theta, scaling):
    """The rotary frequencies are computed on the host in float32 (NumPy), as transformers computes
    them (to within one float32 rounding of ``pow``): the same bits whichever device MLX runs on, so
    an adapter's fingerprint, which includes them, made on a CPU matches its base on a GPU (MLX's
    CUDA ``pow`` differs in the last bit; docs/gpu.md)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from mlx_specstream.arch.base import make_rope

    rope = {"rope_theta": theta, "rope_type": "default"} | (scaling or {})
    cfg = transformers.LlamaConfig(hidden_size=1024, num_attention_heads=8, max_position_embeddings=131072,
                                   rope_parameters=rope)
    default = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding.compute_default_rope_parameters
    init = ROPE_INIT_FUNCTIONS[rope["rope_type"]] if scaling else default
    inv, factor = init(cfg, device="cpu")
    ours = make_rope({"rope_parameters": rope, "max_position_embeddings": 131072}, 128)
    assert np.array(ours.inv_freq).dtype == np.float32
    np.testing.assert_allclose(np.array(ours.inv_freq), inv.numpy(), rtol=5e-7, atol=0)
    assert ours.attention_factor == pytest.approx(factor)


@pytest.mark.parametrize("theta,head_dim", [(10000.0, 64), (500000.0, 128), (1e6, 96), (10000.0, 80)])
def test_rotary_frequencies_are_the_same_bits_on_every_machine(theta, head_dim):
    """Each frequency is the float32 nearest to its exact value (computed here in 50-digit decimals),
    not the last bit of some machine's float32 ``pow``: NumPy's differs between CPUs (AVX-512 or
    not), which once changed the shipped model's fingerprint and locked out its own adapters."""
    from decimal import Decimal, getcontext

    from mlx_specstream.arch.base import make_rope

    getcontext().prec = 50
    exact = [Decimal(1) / Decimal(theta) ** (Decimal(i) / Decimal(head_dim)) for i in range(0, head_dim, 2)]
    nearest = np.array([float(x) for x in exact]).astype(np.float32)  # one rounding, then another
    ours = np.array(make_rope({"rope_theta": theta}, head_dim).inv_freq)
    assert ours.dtype == np.float32 and np.array_equal(ours, nearest)


@pytest.mark.parametrize("edit,fragment", [
    ({"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "rope_theta": 1e4}}, "needs low_freq_factor"),
    ({"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4}}, "'linear' needs factor"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": "abc"}}, "rope_theta is 'abc'"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": -1.0}}, "rope_theta is -1.0, which is not"),
    ({"rope_parameters": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 1e4, "beta_fast": "32"}},
     "beta_fast is '32'"),
    ({"rope_parameters": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 1e4, "mscale": "x"}},
     "mscale is 'x'"),
    ({"layer_types": ["full_attention"]}, "layer_types has 1 entries, not one per layer"),
    ({"num_attention_heads": 0}, "num_attention_heads is 0, which is not at least 1"),
])
def test_a_malformed_config_is_one_config_error(llama_copy, tmp_path, edit, fragment):
    """Settings the architecture cannot be built from are refused by name, before anything is
    written (not a KeyError, IndexError or ZeroDivisionError from deep inside)."""
    from mlx_specstream.convert.hf_import import convert as hf_convert
    from mlx_specstream.errors import ConfigError

    _set_config(llama_copy, lambda c: c.update(edit))
    with pytest.raises(ConfigError, match=fragment):
        hf_convert(llama_copy, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_per_layer_lists_are_counted_against_the_familys_default():
    """A gemma3 text config lists only what differs from Gemma3TextConfig: 26 layer types without
    num_hidden_layers are one per layer (its default), 25 are not."""
    from mlx_specstream.arch import gemma3
    from mlx_specstream.errors import ConfigError

    args = gemma3.Args.from_dict({"layer_types": ["full_attention"] * 26})
    assert len(args.layer_types) == args.num_hidden_layers == 26
    with pytest.raises(ConfigError, match="layer_types has 25 entries, not one per layer \\(26\\)"):
        gemma3.Args.from_dict({"layer_types": ["full_attention"] * 25})


def test_optional_fields_are_type_checked_too(llama_copy, tmp_path):
    """A key that may be null (``head_dim``) is still refused when it holds a string."""
    from mlx_specstream.convert.hf_import import convert as hf_convert

    _set_config(llama_copy, lambda c: c.update(head_dim="64"))
    with pytest.raises(ValueError, match="head_dim is '64', which is not int or None"):
        hf_convert(llama_copy, tmp_path / "out")


def _config_json(path: Path, edit) -> None:
    cfg = json.loads((path / "config.json").read_text())
    edit(cfg)
    (path / "config.json").write_text(json.dumps(cfg))


SMALL4 = dict(SMALL, num_hidden_layers=4, num_key_value_heads=2, intermediate_size=128)


@pytest.mark.parametrize("name,config,edit", [
    # every layer of phi3 slides, as mistral's (transformers' Phi3 applies config.sliding_window)
    ("phi3_window", lambda: transformers.Phi3Config(**SMALL4, sliding_window=8, pad_token_id=0), None),
    # a mistral config with layer_types (Ministral's checkpoints): transformers loads it as Ministral,
    # whose layers slide as layer_types says
    ("mistral_layer_types", lambda: transformers.MistralConfig(**SMALL4, sliding_window=8),
     lambda c: c.update(layer_types=["full_attention", "sliding_attention"] * 2)),
    # a qwen2 config as transformers < 4.53 wrote it: no layer_types, the window from max_window_layers
    ("qwen2_legacy_window", lambda: transformers.Qwen2Config(**SMALL4, use_sliding_window=True,
                                                             sliding_window=8, max_window_layers=2),
     lambda c: c.pop("layer_types")),
    ("phi_gelu_fast", lambda: transformers.PhiConfig(**SMALL, intermediate_size=128, hidden_act="gelu_fast"),
     None),
    ("opt_no_final_norm", lambda: transformers.OPTConfig(**SMALL, ffn_dim=128, max_position_embeddings=64,
                                                         _remove_final_layer_norm=True), None),
    # SmolLM3 ties its embeddings unless the config says otherwise
    ("smollm3_tied_by_default", lambda: transformers.SmolLM3Config(**SMALL4, tie_word_embeddings=True,
                                                                                  pad_token_id=0),
     lambda c: c.pop("tie_word_embeddings")),
])
def test_configs_are_read_as_transformers_reads_them(tmp_path, name, config, edit):
    """Settings a family reads by its own defaults (windows, activations, private keys, tying): the
    converted model's logits equal transformers' on a prompt three times the window, whole and
    through the cache."""
    from mlx_specstream.convert.hf_import import convert as hf_convert

    torch.manual_seed(0)
    path = tmp_path / name
    transformers.AutoModelForCausalLM.from_config(config()).save_pretrained(path)
    if edit is not None:
        _config_json(path, edit)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    hf_convert(path, tmp_path / "mlx")
    model, _ = load(tmp_path / "mlx")
    ids = np.random.default_rng(1).integers(0, 100, (1, 24))
    ref = torch_logits(hf, ids)
    for prefill in (None, 5):
        diff = np.abs(mlx_logits(model, ids, prefill) - ref).max()
        assert diff < TOL, f"{name}: logits differ by {diff} (prefill {prefill})"


def test_converting_over_the_current_directory(converted, tmp_path, monkeypatch):
    """``--mlx-path . --overwrite`` from inside an earlier conversion replaces it and says where
    (the working directory itself is gone by then)."""
    from mlx_specstream.convert.hf_import import convert as hf_convert

    _, src, _ = converted["llama"]
    here = tmp_path / "mine"
    hf_convert(src, here)
    monkeypatch.chdir(here)
    assert hf_convert(src, ".", overwrite=True) == here
    assert load(here)[0] is not None


def test_a_malformed_quantization_config_is_one_error(converted, tmp_path):
    from mlx_specstream.errors import CheckpointError

    dest = tmp_path / "q"
    shutil.copytree(converted["llama"][2], dest)
    for q in ({"group_size": 64}, True, {"bits": "4", "group_size": 64}):
        _config_json(dest, lambda c, q=q: c.update(quantization=q))
        with pytest.raises(CheckpointError, match="not an object with whole-number bits and group_size"):
            load(dest)
