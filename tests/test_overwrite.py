"""``--overwrite`` replaces only what the project wrote: a user's folder or file is never deleted,
whichever command writes (import, Core ML export, training, saving an adapter, the benchmark)."""

import json
from pathlib import Path

import pytest
from helpers import tiny_model
from test_cli import assert_one_line_error, cli

from mlx_specstream.adapter import new_adapter, save_adapter
from mlx_specstream.bench import check_out_dir
from mlx_specstream.data import Dataset, Example
from mlx_specstream.loader import atomic_dir, save_model
from mlx_specstream.trainer import train


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
    for overwrite in (False, True):  # said first: the flag would not help
        with pytest.raises(FileExistsError, match="did not write"):
            save_adapter(model, dest, overwrite=overwrite)
    assert untouched(dest)
    save_adapter(model, tmp_path / "a")
    (tmp_path / "a" / "training_report.json").write_text("{}")  # as train writes it
    with pytest.raises(FileExistsError, match="already exists"):  # a trained adapter is not lost
        save_adapter(model, tmp_path / "a")
    assert (tmp_path / "a" / "training_report.json").is_file()
    save_adapter(model, tmp_path / "a", overwrite=True)  # its own adapter directory is replaced
    (tmp_path / "empty").mkdir()
    save_adapter(model, tmp_path / "empty")  # an empty folder holds nothing to lose
    assert (tmp_path / "empty" / "adapter_config.json").is_file()
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["adapter.safetensors",
                                                                  "adapter_config.json"]
    # the same trained adapter saved again over its folder (other n-grams, say) keeps its report;
    # other weights do not take it
    model.adapter_config.training = {"iters": 3, "mode": "lossless"}
    save_adapter(model, tmp_path / "a", overwrite=True)
    (tmp_path / "a" / "training_report.json").write_text('{"history": []}')
    save_adapter(model, tmp_path / "a", overwrite=True)
    assert (tmp_path / "a" / "training_report.json").read_text() == '{"history": []}'
    model.adapter.stream_embed = model.adapter.stream_embed + 1
    save_adapter(model, tmp_path / "a", overwrite=True)
    assert not (tmp_path / "a" / "training_report.json").exists()


def test_save_adapter_writes_a_bare_name_where_load_adapter_reads_it(tmp_path, monkeypatch):
    """``save_adapter(model, "sql")`` as ``train --out sql``: under the model's ``adapters/``,
    which ``load_adapter(model, "sql")`` reads first; ``./sql`` and any ``Path`` are directories."""
    from mlx_specstream.adapter import detach, load_adapter

    model = tiny_model()
    with atomic_dir(tmp_path / "m", "model") as tmp:
        save_model(model, model.config, tmp)
    model.path = tmp_path / "m"
    monkeypatch.chdir(tmp_path)
    new_adapter(model, gamma=2, msa_layers=2)
    assert save_adapter(model, "sql") == tmp_path / "m" / "adapters" / "sql"
    new_adapter(model, gamma=1, msa_layers=1)
    assert save_adapter(model, "./sql") == Path("sql") and save_adapter(model, Path("p")) == Path("p")
    detach(model)
    assert load_adapter(model, "sql").gamma == 2 and load_adapter(model, "./sql").gamma == 1
    monkeypatch.chdir(tmp_path / "p")
    assert load_adapter(model, ".").name == "p"  # a directory by the name it stands for
    model.path = None
    with pytest.raises(ValueError, match="bare adapter name"):
        save_adapter(model, "sql")
    # an empty destination (an unset variable) is said, not read as the current directory
    (tmp_path / "empty").mkdir()
    monkeypatch.chdir(tmp_path / "empty")
    with pytest.raises(ValueError, match="the adapter's destination is empty"):
        save_adapter(model, "")
    assert not any(Path.cwd().iterdir())
    with pytest.raises(TypeError, match="the adapter's destination must be a str or a Path, not NoneType"):
        save_adapter(model, None)
    # an adapter saved without a name (new_adapter, a run in memory) takes its folder's
    assert json.loads((tmp_path / "p" / "adapter_config.json").read_text())["name"] == "p"


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


def test_a_folder_of_model_file_names_without_our_weights_is_not_ours(tmp_path):
    """A user's folder holding only files a model directory may hold (config.json, tokenizer files)
    and no weights carrying the project's mark is refused: nothing shows the project wrote it."""
    dest = tmp_path / "mine"
    dest.mkdir()
    for name, text in (("config.json", '{"my": 1}'), ("tokenizer_config.json", "{}"), ("vocab.txt", "a")):
        (dest / name).write_text(text)
    with pytest.raises(FileExistsError, match="did not write"):
        with atomic_dir(dest, "model", overwrite=True) as tmp:
            save_model(tiny_model(), tiny_model().config, tmp)
    assert (dest / "config.json").read_text() == '{"my": 1}' and (dest / "vocab.txt").exists()


