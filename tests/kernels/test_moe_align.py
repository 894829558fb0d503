"""Token -> expert alignment: the index tables must be consistent, not only equal to the reference."""
import pytest
import torch

triton = pytest.importorskip("triton")
from kernels.moe_align import moe_align, moe_align_ref  # noqa: E402


def check_tables(a, topk_ids, slot_of_expert):
    """Every invariant the prefill GEMM relies on."""
    m, flat = a.block_m, topk_ids.flatten().long()
    p, e = flat.numel(), slot_of_expert.numel()
    used = int(a.num_padded[0])
    assert used % m == 0 and used == int(a.expert_offsets[e])
    body = a.sorted_pairs[:used].long()
    real = body[body < p]
    assert torch.equal(torch.sort(real).values, torch.arange(p))          # every pair exactly once
    assert (a.sorted_pairs[used:] == p).all()                            # beyond the end: padding
    assert torch.equal(a.sorted_pairs[a.pair_position.long()].long(), torch.arange(p))  # inverse
    counts = torch.bincount(flat, minlength=e)
    sizes = a.expert_offsets[1:] - a.expert_offsets[:-1]
    assert torch.equal(sizes.long(), (counts + m - 1) // m * m)          # each group padded to M
    for b in range(a.max_blocks):
        entries = a.sorted_pairs[b * m:(b + 1) * m].long()
        if b * m >= used:
            assert int(a.block_expert[b]) == -1 and int(a.block_slot[b]) == -1
            continue
        ex = int(a.block_expert[b])
        assert int(a.block_slot[b]) == int(slot_of_expert[ex])
        pairs = entries[entries < p]
        assert len(pairs) > 0 and (flat[pairs] == ex).all()              # block -> expert right
        assert torch.equal(pairs, torch.sort(pairs).values)              # stable within an expert


@pytest.mark.parametrize("tokens, experts, top_k, block_m, used", [
    (1, 8, 2, 16, None),    # one token: two blocks, mostly padding
    (3, 8, 2, 16, 3),       # fewer pairs than a block; five experts receive no token
    (4, 6, 6, 4, None),     # top-k = E: every expert gets every token
    (40, 8, 4, 16, None),   # several blocks per expert, partial last blocks
    (13, 5, 1, 4, 2),       # top-k = 1, blocks exactly full for some experts
    (600, 128, 8, 64, None),  # a prefill's shape: 75 chunks of 64 pairs, more than the scan takes at once
])
@pytest.mark.parametrize("parallel", [False, True], ids=["one-program", "parallel"])
def test_alignment_tables(monkeypatch, tokens, experts, top_k, block_m, used, parallel):
    import kernels.moe_align as align
    monkeypatch.setattr(align, "PARALLEL", parallel)
    g = torch.Generator().manual_seed(tokens)
    ids = torch.stack([torch.randperm(used or experts, generator=g)[:top_k] for _ in range(tokens)])
    ids = ids.to(torch.int32)
    slots = torch.randperm(experts + 3, generator=g)[:experts].to(torch.int32)  # scrambled, spare slots
    a = moe_align(ids, slots, block_m)
    ref = moe_align_ref(ids, slots, block_m)
    check_tables(a, ids, slots)
    check_tables(ref, ids, slots)
    for name in ("sorted_pairs", "pair_position", "block_expert", "block_slot", "expert_offsets",
                 "num_padded"):
        assert torch.equal(getattr(a, name), getattr(ref, name)), name


def test_alignment_accepts_int64_ids_and_rejects_bad_slot_table():
    # Routers elsewhere return int64; a slot table in the wrong dtype must be refused by name.
    ids = torch.tensor([[1, 0], [1, 2]])
    slots = torch.tensor([2, 0, 1], dtype=torch.int32)
    check_tables(moe_align(ids, slots, 4), ids, slots)
    with pytest.raises(ValueError, match="slot_of_expert"):
        moe_align(ids, slots.long(), 4)
