"""Training checkpoints: the adapter's weights, the optimizer's state and the run's state at a
step (and the best adapter so far), each in ``OUT.train/checkpoints/step-NNNNNNN``, written
whole (a temporary directory, then a rename) so an interrupted run resumes from the last one.
With its adapter config beside the weights, a checkpoint also loads as an adapter, to try a long
run before it ends. A checkpoint records the run's settings and digests of its data and of the
fine-tune under it, so that a resumed run that differs is refused, each difference said as its
option says it (:func:`check_same_run`)."""

from __future__ import annotations

import errno
import fcntl
import fnmatch
import hashlib
import json
import os
import re
import shutil
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from .adapter import CONFIG_FILE, WEIGHTS_FILE, adapter_weights
from .data import Dataset
from .errors import OptionError, OutputExistsError, verbatim
from .outputs import CHECKPOINT_NAMES, json_text, save_safetensors


def _set_path(tree, path: list[str], value) -> None:
    for k in path[:-1]:
        tree = tree[int(k)] if isinstance(tree, list) else tree[k]
    last = path[-1]
    if isinstance(tree, list):
        tree[int(last)] = value
    else:
        tree[last] = value


def run_dir(out_dir: Path) -> Path:
    """Where the run that writes the adapter ``out_dir`` keeps its checkpoints (``checkpoints/``)
    and the data it made (``distilled/``): ``OUT.train`` beside it."""
    return out_dir.with_name(out_dir.name + ".train")


def checkpoint_name(step: int) -> str:
    return f"step-{step:07d}"


RUN_LOCK = "lock"  # in a run's folder: held (flock) by the process whose run writes the adapter
HELD = frozenset({errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES})  # flock's errors for "held by another"


@contextmanager
def run_held(work: Path | None) -> Iterator[None]:
    """While the block runs, the training run at ``work`` (:func:`run_dir`) is this process's: a
    second run that would write the same adapter is refused at its start (an
    :class:`OutputExistsError`), not found out when one replaces the other's adapter and
    checkpoints. The lock is the OS's (``flock``), so a run that dies lets go of it; its file
    stays in the folder, which goes where it holds nothing else. None: no run to hold. Where the
    file system has no locks (some network mounts), the run goes on unheld, with a warning."""
    if work is None:
        yield
        return
    made = [d for d in (work, *work.parents) if not d.exists()]  # (a refused run leaves none of them)
    work.mkdir(parents=True, exist_ok=True)
    fd = _lock(work)
    try:
        yield
    finally:
        try:
            if [e.name for e in work.iterdir()] == [RUN_LOCK]:  # the run wrote nothing: no folder left
                (work / RUN_LOCK).unlink()
                for d in made:
                    if any(d.iterdir()):
                        break
                    d.rmdir()
        except OSError:  # the folder moved or changed meanwhile: left as it is
            pass
        finally:
            if fd is not None:
                os.close(fd)


def _lock(work: Path) -> int | None:
    """The descriptor of ``work``'s lock file, locked (None: the file system cannot lock); an
    :class:`OutputExistsError` naming the process that holds it. A file its holder removed as it
    ended (:func:`run_held`) while this one opened it is opened again: a lock on it keeps no one out."""
    path = work / RUN_LOCK
    for _ in range(8):
        try:  # a link by that name is not followed (it would be written through), a folder not taken
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as e:
            if e.errno not in (errno.ELOOP, errno.EISDIR):
                raise
            raise OutputExistsError(": not the lock file of a training run: refusing to use its folder; "
                                    "choose another {out}", subject=str(path)) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = _holder(fd)
            os.close(fd)
            if e.errno in HELD:
                _refuse(work, holder)
            warnings.warn(f"{work}: this file system does not lock files ({e.strerror}): nothing keeps "
                          "another run from writing the same adapter meanwhile", stacklevel=3)
            return None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            os.ftruncate(fd, 0)
            os.write(fd, str(os.getpid()).encode())
            return fd
        os.close(fd)
    _refuse(work, "?")


def _holder(fd: int) -> str:
    """The process a held lock file names (its pid, as :func:`_lock` writes it), or "?"."""
    return os.read(fd, 32).decode(errors="replace").strip() or "?"


def _refuse(work: Path, holder: str):
    """The refusal of a run whose adapter process ``holder`` is writing."""
    said = f": another training run (process {holder}) is writing this adapter: wait for it to end, "
    raise OutputExistsError(said + "or give another {out}", subject=str(work.with_suffix(""))) from None


