"""Tokenizers from local files: Hugging Face ``tokenizer.json`` or SentencePiece ``tokenizer.model``.

:func:`load_tokenizer` reads a model directory (never the network). The :class:`Tokenizer` it
returns is what the engine uses: ``encode``, ``decode``, ``eos_token_ids``, ``bos_token_id``,
``vocab_size``, ``apply_chat_template`` and a :class:`StreamingDetokenizer` for text that is
printed while tokens arrive.
"""

from __future__ import annotations

import codecs
import functools
import json
import re
from pathlib import Path


class TokenizerError(ValueError):
    """Tokenizer files are corrupt, or lack something that was asked for."""


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TokenizerError(f"{path}: invalid JSON ({e})") from None
    return data if isinstance(data, dict) else {}


def _token_text(tok) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken dict."""
    if isinstance(tok, dict):
        return tok.get("content")
    return tok if isinstance(tok, str) else None


def _ids(value) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value if isinstance(v, int)]


def eos_ids(tokenizer) -> frozenset[int]:
    """The EOS ids of any tokenizer object (none without a tokenizer)."""
    return frozenset(getattr(tokenizer, "eos_token_ids", None) or ())


def config_eos_ids(path: Path) -> set[int]:
    """The end-of-sequence ids a model directory's configs name (``generation_config.json`` and
    ``config.json``): EOS for a tokenizer, and for a model loaded without one."""
    return {*_ids(_read_json(path / "generation_config.json").get("eos_token_id")),
            *_ids(_read_json(path / "config.json").get("eos_token_id"))}


class _HFBackend:
    """A ``tokenizers.Tokenizer`` (tokenizer.json, or vocab.json + merges.txt for GPT-2 BPE)."""

    kind = "tokenizers"

    def __init__(self, tk):
        self.tk = tk
        # tokenizers' ByteFallback decodes a run of byte pieces as a whole: if the run is not
        # valid UTF-8, every byte of it becomes U+FFFD (even ASCII ones before the bad byte).
        try:
            decoder = tk.decoder.__getstate__() if tk.decoder is not None else b""
            self.whole_byte_runs = b"ByteFallback" in decoder
        except Exception:  # an unexpected decoder: be safe
            decoder, self.whole_byte_runs = b"", True
        # byte-level BPE (GPT-2, Llama 3, Qwen): each piece's characters stand for bytes
        self._byte_level = _byte_alphabet() if b"ByteLevel" in decoder else None

    def added_texts(self) -> list[str]:
        """The texts of added tokens, which encoding matches in text as one token each."""
        return [t.content for t in self.tk.get_added_tokens_decoder().values()]

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return self.tk.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        return self.tk.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self.tk.token_to_id(token)

    def is_byte(self, i: int) -> bool:
        """A byte-fallback piece (``<0xNN>``)."""
        t = self.tk.id_to_token(i)
        return t is not None and len(t) == 6 and t.startswith("<0x") and t.endswith(">")

    def byte_value(self, i: int) -> int:
        """The byte of a byte-fallback piece."""
        return int(self.tk.id_to_token(i)[3:5], 16)

    def raw_bytes(self, i: int) -> bytes | None:
        """The bytes a piece adds to the output where it is not whole characters by itself: a
        byte-fallback piece's byte, a byte-level BPE piece's bytes; None where they are not known."""
        if self.is_byte(i):
            return bytes((self.byte_value(i),))
        piece = self.tk.id_to_token(i)
        if self._byte_level is None or piece is None or any(c not in self._byte_level for c in piece):
            return None
        return bytes(self._byte_level[c] for c in piece)

    @property
    def vocab_size(self) -> int:
        return self.tk.get_vocab_size(with_added_tokens=True)


class _SPBackend:
    """A SentencePiece model (tokenizer.model)."""

    kind = "sentencepiece"
    whole_byte_runs = False  # bytes decode one by one: complete characters can go out at once

    def __init__(self, sp):
        self.sp = sp

    def added_texts(self) -> list[str]:
        return []  # user-defined pieces decode to their text (token_texts)

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        ids = self.sp.encode(text)
        if add_special_tokens and self.sp.bos_id() >= 0:
            ids = [self.sp.bos_id(), *ids]
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        # SentencePiece never prints control symbols (<s>, </s>) and always decodes byte pieces.
        return self.sp.decode(ids)

    def token_to_id(self, token: str) -> int | None:
        i = self.sp.piece_to_id(token)
        return i if self.sp.id_to_piece(i) == token else None

    def is_byte(self, i: int) -> bool:
        return 0 <= i < self.sp.get_piece_size() and self.sp.is_byte(i)

    def raw_bytes(self, i: int) -> bytes | None:
        """A byte piece's byte (``<0xNN>``); None for other pieces (whole characters)."""
        return bytes((int(self.sp.id_to_piece(i)[3:5], 16),)) if self.is_byte(i) else None

    @property
    def vocab_size(self) -> int:
        return self.sp.get_piece_size()


