"""The model runner: turns a scheduler decision into batch tensors, runs the model and samples.

Dimensions: ``B`` sequences that sample, ``V`` vocabulary, ``L`` rows that want logprobs, ``N`` logprobs
each, ``G`` guided rows, ``W`` words of a guide's bitmask.
"""
from __future__ import annotations

import time

from dataclasses import dataclass, field

import torch

from engine.cuda_graphs import DecodeGraphs, DecodeInputs
from engine.guided import GuideCompiler
from engine.kv.cache import KVCache
from engine.models.moe_transformer import ForwardBatch, MoETransformer
from engine.outputs import TokenLogprob
from engine.request import Request
from engine.runner.batch import SeqPart, build_batch, decode_inputs
from engine.runner.staging import HostStaging
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
    staging: HostStaging | None = None         # where they land (each of two, in turn)
    on_device: torch.Tensor | None = None      # int64 [B] the sampled tokens where they were drawn
    asked: list[int] = field(default_factory=list)    # rows that want logprobs
    values: torch.Tensor | None = None         # float32 [L, 1 + N]
    ids: torch.Tensor | None = None            # int64 [L, N]
    failed: dict[int, str] = field(default_factory=dict)


class ModelRunner:
    """Runs one scheduled step: builds its batch (or replays a recorded decode graph), samples, reads back."""

    def __init__(self, model: MoETransformer, cache: KVCache, graphs: DecodeGraphs | None = None) -> None:
        self.model, self.cache, self.graphs = model, cache, graphs
        self.device = model.device
        self.use_graphs = graphs is not None
        self.guides: GuideCompiler | None = None          # set by the engine when its model has a tokenizer
        # where what a step reads back lands: two sets, used in turn, so that a step launched ahead
        # of the last one's read-back (engine/engine.py) lands beside it, not on it
        self._stagings = (HostStaging.for_device(self.device), HostStaging.for_device(self.device))
        self._turn = 0
        self.overlap = True                # the engine may launch a decode step ahead (set at load)
        self._queued: _Queued | None = None
        self._bits: torch.Tensor | None = None            # int32 [G, W] guide bitmasks (page-locked on CUDA)

    def parts(self, sched: SchedulerOutput, ahead: bool = False) -> list[SeqPart]:
        """The scheduled sequences' shares of the step, in order: the batch builders' one input.
        ``ahead``: a decode step whose input tokens are still on the device (0 stands in for each)."""
        out = []
        for s in sched.seqs:
            req, start = s.request, s.request.num_computed
            if ahead:
                ids = [0]
            else:
                ids = req.all_ids[start:start + s.num_new] if s.num_new > 1 else [req.token_at(start)]
            out.append(SeqPart(ids, start, req.blocks, req.window_blocks, s.samples))
        return out

    def build_batch(self, sched: SchedulerOutput, ids: torch.Tensor | None = None) -> ForwardBatch:
        """The step's inputs; with a window group in the cache, its own slots and tables as ``window``.
        ``ids``: a decode step's input tokens on the device, one per sequence in order."""
        decode = all(s.num_new == 1 and s.samples for s in sched.seqs)
        batch = build_batch(self.parts(sched, ahead=ids is not None), self.cache.block_size, self.device,
                            bool(self.cache.window_blocks), decode=decode)
        if ids is not None:
            batch.input_ids = ids
            if batch.window is not None:
                batch.window.input_ids = ids
        return batch

    def decode_inputs(self, sched: SchedulerOutput, ahead: bool = False) -> DecodeInputs:
        """The host side of a decode step (one new token per sequence) for a recorded replay."""
        return decode_inputs(self.parts(sched, ahead), self.cache.block_size, bool(self.cache.window_blocks))

    def can_launch_ahead(self, sched: SchedulerOutput) -> bool:
        """Whether ``sched`` may be launched before the last step's tokens are read back, taking its input
        tokens from that step's draws on the device: a decode step (every sequence one token, each
        sampling), no sequence under a guide or a repetition penalty (they read the host's history), on
        a model whose experts need no host work during the step (every expert on the GPU)."""
        if not self.overlap or not sched.seqs or not self.model.experts.static:
            return False
        for s in sched.seqs:
            p = s.request.params
            if s.num_new != 1 or not s.samples or s.request.guide is not None or p.repetition_penalty != 1.0:
                return False
        return True

    def launch(self, sched: SchedulerOutput, ids: torch.Tensor | None = None) -> _Queued | None:
        """Launch ``sched`` and queue its sampling without waiting for it (:meth:`can_launch_ahead`
        said it may); ``ids``: its input tokens on the device, else the requests' own. Read it back
        with :meth:`take`."""
        self._forward_and_sample(sched, ids)
        queued, self._queued = self._queued, None
        return queued

    def run(self, sched: SchedulerOutput) -> Sampled:
        """Forward the scheduled tokens; what was sampled for the sequences that sample, in order.

        A replayed decode step has its sampling queued as soon as the step is launched, before the
        host follows the step's experts and ends it, so the tokens are ready when the host is."""
        t0 = time.perf_counter()
        graphable, eager = self._forward_and_sample(sched)
        out = self.take()
        if graphable:
            b = len(sched.seqs)
            self.model.experts.observe_step(b, eager, time.perf_counter() - t0, self.graphs.bucket(b))
        return out

    def _forward_and_sample(self, sched: SchedulerOutput, ids: torch.Tensor | None = None) -> tuple[bool, bool]:
        """Replay the step's recording (or run it eagerly) and queue its sampling; ``ids`` as in
        :meth:`launch`. Returns (whether a recording fits the step, whether it ran eagerly all the same)."""
        sampling = [s.request for s in sched.seqs if s.samples]
        b = len(sched.seqs)
        graphable = (self.use_graphs and all(s.num_new == 1 and s.samples for s in sched.seqs)
                     and self.graphs.bucket(b) is not None)
        # eager instead, where the host may give missing experts to the CPU (engine/experts/cold.py);
        # the recording the step would replay is its bucket's
        eager = graphable and self.model.experts.eager_for(b, self.graphs.bucket(b))
        if graphable and not eager:
            self.graphs.run(self.decode_inputs(sched, ahead=ids is not None),
                            then=lambda logits: self._queue_sample(logits, sampling), ids=ids)
        else:
            self._queue_sample(self.model.forward(self.build_batch(sched, ids), self.cache), sampling)   # [B', V]
        return graphable, eager

    def _queue_sample(self, logits: torch.Tensor, reqs: list[Request]) -> None:
        """Queue the sampling of ``logits`` [B, V] and the copy of its results to the host.

        Rows with a guide are masked first (their bitmasks are filled on the host while the device
        runs the step); logprobs are taken from the raw logits. Neither costs a kernel when no row
        of the step asks for it."""
        self._queued = None
        if not reqs:
            return
        staging = self._stagings[self._turn]      # the next set only once this one holds a step (below)
        guided = [i for i, r in enumerate(reqs) if r.guide_on()]
        masked, failed = self._mask(logits, reqs, guided) if guided else (logits, {})
        penalised = any(r.params.repetition_penalty != 1.0 for r in reqs)
        tokens = sample(masked, [r.params for r in reqs], [r.generator for r in reqs],
                        [r.all_ids for r in reqs] if penalised else None)              # [B]
        queued = _Queued(staging.stage("tokens", tokens), reqs, staging, tokens, failed=failed)
        queued.asked = [i for i, r in enumerate(reqs) if r.params.logprobs is not None]
        if queued.asked:
            values, ids = token_logprobs(logits, tokens, queued.asked,
                                         max(reqs[i].params.logprobs for i in queued.asked))
            queued.values, queued.ids = staging.stage("values", values), staging.stage("ids", ids)
        staging.mark()
        self._turn ^= 1           # a sampling that failed midway leaves the set to the step retried after it
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

    def take(self, q: _Queued | None = None) -> Sampled:
        """What a queued sampling drew (default: the last one queued), read back once its copies have
        landed (empty when none)."""
        if q is None:
            q, self._queued = self._queued, None
        if q is None:
            return Sampled([])
        q.staging.wait()
        tokens = q.tokens.tolist()
        if not q.asked:
            return Sampled(tokens, failed=q.failed)
        logprobs: list[TokenLogprob | None] = [None] * len(tokens)
        for row, values, ids in zip(q.asked, q.values.tolist(), q.ids.tolist()):
            n = q.reqs[row].params.logprobs
            logprobs[row] = TokenLogprob(tokens[row], values[0], tuple(zip(ids[:n], values[1:n + 1])))
        return Sampled(tokens, logprobs, q.failed)
