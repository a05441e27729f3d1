"""Train speculative adapters: lossless and shared modes, the pruning adapter, data parallel.

What a step minimizes, and the passes it runs (segment attention): ``objective.py``.

Data parallel: under ``mlx.launch`` or with ``processes=N`` every process takes its share of each
global batch; the loss of each process is normalised by the global counts of valid targets (summed
across processes), and the gradients are summed (``process_group.py``: ``mx.distributed.all_sum``,
or pipes between the processes ``processes=N`` starts on this machine), so N processes compute the
same update as one process on the whole batch.

The run itself (steps, validations, checkpoints, the adapter kept): ``training_run.py``.
Checkpoints (adapter weights, optimizer state, step; ``checkpoint.py``) go to
``OUT.train/checkpoints``; the order of the data is a function of ``seed`` and the epoch
(``train_batches.py``), so a resumed run sees the same batches as an uninterrupted one. The
frozen base's states of lossless steps are in ``base_states.py``, self-distillation in
``distill.py``.
"""

from __future__ import annotations

import inspect
import json
import math
import shlex
import sys
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten

from .adapter import (
    PROMPT_SETTINGS,
    REPORT_FILE,
    AdapterConfig,
    adapter_destination,
    adapter_weights,
    attach,
    check_fine_tune,
    check_made_for,
    check_swappable,
    detach,
    fine_tune_keys,
    fingerprint,
    is_bare_name,
    kept_on_failure,
    load_adapter,
    made_for,
    read_adapter,
    read_config,
    read_fine_tune,
    resolve_adapter,
    save_adapter,
    trained_config,
    trained_system_prompt,
)
from .checkpoint import (
    RUN_LOCK,
    check_run_free,
    checkpoints,
    clear_run,
    examples_digest,
    last_state,
    load_last_checkpoint,
    run_dir,
    run_held,
    setting_said,
    weights_digest,
)
from .data import (
    Dataset,
    Example,
    check_dataset,
    check_system_prompt,
    data_directory,
    load_datasets,
    rows_dataset,
)
from .device import on_gpu
from .distill import distill_dataset
from .errors import (
    USER_ERRORS,
    AdapterError,
    OptionError,
    OutputExistsError,
    Said,
    check_keywords,
    check_number,
    check_path,
    check_seed,
    check_switch,
    verbatim,
)
from .loader import model_dir
from .lora import LoRALinear
from .ngrams import NGRAMS_FILE, NgramTable
from .objective import grad_step
from .outputs import (
    check_replaceable,
    check_replaceable_file,
    check_writable,
    cli_command,
    json_text,
    recorded_path,
    signals_held,
    write_text_atomic,
)
from .process_group import DistributedGroup, barrier, check_same, run_local, threads_each
from .project import DEFAULT_MODEL
from .tokenizer import eos_ids
from .train_batches import HOLD_OUT_MIN, Batch, default_iters, epoch_batches, hold_out, length_keys
from .training_run import NOT_COMPARED, Run, check_resumable, final_evaluation, plan_line, train_steps

# mlx-lm's training options spelt otherwise here (or with no counterpart), with what stands for
# each here (errors.instead); the command line answers their flags (--learning-rate) from it too
MLX_LM_NAMES = {"learning_rate": "{lr}", "steps_per_eval": "{val_every}", "adapter_path": "{out}",
                "resume_adapter_file": "{init} (a finished adapter's weights) or {resume} (a stopped run)",
                "fine_tune_type": "{mode}", "train": "not needed here: train trains",
                "mask_prompt": "not needed here: the loss never covers the prompt",
                "num_layers": "the nearest is {msa_layers}, the top layers that carry the streams",
                "grad_checkpoint": "no gradient checkpointing here: a lower {batch_size} or {max_seq_len} "
                                   "takes less memory",
                "grad_accumulation_steps": "no accumulation here: raise {batch_size}, or train in several "
                                           "processes ({processes})",
                "steps_per_report": "not needed here: the progress bar shows every step, {val_every} sets "
                                    "the validations",
                "test": "not here: specstream-mlx bench --adapter NAME --data DIR judges an adapter",
                "verbose": "{progress} draws the bar; {log} takes the messages"}
MODES = ("lossless", "shared", "lora")
# Options a mode ignores: ``lora`` drafts nothing; only lossless self-distillation builds
# stream states in segments and continues prompts given alone
_LOSSLESS_ONLY = ("segment_len", "state_cache_mb", "distill_tokens")
_UNUSED_IN = {"lora": ("gamma", "branch", "tree_budget", "accept_prompts", "accept_tokens", *_LOSSLESS_ONLY),
              "shared": _LOSSLESS_ONLY}


def check_used(mode: str, self_distill: bool | None, given) -> None:
    """Refuse the options of ``given`` (names) that ``mode`` ignores (``--mode lora --gamma 2``),
    for callers that know which were given, as the command line does; :func:`train` ignores them,
    as ``generate`` does, so one set of options serves every mode."""
    unused = _UNUSED_IN.get(mode, ("distill_tokens",) if self_distill is False else ())
    idle = [name for name in given if name in unused]
    if idle:
        why = f"{{mode={mode}}}" if mode != "lossless" else "{self_distill=False}"
        raise OptionError(f"{why} does not use " + ", ".join(f"{{{n}}}" for n in idle))


@dataclass
class TrainConfig:
    mode: str = "lossless"
    gamma: int = 4
    msa_layers: int = 4
    rank: int = 8
    lora_alpha: float = 16.0
    stream_init_rank: int = 0
    prune_rank: int = 8
    iters: int = 0
    batch_size: int = 8
    lr: float = 1e-3
    fine_tune_lr: float | None = None  # shared: the every-row LoRA's peak rate (None: lr)
    warmup: int = 0
    weight_decay: float = 0.0
    grad_clip: float | None = None
    max_seq_len: int = 512
    length_policy: str = "truncate"
    chat_template: bool = False
    system_prompt: str | None = None  # with chat_template: a system turn before each text prompt
    self_distill: bool = False
    distill_tokens: int = 64  # self-distillation: tokens the base writes for a prompt given alone
    seed: int = 0
    alphas: list[float] = field(default_factory=list)  # alpha_0 (main), alpha_1..alpha_gamma
    prune_weight: float = 1.0
    segment_len: int | None = 32
    group_by_length: bool = True
    val_every: int = 100
    val_batches: int | None = None
    save_every: int = 100
    state_cache_mb: int = 1024  # lossless: base states kept across epochs (BaseStateCache)
    accept_prompts: int = 8  # validation prompts decoded at each evaluation (0: none)
    accept_tokens: int = 48  # tokens generated per prompt there
    branch: int = AdapterConfig.branch  # the tree they are decoded with (the adapter's default)
    tree_budget: int = AdapterConfig.tree_budget
    over: str | None = None  # the fine-tune (a lora-mode adapter): lossless drafts it, shared starts from it
    init: str | None = None  # the adapter whose weights the run starts from

    def __post_init__(self):
        """NumPy scalars given as options (``iters=np.int64(10)``) as the Python numbers they are:
        the config is saved as JSON with every checkpoint and report."""
        for f in fields(self):
            if isinstance(value := getattr(self, f.name), np.generic):
                setattr(self, f.name, value.item())


