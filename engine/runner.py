"""Turns a scheduler decision into batch tensors, runs the model and samples."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.cuda_graphs import DecodeGraphs, DecodeInputs
from engine.guided import GuideCompiler
from engine.kv.cache import KVCache
from engine.models.layers import SeqSlice
from engine.models.moe_transformer import DecodeMeta, ForwardBatch, MoETransformer
from engine.outputs import TokenLogprob
from engine.request import Request
from engine.sampling import mask_logits, sample, token_logprobs
from engine.scheduler import SchedulerOutput


@dataclass(frozen=True)
class Sampled:
    """What a step sampled, one entry per sequence that samples, in batch order."""

    tokens: list[int]
    logprobs: list[TokenLogprob | None] = field(default_factory=list)   # empty when no row asked for them
    failed: dict[int, str] = field(default_factory=dict)   # row -> why its guide failed (its token is void)


@dataclass
class _Queued:
    """A step's sampling between its launch and its read-back: host views of what the device fills."""

    tokens: torch.Tensor                       # int64 [B]
    reqs: list[Request]
    asked: list[int] = field(default_factory=list)    # rows that want logprobs
    values: torch.Tensor | None = None         # float32 [L, 1 + N]
    ids: torch.Tensor | None = None            # int64 [L, N]
    failed: dict[int, str] = field(default_factory=dict)


