"""Router kernel against its reference: scoring, top-k, renormalisation, ties, counts; the tally."""
import pytest
import torch

triton = pytest.importorskip("triton")
from kernels.router import route, route_ref, tally, tally_ref  # noqa: E402


@pytest.mark.parametrize("scoring", ["softmax", "sigmoid"])
@pytest.mark.parametrize("renormalize", [False, True])
@pytest.mark.parametrize("tokens, experts, top_k", [
    (1, 8, 2),      # one token (decode)
    (19, 12, 3),    # tokens not a multiple of the token block; experts not a power of two
    (5, 6, 1),      # top-k = 1 (Switch-style)
    (4, 6, 6),      # top-k = E: every expert chosen, order must still match
])
def test_route_matches_reference(scoring, renormalize, tokens, experts, top_k):
    logits = torch.randn(tokens, experts, generator=torch.Generator().manual_seed(tokens))
    c_kernel = torch.zeros(experts, dtype=torch.int64)
    c_ref = torch.zeros(experts, dtype=torch.int64)
    w, ids = route(logits, top_k, scoring, renormalize, c_kernel)
    w_ref, ids_ref = route_ref(logits, top_k, scoring, renormalize, c_ref)
    assert ids.dtype == torch.int32 and w.dtype == torch.float32
    assert torch.equal(ids, ids_ref)
    torch.testing.assert_close(w, w_ref, atol=1e-6, rtol=1e-5)
    assert torch.equal(c_kernel, c_ref) and int(c_kernel.sum()) == tokens * top_k
    if renormalize:
        torch.testing.assert_close(w.sum(1), torch.ones(tokens))


@pytest.mark.parametrize("tokens, experts, top_k", [(1, 8, 2), (19, 12, 3)])
def test_a_choice_bias_picks_the_experts_and_the_weights_stay_the_scores(tokens, experts, top_k):
    # GLM-4.5: sigmoid scores plus a per-expert bias choose the experts; the weights are the plain
    # scores, renormalised, times routed_scaling_factor (transformers' Glm4MoeTopkRouter in one line each).
    g = torch.Generator().manual_seed(tokens)
    logits = torch.randn(tokens, experts, generator=g)
    bias = 2.0 * torch.randn(experts, generator=g)                    # large enough to change the choice
    w, ids = route(logits, top_k, "sigmoid", True, bias=bias, scale=2.5)
    w_ref, ids_ref = route_ref(logits, top_k, "sigmoid", True, bias=bias, scale=2.5)
    scores = torch.sigmoid(logits)
    want_ids = torch.topk(scores + bias, top_k).indices
    want_w = scores.gather(1, want_ids)
    want_w = 2.5 * want_w / want_w.sum(-1, keepdim=True)
    for got_w, got_ids in ((w, ids), (w_ref, ids_ref)):
        assert torch.equal(got_ids.long(), want_ids)
        torch.testing.assert_close(got_w, want_w, atol=1e-6, rtol=1e-5)
    assert not torch.equal(ids.long(), torch.topk(scores, top_k).indices)   # the bias mattered


