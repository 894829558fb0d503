"""The codes a slot-table entry or its per-layer snapshot may hold besides a slot (kernels/moe_decode_common.py).

The Triton kernels spell them as literals, so each kernel is checked here, in the interpreter, to act
on its own code and on no other: an expert whose GPU-side prefetch is under way (``CLAIMED``) is
missing to every reader, read from host memory like -1; only ``SLOT_CPU`` makes the decode kernels
skip an expert's pairs, the publish kernel hand inputs to the host, and the join wait for the host.
When the two codes were equal, a layer that met a claim still in flight in a replayed step skipped
that expert (or waited for a host that had no share to compute)."""
import pytest
import torch

pytest.importorskip("triton")
from kernels._triton import next_pow2  # noqa: E402
from kernels.cpu_share import cpu_share_join, cpu_share_join_ref  # noqa: E402
from kernels.expert_claim import _claim_kernel  # noqa: E402
from kernels.fused_moe import fused_moe, fused_moe_ref  # noqa: E402
from kernels.moe_decode_common import CLAIMED, SLOT_CPU  # noqa: E402
from kernels.moe_weights import HostExperts  # noqa: E402
from kernels.publish_ids import CpuShareArgs, publish_direct, publish_direct_ref  # noqa: E402
from engine.experts.device_prefetch import DevicePrefetcher  # noqa: E402
from tests.kernels.helpers import make_routing, tolerance  # noqa: E402
from tests.kernels.test_fused_moe import DECODE, _store_and_pool  # noqa: E402


def test_the_codes_are_negative_and_distinct():
    assert len({-1, SLOT_CPU, CLAIMED}) == 3 and max(SLOT_CPU, CLAIMED) < 0


def test_the_claim_kernel_marks_what_it_claims_with_claimed():
    L, E = 3, 8
    dp = DevicePrefetcher(L, E, max_claims=4, device=torch.device("cpu"))
    dp.begin([5, 6], quota=2)
    table = torch.full((L, E), -1, dtype=torch.int32)
    pred = torch.tensor([[3, 6]], dtype=torch.int64)
    b = dp.buffers
    _claim_kernel[(1,)](pred, table, b.free, b.meta, b.work, b.done, b.regions[2], 2, 1, E, 2, b.max_claims,
                        K=2, BLOCK_N=next_pow2(2))
    assert table[2].tolist() == [-1, -1, -1, CLAIMED, -1, -1, CLAIMED, -1]


@pytest.mark.parametrize("fmt, dtype", [("fp32", torch.float32), ("int4", torch.float16)])
def test_a_claimed_expert_is_read_from_host_memory_like_a_missing_one(fmt, dtype):
    experts, hidden, ffn = 6, 64, 32
    layout, rows, buf, slots = _store_and_pool(fmt, hidden, ffn, experts, 2, 32, resident=[1, 4])
    host = HostExperts(layout.views(rows), row_base=experts)
    ids, w = make_routing(3, experts, 3)
    missing = sorted({int(e) for e in ids.flatten() if slots[int(e)] < 0})
    claimed = slots.clone()
    claimed[missing[0]] = CLAIMED
    x = torch.randn(3, hidden, generator=torch.Generator().manual_seed(5)).to(dtype)
    want = fused_moe_ref(x, ids, w, slots, layout.views(buf), layout, host)
    torch.testing.assert_close(fused_moe_ref(x, ids, w, claimed, layout.views(buf), layout, host), want,
                               rtol=0, atol=0)
    out = fused_moe(x, ids, w, claimed, layout.views(buf), layout, DECODE, host=host)
    torch.testing.assert_close(out, want, **tolerance(fmt, dtype))


@pytest.mark.parametrize("fn", [publish_direct, publish_direct_ref])
def test_a_claimed_expert_is_missing_to_the_publish_kernel_and_no_share_of_the_host(fn):
    # Expert 3's copy is under way (CLAIMED), 1 is resident. With no share for the host nothing is
    # marked SLOT_CPU and the host's flag stays down; 3 takes a fill slot like any missing expert.
    table = torch.tensor([-1, 11, -1, CLAIMED, -1, -1], dtype=torch.int32)
    ids = torch.tensor([3, 1], dtype=torch.int32)
    cpu = CpuShareArgs(torch.randn(1, 8), torch.rand(2), torch.zeros(8 + 2), torch.zeros(1, dtype=torch.int32),
                       torch.tensor([0.0]))
    snap, fill = torch.full_like(table, 7), torch.full_like(table, 5)
    region = torch.full((6,), -2, dtype=torch.int64)
    fn(table, snap, ids.clone(), None, region, fill, torch.tensor([20], dtype=torch.int32),
       torch.tensor([0, 1], dtype=torch.int32), cpu=cpu)
    assert snap.tolist() == table.tolist() and SLOT_CPU not in region.tolist()
    assert region[2:4].tolist() == [CLAIMED, 11] and region[4:].tolist() == [20, -1]
    assert cpu.flag.item() == 0


@pytest.mark.parametrize("join", [cpu_share_join, cpu_share_join_ref])
def test_the_join_waits_for_the_host_only_for_slot_cpu(join):
    out = torch.ones(1, 8)
    ids = torch.tensor([[3, 1]])
    snap = torch.tensor([-1, 11, -1, CLAIMED], dtype=torch.int32)
    flag, err = torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    got = join(out.clone(), ids, snap, flag, torch.full((8,), 5.0), err, 0.05)
    assert torch.equal(got, out) and err.item() == 0        # no wait, nothing added, no error
    snap[3] = SLOT_CPU
    got = join(out.clone(), ids, snap, flag, torch.full((8,), 5.0), err, 0.05)
    assert err.item() == 1                                   # it waited for the host, which never came
