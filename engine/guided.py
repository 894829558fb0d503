"""Constrained decoding: output that must follow a grammar (a JSON schema, a regular expression, Lark).

A ``Guide`` says what the output must match. ``GuideCompiler`` (one per engine) turns it into a
grammar with llguidance, checking it once when the request is queued, and gives each guided request
its own ``GuideMatcher``. Before a guided row is sampled its matcher writes the tokens the grammar
allows next into that row of a bitmask (one bit per token id, 32 ids per int32 word); after the
token is chosen the matcher consumes it. llguidance is imported on the first guide, and its table of
the model's tokens is built then too (about a second for a vocabulary of 150k), so a model that
never sees a guide pays for neither.
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.errors import ConfigError

GUIDE_KINDS = ("json", "regex", "lark")
_WHAT = {"json": ("JSON schema", "fix the schema"), "regex": ("regular expression", "fix the pattern"),
         "lark": ("Lark grammar", "fix the grammar")}
_GRAMMARS_KEPT = 64          # compiled grammars remembered per engine (the same schema is sent again and again)
_POSITION = re.compile(r"^at \d+\(\d+\): ")
_TOO_MANY = re.compile(r"(parser error: )?Too many items \(limit (\d+)[^)]*\)(; try avoiding single-byte/short "
                       r"lexemes)?")
_CYCLE = {"json": "a $ref cycle", "lark": "a rule that refers to itself"}     # what never ends, by guide kind
GUIDE_FAILED = "the output could not follow its guide"      # how a guide's failure mid-reply begins
# JSON on one line with a space after ":" and ",", and no other whitespace: where any whitespace may
# go anywhere, models (small ones above all) fill the gaps with spaces and newlines until max_tokens.
# A schema's own "x-guidance" options override these.
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass(frozen=True)
class Guide:
    """What the output must match. ``kind`` "json": ``spec`` is a JSON schema as text ("" = any JSON
    object); "regex": a regular expression; "lark": a Lark grammar (llguidance's dialect).
    ``source`` names where the guide came from in error messages (e.g. "response_format").
    ``stoppable``: the request's stop strings may end the output inside the grammar; by default what the
    guide holds (a JSON value, a forced tool call) ends where the grammar does."""

    kind: str
    spec: str = ""
    source: str = "the guide"
    stoppable: bool = False

    def __post_init__(self) -> None:
        if self.kind not in GUIDE_KINDS:
            raise ConfigError(f"a guide's kind must be one of {', '.join(GUIDE_KINDS)} (got {self.kind!r})")
        if not isinstance(self.spec, str):
            raise ConfigError(f"a guide's spec must be text (got {type(self.spec).__name__}); "
                              "pass the schema, pattern or grammar as a string")


class GuideError(ConfigError):
    """A guide that cannot be compiled or followed from its start; ``source`` is the guide's (the request field
    it came from, such as ``response_format.json_schema``)."""

    def __init__(self, message: str, source: str) -> None:
        super().__init__(message)
        self.source = source


def bitmask_words(n_vocab: int) -> int:
    """int32 words of one bitmask row for ``n_vocab`` token ids."""
    return (n_vocab + 31) // 32


class GuideMatcher:
    """One request's position in its grammar. Methods never raise for what the model produces: a
    failure comes back as one line, and the request ends with it."""

    def __init__(self, matcher: Any, kind: str | None = None) -> None:
        self._m = matcher
        self._kind = kind            # the guide's kind, for the wording of a failure

    def fill(self, bitmask: np.ndarray, row: int) -> str | None:
        """Write the tokens allowed next into ``bitmask[row]`` (int32 [W], C-contiguous); an error
        line when the matcher failed to."""
        words = bitmask[row]
        self._m.unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes)
        return self.check_mask(words)

    def check_mask(self, words: np.ndarray) -> str | None:
        """Why the mask just written into ``words`` cannot be used, or None when it can."""
        if self._m.is_error():
            return self._failure()
        if not words.any():
            return "the guide allows no next token; check that its grammar can be completed"
        return None

    def consume(self, token: int) -> str | None:
        """Advance past ``token``; an error line when the grammar does not take it."""
        return None if self._m.consume_token(token) else self._failure()

    @property
    def done(self) -> bool:
        """The grammar is complete and allows nothing more (only an end-of-sequence token)."""
        return self._m.is_stopped()

    def _failure(self) -> str:
        return f"{GUIDE_FAILED}: {plain(one_line(self._m.get_error()), self._kind)}"


class GuideCompiler:
    """Compiles guides against one model's tokens.

    ``tokenizer_json`` gives the text of the model's tokenizer.json (read on the first guide);
    ``n_vocab`` is the number of logits a step produces; ``special`` the texts of the tokenizer's named
    special tokens, which must never be produced as ordinary text inside the grammar.
    """

    def __init__(self, tokenizer_json: Callable[[], str], n_vocab: int, eos_ids: Iterable[int],
                 special: Iterable[str] = ()) -> None:
        self._tokenizer_json = tokenizer_json
        self.n_vocab = n_vocab
        self._eos = sorted(eos_ids)
        self._special = frozenset(special)
        self._tokens: Any = None                 # llguidance.LLTokenizer, built on first use
        self._executor: Any = None
        self._grammars: dict[Guide, str] = {}

    @property
    def words(self) -> int:
        return bitmask_words(self.n_vocab)

    def check(self, guide: Guide) -> None:
        """Raise a ConfigError (one line) when ``guide`` does not compile, or cannot even start: some
        grammars pass the library's check and fail only when the first tokens are worked out (a schema that
        refers to itself without end, one too large), so the first mask is computed here, before the
        request is taken."""
        import llguidance
        m = llguidance.LLMatcher(self._tokenizer(), self._grammar(guide), log_level=0)
        if not m.is_error():
            words = np.zeros(self.words, dtype=np.int32)
            m.unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes)
        if m.is_error():
            raise _invalid(guide, m.get_error())

    def matcher(self, guide: Guide) -> GuideMatcher:
        import llguidance
        m = llguidance.LLMatcher(self._tokenizer(), self._grammar(guide), log_level=0)
        if m.is_error():
            raise _invalid(guide, m.get_error())
        return GuideMatcher(m, guide.kind)

    def fill(self, matchers: list[GuideMatcher], bitmask: np.ndarray) -> list[str | None]:
        """Fill ``bitmask[i]`` from ``matchers[i]`` for every i; several at once on llguidance's threads."""
        if len(matchers) > 1:
            import llguidance
            if self._executor is None:
                self._executor = llguidance.LLExecutor()
            self._executor.unsafe_compute_mask_ptr([(m._m, i) for i, m in enumerate(matchers)],
                                                   bitmask.ctypes.data, bitmask.shape[1] * 4, bitmask.shape[0])
            return [m.check_mask(bitmask[i]) for i, m in enumerate(matchers)]
        return [matchers[0].fill(bitmask, 0)]

    def _grammar(self, guide: Guide) -> str:
        grammar = self._grammars.get(guide)
        if grammar is None:
            import llguidance
            grammar = _grammar_text(guide)
            error = llguidance.LLMatcher.validate_grammar(grammar, self._tokenizer())
            if error:
                raise _invalid(guide, error)
            if len(self._grammars) >= _GRAMMARS_KEPT:
                self._grammars.pop(next(iter(self._grammars)))
            self._grammars[guide] = grammar
        return grammar

    def _tokenizer(self) -> Any:
        if self._tokens is None:
            import llguidance
            text = _mark_special(self._tokenizer_json(), self._special)
            try:
                self._tokens = llguidance.LLTokenizer(text, n_vocab=self.n_vocab, eos_token=self._eos or None)
            except Exception as exc:  # the Rust library raises plain exceptions for what it cannot read
                raise ConfigError(f"llguidance cannot read this model's tokenizer.json ({one_line(str(exc))}), so its "
                                  "output cannot follow a guide; drop the guide") from None
        return self._tokens