# -- parameters and optimizer ----------------------------------------------------------------

def set_trainable(model) -> int:
    """Freeze the base (and a tuned lossless adapter's fine-tune); unfreeze the adapter's
    parameters. Returns how many train."""
    model.freeze()
    model.adapter.unfreeze()
    lossless = model.adapter_config.mode == "lossless"
    for m in model.modules():
        if isinstance(m, LoRALinear) and (m.streams_only or not lossless):
            m.unfreeze(keys=["lora_a", "lora_b"], recurse=False)
    return sum(v.size for _, v in tree_flatten(model.trainable_parameters()))


def make_optimizer(tc: TrainConfig, fine_tune: set[str] = frozenset()) -> optim.Optimizer:
    """AdamW with warmup then cosine decay to a tenth. With ``tc.fine_tune_lr``, the every-row
    LoRA (parameter paths ``fine_tune``) has an optimizer of that peak rate: a shared adapter
    started from a fine-tune (``--over``) can train its streams fast and move the fine-tune
    gently (at the streams' rate, 1e-3, it loses what a fine-tune made at 1e-4 had learnt)."""

    def adamw(peak: float) -> optim.Optimizer:
        lr = peak
        if tc.iters > 1:
            warm = min(tc.warmup, tc.iters - 1)
            decay = optim.cosine_decay(peak, max(tc.iters - warm, 1), peak * 0.1)
            lr = optim.join_schedules([optim.linear_schedule(peak * 0.01, peak, warm), decay],
                                      [warm]) if warm else decay
        return optim.AdamW(learning_rate=lr, weight_decay=tc.weight_decay)

    if tc.fine_tune_lr is None or not fine_tune:
        return adamw(tc.lr)
    return optim.MultiOptimizer([adamw(tc.fine_tune_lr), adamw(tc.lr)], [lambda path, _: path in fine_tune])


# -- the training loop -----------------------------------------------------------------------


# option -> (the least value it takes, whether that value itself is allowed): every one a finite
# number; None where the option may be None (its default meaning)
_RANGES = {"lr": (0, True), "fine_tune_lr": (0, True),  # a rate of 0: those weights stay as they start
           "epochs": (0, False), "prune_weight": (0, True),
           "warmup": (0, True), "segment_len": (0, True), "val_every": (0, True),
           "val_batches": (0, True), "save_every": (0, True), "accept_prompts": (0, True),
           "accept_tokens": (1, True), "state_cache_mb": (0, True), "grad_clip": (0, True),
           "weight_decay": (0, True), "batch_size": (1, True), "iters": (1, True),
           "distill_tokens": (1, True), "branch": (1, True), "tree_budget": (1, True), "gamma": (1, True),
           "rank": (1, True), "msa_layers": (1, True), "keep_checkpoints": (0, True), "processes": (1, True)}
# those that count something: whole numbers (iters=2.5 would fail deep in the schedule)
_WHOLE = {"warmup", "segment_len", "val_every", "val_batches", "save_every", "accept_prompts",
          "accept_tokens", "state_cache_mb", "batch_size", "iters", "distill_tokens", "branch",
          "tree_budget", "gamma", "rank", "msa_layers", "keep_checkpoints", "processes"}


def _check_numbers(**values) -> None:
    """Each of ``values`` (None: its default) of its type and within its range (:data:`_RANGES`,
    :data:`_WHOLE`; :func:`~mlx_specstream.errors.check_number`)."""
    for name, value in values.items():
        if value is not None:
            least, inclusive = _RANGES[name]
            check_number(name, value, least, inclusive=inclusive, whole=name in _WHOLE)


def _resolve_alphas(alphas, mode: str, gamma: int) -> list[float]:
    if mode == "lora":
        if alphas is not None:
            raise OptionError("{mode=lora} trains the main stream only: it takes no {alphas}")
        return [1.0]
    if alphas is None:
        return [0.0] + [1.0] * gamma if mode == "lossless" else [1.0] + [0.1] * gamma
    try:
        alphas = [float(a) for a in (alphas.replace(",", " ").split() if isinstance(alphas, str) else alphas)]
    except (TypeError, ValueError):
        raise OptionError(f"{{alphas}} must be numbers (alpha_0 and the streams' weights), "
                          f"not {alphas!r}") from None
    if len(alphas) == 2 and gamma != 1:
        alphas = [alphas[0]] + [alphas[1]] * gamma
    if len(alphas) != gamma + 1:
        raise OptionError(f"{{alphas}}: give alpha_0 and alpha_1..alpha_{gamma} ({gamma + 1} numbers), "
                          f"or two (alpha_0, one alpha for every stream); got {len(alphas)}")
    if not all(math.isfinite(a) and a >= 0 for a in alphas):
        raise OptionError(f"{{alphas}} must be finite numbers >= 0, not {alphas}")
    if mode == "lossless" and alphas[0] != 0:
        raise OptionError("{mode=lossless} trains no main-stream parameters: alpha_0 of {alphas} must be 0")
    if not any(alphas[1:]):
        raise OptionError("{alphas}: at least one stream weight must be > 0")
    return alphas


def fit_max_seq_len(model: nn.Module, max_seq_len: int | None) -> int:
    """The longest example of a run (``train``, ``write_ngrams``): ``max_seq_len``, refused where it
    is longer than the model holds; None: :data:`TrainConfig.max_seq_len`, or what the model holds
    where that is less (a small model's defaults fit it)."""
    if max_seq_len is None:
        return min(TrainConfig.max_seq_len, model.max_positions or TrainConfig.max_seq_len)
    if model.max_positions is not None and max_seq_len > model.max_positions:
        raise OptionError(f"{{max_seq_len}} is {max_seq_len}, beyond the {model.max_positions} tokens the "
                          "model holds")
    return max_seq_len


def fit_msa_layers(model: nn.Module, msa_layers: int | None) -> int:
    """A run's multi-stream layers: ``msa_layers``, refused where the model has fewer layers;
    None: :data:`TrainConfig.msa_layers`, or every layer of a model with fewer."""
    if msa_layers is None:
        return min(TrainConfig.msa_layers, len(model.layers))
    if msa_layers > len(model.layers):
        raise OptionError(f"{{msa_layers}} must be at most the model's {len(model.layers)} layers, not "
                          f"{msa_layers}")
    return msa_layers


