"""``CopyPath``: steps whose missing experts are copied into device slots before their layer computes.

Per MoE layer the host reads the layer's routing ids and the predictions for later layers in one
counted sync (``acquire``), or takes them from what a recorded graph piece published
(``acquire_published``); copies the missing experts on demand (counted misses) into a free pool slot,
a policy victim's slot or a staging slot; makes the compute stream wait for exactly the copies the
layer uses; pushes the layer's row of the slot table; and then issues the prefetch copies of the
predicted experts (``issue_prefetch``, deferred by a caller that launches the layer's compute first),
so they run while the layer computes. Misses are copied before prefetches and on their own stream.

Pinned against eviction: the experts of the current layer and every prefetched expert until its
layer has run (the pool's books). Keys are store rows, ``layer * E + expert``.

Legend: T tokens, k experts per token, P predicted layers, E experts.
"""
from __future__ import annotations

from typing import Callable

import torch

from engine.experts.admission import admit
from engine.experts.residency import Residency

# A layer call of a step carrying a prompt's tokens, with at least this many tokens, is a prompt's chunk:
# its uses are counted per token (EvictionPolicy.touch_chunk), and a miss it admits, or an expert its
# prefetch brings in, only evicts a colder key.
CHUNK_TOKENS = 32


class CopyPath:
    def __init__(self, r: Residency, restart: Callable[[], None]) -> None:
        self.r = r
        self._restart = restart              # the manager's release of every lease (a step began anew)
        self.pending: tuple[list[int], torch.Tensor] | None = None   # prefetches left for issue_prefetch
        self.last_layer = -1
        self.chunk = False                   # the layer acquired last is a prompt's chunk (its prefetches too)

    # ---- reading the ids ---------------------------------------------------------------------
    def read_ids(self, topk_ids: torch.Tensor, pred: tuple | None) -> tuple[torch.Tensor, tuple | None]:
        """Layer ids ``[T*k]`` and the gated predictions ``(layers, ids [P, T, k])`` on the host, in
        one read (one sync). ``pred`` is the layer's prediction ``(layer, layers, ids)`` or None."""
        r = self.r
        flat = topk_ids.reshape(-1).to(torch.int64)                    # [T*k]
        if pred is not None:                       # only the distances the gate allows this step
            depth = r.gated_depth()
            pred = (pred[1][:depth], pred[2][:depth]) if depth > 0 else None
        both = flat if pred is None else torch.cat([flat, pred[1].reshape(-1)])   # [T*k (+ P*T*k)]
        both = r.read(both)
        if pred is None:
            return both, None
        n = flat.numel()
        return both[:n], (pred[0], both[n:].view(pred[1].shape))

    def read_published(self, region: torch.Tensor, shape: tuple[int, int], rows: int,
                       predicted: tuple | None) -> tuple[torch.Tensor, tuple | None]:
        """What a recorded piece published into ``region``: ids of ``rows`` real rows and the gated
        predictions."""
        r = self.r
        t, k = shape
        n = t * k * (1 + (len(predicted[1]) if predicted is not None else 0))
        host = r.waited(lambda: (r.reader.wait(), region[:n].clone())[1])
        ids = host[:t * k].view(t, k)[:rows].reshape(-1)
        pred = None
        if predicted is not None:
            depth = r.gated_depth()
            if depth > 0:
                pred = (predicted[1][:depth], host[t * k:].view(-1, t, k)[:depth, :rows])
        return ids, pred

    # ---- one layer ---------------------------------------------------------------------------
    def acquire(self, moe_index: int, ids: torch.Tensor, predicted: tuple | None, defer_prefetch: bool,
                per_token: int = 0, prompt: bool = False) -> tuple:
        """``ids`` int64 [T*k] and ``predicted`` (layers, ids [P, T, k]) on the host: copy the misses
        in, push the layer's table row; prefetch (now, or at :meth:`issue_prefetch`). ``prompt``: the step
        carries a prompt's tokens; a call of at least ``CHUNK_TOKENS`` of them is a chunk whose routing
        ranks what it (and its prefetches) admit. Returns
        ``(row, views)``, or with ``per_token`` (k) given and a share of the misses computed by the
        host CPU instead of copied, ``(row, views, None, ColdShare)``; where the slots the layer can get
        do not hold all its misses, ``(row, views, None, ColdShare | None, LayerPasses)``."""
        r, books = self.r, self.r.books
        self._enter_layer(moe_index)
        base = moe_index * r.num_experts
        id_list = ids.tolist()
        keys = [base + e for e in sorted(set(id_list))]
        books.current = set(keys)
        slot_of = books.slot_of
        misses = [k for k in keys if slot_of[k] < 0]
        tokens = len(id_list) // per_token if per_token else 0
        chunk = self.chunk = prompt and tokens >= CHUNK_TOKENS   # its uses rank the misses it admits
        if chunk:
            per_expert = torch.bincount(ids, minlength=r.num_experts).tolist()
            r.policy.touch_chunk({k: per_expert[k - base] for k in keys}, tokens)
            if r.policy.scored:
                misses.sort(key=r.policy.hotness, reverse=True)
        r.forecast.count(moe_index, misses)
        if predicted is not None:
            r.forecast.note(*predicted)
        r.count_uses(moe_index, keys, None)
        cold = None
        if misses and per_token:
            cold = r.cold_share(moe_index, id_list, [slot_of[base + e] < 0 for e in id_list], per_token, False)
        on_cpu = cold.keys if cold is not None else frozenset()
        pinned = books.pins
        pairs, later = [], []               # later: misses no slot is left for now (LayerPasses)
        for k in misses:
            if k not in on_cpu:
                slot = self._slot_for(k, moe_index, pinned, demand=True, scored=chunk)
                (later.append(k) if slot is None else pairs.append((slot, k)))
        r.pool.load(pairs, demand=True)
        if not chunk:
            r.policy.touch(keys)
        r.counters.record(moe_index, id_list, len(keys) - len(misses), len(misses))
        books.layer_ran(moe_index)
        r.pool.copies.wait_for([slot_of[k] for k in keys if k not in on_cpu and slot_of[k] >= 0])
        row = r.pool.push_row(moe_index)
        self.pending = predicted
        if not defer_prefetch:
            self.issue_prefetch()
        if later:
            # every staging slot leased to this layer is free once the first pass has read it: its
            # misses' and the prefetched experts' it used
            reuse = [s for s, j in books.lease.items() if j == moe_index]
            if not reuse:
                raise RuntimeError(f"no staging slot left for layer {moe_index}: {len(books.lease)} leased of "
                                   f"{books.staging}, none of them this layer's")
            passes = LayerPasses(self.r, moe_index, id_list, set(later) | set(on_cpu), later, reuse)
            return row, r.pool.views, None, cold, passes
        return (row, r.pool.views) if cold is None else (row, r.pool.views, None, cold)

    def issue_prefetch(self) -> None:
        """Issue the prefetch copies an ``acquire(..., defer_prefetch=True)`` left pending."""
        pending, self.pending = self.pending, None
        if pending is not None:
            self._prefetch(*pending)

    def _prefetch(self, layers: list[int], ids: torch.Tensor) -> None:
        """Issue copies of the predicted experts (``ids [P, T, k]`` on the host), nearest layer first."""
        r, books = self.r, self.r.books
        pinned = books.pins
        origin = layers[0] - 1                     # the layer whose input made the prediction
        slot_of = books.slot_of
        for layer, layer_ids in zip(layers, ids):
            base, pairs = layer * r.num_experts, []
            cap = r.gate.quota(layer - origin)
            for e in dict.fromkeys(layer_ids.t().reshape(-1).tolist()):   # every token's first choice first
                key = base + e
                if slot_of[key] < 0:
                    if cap is not None and len(pairs) >= cap:
                        continue
                    slot = self._slot_for(key, layer, pinned, demand=False, scored=self.chunk, stage=not self.chunk)
                    if slot is None:
                        if self.chunk:             # left to its layer, whose chunk ranks it by its uses
                            continue
                        break                      # no room left: later guesses would not fit either
                    pairs.append((slot, key))
                    r.ledger.issued(key, layer - origin)
                books.prefetched.setdefault(key, layer)
                pinned.add(key)
            r.pool.load(pairs, demand=False)
            r.gate.on_issue(layer - origin, len(pairs))

    def _slot_for(self, key: int, layer: int, pinned: set[int], demand: bool, scored: bool = False,
                  stage: bool = True) -> int | None:
        """A slot for ``key``: free pool slot, else a policy victim's (the admission rule; ``scored``:
        only a victim colder than ``key``, where the policy scores keys), else staging (unless not
        ``stage``); assigns it and pins ``key``."""
        r, books = self.r, self.r.books
        got: list[int] = []

        def place(k: int, victim: int | None) -> None:
            if victim is None:
                got.append(books.take_free())
            else:
                got.append(books.slot_of[victim])
                r.evict(victim)
            r.policy.insert(k)

        if r.policy.admits(key):
            hotness = r.policy.hotness if scored and r.policy.scored else None
            admit([key], 1, len(books.free), lambda: r.policy.victim(pinned), hotness, place)
        slot = got[0] if got else (books.take_staging(layer) if stage else None)
        if slot is None and demand:
            slot = self._reclaim_staging(layer)         # None: this miss waits for a later pass
        if slot is not None:
            books.assign(key, slot)
            pinned.add(key)
        return slot

    def _reclaim_staging(self, layer: int) -> int | None:
        """Take back a staging slot from a guess (a miss outranks it): one prefetched for ``layer`` whose
        expert the layer does not use, else the one prefetched for the farthest later layer; None when
        no guess holds one. So a layer's misses never wait for a pass while guesses hold staging."""
        books = self.r.books
        wrong = [s for s, j in books.lease.items() if j == layer and books.owner[s] not in books.current]
        later = [(j, s) for s, j in books.lease.items() if j > layer]
        if wrong:
            slot = wrong[0]
        elif later:
            _, slot = max(later)
        else:
            return None
        self.r.drop_staging(slot)
        return books.take_staging(layer)

    def _enter_layer(self, layer: int) -> None:
        """Release staging leased to layers already computed (or to the last step, if one began)."""
        if layer <= self.last_layer:
            self._restart()
        self.last_layer = layer
        for slot in self.r.books.leased_before(layer):
            self.r.drop_staging(slot)

    def forget_step(self) -> None:
        """Forget the step's pending prefetch, prefetch pins and current layer (leases stay)."""
        self.pending = None
        self.r.books.forget_pins()
        self.last_layer = -1
        self.chunk = False


