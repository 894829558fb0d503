"""CUDA-graph replay of decode steps (DESIGN.md §1 rule 5).

One recording per batch-size bucket, captured lazily on first use into one memory pool. A step pads
its batch up to the bucket: padding rows write their K/V into a scratch block that no request owns
and read one token of it, so they never touch a real sequence. A cache with a window group (its
sliding-window layers in a pool of their own) has a second set of recorded slots and block tables,
padded with that pool's scratch block, which is also what the freed entries of window tables hold.

When every expert is resident the slot tables never change and a whole step is one graph. With an
offloaded expert pool each MoE layer needs the host between its routing and its expert GEMMs (read
the ids, copy the misses, push the slot-table row, issue prefetches), so the step is recorded in
pieces: graph ``j`` runs from the expert GEMMs of MoE layer ``j - 1`` up to the routing of MoE layer
``j`` (attention, norms, router, the prefetch prediction) and ends by storing the ids and predictions
into pinned host memory; the host waits for it, resolves layer ``j``'s experts, launches the next
piece and only then issues the prefetch copies, so that host work overlaps the GPU's. The GEMMs
read the slot-table row and the pool views at fixed addresses, so one recording serves every step
until the pool is resized or the look-ahead changes (``reset``). A step then costs one graph launch
and one host wait per MoE layer instead of dozens of kernel launches.

When the expert provider reads missing experts directly from host memory (``direct_for``: decode
steps of a few tokens), the step is again one graph: each MoE layer snapshots
its slot-table row and publishes its ids, the slots they found and its predictions into pinned
memory, and the host follows the running graph (``follow_published``), issuing prefetch copies
without the GPU ever waiting for it. Such a step is recorded twice: with the predictions and the
GPU-side prefetch, and ``quiet``, without them, which replays on the steps where the prefetch gate
lets no prefetch through (``predicts``), so those steps do not pay for guesses nobody uses.
"""
from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from engine.experts.readback import pinned_ids
from engine.experts.replay import ReplayHooks
from engine.kv.cache import KVCache
from engine.models.moe_transformer import DecodeMeta, ForwardBatch, MoETransformer

BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128)
WHOLE_TABLES_MAX = 1 << 16   # int32s: block tables (every row) and lengths up to this go over in one copy



_CAPTURE_STREAMS: dict[int, tuple[torch.cuda.Stream, threading.Lock]] = {}
_STREAMS_LOCK = threading.Lock()


@contextlib.contextmanager
def capture_stream(device: torch.device):
    """The one side stream of this process on ``device`` that decode steps warm up and record on, held
    for the recording: engines of one card that record at once from threads of their own take turns,
    so no engine's warm-up lands in another's open capture.

    cuBLAS keeps a workspace for every stream it runs on (32 MiB on Hopper), held until the process
    ends, since the recorded graphs that use it may outlive any engine: a new stream for each
    recording would leave one more behind per step size and per engine loaded in the process."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    with _STREAMS_LOCK:
        if index not in _CAPTURE_STREAMS:
            _CAPTURE_STREAMS[index] = (torch.cuda.Stream(torch.device("cuda", index)), threading.Lock())
        stream, lock = _CAPTURE_STREAMS[index]
    with lock:
        yield stream


@dataclass
class DecodeInputs:
    """The host side of one decode step, a row per sequence: its new token, that token's position and
    cache slot, the sequence's block table and its context length after the step."""

    ids: list[int]
    positions: list[int]
    slots: list[int]
    tables: list[list[int]]
    lens: list[int]
    window_slots: list[int] = field(default_factory=list)          # the window group's, when the cache has one
    window_tables: list[list[int]] = field(default_factory=list)


@dataclass
class _Cut:
    """Where piece ``j`` ends: MoE layer ``moe_index`` routed; its ids (and the prediction made for
    later layers) are published into the pinned ``region`` by the piece itself."""

    moe_index: int
    shape: tuple[int, int]        # (T, k) of the recorded ids
    predicted: Any                # the provider's prediction handle, or None
    region: torch.Tensor          # pinned int64 host memory


@dataclass
class _Recording:
    """One bucket's decode step: ``graphs[j]`` ends at ``cuts[j]``; the last graph ends with the logits."""

    graphs: list[torch.cuda.CUDAGraph]
    logits: torch.Tensor
    cuts: list[_Cut] = field(default_factory=list)
    direct: bool = False            # one graph that publishes every layer (direct reads)
    regions: torch.Tensor | None = None
    quiet: "_Recording | None" = None   # direct reads: the same step recorded without predictions
    claims: tuple[int, ...] = ()    # direct reads: the layers its GPU-side prefetch claims for