def check_run_free(work: Path) -> None:
    """Refuse (as :func:`run_held` would) where another process holds the run at ``work``: before
    what the folder holds is read, which a run under way changes (its checkpoints are not an
    earlier run's to resume)."""
    path = work / RUN_LOCK
    if work.is_symlink() or path.is_symlink() or not path.is_file():
        return
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in HELD:
            _refuse(work, _holder(fd))
    finally:
        os.close(fd)


def clear_run(work: Path) -> None:
    """An earlier run's folder emptied for a new run, whose lock (:func:`run_held`) stays."""
    for entry in work.iterdir():
        if entry.name == RUN_LOCK:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def checkpoints(ckpt_dir: Path) -> list[Path]:
    """The checkpoints in ``ckpt_dir``, by step: folders named as :func:`save_checkpoint` names them
    (:data:`CHECKPOINT_NAMES`), whole (their ``state.json`` is written last)."""
    if not ckpt_dir.is_dir():
        return []
    found = [p for p in ckpt_dir.iterdir() if not p.is_symlink() and (p / "state.json").is_file()
             and any(fnmatch.fnmatchcase(p.name, pat) for pat in CHECKPOINT_NAMES)]
    return sorted(found, key=lambda p: int(p.name.split("-")[1]))


BEST_FILE = "best.safetensors"


def save_checkpoint(model, optimizer, ckpt_dir: Path, step: int, state: dict, keep: int = 2,
                    best: dict[str, mx.array] | None = None) -> Path:
    """Adapter weights, optimizer state and the run's state at ``step`` (and the best adapter so
    far, by acceptance), written atomically."""
    from .loader import atomic_dir

    dest = ckpt_dir / checkpoint_name(step)
    with atomic_dir(dest, "checkpoint", overwrite=True) as tmp:
        save_safetensors(tmp / WEIGHTS_FILE, adapter_weights(model))
        # its config beside them: a checkpoint is an adapter too (generate --adapter .../step-N)
        (tmp / CONFIG_FILE).write_text(json.dumps(asdict(model.adapter_config), indent=2))
        flat = dict(tree_flatten(optimizer.state))
        save_safetensors(tmp / "optimizer.safetensors", flat)
        (tmp / "state.json").write_text(json_text({**state, "step": step}))
        if best is not None:
            save_safetensors(tmp / BEST_FILE, best)
    for old in checkpoints(ckpt_dir)[:-keep] if keep else []:
        shutil.rmtree(old, ignore_errors=True)
    return dest


class CheckpointError(ValueError):
    """A checkpoint that cannot be read (damaged or incomplete: written whole, it was changed
    after), in one line."""


def load_checkpoint(model, optimizer, path: Path) -> dict:
    try:
        state = json.loads((path / "state.json").read_text())
        weights = mx.load(str(path / WEIGHTS_FILE))
        saved = mx.load(str(path / "optimizer.safetensors"))
    except (OSError, ValueError, RuntimeError) as e:  # MLX: RuntimeError for a truncated file
        raise CheckpointError(f"{path}: unreadable checkpoint ({str(e).splitlines()[0]})") from None
    current = adapter_weights(model)
    if set(weights) != set(current) or any(weights[k].shape != current[k].shape for k in weights):
        raise ValueError(f"{path}: checkpoint does not match this adapter's configuration")
    model.load_weights(list(weights.items()), strict=False)
    optimizer.init(model.trainable_parameters())
    have = dict(tree_flatten(optimizer.state))
    if set(saved) != set(have):
        raise ValueError(f"{path}: optimizer state does not match this adapter")
    for k, v in saved.items():
        _set_path(optimizer.state, k.split("."), v)
    mx.eval(model.parameters(), optimizer.state)
    return state


def load_last_checkpoint(model, optimizer, ckpt_dir: Path, say) -> tuple[Path, dict] | None:
    """Load the last checkpoint of ``ckpt_dir`` that reads into ``model`` and ``optimizer``: a
    damaged one (by the disk, by a hand) is passed over for the one kept before it, said through
    ``say``. Returns its path and state; None where there is no checkpoint."""
    found = checkpoints(ckpt_dir)
    for path in reversed(found):
        try:
            return path, load_checkpoint(model, optimizer, path)
        except CheckpointError as e:
            say(f"{e}; trying the checkpoint before it" if path != found[0] else str(e))
    if found:
        raise OptionError(": no readable checkpoint to resume from: start again with {overwrite=True} "
                          "without {resume=True}", subject=str(ckpt_dir))
    return None


