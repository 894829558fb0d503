"""The OpenAI-compatible HTTP server on an engine loop (``main.py serve``, and the workbench's switch)."""
from __future__ import annotations

from engine.server.app import create_app
from engine.server.background import BackgroundServer, bind_socket
from engine.server.settings import ServerSettings, check_bind, is_loopback

__all__ = ["ServerSettings", "create_app", "BackgroundServer", "bind_socket", "check_bind", "is_loopback"]
