"""What a new user meets: the context limit, out-of-range options, stop strings, --verbose text,
and one clear error line for bad input (each item of the new-user report, against an oracle:
plain AR decoding, the tokenizer's own decode, the plain CLI output)."""

import array
import json
import re
import shutil
import signal
import subprocess
import sys
import time
from fractions import Fraction
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from helpers import deliverable_sigint, tiny_model
from test_cli import assert_one_line_error, cli

from mlx_specstream.adapter import load_adapter, new_adapter, save_adapter
from mlx_specstream.api import DEFAULT_MODEL, generate, load, stream_generate
from mlx_specstream.data import load_jsonl
from mlx_specstream.errors import AdapterError, OptionError
from mlx_specstream.loader import atomic_dir, save_model

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def with_adapter(arch="llama", **cfg):
    model = tiny_model(arch, scale=3.0, **cfg)
    new_adapter(model, gamma=3, msa_layers=2, seed=1)
    return model


@pytest.mark.parametrize("arch,limit", [("llama", 40), ("opt", 64)])
def test_context_limit(arch, limit):
    key = "max_position_embeddings"
    model = with_adapter(arch, **{key: limit})
    for n in (limit + 5, limit):  # a prompt that fills the context leaves no room for one token
        with pytest.raises(ValueError, match=f"the prompt has {n} tokens, and at most {limit - 1} fit: "
                                             f"the model's context holds {limit} tokens"):
            generate(model, None, [1 + i % 50 for i in range(n)], max_tokens=4)
    prompt = list(range(1, 21))
    ar = generate(model, None, prompt, max_tokens=100, mode="ar")
    ss = generate(model, None, prompt, max_tokens=100)
    for out in (ar, ss):
        assert len(out.tokens) == limit - len(prompt)  # prompt + generated fill the context exactly
        assert out.finish_reason == "length" and out.stats.context_limit == limit
        assert out.stats.as_dict()["finish_reason"] == "length"
    assert ss.tokens == ar.tokens  # lossless up to the limit
    unlimited = generate(model, None, prompt, max_tokens=-1)  # mlx-lm's -1: until EOS or the context
    assert unlimited.tokens == ar.tokens and unlimited.stats.context_limit == limit
    short = generate(model, None, prompt, max_tokens=5, mode="ar")
    assert short.finish_reason == "length" and short.stats.context_limit is None


def test_a_text_far_past_the_context_is_refused_before_it_is_encoded(monkeypatch):
    """Megabytes of text took a minute and gigabytes to encode before the prompt's length was
    told; more characters than the context's tokens at the longest token's cannot fit."""
    from mlx_specstream import load
    from mlx_specstream.errors import ContextLengthError

    model, tok = load(adapter="sql-lossless")
    text = "x" * (model.max_positions * tok.max_token_chars + 1)
    monkeypatch.setattr(type(tok), "encode", lambda self, *a, **k: pytest.fail("encoded"))
    said = f"the prompt \\({len(text)} characters\\) is longer than the model's context of 2048 tokens"
    with pytest.raises(ContextLengthError, match=said):
        generate(model, tok, text)


@pytest.mark.parametrize("options,fragment", [
    ({"gamma": 0}, "gamma must be in 1..3"), ({"gamma": 99}, "gamma must be in 1..3"),
    ({"branch": 0}, "branch must be >= 1"), ({"tree_budget": 0}, "tree_budget must be >= 1"),
    ({"tree_budget": 1025}, "tree_budget must be at most 1024"),
    ({"max_tokens": 0}, "max_tokens must be >= 1 .or -1: until EOS"),
    ({"max_tokens": -5}, "max_tokens must be >= 1"),
    ({"top_p": 0}, "top_p must be in"), ({"temperature": -1}, "temperature must be a finite number >= 0"),
    ({"temperature": float("nan")}, "temperature must be a finite"),
    ({"temperature": float("inf")}, "temperature must be a finite"),
    ({"node_cost": float("nan")}, "node_cost must be a finite"), ({"seed": -1}, "seed must be a whole"),
    ({"mode": "beam"}, "mode must be ss, ar or lookup"),
])
def test_out_of_range_options_are_refused(options, fragment):
    with pytest.raises(OptionError, match=fragment):
        generate(with_adapter(), None, [1, 2, 3], **options)


def test_token_ids_outside_the_vocabulary_are_refused():
    model = with_adapter()
    for bad in (model.config["vocab_size"], 99999, -1, 2**31):
        for mode in ("ar", "ss"):
            with pytest.raises(ValueError, match=f"token id {bad}, outside the model's vocabulary"):
                generate(model, None, [1, bad, 2], max_tokens=2, mode=mode)
    assert generate(model, None, [1, model.config["vocab_size"] - 1], max_tokens=2, mode="ar").tokens


@pytest.mark.parametrize("options,fragment", [
    ({"mode": "ar", "gamma": 2, "branch": 3}, "mode='ar' does not use gamma, branch: drop them"),
    ({"mode": "ar", "lookup": True}, "mode='ar' does not use lookup: drop it"),
    ({"mode": "ar", "lookup": False}, "mode='ar' does not use lookup=False: drop it"),
    ({"mode": "lookup", "lookup": False}, "mode='lookup' does not use lookup=False"),
    ({"mode": "lookup", "streams": "tree"}, "mode='lookup' does not use streams"),
    ({"branch": 10**6}, "branch must be at most the vocabulary's"),
])
def test_options_a_mode_does_not_use_are_refused_not_ignored(options, fragment):
    """On the command line (``check_used``); the Python API ignores them, so that one set of
    options serves every mode."""
    from mlx_specstream.engine import DecodeOptions, check_used

    model = with_adapter()
    if "branch" in options and len(options) == 1:  # a value no mode can use
        with pytest.raises(OptionError, match=re.escape(fragment)):
            generate(model, None, [1, 2, 3], max_tokens=2, **options)
        return
    with pytest.raises(OptionError, match=re.escape(fragment)):
        check_used(DecodeOptions(**options))
    assert generate(model, None, [1, 2, 3], max_tokens=2, **options).tokens


