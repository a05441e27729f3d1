"""N-gram drafts from an adapter's data: the table (counted by hand here), its file beside the
adapter, and decoding with it: lossless output stays plain AR's, and the drafts are used."""

import json
import subprocess
import sys

import numpy as np
import pytest
from helpers import tiny_model

from mlx_specstream.adapter import load_adapter, new_adapter, save_adapter
from mlx_specstream.api import generate
from mlx_specstream.errors import AdapterError
from mlx_specstream.ngrams import NGRAMS_FILE, NgramTable

SELECT, NAME, FROM, T, U, WHERE, EOS = range(1, 8)


def test_table_keeps_the_most_frequent_next_token_and_walks_from_the_longest_context():
    # two completions after the prompt token 9: "SELECT name FROM t" and "SELECT name FROM u EOS"
    table = NgramTable.build([([9, SELECT, NAME, FROM, T], 1), ([9, SELECT, NAME, FROM, U, EOS], 1)],
                             min_count=1)
    assert table.next[(9,)] == (SELECT, 1.0)  # a prompt token is part of a context
    assert table.next[(FROM,)] == (T, 0.5)  # a tie: the first seen, at its share
    assert table.walk([9], 4) == ([SELECT, NAME, FROM, T], [1.0, 1.0, 1.0, 0.5])
    assert (U,) in table.next and (T,) not in table.next  # nothing followed "t"
    assert table.walk([T], 3) == ([], [])
    strict = NgramTable.build([([9, SELECT, NAME, FROM, T], 1), ([9, SELECT, NAME, FROM, U, EOS], 1)],
                              min_count=2, min_prob=0.6)
    assert (FROM,) not in strict.next and strict.next[(SELECT,)] == (NAME, 1.0)
    assert strict.walk([SELECT], 5) == ([NAME, FROM], [1.0, 1.0])  # stops where no context is held
    # the longest context decides: after (WHERE, NAME) comes FROM, after NAME alone T
    ctx = NgramTable.build([([0, NAME, T], 1)] * 3 + [([0, WHERE, NAME, FROM], 1)] * 2, min_count=2)
    assert ctx.walk([WHERE, NAME], 1) == ([FROM], [1.0])
    assert ctx.walk([SELECT, NAME], 1) == ([T], [0.6])


def test_save_and_load(tmp_path):
    rng = np.random.default_rng(0)
    examples = []
    for _ in range(200):  # mostly x -> x + 1, else any token: contexts of every length are kept
        seq = [int(rng.integers(6))]
        for _ in range(11):
            seq.append((seq[-1] + 1) % 6 if rng.random() < 0.7 else int(rng.integers(6)))
        examples.append((seq, 2))
    table = NgramTable.build(examples, min_count=2, min_prob=0.3)
    assert len(table.next) > 20 and {len(c) for c in table.next} == {1, 2, 3}
    table.save(tmp_path / NGRAMS_FILE)
    assert sorted(p.name for p in tmp_path.iterdir()) == [NGRAMS_FILE]  # no temporary file left
    back = NgramTable.load(tmp_path / NGRAMS_FILE)
    assert back.max_n == 3 and set(back.next) == set(table.next)
    assert all(back.next[c][0] == table.next[c][0] and abs(back.next[c][1] - table.next[c][1]) < 1e-6
               for c in table.next)


@pytest.fixture(scope="module")
def model():
    m = tiny_model("llama", seed=3, scale=2.0)
    new_adapter(m, gamma=3, msa_layers=2, seed=4)
    return m


PROMPT = [5, 9, 2, 7, 5, 9]


def test_lossless_decoding_with_ngrams_is_plain_ar_and_uses_them(model):
    """A table of the model's own continuation drafts it; output stays token for token AR's."""
    ar = generate(model, None, PROMPT, max_tokens=40, mode="ar").tokens
    model.adapter_ngrams = NgramTable.build([(PROMPT + ar, len(PROMPT))], min_count=1)
    try:
        for streams in ("deferred", "tree"):
            with_ = generate(model, None, PROMPT, max_tokens=40, streams=streams, node_cost=0.0)
            without = generate(model, None, PROMPT, max_tokens=40, streams=streams, node_cost=0.0,
                               ngrams=False)
            assert with_.tokens == ar and without.tokens == ar, streams
            assert with_.stats.mean_accepted_tokens > without.stats.mean_accepted_tokens + 0.5, streams
        sampled = [generate(model, None, PROMPT, max_tokens=20, temperature=1.0, seed=s).tokens
                   for s in range(3)]
        assert all(len(t) == 20 for t in sampled)
    finally:
        model.adapter_ngrams = None
    # asked for where there are none: said, not decoded without them
    for mode in ("ss", "lookup"):
        with pytest.raises(ValueError, match="ngrams=True: there are no n-gram drafts here"):
            generate(model, None, PROMPT, max_tokens=4, mode=mode, ngrams=True)


