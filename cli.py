"""``specstream-mlx``: the command line. Every command parses options and calls the Python API."""

from __future__ import annotations

import os
import shlex
import sys
import warnings
from pathlib import Path

import typer

PATH_OPTIONS = ("--out", "--mlx-path", "--hf-path", "--model", "--data", "--prompt-file", "--draft-model",
                "--init", "--over", "--adapter")
# the options that take an adapter's name under the model, or a path
NAME_OPTIONS = {"train": ("--out", "--init", "--over"), "generate": ("--adapter",), "convert": ("--adapter",),
                "ngrams": ("--adapter",), "bench": ("--adapter",)}


def _mlx_lm_flags(command: str) -> dict[str, str]:
    """mlx-lm's flags of ``command`` that are spelt otherwise here (or have no counterpart), with
    what stands for each here (errors.instead): ``train``'s are the Python API's names as flags."""
    if command == "train":
        from mlx_specstream.trainer import MLX_LM_NAMES

        return {"--" + name.replace("_", "-"): said for name, said in MLX_LM_NAMES.items()}
    return {"--adapter-path": "{adapter}"} if command == "generate" else {}


def mlx_lm_flag(argv: list[str]) -> str | None:
    """What to say of an mlx-lm flag in ``argv`` (the command and its arguments) that this
    command spells otherwise, or None. The value of an option (``-p --train``) is no flag."""
    table = _mlx_lm_flags(argv[0]) if argv else {}
    for flag, _, _ in _given(argv) if table else ():
        if flag in table:
            from mlx_specstream.errors import instead

            return f"{flag} is mlx-lm's; {instead(table[flag], 'cli')}"
    return None


def empty_path(argv: list[str]) -> str | None:
    """What to say of a path or name option given an empty value (``--adapter "$UNSET"``), which
    would read as the current directory; None where there is none."""
    for _, value, param in _given(argv):
        long = max(param.opts, key=len) if param is not None else None
        if long in PATH_OPTIONS and value == "":
            named = long in NAME_OPTIONS.get(argv[0], ())
            return f"{long} is empty: give a {'name or ' * named}path"
    return None


def _given(argv: list[str]):
    """``(option as typed, its value or None, its parameter or None)`` for each word of a command
    line (``argv``: the command and its arguments) up to ``--``; an option's value is read as its
    value, not as an option (``-p --train``, ``-p --model=``)."""
    command = typer.main.get_command(app).commands.get(argv[0]) if argv else None  # type: ignore[attr-defined]
    params = {o: p for p in command.params for o in p.opts} if command is not None else {}
    args = iter(argv[1:])
    for arg in args:
        if arg == "--":
            return
        flag, eq, value = arg.partition("=")
        param = params.get(flag)
        takes_value = param is not None and not getattr(param, "is_flag", False)
        if takes_value and not eq:
            value = next(args, None)
        yield flag, value if (eq or takes_value) else None, param


def expand_home(argv: list[str]) -> list[str]:
    """``--out=~/x`` as the shell leaves it (it expands ``~`` only at the start of a word): the
    path options' values with the home directory in place of ``~/``, as ``--out ~/x`` gets it,
    not a directory named "~". Other values (a ``--prompt`` text) are left as typed."""
    out = []
    for arg in argv:
        flag, eq, value = arg.partition("=")
        if flag in PATH_OPTIONS and eq and (value == "~" or value.startswith("~/")):
            arg = f"{flag}={os.path.expanduser(value)}"
        out.append(arg)
    return out


def _flag(default: bool | None, *names: str, **options) -> typer.models.OptionInfo:
    """A switch (``--x``, ``--x/--no-x``): its help shows no value to give, as it takes none."""
    return typer.Option(default, *names, metavar="", **options)


class _HelpSwitch:
    """A command (or the command list) whose ``-h/--help`` shows no value to give, as :func:`_flag`'s
    switches (typer's own help option shows ``<bool>``)."""

    def get_help_option(self, ctx):
        option = super().get_help_option(ctx)
        if option is not None:
            option.metavar = ""
        return option


# click's errors, whether typer ships its own copy of click (0.2x) or uses click itself
USAGE_ERROR, CLICK_ERROR = (next(c for c in typer.BadParameter.__mro__ if c.__name__ == name)
                            for name in ("UsageError", "ClickException"))


class _Stopped(Exception):
    """A Ctrl-C or SIGTERM (:class:`~mlx_specstream.outputs.Terminated`) carried past typer, which
    would turn it into a silent exit 130: :func:`main` says which it was, with its own status."""

    def __init__(self, interrupt: KeyboardInterrupt):
        super().__init__()
        self.interrupt = interrupt


class _OneLineErrors:
    """A command line click refuses (a missing option, a value of the wrong kind, an unknown
    option or command) said in one ``error:`` line, exit status 2, as this CLI's own checks say
    theirs, not in click's usage box."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt as e:
            raise _Stopped(e) from None

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except _Stopped as e:
            raise e.interrupt from None
        except CLICK_ERROR as e:
            where = e.ctx.command_path if isinstance(e, USAGE_ERROR) and e.ctx is not None else None
            said = " ".join(e.format_message().split())
            if said:  # (no words: the command list, shown for a command line without a command)
                typer.echo(f"{_error()} {said}" + (f" (see {where} -h)" if where else ""), err=True)
            sys.exit(e.exit_code)
        except typer.Abort:
            typer.echo("Aborted!", err=True)
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)  # what typer's standalone mode exits with


class _Command(_OneLineErrors, _HelpSwitch, typer.core.TyperCommand):
    pass


class _Group(_OneLineErrors, _HelpSwitch, typer.core.TyperGroup):
    pass


app = typer.Typer(cls=_Group, add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  context_settings={"help_option_names": ["-h", "--help"]},
                  help="Speculative Streaming for MLX: import, train adapters, generate, export.")


def _version(shown: bool) -> None:
    if shown:
        from mlx_specstream import __version__

        typer.echo(f"specstream-mlx {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = _flag(False, "--version", callback=_version, is_eager=True,
                                help="print the version and exit")) -> None:
    """The group's callback: every command a subcommand (the help text is ``app``'s)."""


@app.command(cls=_Command)
def blas() -> None:
    """Report which BLAS MLX's CPU backend uses in this process (and which would be preloaded)."""
    from mlx_specstream.blas import active_blas, find_blas, small_rows_active

    typer.echo(f"active BLAS: {active_blas()}")
    typer.echo(f"optimized BLAS found: {find_blas() or 'none'}")
    typer.echo(f"products of few rows as one sgemv per row (small_gemm.c): "
               f"{'on' if small_rows_active() else 'off'}")


