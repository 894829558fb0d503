"""The publish kernel of direct-read decode steps (``kernels.publish_ids.publish_direct``), against its reference.

It runs inside the step's CUDA graph, once per MoE layer, and is the only place where a recorded step
decides which missing experts are written into which pool slots; here it runs in the interpreter.
"""
import pytest
import torch

pytest.importorskip("triton")
from kernels.publish_ids import (SLOT_CPU, CpuShareArgs, GatherArgs, gather_copy, gather_copy_ref,  # noqa: E402
                                publish_direct, publish_direct_ref, store_ids, store_ids_ref)


def _publish(table, ids, meta, free, pred=None):
    snap = torch.full_like(table, 7)
    fill = torch.full_like(table, 5)                     # stale values from an earlier layer call
    n = ids.numel()
    region = torch.full((3 * n + (0 if pred is None else pred.numel()),), -2, dtype=torch.int64)
    publish_direct(table, snap, ids, pred, region, fill, free, meta)
    return snap, fill, region


def test_fill_slots_go_to_first_occurrences_of_missing_experts_in_order():
    # Experts 1 and 4 are resident. Ids (two tokens, k = 3): 3 missing twice, 6 missing, 1 resident,
    # 0 missing. Fill slots 20, 21 are left of the step's 3 (one went to an earlier layer): 3 and 6
    # get them in order of first occurrence; 0 gets none; repeats of 3 report 3's slot.
    table = torch.tensor([-1, 11, -1, -1, 14, -1, -1, -1], dtype=torch.int32)
    ids = torch.tensor([3, 6, 1, 3, 0, 4], dtype=torch.int32)
    meta = torch.tensor([1, 3], dtype=torch.int32)
    free = torch.tensor([19, 20, 21, 0], dtype=torch.int32)
    pred = torch.tensor([2, 5, 7], dtype=torch.int32)
    snap, fill, region = _publish(table, ids, meta, free, pred)
    assert torch.equal(snap, table)
    assert fill.tolist() == [-1, -1, -1, 20, -1, -1, 21, -1]          # the whole row rewritten
    n = ids.numel()
    assert region[:n].tolist() == ids.tolist()
    assert region[n:2 * n].tolist() == [-1, -1, 11, -1, -1, 14]
    assert region[2 * n:3 * n].tolist() == [20, 21, -1, 20, -1, -1]
    assert region[3 * n:].tolist() == [2, 5, 7]
    assert meta.tolist() == [3, 3]                                    # used up, never past the count


def test_no_fill_slots_left_or_none_missing():
    table = torch.tensor([10, -1, 12, 13], dtype=torch.int32)
    free = torch.tensor([30, 31], dtype=torch.int32)
    meta = torch.tensor([0, 0], dtype=torch.int32)                    # a step without fill slots
    _, fill, region = _publish(table, torch.tensor([1, 1, 0], dtype=torch.int32), meta, free)
    assert fill.tolist() == [-1] * 4 and region[6:].tolist() == [-1, -1, -1] and meta.tolist() == [0, 0]
    meta = torch.tensor([0, 2], dtype=torch.int32)                    # all resident: nothing taken
    _, fill, region = _publish(table, torch.tensor([0, 2, 3], dtype=torch.int32), meta, free)
    assert fill.tolist() == [-1] * 4 and meta.tolist() == [0, 2]


