"""Reading tool calls out of a reply, whole or streamed, in the syntax a chat template teaches.

A call that does not spell a call of one of the request's tools (an unknown name, JSON that does not
parse, arguments that are not an object) stays content, as the model wrote it. A call the token limit
cut off (finish_reason "length") is dropped: the calls completed before it are returned, and the client
never gets half a call as markup in ``content`` nor arguments that do not parse. A closing tag with no
call open (a model that closes a call it never opened) is dropped.
"""
from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.server.tools import ToolPlan


@dataclass(frozen=True)
class ToolSyntax:
    """How a family's replies spell tool calls: data, so one reader and one grammar writer serve all."""

    marker: str              # the text that announces the call (Hermes) or the list of calls (Mistral)
    close: str               # the text that ends one call; "" = the list runs to the end of the reply
    opening: str             # what a forced reply writes after the marker ...
    closing: str             # ... and before the close
    separator: str           # between two forced calls
    list_end: str            # after the last call of a list
    id_prefix: str           # call ids: prefix + random hex digits (Mistral templates insist on 9)
    id_digits: int
    marker_token: int | None = None   # the marker as one token id of this model (None: several tokens)
    close_token: int | None = None
    marker_hidden: bool = False       # decoding drops the marker (a special token): a list starts bare

    @property
    def listed(self) -> bool:
        """The calls follow the marker as one JSON list, not one object per marker."""
        return not self.close

    def new_id(self) -> str:
        return self.id_prefix + secrets.token_hex(self.id_digits)[: self.id_digits]


HERMES = ToolSyntax(marker="<tool_call>", close="</tool_call>", opening="\n", closing="\n", separator="\n",
                    list_end="", id_prefix="call_", id_digits=24)
MISTRAL = ToolSyntax(marker="[TOOL_CALLS]", close="", opening=" [", closing="", separator=", ", list_end="]",
                     id_prefix="", id_digits=9)


def new_call_id() -> str:
    """An id for a call read from a format that names none (harmony): ``call_`` and 24 hex digits."""
    return "call_" + secrets.token_hex(12)


@dataclass(frozen=True)
class ToolCall:
    """One call read out of a reply; ``arguments_json`` is a JSON object as text."""

    id: str
    name: str
    arguments_json: str

    def to_openai(self) -> dict:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments_json}}


@dataclass(frozen=True)
class ContentDelta:
    """Reply text that is not part of a call."""

    text: str


@dataclass(frozen=True)
class ToolCallDelta:
    """A whole call, streamed as one OpenAI ``delta.tool_calls`` entry (``index`` counts from 0)."""

    index: int
    call: ToolCall

    def to_openai(self) -> dict:
        return {"index": self.index, **self.call.to_openai()}


@dataclass(frozen=True)
class ToolCallFormat:
    """Reads calls of ``syntax`` naming one of ``names`` out of a reply."""

    syntax: ToolSyntax
    names: frozenset[str]

    def call_from(self, value: object) -> ToolCall | None:
        """The call ``value`` (a parsed JSON value) spells, or None when it is not a call of a tool."""
        if not isinstance(value, dict) or not isinstance(value.get("name"), str) or value["name"] not in self.names:
            return None
        arguments = value.get("arguments", {})
        if isinstance(arguments, str):       # some models write the arguments as a JSON string
            arguments = _json_value(arguments)
        if not isinstance(arguments, dict):
            return None
        return ToolCall(self.syntax.new_id(), value["name"], json.dumps(arguments, ensure_ascii=False))

    def calls_in_list(self, text: str) -> tuple[list[ToolCall], str] | None:
        """(calls, the text after the list) when ``text`` starts with a JSON list of calls, else None."""
        stripped = text.lstrip()
        try:
            value, end = json.JSONDecoder().raw_decode(stripped)
        except (json.JSONDecodeError, RecursionError):
            return None
        if not isinstance(value, list) or not value:
            return None
        calls = [self.call_from(item) for item in value]
        if any(c is None for c in calls):
            return None
        return calls, stripped[end:]

    def calls_before_cut(self, body: str) -> list[ToolCall] | None:
        """The whole calls in ``body``, the text after a marker that the token limit cut off: [] when it
        cut the first call, None when ``body`` is not the start of a call (it stays content)."""
        text = body.lstrip()
        if self.syntax.listed:
            if not text:
                return []
            if text[0] != "[":
                return None
            text = text[1:]
        calls: list[ToolCall] = []
        while True:
            text = text.lstrip()
            if not text:
                return calls
            if text[0] != "{":
                return None
            try:
                value, end = json.JSONDecoder().raw_decode(text)
            except RecursionError:
                return calls
            except json.JSONDecodeError as e:
                return calls if _ran_out(text, e) else None    # the call the limit cut; else bad JSON: content
            call = self.call_from(value)
            if call is None:
                return None
            calls.append(call)
            text = text[end:].lstrip()
            if not self.syntax.listed:         # one call per marker: only (part of) its close may follow
                return calls if self.syntax.close.startswith(text) else None
            if text and text[0] != ",":
                return None
            text = text[1:]