def weights_digest(weights: dict[str, mx.array]) -> str:
    """A digest of an adapter's weights (the fine-tune a run starts over): recorded in checkpoints,
    and part of the key of the self-distilled data kept for the run."""
    h = hashlib.sha256()
    for k in sorted(weights):
        h.update(k.encode() + np.array(weights[k].astype(mx.float32)).tobytes())
    return h.hexdigest()[:16]


def last_state(ckpt_dir: Path) -> tuple[Path, dict] | None:
    """The last checkpoint whose state.json reads, and its recorded state (None without one)."""
    for path in reversed(checkpoints(ckpt_dir)):
        try:
            return path, json.loads((path / "state.json").read_text())
        except (OSError, ValueError):
            continue
    return None


def check_same_run(path: Path, recorded: dict, compat: dict, recorded_only: tuple[str, ...]) -> None:
    """An OptionError naming each setting in which a resumed run differs from its checkpoint's
    (``recorded_only``: compared only where the checkpoint recorded them)."""
    diff = {k: (recorded.get(k), v) for k, v in compat.items()
            if recorded.get(k, v if k in recorded_only else None) != v}
    if diff:
        def now_said(k, then, now):  # a value alone where both read alone: "--batch-size 4 (now 8)"
            return str(said_value(k, now)) if _plain(k, then) and _plain(k, now) else setting_said(k, now)

        said = [_RUN_DIGESTS.get(k) or f"{setting_said(k, then)} (now {now_said(k, then, now)})"
                for k, (then, now) in diff.items()]
        raise OptionError(": the run to resume was started otherwise: " + "; ".join(said)
                          + ". Resume it as it was started, or {overwrite=True} without {resume=True} to "
                          "start again",
                          subject=str(path))


_ZERO_IS_NONE = ("segment_len", "val_batches")  # None said as the options' 0: all at once, all batches
_ON_BY_DEFAULT = ("self_distill", "group_by_length")  # switches whose False is said as their --no- form


def said_value(name: str, value: object) -> object:
    """A setting's value as its option takes it: alphas as ``1,0.1,0.1``, segment_len's None as 0."""
    if value is None and name in _ZERO_IS_NONE:
        return 0
    return ",".join(f"{a:g}" for a in value) if isinstance(value, list) else value


def setting_said(name: str, value) -> str:
    """A setting as its option says it, in :class:`~mlx_specstream.errors.SaidInOptions`' notation:
    ``{batch_size=4}``, ``{chat_template=True}``, ``without {fine_tune_lr}`` (None, False),
    ``{alphas=1,0.1,0.1}``, ``{segment_len=0}`` for its None, ``{self_distill=False}`` (a switch
    that may be on by default: ``--no-self-distill``)."""
    value = said_value(name, value)
    if value is False and name in _ON_BY_DEFAULT:
        return f"{{{name}=False}}"
    if value is None or value is False:
        return f"without {{{name}}}"
    if isinstance(value, str) and not re.fullmatch(r"[\w.,:/+-]+", value):  # free text (a system prompt)
        return f"{{{name}}} {verbatim(json.dumps(value, ensure_ascii=False))}"  # quoted, its braces its own
    return f"{{{name}={value}}}"


def _plain(name: str, value) -> bool:
    """Whether a value reads alone, as a number or a word (not a switch, None or a list)."""
    return not isinstance(said_value(name, value), bool | type(None)) and not isinstance(value, list)


# Settings a checkpoint records by digest, as a resumed run that differs in them is told
_RUN_DIGESTS = {"data": "{data} holds other training examples", "valid_data": "other validation examples",
                "over_weights": "the fine-tune under it ({over}) is another, or none"}


def examples_digest(ds: Dataset) -> str:
    """A digest of a data set's examples (tokens, prompt lengths and which are text rows, which are
    trained and measured otherwise), recorded in checkpoints."""
    h = hashlib.sha256()
    for e in ds.examples:
        h.update(np.asarray(e.tokens, np.int64).tobytes() + e.n_prompt.to_bytes(8, "little")
                 + (b"text" if e.text else b""))  # (digests of runs before text rows unchanged)
    return h.hexdigest()[:16]
