"""An OpenAI-compatible HTTP server: ``specstream-mlx serve`` (Starlette on uvicorn).

Routes: ``GET /v1/models``, ``GET /health``, ``POST /v1/completions``,
``POST /v1/chat/completions`` (streaming as server-sent events, or not), and Anthropic's
``POST /v1/messages`` (:mod:`~mlx_specstream.messages_api`). A request names the
base model or an adapter by ``model`` (:class:`~mlx_specstream.pool.ModelPool`); its
decoder is built and checked here (a bad request is a 4xx error in OpenAI's shape) and
decoded by the :class:`~mlx_specstream.scheduler.Scheduler` pass by pass among the others.
"""

from __future__ import annotations

import asyncio
import codecs
import json
import logging
import os
import socket
import sys
import time
import uuid
from dataclasses import dataclass

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from .api import StreamResponse, check_text_size, decoder, responses
from .data import DataError, chat_messages
from .engine import Stats
from .errors import ContextLengthError, OptionError
from .json_grammar import SchemaError, json_constraint, response_constraint, strict_constraint
from .pool import ModelPool, UnknownModelError, default_mode
from .scheduler import Job, Scheduler
from .tokenizer import Tokenizer, TokenizerError
from .tool_calls import (
    CallDelta,
    CallRules,
    Event,
    ToolCallReader,
    ToolCalls,
    ToolFormat,
    read_tool_calls,
    split_events,
    tool_format,
    tools_problem,
)
from .tool_choice import forced_calls, forced_names, has_strict

LOOPBACK = ("127.0.0.1", "localhost", "::1")
# Longest stop string taken: each is looked for in every pass's text, on the thread that decodes
# every request (OpenAI's API states no limit).
MAX_STOP_CHARS = 1000


class APIError(Exception):
    """A request the server refuses, rendered as ``{"error": {message, type, param, code}}``."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None,
                 status: int = 400, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.param, self.code, self.kind = status, param, code, kind


def error_response(message: str, status: int, kind: str, param: str | None = None,
                   code: str | None = None, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": code}},
                        status_code=status, headers=headers)


# -- request parsing -------------------------------------------------------------------------
def _field(body: dict, name: str, kinds: tuple[type, ...], default=None, what: str = "", within: str = ""):
    """``body[name]`` checked for type (None and absent give ``default``; bool is not a number);
    ``within``: the object that holds it (``stream_options``), for the error's ``param``."""
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        param = f"{within}.{name}" if within else name
        raise APIError(f"'{param}' must be {what or ' or '.join(k.__name__ for k in kinds)}", param)
    return value


def _number(body: dict, name: str, default: float) -> float:
    """``body[name]``, a number, as a float (an integer too large for one is out of range)."""
    try:
        return float(_field(body, name, (int, float), default))
    except OverflowError:
        raise APIError(f"'{name}' is out of range", name) from None


def _seed(body: dict) -> int | None:
    """The request's seed, any 64-bit signed integer as OpenAI's, as the engine's seed (>= 0,
    one for each); absent: a fresh seed, as OpenAI."""
    seed = _field(body, "seed", (int,), None)
    if seed is not None and seed not in SEEDS:
        raise APIError("'seed' must be a 64-bit signed integer", "seed")
    return None if seed is None else seed % (1 << 64)


def _stop(body: dict) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or len(stop) > 4 or any(
            not isinstance(s, str) or not 0 < len(s) <= MAX_STOP_CHARS for s in stop):
        raise APIError(f"'stop' must be a non-empty string of at most {MAX_STOP_CHARS} characters or a "
                       "list of up to 4 of them", "stop")
    return stop


def _prompt(body: dict) -> str | list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool)
                                                   for t in prompt):
        return prompt
    raise APIError("'prompt' must be a string or a non-empty list of token ids (one prompt per request)",
                   "prompt")


def _check_unicode(body: dict) -> None:
    """Refuse a request any of whose strings (values or keys) UTF-8 cannot carry (a lone
    surrogate, JSON's ``"\\ud800"``), naming the first such field as OpenAI names fields
    (``tools[0].function.description``) and the character's position: no tokenizer, template or
    reply could hold it."""
    todo = [("", body, False)]  # (field, value, whether it is one of the field's keys)
    while todo:
        at, value, key = todo.pop()
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as e:
                where = f"'{at}'" if at else "the request body"
                raise APIError(f"{where} holds {'a key' if key else 'text'} that is not valid Unicode text "
                               f"(a lone surrogate at position {e.start})", at or None) from None
        elif isinstance(value, dict):  # its keys first: a field's name is sound once said
            todo += [(f"{at}.{k}" if at else k, v, False) for k, v in reversed(value.items())
                     if isinstance(v, str | list | dict)]
            todo += [(at, k, True) for k in reversed(value)]
        elif isinstance(value, list):  # (a prompt of token ids: nothing to walk)
            todo += [(f"{at}[{i}]", v, False) for i, v in reversed(list(enumerate(value)))
                     if isinstance(v, str | list | dict)]


