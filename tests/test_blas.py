import json
import os
import shutil
import subprocess
import sys

from mlx_specstream.blas import active_blas, find_blas


def test_tests_run_on_the_optimized_blas_when_installed():
    if find_blas() is not None:
        assert active_blas() in ("openblas", "mkl")


def test_cli_reports_blas():
    out = subprocess.run([sys.executable, "-m", "mlx_specstream.cli", "blas"], capture_output=True,
                         text=True, check=True).stdout
    assert "active BLAS:" in out
    if find_blas() is not None:
        assert "reference" not in out.splitlines()[0]


def _plain_python(code: str, **env_vars: str) -> subprocess.CompletedProcess:
    """A fresh interpreter, as a notebook or script would be (no LD_PRELOAD, no pytest plugin),
    with ``env_vars`` added to the environment."""
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"} | env_vars
    return subprocess.run([sys.executable, "-W", "always", "-c", code], capture_output=True, text=True,
                          env=env, timeout=120)


def test_plain_python_process_gets_the_optimized_blas():
    """``import mlx_specstream`` in a notebook is as fast as the CLI: MLX's matmuls run on the
    optimized BLAS with no restart, and the timing shows it (the reference BLAS is ~5-25x slower
    on a 512x512 product)."""
    if find_blas() is None:
        return
    code = ("import time, mlx_specstream, mlx.core as mx\n"
            "from mlx_specstream.blas import active_blas\n"
            "a = mx.random.normal((512, 512)); mx.eval(a @ a)\n"
            "t = time.perf_counter()\n"
            "for _ in range(20): mx.eval(a @ a)\n"
            "print(active_blas(), (time.perf_counter() - t) / 20)")
    one = {"OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # one core each: the other may be busy
    fast = _plain_python(code, **one)
    assert fast.returncode == 0, fast.stderr
    name, seconds = fast.stdout.split()
    assert name in ("openblas", "mkl")
    ref = _plain_python("import os; os.environ['SPECSTREAM_BLAS'] = 'reference'\n" + code, **one)
    ref_name, ref_seconds = ref.stdout.split()
    assert ref_name == "reference" and float(ref_seconds) > 3 * float(seconds)


def test_mlx_imported_first_warns_once_with_the_fix():
    if find_blas() is None:
        return
    res = _plain_python("import mlx.core, mlx_specstream")
    assert res.returncode == 0
    warned = res.stderr.strip().splitlines()
    assert len(warned) == 1 and "import mlx_specstream first" in warned[0] and "LD_PRELOAD=" in warned[0]


SMALL_PRODUCTS = """
import json, mlx_specstream, mlx.core as mx, numpy as np
from mlx_specstream.blas import small_rows_active
worst = 0.0
for rows in range(1, 11):  # both sides of the 8-row bound
    for ta in (False, True):
        for tb in (False, True):
            a = mx.random.normal((96, rows)).T if ta else mx.random.normal((rows, 96))
            b = mx.random.normal((50, 96)).T if tb else mx.random.normal((96, 50))
            bias = mx.random.normal((50,))
            ref = np.array(a, np.float64) @ np.array(b, np.float64)
            for got, want in ((a @ b, ref), (mx.addmm(bias, a, b), ref + np.array(bias))):
                worst = max(worst, float(np.abs(np.array(got) - want).max()))
print(json.dumps({"active": small_rows_active(), "worst": worst}))
"""


def test_small_row_products_equal_a_float64_oracle():
    """With OpenBLAS, products of up to 8 rows run through small_gemm.c (one sgemv per row): every
    layout MLX hands to BLAS (either operand transposed, with and without a bias), for 1-10 rows,
    equals NumPy's float64 product to fp32 rounding."""
    if "openblas" not in (find_blas() or ""):
        return
    res = _plain_python(SMALL_PRODUCTS)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["worst"] < 1e-3
    assert out["active"] == (shutil.which("cc") is not None)


def test_small_row_products_can_be_turned_off():
    """``SPECSTREAM_GEMV_ROWS=0`` turns the small-row path off; a value that is not a whole number
    does too, with one warning, and the results label says so."""
    if "openblas" not in (find_blas() or ""):
        return
    code = ("from mlx_specstream.blas import small_rows_active, active_blas, blas_label\n"
            "print(small_rows_active(), active_blas(), blas_label())")
    res = _plain_python(code, SPECSTREAM_GEMV_ROWS="0")
    assert res.stdout.split() == ["False", "openblas", "openblas"], res.stderr
    res = _plain_python(code, SPECSTREAM_GEMV_ROWS="many")
    assert res.stdout.split() == ["False", "openblas", "openblas"], res.stderr
    warned = res.stderr.strip().splitlines()  # one line, though given while the package imports
    assert len(warned) == 1 and warned[0].startswith("warning: SPECSTREAM_GEMV_ROWS='many'"), warned


def test_scripts_import_mlx_specstream_before_mlx():
    """A script that imports MLX before ``mlx_specstream`` runs on the reference BLAS (5-25x
    slower products): benchmarks then time the wrong library. Every top-level import of ``mlx``
    in ``scripts/`` comes after one of ``mlx_specstream``."""
    import ast
    from pathlib import Path

    def top(node) -> list[str]:
        if isinstance(node, ast.Import):
            return [a.name.split(".")[0] for a in node.names]
        if isinstance(node, ast.ImportFrom) and node.level == 0:
            return [node.module.split(".")[0]]
        return []

    late = []
    for script in sorted(Path(__file__).resolve().parent.parent.glob("scripts/*.py")):
        seen_ours = False
        for node in ast.parse(script.read_text()).body:
            names = top(node)
            seen_ours = seen_ours or "mlx_specstream" in names
            if "mlx" in names and not seen_ours:
                late.append(script.name)
                break
    assert late == []


def test_a_bad_choice_warns_and_uses_the_best_blas_found(monkeypatch, tmp_path):
    """``SPECSTREAM_BLAS`` with a typo, or naming a BLAS not installed, warns once and falls back
    to what ``auto`` finds, instead of stopping every command at import or quietly running on
    the slow reference BLAS."""
    import pytest

    from mlx_specstream import blas

    best = find_blas("auto")
    monkeypatch.setattr(blas, "_warned", set())
    monkeypatch.setenv("SPECSTREAM_BLAS", "openbals")
    with pytest.warns(RuntimeWarning, match="openbals: no such library"):
        assert find_blas() == best
    monkeypatch.setattr(blas, "_mkl_candidates", lambda: [])
    with pytest.warns(RuntimeWarning, match="mkl is not installed here"):
        assert find_blas("mkl") == find_blas("auto")
    lib = tmp_path / "libmine.so"
    lib.write_bytes(b"")
    assert find_blas(str(lib)) == str(lib)
