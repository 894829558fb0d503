"""The host CPU's share of missing experts inside a replayed direct-read step (engine/experts/cold_graph.py).

On the CPU a replay is emulated the way a CUDA graph runs it: the step's device work (route, publish,
the MoE, the join) runs on its own thread over buffers fixed at "capture", while this thread follows
the published layers exactly as ``DecodeGraphs.run`` does, computing the CPU's share as it goes.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

import pytest
import torch

from engine.experts.cold_graph import SHARES, ShareTuner
from kernels.fused_moe import fused_moe_ref
from kernels.publish_ids import SLOT_CPU
from test_experts_support import E, K, L, Stack, route


@pytest.fixture(scope="module")
def stack() -> Stack:
    return Stack(seed=4)


@dataclass
class _Cut:
    moe_index: int
    shape: tuple[int, int]
    predicted: object
    region: torch.Tensor


class _Replay:
    """One recorded direct-read step of ``t`` tokens through ``prov``'s replay hooks."""

    def __init__(self, stack: Stack, prov, t: int) -> None:
        self.stack, self.prov, self.t = stack, prov, t
        hooks = prov.replay_hooks
        hooks.prepare_direct_capture()
        self.regions = torch.full((L, 3 * t * K), -2, dtype=torch.int64)
        self.cuts = [_Cut(l, (t, K), None, self.regions[l]) for l in range(L)]
        self.pad = torch.zeros(t, dtype=torch.bool)          # rows past a step's real ones
        self.layers = []
        with torch.inference_mode():                         # as the engine records its steps
            for l in range(L):                               # "capture": fixed buffers, handles
                ids = torch.zeros(t, K, dtype=torch.int64)
                self.layers.append((ids, *hooks.publish_direct(l, ids, None, self.regions[l], self.pad)))

    def step(self, x: torch.Tensor, rows: int | None = None) -> torch.Tensor:
        """One replay over ``x [t, D]`` of which the first ``rows`` are real (default all)."""
        prov, hooks, out = self.prov, self.prov.replay_hooks, {}
        rows = self.t if rows is None else rows
        self.pad[:] = torch.arange(self.t) >= rows
        prov.begin_step(keep_ended=True)
        hooks.start_direct_step(self.regions, rows)

        @torch.inference_mode()                              # what the recorded kernels do, in torch
        def device() -> None:
            h = x
            for l, (ids, snap, views, host, *cold) in enumerate(self.layers):
                w, routed = route(h @ self.stack.routers[l].t())
                ids.copy_(routed)
                if cold:
                    cold[0].start(h, w)
                y = fused_moe_ref(h, ids, w, snap, views, self.stack.layout, host)
                h = h + (cold[0].add_to(y) if cold else y)
            out["x"] = h

        th = threading.Thread(target=device)
        direct, queued = prov.direct, []
        direct.finish_ended = _after_the_step(prov, direct.finish_ended, queued)
        th.start()
        try:
            hooks.follow_published(self.cuts, rows, finished=lambda: not th.is_alive())   # ends the last step too
        finally:
            th.join(timeout=60)
            del direct.finish_ended
            for write in queued:
                write()
            prov.end_step()
        assert not th.is_alive()
        return out["x"]


def _after_the_step(prov, end, queued: list):
    """``end`` (the last step's end) as the GPU runs it once the next step is launched: its writes to
    the pool and the slot table are queued on streams behind that step, so they land after it (here:
    appended to ``queued``, which the caller runs once the emulated step is over)."""
    pool = prov.r.pool

    def later(name: str, owner):
        def call(*args, **kwargs) -> None:
            queued.append(lambda: getattr(owner, name)(*args, **kwargs))
        return call

    def ended() -> None:
        patched = {(pool, "copy_slots"), (pool, "write_table"), (pool.copies, "copy")}
        for owner, name in patched:
            setattr(owner, name, later(name, owner))
        try:
            end()
        finally:
            for owner, name in patched:
                delattr(owner, name)
    return ended


