"""Optimized BLAS for MLX on Linux.

The ``mlx[cpu]`` wheel links the reference (netlib) BLAS: an fp32 matmul costs ~4.7 GFLOP/s and
grows linearly with the number of query rows, which makes speculative verification as slow as
token-by-token decoding. Loading an optimized BLAS (Debian's OpenBLAS, or Intel MKL from PyPI)
into the global symbol scope *before* MLX is imported makes MLX's ``cblas_sgemm`` resolve to it
for the whole process: :func:`preload_fast_blas` does that when ``mlx_specstream`` is imported,
so the CLI, the test suite, scripts and a notebook all get it without a restart. If MLX was
imported first, it warns once with the fix.

``SPECSTREAM_BLAS`` selects: ``auto`` (default: MKL, then OpenBLAS), ``mkl``, ``openblas``,
``reference`` (no preload), or a path to a shared library.
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys
from pathlib import Path

_OPENBLAS = ["/usr/lib/x86_64-linux-gnu/libopenblas.so.0", "/usr/lib/aarch64-linux-gnu/libopenblas.so.0"]


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


def preload_fast_blas() -> str | None:
    """Load the optimized BLAS (``RTLD_GLOBAL``) so that MLX, imported afterwards, uses it.

    Returns the library loaded, or None. Does nothing off Linux, with ``SPECSTREAM_BLAS=reference``
    or when an optimized BLAS is already in the process. When ``mlx.core`` is already imported
    on the reference BLAS, it is too late: warns once, naming the one-line fix.
    """
    if sys.platform != "linux" or active_blas() in ("mkl", "openblas"):
        return None
    lib = find_blas()
    if lib is None:
        return None
    if "mlx.core" in sys.modules:
        import warnings

        warnings.warn(f"MLX was imported before mlx_specstream and runs on the slow reference BLAS "
                      f"(about 5-10x slower here): import mlx_specstream first, or start Python "
                      f"with LD_PRELOAD={lib}", RuntimeWarning, stacklevel=3)
        return None
    ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
    return lib
