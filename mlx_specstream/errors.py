"""Errors that mean "bad input" (shown to CLI users as one line, no traceback)."""

from __future__ import annotations

from .arch.base import UnsupportedModelError
from .loader import CheckpointError


class AdapterError(ValueError):
    """An adapter is missing, corrupt, or made for another base model."""


USER_ERRORS = (
    AdapterError,
    CheckpointError,
    UnsupportedModelError,
    FileExistsError,
    FileNotFoundError,
    PermissionError,
    ValueError,
)
