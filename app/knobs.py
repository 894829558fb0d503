"""Live engine knobs: each change goes to the engine alone and shows whether it was applied.

Widgets are synced from the engine's ``KnobState`` with their signals blocked, so syncing never sends
a change back. Options the engine cannot change now are disabled with its reason as the tooltip.
"""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QCheckBox, QComboBox, QDoubleSpinBox, QFormLayout, QGroupBox, QHBoxLayout, QLabel,
                               QPushButton, QSlider, QSpinBox, QVBoxLayout, QWidget)

from app.messages import KnobResult, KnobState

GIB = 1 << 30
POOL_STEPS_PER_GIB = 20       # slider resolution: 1/20 GiB (51 MiB)
LABELS = {
    "prefetch_depth": "Prefetch depth (layers)",
    "expert_pool_size": "Expert pool",
    "expert_policy": "Eviction policy",
    "expert_reads": "Missing experts",
    "max_batch": "Max batch (requests)",
    "max_batch_tokens": "Max batch tokens",
    "prefill_chunk": "Prefill chunk (tokens)",
    "kv_cache_dtype": "KV cache dtype",
    "cuda_graphs": "CUDA graphs",
}
ORDER = tuple(LABELS)


def _spin(lo: int, hi: int, special: str | None = None) -> QSpinBox:
    box = QSpinBox()
    box.setRange(lo, hi)
    box.setKeyboardTracking(False)
    if special:
        box.setSpecialValueText(special)
    return box


