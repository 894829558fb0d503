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


def test_the_pool_slider_names_the_size_the_engine_holds_until_it_moves(window, qtbot):
    from app.knobs import pool_text
    pool = window.knobs.controls["expert_pool_size"]
    held = window.knobs.state.value("expert_pool_size")     # 8 MiB: between two of the slider's steps
    assert held % pool._step_bytes and pool.label.text() == pool_text(held) == "8.0 MiB"
    at = pool.slider.value()
    result = _answer(qtbot, window, lambda: pool.slider.setValue(at + 1))
    assert result.value == (at + 1) * pool._step_bytes and pool.label.text() == pool_text(result.value)
    result = _answer(qtbot, window, lambda: pool.slider.setValue(at))         # back on the step: the step's size
    assert result.value == at * pool._step_bytes
    qtbot.waitUntil(lambda: _status(window, "expert_pool_size") == f"✓ applied: {pool.label.text()}", timeout=TIMEOUT)


def test_a_pool_too_small_for_one_expert_is_applied_with_a_warning(window, qtbot):
    from app.knobs import pool_text
    pool, one = window.knobs.controls["expert_pool_size"], window.knobs.state.expert_bytes
    assert 0 < pool._step_bytes < one
    result = _answer(qtbot, window, lambda: pool.slider.setValue(1))
    assert result.applied and window.knobs._kind("expert_pool_size") == "warn"
    assert _status(window, "expert_pool_size") == (f"⚠ applied: {pool_text(result.value)}, less than one expert "
                                                   f"({pool_text(one)}): none is pooled")
    _answer(qtbot, window, lambda: pool.slider.setValue(pool.slider.maximum()))
    assert window.knobs._kind("expert_pool_size") == "ok"


def test_rejected_change_shows_the_engine_reason(window, qtbot):
    c = window.knobs.controls
    _answer(qtbot, window, lambda: c["max_batch"].setValue(32))
    result = _answer(qtbot, window, lambda: c["max_batch_tokens"].setValue(8))
    assert not result.applied                               # in the knobs' names, not the engine's options
    assert "Max batch tokens 8 is below Max batch 32" in result.message and "max_batch" not in result.message
    assert _status(window, "max_batch_tokens").startswith("✗ rejected: Max batch tokens 8")
    qtbot.waitUntil(lambda: c["max_batch_tokens"].value() == 0, timeout=TIMEOUT)  # resynced: still auto


def test_a_rejected_line_goes_once_another_change_is_applied(window, qtbot):
    # "Max batch tokens 1 is below Max batch 16": once the other knob moves, the refusal no longer holds
    c = window.knobs.controls
    refused = _answer(qtbot, window, lambda: c["max_batch_tokens"].setValue(1))
    assert not refused.applied and _status(window, "max_batch_tokens").startswith("✗ rejected")
    applied = _answer(qtbot, window, lambda: c["max_batch"].setValue(c["max_batch"].value() + 1))
    assert applied.applied and _status(window, "max_batch_tokens") == ""


def test_a_pool_size_past_every_expert_is_named_as_what_the_pool_holds(window, qtbot):
    most = window.knobs.state.pool_max_bytes
    result = _answer(qtbot, window, lambda: window.knobs.request("expert_pool_size", 99999999999999))
    assert result.applied
    from app.knobs import pool_text
    qtbot.waitUntil(lambda: _status(window, "expert_pool_size") == f"✓ applied: {pool_text(most)}", timeout=TIMEOUT)


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
    refused = _answer(qtbot, window, lambda: c["max_batch_tokens"].setValue(1))      # below max_batch: refused
    assert not refused.applied and _status(window, "max_batch_tokens").startswith("✗ rejected")
    _answer(qtbot, window, lambda: c["prefill_chunk"].setValue(128))
    qtbot.waitUntil(lambda: window.knobs.state.value("prefill_chunk") == 128, timeout=TIMEOUT)
    qtbot.mouseClick(window.knobs.reset_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: window.knobs.state.value("prefill_chunk") == 2048, timeout=TIMEOUT)
    assert not window.knobs.reset_button.isEnabled()
    assert _status(window, "max_batch_tokens") == ""          # the refusal spoke of a value no knob asks for now


