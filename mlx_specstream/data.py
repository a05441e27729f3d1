"""Training data for adapters: JSONL files ``train.jsonl`` and ``valid.jsonl`` in one directory.

Each line is one JSON object, in one of these forms:

* ``{"prompt": "...", "completion": "..."}``: the loss covers the completion only. The prompt is
  encoded as at generation time (with BOS), the completion after it without BOS and followed by
  the tokenizer's EOS, so the model learns to stop.
* ``{"text": "..."}``: the loss covers every token after the first (EOS appended).
* ``{"messages": [{"role": ..., "content": ...}, ...]}``, run through the chat template (the
  model needs one): the last message must be the assistant's. Every assistant reply is learned:
  a conversation is one example per reply (:func:`assistant_turns`), as mlx-lm's chat data set
  renders it: the prompt the conversation before it as a chat client sends it, the reply what the
  template adds for it (its spacing and end of turn; :func:`_chat_pair`). ``"tools"`` beside
  ``"messages"`` (or a prompt with the chat template) go to the template, as in mlx-lm.
* Pre-tokenized: ``"prompt"``/``"completion"``/``"text"`` given as lists of token ids are used
  as they are (no BOS or EOS added). Tests and synthetic data use this form.

Other keys (``"meta"``, ...) are ignored. With ``chat_template=True`` a prompt and its completion
become a user message and the assistant's reply, rendered as a ``messages`` row is. Sequences longer
than ``max_seq_len`` are truncated (the completion is cut) or skipped, as asked; how many is
counted in :class:`Dataset` and reported.
"""

from __future__ import annotations

import json
import numbers
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

from .errors import Said
from .project import PROJECT_DATA
from .tool_calls import tools_problem

TRAIN_FILE, VALID_FILE = "train.jsonl", "valid.jsonl"
POLICIES = ("truncate", "skip")


class DataError(ValueError):
    """A data file is missing, empty, or has a malformed line."""


