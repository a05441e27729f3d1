"""The benchmark: every method runs on the same prompts; lossless methods (ours and mlx-lm's, an
independent implementation) reproduce our AR output; results.json / .md / .png are written. The
timing harness (repeats, best run, reference, bootstrap interval, warning) runs fake decoders
whose times the tests set."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from mlx_specstream.adapter import AdapterConfig, attach, fine_tune_weights, new_adapter, save_adapter
from mlx_specstream.api import DEFAULT_MODEL, load
from mlx_specstream.bench import (
    Method,
    best_time,
    read_prompts,
    reference,
    results_markdown,
    run_bench,
    speedup,
    task_metrics,
    time_methods,
)
from mlx_specstream.data import DataError
from mlx_specstream.errors import AdapterError
from mlx_specstream.project import PROJECT_DATA
from mlx_specstream.tokenizer import load_tokenizer

pytestmark = pytest.mark.skipif(not (DEFAULT_MODEL / "config.json").exists(), reason="no default model")
FIELDS = {"method", "mean_accepted_tokens", "tokens_per_s", "speedup", "speedup_ci95", "exact_match",
          "extra_params", "peak_memory_mb", "per_prompt"}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """The default model's weights with freshly made (random, non-zero) adapters of every kind,
    so the test does not depend on how well the shipped adapters are trained."""
    d = tmp_path_factory.mktemp("bench") / "model"
    d.mkdir()
    for f in DEFAULT_MODEL.iterdir():
        if f.is_file():
            (d / f.name).symlink_to(f.resolve())
    (d / "draft").symlink_to((DEFAULT_MODEL / "draft").resolve())
    model, _ = load(d)
    for name, mode in (("sql-lossless", "lossless"), ("sql", "shared"), ("sql-lora", "lora")):
        new_adapter(model, mode=mode, gamma=3, msa_layers=2, seed=1)
        save_adapter(model, d / "adapters" / name)
    tuned = AdapterConfig(mode="lossless", gamma=3, msa_layers=2, main_rank=8)  # over sql-lora
    attach(model, tuned, seed=2, lora_scale=0.02, fine_tune=fine_tune_weights(model))
    save_adapter(model, d / "adapters" / "sql-tuned")
    return d


def test_run_bench_all_methods(model_dir, tmp_path):
    res = run_bench(model_dir, "sql", n=2, max_tokens=12, out_dir=tmp_path, draft_path=model_dir / "draft",
                    command="test", repeats=1)
    names = [r["method"] for r in res["results"]]
    assert names == ["ar", "mlx-lm ar", "mlx-lm draft", "lookup", "ss-lossless chain", "ss-lossless tree",
                     "ss-lossless tree+prune", "ss-shared", "ss-shared ar", "lora-ar", "ss-tuned"]
    assert res["meta"]["skipped"] == {}
    by = {r["method"]: r for r in res["results"]}
    for r in res["results"]:
        assert FIELDS <= set(r)
        if "identical_to_ar" in r:  # the lossless claim, checked inside the benchmark
            assert r["identical_to_ar"], r
    assert by["ss-tuned"]["compared_with"] == "lora-ar"
    assert res["meta"]["reference"] in ("ar", "mlx-lm ar")  # the faster plain AR
    assert by[res["meta"]["reference"]]["speedup"] == 1.0
    assert by["ar"]["mean_accepted_tokens"] == pytest.approx(1.0, abs=0.1)
    assert by["ar"]["extra_params"] == 0 and by["ss-shared"]["extra_params"] > 0
    assert by["mlx-lm draft"]["extra_params"] > 100_000  # the draft model's parameters
    assert by["ss-lossless tree"]["mean_accepted_tokens"] >= 1.0
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["results"] == res["results"] and saved["meta"]["command"] == "test"
    assert (tmp_path / "results.md").read_text() == results_markdown(res["meta"], res["results"])
    assert (tmp_path / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_times_a_users_adapters_on_a_users_prompts(model_dir, tmp_path, capsys):
    """``bench --adapter A --adapter B --data DIR``: each adapter by its mode (``ss NAME``, and
    ``ar NAME`` where it carries a fine-tune), each lossless one checked against the plain decoding
    under it; the prompts and references read from the user's file (here valid.jsonl, said), in the
    formats train reads, text rows skipped and said; exact match against plain greedy decoding."""
    from mlx_specstream.api import generate

    base, tok = load(model_dir)
    prompts = [json.loads(line)["prompt"] for line in (PROJECT_DATA / "sql" / "test.jsonl").open()][:2]
    expected = generate(base, tok, prompts[0], max_tokens=10, mode="ar").text  # what plain decoding writes
    data = tmp_path / "mine"
    data.mkdir()
    rows = [{"prompt": prompts[0], "completion": expected}, {"text": "no prompt here"},
            {"prompt": tok.encode(prompts[1]), "completion": tok.encode(" nothing like it")}]
    (data / "valid.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = run_bench(model_dir, None, 5, 10, tmp_path / "out", data=data, repeats=1, command="test",
                    adapters=["sql-lossless", "sql", "sql-lora", "sql-tuned"])
    err = capsys.readouterr().err
    assert "has no test.jsonl: timing the prompts of valid.jsonl" in err and "skipped 1 text row" in err
    by = {r["method"]: r for r in res["results"]}
    assert list(by) == ["ar", "mlx-lm ar", "mlx-lm draft", "lookup", "ss sql-lossless", "ar sql", "ss sql",
                        "ar sql-lora", "ar sql-tuned", "ss sql-tuned"]
    assert by["ss sql-lossless"]["identical_to_ar"] and by["ss sql-lossless"]["compared_with"] == "ar"
    assert by["ss sql-tuned"]["identical_to_ar"] and by["ss sql-tuned"]["compared_with"] == "ar sql-tuned"
    assert "identical_to_ar" not in by["ss sql"] and "identical_to_ar" not in by["ar sql-lora"]
    # the tuned adapter carries sql-lora's fine-tune: its plain decoding is that fine-tune's
    assert by["ar sql-tuned"]["per_prompt"] == [{**p, "best_s": q["best_s"], "times_s": q["times_s"]}
                                                for p, q in zip(by["ar sql-lora"]["per_prompt"],
                                                                by["ar sql-tuned"]["per_prompt"])]
    assert by["ar"]["exact_match"] == 0.5 and "edit_similarity" in by["ar"]  # a user's data: no task
    assert res["meta"]["task"] is None and res["meta"]["data"].endswith("mine/valid.jsonl")
    assert res["meta"]["prompts"] == 2 and res["meta"]["skipped"] == {}
    assert f"prompts {res['meta']['data']}, model" in (tmp_path / "out" / "results.md").read_text()


def test_bench_takes_paths_as_text_and_says_prompts_without_a_reference(tmp_path, capsys):
    """str paths, as load and train take them; prompts given alone (``"completion": ""``, as
    lossless training takes them) judge nothing: the metrics are over the others, and said."""
    clock, tok = FakeClock(), load_tokenizer(DEFAULT_MODEL)
    texts = [f"SELECT {p}" for p in range(3)]
    index = {tuple(tok.encode(x)): p for p, x in enumerate(texts)}.__getitem__
    x = {p: list(tok.encode("x", add_special_tokens=False)) for p in range(3)}  # every output "x"

    def methods():
        return [fake_method(clock, "ar", {p: [1.0] * 3 for p in range(3)}, tokens=x,
                            index=lambda ids: index(tuple(ids)), plain_ar=True)]

    data = tmp_path / "mine.jsonl"
    data.write_text("".join(json.dumps({"prompt": x, "completion": c}) + "\n"
                            for x, c in zip(texts, ["", "x", "nothing"])))
    res = run_bench(str(DEFAULT_MODEL), None, 3, 16, str(tmp_path / "out"), data=str(data), methods=methods(),
                    clock=clock)
    assert "1 prompt of 3 has no completion to judge the output against: exact match over the other 2" \
        in capsys.readouterr().err
    assert res["results"][0]["exact_match"] == 0.5  # the fake decoder writes "x"
    assert (tmp_path / "out" / "results.json").is_file()
    data.write_text("".join(json.dumps({"prompt": x, "completion": ""}) + "\n" for x in texts))
    res = run_bench(DEFAULT_MODEL, None, 3, 16, tmp_path / "out2", data=data, methods=methods(), clock=clock)
    assert "3 prompts of 3 have no completion to judge the outputs against: no exact match" \
        in capsys.readouterr().err
    assert "exact_match" not in res["results"][0] and "edit_similarity" not in res["results"][0]


def test_every_method_stops_where_the_context_ends(tmp_path):
    """A prompt near the end of the model's context: every method is asked for the tokens that fit
    (ours stop there; mlx-lm's would run on past it, and read as not identical)."""
    limit = json.loads((DEFAULT_MODEL / "config.json").read_text())["max_position_embeddings"]
    asked = []

    def run(ids, max_tokens):
        asked.append((len(ids), max_tokens))
        return [7] * max_tokens, max_tokens

    data = tmp_path / "near.jsonl"
    data.write_text(json.dumps({"prompt": [5] * (limit - 3), "completion": [3]}) + "\n"
                    + json.dumps({"prompt": [5, 6], "completion": [3]}) + "\n")
    run_bench(DEFAULT_MODEL, None, 2, 8, tmp_path / "out", data=data, repeats=1,
              methods=[Method("ar", run, plain_ar=True)])
    assert asked[1:] == [(limit - 3, 3), (2, 8)]  # after the warm-up


def test_the_projects_prompts_are_judged_by_their_tasks_rule(tmp_path):
    """No --task and no --data: the project's sql prompts, judged by the SQL rule, recorded so."""
    def run(ids, max_tokens):
        return [7] * min(max_tokens, 2), 2

    res = run_bench(DEFAULT_MODEL, None, 2, 8, tmp_path / "out", repeats=1,
                    methods=[Method("ar", run, plain_ar=True)])
    assert res["meta"]["task"] == "sql" and res["meta"]["data"] == "data/sql/test.jsonl"
    assert "edit_similarity" not in res["results"][0]  # the SQL rule: exact match alone


def test_task_metrics():
    assert task_metrics("sql", ["SELECT a FROM t;", "select b", "SELECT a FROM t WHERE c = 'X'"],
                        ["SELECT  a\nFROM t", "SELECT b", "SELECT a FROM t WHERE c = 'x'"]) == {
        "exact_match": 0.3333}  # whitespace and a final ";" normalised; case kept (a literal's matters)
    m = task_metrics("code", ["return x\n", "retrun"], ["return x", "return"])
    # "retrun" -> "return": 5 of 6 characters in the longest matching blocks: ratio 2 * 5 / 12
    assert m == {"exact_match": 0.5, "edit_similarity": round((1.0 + 10 / 12) / 2, 4)}


def test_a_reply_that_calls_tools_is_read_as_train_reads_it(tmp_path, capsys):
    """A messages row ending in tool calls (content null), which train learns, is a prompt to
    time with no text to judge its output against."""
    from test_data_jsonl import shipped_tokenizer_copy

    tok = shipped_tokenizer_copy(tmp_path / "tok")
    tok.chat_template = ("{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% for c in "
                         "m['tool_calls'] or [] %}<call>{{ c['function'] | tojson }}{% endfor %}{% endfor %}"
                         "{% if add_generation_prompt %}[assistant]{% endif %}")
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    rows = [{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": None,
                                                                "tool_calls": [call]}]},
            {"messages": [{"role": "user", "content": "r"}, {"role": "assistant", "content": "yes"}]}]
    data = tmp_path / "valid.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    prompts, refs = read_prompts(data, tok, 2)
    assert refs == ["", "yes"] and prompts[0] == tok.apply_chat_template(rows[0]["messages"][:1])
    assert "1 prompt of 2 has no completion to judge" in capsys.readouterr().out