def _end_of_file(text: str) -> str:
    return text.removesuffix("\n").removesuffix("\r")


def _typed(text: str) -> str:
    """Text typed on the command line (``--prompt``, ``--stop``), as mlx_lm.generate reads a
    prompt: the escapes ``\\n`` and ``\\t`` are a newline and a tab."""
    return text.replace("\\n", "\n").replace("\\t", "\t")


def _read_prompt(prompt: str | None, prompt_file: Path | None, turn: bool = False) -> str:
    """The prompt's text; ``turn`` (a chat template wraps it): a file's or standard input's final
    newline (an editor's, ``echo``'s) is not part of the user's turn, whose end the template writes."""
    if prompt is not None and prompt_file is not None:
        raise ValueError("give either --prompt or --prompt-file, not both")
    if prompt_file is not None:
        if not prompt_file.is_file():
            raise FileNotFoundError(f"--prompt-file {prompt_file}: no such file" if not prompt_file.exists()
                                    else f"--prompt-file {prompt_file}: not a file")
        try:
            text = prompt_file.read_text(encoding="utf-8-sig")  # a byte-order mark is not text
        except UnicodeDecodeError as e:
            raise ValueError(f"--prompt-file {prompt_file}: not UTF-8 text (byte {e.start})") from None
        return _nonempty(_end_of_file(text) if turn else text, f"--prompt-file {prompt_file}")
    source = "--prompt"
    if prompt is not None and prompt != "-":
        prompt = _typed(prompt)
    else:  # none given, or "-" (mlx-lm's way to ask for standard input)
        if sys.stdin is None or (prompt is None and sys.stdin.isatty()):  # None: stdin closed
            raise ValueError("no prompt: use --prompt, --prompt-file or standard input")
        source = "standard input"
        try:
            prompt = sys.stdin.read().removeprefix("\ufeff")  # a byte-order mark is not text
        except UnicodeDecodeError as e:
            raise ValueError(f"{source}: not UTF-8 text (byte {e.start})") from None
        prompt = _end_of_file(prompt) if turn else prompt
    try:
        prompt.encode("utf-8")  # bytes that are not UTF-8 arrive as lone surrogates
    except UnicodeEncodeError as e:
        raise ValueError(f"{source}: not UTF-8 text (character {e.start})") from None
    return _nonempty(prompt, source)


def _nonempty(prompt: str, source: str) -> str:
    if not prompt:  # the model would write from its start token alone
        raise ValueError(f"{source}: the prompt is empty")
    return prompt


def _show_stats(stats) -> None:
    d = stats.as_dict()
    typer.echo("", err=True)
    for key in ("prompt_tokens", "generated_tokens", "calls", "mean_accepted_tokens",
                "accepted_length_histogram", "prefill_time_s", "decode_time_s", "tokens_per_second",
                "bookkeeping_share", "mean_tree_nodes", "mean_kept_nodes"):
        typer.echo(f"{key:>26}: {d[key]}", err=True)
    why = f" (the context limit, {d['context_limit']} tokens)" \
        if d["context_limit"] and d["finish_reason"] == "length" else ""
    typer.echo(f"{'finish_reason':>26}: {d['finish_reason']}{why}", err=True)