def _grammar_text(guide: Guide) -> str:
    import llguidance
    if guide.kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(guide.spec)
    if guide.kind == "lark":
        return llguidance.LLMatcher.grammar_from_lark(guide.spec)
    if not guide.spec.strip():
        return llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_LAYOUT)
    try:
        schema = json.loads(guide.spec)
    except json.JSONDecodeError as exc:
        raise GuideError(f"{guide.source}'s JSON schema is not valid JSON ({exc}); fix the schema",
                         guide.source) from None
    if not isinstance(schema, dict):
        raise GuideError(f"{guide.source}'s JSON schema must be a JSON object (got {type(schema).__name__}); "
                         "fix the schema", guide.source)
    try:
        return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_LAYOUT)
    except ValueError as exc:
        raise _invalid(guide, str(exc)) from None


def _mark_special(tokenizer_json: str, special: frozenset[str]) -> str:
    """tokenizer.json with the named special tokens flagged special, as the engine's tokenizer treats them."""
    if not special:
        return tokenizer_json
    data = json.loads(tokenizer_json)
    added = [t for t in data.get("added_tokens") or [] if t.get("content") in special and not t.get("special")]
    if not added:
        return tokenizer_json
    for t in added:
        t["special"] = True
    return json.dumps(data)


def _invalid(guide: Guide, error: str) -> GuideError:
    what, fix = _WHAT[guide.kind]
    reason = one_line(error, guide.kind != "lark")
    if reason.startswith("Unimplemented keys"):     # valid JSON Schema, but beyond what a grammar can enforce
        return GuideError(f"{guide.source}'s {what} uses keywords that cannot be enforced ({reason}); "
                          "remove them from the schema", guide.source)
    return GuideError(f"{guide.source}'s {what} is invalid: {plain(reason, guide.kind)}; {fix}", guide.source)


def plain(reason: str, kind: str | None = None) -> str:
    """llguidance's reason in plain words where it names its internals: ``NoExtensionBias`` (the grammar's
    start can only be built from itself) and its parser's item limit (which such a grammar runs into);
    ``kind`` is the guide's (None: not known)."""
    cycle = _CYCLE.get(kind, "a grammar that refers to itself")
    if reason.startswith("NoExtensionBias"):
        return f"it has no finite instance ({cycle} never reaches a value)"
    return _TOO_MANY.sub(lambda m: f"the grammar grew past its parser's limit of {m.group(2)} items ({cycle} with "
                                   "no finite instance does this)", reason)


_DUMPS = re.compile(r"<(state|grammar)>.*?(</\1>|$)", re.S)


def one_line(message: str, drop_position: bool = False) -> str:
    """llguidance's message on one line: no source excerpts or caret markers. Positions refer to the
    grammar llguidance built around a schema or pattern, not to what the user wrote, so they can go."""
    message = _DUMPS.sub(" ", str(message))          # the parser's state and grammar dumps say nothing to a user
    lines = [ln.strip() for ln in message.splitlines()]
    caret = [bool(ln) and set(ln) <= {"^", " "} for ln in lines]
    # an excerpt is the line above a caret line, or a numbered source line ("1 | start: ...")
    kept = [ln for i, ln in enumerate(lines) if ln and not caret[i] and not (i + 1 < len(lines) and caret[i + 1])
            and not re.match(r"^\d+ \|", ln)]
    text = re.sub(r"\berror: error: ", "error: ", " ".join(kept)) or "no reason given"
    text = re.sub(r"\s{2,}", " ", text)
    return _POSITION.sub("", text) if drop_position else text
