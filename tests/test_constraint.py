"""Constrained decoding: Speculative Streaming under a token constraint is constrained
autoregressive decoding, exactly (greedy here; sampling in test_sampling.py), whatever the drafts."""

import mlx.core as mx
import numpy as np
import pytest
from helpers import tiny_model

from mlx_specstream.adapter import new_adapter
from mlx_specstream.api import generate
from mlx_specstream.constraint import DONE, TokenConstraint, node_states
from mlx_specstream.engine import DecodeOptions, Decoder
from mlx_specstream.tree import build_tree


class NoSumOfThree(TokenConstraint):
    """Toy constraint: a token t may not follow s when s + t is a multiple of 3; token 0 ends
    the text and may come only after at least 3 tokens. State: (previous token, count)."""

    start = (-1, 0)

    def advance(self, state, token):
        prev, n = state
        if token == 0:
            return DONE if n >= 3 else None
        return None if prev >= 0 and (prev + token) % 3 == 0 else (token, n + 1)


def constrained_greedy(model, prompt, constraint, n):
    """The reference: the whole sequence recomputed at every token, forbidden logits at -inf."""
    seq, state, out = list(prompt), constraint.start, []
    for _ in range(n):
        logits = np.array(model(mx.array([seq]))[0, -1])
        logits[~constraint.mask(state)] = -np.inf
        t = int(np.argmax(logits))
        out.append(t)
        state = constraint.advance(state, t)
        if state == DONE:
            break
        seq.append(t)
    return out


@pytest.fixture(scope="module")
def llama():
    m = tiny_model("llama", seed=3, scale=2.0)
    new_adapter(m, gamma=3, msa_layers=2, seed=4)
    return m


@pytest.mark.parametrize("streams,branch,lookup", [("tree", 3, False), ("deferred", 2, True),
                                                   ("tree", 1, True)])
def test_constrained_ss_equals_constrained_ar(llama, streams, branch, lookup):
    c = NoSumOfThree(64)
    prompt = [5, 9, 2, 7, 5, 9]
    ref = constrained_greedy(llama, prompt, c, 60)
    free = generate(llama, None, prompt, max_tokens=60, mode="ar").tokens
    assert free[:len(ref)] != ref  # the constraint changed the output
    eos = frozenset([0])
    for mode in ("ar", "ss"):
        opts = DecodeOptions(max_tokens=60, mode=mode, streams=streams, branch=branch, tree_budget=12,
                             node_cost=0.0, lookup=lookup, constraint=c, eos_token_ids=eos)
        dec = Decoder(llama, prompt, opts)
        tokens = [t for s in dec.steps() for t in s.tokens]
        assert tokens == [t for t in ref if t != 0], mode
        if mode == "ss":
            assert dec.stats.mean_accepted_tokens > 1.0


def test_pipelined_constrained_ar_at_every_length(llama):
    """Plain greedy decoding queues each pass with the device's argmax before the host checks it:
    a forbidden one is dropped and queued again, at any token, the last one included."""
    c = NoSumOfThree(64)
    prompt = [5, 9, 2, 7, 5, 9]
    ref = [t for t in constrained_greedy(llama, prompt, c, 24) if t != 0]
    for n in range(1, len(ref) + 1):
        opts = DecodeOptions(max_tokens=n, mode="ar", constraint=c, eos_token_ids=frozenset([0]))
        assert [t for s in Decoder(llama, prompt, opts).steps() for t in s.tokens] == ref[:n], n


def test_generate_takes_a_constraint(llama):
    c = NoSumOfThree(64)
    out = generate(llama, None, [5, 9, 2], max_tokens=30, constraint=c)
    assert all((a + b) % 3 for a, b in zip(out.tokens, out.tokens[1:]))
    assert out.tokens == constrained_greedy(llama, [5, 9, 2], c, 30)[:len(out.tokens)]
    with pytest.raises(ValueError, match="not both"):
        generate(llama, None, [5, 9, 2], max_tokens=3, constraint=c, sql_names=True)


def test_a_constraint_over_fewer_tokens_than_the_model_has(llama):
    """A model's vocabulary padded past its tokenizer's (Qwen's 151,936 rows for 151,665 tokens):
    the rows past the constraint's tokens are never sampled."""
    c = NoSumOfThree(40)
    for mode, seed in [("ar", 0), ("ss", 1), ("ss", 2)]:
        opts = DecodeOptions(max_tokens=30, mode=mode, temperature=1.0, seed=seed, constraint=c,
                             eos_token_ids=frozenset([0]))
        tokens = [t for s in Decoder(llama, [5, 9, 2], opts).steps() for t in s.tokens]
        assert tokens and max(tokens) < 40 and all((a + b) % 3 for a, b in zip(tokens, tokens[1:]))


def test_node_states_follow_paths_and_stop_after_forbidden_drafts():
    c = NoSumOfThree(64)
    # root 4 (state after it: (4, 1)); level 1: 2 (4 + 2 = 6: forbidden) and 3; level 2: 1
    tree = build_tree(4, [[2, 3], [1]], [[-0.1, -0.2], [-0.3]], budget=10)
    states = node_states(c, (4, 1), tree)
    by_path = {}
    for v in range(len(tree)):
        path, u = [], v
        while u > 0:
            path.append(int(tree.tokens[u]))
            u = int(tree.parents[u])
        by_path[tuple(reversed(path))] = states[v]
    assert by_path == {(): (4, 1), (2,): None, (3,): (3, 2), (2, 1): None, (3, 1): (1, 3)}