def _tools(body: dict, tokenizer) -> tuple[list[dict] | None, ToolFormat | None, tuple[str, ...] | None]:
    """The request's ``tools`` for the template, the format its calls are read in (None, None:
    no tools, or ``tool_choice: "none"``, for which the model is not shown them), and the names of
    the tools a reply must call (:func:`~.tool_choice.forced_names`; None: the model chooses)."""
    tools = body.get("tools")
    _field(body, "parallel_tool_calls", (bool,), None)
    if tools is not None and (problem := tools_problem(tools)):
        raise APIError(f"'{problem[0]}' must be {problem[1]}", problem[0])
    try:
        forced = forced_names(tools, body.get("tool_choice"))
    except ValueError as e:
        raise APIError(str(e).replace("tool_choice", "'tool_choice'", 1), "tool_choice") from None
    choice = body.get("tool_choice")
    for i, t in enumerate(tools or []):  # as OpenAI checks them, whether the model is shown them or not
        f = t["function"]
        needed = f.get("strict") is True or choice != "none" and (  # decoded by its schema
            f["name"] in forced if forced else has_strict(tools))
        _check_parameters(tokenizer, f, f"tools[{i}]", needed)
    if not tools or body.get("tool_choice") == "none":
        return None, None, None
    fmt = tool_format(tokenizer.template_for(tools))
    if fmt is None:
        raise APIError("this model's chat template writes no tool calls this server reads (<tool_call> "
                       "blocks, Mistral's [TOOL_CALLS], Llama 3's JSON)", "tools", "unsupported_parameter")
    return tools, fmt, forced


def _check_parameters(tokenizer, function: dict, param: str, needed: bool) -> None:
    """A tool's ``parameters``: a JSON schema of an object (a function's arguments; its ``type``
    left out or ``"object"``) that is a valid one (:class:`~.json_grammar.SchemaError`: a keyword
    of the wrong kind, a ``$ref`` to nothing), or a 400 on ``param``; where the tool is
    ``strict``, one whose every keyword decoding enforces; where its calls are decoded by it
    (``needed``: forced, or strict tools among them), one this grammar reads."""
    schema = function.get("parameters")
    if schema is None:
        return
    if schema.get("type", "object") not in ("object", ["object"]):
        raise APIError(f"'{param}': a function's parameters must be a JSON schema of type 'object', "
                       f"not {schema['type']!r}", param)
    try:
        if function.get("strict") is True:
            strict_constraint(tokenizer, schema, "a strict tool's parameters")
        else:
            json_constraint(tokenizer, schema)
    except SchemaError as e:
        raise APIError(f"'{param}': {e}", param) from None
    except ValueError as e:
        if needed:
            raise APIError(f"'{param}': {e}", param) from None


def _check_tool_results(messages: list[dict]) -> None:
    """OpenAI's rules for tools' results: an assistant's message with ``tool_calls`` is followed
    by one ``tool`` message for each call (in any order), which names the call it answers
    (``tool_call_id``); a result no call asked for, or a call left without one, is a 400 (a
    template would render a conversation the model never saw)."""
    waiting, at = None, 0  # the calls of messages[at] not answered yet (None: no calls to answer)
    for i, m in enumerate(messages):
        if m["role"] == "assistant":
            _check_calls(m, f"messages[{i}]")
    for i, m in enumerate([*messages, None]):
        if m is not None and m["role"] == "tool":
            call = m.get("tool_call_id")
            if not isinstance(call, str):
                raise APIError(f"'messages[{i}].tool_call_id' must be the id of the call this result "
                               "answers (a string)", f"messages[{i}].tool_call_id")
            if waiting is None:
                raise APIError(f"'messages[{i}]': a 'tool' message must answer a preceding assistant "
                               "message's 'tool_calls'", f"messages[{i}]")
            if call not in waiting:
                raise APIError(f"'messages[{i}].tool_call_id': {call!r} is not a call of messages[{at}] that "
                               f"is still to be answered ({', '.join(map(repr, waiting)) or 'none'})",
                               f"messages[{i}].tool_call_id")
            waiting.remove(call)
            continue
        if waiting:
            raise APIError(f"'messages[{at}]': an assistant message with 'tool_calls' must be followed by "
                           "tool messages responding to each 'tool_call_id' (not answered: "
                           f"{', '.join(map(repr, waiting))})", f"messages[{at}]")
        calls = m.get("tool_calls") if m is not None and m["role"] == "assistant" else None
        waiting, at = ([c.get("id") if isinstance(c, dict) else None for c in calls]
                       if isinstance(calls, list) and calls else None), i


def _check_calls(m: dict, at: str) -> None:
    """OpenAI's rules for an assistant message's calls: ``tool_calls``, where given, a non-empty
    list of calls each with its ``id`` and ``"type": "function"`` (their shape otherwise:
    :func:`~.data.chat_messages`); without calls, a ``content``."""
    calls = m.get("tool_calls")
    if calls is None:
        if m.get("content") is None and m.get("function_call") is None:  # (the legacy call stands for it)
            raise APIError(f"'{at}.content' is required where an assistant message has no 'tool_calls'",
                           f"{at}.content")
        return
    if isinstance(calls, list) and not calls:
        raise APIError(f"'{at}.tool_calls' must not be empty (leave it out where there are no calls)",
                       f"{at}.tool_calls")
    for j, c in enumerate(calls if isinstance(calls, list) else []):
        if not isinstance(c, dict):
            continue
        call = f"{at}.tool_calls[{j}]"
        if not isinstance(c.get("id"), str) or not c["id"]:
            raise APIError(f"'{call}.id' must be the call's id (a string)", f"{call}.id")
        if c.get("type") != "function":
            raise APIError(f"'{call}.type' must be 'function'", f"{call}.type")