@dataclass
class Example:
    tokens: list[int]
    n_prompt: int  # leading tokens that are context only; targets are tokens[n_prompt:]
    text: bool = False  # a "text" row: no prompt, its first token only before the targets
    line: int | None = None  # the file's line it came from (a conversation's replies share one)
    chat: bool = False  # rendered by the chat template (a conversation, or a prompt as a user turn)

    @property
    def n_targets(self) -> int:
        return len(self.tokens) - self.n_prompt

    @property
    def prompt(self) -> list[int]:
        """What a user would send: the prompt, or a text row's first half."""
        return self.tokens[: max(1, len(self.tokens) // 2) if self.text else self.n_prompt]


@dataclass
class Dataset:
    examples: list[Example]
    path: Path | None = None
    n_lines: int = 0  # lines read from the file
    n_read: int = 0  # examples made of them: one per line, or per assistant reply of a conversation
    n_truncated: int = 0
    n_skipped: int = 0  # too long (policy "skip"), or no target token left
    n_empty: int = 0  # prompt/completion rows whose completion is empty (only EOS to learn)
    notes: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.examples)

    @property
    def n_tokens(self) -> int:
        return sum(len(e.tokens) for e in self.examples)

    @property
    def n_target_tokens(self) -> int:
        return sum(e.n_targets for e in self.examples)

    def summary(self) -> dict:
        return {"path": str(self.path) if self.path else None, "lines": self.n_lines,
                "read": self.n_read, "examples": len(self), "truncated": self.n_truncated,
                "skipped": self.n_skipped, "empty_completions": self.n_empty,
                "tokens": self.n_tokens, "target_tokens": self.n_target_tokens,
                "chat_examples": sum(e.chat for e in self.examples)}


def _is_ids(x) -> bool:
    return isinstance(x, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in x)


def _eos(tokenizer) -> list[int]:
    """The token a completion ends with: the tokenizer's ``eos_token_id`` (its ``eos_token``),
    else the smallest of its EOS ids."""
    named = getattr(tokenizer, "eos_token_id", None)
    ids = list(getattr(tokenizer, "eos_token_ids", None) or [])
    return [int(named)] if named is not None else ([int(min(ids))] if ids else [])


def _encode_pair(tokenizer, prompt: str | list[int], completion: str) -> tuple[list[int], list[int]]:
    """Prompt and completion tokens as decoding meets them: the prompt encoded alone (as a request
    is), the completion as the encoding of both goes on after it, where that begins with the
    prompt's tokens (a tokenizer that marks where a text starts, SentencePiece's "▁", marks the
    prompt's start only), else encoded alone. ``prompt``: text, or a chat template's ids."""
    if not isinstance(prompt, str):
        return prompt, list(tokenizer.encode(completion, add_special_tokens=False))
    p = list(tokenizer.encode(prompt, add_special_tokens=True))
    joint = list(tokenizer.encode(prompt + completion, add_special_tokens=True))
    c = joint[len(p):] if joint[:len(p)] == p else \
        list(tokenizer.encode(completion, add_special_tokens=False))
    return p, c


_TEXT_PARTS = {"text": "text", "refusal": "refusal"}  # a content part's type: the key of its text


def message_text(content, where: str) -> str:
    """A message's content: a string, or OpenAI's list of parts whose texts are joined (as the
    server reads them): ``text`` parts, and an assistant's ``refusal`` parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        keys = [_TEXT_PARTS.get(c.get("type")) if isinstance(c, dict) and isinstance(c.get("type"), str)
                else None for c in content]
        if all(k is not None and isinstance(c.get(k), str) for k, c in zip(keys, content)):
            return "".join(c[k] for k, c in zip(keys, content))
    said = json.dumps(content, ensure_ascii=False, default=repr)
    raise DataError(f"{where}: a message's 'content' must be text (a string or a list of text parts), "
                    f"not {said[:60] + '...' * (len(said) > 60)}")


ROLES = ("system", "developer", "user", "assistant", "tool", "function")  # of OpenAI's chat messages


def chat_messages(messages: list[dict], where: str) -> list[dict]:
    """OpenAI chat messages as the chat template gets them, one rule for training rows and the
    server's requests: each content as text (:func:`message_text`), an assistant's tool-calling
    turn without one as "" (so a template's ``{{ message['content'] }}`` writes no "None" that
    the served model would never see), all of it valid Unicode; a tool call's ``arguments``,
    JSON text in OpenAI's messages, as the object it holds (templates write it with ``tojson``,
    as transformers expects)."""
    out = []
    for i, m in enumerate(messages):
        at = f"{where}: messages[{i}]" if where else f"messages[{i}]"
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise DataError(f"{at} must be an object with a 'role' and a 'content'")
        if m["role"] not in ROLES:  # a template renders another as it happens to (a user's, or nothing)
            raise DataError(f"{at}: 'role' must be one of {', '.join(ROLES)}, not "
                            f"{json.dumps(m['role'], ensure_ascii=False)}")
        text = message_text("" if m.get("content") is None and m.get("role") == "assistant"
                            else m.get("content"), at)
        _check_text(at, content=text)
        out.append({**m, "content": text})
        calls = m.get("tool_calls")
        if calls is not None:
            if not isinstance(calls, list):
                raise DataError(f"{at}.tool_calls must be a list of calls, {CALL_SHAPE}")
            for j, call in enumerate(calls):
                f = call.get("function") if isinstance(call, dict) else None
                if not (isinstance(f, dict) and isinstance(f.get("name"), str) and f["name"]):
                    raise DataError(f"{at}.tool_calls[{j}] must be {CALL_SHAPE}")
            out[-1]["tool_calls"] = [_call_arguments(c) for c in calls]
    return out


CALL_SHAPE = '{"type": "function", "function": {"name": ..., "arguments": ...}}'  # a tool call, as OpenAI's


def _check_calls(messages: list[dict], tools: list | None, where: str) -> None:
    """A training row's calls as the server reads them back: each names one of the row's
    ``tools`` (OpenAI's definitions, checked before; the server reads a call to another name as
    text) with arguments that are a JSON object (or its text), so an adapter learns only calls
    that come back as calls."""
    names = {t["function"]["name"] for t in tools or []}
    for i, m in enumerate(messages):
        for j, call in enumerate(m.get("tool_calls") or []):  # as chat_messages read them
            at = f"{where}: messages[{i}].tool_calls[{j}]"
            f = call["function"]
            if tools is not None and f["name"] not in names:
                raise DataError(f"{at} calls '{f['name']}', which is not one of the row's tools "
                                f"({', '.join(sorted(names))})")
            if not isinstance(f.get("arguments", {}), dict):  # JSON text of an object is decoded
                raise DataError(f"{at}.function.arguments must be a JSON object (or its text), not "
                                f"{json.dumps(f.get('arguments'))[:60]}")


def _call_arguments(call):
    """A tool call with its ``function.arguments`` decoded where they are JSON text of an object."""
    f = call.get("function") if isinstance(call, dict) else None
    if not (isinstance(f, dict) and isinstance(f.get("arguments"), str)):
        return call
    try:
        args = json.loads(f["arguments"])
    except ValueError:
        return call
    return {**call, "function": {**f, "arguments": args}} if isinstance(args, dict) else call


def outside_template(source: str, plain: int) -> Said:
    """The note on ``plain`` text prompts of ``source`` not in the model's chat template, though it
    has one (``train``, ``bench``): a chat client's requests would be in it."""
    return Said(f": the model has a chat template, and {plain} prompts are not in it: {{chat_template}} "
                "wraps each in a user turn, as a chat client's requests are", subject=source)


