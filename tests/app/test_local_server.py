"""The workbench's "Local server" switch: a real HTTP server on the engine the window runs, on 127.0.0.1.

Requests come from the official ``openai`` client and from httpx on worker threads (the GUI thread keeps
its event loop running meanwhile, as it does for a tool the user points at the server).
"""
from __future__ import annotations

import socket
from concurrent.futures import Future, ThreadPoolExecutor

import httpx
import openai
import pytest
from PySide6.QtCore import QSettings
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QInputDialog

from app.load_test import HTTP, HTTP_OFF_TIP
from app.local_server import DEFAULT_PORT, ServerPrefs, refusal_line
from app.paths import default_model_dir
from tests.app.conftest import LOAD_TIMEOUT_MS, REPLY_TIMEOUT_MS
from tests.app.received import Received

TIMEOUT = 30_000
DEMO = str(default_model_dir())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _serve(window, qtbot, port: int | None = None) -> str:
    """Turn the switch on (on a free port unless ``port``); the URL it shows."""
    window.server.set_port(port or _free_port())
    with qtbot.waitSignal(window.server.server.started, timeout=TIMEOUT) as started:
        window.server.set_on(True)
    return started.args[0]


def _in_thread(fn) -> Future:
    pool = ThreadPoolExecutor(1)
    fut = pool.submit(fn)
    pool.shutdown(wait=False)
    return fut


def _complete(url: str, max_tokens: int):
    client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=60)
    return client.completions.create(model=client.models.list().data[0].id, prompt="In the beginning",
                                     max_tokens=max_tokens, temperature=0.0, extra_body={"ignore_eos": True})


def test_the_switch_serves_the_loaded_engine_and_the_window_sees_its_traffic(window, qtbot):
    port = _free_port()
    url = _serve(window, qtbot, port)
    assert url == f"http://127.0.0.1:{port}/v1" and window.server.action.isChecked()
    status = window.server.status
    assert status.isVisible() and status.url_label.text() == f"Server {url}"
    status.copy_button.click()
    assert QGuiApplication.clipboard().text() == url
    stats = Received(window.bridge.stats)
    finished = stats.wait(qtbot).requests_finished
    answer = _in_thread(lambda: _complete(url, 24))
    for _ in range(3):          # the GUI thread runs and the bridge keeps reporting while the tool waits
        stats.wait_new(qtbot)
    qtbot.waitUntil(answer.done, timeout=REPLY_TIMEOUT_MS)
    reply = answer.result()
    assert reply.choices[0].text and reply.usage.completion_tokens == 24
    assert reply.model == window.model.name
    # the panels' stats are the engine's: they count the request the tool sent
    stats.wait(qtbot, lambda s: s.requests_finished > finished)


def test_knobs_changed_over_http_show_in_the_knobs_panel(window, qtbot):
    # another front end (a tool on the local server) changes the running engine: the panel follows, and
    # a pool size past the slider's range leaves it at its end rather than failing its refresh
    url = _serve(window, qtbot, _free_port())
    base = url[:-len("/v1")]
    answer = _in_thread(lambda: httpx.post(base + "/v1/strata/config", json={"prefetch_depth": 1, "max_batch": 4},
                                           timeout=30))
    qtbot.waitUntil(answer.done, timeout=REPLY_TIMEOUT_MS)
    assert answer.result().status_code == 200, answer.result().text
    qtbot.waitUntil(lambda: window.knobs.state.value("max_batch") == 4, timeout=REPLY_TIMEOUT_MS)
    assert window.knobs.controls["max_batch"].value() == 4 and window.knobs.controls["prefetch_depth"].value() == 1
    assert window.knobs.controls["prefetch_depth"].suffix() == " layer"          # units follow the values shown
    assert window.knobs.controls["max_batch"].suffix().endswith("s")
    answer = _in_thread(lambda: httpx.post(base + "/v1/strata/config", json={"expert_pool_size": 10 ** 15},
                                           timeout=30))
    qtbot.waitUntil(answer.done, timeout=REPLY_TIMEOUT_MS)
    assert answer.result().status_code == 200, answer.result().text
    qtbot.waitUntil(lambda: window.knobs.state.value("expert_pool_size") == 10 ** 15, timeout=REPLY_TIMEOUT_MS)
    slider = window.knobs.controls["expert_pool_size"].slider
    assert slider.value() == slider.maximum() < 2 ** 31