# --- knob values across restarts -----------------------------------------------------------------
def test_knob_values_are_remembered_across_restarts(window_factory, qtbot):
    first = window_factory()
    c = first.knobs.controls
    _answer(qtbot, first, lambda: c["max_batch"].setValue(4))
    _answer(qtbot, first, lambda: c["prefill_chunk"].setValue(128))
    _answer(qtbot, first, lambda: c["expert_policy"].textActivated.emit("lru"))
    _answer(qtbot, first, lambda: c["prefill_chunk"].setValue(2048))      # back to its value at load: not kept
    first.close()

    second = window_factory()                      # the same settings file: a restart
    qtbot.waitUntil(lambda: second.knobs.state.value("max_batch") == 4
                    and second.knobs.state.value("expert_policy") == "lru", timeout=TIMEOUT)
    qtbot.waitUntil(lambda: not second.knob_memory.pending, timeout=TIMEOUT)     # every restored value answered
    assert second.knobs.state.value("prefill_chunk") == 2048 and _status(second, "prefill_chunk") == ""
    assert second.banners.text("knobs") == ""
    # a value kept from the last session is shown as the control's value, with no "applied" line: the
    # user changed nothing now (its tooltip says where it came from)
    for option in ("max_batch", "expert_policy"):
        assert _status(second, option) == ""
        assert "Kept from the last session" in second.knobs.status[option].tip
    assert second.knobs.controls["expert_policy"].currentText() == "lru"
    _answer(qtbot, second, lambda: second.knobs.controls["max_batch"].setValue(3))    # a change made now
    assert _status(second, "max_batch").startswith("✓ applied")


def test_a_saved_value_that_no_longer_fits_is_refused_with_its_reason(window_factory, qtbot, tmp_path):
    import json

    from PySide6.QtCore import QSettings

    from app.knob_memory import settings_key
    from app.paths import default_model_dir
    settings = QSettings(str(tmp_path / "strata.ini"), QSettings.Format.IniFormat)
    values = {"max_batch": 32, "max_batch_tokens": 8, "no_such_knob": 3}   # set in that order, last session
    settings.setValue(settings_key(str(default_model_dir())), json.dumps({"values": values}))
    settings.sync()
    w = window_factory()
    qtbot.waitUntil(lambda: w.banners.level("knobs") == "amber", timeout=TIMEOUT)
    text = w.banners.text("knobs")
    assert text.startswith("The saved Max batch tokens setting (8) was not applied: Max batch tokens 8 is below")
    # the engine's new state reaches the panel after the refusal's banner (its own signal): wait for it
    qtbot.waitUntil(lambda: w.knobs.state.value("max_batch") == 32, timeout=TIMEOUT)
    assert w.knobs.state.value("max_batch_tokens") is None
    assert _status(w, "max_batch_tokens").startswith("✗ rejected")
    saved = json.loads(str(QSettings(str(tmp_path / "strata.ini"), QSettings.Format.IniFormat).value(
        settings_key(w.model.path))))["values"]
    assert saved == {"max_batch": 32, "no_such_knob": 3}       # the refused one is forgotten, nothing else


def test_unreadable_saved_values_leave_the_defaults(window_factory, qtbot, tmp_path):
    from PySide6.QtCore import QSettings

    from app.knob_memory import settings_key
    from app.paths import default_model_dir
    settings = QSettings(str(tmp_path / "strata.ini"), QSettings.Format.IniFormat)
    settings.setValue(settings_key(str(default_model_dir())), "{not json")
    settings.sync()
    w = window_factory()
    assert w.knobs.state.values == w.knobs.state.defaults and w.banners.text("knobs") == ""
    _answer(qtbot, w, lambda: w.knobs.controls["max_batch"].setValue(5))   # and saving works again
    assert w.knob_memory.saved() == {"max_batch": 5}


# --- engine advice in the workbench's words ---------------------------------------------------------
def _engine_parser_flags() -> set[str]:
    import argparse

    from engine.cli.options import add_engine_flags, add_model_flag
    p = argparse.ArgumentParser(add_help=False)
    add_model_flag(p)
    add_engine_flags(p)
    return {s for action in p._actions for s in action.option_strings if s.startswith("--")}


