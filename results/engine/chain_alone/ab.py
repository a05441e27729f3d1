"""The interleaved A/B behind docs/engine.md's "chain alone" rule: greedy decoding of the first N
sql (or code) test prompts by plain AR, by SS with deferred streams and lookup as it was (a stream
pass every step) and by SS with the rule, prototyped here by wrapping ``Decoder._draft`` and
``Decoder.steps``. Runs at commit 3588096 (the engine before the rule), from the repository root:
``.venv/bin/python results/engine/chain_alone/ab.py ADAPTER STREAM_PASS_COST [N [FILE]]``."""

import json
import sys

import numpy as np

sys.path.insert(0, ".")
from mlx_specstream import engine as E  # noqa: E402
from mlx_specstream.api import load  # noqa: E402
from mlx_specstream.bench import Method, our_decoder, time_methods  # noqa: E402
from mlx_specstream.lookup import lookup_match  # noqa: E402

STREAM_COST = float(sys.argv[2])
draft, steps = E.Decoder._draft, E.Decoder.steps
skipped = [0, 0]


def chain_rate(scores, node_cost):
    gain = 1 + np.concatenate([[0], np.cumsum(np.exp(np.cumsum(scores)))])
    return float(np.max(gain / (1 + node_cost * np.arange(len(gain)))))


def rule_draft(self, node):
    if self.opts.mode == "ss" and self.deferred and self.lookup and getattr(self, "rule", False):
        chain, n = lookup_match(self.history, num_draft=self.budget - 1)
        skipped[1] += 1
        rate = self.__dict__.setdefault("rate", [2.0, 1 + self.node_cost * 2 + STREAM_COST])
        if chain:
            lp = self.lookup_score.logp(n)
            if chain_rate([lp] * len(chain), self.node_cost) >= rate[0] / rate[1]:
                skipped[0] += 1
                self.kind = "chain"
                d = E._Draft([], [], [], [])
                d.chain, d.chain_scores = chain, [lp] * len(chain)
                return d
        self.kind = "streams"
    return (yield from draft(self, node))


def rule_steps(self):
    for s in steps(self):
        if getattr(self, "rule", False) and getattr(self, "kind_before", None) == "streams":
            m = self.stats.tree_nodes - self.nodes_before
            self.rate[0] += 0.2 * (len(s.tokens) - self.rate[0])
            self.rate[1] += 0.2 * (1 + self.node_cost * (m - 1) + STREAM_COST - self.rate[1])
        self.nodes_before, self.kind_before = self.stats.tree_nodes, getattr(self, "kind", None)
        yield s


E.Decoder._draft, E.Decoder.steps = rule_draft, rule_steps
model, tok = load(adapter=sys.argv[1])


def method(rule):
    run = our_decoder(model, tok, mode="ss")

    def timed(ids, max_tokens):
        E.Decoder.rule = rule
        try:
            return run(ids, max_tokens)
        finally:
            E.Decoder.rule = False

    return timed


lines = open(sys.argv[4] if len(sys.argv) > 4 else "data/sql/test.jsonl").read().splitlines()
n = int(sys.argv[3]) if len(sys.argv) > 3 else 12
ids = [tok.encode(json.loads(line)["prompt"]) for line in lines[:n]]
ms = [Method("ar", our_decoder(model, tok, mode="ar")), Method("ss, a stream pass every step", method(False)),
      Method("ss, the chain alone when it pays", method(True))]
time_methods(ms, ids, 96, 3, desc="ab")
for m in ms:
    t = sum(r["time"] for r in m.records)
    toks = sum(len(r["tokens"]) for r in m.records)
    calls = sum(r["calls"] for r in m.records)
    same = all(r["tokens"] == a["tokens"] for r, a in zip(m.records, ms[0].records))
    print(f"{m.name}: {toks / t:.1f} tokens/s, {toks / calls:.2f} tokens/pass, identical to AR: {same}")
print(f"steps drafted from the chain alone: {skipped[0]} of {skipped[1]}")
