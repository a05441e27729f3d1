"""Forced tool calls: the token constraint under which a reply is tool calls and nothing else,
for OpenAI's ``tool_choice: "required"`` (calls to any of the tools) or a named function (calls to
that one), Anthropic's ``any`` and ``tool`` (docs/design.md#constrained-decoding).

The reply is read as characters (the tokens' texts; a marker that is one control token, such as
Mistral's ``[TOOL_CALLS]``, reads as the marker) by a pushdown machine over the format the chat
template writes (:mod:`.tool_calls`)::

    hermes        <tool_call> CALL </tool_call>  ... (up to max_calls blocks)
    mistral       [TOOL_CALLS] [CALL, CALL, ...]
    mistral-args  [TOOL_CALLS]NAME[ARGS]OBJECT  ... (up to max_calls)
    llama3        CALL; CALL ...

    CALL = {"name": "NAME", "arguments": OBJECT}   ("parameters" in Llama 3's format)

NAME is one of the allowed tools' names; OBJECT is any JSON object (the tool's ``parameters``
schema is not enforced). Wherever JSON allows whitespace there may be a space, or a line break and
up to 20 spaces or tabs (llama.cpp's bound: a model cannot fill its reply with blank lines), and up
to two whitespace characters before the reply's first call and after its last. The end of the text (EOS)
may come only after a whole call. The decode loop applies the constraint to the target only
(:mod:`.constraint`), so speculative decoding stays exact for the constrained model.

Example (hermes, tools ``weather`` and ``time``): after ``<tool_call>{"name": "`` the pieces
``w`` or ``time`` may follow, ``x`` may not; after ``{"name": "weather", "arguments": {"city":
"Pa`` anything but a control character or a bare line break; EOS only after ``</tool_call>``.
"""

from __future__ import annotations

import bisect
import functools
import re

import numpy as np

from .constraint import DONE, State, TokenConstraint
from .tool_calls import ToolFormat, tool_format

WS = frozenset(" \t\n\r")  # JSON's whitespace
INDENT = 20  # between two parts of a call: nothing, a space, or a line break and up to 20 spaces or tabs
SPACE_AROUND = 2  # whitespace characters allowed before the first call and after the last
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_LITERALS = {"t": "rue", "f": "alse", "n": "ull"}
_NAME = re.compile(r"[A-Za-z0-9_.:-]+")  # a name JSON writes as it is (OpenAI's: [A-Za-z0-9_-])


