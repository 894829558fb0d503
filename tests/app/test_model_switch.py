"""Opening another model folder: the working model runs until the new one is ready, and a folder that
fails to load leaves it in place (or, when it had to close first, brings it back)."""
from __future__ import annotations

import os

import pytest
from PySide6.QtCore import QSettings

from app.bridge import EngineBridge, open_engine
from app.conversations import ConversationStore
from app.gpu_poller import FakeMonitor, GpuPoller, GpuSample
from app.main_window import MainWindow
from app.messages import GenerationSettings
from app.model_loader import must_unload_first
from app.paths import default_model_dir
from tests.app.conftest import ENGINE_OPTIONS, LOAD_TIMEOUT_MS, REPLY_TIMEOUT_MS

TIMEOUT = 30_000
DEMO = str(default_model_dir())


def _broken_config(tmp_path):
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "qwen3_moe", "num_hidden_layers": ')   # cut short
    return folder


def _fail_to_open(qtbot, w, folder, running: bool = True) -> str:
    """Open ``folder`` (which cannot load); returns the load banner once the failure is shown.
    ``running``: a model runs, and keeps running meanwhile."""
    with qtbot.waitSignal(w.bridge.model_loading, timeout=TIMEOUT) as loading:
        # the window's own signal, once its banner shows this failure (the bridge's error reaches the
        # window queued, so a banner read on it could still be the last failure's)
        with qtbot.waitSignal(w.load_failed, timeout=LOAD_TIMEOUT_MS) as failed:
            w.open_model(str(folder))
    assert loading.args == [str(folder), running]        # the current model keeps running meanwhile
    assert w.banners.level("load") == "red" and w.banners.text("load") == failed.args[0]
    return w.banners.text("load")


def _still_serving(qtbot, w, knobs_before) -> None:
    """The demo is the loaded model, Send works and a reply arrives, knobs show its state."""
    assert w.model is not None and w.model.path == DEMO
    assert w.status_model.text() == f"{w.model.name} on cpu"
    assert w.chat_pane.send_button.isEnabled()
    assert w.knobs.isEnabled() and w.knobs.state.values == knobs_before.values
    w.chat_pane.settings_box.set_settings(GenerationSettings(max_tokens=6))
    with qtbot.waitSignal(w.chat.reply_done, timeout=REPLY_TIMEOUT_MS) as done:
        w.chat.send("And God said")
    assert done.args[0].completion_tokens > 0 and done.args[0].error is None


def test_a_folder_that_fails_to_load_leaves_the_working_model(window, qtbot, tmp_path):
    w = window
    c = w.knobs.controls
    with qtbot.waitSignal(w.knobs.result_shown, timeout=TIMEOUT):
        c["prefill_chunk"].setValue(128)                  # a live change the failed load must not undo
    qtbot.waitUntil(lambda: w.knobs.state.value("prefill_chunk") == 128, timeout=TIMEOUT)
    before = w.knobs.state

    text = _fail_to_open(qtbot, w, tmp_path / "no-such-model")
    assert "does not exist" in text and "is still loaded" in text
    assert "--model" not in text and "File › Open model folder…" in text     # a fix that works in the window
    _still_serving(qtbot, w, before)
    assert w.knobs.controls["prefill_chunk"].value() == 128

    text = _fail_to_open(qtbot, w, _broken_config(tmp_path))
    assert "config.json" in text and "is still loaded" in text
    _still_serving(qtbot, w, before)

    llama = tmp_path / "llama"
    llama.mkdir()
    (llama / "config.json").write_text('{"architectures": ["LlamaForCausalLM"], "model_type": "llama"}')
    text = _fail_to_open(qtbot, w, llama)
    assert text.count(str(llama)) == 1, "the folder is named once"
    assert "'LlamaForCausalLM' is not supported; open a Mixture-of-Experts checkpoint" in text
    _still_serving(qtbot, w, before)


def test_while_loading_the_window_says_the_current_model_keeps_running(window, qtbot):
    with qtbot.waitSignal(window.model_ready, timeout=LOAD_TIMEOUT_MS):
        window.open_model(DEMO)
        qtbot.waitUntil(lambda: window.banners.level("load") == "info", timeout=TIMEOUT)
        assert "(the current model keeps running)" in window.status_model.text()
        assert "Loading demo…" in window.banners.text("load")
        assert window.chat_pane.send_button.isEnabled()
    assert window.banners.text("load") == ""


