"""The token embedding table in host memory: the GPU gathers one row per token from it (kernels/host_rows.py),
so the card holds none of it; the plan, info and the stats count it as host memory."""
from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from engine.checkpoint.plan import embedding_bytes, resident_bytes
from engine.config import EngineConfig
from engine.errors import ConfigError
from engine.memory import plan_memory
from kernels.host_rows import gather_rows, gather_rows_ref
from main import main
from tiny_models import build_tiny_model

PROMPT = [1, 5, 77, 300, 12, 9, 400, 33, 41, 7, 250, 18]


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("emb") / "src", "qwen3_moe", tie_word_embeddings=False)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("width", [64, 1536])           # one block a row, and rows of several blocks
def test_the_gather_kernel_reads_the_rows_asked_for(dtype, width):
    g = torch.Generator().manual_seed(0)
    table = torch.randn(300, width, generator=g).to(dtype)
    ids = torch.tensor([0, 299, 17, 17, 150], dtype=torch.int64)
    assert torch.equal(gather_rows(table, ids), gather_rows_ref(table, ids))
    assert torch.equal(gather_rows(table, ids.to(torch.int32)), table[ids])
    assert gather_rows(table, ids[:0]).shape == (0, width)


def test_the_gather_kernel_refuses_a_table_it_cannot_index():
    with pytest.raises(ValueError, match="contiguous"):
        gather_rows(torch.zeros(8, 4).t(), torch.zeros(2, dtype=torch.int64))


def test_a_model_reading_its_embeddings_through_the_kernel_scores_and_generates_the_same(src):
    llm = LLM(str(src), device="cpu")
    greedy = SamplingParams(max_tokens=8, temperature=0)
    want_logits = llm.score(PROMPT)
    want = llm.generate([PROMPT], greedy)[0].token_ids
    w = llm.engine.loaded.weights
    before = w.resident_bytes()
    w.embed_on_host = True           # what a CUDA load with the table in host memory runs
    assert torch.equal(llm.score(PROMPT), want_logits)
    assert llm.generate([PROMPT], greedy)[0].token_ids == want
    assert w.resident_bytes() == before - w.embed.numel() * w.embed.element_size()
    llm.close()


def test_the_plan_gives_the_tables_room_to_the_pool_and_counts_it_on_the_host(src):
    from engine.checkpoint.spec import read_spec
    spec = read_spec(src)
    table = embedding_bytes(spec, 2)
    on_card, off_card = resident_bytes(spec, 2), resident_bytes(spec, 2, embed_on_host=True)
    assert on_card - off_card == table == spec.vocab_size * spec.hidden * 2
    budget = on_card + (1 << 30) + 4096 * 1024 + (2 * 100 + 5000) * table + table // 2   # 5000 slots with the table
    p = plan_memory(off_card, table, 10_000, 1024, budget, experts_per_layer=100, host_resident_bytes=table)
    q = plan_memory(on_card, table, 10_000, 1024, budget, experts_per_layer=100)
    room = lambda m: m.pool_bytes + m.staging_bytes + m.kv_bytes      # noqa: E731
    assert p.pool_slots == q.pool_slots + 1 and room(p) - room(q) == table   # an expert the size of the table
    assert p.host_resident_bytes == table
    assert any("the embedding table" in line for line in p.format())


def test_info_plans_the_table_on_the_host_when_experts_are_offloaded(src, capsys):
    def plan_of(*flags):
        assert main(["info", "--model", str(src), "--gpu-memory-budget", "4G", *flags]) == 0
        out = capsys.readouterr().out
        return next(line for line in out.splitlines() if line.startswith("resident weights")), \
            next(line for line in out.splitlines() if line.startswith("host store"))
    resident_all, host_all = plan_of()                                  # every expert fits: the table stays
    resident_off, host_off = plan_of("--expert-pool-size", "0")
    resident_dev, host_dev = plan_of("--expert-pool-size", "0", "--embeddings", "device")
    assert "embedding table" not in host_all and "embedding table" not in host_dev
    assert "embedding table" in host_off
    assert resident_all == resident_dev != resident_off


def test_the_setting_is_checked_and_ignored_where_it_cannot_apply(src):
    with pytest.raises(ConfigError, match="embeddings='gpu' is not supported; choose one of auto, device, host"):
        EngineConfig(model=str(src), embeddings="gpu")
    llm = LLM(str(src), device="cpu", embeddings="host")      # on the CPU the table is in host memory anyway
    assert not llm.engine.loaded.weights.embed_on_host
    assert not any("embeddings" in note for note in llm.engine.loaded.notes)
    llm.close()


def _info_fits(src, budget: int, *flags: str) -> tuple[bool, str]:
    import contextlib
    import io
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["info", "--model", str(src), "--gpu-memory-budget", str(budget), *flags])
    return rc == 0, out.getvalue() + err.getvalue()


def smallest_info_budget(src, *flags: str) -> int:
    """The smallest GPU budget in bytes that ``info`` plans the model into with ``flags``."""
    lo, hi = 1 << 20, 1 << 36
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if _info_fits(src, mid, *flags)[0] else (mid, hi)
    return hi


def test_info_plans_a_model_that_fits_only_with_the_table_in_host_memory(tmp_path):
    # a table larger than the staging slots and the KV cache: without it the resident weights fit
    src = build_tiny_model(tmp_path / "wide", "qwen3_moe", tie_word_embeddings=False, vocab_size=32768)
    budget = smallest_info_budget(src, "--embeddings", "host")
    ok, out = _info_fits(src, budget)
    assert ok, out
    assert "the embedding table" in next(line for line in out.splitlines() if line.startswith("host store"))
    ok, out = _info_fits(src, budget, "--embeddings", "device")
    assert not ok and "the resident weights" in out and "--gpu-memory-budget" in out
