"""Fused decode ops against their references: add + RMSNorm, and q/k norm + RoPE + KV-cache write."""
import pytest
import torch

triton = pytest.importorskip("triton")
from engine.models.layers import Rope  # noqa: E402
from kernels.act16 import act16_ref  # noqa: E402
from kernels.decode_ops import (add_rms_norm, add_rms_norm_act16, add_rms_norm_ref,  # noqa: E402
                                qk_norm_rope_write, qk_norm_rope_write_ref)

# fp32: the kernels sum the squares in another order than torch's mean, so the scale may differ in the
# last bit. fp16: that bit can flip one rounding to the half dtype, i.e. one fp16 ulp (~1e-3 relative).
TOLERANCES = {torch.float32: dict(atol=1e-6, rtol=1e-6), torch.float16: dict(atol=1e-3, rtol=1e-3)}
EPS = 1e-6


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("tokens, n, strided", [
    (1, 128, False),  # one token (decode), a power-of-two row
    (3, 96, True),    # several tokens; rows read through a stride (a slice of a wider tensor)
    (2, 80, False),   # N not a power of two: the row block's tail is masked out of the mean
])
def test_add_rms_norm_matches_reference(dtype, with_residual, tokens, n, strided):
    g = _gen(n + tokens)
    wide = (torch.randn(tokens, n + 16, generator=g) * 3).to(dtype)
    x = wide[:, 5:5 + n] if strided else wide[:, :n].contiguous()
    residual = torch.randn(tokens, n, generator=g).to(dtype) if with_residual else None
    weight = (1 + 0.5 * torch.randn(n, generator=g)).to(dtype)
    x_before = x.clone()
    normed, summed = add_rms_norm(x, weight, EPS, residual)
    normed_ref, summed_ref = add_rms_norm_ref(x, weight, EPS, residual)
    assert normed.dtype == dtype and normed.shape == (tokens, n) and normed.is_contiguous()
    assert torch.equal(summed, summed_ref)           # the add is torch's own rounding, bit for bit
    torch.testing.assert_close(normed, normed_ref, **TOLERANCES[dtype])
    assert torch.equal(x, x_before)                  # the input is never written
    if with_residual:
        assert summed.data_ptr() not in (x.data_ptr(), residual.data_ptr())
    else:
        assert summed is x                           # no add, no copy


def test_add_rms_norm_half_rounds_before_the_weight():
    # The engine rounds the normalised row to the input dtype and only then scales by the weight; a
    # kernel that multiplied in float32 and rounded once would differ from it in many elements.
    x = torch.randn(2, 256, generator=_gen(7)).to(torch.float16)
    weight = (1 + torch.rand(256, generator=_gen(8))).to(torch.float16)
    normed, _ = add_rms_norm(x, weight, EPS)
    h = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + EPS)
    once = (weight.float() * h).to(torch.float16)
    normed_ref, _ = add_rms_norm_ref(x, weight, EPS)
    assert torch.equal(normed, normed_ref)
    assert not torch.equal(normed_ref, once)         # the case distinguishes the two roundings


