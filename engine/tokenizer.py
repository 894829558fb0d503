"""Tokenizer: ``tokenizer.json`` through the ``tokenizers`` library, the model's Jinja chat template
(compiled and rendered by ``engine.chat_template``), and streaming detokenisation.

The model folder is read the way Hugging Face checkpoints lay it out:

- ``tokenizer.json``            the vocabulary, merges, normaliser, pre-tokeniser and decoder (required,
                                unless the folder ships a tiktoken vocabulary: engine/tiktoken_vocab.py);
- ``tokenizer_config.json``     special tokens, ``chat_template``, and ``add_bos_token`` /
                                ``add_eos_token`` (used when tokenizer.json has no post-processor);
- ``chat_template.jinja``       the chat template as its own file (wins over the config's copy);
- ``generation_config.json``    the end-of-sequence ids generation stops at (int or list);
- ``config.json``               a fallback for the bos/eos ids.
"""
from __future__ import annotations

import functools
import json
import re
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenizers import AddedToken, processors
from tokenizers import Tokenizer as _Backend

from engine.chat_template import ChatTemplate, ChatTemplateError, ChatTemplateSyntaxError, TemplateOrigin
from engine.detokenizer import IncrementalDetokenizer  # noqa: F401  (part of this module's API)
from engine.errors import ModelLoadError

if TYPE_CHECKING:
    from engine.chat_format.harmony import HarmonyChat
    from engine.chat_format.think import ThinkTags

_SPECIAL_NAMES = ("bos_token", "eos_token", "pad_token", "unk_token")


