"""The window's reply text between two ticks of the bridge: the engine's decoded text, or — for a reasoning
model (harmony's channels, or <think> tags) — the reply's tokens read into its reasoning and its answer.
Runs on the bridge thread."""
from __future__ import annotations

from app.bridge_api import ReplyReader, RequestDelta
from app.messages import TextBatch, TextChunk


class ReplyText:
    """Text of the window's requests not yet sent to the GUI, per request."""

    def __init__(self) -> None:
        self._text: dict[str, list[str]] = {}
        self._thinking: dict[str, list[str]] = {}
        self._readers: dict[str, ReplyReader] = {}     # requests whose tokens are read into reasoning and answer
        self._used: dict[str, int] = {}                # prompt and reply tokens of each request, as last told

    def __bool__(self) -> bool:
        return bool(self._text or self._thinking)

    def read_apart(self, request_id: str, reader: ReplyReader) -> None:
        self._readers[request_id] = reader

    def add(self, d: RequestDelta) -> None:
        self._used[d.request_id] = d.prompt_tokens + d.completion_tokens
        reader = self._readers.get(d.request_id)
        if reader is None:
            if d.new_text:
                self._text.setdefault(d.request_id, []).append(d.new_text)
            return
        said = reader.feed(d.new_token_ids)
        if d.finished:
            said += reader.finish()
            del self._readers[d.request_id]
        if said.reasoning:
            self._thinking.setdefault(d.request_id, []).append(said.reasoning)
        answer = said.content + said.cut_call + "".join(f"\n\n`{c.name}({c.arguments})`" for c in said.calls)
        if answer:
            self._text.setdefault(d.request_id, []).append(answer)

    def forget(self, request_id: str) -> None:
        """The request ended without a final delta (an error before it ran)."""
        self._readers.pop(request_id, None)
        self._used.pop(request_id, None)

    def take(self) -> TextBatch | None:
        """Everything held, as one batch (None when nothing is)."""
        if not self:
            return None
        ids = list(dict.fromkeys([*self._text, *self._thinking]))
        chunks = tuple(TextChunk(rid, "".join(self._text.get(rid, ())), "".join(self._thinking.get(rid, ())),
                                 self._used.get(rid, 0))
                       for rid in ids)
        self._text, self._thinking, self._used = {}, {}, {}
        return TextBatch(chunks)
