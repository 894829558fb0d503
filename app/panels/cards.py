"""The cards of a pipeline, one row per stage: its layers, device, memory against its budget, expert hits,
host→device traffic, and the card's temperature and clock-event (throttle) reasons from NVML.

On one card the engine reports no stages and the table hides itself. A reading NVML cannot give (a stage
on the CPU, no driver, a card that does not report it) shows "N/A", never a made-up 0.
"""
from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import (QAbstractItemView, QLabel, QSizePolicy, QTableWidget, QTableWidgetItem, QVBoxLayout,
                               QWidget)

from app.gpu_poller import NO_GPU_STATUS, PRIMARY_CARD, CardReadings, GpuSample, card_index
from app.panels.base import COLORS
from app.panels.memory import GIB, fmt_bytes
from app.panels.traffic import GB
from app.thermal import AMBER, RED, assess

COLUMNS = ("Layers", "Device", "Memory / budget", "Expert hits", "H2D", "Temp", "Throttle")
#: The room each column keeps, whatever it shows now (the last one takes what is left).
_WIDEST = ("00–00", "cuda:0", "88.8 / 88.8 GiB", "88.8%", "88.88 GB/s", "88 °C")
NOT_AVAILABLE = "N/A"
WAITING = "—"
_LEVEL_COLORS = {AMBER: COLORS["amber"], RED: COLORS["red"]}


def pipeline_cards(stats: Any) -> tuple[int, ...]:
    """The GPU index of every stage on a GPU, in stage order; () on one card or for stages on the CPU."""
    return tuple(i for i in (card_index(st.device) for st in stats.stages) if i is not None)


def layers_text(stage: Any) -> str:
    """"0–11" for a stage holding layers 0 to 11 (``end_layer`` is one past its last)."""
    last = stage.end_layer - 1
    return str(stage.first_layer) if last <= stage.first_layer else f"{stage.first_layer}–{last}"


def memory_text(m: Any) -> tuple[str, str]:
    """Resident + expert pool + KV cache + workspace against the card's budget: text and tooltip."""
    used = m.resident_bytes + m.expert_pool_bytes + m.kv_cache_bytes + m.workspace_bytes
    unit, scale = ("GiB", GIB) if max(used, m.budget_bytes or 0) >= GIB else ("MiB", float(1 << 20))
    parts = (f"resident {fmt_bytes(m.resident_bytes)} + expert pool {fmt_bytes(m.expert_pool_bytes)} + "
             f"KV cache {fmt_bytes(m.kv_cache_bytes)} + workspace {fmt_bytes(m.workspace_bytes)}")
    peak = f"; peak allocated {fmt_bytes(m.max_allocated_bytes)}" if m.max_allocated_bytes else ""
    if not m.budget_bytes:
        return f"{used / scale:.1f} {unit}, no budget", f"{parts}; no budget on the CPU{peak}"
    share = 100.0 * used / m.budget_bytes
    return (f"{used / scale:.1f} / {m.budget_bytes / scale:.1f} {unit}",
            f"{parts} = {share:.0f}% of its {fmt_bytes(m.budget_bytes)} budget{peak}")


def hits_text(e: Any) -> tuple[str, str]:
    """The stage's share of needed experts found on its card since load: text and tooltip."""
    needed = e.hits + e.misses
    slots = f"; pool slots {e.pool_slots_used}/{e.pool_slots_total}" if e.pool_slots_total else ""
    if not needed:
        why = ("Nothing counted yet: no token has been routed through its layers" if e.policy else
               "Every expert of its layers is on the card: nothing can miss, so nothing is counted")
        return WAITING, why + slots
    pool = max(e.hits - e.prefetch_hits, 0)
    return (f"{100.0 * e.hit_rate:.1f}%",
            f"Of {needed} experts its layers needed since load: {pool} in the pool, {e.prefetch_hits} in a "
            f"staging slot a prefetch filled in time, {e.misses} missing{slots}")


def nvml_texts(device: str, sample: GpuSample | None) -> tuple[tuple[str, str], tuple[str, str], str | None]:
    """(temperature text and tooltip, throttle text and tooltip, colour or None) of the card of ``device``."""
    index = card_index(device)
    if index is None:
        gone = (NOT_AVAILABLE, "A stage on the CPU: there is no GPU to read")
        return gone, gone, None
    if sample is None:
        wait = (WAITING, f"Waiting for the first reading of GPU {index}")
        return wait, wait, None
    if not sample.available:
        gone = (NOT_AVAILABLE, f"GPU {index}: {sample.status or NO_GPU_STATUS}")
        return gone, gone, None
    if sample.gpu_temp_c is None:
        temp = (NOT_AVAILABLE, f"GPU {index} does not report its temperature")
    else:
        mem = "" if sample.mem_temp_c is None else f", memory {sample.mem_temp_c:.0f} °C"
        limit = "" if sample.slowdown_temp_c is None else f"; slowdown at {sample.slowdown_temp_c:.0f} °C"
        temp = (f"{sample.gpu_temp_c:.0f} °C", f"{sample.name or f'GPU {index}'}: core {sample.gpu_temp_c:.0f} °C"
                f"{mem}{limit}")
    if sample.throttle_reasons is None:
        throttle = (NOT_AVAILABLE, f"GPU {index} does not report its clock-event reasons")
    else:
        words = ", ".join(sample.throttle_reasons) or "none"
        throttle = (words, f"Clock-event reasons of GPU {index}: {words}")
    return temp, throttle, _LEVEL_COLORS.get(assess(sample).level)