def _transformers_groups(logits, bias, groups, keep, top_k, sigmoid):
    """DeepSeek's group-limited choice as transformers writes it (V2's group_limited_greedy with group
    maxima of softmax scores; V3's noaux_tc with the two best biased sigmoid scores per group)."""
    scores = torch.sigmoid(logits) if sigmoid else torch.softmax(logits, -1)
    choice = scores + bias if bias is not None else scores
    t, e = logits.shape
    g = choice.view(t, groups, e // groups)
    group_scores = g.topk(2, dim=-1)[0].sum(-1) if sigmoid else g.max(-1).values
    idx = torch.topk(group_scores, k=keep, dim=-1, sorted=False)[1]
    mask = torch.zeros_like(group_scores).scatter_(1, idx, 1).unsqueeze(-1).expand(-1, groups, e // groups)
    ids = torch.topk(choice.masked_fill(~mask.reshape(t, e).bool(), float("-inf")), k=top_k, dim=-1)[1]
    return ids, scores.gather(1, ids)


@pytest.mark.parametrize("sigmoid", [False, True])
@pytest.mark.parametrize("tokens, experts, groups, keep, top_k", [
    (1, 16, 4, 2, 3),     # one token (decode)
    (19, 24, 8, 3, 4),    # tokens not a multiple of the token block; experts and groups not powers of two
    (5, 12, 6, 1, 2),     # one group kept: every choice from it
])
def test_expert_groups_limit_the_choice_to_the_best_groups(sigmoid, tokens, experts, groups, keep, top_k):
    # DeepSeek-V2 / V3: a token's experts come from its best groups only; the weights are the plain scores
    g = torch.Generator().manual_seed(tokens + experts)
    logits = 2.0 * torch.randn(tokens, experts, generator=g)
    bias = torch.randn(experts, generator=g) if sigmoid else None
    scoring = "sigmoid" if sigmoid else "softmax"
    want_ids, want_w = _transformers_groups(logits, bias, groups, keep, top_k, sigmoid)
    order = torch.argsort(want_ids, -1)                                # transformers' order is unspecified
    for fn in (route, route_ref):
        w, ids = fn(logits, top_k, scoring, False, bias=bias, scale=1.5, groups=groups, keep_groups=keep)
        mine = torch.argsort(ids.long(), -1)
        assert torch.equal(ids.long().gather(1, mine), want_ids.gather(1, order))
        torch.testing.assert_close(w.gather(1, mine), 1.5 * want_w.gather(1, order), atol=1e-6, rtol=1e-5)
    many = 2.0 * torch.randn(64, experts, generator=g)                 # the groups matter for some of 64 tokens
    free_ids = route_ref(many, top_k, scoring, False, bias=bias)[1]
    assert not torch.equal(free_ids, route_ref(many, top_k, scoring, False, bias=bias, groups=groups,
                                               keep_groups=keep)[1])


def test_expert_groups_that_leave_too_few_experts_are_refused():
    logits = torch.randn(2, 8)
    for fn in (route, route_ref):
        with pytest.raises(ValueError, match="expert groups"):
            fn(logits, 3, "softmax", groups=4, keep_groups=1)          # 2 experts left for 3
        with pytest.raises(ValueError, match="expert groups"):
            fn(logits, 2, "sigmoid", groups=8, keep_groups=4)          # groups of one: no second best


def test_route_matches_torch_topk_on_distinct_scores():
    # The documented contract: on distinct scores the choice and order are torch.topk's.
    logits = torch.randn(7, 16, generator=torch.Generator().manual_seed(3))
    w, ids = route(logits, 4)
    w_t, ids_t = torch.topk(torch.softmax(logits, -1), 4)
    assert torch.equal(ids, ids_t.to(torch.int32))
    torch.testing.assert_close(w, w_t)


def test_route_ties_pick_lower_expert_ids():
    # Exact ties (e.g. zero logits from a padded batch row) must give one answer on every device.
    logits = torch.zeros(2, 6)
    logits[1, 2] = logits[1, 4] = 1.0
    _, ids = route(logits, 3)
    _, ids_ref = route_ref(logits, 3)
    assert ids.tolist() == [[0, 1, 2], [2, 4, 0]] == ids_ref.tolist()


def test_route_counts_accumulate_and_half_logits():
    # Counts are per-layer running totals for the stats panel: a second call adds to them; the
    # router reads half-precision logits and still scores in float32.
    logits = torch.randn(9, 8, generator=torch.Generator().manual_seed(1)).to(torch.float16)
    counts = torch.zeros(8, dtype=torch.int64)
    route(logits, 2, counts=counts)
    route(logits, 2, counts=counts)
    _, ids = route_ref(logits, 2)
    assert torch.equal(counts, 2 * torch.bincount(ids.flatten().long(), minlength=8))


def test_route_rejects_bad_arguments():
    # Mistakes in the caller must name the argument, not fail inside the kernel.
    with pytest.raises(ValueError, match="top_k"):
        route(torch.randn(2, 4), 5)
    with pytest.raises(ValueError, match="scoring"):
        route(torch.randn(2, 4), 2, scoring="relu")
    with pytest.raises(ValueError, match="counts"):
        route(torch.randn(2, 4), 2, counts=torch.zeros(4, dtype=torch.int32))


@pytest.mark.parametrize("tokens, experts, top_k", [(1, 8, 2), (8, 128, 8), (300, 12, 3)])
def test_tally_counts_choices_and_distinct_experts(tokens, experts, top_k):
    # One layer call adds each expert's choices to its row and the distinct experts to the hits; a
    # second call accumulates. 300 tokens x 3 span several id blocks; 12 experts pad the columns.
    g = torch.Generator().manual_seed(tokens)
    ids = torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(tokens)]).to(torch.int32)
    acts, hits = torch.full((experts,), 5, dtype=torch.int64), torch.tensor([7])
    acts_ref, hits_ref = acts.clone(), hits.clone()
    for _ in range(2):
        tally(ids, acts, hits)
        tally_ref(ids, acts_ref, hits_ref)
    expected = 5 + 2 * torch.bincount(ids.flatten().long(), minlength=experts)
    distinct = len(set(ids.flatten().tolist()))
    assert torch.equal(acts, expected) and torch.equal(acts_ref, expected)
    assert hits.item() == hits_ref.item() == 7 + 2 * distinct