def _qkv_case(dtype, tokens, heads, kv_heads, head_dim, norm, bias, seed=0):
    """Strided qkv, Rope's tables, shuffled positions, scattered slots and sentinel-filled caches."""
    g = _gen(seed)
    width = (heads + 2 * kv_heads) * head_dim
    wide = torch.randn(tokens, width + 8, generator=g).to(dtype)
    qkv = wide[:, 3:3 + width]                        # rows strided like a slice of a wider output
    rope = Rope(head_dim, 10000.0, 32, torch.device("cpu"), dtype)
    positions = torch.tensor([17, 4, 29][:tokens], dtype=torch.int64)    # out of order, all > 0
    slots = torch.tensor([11, 2, 6][:tokens], dtype=torch.int64)         # scattered cache rows
    cache = torch.randn(2, 16, kv_heads, head_dim, generator=g).to(dtype)  # garbage in unused rows
    q_norm = (1 + 0.3 * torch.randn(head_dim, generator=g)).to(dtype) if norm else None
    k_norm = (1 + 0.3 * torch.randn(head_dim, generator=g)).to(dtype) if norm else None
    b = (0.5 * torch.randn(width, generator=g)).to(dtype) if bias else None
    return qkv, positions, rope.cos, rope.sin, cache, slots, q_norm, k_norm, b


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("tokens, heads, kv_heads, head_dim", [
    (1, 2, 1, 64),    # one token (decode), GQA groups of two, hd 64
    (3, 4, 2, 128),   # several tokens, GQA, hd 128 (Qwen3, Mixtral)
    (2, 4, 1, 80),    # one KV head for all queries; hd/2 = 40 not a power of two: masked half-heads
])
def test_qk_norm_rope_write_matches_reference(dtype, norm, bias, tokens, heads, kv_heads, head_dim):
    qkv, positions, cos, sin, cache, slots, q_norm, k_norm, b = _qkv_case(
        dtype, tokens, heads, kv_heads, head_dim, norm, bias, seed=tokens + head_dim)
    k_cache, v_cache = cache[0].clone(), cache[1].clone()
    k_ref, v_ref = cache[0].clone(), cache[1].clone()
    args = (heads, kv_heads, head_dim, EPS)
    q = qk_norm_rope_write(qkv, positions, cos, sin, k_cache, v_cache, slots, *args, q_norm, k_norm, b)
    q_ref = qk_norm_rope_write_ref(qkv, positions, cos, sin, k_ref, v_ref, slots, *args, q_norm, k_norm, b)
    assert q.shape == (tokens, heads, head_dim) and q.dtype == dtype and q.is_contiguous()
    if norm:
        torch.testing.assert_close(q, q_ref, **TOLERANCES[dtype])
        torch.testing.assert_close(k_cache, k_ref, **TOLERANCES[dtype])
    else:  # bias and rotation round exactly as torch's elementwise ops: bit for bit in either dtype
        assert torch.equal(q, q_ref) and torch.equal(k_cache, k_ref)
    assert torch.equal(v_cache, v_ref)               # v is copied, never normed or rotated
    untouched = torch.ones(16, dtype=torch.bool)
    untouched[slots] = False
    assert torch.equal(k_cache[untouched], cache[0][untouched])   # no stray writes
    assert torch.equal(v_cache[untouched], cache[1][untouched])
    assert not torch.equal(k_cache[slots], cache[0][slots])       # and the slots were written


def test_qk_norm_rope_write_rotates_by_position():
    # Position 0 is the identity rotation (cos 1, sin 0): q and the cached k are the input heads.
    qkv, _, cos, sin, cache, _, _, _, _ = _qkv_case(torch.float32, 1, 2, 1, 64, False, False)
    k_cache, v_cache = cache[0].clone(), cache[1].clone()
    zero = torch.zeros(1, dtype=torch.int64)
    q = qk_norm_rope_write(qkv, zero, cos, sin, k_cache, v_cache, zero, 2, 1, 64, EPS)
    assert torch.equal(q.reshape(1, -1), qkv[:, :128])
    assert torch.equal(k_cache[0].reshape(1, -1), qkv[:, 128:192])
    assert torch.equal(v_cache[0].reshape(1, -1), qkv[:, 192:])


def test_add_rms_norm_rejects_bad_arguments():
    x = torch.randn(2, 8)
    with pytest.raises(ValueError, match="weight must be torch.float32 \\[8\\]"):
        add_rms_norm(x, torch.ones(8, dtype=torch.float16), EPS)          # dtype mismatch
    with pytest.raises(ValueError, match="weight must be"):
        add_rms_norm(x, torch.ones(9), EPS)                                # width mismatch
    with pytest.raises(ValueError, match="residual must be torch.float32 \\(2, 8\\)"):
        add_rms_norm(x, torch.ones(8), EPS, torch.randn(3, 8))
    with pytest.raises(ValueError, match="x must be bf16/fp16/fp32"):
        add_rms_norm(x.long(), torch.ones(8).long(), EPS)
    with pytest.raises(ValueError, match="contiguous last dim"):
        add_rms_norm(torch.randn(8, 2).t(), torch.ones(8), EPS)
    with pytest.raises(ValueError, match="exceeds"):
        add_rms_norm(torch.randn(1, 16385), torch.ones(16385), EPS)


