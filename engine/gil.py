"""Letting other Python threads run from a loop that waits on the GPU or runs steps back to back.

``time.sleep(0)`` lets go of the GIL, but on Linux it is a real sleep of the thread's timer slack:
50-120 us a call (measured 81 us on this project's 2-core CI machine and 74 us on the GPU host), which
a host thread following a replayed decode step paid at every look at a layer's published ids, and the
engine loop after every step (at 1200 tok/s, a tenth of the step). :func:`offer_gil` releases the GIL
around a zero-timeout ``select``, a system call of about 2 us: a thread that has asked for the GIL
(after its switch interval) takes it there, as it would from ``time.sleep(0)``; with none waiting the
caller goes on at once. Windows has no ``select`` without sockets; there ``time.sleep(0)`` is a bare
yield of the time slice and stays.
"""
from __future__ import annotations

import select
import sys
import time


def _select_nothing() -> None:
    select.select((), (), (), 0)


offer_gil = (lambda: time.sleep(0)) if sys.platform == "win32" else _select_nothing
offer_gil.__doc__ = "Let a Python thread that waits for the GIL take it, without sleeping (see the module)."