def has_chat_template(tokenizer) -> bool:
    """Whether ``tokenizer`` renders chat messages (ours: when the model ships a template)."""
    return hasattr(tokenizer, "apply_chat_template") and bool(getattr(tokenizer, "chat_template", True))


def _render(tokenizer, messages: list[dict], where: str, tools: list | None = None,
            reply: bool = False) -> list[int]:
    """The chat template's rendering of ``messages`` (and ``tools``) as token ids (as
    ``transformers`` and mlx-lm tokenize it: no BOS but the template's): the assistant's turn begun
    after them, or with ``reply`` the conversation as it stands, its last reply ended as the
    template ends a turn. A row the template refuses is a DataError."""
    if not has_chat_template(tokenizer):
        from .errors import OptionError

        raise OptionError("{chat_template} needs the model's chat template, and its tokenizer has none: "
                          "drop it")
    import inspect

    from .tokenizer import TokenizerError

    keywords = inspect.signature(tokenizer.apply_chat_template).parameters
    takes = "add_generation_prompt" in keywords or any(k.kind == k.VAR_KEYWORD for k in keywords.values())
    options = {"add_generation_prompt": not reply} if takes else {}  # (mlx-lm's wrapper: through **kwargs)
    if "return_dict" in keywords:  # transformers' own tokenizers: ids, not a BatchEncoding
        options["return_dict"] = False
    if tools is not None:
        options["tools"] = tools
    try:
        out = tokenizer.apply_chat_template(messages, **options)
    except Exception as e:  # any tokenizer's template error is this row's
        said = str(e) if isinstance(e, TokenizerError) else f"chat template: {e}"
        raise DataError(f"{where}: {said}") from None
    if isinstance(out, str):  # a tokenizer whose template gives text: tokenized as transformers does
        out = tokenizer.encode(out, add_special_tokens=False)
    return [int(t) for t in out]


def _chat_pair(tokenizer, messages: list[dict], where: str, tools: list | None = None
               ) -> tuple[list[int], list[int] | None]:
    """Prompt and reply tokens of a conversation ending with the assistant's reply, as mlx-lm
    trains on chat rows: the prompt is the template's rendering of the messages before the reply,
    the assistant's turn begun; the reply, what the whole conversation's rendering adds to it (the
    template's own spacing and end of turn, ``<|im_end|>`` for ChatML). None for the reply where
    that rendering does not begin with the prompt's (a template that rewrites earlier turns) or the
    reply is empty (a prompt given alone): the caller encodes the reply text alone, with EOS."""
    prompt = _render(tokenizer, messages[:-1], where, tools)
    if not messages[-1]["content"] and not messages[-1].get("tool_calls"):
        return prompt, None
    whole = _render(tokenizer, messages, where, tools, reply=True)
    return prompt, whole[len(prompt):] if whole[:len(prompt)] == prompt and len(whole) > len(prompt) else None


