"""Engine options: sizes, shares of the experts, and one clear sentence for every bad value."""
from __future__ import annotations

import pytest

from engine.config import EngineConfig, parse_pool_size, parse_size
from engine.errors import ConfigError


def test_sizes_parse_like_a_user_writes_them():
    assert parse_size("10G") == 10 << 30
    assert parse_size("512M") == 512 << 20
    assert parse_size("1.5GiB") == int(1.5 * (1 << 30))
    assert parse_size(4096) == 4096 and parse_size(None) is None


def test_pool_share_resolves_against_all_experts():
    assert parse_pool_size("50%") == "50%"                  # kept until the expert bytes are known
    assert parse_pool_size("25%", total_bytes=1000) == 250
    assert parse_pool_size("2M") == 2 << 20


@pytest.mark.parametrize("options,message", [
    ({"expert_pool_size": "150%"}, "is not a share of the experts; write e.g. 50%"),
    ({"expert_pool_size": "ten gigs"}, "is not a size; write bytes or a number with K, M, G or T"),
    ({"kv_cache_dtype": "int3"}, "kv_cache_dtype='int3' is not supported; choose one of auto, bf16, int8, fp8"),
    ({"group_size": 48}, "group_size=48 is not supported; choose 32, 64 or 128"),
    ({"max_batch": 8, "max_batch_tokens": 4}, "raise max_batch_tokens or lower max_batch"),
    ({"device": "tpu"}, "device='tpu' is not supported; use auto, cpu, cuda or cuda:N"),
    ({"expert_policy": "static"}, "expert_policy=static needs routing_profile=FILE"),
])
def test_bad_options_say_what_to_do(options, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        EngineConfig(model="m", **options)


def test_engine_config_reads_pool_share_in_bytes(tmp_path):
    from engine import LLM
    from tiny_models import build_tiny_model
    llm = LLM(str(build_tiny_model(tmp_path / "m", "mixtral")), device="cpu", expert_pool_size="50%")
    total = 3 * 4 * llm.engine.loaded.layout.nbytes            # 3 MoE layers x 4 experts
    assert llm.engine.config.expert_pool_size == total // 2
    assert llm.stats().experts.pool_slots_total == 6
    llm.reconfigure(expert_pool_size="25%")
    assert llm.stats().experts.pool_slots_total == 3 and llm.engine.config.expert_pool_size == total // 4
