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
