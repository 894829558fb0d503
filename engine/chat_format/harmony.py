"""The harmony chat format of gpt-oss: prompts rendered, and replies read token by token into their channels.

A reply is a run of messages, each ``<|start|>ROLE[ to=RECIPIENT]<|channel|>CHANNEL[ <|constrain|>TYPE]
<|message|>TEXT`` closed by ``<|end|>``, ``<|call|>`` (a tool call) or ``<|return|>`` (the reply is done);
the prompt ends with ``<|start|>assistant``, so the first message's header starts at once. Channels:
``analysis`` (reasoning, shown apart), ``final`` (the answer), ``commentary`` (to ``functions.NAME``: a tool
call whose text is its JSON arguments; without a recipient: text for the user).

One interface, two engines behind it:

- openai-harmony (``render_conversation_for_completion``, ``StreamableParser``) whenever its encoding can
  be built from the model's own vocabulary (engine/chat_format/o200k.py) and its special-token ids are
  the model's;
- otherwise (a vocabulary that is not o200k, such as a tiny test model's) the model's chat template renders
  the prompt and a token-level reader keyed on the model's ids of the special tokens reads the reply.

Both readers only say which message a piece of text belongs to; :class:`_Router` alone decides what the
text is (reasoning, content, a call), so the two cannot disagree about meaning.
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from engine.chat_format import harmony_render, o200k
from engine.chat_format.harmony_render import DEFAULT_EFFORT, EFFORTS, check_effort
from engine.detokenizer import IncrementalDetokenizer

if TYPE_CHECKING:
    from engine.tokenizer import Tokenizer

__all__ = [
    "DEFAULT_EFFORT",
    "EFFORTS",
    "HarmonyCall",
    "HarmonyChat",
    "HarmonyDelta",
    "HarmonyIds",
    "ReplyReader",
    "check_effort",
]

_NAMES = {"start": "<|start|>", "end": "<|end|>", "message": "<|message|>", "channel": "<|channel|>",
          "constrain": "<|constrain|>", "ret": "<|return|>", "call": "<|call|>"}
_RECIPIENT = re.compile(r"to=([^\s<]+)")
FUNCTIONS = "functions."


@dataclass(frozen=True)
class HarmonyIds:
    """The model's token ids of harmony's special tokens."""

    start: int
    end: int
    message: int
    channel: int
    constrain: int
    ret: int
    call: int

    @classmethod
    def of(cls, tokenizer: Tokenizer) -> HarmonyIds | None:
        """The ids in ``tokenizer``, or None when any is missing (not a harmony model)."""
        ids = {k: tokenizer.token_to_id(text) for k, text in _NAMES.items()}
        return None if None in ids.values() else cls(**ids)

    @property
    def closing(self) -> frozenset[int]:
        return frozenset((self.end, self.ret, self.call))


@dataclass(frozen=True)
class HarmonyCall:
    """A tool call: the function's name and its arguments as written (JSON text)."""

    name: str
    arguments: str


@dataclass(frozen=True)
class HarmonyDelta:
    """What some reply tokens added: reasoning text, answer text, finished calls."""

    reasoning: str = ""
    content: str = ""
    calls: tuple[HarmonyCall, ...] = ()
    cut_call: str = ""      # the arguments of a call the reply stopped inside: a reader of text may show them

    def __add__(self, other: HarmonyDelta) -> HarmonyDelta:
        return HarmonyDelta(self.reasoning + other.reasoning, self.content + other.content,
                            self.calls + other.calls, self.cut_call + other.cut_call)

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content or self.calls or self.cut_call)


class ReplyReader(Protocol):
    """Reads one streamed reply; ``feed`` the new token ids of each step, then ``finish``."""

    def feed(self, token_ids: Sequence[int]) -> HarmonyDelta: ...

    def finish(self) -> HarmonyDelta: ...


