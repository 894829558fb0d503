"""``ExpertManager``: the ExpertProvider that keeps hot experts on the GPU and brings the rest in.

Per engine step and MoE layer ``l`` the model calls ``before_layer(l, hidden)`` then
``acquire(l, topk_ids)``:

* ``before_layer`` guesses the experts of layers ``l+1 .. l+depth`` by applying their routers to
  ``hidden`` (on the device, no sync).
* ``acquire`` resolves layer ``l``'s experts by the step's plan (engine/experts/step_plan.py, made
  when the step's first layer comes): copied into slots first (engine/experts/copy_path.py), or read
  by the kernels straight from mapped host memory (engine/experts/direct.py).
* A decode step replayed from CUDA graphs (engine/cuda_graphs.py) drives the same two paths through
  ``replay_hooks`` (:class:`engine.experts.replay.ReplayHooks`), and through nothing else.
* With a pool that holds every expert the table is static and ``acquire`` never syncs.

What is where lives in the pool's books (engine/experts/residency_books.py); the parts both paths
share are one :class:`engine.experts.residency.Residency`. Live changes: engine/experts/live_changes.py.
Keys are store rows, ``layer * E + expert``.

Legend: T tokens, k experts per token, E experts, L MoE layers, D hidden.
"""
from __future__ import annotations

import contextlib
import dataclasses
import time
from pathlib import Path
from typing import Iterator, Sequence

import torch

from engine.errors import ConfigError, ReconfigureError
from engine.experts import live_changes
from engine.experts.books import MissForecast, PrefetchLedger
from engine.experts.cold import ColdExperts, check_mode
from engine.experts.copy_path import CopyPath
from engine.experts.counters import ResidencyCounters
from engine.experts.device_prefetch import DevicePrefetcher
from engine.experts.direct import DirectPath
from engine.experts.policies import make_policy
from engine.experts.policy import DEFAULT_LFU_DECAY, StaticPolicy
from engine.experts.pool import ExpertPool
from engine.experts.predictor import ExpertPredictor
from engine.experts.prefetch import ClaimGate, Prediction, PrefetchGate, RouteFn
from engine.experts.readback import HostReader
from engine.experts.replay import ManagerReplay, ReplayHooks
from engine.experts.residency import Residency
from engine.experts.residency_books import ResidencyBooks
from engine.experts.step_books import StepBooks
from engine.experts.step_plan import Kind, StepPlan
from engine.experts.store import HostExpertStore
from engine.experts.tuning import ResidencyTuning
from engine.telemetry import ExpertStats
from kernels.expert_layout import ExpertLayout


