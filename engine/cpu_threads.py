"""How many threads the CPU's math uses: by the weight bytes one token reads, and never every core.

Every op of a decode step is split across the intra-op threads and ends at a barrier, so a step is
as slow as its slowest thread. A small model's ops take microseconds, so threading them costs more
than it gains; and when another process holds a core, the thread that shares it stalls every op by
a scheduler time slice. Measured on 2 shared cores (``benchmarks/results/cpu_threads_2026-12-01.json``),
1 thread beat 2 for the demo model (5 MiB per token) and for a 196 MiB-per-token model alike, with
and without added busy loops: TTFT 109 ms against 1.4 s and 0.8 s against 6.7 s under the busy loops.
So threads grow with the bytes a token reads, and one core is always left to the rest of the
machine (the workbench's window, the outside load), so that no thread has to share one.
"""
from __future__ import annotations

import os
from collections.abc import Mapping

import torch

# One thread per this many bytes of weights read per token: each thread's share of a layer's weights
# then stays in the MiB range, well above the cost of a parallel region's start and barrier. An
# estimate, not a measured crossover: on the 2 cores measured, the cap of cores - 1 decides.
BYTES_PER_THREAD = 64 << 20


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:          # macOS and Windows have no affinity call
        return os.cpu_count() or 1


def choose_cpu_threads(active_bytes_per_token: int, cores: int) -> int:
    """Intra-op threads for decoding a model that reads ``active_bytes_per_token`` of weights per token.

    1 for small models, where threading overhead dominates; one more per ``BYTES_PER_THREAD``;
    at most ``cores - 1`` (all of one core).
    """
    most = max(1, cores - 1)
    return max(1, min(most, active_bytes_per_token // BYTES_PER_THREAD))


def threads_from_env(environ: Mapping[str, str]) -> int | None:
    """The thread count a user set with ``OMP_NUM_THREADS`` (its first entry), else None."""
    first = environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    return int(first) if first.isdigit() and int(first) > 0 else None


def apply_cpu_threads(requested: int | None, active_bytes_per_token: int) -> tuple[int, str | None]:
    """Set torch's intra-op threads for a CPU model: ``requested`` (clamped to the cores) or by model size.

    Returns the count and a note when ``requested`` was clamped. torch keeps the count per thread:
    it holds for the calling thread and the threads started after it, so call it from the thread
    that runs the engine.
    """
    cores = available_cores()
    note = None
    if requested is None:
        threads = choose_cpu_threads(active_bytes_per_token, cores)
    else:
        threads = min(requested, cores)
        if threads < requested:
            note = f"{requested} CPU threads asked for but this process may use {cores} cores; using {cores}"
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return threads, note
