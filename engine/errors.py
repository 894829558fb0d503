"""Errors a user can cause, each carrying one sentence that names the cause and the fix.

The CLI prints ``str(error)`` and exits with code 2; the GUI shows it in a banner; the HTTP
server returns it as the error message. Anything that is not a ``StrataError`` is a bug. The base
class and ``ConfigError`` are defined with the kernels (:mod:`kernels.errors`), which raise them too.
"""
from __future__ import annotations

from kernels.errors import ConfigError, StrataError

__all__ = ["ConfigError", "DeviceOutOfMemoryError", "ModelLoadError", "PipelineError", "ReconfigureError", "StrataError",
           "UnsupportedModelError", "printable"]


class ModelLoadError(StrataError):
    """The model folder is missing, incomplete or inconsistent."""


class UnsupportedModelError(StrataError):
    """The checkpoint is readable but its architecture or a feature of it is not supported."""


class ReconfigureError(ConfigError):
    """A live change could not be applied; the engine keeps running with its previous settings."""


class DeviceOutOfMemoryError(StrataError):
    """The device ran out of memory during a step; queued and running requests are kept."""


class PipelineError(StrataError):
    """A pipeline stage's process failed or ended; the engine stopped every stage and must be loaded again."""


def printable(text: str, limit: int = 200) -> str:
    """Text from outside (a client's path or role, a chat template's words) as one short line for messages and
    logs: control characters escaped, cut to ``limit`` characters."""
    text = text if text.isprintable() else text.encode("unicode_escape").decode("ascii")
    return text if len(text) <= limit else text[:limit - 3] + "..."