@dataclass
class _Router:
    """Turns (message header, text) into reasoning, content and calls; the one place meaning is decided."""

    _args: list[str] = field(default_factory=list)     # the arguments of the call being written
    _wrote: set[str] = field(default_factory=set)      # kinds ("reasoning", "content") earlier messages wrote
    _writing: str | None = None                        # the kind this message writes

    def text(self, channel: str | None, recipient: str | None, piece: str) -> HarmonyDelta:
        if not piece:
            return HarmonyDelta()
        if recipient and recipient.startswith(FUNCTIONS):
            self._args.append(piece)
            return HarmonyDelta()
        kind = "reasoning" if channel == "analysis" or recipient else "content"   # or text for a built-in tool
        if self._writing is None and kind in self._wrote:
            piece = "\n\n" + piece        # a second message of the same kind (a preamble, then the answer)
        self._writing = kind
        return HarmonyDelta(reasoning=piece) if kind == "reasoning" else HarmonyDelta(content=piece)

    def end(self, recipient: str | None) -> HarmonyDelta:
        """The message ended: a call to a function is complete."""
        if self._writing is not None:
            self._wrote.add(self._writing)
            self._writing = None
        args, self._args = "".join(self._args), []
        if recipient and recipient.startswith(FUNCTIONS):
            return HarmonyDelta(calls=(HarmonyCall(recipient[len(FUNCTIONS):], args.strip()),))
        return HarmonyDelta()

    def cut(self) -> HarmonyDelta:
        """The reply stopped inside a message: a call not closed is no call, and its arguments so far are
        ``cut_call`` (a chat shows them as what the model said; the server drops them, as it does a cut call
        of other formats)."""
        args, self._args = "".join(self._args), []
        return HarmonyDelta(cut_call=args)


def parse_header(text: str) -> tuple[str | None, str | None]:
    """(channel, recipient) of a message header such as ``assistant to=functions.f<|channel|>commentary
    <|constrain|>json`` (the recipient may stand before or after the channel)."""
    head = text.partition(_NAMES["constrain"])[0]
    channel_part = head.partition(_NAMES["channel"])[2].split()
    found = _RECIPIENT.search(head)
    return (channel_part[0] if channel_part else None), (found.group(1) if found else None)


@dataclass(frozen=True)
class HarmonyStopScope:
    """``engine.sampling.StopScope`` of a harmony reply: the answer is the text of the messages its readers
    show as content (not ``analysis``, addressed to no one); headers and other messages are not."""

    tokenizer: Tokenizer
    ids: HarmonyIds
    lead: str = ""

    def gate(self) -> _HarmonyGate:
        return _HarmonyGate(self.tokenizer, self.ids)


_TO = "to="                 # how a header names a call's recipient before its channel


def _may_be_recipient(text: str) -> bool:
    """Whether a reply's opening text is, or may yet become, a header's recipient (`` to=functions.x``)."""
    text = text.lstrip()
    return text.startswith(_TO) or _TO.startswith(text)


class _HarmonyGate:
    """Whether each token of a reply is answer text, where a stop string may end it. A reply that opens with
    text rather than a harmony token is plain text (what the server then returns as content): it is answer
    text until a harmony token comes, from which on the format's own headers and channels decide."""

    def __init__(self, tokenizer: Tokenizer, ids: HarmonyIds) -> None:
        self._tok, self._ids = tokenizer, ids
        self._header: list[int] | None = []    # header ids being read; None inside a message's text
        self._content = False
        self._plain: bool | None = None         # None until the reply's first token says which it is
        self._specials = frozenset((ids.start, ids.message, ids.channel, ids.constrain)) | ids.closing

    def next_in_answer(self) -> bool:
        return self._plain is True or (self._header is None and self._content)

    def in_answer(self, t: int) -> bool:
        ids = self._ids
        if self._plain is not False:
            if t not in self._specials:
                self._header.append(t)          # kept as a header's start, should the format begin later
                if self._plain is None:
                    # " to=functions.x<|channel|>...": a reply may open with its header's recipient; text that
                    # is, or may yet become, "to=" is held back until it is plain or the format begins
                    if _may_be_recipient(self._tok.decode(self._header, skip_special_tokens=False)):
                        return False
                    self._plain = True
                return True                     # plain text: answer text
            self._plain = False                 # the format begins: what came before was a header's start
        if self._header is None:
            if t in ids.closing:
                self._header = []
                return False
            return self._content
        if t == ids.start:
            self._header = []
        elif t == ids.message:
            channel, recipient = parse_header(self._tok.decode(self._header, skip_special_tokens=False))
            self._content, self._header = channel != "analysis" and not recipient, None
        elif t not in ids.closing:
            self._header.append(t)
        return False


