"""What the host does while it follows a replayed direct-read step, as timestamps (off by default).

A replayed step with a host CPU share is as fast as the slower of two timelines that meet at every
MoE layer: the GPU's (attention, routing, the bus's experts) and the host's (wait for the layer's
publish, wait for its inputs, compute the CPU's experts, set the done flag, keep the books). The
counters say how long each part took in sum; a trace says where in the step: whether the host
waits for the GPU (the GPU is the slower) or the GPU's join waits for the host, layer by layer.

``HostTrace.start(steps)`` records the followed steps until :meth:`stop`, keeping the last
``steps``; ``events`` are ``(step, layer, event, seconds)`` with seconds from the step's start, and
:meth:`summary` the per-layer means of each interval.
"""
from __future__ import annotations

import time

class HostTrace:
    def __init__(self) -> None:
        self.events: list[tuple[int, int, str, float]] = []
        self.on = False
        self._keep = 0
        self._step = -1
        self._t0 = 0.0

    def start(self, steps: int) -> None:
        """Record followed steps from now on, keeping the last ``steps`` (earlier traces are dropped)."""
        self.events, self.on, self._keep, self._step = [], steps > 0, int(steps), -1

    def stop(self) -> None:
        self.on = False

    def step_begins(self) -> None:
        if self.on:
            self._step += 1
            first = self._step - self._keep + 1          # the oldest step kept
            if self.events and self.events[0][0] < first:
                self.events = [e for e in self.events if e[0] >= first]
            self._t0 = time.perf_counter()
            self.events.append((self._step, -1, "launched", 0.0))

    def step_followed(self) -> None:
        self.mark(-1, "end")

    def mark(self, layer: int, event: str) -> None:
        if self.on:
            self.events.append((self._step, layer, event, time.perf_counter() - self._t0))

    def summary(self) -> dict[str, float]:
        """Mean microseconds per traced layer: waiting for the publish (since the last layer was
        followed), waiting for the CPU's inputs, computing the CPU's experts, keeping the books; and
        per step: launch to the last layer followed, and the deferred end of the step before."""
        gaps: dict[str, list[float]] = {"publish_wait": [], "ready_wait": [], "compute": [], "books": [],
                                        "step_followed": [], "step_end": []}
        last: dict[str, float] = {}
        prev_step = None
        for step, layer, event, t in self.events:
            if step != prev_step:
                prev_step, last = step, {}
            if event == "launched":
                last["followed"] = t
            elif event == "published":
                gaps["publish_wait"].append(t - last.get("followed", t))
                last["published"] = last["mark"] = t
            elif event == "ready":
                gaps["ready_wait"].append(t - last.get("mark", t))
                last["mark"] = t
            elif event == "computed":
                gaps["compute"].append(t - last.get("mark", t))
                last["mark"] = t
            elif event == "followed":
                gaps["books"].append(t - last.get("mark", t))
                last["followed"] = t
            elif event == "ended":           # the last step's end: not part of the next layer's wait
                gaps["step_end"].append(t - last.get("end_from", t))
                last["followed"] = t
            elif event == "end_begins":
                last["end_from"] = t
            elif event == "end":
                gaps["step_followed"].append(t)
        return {k: 1e6 * sum(v) / len(v) for k, v in gaps.items() if v}