def test_the_adapter_carries_its_table(tmp_path):
    table = NgramTable.build([([1, 2, 3, 4], 1)], min_count=1)
    model = tiny_model("llama", seed=5)
    new_adapter(model, gamma=2, msa_layers=1, seed=0)
    model.adapter_ngrams = table
    save_adapter(model, tmp_path / "a")
    assert (tmp_path / "a" / NGRAMS_FILE).is_file()
    other = tiny_model("llama", seed=5)
    load_adapter(other, tmp_path / "a")
    assert other.adapter_ngrams.next == table.next
    (tmp_path / "a" / NGRAMS_FILE).write_bytes(b"not a zip")
    other = tiny_model("llama", seed=5)
    with pytest.raises(AdapterError, match=r"corrupt n-gram table \(not a NumPy .npz file; ") as e:
        load_adapter(other, tmp_path / "a")
    assert "allow_pickle" not in str(e.value)  # NumPy's advice to load it unsafely is not passed on
    assert getattr(other, "adapter", None) is None  # nothing half-attached
    assert getattr(other, "adapter_ngrams", None) is None
    (tmp_path / "a" / NGRAMS_FILE).unlink()
    load_adapter(other, tmp_path / "a")
    assert other.adapter_ngrams is None


def test_cli_writes_the_table_of_an_adapters_data(tmp_path):
    from test_train import make_model_dir

    from mlx_specstream.loader import load_model

    model_dir = make_model_dir(tmp_path)
    m = load_model(model_dir)
    new_adapter(m, gamma=2, msa_layers=1, seed=0)
    save_adapter(m, model_dir / "adapters" / "arith")
    cmd = [sys.executable, "-m", "mlx_specstream.cli", "ngrams", "--model", str(model_dir),
           "--adapter", "arith"]
    r = subprocess.run([*cmd, "--data", str(tmp_path / "data")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "ngrams.npz" in r.stdout
    table = NgramTable.load(model_dir / "adapters" / "arith" / NGRAMS_FILE)
    from test_train import STEP, V

    # the data are arithmetic progressions: after x comes x + STEP
    assert table.next and all(tok == (ctx[-1] + STEP) % V for ctx, (tok, _) in table.next.items())
    r = subprocess.run([*cmd, "--data", str(tmp_path / "nowhere")], capture_output=True, text=True,
                       timeout=120)  # said first, though the table exists: --overwrite would not help
    said = f"error: {tmp_path / 'nowhere'}: no such data directory"
    assert r.returncode == 1 and r.stderr.strip().splitlines()[-1] == said, r.stderr
    # an adapter's table is replaced only with --overwrite, and never by an empty one
    from mlx_specstream.trainer import write_ngrams

    before = (model_dir / "adapters" / "arith" / NGRAMS_FILE).read_bytes()
    r = subprocess.run([*cmd, "--data", str(tmp_path / "data")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "--overwrite" in r.stderr and "Traceback" not in r.stderr
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "train.jsonl").write_text('{"prompt": [1, 2], "completion": [3]}\n')
    with pytest.raises(ValueError, match="nothing written"):
        write_ngrams(model_dir, "arith", tmp_path / "tiny", overwrite=True)
    assert (model_dir / "adapters" / "arith" / NGRAMS_FILE).read_bytes() == before
    assert write_ngrams(model_dir, "arith", tmp_path / "data", overwrite=True)[1] == len(table.next)
    (tmp_path / "far").mkdir()
    (tmp_path / "far" / "train.jsonl").write_text('{"prompt": [1, 2], "completion": [3, 99999]}\n')
    with pytest.raises(ValueError, match="token id out of range"):  # as train refuses the same data
        write_ngrams(model_dir, "arith", tmp_path / "far", overwrite=True)
    # only the train split is read (a broken valid.jsonl is not its concern), and what reading it cut
    # or skipped is said, as train says it
    (tmp_path / "data" / "valid.jsonl").write_text("{not json\n")
    said = []
    write_ngrams(model_dir, "arith", tmp_path / "data", overwrite=True, max_seq_len=8, say=said.append)
    assert any("train.jsonl: truncated" in str(m) or "train.jsonl: skipped" in str(m) for m in said), said
    r = subprocess.run([*cmd, "--data", str(tmp_path / "data"), "--overwrite", "--max-seq-len", "8"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "train.jsonl: " in r.stderr, r.stderr
    # the settings left out are the adapter's training run's, where its report records them (said)
    cut = NgramTable.load(model_dir / "adapters" / "arith" / NGRAMS_FILE).next
    (model_dir / "adapters" / "arith" / "training_report.json").write_text(
        json.dumps({"config": {"max_seq_len": 8, "chat_template": False, "lr": 1e-3}}))
    said = []
    write_ngrams(model_dir, "arith", tmp_path / "data", overwrite=True, say=said.append)
    assert NgramTable.load(model_dir / "adapters" / "arith" / NGRAMS_FILE).next == cut
    assert said[0] == "as the adapter was trained: max_seq_len=8", said
    r = subprocess.run([*cmd, "--data", str(tmp_path / "data"), "--overwrite", "--chat-template"],
                       capture_output=True, text=True, timeout=120)
    assert "as the adapter was trained: --max-seq-len 8\n" in r.stderr, r.stderr
    write_ngrams(model_dir, "arith", tmp_path / "data", overwrite=True, max_seq_len=64, chat_template=False)
    assert NgramTable.load(model_dir / "adapters" / "arith" / NGRAMS_FILE).next != cut
    # a length no run could have, or a report of another shape, is not taken
    for config in ({"max_seq_len": 1}, {"max_seq_len": True}, None, {"max_seq_len": "8"}):
        (model_dir / "adapters" / "arith" / "training_report.json").write_text(json.dumps({"config": config}))
        said = []
        write_ngrams(model_dir, "arith", tmp_path / "data", overwrite=True, say=said.append)
        assert not any("as the adapter was trained" in m for m in said), said


@pytest.mark.parametrize("config,fragment", [("[]", "not a JSON object"),
                                             ('{"gamma": "four"}', "gamma is 'four', which is not int")])
def test_a_malformed_adapter_config_is_one_line(tmp_path, config, fragment):
    from mlx_specstream.adapter import read_config
    from mlx_specstream.errors import USER_ERRORS

    (tmp_path / "adapter_config.json").write_text(config)
    with pytest.raises(AdapterError, match=fragment) as e:
        read_config(tmp_path)
    assert isinstance(e.value, USER_ERRORS)


def test_prompts_given_alone_draft_nothing():
    """A prompt without completion leaves EOS as its only target: the table must not learn to
    draft EOS after what prompts end with."""
    from mlx_specstream.data import Dataset, Example
    from mlx_specstream.trainer import ngram_table

    alone = [Example([1, 5, 6, 7, 2], 4)] * 10  # BOS, the prompt, then EOS only
    assert not ngram_table(Dataset(alone), {2}).next
    full = [Example([1, 5, 6, 7, 8, 9, 2], 4)] * 10
    assert ngram_table(Dataset(alone + full), {2}).next[(7,)] == (8, 1.0)
    one = [Example([1, 5, 6, 7, 9], 4)] * 10  # token ids as given: a completion of one token
    assert ngram_table(Dataset(one), {2}).next[(7,)] == (9, 1.0)


def test_a_table_is_written_only_for_the_adapters_own_base(tmp_path):
    """Its drafts are token ids of the model given: an adapter of another base is refused (as
    decoding with it is), and nothing is written."""
    from test_train import CONFIGS, make_model_dir

    from mlx_specstream.loader import load_model, save_model
    from mlx_specstream.trainer import write_ngrams

    model_dir = make_model_dir(tmp_path)
    m = load_model(model_dir)
    new_adapter(m, gamma=2, msa_layers=1, seed=0)
    save_adapter(m, tmp_path / "ad")
    (tmp_path / "other").mkdir()
    save_model(tiny_model("llama", seed=5), CONFIGS["llama"], tmp_path / "other")
    with pytest.raises(AdapterError, match="made for another base model"):
        write_ngrams(tmp_path / "other", tmp_path / "ad", tmp_path / "data")
    assert not (tmp_path / "ad" / NGRAMS_FILE).exists()
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 64}))
    with pytest.raises(ValueError, match="max_seq_len is 65, beyond the 64 tokens"):  # as train says it
        write_ngrams(model_dir, tmp_path / "ad", tmp_path / "data", max_seq_len=65)
    (model_dir / "config.json").write_text(json.dumps(config))
    assert write_ngrams(model_dir, tmp_path / "ad", tmp_path / "data")[1] > 0


def test_ngrams_takes_only_what_the_model_can_read_from_the_training_report(tmp_path):
    """A recorded length beyond the model's context is not taken (the user gave none to blame);
    a recorded system prompt goes with the chat template only."""
    from mlx_specstream.trainer import _trained_settings

    (tmp_path / "training_report.json").write_text(json.dumps(
        {"config": {"max_seq_len": 4096, "chat_template": True, "system_prompt": "Be brief."}}))
    none = dict(max_seq_len=None, chat_template=None, system_prompt=None)
    assert _trained_settings(tmp_path, 2048, **none) == {"chat_template": True, "system_prompt": "Be brief."}
    assert _trained_settings(tmp_path, 8192, **none)["max_seq_len"] == 4096
    assert _trained_settings(tmp_path, 2048, **{**none, "chat_template": False}) == {}