class PoolSlider(QWidget):
    """Expert pool size in GiB, bounded by the budget; sends its value when released."""

    released = Signal(int)    # bytes

    def __init__(self) -> None:
        super().__init__()
        lay = QHBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        self.slider = QSlider(Qt.Orientation.Horizontal)
        self.slider.setRange(0, 1)
        self.label = QLabel("—")
        self.label.setMinimumWidth(96)
        lay.addWidget(self.slider, 1)
        lay.addWidget(self.label)
        self._step_bytes = GIB // POOL_STEPS_PER_GIB
        self.slider.valueChanged.connect(self._show)
        self.slider.sliderReleased.connect(lambda: self.released.emit(self.bytes()))
        self.slider.valueChanged.connect(self._changed)

    def _changed(self, _value: int) -> None:
        if not self.slider.isSliderDown():  # keys and clicks apply at once; a drag applies on release
            self.released.emit(self.bytes())

    def set_bounds(self, max_bytes: int, current: int) -> None:
        """Range 0..max_bytes (finer steps for small models), positioned at ``current``."""
        self._step_bytes = max(GIB // POOL_STEPS_PER_GIB if max_bytes >= GIB else max_bytes // 100, 1)
        self.slider.blockSignals(True)
        self.slider.setRange(0, max(1, round(max_bytes / self._step_bytes)))
        self.slider.setValue(round(current / self._step_bytes))
        self.slider.blockSignals(False)
        self._show(self.slider.value())
        self.slider.setToolTip(f"0 to {max_bytes / GIB:.2f} GiB")

    def bytes(self) -> int:
        return int(self.slider.value() * self._step_bytes)

    def _show(self, _value: int) -> None:
        b = self.bytes()
        self.label.setText(f"{b / GIB:.2f} GiB" if b >= GIB // 10 else f"{b / (1 << 20):.1f} MiB")


class KnobsPanel(QWidget):
    """The live knobs; ``change_requested(option, value)`` fires once per user change."""

    change_requested = Signal(str, object)
    result_shown = Signal(object)                # KnobResult, once its status is on screen
    guard_changed = Signal(bool, float, float)   # enabled, pause at °C, resume below °C
    title = "Knobs"

    def __init__(self) -> None:
        super().__init__()
        self.state: KnobState | None = None
        self.status: dict[str, QLabel] = {}
        self.controls: dict[str, QWidget] = {}
        outer = QVBoxLayout(self)
        box = QGroupBox("Engine (applied live)")
        self.form = QFormLayout(box)
        self.form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        self._build_controls()
        self.reset_button = QPushButton("Reset to defaults")
        self.reset_button.clicked.connect(self.reset_to_defaults)
        self.form.addRow(self.reset_button)
        outer.addWidget(box)
        outer.addWidget(self._build_guard())
        outer.addStretch(1)
        self.setEnabled(False)

    def _build_controls(self) -> None:
        c = self.controls
        c["prefetch_depth"] = _spin(0, 8)
        c["expert_pool_size"] = PoolSlider()
        c["expert_policy"] = QComboBox()
        c["expert_reads"] = QComboBox()
        c["expert_reads"].setToolTip("auto: read straight from host memory where the GPU can (prefetch depth >= 1); "
                                     "copy: always copy into the pool first; direct: always read from host memory")
        c["max_batch"] = _spin(1, 1024)
        c["max_batch_tokens"] = _spin(0, 1 << 20, "auto")
        c["prefill_chunk"] = _spin(1, 1 << 20)
        c["kv_cache_dtype"] = QComboBox()
        c["cuda_graphs"] = QCheckBox("enabled")
        for name in ("prefetch_depth", "max_batch", "max_batch_tokens", "prefill_chunk"):
            c[name].valueChanged.connect(lambda v, n=name: self._send(n, None if v == 0 and n == "max_batch_tokens" else v))
        c["expert_pool_size"].released.connect(lambda b: self._send("expert_pool_size", b))
        for name in ("expert_policy", "expert_reads", "kv_cache_dtype"):
            c[name].textActivated.connect(lambda t, n=name: self._send(n, t))
        c["cuda_graphs"].toggled.connect(lambda on: self._send("cuda_graphs", on))
        for name in ORDER:
            self.status[name] = QLabel("")
            self.status[name].setWordWrap(True)
            cell = QWidget()
            lay = QVBoxLayout(cell)
            lay.setContentsMargins(0, 0, 0, 2)
            lay.setSpacing(0)
            lay.addWidget(c[name])
            lay.addWidget(self.status[name])
            self.form.addRow(LABELS[name], cell)

    def _build_guard(self) -> QGroupBox:
        box = QGroupBox("Thermal guard")
        form = QFormLayout(box)
        self.guard_enabled = QCheckBox("pause generation when hot")
        self.guard_pause = QDoubleSpinBox()
        self.guard_pause.setRange(40, 110)
        self.guard_pause.setValue(83)
        self.guard_pause.setSuffix(" °C")
        self.guard_resume = QDoubleSpinBox()
        self.guard_resume.setRange(30, 105)
        self.guard_resume.setValue(75)
        self.guard_resume.setSuffix(" °C")
        form.addRow(self.guard_enabled)
        form.addRow("Pause at", self.guard_pause)
        form.addRow("Resume below", self.guard_resume)
        for w in (self.guard_pause, self.guard_resume):
            w.valueChanged.connect(self._guard)
        self.guard_enabled.toggled.connect(self._guard)
        return box

    def _guard(self, *_args) -> None:
        self.guard_changed.emit(self.guard_enabled.isChecked(), self.guard_pause.value(), self.guard_resume.value())

    def _send(self, option: str, value: object) -> None:
        self._set_status(option, "off", "applying…")
        self.change_requested.emit(option, value)

    def _set_status(self, option: str, kind: str, text: str) -> None:
        label = self.status[option]
        label.setObjectName(f"knobStatus_{kind}")
        label.setText(text)
        label.style().unpolish(label)
        label.style().polish(label)

    def apply_state(self, state: KnobState) -> None:
        """Show the engine's current values; disable what it cannot change now."""
        self.state = state
        self.setEnabled(True)
        for name in ORDER:
            w = self.controls[name]
            w.blockSignals(True)
            try:
                self._sync(name, w, state)
            finally:
                w.blockSignals(False)
            reason = state.reason(name)
            w.setEnabled(reason is None)
            w.setToolTip(reason or "")
            self.status[name].setToolTip(reason or "")
            if reason:
                self._set_status(name, "off", "not available now (hover for why)")
            elif self.status[name].text().startswith("not available"):
                self._set_status(name, "off", "")
        self.reset_button.setEnabled(state.values != state.defaults)

    def _sync(self, name: str, w: QWidget, state: KnobState) -> None:
        value = state.value(name)
        if name == "expert_pool_size":
            w.set_bounds(state.pool_max_bytes, state.pool_bytes if value is None else int(value))
        elif isinstance(w, QComboBox):
            if w.count() == 0:
                w.addItems(list(state.choices_of(name)))
            w.setCurrentText(str(value))
        elif isinstance(w, QCheckBox):
            w.setChecked(bool(value))
        elif isinstance(w, QSpinBox):
            w.setValue(0 if value is None else int(value))

    def show_result(self, result: KnobResult) -> None:
        """Mark one option applied (with the engine's description) or rejected (with its reason)."""
        if result.option not in self.status:
            return
        if result.applied:
            self._set_status(result.option, "ok", f"✓ applied: {result.message}")
        else:
            self._set_status(result.option, "bad", f"✗ rejected: {result.message}")
        self.result_shown.emit(result)

    def reset_to_defaults(self) -> None:
        """Send every option that differs from its value at load back to it, one at a time."""
        if self.state is None:
            return
        current = dict(self.state.values)
        for name, default in self.state.defaults:
            if current.get(name) != default and self.state.reason(name) is None:
                self._send(name, default)
