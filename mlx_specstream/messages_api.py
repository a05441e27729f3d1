"""Anthropic's Messages API beside OpenAI's on the same server: ``POST /v1/messages``.

A request is read into the OpenAI chat request it stands for (:func:`chat_request`), decoded as
every chat request is (:func:`~mlx_specstream.server.parse`, the scheduler), and answered in
Anthropic's shapes (:class:`MessageReply`)::

    Anthropic                                     OpenAI chat request
    system: "You are ..."                         messages[0] = {role: system, content}
    {role: user, content: [{type: text, ...},     {role: tool, tool_call_id, content} per result,
       {type: tool_result, tool_use_id, ...}]}      then {role: user, content: the text}
    {role: assistant, content: [{type: tool_use,  {role: assistant, content: the text,
       id, name, input}]}                            tool_calls: [{id, function: {name, arguments}}]}
    tools: [{name, description, input_schema}]    tools: [{type: function, function: {name, ..., parameters}}]
    tool_choice {type: auto | none | any}         tool_choice "auto" | "none" | "required"
    tool_choice {type: tool, name}                tool_choice {type: function, function: {name}}
    stop_sequences (up to 4)                      stop

A reply's content is a text block (where there is text) and one ``tool_use`` block per call;
``stop_reason`` is ``end_turn``, ``stop_sequence`` (with the one that ended it), ``max_tokens``
or ``tool_use``. Errors are Anthropic's ``{"type": "error", "error": {"type", "message"}}``.
"""

from __future__ import annotations

import json
import re
import uuid

from .server import MAX_STOP_CHARS, APIError, Reply, read_pass, speculative, sse
from .tool_calls import utf8_safe

# Anthropic's error type for each status this server answers with
ERROR_TYPES = {400: "invalid_request_error", 404: "not_found_error", 405: "invalid_request_error",
               413: "request_too_large", 499: "invalid_request_error", 503: "overloaded_error"}
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def error_body(e: APIError) -> dict:
    return {"type": "error", "error": {"type": ERROR_TYPES.get(e.status, "api_error"), "message": str(e)}}


