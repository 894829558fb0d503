"""The kernel that takes back the host CPU's share of a MoE layer in a replayed decode step
(``kernels.cpu_share.cpu_share_join``), against its reference, in the interpreter."""
import threading
import time

import pytest
import torch

pytest.importorskip("triton")
from kernels.cpu_share import cpu_share_join, cpu_share_join_ref  # noqa: E402
from kernels.publish_ids import SLOT_CPU  # noqa: E402


def _case(marked: bool, t=2, d=40, k=2, dtype=torch.float16):
    g = torch.Generator().manual_seed(2)
    snap = torch.tensor([3, -1, 5, SLOT_CPU if marked else -1], dtype=torch.int32)
    ids = torch.tensor([[0, 3], [2, 1]][:t], dtype=torch.int32)
    out = torch.randn(t, d, generator=g).to(dtype)
    return out, ids, snap, torch.randn(t * d, generator=g)


@pytest.mark.parametrize("fn", [cpu_share_join, cpu_share_join_ref])
def test_adds_the_hosts_sum_once_it_is_flagged(fn):
    out, ids, snap, cpu = _case(True)
    want = (out.float() + cpu.view(out.shape)).to(out.dtype)
    err = torch.zeros(1, dtype=torch.int32)
    fn(out, ids, snap, torch.ones(1, dtype=torch.int32), cpu, err)
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    assert err.item() == 0


@pytest.mark.parametrize("fn", [cpu_share_join, cpu_share_join_ref])
def test_a_layer_without_host_experts_passes_through_without_waiting(fn):
    out, ids, snap, cpu = _case(False)
    before = out.clone()
    err = torch.zeros(1, dtype=torch.int32)
    fn(out, ids, snap, torch.zeros(1, dtype=torch.int32), cpu, err)     # never flagged: must not wait
    assert torch.equal(out, before) and err.item() == 0


@pytest.mark.parametrize("fn", [cpu_share_join, cpu_share_join_ref])
def test_waits_for_the_host_then_adds(fn):
    out, ids, snap, cpu = _case(True)
    want = (out.float() + cpu.view(out.shape)).to(out.dtype)
    flag, err = torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    late = torch.zeros_like(cpu)

    def host():
        time.sleep(0.05)
        late.copy_(cpu)
        flag.fill_(1)

    th = threading.Thread(target=host)
    th.start()
    fn(out, ids, snap, flag, late, err, limit_s=60.0)
    th.join()
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    assert err.item() == 0


@pytest.mark.parametrize("fn", [cpu_share_join, cpu_share_join_ref])
def test_a_host_that_never_answers_sets_the_error_and_changes_nothing(fn):
    out, ids, snap, cpu = _case(True)
    before = out.clone()
    err = torch.zeros(1, dtype=torch.int32)
    fn(out, ids, snap, torch.zeros(1, dtype=torch.int32), cpu, err, limit_s=0.01)
    assert err.item() == 1 and torch.equal(out, before)


@pytest.mark.parametrize("fn", [cpu_share_join, cpu_share_join_ref])
def test_after_one_join_gave_up_the_rest_of_the_step_passes_at_once(fn):
    out, ids, snap, cpu = _case(True)
    before = out.clone()
    err = torch.ones(1, dtype=torch.int32)                              # an earlier layer timed out
    fn(out, ids, snap, torch.zeros(1, dtype=torch.int32), cpu, err, limit_s=3600.0)
    assert torch.equal(out, before) and err.item() == 1