def test_padding_rows_take_row_zeros_experts_in_place():
    # A step recorded for 3 rows runs 1 real one: the padding rows' ids become row 0's (in the ids
    # the MoE kernels read next too), so they take no fill slot and add no reads of their own.
    table = torch.tensor([-1, 11, -1, -1, -1, -1], dtype=torch.int32)
    ids = torch.tensor([2, 1, 4, 5, 3, 0], dtype=torch.int32)          # rows [2, 1] [4, 5] [3, 0], k = 2
    meta = torch.tensor([0, 4], dtype=torch.int32)
    free = torch.tensor([40, 41, 42, 43], dtype=torch.int32)
    snap, fill, region = torch.full_like(table, 7), torch.full_like(table, 5), torch.full((18,), -2, dtype=torch.int64)
    publish_direct(table, snap, ids, None, region, fill, free, meta, pad=torch.tensor([False, True, True]))
    assert ids.tolist() == [2, 1, 2, 1, 2, 1]
    assert region[:6].tolist() == [2, 1, 2, 1, 2, 1]
    assert region[6:12].tolist() == [-1, 11, -1, 11, -1, 11]
    assert region[12:].tolist() == [40, -1, 40, -1, 40, -1]
    assert fill.tolist() == [-1, -1, 40, -1, -1, -1] and meta.tolist() == [1, 4]
    unpadded = torch.tensor([2, 1, 4, 5], dtype=torch.int32)
    publish_direct(table, snap, unpadded, None, torch.full((12,), -2, dtype=torch.int64), fill, free,
                   torch.tensor([0, 4], dtype=torch.int32), pad=torch.tensor([False, False]))
    assert unpadded.tolist() == [2, 1, 4, 5]


@pytest.mark.parametrize("case", ["predictions", "padding", "one id", "fills run out", "more ids than experts"])
def test_kernel_matches_reference(case):
    # The reference is what the CPU's eager steps would need if the kernel could not run; each case
    # names the branch it covers: predictions appended, padding rows rewritten in place, a single
    # token's single id, fewer fill slots than missing experts, N past E (masking on both sides).
    g = torch.Generator().manual_seed(len(case))
    E = 8 if case != "more ids than experts" else 5
    table = torch.randint(-1, 3, (E,), generator=g, dtype=torch.int32)
    table[table >= 0] += 10
    n = {"one id": 1, "more ids than experts": 12}.get(case, 6)
    ids = torch.randint(0, E, (n,), generator=g, dtype=torch.int32)
    pred = torch.randint(0, E, (4,), generator=g, dtype=torch.int32) if case == "predictions" else None
    pad = torch.tensor([False, True, True]) if case == "padding" else None
    meta = torch.tensor([0, 1 if case == "fills run out" else 4], dtype=torch.int32)
    free = torch.tensor([30, 31, 32, 33], dtype=torch.int32)
    outs = []
    for fn in (publish_direct, publish_direct_ref):
        args = [table.clone(), torch.full_like(table, 7), ids.clone(), pred,
                torch.full((3 * n + (0 if pred is None else 4),), -2, dtype=torch.int64), torch.full_like(table, 5),
                free.clone(), meta.clone(), torch.zeros(1, dtype=torch.int32)]
        fn(*args, layer=3, pad=pad)
        outs.append(args)
    for a, b in zip(*outs):
        if a is not None:
            assert torch.equal(a, b)


@pytest.mark.parametrize("n", [1, 1023, 1025])   # one id; one block less one; a second, masked block
def test_store_ids_matches_reference(n):
    src = torch.arange(n, dtype=torch.int64) * 3 - 7
    a, b = torch.full((n + 2,), -2, dtype=torch.int64), torch.full((n + 2,), -2, dtype=torch.int64)
    store_ids(src, a)
    store_ids_ref(src, b)
    assert torch.equal(a, b)


def _cpu_args(t, d, k, frac, g):
    return CpuShareArgs(torch.randn(t, d, generator=g), torch.rand(t * k, generator=g),
                        torch.full((t * d + t * k,), -5.0), torch.zeros(1, dtype=torch.int32),
                        torch.tensor([frac], dtype=torch.float32))