def test_a_model_with_adapters_is_not_replaced_but_finders_litter_is(tmp_path):
    """Replacing a model folder the project wrote would lose the adapters trained for it: refused,
    saying so (not "files it did not write"); a .DS_Store (macOS Finder) is nobody's work."""
    dest = tmp_path / "m"
    with atomic_dir(dest, "model") as tmp:
        save_model(tiny_model(), tiny_model().config, tmp)
    (dest / ".DS_Store").write_bytes(b"\0")
    (dest / "adapters").mkdir()  # empty: nothing to lose
    with atomic_dir(dest, "model", overwrite=True) as tmp:
        save_model(tiny_model(seed=1), tiny_model(seed=1).config, tmp)
    model = tiny_model(seed=1)
    new_adapter(model, gamma=2, msa_layers=2)
    save_adapter(model, dest / "adapters" / "sql")
    with pytest.raises(FileExistsError, match=r"holds adapters/ made for this model: refusing to replace it; "
                                              "move them out first"):
        with atomic_dir(dest, "model", overwrite=True) as tmp:
            save_model(model, model.config, tmp)
    assert (dest / "adapters" / "sql" / "adapter.safetensors").is_file()
    (dest / "thesis.tex").write_text("mine")  # and a file of the user's: what it is said first
    with pytest.raises(FileExistsError, match=r"did not write as a model \(adapters, thesis.tex\)"):
        with atomic_dir(dest, "model", overwrite=True) as tmp:
            save_model(model, model.config, tmp)


def test_a_core_ml_package_not_written_by_the_project_is_not_ours(tmp_path):
    """Every .mlpackage has a Manifest.json and Data: only our metadata makes one replaceable."""
    from mlx_specstream.outputs import check_replaceable

    dest = tmp_path / "MyApp.mlpackage"
    (dest / "Data" / "com.apple.CoreML").mkdir(parents=True)
    (dest / "Manifest.json").write_text("{}")
    (dest / "Data" / "com.apple.CoreML" / "model.mlmodel").write_text("x")
    with pytest.raises(FileExistsError, match="did not write"):
        check_replaceable(dest, "Core ML package", overwrite=True)
    assert (dest / "Manifest.json").read_text() == "{}"


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
    for overwrite in (False, True):  # not a hint to --overwrite, which would be refused too
        with pytest.raises(FileExistsError, match="not a file mlx-specstream wrote"):
            check_out_dir(out, overwrite=overwrite)
    (out / "results.json").write_text(json.dumps({"meta": {"command": "bench", "date": "today",
                                                           "machine": "Linux"}, "results": []}))
    with pytest.raises(FileExistsError, match="use overwrite=True"):  # Python's terms
        check_out_dir(out, overwrite=False)
    check_out_dir(out, overwrite=True)
    assert_one_line_error(cli("bench", "--out", str(out)), "(use --overwrite to replace it)")
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
    for dest in (tmp_path / "m", tmp_path / "new" / "deeper" / "m"):  # folders it made go too
        with pytest.raises(Terminated):
            with atomic_dir(dest, "model") as tmp:
                (tmp / "config.json").write_text("{}")
                os.kill(os.getpid(), signal.SIGTERM)
        assert list(tmp_path.iterdir()) == []
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_ctrl_c_that_python_drops_still_keeps_the_old_output(tmp_path, monkeypatch):
    """Ctrl-C inside a finalizer: Python prints "Exception ignored" and the block goes on, but the
    new output is not put in place (an accidental --overwrite stopped by Ctrl-C kept the old
    model); the previous handler is back afterwards."""
    import os
    import signal

    from mlx_specstream.outputs import write_atomic

    class Finalizer:  # what Ctrl-C landed in, in a user's convert run (regex's Group.__del__)
        def __del__(self):
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):  # the handler runs between these bytecodes, inside __del__
                pass

    dropped = []  # what Python reports as "Exception ignored": the test's path, not a plain Ctrl-C
    monkeypatch.setattr("sys.unraisablehook", lambda u: dropped.append(u.exc_type))
    dest = tmp_path / "m"
    _model_dir(dest, "old")
    # Python's own Ctrl-C, also where this run ignores or blocks it (a background job, a CI runner)
    outside = signal.signal(signal.SIGINT, signal.default_int_handler)
    mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    try:
        with pytest.raises(KeyboardInterrupt):
            with atomic_dir(dest, "model", overwrite=True) as tmp:
                save_model(tiny_model(), {"note": "new"}, tmp)
                Finalizer()  # dropped at once: its KeyboardInterrupt is "ignored"
        assert json.loads((dest / "config.json").read_text())["note"] == "old"
        assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]
        (tmp_path / "f").write_text("old")
        with pytest.raises(KeyboardInterrupt):
            write_atomic(tmp_path / "f", lambda f: (f.write(b"new"), Finalizer()))
        assert (tmp_path / "f").read_text() == "old"
        assert sorted(p.name for p in tmp_path.iterdir()) == ["f", "m"]
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        assert dropped == [KeyboardInterrupt, KeyboardInterrupt]
    finally:
        signal.signal(signal.SIGINT, outside)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


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


def test_train_overwrite_never_reaches_inside_a_user_run_folder(tmp_path):
    """A NAME.train folder is the project's only when everything in it is: user files among its
    checkpoints or distilled data make --overwrite refuse it, and nothing is deleted."""
    model = tiny_model()
    ds = Dataset([Example(list(range(1, 20)), 4)] * 4)
    run = tmp_path / "victim.train"
    (run / "checkpoints" / "my-experiment").mkdir(parents=True)
    (run / "checkpoints" / "my-experiment" / "model.bin").write_text("w")
    (run / "distilled").mkdir()
    (run / "distilled" / "mine.csv").write_text("d")
    with pytest.raises(FileExistsError, match="checkpoints/my-experiment"):
        train(model, (ds, None), out=tmp_path / "victim", iters=1, overwrite=True, progress=False)
    assert (run / "checkpoints" / "my-experiment" / "model.bin").read_text() == "w"
    assert (run / "distilled" / "mine.csv").read_text() == "d"


