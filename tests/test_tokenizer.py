"""Tokenizers from local files: SentencePiece and HF tokenizers, trained here on the fly."""

import io
import json
import random

import pytest

from mlx_specstream.tokenizer import TokenizerError, load_tokenizer

CORPUS = [
    "Hello world, this is a small corpus for a tiny tokenizer.",
    "Café crème brûlée à la carte, naïve façade, Straße, smørrebrød.",
    "def main(argv):\n    return sum(int(a) for a in argv)  # 42\n",
    "The quick brown fox jumps over the lazy dog; SELECT name FROM users WHERE id = 7;",
    "    indented   spaces\tand\ttabs\n\nnew paragraphs",
]

TEXTS = [
    "Hello world",
    "Café crème brûlée, naïve façade",
    "emoji 🎉🚀 and 👩‍👩‍👧 family, 日本語のテキスト, Ελληνικά, עברית",
    "double  spaces and trailing  ",
    "def f(x):\n\treturn x * 2  # ✓\n",
    "ünïcödé\u00a0nbsp — dashes – and “quotes”",
]

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{{ eos_token }}"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@pytest.fixture(scope="module")
def sp_dir(tmp_path_factory):
    """A SentencePiece BPE model with byte fallback (emoji and CJK are not in its vocabulary)."""
    import sentencepiece as spm

    d = tmp_path_factory.mktemp("sp")
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS * 10), model_writer=buf, vocab_size=400, model_type="bpe",
        byte_fallback=True, character_coverage=1.0, hard_vocab_limit=False, minloglevel=2,
        remove_extra_whitespaces=False, normalization_rule_name="identity")
    (d / "tokenizer.model").write_bytes(buf.getvalue())
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 7]}))
    return d


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory):
    """A byte-level BPE (GPT-2 style) tokenizer.json with special tokens and a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    d = tmp_path_factory.mktemp("bpe")
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|bos|>", "<|eos|>", "<|end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator(CORPUS * 10, trainer)
    tk.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<|bos|>", "eos_token": {"content": "<|eos|>", "special": True},
        "add_bos_token": True, "chat_template": CHAT_TEMPLATE}))
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": 2}))
    return d


@pytest.fixture(scope="module")
def llama_json_dir(sp_dir, tmp_path_factory):
    """tokenizer.json converted from the SentencePiece model by transformers (Metaspace, Strip)."""
    from transformers import LlamaTokenizer

    d = tmp_path_factory.mktemp("llamajson")
    (d / "tokenizer.model").write_bytes((sp_dir / "tokenizer.model").read_bytes())
    LlamaTokenizer.from_pretrained(str(d), legacy=True).save_pretrained(str(d))
    (d / "tokenizer.model").unlink()
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["add_bos_token"] = True
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    return d


@pytest.fixture(params=["sp", "bpe", "llama_json"])
def tok(request, sp_dir, bpe_dir, llama_json_dir):
    path = {"sp": sp_dir, "bpe": bpe_dir, "llama_json": llama_json_dir}[request.param]
    return load_tokenizer(path)


def stream(tok, ids):
    d = tok.detokenizer()
    pieces = [d.add_token(i) for i in ids]
    return pieces, d.finalize()


def test_no_tokenizer_files(tmp_path):
    assert load_tokenizer(tmp_path) is None


def test_kinds(sp_dir, bpe_dir, llama_json_dir):
    assert load_tokenizer(sp_dir).kind == "sentencepiece"
    assert load_tokenizer(bpe_dir).kind == "tokenizers"
    assert load_tokenizer(llama_json_dir).kind == "tokenizers"


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(tok, text):
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    assert all(0 <= i < tok.vocab_size for i in ids)


def test_bos(tok):
    ids = tok.encode("Hello world")
    assert ids[0] == tok.bos_token_id and ids[1:] == tok.encode("Hello world", add_special_tokens=False)
    # A prompt that already starts with the BOS string (chat templates) gets no second BOS.
    again = tok.encode(tok.bos_token + "Hello world")
    assert again == ids


@pytest.mark.parametrize("text", TEXTS)
def test_streaming_equals_full_decode(tok, text):
    ids = tok.encode(text, add_special_tokens=False)
    pieces, rest = stream(tok, ids)
    assert "".join(pieces) + rest == tok.decode(ids) == text
    # Text arrives as it becomes final, never as replacement characters.
    assert all("\ufffd" not in p for p in pieces)
    assert sum(1 for p in pieces if p) >= len(text.split()) // 2


def test_streaming_holds_incomplete_characters(sp_dir):
    tok = load_tokenizer(sp_dir)
    ids = tok.encode("a 🎉", add_special_tokens=False)
    assert sum(tok.is_byte_token(i) for i in ids) == 4  # the emoji is 4 byte-fallback pieces
    pieces, rest = stream(tok, ids)
    # SentencePiece decodes bytes one by one: the emoji goes out with its last byte.
    assert pieces[-4:] == ["", "", "", "🎉"] and rest == ""
    assert "".join(pieces) == "a 🎉"


def test_streaming_byte_fallback_runs(llama_json_dir):
    """tokenizers' ByteFallback turns a whole invalid byte run into U+FFFD, so byte runs wait
    for the next non-byte piece (or finalize)."""
    tok = load_tokenizer(llama_json_dir)
    ids = tok.encode("a 🎉 b", add_special_tokens=False)
    pieces, rest = stream(tok, ids)
    assert "".join(pieces) + rest == "a 🎉 b" and pieces[-3:-1] == ["", "🎉 "]
    ids = tok.encode("a 🎉", add_special_tokens=False)
    pieces, rest = stream(tok, ids)
    assert "".join(pieces) == "a " and rest == "🎉"
    broken = ids[:-1] + [tok.token_to_id("<0x41>")]  # 3 bytes of the emoji, then "A"
    pieces, rest = stream(tok, broken)
    assert "".join(pieces) + rest == tok.decode(broken) == "a \ufffd\ufffd\ufffd\ufffd"


def test_streaming_keeps_word_start_spaces(tok):
    ids = tok.encode("Hello world the lazy dog", add_special_tokens=False)
    pieces, rest = stream(tok, ids)
    assert "".join(pieces) + rest == "Hello world the lazy dog"
    assert any(p.startswith(" ") for p in pieces)


def full_text(tok, ids: list[int]) -> str:
    """The oracle: the tokenizer's decode, except for a character cut short at the very end (its
    byte pieces valid UTF-8 so far, as Python's strict decoder tells), which is one U+FFFD after
    the rest's decode (a whole-run ByteFallback decode would replace the whole run's characters)."""
    start = len(ids)
    while start > 0 and tok.is_byte_token(ids[start - 1]):
        start -= 1
    run = bytes(_byte_of(tok, i) for i in ids[start:])
    try:
        run.decode("utf-8")
    except UnicodeDecodeError as e:
        if e.reason == "unexpected end of data" and tok.decode(ids[: start + e.start])[-1:] != "\ufffd":
            return tok.decode(ids[: start + e.start]) + "\ufffd"
    return tok.decode(ids)


def _byte_of(tok, i: int) -> int:
    return next(b for b in range(256) if tok.token_to_id(f"<0x{b:02X}>") == i)


def test_streaming_random_ids(tok):
    """Arbitrary id sequences (invalid UTF-8 byte runs included) stream to the full decode."""
    rng = random.Random(0)
    for _ in range(200):
        ids = [rng.randrange(tok.vocab_size) for _ in range(rng.randrange(1, 25))]
        pieces, rest = stream(tok, ids)
        assert "".join(pieces) + rest == full_text(tok, ids), ids


def test_a_character_cut_short_at_the_end_spoils_only_itself(llama_json_dir):
    """Generation cut by max_tokens inside a character: the characters before it stay."""
    tok = load_tokenizer(llama_json_dir)
    ids = tok.encode("x éé🎉", add_special_tokens=False)
    for cut in (1, 2, 3):
        pieces, rest = stream(tok, ids[:-cut])
        assert "".join(pieces) + rest == "x éé\ufffd"


@pytest.mark.parametrize("which", ["bpe", "llama_json"])
def test_matches_transformers(which, bpe_dir, llama_json_dir):
    """Same ids and text as transformers' own tokenizer on the same files."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    d = {"bpe": bpe_dir, "llama_json": llama_json_dir}[which]
    ref = (PreTrainedTokenizerFast(tokenizer_file=str(d / "tokenizer.json")) if which == "bpe"
           else AutoTokenizer.from_pretrained(str(d)))
    tok = load_tokenizer(d)
    for text in [*TEXTS, "  leading spaces"]:
        ids = tok.encode(text, add_special_tokens=False)
        assert ids == ref.encode(text, add_special_tokens=False)
        assert tok.decode(ids) == ref.decode(ids)


