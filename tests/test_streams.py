"""Multi-stream attention properties and adapters on disk."""

import json
import shutil
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from helpers import tiny_model

from mlx_specstream.adapter import (
    adapter_size,
    detach,
    fingerprint,
    fuse,
    load_adapter,
    new_adapter,
    save_adapter,
)
from mlx_specstream.api import generate
from mlx_specstream.errors import AdapterError
from mlx_specstream.streams import forward
from mlx_specstream.tree import build_tree, chain

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]


def run(model, tree=None, gamma=3):
    out = forward(model, tree or chain(PROMPT), None, 0, gamma=gamma, stream_nodes="all")
    mx.eval(out.main_logits)
    return out


def test_zero_streams_equals_base_forward():
    model = tiny_model("llama", seed=1)
    base = np.array(model(mx.array([PROMPT]))[0])
    new_adapter(model, gamma=3, msa_layers=2, seed=0)
    np.testing.assert_allclose(np.array(run(model, gamma=0).main_logits), base, atol=1e-5)


def test_lossless_main_rows_ignore_streams():
    model = tiny_model("llama", seed=1)
    base = np.array(model(mx.array([PROMPT]))[0])
    new_adapter(model, gamma=3, msa_layers=2, seed=0)
    a = run(model)
    new_adapter(model, gamma=3, msa_layers=2, seed=1)
    b = run(model)
    assert not np.allclose(np.array(a.stream_logits), np.array(b.stream_logits), atol=1e-3)
    np.testing.assert_array_equal(np.array(a.main_logits), np.array(b.main_logits))
    np.testing.assert_allclose(np.array(a.main_logits), base, atol=1e-5)


def test_shared_main_rows_depend_on_streams():
    model = tiny_model("llama", seed=1)
    new_adapter(model, mode="shared", gamma=3, msa_layers=2, seed=0)
    a = np.array(run(model).main_logits)
    model.adapter.stream_embed = model.adapter.stream_embed * 3
    b = np.array(run(model).main_logits)
    assert np.abs(a - b).max() > 1e-3


def test_stream_rows_are_causal_over_streams_and_tokens():
    """Stream (t, j) depends on tokens <= t and streams (t, 1..j) only."""
    model = tiny_model("llama", seed=2)
    new_adapter(model, gamma=3, msa_layers=2, seed=0)
    ref = np.array(run(model).stream_logits)
    changed = list(PROMPT)
    changed[5] = 0
    out = np.array(run(model, chain(changed)).stream_logits)
    np.testing.assert_allclose(out[:5], ref[:5], atol=1e-5)
    assert np.abs(out[5:] - ref[5:]).max() > 1e-4
    two = np.array(run(model, gamma=2).stream_logits)  # dropping stream 3 changes nothing before it
    np.testing.assert_allclose(two, ref[:, :2], atol=1e-5)


def test_tree_nodes_match_their_paths():
    """Main logits of a tree node equal a plain forward of its root-to-node path."""
    model = tiny_model("llama", seed=4)
    new_adapter(model, gamma=2, msa_layers=2, seed=0)
    tree = build_tree(7, [[1, 2], [3, 4]], [[-0.1, -0.2], [-0.3, -0.4]], budget=7)
    out = run(model, tree, gamma=2)
    for v in range(len(tree)):
        path, p = [], v
        while p >= 0:
            path.append(int(tree.tokens[p]))
            p = tree.parents[p]
        ref = np.array(model(mx.array([path[::-1]]))[0, -1])
        np.testing.assert_allclose(np.array(out.main_logits[v]), ref, atol=1e-5)


def test_adapter_save_load_roundtrip_and_swap(tmp_path):
    model = tiny_model("llama", seed=1)
    new_adapter(model, mode="lossless", gamma=3, msa_layers=2, seed=5)
    ref = generate(model, None, [1, 2], max_tokens=30, branch=3)
    save_adapter(model, tmp_path / "adapters" / "a")
    new_adapter(model, mode="shared", gamma=2, msa_layers=1, seed=6)
    save_adapter(model, tmp_path / "adapters" / "b")
    shared_out = generate(model, None, [1, 2], max_tokens=30, branch=3).tokens
    detach(model)
    assert getattr(model, "adapter", None) is None
    load_adapter(model, "a", model_path=tmp_path)
    again = generate(model, None, [1, 2], max_tokens=30, branch=3)
    assert again.tokens == ref.tokens and again.stats.calls == ref.stats.calls
    load_adapter(model, tmp_path / "adapters" / "b")  # swap without reloading the base
    assert model.adapter_config.mode == "shared"
    assert generate(model, None, [1, 2], max_tokens=30, branch=3).tokens == shared_out