def test_train_keeps_the_earlier_run_until_its_inputs_are_read(tmp_path):
    """--overwrite removes the earlier run's checkpoints only once the new run's data and --init
    have been read: a run that fails on them leaves them. --resume with nothing to resume does
    not silently retrain over a finished adapter."""
    from mlx_specstream.checkpoint import checkpoints

    model = tiny_model()
    ds = Dataset([Example(list(range(1, 20)), 4)] * 4)
    out = tmp_path / "a"
    train(model, (ds, None), out=out, iters=2, save_every=1, progress=False)
    before = checkpoints(tmp_path / "a.train" / "checkpoints")
    with pytest.raises(ValueError, match="no such data directory"):
        train(model, tmp_path / "no-data", out=out, iters=2, overwrite=True, progress=False)
    with pytest.raises(ValueError, match="nope"):  # an --init adapter that does not exist
        train(model, (ds, None), out=out, iters=2, overwrite=True, init=tmp_path / "nope", progress=False)
    assert checkpoints(tmp_path / "a.train" / "checkpoints") == before and before
    import shutil

    shutil.rmtree(tmp_path / "a.train")
    weights = (out / "adapter.safetensors").read_bytes()
    with pytest.raises(FileExistsError, match="no checkpoint .* to resume from"):
        train(model, (ds, None), out=out, iters=2, resume=True, progress=False)
    assert (out / "adapter.safetensors").read_bytes() == weights


@pytest.mark.parametrize("option,value,fragment", [
    ("lr", float("nan"), "lr must be a finite number >= 0, not nan"),
    ("lr", -1.0, "lr must be a finite number >= 0"),
    ("fine_tune_lr", float("inf"), "fine_tune_lr must be a finite number >= 0"),
    ("prune_weight", -1.0, "prune_weight must be a finite number >= 0"),
    ("alphas", "0,nan", "alphas must be finite numbers >= 0"),
    ("epochs", float("inf"), "epochs must be a finite number > 0"),
    ("seed", -1, r"seed must be a whole number in 0\.\.2\*\*64 - 1, not -1"),
    ("warmup", -1, "warmup must be a whole number >= 0"),
    ("segment_len", -1, "segment_len must be a whole number >= 0"),
    ("val_batches", -1, "val_batches must be a whole number >= 0"),
    ("alphas", "0,abc", "alphas must be numbers"),
    ("iters", 0, "iters must be a whole number >= 1, not 0"),
    ("accept_prompts", -1, "accept_prompts must be a whole number >= 0"),
    ("max_seq_len", 8192, "max_seq_len is 8192, beyond the"),
    ("gamma", 0, "gamma must be a whole number >= 1, not 0"),
    ("rank", 0, "rank must be a whole number >= 1, not 0"),
    ("msa_layers", 0, "msa_layers must be a whole number >= 1, not 0"),
    ("msa_layers", 99, "msa_layers must be at most the model's 4 layers, not 99"),
])
def test_train_refuses_nonsense_numbers_before_anything(tmp_path, option, value, fragment):
    """A NaN learning rate used to train and save an adapter of NaN weights; each of these is
    refused with the option named, before anything is written."""
    from mlx_specstream.errors import OptionError

    ds = Dataset([Example(list(range(1, 20)), 4)] * 4)
    opts = {"iters": None if option == "epochs" else 1, "progress": False,
            "mode": "shared" if option == "fine_tune_lr" else "lossless", option: value}
    with pytest.raises((OptionError, ValueError), match=fragment):
        train(tiny_model(max_position_embeddings=2048), (ds, None), out=tmp_path / "x", **opts)
    assert list(tmp_path.iterdir()) == []


def test_a_failed_train_leaves_no_new_folder_and_a_name_with_a_slash_is_a_path(tmp_path):
    from mlx_specstream.errors import OptionError
    from mlx_specstream.trainer import _resolve_out

    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text('{"prompt": [1, 2], "completion": [3]}\n{"prompt": [1]}\n')
    with pytest.raises(ValueError, match="train.jsonl:2: has 'prompt' but no 'completion'"):
        train(tiny_model(), data, out=tmp_path / "new" / "deep" / "ad", iters=1, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]
    model_dir = tmp_path / "m"
    assert _resolve_out("ad", model_dir) == (model_dir / "adapters" / "ad", "ad", True)
    assert _resolve_out("ad/", model_dir) == (Path("ad"), "ad", False)  # a path: saved where it says
    with pytest.raises(OptionError, match="out is empty"):
        _resolve_out("", model_dir)


def test_train_stops_when_the_loss_diverges(tmp_path, monkeypatch):
    """A loss that turns NaN ends the run with an error and no adapter saved."""
    import mlx.core as mx

    from mlx_specstream import training_run as train_module

    real = train_module.batch_gradients

    def nan_loss(*a, **k):
        loss, grads = real(*a, **k)
        return loss * mx.array(float("nan")), grads

    monkeypatch.setattr(train_module, "batch_gradients", nan_loss)
    ds = Dataset([Example(list(range(1, 20)), 4)] * 4)
    with pytest.raises(ValueError, match="step 1: the training loss is nan"):
        train(tiny_model(), (ds, None), out=tmp_path / "x", iters=2, progress=False)
    assert not (tmp_path / "x").exists()