def _run_data(data, tokenizer, vocab_size: int | None, *, say, max_seq_len: int, length_policy: str,
              chat_template: bool, system_prompt: str | None, self_distill: bool, seed: int, progress: bool
              ) -> tuple[Dataset, Dataset | None, dict[str, str | None]]:
    """A run's training and validation sets (``data``: a directory; the rows a ``train.jsonl``
    holds, as a list of dicts; a :class:`Dataset` or a list of its Examples; or a (train, valid)
    pair of those, valid may be None), what there is to say of them said; where there is no
    validation set, a share of the training set held out for it. Also the digests a resumed run is
    checked by (``data``: the training set as given; ``valid_data``)."""
    read = dict(max_seq_len=max_seq_len, policy=length_policy, chat_template=chat_template,
                system=system_prompt, vocab_size=vocab_size, progress=progress)
    pair = isinstance(data, tuple | list) and len(data) == 2 and isinstance(data[0], Dataset | list) \
        and isinstance(data[1], Dataset | list | None)
    alone = isinstance(data, Dataset) or isinstance(data, list) and not pair
    if alone:
        data, pair = (data, None), True  # the training set alone: validation held out of it
    if isinstance(data, tuple | list):
        if not pair:
            raise ValueError("data: a directory, a list of rows (dicts, as train.jsonl's lines), or a "
                             "(train, valid) pair of such lists or of Dataset (valid may be None)")
        names = ("data", None) if alone else ("data[0]", "data[1]")  # how the caller's rows are named
        train_ds, valid_ds = (_dataset(x, tokenizer, name, read) for name, x in zip(names, data))
        for name, split, ds in zip(names, ("train", "valid"), (train_ds, valid_ds)):
            if ds is not None:  # as reading a file would have refused or cut it
                check_dataset(ds, name if alone else f"{name} ({split})", vocab_size, max_seq_len)
    elif not isinstance(data, (str, Path)):
        raise ValueError("data: a directory, a list of rows, a Dataset, or a (train, valid) pair of "
                         f"them; not {type(data).__name__}")
    else:
        train_ds, valid_ds = load_datasets(data, tokenizer, say=say, **read)
    for ds in (train_ds, valid_ds):
        for note in (ds.notes if ds is not None else []):
            say(note)
        if ds is not None and ds.n_empty and not self_distill:
            say(f"{ds.path.name if ds.path else 'data'}: {ds.n_empty} of {ds.n_read} examples have an "
                "empty completion: trained on as given, they teach the model to stop right after the "
                "prompt (lossless mode's default self-distillation learns the model's own continuations)")
    data_digest = examples_digest(train_ds)  # the data as given: a resumed run must see the same
    if valid_ds is None:
        train_ds, valid_ds = hold_out(train_ds, seed)
        total = len(train_ds) + (len(valid_ds) if valid_ds is not None else 0)
        none = "no validation set" + (" (valid.jsonl)" if isinstance(data, (str, Path)) else "")
        say(f"{none}: {len(valid_ds)} of the {total} training examples held out "
            "for validation (acceptance, best adapter)" if valid_ds is not None
            else f"{none}, and {total} example{'s are' if total != 1 else ' is'} too few to hold some out "
            f"({HOLD_OUT_MIN} or more): no validation, so no tokens/pass measured and no best adapter "
            "kept; give one to have them")
    valid_digest = examples_digest(valid_ds) if valid_ds is not None else None
    return train_ds, valid_ds, {"data": data_digest, "valid_data": valid_digest}


def _dataset(x: Dataset | list | None, tokenizer, name: str, read: dict) -> Dataset | None:
    """A training or validation set given in Python: a Dataset as it is, a list of its Examples,
    or of the rows a JSONL file holds (read as the file is)."""
    if isinstance(x, list) and x and all(isinstance(e, Example) for e in x):
        return Dataset(x)
    return rows_dataset(x, tokenizer, name=name, **read) if isinstance(x, list) else x


def _self_distilled(model, tokenizer, split: str, ds: Dataset | None, used: list[int], *, key: dict,
                    work: Path | None, group, max_seq_len: int, distill_tokens: int, progress: bool,
                    say) -> Dataset | None:
    """``ds`` with the examples a run uses (``used``) continued by the model as attached, greedily
    (``distill.py``), kept in ``work/distilled/SPLIT.jsonl`` for a resumed or longer run (``key``:
    what wrote them). A text row has no prompt to continue: it is kept as given."""
    if ds is None:
        return None
    cache = work / "distilled" / f"{split}.jsonl" if work is not None else None
    wanted = [i for i in used if not ds.examples[i].text]
    if len(wanted) < len(used):
        say(f"self-distill {split}: {len(used) - len(wanted)} text rows have no prompt for the base model "
            "to continue: trained on as given")
    return distill_dataset(model, ds, tokenizer, max_seq_len, distill_tokens, key=key, indices=wanted,
                           cache=cache, group=group, desc=f"self-distill {split}", progress=progress, say=say)


def _resolve_out(out, model_path: Path | None) -> tuple[Path | None, str, bool]:
    """(directory, adapter name, whether ``out`` was a bare name)."""
    if out is None:
        return None, "", False
    check_path(out, "{out}", OptionError, "give an adapter name (saved under MODEL/adapters/) or a path")
    out_dir = adapter_destination(out, model_path)
    if not out_dir.name or out_dir.name in (".", ".."):
        raise OptionError(": {out} names no folder to save an adapter in", subject=str(out))
    return out_dir, out_dir.name, is_bare_name(out)


def _check_out(out_dir: Path, resume: bool, overwrite: bool, bare: bool) -> None:
    """Refuse to replace an adapter or a run unless asked to, or what this project did not write;
    refuse to resume where there is no run (``bare``: ``out`` named an adapter of the model)."""
    work = run_dir(out_dir)
    check_replaceable(out_dir, "adapter", True)  # first: neither flag may touch what is not ours
    if work.exists() or work.is_symlink():  # a dangling link too: said now, not after the work
        check_replaceable(work, "training run", True)
    found = checkpoints(work / "checkpoints")
    if out_dir.exists() and any(out_dir.iterdir()) and not (resume or overwrite):  # empty: nothing to lose
        again = ", or {resume=True} to continue its training" if found else ""
        raise OutputExistsError(" already exists: give another {out}, or {overwrite=True} to replace it"
                                + again, subject=str(out_dir))
    if found and not (resume or overwrite):
        raise OutputExistsError(" holds checkpoints of an earlier run: {resume=True} continues it, "
                                "{overwrite=True} starts again", subject=str(work / "checkpoints"))
    # a run stopped before its first checkpoint (its folder holds the data it made) starts again
    begun = work.is_dir() and any(e.name != RUN_LOCK for e in work.iterdir())  # (the lock: this run's)
    if resume and not found and not overwrite and (out_dir.exists() or not begun):
        elsewhere = (" (a run keeps its checkpoints under the {model} it was started with: give that one)"
                     if bare else "")  # another model's run, not a new one here
        none = f"no checkpoint in {work / 'checkpoints'}"
        if out_dir.exists():
            raise OutputExistsError(" to resume from" + elsewhere + "; {overwrite=True} trains it again "
                                    "from step 0", subject=f"{out_dir}: {none}")
        raise OptionError(": no run to resume here" + elsewhere + "; {overwrite=True} with {resume=True} "
                          "starts a run where there is none", subject=none)
    check_writable(out_dir.parent)


