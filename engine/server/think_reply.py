"""A ``<think>`` model's reply read for the server: :class:`engine.chat_format.think.ThinkReader`, plus
the closing tag a reply writes without opening the block.

Templates such as Qwen3's and DeepSeek-R1's open the block in the prompt, so the model writes only
``</think>``. Where the prompt does not show the block open, that tag would reach the answer as text.
Here the reply's first tag, when it is ``</think>``, ends reasoning: the text before it is reasoning
(possibly empty). A closing tag with no block open later on (after a block, or after a prompt that
closed one) is dropped. Until the reply's first tag settles what its opening text is, that text is held
back, so a stream splits a reply as the whole reply does; a prompt that opened or closed a block
settles it before the first token, and :data:`HOLD_TOKENS` tokens without a tag settle it as answer (a
model whose template knows the tags but whose replies carry none still streams: a ``</think>`` after
that is dropped, the text before it stays answer).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from engine.chat_format.harmony import HarmonyDelta
from engine.chat_format.think import ThinkReader, ThinkTags

if TYPE_CHECKING:
    from engine.tokenizer import Tokenizer

_CLOSED_WITHIN = 6      # prompt tokens at its end where a closing tag means the template closed the block
HOLD_TOKENS = 16        # reply tokens with no tag after which the opening text is answer, and streams


class ThinkReply:
    """Reads one streamed reply (the ``ReplyReader`` protocol): reasoning apart from the answer, and
    never a ``</think>`` in the answer."""

    def __init__(self, tokenizer: Tokenizer, tags: ThinkTags, prompt_ids: Sequence[int] = ()) -> None:
        self._tokenizer, self._tags = tokenizer, tags
        self._inside = tags.opened_by(prompt_ids)
        # settled: the reply's opening text is known to be reasoning or answer, so none is held
        self._settled = self._inside or tags.close_id in prompt_ids[-_CLOSED_WITHIN:]
        self._reader = ThinkReader(tokenizer, tags, self._inside)
        self._held = ""          # answer text before the reply's first tag, while it is unsettled
        self._waited = 0         # reply tokens read while unsettled

    def feed(self, token_ids: Sequence[int]) -> HarmonyDelta:
        out, run = HarmonyDelta(), []
        for t in token_ids:
            t = int(t)
            if t == self._tags.close_id and not self._inside:
                out += self._stray_close(run)
                run = []
                continue
            run.append(t)
            if t == self._tags.open_id and not self._inside:    # as ThinkReader reads the tags
                self._inside = self._settled = True
            elif t == self._tags.close_id:
                self._inside = False
            if not self._settled:
                self._waited += 1
                if self._waited >= HOLD_TOKENS:     # token by token, so a stream and a whole reply agree
                    out += self._read(run)
                    run, self._settled = [], True
        return out + self._read(run)

    def finish(self) -> HarmonyDelta:
        said, held = self._reader.finish(), self._held
        self._held, self._settled = "", True
        return HarmonyDelta(said.reasoning, held + said.content)

    def _read(self, ids: list[int]) -> HarmonyDelta:
        said = self._reader.feed(ids) if ids else HarmonyDelta()
        if not self._settled:
            self._held += said.content
            return HarmonyDelta()
        held, self._held = self._held, ""
        return HarmonyDelta(said.reasoning, held + said.content)

    def _stray_close(self, run: list[int]) -> HarmonyDelta:
        """``</think>`` with no block open: the end of the reasoning when it is the reply's first tag, else
        dropped. What follows starts a new run of answer, its leading line breaks dropped as after a block."""
        said = self._read(run)
        tail = self._reader.finish()
        self._reader = ThinkReader(self._tokenizer, self._tags)
        if self._settled:
            return said + tail
        reasoning, self._held, self._settled = self._held + tail.content, "", True
        return HarmonyDelta(reasoning=reasoning)