def chat_prompt(tokenizer, prompt: str, *, system: str | None = None, tools: list | None = None,
                where: str = "prompt") -> list[int]:
    """A prompt as a chat client sends it: one user turn (after ``system``'s), run through the chat
    template with the assistant's turn begun; what ``--chat-template`` trains on and decodes."""
    return _render(tokenizer, [*system_turn(system), {"role": "user", "content": prompt}], where, tools)


def system_turn(system: str | None) -> list[dict]:
    """The messages a system prompt puts before a user turn: none for None."""
    return [{"role": "system", "content": system}] if system is not None else []


def check_system_prompt(system_prompt, chat_template: bool) -> None:
    """A system prompt is text, and a turn of the chat template: asked for with it."""
    from .errors import OptionError

    if system_prompt is None:
        return
    if not isinstance(system_prompt, str):
        raise OptionError(f"{{system_prompt}} must be text, not {system_prompt!r:.40}")
    if not chat_template:
        raise OptionError("{system_prompt} is a turn of the chat template: give {chat_template} too")


def assistant_turns(row: dict) -> list[dict]:
    """A conversation as one ``messages`` row per assistant reply to learn, each ending with that
    reply: every assistant message whose content is text, not a tool call, and the last message,
    which may be tool calls (checked by :func:`encode_row`): a row ends with the calls to learn.
    Other rows, and malformed ones, come back as they are.

    Example: system, user ``q1``, assistant ``a1``, user ``q2``, assistant ``a2`` -> two rows,
    [system, q1, a1] and [system, q1, a1, q2, a2]: ``a1`` learned after ``q1``, ``a2`` after all
    before it, each prompt what a chat client would send at that point."""
    msgs = row.get("messages") if isinstance(row, dict) else None
    if not (isinstance(msgs, list) and all(isinstance(m, dict) for m in msgs)):
        return [row]
    replies = [i for i, m in enumerate(msgs[:-1]) if m.get("role") == "assistant" and not m.get("tool_calls")
               and isinstance(m.get("content"), (str, list)) and m["content"]]
    return [{**row, "messages": msgs[: i + 1]} for i in replies] + [row]


