"""A prompt's chunk ranks the experts it brings in by how many of its tokens use each (CopyPath and
EvictionPolicy.touch_chunk): after a prompt the pool holds the prompt's most used experts, across
layers, rather than whichever came last."""
from __future__ import annotations

import pytest
import torch

from engine.experts.adaptive_policy import AdaptiveLFUPolicy
from engine.experts.copy_path import CHUNK_TOKENS
from engine.experts.policy import LFUPolicy, LRUPolicy
from test_experts_support import E, Stack


@pytest.fixture(scope="module")
def stack() -> Stack:
    return Stack()


def _chunk(uses: dict[int, int]) -> torch.Tensor:
    """Routing ids ``[T, 1]`` of a chunk whose tokens use expert ``e`` ``uses[e]`` times."""
    return torch.tensor([e for e, n in uses.items() for _ in range(n)]).view(-1, 1)


def _resident(prov) -> set[int]:
    return set(prov.pool.books.resident_keys())


def _step(prov, calls: list[tuple[int, torch.Tensor]], prompt: bool = True) -> None:
    prov.begin_step(prompt=prompt)
    for layer, ids in calls:
        prov.acquire(layer, ids)
    prov.end_step()


def test_lfu_weighs_a_chunk_by_each_keys_share_of_its_tokens() -> None:
    lfu = LFUPolicy(0.9)                     # a horizon of 1 / (1 - 0.9) = 10 steps
    lfu.touch_chunk({1: 64, 2: 16}, 64)
    assert lfu.hotness(1) == pytest.approx(10.0)          # used by every token: as a key used every step
    assert lfu.hotness(2) == pytest.approx(10.0 * 16 / 64)
    lfu.touch_chunk({3: 2, 4: 1}, 4)                      # shorter than the horizon: one use per token
    assert (lfu.hotness(3), lfu.hotness(4)) == (pytest.approx(2.0), pytest.approx(1.0))
    forever = LFUPolicy(1.0)
    forever.touch_chunk({5: 3}, 500)
    assert forever.hotness(5) == pytest.approx(3.0)


def test_lru_and_adaptive_order_a_chunk_by_its_uses() -> None:
    lru = LRUPolicy()
    for k in (1, 2, 3):
        lru.insert(k)
    lru.touch_chunk({1: 9, 2: 1, 3: 5}, 15)
    assert lru.victims(3, set()) == [2, 3, 1]             # the least used goes first
    ada = AdaptiveLFUPolicy()
    ada.touch_chunk({7: 30, 8: 2}, 40)
    assert ada.hotness(7) > ada.hotness(8) > 0


@pytest.mark.parametrize("policy", ["lfu", "adaptive"])
def test_a_prompt_chunk_keeps_its_most_used_experts(stack: Stack, policy: str) -> None:
    # experts 0-3 serve 9 tokens each, 4-7 one each; four slots: the pool keeps 0-3 and stages 4-7
    prov = stack.offloaded(4, depth=0, policy=policy)
    ids = _chunk({**{e: 9 for e in range(4)}, **{e: 1 for e in range(4, 8)}})
    assert ids.shape[0] >= CHUNK_TOKENS
    _step(prov, [(0, ids)])
    assert _resident(prov) == {0, 1, 2, 3}
    st = prov.stats()
    assert (st.hits, st.misses) == (0, 8)                 # 4-7 were staged: still misses, each copied once


@pytest.mark.parametrize("hot_layer", [0, 1])
def test_a_prompt_ranks_its_experts_across_layers(stack: Stack, hot_layer: int) -> None:
    prov = stack.offloaded(4, depth=0, policy="adaptive")
    hot = _chunk({e: 10 for e in range(4)})
    rare = _chunk({e: 4 for e in range(E)})               # every expert, by 4 of 32 tokens each
    _step(prov, [(layer, hot if layer == hot_layer else rare) for layer in range(2)])
    base = hot_layer * E
    assert _resident(prov) == {base + e for e in range(4)}


