"""What the MoE kernels share: where an expert's rows are (pool slot or mapped host store), where a
directly read expert is written, chunk widths, programmatic dependent launch, MXFP4 values and the
activations that combine gate and up."""
from __future__ import annotations

import torch

from kernels._triton import gdc_launch_dependents, gdc_wait, jit, next_pow2, pdl_supported, tl
from kernels.moe_weights import PoolMatrix

__all__ = ["CLAIMED", "SLOT_CPU", "HostMatrices", "add_bias", "block_k", "check_word_rows", "e8m0", "expert_act", "expert_ptr", "fill_of",
           "fill_ptr", "fills_on", "fp4_pair", "gdc_launch_dependents", "gdc_wait", "host_args", "int4_word_args",
           "on_gpu", "pdl_supported"]

# The host store's (w13, w2) views, the store row of the layer's expert 0, and the layer's fill row
# (``[E]`` int32: the pool slot a directly read expert is written into as it is read, or -1; or None).
HostMatrices = tuple[PoolMatrix, PoolMatrix, int, "torch.Tensor | None"]

# What a slot-table entry (and the per-layer snapshot the decode kernels read) holds: a pool or staging
# slot (>= 0), -1 for an expert with none, or one of these codes, each negative ("missing" to readers
# that only ask whether an expert has a slot) and each distinct, since the kernels act on them:
# SLOT_CPU (snapshot only): the host CPU computes the expert in this step (engine/experts/cold_graph.py);
#   the decode kernels neither read it nor compute its pairs, and the layer's join waits for the host.
# CLAIMED (table and snapshot): the GPU-side prefetch is copying the expert into a staging slot
#   (kernels/expert_claim.py); until its slot is published a reader reads it from host memory.
# The Triton kernels spell them as literals (-3 in on_gpu, publish_direct and the join; -4 in the claim
# kernel): tests/kernels/test_slot_codes.py checks that each kernel acts on the code it names.
SLOT_CPU = -3
CLAIMED = -4



@jit
def expert_ptr(ptr, host_ptr, slot, key, stride, HOST: tl.constexpr):
    """Base of one expert's matrix (or scales): its pool slot, or with ``HOST`` and slot -1 its row
    ``key`` of the mapped host store, whose views have the pool's strides (a direct read over the bus)."""
    if HOST:
        return tl.where(slot >= 0, ptr + slot * stride, host_ptr + key * stride)
    return ptr + slot * stride


@jit
def on_gpu(ok, slot, HOST: tl.constexpr):
    """``ok`` where the kernels compute the pairs of the expert in ``slot``: not where the snapshot
    gives it to the host CPU (``SLOT_CPU``, only with ``HOST``: direct-read steps)."""
    if HOST:   # the slot spread to ok's shape first: the interpreter mistypes bool & scalar bool
        return ok & ((slot + ok.to(tl.int64) * 0) != -3)                # SLOT_CPU
    return ok


@jit
def fill_ptr(ptr, fill, stride, FILL: tl.constexpr):
    """Base of one expert's matrix (or scales) in pool slot ``fill``: where a kernel that reads the
    expert from the host store writes it as it reads it (``fill >= 0``), so the pool holds it for the
    next step without a copy. Without ``FILL`` the pool's own base (never written)."""
    base = ptr
    if FILL:
        base = ptr + tl.maximum(fill, 0) * stride
    return base


@jit
def fill_of(fill_row, e, slot, FILL: tl.constexpr):
    """The fill slot of expert ``e`` (``fill_row[e]``) when it has no pool slot, else -1."""
    fill = slot * 0 - 1                                                 # int64, like the slot
    if FILL:
        fill = tl.where(slot < 0, tl.load(fill_row + e).to(tl.int64), fill)
    return fill


@jit
def fp4_pair(b):
    """float32 e2m1 values of the low and high nibbles of bytes ``b``, each divided by 2 ** 14 (exact).

    A nibble ``s e e m`` placed as fp16 bits ``s 00000 0 ee m 000000000`` (sign to bit 15, the rest
    to bits 11-9) is the fp16 value ``e2m1 * 2 ** -14``, subnormal 0.5 included: no table."""
    w = b.to(tl.uint16)
    lo = (((w & 8) << 12) | ((w & 7) << 9)).to(tl.float16, bitcast=True).to(tl.float32)
    hi = (((w & 0x80) << 8) | ((w & 0x70) << 5)).to(tl.float16, bitcast=True).to(tl.float32)
    return lo, hi