def _chat_prompt(body: dict, tokenizer, tools: list[dict] | None = None) -> str:
    """The chat's messages (and ``tools``) as the template renders them (text: its size is
    checked before it is tokenized, with :meth:`~mlx_specstream.tokenizer.Tokenizer.rendered_ids`);
    with ``continue_final_message`` (vLLM's field; Anthropic's prefill) the reply goes on from the
    last message, an assistant's text begun by the client."""
    go_on = _field(body, "continue_final_message", (bool,), False)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise APIError("'messages' must be a non-empty list of {role, content} objects", "messages")
    try:
        flat = chat_messages(messages, "")  # their shape first
    except DataError as e:
        raise APIError(str(e), "messages") from None
    _check_tool_results(messages)
    if not tokenizer.chat_template:
        raise APIError("this model's tokenizer has no chat template: use /v1/completions with a "
                       "plain-text prompt", "messages", "no_chat_template")
    if go_on and (flat[-1]["role"] != "assistant" or flat[-1].get("tool_calls")):
        said = f"is the {flat[-1]['role']}'s" if flat[-1]["role"] != "assistant" else "calls tools"
        raise APIError(f"'continue_final_message' goes on from an assistant's text: the last message {said}",
                       "continue_final_message")
    try:
        return tokenizer.apply_chat_template(flat, add_generation_prompt=not go_on, tokenize=False,
                                             continue_final_message=go_on,
                                             **({"tools": tools} if tools else {}))
    except TokenizerError as e:
        raise APIError(str(e), "messages") from None


def _shape(body: dict, tokenizer, tools, fmt, forced, max_calls, sql_names: bool):
    """The constraint that shapes the reply (None: none): JSON by ``response_format``
    (json_grammar.py), or calls to the tools ``forced`` (tool_choice.py), or where the model
    chooses and a tool is strict, text or calls by the tools' schemas; ``sql_names`` makes its
    own, so it goes with none of them."""
    try:
        shaped = response_constraint(tokenizer, body.get("response_format"))
    except ValueError as e:
        raise APIError(str(e).replace("response_format", "'response_format'", 1), "response_format") from None
    if shaped and tools:
        raise APIError("'response_format' and 'tools' cannot be combined here: one constraint shapes a "
                       "reply, JSON by the schema or calls to the tools (on /v1/messages: 'output_config' "
                       "and 'tools')", "response_format")
    # tool_choice "auto" with a strict tool: text, or calls to the tools by their schemas
    strict = not forced and has_strict(tools)
    if sql_names and (shaped or forced or strict):
        said = ("'response_format'" if shaped else "a forced tool call ('tool_choice')" if forced
                else "a strict tool")
        raise APIError(f"'sql_names' and {said} cannot be combined", "sql_names")
    if body.get("continue_final_message") and (shaped or forced or strict):
        # the constraint would read the reply from its start, not from inside the message it goes on
        raise APIError("a reply that goes on from the last assistant message ('continue_final_message', "
                       "Anthropic's prefill) cannot be combined with a JSON schema ('response_format', "
                       "'output_config'), a forced tool call or a strict tool", "continue_final_message")
    if not (forced or strict):
        return shaped
    try:
        return forced_calls(tokenizer, tools, forced, max_calls, fmt, optional=strict)
    except ValueError as e:
        raise APIError(str(e), "tools") from None


# OpenAI fields that would change the reply, which this server does not do: refused, not ignored
# (a client reading ``logprobs.content`` must not get None). Each maps to whether a value asks for it.
UNSUPPORTED = {
    "echo": lambda v: v not in (None, False),
    "suffix": lambda v: v not in (None, ""),
    "best_of": lambda v: v not in (None, 1),
    "logit_bias": lambda v: bool(v),
    "presence_penalty": lambda v: v not in (None, 0),
    "frequency_penalty": lambda v: v not in (None, 0),
    # mlx-lm's and vLLM's, at its value that changes nothing
    "repetition_penalty": lambda v: v not in (None, 1),
    # replies in other modalities, or with web results
    "modalities": lambda v: v not in (None, ["text"]),
    "audio": lambda v: v is not None,
    "web_search_options": lambda v: v is not None,
    # the deprecated function calling (its successor, tools, is served)
    "functions": lambda v: bool(v),
    "function_call": lambda v: v not in (None, "none", "auto"),
}
SEEDS = range(-(1 << 63), 1 << 63)  # OpenAI's: a 64-bit signed integer
MAX_TOP_LOGPROBS = {True: 20, False: 5}  # OpenAI's, for chat (top_logprobs) and completions (logprobs)