def test_a_new_model_clears_the_knob_status_lines(window, qtbot):
    with qtbot.waitSignal(window.knobs.result_shown, timeout=TIMEOUT):
        window.knobs.controls["max_batch_tokens"].setValue(8)          # below max_batch: refused
    status = window.knobs.status["max_batch_tokens"]
    assert status.text().startswith("✗ rejected")
    with qtbot.waitSignal(window.model_ready, timeout=LOAD_TIMEOUT_MS):
        window.open_model(DEMO)
    assert status.text() == "" and status.toolTip() == ""              # it spoke of the previous model
    qtbot.waitUntil(lambda: window.knobs.state is not None, timeout=TIMEOUT)
    lines = [label.text() for label in window.knobs.status.values()]
    assert not any(t.startswith(("✓", "✗", "applying")) for t in lines), lines


def _window_unloading_first(qtbot, tmp_path, load: bool = True, fallback: str | None = None) -> MainWindow:
    """A window whose bridge closes the running model before every load (as one GPU has to), with
    the demo loaded unless ``load`` is false (``fallback``: the bridge's model for a failed load)."""
    settings = QSettings(str(tmp_path / "strata.ini"), QSettings.Format.IniFormat)
    bridge = EngineBridge(open_engine, unload_first=lambda _device, _options, _running: True, fallback=fallback)
    poller = GpuPoller(FakeMonitor(GpuSample(timestamp=0.0, status="Fake GPU")), interval_ms=30)
    w = MainWindow(bridge, poller, settings, ConversationStore(tmp_path / "conversations"),
                   engine_options=ENGINE_OPTIONS)
    qtbot.addWidget(w)
    bridge.start()
    poller.start()
    w.show()
    if not load:
        return w
    with qtbot.waitSignal(w.model_ready, timeout=LOAD_TIMEOUT_MS):
        w.open_model(DEMO)
    qtbot.waitUntil(lambda: w.knobs.state is not None, timeout=LOAD_TIMEOUT_MS)
    return w


def test_a_failed_load_after_unloading_brings_the_previous_model_back(qtbot, tmp_path, themed):
    w = _window_unloading_first(qtbot, tmp_path)
    try:
        before, previous = w.knobs.state, w.model
        # recorded from before the load: the reopened model can be ready in the same pass of the event loop
        # that delivers model_loading, before a wait started after it would listen
        # (both recorded by plain slots and awaited by polling: a wait on the signal itself was seen to
        # outlast its own timeout under a loaded machine)
        ready: list = []
        loading: list = []
        w.model_ready.connect(ready.append)
        w.bridge.model_loading.connect(lambda *args: loading.append(args))
        w.open_model(str(_broken_config(tmp_path)))
        qtbot.waitUntil(lambda: len(loading) >= 1, timeout=TIMEOUT)
        assert loading[0][1] is False                        # it had to close: Send waits meanwhile
        qtbot.waitUntil(lambda: len(ready) == 1, timeout=LOAD_TIMEOUT_MS)
        assert ready[0].path == previous.path                # the previous model, opened again
        qtbot.waitUntil(lambda: w.banners.level("load") == "red", timeout=TIMEOUT)
        text = w.banners.text("load")
        assert "config.json" in text and text.endswith(f"{w.model.name} was opened again")
        qtbot.waitUntil(lambda: w.knobs.state is not None and w.knobs.state.values == before.values, timeout=TIMEOUT)
        _still_serving(qtbot, w, before)
    finally:
        w.close()


