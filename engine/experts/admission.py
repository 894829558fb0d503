"""The one admission rule of the expert pool, shared by the real pool and the adaptive policy's shadow pools.

Candidates come hottest first; each takes free room while there is some, else the next victim the
policy offers — with scores (LFU), only a victim colder than the candidate. The first candidate that
finds neither ends the admissions (later ones are colder still). Pure Python.
"""
from __future__ import annotations

from typing import Callable, Iterable


def admit(candidates: Iterable[int], cap: int, room: int, next_victim: Callable[[], int | None],
          hotness: Callable[[int], float] | None, place: Callable[[int, int | None], None]) -> int:
    """Admit at most ``cap`` of ``candidates`` (hottest first): ``room`` of them without a victim,
    the rest each over ``next_victim()`` (None: no victim left) if ``hotness`` (None: unscored)
    says it is colder. ``place(key, victim or None)`` applies each admission before the next victim
    is asked for. Returns how many were admitted."""
    n = 0
    for key in candidates:
        if n >= cap:
            break
        victim = None
        if room > 0:
            room -= 1
        else:
            victim = next_victim()
            if victim is None or (hotness is not None and hotness(victim) >= hotness(key)):
                break
        place(key, victim)
        n += 1
    return n
