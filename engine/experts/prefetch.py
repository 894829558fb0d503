"""Copies of experts into pool slots, and the prediction of which experts are needed next.

On CUDA, copies run on their own streams (one for prefetches, one for on-demand misses, so a miss
never queues behind prefetches of later layers), each batch ending with an event; the compute stream
waits only on the events of the slots a layer uses. Copies do not wait for the compute stream: every
copy is issued after the host has read a layer's routing ids, which finished every earlier kernel,
and the slots a copy may overwrite are never those of the layer being computed or of a pending
prefetch (the manager pins them). So prefetch copies can be issued while the layer computes. The time the
compute stream stalls is measured with a pair of timing events around those waits and read back
only once the pair has completed, so statistics never synchronise.

On CPU there are no streams: copies are plain and synchronous, and the time spent copying misses is
what compute "waited".

Legend: T tokens, k experts per token, E experts, D hidden, P predicted layers.
"""
from __future__ import annotations

import time
from collections import deque
from typing import Callable, Sequence

import torch

from kernels.predict import rms

RouteFn = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
Prediction = tuple[int, list[int], torch.Tensor]   # (layer it was made at, layers predicted, ids [P, T, k])


class CopyEngine:
    """Host-store rows -> device pool slots, ordered against the compute stream with events."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self._prefetch_stream = torch.cuda.Stream(device) if self.cuda else None
        self._demand_stream = torch.cuda.Stream(device) if self.cuda else None
        self._pending: dict[int, torch.cuda.Event] = {}            # slot -> copy that fills it
        self._timings: deque[tuple[torch.cuda.Event, torch.cuda.Event]] = deque()
        self.wait_ms = 0.0          # completed compute stalls on copies
        self.bytes_copied = 0

    def copy(self, pairs: Sequence[tuple[int, int]], dst: torch.Tensor, src: torch.Tensor, demand: bool) -> None:
        """Copy ``src[row] -> dst[slot]`` for each ``(slot, row)``; dst [S, nbytes] device, src [R, nbytes] host."""
        if not pairs:
            return
        self.bytes_copied += len(pairs) * dst.shape[1]
        if not self.cuda:
            t0 = time.perf_counter()
            for slot, row in pairs:
                dst[slot].copy_(src[row])
            if demand:
                self.wait_ms += (time.perf_counter() - t0) * 1e3
            return
        stream = self._demand_stream if demand else self._prefetch_stream
        for slot, _ in pairs:                  # an earlier copy into a reused slot, maybe on the other stream
            ev = self._pending.get(slot)
            if ev is not None and not ev.query():
                stream.wait_event(ev)
        with torch.cuda.stream(stream):
            for slot, row in pairs:
                dst[slot].copy_(src[row], non_blocking=True)
            done = torch.cuda.Event()
            done.record(stream)
        for slot, _ in pairs:
            self._pending[slot] = done

    def busy_slots(self) -> list[int]:
        """Slots with a copy still in flight. Many slots share one batch's event: each distinct
        event is queried once (a query is a driver call, and a step end asks about every lease)."""
        landed: dict[int, bool] = {}
        busy = []
        for slot, ev in list(self._pending.items()):
            done = landed.get(id(ev))
            if done is None:
                done = landed[id(ev)] = ev.query()
            if done:
                del self._pending[slot]
            else:
                busy.append(slot)
        return busy

    @property
    def stream(self) -> "torch.cuda.Stream | None":
        """The prefetch stream (None on CPU): direct-read steps issue every copy and table write on it."""
        return self._prefetch_stream

    def extend(self, slots: Sequence[int]) -> None:
        """Count the prefetch stream's work so far (e.g. slot-table writes after the copies) as part of
        the copies into ``slots``: :meth:`done` and :meth:`busy_slots` then wait for it too."""
        if self.cuda and slots:
            ev = torch.cuda.Event()
            ev.record(self._prefetch_stream)
            self.track(slots, ev)

    def track(self, slots: Sequence[int], event) -> None:
        """``slots`` are busy until ``event`` (anything with ``query()``) has completed."""
        for s in slots:
            self._pending[s] = event

    @property
    def tracked(self) -> list[int]:
        """Slots whose copy was not yet seen to land (as of the last query)."""
        return sorted(self._pending)

    def after_compute(self, demand: bool = False) -> None:
        """Make later copies (prefetches, or with ``demand`` the demand copies) wait for the compute
        stream's work so far (no host sync)."""
        if self.cuda:
            stream = self._demand_stream if demand else self._prefetch_stream
            stream.wait_stream(torch.cuda.current_stream(self.device))

    def wait_for(self, slots: Sequence[int]) -> None:
        """Make the compute stream wait for the copies that fill ``slots`` (no host sync)."""
        if not self.cuda:
            return
        events = []
        for s in slots:
            ev = self._pending.get(s)
            if ev is None:
                continue
            if ev.query():
                del self._pending[s]
            elif all(ev is not e for e in events):
                events.append(ev)
        if not events:
            return
        compute = torch.cuda.current_stream(self.device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(compute)
        for ev in events:
            compute.wait_event(ev)
        end.record(compute)
        self._timings.append((start, end))

    def poll(self) -> float:
        """Fold completed stall measurements into ``wait_ms`` (never blocks); returns it."""
        while self._timings and self._timings[0][1].query():
            start, end = self._timings.popleft()
            self.wait_ms += start.elapsed_time(end)
        return self.wait_ms

    def join(self) -> None:
        """Make the compute stream wait for every copy issued so far (no host sync)."""
        if self.cuda:
            compute = torch.cuda.current_stream(self.device)
            compute.wait_stream(self._prefetch_stream)
            compute.wait_stream(self._demand_stream)

    def synchronize(self) -> None:
        """Wait for every copy in flight (used before a pool buffer is freed)."""
        if self.cuda:
            self._prefetch_stream.synchronize()
            self._demand_stream.synchronize()
            self._pending.clear()


def predict_experts(hidden: torch.Tensor, routers: torch.Tensor, first: int, count: int,
                    route_fn: RouteFn, bias: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    """Experts that layers ``first .. first+count-1`` would pick for ``hidden [T, D]``.

    ``routers`` is ``[L, E, D]``; one matmul and one routing call cover every predicted layer.
    Returns int64 ``[P, T, k]`` on hidden's device. Later layers see a hidden state that has
    drifted only a little (the residual stream changes slowly), so their routers applied to the
    current one are a good guess. ``bias`` float32 ``[L, E]``: the routers' biases, which enter
    scaled by each token's RMS (see :mod:`kernels.predict`).
    """
    P, E, D = count, routers.shape[1], routers.shape[2]
    T = hidden.shape[0]
    w = routers[first:first + P].reshape(P * E, D)                    # [P*E, D]
    logits = (hidden.to(w.dtype) @ w.t()).view(T, P, E)               # [T, P, E]
    if bias is not None:
        logits = logits + (rms(hidden, eps)[:, None, None] * bias[first:first + P][None]).to(logits.dtype)
    _, ids = route_fn(logits.transpose(0, 1).reshape(P * T, E))       # [P*T, k]
    return ids.to(torch.int64).view(P, T, -1)                         # [P, T, k]


def predict_scored(hidden: torch.Tensor, routers: torch.Tensor, first: int, count: int, top_k: int,
                   score_bias: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """:func:`predict_experts` for sigmoid scores with a choice bias (GLM): the top-k of
    ``sigmoid(logits / rms) + score_bias`` (``score_bias`` float32 ``[L, E]``; ties: the lower id).
    Returns int64 ``[P, T, k]``."""
    w = routers[first:first + count]                                          # [P, E, D]
    logits = torch.einsum("td,ped->pte", hidden.to(w.dtype), w).float()       # [P, T, E]
    choice = torch.sigmoid(logits / rms(hidden, eps)[None, :, None]) + score_bias[first:first + count, None, :]
    return torch.sort(choice, dim=-1, descending=True, stable=True).indices[..., :top_k].to(torch.int64)


class PrefetchGate:
    """Prefetches only at look-ahead distances whose guesses are mostly right.

    A wrong guess costs a copy over the bus and may evict a hot expert, so a prefetcher that guesses
    badly is slower than none. For each distance ``d`` (predicting layer L+d from layer L's input)
    this keeps decayed counts of experts copied ahead and of those the real routing then used; a
    distance whose hit share is below ``threshold`` stops prefetching — and everything beyond it,
    since predictions get worse with distance — except on one step in ``probe_every``, which keeps
    the estimate current when routing changes. A probe copies at most ``probe_quota`` guesses per
    layer at a closed distance: enough to measure, too few to flood the bus (at batch 8 a full
    probe of a bf16 model would move gigabytes of mostly wrong guesses).
    """

    def __init__(self, max_depth: int = 8, threshold: float = 0.5, decay: float = 0.98,
                 probe_every: int = 16, min_samples: float = 16.0, probe_quota: int = 1) -> None:
        self.threshold, self.decay, self.probe_every, self.min_samples = threshold, decay, probe_every, min_samples
        self.probe_quota = probe_quota
        self.issued = [0.0] * (max_depth + 1)
        self.used = [0.0] * (max_depth + 1)
        self.steps = 0

    def accuracy(self, d: int) -> float | None:
        """Share of distance-``d`` prefetches that were used (None until enough were issued)."""
        if d >= len(self.issued) or self.issued[d] < self.min_samples:
            return None
        return self.used[d] / self.issued[d]

    def depth(self, requested: int) -> int:
        """The look-ahead to use this step: the longest run of distances 1.. that are allowed."""
        if self.steps % self.probe_every == 0:
            return requested
        d = 0
        while d < requested:
            acc = self.accuracy(d + 1)
            if acc is not None and acc < self.threshold:
                break
            d += 1
        return d

    def quota(self, d: int) -> int | None:
        """Most copies one layer may issue at distance ``d`` this step: None (no cap) while the
        distance is open, ``probe_quota`` when only a probe lets it through."""
        acc = self.accuracy(d)
        return None if acc is None or acc >= self.threshold else self.probe_quota

    def on_issue(self, d: int, n: int) -> None:
        if d < len(self.issued):
            self.issued[d] += n

    def on_use(self, d: int) -> None:
        if d < len(self.used):
            self.used[d] += 1

    def tick(self) -> None:
        """One engine step: age the counts so the estimate follows the routing."""
        self.steps += 1
        self.issued = [x * self.decay for x in self.issued]
        self.used = [x * self.decay for x in self.used]


BUCKET_LABELS = {1: "1", 2: "2-3", 3: "4-7", 4: "8-15", 5: "16"}   # ClaimGate.bucket -> tokens a step


class ClaimGate:
    """How many experts per predicted layer the GPU-side prefetch claims: the leading ranks whose
    copies are mostly used.

    A layer's claims are ranked (its prediction's first missing expert is rank 0, the next rank 1,
    ...). For each rank this keeps decayed counts of claims and of those their layer found in their
    slot, per step size (1, 2-3, 4-7, 8-15, 16+ tokens: a larger step names more experts per layer
    and gives copies more time to land). The quota of a step is the number of leading ranks, at
    most ``cap``, none of which is known to be used less than ``threshold`` of the time; a probe step
    allows one rank more, so a closed rank is measured again. A claim that landed after its layer
    had looked counts as unused, so ranks the bus cannot carry in time close by themselves.

    The same counts are kept per number of votes (how many tokens of the step predicted the claimed
    expert). With ``by_votes`` the claims of a step need at least ``min_votes`` votes: the fewest
    votes whose claims are not known to be used less than ``threshold`` of the time, counting up
    from one (an expert more tokens predict is the likelier to be used); a probe step allows one
    vote fewer. A step of one token always claims with one vote. Off by default: measured on the
    H200 (``benchmarks/bench_e2e.py --claim-votes off,gate``, residency50_steady_2026-11-29k) it filtered
    nothing, since at batch 8 claims with 1, 2 and 3 votes were used 64%, 53% and 46% of the time, all
    above the threshold (more votes did not mean likelier use), and no cell got faster.
    """

    def __init__(self, threshold: float = 0.4, decay: float = 0.98, min_samples: float = 16.0,
                 max_rank: int = 16, by_votes: bool = False) -> None:
        self.threshold, self.decay, self.min_samples, self.max_rank = threshold, decay, min_samples, max_rank
        self.by_votes = by_votes
        self._issued: dict[int, list[float]] = {}
        self._used: dict[int, list[float]] = {}
        self._v_issued: dict[int, list[float]] = {}     # bucket -> claims by votes (index = votes)
        self._v_used: dict[int, list[float]] = {}

    @staticmethod
    def bucket(tokens: int) -> int:
        return min(max(tokens, 1), 16).bit_length()

    def accuracy(self, tokens: int, rank: int) -> float | None:
        """Share of rank-``rank`` claims used in steps of ``tokens`` tokens (None until enough)."""
        return self._share(self._issued, self._used, tokens, rank)

    def _share(self, issued: dict[int, list[float]], used: dict[int, list[float]], tokens: int,
               i: int) -> float | None:
        counts = issued.get(self.bucket(tokens))
        if counts is None or i >= len(counts) or counts[i] < self.min_samples:
            return None
        return used[self.bucket(tokens)][i] / counts[i]

    def quota(self, tokens: int, cap: int, probe: bool) -> int:
        n = 0
        while n < cap:
            acc = self.accuracy(tokens, n)
            if acc is not None and acc < self.threshold:
                break
            n += 1
        return min(cap, n + 1) if probe else n

    def vote_accuracy(self, tokens: int, votes: int) -> float | None:
        """Share of claims with ``votes`` votes used in steps of ``tokens`` tokens (None until enough)."""
        return self._share(self._v_issued, self._v_used, tokens, votes)

    def min_votes(self, tokens: int, probe: bool) -> int:
        """Votes a claim of a step of ``tokens`` tokens needs (see the class doc)."""
        if not self.by_votes:
            return 1
        v, top = 1, min(max(tokens, 1), 16)
        while v < top:
            acc = self.vote_accuracy(tokens, v)
            if acc is None or acc >= self.threshold:
                break
            v += 1
        return max(1, v - 1) if probe else v

    def record(self, tokens: int, claims: Sequence[tuple[int, bool, int]]) -> None:
        """One step's claims as ``(rank, used, votes)``; ages the counts of its step size first."""
        b = self.bucket(tokens)
        issued = self._issued.setdefault(b, [0.0] * self.max_rank)
        used = self._used.setdefault(b, [0.0] * self.max_rank)
        v_issued = self._v_issued.setdefault(b, [0.0] * 17)
        v_used = self._v_used.setdefault(b, [0.0] * 17)
        for counts in (issued, used, v_issued, v_used):
            for i in range(len(counts)):
                counts[i] *= self.decay
        for rank, hit, votes in claims:
            if rank < self.max_rank:
                issued[rank] += 1
                used[rank] += hit
            v = min(max(votes, 1), 16)
            v_issued[v] += 1
            v_used[v] += hit

    def state(self, cap: int) -> tuple[tuple[str, float | None, int], ...]:
        """Per measured step size: its label, the first rank's use share, the claims per layer it
        makes outside probe steps (at most ``cap``)."""
        out = []
        for b in sorted(self._issued):
            tokens = 1 << (b - 1)
            out.append((BUCKET_LABELS[b], self.accuracy(tokens, 0), self.quota(tokens, cap, probe=False)))
        return tuple(out)

    def snapshot(self) -> dict[int, list[float | None]]:
        """Per step-size bucket, each rank's use share (None: too few claims to tell)."""
        return self._shares(self._issued, self._used)

    def vote_snapshot(self) -> dict[int, list[float | None]]:
        """Per step-size bucket, the use share of claims with 1, 2, ... 16 votes (None: too few)."""
        return {b: shares[1:] for b, shares in self._shares(self._v_issued, self._v_used).items()}

    def _shares(self, issued: dict[int, list[float]], used: dict[int, list[float]]) -> dict[int, list[float | None]]:
        return {b: [round(u / i, 3) if i >= self.min_samples else None for u, i in zip(used[b], counts)]
                for b, counts in issued.items()}
