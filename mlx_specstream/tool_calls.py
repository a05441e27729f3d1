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
before a call and text after it: ``a <call> b`` reads ``a b``). A call that cannot be read
(not JSON, no name, cut short by ``max_tokens``) stays in the content as the model wrote it, so
nothing the model wrote is lost.

Example (hermes)::

    >>> read_tool_calls('Let me look.\\n<tool_call>\\n{"name": "weather", "arguments": '
    ...                 '{"city": "Paris"}}\\n</tool_call>', HERMES)
    ToolCalls(content='Let me look.', calls=[{'id': 'call_…', 'type': 'function',
              'function': {'name': 'weather', 'arguments': '{"city": "Paris"}'}}])
"""

from __future__ import annotations

import json
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
    None where each is ``{"type": "function", "function": {"name": ..., "parameters": {...}}}``."""
    if not isinstance(tools, list):
        return "tools", "a list of tool definitions"
    for i, t in enumerate(tools):
        f = t.get("function") if isinstance(t, dict) else None
        if not (isinstance(t, dict) and t.get("type") == "function" and isinstance(f, dict)
                and isinstance(f.get("name"), str) and f["name"]
                and isinstance(f.get("parameters", {}), dict)):
            return f"tools[{i}]", '{"type": "function", "function": {"name": ..., "parameters": {...}}}'
    return None


def tool_format(chat_template: str | None) -> ToolFormat | None:
    """The format a chat template writes tool calls in: the first of :data:`FORMATS` whose mark
    it holds (None: it writes none this module reads)."""
    for fmt in FORMATS:
        if chat_template and fmt.mark in chat_template:
            return fmt
    return None