@pytest.mark.parametrize("tokens", [1, 5, 16, 40])
def test_the_router_counts_the_call_into_a_tally(tokens):
    # route(tally_into=...) leaves acts and hits as tally() does after it: in the router's own launch
    # where one program holds every token (decode steps), by tally's launch after it otherwise (40).
    g = torch.Generator().manual_seed(tokens)
    logits = torch.randn(tokens, 12, generator=g)
    acts, hits = torch.full((12,), 3, dtype=torch.int64), torch.tensor([4])
    acts_ref, hits_ref = acts.clone(), hits.clone()
    w, ids = route(logits, 3, "softmax", True, tally_into=(acts, hits))
    w_ref, ids_ref = route_ref(logits, 3, "softmax", True, tally_into=(acts_ref, hits_ref))
    assert torch.equal(ids, ids_ref) and torch.allclose(w, w_ref)
    assert torch.equal(acts, acts_ref) and torch.equal(hits, hits_ref)
    assert acts.sum().item() == 36 + 3 * tokens and hits.item() == 4 + len(set(ids.flatten().tolist()))
    with pytest.raises(ValueError, match="int64 acts"):
        route(logits, 3, tally_into=(acts.int(), hits))


@pytest.mark.parametrize("tokens", [1, 5, 16, 40])
def test_a_replays_padding_rows_are_left_out_of_the_tally(tokens):
    # A replayed decode step pads its batch up to the recording's size, and a warm-up pads every row:
    # tally_into's third item marks those rows, which route (in its own launch, or tally's after it),
    # route_gemv and tally leave out of acts and hits; the ids are routed all the same.
    from kernels.router import route_gemv
    g = torch.Generator().manual_seed(tokens)
    x = torch.randn(tokens, 32, generator=g)
    router = torch.randn(12, 32, generator=g) / 4
    logits = x @ router.t()
    for pad in (torch.arange(tokens) >= (tokens + 1) // 2, torch.ones(tokens, dtype=torch.bool)):
        real = int((~pad).sum())
        _, ids_ref = route_ref(logits, 3, "softmax", True)
        expected = torch.bincount(ids_ref[:real].flatten().long(), minlength=12)
        runs = [lambda t: route(logits, 3, "softmax", True, tally_into=t),
                lambda t: route_ref(logits, 3, "softmax", True, tally_into=t),
                lambda t: tally(ids_ref, *t) or (None, ids_ref),
                lambda t: tally_ref(ids_ref, *t) or (None, ids_ref)]
        if tokens <= 16:
            runs.append(lambda t: route_gemv(x, router, 3, "softmax", True, tally_into=t))
        for run in runs:
            acts, hits = torch.zeros(12, dtype=torch.int64), torch.zeros(1, dtype=torch.int64)
            _, ids = run((acts, hits, pad))
            assert torch.equal(ids.long(), ids_ref.long())
            assert torch.equal(acts, expected) and hits.item() == int((expected > 0).sum())
    with pytest.raises(ValueError, match="pad"):
        route(logits, 3, tally_into=(acts, hits, torch.zeros(tokens + 1, dtype=torch.bool)))
    with pytest.raises(ValueError, match="pad"):
        tally(ids_ref, acts, hits, torch.zeros(tokens, dtype=torch.int32))
    with pytest.raises(ValueError, match="pad"):                  # rows of ids [T, k] only
        tally_ref(ids_ref.reshape(tokens, 1, 3), acts, hits, torch.zeros(tokens, dtype=torch.bool))
    with pytest.raises(ValueError, match="tally_into"):
        route(logits, 3, tally_into=(acts,))


def test_tally_rejects_bad_arguments():
    with pytest.raises(ValueError, match="int64 acts"):
        tally(torch.zeros(2, 2, dtype=torch.int32), torch.zeros(4, dtype=torch.int32), torch.zeros(1, dtype=torch.int64))
    with pytest.raises(ValueError, match="hits"):
        tally_ref(torch.zeros(2, 2, dtype=torch.int32), torch.zeros(4, dtype=torch.int64), torch.zeros(2, dtype=torch.int64))


@pytest.mark.parametrize("tokens, experts, top_k, dim", [(1, 12, 3, 96), (5, 128, 8, 96), (16, 40, 4, 96),
                                                         (2, 24, 4, 600), (3, 256, 8, 2880)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_the_fused_router_gemv_routes_as_the_gemm_and_the_router_do(tokens, experts, top_k, dim, dtype):
    # route_gemv: programs of 16 experts and a share of the columns make partial logits, the last to
    # finish adds them and routes (600 columns: three splits, the last one short; 2880 over 256
    # experts: four splits of three blocks each); the same ids and weights as the separate GEMM
    # (logits in x's dtype, the router bias added in it) and route, the tally counted as tally()
    # does, and its arrival count left at zero.
    from kernels.arrivals import arrival_counts
    from kernels.router import route_gemv
    g = torch.Generator().manual_seed(tokens * 100 + experts)
    x = torch.randn(tokens, dim, generator=g).to(dtype)
    router = (torch.randn(experts, dim, generator=g) / (dim / 24) ** 0.5).to(dtype)
    rbias = torch.randn(experts, generator=g).to(dtype)
    logits = x @ router.t() + rbias                                       # what the unfused path routes
    acts, hits = torch.zeros(experts, dtype=torch.int64), torch.zeros(1, dtype=torch.int64)
    w, ids = route_gemv(x, router, top_k, "softmax", True, router_bias=rbias, tally_into=(acts, hits))
    w_ref, ids_ref = route_ref(logits.float(), top_k, "softmax", True)
    assert torch.equal(ids, ids_ref) and torch.allclose(w, w_ref, atol=1e-5)
    assert torch.equal(acts, torch.bincount(ids.flatten().long(), minlength=experts))
    assert hits.item() == len(set(ids.flatten().tolist()))
    assert not arrival_counts(x.device, 1, "router").any()


def test_the_fused_router_gemv_scores_a_float32_router_with_groups_and_a_choice_bias():
    # GLM/DeepSeek-V3 style: a float32 router over bf16-free float32 activations, sigmoid scores, a
    # choice bias, the best 2 of 4 groups, the weights scaled.
    from kernels.router import route_gemv
    g = torch.Generator().manual_seed(7)
    x = torch.randn(3, 64, generator=g)
    router = torch.randn(32, 64, generator=g) / 8
    bias = torch.randn(32, generator=g)
    kw = dict(bias=bias, scale=2.5, groups=4, keep_groups=2)
    w, ids = route_gemv(x, router, 4, "sigmoid", True, **kw)
    w_ref, ids_ref = route_ref(x @ router.t(), 4, "sigmoid", True, **kw)
    assert torch.equal(ids, ids_ref) and torch.allclose(w, w_ref, atol=1e-5)


def test_the_fused_router_gemv_takes_decode_steps_only():
    from kernels.router import route_gemv, route_gemv_fits
    x, router = torch.randn(17, 32), torch.randn(8, 32)
    assert not route_gemv_fits(x, router) and route_gemv_fits(x[:16], router)
    assert not route_gemv_fits(x[:4].half(), router.double())
    with pytest.raises(ValueError, match="up to 16 tokens"):
        route_gemv(x, router, 2)