def encode_row(row: dict, tokenizer, *, chat_template: bool = False, system: str | None = None,
               add_eos: bool = True, where: str = "") -> Example:
    """One JSON object -> an :class:`Example` (raises :class:`DataError` naming ``where``); a
    conversation's last reply (:func:`assistant_turns` gives the others)."""
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}"
                        + (" (a JSONL file holds one object on each line, not a list of them)"
                           if isinstance(row, list) else ""))
    tools = row.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise DataError(f"{where}: 'tools' must be a list of objects (OpenAI's tool definitions)")
    if tools is not None and (problem := tools_problem(tools)):
        raise DataError(f"{where}: '{problem[0]}' must be {problem[1]}")
    templated = "messages" in row or chat_template and isinstance(row.get("prompt"), str)
    if tools is not None and not templated:
        can = isinstance(row.get("prompt"), str)
        raise DataError(f"{where}: 'tools' go to the chat template, which renders messages, and text "
                        "prompts when asked (--chat-template, chat_template=True): "
                        + ("ask for it, or drop them" if can else "drop them from this row"))
    has_pc = "prompt" in row or "completion" in row
    kinds = [k for k, has in (("'messages'", "messages" in row), ("'prompt' and 'completion'", has_pc),
                              ("'text'", "text" in row)) if has]
    if len(kinds) > 1:  # which one the row means is not for the reader to guess
        said = "not both" if len(kinds) == 2 else "only one"
        raise DataError(f"{where}: give {' or '.join(kinds)}, {said}")
    if has_pc:
        if "prompt" not in row or "completion" not in row:
            have, missing = ("prompt", "completion") if "prompt" in row else ("completion", "prompt")
            raise DataError(f"{where}: has '{have}' but no '{missing}'")
        prompt, completion = row["prompt"], row["completion"]
        if _is_ids(prompt) and _is_ids(completion):
            if not prompt:
                raise DataError(f"{where}: the prompt is empty (it needs at least one token)")
            return Example(list(prompt) + list(completion), len(prompt))
        if not isinstance(prompt, str) or not isinstance(completion, str):
            raise DataError(f"{where}: 'prompt' and 'completion' must both be strings "
                            "(or both lists of token ids)")
        _need_tokenizer(tokenizer, where)
        _check_text(where, prompt=prompt, completion=completion)
        if chat_template:  # one user turn (after the system's) and the assistant's reply
            turns = [*system_turn(system), {"role": "user", "content": prompt},
                     {"role": "assistant", "content": completion}]
            return _chat_example(tokenizer, turns, where, tools, add_eos)
        p, c = _encode_pair(tokenizer, prompt, completion)
        if not p:
            raise DataError(f"{where}: the prompt encodes to no tokens")
        return Example(p + c + (_eos(tokenizer) if add_eos else []), len(p))
    if "messages" in row:
        msgs = row["messages"]  # rendered by the chat template, with or without --chat-template
        if (not isinstance(msgs, list) or len(msgs) < 2 or not all(isinstance(m, dict) for m in msgs)
                or msgs[-1].get("role") != "assistant"):
            raise DataError(f"{where}: 'messages' must be a list ending with an assistant message")
        _need_tokenizer(tokenizer, where)
        if not has_chat_template(tokenizer):
            raise DataError(f"{where}: 'messages' rows need the model's chat template, and its tokenizer "
                            "has none: give prompt/completion rows")
        if not msgs[-1].get("tool_calls"):  # the reply to learn: text, or tool calls
            message_text(msgs[-1].get("content"), where)
        flat = chat_messages(msgs, where)
        _check_calls(flat, tools, where)
        return _chat_example(tokenizer, flat, where, tools, add_eos)
    if "text" in row:
        text = row["text"]
        if _is_ids(text):
            return Example(list(text), 1, text=True)
        if not isinstance(text, str):
            raise DataError(f"{where}: 'text' must be a string (or a list of token ids)")
        _need_tokenizer(tokenizer, where)
        _check_text(where, text=text)
        ids = list(tokenizer.encode(text, add_special_tokens=True)) + (_eos(tokenizer) if add_eos else [])
        return Example(ids, 1, text=True)
    keys = ", ".join(sorted(row)) or "none"
    raise DataError(f"{where}: expected keys 'prompt' and 'completion', 'messages', or 'text' "
                    f"(found: {keys})")


def _chat_example(tokenizer, messages: list[dict], where: str, tools: list | None, add_eos: bool) -> Example:
    """A conversation ending with the assistant's reply as an :class:`Example` (:func:`_chat_pair`):
    the reply as the template ends it, or its text alone; EOS after it (``add_eos``) unless the
    template's end of turn is one of the model's EOS tokens (ChatML's ``<|im_end|>`` where the model
    stops at it), so decoding learns to stop whatever the template."""
    p, c = _chat_pair(tokenizer, messages, where, tools)
    if not p:
        raise DataError(f"{where}: the chat template renders no prompt before the reply")
    calls = messages[-1].get("tool_calls")
    if calls and (c is None or not _writes_calls(tokenizer, c, calls)):  # no text stands in for them
        raise DataError(f"{where}: the chat template writes no reply for the tool calls this row ends with "
                        "(it renders no 'tool_calls', or rewrites the turns before them)")
    if c is None:
        c = list(tokenizer.encode(messages[-1]["content"], add_special_tokens=False))
    # the end of turn: the last two tokens (ChatML's "<|im_end|>\n"), not an EOS the reply's text holds
    if add_eos and not set(c[-2:]) & set(getattr(tokenizer, "eos_token_ids", None) or _eos(tokenizer)):
        c += _eos(tokenizer)
    return Example(p + c, len(p), chat=True)


def _writes_calls(tokenizer, reply: list[int], calls: list) -> bool:
    """Whether a reply's tokens name every function of ``calls`` (the template wrote them)."""
    text = tokenizer.decode(reply)
    return all(isinstance(c, dict) and isinstance(c.get("function"), dict)
               and str(c["function"].get("name")) in text for c in calls)


def _check_text(where: str, **texts: str) -> None:
    """Text a tokenizer can read: no lone surrogate (``"\\ud800"`` in JSON)."""
    for key, text in texts.items():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise DataError(f"{where}: '{key}' is not valid Unicode text (a lone surrogate "
                            f"{text[e.start]!r} at character {e.start + 1})") from None


