"""A kill (SIGKILL, a power cut) just after a reply began keeps what was on screen: the reply's text so far,
marked interrupted, and the text the user was typing meanwhile. The window runs in a child process
(kill_mid_reply) that is killed for real; a fresh chat over the same folder and settings then reopens."""
from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from app.chat_controller import INTERRUPTED_NOTE
from tests.app.chat_fakes import make_chat
from tests.app.kill_mid_reply import DRAFT, FIRST_TEXT, QUESTION

ROOT = Path(__file__).resolve().parents[2]


def _wait_for_ready(proc: subprocess.Popen, timeout_s: float) -> str:
    """The child's first line (empty if it ended or said nothing in ``timeout_s``)."""
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        return proc.stdout.readline().strip() if sel.select(timeout_s) else ""


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_a_kill_just_after_a_reply_began_keeps_its_first_text_and_the_unsent_text(qtbot, tmp_path):
    folder, ini = tmp_path / "conversations", tmp_path / "strata.ini"
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", HOME=str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-m", "tests.app.kill_mid_reply", str(folder), str(ini)],
                            cwd=str(ROOT), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready = _wait_for_ready(proc, 120)
        if ready != "READY":
            proc.kill()
            pytest.fail(f"the child never got to the reply: {proc.communicate()[1]}")
        proc.send_signal(signal.SIGKILL)                  # mid-reply: no close, no timer runs again
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == -signal.SIGKILL

    again = make_chat(qtbot, folder, settings_file=ini)
    assert [m.content for m in again.current.messages] == [QUESTION, FIRST_TEXT]
    reply = again.pane.view.bubbles[-1]
    assert reply.text == FIRST_TEXT and INTERRUPTED_NOTE in reply.stats.text()
    assert again.pane.input.toPlainText() == DRAFT
