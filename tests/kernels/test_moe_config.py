"""Launch settings: per-GPU JSON with a fallback, bucketed by token count."""
from kernels.moe_config import config_file_name, moe_launch_config


def test_unknown_gpu_falls_back_to_default_buckets():
    # A GPU without a tuned file still runs: decode for few tokens, prefill beyond the bucket.
    assert config_file_name("NVIDIA GeForce RTX 3090") == "NVIDIA_GeForce_RTX_3090.json"
    small = moe_launch_config("Imaginary GPU 9000", "int4", 1)
    big = moe_launch_config("Imaginary GPU 9000", "int4", 100000)
    assert small.variant == "decode" and big.variant == "prefill"
    assert big.block_m >= 16 and big.up.block_n >= 16


def test_tuned_h200_table_is_read_with_its_launch_overlap_flag():
    # The committed H200 table: every format has a decode setting for one token, and the int4 one
    # asks for overlapping launches (used only where the GPU and Triton support them).
    for fmt in ("bf16", "fp8", "int4"):
        assert moe_launch_config("NVIDIA H200", fmt, 1).variant == "decode"
    assert moe_launch_config("NVIDIA H200", "int4", 1).pdl
    assert not moe_launch_config("NVIDIA H200", "bf16", 1).pdl


def test_a_prefill_setting_may_ask_for_tiles_of_joined_nibbles(tmp_path, monkeypatch):
    # A tuned table's prefill entry carries ``join`` (int4 tiles of joined nibbles); tables without it
    # leave the choice to the kernel's default (kernels/moe_prefill.INT4_JOIN).
    import json

    import kernels.moe_config as mc
    table = {"int4": {"64": {"variant": "prefill", "block_m": 64, "join": True,
                             "up": {"block_n": 64, "block_k": 64, "num_warps": 8, "num_stages": 3},
                             "down": {"block_n": 64, "block_k": 64, "num_warps": 8, "num_stages": 3}}}}
    (tmp_path / "Imaginary_GPU_9001.json").write_text(json.dumps(table))
    monkeypatch.setattr(mc, "CONFIG_DIR", tmp_path)
    mc._load.cache_clear()
    try:
        got = moe_launch_config("Imaginary GPU 9001", "int4", 512)
        assert got.join and got.block_m == 64 and got.up.num_warps == 8
    finally:
        monkeypatch.undo()
        mc._load.cache_clear()
    assert moe_launch_config("NVIDIA H200", "int4", 512).join is None
