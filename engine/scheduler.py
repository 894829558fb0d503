"""Continuous batching with chunked prefill under a per-step token budget.

There is no prefill phase and no decode phase: each running request has tokens whose K/V are not
yet cached (a prompt chunk, or the one token sampled last step), and a step gives every request as
many of them as the budget allows — decodes first, so a long prompt never stalls running streams.
When the KV cache runs out of blocks the youngest running request is preempted (its blocks freed)
and recomputed later from its prompt and the tokens it had generated; no request is dropped.

A cache with sliding-window layers keeps their KV in a second block group (``windows``): a step
first frees every running request's window blocks that no query can see any more, then each
scheduled request takes the ones its new tokens need. That pool is sized for ``max_batch`` requests
and a step of ``token_budget`` tokens, so it never runs out and only the full pool preempts.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from engine.kv.blocks import BlockAllocator
from engine.kv.windows import WindowBlocks
from engine.request import Request, Status


@dataclass(frozen=True)
class ScheduledSeq:
    request: Request
    num_new: int          # tokens of this request computed in this step
    samples: bool         # the step reaches the end of its known tokens, so a token is sampled


@dataclass(frozen=True)
class SchedulerOutput:
    seqs: list[ScheduledSeq]     # in batch row order
    preempted: list[Request]     # requests sent back to waiting in this step

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new for s in self.seqs)


class Scheduler:
    def __init__(self, allocator: BlockAllocator, max_batch: int, token_budget: int, prefill_chunk: int,
                 windows: WindowBlocks | None = None) -> None:
        self.allocator, self.windows = allocator, windows
        self.max_batch, self.token_budget, self.prefill_chunk = max_batch, token_budget, prefill_chunk
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.preemptions = 0

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def remove(self, req: Request) -> None:
        """Drop a finished or aborted request and free its blocks."""
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self._free(req)

    def schedule(self) -> SchedulerOutput:
        budget, max_batch = self._limits()
        seqs: list[ScheduledSeq] = []
        preempted: list[Request] = []
        if self.windows is not None:                   # before any request takes new window blocks
            for req in self.running:
                self.windows.release(req.window_blocks, req.num_computed)
        for req in list(self.running):
            if req not in self.running or budget == 0:
                continue
            n = min(req.remaining, budget, self.prefill_chunk)
            if not self._reserve(req, n, preempted):
                continue
            seqs.append(ScheduledSeq(req, n, req.num_computed + n == req.num_tokens))
            budget -= n
        while self.waiting and budget > 0 and len(self.running) < max_batch and not preempted:
            req = self.waiting[0]
            n = min(req.remaining, budget, self.prefill_chunk)
            need = self.allocator.blocks_needed(req.num_computed + n, len(req.blocks))
            if not self.allocator.can_allocate(need):
                break
            self.waiting.popleft()
            req.blocks += self.allocator.allocate(need)
            self._advance_window(req, n)
            req.status = Status.RUNNING
            self.running.append(req)
            seqs.append(ScheduledSeq(req, n, req.num_computed + n == req.num_tokens))
            budget -= n
        return SchedulerOutput(seqs, preempted)

    def decodes_all_without_change(self) -> bool:
        """Whether the next step would give every running request exactly its one known token, in the
        running order, admitting no one and preempting no one: nobody waits, the batch fits the step's
        limits, and the cache has the blocks each next token needs."""
        budget, most = self._limits()
        if self.waiting or len(self.running) > min(budget, most) or any(r.remaining != 1 for r in self.running):
            return False
        need = sum(self.allocator.blocks_needed(r.num_computed + 1, len(r.blocks)) for r in self.running)
        return self.allocator.can_allocate(need)

    def _limits(self) -> tuple[int, int]:
        """(tokens of a step, most running requests): the settings', within what the window pool is sized for."""
        if self.windows is None:
            return self.token_budget, self.max_batch
        return min(self.token_budget, self.windows.token_budget), min(self.max_batch, self.windows.max_batch)

    def _reserve(self, req: Request, n: int, preempted: list[Request]) -> bool:
        """Blocks for ``n`` more tokens of ``req``, preempting the youngest requests if needed."""
        need = self.allocator.blocks_needed(req.num_computed + n, len(req.blocks))
        while not self.allocator.can_allocate(need):
            victim = self.running[-1]
            self._preempt(victim)
            preempted.append(victim)
            if victim is req:
                return False
        req.blocks += self.allocator.allocate(need)
        self._advance_window(req, n)
        return True

    def _advance_window(self, req: Request, n: int) -> None:
        """The window table of ``req`` ready for ``n`` more tokens (out-of-reach blocks freed first)."""
        if self.windows is not None:
            self.windows.advance(req.window_blocks, req.num_computed, req.num_computed + n)

    def _free(self, req: Request) -> None:
        self.allocator.free(req.blocks)
        req.blocks = []
        if self.windows is not None:
            self.windows.free(req.window_blocks)

    def _preempt(self, req: Request) -> None:
        self.running.remove(req)
        self._free(req)
        req.num_computed, req.status = 0, Status.WAITING
        self.waiting.appendleft(req)
        self.preemptions += 1
