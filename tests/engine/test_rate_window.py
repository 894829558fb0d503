"""Tokens per second over a sliding window, as the Throughput panel plots them."""
from __future__ import annotations

import pytest

from engine.stats import Counters
from engine.telemetry import RateWindow


def test_the_first_step_after_idle_counts_over_its_own_time():
    # one token sampled in a 9 ms step, read at once: 111 tok/s, not one token over a millisecond
    w = RateWindow(2.0)
    w.add(1, now=100.0, took=0.009)
    assert w.rate(now=100.0) == pytest.approx(1 / 0.009)


def test_steady_steps_give_their_rate_and_an_idle_window_falls_to_zero():
    w = RateWindow(2.0)
    for i in range(1, 101):                                   # 100 steps of 10 ms, one token each
        w.add(1, now=i * 0.01, took=0.01)
    assert w.rate(now=1.0) == pytest.approx(100.0)
    assert w.rate(now=1.5) == pytest.approx(100 / 1.5)        # idle since: the rate falls
    assert w.rate(now=3.5) == 0.0                             # every event out of the window


def test_a_step_longer_than_the_window_counts_until_its_end_leaves_it():
    # a 3 s prefill chunk of 600 tokens on a slow machine: 200 tok/s, not 0
    w = RateWindow(2.0)
    w.add(600, now=10.0, took=3.0)
    assert w.rate(now=10.0) == pytest.approx(200.0)
    assert w.rate(now=11.0) == pytest.approx(150.0)           # idle for a second since
    assert w.rate(now=12.5) == 0.0                            # its end left the window


def test_events_without_a_duration_keep_the_old_reading():
    w = RateWindow(2.0)
    w.add(4, now=10.0)
    w.add(4, now=10.5)
    assert w.rate(now=11.0) == pytest.approx(8 / 1.0)


class _Seq:
    def __init__(self, num_new: int, samples: bool) -> None:
        self.num_new, self.samples = num_new, samples


class _Sched:
    def __init__(self, *seqs: _Seq) -> None:
        self.seqs = list(seqs)


def test_a_prompt_and_its_first_decode_step_read_at_their_real_speeds():
    c = Counters()
    c.on_step(_Sched(_Seq(512, True)), sampled=1, seconds=0.05, now=50.0)        # prefill of 512 tokens in 50 ms
    assert c.prefilled.rate(50.0) == pytest.approx(512 / 0.05)
    c.on_step(_Sched(_Seq(1, True)), sampled=1, seconds=0.01, now=50.01)         # then one decode step
    assert c.sampled.rate(50.01) == pytest.approx(2 / 0.06)
    assert c.per_stream_tok_s(50.01) == pytest.approx(2 / 0.06)
