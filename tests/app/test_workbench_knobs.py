"""Each knob reaches the real engine and comes back applied, or rejected with the engine's reason."""
from __future__ import annotations

from PySide6.QtCore import Qt

TIMEOUT = 30_000


def _answer(qtbot, window, act):
    """Do ``act`` and wait for the engine's answer to reach the knobs panel (on the GUI thread)."""
    with qtbot.waitSignal(window.knobs.result_shown, timeout=TIMEOUT) as got:
        act()
    return got.args[0]


def _status(window, option: str) -> str:
    return window.knobs.status[option].text()


def test_spin_and_combo_knobs_apply_live(window, qtbot):
    c = window.knobs.controls
    for option, act, value in (
        ("prefetch_depth", lambda: c["prefetch_depth"].setValue(1), 1),
        ("max_batch", lambda: c["max_batch"].setValue(4), 4),
        ("max_batch_tokens", lambda: c["max_batch_tokens"].setValue(64), 64),
        ("prefill_chunk", lambda: c["prefill_chunk"].setValue(256), 256),
        ("expert_policy", lambda: c["expert_policy"].textActivated.emit("lru"), "lru"),
        ("expert_reads", lambda: c["expert_reads"].textActivated.emit("direct"), "direct"),
        ("kv_cache_dtype", lambda: c["kv_cache_dtype"].textActivated.emit("int8"), "int8"),
    ):
        result = _answer(qtbot, window, act)
        assert (result.option, result.value, result.applied) == (option, value, True), result
        qtbot.waitUntil(lambda o=option, v=value: window.knobs.state.value(o) == v, timeout=TIMEOUT)
        assert _status(window, option).startswith("✓ applied")
    assert window.knobs.reset_button.isEnabled()


def test_pool_slider_is_bounded_and_resizes_the_pool(window, qtbot):
    slider = window.knobs.controls["expert_pool_size"]
    state = window.knobs.state
    assert state.pool_max_bytes > state.pool_bytes > 0
    assert slider.slider.maximum() * slider._step_bytes <= state.pool_max_bytes + slider._step_bytes
    target = slider.slider.maximum()
    result = _answer(qtbot, window, lambda: slider.slider.setValue(target))
    assert result.option == "expert_pool_size" and result.applied, result
    assert "slots" in result.message          # the engine's own description of the new pool
    qtbot.waitUntil(lambda: window.knobs.state.pool_bytes > state.pool_bytes, timeout=TIMEOUT)


def test_rejected_change_shows_the_engine_reason(window, qtbot):
    c = window.knobs.controls
    _answer(qtbot, window, lambda: c["max_batch"].setValue(32))
    result = _answer(qtbot, window, lambda: c["max_batch_tokens"].setValue(8))
    assert not result.applied
    assert "max_batch_tokens=8 is below max_batch=32" in result.message
    assert _status(window, "max_batch_tokens").startswith("✗ rejected: max_batch_tokens=8")
    qtbot.waitUntil(lambda: c["max_batch_tokens"].value() == 0, timeout=TIMEOUT)  # resynced: still auto


def test_unsupported_options_are_disabled_with_the_reason(window, qtbot):
    reasons = dict(window.knobs.state.unsupported)
    assert "cuda_graphs" in reasons and "kv_cache_dtype" not in reasons   # CPU: no CUDA graphs
    for option in ("cuda_graphs",):
        control = window.knobs.controls[option]
        assert not control.isEnabled()
        assert control.toolTip() == reasons[option] and reasons[option]
    # asking anyway (as a script could) is refused by the engine with the same reason
    result = _answer(qtbot, window, lambda: window.bridge.reconfigure("cuda_graphs", False))
    assert not result.applied and reasons["cuda_graphs"] in result.message


def test_reset_to_defaults_restores_load_values(window, qtbot):
    c = window.knobs.controls
    _answer(qtbot, window, lambda: c["prefill_chunk"].setValue(128))
    qtbot.waitUntil(lambda: window.knobs.state.value("prefill_chunk") == 128, timeout=TIMEOUT)
    qtbot.mouseClick(window.knobs.reset_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: window.knobs.state.value("prefill_chunk") == 2048, timeout=TIMEOUT)
    assert not window.knobs.reset_button.isEnabled()
