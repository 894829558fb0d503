"""On a CUDA GPU: the int4 MoE decode (prep, up and down launches, overlapping or not; or up and
down only, taking x's planes from the add + RMSNorm) against the reference, with bf16 activations.

Skipped without a GPU (CI has none; the interpreter cases are in ``tests/kernels/test_fused_moe.py``,
whose folder always runs the interpreter); the GPU benchmark run executes this file. On real hardware
launches can overlap (programmatic dependent launch), which the interpreter cannot show: a kernel
that read its inputs before waiting for the kernel that writes them would read stale values.
"""
from __future__ import annotations

import pytest
import torch

from kernels.act16 import act16
from kernels.decode_ops import add_rms_norm_act16
from kernels.fused_moe import fused_moe, fused_moe_ref
from kernels.moe_config import MoeLaunchConfig, TileConfig
from kernels.moe_decode import pdl_supported
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


def _record(step):
    """``step`` run once on a side stream (compiles, allocator), then recorded: (graph, its outputs)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    return graph, out


def _close(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref.float()).norm() / ref.float().norm())


@pytest.mark.parametrize("tokens", [1, 4, 16])
@pytest.mark.parametrize("pdl", [False, True])
@pytest.mark.parametrize("group", [64, 128])
def test_decode_matches_reference(tokens, pdl, group) -> None:
    layout, views, slots, ids, w, x = _pool(tokens, group)
    cfg = MoeLaunchConfig("decode", TileConfig(16, 512, 4), TileConfig(4, 256, 2), pdl=pdl)
    out = fused_moe(x, ids, w, slots, views, layout, cfg)
    assert _close(out, fused_moe_ref(x, ids, w, slots, views, layout)) < 1e-2


def test_overlapping_launches_wait_for_the_router() -> None:
    # Router then MoE with programmatic dependent launch, recorded in one CUDA graph and replayed
    # with new logits each time: the prep kernel may start while the router runs, the up kernel while
    # the prep runs, the down kernel while the up kernel runs; each must read only after its wait.
    # A kernel that read too early would use the previous replay's experts or activations.
    if not pdl_supported(torch.device("cuda")):
        pytest.skip("programmatic dependent launch needs a Hopper or later GPU and a Triton with it")
    layout, views, slots, _, _, x = _pool(1)
    cfg = MoeLaunchConfig("decode", TileConfig(16, 1024, 8), TileConfig(2, 256, 2), pdl=True)
    logits = torch.zeros(1, 16, device="cuda")
    xs = x.clone()

    def step():
        w, ids = route(logits, 8, "softmax", True)
        return fused_moe(xs, ids, w, slots, views, layout, cfg)
    graph, out = _record(step)
    gen = torch.Generator(device="cuda").manual_seed(5)
    for _ in range(20):
        logits.copy_(torch.randn(1, 16, device="cuda", generator=gen) * 4)
        xs.copy_(torch.randn(1, 2048, device="cuda", generator=gen).bfloat16())
        graph.replay()
        w, ids = route(logits, 8, "softmax", True)
        assert _close(out, fused_moe_ref(xs, ids, w, slots, views, layout)) < 1e-2


def test_planes_from_the_norm_as_the_engine_runs_them() -> None:
    # The engine's decode: add + RMSNorm writing x and its 16-bit planes, the router, then only the up
    # and down launches, recorded in one CUDA graph and replayed with new inputs. The planes must equal
    # the prep kernel's for the same rows, and the up kernel must read them only after its wait.
    layout, views, slots, _, _, x = _pool(1)
    cfg = MoeLaunchConfig("decode", TileConfig(16, 1024, 8), TileConfig(2, 256, 2), pdl=pdl_supported(x.device))
    logits = torch.zeros(1, 16, device="cuda")
    xs, res = x.clone(), torch.zeros_like(x)
    norm_w = (1 + 0.1 * torch.randn(2048, generator=torch.Generator().manual_seed(2))).bfloat16().cuda()

    def step():
        h, _, h16 = add_rms_norm_act16(xs, norm_w, 1e-6, 128, residual=res)
        w, ids = route(logits, 8, "softmax", True)
        return h, h16, fused_moe(h, ids, w, slots, views, layout, cfg, x16=h16)
    graph, (h, h16, out) = _record(step)
    gen = torch.Generator(device="cuda").manual_seed(6)
    for _ in range(10):
        logits.copy_(torch.randn(1, 16, device="cuda", generator=gen) * 4)
        xs.copy_(torch.randn(1, 2048, device="cuda", generator=gen).bfloat16())
        res.copy_(torch.randn(1, 2048, device="cuda", generator=gen).bfloat16())
        graph.replay()
        want = act16(h, 128)
        assert all(torch.equal(a, b) for a, b in zip(h16[:3], want[:3]))
        w, ids = route(logits, 8, "softmax", True)
        assert torch.equal(out, fused_moe(h, ids, w, slots, views, layout, cfg))
        assert _close(out, fused_moe_ref(h, ids, w, slots, views, layout)) < 1e-2
