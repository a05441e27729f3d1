"""JSONL training data: formats, chat template, length policy, and clear errors."""

import json
import re

import pytest

from mlx_specstream.data import DataError, encode_row, load_datasets, load_jsonl


class CharTokenizer:
    """One token per character (ids 3..), BOS 1, EOS 2, and a toy chat template."""

    bos_token_id = 1
    eos_token_ids = [2]

    def encode(self, text, add_special_tokens=True):
        if text.startswith("<s>"):
            return [1] + [3 + ord(c) % 200 for c in text[3:]]
        return ([1] if add_special_tokens else []) + [3 + ord(c) % 200 for c in text]

    def apply_chat_template(self, messages, add_generation_prompt=True, tools=None):
        body = "".join(f"<{m['role']}>{m['content']}" for m in messages)
        listed = "".join(f"<tool>{t['function']['name']}" for t in tools or [])
        return "<s>" + listed + body + ("<assistant>" if add_generation_prompt else "")


def write(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_prompt_completion_text_and_ids(tmp_path):
    tok = CharTokenizer()
    f = write(tmp_path / "train.jsonl", [
        {"prompt": "ab", "completion": "cd", "meta": {"x": 1}},
        {"text": "xyz"},
        {"prompt": [5, 6, 7], "completion": [8, 9]},
        "",
        {"text": [4, 5, 6]},
    ])
    ds = load_jsonl(f, tok)
    assert len(ds) == 4 and ds.n_lines == 4
    e = ds.examples[0]
    assert e.tokens == tok.encode("ab") + tok.encode("cd", add_special_tokens=False) + [2]
    assert e.n_prompt == 3 and e.n_targets == 3  # the completion and EOS carry the loss
    assert ds.examples[1].tokens == tok.encode("xyz") + [2] and ds.examples[1].n_prompt == 1
    assert ds.examples[2].tokens == [5, 6, 7, 8, 9] and ds.examples[2].n_prompt == 3
    assert ds.examples[3].tokens == [4, 5, 6] and ds.examples[3].n_prompt == 1
    assert ds.summary()["target_tokens"] == 3 + 4 + 2 + 2


def test_chat_template(tmp_path):
    tok = CharTokenizer()
    e = encode_row({"prompt": "hi", "completion": "yo"}, tok, chat_template=True)
    prompt = tok.encode("<s><user>hi<assistant>")
    assert e.tokens[: e.n_prompt] == prompt
    assert e.tokens[e.n_prompt:] == tok.encode("yo", add_special_tokens=False) + [2]
    msgs = {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"},
                         {"role": "assistant", "content": "a"}]}
    for chat_template in (True, False):  # messages are rendered by the template whatever the flag
        e = encode_row(msgs, tok, chat_template=chat_template)
        assert e.tokens[: e.n_prompt] == tok.encode("<s><system>s<user>q<assistant>")
    tools = [{"type": "function", "function": {"name": "f"}}]
    e = encode_row({**msgs, "tools": tools}, tok)  # as mlx-lm: the template sees them
    assert e.tokens[: e.n_prompt] == tok.encode("<s><tool>f<system>s<user>q<assistant>")
    e = encode_row({"prompt": "hi", "completion": "yo", "tools": tools}, tok, chat_template=True)
    assert e.tokens[: e.n_prompt] == tok.encode("<s><tool>f<user>hi<assistant>")
    with pytest.raises(DataError, match="x:1: 'tools' go to the chat template.*: ask for it, or drop them"):
        encode_row({"prompt": "hi", "completion": "yo", "tools": tools}, tok, where="x:1")
    for row in ({"text": "hi"}, {"prompt": [1, 5], "completion": [6]}):  # no template renders these
        with pytest.raises(DataError, match="x:1: 'tools' go to the chat template.*: drop them from"):
            encode_row({**row, "tools": tools}, tok, chat_template=True, where="x:1")
    assert encode_row({"text": "hi"}, tok).text
    assert not encode_row({"prompt": "h", "completion": "i"}, tok).text  # a prompt row, however short
    with pytest.raises(DataError, match="x:1: 'tools' must be a list of objects"):
        encode_row({**msgs, "tools": "f"}, tok, where="x:1")
    f = write(tmp_path / "train.jsonl", [{"prompt": "hi", "completion": "yo"}, msgs])
    (note,) = load_jsonl(f, tok).notes
    said = "train.jsonl: the model has a chat template, and 1 prompts are not in it: {} wraps each in a " \
        "user turn, as a chat client's requests are"
    assert (note, note.render("cli")) == (said.format("chat_template"), said.format("--chat-template"))
    assert load_jsonl(f, tok, chat_template=True).notes == []