@jit
def e8m0(s):
    """float32 ``2 ** (s - 127)`` of scale bytes ``s`` (1..254; 0 gives 0, 255 inf): the byte as the
    exponent field of a float32."""
    return (s.to(tl.int32) << 23).to(tl.float32, bitcast=True)


@jit
def expert_act(gate, up, EPI: tl.constexpr):
    """``h`` from float32 ``gate`` and ``up`` as ``EPI = (act, alpha, limit, bias)`` says: silu(gate) * up,
    or gpt-oss's clamped SwiGLU ``(clamp(up, -limit, limit) + 1) * g * sigmoid(alpha g)``, ``g = min(gate,
    limit)``."""
    if EPI[0] == 1:
        g = tl.minimum(gate, EPI[2])
        u = tl.minimum(tl.maximum(up, -EPI[2]), EPI[2])
        h = (u + 1.0) * g / (1.0 + tl.exp(-EPI[1] * g))
    else:
        h = gate / (1.0 + tl.exp(-gate)) * up
    return h


@jit
def add_bias(y, bias, hb_ptr, slot, key, fill, idx, ok, HOST: tl.constexpr, FILL: tl.constexpr):
    """``y`` plus biases ``idx`` of the expert in ``slot`` (``bias``: the pool's ``(bias, slot stride)``;
    with ``HOST`` and slot -1 store row ``key`` at ``hb_ptr``, as its weights); a directly read expert
    with a fill slot also stores them there."""
    b_ptr, sb_s = bias
    b = tl.load(expert_ptr(b_ptr, hb_ptr, slot, key, sb_s, HOST) + idx, mask=ok, other=0.0)
    if FILL:
        tl.store(fill_ptr(b_ptr, fill, sb_s, FILL) + idx, b, mask=ok & ((fill + 0 * idx) >= 0))  # fill: scalar or not
    return y + b


def block_k(want: int, k: int, group: int = 0) -> int:
    """Chunk width: no wider than K needs (a power of two, as Triton needs); with ``group`` (int4)
    whole groups."""
    bk = min(want, next_pow2(k))
    return max(bk, group) // group * group if group else bk


def int4_word_args(m: PoolMatrix, name: str) -> tuple:
    """``m.args()`` with the packed bytes as int32 words ``[S, N, K/8]`` (strides in words).

    The expert layout starts every tensor and slot on 256 bytes and K is a multiple of the group size
    (at least 32), so rows start on 16 bytes: whole-word and 16-byte loads."""
    check_word_rows(m, f"4-bit pool view {name}")
    words = m.w.view(torch.int32)                                        # [S, N, K/8]
    return (words, words.stride(0), words.stride(1), *m.args()[3:])


def check_word_rows(m: PoolMatrix, what: str) -> None:
    """Packed 4-bit rows that kernels read as int32 words and 16-byte vectors: a multiple of 8 elements,
    starting on 16 bytes."""
    w = m.w
    if m.k % 8 or w.data_ptr() % 16 or w.stride(0) % 16 or w.stride(1) % 16:
        raise ValueError(f"{what} must have rows of a multiple of 8 elements starting on 16-byte boundaries "
                         f"(as ExpertLayout places them); got K = {m.k}, address {w.data_ptr()} and byte "
                         f"strides {w.stride()[:2]}")


def host_args(host: HostMatrices | None, m: PoolMatrix, which: int, int4: bool) -> tuple:
    """The kernels' ``host`` argument for matrix ``which`` (0: w13, 1: w2): the host store's weights,
    scales, (int4) zero points and biases, the layer's first store row and its fill row,
    ``(w, scale, [zero,] bias, row_base, fill)``; without ``host`` (or fill row) the pool's own
    pointers stand in (never dereferenced)."""
    h = m if host is None else host[which]
    w = int4_word_args(h, "host")[0] if int4 else h.w
    bias = h.bias_args()[0]
    base = 0 if host is None else host[2]
    fill = m.w if host is None or host[3] is None else host[3]
    return (w, h.scale, h.zero, bias, base, fill) if int4 else (w, h.scale, bias, base, fill)


def fills_on(host: HostMatrices | None) -> bool:
    """Whether the kernels write directly read experts into fill slots."""
    return host is not None and host[3] is not None
