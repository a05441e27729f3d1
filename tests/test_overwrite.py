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
