"""Errors that mean "bad input" (shown to CLI users as one line, no traceback)."""

from __future__ import annotations

import re

from .arch.base import UnsupportedModelError


class CheckpointError(ValueError):
    """A checkpoint directory is missing files, tensors, or has corrupt or mismatched ones."""


class AdapterError(ValueError):
    """An adapter is missing, corrupt, or made for another base model."""


_OPTION = re.compile(r"\{(\w+)(?:=([^}]*))?\}")
# Command-line flags that are not ``--`` + the Python name with dashes.
CLI_FLAGS = {"temperature": "--temp"}


class OptionError(ValueError):
    """A bad option value, said in the caller's language.

    The message names options as ``{name}`` or ``{name=value}``: Python callers read
    ``name`` / ``name='value'``, command-line users ``--name`` / ``--name value``. Example:
    ``OptionError("{gamma} must be in 1..4, not 0")`` reads "gamma must be in 1..4, not 0" in
    Python and "--gamma must be in 1..4, not 0" from ``specstream-mlx generate``.
    """

    def __init__(self, template: str):
        self.template = template
        super().__init__(self.render(cli=False))

    def render(self, cli: bool) -> str:
        def one(m: re.Match) -> str:
            name, value = m.group(1), m.group(2)
            if cli:
                flag = CLI_FLAGS.get(name, "--" + name.replace("_", "-"))
                if value == "False":  # a --name/--no-name switch
                    return "--no-" + flag[2:]
                return flag if value in (None, "True") else f"{flag} {value}"
            if value is None:
                return name
            literal = value in ("True", "False", "None") or re.fullmatch(r"-?[\d.]+", value)
            return f"{name}={value}" if literal else f"{name}='{value}'"

        return _OPTION.sub(one, self.template)


USER_ERRORS = (
    AdapterError,
    CheckpointError,
    UnsupportedModelError,
    OSError,  # files: missing, existing, unreadable, a full disk (outputs.save_safetensors)
    ValueError,
)
