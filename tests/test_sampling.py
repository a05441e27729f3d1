"""Lossless sampling: the distribution of SS samples is exactly the base model's.

On a tiny-vocabulary model the exact probability of every 3-token continuation is computed
from the base model; thousands of SS samples (temperature 1, tree drafts from random streams)
must fit it (chi-square), while two classic wrong verifiers must not.
"""

import itertools

import mlx.core as mx
import numpy as np
import pytest
from helpers import tiny_model

import mlx_specstream.verify as verify
from mlx_specstream.adapter import new_adapter
from mlx_specstream.api import generate
from mlx_specstream.constraint import TokenConstraint
from mlx_specstream.ngrams import NgramTable

V, N_TOKENS, N_SAMPLES, PROMPT = 5, 3, 2500, [1, 3]


class NoRepeat(TokenConstraint):
    """A token may not repeat the one before it."""

    start = -1

    def advance(self, state, token):
        return None if token == state else token


def exact_distribution(model, temperature=1.0, top_p=1.0, constraint=None, cut=None):
    """The probability of every continuation; ``cut(logits, temperature)`` stands for the
    sampler's own distribution function where given."""
    probs = {}
    for seq in itertools.product(range(V), repeat=N_TOKENS):
        logits = np.array(model(mx.array([PROMPT + list(seq[:-1])]))[0, len(PROMPT) - 1:])
        if constraint is not None:  # forbidden tokens at -inf before temperature and nucleus
            for i, prev in enumerate((constraint.start, *seq[:-1])):
                logits[i, ~constraint.mask(prev)] = -np.inf
        p = verify.probabilities(logits, temperature, top_p) if cut is None else cut(logits, temperature)
        probs[seq] = float(np.prod([p[i, t] for i, t in enumerate(seq)]))
    return probs


def chi2_pvalue(counts, probs, n):
    """Chi-square goodness of fit, pooling cells with expected count < 5 into one."""
    from math import exp, lgamma, log

    obs, exp_ = [], []
    pool_o = pool_e = 0.0
    for k, p in probs.items():
        e = p * n
        if e < 5:
            pool_o += counts.get(k, 0)
            pool_e += e
        else:
            obs.append(counts.get(k, 0))
            exp_.append(e)
    if pool_e > 0:
        obs.append(pool_o)
        exp_.append(pool_e)
    stat = sum((o - e) ** 2 / e for o, e in zip(obs, exp_))
    dof = len(obs) - 1
    # regularized upper incomplete gamma Q(dof/2, stat/2) by series/continued fraction
    a, x = dof / 2, stat / 2
    if x < a + 1:
        term = total = 1.0 / a
        for i in range(1, 500):
            term *= x / (a + i)
            total += term
        return 1.0 - total * exp(-x + a * log(x) - lgamma(a))
    b, c, d = x + 1 - a, 1e300, 1.0 / (x + 1 - a)
    h = d
    for i in range(1, 500):
        an = -i * (i - a)
        b += 2
        d = 1.0 / (an * d + b)
        c = b + an / c
        h *= d * c
    return h * exp(-x + a * log(x) - lgamma(a))


@pytest.fixture(scope="module")
def model():
    m = tiny_model("llama", seed=11, vocab_size=V, scale=1.5)
    new_adapter(m, gamma=3, msa_layers=2, seed=3)
    m.adapter.stream_embed = m.adapter.stream_embed * 20  # streams far from the target p
    mx.eval(m.parameters())
    return m


def sample_counts(model, **kw):
    return sample_counts_at(model, 1.0, **kw)


def sample_counts_at(model, temperature, **kw):
    counts = {}
    for seed in range(N_SAMPLES):
        out = generate(model, None, PROMPT, max_tokens=N_TOKENS, temperature=temperature, seed=seed, **kw)
        counts[tuple(out.tokens)] = counts.get(tuple(out.tokens), 0) + 1
    return counts


@pytest.fixture(scope="module")
def exact(model):
    return exact_distribution(model)


def test_ss_sampling_matches_exact_distribution(model, exact):
    """Hybrid drafts (the default): stream draws and prompt-lookup chains (a 5-token vocabulary
    repeats, so lookup proposes nearly every pass)."""
    counts = sample_counts(model, branch=2, tree_budget=16)
    assert chi2_pvalue(counts, exact, N_SAMPLES) > 1e-3


def test_ss_sampling_with_ngram_drafts_matches_exact_distribution(model, exact):
    """The adapter's n-gram drafts lead the chain (a table of a random text, which proposes at
    every pass): deterministic drafts of another source, the same exact distribution."""
    rng = np.random.default_rng(1)
    model.adapter_ngrams = NgramTable.build([(rng.integers(0, V, 300).tolist(), 0)], min_count=1,
                                            min_prob=0.0)
    try:
        counts = sample_counts(model, branch=2, tree_budget=16)
    finally:
        model.adapter_ngrams = None
    assert chi2_pvalue(counts, exact, N_SAMPLES) > 1e-3


@pytest.mark.slow  # the SS check above covers the sampler by default; this is its AR reference
def test_ar_sampling_matches_exact_distribution(model, exact):
    counts = sample_counts(model, mode="ar")
    assert chi2_pvalue(counts, exact, N_SAMPLES) > 1e-3


