"""Polls a GPU monitor about once a second on its own thread and emits each ``GpuSample``; with a pipeline
over several cards it reads every card of it as well and emits their readings together.

The monitor's data types (from the engine, through :mod:`app.bridge_api`) are re-exported from here for
the widgets.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable

from PySide6.QtCore import QMetaObject, QObject, Qt, QThread, QTimer, Signal, Slot

from app.bridge_api import (NO_GPU_STATUS, POWER_REASONS, THERMAL_REASONS, THROTTLE_REASONS, FakeMonitor, GpuMonitor,
                            GpuSample, NvmlMonitor)

__all__ = ["CardReadings", "GpuPoller", "GpuSample", "FakeMonitor", "NvmlMonitor", "NO_GPU_STATUS", "POWER_REASONS",
           "PRIMARY_CARD", "THERMAL_REASONS", "THROTTLE_REASONS", "card_index"]

log = logging.getLogger(__name__)

#: The card the main monitor reads (the GPU panel's readouts and plots, the thermal banner and guard).
PRIMARY_CARD = 0
#: Opens a monitor of the card with this index (NvmlMonitor in the workbench; fakes in tests).
CardMonitorFactory = Callable[[int], GpuMonitor]


def card_index(device: str) -> int | None:
    """The GPU index of an engine device name: "cuda:1" -> 1, "cuda" -> 0, "cpu" -> None."""
    kind, _, index = device.partition(":")
    if kind != "cuda":
        return None
    return int(index) if index.isdigit() else 0


@dataclass(frozen=True)
class CardReadings:
    """One poll of the watched cards: (card index, its sample), in the order they were asked for."""

    samples: tuple[tuple[int, GpuSample], ...] = ()

    def of(self, index: int) -> GpuSample | None:
        """The sample of card ``index``, or None when it was not read."""
        return next((s for i, s in self.samples if i == index), None)


class _Worker(QObject):
    sampled = Signal(object)        # GpuSample
    cards_sampled = Signal(object)  # CardReadings

    def __init__(self, monitor: GpuMonitor, interval_ms: int, card_monitor: CardMonitorFactory) -> None:
        super().__init__()
        self._monitor = monitor
        self._interval_ms = interval_ms
        self._card_monitor = card_monitor
        self._cards: dict[int, GpuMonitor] = {}    # the other watched cards' monitors, by index
        self._watched: tuple[int, ...] = ()
        self._timer: QTimer | None = None

    @Slot()
    def start(self) -> None:
        self._timer = QTimer(self)
        self._timer.timeout.connect(self.poll)
        self._timer.start(self._interval_ms)
        self.poll()

    @Slot(object)
    def watch(self, indices: tuple[int, ...]) -> None:
        """Read the cards ``indices`` on every poll from now on (and once at once); () reads none."""
        self._watched = tuple(dict.fromkeys(indices))
        for index in [i for i in self._cards if i not in self._watched]:
            self._cards.pop(index).close()
        for index in self._watched:
            if index != PRIMARY_CARD and index not in self._cards:
                self._cards[index] = self._card_monitor(index)
        if self._watched:
            self.cards_sampled.emit(self._read_cards(None))

    @Slot()
    def poll(self) -> None:
        try:
            primary = self._monitor.sample()
        except Exception:  # a driver hiccup must not kill the poller; the next poll tries again
            log.exception("GPU monitor read failed")
            primary = None
        if primary is not None:
            self.sampled.emit(primary)
        if self._watched:
            self.cards_sampled.emit(self._read_cards(primary))

    def _read_cards(self, primary: GpuSample | None) -> CardReadings:
        """Every watched card's sample; the primary card's is the one just read for ``sampled``."""
        samples = []
        for index in self._watched:
            if index == PRIMARY_CARD:
                sample = primary if primary is not None else self._read(self._monitor, index)
            else:
                sample = self._read(self._cards[index], index)
            samples.append((index, sample))
        return CardReadings(tuple(samples))

    @staticmethod
    def _read(monitor: GpuMonitor, index: int) -> GpuSample:
        try:
            return monitor.sample()
        except Exception:  # this card's row says it has no reading; the next poll tries again
            log.exception("GPU %d monitor read failed", index)
            return GpuSample(timestamp=time.time(), available=False, status=f"reading GPU {index} failed")

    @Slot()
    def stop(self) -> None:
        if self._timer is not None:
            self._timer.stop()
        self._monitor.close()
        for monitor in self._cards.values():
            monitor.close()
        self._cards.clear()
        self._watched = ()


class GpuPoller(QObject):
    """Owns the monitor thread; ``sampled`` fires on the GUI thread with every reading of the primary card,
    ``cards_sampled`` with every reading of the cards asked for with :meth:`watch`."""

    sampled = Signal(object)        # GpuSample
    cards_sampled = Signal(object)  # CardReadings
    _watch = Signal(object)         # tuple[int, ...], to the worker's thread

    def __init__(self, monitor: GpuMonitor | None = None, interval_ms: int = 1000,
                 parent: QObject | None = None, card_monitor: CardMonitorFactory = NvmlMonitor) -> None:
        super().__init__(parent)
        self.monitor = monitor if monitor is not None else NvmlMonitor(PRIMARY_CARD)
        self._thread = QThread()
        self._thread.setObjectName("strata-gpu-monitor")
        self._worker = _Worker(self.monitor, interval_ms, card_monitor)
        self._worker.moveToThread(self._thread)
        self._thread.started.connect(self._worker.start)
        self._worker.sampled.connect(self.sampled)
        self._worker.cards_sampled.connect(self.cards_sampled)
        self._watch.connect(self._worker.watch)

    @property
    def status(self) -> str:
        return self.monitor.status

    def start(self) -> None:
        """Begin polling."""
        self._thread.start()

    def watch(self, indices: tuple[int, ...]) -> None:
        """Read the cards ``indices`` (a pipeline's GPUs) on every poll as well; () stops reading them."""
        self._watch.emit(tuple(indices))

    def stop(self) -> None:
        """Stop polling, release the monitors and join the thread."""
        if not self._thread.isRunning():
            return
        QMetaObject.invokeMethod(self._worker, "stop", Qt.ConnectionType.BlockingQueuedConnection)
        self._thread.quit()
        self._thread.wait(5000)