@app.command(cls=_Command)
def generate(
    model: Path | None = typer.Option(None, "--model", "-m",
                                         help="MLX model dir or .mlpackage (default: shipped model)"),
    adapter: str | None = typer.Option(
        None, help="adapter name (under MODEL/adapters; ./NAME for a folder here) or path"),
    prompt: str | None = typer.Option(None, "--prompt", "-p", help="prompt text (\\n and \\t typed in it "
                                      "are a newline and a tab, as in mlx_lm.generate; '-': standard input)"),
    prompt_file: Path | None = typer.Option(None, help="read the prompt from a file"),
    max_tokens: int = typer.Option(256, "--max-tokens", "-n", help="-1: until EOS or the end of the context"),
    temp: float = typer.Option(0.0, "--temp", help="sampling temperature (0: greedy)"),
    top_p: float = typer.Option(1.0, "--top-p", help="sampling: draw from the most likely tokens up to "
                                "this total probability (1: all)"),
    top_k: int = typer.Option(0, "--top-k", help="sampling: draw from the k most likely tokens only "
                              "(0: all)"),
    min_p: float = typer.Option(0.0, "--min-p", help="sampling: drop tokens less than this times as likely "
                                "as the most likely one (0: off)"),
    seed: int | None = typer.Option(None, help="sampling seed (default: a fresh one each run)"),
    mode: str = typer.Option("ss", help="ss: speculative streaming; ar: token by token; lookup: "
                             "prompt-lookup drafts (no adapter needed)"),
    gamma: int | None = typer.Option(None, help="streams used for drafting (default: all of the adapter's)"),
    branch: int | None = typer.Option(None, help="candidates per stream (k; default: the adapter's own)"),
    tree_budget: int | None = typer.Option(None, help="max nodes per draft tree (default: the adapter's "
                                           "own; --mode lookup: 11)"),
    prune_threshold: float | None = typer.Option(None, help="early-exit pruning threshold (default: the "
                                                 "adapter's own)"),
    node_cost: float | None = typer.Option(None, help="cost of one more tree node relative to a "
                                           "one-node pass; 0: always the whole budget (default on a "
                                           "CPU: 0.07 with deferred streams, 0.22 with streams on every "
                                           "node, measured in docs/engine.md; 0 on a GPU)"),
    lookup: bool | None = _flag(None, "--lookup/--no-lookup",
                                help="ss: prompt-lookup candidates beside the streams' (default on)"),
    ngrams: bool | None = _flag(None, "--ngrams/--no-ngrams",
                                help="ss and lookup: the adapter's n-gram drafts lead the lookup chain where "
                                "it has them (default on with lookup)"),
    streams: str | None = typer.Option(None, "--streams", help="where the streams run: 'tree' (on every "
                                       "tree node, in the pass), 'deferred' (lossless adapters: the last "
                                       "accepted node's, in a small pass after verification) or 'auto' "
                                       "(the default: deferred on a CPU, tree on a GPU)"),
    sql_names: bool = _flag(False, "--sql-names",
                            help="write SQL naming only the tables and columns of the prompt's "
                            "CREATE TABLE statements (besides keywords, literals and aliases)"),
    stop: list[str] | None = typer.Option(None, "--stop", help="stop where this text begins (not "
                                          "printed; \\n and \\t typed in it are a newline and a tab, as "
                                          "in --prompt); may be given several times"),
    chat_template: bool = _flag(False, "--chat-template",
                                help="send the prompt as a user turn through the model's chat "
                                "template, as train --chat-template trains on it"),
    system_prompt: str | None = typer.Option(None, "--system-prompt",
                                             help="with --chat-template: a system turn before the prompt"),
    tools: Path | None = typer.Option(None, "--tools", help="with --chat-template: a JSON file of OpenAI "
                                      "tool definitions for the template (the calls are printed as written)"),
    tool_choice: str | None = typer.Option(None, "--tool-choice", help="with --tools: 'required' (the reply "
                                           "is calls to the tools), a tool's name (calls to that one), "
                                           "'none' (the tools are not shown to the model) or 'auto' (the "
                                           "default: the model chooses)"),
    json_schema: Path | None = typer.Option(None, "--json-schema", help="the reply is JSON that this file's "
                                            "JSON schema allows ('{\"type\": \"object\"}': any object)"),
    verbose: bool = _flag(False, "--verbose", "-v",
                          help="on a terminal, colour accepted (green) and rejected (red) "
                          "drafts; statistics"),
) -> None:
    """Generate text with Speculative Streaming, streaming it as it is accepted."""
    from mlx_specstream.api import check_text_size, load, stop_strings, stream_generate
    from mlx_specstream.data import check_system_prompt
    from mlx_specstream.engine import DecodeOptions, check_used

    check_system_prompt(system_prompt, chat_template)
    stop = [_typed(s) for s in stop] if stop else stop
    stop_strings(stop)  # a bad one is said before the model loads
    turn = dict(system=system_prompt, tools=_read_tools(tools, chat_template))
    forced = _forced_names(turn["tools"], tool_choice, sql_names)
    if tool_choice == "none":  # as the server's: the reply is text, and the model is not told of tools
        turn["tools"] = None
    schema = _read_schema(json_schema, sql_names, forced)
    text = _read_prompt(prompt, prompt_file, turn=chat_template)
    placed = {"streams": streams} if streams is not None else {}  # (DecodeOptions' default otherwise)
    check_used(DecodeOptions(mode=mode, gamma=gamma, branch=branch, tree_budget=tree_budget,
                             prune_threshold=prune_threshold, node_cost=node_cost, lookup=lookup,
                             ngrams=ngrams, temperature=temp, top_p=top_p, top_k=top_k, min_p=min_p,
                             seed=seed, **placed))
    if model is not None and model.name.endswith(".mlpackage"):
        fixed = [flag for flag, value in (("--adapter", adapter), ("--gamma", gamma),
                                          ("--prune-threshold", prune_threshold), ("--node-cost", node_cost),
                                          ("--streams", streams))
                 if value is not None]
        if fixed:
            said = ", ".join(fixed[:-1]) + " and " + fixed[-1] if len(fixed) > 1 else fixed[0]
            raise ValueError("a Core ML package fixes its adapter, gamma, pruning, streams and tree (size "
                             f"and node cost) at export: drop {said}")
        _generate_coreml(model, text, verbose, chat_template, turn, forced, schema, max_tokens=max_tokens,
                         temperature=temp, top_p=top_p, top_k=top_k, min_p=min_p, seed=seed, mode=mode,
                         branch=branch, tree_budget=tree_budget, lookup=lookup, ngrams=ngrams,
                         sql_names=sql_names, stop=stop)
        return
    m, tok = load(model, adapter=adapter)
    if tok is None:
        raise ValueError(f"{model}: the model has no tokenizer files")
    check_text_size(m, tok, text)  # before the chat template encodes it
    if adapter is not None:
        _say_trained_template(m.path, adapter, chat_template, system_prompt)
    _echo_steps(stream_generate(m, tok, _as_sent(tok, text, chat_template, turn),
                                max_tokens=max_tokens, temperature=temp, top_p=top_p, top_k=top_k,
                                min_p=min_p, seed=seed, mode=mode,
                                gamma=gamma, branch=branch, tree_budget=tree_budget,
                                prune_threshold=prune_threshold, node_cost=node_cost, lookup=lookup,
                                ngrams=ngrams, sql_names=sql_names, stop=stop, **placed,
                                constraint=_shaped(tok, turn["tools"], forced, schema)),
                tok, verbose, first_said=_adapter_said(m) if verbose else None)


def _say_trained_template(model: Path, adapter: str, chat_template: bool, system_prompt: str | None) -> None:
    """Warn where the adapter was trained on prompts in the chat template (or after a system
    prompt) and is given them otherwise: its drafts, and a shared adapter's text, then go wrong."""
    from mlx_specstream.adapter import resolve_adapter, trained_config, trained_system_prompt
    from mlx_specstream.machine import warn

    config = trained_config(resolve_adapter(model, adapter))
    system = trained_system_prompt(config)
    # (conversations bring their own system turns: any system prompt goes with them)
    other_system = config.get("chat_template") is True and system_prompt != system
    if config.get("chat_prompts") and (not chat_template or other_system):
        flags = "--chat-template" + (f" --system-prompt {shlex.quote(system)}" if system is not None
                                     else " without --system-prompt" if system_prompt is not None else "")
        after = f" after the system prompt {system!r}" if system is not None else ""
        warn(f"adapter {adapter} was trained on prompts in the chat template{after}: generate with {flags}")


def _adapter_said(model) -> str:
    """What ``--verbose`` says of the model's adapter before the text: name, mode, streams, steps."""
    cfg = getattr(model, "adapter_config", None)
    if cfg is None:
        return "no adapter: the base model"
    run = cfg.training or {}
    steps = run.get("step", run.get("iters"))  # the step kept (recorded since 2026-11-29), else the run's
    about = [cfg.mode] + ([f"γ = {cfg.gamma}"] if cfg.gamma else []) + ([f"{steps} steps"] if steps else [])
    return f"adapter {cfg.name or '(unnamed)'} ({', '.join(about)})"