def test_the_host_cpu_takes_the_most_used_missing_experts():
    # Two tokens, k = 3: 3 is missing and used twice, 6 and 0 missing once, 1 and 4 resident. Half of
    # the three missing experts, rounded, is 2: 3 (two uses) then 6 (first of the single uses). Their
    # snapshot entries become SLOT_CPU and they take no fill slot; 0 takes the first one. The inputs
    # and the routing weights reach the host, then the flag.
    table = torch.tensor([-1, 11, -1, -1, 14, -1, -1, -1], dtype=torch.int32)
    ids = torch.tensor([6, 3, 1, 3, 0, 4], dtype=torch.int32)
    g = torch.Generator().manual_seed(0)
    for fn in (publish_direct, publish_direct_ref):
        cpu = _cpu_args(2, 16, 3, 0.5, g)
        snap, fill = torch.full_like(table, 7), torch.full_like(table, 5)
        region = torch.full((18,), -2, dtype=torch.int64)
        meta = torch.tensor([0, 4], dtype=torch.int32)
        fn(table, snap, ids.clone(), None, region, fill, torch.tensor([20, 21, 22, 23], dtype=torch.int32), meta,
           cpu=cpu)
        assert snap.tolist() == [-1, 11, -1, SLOT_CPU, 14, -1, SLOT_CPU, -1], fn.__name__
        assert region[6:12].tolist() == [SLOT_CPU, SLOT_CPU, 11, SLOT_CPU, -1, 14]
        assert region[12:].tolist() == [-1, -1, -1, -1, 20, -1] and meta.tolist() == [1, 4]
        assert torch.equal(cpu.inputs[:32], cpu.x.reshape(-1)) and torch.equal(cpu.inputs[32:], cpu.tw)
        assert cpu.flag.item() == 1


@pytest.mark.parametrize("frac", [0.0, 0.3, 1.0])
def test_cpu_share_kernel_matches_reference(frac):
    # Share 0: nothing changes and the host is not called (flag, inputs untouched); 1: every missing
    # expert is the host's and none takes a fill slot; in between, with padding rows.
    g = torch.Generator().manual_seed(int(frac * 10))
    E, t, k, d = 16, 3, 4, 24
    table = torch.randint(-1, 2, (E,), generator=g, dtype=torch.int32)
    ids = torch.randint(0, E, (t * k,), generator=g, dtype=torch.int32)
    pad = torch.tensor([False, False, True])
    outs = []
    for fn in (publish_direct, publish_direct_ref):
        cpu = _cpu_args(t, d, k, frac, torch.Generator().manual_seed(1))
        args = [table.clone(), torch.full_like(table, 7), ids.clone(), None, torch.full((3 * t * k,), -2, dtype=torch.int64),
                torch.full_like(table, 5), torch.tensor([30, 31, 32], dtype=torch.int32),
                torch.tensor([0, 3], dtype=torch.int32)]
        fn(*args, pad=pad, cpu=cpu)
        outs.append(args + [cpu.inputs, cpu.flag])
    for a, b in zip(*outs):
        if a is not None:
            assert torch.equal(a, b)
    snap, flag = outs[0][1], outs[0][-1]
    padded_ids = ids.view(t, k).clone()
    padded_ids[pad] = padded_ids[0].clone()
    missing = {int(e) for e in padded_ids.flatten() if table[int(e)] < 0}
    quota = int(frac * len(missing) + 0.5)
    assert int((snap == SLOT_CPU).sum()) == quota and flag.item() == (1 if quota else 0)
    if frac == 0:
        assert flag.item() == 0 and (outs[0][-2] == -5).all()


def _gather_args(slots, n, base=0, min_uses=2):
    return GatherArgs(torch.tensor([len(slots)] + slots + [0] * (8 - len(slots)), dtype=torch.int32),
                      torch.full((1 + 2 * n,), -7, dtype=torch.int64), base, min_uses)


def test_with_min_uses_1_every_missing_expert_is_gathered():
    # One token, k = 4, expert 1 resident: 0, 5 and 7 are missing and used once each. With
    # min_uses=1 all three are gathered: 0 into the last fill slot (19), 5 and 7 into gather slots.
    table = torch.tensor([-1, 11, -1, -1, -1, -1, -1, -1], dtype=torch.int32)
    ids = torch.tensor([0, 1, 5, 7], dtype=torch.int32)
    for fn in (publish_direct, publish_direct_ref):
        g = _gather_args([40, 41, 42], ids.numel(), base=8, min_uses=1)
        snap, fill = torch.full_like(table, 7), torch.full_like(table, 5)
        region = torch.full((12,), -2, dtype=torch.int64)
        meta = torch.tensor([1, 2], dtype=torch.int32)
        fn(table, snap, ids.clone(), None, region, fill, torch.tensor([18, 19], dtype=torch.int32), meta, gather=g)
        assert region[4:8].tolist() == [-1, 11, -1, -1], fn.__name__
        assert region[8:].tolist() == [19, -1, 40, 41]
        assert g.work[:7].tolist() == [3, 19, 8 + 0, 40, 8 + 5, 41, 8 + 7]
        assert snap.tolist() == [19, 11, -1, -1, -1, 40, -1, 41]