def _logprobs(body: dict, chat: bool) -> int | None:
    """How many likeliest tokens to give beside each token's log-probability (None: no
    log-probabilities): chat's ``logprobs: true`` with ``top_logprobs``, completions' ``logprobs: k``."""
    most = MAX_TOP_LOGPROBS[chat]
    if chat:
        asked = _field(body, "logprobs", (bool,), False)
        k = _field(body, "top_logprobs", (int,), None)
        if k is not None and not asked:
            raise APIError("'top_logprobs' needs 'logprobs': true", "top_logprobs")
        name, k = "top_logprobs", (k or 0) if asked else None
    else:
        if body.get("top_logprobs") not in (None, 0):
            raise APIError("a completion's 'logprobs' says how many likeliest tokens to give (0 to 5); "
                           "'top_logprobs' is chat's", "top_logprobs", "unsupported_parameter")
        name, k = "logprobs", _field(body, "logprobs", (int,), None)
    if k is not None and not 0 <= k <= most:
        raise APIError(f"'{name}' must be between 0 and {most}, not {k}", name)
    return k


@dataclass
class Generation:
    """A validated request: the decoder's responses, and what the reply needs."""

    responses: object
    stats: Stats
    model_id: str
    chat: bool
    stream: bool
    include_usage: bool
    tool_format: ToolFormat | None = None  # the calls' format, where the request gave tools
    call_rules: CallRules = CallRules()  # which calls are read, and whether there is content
    tokenizer: Tokenizer | None = None  # where the request asked for log-probabilities: their tokens' text


def _model(body: dict, pool: ModelPool) -> tuple[str, object, Tokenizer]:
    """The request's model id, the model it names and the tokenizer (errors: :class:`APIError`)."""
    model_id = _field(body, "model", (str,), what="a model id")
    if model_id is None:
        raise APIError("'model' is required", "model")
    try:
        model = pool.get(model_id)
    except UnknownModelError as e:
        raise APIError(str(e), "model", "model_not_found", status=404) from None
    if pool.tokenizer is None:
        raise APIError("the model has no tokenizer files", "model")
    return model_id, model, pool.tokenizer


def chat_prompt_tokens(body: dict, pool: ModelPool) -> int:
    """How many tokens a chat request's prompt holds, rendered as :func:`parse` renders it
    (Anthropic's ``count_tokens``)."""
    _, model, tok = _model(body, pool)
    prompt = _chat_prompt(body, tok, _tools(body, tok)[0])
    _check_size(prompt, model, tok, "messages")
    return len(tok.rendered_ids(prompt))


def _check_size(prompt, model, tok: Tokenizer, field: str) -> None:
    """A text prompt far longer than the context is refused unencoded (:func:`check_text_size`):
    encoding megabytes would hold up every other request."""
    try:
        check_text_size(model, tok, prompt)
    except ContextLengthError as e:
        raise APIError(str(e), field, "context_length_exceeded") from None


def parse(body: dict, pool: ModelPool, chat: bool) -> Generation:
    """Check a request body and build its decoder (errors: :class:`APIError`)."""
    model_id, model, tok = _model(body, pool)
    tools, fmt, forced = _tools(body, tok) if chat else (None, None, None)
    if not chat and body.get("tools"):
        raise APIError("'tools' go to the chat template: use /v1/chat/completions", "tools",
                       "unsupported_parameter")
    prompt = _chat_prompt(body, tok, tools) if chat else _prompt(body)
    if _field(body, "n", (int,), 1) != 1:
        raise APIError("'n' must be 1", "n")
    for name, asks in UNSUPPORTED.items():
        if asks(body.get(name)):
            raise APIError(f"'{name}' is not supported by this server", name, "unsupported_parameter")
    max_key = "max_tokens"
    if chat and body.get("max_completion_tokens") is not None:
        max_key = "max_completion_tokens"  # the newer name
    top_k = _field(body, "top_k", (int,), 0)
    if top_k < -1:
        raise APIError(f"'top_k' must be >= -1 (0 or -1: off), not {top_k}", "top_k")
    options = dict(
        max_tokens=_field(body, max_key, (int,), 256 if chat else 16),
        temperature=_number(body, "temperature", 0.0),  # OpenAI's range: below
        top_p=_number(body, "top_p", 1.0),
        top_k=top_k if top_k != -1 else 0,  # -1: off, as vLLM's
        min_p=_number(body, "min_p", 0.0),
        seed=_seed(body),
        logprobs=_logprobs(body, chat),
        # an extra field: "ss" (where the adapter has streams), "ar" or "lookup"
        mode=_field(body, "mode", (str,), default_mode(model)),
        # an extra field: only the prompt's CREATE TABLE names may be written (sql_names.py)
        sql_names=_field(body, "sql_names", (bool,), False),
    )
    max_calls = 1 if body.get("parallel_tool_calls") is False else None
    options["constraint"] = _shape(body, tok, tools, fmt, forced, max_calls, options["sql_names"])
    names = frozenset(forced or (t["function"]["name"] for t in tools or []))
    rules = CallRules(max_calls, names, calls_only=bool(forced))
    if options["max_tokens"] < 1:  # OpenAI's range: mlx-lm's -1 (no limit) is not in it
        raise APIError(f"'{max_key}' must be >= 1, not {options['max_tokens']}", max_key)
    if not 0 <= options["temperature"] <= 2:
        raise APIError(f"'temperature' must be between 0 and 2, not {options['temperature']}", "temperature")
    stop = _stop(body)
    stream = _field(body, "stream", (bool,), False)
    stream_options = _field(body, "stream_options", (dict,), None)
    if stream_options is not None and not stream:
        raise APIError("'stream_options' is only allowed with 'stream': true", "stream_options")
    usage = _field(stream_options or {}, "include_usage", (bool,), False, within="stream_options")
    limit = getattr(model, "max_positions", None)
    _check_size(prompt, model, tok, "messages" if chat else "prompt")
    try:
        ids = prompt
        if isinstance(prompt, str):  # a chat's rendering as transformers takes it (no BOS but the template's)
            ids = tok.rendered_ids(prompt) if chat else tok.encode(prompt)
        asked = len(ids) + options["max_tokens"]
        if limit and len(ids) < limit and body.get(max_key) is not None and asked > limit:
            # asked for explicitly (the default is cut to the context): OpenAI's 400, not a silent cut
            raise APIError(f"this model's context holds {limit} tokens, but {asked} were asked for "
                           f"({len(ids)} in the prompt, {options['max_tokens']} in '{max_key}')",
                           max_key, "context_length_exceeded")
        dec = decoder(model, tok, ids, batched=True, **options)
    except OptionError as e:  # the field is the first option the message names that a request sets
        param = next((o for o in e.options() if o in options), "model")
        names = {"adapter": "'model': an id with an adapter, GET /v1/models"}  # the request's field
        raise APIError(e.render("http", names), param) from None
    except ContextLengthError as e:  # the prompt alone: no max_tokens would help
        raise APIError(str(e), "messages" if chat else "prompt", "context_length_exceeded") from None
    except ValueError as e:
        raise APIError(str(e), "messages" if chat else "prompt") from None
    # the reply is text, as OpenAI's: control tokens the model writes (a BOS) are not in it, unless
    # they mark tool calls
    skip = fmt is None or not fmt.special(tok)
    return Generation(responses(dec, tok, stop, skip_special_tokens=skip), dec.stats, model_id, chat, stream,
                      usage, fmt, rules, tok if options["logprobs"] is not None else None)