def _read_tools(path: Path | None, chat_template: bool) -> list[dict] | None:
    """``--tools``: OpenAI's tool definitions from a JSON file (a list, or ``{"tools": [...]}`` as a
    request holds them), for the chat template."""
    from mlx_specstream.errors import OptionError
    from mlx_specstream.tool_calls import tools_problem

    if path is None:
        return None
    if not chat_template:
        raise OptionError("{tools} go to the chat template: give {chat_template} too")
    tools = _read_json(path, "tools")
    if isinstance(tools, dict) and "tools" in tools:
        tools = tools["tools"]
    if problem := tools_problem(tools):
        raise ValueError(f"{path}: {problem[0]} must be {problem[1]}")
    return tools


def _forced_names(tools: list[dict] | None, tool_choice: str | None,
                  sql_names: bool) -> tuple[str, ...] | None:
    """``--tool-choice``: the names of the tools the reply must call (None: the model chooses)."""
    from mlx_specstream.errors import OptionError
    from mlx_specstream.tool_choice import forced_names

    if tool_choice is None:
        return None
    if tools is None:
        raise OptionError("{tool_choice} picks among the tools: give {tools} too")
    if sql_names and tool_choice not in ("auto", "none"):
        raise OptionError("{sql_names} and a forced tool call ({tool_choice}) cannot be combined")
    choice = tool_choice if tool_choice in ("auto", "none", "required") else \
        {"type": "function", "function": {"name": tool_choice}}
    try:
        return forced_names(tools, choice)
    except ValueError as e:
        raise ValueError(str(e).replace("tool_choice", "--tool-choice", 1)) from None


def _read_json(path: Path, what: str):
    """The JSON in the file of ``--tools`` or ``--json-schema`` (``what``: which file it is)."""
    import json

    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ValueError(f"{path}: cannot read the {what} file: {e.strerror or e}") from None
    except ValueError as e:
        raise ValueError(f"{path}: the {what} file is not JSON ({e})") from None


def _read_schema(path: Path | None, sql_names: bool, forced) -> dict | None:
    """``--json-schema``: the JSON schema in the file."""
    from mlx_specstream.errors import OptionError

    if path is None:
        return None
    if sql_names or forced:
        raise OptionError("{json_schema} cannot be combined with " + ("{sql_names}" if sql_names else
                                                                      "{tool_choice}"))
    schema = _read_json(path, "schema")
    if not isinstance(schema, dict):
        raise ValueError(f"{path}: a JSON schema is an object")
    return schema


def _shaped(tok, tools: list[dict] | None, names: tuple[str, ...] | None, schema: dict | None):
    """The constraint that shapes the reply: calls to the tools ``names`` (``--tool-choice``,
    :mod:`mlx_specstream.tool_choice`), text or calls by the tools' schemas where one is strict
    (as the server decodes ``"auto"``), JSON by ``schema`` (``--json-schema``,
    :mod:`mlx_specstream.json_grammar`), or None."""
    from mlx_specstream.json_grammar import json_constraint
    from mlx_specstream.tool_choice import forced_calls, has_strict

    if names is not None:
        return forced_calls(tok, tools, names)
    if has_strict(tools):
        return forced_calls(tok, tools, optional=True)
    return None if schema is None else json_constraint(tok, schema)


def _as_sent(tok, text: str, chat_template: bool, turn: dict):
    """The prompt as the model gets it: with ``--chat-template`` a user turn of the chat template,
    after ``turn``'s system prompt and with its tools."""
    from mlx_specstream.data import chat_prompt
    from mlx_specstream.tool_calls import tool_format, tools_template

    if chat_template and turn["tools"] and tool_format(tools_template(tok)) is None:  # as the server says it
        raise ValueError("this model's chat template writes no tool calls this package reads (<tool_call> "
                         "blocks, Mistral's [TOOL_CALLS], Llama 3's JSON): drop --tools")
    return chat_prompt(tok, text, **turn) if chat_template else text


def _echo_steps(steps, tok, verbose: bool, first_said: str | None = None) -> None:
    """Print a generation as it is accepted (with ``verbose`` on a terminal, its drafts coloured;
    stdout elsewhere gets the plain text), then with ``verbose`` its statistics on stderr.
    ``first_said`` goes to stderr once the request is accepted, so that errors stay one line."""
    coloured = verbose and sys.stdout.isatty() and not os.environ.get("NO_COLOR") and \
        os.environ.get("TERM") != "dumb"  # no-color.org
    stats = None
    try:
        for step in steps:
            if stats is None and first_said:
                typer.echo(first_said, err=True)
            stats = step.stats
            typer.echo(_coloured(step, tok) if coloured else step.text, nl=False)
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (Terminated)
        from mlx_specstream.outputs import Terminated

        typer.echo("")
        n = stats.generated_tokens if stats is not None else 0
        how = "terminated" if isinstance(e, Terminated) else "interrupted"
        typer.echo(f"{how} after {n} generated tokens", err=True)
        raise typer.Exit(143 if isinstance(e, Terminated) else 130) from None
    typer.echo("")
    if stats is not None and stats.context_limit and stats.finish_reason == "length" and not verbose:
        typer.echo(f"(stopped at the end of the model's context: {stats.context_limit} tokens)", err=True)
    if verbose and stats is not None:
        _show_stats(stats)


def _coloured(step, tok) -> str:
    """The step's text with accepted draft tokens in green, then the best rejected draft in
    red brackets: without the colour codes and the bracket, exactly the plain output."""
    out = "".join(typer.style(p, fg=typer.colors.GREEN) if d and p else p
                  for p, d in zip(step.pieces, step.drafted))
    rejected = tok.decode(step.rejected, skip_special_tokens=True) if step.rejected else ""
    rejected = rejected.replace("\n", "\\n")  # shown on one line
    if rejected and step.finish_reason is None:
        out += typer.style(f"[{rejected}]", fg=typer.colors.RED, dim=True)
    return out