def _with_noise(model, where: str, scale: float = 1.0):
    """``model`` with Gaussian noise of ``scale`` × each matrix's own spread added to the matrices
    whose names contain ``where``: a base of the same shape that computes something else."""
    from mlx.utils import tree_flatten, tree_unflatten

    mx.random.seed(9)
    params = [(k, v + mx.random.normal(v.shape) * mx.std(v) * scale if where in k and v.ndim > 1 else v)
              for k, v in tree_flatten(model.parameters())]
    model.update(tree_unflatten(params))
    mx.eval(model.parameters())
    return model


def test_an_adapter_knows_its_base_by_its_weights(tmp_path):
    """An adapter refuses a base of its shape whose layers (or embeddings) differ: another training
    run, or the same weights with noise (the embedding-and-head probe alone missed the layers),
    yet follows its own base through fp16, int8 and int4."""
    from mlx_specstream.loader import quantize_model

    model = tiny_model("llama", seed=1)
    new_adapter(model, gamma=2, msa_layers=2, seed=0)
    save_adapter(model, tmp_path / "a")
    for where, scale in (("layers", 1.0), ("embed_tokens", 1.0), ("layers", 0.4)):  # the last: noise a
        with pytest.raises(AdapterError, match="another base model"):  # walkthrough's base had, which
            load_adapter(_with_noise(tiny_model("llama", seed=1), where, scale), tmp_path / "a")  # passed
    cfg = json.loads((tmp_path / "a" / "adapter_config.json").read_text())
    cfg["training"] = {"base_model": "/models/mine"}  # what train records
    (tmp_path / "a" / "adapter_config.json").write_text(json.dumps(cfg))
    with pytest.raises(AdapterError, match="it was trained on /models/mine"):
        load_adapter(tiny_model("llama", seed=2), tmp_path / "a")
    for bits in (8, 4):
        quantized = tiny_model("llama", seed=1)
        quantize_model(quantized, bits, 64)
        load_adapter(quantized, tmp_path / "a")
    half = tiny_model("llama", seed=1)
    half.set_dtype(mx.float16)
    shown = repr(load_adapter(half, tmp_path / "a"))  # a notebook cell's last line: settings, not probes
    assert "base_probe" not in shown and "training={'base_model': '/models/mine'}" in shown
    save_adapter(half, tmp_path / "again")  # saved again, it still says what trained it
    with pytest.raises(AdapterError, match="it was trained on /models/mine"):
        load_adapter(tiny_model("llama", seed=2), tmp_path / "again")


def test_adapter_errors(tmp_path):
    model = tiny_model("llama", seed=1)
    new_adapter(model, gamma=2, msa_layers=2, seed=0)
    save_adapter(model, tmp_path / "ok")
    other = tiny_model("llama", seed=2)
    with pytest.raises(AdapterError, match=r"base model \(the same architecture with other weights\)"):
        load_adapter(other, tmp_path / "ok")
    with pytest.raises(AdapterError, match=r"another base model \(fingerprint \w+, this model \w+\)"):
        load_adapter(tiny_model("llama", seed=1, rope_theta=500.0), tmp_path / "ok")
    for key, value in (("base_probe", ["a", "b"]), ("base_weights_probe", [1.0, 2.0]), ("training", "x")):
        shutil.copytree(tmp_path / "ok", tmp_path / key)
        cfg = json.loads((tmp_path / key / "adapter_config.json").read_text())
        (tmp_path / key / "adapter_config.json").write_text(json.dumps({**cfg, key: value}))
        with pytest.raises(AdapterError, match=f"unreadable adapter config \\('{key}' must be"):
            load_adapter(model, tmp_path / key)
    shutil.copytree(tmp_path / "ok", tmp_path / "no_mode")  # a shared adapter would read as lossless
    cfg = json.loads((tmp_path / "no_mode" / "adapter_config.json").read_text())
    (tmp_path / "no_mode" / "adapter_config.json").write_text(json.dumps({k: v for k, v in cfg.items()
                                                                         if k != "mode"}))
    with pytest.raises(AdapterError, match=r"adapter_config.json: unreadable adapter config \(no 'mode'"):
        load_adapter(model, tmp_path / "no_mode")
    shutil.copytree(tmp_path / "ok", tmp_path / "extra")
    weights = mx.load(str(tmp_path / "extra" / "adapter.safetensors"))
    mx.save_safetensors(str(tmp_path / "extra" / "adapter.safetensors"), {**weights, "stray": mx.zeros(2)})
    with pytest.raises(AdapterError, match=r"does not match its config \(unexpected \['stray'\]\)"):
        load_adapter(model, tmp_path / "extra")
    with pytest.raises(AdapterError, match="not found"):
        load_adapter(model, "missing", model_path=tmp_path)
    (tmp_path / "ok" / "adapter.safetensors").write_bytes(b"garbage")
    with pytest.raises(AdapterError, match="corrupt"):
        load_adapter(model, tmp_path / "ok")
    save_adapter(model, tmp_path / "bad")
    cfg = json.loads((tmp_path / "bad" / "adapter_config.json").read_text())
    cfg["gamma"] = 5
    (tmp_path / "bad" / "adapter_config.json").write_text(json.dumps(cfg))
    with pytest.raises(AdapterError, match="does not match|shape"):
        load_adapter(model, tmp_path / "bad")
    with pytest.raises(AdapterError):
        new_adapter(model, mode="other")
    assert fingerprint(model) == fingerprint(tiny_model("llama", seed=1))