def _call(obj) -> dict | None:
    """One call object the model wrote (``{"name", "arguments"}``; ``"parameters"`` for the
    arguments, as Llama 3.1's templates write them) as OpenAI's ``tool_calls`` item, whose
    ``arguments`` is JSON text; None where it is not a call."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = _utf8(obj.get("arguments", obj.get("parameters", {})))
    text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": obj["name"], "arguments": text}}


def _utf8(value):
    """``value`` with each lone surrogate (JSON's ``"\\ud800"``, which no UTF-8 text holds) as
    U+FFFD, so that a reply carrying it can be sent."""
    if isinstance(value, str):
        return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    if isinstance(value, list):
        return [_utf8(v) for v in value]
    if isinstance(value, dict):
        return {_utf8(k): _utf8(v) for k, v in value.items()}
    return value


def _calls(body: str, fmt: ToolFormat) -> list[dict] | None:
    """The calls of one block's text (after the start marker, to the end marker or the reply's
    end), or None if it is not calls."""
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
    calls = [_call(o) for o in objs]
    return calls if calls and all(calls) else None


def _json_values(text: str) -> list:
    """The JSON values of ``text``, one after another, apart by whitespace and at most one ``;``
    (ValueError where it is anything else)."""
    decoder, values, i = json.JSONDecoder(), [], 0
    while True:
        i = len(text) - len(text[i:].lstrip())
        if i == len(text):
            return values
        if values and text[i] == ";":
            i = len(text) - len(text[i + 1:].lstrip())
        value, i = decoder.raw_decode(text, i)
        values.append(value)


@dataclass
class ToolCalls:
    """A reply read for tool calls: its ``content`` (None when it is only calls, as OpenAI's)
    and the ``calls``, OpenAI's ``tool_calls`` items."""

    content: str | None
    calls: list[dict] = field(default_factory=list)


class ToolCallReader:
    """Reads a reply for tool calls as its text arrives, for streaming: :meth:`feed` each piece,
    then :meth:`close`; each gives the content that became final and the calls completed.

    Text that could begin the start marker, or is only whitespace, waits until it is known to be
    content; so does a whole reply that begins with ``{`` in a ``bare`` format. ``max_calls``:
    calls after that many are left out (OpenAI's ``parallel_tool_calls: false`` asks for one).
    """

    def __init__(self, fmt: ToolFormat, max_calls: int | None = None):
        self.fmt, self.max_calls = fmt, max_calls
        self.calls: list[dict] = []
        self._text = ""  # outside a call: not yet given out; inside: the call's text so far
        self._opened: str | None = None  # inside a call: the marker that opened it ("" for none)
        self._space = ""  # whitespace given out only if content follows it
        self._given = False  # content has been given out
        self._after_call = False  # a call came last: the whitespace after it is not content

    def _content(self, text: str) -> str:
        if self._after_call:
            text = text.lstrip()
            self._after_call = not text
        text = self._space + text
        body = text.rstrip()
        self._space = text[len(body):]
        self._given = self._given or bool(body)
        return body

    def _called(self, calls: list[dict]) -> list[dict]:
        room = len(calls) if self.max_calls is None else max(0, self.max_calls - len(self.calls))
        self.calls += calls[:room]
        # the whitespace around a call is not content: what came before it goes out only between
        # content before and content after it ("a <call> b" reads "a b")
        self._after_call = True
        self._space = self._space if self._given else ""
        return calls[:room]

    def _open(self) -> str:
        """Outside a call: the content before the next one, entering it where the text so far
        opens one (what could still open one is kept)."""
        if self.fmt.bare and not (self._given or self.calls):  # the reply's beginning
            lead = self._text.lstrip()
            if not lead:
                return ""
            if lead.startswith("{"):
                self._text, self._opened = lead, ""
                return ""
        i = self._text.find(self.fmt.start)
        if i < 0:
            i = len(self._text) - held_back(self._text, [self.fmt.start])
            content, self._text = self._content(self._text[:i]), self._text[i:]
            return content
        content = self._content(self._text[:i])
        self._text, self._opened = self._text[i + len(self.fmt.start):], self.fmt.start
        return content

    def feed(self, text: str) -> tuple[str, list[dict]]:
        """Add a piece of the reply: the content it makes final, and the calls it completes."""
        self._text += text
        content, calls = "", []
        while True:
            if self._opened is None:
                content += self._open()
                if self._opened is None:
                    return content, calls
            j = self._text.find(self.fmt.end) if self.fmt.end else -1
            if j < 0:
                return content, calls
            read = _calls(self._text[:j], self.fmt)
            if read is None:  # not a call: the model's text, as it wrote it
                content += self._content(self._opened + self._text[: j + len(self.fmt.end)])
            else:
                calls += self._called(read)
            self._text, self._opened = self._text[j + len(self.fmt.end):], None

    def close(self) -> tuple[str, list[dict]]:
        """The reply has ended: the content still held, and a last call that ran to the end."""
        content, calls = "", []
        if self._opened is not None:
            read = _calls(self._text, self.fmt)
            if read is None:
                content = self._content(self._opened + self._text)
            else:
                calls = self._called(read)
        elif self._text:
            content = self._content(self._text)
        if not self.calls:
            content += self._space  # no call: the content keeps its trailing whitespace
        self._text, self._opened, self._space, self._after_call = "", None, "", False
        return content, calls


def read_tool_calls(text: str, fmt: ToolFormat | None, max_calls: int | None = None) -> ToolCalls:
    """A whole reply read for tool calls in ``fmt`` (None: it is all content), as
    :class:`ToolCallReader` reads it piece by piece."""
    if fmt is None:
        return ToolCalls(text)
    reader = ToolCallReader(fmt, max_calls)
    content = reader.feed(text)[0] + reader.close()[0]
    return ToolCalls(content if content or not reader.calls else None, reader.calls)


def parse_tool_calls(text: str, tokenizer) -> ToolCalls:
    """The tool calls in a reply of the model of ``tokenizer``, in the format its chat template
    writes them (:func:`tool_format`); for the Python API, where the prompt was rendered with
    ``tokenizer.apply_chat_template(messages, tools=tools, tokenize=False)``."""
    if not isinstance(text, str):
        raise TypeError(f"parse_tool_calls reads a reply's text (out.text), not {type(text).__name__}")
    return read_tool_calls(text, tool_format(getattr(tokenizer, "chat_template", None)))
