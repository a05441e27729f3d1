"""What a process gets from the machine and environment it runs in: the cores it may use, a
cache folder for what it compiles, settings from environment variables, and the one-line
warnings that report a bad setting. Nothing here imports MLX: :mod:`mlx_specstream.blas` uses it
before MLX is loaded."""

from __future__ import annotations

import os
import stat
import tempfile
import warnings
from pathlib import Path


def one_line_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                     file: object = None, line: str | None = None) -> str:
    """The project's warning format, one line as an error is (``warnings.formatwarning``): the CLI
    sets it for every warning; warnings given while the package is imported (before the CLI can
    set anything) use it too."""
    return f"warning: {message}\n"


_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _first_caller_outside() -> int:
    """The stack level, for a ``warnings.warn`` in :func:`warn`, of the first frame outside this
    package: the user's line that led to the warning (what Python 3.12's ``skip_file_prefixes``
    does, found by hand: 3.10 and 3.11 lack it)."""
    import sys

    frame, level = sys._getframe(2), 2  # 1: warn itself
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    return level


def warn(message: str) -> None:
    """A RuntimeWarning in :func:`one_line_warning`'s format (filters and handlers apply as usual),
    attributed to the first line outside this package that led to it."""
    previous, warnings.formatwarning = warnings.formatwarning, one_line_warning
    try:
        warnings.warn(message, RuntimeWarning, stacklevel=_first_caller_outside())
    finally:
        warnings.formatwarning = previous


def cores() -> int:
    """Cores this process may run on: its CPU affinity (``taskset``, a container's cpuset) where
    the platform has one (Linux), else every core."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def env_whole_number(name: str, default: int, invalid: int, meaning: str) -> int:
    """``$name`` as a whole number >= 0 (``default`` when unset); any other value gives
    ``invalid`` with a warning that names the variable and says what that means (``meaning``)."""
    value = os.environ.get(name, str(default)).strip()
    if not value.isdigit():
        warn(f"{name}={value!r} is not a whole number >= 0: {meaning}")
        return invalid
    return int(value)


def cache_dir(name: str) -> Path | None:
    """A folder of this user's own for files built once per machine (``name`` inside
    ``$XDG_CACHE_HOME/mlx-specstream``, by default ``~/.cache``), created if needed. Without a
    usable home (a container user with no passwd entry and no ``HOME``, a read-only home) a
    folder of this user's in the temporary directory; None if neither can be had. A folder in the
    shared temporary directory is used only if this user owns it and no one else may write to it:
    compiled libraries are loaded from it."""
    try:
        home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    except (RuntimeError, KeyError):  # no home directory to be found
        home = None
    uid = os.getuid() if hasattr(os, "getuid") else None
    roots = [(home / "mlx-specstream", False)] if home else []
    roots.append((Path(tempfile.gettempdir()) / f"mlx-specstream-{uid or 0}", True))
    for root, shared in roots:
        try:
            root.mkdir(parents=True, exist_ok=True, mode=0o700)
            st = root.lstat()
            if shared and uid is not None and (st.st_uid != uid or st.st_mode & 0o077
                                               or not stat.S_ISDIR(st.st_mode)):
                continue
            folder = root / name
            folder.mkdir(exist_ok=True)
            if os.access(folder, os.W_OK):
                return folder
        except OSError:
            continue
    return None
