"""``DirectPath``: decode steps whose missing experts the MoE kernels read straight from host memory.

For decode steps of at most ``tuning.direct_max_tokens`` tokens (at prefetch depth 0 without the
gather of shared experts: steps of one token), when the MoE kernels can read the mapped host store,
the compute stream never waits for the host or for a copy.
Each MoE layer snapshots its slot-table row on the device; the kernels read a resident expert from
its slot and a missing one (-1) straight from its host-store row over the bus. The host follows the
GPU: it reads each layer's ids, the slots they found and the predictions for later layers, counts
hits and misses, and copies predicted experts into free staging slots on the copy stream, each table
entry written on that stream after its copy (so a snapshot sees a slot only once its bytes are
there). No slot is reused within a step; at the step's end (ordered after its kernels) staging slots
whose copies have landed are released.

A missing expert crosses the bus once: the kernels that read it also write it into one of the step's
fill slots (engine/experts/fills.py). The hottest filled experts are admitted into the pool,
evicting colder experts (the policy decides, by the one admission rule of
engine/experts/admission.py: at most ``admit_per_step``, spread over the step's layers; under LFU
only over a colder victim). The host chooses them while it follows the running step, layer by layer
(:meth:`_admit_early`); their device-to-device copies from the fill slots, one batched copy, and
their table entries are issued at the step's end, after its kernels. Without fill slots (a static
placement, no free staging slot) the step's hottest misses are instead copied in from the host at
its end (and none while the previous step's admissions are still on the bus), with their copies
overlapping the next step. With the GPU-side prefetch (engine/experts/claims.py) the GPU copies
predicted experts in itself.

A decode step replayed from one CUDA graph publishes into pinned memory (:meth:`publish`) and the
host polls it (:meth:`follow_published`) while the GPU runs; an eager step reads the same values in
one sync per layer (:meth:`acquire`). A replayed step's end is deferred until the next step is
launched (:meth:`finish_ended`), so the host counts, admits and evicts while the GPU computes.
"""
from __future__ import annotations

import time
from typing import Callable, Sequence

import torch

from engine.experts.admission import admit
from engine.experts.cold_graph import GraphCpuShares
from engine.experts.claims import DeviceClaims, admissions_landed
from engine.experts.fills import FillSlots
from engine.experts.gather import GatherSlots
from engine.experts.host_trace import HostTrace
from engine.experts.prefetch import ClaimGate, Prediction
from engine.experts.replay_choice import ReplayChooser
from engine.experts.residency import Residency
from engine.experts.step_books import StepBooks
from engine.experts.device_prefetch import DevicePrefetcher
from kernels.moe_weights import HostExperts
from kernels.publish_ids import SLOT_CPU, publish_direct, publish_direct_ref
from engine.gil import offer_gil

UNWRITTEN = -2              # fills a publish region until the GPU has written it


