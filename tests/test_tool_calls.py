"""Tool calling: an adapter trained on tool-call rows writes calls, which the server returns as
OpenAI's ``tool_calls`` (read by the official ``openai`` client) and the Python API reads the same;
the prompts are the template's rendering with the tools, as ``transformers`` renders them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import openai
import pytest
from helpers import Server, drawn_texts

from mlx_specstream import generate, load, parse_tool_calls, train
from mlx_specstream.api import DEFAULT_MODEL
from mlx_specstream.constraint import DONE, TokenConstraint
from mlx_specstream.data import DataError, encode_row
from mlx_specstream.tool_calls import (
    HERMES,
    LLAMA3,
    MISTRAL,
    MISTRAL_ARGS,
    CallRules,
    ToolCallReader,
    ToolCalls,
    read_tool_calls,
    split_events,
    tool_format,
)
from mlx_specstream.tool_choice import forced_calls

# a template in the hermes format (Qwen 2.5's): tools listed before the turns, a call as a
# <tool_call> block with its arguments as JSON
TEMPLATE = ("{% if tools %}### tools:\n{% for t in tools %}{{ t['function'] | tojson }}\n{% endfor %}"
            "{% endif %}{% for m in messages %}### {{ m['role'] }}:\n"
            "{% if m['content'] %}{{ m['content'] }}\n{% endif %}"
            "{% for c in m['tool_calls'] or [] %}<tool_call>{\"name\": \"{{ c['function']['name'] }}\", "
            "\"arguments\": {{ c['function']['arguments'] | tojson }}}</tool_call>\n{% endfor %}{% endfor %}"
            "{% if add_generation_prompt %}### assistant:\n{% endif %}")
TOOLS = [{"type": "function", "function": {"name": "weather", "description": "The weather in a city",
                                           "parameters": {"type": "object",
                                                          "properties": {"city": {"type": "string"}}}}}]
CITIES = ["Paris", "Oslo", "Lima", "Cairo", "Quito", "Perth", "Dakar", "Hanoi"]
# a second tool, which the adapter never saw called, and a question that asks for no tool
TOOLS2 = [*TOOLS, {"type": "function", "function": {"name": "time_in", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}}]
HELLO = [{"role": "user", "content": "Hello, how are you?"}]


def ask(city: str) -> list[dict]:
    return [{"role": "user", "content": f"What is the weather in {city}?"}]


def row(city: str) -> dict:
    """A conversation ending with the call to learn, as an OpenAI client holds it (arguments as text)."""
    call = {"id": "c1", "type": "function",
            "function": {"name": "weather", "arguments": json.dumps({"city": city})}}
    return {"tools": TOOLS,
            "messages": [*ask(city), {"role": "assistant", "content": None, "tool_calls": [call]}]}


CALLS = ('Let me look.\n<tool_call>\n{"name": "weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
         '<tool_call>{"name": "time", "parameters": {"zone": "CET"}}</tool_call>\n')


def functions(calls: list[dict]) -> list[tuple[str, dict]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


def assembled(deltas) -> list[dict]:
    """Streamed pieces of calls put together as a client of OpenAI's stream does: by index, the
    id and name of the first piece, the arguments' pieces joined; each call's last piece is marked."""
    calls = {}
    for d in deltas:
        if d.id is not None:
            assert d.index == len(calls) and d.index not in calls  # a call begins once, in order
            calls[d.index] = {"id": d.id, "type": "function", "function": {"name": d.name, "arguments": ""},
                              "done": False}
        call = calls[d.index]
        assert not call["done"]
        call["function"]["arguments"] += d.arguments
        call["done"] = d.done
    assert all(c.pop("done") for c in calls.values())
    return list(calls.values())


def test_a_reply_read_whole_or_piece_by_piece():
    """Content is the text outside the calls, without the whitespace around them; read in pieces of
    any size it is the same, and text that could begin a marker waits until it cannot."""
    whole = read_tool_calls(CALLS, HERMES)
    assert whole.content == "Let me look."
    assert functions(whole.calls) == [("weather", {"city": "Paris"}), ("time", {"zone": "CET"})]
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in whole.calls)
    for size in range(1, 12):
        reader, content, calls = ToolCallReader(HERMES), [], []
        for i in range(0, len(CALLS), size):
            text, done = split_events(reader.feed(CALLS[i:i + size]))
            content.append(text)
            calls += done
            assert "<" not in "".join(content), size  # no piece of a marker went out as content
        text, done = split_events(reader.close())
        got = assembled(calls + done)
        assert ("".join(content) + text, functions(got)) == ("Let me look.", functions(whole.calls))
        assert got == reader.calls  # the calls given in pieces are the reader's whole calls
        assert [c["function"]["arguments"] for c in got] == ['{"city": "Paris"}', '{"zone": "CET"}']
        # a call's name and the first characters of its arguments come before its block ends
        assert size > 4 or any(d.arguments and not d.done for d in calls)
    # arguments whose strings hold brackets, quotes and backslashes end where their object ends
    tricky = '{"s": "}{\\"]\\\\", "n": [1, {"k": "\\\\"}], "e": {}}'
    text = f'<tool_call>{{"name": "f", "arguments": {tricky}}}</tool_call>'
    assert json.loads(tricky) and read_tool_calls(text, HERMES).calls[0]["function"]["arguments"] == tricky
    for size in range(1, 8):
        assert [c["function"]["arguments"] for c in read_in_pieces(text, HERMES, size)[1]] == [tricky]
    assert read_tool_calls(CALLS, HERMES, CallRules(max_calls=1)).calls[0]["function"]["name"] == "weather"
    assert len(read_tool_calls(CALLS, HERMES, CallRules(max_calls=1)).calls) == 1


def test_what_is_not_a_call_stays_as_the_model_wrote_it():
    for text in ("SELECT 1 < 2  ", "a <tool_ca", "<tool_call>{\"name\": \"weather\", \"argu",
                 "x <tool_call>not json</tool_call> y", "<tool_call>{\"arguments\": {}}</tool_call>"):
        assert read_tool_calls(text, HERMES).content == text and not read_tool_calls(text, HERMES).calls
    assert read_tool_calls(CALLS, None).content == CALLS  # no format: all content
    call = '<tool_call>{"name": "a", "arguments": {"q": "\\ud800"}}</tool_call>'
    for text, content in [(f"{call}\n\nok", "ok"), (f"hi {call}  there", "hi there"),
                          (f"hi\n{call}\n{call}\n", "hi")]:
        assert read_tool_calls(text, HERMES).content == content
        assert read_in_pieces(text, HERMES, 2)[0] == content
    # arguments are the text the model wrote (a lone surrogate stays JSON's escape, which a UTF-8
    # reply can hold); read into a value (Anthropic's input), it is U+FFFD
    assert read_tool_calls(call, HERMES).calls[0]["function"]["arguments"] == '{"q": "\\ud800"}'
    assert read_tool_calls('<tool_call>{"arguments": {"q": "\\ud800"}, "name": "a"}</tool_call>',
                           HERMES).calls[0]["function"]["arguments"] == '{"q": "\ufffd"}'
    # a block cut once its call has begun (name, then arguments) is that call, cut, as a stream
    # gave it; before that it is the model's text
    cut = '<tool_call>{"name": "weather", "arguments": {"city": "Pa'
    for read in (read_tool_calls(cut, HERMES).calls, read_in_pieces(cut, HERMES, 3)[1]):
        assert [(c["function"]["name"], c["function"]["arguments"]) for c in read] == [
            ("weather", '{"city": "Pa')]
    only = read_tool_calls('[TOOL_CALLS] [{"name": "a", "arguments": {"x": 1}}, '
                           '{"name": "b", "arguments": {}}]', MISTRAL)
    assert only.content is None and functions(only.calls) == [("a", {"x": 1}), ("b", {})]


def test_malformed_names_stay_the_models_text_and_a_streamed_name_stays():
    """A block whose name is empty or not a JSON string is the model's text, whole or in pieces
    (no call is begun for it); an object that says "name" twice keeps the name it was streamed with."""
    for text, fmt in [('<tool_call>{"name": "", "arguments": {"x": 1}}</tool_call>', HERMES),
                      ('<tool_call>{"name": "a\\qb", "arguments": {"x": 1}}</tool_call>', HERMES),
                      ('<tool_call>{"name": "a\tb", "arguments": {"x": 1}}</tool_call>', HERMES),
                      ('[TOOL_CALLS][ARGS]{"x": 1}', MISTRAL_ARGS)]:
        assert read_tool_calls(text, fmt) == ToolCalls(text, []), text
        for size in (1, 5, 30):
            assert read_in_pieces(text, fmt, size)[:2] == (text, []), (text, size)
    twice = '<tool_call>{"name": "a", "arguments": {"x": 1}, "name": "b"}</tool_call>'
    assert functions(read_tool_calls(twice, HERMES).calls) == [("a", {"x": 1})]
    assert functions(read_in_pieces(twice, HERMES, 7)[1]) == [("a", {"x": 1})]


def test_events_come_in_the_replys_order():
    """Content after a call that was streamed in part comes after the call's last piece (Anthropic's
    blocks follow the reply's order), and content before a call before its first piece."""
    reader = ToolCallReader(HERMES)
    first = reader.feed('Let me see. <tool_call>{"name": "f", "arguments": {"a": 1')
    assert first[0] == "Let me see." and first[1].id is not None and first[-1].arguments == '{"a": 1'
    events = reader.feed('}}</tool_call> Done.') + reader.close()
    assert [type(e).__name__ for e in events] == ["CallDelta", "str"] and events[0].done
    assert events[1] == " Done."  # "a <call> b" reads "a b"


