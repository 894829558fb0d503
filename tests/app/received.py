"""Waiting on a signal the engine thread emits, without racing it.

``qtbot.waitSignal`` calls its callback on the emitting thread: a signal from the engine thread that
fires just before the wait starts its event loop is lost, and the wait never ends. ``Received`` takes
the signal through a slot of a QObject living in the GUI thread (a queued connection), and the test
waits until the GUI thread has seen what it needs.
"""
from __future__ import annotations

from PySide6.QtCore import QObject, Slot


class Received(QObject):
    """Every argument ``signal`` carried, as the GUI thread received it."""

    def __init__(self, signal) -> None:
        super().__init__()
        self.args: list = []
        signal.connect(self.on_signal)

    @Slot(object)
    def on_signal(self, value) -> None:
        self.args.append(value)

    def wait(self, qtbot, check=lambda _value: True, timeout: int = 30_000, since: int = 0):
        """The first value received after the first ``since`` that passes ``check`` (waits for it)."""
        def found() -> bool:
            return any(check(v) for v in self.args[since:])
        qtbot.waitUntil(found, timeout=timeout)
        return next(v for v in self.args[since:] if check(v))

    def wait_new(self, qtbot, check=lambda _value: True, timeout: int = 30_000):
        """The first value from now on that passes ``check``."""
        return self.wait(qtbot, check, timeout, since=len(self.args))