# -- replies ---------------------------------------------------------------------------------
def usage(stats: Stats) -> dict:
    return {"prompt_tokens": stats.prompt_tokens, "completion_tokens": stats.generated_tokens,
            "total_tokens": stats.prompt_tokens + stats.generated_tokens}


def speculative(stats: Stats) -> dict:
    """The extra field every reply carries: how the decoding went (the engine's statistics,
    ``calls`` named ``passes``; JSON's object keys are strings)."""
    d = stats.as_dict()
    return {"passes": d["calls"], "mean_accepted_tokens": d["mean_accepted_tokens"],
            "accepted_length_histogram": {str(k): v for k, v in d["accepted_length_histogram"].items()},
            "prefill_time_s": d["prefill_time_s"], "decode_time_s": d["decode_time_s"]}


class Reply:
    """Builds the OpenAI objects of one generation (whole, or chunk by chunk)."""

    def __init__(self, gen: Generation):
        self.gen = gen
        self.id = ("chatcmpl-" if gen.chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.offsets = TextOffsets(gen.tokenizer)

    def _base(self, kind: str) -> dict:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.gen.model_id}

    def reader(self) -> ToolCallReader | None:
        """What reads the reply's tool calls, where the request gave tools."""
        return self.gen.tool_format and ToolCallReader(self.gen.tool_format, self.gen.call_rules)

    def read(self, text: str, finish_reason: str | None) -> tuple[ToolCalls, str | None]:
        """A whole reply read for tool calls, and its finish reason (:func:`called`)."""
        read = read_tool_calls(text, self.gen.tool_format, self.gen.call_rules)
        return read, called(finish_reason, bool(read.calls))

    def logprobs(self, rs: list[StreamResponse]) -> dict | None:
        """OpenAI's ``logprobs`` of responses ``rs``, the reply's next (None where the request did
        not ask for them): chat's ``content`` list; completions' lists, with ``text_offset``."""
        tok = self.gen.tokenizer
        if tok is None:
            return None
        items = [lp for r in rs for lp in r.logprobs or []]
        if self.gen.chat:
            return {"content": [{**token_text(tok, lp.token), "logprob": lp.logprob,
                                 "top_logprobs": [{**token_text(tok, t), "logprob": v} for t, v in lp.top]}
                                for lp in items], "refusal": None}
        offsets = [o for r in rs for o in self.offsets(r.tokens, r.pieces)]
        tokens = [token_text(tok, lp.token)["token"] for lp in items]
        return {"tokens": tokens, "token_logprobs": [lp.logprob for lp in items],
                # the likeliest and the chosen token, as OpenAI's (up to logprobs + 1 entries)
                "top_logprobs": [{**{token_text(tok, t)["token"]: v for t, v in lp.top}, token: lp.logprob}
                                 for token, lp in zip(tokens, items)],
                "text_offset": offsets}

    def whole(self, text: str, finish_reason: str | None, stop_sequence: str | None = None,
              logprobs: dict | None = None) -> dict:
        """The reply to a request without ``stream``: its whole text, why it ended, the tokens'
        log-probabilities (:meth:`logprobs`)."""
        if self.gen.chat:
            read, finish_reason = self.read(text, finish_reason)
            message = {"role": "assistant", "content": read.content}  # null where it is only calls
            if read.calls:
                message["tool_calls"] = read.calls
            choice = {"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": logprobs}
            out = self._base("chat.completion")
        else:
            choice = {"index": 0, "text": text, "finish_reason": finish_reason, "logprobs": logprobs}
            out = self._base("text_completion")
        stats = self.gen.stats
        return {**out, "choices": [choice], "usage": usage(stats), "speculative": speculative(stats)}

    def chunk(self, text: str | None, finish_reason: str | None, first: bool = False,
              calls: list[dict] | None = None, logprobs: dict | None = None) -> dict:
        """A chunk of the stream: the role (``first``), text, tool calls (each with its ``index``
        in the reply's calls), or the finish reason; the log-probabilities of the tokens that
        came since the last chunk (:meth:`logprobs`)."""
        if self.gen.chat:
            delta = {"role": "assistant", "content": ""} if first else (
                {"content": text} if text is not None else {"tool_calls": calls} if calls else {})
            choice = {"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": logprobs}
            out = {**self._base("chat.completion.chunk"), "choices": [choice]}
        else:
            choice = {"index": 0, "text": text or "", "finish_reason": finish_reason, "logprobs": logprobs}
            out = {**self._base("text_completion"), "choices": [choice]}
        if finish_reason is not None:
            out["speculative"] = speculative(self.gen.stats)
        if self.gen.include_usage:  # OpenAI: null on every chunk but the usage chunk
            out["usage"] = None
        return out

    def usage_chunk(self) -> dict:
        kind = "chat.completion.chunk" if self.gen.chat else "text_completion"
        return {**self._base(kind), "choices": [], "usage": usage(self.gen.stats),
                "speculative": speculative(self.gen.stats)}

    async def events(self, passes):
        """The reply as server-sent events, from the generation's responses pass by pass: the
        content, the tool calls as they are written (:func:`call_item`), the finish reason, the
        usage when asked."""
        reader = self.reader()
        try:
            if self.gen.chat:
                yield sse(self.chunk(None, None, first=True))
            async for r in passes:
                events, finish = read_pass(reader, r)
                text, deltas = split_events(events)
                logprobs = self.logprobs([r]) if r.tokens else None
                if text or logprobs:  # a pass's tokens whose text is held back: their logprobs now
                    shown = text if text or not self.gen.chat else None  # chat: no content, only logprobs
                    yield sse(self.chunk(shown, None, logprobs=logprobs))
                for delta in deltas:
                    if delta.id is not None or delta.arguments:
                        yield sse(self.chunk(None, None, calls=[call_item(delta)]))
                if finish is not None:
                    yield sse(self.chunk(None if self.gen.chat else "", finish))
            if self.gen.include_usage:
                yield sse(self.usage_chunk())
        except Exception as e:  # after the headers: the error goes into the stream
            yield sse({"error": {"message": str(e), "type": "server_error", "param": None, "code": None}})
        yield sse("[DONE]")


