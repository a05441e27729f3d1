"""``specstream-mlx serve`` through the official ``openai`` client against a loopback server.

Oracles: plain autoregressive decoding of the base model in this process (lossless adapters must
give exactly its tokens), and the adapter decoded alone in this process (shared mode). Every
server is started by the test on a free port and stops by itself (SIGTERM, then kill).
"""

from __future__ import annotations

import http.client
import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers import SERVE, Server, templated_model

from mlx_specstream.api import DEFAULT_MODEL, generate, load, stream_generate

openai = pytest.importorskip("openai")
ROOT = Path(__file__).resolve().parent.parent
MODEL = DEFAULT_MODEL
pytestmark = pytest.mark.skipif(not (MODEL / "adapters" / "sql").is_dir(), reason="no default model")
TEMPLATE = ("{% for m in messages %}### {{ m['role'] }}:\n{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}### SQL:\n{% endif %}")
SQL = [json.loads(line)["prompt"] for line in (ROOT / "data" / "sql" / "test.jsonl").open()][:8]
CODE = [json.loads(line)["prompt"] for line in (ROOT / "data" / "code" / "test.jsonl").open()][:2]
CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}  # a call in a history


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """The shipped model with a chat template added (files linked, nothing copied)."""
    return templated_model(tmp_path_factory.mktemp("served") / "specstream-tiny", MODEL, TEMPLATE)


@pytest.fixture(scope="module")
def server(model_dir):
    s = Server("--model", str(model_dir), "--adapters", "sql,sql-lossless,code")
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def base(model_dir):
    return load(model_dir)


def ar(base, prompt, n: int) -> str:
    """The oracle: the base model decoded token by token, alone, in this process."""
    model, tok = base
    return generate(model, tok, prompt, max_tokens=n, mode="ar").text


def test_models_and_health(server):
    ids = [m.id for m in server.client().models.list().data]
    assert ids == ["specstream-tiny", "specstream-tiny:sql", "specstream-tiny:sql-lossless",
                   "specstream-tiny:code"]
    assert server.get("/health")["status"] == "ok"
    assert server.get("/v1/models/") == server.get("/v1/models")  # a trailing slash: the list
    one = server.client().models.retrieve("specstream-tiny:sql")  # GET /v1/models/{id}
    assert server.get("/v1/models/specstream-tiny:sql/")["id"] == one.id  # a trailing slash too
    assert one.id == "specstream-tiny:sql" and one.created == server.client().models.list().data[1].created
    with pytest.raises(openai.NotFoundError):
        server.client().models.retrieve("specstream-tiny:nope")
    try:  # a 405 says which methods the path takes
        urllib.request.urlopen(server.url + "/v1/completions", timeout=10)
    except urllib.error.HTTPError as e:
        assert e.code == 405 and e.headers["Allow"] == "POST"
    else:
        raise AssertionError("GET /v1/completions answered")
    code, reply = server.post_raw("/v1/completions/", b'{"model": "specstream-tiny", "prompt": "x"}')
    assert (code, reply["error"]["message"]) == (404, "Invalid URL (POST /v1/completions/)")  # not a bare 307


def test_completion_equals_plain_decoding(server, base):
    client = server.client()
    r = client.completions.create(model="specstream-tiny:sql-lossless", prompt=SQL[0], max_tokens=24)
    assert r.choices[0].text == ar(base, SQL[0], 24)
    spec = r.model_extra["speculative"]
    assert r.usage.completion_tokens <= 24 and r.usage.prompt_tokens == len(base[1].encode(SQL[0]))
    assert 1 <= spec["passes"] < r.usage.completion_tokens and spec["mean_accepted_tokens"] > 1
    plain = client.completions.create(model="specstream-tiny", prompt=SQL[0], max_tokens=24)
    assert plain.choices[0].text == r.choices[0].text
    assert plain.model_extra["speculative"]["mean_accepted_tokens"] == 1.0