def test_every_engine_flag_has_workbench_words():
    from app.cli_wording import FLAG_WORDS, FLAGS
    from app.knobs import knob_name
    flags = _engine_parser_flags()
    assert {f for f in flags if not f.startswith("--no-")} == set(FLAGS)
    for name, flag in FLAGS.items():
        # a knob, or a name of its own: a flag added to the engine must be given one here
        assert knob_name(flag.option) is not None or name in FLAG_WORDS, name
        if flag.takes_value:
            assert FLAG_WORDS[name][1], f"{name} needs a placeholder for 'start Strata with {name} …'"


def test_no_engine_flag_survives_outside_a_start_hint():
    import re

    from app.cli_wording import FLAGS, gui_wording
    from app.knobs import knob_name
    for name, flag in FLAGS.items():
        for knobs in (None, ()):
            text = gui_wording(f"raise {name} or try again", knobs)
            hint = re.search(r" \(start Strata with (.*)\)$", text)
            body = text[:hint.start()] if hint else text
            assert not re.search(r"--[a-z]", body), (name, text)
            live = knobs is None and knob_name(flag.option) is not None
            if live:
                assert f"the {knob_name(flag.option)} knob" in text and hint is None
            elif name != "--model":
                assert hint is not None and hint.group(1).startswith(name), text
                assert hint.group(1).split()[0] in _engine_parser_flags()      # main.py takes it


def test_engine_messages_read_as_workbench_advice():
    from app.cli_wording import gui_wording
    cases = {
        "the prompt has 900 tokens but the context holds 512; shorten the prompt or raise --max-model-len":
            "the prompt has 900 tokens but the context holds 512; shorten the prompt or raise the context length "
            "(start Strata with --max-model-len N)",
        "lower --max-batch-tokens, --prefill-chunk or --expert-pool-size, then continue":
            "lower the Max batch tokens knob, the Prefill chunk knob or the Expert pool knob, then continue",
        "model folder 'x' does not exist; pass --model with a folder that holds config.json":
            "model folder 'x' does not exist; use File › Open model folder… on a folder that holds config.json",
        "every expert is resident (no --expert-pool-size was given); restart with --expert-pool-size to offload":
            "every expert is resident (no --expert-pool-size was given); restart Strata with --expert-pool-size SIZE "
            "to offload",
        "x holds int4 experts; drop --weight-format or convert the source again with --weights int4":
            "x holds int4 experts; start Strata without --weight-format or convert the source again with --weights int4",
        "record one with --record-routing FILE":
            "record one with a routing recording (start Strata with --record-routing FILE)",
        "use --device cpu or auto": "use the device cpu or auto (start Strata with --device cpu)",
        "give a pool size (--expert-pool-size) to offload": "give a pool size (the Expert pool knob) to offload",
        "nothing to change here": "nothing to change here",
    }
    for message, expected in cases.items():
        assert gui_wording(message) == expected
    # a knob that cannot change now (every expert resident) is no fix: start Strata with the flag instead
    assert gui_wording("give a pool size (--expert-pool-size) to offload", knobs=()) == \
        "give a pool size (start Strata with --expert-pool-size SIZE) to offload"
    assert gui_wording("lower --expert-pool-size", knobs={"max_batch"}) == \
        "lower the expert pool size (start Strata with --expert-pool-size SIZE)"


def test_real_engine_errors_in_the_workbench_name_working_fixes():
    import pytest

    from app.cli_wording import gui_wording
    from engine.errors import StrataError
    from engine.memory import plan_memory
    with pytest.raises(StrataError) as err:
        plan_memory(resident_bytes=8 << 30, expert_bytes=1 << 20, num_experts=64, kv_bytes_per_token=1024,
                    budget_bytes=4 << 30)
    text = gui_wording(str(err.value), knobs=())      # a load that failed: every fix is for the next start
    assert "--gpu-memory-budget" in text.split("(start Strata with ")[-1]
    assert "raise --" not in text and "lower --" not in text


