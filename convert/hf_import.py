"""Import a Hugging Face / PyTorch checkpoint directory into our MLX format.

Reads ``config.json`` and the weights (``model.safetensors``, sharded safetensors with
``model.safetensors.index.json``, or ``pytorch_model.bin`` and its sharded variant), checks every
tensor's name and shape against the architecture the config describes, optionally casts and
quantizes, and writes ``config.json`` + ``model.safetensors`` + the tokenizer files to the
destination. The destination appears only when everything succeeded (written to a temporary
directory beside it, then renamed).

``.bin`` files are read with ``torch.load(weights_only=True)``: pickled code is never executed,
a file that needs it is rejected.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import mlx.core as mx
from tqdm import tqdm

from ..arch import build_model
from ..errors import OptionError
from ..loader import (
    DTYPES,
    CheckpointError,
    apply_weights,
    asked_quantization,
    atomic_dir,
    check_dtype,
    quantize_model,
    read_config,
    save_model,
)
from ..outputs import check_replaceable, check_writable, copy_tokenizer


def _progress(items, desc: str):
    # disable=None: no bar when stderr is not a terminal (logs, tests, pipes).
    return tqdm(items, desc=desc, unit="file", disable=None, leave=False)


def _weight_files(src: Path) -> tuple[str, list[Path]]:
    """The weight files of a checkpoint and their format ('safetensors' or 'bin')."""
    for fmt, single, index in (
        ("safetensors", "model.safetensors", "model.safetensors.index.json"),
        ("bin", "pytorch_model.bin", "pytorch_model.bin.index.json"),
    ):
        if (src / index).is_file():
            try:
                names = sorted(set(json.loads((src / index).read_bytes())["weight_map"].values()))
                files = [src / name for name in names]
            except (ValueError, KeyError, TypeError, AttributeError) as e:  # not JSON, no map, not names
                raise CheckpointError(f"{src / index}: not a valid shard index ({e!r})") from None
            missing = [f.name for f in files if not f.is_file()]
            if missing:
                raise CheckpointError(f"{src / index} lists missing shards: {', '.join(missing[:3])}")
            return fmt, files
        if (src / single).is_file():
            return fmt, [src / single]
    shards = sorted(src.glob("model-*-of-*.safetensors"))
    if shards:
        return "safetensors", shards
    broken = [p.name for p in src.iterdir() if p.is_symlink() and not p.exists()
              and p.name.endswith((".safetensors", ".bin", ".json"))]
    if broken:  # a download's links into a cache that is gone
        raise CheckpointError(f"{src}: {', '.join(sorted(broken)[:3])}: a link to a file that does not exist")
    raise CheckpointError(
        f"{src}: no weights (model.safetensors, model.safetensors.index.json, pytorch_model.bin "
        "or pytorch_model.bin.index.json)"
    )


def _header_dtypes(f: Path) -> set[str]:
    """The dtypes a safetensors file's header names (empty where the header does not read)."""
    try:
        with open(f, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(n)) if n < 1 << 28 else {}
        return {v["dtype"] for v in header.values()
                if isinstance(v, dict) and isinstance(v.get("dtype"), str)}
    except (OSError, ValueError, AttributeError):
        return set()


def _read_safetensors(f: Path) -> dict[str, mx.array]:
    if fp8 := sorted(d for d in _header_dtypes(f) if d.startswith("F8")):  # MLX would read them as bytes
        raise CheckpointError(f"{f}: {', '.join(fp8)} (8-bit float) weights are not supported: convert the "
                              "checkpoint's float16, bfloat16 or float32 release (and -q to quantize)")
    try:
        return mx.load(str(f))
    except Exception as e:  # mlx raises RuntimeError/ValueError on malformed files
        if "unsupported dtype" in str(e):  # F64, which MLX's reader lacks: read as a .bin's would be
            try:
                from safetensors.numpy import load_file

                return {k: mx.array(v) for k, v in load_file(str(f)).items()}
            except Exception:
                pass
        raise CheckpointError(f"{f}: corrupt safetensors file ({e})") from None


def _torch_to_mx(t) -> mx.array:
    import torch

    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16: move the bits
        return mx.array(t.view(torch.uint16).numpy()).view(mx.bfloat16)
    return mx.array(t.numpy())


