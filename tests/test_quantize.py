"""int8 / int4 group-wise quantization, at convert time (``-q --q-bits``) and at load time.

Measured against fp32 on a random llama with a non-trivial hidden size (256, group size 64).
Run this file directly to print the numbers documented in docs/import.md:

    .venv/bin/python tests/test_quantize.py
"""

import json
import re
import subprocess
import sys
from pathlib import Path

import mlx_specstream  # noqa: F401  (first: the optimized BLAS before MLX, as the scripts do)

# isort: split
import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from mlx_specstream.loader import load_model  # noqa: E402

GROUP = 64
# Documented tolerances (docs/import.md); measured values are well inside them.
TOLERANCES = {
    8: {"max_abs": 0.05, "rel": 0.03, "top1": 0.95},
    4: {"max_abs": 0.6, "rel": 0.35, "top1": 0.6},
}


def make_llama(path: Path, seed: int = 0):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(hidden_size=256, num_attention_heads=4, num_key_value_heads=2,
                                   intermediate_size=512, num_hidden_layers=2, vocab_size=512)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    model.save_pretrained(path)
    return model


def cli_convert(src, dst, *extra):
    res = subprocess.run([sys.executable, "-m", "mlx_specstream.cli", "convert", "--hf-path", str(src),
                          "--mlx-path", str(dst), *extra], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return dst


def prompt_ids():
    return mx.array(np.random.default_rng(0).integers(0, 512, (4, 64)))


def errors(q: np.ndarray, f: np.ndarray) -> dict:
    return {"max_abs": float(np.abs(q - f).max()),
            "rel": float(np.linalg.norm(q - f) / np.linalg.norm(f)),
            "top1": float((q.argmax(-1) == f.argmax(-1)).mean())}


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("q")
    make_llama(root / "hf")
    out = {"hf": root / "hf", "f32": cli_convert(root / "hf", root / "f32")}
    for bits in (8, 4):
        out[bits] = cli_convert(root / "hf", root / f"q{bits}", "-q", "--q-bits", str(bits),
                                "--q-group-size", str(GROUP))
    out["bf16"] = cli_convert(root / "hf", root / "bf16", "--dtype", "bfloat16")  # as most checkpoints
    out["bf16-q4"] = cli_convert(root / "hf", root / "bf16-q4", "--dtype", "bfloat16", "-q", "--q-bits", "4",
                                 "--q-group-size", str(GROUP))
    out["f16-q4"] = cli_convert(root / "hf", root / "f16-q4", "--dtype", "float16", "-q", "--q-bits", "4",
                                "--q-group-size", str(GROUP))
    return out


@pytest.fixture(scope="module")
def fp32_logits(dirs):
    return np.array(load_model(dirs["f32"])(prompt_ids()))


@pytest.mark.parametrize("bits", [8, 4])
def test_convert_time_quantization(dirs, fp32_logits, bits):
    cfg = json.loads((dirs[bits] / "config.json").read_text())
    assert cfg["quantization"] == {"group_size": GROUP, "bits": bits}
    model = load_model(dirs[bits])
    # every Linear and the embedding are quantized (all input dims divide by 64)
    kinds = {type(m).__name__ for _, m in model.named_modules() if hasattr(m, "weight")}
    assert kinds == {"QuantizedLinear", "QuantizedEmbedding", "RMSNorm"}
    assert all(m.bits == bits and m.group_size == GROUP for _, m in model.named_modules()
               if isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding)))
    err = errors(np.array(model(prompt_ids())), fp32_logits)
    for key, bound in TOLERANCES[bits].items():
        assert err[key] >= bound if key == "top1" else err[key] <= bound, (bits, err)
    # int8 on disk is about a quarter of fp32, int4 about an eighth (plus scales and biases)
    size = (dirs[bits] / "model.safetensors").stat().st_size
    ratio = size / (dirs["f32"] / "model.safetensors").stat().st_size
    assert ratio < {8: 0.3, 4: 0.17}[bits]


@pytest.mark.parametrize("bits", [8, 4])
def test_load_time_quantization_equals_convert_time(dirs, bits):
    ids = prompt_ids()
    at_load = load_model(dirs["f32"], quantize=(bits, GROUP))
    converted = load_model(dirs[bits])
    assert np.array_equal(np.array(at_load(ids)), np.array(converted(ids)))
    if bits == 4:  # from half precision: quantized as stored (its scales in bf16), then computed in fp32
        at_load, converted = load_model(dirs["bf16"], quantize=(4, GROUP)), load_model(dirs["bf16-q4"])
        assert np.array_equal(np.array(at_load(ids)), np.array(converted(ids)))
        # a dtype asked for is the one quantized, as convert --dtype float16 -q does
        at_load = load_model(dirs["f32"], dtype="float16", quantize=(4, GROUP))
        converted = load_model(dirs["f16-q4"], dtype="float16")
        assert np.array_equal(np.array(at_load(ids)), np.array(converted(ids)))


@pytest.mark.parametrize("bits", [8, 4])
def test_quantized_model_computes_its_dequantized_weights(dirs, bits):
    """The whole error is the weights' rounding: the quantized model equals the fp32 model
    whose weights are replaced by their dequantized values."""
    q = load_model(dirs[bits])
    ref = load_model(dirs["f32"])
    new = []
    for name, m in q.named_modules():
        if isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding)):
            w = mx.dequantize(m.weight, m.scales, m.biases, group_size=m.group_size, bits=m.bits)
            new.append((f"{name}.weight", w))
    ref.load_weights(new, strict=False)
    ids = prompt_ids()
    assert np.abs(np.array(q(ids)) - np.array(ref(ids))).max() < 1e-4