def read_pass(reader: ToolCallReader | None, r: StreamResponse) -> tuple[list[Event], str | None]:
    """A pass's content and the pieces of tool calls it writes, in the reply's order, and its
    finish reason (:func:`called`), with ``reader`` reading the calls."""
    if reader is None:
        return [r.text] if r.text else [], r.finish_reason
    events = reader.feed(r.text)
    finish = r.finish_reason
    if finish is not None:
        events, finish = events + reader.close(), called(finish, bool(reader.calls))
    return events, finish


def call_item(delta: CallDelta) -> dict:
    """A piece of a call as OpenAI's streamed ``tool_calls`` item: the first with the call's id,
    type and name, each with the next text of its arguments."""
    if delta.id is None:
        return {"index": delta.index, "function": {"arguments": delta.arguments}}
    return {"index": delta.index, "id": delta.id, "type": "function",
            "function": {"name": delta.name, "arguments": delta.arguments}}


class TextOffsets:
    """Where each token's text begins in a reply (completions' ``text_offset``): after the whole
    characters of the tokens before it. A token's text is its piece of the stream, except where
    the piece is empty and its text comes with a later piece: a token whose bytes end inside a
    character (a byte-level BPE piece ``Ġð``: the space is whole, the character's bytes are not),
    and byte-fallback pieces, which ``tokenizers``' ByteFallback decoder holds until the next piece
    (after ``<0x0A>``, the next token begins one character later); so the bytes of the tokens
    since the last piece are kept, and their whole characters counted.

    Held bytes that are no character's (``<0xC3>`` then ``▁b``) come out as U+FFFD with the next
    piece: a token whose text is whole characters begins where its own text begins in its piece.

    Example: tokens ``<0x0A>``, ``▁▁▁▁return`` with pieces ``""``, ``"\\n    return"`` from
    offset 7 begin at 7 and 8; ``<0xC3>``, ``▁b`` with pieces ``""``, ``"� b"`` at 7 and 8."""

    def __init__(self, tokenizer: Tokenizer | None):
        self.tokenizer, self.at, self.held = tokenizer, 0, b""  # held: byte pieces since the last piece

    def __call__(self, tokens: list[int], pieces: list[str]) -> list[int]:
        """The offsets of the reply's next ``tokens``, whose pieces are ``pieces``."""
        offsets = []
        for token, piece in zip(tokens, pieces):
            units = self.tokenizer.token_units[token] if self.tokenizer is not None and self.held else None
            if isinstance(units, str) and units and piece.endswith(units):  # the held bytes: piece's start
                offsets.append(self.at + len(piece) - len(units))
            else:
                whole = codecs.getincrementaldecoder("utf-8")("replace").decode(self.held)
                offsets.append(self.at + len(whole))
            if piece:
                self.at, self.held = self.at + len(piece), b""
            elif self.tokenizer is not None:
                self.held += self.tokenizer.raw_bytes(token) or b""
        return offsets


