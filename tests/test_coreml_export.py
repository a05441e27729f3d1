"""Core ML export on tiny random models: the saved package, read back and run by the numpy
reference evaluator, computes what the MLX engine computes.

The KV cache of a package is an fp16 Core ML state. Comparisons are therefore made against the
MLX engine with its cache values rounded to fp16 (``fp16_state``; tolerance 1e-3 on the logits
of an fp32 package, tokens exact), and against the plain fp32 engine with a tolerance that comes
from fp16 rounding of keys/values (where tokens differ, the test reports the margin there).
"""

import json
import os
import shutil
import sys

import numpy as np
import pytest
from helpers import tiny_model
from test_cli import assert_one_line_error, cli
from test_coreml_common import fp16_kv, record_engine, replay, write_tokenizer

from mlx_specstream.adapter import new_adapter, save_adapter
from mlx_specstream.api import generate
from mlx_specstream.errors import OptionError
from mlx_specstream.loader import atomic_dir, save_model
from mlx_specstream.ngrams import NGRAMS_FILE, NgramTable
from mlx_specstream.outputs import check_replaceable
from mlx_specstream.runner import MLXRunner
from mlx_specstream.tree import chain

pytest.importorskip("torch")
pytest.importorskip("coremltools")

from mlx_specstream.convert.coreml_export import (  # noqa: E402
    ExportError,
    carried_quantization,
    export_coreml,
    load_for_export,
    resolve_sizes,
    tokenizer_dir,
)
from mlx_specstream.convert.mil_eval import OPS, Package, UnsupportedOpError  # noqa: E402
from mlx_specstream.coreml_driver import (  # noqa: E402
    PackageError,
    PackageRunner,
    commit_inputs,
    generate_package,
    load_package,
    tree_inputs,
)
from mlx_specstream.tokenizer import load_tokenizer  # noqa: E402

PROMPTS = [[5, 9, 2, 7, 11, 3, 8, 1, 4], [12], [33, 33, 2, 60, 17]]
SIZES = dict(context=96, tree_size=16, chunk=4)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("coreml") / "tiny"
    model = tiny_model("llama", seed=3, scale=2.0)
    with atomic_dir(d, "model") as tmp:
        save_model(model, model.config, tmp)
        write_tokenizer(tmp)
    new_adapter(model, mode="shared", gamma=3, msa_layers=2, seed=1, prune_threshold=0.05)
    save_adapter(model, d / "adapters" / "shared")
    new_adapter(model, mode="lossless", gamma=3, msa_layers=2, seed=2)
    save_adapter(model, d / "adapters" / "lossless")
    return d


