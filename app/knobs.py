"""Live engine knobs: each change goes to the engine alone and shows whether it was applied.

Widgets are synced from the engine's ``KnobState`` with their signals blocked, so syncing never sends
a change back. Options the engine cannot change now are disabled with its reason as the tooltip.
"""
from __future__ import annotations

from PySide6.QtCore import QSize, Qt, Signal
from PySide6.QtGui import QPainter
from PySide6.QtWidgets import (QCheckBox, QComboBox, QFormLayout, QGroupBox, QHBoxLayout, QLabel,
                               QPushButton, QSizePolicy, QSlider, QSpinBox, QVBoxLayout, QWidget)

from app.bridge_api import LIVE_OPTIONS, LiveOption
from app.messages import KnobResult, KnobState
from app.panels.base import ElidedLabel
from app.range_spin import RangeDoubleSpin, RangeSpin

GIB = 1 << 30
POOL_STEPS_PER_GIB = 20       # slider resolution: 1/20 GiB (51 MiB)
SLIDER_MAX = 1 << 20          # most steps of the pool slider (its positions are 32-bit: coarser steps past this)
#: The knobs, in the engine's order of its live options; labels are short: the dock must fit beside the panels
LABELS = {o.name: o.label for o in LIVE_OPTIONS}
SUFFIXES = {o.name: f" {o.unit}" for o in LIVE_OPTIONS if o.unit}
HELP = {o.name: o.help for o in LIVE_OPTIONS}
KNOB_MAX = {o.name: o.knob_max for o in LIVE_OPTIONS}
ORDER = tuple(LABELS)
NOT_AVAILABLE = "not available"            # the line's tooltip says why


def knob_name(option: str) -> str | None:
    """The knob's name in a sentence ("Prefetch depth"), or None when ``option`` has no knob."""
    return LABELS.get(option)


class StatusLine(ElidedLabel):
    """A knob's status: wrapped to the width it is given (never wider) on at most ``MAX_LINES`` lines,
    the last cut with "…", the whole text in its tooltip, so a refusal shows its cause and its fix and a
    long engine answer never widens the dock (and with it the window)."""

    MAX_LINES = 4

    def __init__(self) -> None:
        super().__init__("")
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.reason = ""          # why the knob is disabled, shown as the tooltip while it is
        self.tip = ""             # the tooltip while it is not: the whole line, or what the line stands for

    def lines(self, width: int | None = None) -> list[str]:
        """The text as shown at ``width`` (default: the label's): whole words per line, at most
        MAX_LINES, the last cut with "…" where the text goes on."""
        metrics = self.fontMetrics()
        width = max(1, self.contentsRect().width() if width is None else width)
        out, words = [], self.text().split()
        while words and len(out) < self.MAX_LINES:
            line = words.pop(0)
            while words and metrics.horizontalAdvance(f"{line} {words[0]}") <= width:
                line += " " + words.pop(0)
            if len(out) == self.MAX_LINES - 1 and words:
                line = " ".join([line, *words])
                words = []
            out.append(metrics.elidedText(line, Qt.TextElideMode.ElideRight, width))
        return out

    def shown_text(self) -> str:
        return "\n".join(self.lines())

    def hasHeightForWidth(self) -> bool:
        return True

    def heightForWidth(self, width: int) -> int:
        margins = self.contentsMargins()
        n = len(self.lines(width - margins.left() - margins.right())) if self.text() else 0
        return n * self.fontMetrics().lineSpacing() + margins.top() + margins.bottom()

    def sizeHint(self) -> QSize:
        return QSize(0, self.heightForWidth(max(self.width(), 1)))

    def minimumSizeHint(self) -> QSize:
        return QSize(0, 0)

    def setText(self, text: str) -> None:
        super().setText(text)
        self.updateGeometry()

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        if self.height() != self.heightForWidth(self.width()):
            self.updateGeometry()

    def paintEvent(self, _event) -> None:
        painter = QPainter(self)
        rect = self.contentsRect()
        self.style().drawItemText(painter, rect, int(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignTop),
                                  self.palette(), self.isEnabled(), self.shown_text(), self.foregroundRole())

    def set_line(self, text: str, tip: str | None = None) -> None:
        self.setText(text)
        self.tip = text if tip is None else tip
        self.set_reason(self.reason)

    def set_reason(self, reason: str) -> None:
        self.reason = reason
        self.setToolTip(reason or self.tip)


