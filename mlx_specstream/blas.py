"""Optimized BLAS for MLX on Linux.

The ``mlx[cpu]`` wheel links the reference (netlib) BLAS: an fp32 matmul costs ~4.7 GFLOP/s and
grows linearly with the number of query rows, which makes speculative verification as slow as
token-by-token decoding. Preloading an optimized BLAS (Debian's OpenBLAS, or Intel MKL from PyPI)
replaces ``cblas_sgemm`` for the whole process. ``LD_PRELOAD`` only works at process start, so
:func:`ensure_fast_blas` re-executes the current command once with it set.

``SPECSTREAM_BLAS`` selects: ``auto`` (default: MKL, then OpenBLAS), ``mkl``, ``openblas``,
``reference`` (no preload), or a path to a shared library.
"""

from __future__ import annotations

import glob
import os
import sys
from pathlib import Path

_OPENBLAS = ["/usr/lib/x86_64-linux-gnu/libopenblas.so.0", "/usr/lib/aarch64-linux-gnu/libopenblas.so.0"]
_MARK = "SPECSTREAM_BLAS_EXEC"


def _mkl_candidates() -> list[str]:
    roots = {sys.prefix, sys.base_prefix}
    return sorted(p for r in roots for p in glob.glob(os.path.join(r, "lib", "libmkl_rt.so*")))


def find_blas(choice: str | None = None) -> str | None:
    """Path of the optimized BLAS to preload for ``choice`` (see module doc), or None."""
    choice = (choice or os.environ.get("SPECSTREAM_BLAS", "auto")).strip()
    if choice == "reference" or sys.platform != "linux":
        return None
    if choice not in ("auto", "mkl", "openblas"):
        if not Path(choice).is_file():
            raise FileNotFoundError(f"SPECSTREAM_BLAS={choice}: no such library")
        return choice
    found = {"mkl": _mkl_candidates(), "openblas": [p for p in _OPENBLAS if Path(p).exists()]}
    order = ["mkl", "openblas"] if choice == "auto" else [choice]
    for name in order:
        if found[name]:
            return found[name][0]
    return None


def active_blas() -> str:
    """Which BLAS this process uses: 'mkl', 'openblas', 'accelerate' or 'reference'."""
    if sys.platform == "darwin":
        return "accelerate"
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return "unknown"
    if "libmkl" in maps:
        return "mkl"
    if "libopenblas" in maps:
        return "openblas"
    return "reference"


def ensure_fast_blas(argv: list[str] | None = None) -> None:
    """Re-exec this process once with an optimized BLAS preloaded, when one is available.

    Call it before anything heavy runs. It does nothing on macOS, when a BLAS is already
    preloaded, when ``SPECSTREAM_BLAS=reference``, or when the re-exec already happened.
    """
    if sys.platform != "linux" or os.environ.get(_MARK) or active_blas() in ("mkl", "openblas"):
        return
    lib = find_blas()
    if lib is None:
        return
    env = dict(os.environ)
    env[_MARK] = "1"
    env["LD_PRELOAD"] = ":".join(p for p in (lib, env.get("LD_PRELOAD", "")) if p)
    args = argv if argv is not None else list(getattr(sys, "orig_argv", [sys.executable, *sys.argv]))
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *args[1:]], env)