def test_streaming_matches_whole(server):
    client = server.client()
    kw = dict(model="specstream-tiny:sql-lossless", prompt=SQL[1], max_tokens=20)
    whole = client.completions.create(**kw)
    chunks = list(client.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert len(chunks) > 3  # pass by pass, not all at once


def test_chat_through_template(server, base):
    messages = [{"role": "user", "content": "List the names of all employees."}]
    prompt = base[1].apply_chat_template(messages)
    client = server.client()
    r = client.chat.completions.create(model="specstream-tiny:sql-lossless", messages=messages, max_tokens=16)
    assert r.choices[0].message.content == ar(base, prompt, 16) and r.choices[0].message.role == "assistant"
    stream = client.chat.completions.create(model="specstream-tiny:sql-lossless", messages=messages,
                                            max_tokens=16, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream) == r.choices[0].message.content
    # an assistant's refusal part (OpenAI's) is that turn's text
    said = [*messages, {"role": "assistant", "content": [{"type": "refusal", "refusal": "I cannot."}]},
            {"role": "user", "content": "Count them."}]
    plain = [*messages, {"role": "assistant", "content": "I cannot."}, said[-1]]
    r = client.chat.completions.create(model="specstream-tiny:sql-lossless", messages=said, max_tokens=8)
    assert r.choices[0].message.content == ar(base, base[1].apply_chat_template(plain), 8)


def test_replies_are_text_without_control_tokens(server, base):
    """A BOS the model writes is a token of the reply (counted) but no text in it, as in OpenAI's
    replies; an earlier assistant turn of a tool-calling history may have no content."""
    model, tok = base
    prompt = "x = 1\n</s>"
    steps = list(stream_generate(model, tok, prompt, max_tokens=6, mode="ar"))
    ids = [t for s in steps for t in s.tokens]
    assert tok.bos_token_id in ids  # the case this is about
    r = server.client().completions.create(model="specstream-tiny", prompt=prompt, max_tokens=6)
    assert r.choices[0].text == tok.decode(ids, skip_special_tokens=True) and "<s>" not in r.choices[0].text
    assert r.usage.completion_tokens == len(ids)
    # an empty prompt, as OpenAI's completions read it: the beginning of a document (BOS alone)
    begun = [t for step in stream_generate(model, tok, [tok.bos_token_id], max_tokens=3, mode="ar")
             for t in step.tokens]
    r = server.client().completions.create(model="specstream-tiny", prompt="", max_tokens=3)
    assert r.usage.prompt_tokens == 1 and r.choices[0].text == tok.decode(begun, skip_special_tokens=True)
    history = [{"role": "user", "content": "hi"},
               {"role": "assistant", "content": None, "tool_calls": [CALL, {**CALL, "id": "c2"}]},
               {"role": "tool", "tool_call_id": "c1", "content": "42"},
               {"role": "tool", "tool_call_id": "c2", "content": "43"}]
    code, reply = server.post_raw("/v1/chat/completions", json.dumps(
        {"model": "specstream-tiny", "messages": history, "max_tokens": 2}).encode())
    assert code == 200, reply


def test_adapters_by_model_id(server, base, model_dir):
    """Each id decodes with its own adapter over the one base: shared mode equals that adapter
    decoded alone; the lossless code adapter equals the base."""
    client = server.client()
    shared, tok = load(model_dir, adapter="sql", fuse=False)
    r = client.completions.create(model="specstream-tiny:sql", prompt=SQL[2], max_tokens=20)
    assert r.choices[0].text == generate(shared, tok, SQL[2], max_tokens=20).text
    r = client.completions.create(model="specstream-tiny:code", prompt=CODE[0], max_tokens=20)
    assert r.choices[0].text == ar(base, CODE[0], 20)


def test_stop_seed_and_sampling(server, base, model_dir):
    client = server.client()
    full = ar(base, SQL[0], 24)
    stop = full.split()[2]
    r = client.completions.create(model="specstream-tiny:sql-lossless", prompt=SQL[0], max_tokens=24,
                                  stop=[stop])
    assert r.choices[0].finish_reason == "stop" and stop not in r.choices[0].text
    assert full.startswith(r.choices[0].text)
    # a stop string that begins inside a token: everything before it comes back, as OpenAI's
    inner = next(w[1:3] for w in full.split()[2:] if len(w) > 3)
    for stream in (False, True):
        r = client.completions.create(model="specstream-tiny:sql-lossless", prompt=SQL[0], max_tokens=24,
                                      stop=inner, stream=stream)
        text = "".join(c.choices[0].text for c in r) if stream else r.choices[0].text
        assert text == full[:full.index(inner)], (text, inner)
    # without a seed, every sampled request draws its own (OpenAI's), not one fixed seed
    texts = {client.completions.create(model="specstream-tiny", prompt=CODE[0], max_tokens=24,
                                       temperature=1.0).choices[0].text for _ in range(3)}
    assert len(texts) > 1
    kw = dict(model="specstream-tiny:sql-lossless", prompt=SQL[3], max_tokens=16, temperature=0.9, top_p=0.95)
    a = client.completions.create(**kw, seed=7).choices[0].text
    model, tok = load(model_dir, adapter="sql-lossless")
    assert a == generate(model, tok, SQL[3], max_tokens=16, temperature=0.9, top_p=0.95, seed=7).text
    assert a == client.completions.create(**kw, seed=7).choices[0].text


def test_logprobs_and_sampling_cuts(server, base, model_dir):
    """logprobs (chat's list of tokens, completions' lists with text offsets), streamed and not,
    equal the Python API's (tests/test_logprobs.py checks those against transformers); top_k and
    min_p sample as the API does with the same seed."""
    client = server.client()
    model, tok = load(model_dir, adapter="sql-lossless")
    messages = [{"role": "user", "content": "List the names of all employees."}]
    prompt = tok.apply_chat_template(messages)
    ref = generate(model, tok, prompt, max_tokens=12, logprobs=3)
    kw = dict(model="specstream-tiny:sql-lossless", messages=messages, max_tokens=12, logprobs=True,
              top_logprobs=3)
    r = client.chat.completions.create(**kw)
    content = r.choices[0].logprobs.content
    assert [c.logprob for c in content] == [lp.logprob for lp in ref.logprobs]
    tops = [[t.logprob for t in c.top_logprobs] for c in content]
    assert tops == [[v for _, v in lp.top] for lp in ref.logprobs]
    assert "".join(c.token for c in content) == r.choices[0].message.content == ref.text
    assert all(bytes(c.bytes).decode() == c.token for c in content)
    streamed = [c for chunk in client.chat.completions.create(**kw, stream=True) if chunk.choices
                and chunk.choices[0].logprobs for c in chunk.choices[0].logprobs.content]
    assert [(c.token, c.logprob) for c in streamed] == [(c.token, c.logprob) for c in content]
    plain = client.chat.completions.create(model=kw["model"], messages=messages, max_tokens=4)
    assert plain.choices[0].logprobs is None
    # completions: tokens, their log-probabilities, the likeliest as {token: logprob}, offsets in the text
    ref = generate(model, tok, SQL[2], max_tokens=10, logprobs=2)
    for stream in (False, True):
        r = client.completions.create(model="specstream-tiny:sql-lossless", prompt=SQL[2], max_tokens=10,
                                      logprobs=2, stream=stream)
        chunks = list(r) if stream else [r]
        lps = [c.choices[0].logprobs for c in chunks if c.choices and c.choices[0].logprobs]
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        tokens = [t for lp in lps for t in lp.tokens]
        assert [v for lp in lps for v in lp.token_logprobs] == [lp.logprob for lp in ref.logprobs]
        tops = [d for lp in lps for d in lp.top_logprobs]  # the 2 likeliest, and the chosen token (OpenAI's)
        assert len(tops) == len(ref.tokens) and all(2 <= len(d) <= 3 for d in tops)
        assert [sorted(d.values(), reverse=True)[:2] for d in tops] == [[v for _, v in lp.top]
                                                                        for lp in ref.logprobs]
        assert all(t in d and d[t] == v for d, t, v in zip(tops, tokens, [lp.logprob for lp in ref.logprobs]))
        offsets = [o for lp in lps for o in lp.text_offset]
        assert text == ref.text == "".join(tokens)
        assert offsets == [sum(map(len, tokens[:i])) for i in range(len(tokens))]
    # a newline is a byte piece (<0x0A>), whose text comes with the next token's: each token still
    # begins after the whole characters of the tokens before it, decoded together
    ids = tok.encode("def add(a, b):\n")
    for stream in (False, True):
        r = client.completions.create(model="specstream-tiny:code", prompt="def add(a, b):\n", max_tokens=40,
                                      logprobs=0, stream=stream)
        chunks = list(r) if stream else [r]
        lps = [c.choices[0].logprobs for c in chunks if c.choices and c.choices[0].logprobs]
        out = generate(load(model_dir, adapter="code")[0], tok, ids, max_tokens=40).tokens
        assert any(tok.is_byte_token(t) for t in out)
        assert [o for lp in lps for o in lp.text_offset] == [len(tok.decode(out[:i]).rstrip("\ufffd"))
                                                             for i in range(len(out))]
    kw = dict(prompt=SQL[3], max_tokens=16, temperature=1.0, top_k=3, min_p=0.05, seed=11)
    sampled = client.completions.create(model="specstream-tiny:sql-lossless", logprobs=0, extra_body={
        "top_k": 3, "min_p": 0.05}, **{k: v for k, v in kw.items() if k not in ("top_k", "min_p")})
    assert sampled.choices[0].text == generate(model, tok, **kw).text
    lp = sampled.choices[0].logprobs  # logprobs 0: each token's own entry, whatever was drawn
    want = [[(t, v)] for t, v in zip(lp.tokens, lp.token_logprobs)]
    assert [list(d.items()) for d in lp.top_logprobs] == want


@pytest.mark.parametrize("body, status, param", [
    (b"{not json", 400, None),
    (b"[1, 2]", 400, None),
    (json.dumps({"model": "nope", "prompt": "x"}).encode(), 404, "model"),
    (json.dumps({"prompt": "x"}).encode(), 400, "model"),
    (json.dumps({"model": "specstream-tiny", "prompt": "x", "max_tokens": 0}).encode(), 400, "max_tokens"),
    (json.dumps({"model": "specstream-tiny", "prompt": "x", "temperature": -1}).encode(), 400, "temperature"),
    (json.dumps({"model": "specstream-tiny", "prompt": "x", "top_p": 1.5}).encode(), 400, "top_p"),
    (json.dumps({"model": "specstream-tiny", "prompt": "x", "max_tokens": "9"}).encode(), 400, "max_tokens"),
    (json.dumps({"model": "specstream-tiny", "prompt": "x", "max_tokens": -1}).encode(), 400, "max_tokens"),
    (json.dumps({"model": "specstream-tiny", "prompt": "x", "n": 2}).encode(), 400, "n"),
    (json.dumps({"model": "specstream-tiny", "prompt": "x", "stop": ["a"] * 5}).encode(), 400, "stop"),
    (json.dumps({"model": "specstream-tiny", "prompt": {"a": 1}}).encode(), 400, "prompt"),
    (json.dumps({"model": "specstream-tiny", "prompt": "x", "mode": "fast"}).encode(), 400, "mode"),
    (json.dumps({"model": "specstream-tiny", "prompt": "x", "mode": "ss"}).encode(), 400, "mode"),
    (json.dumps({"model": "specstream-tiny", "prompt": "x", "sql_names": 1}).encode(), 400, "sql_names"),
    (json.dumps({"model": "specstream-tiny", "prompt": "x", "sql_names": True}).encode(), 400, "prompt"),
    (json.dumps({"model": "specstream-tiny:sql", "prompt": [1, 99999], "max_tokens": 4}).encode(), 400,
     "prompt"),
    (json.dumps({"model": "specstream-tiny", "prompt": [1, -5], "max_tokens": 4}).encode(), 400, "prompt"),
    (json.dumps({"model": "specstream-tiny", "prompt": [1, 2**31]}).encode(), 400, "prompt"),
    (json.dumps({"model": "specstream-tiny", "prompt": "x", "seed": 2**63}).encode(), 400, "seed"),
    (json.dumps({"model": "specstream-tiny", "prompt": "x", "temperature": 10**400}).encode(), 400,
     "temperature"),  # too large for a float: a 400, not a 500
    (json.dumps({"model": "specstream-tiny", "prompt": "x", "logprobs": 6}).encode(), 400, "logprobs"),
    (json.dumps({"model": "specstream-tiny", "prompt": "x", "logprobs": True}).encode(), 400, "logprobs"),
    (json.dumps({"model": "specstream-tiny", "prompt": "x", "top_logprobs": 2}).encode(), 400,
     "top_logprobs"),
    (json.dumps({"model": "specstream-tiny", "messages": [{"role": "user", "content": "x"}],
                 "top_logprobs": 2}).encode(), 400, "top_logprobs"),  # without logprobs: true
    (json.dumps({"model": "specstream-tiny", "messages": [{"role": "user", "content": "x"}],
                 "logprobs": True, "top_logprobs": 21}).encode(), 400, "top_logprobs"),
    (json.dumps({"model": "specstream-tiny", "prompt": "x", "top_k": -2}).encode(), 400, "top_k"),
    (json.dumps({"model": "specstream-tiny", "prompt": "x", "min_p": 1.5}).encode(), 400, "min_p"),
    (json.dumps({"model": "specstream-tiny", "prompt": "x", "repetition_penalty": 1.3}).encode(), 400,
     "repetition_penalty"),
    (json.dumps({"model": "specstream-tiny", "messages": [{"role": "user", "content": "x"}],
                 "tools": [{"type": "function", "function": {"name": "f"}}]}).encode(), 400, "tools"),
    (json.dumps({"model": "specstream-tiny", "prompt": "x",  # a completion has no template to show them
                 "tools": [{"type": "function", "function": {"name": "f"}}]}).encode(), 400, "tools"),
    (json.dumps({"model": "specstream-tiny", "prompt": [5] * 3000, "max_tokens": 16}).encode(), 400,
     "prompt"),  # the prompt alone overflows the context: no max_tokens would help
    (json.dumps({"model": "specstream-tiny", "prompt": "x", "temperature": float("nan")}).encode(), 400,
     "temperature"),
    (json.dumps({"model": "specstream-tiny", "messages": [{"role": "user", "content": "x"}],
                 "max_completion_tokens": 0}).encode(), 400, "max_completion_tokens"),
    (json.dumps({"model": "specstream-tiny", "prompt": "x", "temperature": 2.5}).encode(), 400,
     "temperature"),
    (json.dumps({"model": "specstream-tiny", "messages": [{"role": "wizard", "content": "x"}]}).encode(), 400,
     "messages"),
    (json.dumps({"model": "specstream-tiny", "messages": [  # OpenAI's 400s: a result with no call id,
        {"role": "user", "content": "x"},  # or one no call asked for
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "content": "42"}]}).encode(),
     400, "messages[2].tool_call_id"),
    (json.dumps({"model": "specstream-tiny", "messages": [
        {"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "c1", "content": "42"}]}).encode(),
     400, "messages[1]"),
    (json.dumps({"model": "specstream-tiny", "prompt": "abc \ud800"}).encode(), 400, "prompt"),
    (json.dumps({"model": "specstream-tiny\ud800", "prompt": "abc"}).encode(), 400, "model"),
    (json.dumps({"model": "specstream-tiny", "messages": [{"role": "user", "content": "\ud83d"}]}).encode(),
     400, "messages[0].content"),
    # found by a walkthrough: a 500 from the tokenizer's template, and from the schema's grammar
    (json.dumps({"model": "specstream-tiny", "messages": [{"role": "user", "content": "x"}], "tools": [
        {"type": "function", "function": {"name": "f", "description": "\ud800"}}]}).encode(),
     400, "tools[0].function.description"),
    (json.dumps({"model": "specstream-tiny", "messages": [{"role": "user", "content": "x"}],
                 "response_format": {"type": "json_schema", "json_schema": {
                     "name": "e", "schema": {"enum": ["\ud800"]}}}}).encode(),
     400, "response_format.json_schema.schema.enum[0]"),
    (json.dumps({"model": "specstream-tiny", "prompt": "x", "metadata": {"\udc00": "x"}}).encode(), 400,
     "metadata"),  # a key
    (json.dumps({"model": "specstream-tiny", "prompt": "x",
                 "stream_options": {"include_usage": True}}).encode(), 400, "stream_options"),
    (json.dumps({"model": "specstream-tiny", "prompt": "x", "stream": True,
                 "stream_options": {"include_usage": 1}}).encode(), 400, "stream_options.include_usage"),
    (json.dumps({"model": "specstream-tiny", "prompt": "x", "echo": True}).encode(), 400, "echo"),
    (json.dumps({"model": "specstream-tiny", "prompt": "x", "modalities": ["text", "audio"]}).encode(), 400,
     "modalities"),
    (json.dumps({"model": "specstream-tiny", "prompt": "x", "audio": {"voice": "alloy"}}).encode(), 400,
     "audio"),
    (json.dumps({"model": "specstream-tiny", "messages": [{"role": "user", "content": "x"}],
                 "response_format": {"type": "xml"}}).encode(), 400, "response_format"),
    (json.dumps({"model": "specstream-tiny", "prompt": "x", "max_tokens": 10**20}).encode(), 400,
     "max_tokens"),
    (b"[" * 100_000, 400, None),  # nested deeper than the parser goes
    (b'{"model": "specstream-tiny", "prompt": "x", "max_tokens": ' + b"9" * 5000 + b"}", 400, None),
    (json.dumps({"model": "specstream-tiny", "prompt": "x", "stop": ["x" * 1001]}).encode(), 400, "stop"),
    # refused before it is encoded, which would hold up every other request
    (json.dumps({"model": "specstream-tiny", "prompt": "hello world " * 200_000}).encode(), 400, "prompt"),
])
def test_bad_requests_are_openai_errors(server, body, status, param):
    chat = b'"messages"' in body
    code, reply = server.post_raw("/v1/chat/completions" if chat else "/v1/completions", body)
    assert code == status
    assert set(reply["error"]) == {"message", "type", "param", "code"} and reply["error"]["message"]
    assert reply["error"]["param"] == param
    if param in ("seed", "temperature", "max_completion_tokens"):
        assert param in reply["error"]["message"]
    if b"[5, 5, 5" in body or b"hello world hello" in body:  # the engine's rule, the server's code
        assert reply["error"]["code"] == "context_length_exceeded"
        assert ("at most 2047 fit" in reply["error"]["message"]) is (b"[5, 5" in body)
    assert server.post_raw("/v1/completions", json.dumps(
        {"model": "specstream-tiny", "prompt": "x", "max_tokens": 1}).encode())[0] == 200  # still serving


def test_option_errors_name_the_requests_fields(server):
    """The engine's option errors read in the request's terms: JSON fields and values, the
    'model' id that picks an adapter, the chat endpoint's own name for the token limit."""
    code, reply = server.post_raw("/v1/completions", json.dumps(
        {"model": "specstream-tiny", "prompt": "x", "mode": "ss"}).encode())
    assert code == 400 and reply["error"]["param"] == "mode"
    assert reply["error"]["message"] == ("speculative decoding needs an adapter with streams: load one "
                                         "('model': an id with an adapter, GET /v1/models), or use "
                                         "'mode': \"ar\" (plain decoding) or 'mode': \"lookup\" "
                                         "(prompt-lookup drafts, no adapter needed)")
    code, reply = server.post_raw("/v1/chat/completions", json.dumps(
        {"model": "specstream-tiny", "messages": [{"role": "user", "content": "x"}],
         "max_completion_tokens": 0}).encode())
    assert code == 400 and "'max_completion_tokens'" in reply["error"]["message"]
    assert "max_tokens" not in reply["error"]["message"]


def test_sql_names_extra_field(server, base):
    """`sql_names` as in `generate`: the shipped model writes `T2.built` for this prompt's `year`
    column; with the field it writes only the schema's names, as constrained AR in this process,
    also while unconstrained requests for it are decoded in the same passes."""
    prompt = json.loads((ROOT / "data" / "sql" / "test.jsonl").read_text().splitlines()[27])["prompt"]
    jobs = [("specstream-tiny:sql-lossless", True), ("specstream-tiny", True),
            ("specstream-tiny:sql-lossless", False), ("specstream-tiny", False)]
    client = server.client()

    def one(job):
        model, names = job
        r = client.completions.create(model=model, prompt=prompt, max_tokens=64,
                                      extra_body={"sql_names": names})
        return r.choices[0].text

    with ThreadPoolExecutor(4) as pool:
        texts = list(pool.map(one, jobs, timeout=120))
    model, tok = base
    constrained = generate(model, tok, prompt, max_tokens=64, mode="ar", sql_names=True).text
    assert texts == [constrained, constrained, ar(base, prompt, 64), ar(base, prompt, 64)]
    assert "built" not in constrained and "built" in texts[2]


def test_errors_through_the_client_and_still_serving(server):
    client = server.client()
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="specstream-tiny:nope", prompt="x", max_tokens=2)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="specstream-tiny", prompt="word " * 3000, max_tokens=2)
    assert e.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="specstream-tiny", messages=[], max_tokens=2)
    r = client.completions.create(model="specstream-tiny", prompt=SQL[0], max_tokens=4)
    assert r.usage.completion_tokens == 4


def test_sixteen_concurrent_streams_equal_single_decoding(server, base):
    """16 streaming clients at once over three model ids: all complete; every greedy lossless
    output equals the base decoded alone."""
    ids = ["specstream-tiny", "specstream-tiny:sql-lossless", "specstream-tiny:code"]
    jobs = [(ids[i % 3], (SQL + CODE)[i % 10]) for i in range(16)]
    client = server.client()
    seen = []

    def one(job):
        model, prompt = job
        text = ""
        for c in client.completions.create(model=model, prompt=prompt, max_tokens=8, stream=True):
            if not text:
                seen.append(server.get("/health")["active"])
            text += c.choices[0].text
        return text

    with ThreadPoolExecutor(16) as pool:
        texts = list(pool.map(one, jobs, timeout=120))
    expected = {p: ar(base, p, 8) for p in dict.fromkeys(p for _, p in jobs)}
    assert texts == [expected[p] for _, p in jobs]
    assert max(seen) > 1  # decoded together, not one after another
    assert server.get("/health")["active"] == 0


def wait_idle(server, seconds: float = 10) -> int:
    deadline = time.monotonic() + seconds
    while server.get("/health")["active"] and time.monotonic() < deadline:
        time.sleep(0.1)
    return server.get("/health")["active"]


LONG = {"model": "specstream-tiny", "prompt": "1, 2, 3, 4,", "max_tokens": 1500, "temperature": 1.0,
        "seed": 1}


def test_disconnect_frees_the_slot(server):
    """A client that goes away mid-generation (about a minute of decoding) frees its slot within
    seconds, streaming or not."""
    stream = server.client().completions.create(**LONG, stream=True)
    next(iter(stream))
    assert server.get("/health")["active"] == 1
    stream.close()
    assert wait_idle(server) == 0
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    conn.request("POST", "/v1/completions", json.dumps(LONG), {"Content-Type": "application/json"})
    deadline = time.monotonic() + 10
    while not server.get("/health")["active"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.get("/health")["active"] == 1
    conn.close()
    assert wait_idle(server) == 0


def test_a_waiting_request_whose_client_left_is_not_counted():
    """/health's "waiting" counts the requests that will be decoded: one cancelled while it waits
    leaves the count at once (it is dropped when its turn comes)."""
    from mlx_specstream.scheduler import Job, Scheduler

    scheduler = Scheduler(max_active=1)  # not started: every job waits
    jobs = [Job(iter(()), lambda *_: None) for _ in range(3)]
    for job in jobs:
        scheduler.submit(job)
    assert scheduler.waiting == 3
    jobs[1].cancel()
    assert (scheduler.waiting, scheduler.active) == (2, 0)


def test_any_openai_seed_and_a_model_id_with_a_slash(model_dir):
    """A negative seed (OpenAI's are 64-bit signed) samples as reproducibly as any other; an id
    such as a Hugging Face name (``org/tiny``) is found by GET /v1/models/{id}."""
    s = Server("--model", str(model_dir), "--name", "org/tiny")
    try:
        client = s.client()
        assert client.models.retrieve("org/tiny").id == "org/tiny"
        texts = {client.completions.create(model="org/tiny", prompt="1, 2,", max_tokens=8, temperature=1.0,
                                           seed=-3).choices[0].text for _ in range(2)}
        assert len(texts) == 1
    finally:
        assert s.stop() == 0


def test_sigterm_drains_in_flight_requests(model_dir):
    s = Server("--model", str(model_dir))
    result, started = {}, threading.Event()

    def run():
        stream = s.client().completions.create(model="specstream-tiny", prompt="1, 2, 3, 4,", max_tokens=300,
                                               temperature=1.0, seed=1, stream=True)
        chunks = []
        for c in stream:
            chunks.append(c)
            started.set()
        result["finish"] = chunks[-1].choices[0].finish_reason
        result["tokens"] = sum(1 for c in chunks if c.choices[0].text)

    t = threading.Thread(target=run)
    t.start()
    assert started.wait(60)  # signalled once the reply has begun: long before its 300 tokens are out
    assert "finish" not in result
    s.proc.send_signal(signal.SIGTERM)
    t.join(60)
    assert s.proc.wait(30) == 0
    assert result["finish"] == "length" and result["tokens"] > 1
    assert s.url.startswith("http://127.0.0.1:")  # loopback unless --host says otherwise
    assert "stopped" in s.proc.stderr.read()


def test_a_second_ctrl_c_stops_now_and_cleanly(model_dir):
    """The first Ctrl-C says what it waits for; the second drops the requests left and exits 130,
    its threads ended first (it once died of SIGABRT, with tracebacks)."""
    s = Server("--model", str(model_dir))
    stream = s.client().completions.create(**LONG, stream=True)
    next(iter(stream))
    s.proc.send_signal(signal.SIGINT)
    assert s.proc.stderr.readline().startswith("stopping: 1 request to finish first (Ctrl-C again")
    s.proc.send_signal(signal.SIGINT)
    code = s.proc.wait(30)
    said = s.proc.stderr.read()
    assert code == 130, said
    assert re.search(r"stopped: [01] requests? dropped", said)  # 0: uvicorn dropped the connection first
    assert "Traceback" not in said and "terminate" not in said


def test_taken_port_is_one_error_line():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        res = subprocess.run([*SERVE, "--port", str(port)], cwd=ROOT, capture_output=True, text=True,
                             timeout=120)
    assert res.returncode == 1
    assert res.stderr.strip() == f"error: cannot listen on 127.0.0.1:{port}: Address already in use"


def test_scheduler_interleaves_pass_by_pass():
    """Every request advances to its next pass, then the passes run; a request joins when a slot
    frees and a failing one ends alone; a cancelled one is dropped before its next pass."""
    from mlx_specstream.api import StreamResponse
    from mlx_specstream.runner import PassRequest, Runner
    from mlx_specstream.scheduler import Job, Scheduler
    from mlx_specstream.tree import chain

    log, ends = [], {}
    finished = threading.Semaphore(0)

    class Logged(Runner):
        def __init__(self, name):
            self.name = name

        def step(self, tree, prune_threshold):
            log.append(f"pass {self.name}")
            return tree

    def passes(name, n, fail_at=None):
        for i in range(n):
            log.append(f"{name}{i}")
            if i == fail_at:
                raise RuntimeError("boom")
            yield PassRequest(Logged(name), chain([i]), 1.0)
            yield StreamResponse([i], str(i), [], [], "length" if i == n - 1 else None)

    def job(name, *args):
        def emit(response, error):
            if response is None:
                ends[name] = error
                finished.release()
        return Job(passes(name, *args), emit)

    sched = Scheduler(max_active=2)
    for j in (job("a", 3), job("b", 3, 1), job("c", 2)):
        sched.submit(j)
    sched.start()
    for _ in range(3):
        assert finished.acquire(timeout=10)
    assert log == ["a0", "b0", "pass a", "pass b", "a1", "b1", "pass a", "a2", "c0", "pass a", "pass c",
                   "c1", "pass c"]
    assert ends["a"] is None and ends["c"] is None and str(ends["b"]) == "boom"
    d = job("d", 100)
    d.cancel()
    sched.submit(d)
    sched.stop(timeout=10)
    assert "d0" not in log and sched.active == 0


def test_scheduler_batches_stream_passes_then_tree_passes(monkeypatch):
    """A round runs the deferred stream passes first (one batch), moves those requests on to their
    tree pass, then runs every tree pass as one batch: requests out of phase still share it."""
    import mlx_specstream.scheduler as scheduler
    from mlx_specstream.api import StreamResponse
    from mlx_specstream.runner import PassRequest, Runner
    from mlx_specstream.tree import chain

    batches = []
    monkeypatch.setattr(scheduler, "run_passes", lambda reqs: batches.append(
        sorted(("streams" if r.tree is None else "tree", r.runner.name) for r in reqs)))
    finished = threading.Semaphore(0)

    class Named(Runner):
        def __init__(self, name):
            self.name = name

    def steps(name, n, streams_first):
        """A lossless decoder with deferred streams: (stream pass, response, tree pass) per step."""
        runner = Named(name)
        if streams_first:
            yield PassRequest(runner, None)
        for i in range(n):
            yield StreamResponse([i], str(i), [], [], None)
            yield PassRequest(runner, chain([i]))
            yield PassRequest(runner, None)
        yield StreamResponse([n], str(n), [], [], "length")

    def emit(response, error):
        if response is None:
            finished.release()

    sched = scheduler.Scheduler(max_active=2)
    sched.submit(scheduler.Job(steps("a", 2, True), emit))  # waits on a stream pass first
    sched.submit(scheduler.Job(steps("b", 2, False), emit))  # on a tree pass first
    sched.start()
    for _ in range(2):
        assert finished.acquire(timeout=10)
    sched.stop(timeout=10)
    assert batches[:4] == [[("streams", "a")], [("tree", "a"), ("tree", "b")],
                           [("streams", "a"), ("streams", "b")], [("tree", "a"), ("tree", "b")]]


def test_adapters_share_the_base_arrays():
    """Every model id's base layers hold the base model's own arrays (nothing copied); the base
    keeps no adapter; each adapter adds only its own parameters."""
    from mlx.utils import tree_flatten

    from mlx_specstream.adapter import adapter_weights
    from mlx_specstream.pool import ModelPool

    pool = ModelPool(MODEL, ["sql", "code"])
    base = dict(tree_flatten(pool.base.parameters()))
    assert getattr(pool.base, "adapter", None) is None
    for model_id in ("specstream-tiny:sql", "specstream-tiny:code"):
        model = pool.get(model_id)
        own = adapter_weights(model)
        # an adapted layer holds the base layer as .base (twice over when one LoRA wraps another)
        params = {re.sub(r"(\.base)+\.", ".", k): v
                  for k, v in tree_flatten(model.parameters()) if k not in own}
        assert params.keys() == base.keys() and all(params[k] is base[k] for k in base)
    with pytest.raises(ValueError, match="this server has"):
        pool.get("specstream-tiny:sql-lossless")


def test_adapter_ids_are_their_directory_names(tmp_path):
    """An adapter copied under a new name is served under that name, beside the original (its
    config still holds the name it was trained as)."""
    from mlx_specstream.pool import ModelPool

    d = tmp_path / "specstream-tiny"
    (d / "adapters").mkdir(parents=True)
    for f in MODEL.iterdir():
        if f.name != "adapters":
            (d / f.name).symlink_to(f.resolve())
    for name in ("code", "code-v2"):
        (d / "adapters" / name).mkdir()
        for f in (MODEL / "adapters" / "code").iterdir():
            (d / "adapters" / name / f.name).symlink_to(f.resolve())
    pool = ModelPool(d, "all")
    assert [m["id"] for m in pool.describe()] == ["specstream-tiny", "specstream-tiny:code",
                                                  "specstream-tiny:code-v2"]
    assert pool.get("specstream-tiny:code-v2").adapter_config.name == "code-v2"
    assert [m["id"] for m in ModelPool(d, "code-v2, code").describe()] == [  # a string as --adapters
        "specstream-tiny", "specstream-tiny:code-v2", "specstream-tiny:code"]
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "code").symlink_to(d / "adapters" / "code-v2")
    with pytest.raises(ValueError, match="two adapters named 'code'"):  # neither may hide the other
        ModelPool(d, ["code", str(tmp_path / "other" / "code")])
    twice = f"code,code,{(d / 'adapters' / 'code').resolve()}"  # by name twice, and by path: one adapter
    assert [m["id"] for m in ModelPool(d, twice).describe()] == ["specstream-tiny", "specstream-tiny:code"]
    with pytest.raises(ValueError, match="--adapters names no adapter"):
        ModelPool(d, " , ")
    for name in ("", " ", " tiny"):  # an id no client could name
        with pytest.raises(ValueError, match="name must be a model id"):
            ModelPool(d, name=name)
    (tmp_path / "aliases").mkdir()
    (tmp_path / "aliases" / "latest").symlink_to(d / "adapters" / "code")  # another name: an id of its own
    assert [m["id"] for m in ModelPool(d, f"code,{tmp_path / 'aliases' / 'latest'}").describe()] == [
        "specstream-tiny", "specstream-tiny:code", "specstream-tiny:latest"]


@pytest.mark.slow
def test_load_mixed_requests(server, base, model_dir):
    """Heavier: 32 requests, 16 at a time, greedy and sampled, streaming and not, over every id,
    64 tokens: all complete; greedy lossless texts equal the base alone, sampled ones equal the
    same request decoded alone."""
    ids = ["specstream-tiny", "specstream-tiny:sql-lossless", "specstream-tiny:code", "specstream-tiny:sql"]
    alone = {i: load(model_dir, adapter=i.split(":")[1], fuse=False) if ":" in i else base for i in ids}
    jobs = [(ids[i % 4], SQL[i % 8], 0.8 if i % 3 == 0 else 0.0, i, i % 2 == 0) for i in range(32)]
    client = server.client()

    def one(job):
        model, prompt, temp, seed, stream = job
        kw = dict(model=model, prompt=prompt, max_tokens=64, temperature=temp, seed=seed)
        if stream:
            return "".join(c.choices[0].text for c in client.completions.create(**kw, stream=True))
        return client.completions.create(**kw).choices[0].text

    with ThreadPoolExecutor(16) as pool:
        texts = list(pool.map(one, jobs, timeout=600))
    for (model_id, prompt, temp, seed, _), text in zip(jobs, texts):
        m, tok = alone[model_id]
        mode = "ar" if model_id == "specstream-tiny" else "ss"
        assert text == generate(m, tok, prompt, max_tokens=64, temperature=temp, seed=seed, mode=mode).text
        if temp == 0 and model_id != "specstream-tiny:sql":
            assert text == ar(base, prompt, 64)


def test_bench_rounds_lossless_equals_ar_batching(tmp_path):
    """scripts/bench_rounds.py drives the server's scheduler in-process: its lossless method writes
    what AR batching writes, and its results file has a row per method."""
    out = tmp_path / "rounds.json"
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_rounds.py"), "--n", "4",
                        "--concurrency", "2", "--max-tokens", "8", "--repeats", "1",
                        "--methods", "ar=,ss-lossless=sql-lossless", "--out", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = {row["method"]: row for row in json.loads(out.read_text())["results"]}
    assert rows["ss-lossless"]["identical_to_ar"] is True and rows["ar"]["mean_accepted_tokens"] == 1.0
