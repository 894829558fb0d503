"""The chat pane at its narrowest: the sampling settings go one to a row so no label is cut, and the context
meter's line gives way to shorter forms ("281 / 512 tokens", "281/512"), the whole line in its tooltip."""
from __future__ import annotations

from PySide6.QtCore import Qt

from tests.app.test_window_layout import SCREENS, SMALL_SCREEN, _client, _settle


def _smallest(w) -> None:
    w.apply_default_layout(SMALL_SCREEN)
    w.resize(_client(SMALL_SCREEN))
    _settle()
    for _ in range(3):                       # narrower, lines wrap to more rows: the least height grows
        w.resize(w.minimumSizeHint())
        _settle()


def _labels(box) -> dict[str, tuple[int, int]]:
    """Each shown settings label: (its width, the width it needs)."""
    return {label.text(): (label.width(), label.sizeHint().width()) for label, _ in box._pairs if label.isVisible()}


def test_no_sampling_label_is_cut_in_the_smallest_window(window):
    box = window.chat_pane.settings_box
    box.set_reasoning_shown(True)            # the longest form: a reasoning model's effort shown too
    box.setChecked(True)
    _smallest(window)
    assert window.chat_pane.width() <= 360, window.chat_pane.width()
    labels = _labels(box)
    assert set(labels) == {"Temperature", "Top-p", "Top-k", "Max tokens", "Chat too long", "Reasoning"}
    for text, (width, needed) in labels.items():
        assert width >= needed, f"{text!r} is cut: {width} px of the {needed} it needs"
    for label, field in box._pairs:          # one to a row, each field beside its own label
        assert field.geometry().left() > label.geometry().right()
        assert abs(field.geometry().center().y() - label.geometry().center().y()) <= 4


def test_a_wide_chat_pane_keeps_two_settings_a_row(window):
    box = window.chat_pane.settings_box
    box.setChecked(True)
    window.resize(_client(SCREENS[1]))
    window.apply_default_layout(SCREENS[1])
    _settle()
    tops = {label.text(): label.geometry().top() for label, _ in box._pairs[:4]}
    assert box._per_row == 2, (window.chat_pane.width(), box.layout().contentsRect().width(), box._two_per_row_width())
    assert tops["Temperature"] == tops["Top-p"] and tops["Top-k"] == tops["Max tokens"]
    for text, (width, needed) in _labels(box).items():
        assert width >= needed, f"{text!r} is cut: {width} px of the {needed} it needs"
    _smallest(window)                        # and back to one a row when the window narrows again
    labels = [label for label, _ in box._pairs[:2]]
    assert labels[0].geometry().top() != labels[1].geometry().top()


def _narrowest_chat(w) -> None:
    w.apply_default_layout(SMALL_SCREEN)
    w.resize(w.minimumSizeHint().width(), _client(SMALL_SCREEN).height())
    _settle()


def test_the_context_meter_shortens_its_line_in_the_narrowest_chat_pane(window):
    meter = window.chat_pane.context_meter
    label = meter.label
    meter.set_usage(281, 512)
    _narrowest_chat(window)
    explanation = meter.toolTip()
    assert explanation.startswith("How much of the model's context")
    assert label.text() == "Context 281 / 512 tokens"                      # what the line means, kept whole
    assert label.shown_text() in ("281 / 512 tokens", "281/512"), label.shown_text()
    assert label.fontMetrics().horizontalAdvance(label.shown_text()) <= label.contentsRect().width()
    assert label.toolTip() == f"{label.text()}\n{explanation}"             # the whole line, then what it means
    label.setFixedWidth(label.fontMetrics().horizontalAdvance("281/512") + 2)   # room for the shortest only
    _settle()
    assert label.shown_text() == "281/512" and label.toolTip() == f"{label.text()}\n{explanation}"
    label.setMinimumWidth(0)
    label.setMaximumWidth(16777215)
    window.resize(_client(SCREENS[1]))
    window.apply_default_layout(SCREENS[1])
    _settle()
    assert label.shown_text() == label.text() and label.toolTip() == explanation


def test_a_context_line_with_nothing_to_shorten_to_is_cut(window):
    meter = window.chat_pane.context_meter
    meter.set_usage(None, 0)                 # no model: "Context —" has no shorter form
    meter.label.setFixedWidth(meter.label.fontMetrics().horizontalAdvance("Con"))
    _settle()
    assert meter.label.shown_text().endswith("…")
    assert meter.label.toolTip() == f"Context —\n{meter.toolTip()}" and meter.toolTip().startswith("Load a model")


def test_opening_the_settings_and_the_note_never_makes_a_small_window_taller(window):
    # On a small screen the sampling settings unfolded and the demo note opened take room from the transcript
    # and scroll where they must: the window's least height stays within a few lines of what it was, so the
    # window keeps its height (it had grown past a 640-px screen's bottom, and stayed so once they closed)
    window.apply_default_layout(SMALL_SCREEN)
    window.resize(_client(SMALL_SCREEN))
    _settle()
    pane, before = window.chat_pane, window.minimumSizeHint().height()
    pane.notice.set_text("A note long enough to wrap over several lines when it is opened whole. " * 6)
    pane.settings_box.setChecked(True)
    pane.notice.toggle.click()
    _settle()
    line = pane.fontMetrics().lineSpacing()
    assert window.minimumSizeHint().height() <= before + 3 * line, (before, window.minimumSizeHint().height())
    assert window.height() == _client(SMALL_SCREEN).height()
    assert pane.notice.whole.isVisible() and pane.settings_box.temperature.isVisible()


def test_the_sampling_summary_keeps_its_lines_whole_after_the_window_narrows(window):
    # opened wide, then narrowed: the summary wraps to more rows, and its area grows to hold them (it kept
    # the wide window's one row, cut the second and showed a scroll bar)
    box = window.chat_pane.settings_box
    window.resize(_client(SCREENS[-1]))
    _settle()
    scroll = box.parentWidget().parentWidget()
    for size in (SCREENS[0], SMALL_SCREEN):
        window.resize(_client(size))
        _settle()
        assert scroll.height() >= box.heightForWidth(scroll.viewport().width()), size
        assert not scroll.verticalScrollBar().isVisible(), size


def test_tab_never_stops_on_a_frame_that_shows_nothing(window):
    from PySide6.QtWidgets import QScrollArea
    from app.transcript import ChatView
    # (the transcript and the demo note's frame keep Tab: the arrows scroll what they show, which has no
    # focusable part to scroll into sight)
    frames = [w for w in window.findChildren(QScrollArea) if not isinstance(w, ChatView) and w.isVisible()
              and w.widget() is not window.chat_pane.notice]
    assert frames and all(w.focusPolicy() == Qt.FocusPolicy.NoFocus for w in frames), [
        type(w).__name__ for w in frames if w.focusPolicy() != Qt.FocusPolicy.NoFocus]
