"""The engine as the workbench sees it: every engine name the app uses, and nothing else.

This is the bridge's side of the layering (pyproject.toml's import contracts): it is the one module of
``app`` that imports ``engine``; the bridge, the loader, the local server and the widgets take what they
need from here. The model code and the HTTP libraries load on first use (``build_engine``, ``build_server``),
not when the window starts.
"""
from __future__ import annotations

from typing import Any

from engine.chat_format.harmony import ReplyReader
from engine.chat_format.think import reasoning_reader
from engine.chat_template import TemplateFailure, TemplateFixes, failure_line
from engine.cli.options import add_engine_flags, add_model_flag
from engine.config import EngineConfig
from engine.context import DROP_OLDEST_FIX, fit_messages, fit_text
from engine.cpu_threads import apply_cpu_threads
from engine.errors import StrataError
from engine.gpu_monitor import (NO_GPU_STATUS, POWER_REASONS, THERMAL_REASONS, THROTTLE_REASONS, FakeMonitor,
                                GpuMonitor, GpuSample, NvmlMonitor)
from engine.loop import EngineLoop, Job
from engine.options import LIVE_NAMES, LIVE_OPTIONS, LiveOption, option
from engine.outputs import RequestDelta
from engine.sampling import SamplingParams
from engine.settings_fit import max_prefetch_depth

__all__ = ["DROP_OLDEST_FIX", "EngineConfig", "EngineLoop", "FakeMonitor", "GpuMonitor", "GpuSample", "Job",
           "LIVE_NAMES", "LIVE_OPTIONS", "LiveOption", "NO_GPU_STATUS", "NvmlMonitor", "POWER_REASONS", "ReplyReader",
           "RequestDelta", "SamplingParams", "StrataError", "THERMAL_REASONS", "THROTTLE_REASONS", "TemplateFailure",
           "TemplateFixes", "add_engine_flags", "add_model_flag", "apply_cpu_threads", "build_engine", "build_server",
           "failure_line", "fit_messages", "fit_text", "max_prefetch_depth", "option", "reasoning_reader"]


def build_engine(config: EngineConfig) -> Any:
    """The engine (``engine.engine.LLMEngine``) for ``config``, loaded; raises StrataError on a user error."""
    from engine.collector import freeze_imports
    from engine.engine import LLMEngine      # the model code loads with the first model
    freeze_imports()                         # once, before the first model (engine/collector.py)
    return LLMEngine(config)


def build_server(loop: EngineLoop, port: int) -> Any:
    """``engine.server.BackgroundServer`` on 127.0.0.1:``port`` serving ``loop``, not started yet."""
    from engine.server import BackgroundServer, ServerSettings   # the HTTP libraries load when a server starts
    return BackgroundServer(loop, ServerSettings(port=port))