def test_the_status_bar_counts_the_http_requests_in_flight(window, qtbot):
    url = _serve(window, qtbot)
    label = window.server.status.in_flight_label
    assert label.text() == "· 0 in flight"
    window.bridge.pause("hold the request in the engine")    # queued before the request: it waits
    answer = _in_thread(lambda: _complete(url, 4))
    qtbot.waitUntil(lambda: label.text() == "· 1 in flight", timeout=TIMEOUT)
    window.bridge.resume("let it finish")
    qtbot.waitUntil(answer.done, timeout=REPLY_TIMEOUT_MS)
    assert answer.result().usage.completion_tokens == 4
    qtbot.waitUntil(lambda: label.text() == "· 0 in flight", timeout=TIMEOUT)


def test_a_port_in_use_is_one_banner_and_the_switch_turns_back_off(window, qtbot):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        window.server.set_port(port)
        with qtbot.waitSignal(window.server.server.failed, timeout=TIMEOUT):
            window.server.set_on(True)
        text = window.banners.text("server")
        assert window.banners.level("server") == "red" and "\n" not in text
        assert f"port {port}" in text and "Server › Server port…" in text and "--" not in text
        assert not window.server.action.isChecked() and window.server.action.isEnabled()
        assert not window.server.status.isVisible() and window.server.url is None
    # another port works, and the banner goes
    url = _serve(window, qtbot)
    assert window.banners.text("server") == "" and url.startswith("http://127.0.0.1:")


def test_closing_the_window_stops_the_server_and_frees_its_port(window_factory, qtbot):
    w = window_factory()
    port = _free_port()
    url = _serve(w, qtbot, port)
    assert not _port_is_free(port)
    w.close()
    assert _port_is_free(port)
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/models", trust_env=False, timeout=5)


def test_turning_the_switch_off_stops_the_server(window, qtbot):
    port = _free_port()
    _serve(window, qtbot, port)
    with qtbot.waitSignal(window.server.server.stopped, timeout=TIMEOUT):
        window.server.set_on(False)
    assert _port_is_free(port) and not window.server.status.isVisible() and window.server.url is None


def test_a_model_switch_keeps_the_server_serving_the_new_model(window, qtbot):
    url = _serve(window, qtbot)
    with qtbot.waitSignal(window.model_ready, timeout=LOAD_TIMEOUT_MS):
        window.open_model(DEMO)
    assert window.server.action.isChecked() and window.server.url == url
    answer = _in_thread(lambda: _complete(url, 5))
    qtbot.waitUntil(answer.done, timeout=REPLY_TIMEOUT_MS)
    assert answer.result().usage.completion_tokens == 5


def test_the_port_is_remembered_and_a_running_server_moves_to_a_new_one(window, qtbot, tmp_path, monkeypatch):
    first = _free_port()
    _serve(window, qtbot, first)
    second = _free_port()
    monkeypatch.setattr(QInputDialog, "getInt", lambda *_args, **_kw: (second, True))
    with qtbot.waitSignal(window.server.server.started, timeout=TIMEOUT) as moved:
        window.server.port_action.trigger()
    assert moved.args[0] == f"http://127.0.0.1:{second}/v1" and _port_is_free(first)
    assert window.server.port_action.text() == f"Server &port… ({second})"
    assert ServerPrefs(window.settings).port() == second       # the next start uses it
    assert window.server.status.url_label.text() == f"Server http://127.0.0.1:{second}/v1"


def test_an_unreadable_or_unusable_saved_port_reads_as_the_default(tmp_path):
    settings = QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat)
    prefs = ServerPrefs(settings)
    assert prefs.port() == DEFAULT_PORT == 8000
    for raw in ("eighty", "80", "70000", ""):
        settings.setValue(ServerPrefs.KEY, raw)
        assert prefs.port() == DEFAULT_PORT, raw
    prefs.set_port(8123)
    assert ServerPrefs(QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat)).port() == 8123