def test_bench_cli_errors(tmp_path):
    from test_cli import assert_one_line_error, cli

    assert_one_line_error(cli("bench", "--task", "poetry", "--out", str(tmp_path)), "sql or code")
    assert_one_line_error(cli("bench", "--model", str(tmp_path / "nope"), "--out", str(tmp_path)),
                          "no such model directory")
    assert_one_line_error(cli("bench", "--repeats", "0", "--out", str(tmp_path)),
                          "--repeats must be a whole number >= 1")
    assert_one_line_error(cli("bench", "--n", "-1", "--out", str(tmp_path)), "--n must be a whole number")
    assert_one_line_error(cli("bench", "--draft-model", str(tmp_path / "typo"), "--out", str(tmp_path)),
                          "--draft-model")
    assert_one_line_error(cli("bench", "--adapter", "typo", "--out", str(tmp_path)),
                          "adapter 'typo' not found")
    assert_one_line_error(cli("bench", "--data", str(tmp_path / "nowhere"), "--out", str(tmp_path)),
                          "nowhere: no such data file or directory")


def test_bench_refuses_before_it_runs(tmp_path):
    """What would fail after minutes of timing fails first: results that cannot be written, no
    tokens to generate, a model without a tokenizer (in-process: no CLI start-up)."""
    (tmp_path / "afile").write_text("x")
    with pytest.raises(PermissionError, match="cannot write the results to"):
        run_bench(DEFAULT_MODEL, "sql", 1, 8, tmp_path / "afile" / "sub", methods=[])
    with pytest.raises(ValueError, match="max_tokens must be a whole number >= 1"):
        run_bench(DEFAULT_MODEL, "sql", 1, 0, tmp_path / "out", methods=[])
    with pytest.raises(FileNotFoundError, match="no tokenizer files"):
        run_bench(tmp_path, "sql", 1, 8, tmp_path / "out", methods=[])
    for name, value in (("n", 2.5), ("n", True), ("repeats", 1.5), ("max_tokens", "8"), ("n", 0)):
        with pytest.raises(ValueError, match=f"^{name} must be a whole number( >= 1)?, not {value!r}$"):
            run_bench(DEFAULT_MODEL, "sql", **{"n": 1, "max_tokens": 8, name: value},
                      out_dir=tmp_path / "out", methods=[])
    with pytest.raises(TypeError, match="out_dir must be a str or a Path, not int"):
        run_bench(DEFAULT_MODEL, "sql", 1, 8, 5, methods=[])
    # a user's adapters and prompts: each adapter there, no two of one name, the data there and readable
    shutil.copytree(DEFAULT_MODEL / "adapters" / "sql", tmp_path / "x" / "sql")
    with pytest.raises(ValueError, match="two adapters named 'sql'"):
        run_bench(DEFAULT_MODEL, None, 1, 8, tmp_path / "out", adapters=["sql", tmp_path / "x" / "sql"],
                  methods=[])
    with pytest.raises(ValueError, match="a list of adapter names"):
        run_bench(DEFAULT_MODEL, None, 1, 8, tmp_path / "out", adapters="sql", methods=[])
    with pytest.raises(ValueError, match="system_prompt is a turn of the chat template"):
        run_bench(DEFAULT_MODEL, None, 1, 8, tmp_path / "out", system_prompt="Be brief.", methods=[])
    with pytest.raises(AdapterError, match="adapter 'typo' not found"):
        run_bench(DEFAULT_MODEL, None, 1, 8, tmp_path / "out", adapters=["sql", "typo"], methods=[])
    (tmp_path / "mine").mkdir()
    with pytest.raises(DataError, match="no test.jsonl or valid.jsonl"):
        run_bench(DEFAULT_MODEL, None, 1, 8, tmp_path / "out", data=tmp_path / "mine", methods=[])
    (tmp_path / "mine" / "test.jsonl").mkdir()  # said as what it is, not passed over for valid.jsonl
    with pytest.raises(DataError, match="test.jsonl is a directory: test.jsonl must be a JSONL file"):
        run_bench(DEFAULT_MODEL, None, 1, 8, tmp_path / "out", data=tmp_path / "mine", methods=[])
    (tmp_path / "mine" / "test.jsonl").rmdir()
    (tmp_path / "mine" / "test.jsonl").write_text('{"text": "a"}\n{"prompt": "b"}\n')
    with pytest.raises(DataError, match="test.jsonl:2: has 'prompt' but no 'completion'"):
        run_bench(DEFAULT_MODEL, None, 1, 8, tmp_path / "out", data=tmp_path / "mine", methods=[])
    (tmp_path / "mine" / "test.jsonl").write_text('{"text": "a"}\n')
    with pytest.raises(DataError, match="no prompts"):
        run_bench(DEFAULT_MODEL, None, 1, 8, tmp_path / "out", data=tmp_path / "mine", methods=[])
    (tmp_path / "mine" / "test.jsonl").write_text('{"prompt": [1, 2], "completion": [3]}\n'
                                                  '{"prompt": [1, 4096], "completion": [3]}\n')
    with pytest.raises(DataError, match="test.jsonl:2: token id out of range for a vocabulary of 4096"):
        run_bench(DEFAULT_MODEL, None, 2, 8, tmp_path / "out", data=tmp_path / "mine", methods=[])
    limit = json.loads((DEFAULT_MODEL / "config.json").read_text())["max_position_embeddings"]
    long_row = json.dumps({"prompt": [5] * limit, "completion": [3]})
    (tmp_path / "mine" / "test.jsonl").write_text('{"prompt": [1, 2], "completion": [3]}\n' + long_row)
    with pytest.raises(DataError, match=f"test.jsonl:2: the prompt has {limit} tokens, and at most"):
        run_bench(DEFAULT_MODEL, None, 2, 8, tmp_path / "out", data=tmp_path / "mine", methods=[])