@pytest.mark.parametrize("prompt", [True, False])
def test_only_a_prompts_step_ranks_its_misses(stack: Stack, prompt: bool) -> None:
    # experts 4-7 serve 9 tokens each, 0-3 one each. A step without a prompt's tokens (a large decode
    # batch) takes its misses in key order: 0-3 fill the pool, pinned for the layer, and 4-7 are staged.
    prov = stack.offloaded(4, depth=0, policy="lfu")
    _step(prov, [(0, _chunk({**{e: 1 for e in range(4)}, **{e: 9 for e in range(4, 8)}}))], prompt=prompt)
    assert _resident(prov) == ({4, 5, 6, 7} if prompt else {0, 1, 2, 3})


def test_a_prompt_chunks_prefetch_evicts_only_colder_experts(stack: Stack) -> None:
    # layer 0's chunk fills the pool with its hot experts; a prefetch for layer 1 made during that chunk
    # must not push them out (the prefetched experts have no uses yet), and layer 1's own rare experts
    # then stay out too
    prov = stack.offloaded(4, depth=1, policy="lfu")
    hot = _chunk({e: 10 for e in range(4)})
    prov.begin_step(prompt=True)
    x = torch.randn(hot.shape[0], 16, generator=torch.Generator().manual_seed(3))
    prov.before_layer(0, x)
    prov.acquire(0, hot)
    prov.issue_prefetch()
    assert _resident(prov) == {0, 1, 2, 3}
    prov.before_layer(1, x)
    prov.acquire(1, _chunk({e: 4 for e in range(E)}))
    prov.end_step()
    assert _resident(prov) == {0, 1, 2, 3}


@pytest.mark.parametrize("policy", ["lru", "lfu", "adaptive", "static"])
@pytest.mark.parametrize("slots", [0, 3, 16])
@pytest.mark.parametrize("depth", [0, 2])
def test_prompt_sized_steps_give_the_resident_outputs(stack: Stack, policy: str, slots: int, depth: int) -> None:
    x = torch.randn(CHUNK_TOKENS + 8, 16, generator=torch.Generator().manual_seed(4))
    ref = stack.run(stack.resident(), x, 2)
    profile = [[(l * 5 + e) % 7 for e in range(E)] for l in range(4)]
    out = stack.run(stack.offloaded(slots, depth, policy, routing_profile=profile), x, 2, prompt=True)
    for a, b in zip(out, ref, strict=True):
        assert torch.equal(a, b)


def test_the_adaptive_shadows_admit_a_chunk_as_the_pool_does(stack: Stack) -> None:
    prov = stack.offloaded(4, depth=0, policy="adaptive")
    _step(prov, [(0, _chunk({**{e: 9 for e in range(4)}, **{e: 1 for e in range(4, 8)}}))])
    policy = prov.r.policy
    policy.catch_up()
    assert all(s.keys == {0, 1, 2, 3} for s in policy._shadows)


@pytest.mark.parametrize("predicted", [False, True])
def test_a_prompts_foreseen_experts_are_ranked_by_their_layer(stack: Stack, predicted: bool) -> None:
    # decode steps leave layer 1's experts 0-3 resident; the prompt's every token then uses 4-7 there. A
    # prefetch made from layer 0's chunk cannot rank them yet (no uses so far), so it leaves them to layer
    # 1, whose chunk admits them over the colder residents: foreseen or not, they end in the pool.
    prov = stack.offloaded(5, depth=1, policy="lfu")
    for _ in range(2):
        _step(prov, [(0, _chunk({0: 1})), (1, _chunk({0: 1, 1: 1, 2: 1, 3: 1}))], prompt=False)
    layer1 = _chunk({e: 16 for e in range(4, 8)})
    prov.begin_step(prompt=True)
    if predicted:
        prov._predicted = (0, [1], layer1.view(1, -1, 1))     # what the predictor would say for layer 1
    prov.acquire(0, _chunk({0: 64}))
    prov.issue_prefetch()
    prov.acquire(1, layer1)
    prov.end_step()
    assert {E + e for e in range(4, 8)} <= _resident(prov)
