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
    mc.table_name.cache_clear()
    try:
        got = moe_launch_config("Imaginary GPU 9001", "int4", 512)
        assert got.join and got.block_m == 64 and got.up.num_warps == 8
    finally:
        monkeypatch.undo()
        mc._load.cache_clear()
        mc.table_name.cache_clear()
    assert moe_launch_config("NVIDIA H200", "int4", 512).join is None


def test_a_card_without_its_own_table_reads_a_sibling_of_the_same_model():
    # Other H100 and H200 boards run the same chip as the tuned ones: they take those tables (with
    # overlapping int4 launches) rather than default.json's; a name whose model word has no tuned
    # sibling, or that names no model, keeps default.json.
    from kernels.moe_config import table_name
    assert table_name("NVIDIA H100 80GB HBM3") == "NVIDIA_H100_80GB_HBM3.json"
    assert table_name("NVIDIA H100 PCIe") == "NVIDIA_H100_80GB_HBM3.json"
    assert table_name("NVIDIA H200 NVL") == "NVIDIA_H200.json"
    assert moe_launch_config("NVIDIA H100 NVL", "int4", 1).pdl
    assert moe_launch_config("NVIDIA H100 NVL", "mxfp4", 1) == moe_launch_config("NVIDIA H100 80GB HBM3", "mxfp4", 1)
    assert table_name("NVIDIA H20") is None and table_name("NVIDIA GeForce RTX 4090") is None
    assert table_name("Imaginary GPU") is None
    assert not moe_launch_config("NVIDIA H20", "int4", 1).pdl           # default.json's setting


def test_every_committed_table_parses_and_covers_one_token_of_its_formats():
    # A tuned table is written by a sweep on the card (benchmarks/kernels/bench_moe.py, merge_tables.py):
    # each one must parse, and each format it names must have a decode setting for one token.
    import json

    from kernels.moe_config import CONFIG_DIR, _parse, _pick
    for path in sorted(CONFIG_DIR.glob("*.json")):
        table = json.loads(path.read_text())
        for fmt, buckets in table.items():
            for entry in buckets.values():
                _parse(entry)
            assert _parse(_pick(table, fmt, 1)).variant == "decode", (path.name, fmt)