def _generate_coreml(package: Path, text: str, verbose: bool, chat_template: bool, turn: dict,
                     forced: tuple[str, ...] | None, schema: dict | None, **options) -> None:
    """``generate --model X.mlpackage``: the host decode loop over an exported Core ML package."""
    from mlx_specstream.api import check_text_size
    from mlx_specstream.convert.coreml_export import tokenizer_dir
    from mlx_specstream.coreml_driver import load_package, stream_package

    runner, tok = load_package(package)
    if tok is None:
        raise ValueError(f"{package}: no tokenizer directory beside the package "
                         f"({tokenizer_dir(package).name}; export writes one where the model has tokenizer "
                         "files): the Python API's stream_package takes token ids")
    check_text_size(runner, tok, text)  # before the chat template encodes it
    _echo_steps(stream_package(runner, tok, _as_sent(tok, text, chat_template, turn),
                               constraint=_shaped(tok, turn["tools"], forced, schema), **options),
                tok, verbose,
                first_said=f"running {package.name} ({runner.info.said}) on {runner.description}")


def _convert_coreml(model: Path | None, out: Path | None, *, adapter: str | None, quantize: bool,
                    q_bits: int | None, q_group_size: int | None, precision: str, context: int | None,
                    tree_size: int | None, chunk: int | None, sampling: bool, overwrite: bool) -> None:
    """``convert --to coreml``: an MLX model (+ adapter) to a stateful Core ML package."""
    from mlx_specstream.convert.coreml_export import export_coreml
    from mlx_specstream.coreml_driver import PackageInfo
    from mlx_specstream.project import default_model

    if out is None:
        raise ValueError("--to coreml needs --out NAME.mlpackage")
    res = export_coreml(model or default_model(), out, adapter=adapter, quantize=quantize, q_bits=q_bits,
                        q_group_size=q_group_size, precision=precision, context=context,
                        tree_size=tree_size, chunk=chunk, sampling=sampling, overwrite=overwrite)
    info = PackageInfo.from_metadata(res.metadata, res.package)
    typer.echo(f"wrote {res.package} ({res.size_bytes / 1e6:.2f} MB)"
               + (f" and {res.tokenizer}" if res.tokenizer else "")
               + f"; {info.holds_said} holds {info.holds} tokens of prompt and text")


@app.command(cls=_Command)
def bench(
    task: str | None = typer.Option(None, help="sql or code: the project's test prompts, adapters and "
                                    "metric for that task (default sql; with --data, plain exact match "
                                    "and edit similarity)"),
    adapter: list[str] | None = typer.Option(None, "--adapter", help="time this adapter (name under "
                                             "MODEL/adapters or path) instead of the project's; may be "
                                             "given several times"),
    data: Path | None = typer.Option(None, "--data", help="prompts to time: a JSONL file, or a directory "
                                     "with test.jsonl (else valid.jsonl), prompt/completion or messages rows "
                                     "as train reads them (text rows, with no prompt, are skipped)"),
    chat_template: bool = _flag(False, "--chat-template",
                                help="send the text prompts (--task's or --data's) through the model's "
                                "chat template, as train --chat-template trains on them"),
    system_prompt: str | None = typer.Option(None, "--system-prompt", help="with --chat-template: a system "
                                             "turn before each text prompt, as generate sends it"),
    n: int | None = typer.Option(None, "--n", help="test prompts (default 50; --quick: 8)"),
    out: Path = typer.Option(Path("bench-results"), help="output directory"),
    model: Path | None = typer.Option(None, "--model", "-m", help="model dir (default: shipped)"),
    draft_model: Path | None = typer.Option(None, help="draft model for mlx-lm (default: MODEL/draft)"),
    max_tokens: int | None = typer.Option(None, "--max-tokens", help="per prompt (default 128; --quick: 64)"),
    quick: bool = _flag(False, help="8 prompts of 64 tokens by default (a few minutes)"),
    repeats: int = typer.Option(3, "--repeats", help="runs of each method per prompt; the fastest counts"),
    overwrite: bool = _flag(False, "--overwrite",
                            help="replace the results of an earlier run in --out"),
) -> None:
    """Compare SS with AR, mlx-lm (plain and draft-model) and prompt lookup on the same prompts."""
    from mlx_specstream.bench import results_markdown, run_bench
    from mlx_specstream.errors import said_in
    from mlx_specstream.project import default_model

    n = n if n is not None else 8 if quick else 50  # --quick sets defaults, not what is given
    max_tokens = max_tokens if max_tokens is not None else 64 if quick else 128
    res = run_bench(model or default_model(), task, n, max_tokens, out, draft_path=draft_model, data=data,
                    adapters=adapter, chat_template=chat_template, system_prompt=system_prompt,
                    overwrite=overwrite, repeats=repeats,
                    say=lambda msg: typer.echo(f"bench: {said_in(msg, 'cli')}", err=True))
    typer.echo(results_markdown(res["meta"], res["results"]))
    typer.echo(f"wrote {out}/results.json, results.md, results.png")


