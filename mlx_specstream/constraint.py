"""Constrained decoding: a token constraint says which tokens may come next after the tokens
generated so far (docs/design.md#constrained-decoding).

The decode loop applies it to the target only, never to the drafts: at every node of a verified
tree, the main stream's logits of the tokens the constraint forbids after that node's path are
-inf before the argmax or the sampling distribution is taken. Speculative decoding then
reproduces *constrained* autoregressive decoding exactly, as it reproduces plain decoding: greedy
output equals constrained greedy AR token for token, samples follow the constrained
distribution, and a draft the constraint forbids is never accepted (its target probability is 0).

Example (greedy, tree ``7 -> [4, 9]`` after generated text in state ``s``): node 0's state is
``s``, node 1's ``advance(s, 4)``, node 2's ``advance(s, 9)``; if the argmax at node 1 is a
token whose ``advance`` is None, node 1's target becomes the best-scoring token that is allowed.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

import numpy as np

from .tree import Tree

State = Hashable
DONE: State = ("done",)  # the state after the end of the text (EOS): nothing follows
MAX_MASKS = 512  # masks kept per constraint (a constraint shared by a server's requests stays bounded)
MAX_STEPS = 1 << 20  # (state, token) answers a CharConstraint keeps


class TokenConstraint:
    """A state machine over generated tokens: ``start`` before the first one, ``advance`` per
    token (None: the token is forbidden there; :data:`DONE` after an end-of-text token). States
    are hashable, so answers are cached."""

    start: State

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size
        self._masks: dict[State, np.ndarray] = {}

    def advance(self, state: State, token: int) -> State | None:
        raise NotImplementedError

    def walk(self, state: State, tokens: list[int]) -> State | None:
        """The state after ``tokens`` (None if one of them is forbidden)."""
        for t in tokens:
            if state is None:
                return None
            state = self.advance(state, int(t))
        return state

    def mask(self, state: State) -> np.ndarray:
        """(V,) bool: the tokens allowed after ``state``."""
        m = self._masks.get(state)
        if m is None:
            m = self.allowed(state)
            if not m.any():
                raise ValueError("the constraint allows no token here")
            if len(self._masks) >= MAX_MASKS:
                self._masks.clear()
            self._masks[state] = m
        return m

    def allowed(self, state: State) -> np.ndarray:
        """(V,) bool, computed (``mask`` caches it): ``advance`` token by token; a constraint may
        compute the same faster."""
        return np.fromiter((self.advance(state, t) is not None for t in range(self.vocab_size)),
                           bool, self.vocab_size)

    def best(self, state: State, logits: np.ndarray) -> int:
        """The allowed token with the highest logit (the lowest id among equals, as argmax)."""
        for t in np.argsort(-logits, kind="stable"):
            if self.advance(state, int(t)) is not None:
                return int(t)
        raise ValueError("the constraint allows no token here")


BYTE = "\ufffd"  # a byte of a character outside ASCII, as a CharConstraint reads text


def read_text(text: str) -> str:
    """Text as a :class:`CharConstraint` reads it where it must match exactly (a name, an enum's
    value): each character outside ASCII as one :data:`BYTE` per byte of its UTF-8, so that
    ``café`` can be written whether the tokenizer has a piece for ``é`` or writes its two bytes as
    byte tokens (whose text is U+FFFD, one per byte)."""
    return "".join(ch if ord(ch) < 128 or ch.isspace() else BYTE * len(ch.encode()) for ch in text)


class CharConstraint(TokenConstraint):
    """A constraint read character by character: a subclass says what each character does
    (:meth:`_char`) and where the text may end (:meth:`may_end`); a token is its text
    (``Tokenizer.token_texts``), read one character after another, and the allowed set for
    sampling is read from ``Tokenizer.text_trie``, so a forbidden prefix is read once for every
    token that begins with it. A control token (no text) is never allowed, unless
    :meth:`read_as_text` gives it one."""

    def __init__(self, tokenizer):
        super().__init__(tokenizer.vocab_size)
        self.texts = tokenizer.token_texts
        self.trie = tokenizer.text_trie
        self.eos = frozenset(tokenizer.eos_token_ids)
        self.control: list[int] = []  # control tokens read as text (outside the trie)
        self._next: dict[tuple[State, int], State | None] = {}
        self._tokenizer = tokenizer

    def _char(self, state: State, ch: str) -> State | None:
        """The state after character ``ch`` (None: it may not come here)."""
        raise NotImplementedError

    def may_end(self, state: State) -> bool:
        """Whether the text may end (EOS) in ``state``."""
        raise NotImplementedError

    def read_as_text(self, text: str) -> None:
        """Where ``text`` is one control token (Mistral's ``[TOOL_CALLS]``), read that token as
        ``text``."""
        ids = self._tokenizer.encode(text, add_special_tokens=False)
        if len(ids) == 1 and not self.texts[ids[0]]:
            self.texts = [*self.texts[: ids[0]], text, *self.texts[ids[0] + 1:]]
            self.control.append(ids[0])

    def advance(self, state: State, token: int) -> State | None:
        key = (state, token)
        if key in self._next:
            return self._next[key]
        nxt = None
        if state != DONE:
            if token in self.eos:
                nxt = DONE if self.may_end(state) else None
            else:
                text = self.texts[token] if 0 <= token < len(self.texts) else ""
                nxt = state if text else None
                for ch in text:
                    nxt = self._char(nxt, ch)
                    if nxt is None:
                        break
        if len(self._next) >= MAX_STEPS:  # a constraint a server's requests share stays bounded
            self._next.clear()
        self._next[key] = nxt
        return nxt

    def allowed(self, state: State) -> np.ndarray:
        m = np.zeros(self.vocab_size, bool)
        for t in (*self.eos, *self.control):
            m[t] = self.advance(state, t) is not None
        if state == DONE:
            return m
        stack = [(self.trie, state)]
        while stack:
            node, st = stack.pop()
            for ch, child in node.items():
                if ch == "":
                    m[child] = True
                elif (nxt := self._char(st, ch)) is not None:
                    stack.append((child, nxt))
        return m


def node_states(constraint: TokenConstraint, root_state: State, tree: Tree | None) -> list[State | None]:
    """The state after each node's path (node 0: ``root_state``), None where the node's target is
    free: after a forbidden draft or after the end of the text, where decoding never goes on.
    ``tree`` None: one node (the prefill's last prompt token)."""
    states = [root_state]
    for v in range(1, 0 if tree is None else len(tree)):
        parent = states[int(tree.parents[v])]
        states.append(None if parent in (None, DONE) else constraint.advance(parent, int(tree.tokens[v])))
    return [None if s == DONE else s for s in states]


def constrained_argmax(constraint: TokenConstraint, states: list[State | None], top: np.ndarray,
                       logits: Callable[[], np.ndarray]) -> np.ndarray:
    """Greedy targets ``top`` (M,) corrected where the constraint forbids them; ``logits()`` gives
    the (M, V) logits, read only when a correction is needed."""
    top, rows = np.array(top), None
    for v, s in enumerate(states):
        if s is not None and constraint.advance(s, int(top[v])) is None:
            rows = logits() if rows is None else rows
            top[v] = constraint.best(s, rows[v])
    return top


def constrained_logits(constraint: TokenConstraint, states: list[State | None],
                       logits: np.ndarray) -> np.ndarray:
    """(M, V) logits with forbidden tokens at -inf (rows of forbidden drafts unchanged); a token
    past the constraint's vocabulary (a model's padded embedding rows) is forbidden."""
    out = np.array(logits, np.float32)
    for v, s in enumerate(states):
        if s is not None:
            m = constraint.mask(s)[: out.shape[1]]
            out[v, : len(m)][~m] = -np.inf
            out[v, len(m):] = -np.inf
    return out
