"""Turns a scheduler decision into batch tensors, runs the model and samples."""
from __future__ import annotations

import torch

from engine.kv.cache import KVCache
from engine.models.layers import SeqSlice
from engine.cuda_graphs import DecodeGraphs
from engine.models.moe_transformer import DecodeMeta, ForwardBatch, MoETransformer
from engine.sampling import sample
from engine.scheduler import SchedulerOutput


class ModelRunner:
    def __init__(self, model: MoETransformer, cache: KVCache, graphs: DecodeGraphs | None = None) -> None:
        self.model, self.cache, self.graphs = model, cache, graphs
        self.device = model.device
        self.use_graphs = graphs is not None

    def build_batch(self, sched: SchedulerOutput) -> ForwardBatch:
        bs = self.cache.block_size
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        seqs: list[SeqSlice] = []
        rows: list[int] = []
        for s in sched.seqs:
            req, start = s.request, s.request.num_computed
            pos = range(start, start + s.num_new)
            seqs.append(SeqSlice(len(ids), s.num_new, start + s.num_new,
                                 torch.tensor(req.blocks, dtype=torch.int64, device=self.device)))
            ids += req.all_ids[start:start + s.num_new]
            positions += pos
            slots += [req.blocks[p // bs] * bs + p % bs for p in pos]
            if s.samples:
                rows.append(len(ids) - 1)
        as_t = lambda xs: torch.tensor(xs, dtype=torch.int64, device=self.device)   # noqa: E731
        decode = None
        if all(s.num_new == 1 and s.samples for s in sched.seqs):
            decode = self._decode_meta(sched)
            rows = None
        return ForwardBatch(as_t(ids), as_t(positions), as_t(slots), seqs, None if rows is None else as_t(rows),
                            decode)

    def _decode_meta(self, sched: SchedulerOutput) -> DecodeMeta:
        width = max(len(s.request.blocks) for s in sched.seqs)
        tables = [s.request.blocks + [0] * (width - len(s.request.blocks)) for s in sched.seqs]
        lens = [s.request.num_computed + 1 for s in sched.seqs]
        return DecodeMeta(torch.tensor(tables, dtype=torch.int32, device=self.device),
                          torch.tensor(lens, dtype=torch.int32, device=self.device))

    def run(self, sched: SchedulerOutput) -> list[int]:
        """Forward the scheduled tokens; sampled token ids for the sequences that sample, in order."""
        batch = self.build_batch(sched)
        if batch.decode is not None and self.use_graphs and self.graphs.bucket(len(sched.seqs)) is not None:
            logits = self.graphs.run(batch)                              # [B, V]
        else:
            logits = self.model.forward(batch, self.cache)               # [B', V]
        sampling = [s.request for s in sched.seqs if s.samples]
        if not sampling:
            return []
        tokens = sample(logits, [r.params for r in sampling], [r.generator for r in sampling],
                        [r.all_ids for r in sampling])
        return tokens.tolist()
