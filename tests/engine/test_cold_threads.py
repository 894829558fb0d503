"""torch's own CPU threads while engines compute experts on the host (engine/experts/cold.py)."""
from __future__ import annotations

import torch

from engine.experts import cold


def test_torch_threads_come_back_when_the_last_engine_that_took_them_closes(monkeypatch) -> None:
    count = [6]
    monkeypatch.setattr(torch, "get_num_threads", lambda: count[0])
    monkeypatch.setattr(torch, "set_num_threads", lambda n: count.__setitem__(0, n))
    monkeypatch.setattr(cold, "_torch_threads", {"users": 0, "before": 0})
    cold._torch_threads_taken()             # one engine
    assert count[0] == 1
    cold._torch_threads_taken()             # a second, loaded beside it
    cold._torch_threads_given_back()        # the first closes: the second still computes
    assert count[0] == 1
    cold._torch_threads_given_back()
    assert count[0] == 6