class ModelRunner:
    def __init__(self, model: MoETransformer, cache: KVCache, graphs: DecodeGraphs | None = None) -> None:
        self.model, self.cache, self.graphs = model, cache, graphs
        self.device = model.device
        self.use_graphs = graphs is not None
        self.guides: GuideCompiler | None = None          # set by the engine when its model has a tokenizer
        self._host: dict[str, torch.Tensor] = {}          # page-locked landing places of what a step reads back
        self._ready: torch.cuda.Event | None = None
        self._queued: _Queued | None = None
        self._bits: torch.Tensor | None = None            # int32 [G, W] guide bitmasks (page-locked on CUDA)

    def build_batch(self, sched: SchedulerOutput) -> ForwardBatch:
        """The step's inputs; with a window group in the cache, its own slots and tables as ``window``."""
        decode = all(s.num_new == 1 and s.samples for s in sched.seqs)
        ids: list[int] = []
        positions: list[int] = []
        rows: list[int] = []
        for s in sched.seqs:
            req, start = s.request, s.request.num_computed
            ids += req.all_ids[start:start + s.num_new] if s.num_new > 1 else [req.token_at(start)]
            positions += range(start, start + s.num_new)
            if s.samples:
                rows.append(len(ids) - 1)
        as_t = lambda xs: torch.tensor(xs, dtype=torch.int64, device=self.device)   # noqa: E731
        ids_t, pos_t, rows_t = as_t(ids), as_t(positions), None if decode else as_t(rows)
        starts, lens = [s.request.num_computed for s in sched.seqs], [s.num_new for s in sched.seqs]

        def group(tables: list[list[int]], window: ForwardBatch | None = None) -> ForwardBatch:
            slots, seqs = group_inputs(tables, starts, lens, self.cache.block_size, self.device, slices=not decode)
            meta = self._decode_meta(tables, starts) if decode else None
            return ForwardBatch(ids_t, pos_t, slots, seqs, rows_t, meta, window=window)

        window = group([s.request.window_blocks for s in sched.seqs]) if self.cache.window_blocks else None
        return group([s.request.blocks for s in sched.seqs], window)

    def _decode_meta(self, tables: list[list[int]], starts: list[int]) -> DecodeMeta:
        """Block tables (padded with block 0) and context lengths of a decode step in one block group."""
        width = max(len(t) for t in tables)
        padded = [t + [0] * (width - len(t)) for t in tables]
        return DecodeMeta(torch.tensor(padded, dtype=torch.int32, device=self.device),
                          torch.tensor([p + 1 for p in starts], dtype=torch.int32, device=self.device))

    def decode_inputs(self, sched: SchedulerOutput) -> DecodeInputs:
        """The host side of a decode step (one new token per sequence) for a recorded replay."""
        inp = DecodeInputs([], [], [], [], [])
        bs, windowed = self.cache.block_size, bool(self.cache.window_blocks)
        for s in sched.seqs:
            req, p = s.request, s.request.num_computed
            inp.ids.append(req.token_at(p))
            inp.positions.append(p)
            inp.slots.append(slot_of(req.blocks, p, bs))
            inp.tables.append(req.blocks)
            inp.lens.append(p + 1)
            if windowed:
                inp.window_slots.append(slot_of(req.window_blocks, p, bs))
                inp.window_tables.append(req.window_blocks)
        return inp

    def run(self, sched: SchedulerOutput) -> Sampled:
        """Forward the scheduled tokens; what was sampled for the sequences that sample, in order.

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
        return self._take()

    def _queue_sample(self, logits: torch.Tensor, reqs: list[Request]) -> None:
        """Queue the sampling of ``logits`` [B, V] and the copy of its results to the host.

        Rows with a guide are masked first (their bitmasks are filled on the host while the device
        runs the step); logprobs are taken from the raw logits. Neither costs a kernel when no row
        of the step asks for it."""
        self._queued = None
        if not reqs:
            return
        guided = [i for i, r in enumerate(reqs) if r.guide is not None]
        masked, failed = self._mask(logits, reqs, guided) if guided else (logits, {})
        penalised = any(r.params.repetition_penalty != 1.0 for r in reqs)
        tokens = sample(masked, [r.params for r in reqs], [r.generator for r in reqs],
                        [r.all_ids for r in reqs] if penalised else None)              # [B]
        queued = _Queued(self._stage("tokens", tokens), reqs, failed=failed)
        queued.asked = [i for i, r in enumerate(reqs) if r.params.logprobs is not None]
        if queued.asked:
            values, ids = token_logprobs(logits, tokens, queued.asked,
                                         max(reqs[i].params.logprobs for i in queued.asked))
            queued.values, queued.ids = self._stage("values", values), self._stage("ids", ids)
        if self.device.type == "cuda":
            if self._ready is None:
                self._ready = torch.cuda.Event()
            self._ready.record()
        self._queued = queued

    def _mask(self, logits: torch.Tensor, reqs: list[Request], rows: list[int]) -> tuple[torch.Tensor, dict[int, str]]:
        """``logits`` with what each guided row's grammar forbids at -inf; rows whose guide failed."""
        words = self.guides.words
        if self._bits is None or self._bits.shape[0] < len(rows) or self._bits.shape[1] != words:
            # page-locked so the copy below is asynchronous; the next step refills it only after this
            # step's results were read back, so after that copy ran
            self._bits = torch.empty(max(len(rows), 8), words, dtype=torch.int32,
                                     pin_memory=self.device.type == "cuda")
        staged = self._bits[:len(rows)]
        bits = staged.numpy()                                                          # [G, W], shares memory
        errors = self.guides.fill([reqs[i].guide for i in rows], bits)
        failed = {}
        for g, (row, error) in enumerate(zip(rows, errors)):
            if error is not None:
                failed[row] = error
                bits[g] = -1                   # any token: the row is void, but its sampling must stay finite
        on_device = staged.to(self.device, non_blocking=True)                          # [G, W]
        return mask_logits(logits, on_device, rows), failed

    def _stage(self, key: str, t: torch.Tensor) -> torch.Tensor:
        """``t`` on the host: itself on the CPU; on CUDA, a view of a page-locked buffer that an
        asynchronous copy fills (read it only after ``_ready``)."""
        if self.device.type != "cuda":
            return t
        n = t.numel()
        buf = self._host.get(key)
        if buf is None or buf.dtype != t.dtype or buf.numel() < n:
            buf = self._host[key] = torch.empty(max(n, 64), dtype=t.dtype, pin_memory=True)
        view = buf[:n].view(t.shape)
        view.copy_(t, non_blocking=True)
        return view

    def _take(self) -> Sampled:
        q = self._queued
        if q is None:
            return Sampled([])
        if self.device.type == "cuda":
            self._ready.synchronize()
        tokens = q.tokens.tolist()
        if not q.asked:
            return Sampled(tokens, failed=q.failed)
        logprobs: list[TokenLogprob | None] = [None] * len(tokens)
        for row, values, ids in zip(q.asked, q.values.tolist(), q.ids.tolist()):
            n = q.reqs[row].params.logprobs
            logprobs[row] = TokenLogprob(tokens[row], values[0], tuple(zip(ids[:n], values[1:n + 1])))
        return Sampled(tokens, logprobs, q.failed)


def slot_of(table: list[int], pos: int, block_size: int) -> int:
    """The cache row of position ``pos`` of a sequence whose block table is ``table``."""
    return table[pos // block_size] * block_size + pos % block_size


def group_inputs(tables: list[list[int]], starts: list[int], lens: list[int], block_size: int,
                 device: torch.device, slices: bool = True) -> tuple[torch.Tensor, list[SeqSlice]]:
    """One block group's share of a batch whose sequence ``i`` adds ``lens[i]`` tokens from position
    ``starts[i]`` on: the cache row of every new token (slot mapping [T] int64) and, with ``slices``,
    the sequences' slices over their block ``tables`` in that group (a decode step needs none)."""
    slots: list[int] = []
    seqs: list[SeqSlice] = []
    for table, start, n in zip(tables, starts, lens):
        if slices:
            seqs.append(SeqSlice(len(slots), n, start + n, torch.tensor(table, dtype=torch.int64, device=device)))
        slots += [slot_of(table, p, block_size) for p in range(start, start + n)]
    return torch.tensor(slots, dtype=torch.int64, device=device), seqs