def test_same_layers_as_mlx_lm(dirs):
    """mlx-lm's own quantize_model picks the same layers (embedding and head included)."""
    from mlx_lm.utils import load_model as mlx_lm_load
    from mlx_lm.utils import quantize_model

    theirs, config = mlx_lm_load(dirs["f32"])
    theirs, _ = quantize_model(theirs, config, group_size=GROUP, bits=4)
    ours = load_model(dirs[4])

    def quantized(model):
        return {n for n, m in model.named_modules() if isinstance(m, (nn.QuantizedLinear,
                                                                      nn.QuantizedEmbedding))}

    assert quantized(theirs) == quantized(ours)
    assert {"model.embed_tokens", "lm_head"} <= quantized(ours)
    ids = prompt_ids()
    assert np.abs(np.array(theirs(ids)) - np.array(ours(ids))).max() < 1e-5


def test_layers_whose_input_does_not_divide_stay_float(tmp_path):
    """OPT with word_embed_proj_dim=32: with groups of 64, the 32-wide embedding and
    project_in stay float; everything else is quantized."""
    torch.manual_seed(0)
    cfg = transformers.OPTConfig(hidden_size=64, num_attention_heads=4, ffn_dim=128, num_hidden_layers=2,
                                 vocab_size=100, max_position_embeddings=64, word_embed_proj_dim=32)
    hf = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    hf.save_pretrained(tmp_path / "hf")
    model = load_model(cli_convert(tmp_path / "hf", tmp_path / "q", "--q-bits", "8"))  # -q implied
    d = model.model
    assert d.project_out.bits == 8
    assert type(d.embed_tokens) is nn.Embedding and type(d.project_in) is nn.Linear
    assert type(d.project_out) is nn.QuantizedLinear and type(d.layers[0].fc2) is nn.QuantizedLinear
    ids = np.arange(12)[None]
    with torch.no_grad():
        ref = hf(torch.tensor(ids)).logits.numpy()
    assert np.abs(np.array(model(mx.array(ids))) - ref).max() < 0.05


def test_quantizing_nothing_is_an_error_and_some_a_warning():
    """Groups wider than every layer's input quantize nothing: refused, not written as "int4"
    weights that are all float; a few layers left in float are said, with their count."""
    from helpers import tiny_model

    from mlx_specstream.loader import quantize_model

    wide = tiny_model("llama", hidden_size=40, intermediate_size=80)
    with pytest.raises(ValueError, match="no layer's input size divides into groups of 32"):
        quantize_model(wide, 4, 32)
    some = tiny_model("llama", hidden_size=64, intermediate_size=96)  # down_proj's 96 inputs: not 64s
    with pytest.warns(RuntimeWarning, match="4 of 30 layers stay in float") as said:  # down_proj of 4 layers
        quantize_model(some, 4, 64)
    assert said[0].filename == __file__  # the user's line that led to it, not the package's
    assert type(some.layers[0].mlp.down_proj) is nn.Linear
    assert type(some.layers[0].mlp.up_proj) is nn.QuantizedLinear


def test_load_time_quantization_of_a_quantized_model_fails(dirs):
    with pytest.raises(ValueError, match="already quantized"):
        load_model(dirs[4], quantize=(8, GROUP))
    with pytest.raises(ValueError, match=r"quantize must be \(bits, group_size\) with bits 4 or 8"):
        load_model(dirs["f32"], quantize=(3, GROUP))
    # a float that equals one (4.0) is no bit width MLX takes: said here, not by MLX's overloads
    with pytest.raises(ValueError, match=r"quantize must be .*not \(4\.0, 64\)"):
        load_model(dirs["f32"], quantize=(4.0, 64))
    from mlx_specstream.loader import asked_quantization

    for bits, size, said in ((4.0, 64, "q_bits must be 4 or 8, not 4.0"), ("4", 64, "not '4'"),
                             (4, 64.0, "q_group_size must be 32, 64 or 128, not 64.0")):
        with pytest.raises(ValueError, match=re.escape(said)):
            asked_quantization(False, bits, size)
    with pytest.raises(ValueError, match="quantize must be True or False, not 'yes'"):
        asked_quantization("yes", None, None)


def _measure():
    """Print the table of docs/import.md."""
    import platform
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        make_llama(root / "hf")
        f32 = cli_convert(root / "hf", root / "f32")
        ids = prompt_ids()
        f = np.array(load_model(f32)(ids))
        print(f"llama hidden 256, 2 layers, vocab 512, random init (std 0.02); 4x64 tokens; "
              f"group size {GROUP}; logit std {f.std():.3f}; {platform.machine()}, mlx {mx.__version__}")
        print("| weights | max abs error | relative error (L2) | top-1 agreement | file size |")
        print("|---|---|---|---|---|")
        size = (f32 / "model.safetensors").stat().st_size
        print(f"| fp32 | 0 | 0 | 100% | {size / 1e6:.2f} MB |")
        for bits in (8, 4):
            qd = cli_convert(root / "hf", root / f"q{bits}", "-q", "--q-bits", str(bits))
            e = errors(np.array(load_model(qd)(ids)), f)
            qs = (qd / "model.safetensors").stat().st_size
            print(f"| int{bits} | {e['max_abs']:.4f} | {e['rel']:.4f} | {e['top1']:.1%} | "
                  f"{qs / 1e6:.2f} MB |")


if __name__ == "__main__":
    _measure()
