"""The process's machine and environment: cores, a cache folder without a home, bad settings."""

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from mlx_specstream import machine


def test_cache_folder_without_a_home_is_the_users_own_in_the_temporary_directory(tmp_path, monkeypatch):
    """A container user with no passwd entry and no HOME (``Path.home()`` raises) still gets a
    cache folder (small_gemm.c, kernels), private to the user; a home that cannot be written is
    passed over the same way."""
    def no_home():
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setattr(Path, "home", no_home)
    monkeypatch.setattr("tempfile.gettempdir", lambda: str(tmp_path))
    folder = machine.cache_dir("kernels")
    assert folder == tmp_path / f"mlx-specstream-{os.getuid()}" / "kernels" and folder.is_dir()
    assert stat.S_IMODE(folder.parent.stat().st_mode) == 0o700
    monkeypatch.setenv("XDG_CACHE_HOME", "/proc/no-such-home")
    assert machine.cache_dir("kernels") == folder


def test_a_shared_folder_others_may_write_to_is_not_used(tmp_path, monkeypatch):
    """Libraries are loaded from the cache: a folder in the temporary directory that others may
    write to (planted there first) is refused."""
    monkeypatch.setenv("XDG_CACHE_HOME", "/proc/no-such-home")
    monkeypatch.setattr("tempfile.gettempdir", lambda: str(tmp_path))
    planted = tmp_path / f"mlx-specstream-{os.getuid()}"
    planted.mkdir()
    planted.chmod(0o777)
    assert machine.cache_dir("kernels") is None


def test_cores_follow_the_cpu_affinity():
    if not hasattr(os, "sched_getaffinity"):
        pytest.skip("no CPU affinity on this platform")
    code = "from mlx_specstream import machine; print(machine.cores())"
    out = subprocess.run(["taskset", "-c", "0", sys.executable, "-c", code], capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip(f"taskset: {out.stderr.strip()}")
    assert out.stdout.strip() == "1"


@pytest.mark.parametrize("name,value,check,meant", [
    ("MLX_SPECSTREAM_ATTENTION", "foo",
     "from mlx_specstream.kernels import attention as a; print(a._backend)", "auto"),
    ("MLX_SPECSTREAM_EMU_WORKERS", "auto",
     "from mlx_specstream.kernels import emulator as e; print(e._env_workers())",
     str(min(4, machine.cores()))),
    ("SPECSTREAM_GEMV_ROWS", "many", "from mlx_specstream import blas; print(blas.small_rows_limit())", "0"),
])
def test_a_bad_setting_is_one_warning_naming_it_not_a_failure(name, value, check, meant):
    """A stray value of a setting read at import warns, naming the variable, and means its
    fallback; it does not stop every command with a traceback."""
    out = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True,
                         env=os.environ | {name: value})
    assert out.returncode == 0, out.stderr[-800:]
    assert f"warning: {name}={value!r}" in out.stderr and "Traceback" not in out.stderr
    assert out.stdout.strip() == meant
