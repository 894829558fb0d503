"""A file the user asked for, written whole or not at all."""
from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TextIO


def write_export(path: Path, fill: Callable[[TextIO], None], newline: str | None = None) -> None:
    """Write ``path`` through a temporary file beside it that ``fill`` writes, then renamed over it; raises
    OSError (a folder given as the file, a folder that is not there, no room) and leaves nothing behind.
    The file is readable as the user's other files are (a temporary file's is private)."""
    if path.is_dir():
        raise IsADirectoryError(21, "that is a folder; name a file in it", str(path))
    fd, tmp = tempfile.mkstemp(prefix=".strata-", suffix=path.suffix, dir=path.parent)
    try:
        with os.fdopen(fd, "w", newline=newline, encoding="utf-8") as f:
            fill(f)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