class TokenReader:
    """The reader used where openai-harmony cannot run: a state machine over the model's special ids."""

    def __init__(self, tokenizer: Tokenizer, ids: HarmonyIds) -> None:
        self._tok, self._ids, self._router = tokenizer, ids, _Router()
        self._header: list[int] | None = []    # header ids being read; None inside a message's text
        self._detok = None
        self._channel: str | None = None
        self._recipient: str | None = None

    def feed(self, token_ids: Sequence[int]) -> HarmonyDelta:
        out = HarmonyDelta()
        for t in token_ids:
            out += self._token(int(t))
        return out

    def _token(self, t: int) -> HarmonyDelta:
        ids = self._ids
        if self._header is not None:                   # between messages, or in a header
            if t == ids.start:
                self._header = []
            elif t == ids.message:
                text = self._tok.decode(self._header, skip_special_tokens=False)
                self._channel, self._recipient = parse_header(text)
                self._header, self._detok = None, IncrementalDetokenizer(self._tok)
            elif t not in ids.closing:
                self._header.append(t)
            return HarmonyDelta()
        if t in ids.closing:
            out = self._router.text(self._channel, self._recipient, self._detok.flush())
            out += self._router.end(self._recipient)
            self._header, self._detok = [], None
            return out
        return self._router.text(self._channel, self._recipient, self._detok.push(t))

    def finish(self) -> HarmonyDelta:
        if self._detok is None:
            return HarmonyDelta()
        out = self._router.text(self._channel, self._recipient, self._detok.flush())
        self._detok = None
        return out + self._router.cut()


class LibraryReader:
    """The reader over openai-harmony's ``StreamableParser``; a token the library refuses (a reply that
    breaks the format) ends the parse and the rest of the reply is read as plain text."""

    def __init__(self, encoding: Any) -> None:
        from openai_harmony import Role, StreamableParser
        self._enc, self._router = encoding, _Router()
        self._parser = StreamableParser(encoding, Role.ASSISTANT)
        self._broken: list[int] | None = None         # the tokens after the library gave up

    def feed(self, token_ids: Sequence[int]) -> HarmonyDelta:
        from openai_harmony import HarmonyError
        out = HarmonyDelta()
        for t in token_ids:
            if self._broken is not None:
                self._broken.append(int(t))
                continue
            p, done = self._parser, len(self._parser.messages)
            try:
                p.process(int(t))
            except HarmonyError:
                self._broken = [int(t)]
                continue
            out += self._router.text(p.current_channel, p.current_recipient, p.last_content_delta or "")
            if len(p.messages) > done:
                out += self._router.end(p.messages[-1].recipient)
        return out

    def finish(self) -> HarmonyDelta:
        if self._broken is not None:
            return self._router.cut() + HarmonyDelta(content=self._enc.decode(self._broken))
        return self._router.cut()


@dataclass(frozen=True)
class HarmonyPrompter:
    """A harmony chat as ``engine.context.PromptTokenizer``: fit_messages renders through it."""

    chat: HarmonyChat
    effort: str = DEFAULT_EFFORT
    tools: tuple[dict, ...] = ()

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.chat.tokenizer.encode(text, add_special_tokens)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            tokenize: bool = False, **kwargs: Any) -> str | list[int]:
        ids = self.chat.render(messages, self.effort, list(self.tools) or None)
        return ids if tokenize else self.chat.tokenizer.decode(ids, skip_special_tokens=False)


class PlainFallback:
    """A reader for a reply that may not use the format: a model that writes plain text (a fine-tune that
    lost the format, a random test model) would read as nothing at all, since its text sits where a
    header belongs. A reply that opens with text rather than a harmony token is plain text once that text
    cannot be a header's recipient (``to=``, see :class:`_HarmonyGate`, which agrees on where the answer is):
    it streams as content as it comes, harmony's tokens left out. A harmony token after it begins the format,
    the text before being that header's start: from then on the reply reads as ``inner`` does, and should it
    show nothing to the end, the text after that token comes back as content too. A reply that began in the
    format reads as ``inner`` does (a header the token limit cut shows nothing)."""

    def __init__(self, inner: ReplyReader, tokenizer: Tokenizer, ids: HarmonyIds) -> None:
        self.inner, self._tok = inner, tokenizer
        self._specials = frozenset(dataclasses.astuple(ids))
        self._held: list[int] | None = []      # the ids while it is not known whether the reply is plain text
        self._plain: IncrementalDetokenizer | None = None   # the plain text being streamed
        self._rest: list[int] | None = None    # the ids since the format began after text, its fallback's text
        self._shown = False                     # inner showed something since the format began

    def feed(self, token_ids: Sequence[int]) -> HarmonyDelta:
        out = HarmonyDelta()
        for t in token_ids:
            t = int(t)
            read = self.inner.feed([t])         # inner reads every token: the text before the format is a header's
            if self._held is not None:
                out += self._open(t)
            elif self._plain is not None:
                out += self._plain_token(t)
            else:
                if self._rest is not None:
                    self._rest.append(t)
                self._shown = self._shown or bool(read)
                out += read
        return out

    def _open(self, t: int) -> HarmonyDelta:
        """A token while the reply may yet be a header: the format begins, or the text is plain, or still held."""
        held = self._held
        if t in self._specials:
            self._held, self._rest = None, (held + [t] if held else None)
            return HarmonyDelta()
        held.append(t)
        if _may_be_recipient(self._tok.decode(held, skip_special_tokens=False)):
            return HarmonyDelta()
        self._held, self._plain = None, IncrementalDetokenizer(self._tok)
        return HarmonyDelta(content=self._plain.push(held))

    def _plain_token(self, t: int) -> HarmonyDelta:
        if t not in self._specials:
            return HarmonyDelta(content=self._plain.push(t))
        text, self._plain, self._rest = self._plain.flush(), None, [t]
        return HarmonyDelta(content=text)

    def finish(self) -> HarmonyDelta:
        out = self.inner.finish()
        if self._plain is not None:
            return HarmonyDelta(content=self._plain.flush())
        unread = self._held or self._rest        # text held to the end, or the format began and showed nothing
        if unread and not self._shown and not out:
            return HarmonyDelta(content=self._tok.decode(unread, skip_special_tokens=True))
        return out


