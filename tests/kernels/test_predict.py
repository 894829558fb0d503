"""The one-launch expert prediction against its plain-torch twin (Triton interpreter on the CPU)."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")
from kernels.predict import PredictWorkspace, predict_topk, predict_topk_ref  # noqa: E402


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("T,E,D,k,first,count", [
    (1, 32, 256, 4, 1, 2),        # batch 1, two predicted layers
    (5, 60, 192, 8, 3, 1),        # E not a power of two, D not a multiple of the D chunk
    (16, 128, 128, 8, 0, 3),      # a full tile of tokens
])
def test_ids_equal_the_reference(dtype, T, E, D, k, first, count):
    g = torch.Generator().manual_seed(T * 100 + E)
    routers = (torch.randn(first + count + 1, E, D, generator=g) / D ** 0.5).to(dtype)
    ws = PredictWorkspace(4, E, torch.device("cpu"))
    for step in range(2):                            # the per-layer counters are ready again after a launch
        hidden = torch.randn(T, D, generator=g).to(dtype)
        ids = predict_topk(hidden, routers, first, count, k, ws)
        assert ids.dtype == torch.int64 and ids.shape == (count, T, k)
        assert torch.equal(ids, predict_topk_ref(hidden, routers, first, count, k)), step
        assert (ws.counts == 0).all()


def test_ties_go_to_the_lower_id_and_oversized_calls_are_refused():
    routers = torch.zeros(2, 16, 64)
    routers[1, [3, 9, 12]] = 1.0                     # three equal logits, the rest zero
    ws = PredictWorkspace(2, 16, torch.device("cpu"))
    ids = predict_topk(torch.ones(2, 64), routers, 1, 1, 5, ws)
    assert ids[0].tolist() == [[3, 9, 12, 0, 1]] * 2
    with pytest.raises(ValueError, match="at most 16 tokens"):
        predict_topk(torch.ones(17, 64), routers, 0, 1, 2, ws)

