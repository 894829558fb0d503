"""The runner's batch building (one builder for decode, prefill and scoring) and its host staging.

Block size 4 throughout: position p of a sequence lives in cache row table[p // 4] * 4 + p % 4.
"""
from __future__ import annotations

import torch

from engine.runner import HostStaging, SeqPart, build_batch, decode_inputs

CPU = torch.device("cpu")


def _rows(t: torch.Tensor | None) -> list[int] | None:
    return None if t is None else t.tolist()


def test_a_mixed_step_samples_only_the_last_token_of_the_sequences_that_sample():
    prompt = SeqPart([11, 12, 13], start=0, blocks=[7], window_blocks=[], samples=True)    # a whole short prompt
    chunk = SeqPart([21, 22], start=3, blocks=[2, 5], window_blocks=[], samples=False)   # a prompt's middle chunk
    decode = SeqPart([31], start=6, blocks=[1, 3], window_blocks=[], samples=True)       # one decode token
    b = build_batch([prompt, chunk, decode], 4, CPU, windowed=False)
    assert b.input_ids.tolist() == [11, 12, 13, 21, 22, 31]
    assert b.positions.tolist() == [0, 1, 2, 3, 4, 6]
    assert b.slot_mapping.tolist() == [28, 29, 30, 11, 20, 14]        # chunk crosses from block 2 into block 5
    assert _rows(b.logits_rows) == [2, 5]                             # the middle chunk is not sampled
    assert [(s.q_start, s.q_len, s.ctx_len) for s in b.seqs] == [(0, 3, 3), (3, 2, 5), (5, 1, 7)]
    assert [s.block_table.tolist() for s in b.seqs] == [[7], [2, 5], [1, 3]]
    assert b.decode is None and b.window is None


def test_a_decode_step_carries_padded_tables_and_context_lengths_and_no_slices():
    parts = [SeqPart([5], start=4, blocks=[3, 8], window_blocks=[], samples=True),
             SeqPart([6], start=1, blocks=[9], window_blocks=[], samples=True)]
    b = build_batch(parts, 4, CPU, windowed=False, decode=True)
    assert b.decode.block_tables.tolist() == [[3, 8], [9, 0]]          # padded with block 0
    assert b.decode.block_tables.dtype == torch.int32
    assert b.decode.context_lens.tolist() == [5, 2]                    # including the new token
    assert b.slot_mapping.tolist() == [32, 37] and b.seqs == [] and b.logits_rows is None


def test_scoring_wants_every_row_and_a_window_pool_gets_its_own_slots():
    # a window table is indexed like the full one: block 9 (positions 0..3) may already be given back
    parts = [SeqPart([1, 2, 3], start=4, blocks=[0, 6], window_blocks=[9, 2], samples=False),
             SeqPart([4], start=0, blocks=[1], window_blocks=[5], samples=False)]
    b = build_batch(parts, 4, CPU, windowed=True, every_row=True)
    assert b.logits_rows is None and b.slot_mapping.tolist() == [24, 25, 26, 4]
    w = b.window
    assert w.slot_mapping.tolist() == [8, 9, 10, 20]                   # positions 4..6 in window block 2
    assert [s.block_table.tolist() for s in w.seqs] == [[9, 2], [5]]
    assert w.input_ids is b.input_ids and w.positions is b.positions  # one copy of the tokens for both groups


def test_without_copies_staging_hands_back_the_tensor_itself():
    staging = HostStaging(copies=False, pinned=False)
    t = torch.arange(5)
    assert staging.stage("tokens", t) is t and staging.buffer("tokens") is None
    staging.mark()
    staging.wait()                                    # nothing queued: returns at once


def test_staged_views_reuse_one_buffer_at_a_stable_address():
    staging = HostStaging(copies=True, pinned=False)
    first = staging.stage("tokens", torch.tensor([4, 5, 6]))
    address = staging.buffer("tokens").data_ptr()
    assert first.tolist() == [4, 5, 6]
    second = staging.stage("tokens", torch.tensor([[1, 2], [3, 4]]))   # fewer elements, another shape
    assert second.shape == (2, 2) and second.tolist() == [[1, 2], [3, 4]]
    assert staging.buffer("tokens").data_ptr() == address and second.data_ptr() == address
    values = staging.stage("values", torch.tensor([0.5, 0.25]))      # another key: a buffer of its own
    assert values.dtype == torch.float32 and staging.buffer("values").data_ptr() != address
    big = staging.stage("tokens", torch.arange(100))                  # past the room: the buffer grows once
    assert big.tolist() == list(range(100)) and staging.buffer("tokens").numel() == 100


def test_a_replayed_decode_step_reads_the_same_slots_as_its_batch():
    parts = [SeqPart([5], start=4, blocks=[3, 8], window_blocks=[1, 6], samples=True),
             SeqPart([6], start=1, blocks=[9], window_blocks=[2], samples=True)]
    inp = decode_inputs(parts, 4, windowed=True)
    batch = build_batch(parts, 4, CPU, windowed=True, decode=True)
    assert inp.ids == [5, 6] and inp.positions == [4, 1] and inp.lens == [5, 2]
    assert inp.slots == batch.slot_mapping.tolist() == [32, 37]
    assert inp.window_slots == batch.window.slot_mapping.tolist() == [24, 9]
    assert inp.tables == [[3, 8], [9]] and inp.window_tables == [[1, 6], [2]]
