"""Python API: ``load``, ``generate``, ``stream_generate`` (mlx-lm-like, notebook friendly)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from .adapter import fuse as fuse_adapter
from .adapter import load_adapter
from .arch import CausalLM
from .engine import DecodeOptions, Decoder, Stats, check_prompt_ids
from .errors import ContextLengthError, OptionError, check_keywords, check_switch
from .loader import load_model, model_dir
from .logprobs import TokenLogprob
from .project import DEFAULT_MODEL as DEFAULT_MODEL  # the shipped model, for callers of the API
from .project import default_model
from .runner import PassRequest, Runner
from .sql_names import SQLNames
from .tokenizer import Tokenizer, config_eos_ids

# A prompt: text, or token ids (a list, tuple, range, NumPy or MLX array of whole numbers)
Prompt = str | Sequence[int] | np.ndarray | mx.array


def load(path: str | Path | None = None, adapter: str | Path | None = None,
         dtype: str | None = None, quantize: tuple[int, int] | None = None, fuse: bool = True,
         **unknown) -> tuple[nn.Module, Tokenizer | None]:
    """``(model, tokenizer)`` from an MLX model directory (default: the shipped tiny model).

    ``adapter`` is a path or a name under ``PATH/adapters/``; ``quantize=(bits, group_size)``
    quantizes a float model at load time. With ``fuse``, a shared-mode, LoRA-baseline or tuned
    adapter's every-row LoRA is folded into the (float) base weights: the same outputs, faster,
    but the model keeps that adapter; ``fuse=False`` to swap adapters later with
    ``load_adapter``. Half-precision weights are computed in fp32 on the CPU unless ``dtype``
    says otherwise. The tokenizer is None when the directory has no tokenizer files.
    """
    from .tokenizer import load_tokenizer

    check_keywords("load", unknown, ("path", "adapter", "dtype", "quantize", "fuse"),
                   {"adapter_path": "{adapter}", "path_or_hf_repo": "{path}"})  # mlx-lm's names
    check_switch("fuse", fuse)
    path = model_dir(path) if path is not None else default_model()
    model = load_model(path, dtype=dtype, quantize=quantize)
    model.path = path.absolute()  # where its adapters are, wherever the caller's directory goes (%cd)
    if adapter is not None:
        load_adapter(model, adapter, model_path=path)
        if fuse:
            fuse_adapter(model)
    return model, load_tokenizer(path)


@dataclass
class StreamResponse:
    """One forward pass: the tokens it emitted and their text.

    ``text`` is exactly what this pass adds to the output: ``"".join(pieces)``, one piece per
    token, and at the very end of a generation maybe one more without a token (a character whose
    byte tokens came in earlier passes); ``drafted[i]`` tells whether piece i is an accepted draft
    token's (for colouring).
    ``accepted``/``rejected``: the pass's accepted draft (the part of it in the output: not past
    EOS or ``max_tokens``) and the best draft it rejected.
    """

    tokens: list[int]
    text: str
    accepted: list[int]
    rejected: list[int]
    finish_reason: str | None = None
    stats: Stats | None = field(default=None, repr=False)  # the generation's statistics up to this pass
    pieces: list[str] = field(default_factory=list, repr=False)
    drafted: list[bool] = field(default_factory=list, repr=False)
    stop_sequence: str | None = None  # the stop string that ended the text (finish_reason "stop")
    logprobs: list[TokenLogprob] | None = field(default=None, repr=False)  # per token, if asked for


@dataclass
class GenerationResult:
    """A whole generation: ``text`` is the detokenized ``tokens``, except at a stop string: the
    text ends where it begins, the tokens with the last one whose text is in it (the token the stop
    string begins inside of; none of a token it begins at the start of). What follows is in
    neither."""

    text: str
    tokens: list[int]
    stats: Stats
    finish_reason: str | None = None
    steps: list[StreamResponse] = field(default_factory=list, repr=False)
    logprobs: list[TokenLogprob] | None = field(default=None, repr=False)  # per token, if asked for


def _prompt_ids(tokenizer, prompt) -> list[int]:
    """Token ids of a text prompt, or the ids given: a 1-D sequence of whole numbers."""
    if isinstance(prompt, bytes | bytearray):
        raise ValueError("a prompt is text (str) or token ids, not bytes: decode it first")
    if isinstance(prompt, str) and not prompt:
        raise ValueError("the prompt is empty")
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ValueError("a text prompt needs a tokenizer; pass token ids instead")
        return tokenizer.encode(prompt)
    shape, kind = getattr(prompt, "shape", None), type(prompt).__name__  # arrays: MLX's, NumPy's, torch's
    if shape is not None and len(shape) != 1:
        hint = (": pass its row, ids[0]" if len(shape) == 2 and shape[0] == 1 else ": pass a list, [id]"
                if len(shape) == 0 else ": generate decodes one prompt a call")
        raise ValueError(f"a prompt is a 1-D sequence of token ids, not a {kind} of shape "
                         f"{tuple(shape)}{hint}")
    if shape is not None and callable(getattr(prompt, "tolist", None)):
        prompt = prompt.tolist()
    try:
        items = [t.item() if getattr(t, "ndim", None) == 0 else t for t in prompt]  # (0-d arrays: ids)
    except TypeError:  # not iterable
        raise ValueError("a prompt is text (str) or a 1-D sequence of int token ids, "
                         f"not {_short(prompt)}") from None
    bad = [t for t in items if isinstance(t, bool) or not isinstance(t, int | np.integer)]
    if bad and all(isinstance(t, dict) for t in items):
        raise ValueError("a prompt is text or token ids: turn chat messages into the prompt's ids with "
                         "tokenizer.apply_chat_template(messages)")
    if bad and all(isinstance(t, str | list | tuple) for t in items):
        raise ValueError(f"a prompt is one text or one sequence of token ids, not a list of "
                         f"{type(bad[0]).__name__}s: generate decodes one prompt a call")
    if bad:
        raise ValueError(f"a prompt is text (str) or a 1-D sequence of int token ids, not {kind} holding "
                         f"{_short(bad[0])}")
    return [int(t) for t in items]


def check_text_size(model: nn.Module | Runner, tokenizer: Tokenizer | None, prompt: Prompt) -> None:
    """A :class:`ContextLengthError` for a text prompt that cannot fit the context whatever its
    tokens, before it is encoded (megabytes take a minute and gigabytes of memory to encode, and
    hold up a server's other requests): more characters than the context's tokens at the
    tokenizer's longest. A shorter one is measured in tokens once encoded (the engine)."""
    limit = model.limit if isinstance(model, Runner) else getattr(model, "max_positions", None)
    longest = getattr(tokenizer, "max_token_chars", None)  # (ours; another tokenizer: not said here)
    if isinstance(prompt, str) and longest and limit and len(prompt) > limit * longest:
        holder = model.limit_source if isinstance(model, Runner) else "the model's context"
        raise ContextLengthError(f"the prompt ({len(prompt)} characters) is longer than {holder} of {limit} "
                                 "tokens")


def _short(value) -> str:
    """``repr(value)``, cut to 60 characters."""
    said = repr(value)
    return said if len(said) <= 60 else said[:57] + "..."


def check_model(model, tokenizer, paths: bool = False) -> None:
    """A TypeError naming the argument that is not what :func:`load` returns (a path, the pair
    itself, the two swapped), before the engine would fail on it deep down. ``paths``: the caller
    also takes a model directory (``train``)."""
    if not isinstance(model, Runner | CausalLM):
        hint = (": load it first, model, tokenizer = load(PATH)" if isinstance(model, str | Path)
                else ": give the model of model, tokenizer = load(PATH)" if isinstance(model, tuple)
                else f": {_LIBRARIES[_library(model)]}'s model: load its directory with "
                     "mlx_specstream.load(PATH) (the same directories load)" if _library(model)
                else ": model and tokenizer swapped?" if callable(getattr(model, "encode", None)) else "")
        what = "a model directory or a model from load()" if paths else "a model from load()"
        raise TypeError(f"model must be {what}, not {type(model).__name__}{hint}")
    if tokenizer is not None and (_library(tokenizer) or not hasattr(tokenizer, "eos_token_ids")):
        hint = (f": {_LIBRARIES[_library(tokenizer)]}'s tokenizer: take the one mlx_specstream.load(PATH) "
                "gives" if _library(tokenizer) else "")
        raise TypeError(f"tokenizer must be a tokenizer from load() or None, not "
                        f"{type(tokenizer).__name__}{hint}")


_LIBRARIES = {"mlx_lm": "mlx-lm", "transformers": "transformers", "tokenizers": "tokenizers"}  # whose
# models and tokenizers look like ours (layers, eos_token_ids) and fail deep down in decoding


def _library(obj) -> str | None:
    """The top-level module of ``obj``'s class where it is one of :data:`_LIBRARIES`."""
    top = type(obj).__module__.split(".")[0]
    return top if top in _LIBRARIES else None


def decoder(model: nn.Module | Runner, tokenizer: Tokenizer | None, prompt: Prompt, *,
            sql_names: bool = False, batched: bool = False, **options) -> Decoder:
    """The decoder of one request (options as :func:`stream_generate`, the engine's
    :class:`~mlx_specstream.engine.DecodeOptions` and their defaults); ``model`` is an MLX model
    or any :class:`~.runner.Runner` (a Core ML package's). EOS is the tokenizer's, else the
    runner's own (a package's metadata), else the model directory's (its config files).
    ``batched``: the server's, whose scheduler runs the passes (:class:`~.runner.PassRequest`)."""
    check_model(model, tokenizer)
    check_switch("sql_names", sql_names)
    check_text_size(model, tokenizer, prompt)
    ids = _prompt_ids(tokenizer, prompt)
    if tokenizer is not None:
        eos = frozenset(tokenizer.eos_token_ids)
    elif isinstance(model, Runner) or getattr(model, "path", None) is None:
        eos = getattr(model, "eos_token_ids", frozenset())
    else:  # an MLX model directory without tokenizer files: the EOS its configs name
        eos = frozenset(config_eos_ids(Path(model.path)))
    if sql_names:
        if options.get("constraint") is not None:
            raise ValueError("give either sql_names or constraint, not both")
        if tokenizer is not None:
            check_prompt_ids(ids, tokenizer.vocab_size)  # before they are decoded to read names
        options["constraint"] = sql_constraint(tokenizer, prompt, ids)
    return Decoder(model, ids, DecodeOptions(**options, eos_token_ids=eos), batched)


def sql_constraint(tokenizer, prompt, ids: list[int]) -> SQLNames:
    """The ``sql_names`` constraint of a prompt (text, or token ids ``ids``)."""
    if tokenizer is None:
        raise ValueError("sql_names needs a tokenizer")
    text = prompt if isinstance(prompt, str) else tokenizer.decode(ids, skip_special_tokens=True)
    return SQLNames.from_prompt(text, tokenizer)


def held_back(text: str, stop: list[str]) -> int:
    """Characters at the end of ``text`` that could begin one of the strings ``stop`` (stop strings,
    a tool call's marker), held back until they cannot: the longest end of ``text`` that is a proper
    beginning of one. Only ends that start with a string's first character are tried, so a pass
    costs little whatever the strings' length."""
    longest = 0
    for s in stop:
        tail = text[len(text) - min(len(s) - 1, len(text)):]
        i = tail.find(s[0])
        while i >= 0 and len(tail) - i > longest:
            if s.startswith(tail[i:]):
                longest = len(tail) - i
                break
            i = tail.find(s[0], i + 1)
    return longest


def stop_strings(stop: str | list[str] | tuple[str, ...] | None) -> list[str]:
    """Stop strings as a list of non-empty strings (checked before a model loads, as the command
    line does)."""
    if stop is not None and not isinstance(stop, str | list | tuple):
        raise TypeError(f"stop must be a string or a list of strings, not {type(stop).__name__}")
    stop = [stop] if isinstance(stop, str) else list(stop or [])
    if any(not isinstance(s, str) for s in stop):
        raise TypeError("stop strings must be strings")
    if not all(stop):
        raise OptionError("{stop}: a stop string must not be empty")
    return stop


def check_stop(stop: str | list[str] | tuple[str, ...] | None, tokenizer) -> list[str]:
    """Stop strings as a list (:func:`stop_strings`), with a tokenizer to read the text."""
    stop = stop_strings(stop)
    if stop and tokenizer is None:
        raise ValueError("stop strings need a tokenizer")
    return stop


def responses(decoder: Decoder, tokenizer, stop: list[str] | None,
              skip_special_tokens: bool = False) -> Iterator[StreamResponse | PassRequest]:
    """Pass by pass: detokenize token by token and end at a stop string (checked by
    :func:`check_stop`), whose text and what follows it are not emitted (the token it begins in
    is, its piece cut there); of several, the one that ends first, as plain decoding meets it.
    ``stats.generated_tokens`` counts the tokens through the one that completes it. With stop
    strings, text that could begin one is held back until it cannot. ``skip_special_tokens``:
    control tokens (``<s>``) have no text (the server's replies)."""
    stop = stop or []
    detok = None if tokenizer is None else (
        tokenizer.detokenizer(skip_special_tokens=True) if skip_special_tokens else tokenizer.detokenizer())
    out, done = "", 0  # text and tokens yielded so far
    held: list[tuple[int | None, str, bool]] = []  # (token, piece, drafted) not yielded yet
    held_logprobs: list[TokenLogprob] = []  # the held tokens' (where asked for)
    for step in decoder.steps():
        if isinstance(step, PassRequest):  # a batched decoder's pass: for the caller to run
            yield step
            continue
        pieces = [detok.add_token(t) for t in step.tokens] if detok else [""] * len(step.tokens)
        held_logprobs += step.logprobs or []
        n_acc = min(len(step.accepted), len(step.tokens))
        held += [(t, p, i < n_acc) for i, (t, p) in enumerate(zip(step.tokens, pieces))]
        tail = detok.finalize() if detok and step.finished else ""  # bytes held back until the end
        if tail and step.tokens:
            held[-1] = (held[-1][0], held[-1][1] + tail, held[-1][2])
        elif tail:  # the pass wrote only EOS: the character's byte tokens came in earlier passes
            held += [(None, tail, False)]
        text = out + "".join(p for _, p, _ in held)
        finished = step.finished
        # the stop string that ends first is the one plain decoding, token by token, meets first
        found = sorted((i + len(s), i, s) for s in stop
                       if (i := text.find(s, max(0, len(out) - len(s) + 1))) >= 0)
        end = found[0][1] if found else (len(text) if finished else len(text) - held_back(text, stop))
        n, pos = 0, len(out)  # held[:n] go out: whole pieces up to end
        while not found and n < len(held) and pos + len(held[n][1]) <= end:
            pos += len(held[n][1])
            n += 1
        while detok is not None and not found and not finished and n and not held[n - 1][1]:
            n -= 1  # tokens whose text has not come yet (bytes of a character) wait for it
        if found:
            n = _through(detok, held, done, text[:end])
            finished = "stop"
            decoder.stats.finish_reason = "stop"
            # generated: through the token that completes the stop string, as plain decoding writes it
            beyond = _through(detok, held, done, text[:found[0][0]])
            decoder.stats.generated_tokens -= sum(t is not None for t, _, _ in held[beyond:])
            cut = sum(t is not None for t, _, _ in held[n:])  # not in the output: this pass's last tokens
            n_acc = min(n_acc, len(step.tokens) - min(cut, len(step.tokens)))  # accepted, in the output
        ready, held = held[:n], held[n:]
        tokens = [t for t, _, _ in ready if t is not None]
        logprobs, held_logprobs = held_logprobs[:len(tokens)], held_logprobs[len(tokens):]
        piece_list = [p for _, p, _ in ready]
        if found:  # the piece the stop string begins in, cut there
            piece_list = _fit(piece_list, text[len(out):end])
        out += "".join(piece_list)
        done += len(tokens)
        yield StreamResponse(tokens, "".join(piece_list), step.accepted[:n_acc], step.rejected, finished,
                             decoder.stats.snapshot(), piece_list, [d for _, _, d in ready],
                             found[0][2] if found else None,
                             logprobs if step.logprobs is not None else None)
        if finished:
            return


def _through(detok, held: list[tuple[int | None, str, bool]], done: int, text: str) -> int:
    """At a stop: how many ``held`` entries go out, the tokens through the one whose text the
    output ``text`` (all of it before the stop string) ends in: the fewest that decode to text
    beginning with it. Their pieces cannot say: a byte token's text comes with a later token's."""
    count = done
    for n, (token, _, _) in enumerate(held):
        if detok.text_of(count).startswith(text):
            return n
        count += token is not None
    return len(held)


def _fit(pieces: list[str], text: str) -> list[str]:
    """``pieces`` made to add up to ``text``, which begins with them or they with it: cut where
    it ends, or the rest of it added to the last piece."""
    fitted, pos = [], 0
    for piece in pieces:
        fitted.append(piece[: max(0, len(text) - pos)])
        pos += len(piece)
    if fitted:
        fitted[-1] += text[pos:]
    return fitted


# mlx-lm's keywords of generate and stream_generate, with ours or what stands for them
MLX_LM_NAMES = {"temp": "{temperature}",
                "verbose": "the result has the text and its stats; stream_generate gives it pass by pass",
                "sampler": "give {temperature} and {top_p}: sampling must match the drafts' verification",
                "logits_processors": "{constraint} takes a TokenConstraint ({sql_names=True} for SQL)",
                "num_draft_tokens": "the streams draft: {gamma} of them, {tree_budget} nodes a pass",
                "draft_model": "no draft model: the adapter's streams draft; load(PATH, adapter=NAME)",
                "prompt_cache": "each call prefills its prompt: no prompt cache here",
                "stop_strings": "{stop}",
                "adapter_path": "an adapter is the model's: load(PATH, adapter=NAME) or "
                                "load_adapter(model, NAME)"}


# the options a request may give: the engine's, and sql_names (the constraint it makes)
DECODE_OPTIONS = tuple(f.name for f in fields(DecodeOptions) if f.name != "eos_token_ids") + ("sql_names",)


def _check_names(options: dict, caller: str) -> None:
    """Keywords no decoder takes (mlx-lm's ``temp``, say): a TypeError naming ``caller``."""
    check_keywords(caller, options, DECODE_OPTIONS, MLX_LM_NAMES)


def stream_generate(model: nn.Module | Runner, tokenizer: Tokenizer | None, prompt: Prompt, *,
                    stop: str | list[str] | None = None,
                    **options) -> Iterator[StreamResponse]:
    """Yield, per forward pass, the tokens accepted and their text.

    ``prompt`` is text or token ids. Options: ``max_tokens`` (256; -1: until EOS or the end of
    the context), ``temperature`` (0: greedy), ``top_p``, ``top_k`` and ``min_p`` (sampling: the
    nucleus, the k most likely tokens, the tokens at least min_p times as likely as the most likely
    one; after the temperature, top-k first), ``seed``, ``logprobs`` (k: each token's
    log-probability under the model with the k likeliest tokens', in each response's ``logprobs``:
    :mod:`~mlx_specstream.logprobs`), ``mode`` ("ss"; "ar": token by token through the same code
    path, the lossless reference; "lookup": prompt-lookup drafts alone), and the overrides
    ``gamma`` (streams used), ``branch`` (k), ``tree_budget`` (nodes per tree), ``prune_threshold``,
    ``streams`` ("auto", "tree", "deferred") and ``node_cost`` (the cost of one more tree node
    relative to a one-node pass: each tree is cut to the size with the most expected tokens per unit
    of cost; 0 runs the whole budget; default: the CPU costs measured in docs/engine.md, 0 on a GPU),
    ``lookup`` and ``ngrams`` (hybrid drafts: prompt lookup, on by default in "ss" mode, and the
    adapter's n-gram drafts where it has them, on by default in "ss" and "lookup" modes) and
    ``sql_names`` (write SQL whose identifiers are only the tables and columns of the prompt's
    ``CREATE TABLE`` statements, keywords and aliases:
    :mod:`~mlx_specstream.sql_names`), or any other ``constraint`` (a
    :class:`~mlx_specstream.constraint.TokenConstraint`); see
    :class:`~mlx_specstream.engine.DecodeOptions`. Decoding stops at EOS, at ``max_tokens`` or at a
    ``stop`` string (whose text is not emitted). Options and prompt are checked when it is called,
    before the first pass.
    """
    _check_names(options, "stream_generate")
    return responses(decoder(model, tokenizer, prompt, **options), tokenizer, check_stop(stop, tokenizer))


def generate(model: nn.Module | Runner, tokenizer: Tokenizer | None, prompt: Prompt, *,
             stop: str | list[str] | None = None,
             **options) -> GenerationResult:
    """Generate a whole completion (a :class:`GenerationResult`: text, tokens, statistics).

    ``prompt`` is text or token ids; ``stop`` a string or a list of them. The options are those of
    :func:`stream_generate` (``max_tokens``, ``temperature``, ``top_p``, ``top_k``, ``min_p``, ``seed``,
    ``logprobs``, ``mode``, ``gamma``, ``branch``, ``tree_budget``, ``prune_threshold``, ``streams``,
    ``node_cost``, ``lookup``, ``ngrams``, ``sql_names``, ``constraint``), which says what each does."""
    _check_names(options, "generate")
    dec = decoder(model, tokenizer, prompt, **options)
    steps = list(responses(dec, tokenizer, check_stop(stop, tokenizer)))
    tokens = [t for s in steps for t in s.tokens]
    logprobs = None if dec.opts.logprobs is None else [lp for s in steps for lp in s.logprobs or []]
    return GenerationResult("".join(s.text for s in steps), tokens, dec.stats,
                            steps[-1].finish_reason if steps else None, steps, logprobs)
