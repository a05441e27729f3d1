"""What the project writes: the one rule for replacing an output, writing it whole (a temporary
file or directory, then a rename: nothing half-written), and results files that record
the command, machine, versions and date that made them (:func:`run_meta`, :func:`parse_script_args`).

``--overwrite`` (``overwrite=True``) replaces only an output this project recognises as its own:
a directory of one of the kinds below whose every entry is a file the project writes there, or
a single results file it wrote. Anything else at the destination — a user's folder, a model
directory holding trained adapters, a file it did not write — is refused with one line, and
nothing is deleted.

Example: ``convert --mlx-path notes/ --overwrite`` where ``notes/`` holds ``notes.txt`` raises
``FileExistsError("notes: holds files mlx-specstream did not write as a model (notes.txt): ...")``;
without ``--overwrite``, any existing output is an
:class:`~mlx_specstream.errors.OutputExistsError` said in the caller's terms.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import math
import os
import shlex
import shutil
import signal
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from .errors import OutputExistsError
from .project import REPOSITORY

# Files a model directory's tokenizer may consist of (copied along by import and export).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json",
                   "added_tokens.json", "vocab.json", "merges.txt", "generation_config.json",
                   "chat_template.jinja", "chat_template.json", "vocab.txt", "additional_chat_templates")

# kind -> (the entry that marks such a directory, or None, and the names the project writes in it)
KINDS: dict[str, tuple[str | None, tuple[str, ...]]] = {
    "model": ("config.json", ("config.json", "*.safetensors", "model.safetensors.index.json",
                              *TOKENIZER_FILES)),
    "adapter": ("adapter_config.json", ("adapter_config.json", "adapter.safetensors",
                                        "training_report.json", "ngrams.npz",
                                        # write_atomic's temporary files, left by a kill
                                        ".training_report.json.tmp*", ".ngrams.npz.tmp*")),
    "training run": (None, ("checkpoints", "distilled", "lock")),
    "checkpoint": ("state.json", ("state.json", "adapter.safetensors", "adapter_config.json",
                                  "optimizer.safetensors", "best.safetensors",
                                  # `ngrams --adapter CHECKPOINT` (a checkpoint loads as an adapter)
                                  "ngrams.npz", ".ngrams.npz.tmp*")),
    "Core ML package": ("Manifest.json", ("Manifest.json", "Data")),
    "Core ML tokenizer": ("specstream.json", ("specstream.json", "ngrams.npz", *TOKENIZER_FILES)),
}


# What a file browser leaves in any folder it shows (macOS Finder): nobody's work
OS_LITTER = (".DS_Store",)
# What the project keeps in a model's folder besides the model: work that replacing it would lose
MODEL_WORK = ("adapters", "draft")

# A checkpoint's folder (step-0000042, the step in 7 digits or more): a copy under another name
# (step-0000042-keep) is the user's
CHECKPOINT_NAMES = tuple("step-" + "[0-9]" * n for n in range(7, 13))

# kind -> {subdirectory: (the names of its entries, the kind of directory each entry is or None
# for files, and the names of what an interrupted write of ours leaves there)}: what the project
# writes inside a directory of that kind, checked as deep as it goes.
NESTED: dict[str, dict[str, tuple[tuple[str, ...], str | None, tuple[str, ...]]]] = {
    "training run": {"checkpoints": (CHECKPOINT_NAMES, "checkpoint", (".step-*",)),
                     "distilled": (("train.jsonl", "valid.jsonl"), None, (".*.jsonl.tmp*",))},
}


# Metadata of the weights files of the models the project writes. A checkpoint downloaded from a
# hub, or written by mlx-lm, has the same file names (config.json, *.safetensors) but not this.
WEIGHTS_MARK = {"written_by": "mlx-specstream"}


def _weights_marked(path: Path) -> bool:
    """Whether safetensors file ``path`` carries :data:`WEIGHTS_MARK` in its header."""
    try:
        with open(path, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            if not 0 < size <= 100_000_000:
                return False
            meta = json.loads(f.read(size)).get("__metadata__") or {}
    except (OSError, ValueError, AttributeError):
        return False
    return all(meta.get(k) == v for k, v in WEIGHTS_MARK.items())


def _package_marked(path: Path) -> bool:
    """Whether Core ML package ``path`` is one ``convert --to coreml`` wrote (its metadata names
    the Speculative Streaming format): every package has a Manifest.json and Data."""
    from .convert.mil_eval import read_metadata

    try:
        return "specstream.format" in read_metadata(path)
    except Exception:  # unreadable, or coremltools missing: not shown to be ours
        return False


def _plain_file(path: Path) -> bool:
    return path.is_file() and not path.is_symlink()


def foreign_entries(path: Path, kind: str) -> list[str]:
    """Entries of directory ``path`` that the project would not have written for ``kind``
    (all of them when the marker is missing; for a model, weights without :data:`WEIGHTS_MARK`).
    Empty list: the directory is ours to replace."""
    marker, names = KINDS[kind]
    entries = sorted(p.name for p in path.iterdir())
    if marker is not None and marker not in entries:
        return entries
    if kind == "model" and not any(e.endswith(".safetensors") for e in entries):
        return entries  # no weights to carry the mark: nothing shows the project wrote it
    if kind == "Core ML package" and not _package_marked(path):
        return entries
    foreign = [e for e in entries if not any(fnmatch.fnmatchcase(e, pat) for pat in (*names, *OS_LITTER))
               or (kind == "model" and e.endswith(".safetensors") and not _weights_marked(path / e))
               # a run's lock is a file it made: a link by that name would be written through
               or (kind == "training run" and e == "lock" and not _plain_file(path / e))]
    for sub, (patterns, inner, leftovers) in NESTED.get(kind, {}).items():
        d = path / sub
        if sub in foreign or not (d.exists() or d.is_symlink()):
            continue
        if d.is_symlink() or not d.is_dir():
            foreign.append(sub)
            continue
        for e in sorted(d.iterdir()):
            ours = any(fnmatch.fnmatchcase(e.name, pat) for pat in patterns) and not e.is_symlink() and (
                e.is_file() if inner is None else e.is_dir() and not foreign_entries(e, inner)) or any(
                fnmatch.fnmatchcase(e.name, pat) for pat in leftovers)
            if not ours:
                foreign.append(f"{sub}/{e.name}")
    return foreign


def _a(kind: str) -> str:
    return ("an " if kind[0] in "aeiou" else "a ") + kind


def _exists(dest: Path) -> OutputExistsError:
    """``dest`` exists, and ``overwrite`` (in the caller's spelling) would replace it."""
    return OutputExistsError(" already exists (use {overwrite=True} to replace it)", subject=str(dest))


def check_replaceable(dest: str | Path, kind: str, overwrite: bool) -> None:
    """Raise unless ``dest`` is absent or an empty directory, or ``overwrite`` is set and ``dest``
    is a ``kind`` directory that holds only what the project writes. Call before any work starts."""
    dest = Path(dest)
    if not dest.exists() and not dest.is_symlink():
        return
    # what the flag would not help is said first
    if dest.is_symlink() or not dest.is_dir():
        raise FileExistsError(f"{dest} exists and is not {_a(kind)} directory: refusing to replace it")
    foreign = foreign_entries(dest, kind)
    if kind == "model":  # an empty adapters/ or draft/ holds nothing to lose
        empty = {e for e in MODEL_WORK if (dest / e).is_dir() and not (dest / e).is_symlink()
                 and not any((dest / e).iterdir())}
        foreign = [e for e in foreign if e not in empty]
    work = [f"{e}/" for e in foreign if e in MODEL_WORK] if kind == "model" else []
    if work and len(work) == len(foreign):  # a model of ours, but for what was made for it
        raise FileExistsError(f"{dest}: holds {' and '.join(work)} made for this model: refusing to replace "
                              "it; move them out first, or choose another path")
    if foreign:
        shown = ", ".join(foreign[:4]) + (", ..." if len(foreign) > 4 else "")
        raise FileExistsError(f"{dest}: holds files mlx-specstream did not write as {_a(kind)} "
                              f"({shown}): refusing to replace it; choose another path")
    if os.path.ismount(dest):  # not to be moved aside
        raise FileExistsError(f"{dest} is a mount point: it cannot be replaced; give a new folder inside it")
    if not overwrite and any(dest.iterdir()):  # an empty folder holds nothing to lose
        raise _exists(dest)
    if not os.access(dest, os.W_OK):  # said before the work: moving a folder aside rewrites its ".."
        raise PermissionError(f"{dest}: not writable, so it cannot be replaced (make it writable, or "
                              "choose another path)")


def copy_tokenizer(src: Path, dest: Path) -> None:
    """The tokenizer's files of directory ``src`` (:data:`TOKENIZER_FILES`, the folder of named
    chat templates too) copied into ``dest``."""
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, dest / name)
        elif (src / name).is_dir():
            shutil.copytree(src / name, dest / name)


