"""Request fields this server does not implement: each is refused with one line naming the field and
what to send instead, so no reply silently ignores what its request asked for.

A field given its neutral value (the one that asks for nothing: ``presence_penalty: 0``,
``modalities: ["text"]``) is accepted. Fields that change nothing in a reply (``user``, ``metadata``,
``store``, ``service_tier``, ``prediction``, ``prompt_cache_key``, ``prompt_cache_options``,
``prompt_cache_retention``, ``safety_identifier``, ``moderation``) are accepted and have no effect.

A field of no name a route knows (a misspelling, or another server's extension) is refused with the
closest known name, as OpenAI's API does: ignoring it would answer a different request from the one sent.
So is one inside the request's objects (a message, a tool, response_format, ...), through
:func:`unknown_field` (engine/server/structured.py ``refuse_unknown``).
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass

from engine.server.fields import Fields, bad, printable


@dataclass(frozen=True)
class Unsupported:
    """A field this server refuses unless it has one of its neutral values."""

    key: str
    neutral: tuple            # values that ask for nothing, accepted
    fix: str                  # what to do instead


_PENALTY = "use repetition_penalty (above 1 discourages repeats)"
_GUIDE = "use response_format {\"type\": \"json_schema\", ...} (an enum for a choice) instead"
_TEXT_ONLY = "this server reads and writes text only"

# Sampling and decoding fields of OpenAI and vLLM, on both routes.
BOTH = (
    Unsupported("presence_penalty", (0,), _PENALTY),
    Unsupported("frequency_penalty", (0,), _PENALTY),
    Unsupported("logit_bias", ({},), "leave it out"),
    Unsupported("min_tokens", (0,), "leave it out (ignore_eos keeps a reply going to max_tokens)"),
    Unsupported("allowed_token_ids", (), "leave it out"),
    Unsupported("bad_words", ([],), "leave it out"),
    Unsupported("use_beam_search", (False,), "leave it out; this server samples, it does not search beams"),
    Unsupported("truncate_prompt_tokens", (), "shorten the prompt yourself; this server never cuts one"),
    Unsupported("prompt_logprobs", (), "score a prompt with /v1/completions, echo: true and logprobs"),
    Unsupported("guided_json", (), _GUIDE),
    Unsupported("guided_regex", (), _GUIDE),
    Unsupported("guided_choice", (), _GUIDE),
    Unsupported("guided_grammar", (), _GUIDE),
    Unsupported("structured_outputs", (), _GUIDE),
)

CHAT = (
    Unsupported("functions", ([],), "use tools instead of functions"),
    Unsupported("function_call", ("none", "auto"), "use tool_choice instead of function_call"),
    Unsupported("modalities", (["text"],), f"leave it out or send [\"text\"]; {_TEXT_ONLY}"),
    Unsupported("audio", (), f"leave it out; {_TEXT_ONLY}"),
    Unsupported("web_search_options", (), "leave it out; this server cannot search the web"),
    Unsupported("verbosity", ("medium",), "leave it out and ask for a shorter or longer reply in the message"),
    Unsupported("echo", (False,), "leave it out; the messages you sent are the prompt"),
    Unsupported("suffix", ("",), "leave it out; a chat reply has no text after it"),
)

COMPLETIONS = (
    Unsupported("suffix", ("",), "leave it out"),
)


def refuse(f: Fields, fields: tuple[Unsupported, ...]) -> None:
    """A 400 naming the first of ``fields`` that the request gives a value other than its neutral one.
    A ``logit_bias`` whose every bias is 0 asks for nothing, as an empty one does."""
    for u in fields:
        value = f.body.get(u.key)
        if u.key == "logit_bias" and isinstance(value, dict) and all(
                type(b) in (int, float) and b == 0 for b in value.values()):
            continue
        f.unsupported(u.key, u.neutral, u.fix)


NO_EFFECT = ("user", "metadata", "store", "service_tier", "prediction", "prompt_cache_key", "prompt_cache_options",
             "prompt_cache_retention", "safety_identifier", "moderation")


def known_fields(read_both: tuple[str, ...], route_reads: tuple[str, ...], refused: tuple[Unsupported, ...]) -> frozenset[str]:
    """Every top-level field a route knows: what it reads (``read_both``: what every route reads), what
    it refuses unless neutral, and what has no effect."""
    return frozenset(read_both + route_reads + NO_EFFECT + tuple(u.key for u in BOTH + refused))


def unknown_field(body: dict, known: frozenset[str], what: str, prefix: str = "") -> tuple[str, str] | None:
    """(param, message) about the first field of ``body`` that ``what`` (a route, or the kind of object the
    fields are in: ``a user message``) does not know, with the closest known name; None when all are known.
    ``prefix`` names the object the fields are in (``stream_options.``, ``messages[2].``)."""
    for key in body:
        if key in known:
            continue
        near = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.75)
        fix = f"did you mean {prefix}{near[0]}?" if near else "leave it out"
        return f"{prefix}{key}", (f"{printable(prefix + key)} is not a field of {what} on this server; {fix} "
                                  "(docs/server.md lists the fields it reads)")
    return None


def refuse_unknown(body: dict, known: frozenset[str], route: str, prefix: str = "") -> None:
    """A 400 (code ``unknown_parameter``) naming the first field of ``body`` that ``route`` does not know, with
    the closest known name; ``prefix`` names the object the fields are in (``stream_options.``)."""
    found = unknown_field(body, known, route, prefix)
    if found is not None:
        raise bad(*found, code="unknown_parameter")
