"""``OffloadedExperts``: the ExpertProvider that keeps hot experts on the GPU and streams the rest.

Per engine step and MoE layer ``l`` the model calls ``before_layer(l, hidden)`` then
``acquire(l, topk_ids)``:

* ``before_layer`` guesses the experts of layers ``l+1 .. l+depth`` by applying their routers to
  ``hidden`` (on the device, no sync).
* ``acquire`` reads layer ``l``'s ids (and those guesses) to the host in one counted sync, copies
  the missing experts on demand (counted misses), makes the compute stream wait for exactly the
  copies it uses, pushes row ``l`` of the slot table, and then issues the prefetch copies, so they
  run while layer ``l`` computes. Misses are copied before prefetches and on their own stream.
* A decode step replayed from CUDA graphs (engine/cuda_graphs.py) has each graph piece publish its
  ids into pinned memory (``publish``); ``acquire_published`` then only waits and reads, and the
  prefetches are issued (``issue_prefetch``) after the next piece is launched, so the host's
  bookkeeping overlaps the GPU's work.
* With a pool that holds every expert the table is static and ``acquire`` never syncs.

Direct reads (engine/experts/direct.py): decode steps of a few tokens at prefetch depth >= 1 read
missing experts straight from the mapped host store and never wait for the host. Host-side prefetch
copies live in engine/experts/host_prefetch.py, ``reconfigure`` in engine/experts/live_changes.py.

Pinned against eviction: the experts of the current layer and every prefetched expert until its
layer has run. Keys are store rows, ``layer * E + expert``.

Legend: T tokens, k experts per token, E experts, L MoE layers, D hidden.
"""
from __future__ import annotations

import contextlib
import dataclasses
import time
from pathlib import Path
from typing import Iterator, Sequence

import torch

from engine.errors import ConfigError
from engine.experts.books import PrefetchLedger
from engine.experts.counters import ResidencyCounters
from engine.experts.device_prefetch import DevicePrefetcher
from engine.experts.direct import DirectReads
from engine.experts.host_prefetch import HostPrefetch
from kernels.expert_layout import ExpertLayout
from engine.experts.live_changes import LiveChanges, check_depth
from engine.experts.policies import make_policy
from engine.experts.policy import DEFAULT_LFU_DECAY, StaticPolicy
from engine.experts.pool import ExpertPool
from engine.experts.predictor import ExpertPredictor
from engine.experts.prefetch import ClaimGate, Prediction, PrefetchGate, RouteFn
from engine.experts.readback import HostReader
from engine.experts.profile import check_routing_profile, read_routing_profile
from engine.experts.step_books import StepBooks
from engine.experts.store import HostExpertStore
from engine.experts.tuning import ResidencyTuning
from engine.telemetry import ExpertStats