def test_a_scripts_out_replaces_only_a_results_file_it_wrote(tmp_path):
    """scripts/*.py --out: refused before any work when it is a user's file (with --overwrite too)
    or cannot be written; a results file the project wrote is replaced only with --overwrite."""
    import argparse

    from mlx_specstream.outputs import parse_script_args, run_meta, write_results_file

    notes, ours = tmp_path / "notes.txt", tmp_path / "ours.json"
    notes.write_text("mine")
    write_results_file(ours, run_meta(), [])
    for argv in ([str(notes)], [str(notes), "--overwrite"], [str(notes / "r.json")], [str(ours)]):
        with pytest.raises(SystemExit):
            parse_script_args(argparse.ArgumentParser(prog="script"), ["--out", *argv])
    for argv in ([str(ours), "--overwrite"], [str(tmp_path / "new" / "r.json")]):
        args = parse_script_args(argparse.ArgumentParser(prog="script"), ["--out", *argv])
        assert args.out == Path(argv[0])
    assert notes.read_text() == "mine" and not (tmp_path / "new").exists()
    # what a script passes on to a command it runs keeps that command's options (--over is not --overwrite)
    args = parse_script_args(argparse.ArgumentParser(), ["--over", "ft", "--n", "2"], pass_through=True)
    assert not args.overwrite and args.passed == ["--over", "ft", "--n", "2"]


def test_every_script_checks_its_results_file_before_the_work():
    scripts = Path(__file__).resolve().parent.parent / "scripts"
    writers = [p for p in scripts.glob("*.py") if "write_results_file(" in p.read_text()
               or "write_text_atomic(args.out," in p.read_text()]
    assert len(writers) >= 10
    assert [p.name for p in writers if "outputs.parse_script_args(ap" not in p.read_text()] == []


def test_a_recorded_command_names_no_directory_of_the_machine(tmp_path, monkeypatch):
    """Run from the repository's root, its paths are recorded relative to it (the command runs
    again there); run elsewhere, as typed, with the directory it ran in (it runs again there)."""
    from mlx_specstream.outputs import cli_command, recorded_command, run_meta
    from mlx_specstream.project import REPOSITORY

    argv = [f"{REPOSITORY}/.venv/bin/specstream-mlx", "bench", "--out", f"{REPOSITORY}/results/x",
            f"--model={REPOSITORY}/models/m", "--task", "a b", "/elsewhere/y"]
    monkeypatch.chdir(REPOSITORY)
    assert recorded_command(argv) == (".venv/bin/specstream-mlx bench --out results/x --model=models/m "
                                      "--task 'a b' /elsewhere/y")
    assert run_meta("c")["cwd"] == "."
    monkeypatch.chdir(tmp_path)  # a relative --data here and an absolute --adapter: both run again here
    argv = [f"{REPOSITORY}/.venv/bin/specstream-mlx", "bench", "--data", "mine",
            "--adapter", f"{REPOSITORY}/models/m/adapters/a"]
    assert recorded_command(argv) == " ".join(argv)
    assert run_meta("c")["cwd"] == str(tmp_path.resolve())
    # run as a module, the command is the module's (its file would not run as a command)
    argv = [str(REPOSITORY / "mlx_specstream" / "cli.py"), "train", "--out", "a b"]
    assert recorded_command(argv) == "python -m mlx_specstream.cli train --out 'a b'"
    monkeypatch.setattr("sys.argv", argv)
    assert cli_command() == recorded_command(argv)
    monkeypatch.setattr("sys.argv", ["/x/ipykernel_launcher.py", "-f", "k.json"])
    assert cli_command() is None  # a notebook: no command to record


def test_an_empty_folder_or_a_checkpoints_ngrams_is_nothing_to_keep(tmp_path, monkeypatch):
    """An empty folder is taken as the output without --overwrite (nothing in it to lose); a
    checkpoint that `ngrams --adapter CHECKPOINT` wrote n-grams into is still the run's."""
    from mlx_specstream.outputs import check_replaceable, foreign_entries

    empty = tmp_path / "empty"
    empty.mkdir()
    check_replaceable(empty, "adapter", overwrite=False)
    # but not one that cannot be moved aside: a mount point (the working directory can be)
    monkeypatch.setattr("os.path.ismount", lambda p: Path(p) == empty)
    with pytest.raises(FileExistsError, match="is a mount point: it cannot be replaced"):
        check_replaceable(empty, "adapter", overwrite=True)
    monkeypatch.undo()
    (empty / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="did not write"):
        check_replaceable(empty, "adapter", overwrite=True)
    step = tmp_path / "run.train" / "checkpoints" / "step-0000020"
    step.mkdir(parents=True)
    for f in ("state.json", "adapter.safetensors", "adapter_config.json", "ngrams.npz"):
        (step / f).write_text("")
    assert foreign_entries(tmp_path / "run.train", "training run") == []


def test_the_tokenizer_travels_with_its_named_chat_templates(tmp_path):
    """convert and the Core ML export copy a model's tokenizer, additional_chat_templates/ too
    (a tool_use template), and a model folder that holds it is still ours to replace."""
    from mlx_specstream.outputs import copy_tokenizer, foreign_entries

    src, dest = tmp_path / "src", tmp_path / "dest"
    (src / "additional_chat_templates").mkdir(parents=True)
    (src / "additional_chat_templates" / "tool_use.jinja").write_text("T")
    (src / "tokenizer.json").write_text("{}")
    _model_dir(dest, "ours")
    copy_tokenizer(src, dest)
    assert (dest / "additional_chat_templates" / "tool_use.jinja").read_text() == "T"
    assert foreign_entries(dest, "model") == []