def test_a_failed_load_with_no_model_says_why_once(qtbot, tmp_path, themed):
    # the reason is in the red banner; the chat's model line says what state the window is in and
    # what to do, without repeating the reason
    w = _window_unloading_first(qtbot, tmp_path, load=False)
    try:
        text = _fail_to_open(qtbot, w, _broken_config(tmp_path), running=False)
        assert "config.json" in text
        line = w.chat_pane.model_line.text()
        assert line.startswith("No model loaded") and "config.json" not in line and "Open model folder" in line
        assert w.status_model.text() == "No model loaded" and not w.chat_pane.send_button.isEnabled()
        # no placeholder values in the knobs: a line says a model's settings show once one is open
        assert w.knobs.no_model.isVisibleTo(w.knobs) and not w.knobs.engine_box.isVisibleTo(w.knobs)
        with qtbot.waitSignal(w.model_ready, timeout=LOAD_TIMEOUT_MS):
            w.open_model(DEMO)
        qtbot.waitUntil(lambda: w.knobs.state is not None, timeout=TIMEOUT)
        assert w.knobs.engine_box.isVisibleTo(w.knobs) and not w.knobs.no_model.isVisibleTo(w.knobs)
    finally:
        w.close()


def test_a_failed_load_with_no_model_opens_the_fallback_instead(qtbot, tmp_path, themed):
    # At start, a last-used folder that broke since (or a wrong --model) leaves no model running: the
    # bundled demo opens instead, and the banner says why and what was opened.
    w = _window_unloading_first(qtbot, tmp_path, load=False, fallback=DEMO)
    try:
        ready: list = []
        w.model_ready.connect(ready.append)
        w.open_model(str(_broken_config(tmp_path)))
        qtbot.waitUntil(lambda: len(ready) == 1, timeout=LOAD_TIMEOUT_MS)
        assert ready[0].path == w.model.path and w.chat_pane.send_button.isEnabled()
        qtbot.waitUntil(lambda: w.banners.level("load") == "red", timeout=TIMEOUT)
        text = w.banners.text("load")
        assert "config.json" in text and text.endswith(f"{w.model.name} was opened instead")
    finally:
        w.close()


def test_closing_while_a_model_loads_stops_cleanly(window, qtbot):
    with qtbot.waitSignal(window.bridge.stopped, timeout=LOAD_TIMEOUT_MS):
        window.open_model(DEMO)
        window.close()                    # the loader thread is joined and the engine it built closed


@pytest.mark.parametrize("running, options, closes_first", [
    ("cpu", {"device": "auto"}, False),            # host memory: both are held for the moment of the switch
    ("cpu", {"device": "cuda"}, False),
    ("cuda", {"device": "auto"}, True),            # one card: the new plan needs what the old one holds
    ("cuda:0", {}, True),
    ("cuda", {"device": "cuda:0"}, True),
    ("cuda:0", {"device": "cpu"}, False),          # the new model goes elsewhere
    ("cuda:0", {"device": "cuda:1"}, False),
])
def test_which_loads_close_the_running_model_first(running, options, closes_first):
    assert must_unload_first(running, options) is closes_first


@pytest.mark.parametrize("running, options, running_options", [
    # a model over several GPUs holds the process's one process group and GPUs 0..N-1
    ("cpu", {"device": "cpu", "pipeline_parallel": 2}, None),
    ("cpu", {"device": "cpu", "expert_parallel": 3}, {}),
    ("cpu", {"device": "cpu"}, {"pipeline_parallel": 2}),
    ("cuda:0", {"device": "cuda:1"}, {"device": "cuda", "expert_parallel": 2}),
])
def test_a_model_over_several_gpus_is_closed_before_the_next_load(running, options, running_options):
    assert must_unload_first(running, options, running_options) is True
    assert must_unload_first(running, {**options, "pipeline_parallel": 1, "expert_parallel": 1}, {}) is False


def _stage_processes() -> set[int]:
    """This process's children that run a pipeline stage."""
    out = set()
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{d}/stat") as f:
                parent = f.read().rsplit(")", 1)[1].split()[1]
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if parent == str(os.getpid()) and b"engine.parallel.worker" in cmd:
            out.add(int(d))
    return out


