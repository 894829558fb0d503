"""``create_app``: the OpenAI-compatible API on an :class:`EngineLoop` (the server's own, or the workbench's)."""
from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from engine.loop import EngineLoop
from engine.server import routes
from engine.server.asgi import AccessLog, Counts, ReadBody, RequireKey
from engine.server.chat import create_chat_completion
from engine.server.completions import create_completion
from engine.server.engine_client import EngineClient
from engine.server.errors import APIError, api_error_handler, http_error_handler, validation_error_handler
from engine.server.logs import StatsLog
from engine.server.metrics import ServerMetrics
from engine.server.settings import ServerSettings
from engine.server.state import ServerState

log = logging.getLogger("strata.server")


def create_app(loop: EngineLoop, settings: ServerSettings) -> FastAPI:
    """The API on ``loop``; handlers reach the engine only through ``loop.call`` / ``loop.submit``."""
    state = ServerState(settings, EngineClient(loop, settings), ServerMetrics(), Counts(),
                        StatsLog(loop, settings.stats_every))

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state.client.bind(asyncio.get_running_loop())
        loop.add_tick(state.stats_log.tick)
        try:
            yield
        finally:
            loop.remove_tick(state.stats_log.tick)
            state.client.cancel_all()
            state.metrics.close()
            log.info("%s", state.stats_log.summary(state.metrics.totals))

    app = FastAPI(title="Strata", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan,
                  redirect_slashes=False)     # a redirect would answer with an empty body, to the Host the client named
    app.state.strata = state
    app.add_api_route("/v1/models", routes.list_models, methods=["GET"])
    app.add_api_route("/v1/models/{model_id:path}", routes.retrieve_model, methods=["GET"])
    app.add_api_route("/v1/completions", create_completion, methods=["POST"])
    app.add_api_route("/v1/chat/completions", create_chat_completion, methods=["POST"])
    app.add_api_route("/health", routes.health, methods=["GET", "HEAD"])
    app.add_api_route("/metrics", routes.metrics, methods=["GET"])
    app.add_api_route("/v1/strata/stats", routes.strata_stats, methods=["GET"])
    app.add_api_route("/v1/strata/config", routes.get_config, methods=["GET"])
    app.add_api_route("/v1/strata/config", routes.set_config, methods=["POST"])
    app.add_exception_handler(APIError, api_error_handler)
    app.add_exception_handler(StarletteHTTPException, http_error_handler)
    app.add_exception_handler(RequestValidationError, validation_error_handler)
    # added innermost first: AccessLog sees every request, RequireKey runs before a body is read
    app.add_middleware(ReadBody, limit=settings.max_body_bytes)
    app.add_middleware(RequireKey, key=settings.api_key)
    app.add_middleware(AccessLog, metrics=state.metrics, counts=state.counts)
    return app
