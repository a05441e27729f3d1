"""``--overwrite`` replaces only what the project wrote: a user's folder or file is never deleted,
whichever command writes (import, Core ML export, training, saving an adapter, the benchmark)."""

import json

import pytest
from helpers import tiny_model
from test_cli import assert_one_line_error, cli

from mlx_specstream.adapter import new_adapter, save_adapter
from mlx_specstream.bench import check_out_dir
from mlx_specstream.data import Dataset, Example
from mlx_specstream.loader import atomic_dir, save_model
from mlx_specstream.train import train


def user_folder(path):
    path.mkdir(parents=True)
    (path / "notes.txt").write_text("mine")
    return path


def untouched(path):
    names = sorted(p.name for p in path.iterdir())
    return names == ["notes.txt"] and (path / "notes.txt").read_text() == "mine"


def test_save_adapter_refuses_a_user_folder(tmp_path):
    model = tiny_model()
    new_adapter(model, gamma=2, msa_layers=2)
    dest = user_folder(tmp_path / "mine")
    with pytest.raises(FileExistsError, match="did not write"):
        save_adapter(model, dest)
    assert untouched(dest)
    save_adapter(model, tmp_path / "a")
    save_adapter(model, tmp_path / "a")  # its own adapter directory is replaced
    assert (tmp_path / "a" / "adapter.safetensors").is_file()


def test_outputs_get_the_permissions_of_any_new_directory(tmp_path):
    import os

    old = os.umask(0o027)
    try:
        with atomic_dir(tmp_path / "m", "model") as tmp:
            save_model(tiny_model(), {}, tmp)
        model = tiny_model()
        new_adapter(model, gamma=2, msa_layers=2)
        save_adapter(model, tmp_path / "a")
    finally:
        os.umask(old)
    for d in ("m", "a"):
        assert (tmp_path / d).stat().st_mode & 0o777 == 0o750  # not mkdtemp's 0700


def test_model_dir_refuses_a_user_folder(tmp_path):
    dest = user_folder(tmp_path / "mine")
    model = tiny_model()
    with pytest.raises(FileExistsError, match="notes.txt"):
        with atomic_dir(dest, "model", overwrite=True) as tmp:
            save_model(model, model.config, tmp)
    assert untouched(dest)


def test_train_refuses_a_user_folder(tmp_path):
    model = tiny_model()
    ds = Dataset([Example(list(range(1, 20)), 4)] * 4)
    for name in ("mine", "new.train"):
        user_folder(tmp_path / name)
    with pytest.raises(FileExistsError, match="did not write"):
        train(model, (ds, None), out=tmp_path / "mine", iters=1, overwrite=True, progress=False)
    with pytest.raises(FileExistsError, match="did not write"):  # its run folder is the user's
        train(model, (ds, None), out=tmp_path / "new", iters=1, overwrite=True, progress=False)
    assert untouched(tmp_path / "mine") and untouched(tmp_path / "new.train")
    report = train(model, (ds, None), out=tmp_path / "ok", iters=1, progress=False, save_every=1)
    assert report["iters"] == 1
    train(model, (ds, None), out=tmp_path / "ok", iters=1, overwrite=True, progress=False)
    assert (tmp_path / "ok" / "adapter.safetensors").is_file()


def test_coreml_export_refuses_a_user_folder(tmp_path):
    pytest.importorskip("coremltools")
    from mlx_specstream.convert.coreml_export import export_coreml

    dest = user_folder(tmp_path / "app.mlpackage")
    with pytest.raises(FileExistsError, match="did not write"):
        export_coreml(tmp_path / "no-model-needed", dest, overwrite=True)
    assert untouched(dest)


def test_bench_out(tmp_path):
    out = user_folder(tmp_path / "res")
    check_out_dir(out, overwrite=False)  # other files are left alone: nothing to replace
    (out / "results.json").write_text('{"mine": 1}')
    with pytest.raises(FileExistsError, match="use --overwrite"):
        check_out_dir(out, overwrite=False)
    with pytest.raises(FileExistsError, match="not a file mlx-specstream wrote"):
        check_out_dir(out, overwrite=True)
    (out / "results.json").write_text(json.dumps({"meta": {"command": "bench"}, "results": []}))
    check_out_dir(out, overwrite=True)
    assert_one_line_error(cli("bench", "--out", str(out)), "--overwrite")
    assert (out / "notes.txt").read_text() == "mine"


