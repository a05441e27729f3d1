"""Forced tool calls: the token constraint under which a reply is tool calls and nothing else,
for OpenAI's ``tool_choice: "required"`` (calls to any of the tools) or a named function (calls to
that one), Anthropic's ``any`` and ``tool`` (docs/design.md#constrained-decoding).

The reply is read as characters (the tokens' texts; a marker that is one control token, such as
Mistral's ``[TOOL_CALLS]``, reads as the marker) by a pushdown machine over the format the chat
template writes (:mod:`.tool_calls`)::

    hermes        <tool_call> CALL </tool_call>  ... (up to max_calls blocks)
    mistral       [TOOL_CALLS] [CALL, CALL, ...]
    mistral-args  [TOOL_CALLS]NAME[ARGS]ARGUMENTS  ... (up to max_calls)
    llama3        CALL; CALL ...

    CALL = {"name": "NAME", "arguments": ARGUMENTS}   ("parameters" in Llama 3's format)

NAME is one of the allowed tools' names; ARGUMENTS is a JSON object that follows the tool's
``parameters`` schema as far as a schema can be read as a grammar (:meth:`ForcedCalls._node`):
``type`` (string, number, integer, boolean, null, array with ``items``, object), ``properties``
(each key once, in any order, only those named: ``additionalProperties`` is read as false, as
llama.cpp's schema grammars read it) with ``required``, ``enum`` and ``const`` of scalars. Other
keywords (``anyOf``, ``$ref``, ``pattern``, bounds, lists of types) leave that value any JSON
value. Wherever JSON allows whitespace there may be a space, or a line break and up to 20
spaces or tabs (llama.cpp's bound: a model cannot fill its reply with blank lines), and up to two
whitespace characters before the reply's first call and after its last. The end of the text (EOS)
may come only after a whole call. The decode loop applies the constraint to the target only
(:mod:`.constraint`), so speculative decoding stays exact for the constrained model.

Example (hermes; tools ``weather(city: string, required)`` and ``time``): after
``<tool_call>{"name": "`` the pieces ``w`` or ``time`` may follow, ``x`` may not; after
``{"name": "weather", "arguments": {`` only ``"city"`` may begin, and ``}`` only after it; after
``"city": "Pa`` anything but a control character or a marker (``</tool_call>`` inside a string
would end the call for the reader); EOS only after ``</tool_call>``.
"""

from __future__ import annotations

import bisect
import functools
import json
import re

import numpy as np

from .constraint import DONE, State, TokenConstraint
from .tool_calls import ToolFormat, tool_format, tools_problem

WS = frozenset(" \t\n\r")  # JSON's whitespace
INDENT = 20  # between two parts of a call: nothing, a space, or a line break and up to 20 spaces or tabs
SPACE_AROUND = 2  # whitespace characters allowed before the first call and after the last
MAX_STEPS = 1 << 20  # (state, token) answers kept
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_INTEGER = re.compile(r"-?(?:0|[1-9]\d*)")
_LITERALS = {"t": "rue", "f": "alse", "n": "ull"}
_NAME = re.compile(r"[A-Za-z0-9_.:-]+")  # a name JSON writes as it is (OpenAI's: [A-Za-z0-9_-])
_PLAIN = re.compile(r'[^"\\\x00-\x1f]+')  # a property name JSON writes as it is

# schema nodes (ForcedCalls.nodes holds them; states name them by index)
ANY, FREE_OBJECT = ("any",), ("object", (), frozenset())
_SCALARS = {"string": ("string",), "number": ("number",), "integer": ("integer",),
            "boolean": ("boolean",), "null": ("null",)}


