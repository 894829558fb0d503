"""Knob values across restarts: what the user set, per model folder, in the window's QSettings.

After a load the saved values go through the engine's ordinary reconfigure path as one change (each
value tried again once the others applied, so none is refused for the order it was set in), and a
value that no longer fits (another budget, a changed model) is refused with the engine's reason like
any other change, and then forgotten.
"""
from __future__ import annotations

import hashlib
import json
import logging

from PySide6.QtCore import QSettings

from app.messages import KnobResult, KnobState

log = logging.getLogger(__name__)


def settings_key(model_path: str) -> str:
    """The QSettings key of one model folder's values (a digest: paths make poor keys)."""
    return "knob_values/" + hashlib.sha1(model_path.encode("utf-8")).hexdigest()[:16]


class KnobMemory:
    """Saves applied knob changes; hands back what to restore once after each load."""

    def __init__(self, settings: QSettings) -> None:
        self.settings = settings
        self.model: str | None = None
        self._restore_due = False
        self.pending: set[str] = set()      # saved values sent after the load, not answered yet

    def expect_restore(self, model_path: str) -> None:
        """A model was loaded: its saved values go out with the first knob state that follows."""
        self.model, self._restore_due = model_path, True
        self.pending.clear()

    def to_restore(self, state: KnobState) -> list[tuple[str, object]]:
        """(option, value) to send now, in the order they were set; empty except once per load."""
        if not self._restore_due or self.model is None:
            return []
        self._restore_due = False
        live = dict(state.values)
        out = [(option, value) for option, value in self.saved().items()
               if option in live and live[option] != value]
        self.pending = {option for option, _ in out}
        return out

    def on_result(self, result: KnobResult, state: KnobState | None) -> bool:
        """Remember an applied change; True when a restored value was refused (it is forgotten)."""
        restoring = result.option in self.pending
        self.pending.discard(result.option)
        if self.model is None:
            return False
        values = self.saved()
        if result.applied:
            values.pop(result.option, None)                     # set again: it moves to the end
            defaults = dict(state.defaults) if state is not None else {}
            if defaults.get(result.option, object()) != result.value:
                values[result.option] = result.value
            self._store(values)
            return False
        if restoring:
            values.pop(result.option, None)
            self._store(values)
        return restoring

    def saved(self) -> dict[str, object]:
        """The saved values of the current model (none when unreadable: the defaults are used)."""
        raw = self.settings.value(settings_key(self.model or ""), "")
        if not raw:
            return {}
        try:
            doc = json.loads(str(raw))
            values = doc["values"]
        except (ValueError, KeyError, TypeError):
            log.warning("the saved knob values of %s could not be read; using the values at load", self.model)
            return {}
        return dict(values) if isinstance(values, dict) else {}

    def _store(self, values: dict[str, object]) -> None:
        key = settings_key(self.model or "")
        if values:
            self.settings.setValue(key, json.dumps({"model": self.model, "values": values}))
        else:
            self.settings.remove(key)