def test_an_applied_line_names_the_value_the_engine_holds(window, qtbot):
    from PySide6.QtTest import QTest
    c, status = window.knobs.controls, window.knobs.status
    layers = c["prefetch_depth"].property("unit")                      # " layers"

    def settled(act, option, value):
        # the engine's answer, then its state after the change: a state sent before it would put the
        # control back to the old value with its signals blocked, and the next change would send nothing
        result = _answer(qtbot, window, act)
        qtbot.waitUntil(lambda: window.knobs.state.value(option) == value, timeout=TIMEOUT)
        return result

    result = settled(lambda: c["prefetch_depth"].setValue(1), "prefetch_depth", 1)
    assert status["prefetch_depth"].text() == f"✓ applied: 1{layers[:-1]}"         # "1 layer"
    assert c["prefetch_depth"].text() == f"1{layers[:-1]}"
    assert status["prefetch_depth"].toolTip() == f"When applied: {result.message}"   # the engine's account
    settled(lambda: c["max_batch_tokens"].setValue(64), "max_batch_tokens", 64)
    assert status["max_batch_tokens"].text() == f"✓ applied: 64{c['max_batch_tokens'].suffix()}"
    settled(lambda: c["max_batch_tokens"].setValue(0), "max_batch_tokens", None)
    assert status["max_batch_tokens"].text() == "✓ applied: auto"
    # the box offers the look-ahead this model has (from its first MoE layer to its last): its top applies as is,
    # and a deeper one typed in is said to be outside the range, with the range this model takes
    deepest = window.knobs.state.most_of("prefetch_depth")
    assert deepest == c["prefetch_depth"].maximum() < 8            # the demo: 6 MoE layers, 5 ahead at most
    result = _answer(qtbot, window, lambda: c["prefetch_depth"].setValue(deepest))
    qtbot.waitUntil(lambda: window.knobs.state.value("prefetch_depth") == deepest, timeout=TIMEOUT)
    qtbot.waitUntil(lambda: status["prefetch_depth"].text() == f"✓ applied: {deepest}{layers}", timeout=TIMEOUT)
    assert status["prefetch_depth"].toolTip() == f"When applied: {result.message}" and result.message
    said: list[str] = []
    c["prefetch_depth"].out_of_range.connect(said.append)
    c["prefetch_depth"].lineEdit().selectAll()
    QTest.keyClicks(c["prefetch_depth"], str(deepest + 2))
    QTest.keyClick(c["prefetch_depth"], Qt.Key.Key_Return)
    assert said == [f"✗ {deepest + 2} is outside 0–{deepest}; it stays {deepest}"]
    # the pool back to automatic: named so, with the size it holds
    window.knobs.request("expert_pool_size", None)
    qtbot.waitUntil(lambda: status["expert_pool_size"].text().startswith("✓ applied: auto ("), timeout=TIMEOUT)
    assert "None" not in status["expert_pool_size"].text()


def test_a_state_sent_before_a_change_was_answered_does_not_undo_it_on_screen(window, qtbot):
    c = window.knobs.controls
    before = window.knobs.state                                  # prefill_chunk 2048
    with qtbot.waitSignal(window.knobs.result_shown, timeout=TIMEOUT):
        c["prefill_chunk"].setValue(256)
        window.knobs.apply_state(before)                         # as if it arrived late, before the answer
        assert c["prefill_chunk"].value() == 256
    qtbot.waitUntil(lambda: window.knobs.state.value("prefill_chunk") == 256, timeout=TIMEOUT)
    assert c["prefill_chunk"].value() == 256


def test_option_names_in_engine_messages_read_as_the_knobs_labels():
    from app.cli_wording import gui_wording
    assert gui_wording("max_batch_tokens=1 is below max_batch=16; raise max_batch_tokens or lower max_batch") == \
        ("Max batch tokens 1 is below Max batch 16; raise the Max batch tokens knob or lower the Max batch knob")
    assert gui_wording("expert_policy=static needs a routing profile").startswith("Eviction policy static needs")


