"""Opening another model while the current one runs: the loader thread and the rule for when it cannot.

The bridge builds a new engine here, on a thread of its own, and keeps stepping the current engine
meanwhile; the result comes back through the bridge's command queue. Only when both engines cannot be
held at once (:func:`must_unload_first`) does the current one close before the build starts.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from app.bridge_api import EngineConfig, StrataError, build_engine

log = logging.getLogger(__name__)

EngineFactory = Callable[[str, dict], Any]
DEMO_POOL = "50%"


def open_engine(model: str, options: dict) -> Any:
    """Build the real engine for ``model`` with ``options`` (raises StrataError on a user error).

    The engine chooses its CPU thread count by model size at load; the GUI thread keeps its core because
    the engine thread is nicer than it (``app.bridge.ENGINE_NICE``) and lets go of the GIL between steps.
    """
    if options.get("expert_pool_size") is None and (Path(model) / "STRATA_DEMO.json").is_file():
        # the demo shows the machinery: half its experts pooled, so every residency knob is live from the start
        options = {**options, "expert_pool_size": DEMO_POOL}
    return build_engine(EngineConfig(model=model, **options))


@dataclass(frozen=True)
class Load:
    """A command: open ``model`` with ``options``."""

    model: str
    options: tuple[tuple[str, object], ...]
    failed: str = ""            # set when this load brings back the model a failed load closed: why it failed
    instead: bool = False       # this load opens the fallback model because nothing else could be opened


@dataclass(frozen=True)
class Loaded:
    """The loader thread's answer: the new engine, or why there is none."""

    load: Load
    engine: Any = None
    error: str = ""


def spread_over_cards(options: dict) -> bool:
    """Whether engine ``options`` load a model over several GPUs (pipeline or expert parallel)."""
    return any(int(options.get(name) or 1) > 1 for name in ("pipeline_parallel", "expert_parallel"))


def must_unload_first(running_device: str, options: dict, running_options: dict | None = None) -> bool:
    """Whether the running engine (on ``running_device``, loaded with ``running_options`` when known)
    must close before a load with ``options`` starts.

    A model over several GPUs holds this process's one process group (a second one is refused) and
    GPUs 0..N-1: when either model is one, the running one closes first. On one GPU both engines
    would hold the same memory, and the new one plans its budget from the memory the card has free
    (all but what the running one holds), so the running one closes first. On the CPU, or when the
    new model goes to another device, both are held for the moment of the switch.
    """
    if spread_over_cards(options) or spread_over_cards(running_options or {}):
        return True
    wanted = str(options.get("device") or "auto")
    if not running_device.startswith("cuda") or wanted == "cpu":
        return False
    if wanted == "auto":
        return True
    card = lambda name: name.partition(":")[2] or "0"   # noqa: E731  ("cuda" is card 0)
    return card(wanted) == card(running_device)


class Loader:
    """Builds one engine at a time off the bridge thread and posts a :class:`Loaded` for each."""

    def __init__(self, factory: EngineFactory, post: Callable[[Loaded], None]) -> None:
        self._factory, self._post = factory, post
        self._thread: threading.Thread | None = None

    def start(self, load: Load) -> None:
        self._thread = threading.Thread(target=self._build, args=(load,), name="strata-loader", daemon=True)
        self._thread.start()

    def join(self) -> None:
        """Wait for the build in flight (if any) to have posted its answer."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _build(self, load: Load) -> None:
        try:
            self._post(Loaded(load, engine=self._factory(load.model, dict(load.options))))
        except StrataError as exc:
            self._post(Loaded(load, error=str(exc)))
        except Exception as exc:
            log.exception("loading %s failed", load.model)
            self._post(Loaded(load, error=f"it could not be read ({type(exc).__name__}: {exc})"))