def _read_bin(f: Path) -> dict[str, mx.array]:
    try:
        import torch
    except ImportError:
        raise CheckpointError(
            f"{f}: reading pytorch_model.bin needs torch (pip install 'mlx-specstream[torch]'), "
            "or convert the checkpoint to safetensors"
        ) from None
    import pickle

    try:
        state = torch.load(str(f), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        if "weights_only" in str(e) or "Weights only load failed" in str(e):
            raise CheckpointError(
                f"{f}: refused: the pickle holds objects or code beyond plain tensors, and "
                ".bin files are read with weights_only=True (never executing pickled code)"
            ) from None
        raise CheckpointError(f"{f}: corrupt PyTorch checkpoint ({str(e).splitlines()[0]})") from None
    except Exception as e:  # zip/pickle corruption surfaces as RuntimeError, EOFError, ...
        first = str(e).splitlines()[0] if str(e) else ""
        if not first or first.isdigit():  # torch's bare error code says nothing to a user
            first = "neither a zip archive nor a pickle"
        raise CheckpointError(f"{f}: corrupt PyTorch checkpoint ({first})") from None
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{f}: not a state dict of tensors")
    return {k: _torch_to_mx(v) for k, v in state.items()}


def read_weights(src: Path) -> dict[str, mx.array]:
    """All tensors of a HF checkpoint directory, by their HF names."""
    fmt, files = _weight_files(src)
    read = _read_safetensors if fmt == "safetensors" else _read_bin
    weights: dict[str, mx.array] = {}
    for f in _progress(files, f"reading {fmt}"):
        part = read(f)
        dup = set(part) & set(weights)
        if dup:
            raise CheckpointError(f"{f}: tensor {sorted(dup)[0]} appears in two shards")
        weights.update(part)
    return weights


def _check_destination(src: Path, dest: Path, overwrite: bool) -> None:
    """Fail before any work when the destination cannot be written."""
    if dest.resolve() == src.resolve() or src.resolve() in dest.resolve().parents:
        raise OptionError(": {mlx_path} must not be the checkpoint directory or inside it", subject=str(dest))
    check_replaceable(dest, "model", overwrite)
    check_writable(dest.parent, "the model")


# Settings with a fixed default in transformers' config class of each family, which a checkpoint's
# config may leave out. Derived ones (head_dim, num_key_value_heads, layer_types: functions of other
# settings) are not taken from a default config, whose sizes are not the checkpoint's.
FAMILY_DEFAULTS = ("rms_norm_eps", "layer_norm_eps", "sliding_window", "tie_word_embeddings", "hidden_act",
                   "attention_bias", "mlp_bias", "use_sliding_window", "max_window_layers",
                   "query_pre_attn_scalar", "final_logit_softcapping", "attn_logit_softcapping",
                   "max_position_embeddings")


def with_family_defaults(cfg: dict, outer: dict | None = None) -> dict:
    """``cfg`` with each setting of :data:`FAMILY_DEFAULTS` it leaves out, and its rotary base if it
    gives none, set as transformers' config class of its ``model_type`` sets them (SmolLM3's
    rope_theta 2e6 and tied embeddings, Phi-3's rms_norm_eps 1e-5, Mistral's 4,096-token window):
    transformers builds the checkpoint's model with those, so the import does too, and the MLX
    config says them. A multimodal config's ``text_config`` is completed the same way, but for what
    its ``outer`` config sets (a top-level tie_word_embeddings is the model's)."""
    model_type = cfg.get("model_type")
    if not isinstance(model_type, str):
        return cfg  # build_model says what is wrong
    try:
        from transformers import AutoConfig

        defaults = AutoConfig.for_model(model_type).to_dict()
    except Exception:  # a family transformers does not know: our defaults
        return cfg
    out = dict(cfg)
    if isinstance(cfg.get("text_config"), dict):
        text = {"model_type": (defaults.get("text_config") or {}).get("model_type"), **cfg["text_config"]}
        out["text_config"] = with_family_defaults(text, outer=cfg)
        return out
    given = {**(outer or {}), **cfg}
    for key in FAMILY_DEFAULTS:
        if key not in given and defaults.get(key) is not None:
            out[key] = defaults[key]
    params = given.get("rope_parameters") if isinstance(given.get("rope_parameters"), dict) else {}
    base = defaults.get("rope_theta")
    if base is None and isinstance(defaults.get("rope_parameters"), dict):
        base = defaults["rope_parameters"].get("rope_theta")  # None where set per layer type (Gemma 3)
    if given.get("rope_theta") is None and params.get("rope_theta") is None and base is not None:
        out["rope_theta"] = base  # only the base: a scaling or partial rotary factor given stays the config's
    return out


def _own_head(cfg: dict, weights: dict[str, mx.array]) -> dict:
    """``cfg`` untied where it ties the LM head to the token embeddings but the checkpoint stores a
    head of its own that differs from them: transformers 5 builds the model with the stored head,
    and so does the import (the embeddings as the head would give other logits)."""
    heads = [k for k in weights if k.endswith("lm_head.weight")]
    embeddings = [k for k in weights if k.endswith("embed_tokens.weight")]
    if not cfg.get("tie_word_embeddings") or len(heads) != 1 or len(embeddings) != 1:
        return cfg
    head, embedding = weights[heads[0]], weights[embeddings[0]]
    if head.shape == embedding.shape and mx.array_equal(head, embedding).item():
        return cfg
    return {**cfg, "tie_word_embeddings": False}


def _mlx_lm_compatible(cfg: dict) -> dict:
    """Also write transformers-5 ``rope_parameters`` under the older top-level keys
    (``rope_theta``, ``rope_scaling``, ``partial_rotary_factor``), which mlx-lm reads: the
    converted directory then loads in mlx-lm with the same rotary embedding."""
    params = cfg.get("rope_parameters")
    if not isinstance(params, dict):
        return cfg
    cfg = dict(cfg)
    for key in ("rope_theta", "partial_rotary_factor"):
        if key in params and key not in cfg:
            cfg[key] = params[key]
    if params.get("rope_type", "default") != "default" and not cfg.get("rope_scaling"):
        cfg["rope_scaling"] = {k: v for k, v in params.items()
                               if k not in ("rope_theta", "partial_rotary_factor")}
    return cfg


def convert(
    hf_path: str | Path,
    mlx_path: str | Path,
    quantize: bool = False,
    q_bits: int | None = None,
    q_group_size: int | None = None,
    dtype: str | None = None,
    overwrite: bool = False,
) -> Path:
    """Convert the HF checkpoint in ``hf_path`` to an MLX model directory ``mlx_path``.

    ``dtype`` (float32, float16, bfloat16) casts floating tensors; None keeps the checkpoint's.
    ``quantize``, ``q_bits`` or ``q_group_size`` (:func:`~mlx_specstream.loader.asked_quantization`)
    makes every Linear/Embedding whose input dimension divides by ``q_group_size`` (64)
    group-wise ``q_bits``-bit (4; the token embedding and LM head included, as mlx-lm does).
    Returns the destination path.
    """
    src, dest = Path(hf_path), Path(mlx_path)
    where = Path(os.path.abspath(dest))  # now: "." may name the directory about to be replaced
    if not src.is_dir():
        hub = not src.exists() and len(src.parts) == 2 and not str(hf_path).startswith((".", "/", "~"))
        raise CheckpointError(f"{src}: " + ("not a directory (give the checkpoint's folder)" if src.exists()
                              else "no such checkpoint directory" + (
                                  " (a Hugging Face repo id? nothing is downloaded here: download it "
                                  f"first, e.g. huggingface-cli download {src} --local-dir DIR, and give "
                                  "DIR)" if hub else "")))
    check_dtype(dtype)
    asked = asked_quantization(quantize, q_bits, q_group_size)
    _check_destination(src, dest, overwrite)

    cfg = with_family_defaults(read_config(src))
    qc = cfg.get("quantization_config") or cfg.get("quantization")
    if qc:
        method = "unknown"
        if isinstance(qc, dict):  # mlx-lm's {"bits", "group_size"}; transformers' quant_method or load_in_*
            method = qc.get("quant_method") or next((k for k, v in qc.items() if v is True), None) or (
                "mlx" if "bits" in qc else "unknown")
        raise CheckpointError(
            f"{src}: already-quantized checkpoints ({method}) are not supported; convert the "
            "float checkpoint (and use -q to quantize)"
        )
    weights = read_weights(src)
    model = build_model(_own_head(cfg, weights))
    try:
        apply_weights(model, weights, DTYPES[dtype] if dtype else None)
    except CheckpointError as e:
        heads = [a for a in cfg.get("architectures") or [] if isinstance(a, str)]
        generates = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")
        if heads and not any(a.endswith(generates) for a in heads):
            raise CheckpointError(f"{src}: a {heads[0]} checkpoint is not a causal language model (a "
                                  f"...ForCausalLM one generates text): {e}") from None
        raise CheckpointError(f"{src}: {e}") from None
    del weights
    # the config of what was built (a multimodal checkpoint's text model: its text config)
    # transformers' private keys go, except those the family reads (OPT's _remove_final_layer_norm)
    read = {f.name for f in dataclasses.fields(model.args)}
    out_cfg = _mlx_lm_compatible({k: v for k, v in model.config.items()
                                  if not k.startswith("_") or k in read})
    if dtype is not None:
        for key in ("torch_dtype", "dtype"):
            if key in out_cfg:
                out_cfg[key] = dtype
    if asked:
        out_cfg["quantization"] = quantize_model(model, *asked)
        mx.eval(model.parameters())

    with atomic_dir(dest, "model", overwrite=overwrite) as tmp:
        save_model(model, out_cfg, tmp)
        copy_tokenizer(src, tmp)
    return where
