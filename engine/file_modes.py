"""Permissions of the files the engine writes for the user: those of any new file of theirs.

A file written through a temporary one (``tempfile.mkstemp``) or by a library that writes private
files (safetensors) is readable by its owner only; a routing profile or a converted model is the
user's like any other file they make, so its mode follows their umask (0644 under the usual 022).
"""
from __future__ import annotations

import os
from pathlib import Path


def umask() -> int:
    """This process's file-mode creation mask (read where the system shows it, else set and put back)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def as_new_file(path: str | Path) -> None:
    """Give ``path`` the mode a new file of the user's gets (0666 less the umask)."""
    os.chmod(path, 0o666 & ~umask())
