"""The fields completions and chat share: model, n, stream, and the sampling settings.

Sampling fields are checked by ``SamplingParams`` itself, so a refusal reads as the engine's own
("temperature must be a number >= 0 (got -1); 0 is greedy"); the server adds only the limits of
an open endpoint (how many choices, stop strings and alternatives one request may ask for).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from engine.context import reply_room
from engine.errors import ConfigError
from engine.sampling import SamplingParams
from engine.server.engine_client import ModelInfo
from engine.server.errors import APIError
from engine.server.fields import Fields, bad, show

MAX_CHOICES = 128         # prompts x n in one request
MAX_STOP = 16             # stop strings per request (each is checked against every new token)
MAX_STOP_CHARS = 100
_SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "seed", "stop",
                  "stop_token_ids", "ignore_eos", "include_stop_str_in_output")


@dataclass(frozen=True)
class Common:
    """The shared part of a generation request, checked."""

    n: int
    stream: bool
    include_usage: bool
    return_token_ids: bool           # add each choice's token ids (a vLLM extension)
    params: SamplingParams           # for choice 0; max_tokens still to be fitted to the prompt
    max_tokens: int | None           # as the client gave it (None: up to the context, or the default)
    max_tokens_key: str              # the field it came from, for messages


def read_common(f: Fields, info: ModelInfo, max_tokens_keys: tuple[str, ...], default_max_tokens: int | None,
                logprobs: int | None) -> Common:
    """Read and check the shared fields of ``f`` (raises APIError 400/404 naming the field)."""
    check_model(f, info)
    n = f.whole("n", 1, 1, MAX_CHOICES)
    stream = f.flag("stream", False)
    options = f.obj("stream_options")
    if options is not None and not stream:
        raise bad("stream_options", "stream_options is only allowed with stream: true")
    include_usage = Fields(options or {}, "stream_options.").flag("include_usage", False)
    key = next((k for k in max_tokens_keys if f.given(k)), max_tokens_keys[-1])
    max_tokens = f.raw(key)
    if max_tokens is not None and isinstance(max_tokens, int) and not isinstance(max_tokens, bool) \
            and max_tokens > info.context_tokens:
        raise bad(key, f"{key} must be at most the {info.context_tokens}-token context (got {max_tokens}); "
                       "prompt and reply share the context", code="context_length_exceeded")
    _refuse_unsupported(f, n)
    stop = f.raw("stop")
    if isinstance(stop, list) and len(stop) > MAX_STOP:
        raise bad("stop", f"stop takes at most {MAX_STOP} strings (got {len(stop)})")
    if any(isinstance(s, str) and len(s) > MAX_STOP_CHARS for s in (stop if isinstance(stop, list) else [stop])):
        raise bad("stop", f"each stop string may have at most {MAX_STOP_CHARS} characters")
    kwargs = {k: f.body[k] for k in _SAMPLING_KEYS if f.body.get(k) is not None}
    wanted = max_tokens if max_tokens is not None else default_max_tokens
    params = sampling(kwargs, 1 if wanted is None else wanted, logprobs, key)
    return Common(n, stream, include_usage, f.flag("return_token_ids", False), params,
                  max_tokens if max_tokens is not None else default_max_tokens, key)


def check_model(f: Fields, info: ModelInfo) -> None:
    """The ``model`` field must name the served model (its name or its folder); absent means that one."""
    model = f.raw("model")
    if model is None:
        return
    if not isinstance(model, str):
        raise bad("model", f"model must be a string (got {show(model)})")
    if model not in (info.name, info.path):
        raise APIError(404, f"model {show(model)} is not served here; this server serves {show(info.name)} "
                            "(GET /v1/models lists it)", param="model", code="model_not_found")


def sampling(kwargs: dict, max_tokens: int, logprobs: int | None, max_tokens_key: str = "max_tokens") -> SamplingParams:
    """SamplingParams from request fields; its ConfigError becomes a 400 naming the field."""
    try:
        return SamplingParams(max_tokens=max_tokens, logprobs=logprobs, **kwargs)
    except ConfigError as exc:
        message = str(exc)
        field = message.split(" ", 1)[0]
        if field == "max_tokens" and max_tokens_key != "max_tokens":
            message, field = max_tokens_key + message[len("max_tokens"):], max_tokens_key
        elif field not in (*_SAMPLING_KEYS, "max_tokens"):
            field = next((k for k in _SAMPLING_KEYS if k in message.split(" ", 2)[:2]), None)
        raise bad(field, message) from None


def choice_params(base: SamplingParams, j: int) -> SamplingParams:
    """Choice ``j`` of a prompt: its own seed (seed + j), so each choice is reproducible on its own."""
    if j == 0 or base.seed is None:
        return base
    try:
        return dataclasses.replace(base, seed=base.seed + j)
    except ConfigError as exc:
        raise bad("seed", str(exc)) from None


def fit(common: Common, params: SamplingParams, prompt_tokens: int, info: ModelInfo, where: str) -> SamplingParams:
    """Check that the prompt and the reply's room fit the context (the "stop" overflow policy: a prompt
    is never cut); returns ``params`` with max_tokens set when the client left it out."""
    ctx = info.context_tokens
    room = 1 if common.max_tokens is None else reply_room(ctx, common.max_tokens)
    over = prompt_tokens + room - ctx
    if over > 0:
        raise bad(where, f"{where} is {over} tokens over the {ctx}-token context: it has {prompt_tokens} tokens "
                         f"and the reply needs room for {room}; shorten it or lower {common.max_tokens_key}",
                  code="context_length_exceeded")
    if common.max_tokens is None:
        return dataclasses.replace(params, max_tokens=ctx - prompt_tokens)
    return params


def _refuse_unsupported(f: Fields, n: int) -> None:
    hint = "use repetition_penalty (above 1 discourages repeats)"
    f.unsupported("presence_penalty", (0, 0.0), hint)
    f.unsupported("frequency_penalty", (0, 0.0), hint)
    f.unsupported("logit_bias", ({},), "leave it out")
    f.unsupported("suffix", ("",), "leave it out")
    f.unsupported("best_of", (1, n), "use n for several choices")
