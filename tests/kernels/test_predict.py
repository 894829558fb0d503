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



@pytest.mark.parametrize("T", [1, 6])
def test_a_router_bias_predicts_what_the_biased_router_picks(T):
    # gpt-oss routes W (norm_w * h / rms(h)) + b: with norm_w folded into the router rows, the
    # prediction must add b scaled by each token's RMS to give the router's own top-k
    from engine.experts.prefetch import predict_experts
    from engine.models.layers import rms_norm
    from engine.models.moe_transformer import route_ref
    g = torch.Generator().manual_seed(T)
    L, E, D, k = 3, 32, 128, 4
    router = torch.randn(L, E, D, generator=g) / D ** 0.5
    norm_w = 0.5 + torch.rand(D, generator=g)
    bias = torch.randn(L, E, generator=g)
    hidden = torch.randn(T, D, generator=g) * 3.0                   # an RMS far from 1: the scale matters
    truth = [torch.sort(route_ref(rms_norm(hidden, norm_w, 1e-5) @ router[l].t() + bias[l], k, True)[1],
                        dim=-1).values for l in range(L)]
    folded = (router * norm_w).contiguous()
    ws = PredictWorkspace(4, E, torch.device("cpu"))
    got = predict_topk(hidden, folded, 0, L, k, ws, bias, 1e-5)
    assert torch.equal(got, predict_topk_ref(hidden, folded, 0, L, k, bias, 1e-5))
    by_matmul = predict_experts(hidden, folded, 0, L, lambda x: route_ref(x, k, True), bias, 1e-5)
    for l in range(L):
        assert torch.equal(torch.sort(got[l], -1).values, truth[l])
        assert torch.equal(torch.sort(by_matmul[l], -1).values, truth[l])
    unbiased = predict_topk(hidden, folded, 0, L, k, ws)
    assert not all(torch.equal(torch.sort(unbiased[l], -1).values, truth[l]) for l in range(L))


@pytest.mark.parametrize("T", [1, 6])
def test_a_choice_bias_on_sigmoid_scores_predicts_what_the_router_picks(T):
    # GLM chooses by sigmoid(W norm(h)) + c: the logits must be divided by the token's RMS before the
    # sigmoid (it is not scale-free), then the choice bias added, in the kernel and on the CPU path
    from engine.experts.prefetch import predict_scored
    from engine.models.layers import rms_norm
    from kernels.router import route_ref
    g = torch.Generator().manual_seed(T)
    L, E, D, k = 3, 32, 128, 4
    router = torch.randn(L, E, D, generator=g) / D ** 0.5
    norm_w = 0.5 + torch.rand(D, generator=g)
    choice = 0.3 * torch.randn(L, E, generator=g)
    hidden = torch.randn(T, D, generator=g) * 3.0                   # an RMS far from 1: the scale matters
    truth = [torch.sort(route_ref(rms_norm(hidden, norm_w, 1e-5) @ router[l].t(), k, "sigmoid", True,
                                  bias=choice[l])[1].long(), dim=-1).values for l in range(L)]
    folded = (router * norm_w).contiguous()
    ws = PredictWorkspace(4, E, torch.device("cpu"))
    got = predict_topk(hidden, folded, 0, L, k, ws, eps=1e-5, score_bias=choice)
    assert torch.equal(got, predict_topk_ref(hidden, folded, 0, L, k, eps=1e-5, score_bias=choice))
    by_matmul = predict_scored(hidden, folded, 0, L, k, choice, 1e-5)
    for l in range(L):
        assert torch.equal(torch.sort(got[l], -1).values, truth[l])
        assert torch.equal(torch.sort(by_matmul[l], -1).values, truth[l])
    plain = predict_topk(hidden, folded, 0, L, k, ws)
    assert not all(torch.equal(torch.sort(plain[l], -1).values, truth[l]) for l in range(L))