def test_greedy_ar_bookkeeping_is_a_share():
    stats = generate(with_adapter(), None, [1, 2, 3], max_tokens=3, mode="ar").stats.as_dict()
    assert 0 <= stats["bookkeeping_share"] < 1


def test_api_options_of_the_wrong_type_or_name():
    model = with_adapter()
    for options, fragment in (({"max_tokens": 5.5}, "max_tokens must be a whole number"),
                              ({"max_tokens": None}, "max_tokens must be a whole number"),
                              ({"temperature": None}, "temperature must be a number"),
                              ({"gamma": "2"}, "gamma must be a whole number, not '2'"),
                              ({"gamma": 2.5}, "gamma must be a whole number, not 2.5"),
                              ({"branch": 2.5}, "branch must be a whole number"),
                              ({"tree_budget": "8"}, "tree_budget must be a whole number"),
                              ({"node_cost": "a"}, "node_cost must be a number"),
                              ({"prune_threshold": "0"}, "prune_threshold must be a number"),
                              ({"constraint": "x"}, "constraint must be a TokenConstraint"),
                              ({"seed": "1", "temperature": 0.5},
                               "seed must be a whole number in 0..2**64 - 1, not '1'"),
                              ({"seed": 2**64}, "seed must be a whole number in 0..2**64 - 1"),
                              ({"lookup": 0}, "lookup must be True or False (or None), not 0"),
                              ({"mode": "ar", "gamma": 0}, "gamma must be in 1..3 (the adapter's streams), "
                               "not 0"),  # any mode
                              ({"mode": "lookup", "gamma": 9}, "gamma must be in 1..3"),
                              ({"ngrams": "false"}, "ngrams must be True or False (or None), not 'false'"),
                              ({"sql_names": "yes"}, "sql_names must be True or False, not 'yes'"),
                              ({"ngrams": True, "lookup": False}, "drop lookup=False")):
        with pytest.raises(OptionError, match=re.escape(fragment)):
            generate(model, None, [1, 2, 3], **options)
    numpy = dict(max_tokens=np.int64(4), temperature=np.float32(0.0))  # a notebook's numbers
    assert generate(model, None, [1, 2, 3], **numpy).tokens == generate(
        model, None, [1, 2, 3], max_tokens=4, temperature=0.0).tokens
    for options, fragment in (  # what the decoder could not take as asked
            ({"max_tokens": np.bool_(True)}, "max_tokens must be a whole number, not np.True_"),
            ({"temperature": Fraction(1, 2)}, "temperature must be a number, not Fraction"),
            ({"lookup": np.False_}, "lookup must be True or False (or None), not np.False_")):
        with pytest.raises(OptionError, match=re.escape(fragment)):
            generate(model, None, [1, 2, 3], **options)
    with pytest.raises(OptionError, match="max_tokens must be >= 1"):  # at the call, not at the first pass
        stream_generate(model, None, [1, 2, 3], max_tokens=-5)
    shared = tiny_model("llama", scale=3.0)
    new_adapter(shared, mode="shared", gamma=2, msa_layers=2)
    with pytest.raises(OptionError, match="streams='deferred' is for lossless adapters"):
        generate(shared, None, [1, 2, 3], max_tokens=2, streams="deferred")
    with pytest.raises(TypeError, match=re.escape("generate() got an unexpected keyword argument 'temp' "
                                                  "(did you mean 'temperature'?)")):
        generate(model, None, [1, 2, 3], temp=0.7)
    with pytest.raises(TypeError, match=r"stream_generate\(\) got an unexpected keyword argument 'verbose' "
                                        r"\(the result has the text and its stats"):  # mlx-lm's, with a hint
        next(stream_generate(model, None, [1, 2, 3], verbose=True))
    with pytest.raises(TypeError, match=re.escape("'sampler' (give temperature and top_p")):
        generate(model, None, [1, 2, 3], sampler=None)
    for name, hint in (("num_draft_tokens", "the streams draft: gamma of them, tree_budget nodes a pass"),
                       ("stop_strings", "did you mean 'stop'?"),
                       ("adapter_path", "an adapter is the model's: load(PATH, adapter=NAME) or")):
        with pytest.raises(TypeError, match=re.escape(f"'{name}' ({hint}")):  # (a walkthrough's)
            generate(model, None, [1, 2, 3], **{name: 1})
    with pytest.raises(TypeError, match=re.escape("load() got an unexpected keyword argument 'adapter_path' "
                                                  "(did you mean 'adapter'?)")):
        load(adapter_path="sql")


def test_prompts_that_are_not_prompts():
    model = with_adapter()
    for prompt, fragment in (("", "the prompt is empty"), (b"SELECT", "not bytes")):
        with pytest.raises(ValueError, match=fragment):
            generate(model, None, prompt, max_tokens=2)
    with pytest.raises(ValueError, match="the prompt is empty"):
        generate(model, None, [], max_tokens=2)
    for prompt, fragment in (([1.9, 4.2], "not list holding 1.9"),
                             (["1", "2"], "not a list of strs: generate decodes one prompt a call"),
                             ([1, True], "not list holding True"), (None, "not None"), (5, "not 5"),
                             (np.array([[1, 2]]), "not a ndarray of shape (1, 2): pass its row, ids[0]"),
                             (mx.array([[1, 2], [3, 4]]), "(2, 2): generate decodes one prompt a call"),
                             ([[1, 2], [3]], "not a list of lists"), (np.array(5), "(): pass a list, [id]"),
                             (mx.array([1.0, 2.0]), "not array holding 1.0"),
                             ([{"role": "user", "content": "hi"}], "tokenizer.apply_chat_template")):
        with pytest.raises(ValueError, match=re.escape(fragment)):
            generate(model, None, prompt, max_tokens=2)
    ids = generate(model, None, [1, 2, 3], max_tokens=4, mode="ar").tokens
    for prompt in ((1, 2, 3), np.array([1, 2, 3], np.int32), mx.array([1, 2, 3]), range(1, 4),
                   array.array("i", [1, 2, 3]), list(mx.array([1, 2, 3]))):
        assert generate(model, None, prompt, max_tokens=4, mode="ar").tokens == ids


