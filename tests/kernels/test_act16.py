"""16-bit activation planes (kernels/act16.py): the prep kernel against its torch version."""
import pytest
import torch

pytest.importorskip("triton")
from kernels.act16 import act16, act16_ref  # noqa: E402


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("rows, k, group", [
    (1, 64, 8),      # one row, the smallest group (one word)
    (3, 96, 32),     # K not a power of two: the kernel's block has a masked group past K
    (2, 256, 128),   # the group size of the shipped int4 checkpoints
])
def test_act16_matches_its_reference_bit_for_bit(dtype, rows, k, group):
    x = (torch.randn(rows, k + 6, generator=torch.Generator().manual_seed(k)) * 5).to(dtype)[:, 3:3 + k]
    x[0, :group] = 0                                    # a group of zeros: scale 0, q 0, no division by zero
    got, want = act16(x, group), act16_ref(x, group)
    for a, b in zip(got[:3], want[:3]):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    assert not got.q.view(torch.int16).view(rows, 4, k // 8, 2)[0, :, :group // 8].any()
    assert float(got.scales[0, 0]) == 0.0


def test_act16_ref_decodes_to_within_half_a_step():
    # The layout itself: plane p holds elements (0, 2), (4, 6), (1, 3), (5, 7) of each word.
    x = torch.randn(2, 64, generator=torch.Generator().manual_seed(1))
    a = act16_ref(x, 32)
    q = a.q.view(torch.int16).view(2, 4, 8, 2).float()
    back = torch.zeros(2, 8, 8)
    for p, cols in enumerate(([0, 2], [4, 6], [1, 3], [5, 7])):
        back[:, :, cols] = q[:, p]
    step = a.scales.repeat_interleave(32, 1)
    assert ((back.view(2, 64) * step - x).abs() <= step / 2 + 1e-7).all()
    assert torch.equal(a.sums, back.view(2, 2, 32).sum(-1).int())


@pytest.mark.parametrize("k, group", [(96, 64), (64, 12)])
def test_act16_rejects_groups_it_cannot_lay_out(k, group):
    with pytest.raises(ValueError, match="power-of-two group"):
        act16_ref(torch.zeros(1, k), group)
