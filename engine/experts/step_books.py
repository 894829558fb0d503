"""``StepBooks``: one direct-read step's books, so a step whose end is deferred can keep its own.

A replayed direct-read step's end runs only after the next step is launched
(:meth:`engine.experts.direct.DirectPath.finish_ended`); meanwhile the next step keeps books of its
own. The direct path holds the running step's books in ``step``; a deferred step's books wait in
``ended`` until its end runs on them. Keys are store rows ``layer * E + expert``.
"""
from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass
class StepBooks:
    # keys read directly this step, in order of first use: the admission candidates without fills
    misses: list[int] = dataclasses.field(default_factory=list)
    # key -> fill slot the MoE kernels wrote it into this step
    filled: dict[int, int] = dataclasses.field(default_factory=dict)
    # keys the host CPU computed in a replayed step (no fill slot: admitted by a copy from the host)
    cpu_keys: list[int] = dataclasses.field(default_factory=list)
    # this step's leased fill slots (None: not chosen yet)
    fill_slots: list[int] | None = None
    # of which handed out so far (eager steps; a recorded step's publish kernel hands them out)
    fill_used: int = 0
    # keys the GPU-side prefetch brought that their layer used
    dp_used: set[int] = dataclasses.field(default_factory=set)
    # key -> slot its layer found it in this step
    seen: dict[int, int] = dataclasses.field(default_factory=dict)
    # admitted mid-step (key, slot) pairs, and the keys evicted for them
    early: tuple[list[tuple[int, int]], list[int]] = dataclasses.field(default_factory=lambda: ([], []))
    # this step's host issued prefetch copies (its end then cannot be deferred)
    host_prefetched: bool = False
    # this step launched (or replays) GPU-side prefetches ...
    dp_active: bool = False
    # staging slots leased as the step's gather slots (engine/experts/gather.py); None: not leased yet
    gather_slots: list[int] | None = None
    # ... from a recorded graph, whose claim kernels write these layers' records
    dp_replay: bool = False
    dp_targets: list[int] = dataclasses.field(default_factory=list)
    # tokens of the step whose claims are out
    dp_tokens: int = 0
    # claim records kept by a step whose end is deferred (the next step's claims overwrite the live ones)
    dp_records: Any = None
