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

import functools
from collections.abc import Callable, Hashable
from typing import NamedTuple

import numpy as np

from .tokenizer import utf8_text
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
        """(V,) bool: the tokens allowed after ``state`` (the last :data:`MAX_MASKS` used are kept)."""
        m = self._masks.pop(state, None)
        if m is None:
            m = self.allowed(state)
            if not m.any():
                raise ValueError("the constraint allows no token here")
            if len(self._masks) >= MAX_MASKS:
                del self._masks[next(iter(self._masks))]
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


def check_reads_tokens(tokenizer, who: str) -> None:
    """A TypeError unless ``tokenizer`` is one from ``load()``: a constraint on characters reads
    its tokens' text."""
    if not hasattr(tokenizer, "token_units"):
        raise TypeError(f"{who} needs the tokenizer from load() (it reads the tokens' text), "
                        f"not {type(tokenizer).__name__}")


class Partial(NamedTuple):
    """Inside a character written byte by byte (byte tokens): its UTF-8 bytes so far (1-3, the
    start of a valid sequence), and the state before the character."""

    head: bytes
    state: State


class CharConstraint(TokenConstraint):
    """A constraint read character by character: a subclass says what each character does
    (:meth:`_char`) and where the text may end (:meth:`may_end`). A token is what it adds to the
    output (``Tokenizer.token_units``): its characters, or where it is not whole characters by
    itself (a byte token, a byte-level piece that cuts a character) its bytes, which are put
    together into characters, so every text allowed is valid UTF-8 and a character is allowed
    however the tokenizer writes it (``é`` as one piece or as two byte tokens). The allowed set for
    sampling is read from ``Tokenizer.unit_trie``, so a forbidden prefix is read once for every
    token that begins with it. A control token (no text) is never allowed, unless
    :meth:`read_as_text` gives it one.

    A character's first bytes are allowed only where some character that begins with them may
    come: one the subclass names (:meth:`literal`: an enum's value, a table's name, a pattern) or,
    for text that allows any character there, the first character and the first letter or digit
    that begin so (:func:`_probes`)."""

    def __init__(self, tokenizer):
        super().__init__(tokenizer.vocab_size)
        self.texts = tokenizer.token_units
        self.trie = tokenizer.unit_trie
        self.eos = frozenset(tokenizer.eos_token_ids)
        self.control: list[int] = []  # control tokens read as text (outside the trie)
        self.literal_chars: set[str] = set()  # the characters outside ASCII that literal() was given
        self._next: dict[tuple[State, int], State | None] = {}
        self._heads: dict[bytes, tuple[str, ...]] = {}
        self._tokenizer = tokenizer

    def _char(self, state: State, ch: str) -> State | None:
        """The state after character ``ch`` (None: it may not come here)."""
        raise NotImplementedError

    def may_end(self, state: State) -> bool:
        """Whether the text may end (EOS) in ``state``."""
        raise NotImplementedError

    def literal(self, text: str) -> str:
        """``text``, which the constraint matches exactly (a name, an enum's value): its characters
        outside ASCII are noted, so that their first bytes may be written as byte tokens."""
        self.literal_chars.update(ch for ch in text if ord(ch) > 127)
        self._heads.clear()
        return text

    def read_as_text(self, text: str) -> None:
        """Where ``text`` is one control token (Mistral's ``[TOOL_CALLS]``), read that token as
        ``text``."""
        ids = self._tokenizer.encode(text, add_special_tokens=False)
        if len(ids) == 1 and not self.texts[ids[0]]:
            self.texts = [*self.texts[: ids[0]], self.literal(text), *self.texts[ids[0] + 1:]]
            self.control.append(ids[0])

    def _unit(self, state: State, unit: str | int) -> State | None:
        """The state after one unit of a token: a character, or a byte (int) of a character
        written as bytes."""
        if isinstance(unit, str):
            return None if isinstance(state, Partial) else self._char(state, unit)
        head, before = (state.head, state.state) if isinstance(state, Partial) else (b"", state)
        head += bytes((unit,))
        ch = utf8_text(head)
        if ch is None:  # not UTF-8: a text that decodes to U+FFFD
            return None
        if ch:
            return self._char(before, ch)
        begun = any(self._char(before, c) is not None for c in self._begun(head))
        return Partial(head, before) if begun else None

    def _begun(self, head: bytes) -> tuple[str, ...]:
        """The characters tried after the first bytes ``head`` of one: the literals' that begin so,
        and :func:`_probes`."""
        if head not in self._heads:
            self._heads[head] = (*sorted(c for c in self.literal_chars if c.encode().startswith(head)),
                                 *_probes(head))
        return self._heads[head]

    def advance(self, state: State, token: int) -> State | None:
        key = (state, token)
        if key in self._next:
            return self._next[key]
        nxt = None
        if state != DONE:
            if token in self.eos:
                nxt = DONE if not isinstance(state, Partial) and self.may_end(state) else None
            else:
                units = self.texts[token] if 0 <= token < len(self.texts) else ""
                nxt = state if units else None
                for unit in units:
                    nxt = self._unit(nxt, unit)
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
            whole = type(st) is not Partial
            for unit, child in node.items():
                if unit == "":
                    m[child] = True
                elif (nxt := self._char(st, unit) if whole and type(unit) is str else self._unit(st, unit)) \
                        is not None:
                    stack.append((child, nxt))
        return m


@functools.cache
def _probes(head: bytes) -> tuple[str, ...]:
    """Characters whose UTF-8 begins with ``head`` (the start of a valid sequence): the first one,
    and the first letter or digit among the next 4,096 (the code points that begin so are a run)."""
    seq = head
    while not (ch := utf8_text(seq)):  # "" (not None): some byte goes on
        seq += bytes((next(b for b in range(0x80, 0xC0) if utf8_text(seq + bytes((b,))) is not None),))
    chars = [ch]
    for cp in range(ord(ch), min(ord(ch) + 4096, 0xD800 if ord(ch) < 0xD800 else 0x110000)):
        if not chr(cp).encode().startswith(head):
            break
        if chr(cp).isalnum():
            chars.append(chr(cp))
            break
    return tuple(dict.fromkeys(chars))


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
