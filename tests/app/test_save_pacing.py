"""The pace of the saves of a streaming reply and of unsent text: the first change after a quiet spell is
saved at once (a crash in the first second keeps it), later ones together when a save is due, never one
write per change. The timer's expiry is played by the test, so no case depends on the clock."""
from __future__ import annotations

import pytest

from app.save_pacing import SavePacer


def _pacer(saved: list[str], state: list[str]) -> SavePacer:
    pacer = SavePacer(None, 150, 1000)
    pacer.save_due.connect(lambda: saved.append("".join(state)))
    return pacer


def _expire(pacer: SavePacer) -> None:
    """The single-shot timer runs out."""
    pacer.timer.stop()
    pacer.timer.timeout.emit()


def _change(pacer: SavePacer, state: list[str], text: str) -> None:
    state.append(text)
    pacer.changed()


def test_the_first_change_is_saved_at_once_and_the_next_ones_together_when_due(qapp):
    saved, state = [], []
    pacer = _pacer(saved, state)
    _change(pacer, state, "a")
    assert saved == ["a"], "the first change after a quiet spell is not kept waiting"
    for text in "bcdef":
        _change(pacer, state, text)
    assert saved == ["a"], "changes while a save is due wait for it: no write per change"
    _expire(pacer)                                           # the short first wait
    assert saved == ["a", "abcdef"] and pacer.timer.interval() == 1000
    _change(pacer, state, "g")
    _change(pacer, state, "h")
    _expire(pacer)
    assert saved == ["a", "abcdef", "abcdefgh"]
    _expire(pacer)                                           # nothing changed since: it goes quiet
    assert not pacer.timer.isActive()
    _change(pacer, state, "i")
    assert saved[-1] == "abcdefghi", "after a quiet spell the next change is saved at once again"


def test_a_quiet_first_wait_still_leaves_a_steady_period_before_the_next_save_at_once(qapp):
    # slow typing (a key every few hundred ms) is saved about once a second, not once a keystroke
    saved, state = [], []
    pacer = _pacer(saved, state)
    _change(pacer, state, "a")
    _expire(pacer)                                           # nothing new during the first wait
    assert pacer.timer.isActive() and pacer.timer.interval() == 1000 - 150
    _change(pacer, state, "b")
    assert saved == ["a"]
    _expire(pacer)
    assert saved == ["a", "ab"]


def test_flush_saves_a_waiting_change_and_stop_drops_it(qapp):
    saved, state = [], []
    pacer = _pacer(saved, state)
    _change(pacer, state, "a")
    _change(pacer, state, "b")
    pacer.flush()
    assert saved == ["a", "ab"] and not pacer.timer.isActive()
    pacer.flush()
    assert saved == ["a", "ab"], "nothing waiting: nothing written"
    _change(pacer, state, "c")
    _change(pacer, state, "d")
    pacer.stop()
    _expire(pacer)
    assert saved == ["a", "ab", "abc"] and not pacer.pending


def test_a_pace_whose_first_wait_exceeds_the_steady_one_is_refused(qapp):
    with pytest.raises(ValueError, match="first_ms <= steady_ms"):
        SavePacer(None, 2000, 1000)
