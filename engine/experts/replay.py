"""``ReplayHooks``: everything the decode-step CUDA graphs (engine/cuda_graphs.py) may call on the experts.

A provider whose slot tables change from step to step (the expert manager with a pool smaller
than every expert) hands :class:`engine.cuda_graphs.DecodeGraphs` this contract through
``ExpertProvider.replay_hooks`` (:class:`ManagerReplay`); a provider whose tables never change returns None and its decode
step is recorded whole. DecodeGraphs uses nothing of the provider beyond this list.

Two recorded kinds of step use it (see engine/cuda_graphs.py's module docstring):

* pieces: one graph per MoE layer boundary; each piece ``publish``es its ids into pinned memory,
  the host ``acquire_published``es them between pieces and then ``issue_prefetch``es.
* direct: one graph for a direct-read step; the graph ``publish_direct``s each layer's ids, slots
  and fills, the host ``follow_published``s them while the GPU runs, and the step's end is deferred
  until the next step is launched (``begin_step(keep_ended=True)`` ... ``follow_published``, which
  calls ``finish_ended``).

Legend: T tokens, k experts per token, P predicted layers, E experts.
"""
from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

import torch

from engine.experts.step_plan import StepPlan

if TYPE_CHECKING:
    from engine.experts.manager import ExpertManager


class ReplayHooks(Protocol):
    @property
    def static(self) -> bool:
        """True while the slot tables cannot change: the step is recorded as one graph, no hooks."""

    @property
    def prefetch_depth(self) -> int:
        """Layers predicted ahead (sizes the publish regions: ids plus up to this many predictions)."""

    def direct_for(self, tokens: int) -> bool:
        """Whether a step of ``tokens`` tokens reads missing experts directly (records one graph)."""

    def recording(self, quiet: bool = False) -> AbstractContextManager[None]:
        """While decode steps are warmed up or recorded: predictions cover the full depth (the gate's
        depth changes from step to step); ``quiet`` records a step with no predictions at all."""

    def slot_table(self, moe_index: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The device slot-table row ``[E] int32`` of a layer and the pool's views (a piece's output)."""

    # ---- pieces: one graph per MoE layer boundary ----------------------------------------------
    def publish(self, topk_ids: torch.Tensor, predicted: Any, region: torch.Tensor) -> None:
        """Device work: ``topk_ids [T, k]`` and the predictions ``[P, T, k]`` into pinned ``region``."""

    def acquire_published(self, moe_index: int, region: torch.Tensor, shape: tuple[int, int], rows: int,
                          predicted: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Host work between pieces: resolve the published ids of ``rows`` real rows."""

    def issue_prefetch(self) -> None:
        """Issue the prefetch copies the last ``acquire_published`` deferred (the next piece runs)."""

    # ---- direct: one graph per step ------------------------------------------------------------
    def prepare_direct_capture(self) -> None:
        """Before a direct-read step is recorded: bring the device table up to date."""

    def publish_direct(self, moe_index: int, topk_ids: torch.Tensor, predicted: Any, region: torch.Tensor,
                       pad: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor], Any]:
        """Device work inside the graph: snapshot the layer's slots, give fills, publish for the host."""

    def predicts(self, tokens: int) -> bool:
        """Whether this replayed step should predict (else its ``quiet`` recording replays)."""

    def recorded_claims(self) -> tuple[int, ...]:
        """Right after a direct-read step was recorded: the layers its GPU-side prefetch claims for
        (none at prefetch depth 0, in a ``quiet`` recording or without the GPU-side prefetch). Each
        recording keeps its own: a replay waits for the claims of exactly those layers."""

    def start_direct_step(self, regions: torch.Tensor, tokens: int, predicting: bool = True,
                          claims: Sequence[int] = ()) -> None:
        """Before the replay: choose fill and prefetch slots, blank the publish regions; ``claims``:
        what ``recorded_claims`` said of the recording being replayed."""

    def follow_published(self, cuts: Sequence[Any], rows: int, finished: Callable[[], bool] | None = None) -> None:
        """While the replay runs: end the previous step (``finish_ended``; after the first layer's CPU
        share when the step gives the CPU one, whose join would otherwise wait for that end) and follow
        each layer's published values (counts, prefetches, admissions, the host CPU's share);
        ``finished``: whether the replay is over (default: CUDA's word)."""

    def abort_replay(self) -> None:
        """The host stops following the replay (an error): release what the replay may wait for."""

    def finish_ended(self) -> None:
        """End the step whose end was deferred (the previous replay), while this one computes."""

    def arm_next_step(self) -> None:
        """After a followed replay: lease and upload the next step's fill slots while the GPU finishes."""

    # ---- every replayed step -------------------------------------------------------------------
    def begin_step(self, keep_ended: bool = False) -> None:
        """A step starts; ``keep_ended`` leaves a deferred end for ``finish_ended``."""

    def end_step(self) -> None:
        """The step is over (or deferred, for a replayed direct-read step)."""