class BusRates:
    """Each stage's host→device GB/s, from the change of its ``h2d_bytes`` since the previous snapshot."""

    def __init__(self) -> None:
        self._prev: dict[int, tuple[float, int]] = {}     # rank -> (time, cumulative bytes)

    def reset(self) -> None:
        self._prev.clear()

    def push(self, now: float, stages: tuple[Any, ...]) -> list[float | None]:
        """The rate of every stage (None for its first snapshot)."""
        rates: list[float | None] = []
        for st in stages:
            moved, prev = st.experts.h2d_bytes, self._prev.get(st.rank)
            rate = None
            if prev is not None and now > prev[0]:
                rate = max(moved - prev[1], 0) / (now - prev[0]) / GB    # a new model counts from 0 again
            self._prev[st.rank] = (now, moved)
            rates.append(rate)
        return rates


class CardsTable(QWidget):
    """The per-card rows; fed every EngineStats (``push_stats``) and every poll of the cards (``push_cards``)."""

    def __init__(self) -> None:
        super().__init__()
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 2)
        lay.setSpacing(1)
        self.caption = QLabel("")
        self.caption.setObjectName("readoutLabel")
        self.caption.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.table = self._build_table()
        lay.addWidget(self.caption)
        lay.addWidget(self.table)
        self.rates = BusRates()
        self.readings = CardReadings()
        self._stages: tuple[Any, ...] = ()
        self._shape: tuple | None = None     # (rank, device, layers) of each row shown
        self.setVisible(False)

    def _build_table(self) -> QTableWidget:
        table = QTableWidget(0, len(COLUMNS))
        table.setHorizontalHeaderLabels(COLUMNS)
        table.verticalHeader().setVisible(False)
        table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        table.setSelectionMode(QAbstractItemView.SelectionMode.NoSelection)
        table.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        table.setWordWrap(False)
        # like the readouts: a value whose width changes never re-lays out the dock, nor widens it
        table.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Fixed)
        table.horizontalHeader().setStretchLastSection(True)
        metrics = table.fontMetrics()
        for column, (title, widest) in enumerate(zip(COLUMNS, _WIDEST)):
            table.setColumnWidth(column, max(metrics.horizontalAdvance(t) for t in (title, widest)) + 14)
        return table

    def push_stats(self, s: Any, now: float) -> None:
        """One EngineStats snapshot: the rows of its stages, or nothing shown on one card."""
        stages = tuple(s.stages)
        if self.isHidden() == bool(stages):
            self.setVisible(bool(stages))
        shape = tuple((st.rank, st.device, st.first_layer, st.end_layer) for st in stages)
        if shape != self._shape:
            self._shape = shape
            self.rates.reset()
            self._make_rows(stages)
        self._stages = stages
        if not stages:
            return
        for row, (st, rate) in enumerate(zip(stages, self.rates.push(now, stages))):
            e = st.experts
            self._set(row, "Layers", layers_text(st), f"stage {st.rank}: layers {st.first_layer} to {st.end_layer - 1}")
            self._set(row, "Device", st.device, f"stage {st.rank} runs on {st.device}")
            self._set(row, "Memory / budget", *memory_text(st.memory))
            self._set(row, "Expert hits", *hits_text(e))
            self._set(row, "H2D", WAITING if rate is None else f"{rate:.2f} GB/s",
                      f"{e.h2d_bytes / GB:.2f} GB host → device since load, {e.direct_bytes / GB:.2f} GB of it "
                      "read directly from host memory by the MoE kernels")
        self._show_readings()

    def push_cards(self, readings: CardReadings) -> None:
        """One poll of the pipeline's cards (from the GPU poller)."""
        self.readings = readings
        self._show_readings()

    def _show_readings(self) -> None:
        for row, st in enumerate(self._stages):
            temp, throttle, color = nvml_texts(st.device, self._reading_of(st.device))
            self._set(row, "Temp", *temp, color=color)
            self._set(row, "Throttle", *throttle, color=color)

    def _reading_of(self, device: str) -> GpuSample | None:
        index = card_index(device)
        return None if index is None else self.readings.of(index)

    def _make_rows(self, stages: tuple[Any, ...]) -> None:
        """One row of empty cells per stage, and a height that shows them all (only when the stages change)."""
        t = self.table
        t.setRowCount(len(stages))
        for row in range(len(stages)):
            for column in range(len(COLUMNS)):
                t.setItem(row, column, QTableWidgetItem(WAITING))
        rows = len(stages) * t.verticalHeader().defaultSectionSize()
        t.setFixedHeight(t.horizontalHeader().sizeHint().height() + rows + 2 * t.frameWidth() +
                         t.horizontalScrollBar().sizeHint().height())   # room for the scroll bar of a narrow dock
        gpus = any(card_index(st.device) is not None for st in stages)
        below = f"; the readouts and plots below are GPU {PRIMARY_CARD}'s" if gpus else ""
        self.caption.setText(f"Pipeline of {len(stages)} stages, one row each{below}")

    def _set(self, row: int, column: str, text: str, tip: str = "", color: str | None = None) -> None:
        """Change one cell (only what differs: each change costs the GUI an event)."""
        item = self.table.item(row, COLUMNS.index(column))
        if item.text() != text:
            item.setText(text)
        if item.toolTip() != tip:
            item.setToolTip(tip)
        if item.data(Qt.ItemDataRole.UserRole) != color:
            item.setData(Qt.ItemDataRole.UserRole, color)
            item.setData(Qt.ItemDataRole.ForegroundRole, QBrush(QColor(color)) if color else None)