def token_text(tokenizer: Tokenizer, token: int) -> dict:
    """A token as OpenAI's logprobs show it: its ``token`` text (``bytes:\\xe2\\x80`` for bytes
    that are part of a character; a control token's own text) and its UTF-8 ``bytes``."""
    units = tokenizer.token_units[token]
    if isinstance(units, tuple):
        raw = bytes(ord(u) if isinstance(u, str) else u for u in units)
        return {"token": "bytes:" + "".join(f"\\x{b:02x}" for b in raw), "bytes": list(raw)}
    text = units or tokenizer.decode([token])
    return {"token": text, "bytes": list(text.encode("utf-8", "surrogatepass"))}


def called(finish_reason: str | None, calls: bool) -> str | None:
    """A reply's finish reason once it is read for tool calls: ``"tool_calls"`` where it called
    tools and was not cut by ``max_tokens``."""
    return "tool_calls" if calls and finish_reason != "length" else finish_reason


def sse(obj: dict | str, event: str | None = None) -> str:
    """One server-sent event (with an ``event:`` line where named, as Anthropic's stream has)."""
    data = f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n"
    return f"event: {event}\n{data}" if event else data


# -- the app ---------------------------------------------------------------------------------
def create_app(pool: ModelPool, scheduler: Scheduler) -> Starlette:
    """The ASGI app over a model pool; the scheduler thread is started and drained with it."""

    def submit(gen: Generation) -> tuple[Job, asyncio.Queue]:
        loop = asyncio.get_running_loop()
        out: asyncio.Queue = asyncio.Queue()

        def emit(response: StreamResponse | None, error: BaseException | None) -> None:
            loop.call_soon_threadsafe(out.put_nowait, (response, error))

        job = Job(gen.responses, emit)
        try:
            scheduler.submit(job)
        except RuntimeError:  # SIGTERM came: in-flight requests finish, new ones are turned away
            raise APIError("the server is shutting down", code="server_shutting_down", status=503,
                           kind="server_error") from None
        return job, out

    async def passes(job: Job, out: asyncio.Queue):
        """The responses of a job as they come; the job is dropped if the caller stops early."""
        try:
            while True:
                response, error = await out.get()
                if error is not None:
                    raise error
                if response is None:
                    return
                yield response
        finally:
            job.cancel()

    async def body_of(request: Request) -> dict:
        try:
            body = json.loads(await request.body())
        except (ValueError, RecursionError) as e:  # not JSON, not UTF-8, nested or numbers too deep
            raise APIError(f"the request body is not valid JSON ({e})") from None
        if not isinstance(body, dict):
            raise APIError("the request body must be a JSON object")
        _check_unicode(body)
        return body

    async def generation(request: Request, chat: bool, kind: type[Reply] | None = None) -> Response:
        """A request decoded and answered: OpenAI's reply, or ``kind``'s (Anthropic's Messages)."""
        body = await body_of(request)
        if kind is not None:
            body = kind.request(body)
        gen = parse(body, pool, chat)
        job, out = submit(gen)
        reply = (kind or Reply)(gen)
        if not gen.stream:
            async def whole() -> Response:
                rs = [r async for r in passes(job, out)]
                last = rs[-1] if rs else None
                return JSONResponse(reply.whole("".join(r.text for r in rs), last and last.finish_reason,
                                                last and last.stop_sequence, reply.logprobs(rs)))

            async def disconnect() -> None:
                while (await request.receive())["type"] != "http.disconnect":
                    pass

            # the client may leave while the request waits or decodes: drop it then, not after
            answer, gone = asyncio.ensure_future(whole()), asyncio.ensure_future(disconnect())
            await asyncio.wait([answer, gone], return_when=asyncio.FIRST_COMPLETED)
            if not answer.done():
                job.cancel()  # nobody to answer: free the slot before its next pass
                answer.cancel()
                return Response(status_code=499)
            gone.cancel()
            return answer.result()

        return StreamingResponse(reply.events(passes(job, out)), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})

    async def completions(request: Request) -> Response:
        return await generation(request, chat=False)

    async def chat_completions(request: Request) -> Response:
        return await generation(request, chat=True)

    async def messages(request: Request) -> Response:
        """Anthropic's Messages API (:mod:`~mlx_specstream.messages_api`; its errors in its shape:
        ``shaped``)."""
        from .messages_api import MessageReply

        return await generation(request, chat=True, kind=MessageReply)

    async def count_tokens(request: Request) -> Response:
        """Anthropic's token count of a Messages request's prompt: ``{"input_tokens": n}``."""
        from .messages_api import count_request

        counted = count_request(await body_of(request))
        return JSONResponse({"input_tokens": chat_prompt_tokens(counted, pool)})

    loaded = int(time.time())  # every model's "created": when this server loaded it
    described = {m["id"]: {"object": "model", "created": loaded, "owned_by": "specstream-mlx", **m}
                 for m in pool.describe()}

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": list(described.values())})

    async def model(request: Request) -> Response:
        model_id = request.path_params["model_id"].removesuffix("/")  # may hold "/" (--name org/tiny)
        if not model_id:  # "/v1/models/": the list
            return await models(request)
        try:
            pool.get(model_id)
        except UnknownModelError as e:
            raise APIError(str(e), "model", "model_not_found", status=404) from None
        return JSONResponse(described[model_id])

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "active": scheduler.active, "waiting": scheduler.waiting})

    def shaped(request: Request, e: APIError, headers: dict | None = None) -> Response:
        """An error in the shape of the API the request's route is (Anthropic's under /v1/messages)."""
        if request.url.path == "/v1/messages" or request.url.path.startswith("/v1/messages/"):
            from .messages_api import error_body

            return JSONResponse(error_body(e), status_code=e.status, headers=headers)
        return error_response(str(e), e.status, e.kind, e.param, e.code, headers)

    async def api_error(request: Request, exc: APIError) -> Response:
        return shaped(request, exc)

    async def http_error(request: Request, exc: HTTPException) -> Response:
        said = f"Invalid URL ({request.method} {request.url.path})" if exc.status_code == 404 else exc.detail
        return shaped(request, APIError(said, status=exc.status_code), exc.headers)  # a 405's Allow

    async def server_error(request: Request, exc: Exception) -> Response:
        return shaped(request, APIError(f"internal error: {exc}", status=500, kind="server_error"))

    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(app):
        scheduler.start()
        yield
        await asyncio.to_thread(scheduler.stop)

    routes = [Route("/v1/models", models), Route("/v1/models/{model_id:path}", model),
              Route("/health", health),
              Route("/v1/completions", completions, methods=["POST"]),
              Route("/v1/chat/completions", chat_completions, methods=["POST"]),
              Route("/v1/messages", messages, methods=["POST"]),
              Route("/v1/messages/count_tokens", count_tokens, methods=["POST"])]
    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={APIError: api_error, HTTPException: http_error,
                                        Exception: server_error})
    app.router.redirect_slashes = False  # a path with a slash more is not found, as OpenAI's (a redirect
    return app                           # would lose a POST's body with most clients)