def _text(content, param: str) -> str:
    """Text given as a string or as a list of ``{"type": "text", "text"}`` blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(b, dict) and b.get("type") == "text"
                                         and isinstance(b.get("text"), str) for b in content):
        return "".join(b["text"] for b in content)
    raise APIError(f"'{param}' must be text: a string or a list of text blocks", param)


def _message(m, i: int) -> list[dict]:
    """One Anthropic message as the OpenAI messages it stands for (tool results first, as
    Anthropic puts them first in a user turn)."""
    at = f"messages[{i}]"
    if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
        raise APIError(f"'{at}' must be an object with a 'role' of 'user' or 'assistant'", "messages")
    content = m.get("content")
    if isinstance(content, str):
        return [{"role": m["role"], "content": content}]
    if not isinstance(content, list):
        raise APIError(f"'{at}.content' must be a string or a list of content blocks", "messages")
    text, calls, results = [], [], []
    for j, b in enumerate(content):
        kind = b.get("type") if isinstance(b, dict) else None
        if kind == "text" and isinstance(b.get("text"), str):
            text.append(b["text"])
        elif kind == "tool_use" and m["role"] == "assistant" and isinstance(b.get("name"), str):
            calls.append({"id": str(b.get("id", "")), "type": "function",
                          "function": {"name": b["name"], "arguments": json.dumps(b.get("input", {}))}})
        elif kind == "tool_result" and m["role"] == "user":
            results.append({"role": "tool", "tool_call_id": str(b.get("tool_use_id", "")),
                            "content": _text(b.get("content", ""), f"{at}.content[{j}].content")})
        elif kind in ("thinking", "redacted_thinking") and m["role"] == "assistant":
            continue  # a reasoning model's earlier thoughts: not this server's models'
        else:
            raise APIError(f"'{at}.content[{j}]': content blocks of type {kind!r} are not supported in "
                           f"{m['role']} messages (text, tool_use, tool_result)", "messages")
    turn = {"role": m["role"], "content": "".join(text)}
    if calls:
        turn["tool_calls"] = calls
    return results + ([turn] if text or calls or not results else [])


def _tools(tools) -> list[dict]:
    if not isinstance(tools, list):
        raise APIError("'tools' must be a list of tools", "tools")
    out = []
    for i, t in enumerate(tools):
        if not (isinstance(t, dict) and t.get("type", "custom") == "custom"
                and isinstance(t.get("name"), str)):
            raise APIError(f"'tools[{i}]' must be a tool of this client: {{\"name\", \"description\", "
                           "\"input_schema\"}} (Anthropic's server tools are not run here)", f"tools[{i}]")
        if not isinstance(t.get("input_schema"), dict):
            raise APIError(f"'tools[{i}].input_schema' is required: a JSON schema of the tool's input",
                           f"tools[{i}].input_schema")
        function = {"name": t["name"], "parameters": t["input_schema"]}
        for key in ("description", "strict"):
            if key in t:
                function[key] = t[key]
        out.append({"type": "function", "function": function})
    return out


# The fields of Anthropic's Messages requests (its client's, 2.14), and this server's own; those
# that would change the reply and are not served here are refused in chat_request
FIELDS = frozenset({"model", "max_tokens", "messages", "system", "stop_sequences", "stream", "temperature",
                    "top_p", "top_k", "tools", "tool_choice", "thinking", "output_config", "metadata",
                    "service_tier", "cache_control", "container", "diagnostics", "inference_geo", "speed",
                    "user_profile_id", "workspace_id", "mode", "sql_names"})


def _output_format(config) -> dict | None:
    """``output_config`` as OpenAI's ``response_format``: its ``format`` (a JSON schema the reply
    follows, as Anthropic's structured outputs guarantee: strict, so a schema keyword that
    decoding cannot enforce is refused); ``effort`` is for reasoning models, none of them here."""
    if not isinstance(config, dict) or set(config) - {"format", "effort"}:
        raise APIError("'output_config' must be an object with 'format' (and 'effort')", "output_config")
    fmt = config.get("format")
    if fmt is None:
        return None
    if not (isinstance(fmt, dict) and fmt.get("type") == "json_schema"
            and isinstance(fmt.get("schema"), dict)):
        raise APIError("'output_config.format' must be {\"type\": \"json_schema\", \"schema\": {...}}",
                       "output_config.format")
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"], "strict": True}}


_TOOL_USE_ID = re.compile(r"[a-zA-Z0-9_-]+")  # Anthropic's tool_use ids


def _check_tool_blocks(messages: list, tools: bool) -> None:
    """Anthropic's rules for ``tool_use`` and ``tool_result`` blocks: they come only in a request
    that defines ``tools``; a ``tool_use``'s id is of letters, digits, ``_`` and ``-``, one per
    message; the message after one with ``tool_use`` blocks answers each with one ``tool_result``
    block (by its id), those blocks first; a ``tool_result`` block answers one of them."""
    asked: list = []  # the tool_use ids of the message before
    for i, m in enumerate([*messages, None]):
        content = m.get("content") if isinstance(m, dict) else None
        blocks = [(j, b) for j, b in enumerate(content if isinstance(content, list) else [])
                  if isinstance(b, dict) and b.get("type") in ("tool_use", "tool_result")]
        if blocks and not tools:
            raise APIError(f"'messages[{i}]': requests which include tool_use or tool_result blocks must "
                           "define tools", "messages")
        answered: set = set()
        for j, b in blocks:
            if b["type"] == "tool_use":
                if not (isinstance(b.get("id"), str) and _TOOL_USE_ID.fullmatch(b["id"])):
                    raise APIError(f"'messages[{i}].content[{j}].id' must match ^[a-zA-Z0-9_-]+$, not "
                                   f"{b.get('id')!r}", "messages")
                if sum(u.get("id") == b["id"] for _, u in blocks if u["type"] == "tool_use") > 1:
                    raise APIError(f"'messages[{i}].content[{j}]': tool_use ids must be unique ({b['id']!r} "
                                   "is used twice)", "messages")
                continue
            if (use := b.get("tool_use_id")) not in asked:
                raise APIError(f"'messages[{i}].content[{j}]': unexpected tool_use_id {use!r} in a "
                               "tool_result block: each tool_result block must have a corresponding "
                               "tool_use block in the previous message", "messages")
            if use in answered:
                raise APIError(f"'messages[{i}].content[{j}]': tool_use_id {use!r} has a tool_result block "
                               "already: each tool_use block has one", "messages")
            if j != len(answered):  # what the message says before its results
                raise APIError(f"'messages[{i}].content[{j}]': tool_result blocks must come first in a "
                               "message's content, before any text", "messages")
            answered.add(use)
        if missing := [a for a in asked if a not in answered]:  # said of the message that asked
            raise APIError(f"'messages[{i - 1}]': tool_use ids were found without tool_result blocks "
                           f"immediately after: {', '.join(map(str, missing))}. Each tool_use block must "
                           "have a corresponding tool_result block in the next message", "messages")
        asked = [b.get("id") for _, b in blocks if b["type"] == "tool_use"]


def chat_request(body: dict) -> dict:
    """The OpenAI chat request an Anthropic Messages request stands for (checks Anthropic's own
    fields; the rest is checked as every chat request is)."""
    for name in ("model", "max_tokens", "messages"):
        if body.get(name) is None:
            raise APIError(f"'{name}' is required", name)
    if unknown := sorted(set(body) - FIELDS):  # as Anthropic's API: extra inputs are not permitted
        raise APIError(f"'{unknown[0]}': extra inputs are not permitted", unknown[0])
    if body.get("container") is not None:
        raise APIError("'container' (code execution) is not supported by this server", "container")
    if not isinstance(body["messages"], list) or not body["messages"]:
        raise APIError("'messages' must be a non-empty list of messages", "messages")
    for i, m in enumerate(body["messages"]):  # Anthropic's rules for empty text
        content = m.get("content") if isinstance(m, dict) else None
        if content in ("", []) and not (i == len(body["messages"]) - 1 and m.get("role") == "assistant"):
            raise APIError(f"'messages[{i}]': all messages must have non-empty content except for the "
                           "optional final assistant message", "messages")
        blocks = content if isinstance(content, list) else []
        if any(isinstance(b, dict) and b.get("type") == "text" and b.get("text") == "" for b in blocks):
            raise APIError(f"'messages[{i}]': text content blocks must be non-empty", "messages")
    _check_tool_blocks(body["messages"], bool(body.get("tools")))
    system = body.get("system")
    system = [] if system is None else [{"role": "system", "content": _text(system, "system")}]
    if system and not system[0]["content"]:
        system = []  # "" or no blocks: no system prompt, as Anthropic reads them
    chat = {"model": body["model"], "max_tokens": body["max_tokens"], "stream": body.get("stream"),
            "messages": system + [t for i, m in enumerate(body["messages"]) for t in _message(m, i)]}
    if len(chat["messages"]) > 1 and chat["messages"][-1] == {"role": "assistant", "content": ""}:
        chat["messages"].pop()  # an empty last assistant turn: no prefill, as Anthropic reads it
    last = chat["messages"][-1]
    if last["role"] == "assistant" and last["content"] and not last.get("tool_calls"):  # a prefill: go on
        if last["content"] != last["content"].rstrip():
            raise APIError("final assistant content cannot end with trailing whitespace", "messages")
        chat["continue_final_message"] = True
    for name in ("temperature", "top_p", "top_k", "mode", "sql_names"):  # the last two: this server's
        if name in body:
            chat[name] = body[name]
    temperature = body.get("temperature")
    if type(temperature) in (int, float) and not 0 <= temperature <= 1:  # Anthropic's range (OpenAI's: 2)
        raise APIError(f"'temperature' must be between 0 and 1, not {temperature}", "temperature")
    stops = body.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or len(stops) > 4 or any(
                not isinstance(s, str) or not 0 < len(s) <= MAX_STOP_CHARS for s in stops):
            raise APIError(f"'stop_sequences' must be a list of up to 4 non-empty strings of at most "
                           f"{MAX_STOP_CHARS} characters", "stop_sequences")
        chat["stop"] = stops or None
    if body.get("tools"):
        chat["tools"] = _tools(body["tools"])
    choice = body.get("tool_choice")
    if choice is not None:
        kind = choice.get("type") if isinstance(choice, dict) else None
        if kind not in ("auto", "none", "any", "tool"):
            raise APIError("'tool_choice' must be {\"type\": \"auto\" | \"none\" | \"any\" | \"tool\"}",
                           "tool_choice")
        chat["tool_choice"] = {"any": "required"}.get(kind, kind)
        if kind == "tool":
            if not isinstance(choice.get("name"), str):
                raise APIError("'tool_choice' of type \"tool\" must name the tool", "tool_choice")
            chat["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
        if choice.get("disable_parallel_tool_use") is True:
            chat["parallel_tool_calls"] = False
    if isinstance(body.get("thinking"), dict) and body["thinking"].get("type") == "enabled":
        raise APIError("'thinking' is not supported by this server", "thinking")
    if body.get("output_config") is not None and (shape := _output_format(body["output_config"])):
        chat["response_format"] = shape
    return chat


# the fields of Messages requests that a count_tokens request may not have (Anthropic's: extra inputs)
NOT_COUNTED = frozenset({"max_tokens", "stream", "temperature", "top_p", "top_k", "stop_sequences",
                         "metadata", "service_tier"})


def count_request(body: dict) -> dict:
    """The chat request whose prompt a ``count_tokens`` request counts (it has no ``max_tokens``,
    nor any other field of decoding)."""
    if extra := sorted(set(body) & NOT_COUNTED):
        raise APIError(f"'{extra[0]}': extra inputs are not permitted", extra[0])
    return chat_request({**body, "max_tokens": 1})


def _tool_use(call_id: str, name: str, args: str) -> dict:
    """An OpenAI tool call (its id, name and arguments' text) as Anthropic's ``tool_use`` block,
    its input an object: :func:`_complete_members` of the arguments."""
    return {"type": "tool_use", "id": "toolu_" + call_id.removeprefix("call_"), "name": name,
            "input": utf8_safe(_complete_members(args))}


_NUMBER = "0123456789.eE+-"  # what a JSON number is written with


def _complete_members(text: str) -> dict:
    """The object ``text`` writes, or, where it is cut off (``max_tokens``, a stop sequence), the
    object as far as its complete members go: what Anthropic's SDK reads from the same text streamed
    as ``input_json_delta`` pieces, so that a whole reply says what a stream does. ``{}`` where the
    text begins no object.

    Example: ``{"city": "Paris", "unit": "ce`` -> ``{"city": "Paris"}``; ``{"city": "Pa`` -> ``{}``.
    """
    closers, in_string, escaped, ends = [], False, False, []  # ends: (where a candidate ends, its closers)
    for i, ch in enumerate(text):
        if in_string:
            escaped, in_string = not escaped and ch == "\\", escaped or ch != '"'
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            closers.append("}" if ch == "{" else "]")
        elif ch in "}]" and closers:
            closers.pop()
        if not in_string and not (ch in _NUMBER and text[i + 1: i + 2] in tuple(_NUMBER)):  # not in a number
            ends.append((i + 1, "".join(reversed(closers))))
    for end, close in reversed(ends):  # the longest that reads, most often at once
        try:
            value = json.loads(text[:end] + close)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return {}


class MessageReply(Reply):
    """Builds Anthropic's message (whole, or as its stream of events) from a generation."""

    request = staticmethod(chat_request)

    def __init__(self, gen):
        super().__init__(gen)
        self.id = "msg_" + uuid.uuid4().hex[:24]

    def _message(self, content: list[dict], stop_reason: str | None, stop_sequence: str | None,
                 output_tokens: int) -> dict:
        stats = self.gen.stats
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.gen.model_id,
                "content": content, "stop_reason": stop_reason, "stop_sequence": stop_sequence,
                "usage": {"input_tokens": stats.prompt_tokens, "output_tokens": output_tokens}}

    def _stop(self, finish: str | None, stop_sequence: str | None) -> tuple[str | None, str | None]:
        if stop_sequence is not None:  # in text or in a call (whose input is then cut off)
            return "stop_sequence", stop_sequence
        return STOP_REASONS.get(finish, finish), None

    def whole(self, text: str, finish_reason: str | None, stop_sequence: str | None = None,
              logprobs: dict | None = None) -> dict:
        read, finish = self.read(text, finish_reason)
        blocks = ([{"type": "text", "text": read.content}] if read.content else []) + [
            _tool_use(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in read.calls]
        return {**self._message(blocks, *self._stop(finish, stop_sequence), self.gen.stats.generated_tokens),
                "speculative": speculative(self.gen.stats)}

    async def events(self, passes):
        """Anthropic's stream: ``message_start``; a text block's start, deltas and stop; a
        ``tool_use`` block per call (its input in ``input_json_delta`` pieces as it is written, or
        in one where the call is read whole); ``message_delta`` with the stop reason and usage;
        ``message_stop``."""
        reader, index, text_open, end = self.reader(), 0, False, (None, None)
        try:
            yield sse({"type": "message_start", "message": self._message([], None, None, 0)}, "message_start")
            async for r in passes:
                events, finish = read_pass(reader, r)
                for e in events:  # in the reply's order: a block is stopped before the next starts
                    if isinstance(e, str):
                        if not text_open:
                            yield sse({"type": "content_block_start", "index": index,
                                       "content_block": {"type": "text", "text": ""}}, "content_block_start")
                            text_open = True
                        yield sse({"type": "content_block_delta", "index": index,
                                   "delta": {"type": "text_delta", "text": e}}, "content_block_delta")
                        continue
                    if e.id is not None:  # a call begins: its block
                        if text_open:
                            yield sse({"type": "content_block_stop", "index": index}, "content_block_stop")
                            index, text_open = index + 1, False
                        block = _tool_use(e.id, e.name, e.arguments if e.done else "{}")
                        yield sse({"type": "content_block_start", "index": index,
                                   "content_block": {**block, "input": {}}}, "content_block_start")
                    # a call read whole: its input as Anthropic's (an object); else the text as written
                    piece = json.dumps(block["input"]) if e.id is not None and e.done else e.arguments
                    if piece:
                        yield sse({"type": "content_block_delta", "index": index, "delta": {
                            "type": "input_json_delta", "partial_json": piece}}, "content_block_delta")
                    if e.done:
                        yield sse({"type": "content_block_stop", "index": index}, "content_block_stop")
                        index += 1
                if finish is not None:
                    end = self._stop(finish, r.stop_sequence)
            if text_open:
                yield sse({"type": "content_block_stop", "index": index}, "content_block_stop")
            yield sse({"type": "message_delta", "delta": {"stop_reason": end[0], "stop_sequence": end[1]},
                       "usage": {"output_tokens": self.gen.stats.generated_tokens},
                       "speculative": speculative(self.gen.stats)}, "message_delta")
            yield sse({"type": "message_stop"}, "message_stop")
        except Exception as e:  # after the headers: the error goes into the stream
            yield sse({"type": "error", "error": {"type": "api_error", "message": str(e)}}, "error")