def test_a_failed_atomic_write_names_the_file_asked_for(tmp_path):
    """Not the temporary file beside it, which the user never asked for."""
    from mlx_specstream.outputs import write_atomic

    with pytest.raises(FileNotFoundError, match=f"^cannot write {tmp_path / 'no' / 'f.json'}: No such file"):
        write_atomic(tmp_path / "no" / "f.json", lambda f: f.write(b"x"))


def test_sigterm_during_an_atomic_file_write_leaves_no_temporary_file(tmp_path):
    """SIGTERM while ``write_atomic`` fills its temporary file: the file goes, the old one stays (a
    kill by the signal's default action used to leave ``.NAME.tmpPID``, which then made the
    adapter folder look like a user's)."""
    import os
    import signal

    from mlx_specstream.outputs import Terminated, write_atomic

    (tmp_path / "a.txt").write_text("old")

    def halfway(f):
        f.write(b"new")
        os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(Terminated):
        write_atomic(tmp_path / "a.txt", halfway)
    assert [p.name for p in tmp_path.iterdir()] == ["a.txt"] and (tmp_path / "a.txt").read_text() == "old"


def test_resume_where_there_is_no_run(tmp_path):
    """``resume`` with no checkpoint is refused, before any work, rather than starting a new run (a
    bare name hints at the model the run was started under); a run stopped before its first
    checkpoint (its folder holds the data it made) starts again; ``overwrite`` with ``resume``
    continues or starts."""
    from mlx_specstream.errors import OptionError
    from mlx_specstream.trainer import _check_out

    hint = "a run keeps its checkpoints under the model it was started with"
    with pytest.raises(OptionError, match=rf"a.train.checkpoints: no run to resume here \({hint}"):
        _check_out(tmp_path / "a", resume=True, overwrite=False, bare=True)
    with pytest.raises(OptionError) as e:
        _check_out(tmp_path / "a", resume=True, overwrite=False, bare=False)  # a path: its own place
    assert str(e.value).endswith("no run to resume here; overwrite=True with resume=True starts a run where "
                                 "there is none") and hint not in str(e.value)
    _check_out(tmp_path / "a", resume=True, overwrite=True, bare=True)
    (tmp_path / "a.train" / "distilled").mkdir(parents=True)
    _check_out(tmp_path / "a", resume=True, overwrite=False, bare=True)  # stopped before step 1
    (tmp_path / "a").mkdir()  # a finished adapter without checkpoints: never replaced by a resume
    with pytest.raises(FileExistsError, match=rf"a: no checkpoint in .* to resume from \({hint}"):
        _check_out(tmp_path / "a", resume=True, overwrite=False, bare=True)


def test_one_run_writes_an_adapter_at_a_time(tmp_path, monkeypatch):
    """A run whose adapter another run is writing (its folder held, as a run holds it while it
    lasts) is refused at its start, whatever its flags, rather than replacing that run's adapter
    and checkpoints when it ends; the held run's folder is left as it was; once let go, a run
    goes ahead. A refused run leaves no folder behind, nor does one that writes nothing."""
    import errno
    import os
    import shutil

    from mlx_specstream.checkpoint import RUN_LOCK, run_held
    from mlx_specstream.errors import OutputExistsError

    ds = Dataset([Example([3, 4, 5, 6, 7, 8], 2)] * 8)
    opts = dict(mode="lossless", gamma=2, msa_layers=1, iters=1, batch_size=4, progress=False,
                log=lambda m: None, self_distill=False)
    work = tmp_path / "a.train"
    with run_held(work):
        before = sorted(os.listdir(work))
        for flags in ({}, {"overwrite": True}, {"resume": True, "overwrite": True}):
            held = rf"a: another training run \(process {os.getpid()}\) is writing this adapter"
            with pytest.raises(OutputExistsError, match=held):
                train(tiny_model(), (ds, None), out=tmp_path / "a", **opts, **flags)
        assert sorted(os.listdir(work)) == before == [RUN_LOCK] and not (tmp_path / "a").exists()
        step = work / "checkpoints" / "step-0000001"  # the held run's checkpoint: not one to resume
        step.mkdir(parents=True)
        (step / "state.json").write_text("{}")
        with pytest.raises(OutputExistsError, match=held):
            train(tiny_model(), (ds, None), out=tmp_path / "a", **opts)
        shutil.rmtree(work / "checkpoints")
    assert not work.exists()  # held, and nothing written: no folder left
    train(tiny_model(), (ds, None), out=tmp_path / "a", **opts)
    assert (tmp_path / "a" / "adapter.safetensors").is_file()
    with pytest.raises(OutputExistsError, match="already exists"):  # refused by what is there, as before
        train(tiny_model(), (ds, None), out=tmp_path / "a", **opts)
    train(tiny_model(), (ds, None), out=tmp_path / "a", overwrite=True, **opts)
    # a file system without locks (some network mounts): the run goes on, unheld, and says so
    import fcntl

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with pytest.warns(UserWarning, match="this file system does not lock files"):
        train(tiny_model(), (ds, None), out=tmp_path / "a", overwrite=True, **opts)