def _model_dir(path, text):
    with atomic_dir(path, "model") as tmp:
        save_model(tiny_model(), {"note": text}, tmp)


def test_a_failed_replacement_keeps_the_old_output(tmp_path, monkeypatch):
    """The old output is renamed aside, not deleted, until the new one is in place: when that
    rename fails, the old output comes back (and no temporary directory stays)."""
    import os

    from mlx_specstream import outputs

    dest = tmp_path / "m"
    _model_dir(dest, "old")
    real = os.replace

    def failing(src, dst):
        if str(src).startswith(str(tmp_path / ".m.")) and ".old." not in str(src) and dst == dest:
            raise OSError(5, "Input/output error")
        return real(src, dst)

    monkeypatch.setattr(outputs.os, "replace", failing)
    with pytest.raises(OSError, match="Input/output"):
        with atomic_dir(dest, "model", overwrite=True) as tmp:
            save_model(tiny_model(), {"note": "new"}, tmp)
    assert json.loads((dest / "config.json").read_text())["note"] == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_sigterm_while_writing_leaves_nothing_behind(tmp_path):
    """SIGTERM during a write raises (as Ctrl-C does) so the half-written directory is removed;
    the previous handler is back afterwards."""
    import os
    import signal

    from mlx_specstream.outputs import Terminated

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Terminated):
        with atomic_dir(tmp_path / "m", "model") as tmp:
            (tmp / "config.json").write_text("{}")
            os.kill(os.getpid(), signal.SIGTERM)
    assert list(tmp_path.iterdir()) == []
    assert signal.getsignal(signal.SIGTERM) is before


def test_current_directory_as_the_destination(tmp_path, monkeypatch):
    """``--mlx-path . --overwrite`` inside a model directory the project wrote replaces it (the
    work happens beside it, not inside it)."""
    dest = tmp_path / "m"
    _model_dir(dest, "old")
    monkeypatch.chdir(dest)
    with atomic_dir(".", "model", overwrite=True) as tmp:
        save_model(tiny_model(), {"note": "new"}, tmp)
    assert json.loads((dest / "config.json").read_text())["note"] == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_replace_dirs_removes_a_stale_output_all_or_nothing(tmp_path):
    """A re-export without tokenizer files removes the earlier export's tokenizer directory (``src``
    None); when the package's own move fails, that directory is back as it was."""
    from mlx_specstream.outputs import replace_dirs

    def tokenizer_dir(path):
        path.mkdir()
        (path / "specstream.json").write_text("{}")
        return path

    tok = tokenizer_dir(tmp_path / "t.tokenizer")
    missing = tmp_path / "never-made"
    with pytest.raises(OSError):
        replace_dirs([(None, tok, "Core ML tokenizer"),
                      (missing, tmp_path / "t.mlpackage", "Core ML package")], overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.tokenizer"]
    assert (tok / "specstream.json").is_file()
    new = tmp_path / "new"
    new.mkdir()
    replace_dirs([(None, tok, "Core ML tokenizer"), (new, tmp_path / "t.mlpackage", "Core ML package")],
                 overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.mlpackage"]


def test_a_failed_write_is_an_oserror_and_leaves_nothing(tmp_path, monkeypatch):
    """A full disk makes MLX's writer raise RuntimeError; it reaches the CLI as an OSError naming
    the file (one line there), and the half-written directory is gone."""
    import mlx.core as mx

    from mlx_specstream.errors import USER_ERRORS

    def full_disk(path, *a, **k):
        raise RuntimeError(f"[write] Unable to write {path}")

    monkeypatch.setattr(mx, "save_safetensors", full_disk)
    with pytest.raises(OSError, match="cannot write .*model.safetensors") as e:
        with atomic_dir(tmp_path / "m", "model") as tmp:
            save_model(tiny_model(), {}, tmp)
    assert isinstance(e.value, USER_ERRORS)
    assert list(tmp_path.iterdir()) == []