class OffloadedExperts(DirectReads, HostPrefetch, LiveChanges):
    """Byte-budgeted device pool over a host store, with prefetch, policies and live resizing.

    ``pool_bytes`` buys ``pool_bytes // layout.nbytes`` pool slots (None: every expert); a pool
    smaller than all experts also takes ``2 E`` staging slots. ``budget_bytes`` caps the device
    bytes of slots and staging together. ``routers`` are the ``[E, D]`` router weights of every
    MoE layer in order, ``route_fn(logits [T, E]) -> (weights [T, k], ids [T, k])`` the model's
    routing. ``routing_profile`` (a path or counts ``[L][E]``) is needed by the static policy.
    ``direct_reads``: None (default) reads missing experts directly where the kernels can (CUDA with
    a mapped host store); True forces it (also on CPU, where "host" and "device" are both RAM);
    False never. ``top_k`` (the model's experts per token) lets decode steps on CUDA predict with
    one kernel instead of a matmul and the routing kernel. ``tuning`` holds the measured thresholds
    (:class:`engine.experts.tuning.ResidencyTuning`); a caller may replace it between steps.
    """

    def __init__(self, layout: ExpertLayout, store: HostExpertStore, num_experts: int,
                 device: torch.device | str, pool_bytes: int | None, prefetch_depth: int, policy: str,
                 routers: Sequence[torch.Tensor], route_fn: RouteFn, *,
                 routing_profile: str | Path | Sequence[Sequence[int]] | None = None,
                 budget_bytes: int | None = None, lfu_decay: float = DEFAULT_LFU_DECAY,
                 direct_reads: bool | None = None, top_k: int | None = None,
                 router_bias: Sequence[torch.Tensor] | None = None, norm_eps: float = 1e-6,
                 tuning: ResidencyTuning | None = None) -> None:
        if store.num_experts != num_experts or len(routers) != store.num_layers or store.layout != layout:
            raise ValueError(f"store is {store.num_layers} x {store.num_experts} ({store.layout.fmt}); got "
                             f"{len(routers)} routers, {num_experts} experts, layout {layout.fmt}")
        self.layout, self.store = layout, store
        self.num_layers, self.num_experts = store.num_layers, num_experts
        self.device = torch.device(device)
        self.tuning = tuning or ResidencyTuning()
        self.predictor = ExpertPredictor(routers, route_fn, self.device, top_k, router_bias, norm_eps,
                                         self.tuning.predict_max_layers)
        self._reader = HostReader(self.device)
        self.prefetch_depth = check_depth(prefetch_depth, ConfigError)
        self._lfu_decay = lfu_decay
        self._profile = self._load_profile(routing_profile)
        self.policy = make_policy(policy, self._profile, lfu_decay)
        slots = self._slots_for(pool_bytes)
        keep = self.policy.place(slots) if isinstance(self.policy, StaticPolicy) else []
        self.pool = ExpertPool(store, self.device, slots, keep, budget_bytes)
        self._seed(self.policy, self.pool.resident_keys())
        self.counters = ResidencyCounters(self.num_layers, num_experts, self.device)
        self.prefetches = PrefetchLedger(self.counters)   # unused prefetches; counts hits and waste
        self._prefetched: dict[int, int] = {}      # key -> layer it was fetched for, pinned until then
        self.gate = PrefetchGate()
        self._current: set[int] = set()            # keys of the layer being computed
        self._predicted: Prediction | None = None
        self._last_layer = -1
        self._in_step = False
        self._owns_store = False
        self._capturing = False    # while decode steps are recorded into CUDA graphs (see recording)
        self._pending_prefetch: tuple[list[int], torch.Tensor] | None = None
        self._named: dict[int, set[int]] = {}      # layer -> keys this step's predictions named for it
        self._init_direct_reads(direct_reads)

    @classmethod
    def from_rows(cls, layout: ExpertLayout, rows: torch.Tensor, num_experts: int, device: torch.device | str,
                  pool_bytes: int | None, prefetch_depth: int, policy: str, routers: Sequence[torch.Tensor],
                  route_fn: RouteFn, **options) -> "OffloadedExperts":
        """Build over loader-filled host rows ``uint8 [L * E, nbytes]``, page-locked in place on CUDA.

        The provider then owns the store and releases it in :meth:`close`. ``options`` are the
        keyword options of the constructor.
        """
        dev = torch.device(device)
        store = HostExpertStore.from_rows(rows, num_experts, layout, pin=dev.type == "cuda", device=dev)
        out = cls(layout, store, num_experts, dev, pool_bytes, prefetch_depth, policy, routers, route_fn, **options)
        out._owns_store = True
        return out

    def _init_direct_reads(self, direct_reads: bool | None) -> None:
        """The state of direct-read steps: snapshots, fill slots, GPU-side prefetch, deferred ends."""
        E = self.num_experts
        self._direct_opt = direct_reads
        if direct_reads and self.device.type == "cuda" and not self.store.direct_readable(self.device):
            raise ConfigError("direct expert reads need pinned host memory mapped for the GPU and Triton; "
                              "this host store is not readable from kernels (leave direct_reads unset)")
        if direct_reads is None and self.device.type == "cuda":
            self.store.direct_readable(self.device)         # probe now, outside any graph capture
        self._snap = torch.full((self.num_layers, E), -1, dtype=torch.int32, device=self.device)
        self._host_views: dict[str, torch.Tensor] | None = None
        self._mode: str | None = None               # "sync" or "direct": how the last step resolved experts
        self._step_mode: str | None = None           # this step's ("captured" while recording a graph)
        self.books = StepBooks()                     # the running step's books (engine/experts/step_books.py)
        self.admit_per_step = max(1, E // 2)
        # fills: the kernels keep a directly read expert in a leased staging slot as they read it
        self._fill = torch.full((self.num_layers, E), -1, dtype=torch.int32, device=self.device)
        # [next, count] then the step's fill slots, uploaded in one copy from page-locked staging that
        # is reused once the last upload has run (a step later: steps start after the last one's tokens)
        self._fill_info = torch.zeros(2 + E, dtype=torch.int32, device=self.device)
        self._fill_meta, self._fill_free = self._fill_info[:2], self._fill_info[2:]
        cuda = self.device.type == "cuda"
        self._h_fill_info = torch.zeros(2 + E, dtype=torch.int32, pin_memory=cuda)
        self._fill_uploaded = torch.cuda.Event() if cuda else None
        # GPU-side prefetch of direct-read steps (engine/experts/device_prefetch.py)
        self._dp = (DevicePrefetcher(self.num_layers, E, E, self.device)
                    if DevicePrefetcher.usable(self.device, self.layout.nbytes) else None)
        self.claims = ClaimGate(threshold=self.tuning.device_prefetch_threshold)   # GPU-side claims it makes (by rank)
        self._quiet = False                          # True while a decode graph without predictions is recorded
        # a replayed direct-read step's end is deferred until the next step is launched (finish_ended)
        self._ended: StepBooks | None = None         # the books of the step whose end is deferred
        self._armed: list[int] | None = None         # fill slots leased and uploaded for the next step
        self._defer_end = False                      # this step's end may be deferred (set per replay)
        self._live_leases: frozenset[int] = frozenset()   # staging slots the step in flight leased
        # eager direct-read steps defer their ends as replayed ones do: how the CPU tests drive the
        # deferred end, which on CUDA only a graph replay uses
        self.defer_eager_ends = False

    # ---- ExpertProvider ----------------------------------------------------------------------
    def begin_step(self, keep_ended: bool = False) -> None:
        """A forward pass starts: forget the last step's leases and pins, age the policy.

        Staging slots that a direct-read step left with copies in flight stay leased (see
        :meth:`_end_direct_step`). A replayed direct-read step whose end was deferred is ended first,
        unless ``keep_ended``: the replay of the next one ends it once launched (:meth:`finish_ended`)."""
        if not keep_ended and not (self.device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
            self.finish_ended()
        if self._mode == "direct":
            self._forget_step()
        else:
            self._release_all()
        self._step_mode = None
        self.books.misses = []
        self.books.fill_slots, self.books.filled = None, {}
        self._predicted = None
        self._named = {}
        # the adaptive policy's shadow pools admit as this pool does
        self.policy.admit_per_step = self.admit_per_step if self._mode == "direct" else None
        self.policy.tick()
        self._in_step = True
        self.gate.tick()

    @property
    def replay_hooks(self) -> "OffloadedExperts | None":
        """What DecodeGraphs drives (:class:`engine.experts.replay.ReplayHooks`); None while every
        expert has a slot, since such a step is recorded whole."""
        return None if self.pool.full else self

    @contextlib.contextmanager
    def recording(self, quiet: bool = False) -> Iterator[None]:
        """While decode steps are warmed up or recorded into CUDA graphs: predictions cover the full
        depth; ``quiet`` records a step with no predictions (see ``predicts``)."""
        self._capturing, self._quiet = True, quiet
        try:
            yield
        finally:
            self._capturing, self._quiet = False, False

    def slot_table(self, moe_index: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The device slot-table row ``[E] int32`` of MoE layer ``moe_index`` and the pool's views."""
        return self.pool.table[moe_index], self.pool.views

    @property
    def static(self) -> bool:
        """True while the slot table cannot change (every expert has a pool slot): no host work per layer."""
        return self.pool.full

    def before_layer(self, moe_index: int, hidden: torch.Tensor) -> Prediction | None:
        """Predict layers ``moe_index+1 .. +depth`` from ``hidden [T, D]`` (device work, no sync).

        While :meth:`recording` (a decode step being recorded into CUDA graphs) the prediction covers the
        full ``prefetch_depth``, since the gate's depth changes from step to step; ``acquire`` keeps
        only the distances the gate allows. A step whose predictions the GPU copies in itself
        predicts only what it claims: layer ``moe_index + depth`` (every layer up to it from the
        first MoE layer). Returns the prediction, also kept for ``acquire``.
        """
        self._predicted = None
        if self.pool.full or self.prefetch_depth == 0 or self._quiet:
            return None
        device_side = self._device_prefetch_for(hidden.shape[0])
        full = self._capturing or device_side
        depth = self.prefetch_depth if full else self.gate.depth(self.prefetch_depth)
        layers = list(range(moe_index + 1, min(moe_index + depth, self.num_layers - 1) + 1))
        if device_side and moe_index > 0:        # the GPU claims only for the farthest layer
            layers = [t for t in layers if t == moe_index + self.prefetch_depth]
        if not layers:
            return None
        ids = self.predictor.predict(hidden, layers[0], len(layers))                    # [P, T, k]
        self._predicted = (moe_index, layers, ids)
        if device_side:
            self._launch_device_prefetch(moe_index, layers, ids)
        return self._predicted

    def acquire(self, moe_index: int, topk_ids: torch.Tensor, predicted: Prediction | None = None,
                defer_prefetch: bool = False) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Make the experts of ``topk_ids [T, k]`` resident; returns ``(slot_of_expert [E] int32, views)``.

        ``predicted`` is what ``before_layer`` returned for this layer (default: the one it kept).
        With ``defer_prefetch`` the prefetch copies wait for :meth:`issue_prefetch`, so a caller can
        launch the layer's compute first and let the host's prefetch work overlap it.
        """
        if self.pool.full:
            self.counters.device_tally.add(moe_index, topk_ids)
            return self.pool.table[moe_index], self.pool.views
        if predicted is not None:
            self._predicted = predicted
        if self._step_mode == "direct" or (self._step_mode is None and self.direct_for(topk_ids.shape[0])):
            return self._acquire_direct(moe_index, topk_ids)
        self._enter_mode("sync")
        ids, predicted = self._read_ids(moe_index, topk_ids)
        return self._acquire_host(moe_index, ids, predicted, defer_prefetch)

    def publish(self, topk_ids: torch.Tensor, predicted: Prediction | None, region: torch.Tensor) -> None:
        """Device work only (graph-capturable): write ``topk_ids [T, k]`` and then the predicted ids
        ``[P, T, k]`` into the pinned host ``region`` for :meth:`acquire_published` to read."""
        flat = topk_ids.reshape(-1).to(torch.int64)
        self._reader.publish(flat if predicted is None else torch.cat([flat, predicted[2].reshape(-1)]), region)

    def acquire_published(self, moe_index: int, region: torch.Tensor, shape: tuple[int, int], rows: int,
                          predicted: Prediction | None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """:meth:`acquire` for ids a recorded graph has published into ``region``; prefetches deferred.

        ``shape`` is ``(T, k)`` as recorded, ``rows`` how many leading rows are real this step.
        """
        if self.pool.full:
            raise RuntimeError("a pool holding every expert needs no published ids; record the step whole")
        self._enter_mode("sync")
        self.policy.catch_up()                     # the GPU computes meanwhile
        self.counters.host_syncs += 1
        t0 = time.perf_counter()
        self._reader.wait()
        t, k = shape
        host = region[:t * k * (1 + (len(predicted[1]) if predicted is not None else 0))].clone()
        self.counters.sync_ms += (time.perf_counter() - t0) * 1e3
        ids = host[:t * k].view(t, k)[:rows].reshape(-1)
        pred = None
        if predicted is not None:
            depth = self.gate.depth(self.prefetch_depth)
            if depth > 0:
                pred = (predicted[1][:depth], host[t * k:].view(-1, t, k)[:depth, :rows])
        return self._acquire_host(moe_index, ids, pred, defer_prefetch=True)

    def _acquire_host(self, moe_index: int, ids: torch.Tensor, predicted: tuple | None,
                      defer_prefetch: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Host half of acquire: ``ids`` int64 [T*k] and ``predicted`` (layers, ids [P, T, k]) on the host."""
        self._enter_layer(moe_index)
        base = moe_index * self.num_experts
        id_list = ids.tolist()
        keys = [base + e for e in sorted(set(id_list))]
        self._current = set(keys)
        slot_of = self.pool.slot_of
        misses = [k for k in keys if slot_of[k] < 0]
        self._count_predicted(moe_index, misses)
        if predicted is not None:
            self._note_predicted(*predicted)
        for k in keys:
            distance = self.prefetches.take(k) if slot_of[k] >= 0 else None
            if distance is not None:
                self.prefetches.count(hit=True)
                self.gate.on_use(distance)
        pinned = self._current | self._prefetched.keys()
        pairs = [(self._slot_for(k, moe_index, pinned, demand=True), k) for k in misses]
        self.pool.load(pairs, demand=True)
        self.policy.touch(keys)
        self.counters.record(moe_index, id_list, len(keys) - len(misses), len(misses))
        for k in [k for k, j in self._prefetched.items() if j <= moe_index]:
            del self._prefetched[k]                  # its layer has come: no longer pinned
        self.pool.copies.wait_for([slot_of[k] for k in keys])
        row = self.pool.push_row(moe_index)
        self._pending_prefetch = predicted
        if not defer_prefetch:
            self.issue_prefetch()
        return row, self.pool.views

    def end_step(self) -> None:
        """The forward pass is over: staging leases and prefetch pins end with it."""
        t0 = time.perf_counter()
        try:
            self._end_step()
        finally:
            self.counters.step_end_ms += (time.perf_counter() - t0) * 1e3

    def _end_step(self) -> None:
        if self._dp is not None and self.books.dp_active and not self.books.dp_replay:
            self._dp.join()                          # recorded too when the step is being captured
            if self._step_mode == "captured":
                self._dp.recorded_targets = list(self._dp.targets)
                self.books.dp_active = False
        if self._step_mode == "direct":
            if self._ended is not None:
                self.finish_ended()
            if self._defer_end and self.books.fill_slots and not self.books.host_prefetched:
                self._ended = self._close_direct_step()
            else:
                self._end_direct_step()
        elif self._step_mode == "sync" or (self._step_mode is None and self._mode != "direct"):
            self._release_all()
        self._step_mode = None
        self._in_step = False
        self._defer_end, self._live_leases = False, frozenset()
        self.prefetches.end_step()

    def settle(self) -> None:
        """End the step whose end was deferred, if any, and give back fill slots armed for a next
        step (the engine calls this once it has no more work; a test before it reads the counts)."""
        self.finish_ended()

    def stats(self) -> ExpertStats:
        """Cumulative counters (no device sync; on CUDA device-side counts may lag one call). Reading
        them changes nothing: a step whose end is deferred is counted once it ends (``settle``)."""
        return dataclasses.replace(self.counters.snapshot(self.pool), claim_threshold=self.claims.threshold,
                                   claim_use=self.claims.state(self.tuning.prefetch_per_layer),
                                   policy=self.policy.label)

    @property
    def deferred(self) -> StepBooks | None:
        """The books of the step whose end is deferred (None: no step's end is pending)."""
        return self._ended

    @property
    def armed(self) -> list[int] | None:
        """Fill slots leased and uploaded for the next replayed step (None: none are)."""
        return self._armed

    @property
    def prefetched(self) -> dict[int, int]:
        """Prefetched keys -> the layer each was fetched for; pinned against eviction until it has run."""
        return self._prefetched

    @property
    def pins(self) -> set[int]:
        """Keys no eviction may take now: the current layer's experts and every prefetched one."""
        return self._current | self._prefetched.keys()

    @property
    def device_prefetcher(self) -> DevicePrefetcher | None:
        """The GPU-side prefetch of direct-read steps (None where it cannot run)."""
        return self._dp

    def fill_upload(self) -> tuple[list[int], list[int]]:
        """The fill slots as uploaded for the GPU: ``[next, count]`` and the slots (a device read)."""
        return self._fill_meta.tolist(), self._fill_free.tolist()

    @property
    def host_sync_ms(self) -> float:
        """Host time spent waiting on those reads (includes the compute they waited for)."""
        return self.counters.sync_ms

    @property
    def host_step_end_ms(self) -> float:
        """Host time spent ending steps (counting, admissions; the GPU may be idle meanwhile)."""
        return self.counters.step_end_ms

    @property
    def host_syncs(self) -> int:
        """Device-to-host reads of routing ids so far (each one a sync on CUDA)."""
        return self.counters.host_syncs

    def describe(self) -> str:
        """One line: pool, policy, depth, how misses are read."""
        reads = "missing experts copied in"
        if self.direct_reads:
            reads = "missing experts read directly" + (", prefetched by the GPU" if self._dp is not None else "")
        return (f"{self.pool.describe()}, policy {self.policy.name}, prefetch depth {self.prefetch_depth}, "
                f"{reads}")

    def close(self) -> None:
        """Wait for copies in flight and free the device pool (the host store is the caller's)."""
        self.pool.close()
        if self._owns_store:
            self.store.close()

    # ---- internals ---------------------------------------------------------------------------
    def _load_profile(self, profile: str | Path | Sequence[Sequence[int]] | None) -> list[list[int]] | None:
        if profile is None:
            return None
        if isinstance(profile, (str, Path)):
            return read_routing_profile(profile, self.num_layers, self.num_experts)
        doc = {"format": "strata-routing-profile", "counts": [list(r) for r in profile]}
        return check_routing_profile(doc, self.num_layers, self.num_experts)

    def _read_ids(self, layer: int, topk_ids: torch.Tensor) -> tuple[torch.Tensor, tuple | None]:
        """Layer ids ``[T*k]`` and the predictions made for later layers, in one read (one sync)."""
        flat = topk_ids.reshape(-1).to(torch.int64)                    # [T*k]
        pred = self._predicted if self._predicted is not None and self._predicted[0] == layer else None
        self._predicted = None
        if pred is not None:                       # only the distances the gate allows this step
            depth = self.gate.depth(self.prefetch_depth)
            pred = (pred[0], pred[1][:depth], pred[2][:depth]) if depth > 0 else None
        self.policy.catch_up()                     # the GPU computes meanwhile
        self.counters.host_syncs += 1
        t0 = time.perf_counter()
        both = flat if pred is None else torch.cat([flat, pred[2].reshape(-1)])   # [T*k (+ P*T*k)]
        both = self._reader.read(both)
        self.counters.sync_ms += (time.perf_counter() - t0) * 1e3
        if pred is None:
            return both, None
        n = flat.numel()
        return both[:n], (pred[1], both[n:].view(pred[2].shape))

    def _enter_layer(self, layer: int) -> None:
        """Release staging leased to layers already computed (or to the last step, if one began)."""
        if layer <= self._last_layer:
            self._release_all()
        self._last_layer = layer
        for slot in [s for s, j in self.pool.lease.items() if j < layer]:
            self._drop_staging(slot)

    def _slot_for(self, key: int, layer: int, pinned: set[int], demand: bool) -> int | None:
        """A slot for ``key``: free pool slot, else a policy victim's, else staging. Assigns it."""
        pool = self.pool
        slot = None
        if self.policy.admits(key):
            slot = pool.take_free()
            if slot is None:
                victim = self.policy.victim(pinned)
                if victim is not None:
                    slot = pool.slot_of[victim]
                    self._evict(victim)
            if slot is not None:
                self.policy.insert(key)
        if slot is None:
            slot = pool.take_staging(layer)
            if slot is None and demand:
                slot = self._reclaim_staging(layer)
        if slot is not None:
            pool.assign(key, slot)
            pinned.add(key)
        return slot

    def _evict(self, key: int) -> None:
        self.pool.unassign(self.pool.slot_of[key])
        self.policy.remove(key)
        self.prefetches.waste(key)

    def _release_all(self) -> None:
        """Release every staging lease (fill and prefetch slots included), then forget the step's pins."""
        self.finish_ended()
        if self.books.dp_active:                          # a step cut short: undo its GPU-side prefetches
            self._dp.join()
            keys = self._collect_device_prefetch()
            self._write_table(keys, [-1] * len(keys), None)
            self.books.dp_used = set()
        for slot in list(self.pool.lease):
            self._drop_staging(slot)
        self.books.fill_slots, self.books.filled = None, {}
        self._forget_step()

    def _forget_step(self) -> None:
        """Forget the step's pending prefetch, prefetch pins and current layer (leases stay)."""
        self._pending_prefetch = None
        self._prefetched.clear()
        self._current = set()
        self._last_layer = -1


