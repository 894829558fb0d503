"""The window layers' block group: out-of-reach blocks freed as sequences advance, a pool that never
runs out at ``max_batch``, window layers' KV stored at its real size, and generation unchanged by it."""
from __future__ import annotations

import dataclasses
import random
from types import SimpleNamespace

import pytest
import torch

from engine.checkpoint.spec import read_spec
from engine.cuda_graphs import DecodeGraphs, DecodeInputs
from engine.kv.blocks import BlockAllocator
from engine.kv.cache import KVCache
from engine.kv.sizing import (
    kv_sizing,
    window_blocks_per_seq,
    window_group,
    window_step_blocks,
)
from engine.kv.windows import WindowBlocks
from engine.request import Request, Status
from engine.sampling import SamplingParams
from engine.scheduler import Scheduler

BS = 4


def _reachable(table: list[int], w: WindowBlocks, num_computed: int, tokens: int) -> None:
    """Every position a query of the step (``num_computed .. tokens - 1``) can see has a real block;
    every freed entry holds only positions no such query sees."""
    first = max(0, num_computed - w.window + 1)                  # oldest key of the step's first query
    for b, block in enumerate(table):
        if block == w.placeholder:
            assert (b + 1) * BS <= first, (b, num_computed)
        else:
            assert 0 <= block < w.allocator.num_blocks
    assert len(table) * BS >= tokens
    assert all(table[p // BS] != w.placeholder for p in range(first, tokens))


@pytest.mark.parametrize("window,chunk", [(8, 1), (8, 4), (9, 3), (5, 16)])
def test_advancing_frees_exactly_the_blocks_out_of_reach(window, chunk):
    """Decode (chunk 1) and chunked prefill: freed entries form a prefix, nothing in reach is freed,
    and a sequence never holds more than its share of the pool."""
    w = WindowBlocks(window, 1, chunk, BS)
    assert w.allocator.num_blocks == w.blocks_for(chunk) + 1
    table: list[int] = []
    done = 0
    while done < 100:
        n = min(chunk, 100 - done)
        w.advance(table, done, done + n)
        _reachable(table, w, done, done + n)
        freed = w.out_of_reach(done)
        assert table[:freed] == [w.placeholder] * freed and w.placeholder not in table[freed:]
        assert w.held(table) == w.allocator.num_used <= w.blocks_for(n)
        done += n
        w.release(table, done)                                    # between steps
        assert w.held(table) <= w.per_seq - 1
    assert len(table) == 25 and w.held(table) < 25               # most of the context was given back
    w.free(table)
    assert table == [] and w.allocator.num_used == 0


def test_the_pool_bound_is_reached():
    """A window that straddles a block boundary needs the extra block the sizing adds."""
    w = WindowBlocks(8, 1, 4, BS)
    table: list[int] = []
    for done in range(9):                                         # decode to 9 tokens, then a chunk of 4
        w.advance(table, done, done + 1)
    w.advance(table, 9, 13)                                       # keys 2..12: blocks 0..3
    assert w.held(table) == w.blocks_for(4) == 4 and window_blocks_per_seq(8, BS) == 4
    w.advance(table, 13, 14)                                      # key 6 on: block 0 is out of reach
    assert table[0] == w.placeholder and w.held(table) == 3
    w.release(table, 14)                                          # 7 keys 7..13 over blocks 1..3
    assert w.held(table) == 3 == w.per_seq - 1


def _step(sched: Scheduler, rng: random.Random) -> list:
    """One engine step without a model: every scheduled token is computed, samplers get a token."""
    out = sched.schedule()
    for s in out.seqs:
        s.request.num_computed += s.num_new
    for s in out.seqs:
        req = s.request
        if s.samples:
            req.output_ids.append(rng.randrange(100))
            if len(req.output_ids) >= req.params.max_tokens:
                req.status = Status.FINISHED
                sched.remove(req)
    return out.seqs


def _check_groups(sched: Scheduler, reqs: list[Request], chunk: int) -> None:
    w = sched.windows
    for r in reqs:
        if r in sched.running:
            _reachable(r.window_blocks, w, r.num_computed, r.num_computed)
            assert w.held(r.window_blocks) <= w.blocks_for(chunk)
        else:
            assert r.blocks == [] and r.window_blocks == []        # waiting, preempted or finished: nothing held
    held = [b for r in sched.running for b in r.window_blocks if b != w.placeholder]
    assert len(held) == len(set(held)) == w.allocator.num_used
    full = [b for r in sched.running for b in r.blocks]
    assert len(full) == len(set(full)) == sched.allocator.num_used


@pytest.mark.parametrize("seed", range(6))
def test_scheduler_frees_both_groups_and_the_window_pool_never_runs_out(seed):
    """Random prompts, budgets and a full pool small enough to preempt: at max_batch the window pool
    suffices every step, running requests hold what their queries need, the others hold nothing."""
    rng = random.Random(seed)
    max_batch, chunk, window, budget = 4, rng.choice([3, 4, 8]), rng.choice([5, 8, 12]), rng.choice([6, 9, 32])
    windows = WindowBlocks(window, max_batch, budget, BS)
    sched = Scheduler(BlockAllocator(rng.choice([12, 20, 60]), BS), max_batch, budget, chunk, windows)
    reqs = [Request(f"r{i}", [1] * rng.randint(1, 30), SamplingParams(max_tokens=rng.randint(1, 20)), 512)
            for i in range(10)]
    for r in reqs:
        sched.add(r)
    most = 0
    for _ in range(2000):
        if not sched.has_unfinished():
            break
        _step(sched, rng)
        _check_groups(sched, reqs, chunk)
        most = max(most, windows.allocator.num_used)
    assert not sched.has_unfinished()
    assert windows.allocator.num_used == 0 and sched.allocator.num_used == 0
    assert windows.allocator.num_blocks == max_batch * windows.per_seq + window_step_blocks(budget, BS) >= most


def test_preemption_frees_the_window_table():
    windows = WindowBlocks(8, 2, 4, BS)
    sched = Scheduler(BlockAllocator(6, BS), 2, 8, 4, windows)
    a, b = (Request(n, [1] * 12, SamplingParams(max_tokens=30), 512) for n in "ab")
    sched.add(a)
    sched.add(b)
    rng = random.Random(0)
    while sched.preemptions == 0:
        _step(sched, rng)
    victim = next(r for r in (a, b) if r.status == Status.WAITING)
    assert victim.window_blocks == [] and victim.blocks == [] and victim.num_computed == 0
    assert windows.allocator.num_used == sum(windows.held(r.window_blocks) for r in sched.running)


def _spec(tmp_path, windows: tuple[int, ...]):
    from tiny_models import family_configs
    cfg = family_configs()["qwen3_moe"]
    cfg.architectures = ["Qwen3MoeForCausalLM"]
    cfg.save_pretrained(tmp_path)
    return dataclasses.replace(read_spec(tmp_path), layer_windows=windows)


def test_cache_stores_window_layers_at_their_real_size(tmp_path):
    """Window layers' rows are the window pool's; bytes agree with the sizing used for the plan."""
    spec = _spec(tmp_path, (8, 0, 8))
    z = kv_sizing(spec, torch.float32, "int8", 512, 3, 4, BS)
    assert (z.windowed, z.window, z.full_layers, z.window_blocks_per_seq, z.window_step_blocks) == ((0, 2), 8, 1, 4, 1)
    w = WindowBlocks(z.window, 3, 4, BS)
    assert w.num_blocks == z.window_pool_blocks + 1
    cache = KVCache(spec.num_layers, 50, BS, spec.num_kv_heads, spec.head_dim, torch.float32, torch.device("cpu"),
                    "int8", window_layers=z.windowed, window_blocks=w.num_blocks)
    assert [cache.k[i].shape[0] for i in range(3)] == [w.num_blocks * BS, 50 * BS, w.num_blocks * BS]
    assert cache.windowed(0) and not cache.windowed(1) and cache.k_scale[2].shape[0] == w.num_blocks * BS
    assert cache.nbytes == 50 * BS * z.bytes_per_token + z.window_pool_bytes
    assert cache.window_nbytes == z.window_pool_bytes
    k = torch.randn(3, spec.num_kv_heads, spec.head_dim)
    cache.write(2, torch.tensor([0, 5, w.num_blocks * BS - 1]), k, k)
    cache.convert("auto")                                          # each group's rows survive a format change
    got, _ = cache.gather(2, torch.tensor([0, 5, w.num_blocks * BS - 1]))
    assert (got - k).norm() / k.norm() < 0.01 and cache.k[2].shape[0] == w.num_blocks * BS


def test_no_window_group_when_there_is_nothing_to_save(tmp_path):
    spec = _spec(tmp_path, ())
    assert window_group(spec, 512, BS) == ((), 0)
    z = kv_sizing(spec, torch.bfloat16, "auto", 512, 8, 64, 16)
    assert z.window_pool_bytes == 0 and z.bytes_per_token == KVCache.bytes_per_token(3, 2, 24, torch.bfloat16)
    long = dataclasses.replace(spec, layer_windows=(500, 0, 500))  # a window about as long as the context
    assert window_group(long, 512, 16) == ((), 0)
    assert window_group(long, 4096, 16) == ((0, 2), 500)


def test_decode_graph_inputs_carry_both_groups():
    """Padding rows and table tails point at each group's own scratch block."""
    model = SimpleNamespace(device=torch.device("cpu"))
    g = DecodeGraphs(model, SimpleNamespace(block_size=BS), 4, 6, 99, window_scratch=7)
    inp = DecodeInputs([5, 6, 7], [9, 2, 14], [41, 10, 58], [[10, 2, 11], [2], [3, 4, 12, 14]], [10, 3, 15],
                       window_slots=[1, 8, 25], window_tables=[[7, 7, 0], [2], [7, 7, 4, 6]])
    g._load(inp, 3, 4)
    assert g.slots.tolist() == [41, 10, 58, 99 * BS] and g.window_slots.tolist() == [1, 8, 25, 7 * BS]
    assert g.tables[:, :4].tolist() == [[10, 2, 11, 99], [2, 99, 99, 99], [3, 4, 12, 14], [99] * 4]
    assert g.window_tables[:, :4].tolist() == [[7, 7, 0, 7], [2, 7, 7, 7], [7, 7, 4, 6], [7] * 4]
    assert g.lens.tolist() == [10, 3, 15, 1]
    batch = g._batch(3)
    assert batch.window.slot_mapping.tolist() == [1, 8, 25] and batch.window.decode.block_tables.shape == (3, 6)


def test_settings_raised_while_running_stay_within_the_window_pool():
    """A larger batch or step budget set live cannot outgrow the window pool sized at load."""
    windows = WindowBlocks(8, 2, 8, BS)
    sched = Scheduler(BlockAllocator(100, BS), 2, 8, 4, windows)
    sched.max_batch, sched.prefill_chunk, sched.token_budget = 8, 32, 64
    for i in range(5):
        sched.add(Request(f"r{i}", [1] * 40, SamplingParams(max_tokens=3), 512))
    out = sched.schedule()
    assert len(sched.running) == 1 and out.num_tokens == 8


# ---- end to end: a tiny model whose layers 0 and 2 have a window of 8 ---------------------------------

WINDOWS = (8, 0, 8)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from tiny_models import build_tiny_model
    return build_tiny_model(tmp_path_factory.mktemp("kvw") / "m", "qwen3_moe")


def _loaded(model_dir, **over):
    from engine.checkpoint.reader import SafetensorsReader
    from engine.config import EngineConfig
    from engine.loading import LoadedModel
    config = EngineConfig(model=str(model_dir), device="cpu", kv_block_size=BS, prefill_chunk=4, max_batch=3,
                          max_batch_tokens=8, **over)
    spec = dataclasses.replace(read_spec(model_dir), layer_windows=WINDOWS)
    return LoadedModel(config, spec, SafetensorsReader(model_dir), None)


def _wire(m, full_blocks: int, two_pools: bool) -> None:
    """Give ``m`` a cache of ``full_blocks`` blocks; with ``two_pools`` its window layers in their own pool."""
    from engine.runner import ModelRunner
    s, c = m.spec, m.config
    windows = WindowBlocks(8, c.max_batch, c.token_budget, BS) if two_pools else None
    m.cache = KVCache(s.num_layers, full_blocks + 1, BS, s.num_kv_heads, s.head_dim, m.dtype, m.device,
                      window_layers=(0, 2) if two_pools else (), window_blocks=windows.num_blocks if two_pools else 0)
    m.allocator = BlockAllocator(full_blocks, BS)
    m.scheduler = Scheduler(m.allocator, c.max_batch, c.token_budget, c.prefill_chunk, windows)
    m.runner = ModelRunner(m.model, m.cache)


def _generate(m, prompts: list[list[int]], max_tokens: int) -> tuple[list[list[int]], int]:
    """Greedy outputs of ``prompts`` run together, and the most window blocks freed at once."""
    from engine.engine import LLMEngine
    eng = LLMEngine(m.config, m)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    for i, p in enumerate(prompts):
        eng.add_request(f"r{i}", p, params)
    out: dict[str, list[int]] = {f"r{i}": [] for i in range(len(prompts))}
    w, freed = m.scheduler.windows, 0
    while eng.has_unfinished():
        for d in eng.step():
            out[d.request_id] += d.new_token_ids
        if w is not None:
            freed = max(freed, sum(r.window_blocks.count(w.placeholder) for r in m.scheduler.running))
    return [out[f"r{i}"] for i in range(len(prompts))], freed


@pytest.mark.parametrize("full_blocks", [200, 24])          # 24: too few for all three, so requests are preempted
def test_freeing_out_of_window_blocks_changes_no_token(model_dir, full_blocks):
    """Prompts longer than the window, chunked prefill, decode past it: the two-pool cache gives the
    same greedy tokens as one pool holding every layer's whole context, while giving blocks back."""
    rng = random.Random(1)
    prompts = [[rng.randrange(4, 500) for _ in range(n)] for n in (23, 9, 30)]
    m = _loaded(model_dir)
    assert m.model.w.layers[0].attn.window == 8 and m.model.w.layers[1].attn.window == 0
    _wire(m, full_blocks, two_pools=False)
    want, _ = _generate(m, prompts, 20)
    _wire(m, full_blocks, two_pools=True)
    got, freed = _generate(m, prompts, 20)
    assert got == want
    assert freed > 0 and m.scheduler.windows.allocator.num_used == 0 and m.allocator.num_used == 0
    assert (m.scheduler.preemptions > 0) == (full_blocks == 24)


def _load_builds_window_group() -> bool:
    from engine.loading import LoadedModel
    return "kv_sizing" in vars(LoadedModel)


@pytest.mark.skipif(not _load_builds_window_group(),
                    reason="the load path builds the window group once the patch in patch_H_loading.md is applied")
def test_a_loaded_window_model_has_two_pools_and_scores_as_one(model_dir):
    """Loading sizes the window pool from the spec; scoring a sequence longer than the window (in
    chunks that free blocks) gives the logits of a one-pool cache."""
    m = _loaded(model_dir)
    z = m.kv_sizing
    assert m.cache.window_blocks == m.windows.num_blocks == z.window_pool_blocks + 1 == 3 * 4 + 2 + 1
    assert m.cache.nbytes == (m.cache.num_blocks * BS) * z.bytes_per_token + z.window_pool_bytes
    ids = [random.Random(2).randrange(4, 500) for _ in range(30)]
    got = m.score([ids])[0]
    assert m.windows.allocator.num_used == 0 and m.allocator.num_used == 0
    _wire(m, 100, two_pools=False)
    m.windows = None
    want = m.score([ids])[0]
    assert torch.equal(got, want)