class ExpertManager:
    """Byte-budgeted device pool over a host store, with prefetch, policies and live resizing.

    ``pool_bytes`` buys ``pool_bytes // layout.nbytes`` pool slots (None: every expert); a pool
    smaller than all experts also takes ``staging_slots`` staging slots. ``budget_bytes`` caps the device
    bytes of slots and staging together. ``routers`` are the ``[E, D]`` router weights of every
    MoE layer in order, ``route_fn(logits [T, E]) -> (weights [T, k], ids [T, k])`` the model's
    routing. ``routing_profile`` (a path or counts ``[L][E]``) is needed by the static policy.
    ``direct_reads``: None (default) reads missing experts directly where the kernels can (CUDA with
    a mapped host store); True forces it (also on CPU, where "host" and "device" are both RAM);
    False never. ``top_k`` (the model's experts per token) lets decode steps on CUDA predict with
    one kernel instead of a matmul and the routing kernel. ``tuning`` holds the measured thresholds
    (:class:`engine.experts.tuning.ResidencyTuning`); a caller may replace it between steps.
    ``cold_experts`` (auto / bus / cpu) says which missing experts the host CPU computes, on
    ``cpu_threads`` threads (default: the cores near the GPU but one); see engine/experts/cold.py.
    ``staging_slots``: the staging of a pool smaller than all experts (default ``2 E``; at least ``E``).
    """

    def __init__(self, layout: ExpertLayout, store: HostExpertStore | None, num_experts: int,
                 device: torch.device | str, pool_bytes: int | None, prefetch_depth: int, policy: str,
                 routers: Sequence[torch.Tensor], route_fn: RouteFn, *,
                 routing_profile: str | Path | Sequence[Sequence[int]] | None = None,
                 budget_bytes: int | None = None, lfu_decay: float = DEFAULT_LFU_DECAY,
                 direct_reads: bool | None = None, top_k: int | None = None,
                 router_bias: Sequence[torch.Tensor] | None = None, norm_eps: float = 1e-6,
                 score_bias: Sequence[torch.Tensor] | None = None, tuning: ResidencyTuning | None = None, experts: torch.Tensor | None = None,
                 cold_experts: str = "auto", cpu_threads: int | None = None,
                 staging_slots: int | None = None) -> None:
        adopted = experts is not None
        if adopted == (store is not None) or (adopted and pool_bytes is not None):
            raise ValueError("give the experts as a host store, or (every expert resident) as a device buffer")
        num_layers = len(routers)
        if store is not None and (store.num_experts != num_experts or num_layers != store.num_layers
                                  or store.layout != layout):
            raise ValueError(f"store is {store.num_layers} x {store.num_experts} ({store.layout.fmt}); got "
                             f"{num_layers} routers, {num_experts} experts, layout {layout.fmt}")
        if adopted and (experts.dim() != 2 or experts.shape[0] != num_layers * num_experts
                        or experts.shape[1] != layout.nbytes):
            raise ValueError(f"expected uint8 [{num_layers * num_experts}, {layout.nbytes}] resident experts, got "
                             f"{tuple(experts.shape)}")
        self.layout = layout
        self.num_layers, self.num_experts = num_layers, num_experts
        self.device = torch.device(device)
        tuning = tuning or ResidencyTuning()
        self._top_k = top_k                         # None: a layer's experts may all be any token's
        self.predictor = ExpertPredictor(routers, route_fn, self.device, top_k, router_bias, norm_eps,
                                         tuning.predict_max_layers, score_bias)
        depth = live_changes.check_depth(prefetch_depth, ConfigError)
        self._lfu_decay = lfu_decay
        self._profile = live_changes.load_profile(routing_profile, self.num_layers, num_experts)
        policy_obj = make_policy(policy, self._profile, lfu_decay)
        if adopted:
            pool = ExpertPool.adopting(experts, layout, num_experts, budget_bytes, staging_slots)
        else:
            slots = live_changes.slots_for(pool_bytes, layout, self.num_layers * num_experts)
            keep = policy_obj.place(slots) if isinstance(policy_obj, StaticPolicy) else []
            pool = ExpertPool(store, self.device, slots, keep, budget_bytes, staging_slots)
        live_changes.seed(policy_obj, pool.books.resident_keys())
        counters = ResidencyCounters(self.num_layers, num_experts, self.device)
        numa = store.numa if store is not None else None
        cold = ColdExperts(layout, check_mode(cold_experts, ConfigError), cpu_threads,
                           numa.cpus if numa is not None and numa.cpus else None)
        self.r = Residency(layout, store, pool, policy_obj, counters, PrefetchLedger(counters),
                           MissForecast(counters, num_experts), PrefetchGate(), tuning, HostReader(self.device),
                           depth, cold)
        if store is not None:
            live_changes.probe_reads(store, self.device, direct_reads, ConfigError)
        self.copy = CopyPath(self.r, self._release_all)
        self.direct = DirectPath(self.r, direct_reads)
        self.plan: StepPlan | None = None          # the running step's, once its first layer came
        self.last_kind: Kind | None = None         # the kind of the last planned step
        self._predicted: Prediction | None = None  # what before_layer kept for acquire
        self._in_step = False
        self._owns_store = False
        self._capturing = False    # while decode steps are recorded into CUDA graphs (see recording)
        self._quiet = False        # ... a decode graph without predictions
        self._replay = ManagerReplay(self)
        self._step_ms, self._step_t0 = 0.0, None    # time inside steps, for the CPU busy share
        self._step_misses0 = 0
        self._tallied: int | None = None  # the layer whose next call the router kernel counts (route_tally)
        self._prompt = False       # the running step carries a prompt's tokens (begin_step)

    @classmethod
    def from_rows(cls, layout: ExpertLayout, rows: torch.Tensor, num_experts: int, device: torch.device | str,
                  pool_bytes: int | None, prefetch_depth: int, policy: str, routers: Sequence[torch.Tensor],
                  route_fn: RouteFn, **options) -> "ExpertManager":
        """Build over loader-filled host rows ``uint8 [L * E, nbytes]``, page-locked in place on CUDA.

        The manager then owns the store and releases it in :meth:`close`. ``options`` are the
        keyword options of the constructor.
        """
        dev = torch.device(device)
        store = HostExpertStore.from_rows(rows, num_experts, layout, pin=dev.type == "cuda", device=dev)
        out = cls(layout, store, num_experts, dev, pool_bytes, prefetch_depth, policy, routers, route_fn, **options)
        out._owns_store = True
        return out

    @classmethod
    def resident(cls, layout: ExpertLayout, experts: torch.Tensor, num_experts: int, prefetch_depth: int,
                 policy: str, routers: Sequence[torch.Tensor], route_fn: RouteFn, **options) -> "ExpertManager":
        """Every expert resident: a full pool over the model's device buffer ``uint8 [L * E, nbytes]``
        (no copy, no host store). Its knobs stay live: a smaller pool first copies the experts into a
        host store (:meth:`reconfigure`)."""
        return cls(layout, None, num_experts, experts.device, None, prefetch_depth, policy, routers, route_fn,
                   experts=experts, **options)

    # ---- the parts, as the engine, the workbench and the tests read them ---------------------------
    pool = property(lambda self: self.r.pool, doc="The device pool (slots, table, copies).")
    store = property(lambda self: self.r.store, doc="The host store of every expert (None: all resident, none made).")
    books = property(lambda self: self.r.books, doc="What every slot holds (ResidencyBooks).")
    policy = property(lambda self: self.r.policy, doc="The eviction policy now.")
    counters = property(lambda self: self.r.counters, doc="Cumulative counters behind stats().")
    gate = property(lambda self: self.r.gate, doc="The prefetch gate (look-ahead distances in use).")
    prefetch_depth = property(lambda self: self.r.prefetch_depth, doc="The prefetch depth setting.")
    claims = property(lambda self: self.direct.claim_gate, doc="The GPU-side claims' gate (ClaimGate).")

    @property
    def tuning(self) -> ResidencyTuning:
        return self.r.tuning

    @tuning.setter
    def tuning(self, value: ResidencyTuning) -> None:
        self.r.tuning = value          # between steps; the claim gate keeps its threshold

    @property
    def device_prefetcher(self) -> DevicePrefetcher | None:
        """The GPU-side prefetch of direct-read steps (None where it cannot run)."""
        return None if self.direct.claims is None else self.direct.claims.dp

    @property
    def direct_reads(self) -> bool:
        """Whether decode steps read missing experts straight from host memory (engine/experts/direct.py)."""
        return self.direct.enabled

    def direct_for(self, tokens: int) -> bool:
        """Whether a step of ``tokens`` tokens reads missing experts directly."""
        return self.direct.direct_for(tokens)

    def eager_for(self, tokens: int, recorded: int | None = None) -> bool:
        """Whether a decode step of ``tokens`` tokens should run eagerly so that the host CPU can
        compute missing experts (engine/experts/cold.py: always under ``cpu``; under ``auto`` while
        such steps are measured faster than replayed ones); the host then decides per layer."""
        r = self.r
        if self.graph_cpu_share(tokens if recorded is None else recorded):
            return False                  # the replayed step gives the CPU its share itself
        if r.store is not None and not r.pool.full and self.may_run_in_passes(tokens):
            return True                   # a recorded step computes each layer once
        return r.store is not None and not r.pool.full and r.cold.enabled_on(self.device) and r.cold.eager_for(tokens)

    def may_run_in_passes(self, tokens: int) -> bool:
        """Whether a copy-path step of ``tokens`` tokens can miss more experts in a layer than the staging
        slots hold, so that the layer runs in passes (engine/experts/copy_path.LayerPasses): after a
        live change to a larger batch than staging was sized for at load."""
        if self.r.pool.full or self.direct_for(tokens):
            return False
        distinct = min(self.num_experts, tokens * (self._top_k or self.num_experts))
        return distinct > self.r.books.staging

    def graph_cpu_share(self, tokens: int) -> bool:
        """Whether a replayed decode step of ``tokens`` tokens gives the host CPU a share of each layer's
        missing experts (engine/experts/cold_graph.py): direct-read steps on a GPU, cold experts on."""
        return self.device.type == "cuda" and not self.r.pool.full and self.direct.direct_for(tokens) \
            and self.direct.cpu_share_on

    def observe_step(self, tokens: int, eager: bool, seconds: float, recorded: int | None = None) -> None:
        """A decode step of ``tokens`` tokens ran (eagerly or replayed from the recording of
        ``recorded`` tokens) in ``seconds``, for ``auto``."""
        if self.direct.shares is not None:
            self.direct.shares.check()        # a join that gave up: this step's output is not valid
        if self.r.store is not None and not self.r.pool.full:
            shared = self.graph_cpu_share(tokens if recorded is None else recorded)
            if not eager:                     # its recording's tuner, and the CPU share's
                self.direct.choice.observe(tokens, seconds, shared)
            if eager or not shared or self.direct.shares is None:
                self.r.cold.observe(tokens, eager, seconds)

    @property
    def cold(self) -> ColdExperts:
        """The cold-expert setting, its measured rates and counts."""
        return self.r.cold

    # ---- planning --------------------------------------------------------------------------------
    def plan_step(self, kind: Kind, tokens: int = 0) -> StepPlan:
        """Plan the running step now as ``kind`` rather than at its first layer (what ``acquire`` does
        then); a benchmark or a test that sets up a step by hand starts here."""
        return self._start(kind, tokens)

    def _start(self, kind: Kind, tokens: int = 0) -> StepPlan:
        """Plan this step as ``kind`` (once: a planned step keeps its plan); switching from the other
        kind first lets that kind's copies land."""
        if self.plan is not None and self.plan.kind == kind:
            return self.plan
        if kind != "direct":
            self.direct.fills.disarm()
        self.plan = StepPlan(kind, tokens, prompt=self._prompt,
                             defer_end=kind == "direct" and self.direct.defer_eager_ends)
        prev, self.last_kind = self.last_kind, kind
        if prev != kind:
            if prev is not None:
                self.r.pool.copies.synchronize()
            if kind == "copy":
                self._release_all()                # leases a direct step carried over
            else:
                self.r.pool.push_stale()             # kernels read the device table as it is
        return self.plan

    # ---- ExpertProvider --------------------------------------------------------------------------
    def begin_step(self, keep_ended: bool = False, prompt: bool = False) -> None:
        """A forward pass starts: forget the last step's leases and pins, age the policy. ``prompt``: the
        step carries a prompt's tokens; its copied layer calls of at least ``copy_path.CHUNK_TOKENS`` tokens
        rank the misses they admit by their routing (engine/experts/copy_path.py).

        Staging slots that a direct-read step left with copies in flight stay leased. A replayed
        direct-read step whose end was deferred is ended first, unless ``keep_ended``: the replay of
        the next one ends it once launched (:meth:`finish_ended`)."""
        if not keep_ended and not (self.device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
            self.direct.finish_ended()
        if self.last_kind == "direct":
            self.copy.forget_step()
        else:
            self._release_all()
        self.plan = None
        self._prompt = prompt
        step = self.direct.step
        step.misses, step.fill_slots, step.filled = [], None, {}
        self._predicted = None
        self.r.forecast.forget()
        # the adaptive policy's shadow pools admit as this pool does
        self.r.policy.admit_per_step = self.direct.fills.admit_per_step if self.last_kind == "direct" else None
        self.r.policy.tick()
        self._in_step = True
        self._step_t0 = time.perf_counter()
        self._step_misses0 = self.r.counters.misses
        self.r.gate.tick()

    @property
    def replay_hooks(self) -> ReplayHooks | None:
        """What DecodeGraphs drives (:class:`engine.experts.replay.ReplayHooks`, and nothing else);
        None while every expert has a slot, since such a step is recorded whole."""
        return None if self.r.pool.full else self._replay

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
        return self.r.pool.table[moe_index], self.r.pool.views

    @property
    def static(self) -> bool:
        """True while the slot table cannot change (every expert has a pool slot): no host work per layer."""
        return self.r.pool.full

    def before_layer(self, moe_index: int, hidden: torch.Tensor) -> Prediction | None:
        """Predict layers ``moe_index+1 .. +depth`` from ``hidden [T, D]`` (device work, no sync).

        While :meth:`recording` the prediction covers the full ``prefetch_depth``, since the gate's
        depth changes from step to step; ``acquire`` keeps only the distances the gate allows. A step
        whose predictions the GPU copies in itself predicts only what it claims: layer
        ``moe_index + depth`` (every layer up to it from the first MoE layer). Returns the
        prediction, also kept for ``acquire``.
        """
        self._predicted = None
        depth_setting = self.r.prefetch_depth
        if self.r.pool.full or depth_setting == 0 or self._quiet:
            return None
        tokens = hidden.shape[0]
        plan = self.plan              # GPU-side claims: a step not planned as copy, of a direct-read size
        device_side = (self.direct.claims is not None and (plan is None or plan.kind != "copy")
                       and self.direct_for(tokens))
        full = self._capturing or device_side
        depth = depth_setting if full else self.r.gated_depth()
        layers = list(range(moe_index + 1, min(moe_index + depth, self.num_layers - 1) + 1))
        if device_side and moe_index > 0:        # the GPU claims only for the farthest layer
            layers = [t for t in layers if t == moe_index + depth_setting]
        if not layers:
            return None
        ids = self.predictor.predict(hidden, layers[0], len(layers))                    # [P, T, k]
        self._predicted = (moe_index, layers, ids)
        if device_side:
            capturing = self.device.type == "cuda" and torch.cuda.is_current_stream_capturing()
            if not capturing and not self.direct.step.dp_active:
                self._start("direct", tokens)
            self.direct.launch_claims(moe_index, layers, ids, capturing)
        return self._predicted

    def _take_prediction(self, moe_index: int) -> Prediction | None:
        pred, self._predicted = self._predicted, None
        return pred if pred is not None and pred[0] == moe_index else None

    def route_tally(self, moe_index: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """A full pool's device-side counts of layer ``moe_index`` for the router kernel to add to (then
        ``acquire`` of that layer does not count it again); None while the pool holds fewer than all
        experts, whose calls are counted on the host."""
        if not self.r.pool.books.full:
            return None
        self._tallied = moe_index
        return self.r.counters.device_tally.target(moe_index)

    def acquire(self, moe_index: int, topk_ids: torch.Tensor, predicted: Prediction | None = None,
                defer_prefetch: bool = False) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Make the experts of ``topk_ids [T, k]`` resident; returns ``(slot_of_expert [E] int32, views)``
        (and, in a direct-read step, where the missing ones are read from).

        ``predicted`` is what ``before_layer`` returned for this layer (default: the one it kept).
        With ``defer_prefetch`` the prefetch copies wait for :meth:`issue_prefetch`, so a caller can
        launch the layer's compute first and let the host's prefetch work overlap it.
        """
        pool = self.r.pool
        tallied, self._tallied = self._tallied == moe_index, None
        if pool.books.full:
            if not tallied:
                self.r.counters.device_tally.add(moe_index, topk_ids)
            return pool.table[moe_index], pool.views
        if predicted is not None:
            self._predicted = predicted
        plan = self.plan
        if plan is None or plan.kind == "captured":       # the step's first layer (or a warm-up's)
            tokens = topk_ids.shape[0]
            plan = self._start("direct" if plan is None and self.direct_for(tokens) else "copy", tokens)
        if plan.kind == "direct":
            return self.direct.acquire(moe_index, topk_ids, self._take_prediction(moe_index))
        ids, pred = self.copy.read_ids(topk_ids, self._take_prediction(moe_index))
        return self.copy.acquire(moe_index, ids, pred, defer_prefetch, topk_ids.shape[1], prompt=plan.prompt)

    def issue_prefetch(self) -> None:
        """Issue the prefetch copies an ``acquire(..., defer_prefetch=True)`` left pending."""
        self.copy.issue_prefetch()

    # ---- the step's end --------------------------------------------------------------------------
    def end_step(self) -> None:
        """The forward pass is over: staging leases and prefetch pins end with it."""
        t0 = time.perf_counter()
        try:
            plan = self.plan
            kind = plan.kind if plan is not None else None
            self.direct.end_step(kind, plan is not None and plan.defer_end)
            if kind == "copy" or (kind is None and self.last_kind != "direct"):
                self._release_all()
            self.plan = None
            self._in_step = False
            self.r.ledger.end_step()
            self.r.cold.end_step(self.r.counters.misses - self._step_misses0)
            if self._step_t0 is not None:
                self._step_ms += (time.perf_counter() - self._step_t0) * 1e3
                self._step_t0 = None
        finally:
            self.r.counters.step_end_ms += (time.perf_counter() - t0) * 1e3

    def settle(self) -> None:
        """End the step whose end was deferred, if any, and give back fill slots armed for a next
        step (the engine calls this once it has no more work; a test before it reads the counts)."""
        self.direct.finish_ended()

    def _release_all(self) -> None:
        """Release every staging lease (fill and claim slots included), then forget the step's pins."""
        direct = self.direct
        direct.finish_ended()
        if direct.step.dp_active:                     # a step cut short: undo its GPU-side prefetches
            direct.claims.undo(direct.step)
        for slot in list(self.r.books.lease):
            self.r.drop_staging(slot)
        direct.step.fill_slots, direct.step.filled = None, {}
        self.copy.forget_step()

    # ---- settings and reports --------------------------------------------------------------------
    def check_reconfigure(self, pool_bytes: int | None = None, prefetch_depth: int | None = None,
                          policy: str | None = None, reads: str | None = None, cold: str | None = None) -> str:
        """The cold-expert mode these settings give; raises ReconfigureError when :meth:`reconfigure`
        would refuse them (during a step, a bad value, a pool over the budget). Changes nothing."""
        if self._in_step:
            raise ReconfigureError("the expert pool can change only between engine steps; apply it after step() returns")
        change = live_changes.check(self.r, self.direct.option, self._profile, self._lfu_decay, pool_bytes,
                                    prefetch_depth, policy, reads)
        if change.resize:
            self.r.pool.check_size(change.slots)
        return check_mode(cold, ReconfigureError) if cold is not None else self.r.cold.mode

    def reconfigure(self, pool_bytes: int | None = None, prefetch_depth: int | None = None,
                    policy: str | None = None, reads: str | None = None, cold: str | None = None) -> str:
        """Apply new settings between steps; returns a short description of the result.

        Raises ReconfigureError and changes nothing when a setting is invalid, the pool does not
        fit the budget (:meth:`check_reconfigure`), or its allocation fails.
        """
        cold_mode = self.check_reconfigure(pool_bytes, prefetch_depth, policy, reads, cold)
        self.direct.finish_ended()
        if self.r.store is None and pool_bytes is not None and \
                live_changes.slots_for(pool_bytes, self.layout, self.r.books.num_keys) < self.r.books.num_keys:
            self.r.store = live_changes.give_store(self.r, self.direct.option)
            self._owns_store = True
        # checked again: a host store given just now is checked for direct reads
        change = live_changes.check(self.r, self.direct.option, self._profile, self._lfu_decay, pool_bytes,
                                    prefetch_depth, policy, reads)
        if change.resize:
            self._release_all()
            self.last_kind = None                  # the table is rebuilt whole
        live_changes.apply(self.r, change)
        self.direct.option = change.direct
        self.r.cold.mode = cold_mode
        self.r.cold.arms.reset()                   # the last setting's step times say nothing of this one
        self.direct.choice.reset()                 # both tuners of the replays: recordings and CPU shares
        return self.describe()

    def set_gather(self, on: bool, min_uses: int | None = None) -> bool:
        """Gather the shared missing experts of direct-read steps (``on``), or read each once per token
        that uses it, from the next step; ``min_uses``: how many of a step's tokens must use a missing
        expert for it to be gathered (1: every one, steps of one token too; default: unchanged). False
        (nothing changed) where the store's rows cannot be gathered. Between steps only, like
        :meth:`reconfigure`; the caller records the decode graphs again (``DecodeGraphs.reset``), so
        that their kernels and the host's books agree."""
        gather = self.direct.gather
        if on and not gather.possible:
            return False
        if min_uses is not None and min_uses < 1:
            raise ReconfigureError(f"a gathered expert is one that at least 1 token uses; got min_uses={min_uses}")
        self.direct.finish_ended()                 # the last step's end gives its gather slots back
        if self.direct.step.gather_slots:
            raise ReconfigureError("the gather can change only between engine steps")
        gather.enabled = on
        if min_uses is not None:
            gather.min_uses = min_uses
        return True

    def stats(self) -> ExpertStats:
        """Cumulative counters (no device sync; on CUDA device-side counts may lag one call). Reading
        them changes nothing: a step whose end is deferred is counted once it ends (``settle``)."""
        gate, cold = self.direct.claim_gate, self.r.cold
        return dataclasses.replace(self.r.counters.snapshot(self.r.pool), claim_threshold=gate.threshold,
                                   claim_use=gate.state(self.tuning.prefetch_per_layer), policy=self.r.policy.label,
                                   cold_mode=self._cold_mode(),
                                   cpu_experts=cold.cpu_experts, bus_experts=self.r.counters.misses - cold.cpu_experts,
                                   cpu_ms=cold.cpu_ms,
                                   cold_predicted_ms=cold.predicted_ms, cold_measured_ms=cold.measured_ms,
                                   steps_ms=self._step_ms, last_step_experts=cold.last_step,
                                   cpu_shares=self.direct.choice.cpu_shares_in_force(),
                                   predicting=self.direct.choice.predicting_state())

    def _cold_mode(self) -> str:
        """The cold-expert setting as it acts here: "" with every expert resident and no host store."""
        cold = self.r.cold
        if self.r.store is None:
            return ""
        return cold.mode if cold.enabled_on(self.device) or cold.mode == "bus" else "bus (auto, on a CPU device)"

    @property
    def host_syncs(self) -> int:
        """Device-to-host reads of routing ids so far (each one a sync on CUDA)."""
        return self.r.counters.host_syncs

    def describe(self) -> str:
        """One line: pool, policy, depth, how misses are read."""
        reads = "missing experts copied in"
        depth, gather = self.r.prefetch_depth, self.direct.gather.enabled
        who = "the GPU" if self.device.type == "cuda" else "the device's kernels"   # on the CPU: its own
        if self.direct_reads and gather and self.direct.gather.min_uses <= 1:
            reads = (f"missing experts copied in by {who} before each layer's kernels"
                     + (", prefetched by the GPU" if self.direct.claims and depth > 0 and self.device.type == "cuda"
                        else ""))
        elif self.direct_reads and depth == 0 and not gather:
            reads = "missing experts read directly in steps of one token, copied in otherwise"
        elif self.direct_reads:
            reads = ("missing experts read directly" + (" (one that several tokens of a step use: copied in once)"
                                                        if gather else "")
                     + (", prefetched by the GPU" if self.direct.claims and depth > 0 and self.device.type == "cuda"
                        else ""))
        if self.r.store is not None and not self.r.pool.full and self.r.cold.enabled_on(self.device):
            n = self.r.cold.threads
            reads += f", or computed on {n} CPU thread{'s' if n != 1 else ''} ({self.r.cold.mode})"
        return (f"{self.r.pool.describe()}, policy {self.r.policy.name}, prefetch depth {self.r.prefetch_depth}, "
                f"{reads}")

    def close(self) -> None:
        """Wait for copies in flight and free the device pool (and the host store it made or was given rows for)."""
        self.r.pool.close()
        self.r.cold.close()
        if self._owns_store:
            self.store.close()


__all__ = ["ExpertManager", "ResidencyBooks", "StepBooks", "ClaimGate"]