class ForcedCalls(TokenConstraint):
    """Replies that are calls in ``fmt`` to the tools of ``schemas`` (name -> its ``parameters``
    schema), at most ``max_calls`` (None: any number, in the formats that write several). States
    are nested tuples ``(kind, ..., then)``: what the next character may be, and the state to go
    on in once that part is written."""

    def __init__(self, fmt: ToolFormat, tokenizer, schemas: dict[str, dict | None],
                 max_calls: int | None = None):
        super().__init__(tokenizer.vocab_size)
        self.names = sorted(schemas)
        if not self.names or not all(_NAME.fullmatch(n) for n in self.names):
            raise ValueError("a forced call needs tool names of letters, digits, '_', '-', '.' or ':'")
        self.nodes: list[tuple] = []
        self._ids: dict[tuple, int] = {}
        self.arguments = {n: self._node(s, top=True) for n, s in schemas.items()}
        self.fmt, self.max_calls = fmt, max_calls or 1 << 30
        self.key = '"parameters"' if fmt.bare else '"arguments"'
        self.close = fmt.args[0] if fmt.args else '"'  # what ends a call's name
        self.marker_texts = [m for m in (fmt.start, fmt.end, fmt.args) if m]
        self.texts = list(tokenizer.token_texts)
        self.markers = []  # markers that are one control token: read as their text
        for marker in self.marker_texts:
            ids = tokenizer.encode(marker, add_special_tokens=False)
            if len(ids) == 1 and not self.texts[ids[0]]:
                self.texts[ids[0]] = marker
                self.markers.append(ids[0])
        self.trie = tokenizer.text_trie
        self.eos = frozenset(tokenizer.eos_token_ids)
        self.start = ("space", SPACE_AROUND, self._call(1))
        self._next: dict[tuple[State, int], State | None] = {}

    # -- schemas -----------------------------------------------------------------------------
    def _node(self, schema, top: bool = False) -> int:
        """The index of a schema's node: ``("string",)`` and the other scalars, ``("choice",
        texts)`` for ``enum``/``const`` (the values as JSON writes them, sorted), ``("array",
        item)``, ``("object", ((name, node), ...), required)`` (no names: any object), ``ANY``.
        ``top``: the arguments, an object whatever the schema says."""
        node = ANY
        if isinstance(schema, dict):
            values = [schema["const"]] if "const" in schema else schema.get("enum")
            kind = schema.get("type", "object" if "properties" in schema else None)
            if isinstance(values, list) and values and all(
                    v is None or isinstance(v, (str, int, float, bool)) for v in values):
                node = ("choice", tuple(sorted({json.dumps(v, ensure_ascii=False) for v in values})))
            elif kind in _SCALARS:
                node = _SCALARS[kind]
            elif kind == "array":
                node = ("array", self._node(schema.get("items")))
            elif kind == "object":
                props = schema.get("properties")
                if isinstance(props, dict) and props and all(_PLAIN.fullmatch(k) for k in props):
                    required = schema.get("required")
                    required = frozenset(required if isinstance(required, list) else []) & set(props)
                    node = ("object", tuple((k, self._node(props[k])) for k in sorted(props)), required)
                else:
                    node = FREE_OBJECT
        if top and node[0] != "object":
            node = FREE_OBJECT
        if node not in self._ids:
            self._ids[node] = len(self.nodes)
            self.nodes.append(node)
        return self._ids[node]

    # -- the reply: calls in the format ------------------------------------------------------
    def _call(self, k: int) -> State:
        """The state before call ``k`` (1-based) is begun."""
        fmt, after = self.fmt, ("after", k, SPACE_AROUND)
        if fmt.end is not None:
            return _lit(fmt.start, ("ws", self._object(("ws", _lit(fmt.end, after)))))
        if fmt.args is not None:
            return _lit(fmt.start, ("name", "", after))
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
        """``{"name": "NAME", ...`` (:meth:`_named` writes the rest), then ``then``."""
        return _lit("{", ("ws", _lit('"name"', ("ws", _lit(":", ("ws", _lit('"', ("name", "", then))))))))

    def _named(self, name: str, then: State) -> State:
        """A call's part after its name: its arguments, by the tool's schema."""
        args = ("sv", self.arguments[name])
        if self.fmt.args is not None:
            return _lit(self.fmt.args[1:], (*args, then))
        value = (*args, ("ws", _lit("}", then)))
        return ("ws", _lit(",", ("ws", _lit(self.key, ("ws", _lit(":", value))))))

    # -- characters --------------------------------------------------------------------------
    def _char(self, state: State, ch: str) -> State | None:
        """The state after character ``ch`` (None: it may not come here)."""
        kind = state[0]
        if kind == "lit":
            text, then = state[1], state[2]
            return None if ch != text[0] else (then if len(text) == 1 else ("lit", text[1:], then))
        if kind == "str":  # ("str", tail, then); tail: the end of the string so far that begins a marker
            if ch == '"':
                return state[2]
            if ch == "\\":
                return ("esc", state[2])
            return None if ord(ch) < 0x20 else self._in_string(state[1] + ch, state[2])
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
        if kind == "name":  # ("name", typed, then): a call's name
            typed, then = state[1], state[2]
            if ch == self.close and typed in self.names:
                return self._named(typed, then)
            return ("name", typed + ch, then) if _begins(self.names, typed + ch) else None
        if kind == "list":  # after a call of Mistral's list
            k = state[1]
            if ch == ",":
                return ("ws", self._object(("list", k + 1))) if k < self.max_calls else None
            return ("after", self.max_calls, SPACE_AROUND) if ch == "]" else None
        if kind in _SCHEMA_KINDS:
            return self._schema(state, ch)
        return _json(state, ch, self._char)

    def _schema(self, state: State, ch: str) -> State | None:
        """A value by its schema node: ``sv`` (a value of node n), an object's ``sk`` (after
        ``{``), ``sm`` (after a member) and ``skey`` (a key being written; ``used``: a bit per
        property written), an array's ``sa`` (after ``[``) and ``se``, an enum's ``choice``, a
        ``number`` or ``integer`` (its text so far)."""
        kind, n, then = state[0], state[1], state[-1]
        if kind in ("number", "integer"):  # (kind, text, then): read to the first other character
            text, pattern = n + ch, _NUMBER if kind == "number" else _INTEGER
            if ch in "0123456789+-.eE" and (pattern.fullmatch(text) or pattern.fullmatch(text + "0")):
                return (kind, text, then)
            return self._char(then, ch) if pattern.fullmatch(n) else None
        node = self.nodes[n]
        if kind == "sv":
            what = node[0]
            if what == "any":
                return self._char(("value", then), ch)
            if what == "choice":
                return self._char(("choice", n, "", then), ch)
            if what == "object":
                return (("sk", n, 0, then) if node[1] else ("keys", then)) if ch == "{" else None
            if what == "array":
                return ("sa", node[1], then) if ch == "[" else None
            if what == "string":
                return ("str", "", then) if ch == '"' else None
            if what in ("number", "integer"):
                return (what, ch, then) if ch == "-" or ch in "0123456789" else None
            literal = "true" if ch == "t" else "false" if ch == "f" else None
            if what == "null":
                literal = "null"
            return ("lit", literal[1:], then) if literal and ch == literal[0] else None
        if kind == "choice":  # ("choice", n, typed, then): one of node n's values, as JSON writes it
            texts, typed = node[1], state[2] + ch
            i = bisect.bisect_left(texts, typed)
            if i < len(texts) and texts[i].startswith(typed):
                longer = i + 1 < len(texts) and texts[i + 1].startswith(typed)
                return then if texts[i] == typed and not longer else ("choice", n, typed, then)
            return self._char(then, ch) if state[2] in texts else None
        if kind in ("sk", "sm"):  # (kind, n, used, then)
            props, required, used = node[1], node[2], state[2]
            done = all(used >> i & 1 for i, (k, _) in enumerate(props) if k in required)
            if ch == "}":
                return then if done else None
            if kind == "sk":
                return ("skey", n, used, "", then) if ch == '"' and used != (1 << len(props)) - 1 else None
            return ("ws", _lit('"', ("skey", n, used, "", then))) if ch == "," and used != (1 << len(
                props)) - 1 else None
        if kind == "skey":  # ("skey", n, used, typed, then)
            props, used, typed = node[1], state[2], state[3]
            left = [k for i, (k, _) in enumerate(props) if not used >> i & 1]
            if ch == '"' and typed in left:
                i = [k for k, _ in props].index(typed)
                return ("ws", _lit(":", ("sv", props[i][1], ("sm", n, used | 1 << i, then))))
            return ("skey", n, used, typed + ch, then) if _begins(left, typed + ch) else None
        if kind == "sa":  # ("sa", item, then)
            return then if ch == "]" else self._char(("sv", n, ("se", n, then)), ch)
        if kind == "se":
            return ("sv", n, ("se", n, then)) if ch == "," else (then if ch == "]" else None)
        raise AssertionError(f"unknown state {kind}")

    def _in_string(self, text: str, then: State) -> State | None:
        """Inside a string after ``text``: None where it ends with one of the format's markers (a
        call's text must not hold one: the reply's reader would end the call there)."""
        if any(text.endswith(m) for m in self.marker_texts):
            return None
        for i in range(len(text)):
            if any(m.startswith(text[i:]) for m in self.marker_texts):
                return ("str", text[i:], then)
        return ("str", "", then)

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
        if len(self._next) >= MAX_STEPS:  # shared by a server's requests: bounded
            self._next.clear()
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
_SKIPS_WS = frozenset({"ws", "keys", "members", "value", "items", "elements", "list", "sv", "sk", "sm", "sa",
                       "se"})
