"""``IncrementalDetokenizer``: a stream of token ids as a stream of complete text pieces."""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.tokenizer import Tokenizer

_REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    """Turns a stream of token ids into a stream of complete text pieces.

    Each ``push`` decodes only a short window: the tokens from ``_prefix`` (the start of the last
    emitted piece, kept so that decoders which treat the first token specially see the same
    context) to the end. The text that window adds beyond ``_prefix.._read`` is the new piece.
    A piece ending in U+FFFD is held back until the next token completes the character.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self.token_ids: list[int] = []
        self._prefix = 0   # start of the decode window
        self._read = 0     # tokens before this index have been emitted as text

    def _pending_text(self) -> str:
        window = self.token_ids[self._prefix:]
        prefix_text = self._tokenizer.decode(window[: self._read - self._prefix], self._skip)
        full_text = self._tokenizer.decode(window, self._skip)
        return full_text[len(prefix_text):] if len(full_text) > len(prefix_text) else ""

    def push(self, token_ids: Sequence[int] | int) -> str:
        """Add tokens; return the text they complete (possibly empty, never a partial character)."""
        if isinstance(token_ids, int):
            token_ids = [token_ids]
        self.token_ids.extend(int(t) for t in token_ids)
        new_text = self._pending_text()
        if not new_text or new_text.endswith(_REPLACEMENT_CHAR):
            return ""
        self._prefix, self._read = self._read, len(self.token_ids)
        return new_text

    def flush(self) -> str:
        """Return whatever is held back, even an incomplete character (the stream has ended)."""
        new_text = self._pending_text()
        self._prefix, self._read = self._read, len(self.token_ids)
        return new_text
