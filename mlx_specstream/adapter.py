"""Speculative adapters: configuration, attaching to a base model, saving and loading.

An adapter directory holds ``adapter_config.json`` and ``adapter.safetensors``. The config
records the base model's fingerprint; loading onto another base is an error (a training run may
still start from such an adapter's weights: ``train(init=...)``). Adapters can be swapped on a
loaded base (``attach`` detaches the previous one first).
"""

from __future__ import annotations

import json
import os
import shutil
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from .arch.base import CausalLM, check_value
from .errors import AdapterError, OptionError, check_keywords, check_path, check_seed
from .loader import model_dir
from .lora import LoRALinear
from .ngrams import NGRAMS_FILE, NgramTable
from .outputs import save_safetensors
from .streams import StreamAdapter, check_prune_threshold
from .tree import check_tree_sizes

CONFIG_FILE, WEIGHTS_FILE = "adapter_config.json", "adapter.safetensors"
REPORT_FILE = "training_report.json"  # train's record of the run (trainer.py writes it)
# a run's settings that generate takes from its adapter: the prompts it learnt after, their length
PROMPT_SETTINGS = ("chat_template", "system_prompt", "max_seq_len")


@dataclass
class AdapterConfig:
    """An adapter's shape and decoding defaults (``adapter_config.json``), and the base it was made
    for (its fingerprint and probes, set by :func:`attach`)."""

    mode: str = "lossless"  # "lossless" | "shared" | "lora" (next-token LoRA baseline, no streams)
    gamma: int = 4
    msa_layers: int = 4
    rank: int = 8
    lora_alpha: float = 16.0
    stream_init_rank: int = 0  # 0: f = identity
    prune_rank: int = 8
    prune_layer: int | None = None  # None: N - N_s (right before stream insertion)
    prune_threshold: float = 0.0
    main_rank: int = 0  # >0: every-row LoRA under stream-only LoRA (tuned lossless, split shared)
    main_alpha: float = 16.0
    branch: int = 3
    tree_budget: int = 32
    base_fingerprint: str = ""
    base_probe: list | None = field(default=None, repr=False)  # hundreds of numbers: not shown
    base_weights_probe: list | None = field(default=None, repr=False)  # the base's (since 2026-11-27)
    training: dict | None = None  # the run that made it (train records it; a re-save keeps it)
    name: str = ""

    def validate(self, n_layers: int) -> None:
        """Every field of the type it is declared with and in its range, for a model of
        ``n_layers`` (a config that passes is one decoding and saving accept; NumPy scalars are
        taken as the Python numbers they are)."""
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, np.integer | np.floating):
                setattr(self, f.name, value.item())
            check_value(f.name, getattr(self, f.name), f.type, source="adapter config", error=AdapterError)
        if self.mode not in ("lossless", "shared", "lora"):
            raise AdapterError(f"adapter mode must be 'lossless', 'shared' or 'lora', not '{self.mode}'")
        if self.mode == "lora":
            self.gamma = 0
        if not 1 <= self.msa_layers <= n_layers:
            raise AdapterError(f"msa_layers must be in 1..{n_layers}, not {self.msa_layers}")
        if (self.gamma < 1 and self.mode != "lora") or self.rank < 1:
            raise AdapterError("gamma and rank must be >= 1")
        if self.main_rank and self.mode == "lora" or self.main_rank < 0:
            raise AdapterError("main_rank (a fine-tune under the streams) is for lossless and shared "
                               "adapters")
        if not 0 <= self.prune_layer <= self.msa_start(n_layers):
            raise AdapterError(f"prune_layer must be in 0..{self.msa_start(n_layers)}")
        try:  # decoding's own rules, said of this config's fields
            check_tree_sizes(branch=self.branch, tree_budget=self.tree_budget)
            check_prune_threshold(self.prune_threshold)
        except OptionError as e:
            raise AdapterError(e.render("python")) from None

    def fit(self, n_layers: int) -> AdapterConfig:
        """This config for a model of ``n_layers``: the pruning layer by default where the
        streams start, everything checked (:meth:`validate`)."""
        if self.prune_layer is None:
            self.prune_layer = self.msa_start(n_layers)
        self.validate(n_layers)
        return self

    def msa_start(self, n_layers: int) -> int:
        """The first multi-stream layer of a model of ``n_layers``: the streams run in the top
        ``msa_layers`` (N - N_s), the one place this rule is written."""
        return n_layers - self.msa_layers