class ForcedCalls(TokenConstraint):
    """Replies that are calls in ``fmt`` to the tools ``names``, at most ``max_calls`` (None: any
    number, in the formats that write several). States are nested tuples ``(kind, ..., then)``:
    what the next character may be, and the state to go on in once that part is written."""

    def __init__(self, fmt: ToolFormat, tokenizer, names, max_calls: int | None = None):
        super().__init__(tokenizer.vocab_size)
        self.names = sorted(set(names))
        if not self.names or not all(_NAME.fullmatch(n) for n in self.names):
            raise ValueError("a forced call needs tool names of letters, digits, '_', '-', '.' or ':'")
        self.fmt, self.max_calls = fmt, max_calls or 1 << 30
        self.key = '"parameters"' if fmt.bare else '"arguments"'
        self.texts = list(tokenizer.token_texts)
        self.markers = []  # markers that are one control token: read as their text
        for marker in filter(None, (fmt.start, fmt.end, fmt.args)):
            ids = tokenizer.encode(marker, add_special_tokens=False)
            if len(ids) == 1 and not self.texts[ids[0]]:
                self.texts[ids[0]] = marker
                self.markers.append(ids[0])
        self.trie = tokenizer.text_trie
        self.eos = frozenset(tokenizer.eos_token_ids)
        self.start = ("space", SPACE_AROUND, self._call(1))
        self._next: dict[tuple[State, int], State | None] = {}

    # -- the reply: calls in the format ------------------------------------------------------
    def _call(self, k: int) -> State:
        """The state before call ``k`` (1-based) is begun."""
        fmt, after = self.fmt, ("after", k, SPACE_AROUND)
        if fmt.end is not None:
            return _lit(fmt.start, ("ws", self._object(("ws", _lit(fmt.end, after)))))
        if fmt.args is not None:
            return _lit(fmt.start, ("name", "", fmt.args[0], _lit(fmt.args[1:], ("object", after))))
        if fmt.bare:
            return self._object(after)
        return _lit(fmt.start, ("ws", _lit("[", ("ws", self._object(("list", 1))))))

    def _after(self, k: int) -> State | None:
        """The state that call ``k + 1`` begins in, None where no call may follow call ``k``."""
        if k >= self.max_calls or not (self.fmt.end or self.fmt.args or self.fmt.bare):
            return None
        if self.fmt.bare:
            return _lit(";", ("ws", self._object(("after", k + 1, SPACE_AROUND))))
        return self._call(k + 1)

    def _object(self, then: State) -> State:
        """``{"name": "NAME", "arguments": OBJECT}``, then ``then``."""
        args = ("ws", _lit(self.key, ("ws", _lit(":", ("object", ("ws", _lit("}", then)))))))
        name = ("ws", _lit('"', ("name", "", '"', ("ws", _lit(",", args)))))
        return _lit("{", ("ws", _lit('"name"', ("ws", _lit(":", name)))))

    # -- characters --------------------------------------------------------------------------
    def _char(self, state: State, ch: str) -> State | None:
        """The state after character ``ch`` (None: it may not come here)."""
        kind = state[0]
        if kind == "lit":
            text, then = state[1], state[2]
            return None if ch != text[0] else (then if len(text) == 1 else ("lit", text[1:], then))
        if kind == "str":
            if ch == '"':
                return state[1]
            return ("esc", state[1]) if ch == "\\" else (None if ord(ch) < 0x20 else state)
        if kind == "wsrun":  # ("wsrun", indent left, the state the whitespace is in)
            if ch in " \t" and state[1] > 0:
                return ("wsrun", state[1] - 1, state[2])
            return None if ch in WS else self._char(state[2], ch)
        if ch in WS and kind in _SKIPS_WS:  # JSON's whitespace, as llama.cpp's JSON grammar bounds it
            return ("wsrun", INDENT, state) if ch == "\n" else ("wsrun", 0, state) if ch == " " else None
        if kind == "ws":
            return self._char(state[1], ch)
        if kind == "space":  # ("space", whitespace left, then)
            if ch in WS:
                return ("space", state[1] - 1, state[2]) if state[1] > 0 else None
            return self._char(state[2], ch)
        if kind == "after":  # ("after", calls written, whitespace left): EOS may come
            if ch in WS:
                return ("after", state[1], state[2] - 1) if state[2] > 0 else None
            nxt = self._after(state[1])
            return None if nxt is None else self._char(nxt, ch)
        if kind == "name":
            typed, close, then = state[1], state[2], state[3]
            if ch == close and typed in self.names:
                return then
            typed += ch
            i = bisect.bisect_left(self.names, typed)
            begun = i < len(self.names) and self.names[i].startswith(typed)
            return ("name", typed, close, then) if begun else None
        if kind == "list":  # after a call of Mistral's list
            k = state[1]
            if ch == ",":
                return ("ws", self._object(("list", k + 1))) if k < self.max_calls else None
            return ("after", self.max_calls, SPACE_AROUND) if ch == "]" else None
        return _json(state, ch, self._char)

    # -- tokens ------------------------------------------------------------------------------
    def advance(self, state: State, token: int) -> State | None:
        key = (state, token)
        if key in self._next:
            return self._next[key]
        nxt = None
        if state != DONE:
            if token in self.eos:
                nxt = DONE if state[0] == "after" else None
            else:
                text = self.texts[token] if 0 <= token < len(self.texts) else ""
                nxt = state if text else None  # a control token that is no marker: never
                for ch in text:
                    nxt = self._char(nxt, ch)
                    if nxt is None:
                        break
        self._next[key] = nxt
        return nxt

    def allowed(self, state: State) -> np.ndarray:
        """The tokens allowed after ``state``, read from the tokenizer's text trie (a forbidden
        prefix is read once for every token that begins with it)."""
        m = np.zeros(self.vocab_size, bool)
        for t in (*self.eos, *self.markers):
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


# the states whose JSON part may begin with whitespace (it does not change them)
_SKIPS_WS = frozenset({"ws", "object", "keys", "members", "value", "items", "elements", "list"})