def test_sentencepiece_parses_special_tokens_as_transformers(sp_dir):
    """A SentencePiece model parses no special token: their strings in a text are those tokens
    here, as transformers (and so mlx-lm) gives them; BOS is added once, not before a text that
    starts with it."""
    from transformers import AutoTokenizer

    ref, tok = AutoTokenizer.from_pretrained(str(sp_dir)), load_tokenizer(sp_dir)
    for text in ["<s>[INST] hi </s> x", "hi </s> x", "<s>hi", " <s>hi", "a<unk>b", "plain"]:
        ids = ref.encode(text, add_special_tokens=False)
        assert tok.encode(text, add_special_tokens=False) == ids
        assert tok.encode(text) == (ids if text.startswith("<s>") else [tok.bos_token_id, *ids])


def test_eos_ids(sp_dir, bpe_dir):
    sp = load_tokenizer(sp_dir)
    assert sp.eos_token_ids == {2, 7} and sp.bos_token_id == 1  # sentencepiece + generation_config
    bpe = load_tokenizer(bpe_dir)
    assert bpe.eos_token_ids == {1, 2} and bpe.bos_token_id == 0  # tokenizer_config + generation
    assert bpe.vocab_size == 400


def test_the_chat_template_is_the_one_transformers_picks(bpe_dir, tmp_path):
    """chat_template.jinja comes before tokenizer_config.json's template, and a model's
    ``tool_use`` template renders a conversation with tools (transformers' rules); a template that
    does not parse is said as the template's fault, with its line."""
    from transformers import AutoTokenizer

    d = tmp_path / "tok"
    d.mkdir()
    for f in bpe_dir.iterdir():
        (d / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg = {k: v["content"] if isinstance(v, dict) else v for k, v in cfg.items()}  # as transformers reads it
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]
    msgs = [{"role": "user", "content": "hi"}]
    tool_use = "T:{{ messages[0].content }}{% for t in tools %} {{ t.function.name }}{% endfor %}"
    named = [{"name": "default", "template": "D:{{ messages[0]['content'] }}"},
             {"name": "tool_use", "template": tool_use}]
    for setup in ("named", "jinja"):
        if setup == "named":
            (d / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": named}))
        else:
            (d / "chat_template.jinja").write_text("JINJA:{{ messages[0]['content'] }}")
        ref, tok = AutoTokenizer.from_pretrained(str(d)), load_tokenizer(d)
        for kw in ({}, {"tools": tools}, {"tools": []}):
            assert tok.apply_chat_template(msgs, tokenize=False, **kw) == ref.apply_chat_template(
                msgs, tokenize=False, add_generation_prompt=True, **kw), (setup, kw)
    assert load_tokenizer(d).apply_chat_template(msgs, tokenize=False) == "JINJA:hi"
    (d / "chat_template.jinja").unlink()  # named templates, none the default: only tools render
    (d / "additional_chat_templates").mkdir()
    (d / "additional_chat_templates" / "tool_use.jinja").write_text(tool_use)
    tok = load_tokenizer(d)
    assert tok.apply_chat_template(msgs, tokenize=False, tools=tools) == "T:hi weather"
    with pytest.raises(TokenizerError, match="no chat template"):
        tok.apply_chat_template(msgs)
    (d / "chat_template.jinja").write_text("JINJA:{{ messages[0]['content'] }}")
    (d / "chat_template.jinja").write_text("{% for m in messages %}\n{{ m.content }<|end|>{% endfor %}")
    with pytest.raises(TokenizerError, match=r"chat template: line 2: unexpected '}' \(the template does"):
        load_tokenizer(d).apply_chat_template(msgs)
    (d / "chat_template.jinja").write_bytes(b"\xff{{ x }}")
    with pytest.raises(TokenizerError, match="chat_template.jinja: not UTF-8 text"):
        load_tokenizer(d)


@pytest.mark.parametrize("which", ["sp", "bpe", "llama_json"])
def test_text_offsets_count_the_whole_characters_before_each_token(sp_dir, bpe_dir, llama_json_dir, which):
    """The server's ``text_offset``: where each token's text begins, whatever the tokenizer holds
    back (byte-fallback runs, byte-level pieces that cut a character): the whole characters of the
    tokens before it, decoded together. The oracle is the larger of two counts, each exact for one
    kind of decoder: the decoded text less the U+FFFD a cut character ends it with (byte-level BPE
    replaces only that character's bytes), and the longest cleanly decoded prefix (ByteFallback
    turns a whole run of byte pieces into U+FFFD when it ends inside a character)."""
    from mlx_specstream.server import TextOffsets

    tok = load_tokenizer({"sp": sp_dir, "bpe": bpe_dir, "llama_json": llama_json_dir}[which])
    ids = tok.encode("a 😀 b\n\n日本語 🎉🚀 x\ty 👩‍👩‍👧!", add_special_tokens=False)
    detok = tok.detokenizer()
    pieces = [detok.add_token(t) for t in ids]
    assert "" in pieces  # the case: tokens whose text comes with a later one
    offsets = TextOffsets(tok)
    got = offsets(ids[:5], pieces[:5]) + offsets(ids[5:], pieces[5:])  # across two responses
    texts = [tok.decode(ids[:i]) for i in range(len(ids))]
    clean = [max(len(t) for t in texts[:i + 1] if not t.endswith("\ufffd")) for i in range(len(ids))]
    assert got == [max(len(t.rstrip("\ufffd")), c) for t, c in zip(texts, clean)]


@pytest.mark.parametrize("which", ["sp", "llama_json"])
def test_text_offsets_after_bytes_that_are_no_character(sp_dir, llama_json_dir, which):
    """Byte tokens that make no character (a lead byte alone, a cut sequence, a stray continuation
    byte: sampling can write them) come out as U+FFFD with the next piece; a token of whole
    characters after them begins where the decoded text so far, up to it, has its text."""
    from mlx_specstream.server import TextOffsets

    tok = load_tokenizer({"sp": sp_dir, "llama_json": llama_json_dir}[which])
    byte = {b: tok.token_to_id(f"<0x{b:02X}>") for b in (0xC3, 0xE6, 0x97, 0xFF, 0x80)}
    words = [tok.encode(w, add_special_tokens=False) for w in ("the", " cat", " sat", " on")]
    ids = [*words[0], byte[0xC3], *words[1], byte[0xE6], byte[0x97], *words[2], byte[0xFF], byte[0x80],
           *words[3]]
    detok = tok.detokenizer()
    pieces = [detok.add_token(t) for t in ids]
    got = TextOffsets(tok)(ids, pieces)
    for i, t in enumerate(ids):
        units = tok.token_units[t]
        if isinstance(units, str) and units and i > 0:
            assert got[i] == len(tok.decode(ids[:i + 1])) - len(units), (i, got)
    assert got == sorted(got)


def test_chat_template(bpe_dir, sp_dir):
    tok = load_tokenizer(bpe_dir)
    msgs = [{"role": "user", "content": "Hi é"}]
    text = tok.apply_chat_template(msgs, tokenize=False)
    assert text == "<|bos|><|user|>Hi é<|eos|><|assistant|>"
    assert tok.apply_chat_template(msgs, add_generation_prompt=False, tokenize=False).endswith("<|eos|>")
    ids = tok.apply_chat_template(msgs)  # ids by default, as transformers and mlx-lm give them
    assert ids == tok.encode(text) and ids.count(tok.bos_token_id) == 1 and 1 in ids  # parsed, one BOS
    with pytest.raises(TokenizerError, match="no chat template"):
        load_tokenizer(sp_dir).apply_chat_template(msgs)
    sp = load_tokenizer(sp_dir)  # SentencePiece parses no special token: cut at their strings here
    sp.chat_template = "{{ bos_token }}[INST] {{ messages[0]['content'] }} [/INST]ok{{ eos_token }}[INST]"
    ids = sp.apply_chat_template(msgs)
    eos = sp.special_tokens["eos_token"]
    assert ids == [sp.bos_token_id, *sp.encode("[INST] Hi é [/INST]ok", add_special_tokens=False),
                   sp.token_to_id(eos), *sp.encode("[INST]", add_special_tokens=False)]


CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CHATML_EOS = CHATML.replace("<|im_end|>", "{{ eos_token }}")  # its turns ended by EOS, as Qwen's <|im_end|>


@pytest.mark.parametrize("which,template",
                         [("llama_json", CHATML), ("bpe", CHATML_EOS), ("bpe", CHAT_TEMPLATE)])
def test_chat_ids_and_chat_rows_are_transformers(llama_json_dir, bpe_dir, tmp_path, which, template):
    """A template's ids are transformers' (tokenize=True): no BOS added where the template writes
    none (ChatML on a tokenizer that adds BOS to text), one where it does; a chat row trains on
    what mlx-lm's chat data set does: the whole conversation as the template renders it, the
    prompt the rendering of the turns before the reply with the assistant's turn begun."""
    from transformers import AutoTokenizer

    from mlx_specstream.data import DataError, encode_row

    d = tmp_path / "tok"
    d.mkdir()
    for f in {"llama_json": llama_json_dir, "bpe": bpe_dir}[which].iterdir():
        (d / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg = {k: v["content"] if isinstance(v, dict) else v for k, v in cfg.items()}  # as transformers reads it
    (d / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": template}))
    ref, tok = AutoTokenizer.from_pretrained(str(d)), load_tokenizer(d)
    assert tok.encode("Hello")[0] == tok.bos_token_id  # a text prompt gets a BOS: a rendering does not
    convo = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello world"},
             {"role": "assistant", "content": "Café crème"}]

    def hf(messages, generation):
        return ref.apply_chat_template(messages, add_generation_prompt=generation, return_dict=False)

    prompt = tok.apply_chat_template(convo[:-1])
    assert prompt == hf(convo[:-1], True)
    for text in ("Café", "Café ", "SELECT name\n"):  # a reply begun by the caller goes on from its text
        begun = [*convo[:-1], {"role": "assistant", "content": text}]
        assert tok.apply_chat_template(begun, continue_final_message=True) == ref.apply_chat_template(
            begun, continue_final_message=True, return_dict=False)
    # a template that leaves out part of the message (a reasoning model's): no place to go on from,
    # even where an earlier message holds the text (transformers' check looks anywhere: it cuts)
    tok.chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'].split('</think>')[-1] }}"
                         "{% endfor %}")
    said = [{"role": "user", "content": "Say <think>x</think>4"},
            {"role": "assistant", "content": "<think>x</think>4"}]
    with pytest.raises(TokenizerError, match="no place to go on from"):
        tok.apply_chat_template(said, continue_final_message=True)
    tok.chat_template = template
    assert (prompt[0] == tok.bos_token_id) == template.startswith("{{ bos_token }}")
    # the reply as the template ends its turn, and EOS after it where that turn's end is not one
    eos = [] if "eos_token" in template else [tok.eos_token_id]
    ex = encode_row({"messages": convo}, tok)
    assert ex.tokens == hf(convo, False) + eos and ex.n_prompt == len(prompt)
    ex = encode_row({"prompt": "Hello world", "completion": "Café crème"}, tok, chat_template=True)
    assert ex.tokens == hf(convo[1:], False) + eos and ex.n_prompt == len(hf(convo[1:2], True))
    ex = encode_row({"prompt": "Hello world", "completion": "Café crème"}, tok, chat_template=True,
                    system="Be brief.")  # train --system-prompt: the system turn first, as generate sends it
    assert ex.tokens == hf(convo, False) + eos and ex.n_prompt == len(prompt)
    said = [*convo[:-1], {"role": "assistant", "content": f"a {tok.special_tokens['eos_token']} b"}]
    assert encode_row({"messages": said}, tok).tokens == hf(said, False) + eos  # its end of turn decides
    with pytest.raises(DataError, match="x:1: the chat template renders no prompt before the reply"):
        tok.chat_template = "{% if not add_generation_prompt %}{{ messages[-1]['content'] }}{% endif %}"
        encode_row({"messages": convo}, tok, where="x:1")


def test_chat_template_file(bpe_dir, tmp_path):
    for name in ("tokenizer.json", "generation_config.json"):
        (tmp_path / name).write_bytes((bpe_dir / name).read_bytes())
    (tmp_path / "chat_template.jinja").write_text("{% for m in messages %}[{{ m.content }}]{% endfor %}")
    tok = load_tokenizer(tmp_path)
    assert tok.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False) == "[x]"
    assert tok.bos_token_id is None and tok.encode("Hello") == tok.encode("Hello", add_special_tokens=False)


