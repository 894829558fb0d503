"""Batch building, once for every kind of forward: decode, prefill (chunks of prompts), scoring, and the
host inputs of a replayed decode graph.

Dimensions: ``T`` new tokens of the step, ``B`` sequences, ``B'`` rows whose logits are needed,
``nb`` blocks of the longest block table.

A step's sequences arrive as :class:`SeqPart` (the new tokens, where they start, the block tables);
:func:`build_batch` turns them into one :class:`ForwardBatch` with a slot mapping per block group (the
full-attention pool, and the sliding-window pool when the cache has one).
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

import torch

from engine.cuda_graphs import DecodeInputs
from engine.models.layers import SeqSlice
from engine.models.moe_transformer import DecodeMeta, ForwardBatch


@dataclass(frozen=True)
class SeqPart:
    """One sequence's share of a forward: ``ids`` at positions ``start``, ``start + 1``, ...."""

    ids: list[int]                 # the new tokens
    start: int                     # position of the first (tokens already in the cache)
    blocks: list[int]              # block table in the full-attention pool
    window_blocks: list[int]       # block table in the sliding-window pool ([] without one)
    samples: bool = False          # its last token's logits are needed (a step that samples it)


@dataclass(frozen=True)
class BatchParts:
    """What :func:`build_batch` was given besides the device: enough to build the batch again elsewhere."""

    parts: tuple[SeqPart, ...]
    decode: bool = False
    every_row: bool = False

    def build(self, block_size: int, device: torch.device, windowed: bool) -> ForwardBatch:
        return build_batch(list(self.parts), block_size, device, windowed, self.decode, self.every_row)

    @property
    def num_tokens(self) -> int:
        return sum(len(p.ids) for p in self.parts)


def slot_of(table: list[int], pos: int, block_size: int) -> int:
    """The cache row of position ``pos`` of a sequence whose block table is ``table``."""
    return table[pos // block_size] * block_size + pos % block_size


def group_inputs(tables: list[list[int]], starts: list[int], lens: list[int], block_size: int,
                 device: torch.device, slices: bool = True) -> tuple[torch.Tensor, list[SeqSlice]]:
    """One block group's share of a batch whose sequence ``i`` adds ``lens[i]`` tokens from position
    ``starts[i]`` on: the cache row of every new token (slot mapping [T] int64) and, with ``slices``,
    the sequences' slices over their block ``tables`` in that group (a decode step needs none)."""
    slots: list[int] = []
    seqs: list[SeqSlice] = []
    for table, start, n in zip(tables, starts, lens):
        if slices:
            seqs.append(SeqSlice(len(slots), n, start + n, torch.tensor(table, dtype=torch.int64, device=device)))
        slots += [slot_of(table, p, block_size) for p in range(start, start + n)]
    return torch.tensor(slots, dtype=torch.int64, device=device), seqs


def decode_meta(tables: list[list[int]], starts: list[int], device: torch.device) -> DecodeMeta:
    """Block tables [B, nb] int32 (padded with block 0) and context lengths [B] int32 of a decode step in
    one block group; sequence ``i`` adds its one token at position ``starts[i]``."""
    width = max(len(t) for t in tables)
    padded = [t + [0] * (width - len(t)) for t in tables]
    return DecodeMeta(torch.tensor(padded, dtype=torch.int32, device=device),
                      torch.tensor([p + 1 for p in starts], dtype=torch.int32, device=device))


def build_batch(parts: list[SeqPart], block_size: int, device: torch.device, windowed: bool,
                decode: bool = False, every_row: bool = False) -> ForwardBatch:
    """The forward's inputs for ``parts``, in their order.

    ``decode``: every part adds one token, so the batch carries decode metadata and no slices.
    ``every_row``: logits of every new token (scoring); else of the sampling parts' last tokens only
    (a decode step's rows are all of them: ``logits_rows`` None). ``windowed``: the cache keeps its
    sliding-window layers in a pool of their own, so the batch carries that group as ``window``.
    """
    ids = [t for p in parts for t in p.ids]                                      # [T]
    positions = [q for p in parts for q in range(p.start, p.start + len(p.ids))]  # [T]
    as_t = lambda xs: torch.tensor(xs, dtype=torch.int64, device=device)        # noqa: E731
    starts, lens = [p.start for p in parts], [len(p.ids) for p in parts]
    ids_t, pos_t = as_t(ids), as_t(positions)
    rows_t = None if decode or every_row else \
        as_t([end - 1 for end, p in zip(accumulate(lens), parts) if p.samples])  # [B'] last rows of sampling parts

    def group(tables: list[list[int]], window: ForwardBatch | None = None) -> ForwardBatch:
        slots, seqs = group_inputs(tables, starts, lens, block_size, device, slices=not decode)
        meta = decode_meta(tables, starts, device) if decode else None
        return ForwardBatch(ids_t, pos_t, slots, seqs, rows_t, meta, window=window)

    window = group([p.window_blocks for p in parts]) if windowed else None
    batch = group([p.blocks for p in parts], window)
    batch.parts = BatchParts(tuple(parts), decode, every_row)
    return batch


def decode_inputs(parts: list[SeqPart], block_size: int, windowed: bool) -> DecodeInputs:
    """The host side of a decode step (each part adds one token) for a recorded graph's replay."""
    inp = DecodeInputs([], [], [], [], [])
    for part in parts:
        p = part.start
        inp.ids.append(part.ids[0])
        inp.positions.append(p)
        inp.slots.append(slot_of(part.blocks, p, block_size))
        inp.tables.append(part.blocks)
        inp.lens.append(p + 1)
        if windowed:
            inp.window_slots.append(slot_of(part.window_blocks, p, block_size))
            inp.window_tables.append(part.window_blocks)
    return inp