def read_in_pieces(text: str, fmt, size: int, rules: CallRules = CallRules()) -> tuple[str, list[dict], str]:
    """``text`` fed to a reader ``size`` characters at a time: the content, the calls, and the
    content given out before the reply's last piece was fed."""
    reader, content, calls, early = ToolCallReader(fmt, rules), [], [], ""
    for i in range(0, len(text), size):
        if i + size >= len(text):
            early = "".join(content)
        piece, done = split_events(reader.feed(text[i:i + size]))
        content.append(piece)
        calls += done
    piece, done = split_events(reader.close())
    return "".join(content) + piece, assembled(calls + done), early



def test_long_arguments_stream_in_one_pass_over_their_text():
    """Arguments of 100,000 characters (a file a tool writes) in pieces of 1-7 characters, split
    at random so that pieces end inside escapes and strings, stream as they are read whole, in
    every format; the reader scans each piece once (rescanning the open block per piece took
    45 s here for the first format, reading each piece once well under a second)."""
    import time

    rng = np.random.default_rng(0)
    source = "".join(f'x{i} = f({i}, "\\\\", {{}}["]"]) + "\\"q\\""\n' for i in range(2_500))
    args = json.dumps({"path": "a.py", "text": source, "n": [1, {"k": "]"}]}, ensure_ascii=False)
    assert len(args) > 100_000 and json.loads(args)["text"] == source  # escaped backslashes, quotes
    for fmt, text in ((HERMES, f'<tool_call>{{"name": "write", "arguments": {args}}}</tool_call>'),
                      (MISTRAL_ARGS, f"[TOOL_CALLS]write[ARGS]{args}[TOOL_CALLS]f[ARGS]{{}}"),
                      (MISTRAL, f'[TOOL_CALLS][{{"name": "write", "arguments": {args}}}, '
                                '{"name": "f", "arguments": {}}]')):
        cuts = np.cumsum(rng.integers(1, 8, size=len(text)))
        pieces = [text[a:b] for a, b in zip([0, *cuts], cuts) if a < len(text)]
        reader, events, start = ToolCallReader(fmt), [], time.perf_counter()
        for piece in pieces:
            events += reader.feed(piece)
        events += reader.close()
        seconds = time.perf_counter() - start
        content, deltas = split_events(events)
        assert content == "" and [c["function"]["arguments"] for c in assembled(deltas)][0] == args, fmt.name
        assert sum(bool(d.arguments) for d in deltas) > 1_000, fmt.name  # streamed, not sent whole
        assert seconds < 5, (fmt.name, seconds)

# how the templates of other families write an assistant turn's calls (Llama 3.1's line, one call
# a turn there, joined by "; " here as servers read several; Mistral's v3 and v11 tokenizers')
CALLS_OF = "{% for c in messages[-1]['tool_calls'] %}"
WRITERS = {
    LLAMA3: CALLS_OF + "{% if not loop.first %}; {% endif %}{{ '{\"name\": \"' + c['function']['name']"
                       " + '\", \"parameters\": ' + c['function']['arguments'] | tojson + '}' }}{% endfor %}",
    MISTRAL: "[TOOL_CALLS] [" + CALLS_OF + "{% if not loop.first %}, {% endif %}{{ {'name': c['function']"
             "['name'], 'arguments': c['function']['arguments']} | tojson }}{% endfor %}]",
    MISTRAL_ARGS: CALLS_OF + "{{ '[TOOL_CALLS]' + c['function']['name'] + '[ARGS]' + "
                             "c['function']['arguments'] | tojson }}{% endfor %}",
    HERMES: TEMPLATE[TEMPLATE.index("{% for c in m"):TEMPLATE.index("{% endfor %}{% endfor %}") + 12]
    .replace("m['tool_calls'] or []", "messages[-1]['tool_calls']"),
}


def test_the_format_is_the_one_the_template_writes():
    assert tool_format(TEMPLATE) is HERMES
    assert tool_format("{{ '[TOOL_CALLS]' }}{{ messages }}") is MISTRAL
    for fmt, writer in WRITERS.items():
        assert tool_format(writer) is fmt
    assert tool_format("{{ messages }}") is None and tool_format(None) is None


def test_each_format_reads_back_what_its_template_writes():
    """The oracle is the template: the calls it renders (through ``transformers``) read back as the
    same calls, whole or piece by piece."""
    transformers = pytest.importorskip("transformers")
    ref = transformers.AutoTokenizer.from_pretrained(DEFAULT_MODEL)
    calls = [{"function": {"name": "weather", "arguments": {"city": "São Paulo"}}},
             {"function": {"name": "time", "arguments": {"zone": "CET", "24h": True}}}]
    want = [(c["function"]["name"], c["function"]["arguments"]) for c in calls]
    for fmt, writer in WRITERS.items():
        text = ref.apply_chat_template([{"role": "assistant", "content": "", "tool_calls": calls}],
                                       chat_template=writer, tokenize=False)
        whole = read_tool_calls(text, fmt)
        assert whole.content is None and functions(whole.calls) == want, (fmt.name, text)
        for size in range(1, 12):
            content, got, _ = read_in_pieces(text, fmt, size)
            assert (content, functions(got)) == ("", want), (fmt.name, size)


def test_a_llama3_reply_is_calls_only_when_it_begins_with_one():
    """Llama 3's calls have no marker: a reply that begins with ``{`` (or ``<|python_tag|>``)
    waits until it ends to be read; other text is content as soon as it comes."""
    call = '{"name": "weather", "parameters": {"city": "Oslo"}}'
    for text in (call, f"  \n{call}\n", f"<|python_tag|>{call}"):
        assert functions(read_tool_calls(text, LLAMA3).calls) == [("weather", {"city": "Oslo"})], text
    for text in ("It is sunny.", '{"city": "Oslo"}', f"Sure: {call}", call[:-1], "  \n It is sunny. "):
        assert read_tool_calls(text, LLAMA3).content == text and not read_tool_calls(text, LLAMA3).calls
        content, calls, early = read_in_pieces(text, LLAMA3, 3)
        assert (content, calls) == (text, [])
        assert early == ("" if text.lstrip().startswith("{") else text[:len(early)]) and (
            text.lstrip().startswith("{") or len(early) >= len(text.rstrip()) - 3), (text, early)


