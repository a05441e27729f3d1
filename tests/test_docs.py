"""The design lives in the repository: no tracked file points outside it (the design notes it was
first read from, a shared folder, this machine's directories), and every ``docs/design.md#anchor``
that code or docs cite is a heading of docs/design.md."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DESIGN = ROOT / "docs" / "design.md"
# Spelled in pieces so that this file does not match itself.
OUTSIDE = ("DESIGN" + ".md", ".." + "/shared", "/" + "work/")
CITED = re.compile(r"docs/design\.md#([\w-]+)")
LINKED = re.compile(r"\]\((?:\.\./docs/|docs/|\./)?design\.md#([\w-]+)\)")  # [x](design.md#y)
SELF = re.compile(r"\]\(#([\w-]+)\)")  # links inside design.md


def tracked_text_files() -> dict[str, str]:
    """Path -> text of every tracked regular file that is text (symlinks and binaries skipped)."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    names = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True,
                           ).stdout.decode().split("\0")
    out = {}
    for name in filter(None, names):
        path = ROOT / name
        if path.is_symlink() or not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:
            continue
        out[name] = data.decode("utf-8", errors="replace")
    return out


def anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as '-', repeats numbered."""
    seen: dict[str, int] = {}
    out = set()
    in_code = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if in_code or not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def citations(name: str, text: str) -> set[str]:
    """Anchors of docs/design.md that ``text`` (the file ``name``) cites."""
    found = set(CITED.findall(text)) | set(LINKED.findall(text))
    if name == "docs/design.md":
        found |= set(SELF.findall(text))
    return found


def test_anchor_rules():
    """The helpers above find what they must (so the real checks below can fail)."""
    assert anchors("# A\n## Draft tree\n```\n# not a heading\n```\n## Draft tree\n### KV-cache commit") == {
        "a", "draft-tree", "draft-tree-1", "kv-cache-commit"}
    assert citations("x.py", "see docs/design.md#masks, [d](design.md#pruning).") == {"masks", "pruning"}
    assert citations("docs/design.md", "[m](#masks)") == {"masks"}
    assert any(s in "see ../" + "shared/papers" for s in OUTSIDE)


def test_no_file_points_outside_the_repository():
    bad = [f"{name}:{i}: {line.strip()[:100]}"
           for name, text in tracked_text_files().items()
           for i, line in enumerate(text.splitlines(), 1)
           if any(s in line for s in OUTSIDE)]
    assert not bad, "files that point outside the repository:\n" + "\n".join(bad)


def test_cited_design_sections_exist():
    headings = anchors(DESIGN.read_text(encoding="utf-8"))
    files = tracked_text_files()
    files.setdefault("docs/design.md", DESIGN.read_text(encoding="utf-8"))  # before it is committed
    files.pop(Path(__file__).relative_to(ROOT).as_posix(), None)  # this file's examples cite nothing
    cited = {(name, a) for name, text in files.items() for a in citations(name, text)}
    assert cited, "nothing cites docs/design.md"
    missing = sorted(f"{name}: #{a}" for name, a in cited if a not in headings)
    assert not missing, "cited sections missing from docs/design.md:\n" + "\n".join(missing)


def test_results_record_paths_inside_the_repository_relative_to_it(tmp_path, monkeypatch):
    from mlx_specstream.api import DEFAULT_MODEL
    from mlx_specstream.outputs import recorded_path

    assert recorded_path(DEFAULT_MODEL.resolve()) == "models/specstream-tiny/mlx"
    monkeypatch.chdir(tmp_path)
    assert recorded_path("m") == str(tmp_path.resolve() / "m")  # outside: absolute, wherever it is read


def test_results_meta_names_the_command_time_machine_and_versions(monkeypatch):
    import re

    import mlx.core as mx

    from mlx_specstream.blas import blas_label
    from mlx_specstream.outputs import run_meta

    monkeypatch.setattr("sys.argv", ["scripts/bench_engine.py", "--reps", "3"])
    meta = run_meta(reps=3, model="m")
    assert meta["command"] == "scripts/bench_engine.py --reps 3"
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", meta["date"])
    assert meta["mlx"] == mx.__version__ and meta["blas"] == blas_label() and meta["cpus"] >= 1
    assert meta["reps"] == 3 and meta["model"] == "m" and meta["machine"]
    assert run_meta("specstream-mlx bench --quick")["command"] == "specstream-mlx bench --quick"
    from mlx_specstream.device import on_gpu

    assert meta["device"].startswith("gpu" if on_gpu() else "cpu")
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    if head.returncode == 0:  # a checkout: the commit whose code ran, marked when files differ from it
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], cwd=ROOT).returncode != 0
        assert meta["commit"] == head.stdout.strip() + (" + changes" if dirty else "")


def test_top_level_sources_are_linked_into_the_package_not_copied():
    """cli.py, convert/ and metal/ live at the top of the repository; the package links to them
    (pyproject.toml), so an edit through either path changes the one copy."""
    for name in ("cli.py", "convert", "metal"):
        link = ROOT / "mlx_specstream" / name
        assert link.is_symlink() and link.resolve() == (ROOT / name).resolve(), name


def test_every_module_is_in_the_design_module_table():
    """docs/design.md's module table names every module of the package (one added without a row
    is a module nobody can find by what it is), and names none that does not exist."""
    text = DESIGN.read_text(encoding="utf-8")
    table = text[text.index("| part | module |"):text.index("## Multi-stream architecture")]
    named = set(re.findall(r"`([\w/]+\.(?:py|c))`", table))
    package = ROOT / "mlx_specstream"
    modules = {p.relative_to(package).as_posix() for p in package.rglob("*.py")
               if p.name != "__init__.py" and "arch" not in p.parts and "convert" not in p.parts}
    modules |= {f"convert/{p.name}" for p in (ROOT / "convert").glob("*.py") if p.name != "__init__.py"}
    modules |= {p.name for p in package.glob("*.c")}
    named_files = {n for n in named if not n.startswith("arch/")}
    assert not modules - named_files, f"modules without a row: {sorted(modules - named_files)}"
    assert not named_files - modules, f"rows naming no module: {sorted(named_files - modules)}"
    families = {p.name for p in (package / "arch").glob("*.py")} - {"__init__.py", "base.py"}
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert all(f.removesuffix(".py") in readme for f in families)  # the README's layout names them
