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