# tools whose parameters say what their calls' arguments may be (no other properties: the
# constraint's rule, llama.cpp's too, where a schema does not say)
SCHEMA_TOOLS = [
    {"type": "function", "function": {"name": "weather", "parameters": {
        "type": "object", "required": ["city"], "additionalProperties": False, "properties": {
            "city": {"type": "string"}, "days": {"type": "array", "items": {"type": "number"}}}}}},
    {"type": "function", "function": {"name": "time_in", "parameters": {
        "type": "object", "required": ["zone"], "additionalProperties": False, "properties": {
            "zone": {"enum": ["CET", "UTC"]}, "dst": {"type": "null"}, "x": {"type": "object"},
            "n": {"type": "integer"}, "ok": {"type": "boolean"}, "any": {"description": "any JSON value"}}}}}]


def forced_reads(c, tok, text: str) -> bool:
    """Whether ``text``, tokenized, then EOS, is a reply ``c`` allows."""
    end = c.walk(c.start, tok.encode(text, add_special_tokens=False))
    return end is not None and c.advance(end, tok.eos_token_id) is DONE


def test_a_forced_reply_is_calls_in_the_templates_format_and_nothing_else():
    """Under ``forced_calls`` the calls each family's template writes (rendered by ``transformers``,
    tokenized) are allowed to their end and EOS after them; text before a call, another tool's
    name, EOS inside a call or a call past ``max_calls`` are not. The masks for sampling equal
    the constraint's token-by-token answer (the oracle: :meth:`TokenConstraint.allowed`)."""
    transformers = pytest.importorskip("transformers")
    ref = transformers.AutoTokenizer.from_pretrained(DEFAULT_MODEL)
    _, tok = load(DEFAULT_MODEL)
    eos = tok.eos_token_id
    calls = [{"function": {"name": "weather", "arguments": {"city": "São Paulo", "days": [1, -2.5e3]}}},
             {"function": {"name": "time_in", "arguments": {"zone": "CET", "dst": None, "x": {"a": [{}]},
                                                            "n": -12, "ok": False, "any": [1, "b"]}}}]
    for fmt, writer in WRITERS.items():
        text = ref.apply_chat_template([{"role": "assistant", "content": "", "tool_calls": calls}],
                                       chat_template=writer, tokenize=False)
        ids = tok.encode(text, add_special_tokens=False)
        c = forced_calls(tok, SCHEMA_TOOLS, fmt=fmt)
        assert forced_reads(c, tok, text), (fmt.name, text)
        assert not forced_reads(c, tok, "Sure. " + text)
        assert c.walk(c.start, [*ids[:-3], eos]) is None  # the end of the text inside a call
        assert not forced_reads(forced_calls(tok, SCHEMA_TOOLS, ["time_in"], fmt=fmt), tok, text)  # weather
        assert not forced_reads(forced_calls(tok, SCHEMA_TOOLS, max_calls=1, fmt=fmt), tok, text)  # two calls
        states = [c.walk(c.start, ids[:i]) for i in range(0, len(ids), 7)]
        for state in states:
            assert np.array_equal(c.allowed(state), TokenConstraint.allowed(c, state)), fmt.name


def test_optional_calls_are_text_or_calls_by_the_schemas():
    """``optional`` (tool_choice "auto" with a strict tool): any text, or text and then calls,
    each naming a tool and following its schema; text that only looks like the marker's beginning
    stays text. In Llama 3's format a reply that begins with ``{`` is calls, as the reader reads it.
    The masks for sampling equal the token-by-token answer."""
    _, tok = load(DEFAULT_MODEL)
    c = forced_calls(tok, SCHEMA_TOOLS, fmt=HERMES, optional=True)
    call = '<tool_call>\n{"name": "time_in", "arguments": {"zone": "CET"}}\n</tool_call>'
    for text, ok in [("It is sunny.", True), ("", True), ("a <tool b < c <tool_cal", True),
                     ("Let me see.\n" + call, True), (call + "\n" + call, True),
                     ("Let me see. " + call.replace("time_in", "weathr"), False),
                     (call.replace("CET", "PST"), False), (call + " and more text", False),
                     ("<<tool_call>" + call[len("<tool_call>"):], True)]:
        assert forced_reads(c, tok, text) == ok, text
    for state in (c.start, c.walk(c.start, tok.encode("Let me <tool", add_special_tokens=False))):
        assert (c.allowed(state) == TokenConstraint.allowed(c, state)).all()
    llama = forced_calls(tok, SCHEMA_TOOLS, fmt=LLAMA3, optional=True)
    one = '{"name": "time_in", "parameters": {"zone": "UTC"}}'
    assert forced_reads(llama, tok, " " + one) and forced_reads(llama, tok, "It is late.")
    assert not forced_reads(llama, tok, one.replace("UTC", "X"))
    assert forced_reads(llama, tok, "<|python_tag|>" + one)


def test_forced_arguments_follow_the_tools_schema():
    """Arguments are what each tool's ``parameters`` allow (the oracle: ``jsonschema``, on replies
    the constraint allows and on replies it refuses; test_json_grammar.py has the rules one by
    one); the format's markers never inside a string."""
    jsonschema = pytest.importorskip("jsonschema")
    _, tok = load(DEFAULT_MODEL)
    c = forced_calls(tok, SCHEMA_TOOLS, fmt=HERMES)
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in SCHEMA_TOOLS}

    def call(name, args: str) -> str:
        return f'<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call>'

    cases = [("weather", {"city": "Oslo"}), ("weather", {"days": [1, 2.5], "city": "x"}),  # the rules
             ("weather", {"days": [1]}), ("time_in", {"zone": "PST"}), ("weather", {"city": "x", "extra": 1})]
    for name, args in cases:
        valid = jsonschema.Draft202012Validator(schemas[name]).is_valid(args)
        for indent in (None, 2):
            text = call(name, json.dumps(args, indent=indent, ensure_ascii=False))
            assert forced_reads(c, tok, text) == valid, (text, valid)
    assert forced_reads(c, tok, call("weather", '{"city": "a\\u00e9"}'))
    assert not forced_reads(c, tok, call("weather", '{"city": "a", "city": "b"}'))  # a property twice
    for marker in ("</tool_call>", "<tool_call>"):  # the reader would end the call there
        assert not forced_reads(c, tok, call("weather", json.dumps({"city": f"a{marker}b"})))
    # a tool without parameters, or with none allowed, takes none (OpenAI's rule): {} and no other
    for tool in ({"name": "now"}, {"name": "now", "parameters": {"type": "object", "properties": {},
                                                                 "additionalProperties": False}}):
        none = forced_calls(tok, [{"type": "function", "function": tool}], fmt=HERMES)
        assert forced_reads(none, tok, call("now", "{}"))
        assert not forced_reads(none, tok, call("now", '{"a": 1}'))
        drawn = [tok.decode(ids) for ids, _ in drawn_texts(none, tok, n=4, max_tokens=40, check_masks=False)]
        # (a text may be cut after its first call, by max_tokens: more calls may follow)
        assert {read_tool_calls(t, HERMES).calls[0]["function"]["arguments"] for t in drawn} == {"{}"}
    # parameters as Pydantic writes them ($defs and $ref), read against their own root
    guest = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"],
             "additionalProperties": False}
    book = {"$defs": {"Guest": guest}, "type": "object", "required": ["guests"],
            "properties": {"guests": {"type": "array", "items": {"$ref": "#/$defs/Guest"}, "minItems": 1}},
            "additionalProperties": False}
    tool = {"type": "function", "function": {"name": "book", "parameters": book}}
    booked = forced_calls(tok, [tool], fmt=HERMES)
    for args in ({"guests": [{"name": "Ann"}]}, {"guests": []}, {"guests": [{"nam": "Ann"}]}):
        valid = jsonschema.Draft202012Validator(book).is_valid(args)
        assert forced_reads(booked, tok, call("book", json.dumps(args))) == valid, args
    # the other way: replies drawn at random through the constraint are calls jsonschema accepts
    finished = 0
    for ids, ended in drawn_texts(c, tok):
        if ended:
            finished += 1
            read = read_tool_calls(tok.decode(ids), HERMES)
            assert read.content is None and read.calls, tok.decode(ids)
            for called in read.calls:
                f = called["function"]
                jsonschema.validate(json.loads(f["arguments"]), schemas[f["name"]])
    assert finished >= 8


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """The shipped model with the template above (its files linked) and an adapter trained on
    tool-call rows (shared mode: it learns to write the calls)."""
    d = tmp_path_factory.mktemp("tools") / "specstream-tiny"
    d.mkdir()
    for f in DEFAULT_MODEL.iterdir():
        if f.name != "adapters":
            (d / f.name).symlink_to(f.resolve())
    (d / "chat_template.jinja").write_text(TEMPLATE)
    model, tok = load(d)
    train(model, [row(c) for c in CITIES], mode="shared", iters=40, lr=1e-3, tokenizer=tok, model_path=d,
          out=str(d / "adapters" / "tools"), progress=False, accept_prompts=0)
    return d


