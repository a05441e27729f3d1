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

With OpenBLAS, products of at most 8 rows (every decode pass) go through ``small_gemm.c``: one
sgemv per row instead of OpenBLAS's sgemm, which packs and threads them like big ones (3x slower
for one row here). It is compiled once per machine with the system C compiler into the user's
cache directory and loaded ahead of OpenBLAS; without a compiler MLX uses OpenBLAS alone.
``SPECSTREAM_GEMV_ROWS=0`` turns it off (``N``: up to N rows).
"""

from __future__ import annotations

import ctypes
import glob
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .machine import cache_dir, env_whole_number, warn

_OPENBLAS = ["/usr/lib/x86_64-linux-gnu/libopenblas.so.0", "/usr/lib/aarch64-linux-gnu/libopenblas.so.0",
             "/usr/lib64/libopenblas.so.0", "/usr/lib/libopenblas.so.0"]  # Debian, Fedora, Arch


def _openblas_candidates() -> list[str]:
    """The system's OpenBLAS: at a known path, else wherever the dynamic linker finds it."""
    import ctypes.util

    found = [p for p in _OPENBLAS if Path(p).exists()]
    return found or [p for p in [ctypes.util.find_library("openblas")] if p]


def _mkl_candidates() -> list[str]:
    roots = {sys.prefix, sys.base_prefix}
    return sorted(p for r in roots for p in glob.glob(os.path.join(r, "lib", "libmkl_rt.so*")))


_warned: set[str] = set()


def find_blas(choice: str | None = None) -> str | None:
    """Path of the optimized BLAS to preload for ``choice`` (see module doc), or None."""
    choice = (choice or os.environ.get("SPECSTREAM_BLAS") or "auto").strip()
    if choice == "reference" or sys.platform != "linux":
        return None
    found = {"mkl": _mkl_candidates(), "openblas": _openblas_candidates()}
    if choice not in ("auto", "mkl", "openblas"):
        if Path(choice).is_file():
            return choice
        problem = "no such library (nor auto, mkl, openblas or reference)"
    elif choice != "auto" and not found[choice]:
        problem = f"{choice} is not installed here"
    else:
        problem = None
    if problem is not None:  # a typo must not stop every command, nor quietly cost the fast BLAS
        message = f"SPECSTREAM_BLAS={choice}: {problem}; using the best BLAS found instead"
        if message not in _warned:  # once per process (import, then `specstream-mlx blas`)
            _warned.add(message)
            warn(message)
        choice = "auto"
    order = ["mkl", "openblas"] if choice == "auto" else [choice]
    for name in order:
        if found[name]:
            return found[name][0]
    return None


def small_rows_limit() -> int:
    """``SPECSTREAM_GEMV_ROWS``: products of at most this many rows go through ``small_gemm.c``
    (default 8; 0: none). A value that is not a whole number >= 0 turns it off, with a warning."""
    return env_whole_number("SPECSTREAM_GEMV_ROWS", 8, 0, "small matrix products go through OpenBLAS's sgemm")


def small_rows_library(blas: str) -> str | None:
    """``small_gemm.c`` built against OpenBLAS library ``blas`` (once, cached per source and
    library), or None where it cannot be built or is turned off (:func:`small_rows_limit`)."""
    if small_rows_limit() == 0:
        return None
    cc = shutil.which(os.environ.get("CC", "cc"))
    if cc is None:
        return None
    source = Path(__file__).with_name("small_gemm.c")
    key = hashlib.sha256(source.read_bytes() + blas.encode()).hexdigest()[:16]
    cache = cache_dir("small_gemm")
    if cache is None:
        return None
    lib = cache / f"small_gemm-{key}.so"
    if lib.exists():
        return str(lib)
    try:
        with tempfile.TemporaryDirectory(dir=cache) as tmp:  # built aside, then renamed: never half-written
            out = Path(tmp) / lib.name
            subprocess.run([cc, "-O2", "-shared", "-fPIC", f'-DBLAS_LIBRARY="{blas}"', "-o", str(out),
                            str(source), "-ldl"],
                           check=True, capture_output=True, timeout=120)
            os.replace(out, lib)
    except (OSError, subprocess.SubprocessError):
        return None
    return str(lib)


def small_rows_active() -> bool:
    """Whether this process's small matrix products go through ``small_gemm.c``."""
    try:
        return "small_gemm-" in Path("/proc/self/maps").read_text()
    except OSError:
        return False


def blas_label() -> str:
    """The BLAS as results files record it: :func:`active_blas`, plus the small-row path when on."""
    if not small_rows_active():
        return active_blas()
    return f"{active_blas()} + small_gemm.c (<= {small_rows_limit()} rows as sgemv)"


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
        warn(f"MLX was imported before mlx_specstream and runs on the slow reference BLAS (about "
              f"5-10x slower here): import mlx_specstream first, or start Python with LD_PRELOAD={lib}")
        return None
    if "openblas" in Path(lib).name:
        rows = small_rows_library(lib)
        if rows is not None:
            ctypes.CDLL(rows, mode=ctypes.RTLD_GLOBAL)  # first: MLX's cblas_sgemm resolves to it
    ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
    return lib


def set_threads(n: int) -> int | None:
    """Let the loaded BLAS (OpenBLAS or MKL) use ``n`` threads; returns how many it used before,
    or None where there is no such BLAS (Accelerate, the reference BLAS)."""
    scope = ctypes.CDLL(None)
    for get, put in (("openblas_get_num_threads", "openblas_set_num_threads"),
                     ("MKL_Get_Max_Threads", "MKL_Set_Num_Threads")):
        if hasattr(scope, get):
            before = getattr(scope, get)()
            getattr(scope, put)(ctypes.c_int(n))
            return before
    return None