class AutoSpin(RangeSpin):
    """A spin box whose lowest step, 0, is "auto": a step up from it goes to what auto comes to now
    (``auto_value``), not to 1, which the engine may refuse (a token budget below the batch)."""

    auto_value: int | None = None

    def stepBy(self, steps: int) -> None:
        if self.value() == self.minimum() == 0 and steps > 0 and self.auto_value:
            self.setValue(min(self.auto_value, self.maximum()))
        else:
            super().stepBy(steps)


def _spin(lo: int, hi: int, suffix: str, special: str | None = None) -> QSpinBox:
    box = AutoSpin() if special else RangeSpin()
    box.setRange(lo, hi)
    box.setKeyboardTracking(False)
    box.setSuffix(suffix)
    box.setProperty("unit", suffix)
    box.valueChanged.connect(lambda v: box.setSuffix(_unit(suffix, v)))
    if special:
        box.setSpecialValueText(special)
    return box


def _unit(suffix: str, n: int) -> str:
    """A unit in the plural (" layers") for ``n``: "1 layer", not "1 layers"."""
    return suffix[:-1] if n == 1 and suffix.endswith("s") else suffix


def pool_text(b: int) -> str:
    """A pool size as the slider shows it."""
    if b >= GIB // 10:
        return f"{b / GIB:.2f} GiB"
    return f"{b / (1 << 20):.1f} MiB" if b >= 1 << 20 or b == 0 else f"{b / 1024:.0f} KiB"


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
        self.label.setMinimumWidth(self.label.fontMetrics().horizontalAdvance("888.88 GiB"))
        # a slider shorter than this can hardly be set: the knobs' form then puts it under its label
        self.slider.setMinimumWidth(self.label.fontMetrics().horizontalAdvance("M") * 10)
        lay.addWidget(self.slider, 1)
        lay.addWidget(self.label)
        self._step_bytes = GIB // POOL_STEPS_PER_GIB
        self._exact = (0, 0)            # (slider position, bytes) of the size set last
        self.slider.valueChanged.connect(self._show)
        self.slider.sliderReleased.connect(lambda: self.released.emit(self.bytes()))
        self.slider.valueChanged.connect(self._changed)

    def _changed(self, value: int) -> None:
        if value != self._exact[0]:         # moved: the engine's exact size is forgotten, even back on its step
            self._exact = (-1, 0)
        if not self.slider.isSliderDown():  # keys and clicks apply at once; a drag applies on release
            self.released.emit(self.bytes())

    def set_bounds(self, max_bytes: int, current: int) -> None:
        """Range 0..max_bytes (finer steps for small models), positioned at ``current``."""
        self._step_bytes = max(GIB // POOL_STEPS_PER_GIB if max_bytes >= GIB else max_bytes // 100, 1)
        self.slider.blockSignals(True)
        top = max(1, min(round(max_bytes / self._step_bytes), SLIDER_MAX))
        self._step_bytes = max(self._step_bytes, -(-max_bytes // top))      # a range a slider's int holds
        self.slider.setRange(0, top)
        self.slider.setValue(min(top, round(current / self._step_bytes)))   # a size past the range: the end
        # the size the engine holds, shown and sent as it is while the slider stays on its step (a step is
        # about 1% of the range: 8 MiB would read 7.9 beside the engine's "8.0 MiB")
        self._exact = (self.slider.value(), min(current, max_bytes))
        self.slider.blockSignals(False)
        self._show(self.slider.value())
        self.slider.setToolTip(f"0 to {pool_text(max_bytes)}")

    def bytes(self) -> int:
        at, exact = self._exact
        return exact if self.slider.value() == at else int(self.slider.value() * self._step_bytes)

    def _show(self, _value: int) -> None:
        self.label.setText(pool_text(self.bytes()))


class KnobsPanel(QWidget):
    """The live knobs; ``change_requested(option, value)`` fires once per user change."""

    change_requested = Signal(str, object)
    changes_requested = Signal(list)             # [(option, value)], applied as one (EngineBridge.reconfigure_all)
    result_shown = Signal(object)                # KnobResult, once its status is on screen
    guard_changed = Signal(bool, float, float)   # enabled, pause at °C, resume below °C
    title = "Knobs"

    def __init__(self) -> None:
        super().__init__()
        self.state: KnobState | None = None
        self.status: dict[str, StatusLine] = {}
        self.controls: dict[str, QWidget] = {}
        self._asked: set[str] = set()                   # changes sent and not answered yet
        self._restoring: set[str] = set()               # of those, values kept from an earlier session
        outer = QVBoxLayout(self)
        # with no model there are no values to show: a line says so instead of placeholder numbers
        self.no_model = QLabel("No model loaded. Its engine settings show here once a model is open, "
                               "and change while it runs.")
        self.no_model.setWordWrap(True)
        outer.addWidget(self.no_model)
        self.engine_box = box = QGroupBox("Engine (applied live)")
        self.form = QFormLayout(box)
        self.form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        # a narrow dock puts each field under its label rather than cutting it off
        self.form.setRowWrapPolicy(QFormLayout.RowWrapPolicy.WrapLongRows)
        self._build_controls()
        self.reset_button = QPushButton("Reset to defaults")
        self.reset_button.clicked.connect(self.reset_to_defaults)
        self.form.addRow(self.reset_button)
        outer.addWidget(box)
        outer.addWidget(self._build_guard())
        outer.addStretch(1)
        self.show_no_model()

    def show_no_model(self) -> None:
        """No engine runs: the engine's knobs give way to a line that says so."""
        self.state = None
        self.engine_box.setVisible(False)
        self.no_model.setVisible(True)
        self.setEnabled(False)

    def _build_controls(self) -> None:
        for o in LIVE_OPTIONS:
            self.controls[o.name] = self._control(o)
            self.controls[o.name].setToolTip(o.help)
            self.status[o.name] = StatusLine()
            cell = QWidget()
            lay = QVBoxLayout(cell)
            lay.setContentsMargins(0, 0, 0, 2)
            lay.setSpacing(0)
            lay.addWidget(self.controls[o.name])
            lay.addWidget(self.status[o.name])
            self.form.addRow(o.label, cell)

    def _control(self, o: LiveOption) -> QWidget:
        """The widget of one live option, wired to send its changes; its kind decides which."""
        if o.kind == "size":
            slider = PoolSlider()
            slider.released.connect(lambda b: self._send(o.name, b))
            return slider
        if o.kind == "choice":
            box = QComboBox()
            box.textActivated.connect(lambda t: self._send(o.name, t))
            return box
        if o.kind == "bool":
            check = QCheckBox("enabled")
            check.toggled.connect(lambda on: self._send(o.name, on))
            return check
        # an automatic int shows its automatic value (None) as the spin box's lowest step, 0: "auto"
        spin = _spin(0 if o.automatic else o.low, o.knob_max, SUFFIXES.get(o.name, ""), "auto" if o.automatic else None)
        spin.valueChanged.connect(lambda v: self._send(o.name, None if o.automatic and v == 0 else v))
        spin.out_of_range.connect(lambda line: self._set_status(o.name, "bad", line))
        return spin

    def _build_guard(self) -> QGroupBox:
        box = QGroupBox("Thermal guard")
        form = QFormLayout(box)
        form.setRowWrapPolicy(QFormLayout.RowWrapPolicy.WrapLongRows)
        self.guard_enabled = QCheckBox("pause generation when hot")
        self.guard_pause = RangeDoubleSpin()
        self.guard_pause.setRange(40, 110)
        self.guard_pause.setValue(83)
        self.guard_pause.setSuffix(" °C")
        self.guard_resume = RangeDoubleSpin()
        self.guard_resume.setRange(30, 105)
        self.guard_resume.setValue(75)
        self.guard_resume.setSuffix(" °C")
        # what the guard does with these values where that is not what the boxes say
        self.guard_line = QLabel("")
        self.guard_line.setWordWrap(True)
        self.guard_line.setObjectName("knobStatus_off")
        self._temperature_note = ""      # why no temperature is read here ("" while one is)
        form.addRow(self.guard_enabled)
        form.addRow("Pause at", self.guard_pause)
        form.addRow("Resume below", self.guard_resume)
        form.addRow(self.guard_line)
        self._range_note = ""            # a number typed out of range, said until a value changes
        for w in (self.guard_pause, self.guard_resume):
            w.setKeyboardTracking(False)     # a number counts once entered: "1000" never passes for 100
            w.valueChanged.connect(self._guard)
            w.out_of_range.connect(self._guard_out_of_range)
        self.guard_enabled.toggled.connect(self._guard)
        return box

    def _guard_out_of_range(self, line: str) -> None:
        self._range_note = line
        self._show_guard_line()

    def _guard(self, *_args) -> None:
        # the boxes keep what the user set; the guard resumes below the pause point at the latest
        # (ThermalGuard.set_limits), and the line says so while the two cross
        self._range_note = ""
        self._show_guard_line()
        self.guard_changed.emit(self.guard_enabled.isChecked(), self.guard_pause.value(), self.guard_resume.value())

    def _show_guard_line(self) -> None:
        pause, resume = self.guard_pause.value(), self.guard_resume.value()
        notes = [self._range_note] if self._range_note else []
        if self.guard_enabled.isChecked() and self._temperature_note:
            notes.append(f"The guard cannot act: {self._temperature_note}.")
        if resume >= pause:
            notes.append(f"Resume below is not under Pause at: the guard resumes below {pause - 1:.0f} °C.")
        self.guard_line.setText(" ".join(notes))
        self.guard_line.setVisible(bool(notes))

    def set_temperature_note(self, note: str) -> None:
        """Why the guard has no temperature to act on ("" once one is read): shown while it is on."""
        if note != self._temperature_note:
            self._temperature_note = note
            self._show_guard_line()

    def set_guard(self, enabled: bool, pause_at: float, resume_below: float) -> None:
        """Show saved guard settings (and apply them, through guard_changed)."""
        for box, value in ((self.guard_pause, pause_at), (self.guard_resume, resume_below),
                           (self.guard_enabled, enabled)):
            box.blockSignals(True)
            (box.setChecked if box is self.guard_enabled else box.setValue)(value)
            box.blockSignals(False)
        self._guard()

    def _send(self, option: str, value: object) -> None:
        self._asked.add(option)
        self._restoring.discard(option)      # the user's own change: its answer is shown as such
        self._set_status(option, "off", "applying…")
        self.change_requested.emit(option, value)

    def request(self, option: str, value: object) -> None:
        """Ask the engine for ``value`` as if the user had set it (a value saved from an earlier session)."""
        self._send(option, value)

    def request_all(self, changes: list[tuple[str, object]], restoring: bool = True) -> None:
        """Ask for several values as one change: one may need another's (a smaller max batch tokens
        after a lower max batch), so none is refused for the order they are sent in. ``restoring``: the
        values an earlier session left, which the panel shows as plain values once they apply (no "✓
        applied" line: nothing was changed now); a refusal is shown all the same."""
        for option, _ in changes:
            self._asked.add(option)
            if restoring:
                self._restoring.add(option)
            self._set_status(option, "off", "applying…")
        if changes:
            self.changes_requested.emit(list(changes))

    def _set_status(self, option: str, kind: str, text: str, tip: str | None = None) -> None:
        label = self.status[option]
        label.set_line(text, tip)
        if label.objectName() != f"knobStatus_{kind}":
            label.setObjectName(f"knobStatus_{kind}")
            label.style().unpolish(label)
            label.style().polish(label)

    def clear_status(self) -> None:
        """Forget every status line (another model is loaded: they spoke of the previous one)."""
        self._asked.clear()
        self._restoring.clear()
        for name in ORDER:
            self.status[name].set_reason("")
            self._set_status(name, "off", "")

    def apply_state(self, state: KnobState) -> None:
        """Show the engine's current values; disable what it cannot change now."""
        self.state = state
        self.no_model.setVisible(False)
        self.engine_box.setVisible(True)
        self.setEnabled(True)
        for name in ORDER:
            w = self.controls[name]
            if name not in self._asked:        # a state sent before a change's answer would undo it on screen
                w.blockSignals(True)
                try:
                    self._sync(name, w, state)
                finally:
                    w.blockSignals(False)
            reason = state.reason(name)
            w.setEnabled(reason is None)
            w.setToolTip(reason or HELP[name])
            self.status[name].set_reason(reason or "")
            if reason:
                self._set_status(name, "off", NOT_AVAILABLE)
            elif self.status[name].text() == NOT_AVAILABLE:
                self._set_status(name, "off", "")
            elif self._kind(name) in ("ok", "warn"):   # the value the engine holds: it may have fitted the one asked
                self._show_applied(name, self._value_text(name, state.value(name), state), state.value(name))
        self.reset_button.setEnabled(state.values != state.defaults)

    def _sync(self, name: str, w: QWidget, state: KnobState) -> None:
        value = state.value(name)
        if name == "expert_pool_size":
            w.set_bounds(state.pool_max_bytes, state.pool_bytes if value is None else int(value))
        elif isinstance(w, QComboBox):
            offered = list(state.choices_of(name))
            if [w.itemText(i) for i in range(w.count())] != offered:      # a new load may offer other values
                w.clear()
                w.addItems(offered)
            w.setCurrentText(str(value))
        elif isinstance(w, QCheckBox):
            w.setChecked(bool(value))
        elif isinstance(w, QSpinBox):
            if isinstance(w, AutoSpin):
                w.auto_value = state.automatic_value(name)
            most = state.most_of(name)          # this model's bound (a prefetch depth: its MoE layers - 1)
            w.setMaximum(most if most is not None else KNOB_MAX[name])
            w.setValue(0 if value is None else int(value))
            unit = w.property("unit")
            if unit:                                  # signals are blocked here: the unit follows the value
                w.setSuffix(_unit(str(unit), w.value()))

    def show_result(self, result: KnobResult) -> None:
        """Mark one option applied (with the engine's description) or rejected (with its reason)."""
        if result.option not in self.status:
            return
        self._asked.discard(result.option)
        restored = result.option in self._restoring
        self._restoring.discard(result.option)
        if result.applied:
            # the line names this knob's new value; the engine's whole account (the pool, staging,
            # look-ahead, ...) is its tooltip, where a later change of another knob cannot make it stale.
            # A value kept from the last session shows as the control's value alone: nothing changed now.
            if restored:
                self._set_status(result.option, "off", "", f"Kept from the last session. When applied: "
                                                           f"{result.message}")
            else:
                self._set_status(result.option, "ok", "", f"When applied: {result.message}")
                self._show_applied(result.option, self._value_text(result.option, result.value, self.state),
                                   result.value)
            for name in ORDER:                  # a refusal another knob's value caused may no longer hold
                if name != result.option and self._kind(name) == "bad":
                    self._set_status(name, "off", "")
        else:
            from app.cli_wording import gui_wording      # (it imports this module's labels)
            self._set_status(result.option, "bad", f"✗ rejected: {gui_wording(result.message)}")
        self.result_shown.emit(result)

    def _show_applied(self, option: str, value_text: str, value: object = None) -> None:
        """The ✓ line of ``option``, naming ``value_text``; its tooltip (the engine's account) stays. A pool
        of ``value`` bytes too small for one expert is applied with a warning: it holds none."""
        line, one = self.status[option], self.state.expert_bytes if self.state is not None else 0
        if option == "expert_pool_size" and isinstance(value, int) and 0 < value < one:
            self._set_status(option, "warn", f"⚠ applied: {value_text}, less than one expert ({pool_text(one)}): "
                                             "none is pooled", line.tip)
            return
        self._set_status(option, "ok", f"✓ applied: {value_text}", line.tip)

    def _kind(self, option: str) -> str:
        """What the line of ``option`` says now: "ok" (applied), "warn" (applied, and a warning), "bad"
        (refused) or "off"."""
        return self.status[option].objectName().removeprefix("knobStatus_")

    def _value_text(self, option: str, value: object, state: KnobState | None) -> str:
        """``value`` of ``option`` as its control shows it ("2 layers", "auto", "9.0 MiB", "on"); an
        automatic pool with the size ``state`` says it holds."""
        w = self.controls[option]
        if isinstance(w, PoolSlider):
            if isinstance(value, int):          # a size past every expert's bytes holds them all, and no more
                most = state.pool_max_bytes if state is not None else None
                return pool_text(min(value, most) if most else value)
            return f"auto ({pool_text(state.pool_bytes)})" if value is None and state is not None else "auto"
        if isinstance(w, QSpinBox):
            n = 0 if value is None else int(value)
            special = n == w.minimum() and w.specialValueText()
            unit = _unit(str(w.property("unit") or w.suffix()), n)
            return w.specialValueText() if special else f"{w.prefix()}{w.textFromValue(n)}{unit}"
        if isinstance(w, QCheckBox):
            return "on" if value else "off"
        return str(value)

    def reset_to_defaults(self) -> None:
        """Send every option that differs from its value at load back to it, one at a time."""
        if self.state is None:
            return
        current, changes = dict(self.state.values), []
        for name, default in self.state.defaults:
            if current.get(name) != default and self.state.reason(name) is None:
                changes.append((name, default))
            elif self._kind(name) == "bad":
                self._set_status(name, "off", "")      # a refusal of a value the knob no longer asks for
        self.request_all(changes, restoring=False)
