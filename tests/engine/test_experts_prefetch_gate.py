"""The prefetch gates: distances (and claim ranks) whose guesses mostly miss stop costing bus bytes, and are
probed again."""
from __future__ import annotations

from engine.experts.prefetch import ClaimGate, PrefetchGate


def test_gate_stays_open_while_guesses_are_used():
    gate = PrefetchGate(threshold=0.5, probe_every=1000, min_samples=8)
    for _ in range(50):
        gate.tick()
        gate.on_issue(1, 4)
        for _ in range(3):
            gate.on_use(1)                        # 75% of distance-1 guesses are used
        gate.on_issue(2, 4)
        for _ in range(3):
            gate.on_use(2)
    assert gate.depth(2) == 2
    assert 0.7 < gate.accuracy(1) < 0.8


def test_gate_closes_a_distance_that_mostly_misses_and_everything_beyond():
    gate = PrefetchGate(threshold=0.5, probe_every=1000, min_samples=8)
    for _ in range(50):
        gate.tick()
        gate.on_issue(1, 4)
        gate.on_use(1)                            # 25%: wrong guesses cost more than they save
        gate.on_issue(2, 4)
        for _ in range(4):
            gate.on_use(2)                        # even a good farther distance goes: it rests on worse guesses
    assert gate.depth(2) == 0


def test_gate_probes_again_so_a_routing_change_is_noticed():
    gate = PrefetchGate(threshold=0.5, probe_every=4, min_samples=8)
    for _ in range(40):
        gate.tick()
        gate.on_issue(1, 4)
    depths = []
    for _ in range(8):
        gate.tick()
        depths.append(gate.depth(1))
    assert depths.count(1) == 2 and depths.count(0) == 6     # one probe step in four


def test_no_estimate_yet_means_prefetch():
    """Until enough guesses were made, the requested depth stands (the prefetcher must learn first)."""
    assert PrefetchGate(min_samples=8).depth(3) == 3


def test_the_offloaded_pool_counts_guesses_per_distance(tmp_path):
    from engine import LLM, SamplingParams
    from tiny_models import build_tiny_model
    model = build_tiny_model(tmp_path / "m", "qwen3_moe")
    llm = LLM(str(model), device="cpu", expert_pool_size=3 * 24 * 3 * 1024, prefetch_depth=2)
    llm.generate([[1, 5, 9, 300]], SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True))
    gate, stats = llm.engine.loaded.experts.gate, llm.stats().experts
    assert gate.issued[1] > 0
    assert round(sum(gate.used)) <= stats.prefetch_hits           # used counts decay, hits do not


def test_a_probe_at_a_closed_distance_copies_only_its_quota():
    # At batch 8 a full probe of a closed distance would copy dozens of mostly wrong guesses per layer.
    gate = PrefetchGate(threshold=0.5, probe_every=4, min_samples=8, probe_quota=2)
    assert gate.quota(1) is None                                  # no estimate yet: no cap
    for _ in range(40):
        gate.tick()
        gate.on_issue(1, 4)
        gate.on_issue(2, 4)
        for _ in range(4):
            gate.on_use(2)
    assert gate.quota(1) == 2 and gate.quota(2) is None           # closed distance capped, open one not


def test_claims_per_layer_are_the_leading_ranks_that_are_mostly_used():
    gate = ClaimGate(threshold=0.2, decay=1.0, min_samples=8)
    assert gate.quota(8, cap=4, probe=False) == 4                 # nothing measured yet: up to the cap
    # batch 8: rank 0 used 60%, rank 1 30%, rank 2 10%, rank 3 50% (behind a closed rank: not reached)
    share = [0.6, 0.3, 0.1, 0.5]
    for i in range(20):
        gate.record(8, [(r, i < 20 * s, 2) for r, s in enumerate(share)])
    assert [gate.accuracy(8, r) for r in range(4)] == share
    assert gate.quota(8, cap=4, probe=False) == 2
    assert gate.quota(8, cap=4, probe=True) == 3                  # a probe measures the first closed rank
    assert gate.quota(8, cap=1, probe=True) == 1                  # never past the cap
    assert gate.quota(9, cap=4, probe=False) == 2                 # 8-15 tokens share a bucket
    assert gate.quota(1, cap=4, probe=False) == 4                 # a batch-1 step is measured apart


def test_a_closed_first_rank_stops_claims_until_a_probe_and_the_counts_age():
    gate = ClaimGate(threshold=0.2, decay=0.5, min_samples=4)
    gate.record(1, [(0, False, 1)] * 10)
    assert gate.quota(1, cap=3, probe=False) == 0 and gate.quota(1, cap=3, probe=True) == 1
    for _ in range(4):                                            # routing changed: its claims are used now
        gate.record(1, [(0, True, 1)] * 10)
    assert gate.accuracy(1, 0) > 0.9 and gate.quota(1, cap=3, probe=False) == 3
    assert gate.snapshot()[1][:2] == [round(gate.accuracy(1, 0), 3), None]


def test_claims_need_the_fewest_votes_whose_claims_are_mostly_used():
    gate = ClaimGate(threshold=0.4, decay=1.0, min_samples=8, by_votes=True)
    assert gate.min_votes(8, probe=False) == 1                    # nothing measured yet
    # batch 8: claims one token predicted used 20%, two tokens 30%, three tokens 70%
    for i in range(20):
        gate.record(8, [(0, i < 4, 1), (0, i < 6, 2), (1, i < 14, 3)])
    assert [gate.vote_accuracy(8, v) for v in (1, 2, 3, 4)] == [0.2, 0.3, 0.7, None]
    assert gate.min_votes(8, probe=False) == 3
    assert gate.min_votes(8, probe=True) == 2                     # a probe measures one vote fewer
    assert gate.min_votes(1, probe=False) == 1                    # one token: one vote, measured apart
    assert gate.vote_snapshot()[4][:4] == [0.2, 0.3, 0.7, None]
    gate.record(2, [(0, False, 1)] * 20)
    assert gate.min_votes(2, probe=False) == 2                    # never more votes than tokens
    gate.by_votes = False
    assert gate.min_votes(8, probe=False) == 1
