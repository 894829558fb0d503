"""A workload run against any OpenAI-compatible server: streaming ``POST /v1/completions``.

Each request asks for ``max_tokens`` with EOS ignored (``ignore_eos``, as Strata, vLLM and
llama-server accept) and the usage in the last chunk (``stream_options.include_usage``). Tokens are
counted by the usage when the server sends it, else one per chunk with text; the first token's time
is that of the first chunk with text. A Strata server (its model listing says ``owned_by: strata``)
is also asked for each chunk's token ids (``return_token_ids``): a chunk then counts the tokens it
carries, also those whose text it holds back until their UTF-8 is whole, so the per-stream speed and
the inter-token gaps count tokens, not pieces of text, and its first token is timed when it arrives
even before its text is whole (other servers' at their first text: on a byte-level vocabulary their
TTFT may be a token or two later than Strata's for the same work).
"""
from __future__ import annotations

import asyncio
import json
import socket
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx

from engine.bench.driver import NoProgress, Progress, drive
from engine.bench.metrics import RequestRecord, summarise
from engine.bench.result import BenchRun
from engine.bench.workload import ID_HIGH, BenchRequest, Workload, request_seed
from engine.errors import StrataError

CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 600.0        # the longest silence a stream may have (a long prompt's prefill)


class ServerError(StrataError):
    """The server at --url could not be used: one line naming the address and the fix."""


@dataclass(frozen=True)
class Target:
    """Where to send: the server's base address, its key, the model field, and the prompts' id range."""

    url: str
    api_key: str | None = None
    model: str | None = None           # None: the first model GET /v1/models lists
    vocab_size: int | None = None      # prompt ids stay below it (and below 32000); None: the vocab_size
    # GET /v1/models gives the model (a Strata server lists it), else 32000


def base_url(url: str) -> str:
    """``url`` as ``scheme://host[:port][/prefix]`` without a trailing ``/`` or ``/v1``."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ServerError(f"--url {url!r} is not an HTTP address; write http://HOST:PORT, e.g. http://127.0.0.1:8000")
    path = parts.path.rstrip("/")
    path = path[:-3] if path.endswith("/v1") else path
    return f"{parts.scheme}://{parts.netloc}{path}"


def run_http(target: Target, workload: Workload, progress: Progress | None = None) -> BenchRun:
    """Run ``workload`` against the server at ``target.url``; raises ServerError when it cannot be used."""
    return asyncio.run(_run(target, workload, progress or NoProgress()))


async def _run(target: Target, workload: Workload, progress: Progress) -> BenchRun:
    base = base_url(target.url)
    async with _client(target) as client:
        served = await _model_of(client, base, target.model)
        model, vocab = served.model, target.vocab_size or served.vocab_size or ID_HIGH
        requests = workload.requests(vocab)
        url = f"{base}/v1/completions"
        records, wall = await drive(workload, requests,
                                    lambda r: _send(client, url, model, workload, r, vocab, progress, served.strata),
                                    progress)
    return BenchRun(base, model, workload, summarise(records, wall), tuple(records))


@dataclass(frozen=True)
class Served:
    """What GET /v1/models says of the model a run sends to (None: not listed)."""

    model: str
    vocab_size: int | None = None
    context_tokens: int | None = None   # max_model_len
    strata: bool = False                # owned_by "strata": chunks can carry their token ids


def served_model(target: Target) -> Served:
    """:class:`Served` for ``target`` (one GET /v1/models); a ServerError naming the fix when the server
    cannot be used."""
    async def ask() -> Served:
        async with _client(target) as client:
            return await _model_of(client, base_url(target.url), target.model)
    return asyncio.run(ask())


def _client(target: Target) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}
    # trust_env off: a benchmark measures the server, never a proxy the environment names
    return httpx.AsyncClient(headers=headers, trust_env=False,
                             timeout=httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S),
                             limits=httpx.Limits(max_connections=None, max_keepalive_connections=None))


async def _model_of(client: httpx.AsyncClient, base: str, wanted: str | None) -> Served:
    """The model to send to (``wanted``, else the first GET /v1/models lists), with what the listing
    says of it (nothing where it says nothing, or where the listing cannot be read for a named model)."""
    if wanted is not None:
        try:
            resp = await client.get(f"{base}/v1/models")
            data = resp.json().get("data") if resp.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError):
            data = None
        return _served(data, wanted)
    data = await _listing(client, base)
    return _served(data, data[0]["id"])


def _served(data: object, name: str) -> Served:
    def count(v: object) -> int | None:
        return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None
    for m in data if isinstance(data, list) else ():
        if isinstance(m, dict) and name in (m.get("id"), m.get("root")):
            return Served(name, count(m.get("vocab_size")), count(m.get("max_model_len")), m.get("owned_by") == "strata")
    return Served(name)


async def _listing(client: httpx.AsyncClient, base: str) -> list[dict]:
    """GET /v1/models' entries that name a model; a ServerError naming the fix when there are none."""
    url = f"{base}/v1/models"
    try:
        resp = await client.get(url)
    except httpx.HTTPError as e:
        raise ServerError(f"cannot reach {base} ({_why(e)}); start the server (e.g. main.py serve) or fix --url") from None
    if resp.status_code in (401, 403):
        raise ServerError(f"{url} answered {resp.status_code} ({_message(resp)}); give the server's API key with "
                          "--api-key KEY")
    if resp.status_code == 404:
        raise ServerError(f"{url} answered 404: no OpenAI-compatible API there; --url takes the server's base "
                          "address, e.g. http://127.0.0.1:8000")
    if resp.status_code != 200:
        raise ServerError(f"{url} answered {resp.status_code} ({_message(resp)}); check the server's log")
    try:
        data = [m for m in resp.json().get("data") or [] if isinstance(m, dict) and isinstance(m.get("id"), str)]
    except (ValueError, AttributeError, TypeError):
        data = []
    if not data:
        raise ServerError(f"{url} lists no model; name the one to use with --model NAME")
    return data


