"""Load and save models in our MLX format (also reads mlx-lm directories of supported types).

A model directory holds ``config.json`` (the HF config, plus ``quantization`` when quantized),
``model.safetensors`` or shards ``model-*.safetensors``, and the tokenizer files.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from .arch import CausalLM, build_model
from .arch.moe import router_quantization
from .device import on_gpu
from .errors import CheckpointError, OptionError, SaidInOptions, check_path, check_switch, verbatim
from .machine import warn
from .outputs import (
    WEIGHTS_MARK,
    check_replaceable,
    make_parents,
    remove_empty,
    replace_dirs,
    save_safetensors,
    temp_dir_beside,
    terminate_cleanly,
)

DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}


def read_config(path: Path) -> dict:
    cfg_file = Path(path) / "config.json"
    if not Path(path).is_dir():
        raise CheckpointError(f"{path}: no such model directory")
    if not cfg_file.is_file():
        raise CheckpointError(f"{path}: no config.json")
    try:
        cfg = json.loads(cfg_file.read_bytes().decode("utf-8"))
    except ValueError as e:  # not UTF-8, or not JSON
        raise CheckpointError(f"{cfg_file}: invalid JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{cfg_file}: a JSON object of settings was expected, not {type(cfg).__name__}")
    return cfg


def model_dir(path: str | Path, flag: str = "") -> Path:
    """``path`` as a Path, or a :class:`CheckpointError` when it is not a directory (``flag``,
    e.g. "--draft-model", names the option it came from)."""
    said = flag + " " if flag else ""
    check_path(path, f"{flag or 'the model'}'s path", CheckpointError, "give a model directory")
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise CheckpointError(f"{said}{path}: a file, not a model directory")
    if not path.is_dir():
        raise CheckpointError(f"{said}{path}: no such model directory")
    if path.suffix == ".mlpackage" and (path / "Manifest.json").is_file():
        raise CheckpointError(f"{said}{path}: a Core ML package, not an MLX model "
                              "directory: generate --model runs it; in Python, coreml_driver.load_package")
    return path


def read_safetensors(files: list[str]) -> dict[str, mx.array]:
    weights: dict[str, mx.array] = {}
    for f in files:
        if not Path(f).is_file():
            raise CheckpointError(f"{f}: missing (a link to a file that does not exist?)")
        try:
            weights.update(mx.load(f))
        except Exception as e:  # mlx raises RuntimeError/ValueError on malformed files
            raise CheckpointError(f"{f}: corrupt safetensors file ({e})") from None
    return weights


def quantize_predicate(group_size: int):
    """Which layers are quantized: every Linear/Embedding whose input dim divides into groups."""

    def pred(path: str, module: nn.Module) -> bool:
        return hasattr(module, "to_quantized") and module.weight.shape[-1] % group_size == 0

    return pred


Q_BITS, Q_GROUP_SIZES = (4, 8), (32, 64, 128)  # the group-wise quantizations offered


def asked_quantization(quantize: bool, bits: int | None, group_size: int | None) -> tuple[int, int] | None:
    """The (bits, group size) a command asks to quantize with, checked, or None for float weights:
    ``quantize`` (``-q``), ``bits`` or ``group_size`` given asks for it; 4 bits in groups of 64
    unless given."""
    check_switch("quantize", quantize)
    if not (quantize or bits is not None or group_size is not None):
        return None
    asked = (4 if bits is None else bits, 64 if group_size is None else group_size)
    check_quantization(*asked)
    return asked


def _either(values) -> str:
    """``(32, 64, 128)`` -> "32, 64 or 128"."""
    *most, last = map(str, values)
    return f"{', '.join(most)} or {last}" if most else last


def _one_of(value, allowed) -> bool:
    """``value`` is an int among ``allowed`` (not ``4.0``, which MLX's quantize refuses, nor True)."""
    return isinstance(value, int) and not isinstance(value, bool) and value in allowed


def check_quantization(bits: int, group_size: int) -> None:
    """Refuse settings outside :data:`Q_BITS` / :data:`Q_GROUP_SIZES` (``q_bits`` in Python,
    ``--q-bits`` on the command line)."""
    if not _one_of(bits, Q_BITS):
        raise OptionError(f"{{q_bits}} must be {_either(Q_BITS)}, not {verbatim(repr(bits))}")
    if not _one_of(group_size, Q_GROUP_SIZES):
        raise OptionError(f"{{q_group_size}} must be {_either(Q_GROUP_SIZES)}, "
                          f"not {verbatim(repr(group_size))}")


def check_dtype(dtype: str | None) -> None:
    """A weight type of :data:`DTYPES` (or None: the checkpoint's own)."""
    if dtype is not None and dtype not in DTYPES:
        raise OptionError(f"{{dtype}} must be one of {', '.join(DTYPES)}, not {verbatim(repr(dtype))}")


def quantize_model(model: nn.Module, bits: int, group_size: int) -> dict:
    """Quantize every layer :func:`quantize_predicate` allows, a mixture's routers as
    :func:`~mlx_specstream.arch.moe.router_quantization` says; returns the config's
    ``quantization`` (with those per-layer settings, which a load, ours or mlx-lm's, reads). None
    allowed is an error; some left in float (input sizes that do not divide into groups) a warning."""
    check_quantization(bits, group_size)
    per_layer, fitting = router_quantization(model), quantize_predicate(group_size)
    layers = [m for p, m in model.named_modules() if hasattr(m, "to_quantized") and p not in per_layer]
    fits = sum(fitting("", m) for m in layers)
    if not fits:
        raise OptionError(f"{{q_group_size={group_size}}}: no layer's input size divides into groups of "
                         f"{group_size}, so nothing would be quantized"
                         + ("" if group_size == min(Q_GROUP_SIZES) else " (try a smaller group size)"))
    if fits < len(layers):
        warn(f"{len(layers) - fits} of {len(layers)} layers stay in float: their input sizes do not divide "
             f"into groups of {group_size}")
    nn.quantize(model, group_size=group_size, bits=bits,
                class_predicate=lambda p, m: per_layer[p] if p in per_layer else fitting(p, m))
    return {"group_size": group_size, "bits": bits, **per_layer}


def apply_weights(model: CausalLM, weights: dict[str, mx.array], dtype=None) -> None:
    """Load sanitized weights, checking names and shapes against the architecture."""
    weights = model.sanitize(weights)
    expected = dict(_flatten(model.parameters()))
    missing = sorted(set(expected) - set(weights))
    if missing:
        more = f" (+{len(missing) - 3} more)" if len(missing) > 3 else ""
        raise CheckpointError(f"missing weight tensors: {', '.join(missing[:3])}{more}")
    unexpected = sorted(set(weights) - set(expected))
    if unexpected:
        raise CheckpointError(f"unexpected weight tensors: {', '.join(unexpected[:3])}")
    for name, w in weights.items():
        if tuple(w.shape) != tuple(expected[name].shape):
            raise CheckpointError(
                f"shape mismatch for {name}: checkpoint {tuple(w.shape)}, "
                f"config implies {tuple(expected[name].shape)}"
            )
        floating = mx.issubdtype(expected[name].dtype, mx.floating)
        if floating != mx.issubdtype(w.dtype, mx.floating):
            raise CheckpointError(f"{name}: a {w.dtype} tensor where the architecture has "
                                  f"{'floating-point' if floating else expected[name].dtype} weights")
    if dtype is not None:
        weights = {k: v.astype(dtype) if mx.issubdtype(v.dtype, mx.floating) else v
                   for k, v in weights.items()}
    model.load_weights(list(weights.items()))
    mx.eval(model.parameters())


def _flatten(tree, prefix=""):
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _flatten(v, f"{prefix}{k}.")
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            yield from _flatten(v, f"{prefix}{i}.")
    else:
        yield prefix[:-1], tree


def model_name(path: str | Path) -> str:
    """A model's name: its directory's (the parent's for ``NAME/mlx``, the project's layout), what
    the server calls it and a Core ML package says it is."""
    path = Path(path).resolve()
    return path.parent.name if path.name == "mlx" else path.name


def load_model(path: str | Path, dtype: str | None = None,
               quantize: tuple[int, int] | None = None) -> CausalLM:
    """The MLX model stored in ``path`` (ours or mlx-lm's), quantized if its config says so.

    ``quantize=(bits, group_size)`` quantizes a float model at load time (see
    :func:`quantize_model`).
    """
    path = model_dir(path)
    if quantize is not None and not (isinstance(quantize, tuple | list) and len(quantize) == 2
                                     and _one_of(quantize[0], Q_BITS)
                                     and _one_of(quantize[1], Q_GROUP_SIZES)):
        raise OptionError(f"{{quantize}} must be (bits, group_size) with bits {_either(Q_BITS)} and "
                          f"group_size {_either(Q_GROUP_SIZES)}, e.g. (4, 64); "
                          f"not {verbatim(repr(quantize))}")
    check_dtype(dtype)
    cfg = read_config(path)
    files = sorted(glob.glob(str(path / "*.safetensors")))
    if not files:
        raise CheckpointError(f"{path}: no *.safetensors weights")
    model = build_model(cfg)
    weights = model.sanitize(read_safetensors(files))
    q = cfg.get("quantization")
    if q is not None and not (isinstance(q, dict) and all(
            isinstance(q.get(k), int) and not isinstance(q.get(k), bool) for k in ("bits", "group_size"))):
        raise CheckpointError(f"{path / 'config.json'}: quantization is {q!r}, not an object with "
                              "whole-number bits and group_size")
    if q:
        if quantize is not None:
            raise OptionError(f" is already quantized ({q['bits']} bits): drop {{quantize}}",
                              subject=str(path))
        # Quantized layers are the ones stored with scales (ours and mlx-lm's); mlx-lm may
        # also list per-layer settings (False, or a dict of parameters) by module path.
        per_layer = _per_layer(model, q)
        nn.quantize(model, group_size=q["group_size"], bits=q["bits"], mode=q.get("mode", "affine"),
                    class_predicate=lambda p, m: per_layer[p] if p in per_layer else (
                        hasattr(m, "to_quantized") and f"{p}.scales" in weights))
    # half-precision matmuls have no BLAS path on the CPU: fp32 is the fast path there
    upcast = dtype is None and not on_gpu() and any(
        w.dtype in (mx.float16, mx.bfloat16) for w in weights.values())
    # quantized here as `convert [--dtype D] -q` writes it (D first, then quantized) and a load of
    # that reads it (the CPU's fp32 after)
    apply_weights(model, weights,
                  DTYPES[dtype] if dtype else mx.float32 if upcast and quantize is None else None)
    if quantize is not None:
        quantize_model(model, *quantize)
        if upcast:
            model.set_dtype(mx.float32)
        mx.eval(model.parameters())
    model.eval()
    return model


def _per_layer(model: CausalLM, quantization: dict) -> dict:
    """A config's per-layer quantization settings (mlx-lm's: module path -> False or a dict of
    parameters) by our module paths: a checkpoint's module is renamed, split or dropped as
    ``model.sanitize`` does its weights (Mixtral's ``block_sparse_moe`` is our ``mlp``, phi3's fused
    ``qkv_proj`` our ``q_proj``, ``k_proj`` and ``v_proj``)."""
    placeholder = mx.zeros((1,))
    return {ours.removesuffix(".weight"): setting
            for theirs, setting in quantization.items() if isinstance(setting, bool | dict)
            for ours in model.sanitize({f"{theirs}.weight": placeholder})}


@contextmanager
def atomic_dir(dest: str | Path, kind: str, overwrite: bool = False):
    """Yield a temporary directory next to ``dest`` and rename it to ``dest`` on success.

    An existing ``dest`` is replaced only with ``overwrite`` and only when it is a ``kind``
    directory the project wrote (:func:`~mlx_specstream.outputs.check_replaceable`). On any
    error the temporary directory is removed and ``dest`` is untouched.
    """
    check_replaceable(dest, kind, overwrite)
    dest = Path(os.path.abspath(dest))  # "." or "x/.." by its name, so the work is done beside it
    created = []
    try:
        created = make_parents(dest.parent)
        tmp = temp_dir_beside(dest)
    except OSError as e:
        remove_empty(created)
        raise PermissionError(f"cannot write to {dest.parent}: {e.strerror}") from None
    try:
        with terminate_cleanly() as interrupts:
            yield tmp
            interrupts.check()
            replace_dirs([(tmp, dest, kind)], overwrite)
    except OSError as e:  # said of the output asked for, not of the temporary directory
        shutil.rmtree(tmp, ignore_errors=True)
        remove_empty(created)
        raise _said_of(e, tmp, dest) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        remove_empty(created)
        raise


def _said_of(e: OSError, tmp: Path, dest: Path) -> OSError:
    """``e`` with the temporary directory's path ``tmp`` said as ``dest`` (its message or file
    names), the same kind of error with the same errno; ``e`` itself where it names no such path
    (an :class:`~mlx_specstream.errors.OutputExistsError`, already said of the destination)."""
    def fix(text):
        return text.replace(str(tmp), str(dest)) if isinstance(text, str) else text

    if str(tmp) not in str(e) or isinstance(e, SaidInOptions):
        return e
    if e.filename is not None:
        return type(e)(e.errno, e.strerror, fix(e.filename), None, fix(e.filename2))
    said = type(e)(fix(str(e)))
    said.errno = e.errno
    return said


def save_model(model: CausalLM, config: dict, dest: Path) -> None:
    """Write config + weights into an existing directory ``dest`` (use inside atomic_dir), by the
    names the family saves them under (:meth:`~mlx_specstream.arch.base.CausalLM.saved_name`,
    the config's per-layer quantization settings too)."""
    weights = {model.saved_name(k): v for k, v in _flatten(model.parameters())}
    if "quantization" in config:
        saved = {model.saved_name(k): v for k, v in config["quantization"].items()}
        config = {**config, "quantization": saved}
    save_safetensors(dest / "model.safetensors", weights, metadata={"format": "mlx", **WEIGHTS_MARK})
    (dest / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