class LayerPasses:
    """A layer whose missing experts outnumber the slots it could get (a prefill chunk that misses more
    experts than there are staging slots): the model computes it in passes (``runs``). The first pass
    computes every pair whose expert has a slot now; each later pass waits for the kernels before it,
    copies the next group of the missing experts into the staging slots the layer leased, and computes
    their pairs. Each missing expert crosses the bus once, as in one pass."""

    def __init__(self, r: Residency, moe_index: int, ids: list[int], apart: set[int], later: list[int],
                 reuse: list[int]) -> None:
        self.r, self.moe_index, self.ids = r, moe_index, ids
        self.base = moe_index * r.num_experts
        self.apart = apart                  # keys the first pass leaves: the later passes' and the host CPU's
        self.groups = [later[i:i + len(reuse)] for i in range(0, len(later), len(reuse))]
        self.reuse = reuse

    def runs(self, first_row: torch.Tensor):
        """``(table row, pairs)`` per pass: the pair indices (into the layer's ``T*k`` pairs) it computes
        with that row. Between two passes the copies wait for the compute stream's work so far."""
        base = self.base
        yield first_row, [p for p, e in enumerate(self.ids) if base + e not in self.apart]
        r, books = self.r, self.r.books
        for group in self.groups:
            r.counters.extra_passes += 1
            r.pool.copies.after_compute(demand=True)      # no copy overwrites a slot the last pass reads
            slots = self.reuse[:len(group)]
            for slot, key in zip(slots, group):
                books.unassign(slot)                     # the last pass's expert: a miss, not admitted
                books.assign(key, slot)
            r.pool.load(list(zip(slots, group)), demand=True)
            r.pool.copies.wait_for(slots)
            row = r.pool.push_row(self.moe_index)
            mine = set(group)
            yield row, [p for p, e in enumerate(self.ids) if base + e in mine]