def _x(t: int) -> torch.Tensor:
    return torch.randn(t, 16, generator=torch.Generator().manual_seed(t))


def _no_pool_replay(stack: Stack, tokens: int, share: float) -> tuple:
    """A provider with no pool whose replays of ``tokens`` tokens give the host CPU ``share`` of each
    layer's missing experts, and its recorded step."""
    prov = stack.offloaded(0, depth=1, direct_reads=True, cold_experts="cpu")
    rep = _Replay(stack, prov, tokens)
    prov.direct.shares.share_for = lambda tokens: share
    return prov, rep


def _replays_match_the_resident_model(stack: Stack, rep: _Replay, tokens: int, steps: int = 3) -> None:
    """``steps`` replayed steps of ``tokens`` tokens, each fed the last one's output, equal the fully
    resident model's."""
    want = stack.run(stack.resident(), _x(tokens), steps)
    x = _x(tokens)
    for i in range(steps):
        x = rep.step(x)
        torch.testing.assert_close(x, want[i], rtol=1e-5, atol=1e-5)
        x = torch.tanh(x)


@pytest.mark.parametrize("share", [1.0, 0.0])
@pytest.mark.parametrize("tokens", [1, 3])
def test_replayed_steps_with_a_cpu_share_equal_the_resident_model(stack: Stack, share: float, tokens: int) -> None:
    # No pool: every expert is missing. With a share of 1 (cpu) the host computes every one of them
    # inside the replay; with 0 (what auto may choose) none, and the joins pass through; the step's
    # output equals the fully resident model's, step after step.
    prov, rep = _no_pool_replay(stack, tokens, share)
    mode = "cpu" if share else "bus"
    _replays_match_the_resident_model(stack, rep, tokens)
    cold = prov.cold
    assert prov.stats().cpu_shares == ((tokens, share),)
    if mode == "cpu":
        assert cold.cpu_experts > 0 and cold.layers == 3 * L and prov.r.counters.direct_bytes == 0
        assert cold.last_step[0] > 0
    else:
        assert cold.cpu_experts == 0 and prov.r.counters.direct_bytes > 0
    prov.close()


@pytest.mark.parametrize("share", [0.0, 0.5, 1.0])
def test_a_replayed_step_that_meets_claims_in_flight_equals_the_resident_model(stack: Stack, share: float) -> None:
    # The GPU-side prefetch marks an expert it is still copying CLAIMED in the slot table. A replayed
    # layer that snapshots such an entry reads the expert from host memory (or gives it to the host
    # CPU, as any missing one): it neither skips it nor waits for a host share that does not exist.
    from kernels.expert_claim import CLAIMED
    prov, rep = _no_pool_replay(stack, 3, share)
    want = stack.run(stack.resident(), _x(3), 2)
    table = prov.pool.table
    x = _x(3)
    for i in range(2):
        table[:, ::2] = CLAIMED                       # copies under way for half of every layer's experts
        try:
            x = rep.step(x)
        finally:
            table[:, ::2] = -1                        # their claims were cut short: nothing landed
        torch.testing.assert_close(x, want[i], rtol=1e-5, atol=1e-5)
        x = torch.tanh(x)
    assert (prov.cold.cpu_experts > 0) == (share > 0)
    prov.close()


@pytest.mark.parametrize("share", [0.0, 0.5])
def test_replayed_steps_copy_each_shared_missing_expert_once(stack: Stack, share: float) -> None:
    # No pool, three tokens: each layer's missing experts that two or more tokens use are copied in
    # once (into the step's gather slots) before its kernels, which read them from device memory; the
    # rest are read directly, once per token, or computed by the host. Outputs equal the resident
    # model's; with no host share every missing expert crosses the bus exactly once.
    prov, rep = _no_pool_replay(stack, 3, share)
    want = stack.run(stack.resident(), _x(3), 3)
    x = _x(3)
    for i in range(3):
        x = rep.step(x)
        torch.testing.assert_close(x, want[i], rtol=1e-5, atol=1e-5)
        x = torch.tanh(x)
    prov.settle()
    st, nb = prov.stats(), stack.layout.nbytes
    assert st.gathered > 0 and not prov.pool.books.lease
    if share == 0:
        assert st.direct_bytes == st.misses * nb
    prov.close()