def _setting(value):
    """A module setting in a canonical, spelling-free form (rounded floats, function names)."""
    if isinstance(value, bool | int | str) or value is None:
        return value
    if isinstance(value, float):
        return float(f"{value:.6g}")
    if isinstance(value, mx.array):
        return [_setting(float(x)) for x in value.astype(mx.float32).reshape(-1).tolist()]
    if hasattr(value, "__dataclass_fields__"):  # e.g. the rotary embedding (not its private memo)
        return {k: _setting(getattr(value, k)) for k in value.__dataclass_fields__ if not k.startswith("_")}
    if callable(value):
        return getattr(value, "__name__", type(value).__name__)
    return repr(value)


# Attributes that say nothing about what the base computes (``args``: the typed config, restated).
_NOT_COMPUTATION = {"adapter_config", "adapter_ngrams", "path", "fused_lora", "args"}


def architecture(model) -> list:
    """What the base model computes, weights' values aside: every layer's kind, its parameters'
    shapes (quantized ones at their float shapes) and its settings (norm eps, rotary frequencies,
    activation, heads...), read off the built model, so two configs that spell the same
    architecture differently (``rope_theta`` or ``rope_parameters``, dtype, comments) agree.
    The attached adapter (stream modules, LoRA wrappers) is left out."""
    desc = []
    for path, module in sorted(model.named_modules(), key=lambda pm: pm[0]):
        if path == "adapter" or path.startswith("adapter.") or isinstance(module, LoRALinear):
            continue
        path = path.replace(".base.", ".").removesuffix(".base")  # inside a LoRA wrapper
        kind = type(module).__name__.removeprefix("Quantized")
        bits = getattr(module, "bits", None)
        shapes = {}
        for k, v in module.items():
            if not isinstance(v, mx.array) or (bits and k in ("scales", "biases")):
                continue
            shape = list(v.shape)
            if bits and k == "weight":
                shape[-1] = shape[-1] * 32 // bits
            shapes[k] = shape
        settings = {} if bits else {  # a quantized layer's own attributes restate its shapes
            k: _setting(v) for k, v in vars(module).items()
            if not k.startswith("_") and k not in _NOT_COMPUTATION}
        desc.append([path, kind, shapes, settings])
    return desc


