"""When a save runs while something changes on screen many times a second (a streaming reply, typing).

The first change after a quiet spell is saved at once, so a crash in the first second keeps what was shown;
changes that follow within ``first_ms`` are saved together once it has passed, and from then on at most
once every ``steady_ms`` while changes go on. A change never pushes a due save back, so steady changes are
saved every ``steady_ms`` rather than never, and the number of writes does not grow with the number of
changes (tokens, keystrokes).
"""
from __future__ import annotations

from PySide6.QtCore import QObject, QTimer, Signal


class SavePacer(QObject):
    """Emits ``save_due`` at the pace above for the changes reported by ``changed()``; a child of ``owner``
    (a signal, not a callback held here, so the pacer keeps its owner alive no longer than Qt does)."""

    save_due = Signal()

    def __init__(self, owner: QObject | None, first_ms: int, steady_ms: int) -> None:
        if not 0 < first_ms <= steady_ms:
            raise ValueError(f"a save pace needs 0 < first_ms <= steady_ms, not {first_ms} and {steady_ms}")
        super().__init__(owner)
        self.first_ms, self.steady_ms = first_ms, steady_ms
        self.timer = QTimer(self)
        self.timer.setSingleShot(True)
        self.timer.timeout.connect(self._due)
        self.pending = False         # a change not saved yet (its save is due when the timer fires)
        self._in_first = False       # the timer runs the short wait after a save made at once

    def changed(self) -> None:
        """Something to save changed: saved now after a quiet spell, else with the save that is due."""
        if self.timer.isActive():
            self.pending = True
            return
        self.pending = False
        self.save_due.emit()
        self._in_first = True
        self.timer.start(self.first_ms)

    def _due(self) -> None:
        in_first, self._in_first = self._in_first, False
        if self.pending:
            self.pending = False
            self.save_due.emit()
            self.timer.start(self.steady_ms)
        elif in_first and self.first_ms < self.steady_ms:
            # nothing changed since the save made at once: the rest of a steady period before another one
            self.timer.start(self.steady_ms - self.first_ms)

    def flush(self) -> None:
        """Save a change still waiting now, and wait for none (another chat is shown, the window closes)."""
        self.timer.stop()
        self._in_first = False
        if self.pending:
            self.pending = False
            self.save_due.emit()

    def stop(self) -> None:
        """Drop a save that is due (what it would save is saved another way, or its widgets are gone)."""
        self.timer.stop()
        self._in_first = False
        self.pending = False