def test_the_host_learns_its_cpu_rate_from_the_replayed_layers(stack: Stack) -> None:
    # a calibration that found the CPU 1000x slower than it is: the layers the host computes inside
    # the replays move the rates' factor down
    from engine.experts.cold import ColdRates
    from kernels.cpu import CpuExpertCost
    prov, rep = _no_pool_replay(stack, 2, 1.0)
    prov.cold.rates = ColdRates(50e9, CpuExpertCost("fp32", stack.layout.nbytes, 1, (1, 2), (1.0, 1.5), 1))
    x = _x(2)
    for _ in range(2):
        x = torch.tanh(rep.step(x))
    assert prov.cold.cpu_experts > 0 and prov.cold.rates.cpu_factor < 0.5
    prov.close()


def test_a_partial_share_splits_each_layer(stack: Stack) -> None:
    # Under auto with a share of one half, each layer's missing experts split between the host CPU
    # and the direct reads, the most used first to the CPU; the output still equals the resident one.
    prov = stack.offloaded(L * E // 4, depth=1, direct_reads=True, cold_experts="cpu")
    rep = _Replay(stack, prov, 4)
    shares = prov.direct.shares
    shares.share_for = lambda tokens: 0.5
    want = stack.run(stack.resident(), _x(4), 2)
    x = rep.step(_x(4))
    torch.testing.assert_close(x, want[0], rtol=1e-5, atol=1e-5)
    marked = [int(v) for v in rep.regions[:, 4 * K:8 * K].reshape(-1)]
    assert SLOT_CPU in marked and -1 in marked            # both kinds of missing expert in the step
    x = rep.step(torch.tanh(x))
    torch.testing.assert_close(x, want[1], rtol=1e-5, atol=1e-5)
    prov.close()


def test_a_host_that_fails_lets_the_step_finish_and_says_why(stack: Stack, monkeypatch) -> None:
    # The host's share raises: every join of the step is released (the device side finishes, no
    # hang), the error reaches the caller, and the next step runs normally.
    prov = stack.offloaded(0, depth=1, direct_reads=True, cold_experts="cpu")
    rep = _Replay(stack, prov, 2)
    shares = prov.direct.shares
    real = shares.compute

    def broken(*a, **kw):
        raise MemoryError("no room for the CPU's share")

    monkeypatch.setattr(shares, "compute", broken)
    with pytest.raises(MemoryError, match="no room"):
        rep.step(_x(2))
    monkeypatch.setattr(shares, "compute", real)
    want = stack.run(stack.resident(), _x(2), 1)
    torch.testing.assert_close(rep.step(_x(2)), want[0], rtol=1e-5, atol=1e-5)
    prov.close()


def test_a_step_that_fails_after_some_layers_still_counts_their_cpu_experts(stack: Stack, monkeypatch) -> None:
    # The host computes layer 0's share, then fails on layer 1: layer 0's experts count as the CPU's
    # (the counts of a step that stopped stay whole), and the cost model learns nothing from it.
    prov = stack.offloaded(0, depth=1, direct_reads=True, cold_experts="cpu")
    rep = _Replay(stack, prov, 2)
    shares = prov.direct.shares
    real = shares.compute
    factor = []

    def second_fails(moe_index, *a, **kw):
        if moe_index == 1:
            factor.append(prov.cold.rates.cpu_factor)
            raise MemoryError("no room for the CPU's share")
        return real(moe_index, *a, **kw)

    monkeypatch.setattr(shares, "compute", second_fails)
    before = prov.cold.cpu_experts
    with pytest.raises(MemoryError):
        rep.step(_x(2))
    assert prov.cold.cpu_experts > before and prov.cold.layers == 1
    assert prov.cold.rates.cpu_factor == factor[0]
    prov.close()


def test_the_tuner_finds_the_fastest_share_and_follows_it() -> None:
    # Step time is lowest at a share of 5/8: starting from 1/8 the tuner climbs there and stays,
    # then follows when the best share moves to 2/8 (e.g. the machine got busy).
    tuner = ShareTuner(trials=2, probe_every=6)
    best = [5 / 8]

    def seconds(share: float) -> float:
        return 1.0 + abs(share - best[0])

    for _ in range(200):
        tuner.observe(1, seconds(tuner.choose(1, start=1 / 8)))
    assert tuner.state()[1][0] == 5 / 8
    used = [tuner.choose(1) for _ in range(1)]
    assert used[0] in SHARES
    best[0] = 2 / 8
    for _ in range(300):
        tuner.observe(1, seconds(tuner.choose(1)))
    assert tuner.state()[1][0] == 2 / 8


def test_one_slow_step_does_not_rule_a_share_out() -> None:
    # The balanced share (4/8) is the fastest, but the first step it runs after the recording meets a
    # one-off cost (a compile, a busy moment) fifty times its time: the tuner still keeps it.
    tuner = ShareTuner(trials=3, probe_every=6)
    times = iter([None, 50.0])                       # the recording (not a measure), then the slow step
    for _ in range(40):
        share = tuner.choose(1, start=0.5)
        t = next(times, 0.5 if share == 0.5 else 1.0)
        tuner.observe(1, 1.0 if t is None else t)
    assert tuner.state()[1][0] == 0.5


def test_a_probe_is_judged_on_its_own_steps() -> None:
    # The bus alone (in force) took 0.9 and a probe of 1/8 took 1.0, so the bus stayed. Later the bus
    # takes 1.05 and 1/8 takes 2.0: a probe of 1/8 ends after its first step and the tuner stays on
    # the bus, whatever 1/8 measured in the earlier probe.
    tuner = ShareTuner(trials=3, probe_every=4)
    times = {0.0: 0.9, 1 / 8: 1.0}
    for _ in range(40):
        share = tuner.choose(1, start=0.0)
        tuner.observe(1, times.get(share, 3.0))
    assert tuner.state()[1][0] == 0.0
    times = {0.0: 1.05, 1 / 8: 2.0}
    in_force = set()
    for _ in range(200):
        share = tuner.choose(1)
        tuner.observe(1, times.get(share, 3.0))
        in_force.add(tuner.state()[1][0])
    assert in_force == {0.0}


def test_the_tuner_spends_few_steps_on_shares_that_are_far_slower() -> None:
    # The host CPU is busy: any share above 0 makes a step five times slower. After the first trials
    # the tuner stays on the bus alone, and its probes end after one step and come less and less
    # often, so nearly every step runs the bus alone.
    tuner = ShareTuner(trials=3, probe_every=6)
    shares = []
    for _ in range(300):
        share = tuner.choose(8, start=0.5)
        shares.append(share)
        tuner.observe(8, 1.0 if share == 0 else 5.0)
    assert tuner.state()[8][0] == 0.0
    assert sum(s > 0 for s in shares[50:]) <= 10


def test_the_tuner_tries_the_balanced_share_once_the_rates_move_it() -> None:
    # The tuner settled on the bus alone from a calibration that found the CPU slow; the rates learnt
    # since put the balance at 4/8. It tries that share next, keeps it when it is faster, and does not
    # try the same suggestion again once it has lost.
    tuner = ShareTuner(trials=2, probe_every=1000)
    for _ in range(10):
        tuner.observe(1, 1.0 if tuner.choose(1, start=0.0) == 0 else 2.0)
    assert tuner.state()[1][0] == 0.0
    tuner.suggest(1, 0.5)
    assert tuner.choose(1) == 0.5
    for _ in range(8):                     # its trials, then the next share up, which loses
        share = tuner.choose(1)
        tuner.observe(1, 0.5 if share == 0.5 else 2.0)
    assert tuner.state()[1][0] == 0.5
    # slower now: a suggestion of 1/8 (3 shares away) is tried once, lost, and not tried again
    tuner.suggest(1, 1 / 8)
    for _ in range(8):
        share = tuner.choose(1)
        tuner.observe(1, 3.0 if share == 1 / 8 else 0.5)
    assert tuner.state()[1][0] == 0.5
    tuner.suggest(1, 1 / 8)
    assert tuner.choose(1) == 0.5
    tuner.suggest(1, 5 / 8)                # one share away: the regular probes cover it
    assert tuner.choose(1) == 0.5
    # a balanced share that swings between two losing shares costs one probe each, not one per swing
    probes = 0
    for step in range(60):
        tuner.suggest(1, 1 / 8 if step % 2 else 2 / 8)
        share = tuner.choose(1)
        probes += share in (1 / 8, 2 / 8)
        tuner.observe(1, 3.0 if share != 0.5 else 0.5)
    assert tuner.state()[1][0] == 0.5 and probes <= 2 * 2    # 2/8 once (1/8 was tried), trials of 2


def test_padding_rows_of_a_recording_change_nothing(stack: Stack) -> None:
    # A recording of 4 rows replays a step of 3: the padding row takes row 0's experts (so it adds
    # no expert of its own and does not sway the CPU's pick), the host computes only the real rows,
    # and the real rows equal the resident model's.
    prov, rep = _no_pool_replay(stack, 4, 0.5)
    want = stack.run(stack.resident(), _x(3), 2)
    x = torch.cat([_x(3), torch.randn(1, 16)])
    for i in range(2):
        y = rep.step(x, rows=3)
        torch.testing.assert_close(y[:3], want[i], rtol=1e-5, atol=1e-5)
        x = torch.cat([torch.tanh(y[:3]), torch.randn(1, 16)])
    for l in range(L):
        ids = rep.layers[l][0]
        assert torch.equal(ids[3], ids[0])
    prov.close()


def _table_agrees_with_books(prov) -> None:
    """Every slot-table entry names a slot the books give that key, and no slot holds two keys."""
    books, owner = prov.r.books, {}
    for key, slot in enumerate(prov.r.pool.table.view(-1).tolist()):
        if slot >= 0:
            assert slot not in owner, f"slot {slot} holds keys {owner[slot]} and {key}"
            owner[slot] = key
            assert books.slot_of[key] == slot, (key, slot, books.slot_of[key])


@pytest.mark.parametrize("policy", ["lru", "lfu"])
@pytest.mark.parametrize("slots", [4, 8])
def test_experts_the_cpu_computed_are_admitted_into_the_pool(policy: str, slots: int) -> None:
    # Half of each layer's missing experts on the CPU, the rest read and filled by the kernels: the
    # step's end admits both kinds in one pass (the CPU's by a copy from the host), never evicting an
    # expert it just admitted; every step equals the resident model and the table agrees with the books.
    stack = Stack(seed=5)
    prov = stack.offloaded(slots, depth=1, policy=policy, direct_reads=True, cold_experts="cpu")
    rep = _Replay(stack, prov, 4)
    prov.direct.shares.share_for = lambda tokens: 0.5
    ref, x = stack.resident(), _x(4)
    for _ in range(10):
        y = rep.step(x)
        want = stack.step(ref, x)
        torch.testing.assert_close(y, want, rtol=1e-4, atol=1e-4)
        prov.replay_hooks.finish_ended()
        _table_agrees_with_books(prov)
        x = torch.tanh(want)
    st = prov.stats()
    assert st.cpu_experts > 0 and st.fills > 0 and st.pool_slots_used > 0
    prov.close()


def test_a_pool_fills_when_the_cpu_computes_every_missing_expert(stack: Stack) -> None:
    # Share 1: no expert is ever filled by the kernels, yet the pool admits by copies as under bus.
    prov = stack.offloaded(L * E // 4, depth=1, direct_reads=True, cold_experts="cpu")
    rep = _Replay(stack, prov, 2)
    x = _x(2)
    for _ in range(4):
        x = torch.tanh(rep.step(x))
    prov.replay_hooks.finish_ended()
    st = prov.stats()
    assert st.cpu_experts > 0 and st.fills == 0 and st.pool_slots_used > 0
    _table_agrees_with_books(prov)
    prov.close()


def _steps_equal_the_resident_model(stack: Stack, rep: _Replay, steps: int) -> None:
    """``steps`` replays of 4 tokens, each fed the resident model's last output, equal that model's step."""
    ref, x = stack.resident(), _x(4)
    for _ in range(steps):
        y = rep.step(x)
        want = stack.step(ref, x)
        torch.testing.assert_close(y, want, rtol=1e-4, atol=1e-4)
        x = torch.tanh(want)


@pytest.mark.parametrize("share", [0.5, 0.0])
def test_the_first_layers_cpu_share_comes_before_the_last_steps_end(share: float, monkeypatch) -> None:
    # The first layer's join waits for the host. With a CPU share the host computes that layer's
    # experts, then ends the previous step (admissions, releases), then follows the books; with none
    # it ends the previous step first, as nothing on the GPU waits for it. Outputs are unchanged.
    stack = Stack(seed=5)
    prov = stack.offloaded(8, depth=1, policy="lru", direct_reads=True, cold_experts="cpu")
    rep = _Replay(stack, prov, 4)
    shares, direct = prov.direct.shares, prov.direct
    shares.share_for = lambda tokens: share
    flags = shares._bufs[(4, K)].flags.numpy()
    seen: list[tuple[bool, int, int]] = []              # (an end was deferred, layer 0's ready and done flags)
    plain = type(direct).finish_ended

    def spy(self) -> None:
        seen.append((self.ended is not None, int(flags[0, 0]), int(flags[0, 1])))
        plain(self)

    monkeypatch.setattr(type(direct), "finish_ended", spy)
    _steps_equal_the_resident_model(stack, rep, 6)
    direct.finish_ended()
    _table_agrees_with_books(prov)
    deferred = [(ready, done) for ended, ready, done in seen if ended]
    assert deferred, "no step's end was deferred to the next one"
    if share > 0:
        assert all(done == 1 for _, done in deferred), seen
    else:
        assert all(done == 0 for _, done in deferred), seen
    assert prov.stats().cpu_experts > 0 if share > 0 else prov.stats().cpu_experts == 0
    prov.close()


@pytest.mark.parametrize("policy, slots", [("lru", 8), ("lfu", 4)])
def test_with_end_late_the_last_steps_end_comes_after_the_steps_last_layer(monkeypatch, policy, slots) -> None:
    # tuning.end_late: where the first layer gives the host CPU experts, the previous step's deferred end
    # waits until every layer of this step was followed (no join of it then waits for the host's books);
    # this step admits nothing early meanwhile (the late end's victims could be its admissions). Outputs,
    # the slot table and the books stay as without it.
    import dataclasses
    stack = Stack(seed=5)
    prov = stack.offloaded(slots, depth=1, policy=policy, direct_reads=True, cold_experts="cpu")
    prov.r.tuning = dataclasses.replace(prov.r.tuning, end_late=True)
    rep = _Replay(stack, prov, 4)
    shares, direct = prov.direct.shares, prov.direct
    shares.share_for = lambda tokens: 0.5
    flags = shares._bufs[(4, K)].flags.numpy()
    seen: list[tuple[int, int]] = []                    # (layer 0's done flag, the last layer's) at each end
    plain = type(direct).finish_ended

    def spy(self) -> None:
        if self.ended is not None:
            seen.append((int(flags[0, 1]), int(flags[L - 1, 1])))
        plain(self)

    monkeypatch.setattr(type(direct), "finish_ended", spy)
    _steps_equal_the_resident_model(stack, rep, 14)   # long enough for a late end's admissions to meet early ones
    direct.finish_ended()
    _table_agrees_with_books(prov)
    assert seen, "no step's end was deferred to the next one"
    assert all(last == 1 for _, last in seen[:-1]), seen     # the last entry: the end called after the loop
    assert prov.stats().cpu_experts > 0
    prov.close()


def test_the_balanced_share_weighs_the_bus_at_the_kernels_rate(stack: Stack) -> None:
    # A replayed step's bus side is read by its kernels: where they move the store at half the copy
    # engine's rate, the balance gives the CPU more of the missing experts.
    import dataclasses
    from engine.experts.cold import ColdRates
    from engine.experts.cold_graph import GraphCpuShares
    from kernels.cpu import CpuExpertCost
    prov = stack.offloaded(0, depth=1, direct_reads=True, cold_experts="auto")
    shares = GraphCpuShares(prov.r, stack.layout.hidden)
    nbytes = stack.layout.nbytes
    copy_rate = ColdRates(nbytes / 1e-3, CpuExpertCost("fp32", nbytes, 1, (1, 2), (1e-3, 1.5e-3), 1))
    prov.cold.rates = copy_rate                               # 1 ms over the bus, 1 ms on the CPU
    assert shares.balanced() == pytest.approx(0.5)
    prov.cold.rates = dataclasses.replace(copy_rate, kernel_bus_bytes_per_s=nbytes / 3e-3)
    assert shares.balanced() == pytest.approx(0.75)
    prov.close()


@pytest.mark.parametrize("share", [0.0, 0.5])
@pytest.mark.parametrize("tokens", [1, 3])
def test_replayed_steps_that_gather_every_missing_expert_equal_the_resident_model(
        stack: Stack, share: float, tokens: int) -> None:
    # gather_min_uses 1 (the default): every missing expert of the step, those of one-token steps too, is
    # copied in by the gather's copy kernel before the layer's MoE kernels; with the CPU's share beside
    # it or not, the output equals the fully resident model's, step after step, and each gathered
    # expert counts once in the bytes read from host memory.
    from engine.experts.tuning import ResidencyTuning
    prov = stack.offloaded(0, depth=1, direct_reads=True, cold_experts="cpu",
                           tuning=ResidencyTuning(gather_min_uses=1))
    rep = _Replay(stack, prov, tokens)
    prov.direct.shares.share_for = lambda tokens: share
    _replays_match_the_resident_model(stack, rep, tokens)
    st = prov.stats()
    assert st.gathered > 0 and prov.r.counters.direct_bytes == st.gathered * stack.layout.nbytes
    prov.close()


@pytest.mark.parametrize("share", [1.0, 0.0])
def test_a_trace_times_the_hosts_part_of_each_followed_layer(stack: Stack, share: float) -> None:
    # The trace records while it is on and keeps the last steps asked for: per layer the publish seen,
    # the CPU's inputs seen, its experts computed (where the layer gave the CPU a share), the books
    # kept; in that order.
    prov, rep = _no_pool_replay(stack, 2, share)
    trace = prov.direct.trace
    x = rep.step(_x(2))
    assert not trace.on and trace.events == []
    trace.start(2)
    for _ in range(3):
        x = rep.step(torch.tanh(x))
    trace.stop()
    rep.step(torch.tanh(x))
    assert sorted({s for s, *_ in trace.events}) == [1, 2]          # the last two of the three traced
    per_layer = ["published", "ready", "computed", "followed"] if share else ["published", "followed"]
    for step in (1, 2):
        events = [(layer, e) for s, layer, e, _ in trace.events if s == step and layer >= 0]
        assert events == [(layer, e) for layer in range(L) for e in per_layer]
        times = [t for s, *_, t in trace.events if s == step]
        assert times == sorted(times)
    summary = trace.summary()
    assert set(summary) >= {"publish_wait", "books", "step_followed"}
    assert ("compute" in summary) == bool(share) and all(v >= 0 for v in summary.values())
    prov.close()
