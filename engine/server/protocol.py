"""The fields completions and chat share: model, n, stream, and the sampling settings.

Sampling fields are checked by ``SamplingParams`` itself, so a refusal reads as the engine's own
("temperature must be a number >= 0 (got -1); 0 is greedy"); the server checks their JSON types
first (so a message spells values as JSON does), refuses what it does not implement
(engine/server/refused.py), and adds the limits of an open endpoint (how many choices, stop strings
and alternatives one request may ask for) and the rule that prompt and reply fit the context.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from engine.errors import ConfigError
from engine.guided import Guide
from engine.sampling import SamplingParams
from engine.server import refused
from engine.server.engine_client import ModelInfo
from engine.server.errors import APIError
from engine.server.fields import Fields, bad, is_whole, show

MAX_CHOICES = 128         # prompts x n in one request
MAX_STOP = 16             # stop strings per request (each is checked against every new token)
MAX_STOP_CHARS = 100
# OpenAI's limits on metadata (which changes nothing here, but is checked as OpenAI checks it)
MAX_METADATA_KEYS, MAX_METADATA_KEY_CHARS, MAX_METADATA_VALUE_CHARS = 16, 64, 512
MAX_BIAS = 100            # a logit_bias value is from -100 to 100
_SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "seed", "stop",
                  "stop_token_ids", "ignore_eos", "include_stop_str_in_output")
# What read_common reads on every route (besides its max_tokens field, which the route names).
STREAM_OPTIONS = frozenset({"include_usage", "include_obfuscation"})   # the second has no effect here
READ_BOTH = ("model", "n", "stream", "stream_options", "max_tokens", "best_of", "logprobs", "response_format",
             "return_token_ids") + _SAMPLING_KEYS


@dataclass(frozen=True)
class Common:
    """The shared part of a generation request, checked."""

    n: int
    stream: bool
    include_usage: bool
    return_token_ids: bool           # add each choice's token ids (a vLLM extension)
    params: SamplingParams           # for choice 0; max_tokens still to be fitted to the prompt
    max_tokens: int | None           # as the client gave it (None: left out)
    max_tokens_key: str              # the field it came from, for messages
    default_max_tokens: int | None   # the reply's cap when left out (None: whatever room the prompt leaves)


def read_common(f: Fields, info: ModelInfo, max_tokens_keys: tuple[str, ...], default_max_tokens: int | None,
                logprobs: int | None) -> Common:
    """Read and check the shared fields of ``f`` (raises APIError 400/404 naming the field)."""
    check_model(f, info)
    n = f.whole("n", 1, 1, MAX_CHOICES)
    stream = f.flag("stream", False)
    options = f.obj("stream_options")
    if options is not None and not stream:
        raise bad("stream_options", "stream_options is only allowed with stream: true")
    refused.refuse_unknown(options or {}, STREAM_OPTIONS, "stream_options", "stream_options.")
    include_usage = Fields(options or {}, "stream_options.").flag("include_usage", False)
    key = next((k for k in max_tokens_keys if f.given(k)), max_tokens_keys[-1])
    # how large it may be depends on the prompt's tokens: ``fit`` names the largest that fits this prompt;
    # a field the other one overrides is still checked (a bad value is never passed over)
    given = {k: f.whole(k, None, 1, hint="a reply needs at least 1 token") for k in max_tokens_keys}
    max_tokens = given[key]
    _check_metadata(f)
    _check_no_effect_types(f)
    _check_logit_bias(f, info.vocab_size)
    refused.refuse(f, refused.BOTH)
    f.unsupported("best_of", (1, n), "use n for several choices")
    _check_sampling_types(f)
    outside = [t for t in f.raw("stop_token_ids") or () if t >= info.vocab_size]
    if outside:
        raise bad("stop_token_ids", f"stop token id {outside[0]} is outside the vocabulary (0..{info.vocab_size - 1}); "
                                    "give ids of this model's tokens")
    stop = f.raw("stop")
    if isinstance(stop, list) and len(stop) > MAX_STOP:
        raise bad("stop", f"stop takes at most {MAX_STOP} strings (got {len(stop)})")
    if any(isinstance(s, str) and len(s) > MAX_STOP_CHARS for s in (stop if isinstance(stop, list) else [stop])):
        raise bad("stop", f"each stop string may have at most {MAX_STOP_CHARS} characters")
    kwargs = {k: f.body[k] for k in _SAMPLING_KEYS if f.body.get(k) is not None}
    params = sampling(kwargs, max_tokens or default_max_tokens or 1, logprobs)
    return Common(n, stream, include_usage, f.flag("return_token_ids", False), params, max_tokens, key,
                  default_max_tokens)


def _check_sampling_types(f: Fields) -> None:
    """Each sampling field has a JSON type SamplingParams takes, so its own range checks (which name the
    field and the fix) are the only refusals left, and no message shows a Python spelling."""
    for key in ("temperature", "top_p", "min_p", "repetition_penalty"):
        f.number(key, None)
    for key in ("ignore_eos", "include_stop_str_in_output"):
        f.flag(key, False)
    f.whole("top_k", None, 0, hint="0 turns it off")
    seed = f.raw("seed")
    if seed is not None and not (is_whole(seed) and -2 ** 63 <= seed < 2 ** 64):
        raise bad("seed", f"seed must be a whole number that fits in 64 bits (got {show(seed)}); leave it out "
                          "(or null) to draw a fresh random seed")
    stop = f.raw("stop")
    if stop is not None and not (isinstance(stop, str) or isinstance(stop, list)
                                 and all(isinstance(s, str) for s in stop)):
        raise bad("stop", f"stop must be a string or a list of strings (got {show(stop)})")
    ids = f.raw("stop_token_ids")
    if ids is not None and not (isinstance(ids, list) and all(is_whole(t) and t >= 0 for t in ids)):
        raise bad("stop_token_ids", f"stop_token_ids must be a list of token ids >= 0 (got {show(ids)})")



def _check_no_effect_types(f: Fields) -> None:
    """The fields that change nothing here still have the JSON type OpenAI takes (it refuses another), so a
    request that works here works there."""
    for key in ("user", "service_tier", "prompt_cache_key", "prompt_cache_retention", "safety_identifier"):
        f.text(key)
    f.flag("store", False)
    f.obj("prediction")


def _check_metadata(f: Fields) -> None:
    """``metadata`` as OpenAI takes it: an object of at most 16 string values, keys of at most 64 characters
    and values of at most 512."""
    metadata = f.raw("metadata")
    if metadata is None:
        return
    if not isinstance(metadata, dict):
        raise bad("metadata", f"metadata must be an object of string values, such as {{\"user\": \"ana\"}} "
                              f"(got {show(metadata)})")
    if len(metadata) > MAX_METADATA_KEYS:
        raise bad("metadata", f"metadata takes at most {MAX_METADATA_KEYS} keys (got {len(metadata)})")
    for key, value in metadata.items():
        if len(key) > MAX_METADATA_KEY_CHARS:
            raise bad("metadata", f"metadata key {show(key)} has {len(key)} characters; keys take at most "
                                  f"{MAX_METADATA_KEY_CHARS}")
        if not isinstance(value, str):
            raise bad(f"metadata.{key}", f"metadata.{key} must be a string (got {show(value)})")
        if len(value) > MAX_METADATA_VALUE_CHARS:
            raise bad(f"metadata.{key}", f"metadata.{key} has {len(value)} characters; values take at most "
                                         f"{MAX_METADATA_VALUE_CHARS}")


def _check_logit_bias(f: Fields, vocab_size: int) -> None:
    """``logit_bias`` maps token ids, written as strings, to biases from -100 to 100 (whether any bias is applied
    is refused.py's to say; a malformed one is refused first, naming what is wrong with it)."""
    biases = f.raw("logit_bias")
    if biases is None:
        return
    if not isinstance(biases, dict):
        raise bad("logit_bias", f"logit_bias must be an object of token ids and biases, such as {{\"1234\": -100}} "
                                f"(got {show(biases)})")
    for key, bias in biases.items():
        if not (key.isascii() and key.isdigit() and len(key) <= 9 and int(key) < vocab_size):
            raise bad("logit_bias", f"logit_bias key {show(key)} is not a token id of this model; keys are ids from "
                                    f"0 to {vocab_size - 1}, written as strings")
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not -MAX_BIAS <= bias <= MAX_BIAS:
            raise bad("logit_bias", f"logit_bias[{show(key)}] must be a number from -{MAX_BIAS} to {MAX_BIAS} "
                                    f"(got {show(bias)})")


def check_model(f: Fields, info: ModelInfo) -> None:
    """The ``model`` field must name the served model (its name or its folder); absent means that one."""
    model = f.raw("model")
    if model is None:
        return
    if not isinstance(model, str):
        raise bad("model", f"model must be a string (got {show(model)})")
    if model != info.name and _folder(model) != _folder(info.path):
        raise APIError(404, f"model {show(model)} is not served here; this server serves {show(info.name)} "
                            "(GET /v1/models lists it)", param="model", code="model_not_found")


def _folder(path: str) -> str:
    """``path`` as folders are compared: no separator at its end, none doubled, no ``.`` or ``..`` parts."""
    trimmed = path.rstrip("/\\")
    return os.path.normpath(trimmed) if trimmed else path


def sampling(kwargs: dict, max_tokens: int, logprobs: int | None) -> SamplingParams:
    """SamplingParams from request fields (their types checked already); its ConfigError becomes a 400
    naming the field."""
    try:
        return SamplingParams(max_tokens=max_tokens, logprobs=logprobs, **kwargs)
    except ConfigError as exc:
        message = str(exc)
        field = message.split(" ", 1)[0]
        if field not in _SAMPLING_KEYS:
            field = next((k for k in _SAMPLING_KEYS if k in message.split(" ", 2)[:2]), None)
        raise bad(field, message) from None


def choice_params(base: SamplingParams, j: int) -> SamplingParams:
    """Choice ``j`` of a prompt: its own seed (seed + j), so each choice is reproducible on its own."""
    if j == 0 or base.seed is None:
        return base
    if base.seed + j >= 2 ** 64:
        raise bad("seed", f"seed {base.seed} leaves no room for the seeds of the other choices (seed + j must fit "
                          "in 64 bits); use a smaller seed")
    return dataclasses.replace(base, seed=base.seed + j)


EXACT_CHARS = 200_000      # a text this long is tokenized (milliseconds) so that a refusal names exact numbers


def refuse_overlong(chars: int, info: ModelInfo, where: str) -> None:
    """Refuse a text of ``chars`` characters that cannot fit the context before it is tokenized (seconds
    of a core for megabytes): no token covers more than the vocabulary's longest entry, so it has at least
    ``chars`` / that many tokens (halved here, for normalisers that fold two characters into one). A text of
    at most EXACT_CHARS is left to the tokenizer, whose count says by how much to shorten it."""
    tok = info.tokenizer
    if tok is None or chars <= EXACT_CHARS:
        return
    least = chars // (2 * tok.longest_token_chars)
    if least >= info.context_tokens:
        raise bad(where, f"{where} has {chars} characters, at least {least} tokens, more than the "
                         f"{info.context_tokens}-token context holds; shorten it", code="context_length_exceeded")


def text_chars(value: object) -> int:
    """Characters of every string in ``value`` (a request's messages, however nested)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(text_chars(v) for v in value.values())
    if isinstance(value, list):
        return sum(text_chars(v) for v in value)
    return 0


def fit(common: Common, params: SamplingParams, prompt_tokens: int, info: ModelInfo, where: str) -> SamplingParams:
    """The prompt and max_tokens must fit the context together (vLLM's rule): a prompt is never cut, and
    a reply never ends early for want of room. Left out, max_tokens becomes the room the prompt leaves
    (at most ``default_max_tokens``). Returns ``params`` with that max_tokens; 400 naming the numbers."""
    ctx = info.context_tokens
    room = ctx - prompt_tokens                       # what the prompt leaves for the reply
    if room < 1:
        raise bad(where, _over_context(common, prompt_tokens, ctx, where), code="context_length_exceeded")
    if common.max_tokens is None:
        cap = room if common.default_max_tokens is None else min(room, common.default_max_tokens)
        return dataclasses.replace(params, max_tokens=cap)
    if common.max_tokens > room:
        key, over = common.max_tokens_key, _tokens(common.max_tokens - room)
        shorten = f" or shorten {where} by {over}" if common.max_tokens - room < prompt_tokens else ""
        raise bad(key, f"{key} {common.max_tokens} does not fit: {where} has {prompt_tokens} tokens, which leaves "
                       f"{room} of the {ctx}-token context for the reply; lower {key} to at most {room}{shorten}",
                  code="context_length_exceeded")
    return params


def _over_context(common: Common, prompt_tokens: int, ctx: int, where: str) -> str:
    """Why a prompt that fills the context alone is refused. A max_tokens the client gave counts too, so
    shortening the prompt by the amount named makes the same request fit in one go."""
    least = 1 - (ctx - prompt_tokens)                # shortening that leaves room for a 1-token reply
    if common.max_tokens is None:
        return (f"{where} is {_tokens(least)} over the {ctx}-token context: it has {prompt_tokens} tokens "
                f"and the reply needs at least 1; shorten it by {_tokens(least)}")
    key, need = common.max_tokens_key, least - 1 + common.max_tokens
    also = f", or by {_tokens(least)} with {key} 1" if need > least else ""
    return (f"{where} and {key} are {_tokens(need)} over the {ctx}-token context: {where} has {prompt_tokens} "
            f"tokens and {key} asks for {common.max_tokens} more; shorten {where} by {_tokens(need)}{also}")


def _tokens(n: int) -> str:
    return "1 token" if n == 1 else f"{n} tokens"


def guided(params: SamplingParams, guide: Guide | None) -> SamplingParams:
    """``params`` with the reply constrained by ``guide`` (None: unchanged); a refusal names its field."""
    if guide is None:
        return params
    try:
        return dataclasses.replace(params, guide=guide)
    except ConfigError as exc:
        raise bad(guide.source, str(exc)) from None