@app.command(cls=_Command)
def convert(
    hf_path: Path | None = typer.Option(None, "--hf-path",
                                        help="(--to mlx) Hugging Face / PyTorch checkpoint directory"),
    mlx_path: Path | None = typer.Option(None, "--mlx-path",
                                         help="(--to mlx) output directory (new, or one convert wrote, with "
                                         "--overwrite)"),
    to: str = typer.Option("mlx", "--to", help="output format: mlx (import, the default) or coreml (export)"),
    quantize: bool = _flag(False, "--quantize", "-q", help="group-wise int4/int8 weights"),
    q_bits: int | None = typer.Option(None, "--q-bits", help="bits per weight: 4 or 8 (quantizes; "
                                                              "-q alone: 4)"),
    q_group_size: int | None = typer.Option(None, "--q-group-size",
                                            help="quantization group: 32, 64 or 128 (default 64; "
                                                 "quantizes: 4 bits unless --q-bits)"),
    dtype: str | None = typer.Option(None, "--dtype", help="float32, float16 or bfloat16 "
                                                            "(default: keep the checkpoint's)"),
    overwrite: bool = _flag(False, "--overwrite", help="replace an existing --mlx-path, or --out "
                            "and its NAME.tokenizer"),
    model: Path | None = typer.Option(None, "--model", "-m",
                                      help="the model to convert: (--to coreml) an MLX model directory "
                                           "(default: shipped); "
                                           "(--to mlx) --hf-path, as in mlx_lm.convert"),
    adapter: str | None = typer.Option(None, "--adapter", help="(--to coreml) adapter name or path"),
    out: Path | None = typer.Option(None, "--out", help="(--to coreml) NAME.mlpackage to write"),
    precision: str | None = typer.Option(None, "--precision", help="(--to coreml) float16 (default) or "
                                         "float32 compute"),
    context: int | None = typer.Option(None, "--context", help="(--to coreml) KV-cache slots (default 2048 "
                                                               "or the model's limit); a step's tree takes "
                                                               "its room: the package holds slots - tree "
                                                               "size + 2 tokens"),
    tree_size: int | None = typer.Option(None, "--tree-size",
                                         help="(--to coreml) nodes per step (default: adapter's budget)"),
    chunk: int | None = typer.Option(None, "--chunk", help="(--to coreml) prompt tokens per prefill call "
                                                           "(default 64)"),
    sampling: bool = _flag(False, "--sampling", help="(--to coreml) also output full logits, "
                                                     "for --temp > 0, --sql-names, --json-schema, "
                                                     "--tool-choice and log-probabilities"),
) -> None:
    """Import a checkpoint to an MLX model dir (default), or export an MLX model to Core ML.

    --to mlx: config.json + safetensors or pytorch_model.bin -> MLX model dir.
    --to coreml: MLX model (+ adapter) -> stateful multifunction NAME.mlpackage (prefill, step)."""
    if to not in ("mlx", "coreml"):
        raise ValueError(f"--to {to}: unknown output format (supported: mlx, coreml)")
    only = {"mlx": {"--hf-path": hf_path, "--mlx-path": mlx_path, "--dtype": dtype},
            "coreml": {"--adapter": adapter, "--out": out, "--context": context,
                       "--tree-size": tree_size, "--chunk": chunk, "--sampling": sampling or None,
                       "--precision": precision}}
    other = "coreml" if to == "mlx" else "mlx"
    stray = [flag for flag, value in only[other].items() if value is not None]
    if stray:
        raise ValueError(f"{', '.join(stray)}: an option of --to {other}, not --to {to}")
    if to == "mlx":
        from mlx_specstream.convert.hf_import import convert as hf_convert

        if model is not None and hf_path is not None:
            raise ValueError("give --hf-path or --model, not both: with --to mlx they are the same option")
        hf_path = hf_path if hf_path is not None else model  # mlx_lm.convert's --model
        if hf_path is None or mlx_path is None:
            raise ValueError("--to mlx needs --hf-path and --mlx-path")
        out_dir = hf_convert(hf_path, mlx_path, quantize=quantize, q_bits=q_bits, q_group_size=q_group_size,
                             dtype=dtype, overwrite=overwrite)
        from mlx_specstream.tokenizer import load_tokenizer

        try:  # said now, not at the first generate
            tok = load_tokenizer(out_dir)
            note = "" if tok is not None else \
                " (no tokenizer files: generate needs them; the Python API takes token ids)"
        except Exception as e:  # noqa: BLE001 (whatever the tokenizer library raises on a bad file)
            note = f" (its tokenizer files do not load: {e})"
        typer.echo(f"wrote {out_dir}{note}")
        return
    _convert_coreml(model, out, adapter=adapter, quantize=quantize, q_bits=q_bits, q_group_size=q_group_size,
                    precision=precision or "float16", context=context, tree_size=tree_size,
                    chunk=chunk, sampling=sampling, overwrite=overwrite)