def _why(e: httpx.HTTPError) -> str:
    """The cause of a failed exchange in a few words: the OS error under httpx's wrapper where there is one."""
    if isinstance(e, httpx.TimeoutException):
        return "no answer in time"
    cause: BaseException | None = e
    while cause is not None:
        if isinstance(cause, ConnectionRefusedError):
            return "connection refused"
        if isinstance(cause, socket.gaierror):
            return f"unknown host: {cause.strerror or cause}"
        cause = cause.__cause__ or cause.__context__
    return str(e) or type(e).__name__


def _message(resp: httpx.Response) -> str:
    """The message of an error answer: OpenAI's error object, a framework's detail, or the text."""
    try:
        body = resp.json()
    except ValueError:
        return " ".join(resp.text.split())[:200] or "no message"
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if isinstance(err, str):
            return err
        if body.get("detail"):
            return str(body["detail"])
    return json.dumps(body)[:200]


def _body(model: str, workload: Workload, req: BenchRequest, token_ids: bool = False) -> dict:
    body = {"model": model, "prompt": req.prompt if isinstance(req.prompt, str) else list(req.prompt),
            "max_tokens": req.output_len, "temperature": workload.temperature, "seed": request_seed(workload, req),
            "stream": True, "stream_options": {"include_usage": True}}
    if workload.ignore_eos:
        body["ignore_eos"] = True
    if token_ids:
        body["return_token_ids"] = True
    return body


def _tokens_of(choice: dict) -> int:
    """Tokens a streamed choice carries: its token ids where it lists them, else one where it has text."""
    ids = choice.get("token_ids")
    if isinstance(ids, list):
        return len(ids)
    return 1 if choice.get("text") else 0


async def _send(client: httpx.AsyncClient, url: str, model: str, workload: Workload, req: BenchRequest,
                vocab_size: int, progress: Progress, token_ids: bool = False) -> RequestRecord:
    record = RequestRecord(req.index, time.perf_counter())
    chunks, usage = 0, None
    try:
        async with client.stream("POST", url, json=_body(model, workload, req, token_ids)) as resp:
            if resp.status_code != 200:
                await resp.aread()
                record.error = _refusal(url, resp, workload, vocab_size)
            else:
                async for line in resp.aiter_lines():
                    now = time.perf_counter()
                    event = _event(line)
                    if event is None:
                        continue
                    if event == "[DONE]":
                        break
                    if isinstance(event.get("error"), (dict, str)):
                        record.error = f"{url} ended the stream with an error: {_event_message(event['error'])}"
                        break
                    choices = event.get("choices")
                    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) \
                        else {}
                    n = _tokens_of(choice)
                    if n:
                        record.arrivals.append((now, n))
                        progress.tokens(n)
                        chunks += n
                    record.finish_reason = choice.get("finish_reason") or record.finish_reason
                    usage = event.get("usage") or usage
    except httpx.HTTPError as e:
        record.error = f"{url}: {_why(e)}"
    record.finished_at = time.perf_counter()
    if isinstance(usage, dict):
        record.output_tokens = int(usage.get("completion_tokens") or 0)
        record.prompt_tokens = int(usage.get("prompt_tokens") or 0)
    else:
        record.output_tokens = chunks
    if not record.prompt_tokens and record.error is None:
        record.prompt_tokens = req.prompt_len      # a server without usage: the tokens sent (words for text)
    return record


def _event(line: str) -> dict | str | None:
    """The JSON of one ``data:`` line of a server-sent event stream, "[DONE]", or None (other lines)."""
    if not line.startswith("data:"):
        return None
    payload = line[5:].strip()
    if payload == "[DONE]":
        return payload
    try:
        event = json.loads(payload)
    except ValueError:
        return None
    return event if isinstance(event, dict) else None


def _event_message(err: dict | str) -> str:
    return str(err.get("message") or err) if isinstance(err, dict) else err


def _refusal(url: str, resp: httpx.Response, workload: Workload, vocab_size: int) -> str:
    line = f"{url} answered {resp.status_code}: {_message(resp)}"
    if resp.status_code in (401, 403):
        return line + "; give the server's API key with --api-key KEY"
    if resp.status_code == 400 and not workload.text_prompts and _code(resp) != "context_length_exceeded":
        return (line + f"; the prompts are token ids below {min(vocab_size, ID_HIGH)}: give --vocab-size with "
                "the model's vocabulary, or send --text-prompts")
    return line


def _code(resp: httpx.Response) -> str | None:
    """The ``code`` of an OpenAI error answer, if it has one."""
    try:
        err = resp.json().get("error")
    except (ValueError, AttributeError):
        return None
    return err.get("code") if isinstance(err, dict) else None
