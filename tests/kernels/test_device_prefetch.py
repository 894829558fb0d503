"""The GPU-side prefetch of direct-read decode steps (``engine.experts.device_prefetch``): the claim
and copy kernels in the interpreter against the torch reference the CPU engine runs."""
import pytest
import torch

pytest.importorskip("triton")
from engine.experts.device_prefetch import DevicePrefetcher  # noqa: E402
from kernels.expert_claim import CLAIMED  # noqa: E402

L, E, W = 4, 8, 40          # layers, experts, int32 words per expert row


def _setup(quota, free_slots, progress=-1):
    rows = torch.arange(L * E * W, dtype=torch.int32).view(L * E, W).view(torch.uint8)   # [L*E, 4W] bytes
    pool = torch.zeros(12, 4 * W, dtype=torch.uint8)
    table = torch.full((L, E), -1, dtype=torch.int32)
    table[2, 1], table[2, 5] = 3, 4                                     # resident in layer 2
    dp = DevicePrefetcher(L, E, max_claims=8, device=torch.device("cpu"))
    dp.chunk_words, dp.copy_block = 16, 8                               # several chunks per expert
    dp.begin(free_slots, quota)
    dp.set_progress(progress)
    return dp, rows, pool, table


# Two tokens, k = 3, for layer 2: ranked first choices 5, 6, then 1, 6, then 7, 0. Expert 5 and 1 are
# resident; 6 repeats (two votes, first anyway). Missing, in claim order: 6, 7, 0.
PRED = torch.tensor([[5, 1, 7], [6, 6, 0]], dtype=torch.int64)


@pytest.mark.parametrize("quota,free,expect", [
    (2, [9, 10, 11], [(2 * E + 6, 9, 0, 2), (2 * E + 7, 10, 1, 1)]),      # the quota stops it
    (8, [9, 10], [(2 * E + 6, 9, 0, 2), (2 * E + 7, 10, 1, 1)]),          # the leased slots run out
    (8, [9, 10, 11], [(2 * E + 6, 9, 0, 2), (2 * E + 7, 10, 1, 1), (2 * E + 0, 11, 2, 1)]),
])
def test_kernels_claim_missing_experts_rank_by_rank_and_copy_them(quota, free, expect):
    got = {}
    for how in ("kernels", "reference"):
        dp, rows, pool, table = _setup(quota, free)
        if how == "kernels":
            dp.run_kernels(2, PRED, table, rows, pool, PRED.numel())
        else:
            dp._launch_ref(2, PRED, table, rows, pool, PRED.numel())
        claims = dp.collect([2])
        assert claims == expect
        for key, slot, _, _ in claims:
            assert torch.equal(pool[slot], rows[key])                  # every chunk landed
            assert table.view(-1)[key] == slot                         # published after its bytes
        assert table[2, 1] == 3 and table[2, 5] == 4 and (table[[0, 1, 3]] == -1).all()
        assert int(dp.meta[0]) == len(expect)                          # slots handed out
        got[how] = (claims, pool.clone(), table.clone())
    assert all(torch.equal(a, b) for a, b in zip(got["kernels"][1:], got["reference"][1:]))


def test_a_second_claim_for_the_same_layer_skips_what_is_claimed_or_landed():
    dp, rows, pool, table = _setup(8, [9, 10, 11, 8])
    table[2, 0] = CLAIMED                                              # a copy under way
    dp.run_kernels(2, PRED, table, rows, pool, PRED.numel())
    assert dp.collect([2]) == [(2 * E + 6, 9, 0, 2), (2 * E + 7, 10, 1, 1)]
    dp.run_kernels(2, PRED, table, rows, pool, PRED.numel())           # everything has a slot now
    assert dp.collect([2]) == []


def test_nothing_is_claimed_once_the_layer_before_the_target_has_run():
    for how in ("kernels", "reference"):
        dp, rows, pool, table = _setup(8, [9, 10, 11], progress=1)       # layer 1 published: too late for 2
        run = dp.run_kernels if how == "kernels" else dp._launch_ref
        run(2, PRED, table, rows, pool, PRED.numel())
        assert dp.collect([2]) == []
        assert (table[2] < 0).sum() == 6 and int(dp.meta[0]) == 0
        run(3, PRED, table, rows, pool, PRED.numel())                   # layer 3 still can be
        assert [c[0] for c in dp.collect([3])] == [3 * E + 6, 3 * E + 5, 3 * E + 1]   # 6: two votes


def test_experts_more_tokens_predict_are_claimed_first():
    # Three tokens, k = 2: expert 7 is everybody's second choice, so it goes before the first choices
    # 2, 4, 6 (which keep their rank order); with a quota of 2 the claims are 7 then 2.
    pred = torch.tensor([[2, 7], [4, 7], [6, 7]], dtype=torch.int64)
    for how in ("kernels", "reference"):
        for quota, want in ((2, [7, 2]), (8, [7, 2, 4, 6])):
            dp, rows, pool, table = _setup(quota, [8, 9, 10, 11])
            run = dp.run_kernels if how == "kernels" else dp._launch_ref
            run(3, pred, table, rows, pool, pred.numel())
            claims = dp.collect([3])
            assert [c[0] - 3 * E for c in claims] == want, how
            assert [c[1] for c in claims] == [8, 9, 10, 11][:len(want)]
            assert all(torch.equal(pool[c[1]], rows[c[0]]) for c in claims)


def test_experts_fewer_tokens_predict_than_min_votes_are_not_claimed():
    # Three tokens, k = 2: expert 7 has three votes, 2, 4 and 6 one each. With min_votes 2 only 7 is
    # claimed, however large the quota; each claim records its votes.
    pred = torch.tensor([[2, 7], [4, 7], [6, 7]], dtype=torch.int64)
    for how in ("kernels", "reference"):
        for min_votes, want in ((1, [(7, 3), (2, 1), (4, 1), (6, 1)]), (2, [(7, 3)]), (4, [])):
            dp, rows, pool, table = _setup(8, [8, 9, 10, 11])
            dp.begin([8, 9, 10, 11], 8, min_votes)
            run = dp.run_kernels if how == "kernels" else dp._launch_ref
            run(3, pred, table, rows, pool, pred.numel())
            claims = dp.collect([3])
            assert [(c[0] - 3 * E, c[3]) for c in claims] == want, (how, min_votes)
            assert int((table[3] >= 0).sum()) == len(want)
