"""On a CUDA GPU: decode steps replayed from CUDA graphs generate what the eager engine does.

Skipped without a GPU (CI has none); the GPU benchmark run executes this file. With an offloaded
expert pool a step is recorded piecewise (one graph per MoE layer boundary, the host resolving each
layer's experts in between), so these cases cover pool sizes, prefetch depths, batch sizes that pad
up to a graph bucket, and live resizes that must drop the recordings.
"""
from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from test_experts_support import generate_with_resizes
from tiny_models import build_tiny_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

PROMPTS = [[1, 5, 77, 300, 12, 9, 400, 33], [1, 99, 4], [1, 250, 251, 252, 17]]
GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = build_tiny_model(tmp_path_factory.mktemp("qwen3_moe_gpu"), "qwen3_moe")
    with LLM(str(path), device="cuda", dtype="float32", cuda_graphs=False) as llm:
        ref = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
        info = llm.engine.loaded
        keys = info.spec.num_moe_layers * info.spec.num_experts
        nbytes = info.layout.nbytes
    return path, ref, keys, nbytes


def _graphs(llm: LLM):
    return llm.engine.runner.graphs


@pytest.mark.parametrize("frac", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("depth, reads", [(0, "auto"), (2, "copy"), (2, "auto")])
def test_graph_replay_matches_eager(model, frac, depth, reads) -> None:
    # Three prompts pad up to the bucket of 4: padding rows must neither change the real rows nor
    # pull experts over the bus. frac 1.0 records a whole step as one graph; an offloaded pool is
    # recorded piecewise when experts are copied in (reads=copy) and as one graph that publishes every
    # layer when missing experts are read directly (auto, at depth 0 too: shared experts are gathered).
    path, ref, keys, nbytes = model
    with LLM(str(path), device="cuda", dtype="float32", expert_pool_size=int(frac * keys) * nbytes,
             prefetch_depth=depth, expert_reads=reads) as llm:
        assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == ref
        graphs = _graphs(llm)
        assert graphs.replays > 0
        rec = graphs.graphs[4]
        layers = llm.engine.loaded.spec.num_moe_layers
        st = llm.stats().experts
        if frac == 1.0:
            assert not rec.cuts and not rec.direct
        elif reads == "auto":
            assert rec.direct and len(rec.graphs) == 1 and len(rec.cuts) == layers
            assert st.direct_bytes > 0 and st.misses > 0
            assert st.gathered > 0      # three sequences share experts: each copied in once a step
            # with pool slots to spare, misses were written into the pool by the kernels that read them
            assert (st.fills > 0) == (llm.engine.loaded.experts.direct.fills.capacity() > 0)
            # the GPU-side prefetch: each expert it copied is counted used or wasted, and at rest the
            # device slot table holds no claim of a finished step
            prov = llm.engine.loaded.experts
            assert prov.device_prefetcher is not None and bool(rec.claims) == (depth > 0)
            assert st.prefetch_hits + st.prefetch_wasted == prov.counters.device_copy_bytes // nbytes
            torch.cuda.synchronize()
            assert prov.pool.table.flatten().tolist() == prov.pool.books.slot_of
        else:
            assert not rec.direct and len(rec.graphs) == len(rec.cuts) + 1 == layers + 1
            assert st.direct_bytes == 0


def test_replays_launched_ahead_of_the_last_read_back_generate_what_steps_one_at_a_time_do(model) -> None:
    # Every expert resident: decode replays launched before the last step's tokens were read back,
    # their input tokens copied from its draws on the device. Greedy, seeded sampling and logprobs
    # as with overlap off; requests of different lengths shrink the batch (bucket 4 -> 2 -> 1) and a
    # stop token ends one while its next step is launched.
    path, ref, keys, nbytes = model
    stop = ref[1][5]
    params = [SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, logprobs=3),
              SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, stop_token_ids=(stop,)),
              SamplingParams(max_tokens=20, temperature=0.8, seed=5, ignore_eos=True)]
    outs = {}
    for overlap in (True, False):
        with LLM(str(path), device="cuda", dtype="float32", overlap_steps=overlap) as llm:
            got = llm.generate(PROMPTS, params)
            outs[overlap] = [(o.token_ids, o.finish_reason, [round(lp.logprob, 4) for lp in o.logprobs])
                             for o in got]
            assert _graphs(llm).replays > 0 and (llm.engine.steps_ahead > 0) == overlap
            assert llm.stats().kv_blocks_used == 0
    assert outs[True] == outs[False]
    assert outs[True][0][0] == ref[0] and outs[True][1][0] == ref[1][:ref[1].index(stop) + 1]


