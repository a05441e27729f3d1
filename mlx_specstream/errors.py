"""Errors that mean "bad input" (shown to CLI users as one line, no traceback), and the checks of
input that every entry point shares (keywords, paths, seeds, switches)."""

from __future__ import annotations

import math
import numbers
import os
import re

import numpy as np


class CheckpointError(ValueError):
    """A checkpoint directory is missing files, tensors, or has corrupt or mismatched ones."""


class UnsupportedModelError(ValueError):
    """A checkpoint's architecture or one of its options is not supported."""


class ConfigError(UnsupportedModelError):
    """A key the architecture needs is missing from config.json, or has a value of the wrong type."""


class ContextLengthError(ValueError):
    """A prompt longer than the context holds with one token generated (the server's
    ``context_length_exceeded``)."""


def prompt_too_long(n_prompt: int, limit: int, holder: str = "the model's context") -> str:
    """What a prompt that leaves no room for one generated token is told (decoding, ``bench``)."""
    return (f"the prompt has {n_prompt} tokens, and at most {limit - 1} fit: {holder} holds {limit} tokens, "
            "the prompt and one generated")


class PackageError(ValueError):
    """Not a readable Speculative Streaming Core ML package, or a request it cannot serve."""


class AdapterError(ValueError):
    """An adapter is missing, corrupt, or made for another base model."""


_OPTION = re.compile(r"\{(\w+)(?:=([^{}]*))?\}|\{(\{\w+(?:=[^{}]*)?\})\}")  # {{x}}: the text {x}


def verbatim(text: str) -> str:
    """``text`` (a value the user gave) for a template: what would read as an option (``{x}``)
    said as it is."""
    return re.sub(r"\{(\w+(?:=[^{}]*)?)\}", r"{{\1}}", str(text))
# Command-line flags that are not ``--`` + the Python name with dashes.
CLI_FLAGS = {"temperature": "--temp"}


class SaidInOptions(Exception):
    """An error whose message names options, said in the caller's language.

    The message names options as ``{name}`` or ``{name=value}``: Python callers read
    ``name`` / ``name='value'``, command-line users ``--name`` / ``--name value``, clients of the
    server (JSON fields) ``'name'`` / ``'name': "value"``. Example:
    ``OptionError("{gamma} must be in 1..4, not 0")`` reads "gamma must be in 1..4, not 0" in
    Python and "--gamma must be in 1..4, not 0" from ``specstream-mlx generate``.
    """

    def __init__(self, template: str, subject: str = ""):
        self.template, self.subject = template, subject  # subject: said as it is (a path's braces too)
        super().__init__(self.render("python"))

    def __reduce__(self):  # a copy or a pickle is built from the template, not from its rendering
        return type(self), (self.template, self.subject)

    def options(self) -> list[str]:
        """The options the message names, in order."""
        return [m.group(1) for m in _OPTION.finditer(self.template) if m.group(1)]

    def render(self, dialect: str, names: dict[str, str] | None = None) -> str:
        """The message for ``dialect`` ``python``, ``cli`` or ``http``; ``names`` spells some
        options otherwise in ``http`` (a request's field for an option of another name)."""
        return self.subject + render_options(self.template, dialect, names)


def render_options(template: str, dialect: str, names: dict[str, str] | None = None) -> str:
    """``template`` with its options (``{name}``, ``{name=value}``) spelt for ``dialect``:
    ``python``, ``cli`` or ``http`` (:class:`SaidInOptions`)."""
    if dialect not in ("python", "cli", "http"):
        raise ValueError(f"no dialect '{dialect}': python, cli or http")

    def one(m: re.Match) -> str:
        if m.group(3):  # an escaped {x}, said as it is
            return m.group(3)
        name, value = m.group(1), m.group(2)
        literal = value in ("True", "False", "None") or re.fullmatch(r"-?[\d.]+", value or "")
        if dialect == "cli":
            flag = CLI_FLAGS.get(name, "--" + name.replace("_", "-"))
            if value == "False":  # a --name/--no-name switch
                return "--no-" + flag[2:]
            return flag if value in (None, "True") else f"{flag} {value}"
        if dialect == "http":
            field = (names or {}).get(name, f"'{name}'")
            if value is None:
                return field
            shown = {"True": "true", "False": "false", "None": "null"}.get(value, value) if literal \
                else f'"{value}"'
            return f"{field}: {shown}"
        if value is None:
            return name
        return f"{name}={value}" if literal else f"{name}='{value}'"

    return _OPTION.sub(one, template)


class Said(str):
    """A message, not an error, that names options as :class:`SaidInOptions` does: the text in
    Python's terms, and :meth:`render` in another's (a log line from ``train``, which the command
    line prints with flags)."""

    def __new__(cls, template: str, subject: str = ""):
        said = super().__new__(cls, subject + render_options(template, "python"))
        said.template, said.subject = template, subject
        return said

    def __getnewargs__(self):  # a copy or a pickle is built from the template
        return self.template, self.subject

    def render(self, dialect: str) -> str:
        return self.subject + render_options(self.template, dialect)


