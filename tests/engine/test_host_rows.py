"""The host store's rows: large ones on transparent huge pages (2 MiB aligned, alive as long as a view
of them is), small ones and those asked for on ordinary pages from the ordinary allocator."""
from __future__ import annotations

import gc
import sys

import pytest
import torch

import engine.experts.store as store_mod
from engine.experts.store import (HUGE_MIN_BYTES, HUGE_PAGE, HostExpertStore, host_rows, huge_page_bytes,
                                  mapping_field)
from kernels.expert_layout import ExpertLayout

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="transparent huge pages are Linux's")


def _thp_mode() -> str | None:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return f.read().split("[")[1].split("]")[0]
    except (OSError, IndexError):
        return None


@linux
def test_large_rows_are_aligned_to_a_huge_page_and_outlive_the_call():
    rows = host_rows(HUGE_MIN_BYTES // (1 << 20), 1 << 20)
    assert rows.shape == (HUGE_MIN_BYTES // (1 << 20), 1 << 20) and rows.dtype == torch.uint8
    assert rows.is_contiguous() and rows.data_ptr() % HUGE_PAGE == 0
    first, last = rows[0], rows[-1]
    del rows
    gc.collect()
    # the mapping stays while views of it live: they can still be written and read back
    first.fill_(7)
    last.copy_(torch.arange(last.numel(), dtype=torch.int64).to(torch.uint8))
    assert int(first.sum()) == 7 * first.numel()
    assert torch.equal(last[:300], torch.arange(300, dtype=torch.int64).to(torch.uint8))


@linux
def test_touched_rows_are_asked_for_on_huge_pages_and_counted_within_their_size():
    rows = host_rows(HUGE_MIN_BYTES // (1 << 20), 1 << 20)
    rows.fill_(1)
    if _thp_mode() in ("always", "madvise"):
        assert "hg" in mapping_field(rows, "VmFlags")              # madvise(MADV_HUGEPAGE) took: the kernel may use them
    # how many it got depends on the kernel's free huge pages; never more than the rows' own mapping
    assert 0 <= huge_page_bytes(rows) <= rows.untyped_storage().nbytes()


def test_small_rows_and_ordinary_pages_come_from_the_ordinary_allocator(monkeypatch):
    small = host_rows(4, 1024)
    assert small.shape == (4, 1024) and small.untyped_storage().nbytes() == 4 * 1024
    monkeypatch.setattr(store_mod, "HOST_HUGE_PAGES", False)
    big = host_rows(HUGE_MIN_BYTES // 4096, 4096)
    assert big.untyped_storage().nbytes() == HUGE_MIN_BYTES      # torch's own storage, not a mapping's view
    if sys.platform.startswith("linux"):                            # asked for: a view into a mapping one page larger
        mapped = host_rows(HUGE_MIN_BYTES // 4096, 4096, huge_pages=True)
        assert mapped.untyped_storage().nbytes() == HUGE_MIN_BYTES + HUGE_PAGE


def test_a_store_allocated_on_huge_pages_keeps_what_is_written_and_says_where_it_lies(monkeypatch):
    layout = ExpertLayout.make("bf16", 64, 32)
    monkeypatch.setattr(store_mod, "HUGE_MIN_BYTES", 1)         # a tiny store takes the huge-page path too
    store = HostExpertStore.allocate(2, 3, layout, pin=False)
    assert store.rows.data_ptr() % HUGE_PAGE == 0 or not sys.platform.startswith("linux")
    packed = torch.arange(layout.nbytes, dtype=torch.int64).to(torch.uint8)
    store.write(1, 2, packed)
    assert torch.equal(store.layer_rows(1)[2], packed)
    line = store.describe()
    assert line.startswith("host store: 2 x 3 experts") and "pageable" in line


def _rss_mib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) // 1024 for line in f if line.startswith("VmRSS"))


@linux
def test_the_memory_goes_back_once_the_last_view_is_dropped():
    gc.collect()                                     # earlier tests' garbage goes now, not inside the window
    before = _rss_mib()
    rows = host_rows(2 * HUGE_MIN_BYTES // (1 << 20), 1 << 20)
    rows.fill_(1)
    view = rows[5]
    held = _rss_mib()
    assert held - before >= 96                       # 128 MiB written
    del rows
    gc.collect()
    assert _rss_mib() >= held - 16                    # a view still holds the mapping
    del view
    gc.collect()
    assert _rss_mib() <= before + 16


def test_a_model_loaded_onto_mapped_rows_answers_as_on_ordinary_ones(tmp_path, monkeypatch):
    """The loader's rows (every routed expert) from the huge-page mapping: the same scores and tokens."""
    from engine import LLM
    from parallel_helpers import GREEDY, OPTIONS, PROMPTS
    from tiny_models import build_tiny_model
    folder = build_tiny_model(tmp_path / "m", "qwen3_moe")
    options = dict(OPTIONS, expert_pool_size="50%")               # a pool over the host store's rows
    with LLM(str(folder), **options) as llm:
        want = (llm.engine.score_batch(PROMPTS), [o.token_ids for o in llm.generate(PROMPTS, GREEDY)])
    monkeypatch.setattr(store_mod, "HUGE_MIN_BYTES", 1)
    with LLM(str(folder), **options) as llm:
        rows = llm.engine.loaded.experts.store.rows
        assert rows.data_ptr() % HUGE_PAGE == 0 or not sys.platform.startswith("linux")
        got = (llm.engine.score_batch(PROMPTS), [o.token_ids for o in llm.generate(PROMPTS, GREEDY)])
    assert all(torch.equal(a, b) for a, b in zip(want[0], got[0])) and want[1] == got[1]