def _need_tokenizer(tokenizer, where: str) -> None:
    if tokenizer is None:
        raise DataError(f"{where}: text data needs a tokenizer (the model has none); "
                        "give token ids instead")


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """A JSON object whose keys are all different (json.loads would keep the last silently)."""
    out = dict(pairs)
    if len(out) < len(pairs):
        raise _DuplicateKey(next(k for i, (k, _) in enumerate(pairs) if k in dict(pairs[:i])))
    return out


def read_jsonl(path: Path) -> list[tuple[int, dict]]:
    """(line number, object) of every non-blank line; bad JSON is an error naming the line."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    rows = []
    # Lines end at "\n" only: a stray "\r" inside a line is the JSON error it is (at its column),
    # not a line break that shifts every line number after it.
    for n, raw in enumerate(path.read_bytes().removeprefix(b"\xef\xbb\xbf").split(b"\n"), 1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise DataError(f"{path}:{n}: not UTF-8 text ({e.reason} at byte {e.start + 1})") from None
        if not line.strip():
            continue
        try:
            rows.append((n, json.loads(line, object_pairs_hook=_unique_keys)))
        except _DuplicateKey as e:
            raise DataError(f"{path}:{n}: the key {e.args[0]!r} is given twice") from None
        except json.JSONDecodeError as e:
            what = e.msg.removesuffix(" at").removesuffix(": line 1")
            near = line[max(0, e.pos - 12): e.pos + 12]
            cut = e.pos >= len(line.rstrip())  # the value goes on past the line: JSON written over many
            hint = "; a JSONL file holds one whole JSON object on each line" if cut else ""
            raise DataError(f"{path}:{n}: invalid JSON at column {e.colno}: {what} (near {near!r}){hint}") \
                from None
    if not rows:
        raise DataError(f"{path}: empty file (no examples)")
    return rows


def check_ids(tokens: list[int], vocab_size: int | None, where: str) -> None:
    """Token ids within the model's vocabulary (``where``: the row, said in the error)."""
    if vocab_size is not None and tokens and not 0 <= min(tokens) <= max(tokens) < vocab_size:
        raise DataError(f"{where}: token id out of range for a vocabulary of {vocab_size}")


def check_dataset(ds: Dataset, where: str, vocab_size: int | None, max_seq_len: int) -> None:
    """Refuse a :class:`Dataset` made in Python (``train(model, (train, valid))``) where reading a
    file would have refused or cut it: no examples, a token id outside the vocabulary, a prompt
    longer than the example, or more than ``max_seq_len`` tokens (a file's examples are cut or skipped by its
    length policy; these are trained on as given)."""
    if not ds.examples:
        raise DataError(f"{where}: no examples")
    for i, ex in enumerate(ds.examples):
        at = f"{where}: example {i}"
        if not ex.tokens:
            raise DataError(f"{at}: no tokens")
        if not all(isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in ex.tokens):
            raise DataError(f"{at}: tokens must be whole-number token ids")
        check_ids(ex.tokens, vocab_size, at)
        if not 0 <= ex.n_prompt <= len(ex.tokens):
            raise DataError(f"{at}: n_prompt is {ex.n_prompt}, outside its {len(ex.tokens)} tokens")
        if len(ex.tokens) > max_seq_len:
            raise DataError(f"{at}: {len(ex.tokens)} tokens, more than max_seq_len={max_seq_len} (cut it, or "
                            "give a larger max_seq_len)")


def load_jsonl(path: str | Path, tokenizer=None, **options) -> Dataset:
    """Read and encode one JSONL file (:func:`encode_rows`, its rows named by line). ``options``:
    :func:`encode_rows`' ``max_seq_len``, ``policy``, ``chat_template``, ``system``, ``add_eos``,
    ``vocab_size``, ``progress``."""
    path = Path(path)
    return encode_rows(read_jsonl(path), tokenizer, source=path, **options)