_UNFINISHED_SCALAR = re.compile(r"-?\d*(?:\.\d*)?(?:[eE][+-]?\d*)?")


def _ran_out(text: str, e: json.JSONDecodeError) -> bool:
    """Whether JSON ``text`` failed only for ending too soon (a cut), not for a mistake before its end:
    the error at the end, inside a string, or at a literal or number left unfinished."""
    rest = text[e.pos:].rstrip()
    if not rest or e.msg.startswith("Unterminated string"):
        return True
    return any(word.startswith(rest) for word in ("true", "false", "null")) or \
        _UNFINISHED_SCALAR.fullmatch(rest) is not None


def _json_value(text: str) -> object:
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return None


def parse_tool_calls(text: str, plan: ToolPlan, cut_off: bool = False) -> tuple[str | None, list[ToolCall]]:
    """(content, calls) of a whole reply. Text that does not spell a call of one of the tools (an
    unknown name, JSON that does not parse) stays content; content is None when only calls remain.
    ``cut_off``: the reply ended at its token limit, so a call left unfinished at its end is dropped."""
    parser = ToolStreamParser(plan)
    events = parser.feed(text) + parser.finish(cut_off)
    content = "".join(e.text for e in events if isinstance(e, ContentDelta))
    calls = [e.call for e in events if isinstance(e, ToolCallDelta)]
    return (content or None, calls) if calls else (content, [])


