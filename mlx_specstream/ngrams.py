"""N-gram drafts from an application's own data: the next token that most often followed the
last 1-3 tokens in an adapter's training completions (a small datastore, as in REST, He et al.
2023). Beside the streams and prompt lookup it drafts what an application's outputs share with
one another, which the prompt does not hold: the SQL words and punctuation around the names
that prompt lookup copies (docs/engine.md, "Hybrid drafts").

A table keeps, for every context of 1..``max_n`` tokens before a completion token, the token
that followed it most often, if it did so at least ``min_count`` times and at least ``min_prob``
of the time, and that share. :meth:`NgramTable.walk` drafts greedily from the longest context
present. Example, with ``min_count=1`` and word-level tokens: trained on the completions
``SELECT name FROM t`` and ``SELECT name FROM u``, ``walk(["SELECT"], 3)`` gives ``["name",
"FROM", "t"]`` with shares 1.0, 1.0, 0.5 (``FROM`` was followed by ``t`` and ``u`` alike: a tie
keeps the first seen at its share); with ``min_prob=0.6`` it stops at the table name, which prompt
lookup may then copy from the prompt.

Written beside the adapter as ``ngrams.npz`` by ``train`` (or ``specstream-mlx ngrams`` for an
adapter trained before), loaded with it.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .outputs import write_atomic

NGRAMS_FILE = "ngrams.npz"


@dataclass
class NgramTable:
    next: dict[tuple[int, ...], tuple[int, float]]  # context -> (most frequent next token, its share)
    max_n: int = 3

    @classmethod
    def build(cls, examples: Iterable[tuple[list[int], int]], max_n: int = 3, min_count: int = 3,
              min_prob: float = 0.5) -> NgramTable:
        """From ``(tokens, n_prompt)`` examples: every target token (``tokens[n_prompt:]``, EOS
        included where the tokens end with it) counted after each of its 1..max_n preceding
        tokens (prompt tokens may be part of a context)."""
        counts: dict[tuple[int, ...], Counter] = defaultdict(Counter)
        for tokens, n_prompt in examples:
            for i in range(max(n_prompt, 1), len(tokens)):
                for n in range(1, min(max_n, i) + 1):
                    counts[tuple(tokens[i - n:i])][tokens[i]] += 1
        table = {}
        for ctx, c in counts.items():
            token, k = c.most_common(1)[0]
            share = k / sum(c.values())
            if k >= min_count and share >= min_prob:
                table[ctx] = (int(token), round(share, 4))
        return cls(table, max_n)

    def walk(self, history: list[int], num_draft: int) -> tuple[list[int], list[float]]:
        """Up to ``num_draft`` tokens after ``history``, each the table's next token after the
        longest context it holds; with their shares. Stops where no context of any length is held."""
        seq, tokens, shares = list(history), [], []
        for _ in range(num_draft):
            for n in range(min(self.max_n, len(seq)), 0, -1):
                hit = self.next.get(tuple(seq[-n:]))
                if hit is not None:
                    break
            else:
                break
            tokens.append(hit[0])
            shares.append(hit[1])
            seq.append(hit[0])
        return tokens, shares

    def save(self, path: str | Path) -> None:
        """Write ``path`` (npz) atomically: contexts right-aligned in rows of ``max_n`` (-1 pads)."""
        path = Path(path)
        ctx = np.full((len(self.next), self.max_n), -1, np.int32)
        for i, c in enumerate(self.next):
            ctx[i, self.max_n - len(c):] = c
        values = list(self.next.values())
        write_atomic(path, lambda f: np.savez_compressed(
            f, contexts=ctx, tokens=np.array([v[0] for v in values], np.int32),
            shares=np.array([v[1] for v in values], np.float32)))

    @classmethod
    def load(cls, path: str | Path) -> NgramTable:
        """The table saved in ``path``; a file that is not one is a ValueError naming it."""
        try:
            with np.load(path) as f:
                ctx, tokens, shares = f["contexts"], f["tokens"], f["shares"]
            table = {tuple(int(t) for t in row if t >= 0): (int(tok), float(s))
                     for row, tok, s in zip(ctx.tolist(), tokens.tolist(), shares.tolist())}
            return cls(table, ctx.shape[1])
        except Exception as e:  # not a zip, missing arrays, wrong shapes: NumPy says which
            # (a file that is not .npz nor .npy NumPy reads as a pickle, refused as such: not advice to give)
            why = "not a NumPy .npz file" if "pickled" in str(e) else str(e)
            raise ValueError(f"{path}: corrupt n-gram table ({why}; `specstream-mlx ngrams --overwrite` "
                             "writes it again)") from None
