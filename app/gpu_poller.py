"""Polls a GPU monitor about once a second on its own thread and emits each ``GpuSample``.

The monitor's data types (from the engine, through :mod:`app.bridge_api`) are re-exported from here for
the widgets.
"""
from __future__ import annotations

import logging

from PySide6.QtCore import QMetaObject, QObject, Qt, QThread, QTimer, Signal, Slot

from app.bridge_api import (NO_GPU_STATUS, POWER_REASONS, THERMAL_REASONS, THROTTLE_REASONS, FakeMonitor, GpuMonitor,
                            GpuSample, NvmlMonitor)

__all__ = ["GpuPoller", "GpuSample", "FakeMonitor", "NvmlMonitor", "NO_GPU_STATUS", "POWER_REASONS",
           "THERMAL_REASONS", "THROTTLE_REASONS"]

log = logging.getLogger(__name__)


class _Worker(QObject):
    sampled = Signal(object)   # GpuSample

    def __init__(self, monitor: GpuMonitor, interval_ms: int) -> None:
        super().__init__()
        self._monitor = monitor
        self._interval_ms = interval_ms
        self._timer: QTimer | None = None

    @Slot()
    def start(self) -> None:
        self._timer = QTimer(self)
        self._timer.timeout.connect(self.poll)
        self._timer.start(self._interval_ms)
        self.poll()

    @Slot()
    def poll(self) -> None:
        try:
            self.sampled.emit(self._monitor.sample())
        except Exception:  # a driver hiccup must not kill the poller; the next poll tries again
            log.exception("GPU monitor read failed")

    @Slot()
    def stop(self) -> None:
        if self._timer is not None:
            self._timer.stop()
        self._monitor.close()


class GpuPoller(QObject):
    """Owns the monitor thread; ``sampled`` fires on the GUI thread with every reading."""

    sampled = Signal(object)   # GpuSample

    def __init__(self, monitor: GpuMonitor | None = None, interval_ms: int = 1000,
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.monitor = monitor if monitor is not None else NvmlMonitor()
        self._thread = QThread()
        self._thread.setObjectName("strata-gpu-monitor")
        self._worker = _Worker(self.monitor, interval_ms)
        self._worker.moveToThread(self._thread)
        self._thread.started.connect(self._worker.start)
        self._worker.sampled.connect(self.sampled)

    @property
    def status(self) -> str:
        return self.monitor.status

    def start(self) -> None:
        """Begin polling."""
        self._thread.start()

    def stop(self) -> None:
        """Stop polling, release the monitor and join the thread."""
        if not self._thread.isRunning():
            return
        QMetaObject.invokeMethod(self._worker, "stop", Qt.ConnectionType.BlockingQueuedConnection)
        self._thread.quit()
        self._thread.wait(5000)