def test_length_policy_counts(tmp_path):
    rows = [{"prompt": [1, 2], "completion": list(range(3, 3 + n))} for n in (2, 6, 10)]
    rows.append({"prompt": list(range(1, 10)), "completion": [5]})  # prompt alone too long
    f = write(tmp_path / "train.jsonl", rows)
    ds = load_jsonl(f, max_seq_len=6, policy="truncate")
    assert [len(e.tokens) for e in ds.examples] == [4, 6, 6]
    assert (ds.n_truncated, ds.n_skipped) == (2, 1)
    assert any("truncated 2 of 4" in n for n in ds.notes)
    assert "train.jsonl: skipped 1 of 4 examples (a prompt of 6 tokens or more, no room for its completion)" \
        in ds.notes
    ds = load_jsonl(f, max_seq_len=6, policy="skip")
    assert [len(e.tokens) for e in ds.examples] == [4] and ds.n_skipped == 3
    assert ds.notes[-1] == "train.jsonl: skipped 3 of 4 examples (longer than 6 tokens)"
    with pytest.raises(DataError, match="no usable examples"):
        load_jsonl(f, max_seq_len=3, policy="skip")
    with pytest.raises(ValueError, match="length_policy must be one of truncate, skip"):
        load_jsonl(f, policy="drop")


def test_errors_name_file_and_line(tmp_path):
    empty = write(tmp_path / "empty.jsonl", ["", "  "])
    with pytest.raises(DataError, match="empty file"):
        load_jsonl(empty)
    bad = write(tmp_path / "bad.jsonl", [{"text": [1, 2]}, {"text": [1, 2]}, '{"text": [1, 2'])
    with pytest.raises(DataError, match=r"bad.jsonl:3: invalid JSON"):
        load_jsonl(bad)
    keys = write(tmp_path / "keys.jsonl", [{"text": [1, 2]}, {"question": "q", "answer": "a"}])
    with pytest.raises(DataError, match=r"keys.jsonl:2: expected keys .*found: answer, question"):
        load_jsonl(keys)
    half = write(tmp_path / "half.jsonl", [{"prompt": "q"}])
    with pytest.raises(DataError, match=r"half.jsonl:1: has 'prompt' but no 'completion'"):
        load_jsonl(half, CharTokenizer())
    text = write(tmp_path / "text.jsonl", [{"text": "hello"}])
    with pytest.raises(DataError, match="needs a tokenizer"):
        load_jsonl(text)
    mixed = write(tmp_path / "mixed.jsonl", [{"prompt": "q", "completion": [1]}])
    with pytest.raises(DataError, match="both be strings"):
        load_jsonl(mixed, CharTokenizer())
    big = write(tmp_path / "big.jsonl", [{"text": [1, 2]}, {"text": [1, 99]}])
    with pytest.raises(DataError, match=r"big.jsonl:2: token id out of range"):
        load_jsonl(big, vocab_size=64)
    arr = write(tmp_path / "arr.jsonl", ["[1, 2]"])
    with pytest.raises(DataError, match=r"expected a JSON object, got list \(a JSONL file holds one object"):
        load_jsonl(arr)
    # json.dump(rows, indent=2), as a new user wrote it (found by a walkthrough)
    (tmp_path / "pretty.jsonl").write_text(json.dumps([{"prompt": "q", "completion": "a"}], indent=2))
    with pytest.raises(DataError, match="pretty.jsonl:1: invalid JSON at column 2: .*; a JSONL file holds "
                                        "one whole JSON object on each line"):
        load_jsonl(tmp_path / "pretty.jsonl")
    with pytest.raises(DataError, match="no such file"):
        load_jsonl(tmp_path / "missing.jsonl")


