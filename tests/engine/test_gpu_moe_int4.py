"""On a CUDA GPU: the int4 MoE decode launches (overlapping launches, single launch) against the
reference, with bf16 activations.

Skipped without a GPU (CI has none; the interpreter cases are in ``tests/kernels/test_fused_moe.py``,
whose folder always runs the interpreter); the GPU
benchmark run executes this file. On real hardware programs run concurrently, so these cases cover
what the interpreter's one-program-at-a-time run cannot: kernels launched while the kernel that
writes their routing is still running (programmatic dependent launch), down tiles waiting for up tiles
held by other programs, more programs than fit on the GPU at once (the queue must not deadlock), the
counters reset between launches and between CUDA graph replays.
"""
from __future__ import annotations

import pytest
import torch

from kernels.fused_moe import fused_moe, fused_moe_ref
from kernels.moe_config import MoeLaunchConfig, TileConfig
from kernels.moe_decode import pdl_supported
from kernels.moe_decode_single import sync_words
from kernels.router import route
from tests.kernels.helpers import make_pool, make_routing

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _pool(tokens: int, group: int = 128):
    # Qwen3-30B-A3B's expert shape (hidden 2048, FFN 768) over 16 experts, top-8.
    layout, buf, _, slots = make_pool("int4", 2048, 768, 16, group)
    views = layout.views(buf.cuda())
    ids, w = make_routing(tokens, 16, 8)
    x = torch.randn(tokens, 2048, generator=torch.Generator().manual_seed(1)).bfloat16().cuda()
    return layout, views, slots.cuda(), ids.cuda(), w.cuda(), x


def _close(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref.float()).norm() / ref.float().norm())


@pytest.mark.parametrize("tokens", [1, 4, 16])
@pytest.mark.parametrize("programs_per_sm", [1, 2, 64])
def test_single_launch_matches_reference(tokens, programs_per_sm) -> None:
    # 64 programs per SM is far more than can be resident: programs that start late find the queue
    # empty or take down tiles whose up tiles are held by running programs; none may wait forever.
    layout, views, slots, ids, w, x = _pool(tokens)
    cfg = MoeLaunchConfig("single", TileConfig(16, 256, 4), TileConfig(8, 1024), programs_per_sm=programs_per_sm)
    ref = fused_moe_ref(x, ids, w, slots, views, layout)
    for _ in range(3):  # counters must come back to zero each time
        out = fused_moe(x, ids, w, slots, views, layout, cfg)
        torch.cuda.synchronize()
        assert _close(out, ref) < 1e-2
        assert sync_words(x.device).tolist() == [0, 0, 0, 0]


def test_single_launch_in_a_cuda_graph() -> None:
    # The decode step replays it from a CUDA graph: ten replays, each equal to the eager result
    # bit for bit (the reduction over k is in a fixed order).
    layout, views, slots, ids, w, x = _pool(1, group=64)
    cfg = MoeLaunchConfig("single", TileConfig(16, 256, 8), TileConfig(8, 1024), programs_per_sm=1)
    eager = fused_moe(x, ids, w, slots, views, layout, cfg)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fused_moe(x, ids, w, slots, views, layout, cfg)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fused_moe(x, ids, w, slots, views, layout, cfg)
    for _ in range(10):
        out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager)


def test_overlapping_launches_wait_for_the_router() -> None:
    # Router then MoE with programmatic dependent launch, recorded in one CUDA graph and replayed
    # with new logits each time: the up kernel starts while the router runs, so it must read the
    # routing only after its wait, and the down kernel must see every h. A kernel that read too early
    # would use the previous replay's experts.
    if not pdl_supported(torch.device("cuda")):
        pytest.skip("programmatic dependent launch needs a Hopper or later GPU and a Triton with it")
    layout, views, slots, _, _, x = _pool(1)
    cfg = MoeLaunchConfig("decode", TileConfig(8, 256, 2), TileConfig(4, 256, 2), pdl=True)
    logits = torch.zeros(1, 16, device="cuda")

    def step():
        w, ids = route(logits, 8, "softmax", True)
        return fused_moe(x, ids, w, slots, views, layout, cfg)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    gen = torch.Generator(device="cuda").manual_seed(5)
    for _ in range(20):
        logits.copy_(torch.randn(1, 16, device="cuda", generator=gen) * 4)
        graph.replay()
        w, ids = route(logits, 8, "softmax", True)
        ref = fused_moe_ref(x, ids, w, slots, views, layout)
        assert _close(out, ref) < 1e-2