def serve(model: str, adapters: str | list[str] | None = None, host: str = "127.0.0.1", port: int = 8080,
          max_active: int = 16, name: str | None = None) -> None:
    """Load the base model and adapters once, then serve until SIGINT/SIGTERM (which lets
    in-flight requests finish)."""
    import uvicorn

    if not 0 <= port <= 65535:
        raise OptionError(f"{{port}} must be in 0..65535 (0: any free port), not {port}")
    scheduler = Scheduler(max_active)  # checks it
    sock = listen(host, port)
    port = sock.getsockname()[1]
    pool = ModelPool(model, adapters, name=name)
    app = create_app(pool, scheduler)
    where = f"http://{'[' + host + ']' if ':' in host else host}:{port}/v1"
    print(f"serving {', '.join(pool.models)} on {where}", file=sys.stderr, flush=True)
    if host not in LOOPBACK:
        print(f"warning: --host {host} accepts connections from other machines; the server has no "
              "authentication", file=sys.stderr, flush=True)

    def left() -> str:  # the requests not finished, said
        n = scheduler.active + scheduler.waiting
        return f"{n} request{'s' * (n != 1)}"

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            draining = self.should_exit
            super().handle_exit(sig, frame)
            self._captured_signals.clear()  # in-flight requests drain: then exit 0, not by the signal
            if scheduler.active + scheduler.waiting and not draining:
                print(f"stopping: {left()} to finish first (Ctrl-C again to stop now)", file=sys.stderr,
                      flush=True)
            if self.force_exit:  # the requests' tasks are cancelled: not errors to report
                logging.getLogger("uvicorn.error").setLevel(logging.CRITICAL)

    server = Server(uvicorn.Config(app, log_level="warning", access_log=False))
    server.run(sockets=[sock])
    if server.force_exit:  # a second Ctrl-C: the requests left are dropped, and the thread ended
        dropped = left()
        scheduler.abort(timeout=30)
        print(f"stopped: {dropped} dropped", file=sys.stderr, flush=True)
        sys.stdout.flush()
        # at once: the interpreter's teardown after cancelled tasks can end in MLX's native threads
        # (SIGABRT, "terminate called"), and there is nothing left to write
        os._exit(130)
    print("stopped", file=sys.stderr, flush=True)


def listen(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port``, bound before the server says where it is (a taken
    port is one error line, not a server that starts and dies)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise ValueError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.listen(2048)
    return sock