def test_a_model_or_tokenizer_that_is_not_one_is_named():
    """What load() returns, in the wrong places: a TypeError naming the argument, before the
    engine would fail on it deep down."""
    model = with_adapter()

    class Tok:
        eos_token_ids = ()

        def encode(self, text):
            return [1, 2]

    for args, fragment in (((Tok(), model), "model must be a model from load(), not Tok: model and "
                                            "tokenizer swapped?"),
                           (("models/m", Tok()), "not str: load it first"),
                           ((None, Tok()), "model must be a model from load(), not NoneType"),
                           ((model, model), "tokenizer must be a tokenizer from load() or None, not Model")):
        with pytest.raises(TypeError, match=re.escape(fragment)):
            generate(*args, [1, 2], max_tokens=2)
    with pytest.raises(TypeError, match="stop must be a string or a list of strings, not int"):
        generate(model, Tok(), [1, 2], max_tokens=2, stop=5)


def test_mlx_lms_model_and_tokenizer_are_told_from_ours():
    """mlx-lm's model and tokenizer (and transformers') look like ours to the engine and failed
    deep down, or with advice that sent a user wrong; our model in mlx-lm's generate failed in our
    attention (found by a notebook walkthrough): one TypeError each, saying what to do."""
    import mlx_lm

    from mlx_specstream.api import DEFAULT_MODEL
    from mlx_specstream.trainer import train

    if not (DEFAULT_MODEL / "config.json").exists():
        pytest.skip("the default model is not built")
    theirs, their_tok = mlx_lm.load(str(DEFAULT_MODEL))
    ours, tok = load(DEFAULT_MODEL)
    for call in (lambda: generate(theirs, tok, [1, 2], max_tokens=2, mode="ar"),
                 lambda: load_adapter(theirs, "sql-lossless"), lambda: train(theirs, [], iters=1)):
        with pytest.raises(TypeError, match=r"not Model: mlx-lm's model: load its directory with "
                                            r"mlx_specstream.load\(PATH\)"):
            call()
    for other, library in ((their_tok, "mlx-lm"), (their_tok._tokenizer, "transformers")):
        with pytest.raises(TypeError, match=f"tokenizer must be a tokenizer from load\\(\\) or None, "
                                            f"not {type(other).__name__}: {library}'s tokenizer"):
            generate(ours, other, [1, 2], max_tokens=2, mode="ar")
    with pytest.raises(TypeError, match="mlx-lm's caches are not its own: decode it with mlx_specstream"):
        mlx_lm.generate(ours, their_tok, "SELECT", max_tokens=2)


def test_a_model_without_tokenizer_stops_at_the_eos_its_config_names(tmp_path):
    """The README's token-id example: no tokenizer files, EOS from config.json (the oracle: the
    same model's run without EOS, cut after the token made EOS)."""
    model = tiny_model("llama", scale=3.0)
    free = generate(model, None, [1, 2, 3], max_tokens=12, mode="ar").tokens
    eos = free[3]
    first = free.index(eos)
    with atomic_dir(tmp_path / "m", "model") as tmp:
        save_model(model, {**model.config, "eos_token_id": eos}, tmp)
    loaded, tok = load(tmp_path / "m")
    assert tok is None
    new_adapter(loaded, gamma=3, msa_layers=2, seed=1)  # lossless: SS writes what AR does
    for mode in ("ar", "ss"):
        out = generate(loaded, None, [1, 2, 3], max_tokens=12, mode=mode)
        assert out.tokens == free[:first] and out.finish_reason == "stop", mode  # EOS itself not emitted


def test_new_adapter_refuses_a_config_decoding_would_refuse():
    model = tiny_model("llama")
    for options, fragment in (({"tree_budget": 0}, "tree_budget must be >= 1, not 0"),
                              ({"branch": -1}, "branch must be >= 1, not -1"),
                              ({"branch": 257}, "branch must be at most 256"),
                              ({"prune_threshold": 5.0}, "prune_threshold must be in [0, 1]"),
                              ({"gamma": "4"}, "gamma is '4', which is not int")):
        with pytest.raises(AdapterError, match=re.escape(fragment)):
            new_adapter(model, **options)
    assert getattr(model, "adapter_config", None) is None
    had = new_adapter(model, seed=1)
    for seed in (-1, 1.5, 2**64):  # said before the adapter the model had goes
        with pytest.raises(OptionError, match=re.escape("seed must be a whole number in 0..2**64 - 1")):
            new_adapter(model, seed=seed)
        assert model.adapter_config is had
    # NumPy scalars are taken as the numbers they are (and save as JSON)
    cfg = new_adapter(model, gamma=np.int64(2), branch=np.int64(5), prune_threshold=np.float32(0.5))
    assert (cfg.gamma, cfg.branch, cfg.prune_threshold) == (2, 5, 0.5) and type(cfg.gamma) is int


def test_read_prompt_from_files_and_stdin(tmp_path, monkeypatch):
    """A file's byte-order mark is not part of the prompt; an empty or closed standard input is
    one error line, not a generation from nothing or a traceback."""
    import io

    from mlx_specstream.cli import _read_prompt

    (tmp_path / "bom.txt").write_bytes(b"\xef\xbb\xbfSELECT name")
    assert _read_prompt(None, tmp_path / "bom.txt") == "SELECT name"
    (tmp_path / "empty.txt").write_bytes(b"")
    with pytest.raises(ValueError, match="empty.txt: the prompt is empty"):
        _read_prompt(None, tmp_path / "empty.txt")
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    with pytest.raises(ValueError, match="standard input: the prompt is empty"):
        _read_prompt(None, None)
    monkeypatch.setattr(sys, "stdin", None)
    with pytest.raises(ValueError, match="no prompt"):
        _read_prompt(None, None)