def rows_dataset(rows: list[dict], tokenizer=None, *, name: str = "rows", **options) -> Dataset:
    """A :class:`Dataset` of rows given in Python, the objects a JSONL file's lines hold
    (:func:`encode_rows`, whose options it takes, as :func:`load_jsonl`; a bad row said as
    ``NAME[i]``): ``train(model, rows_dataset(rows, tok))``."""
    if not isinstance(rows, list | tuple):
        raise DataError(f"{name}: a list of rows (dicts, as train.jsonl's lines), not {type(rows).__name__}")
    if not rows:
        raise DataError(f"{name}: no rows")
    return encode_rows(list(enumerate(rows)), tokenizer, source=name, **options)


def encode_rows(rows: list[tuple[int, object]], tokenizer, *, source: Path | str,
                max_seq_len: int | None = None,
                policy: str = "truncate", chat_template: bool = False, system: str | None = None,
                add_eos: bool = True, vocab_size: int | None = None, progress: bool = True) -> Dataset:
    """Encode ``(line, row)`` pairs of a JSONL file (``source``, a Path: a row said as
    ``FILE:LINE``) or of a list (its name: ``NAME[i]``), applying the length policy
    (``chat_template``, ``system``: as :func:`encode_row` reads a row); what was cut or skipped is
    counted and said in the set's notes."""
    from .errors import OptionError, verbatim

    if policy not in POLICIES:
        raise OptionError(f"{{length_policy}} must be one of {', '.join(POLICIES)}, "
                          f"not {verbatim(repr(policy))}")
    if max_seq_len is not None and max_seq_len < 2:
        raise OptionError(f"{{max_seq_len}} must be at least 2, not {max_seq_len}")
    file = isinstance(source, Path)
    ds = Dataset([], source if file else None)
    name = source.name if file else source
    no_target = plain = own_turns = 0
    from tqdm import tqdm

    # a bar only when tokenizing takes seconds (30,000 sql rows: ~10 s)
    for n, row in tqdm(rows, desc=f"tokenizing {name}", delay=2, leave=False, file=sys.stderr,
                      disable=not progress):
        where = f"{source}:{n}" if file else f"{source}[{n}]"
        ds.n_lines += 1
        if isinstance(row, dict) and row.get("completion", None) in ("", []):
            ds.n_empty += 1
        plain += isinstance(row, dict) and isinstance(row.get("prompt"), str) and not chat_template
        own_turns += isinstance(row, dict) and "messages" in row
        for one in assistant_turns(row):
            ds.n_read += 1
            ex = replace(encode_row(one, tokenizer, chat_template=chat_template, system=system,
                                    add_eos=add_eos, where=where), line=n)
            check_ids(ex.tokens, vocab_size, where)
            if max_seq_len is not None and len(ex.tokens) > max_seq_len:
                if policy == "skip" or ex.n_prompt >= max_seq_len:
                    ds.n_skipped += 1
                    continue
                ex = replace(ex, tokens=ex.tokens[:max_seq_len])
                ds.n_truncated += 1
            if ex.n_targets < 1:
                no_target += 1
                ds.n_skipped += 1
                continue
            ds.examples.append(ex)
    if plain and tokenizer is not None and has_chat_template(tokenizer):
        ds.notes.append(outside_template(name, plain))
    if system and own_turns:  # a conversation says its own system turn, or has none
        ds.notes.append(Said(f": the system prompt goes before prompt/completion rows only: {own_turns} "
                             "'messages' rows keep their own turns", subject=name))
    if ds.n_truncated:
        ds.notes.append(f"{name}: truncated {ds.n_truncated} of {ds.n_read} examples "
                        f"to {max_seq_len} tokens")
    if ds.n_skipped:
        long = (f"longer than {max_seq_len} tokens" if policy == "skip"  # (truncate cuts the others)
                else f"a prompt of {max_seq_len} tokens or more, no room for its completion")
        why = long if ds.n_skipped > no_target else "nothing to predict"
        if ds.n_skipped > no_target and no_target:
            why += f" ({no_target} with nothing to predict)"
        ds.notes.append(f"{name}: skipped {ds.n_skipped} of {ds.n_read} examples ({why})")
    if not ds.examples:
        raise DataError(f"{source}: no usable examples (all {ds.n_read} skipped: longer than "
                        f"max_seq_len={max_seq_len} or nothing to predict)")
    return ds