def test_a_bare_adapter_name_is_the_models_whatever_the_current_directory_holds(tmp_path, monkeypatch):
    """``--adapter sql`` is the model's ``adapters/sql`` even where the current directory has an
    adapter folder ``sql`` of its own; ``./sql`` is that folder."""
    model = tiny_model("llama", seed=1)
    new_adapter(model, gamma=2, msa_layers=1, seed=0)
    save_adapter(model, tmp_path / "model" / "adapters" / "sql")
    new_adapter(model, gamma=3, msa_layers=1, seed=0)
    save_adapter(model, tmp_path / "cwd" / "sql")
    monkeypatch.chdir(tmp_path / "cwd")
    assert load_adapter(model, "sql", model_path=tmp_path / "model").gamma == 2
    assert load_adapter(model, "./sql", model_path=tmp_path / "model").gamma == 3
    assert load_adapter(model, tmp_path / "cwd" / "sql", model_path=tmp_path / "model").gamma == 3
    shutil.rmtree(tmp_path / "cwd" / "sql")  # ./sql is a directory here or nothing: never the model's
    with pytest.raises(AdapterError, match="adapter './sql' not found: no such directory"):
        load_adapter(model, "./sql", model_path=tmp_path / "model")
    with pytest.raises(AdapterError, match="a Path is a directory; the string 'sql' names the model's"):
        load_adapter(model, Path("sql"), model_path=tmp_path / "model")
    shutil.copytree(tmp_path / "model" / "adapters" / "sql", tmp_path / "renamed")
    assert load_adapter(model, tmp_path / "renamed").name == "renamed"  # named by its directory


SHIPPED = Path(__file__).resolve().parents[1] / "models" / "specstream-tiny" / "mlx"


@pytest.mark.skipif(not (SHIPPED / "config.json").exists(), reason="no shipped model")
def test_shipped_adapters_load_on_the_shipped_model():
    """Every adapter the project ships is accepted by its own base here (fingerprint, probe and
    weights probe): `generate --adapter sql`, the first command a user runs, depends on it."""
    from mlx_specstream.adapter import available_adapters, made_for, read_config
    from mlx_specstream.api import load

    model, _ = load(SHIPPED)
    names = available_adapters(SHIPPED)
    assert {"sql", "sql-lossless", "code"} <= set(names)
    refused = [n for n in names if not made_for(model, read_config(SHIPPED / "adapters" / n))]
    assert not refused, f"{refused}: made for fingerprint other than {fingerprint(model)}"


@pytest.mark.parametrize("arch", ["llama", "opt"])
@pytest.mark.parametrize("mode", ["shared", "lora"])
def test_fused_adapter_computes_the_unfused_one(arch, mode, tmp_path):
    """Folding a shared/LoRA adapter into the weights changes speed, not outputs; afterwards the
    model keeps its adapter (swapping or saving it is refused)."""
    model = tiny_model(arch, seed=3)
    new_adapter(model, mode=mode, gamma=2, msa_layers=2, seed=7)
    tree = build_tree(7, [[1, 2], [3, 4]], [[-0.1, -0.2], [-0.3, -0.4]], budget=7)
    gamma, opts = (2, dict(branch=3)) if mode == "shared" else (0, dict(mode="ar"))
    ref = run(model, tree, gamma=gamma)
    ref_tokens = generate(model, None, PROMPT, max_tokens=24, **opts).tokens
    size = adapter_size(model)
    assert fuse(model)
    out = run(model, tree, gamma=gamma)
    np.testing.assert_allclose(np.array(out.main_logits), np.array(ref.main_logits), atol=1e-4)
    if mode == "shared":
        np.testing.assert_allclose(np.array(out.stream_logits), np.array(ref.stream_logits), atol=1e-4)
    assert generate(model, None, PROMPT, max_tokens=24, **opts).tokens == ref_tokens
    assert adapter_size(model) == size
    with pytest.raises(AdapterError, match="fused"):
        new_adapter(model, gamma=2, msa_layers=2)
    with pytest.raises(AdapterError, match="fused"):
        save_adapter(model, tmp_path / "x")


def test_lossless_adapters_and_quantized_bases_are_not_fused():
    import mlx.nn as nn

    model = tiny_model("llama", seed=3)
    new_adapter(model, gamma=2, msa_layers=2)
    assert not fuse(model)
    detach(model)  # still possible
    nn.quantize(model, group_size=32, bits=8)
    new_adapter(model, mode="shared", gamma=2, msa_layers=2)
    assert not fuse(model)
    detach(model)
