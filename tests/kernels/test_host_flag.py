"""kernels/host_flag.py: a recorded layer waits for the copies the host queues, boundedly."""
from __future__ import annotations

import threading

import pytest
import torch

pytest.importorskip("triton")
from kernels.host_flag import set_flag, set_flag_ref, wait_flag, wait_flag_ref  # noqa: E402

CPU = torch.device("cpu")


@pytest.mark.parametrize("kernel", [True, False])
def test_a_wait_ends_when_another_thread_sets_the_flag_and_skips_a_layer_with_nothing_to_copy(kernel):
    wait, setter = (wait_flag, set_flag) if kernel else (wait_flag_ref, set_flag_ref)
    flag, err = torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    later = threading.Timer(0.05, lambda: setter(flag, CPU))
    later.start()
    wait(flag, err, torch.tensor([3]), 30.0)
    assert int(flag) == 1 and int(err) == 0                # returned with the flag set, not past the limit
    later.join()
    flag.zero_()
    wait(flag, err, torch.tensor([0]), 30.0)          # nothing to copy: no wait at all
    assert int(flag) == 0 and int(err) == 0


@pytest.mark.parametrize("kernel", [True, False])
def test_a_wait_gives_up_past_its_limit_and_the_steps_later_waits_pass(kernel):
    wait = wait_flag if kernel else wait_flag_ref
    flag, err = torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    wait(flag, err, torch.tensor([1]), 0.001)
    assert int(err) == 1
    wait(flag, err, torch.tensor([1]), 600.0)         # err set: passes at once (else the suite stalls here)
    assert int(flag) == 0 and int(err) == 1