def _read_json(path: Path) -> dict | None:
    """The JSON object in ``path``, or None when the file does not exist."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelLoadError(
            f"{path} is not valid JSON ({exc}); restore the file from the original checkpoint"
        ) from exc
    if not isinstance(data, dict):
        raise ModelLoadError(
            f"{path} does not hold a JSON object; restore the file from the original checkpoint"
        )
    return data


def _token_text(value: Any) -> str | None:
    """A special token given as a string or as an AddedToken-like dict ``{"content": ...}``."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _ids(value: Any) -> list[int]:
    """Token ids given as an int, a list of ints or nothing."""
    if isinstance(value, bool) or value is None:
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        return [int(v) for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


def _pick_template(value: Any) -> str | None:
    """The default chat template from a string or a list of ``{name, template}`` entries."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {e.get("name"): e.get("template") for e in value if isinstance(e, dict)}
        chosen = named.get("default", next(iter(named.values()), None))
        return chosen if isinstance(chosen, str) else None
    return None


def _load_backend(folder: Path) -> _Backend:
    path = folder / "tokenizer.json"
    if not path.is_file() and (folder / "tiktoken.model").is_file():     # Moonlight, Kimi K2
        from engine.tiktoken_vocab import tiktoken_backend
        return tiktoken_backend(folder, _read_json(folder / "tokenizer_config.json") or {})
    if not path.is_file():
        raise ModelLoadError(
            f"{path} is missing; copy tokenizer.json from the original checkpoint into the model folder"
        )
    try:
        return _Backend.from_file(str(path))
    except Exception as exc:  # the Rust library raises plain Exceptions for any parse error
        raise ModelLoadError(
            f"{path} could not be read ({exc}); restore tokenizer.json from the original checkpoint"
        ) from exc


@dataclass(frozen=True)
class SpecialTokens:
    """The named special tokens as text (None when the model has none)."""

    bos_token: str | None = None
    eos_token: str | None = None
    pad_token: str | None = None
    unk_token: str | None = None

    def as_template_vars(self) -> dict[str, str]:
        return {k: v for k, v in vars(self).items() if v is not None}


LONG_TEXT = 4096       # characters from which Tokenizer.encode lets other threads run while it works


class Tokenizer:
    """Text <-> token ids for one model, plus its chat template."""

    def __init__(self, backend: _Backend, special: SpecialTokens, eos_token_ids: Iterable[int],
                 bos_token_id: int | None, pad_token_id: int | None, chat_template: str | None,
                 template_origin: TemplateOrigin | None = None) -> None:
        self._backend = backend
        self.special_tokens = special
        self.bos_token_id = bos_token_id
        self.pad_token_id = pad_token_id
        self.eos_token_ids: frozenset[int] = frozenset(eos_token_ids)
        self.chat_template = chat_template
        self.template_error: ChatTemplateSyntaxError | None = None   # why a template the model has cannot be used
        self._template: ChatTemplate | None = None
        if chat_template:
            try:
                self._template = ChatTemplate(chat_template, template_origin)
            except ChatTemplateSyntaxError as e:      # plain prompts still work; chat is refused, saying why
                self.template_error = e

    @property
    def template_problem(self) -> str | None:
        """Why the template the model has cannot be used (it does not parse), as one line; None when it can."""
        return None if self.template_error is None else str(self.template_error)

    @classmethod
    def from_dir(cls, path: str | Path) -> Tokenizer:
        """Load the tokenizer files of a Hugging Face model folder (see the module docstring)."""
        folder = Path(path)
        backend = _load_backend(folder)
        cfg = _read_json(folder / "tokenizer_config.json") or {}
        gen = _read_json(folder / "generation_config.json") or {}
        model_cfg = _read_json(folder / "config.json") or {}
        special = SpecialTokens(**{name: _token_text(cfg.get(name)) for name in _SPECIAL_NAMES})
        _register_special_tokens(backend, special)
        _apply_bos_eos_flags(backend, cfg, special)
        eos, bos, pad = _special_ids(backend, special, gen, model_cfg)
        template = _pick_template(cfg.get("chat_template"))
        origin = TemplateOrigin(folder / "tokenizer_config.json", "chat_template")
        jinja_file = folder / "chat_template.jinja"
        if jinja_file.is_file():
            template, origin = jinja_file.read_text(encoding="utf-8"), TemplateOrigin(jinja_file)
        return cls(backend, special, eos, bos, pad, template, origin)

    @property
    def vocab_size(self) -> int:
        """Number of token ids the tokenizer can produce, added tokens included."""
        return self._backend.get_vocab_size(with_added_tokens=True)

    @property
    def has_chat_template(self) -> bool:
        return self._template is not None

    def vocab_token(self, token_id: int) -> str | None:
        """The vocabulary entry of one id as tokenizer.json spells it (byte-level text), or None."""
        return self._backend.id_to_token(token_id)

    @functools.cached_property
    def harmony(self) -> HarmonyChat | None:
        """The harmony chat format (gpt-oss) when the vocabulary has its special tokens, else None."""
        from engine.chat_format.harmony import HarmonyChat
        return HarmonyChat.of(self)

    @functools.cached_property
    def think(self) -> ThinkTags | None:
        """The ``<think>`` reasoning tags (Qwen3, GLM-4.5) when the model writes them, else None (and None
        for a harmony model, whose reasoning has its own channel)."""
        from engine.chat_format.think import ThinkTags
        return None if self.harmony is not None else ThinkTags.of(self)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for: a byte-level entry's own bytes (which may be part of a character),
        a ``<0xNN>`` byte-fallback entry's byte, else its text in UTF-8."""
        text = self._backend.decode([token_id], skip_special_tokens=False)
        if "\ufffd" not in text:
            return text.encode("utf-8")
        piece = self._backend.id_to_token(token_id) or ""
        fallback = re.fullmatch(r"<0x([0-9A-Fa-f]{2})>", piece)
        if fallback:
            return bytes([int(fallback.group(1), 16)])
        table = _byte_values()
        if piece and all(c in table for c in piece):
            return bytes(table[c] for c in piece)
        return text.encode("utf-8")

    def token_to_id(self, token: str) -> int | None:
        """The id of one vocabulary entry, or None when it is not in the vocabulary."""
        return self._backend.token_to_id(token)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; ``add_special_tokens`` adds what the post-processor adds (e.g. bos). A long
        text is encoded as a batch of one, which lets other Python threads run meanwhile (a server's other
        requests: a single encode holds the interpreter for the whole text, seconds for megabytes)."""
        if len(text) >= LONG_TEXT:
            return self._backend.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
        return self._backend.encode(text, add_special_tokens=add_special_tokens).ids

    @functools.cached_property
    def longest_token_chars(self) -> int:
        """Characters of the longest vocabulary entry (added tokens included): no token covers more of a
        text, so a text of C characters has at least C / this many tokens."""
        return max((len(t) for t in self._backend.get_vocab(with_added_tokens=True)), default=1) or 1

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of ``ids``; incomplete UTF-8 at the ends shows as U+FFFD."""
        return self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            tokenize: bool = False, **kwargs: Any) -> str | list[int]:
        """Render ``messages`` with the model's chat template; with ``tokenize`` return the ids.

        Extra keyword arguments (``tools``, ``enable_thinking``, ...) become template variables.
        The rendered text already holds the template's special tokens, so none are added when tokenizing.
        A template that fails raises ChatTemplateRefusal or ChatTemplateFault (``engine.chat_template``).
        """
        if self._template is None and self.template_problem:
            raise ChatTemplateError(f"{self.template_problem}; until then send a plain prompt instead")
        if self._template is None:
            raise ChatTemplateError(
                "this model has no chat template; send a plain prompt instead or add chat_template "
                "to the model's tokenizer_config.json"
            )
        variables = {**self.special_tokens.as_template_vars(), **kwargs}
        text = self._template.render(messages, add_generation_prompt, variables)
        if not tokenize:
            return text
        return self._encode_rendered(text, messages,
                                     lambda ms: self._template.render(ms, add_generation_prompt, variables))

    def _encode_rendered(self, text: str, messages: list[dict], render: Any) -> list[int]:
        """Ids of a rendered conversation: the template's special tokens as tokens, and the messages' own
        text as text, whatever it holds. A message that says ``<|im_end|>`` must not end itself (and let
        what follows pose as another role): where a message's text spells a special token, the
        conversation is rendered again with each such spelling marked (a mark no text holds), and the
        marks are encoded as the spelling's plain characters. Any other conversation encodes exactly as
        its rendered text does. ``render``: messages -> rendered text."""
        specials, pattern = self._special_texts, self._special_pattern
        if pattern is None or not any(pattern.search(t) for t in _message_texts(messages)):
            return self.encode(text, add_special_tokens=False)
        mark = f"\ue000{secrets.token_hex(6)}:"
        marked = _map_message_texts(messages, lambda t: pattern.sub(
            lambda m: f"{mark}{specials.index(m.group(0))}\ue001", t))
        ids: list[int] = []
        for k, piece in enumerate(re.split(re.escape(mark) + r"(\d+)\ue001", render(marked))):
            if k % 2 == 0:
                ids += self.encode(piece, add_special_tokens=False) if piece else []
            else:
                ids += self._plain_backend.encode(specials[int(piece)], add_special_tokens=False).ids
        return ids

    @functools.cached_property
    def _special_texts(self) -> tuple[str, ...]:
        """How each special token (one ``encode`` never splits) is spelt."""
        return tuple(t.content for t in self._backend.get_added_tokens_decoder().values() if t.special and t.content)

    @functools.cached_property
    def _special_pattern(self) -> re.Pattern | None:
        """A pattern that finds any special token's spelling, longest first (None: the model has none)."""
        if not self._special_texts:
            return None
        return re.compile("|".join(re.escape(sp) for sp in sorted(self._special_texts, key=len, reverse=True)))

    @functools.cached_property
    def _plain_backend(self) -> _Backend:
        """A copy of the tokenizer that reads special tokens' spellings as plain text (a copy: a flag set on
        the shared one would change it for other threads' encodes meanwhile)."""
        plain = _Backend.from_str(self._backend.to_str())
        plain.encode_special_tokens = True
        return plain


