"""The CLI: errors are one line on stderr with a non-zero exit, never a traceback."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import tiny_model

from mlx_specstream.adapter import new_adapter, save_adapter
from mlx_specstream.loader import atomic_dir, save_model


def cli(*args, stdin=None):
    return subprocess.run([sys.executable, "-m", "mlx_specstream.cli", *args], capture_output=True,
                          text=True, input=stdin, timeout=600)


def assert_one_line_error(res, fragment):
    assert res.returncode != 0
    assert "Traceback" not in res.stderr, res.stderr
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and fragment in lines[0], res.stderr


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("m") / "tiny"
    model = tiny_model("llama")
    with atomic_dir(d, "model") as tmp:
        save_model(model, model.config, tmp)
    new_adapter(model, gamma=2, msa_layers=2)
    save_adapter(model, d / "adapters" / "a")
    return d


def test_generate_errors(model_dir, tmp_path):
    assert_one_line_error(cli("generate", "--model", str(tmp_path / "nope"), "--prompt", "x"),
                          "no such model directory")
    assert_one_line_error(cli("generate", "--model", str(model_dir), "--prompt", "x", "--top-k", "5"),
                          "--top-k cuts what sampling draws from, and --temp 0 decodes greedily")
    assert_one_line_error(cli("generate", "--model", str(model_dir), "--prompt", "x", "--seed", "3"),
                          "--seed seeds sampling, and --temp 0 decodes greedily: give --temp > 0 to sample")
    for command in (["generate", "--prompt", "x"], ["bench", "--quick"], ["ngrams", "--data", str(tmp_path)]):
        assert_one_line_error(cli(*command, "--model", str(tmp_path / "nope"), "--adapter", "a"),
                              f"{tmp_path / 'nope'}: no such model directory")  # not: adapter 'a' not found
    assert_one_line_error(cli("generate", "--model", str(model_dir), "--adapter", "zzz", "--prompt", "x"),
                          "adapter 'zzz' not found")
    assert_one_line_error(cli("generate", "--model", str(model_dir), "--prompt", "x"), "no tokenizer")
    assert_one_line_error(cli("generate", "--model", str(model_dir), "--prompt", "x",
                              "--prompt-file", str(tmp_path / "p.txt")), "not both")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text('{"model_type": "gpt-j"}')
    (bad / "model.safetensors").write_bytes(b"")
    assert_one_line_error(cli("generate", "--model", str(bad), "--prompt", "x"), "gpt-j")


def test_an_empty_or_a_file_path_is_said_as_such(model_dir, tmp_path, monkeypatch):
    """An empty path or name (an unset shell variable) is not read as the current directory, and a
    file where a folder belongs is said to be one, from the command line and in Python; -h and
    --version answer as users of other tools expect."""
    from mlx_specstream.adapter import resolve_adapter
    from mlx_specstream.api import load
    from mlx_specstream.cli import empty_path
    from mlx_specstream.errors import AdapterError, OptionError
    from mlx_specstream.loader import CheckpointError
    from mlx_specstream.trainer import train

    res = cli("generate", "--model", str(model_dir), "--adapter", "", "--prompt", "x")
    assert (res.returncode, res.stderr) == (2, "error: --adapter is empty: give a name or path\n")
    assert empty_path(["generate", "-m=", "-p", "x"]) == "--model is empty: give a path"
    assert empty_path(["train", "--data", "d", "--out", ""]) == "--out is empty: give a name or path"
    assert empty_path(["generate", "-p", "", "--model", "."]) is None  # an empty prompt is said otherwise
    assert empty_path(["generate", "--", "--model", ""]) is None
    assert empty_path(["generate", "-p", "--model=", "--system-prompt", "--out="]) is None  # values, as typed
    assert empty_path(["bench", "--out", ""]) == "--out is empty: give a path"  # no adapter there
    text = tmp_path / "notes.txt"
    text.write_text("mine")
    assert_one_line_error(cli("generate", "--model", str(text), "--prompt", "x"),
                          f"{text}: a file, not a model directory")
    assert_one_line_error(cli("generate", "--model", str(model_dir), "--adapter", str(text), "--prompt", "x"),
                          f"{text}: a file, not an adapter directory")
    with pytest.raises(CheckpointError, match="the model's path is empty"):
        load("")
    with pytest.raises(AdapterError, match="the adapter's name is empty"):
        resolve_adapter(model_dir, "")
    with pytest.raises(CheckpointError, match="the model's path is empty"):
        train("", tmp_path, out="x")
    with pytest.raises(OptionError, match="data is empty"):
        train(str(model_dir), "", out="x")
    assert not (model_dir / "adapters" / "x").exists()
    monkeypatch.chdir(tmp_path)  # a bare name is the model's adapter's, whatever file is here
    with pytest.raises(AdapterError, match="adapter 'notes.txt' not found .*this model has: a"):
        resolve_adapter(model_dir, "notes.txt")
    assert text.read_text() == "mine"
    # a folder of that name under adapters/ that is no adapter: said as what it is, not "not found"
    (model_dir / "adapters" / "a.train" / "checkpoints").mkdir(parents=True)
    (model_dir / "adapters" / "broken").mkdir()
    try:
        with pytest.raises(AdapterError, match=r"adapters/broken: not an adapter directory \(it has no "
                                               r"adapter_config.json\)$"):
            resolve_adapter(model_dir, "broken")
        assert_one_line_error(cli("generate", "--model", str(model_dir), "--adapter", "a.train", "-p", "x"),
                              "a.train: not an adapter directory (it has no adapter_config.json; a training "
                              "run's folder: its adapter is a, its checkpoints under checkpoints/)")
    finally:
        shutil.rmtree(model_dir / "adapters" / "a.train")
        (model_dir / "adapters" / "broken").rmdir()
    res = cli("-h")
    assert res.returncode == 0 and "Usage: " in res.stdout and "train" in res.stdout
    for shown in (res.stdout, cli("train", "--help").stdout):  # a switch takes no value, -h included
        assert "--overwrite" in shown or "--version" in shown
        assert "<bool>" not in shown and "BOOLEAN" not in shown
    from mlx_specstream import __version__

    assert cli("--version").stdout == f"specstream-mlx {__version__}\n"


def test_blas_command():
    res = cli("blas")
    assert res.returncode == 0 and "active BLAS" in res.stdout


def test_generate_default_model_text_and_verbose():
    from mlx_specstream.api import DEFAULT_MODEL, generate, load

    if not (DEFAULT_MODEL / "config.json").exists():
        pytest.skip("the default model is not built")
    prompt = "### Context:\nCREATE TABLE t (a INTEGER)\n"
    res = cli("generate", "--mode", "ar", "--prompt", prompt, "-n", "8")
    assert res.returncode == 0, res.stderr
    model, tok = load()
    ref = generate(model, tok, prompt, max_tokens=8, mode="ar")
    assert res.stdout.rstrip("\n") == ref.text
    adapters = sorted(p.parent.name for p in (DEFAULT_MODEL / "adapters").glob("*/adapter_config.json"))
    if adapters:
        name = adapters[0]
        res = cli("generate", "--adapter", name, "--prompt", prompt, "-n", "16", "--verbose")
        assert res.returncode == 0, res.stderr
        assert "mean_accepted_tokens" in res.stderr
    # --top-k 1 leaves one token to draw: sampling at any temperature is greedy decoding
    res = cli("generate", "--mode", "ar", "--prompt", prompt, "-n", "8", "--temp", "1.5", "--top-k", "1",
              "--min-p", "0.5", "--seed", "4")
    assert res.returncode == 0, res.stderr
    assert res.stdout.rstrip("\n") == ref.text
    assert_one_line_error(cli("generate", "--mode", "ar", "--prompt", prompt, "--temp", "1", "--min-p", "2"),
                          "--min-p must be in [0, 1]")


def test_generate_with_the_chat_template_and_stop_strings(tmp_path):
    """--chat-template sends the prompt as one user turn (after --system-prompt's), as train
    --chat-template trains on it; --stop ends the text where one begins: both as the Python API
    with the same prompt and stop strings (the oracle)."""
    from mlx_specstream.api import DEFAULT_MODEL, generate, load

    if not (DEFAULT_MODEL / "config.json").exists():
        pytest.skip("the default model is not built")
    d = tmp_path / "chat"
    d.mkdir()
    for f in DEFAULT_MODEL.iterdir():
        (d / f.name).symlink_to(f.resolve())
    (d / "chat_template.jinja").write_text("{% for m in messages %}### {{ m['role'] }}:\n{{ m['content'] }}\n"
                                           "{% endfor %}{% if add_generation_prompt %}### SQL:\n{% endif %}")
    model, tok = load(d)
    question = "CREATE TABLE t (a INTEGER) How many rows?"
    sent = f"### system:\nAnswer in SQL.\n### user:\n{question}\n### SQL:\n"
    ref = generate(model, tok, sent, max_tokens=12, mode="ar").text
    res = cli("generate", "--model", str(d), "--mode", "ar", "-p", question, "-n", "12", "--chat-template",
              "--system-prompt", "Answer in SQL.")
    assert res.returncode == 0 and res.stdout == ref + "\n", res.stderr
    (tmp_path / "q.txt").write_text(question + "\n")  # an editor's last newline is not in the turn
    res = cli("generate", "--model", str(d), "--mode", "ar", "--prompt-file", str(tmp_path / "q.txt"),
              "-n", "12", "--chat-template", "--system-prompt", "Answer in SQL.")
    assert res.returncode == 0 and res.stdout == ref + "\n", res.stderr
    stop = ref.split()[1]  # a word the text holds
    res = cli("generate", "--model", str(d), "--mode", "ar", "-p", question, "-n", "12", "--chat-template",
              "--system-prompt", "Answer in SQL.", "--stop", "zzz", "--stop", stop)
    assert res.returncode == 0 and res.stdout == ref[: ref.index(stop)] + "\n", res.stderr
    # \n typed in --stop is a newline, as in --prompt
    code = generate(model, tok, "def add(a, b):\n", max_tokens=24, mode="ar").text
    assert "\n" in code
    res = cli("generate", "--model", str(d), "--mode", "ar", "-p", "def add(a, b):\\n", "-n", "24",
              "--stop", "\\n")
    assert res.returncode == 0 and res.stdout == code[: code.index("\n")] + "\n", res.stderr


@pytest.mark.parametrize("recorded,given,said", [
    ({"chat_template": True, "system_prompt": None}, (True, "X"), "template: generate with --chat-template "
                                                                  "without --system-prompt"),
    ({"chat_template": True, "system_prompt": "S"}, (False, None),
     "template after the system prompt 'S': generate with --chat-template --system-prompt S"),
    ({"chat_template": False}, (False, None), None),
    ({"chat_template": True, "system_prompt": None}, (True, None), None)])
def test_generate_says_how_the_adapter_was_trained(tmp_path, recorded, given, said):
    """generate's warning where an adapter meets prompts unlike those it was trained on, saying the
    options that make them alike (a review found it advising --chat-template to one who gave it)."""
    import json
    import warnings

    from mlx_specstream.cli import _say_trained_template

    (tmp_path / "ad").mkdir()
    (tmp_path / "ad" / "adapter_config.json").write_text("{}")
    (tmp_path / "ad" / "training_report.json").write_text(json.dumps({"config": recorded}))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _say_trained_template(tmp_path, str(tmp_path / "ad"), *given)
    assert [str(w.message).split("chat ", 1)[1] for w in caught] == ([said] if said else [])


def test_an_adapter_trains_after_the_system_prompt_it_will_decode_after(tmp_path):
    """train --chat-template --system-prompt S reads each text prompt as generate --chat-template
    --system-prompt S sends it (the oracle: data.chat_prompt, generate's rendering), records S, and
    ngrams reads the data so again unless told otherwise."""
    import json

    from mlx_specstream.api import DEFAULT_MODEL
    from mlx_specstream.data import chat_prompt
    from mlx_specstream.tokenizer import load_tokenizer

    if not (DEFAULT_MODEL / "config.json").exists():
        pytest.skip("the default model is not built")
    d = tmp_path / "chat"
    d.mkdir()
    for f in DEFAULT_MODEL.iterdir():
        if f.name != "adapters":
            (d / f.name).symlink_to(f.resolve())
    (d / "chat_template.jinja").write_text("{% for m in messages %}### {{ m['role'] }}:\n{{ m['content'] }}\n"
                                           "{% endfor %}{% if add_generation_prompt %}### SQL:\n{% endif %}")
    (tmp_path / "data").mkdir()
    rows = [{"prompt": f"CREATE TABLE t{i} (a INTEGER) How many rows?",
             "completion": f"SELECT COUNT(*) FROM t{i}"} for i in range(4)]
    (tmp_path / "data" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    # replies too short for the last streams: no targets to measure them on
    short = {"prompt": rows[0]["prompt"], "completion": "1"}
    (tmp_path / "data" / "valid.jsonl").write_text(json.dumps(short))
    res = cli("train", "--model", str(d), "--data", str(tmp_path / "data"), "--out", str(tmp_path / "ad"),
              "--chat-template", "--system-prompt", "Answer in SQL.", "--iters", "1", "--batch-size", "2",
              "--no-self-distill", "--accept-prompts", "0", "--val-every", "0", "-j", "1", "--quiet")
    assert res.returncode == 0, res.stderr

    def standard(v):  # NaN is no JSON (RFC 8259): strict parsers and JavaScript refuse it
        raise AssertionError(f"{v} in the JSON")

    report = json.loads((tmp_path / "ad" / "training_report.json").read_text(), parse_constant=standard)
    assert report["valid"]["stream_acc"][-1] is None and report["valid"]["stream_acc"][0] is not None
    assert json.loads(res.stdout, parse_constant=standard)["valid"]["stream_acc"][-1] is None
    assert report["config"]["system_prompt"] == "Answer in SQL."
    # a warning where it is given plain prompts, or another system prompt (found by a walkthrough)
    assert report["chat_prompts"] is True and report["data"]["train"]["chat_examples"] == 4
    for given in ((), ("--chat-template",), ("--chat-template", "--system-prompt", "Other.")):
        res = cli("generate", "--model", str(d), "--adapter", str(tmp_path / "ad"), "-p", "x", "-n", "2",
                  *given)
        assert res.returncode == 0 and ("trained on prompts in the chat template after the system prompt "
                                        "'Answer in SQL.': generate with --chat-template --system-prompt "
                                        "'Answer in SQL.'") in res.stderr, res.stderr
    res = cli("generate", "--model", str(d), "--adapter", str(tmp_path / "ad"), "-p", "x", "-n", "2",
              "--chat-template", "--system-prompt", "Answer in SQL.")
    assert res.returncode == 0 and "trained on" not in res.stderr, res.stderr
    # conversations are in the template whatever the options: so is the adapter trained on them
    chats = [{"messages": [{"role": "user", "content": r["prompt"]},
                           {"role": "assistant", "content": r["completion"]}]} for r in rows]
    (tmp_path / "chats").mkdir()
    (tmp_path / "chats" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in chats))
    res = cli("train", "--model", str(d), "--data", str(tmp_path / "chats"), "--out", "chats",
              "--iters", "1", "--batch-size", "2", "--no-self-distill", "--accept-prompts", "0",
              "--val-every", "0", "-j", "1", "--quiet")
    assert res.returncode == 0 and "(generate with --model" in res.stderr and \
        "--adapter chats --chat-template)" in res.stderr, res.stderr
    res = cli("generate", "--model", str(d), "--adapter", "chats", "-p", "x", "-n", "2")
    said = "trained on prompts in the chat template: generate with --chat-template\n"
    assert res.returncode == 0 and said in res.stderr, res.stderr
    tok = load_tokenizer(d)
    sent = [chat_prompt(tok, r["prompt"], system="Answer in SQL.") for r in rows]
    assert report["data"]["train"]["tokens"] - report["data"]["train"]["target_tokens"] == sum(map(len, sent))
    # an adapter saved without its report (trained in memory, then save_adapter): its config says them
    (tmp_path / "ad" / "training_report.json").unlink()
    res = cli("generate", "--model", str(d), "--adapter", str(tmp_path / "ad"), "-p", "x", "-n", "2")
    assert res.returncode == 0 and "generate with --chat-template --system-prompt 'Answer in SQL.'" \
        in res.stderr, res.stderr
    res = cli("ngrams", "--model", str(d), "--adapter", str(tmp_path / "ad"), "--data",
              str(tmp_path / "data"), "--overwrite")
    assert res.returncode == 0, res.stderr
    assert '--chat-template --system-prompt "Answer in SQL."\n' in res.stderr, res.stderr  # quoted
    res = cli("ngrams", "--model", str(d), "--adapter", str(tmp_path / "ad"), "--data",
              str(tmp_path / "data"), "--overwrite", "--no-chat-template")  # its system prompt goes too
    assert res.returncode == 0 and "--system-prompt" not in res.stderr, res.stderr
    assert_one_line_error(cli("train", "--model", str(d), "--data", str(tmp_path / "data"), "--out",
                              str(tmp_path / "ad2"), "--system-prompt", "Answer in SQL."),
                          "--system-prompt is a turn of the chat template: give --chat-template too")


def test_the_end_of_the_context_is_said_only_when_it_ended_the_text(capsys):
    """One stderr line when the context cut the text; none when a stop string or EOS ended it
    in the same pass (the limit was reached, but it is not why the text ends)."""
    from types import SimpleNamespace

    from mlx_specstream.cli import _echo_steps
    from mlx_specstream.engine import Stats

    for finish, said in (("length", True), ("stop", False)):
        step = SimpleNamespace(text="x", stats=Stats(context_limit=24, finish_reason=finish))
        _echo_steps([step], None, verbose=False)
        assert ("stopped at the end of the model's context: 24 tokens" in capsys.readouterr().err) is said


def test_generate_help_states_the_engines_node_costs():
    """The help's CPU node costs are the engine's defaults (both are stated by hand)."""
    from mlx_specstream.engine import CPU_NODE_COST

    res = cli("generate", "--help")
    text = " ".join(res.stdout.replace("│", " ").split())
    assert res.returncode == 0
    for policy, cost in CPU_NODE_COST.items():
        want = {"deferred": "deferred streams", "tree": "streams on every node"}[policy]
        assert f"{cost} with {want}" in text, text


@pytest.mark.parametrize("signal_raised,status,said", [("Terminated", 143, "terminated"),
                                                        ("KeyboardInterrupt", 130, "interrupted")])
def test_sigterm_and_ctrl_c_end_a_command_with_their_own_status(monkeypatch, capsys, signal_raised, status,
                                                                said):
    """A command stopped by SIGTERM (raised as ``Terminated`` where it cleans up or saves a
    checkpoint) exits 143 saying so, Ctrl-C 130: Typer turns both into exit 130 on its way out."""
    import typer

    from mlx_specstream import cli
    from mlx_specstream.outputs import Terminated

    stopped = typer.Typer(cls=cli._Group)  # the CLI's own group, which carries them past typer

    @stopped.command()
    def work() -> None:
        raise Terminated("terminated") if signal_raised == "Terminated" else KeyboardInterrupt

    @stopped.command()
    def rest() -> None:
        pass

    monkeypatch.setattr(cli, "app", stopped)
    monkeypatch.setattr(sys, "argv", ["specstream-mlx", "work"])
    with pytest.raises(SystemExit) as e:
        cli.main()
    assert e.value.code == status and capsys.readouterr().err.strip().endswith(said)


def test_an_installed_copy_without_the_repository_asks_for_the_model_and_data(tmp_path):
    """``pip install .`` copies the package alone into site-packages, without ``models/`` and
    ``data/``: the commands that default to them say what to pass, in one line."""
    import os
    import shutil

    import mlx_specstream

    site = tmp_path / "site"
    shutil.copytree(Path(mlx_specstream.__file__).parent, site / "mlx_specstream",
                    ignore=shutil.ignore_patterns("__pycache__"))  # symlinks followed, as pip does
    env = {**os.environ, "PYTHONPATH": str(site)}

    def installed(*args):
        return subprocess.run([sys.executable, "-m", "mlx_specstream.cli", *args], capture_output=True,
                              text=True, timeout=600, env=env, cwd=tmp_path)

    assert_one_line_error(installed("generate", "--prompt", "x"), "no --model given and this installation")
    shipped = Path(__file__).resolve().parent.parent / "models" / "specstream-tiny" / "mlx"
    res = installed("bench", "--model", str(shipped), "--out", str(tmp_path / "b"))
    assert_one_line_error(res, "--task sql: this installation has no project data sets")
    assert not (tmp_path / "b").exists()
    api = subprocess.run([sys.executable, "-c", "from mlx_specstream import load; load()"],
                         capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert "OptionError: no model given and this installation has no default model" in api.stderr


def test_the_prompt_is_read_as_mlx_lm_reads_it(monkeypatch, tmp_path):
    """``--prompt`` with ``\\n`` and ``\\t`` typed in it, and ``--prompt -`` for standard input,
    as ``mlx_lm.generate``; a byte-order mark is not text, whether from a file or standard input."""
    import io

    from mlx_specstream.cli import _read_prompt

    assert _read_prompt("### SQL:\\nSELECT\\t1", None) == "### SQL:\nSELECT\t1"
    for given in ("-", None):
        monkeypatch.setattr(sys, "stdin", io.StringIO("\ufeffSELECT\\n 1"))
        assert _read_prompt(given, None) == "SELECT\\n 1"  # read as it is, as a file is
    (tmp_path / "p.txt").write_text("\ufeffSELECT\\n 1", encoding="utf-8")
    assert _read_prompt(None, tmp_path / "p.txt") == "SELECT\\n 1"


def test_command_lines_click_refuses_are_one_line(tmp_path):
    """A missing option, a value of the wrong kind, an unknown option or command: one ``error:``
    line naming the command's help, exit status 2, as this CLI's own checks say theirs."""
    for args, said in [(("train", "--out", "x"), "error: Missing option '--data'. (see "),
                       (("generate", "-p", "x", "-n", "abc"), "error: Invalid value for '--max-tokens'"),
                       (("generate", "-p", "x", "--bogus"), "error: No such option: --bogus"),
                       (("bogus",), "error: No such command 'bogus'. (see ")]:
        res = cli(*args)
        assert res.returncode == 2 and res.stderr.startswith(said), res.stderr
        command = args[0] if len(args) > 1 else "cli"  # (the program's name, run here as python -m)
        assert res.stderr.endswith(f"{command} -h)\n") and res.stderr.count("\n") == 1, res.stderr


def test_mlx_lms_flags_say_what_they_are_here(tmp_path):
    """A flag an mlx-lm user types from habit gets its name here, not click's nearest spelling."""
    res = cli("train", "--data", str(tmp_path), "--learning-rate", "1e-4")
    assert res.returncode == 2 and res.stderr == "error: --learning-rate is mlx-lm's; here it is --lr\n"
    res = cli("generate", "--adapter-path=sql", "--prompt", "x")
    assert res.returncode == 2 and res.stderr == "error: --adapter-path is mlx-lm's; here it is --adapter\n"
    assert "the loss never covers the prompt" in cli("train", "--mask-prompt").stderr
    from mlx_specstream.cli import mlx_lm_flag

    assert mlx_lm_flag(["generate", "-p", "--adapter-path", "-n", "3"]) is None  # a prompt, not a flag
    assert mlx_lm_flag(["generate", "--prompt=--adapter-path", "--verbose", "--adapter-path", "x"]) == \
        "--adapter-path is mlx-lm's; here it is --adapter"


def test_train_refuses_a_flag_its_mode_does_not_use(tmp_path):
    """As generate does: typed for a mode that ignores it, a flag is an error, not a no-op."""
    base = ("train", "--data", str(tmp_path), "--out", str(tmp_path / "a"))
    assert_one_line_error(cli(*base, "--mode", "lora", "--gamma", "3", "--tree-budget", "9"),
                          "--mode lora does not use --gamma, --tree-budget")
    assert_one_line_error(cli(*base, "--mode", "shared", "--state-cache-mb", "7"),
                          "--mode shared does not use --state-cache-mb")
    assert_one_line_error(cli(*base, "--no-self-distill", "--distill-tokens", "8"),
                          "--no-self-distill does not use --distill-tokens")
    assert not (tmp_path / "a").exists()


def test_a_core_ml_package_names_only_the_fixed_flags_given(tmp_path):
    """What a package fixes at export and the command line gave anyway: said by the flags given."""
    pkg = str(tmp_path / "sql.mlpackage")
    assert_one_line_error(cli("generate", "--model", pkg, "--adapter", "sql", "--gamma", "2", "-p", "x"),
                          "streams and tree (size and node cost) at export: drop --adapter and --gamma")
    res = cli("generate", "--model", pkg, "--node-cost", "0.1", "-p", "x")
    assert res.stderr.rstrip().endswith("at export: drop --node-cost"), res.stderr
    res = cli("generate", "--model", pkg, "--streams", "tree", "-p", "x")
    assert res.stderr.rstrip().endswith("at export: drop --streams"), res.stderr


def test_a_second_sigterm_acts_at_once_inside_nested_blocks():
    """Every command runs inside ``terminate_cleanly`` (SIGTERM said, as Ctrl-C), and writing or
    training blocks nest theirs: after a first SIGTERM, the next one takes the default action (a
    process stuck in native code, where no Python handler runs, still stops), not the outer
    block's handler."""
    import os
    import signal
    import time

    from mlx_specstream.outputs import Terminated, terminate_cleanly

    before = signal.getsignal(signal.SIGTERM)
    with terminate_cleanly():
        with terminate_cleanly():
            with pytest.raises(Terminated):
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(10)
            assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    assert signal.getsignal(signal.SIGTERM) == before


def test_generate_takes_the_engine_draft_options():
    """--streams and --no-ngrams, which the Python API and the docs' tables name, on the command
    line too; lossless either way; a mode that does not use them refuses them."""
    import json

    from mlx_specstream.project import REPOSITORY

    prompt = json.loads((REPOSITORY / "data" / "sql" / "test.jsonl").read_text().splitlines()[0])["prompt"]
    ar = cli("generate", "--adapter", "sql-lossless", "--mode", "ar", "-p", prompt, "-n", "24")
    assert ar.returncode == 0, ar.stderr
    for flags in (("--streams", "tree", "--no-ngrams"), ("--streams", "deferred", "--ngrams")):
        res = cli("generate", "--adapter", "sql-lossless", "-p", prompt, "-n", "24", *flags)
        assert res.returncode == 0 and res.stdout == ar.stdout, res.stderr
    assert_one_line_error(cli("generate", "--mode", "ar", "--no-ngrams", "-p", "x"),
                          "--mode ar does not use --no-ngrams: drop it")


def test_an_error_says_which_process_under_mlx_launch():
    """Every process of an mlx.launch run says its errors; those beyond the first say whose, so a
    line every process writes is told apart from one process's."""
    import os

    command = [sys.executable, "-m", "mlx_specstream.cli", "generate", "--mode", "ar", "--gamma", "2",
               "-p", "x"]
    for rank, head in (("0", "error: "), ("1", "error (process 1): ")):
        res = subprocess.run(command, capture_output=True, text=True, timeout=120,
                             env={**os.environ, "MLX_RANK": rank})
        said = head + "--mode ar does not use --gamma: drop it\n"
        assert res.returncode == 1 and res.stderr == said, res.stderr
