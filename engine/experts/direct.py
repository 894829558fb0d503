"""Direct reads: decode steps whose missing experts the MoE kernels read straight from host memory.

For decode steps of at most ``tuning.direct_max_tokens`` tokens at prefetch depth >= 1, when the MoE kernels
can read the mapped host store, the compute stream never waits for the host or for a copy. Each MoE
layer snapshots its slot-table row on the device; the kernels read a resident expert from its slot
and a missing one (-1) straight from its host-store row over the bus. The host follows the GPU: it
reads each layer's ids, the slots they found and the predictions for later layers, counts hits and
misses, and copies predicted experts into free staging slots on the copy stream, each table entry
written on that stream after its copy (so a snapshot sees a slot only once its bytes are there). No
slot is reused within a step; at the step's end (ordered after its kernels) staging slots whose copies
have landed are released.

A missing expert crosses the bus once. Each step leases up to ``fill_capacity()`` free staging slots
as fill slots; each layer's snapshot gives each of its missing experts, in order of first occurrence,
the next of them (``publish_direct`` in a recorded step, :meth:`_fills_eager` otherwise), and the MoE
kernels that read such an expert from host memory also write it into that slot. The hottest filled
experts are admitted into the pool, evicting colder experts (the policy decides, as for any admission:
at most ``admit_per_step``, spread over the step's layers; under LFU only over a colder victim). The
host chooses them while it follows the running step, layer by layer (:meth:`_admit_early`); their
device-to-device copies from the fill slots, one batched copy, and their table entries are issued at
the step's end, after its kernels. Without fill slots (a static
placement, no free staging slot) the step's hottest misses are instead copied in from the host at its
end (and none while the previous step's admissions are still on the bus), with their copies
overlapping the next step.

A decode step replayed from one CUDA graph publishes into pinned memory (``publish_direct``) and the
host polls it (``follow_published``) while the GPU runs; an eager step reads the same values in one
sync per layer (``_acquire_direct``). Steps switch between this and copying misses in
(``_enter_mode``) only after the other mode's copies have landed.

:class:`DirectReads` is the part of :class:`engine.experts.manager.OffloadedExperts` that does this;
it uses the manager's pool, policy, counters, prefetch gate and prefetch bookkeeping.
"""
from __future__ import annotations

import contextlib
import time
from typing import Sequence

import torch

from engine.experts.adaptive_policy import AdaptiveLFUPolicy
from engine.experts.policy import LFUPolicy, StaticPolicy
from engine.experts.prefetch import Prediction
from engine.experts.step_books import StepBooks
from engine.host_copy import host_to
from kernels.moe_weights import HostExperts
from kernels.publish_ids import publish_direct

UNWRITTEN = -2              # fills a publish region until the GPU has written it