class ToolStreamParser:
    """Turns a streamed reply into content and call events, as :func:`parse_tool_calls` reads it whole.

    Text that may be the start of a call (a partial marker, a call not yet closed) is held back until
    it is known; a call is emitted whole once it is complete. Whitespace that only separates content
    from a call is dropped. Without a parser in the plan every piece passes through unchanged.
    """

    def __init__(self, plan: ToolPlan) -> None:
        self._format = plan.parser
        self._buffer = ""          # outside a call: text held because it may start a marker
        self._body: str | None = None   # inside a call: its text so far; None outside
        self._opener = ""          # the marker text the current call started with ("" when hidden)
        self._space = ""           # whitespace held back: it is dropped if a call follows
        self._gap = ""             # the whitespace before the last call, given back if content follows
        self._after_call = False   # the last thing read was a call: whitespace now touches it
        self._emitted = False      # some content has been emitted
        self._calls = 0

    def feed(self, text: str) -> list[ContentDelta | ToolCallDelta]:
        if self._format is None:
            return [ContentDelta(text)] if text else []
        events: list[ContentDelta | ToolCallDelta] = []
        if self._body is not None:
            self._body += text
        else:
            self._buffer += text
        self._advance(events)
        return events

    def finish(self, cut_off: bool = False) -> list[ContentDelta | ToolCallDelta]:
        """The events of whatever is still held, at the end of the reply. ``cut_off``: the reply ended at
        its token limit, so an unfinished call (or the start of a marker right after a call) is dropped."""
        if self._format is None:
            return []
        events: list[ContentDelta | ToolCallDelta] = []
        if self._body is not None:
            self._end_call(self._body, events, final=True, cut_off=cut_off)
        if cut_off and self._after_call:
            self._buffer = ""                  # the marker of a next call, cut before it was whole
        self._content(self._buffer, events)
        self._buffer = ""
        if self._space and not self._after_call:
            events.append(ContentDelta(self._space))
        self._space = ""
        return events

    def _advance(self, events: list) -> None:
        syntax = self._format.syntax
        while True:
            if self._body is not None:
                if syntax.listed:
                    return                     # a list of calls runs to the end of the reply
                end = self._body.find(syntax.close)
                if end < 0:
                    return
                rest = self._body[end + len(syntax.close):]
                self._end_call(self._body[:end], events, final=False)
                self._buffer = rest
                continue
            if self._hidden_list_starts():
                self._start_call("", self._buffer.lstrip(), "", events)
                continue
            start = self._buffer.find(syntax.marker)
            stray = self._buffer.find(syntax.close) if syntax.close else -1
            if stray >= 0 and (start < 0 or stray < start):
                self._drop_close(stray, events)
                continue
            if start >= 0:
                self._start_call(self._buffer[:start], self._buffer[start + len(syntax.marker):],
                                 syntax.marker, events)
                continue
            keep = max(_partial_marker(self._buffer, syntax.marker),
                       _partial_marker(self._buffer, syntax.close) if syntax.close else 0)
            self._content(self._buffer[:len(self._buffer) - keep], events)
            self._buffer = self._buffer[len(self._buffer) - keep:]
            return

    def _hidden_list_starts(self) -> bool:
        # A dropped marker leaves the list bare; it can only open the reply.
        if not self._format.syntax.marker_hidden or self._emitted or self._calls:
            return False
        return self._buffer.lstrip().startswith("[")

    def _drop_close(self, at: int, events: list) -> None:
        # A close with no call open is markup, never content. The text on either side joins with one
        # run of whitespace: the one before it when there is one (as around a call), else the one after.
        self._content(self._buffer[:at], events)
        self._buffer = self._buffer[at + len(self._format.syntax.close):]
        self._after_call = self._after_call or bool(self._space) or not self._emitted

    def _start_call(self, before: str, body: str, opener: str, events: list) -> None:
        self._content(before, events)
        self._gap, self._space = self._space, ""
        self._body, self._opener, self._buffer = body, opener, ""

    def _end_call(self, body: str, events: list, final: bool, cut_off: bool = False) -> None:
        """Emit the call(s) ``body`` spells, or give it back as content when it spells none; a body the
        token limit cut (``cut_off``) gives its whole calls and drops the rest."""
        fmt = self._format
        syntax = fmt.syntax
        self._body = None
        if syntax.listed:
            found = fmt.calls_in_list(body)
            calls, rest = found if found is not None else ([], "")
        else:
            value = _json_value(body.strip())
            call = fmt.call_from(value)
            calls, rest = ([call], "") if call is not None else ([], "")
        if not calls and cut_off and (whole := fmt.calls_before_cut(body)) is not None:
            if not whole:
                self._space = self._gap = ""       # what separated it from the content before goes too
                return
            calls = whole
        if not calls:
            self._space = self._gap
            closed = "" if final else syntax.close
            self._after_call = False
            self._content(self._opener + body + closed, events)
            return
        for call in calls:
            events.append(ToolCallDelta(self._calls, call))
            self._calls += 1
        self._space, self._gap, self._after_call = self._gap, "", True
        self._content(rest, events)

    def _content(self, piece: str, events: list) -> None:
        """Emit ``piece`` as content, holding its trailing whitespace back (a call may follow it)."""
        if self._after_call:
            piece = piece.lstrip()
        core = piece.rstrip()
        if not core:
            if not self._after_call:
                self._space += piece
            return
        before = self._space if (self._emitted or not self._after_call) else ""
        events.append(ContentDelta(before + core))
        self._space, self._after_call, self._emitted = piece[len(core):], False, True


def _partial_marker(text: str, marker: str) -> int:
    """How many characters at the end of ``text`` could be the start of ``marker``."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0
