"""How a replayed decode step stages its inputs (``DecodeGraphs._load``), checked on the CPU.

The recorded graphs read fixed buffers; each step writes its rows into page-locked staging and copies
it over. Padding rows must point at the scratch block with context length 1, and a table row shorter
than one staged earlier must not keep that row's old block ids past its end.
"""
from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

import engine.cuda_graphs as cg
from engine.cuda_graphs import DecodeGraphs, DecodeInputs

SCRATCH, BLOCK = 99, 4


def _graphs(max_batch: int, max_blocks: int) -> DecodeGraphs:
    model = SimpleNamespace(device=torch.device("cpu"))
    return DecodeGraphs(model, SimpleNamespace(block_size=BLOCK), max_batch, max_blocks, SCRATCH)


def _expected(inp: DecodeInputs, n: int, max_blocks: int):
    b = len(inp.ids)
    pad = n - b
    ids = inp.ids + [0] * pad
    pos = inp.positions + [0] * pad
    slots = inp.slots + [SCRATCH * BLOCK] * pad
    tables = [t + [SCRATCH] * (max_blocks - len(t)) for t in inp.tables] + [[SCRATCH] * max_blocks] * pad
    return ids, pos, slots, tables, inp.lens + [1] * pad, [False] * b + [True] * pad


@pytest.mark.parametrize("whole", [True, False])
def test_steps_of_changing_batch_and_width_stage_exactly_their_rows(monkeypatch, whole) -> None:
    monkeypatch.setattr(cg, "WHOLE_TABLES_MAX", 1 << 20 if whole else 0)   # one copy, or tables and lengths apart
    max_batch, max_blocks = 8, 12
    g = _graphs(max_batch, max_blocks)
    rng = random.Random(0)
    for step in range(40):
        b = rng.randint(1, max_batch)
        n = g.bucket(b)
        tables = [[rng.randrange(SCRATCH) for _ in range(rng.randint(1, max_blocks if step % 7 else 2))]
                  for _ in range(b)]
        inp = DecodeInputs(ids=[rng.randrange(1000) for _ in range(b)], positions=[rng.randrange(50) for _ in range(b)],
                           slots=[rng.randrange(400) for _ in range(b)], tables=tables,
                           lens=[rng.randint(1, 48) for _ in range(b)])
        g._load(inp, b, n)
        ids, pos, slots, want_tables, lens, pad = _expected(inp, n, max_blocks)
        assert g.ids[:n].tolist() == ids and g.positions[:n].tolist() == pos and g.slots[:n].tolist() == slots
        assert g.tables[:n].tolist() == want_tables, step
        assert g.lens[:n].tolist() == lens and g.pad[:n].tolist() == pad


def test_recordings_share_one_side_stream_per_card_and_take_turns(monkeypatch) -> None:
    # Every recording of a card warms up and captures on one stream (cuBLAS keeps a workspace per
    # stream for the process's life); engines recording at once from two threads take turns on it.
    import threading
    import time

    import torch

    import engine.cuda_graphs as graphs
    made = []
    monkeypatch.setattr(torch.cuda, "Stream", lambda device: made.append(device) or object())
    monkeypatch.setattr(graphs, "_CAPTURE_STREAMS", {})
    with graphs.capture_stream(torch.device("cuda", 0)) as a:
        pass
    with graphs.capture_stream(torch.device("cuda", 0)) as again, graphs.capture_stream(torch.device("cuda", 1)) as b:
        assert again is a and b is not a
    assert made == [torch.device("cuda", 0), torch.device("cuda", 1)]
    order = []

    def record(name: str) -> None:
        with graphs.capture_stream(torch.device("cuda", 0)):
            order.append(f"{name} in")
            time.sleep(0.05)
            order.append(f"{name} out")

    threads = [threading.Thread(target=record, args=(n,)) for n in "xy"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert order in (["x in", "x out", "y in", "y out"], ["y in", "y out", "x in", "x out"])
