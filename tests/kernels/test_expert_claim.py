"""The claim and copy launchers of the GPU-side prefetch (``kernels.expert_claim``) against their
torch reference, called directly; engine-level behaviour is in test_device_prefetch.py."""
import pytest
import torch

pytest.importorskip("triton")
from kernels.expert_claim import ClaimBuffers, claim_and_copy, claim_and_copy_ref  # noqa: E402

L, E, MAXC = 3, 6, 8


def _state(free, quota, min_votes, words):
    rows = (torch.arange(L * E * words, dtype=torch.int32) * 7).view(L * E, words).view(torch.uint8)
    pool = torch.zeros(10, 4 * words, dtype=torch.uint8)
    table = torch.full((L, E), -1, dtype=torch.int32)
    table[1, 2] = 0                                                    # resident: never claimed
    meta = torch.tensor([0, len(free), quota, -1, 0, min_votes], dtype=torch.int32)
    buf = ClaimBuffers(torch.tensor(free + [0] * (MAXC - len(free)), dtype=torch.int32), meta,
                       torch.zeros(2 * MAXC, dtype=torch.int64), torch.zeros(MAXC, dtype=torch.int32),
                       torch.full((L, 1 + 3 * MAXC), -2, dtype=torch.int64), E, MAXC)
    return buf, rows, pool, table


@pytest.mark.parametrize("pred,free,quota,min_votes,words", [
    ([[2, 4], [4, 5]], [6, 7, 8], 8, 1, 40),        # a resident expert skipped, a two-vote one first
    ([[3]], [6], 1, 1, 16),                         # one token, one id, one chunk
    ([[0, 1], [0, 1], [5, 0]], [6, 7], 8, 2, 40),   # min votes drops the one-vote expert
    ([[0, 1, 3, 4]], [6, 7, 8, 9], 2, 1, 24),       # the quota stops it before the slots run out
])
def test_claims_and_copies_match_the_reference(pred, free, quota, min_votes, words):
    ids = torch.tensor(pred, dtype=torch.int64)
    outs = []
    for fn in (claim_and_copy, claim_and_copy_ref):
        buf, rows, pool, table = _state(free, quota, min_votes, words)
        args = (buf, 1, ids, table, rows, pool, ids.numel())
        fn(*args, chunk_words=8, copy_block=4) if fn is claim_and_copy else fn(*args)
        n = int(buf.regions[1, 0])
        outs.append((n, buf.regions[1, 1:1 + n].tolist(), buf.regions[1, 1 + MAXC:1 + MAXC + n].tolist(),
                     int(buf.meta[0]), pool.clone(), table.clone()))
    (n, keys, slots, nxt, pool, table), ref = outs
    assert (n, keys, slots, nxt) == ref[:4]
    assert torch.equal(pool, ref[4]) and torch.equal(table, ref[5])
    assert n > 0 and table[1, 2] == 0


def test_a_claim_past_its_buffers_is_refused():
    buf, rows, pool, table = _state([6], 1, 1, 16)
    with pytest.raises(ValueError, match="at most"):
        claim_and_copy(buf, 1, torch.zeros(3, 3, dtype=torch.int64), table, rows, pool, 9)
