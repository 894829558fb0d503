"""The GPU memory plan: what fits where, and one-line errors with the numbers when it does not."""
from __future__ import annotations

from pathlib import Path

import pytest

from engine.errors import ConfigError
from engine.memory import plan_memory

GiB, MiB = 1 << 30, 1 << 20
EXPERT = 9 * MiB                      # one bf16 Qwen3-30B-A3B expert
KEYS = 48 * 128                       # routed experts over all layers
KV_TOK = 96 * 1024                    # bytes per token of KV cache


def _plan(**kw):
    args = dict(resident_bytes=2 * GiB, expert_bytes=EXPERT, num_experts=KEYS, kv_bytes_per_token=KV_TOK,
                budget_bytes=24 * GiB, workspace_bytes=GiB, experts_per_layer=128, active_experts_per_token=48 * 8)
    args.update(kw)
    return plan_memory(**args)


def test_auto_pool_takes_what_is_left_after_the_kv_reserve() -> None:
    p = _plan()
    room = 24 * GiB - 3 * GiB - 4096 * KV_TOK - 128 * EXPERT
    assert p.pool_slots == room // EXPERT and p.staging_slots == 128
    assert p.total_bytes <= 24 * GiB
    assert p.kv_tokens >= 4096
    assert p.kv_bytes == 24 * GiB - 3 * GiB - (p.pool_slots + 128) * EXPERT


def test_requested_pool_and_bus_bytes() -> None:
    p = _plan(requested_pool=10 * GiB)
    assert p.pool_slots == 10 * GiB // EXPERT == 1137
    # near-uniform routing: the hit rate is the pool fraction
    assert p.bus_bytes_per_token() == pytest.approx((1 - 1137 / KEYS) * 384 * EXPERT)
    assert p.bus_bytes_per_token(hit_rate=0.9) == pytest.approx(0.1 * 384 * EXPERT)
    text = "\n".join(p.format(bus_gb_s=55))
    assert "1137/6144 experts" in text and "tok/s at 55 GB/s" in text


def test_everything_fits_needs_no_staging() -> None:
    p = _plan(budget_bytes=80 * GiB)
    assert p.pool_slots == KEYS and p.staging_slots == 0 and p.bus_bytes_per_token() == 0


def test_resident_part_too_big_names_numbers_and_fix() -> None:
    with pytest.raises(ConfigError) as err:
        _plan(resident_bytes=30 * GiB)
    msg = str(err.value)
    assert "30.00 GiB" in msg and "24.00 GiB" in msg and "--gpu-memory-budget" in msg and "\n" not in msg


def test_requested_pool_too_big() -> None:
    with pytest.raises(ConfigError, match="--expert-pool-size"):
        _plan(requested_pool=30 * GiB)


def test_cpu_has_no_budget() -> None:
    p = _plan(budget_bytes=None, requested_pool=None)
    assert p.budget_bytes is None and p.pool_slots == KEYS and p.kv_bytes == 0
    assert "none (CPU)" in p.format()[0]


def test_staging_holds_what_a_decode_step_needs_at_once_and_half_a_layer_at_least() -> None:
    from engine.memory import staging_slots
    assert staging_slots(128) == 128                           # unsized: one layer's worth
    assert staging_slots(128, 2 * 1 * 8) == 64                 # depth 2, one sequence, top-8: half a layer,
    assert staging_slots(128, 2 * 4 * 8) == 64                 # so that a prefill layer runs in two passes
    assert staging_slots(128, 2 * 6 * 8) == 96
    assert staging_slots(128, 2 * 16 * 8) == 128               # at most one layer's worth
    p = _plan(decode_experts=16)
    q = _plan()
    assert p.staging_slots == 64 and q.staging_slots == 128
    assert p.pool_slots == q.pool_slots + 64                   # the pool gets what staging does not take