def test_rows_render_tools_and_calls_as_transformers_does(model_dir):
    """The oracle: transformers' own tokenizer over the same files, with the tools and the call's
    arguments as objects (what its chat templates take)."""
    transformers = pytest.importorskip("transformers")
    _, tok = load(model_dir)
    ref = transformers.AutoTokenizer.from_pretrained(model_dir)
    ref.chat_template = TEMPLATE
    r = row("Oslo")
    e = encode_row(r, tok)
    objects = [*ask("Oslo"), {**r["messages"][-1], "tool_calls": [
        {"type": "function", "function": {"name": "weather", "arguments": {"city": "Oslo"}}}]}]
    want = ref.apply_chat_template(objects, tools=TOOLS, tokenize=True, return_dict=False)
    prompt = ref.apply_chat_template(ask("Oslo"), tools=TOOLS, add_generation_prompt=True, tokenize=True,
                                     return_dict=False)
    assert e.tokens[: e.n_prompt] == prompt
    assert e.tokens[e.n_prompt:] == want[len(prompt):] + [tok.eos_token_id]  # the call, then EOS
    assert '"arguments": {"city": "Oslo"}' in tok.decode(e.tokens[e.n_prompt:])
    # a template that writes no calls (its turns' text only): nothing to learn
    tok.chat_template = ("{% for m in messages %}### {{ m['role'] }}:\n{{ m['content'] }}\n{% endfor %}"
                         "{% if add_generation_prompt %}### assistant:\n{% endif %}")
    with pytest.raises(DataError, match="x:1: the chat template writes no reply for the tool calls"):
        encode_row(r, tok, where="x:1")


def test_the_trained_adapter_calls_the_tool_through_the_api(model_dir):
    model, tok = load(model_dir, adapter="tools")
    for city in ("Lima", "Berlin"):  # seen in training, and not
        text = generate(model, tok, tok.apply_chat_template(ask(city), tools=TOOLS), max_tokens=40).text
        read = parse_tool_calls(text, tok)
        assert read.content is None and functions(read.calls) == [("weather", {"city": city})], text
    # what a notebook gets wrong is said: the result for its text, a name for a list of them
    with pytest.raises(TypeError, match=r"reads a reply's text \(out.text\), not GenerationResult"):
        parse_tool_calls(generate(model, tok, "x", max_tokens=2), tok)
    assert forced_calls(tok, TOOLS, "weather") is forced_calls(tok, TOOLS, ["weather"])
    with pytest.raises(TypeError, match="forced_calls needs the tokenizer from load()"):
        forced_calls(None, TOOLS)


@pytest.fixture(scope="module")
def server(model_dir):
    pytest.importorskip("openai")
    s = Server("--model", str(model_dir), "--adapters", "tools")
    yield s
    assert s.stop() == 0


def test_the_server_returns_the_calls_whole_and_streamed(server, model_dir):
    """OpenAI's ``tool_calls`` through the official client: the API's reading of the same decoding,
    content null, finish_reason ``tool_calls``; streamed, a call's id and name first, then its
    arguments in pieces as they are written, which a client joins into the same call."""
    model, tok = load(model_dir, adapter="tools")
    client = server.client()
    text = generate(model, tok, tok.apply_chat_template(ask("Berlin"), tools=TOOLS), max_tokens=40).text
    want = functions(parse_tool_calls(text, tok).calls)
    assert want == [("weather", {"city": "Berlin"})]
    r = client.chat.completions.create(model="specstream-tiny:tools", messages=ask("Berlin"), tools=TOOLS,
                                       max_tokens=40)
    message = r.choices[0].message
    assert message.content is None and r.choices[0].finish_reason == "tool_calls"
    assert [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls] == want
    assert r.usage.prompt_tokens == len(tok.apply_chat_template(ask("Berlin"), tools=TOOLS))
    deltas, finish = [], None
    for chunk in client.chat.completions.create(model="specstream-tiny:tools", messages=ask("Berlin"),
                                                tools=TOOLS, max_tokens=40, stream=True):
        delta = chunk.choices[0].delta
        assert not delta.content  # no piece of the call's text as content
        deltas += delta.tool_calls or []
        finish = chunk.choices[0].finish_reason or finish
    assert deltas[0].index == 0 and deltas[0].function.name == "weather" and deltas[0].id.startswith("call_")
    assert len(deltas) > 2
    assert all(d.index == 0 and d.id is None and d.function.name is None for d in deltas[1:])
    joined = "".join(d.function.arguments for d in deltas)
    assert json.loads(joined) == want[0][1] and joined == message.tool_calls[0].function.arguments
    assert finish == "tool_calls"
    # the call and its result sent back: the template gets the arguments as an object
    history = [*ask("Berlin"), message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "12 C, rain"}]
    r = client.chat.completions.create(model="specstream-tiny:tools", messages=history, tools=TOOLS,
                                       max_tokens=8)
    rendered = tok.apply_chat_template([*ask("Berlin"), {"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "weather", "arguments": {"city": "Berlin"}}}]}, history[-1]], tools=TOOLS)
    assert r.usage.prompt_tokens == len(rendered)


STRICT_SEVENS = {"type": "function", "function": {"name": "pick", "strict": True, "parameters": {
    "type": "object", "properties": {"n": {"type": "integer", "multipleOf": 7}}}}}


def tool(name: str, parameters: dict) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


def said_call(*ids: str) -> dict:
    """An assistant's message in a history, calling the weather tool once per id."""
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": i, "type": "function", "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}}
        for i in ids]}


def result(call: str) -> dict:
    return {"role": "tool", "tool_call_id": call, "content": "9 C"}