def test_too_few_prompts_flag_the_interval(tmp_path, capsys):
    """A bootstrap over fewer than MIN_BOOTSTRAP_PROMPTS prompts bounds nothing: even a steady
    method's (zero-width) interval is flagged; the reference's is not."""
    from mlx_specstream.bench import MIN_BOOTSTRAP_PROMPTS

    clock, tok = FakeClock(), load_tokenizer(DEFAULT_MODEL)
    n = MIN_BOOTSTRAP_PROMPTS - 1
    texts = [f"SELECT {p}" for p in range(n)]
    index = {tuple(tok.encode(x)): p for p, x in enumerate(texts)}.__getitem__
    methods = [fake_method(clock, name, {p: [t] * 3 for p in range(n)}, index=lambda ids: index(tuple(ids)),
                           **kw) for name, t, kw in [("ar", 1.0, dict(plain_ar=True)), ("steady", 0.5, {})]]
    data = tmp_path / "data"
    data.mkdir()
    (data / "test.jsonl").write_text("".join(json.dumps({"prompt": x, "completion": "x"}) + "\n"
                                             for x in texts))
    res = run_bench(DEFAULT_MODEL, "sql", n + 3, 16, tmp_path / "out", data=data, methods=methods,
                    clock=clock)  # more asked for than there are: all of them, and said
    assert f"has {n} prompts, fewer than the {n + 3} asked for" in capsys.readouterr().err
    by = {r["method"]: r for r in res["results"]}
    assert by["steady"]["speedup_ci95"] == [2.0, 2.0] and not by["steady"]["interval_within_10pct"]
    assert by["ar"]["interval_within_10pct"]
    shown = (tmp_path / "out" / "results.md").read_text()
    assert "steady" in shown.split(f"fewer than {MIN_BOOTSTRAP_PROMPTS} prompts")[1] and "wider" not in shown