def test_the_static_placement_is_offered_only_where_a_routing_profile_was_loaded(window):
    # The static policy places experts from a routing profile, which no knob can give: a load without
    # one does not offer it; a load with one does.
    from types import SimpleNamespace

    from app.bridge_state import offered_choices
    from engine.options import EXPERT_POLICIES
    box = window.knobs.controls["expert_policy"]
    shown = [box.itemText(i) for i in range(box.count())]
    assert "static" not in shown and set(shown) == set(EXPERT_POLICIES) - {"static"}
    choices = {"expert_policy": EXPERT_POLICIES, "expert_reads": ("auto", "copy")}
    with_profile = SimpleNamespace(config=SimpleNamespace(routing_profile="routing.json"))
    assert offered_choices(with_profile, choices) == choices
    without = offered_choices(SimpleNamespace(config=SimpleNamespace(routing_profile=None)), choices)
    assert without["expert_policy"] == ("lfu", "lru", "adaptive") and without["expert_reads"] == ("auto", "copy")


def test_reset_applies_values_that_need_each_other_in_one_click(window, qtbot):
    # max_batch 4 with max_batch_tokens 5: sent back one by one in the defaults' order, max_batch 16
    # would be refused (above the token budget of 5); as one change each is tried again once the
    # other applied, so one click restores both
    c = window.knobs.controls
    _answer(qtbot, window, lambda: c["max_batch"].setValue(4))
    qtbot.waitUntil(lambda: window.knobs.state.value("max_batch") == 4, timeout=TIMEOUT)
    assert _answer(qtbot, window, lambda: c["max_batch_tokens"].setValue(5)).applied
    qtbot.waitUntil(lambda: window.knobs.state.value("max_batch_tokens") == 5, timeout=TIMEOUT)
    defaults = dict(window.knobs.state.defaults)
    qtbot.mouseClick(window.knobs.reset_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: window.knobs.state.value("max_batch") == defaults["max_batch"]
                    and window.knobs.state.value("max_batch_tokens") is None, timeout=TIMEOUT)
    qtbot.waitUntil(lambda: not window.knobs.reset_button.isEnabled(), timeout=TIMEOUT)
    assert not any(_status(window, o).startswith("✗") for o in ("max_batch", "max_batch_tokens"))


def test_a_step_up_from_auto_goes_to_what_auto_comes_to(window, qtbot):
    spin = window.knobs.controls["max_batch_tokens"]
    state = window.knobs.state
    assert spin.value() == 0 and spin.text() == "auto"
    budget = state.automatic_value("max_batch_tokens")
    assert budget >= state.value("max_batch")
    result = _answer(qtbot, window, spin.stepUp)
    assert (result.value, result.applied) == (budget, True), result
    qtbot.waitUntil(lambda: window.knobs.state.value("max_batch_tokens") == budget, timeout=TIMEOUT)


def test_a_refused_request_is_said_in_its_reply_without_a_banner(window, qtbot):
    # a chat longer than the context under the "stop" policy: the reply says why in the chat's own
    # words, and no banner stays up once the next reply works
    overflow = window.chat_pane.settings_box.overflow
    overflow.setCurrentIndex(overflow.findData("stop"))
    with qtbot.waitSignal(window.chat.reply_done, timeout=TIMEOUT) as done:
        window.chat.send("the word " * 2000)
    error = done.args[0].error
    assert error and "set Chat too long (in the chat settings) to drop the oldest turns" in error, error
    assert window.banners.text("engine") == ""
    overflow.setCurrentIndex(overflow.findData("drop-oldest"))
    with qtbot.waitSignal(window.chat.reply_done, timeout=TIMEOUT) as again:
        window.chat.send("short")
    assert again.args[0].error is None and window.banners.text("engine") == ""



def test_a_number_typed_outside_a_knobs_range_is_said_not_silently_put_back(qapp):
    from PySide6.QtTest import QTest

    from app.knobs import _spin
    box = _spin(1, 999, " requests")
    box.setValue(16)
    said: list[str] = []
    box.out_of_range.connect(said.append)
    box.show()
    box.lineEdit().selectAll()
    QTest.keyClicks(box, "0")
    QTest.keyClick(box, Qt.Key.Key_Return)
    assert box.value() == 16 and said == ["✗ 0 is outside 1–999; it stays 16"]
    box.lineEdit().selectAll()
    QTest.keyClicks(box, "1200")                  # past the top: every keystroke stays, Enter says why not
    assert box.cleanText() == "1200"
    QTest.keyClick(box, Qt.Key.Key_Return)
    assert box.value() == 16 and said[-1] == "✗ 1200 is outside 1–999; it stays 16"
    box.lineEdit().selectAll()
    QTest.keyClicks(box, "-3")                    # below the bottom, a minus included
    QTest.keyClick(box, Qt.Key.Key_Return)
    assert box.value() == 16 and said[-1] == "✗ -3 is outside 1–999; it stays 16"
    box.lineEdit().selectAll()
    QTest.keyClicks(box, "12x")                   # not a number: the letter is refused as before
    QTest.keyClick(box, Qt.Key.Key_Return)
    assert box.value() == 12 and len(said) == 3
    box.hide()


