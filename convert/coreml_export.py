"""Export an MLX model (+ speculative adapter) as a stateful Core ML package for iOS 18 / macOS 15.

``export_coreml`` (CLI: ``specstream-mlx convert --to coreml``) writes ``NAME.mlpackage``: one
multifunction ML program with the functions ``prefill`` and ``step`` (default) sharing their
weights, the main stream's KV cache as two fp16 Core ML states (``k_cache``, ``v_cache``), and
the Speculative Streaming settings in the package's user metadata. The tokenizer files go to the
directory ``NAME.tokenizer`` beside it. See :mod:`mlx_specstream.convert.torch_graph` for the
functions' inputs and outputs and docs/coreml.md for the app side.

How: the PyTorch graph of torch_graph is built from the MLX model's own weights, traced with
``torch.jit.trace`` and converted by coremltools. With ``q_bits`` the MLX model is quantized by
MLX (``nn.quantize``: affine, per group of ``q_group_size`` inputs) and the package carries
those very integers, scales and biases: after conversion every weight const of a quantized layer
is replaced by ``constexpr_blockwise_shift_scale(data=q, scale=s, offset=-b/s)`` (same groups),
so Core ML computes ``s * (q + b/s) = s*q + b``, the function the quantized MLX model computes.
Nothing is quantized a second time.

Errors about the input (model, adapter, sizes, options, output path) are raised before anything
is written, and the package is assembled in a temporary directory next to the destination and
moved into place only when complete.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import MissingPackageError, SaidInOptions, verbatim
from ..loader import model_name
from ..ngrams import NGRAMS_FILE
from ..outputs import (
    check_replaceable,
    check_writable,
    copy_tokenizer,
    make_parents,
    remove_empty,
    replace_dirs,
    temp_dir_beside,
    terminate_cleanly,
    umask_modes,
)
from ..streams import check_prune_threshold
from .mil_eval import coremltools

FORMAT_VERSION = "1"
MAX_CONTEXT = 32768
MAX_TREE = 256
PRECISIONS = ("float16", "float32")


class ExportError(SaidInOptions, ValueError):
    """A Core ML export cannot be made with these inputs (shown as one line; options named as
    :class:`~mlx_specstream.errors.SaidInOptions` says, paths and other text in ``subject``)."""


@dataclass
class ExportResult:
    package: Path
    tokenizer: Path | None
    size_bytes: int
    metadata: dict[str, str]
    seconds: float


def _stderr_progress(msg: str) -> None:
    print(f"[coreml] {msg}", file=sys.stderr, flush=True)


def tokenizer_dir(package: str | Path) -> Path:
    """Where the tokenizer files of ``NAME.mlpackage`` live: ``NAME.tokenizer`` beside it."""
    package = Path(package)
    return package.with_name(package.name[: -len(".mlpackage")] + ".tokenizer")


def dir_size(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


# -- loading the MLX model the package will compute --------------------------------------------
def load_for_export(model_path: str | Path, adapter: str | Path | None = None, q_bits: int | None = None,
                    q_group_size: int = 64, precision: str = "float16"):
    """The MLX model (with adapter) that a package exported with these settings computes.

    The adapter is attached to the float model as saved (its base fingerprint is checked there;
    a tuned adapter's fine-tune is folded into the weights), then the model is cast to
    ``precision`` and, with ``q_bits``, quantized by MLX. Tests use this same function for the
    MLX side of every comparison.
    """
    import mlx.core as mx

    from ..adapter import fuse, load_adapter
    from ..loader import check_quantization, load_model, quantize_model

    _check_precision(precision)
    if q_bits is not None:
        check_quantization(q_bits, q_group_size)
    model = load_model(model_path)
    model.path = Path(model_path)
    if adapter is not None:
        load_adapter(model, adapter, model_path=model_path)
        if model.adapter_config.main_rank:  # a tuned adapter: its fine-tune becomes the weights
            fuse(model)
    from ..errors import UnsupportedModelError
    from .torch_graph import check_exportable

    for name, layer in model.named_modules():  # every layer checked before any progress line
        try:
            check_exportable(layer)
        except UnsupportedModelError as e:
            raise ExportError("", subject=f"{model_path}: {name}: {e}") from None
    already = model.config.get("quantization")
    if already and q_bits is not None:
        raise ExportError(f" is already quantized ({already.get('bits')} bits): drop {{quantize}}, "
                          "{q_bits} and {q_group_size}", subject=str(model_path))
    dtype = mx.float16 if precision == "float16" else mx.float32
    model.set_dtype(dtype)
    if q_bits is not None:
        quantize_model(model, q_bits, q_group_size)
    mx.eval(model.parameters())
    return model


# -- option checks -------------------------------------------------------------------------------
def _check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise ExportError(f"{{precision}} must be {' or '.join(PRECISIONS)}, not '{verbatim(precision)}'")


def _check_out(out: Path, overwrite: bool) -> Path:
    out = Path(out)
    if out.suffix != ".mlpackage":
        raise ExportError(": {out} must end with .mlpackage", subject=str(out))
    check_replaceable(out, "Core ML package", overwrite)
    check_replaceable(tokenizer_dir(out), "Core ML tokenizer", overwrite)
    check_writable(out.parent if str(out.parent) else Path("."))  # tried, not guessed from modes
    return out


def resolve_sizes(model, context: int | None, tree_size: int | None, chunk: int | None,
                  branch: int | None = None) -> tuple[int, int, int, int]:
    """(context, tree size, chunk, branch) with defaults, checked against the model and adapter."""
    from ..tree import check_tree_sizes
    from .torch_graph import full_tree_size

    acfg = getattr(model, "adapter_config", None)
    max_pos = int(model.config.get("max_position_embeddings") or MAX_CONTEXT)
    ctx_max = min(max_pos, MAX_CONTEXT)
    if acfg is not None:
        branch = branch if branch is not None else acfg.branch
        check_tree_sizes(branch=branch)
        tree_max = min(full_tree_size(acfg.gamma, branch), MAX_TREE)
        tree_size = tree_size if tree_size is not None else min(acfg.tree_budget, tree_max)
    else:
        branch = 1
        tree_max = 64
        tree_size = tree_size if tree_size is not None else 1  # plain decoding; more: lookup chains
    if not 1 <= tree_size <= tree_max:
        what = f"gamma={acfg.gamma}, branch={branch}" if acfg is not None else "no adapter"
        raise ExportError(f"{{tree_size={tree_size}}} is out of range 1..{tree_max} ({what})")
    chunk = chunk if chunk is not None else 64
    context = context if context is not None else min(ctx_max, 2048)
    if not 1 <= chunk <= min(4096, ctx_max):
        raise ExportError(f"{{chunk={chunk}}} is out of range 1..{min(4096, ctx_max)} "
                          f"(model limit {max_pos})")
    low = max(tree_size + 1, chunk)
    if not low <= context <= ctx_max:
        raise ExportError(f"{{context={context}}} is out of range {low}..{ctx_max} "
                          f"(tree size {tree_size}, chunk {chunk}, model limit {max_pos})")
    return context, tree_size, chunk, branch


# -- the conversion ------------------------------------------------------------------------------
def _export_tools():
    """coremltools (:func:`~.mil_eval.coremltools`), once torch is there too: both are the
    ``coreml`` extra's, said in one line before any work where either is missing."""
    try:
        import torch  # noqa: F401
    except ImportError:
        raise MissingPackageError("Core ML export needs torch: pip install "
                                  "'mlx-specstream[coreml]'") from None
    return coremltools("Core ML export")


def _convert_function(ct, graph, mode: str, precision: str):
    import torch

    from .torch_graph import PREFILL_INPUTS, STEP_INPUTS, prefill_output_names, step_output_names

    graph.mode = mode
    example = graph.example_inputs(mode)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(graph, example, check_trace=False)
    graph.reset_cache()
    names = PREFILL_INPUTS if mode == "prefill" else STEP_INPUTS
    outputs = prefill_output_names(graph.gc) if mode == "prefill" else step_output_names(graph.gc)
    shape = tuple(graph.k_cache.shape)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ct.convert(
            traced,
            inputs=[ct.TensorType(name=n, shape=tuple(x.shape), dtype=np.int32)
                    for n, x in zip(names, example)],
            outputs=[ct.TensorType(name=o) for o in outputs],
            states=[ct.StateType(wrapped_type=ct.TensorType(shape=shape, dtype=np.float16), name=n)
                    for n in ("k_cache", "v_cache")],
            minimum_deployment_target=ct.target.iOS18,
            convert_to="mlprogram",
            compute_precision=ct.precision.FLOAT32 if precision == "float32" else ct.precision.FLOAT16,
            compute_units=ct.ComputeUnit.CPU_AND_GPU,
            skip_model_load=True,
        )


def _offsets(qw, dtype) -> tuple[np.ndarray, np.ndarray]:
    """Scale and offset of ``s * (q - o)`` for MLX's ``s * q + b``: o = -b / s.

    A group whose offset does not fit the dtype (a constant group, where MLX's scale is ~0)
    is rewritten exactly: all its q are equal, so s' = w and o' = q - 1 give the same values.
    """
    s = qw.scales.astype(np.float32)
    b = qw.biases.astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        o = -b / s
    limit = 4.0 * 2**qw.bits
    bad = ~np.isfinite(o) | (np.abs(o) > limit)
    if np.any(bad):
        g = qw.group_size
        groups = qw.q.reshape(qw.q.shape[0], -1, g)
        const = np.all(groups == groups[:, :, :1], axis=-1)
        if np.any(bad & ~const):
            raise ExportError("a quantized group has an offset that Core ML cannot carry exactly")
        q0 = groups[:, :, 0].astype(np.float32)
        s = np.where(bad, s * q0 + b, s)
        o = np.where(bad, q0 - 1.0, o)
    return s.astype(dtype), o.astype(dtype)


def carry_quantized_weights(program, qweights, dtype) -> int:
    """Replace the float consts of MLX-quantized weights by blockwise dequantization ops that
    hold MLX's integers, scales and offsets. Returns how many consts were replaced."""
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.mil import types
    from coremltools.converters.mil.mil.scope import ScopeInfo

    table = {}
    for qw in qweights:
        w = qw.dequantize().astype(dtype)
        table.setdefault((w.shape, hashlib.sha1(w.tobytes()).hexdigest()), qw)
    found: set[int] = set()
    replaced = 0
    for func in program.functions.values():
        for op in list(func.operations):
            if op.op_type != "const":
                continue
            val = op.outputs[0].val
            if not isinstance(val, np.ndarray) or val.ndim != 2 or val.dtype != dtype:
                continue
            qw = table.get((val.shape, hashlib.sha1(np.ascontiguousarray(val).tobytes()).hexdigest()))
            if qw is None:
                continue
            scale, offset = _offsets(qw, dtype)
            data = qw.q.astype(types.np_uint4_dtype if qw.bits == 4 else np.uint8)
            essential = getattr(func, "_essential_scope_sources", [])
            scopes = [ScopeInfo(source=k, data=list(op.scopes[k])) for k in essential if op.scopes.get(k)]
            with func, mb.scope(*scopes):
                new = mb.constexpr_blockwise_shift_scale(data=data, scale=scale, offset=offset,
                                                         before_op=op, name=op.name + "_mlx_q")
            func.replace_uses_of_var_after_op(anchor_op=op, old_var=op.outputs[0], new_var=new)
            func.remove_ops([op])
            found.add(id(qw))
            replaced += 1
    missing = [qw.q.shape for qw in qweights if id(qw) not in found]
    if missing:
        raise RuntimeError(f"internal error: quantized weights of shape {missing[:3]} were not found in "
                           "the converted program")
    return replaced


def _finish_function(ct, mlmodel, qweights, precision: str):
    """The converted function with MLX's quantized weights carried over, re-serialized."""
    if not qweights:
        return mlmodel
    prog = mlmodel._mil_program
    dtype = np.float16 if precision == "float16" else np.float32
    carry_quantized_weights(prog, qweights, dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ct.convert(prog, convert_to="mlprogram", minimum_deployment_target=ct.target.iOS18,
                          compute_precision=ct.precision.FLOAT32, pass_pipeline=ct.PassPipeline.EMPTY,
                          compute_units=ct.ComputeUnit.CPU_AND_GPU, skip_model_load=True)


INPUT_DOCS = {
    ("prefill", "tokens"): "prompt token ids of this chunk (padded)",
    ("prefill", "start"): "position of the chunk's first token (= tokens already in the cache)",
    ("prefill", "length"): "number of real tokens in the chunk",
    ("step", "tokens"): "token ids of the flattened draft tree, root first, parents before children",
    ("step", "positions"): "position of each node: n + depth (node 0 is the root at n)",
    ("step", "tree_mask"): "tree_mask[v, u] = 1 when u is v or an ancestor of v",
    ("step", "valid"): "1 for real nodes, 0 for padding",
    ("step", "accepted"): "node indices of the previous step's accepted path (padded)",
    ("step", "n_accepted"): "length of that path (0 on the first step)",
}
OUTPUT_DOCS = {
    "main_token": "main stream's greedy next token per node",
    "main_logits": "main stream's next-token logits per node (sampling)",
    "node_kept": "1 for nodes that survived early-exit pruning",
    "stream_tokens": "top-branch token ids per node and stream",
    "stream_logprobs": "their log-probabilities",
    "stream_logits": "stream logits per node and stream (sampling)",
}


def _metadata(model, gc, model_path, adapter_name, precision, q_bits, q_group_size, tok_name, tok):
    acfg = getattr(model, "adapter_config", None)
    meta = {
        "specstream.format": FORMAT_VERSION,
        "specstream.functions": "prefill,step",
        "specstream.model": model_name(model_path),
        "specstream.model_type": model.config.get("model_type", ""),
        "specstream.adapter": adapter_name or "",
        "specstream.mode": acfg.mode if acfg is not None else "base",
        "specstream.gamma": str(gc.gamma),
        "specstream.msa_layers": str(gc.msa_layers),
        "specstream.branch": str(gc.branch),
        "specstream.tree_size": str(gc.tree_size),
        "specstream.accept_max": str(gc.accept_max),
        "specstream.context": str(gc.context),
        "specstream.max_positions": str(model.max_positions or 0),
        "specstream.chunk": str(gc.chunk),
        "specstream.vocab_size": str(gc.vocab),
        "specstream.prune_layer": str(gc.prune_layer),
        "specstream.prune_threshold": repr(float(gc.prune_threshold)),
        "specstream.sampling": "1" if gc.sampling else "0",
        "specstream.precision": precision,
        "specstream.state_dtype": "float16",
        "specstream.q_bits": str(q_bits or 0),
        "specstream.q_group_size": str(q_group_size if q_bits else 0),
        "specstream.tokenizer": tok_name or "",
        "specstream.eos_token_ids": json.dumps(sorted(tok.eos_token_ids)) if tok is not None else "[]",
        "specstream.bos_token_id": "" if tok is None or tok.bos_token_id is None else str(tok.bos_token_id),
        "specstream.add_bos": "" if tok is None or tok.add_bos_token is None else str(int(tok.add_bos_token)),
        "specstream.compute_units": "cpuAndGPU",
    }
    return meta


def _describe_spec(spec, meta: dict[str, str], model_path) -> None:
    spec.description.metadata.shortDescription = (
        f"Speculative Streaming ({meta['specstream.mode']}, gamma={meta['specstream.gamma']}) of "
        f"{model_name(model_path)}: functions prefill and step; see docs/coreml.md")
    spec.description.metadata.author = "mlx-specstream"
    spec.description.metadata.versionString = FORMAT_VERSION
    for k, v in meta.items():
        spec.description.metadata.userDefined[k] = v
    for fdesc in spec.description.functions:
        for feature in fdesc.input:
            feature.shortDescription = INPUT_DOCS.get((fdesc.name, feature.name), "")
        for feature in fdesc.output:
            feature.shortDescription = OUTPUT_DOCS.get(feature.name, "")
        for feature in fdesc.state:
            feature.shortDescription = "main-stream keys/values (layers, kv heads, context, head dim)"


def carried_quantization(model, q_bits: int | None, q_group_size: int) -> tuple[int | None, int]:
    """The bits and group size of the integer weights a package carries: those asked for at export,
    or those the model directory was quantized with at import (its ``quantization``)."""
    done = model.config.get("quantization")
    if q_bits is None and done:
        return done["bits"], done["group_size"]
    return q_bits, q_group_size


def export_coreml(model_path: str | Path, out: str | Path, *, adapter: str | Path | None = None,
                  quantize: bool = False, q_bits: int | None = None, q_group_size: int | None = None,
                  precision: str = "float16",
                  context: int | None = None, tree_size: int | None = None, chunk: int | None = None,
                  sampling: bool = False, branch: int | None = None,
                  prune_threshold: float | None = None, overwrite: bool = False,
                  progress: Callable[[str], None] | None = _stderr_progress) -> ExportResult:
    """Write ``out`` (``NAME.mlpackage``) and ``NAME.tokenizer`` for an MLX model directory.

    ``adapter``: name under MODEL/adapters or a path (lossless or shared mode; none: a plain
    model whose step verifies trees it is given but drafts nothing). ``quantize``, ``q_bits``
    (4/8) or ``q_group_size`` (:func:`~mlx_specstream.loader.asked_quantization`, as ``convert``
    to MLX): MLX group-wise quantization carried into the package. ``precision``: compute precision (the KV
    state is fp16 either way). ``context``: cache slots; ``tree_size``: nodes per step (default:
    the adapter's tree budget); ``chunk``: prompt tokens per prefill call; ``sampling``: also
    output full logits (needed for temperature > 0). ``branch`` and ``prune_threshold``
    default to the adapter's.
    """
    from ..tokenizer import load_tokenizer

    t0 = time.perf_counter()
    say = progress or (lambda msg: None)
    ct = _export_tools()
    out = _check_out(Path(out), overwrite)
    _check_precision(precision)
    if prune_threshold is not None:
        check_prune_threshold(prune_threshold)
    from ..loader import asked_quantization

    # Everything that can be wrong with the request is found before the first progress line.
    q_bits, q_group_size = asked_quantization(quantize, q_bits, q_group_size) or (None, 64)
    model = load_for_export(model_path, adapter, q_bits, q_group_size, precision)
    q_bits, q_group_size = carried_quantization(model, q_bits, q_group_size)
    context, tree_size, chunk, branch = resolve_sizes(model, context, tree_size, chunk, branch)
    tok = load_tokenizer(model_path)

    from .torch_graph import SpecStreamGraph, graph_config

    gc = graph_config(model, context, tree_size, chunk, sampling=sampling, branch=branch,
                      prune_threshold=prune_threshold)
    say(f"loaded {model_path}" + (f" with adapter {adapter}" if adapter else "")
        + (f", quantized by MLX to int{q_bits} (groups of {q_group_size})" if q_bits else ""))
    say(f"building the torch graph: {gc.n_layers} layers, gamma={gc.gamma}, N_s={gc.msa_layers}, "
        f"tree {gc.tree_size}, context {gc.context}, chunk {gc.chunk}, {precision}")
    graph = SpecStreamGraph(model, gc).eval()
    qweights = graph.quantized_weights()
    adapter_name = getattr(getattr(model, "adapter_config", None), "name", "") or (
        Path(adapter).name if adapter else "")

    created = make_parents(out.parent)
    tmp = temp_dir_beside(out)
    try:
        with terminate_cleanly() as interrupts, _write_errors_as_os_errors(out):
            parts = {}
            for mode in ("prefill", "step"):
                t = time.perf_counter()
                say(f"converting {mode} ...")
                mlmodel = _convert_function(ct, graph, mode, precision)
                if qweights:
                    say(f"  carrying {len(qweights)} MLX int{q_bits} weights into {mode}")
                mlmodel = _finish_function(ct, mlmodel, qweights, precision)
                parts[mode] = tmp / f"{mode}.mlpackage"
                mlmodel.save(str(parts[mode]))
                say(f"  {mode} done in {time.perf_counter() - t:.1f}s")
            say("joining prefill and step into one multifunction package (shared weights)")
            desc = ct.utils.MultiFunctionDescriptor()
            desc.add_function(str(parts["prefill"]), src_function_name="main", target_function_name="prefill")
            desc.add_function(str(parts["step"]), src_function_name="main", target_function_name="step")
            desc.default_function_name = "step"
            joined = tmp / "joined.mlpackage"
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ct.utils.save_multifunction(desc, str(joined))
            tok_name = tokenizer_dir(out).name if tok is not None else None
            meta = _metadata(model, gc, model_path, adapter_name, precision, q_bits, q_group_size,
                             tok_name, tok)
            final = tmp / out.name
            _write_with_metadata(ct, joined, final, meta, model_path)
            umask_modes(final)
            for p in (*parts.values(), joined):
                shutil.rmtree(p)
            tok_tmp = None
            if tok is not None:
                tok_tmp = tmp / tokenizer_dir(out).name
                tok_tmp.mkdir()
                copy_tokenizer(Path(model_path), tok_tmp)
                (tok_tmp / "specstream.json").write_text(json.dumps(meta, indent=2))
                if getattr(model, "adapter_ngrams", None) is not None:  # the adapter's n-gram drafts
                    model.adapter_ngrams.save(tok_tmp / NGRAMS_FILE)
            say("checking the saved package")
            from .mil_eval import Package

            Package(final)  # the saved file reads back
            # an earlier export's tokenizer goes too when this model has none
            interrupts.check()
            replace_dirs([(tok_tmp, tokenizer_dir(out), "Core ML tokenizer"),
                          (final, out, "Core ML package")], overwrite)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        remove_empty(created)
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    size = dir_size(out)
    seconds = time.perf_counter() - t0
    say(f"wrote {out} ({size / 1e6:.2f} MB) in {seconds:.1f}s"
        + (f" and {tokenizer_dir(out)}" if tok is not None else " (the model has no tokenizer files)"))
    return ExportResult(out, tokenizer_dir(out) if tok is not None else None, size, meta, seconds)


@contextmanager
def _write_errors_as_os_errors(out: Path) -> Iterator[None]:
    """coremltools' failures to write a file (a full disk: its MIL FileWriter raises RuntimeError,
    its copy of a package shutil.Error, a list of the files not copied, its C++ copy a
    "filesystem error") as the OSError any other write failure is, naming the package, not the
    temporary files: one line on the command line."""
    try:
        yield
    except shutil.Error as e:
        failed = e.args[0] if e.args and isinstance(e.args[0], list) else []
        why = failed[0][2] if failed and len(failed[0]) == 3 else str(e)
        raise OSError(f"cannot write {out}: {_without_paths(why)}") from None
    except RuntimeError as e:
        said = str(e).splitlines()[0] if str(e) else type(e).__name__
        if not any(word in said for word in ("FileWriter", "writing", "filesystem error")):
            raise
        raise OSError(f"cannot write {out}: {_without_paths(said)} (is the disk full?)") from None


def _without_paths(said: str) -> str:
    """An error's words without the paths it names ("[Errno 28] No space left on device:
    '/tmp/x'", "cannot copy: Input/output error [/tmp/a -> /tmp/b]"): temporary files of the
    export, which the user never asked for."""
    return re.sub(r"(: )?'/[^']*'( -> '/[^']*')?|\s*\[/[^\]]*\]", "", said)


def _write_with_metadata(ct, src: Path, dest: Path, meta: dict[str, str], model_path) -> None:
    """Copy the package with metadata and feature descriptions written into its spec."""
    from coremltools.models.utils import save_spec

    spec = ct.utils.load_spec(str(src))
    _describe_spec(spec, meta, model_path)
    from .mil_eval import weights_dir_of

    save_spec(spec, str(dest), auto_set_specification_version=False, weights_dir=weights_dir_of(src))


__all__ = ["ExportError", "ExportResult", "carry_quantized_weights", "dir_size", "export_coreml",
           "carried_quantization", "load_for_export", "resolve_sizes", "tokenizer_dir"]