def test_load_datasets(tmp_path):
    with pytest.raises(DataError, match="no such data directory"):
        load_datasets(tmp_path / "nope")
    with pytest.raises(DataError, match="no train.jsonl$"):
        load_datasets(tmp_path)
    write(tmp_path / "train.json", [{"text": [1, 2, 3]}])  # the files a walkthrough named so
    write(tmp_path / "val.jsonl", [{"text": [1, 2, 3]}])
    with pytest.raises(DataError, match=r"no train.jsonl \(it holds train.json, val.jsonl: the files read "
                                        r"are named train.jsonl and valid.jsonl\)"):
        load_datasets(tmp_path)
    (tmp_path / "train.json").rename(tmp_path / "train.jsonl")
    said = []
    assert load_datasets(tmp_path, say=said.append)[1] is None
    assert said == [f"{tmp_path}: no valid.jsonl; val.jsonl not read (name validation data valid.jsonl)"]
    (tmp_path / "val.jsonl").unlink()
    (tmp_path / "train.jsonl").unlink()
    (tmp_path / "train.jsonl").mkdir()  # there, but no file: said as what it is
    with pytest.raises(DataError, match="train.jsonl is a directory: train.jsonl must be a JSONL file"):
        load_datasets(tmp_path)
    (tmp_path / "train.jsonl").rmdir()
    write(tmp_path / "train.jsonl", [{"text": [1, 2, 3]}])
    with pytest.raises(DataError, match="is a file: give the directory that holds train.jsonl"):
        load_datasets(tmp_path / "train.jsonl")
    train, valid = load_datasets(tmp_path)
    assert len(train) == 1 and valid is None
    with pytest.raises(DataError, match="no valid.jsonl"):
        load_datasets(tmp_path, require_valid=True)
    (tmp_path / "valid.jsonl").mkdir()
    with pytest.raises(DataError, match="valid.jsonl is a directory"):
        load_datasets(tmp_path)
    assert load_datasets(tmp_path, valid=False)[1] is None
    (tmp_path / "valid.jsonl").rmdir()
    write(tmp_path / "valid.jsonl", [{"text": [1, 2]}, {"text": [3, 4]}])
    train, valid = load_datasets(tmp_path)
    assert len(valid) == 2


def test_tokenizing_bar_shows_only_when_asked(tmp_path, capsys):
    """Tokenizing that takes seconds draws a bar on stderr; ``progress=False`` (train's, a
    notebook's) draws none."""
    import time

    class SlowTokenizer(CharTokenizer):
        def encode(self, text, add_special_tokens=True):
            time.sleep(0.45)
            return super().encode(text, add_special_tokens)

    f = write(tmp_path / "train.jsonl", [{"text": "ab"}] * 6)
    for progress in (False, True):
        assert len(load_jsonl(f, SlowTokenizer(), progress=progress)) == 6
        assert ("tokenizing train.jsonl" in capsys.readouterr().err) is progress