class DecodeGraphs:
    def __init__(self, model: MoETransformer, cache: KVCache, max_batch: int, max_blocks: int,
                 scratch_block: int, window_scratch: int | None = None) -> None:
        self.model, self.cache = model, cache
        self.buckets = [b for b in BUCKETS if b < max_batch] + [max_batch]
        self.max_blocks, self.scratch_block, self.window_scratch = max_blocks, scratch_block, window_scratch
        groups = 1 if window_scratch is None else 2                       # block groups: full, window
        self.scratch_slots = [scratch_block * cache.block_size] + \
            ([] if window_scratch is None else [window_scratch * cache.block_size])
        self.scratch_slot = self.scratch_slots[0]
        n, dev = self.buckets[-1], model.device
        # The recorded inputs, at fixed addresses: ids, positions and each group's slots in one int64
        # buffer; block tables (each group's) and context lengths in one int32 buffer. A step's values
        # cross from page-locked staging in a few asynchronous copies and no kernel (``_load``).
        self._in64 = torch.zeros(2 + groups, n, dtype=torch.int64, device=dev)
        self.ids, self.positions, self.slots = self._in64[0], self._in64[1], self._in64[2]
        self.window_slots = self._in64[3] if groups == 2 else None
        for g, slot in enumerate(self.scratch_slots):
            self._in64[2 + g].fill_(slot)
        self._in32 = torch.empty(n * (groups * max_blocks + 1), dtype=torch.int32, device=dev)
        self.tables, self.lens, self.window_tables = self._split32(self._in32, n)
        self.tables.fill_(scratch_block)
        self.lens.fill_(1)
        if self.window_tables is not None:
            self.window_tables.fill_(window_scratch)
        self.pad = torch.zeros(n, dtype=torch.bool, device=dev)          # rows past the real batch
        self._warm_pad = torch.ones(n, dtype=torch.bool, device=dev)     # a warm-up's: no row is real
        pin = dev.type == "cuda"
        self._h64 = torch.zeros(2 + groups, n, dtype=torch.int64, pin_memory=pin)
        self._h32 = torch.full((n * (groups * max_blocks + 1),), scratch_block, dtype=torch.int32, pin_memory=pin)
        self._h_tables, self._h_lens, self._h_window_tables = self._split32(self._h32, n)   # one copy for all
        self._h_lens.fill_(1)
        if self._h_window_tables is not None:
            self._h_window_tables.fill_(window_scratch)
        self._h_pad = torch.zeros(n, dtype=torch.bool, pin_memory=pin)
        self._h_width = [0] * groups                                    # widest table row staged so far, per group
        self._copied: torch.cuda.Event | None = None                     # after the last staged inputs' copies
        self.graphs: dict[int, _Recording] = {}
        self.pool = None
        self.replays = 0

    def _split32(self, buf: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The int32 buffer's views: block tables [n, max_blocks], lengths [n], window tables (or None)."""
        m = n * self.max_blocks
        window = None if self.window_scratch is None else buf[m + n:].view(n, self.max_blocks)
        return buf[:m].view(n, self.max_blocks), buf[m:m + n], window

    def bucket(self, b: int) -> int | None:
        return next((x for x in self.buckets if x >= b), None)

    def _batch(self, b: int, warm_up: bool = False) -> ForwardBatch:
        """The recorded inputs of bucket ``b`` as a batch; its padding rows (every row in a ``warm_up``,
        which is no step of anyone's) are left out of the experts' counts."""
        window = None if self.window_scratch is None else \
            ForwardBatch(self.ids[:b], self.positions[:b], self.window_slots[:b], [], None,
                         DecodeMeta(self.window_tables[:b], self.lens[:b]))
        pad = (self._warm_pad if warm_up else self.pad)[:b]
        return ForwardBatch(self.ids[:b], self.positions[:b], self.slots[:b], [], None,
                            DecodeMeta(self.tables[:b], self.lens[:b], pad=pad), window=window)

    def _capture(self, b: int) -> None:
        with capture_stream(self.model.device) as side:
            self._capture_on(b, side)

    def _capture_on(self, b: int, side: torch.cuda.Stream) -> None:
        dev = self.model.device
        side.wait_stream(torch.cuda.current_stream(dev))
        hooks = self.model.experts.replay_hooks
        # Warm-up (Triton compiles, cuBLAS plans, allocator caches) with every shape the recording
        # will use: predictions cover the full prefetch depth there, whatever the prefetch gate says
        # now, so nothing is compiled or planned for the first time inside a capture.
        with hooks.recording() if hooks is not None else contextlib.nullcontext():
            with torch.cuda.stream(side):
                for _ in range(2):
                    self.model.forward(self._batch(b, warm_up=True), self.cache)
        torch.cuda.current_stream(dev).wait_stream(side)
        torch.cuda.synchronize(dev)
        # No garbage collection while recording: collecting an unreachable CUDA graph (an engine
        # dropped earlier, a re-recorded step) destroys it, which is not permitted while a stream is
        # capturing and invalidates the recording. Collect now, then pause the collector.
        collect = gc.isenabled()
        gc.collect()
        gc.disable()
        try:
            rec = self.graphs[b] = self._record(b, side)
            if rec.direct and hooks is not None and hooks.prefetch_depth > 0:
                rec.quiet = self._capture_quiet(b, hooks, side)
        finally:
            if collect:
                gc.enable()

    def _record(self, b: int, side: torch.cuda.Stream) -> _Recording:
        hooks = self.model.experts.replay_hooks
        if hooks is None or hooks.static:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool, stream=side):
                logits = self.model.forward(self._batch(b), self.cache)
            self.pool = graph.pool()
            return _Recording([graph], logits)
        if hooks.direct_for(b):
            return self._capture_direct(b, hooks, side)
        return self._capture_pieces(b, side, hooks)

    def _capture_direct(self, b: int, experts: ReplayHooks, side: torch.cuda.Stream,
                        quiet: bool = False) -> _Recording:
        """Record one direct-read decode step as a single graph (see the module docstring)."""
        k = self.model.spec.top_k
        width = b * k * (3 + experts.prefetch_depth)            # ids, slots found, fill slots, predicted layers
        regions = pinned_ids(self.model.spec.num_moe_layers * width).view(-1, width)
        rec = _Recording([], torch.empty(0), direct=True, regions=regions)

        def publish(moe_index: int, topk_ids: torch.Tensor, predicted: Any) -> tuple:
            # Padding rows take row 0's experts (in the publish kernel), so they add no reads of their own.
            region = regions[moe_index]
            rec.cuts.append(_Cut(moe_index, (b, k), predicted, region))
            return experts.publish_direct(moe_index, topk_ids, predicted, region, self.pad[:b])

        experts.prepare_direct_capture()
        graph = torch.cuda.CUDAGraph()
        with experts.recording(quiet):
            with torch.cuda.graph(graph, pool=self.pool, stream=side):
                rec.logits = self.model.forward(self._batch(b), self.cache, acquire=publish)
        self.pool = graph.pool()
        rec.graphs.append(graph)
        rec.claims = experts.recorded_claims()
        return rec

    def _capture_quiet(self, b: int, experts: ReplayHooks, side: torch.cuda.Stream) -> _Recording:
        """The direct-read step recorded again with the experts' predictions off (``quiet``), for the
        steps where nothing would use them (``predicts``); same kernels, so no warm-up is needed."""
        return self._capture_direct(b, experts, side, quiet=True)

    def _capture_pieces(self, b: int, stream: torch.cuda.Stream, experts: ReplayHooks) -> _Recording:
        """Record one decode step as a graph per MoE layer boundary (see the module docstring)."""
        rec = _Recording([], torch.empty(0))
        graph = torch.cuda.CUDAGraph()
        k = self.model.spec.top_k
        width = b * k * (1 + experts.prefetch_depth)            # ids, then up to depth predicted layers
        regions = pinned_ids(self.model.spec.num_moe_layers * width).view(-1, width)

        def cut(moe_index: int, topk_ids: torch.Tensor, predicted: Any) -> tuple[torch.Tensor, dict]:
            nonlocal graph
            # Padding rows take row 0's experts: the host resolves only the real rows' experts, and
            # the GEMMs of the next piece must find every expert they read resident.
            topk_ids.copy_(torch.where(self.pad[:b, None], topk_ids[:1], topk_ids))
            region = regions[len(rec.cuts)]
            experts.publish(topk_ids, predicted, region)
            graph.capture_end()
            self.pool = graph.pool()
            rec.graphs.append(graph)
            rec.cuts.append(_Cut(moe_index, (b, k), predicted, region))
            graph = torch.cuda.CUDAGraph()
            graph.capture_begin(pool=self.pool)
            return experts.slot_table(moe_index)

        with experts.recording():
            with torch.cuda.stream(stream):
                graph.capture_begin(pool=self.pool)
                try:
                    rec.logits = self.model.forward(self._batch(b), self.cache, acquire=cut)
                finally:
                    graph.capture_end()
            self.pool = graph.pool()
            rec.graphs.append(graph)
        torch.cuda.current_stream(self.model.device).wait_stream(stream)
        return rec

    def run(self, inputs: DecodeInputs, then: Callable[[torch.Tensor], Any] | None = None,
            ids: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [B, V] of a decode step, replayed from the recording of its bucket. ``then(logits)``
        is called as soon as the step is launched (to queue work on the logits, e.g. sampling), before
        the host follows the step's experts and ends the step. ``ids``: the input tokens on the device
        (int64 [B], e.g. the last step's draws), in place of ``inputs.ids``."""
        b = len(inputs.ids)
        n = self.bucket(b)
        self._load(inputs, b, n, ids)
        if n not in self.graphs:
            self._capture(n)
            self._load(inputs, b, n, ids)          # capture's warm-up ran on these buffers; reload them
        rec = self.graphs[n]
        launched = then or (lambda logits: None)
        experts = self.model.experts.replay_hooks
        if rec.direct and experts is not None:
            experts.begin_step(keep_ended=True)
            try:
                predicting = rec.quiet is None or experts.predicts(b)
                rec = rec if predicting else rec.quiet
                experts.start_direct_step(rec.regions, b, predicting, rec.claims)
                rec.graphs[0].replay()
                try:
                    launched(rec.logits[:b])
                    experts.follow_published(rec.cuts, b)   # and the last step's end, while this one computes
                except BaseException:
                    experts.abort_replay()         # no join of the CPU's share waits for a host that stopped
                    raise
            finally:
                experts.end_step()
            experts.arm_next_step()                # while the GPU finishes this step
        elif not rec.cuts or experts is None:
            rec.graphs[0].replay()
            launched(rec.logits[:b])
        else:
            experts.begin_step()
            try:
                rec.graphs[0].replay()
                for c, graph in zip(rec.cuts, rec.graphs[1:]):
                    experts.acquire_published(c.moe_index, c.region, c.shape, b, c.predicted)
                    graph.replay()                 # the GPU computes while the host issues prefetches
                    experts.issue_prefetch()
                launched(rec.logits[:b])
            finally:
                experts.end_step()
        self.replays += 1
        return rec.logits[:b]

    def _load(self, inp: DecodeInputs, b: int, n: int, ids: torch.Tensor | None = None) -> None:
        """Stage ``inp`` (padded to bucket ``n``) and copy it into the recorded inputs; ``ids`` (int64
        [b] on the device), where given, replace ``inp.ids``. Padding rows point at the scratch block
        (each group's) and read one token of it. The staging is reused by the next step: one launched
        before this one's tokens were read back waits, here, for these copies to have run. Written
        through numpy views: building tensors from the lists cost as much as the copies."""
        if self._copied is not None:
            self._copied.synchronize()
        h64 = self._h64.numpy()
        h64[0, :b], h64[1, :b], h64[2, :b] = inp.ids, inp.positions, inp.slots
        h64[0:2, b:n] = 0
        groups = [(inp.tables, self._h_tables, self.scratch_block)]
        if self.window_scratch is not None:
            h64[3, :b] = inp.window_slots
            groups.append((inp.window_tables, self._h_window_tables, self.window_scratch))
        for g, (tables, staged, scratch) in enumerate(groups):
            h64[2 + g, b:n] = self.scratch_slots[g]
            self._h_width[g] = _stage_tables(staged.numpy(), tables, n, scratch, self._h_width[g])
        lens = self._h_lens.numpy()
        lens[:b], lens[b:n] = inp.lens, 1
        pad = self._h_pad.numpy()
        pad[:b], pad[b:n] = False, True
        self._in64.copy_(self._h64, non_blocking=True)
        if self._h32.numel() <= WHOLE_TABLES_MAX:             # block tables and lengths in one copy
            self._in32.copy_(self._h32, non_blocking=True)
        else:
            self.tables[:n].copy_(self._h_tables[:n], non_blocking=True)
            self.lens[:n].copy_(self._h_lens[:n], non_blocking=True)
            if self.window_tables is not None:
                self.window_tables[:n].copy_(self._h_window_tables[:n], non_blocking=True)
        self.pad[:n].copy_(self._h_pad[:n], non_blocking=True)
        if ids is not None:
            self.ids[:b].copy_(ids, non_blocking=True)
        if self._h64.is_pinned():
            if self._copied is None:
                self._copied = torch.cuda.Event()
            self._copied.record()

    def reset(self) -> None:
        """Drop every graph (after a change that invalidates them, e.g. a different expert pool)."""
        self.graphs.clear()
        self.pool = None


def _stage_tables(staged: np.ndarray, tables: list[list[int]], n: int, scratch: int, width: int) -> int:
    """Write ``tables`` (one per real row) into ``staged`` [N, max_blocks], rows past them up to ``n``
    and columns past each table up to the widest staged so far holding ``scratch``; every column
    from the returned width on holds ``scratch`` already. Returns the new widest width."""
    width = max(width, max(len(t) for t in tables))
    for row, t in zip(staged, tables):
        row[:len(t)] = t
        row[len(t):width] = scratch
    staged[len(tables):n, :width] = scratch
    return width
