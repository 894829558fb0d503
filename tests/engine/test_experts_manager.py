"""ExpertManager on the CPU: results equal the fully resident provider, counters equal hand counts."""
from __future__ import annotations

import pytest
import torch

from engine.errors import ConfigError, ReconfigureError
from engine.experts import pool as pool_module
from engine.experts.predict_tuner import PredictTuner
from test_experts_support import D, E, K, L, Stack, route, run_layers


@pytest.fixture(scope="module")
def stack() -> Stack:
    return Stack()


def _x(tokens: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(tokens, D, generator=torch.Generator().manual_seed(seed))


def _reference(stack: Stack, tokens: int, steps: int) -> list[torch.Tensor]:
    return stack.run(stack.resident(), _x(tokens), steps)


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x, y)


# pool sizes: 0 (all staged), 1 (below one layer's active set of 3 tokens x top-2), half, all
@pytest.mark.parametrize("slots", [0, 1, L * E // 2, L * E])
@pytest.mark.parametrize("depth", [0, 1, 2])
@pytest.mark.parametrize("policy", ["lru", "lfu", "adaptive", "static"])
def test_outputs_identical_to_resident(stack: Stack, slots: int, depth: int, policy: str) -> None:
    ref = _reference(stack, tokens=3, steps=3)
    profile = [[(l * 7 + e * 3) % 5 for e in range(E)] for l in range(L)]
    prov = stack.offloaded(slots, depth, policy, routing_profile=profile)
    _same(stack.run(prov, _x(3), 3), ref)
    st = prov.stats()
    assert st.pool_slots_total == slots
    assert st.hits + st.misses > 0
    assert st.policy == ("adaptive 0.9" if policy == "adaptive" else policy)   # adaptive: the memory it uses


def test_full_pool_all_hits_without_sync(stack: Stack) -> None:
    prov = stack.offloaded(None, depth=2)
    x = _x(3)
    stack.run(prov, x, 2)
    st = prov.stats()
    assert prov.host_syncs == 0 and st.misses == 0
    # hand count: distinct experts per layer call over the same two steps on the resident provider
    res = stack.resident()
    stack.run(res, x, 2)
    acts = res.activations()
    assert st.activations == acts
    assert st.h2d_bytes == L * E * stack.layout.nbytes       # the initial fill only
    assert st.pool_slots_used == st.pool_slots_total == L * E
    assert st.per_layer_hit_rate == (1.0,) * L
    assert sum(sum(r) for r in acts) == 2 * 3 * 2 * L          # steps x tokens x k x layers


def test_a_router_that_counts_a_full_pools_calls_leaves_the_same_stats(stack: Stack) -> None:
    # The model's Triton router adds a full pool's layer call to the device tally itself
    # (route_tally, kernels/router.route(tally_into=...)); acquire then counts nothing more: the
    # stats equal a run whose acquire counts each call.
    from kernels.fused_moe import fused_moe_ref
    from kernels.router import route_ref
    plain, counted = stack.offloaded(None, depth=2), stack.offloaded(None, depth=2)
    x = _x(3)
    stack.run(plain, x, 2)
    for _ in range(2):
        counted.begin_step()
        h = x
        for layer in range(L):
            counted.before_layer(layer, h)
            target = counted.route_tally(layer)
            assert target is not None
            w, ids = route_ref(h @ stack.routers[layer].t(), K, renormalize=True, tally_into=target)
            slot_of, views = counted.acquire(layer, ids)[:2]
            h = h + fused_moe_ref(h, ids, w, slot_of, views, stack.layout)
        counted.end_step()
        x = torch.tanh(h)
    a, b = plain.stats(), counted.stats()
    assert b.activations == a.activations and (b.hits, b.misses) == (a.hits, a.misses) and b.hits > 0
    assert stack.offloaded(L * E // 2, depth=2).route_tally(0) is None     # a partial pool counts on the host


class _Fixed:
    """Acquire a fixed id sequence on one layer, one step per id list."""

    def __init__(self, prov) -> None:
        self.prov = prov

    def __call__(self, seq: list[list[int]], layer: int = 0) -> None:
        for ids in seq:
            self.prov.begin_step()
            self.prov.acquire(layer, torch.tensor([ids]).view(-1, 1))
            self.prov.end_step()


def test_lru_two_slots_exact_misses(stack: Stack) -> None:
    prov = stack.offloaded(2, depth=0, policy="lru")
    # 0 m, 1 m, 0 h, 2 m (evicts 1), 1 m (evicts 0), 0 m (evicts 2), 1 h, 1 h
    _Fixed(prov)([[0], [1], [0], [2], [1], [0], [1], [1]])
    st = prov.stats()
    assert (st.hits, st.misses) == (3, 5)
    assert st.h2d_bytes == 5 * stack.layout.nbytes
    assert prov.host_syncs == 8
    assert st.pool_slots_used == 2
    assert st.per_layer_hit_rate[0] == pytest.approx(3 / 8)


def test_lfu_keeps_the_hot_expert(stack: Stack) -> None:
    prov = stack.offloaded(2, depth=0, policy="lfu")
    # 0 is used thrice, 1 once; 2 must then evict 1 (LRU would evict 0)
    _Fixed(prov)([[0], [1], [0], [0], [2], [0]])
    st = prov.stats()
    assert (st.hits, st.misses) == (3, 3)


def test_static_placement_never_evicts(stack: Stack) -> None:
    profile = [[0] * E for _ in range(L)]
    profile[0][5], profile[0][6] = 10, 9
    prov = stack.offloaded(2, depth=0, policy="static", routing_profile=profile)
    fill = prov.stats().h2d_bytes
    _Fixed(prov)([[5], [1], [6], [1], [5]])
    st = prov.stats()
    assert (st.hits, st.misses) == (3, 2)                      # 1 is staged every time
    assert st.h2d_bytes - fill == 2 * stack.layout.nbytes
    assert prov.pool.books.slot_of[5] >= 0 and prov.pool.books.slot_of[6] >= 0


def test_current_layer_pinned_and_staged_beyond_pool(stack: Stack) -> None:
    prov = stack.offloaded(1, depth=0, policy="lru")
    prov.begin_step()
    slot_of, _ = prov.acquire(0, torch.tensor([[0, 1], [2, 3]]))
    slots = slot_of[:4].tolist()
    assert len(set(slots)) == 4 and min(slots) >= 0            # four distinct slots, three of them staging
    assert sum(s >= prov.pool.slots for s in slots) == 3
    prov.end_step()
    assert prov.stats().pool_slots_used == 1


def test_prefetch_pins_survive_demand(stack: Stack) -> None:
    prov = stack.offloaded(3, depth=1, policy="lru")
    x = _x(1, seed=4)
    prov.begin_step()
    prov.before_layer(0, x)
    prov.acquire(0, route(x @ stack.routers[0].t())[1])
    predicted = {k for k, j in prov.books.prefetched.items() if j == 1}
    assert predicted and all(prov.pool.books.slot_of[k] >= 0 for k in predicted)
    assert prov.policy.victim(prov.books.pins) not in predicted
    _, ids = route(x @ stack.routers[1].t())
    prov.acquire(1, ids)
    prov.end_step()
    st = prov.stats()
    assert st.prefetch_hits == len(predicted)                  # same hidden state: the guess is exact


def test_shrink_and_grow_between_steps_preserve_results(stack: Stack) -> None:
    ref = _reference(stack, tokens=4, steps=6)
    prov = stack.offloaded(L * E // 2, depth=1, policy="lfu")
    sizes = [3, 0, L * E, 5, L * E // 2, 1]
    msgs = []
    outs = stack.run(prov, _x(4), 6, between=lambda i: msgs.append(
        prov.reconfigure(pool_bytes=sizes[i] * stack.layout.nbytes, prefetch_depth=i % 3)))
    _same(outs, ref)
    assert prov.stats().pool_slots_total == 1 and "1 slots" in msgs[-1]


@pytest.mark.parametrize("policy", ["lru", "lfu"])
def test_shrink_after_a_grow_keeps_every_resident_evictable(stack: Stack, policy: str) -> None:
    # A pool grown to every expert before it ever missed, then shrunk: the experts the grow placed
    # must be known to the policy, else none of them is ever a victim and the pool admits nothing.
    nb = stack.layout.nbytes
    prov = stack.offloaded(L * E // 2, depth=2, policy=policy)
    prov.reconfigure(pool_bytes=L * E * nb, prefetch_depth=0)
    stack.run(prov, _x(2), 1)
    prov.reconfigure(pool_bytes=(L * E // 2) * nb, prefetch_depth=2)
    resident = set(prov.pool.books.resident_keys())
    assert len(resident) == L * E // 2
    assert set(prov.policy.victims(len(resident), set())) == resident
    before = prov.stats().misses
    stack.run(prov, _x(3, 5), 3)
    assert prov.stats().misses > before                      # the new input misses ...
    assert set(prov.pool.books.resident_keys()) != resident        # ... and the pool takes some of it in


def test_grow_over_budget_rolls_back(stack: Stack) -> None:
    nb = stack.layout.nbytes
    prov = stack.offloaded(4, depth=0, budget_bytes=(4 + 2 * E) * nb)
    stack.run(prov, _x(2), 1)
    before = prov.stats()
    with pytest.raises(ReconfigureError, match="budget"):
        prov.reconfigure(pool_bytes=10 * nb)
    after = prov.stats()
    assert after.pool_slots_total == 4 and after.pool_slots_used == before.pool_slots_used
    _same(stack.run(prov, _x(2, 9), 2), stack.run(stack.resident(), _x(2, 9), 2))


def test_failed_allocation_rolls_back(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    ref = _reference(stack, tokens=2, steps=2)
    prov = stack.offloaded(6, depth=1)
    stack.run(prov, _x(2), 1)
    kept = sorted(prov.pool.books.resident_keys())
    real = pool_module.allocate_slots

    def refuse_big(rows: int, nbytes: int, device: torch.device) -> torch.Tensor:
        if rows > 6 + 2 * E:
            raise ReconfigureError("allocating the expert pool failed (out of memory); lower expert_pool_size")
        return real(rows, nbytes, device)

    monkeypatch.setattr(pool_module, "allocate_slots", refuse_big)
    with pytest.raises(ReconfigureError, match="out of memory"):
        prov.reconfigure(pool_bytes=20 * stack.layout.nbytes, prefetch_depth=0)
    assert prov.prefetch_depth == 1 and prov.pool.slots == 6
    assert sorted(prov.pool.books.resident_keys()) == kept
    _same(stack.run(prov, _x(2), 2), ref)


def test_reconfigure_policy_and_errors(stack: Stack) -> None:
    prov = stack.offloaded(4, depth=0, policy="lru")
    stack.run(prov, _x(2), 1)
    assert "policy lfu" in prov.reconfigure(policy="lfu")
    with pytest.raises(ReconfigureError, match="routing profile"):
        prov.reconfigure(policy="static")
    with pytest.raises(ReconfigureError, match="prefetch_depth"):
        prov.reconfigure(prefetch_depth=-1)
    prov.begin_step()
    with pytest.raises(ReconfigureError, match="between engine steps"):
        prov.reconfigure(prefetch_depth=1)
    prov.end_step()
    assert prov.policy.name == "lfu" and prov.prefetch_depth == 0


def test_bad_construction_is_one_line(stack: Stack) -> None:
    with pytest.raises(ConfigError, match="routing profile"):
        stack.offloaded(2, policy="static")
    with pytest.raises(ConfigError, match="budget"):
        stack.offloaded(4, budget_bytes=stack.layout.nbytes)
    with pytest.raises(ConfigError, match="recorded for"):
        stack.offloaded(2, policy="static", routing_profile=[[1] * E])


def test_lfu_victim_is_the_coldest_unpinned_resident_under_random_use() -> None:
    # Uses update scores without touching the heap; the victim must still be exactly the resident
    # with the lowest (decayed count, last use), skipping pinned keys, through evictions,
    # re-insertions and the per-step decay.
    import random

    from engine.experts.policy import LFUPolicy
    rng = random.Random(0)
    lfu = LFUPolicy(decay=0.8)
    resident: set[int] = set()
    for step in range(300):
        lfu.tick()
        for _ in range(3):
            k = rng.randrange(40)
            if k not in resident and len(resident) < 25:
                lfu.insert(k)
                resident.add(k)
        lfu.touch(rng.sample(range(40), 6))
        pinned = set(rng.sample(sorted(resident), min(4, len(resident))))
        want = min((k for k in resident if k not in pinned),
                   key=lambda k: lfu.entry(k)[:2], default=None)
        got = lfu.victim(pinned)
        assert got == want, step
        if got is not None and step % 2:
            lfu.remove(got)
            resident.discard(got)


def test_direct_step_admits_while_following_and_publishes_at_its_end(stack: Stack) -> None:
    # A direct-read step admits each layer's filled experts as it follows the layer (the host's books
    # change then); the device table and the pool bytes change only at the step's end, so the layers
    # after it still read every evicted expert where it was; afterwards table and books agree.
    from test_experts_support import fused_moe_ref
    prov = stack.offloaded(L * E // 4, depth=1, policy="lfu", direct_reads=True)
    x = _x(3)
    stack.run(prov, x, 2)
    prov.begin_step()
    early_seen = False
    for l in range(L):
        prov.before_layer(l, x)
        w, ids = route(x @ stack.routers[l].t())
        slot_of, views, *host = prov.acquire(l, ids)
        x = x + fused_moe_ref(x, ids, w, slot_of, views, stack.layout, *host)     # writes the fills
        admitted, _ = prov.direct.step.early
        table = prov.pool.table.view(-1)
        for slot, key in admitted:
            early_seen = True
            assert prov.pool.books.slot_of[key] == slot and int(table[key]) < 0
    prov.end_step()
    assert early_seen
    assert prov.pool.table.view(-1).tolist() == prov.pool.books.slot_of
    for key, slot in enumerate(prov.pool.books.slot_of):
        if 0 <= slot < prov.pool.slots:
            assert torch.equal(prov.pool.buffer[slot], stack.store.rows[key])


def _direct_layers(stack: Stack, prov, x: torch.Tensor) -> torch.Tensor:
    """Every layer of one eager direct-read step (the kernels write the fill slots)."""
    return run_layers(stack, prov, x)


def _start_replayed(prov, keep_ended: bool) -> frozenset[int]:
    """What a replayed step does before its launch: begin, lease its slots, mark its end deferrable;
    returns the staging slots it leased."""
    prov.begin_step(keep_ended=keep_ended)
    before = set(prov.pool.books.lease)
    prov.replay_hooks.start_direct_step(torch.empty(L, 64, dtype=torch.int64), tokens=3)
    return frozenset(set(prov.pool.books.lease) - before)


def _books_match_pool(stack: Stack, prov) -> None:
    table = prov.pool.table.view(-1).tolist()
    for key, slot in enumerate(prov.pool.books.slot_of):
        if 0 <= slot < prov.pool.slots:
            assert table[key] == slot and torch.equal(prov.pool.buffer[slot], stack.store.rows[key])
        else:
            assert table[key] < 0 or table[key] >= prov.pool.slots


def test_deferred_step_end_runs_behind_the_next_step(stack: Stack) -> None:
    # A replayed step's end waits until the next step is launched: the next step leases its own fill
    # slots while the ended step still holds its; finishing the ended step releases only its slots,
    # promotes its admissions, and leaves table, books and pool bytes in agreement.
    prov = stack.offloaded(L * E // 4, depth=1, policy="lfu", direct_reads=True)
    x = _x(3)
    stack.run(prov, x, 2)
    first = _start_replayed(prov, keep_ended=False)
    y = _direct_layers(stack, prov, x)
    prov.end_step()
    assert prov.direct.ended is not None and first and first <= set(prov.pool.books.lease)
    ended_admits = [k for _, k in prov.direct.ended.early[0]]
    second = _start_replayed(prov, keep_ended=True)
    assert second and not (second & first)                   # the ended step's fill slots stay its own
    prov.replay_hooks.finish_ended()
    assert prov.direct.ended is None and set(prov.pool.books.lease) == set(second)
    assert prov.direct.step.fill_slots is not None and set(prov.direct.step.fill_slots) <= second
    assert all(prov.pool.books.slot_of[k] >= 0 for k in ended_admits)
    _books_match_pool(stack, prov)
    _direct_layers(stack, prov, y)
    prov.end_step()
    assert prov.direct.ended is not None
    prov.settle()                                            # ends the deferred step
    st = prov.stats()
    assert prov.direct.ended is None and not prov.pool.books.lease and st.fills > 0
    _books_match_pool(stack, prov)


def test_a_deferred_step_gives_its_gather_slots_back_at_once(stack: Stack) -> None:
    # A replayed step of several tokens leases gather slots; only its own kernels use them, so when its
    # end is deferred they go back at once (the next step may gather into them), while its fill slots
    # stay leased until its end.
    prov = stack.offloaded(L * E // 4, depth=1, policy="lru", direct_reads=True)
    prov.direct.top_k = K                     # as recording the step would have told it
    x = _x(3)
    stack.run(prov, x, 1)
    _start_replayed(prov, keep_ended=False)
    leased = list(prov.direct.step.gather_slots)
    assert len(leased) == 3 * K // 2 and set(leased) <= set(prov.pool.books.lease)
    _direct_layers(stack, prov, x)
    prov.end_step()
    assert prov.direct.ended is not None and not set(leased) & set(prov.pool.books.lease)
    prov.settle()
    assert not prov.pool.books.lease


def test_fill_slots_armed_for_the_next_step(stack: Stack) -> None:
    # After a replayed step is followed, its host leases and uploads the next step's fill slots while
    # the GPU finishes the step: the next replay takes them (the ended step's end leaves them leased)
    # and computes what a step that leased its own would; a step of another kind gives them back.
    def replayed_step(prov, x, arm: bool):
        armed = list(prov.direct.fills.armed or [])
        live = _start_replayed(prov, keep_ended=True) | frozenset(armed)
        if armed:
            assert prov.direct.step.fill_slots == armed and prov.direct.fills.armed is None
        prov.replay_hooks.finish_ended()
        assert set(prov.pool.books.lease) == set(live)
        y = _direct_layers(stack, prov, x)
        prov.end_step()
        if arm:
            prov.replay_hooks.arm_next_step()
        return y

    outs = []
    for arm in (False, True):
        prov = stack.offloaded(L * E // 4, depth=1, policy="lfu", direct_reads=True)
        x, ys = _x(3), []
        stack.run(prov, x, 2)
        for step in range(4):
            ys.append(replayed_step(prov, x * (step + 1), arm))
            if arm:
                armed = prov.direct.fills.armed
                assert armed and not (set(armed) & set(prov.direct.ended.fill_slots or []))
                meta, free = prov.direct.fills.uploaded()
                assert meta == [0, len(armed)] and free[:len(armed)] == armed
        outs.append(ys)
        prov.settle()                       # not the next replay: the armed slots go back
        st = prov.stats()
        assert prov.direct.fills.armed is None and not prov.pool.books.lease and st.fills > 0
        _books_match_pool(stack, prov)
    _same(outs[1], outs[0])


def test_deferred_end_outputs_identical(stack: Stack) -> None:
    # Steps whose ends are deferred (finished when the next step starts) give the same outputs.
    ref = _reference(stack, tokens=2, steps=5)
    prov = stack.offloaded(L * E // 4, depth=2, policy="lfu", direct_reads=True)
    prov.direct.defer_eager_ends = True
    _same(stack.run(prov, _x(2), 5), ref)
    assert prov.direct.ended is not None
    prov.settle()
    assert prov.stats().fills > 0 and prov.direct.ended is None


def test_reading_stats_changes_nothing(stack: Stack) -> None:
    # The workbench polls stats at 10 Hz: a poll must not end a deferred step or give slots back.
    prov = stack.offloaded(L * E // 4, depth=2, policy="lfu", direct_reads=True)
    prov.direct.defer_eager_ends = True
    stack.run(prov, _x(2), 3)
    leases = dict(prov.pool.books.lease)
    assert leases                                            # the deferred step still holds its slots
    first = prov.stats()
    assert prov.stats() == first and prov.pool.books.lease == leases
    prov.settle()
    assert not prov.pool.books.lease and prov.stats().fills >= first.fills


def test_claim_of_a_key_the_deferred_end_admitted_keeps_its_pool_slot(stack: Stack) -> None:
    # The step before admitted key K into pool slot S, but its deferred table entry lands after this
    # step's kernels, so this step's claim kernel saw K missing and claimed it into a staging slot X.
    # This step's end clears its claims' entries: K's must become S (what the books say), not -1.
    import numpy as np
    prov = stack.offloaded(4, depth=1, policy="lru", direct_reads=True)
    assert prov.device_prefetcher is not None
    pool, key, layer = prov.pool, 5, 0
    prov.begin_step()
    prov.plan_step("direct")
    prov.direct.ensure_step(1, 2)
    slot = pool.books.take_free()
    pool.books.assign(key, slot)                                   # admitted by the ended step (books)
    pool.buffer[slot].copy_(stack.store.rows[key])
    claim = pool.books.take_staging(-1)
    pool.table.view(-1)[key] = claim                         # the claim kernel's entry
    m = prov.device_prefetcher.max_claims
    records = np.zeros((1, 1 + 3 * m), dtype=np.int64)                     # count, keys, slots, votes
    records[0, 0], records[0, 1], records[0, 1 + m], records[0, 1 + 2 * m] = 1, key, claim, 1
    prov.device_prefetcher.targets = [layer]
    prov.direct.step.dp_active, prov.direct.step.dp_replay, prov.direct.step.dp_records, prov.direct.step.dp_tokens = True, False, records, 1
    prov.end_step()
    assert int(pool.table.view(-1)[key]) == slot == pool.books.slot_of[key]
    assert prov.stats().prefetch_wasted == 1


@pytest.mark.parametrize("name", ["lfu", "lru", "adaptive"])
def test_victims_in_one_pass_equal_successive_victims(name: str) -> None:
    # A step end asks for all its victims at once; they must be the keys that asking one at a time
    # and evicting each would give, in that order, never a pinned one.
    import random

    from engine.experts.policies import make_policy
    rng = random.Random(1)
    one, batch = make_policy(name), make_policy(name)
    for k in range(30):
        for p in (one, batch):
            p.insert(k)
    for step in range(200):
        used = rng.sample(range(30), 7)
        for p in (one, batch):
            p.tick()
            p.touch(used)
        pinned = set(rng.sample(range(30), 5))
        n = rng.randrange(1, 12)
        want = []
        for _ in range(n):
            v = one.victim(pinned | set(want))
            if v is None:
                break
            want.append(v)
        got = batch.victims(n, pinned)
        assert got == want and not pinned & set(got), step
        for p in (one, batch):          # evict and re-admit, as a step end does
            for v in got:
                p.remove(v)
                p.insert(v)
    assert make_policy("static", [[1, 2]]).victims(3, set()) == []


def _drive(policy, stream, capacity: int, admit_per_step: int | None) -> float:
    """Run ``policy`` as the pool's would be over ``stream`` (one list of keys per step, one layer
    call each); the real pool is an LFU pool of ``capacity`` keys under ``policy``'s victims.
    Returns its hit rate."""
    policy.admit_per_step = admit_per_step
    resident: set[int] = set()
    hits = uses = 0
    for keys in stream:
        policy.tick()
        policy.touch(keys)
        for k in keys:
            uses += 1
            if k in resident:
                hits += 1
            elif len(resident) < capacity:
                resident.add(k)
                policy.insert(k)
            else:
                v = policy.victim(set(keys))
                if v is not None and policy.hotness(v) < policy.hotness(k):
                    resident.discard(v)
                    policy.remove(v)
                    resident.add(k)
                    policy.insert(k)
    return hits / uses


@pytest.mark.parametrize("admit_per_step", [None, 4])
def test_adaptive_lfu_picks_the_memory_the_routing_rewards(admit_per_step) -> None:
    # Independent draws over skewed popularity reward a long memory; a working set that drifts
    # (each sequence's recent experts) a short one. The adaptive policy settles on each and hits as
    # often as the better fixed decay does.
    import random

    from engine.experts.adaptive_policy import AdaptiveLFUPolicy
    from engine.experts.policy import LFUPolicy
    rng = random.Random(3)
    weights = [1.0 / (i + 1) ** 0.8 for i in range(200)]
    skewed = [rng.choices(range(200), weights, k=8) for _ in range(1500)]
    skewed = [list(dict.fromkeys(s)) for s in skewed]
    drifting = [[(t // 3 + j) % 200 for j in range(8)] + [rng.randrange(200)] for t in range(1500)]
    for stream, want in ((skewed, 0.99), (drifting, 0.9)):
        rates = {d: _drive(LFUPolicy(d), stream, 40, admit_per_step) for d in (0.9, 0.99)}
        assert max(rates, key=rates.get) == want                    # the streams do reward them
        adaptive = AdaptiveLFUPolicy()
        rate = _drive(adaptive, stream, 40, admit_per_step)
        assert adaptive.decay == want
        assert rate >= rates[want] - 0.01 and rate > rates[0.9 if want == 0.99 else 0.99]


def test_adaptive_lfu_survives_score_rescaling() -> None:
    # A short memory's scores are divided down every few hundred steps; the shadow pools redo their
    # heaps then and keep finding their coldest keys.
    import random

    from engine.experts.adaptive_policy import AdaptiveLFUPolicy
    rng = random.Random(5)
    adaptive = AdaptiveLFUPolicy(decays=(0.3, 0.9))
    stream = [rng.sample(range(60), 6) for _ in range(1200)]
    rate = _drive(adaptive, stream, 20, 3)
    assert adaptive.memories[0].rescales >= 3
    assert 0.0 < rate < 1.0
    assert all(n <= 20 for n in adaptive.shadow_sizes)
    assert set(adaptive.victims(20, set())) == set(adaptive.memories[0].resident) and adaptive.memories[0].size <= 20


def test_busy_slots_queries_each_copy_batch_once() -> None:
    # Slots of one copy batch share its event; a step end asks about every lease, so each event is
    # asked once, landed slots are forgotten and the rest stay busy.
    from engine.experts.prefetch import CopyEngine

    class Event:
        def __init__(self, landed: bool) -> None:
            self.landed, self.queries = landed, 0

        def query(self) -> bool:
            self.queries += 1
            return self.landed

    copies = CopyEngine(torch.device("cpu"))
    done, flying = Event(True), Event(False)
    copies.track(range(10), done)
    copies.track(range(10, 30), flying)
    assert copies.busy_slots() == list(range(10, 30))
    assert done.queries == 1 and flying.queries == 1
    assert copies.tracked == list(range(10, 30))


@pytest.mark.parametrize("nbytes", [24, 20, 6])
def test_pool_copies_slots_in_one_batch(nbytes: int) -> None:
    # Promoting fill slots: buffer[dst] <- buffer[src] for every pair, whatever word size the slot
    # size allows, other slots untouched.
    from engine.experts.pool import ExpertPool

    pool = ExpertPool.__new__(ExpertPool)
    pool.nbytes = nbytes
    pool.buffer = torch.randint(0, 256, (6, nbytes), dtype=torch.uint8)
    before = pool.buffer.clone()
    pool.copy_slots([(0, 4), (2, 5), (3, 1)])
    assert torch.equal(pool.buffer[[0, 2, 3]], before[[4, 5, 1]])
    assert torch.equal(pool.buffer[[1, 4, 5]], before[[1, 4, 5]])
    pool.copy_slots([])


# Direct reads: misses are read from the host store by the MoE itself; the host follows, prefetches
# into staging slots and admits misses into the pool at the step's end.
@pytest.mark.parametrize("gather", [True, False])
def test_at_depth_0_direct_steps_cross_the_bus_once_per_missing_expert(stack: Stack, gather: bool) -> None:
    # One token reads each missing expert once, as a copy would, so no layer waits on the host. Three
    # tokens read directly too when the experts several of them use are gathered (each crosses once);
    # without the gather they would read such an expert once per token, so they copy.
    from engine.experts.tuning import ResidencyTuning
    ref1, ref3 = _reference(stack, tokens=1, steps=3), _reference(stack, tokens=3, steps=3)
    prov = stack.offloaded(L * E // 4, 0, "lru", direct_reads=True, tuning=ResidencyTuning(gather_shared=gather))
    assert ("read directly in steps of one token, copied in otherwise" in prov.describe()) != gather
    _same(stack.run(prov, _x(1), 3), ref1)
    st = prov.stats()
    assert st.misses > 0 and st.direct_bytes == st.misses * stack.layout.nbytes    # each miss read once
    _same(stack.run(prov, _x(3), 3), ref3)
    after = prov.stats()
    assert prov.direct_for(3) == gather
    if gather:                                                    # every miss of the 3-token steps crossed once
        assert after.gathered > 0 and after.direct_bytes == after.misses * stack.layout.nbytes
    else:
        assert after.direct_bytes == st.direct_bytes             # the 3-token steps copied
    prov.reconfigure(prefetch_depth=1)
    assert prov.direct_for(3) and "read directly in steps of one token" not in prov.describe()


@pytest.mark.parametrize("depth", [0, 1])
def test_gathering_every_missing_expert_copies_each_in_before_its_layer(stack: Stack, depth: int) -> None:
    # gather_min_uses=1: steps of one token gather too, so every missing expert is copied in by the
    # gather's copy before the layer's kernels (which then read device memory), once; the outputs
    # are the resident model's. set_gather switches between that and the default between steps.
    from engine.experts.tuning import ResidencyTuning
    ref1, ref3 = _reference(stack, tokens=1, steps=3), _reference(stack, tokens=3, steps=3)
    prov = stack.offloaded(L * E // 4, depth, "lru", direct_reads=True, tuning=ResidencyTuning(gather_min_uses=1))
    assert "copied in by the device's kernels before each layer's kernels" in prov.describe()   # the CPU: no GPU
    assert prov.direct.gather.on(1) and prov.direct_for(1)
    _same(stack.run(prov, _x(1), 3), ref1)
    st = prov.stats()
    assert st.misses > 0 and st.gathered == st.misses                   # every miss gathered
    assert st.direct_bytes == st.misses * stack.layout.nbytes           # each crossed the bus once
    _same(stack.run(prov, _x(3), 3), ref3)
    after = prov.stats()
    assert after.gathered - st.gathered == after.misses - st.misses
    assert prov.set_gather(True, min_uses=2) and not prov.direct.gather.on(1)
    _same(stack.run(prov, _x(1), 2), _reference(stack, tokens=1, steps=2))
    assert prov.stats().gathered == after.gathered                      # one-token steps read directly again
    with pytest.raises(Exception, match="at least 1 token"):
        prov.set_gather(True, min_uses=0)
    with pytest.raises(Exception, match="one use for a gather"):
        ResidencyTuning(gather_min_uses=0)


@pytest.mark.parametrize("slots", [0, 1, L * E // 2, L * E - 1])
@pytest.mark.parametrize("depth", [1, 2])
@pytest.mark.parametrize("policy", ["lru", "lfu", "adaptive", "static"])
def test_direct_reads_outputs_identical_to_resident(stack: Stack, slots: int, depth: int, policy: str) -> None:
    ref = _reference(stack, tokens=3, steps=4)
    profile = [[(l * 7 + e * 3) % 5 for e in range(E)] for l in range(L)]
    prov = stack.offloaded(slots, depth, policy, routing_profile=profile, direct_reads=True)
    assert prov.direct_reads and "read directly" in prov.describe()
    _same(stack.run(prov, _x(3), 4), ref)
    st = prov.stats()
    assert st.misses + st.prefetch_hits > 0 and (st.direct_bytes > 0) == (st.misses > 0)
    assert st.h2d_bytes >= st.direct_bytes
    assert (st.fills > 0) == (prov.direct.fills.capacity() > 0)    # later steps compute from filled slots
    assert prov.host_syncs == 4 * L                 # one read per layer call (eager), none for copies
    assert not prov.pool.books.lease                      # CPU copies land at once: staging is released each step
    # The GPU-side prefetch (here its torch twin): every expert it copied is counted used or wasted,
    # its bytes are bus bytes, and no claim outlives its step in the table.
    dp_experts = prov.counters.device_copy_bytes // stack.layout.nbytes
    assert st.prefetch_hits + st.prefetch_wasted == dp_experts
    assert st.h2d_bytes == st.direct_bytes + prov.counters.device_copy_bytes + prov.pool.copies.bytes_copied
    assert slots > 1 or st.prefetch_hits > 0
    assert prov.pool.table.flatten().tolist() == prov.pool.books.slot_of


def test_direct_reads_lru_two_slots_exact_counts(stack: Stack) -> None:
    # The LRU sequence of test_lru_two_slots_exact_misses, admitted at each step's end instead of on
    # demand: the same 3 hits and 5 misses; every miss crosses the bus once (read directly, kept in
    # its fill slot, admitted by a device copy).
    prov = stack.offloaded(2, depth=1, policy="lru", direct_reads=True)
    _Fixed(prov)([[0], [1], [0], [2], [1], [0], [1], [1]])
    st = prov.stats()
    nb = stack.layout.nbytes
    assert (st.hits, st.misses, st.fills) == (3, 5, 5)
    assert st.direct_bytes == st.h2d_bytes == 5 * nb
    assert st.pool_slots_used == 2 and sorted(prov.pool.books.resident_keys()) == [0, 1]
    assert prov.pool.table[0].tolist() == prov.pool.books.slot_of[:E]     # the device table follows
    assert not prov.pool.books.lease                                       # fill slots go back each step


def test_direct_reads_copy_misses_in_without_fill_slots(stack: Stack) -> None:
    # A static placement leases no fill slots: admissions (here none) would be copied in.
    profile = [[(l * 7 + e * 3) % 5 for e in range(E)] for l in range(L)]
    prov = stack.offloaded(4, depth=1, policy="static", routing_profile=profile, direct_reads=True)
    assert prov.direct.fills.capacity() == 0
    _Fixed(prov)([[0], [1], [2]])
    assert prov.stats().fills == 0


@pytest.mark.parametrize("gather", [True, False])
def test_direct_reads_pair_bytes_and_admission_limit(stack: Stack, gather: bool) -> None:
    # Two tokens on the same missing expert: gathered, it crosses the bus once (copied into its fill
    # slot before the layer's kernels); without the gather each pair reads it. One step admits at most
    # admit_per_step experts into free slots.
    from engine.experts.tuning import ResidencyTuning
    prov = stack.offloaded(4, depth=1, policy="lfu", direct_reads=True,
                           tuning=ResidencyTuning(gather_shared=gather, gather_min_uses=2))
    prov.direct.fills.admit_per_step = 1
    _Fixed(prov)([[3, 3, 5]])
    st = prov.stats()
    crossings = 2 if gather else 3
    assert (st.hits, st.misses) == (0, 2) and st.direct_bytes == crossings * stack.layout.nbytes
    assert prov.pool.books.resident_keys() == [3] and st.fills == 1 and st.gathered == (1 if gather else 0)
    assert st.h2d_bytes == crossings * stack.layout.nbytes


def test_direct_reads_fill_slots_admit_without_copies(stack: Stack) -> None:
    # One fill slot a step (admit_per_step = 1): the kernels keep each miss in the step's fill slot as
    # they read it, and the step's end admits it with a device copy; nothing is copied from the host.
    # Steps 1-8 fill the empty pool of 8 with layer 0's experts 0..7 (8 misses); 7 and 0 then hit;
    # layer 1's expert 0 (key 8) misses and replaces the least recently used, key 1.
    prov = stack.offloaded(8, depth=1, policy="lru", direct_reads=True)
    prov.direct.fills.admit_per_step = 1
    assert prov.direct.fills.capacity() == 1
    _Fixed(prov)([[e] for e in range(8)] + [[7], [0]])
    _Fixed(prov)([[0]], layer=1)
    st = prov.stats()
    nb = stack.layout.nbytes
    assert (st.hits, st.misses, st.fills) == (2, 9, 9)
    assert st.direct_bytes == st.h2d_bytes == 9 * nb                 # one trip over the bus per miss
    assert sorted(prov.pool.books.resident_keys()) == [0, 2, 3, 4, 5, 6, 7, 8]
    assert prov.pool.table.flatten().tolist() == prov.pool.books.slot_of  # the device table follows


def test_a_fill_share_leaves_part_of_the_staging_to_the_next_steps_gathers(stack: Stack) -> None:
    # tuning.fill_share: a direct-read step leases at most that share of the free staging slots as
    # fill slots (1: all of them, as before), and still fills and admits with them.
    import dataclasses
    prov = stack.offloaded(8, depth=1, policy="lru", direct_reads=True)
    free = len(prov.r.books.staging_free)
    whole = prov.direct.fills.capacity()
    prov.r.tuning = dataclasses.replace(prov.r.tuning, fill_share=0.125)
    assert whole == min(prov.direct.fills.admit_per_step, free) and free >= 16
    assert prov.direct.fills.capacity() == free // 8 < whole
    _Fixed(prov)([[e] for e in range(4)])
    st = prov.stats()
    assert st.fills > 0 and prov.pool.books.resident_keys()
    prov.close()
    from engine.errors import ConfigError
    from engine.experts.tuning import ResidencyTuning
    with pytest.raises(ConfigError, match="fill share 1.5"):
        ResidencyTuning(fill_share=1.5)


def test_direct_reads_never_fill_a_slot_the_step_reads(stack: Stack) -> None:
    # A step's fill slots are free before its first layer looks at the table (the coldest residents
    # are evicted first), so no kernel of the step reads a slot another one writes. A layer reads a
    # fill slot only where it gathered a shared expert into it itself, before its kernels.
    from collections import Counter
    prov = stack.offloaded(8, depth=1, policy="lfu", direct_reads=True)
    prov.direct.fills.admit_per_step = 2
    g = torch.Generator().manual_seed(4)
    for _ in range(12):
        prov.begin_step()
        for layer in range(L):
            ids = torch.randint(0, E, (3, 2), generator=g)
            table, _, host = prov.acquire(layer, ids)
            fills = set(prov.direct.step.fill_slots)
            shared = {e for e, n in Counter(ids.flatten().tolist()).items() if n >= 2}
            assert all(e in shared for e, s in enumerate(table.tolist()) if s in fills)
            assert {s for s in host.fill.tolist() if s >= 0} <= fills
        prov.end_step()
    assert prov.stats().fills > 0


def test_direct_reads_late_prefetch_then_filled_ends_in_its_pool_slot(stack: Stack) -> None:
    # A prefetch whose copy landed after its layer ran: the layer read the expert directly and kept
    # it in a fill slot. At the step's end its staging slot is released and the fill admitted; the
    # device table must end at the pool slot (not at the released staging slot, nor at -1).
    prov = stack.offloaded(4, depth=1, policy="lru", direct_reads=True)
    prov.begin_step()
    prov.plan_step("direct")
    prov.direct.ensure_step(1, 2)
    key, pool = 5, prov.pool
    pool.books.assign(key, pool.books.take_staging(-1))                    # the late prefetch
    fill = prov.direct.step.fill_slots[0]
    pool.buffer[fill].copy_(stack.store.rows[key])             # what the kernels wrote
    prov.direct.step.filled = {key: fill}
    writes, write = [], pool.write_table
    pool.write_table = lambda keys, values, stream: (writes.append(list(keys)), write(keys, values, stream))
    prov.end_step()
    assert all(len(set(k)) == len(k) for k in writes)         # one value per entry (CUDA picks any)
    slot = pool.books.slot_of[key]
    assert 0 <= slot < pool.slots and pool.table.flatten()[key] == slot
    assert torch.equal(pool.buffer[slot], stack.store.rows[key]) and not pool.books.lease


def test_direct_reads_lfu_admits_only_over_a_colder_victim(stack: Stack) -> None:
    # A full pool of one slot: a miss replaces the resident only if it is hotter (decayed use count,
    # this step's use included) than the resident; a tie keeps the resident.
    prov = stack.offloaded(1, depth=1, policy="lfu", direct_reads=True, lfu_decay=0.9)
    _Fixed(prov)([[3], [3], [5]])
    assert prov.pool.books.resident_keys() == [3]          # 5: 1.0 against 3's 0.81 + 0.9 = 1.71
    _Fixed(prov)([[5], [5]])                         # 5: 0.9 + 1 = 1.9 against 3's 1.54: admitted, then a hit
    assert prov.pool.books.resident_keys() == [5]
    st = prov.stats()
    assert (st.hits, st.misses) == (2, 3)


def test_direct_prefetch_hits_and_mode_switches(stack: Stack) -> None:
    # Prefetched guesses that the routing confirms are hits; switching between copying and direct
    # reads between steps (live) keeps outputs identical.
    ref = _reference(stack, tokens=2, steps=6)
    prov = stack.offloaded(L * E // 4, depth=2, policy="lfu", direct_reads=True)
    modes = iter(["copy", "direct", "auto", "direct", "copy", "direct"])

    def switch(_: int) -> None:
        prov.reconfigure(reads=next(modes))

    _same(stack.run(prov, _x(2), 6, between=switch), ref)
    assert prov.stats().prefetch_hits > 0
    with pytest.raises(ReconfigureError, match="auto, copy or direct"):
        prov.reconfigure(reads="sometimes")


def test_direct_reads_at_depth_zero_for_decode_steps_and_never_for_large_steps(stack: Stack) -> None:
    from engine.experts.tuning import ResidencyTuning
    prov = stack.offloaded(4, depth=0, policy="lru", direct_reads=True)
    assert prov.direct_for(1) and prov.direct_for(16) and not prov.direct_for(17)
    prov = stack.offloaded(4, depth=0, policy="lru", direct_reads=True, tuning=ResidencyTuning(gather_shared=False))
    assert prov.direct_for(1) and not prov.direct_for(2)       # no gather: depth 0 copies steps of two tokens and more
    prov.reconfigure(prefetch_depth=1)
    assert prov.direct_for(16) and not prov.direct_for(17)


def _predicted(stack: Stack, layer: int, x: torch.Tensor) -> torch.Tensor:
    """The ids [T, k] that layer ``layer``'s router picks for ``x`` (what a prediction from x names)."""
    return route(x @ stack.routers[layer].t())[1]


def test_gpu_side_prefetch_claims_count_and_clean_up(stack: Stack) -> None:
    # Its torch twin on the CPU, pool of 0 slots, depth 1, one claim per predicted layer. Layer 0
    # predicts layer 1; each later layer predicts the next. Each claim is the first choice of the
    # prediction (nothing is resident). Layers 1 and 3 route as predicted (hits), layer 2 elsewhere
    # (its claim is wasted). At the end: no lease, no claim left in the table.
    prov = stack.offloaded(0, depth=1, policy="lru", direct_reads=True)
    assert prov.direct.fills.capacity() == 0 and prov.tuning.prefetch_per_layer == 1
    x = _x(1)
    nb = stack.layout.nbytes
    prov.begin_step()
    try:
        for layer in range(L):
            prov.before_layer(layer, x)
            if layer in (1, 3):
                ids = _predicted(stack, layer, x)
            else:                                   # anything but the prediction's first choice
                first = int(_predicted(stack, layer, x)[0, 0])
                ids = torch.tensor([[(first + 1) % E, (first + 2) % E]])
            prov.acquire(layer, ids)
    finally:
        prov.end_step()
    st = prov.stats()
    assert (st.prefetch_hits, st.prefetch_wasted) == (2, 1)
    assert (st.hits, st.misses) == (2, 2 * L - 2)
    assert prov.counters.device_copy_bytes == 3 * nb and st.h2d_bytes == st.direct_bytes + 3 * nb
    assert (prov.pool.table == -1).all() and not prov.pool.books.lease
    assert st.claim_use == (("1", None, 1),)       # 3 claims: too few to tell, so it keeps claiming
    for _ in range(20):
        prov.claims.record(1, [(0, False, 1)])
    (label, share, claims), = prov.stats().claim_use  # 2 of 23 used (decayed): paused
    assert label == "1" and share < 0.1 and claims == 0 and prov.stats().claim_threshold == 0.4


def test_a_replay_waits_only_for_the_claims_its_recording_makes(stack: Stack) -> None:
    # A replay begins the GPU-side prefetch (leases claim slots, and at its end waits for the claim
    # records of the layers named) only for the layers its own recording claims for: none at depth 0
    # or in a quiet recording, whatever an earlier recording (another depth) claimed.
    prov = stack.offloaded(L * E // 4, depth=2, policy="lfu", direct_reads=True)
    hooks = prov.replay_hooks
    for claims, active in (((), False), ((2, 3), True)):
        prov.begin_step(keep_ended=False)
        try:
            hooks.start_direct_step(torch.full((L, 64), -2, dtype=torch.int64), 1, True, claims)
            step = prov.direct.step
            assert step.dp_active is active and step.dp_targets == list(claims)
        finally:
            prov.end_step()
        prov.settle()
        assert not prov.pool.books.lease and (prov.pool.table.view(-1).tolist() == prov.pool.books.slot_of)


@pytest.mark.parametrize("slots", [0, L * E // 4])
def test_claims_still_in_flight_when_their_layer_runs_change_no_output(stack: Stack, slots: int) -> None:
    # On the GPU a claim's copy may still be under way when its layer snapshots the table (CLAIMED):
    # that layer reads the expert from host memory. Here every claim lands only at the step's join,
    # so each is met in flight: the outputs equal the resident model's, each claim counts as wasted,
    # and at rest no claim is left in the table.
    prov = stack.offloaded(slots, depth=2, policy="lfu", direct_reads=True)
    prov.device_prefetcher.ref_in_flight = []
    x = _x(3)
    want = stack.run(stack.resident(), x, 4)
    got = stack.run(prov, x, 4)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    st = prov.stats()
    assert st.prefetch_wasted > 0 and st.prefetch_hits == 0
    assert prov.pool.table.flatten().tolist() == prov.pool.books.slot_of and not prov.pool.books.lease


def test_gpu_side_prefetch_of_a_cut_short_step_leaves_nothing(stack: Stack) -> None:
    prov = stack.offloaded(E, depth=2, policy="lfu", direct_reads=True)
    x = _x(2)
    with pytest.raises(RuntimeError, match="cut short"):
        prov.begin_step()
        try:
            prov.before_layer(0, x)                 # claims layers 1 and 2
            assert (prov.pool.table >= 0).any()
            raise RuntimeError("cut short")
        finally:
            prov.end_step()
    assert prov.pool.table.flatten().tolist() == prov.pool.books.slot_of and not prov.pool.books.lease
    assert prov.stats().prefetch_wasted == 2 * 1    # one claim per predicted layer, none used


def test_direct_steps_stop_predicting_while_the_gpu_side_prefetch_is_closed(stack: Stack) -> None:
    # A recorded direct-read step replays a "quiet" recording (no predictions, no claim or copy
    # launches) when the GPU-side prefetch may claim nothing: after its guesses were mostly wrong,
    # except on the gate's probe steps, which keep measuring. Until enough guesses were made to
    # tell, it predicts; a step too large to read directly always does. A quiet provider makes no
    # prediction at all.
    prov = stack.offloaded(L * E // 4, depth=2, policy="lfu", direct_reads=True)
    gate = prov.gate
    # open claims replay whichever recording measures faster, quiet first (test_predict_tuner.py);
    # here a tuner that starts on predicting, so that what the claims allow shows alone
    assert not prov.replay_hooks.predicts(2)                            # no estimate yet: open, quiet first
    prov.direct.choice.predict_tuner = PredictTuner(start=True)
    assert prov.replay_hooks.predicts(2)
    prov.claims.record(2, [(0, i < 5, 1) for i in range(100)])   # 5% of first claims used
    gate.steps = 1
    assert not prov.replay_hooks.predicts(2) and prov.replay_hooks.predicts(17)      # 17 tokens: not a direct-read step
    assert prov.replay_hooks.predicts(1)                                # steps of another size are measured apart
    gate.steps = gate.probe_every                          # a probe step predicts
    assert prov.replay_hooks.predicts(2)
    prov.claims.record(2, [(0, i < 90, 1) for i in range(100)])   # mostly right again
    gate.steps = 1
    assert prov.replay_hooks.predicts(2)
    with prov.recording(quiet=True):
        assert prov.before_layer(0, _x(2)) is None
    assert prov.before_layer(0, _x(2)) is not None
    prov.end_step()


@pytest.mark.parametrize("direct", [False, True])
def test_a_model_whose_experts_all_fit_keeps_its_pool_knobs_live(stack: Stack, direct: bool) -> None:
    # Loaded resident, the manager adopts the experts' buffer as a full pool: no host store, no copy,
    # a static table. Made smaller live, it first copies every expert into a host store, then runs as
    # any offloaded pool; made full again it is static again. Outputs never change.
    ref = _reference(stack, tokens=3, steps=6)
    prov = stack.adopted(depth=1, policy="lfu", direct_reads=direct)
    assert prov.store is None and prov.static and prov.replay_hooks is None
    outs = stack.run(prov, _x(3), 2)
    st = prov.stats()
    assert st.h2d_bytes == 0 and st.misses == 0 and prov.host_syncs == 0
    assert "expert pool:" in prov.reconfigure(pool_bytes=L * E // 2 * stack.layout.nbytes)
    assert prov.store is not None and torch.equal(prov.store.rows, stack.store.rows)
    assert not prov.static and prov.replay_hooks is not None and prov.direct_reads == direct
    x = torch.tanh(outs[-1])
    outs += stack.run(prov, x, 2)
    assert prov.stats().misses > 0
    prov.reconfigure(pool_bytes=L * E * stack.layout.nbytes)
    assert prov.static
    outs += stack.run(prov, torch.tanh(outs[-1]), 2)
    _same(outs, ref)


def test_an_adopted_pool_that_cannot_get_a_host_copy_stays_as_it_was(stack: Stack, monkeypatch) -> None:
    from engine.errors import ReconfigureError
    from engine.experts import live_changes
    from engine.experts.store import HostExpertStore

    def refuse(*args, **kwargs):
        raise live_changes.ConfigError("could not allocate 1.0 GiB of host memory for the experts")
    prov = stack.adopted(depth=1)
    monkeypatch.setattr(HostExpertStore, "allocate", refuse)
    with pytest.raises(ReconfigureError, match="host memory"):
        prov.reconfigure(pool_bytes=0, prefetch_depth=2)
    assert prov.static and prov.store is None and prov.prefetch_depth == 1
    _same(stack.run(prov, _x(3), 2), _reference(stack, tokens=3, steps=2))
