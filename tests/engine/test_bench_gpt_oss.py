"""benchmarks/bench_gpt_oss.py --tiny: every cell end to end on the CPU (float32 resident weights, MXFP4
experts), and the random gpt-oss models it builds: experts drawn as MXFP4 bytes straight into the host
store, with the weight spread asked for, and a trained-like routing that is skewed where the uniform one
is not."""
from __future__ import annotations

import json

import torch

from benchmarks import bench_gpt_oss as bench
from benchmarks.gpt_oss_shapes import HostRows, RandomGptOss, make_routing
from kernels.quant.mxfp4 import dequantize_mxfp4


def test_tiny_run_measures_cells_a_and_b_and_keeps_an_existing_result(tmp_path):
    out = tmp_path / "gpt_oss.json"
    out.write_text("an earlier result")
    bench.main(["--tiny", "--cells", "a,b", "--out", str(out)])
    assert out.read_text() == "an earlier result"                  # never overwritten: a fresh name instead
    doc = json.loads((tmp_path / "gpt_ossb.json").read_text())
    assert doc["environment"]["commit"] and doc["ceilings"]["pinned_h2d_gbs"] > 0
    rows = bench.all_rows(doc)
    assert [r for r in rows if "tok_s" not in r] == []            # no failed or skipped row
    assert all(r["tok_s"] > 0 and r["tokens"] > 0 for r in rows)

    a = [r for r in rows if r["cell"] == "a"]
    assert [r["routing"] for r in a] == ["uniform", "trained-like"]
    for r in a:
        assert r["config"] == "every expert resident" and r["build"]["expert_format"] == "mxfp4"
        assert r["bytes_per_token"] > r["build"]["expert_bytes"] and 0 < r["fraction_of_roofline"]
        assert r["roofline_tok_s"] == doc["ceilings"]["device_copy_gbs"] * 1e9 / r["bytes_per_token"]

    b = [r for r in rows if r["cell"] == "b"]
    assert sorted((r["routing"], r["batch"]) for r in b) == [(ro, n) for ro in ("trained-like", "uniform")
                                                             for n in (1, 4, 16)]
    for r in b:
        assert 0 <= r["hit_rate"] < 1 and r["h2d_bytes_per_token"] > 0          # half the experts on the "GPU"
        assert r["bus_limit_tok_s"] == doc["ceilings"]["pinned_h2d_gbs"] * 1e9 / r["h2d_bytes_per_token"]
        # the bus and the CPU kernels together: the CPU's rate is its experts' bytes over its kernels' time
        moved = r["h2d_bytes_per_token"] + r["cpu_bytes_per_token"]
        cpu = r["cpu_kernel_gb_s"] or 0.0
        assert r["combined_limit_tok_s"] == (doc["ceilings"]["pinned_h2d_gbs"] + cpu) * 1e9 / moved
        assert r["fraction_of_combined_limit"] == r["tok_s"] / r["combined_limit_tok_s"]
        assert (r["cpu_bytes_per_token"] > 0) == (r["cpu_experts_per_token"] > 0) == (cpu > 0)

    blocks = doc["120b"]
    assert blocks["trained-like"]["engine_top10_share"] > blocks["uniform"]["engine_top10_share"] + 0.05
    bias = {routing: blocks[routing]["build"]["routing"]["bias_scale"] for routing in blocks}
    assert bias["uniform"] == 0 < bias["trained-like"]


