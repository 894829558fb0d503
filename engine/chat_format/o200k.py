"""The openai-harmony encoding, built from the model folder's own vocabulary: nothing is downloaded.

openai-harmony reads the o200k_base vocabulary (``o200k_base.tiktoken``: one ``base64(bytes) rank`` line per
token) from the folder named by ``TIKTOKEN_ENCODINGS_BASE``, and downloads it when that is unset. A gpt-oss
``tokenizer.json`` holds the same 199,998 ranks as byte-level BPE entries (ids 0..199,997), so the file is
written from it into a cache folder Strata owns, checked against the library's sha256, and the variable is
set for the one load call only. A vocabulary that is not o200k (a tiny test model, another family) gives
None, and the caller falls back to the model's chat template.
"""
from __future__ import annotations

import base64
import hashlib
import os
import threading
from collections.abc import Callable
from pathlib import Path

from engine.tiktoken_vocab import byte_chars

O200K_TOKENS = 199_998
O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
FILE_NAME = "o200k_base.tiktoken"
_ENV = "TIKTOKEN_ENCODINGS_BASE"
_LOCK = threading.Lock()        # the variable is process-wide: one load at a time


def default_cache_dir() -> Path:
    """Where Strata keeps the vocabulary file it writes (``~/.cache/strata/harmony``)."""
    return Path.home() / ".cache" / "strata" / "harmony"


def _byte_decoder() -> dict[str, int]:
    """The byte-level BPE alphabet: the printable character that stands for each byte, inverted."""
    return {c: b for b, c in enumerate(byte_chars())}


def tiktoken_text(token_of: Callable[[int], str | None], count: int) -> bytes | None:
    """The ``.tiktoken`` file of ids 0..count-1, each given as its byte-level token string by ``token_of``;
    None when an id is missing or not byte-level text."""
    decoder = _byte_decoder()
    lines = []
    for rank in range(count):
        token = token_of(rank)
        if token is None or any(c not in decoder for c in token):
            return None
        raw = bytes(decoder[c] for c in token)
        lines.append(base64.b64encode(raw) + b" " + str(rank).encode() + b"\n")
    return b"".join(lines)


def _cached(folder: Path) -> bool:
    path = folder / FILE_NAME
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest() == O200K_SHA256
    except OSError:
        return False


def write_o200k(token_of: Callable[[int], str | None], vocab_size: int, folder: Path) -> bool:
    """Make sure ``folder`` holds the o200k_base file (written from the vocabulary when it matches the
    library's hash); False when the vocabulary is not o200k or the folder cannot be written."""
    if vocab_size < O200K_TOKENS:
        return False
    if _cached(folder):
        return True
    text = tiktoken_text(token_of, O200K_TOKENS)
    if text is None or hashlib.sha256(text).hexdigest() != O200K_SHA256:
        return False
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{FILE_NAME}.{os.getpid()}.tmp"
        tmp.write_bytes(text)
        os.replace(tmp, folder / FILE_NAME)
    except OSError:
        return False
    return True


def load_encoding(folder: Path):
    """The HARMONY_GPT_OSS encoding read from ``folder`` (which must hold a checked o200k file), with
    ``TIKTOKEN_ENCODINGS_BASE`` pointed there only for the call; None if the library is not installed or
    refuses it."""
    try:
        from openai_harmony import (
            HarmonyEncodingName,
            HarmonyError,
            load_harmony_encoding,
        )
    except ImportError:
        return None
    if not _cached(folder):        # never let the library fall back to a download
        return None
    with _LOCK:
        before = os.environ.get(_ENV)
        os.environ[_ENV] = str(folder)
        try:
            return load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
        except (HarmonyError, OSError, ValueError):
            return None
        finally:
            if before is None:
                os.environ.pop(_ENV, None)
            else:
                os.environ[_ENV] = before