# --- the timing harness, with fake decoders whose times the test sets ------------------------

class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def fake_method(clock, name, times, tokens=None, calls=None, log=None, index=lambda ids: ids[0], **kw):
    """A decoder taking ``times[p][run]`` seconds on ``clock`` for prompt p = ``index(ids)``;
    it generates ``tokens[p]`` (default: 1..10) in ``calls`` passes (default: one per token)."""
    seen = {}

    def run(ids, max_tokens):
        if max_tokens == 4:  # the warm-up run, outside the timings
            return [1], 1
        p = index(ids)
        r = seen.get(p, 0)
        seen[p] = r + 1
        clock.now += times[p][r]
        if log is not None:
            log.append((name, p, r))
        out = tokens[p] if tokens else list(range(1, 11))
        return out, calls or len(out)

    return Method(name, run, **kw)


def test_each_prompt_runs_every_method_repeatedly_interleaved_and_the_fastest_run_counts():
    clock, log = FakeClock(), []
    a = fake_method(clock, "a", {0: [3.0, 1.0, 2.0], 1: [5.0, 6.0, 4.0]}, log=log)
    b = fake_method(clock, "b", {0: [1.5, 2.5, 0.5], 1: [2.0, 2.0, 2.0]}, log=log)
    time_methods([a, b], [[0], [1]], max_tokens=16, repeats=3, clock=clock)
    assert log == [(m, p, r) for p in (0, 1) for r in range(3) for m in "ab"]
    assert [r["time"] for r in a.records] == [1.0, 4.0] and [r["time"] for r in b.records] == [0.5, 2.0]
    assert a.records[1]["times"] == [5.0, 6.0, 4.0]
    with pytest.raises(ValueError, match="repeats must be a whole number >= 1"):
        time_methods([a], [[0]], 16, repeats=0, clock=clock)