def test_option_errors_speak_the_callers_language():
    e = OptionError("load one ({adapter}) or use {mode=ar}; {temperature} >= 0; {overwrite=True}; "
                    "{lookup=False}")
    assert str(e) == "load one (adapter) or use mode='ar'; temperature >= 0; overwrite=True; lookup=False"
    with pytest.raises(ValueError, match="no dialect 'CLI'"):
        e.render("CLI")
    assert e.render("cli") == ("load one (--adapter) or use --mode ar; --temp >= 0; --overwrite; "
                                  "--no-lookup")


def test_option_errors_keep_the_users_text_and_survive_copies():
    """A value the user gave is said as given, however it looks ('{x}'); a copy or a pickle of an
    error (or of a train log line) renders as the original."""
    import copy
    import pickle

    from mlx_specstream.errors import OutputExistsError, Said
    from mlx_specstream.loader import check_dtype

    with pytest.raises(OptionError) as e:
        check_dtype("{fp8}")
    assert (str(e.value), e.value.render("cli")) == ("dtype must be one of float32, float16, bfloat16, not "
                                                    "'{fp8}'", "--dtype must be one of float32, float16, "
                                                    "bfloat16, not '{fp8}'")
    exists = OutputExistsError(" already exists (use {overwrite=True} to replace it)", subject="/tmp/a{b}")
    said = Said(" holds the last step; {resume=True} finishes the run", subject="run{1}")
    for copied in (copy.copy(exists), pickle.loads(pickle.dumps(exists))):
        assert (str(copied), copied.render("cli")) == (str(exists), exists.render("cli"))
        assert str(copied) == "/tmp/a{b} already exists (use overwrite=True to replace it)"
    for copied in (copy.copy(said), pickle.loads(pickle.dumps(said))):
        assert (copied, copied.render("cli")) == ("run{1} holds the last step; resume=True finishes the run",
                                                  "run{1} holds the last step; --resume finishes the run")


def test_stop_strings_cut_the_text_where_they_begin():
    """The text up to a stop string, as OpenAI's: the token it begins in is emitted cut there
    (a character of byte tokens before it included); the tokens are the plain output's."""
    from mlx_specstream.api import load

    if not (DEFAULT_MODEL / "config.json").exists():
        pytest.skip("the default model is not built")
    model, tok = load(adapter="sql")
    prompt = first_sql_prompt()
    full = generate(model, tok, prompt, max_tokens=40)
    stop = full.text[10:13]  # a stop string from inside the output, wherever tokens split it
    out = generate(model, tok, prompt, max_tokens=40, stop=[stop])
    assert out.finish_reason == "stop" and out.text == full.text[: full.text.index(stop)]
    shown = tok.decode(out.tokens)  # the tokens: up to the one the stop string begins in
    assert shown.startswith(out.text) and len(tok.decode(out.tokens[:-1])) < len(out.text)
    assert out.tokens == full.tokens[: len(out.tokens)]
    # generated (the usage a server reports): through the token that completes the stop string
    assert out.stats.generated_tokens == next(k for k in range(41) if stop in tok.decode(full.tokens[:k]))
    # streaming never shows a stop string's beginning that is later cut; one string is one stop
    streamed = "".join(s.text for s in stream_generate(model, tok, prompt, max_tokens=40, stop=stop))
    assert streamed == out.text
    # a pass's accepted draft tokens past the stop string are not in the output, so not "accepted"
    code, _ = load(adapter="code")
    prompt = "# _collections_abc: Hashable.__subclasshook__\n@classmethod\ndef __subclasshook__(cls, C):\n"
    *_, last = stream_generate(code, tok, prompt, max_tokens=32, stop=" None")
    assert last.finish_reason == "stop" and len(last.accepted) <= len(last.tokens)
    # of stop strings that overlap, the one that ends first, as plain decoding meets it token by token
    lossless, _ = load(adapter="sql-lossless")
    plain = generate(lossless, tok, prompt, max_tokens=40, mode="ar")
    overlapping = [a for a in range(len(plain.text) - 4)  # where the longer one begins first
                   if plain.text.index(plain.text[a:a + 4]) < plain.text.index(plain.text[a + 2])]
    assert overlapping
    for a in overlapping:
        stops = [plain.text[a:a + 4], plain.text[a + 2]]
        ar = generate(lossless, tok, prompt, max_tokens=40, mode="ar", stop=stops)
        ss = generate(lossless, tok, prompt, max_tokens=40, stop=stops)
        assert ar.text == plain.text[:plain.text.index(stops[1])] == ss.text, stops
        assert ar.stats.generated_tokens == ss.stats.generated_tokens, stops
    for bad in ([""], ["x", ""], ""):
        with pytest.raises(ValueError, match="stop: a stop string must not be empty"):
            generate(model, tok, prompt, max_tokens=4, stop=bad)
    # a stop right after a character written as byte tokens, inside the token that completes it
    text = "SELECT * FROM t WHERE name = 'José';\nSELECT * FROM t WHERE name = 'Jos"
    assert generate(lossless, tok, text, max_tokens=12, mode="ar").text.startswith("é'")
    assert generate(lossless, tok, text, max_tokens=12, stop="'").text == "é"
    # max_tokens inside a character written as byte tokens: only that character is lost
    assert generate(lossless, tok, "SELECT 1; -- ü", max_tokens=15, mode="ar").text == "üüüüüüü\ufffd"
    # a character's byte tokens, then EOS alone in the last pass: the character is in the text
    import copy

    ends = copy.copy(tok)
    ends.eos_token_ids = {tok.token_to_id("▁")}  # the model writes "ü" and then this
    for mode in ("ar", "ss"):
        out = generate(lossless, ends, "-- ü ü ü ü ü ü\n-- ü ü ü ", max_tokens=40, mode=mode)
        assert out.text == tok.decode(out.tokens) == "ü", mode


def test_the_text_held_back_is_the_longest_end_that_begins_a_stop_string():
    """``held_back`` against its definition, on every short text and stop strings of two letters;
    and a stop string of 300,000 characters costs a pass nothing (it once took seconds)."""
    import itertools
    import random

    from mlx_specstream.api import held_back

    words = ["".join(w) for n in range(7) for w in itertools.product("ab", repeat=n)]
    rng = random.Random(0)
    for text in words:
        stop = rng.sample(words[1:], 3)
        want = max((k for s in stop for k in range(1, len(s)) if text.endswith(s[:k])), default=0)
        assert held_back(text, stop) == want, (text, stop)
    t = time.perf_counter()
    assert held_back("def add(a, b):\n    return a + b" * 40, ["x" * 300_000, "+ b" + "y" * 300_000]) == 3
    assert time.perf_counter() - t < 0.5  # quadratic: minutes