def test_tool_choice_and_bad_tools(server, model_dir):
    """``tool_choice: "none"``: the model is not shown the tools and its text is the reply; a
    malformed tool or choice is a 400 in OpenAI's shape."""
    _, tok = load(model_dir)
    client = server.client()
    r = client.chat.completions.create(model="specstream-tiny:tools", messages=ask("Berlin"), tools=TOOLS,
                                       tool_choice="none", max_tokens=4)
    assert r.usage.prompt_tokens == len(tok.apply_chat_template(ask("Berlin")))
    assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason == "length"
    body = {"model": "specstream-tiny:tools", "messages": ask("Berlin"), "max_tokens": 4}
    unknown = {"type": "function", "function": {"name": "x"}}
    untyped, no_calls = said_call("c1"), said_call()
    untyped["tool_calls"][0].pop("type")
    for extra, param, code in [({"tool_choice": "required"}, "tool_choice", None),  # no tools
                               ({"tools": TOOLS, "tool_choice": unknown}, "tool_choice", None),
                               ({"tools": TOOLS, "tool_choice": "required", "sql_names": True}, "sql_names",
                                None),
                               ({"tools": TOOLS, "tool_choice": "any"}, "tool_choice", None),
                               ({"tools": TOOLS, "response_format": {"type": "json_object"}},
                                "response_format", None),
                               ({"tools": [{"type": "function", "function": {}}]}, "tools[0]", None),
                               ({"tools": "weather"}, "tools", None),
                               ({"tools": [*TOOLS, *TOOLS]}, "tools", None),  # two of one name
                               ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls", None),
                               # strict (openai.pydantic_function_tool's): only what the grammar enforces
                               ({"tools": [*TOOLS, STRICT_SEVENS]}, "tools[1]", None),
                               # OpenAI checks every tool's schema, whatever tool_choice says
                               ({"tools": [tool("f", {"type": "integer"})]}, "tools[0]", None),
                               ({"tools": [*TOOLS, tool("f", {"type": "object", "properties": {
                                   "x": {"type": "int"}}})]}, "tools[1]", None),
                               ({"tools": [*TOOLS, tool("f", {"properties": {"x": {"minimum": 5, "maximum": 1,
                                                                                   "type": "integer"}}})],
                                 "tool_choice": "none"}, "tools[1]", None),
                               ({"tools": [tool("f", {"properties": {"x": {"$ref": "#/$defs/X"}}})],
                                 "tool_choice": "required"}, "tools[0]", None),
                               # results: each call answered right after it, and only the calls
                               ({"tools": TOOLS, "messages": [*ask("Berlin"), said_call("c1"), result("c2")]},
                                "messages[2].tool_call_id", None),
                               ({"tools": TOOLS, "messages": [*ask("Berlin"), said_call("c1", "c2"),
                                                              result("c2"), *ask("Oslo")]},
                                "messages[1]", None),
                               ({"tools": TOOLS, "messages": [*ask("Berlin"), said_call("c1")]},
                                "messages[1]", None),
                               # an assistant's message: calls, each with its id and type, or content
                               ({"tools": TOOLS, "messages": [*ask("Berlin"), no_calls]},
                                "messages[1].tool_calls", None),
                               ({"tools": TOOLS, "messages": [*ask("Berlin"), untyped, result("c1")]},
                                "messages[1].tool_calls[0].type", None),
                               ({"messages": [*ask("Berlin"), {"role": "assistant", "content": None},
                                              *ask("Oslo")]}, "messages[1].content", None)]:
        status, reply = server.post_raw("/v1/chat/completions", json.dumps({**body, **extra}).encode())
        assert (status, reply["error"]["param"], reply["error"]["code"]) == (400, param, code), reply
    # what is valid but beyond the grammar (bounds past 16 digits) is no 400 unless a call is forced
    big = tool("find", {"properties": {"id": {"type": "integer", "minimum": 1e17}}})
    status, reply = server.post_raw("/v1/chat/completions",
                                    json.dumps({**body, "tools": [*TOOLS, big]}).encode())
    assert status == 200, reply
    status, reply = server.post_raw("/v1/chat/completions", json.dumps(
        {**body, "tools": [big], "tool_choice": "required"}).encode())
    assert (status, reply["error"]["param"]) == (400, "tools[0]") and "16 digits" in reply["error"]["message"]
    typed = tool("find", {"type": ["object"], "properties": {"id": {"type": "integer"}}})  # a list of one
    status, reply = server.post_raw("/v1/chat/completions", json.dumps({**body, "tools": [typed]}).encode())
    assert status == 200, reply
    # a malformed call in the history is named, not a template's error
    history = [*ask("Berlin"), {"role": "assistant", "content": None, "tool_calls": [{"id": "c"}]},
               {"role": "tool", "tool_call_id": "c", "content": "9 C"}]
    status, reply = server.post_raw("/v1/chat/completions",
                                    json.dumps({**body, "messages": history}).encode())
    assert (status, reply["error"]["param"]) == (400, "messages"), reply
    assert reply["error"]["message"].startswith("messages[1].tool_calls[0] must be {"), reply
    assert server.get("/health")["status"] == "ok"


def test_a_forced_call_is_decoded_under_the_constraint(server, model_dir):
    """``tool_choice`` ``"required"`` or a named function: the reply is calls to those tools,
    whatever the question, as the API decodes it with ``forced_calls`` (plain decoding there,
    Speculative Streaming in the server: the same text); whole, streamed, and Anthropic's ``tool``."""
    model, tok = load(model_dir, adapter="tools")
    client = server.client()
    named = {"type": "function", "function": {"name": "time_in"}}
    for messages, choice, names in [(HELLO, "required", ("weather", "time_in")), (HELLO, named, ("time_in",)),
                                    (ask("Berlin"), named, ("time_in",))]:
        prompt = tok.apply_chat_template(messages, tools=TOOLS2)
        text = generate(model, tok, prompt, max_tokens=60, mode="ar",
                        constraint=forced_calls(tok, TOOLS2, names)).text
        want = functions(parse_tool_calls(text, tok).calls)
        assert want and all(name in names and isinstance(args, dict) for name, args in want), text
        r = client.chat.completions.create(model="specstream-tiny:tools", messages=messages, tools=TOOLS2,
                                           tool_choice=choice, max_tokens=60)
        assert r.choices[0].finish_reason == "tool_calls" and r.choices[0].message.content is None
        got = r.choices[0].message.tool_calls
        assert [(c.function.name, json.loads(c.function.arguments)) for c in got] == want
    deltas = [d for chunk in client.chat.completions.create(  # the last request's, streamed
        model="specstream-tiny:tools", messages=ask("Berlin"), tools=TOOLS2, tool_choice=named, max_tokens=60,
        stream=True) for d in chunk.choices[0].delta.tool_calls or []]
    names = {d.index: d.function.name for d in deltas if d.id is not None}
    joined = {i: "".join(d.function.arguments for d in deltas if d.index == i) for i in names}
    assert [(names[i], json.loads(joined[i])) for i in sorted(names)] == want
    _, anthropic = anthropic_client(server)
    r = anthropic.messages.create(model="specstream-tiny:tools", max_tokens=60, messages=ask("Berlin"),
                                  tool_choice={"type": "tool", "name": "time_in"},
                                  tools=[{"name": t["function"]["name"],
                                          "input_schema": t["function"]["parameters"]} for t in TOOLS2])
    assert r.stop_reason == "tool_use" and [(b.name, b.input) for b in r.content] == want
    # tool_choice "auto" with a strict tool: the model chooses, and a call it makes follows the schema
    strict = [{"type": "function", "function": {**TOOLS[0]["function"], "strict": True, "parameters": {
        "type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}}, "required": ["city"],
        "additionalProperties": False}}}]
    prompt = tok.apply_chat_template(ask("Berlin"), tools=strict)
    text = generate(model, tok, prompt, max_tokens=60, mode="ar",
                    constraint=forced_calls(tok, strict, optional=True)).text
    free = generate(model, tok, prompt, max_tokens=60, mode="ar").text
    assert "Berlin" in free and "Berlin" not in text  # the case: unconstrained, the call breaks the enum
    r = client.chat.completions.create(model="specstream-tiny:tools", messages=ask("Berlin"), tools=strict,
                                       max_tokens=60)
    got = [(c.function.name, json.loads(c.function.arguments)) for c in r.choices[0].message.tool_calls]
    assert got == functions(parse_tool_calls(text, tok).calls) and got[0][1]["city"] in ("Paris", "Oslo")
    # cut by max_tokens at every length: never content (the template's markup), whole and streamed
    for n in range(1, 24, 2):
        kw = dict(model="specstream-tiny:tools", messages=ask("Berlin"), tools=TOOLS2, tool_choice="required",
                  max_tokens=n)
        r = client.chat.completions.create(**kw)
        assert r.choices[0].message.content is None and r.choices[0].finish_reason == "length", n
        streamed = client.chat.completions.create(**kw, stream=True)
        assert not [c for c in streamed if c.choices[0].delta.content], n