def test_missing_experts_several_tokens_use_are_gathered_once():
    # Three tokens, k = 2, expert 1 resident. 3 is missing and used by every token, 6 by two. One fill
    # slot (20) is left: 3 takes it (first occurrence). Gather slots 40, 41: 6 takes 40. 3 and 6 are
    # listed for the copy (into 20 and 40, store rows base + e); the region shows them missing (-1)
    # with those slots in the fill column, and their snapshot entries become the slots.
    table = torch.tensor([-1, 11, -1, -1, -1, -1, -1, -1], dtype=torch.int32)
    ids = torch.tensor([3, 6, 3, 1, 6, 3], dtype=torch.int32)               # [[3, 6], [3, 1], [6, 3]]
    for fn in (publish_direct, publish_direct_ref):
        g = _gather_args([40, 41], ids.numel(), base=16)
        snap, fill = torch.full_like(table, 7), torch.full_like(table, 5)
        region = torch.full((18,), -2, dtype=torch.int64)
        meta = torch.tensor([2, 3], dtype=torch.int32)
        fn(table, snap, ids.clone(), None, region, fill, torch.tensor([18, 19, 20], dtype=torch.int32), meta,
           pad=torch.zeros(3, dtype=torch.bool), gather=g)
        assert region[6:12].tolist() == [-1, -1, -1, 11, -1, -1], fn.__name__
        assert region[12:].tolist() == [20, 40, 20, -1, 40, 20]
        assert snap.tolist() == [-1, 11, -1, 20, -1, -1, 40, -1]
        assert g.work[:5].tolist() == [2, 20, 16 + 3, 40, 16 + 6]
        assert meta.tolist() == [3, 3]


@pytest.mark.parametrize("min_uses", [1, 2])
@pytest.mark.parametrize("frac", [None, 0.0, 0.5])
@pytest.mark.parametrize("gather_slots", [[], [30, 31], [30, 31, 32, 33, 34, 35]])
def test_gather_kernel_matches_reference(frac, gather_slots, min_uses):
    # Random tables and ids, padding rows, with and without the host CPU's share, few or many gather
    # slots: kernel and reference make the same writes, and no expert the host CPU takes is gathered.
    g = torch.Generator().manual_seed(len(gather_slots) + (0 if frac is None else int(frac * 10) + 1))
    E, t, k, d = 16, 4, 4, 8
    table = torch.randint(-1, 2, (E,), generator=g, dtype=torch.int32)
    ids = torch.randint(0, 6, (t * k,), generator=g, dtype=torch.int32)       # few experts: shared often
    pad = torch.tensor([False, False, False, True])
    outs = []
    for fn in (publish_direct, publish_direct_ref):
        cpu = None if frac is None else _cpu_args(t, d, k, frac, torch.Generator().manual_seed(1))
        ga = _gather_args(gather_slots, t * k, base=32, min_uses=min_uses)
        args = [table.clone(), torch.full_like(table, 7), ids.clone(), None, torch.full((3 * t * k,), -2, dtype=torch.int64),
                torch.full_like(table, 5), torch.tensor([30 - 8, 30 - 7], dtype=torch.int32),
                torch.tensor([0, 2], dtype=torch.int32)]
        fn(*args, pad=pad, cpu=cpu, gather=ga)
        n = int(ga.work[0])
        outs.append(args + [ga.work[:1 + 2 * n]] + ([] if cpu is None else [cpu.flag]))
    for a, b in zip(*outs):
        if a is not None:
            assert torch.equal(a, b)
    snap, work = outs[0][1], outs[0][8]
    gathered = work[1::2].tolist()
    assert all(int(snap[e - 32]) == s for s, e in zip(gathered, work[2::2].tolist()))
    assert SLOT_CPU not in [int(snap[e - 32]) for e in work[2::2].tolist()]