def test_qk_norm_rope_write_rejects_bad_arguments():
    qkv, positions, cos, sin, cache, slots, q_norm, k_norm, b = _qkv_case(torch.float32, 2, 2, 1, 64, True, True)
    k_cache, v_cache = cache[0], cache[1]

    def call(**over):
        a = dict(qkv=qkv, positions=positions, cos=cos, sin=sin, k_cache=k_cache, v_cache=v_cache,
                 slot_mapping=slots, num_heads=2, num_kv_heads=1, head_dim=64, eps=EPS, q_norm=q_norm,
                 k_norm=k_norm, bias=b)
        a.update(over)
        return qk_norm_rope_write(**a)

    with pytest.raises(ValueError, match=r"qkv has 256 columns but .* = \(4 \+ 2 \* 2\) \* 64 = 512"):
        call(num_heads=4, num_kv_heads=2)
    with pytest.raises(ValueError, match="multiple of KV heads"):
        call(num_heads=3, num_kv_heads=2)
    with pytest.raises(ValueError, match="positions must be int64"):
        call(positions=positions.int())
    with pytest.raises(ValueError, match="slot_mapping must be int64 \\[2\\]"):
        call(slot_mapping=slots[:1])
    with pytest.raises(ValueError, match="k_cache must be torch.float32"):
        call(k_cache=k_cache.half())
    with pytest.raises(ValueError, match="v_cache must be .* \\[R, 1, 64\\]"):
        call(v_cache=torch.zeros(16, 2, 64))
    with pytest.raises(ValueError, match="cos must be a torch.float32 table"):
        call(cos=cos.half())
    with pytest.raises(ValueError, match="bias must be"):
        call(bias=b[:-1])
    with pytest.raises(ValueError, match="q_norm and k_norm go together"):
        call(k_norm=None)
    with pytest.raises(ValueError, match="head_dim=63 must be even"):
        qk_norm_rope_write(torch.randn(1, 4 * 63), positions[:1], cos[:, :63], sin[:, :63],
                           torch.zeros(4, 1, 63), torch.zeros(4, 1, 63), slots[:1], 2, 1, 63, EPS)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("tokens, n, group", [
    (1, 128, 32),   # the decode step of one request
    (3, 192, 64),   # N not a power of two: the row block (256) has a masked whole group at its end
    (2, 256, 128),  # the group size of the shipped int4 checkpoints
])
def test_add_rms_norm_act16_writes_the_planes_of_its_output(dtype, with_residual, tokens, n, group):
    # The int4 MoE takes x as 16-bit planes; the norm that makes x writes them in the same launch.
    # They must be exactly what the MoE's own prep would make of the normed rows; the normed rows are
    # the plain norm's up to the order of the sum of squares (as against the reference), the summed
    # rows are the same.
    g = _gen(n + tokens)
    x = (torch.randn(tokens, n, generator=g) * 3).to(dtype)
    residual = torch.randn(tokens, n, generator=g).to(dtype) if with_residual else None
    weight = (1 + 0.5 * torch.randn(n, generator=g)).to(dtype)
    normed, summed, planes = add_rms_norm_act16(x, weight, EPS, group, residual)
    plain, plain_sum = add_rms_norm(x, weight, EPS, residual)
    assert torch.equal(summed, plain_sum)
    torch.testing.assert_close(normed, plain, **TOLERANCES[dtype])
    want = act16_ref(normed, group)
    assert planes.group == group
    for got, ref in zip(planes[:3], want[:3]):
        assert got.dtype == ref.dtype and torch.equal(got, ref)


def test_add_rms_norm_act16_rejects_a_group_that_does_not_divide_the_row():
    x, w = torch.randn(1, 96), torch.ones(96)
    with pytest.raises(ValueError, match="group 64 for rows of 96"):
        add_rms_norm_act16(x, w, EPS, 64)