class DirectReads:
    """Direct-read steps of :class:`engine.experts.manager.OffloadedExperts` (see the module doc)."""

    @property
    def direct_reads(self) -> bool:
        """Whether decode steps read missing experts straight from host memory (see the module doc)."""
        if self.pool.full or self.prefetch_depth == 0 or self._direct_opt is False:
            return False
        if self.device.type != "cuda":
            return bool(self._direct_opt)
        return self.store.direct_readable(self.device)

    def direct_for(self, tokens: int) -> bool:
        """Whether a step of ``tokens`` tokens reads missing experts directly."""
        return self.direct_reads and tokens <= self.tuning.direct_max_tokens

    def host_experts(self, moe_index: int) -> HostExperts:
        """Where MoE layer ``moe_index``'s experts without a slot are read from, and its fill row."""
        if self._host_views is None:
            self._host_views = self.layout.views(self.store.rows)
        return HostExperts(self._host_views, moe_index * self.num_experts, self._fill[moe_index])

    def start_direct_step(self, regions: torch.Tensor, tokens: int, predicting: bool = True) -> None:
        """Before a recorded direct-read step of ``tokens`` real tokens is replayed: enter direct
        mode, choose its fill slots and prefetch slots (not for a ``quiet`` recording: ``predicting``
        False), blank the publish regions."""
        self._enter_mode("direct")
        before = set(self.pool.lease)
        armed = self._armed or []
        self._begin_fills()
        self._named, self.books.seen = {}, {}
        dp = self._dp
        if predicting and dp is not None and dp.recorded_targets is not None:
            self._begin_device_prefetch(tokens)
            self.books.dp_active, self.books.dp_replay = True, True
        regions.fill_(UNWRITTEN)
        self._live_leases = frozenset(set(self.pool.lease) - before) | frozenset(armed)
        self._defer_end = True

    def arm_next_step(self) -> None:
        """After a replayed direct-read step was followed: lease and upload the next step's fill slots
        now, while the GPU finishes this step (LM head, sampling), rather than between the two steps
        with the GPU idle. The next replay takes them (:meth:`_begin_fills`); anything else that
        comes first gives them back (:meth:`_disarm`)."""
        if self._armed is None and self._mode == "direct" and self.direct_reads:
            self._begin_fills()
            self._armed, self.books.fill_slots = self.books.fill_slots, None

    def _disarm(self) -> None:
        """Give back fill slots leased for a next step that did not come (nothing was written to them)."""
        armed, self._armed = self._armed, None
        for slot in armed or ():
            if self.pool.lease.get(slot) == -1 and self.pool.owner[slot] < 0:
                self.pool.release_staging(slot)

    def prepare_direct_capture(self) -> None:
        """Before a direct-read step is recorded: bring the device table up to date (outside the capture)."""
        self._disarm()
        self._enter_mode("direct")
        self._step_mode = None
        self._fill_meta.zero_()                     # a warm-up run outside a step fills nothing
        if self._dp is not None:
            self._dp.disarm()                       # ... and claims nothing

    # ---- GPU-side prefetch (engine/experts/device_prefetch.py) --------------------------------------
    def _device_prefetch_for(self, tokens: int) -> bool:
        """Whether this step's predictions are copied in by the GPU itself."""
        return self._dp is not None and self._step_mode != "sync" and self.direct_for(tokens)

    def _ensure_direct_step(self) -> None:
        """An eager direct-read step: enter direct mode; on its first call lease fill and prefetch slots."""
        self._enter_mode("direct")
        if self.defer_eager_ends:
            self._defer_end = True
        if self.books.fill_slots is None:
            self._begin_fills()
            self.books.seen = {}

    def _begin_device_prefetch(self, tokens: int) -> None:
        """Lease the free staging slots for this step's GPU-side prefetch and set its per-layer quota
        (:meth:`_device_quota`)."""
        dp, pool, gate = self._dp, self.pool, self.gate
        quota = self._device_quota(tokens)
        wanted = quota * (self.num_layers - 1)              # at most one claim batch per later layer
        dp.begin([pool.take_staging(-1) for _ in range(min(len(pool.staging_free), dp.free.numel(), wanted))], quota,
                 self.claims.min_votes(tokens, probe=gate.steps % gate.probe_every == 0))
        self.books.dp_tokens = tokens

    def _device_quota(self, tokens: int) -> int:
        """Claims per predicted layer the GPU-side prefetch may make in a step of ``tokens`` tokens:
        the leading ranks of a layer's claims that are mostly used (:class:`ClaimGate`), at most
        ``tuning.prefetch_per_layer``; one rank more on the gate's probe steps, so a closed rank (or a
        prefetch closed altogether) is measured again.

        Measured on the H200 (Qwen3-30B-A3B shape, bf16, 50% pool, depth 2, one claim per layer
        against none, same run): with trained-like routing the first claim of a layer is used 28% of
        the time at batch 1, and claiming is slower than not predicting at all (9.4-10.1 against
        8.3-8.9 ms per token): each wrong copy contends on the bus with the reads the step waits for.
        At batch 8 it is used 61-63% of the time and claiming is faster (4.04 against 4.3-4.4 ms).
        A second claim per layer is used 20% of the time at batch 8 and makes the step slower (4.5
        against 4.0 ms), so ``tuning.prefetch_per_layer`` stays 1. With near-uniform routing claims are
        used 10-16% of the time."""
        gate = self.gate
        quota = self.claims.quota(tokens, self.tuning.prefetch_per_layer, probe=gate.steps % gate.probe_every == 0)
        if not self._admitting_idle(self.pool.copies.busy_slots()):
            quota = 0          # an admission copied in from the host writes its table entry on the copy
            # stream, which the claims do not wait for: they could claim that key and race its entry
        return quota

    def predicts(self, tokens: int) -> bool:
        """Whether this direct-read step of ``tokens`` tokens should predict later layers' experts
        (called after ``begin_step``). False when the GPU-side prefetch may claim nothing this step
        (its guesses were mostly wrong and this is not a probe step): the predictions would feed
        nothing but statistics, and a decode graph recorded without them (``quiet``: no router
        GEMMs and routing for later layers, no claim or copy launches) replays instead. Measured
        on the H200 (Qwen3-30B-A3B shape, bf16, batch 1) those launches take about 0.9 ms a step."""
        if self._dp is None or not self.direct_for(tokens):
            return True
        return self._device_quota(tokens) > 0

    def _launch_device_prefetch(self, moe_index: int, layers: list[int], ids: torch.Tensor) -> None:
        """After ``moe_index`` predicted ``layers`` (``ids [P, T, k]``): let the GPU copy the farthest
        layer's missing experts in (every predicted layer from the first MoE layer)."""
        dp = self._dp
        capturing = self.device.type == "cuda" and torch.cuda.is_current_stream_capturing()
        if not capturing and not self.books.dp_active:
            self._ensure_direct_step()
            self._begin_device_prefetch(ids.shape[1])
        self.books.dp_active, self.books.dp_replay = True, False
        far = moe_index + self.prefetch_depth
        for j, t in enumerate(layers):
            if moe_index == 0 or t == far:
                dp.launch(t, ids[j], self.pool.table, self.store.rows, self.pool.buffer)

    def _collect_device_prefetch(self) -> list[int]:
        """Step end: count the GPU-side prefetches (a hit: its layer found it in its slot), offer the
        used ones to the pool like fills; returns the keys whose table entries must be cleared."""
        dp = self._dp
        claims = dp.collect(dp.recorded_targets if self.books.dp_replay else dp.targets, self.books.dp_records)
        d = self.prefetch_depth
        ranked = []
        for key, slot, rank, votes in claims:
            hit = self.books.seen.get(key) == slot
            ranked.append((rank, hit, votes))
            self.prefetches.count(hit)
            if hit:
                self.gate.on_use(d)
                self.books.filled.setdefault(key, slot)
                self.books.dp_used.add(key)
        self.gate.on_issue(d, len(claims))
        self.claims.record(self.books.dp_tokens, ranked)
        self.counters.device_copy_bytes += len(claims) * self.layout.nbytes
        self.books.dp_active = False
        return [claim[0] for claim in claims]

    # ---- fills: admission without a copy ----------------------------------------------------------
    def fill_capacity(self) -> int:
        """Fill slots a direct-read step can lease now (0: misses are admitted by copying them in)."""
        if isinstance(self.policy, StaticPolicy) or self.pool.slots == 0:
            return 0
        return min(self.admit_per_step, len(self.pool.staging_free), self.num_experts)

    def _begin_fills(self) -> None:
        """Lease this step's fill slots (free staging slots; no table entry points at them), or take
        those armed for it (:meth:`arm_next_step`), already on the device."""
        pool = self.pool
        self.books.fill_used, self.books.filled = 0, {}
        if self._armed is not None:
            self.books.fill_slots, self._armed = self._armed, None
            return
        self.books.fill_slots = [pool.take_staging(-1) for _ in range(self.fill_capacity())]
        n = len(self.books.fill_slots)
        if self._fill_uploaded is not None:
            self._fill_uploaded.synchronize()       # the last step's upload has run long since
        info = self._h_fill_info.numpy()
        info[:2 + n] = [0, n] + self.books.fill_slots
        self._fill_info[:2 + n].copy_(self._h_fill_info[:2 + n], non_blocking=True)
        if self._fill_uploaded is not None:
            self._fill_uploaded.record()

    def _fills_eager(self, moe_index: int, ids: list[int], seen: list[int]) -> list[int]:
        """What the publish kernel does for a recorded step: the fill slot of each id (its first
        missing occurrence takes the next free one); the layer's fill row written for the kernels."""
        row = [-1] * self.num_experts
        for e, s in zip(ids, seen):
            if s < 0 and row[e] < 0 and self.books.fill_used < len(self.books.fill_slots):
                row[e] = self.books.fill_slots[self.books.fill_used]
                self.books.fill_used += 1
        self._fill[moe_index].copy_(host_to(row, torch.int32, self.device))
        return [row[e] for e in ids]

    def _promote_fills(self, admitted: list[tuple[int, int]]) -> None:
        """Copy each admitted ``(slot, key)`` from its fill slot into its pool slot on the compute
        stream, after the step's kernels wrote it (device to device: nothing crosses the bus)."""
        self.pool.copy_slots([(slot, self.books.filled[key]) for slot, key in admitted])
        self.counters.fills += sum(1 for _, key in admitted if key not in self.books.dp_used)

    def publish_direct(self, moe_index: int, topk_ids: torch.Tensor, predicted: Prediction | None,
                       region: torch.Tensor, pad: torch.Tensor | None = None
                       ) -> tuple[torch.Tensor, dict[str, torch.Tensor], HostExperts]:
        """Device work only, recorded into a decode graph: snapshot the layer's slot-table row, and
        publish the ids, the slots they found and the predicted ids into the pinned ``region``.
        ``pad`` (bool [T]): padding rows of ``topk_ids [T, k]`` take row 0's experts first, in place."""
        self._step_mode = "captured"
        pred = predicted[2].reshape(-1) if predicted is not None else None
        publish_direct(self.pool.table[moe_index], self._snap[moe_index], topk_ids.view(-1), pred, region,
                       self._fill[moe_index], self._fill_free, self._fill_meta,
                       None if self._dp is None else self._dp.meta[3:4], moe_index, pad)
        return self._snap[moe_index], self.pool.views, self.host_experts(moe_index)

    def follow_published(self, cuts: Sequence, rows: int) -> None:
        """After a direct-read step's graph was launched: follow it layer by layer (``cuts``: objects
        with ``moe_index``, ``shape`` (T, k), ``predicted`` and ``region``); ``rows`` real tokens."""
        done = torch.cuda.Event()
        done.record()
        for c in cuts:
            t, k = c.shape
            n = t * k
            layers = c.predicted[1] if c.predicted is not None else []
            data = c.region.numpy()[:n * (3 + len(layers))]     # ids, slots found, fill slots, predictions
            self.policy.catch_up()
            t0 = time.perf_counter()
            while (data == UNWRITTEN).any():
                if done.query() and (data == UNWRITTEN).any():
                    raise RuntimeError(f"the decode graph finished without publishing MoE layer {c.moe_index}")
                time.sleep(0)
            self.counters.sync_ms += (time.perf_counter() - t0) * 1e3
            pred = None
            if layers:                                  # every recorded distance, for misses_predicted
                ids = torch.from_numpy(data[3 * n:].copy()).view(len(layers), t, k)[:, :rows]
                self._note_predicted(layers, ids)
                depth = self.gate.depth(self.prefetch_depth)
                if depth > 0:
                    pred = (layers[:depth], ids[:depth])
            self._follow(c.moe_index, data[:rows * k].tolist(), data[n:n + rows * k].tolist(), pred,
                         data[2 * n:2 * n + rows * k].tolist())

    def _acquire_direct(self, moe_index: int,
                        topk_ids: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor], HostExperts]:
        """Eager direct-read acquire: snapshot, read ids / slots / predictions (one sync), follow."""
        self._ensure_direct_step()
        snap = self._snap[moe_index]
        snap.copy_(self.pool.table[moe_index])
        if self.books.dp_active:
            self._dp.set_progress(moe_index)
        flat = topk_ids.reshape(-1).to(torch.int64)                            # [T*k]
        pred = self._predicted if self._predicted is not None and self._predicted[0] == moe_index else None
        self._predicted = None
        parts = [flat, snap[flat].to(torch.int64)] + ([pred[2].reshape(-1)] if pred is not None else [])
        self.counters.host_syncs += 1
        t0 = time.perf_counter()
        host = self._reader.read(torch.cat(parts))
        self.counters.sync_ms += (time.perf_counter() - t0) * 1e3
        n = flat.numel()
        p = None
        depth = self.gate.depth(self.prefetch_depth) if pred is not None else 0
        if depth > 0:
            p = (pred[1][:depth], host[2 * n:].view(pred[2].shape)[:depth])
            self._note_predicted(*p)
        ids, seen = host[:n].tolist(), host[n:2 * n].tolist()
        self._follow(moe_index, ids, seen, p, self._fills_eager(moe_index, ids, seen))
        return snap, self.pool.views, self.host_experts(moe_index)

    def _follow(self, moe_index: int, ids: list[int], seen: list[int],
                predicted: tuple[list[int], torch.Tensor] | None, fills: list[int]) -> None:
        """Host side of one direct-read layer: ``ids`` of its T*k assignments, the slot each found and
        the fill slot each missing one was written into (-1: none)."""
        base = moe_index * self.num_experts
        found = {base + e: s for e, s in zip(ids, seen)}
        for e, f in zip(ids, fills):
            if f >= 0:
                self.books.filled[base + e] = f
        keys = sorted(found)
        misses = [k for k in keys if found[k] < 0]
        self._count_predicted(moe_index, misses)
        self.counters.record(moe_index, ids, len(keys) - len(misses), len(misses))
        self.counters.direct_bytes += sum(1 for s in seen if s < 0) * self.layout.nbytes   # each pair reads its expert
        self.books.seen.update(found)
        for k in keys:
            distance = self.prefetches.take(k)
            if distance is not None:                   # a guess the routing confirmed; if its copy was
                self.prefetches.count(found[k] >= 0)   # still on the bus, as useless as a wrong guess
                if found[k] >= 0:                      # (and the gate counts it so)
                    self.gate.on_use(distance)
        self.policy.touch(keys)
        self.books.misses.extend(misses)
        if predicted is not None and not self.books.dp_active and not self.books.early[0]:   # else the GPU prefetches
            self._prefetch_direct(*predicted)
            self.books.host_prefetched = True
        if self.books.fill_slots and not self.books.host_prefetched and any(f >= 0 for f in fills):
            self._admit_early(moe_index, [base + e for e, f in zip(ids, fills) if f >= 0])

    def _admit_early(self, moe_index: int, keys: list[int]) -> None:
        """Admit layer ``moe_index``'s filled experts while the GPU computes the layers after it (the
        host would otherwise choose victims at the step's end with the GPU idle). Only the host's
        books change now: the copies from the fill slots and the table entries are issued at the
        step's end, after the step's kernels, so this step still reads every evicted expert where it
        was. The step's admissions are spread evenly over its layers. Not in a step whose host issues
        prefetch copies: those check the host's books and would race an evicted expert's entry."""
        admitted, evicted = self.books.early
        room = -(-self.admit_per_step * (moe_index + 1) // self.num_layers) - len(admitted)
        if room > 0:
            more, gone = self._admit(keys, room)
            admitted += more
            evicted += gone

    def _prefetch_direct(self, layers: list[int], ids: torch.Tensor) -> None:
        """Copy predicted experts (``ids [P, T, k]``) into free staging slots; never evicts."""
        origin = layers[0] - 1
        slot_of = self.pool.slot_of
        pairs: list[tuple[int, int]] = []
        for layer, layer_ids in zip(layers, ids):
            base, cap, n = layer * self.num_experts, self.gate.quota(layer - origin), 0
            for e in dict.fromkeys(layer_ids.t().reshape(-1).tolist()):   # every token's first choice first
                key = base + e
                if slot_of[key] >= 0:
                    continue                               # resident, or its copy is on the way
                if cap is not None and n >= cap:
                    break
                slot = self.pool.take_staging(-1)
                if slot is None:
                    break
                self.pool.assign(key, slot)
                pairs.append((slot, key))
                self.prefetches.issued(key, layer - origin)
                n += 1
            self.gate.on_issue(layer - origin, n)
        if pairs:
            self._load_and_publish(pairs)

    # ---- the step's end, deferred past the next step's launch ------------------------------------
    def _close_direct_step(self) -> StepBooks:
        """A replayed step is over but its end is deferred: take its books out (the next step starts
        from fresh ones) with a copy of its claim records, which the next step's claims overwrite."""
        if self.books.dp_active:
            dp = self._dp
            self.books.dp_records = dp.snapshot(dp.recorded_targets if self.books.dp_replay else dp.targets)
        books, self.books = self.books, StepBooks()
        return books

    def finish_ended(self) -> None:
        """End the replayed step whose end was deferred, if any. Called right after the next step is
        launched, so the host counts, admits and evicts while the GPU computes; the copies from its
        fill slots and its slot-table entries queue behind the step just launched, which reads the
        table as it was (the evicted experts still in their slots, the fill slots not leased to it).
        Also called before anything else touches the pool (another kind of step, statistics, a live
        change)."""
        self._disarm()
        books, self._ended = self._ended, None
        if books is None:
            return
        t0 = time.perf_counter()
        mine, self.books = self.books, books
        try:
            self._end_direct_step(keep=self._live_leases)
        finally:
            self.books = mine
            self.counters.step_end_ms += (time.perf_counter() - t0) * 1e3

    def _resident_slot(self, key: int) -> int:
        """The pool slot the host's books give ``key``, or -1 (not resident, or only in staging)."""
        slot = self.pool.slot_of[key]
        return slot if 0 <= slot < self.pool.slots else -1

    def _end_direct_step(self, keep: frozenset[int] = frozenset()) -> None:
        """Release landed staging slots (not those in ``keep``: the next step's), admit the step's
        hottest misses; all ordered after the step's kernels."""
        copies, pool = self.pool.copies, self.pool
        gone: list[int] = []
        busy = set(copies.busy_slots())
        for slot in list(pool.lease):
            if slot not in busy and slot not in keep:
                key = pool.release_staging(slot)
                if key >= 0:
                    gone.append(key)
                    self.prefetches.waste(key)
        if self.books.dp_active:
            gone += self._collect_device_prefetch()
        fills = bool(self.books.fill_slots) or bool(self.books.dp_used)
        early, early_evicted = self.books.early
        admitted, evicted = self._admit(list(self.books.filled) if fills else self.books.misses,
                                        self.admit_per_step - len(early))
        admitted, evicted = early + admitted, early_evicted + evicted
        gone += evicted
        placed = []
        if fills:
            self._promote_fills(admitted)                   # fill slots were released above: reused
            placed = [(k, s) for s, k in admitted]          # only by later steps, after these copies
            kept = {k for k, _ in placed}
            gone = [k for k in gone if k not in kept]      # a prefetch that landed late, then admitted
        # A gone key's entry becomes what the books say: -1, or the pool slot a deferred end of the step
        # before gave it (its entry not yet written when this step's claim took the key); a key this
        # end admits by a copy from the host gets its slot on the copy stream, after the copy.
        copied = set() if fills else {k for _, k in admitted}
        self._write_table(gone + [k for k, _ in placed],
                          [-1 if k in copied else self._resident_slot(k) for k in gone] + [s for _, s in placed],
                          None)                             # compute stream: after the step's kernels
        if gone or admitted or fills:
            copies.after_compute()                          # no copy overwrites a slot before that
        if admitted and not fills:
            self._load_and_publish(admitted)
        self.books = StepBooks()

    def _admit(self, keys: list[int], limit: int) -> tuple[list[tuple[int, int]], list[int]]:
        """Pool slots for the hottest (at most ``limit``) of the step's directly read ``keys``:
        ``(slot, key)`` pairs to fill, evicted keys."""
        pool, policy = self.pool, self.policy
        if limit <= 0:
            return [], []
        cands = [k for k in dict.fromkeys(keys) if pool.slot_of[k] < 0 and policy.admits(k)]
        lfu = isinstance(policy, (LFUPolicy, AdaptiveLFUPolicy))
        if lfu:
            cands.sort(key=policy.hotness, reverse=True)
        busy_slots = pool.copies.busy_slots()
        if busy_slots and not self._admitting_idle(busy_slots):
            return [], []                      # the last admissions are still on the bus: wait for them
        busy = {pool.owner[s] for s in busy_slots} | {k for _, k in self.books.early[0]}   # not yet copied in
        cands = cands[:limit]
        victims = iter(policy.victims(len(cands) - len(pool.free), busy) if len(cands) > len(pool.free) else ())
        admitted, evicted = [], []
        for key in cands:
            slot = pool.take_free()
            if slot is None:
                victim = next(victims, None)        # coldest first; admitted keys were not resident
                if victim is None or (lfu and policy.hotness(victim) >= policy.hotness(key)):
                    break
                slot = pool.slot_of[victim]
                self._evict(victim)
                evicted.append(victim)
            policy.insert(key)
            pool.assign(key, slot)
            busy.add(key)
            admitted.append((slot, key))
        return admitted, evicted

    def _load_and_publish(self, pairs: list[tuple[int, int]]) -> None:
        """Copy ``(slot, key)`` pairs in, then write their table entries on the copy stream; a slot
        counts as busy until its entry is written (a release must not overtake that write)."""
        self.pool.load(pairs, demand=False)
        self._write_table([k for _, k in pairs], [s for s, _ in pairs], self.pool.copies.stream)
        self.pool.copies.extend([s for s, _ in pairs])

    def _admitting_idle(self, busy_slots: list[int]) -> bool:
        """True when none of the copies in flight is an admission (only prefetches into staging)."""
        return all(s >= self.pool.slots for s in busy_slots)

    def _write_table(self, keys: list[int], values: list[int], stream: "torch.cuda.Stream | None") -> None:
        """Device slot-table entries ``keys`` <- ``values`` on ``stream`` (None: the current one)."""
        if not keys:
            return
        cuda = self.device.type == "cuda"
        with torch.cuda.stream(stream or torch.cuda.current_stream(self.device)) if cuda else contextlib.nullcontext():
            self.pool.table.view(-1).index_copy_(0, host_to(keys, torch.int64, self.device),
                                                 host_to(values, torch.int32, self.device))

    def _enter_mode(self, mode: str) -> None:
        """Start this step in ``mode``; switching from the other one first lets its copies land."""
        if self._step_mode == mode:
            return
        if mode != "direct":
            self._disarm()
        self._step_mode = mode
        prev, self._mode = self._mode, mode
        if prev == mode:
            return
        if prev is not None:
            self.pool.copies.synchronize()
        if mode == "sync":
            self._release_all()                    # leases a direct step carried over
        else:
            for layer in sorted(self.pool._stale):  # kernels read the device table as it is
                self.pool.push_row(layer)