def test_the_gather_copy_moves_each_listed_row_once():
    rows = torch.arange(6 * 40, dtype=torch.int32).view(6, 40).view(torch.uint8)
    for fn, kw in ((gather_copy, {"chunk_words": 16, "copy_block": 8, "programs": 3}), (gather_copy_ref, {})):
        pool = torch.zeros(4, 160, dtype=torch.uint8)
        work = torch.tensor([2, 3, 5, 0, 1, -9, -9], dtype=torch.int64)
        fn(work, rows, pool, **kw)
        assert torch.equal(pool[3], rows[5]) and torch.equal(pool[0], rows[1])
        assert not pool[1].any() and not pool[2].any()


def test_the_benchmarks_wide_gather_copies_whole_and_partial_chunks_exactly():
    # benchmarks/gather_rate.py's unmasked int64 variant (a candidate for the gather): rows of 8000 bytes
    # are 1000 words, three chunks of 256 and a partial one, copied by more programs than chunks
    from benchmarks.gather_rate import wide_copy
    rows = torch.randint(0, 255, (10, 8000), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    pool = torch.zeros(3, 8000, dtype=torch.uint8)
    work = torch.tensor([3, 0, 3, 1, 7, 2, 1], dtype=torch.int64)
    wide_copy(work, rows, pool, chunk=256, block=64, programs=17, warps=4)
    assert torch.equal(pool, rows[[3, 7, 1]])


def test_a_gather_list_of_one_entry_per_expert_holds_any_layer():
    # Four tokens, k = 2, four experts: more pairs (8) than experts. A layer gathers at most one
    # entry per expert, so a list of 1 + 2E holds it.
    table = torch.tensor([-1, -1, 11, -1], dtype=torch.int32)
    ids = torch.tensor([0, 1, 0, 1, 3, 0, 2, 3], dtype=torch.int32)
    for fn in (publish_direct, publish_direct_ref):
        g = GatherArgs(torch.tensor([3, 40, 41, 42, 0], dtype=torch.int32), torch.full((1 + 2 * 4,), -7, dtype=torch.int64), 0)
        snap = torch.full_like(table, 7)
        fn(table, snap, ids.clone(), None, torch.full((24,), -2, dtype=torch.int64), torch.full_like(table, 5),
           torch.tensor([0], dtype=torch.int32), torch.tensor([0, 0], dtype=torch.int32),
           pad=torch.zeros(4, dtype=torch.bool), gather=g)
        assert g.work[:7].tolist() == [3, 40, 0, 41, 1, 42, 3], fn.__name__
        assert snap.tolist() == [40, 41, 11, 42]


def test_with_the_gather_the_host_cpu_takes_the_experts_fewest_tokens_use():
    # Every missing expert crosses the bus once when shared ones are gathered, so the host CPU's
    # share goes to those fewest tokens use (less work for it): of 3 (three uses), 6 (one) and 0
    # (one), a share of 2 takes 6 and 0; 3 is gathered into the gather slot.
    table = torch.tensor([-1, 11, -1, -1, 14, -1, -1, -1], dtype=torch.int32)
    ids = torch.tensor([6, 3, 1, 3, 0, 3], dtype=torch.int32)
    for fn in (publish_direct, publish_direct_ref):
        cpu = _cpu_args(3, 16, 2, 2 / 3, torch.Generator().manual_seed(0))
        g = _gather_args([40], ids.numel())
        snap = torch.full_like(table, 7)
        region = torch.full((18,), -2, dtype=torch.int64)
        fn(table, snap, ids.clone(), None, region, torch.full_like(table, 5), torch.tensor([0], dtype=torch.int32),
           torch.tensor([0, 0], dtype=torch.int32), pad=torch.zeros(3, dtype=torch.bool), cpu=cpu, gather=g)
        assert region[6:12].tolist() == [SLOT_CPU, -1, 11, -1, SLOT_CPU, -1], fn.__name__
        assert snap.tolist() == [SLOT_CPU, 11, -1, 40, 14, -1, SLOT_CPU, -1]
        assert g.work[:3].tolist() == [1, 40, 3] and cpu.flag.item() == 1
