"""``PredictTuner``: whether a replayed direct-read decode step predicts later layers' experts.

A direct-read decode step is recorded twice (engine/cuda_graphs.py): once predicting (each layer
routes the hidden state through later layers' routers and the GPU copies the guessed experts in
ahead, engine/experts/claims.py) and once ``quiet`` (no predictions, no claims). The claim gate
(:class:`engine.experts.prefetch.ClaimGate`) closes the claims whose guesses are mostly wrong, but
a guess that is right half the time can still cost more than it saves: its copy contends on the bus
with the reads the step waits for, and a wrong one may evict a hot expert. Only the step's time
says which recording is faster, and that differs by step size, format, pool share and routing: in the
llama.cpp kit's run on an H100 at b83ca23 (trained-like routing, llamacpp_kit_2026-12-06c), prefetch
depth 0 beat depth 2 in five of six cells at batch 1 (up to 1.38x, bf16 at a 50% pool) and lost the
sixth (int4 at 25%: 0.94x); at batch 8 it won three of six.

For each step size this measures both and replays the faster: ``trials`` quiet steps first (after the
first step, which records the graphs and is not a measure), then ``trials`` predicting steps, then
whichever median step time is lower; every ``probe_every`` steps it tries the other for ``trials`` steps and
moves when that was faster by ``margin`` (each arm's time: the median of its last ``window`` steps, a
probe's of its own steps). A probe step slower than the arm in force by ``abandon`` ends its probe at
once, and each probe that fails doubles the wait before the next (up to 8 times).

Quiet first, because the CPU's share of the missing experts is tuned on the steps of the recording in
force (engine/experts/cold_graph.ShareTuner), and with predicting steps it settles where the CPU takes
almost nothing: on the H100 at 989b39d (predict_ab_2026-12-06, int4, trained-like routing, no pool)
depth 2 starting from predicting replays kept predicting and gave the CPU 1.4 experts a token at batch
1 (147.6 tok/s) where depth 0 gave it 36.8 (168.8 tok/s); at batch 8, 433.2 against 483.5. Replays
that always predicted were slower still (128.0 and 388.8). Each recording has its own share tuner
(engine/experts/replay_choice.py): a probe runs the probed recording at its own share, whose first
steps find that share when it was never tuned, so neither recording is judged at the other's.
"""
from __future__ import annotations

import statistics


class PredictTuner:
    def __init__(self, trials: int = 3, probe_every: int = 32, window: int = 5, margin: float = 0.02,
                 abandon: float = 0.5, start: bool = False) -> None:
        self.trials, self.probe_every, self.window, self.margin = trials, probe_every, window, margin
        self.abandon, self.start = abandon, start      # start: the recording a step size replays first
        self._s: dict[int, dict] = {}

    def _state(self, tokens: int) -> dict:
        st = self._s.get(tokens)
        if st is None:
            # the first steps replay ``start``; after ``trials`` of them, a probe of the other
            st = self._s[tokens] = {"cur": self.start, "arm": self.start, "left": self.trials, "every": self.trials,
                                    "recent": {True: [], False: []}, "probe": [], "skip": True}
        return st

    def choose(self, tokens: int, may_probe: bool = True) -> bool:
        """Whether the next replayed step of ``tokens`` tokens predicts. ``may_probe``: whether a probe
        of the other recording may start now (not while another tuner measures the same steps)."""
        st = self._state(tokens)
        if st["arm"] == st["cur"] and st["left"] <= 0 and may_probe and not st["skip"]:
            st["arm"], st["left"], st["probe"] = not st["cur"], self.trials, []
        return st["arm"]

    def in_force(self, tokens: int) -> bool:
        """The recording steps of ``tokens`` tokens have in force (not a probe's); ``start`` for a size
        not seen yet."""
        st = self._s.get(tokens)
        return self.start if st is None else st["cur"]

    def too_slow(self, tokens: int, seconds: float) -> bool:
        """Whether a step of ``seconds`` is slower than the recording in force by ``abandon`` (a probe
        step that slow ends its probe)."""
        st = self._s.get(tokens)
        here = st["recent"][st["cur"]] if st is not None else []
        return bool(here) and seconds > statistics.median(here) * (1 + self.abandon)

    def probing(self, tokens: int) -> bool:
        """Whether the next step of ``tokens`` tokens is one of a probe of the other recording."""
        st = self._s.get(tokens)
        return st is not None and st["arm"] != st["cur"]

    def cancel(self, tokens: int) -> None:
        """End a probe of ``tokens`` tokens unjudged (another tuner has to measure these steps now); it
        starts again at the next step it may."""
        st = self._s.get(tokens)
        if st is not None and st["arm"] != st["cur"]:
            st["arm"], st["left"], st["probe"] = st["cur"], 0, []

    def observe(self, tokens: int, predicting: bool, seconds: float) -> None:
        """A replayed step of ``tokens`` tokens that ``choose`` picked ran in ``seconds``."""
        st = self._s.get(tokens)
        if st is None:
            return
        if st["skip"]:                       # the size's first step records its graphs
            st["skip"] = False
            return
        if predicting != st["arm"]:
            return
        cur = st["cur"]
        if predicting == cur:
            recent = st["recent"][cur]
            recent.append(seconds)
            del recent[:-self.window]
            st["left"] -= 1
            return
        probe = st["probe"]
        probe.append(seconds)
        st["left"] -= 1
        here = st["recent"][cur]
        if self.too_slow(tokens, seconds):
            st["left"] = 0                   # far slower than the recording in force: stop here
        if st["left"] > 0:
            return
        moved = not here or statistics.median(probe) < statistics.median(here) * (1 - self.margin)
        st["recent"][predicting] = probe[-self.window:]     # what the other recording measured last
        if moved:
            st["cur"], st["every"] = predicting, self.probe_every
        else:
            st["every"] = min(8 * self.probe_every, 2 * st["every"] if st["every"] >= self.probe_every
                              else self.probe_every)
        st["arm"], st["left"], st["probe"] = st["cur"], st["every"], []

    def state(self) -> dict[int, tuple[bool, dict[bool, float]]]:
        """Step size -> (whether it predicts, median step seconds of each recording measured)."""
        out = {}
        for t, st in sorted(self._s.items()):
            times = {arm: statistics.median(v) for arm, v in st["recent"].items() if v}
            out[t] = (st["cur"], times)
        return out

    def recorded(self) -> None:
        """The steps were recorded (again): the next step of each size is not a measure."""
        for st in self._s.values():
            st["skip"] = True

    def reset(self) -> None:
        self._s.clear()