def test_byte_tokens_wait_for_their_character_before_a_stop():
    """A pass that ends with the byte tokens of a character holds them until its text comes: if
    the character begins a stop string, neither it nor its bytes are in the output."""
    from types import SimpleNamespace

    from mlx_specstream.api import responses
    from mlx_specstream.engine import Stats, Step
    from mlx_specstream.tokenizer import load_tokenizer

    default_model_or_skip()
    tok = load_tokenizer(DEFAULT_MODEL)
    ids = tok.encode("abé'", add_special_tokens=False)  # "ab", the two bytes of "é", then "'"
    assert [tok.is_byte_token(i) for i in ids] == [False, True, True, False]
    passes = [Step(ids[:3], [], []), Step(ids[3:], [], [])]
    stats = Stats(generated_tokens=len(ids))

    def steps():
        yield from passes

    out = list(responses(SimpleNamespace(steps=steps, stats=stats), tok, ["é"]))
    assert "".join(r.text for r in out) == "ab" and [t for r in out for t in r.tokens] == ids[:1]
    assert out[-1].finish_reason == "stop" and stats.generated_tokens == 3  # "ab", then "é"'s two bytes


def test_the_tokens_at_a_stop_are_those_of_the_text_whatever_holds_a_bytes_text():
    """At a stop, the tokens are the fewest whose text holds the output (the definition, checked
    by decoding), whatever the passes and wherever the stop string begins: also right after a
    newline, a byte token here, whose text comes with the token after it; the tokens' count is
    the one reported and their pieces are the text."""
    import random
    from types import SimpleNamespace

    from mlx_specstream.api import responses
    from mlx_specstream.engine import Stats, Step
    from mlx_specstream.tokenizer import load_tokenizer

    default_model_or_skip()
    tok = load_tokenizer(DEFAULT_MODEL)
    full = "import sys\nimport unittest\n\nfrom os import path\n    x = 'é'\n"
    ids = tok.encode(full, add_special_tokens=False)
    assert tok.decode(ids) == full and tok.is_byte_token(ids[2])  # a newline is a byte token
    rng = random.Random(0)
    for start in range(len(full) - 1):
        stop = full[start:start + rng.choice([1, 2, 4])]
        text = full[:full.index(stop)]
        want = next(k for k in range(len(ids) + 1) if tok.decode(ids[:k]).startswith(text))
        made = next(k for k in range(len(ids) + 1) if tok.decode(ids[:k]).startswith(text + stop))
        cuts = sorted(rng.sample(range(1, len(ids)), 4))
        passes = [Step(ids[a:b], [], []) for a, b in zip([0, *cuts], [*cuts, len(ids)])]
        passes[-1].finished = "length"
        stats = Stats()

        def steps(passes=passes, stats=stats):  # the engine counts each pass's tokens as it yields them
            for step in passes:
                stats.generated_tokens += len(step.tokens)
                yield step

        out = list(responses(SimpleNamespace(steps=steps, stats=stats), tok, [stop]))
        tokens = [t for r in out for t in r.tokens]
        assert "".join(r.text for r in out) == text and tokens == ids[:want], (stop, text)
        assert all("".join(r.pieces) == r.text for r in out) and stats.generated_tokens == made


def test_the_public_names_are_the_api_whatever_was_imported_before():
    """``from mlx_specstream import NAME`` gives the function or class, also once the module that
    defines it has been imported (a submodule of the same name would take its place)."""
    import importlib
    import types

    import mlx_specstream

    for name in mlx_specstream.__all__:
        importlib.import_module(mlx_specstream._API[name])
        for _ in range(2):
            assert not isinstance(getattr(mlx_specstream, name), types.ModuleType), name


def first_sql_prompt() -> str:
    return json.loads((DEFAULT_MODEL.parents[2] / "data" / "sql" / "test.jsonl").open().readline())["prompt"]


def default_model_or_skip():
    if not (DEFAULT_MODEL / "adapters" / "sql" / "adapter_config.json").exists():
        pytest.skip("the default model is not built")


def test_verbose_text_is_the_plain_text_with_colours(tmp_path):
    """What ``generate --verbose`` prints on a terminal, without its colour codes and the
    rejected drafts (dim red, in brackets), is exactly the plain CLI output; into a pipe or a
    file it prints the plain output itself."""
    from mlx_specstream.api import load
    from mlx_specstream.cli import _coloured

    default_model_or_skip()
    model, tok = load(adapter="sql")
    prompt = first_sql_prompt()
    for text in (prompt, prompt.rstrip("\n")):  # a prompt without its final newline too
        (tmp_path / "p.txt").write_text(text)
        plain = cli("generate", "--adapter", "sql", "--prompt-file", str(tmp_path / "p.txt"), "-n", "48")
        assert plain.returncode == 0, plain.stderr
        shown = "".join(_coloured(s, tok) for s in stream_generate(model, tok, text, max_tokens=48))
        assert "\x1b[32m" in shown and "\x1b[31m" in shown  # accepted drafts green, rejected red
        kept = ANSI.sub("", re.sub(r"\x1b\[31m\x1b\[2m\[.*?\]\x1b\[0m", "", shown))
        assert kept + "\n" == plain.stdout and "</s>" not in shown
        verbose = cli("generate", "--adapter", "sql", "--prompt-file", str(tmp_path / "p.txt"), "-n", "48",
                      "--verbose")
        assert verbose.returncode == 0 and "finish_reason: stop" in verbose.stderr
        assert verbose.stdout == plain.stdout