def check_replaceable_file(dest: str | Path, overwrite: bool, ours) -> None:
    """Like :func:`check_replaceable` for one output file; ``ours(path)`` tells whether an
    existing file is one the project wrote."""
    dest = Path(dest)
    if not dest.exists():
        return
    if not dest.is_file() or not ours(dest):  # said first: the flag would not help
        raise FileExistsError(f"{dest}: not a file mlx-specstream wrote: refusing to replace it; "
                              "choose another path")
    if not overwrite:
        raise _exists(dest)


def is_results_json(path: Path) -> bool:
    """A results file of this project's: its ``meta`` (:func:`run_meta`) names the command, the
    date and the machine, as every one has since the first (not a user's JSON with a "command")."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    meta = data.get("meta") if isinstance(data, dict) else None
    return isinstance(meta, dict) and {"command", "date", "machine"} <= meta.keys()


def recorded_path(path: str | Path) -> str:
    """``path`` as a results file records it: relative to the repository when inside it, so a
    committed result names no directory of the machine that wrote it (tests/test_docs.py), else
    absolute (a path relative to where a command ran says nothing once it is read elsewhere)."""
    full = Path(path).resolve()
    return str(full.relative_to(REPOSITORY)) if full.is_relative_to(REPOSITORY) else str(full)


def recorded_command(argv: list[str]) -> str:
    """``argv`` as a results file records the command: quoted as a shell would need it; run from
    the repository's root, every absolute path (``/x/y``, ``--out=/x/y``) through
    :func:`recorded_path`, so that it runs again there. Run elsewhere it is kept as typed, and
    ``meta.cwd`` (:func:`run_meta`) says where it runs again."""
    at_root = Path.cwd().resolve() == REPOSITORY

    def arg(a: str) -> str:
        flag, eq, value = a.partition("=") if a.startswith("--") else ("", "", a)
        return flag + eq + (recorded_path(value) if at_root and os.path.isabs(value) else value)

    module = is_cli_module(argv[0])
    head = ["python", "-m", "mlx_specstream.cli"] if module else [arg(Path(argv[0]).as_posix())]
    return shlex.join([*head, *map(arg, argv[1:])])


def is_cli_module(program: str) -> bool:
    """Whether ``program`` (``sys.argv[0]``) is this package's command-line module, run as
    ``python -m mlx_specstream.cli`` (whose file path would not run again as a command)."""
    cli = Path(__file__).with_name("cli.py")
    return Path(program).name == cli.name and Path(program).resolve() == cli.resolve()


def cli_command() -> str | None:
    """This process's command as :func:`recorded_command` records it where it is
    ``specstream-mlx`` (or its module); None for a Python caller (a notebook, a script)."""
    import sys

    program = sys.argv[0] if sys.argv else ""
    ours = Path(program).name.startswith("specstream") or is_cli_module(program)
    return recorded_command(sys.argv) if ours else None


def run_meta(command: str | None = None, **extra) -> dict:
    """The ``meta`` every results file starts with: the command as typed (``command`` overrides
    it) and the directory it ran in (``.``: the repository's root), the UTC date and time, the
    machine, the device (CPU or which GPU), the source commit, and the versions and BLAS that were
    timed; ``extra`` adds what the run was (model, task, settings)."""
    import platform
    import sys
    from datetime import datetime, timezone

    import mlx.core as mx

    from .blas import blas_label
    from .device import device_label
    from .machine import cores

    return {"command": command or recorded_command(sys.argv), "cwd": recorded_path(Path.cwd()),
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": platform.platform(), "processor": cpu_name(),
            "cpus": cores(), "python": platform.python_version(), "mlx": mx.__version__,
            "blas": blas_label(), "device": device_label(), "commit": source_commit(), **extra}


def cpu_name() -> str:
    """The processor's model name ("AMD EPYC 9R14", "Apple M2 Pro"): Linux's /proc/cpuinfo, macOS's
    sysctl, else the architecture ("x86_64", what ``platform.processor()`` says on Linux)."""
    import platform
    import subprocess

    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    if platform.system() == "Darwin":
        res = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True)
        if res.returncode == 0 and res.stdout.strip():
            return res.stdout.strip()
    return platform.processor() or platform.machine()


def source_commit() -> str | None:
    """The git commit of the mlx-specstream source that ran ("2b757c5", "+ changes" when tracked
    files differ from it), or None outside a git checkout: the package version does not say
    which code a results file measured."""
    import subprocess

    src = Path(__file__).resolve().parent
    try:  # this file tracked by git, not merely inside some repository (a venv in a project)
        if subprocess.run(["git", "ls-files", "--error-unmatch", Path(__file__).name], cwd=src,
                          capture_output=True, timeout=10).returncode != 0:
            return None
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=src, capture_output=True,
                              text=True, timeout=10)
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "."], cwd=src.parent,
                               capture_output=True, timeout=10).returncode != 0
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + (" + changes" if dirty else "")


def temp_dir_beside(dest: Path) -> Path:
    """A new hidden directory next to ``dest``, to be renamed to it once complete, with the
    permissions any new directory gets (``tempfile.mkdtemp`` makes it 0700, which the rename
    would carry to the output)."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    tmp.chmod(0o777 & ~_umask())
    return tmp


def _umask() -> int:
    """The process's umask (reading it means setting it: it is put back at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def make_parents(folder: Path) -> list[Path]:
    """Create ``folder`` and its missing ancestors; returns those it created, deepest first, for
    :func:`remove_empty` to take back if the write they are for fails."""
    missing, p = [], Path(os.path.abspath(folder))
    while not p.exists():
        missing.append(p)
        p = p.parent
    Path(folder).mkdir(parents=True, exist_ok=True)
    return missing


def remove_empty(created: list[Path]) -> None:
    """Remove the folders :func:`make_parents` created, deepest first, while they are empty: a
    failed write leaves nothing behind, folders included."""
    for d in created:
        try:
            d.rmdir()
        except OSError:
            return


def umask_modes(root: Path) -> None:
    """Give every file and folder under ``root`` the permissions a new one gets under the umask:
    writers that go through ``mkstemp`` (coremltools' ``model.mlmodel``) leave files 0600, which
    other users, or a CI job's artifacts, cannot read."""
    mask = _umask()
    for folder, dirs, files in os.walk(root):
        for d in dirs:
            os.chmod(os.path.join(folder, d), 0o777 & ~mask)
        for f in files:
            os.chmod(os.path.join(folder, f), 0o666 & ~mask)


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived while an output was being written (:func:`terminate_cleanly`)."""


class Interrupts:
    """A Ctrl-C or SIGTERM that stopped a :func:`terminate_cleanly` block. Python drops the
    exception of one that lands inside a finalizer (``Exception ignored in: ... __del__``), and the
    block goes on as if none had come; :meth:`check`, called before an output is put in place,
    stops it there."""

    def __init__(self) -> None:
        self.seen: BaseException | None = None

    def check(self) -> None:
        if self.seen is not None:
            raise self.seen


@contextmanager
def terminate_cleanly() -> Iterator[Interrupts]:
    """While this block runs (in the main thread), SIGTERM raises :class:`Terminated`, so that
    the cleanup of a half-written output runs as it does for Ctrl-C, and every Ctrl-C is noted in
    the :class:`Interrupts` it yields; the previous handlers are put back afterwards. A SIGTERM's
    default action would leave the temporary directory behind."""
    interrupts = Interrupts()
    if threading.current_thread() is not threading.main_thread() or _held[0]:
        yield interrupts  # another thread, or inside signals_held: SIGTERM stays held until that block ends
        return

    def stop(signum, frame):
        signal.signal(signal.SIGTERM, stop.outer)  # a second SIGTERM acts at once (a stuck collective)
        interrupts.seen = Terminated("terminated")
        raise interrupts.seen

    def interrupt(signum, frame):
        try:
            on_int(signum, frame)
        except KeyboardInterrupt as e:  # a caller's handler that does not raise stops nothing
            interrupts.seen = e
            raise

    previous = signal.signal(signal.SIGTERM, stop)
    if previous is None:  # a handler installed outside Python: the default stands in for it
        previous = signal.SIG_DFL
    stop.outer = getattr(previous, "outer", previous)  # within another block, what was there before it
    on_int = signal.getsignal(signal.SIGINT)
    if callable(on_int):  # Python's own (KeyboardInterrupt) or a caller's; an ignored Ctrl-C stays so
        signal.signal(signal.SIGINT, interrupt)
    try:
        yield interrupts
    finally:  # (after a SIGTERM, the next one acts at once out here too)
        signal.signal(signal.SIGTERM, stop.outer if isinstance(interrupts.seen, Terminated) else previous)
        if callable(on_int):
            signal.signal(signal.SIGINT, on_int)


def replace_dirs(moves: list[tuple[Path | None, Path, str]], overwrite: bool) -> None:
    """Move finished directories into place, all or nothing: each ``(src, dest, kind)`` renames
    ``src`` to ``dest``; ``src`` None removes ``dest``, a stale output of the same job. An existing
    ``dest`` must be replaceable (:func:`check_replaceable`); it is first renamed aside and deleted
    only once every move has succeeded, and put back if one fails, so a failed rename or an
    interruption never leaves the user with neither the old output nor the new one. An empty
    folder given as ``dest`` is filled, not replaced: it keeps its permissions, and a shell inside
    it its place."""
    aside: list[tuple[Path, Path]] = []  # (old output renamed aside, where it was)
    placed: list[Path] = []
    filled: list[Path] = []  # entries moved into an empty folder of the user's
    with signals_held():  # Ctrl-C or SIGTERM acts once the outputs are whole again
        try:
            for src, dest, kind in moves:
                if dest.exists() or dest.is_symlink():
                    check_replaceable(dest, kind, overwrite)
                    empty = dest.is_dir() and not dest.is_symlink() and not any(dest.iterdir())
                    if src is not None and empty:  # filled, not replaced
                        for entry in sorted(src.iterdir()):
                            os.replace(entry, dest / entry.name)
                            filled.append(dest / entry.name)
                        src.rmdir()
                        continue
                    old = Path(tempfile.mkdtemp(prefix=f".{dest.name}.old.", dir=dest.parent))
                    aside.append((old, dest))
                    os.replace(dest, old / dest.name)
                if src is not None:
                    os.replace(src, dest)
                    placed.append(dest)
        except BaseException:
            for dest in placed:
                shutil.rmtree(dest, ignore_errors=True)
            for path in filled:  # the folder as it was: empty
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)
            lost = []
            for old, dest in aside:
                try:
                    if (old / dest.name).exists():
                        os.replace(old / dest.name, dest)
                    old.rmdir()
                except OSError:
                    lost.append(f"{dest} is in {old}")
            if lost:
                raise OSError(f"the earlier output could not be put back: {'; '.join(lost)}") from None
            raise
        for old, _ in aside:
            shutil.rmtree(old, ignore_errors=True)


_held = [0]  # depth of signals_held blocks: terminate_cleanly leaves SIGTERM held inside them


@contextmanager
def signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM held back until the block ends, then raised again for the handlers that
    were in place, SIGTERM first (from the main thread, where Python runs signal handlers); a
    :func:`terminate_cleanly` inside the block leaves SIGTERM held."""
    if threading.current_thread() is not threading.main_thread() or _held[0]:
        yield  # another thread, or an outer block holds them already
        return
    caught: list[int] = []
    before = {s: signal.signal(s, lambda signum, frame: caught.append(signum))
              for s in (signal.SIGINT, signal.SIGTERM)}
    _held[0] += 1
    try:
        yield
    finally:
        _held[0] -= 1
        for s, handler in before.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
        for s in sorted(set(caught), key=lambda s: s != signal.SIGTERM):
            signal.raise_signal(s)


def write_atomic(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Write ``path`` whole: ``write`` fills a temporary file beside it, then a rename, so an
    interrupted or failed write leaves the previous file as it was (and no temporary file)."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with terminate_cleanly() as interrupts, open(tmp, "wb") as f:  # SIGTERM too removes the temp file
            write(f)
        interrupts.check()
        os.replace(tmp, path)
    except OSError as e:  # said of the file asked for, not of the temporary one
        tmp.unlink(missing_ok=True)
        if e.errno is None:
            raise
        raise _cannot_write(e, path) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _cannot_write(e: OSError, path: Path) -> OSError:
    """``e`` said of ``path``, the file asked for, not of a temporary file beside it: the same kind
    of error with the same errno."""
    said = type(e)(f"cannot write {path}: {e.strerror}")
    said.errno = e.errno
    return said


def write_files_atomic(directory: Path, files: dict[str, bytes], remove: list[str] = (),
                       check: Callable[[Path], None] | None = None) -> None:
    """Write several files of ``directory`` together, and remove the ``remove`` ones (an earlier
    set's that the new one lacks): each new file goes to a temporary file beside it, then with
    Ctrl-C and SIGTERM held the earlier files are renamed aside and the new ones into place; if a
    rename fails, what was placed goes and the earlier files come back. So a failed or interrupted
    write leaves the earlier set as it was, and no temporary file. ``check(path)``, for each file
    there to be replaced or removed, raises if it may not be, just before any is (a check made
    before a long run does not see a file that appeared during it)."""
    pid = os.getpid()
    temps = {name: directory / f".{name}.tmp{pid}" for name in files}
    name = None
    try:
        with terminate_cleanly() as interrupts:
            for name, data in files.items():
                temps[name].write_bytes(data)
        interrupts.check()
    except OSError as e:
        for t in temps.values():
            t.unlink(missing_ok=True)
        if e.errno is None or name is None:
            raise
        raise _cannot_write(e, directory / name) from None
    except BaseException:
        for t in temps.values():
            t.unlink(missing_ok=True)
        raise
    aside: list[tuple[Path, Path]] = []  # (the earlier file renamed aside, where it was)
    placed: list[Path] = []
    dest = directory
    with signals_held():
        try:
            for name in (*files, *remove) if check is not None else ():
                if (directory / name).exists() or (directory / name).is_symlink():
                    check(directory / name)
            for name in (*files, *remove):
                dest = directory / name
                if dest.exists():
                    old = directory / f".{name}.old{pid}"
                    os.replace(dest, old)
                    aside.append((old, dest))
                if name in files:
                    os.replace(temps[name], dest)
                    placed.append(dest)
        except BaseException as e:
            for path in placed:
                path.unlink(missing_ok=True)
            for old, path in aside:
                os.replace(old, path)
            for t in temps.values():
                t.unlink(missing_ok=True)
            if not isinstance(e, OSError) or e.errno is None:
                raise
            raise _cannot_write(e, dest) from None
        for old, _ in aside:
            old.unlink(missing_ok=True)


def check_writable(directory: Path, what: str = "") -> None:
    """Check that a file can be written in ``directory``, or in its nearest existing parent where
    the output will make it, so that an output that cannot be written fails before the work, not
    after it; nothing is created, so a run that fails later leaves no new folder (``what`` names
    the output)."""
    named = f"{what} " if what else ""
    existing = Path(os.path.abspath(directory))
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise PermissionError(f"cannot write {named}to {directory}: {existing} is not a directory")
    try:
        tempfile.TemporaryFile(dir=existing).close()
    except OSError as e:
        raise PermissionError(f"cannot write {named}to {directory}: {e.strerror}") from None


def save_safetensors(path: Path, arrays: dict, metadata: dict | None = None) -> None:
    """``mx.save_safetensors``, its write failures (a full disk, an I/O error: MLX raises
    ``RuntimeError``) raised as ``OSError`` naming the file, which the CLI reports in one line."""
    import mlx.core as mx

    try:
        mx.save_safetensors(str(path), arrays, metadata=metadata)
    except RuntimeError as e:
        if not any(word in str(e).lower() for word in ("write", "open")):
            raise  # not the file system's doing
        raise OSError(f"cannot write {path}: {e}") from None


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) whole, as :func:`write_atomic` does."""
    write_atomic(path, lambda f: f.write(text.encode("utf-8")))


def parse_script_args(ap: argparse.ArgumentParser, argv: list[str] | None = None, *,
                      pass_through: bool = False) -> argparse.Namespace:
    """A script's arguments, with ``--out FILE`` and ``--overwrite`` added and checked before any
    work: ``--out`` absent, or (``--overwrite``) a results file this project wrote, in a folder
    that takes a file; otherwise the script ends with one line (``ap.error``). ``pass_through``:
    arguments the parser does not know go to ``args.passed`` (for a command the script runs)."""
    ap.add_argument("--out", type=Path, help="write a results file here (command, machine, versions, date)")
    ap.add_argument("--overwrite", action="store_true",
                    help="replace --out when it is a results file this project wrote")
    if pass_through:
        ap.allow_abbrev = False  # --over, an option of the command, is not --overwrite
        args, passed = ap.parse_known_args(argv)
        args.passed = [a for a in passed if a != "--"]
    else:
        args = ap.parse_args(argv)
    if args.out is not None:
        try:
            check_replaceable_file(args.out, args.overwrite, is_results_json)
            check_writable(args.out.parent, "the results")
        except OSError as e:
            ap.error(e.render("cli") if isinstance(e, OutputExistsError) else str(e))
    return args


def json_text(value) -> str:
    """``value`` as standard JSON (RFC 8259, which strict parsers and JavaScript read): a number
    that is not finite (a metric with nothing to measure, NaN) is written as null."""
    def finite(v):
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if isinstance(v, dict):
            return {k: finite(x) for k, x in v.items()}
        return [finite(x) for x in v] if isinstance(v, (list, tuple)) else v

    return json.dumps(finite(value), indent=2, allow_nan=False)


def results_text(meta: dict, results: list) -> str:
    """A results file's text: ``{"meta", "results"}`` as JSON."""
    return json_text({"meta": meta, "results": results}) + "\n"


def write_results_file(path: Path, meta: dict, results: list) -> None:
    """A benchmark script's results file (:func:`results_text`), written whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, results_text(meta, results))


def markdown_table(columns: dict[str, str], rows: list[dict]) -> str:
    """A Markdown table of ``rows``: ``columns`` maps each header to the key of its values."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(r[k]) for k in columns.values()) + " |" for r in rows]
    return "\n".join(lines)
