"""Golden residency counters: the numbers a short run produces, fixed as literals.

The expert residency (books, plan, copy and direct paths) may be restructured, but a run must keep
counting what it counted: hits, misses, fills, prefetch hits and waste, bus bytes and bytes read
directly, host syncs and predicted misses. Each case runs the small routed stack of
``test_experts_support`` for a prefill-sized step and a few decode steps, over pool size x prefetch
depth x policy x read mode; a second table drives the steps the way a replayed decode graph does
(its end deferred past the next step's start, fill slots armed ahead), a third changes the settings
live between steps, and the last generates greedily through the engine on a tiny checkpoint.
Outputs equal the fully resident provider's in every case (the counters would mean nothing else).

The literals were recorded from the code before the residency was restructured; a change that
alters one must be a deliberate change of behaviour, recorded here with its reason:

- At prefetch depth 0 with direct reads, steps of one token read their missing experts directly
  (before: copied in, with the host waiting for each layer). The bytes over the bus stay the same or
  fall, the direct bytes are now counted, and the fill slots admit some of them (more hits).
- Direct-read steps of two or more tokens copy each missing expert that several of their tokens use
  once, before the layer's kernels (engine/experts/gather.py), instead of reading it once per token:
  bytes over the bus and bytes read directly fall in every direct-read case (in the engine's greedy
  runs the direct bytes now equal the misses: each missing expert crosses once); every other counter
  is unchanged.
- With that gather, depth 0 reads directly in decode steps of any size (before: one token only). The
  bytes over the bus stay the same or fall, more of them are read directly, and the fill slots admit
  more (more hits). One case moves more: the engine's greedy run at a 50% pool crosses 55 expert
  sizes against 49, since a direct step admits at most E/2 experts at its end where the copies had
  admitted every miss at once (at 25%: 79 against 111). No layer of those steps waits for the host.
- Staging is sized to what a step can use (engine/memory.staging_slots): a decode step's misses and
  prefetches, at least half a layer, at most one layer, no longer a layer's worth on top for
  prefill (a prefill layer that misses more experts than that runs in passes). Only the engine's
  greedy runs move, whose tiny model now has 8 staging slots, not 16 + 16: the direct-read runs
  have fewer slots for gathers and GPU-side prefetches, so 4-10 more expert sizes cross directly
  and fewer prefetches hit; the copy runs at depth 1 and 2 reclaim staging from the prefetches of
  later layers more often (25%, depth 2: 70 hits against 60, 131 sizes over the bus against 139).
  The tables of the routed stack, which gives its staging explicitly, do not move.
- Direct-read steps copy in every missing expert before the layer's kernels (``gather_min_uses`` 1;
  before: only those two or more tokens use), since the kernels' own reads of host memory were the
  slower path on the H100 host. Only the engine's greedy runs at depth 1 and 2 move (the routed stack's
  tables keep 2, to keep the kernels' direct reads under test): every missing expert now takes one of the
  tiny model's 8 staging slots, which leaves none for GPU-side prefetches (no prefetch hits, none
  wasted), so they count as depth 0 does: 83 expert sizes over the bus against 88 at 25%, 59 against 66
  at 50%, two fewer hits at 25% and one fewer fill at 50%.
"""
from __future__ import annotations

import pytest
import torch

from test_experts_support import D, E, K, L, Stack, run_layers