@pytest.fixture(scope="module")
def random_model_with_tokenizer(tmp_path_factory):
    """A random model with the shipped tokenizer: it rarely ends, so generation runs long."""
    default_model_or_skip()
    d = tmp_path_factory.mktemp("rnd") / "model"
    model = tiny_model("llama", vocab_size=4096, max_position_embeddings=8192)
    with atomic_dir(d, "model") as tmp:
        save_model(model, model.config, tmp)
        for name in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json"):
            if (DEFAULT_MODEL / name).exists():
                shutil.copy(DEFAULT_MODEL / name, tmp / name)
    new_adapter(model, gamma=2, msa_layers=2)
    save_adapter(model, d / "adapters" / "a")
    return d


def test_cli_errors_speak_cli(random_model_with_tokenizer, tmp_path):
    d = str(random_model_with_tokenizer)
    assert_one_line_error(cli("generate", "-m", d, "--prompt", "x"), "use --mode ar")
    assert_one_line_error(cli("generate", "-m", d, "--adapter", "a", "--prompt", "x", "--gamma", "0"),
                          "--gamma must be in 1..2")
    assert_one_line_error(cli("generate", "-m", d, "--mode", "ar", "--prompt", "x", "--gamma", "2"),
                          "--mode ar does not use --gamma: drop it")  # not ignored
    assert_one_line_error(cli("generate", "-m", d, "--adapter", "a", "--prompt", "x", "--branch", "0"),
                          "--branch must be >= 1")
    assert_one_line_error(cli("generate", "-m", d, "--adapter", "a", "--prompt", "x", "--tree-budget", "0"),
                          "--tree-budget must be >= 1")
    for n in ("0", "-5"):
        assert_one_line_error(cli("generate", "-m", d, "--mode", "ar", "--prompt", "x", "-n", n),
                              "--max-tokens must be >= 1")
    assert_one_line_error(cli("generate", "-m", d, "--adapter", "zzz", "--prompt", "x"), "this model has: a")
    # an empty --stop is said before the model loads (here none could)
    assert_one_line_error(cli("generate", "-m", str(tmp_path / "none"), "--stop", "", "--prompt", "x"),
                          "--stop: a stop string must not be empty")
    ar = ("generate", "-m", d, "--mode", "ar")
    assert_one_line_error(cli(*ar, "--prompt-file", str(tmp_path)), "not a file")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    assert_one_line_error(cli(*ar, "--prompt-file", str(tmp_path / "latin1.txt")), "latin1.txt: not UTF-8")
    assert_one_line_error(cli("generate", "-m", d, "--mode", "ar", "--prompt", "x " * 8300),
                          "at most 8191 fit: the model's context holds 8192 tokens")
    assert "lookup" in cli("generate", "--help").stdout
    for source in ([], ["--prompt", "caf\udcff"]):  # bytes that are not UTF-8, on stdin or in argv
        res = subprocess.run([sys.executable, "-m", "mlx_specstream.cli", *ar, *source], input=b"\xff\xfe x",
                             capture_output=True, timeout=600)
        res.stderr = res.stderr.decode()
        assert_one_line_error(res, "not UTF-8 text")


@pytest.mark.parametrize("sent,status,said", [(signal.SIGINT, 130, "interrupted"),
                                              (signal.SIGTERM, 143, "terminated")])
