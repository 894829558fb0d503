"""Reasoning written between ``<think>`` and ``</think>`` (Qwen3, GLM-4.5 and the models that learned
their format): a reply's tokens read into its reasoning and its answer, as a harmony reply's are
(:mod:`engine.chat_format.harmony`), so the workbench, ``chat`` and the server show them apart.

A model writes so when its vocabulary holds both tags as single tokens and its chat template writes
them (:meth:`ThinkTags.of`). The tags are read by id, never from text, so an answer that spells
"<think>" in other tokens stays the answer. A chat template that opens the block itself (its generation
prompt ends in ``<think>``) starts the reply inside it (:meth:`ThinkTags.reader` with the prompt).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.chat_format.harmony import HarmonyDelta, ReplyReader
from engine.detokenizer import IncrementalDetokenizer

if TYPE_CHECKING:
    from engine.tokenizer import Tokenizer

OPEN, CLOSE = "<think>", "</think>"
_OPENED_WITHIN = 3      # prompt tokens at its end where an opening tag means the reply starts inside it


@dataclass(frozen=True)
class ThinkTags:
    """The ids of a model's reasoning tags."""

    open_id: int
    close_id: int

    @classmethod
    def of(cls, tokenizer: Tokenizer) -> ThinkTags | None:
        """The tags when the vocabulary has both as single tokens and the chat template writes them."""
        template = tokenizer.chat_template or ""
        ids = tokenizer.token_to_id(OPEN), tokenizer.token_to_id(CLOSE)
        if None in ids or OPEN not in template:
            return None
        return cls(*ids)

    def opened_by(self, prompt_ids: Sequence[int]) -> bool:
        """Whether the prompt ends inside an open block (its template opened it for the reply)."""
        tail = list(prompt_ids[-_OPENED_WITHIN:])
        return self.open_id in tail and self.close_id not in tail[tail.index(self.open_id):]

    def stop_scope(self, prompt_ids: Sequence[int] = ()) -> ThinkStopScope:
        """Where stop strings apply in a reply to ``prompt_ids``: its answer, after the reasoning."""
        return ThinkStopScope(self, self.opened_by(prompt_ids))

    def reader(self, tokenizer: Tokenizer, prompt_ids: Sequence[int] = ()) -> ThinkReader:
        return ThinkReader(tokenizer, self, self.opened_by(prompt_ids))

    def parse(self, tokenizer: Tokenizer, token_ids: Sequence[int], prompt_ids: Sequence[int] = ()) -> HarmonyDelta:
        """A whole reply read at once."""
        reader = self.reader(tokenizer, prompt_ids)
        return reader.feed(token_ids) + reader.finish()


@dataclass(frozen=True)
class ThinkStopScope:
    """``engine.sampling.StopScope`` of a <think> reply: the answer is the text outside reasoning blocks,
    less the line breaks :class:`ThinkReader` drops at the start of each run of it."""

    tags: ThinkTags
    opened: bool                  # the prompt opened a block for the reply
    lead: str = "\n"

    @property
    def holds_guide(self) -> bool:
        """A guide on the reply (a forced tool call, a response_format) waits for the answer where the
        prompt opened the block: the model reasons first, as its template asks."""
        return self.opened

    def gate(self) -> _ThinkGate:
        return _ThinkGate(self.tags, self.opened)


class _ThinkGate:
    def __init__(self, tags: ThinkTags, inside: bool) -> None:
        self._tags, self._inside = tags, inside

    def next_in_answer(self) -> bool:
        return not self._inside

    def in_answer(self, token: int) -> bool:
        if token == self._tags.open_id and not self._inside:
            self._inside = True
        elif token == self._tags.close_id and self._inside:
            self._inside = False
        else:
            return not self._inside
        return False


class ThinkReader:
    """Reads one streamed reply (the ``ReplyReader`` protocol of :mod:`engine.chat_format.harmony`): text
    inside the tags is reasoning, the rest is the answer. The line breaks the format puts after the
    opening tag and around the closing one are not part of either."""

    def __init__(self, tokenizer: Tokenizer, tags: ThinkTags, inside: bool = False) -> None:
        self._tokenizer, self._tags = tokenizer, tags
        self._inside = inside
        self._detok = IncrementalDetokenizer(tokenizer)
        self._trim = True           # the start of this segment: its leading line breaks go

    def feed(self, token_ids: Sequence[int]) -> HarmonyDelta:
        out = HarmonyDelta()
        for t in token_ids:
            t = int(t)
            if (t == self._tags.open_id and not self._inside) or (t == self._tags.close_id and self._inside):
                out += self._said(self._detok.flush())
                self._inside = not self._inside
                self._detok = IncrementalDetokenizer(self._tokenizer)
                self._trim = True
            else:
                out += self._said(self._detok.push(t))
        return out

    def finish(self) -> HarmonyDelta:
        return self._said(self._detok.flush())

    def _said(self, text: str) -> HarmonyDelta:
        if self._trim:
            text = text.lstrip("\n")
            self._trim = not text
        if not text:
            return HarmonyDelta()
        return HarmonyDelta(reasoning=text) if self._inside else HarmonyDelta(content=text)


def reasoning_reader(tokenizer: Tokenizer, prompt_ids: Sequence[int]) -> ReplyReader | None:
    """What reads a chat reply to ``prompt_ids`` into its reasoning and its answer: harmony's channels
    (gpt-oss), the ``<think>`` tags, or None for a model that writes its answer alone."""
    if tokenizer.harmony is not None:
        return tokenizer.harmony.reader()
    if tokenizer.think is not None:
        return tokenizer.think.reader(tokenizer, prompt_ids)
    return None
