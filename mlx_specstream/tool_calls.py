"""Tool calls in a chat model's output, as OpenAI's API returns them.

A chat template that renders ``tools`` teaches the model one way of writing a call; the text
the model writes is read back here into OpenAI's ``tool_calls``::

    hermes        (Qwen 2.5/3, Hermes, SmolLM 3):  <tool_call>{"name": ..., "arguments": {...}}</tool_call>
                                                    (one block per call)
    mistral       (Mistral's v3 tokenizers):        [TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]
                                                    (to the end of the reply)
    mistral-args  (Mistral's v11+ tokenizers):      [TOOL_CALLS]name[ARGS]{...}[TOOL_CALLS]name[ARGS]{...}
    llama3        (Llama 3.1-3.3):                  {"name": ..., "parameters": {...}}; {...}
                                                    (the whole reply, maybe after <|python_tag|>)

The format is the one whose marker the template writes (:func:`tool_format`). The text outside
the calls is the reply's content; the whitespace around a call is not (but for one run between text
before a call and text after it: ``a <call> b`` reads ``a b``). A call's ``arguments`` are the
text the model wrote for them where its name came first and they are an object (otherwise the
value read, as JSON text). A block that cannot be read (not JSON, no name) stays in the content as
the model wrote it, so nothing the model wrote is lost; but a marked block whose calls begin as
calls (``{"name": "f", "arguments": {``) is calls, their arguments as written, cut where the
reply was cut (``max_tokens``), as OpenAI's: a stream gives a call's name and the beginning of its
arguments before the block ends (:class:`CallDelta`), and a whole reply reads the same.

Example (hermes)::

    >>> read_tool_calls('Let me look.\\n<tool_call>\\n{"name": "weather", "arguments": '
    ...                 '{"city": "Paris"}}\\n</tool_call>', HERMES)
    ToolCalls(content='Let me look.', calls=[{'id': 'call_…', 'type': 'function',
              'function': {'name': 'weather', 'arguments': '{"city": "Paris"}'}}])
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field

from .api import held_back


@dataclass(frozen=True)
class ToolFormat:
    """How a family of chat templates writes tool calls: ``start`` begins them; ``end`` ends
    each one (None: the calls run to the end of the reply); ``args`` stands between a call's name
    and its arguments (None: a call is a JSON object); ``bare``: a reply that begins with ``{`` is
    calls too (no marker). ``mark`` is what a template that writes the format holds."""

    name: str
    start: str
    end: str | None
    args: str | None = None
    bare: bool = False
    mark: str = ""

    @property
    def markers(self) -> tuple[str, ...]:
        """The texts that mark calls in this format."""
        return tuple(m for m in (self.start, self.end, self.args) if m)

    def special(self, tokenizer) -> bool:
        """Whether the markers are control tokens that text without special tokens leaves out
        (the server then keeps special tokens in a reply that may call tools)."""
        for marker in self.markers:
            ids = tokenizer.encode(marker, add_special_tokens=False)
            if len(ids) == 1 and tokenizer.decode(ids, skip_special_tokens=True) == "":
                return True
        return False


HERMES = ToolFormat("hermes", "<tool_call>", "</tool_call>", mark="<tool_call>")
MISTRAL_ARGS = ToolFormat("mistral-args", "[TOOL_CALLS]", None, args="[ARGS]", mark="[ARGS]")
MISTRAL = ToolFormat("mistral", "[TOOL_CALLS]", None, mark="[TOOL_CALLS]")
LLAMA3 = ToolFormat("llama3", "<|python_tag|>", None, bare=True, mark='"parameters": ')
FORMATS = (HERMES, MISTRAL_ARGS, MISTRAL, LLAMA3)  # in the order they are looked for


def tools_problem(tools) -> tuple[str, str] | None:
    """What is wrong with a list of OpenAI tool definitions, as (the item, what it must be);
    None where each is ``{"type": "function", "function": {"name": ..., "parameters": {...}}}``,
    each of its own name."""
    if not isinstance(tools, list):
        return "tools", "a list of tool definitions"
    for i, t in enumerate(tools):
        f = t.get("function") if isinstance(t, dict) else None
        if not (isinstance(t, dict) and t.get("type") == "function" and isinstance(f, dict)
                and isinstance(f.get("name"), str) and f["name"]
                and isinstance(f.get("parameters", {}), dict)):
            return f"tools[{i}]", '{"type": "function", "function": {"name": ..., "parameters": {...}}}'
    names = [t["function"]["name"] for t in tools]
    if len(set(names)) < len(names):  # a call would not say which one it is
        twice = next(n for n in names if names.count(n) > 1)
        return "tools", f"tools of distinct names ('{twice}' is named twice)"
    return None


def tools_template(tokenizer) -> str | None:
    """The chat template ``tokenizer`` renders a conversation with tools by (its ``tool_use``
    template, where the model names one: :meth:`~.tokenizer.Tokenizer.template_for`)."""
    pick = getattr(tokenizer, "template_for", None)
    return pick(True) if pick is not None else getattr(tokenizer, "chat_template", None)


def tool_format(chat_template: str | None) -> ToolFormat | None:
    """The format a chat template writes tool calls in: the first of :data:`FORMATS` whose mark
    it holds (None: it writes none this module reads)."""
    for fmt in FORMATS:
        if chat_template and fmt.mark in chat_template:
            return fmt
    return None


@dataclass(frozen=True)
class CallRules:
    """How a reply is read for calls, besides its format: ``max_calls``, calls after that many are
    left out (OpenAI's ``parallel_tool_calls: false`` asks for one); ``names``, the tools it may
    call (a call to another name is the model's text, as an app that dispatches on the name needs;
    None: any name); ``calls_only``, the reply is calls and nothing else (a forced ``tool_choice``:
    the text around its calls, and a call cut before its arguments begin, are the template's
    markup, never content)."""

    max_calls: int | None = None
    names: frozenset[str] | None = None
    calls_only: bool = False

    def allows(self, name) -> bool:
        """Whether ``name`` is a call's name: a non-empty string, one of :attr:`names`."""
        return isinstance(name, str) and bool(name) and (self.names is None or name in self.names)


def _call(obj, rules: CallRules, written: str | None = None) -> dict | None:
    """One call object the model wrote (``{"name", "arguments"}``; ``"parameters"`` for the
    arguments, as Llama 3.1's templates write them) as OpenAI's ``tool_calls`` item, whose
    ``arguments`` is JSON text: ``written``, the arguments' text as the model wrote it, where
    known; None where it is not a call (or not one the ``rules`` allow)."""
    if not isinstance(obj, dict) or not rules.allows(obj.get("name")):
        return None
    if written is None:
        args = utf8_safe(obj.get("arguments", obj.get("parameters", {})))
        written = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    return {"id": _new_id(), "type": "function", "function": {"name": obj["name"], "arguments": written}}


def _new_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def utf8_safe(value):
    """``value`` with each lone surrogate (JSON's ``"\\ud800"``, which no UTF-8 text holds) as
    U+FFFD, so that a reply carrying it can be sent."""
    if isinstance(value, str):
        return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    if isinstance(value, list):
        return [utf8_safe(v) for v in value]
    if isinstance(value, dict):
        return {utf8_safe(k): utf8_safe(v) for k, v in value.items()}
    return value


def _calls(body: str, fmt: ToolFormat, rules: CallRules,
           marked: bool = True) -> tuple[list[dict], str] | None:
    """The calls of one block's text (after the start marker, to the end marker or the reply's
    end) and the text after them that is not calls, or None if it is not calls: read whole where
    the block is JSON calls the ``rules`` allow, else (``marked``: a marker opened it) the calls
    that begin as calls (:meth:`_BlockScan.begun`), with their arguments as far as they were written, up to
    the first that is not one (another tool's, say), which with what follows it is the model's
    text as written."""
    scan = _BlockScan(fmt, rules)
    spans = scan.begun(body)
    written = [body[a:len(body) if e is None else e] for _, a, e in spans]
    objs = _objects(body, fmt)
    calls = None
    if objs is not None:  # a call streamed in part keeps its streamed name (an object may say "name" twice)
        calls = [_call({**o, "name": spans[k][0]}, rules, written[k])
                 if k < len(spans) and isinstance(o, dict) else _call(o, rules) for k, o in enumerate(objs)]
    if calls and all(calls):
        return calls, ""
    if marked and spans:
        rest = "" if scan.stop is None else body[scan.stop - (len(fmt.start) if fmt.args is not None else 0):]
        return [_call({"name": name}, rules, w) for (name, _, _), w in zip(spans, written)], rest
    return None


def _objects(body: str, fmt: ToolFormat) -> list | None:
    """The JSON call objects of a block's text, or None where it is not JSON calls."""
    try:
        if fmt.args is not None:  # name[ARGS]{...}, the next call after another start marker
            named = [part.partition(fmt.args) for part in body.split(fmt.start)]
            objs = [{"name": name.strip(), "arguments": json.loads(args)} if sep else None
                    for name, sep, args in named]
        elif fmt.end is None:  # JSON values to the end: lists of calls, or calls apart by ";"
            objs = []
            for value in _json_values(body):
                objs += value if isinstance(value, list) else [value]
        else:
            objs = [json.loads(body)]
    except ValueError:
        return None
    return objs


_SPACE = re.compile(r"\s*")  # what str.strip strips: the same Unicode whitespace


def _past_space(text: str, i: int) -> int:
    """Where the whitespace at ``text[i:]`` ends (without copying the rest of ``text``)."""
    return _SPACE.match(text, i).end()


_CHARS = r'(?:[^"\\]|\\.)*(")?'  # a JSON string's characters, to its closing quote (or open)
_STRING_REST = re.compile(_CHARS)
_BRACKET_OR_STRING = re.compile(rf'"{_CHARS}|[{{}}\[\]]')

ScanState = tuple[int, int, bool]  # where a scan resumes, the depth there, whether inside a string


def _json_scan(text: str, i: int, depth: int = 0, in_string: bool = False) -> tuple[int | None, ScanState]:
    """Where the JSON object or array that begins at ``text[i]`` ends (the index after it; None
    while it is open), and where a scan of the same text with more written resumes.
    ``depth``: that many are open already at ``i`` (1: the end of the one that holds
    ``text[i:]``); ``in_string``: ``i`` is inside a string (a resumed scan)."""
    if in_string:
        m = _STRING_REST.match(text, i)
        if m.group(1) is None:
            return None, (m.end(), depth, True)
        i = m.end()
    for m in _BRACKET_OR_STRING.finditer(text, i):
        c = m.group()
        if c[0] == '"':
            if m.group(1) is None:  # open: it runs to the text's end (or to a last backslash)
                return None, (m.end(), depth, True)
        elif c in "{[":
            depth += 1
        else:
            depth -= 1
            if depth == 0:
                return m.end(), (m.end(), 0, False)
    return None, (len(text), depth, False)


# a call object that begins with its name, then its arguments: what a stream can give in part
_HEADER = re.compile(r'\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"(?:arguments|parameters)"\s*:\s*')


class _BlockScan:
    """An open block's text read as it grows, for a stream: the calls it has begun
    (:meth:`begun`) and where its end marker is (:meth:`end`). What is settled is read once: a
    call whose object and the separator after it have been written is kept, open arguments are
    scanned on from where the last scan stopped, and the end marker is looked for in the new text
    only; so reading a block costs in proportion to its length, not its length times its pieces.

    Example (Hermes' JSON calls), the text growing by pieces::

        '{"name": "f", "arguments": {"x": "a'     -> [("f", 27, None)]  (scan resumes at 35, in a string)
        '{"name": "f", "arguments": {"x": "ab"}}' -> [("f", 27, 38)]
    """

    def __init__(self, fmt: ToolFormat, rules: CallRules):
        self.fmt, self.rules = fmt, rules
        self._settled: list[tuple[str, int, int]] = []  # calls read to the separator after them
        self._next: int | None = None  # where the next call's text begins (None: the block's start)
        self._scan: tuple[int, ScanState] | None = None  # open arguments: where they begin, the scan
        self._end_from = 0  # the end marker is not before this
        self.stop: int | None = None  # where reading stopped after whole calls (at one it cannot read)

    def end(self, body: str) -> int:
        """Where the end marker begins in ``body`` (-1: not yet, or the format has none)."""
        if not self.fmt.end:
            return -1
        j = body.find(self.fmt.end, self._end_from)
        self._end_from = max(0, len(body) - len(self.fmt.end) + 1) if j < 0 else j
        return j

    def begun(self, body: str) -> list[tuple[str, int, int | None]]:
        """The calls the block's text so far (``body``; each call's text extends the last) has
        begun, as far as their names and arguments can be told before the block ends: (name, where
        the arguments' object begins, where it ends; None while it is open), in order, up to the
        first call whose name does not come before its arguments, whose arguments are not an object
        (such calls are read when the block is whole), or whose name the rules do not allow."""
        i = self._next if self._next is not None else self._first(body)
        self.stop = None
        while (head := self._head(body, i)) is not None:
            name, a = head
            end = self._args_end(body, a)
            after = None if end is None else self._after(body, end)
            if after is None:
                return [*self._settled, (name, a, end)]
            self._settled.append((name, a, end))
            self._next = i = after
        self.stop = i if self._settled else None
        return list(self._settled)

    def _first(self, body: str) -> int:
        """Where the first call begins: past a list's bracket in JSON formats."""
        if self.fmt.args is not None:
            return 0
        i = _past_space(body, 0)
        return i + 1 if body[i:i + 1] == "[" else i

    def _head(self, body: str, i: int) -> tuple[str, int] | None:
        """The name of the call whose text begins at ``i``, and where its arguments' object begins;
        None where that is not (yet) a name followed by an object."""
        if self.fmt.args is not None:  # name[ARGS]{...}[TOOL_CALLS]name[ARGS]{...}
            k = body.find(self.fmt.args, i)
            if k < 0:
                return None
            name, a = body[i:k].strip(), _past_space(body, k + len(self.fmt.args))
        else:
            m = _HEADER.match(body, _past_space(body, i))
            if m is None:
                return None
            try:
                name, a = json.loads(m.group(1)), m.end()
            except ValueError:  # not a JSON string (a bad escape): read once the block is whole
                return None
        return (name, a) if self.rules.allows(name) and body[a:a + 1] == "{" else None

    def _args_end(self, body: str, a: int) -> int | None:
        """Where the arguments' object that begins at ``a`` ends (None while it is open)."""
        state = self._scan[1] if self._scan and self._scan[0] == a else (a, 0, False)
        end, state = _json_scan(body, *state)
        self._scan = (a, state) if end is None else None
        return end

    def _after(self, body: str, end: int) -> int | None:
        """Where the next call's text begins after a call whose arguments end at ``end``; None
        where no next call is (yet) marked."""
        if self.fmt.args is not None:
            i = body.find(self.fmt.start, end)
            return None if i < 0 else i + len(self.fmt.start)
        close = _json_scan(body, end, depth=1)[0]  # the call object's end
        if close is None:
            return None
        i = _past_space(body, close)
        return i + 1 if body[i:i + 1] in (",", ";") else None


def _json_values(text: str) -> list:
    """The JSON values of ``text``, one after another, apart by whitespace and at most one ``;``
    (ValueError where it is anything else)."""
    decoder, values, i = json.JSONDecoder(), [], 0
    while True:
        i = _past_space(text, i)
        if i == len(text):
            return values
        if values and text[i] == ";":
            i = _past_space(text, i + 1)
        value, i = decoder.raw_decode(text, i)
        values.append(value)


@dataclass
class ToolCalls:
    """A reply read for tool calls: its ``content`` (None when it is only calls, as OpenAI's)
    and the ``calls``, OpenAI's ``tool_calls`` items."""

    content: str | None
    calls: list[dict] = field(default_factory=list)


@dataclass
class CallDelta:
    """A piece of a streamed call, as OpenAI's streamed ``tool_calls`` items give it: the call's
    ``index`` among the reply's calls; its ``id`` and ``name`` in its first piece (None after);
    the next ``arguments`` text; ``done`` in its last piece."""

    index: int
    id: str | None
    name: str | None
    arguments: str
    done: bool = False


Event = str | CallDelta  # what a reader gives: content, or a piece of a call


def _add(events: list[Event], *items: Event) -> None:
    """Append ``items`` to ``events``, content next to content joined and empty content left out."""
    for item in items:
        if isinstance(item, str) and events and isinstance(events[-1], str):
            events[-1] += item
        elif item != "":
            events.append(item)


def split_events(events: list[Event]) -> tuple[str, list[CallDelta]]:
    """Events as their content (joined) and their pieces of calls."""
    return "".join(e for e in events if isinstance(e, str)), [e for e in events if isinstance(e, CallDelta)]


class ToolCallReader:
    """Reads a reply for tool calls as its text arrives, for streaming: :meth:`feed` each piece,
    then :meth:`close`; each gives the content that became final and the pieces of calls
    (:class:`CallDelta`) it made known: a call's name and its arguments as they are written, where
    its name comes first and its arguments are an object; otherwise the whole call once its block
    is whole. Whole calls are in :attr:`calls`.

    Text that could begin the start marker, or is only whitespace, waits until it is known to be
    content; so does a whole reply that begins with ``{`` in a ``bare`` format. ``rules``: which
    calls are read, and whether there is content (:class:`CallRules`).
    """

    def __init__(self, fmt: ToolFormat, rules: CallRules = CallRules()):
        self.fmt, self.rules = fmt, rules
        self.calls: list[dict] = []
        self._text = ""  # outside a call: not yet given out; inside: the call's text so far
        self._opened: str | None = None  # inside a call: the marker that opened it ("" for none)
        self._block = _BlockScan(fmt, rules)  # inside a call: its text read so far
        self._sent: list[tuple[str, int]] = []  # the open block's calls given in part: (id, text sent)
        self._space = ""  # whitespace given out only if content follows it
        self._given = False  # content has been given out
        self._after_call = False  # a call came last: the whitespace after it is not content

    def _content(self, text: str) -> str:
        if self.rules.calls_only:  # a forced reply: what is not a call is the template's markup
            self._given = self._given or bool(text.strip())
            return ""
        if self._after_call:
            text = text.lstrip()
            self._after_call = not text
        text = self._space + text
        body = text.rstrip()
        self._space = text[len(body):]
        self._given = self._given or bool(body)
        return body

    def _room(self, n: int) -> int:
        """How many of ``n`` more calls are kept."""
        limit = self.rules.max_calls
        return n if limit is None else max(0, min(n, limit - len(self.calls)))

    def _called(self, calls: list[dict]) -> list[CallDelta]:
        """A block read as ``calls``: they join :attr:`calls`; the pieces not given yet."""
        deltas = []
        for call, sent in zip(calls[:self._room(len(calls))], self._sent + [None] * len(calls)):
            index, args = len(self.calls), call["function"]["arguments"]
            if sent is None:
                deltas.append(CallDelta(index, call["id"], call["function"]["name"], args, True))
            else:
                call["id"] = sent[0]
                deltas.append(CallDelta(index, None, None, args[sent[1]:], True))
            self.calls.append(call)
        self._sent = []
        # the whitespace around a call is not content: what came before it goes out only between
        # content before and content after it ("a <call> b" reads "a b")
        self._after_call = True
        self._space = self._space if self._given else ""
        return deltas

    def _partial(self) -> list[CallDelta]:
        """Inside a block that a marker opened: the pieces of its calls written since the last."""
        if not self._opened:  # a bare reply is known to be calls only once it has ended
            return []
        deltas = []
        begun = self._block.begun(self._text)
        for j, (name, a, e) in enumerate(begun[:self._room(len(begun))]):
            index = len(self.calls) + j
            if j == len(self._sent):
                self._sent.append((_new_id(), 0))
                deltas.append(CallDelta(index, self._sent[j][0], name, ""))
            cid, sent = self._sent[j]
            upto = e
            if e is None:  # open arguments: not the text's end that may begin the end marker
                upto = len(self._text) - (held_back(self._text, [self.fmt.end]) if self.fmt.end else 0)
            piece = self._text[a + sent:upto]
            if piece:
                deltas.append(CallDelta(index, None, None, piece))
                self._sent[j] = (cid, sent + len(piece))
        return deltas

    def _open(self) -> str:
        """Outside a call: the content before the next one, entering it where the text so far
        opens one (what could still open one is kept)."""
        if self.fmt.bare and not (self._given or self.calls):  # the reply's beginning
            lead = self._text.lstrip()
            if not lead:
                return ""
            if lead.startswith("{"):
                self._text, self._opened, self._block = lead, "", _BlockScan(self.fmt, self.rules)
                return ""
        i = self._text.find(self.fmt.start)
        if i < 0:
            i = len(self._text) - held_back(self._text, [self.fmt.start])
            content, self._text = self._content(self._text[:i]), self._text[i:]
            return content
        content = self._content(self._text[:i])
        self._text, self._opened = self._text[i + len(self.fmt.start):], self.fmt.start
        self._block = _BlockScan(self.fmt, self.rules)
        return content

    def _close_block(self, body: str, written: str) -> list[Event]:
        """The block ``body`` is whole (``written``: as the model wrote it, markers included): its
        events, in order."""
        read = _calls(body, self.fmt, self.rules, marked=bool(self._opened))
        if read is None:  # not a call: the model's text, as it wrote it
            return [self._content(written)]
        calls, rest = read
        done = self._called(calls)
        return [*done, self._content(rest)]

    def feed(self, text: str) -> list[Event]:
        """Add a piece of the reply: the content it makes final and the pieces of calls, in the
        order the reply has them."""
        self._text += text
        events: list[Event] = []
        while True:
            if self._opened is None:
                _add(events, self._open())
                if self._opened is None:
                    return events
            j = self._block.end(self._text)
            if j < 0:
                return events + self._partial()
            written = self._opened + self._text[: j + len(self.fmt.end)]
            _add(events, *self._close_block(self._text[:j], written))
            self._text, self._opened = self._text[j + len(self.fmt.end):], None

    def close(self) -> list[Event]:
        """The reply has ended: the content still held and the pieces of a last block that ran to
        the end, in order."""
        events: list[Event] = []
        if self._opened is not None:
            _add(events, *self._close_block(self._text, self._opened + self._text))
        elif self._text:
            _add(events, self._content(self._text))
        if not self.calls:
            _add(events, self._space)  # no call: the content keeps its trailing whitespace
        self._text, self._opened, self._space, self._after_call = "", None, "", False
        return events


def read_tool_calls(text: str, fmt: ToolFormat | None, rules: CallRules = CallRules()) -> ToolCalls:
    """A whole reply read for tool calls in ``fmt`` (None: it is all content), as
    :class:`ToolCallReader` reads it piece by piece."""
    if fmt is None:
        return ToolCalls(text)
    reader = ToolCallReader(fmt, rules)
    content = split_events(reader.feed(text) + reader.close())[0]
    return ToolCalls(None if rules.calls_only or (reader.calls and not content) else content, reader.calls)


def parse_tool_calls(text: str, tokenizer) -> ToolCalls:
    """The tool calls in a reply of the model of ``tokenizer``, in the format its chat template
    writes them (:func:`tool_format`); for the Python API, where the prompt was rendered with
    ``tokenizer.apply_chat_template(messages, tools=tools, tokenize=False)``."""
    if not isinstance(text, str):
        raise TypeError(f"parse_tool_calls reads a reply's text (out.text), not {type(text).__name__}")
    return read_tool_calls(text, tool_format(tools_template(tokenizer)))