def test_a_sampling_setting_typed_outside_its_range_is_said_under_the_settings(qapp):
    from PySide6.QtTest import QTest

    from app.chat_pane import SettingsBox
    box = SettingsBox()
    box.setChecked(True)
    box.show()
    box.temperature.setValue(0.7)
    for spin, typed, line in ((box.temperature, "5", "✗ 5 is outside 0–2; it stays 0.7"),
                              (box.top_k, "-1", "✗ -1 is outside off–1000; it stays 40"),
                              (box.max_tokens, "100000", "✗ 100000 is outside 1–32768; it stays 512")):
        before = spin.value()
        spin.lineEdit().selectAll()
        QTest.keyClicks(spin, typed)
        QTest.keyClick(spin, Qt.Key.Key_Return)
        assert spin.value() == before and box.range_note.text() == line and box.range_note.isVisibleTo(box)
    box.temperature.setValue(1.0)                 # the next change takes the line away
    assert box.range_note.isHidden()
    QTest.keyClicks(box.max_tokens, "100000")
    QTest.keyClick(box.max_tokens, Qt.Key.Key_Return)
    assert box.range_note.isVisibleTo(box)
    QTest.keyClicks(box.top_k, "5")               # another box typed into: the line was about the other one
    assert box.range_note.isHidden()
    box.hide()


def test_a_fraction_in_a_whole_number_box_is_refused_and_a_third_decimal_cut_at_the_keystroke(qapp):
    from PySide6.QtTest import QTest

    from app.chat_pane import SettingsBox
    box = SettingsBox()
    box.setChecked(True)
    box.show()
    box.temperature.lineEdit().selectAll()
    QTest.keyClicks(box.temperature, "0.755")
    QTest.keyClick(box.temperature, Qt.Key.Key_Return)
    assert box.temperature.value() == 0.75 and box.range_note.isHidden()
    box.max_tokens.setValue(512)
    for typed in ("12.5", ".5"):                   # the point was dropped at the keystroke: "12.5" became 125
        box.max_tokens.lineEdit().selectAll()
        QTest.keyClicks(box.max_tokens, typed)
        QTest.keyClick(box.max_tokens, Qt.Key.Key_Return)
        assert box.max_tokens.value() == 512
        assert box.range_note.text() == f"✗ {typed} is not a whole number; it stays 512"
    box.hide()


def test_a_decimal_comma_in_a_whole_number_box_is_refused_not_read_as_a_group_separator(qtbot):
    # "3,5" where "," groups thousands (C, English) and "3.5" where "." does (German): Qt's own fixup took the
    # separator out and applied 35
    from PySide6.QtCore import QLocale
    from PySide6.QtTest import QTest

    from app.knobs import _spin
    for locale, typed in ((QLocale.c(), "3,5"), (QLocale(QLocale.Language.German, QLocale.Country.Germany), "3.5")):
        box = _spin(1, 64, " layers")
        qtbot.addWidget(box)
        box.setLocale(locale)
        box.setValue(7)
        said = []
        box.out_of_range.connect(said.append)
        box.show()
        box.lineEdit().selectAll()
        QTest.keyClicks(box, typed)
        QTest.keyClick(box, Qt.Key.Key_Return)
        assert box.value() == 7 and said and said[-1] == f"✗ {typed} is not a whole number; it stays 7", locale.name()