@pytest.fixture(scope="module")
def packages(model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("pkgs")
    pk = {}
    pk["f32"] = export_coreml(model_dir, out / "f32.mlpackage", adapter="shared", precision="float32",
                              sampling=True, progress=None, **SIZES)
    for bits in (4, 8):
        pk[f"q{bits}"] = export_coreml(model_dir, out / f"q{bits}.mlpackage", adapter="shared", q_bits=bits,
                                       precision="float32", progress=None, **SIZES)
    return pk


def _tok(model_dir):
    return load_tokenizer(model_dir)


# -- the package: layout, metadata, weights ---------------------------------------------------
def test_package_layout_and_metadata(packages, model_dir):
    res = packages["f32"]
    check_replaceable(res.package, "Core ML package", overwrite=True)  # ours: --overwrite replaces it
    pkg = Package(res.package)
    assert sorted(pkg.functions) == ["prefill", "step"] and pkg.default_function == "step"
    step = pkg.program.functions["step"]
    assert list(step.inputs) == ["tokens", "positions", "tree_mask", "valid", "accepted", "n_accepted",
                                 "k_cache", "v_cache"]
    assert [v.name for v in step.outputs] == ["main_token", "node_kept", "stream_tokens", "stream_logprobs",
                                              "main_logits", "stream_logits"]
    assert list(pkg.program.functions["prefill"].inputs)[:3] == ["tokens", "start", "length"]
    states = pkg.state_shapes()
    assert states == pkg.state_shapes("prefill")
    assert states["k_cache"] == ((4, 2, 96, 16), np.float16)
    meta = pkg.metadata
    assert meta["specstream.gamma"] == "3" and meta["specstream.msa_layers"] == "2"
    assert meta["specstream.branch"] == "3" and meta["specstream.tree_size"] == "16"
    assert meta["specstream.context"] == "96" and meta["specstream.adapter"] == "shared"
    assert meta["specstream.tokenizer"] == "f32.tokenizer" and meta["specstream.mode"] == "shared"
    assert json.loads(meta["specstream.eos_token_ids"]) == [1]
    tdir = tokenizer_dir(res.package)
    assert (tdir / "tokenizer.json").is_file() and json.loads((tdir / "specstream.json").read_text()) == meta
    # both functions share one copy of the weights
    weights = res.package / "Data" / "com.apple.CoreML" / "weights" / "weight.bin"
    n_params = sum(v.size for v in _flat(load_for_export(model_dir, "shared", precision="float32")))
    assert weights.stat().st_size < 1.3 * 4 * n_params


def _flat(model):
    from mlx.utils import tree_flatten

    return [v for _, v in tree_flatten(model.parameters())]


@pytest.mark.parametrize("bits", [4, 8])
def test_quantized_package_carries_mlx_values(packages, model_dir, bits):
    """Every quantized weight of the package holds MLX's own integers, scales and biases."""
    from coremltools.converters.mil.mil import types

    from mlx_specstream.convert.torch_graph import SpecStreamGraph, graph_config

    model = load_for_export(model_dir, "shared", bits, 64, "float32")
    mlx_q = SpecStreamGraph(model, graph_config(model, 96, 16, 4)).quantized_weights()
    pkg = Package(packages[f"q{bits}"].package)
    ops = [op for op in pkg.program.functions["step"].operations
           if op.op_type == "constexpr_blockwise_shift_scale"]
    assert len(ops) == len(mlx_q) == 30
    by_shape = {}
    for qw in mlx_q:
        by_shape.setdefault(qw.q.shape, []).append(qw)
    for op in ops:
        data = np.asarray(op.data.val).astype(np.int64)
        match = [qw for qw in by_shape[data.shape] if np.array_equal(qw.q, data)]
        assert len(match) == 1
        qw = match[0]
        assert types.builtin_to_string(op.data.dtype) == f"uint{bits}"
        np.testing.assert_array_equal(np.asarray(op.scale.val), qw.scales)
        np.testing.assert_allclose(-np.asarray(op.offset.val) * qw.scales, qw.biases, rtol=1e-6, atol=1e-7)


# -- the package computes the engine's steps ---------------------------------------------------
def test_evaluator_equals_engine_steps(packages, model_dir):
    pkg = Package(packages["f32"].package)
    state = pkg.new_state()

    def run(function, inputs):
        return pkg.predict(inputs, state, function=function)

    model = load_for_export(model_dir, "shared", precision="float32")
    for prompt in PROMPTS[:2]:
        state.update(pkg.new_state())
        rec = record_engine(model, prompt, max_tokens=24, tree_budget=16, fp16_state=True)
        err = replay(run, rec, prompt, tree_size=16, chunk=4, context=96, accept_max=4)
        assert err["steps"] >= 6
        assert max(err["prefill"], err["main"], err["stream"]) <= 1e-3, err
    # against the fp32-cache engine: fp16 keys/values (relative error 2^-11) move logits by ~1e-3..1e-2
    state.update(pkg.new_state())
    prompt = PROMPTS[0]
    rec = record_engine(model, prompt, max_tokens=8, tree_budget=16)
    err = replay(run, rec, prompt, tree_size=16, chunk=4, context=96, accept_max=4)
    assert max(err["prefill"], err["main"], err["stream"]) <= 5e-2, err


def _check_tokens(model, runner, tok, prompt, n=40, **kw):
    """The package and the MLX model through the same decode loop (hybrid drafts on): the same
    tokens and passes when the MLX runner drafts no deeper than the package can commit."""
    mlx = MLXRunner(model)
    mlx.max_depth = runner.max_depth
    with fp16_kv():
        ref = generate(mlx, tok, prompt, max_tokens=n, streams="tree", tree_budget=16, node_cost=0.0, **kw)
    got = generate_package(runner, tok, prompt, max_tokens=n, **kw)
    assert got.tokens == ref.tokens
    assert got.stats.calls == ref.stats.calls and got.stats.kept_nodes == ref.stats.kept_nodes
    assert got.stats.accepted_lengths == ref.stats.accepted_lengths
    plain = generate(model, tok, prompt, max_tokens=n, streams="tree", tree_budget=16, node_cost=0.0, **kw)
    return got, plain


def test_greedy_and_sampled_tokens_equal_engine(packages, model_dir):
    model = load_for_export(model_dir, "shared", precision="float32")
    tok = _tok(model_dir)
    runner = PackageRunner(packages["f32"].package, backend="reference")
    assert runner.backend == "reference" and "reference evaluator" in runner.description
    longest = 0
    for prompt in PROMPTS:
        got, plain = _check_tokens(model, runner, tok, prompt)
        longest = max(longest, max(got.stats.accepted_lengths))
        if got.tokens != plain.tokens:  # fp16 state: only a near-tie may flip
            from test_coreml_common import first_difference

            i = first_difference(got.tokens, plain.tokens)
            logits = np.array(model(__import__("mlx.core").core.array([prompt + plain.tokens[:i]]))[0, -1])
            top = np.sort(logits)[-2:]
            assert top[1] - top[0] < 0.05, f"differs at {i} with margin {top[1] - top[0]}"
        _check_tokens(model, runner, tok, prompt, temperature=0.8, seed=7)
    assert longest >= 2, "no draft was ever accepted: the comparison would not exercise commits"


def test_ngram_drafts_reach_the_package(packages, model_dir):
    """The adapter's n-gram drafts, read by ``load_package`` from beside the package, draft through
    the shared loop as they do for the MLX model: the same tokens and passes, fewer passes than
    without them."""
    model = load_for_export(model_dir, "shared", precision="float32")
    tok = _tok(model_dir)
    prompt = PROMPTS[0]
    with fp16_kv():
        ar = generate(model, tok, prompt, max_tokens=40, mode="ar").tokens
    table = NgramTable.build([(prompt + ar, len(prompt))], min_count=1)
    path = tokenizer_dir(packages["f32"].package) / NGRAMS_FILE
    table.save(path)
    try:
        runner, _ = load_package(packages["f32"].package, backend="reference")
    finally:
        path.unlink()
    assert runner.ngrams.next.keys() == table.next.keys()
    model.adapter_ngrams = runner.ngrams
    got, _ = _check_tokens(model, runner, tok, prompt)
    without = generate_package(PackageRunner(packages["f32"].package, backend="reference"), tok, prompt,
                               max_tokens=40)
    assert got.tokens == without.tokens and got.stats.calls < without.stats.calls


def test_lookup_drafts_run_on_the_package(packages, model_dir):
    """Prompt-lookup chains reach the package through the shared loop: the lookup baseline equals
    plain decoding's tokens in fewer passes, up to the package's context (a step writes
    ``tree_size`` slots after the committed ones). A chain as deep as the tree fits the step's
    inputs; paths longer than the package commits are never drafted. Stop strings end it as they
    end the MLX engine."""
    model = load_for_export(model_dir, "shared", precision="float32")
    tok = _tok(model_dir)
    runner = PackageRunner(packages["f32"].package, backend="reference")
    prompt = [5, 9, 2, 5, 9, 2, 5]
    room = SIZES["context"] - SIZES["tree_size"] + 2 - len(prompt)
    assert runner.limit - len(prompt) == room
    with fp16_kv():
        ar = generate(model, tok, prompt, max_tokens=room, mode="ar")
    got = generate_package(runner, tok, prompt, max_tokens=1000, mode="lookup")
    assert got.tokens == ar.tokens and got.stats.calls < ar.stats.calls
    assert got.finish_reason == "length" and got.stats.context_limit == runner.limit
    assert max(got.stats.accepted_lengths) <= runner.info.accept_max == runner.max_depth + 1
    stop = got.text[len(got.text) // 5:][:4]
    with fp16_kv():
        ref = generate(model, tok, prompt, max_tokens=30, mode="lookup", stop=[stop])
    cut = generate_package(runner, tok, prompt, max_tokens=30, mode="lookup", stop=[stop])
    assert cut.finish_reason == ref.finish_reason == "stop" and stop not in cut.text
    assert cut.tokens == ref.tokens and cut.text == ref.text and got.text.startswith(cut.text)
    deep = chain(list(range(16)))
    inputs = tree_inputs(deep, 7, 16)
    assert inputs["positions"].tolist() == list(range(7, 23))
    assert np.array_equal(inputs["tree_mask"], np.tril(np.ones((16, 16), np.int32)))
    with pytest.raises(PackageError, match="exceeds"):
        commit_inputs(list(range(runner.info.accept_max + 1)), runner.info.accept_max)


@pytest.mark.parametrize("bits", [4, 8])
def test_quantized_tokens_equal_quantized_mlx(packages, model_dir, bits):
    model = load_for_export(model_dir, "shared", bits, 64, "float32")
    runner = PackageRunner(packages[f"q{bits}"].package, backend="reference")
    tok = _tok(model_dir)
    for prompt in PROMPTS[:2]:
        _check_tokens(model, runner, tok, prompt, n=30)
    with pytest.raises(PackageError, match="greedy decoding only"):
        generate_package(runner, tok, PROMPTS[0], temperature=0.5)
    with pytest.raises(PackageError, match="--sampling for --sql-names"):  # no logits to constrain
        generate_package(runner, tok, PROMPTS[0], sql_names=True)
    with pytest.raises(TypeError, match=r"'gamma' \(fixed when the package was exported\)"):
        generate_package(runner, tok, PROMPTS[0], gamma=2)
    with pytest.raises(TypeError, match=r"'temp' \(did you mean 'temperature'\?\)"):  # mlx-lm's name
        generate_package(runner, tok, PROMPTS[0], temp=0.5)


def test_package_is_judged_by_its_saved_file(packages, tmp_path):
    """The evaluator reads the package from disk: corrupting the stored weights changes outputs."""
    copy = tmp_path / "copy.mlpackage"
    shutil.copytree(packages["f32"].package, copy)
    inputs = {"tokens": np.array([5, 9, 2, 7], np.int32), "start": np.array([0], np.int32),
              "length": np.array([4], np.int32)}
    pkg = Package(copy)
    before = pkg.predict(inputs, pkg.new_state(), function="prefill")["main_logits"]
    blob = copy / "Data" / "com.apple.CoreML" / "weights" / "weight.bin"
    data = bytearray(blob.read_bytes())
    headers = set()  # keep the blob file's own headers (64-byte records after a 0xDEADBEEF sentinel)
    pos = data.find(b"\xef\xbe\xad\xde")
    while pos >= 0:
        headers.update(range(pos, pos + 64))
        pos = data.find(b"\xef\xbe\xad\xde", pos + 1)
    for i in range(256, len(data), 7):
        if i not in headers:
            data[i] ^= 0x01  # small changes of stored weights, the graph untouched
    blob.write_bytes(bytes(data))
    pkg2 = Package(copy)
    with np.errstate(all="ignore"):
        after = pkg2.predict(inputs, pkg2.new_state(), function="prefill")["main_logits"]
    assert not np.allclose(before, after)
    blob.write_bytes(bytes(data[:1000]))  # cut short: said as such, not coremltools' index error
    with pytest.raises(PackageError, match=r"copy.mlpackage: its program or weights do not load .*truncated"):
        Package(copy)


def test_a_package_renamed_with_its_tokenizer_finds_it(packages, tmp_path):
    """``NAME.mlpackage`` reads ``NAME.tokenizer`` beside it, whatever name it was written under."""
    res = packages["f32"]
    shutil.copytree(res.package, tmp_path / "sql.mlpackage")
    shutil.copytree(res.tokenizer, tmp_path / "sql.tokenizer")
    tok = load_package(tmp_path / "sql.mlpackage", backend="reference")[1]
    assert tok is not None and tok.encode("w3 w9") == load_tokenizer(res.tokenizer).encode("w3 w9")
    (tmp_path / "sql.tokenizer" / "ngrams.npz").write_bytes(b"not a table")  # one line naming the file
    with pytest.raises(PackageError, match=r"sql.tokenizer/ngrams.npz: corrupt n-gram table"):
        load_package(tmp_path / "sql.mlpackage", backend="reference")
    for f in (tmp_path / "sql.tokenizer").iterdir():  # there, but empty: not "no directory"
        f.unlink()
    with pytest.raises(PackageError, match=r"sql.tokenizer: holds no tokenizer files"):
        load_package(tmp_path / "sql.mlpackage", backend="reference")


def test_a_directory_quantized_at_import_is_carried_as_quantized(model_dir, tmp_path):
    """Exported without --q-bits, an int8 model directory (as `convert -q` writes one) carries int8
    in its groups, not float: what export_coreml then records (specstream.q_bits) and reports."""
    from mlx_specstream.loader import load_model, quantize_model

    assert carried_quantization(load_for_export(model_dir), None, 64) == (None, 64)
    model = load_model(model_dir)
    quantize_model(model, 8, 32)
    with atomic_dir(tmp_path / "q8", "model") as tmp:
        save_model(model, {**model.config, "quantization": {"group_size": 32, "bits": 8}}, tmp)
    assert carried_quantization(load_for_export(tmp_path / "q8"), None, 64) == (8, 32)
    assert carried_quantization(load_for_export(model_dir), 4, 64) == (4, 64)
    # a tuned adapter's fine-tune folds into float weights only: refused at load, before any work
    model = load_model(tmp_path / "q8")
    new_adapter(model, mode="lossless", gamma=2, msa_layers=2, main_rank=4)
    save_adapter(model, tmp_path / "q8" / "adapters" / "tuned")
    with pytest.raises(ExportError, match=r"shared adapter\) must have it folded into float weights"):
        load_for_export(tmp_path / "q8", "tuned")


def test_unknown_op_fails_loudly(packages, monkeypatch):
    pkg = Package(packages["f32"].package)
    monkeypatch.delitem(OPS, "softmax")
    with pytest.raises(UnsupportedOpError, match="'softmax'"):
        pkg.predict({"tokens": np.zeros(4, np.int32), "start": np.zeros(1, np.int32),
                     "length": np.ones(1, np.int32)}, pkg.new_state(), function="prefill")


@pytest.mark.slow  # three exports (~40 s); quantized packages equal quantized MLX by default
def test_size_ratios(tmp_path_factory):
    """int4 <= 0.35x and int8 <= 0.6x the fp16 package, on a model whose weights dominate."""
    d = tmp_path_factory.mktemp("size") / "m"
    model = tiny_model("llama", seed=0, hidden_size=512, intermediate_size=1536, num_hidden_layers=2,
                       vocab_size=2048, num_attention_heads=8, num_key_value_heads=4)
    with atomic_dir(d, "model") as tmp:
        save_model(model, model.config, tmp)
    new_adapter(model, mode="lossless", gamma=3, msa_layers=1, seed=1)
    save_adapter(model, d / "adapters" / "a")
    sizes = {}
    for bits in (None, 4, 8):
        res = export_coreml(d, d.parent / f"q{bits}.mlpackage", adapter="a", q_bits=bits, context=128,
                            tree_size=16, chunk=16, progress=None)
        sizes[bits] = res.size_bytes
    assert sizes[4] <= 0.35 * sizes[None], sizes
    assert sizes[8] <= 0.6 * sizes[None], sizes


def test_quantization_is_asked_for_as_when_converting_to_mlx(tmp_path, monkeypatch):
    """``quantize``, ``q_bits`` or ``q_group_size`` alone asks for it (4 bits in groups of 64
    unless given), in Python as on the command line: a group size alone is not float."""
    from mlx_specstream.convert import coreml_export

    seen = []

    def load_for_export(model_path, adapter, q_bits, q_group_size, precision):
        seen.append((q_bits, q_group_size))
        raise RuntimeError("stop here")

    monkeypatch.setattr(coreml_export, "load_for_export", load_for_export)
    asks = ({}, {"q_group_size": 32}, {"quantize": True}, {"q_bits": 8}, {"q_bits": 8, "q_group_size": 128})
    for options in asks:
        with pytest.raises(RuntimeError, match="stop here"):
            export_coreml(tmp_path / "m", tmp_path / "x.mlpackage", progress=None, **options)
    assert seen == [(None, 64), (4, 32), (4, 64), (8, 64), (8, 128)]


def test_export_failure_leaves_nothing(model_dir, tmp_path, monkeypatch):
    from mlx_specstream.convert import coreml_export

    def boom(*a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(coreml_export, "_finish_function", boom)
    for out in (tmp_path / "x.mlpackage", tmp_path / "new" / "deeper" / "x.mlpackage"):  # and folders
        with pytest.raises(RuntimeError, match="disk full"):
            export_coreml(model_dir, out, adapter="lossless", progress=None, **SIZES)
        assert os.listdir(tmp_path) == []

    def copy_fails(*a, **k):  # coremltools' copy of a package on a full disk: shutil's list of failures
        raise shutil.Error([("a/weight.bin", "b/weight.bin", "[Errno 28] No space left on device")])

    monkeypatch.setattr(coreml_export, "_finish_function", copy_fails)
    with pytest.raises(OSError, match=r"^cannot write .*x.mlpackage: \[Errno 28\] No space left on device$"):
        export_coreml(model_dir, tmp_path / "x.mlpackage", adapter="lossless", progress=None, **SIZES)
    assert os.listdir(tmp_path) == []
    with pytest.raises(ExportError, match="tree_size=99 is out of range 1..40"):
        export_coreml(model_dir, tmp_path / "x.mlpackage", adapter="lossless", tree_size=99, progress=None)
    assert os.listdir(tmp_path) == []


# -- the command line ---------------------------------------------------------------------------
@pytest.mark.slow  # 23 s: convert and generate as processes; the package itself is checked by the API's tests
def test_cli_convert_and_generate(model_dir, tmp_path):
    out = tmp_path / "app" / "tiny.mlpackage"
    table = NgramTable.build([([3, 9, 0, 5, 3, 9, 0, 5], 1)], min_count=1)
    table.save(model_dir / "adapters" / "lossless" / NGRAMS_FILE)  # the adapter's n-gram drafts
    try:
        res = cli("convert", "--to", "coreml", "--model", str(model_dir), "--adapter", "lossless",
                  "--out", str(out), "--context", "64", "--tree-size", "12", "--chunk", "8")
    finally:
        (model_dir / "adapters" / "lossless" / NGRAMS_FILE).unlink()
    assert res.returncode == 0, res.stderr
    assert "wrote" in res.stdout and "[coreml] converting step" in res.stderr
    assert "(64 cache slots, less a step's tree of 12, plus 2) holds 54 tokens of prompt" in res.stdout
    assert sorted(os.listdir(out.parent)) == ["tiny.mlpackage", "tiny.tokenizer"]
    assert load_package(out, backend="reference")[0].ngrams.next.keys() == table.next.keys()
    meta = Package(out).metadata
    assert meta["specstream.precision"] == "float16" and meta["specstream.tree_size"] == "12"
    assert meta["specstream.mode"] == "lossless"

    res = cli("generate", "--model", str(out), "--prompt", "w3 w9 w0 w5", "--max-tokens", "12")
    assert res.returncode == 0, res.stderr
    assert "reference evaluator" in res.stderr
    said = cli("generate", "--model", str(out), "--prompt", "w3", "--max-tokens", "2", "--verbose").stderr
    assert "running tiny.mlpackage (adapter lossless (lossless, γ = 3); float16 compute, a tree of 12 " \
           "nodes a step) on the reference evaluator" in said, said
    # the fp16 package against the fp32 MLX model (fp16 KV): same text unless a near-tie flips
    model = load_for_export(model_dir, "lossless", precision="float32")
    tok = _tok(model_dir)
    with fp16_kv():
        ref = generate(model, tok, "w3 w9 w0 w5", max_tokens=12, streams="tree", tree_budget=12,
                           node_cost=0.0)
    words_got, words_ref = res.stdout.split(), ref.text.split()
    assert words_got[:4] == words_ref[:4], (res.stdout, ref.text)

    res = cli("generate", "--model", str(out), "--prompt", "w1", "--temp", "0.5")
    assert_one_line_error(res, "greedy decoding only")
    res = cli("generate", "--model", str(out), "--adapter", "x", "--prompt", "w1")
    assert_one_line_error(res, "fixes its adapter")


@pytest.mark.parametrize("args,fragment", [
    (["--adapter", "nope"], "adapter 'nope' not found"),
    (["--adapter", "lossless", "--tree-size", "0"], "--tree-size 0 is out of range"),
    (["--adapter", "lossless", "--tree-size", "41"], "--tree-size 41 is out of range 1..40"),
    (["--adapter", "lossless", "--context", "8", "--tree-size", "16"], "--context 8 is out of range"),
    (["--adapter", "lossless", "--context", "100000"], "--context 100000 is out of range"),
    (["--adapter", "lossless", "--q-bits", "3"], "--q-bits must be 4 or 8"),
    (["--chunk", "5000"], "--chunk 5000 is out of range 1..4096"),
    (["--adapter", "lossless", "--precision", "bfloat16"], "--precision must be float16 or float32"),
])
def test_cli_bad_input(model_dir, tmp_path, args, fragment):
    res = cli("convert", "--to", "coreml", "--model", str(model_dir), "--out", str(tmp_path / "o.mlpackage"),
              *args)
    assert_one_line_error(res, fragment)
    assert os.listdir(tmp_path) == []


def test_cli_bad_output_paths(model_dir, tmp_path):
    (tmp_path / "taken.mlpackage").mkdir()
    (tmp_path / "taken.mlpackage" / "notes.txt").write_text("mine")
    res = cli("convert", "--to", "coreml", "--model", str(model_dir), "--out",
              str(tmp_path / "taken.mlpackage"), "--overwrite")
    assert_one_line_error(res, "taken.mlpackage: holds files mlx-specstream did not write as a Core ML")
    (tmp_path / "file").write_text("x")
    res = cli("convert", "--to", "coreml", "--model", str(model_dir), "--out",
              str(tmp_path / "file" / "o.mlpackage"))
    assert_one_line_error(res, "cannot write")
    res = cli("convert", "--to", "coreml", "--model", str(model_dir), "--out", str(tmp_path / "o.mlmodel"))
    assert_one_line_error(res, "must end with .mlpackage")
    res = cli("convert", "--to", "coreml", "--model", str(model_dir))
    assert_one_line_error(res, "--to coreml needs --out NAME.mlpackage")
    assert sorted(os.listdir(tmp_path)) == ["file", "taken.mlpackage"]
    assert os.listdir(tmp_path / "taken.mlpackage") == ["notes.txt"]
    (tmp_path / "empty.mlpackage").mkdir()  # an export into it would be taken: nothing in it to lose
    res = cli("generate", "--model", str(tmp_path / "empty.mlpackage"), "--prompt", "w1")
    assert_one_line_error(res, "empty.mlpackage: not an .mlpackage (no Manifest.json)")


@pytest.mark.skipif(sys.platform == "darwin", reason="Core ML runs packages there")
def test_core_ml_backend_off_macos_is_said(packages):
    with pytest.raises(PackageError, match="backend 'coreml' runs packages on macOS"):
        load_package(packages["f32"].package, backend="coreml")


def test_base_model_package(model_dir, tmp_path):
    """Without an adapter: a one-node tree per step by default, the plain model's greedy tokens;
    with a larger tree, prompt-lookup chains as deep as the tree are verified and committed."""
    assert resolve_sizes(load_for_export(model_dir), None, None, None)[1] == 1
    with pytest.raises(OptionError, match="branch must be at most 256, not 300"):  # tree.TREE_LIMITS
        resolve_sizes(load_for_export(model_dir, "lossless"), None, None, None, branch=300)
    res = export_coreml(model_dir, tmp_path / "base.mlpackage", precision="float32", context=64, chunk=4,
                        tree_size=8, progress=None)
    meta = res.metadata
    from mlx_specstream.loader import model_name

    assert meta["specstream.model"] == model_name(model_dir) == model_dir.resolve().name
    assert model_name(tmp_path / "specstream-tiny" / "mlx") == "specstream-tiny"  # not "mlx": the server's id
    assert meta["specstream.mode"] == "base" and meta["specstream.gamma"] == "0"
    assert meta["specstream.tree_size"] == meta["specstream.accept_max"] == "8"
    mask = os.umask(0o022)
    os.umask(mask)
    for f in (tmp_path / "base.mlpackage").rglob("*"):  # readable as any new file (not mkstemp's 0600)
        assert f.stat().st_mode & 0o777 == (0o777 if f.is_dir() else 0o666) & ~mask, f
    model = load_for_export(model_dir, None, precision="float32")
    prompt = PROMPTS[0]
    with fp16_kv():
        ref = generate(model, None, prompt, max_tokens=20, mode="ar")
    got = generate_package(PackageRunner(res.package, backend="reference"), None, prompt, max_tokens=20)
    assert got.tokens == ref.tokens
    with pytest.raises(ValueError, match=r"at most 57 fit: the package's context \(64 cache slots, less a "
                                         r"step's tree of 8, plus 2\) holds 58 tokens"):
        generate_package(PackageRunner(res.package, backend="reference"), None, [5] * 60, max_tokens=2)
    repeats = [5, 9, 2, 5, 9, 2, 5]
    with fp16_kv():
        ref = generate(model, None, repeats, max_tokens=20, mode="ar")
    got = generate_package(PackageRunner(res.package, backend="reference"), None, repeats, max_tokens=20,
                           mode="lookup")
    assert got.tokens == ref.tokens and max(got.stats.accepted_lengths) > 1


def test_a_layer_core_ml_cannot_carry_is_refused_before_any_work(tmp_path):
    """An mlx-lm mixed-bit directory (a 6-bit layer among 4-bit ones) is refused when it is loaded,
    naming the layer, not after the graph is built."""
    import mlx.nn as nn

    model = tiny_model("llama", seed=3)
    layer, six = "model.layers.0.mlp.up_proj", {"bits": 6, "group_size": 32}
    nn.quantize(model, group_size=32, bits=4,
                class_predicate=lambda p, m: six if p == layer else isinstance(m, nn.Linear))
    cfg = {**model.config, "quantization": {"group_size": 32, "bits": 4, layer: six}}
    with atomic_dir(tmp_path / "mixed", "model") as tmp:
        save_model(model, cfg, tmp)
    with pytest.raises(ExportError, match=f"{layer}: 6-bit weights cannot be exported"):
        load_for_export(tmp_path / "mixed")


def test_a_package_holds_no_more_than_the_model():
    """A package's slots may hold more tokens than the model's own context (no tree: context + 1);
    it then holds what the MLX engine holds for the same model (MLXRunner.limit), said as it says."""
    from mlx_specstream.coreml_driver import PackageInfo

    engine = MLXRunner(tiny_model("llama", seed=0, max_position_embeddings=128))
    meta = {"specstream.format": "1", "specstream.gamma": "0", "specstream.msa_layers": "0",
            "specstream.branch": "1", "specstream.tree_size": "1", "specstream.accept_max": "1",
            "specstream.context": str(engine.limit), "specstream.chunk": "8", "specstream.vocab_size": "64"}
    old = PackageInfo.from_metadata(meta, "old.mlpackage")  # recorded no limit: its slots'
    assert (old.holds, old.holds_said.startswith("the package's context")) == (engine.limit + 1, True)
    info = PackageInfo.from_metadata({**meta, "specstream.max_positions": str(engine.limit)}, "p.mlpackage")
    assert (info.holds, info.holds_said) == (engine.limit, engine.limit_source)
    roomy = PackageInfo.from_metadata({**meta, "specstream.context": str(engine.limit - 9),
                                       "specstream.max_positions": str(engine.limit)}, "p.mlpackage")
    assert roomy.holds == engine.limit - 8 and roomy.holds_said.startswith("the package's context")


@pytest.mark.parametrize("missing", ["coremltools", "torch"])
def test_missing_coreml_extra_is_one_line_before_any_work(packages, model_dir, tmp_path, missing):
    """Without the ``coreml`` extra, export and running a package each say what is missing and
    how to install it, in one line, before any progress line (no traceback, nothing written)."""
    import subprocess
    import sys

    (tmp_path / "block").mkdir()
    (tmp_path / "block" / "sitecustomize.py").write_text(
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name.split('.')[0] == {missing!r}:\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}')\n"
        "sys.meta_path.insert(0, Block())\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "block")}

    def run(*args):
        return subprocess.run([sys.executable, "-m", "mlx_specstream.cli", *args], capture_output=True,
                              text=True, timeout=600, env=env)

    out = tmp_path / "o.mlpackage"
    res = run("convert", "--to", "coreml", "--model", str(model_dir), "--out", str(out))
    assert_one_line_error(res, f"Core ML export needs {missing}: pip install 'mlx-specstream[coreml]'")
    assert not out.exists()
    if missing == "coremltools":  # a package is read with coremltools alone
        res = run("generate", "-m", str(packages["f32"].package), "--prompt", "x", "-n", "2")
        assert_one_line_error(res, "reading a Core ML package needs coremltools")