def test_our_leftovers_and_links_in_an_adapters_place(tmp_path):
    """A temporary report or n-gram file a kill left in an adapter folder is the project's (the
    folder can be replaced); a dangling link where the run's folder goes is refused before any
    work; a failure inside an atomic directory names the output asked for, not the temporary one."""
    import errno

    from mlx_specstream.trainer import _check_out

    model = tiny_model()
    new_adapter(model, gamma=2, msa_layers=1)
    save_adapter(model, tmp_path / "a")
    (tmp_path / "a" / ".training_report.json.tmp4242").write_text("{")
    save_adapter(model, tmp_path / "a", overwrite=True)
    (tmp_path / "b.train").symlink_to(tmp_path / "nowhere")
    with pytest.raises(FileExistsError, match="b.train"):
        _check_out(tmp_path / "b", resume=False, overwrite=True, bare=False)
    with pytest.raises(OSError) as e:
        with atomic_dir(tmp_path / "c", "adapter") as tmp:
            raise OSError(errno.ENOSPC, f"cannot write {tmp / 'adapter.safetensors'}: No space left")
    assert str(tmp_path / "c" / "adapter.safetensors") in str(e.value) and ".c." not in str(e.value)
    assert e.value.errno == errno.ENOSPC


def test_bench_results_are_written_together_and_judged_one_by_one(tmp_path, monkeypatch):
    """The three results files appear together or not at all; each is replaced only if it is the
    one this project wrote (by the sha256 its results.json records), so a user's notes saved as
    results.md survive ``--overwrite``."""
    from mlx_specstream import bench

    meta = {"command": "bench", "reference": "ar", "task": "sql", "model": "m", "prompts": 1,
            "date": "today", "machine": "Linux", "blas": "x"}
    results = [{"method": "ar", "speedup": 1.0, "speedup_ci95": [1.0, 1.0], "mean_accepted_tokens": 1.0}]
    monkeypatch.setattr(bench, "results_markdown", lambda m, r: "a table\n")
    out = tmp_path / "r"
    bench.write_results(out, meta, results, overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == ["results.json", "results.md", "results.png"]
    check_out_dir(out, overwrite=True)  # all ours
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def failing(m, r):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(bench, "results_plot", failing)
    with pytest.raises(OSError):
        bench.write_results(out, {**meta, "date": "later"}, results, overwrite=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # the earlier set, whole
    (out / "results.md").write_text("my own notes, not a table")
    with pytest.raises(FileExistsError, match="results.md: not a file mlx-specstream wrote"):
        check_out_dir(out, overwrite=True)
    # a user's own results.json (a "command" in its meta, but no run's date and machine) is no run's
    (out / "results.md").unlink()
    (out / "results.json").write_text(json.dumps({"meta": {"command": "my experiment"}, "results": [1]}))
    with pytest.raises(FileExistsError, match="results.json: not a file mlx-specstream wrote"):
        check_out_dir(out, overwrite=True)


def test_a_core_ml_write_failure_is_an_oserror_naming_the_package(tmp_path):
    """coremltools' MIL FileWriter raises RuntimeError on a full disk: one line on the command line,
    like any other failed write; other RuntimeErrors stay what they are."""
    from mlx_specstream.convert.coreml_export import _write_errors_as_os_errors
    from mlx_specstream.errors import USER_ERRORS

    out = tmp_path / "x.mlpackage"
    with pytest.raises(OSError, match=f"^cannot write {out}: \\[MIL FileWriter\\]") as e:
        with _write_errors_as_os_errors(out):
            raise RuntimeError("[MIL FileWriter]: Unknown error occurred while writing data to the "
                               "file.\nmore")
    assert isinstance(e.value, USER_ERRORS)
    with pytest.raises(RuntimeError, match="a bug"):
        with _write_errors_as_os_errors(out):
            raise RuntimeError("a bug")
    # its C++ copy's, naming temporary paths the user never gave: said without them
    said = f"^cannot write {out}: filesystem error: cannot copy: Input/output error " + r"\(is the disk full"
    with pytest.raises(OSError, match=said):
        with _write_errors_as_os_errors(out):
            raise RuntimeError("filesystem error: cannot copy: Input/output error [/tmp/.x.mlpackage.1/a] "
                               "[/tmp/tmp1.mlpackage/b]")


def test_results_of_earlier_versions_a_failed_rename_and_a_plot_the_new_set_lacks(tmp_path, monkeypatch):
    """Results written before files were recorded are still ours (results.md by its first line);
    a rename that fails halfway puts the earlier set back; a set written without a plot takes the
    earlier plot away with the rest of its set."""
    import shutil

    from mlx_specstream import bench, outputs

    shipped = tmp_path / "shipped"
    shutil.copytree(Path(__file__).resolve().parent.parent / "results" / "bench-sql", shipped)
    check_out_dir(shipped, overwrite=True)
    before = {p.name: p.read_bytes() for p in shipped.iterdir()}
    real = os_replace = outputs.os.replace

    def failing(src, dst):
        if Path(dst).name == "results.md" and ".tmp" in Path(src).name:
            raise OSError(28, "No space left on device")
        return real(src, dst)

    meta = {"command": "bench", "reference": "ar", "task": "sql", "model": "m", "prompts": 1, "date": "now",
            "machine": "Linux", "blas": "x"}
    results = [{"method": "ar", "speedup": 1.0, "speedup_ci95": [1.0, 1.0], "mean_accepted_tokens": 1.0}]
    monkeypatch.setattr(bench, "results_markdown", lambda m, r: "a table\n")
    monkeypatch.setattr(outputs.os, "replace", failing)
    with pytest.raises(OSError, match=f"^cannot write {shipped / 'results.md'}: No space"):
        bench.write_results(shipped, meta, results, overwrite=True)
    assert {p.name: p.read_bytes() for p in shipped.iterdir()} == before
    monkeypatch.setattr(outputs.os, "replace", os_replace)
    monkeypatch.setattr(bench, "results_plot", lambda m, r: None)  # no matplotlib
    bench.write_results(shipped, meta, results, overwrite=True)
    assert sorted(p.name for p in shipped.iterdir()) == ["results.json", "results.md"]
    check_out_dir(shipped, overwrite=True)


def test_sigterm_inside_a_held_block_waits_for_its_end(tmp_path):
    """Inside ``signals_held`` (an adapter and its report saved together) a write's own SIGTERM
    handling stands aside: the signal acts once the block is over, every file written."""
    import os
    import signal

    from mlx_specstream.outputs import signals_held, write_atomic

    class Stopped(Exception):
        pass

    def stop(signum, frame):
        raise Stopped

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        with pytest.raises(Stopped):
            with signals_held():
                write_atomic(tmp_path / "a", lambda f: (f.write(b"a"), os.kill(os.getpid(), signal.SIGTERM)))
                write_atomic(tmp_path / "b", lambda f: f.write(b"b"))
        assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_an_existing_output_is_said_in_the_callers_terms(tmp_path, capsys):
    """Python callers read ``overwrite=True``; the command line and the scripts ``--overwrite``."""
    import argparse

    from mlx_specstream.errors import OutputExistsError
    from mlx_specstream.outputs import parse_script_args, results_text

    model = tiny_model()
    new_adapter(model, gamma=2, msa_layers=2)
    save_adapter(model, tmp_path / "a")
    with pytest.raises(OutputExistsError) as e:
        save_adapter(model, tmp_path / "a")
    assert str(e.value) == f"{tmp_path / 'a'} already exists (use overwrite=True to replace it)"
    assert e.value.render("cli") == f"{tmp_path / 'a'} already exists (use --overwrite to replace it)"
    (tmp_path / "r.json").write_text(results_text({"command": "x", "date": "now", "machine": "Linux"}, []))
    with pytest.raises(SystemExit):
        parse_script_args(argparse.ArgumentParser(prog="script"), ["--out", str(tmp_path / "r.json")])
    assert capsys.readouterr().err.endswith("r.json already exists (use --overwrite to replace it)\n")


def test_train_touches_no_file_through_a_lock_link_nor_a_checkpoint_copy(tmp_path):
    """A ``lock`` in a run folder that links elsewhere is not the run's: it was opened and
    truncated through the link. A checkpoint copied under another name (``step-0000002-keep``)
    is the user's: rotation deleted it and --resume started from it; now the folder is refused,
    as any holding what the project did not write."""
    from mlx_specstream.checkpoint import checkpoints

    model = tiny_model()
    ds = Dataset([Example(list(range(1, 20)), 4)] * 4)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (tmp_path / "lk.train").mkdir()
    (tmp_path / "lk.train" / "lock").symlink_to(victim)
    with pytest.raises(FileExistsError, match="lock"):
        train(model, (ds, None), out=tmp_path / "lk", iters=1, progress=False)
    with pytest.raises(FileExistsError, match="lock"):
        train(model, (ds, None), out=tmp_path / "lk", iters=1, overwrite=True, progress=False)
    assert victim.read_text() == "precious"

    import shutil

    out = tmp_path / "a"
    train(model, (ds, None), out=out, iters=2, save_every=1, progress=False)
    ckpts = tmp_path / "a.train" / "checkpoints"
    keep = ckpts / "step-0000002-keep"
    shutil.copytree(ckpts / "step-0000002", keep)
    for given in ({"resume": True}, {"overwrite": True}):
        with pytest.raises(FileExistsError, match="step-0000002-keep"):
            train(model, (ds, None), out=out, iters=4, save_every=1, progress=False, **given)
    assert keep.is_dir() and [p.name for p in checkpoints(ckpts)] == ["step-0000001", "step-0000002"]


def test_train_replaces_no_adapter_it_was_not_asked_to(tmp_path):
    """An adapter put at ``out`` while the run trains is not replaced at its end unless
    ``overwrite`` (or ``resume``) was given; ``--overwrite`` does not clear the run folder that
    holds the checkpoint the run starts from (``init``)."""
    from mlx_specstream.errors import OptionError, OutputExistsError

    model = tiny_model()
    ds = Dataset([Example(list(range(1, 20)), 4)] * 4)
    theirs = tmp_path / "theirs"
    train(model, (ds, None), out=theirs, iters=1, progress=False)
    out = tmp_path / "b"

    def meanwhile(step, info):
        if not out.exists():
            shutil.copytree(theirs, out)

    import shutil

    with pytest.raises(OutputExistsError, match="appeared during the run and is not replaced: move it away"):
        train(model, (ds, None), out=out, iters=2, progress=False, callback=meanwhile)
    assert (out / "adapter.safetensors").read_bytes() == (theirs / "adapter.safetensors").read_bytes()
    init = tmp_path / "theirs.train" / "checkpoints" / "step-0000001"
    with pytest.raises(OptionError, match="init .*step-0000001 is in the folder of the run that overwrite"):
        train(model, (ds, None), out=theirs, iters=1, overwrite=True, init=init, progress=False)
    assert init.is_dir()


def test_bench_results_judged_again_as_they_are_written(tmp_path, monkeypatch):
    """A results file that appears while the benchmark runs (after its first check) is not
    replaced: a user's notes, or another run's results without --overwrite. A write that fails
    leaves no folder it made."""
    from mlx_specstream import bench
    from mlx_specstream.errors import OutputExistsError

    meta = {"command": "bench", "reference": "ar", "task": "sql", "model": "m", "prompts": 1,
            "date": "today", "machine": "Linux", "blas": "x"}
    results = [{"method": "ar", "speedup": 1.0, "speedup_ci95": [1.0, 1.0], "mean_accepted_tokens": 1.0}]
    monkeypatch.setattr(bench, "results_markdown", lambda m, r: "a table\n")
    monkeypatch.setattr(bench, "results_plot", lambda m, r: None)
    out = tmp_path / "r"
    out.mkdir()
    (out / "results.md").write_text("USER NOTES")
    with pytest.raises(FileExistsError, match="results.md: not a file mlx-specstream wrote"):
        bench.write_results(out, meta, results, overwrite=True)
    assert [p.name for p in out.iterdir()] == ["results.md"]
    assert (out / "results.md").read_text() == "USER NOTES"
    other = tmp_path / "s"
    bench.write_results(other, meta, results, overwrite=False)
    with pytest.raises(OutputExistsError, match="already exists"):
        bench.write_results(other, {**meta, "date": "later"}, results, overwrite=False)
    assert "today" in (other / "results.json").read_text()

    def full_disk(self, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_bytes", full_disk)
    with pytest.raises(OSError, match=f"^cannot write {tmp_path / 'x' / 'y' / 'results.json'}: No space"):
        bench.write_results(tmp_path / "x" / "y", meta, results, overwrite=False)
    assert not (tmp_path / "x").exists()


def test_a_read_only_folder_is_refused_before_the_work(tmp_path, monkeypatch):
    """Replacing a folder moves it aside, which needs write permission on it: said at the check,
    not after the work as a rename between temporary paths. (As root every folder is writable,
    so the permission is what os.access says.)"""
    from mlx_specstream import outputs

    with atomic_dir(tmp_path / "m", "model") as tmp:
        save_model(tiny_model(), {}, tmp)
    monkeypatch.setattr(outputs.os, "access", lambda path, mode: Path(path) != tmp_path / "m")
    with pytest.raises(PermissionError, match="m: not writable, so it cannot be replaced"):
        outputs.check_replaceable(tmp_path / "m", "model", overwrite=True)


def test_a_name_with_a_control_character_is_refused(tmp_path):
    from mlx_specstream.errors import AdapterError

    model = tiny_model()
    new_adapter(model, gamma=2, msa_layers=1)
    with pytest.raises(AdapterError, match="control character"):
        save_adapter(model, tmp_path / "a\nb")
    assert list(tmp_path.iterdir()) == []


def test_the_run_lock_is_never_opened_through_a_link_nor_a_folder(tmp_path):
    """The lock itself refuses a link or a folder by its name, whatever checked the folder
    before (a link made between the check and the lock)."""
    from mlx_specstream.checkpoint import _lock

    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    for name, make in (("linked", lambda p: p.symlink_to(victim)), ("folder", lambda p: p.mkdir())):
        work = tmp_path / f"{name}.train"
        work.mkdir()
        make(work / "lock")
        with pytest.raises(FileExistsError, match="not the lock file of a training run"):
            _lock(work)
    assert victim.read_text() == "precious"


def test_checkpoint_names_past_seven_digits():
    """Steps past 9,999,999 are written in more digits: still checkpoints, not the user's."""
    import fnmatch

    from mlx_specstream.checkpoint import checkpoint_name
    from mlx_specstream.outputs import CHECKPOINT_NAMES

    for step in (1, 9_999_999, 123_456_789):
        assert any(fnmatch.fnmatchcase(checkpoint_name(step), pat) for pat in CHECKPOINT_NAMES)
    assert not any(fnmatch.fnmatchcase("step-0000002-keep", pat) for pat in CHECKPOINT_NAMES)


def test_an_empty_folder_given_is_filled_not_replaced(tmp_path, monkeypatch):
    """An empty folder as the output keeps its permissions (and a shell inside it its place): it
    was replaced by a new one. A failure leaves it empty, as it was."""
    import os
    import stat

    from mlx_specstream import outputs

    model = tiny_model()
    new_adapter(model, gamma=2, msa_layers=1)
    d = tmp_path / "mine"
    d.mkdir(mode=0o700)
    inode = d.stat().st_ino
    save_adapter(model, d)
    assert d.stat().st_ino == inode and stat.S_IMODE(d.stat().st_mode) == 0o700
    assert (d / "adapter_config.json").is_file() and (d / "adapter.safetensors").is_file()
    e = tmp_path / "empty"
    e.mkdir()
    real = os.replace

    def failing(src, dst):
        if Path(dst).name == "adapter_config.json":
            raise OSError(28, "No space left on device")
        return real(src, dst)

    monkeypatch.setattr(outputs.os, "replace", failing)
    with pytest.raises(OSError, match="No space"):
        save_adapter(model, e)
    assert e.is_dir() and list(e.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "mine"]  # no temporary folder left