def _lit(text: str, then: State) -> State:
    """``text`` exactly, then ``then``."""
    return ("lit", text, then) if text else then


def _json(state: State, ch: str, char) -> State | None:
    """JSON values: ``object`` (the arguments: an object), ``value``, an object's ``keys`` (after
    ``{``) and ``members`` (after a member), an array's ``items`` (after ``[``) and ``elements``,
    a string's escapes ``esc`` and ``hex``, a number ``num``. ``char`` reads a character in the
    state a finished number hands on to."""
    kind, then = state[0], state[-1]
    if kind == "object":
        return ("keys", then) if ch == "{" else None
    if kind == "keys" and ch == "}":
        return then
    if kind in ("keys", "members"):
        member = ("str", ("ws", _lit(":", ("value", ("members", then)))))
        if kind == "keys":
            return member if ch == '"' else None
        return ("ws", _lit('"', member)) if ch == "," else (then if ch == "}" else None)
    if kind == "value":
        if ch == "{":
            return ("keys", then)
        if ch == "[":
            return ("items", then)
        if ch == '"':
            return ("str", then)
        if ch == "-" or ch.isdigit():
            return ("num", ch, then) if ch.isascii() else None
        return ("lit", _LITERALS[ch], then) if ch in _LITERALS else None
    if kind == "items":
        return then if ch == "]" else char(("value", ("elements", then)), ch)
    if kind == "elements":
        return ("value", ("elements", then)) if ch == "," else (then if ch == "]" else None)
    if kind == "esc":
        if ch in '"\\/bfnrt':
            return ("str", then)
        return ("hex", 4, then) if ch == "u" else None
    if kind == "hex":
        if ch not in "0123456789abcdefABCDEF":
            return None
        return ("str", then) if state[1] == 1 else ("hex", state[1] - 1, then)
    if kind == "num":
        text = state[1] + ch
        if ch in "0123456789+-.eE" and (_NUMBER.fullmatch(text) or _NUMBER.fullmatch(text + "0")):
            return ("num", text, then)
        return char(then, ch) if _NUMBER.fullmatch(state[1]) else None
    raise AssertionError(f"unknown state {kind}")


def forced_names(tools: list[dict] | None, choice) -> tuple[str, ...] | None:
    """The names of the tools a reply must call for OpenAI's ``tool_choice``: all of ``tools``
    for ``"required"``, one for ``{"type": "function", "function": {"name": ...}}``, None (the model
    chooses) for ``"auto"``, ``"none"`` or None. ValueError for anything else, or a name not in
    ``tools``."""
    if choice in (None, "auto", "none"):
        return None
    names = tuple(t["function"]["name"] for t in tools or [])
    named = isinstance(choice, dict) and choice.get("type") == "function" and isinstance(
        choice.get("function"), dict) and isinstance(choice["function"].get("name"), str)
    if choice != "required" and not named:
        raise ValueError("tool_choice must be 'auto', 'none', 'required' or "
                         '{"type": "function", "function": {"name": ...}}')
    if not names:
        raise ValueError("tool_choice asks for a tool call, but no tools are given")
    if not named:
        return names
    name = choice["function"]["name"]
    if name not in names:
        raise ValueError(f"tool_choice names the function '{name}', which is not one of the tools "
                         f"({', '.join(names)})")
    return (name,)


def forced_calls(tokenizer, names: tuple[str, ...], max_calls: int | None = None,
                 fmt: ToolFormat | None = None) -> ForcedCalls:
    """The constraint under which a reply is calls to the tools ``names`` (:func:`forced_names`),
    at most ``max_calls``, in ``fmt`` (default: the format the tokenizer's chat template writes);
    for ``generate(..., constraint=...)``. Requests for the same tools share one, and its cached
    masks."""
    fmt = fmt or tool_format(getattr(tokenizer, "chat_template", None))
    if fmt is None:
        raise ValueError("the chat template writes no tool calls in a format this package reads "
                         "(<tool_call> blocks, Mistral's [TOOL_CALLS], Llama 3's JSON)")
    return _shared(fmt, tokenizer, tuple(names), max_calls)


@functools.lru_cache(maxsize=16)
def _shared(fmt: ToolFormat, tokenizer, names: tuple[str, ...], max_calls: int | None) -> ForcedCalls:
    return ForcedCalls(fmt, tokenizer, names, max_calls)