def test_every_assistant_reply_of_a_conversation_is_learned(tmp_path):
    """A conversation is one example per assistant reply, each after the conversation before it
    as a chat client sends it (the prompts written out by hand below); tool calls, empty replies
    and other roles are context only."""
    tok = CharTokenizer()
    chat = [{"role": "system", "content": "s"}, {"role": "user", "content": "q1"},
            {"role": "assistant", "content": "a1"}, {"role": "user", "content": "q2"},
            {"role": "assistant", "content": None,
             "tool_calls": [{"id": "1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "content": "42"}, {"role": "assistant", "content": ""},
            {"role": "user", "content": "q3"},
            {"role": "assistant", "content": [{"type": "text", "text": "a3"}]}]
    f = write(tmp_path / "train.jsonl", [{"messages": chat}, {"prompt": "p", "completion": "c"}])
    ds = load_jsonl(f, tok)
    expected = [("<s><system>s<user>q1<assistant>", "a1"),  # a tool call's None content is "", as served
                ("<s><system>s<user>q1<assistant>a1<user>q2<assistant><tool>42<assistant><user>q3"
                 "<assistant>", "a3"), ("p", "c")]
    assert [(e.tokens[: e.n_prompt], e.tokens[e.n_prompt:]) for e in ds.examples] == [
        (tok.encode(p), tok.encode(c, add_special_tokens=False) + [2]) for p, c in expected]
    assert (ds.n_lines, ds.n_read, len(ds)) == (2, 3, 3)
    assert ds.summary()["read"] == 3
    short = load_jsonl(f, tok, max_seq_len=ds.examples[1].n_prompt + 1)  # the second reply is cut
    assert (len(short), short.n_truncated) == (3, 1)
    assert "truncated 1 of 3 examples" in short.notes[-1]
    with pytest.raises(DataError, match="train.jsonl:1: 'messages' must be a list ending with an assistant"):
        load_jsonl(write(tmp_path / "train.jsonl", [{"messages": chat[:4]}]), tok)
    # a role the server would refuse (ShareGPT's "human"), or none: a template would render it as it
    # happens to (found by a walkthrough: trained on, without a word)
    for role, said in (({"role": "human"}, "'role' must be one of system, developer, user, assistant, tool, "
                                           'function, not "human"'),
                       ({}, "must be an object with a 'role' and a 'content'")):
        rows = [{"messages": [{**role, "content": "q"}, {"role": "assistant", "content": "a"}]}]
        with pytest.raises(DataError, match=re.escape(f"train.jsonl:1: messages[0]{':' if role else ''}")
                           + ".*" + re.escape(said)):
            load_jsonl(write(tmp_path / "train.jsonl", rows), tok)


def test_chat_template_without_one_names_the_option():
    from mlx_specstream.api import DEFAULT_MODEL
    from mlx_specstream.data import encode_row
    from mlx_specstream.errors import OptionError
    from mlx_specstream.tokenizer import load_tokenizer

    tok = load_tokenizer(DEFAULT_MODEL)  # the shipped model's tokenizer has no chat template
    assert tok.chat_template is None
    with pytest.raises(OptionError) as e:
        encode_row({"prompt": "a", "completion": "b"}, tok, chat_template=True, where="x:1")
    assert e.value.render("cli").startswith("--chat-template needs the model's chat template")
    msgs = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    with pytest.raises(DataError, match="x:2: 'messages' rows need the model's chat template, and its "
                                        "tokenizer has none"):
        encode_row(msgs, tok, where="x:2")


def shipped_tokenizer_copy(dest, edit_json=None, generation_eos=None):
    """The shipped tokenizer's files in ``dest``, its tokenizer.json edited by ``edit_json``."""
    from mlx_specstream.api import DEFAULT_MODEL
    from mlx_specstream.tokenizer import load_tokenizer

    if not (DEFAULT_MODEL / "tokenizer.json").is_file():
        pytest.skip("the default model is not built")
    dest.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (dest / name).write_bytes((DEFAULT_MODEL / name).read_bytes())
    if edit_json is not None:
        cfg = json.loads((dest / "tokenizer.json").read_text())
        edit_json(cfg)
        (dest / "tokenizer.json").write_text(json.dumps(cfg))
    if generation_eos is not None:
        (dest / "generation_config.json").write_text(json.dumps({"eos_token_id": generation_eos}))
    return load_tokenizer(dest)


def test_a_completion_is_tokenized_as_it_follows_its_prompt(tmp_path):
    """A tokenizer that marks the start of a text (SentencePiece's "▁", Llama and Mistral) marks
    the prompt's start only: the example is the encoding of prompt and completion together
    (the oracle), the prompt's tokens first, not a completion that begins with a word-start mark."""
    tok = shipped_tokenizer_copy(tmp_path / "tok",
                                 lambda c: c["pre_tokenizer"].update(prepend_scheme="first"))
    prompt, completion = "### SQL:\n", "SELECT name FROM t"
    alone = tok.encode(completion, add_special_tokens=False)
    assert alone != tok.encode(prompt + completion)[len(tok.encode(prompt)):]
    e = encode_row({"prompt": prompt, "completion": completion}, tok)
    assert e.tokens == tok.encode(prompt + completion) + [tok.eos_token_id]
    assert e.n_prompt == len(tok.encode(prompt))


def test_a_completion_ends_with_the_tokenizers_eos_token(tmp_path):
    """With several EOS ids (a chat model's end of turn and end of text), the one its
    ``eos_token`` names ends each completion, not the smallest id."""
    tok = shipped_tokenizer_copy(tmp_path / "tok", generation_eos=[1, 2])  # eos_token "</s>" is 2
    assert tok.eos_token_ids == {1, 2} and tok.eos_token_id == 2
    assert encode_row({"prompt": "a", "completion": "b"}, tok).tokens[-1] == 2


def test_message_contents_and_text_are_checked(tmp_path):
    tok = CharTokenizer()
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    msgs = {"messages": [{"role": "user", "content": parts}, {"role": "assistant", "content": "yo"}]}
    assert encode_row(msgs, tok, chat_template=True).tokens == encode_row(
        {"messages": [{"role": "user", "content": "ab"}, {"role": "assistant", "content": "yo"}]}, tok,
        chat_template=True).tokens  # OpenAI's text parts, as the server reads them
    for content in (None, 5, [{"type": "image_url", "image_url": "x"}]):
        bad = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": content}]}
        with pytest.raises(DataError, match="x.jsonl:3: a message's 'content' must be text"):
            encode_row(bad, tok, chat_template=True, where="x.jsonl:3")
    tools = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": None},
                          {"role": "tool", "content": "42"}, {"role": "assistant", "content": "a"}]}
    tail = tok.encode("a", add_special_tokens=False) + [2]
    assert encode_row(tools, tok, chat_template=True).tokens[-2:] == tail
    with pytest.raises(DataError, match="x.jsonl:4: give 'messages' or 'prompt' and 'completion', not both"):
        encode_row({**msgs, "prompt": "a", "completion": "b"}, tok, where="x.jsonl:4")
    with pytest.raises(DataError, match="x.jsonl:5: give 'prompt' and 'completion' or 'text', not both"):
        encode_row({"prompt": "a", "completion": "b", "text": "c"}, tok, where="x.jsonl:5")
    f = write(tmp_path / "sur.jsonl", ['{"prompt": "a\\ud800", "completion": "b"}'])
    with pytest.raises(DataError, match=r"sur.jsonl:1: 'prompt' is not valid Unicode text"):
        load_jsonl(f, tok)
    f = write(tmp_path / "dup.jsonl", ['{"prompt": "a", "completion": "b", "completion": ""}'])
    with pytest.raises(DataError, match="dup.jsonl:1: the key 'completion' is given twice"):
        load_jsonl(f, tok)


def test_a_row_the_chat_template_refuses_names_its_file_and_line(tmp_path):
    """A Llama-2-style template raises on roles that do not alternate and fails on a None it adds to text
    (``+`` of a string and a None field): either is one DataError naming the row, not a traceback."""
    tok = shipped_tokenizer_copy(tmp_path / "tok")
    tok.chat_template = ("{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
                         "{{ raise_exception('Conversation roles must alternate') }}{% endif %}"
                         "{{ '[' + m['role'] + '] ' + m['content'] }}"
                         "{% if 'n' in m %}{{ '' + m['n'] }}{% endif %}{% endfor %}")
    ok = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    turns = {"messages": [{"role": "user", "content": "q"}, {"role": "user", "content": "q"},
                          {"role": "assistant", "content": "a"}]}
    none = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "n": None},
                         {"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    f = write(tmp_path / "train.jsonl", [ok, ok, turns])
    with pytest.raises(DataError, match=r"train.jsonl:3: chat template: Conversation roles must alternate$"):
        load_jsonl(f, tok, chat_template=True)
    f = write(tmp_path / "none.jsonl", [none])
    with pytest.raises(DataError, match=r"none.jsonl:1: chat template: can only concatenate str"):
        load_jsonl(f, tok, chat_template=True)


def test_a_chat_template_taking_keywords_through_kwargs_begins_the_assistants_turn():
    """mlx-lm's TokenizerWrapper takes ``add_generation_prompt`` through ``**kwargs``: the prompt
    still ends with the assistant's turn begun, as with a tokenizer that names the keyword."""
    class Wrapped(CharTokenizer):
        def apply_chat_template(self, messages, **kwargs):
            return super().apply_chat_template(messages, **kwargs)

    row = {"prompt": "hi", "completion": "yo"}
    assert encode_row(row, Wrapped(), chat_template=True).tokens == encode_row(
        row, CharTokenizer(), chat_template=True).tokens


def test_tool_rows_hold_calls_the_server_returns_as_calls(tmp_path):
    """A row's tools are OpenAI's definitions, and each call names one of them with arguments that
    are a JSON object: what the server reads back as a call (else the adapter would learn text that
    comes back as content, or JSON that no client parses)."""
    tok = shipped_tokenizer_copy(tmp_path / "tok")
    tok.chat_template = ("{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}"
                         "{% for c in m['tool_calls'] or [] %}<call>{{ c['function'] | tojson }}</call>"
                         "{% endfor %}{% endfor %}"
                         "{% if add_generation_prompt %}[assistant]{% endif %}")
    weather = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}

    def row(name="weather", arguments='{"city": "Oslo"}', tools=(weather,)):
        call = {"id": "c", "type": "function", "function": {"name": name, "arguments": arguments}}
        reply = {"role": "assistant", "content": None, "tool_calls": [call]}
        return {"tools": list(tools), "messages": [{"role": "user", "content": "q"}, reply]}

    def calling(calls):  # a reply whose tool_calls are not calls
        return {**row(), "messages": [row()["messages"][0], {"role": "assistant", "tool_calls": calls}]}

    assert encode_row(row(), tok).tokens and encode_row(row(arguments={"city": "Oslo"}), tok).tokens
    flat = [{"type": "function", "name": "weather"}]  # not OpenAI's shape: refused in a prompt row too
    with pytest.raises(DataError, match=re.escape("x.jsonl:3: 'tools[0]' must be")):
        encode_row({"prompt": "q", "completion": "a", "tools": flat}, tok, chat_template=True,
                   where="x.jsonl:3")
    ds = load_jsonl(write(tmp_path / "train.jsonl", [row()]), tok, chat_template=True, system="Be brief.")
    assert any("system prompt goes before prompt/completion rows only: 1 'messages' rows keep" in str(n)
               for n in ds.notes)  # it is not added to a conversation, which says its own
    for bad, said in [(row(arguments="{city: Paris"), "function.arguments must be a JSON object"),
                      (row(arguments="[1, 2]"), "function.arguments must be a JSON object"),
                      (row(name="time"), "calls 'time', which is not one of the row's tools (weather)"),
                      (row(tools=[{"type": "function", "name": "weather"}]), "'tools[0]' must be"),
                      (calling("x"), "x.jsonl:2: messages[1].tool_calls must be a list of calls"),
                      (calling([{}]), 'x.jsonl:2: messages[1].tool_calls[0] must be {"type": "func')]:
        with pytest.raises(DataError, match=re.escape(said)):
            encode_row(bad, tok, where="x.jsonl:2")