def test_the_rules_a_request_sets_for_its_calls():
    """A call to a name that is not a tool stays the model's text (whole and streamed); a forced
    reply is calls only: what is around its calls, or a call cut before its arguments, is no content."""
    declared = CallRules(names=frozenset({"weather"}))
    whole = read_tool_calls(CALLS, HERMES, declared)
    assert functions(whole.calls) == [("weather", {"city": "Paris"})]
    assert whole.content == ('Let me look.\n<tool_call>{"name": "time", "parameters": {"zone": "CET"}}'
                             '</tool_call>')
    for size in (1, 3, 7):
        content, calls, _ = read_in_pieces(CALLS, HERMES, size, declared)
        assert (content, functions(calls)) == (whole.content, functions(whole.calls)), size
    # reading stops at the first call to another name: it and what follows are the model's text
    f_only = CallRules(names=frozenset({"f"}))
    for fmt, text, rest in [
            (MISTRAL, '[TOOL_CALLS] [{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": {}}]',
             '{"name": "g", "arguments": {}}]'),
            (MISTRAL_ARGS, '[TOOL_CALLS]f[ARGS]{"a": 1}[TOOL_CALLS]g[ARGS]{}', "[TOOL_CALLS]g[ARGS]{}")]:
        whole = read_tool_calls(text, fmt, f_only)
        assert (whole.content, functions(whole.calls)) == (rest, [("f", {"a": 1})]), fmt.name
        for size in (1, 2, 5, 9):
            content, calls, _ = read_in_pieces(text, fmt, size, f_only)
            assert (content, functions(calls)) == (rest, [("f", {"a": 1})]), (fmt.name, size)
    forced = CallRules(calls_only=True)
    text = 'Sure! {"name": "f", "parameters": {"x": 1}}'  # text first: a Llama 3 reply that is no call
    assert read_tool_calls(text, LLAMA3, forced).calls == [] == read_in_pieces(text, LLAMA3, 6, forced)[1]
    # a call cut inside its arguments, where the end marker had begun: its streamed arguments are
    # the whole read's, never a piece of the marker
    for cut in range(40, 61):
        text = '<tool_call>{"name": "f", "arguments": {"a": tru</tool_call>'[:cut]
        for size in (1, 3, 4):
            streamed, whole = read_in_pieces(text, HERMES, size)[1], read_tool_calls(text, HERMES).calls
            assert [c["function"] for c in streamed] == [c["function"] for c in whole], (cut, size)
    for text in ("\n\n<tool_c", '\n\n<tool_call>\n{"name": "weather", "arguments":', CALLS + "\n<tool_ca"):
        read = read_tool_calls(text, HERMES, forced)
        assert read.content is None and len(read.calls) == 2 * (text.startswith(CALLS)), text
        for size in (1, 4):
            assert read_in_pieces(text, HERMES, size, forced)[0] == ""