def test_interrupted_generate_says_so(random_model_with_tokenizer, sent, status, said):
    """Ctrl-C or SIGTERM: the text so far, then how many tokens, with the signal's own status."""
    p = subprocess.Popen([sys.executable, "-m", "mlx_specstream.cli", "generate", "-m",
                          str(random_model_with_tokenizer), "--mode", "ar", "--prompt", "x", "-n", "100000"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=deliverable_sigint)
    # generation has started; signalled at once, as this model fills its context in half a minute
    # (and once more after 10 s: once, in a loaded parallel run, a SIGINT went unseen)
    assert p.stdout.read(1)
    try:
        for wait in (10, 50):
            p.send_signal(sent)
            try:
                out, err = p.communicate(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        else:
            pytest.fail(f"generate went on after two {sent.name}s")
    finally:
        p.kill()
    assert p.returncode == status and out, err
    assert re.fullmatch(rf"{said} after \d+ generated tokens\n", err), err


def test_jsonl_errors_name_line_and_column(tmp_path):
    f = tmp_path / "train.jsonl"
    f.write_bytes(b'{"prompt": "a", "completion": "b"}\n{"prompt": "SELECT a FROM t", "com\rpletion": "x"}\n')
    with pytest.raises(ValueError, match=r"train.jsonl:2: invalid JSON at column 35: Invalid control"):
        load_jsonl(f, None)
    f.write_text('{"prompt": "SELECT a FROM t", "completion": "x" "y"}\n')
    with pytest.raises(ValueError, match=r"train.jsonl:1: invalid JSON at column 49"):
        load_jsonl(f, None)
    f.write_bytes(b'{"prompt": [1, 2], "completion": [3]}\n{"text": "caf\xe9"}\n')
    with pytest.raises(ValueError, match=r"train.jsonl:2: not UTF-8"):
        load_jsonl(f, None)


def test_empty_completions_are_counted_and_reported(tmp_path):
    from mlx_specstream.trainer import train

    f = tmp_path / "train.jsonl"
    f.write_text('{"prompt": [1, 2, 3], "completion": []}\n' * 3
                 + '{"prompt": [1, 2], "completion": [5, 6]}\n')
    ds = load_jsonl(f, None)
    assert ds.n_empty == 3 and ds.summary()["empty_completions"] == 3
    said = []  # trained on as given, empty completions teach the model to stop: said so
    train(tiny_model(), tmp_path, iters=1, progress=False, log=said.append, gamma=2, msa_layers=2,
          self_distill=False)
    assert any("3 of 4 examples have an empty completion" in s for s in said), said
    said.clear()  # lossless mode's default self-distillation gives them the base's continuation
    train(tiny_model(), tmp_path, iters=1, progress=False, log=said.append, gamma=2, msa_layers=2)
    assert not any("empty completion" in s for s in said) and any("self-distill" in s for s in said), said


def test_load_adapter_looks_under_the_models_own_directory(tmp_path, monkeypatch):
    from mlx_specstream.adapter import load_adapter
    from mlx_specstream.api import load
    from mlx_specstream.errors import AdapterError

    monkeypatch.chdir(DEFAULT_MODEL.parent)  # loaded by a relative path, then the notebook moves (%cd)
    model, _ = load(DEFAULT_MODEL.name, fuse=False)
    monkeypatch.chdir(tmp_path)
    assert load_adapter(model, "sql-lossless").name == "sql-lossless"  # no model_path needed
    assert model.path == DEFAULT_MODEL.absolute()
    (tmp_path / "empty").mkdir()
    with pytest.raises(AdapterError, match="empty: not an adapter directory"):
        load_adapter(model, tmp_path / "empty")


def test_an_adapter_over_a_fused_one_is_refused_as_the_fused_ones():
    from mlx_specstream.adapter import load_adapter
    from mlx_specstream.api import load
    from mlx_specstream.errors import AdapterError
    from mlx_specstream.trainer import train

    model, _ = load(DEFAULT_MODEL, adapter="sql")  # shared mode: fused by default
    assert model.fused_lora
    with pytest.raises(AdapterError, match=r"^adapter 'sql' is fused into this model's weights: load"):
        load_adapter(model, "sql-lossless")
    said = []  # and a training run over it, before it reads its data (a walkthrough saw its notices first)
    with pytest.raises(AdapterError, match=r"^adapter 'sql' is fused into this model's weights: load"):
        train(model, [{"prompt": "a", "completion": "b"}] * 8, iters=1, log=said.append, progress=False)
    assert said == []


@pytest.mark.parametrize("quantize", [(3, 7), "int4", (4,), (8, 48)])
def test_load_time_quantization_is_checked_in_python_terms(quantize):
    from mlx_specstream.api import load

    with pytest.raises(ValueError, match=r"quantize must be \(bits, group_size\)"):
        load(DEFAULT_MODEL, quantize=quantize)


def test_a_home_path_after_an_equals_sign_is_expanded(monkeypatch):
    """``--out=~/x``: the shell leaves ``~`` there, and a directory named "~" would be made in
    the current one; the CLI reads it as ``--out ~/x`` reads."""
    from mlx_specstream.cli import expand_home

    monkeypatch.setenv("HOME", "/home/someone")
    assert expand_home(["train", "--out=~/x", "--data", "~/d", "--model=~", "--prompt=~/not a path"]) == [
        "train", "--out=/home/someone/x", "--data", "~/d", "--model=/home/someone", "--prompt=~/not a path"]


def test_a_failed_adapter_load_keeps_the_adapter_the_model_had(tmp_path):
    """A bad setting or a broken adapter directory is refused, and the model keeps its adapter."""
    import mlx.core as mx

    from mlx_specstream.adapter import adapter_weights, load_adapter
    from mlx_specstream.errors import AdapterError

    model = with_adapter()
    save_adapter(model, tmp_path / "good")
    broken = tmp_path / "broken"
    shutil.copytree(tmp_path / "good", broken)
    weights = mx.load(str(broken / "adapter.safetensors"))
    mx.save_safetensors(str(broken / "adapter.safetensors"), dict(list(weights.items())[1:]))
    before = {k: v.tolist() for k, v in adapter_weights(model).items()}
    ref = generate(model, None, [1, 2, 3], max_tokens=8).tokens
    with pytest.raises(AdapterError, match="msa_layers must be in"):
        new_adapter(model, msa_layers=99)
    with pytest.raises(AdapterError, match="does not match its config"):
        load_adapter(model, broken)
    with pytest.raises(TypeError, match="did you mean 'rank'"):
        new_adapter(model, ranks=8)
    assert {k: v.tolist() for k, v in adapter_weights(model).items()} == before
    assert generate(model, None, [1, 2, 3], max_tokens=8).tokens == ref


def test_the_adapter_functions_say_what_their_model_argument_is_instead():
    from mlx_specstream.adapter import detach, load_adapter, new_adapter, save_adapter

    for call, hint in [(lambda: new_adapter("models/m"), "not str: load it first"),
                       (lambda: detach("m"), "not str"), (lambda: save_adapter("m", "a"), "not str"),
                       (lambda: load_adapter(("model", "tok"), "sql"), "not tuple: give the model of")]:
        with pytest.raises(TypeError, match=f"^model must be a model from load\\(\\), {hint}"):
            call()
    from mlx_specstream.runner import Runner

    with pytest.raises(TypeError, match=r"^model is a Core ML package's: its adapter is fixed at export"):
        detach(Runner.__new__(Runner))  # what generate takes for a package, which has no adapter to swap


def test_train_from_python_refuses_what_it_cannot_use(tmp_path):
    from mlx_specstream.data import Dataset, Example
    from mlx_specstream.errors import CheckpointError
    from mlx_specstream.trainer import train

    examples = [Example(list(range(1, 12)), 4)] * 40
    for data in (5, {"prompt": [1], "completion": [2]}, (Dataset(examples), 5)):
        with pytest.raises(ValueError, match="data: a directory, a list of rows"):
            train(with_adapter(), data, iters=1, progress=False)
    for data in (examples, (examples, None), Dataset(examples)):  # its Examples: a Dataset of them
        report = train(with_adapter(), data, iters=1, progress=False, self_distill=False, log=lambda m: None)
        assert report["iters"] == 1 and report["valid"]["step"] == 1  # validation held out of them
    with pytest.raises(ValueError, match="without out= would lose the adapter"):
        train(str(tmp_path), str(tmp_path), iters=1, progress=False)
    # each bad value is said by its option, before any work; the model keeps the adapter it had
    model = with_adapter()
    had = model.adapter_config
    pair = (Dataset(examples), None)
    for options, error, fragment in (
            ({"iters": 2.5}, OptionError, "iters must be a whole number, not 2.5"),
            ({"batch_size": 2.5}, OptionError, "batch_size must be a whole number"),
            ({"lr": "1e-3"}, OptionError, "lr must be a number, not '1e-3'"),
            ({"keep_checkpoints": -1}, OptionError, "keep_checkpoints must be a whole number >= 0"),
            ({"seed": 1.5}, OptionError, "seed must be a whole number in 0..2**64 - 1"),
            ({"seed": 2**64}, OptionError, "seed must be a whole number in 0..2**64 - 1"),
            ({"resume": "no"}, OptionError, "resume must be True or False, not 'no'"),
            ({"self_distill": 1}, OptionError, "self_distill must be True or False (or None)"),
            ({"callback": 5}, TypeError, "callback must be a function of (step, info), not int"),
            ({"out": 5}, TypeError, "out must be a str or a Path, not int"),
            ({"tokenizer": str(DEFAULT_MODEL)}, TypeError, "tokenizer must be a tokenizer (one with encode, "
             "as load() returns) or None, not str"),
            ({"model_path": tmp_path / "typo", "out": "x"}, CheckpointError,
             "typo: no such model directory")):
        with pytest.raises(error, match=re.escape(fragment)):
            train(model, pair, progress=False, **options)
        assert model.adapter_config is had
    assert not (tmp_path / "typo").exists()  # no adapter tree where no model is
    for bad, fragment in (((model, None), "not tuple: give the model of model, tokenizer = load(PATH)"),
                          (None, "model must be a model directory or a model from load(), not NoneType")):
        with pytest.raises(TypeError, match=re.escape(fragment)):
            train(bad, pair, progress=False)
    with pytest.raises(TypeError, match=re.escape("train() got an unexpected keyword argument "
                                                  "'learning_rate' (did you mean 'lr'?)")):
        train(model, pair, learning_rate=1e-3)  # mlx-lm's name
    with pytest.raises(TypeError, match=re.escape("'grad_checkpoint' (no gradient checkpointing here: "
                                                  "a lower batch_size")):  # no "did you mean"
        train(model, pair, grad_checkpoint=True)
    # a Dataset made in Python is checked as a file's rows are
    for ds, fragment in ((Dataset([]), "data[0] (train): no examples"),
                         (Dataset([Example([1, 99999, 3], 1)]), "data[0] (train): example 0: token id out of "
                          "range for a vocabulary of"),
                         (Dataset([Example([1, 2, 3], 5)]), "example 0: n_prompt is 5, outside its 3 tokens"),
                         (Dataset([Example(list(range(1, 40)), 2)]), "example 0: 39 tokens, more than "
                          "max_seq_len=32")):
        with pytest.raises(ValueError, match=re.escape(fragment)):
            train(model, (ds, None), max_seq_len=32, progress=False)
    with pytest.raises(ValueError, match=re.escape("data[1] (valid): no examples")):
        train(model, (Dataset(examples), Dataset([])), progress=False)
    # the training set alone is named as the caller named it: data[2] is its third row
    with pytest.raises(ValueError, match=re.escape("data[2]: 'prompt' and 'completion' must both be")):
        train(model, [{"prompt": [1, 2], "completion": [3]}] * 2 + [{"prompt": 1, "completion": [3]}],
              progress=False)
    with pytest.raises(ValueError, match=re.escape("data: no examples")):
        train(model, Dataset([]), progress=False)
    assert model.adapter_config is had


def test_train_in_memory_uses_the_models_tokenizer_and_keeps_its_ngrams(tmp_path):
    """A model from ``load`` trains on text data with its own tokenizer (no ``tokenizer=``), and
    the adapter trained in memory drafts with the data's n-grams as a saved one does."""
    from mlx_specstream.api import load
    from mlx_specstream.trainer import train

    default_model_or_skip()
    rows = [{"prompt": f"SELECT c{i} FROM", "completion": f" t{i}"} for i in range(6)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    model, _ = load()
    report = train(model, tmp_path, mode="lossless", self_distill=False, iters=1, batch_size=2,
                   val_every=0, accept_prompts=0, progress=False, msa_layers=2)
    assert report["process_rank"] == 0 and report["config"]["rank"] == 8
    assert model.adapter_ngrams is not None and model.adapter_ngrams.next
    # saved afterwards, it records its run as one trained with out= does
    saved = json.loads((save_adapter(model, tmp_path / "mine") / "adapter_config.json").read_text())
    assert saved["name"] == "mine" and saved["training"]["iters"] == 1
    assert saved["training"]["base_model"] == "models/specstream-tiny/mlx"


def test_accepted_drafts_are_those_in_the_output():
    """A pass's ``accepted`` is a prefix of what it emitted: not the draft tokens past
    ``max_tokens`` (the shipped model and adapter, whose drafts run past small limits)."""
    default_model_or_skip()
    model, tok = load(DEFAULT_MODEL, adapter="sql")
    test_split = Path(__file__).parent.parent / "data" / "sql" / "test.jsonl"
    prompt = json.loads(test_split.open().readline())["prompt"]
    cut = 0
    for limit in range(1, 9):
        steps = list(stream_generate(model, tok, prompt, max_tokens=limit))
        assert sum(len(s.tokens) for s in steps) <= limit
        for s in steps:
            assert s.accepted == s.tokens[: len(s.accepted)], (limit, s.tokens, s.accepted)
        cut += steps[-1].finish_reason == "length" and len(steps[-1].tokens) > 1
    assert cut  # some passes' drafts reached the limit


def test_sql_names_refuses_token_ids_outside_the_vocabulary_before_reading_them():
    default_model_or_skip()
    model, tok = load(DEFAULT_MODEL, adapter="sql")
    for bad in (-3, tok.vocab_size):
        with pytest.raises(ValueError, match=f"token id {bad}, outside the model's vocabulary"):
            generate(model, tok, [1, bad], sql_names=True, max_tokens=2)


def test_a_core_ml_package_given_as_a_model_directory_says_what_it_is(tmp_path):
    from mlx_specstream.api import load
    from mlx_specstream.errors import CheckpointError

    pkg = tmp_path / "SQL.mlpackage"
    pkg.mkdir()
    (pkg / "Manifest.json").write_text("{}")
    said = "SQL.mlpackage: a Core ML package, not an MLX model directory: generate --model runs it; in " \
        "Python, coreml_driver.load_package"
    with pytest.raises(CheckpointError, match=said):
        load(pkg)