class ManagerReplay:
    """:class:`ReplayHooks` of an :class:`engine.experts.manager.ExpertManager`: pieces go through
    its copy path, one-graph steps through its direct path; each step is planned by the manager."""

    def __init__(self, manager: "ExpertManager") -> None:
        self.m = manager

    @property
    def static(self) -> bool:
        return self.m.static

    @property
    def prefetch_depth(self) -> int:
        return self.m.prefetch_depth

    def direct_for(self, tokens: int) -> bool:
        return self.m.direct_for(tokens)

    def recording(self, quiet: bool = False) -> AbstractContextManager[None]:
        return self.m.recording(quiet)

    def slot_table(self, moe_index: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return self.m.slot_table(moe_index)

    def begin_step(self, keep_ended: bool = False) -> None:
        self.m.begin_step(keep_ended)

    def end_step(self) -> None:
        self.m.end_step()

    # ---- pieces --------------------------------------------------------------------------------
    def publish(self, topk_ids: torch.Tensor, predicted: Any, region: torch.Tensor) -> None:
        flat = topk_ids.reshape(-1).to(torch.int64)
        self.m.r.reader.publish(flat if predicted is None else torch.cat([flat, predicted[2].reshape(-1)]), region)

    def acquire_published(self, moe_index: int, region: torch.Tensor, shape: tuple[int, int], rows: int,
                          predicted: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        m = self.m
        if m.pool.full:
            raise RuntimeError("a pool holding every expert needs no published ids; record the step whole")
        m.plan_step("copy", rows)
        ids, pred = m.copy.read_published(region, shape, rows, predicted)
        got = m.copy.acquire(moe_index, ids, pred, defer_prefetch=True)
        if len(got) > 4:           # the recorded piece computes the layer once: it cannot run in passes
            raise RuntimeError(f"layer {moe_index} of a recorded decode step missed more experts than the staging "
                               f"slots hold ({m.r.books.staging}); staging is sized for max_batch x top-k misses")
        return got

    def issue_prefetch(self) -> None:
        self.m.copy.issue_prefetch()

    # ---- direct --------------------------------------------------------------------------------
    def prepare_direct_capture(self) -> None:
        m = self.m
        m.direct.fills.disarm()
        m.plan_step("direct")
        m.plan = None
        m.direct.prepare_capture()

    def publish_direct(self, moe_index: int, topk_ids: torch.Tensor, predicted: Any, region: torch.Tensor,
                       pad: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor], Any]:
        m = self.m
        if m.plan is None or m.plan.kind != "captured":
            m.plan = StepPlan("captured", topk_ids.shape[0])
        return m.direct.publish(moe_index, topk_ids, predicted, region, pad)

    def predicts(self, tokens: int) -> bool:
        return self.m.direct.choice.predicts(tokens)

    def recorded_claims(self) -> tuple[int, ...]:
        claims = self.m.direct.claims
        return () if claims is None else tuple(claims.dp.targets)

    def start_direct_step(self, regions: torch.Tensor, tokens: int, predicting: bool = True,
                          claims: Sequence[int] = ()) -> None:
        m = self.m
        m.plan = m.plan_step("direct", tokens).with_deferred_end()
        m.direct.start_replay(regions, tokens, predicting, claims)

    def follow_published(self, cuts: Sequence[Any], rows: int, finished: Callable[[], bool] | None = None) -> None:
        self.m.direct.follow_published(cuts, rows, finished)

    def finish_ended(self) -> None:
        self.m.direct.finish_ended()

    def abort_replay(self) -> None:
        self.m.direct.abort_replay()

    def arm_next_step(self) -> None:
        if self.m.last_kind == "direct":
            self.m.direct.arm_next_step()