def run_settings(model_path: str | Path, out: str | Path) -> dict:
    """The settings (:class:`TrainConfig`'s fields) that the run to resume at ``out`` (an adapter
    name or directory of the model at ``model_path``) was started with, from its last readable
    checkpoint; {} without one. The command line's ``--resume`` takes them where it is not told
    otherwise (in Python, :func:`train` with ``resume=True`` names the ones that differ)."""
    try:
        out_dir = _resolve_out(out, Path(model_path))[0]
    except ValueError:
        return {}  # train says what is wrong with it
    last = last_state(run_dir(out_dir) / "checkpoints") if out_dir else None
    state = last[1] if last is not None else {}
    settings = dict(state.get("settings") or state.get("config") or {})  # "config" alone: before 2026-11-28
    accepted = inspect.signature(train).parameters  # its options (a TrainConfig field may be derived)
    settings = {k: v for k, v in settings.items() if k in accepted and k not in ("model", "data", "init")}
    if "mode" in settings:  # what the mode ignores or sets by itself (None in train's arguments): left to it
        mode = settings["mode"]
        unused = _UNUSED_IN.get(mode, ("distill_tokens",) if settings.get("self_distill") is False else ())
        by_mode = {"self_distill": mode == "lossless",
                   "alphas": _resolve_alphas(None, mode, settings.get("gamma", 0))}
        settings = {k: v for k, v in settings.items()
                    if k not in unused and not (k in by_mode and v == by_mode[k])}
    return settings


def _finished_report(out_dir: Path | None, iters: int, ckpt_dir: Path) -> dict | None:
    """The report of the adapter in ``out_dir`` if it is the finished run of ``iters`` steps whose
    checkpoints are ``ckpt_dir`` (not an earlier stage's, saved before the run was taken further,
    nor another run's adapter put there)."""
    try:
        report = json.loads((out_dir / REPORT_FILE).read_text()) if out_dir is not None else None
    except (OSError, ValueError):
        return None
    done = isinstance(report, dict) and report.get("iters") == iters and bool(report.get("history")) \
        and report["history"][-1].get("step") == iters and report.get("checkpoints") == str(ckpt_dir)
    return report if done else None


def _trained_settings(adapter_dir: Path, limit: int | None, *, max_seq_len, chat_template,
                      system_prompt) -> dict:
    """Of the settings left None, those the adapter's training report records, where they are of
    their type: a length the model holds (``limit``), the system prompt with the chat template."""
    config, taken = trained_config(adapter_dir), {}
    length = config.get("max_seq_len")
    if max_seq_len is None and type(length) is int and 2 <= length <= (limit or length):
        taken["max_seq_len"] = length
    if chat_template is None and config.get("chat_template") is True:
        taken["chat_template"] = True
    system = trained_system_prompt(config)
    if system_prompt is None and (chat_template or taken.get("chat_template")) and system is not None:
        taken["system_prompt"] = system
    return taken


def _group(distributed):
    """The run's processes: a group given (an ``mx.distributed`` group, or
    :func:`~mlx_specstream.process_group.run_local`'s), the ``mlx.launch`` processes, or None (one
    process)."""
    if isinstance(distributed, mx.distributed.Group):
        return DistributedGroup(distributed) if distributed.size() > 1 else None
    if distributed not in (None, True, False):
        return distributed
    if distributed is False:
        return None
    g = mx.distributed.init()
    return DistributedGroup(g) if g.size() > 1 else None


def default_processes(model, tokenizer, batch_size: int, distributed=None) -> int:
    """``specstream-mlx train``'s processes (``train(processes=None)``): 2 where MLX computes on
    the CPU of a machine with 2 or more cores, else 1. On a 2-core CPU two processes (one BLAS
    thread each) make a step faster than one process with both cores in every mode measured
    (docs/training.md, "Cost of a step"): MLX runs its element-wise work on one core per process. On
    a GPU one process has the device. Also 1 where the run is not one a directory describes (a loaded
    model, which other processes cannot share, or a tokenizer object given: ``processes=2`` takes
    the latter), a batch of one, a group given or ``mlx.launch``."""
    if (not isinstance(model, (str, Path)) or tokenizer is not None or batch_size < 2
            or distributed not in (None, True) or mx.default_device().type != mx.DeviceType.cpu):
        return 1
    if distributed is None and _group(None) is not None:
        return 1
    return 2 if threads_each(1) >= 2 else 1


def _train_local(processes: int, arguments: dict) -> dict:
    """:func:`train` in ``processes`` processes on this machine; rank 0's report."""
    if arguments["distributed"] not in (None, True, False):
        raise ValueError("processes > 1 starts its own processes: give no group (distributed)")
    if arguments["distributed"] is not False and _group(None) is not None:
        raise ValueError("processes > 1 starts its own processes: not under mlx.launch")
    if not isinstance(arguments["model"], (str, Path)):
        raise ValueError("processes > 1 needs the model as a directory (each process loads it)")
    if processes > arguments["batch_size"]:
        raise OptionError(f"{{processes}} ({processes}) must not exceed {{batch_size}} "
                          f"({arguments['batch_size']}): each process takes a share of every batch")
    out_dir, _, bare = _resolve_out(arguments["out"], Path(arguments["model"]))
    if out_dir is not None:  # before the processes start: they load the model first
        _check_out(out_dir, arguments["resume"], arguments["overwrite"], bare)
    kwargs = {k: v for k, v in arguments.items() if k not in ("processes", "distributed")}
    return run_local(processes, train, kwargs, quiet=USER_ERRORS,
                     worker_kwargs={"progress": False, "callback": None, "log": None})


def _check_arguments(*, model, data, mode, out, over, init, iters, epochs, self_distill, seed, callback,
                     log, tokenizer, model_path, distributed, chat_template, system_prompt, group_by_length,
                     resume, overwrite, progress, **numbers) -> None:
    """:func:`train`'s arguments, each of its type and in its range and all of them together one
    run, before any work (and before the model's adapter goes)."""
    check_switch("self_distill", self_distill, optional=True)
    for name, value in (("chat_template", chat_template), ("group_by_length", group_by_length),
                        ("resume", resume), ("overwrite", overwrite), ("progress", progress)):
        check_switch(name, value)
    check_system_prompt(system_prompt, chat_template)
    for name, value in (("over", over), ("init", init)):
        if value is not None:
            check_path(value, f"{{{name}}}", OptionError, "give an adapter name or a path")
    if mode not in MODES:
        raise OptionError(f"{{mode}} must be 'lossless', 'shared' or 'lora', not '{verbatim(mode)}'")
    if iters is not None and epochs is not None:
        raise OptionError("give either {iters} or {epochs}, not both")
    if over is not None and mode == "lora":
        raise OptionError("{over} (a fine-tune under the streams) is for lossless and shared mode")
    if self_distill and mode != "lossless":
        raise OptionError("{self_distill} is for lossless mode (shared mode learns the data)")
    # in the order of train's signature; processes None: the default
    _check_numbers(iters=iters, epochs=epochs, **{k: v for k, v in numbers.items() if k in _RANGES})
    check_seed(seed)
    if callback is not None and not callable(callback):
        raise TypeError(f"callback must be a function of (step, info), not {type(callback).__name__}")
    if log is not None and not callable(log):
        raise TypeError(f"log must be a function of one message (str), not {type(log).__name__}")
    if isinstance(model, (str, Path)):
        model_dir(model)  # an empty path (an unset variable) is said, not read as the current directory
    else:
        from .api import check_model

        check_model(model, None, paths=True)
    if tokenizer is not None and (isinstance(tokenizer, (str, Path))  # a path: load() gives the object
                                  or not callable(getattr(tokenizer, "encode", None))):  # what data reads
        raise TypeError("tokenizer must be a tokenizer (one with encode, as load() returns) or None, not "
                        f"{type(tokenizer).__name__}")
    if model_path is not None and not isinstance(model, (str, Path)):  # a loaded model's directory:
        model_dir(model_path)  # where the adapter goes and the tokenizer comes from
    if isinstance(data, (str, Path)):
        check_path(data, "{data}", OptionError, "give a data directory")
    if isinstance(model, (str, Path)) and out is None and distributed is None:
        raise ValueError("train(MODEL_DIR, ...) without out= would lose the adapter (the model it loads "
                         "is not returned): give out=NAME or DIR, or a loaded model")