def test_generate_renders_the_tools_file(model_dir, tmp_path):
    """``generate --chat-template --tools FILE`` prompts as the API does with ``tools=`` and prints
    the call as the model writes it; a bad file or a missing --chat-template is one line."""
    import subprocess
    import sys

    model, tok = load(model_dir, adapter="tools")
    want = generate(model, tok, tok.apply_chat_template(ask("Lima"), tools=TOOLS), max_tokens=40).text
    files = {"tools": json.dumps({"tools": TOOLS}), "bad": json.dumps([{"type": "function", "function": {}}]),
             "tools2": json.dumps(TOOLS2)}
    for name, text in files.items():
        (tmp_path / f"{name}.json").write_text(text)
    run = [sys.executable, "-m", "mlx_specstream.cli", "generate", "--model", str(model_dir),
           "--adapter", "tools", "-p", ask("Lima")[0]["content"], "--max-tokens", "40"]
    res = subprocess.run([*run, "--chat-template", "--tools", str(tmp_path / "tools.json")],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and res.stdout == want + "\n", res.stderr
    forced = generate(model, tok, tok.apply_chat_template(ask("Lima"), tools=TOOLS2), max_tokens=40,
                      constraint=forced_calls(tok, TOOLS2, ["time_in"])).text
    res = subprocess.run([*run, "--chat-template", "--tools", str(tmp_path / "tools2.json"), "--tool-choice",
                          "time_in"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and res.stdout == forced + "\n", res.stderr
    assert [name for name, _ in functions(parse_tool_calls(forced, tok).calls)] == ["time_in"], forced
    told = generate(model, tok, tok.apply_chat_template(ask("Lima")), max_tokens=40).text  # no tools
    res = subprocess.run([*run, "--chat-template", "--tools", str(tmp_path / "tools.json"), "--tool-choice",
                          "none"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and res.stdout == told + "\n" and told != want, res.stderr
    for extra, said in [(["--tools", "tools.json"], "--tools go to the chat template: give --chat-template"),
                        (["--tool-choice", "required"], "--tool-choice picks among the tools: give --tools"),
                        (["--chat-template", "--tools", "tools.json", "--tool-choice", "nope"],
                         "--tool-choice names the function 'nope', which is not one of the tools (weather)"),
                        (["--chat-template", "--tools", "bad.json"], "bad.json: tools[0] must be"),
                        (["--chat-template", "--tools", "none.json"], "cannot read the tools file")]:
        res = subprocess.run([*run, *extra], capture_output=True, text=True, timeout=300, cwd=tmp_path)
        lines = res.stderr.strip().splitlines()
        assert res.returncode != 0 and len(lines) == 1 and said in lines[0], res.stderr
    strict = [{"type": "function", "function": {**TOOLS[0]["function"], "strict": True, "parameters": {
        "type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}}, "required": ["city"]}}}]
    (tmp_path / "strict.json").write_text(json.dumps(strict))  # as the server decodes "auto" with it
    want = generate(model, tok, tok.apply_chat_template(ask("Lima"), tools=strict), max_tokens=40,
                    constraint=forced_calls(tok, strict, optional=True)).text
    res = subprocess.run([*run, "--chat-template", "--tools", str(tmp_path / "strict.json")],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and res.stdout == want + "\n" and "Lima" not in want, res.stderr
    plain = tmp_path / "plain"  # a chat template that writes no tool calls: the tools would be lost
    plain.mkdir()
    for f in model_dir.iterdir():
        if f.name != "chat_template.jinja":
            (plain / f.name).symlink_to(f.resolve())
    (plain / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    res = subprocess.run([*run[:5], str(plain), *run[6:], "--chat-template", "--tools", "tools.json"],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert res.returncode != 0 and "chat template writes no tool calls" in res.stderr, res.stderr


# -- Anthropic's Messages API, through the official anthropic client ---------------------------
def anthropic_client(server):
    anthropic = pytest.importorskip("anthropic")
    return anthropic, anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0, timeout=120)


def test_messages_api_text_system_and_stop_sequences(server, model_dir):
    """A text reply equals plain decoding of the template's rendering (system turn first), with
    Anthropic's usage and stop reasons; a stop sequence ends the text where it begins."""
    _, client = anthropic_client(server)
    model, tok = load(model_dir)
    system = [{"role": "system", "content": "Answer briefly."}]
    prompt = tok.apply_chat_template(system + ask("Oslo"))
    want = generate(model, tok, prompt, max_tokens=12, mode="ar").text
    r = client.messages.create(model="specstream-tiny", max_tokens=12, system="Answer briefly.",
                               messages=ask("Oslo"))
    assert [b.type for b in r.content] == ["text"] and r.content[0].text == want and r.role == "assistant"
    assert r.stop_reason == "max_tokens" and r.usage.input_tokens == len(prompt)
    assert r.usage.output_tokens == 12 and r.id.startswith("msg_")
    stop = want[4:7]
    r = client.messages.create(model="specstream-tiny", max_tokens=12, system="Answer briefly.",
                               messages=ask("Oslo"), stop_sequences=[stop])
    assert r.content[0].text == want[: want.index(stop)]
    assert (r.stop_reason, r.stop_sequence) == ("stop_sequence", stop)
    with client.messages.stream(model="specstream-tiny", max_tokens=12, system="Answer briefly.",
                                messages=ask("Oslo")) as s:
        streamed = s.get_final_message()
    assert streamed.content[0].text == want and streamed.stop_reason == "max_tokens"
    # top_k 1 leaves one token to draw: sampling is greedy decoding
    r = client.messages.create(model="specstream-tiny", max_tokens=12, system="Answer briefly.",
                               messages=ask("Oslo"), extra_body={"temperature": 1.0, "top_k": 1})
    assert r.content[0].text == want
    # a last assistant message is the reply's beginning (Anthropic's prefill), as transformers renders
    # it with continue_final_message; OpenAI's chat takes it with vLLM's field of that name
    begun = [*ask("Oslo"), {"role": "assistant", "content": "It is"}]
    prompt = tok.apply_chat_template(system + begun, continue_final_message=True)
    assert prompt[-3:] != tok.apply_chat_template(system + ask("Oslo"))[-3:]
    want = generate(model, tok, prompt, max_tokens=8, mode="ar").text
    r = client.messages.create(model="specstream-tiny", max_tokens=8, system="Answer briefly.",
                               messages=begun)
    assert r.content[0].text == want and r.usage.input_tokens == len(prompt)
    chat = server.client().chat.completions.create(model="specstream-tiny", max_tokens=8,
                                                   messages=system + begun,
                                                   extra_body={"continue_final_message": True})
    assert chat.choices[0].message.content == want
    # count_tokens: the prompt's tokens, as a reply's usage counts them
    counted = client.messages.count_tokens(model="specstream-tiny", system="Answer briefly.", messages=begun)
    assert counted.input_tokens == len(prompt)
    bare = client.messages.count_tokens(model="specstream-tiny", messages=begun).input_tokens
    for empty in ("", []):  # no system prompt, as Anthropic reads them (found by a walkthrough)
        counted = client.messages.count_tokens(model="specstream-tiny", system=empty, messages=begun)
        assert counted.input_tokens == bare < len(prompt)
    with pytest.raises(openai.BadRequestError, match="goes on from an assistant's text"):
        server.client().chat.completions.create(model="specstream-tiny", max_tokens=8, messages=ask("Oslo"),
                                                extra_body={"continue_final_message": True})


def test_messages_api_tool_use_whole_streamed_and_answered(server, model_dir):
    """The trained adapter's call as a ``tool_use`` block (the SDK assembles the streamed
    input JSON), and a tool result sent back reaches the template as the OpenAI history would."""
    _, client = anthropic_client(server)
    _, tok = load(model_dir)
    tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
              "input_schema": t["function"]["parameters"]} for t in TOOLS]
    r = client.messages.create(model="specstream-tiny:tools", max_tokens=40, tools=tools,
                               messages=ask("Berlin"))
    assert r.stop_reason == "tool_use" and [(b.type, b.name, b.input) for b in r.content] == [
        ("tool_use", "weather", {"city": "Berlin"})]
    assert r.usage.input_tokens == len(tok.apply_chat_template(ask("Berlin"), tools=TOOLS))
    with client.messages.stream(model="specstream-tiny:tools", max_tokens=40, tools=tools,
                                messages=ask("Berlin")) as s:
        streamed = s.get_final_message()
    assert [(b.type, b.name, b.input) for b in streamed.content] == [
        ("tool_use", "weather", {"city": "Berlin"})]
    assert streamed.stop_reason == "tool_use" and streamed.content[0].id.startswith("toolu_")
    # a call cut off inside its input: the complete members, whole as streamed (the SDK's reading),
    # and the stop sequence that cut it (found by a walkthrough: {"arguments": text}, and "tool_use")
    cut = dict(model="specstream-tiny:tools", max_tokens=40, tools=tools, messages=ask("Berlin"),
               stop_sequences=["Berl"])
    with client.messages.stream(**cut) as s:
        streamed = s.get_final_message()
    for reply in (client.messages.create(**cut), streamed):
        assert [(b.type, b.input) for b in reply.content] == [("tool_use", {})]
        assert (reply.stop_reason, reply.stop_sequence) == ("stop_sequence", "Berl")
    history = [*ask("Berlin"), {"role": "assistant", "content": [b.model_dump() for b in r.content]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": r.content[0].id,
                                             "content": "12 C, rain"}]}]
    answered = client.messages.create(model="specstream-tiny:tools", max_tokens=4, tools=tools,
                                      messages=history)
    openai_history = [*ask("Berlin"), {"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "weather", "arguments": {"city": "Berlin"}}}]},
        {"role": "tool", "content": "12 C, rain"}]
    assert answered.usage.input_tokens == len(tok.apply_chat_template(openai_history, tools=TOOLS))


def test_messages_stream_blocks_follow_the_reply():
    """Anthropic's stream of a call streamed over several passes, then text: each block starts,
    gets its deltas and stops before the next starts, at indices 0, 1, ..., and the tool_use
    block's input pieces join into its arguments."""
    import asyncio

    from mlx_specstream.api import StreamResponse
    from mlx_specstream.engine import Stats
    from mlx_specstream.messages_api import MessageReply
    from mlx_specstream.server import Generation

    gen = Generation(None, Stats(), "m", chat=True, stream=True, include_usage=False, tool_format=HERMES)
    texts = ['<tool_call>{"name": "f", "arguments": {"a": 1', '}}</tool_call> Done.', ' More.']

    async def passes():
        for i, t in enumerate(texts):
            yield StreamResponse([1], t, [], [], "stop" if i == len(texts) - 1 else None)

    async def collect():
        return [e async for e in MessageReply(gen).events(passes())]

    events = [json.loads(line[6:]) for e in asyncio.run(collect()) for line in e.splitlines()
              if line.startswith("data: ")]
    blocks, open_index = [], None
    for e in events:
        if e["type"] == "content_block_start":
            assert open_index is None and e["index"] == len(blocks)
            open_index = e["index"]
            blocks.append({**e["content_block"], "parts": []})
        elif e["type"] == "content_block_delta":
            assert e["index"] == open_index
            blocks[-1]["parts"].append(e["delta"].get("text", e["delta"].get("partial_json")))
        elif e["type"] == "content_block_stop":
            assert e["index"] == open_index
            open_index = None
    assert open_index is None and [b["type"] for b in blocks] == ["tool_use", "text"]
    assert json.loads("".join(blocks[0]["parts"])) == {"a": 1}
    assert "".join(blocks[1]["parts"]) == "Done. More."


def test_a_cut_off_input_reads_as_anthropics_sdk_reads_it():
    """Every prefix of an input's JSON text reads as the object the SDK assembles from the same
    text streamed (jiter's partial mode, which it uses)."""
    from jiter import from_json

    from mlx_specstream.messages_api import _complete_members

    for value in ({"city": "Paris", "unit": "celsius", "days": 12, "ok": True, "none": None},
                  {"q": 'say "hi" \\ there', "tags": ["a", "b", [1.5, -2e3]], "deep": {"x": {"y": []}}}):
        text = json.dumps(value)
        for n in range(len(text) + 1):
            sdk = from_json(text[:n].encode(), partial_mode=True) if n else {}
            assert _complete_members(text[:n]) == sdk, text[:n]


def test_messages_api_structured_output(server):
    """``output_config.format`` (and the client's ``parse`` with a pydantic model) constrains the
    reply to JSON that the schema allows, as Anthropic's structured outputs do."""
    import jsonschema
    from pydantic import BaseModel

    _, client = anthropic_client(server)

    class City(BaseModel):
        name: str
        population: int

    r = client.messages.parse(model="specstream-tiny", max_tokens=60, messages=ask("Oslo"),
                              output_format=City)
    assert isinstance(r.parsed_output, City) and r.stop_reason == "end_turn", r
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}, "city": {"enum": ["Oslo", "Lima"]}},
              "required": ["ok", "city"], "additionalProperties": False}
    r = client.messages.create(model="specstream-tiny", max_tokens=200, messages=ask("Oslo"),
                               output_config={"format": {"type": "json_schema", "schema": schema}})
    assert r.stop_reason == "end_turn", r.content[0].text
    jsonschema.validate(json.loads(r.content[0].text), schema)


F = {"name": "f", "input_schema": {}}
RESULT = {"type": "tool_result", "tool_use_id": "t1", "content": "9 C"}
USE = {"type": "tool_use", "id": "t1", "name": "f", "input": {}}
USED = {"role": "assistant", "content": [USE]}


def test_messages_api_errors_are_anthropics(server):
    anthropic, client = anthropic_client(server)
    with pytest.raises(anthropic.NotFoundError) as e:
        client.messages.create(model="nope", max_tokens=4, messages=ask("Oslo"))
    assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "not_found_error"
    body = {"model": "specstream-tiny", "max_tokens": 4, "messages": ask("Oslo")}
    for extra, said in [({"max_tokens": None}, "'max_tokens' is required"),
                        ({"temperature": 1.5}, "'temperature' must be between 0 and 1"),
                        ({"tool_choice": {"type": "tool"}, "tools": [{"name": "f", "input_schema": {}}]},
                         "must name the tool"),
                        ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
                         "content blocks of type 'image' are not supported"),
                        ({"stop_sequences": ["a"] * 5}, "'stop_sequences' must be a list of up to 4"),
                        ({"n": 2}, "'n': extra inputs are not permitted"),
                        ({"messages": [{"role": "user", "content": ""}]}, "must have non-empty content"),
                        ({"messages": [{"role": "user", "content": [{"type": "text", "text": ""}]}]},
                         "text content blocks must be non-empty"),
                        ({"messages": [*ask("Oslo"), {"role": "assistant", "content": "Sunny."},
                                       {"role": "user", "content": [
                                           {"type": "tool_result", "tool_use_id": "t1", "content": "9 C"}]}],
                          "tools": [{"name": "f", "input_schema": {}}]},
                         "'messages[2].content[0]': unexpected tool_use_id 't1' in a tool_result block"),
                        ({"messages": [*ask("Oslo"), USED, *ask("Rome")], "tools": [F]},
                         "'messages[1]': tool_use ids were found without tool_result blocks immediately"),
                        ({"messages": [*ask("Oslo"), USED, {"role": "user", "content": [
                            {"type": "tool_result", "tool_use_id": "t1", "content": "9 C"}]}]},
                         "requests which include tool_use or tool_result blocks must define tools"),
                        ({"tools": [{"name": "f"}]}, "'tools[0].input_schema' is required"),
                        ({"messages": [*ask("Oslo"), USED, {"role": "user", "content": [
                            {"type": "text", "text": "here:"}, RESULT]}], "tools": [F]},
                         "tool_result blocks must come first"),
                        ({"messages": [*ask("Oslo"), USED, {"role": "user", "content": [RESULT, RESULT]}],
                          "tools": [F]}, "tool_use_id 't1' has a tool_result block already"),
                        ({"messages": [*ask("Oslo"), {**USED, "content": [{**USE, "id": "a.b c"}]}],
                          "tools": [F]}, "'messages[1].content[0].id' must match"),
                        ({"messages": [*ask("Oslo"), {**USED, "content": USED["content"] * 2}], "tools": [F]},
                         "tool_use ids must be unique"),
                        ({"messages": [*ask("Oslo"), {"role": "assistant", "content": "It is "}]},
                         "final assistant content cannot end with trailing whitespace"),
                        ({"tools": [{"name": "pick", "strict": True,
                                     "input_schema": STRICT_SEVENS["function"]["parameters"]}]},
                         "a strict tool's parameters may not use multipleOf"),
                        ({"messages": [*ask("Oslo"), {"role": "assistant", "content": "{"}],
                          "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}}},
                         "cannot be combined with a JSON schema"),
                        ({"output_config": {"format": {"type": "json_schema", "schema": {
                            "type": "integer", "multipleOf": 7}}}}, "multipleOf")]:
        status, reply = server.post_raw("/v1/messages", json.dumps({**body, **extra}).encode())
        assert status == 400 and reply["type"] == "error", reply
        assert reply["error"]["type"] == "invalid_request_error" and said in reply["error"]["message"], reply
    status, reply = server.post_raw("/v1/messages", b"{not json")
    assert status == 400 and reply["error"]["type"] == "invalid_request_error"
    status, reply = server.post_raw("/v1/messages/count_tokens", json.dumps(body).encode())
    assert status == 400 and "'max_tokens': extra inputs are not" in reply["error"]["message"], reply
    body.pop("max_tokens")  # count_tokens: what a Messages request has but decoding
    huge = json.dumps({**body, "messages": [{"role": "user", "content": "x " * 200_000}]}).encode()
    status, reply = server.post_raw("/v1/messages/count_tokens", huge)  # refused before it is encoded
    assert status == 400 and "longer than the model's context" in reply["error"]["message"], reply
    nope = json.dumps({**body, "model": "nope"}).encode()
    status, reply = server.post_raw("/v1/messages/count_tokens", nope)
    assert status == 404 and reply["type"] == "error" and reply["error"]["type"] == "not_found_error", reply
    # an empty last assistant message is no prefill: the prompt is the one without it
    counts = [server.post_raw("/v1/messages/count_tokens", json.dumps({**body, "messages": m}).encode())
              for m in (ask("Oslo"), [*ask("Oslo"), {"role": "assistant", "content": ""}],
                        [*ask("Oslo"), {"role": "assistant", "content": []}])]
    assert counts[0][0] == 200 and counts[0] == counts[1] == counts[2], counts
    # what the routing answers, in the same shape: a path this server lacks, a method the route lacks
    routed = [("/v1/messages/batches", b"{}", "POST", 404, "not_found_error"),
              ("/v1/messages", None, "GET", 405, "invalid_request_error")]
    for path, data, method, want, kind in routed:
        status, reply = server.post_raw(path, data, method)
        assert (status, reply["type"], reply["error"]["type"]) == (want, "error", kind), reply
    status, reply = server.post_raw("/v1/chat/completions", None, "GET")  # OpenAI's routes: OpenAI's shape
    assert status == 405 and reply["error"]["type"] == "invalid_request_error" and "type" not in reply, reply