def test_a_tool_calling_history_trains_on_what_the_server_renders(tmp_path):
    """An assistant turn that only calls a tool (content None) reads as "" in a training row and in
    a request to the server alike: the prompt learned is the server's prompt for that history."""
    from mlx_specstream.server import _chat_prompt

    tok = shipped_tokenizer_copy(tmp_path / "tok")
    tok.chat_template = ("{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
                         "{% if add_generation_prompt %}[assistant]{% endif %}")
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    history = [{"role": "user", "content": "hi"},
               {"role": "assistant", "content": None, "tool_calls": [call]},
               {"role": "tool", "tool_call_id": "c1", "content": "42"}]
    served = _chat_prompt({"messages": history}, tok)
    assert served == "[user]hi[assistant][tool]42[assistant]"  # no "None"
    ex = encode_row({"messages": [*history, {"role": "assistant", "content": "It is 42."}]}, tok)
    assert ex.tokens[: ex.n_prompt] == tok.rendered_ids(served)
    from mlx_specstream.server import APIError

    image = [{"type": "image_url", "image_url": {"url": "x"}}]  # said by its index, as JSON
    with pytest.raises(APIError, match=re.escape("messages[1]: a message's 'content' must be text (a string "
                                                 'or a list of text parts), not [{"type": "image_url"')):
        _chat_prompt({"messages": [history[0], {"role": "user", "content": image}]}, tok)