def test_best_time_is_the_fastest_run_after_a_warm_up():
    clock, durations = FakeClock(), iter([9.0, 3.0, 1.5, 2.0])  # the first call warms up

    def fn():
        clock.now += next(durations)

    assert best_time(fn, repeats=3, clock=clock) == 1.5


def timed(clock, name, best_times, **kw):
    m = fake_method(clock, name, {p: [t] for p, t in enumerate(best_times)}, **kw)
    time_methods([m], [[p] for p in range(len(best_times))], 16, repeats=1, clock=clock)
    return m


def test_the_reference_is_the_faster_plain_ar_decoder():
    clock = FakeClock()
    ours = timed(clock, "ar", [2.0, 2.0], plain_ar=True)
    theirs = timed(clock, "mlx-lm ar", [1.0, 1.5], plain_ar=True)
    ss = timed(clock, "ss", [1.0, 0.75])  # fastest of all, but not a plain AR decoder
    assert reference([ours, theirs, ss]) is theirs
    assert reference([ours, ss]) is ours
    assert reference([ss, ours]) is ours  # not merely the first method
    assert speedup(ss, theirs)[0] == pytest.approx(2.5 / 1.75)
    assert speedup(ours, theirs)[0] == pytest.approx(2.5 / 4.0)
    assert speedup(theirs, theirs) == (1.0, 1.0, 1.0)
    # mlx-lm's AR decoding another model (a window it does not read: found by a walkthrough's
    # Mixtral) is no reference, however fast
    other = timed(clock, "mlx-lm ar", [1.0, 1.5], plain_ar=True, reproduces="ar",
                  tokens={0: list(range(1, 11)), 1: [7] * 10})
    assert reference([ours, other, ss]) is ours
    same = timed(clock, "mlx-lm ar", [1.0, 1.5], plain_ar=True, reproduces="ar")
    assert reference([ours, same, ss]) is same