def _map_message_texts(messages: list[dict], fn: Any) -> list[dict]:
    """``messages`` with ``fn`` applied to every text a message holds: its content (or each text part), its
    reasoning, its tool calls' arguments, at any depth (a string that ``fn`` leaves alone stays as it is,
    so a role or a type a template compares is unchanged)."""
    def mapped(value: Any) -> Any:
        if isinstance(value, str):
            return fn(value)
        if isinstance(value, dict):
            return {k: mapped(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [mapped(v) for v in value]
        return value
    return [mapped(m) for m in messages]


def _message_texts(messages: list[dict]) -> list[str]:
    """Every text the messages hold, at any depth (see :func:`_map_message_texts`)."""
    out: list[str] = []
    _map_message_texts(messages, lambda t: out.append(t) or t)
    return out


@functools.cache
def _byte_values() -> dict[str, int]:
    """The byte-level BPE alphabet, inverted: the byte each printable stand-in character is."""
    from engine.tiktoken_vocab import byte_chars
    return {c: b for b, c in enumerate(byte_chars())}


def _first_id(*values: Any) -> int | None:
    """The first id found among config values that may be an int, a list or missing."""
    for value in values:
        if _ids(value):
            return _ids(value)[0]
    return None


def _special_ids(backend: _Backend, special: SpecialTokens, gen: dict,
                 model_cfg: dict) -> tuple[set[int], int | None, int | None]:
    """(eos ids, bos id, pad id): the tokenizer's own tokens first, then generation_config, then config."""
    def token_id(text: str | None) -> int | None:
        return backend.token_to_id(text) if text is not None else None

    eos = {i for i in [token_id(special.eos_token)] if i is not None} | set(_ids(gen.get("eos_token_id")))
    if not eos:
        eos = set(_ids(model_cfg.get("eos_token_id")))
    bos = token_id(special.bos_token)
    if bos is None:
        bos = _first_id(gen.get("bos_token_id"), model_cfg.get("bos_token_id"))
    pad = token_id(special.pad_token)
    if pad is None:
        pad = _first_id(gen.get("pad_token_id"), model_cfg.get("pad_token_id"))
    return eos, bos, pad


def _register_special_tokens(backend: _Backend, special: SpecialTokens) -> None:
    # A named special token must never be split and must be skipped by skip_special_tokens, even
    # when tokenizer.json lists it as an ordinary vocabulary entry or not at all.
    tokens = [AddedToken(t, special=True, normalized=False) for t in vars(special).values() if t]
    if tokens:
        backend.add_special_tokens(tokens)


def _apply_bos_eos_flags(backend: _Backend, cfg: dict, special: SpecialTokens) -> None:
    # A post-processor in tokenizer.json is authoritative about which special tokens encode() adds.
    # Without one, tokenizer_config.json's add_bos_token/add_eos_token flags decide.
    if backend.post_processor is not None:
        return
    add_bos = bool(cfg.get("add_bos_token")) and backend.token_to_id(special.bos_token or "") is not None
    add_eos = bool(cfg.get("add_eos_token")) and backend.token_to_id(special.eos_token or "") is not None
    if not (add_bos or add_eos):
        return
    bos = f"{special.bos_token}:0 " if add_bos else ""
    eos = f" {special.eos_token}:0" if add_eos else ""
    added = [(t, backend.token_to_id(t))
             for t, on in ((special.bos_token, add_bos), (special.eos_token, add_eos)) if on]
    second = f"{bos.replace(':0', ':1')}$B:1{eos.replace(':0', ':1')}"
    backend.post_processor = processors.TemplateProcessing(
        single=f"{bos}$A:0{eos}", pair=f"{bos}$A:0{eos} {second}", special_tokens=added,
    )