def test_a_fraction_typed_into_a_knob_is_refused_on_its_line_and_nothing_is_asked(qtbot):
    from PySide6.QtTest import QTest

    from app.knobs import KnobsPanel
    knobs = KnobsPanel()
    qtbot.addWidget(knobs)
    knobs.setEnabled(True)
    knobs.show()
    asked = []
    knobs.change_requested.connect(lambda option, value: asked.append((option, value)))
    box = knobs.controls["max_batch"]
    before = box.value()
    box.lineEdit().selectAll()
    QTest.keyClicks(box, "3.5")
    QTest.keyClick(box, Qt.Key.Key_Return)
    assert box.value() == before and asked == []
    assert knobs.status["max_batch"].text().startswith("✗ 3.5 is not a whole number; it stays")


def test_regenerate_takes_a_sampling_number_typed_but_not_entered(qtbot, tmp_path):
    from PySide6.QtTest import QTest

    from tests.app.chat_fakes import exchange, make_chat
    chat = make_chat(qtbot, tmp_path / "c")
    exchange(chat, "A.", "Q")
    box = chat.pane.settings_box
    box.setChecked(True)
    box.temperature.lineEdit().selectAll()
    QTest.keyClicks(box.temperature, "0")            # then Regenerate, which takes no focus
    chat.regenerate()
    assert chat.bridge.requests[-1].settings.temperature == 0.0


def test_the_thermal_guard_says_a_number_typed_outside_its_range(qapp):
    from PySide6.QtTest import QTest

    from app.knobs import KnobsPanel
    knobs = KnobsPanel()
    knobs.setEnabled(True)                              # as a loaded model leaves it
    knobs.show()
    spin = knobs.guard_pause
    spin.lineEdit().selectAll()
    QTest.keyClicks(spin, "1000")
    QTest.keyClick(spin, Qt.Key.Key_Return)
    assert spin.value() == 83 and knobs.guard_line.text() == "✗ 1000 is outside 40–110; it stays 83"
    assert knobs.guard_line.isVisibleTo(knobs)
    spin.setValue(85)                                   # a change takes the line away
    assert knobs.guard_line.isHidden()
    knobs.hide()


def test_a_box_where_the_decimal_point_is_a_comma_says_numbers_as_it_writes_them(qapp):
    from PySide6.QtCore import QLocale
    from PySide6.QtTest import QTest

    from app.chat_pane import SettingsBox
    box = SettingsBox()
    box.setChecked(True)
    box.temperature.setLocale(QLocale(QLocale.Language.German, QLocale.Country.Germany))
    box.show()
    box.temperature.setValue(0.7)
    assert box.temperature.text() == "0,70"
    for typed in ("2,5", "2.5"):                  # the comma the box writes, or a point
        box.temperature.lineEdit().selectAll()
        QTest.keyClicks(box.temperature, typed)
        QTest.keyClick(box.temperature, Qt.Key.Key_Return)
        assert box.temperature.value() == 0.7 and box.range_note.text() == "✗ 2,5 is outside 0–2; it stays 0,7"
    box.temperature.lineEdit().selectAll()
    QTest.keyClicks(box.temperature, "12345,5")            # no group separator the box does not write either
    QTest.keyClick(box.temperature, Qt.Key.Key_Return)
    assert box.range_note.text() == "✗ 12345,5 is outside 0–2; it stays 0,7"
    box.temperature.lineEdit().selectAll()
    QTest.keyClicks(box.temperature, "1.5")
    QTest.keyClick(box.temperature, Qt.Key.Key_Return)
    assert box.temperature.value() == 1.5 and box.temperature.text() == "1,50"
    box.hide()


def test_the_pool_slider_forgets_the_engines_size_once_moved(qapp):
    # moved off the engine's exact size and back onto that step, it sends the step's size, whether or not
    # a state refresh came in between (it used to send the old exact size again when none had)
    from app.knobs import PoolSlider, pool_text
    pool = PoolSlider()
    held = (8 << 20) + (300 << 10)                    # between two of the slider's 1 MiB steps
    pool.set_bounds(100 << 20, held)
    sent: list[int] = []
    pool.released.connect(sent.append)
    at, step = pool.slider.value(), pool._step_bytes
    assert pool.bytes() == held and held % step and pool.label.text() == pool_text(held)
    pool.slider.setValue(at + 1)
    pool.slider.setValue(at)
    assert sent == [(at + 1) * step, at * step] and pool.label.text() == pool_text(at * step)