_SCHEMA_KINDS = frozenset({"sv", "sk", "sm", "skey", "sa", "se", "choice", "number", "integer"})


def _lit(text: str, then: State) -> State:
    """``text`` exactly, then ``then``."""
    return ("lit", text, then) if text else then


def _begins(words: list[str], prefix: str) -> bool:
    """Whether one of the sorted ``words`` begins with ``prefix``."""
    i = bisect.bisect_left(words, prefix)
    return i < len(words) and words[i].startswith(prefix)


def _json(state: State, ch: str, char) -> State | None:
    """Any JSON value: ``value``, an object's ``keys`` (after ``{``) and ``members`` (after a
    member), an array's ``items`` (after ``[``) and ``elements``, a string's escapes ``esc`` and
    ``hex``. ``char`` reads a character in another state (a number's, an array's first value)."""
    kind, then = state[0], state[-1]
    if kind == "keys" and ch == "}":
        return then
    if kind in ("keys", "members"):
        member = ("str", "", ("ws", _lit(":", ("value", ("members", then)))))
        if kind == "keys":
            return member if ch == '"' else None
        return ("ws", _lit('"', member)) if ch == "," else (then if ch == "}" else None)
    if kind == "value":
        if ch == "{":
            return ("keys", then)
        if ch == "[":
            return ("items", then)
        if ch == '"':
            return ("str", "", then)
        if ch == "-" or ch in "0123456789":
            return ("number", ch, then)
        return ("lit", _LITERALS[ch], then) if ch in _LITERALS else None
    if kind == "items":
        return then if ch == "]" else char(("value", ("elements", then)), ch)
    if kind == "elements":
        return ("value", ("elements", then)) if ch == "," else (then if ch == "]" else None)
    if kind == "esc":
        if ch in '"\\/bfnrt':
            return ("str", "", then)
        return ("hex", 4, then) if ch == "u" else None
    if kind == "hex":
        if ch not in "0123456789abcdefABCDEF":
            return None
        return ("str", "", then) if state[1] == 1 else ("hex", state[1] - 1, then)
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


