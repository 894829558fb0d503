"""What the CPU tests of the parallel modes share: prompts, options, and a look at processes."""
from __future__ import annotations

import os
import time

from engine import SamplingParams

PROMPTS = [[1, 5, 77, 300, 12, 9, 400, 33, 41, 7, 8, 260, 14, 15], [1, 99, 4], [1, 250, 251, 252, 253, 17, 6]]
# chunked prefill (chunks of 5, 8 tokens a step) and one CPU thread per process, as in the one-process run
OPTIONS = dict(device="cpu", dtype="float32", prefill_chunk=5, max_batch_tokens=8, max_batch=4, cpu_threads=1)
GREEDY = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def gone(pids: list[int], timeout: float = 20.0) -> bool:
    """Every process of ``pids`` has ended (within ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(alive(p) for p in pids)


def children() -> set[int]:
    """Pids of this process's live child processes (from /proc)."""
    me = str(os.getpid())
    out = set()
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[1] == me:
                        out.add(int(d))
            except OSError:
                pass
    return out
