"""CUDA-graph replay of decode steps when every expert is resident (DESIGN.md §1 rule 5).

One graph per batch-size bucket, captured lazily on first use into one memory pool. A step pads its
batch up to the bucket: padding rows write their K/V into a scratch block that no request owns and
read one token of it, so they never touch a real sequence.
"""
from __future__ import annotations

import torch

from engine.kv.cache import KVCache
from engine.models.moe_transformer import DecodeMeta, ForwardBatch, MoETransformer

BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128)


class DecodeGraphs:
    def __init__(self, model: MoETransformer, cache: KVCache, max_batch: int, max_blocks: int,
                 scratch_block: int) -> None:
        self.model, self.cache = model, cache
        self.buckets = [b for b in BUCKETS if b < max_batch] + [max_batch]
        self.max_blocks, self.scratch_block = max_blocks, scratch_block
        self.scratch_slot = scratch_block * cache.block_size
        n, dev = self.buckets[-1], model.device
        self.ids = torch.zeros(n, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(n, dtype=torch.int64, device=dev)
        self.slots = torch.full((n,), self.scratch_slot, dtype=torch.int64, device=dev)
        self.tables = torch.full((n, max_blocks), scratch_block, dtype=torch.int32, device=dev)
        self.lens = torch.ones(n, dtype=torch.int32, device=dev)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.pool = None
        self.replays = 0

    def bucket(self, b: int) -> int | None:
        return next((x for x in self.buckets if x >= b), None)

    def _batch(self, b: int) -> ForwardBatch:
        return ForwardBatch(self.ids[:b], self.positions[:b], self.slots[:b], [], None,
                            DecodeMeta(self.tables[:b], self.lens[:b]))

    def _capture(self, b: int) -> None:
        side = torch.cuda.Stream(self.model.device)
        side.wait_stream(torch.cuda.current_stream(self.model.device))
        with torch.cuda.stream(side):
            for _ in range(2):                     # warm-up: Triton autotune/compile, allocator caches
                self.model.forward(self._batch(b), self.cache)
        torch.cuda.current_stream(self.model.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            logits = self.model.forward(self._batch(b), self.cache)
        self.pool = graph.pool()
        self.graphs[b] = (graph, logits)

    def run(self, batch: ForwardBatch) -> torch.Tensor:
        """Logits [B, V] of a decode batch, replayed from the graph of its bucket."""
        b = batch.input_ids.shape[0]
        n = self.bucket(b)
        self._load(batch, b, n)
        if n not in self.graphs:
            self._capture(n)
            self._load(batch, b, n)                # capture's warm-up ran on these buffers; reload them
        graph, logits = self.graphs[n]
        graph.replay()
        self.replays += 1
        return logits[:b]

    def _load(self, batch: ForwardBatch, b: int, n: int) -> None:
        d = batch.decode
        self.ids[:b].copy_(batch.input_ids)
        self.positions[:b].copy_(batch.positions)
        self.slots[:b].copy_(batch.slot_mapping)
        self.tables[:b].fill_(self.scratch_block)
        self.tables[:b, :d.block_tables.shape[1]].copy_(d.block_tables)
        self.lens[:b].copy_(d.context_lens)
        if n > b:                                  # padding rows: scratch block, one token of context
            self.ids[b:n].zero_()
            self.positions[b:n].zero_()
            self.slots[b:n].fill_(self.scratch_slot)
            self.tables[b:n].fill_(self.scratch_block)
            self.lens[b:n].fill_(1)

    def reset(self) -> None:
        """Drop every graph (after a change that invalidates them, e.g. a different expert pool)."""
        self.graphs.clear()
        self.pool = None
