"""Every code block of the README runs as written, so the README cannot drift from the code.

Placeholders become real paths (``MODEL_DIR``: a copy of the shipped model; ``HF_DIR``: its
Hugging Face directory; ``PROMPT.txt``, ``SQL.mlpackage``, ``"..."``: a test prompt) and sizes
shrink (``--iters 2``, one validation batch and two acceptance prompts, ``--n 1``, 8 new
tokens); nothing else changes. The blocks that train or export a Core ML package of the shipped
model take minutes, so they run with ``-m slow``; every command of every block is parsed by the
CLI in the default run, and the same work runs in-process there (test_train, test_coreml_export).
The set-up block is what CI runs (``.ci/run``), so it is compared with that script instead of
run inside the suite.
"""

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from mlx_specstream.api import DEFAULT_MODEL

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"^```(bash|python)\n(.*?)^```", re.S | re.M)
BLOCKS = BLOCK.findall((ROOT / "README.md").read_text())
pytestmark = pytest.mark.skipif(not (DEFAULT_MODEL / "adapters" / "sql").is_dir(), reason="no default model")


def sized(line: str) -> str:
    """The same command on a smaller job."""
    line = re.sub(r"--iters \d+", "--iters 2", line)
    line = re.sub(r"--n \d+", "--n 1", line)
    line = re.sub(r"--max-tokens \d+", "--max-tokens 8", line)
    if re.search(r"specstream-mlx (generate|bench)", line) and "--max-tokens" not in line:
        line = line.split("#")[0].rstrip() + " --max-tokens 8"
    if "specstream-mlx train" in line:
        line += " --val-batches 1 --accept-prompts 2"
    return line


def model_copy(dest: Path, adapters: bool = True) -> Path:
    """The shipped model under another name: its files linked, its adapters copied (blocks
    train new ones beside them)."""
    dest.mkdir(parents=True)
    for f in DEFAULT_MODEL.iterdir():
        if f.is_file():
            (dest / f.name).symlink_to(f.resolve())
    (dest / "draft").symlink_to((DEFAULT_MODEL / "draft").resolve())
    if adapters:
        shutil.copytree(DEFAULT_MODEL / "adapters", dest / "adapters",
                        ignore=shutil.ignore_patterns("*.train"))
    return dest


def test_the_setup_block_is_what_ci_runs():
    setup = [b for lang, b in BLOCKS if "scripts/setup.sh" in b]
    assert len(setup) == 1
    ci = (ROOT / ".ci" / "run").read_text()
    for line in setup[0].strip().splitlines():
        assert line in ci.splitlines(), line


def heavy(block: str) -> bool:
    """Minutes of work on the shipped model (an adapter trained, a Core ML package made)."""
    return "specstream-mlx train" in block or "--to coreml" in block


def commands(block: str) -> list[list[str]]:
    """The ``specstream-mlx`` commands of a bash block, as argument lists after the program."""
    out = []
    for line in block.strip().splitlines():
        words = shlex.split(line, comments=True)
        for i, word in enumerate(words):
            if word.endswith("specstream-mlx"):
                rest = words[i + 1:]
                out.append(rest[: rest.index("&")] if "&" in rest else rest)
    return out


def test_every_readme_command_parses():
    """Each command's subcommand, option names and option values are what the CLI accepts (the
    blocks themselves run below, the heavy ones with ``-m slow``)."""
    import typer.main

    from mlx_specstream.cli import app

    group = typer.main.get_command(app)
    found = [args for lang, block in BLOCKS if lang == "bash" for args in commands(block)]
    assert {args[0] for args in found} >= {"generate", "convert", "train", "bench", "serve"}
    for args in found:
        command = group.get_command(None, args[0])
        assert command is not None, args
        command.make_context(args[0], list(args[1:]))  # raises on an unknown option or a bad value


@pytest.mark.parametrize("index", [
    pytest.param(i, marks=[pytest.mark.slow] if heavy(b) else [])
    for i, (_, b) in enumerate(BLOCKS) if "scripts/setup.sh" not in b])
def test_readme_block_runs(index, tmp_path):
    lang, block = BLOCKS[index]
    prompt = json.loads((ROOT / "data" / "sql" / "test.jsonl").open().readline())["prompt"]
    (tmp_path / "PROMPT.txt").write_text(prompt)
    trains = "specstream-mlx train" in block
    converts = "--hf-path" in block
    model = tmp_path / "model" if converts else model_copy(tmp_path / "model", adapters=not trains)
    subs = {"MODEL_DIR": str(model), "HF_DIR": str(DEFAULT_MODEL.parent / "hf"),
            "PROMPT.txt": str(tmp_path / "PROMPT.txt"), "SQL.mlpackage": str(tmp_path / "SQL.mlpackage"),
            "results/bench-sql": str(tmp_path / "bench"), "my-bench": str(tmp_path / "my-bench")}
    for key, value in subs.items():
        block = block.replace(key, value)
    if lang == "python":
        res = subprocess.run([sys.executable, "-c", block], cwd=ROOT, capture_output=True, text=True,
                             timeout=600)
        assert res.returncode == 0, res.stderr
        return
    if "specstream-mlx serve" in block:  # one script: a server in the background, a client, SIGTERM
        run_server_block(block)
        return
    for line in block.strip().splitlines():
        line = sized(line).replace('"..."', shlex.quote(prompt))
        res = subprocess.run(["bash", "-c", line], cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert res.returncode == 0, f"{line}\n{res.stderr[-3000:]}"


def run_server_block(block: str) -> None:
    """Run a ``serve`` block as one bash script on a free port; whatever it leaves is killed."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(["bash", "-c", block.replace("8080", str(port))], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=300)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err[-3000:]
    assert '"speculative"' in out, out