def train(model, data, *, mode: str = "lossless", out: str | Path | None = None, gamma: int = 4,
          msa_layers: int | None = None, rank: int = 8, iters: int | None = None,
          epochs: float | None = None, batch_size: int = 8, lr: float = TrainConfig.lr,
          fine_tune_lr: float | None = None, max_seq_len: int | None = None,
          length_policy: str = "truncate", chat_template: bool = False, system_prompt: str | None = None,
          self_distill: bool | None = None, distill_tokens: int = TrainConfig.distill_tokens,
          resume: bool = False, overwrite: bool = False, seed: int = 0, alphas=None,
          prune_weight: float = 1.0, segment_len: int | None = 32, group_by_length: bool = True,
          warmup: int | None = None,
          weight_decay: float = 0.0, grad_clip: float | None = None, val_every: int = 100,
          val_batches: int | None = 25, save_every: int = 100, keep_checkpoints: int = 2,
          stream_init_rank: int = 0, prune_rank: int = 8, lora_alpha: float = 16.0,
          accept_prompts: int = 8, accept_tokens: int = 48, state_cache_mb: int = 1024,
          branch: int = AdapterConfig.branch, tree_budget: int = AdapterConfig.tree_budget,
          over: str | Path | None = None, init: str | Path | None = None, tokenizer=None,
          model_path: str | Path | None = None, progress: bool = True,
          processes: int | None = 1, distributed=None, callback=None, log=None, **unknown) -> dict:
    """Train a speculative adapter and return a report (also saved as ``training_report.json``).

    ``model``: a model directory (loaded with its tokenizer) or a loaded model (``tokenizer``
    and ``model_path`` optional), whose adapter the new one replaces (a run that fails before its
    first step leaves the one it had; an interrupted run, the one trained so far). ``data``: a
    directory with ``train.jsonl`` and optionally ``valid.jsonl`` (see :mod:`mlx_specstream.data`),
    the rows such a file holds as a list of dicts (read as the file is), a
    :class:`~mlx_specstream.data.Dataset` (used as it was encoded: ``chat_template`` and
    ``system_prompt`` read rows only), or a ``(train, valid)`` pair of them. ``out``: a bare name,
    a string (saved under ``MODEL/adapters/NAME``, where ``generate --adapter NAME`` finds it), a
    directory, or None (train in memory only). ``iters`` optimizer steps, or ``epochs`` passes
    over the data (by default :func:`default_iters`). ``alphas``: ``[alpha_0, alpha_1..alpha_gamma]`` (or two
    numbers: alpha_0 and one alpha for every stream); defaults: lossless ``[0, 1, ...]``, shared
    ``[1, 0.1, ...]``.
    ``chat_template``: text prompts become a user turn of the model's chat template, after a system
    turn of ``system_prompt`` where one is given (as ``generate --system-prompt`` sends it).
    ``self_distill`` (lossless only; the default there): the streams learn the base model's own
    greedy continuations of the prompts (what verification accepts) instead of the completions
    as given; ``distill_tokens`` for a prompt given without a completion.
    Options that ``mode`` does not use are ignored (:func:`check_used` refuses them, as the
    command line does), though a value no mode could take is still refused; ``over``,
    ``fine_tune_lr`` and ``self_distill``, which change what a run trains, are refused where the
    mode has no use for them.
    ``over``: a ``lora``-mode adapter of this model (name or path), a next-token fine-tune. In
    lossless mode, the fine-tune whose output the new adapter keeps exactly: its streams learn to
    draft the fine-tuned model, and the adapter carries the fine-tune, frozen (a *tuned* adapter:
    the quality of a next-token fine-tune, decoded losslessly with streams). In shared mode, where
    the joint training starts (a *split* shared adapter): the fine-tune's every-row LoRA trains on
    with the streams, which get stream-only LoRA of rank ``rank`` in the MSA layers of their own.
    ``init``: an adapter (name or path) of the same mode and shape whose weights the run starts
    from, to train a shipped or finished adapter further (a fresh optimizer and schedule;
    ``resume`` continues an interrupted run instead), also one made for an earlier version of this
    base (a warm start after the base was trained further; the new adapter records this base).
    With ``over``, only its streams (and their own LoRA): the every-row LoRA is ``over``'s.
    ``fine_tune_lr`` (shared mode): the every-row LoRA's peak learning rate where it should move
    more slowly than the streams (``lr``), as when it starts from a gentler fine-tune (``over``).
    ``segment_len``: completion positions whose streams are built at once (lossless; 0 or None: all).
    ``val_batches``: validation batches per evaluation (0 or None: all). A checkpoint every
    ``save_every`` steps (0: at the end only) under ``OUT.train/checkpoints``, of which the last
    ``keep_checkpoints`` stay (0: all).
    ``branch``, ``tree_budget``: the decoding defaults saved with the adapter (candidates per
    stream, nodes per tree; decoding may override them), also those the acceptance is measured with.
    ``group_by_length``: batch examples of similar length together, by completion (lossless) or
    prompt (shared, lora), then total length (shuffled within pools of 16 batches).
    ``resume``: continue from the last checkpoint of the same ``out``. ``callback(step, info)``
    is called after every step (``info``: its loss, learning rate and tokens per second); returning
    False ends the run there, as a run of that many steps (validated, saved and reported as one;
    ``resume=True`` with more ``iters`` goes on). ``processes``: train data-parallel in that many
    processes on this machine (the cores shared out between them; ``model`` a directory; None:
    :func:`default_processes`, the command line's default). They are started with ``spawn`` and
    run this package's code only, not the calling script (which needs no ``__main__`` guard).
    Under ``mlx.launch`` the global batch is shared out between its processes
    (``distributed=False`` turns that off; ``distributed`` may also be an ``mx.distributed``
    group).
    """
    arguments = dict(locals())
    del arguments["unknown"]
    check_keywords("train", unknown, arguments, MLX_LM_NAMES)
    from tqdm import tqdm

    say = log or (lambda msg: tqdm.write(msg, file=sys.stderr))
    _check_arguments(**arguments)
    self_distill = mode == "lossless" if self_distill is None else self_distill
    if mode == "lora":  # the next-token LoRA baseline: shared-mode LoRA, no streams
        gamma = 0
    val_batches = val_batches or None  # 0: all, as the command line's --val-batches 0
    segment_len = segment_len or None  # 0 and None both mean all at once; one spelling in the config
    if processes is None:
        processes = default_processes(model, tokenizer, batch_size, distributed)
    if processes > 1:
        return _train_local(processes, arguments)
    if isinstance(model, (str, Path)):
        from .api import load

        model_path = Path(model)
        model, tok = load(model_path)
        tokenizer = tokenizer if tokenizer is not None else tok
    model_path = Path(model_path) if model_path is not None else getattr(model, "path", None)
    if tokenizer is None and model_path is not None:  # a model from load(): its own tokenizer (EOS)
        from .tokenizer import load_tokenizer

        tokenizer = load_tokenizer(model_path)
    max_seq_len, msa_layers = fit_max_seq_len(model, max_seq_len), fit_msa_layers(model, msa_layers)
    group = _group(distributed)
    rank_id, world = (group.rank(), group.size()) if group is not None else (0, 1)
    main_proc = rank_id == 0
    if not main_proc:
        say = (lambda msg: None)  # noqa: E731
    out_dir, name, bare = _resolve_out(out, model_path)
    alphas = _resolve_alphas(alphas, mode, gamma)
    if fine_tune_lr is not None and mode != "shared":
        raise OptionError(f"{{fine_tune_lr}}: only shared mode trains an every-row LoRA beside its streams "
                          f"(this is {mode} mode: use {{lr}})")

    check_swappable(model)  # before any notice: nothing else would be said of the run
    if not on_gpu() and any(isinstance(m, nn.QuantizedLinear) for _, m in model.named_modules()):
        say("the base is quantized, and on a CPU MLX's quantized products are many times slower than "
            "float ones: an adapter trained on the float base is faster to train and works on its "
            "quantized copies (docs/training.md)")

    # a bad setting is refused before any work, and before the attached adapter goes
    AdapterConfig(mode=mode, gamma=gamma, msa_layers=msa_layers, rank=rank, prune_rank=prune_rank,
                  branch=branch, tree_budget=tree_budget).fit(len(model.layers))
    init_cfg = read_config(resolve_adapter(model_path, init)) if init is not None else None
    if init_cfg is not None and init_cfg.mode != mode:  # same shapes need not be the same adapter
        raise ValueError(f"adapter '{init}' was trained in {init_cfg.mode} mode: a run that starts from "
                         f"its weights trains in that mode too, not in {mode} mode")
    if over is not None:
        check_fine_tune(read_config(resolve_adapter(model_path, over)))

    # -- where things go, and what was there before ----------------------------------------
    work = run_dir(out_dir) if out_dir is not None else None
    ckpt_dir = work / "checkpoints" if work is not None else None
    if out_dir is not None and main_proc:  # before anything is written there
        check_run_free(work)  # first: what a run under way holds is not an earlier run's
        _check_out(out_dir, resume, overwrite, bare)
        if overwrite and not resume:  # what the run starts from is not among what it clears
            for option, given in (("init", init), ("over", over)):
                if given is not None and resolve_adapter(model_path, given).resolve().is_relative_to(
                        work.resolve()):
                    raise OptionError(f"{{{option}}} {verbatim(str(given))} is in the folder of the run "
                                      f"that {{overwrite}} clears ({verbatim(str(work))}): copy it out of "
                                      "there first")
    with run_held(work if main_proc else None):  # one run writes an adapter at a time
        if out_dir is not None and main_proc:  # again, held: another run may have ended meanwhile
            _check_out(out_dir, resume, overwrite, bare)
        barrier(group)  # every process waits for the checks above

        # -- data -------------------------------------------------------------------------------
        train_ds, valid_ds, digests = _run_data(data, tokenizer, model.config.get("vocab_size"), say=say,
                                                max_seq_len=max_seq_len, length_policy=length_policy,
                                                chat_template=chat_template, system_prompt=system_prompt,
                                                self_distill=self_distill, seed=seed,
                                                progress=progress and main_proc)

        # until training starts, a failure (a bad --over or --init, Ctrl-C while self-distilling)
        # leaves the model with the adapter it had; after that, with the one trained so far
        with kept_on_failure(model):
            detach(model)
            base_fp = fingerprint(model)
            tune_cfg, fine_tune = (read_fine_tune(model, over, model_path) if over is not None
                                   else (None, None))
            start_weights = None
            if init is not None:
                if not made_for(model, init_cfg):
                    say(Said(": made for another base model; its weights are only where this run starts "
                             "({init})", subject=str(init)))
                start_weights = read_adapter(model, init, model_path, check_base=False)[1]
            n_train = len(train_ds)
            steps_per_epoch = math.ceil(n_train / batch_size)
            last = last_state(ckpt_dir) if resume and ckpt_dir is not None else None
            resumed = last[1] if last is not None else None
            if resumed is not None and iters is None and epochs is None:
                iters = int(resumed["iters"])  # the run's own length: the schedule ends where it would have
            if resumed is not None and warmup is None:
                warmup = resumed["config"].get("warmup")
            length = "the %d steps of {epochs}" if epochs is not None else "{iters=%d}"  # as it was given
            if iters is None:
                iters = (max(1, math.ceil(epochs * steps_per_epoch)) if epochs is not None
                         else default_iters(n_train, batch_size))
            # the schedule (a function of the seed and the lengths as given) fixes which examples the run
            # visits: only those are self-distilled
            lengths = length_keys(train_ds, mode)
            epochs_seen: dict[int, list[list[int]]] = {}

            def global_batch(step: int) -> list[int]:
                epoch, k = divmod(step, steps_per_epoch)
                if epoch not in epochs_seen:
                    epochs_seen.clear()
                    epochs_seen[epoch] = epoch_batches(n_train, batch_size, seed, epoch,
                                                       lengths if group_by_length else None)
                return epochs_seen[epoch][k]

            tc = TrainConfig(mode=mode, gamma=gamma, msa_layers=msa_layers, rank=rank, lora_alpha=lora_alpha,
                             stream_init_rank=stream_init_rank, prune_rank=prune_rank, iters=iters,
                             batch_size=batch_size, lr=lr, fine_tune_lr=fine_tune_lr,
                             warmup=warmup if warmup is not None else min(100, iters // 20),
                             weight_decay=weight_decay, grad_clip=grad_clip, max_seq_len=max_seq_len,
                             length_policy=length_policy, chat_template=chat_template,
                             system_prompt=system_prompt, self_distill=self_distill,
                             distill_tokens=distill_tokens, seed=seed, alphas=alphas,
                             prune_weight=prune_weight, segment_len=segment_len,
                             group_by_length=group_by_length, val_every=val_every,
                             val_batches=val_batches, save_every=save_every, accept_prompts=accept_prompts,
                             accept_tokens=accept_tokens, state_cache_mb=state_cache_mb, branch=branch,
                             tree_budget=tree_budget, over=str(over) if over is not None else None,
                             init=str(init) if init is not None else None)

            # what a resumed run must share with its checkpoint (NOT_COMPARED, RECORDED_ONLY); --over by
            # what it holds (a name and a path to one adapter are the same); --init is not compared: a
            # resumed run's weights are the checkpoint's (its --init may be its own --out)
            compat = {k: v for k, v in asdict(tc).items() if k not in NOT_COMPARED}
            compat.update(digests, over_weights=weights_digest(fine_tune) if fine_tune else None)
            # each process read these itself: under mlx.launch, maybe from another disk
            check_same(group, "the run (its settings, data, base model and the checkpoint it resumes)",
                       {"resumes": last[1].get("step") if last is not None else None, "base": base_fp,
                        **compat})
            if resumed is not None:  # refused before the work below (self-distillation: minutes)
                check_resumable(*last, base_fp, compat, iters, length)

            # -- adapter, optimizer, resume --------------------------------------------------------------
            acfg = AdapterConfig(mode=mode, gamma=gamma, msa_layers=msa_layers, rank=rank,
                                 lora_alpha=lora_alpha, stream_init_rank=stream_init_rank,
                                 prune_rank=prune_rank, name=name, branch=branch, tree_budget=tree_budget,
                                 main_rank=tune_cfg.rank if tune_cfg else 0,
                                 main_alpha=tune_cfg.lora_alpha if tune_cfg else AdapterConfig.main_alpha)
            attach(model, acfg, seed=seed, fine_tune=fine_tune)
            if start_weights is not None:
                # over a fine-tune the every-row LoRA is --over's (carried by a tuned adapter, the start of
                # a split shared one's), whatever the adapter started from had: init gives the streams
                carried = fine_tune_keys(model) if fine_tune else set()
                start_weights = {k: v for k, v in start_weights.items() if k not in carried}
                fresh = {k: v for k, v in adapter_weights(model).items() if k not in carried}
                if {k: v.shape for k, v in start_weights.items()} != {k: v.shape for k, v in fresh.items()}:
                    theirs = ", ".join(f"{k} {getattr(init_cfg, k)}"
                                       for k in ("mode", "gamma", "msa_layers", "rank"))
                    over_one = "a" if init_cfg.main_rank else "no"
                    raise ValueError(f"adapter '{init}' has another shape than this run's: it was trained "
                                     f"with {theirs} (and over {over_one} fine-tune); give those settings")
                model.load_weights(list(start_weights.items()), strict=False)
            # an earlier run's checkpoints go only now, once the data, --init and --over have been read;
            # whole (a Ctrl-C meanwhile acts after it): half of a run would be a folder no run can use
            if work is not None and main_proc and work.exists() and overwrite and not resume:
                with signals_held():
                    clear_run(work)
            barrier(group)
            if self_distill:
                # the model as attached writes them: the base, or the base with its fine-tune
                key = {"base": base_fp, "max_seq_len": max_seq_len, "distill_tokens": distill_tokens,
                       **({"fine_tune": weights_digest(fine_tune)} if fine_tune else {})}
                used = {"train": sorted({i for step in range(iters) for i in global_batch(step)}),
                        "valid": list(range(min(len(valid_ds), (val_batches or len(valid_ds)) * batch_size)))
                        if valid_ds is not None else []}
                train_ds, valid_ds = (
                    _self_distilled(model, tokenizer, split, ds, used[split], key=key, work=work, group=group,
                                    max_seq_len=max_seq_len, distill_tokens=distill_tokens, progress=progress,
                                    say=say) for split, ds in (("train", train_ds), ("valid", valid_ds)))
            n_params = set_trainable(model)
            optimizer = make_optimizer(tc, fine_tune_keys(model))  # fine_tune_lr: shared mode only
            optimizer.init(model.trainable_parameters())
            limit = model.max_positions or 1 << 30
            accept_set = [e.prompt for e in (valid_ds.examples if valid_ds is not None else [])
                          if len(e.prompt) + accept_tokens < limit][:accept_prompts] if gamma else []
            run = Run(model=model, optimizer=optimizer, tc=tc, train_ds=train_ds, valid_ds=valid_ds,
                      batch=global_batch, compat=compat, base_fp=base_fp, group=group, say=say,
                      ckpt_dir=ckpt_dir, keep_checkpoints=keep_checkpoints, eos=eos_ids(tokenizer),
                      accept_set=accept_set)
            resumable = resume and ckpt_dir is not None
            loaded = load_last_checkpoint(model, optimizer, ckpt_dir, say) if resumable else None
            # (one that does not read here is passed over: so might another process's be)
            check_same(group, "the checkpoint resumed", loaded[0].name if loaded is not None else None)
            if loaded is not None:
                run.restore(*loaded)
                saved = _finished_report(out_dir, iters, ckpt_dir) if run.start == iters else None
                if saved is not None:
                    say(Said(f": the run is already complete (step {iters} of {iters}); nothing to do (a "
                             "larger {iters} trains it further)", subject=str(out_dir)))
                    load_adapter(model, out_dir)  # the model holds what the run saved (its best)
                    return Report({**saved, "process_rank": rank_id})
                say(f"resuming from {loaded[0]} (step {run.start} of {iters})")
            elif resumable:
                say(f"no checkpoint in {ckpt_dir}: starting from step 0, with the settings given now (a run "
                    "records its own with its first checkpoint)")

        if main_proc and run.start < iters:  # what the run will do, once
            say(plan_line(run, n_params, steps_per_epoch, progress))
        seconds, tokens_seen, val_seconds = train_steps(run, progress=progress and main_proc,
                                                        callback=callback)
        final_eval, kept = final_evaluation(run)
        chat_prompts = bool(chat_template) or 0 < len(train_ds) <= 2 * sum(e.chat for e in train_ds.examples)
        report = {
            "adapter": str(out_dir) if out_dir is not None else None,
            "name": name,
            "mode": mode,
            "iters": tc.iters,
            "start_step": run.start,
            "epochs": round(tc.iters / steps_per_epoch, 4),  # passes over the data (the last may be partial)
            "world_size": world,
            "process_rank": rank_id,  # this process's, among world_size (the LoRA rank: config.rank)
            "trainable_parameters": int(n_params),
            "base_fingerprint": base_fp,
            "config": asdict(tc),
            # the prompts the adapter learnt after: in the chat template (asked, or most were conversations)
            "chat_prompts": chat_prompts,
            "data": {"train": train_ds.summary(),
                     "valid": valid_ds.summary() if valid_ds is not None else None,
                     "notes": train_ds.notes + (valid_ds.notes if valid_ds is not None else [])},
            "train": {
                "first_loss": run.history[0]["loss"] if run.history else None,
                "last_loss": run.history[-1]["loss"] if run.history else None,
                "seconds": round(run.seconds + seconds, 3),
                "tokens_per_second": round(tokens_seen / (seconds - val_seconds), 1)
                if seconds > val_seconds and tokens_seen else None,
                "peak_memory_mb": round(mx.get_peak_memory() / 2**20, 2),
            },
            "valid": final_eval,
            "best": ({k: v for k, v in run.best.items() if k != "weights"}
                     if run.best["step"] is not None else None),
            "kept_step": kept,  # the adapter saved: best's, or the last step's
            "history": run.history,
            "val_history": run.val_history,
            "checkpoints": str(ckpt_dir) if ckpt_dir is not None else None,
            "command": cli_command(),
        }
        model.eval()
        if mode != "lora" and main_proc:  # drafts from the data beside the streams' (the lookup chain's lead)
            # in memory too: save_adapter writes them
            model.adapter_ngrams = ngram_table(train_ds, run.eos)
        base = recorded_path(model_path) if model_path is not None else None  # where it was trained
        # the run's record, in memory too: save_adapter writes it
        # and the prompts it learnt after, which generate takes from it (adapter.trained_config)
        model.adapter_config.training = {"iters": tc.iters, "step": kept, "mode": mode,
                                         "self_distill": self_distill, "over": tc.over, "init": tc.init,
                                         "base_model": base, **{k: getattr(tc, k) for k in PROMPT_SETTINGS},
                                         "chat_prompts": chat_prompts}
        if out_dir is not None and main_proc:
            with signals_held():  # Ctrl-C or SIGTERM acts once the adapter has its report
                try:  # an adapter put there during the run by someone else is not replaced unasked
                    save_adapter(model, out_dir, overwrite=overwrite or resume)
                except OutputExistsError:
                    raise OutputExistsError(
                        ": appeared during the run and is not replaced: move it away and run the same "
                        "command with {resume=True} to save the adapter trained (its checkpoints are in "
                        f"{verbatim(str(ckpt_dir))})", subject=str(out_dir)) from None
                write_text_atomic(out_dir / REPORT_FILE, json_text(report))
            # (lora: no streams)
            use = f"--adapter {shlex.quote(name)}" + (" --mode ar" if mode == "lora" else "") + (
                " --chat-template" if chat_prompts else "") + (
                f" --system-prompt {shlex.quote(system_prompt)}" if chat_template and system_prompt else "")
            if model_path is not None and Path(model_path).resolve() != DEFAULT_MODEL.resolve():
                use = f"--model {shlex.quote(str(model_path))} {use}"  # as given: found under its adapters/
            say(f"saved adapter {out_dir}" + (f" (generate with {use})" if bare else ""))
        return Report(report)


class Report(dict):
    """The run's report (``training_report.json``'s contents), a dict, shown in a notebook as its
    outline: its loss and validation histories hold one entry per step and evaluation."""

    def __repr__(self) -> str:
        best, valid = self.get("best") or {}, self.get("valid") or {}
        said = [f"adapter={self.get('adapter')!r}", f"mode={self.get('mode')!r}",
                f"iters={self.get('iters')}", f"kept_step={self.get('kept_step')}"]
        if "mean_accepted_tokens" in best:
            said.append(f"best=step {best.get('step')}: {best['mean_accepted_tokens']:.2f} tokens per pass")
        if "loss" in valid:
            said.append(f"valid loss={valid['loss']:.4f}")
        return f"Report({', '.join(said)}; keys: {', '.join(self)})"


def ngram_table(dataset: Dataset, eos_ids: set[int] = frozenset()) -> NgramTable:
    """The n-gram drafts of a training set's completions (:mod:`~mlx_specstream.ngrams`). Examples
    whose one target is EOS (``eos_ids``) are left out: a prompt given alone would teach the table
    to draft EOS after whatever prompts end with."""
    return NgramTable.build((e.tokens, e.n_prompt) for e in dataset.examples
                            if not (e.n_targets == 1 and e.tokens[-1] in eos_ids))


def write_ngrams(model_path: str | Path, adapter: str | Path, data: str | Path, *,
                 max_seq_len: int | None = None, chat_template: bool | None = None,
                 system_prompt: str | None = None, overwrite: bool = False, say=None) -> tuple[Path, int]:
    """Give an adapter the n-gram drafts of ``data``'s train split (``train`` writes them for the
    adapters it trains): ``ADAPTER/ngrams.npz``, written atomically; an existing one is replaced
    only with ``overwrite``, and never by an empty table. Returns its path and its number of
    contexts. The adapter must have been made for the model (its drafts are in the model's tokens).
    ``max_seq_len``, ``chat_template`` and ``system_prompt`` left None are the adapter's training
    run's where its report records them (said), so the prompts are read as it read them.
    What reading the data cut or skipped is said (``say``; default: on stderr), as ``train`` says it."""
    from .loader import load_model

    say = say or (lambda msg: print(msg, file=sys.stderr))
    from .tokenizer import load_tokenizer

    check_switch("chat_template", chat_template, optional=True)
    check_system_prompt(system_prompt, chat_template is not False)
    path = resolve_adapter(model_path, adapter)
    cfg = read_config(path)
    if cfg.mode == "lora":
        raise AdapterError(f"adapter '{path.name}' has no streams (mode lora): its decoding drafts nothing")
    model = load_model(model_path)
    check_made_for(model, path, cfg)
    taken = _trained_settings(path, model.max_positions, max_seq_len=max_seq_len, chat_template=chat_template,
                              system_prompt=system_prompt)
    if taken:
        say(Said("as the adapter was trained: " + " ".join(setting_said(k, v) for k, v in taken.items())))
    max_seq_len = fit_max_seq_len(model, taken.get("max_seq_len", max_seq_len))
    chat_template = taken.get("chat_template", bool(chat_template))
    system_prompt = taken.get("system_prompt", system_prompt)
    check_system_prompt(system_prompt, chat_template)
    dest = path / NGRAMS_FILE
    data_directory(data)  # a missing one is said first: --overwrite would not help
    check_replaceable_file(dest, overwrite, lambda _: True)  # the adapter's own file: ours
    check_writable(path, "the n-gram table")  # before the data is read, not after
    tokenizer = load_tokenizer(Path(model_path))
    vocab_size = model.config.get("vocab_size")  # the loaded model's, not its file read again
    train_ds, _ = load_datasets(data, tokenizer, valid=False, say=say, max_seq_len=max_seq_len,
                                chat_template=chat_template, system=system_prompt, vocab_size=vocab_size)
    for note in train_ds.notes:
        say(note)
    table = ngram_table(train_ds, eos_ids(tokenizer))
    if not table.next:
        raise ValueError(f"{data}: no n-gram occurs often enough in its completions to draft "
                         "anything: nothing written")
    table.save(dest)
    return dest, len(table.next)


# -- peak memory against sequence length and gamma --------------------------------------------

def measure_peak_memory(model, *, seq_len: int, gamma: int, batch_size: int = 4,
                        prompt_len: int | None = None, segment_len: int | None = None,
                        mode: str = "lossless", msa_layers: int = 2, seed: int = 0) -> int:
    """Peak bytes of one training step on random tokens (the base's weights included).

    ``prompt_len`` tokens carry no streams (default: half the sequence); ``prompt_len=1`` with
    ``segment_len=None`` is the naive layout with streams on every token.
    """
    rng = np.random.default_rng(seed)
    V = model.config["vocab_size"]
    p = prompt_len if prompt_len is not None else seq_len // 2
    examples = [Example(rng.integers(0, V, seq_len).tolist(), p) for _ in range(batch_size)]
    attach(model, AdapterConfig(mode=mode, gamma=gamma, msa_layers=msa_layers), seed=seed)
    set_trainable(model)
    alphas = _resolve_alphas(None, mode, gamma)
    tc = TrainConfig(mode=mode, gamma=gamma, msa_layers=msa_layers, alphas=alphas,
                     segment_len=segment_len)
    batch = Batch.of(examples)
    mx.clear_cache()
    mx.reset_peak_memory()
    loss, grads = grad_step(model, batch, tc, batch.counts(gamma))
    mx.eval(loss, grads)
    return mx.get_peak_memory()