def test_the_ladder_adds_one_setting_per_rung(tmp_path):
    doc = bench.main(["--tiny", "--cells", "c", "--out", str(tmp_path / "r.json")])
    ladder = doc["120b"]["trained-like"]["ladder"]
    assert [r["rung"] for r in ladder] == [1, 2, 3, 4, 5, 6, 7] and all("tok_s" in r for r in ladder)
    cfg = [r["engine_config"] for r in ladder]
    assert (cfg[0]["expert_pool_size"], cfg[0]["prefetch_depth"], cfg[0]["expert_reads"]) == (0, 0, "copy")
    assert [c["cold_experts"] for c in cfg] == ["bus"] * 6 + ["auto"]     # the article's rungs use the bus only
    assert cfg[0]["prefill_chunk"] == 64 and cfg[0]["max_batch_tokens"] == 16 * 64      # prompts prefilled whole
    pool = doc["120b"]["trained-like"]["build"]["expert_bytes"] * 32                     # 50% of 4 x 16 experts
    assert cfg[1]["expert_pool_size"] == pool and cfg[1]["prefetch_depth"] == 0
    assert cfg[2]["prefetch_depth"] == 2 and cfg[2]["expert_reads"] == "copy"
    assert cfg[3]["expert_reads"] == "auto" and cfg[4] == cfg[3]     # no CUDA graphs on the CPU: nothing to add
    assert ladder[4]["unavailable"]["cuda_graphs"] == "CUDA graphs need a CUDA GPU"
    assert (cfg[5]["prefill_chunk"], cfg[5]["max_batch_tokens"]) == (48, None)
    assert {r["moe_kernels"] for r in ladder} == {"torch reference"}   # the CPU has no Triton MoE to switch to
    assert ladder[-1]["last_over_first"] == ladder[-1]["tok_s"] / ladder[0]["tok_s"]
    assert ladder[-1]["article_last_over_first"] == ladder[5]["tok_s"] / ladder[0]["tok_s"]
    assert doc["summary"]["ladder_article_last_over_first"] == ladder[-1]["article_last_over_first"]


def test_experts_land_in_the_host_store_as_the_mxfp4_bytes_drawn():
    args = bench.parse(["--tiny"])
    run = bench.Run("cpu", 1.0, 1.0, HostRows(torch.device("cpu")))
    engine, facts = bench.build("tiny-120b", "uniform", args, run, max_batch=2, resident=False)
    try:
        m = engine.loaded
        E, layout = m.spec.num_experts, m.layout
        routing = make_routing("uniform", m.spec, layout, torch.device("cpu"))
        again = torch.empty(E, layout.nbytes, dtype=torch.uint8)
        RandomGptOss(m.spec, layout, routing, torch.device("cpu"), torch.float32, args.seed).read_experts(1, again)
        assert torch.equal(m.experts.store.rows[E:2 * E], again)       # MoE layer 1's rows, byte for byte
        assert not torch.equal(m.experts.store.rows[:E], again)
        views = layout.views(again)
        assert int(views["w13_scale"].max()) < 255                       # 255 is e8m0's NaN
        w = torch.cat([dequantize_mxfp4(views["w13"][e], views["w13_scale"][e]).flatten() for e in range(E)])
        assert abs(float(w.pow(2).mean().sqrt()) / routing.weight_std - 1) < 0.05
        assert facts["expert_format"] == "mxfp4" and not facts["experts_resident"]
    finally:
        engine.close()


def test_the_gemv16_probe_lists_the_one_token_matrices_and_puts_the_kernel_back(tmp_path):
    import kernels.qlinear as q
    from benchmarks import gemv16_probe
    before = q.gemv16_fits, q.gemv16, q.GEMV16
    seen = gemv16_probe.main([str(tmp_path / "probe.json"), "--tiny"])
    routers = [k for k in seen if isinstance(k, tuple) and k[1][0] == 8]       # tiny-20b: 8 experts a router
    assert routers and all(k[0] is False and k[5] is False for k in routers)   # on the CPU: never the kernel
    assert seen["gemv16 calls"] == 0
    assert (q.gemv16_fits, q.gemv16, q.GEMV16) == before


def test_variants_change_only_tunings_read_at_every_step_and_keep_the_defaults_row(capsys):
    # --variants A/Bs residency tunings on one engine: only fields read at every step are taken (a field
    # read when the manager is made would label rows that measured the defaults), a flag is 1 or 0, and
    # the defaults are among them (the summary's targets are their rows)
    import pytest
    args = bench.parse(["--tiny", "--variants", "defaults,fill_share=0.5:end_late=1"])
    assert args.variants == [("defaults", {}), ("fill_share=0.5:end_late=1", {"fill_share": 0.5, "end_late": True})]
    for bad, says in (("defaults,gather_min_uses=2", "a tuning read at every step"),
                      ("defaults,end_late=maybe", "give 1 or 0"), ("fill_share=0.5", "name 'defaults'"),
                      ("defaults,fill_share=2", "fill share 2.0")):
        with pytest.raises(SystemExit):
            bench.parse(["--tiny", "--variants", bad])
        assert says in capsys.readouterr().err
