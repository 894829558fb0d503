"""The cards' expert counters merged into the model's: counts add up, settings and step times do not."""
from __future__ import annotations

import dataclasses

from engine.stats import merge_experts, merge_shards
from engine.telemetry import ExpertStats


def _card(hits: int, steps_ms: float, threshold: float, cpu_ms: float) -> ExpertStats:
    return ExpertStats(hits=hits, misses=1, steps_ms=steps_ms, claim_threshold=threshold, cpu_ms=cpu_ms,
                       per_layer_hit_rate=(0.5,), activations=((hits, 1),), policy="lru")


def test_stages_add_their_counts_but_not_their_step_times_or_thresholds():
    merged = merge_experts([_card(3, 40.0, 0.25, 5.0), _card(4, 55.0, 0.25, 7.0), _card(5, 30.0, 0.3, 1.0)])
    assert (merged.hits, merged.misses, merged.cpu_ms) == (12, 3, 13.0)         # work done on every card
    assert merged.activations == ((3, 1), (4, 1), (5, 1))                       # one row per layer, in order
    # the step as the engine's card waits for it: the longest card's time, never the sum
    assert merged.steps_ms == 55.0
    assert merged.claim_threshold == 0.25                                       # the first card's setting
    assert merged.policy == "lru"


def test_expert_parallel_cards_share_every_step():
    a, b = _card(3, 40.0, 0.25, 5.0), _card(4, 41.0, 0.25, 7.0)
    b = dataclasses.replace(b, activations=((6, 2),))
    merged = merge_shards([a, b])
    assert merged.steps_ms == 41.0 and merged.claim_threshold == 0.25
    assert merged.activations == ((3, 6, 1, 2),)                                # card r holds experts r, r + N, ...
    assert merged.per_layer_hit_rate == (0.5,)