class HarmonyChat:
    """Rendering and reading for one harmony model (``Tokenizer.harmony``)."""

    def __init__(self, tokenizer: Tokenizer, ids: HarmonyIds, encoding: Any = None) -> None:
        self.tokenizer, self.ids, self.encoding = tokenizer, ids, encoding

    @classmethod
    def of(cls, tokenizer: Tokenizer, cache_dir: Path | None = None) -> HarmonyChat | None:
        """The harmony chat of ``tokenizer``, or None when it lacks harmony's special tokens; openai-harmony
        is behind it when the vocabulary is o200k (its file written once into ``cache_dir``)."""
        ids = HarmonyIds.of(tokenizer)
        if ids is None:
            return None
        folder = cache_dir or o200k.default_cache_dir()
        encoding = None
        if o200k.write_o200k(tokenizer.vocab_token, tokenizer.vocab_size, folder):
            encoding = o200k.load_encoding(folder)
        if encoding is not None and not _same_ids(encoding, ids):
            encoding = None
        return cls(tokenizer, ids, encoding)

    @property
    def engine_name(self) -> str:
        """Which engine renders and reads: "openai-harmony" or "chat template"."""
        return "openai-harmony" if self.encoding is not None else "chat template"

    def render(self, messages: list[dict], effort: str = DEFAULT_EFFORT, tools: list[dict] | None = None) -> list[int]:
        """Prompt ids for ``messages`` (see engine/chat_format/harmony_render.py), ending where the
        assistant speaks; ``effort`` is written into the system message."""
        check_effort(effort)
        if self.encoding is not None:
            from openai_harmony import Role
            conv = harmony_render.conversation(messages, effort, tools)
            return list(self.encoding.render_conversation_for_completion(conv, Role.ASSISTANT))
        # a chat template writes ``parameters | tojson``: a tool sent without any gets an object of none
        # (what the library writes as ``() => any``)
        tools = [{**t, "function": {"parameters": {"type": "object", "properties": {}}, **t["function"]}}
                 if isinstance(t.get("function"), dict) else t for t in tools or ()]
        variables = {"reasoning_effort": effort, **({"tools": tools} if tools else {})}
        return list(self.tokenizer.apply_chat_template(harmony_render.template_messages(messages),
                                                       add_generation_prompt=True, tokenize=True, **variables))

    def prompter(self, effort: str = DEFAULT_EFFORT, tools: Sequence[dict] = ()) -> HarmonyPrompter:
        return HarmonyPrompter(self, check_effort(effort), tuple(tools))

    def reader(self) -> ReplyReader:
        inner = LibraryReader(self.encoding) if self.encoding is not None else TokenReader(self.tokenizer, self.ids)
        return PlainFallback(inner, self.tokenizer, self.ids)

    def stop_scope(self) -> HarmonyStopScope:
        """Where stop strings apply in a reply: the text it shows as content, from its first."""
        return HarmonyStopScope(self.tokenizer, self.ids)

    def parse(self, token_ids: Sequence[int]) -> HarmonyDelta:
        """A whole reply read at once (the same reader as streaming)."""
        reader = self.reader()
        return reader.feed(token_ids) + reader.finish()


def _same_ids(encoding: Any, ids: HarmonyIds) -> bool:
    """The library's special-token ids are the model's (a model with another numbering cannot use it)."""
    from openai_harmony import HarmonyError
    try:
        wanted = dataclasses.asdict(ids)
        return all(encoding.encode(text, allowed_special="all") == [wanted[key]] for key, text in _NAMES.items())
    except (HarmonyError, ValueError):     # a name the library does not know as a special token
        return False