@app.command(cls=_Command)
def train(
    ctx: typer.Context,
    model: Path | None = typer.Option(None, "--model", "-m", help="MLX model dir (default: shipped)"),
    data: Path = typer.Option(..., "--data", help="directory with train.jsonl (and valid.jsonl)"),
    mode: str = typer.Option("lossless", help="lossless (base frozen), shared (LoRA everywhere + "
                             "streams) or lora (next-token LoRA baseline, no streams)"),
    out: str = typer.Option(..., "--out", help="adapter name (saved under MODEL/adapters/) or dir"),
    over: str | None = typer.Option(
        None, "--over", help="a fine-tune (a --mode lora adapter, name or dir). lossless: train the "
        "streams over it; the adapter carries it and decodes exactly as it does. shared: start from "
        "it and train it on with the streams, which get stream-only LoRA of their own"),
    init: str | None = typer.Option(
        None, "--init", help="start from this adapter's weights (same mode and shape: name or dir), "
        "to train it further, also one made for an earlier version of this base"),
    gamma: int = typer.Option(4, help="speculative streams"),
    msa_layers: int | None = typer.Option(None, "--msa-layers", help="top layers with multi-stream "
                                          "attention (default 4, or every layer of a smaller model)"),
    rank: int = typer.Option(8, help="LoRA rank of the stream adapters (shared: of every layer)"),
    iters: int | None = typer.Option(None, help="optimizer steps"),
    epochs: float | None = typer.Option(
        None, help="passes over the data (default: 1, or up to 20 for a small data set: ~200 steps)"),
    batch_size: int = typer.Option(8, "--batch-size", help="global batch (split between processes)"),
    lr: float = typer.Option(1e-3, help="peak learning rate (AdamW, warmup then cosine decay)"),
    fine_tune_lr: float | None = typer.Option(
        None, "--fine-tune-lr", help="shared mode: peak learning rate of the every-row LoRA (default: "
        "--lr); lower keeps more of the fine-tune it starts from (--over)"),
    max_seq_len: int | None = typer.Option(None, "--max-seq-len", help="longer sequences are cut or "
                                           "skipped (default 512, or what the model holds if less)"),
    length_policy: str = typer.Option("truncate", "--length-policy", help="truncate or skip"),
    chat_template: bool = _flag(False, "--chat-template", help="wrap prompts in the chat template"),
    system_prompt: str | None = typer.Option(None, "--system-prompt", help="with --chat-template: a "
                                             "system turn before each text prompt, as generate sends it"),
    self_distill: bool | None = _flag(
        None, "--self-distill/--no-self-distill",
        help="learn the base model's own greedy continuations (lossless mode: on by default)"),
    distill_tokens: int = typer.Option(64, "--distill-tokens",
                                       help="self-distillation: tokens written for a prompt given alone"),
    resume: bool = _flag(False, "--resume", help="continue from the last checkpoint"),
    overwrite: bool = _flag(False, "--overwrite", help="replace an existing adapter / run (with "
                            "--resume: continue a run that has checkpoints, else start again)"),
    seed: int = typer.Option(0, help="seed of the adapter's initial weights and the data's order"),
    alphas: str | None = typer.Option(None, help="loss weights 'a0,a1,...,a_gamma' or 'a0,a_streams'"),
    prune_weight: float = typer.Option(1.0, "--prune-weight", help="weight of the pruning adapter loss"),
    segment_len: int = typer.Option(32, "--segment-len",
                                    help="completion positions per stream segment (0: all at once)"),
    group_by_length: bool = _flag(True, "--group-by-length/--no-group-by-length",
                                  help="batch examples of similar lengths together"),
    val_every: int = typer.Option(100, "--val-every", help="steps between validations (0: only at the end)"),
    val_batches: int = typer.Option(25, "--val-batches", help="validation batches (0: all)"),
    state_cache_mb: int = typer.Option(1024, "--state-cache-mb",
                                       help="lossless: memory for the base model's states kept "
                                       "across epochs (0: recompute every step)"),
    accept_prompts: int = typer.Option(8, "--accept-prompts",
                                       help="validation prompts decoded at each evaluation to measure "
                                       "the tokens accepted per pass; the best adapter is kept (0: off)"),
    accept_tokens: int = typer.Option(48, "--accept-tokens",
                                      help="tokens generated for each of those prompts"),
    save_every: int = typer.Option(100, "--save-every", help="checkpoint interval in steps"),
    branch: int = typer.Option(3, "--branch", help="saved with the adapter as its decoding default: "
                               "candidates per stream"),
    tree_budget: int = typer.Option(32, "--tree-budget", help="saved with the adapter as its decoding "
                                    "default: nodes per tree (the whole of it runs on a GPU)"),
    warmup: int | None = typer.Option(None, help="warmup steps (default: 5% of the steps, <= 100)"),
    quiet: bool = _flag(False, "--quiet", help="no progress bars (messages and the summary stay)"),
    processes: int | None = typer.Option(None, "--processes", "-j",
                                         help="train data-parallel in N processes on this machine, the "
                                         "cores shared out between them (default: 2 where MLX runs on "
                                         "a CPU of 2 or more cores, else 1)"),
) -> None:
    """Train a speculative adapter (lossless, shared or lora mode) on JSONL data.

    Runs data-parallel with --processes N, or under mlx.launch."""
    from tqdm import tqdm

    from mlx_specstream.errors import said_in
    from mlx_specstream.outputs import json_text
    from mlx_specstream.project import default_model
    from mlx_specstream.trainer import check_used, run_settings
    from mlx_specstream.trainer import train as run_train

    given = [n for n in ctx.params if getattr(ctx.get_parameter_source(n), "name", None) == "COMMANDLINE"]
    options = dict(mode=mode, out=out, gamma=gamma, msa_layers=msa_layers, rank=rank, iters=iters,
                   epochs=epochs, batch_size=batch_size, lr=lr, fine_tune_lr=fine_tune_lr,
                   max_seq_len=max_seq_len, length_policy=length_policy, chat_template=chat_template,
                   system_prompt=system_prompt, self_distill=self_distill, distill_tokens=distill_tokens,
                   resume=resume, overwrite=overwrite, seed=seed, over=over, init=init, alphas=alphas,
                   prune_weight=prune_weight, segment_len=segment_len, group_by_length=group_by_length,
                   val_every=val_every, val_batches=val_batches, save_every=save_every,
                   accept_prompts=accept_prompts, accept_tokens=accept_tokens, state_cache_mb=state_cache_mb,
                   branch=branch, tree_budget=tree_budget, warmup=warmup, processes=processes,
                   progress=not quiet)
    model = model or default_model()
    if resume:  # the run as it was started, but for what this command line says
        options.update(_run_settings(run_settings(model, out), options, given))
    check_used(options["mode"], options["self_distill"], given)  # a flag the mode does not use is refused
    report = run_train(model, data, **options,
                       log=lambda msg: tqdm.write(said_in(msg, "cli"), file=sys.stderr))  # with flags
    if report["process_rank"] == 0:
        summary = {k: report[k] for k in ("adapter", "mode", "iters", "world_size", "train", "valid")}
        if report.get("best"):  # the adapter saved: the best on the validation prompts
            summary["best"] = {k: v for k, v in report["best"].items() if k != "per_prompt"}
        typer.echo(json_text(summary))


def _run_settings(recorded: dict, options: dict, given: list[str]) -> dict:
    """The settings of a run to resume (``trainer.run_settings``) that the command line did not
    give and that differ from what it would pass (its options, or ``train``'s defaults for those it
    has none of: a run started in Python), said once on stderr. ``iters`` and ``warmup`` the
    trainer takes itself."""
    import inspect

    from mlx_specstream.checkpoint import setting_said
    from mlx_specstream.errors import render_options
    from mlx_specstream.trainer import TrainConfig, train

    defaults = {k: p.default for k, p in inspect.signature(train).parameters.items()}
    skip = {"iters", "warmup", *given}
    taken = {k: v for k, v in recorded.items() if k not in skip and options.get(k, defaults.get(k)) != v}
    # --max-seq-len and --msa-layers left out fit the model: said where the run's is not the usual default
    fitted = {"max_seq_len": TrainConfig.max_seq_len, "msa_layers": TrainConfig.msa_layers}
    said = {k: v for k, v in taken.items() if not (options.get(k) is None and fitted.get(k, object()) == v)}
    if said:
        flags = " ".join(setting_said(k, v) for k, v in said.items() if k in options)
        python = ", ".join(setting_said(k, v) for k, v in said.items() if k not in options)
        said = render_options(flags, "cli") + ("; " if flags and python else "") + (
            f"set in Python: {render_options(python, 'python')}" if python else "")
        typer.echo(f"resuming with the run's own settings: {said}", err=True)
    return taken


