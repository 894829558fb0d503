"""How many threads the CPU expert kernels use, and on which CPUs they run.

Numba's worker threads are created once and reused; this pins each of them (and the calling thread,
which does a share of every parallel pass) to a CPU set by running a parallel pass in which every
thread calls ``sched_setaffinity`` on itself. The CPU set to pass is the GPU's NUMA node
(``engine.experts.numa`` finds it), so the threads read the host store from local memory.
"""
from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numba
import numpy as np
from numba import njit, prange

from kernels.errors import ConfigError

_MASK_WORDS = 16                       # 1024 CPUs, as glibc's cpu_set_t
_libc = ctypes.CDLL(None, use_errno=True)
_setaffinity = _libc.sched_setaffinity
_setaffinity.argtypes = (ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p)
_setaffinity.restype = ctypes.c_int


def set_numba_threads(n: int) -> None:
    """``numba.set_num_threads(n)``, leaving torch's thread count as it was (see _torch_threads_kept)."""
    with _torch_threads_kept():
        numba.set_num_threads(n)


@contextmanager
def _torch_threads_kept() -> Iterator[None]:
    """torch's intra-op thread count as it was: numba's OpenMP pool, started by its first use, sets the
    calling thread's OpenMP thread count (torch's too) to every core, and a model on the CPU that ran
    on one thread ran on two from then on (a tiny model at a third of its speed)."""
    import torch
    before = torch.get_num_threads()
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


@njit(parallel=True)
def _pin_all(mask_addr, nbytes, slots, status):
    for i in prange(slots.size):
        status[i] = _setaffinity(0, nbytes, mask_addr)   # pid 0: the calling thread


def set_cpu_expert_threads(threads: int, cpus: Sequence[int] | None = None) -> int:
    """Use ``threads`` worker threads (capped at numba's pool size) from the calling thread on; with
    ``cpus``, pin the worker threads in use and the calling one to that CPU set (call again after
    raising the count, so that the added threads are pinned too). Returns the thread count."""
    if threads < 1:
        raise ConfigError(f"CPU expert threads must be at least 1, got {threads}")
    n = min(int(threads), numba.config.NUMBA_NUM_THREADS)
    set_numba_threads(n)
    if cpus is None:
        return n
    cpus = sorted(set(int(c) for c in cpus))
    if not cpus or cpus[0] < 0 or cpus[-1] >= min(64 * _MASK_WORDS, os.cpu_count() or 1):
        raise ConfigError(f"cannot pin CPU expert threads to CPUs {cpus}; pass CPU numbers this machine has")
    mask = np.zeros(_MASK_WORDS, np.uint64)
    for c in cpus:
        mask[c // 64] |= np.uint64(1) << np.uint64(c % 64)
    status = np.zeros(n * 8, np.int32)                 # several slots per thread: every thread gets one
    _pin_all(mask.ctypes.data, mask.nbytes, np.zeros(n * 8, np.int64), status)
    if status.any():
        raise ConfigError(f"pinning CPU expert threads to CPUs {cpus} failed "
                          f"(errno {ctypes.get_errno()}); pass CPUs this process may use")
    return n
