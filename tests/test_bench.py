"""The benchmark: every method runs on the same prompts; lossless methods (ours and mlx-lm's, an
independent implementation) reproduce our AR output; results.json / .md / .png are written."""

import json

import pytest

from mlx_specstream.adapter import new_adapter, save_adapter
from mlx_specstream.api import DEFAULT_MODEL, load
from mlx_specstream.bench import markdown_table, run_bench, task_metrics

pytestmark = pytest.mark.skipif(not (DEFAULT_MODEL / "config.json").exists(), reason="no default model")
FIELDS = {"method", "mean_accepted_tokens", "tokens_per_s", "speedup_vs_ar", "exact_match",
          "extra_params", "peak_memory_mb"}


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
    return d


def test_run_bench_all_methods(model_dir, tmp_path):
    res = run_bench(model_dir, "sql", n=2, max_tokens=12, out_dir=tmp_path, draft_path=model_dir / "draft",
                    command="test")
    names = [r["method"] for r in res["results"]]
    assert names == ["ar", "mlx-lm ar", "mlx-lm draft", "lookup", "ss-lossless chain", "ss-lossless tree",
                     "ss-lossless tree+prune", "ss-shared", "ss-shared ar", "lora-ar"]
    assert res["meta"]["skipped"] == {}
    by = {r["method"]: r for r in res["results"]}
    for r in res["results"]:
        assert FIELDS <= set(r)
        if "identical_to_ar" in r:  # the lossless claim, checked inside the benchmark
            assert r["identical_to_ar"], r
    assert by["ar"]["speedup_vs_ar"] == 1.0
    assert by["ar"]["mean_accepted_tokens"] == pytest.approx(1.0, abs=0.1)
    assert by["ar"]["extra_params"] == 0 and by["ss-shared"]["extra_params"] > 0
    assert by["mlx-lm draft"]["extra_params"] > 100_000  # the draft model's parameters
    assert by["ss-lossless tree"]["mean_accepted_tokens"] >= 1.0
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["results"] == res["results"] and saved["meta"]["command"] == "test"
    assert (tmp_path / "results.md").read_text() == markdown_table(res["meta"], res["results"])
    assert (tmp_path / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_task_metrics():
    assert task_metrics("sql", ["SELECT a FROM t;", "select b"], ["select  a from T", "SELECT c"]) == {
        "exact_match": 0.5}
    m = task_metrics("code", ["return x\n", "retrun"], ["return x", "return"])
    # "retrun" -> "return": 5 of 6 characters in the longest matching blocks: ratio 2 * 5 / 12
    assert m == {"exact_match": 0.5, "edit_similarity": round((1.0 + 10 / 12) / 2, 4)}


def test_bench_cli_errors(tmp_path):
    from test_cli import assert_one_line_error, cli

    assert_one_line_error(cli("bench", "--task", "poetry", "--out", str(tmp_path)), "sql or code")
    assert_one_line_error(cli("bench", "--model", str(tmp_path / "nope"), "--out", str(tmp_path)),
                          "no such model directory")
