"""The small endpoints: models, health, metrics, and Strata's own stats and live settings."""
from __future__ import annotations

import asyncio
import dataclasses
import json
import re

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from engine.config import LIVE_OPTIONS
from engine.errors import StrataError
from engine.server.engine_client import ModelInfo
from engine.server.errors import APIError, trailing_slash
from engine.server.fields import Fields
from engine.server.metrics import CONTENT_TYPE
from engine.server.protocol import check_model
from engine.server.state import json_body, state_of


def _model(info: ModelInfo) -> dict:
    return {"id": info.name, "object": "model", "created": info.created, "owned_by": "strata",
            "root": info.path, "max_model_len": info.context_tokens, "vocab_size": info.vocab_size}


async def list_models(request: Request) -> Response:
    client = state_of(request).client
    if not client.loaded():
        return JSONResponse({"object": "list", "data": []})
    return JSONResponse({"object": "list", "data": [_model(await client.info())]})


async def retrieve_model(request: Request) -> Response:
    """``GET /v1/models/{id}``: the object /v1/models lists for that id (its name or its folder, as
    ``model`` takes them); another id is a 404 naming the served one. ``/v1/models/`` (no id) is the list's path
    with a trailing slash."""
    if not request.path_params["model_id"].strip("/"):
        raise trailing_slash(request.scope["path"])
    info = await state_of(request).client.info()
    check_model(Fields({"model": request.path_params["model_id"]}), info)
    return JSONResponse(_model(info))


async def health(request: Request) -> Response:
    if state_of(request).client.loaded():
        return JSONResponse({"status": "ok"})
    return APIError(503, "no model is loaded yet", code="model_not_loaded", headers={"Retry-After": "1"}).response()


async def metrics(request: Request) -> Response:
    server = state_of(request)
    stats = await server.client.call(lambda e: None if e is None else e.stats()) if server.client.loaded() else None
    server.metrics.update(stats)
    if stats is not None:
        await asyncio.to_thread(server.metrics.sample_gpu, stats.device)
    return Response(server.metrics.render(), media_type=CONTENT_TYPE)


async def strata_stats(request: Request) -> Response:
    client = state_of(request).client
    await client.info()                                  # 503 when no model is loaded
    stats = await client.call(lambda e: e.stats())
    return JSONResponse(dataclasses.asdict(stats))


async def get_config(request: Request) -> Response:
    """Every live option: its value now, and whether it can change now (and why not)."""
    client = state_of(request).client
    await client.info()
    options = await client.call(_live_state)
    return JSONResponse({"options": options})


def _live_state(engine) -> dict:
    usable = engine.live_options()
    return {name: {"value": _jsonable(getattr(engine.config, name)), "usable": why is None, "reason": why}
            for name, why in sorted(usable.items())}


def _jsonable(value: object) -> object:
    return value if isinstance(value, (str, int, float, bool, type(None))) else str(value)


_GOT = re.compile(r"\(got ([^()]*)\)")
_PY_WORDS = {"None": "null", "True": "true", "False": "false"}


_SET = re.compile(r"(?<![\w-])([a-z_]+)=('[^']*'|None|True|False)")


def _json_value(v: str) -> str | None:
    """A Python repr of a value as JSON spells it ('x' -> "x", None -> null); None when it is not one."""
    if v in _PY_WORDS:
        return _PY_WORDS[v]
    if len(v) >= 2 and v[0] == v[-1] == "'":
        return json.dumps(v[1:-1])
    return None


def _json_spelling(message: str) -> str:
    """An engine message's values as JSON spells them, in ``(got VALUE)`` and in ``option=VALUE``."""
    message = _GOT.sub(lambda m: m.group(0) if (j := _json_value(m.group(1))) is None else f"(got {j})", message)
    return _SET.sub(lambda m: f"{m.group(1)}={_json_value(m.group(2))}", message)


def _named(message: str, body: dict) -> str | None:
    """The option of ``body`` a refusal is about: the only one sent, else the one its message names."""
    if len(body) == 1:
        return next(iter(body))
    first = next((k for k in body if re.match(rf"{re.escape(k)}\b", message)), None)    # the one it is about
    return first or next((k for k in body if re.search(rf"\b{re.escape(k)}\b", message)), None)


def _reconfigure(engine, body: dict) -> dict[str, str]:
    """Loop thread: apply the options of ``body`` that change something. One sent with the value it has now
    is accepted as it is, even where the option cannot change now (CUDA graphs on a CPU), so that a client
    may post back the values GET /v1/strata/config gave it."""
    same = {k for k, v in body.items() if k in LIVE_OPTIONS and _same(v, getattr(engine.config, k))}
    changes = {k: v for k, v in body.items() if k not in same}
    applied = engine.reconfigure(**changes) if changes else {}
    return {**applied, **{k: f"{k} is already {json.dumps(body[k])}; nothing to change" for k in sorted(same)}}


def _same(sent: object, value: object) -> bool:
    """Whether a value sent is the option's value as GET /v1/strata/config shows it (true is not 1)."""
    return json.dumps(sent) == json.dumps(_jsonable(value))


async def set_config(request: Request) -> Response:
    """Apply live options as the workbench's knobs do; the engine's refusal comes back as a 400."""
    server = state_of(request)
    body = await json_body(request)
    await server.client.info()
    if not body:
        raise APIError(400, f"send at least one live option; they are {', '.join(sorted(LIVE_OPTIONS))}")
    try:
        applied = await server.client.call(lambda e: _reconfigure(e, body))
    except StrataError as exc:
        message = _json_spelling(str(exc))
        raise APIError(400, message, param=_named(message, body), code="invalid_option") from None
    if "max_batch" in body:
        await server.client.refresh()                    # admission counts against the new batch
    return JSONResponse({"applied": applied})