def test_speedup_is_per_generated_token():
    clock = FakeClock()
    ar = timed(clock, "ar", [1.0, 1.0], plain_ar=True)
    short = timed(clock, "short", [0.5, 0.5], tokens={0: [1] * 5, 1: [1] * 5})  # half the tokens
    assert speedup(short, ar)[0] == pytest.approx(1.0)


def test_bootstrap_interval_matches_the_delta_method_and_is_reproducible():
    """Ratio of summed times over 200 prompts: the percentile bootstrap's 95% interval agrees
    with the normal interval of the delta method, Var(R) ~ Var(a - R b) / (P mean(b)^2)."""
    rng = np.random.default_rng(1)
    a = rng.uniform(0.5, 2.0, 200)  # reference times
    b = a / 1.5 * rng.lognormal(0, 0.3, 200)  # ~1.5x faster, noisy per prompt
    clock = FakeClock()
    ref, m = timed(clock, "ar", list(a), plain_ar=True), timed(clock, "m", list(b))
    ratio, lo, hi = speedup(m, ref)
    assert ratio == pytest.approx(a.sum() / b.sum())
    se = np.sqrt(np.var(a - ratio * b) / (len(a) * b.mean() ** 2))
    assert lo == pytest.approx(ratio - 1.96 * se, abs=0.2 * se)
    assert hi == pytest.approx(ratio + 1.96 * se, abs=0.2 * se)
    assert speedup(m, ref) == (ratio, lo, hi)  # fixed seed
    same = timed(clock, "same", list(a / 2))  # exactly 2x on every prompt: no uncertainty
    assert speedup(same, ref) == pytest.approx((2.0, 2.0, 2.0))