def make_project_train_split(data_dir: Path, say=print) -> bool:
    """The project's own data sets (``data/sql``, ``data/code``) ship their valid and test splits;
    their train split is made on first use by ``scripts/make_data.py`` (deterministic, ~20 s;
    checked against ``data/manifest.json``). Returns whether ``data_dir`` was such a set."""
    import hashlib
    import json as _json
    import os
    import subprocess
    import sys
    import tempfile

    manifest = PROJECT_DATA / "manifest.json"
    script = PROJECT_DATA.parent / "scripts" / "make_data.py"
    if data_dir.resolve().parent != PROJECT_DATA or not manifest.is_file() or not script.is_file():
        return False
    rel = f"{data_dir.name}/{TRAIN_FILE}"
    expected = _json.loads(manifest.read_text())["files"].get(rel)
    if expected is None:
        return False
    say(f"{data_dir / TRAIN_FILE} is made, not shipped: making it now with {script.name} (about 20 s)")
    with tempfile.TemporaryDirectory(dir=PROJECT_DATA) as tmp:
        res = subprocess.run([sys.executable, str(script), "--no-pretrain", "--out", tmp],
                             capture_output=True, text=True)
        made = Path(tmp) / rel
        if res.returncode != 0 or not made.is_file():
            raise DataError(f"{script.name} failed: {(res.stderr.strip().splitlines() or ['?'])[-1]}")
        if hashlib.sha256(made.read_bytes()).hexdigest() != expected["sha256"]:
            say(f"note: {rel} differs from the one data/manifest.json records (another Python's "
                "standard library?); training on it all the same")
        os.replace(made, data_dir / TRAIN_FILE)
    return True


def data_directory(data_dir: str | Path) -> Path:
    """``data_dir`` as a Path, or a DataError where it is no directory."""
    data_dir = Path(data_dir)
    if data_dir.is_file():
        raise DataError(f"{data_dir} is a file: give the directory that holds {TRAIN_FILE} "
                        f"(and {VALID_FILE})")
    if not data_dir.is_dir():
        raise DataError(f"{data_dir}: no such data directory")
    return data_dir


def load_datasets(data_dir: str | Path, tokenizer=None, *, require_valid: bool = False,
                  valid: bool = True, say=print, **options) -> tuple[Dataset, Dataset | None]:
    """``train.jsonl`` (required) and ``valid.jsonl`` (optional unless ``require_valid``; not read
    with ``valid=False``); the project's own train splits are made on first use
    (:func:`make_project_train_split`)."""
    data_dir = data_directory(data_dir)
    others = sorted(f.name for f in data_dir.glob("*.json*") if f.name not in (TRAIN_FILE, VALID_FILE))
    if not (data_dir / TRAIN_FILE).is_file() and not make_project_train_split(data_dir, say):
        raise no_file(data_dir, TRAIN_FILE, hint=f" (it holds {', '.join(others)}: the files read are named "
                      f"{TRAIN_FILE} and {VALID_FILE})" if others else "")
    train = load_jsonl(data_dir / TRAIN_FILE, tokenizer, **options)
    if valid and (data_dir / VALID_FILE).is_file():
        return train, load_jsonl(data_dir / VALID_FILE, tokenizer, **options)
    if valid and (named := [n for n in others if n.startswith("val")]):  # (not a test split: it stays unseen)
        say(f"{data_dir}: no {VALID_FILE}; {', '.join(named)} not read (name validation data {VALID_FILE})")
    if require_valid or valid and (data_dir / VALID_FILE).exists():  # a folder of that name is none
        raise no_file(data_dir, VALID_FILE)
    return train, None


def no_file(data_dir: Path, *names: str, hint: str = "") -> DataError:
    """The error of a data directory without the file ``names`` (one of them) asks for; a
    directory of that name is said as what it is, not as missing."""
    there = [data_dir / n for n in names if (data_dir / n).exists()]
    if there:
        what = "a directory" if there[0].is_dir() else "not a regular file"
        return DataError(f"{there[0]} is {what}: {' or '.join(names)} must be a JSONL file")
    return DataError(f"{data_dir}: no {' or '.join(names)}{hint}")
