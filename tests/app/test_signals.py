"""Ctrl+C in the terminal that started the workbench, or a SIGTERM, closes it as its close button does:
the window's layout is saved, the chat is kept and the process exits with code 0."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_closes_the_workbench_and_keeps_what_it_showed(tmp_path, sig):
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", HOME=str(tmp_path), XDG_CONFIG_HOME=str(tmp_path / "config"),
               XDG_DATA_HOME=str(tmp_path / "data"))
    proc = subprocess.Popen([sys.executable, str(ROOT / "main.py"), "--prompt", "Hello"], cwd=str(ROOT), env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    chats = tmp_path / "data" / "strata" / "conversations"
    try:
        deadline = time.monotonic() + 240           # the demo model loads and the prompt's chat is written
        while not any(chats.glob("*.json")) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert proc.poll() is None, proc.communicate()
        assert any(chats.glob("*.json")), "the window never wrote its chat"
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    config = "\n".join(p.read_text(errors="replace") for p in (tmp_path / "config").rglob("*.conf"))
    assert "geometry" in config                          # closeEvent ran: the layout was saved
    assert any("Hello" in p.read_text() for p in chats.glob("*.json"))
