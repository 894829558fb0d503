"""Sends a workload's requests on time: at most ``concurrency`` in flight, none before its arrival time.

Both runners use it, so in-process and HTTP runs are paced identically; only ``send`` differs.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import nullcontext
from typing import Protocol

from engine.bench.metrics import RequestRecord
from engine.bench.workload import BenchRequest, Workload

Send = Callable[[BenchRequest], Awaitable[RequestRecord]]


class Progress(Protocol):
    """Told of every piece of output and every finished request, on the thread that drives the run."""

    def tokens(self, n: int) -> None: ...

    def done(self, record: RequestRecord) -> None: ...


class NoProgress:
    def tokens(self, n: int) -> None:
        pass

    def done(self, record: RequestRecord) -> None:
        pass


async def drive(workload: Workload, requests: Sequence[BenchRequest], send: Send,
                progress: Progress) -> tuple[list[RequestRecord], float]:
    """Run every request through ``send``; returns the records in request order and the wall time
    from the start to the last request's end."""
    gate = asyncio.Semaphore(workload.concurrency) if workload.concurrency else None
    start = time.perf_counter()

    async def one(req: BenchRequest) -> RequestRecord:
        wait = start + req.arrival_s - time.perf_counter()
        if wait > 0:
            await asyncio.sleep(wait)
        async with gate if gate is not None else nullcontext():
            record = await send(req)
        progress.done(record)
        return record

    records = await asyncio.gather(*(one(r) for r in requests))
    ends = [r.finished_at for r in records if r.finished_at is not None]
    return list(records), (max(ends) if ends else time.perf_counter()) - start
