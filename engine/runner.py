"""Turns a scheduler decision into batch tensors, runs the model and samples."""
from __future__ import annotations

import torch

from engine.cuda_graphs import DecodeGraphs, DecodeInputs
from engine.kv.cache import KVCache
from engine.models.layers import SeqSlice
from engine.models.moe_transformer import DecodeMeta, ForwardBatch, MoETransformer
from engine.request import Request
from engine.sampling import sample
from engine.scheduler import SchedulerOutput


class ModelRunner:
    def __init__(self, model: MoETransformer, cache: KVCache, graphs: DecodeGraphs | None = None) -> None:
        self.model, self.cache, self.graphs = model, cache, graphs
        self.device = model.device
        self.use_graphs = graphs is not None
        self._tokens_host: torch.Tensor | None = None     # page-locked landing place of the sampled ids
        self._tokens_ready: torch.cuda.Event | None = None
        self._tokens: torch.Tensor | None = None          # this step's sampled ids (host view on CUDA)

    def build_batch(self, sched: SchedulerOutput) -> ForwardBatch:
        decode = all(s.num_new == 1 and s.samples for s in sched.seqs)
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        seqs: list[SeqSlice] = []
        rows: list[int] = []
        for s in sched.seqs:
            req, start = s.request, s.request.num_computed
            pos = range(start, start + s.num_new)
            if not decode:                    # a decode batch reads its blocks from DecodeMeta
                seqs.append(SeqSlice(len(ids), s.num_new, start + s.num_new,
                                     torch.tensor(req.blocks, dtype=torch.int64, device=self.device)))
            ids += req.all_ids[start:start + s.num_new] if s.num_new > 1 else [req.token_at(start)]
            positions += pos
            slots += [self._slot(req, p) for p in pos]
            if s.samples:
                rows.append(len(ids) - 1)
        as_t = lambda xs: torch.tensor(xs, dtype=torch.int64, device=self.device)   # noqa: E731
        meta = self._decode_meta(sched) if decode else None
        return ForwardBatch(as_t(ids), as_t(positions), as_t(slots), seqs, None if decode else as_t(rows), meta)

    def _decode_meta(self, sched: SchedulerOutput) -> DecodeMeta:
        width = max(len(s.request.blocks) for s in sched.seqs)
        tables = [s.request.blocks + [0] * (width - len(s.request.blocks)) for s in sched.seqs]
        lens = [s.request.num_computed + 1 for s in sched.seqs]
        return DecodeMeta(torch.tensor(tables, dtype=torch.int32, device=self.device),
                          torch.tensor(lens, dtype=torch.int32, device=self.device))

    def _slot(self, req: Request, pos: int) -> int:
        """The KV-cache slot of ``req``'s token at position ``pos``."""
        bs = self.cache.block_size
        return req.blocks[pos // bs] * bs + pos % bs

    def decode_inputs(self, sched: SchedulerOutput) -> DecodeInputs:
        """The host side of a decode step (one new token per sequence) for a recorded replay."""
        inp = DecodeInputs([], [], [], [], [])
        for s in sched.seqs:
            req, p = s.request, s.request.num_computed
            inp.ids.append(req.token_at(p))
            inp.positions.append(p)
            inp.slots.append(self._slot(req, p))
            inp.tables.append(req.blocks)
            inp.lens.append(p + 1)
        return inp

    def run(self, sched: SchedulerOutput) -> list[int]:
        """Forward the scheduled tokens; sampled token ids for the sequences that sample, in order.

        A replayed decode step has its sampling queued as soon as the step is launched, before the
        host follows the step's experts and ends it, so the tokens are ready when the host is."""
        sampling = [s.request for s in sched.seqs if s.samples]
        replay = (self.use_graphs and all(s.num_new == 1 and s.samples for s in sched.seqs)
                  and self.graphs.bucket(len(sched.seqs)) is not None)
        if replay:
            self.graphs.run(self.decode_inputs(sched), then=lambda logits: self._queue_sample(logits, sampling))
        else:
            logits = self.model.forward(self.build_batch(sched), self.cache)         # [B', V]
            self._queue_sample(logits, sampling)
        return self._take_tokens(len(sampling))

    def _queue_sample(self, logits: torch.Tensor, reqs: list[Request]) -> None:
        """Queue the sampling of ``logits`` [B, V] and the copy of its token ids to the host."""
        self._tokens = None
        if not reqs:
            return
        penalised = any(r.params.repetition_penalty != 1.0 for r in reqs)
        tokens = sample(logits, [r.params for r in reqs], [r.generator for r in reqs],
                        [r.all_ids for r in reqs] if penalised else None)              # [B]
        if self.device.type != "cuda":
            self._tokens = tokens
            return
        n = tokens.shape[0]
        if self._tokens_host is None or self._tokens_host.shape[0] < n:
            self._tokens_host = torch.empty(max(n, 64), dtype=torch.int64, pin_memory=True)
            self._tokens_ready = torch.cuda.Event()
        self._tokens_host[:n].copy_(tokens, non_blocking=True)
        self._tokens_ready.record()
        self._tokens = self._tokens_host[:n]

    def _take_tokens(self, n: int) -> list[int]:
        if n == 0:
            return []
        if self.device.type == "cuda":
            self._tokens_ready.synchronize()
        return self._tokens.tolist()