def said_in(message: str, dialect: str) -> str:
    """``message`` for ``dialect``: a :class:`Said` rendered for it, any other text as it is."""
    return message.render(dialect) if isinstance(message, Said) else message


class OptionError(SaidInOptions, ValueError):
    """A bad option value (:class:`SaidInOptions`)."""


class OutputExistsError(SaidInOptions, FileExistsError):
    """An output that exists already, with the options that would replace or continue it
    (:class:`SaidInOptions`: ``{overwrite=True}`` reads ``--overwrite`` on the command line)."""


def instead(template: str, dialect: str) -> str:
    """What to say of another tool's name (mlx-lm's) whose counterpart here is ``template``: our
    option alone (``"{temperature}"``) reads "did you mean 'temperature'?" in Python and "here it
    is --temperature" on the command line; a hint (``"give {temperature} and {top_p}: ..."``) is
    said as it is, its options in the dialect's spelling (:func:`render_options`)."""
    said = render_options(template, dialect)
    if not re.fullmatch(r"\{\w+\}", template):
        return said
    return f"did you mean '{said}'?" if dialect == "python" else f"here it is {said}"


def check_keywords(caller: str, given, known, aliases: dict[str, str] | None = None) -> None:
    """A keyword none of ``known`` is a TypeError naming the public ``caller`` and the likeliest
    intended keyword, not the private function it would reach. ``aliases``: other libraries'
    names, each with what stands for it here (:func:`instead`: ``{"temp": "{temperature}"}``)."""
    import difflib

    known = list(known)
    for name in given:
        if name not in known:
            if name in (aliases or {}):
                hint = f" ({instead(aliases[name], 'python')})"
            else:
                near = difflib.get_close_matches(name, known, n=1)
                hint = f" (did you mean '{near[0]}'?)" if near else ""
            raise TypeError(f"{caller}() got an unexpected keyword argument '{name}'{hint}")


def check_path(value, what: str, error: type[Exception], give: str) -> None:
    """A path (or an adapter's name) is a str or a Path, said by ``what`` it stands for where it is
    another type (``load(5)``: not by pathlib deep down), and not empty: an unset variable would
    read as the current directory (``error``, saying what to ``give``). ``what`` may be an option
    (``"{out}"``), said in the caller's terms by an :class:`OptionError`. A control character (a
    newline pasted along) is refused too: an adapter named so would be a model id of two lines."""
    if not isinstance(value, str | os.PathLike):
        said = f"{what} must be a str or a Path, not {type(value).__name__}"
        raise TypeError(render_options(said, "python"))
    if str(value) == "":
        raise error(f"{what} is empty: {give}")
    if any(ord(c) < 32 or ord(c) == 127 for c in str(value)):
        raise error(f"{what} holds a control character ({verbatim(repr(str(value)))}): {give}")


SEED_MAX = 2**64 - 1  # MLX's keys and NumPy's generators take 64-bit seeds


def check_seed(seed, optional: bool = False) -> None:
    """A seed is a whole number in ``0..2**64 - 1`` (``optional``: or None, a fresh one), said
    before it reaches MLX, whose own error is a page of overloads."""
    if optional and seed is None:
        return
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= seed <= SEED_MAX:
        raise OptionError(f"{{seed}} must be a whole number in 0..2**64 - 1, not {seed!r}")


def check_number(name: str, value, least: float, *, inclusive: bool = True, whole: bool = False) -> None:
    """A number option (``{name}``) of its type (``whole``: an integer; never a bool) and finite, at
    least ``least`` (``inclusive``) or above it; said by name: a NaN learning rate trains an
    adapter of NaN weights, and saves it."""
    check_kind(name, value, whole)
    if not math.isfinite(value) or value < least or (value == least and not inclusive):
        bound = f">= {least}" if inclusive else f"> {least}"
        raise OptionError(f"{{{name}}} must be {'a whole number' if whole else 'a finite number'} {bound}, "
                          f"not {value}")


_WHOLE, _REAL = int | np.integer, int | float | np.integer | np.floating  # what the arithmetic takes


def check_kind(name: str, value, whole: bool = False) -> None:
    """A number option (``{name}``) is a number (``whole``: an integer), Python's or NumPy's; never
    a bool, nor a number the arithmetic after it cannot take (a Fraction, a complex)."""
    if isinstance(value, bool) or not isinstance(value, _WHOLE if whole else _REAL):
        raise OptionError(f"{{{name}}} must be {'a whole number' if whole else 'a number'}, not {value!r}")


def check_switch(name: str, value, optional: bool = False) -> None:
    """A switch is True or False (``optional``: or None, its default): ``lookup=0`` or
    ``fuse="no"`` would otherwise read as on (and NumPy's ``np.False_`` is not ``False``)."""
    if not isinstance(value, bool) and not (optional and value is None):
        raise OptionError(f"{{{name}}} must be True or False{' (or None)' * optional}, not {value!r}")


class MissingPackageError(ImportError):
    """An optional package a feature needs is not installed (said with the pip command)."""


USER_ERRORS = (
    MissingPackageError,
    AdapterError,
    CheckpointError,
    UnsupportedModelError,
    OSError,  # files: missing, existing, unreadable, a full disk (outputs.save_safetensors)
    ValueError,
)