@pytest.mark.slow  # test_constrained_sampling_matches samples with a nucleus (top_p 0.9) by default
def test_top_p_sampling_matches(model):
    exact = exact_distribution(model, top_p=0.8)
    counts = {}
    for seed in range(N_SAMPLES):
        out = generate(model, None, PROMPT, max_tokens=N_TOKENS, temperature=1.0, top_p=0.8,
                       seed=seed, branch=2, streams="tree")
        counts[tuple(out.tokens)] = counts.get(tuple(out.tokens), 0) + 1
    assert all(exact[k] > 0 for k in counts), "a token outside the nucleus was emitted"
    assert chi2_pvalue(counts, exact, N_SAMPLES) > 1e-3


def cut_by_hand(logits, temperature, top_k, min_p):
    """The oracle of top-k then min-p, row by row in plain Python: softmax at the temperature,
    the k likeliest kept (ties: lower id), renormalised, those below min_p x the top one dropped."""
    out = []
    for row in np.asarray(logits, np.float64):
        p = np.exp((row - row.max()) / temperature)
        p /= p.sum()
        kept = sorted(range(len(p)), key=lambda t: (-p[t], t))[:top_k]
        kept = [t for t in kept if p[t] >= min_p * p[kept[0]]]
        q = np.zeros_like(p)
        q[kept] = p[kept] / p[kept].sum()
        out.append(q)
    return np.array(out)


def test_top_k_and_min_p_sampling_match(model):
    """SS samples under top_k and min_p follow the truncated distribution exactly (the oracle
    computes the cut itself; the sampler's own function is not used for it)."""
    exact = exact_distribution(model, temperature=0.9, cut=lambda lg, t: cut_by_hand(lg, t, 3, 0.3))
    counts = sample_counts_at(model, 0.9, branch=2, tree_budget=16, top_k=3, min_p=0.3)
    assert all(exact[k] > 0 for k in counts), "a token outside the cut was emitted"
    assert sum(p == 0 for p in exact.values()) > len(exact) / 2  # the cut removes most sequences
    assert chi2_pvalue(counts, exact, N_SAMPLES) > 1e-3


def test_constrained_sampling_matches(model):
    """Under a constraint, SS samples follow the constrained model's distribution exactly."""
    constraint = NoRepeat(V)
    exact = exact_distribution(model, top_p=0.9, constraint=constraint)
    counts = sample_counts(model, branch=2, tree_budget=16, top_p=0.9, constraint=constraint)
    assert all(exact[k] > 0 for k in counts), "a forbidden token was emitted"
    assert chi2_pvalue(counts, exact, N_SAMPLES) > 1e-3


def wrong_no_residual(p, draws, q, rng):
    """Bug: after a rejection, resample from p instead of the residual max(p - q, 0)."""
    for x in draws:
        if rng.random() * (1.0 if q is None else q[x]) < p[x]:
            return int(x), p
    return None, p


def wrong_accept_if_likely(p, draws, q, rng):
    """Bug: accept a draft whenever it is at least as likely under p as under q."""
    for x in draws:
        if p[x] >= (1.0 if q is None else q[x]):
            return int(x), p
    return None, p


# the test's power, shown by wrong verifiers it must reject: with -m slow (34 s each; the default
# run stays under 20 minutes on 2 cores)
@pytest.mark.slow
@pytest.mark.parametrize("bug", [wrong_no_residual, wrong_accept_if_likely])
def test_wrong_verifiers_are_detected(model, exact, monkeypatch, bug):
    monkeypatch.setattr(verify, "residual_accept", bug)
    counts = sample_counts(model, branch=2, tree_budget=16)
    assert chi2_pvalue(counts, exact, N_SAMPLES) < 1e-3


def two_random_drafts(p, q, rng):
    """Two i.i.d. stream draws."""
    return verify.residual_accept(p, [verify.sample(q, rng) for _ in range(2)], q, rng)


def lookup_then_random_draft(p, q, rng):
    """A prompt-lookup token (q one-hot) tried first, then a stream draw on the residual."""
    tok, resid = verify.residual_accept(p, [3], None, rng)
    return (tok, resid) if tok is not None else verify.residual_accept(resid, [verify.sample(q, rng)], q, rng)


@pytest.mark.parametrize("drafts,p,q", [
    (two_random_drafts, [0.5, 0.3, 0.15, 0.05], [0.05, 0.15, 0.3, 0.5]),
    (lookup_then_random_draft, [0.1, 0.6, 0.2, 0.1], [0.4, 0.1, 0.1, 0.4]),  # lookup: unlikely token
])
def test_residual_accept_is_exact_in_distribution(drafts, p, q):
    """Single-node check: the emitted token (accepted draft, else a residual sample) ~ p exactly."""
    rng = np.random.default_rng(0)
    p, q = np.array(p), np.array(q)
    counts = np.zeros(4)
    n = 40000
    for _ in range(n):
        tok, resid = drafts(p, q, rng)
        counts[tok if tok is not None else verify.sample(resid, rng)] += 1
    assert np.abs(counts / n - p).max() < 0.01