def test_results_json_and_the_wide_interval_warning(tmp_path):
    """run_bench with fake decoders: the reference, intervals, per-prompt times, the lossless
    check against the method each one reproduces, and the warning for an interval wider than +-10%."""
    clock = FakeClock()
    n = 8
    ar_t = {p: [1.0, 1.2, 1.1] for p in range(n)}
    lm_t = {p: [0.9, 0.8, 1.0] for p in range(n)}
    steady = {p: [0.5, 0.6, 0.5] for p in range(n)}  # 1.6x on every prompt
    noisy = {p: [0.2 if p % 2 else 1.6] * 3 for p in range(n)}  # 0.4x to 4x
    wrong = {p: list(range(1, 11)) if p else [9, 9] for p in range(n)}  # differs on prompt 0
    tok = load_tokenizer(DEFAULT_MODEL)
    texts = [f"SELECT {p}" for p in range(n)]
    index = {tuple(tok.encode(x)): p for p, x in enumerate(texts)}.__getitem__
    methods = [fake_method(clock, name, times, index=lambda ids: index(tuple(ids)), **kw)
               for name, times, kw in [
                   ("ar", ar_t, dict(plain_ar=True)),
                   ("mlx-lm ar", lm_t, dict(reproduces="ar", plain_ar=True)),
                   ("steady", steady, dict(reproduces="ar", calls=5)),
                   ("noisy", noisy, {}),
                   ("broken", steady, dict(tokens=wrong, reproduces="ar")),
                   ("tuned ar", ar_t, dict(tokens=wrong)),  # another model's AR: its own reference
                   ("tuned", steady, dict(tokens=wrong, reproduces="tuned ar"))]]
    data = tmp_path / "data"
    data.mkdir()
    (data / "test.jsonl").write_text("".join(json.dumps({"prompt": x, "completion": "x"}) + "\n"
                                             for x in texts))
    res = run_bench(DEFAULT_MODEL, "sql", n, 16, tmp_path / "out", data=data, command="test",
                    methods=methods, clock=clock)
    meta, by = res["meta"], {r["method"]: r for r in res["results"]}
    assert meta["reference"] == "mlx-lm ar" and meta["repeats"] == 3 and meta["command"] == "test"
    assert {"machine", "date", "mlx", "versions", "bootstrap", "load_average_1m"} <= set(meta)
    assert by["mlx-lm ar"]["speedup"] == 1.0 and by["mlx-lm ar"]["speedup_ci95"] == [1.0, 1.0]
    assert by["ar"]["speedup"] == pytest.approx(0.8, abs=1e-3)  # best 1.0 against best 0.8
    assert by["steady"]["speedup"] == pytest.approx(1.6, abs=1e-3)
    assert by["steady"]["interval_within_10pct"] and not by["noisy"]["interval_within_10pct"]
    assert by["steady"]["mean_accepted_tokens"] == 2.0
    assert by["steady"]["identical_to_ar"] and by["broken"]["identical_prompts"] == "7/8"
    assert not by["broken"]["identical_to_ar"]
    assert by["tuned"]["identical_to_ar"] and by["tuned"]["compared_with"] == "tuned ar"
    assert "identical_to_ar" not in by["tuned ar"]
    assert "| True (to tuned ar) |" in (tmp_path / "out" / "results.md").read_text()
    assert by["noisy"]["per_prompt"][1] == {"best_s": 0.2, "times_s": [0.2, 0.2, 0.2], "tokens": 10,
                                            "calls": 10}
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    assert saved == json.loads(json.dumps(res))
    table = (tmp_path / "out" / "results.md").read_text()
    assert table == results_markdown(meta, res["results"])
    noisy_row = next(line for line in table.splitlines() if line.startswith("| noisy |"))
    steady_row = next(line for line in table.splitlines() if line.startswith("| steady |"))
    assert "⚠" in noisy_row and "⚠" not in steady_row
    assert "interval wider than ±10% of the speed-up: noisy" in table


def test_a_draft_model_mlx_lm_cannot_read_skips_that_method_by_name(tmp_path):
    """The model's own draft/ that mlx-lm cannot read skips that method, named in the table; a
    draft model asked for (--draft-model) that it cannot read is refused before the run."""
    from mlx_specstream.bench import build_methods
    from mlx_specstream.errors import CheckpointError

    model = tmp_path / "model"
    model.mkdir()
    for f in DEFAULT_MODEL.iterdir():
        if f.is_file():
            (model / f.name).symlink_to(f.resolve())
    (model / "draft").mkdir()
    methods, skipped = build_methods(model, "sql", None)
    assert "mlx-lm ar" in [m.name for m in methods] and "mlx-lm ar" not in skipped
    assert "failed to load the draft model" in skipped["mlx-lm draft"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="empty: mlx-lm cannot load this draft model"):
        build_methods(model, "sql", tmp_path / "empty")


