"""On a CUDA GPU: the one-launch expert prediction (``kernels/predict.py``) compiled, at the shape of
Qwen3-30B-A3B's routers. Skipped without a GPU (the interpreter cases are in
``tests/kernels/test_predict.py``); the GPU benchmark run executes this file."""
from __future__ import annotations

import pytest
import torch

from kernels.predict import PredictWorkspace, predict_topk, predict_topk_ref

@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("T", [1, 8, 16])
def test_on_the_gpu_it_picks_the_top_k_of_the_bf16_logits(T):
    # Qwen3-30B-A3B's router shape. The kernel sums in another order than the reference, so an id may
    # differ only where two logits are closer than the rounding of that sum.
    g = torch.Generator(device="cuda").manual_seed(T)
    routers = (torch.randn(48, 128, 2048, device="cuda", generator=g) * 0.02).bfloat16()
    hidden = torch.randn(T, 2048, device="cuda", generator=g).bfloat16()
    ws = PredictWorkspace(8, 128, torch.device("cuda"))
    ids = predict_topk(hidden, routers, 5, 2, 8, ws)
    logits = torch.einsum("td,ped->pte", hidden.float(), routers[5:7].float())      # [P, T, E]
    kth = logits.topk(8, dim=-1).values[..., -1:]                                     # [P, T, 1]
    picked = logits.gather(-1, ids)
    assert (picked >= kth - 1e-3).all()
    assert all(len(set(r)) == 8 for r in ids.reshape(-1, 8).tolist())
    exact = (ids == predict_topk_ref(hidden, routers, 5, 2, 8)).float().mean()
    assert exact > 0.99 and (ws.counts == 0).all()
