"""CPU expert kernels (kernels/cpu) against the plain-torch reference built from kernels/quant's
dequantisers, every format of the expert layout."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from kernels.cpu import (CpuExpertCost, CpuExpertWork, calibrate, cpu_expert_forward, cpu_expert_forward_ref,
                         set_cpu_expert_threads)
from kernels.errors import ConfigError
from kernels.expert_layout import ExpertAct, ExpertLayout
from kernels.quant import quantize_expert

FORMATS = ("bf16", "fp16", "fp32", "fp8", "int4", "mxfp4")
# Both paths compute in float32 from the same dequantised values; only the order of the sums differs.
TOLERANCE = dict(atol=2e-4, rtol=2e-4)


def make_store(fmt: str, hidden: int, ffn: int, rows: int = 5, bias: bool = False, act: ExpertAct | None = None,
               group_size: int = 32, seed: int = 0) -> tuple[ExpertLayout, torch.Tensor]:
    """A store of ``rows`` random experts; row 0 is left as random bytes, so a kernel that reads the
    wrong row fails loudly."""
    g = torch.Generator().manual_seed(seed)
    layout = ExpertLayout.make(fmt, hidden, ffn, group_size, bias=bias, act=act)
    store = torch.randint(0, 255, (rows, layout.nbytes), dtype=torch.uint8, generator=g)
    for r in range(1, rows):
        w13 = torch.randn(2 * ffn, hidden, generator=g) / hidden ** 0.5
        w2 = torch.randn(ffn, hidden, generator=g).t().contiguous() / ffn ** 0.5
        b13 = torch.randn(2 * ffn, generator=g) if bias else None
        b2 = torch.randn(hidden, generator=g) if bias else None
        layout.pack(quantize_expert(w13, w2, layout, b13, b2), store[r])
    return layout, store


def run_both(layout, store, work, x, **kw):
    got = cpu_expert_forward(store, layout, work, x, **kw)
    want = cpu_expert_forward_ref(store, layout, work, x)
    tol = dict(TOLERANCE)
    if layout.fmt in ("int4", "mxfp4"):
        # 4-bit formats run in integers on activations rounded to 16 bits per group (as the GPU's
        # 4-bit kernels; held as two bytes): about 5e-5 of the largest output, measured
        tol["atol"] = max(tol["atol"], 1e-4 * float(want.abs().max()))
    torch.testing.assert_close(got, want, **tol)
    return got


@pytest.mark.parametrize("fmt", FORMATS)
def test_one_token_decode(fmt):
    layout, store = make_store(fmt, 64, 96)
    x = torch.randn(1, 64)
    work = CpuExpertWork.from_pairs([(3, [0], [0.6]), (1, [0], [0.4])])
    out = run_both(layout, store, work, x)
    assert out.abs().max() > 0.05


@pytest.mark.parametrize("fmt", FORMATS)
def test_tokens_that_share_an_expert(fmt):
    layout, store = make_store(fmt, 64, 96)
    x = torch.randn(4, 64)
    work = CpuExpertWork.from_pairs([(2, [0, 1, 3], [0.5, 0.2, 0.9]), (4, [1, 3], [0.8, 0.1]), (1, [0], [0.5])])
    out = run_both(layout, store, work, x)
    assert torch.all(out[2] == 0), "a token no expert serves gets zeros"


@pytest.mark.parametrize("fmt", ("bf16", "fp16", "fp32", "fp8"))
def test_dims_that_are_no_multiple_of_the_row_block_or_the_vector_width(fmt):
    layout, store = make_store(fmt, 72, 40)   # 40 gate rows, 72 down rows: ragged 16-row items, 8-lane tails
    run_both(layout, store, CpuExpertWork.from_pairs([(1, [0, 1], [1.0, 0.5])]), torch.randn(2, 72))


@pytest.mark.parametrize("group_size", (32, 64, 128))
def test_int4_groups_other_than_one_per_row(group_size):
    layout, store = make_store("int4", 256, 128, group_size=group_size)
    run_both(layout, store, CpuExpertWork.from_pairs([(2, [0], [1.0]), (3, [0, 1], [0.3, 0.7])]),
             torch.randn(2, 256))


@pytest.mark.parametrize("fmt", FORMATS)
def test_biases_with_silu(fmt):
    layout, store = make_store(fmt, 64, 64, bias=True)
    run_both(layout, store, CpuExpertWork.from_pairs([(1, [0, 1], [0.5, 1.0])]), torch.randn(2, 64))


@pytest.mark.parametrize("fmt", ("bf16", "fp8", "int4", "mxfp4"))
def test_gpt_oss_swiglu_with_biases_and_clamping(fmt):
    layout, store = make_store(fmt, 64, 64, bias=True, act=ExpertAct("swiglu_oai"))
    x = torch.randn(3, 64) * 8      # large enough that the clamp at 7 decides some values
    run_both(layout, store, CpuExpertWork.from_pairs([(2, [0, 2], [0.7, 0.3]), (4, [1, 2], [1.0, 0.5])]), x)


def test_bf16_activations_are_read_as_float32():
    layout, store = make_store("int4", 64, 64)
    x = torch.randn(2, 64).to(torch.bfloat16)
    run_both(layout, store, CpuExpertWork.from_pairs([(1, [0, 1], [1.0, 1.0])]), x)


def test_thread_count_does_not_change_a_bit():
    layout, store = make_store("mxfp4", 64, 96)
    x = torch.randn(3, 64)
    work = CpuExpertWork.from_pairs([(1, [0, 1, 2], [0.2, 0.3, 0.4]), (2, [0, 2], [0.5, 0.6])])
    one = cpu_expert_forward(store, layout, work, x, threads=1)
    assert torch.equal(one, cpu_expert_forward(store, layout, work, x, threads=os.cpu_count()))


@pytest.mark.parametrize("fmt,group", [("int4", 64), ("mxfp4", 32)])
def test_one_parallel_region_gives_the_two_regions_result_to_the_bit(fmt, group):
    # gate/up and down in one region, down waiting per expert: each output adds its experts in the same
    # order, with one thread and with all of them, and a token with a NaN input still comes out NaN
    from kernels.cpu import CpuExpertRunner
    layout, store = make_store(fmt, 256, 128, rows=6, bias=True, group_size=group, seed=3)
    x = torch.randn(4, 256)
    x[3, 7] = float("nan")
    work = CpuExpertWork.from_pairs([(1, [0, 1, 2, 3], [0.2, 0.3, 0.4, 0.1]), (2, [0, 2], [0.5, 0.6]),
                                     (4, [1], [0.7]), (5, [0, 1, 3], [0.1, 0.2, 0.3])])
    for threads in (1, os.cpu_count()):
        two = cpu_expert_forward(store, layout, work, x, threads=threads, one_region=False)
        one = cpu_expert_forward(store, layout, work, x, threads=threads, one_region=True)
        assert torch.equal(one[:3], two[:3]) and one[3].isnan().all() and two[3].isnan().all()
        out = np.zeros((4, 256), np.float32)
        CpuExpertRunner(store, layout, threads, one_region=True).run(work, x.numpy(), out)
        assert torch.equal(torch.from_numpy(out[:3]), two[:3])


def test_out_is_overwritten_and_no_work_gives_zeros():
    layout, store = make_store("bf16", 64, 32)
    out = torch.full((2, 64), 5.0)
    cpu_expert_forward(store, layout, CpuExpertWork.from_pairs([]), torch.randn(2, 64), out=out)
    assert torch.all(out == 0)
    run_both(layout, store, CpuExpertWork.from_pairs([(1, [1], [1.0])]), torch.randn(2, 64), out=out)


def test_bad_arguments_are_one_sentence_errors():
    layout, store = make_store("bf16", 64, 32)
    x = torch.randn(2, 64)
    with pytest.raises(ValueError, match="store row"):
        cpu_expert_forward(store, layout, CpuExpertWork.from_pairs([(9, [0], [1.0])]), x)
    with pytest.raises(ValueError, match="token index"):
        cpu_expert_forward(store, layout, CpuExpertWork.from_pairs([(1, [2], [1.0])]), x)
    with pytest.raises(ValueError, match="host store"):
        cpu_expert_forward(store[:, :16], layout, CpuExpertWork.from_pairs([(1, [0], [1.0])]), x)
    with pytest.raises(ValueError, match="one weight per token"):
        CpuExpertWork.from_pairs([(1, [0, 1], [1.0])])


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="CPU affinity is Linux-only")
def test_threads_pin_to_the_cpu_set_given():
    before = sorted(os.sched_getaffinity(0))
    try:
        assert set_cpu_expert_threads(1, cpus=before[:1]) == 1
        assert os.sched_getaffinity(0) == set(before[:1])   # the calling thread does a share of the work
        layout, store = make_store("fp8", 64, 32)
        run_both(layout, store, CpuExpertWork.from_pairs([(1, [0], [1.0])]), torch.randn(1, 64))
        with pytest.raises(ConfigError, match="at least 1"):
            set_cpu_expert_threads(0)
        with pytest.raises(ConfigError, match="CPU numbers this machine has"):
            set_cpu_expert_threads(1, cpus=[os.cpu_count()])
    finally:
        set_cpu_expert_threads(len(before), cpus=before)
    assert sorted(os.sched_getaffinity(0)) == before


def test_starting_the_cpu_expert_threads_leaves_torchs_thread_count_alone():
    # numba's OpenMP pool, started by its first use, set the process's OpenMP thread count to every core:
    # a model on the CPU that ran torch on one thread ran on all from then on. A fresh process starts it.
    import subprocess
    import sys
    code = ("import torch; torch.set_num_threads(1); assert torch.get_num_threads() == 1\n"
            "from kernels.cpu import set_cpu_expert_threads\n"
            "set_cpu_expert_threads(1); print(torch.get_num_threads())")
    env = {**os.environ, "NUMBA_NUM_THREADS": "2"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["1"]


def test_calibrate_times_each_token_count_and_interpolates():
    layout, store = make_store("int4", 64, 64)
    cost = calibrate(store, layout, rows=[1, 2, 3], tokens=(1, 4), repeats=1)
    assert cost.tokens == (1, 4) and all(s > 0 for s in cost.seconds) and cost.experts_per_call == 3
    fixed = CpuExpertCost("int4", 1000, 1, (1, 2, 4), (1.0, 1.5, 2.5), 1)
    assert fixed.seconds_for(1) == 1.0 and fixed.seconds_for(3) == 2.0 and fixed.seconds_for(6) == 3.5
    assert fixed.gbps(2) == pytest.approx(1000 / 1.5 / 1e9)


def _two_byte(high, low):
    """Activations ``high * 254 + low`` (each ``[T, K]`` int8) as the ``[T, 2K]`` planes of two
    phases each that :mod:`kernels.cpu.idot` reads."""
    import numpy as np
    t, k = high.shape
    phase = lambda v: v.reshape(t, k // 2, 2).transpose(0, 2, 1).reshape(t, k)   # noqa: E731
    return np.concatenate([phase(high), phase(low)], axis=1).copy()


E2M1 = [0, .5, 1, 1.5, 2, 3, 4, 6, 0, -.5, -1, -1.5, -2, -3, -4, -6]


@pytest.mark.parametrize("generic", (False, True), ids=("this-cpu", "plain-ir"))
@pytest.mark.parametrize("kind,group", (("u4g32", 32), ("u4g64", 64), ("u4g128", 128), ("e2m1", 32)))
def test_integer_rows_equal_numpy(monkeypatch, generic, kind, group):
    """The integer row kernels against numpy in float64 on the same two-byte activations, for 1 and 2
    tokens, at row lengths that are whole 128-value steps and ones with groups left over, at weight
    rows that start on an odd byte, with this CPU's own instructions and with the plain IR other
    targets get. Both bytes of the activations span their whole range and the codes every value
    (zero points and the e2m1 offset included), so a lane that saturated or a sum that lost an
    offset shows."""
    import numpy as np
    from numba import njit

    from kernels.cpu import idot
    if generic:
        for name in ("_PMADD", "_MADDUBS", "_PSHUFB"):
            monkeypatch.setattr(idot, name, {})
    else:
        assert idot._PMADD is None and idot._MADDUBS is None and idot._PSHUFB is None   # numba's target
    row1, row2 = getattr(idot, f"{kind}_row1"), getattr(idot, f"{kind}_row2")

    @njit
    def rows(b, h, r, o, osc, oz, x2, sx, qs, k2, ng):   # compiled now, with the setting above
        return (row1(b, h, r, o, osc, oz, x2, sx, qs, 1, k2, ng),
                row2(b, h, r, o, osc, oz, x2, sx, qs, 0, 2, k2, ng))

    rng = np.random.default_rng(0)
    mx = kind == "e2m1"
    for k in sorted({group, 3 * group, 5 * group, 128, 640}):
        if k % group:
            continue
        ng = k // group
        b = rng.integers(0, 256, size=(3, 6000), dtype=np.uint8)
        h = b.view(np.uint16)
        if mx:
            b[:, 3000:3100] = rng.integers(120, 134, size=(3, 100))          # exponents: 2**-7 .. 2**6
        else:
            h[:, 1500:1600] = (rng.random((3, 100)) + 0.5).astype(np.float16).view(np.uint16)
            b[:, 5000:5100] = rng.integers(0, 16, size=(3, 100))             # zero points
        high, low = (rng.integers(-127, 128, size=(3, k), dtype=np.int8) for _ in range(2))
        high[0, :8] = low[0, :8] = [127, -127, 127, -127, 127, 127, -127, -127]
        x = high.astype(np.int64) * 254 + low
        sx = rng.random((3, ng)).astype(np.float32)
        qs = x.reshape(3, k // 8, 8).sum(-1).astype(np.int32)
        for o, shift in ((0, 0), (25, 7)):
            osc, oz = (3000 + shift, 0) if mx else (1500 + shift, 5000 + shift)
            codes = np.stack([b[1, o:o + k // 2] & 15, b[1, o:o + k // 2] >> 4], -1).reshape(-1).astype(np.int64)
            if mx:
                w = np.array(E2M1)[codes] * np.repeat(2.0 ** (b[1, osc:osc + ng].astype(np.float64) - 127), group)
            else:
                w = (codes - np.repeat(b[1, oz:oz + ng], group)) * np.repeat(h[1, osc:osc + ng].view(np.float16), group)
            want = [float((w * x[t] * np.repeat(sx[t], group)).sum()) for t in range(3)]
            one, (t0, t2) = rows(b, h, 1, o, osc, oz, _two_byte(high, low), sx, qs, k // 2, ng)
            scale = float(np.abs(w * x[0]).sum())
            for got, ref in ((one, want[1]), (t0, want[0]), (t2, want[2])):
                assert abs(got - ref) <= 1e-5 * scale, (k, o, got, ref)


@pytest.mark.parametrize("kind", ("u4g32", "e2m1"))
def test_a_row_whose_offsets_cancel_its_sums_stays_exact(kind):
    # Every weight of a 2880-long row but one is zero (int4: each code its group's zero point; mxfp4:
    # code 0, read as 12 less the offset 12) against activations of one sign: the offsets, 8 or 12
    # times the activations' sums, cancel nearly all of the raw integer sums. Taken apart in integers
    # for every 8 weights, the one weight's product is all that is left, to float32 rounding.
    import numpy as np
    from numba import njit

    from kernels.cpu import idot
    row1 = getattr(idot, f"{kind}_row1")

    @njit
    def one(b, h, osc, x2, sx, qs, k2, ng):
        return row1(b, h, 0, 0, osc, 3000, x2, sx, qs, 0, k2, ng)

    k, group = 2880, 32
    ng = k // group
    b = np.zeros((1, 4000), np.uint8)
    h = b.view(np.uint16)
    if kind == "e2m1":
        b[0, :k // 2] = 0
        b[0, 0] = 0x02                                  # code 2: 1.0
        b[0, 2000:2000 + ng] = 127                      # 2**(127 - 127) / 2 per doubled value
        want_w = 1.0
    else:
        b[0, :k // 2] = 0x88
        b[0, 0] = 0x89                                  # code 9 against zero point 8: one scale step
        h[0, 1000:1000 + ng] = np.array([0.01] * ng, np.float16).view(np.uint16)   # byte 2000
        b[0, 3000:3000 + ng] = 8
        want_w = float(np.float16(0.01))
    high = np.full((1, k), 127, np.int8)
    low = np.full((1, k), 5, np.int8)
    q = 127 * 254 + 5
    sx = np.full((1, ng), 3.0 / q, np.float32)          # every activation 3.0
    qs = np.full((1, k // 8), 8 * q, np.int32)
    osc = 2000 if kind == "e2m1" else 1000              # exponent bytes of b; fp16 scales: halves of h
    got = one(b, h, osc, _two_byte(high, low), sx, qs, k // 2, ng)
    assert abs(got - 3.0 * want_w) <= 1e-6 * 3.0 * want_w, got


def test_a_group_of_tiny_activations_reads_as_zeros():
    # Below 1e-30 a group's step (1/127 of its largest value) would be subnormal and its inverse
    # infinite; such a group is zeros, not values of the wrong sign.
    import numpy as np
    from kernels.cpu.packed import quantize_rows
    v = np.array([[1e-37, 0.0, -3e-38, 2e-37] * 8 + [0.5, -0.25] * 16], np.float32)        # [1, 64]
    q, s, qs, bad = np.empty((1, 128), np.int8), np.empty((1, 2), np.float32), np.empty((1, 8), np.int32), \
        np.empty(1, np.bool_)
    quantize_rows(v, 32, q, s, qs, bad)
    back = (254.0 * q[0, :64].astype(np.float64) + q[0, 64:]).reshape(2, 32).T.reshape(-1)   # phases undone
    assert not bad[0] and s[0, 0] == 0 and (qs[0, :4] == 0).all() and (back[:32] == 0).all()
    assert np.allclose(back[32:] * s[0, 1], v[0, 32:], atol=0.5 / 127 / 254)


@pytest.mark.parametrize("group", [32, 128])
def test_quantised_activations_of_many_rows_and_groups(group):
    # Rows of very different scales, quantised one (row, group) a work item: each value comes back
    # within one low-byte step of its group's largest value, each run of 8 sums to its qs entry, a
    # NaN or an infinity marks its row bad and zeroes only its own group, the other rows' flags
    # (set True beforehand) are cleared.
    import numpy as np
    from kernels.cpu.packed import quantize_rows
    rng = np.random.default_rng(group)
    n, k = 5, 4 * 128
    v = (rng.standard_normal((n, k)) * np.logspace(-3, 3, n)[:, None]).astype(np.float32)
    v[1, 3 * group + 5] = np.nan
    v[3, 7] = -np.inf
    q, s = np.empty((n, 2 * k), np.int8), np.empty((n, k // group), np.float32)
    qs, bad = np.empty((n, k // 8), np.int32), np.ones(n, np.bool_)
    quantize_rows(v, group, q, s, qs, bad)
    assert bad.tolist() == [False, True, False, True, False]
    units = 254 * q[:, :k].astype(np.int64) + q[:, k:]                            # [n, k] in two phases
    vals = np.empty((n, k), np.int64)
    vals[:, 0::2], vals[:, 1::2] = units[:, :k // 2], units[:, k // 2:]
    assert (vals.reshape(n, k // 8, 8).sum(-1) == qs).all()
    back = vals * np.repeat(s, group, axis=1)
    for i in range(n):
        for g in range(k // group):
            part = slice(g * group, (g + 1) * group)
            if (i, g) in ((1, 3), (3, 0)):                                      # the non-finite groups
                assert s[i, g] == 0 and not vals[i, part].any()
                continue
            top = np.abs(v[i, part]).max()
            assert np.abs(back[i, part] - v[i, part]).max() <= top / 127 / 254 * 0.51 + 1e-12 * top


def test_cached_kernels_of_other_sources_are_removed(monkeypatch, tmp_path):
    """numba checks only the file of a cached function, not the files inlined into it: the package
    removes its own cache files once its sources differ from those they were compiled from, and
    nothing else."""
    from kernels.cpu import cache
    from kernels.cpu.driver import expert_forward
    monkeypatch.setattr(cache, "cache_dir", lambda _example: tmp_path)
    ours = [tmp_path / "driver.expert_forward-40.py311.nbi", tmp_path / "packed.gate_up-90.py311.1.nbc"]
    theirs = [tmp_path / "other.f-1.py311.nbi", tmp_path / "driver.cpython-311.pyc"]
    for p in ours + theirs:
        p.write_bytes(b"x")
    assert cache.sync(expert_forward) is True
    assert not any(p.exists() for p in ours) and all(p.exists() for p in theirs)
    for p in ours:
        p.write_bytes(b"x")                       # compiled again from these sources: kept
    assert cache.sync(expert_forward) is False and all(p.exists() for p in ours)
    monkeypatch.setattr(cache, "digest", lambda: "an edit to idot.py")
    assert cache.sync(expert_forward) is True and not any(p.exists() for p in ours)


def test_the_integer_path_serves_int4_and_mxfp4():
    from kernels.cpu.driver import expert_forward, packed_forward
    from kernels.cpu.forward import _kernel, _meta
    for fmt, fn in (("int4", packed_forward), ("mxfp4", packed_forward), ("fp8", expert_forward),
                    ("bf16", expert_forward)):
        assert _kernel(_meta(ExpertLayout.make(fmt, 64, 32, 32))) is fn, fmt


@pytest.mark.parametrize("fmt", ("int4", "mxfp4"))
def test_4bit_rows_of_whole_steps_and_leftover_groups(fmt):
    # hidden 160: one 128-value step and a leftover group of 32 per row (gpt-oss's 2880 is 22 steps
    # and two groups); three tokens on one expert: a pair and a single
    layout, store = make_store(fmt, 160, 96, group_size=32)
    run_both(layout, store, CpuExpertWork.from_pairs([(2, [0, 1, 2], [0.5, 0.3, 0.2]), (1, [1], [1.0])]),
             torch.randn(3, 160))


@pytest.mark.parametrize("fmt", ("bf16", "int4", "mxfp4"))
def test_a_nan_in_the_activations_comes_out_nan(fmt):
    layout, store = make_store(fmt, 64, 32)
    x = torch.randn(2, 64)
    x[1, 5] = float("nan")
    out = cpu_expert_forward(store, layout, CpuExpertWork.from_pairs([(1, [0, 1], [1.0, 1.0])]), x)
    assert torch.isfinite(out[0]).all() and torch.isnan(out[1]).any()