def fingerprint(model) -> str:
    """Identity of a base model's computation apart from its weights' values: a digest of
    :func:`architecture` (so an adapter follows its base through casting, quantization and
    re-saving under another ``transformers`` version; the weights are told apart by the probe)."""
    import hashlib

    text = json.dumps(architecture(model), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def probe(model) -> list[float]:
    """What the base computes for a few fixed tokens (logits of 8 tokens, 16 vocab entries):
    compared by correlation, it tells bases of the same shape apart, yet survives fp16/int8."""
    n = min(8, model.config.get("vocab_size", 8))
    ids = mx.arange(n)[None]
    logits = model.head(model.embed(ids, mx.arange(n)))[0, :, :16].astype(mx.float32)
    return [round(float(x), 4) for x in logits.reshape(-1).tolist()]


def weights_probe(model, per_matrix: int = 8) -> list[list[float]]:
    """A sample of the base's own weights, in two parts compared apart: the first ``per_matrix``
    values of the first row of every matrix in its layers (dequantized), and the first 32 values
    of 8 token embeddings. Compared by correlation (:func:`same_base`) it tells apart bases of one
    shape whose layers or embeddings differ (another training run, a large fine-tune), which
    :func:`probe` misses, and survives fp16, bf16, int8 and int4 (whose rounding error is about a
    tenth of a weight's spread: correlation 0.99 and more; :data:`SAME_BASE`)."""
    rows = []
    for block in model.layers:
        for parent, name in _linears(block):
            layer = getattr(parent, name)
            if isinstance(layer, nn.QuantizedLinear):
                w = mx.dequantize(layer.weight[:1], layer.scales[:1], layer.biases[:1],
                                  layer.group_size, layer.bits)
            else:
                w = layer.weight[:1]
            rows.append(w[0, :per_matrix].astype(mx.float32))
    v = int(model.config.get("vocab_size", 8))
    ids = mx.array([[(1 + k * v) // 8 for k in range(8)]]) % v
    embedded = model.embed(ids, mx.arange(8))[0, :, :32].astype(mx.float32).reshape(-1)
    return [[float(f"{x:.6g}") for x in part.tolist()] for part in (mx.concatenate(rows), embedded)]


# the correlation of two probes of one base: on the shipped model, int4's rounding keeps 0.995, noise
# of 0.18 of a weight's spread 0.98, and of 0.37, which turns a shared adapter's output to nonsense,
# 0.92 (scripts/probe_correlation.py, results/adapters/probe_correlation_2026-11-29.json)
SAME_BASE = 0.97


def same_base(a: list[float], b: list[float]) -> bool:
    import numpy as np

    x, y = np.asarray(a) - np.mean(a), np.asarray(b) - np.mean(b)
    return len(a) == len(b) and float(x @ y) > SAME_BASE * float(np.linalg.norm(x) * np.linalg.norm(y))


def made_for(model, cfg: AdapterConfig) -> bool:
    """Whether the adapter of ``cfg`` was made for this base: same computation (fingerprint) and
    weights that compute alike (probe) and look alike (weights probe, where the adapter has one);
    an adapter recording none of them is taken as made for it."""
    return not ((cfg.base_fingerprint and cfg.base_fingerprint != fingerprint(model))
                or (cfg.base_probe and not same_base(cfg.base_probe, probe(model)))
                or (cfg.base_weights_probe and not all(
                    same_base(a, b) for a, b in zip(cfg.base_weights_probe, weights_probe(model)))))


LINEAR = (nn.Linear, nn.QuantizedLinear)


def _linears(block: nn.Module, kinds: tuple = LINEAR) -> list[tuple[nn.Module, str]]:
    """(parent, attribute) of every layer of the given kinds inside a block (not looking into
    the layers found)."""
    found = []
    for name, child in block.children().items():
        if isinstance(child, kinds):
            found.append((block, name))
        elif isinstance(child, nn.Module):
            found.extend(_linears(child, kinds))
    return found


def _check_model(model) -> None:
    """The API's TypeError (``check_model``: what it is instead, and a hint) for an argument that is
    not an MLX model from ``load()``; a Core ML package's runner, which ``check_model`` takes for
    decoding, has its adapter fixed at export."""
    if not isinstance(model, CausalLM):
        from .api import check_model  # api imports this module

        check_model(model, None)
        raise TypeError("model is a Core ML package's: its adapter is fixed at export (convert --to coreml "
                        "--adapter); give a model from load()")


def check_swappable(model: nn.Module) -> None:
    """An AdapterError where the model's adapter is fused into its weights: it cannot be detached,
    so no other can be attached or trained."""
    if getattr(model, "fused_lora", 0):
        raise AdapterError(f"adapter '{model.adapter_config.name}' is fused into this model's "
                           "weights: load the base model again to change adapters (load(..., fuse=False) "
                           "keeps them swappable)")


def detach(model: nn.Module) -> None:
    """Remove the attached adapter (if any), restoring the base layers."""
    _check_model(model)
    if getattr(model, "adapter", None) is None:
        return
    check_swappable(model)
    for block in model.layers:
        for parent, name in _linears(block, (LoRALinear,)):
            layer = getattr(parent, name)
            while isinstance(layer, LoRALinear):  # a tuned adapter nests two
                layer = layer.base
            setattr(parent, name, layer)
    model.pop("adapter")
    model.adapter_config = None
    model.adapter_ngrams = None


def attach(model: nn.Module, config: AdapterConfig, seed: int = 0, lora_scale: float = 0.0,
           fine_tune: dict[str, mx.array] | None = None) -> StreamAdapter:
    """Attach a freshly initialised adapter described by ``config`` (replacing any other).

    With ``config.main_rank`` every linear layer is first wrapped in an every-row LoRA of that
    rank, given by ``fine_tune`` (the weights of a ``lora``-mode adapter, its names) where there
    is one, then the MSA layers' ones in stream-only LoRA: stream rows add their own low-rank
    change on top of what the main rows compute. In a tuned lossless adapter the every-row LoRA is
    a frozen fine-tune, which main rows compute exactly; in a *split* shared adapter it trains
    with the streams (which keep low-rank capacity of their own)."""
    n = len(model.layers)
    config.fit(n)  # before the attached adapter goes: a bad config or seed leaves it in place
    check_seed(seed)
    detach(model)
    model.adapter_ngrams = None  # the n-gram drafts of its data (ngrams.py), set when there are
    config.base_fingerprint = fingerprint(model)
    config.base_probe = probe(model)
    config.base_weights_probe = weights_probe(model)
    key = mx.random.key(seed)
    key, sub = mx.random.split(key)
    hidden = model.config["hidden_size"]
    adapter = StreamAdapter(hidden, config.gamma, config.stream_init_rank, config.prune_rank, sub)
    if config.main_rank:
        for block in model.layers:
            for parent, name in _linears(block):
                key, sub, sub2 = mx.random.split(key, 3)
                lora = LoRALinear(getattr(parent, name), config.main_rank, config.main_alpha, key=sub)
                if lora_scale:
                    lora.lora_b = mx.random.normal(lora.lora_b.shape, key=sub2) * lora_scale
                setattr(parent, name, lora)
        if fine_tune is not None:
            model.load_weights(list(fine_tune.items()), strict=False)
    shared = config.mode in ("shared", "lora") and not config.main_rank  # one LoRA, every row and layer
    first = 0 if shared else config.msa_start(n)
    for block in model.layers[first:]:
        for parent, name in _linears(block, (*LINEAR, LoRALinear)):
            key, sub = mx.random.split(key)
            lora = LoRALinear(getattr(parent, name), config.rank, config.lora_alpha,
                              streams_only=not shared, key=sub)
            if lora_scale:
                key, sub = mx.random.split(key)
                lora.lora_b = mx.random.normal(lora.lora_b.shape, key=sub) * lora_scale
            setattr(parent, name, lora)
    model.adapter = adapter
    model.adapter_config = config
    return adapter


def new_adapter(model: nn.Module, mode: str = "lossless", gamma: int = 4, msa_layers: int = 2, rank: int = 8,
                seed: int = 0, **options) -> AdapterConfig:
    """Attach a new, seeded, untrained (but non-zero) adapter to ``model``; returns its config.

    Every adapter parameter is random, so lossless tests exercise real stream computations.
    ``msa_layers`` defaults to 2, which every model has (``train``'s default is 4); ``options``:
    the other fields of :class:`AdapterConfig`.
    """
    _check_model(model)
    check_keywords("new_adapter", options, [f.name for f in fields(AdapterConfig)], {"lora_rank": "{rank}"})
    cfg = AdapterConfig(mode=mode, gamma=gamma, msa_layers=msa_layers, rank=rank, **options)
    attach(model, cfg, seed=seed, lora_scale=0.02)
    return cfg


def fuse(model: nn.Module) -> bool:
    """Fold the every-row LoRA of a shared, LoRA-baseline or tuned lossless adapter into the base
    weights: the same function with one matmul per linear layer instead of three (what
    ``mlx_lm.fuse`` does offline).

    The model then keeps this adapter for good (changing adapters raises: load the base again).
    Stream-only LoRA (it touches stream rows only) stays as it is, and quantized bases (folding
    would re-quantize them) are left alone; returns whether anything was fused.
    """
    if getattr(model, "adapter_config", None) is None:
        return False
    wrapped = []  # (holder, attribute) of every every-row LoRA, also under a stream-only one
    for block in model.layers:
        for parent, name in _linears(block, (LoRALinear,)):
            layer = getattr(parent, name)
            if layer.streams_only:
                parent, name, layer = layer, "base", layer.base
            if isinstance(layer, LoRALinear) and not layer.streams_only:
                wrapped.append((parent, name))
    if not wrapped or any(not isinstance(getattr(p, n).base, nn.Linear) for p, n in wrapped):
        return False
    n_params = sum(getattr(p, n).lora_a.size + getattr(p, n).lora_b.size for p, n in wrapped)
    for parent, name in wrapped:
        setattr(parent, name, getattr(parent, name).fused())
    mx.eval(model.parameters())
    model.fused_lora = n_params
    return True


def adapter_size(model) -> int:
    """Parameters the attached adapter adds, LoRA folded into the base weights included."""
    return sum(v.size for v in adapter_weights(model).values()) + getattr(model, "fused_lora", 0)


def adapter_weights(model) -> dict[str, mx.array]:
    """The adapter's own parameters (stream adapter + LoRA matrices), flat names."""
    from mlx.utils import tree_flatten

    flat = tree_flatten(model.parameters())
    return {k: v for k, v in flat if k.startswith("adapter.") or ".lora_" in k}


def _every_row_lora(model) -> list[tuple[str, LoRALinear]]:
    """(name, layer) of the attached adapter's every-row LoRA layers (not stream-only)."""
    return [(name, m) for name, m in model.named_modules()
            if isinstance(m, LoRALinear) and not m.streams_only]


def fine_tune_weights(model) -> dict[str, mx.array]:
    """The every-row LoRA of the attached adapter under a ``lora``-mode adapter's names: a
    shared or LoRA-baseline adapter's, or the fine-tune a tuned lossless adapter carries (found
    under its stream-only LoRA)."""
    return {f"{name.removesuffix('.base')}.{k}": getattr(m, k) for name, m in _every_row_lora(model)
            for k in ("lora_a", "lora_b")}


def fine_tune_keys(model) -> set[str]:
    """The names of the every-row LoRA matrices among :func:`adapter_weights`."""
    return {f"{name}.{k}" for name, _ in _every_row_lora(model) for k in ("lora_a", "lora_b")}


def is_bare_name(name_or_path: str | Path) -> bool:
    """Whether ``name_or_path`` names an adapter of the model (the string ``sql``:
    ``MODEL/adapters/sql``) rather than a directory (``./sql``, ``out/sql``, ``.sql``, any
    ``Path``: ``Path("./sql")`` reads ``sql``)."""
    s = name_or_path
    return isinstance(s, str) and s != "" and "/" not in s and os.sep not in s and not s.startswith(".")


def adapter_destination(name_or_path: str | Path, model_path: str | Path | None) -> Path:
    """Where an adapter given as ``name_or_path`` is written: a bare name under the model's
    ``adapters/`` (where :func:`resolve_adapter` looks for it first), a path as given (``.`` and
    ``x/..`` by the directory they stand for)."""
    check_path(name_or_path, "the adapter's destination", AdapterError, "give a name or a path")
    if is_bare_name(name_or_path):
        if model_path is None:
            raise ValueError(f"'{name_or_path}' is a bare adapter name: it goes under MODEL/adapters/, "
                             f"but the model's directory is unknown; give a directory path instead "
                             f"(./{name_or_path})")
        return Path(model_path) / "adapters" / str(name_or_path)
    p = Path(name_or_path)
    return Path(os.path.abspath(p)) if p.name in ("", "..") else p


def save_adapter(model: nn.Module, dest: str | Path, *, overwrite: bool = False) -> Path:
    """Write the attached adapter to ``dest`` atomically and return where it went: a bare name
    under the model's ``adapters/`` (``load_adapter(model, NAME)`` reads it back), a path as
    given. An existing adapter there is replaced only with ``overwrite``; its training report
    stays when this is the same training's adapter (saved again, say with other n-grams)."""
    from .loader import atomic_dir

    _check_model(model)
    if getattr(model, "adapter", None) is None:
        raise AdapterError("no adapter is attached to this model")
    if getattr(model, "fused_lora", 0):
        raise AdapterError("this model's adapter is fused into its weights: save it from a model "
                           "loaded with fuse=False")
    dest = adapter_destination(dest, getattr(model, "path", None))
    with atomic_dir(dest, "adapter", overwrite=overwrite) as tmp:
        save_safetensors(tmp / WEIGHTS_FILE, adapter_weights(model))
        config = asdict(model.adapter_config)
        config["name"] = config["name"] or dest.name  # one trained in memory: its folder's
        (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=2))
        if getattr(model, "adapter_ngrams", None) is not None:
            model.adapter_ngrams.save(tmp / NGRAMS_FILE)
        if _same_adapter(dest, config, adapter_weights(model)):
            shutil.copy2(dest / REPORT_FILE, tmp / REPORT_FILE)
    return dest


def _same_adapter(folder: Path, config: dict, weights: dict) -> bool:
    """Whether ``folder`` holds a training report of this adapter: the same training record and
    the same weights, bit for bit."""
    try:
        if not (folder / REPORT_FILE).is_file() or config["training"] is None or \
                json.loads((folder / CONFIG_FILE).read_text()).get("training") != config["training"]:
            return False
        theirs = mx.load(str(folder / WEIGHTS_FILE))
    except (OSError, ValueError, AttributeError, RuntimeError):
        return False
    return theirs.keys() == weights.keys() and all(mx.array_equal(theirs[k], weights[k]).item()
                                                   for k in weights)


def available_adapters(model_path: str | Path) -> list[str]:
    """Names of the adapters under ``model_path/adapters``."""
    return sorted(p.parent.name for p in (Path(model_path) / "adapters").glob(f"*/{CONFIG_FILE}"))


def trained_config(adapter_dir: Path) -> dict:
    """The settings the adapter's training report records (``config``: ``chat_template``,
    ``system_prompt``, ``max_seq_len`` ...), and whether its prompts were in the chat template
    (``chat_prompts``: the option, or conversations; since 2026-11-29). An adapter saved without
    its report (trained in memory, then :func:`save_adapter`) has the prompt settings in its
    config's training record; {} where neither says, or they cannot be read."""
    try:
        report = json.loads((adapter_dir / REPORT_FILE).read_text())
    except (OSError, ValueError):  # none, or unreadable
        report = None
    config = report.get("config") if isinstance(report, dict) else None
    if isinstance(config, dict):
        return {**config, "chat_prompts": report.get("chat_prompts", config.get("chat_template")) is True}
    try:
        training = json.loads((adapter_dir / CONFIG_FILE).read_text()).get("training")
    except (OSError, ValueError, AttributeError):
        return {}
    if not isinstance(training, dict):
        return {}
    return {**{k: training[k] for k in PROMPT_SETTINGS if k in training},
            "chat_prompts": training.get("chat_prompts") is True}


def trained_system_prompt(config: dict) -> str | None:
    """The system prompt an adapter learnt after (:func:`trained_config`'s ``config``): only one
    given with the chat template counts."""
    system = config.get("system_prompt") if config.get("chat_template") is True else None
    return system if isinstance(system, str) else None


def resolve_adapter(model_path: str | Path | None, name_or_path: str | Path) -> Path:
    """A name under the model's ``adapters/`` folder, or an adapter path as given. A bare name
    (``sql``) is the model's adapter first, whatever directory of that name the current one holds
    (``./sql`` names that one, and only that one), as ``train --out sql`` writes under the model."""
    check_path(name_or_path, "the adapter's name", AdapterError, "give a name or a path")
    p = Path(name_or_path)
    bare = is_bare_name(name_or_path)
    if bare and model_path is not None and not Path(model_path).is_dir():
        model_dir(model_path)  # the model is what is missing: said as such
    q = Path(model_path) / "adapters" / str(name_or_path) if bare and model_path is not None else None
    for candidate in (q, p):
        if candidate is not None and (candidate / CONFIG_FILE).is_file():
            return candidate
    for folder in (q, p):  # there, but not an adapter (damaged, or a training run's folder)
        if folder is not None and folder.is_dir():
            run = (f"; a training run's folder: its adapter is {folder.name.removesuffix('.train')}, its "
                   "checkpoints under checkpoints/" if folder.name.endswith(".train") else "")
            raise AdapterError(f"{folder}: not an adapter directory (it has no {CONFIG_FILE}{run})")
    if not bare:  # a bare name is the model's adapter's, whatever file of that name is here
        if p.exists():
            raise AdapterError(f"{p}: a file, not an adapter directory")
        ours = model_path is not None and (Path(model_path) / "adapters" / p.name / CONFIG_FILE).is_file()
        hint = (f" (a Path is a directory; the string '{p.name}' names the model's adapter)"
                if ours and isinstance(name_or_path, Path) else "")
        raise AdapterError(f"adapter '{name_or_path}' not found: no such directory{hint}")
    where = f", nor under {Path(model_path) / 'adapters'}" if model_path is not None else ""
    found = available_adapters(model_path) if model_path is not None else []
    have = f"; this model has: {', '.join(found)}" if found else "; this model has none"
    raise AdapterError(f"adapter '{name_or_path}' not found (no directory '{name_or_path}' here{where})"
                       + have)


# What an adapter's weights are: every config has them (``save_adapter`` writes every field)
REQUIRED_KEYS = ("mode", "gamma", "msa_layers", "rank")


def read_config(path: Path) -> AdapterConfig:
    """The configuration saved in adapter directory ``path`` (keys of other versions ignored)."""
    try:
        raw = json.loads((path / CONFIG_FILE).read_bytes())
    except (OSError, ValueError) as e:  # unreadable, not UTF-8, not JSON
        raise AdapterError(f"{path / CONFIG_FILE}: unreadable adapter config ({e})") from None
    if not isinstance(raw, dict):
        raise AdapterError(f"{path / CONFIG_FILE}: unreadable adapter config (not a JSON object)")
    known = [f for f in fields(AdapterConfig) if f.name in raw]
    for f in known:
        check_value(f.name, raw[f.name], f.type, source=str(path / CONFIG_FILE), error=AdapterError)
    missing = ", ".join(repr(k) for k in REQUIRED_KEYS if k not in raw)
    if missing:  # a default would read a shared adapter as lossless, say
        raise AdapterError(f"{path / CONFIG_FILE}: unreadable adapter config (no {missing}: an adapter's "
                           "config says what its weights are)")

    def numbers(x) -> bool:
        return isinstance(x, list) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in x)

    for key, ok, kind in (("base_probe", numbers, "a list of numbers"),
                          ("base_weights_probe", lambda x: isinstance(x, list) and all(map(numbers, x)),
                           "lists of numbers"),
                          ("training", lambda x: isinstance(x, dict), "a JSON object")):
        if raw.get(key) is not None and not ok(raw[key]):
            raise AdapterError(f"{path / CONFIG_FILE}: unreadable adapter config ('{key}' must be {kind})")
    # named by its directory, what it is chosen by (a copy under a new name is that name)
    return AdapterConfig(**{f.name: raw[f.name] for f in known if f.name != "name"}, name=adapter_name(path))


@contextmanager
def kept_on_failure(model):
    """If the body fails, the adapter attached before it (weights and n-grams), or none, is
    attached again: a failed load does not leave the model without the adapter it had."""
    if getattr(model, "fused_lora", 0):  # nothing can take its adapter off (detach refuses)
        yield
        return
    cfg = getattr(model, "adapter_config", None)
    # the config itself, not a copy: a paused generation goes on with the adapter it began with
    before = (cfg, adapter_weights(model), model.adapter_ngrams) if cfg is not None else None
    try:
        yield
    except BaseException:
        detach(model)
        if before is not None:
            attach(model, before[0])
            model.load_weights(list(before[1].items()), strict=False)
            model.adapter_ngrams = before[2]
        raise


def adapter_name(path: Path) -> str:
    """An adapter's name: its directory's (``.`` and ``x/..`` by the directory they stand for)."""
    return Path(os.path.abspath(path)).name


def check_made_for(model, path: Path, cfg: AdapterConfig) -> None:
    """An AdapterError unless the adapter in ``path`` (config ``cfg``) was made for ``model``
    (:func:`made_for`), naming the base it was trained on where it recorded one."""
    if not made_for(model, cfg):
        trained_on = (cfg.training or {}).get("base_model")  # adapters trained since 2026-11-27
        ours = fingerprint(model)
        why = (f"fingerprint {cfg.base_fingerprint}, this model {ours}"
               if cfg.base_fingerprint and cfg.base_fingerprint != ours
               else "the same architecture with other weights")
        raise AdapterError(f"adapter '{adapter_name(path)}' was made for another base model ({why})"
                           + (f"; it was trained on {trained_on}" if trained_on else ""))


def load_adapter(model: nn.Module, name_or_path: str | Path, model_path: str | Path | None = None, *,
                 check_base: bool = True) -> AdapterConfig:
    """Load an adapter from disk onto ``model`` (replacing the attached one). ``check_base=False``
    accepts an adapter made for another base of the same shape, as a training run's starting point
    only: its streams drafted that base's hidden states, not these. Names are looked up under
    ``model_path``, by default the directory the model was loaded from."""
    _check_model(model)
    path = resolve_adapter(model_path if model_path is not None else getattr(model, "path", None),
                           name_or_path)
    cfg = read_config(path)
    if check_base:
        check_made_for(model, path, cfg)
    try:
        weights = mx.load(str(path / WEIGHTS_FILE))
    except Exception as e:
        raise AdapterError(f"{path / WEIGHTS_FILE}: corrupt or missing adapter weights ({e})") from None
    if getattr(model, "fused_lora", 0):
        detach(model)  # refused: said as the fused adapter's, not as this one's not fitting
    with kept_on_failure(model):
        try:
            attach(model, cfg)
        except AdapterError as e:  # a model of another shape (fewer layers, say): said as such
            raise AdapterError(f"adapter '{adapter_name(path)}' does not fit this model: {e}") from None
        current = adapter_weights(model)
        if set(weights) != set(current):
            missing, extra = sorted(set(current) - set(weights))[:3], sorted(set(weights) - set(current))[:3]
            said = "; ".join(f"{what} {keys}" for what, keys in (("missing", missing), ("unexpected", extra))
                             if keys)
            raise AdapterError(f"adapter '{adapter_name(path)}' does not match its config ({said})")
        for k, v in weights.items():
            if v.shape != current[k].shape:
                raise AdapterError(f"adapter '{adapter_name(path)}': shape mismatch for {k}")
        model.load_weights(list(weights.items()), strict=False)
        mx.eval(model.parameters())
        if (path / NGRAMS_FILE).is_file():
            try:
                model.adapter_ngrams = NgramTable.load(path / NGRAMS_FILE)
            except ValueError as e:
                raise AdapterError(str(e)) from None
    model.adapter_config.name = cfg.name
    return model.adapter_config


def read_adapter(model, name_or_path: str | Path, model_path: str | Path | None = None, *,
                 check_base: bool = True) -> tuple[AdapterConfig, dict[str, mx.array]]:
    """The config and weights of an adapter of ``model`` (checked as ``load_adapter`` checks
    them); ``model`` is left bare."""
    cfg = load_adapter(model, name_or_path, model_path, check_base=check_base)
    weights = dict(adapter_weights(model))
    detach(model)
    return cfg, weights


def read_fine_tune(model, name_or_path: str | Path, model_path: str | Path | None = None
                   ) -> tuple[AdapterConfig, dict[str, mx.array]]:
    """The config and LoRA weights of a ``lora``-mode adapter of ``model`` (a next-token
    fine-tune), for a tuned lossless adapter to carry (``attach(..., fine_tune=)``); ``model``
    is left bare."""
    cfg, weights = read_adapter(model, name_or_path, model_path)
    check_fine_tune(cfg)
    return cfg, {k: v for k, v in weights.items() if ".lora_" in k}


def check_fine_tune(cfg: AdapterConfig) -> None:
    """An AdapterError unless ``cfg`` is a next-token fine-tune (``lora`` mode), what streams are
    trained over (``train --over``)."""
    if cfg.mode != "lora":
        raise AdapterError(f"adapter '{cfg.name}' is a {cfg.mode}-mode adapter: streams are trained "
                           "over a fine-tune, a lora-mode adapter")