def test_switching_between_pipelines_closes_the_running_one_first(window_factory, qtbot):
    """Two pipelines cannot share the process: the second load waits for the first to close, then runs."""
    w = window_factory(options={**ENGINE_OPTIONS, "pipeline_parallel": 2})
    first = _stage_processes()
    assert len(first) == 1
    errors: list = []
    w.bridge.error.connect(errors.append)
    with qtbot.waitSignal(w.bridge.model_loading, timeout=TIMEOUT) as loading:
        with qtbot.waitSignal(w.model_ready, timeout=LOAD_TIMEOUT_MS):
            w.open_model(DEMO)
    assert loading.args == [DEMO, False]                 # closed first: Send waits meanwhile
    assert errors == []
    now = _stage_processes()
    assert len(now) == 1 and not (now & first)
    w.chat_pane.settings_box.set_settings(GenerationSettings(max_tokens=6))
    with qtbot.waitSignal(w.chat.reply_done, timeout=REPLY_TIMEOUT_MS) as done:
        w.chat.send("And God said")                      # the new pipeline serves
    assert done.args[0].completion_tokens > 0 and done.args[0].error is None


def test_a_single_device_load_after_a_pipeline_closes_the_pipeline_first(window_factory, qtbot):
    """The running model's own options count: a pipeline closes before a load on one device starts."""
    w = window_factory(options={**ENGINE_OPTIONS, "pipeline_parallel": 2})
    first = _stage_processes()
    assert len(first) == 1
    w.engine_options = dict(ENGINE_OPTIONS)               # the next load: one device, no pipeline
    with qtbot.waitSignal(w.bridge.model_loading, timeout=TIMEOUT) as loading:
        with qtbot.waitSignal(w.model_ready, timeout=LOAD_TIMEOUT_MS):
            w.open_model(DEMO)
    assert loading.args == [DEMO, False]                 # closed first: Send waits meanwhile
    assert _stage_processes() == set()                   # the pipeline's stage is gone
    w.chat_pane.settings_box.set_settings(GenerationSettings(max_tokens=6))
    with qtbot.waitSignal(w.chat.reply_done, timeout=REPLY_TIMEOUT_MS) as done:
        w.chat.send("And God said")
    assert done.args[0].completion_tokens > 0 and done.args[0].error is None


def test_load_notes_show_as_banners_in_the_workbench_words(window_factory):
    w = window_factory(options={**ENGINE_OPTIONS, "gpu_memory_budget": "24G", "max_model_len": 1 << 20})
    notes = w.model.notes
    assert any("GPU memory budget" in n for n in notes) and any("context length" in n for n in notes)
    shown = [w.banners.text(f"note{i}") for i in range(len(notes))]
    assert shown == [n[:1].upper() + n[1:] for n in notes] and all(s[:1].isupper() for s in shown)   # sentences
    assert all(w.banners.level(f"note{i}") == "amber" for i in range(len(notes)))
    assert w.model.context_tokens < 1 << 20           # clamped to the model's own context
    assert not any("--" in n.split("(start Strata with")[0] for n in notes)


def test_each_request_reports_its_share_of_the_context(window, qtbot):
    window.chat_pane.settings_box.set_settings(GenerationSettings(max_tokens=4))
    with qtbot.waitSignal(window.bridge.context, timeout=TIMEOUT) as got:
        with qtbot.waitSignal(window.chat.reply_done, timeout=REPLY_TIMEOUT_MS):
            window.chat.send("In the beginning")
    usage = got.args[0]
    assert usage.request_id.startswith("chat-") and usage.prompt_tokens > 0
    assert usage.context_tokens == window.model.context_tokens > usage.prompt_tokens
    assert usage.reply_tokens == 4 and usage.dropped_messages == 0 and usage.note == ""


def test_a_load_refused_for_an_option_names_the_flag_that_set_it(qtbot, tmp_path, themed):
    # The window's options are the flags Strata was started with: the banner names the flag as typed,
    # never the engine's internal name for it (max_batch), and the window says no model is loaded.
    w = _window_unloading_first(qtbot, tmp_path, load=False)
    try:
        for option, value, flag, words in (("max_batch", 0, "--max-batch", "the batch size"),
                                           ("cpu_threads", 0, "--cpu-threads", "the CPU thread count")):
            w.engine_options = {**ENGINE_OPTIONS, option: value}
            text = _fail_to_open(qtbot, w, DEMO, running=False)
            assert text == (f"Could not open {DEMO}: {words} must be an integer >= 1 (got 0) "
                            f"(start Strata with {flag} N)")
            assert w.load_error == text and w.status_model.text() == "No model loaded"
    finally:
        w.close()