def test_bench_command_prints_its_table(tmp_path, monkeypatch):
    """The command prints the run's results.md table (the run itself stubbed with a stored one:
    the command's own code after it, in-process)."""
    from typer.testing import CliRunner

    import mlx_specstream.bench as bench
    from mlx_specstream.cli import app

    stored = json.loads((Path(__file__).resolve().parent.parent / "results" / "bench-sql-quick"
                         / "results.json").read_text())
    asked = []

    def run_bench(model, task, n, max_tokens, *a, **k):
        asked.append((n, max_tokens))
        given.append((task, k["adapters"], k["data"], k["chat_template"], k["system_prompt"]))
        return stored

    given = []

    monkeypatch.setattr(bench, "run_bench", run_bench)
    res = CliRunner().invoke(app, ["bench", "--quick", "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, repr(res.exception)
    assert results_markdown(stored["meta"], stored["results"]) in res.output
    assert "mean_accepted_tokens: generated tokens (EOS not counted) per forward pass" in res.output
    templated = {**stored["meta"], "chat_template": True, "system_prompt": "Be brief."}  # said in its line
    assert "prompts through the chat template (system prompt \"Be brief.\")" in results_markdown(
        templated, stored["results"])
    assert "chat template" not in results_markdown(stored["meta"], stored["results"])
    CliRunner().invoke(app, ["bench", "--quick", "--n", "20", "--out", str(tmp_path / "o2")])
    CliRunner().invoke(app, ["bench", "--out", str(tmp_path / "o3")])
    assert asked == [(8, 64), (20, 64), (50, 128)]  # --quick sets defaults, not what is given
    assert given == [(None, None, None, False, None)] * 3
    res = CliRunner().invoke(app, ["bench", "--adapter", "a", "--adapter", "./b", "--data", "mine.jsonl",
                                   "--chat-template", "--system-prompt", "Be brief.",
                                   "--out", str(tmp_path / "o4")])
    assert res.exit_code == 0, repr(res.exception)
    assert given[-1] == (None, ["a", "./b"], Path("mine.jsonl"), True, "Be brief.")


def test_an_adapter_over_the_base_arrays_decodes_as_its_own_load():
    """bench times every adapter over one copy of the base (pool.with_adapter): fused as
    ``load(path, adapter)`` fuses it, with the same tokens as that load, the base left as it was,
    and only the layers a fine-tune folds into held apart."""
    from mlx.utils import tree_flatten

    from mlx_specstream.api import generate
    from mlx_specstream.pool import with_adapter

    base, tok = load(DEFAULT_MODEL)
    prompt = "CREATE TABLE ship (name TEXT, tonnage INTEGER)\n-- Names of ships over 500 tonnes?\nSELECT"
    before = generate(base, tok, prompt, max_tokens=24, mode="ar").tokens
    arrays = {id(v) for _, v in tree_flatten(base.parameters())}
    for name, mode in (("sql-lossless", "ss"), ("sql", "ss"), ("sql", "ar")):
        model = with_adapter(base, name, fuse=True)
        own, _ = load(DEFAULT_MODEL, adapter=name)
        assert (generate(model, tok, prompt, max_tokens=24, mode=mode).tokens
                == generate(own, tok, prompt, max_tokens=24, mode=mode).tokens)
        shared = sum(id(v) in arrays for _, v in tree_flatten(model.parameters()))
        fused = getattr(model, "fused_lora", 0)  # the shared sql adapter folds into every linear layer
        assert shared == len(arrays) if not fused else 0 < shared < len(arrays)
        assert model.model.embed_tokens.weight is base.model.embed_tokens.weight
    assert generate(base, tok, prompt, max_tokens=24, mode="ar").tokens == before


def test_a_tuned_adapter_is_checked_against_its_own_fine_tune():
    """ss-tuned must reproduce lora-ar only where it carries lora's fine-tune: the weights are
    compared before fusing folds them into the base (after it, every adapter's read as none)."""
    from mlx_specstream.bench import _equal, _fused

    base, _ = load(DEFAULT_MODEL)
    lora, tuned, shared = (_fused(base, name) for name in ("sql-lora", "sql-tuned", "sql"))
    assert all(m.fused_lora and weights for m, weights in (lora, tuned, shared))
    assert _equal(lora[1], tuned[1]) and not _equal(lora[1], shared[1])
