"""OpenAI error objects: every refusal is ``{"error": {"message", "type", "param", "code"}}``."""
from __future__ import annotations

import json

from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response

from engine.errors import printable

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
          405: "invalid_request_error", 413: "invalid_request_error", 415: "invalid_request_error",
          500: "server_error", 503: "server_error"}


class APIError(Exception):
    """A request the server answers with ``status`` and one line saying what is wrong and how to fix it."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> bytes:
        return error_body(self.status, self.message, self.param, self.code)

    def response(self) -> Response:
        return Response(self.body(), self.status, headers=self.headers, media_type="application/json")


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> bytes:
    error = {"message": message, "type": _TYPES.get(status, "invalid_request_error"), "param": param, "code": code}
    return json.dumps({"error": error}, ensure_ascii=False).encode()


def error_object(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    """The same object as a dict, for a stream's error event."""
    return json.loads(error_body(status, message, param, code))


async def api_error_handler(request: Request, exc: APIError) -> Response:
    return exc.response()


def trailing_slash(path: str) -> APIError:
    """The 404 for a route's path with a ``/`` at its end (never redirected: a redirect would answer with an
    empty body, to the Host the client named)."""
    return APIError(404, f"this server does not serve {printable(path)}; send the request to "
                         f"{printable(path.rstrip('/'))}, without the trailing slash", code="not_found")


async def http_error_handler(request: Request, exc: StarletteHTTPException) -> Response:
    """Starlette's own refusals (no such route, wrong method) in the OpenAI shape."""
    if exc.status_code == 404:
        path = printable(request.scope["path"])
        bare = request.scope["path"].rstrip("/")
        if bare != request.scope["path"] and any(getattr(r, "path", None) == bare for r in request.app.routes):
            return trailing_slash(request.scope["path"]).response()
        message = (f"this server does not serve {path}; it serves /v1/models, /v1/completions and "
                   "/v1/chat/completions, and /v1/strata/stats and /v1/strata/config (docs/server.md lists every "
                   "route)" if path.startswith("/v1/") else
                   f"there is no route {path}; the API lives under /v1 (see GET /v1/models), beside /health "
                   "and /metrics")
        return APIError(404, message, code="not_found").response()
    if exc.status_code == 405:     # every route of the path counts (a path may have one route per method)
        path = request.scope["path"]
        methods = sorted({m for r in request.app.routes if getattr(r, "path", None) == path
                          for m in getattr(r, "methods", None) or ()})
        allowed = ", ".join(methods) or (exc.headers or {}).get("Allow", "")
        exc.headers = {**(exc.headers or {}), "Allow": allowed} if allowed else exc.headers
        message = f"{request.method} is not allowed on {printable(request.scope['path'])}; use {allowed or 'another method'}"
        return APIError(405, message, code="method_not_allowed", headers=dict(exc.headers or {})).response()
    return APIError(exc.status_code, str(exc.detail)).response()


async def validation_error_handler(request: Request, exc: RequestValidationError) -> Response:
    """FastAPI's request validation (the endpoints parse their own bodies, so this is only a safety net)."""
    errors = exc.errors()
    first = errors[0] if errors else {}
    where = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
    message = f"{where or 'the request'}: {first.get('msg', 'is not valid')}"
    return APIError(400, message, param=where).response()