class DirectPath:
    def __init__(self, r: Residency, direct_reads: bool | None) -> None:
        self.r = r
        self.option = direct_reads                   # None: where the kernels can; True: always; False: never
        L, E, dev = r.num_layers, r.num_experts, r.device
        self.snap = torch.full((L, E), -1, dtype=torch.int32, device=dev)   # each layer's table as it ran
        self._host_views: dict[str, torch.Tensor] | None = None
        self.fills = FillSlots(r)
        self.gather = GatherSlots(r)
        self.top_k = 0                               # experts per token, from the first layer published
        self.claim_gate = ClaimGate(threshold=r.tuning.device_prefetch_threshold)
        dp = DevicePrefetcher(L, E, E, dev) if DevicePrefetcher.usable(dev, r.layout.nbytes) else None
        self.claims = DeviceClaims(r, dp, self.claim_gate) if dp is not None else None
        self.step = StepBooks()                      # the running step's books
        self.ended: StepBooks | None = None          # the books of the step whose end is deferred
        self.live_leases: frozenset[int] = frozenset()   # staging slots the step in flight leased
        # eager direct-read steps defer their ends as replayed ones do: how the CPU tests drive the
        # deferred end, which on CUDA only a graph replay uses
        self.defer_eager_ends = False
        self.shares: GraphCpuShares | None = None    # the host CPU's share in replayed steps, once recorded
        self.trace = HostTrace()                     # the host's timeline of followed steps, when asked
        self.choice = ReplayChooser(self)            # which recording each replay runs, what its time measures

    # ---- when ------------------------------------------------------------------------------------
    @property
    def enabled(self) -> bool:
        """Whether decode steps read missing experts straight from host memory (at prefetch depth 0:
        those of one token, see :meth:`direct_for`)."""
        r = self.r
        if r.pool.full or self.option is False:
            return False
        if r.device.type != "cuda":
            return bool(self.option)
        return r.store.direct_readable(r.device)

    def direct_for(self, tokens: int) -> bool:
        """Whether a decode step of ``tokens`` tokens reads its missing experts directly. At prefetch
        depth 0 such a step is worth it only where it moves no more bytes than copies, which cross
        the bus once per expert: a step of one token, or one whose experts that several tokens use are
        gathered (engine/experts/gather.py); without the gather a step of more tokens would read an
        expert once per token that uses it, so it copies. Either way no layer waits for the host."""
        if not self.enabled or tokens > self.r.tuning.direct_max_tokens:
            return False
        return self.r.prefetch_depth > 0 or tokens == 1 or self.gather.on(tokens)

    @property
    def cpu_share_on(self) -> bool:
        """Whether a recorded step gives the host CPU a share of each layer's missing experts
        (engine/experts/cold_graph.py): with a host store, under ``cold_experts`` auto (on a GPU) or cpu."""
        r = self.r
        return r.store is not None and r.cold.enabled_on(r.device)

    def host_experts(self, moe_index: int) -> HostExperts:
        """Where MoE layer ``moe_index``'s experts without a slot are read from, and its fill row."""
        r = self.r
        if self._host_views is None:
            self._host_views = r.layout.views(r.store.rows)
        return HostExperts(self._host_views, moe_index * r.num_experts, self.fills.rows[moe_index])

    # ---- starting a step -------------------------------------------------------------------------
    def start_replay(self, regions: torch.Tensor, tokens: int, predicting: bool, targets: Sequence[int] = ()) -> None:
        """Before a recorded step of ``tokens`` real tokens is replayed: its fill slots and claim slots
        (none for a ``quiet`` recording, ``predicting`` False, or one that claims for no layer:
        ``targets``, the layers the recording's claim kernels write), the publish regions blanked."""
        self.choice.take(predicting, tokens)
        if self.shares is not None:          # first: a refusal here leaves nothing begun
            self.shares.begin(tokens)
        books = self.r.books
        before = set(books.lease)
        armed = self.fills.armed or []
        self.fills.begin(self.step)
        self.step.seen = {}
        claims = self.claims
        if predicting and claims is not None and targets:
            claims.begin(self.step, tokens)
            self.step.dp_active, self.step.dp_replay, self.step.dp_targets = True, True, list(targets)
        self.gather.begin(self.step, tokens, self.top_k)       # after the claims: what staging is left
        regions.fill_(UNWRITTEN)
        self.live_leases = frozenset(set(books.lease) - before) | frozenset(armed)

    def ensure_step(self, tokens: int, k: int) -> None:
        """An eager step's first direct-read layer (or claim) of ``tokens`` tokens, ``k`` experts each:
        lease its fill and gather slots."""
        if self.step.fill_slots is None:
            self.fills.begin(self.step)
            self.gather.begin(self.step, tokens, k)
            self.step.seen = {}

    def prepare_capture(self) -> None:
        """Before a step is recorded: a warm-up run outside a step fills and claims nothing, and waits
        for no copy of the host's (nobody follows it)."""
        self.fills.meta.zero_()
        self.choice.predict_tuner.recorded()     # the next step of each size may record: not a measure
        if self.claims is not None:
            self.claims.dp.disarm()

    def arm_next_step(self) -> None:
        if self.fills.armed is None and self.enabled:
            self.fills.arm()

    def launch_claims(self, moe_index: int, layers: list[int], ids: torch.Tensor, capturing: bool) -> None:
        """Claims for what ``moe_index`` predicted (``ids [P, T, k]``); an eager step's first one also
        leases the step's claim slots."""
        if not capturing and not self.step.dp_active:
            self.ensure_step(ids.shape[1], ids.shape[2])
            self.claims.begin(self.step, ids.shape[1])
        self.step.dp_active, self.step.dp_replay = True, False
        self.claims.launch(moe_index, layers, ids)

    # ---- following the GPU -----------------------------------------------------------------------
    def publish(self, moe_index: int, topk_ids: torch.Tensor, predicted: Prediction | None,
                region: torch.Tensor, pad: torch.Tensor | None) -> tuple[torch.Tensor, dict, HostExperts]:
        """Device work only, recorded into a decode graph: snapshot the layer's slot-table row, and
        publish the ids, the slots they found and the predicted ids into the pinned ``region``.
        ``pad`` (bool [T]): padding rows of ``topk_ids [T, k]`` take row 0's experts first, in place."""
        r, fills = self.r, self.fills
        t, self.top_k = topk_ids.shape
        pred = predicted[2].reshape(-1) if predicted is not None else None
        args = (r.pool.table[moe_index], self.snap[moe_index], topk_ids.view(-1), pred, region,
                fills.rows[moe_index], fills.free, fills.meta, None if self.claims is None else self.claims.dp.meta[3:4],
                moe_index, pad)
        run = publish_direct if r.device.type == "cuda" else publish_direct_ref
        gather = self.gather.args(moe_index) if self.gather.on(t) else None

        def launch(cpu=None) -> None:
            run(*args, cpu=cpu, gather=gather)
            if gather is not None:
                self.gather.copy(moe_index)

        out = (self.snap[moe_index], r.pool.views, self.host_experts(moe_index))
        if not self.cpu_share_on:
            launch()
            return out
        if self.shares is None:
            self.shares = GraphCpuShares(r, r.layout.hidden, self.gather.on, r.tuning.share_per_recording)
            self.shares.trace = self.trace
        # the model launches the publish (with x and the routing weights) and later the join
        return out + (self.shares.layer(moe_index, topk_ids, self.snap[moe_index], launch),)

    def follow_published(self, cuts: Sequence, rows: int, finished: Callable[[], bool] | None = None) -> None:
        """After a step's graph was launched: end the previous step (its end was deferred) and follow
        this one layer by layer (``cuts``: objects with ``moe_index``, ``shape`` (T, k), ``predicted``
        and ``region``); ``rows`` real tokens. A layer that gave the host CPU experts has them computed
        first (engine/experts/cold_graph.py). While the step gives the CPU a share, the first layer's
        join waits for the host: the previous step's end then comes after that layer's CPU experts, not
        before them. ``finished``: whether the step is over (default: an event recorded now, on CUDA)."""
        if finished is None:
            done = torch.cuda.Event()
            done.record()
            finished = done.query
        # the first layer waits for the host's CPU experts: the previous step's end comes after them, or
        # (tuning.end_late) after the step's last layer, where no join of this step waits for the host
        cpu_first = self.shares is not None and self.shares.frac.numpy()[0] > 0
        late = cpu_first and self.r.tuning.end_late
        self.trace.step_begins()
        if not cpu_first:
            self.finish_ended()
        try:
            for i, c in enumerate(cuts):
                first_end = cpu_first and not late and i == 0
                self._follow_cut(c, rows, finished, self.finish_ended if first_end else None)
            if late:
                self.finish_ended()
                self.r.policy.catch_up()
        except BaseException:
            try:
                if self.shares is not None:
                    self.shares.settle(learn=False)     # the layers it computed still count as the CPU's
            finally:
                self.abort_replay(finished)
            raise
        if self.shares is not None:
            self.shares.settle()
        self.trace.step_followed()

    def abort_replay(self, finished: Callable[[], bool] | None = None, limit_s: float = 30.0) -> None:
        """The host cannot follow the running replay to its end: let every join of the CPU's share
        pass, then wait (at most ``limit_s``) for the replay to finish, so that the next step does
        not clear flags a join of this one still reads."""
        if self.shares is None:
            return
        self.shares.release()
        if finished is None:
            if self.r.device.type == "cuda":
                torch.cuda.current_stream(self.r.device).synchronize()
        else:
            t0 = time.perf_counter()
            while not finished() and time.perf_counter() - t0 < limit_s:
                time.sleep(0.001)
        self.shares.err.numpy()[0] = 0      # the step failed already: not the next one's to report

    def _follow_cut(self, c, rows: int, finished: Callable[[], bool],
                    after_cpu: Callable[[], None] | None = None) -> None:
        """One layer of a replayed step; ``after_cpu`` runs once its CPU experts are handed back,
        before its books (the previous step's end, on the first layer)."""
        r = self.r
        t, k = c.shape
        n = t * k
        layers = c.predicted[1] if c.predicted is not None else []
        data = c.region.numpy()[:n * (3 + len(layers))]     # ids, slots found, fill slots, predictions
        if after_cpu is None:
            r.policy.catch_up()
        t0 = time.perf_counter()
        while (data == UNWRITTEN).any():
            if finished() and (data == UNWRITTEN).any():
                raise RuntimeError(f"the decode graph finished without publishing MoE layer {c.moe_index}")
            offer_gil()
        r.counters.sync_ms += (time.perf_counter() - t0) * 1e3
        self.trace.mark(c.moe_index, "published")
        ids, seen = data[:rows * k].tolist(), data[n:n + rows * k].tolist()
        fills = data[2 * n:2 * n + rows * k].tolist()
        gathers = self.gather.on(t)
        gathered = self.gather.gathered(ids, seen, fills) if gathers else {}
        read = None
        if self.shares is not None and SLOT_CPU in seen:      # the host CPU's experts, then the books
            self.shares.compute(c.moe_index, t, k, rows, ids, seen, finished)
            read = [0 if s == SLOT_CPU else s for s in seen]
            base = c.moe_index * r.num_experts
            self.step.cpu_keys.extend(dict.fromkeys(base + e for e, s in zip(ids, seen) if s == SLOT_CPU))
        if after_cpu is not None:
            after_cpu()
            r.policy.catch_up()
        pred = None
        if layers:                                  # every recorded distance, for misses_predicted
            pids = torch.from_numpy(data[3 * n:].copy()).view(len(layers), t, k)[:, :rows]
            r.forecast.note(layers, pids)
            depth = r.gated_depth()
            if depth > 0:
                pred = (layers[:depth], pids[:depth])
        self._follow(c.moe_index, ids, seen, pred, fills, read, gathered)
        self.trace.mark(c.moe_index, "followed")

    def acquire(self, moe_index: int, topk_ids: torch.Tensor, pred: Prediction | None) -> tuple:
        """Eager direct-read layer: snapshot, read ids / slots / predictions (one sync), follow.
        Returns ``(snapshot, views, HostExperts)``, and a :class:`ColdShare` fourth when the host CPU
        computes some of the missing experts (the kernels then neither read nor fill those)."""
        r = self.r
        self.ensure_step(*topk_ids.shape)
        snap = self.snap[moe_index]
        snap.copy_(r.pool.table[moe_index])
        if self.step.dp_active:
            self.claims.dp.set_progress(moe_index)
        flat = topk_ids.reshape(-1).to(torch.int64)                            # [T*k]
        parts = [flat, snap[flat].to(torch.int64)] + ([pred[2].reshape(-1)] if pred is not None else [])
        host = r.read(torch.cat(parts))
        n = flat.numel()
        p = None
        depth = r.gated_depth() if pred is not None else 0
        if depth > 0:
            p = (pred[1][:depth], host[2 * n:].view(pred[2].shape)[:depth])
            r.forecast.note(*p)
        ids, seen = host[:n].tolist(), host[n:2 * n].tolist()
        direct = not self.gather.on(topk_ids.shape[0])    # read once per token that uses it, unless gathered
        cold = (r.cold_share(moe_index, ids, [s < 0 for s in seen], topk_ids.shape[1], direct, by_kernels=True)
                if -1 in seen else None)
        kernel_seen = seen
        if cold is not None:                 # the CPU's experts: no fill slot, no direct read
            base = moe_index * r.num_experts
            kernel_seen = [0 if base + e in cold.keys else s for e, s in zip(ids, seen)]
            self.step.cpu_keys.extend(sorted(cold.keys))
        fills = self.fills.eager(self.step, moe_index, ids, kernel_seen)
        gathered = {}
        if self.gather.on(topk_ids.shape[0]):
            gathered = self.gather.eager(self.step, moe_index, snap, ids, kernel_seen, fills)
        self._follow(moe_index, ids, seen, p, fills, kernel_seen, gathered)
        out = (snap, r.pool.views, self.host_experts(moe_index))
        return out if cold is None else out + (cold,)

    def _follow(self, moe_index: int, ids: list[int], seen: list[int],
                predicted: tuple[list[int], torch.Tensor] | None, fills: list[int],
                read: list[int] | None = None, gathered: dict[int, int] | None = None) -> None:
        """Host side of one direct-read layer: ``ids`` of its T*k assignments, the slot each found and
        the fill slot each missing one was written into (-1: none); ``read``: the slots as the kernels
        use them (-1: read from host memory), where the host CPU computes some missing experts;
        ``gathered``: expert -> slot of those copied in once before the kernels (in a gather slot, not
        a fill slot, an expert is no candidate for admission)."""
        r, step = self.r, self.step
        base = moe_index * r.num_experts
        found = {base + e: s for e, s in zip(ids, seen)}
        if step.gather_slots:               # a gather slot is the next layer's: never a fill to admit
            spare = set(step.gather_slots)
            fills = [-1 if f in spare else f for f in fills]
        if gathered:
            read = [gathered.get(e, s) for e, s in zip(ids, read or seen)]
            r.counters.gathered += len(gathered)
        for e, f in zip(ids, fills):
            if f >= 0:
                step.filled[base + e] = f
        keys = sorted(found)
        misses = [k for k in keys if found[k] < 0]
        r.forecast.count(moe_index, misses)
        r.counters.record(moe_index, ids, len(keys) - len(misses), len(misses))
        crossings = sum(1 for s in (read or seen) if s < 0) + len(gathered or ())    # per pair; once if gathered
        r.counters.direct_bytes += crossings * r.layout.nbytes
        step.seen.update(found)
        r.count_uses(moe_index, keys, found)   # a guess whose copy was still on the bus counts as wrong
        r.policy.touch(keys)
        step.misses.extend(misses)
        if predicted is not None and not step.dp_active and not step.early[0]:   # else the GPU prefetches
            self._prefetch(*predicted)
            step.host_prefetched = True
        # not while the previous step's end is still to run (tuning.end_late): its admissions would not see
        # this step's early ones and could evict them before their table entries are written
        if step.fill_slots and not step.host_prefetched and self.ended is None and any(f >= 0 for f in fills):
            self._admit_early(moe_index, [base + e for e, f in zip(ids, fills) if f >= 0])

    def _admit_early(self, moe_index: int, keys: list[int]) -> None:
        """Admit layer ``moe_index``'s filled experts while the GPU computes the layers after it (the
        host would otherwise choose victims at the step's end with the GPU idle). Only the host's
        books change now: the copies from the fill slots and the table entries are issued at the
        step's end, after the step's kernels, so this step still reads every evicted expert where it
        was. The step's admissions are spread evenly over its layers. Not in a step whose host issues
        prefetch copies: those check the host's books and would race an evicted expert's entry."""
        admitted, evicted = self.step.early
        room = -(-self.fills.admit_per_step * (moe_index + 1) // self.r.num_layers) - len(admitted)
        if room > 0:
            more, gone = self._admit(keys, room)
            admitted += more
            evicted += gone

    def _prefetch(self, layers: list[int], ids: torch.Tensor) -> None:
        """Copy predicted experts (``ids [P, T, k]``) into free staging slots; never evicts."""
        r, books = self.r, self.r.books
        origin = layers[0] - 1
        pairs: list[tuple[int, int]] = []
        for layer, layer_ids in zip(layers, ids):
            base, cap, n = layer * r.num_experts, r.gate.quota(layer - origin), 0
            for e in dict.fromkeys(layer_ids.t().reshape(-1).tolist()):   # every token's first choice first
                key = base + e
                if books.slot_of[key] >= 0:
                    continue                               # resident, or its copy is on the way
                if cap is not None and n >= cap:
                    break
                slot = books.take_staging(-1)
                if slot is None:
                    break
                books.assign(key, slot)
                pairs.append((slot, key))
                r.ledger.issued(key, layer - origin)
                n += 1
            r.gate.on_issue(layer - origin, n)
        if pairs:
            self._load_and_publish(pairs)

    # ---- the step's end --------------------------------------------------------------------------
    def end_step(self, kind: str | None, defer: bool) -> None:
        """The step is over: ``kind`` the plan's (None: no layer came); ``defer`` lets a step with fill
        slots leave its end for :meth:`finish_ended`."""
        step, claims = self.step, self.claims
        if claims is not None and step.dp_active and not step.dp_replay:
            claims.dp.join()                          # recorded too when the step is being captured
            if kind == "captured":                    # the recording keeps its targets (recorded_claims)
                step.dp_active = False
        if kind == "direct":
            if self.ended is not None:
                self.finish_ended()
            if defer and step.fill_slots and not step.host_prefetched:
                self.ended = self._close()
            else:
                self._end()
        self.live_leases = frozenset()

    def _close(self) -> StepBooks:
        """A replayed step is over but its end is deferred: take its books out (the next step starts
        from fresh ones) with a copy of its claim records, which the next step's claims overwrite."""
        if self.step.dp_active:
            dp = self.claims.dp
            self.step.dp_records = dp.snapshot(self.step.dp_targets if self.step.dp_replay else dp.targets)
        self.gather.release(self.step)      # only its own kernels read them: free for the next step now
        books, self.step = self.step, StepBooks()
        return books

    def finish_ended(self) -> None:
        """End the replayed step whose end was deferred, if any. Called right after the next step is
        launched, so the host counts, admits and evicts while the GPU computes; the copies from its
        fill slots and its slot-table entries queue behind the step just launched, which reads the
        table as it was (the evicted experts still in their slots, the fill slots not leased to it).
        Also called before anything else touches the pool (another kind of step, a live change)."""
        self.fills.disarm()
        books, self.ended = self.ended, None
        if books is None:
            return
        t0 = time.perf_counter()
        self.trace.mark(-1, "end_begins")
        mine, self.step = self.step, books
        try:
            self._end(keep=self.live_leases)
        finally:
            self.step = mine
            self.r.counters.step_end_ms += (time.perf_counter() - t0) * 1e3
            self.trace.mark(-1, "ended")

    def _end(self, keep: frozenset[int] = frozenset()) -> None:
        """Release landed staging slots (not those in ``keep``: the next step's), admit the step's
        hottest misses; all ordered after the step's kernels."""
        r, step = self.r, self.step
        books, copies = r.books, r.pool.copies
        gone: list[int] = []
        busy = set(copies.busy_slots())
        for slot in list(books.lease):
            if slot not in busy and slot not in keep:
                key = books.release_staging(slot)
                if key >= 0:
                    gone.append(key)
                    r.ledger.waste(key)
        if step.dp_active:
            gone += self.claims.collect(step)
        fills = bool(step.fill_slots) or bool(step.dp_used)
        early, early_evicted = step.early
        # one pass over every candidate, so that no admission evicts another of this end's: the
        # filled experts and those the host CPU computed (no fill slot: they are copied in)
        cands = list(step.filled) + step.cpu_keys if fills else step.misses
        chosen, evicted = self._admit(cands, self.fills.admit_per_step - len(early))
        if fills:
            admitted = early + [(s, k) for s, k in chosen if k in step.filled]
            loaded = [(s, k) for s, k in chosen if k not in step.filled]
        else:
            admitted, loaded = chosen, chosen
        evicted = early_evicted + evicted
        gone += evicted
        placed = []
        if fills:
            self.fills.promote(step, admitted)              # fill slots were released above: reused
            placed = [(k, s) for s, k in admitted]          # only by later steps, after these copies
            kept = {k for k, _ in placed}
            gone = [k for k in gone if k not in kept]      # a prefetch that landed late, then admitted
        # A gone key's entry becomes what the books say: -1, or the pool slot a deferred end of the step
        # before gave it (its entry not yet written when this step's claim took the key); a key this
        # end admits by a copy from the host gets its slot on the copy stream, after the copy.
        copied = {k for _, k in loaded}
        r.pool.write_table(gone + [k for k, _ in placed],
                           [-1 if k in copied else books.resident_slot(k) for k in gone] + [s for _, s in placed],
                           None)                            # compute stream: after the step's kernels
        if gone or admitted or loaded or fills:
            copies.after_compute()                          # no copy overwrites a slot before that
        if loaded:
            self._load_and_publish(loaded)
        self.step = StepBooks()

    def _admit(self, keys: list[int], limit: int) -> tuple[list[tuple[int, int]], list[int]]:
        """Pool slots for the hottest (at most ``limit``) of the step's directly read ``keys``:
        ``(slot, key)`` pairs to fill, evicted keys."""
        r, books, policy = self.r, self.r.books, self.r.policy
        if limit <= 0 or books.slots == 0:      # no pool: nothing to admit (and nothing to rank)
            return [], []
        cands = [k for k in dict.fromkeys(keys) if books.slot_of[k] < 0 and policy.admits(k)]
        hotness = policy.hotness if policy.scored else None
        if hotness is not None:
            cands.sort(key=hotness, reverse=True)
        busy_slots = r.pool.copies.busy_slots()
        if busy_slots and not admissions_landed(r):
            return [], []                      # the last admissions are still on the bus: wait for them
        busy = {books.owner[s] for s in busy_slots} | {k for _, k in self.step.early[0]}   # not yet copied in
        cands = cands[:limit]
        victims = iter(policy.victims(len(cands) - len(books.free), busy) if len(cands) > len(books.free) else ())
        admitted, evicted = [], []

        def place(key: int, victim: int | None) -> None:
            if victim is None:
                slot = books.take_free()
            else:                               # coldest first; admitted keys were not resident
                slot = books.slot_of[victim]
                r.evict(victim)
                evicted.append(victim)
            policy.insert(key)
            books.assign(key, slot)
            busy.add(key)
            admitted.append((slot, key))

        admit(cands, limit, len(books.free), lambda: next(victims, None), hotness, place)
        return admitted, evicted

    def _load_and_publish(self, pairs: list[tuple[int, int]]) -> None:
        """Copy ``(slot, key)`` pairs in, then write their table entries on the copy stream; a slot
        counts as busy until its entry is written (a release must not overtake that write)."""
        pool = self.r.pool
        pool.load(pairs, demand=False)
        pool.write_table([k for _, k in pairs], [s for s, _ in pairs], pool.copies.stream)
        pool.copies.extend([s for s, _ in pairs])
