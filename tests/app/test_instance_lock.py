"""One workbench per folder of chats: a second one is refused with one line naming the first (two would
write over each other's messages), and the lock of a process that died is taken over."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from app.launch import instance_lock

ROOT = Path(__file__).resolve().parents[2]
HOLD = ("import sys, time; sys.path.insert(0, sys.argv[2]); from pathlib import Path; "
        "from app.launch import instance_lock; lock = instance_lock(Path(sys.argv[1])); "
        "print('held' if not isinstance(lock, str) else 'refused', flush=True); time.sleep(60)")


def test_a_second_workbench_on_the_same_chats_is_refused_and_a_dead_ones_lock_is_taken_over(tmp_path):
    first = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path), str(ROOT)], stdout=subprocess.PIPE, text=True)
    try:
        assert first.stdout.readline().strip() == "held"
        refused = instance_lock(tmp_path)
        assert isinstance(refused, str) and f"process {first.pid}" in refused
        assert "two windows would overwrite each other's messages" in refused
    finally:
        first.kill()
        first.wait()
    deadline = time.monotonic() + 10
    taken = instance_lock(tmp_path)
    while isinstance(taken, str) and time.monotonic() < deadline:    # the dead process's lock is stale
        time.sleep(0.1)
        taken = instance_lock(tmp_path)
    assert not isinstance(taken, str) and taken.isLocked()
    taken.unlock()


def test_a_folder_where_no_lock_can_be_made_does_not_stop_the_workbench(tmp_path):
    (tmp_path / "workbench.lock").mkdir()          # the lock file cannot be written: not "already open"
    assert not isinstance(instance_lock(tmp_path), str)


def test_a_dead_ones_lock_that_qt_cannot_take_over_is_removed_and_taken(tmp_path):
    # On a full disk Qt cannot write the file it takes a stale lock over with: a lock whose process is
    # gone is then removed here (which needs no room) rather than read as "Strata is already open".
    first = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path), str(ROOT)], stdout=subprocess.PIPE, text=True)
    assert first.stdout.readline().strip() == "held"
    first.kill()
    first.wait()
    (tmp_path / "workbench.lock.rmlock").mkdir()    # Qt's takeover file cannot be made, as on a full disk
    taken = instance_lock(tmp_path)
    assert not isinstance(taken, str) and taken.isLocked()
    taken.unlock()
