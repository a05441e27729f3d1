"""``logprobs``: each emitted token's log-probability and the likeliest tokens at its position,
against ``transformers`` running the shipped model's Hugging Face weights over the whole text."""

import json
from pathlib import Path

import numpy as np
import pytest

from mlx_specstream.api import DEFAULT_MODEL, generate, load, stream_generate
from mlx_specstream.errors import OptionError

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
ROOT = Path(__file__).resolve().parent.parent
HF = DEFAULT_MODEL.parent / "hf"
pytestmark = pytest.mark.skipif(not (DEFAULT_MODEL / "adapters" / "sql-lossless").is_dir() or not HF.is_dir(),
                                reason="no default model")
SQL = [json.loads(line)["prompt"] for line in (ROOT / "data" / "sql" / "test.jsonl").open()][:3]
K = 4


@pytest.fixture(scope="module")
def oracle():
    """log-softmax of transformers' logits at every position of ``ids`` (float64)."""
    hf = transformers.AutoModelForCausalLM.from_pretrained(HF, torch_dtype=torch.float32).eval()

    def log_softmax(ids: list[int]) -> np.ndarray:
        with torch.no_grad():
            logits = hf(torch.tensor([ids])).logits[0].double()
        return torch.log_softmax(logits, -1).numpy()

    return log_softmax


@pytest.fixture(scope="module")
def lossless():
    return load(adapter="sql-lossless")


def check_against(oracle, prompt_ids, out, k=K, tol=1e-4):
    """Every token's logprob and top-k equal the oracle's at the position that predicts it."""
    assert out.logprobs is not None and [lp.token for lp in out.logprobs] == out.tokens
    lp = oracle(prompt_ids + out.tokens)
    n = len(prompt_ids)
    for i, item in enumerate(out.logprobs):
        row = lp[n - 1 + i]
        assert abs(item.logprob - row[item.token]) < tol
        assert len(item.top) == k and all(a[1] >= b[1] for a, b in zip(item.top, item.top[1:]))
        for t, v in item.top:
            assert abs(v - row[t]) < tol
        # the oracle's k likeliest, where no other token comes within the tolerance of the k-th
        order = np.argsort(-row)
        if row[order[k - 1]] - row[order[k]] > 2 * tol:
            assert {t for t, _ in item.top} == set(order[:k].tolist())


@pytest.mark.parametrize("mode", ["ss", "ar"])
def test_greedy_logprobs_equal_transformers(oracle, lossless, mode):
    """Speculative Streaming reads them from the verifying pass's path; plain decoding (pipelined)
    from its one-row passes; the same numbers as the model over the whole text."""
    model, tok = lossless
    for prompt in SQL:
        out = generate(model, tok, prompt, max_tokens=40, logprobs=K, mode=mode)
        check_against(oracle, tok.encode(prompt), out)
        if mode == "ss":
            assert out.stats.mean_accepted_tokens > 1  # drafts were accepted: several tokens a pass


def test_sampled_tokens_get_the_models_own_logprobs(oracle, lossless):
    """Under temperature, top-k and min-p the log-probabilities stay the model's (before them),
    as vLLM's and mlx-lm's; stream_generate gives them pass by pass, one per token."""
    model, tok = lossless
    steps = list(stream_generate(model, tok, SQL[0], max_tokens=32, temperature=0.8, top_k=5, min_p=0.02,
                                 seed=3, logprobs=2))
    assert all(len(s.logprobs) == len(s.tokens) for s in steps)
    out = generate(model, tok, SQL[0], max_tokens=32, temperature=0.8, top_k=5, min_p=0.02, seed=3,
                   logprobs=2)
    assert out.tokens == [t for s in steps for t in s.tokens]
    check_against(oracle, tok.encode(SQL[0]), out, k=2)


def test_logprobs_follow_the_output_cut(lossless):
    """A stop string or max_tokens cuts the tokens: their log-probabilities go with them; 0 gives
    each token's alone; without the option there are none."""
    model, tok = lossless
    full = generate(model, tok, SQL[1], max_tokens=30, logprobs=0)
    for n in (1, 2, 7):  # max_tokens inside a pass's accepted drafts
        short = generate(model, tok, SQL[1], max_tokens=n, logprobs=0)
        assert short.tokens == full.tokens[:n] and short.logprobs == full.logprobs[:n]
    assert all(lp.top == () for lp in full.logprobs)
    stop = full.text.split()[3]
    cut = generate(model, tok, SQL[1], max_tokens=30, logprobs=0, stop=stop)
    assert cut.finish_reason == "stop" and len(cut.logprobs) == len(cut.tokens) < len(full.tokens)
    assert cut.logprobs == full.logprobs[:len(cut.tokens)]
    assert generate(model, tok, SQL[1], max_tokens=5).logprobs is None
    with pytest.raises(OptionError, match="logprobs"):
        generate(model, tok, SQL[1], max_tokens=5, logprobs=-1)
    with pytest.raises(OptionError, match="vocabulary"):
        generate(model, tok, SQL[1], max_tokens=5, logprobs=10**6)