def test_gpt2_vocab_merges(bpe_dir, tmp_path):
    """vocab.json + merges.txt (GPT-2 / OPT checkpoints without tokenizer.json)."""
    model = json.loads((bpe_dir / "tokenizer.json").read_text())["model"]
    (tmp_path / "vocab.json").write_text(json.dumps(model["vocab"]))
    merges = [" ".join(m) if isinstance(m, list) else m for m in model["merges"]]
    (tmp_path / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    tok = load_tokenizer(tmp_path)
    ref = load_tokenizer(bpe_dir)
    for text in TEXTS:
        assert tok.encode(text, add_special_tokens=False) == ref.encode(text, add_special_tokens=False)
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


def test_corrupt_files(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="tokenizer.json"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").unlink()
    (tmp_path / "tokenizer.model").write_bytes(b"\x00garbage")
    with pytest.raises(TokenizerError, match="tokenizer.model"):
        load_tokenizer(tmp_path)


def test_shipped_tokenizer_agrees_with_sentencepiece():
    """The project's own tokenizer: tokenizer.json and tokenizer.model give the same ids."""
    from pathlib import Path

    src = Path(__file__).resolve().parent.parent / "models" / "specstream-tiny" / "hf"
    if not (src / "tokenizer.model").is_file() or not (src / "tokenizer.json").is_file():
        pytest.skip("no shipped tokenizer")
    import shutil
    import tempfile

    hf = load_tokenizer(src)
    with tempfile.TemporaryDirectory() as d:
        shutil.copy(src / "tokenizer.model", d)
        sp = load_tokenizer(d)
        for text in TEXTS:
            assert hf.encode(text) == sp.encode(text)
            ids = hf.encode(text, add_special_tokens=False)
            assert hf.decode(ids) == sp.decode(ids) == text


def test_token_units_are_what_decoding_writes(tok):
    """``token_units`` (what a constraint reads: text, or bytes where a token is not whole
    characters): put together as UTF-8 they are the decoded text, for token sequences that mix
    pieces and characters written byte by byte (after an anchor: SentencePiece drops a text's first
    space)."""
    units = tok.token_units
    by_byte = {u[0]: i for i, u in enumerate(units) if isinstance(u, tuple) and len(u) == 1}
    assert set(range(128, 256)) <= set(by_byte)  # byte fallback, or byte-level BPE's alphabet
    pieces = [i for i, u in enumerate(units) if u]
    chars = sorted({c for t in TEXTS for c in t if ord(c) > 127})
    anchor = tok.encode("a", add_special_tokens=False)
    rng = random.Random(1)
    checked = 0
    for _ in range(300):
        ids = []
        for _ in range(rng.randrange(1, 10)):
            if rng.random() < 0.5:
                ids.append(rng.choice(pieces))
            else:
                ids += [by_byte[b] for b in rng.choice(chars).encode()]
        raw = b"".join(x.encode() if isinstance(x, str) else bytes((x,)) for i in ids for x in units[i])
        try:
            want = raw.decode()
        except UnicodeDecodeError:
            continue
        assert tok.decode(anchor + ids) == tok.decode(anchor) + want, ids
        checked += 1
    assert checked > 100


def test_constraints_put_bytes_together(tok):
    """A constraint reads byte tokens as the characters they make: texts drawn at random under a
    JSON schema's constraint (byte tokens are most of these small vocabularies) decode to JSON the
    schema allows, with no U+FFFD; an enum's value outside ASCII is written whole, never a
    character that shares its first bytes."""
    from helpers import drawn_texts

    from mlx_specstream.json_grammar import json_constraint

    values = ["Café", "thé", "日本語", "🎉"]
    for schema in ({"enum": values}, {"type": "array", "items": {"type": "string"}, "maxItems": 3}):
        c = json_constraint(tok, schema)
        ended = 0
        for ids, done in drawn_texts(c, tok, n=10, max_tokens=120, check_masks=False):
            if done:
                ended += 1
                value = json.loads(tok.decode(ids))
                assert "\ufffd" not in tok.decode(ids)
                assert value in values if "enum" in schema else all(isinstance(v, str) for v in value)
        assert ended >= 5