class StreamingDetokenizer:
    """Turn tokens into text as they arrive.

    Each :meth:`add_token` returns the text that became final with that token. Text is held back
    while it ends in an incomplete UTF-8 sequence; with ``tokenizers``' ByteFallback decoder, a
    run of byte pieces is held until the next non-byte piece (that decoder turns a whole run
    into U+FFFD when any of it is invalid, so earlier characters of the run are not final). New
    tokens are always decoded together with the tokens just before them, so SentencePiece's
    word-start spaces and other context-dependent decoding come out as in a full decode:
    ``"".join(pieces) + finalize()`` equals ``tokenizer.decode(all_ids)``, except for a character
    cut short at the very end, which :meth:`finalize` gives as one U+FFFD after the text before it.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False):
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._byte_runs = tokenizer._backend.whole_byte_runs
        self.reset()

    def reset(self) -> None:
        self.tokens: list[int] = []
        self._prefix = 0  # tokens[_prefix:_read]: context decoded together with new tokens
        self._read = 0  # the text of tokens before _read has been emitted
        self.text = ""  # everything emitted so far

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip)

    def _pending(self, end: int | None = None) -> str:
        """The text of ``tokens[_read:end]`` (decoded with its context)."""
        before = self._decode(self.tokens[self._prefix : self._read])
        now = self._decode(self.tokens[self._prefix : end])
        if now.startswith(before):
            return now[len(before) :]
        common = 0  # the context decodes differently now: emit from where they part
        while common < min(len(before), len(now)) and before[common] == now[common]:
            common += 1
        return now[common:]

    def text_of(self, n: int) -> str:
        """The text of the first ``n`` tokens, decoded together."""
        return self._decode(self.tokens[:n])

    def add_token(self, token: int) -> str:
        """Add one token; return the text that became final (possibly "")."""
        self.tokens.append(int(token))
        if self._byte_runs and self._tokenizer.is_byte_token(token):
            return ""
        piece = self._pending()
        if not piece or piece.endswith("\ufffd"):
            return ""
        self._prefix, self._read = self._read, len(self.tokens)
        self.text += piece
        return piece

    def finalize(self) -> str:
        """The text still held back: characters whose bytes were held, and one U+FFFD for a
        character cut short at the very end (by ``max_tokens``, say). A backend that decodes a
        run of byte pieces as a whole would turn every character of the run into U+FFFD: the run
        less its last 1-3 byte pieces is decoded alone where that is clean."""
        piece = self._pending() if self._read < len(self.tokens) else ""
        if self._byte_runs and piece.endswith("\ufffd"):
            for cut in range(1, 4):  # an incomplete UTF-8 character is at most 3 bytes
                end = len(self.tokens) - cut
                if end < self._read or not self._tokenizer.is_byte_token(self.tokens[end]):
                    break
                tail = b"".join(self._tokenizer.raw_bytes(t) for t in self.tokens[end:])
                head = self._pending(end) if end > self._read else ""
                if utf8_text(tail) == "" and not head.endswith("\ufffd"):
                    piece = head + "\ufffd"
                    break
        self._prefix = self._read = len(self.tokens)
        self.text += piece
        return piece


@functools.cache
def _byte_alphabet() -> dict[str, int]:
    """Byte-level BPE's characters for bytes (GPT-2's table: printable Latin-1 bytes stand for
    themselves, the others for the code points from 256 on, in order), character -> byte."""
    kept = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    others = [b for b in range(256) if b not in kept]
    return {**{chr(b): b for b in kept}, **{chr(256 + k): b for k, b in enumerate(others)}}


@functools.lru_cache(maxsize=4096)
def utf8_text(b: bytes) -> str | None:
    """The characters of ``b``: "" where it is the beginning of one UTF-8 character, short of its
    end, that some bytes complete; None where it is neither (Python's incremental decoder takes
    ``ED A0``, a surrogate's beginning, as a beginning, which no byte completes)."""
    try:
        text = codecs.getincrementaldecoder("utf-8")().decode(b)
    except UnicodeDecodeError:
        return None
    return text if text or any(utf8_text(b + bytes((c,))) is not None for c in range(0x80, 0xC0)) else None


_GO_ON = "CONTINUE_FINAL_MESSAGE_TAG "  # marks where a continued last message ends (transformers' mark)


class Tokenizer:
    """A tokenizer read from local files; see :func:`load_tokenizer`."""

    def __init__(self, backend, path: Path, special: dict[str, str | None], bos_token_id: int | None,
                 eos_token_ids: set[int], add_bos_token: bool | None, chat_templates: dict[str, str]):
        self._backend = backend
        self.kind = backend.kind  # "tokenizers" or "sentencepiece"
        self.path = path
        self.special_tokens = special
        self.bos_token = special.get("bos_token")
        self.bos_token_id = bos_token_id
        self.eos_token_ids = set(eos_token_ids)
        # the one a text ends with (training data): the tokenizer's eos_token (a chat model's end of
        # turn, <|im_end|>, <|eot_id|>), else the smallest of the ids
        named = backend.token_to_id(special["eos_token"]) if special.get("eos_token") else None
        self.eos_token_id = named if named in self.eos_token_ids else (
            min(eos_token_ids) if eos_token_ids else None)
        self.add_bos_token = add_bos_token
        # a model may name several (transformers' "default" and "tool_use"): chat_template is the default
        self.chat_templates = chat_templates
        self.chat_template = chat_templates.get("default")  # several, none the default: none (transformers')

    def template_for(self, tools) -> str | None:
        """The chat template that renders a conversation with ``tools`` (transformers' rule: the
        one named ``tool_use`` where tools are given, an empty list too, and the model has one,
        else the default)."""
        named = self.chat_templates.get("tool_use") if tools is not None else None
        return named or self.chat_template

    def __repr__(self) -> str:
        return (f"Tokenizer({self.kind}, vocab_size={self.vocab_size}, bos={self.bos_token_id}, "
                f"eos={sorted(self.eos_token_ids)}, path={str(self.path)!r})")

    @property
    def vocab_size(self) -> int:
        return self._backend.vocab_size

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``, with the BOS token first when ``add_special_tokens`` (the name
        of ``transformers`` and mlx-lm) and the model uses one. A special token's string in the
        text (``</s>``, ``<|im_end|>``) is that token, as in ``transformers`` (a SentencePiece
        model alone: its BOS, EOS, unknown and padding tokens).

        A text that already starts with the BOS token's string (e.g. from a chat template)
        does not get a second one.
        """
        bos, bos_id = self.bos_token, self.bos_token_id
        if add_special_tokens and bos and bos_id is not None and text.startswith(bos):
            return self.rendered_ids(text)
        if self.add_bos_token is None:
            # No explicit setting: the tokenizer's own post-processor decides (tokenizer.json).
            return self._backend.encode(text, add_special_tokens=add_special_tokens)
        ids = self.rendered_ids(text)
        if add_special_tokens and self.add_bos_token and bos_id is not None:
            ids = [bos_id, *ids]
        return ids

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        """The text of ``ids`` (SentencePiece never prints its control tokens)."""
        return self._backend.decode([int(i) for i in ids], skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._backend.token_to_id(token)

    @functools.cached_property
    def token_texts(self) -> list[str]:
        """What each token adds to text it follows (a SentencePiece word-start piece keeps its
        space; a lone byte of a longer character is U+FFFD); "" for special tokens."""
        anchor = self._backend.encode("a", add_special_tokens=False)
        before = self.decode(anchor)
        texts = []
        for i in range(self.vocab_size):
            text = self.decode([*anchor, i], skip_special_tokens=True)
            if text != self.decode([*anchor, i]):
                texts.append("")  # a special token
                continue
            k = 0
            while k < min(len(text), len(before)) and text[k] == before[k]:
                k += 1
            texts.append(text[k:])
        return texts

    @functools.cached_property
    def max_token_chars(self) -> int:
        """The most characters one token stands for: a text of n characters encodes to at least
        n / this many tokens (a bound found without encoding it)."""
        return max(map(len, [*self.token_texts, *self._backend.added_texts()]), default=1) or 1

    @functools.cached_property
    def token_units(self) -> list[str | tuple[str | int, ...]]:
        """What each token adds to the output, as a constraint reads it: its text where that is
        whole characters, else (a byte-fallback piece of a byte outside ASCII, a byte-level piece
        that cuts a character) its bytes, those outside ASCII as ints; "" for special tokens and
        pieces whose bytes are not known."""
        units: list[str | tuple[str | int, ...]] = []
        for i, text in enumerate(self.token_texts):
            raw = self._backend.raw_bytes(i) if "\ufffd" in text else None
            units.append(text if "\ufffd" not in text else "" if raw is None else
                         tuple(chr(b) if b < 0x80 else b for b in raw))
        return units

    @functools.cached_property
    def unit_trie(self) -> dict:
        """The tokens' units (:attr:`token_units`) as a trie: ``node[unit]`` is the child after a
        character (str) or a byte (int); ``node[""]`` lists the tokens that end there (special
        tokens are left out)."""
        root: dict = {}
        for i, units in enumerate(self.token_units):
            if units:
                node = root
                for unit in units:
                    node = node.setdefault(unit, {})
                node.setdefault("", []).append(i)
        return root

    def is_byte_token(self, i: int) -> bool:
        """Whether ``i`` is a byte-fallback piece (``<0xNN>``)."""
        return self._backend.is_byte(int(i))

    def raw_bytes(self, i: int) -> bytes | None:
        """The bytes token ``i`` adds to the output where it is not whole characters by itself (a
        byte-fallback piece, a byte-level BPE piece); None where they are not known."""
        return self._backend.raw_bytes(int(i))

    def detokenizer(self, skip_special_tokens: bool = False) -> StreamingDetokenizer:
        return StreamingDetokenizer(self, skip_special_tokens)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            tokenize: bool = True, continue_final_message: bool = False,
                            **kwargs) -> list[int] | str:
        """Render ``messages`` ([{"role": ..., "content": ...}]) with the model's chat template:
        its token ids, or with ``tokenize=False`` its text (``transformers``' and mlx-lm's
        signature and defaults). ``continue_final_message``: the rendering ends inside the last
        message, right after its text, for the model to go on writing it (a reply's start given
        by the caller, Anthropic's prefill), as ``transformers`` cuts it; no generation prompt then.

        The template (jinja2, run sandboxed) sees ``messages``, ``add_generation_prompt``, the
        special tokens (``bos_token``, ``eos_token``, ...) and ``kwargs``. Its text is tokenized
        as ``transformers`` tokenizes it: special tokens' strings are those tokens, and no BOS is
        added (a template that wants one writes ``{{ bos_token }}``: ChatML does not).
        """
        source = self.template_for(kwargs.get("tools"))
        if not source:
            raise TokenizerError(
                f"{self.path}: the tokenizer has no chat template (no 'chat_template' in "
                "tokenizer_config.json, no chat_template.jinja); pass the prompt as plain text"
            )
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):
            raise TokenizerError(f"chat template: {message}")

        def strftime_now(fmt):
            from datetime import datetime

            return datetime.now().strftime(fmt)

        def tojson(x, indent=None, ensure_ascii=False, **_):
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent)

        if continue_final_message:
            final = messages[-1].get("content") if messages and isinstance(messages[-1], dict) else None
            if not isinstance(final, str):
                raise TokenizerError("continue_final_message: the last message must have text to continue")
            messages = [*messages[:-1], {**messages[-1], "content": final + _GO_ON}]
            add_generation_prompt = False
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = tojson
        env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now)
        try:
            template = env.from_string(source)
        except jinja2.TemplateSyntaxError as e:  # the template's own fault, not the messages'
            raise TokenizerError(f"chat template: line {e.lineno}: {e.message} (the template does not "
                                 "parse)") from None
        try:
            text = template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                   **{**self.special_tokens, **kwargs})
        except TokenizerError:  # the template's own raise_exception
            raise
        except Exception as e:  # a template's error is the messages' (None + str, say)
            raise TokenizerError(f"chat template: {e}") from None
        if continue_final_message:
            at = text.rfind(_GO_ON.strip())
            if at < 0 or not text[:at].rstrip().endswith(final.strip()):  # the text, right before the mark
                raise TokenizerError("continue_final_message: the chat template does not write the last "
                                     "message's text as it is, so there is no place to go on from")
            # where the template keeps the text's spacing it ends at the mark, else (trimmed) before
            text = text[:at] if text.startswith(_GO_ON, at) else text[:at].rstrip()
        return self.rendered_ids(text) if tokenize else text

    def rendered_ids(self, text: str) -> list[int]:
        """A text as ids, as ``transformers`` tokenizes a chat template's rendering: no BOS
        added, the special tokens' strings (``<s>``, ``</s>``, ``<|im_end|>``) those tokens. A
        SentencePiece model parses none itself: the text is cut at the special tokens' strings
        here."""
        if self.kind != "sentencepiece":
            return self._backend.encode(text, add_special_tokens=False)
        ids_of = {t: i for t in self.special_tokens.values() if t
                  if (i := self._backend.token_to_id(t)) is not None}
        if not ids_of:
            return self._backend.encode(text, add_special_tokens=False)
        out, specials = [], "|".join(map(re.escape, sorted(ids_of, key=len, reverse=True)))
        for piece in re.split(f"({specials})", text):
            if piece in ids_of:
                out.append(ids_of[piece])
            elif piece:
                out += self._backend.encode(piece, add_special_tokens=False)
        return out


def _chat_templates(path: Path, cfg: dict) -> dict[str, str]:
    """The model's chat templates by name, where transformers finds them: ``chat_template.jinja``
    (``default``) and ``additional_chat_templates/NAME.jinja``, which come before the
    ``chat_template`` of tokenizer_config.json, then of chat_template.json (a template, or a list
    of ``{"name", "template"}``)."""
    files = [path / "chat_template.jinja", *sorted((path / "additional_chat_templates").glob("*.jinja"))]
    templates = {}
    for f in files:
        if f.is_file():
            try:
                templates["default" if f.parent == path else f.stem] = f.read_text(encoding="utf-8")
            except UnicodeDecodeError as e:
                raise TokenizerError(f"{f}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    return (templates or _named_templates(cfg.get("chat_template"))
            or _named_templates(_read_json(path / "chat_template.json").get("chat_template")))


def _named_templates(template) -> dict[str, str]:
    """A config's ``chat_template`` by name: a template is the ``default``; a list of
    ``{"name": ..., "template": ...}`` names each."""
    if isinstance(template, list):
        return {t["name"]: t["template"] for t in template if isinstance(t, dict)
                and isinstance(t.get("name"), str) and isinstance(t.get("template"), str)}
    return {"default": template} if isinstance(template, str) and template else {}


def _gpt2_bpe(path: Path):
    """A byte-level BPE tokenizer from GPT-2-style vocab.json + merges.txt."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers

    tk = HFTokenizer(models.BPE.from_file(str(path / "vocab.json"), str(path / "merges.txt")))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    return tk


def _backend(path: Path):
    if (path / "tokenizer.json").is_file():
        from tokenizers import Tokenizer as HFTokenizer

        try:
            return _HFBackend(HFTokenizer.from_file(str(path / "tokenizer.json")))
        except Exception as e:  # the Rust side raises plain Exception on bad files
            raise TokenizerError(f"{path / 'tokenizer.json'}: cannot be read ({e})") from None
    if (path / "tokenizer.model").is_file():
        import sentencepiece as spm

        try:
            return _SPBackend(spm.SentencePieceProcessor(model_file=str(path / "tokenizer.model")))
        except Exception as e:  # OSError / RuntimeError on a corrupt model
            raise TokenizerError(f"{path / 'tokenizer.model'}: cannot be read ({e})") from None
    if (path / "vocab.json").is_file() and (path / "merges.txt").is_file():
        try:
            return _HFBackend(_gpt2_bpe(path))
        except Exception as e:
            raise TokenizerError(f"{path}: vocab.json/merges.txt cannot be read ({e})") from None
    return None


def load_tokenizer(path: str | Path) -> Tokenizer | None:
    """The tokenizer stored in the directory ``path``, or None when it has no tokenizer files.

    ``tokenizer.json`` (Hugging Face ``tokenizers``) is used when present, else
    ``tokenizer.model`` (SentencePiece), else GPT-2-style ``vocab.json`` + ``merges.txt``.
    ``tokenizer_config.json`` (and ``special_tokens_map.json``) give the special tokens, whether
    BOS is added and the chat template; EOS ids also come from ``generation_config.json`` and
    ``config.json``. Only local files are read.
    """
    path = Path(path)
    backend = _backend(path)
    if backend is None:
        return None
    cfg = _read_json(path / "tokenizer_config.json")
    special_map = _read_json(path / "special_tokens_map.json")
    special = {name: _token_text(cfg.get(name)) or _token_text(special_map.get(name))
               for name in ("bos_token", "eos_token", "unk_token", "pad_token")}
    sp = backend.sp if backend.kind == "sentencepiece" else None
    if sp is not None:  # a SentencePiece model names its own, where the config does not
        for name, i in (("bos_token", sp.bos_id()), ("eos_token", sp.eos_id()), ("unk_token", sp.unk_id())):
            if i >= 0 and (not special[name] or backend.token_to_id(special[name]) is None):
                special[name] = sp.id_to_piece(i)
    bos_id = backend.token_to_id(special["bos_token"]) if special["bos_token"] else None
    eos_id = backend.token_to_id(special["eos_token"]) if special["eos_token"] else None
    eos = {i for i in {eos_id} | config_eos_ids(path) if i is not None and 0 <= i < backend.vocab_size}

    add_bos = cfg.get("add_bos_token")
    if add_bos is None and sp is not None:
        add_bos = True  # SentencePiece models (llama-style) start with BOS
    return Tokenizer(backend, path, special, bos_id, eos, None if add_bos is None else bool(add_bos),
                     _chat_templates(path, cfg))