@pytest.mark.parametrize("frac", [0.0, 0.5])
def test_depth_0_steps_read_directly_and_cross_once_per_missing_expert(model, frac) -> None:
    # At depth 0 a one-token step reads each missing expert once, as a copy would: it is recorded as
    # one graph reading them directly (no host wait per layer). A step of three does too: the experts
    # several of its tokens use are gathered (copied in once each), so every miss crosses once.
    path, ref, keys, nbytes = model
    with LLM(str(path), device="cuda", dtype="float32", expert_pool_size=int(frac * keys) * nbytes,
             prefetch_depth=0) as llm:
        one = llm.generate([PROMPTS[0]], GREEDY)[0].token_ids
        assert one == ref[0]
        graphs = _graphs(llm)
        assert graphs.graphs[1].direct and len(graphs.graphs[1].graphs) == 1
        assert llm.stats().experts.direct_bytes > 0
        assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == ref
        assert graphs.graphs[4].direct and graphs.graphs[4].claims == ()
        assert llm.stats().experts.gathered > 0


@pytest.mark.parametrize("depth", [0, 2])
@pytest.mark.parametrize("cold", ["bus", "auto"])
def test_gathering_every_missing_expert_replays_what_the_eager_engine_generates(model, depth, cold) -> None:
    # gather_min_uses 1: every missing expert of a direct-read step, one-token steps too, is copied in
    # by the gather's kernel before its layer's MoE kernels (which then read only device memory); with
    # the host CPU's share too (auto). The replayed steps generate the eager engine's tokens.
    path, ref, keys, nbytes = model
    with LLM(str(path), device="cuda", dtype="float32", expert_pool_size=(keys // 4) * nbytes,
             prefetch_depth=depth, cold_experts=cold) as llm:
        experts = llm.engine.loaded.experts
        assert experts.set_gather(True, min_uses=1)
        llm.engine.runner.graphs.reset()
        assert llm.generate([PROMPTS[0]], GREEDY)[0].token_ids == ref[0]
        assert _graphs(llm).graphs[1].direct
        assert llm.stats().experts.gathered > 0
        assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == ref


@pytest.mark.parametrize("cold", ["bus", "auto"])
def test_a_live_change_to_depth_0_replays_without_the_claims_of_depth_2(model, cold) -> None:
    # Each recording keeps the layers its GPU-side prefetch claims for. After a live change from
    # depth 2 to depth 0 the one-token steps are recorded again, with no claims, and their replays
    # wait for none (they once waited for depth 2's, which the new recording never writes).
    path, ref, keys, nbytes = model
    with LLM(str(path), device="cuda", dtype="float32", expert_pool_size=(keys // 4) * nbytes,
             prefetch_depth=2, cold_experts=cold) as llm:
        assert llm.generate([PROMPTS[0]], GREEDY)[0].token_ids == ref[0]
        assert _graphs(llm).graphs[1].claims
        llm.reconfigure(prefetch_depth=0)
        assert llm.generate([PROMPTS[0]], GREEDY)[0].token_ids == ref[0]
        rec = _graphs(llm).graphs[1]
        assert rec.direct and rec.claims == ()
        assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == ref


@pytest.mark.parametrize("fmt", ["bf16", "fp8", "int4"])
@pytest.mark.parametrize("tokens", [1, 4])
def test_kernels_read_missing_experts_from_pinned_host_memory(fmt, tokens) -> None:
    # The MoE kernels read slot -1 experts from a page-locked, mapped host store (rows of layer 1)
    # and the rest from the pool: the output equals the all-in-pool computation.
    from kernels.expert_layout import ExpertLayout
    from engine.experts.store import HostExpertStore
    from kernels.quant import quantize_expert
    from kernels.fused_moe import fused_moe
    from kernels.moe_weights import HostExperts

    E, D, F, k = 8, 256, 128, 4
    g = torch.Generator().manual_seed(0)
    layout = ExpertLayout.make(fmt, D, F, 64)
    store = HostExpertStore.allocate(2, E, layout, pin=True, device="cuda")
    assert store.direct_readable(torch.device("cuda"))
    for r in range(2 * E):
        w13, w2 = torch.randn(2 * F, D, generator=g) / D ** 0.5, torch.randn(D, F, generator=g) / F ** 0.5
        if fmt == "bf16":
            w13, w2 = w13.bfloat16(), w2.bfloat16()
        store.write(r // E, r % E, layout.pack(quantize_expert(w13, w2, layout)))
    full = store.rows[E:].cuda()                                         # layer 1, every expert
    pool = torch.zeros(E, layout.nbytes, dtype=torch.uint8, device="cuda")
    slots = torch.full((E,), -1, dtype=torch.int32)
    for s, e in enumerate([6, 1, 3]):
        pool[s].copy_(full[e])
        slots[e] = s
    ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(tokens)]).int().cuda()
    w = torch.rand(tokens, k, generator=g).cuda()
    x = torch.randn(tokens, D, generator=g).bfloat16().cuda()
    host = HostExperts(layout.views(store.rows), E)
    out = fused_moe(x, ids, w, slots.cuda(), layout.views(pool), layout, host=host)
    want = fused_moe(x, ids, w, torch.arange(E, dtype=torch.int32, device="cuda"), layout.views(full), layout)
    torch.testing.assert_close(out.float(), want.float(), rtol=0, atol=0)
    # With a fill row the kernels also write the first two missing experts into free slots as they
    # read them (only the programs whose expert fills take the storing loop); no other slot changes.
    missing = sorted({int(e) for e in ids.flatten().tolist() if slots[int(e)] < 0})[:2]
    fill = torch.full((E,), -1, dtype=torch.int32)
    for s, e in zip((5, 7), missing):
        fill[e] = s
    before = pool.clone()
    out = fused_moe(x, ids, w, slots.cuda(), layout.views(pool), layout,
                    host=HostExperts(layout.views(store.rows), E, fill.cuda()))
    torch.testing.assert_close(out.float(), want.float(), rtol=0, atol=0)
    got, src = layout.views(pool), layout.views(full)
    for s, e in zip((5, 7), missing):
        for name in got:
            assert torch.equal(got[name][s], src[name][e]), (e, name)
    others = [s for s in range(E) if s not in (5, 7)[:len(missing)]]
    assert torch.equal(pool[others], before[others])
    store.close()


@pytest.mark.parametrize("graphs", [False, True])
def test_a_full_pools_counts_come_from_the_router_kernel(model, graphs) -> None:
    # Every expert on the card: the router kernel adds each layer call to the device tally in its own
    # launch (kernels/router.route(tally_into=...)), replayed or eager; every (token, layer) counts k
    # activations and each layer call at least one hit, none twice.
    path, _, _, _ = model
    with LLM(str(path), device="cuda", dtype="float32", cuda_graphs=graphs) as llm:
        outs = llm.generate(PROMPTS, GREEDY)
        llm.stats()
        torch.cuda.synchronize()
        st = llm.stats().experts
        spec = llm.engine.loaded.spec
    tokens = sum(len(p) for p in PROMPTS) + sum(len(o.token_ids) for o in outs) - len(PROMPTS)   # last: not fed
    assert sum(map(sum, st.activations)) == tokens * spec.top_k * spec.num_moe_layers
    calls = tokens * spec.top_k * spec.num_moe_layers
    assert st.misses == 0 and spec.num_moe_layers * GREEDY.max_tokens <= st.hits <= calls


@pytest.mark.parametrize("tokens", [1, 8, 16])
@pytest.mark.parametrize("router_dtype", [torch.bfloat16, torch.float32])
def test_the_fused_router_gemv_routes_a_real_shape_as_the_gemm_and_router_kernel_do(tokens, router_dtype) -> None:
    # Qwen3-30B-A3B's router (128 experts over 2048) on bf16 activations: route_gemv's ids equal the
    # separate GEMM's then route's (logits rounded to bf16 alike), in eager launches and in a replayed
    # CUDA graph; its arrival count is zero after each.
    from engine.models.moe_transformer import router_logits
    from engine.models.weights import MoEWeights
    from kernels.arrivals import arrival_counts
    from kernels.router import route, route_gemv
    g = torch.Generator(device="cuda").manual_seed(tokens)
    x = torch.randn(tokens, 2048, device="cuda", generator=g).bfloat16()
    router = (torch.randn(128, 2048, device="cuda", generator=g) / 45).to(router_dtype)
    m = MoEWeights(moe_index=0, router=router)
    def chosen_well(ids_got: torch.Tensor) -> bool:
        # the fp32 accumulation order differs from cuBLAS's: a near tie at the 8th place may go either way
        logits = x.float() @ router.float().t()
        kth = logits.topk(8).values[:, -1:]
        return bool((logits.gather(1, ids_got.long()) >= kth - 2e-2).all())

    w_ref, ids_ref = route(router_logits(x, m), 8, "softmax", True)
    w, ids = route_gemv(x, router, 8, "softmax", True)
    assert chosen_well(ids) and (ids == ids_ref).float().mean() > 0.9
    same = (ids == ids_ref).all(dim=1)
    assert torch.allclose(w[same], w_ref[same], atol=1e-3)
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        route_gemv(x, router, 8, "softmax", True)
    torch.cuda.current_stream().wait_stream(stream)
    with torch.cuda.graph(graph):
        w_g, ids_g = route_gemv(x, router, 8, "softmax", True)
    x.copy_(torch.randn(tokens, 2048, device="cuda", generator=g).bfloat16())
    graph.replay()
    torch.cuda.synchronize()
    assert chosen_well(ids_g)
    assert not arrival_counts(x.device, 1, "router").any()


def test_single_sequence_and_live_resize(model) -> None:
    # One prompt at a time (bucket 1, no padding), then resizes between steps: the recordings made
    # against the old pool must be dropped and re-made.
    path, ref, keys, nbytes = model
    with LLM(str(path), device="cuda", dtype="float32", expert_pool_size=(keys // 2) * nbytes,
             prefetch_depth=2) as llm:
        assert llm.generate([PROMPTS[1]], GREEDY)[0].token_ids == ref[1]
        out, _ = generate_with_resizes(llm, PROMPTS, GREEDY, [0, keys, 3, keys // 2], nbytes)
        assert out == ref
        assert _graphs(llm).replays > 0


def _run(llm: LLM, prompts: list[list[int]], params: list[SamplingParams]) -> list[list[int]]:
    eng = llm.engine
    ids = {eng.add_request(None, p, sp): i for i, (p, sp) in enumerate(zip(prompts, params))}
    out: dict[int, list[int]] = {i: [] for i in ids.values()}
    while eng.has_unfinished():
        for d in eng.step():
            out[ids[d.request_id]] += d.new_token_ids
    return [out[i] for i in range(len(prompts))]


def test_direct_and_piecewise_steps_alternate(model) -> None:
    # 20 requests of different lengths: the batch shrinks from the bucket of 24 (recorded piecewise,
    # misses copied in) to buckets of 16 and fewer (one graph, misses read directly), and switching
    # between the two must let each one's copies and slot-table writes land first.
    path, _, keys, nbytes = model
    prompts = [[1, 7 + i, 30 + 2 * i, 5] for i in range(20)]
    params = [SamplingParams(max_tokens=4 + (i % 5) * 3, temperature=0.0, ignore_eos=True) for i in range(20)]
    with LLM(str(path), device="cuda", dtype="float32", cuda_graphs=False, max_batch=24) as llm:
        want = _run(llm, prompts, params)
    with LLM(str(path), device="cuda", dtype="float32", expert_pool_size=(keys // 2) * nbytes,
             prefetch_depth=2, max_batch=24) as llm:
        assert _run(llm, prompts, params) == want
        recs = _graphs(llm).graphs
        assert recs[24].cuts and not recs[24].direct
        assert any(r.direct for b, r in recs.items() if b <= 16)


def test_quiet_steps_when_the_gpu_side_prefetch_is_closed(model) -> None:
    # With the prefetch gate closed (its guesses mostly wrong), direct-read steps replay the quiet
    # recording (no predictions, no claims), except the gate's probe steps; greedy output is the
    # eager engine's either way, and no claim is left in the slot table.
    path, ref, keys, nbytes = model
    with LLM(str(path), device="cuda", dtype="float32", expert_pool_size=(keys // 2) * nbytes,
             prefetch_depth=2) as llm:
        prov = llm.engine.loaded.experts
        prov.claims.decay = 1.0                                 # closed at every step size, and it stays closed
        for tokens in (1, 2, 4, 8, 16):
            prov.claims.record(tokens, [(0, False, 1)] * 1000)
        prov.gate.probe_every = 4                               # a few probe steps in 12 tokens
        graphs = _graphs(llm)
        flags = []
        hooks = prov.replay_hooks                               # what the graphs drive, one object
        start = hooks.start_direct_step

        def recording(regions, tokens, predicting=True, claims=()):
            flags.append(predicting)
            return start(regions, tokens, predicting, claims)
        hooks.start_direct_step = recording
        assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == ref
        assert False in flags and True in flags               # quiet steps, and probe steps
        rec = graphs.graphs[4]
        assert rec.direct and rec.quiet is not None and rec.quiet.direct
        assert all(c.predicted is None for c in rec.quiet.cuts)
        assert any(c.predicted is not None for c in rec.cuts)
        llm.stats()                  # changes nothing: the engine ended the last step once it ran out of work
        assert prov.direct.ended is None
        torch.cuda.synchronize()
        assert prov.pool.table.flatten().tolist() == prov.pool.books.slot_of


def test_replays_measured_faster_with_predictions_predict(model) -> None:
    # The GPU-side prefetch is open (its claims mostly used): each step size replays the quiet recording
    # first, tries the predicting one, and keeps it where it measures faster; greedy output is the
    # eager engine's either way, and the stats say which recording each size replays.
    path, ref, keys, nbytes = model
    with LLM(str(path), device="cuda", dtype="float32", expert_pool_size=(keys // 2) * nbytes,
             prefetch_depth=2, cold_experts="bus") as llm:
        prov = llm.engine.loaded.experts
        prov.claims.decay = 1.0
        for tokens in (1, 2, 4, 8, 16):
            prov.claims.record(tokens, [(0, True, 1)] * 1000)     # open at every step size
        tuner = prov.direct.choice.predict_tuner
        tuner.trials, tuner.probe_every = 2, 64
        measured = tuner.observe
        tuner.observe = lambda tokens, predicting, seconds: measured(tokens, predicting, 1.0 if predicting else 2.0)
        flags = []
        hooks = prov.replay_hooks
        start = hooks.start_direct_step

        def recording(regions, tokens, predicting=True, claims=()):
            flags.append((tokens, predicting))
            return start(regions, tokens, predicting, claims)
        hooks.start_direct_step = recording
        long = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
        got = llm.generate([PROMPTS[1]], long)[0].token_ids
        assert got[:len(ref[1])] == ref[1]
        ones = [p for t, p in flags if t == 1]
        assert ones[0] is False and ones[-1] is True              # quiet first; predicting kept
        assert dict(llm.stats().experts.predicting)[1] is True
        assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == ref


@pytest.mark.parametrize("family", ["glm4_moe", "deepseek_v2", "deepseek_v3"])
@pytest.mark.parametrize("frac", [0.0, 0.5, 1.0])
def test_scored_families_on_the_gpu_match_transformers_and_replay_what_eager_runs(tmp_path_factory, family,
                                                                                   frac) -> None:
    # GLM-4.5: the Triton router with its choice bias and routed scaling, the predictions' sigmoid
    # scores with the bias, and the half-head RoPE through the fused q/k norm + RoPE kernel; DeepSeek:
    # the router's expert groups (group max of softmax scores, V2; two best biased sigmoid scores, V3)
    # and latent attention over the latent cache rows. Eager and replayed from graphs, with every
    # expert on the card, half, and none
    from transformers import AutoModelForCausalLM
    path = build_tiny_model(tmp_path_factory.mktemp(f"{family}_gpu"), family)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with LLM(str(path), device="cuda", dtype="float32", cuda_graphs=False) as eager:
        ref = [o.token_ids for o in eager.generate(PROMPTS, GREEDY)]
        for ids, got in zip(PROMPTS, eager.engine.score_batch(PROMPTS)):
            with torch.no_grad():
                want = hf(torch.tensor([ids])).logits[0].float()
            assert (got.cpu() - want).abs().max().item() <= 1e-3
        keys = eager.engine.loaded.spec.num_moe_layers * eager.engine.loaded.spec.num_experts
        nbytes = eager.engine.loaded.layout.nbytes
    with LLM(str(path), device="cuda", dtype="float32", expert_pool_size=int(frac * keys) * nbytes,
             prefetch_depth=2) as llm:
        assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == ref
        assert llm.engine.runner.graphs.replays > 0


@pytest.mark.parametrize("kv", ["auto", "int8", "fp8"])
@pytest.mark.parametrize("heads, lens", [(16, [1, 300, 4097]), (128, [2000, 33, 1])])
def test_the_latent_decode_kernel_at_released_widths(heads, lens, kv) -> None:
    # DeepSeek-V2 / V3's latent rows (512 + 64) in bf16, against the float32 truth, at one split and several
    import math
    from engine.kv.cache import KVCache
    from kernels.latent_attention import LatentDecodeLaunch, latent_decode_attention, latent_decode_attention_ref
    g = torch.Generator(device="cuda").manual_seed(0)
    bs, r, p = 16, 512, 64
    blocks = sum(math.ceil(n / bs) for n in lens) + 2
    cache = KVCache(1, blocks, bs, 1, r, torch.bfloat16, torch.device("cuda"), kv, v_head_dim=p)
    perm = torch.randperm(blocks, device="cuda", generator=g).to(torch.int32)
    tables = torch.zeros(len(lens), max(math.ceil(n / bs) for n in lens), dtype=torch.int32, device="cuda")
    at = 0
    for b, n in enumerate(lens):
        u = math.ceil(n / bs)
        tables[b, :u] = perm[at:at + u]
        at += u
        rows = (tables[b, :u].long()[:, None] * bs + torch.arange(bs, device="cuda")).flatten()[:n]
        cache.write(0, rows, torch.randn(n, 1, r, device="cuda", generator=g).bfloat16(),
                    torch.randn(n, 1, p, device="cuda", generator=g).bfloat16())
    q = (torch.randn(len(lens), heads, r + p, device="cuda", generator=g) * 0.1).bfloat16()
    lens_t = torch.tensor(lens, dtype=torch.int32, device="cuda")
    scales = {"c_scale": cache.k_scale[0], "p_scale": cache.v_scale[0]} if cache.quantised else {}
    want = latent_decode_attention_ref(q.float(), cache.k[0].float() if not cache.quantised else cache.k[0],
                                       cache.v[0].float() if not cache.quantised else cache.v[0], tables, lens_t, bs,
                                       0.07, **scales)
    for splits in (1, None):
        got = latent_decode_attention(q, cache.k[0], cache.v[0], tables, lens_t, bs, 0.07,
                                      launch=LatentDecodeLaunch(num_splits=splits), **scales)
        torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)