def test_a_refusal_keeps_the_cause_names_the_port_and_gives_the_fix_in_the_window():
    fix = "; choose another port with Server › Server port… and turn Server › Local server (OpenAI API) on again."
    line = refusal_line(8000, "port 8000 on 127.0.0.1 is in use by another program; pick another with --port N")
    assert line == "The local server could not start: port 8000 on 127.0.0.1 is in use by another program" + fix
    line = refusal_line(8001, "the HTTP server did not start (timed out); see the log for the cause")
    assert line == "The local server could not start on port 8001: the HTTP server did not start (timed out)" + fix


def test_the_load_test_goes_through_http_only_while_the_server_is_on(window, qtbot):
    window.open_load_test()
    dialog = window.load_test
    assert not dialog.send_through.isEnabled() and dialog.send_through.toolTip() == HTTP_OFF_TIP
    url = _serve(window, qtbot)
    assert dialog.send_through.isEnabled()
    dialog.send_through.setCurrentText(HTTP)
    dialog.streams.setValue(3)
    dialog.prompt_len.setValue(16)
    dialog.output_len.setValue(12)
    with qtbot.waitSignal(dialog.finished_test, timeout=REPLY_TIMEOUT_MS) as done:
        dialog.start_button.click()
        assert dialog.summary.text() == f"Running 3 streams through {url}…"
    summary = done.args[0]
    assert summary.streams == 3 and summary.total_tokens == 36     # EOS ignored: exactly 12 each
    assert summary.aggregate_tok_s > 0 and summary.per_stream_tok_s > 0
    assert [dialog.table.item(i, 1).text() for i in range(3)] == ["reached max tokens"] * 3
    assert [dialog.table.item(i, 2).text() for i in range(3)] == ["12", "12", "12"]
    assert "aggregate" in dialog.summary.text()
    # the server goes off: the choice goes back to the engine, and is disabled again
    with qtbot.waitSignal(window.server.server.stopped, timeout=TIMEOUT):
        window.server.set_on(False)
    assert dialog.send_through.currentText() != HTTP and not dialog.send_through.isEnabled()


def _two_streams_held(window, qtbot, why: str):
    """The load test's dialog, set to send two long streams through the local server, with the engine
    paused (``why``) so that they stay in flight."""
    _serve(window, qtbot)
    window.open_load_test()
    dialog = window.load_test
    dialog.send_through.setCurrentText(HTTP)
    dialog.streams.setValue(2)
    dialog.output_len.setValue(window.model.context_tokens // 2)
    window.bridge.pause(why)
    return dialog


def test_stopping_a_load_test_through_http_ends_every_stream(window, qtbot):
    dialog = _two_streams_held(window, qtbot, "the streams cannot finish before Stop")
    with qtbot.waitSignal(dialog.finished_test, timeout=REPLY_TIMEOUT_MS) as done:
        dialog.start_button.click()
        qtbot.waitUntil(lambda: window.server.server.in_flight == 2, timeout=TIMEOUT)
        dialog.stop_button.click()
    assert done.args[0].streams == 2
    assert [dialog.table.item(i, 1).text() for i in range(2)] == ["stopped by you"] * 2
    window.bridge.resume("go")
    # the server ended both requests when their clients went: the engine holds none
    qtbot.waitUntil(lambda: window.bridge.engine_loop.call(lambda e: e.has_unfinished()).result(10) is False,
                    timeout=TIMEOUT)


def test_turning_the_server_off_under_an_http_load_test_says_the_server_ended_the_streams(window, qtbot):
    dialog = _two_streams_held(window, qtbot, "the streams cannot finish before the server's grace is over")
    with qtbot.waitSignal(dialog.finished_test, timeout=REPLY_TIMEOUT_MS):
        dialog.start_button.click()
        qtbot.waitUntil(lambda: window.server.server.in_flight == 2, timeout=TIMEOUT)
        window.server.set_on(False)
        assert window.server.status.url_label.text().startswith("Server stopping")    # not still "on"
    window.bridge.resume("go")
    rows = [dialog.table.item(i, 1).text() + " " + dialog.table.item(i, 1).toolTip() for i in range(2)]
    assert not any("stopped by you" in r for r in rows), rows
    # the server's abort arrives as the stream's last chunk, or (a loaded machine) the connection goes first
    assert all("the server ended the stream" in r or "ended before its last chunk" in r for r in rows), rows