def forced_calls(tokenizer, tools: list[dict], names=None, max_calls: int | None = None,
                 fmt: ToolFormat | None = None) -> ForcedCalls:
    """The constraint under which a reply is calls to ``tools`` (OpenAI's tool definitions, as
    the template got them; ``names``: only those, :func:`forced_names`), at most ``max_calls``,
    with arguments by each tool's ``parameters``, in ``fmt`` (default: the format the tokenizer's
    chat template writes); for ``generate(..., constraint=...)``. Requests for the same tools
    share one, and its cached masks."""
    fmt = fmt or tool_format(getattr(tokenizer, "chat_template", None))
    if fmt is None:
        raise ValueError("the chat template writes no tool calls in a format this package reads "
                         "(<tool_call> blocks, Mistral's [TOOL_CALLS], Llama 3's JSON)")
    if problem := tools_problem(tools):
        raise ValueError(f"{problem[0]} must be {problem[1]}")
    schemas = {t["function"]["name"]: t["function"].get("parameters") for t in tools}
    if names is not None:
        if unknown := [n for n in names if n not in schemas]:
            raise ValueError(f"no tool is named {', '.join(map(repr, unknown))}")
        schemas = {n: schemas[n] for n in names}
    return _shared(fmt, tokenizer, json.dumps(schemas, sort_keys=True), max_calls)


@functools.lru_cache(maxsize=16)
def _shared(fmt: ToolFormat, tokenizer, schemas: str, max_calls: int | None) -> ForcedCalls:
    return ForcedCalls(fmt, tokenizer, json.loads(schemas), max_calls)