POOLS = {"0": 0, "25%": L * E // 4, "50%": L * E // 2, "100%": L * E}
PROFILE = [[(l * 7 + e * 3) % 5 for e in range(E)] for l in range(L)]
READS = {"copy": False, "direct": True}
STEPS = (20, 3, 3, 3, 1, 1, 1)         # tokens per step: one prefill-sized step, then decode steps

# (hits, misses, fills, prefetch hits, prefetch wasted, h2d bytes / expert, direct bytes / expert,
#  host syncs, misses predicted)
Counts = tuple[int, int, int, int, int, int, int, int, int]


@pytest.fixture(scope="module")
def stack() -> Stack:
    return Stack()


def _x(tokens: int, seed: int) -> torch.Tensor:
    return torch.randn(tokens, D, generator=torch.Generator().manual_seed(seed))


def _counts(stack: Stack, prov) -> Counts:
    prov.settle()                              # a deferred step's end, as the engine does once idle
    st, nb = prov.stats(), stack.layout.nbytes
    assert st.h2d_bytes % nb == 0 and st.direct_bytes % nb == 0
    return (st.hits, st.misses, st.fills, st.prefetch_hits, st.prefetch_wasted, st.h2d_bytes // nb,
            st.direct_bytes // nb, prov.host_syncs, st.misses_predicted)


_layers = run_layers


def _step(stack: Stack, prov, tokens: int, seed: int) -> torch.Tensor:
    """One eager engine step of ``tokens`` tokens."""
    prov.begin_step()
    try:
        return _layers(stack, prov, _x(tokens, seed))
    finally:
        prov.end_step()


def _eager(stack: Stack, prov) -> list[torch.Tensor]:
    return [_step(stack, prov, tokens, i) for i, tokens in enumerate(STEPS)]


def _replayed(stack: Stack, prov) -> list[torch.Tensor]:
    """Decode steps driven as DecodeGraphs.run drives a direct-read recording, its layers eager."""
    outs = []
    prov.direct.top_k = K                      # what recording the step's graph tells the direct path
    for i, tokens in enumerate(STEPS[1:]):
        x = _x(tokens, i)
        if not prov.direct_for(tokens):
            pytest.skip("not a direct-read configuration")
        prov.begin_step(keep_ended=True)
        try:
            predicting = prov.replay_hooks.predicts(tokens)
            prov.replay_hooks.start_direct_step(torch.empty(L, 64, dtype=torch.int64), tokens, predicting)
            prov.replay_hooks.finish_ended()                    # the last step's end, once this one is launched
            outs.append(_layers(stack, prov, x))
        finally:
            prov.end_step()
        prov.replay_hooks.arm_next_step()
    return outs


def _reference(stack: Stack, steps) -> list[torch.Tensor]:
    res = stack.resident()
    outs = []
    for i, tokens in enumerate(steps):
        res.begin_step()
        outs.append(_layers(stack, res, _x(tokens, i)))
        res.end_step()
    return outs


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x, y)


def _provider(stack: Stack, pool: str, depth: int, policy: str, reads: str):
    return stack.offloaded(POOLS[pool], depth, policy, routing_profile=PROFILE, direct_reads=READS[reads])


CASES = [(p, d, pol, r) for p in POOLS for d in (0, 1, 2) for pol in ("lru", "lfu", "adaptive", "static")
         for r in READS]


@pytest.mark.parametrize("pool,depth,policy,reads", CASES)
def test_eager_counts(stack: Stack, pool: str, depth: int, policy: str, reads: str) -> None:
    prov = _provider(stack, pool, depth, policy, reads)
    _same(_eager(stack, prov), _reference(stack, STEPS))
    assert _counts(stack, prov) == EAGER[pool, depth, policy, reads]


REPLAY_CASES = [(p, d, pol) for p in ("0", "25%", "50%") for d in (1, 2) for pol in ("lru", "lfu", "adaptive", "static")]


@pytest.mark.parametrize("pool,depth,policy", REPLAY_CASES)
def test_replayed_counts(stack: Stack, pool: str, depth: int, policy: str) -> None:
    prov = _provider(stack, pool, depth, policy, "direct")
    _same(_replayed(stack, prov), _reference(stack, STEPS[1:]))
    assert _counts(stack, prov) == REPLAYED[pool, depth, policy]
    assert not prov.pool.books.lease                 # settle() ended the deferred step and gave armed slots back


LIVE = [dict(prefetch_depth=2), dict(pool_bytes=0), dict(reads="direct"), dict(policy="lfu"),
        dict(pool_bytes=L * E // 2), dict(prefetch_depth=0), dict(reads="copy", prefetch_depth=1)]


@pytest.mark.parametrize("policy", ["lru", "adaptive"])
def test_live_change_counts(stack: Stack, policy: str) -> None:
    prov = _provider(stack, "25%", 1, policy, "copy")
    nb, outs = stack.layout.nbytes, []
    for i, tokens in enumerate(STEPS):
        outs.append(_step(stack, prov, tokens, i))
        change = dict(LIVE[i])
        if "pool_bytes" in change:
            change["pool_bytes"] *= nb
        prov.reconfigure(**change)
    _same(outs, _reference(stack, STEPS))
    assert _counts(stack, prov) == LIVE_COUNTS[policy]


PROMPTS = [[1, 5, 77, 300, 12, 9, 400, 33], [1, 99, 4], [1, 250, 251, 252, 17]]
ENGINE_CASES = [(p, d, r) for p in ("25%", "50%") for d in (0, 1, 2) for r in READS]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from engine import LLM, SamplingParams
    from tiny_models import build_tiny_model
    path = build_tiny_model(tmp_path_factory.mktemp("qwen3_moe"), "qwen3_moe")
    greedy = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    with LLM(str(path), device="cpu", dtype="float32") as llm:
        ref = [o.token_ids for o in llm.generate(PROMPTS, greedy)]
    return path, greedy, ref


@pytest.mark.parametrize("pool,depth,reads", ENGINE_CASES)
def test_engine_greedy_counts(checkpoint, pool: str, depth: int, reads: str) -> None:
    from engine import LLM
    path, greedy, ref = checkpoint
    with LLM(str(path), device="cpu", dtype="float32", expert_pool_size=pool, prefetch_depth=depth,
             expert_reads=reads) as llm:
        assert [o.token_ids for o in llm.generate(PROMPTS, greedy)] == ref
        st, nb = llm.stats().experts, llm.engine.loaded.layout.nbytes
        got = (st.hits, st.misses, st.fills, st.prefetch_hits, st.prefetch_wasted, st.h2d_bytes // nb,
               st.direct_bytes // nb, st.misses_predicted)
    assert got == ENGINE[pool, depth, reads]



EAGER: dict[tuple[str, int, str, str], Counts] = {
    ('0', 0, 'lru', 'copy'): (0, 111, 0, 0, 0, 111, 0, 28, 0),
    ('0', 0, 'lru', 'direct'): (0, 111, 0, 0, 0, 111, 79, 28, 0),
    ('0', 0, 'lfu', 'copy'): (0, 111, 0, 0, 0, 111, 0, 28, 0),
    ('0', 0, 'lfu', 'direct'): (0, 111, 0, 0, 0, 111, 79, 28, 0),
    ('0', 0, 'adaptive', 'copy'): (0, 111, 0, 0, 0, 111, 0, 28, 0),
    ('0', 0, 'adaptive', 'direct'): (0, 111, 0, 0, 0, 111, 79, 28, 0),
    ('0', 0, 'static', 'copy'): (0, 111, 0, 0, 0, 111, 0, 28, 0),
    ('0', 0, 'static', 'direct'): (0, 111, 0, 0, 0, 111, 79, 28, 0),
    ('0', 1, 'lru', 'copy'): (74, 37, 0, 74, 6, 117, 0, 28, 0),
    ('0', 1, 'lru', 'direct'): (40, 71, 0, 40, 2, 113, 63, 28, 34),
    ('0', 1, 'lfu', 'copy'): (74, 37, 0, 74, 6, 117, 0, 28, 0),
    ('0', 1, 'lfu', 'direct'): (40, 71, 0, 40, 2, 113, 63, 28, 34),
    ('0', 1, 'adaptive', 'copy'): (74, 37, 0, 74, 6, 117, 0, 28, 0),
    ('0', 1, 'adaptive', 'direct'): (40, 71, 0, 40, 2, 113, 63, 28, 34),
    ('0', 1, 'static', 'copy'): (74, 37, 0, 74, 6, 117, 0, 28, 0),
    ('0', 1, 'static', 'direct'): (40, 71, 0, 40, 2, 113, 63, 28, 34),
    ('0', 2, 'lru', 'copy'): (74, 37, 0, 74, 13, 124, 0, 28, 0),
    ('0', 2, 'lru', 'direct'): (38, 73, 0, 38, 4, 115, 65, 28, 31),
    ('0', 2, 'lfu', 'copy'): (74, 37, 0, 74, 13, 124, 0, 28, 0),
    ('0', 2, 'lfu', 'direct'): (38, 73, 0, 38, 4, 115, 65, 28, 31),
    ('0', 2, 'adaptive', 'copy'): (74, 37, 0, 74, 13, 124, 0, 28, 0),
    ('0', 2, 'adaptive', 'direct'): (38, 73, 0, 38, 4, 115, 65, 28, 31),
    ('0', 2, 'static', 'copy'): (74, 37, 0, 74, 13, 124, 0, 28, 0),
    ('0', 2, 'static', 'direct'): (38, 73, 0, 38, 4, 115, 65, 28, 31),
    ('25%', 0, 'lru', 'copy'): (3, 108, 0, 0, 0, 108, 0, 28, 0),
    ('25%', 0, 'lru', 'direct'): (17, 94, 24, 0, 0, 94, 62, 28, 0),
    ('25%', 0, 'lfu', 'copy'): (5, 106, 0, 0, 0, 106, 0, 28, 0),
    ('25%', 0, 'lfu', 'direct'): (22, 89, 16, 0, 0, 89, 57, 28, 0),
    ('25%', 0, 'adaptive', 'copy'): (5, 106, 0, 0, 0, 106, 0, 28, 0),
    ('25%', 0, 'adaptive', 'direct'): (22, 89, 16, 0, 0, 89, 57, 28, 0),
    ('25%', 0, 'static', 'copy'): (27, 84, 0, 0, 0, 92, 0, 28, 0),
    ('25%', 0, 'static', 'direct'): (27, 84, 0, 0, 0, 92, 60, 28, 0),
    ('25%', 1, 'lru', 'copy'): (74, 37, 0, 73, 6, 116, 0, 28, 0),
    ('25%', 1, 'lru', 'direct'): (54, 57, 23, 38, 3, 98, 49, 28, 27),
    ('25%', 1, 'lfu', 'copy'): (75, 36, 0, 72, 6, 114, 0, 28, 0),
    ('25%', 1, 'lfu', 'direct'): (58, 53, 15, 39, 2, 94, 45, 28, 22),
    ('25%', 1, 'adaptive', 'copy'): (75, 36, 0, 72, 6, 114, 0, 28, 0),
    ('25%', 1, 'adaptive', 'direct'): (58, 53, 15, 39, 2, 94, 45, 28, 22),
    ('25%', 1, 'static', 'copy'): (89, 22, 0, 62, 4, 96, 0, 28, 0),
    ('25%', 1, 'static', 'direct'): (63, 48, 0, 36, 1, 93, 43, 28, 26),
    ('25%', 2, 'lru', 'copy'): (74, 37, 0, 73, 11, 122, 0, 28, 0),
    ('25%', 2, 'lru', 'direct'): (55, 56, 22, 36, 5, 97, 48, 28, 23),
    ('25%', 2, 'lfu', 'copy'): (75, 36, 0, 73, 12, 122, 0, 28, 0),
    ('25%', 2, 'lfu', 'direct'): (56, 55, 15, 35, 5, 95, 47, 28, 19),
    ('25%', 2, 'adaptive', 'copy'): (75, 36, 0, 73, 12, 122, 0, 28, 0),
    ('25%', 2, 'adaptive', 'direct'): (56, 55, 15, 35, 5, 95, 47, 28, 19),
    ('25%', 2, 'static', 'copy'): (89, 22, 0, 62, 10, 102, 0, 28, 0),
    ('25%', 2, 'static', 'direct'): (61, 50, 0, 34, 3, 95, 45, 28, 26),
    ('50%', 0, 'lru', 'copy'): (15, 96, 0, 0, 0, 96, 0, 28, 0),
    ('50%', 0, 'lru', 'direct'): (39, 72, 23, 0, 0, 72, 40, 28, 0),
    ('50%', 0, 'lfu', 'copy'): (20, 91, 0, 0, 0, 91, 0, 28, 0),
    ('50%', 0, 'lfu', 'direct'): (40, 71, 22, 0, 0, 71, 39, 28, 0),
    ('50%', 0, 'adaptive', 'copy'): (20, 91, 0, 0, 0, 91, 0, 28, 0),
    ('50%', 0, 'adaptive', 'direct'): (40, 71, 22, 0, 0, 71, 39, 28, 0),
    ('50%', 0, 'static', 'copy'): (52, 59, 0, 0, 0, 75, 0, 28, 0),
    ('50%', 0, 'static', 'direct'): (52, 59, 0, 0, 0, 75, 43, 28, 0),
    ('50%', 1, 'lru', 'copy'): (75, 36, 0, 66, 3, 106, 0, 28, 0),
    ('50%', 1, 'lru', 'direct'): (73, 38, 19, 32, 3, 73, 30, 28, 12),
    ('50%', 1, 'lfu', 'copy'): (76, 35, 0, 60, 4, 99, 0, 28, 0),
    ('50%', 1, 'lfu', 'direct'): (74, 37, 14, 32, 2, 71, 29, 28, 12),
    ('50%', 1, 'adaptive', 'copy'): (76, 35, 0, 60, 4, 99, 0, 28, 0),
    ('50%', 1, 'adaptive', 'direct'): (74, 37, 14, 32, 2, 71, 29, 28, 12),
    ('50%', 1, 'static', 'copy'): (93, 18, 0, 41, 1, 76, 0, 28, 0),
    ('50%', 1, 'static', 'direct'): (78, 33, 0, 26, 0, 75, 29, 28, 15),
    ('50%', 2, 'lru', 'copy'): (75, 36, 0, 67, 6, 112, 0, 28, 0),
    ('50%', 2, 'lru', 'direct'): (75, 36, 21, 33, 3, 72, 28, 28, 11),
    ('50%', 2, 'lfu', 'copy'): (76, 35, 0, 61, 8, 104, 0, 28, 0),
    ('50%', 2, 'lfu', 'direct'): (76, 35, 18, 33, 3, 71, 27, 28, 9),
    ('50%', 2, 'adaptive', 'copy'): (76, 35, 0, 61, 8, 104, 0, 28, 0),
    ('50%', 2, 'adaptive', 'direct'): (76, 35, 18, 33, 3, 71, 27, 28, 9),
    ('50%', 2, 'static', 'copy'): (93, 18, 0, 41, 6, 81, 0, 28, 0),
    ('50%', 2, 'static', 'direct'): (77, 34, 0, 25, 3, 78, 30, 28, 15),
    ('100%', 0, 'lru', 'copy'): (111, 0, 0, 0, 0, 32, 0, 0, 0),
    ('100%', 0, 'lru', 'direct'): (111, 0, 0, 0, 0, 32, 0, 0, 0),
    ('100%', 0, 'lfu', 'copy'): (111, 0, 0, 0, 0, 32, 0, 0, 0),
    ('100%', 0, 'lfu', 'direct'): (111, 0, 0, 0, 0, 32, 0, 0, 0),
    ('100%', 0, 'adaptive', 'copy'): (111, 0, 0, 0, 0, 32, 0, 0, 0),
    ('100%', 0, 'adaptive', 'direct'): (111, 0, 0, 0, 0, 32, 0, 0, 0),
    ('100%', 0, 'static', 'copy'): (111, 0, 0, 0, 0, 32, 0, 0, 0),
    ('100%', 0, 'static', 'direct'): (111, 0, 0, 0, 0, 32, 0, 0, 0),
    ('100%', 1, 'lru', 'copy'): (111, 0, 0, 0, 0, 32, 0, 0, 0),
    ('100%', 1, 'lru', 'direct'): (111, 0, 0, 0, 0, 32, 0, 0, 0),
    ('100%', 1, 'lfu', 'copy'): (111, 0, 0, 0, 0, 32, 0, 0, 0),
    ('100%', 1, 'lfu', 'direct'): (111, 0, 0, 0, 0, 32, 0, 0, 0),
    ('100%', 1, 'adaptive', 'copy'): (111, 0, 0, 0, 0, 32, 0, 0, 0),
    ('100%', 1, 'adaptive', 'direct'): (111, 0, 0, 0, 0, 32, 0, 0, 0),
    ('100%', 1, 'static', 'copy'): (111, 0, 0, 0, 0, 32, 0, 0, 0),
    ('100%', 1, 'static', 'direct'): (111, 0, 0, 0, 0, 32, 0, 0, 0),
    ('100%', 2, 'lru', 'copy'): (111, 0, 0, 0, 0, 32, 0, 0, 0),
    ('100%', 2, 'lru', 'direct'): (111, 0, 0, 0, 0, 32, 0, 0, 0),
    ('100%', 2, 'lfu', 'copy'): (111, 0, 0, 0, 0, 32, 0, 0, 0),
    ('100%', 2, 'lfu', 'direct'): (111, 0, 0, 0, 0, 32, 0, 0, 0),
    ('100%', 2, 'adaptive', 'copy'): (111, 0, 0, 0, 0, 32, 0, 0, 0),
    ('100%', 2, 'adaptive', 'direct'): (111, 0, 0, 0, 0, 32, 0, 0, 0),
    ('100%', 2, 'static', 'copy'): (111, 0, 0, 0, 0, 32, 0, 0, 0),
    ('100%', 2, 'static', 'direct'): (111, 0, 0, 0, 0, 32, 0, 0, 0),
}
REPLAYED: dict[tuple[str, int, str], Counts] = {
    ('0', 1, 'lru'): (16, 64, 0, 16, 2, 82, 64, 24, 33),
    ('0', 1, 'lfu'): (16, 64, 0, 16, 2, 82, 64, 24, 33),
    ('0', 1, 'adaptive'): (16, 64, 0, 16, 2, 82, 64, 24, 33),
    ('0', 1, 'static'): (16, 64, 0, 16, 2, 82, 64, 24, 33),
    ('0', 2, 'lru'): (13, 67, 0, 13, 5, 85, 67, 24, 34),
    ('0', 2, 'lfu'): (13, 67, 0, 13, 5, 85, 67, 24, 34),
    ('0', 2, 'adaptive'): (13, 67, 0, 13, 5, 85, 67, 24, 34),
    ('0', 2, 'static'): (13, 67, 0, 13, 5, 85, 67, 24, 34),
    ('25%', 1, 'lru'): (25, 55, 24, 16, 2, 73, 55, 24, 31),
    ('25%', 1, 'lfu'): (29, 51, 15, 16, 2, 69, 51, 24, 26),
    ('25%', 1, 'adaptive'): (29, 51, 15, 16, 2, 69, 51, 24, 26),
    ('25%', 1, 'static'): (35, 45, 0, 17, 1, 71, 45, 24, 25),
    ('25%', 2, 'lru'): (22, 58, 24, 13, 5, 76, 58, 24, 33),
    ('25%', 2, 'lfu'): (23, 57, 17, 13, 5, 75, 57, 24, 31),
    ('25%', 2, 'adaptive'): (23, 57, 17, 13, 5, 75, 57, 24, 31),
    ('25%', 2, 'static'): (32, 48, 0, 14, 4, 74, 48, 24, 28),
    ('50%', 1, 'lru'): (32, 48, 19, 15, 3, 66, 48, 24, 29),
    ('50%', 1, 'lfu'): (34, 46, 12, 15, 3, 64, 46, 24, 25),
    ('50%', 1, 'adaptive'): (34, 46, 12, 15, 3, 64, 46, 24, 25),
    ('50%', 1, 'static'): (49, 31, 0, 13, 0, 60, 31, 24, 15),
    ('50%', 2, 'lru'): (30, 50, 20, 13, 5, 68, 50, 24, 30),
    ('50%', 2, 'lfu'): (31, 49, 15, 14, 4, 67, 49, 24, 27),
    ('50%', 2, 'adaptive'): (31, 49, 15, 14, 4, 67, 49, 24, 27),
    ('50%', 2, 'static'): (47, 33, 0, 11, 4, 64, 33, 24, 18),
}
LIVE_COUNTS: dict[str, Counts] = {
    'lru': (56, 55, 8, 54, 7, 116, 31, 28, 10),
    'adaptive': (56, 55, 8, 54, 7, 116, 31, 28, 10),
}
ENGINE: dict[tuple[str, int, str], tuple[int, ...]] = {
    ('25%', 0, 'copy'): (0, 111, 0, 0, 0, 111, 0, 0),
    ('25%', 0, 'direct'): (32, 79, 17, 0, 0, 83, 83, 0),
    ('25%', 1, 'copy'): (54, 57, 0, 54, 27, 139, 0, 0),
    ('25%', 1, 'direct'): (32, 79, 17, 0, 0, 83, 83, 44),
    ('25%', 2, 'copy'): (70, 41, 0, 59, 31, 131, 0, 0),
    ('25%', 2, 'direct'): (32, 79, 17, 0, 0, 83, 83, 38),
    ('50%', 0, 'copy'): (62, 49, 0, 0, 0, 49, 0, 0),
    ('50%', 0, 'direct'): (56, 55, 21, 0, 0, 59, 59, 0),
    ('50%', 1, 'copy'): (62, 49, 0, 16, 16, 81, 0, 0),
    ('50%', 1, 'direct'): (56, 55, 21, 0, 0, 59, 59, 29),
    ('50%', 2, 'copy'): (71, 40, 0, 37, 29, 107, 0, 0),
    ('50%', 2, 'direct'): (56, 55, 21, 0, 0, 59, 59, 25),
}