@app.command(cls=_Command)
def ngrams(
    adapter: str = typer.Option(..., "--adapter", "-a", help="adapter name (under MODEL/adapters/) or dir"),
    data: Path = typer.Option(..., "--data", help="directory with the train.jsonl it was trained on"),
    model: Path | None = typer.Option(None, "--model", "-m", help="MLX model dir (default: shipped)"),
    max_seq_len: int | None = typer.Option(None, "--max-seq-len", help="longer sequences are cut "
                                           "(default: as the adapter was trained, else 512 or what the "
                                           "model holds if less)"),
    chat_template: bool | None = _flag(None, "--chat-template/--no-chat-template",
                                       help="wrap prompts in the chat template (default: as the adapter "
                                       "was trained, where its training_report.json says)"),
    system_prompt: str | None = typer.Option(None, "--system-prompt", help="with --chat-template: a system "
                                             "turn before each text prompt (default: as the adapter was "
                                             "trained)"),
    overwrite: bool = _flag(False, "--overwrite", help="replace the adapter's ngrams.npz"),
) -> None:
    """Write an adapter's n-gram drafts (ngrams.npz) from the data it was trained on.

    For an adapter trained before n-gram drafts existed (train writes them itself): decoding then
    drafts what its outputs share beside the streams."""
    from mlx_specstream.errors import said_in
    from mlx_specstream.project import default_model
    from mlx_specstream.trainer import write_ngrams

    path, n = write_ngrams(model or default_model(), adapter, data, max_seq_len=max_seq_len,
                           chat_template=chat_template, system_prompt=system_prompt, overwrite=overwrite,
                           say=lambda msg: typer.echo(said_in(msg, "cli"), err=True))
    typer.echo(f"wrote {path} ({n} contexts)")


@app.command(cls=_Command)
def serve(
    model: Path | None = typer.Option(None, "--model", "-m", help="MLX model dir (default: shipped)"),
    adapters: str | None = typer.Option(None, "--adapters", help="adapters to serve beside the base: "
                                        "names or paths, comma-separated, or 'all' (under MODEL/adapters)"),
    host: str = typer.Option("127.0.0.1", "--host", help="address to listen on (other than loopback "
                             "only when given)"),
    port: int = typer.Option(8080, "--port", help="0: any free port (printed at start-up)"),
    max_active: int = typer.Option(16, "--max-active", help="requests decoded together (more wait)"),
    name: str | None = typer.Option(None, "--name", help="the base model's id (default: its directory's "
                                    "name, the parent's for NAME/mlx)"),
) -> None:
    """Serve OpenAI's API (/v1/completions, /v1/chat/completions, /v1/models) and Anthropic's
    (/v1/messages, /v1/messages/count_tokens), with /health.

    One base model in memory, each adapter a model id (BASE:ADAPTER), requests decoded pass by pass
    together."""
    from mlx_specstream.project import default_model
    from mlx_specstream.server import serve as run_server

    run_server(model or default_model(), adapters, host=host, port=port, max_active=max_active, name=name)
    # stopped and drained: exit at once, as the forced stop does (the interpreter's teardown can end
    # in MLX's native threads, SIGABRT, after a clean stop; nothing is left to write)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main() -> None:
    """Console entry point: the command; known errors as one line."""
    try:
        from mlx_specstream.errors import USER_ERRORS, SaidInOptions
        from mlx_specstream.machine import one_line_warning
        from mlx_specstream.outputs import Terminated, terminate_cleanly
        from mlx_specstream.process_group import PeerStopped, peer_lost
    except KeyboardInterrupt:  # Ctrl-C while starting up
        sys.exit(130)

    warnings.formatwarning = one_line_warning  # a warning is one line, as an error is
    sys.stderr = _Unread(sys.stderr)
    sys.argv[1:] = expand_home(sys.argv[1:])
    said = mlx_lm_flag(sys.argv[1:]) or empty_path(sys.argv[1:])
    if said:
        typer.echo(f"{_error()} {said}", err=True)
        sys.exit(2)  # a usage error, as an unknown option's
    try:
        with terminate_cleanly():  # SIGTERM stops any command as Ctrl-C does, said (serve: its own drain)
            app()
    except SaidInOptions as e:  # said in the command line's terms
        typer.echo(f"{_error()} {e.render('cli')}", err=True)
        sys.exit(1)
    except (*USER_ERRORS, PeerStopped) as e:
        typer.echo(f"{_error()} {e}", err=True)
        sys.exit(1)
    except RuntimeError as e:
        if not peer_lost(e):
            raise
        # under mlx.launch, where another process stopped (and said why)
        typer.echo(f"{_error()} another process of the run stopped (see its error)", err=True)
        sys.exit(1)
    except (KeyboardInterrupt, SystemExit) as e:  # Typer turns Ctrl-C and SIGTERM into exit 130
        stop = _interrupt(e)
        if isinstance(stop, Terminated):  # SIGTERM while writing or training: cleaned up (or a
            typer.echo("terminated", err=True)  # checkpoint saved), the status of a SIGTERM
            sys.exit(143)
        if stop is not None:
            typer.echo("interrupted", err=True)
            sys.exit(130)
        raise


class _Unread:
    """Standard error whose reader may go away (``2>&1 | head``, a launcher stopped): what is written
    after is dropped, so the command goes on to its end. A progress bar's write raised
    BrokenPipeError, which stopped a training run without saving its steps since the last checkpoint."""

    def __init__(self, stream):
        self._stream = stream

    def _gone(self) -> None:  # the descriptor itself, which Python flushes again at exit
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), self._stream.fileno())
        except (OSError, ValueError):  # no descriptor (a notebook's stream): nothing at exit either
            self._stream = open(os.devnull, "w")

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._gone()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._gone()

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def _error() -> str:
    """How an error line begins: "error:", and under ``mlx.launch`` in processes other than the first
    (rank 0) "error (process 1):", so that what every process says is told apart from what one says."""
    rank = os.environ.get("MLX_RANK") or os.environ.get("OMPI_COMM_WORLD_RANK") or "0"  # (mpirun's)
    return "error:" if rank == "0" else f"error (process {rank}):"


def _interrupt(e: BaseException) -> KeyboardInterrupt | None:
    """The Ctrl-C or SIGTERM (:class:`Terminated`) that Typer turned into the exit ``e`` (its
    ``Exit(130)`` raised *from* the interrupt); None for an exit a command chose, such as
    ``generate``'s after saying how many tokens it wrote."""
    if isinstance(e, KeyboardInterrupt):
        return e
    cause = getattr(e.__context__, "__cause__", None)  # SystemExit <- click's Exit <- the interrupt
    return cause if isinstance(cause, KeyboardInterrupt) else None


if __name__ == "__main__":
    main()
