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
``parameters`` schema as :mod:`.json_grammar` reads one (its rules for whitespace, markers inside
strings and EOS hold here: a string may not hold the format's markers, and up to two whitespace
characters may come before the first call and after the last).

Example (hermes; tools ``weather(city: string, required)`` and ``time``): after
``<tool_call>{"name": "`` the pieces ``w`` or ``time`` may follow, ``x`` may not; after
``{"name": "weather", "arguments": {`` only ``"city"`` may begin, and ``}`` only after it; after
``"city": "Pa`` anything but a control character or a marker (``</tool_call>`` inside a string
would end the call for the reader); EOS only after ``</tool_call>``.
"""

from __future__ import annotations

import functools
import json
import re

from .constraint import State, check_reads_tokens
from .json_grammar import SKIPS_WS, SPACE_AROUND, WS, JSONGrammar, begins, lit
from .tool_calls import ToolFormat, tool_format, tools_problem, tools_template

_NAME = re.compile(r"[A-Za-z0-9_.:-]+")  # a name JSON writes as it is (OpenAI's: [A-Za-z0-9_-])


class ForcedCalls(JSONGrammar):
    """Replies that are calls in ``fmt`` to the tools of ``schemas`` (name -> its ``parameters``
    schema), at most ``max_calls`` (None: any number, in the formats that write several).
    ``optional``: text may come first, and the calls only once it writes the format's start
    marker (``tool_choice: "auto"`` with a strict tool: the model chooses, but what it calls is a
    tool, by its schema); a Llama 3 reply that begins with ``{`` is calls, as the reader reads it."""

    def __init__(self, fmt: ToolFormat, tokenizer, schemas: dict[str, dict | None],
                 max_calls: int | None = None, optional: bool = False):
        super().__init__(tokenizer, markers=fmt.markers)
        self.names = sorted(schemas)
        if not self.names or not all(_NAME.fullmatch(n) for n in self.names):
            raise ValueError("a forced call needs tool names of letters, digits, '_', '-', '.' or ':'")
        self.arguments = {n: self._node(s, top=True) for n, s in schemas.items()}
        self.fmt, self.max_calls = fmt, max_calls or 1 << 30
        self.key = '"parameters"' if fmt.bare else '"arguments"'
        self.close = fmt.args[0] if fmt.args else '"'  # what ends a call's name
        self.skips_ws = SKIPS_WS | {"list"}
        self.start = ("prose", 0, True) if optional else ("space", SPACE_AROUND, self._call(1))

    # -- the reply: calls in the format ------------------------------------------------------
    def _call(self, k: int) -> State:
        """The state before call ``k`` (1-based) is begun."""
        fmt, after = self.fmt, ("after", k, SPACE_AROUND)
        if fmt.end is not None:
            return lit(fmt.start, ("ws", self._object(("ws", lit(fmt.end, after)))))
        if fmt.args is not None:
            return lit(fmt.start, ("name", "", after))
        if fmt.bare:
            return self._object(after)
        return lit(fmt.start, ("ws", lit("[", ("ws", self._object(("list", 1))))))

    def _after(self, k: int) -> State | None:
        """The state that call ``k + 1`` begins in, None where no call may follow call ``k``."""
        if k >= self.max_calls or not (self.fmt.end or self.fmt.args or self.fmt.bare):
            return None
        if self.fmt.bare:
            return lit(";", ("ws", self._object(("after", k + 1, SPACE_AROUND))))
        return self._call(k + 1)

    def _object(self, then: State) -> State:
        """``{"name": "NAME", ...`` (:meth:`_named` writes the rest), then ``then``."""
        return lit("{", ("ws", lit('"name"', ("ws", lit(":", ("ws", lit('"', ("name", "", then))))))))

    def _named(self, name: str, then: State) -> State:
        """A call's part after its name: its arguments, by the tool's schema."""
        args = ("sv", self.arguments[name])
        if self.fmt.args is not None:
            return lit(self.fmt.args[1:], (*args, then))
        value = (*args, ("ws", lit("}", then)))
        return ("ws", lit(",", ("ws", lit(self.key, ("ws", lit(":", value))))))

    def _frame(self, state: State, ch: str) -> State | None:
        """The states around the calls: ``after`` (a call is whole: EOS, whitespace or the next
        call), ``name`` (a call's name being written), ``list`` (after a call of Mistral's list)."""
        kind = state[0]
        if kind == "prose":  # ("prose", characters of the start marker written, at the reply's start)
            return self._prose(state[1], state[2], ch)
        if kind == "after":  # ("after", calls written, whitespace left)
            if ch in WS:
                return ("after", state[1], state[2] - 1) if state[2] > 0 else None
            nxt = self._after(state[1])
            return None if nxt is None else self._char(nxt, ch)
        if kind == "name":  # ("name", typed, then): a call's name
            typed, then = state[1], state[2]
            if ch == self.close and typed in self.names:
                return self._named(typed, then)
            return ("name", typed + ch, then) if begins(self.names, typed + ch) else None
        if kind == "list":  # ("list", calls written)
            k = state[1]
            if ch == ",":
                return ("ws", self._object(("list", k + 1))) if k < self.max_calls else None
            return ("after", self.max_calls, SPACE_AROUND) if ch == "]" else None
        raise AssertionError(f"unknown state {kind}")

    def _prose(self, matched: int, first: bool, ch: str) -> State | None:
        """Text before any call: the calls' state once it writes the start marker (or, Llama 3's,
        begins with ``{``); else how much of the marker its end has written."""
        start = self.fmt.start
        if first and self.fmt.bare and ch in "{ \t\n\r":  # a reply that begins with {: calls
            return self._char(self._call(1), ch) if ch == "{" else ("prose", 0, True)
        typed = start[:matched] + ch
        if typed == start:
            state = self._call(1)
            if not self.fmt.bare:  # the marker begins the call: read it there
                for c in start:
                    state = self._char(state, c)
            return state
        k = next(k for k in range(len(typed), -1, -1) if start.startswith(typed[len(typed) - k:]))
        return ("prose", k, False)

    def _whole(self, state: State) -> bool:
        return state[0] in ("after", "prose")


def has_strict(tools: list[dict] | None) -> bool:
    """Whether a tool is marked ``strict`` (OpenAI's: its calls follow its schema), so that a reply
    the model chooses is decoded under ``forced_calls(..., optional=True)``."""
    return any(isinstance(t, dict) and isinstance(t.get("function"), dict)
               and t["function"].get("strict") is True for t in tools or [])


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
                 fmt: ToolFormat | None = None, optional: bool = False) -> ForcedCalls:
    """The constraint under which a reply is calls to ``tools`` (OpenAI's tool definitions, as
    the template got them; ``names``: only those, :func:`forced_names`), at most ``max_calls``,
    with arguments by each tool's ``parameters``, in ``fmt`` (default: the format the tokenizer's
    chat template writes); for ``generate(..., constraint=...)``. Requests for the same tools
    share one, and its cached masks. ``names`` may be one name (a string). ``optional``: the
    reply may be text instead, or text then calls (:class:`ForcedCalls`)."""
    check_reads_tokens(tokenizer, "forced_calls")
    fmt = fmt or tool_format(tools_template(tokenizer))
    if fmt is None:
        raise ValueError("the chat template writes no tool calls in a format this package reads "
                         "(<tool_call> blocks, Mistral's [TOOL_CALLS], Llama 3's JSON)")
    if problem := tools_problem(tools):
        raise ValueError(f"{problem[0]} must be {problem[1]}")
    # OpenAI's rule: a tool without parameters takes none (its arguments are {})
    schemas = {t["function"]["name"]: t["function"].get("parameters", NO_PARAMETERS) for t in tools}
    if isinstance(names, str):
        names = [names]
    if names is not None:
        if unknown := [n for n in names if n not in schemas]:
            raise ValueError(f"no tool is named {', '.join(map(repr, unknown))}")
        schemas = {n: schemas[n] for n in names}
    return _shared(fmt, tokenizer, json.dumps(schemas, sort_keys=True), max_calls, optional)


NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}


@functools.lru_cache(maxsize=16)
def _shared(fmt: ToolFormat, tokenizer, schemas: str, max_calls: int | None, optional: bool) -> ForcedCalls:
    return ForcedCalls(fmt, tokenizer, json.loads(schemas), max_calls, optional)
