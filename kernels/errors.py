"""The errors a user can cause, as every layer raises them; each carries one sentence naming the cause
and the fix.

They live in the lowest layer so that the kernels and the weight formats (which import nothing from the
engine) raise the same errors the engine shows: the CLI prints ``str(error)`` and exits with code 2, the
GUI shows it in a banner, the HTTP server returns it as the error message. The engine's own kinds are in
:mod:`engine.errors`.
"""
from __future__ import annotations


class StrataError(Exception):
    """Base class of user-facing errors: ``str(err)`` is one line, ready to show."""


class ConfigError(StrataError):
    """An option has an invalid value or a value that does not fit the model or the machine."""
