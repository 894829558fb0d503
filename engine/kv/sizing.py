"""How big the KV cache is for a model whose layers mix full attention and sliding windows.

Full-attention layers keep every token of every sequence: their KV grows with the context and lives
in the shared paged pool. Sliding-window layers (gpt-oss alternates them with full layers) need only
the keys of the last ``window - 1`` positions before a step's new tokens, so their blocks live in a
second pool of fixed size (engine/kv/windows.py frees what falls out of reach before every step):

* per running sequence, the blocks ``window - 1`` positions touch plus the block its next token goes
  into (:func:`window_blocks_per_seq`);
* per step, the blocks its prefill chunks add beyond that: at most ``ceil(token_budget / block_size)``
  over all sequences, since a step computes at most ``token_budget`` tokens (:func:`window_step_blocks`).

The window layers' KV is then a fixed number of bytes, whatever the context. A model without window
layers, or whose window reaches as far as a whole context anyway, has no window group: every layer
stays in the one pool, as before (:func:`window_group`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.checkpoint.spec import ModelSpec
from engine.kv.cache import KVCache


def layer_bytes_per_token(num_kv_heads: int, head_dim: int, dtype: torch.dtype, kv_dtype: str = "auto",
                          v_head_dim: int | None = None) -> int:
    """K and V bytes of one token in one layer, with the per-token scales of int8 / fp8 rows."""
    return KVCache.bytes_per_token(1, num_kv_heads, head_dim, dtype, kv_dtype, v_head_dim)


def window_blocks_per_seq(window: int, block_size: int) -> int:
    """Window-pool blocks of one running sequence between steps (its last ``window - 1`` positions,
    which may straddle one block more than they fill) and the block its next token goes into."""
    return -(-(window - 1) // block_size) + 2


def window_step_blocks(token_budget: int, block_size: int) -> int:
    """Window-pool blocks a step's chunks may add beyond one per sequence, over all sequences."""
    return -(-token_budget // block_size)


def window_group(spec: ModelSpec, max_model_len: int, block_size: int) -> tuple[tuple[int, ...], int]:
    """(layers whose KV lives in the window pool, the window that pool keeps: the largest of theirs).

    ``((), 0)`` when the model has no window layer or when keeping a window per sequence would not
    hold fewer blocks than a full context does (windows as long as the context)."""
    layers = tuple(i for i in range(spec.num_layers) if spec.window(i) > 0)
    if not layers:
        return (), 0
    window = max(spec.window(i) for i in layers)
    if window_blocks_per_seq(window, block_size) >= -(-max_model_len // block_size):
        return (), 0
    return layers, window


@dataclass(frozen=True)
class KVSizing:
    """The KV cache's bytes split by block group."""

    full_layers: int                  # layers in the shared pool (every layer when there is no window group)
    windowed: tuple[int, ...]         # the layers in the window pool (): no window group
    window: int                       # the window pool's window in tokens: its layers' largest (0: none)
    layer_bytes_per_token: int        # K/V bytes of one token in one layer
    window_blocks_per_seq: int        # window-pool blocks of one running sequence (0: no window group)
    window_step_blocks: int           # window-pool blocks a step's chunks add over all sequences (0: none)
    max_batch: int
    block_size: int

    @property
    def window_layers(self) -> int:
        return len(self.windowed)

    @property
    def bytes_per_token(self) -> int:
        """Full layers' K/V bytes per token of context: what the shared pool spends per token."""
        return self.full_layers * self.layer_bytes_per_token

    @property
    def window_bytes_per_seq(self) -> int:
        """Window layers' K/V bytes per running sequence, whatever its context (0: no window group);
        the pool adds the blocks of one step's chunks (:attr:`window_pool_blocks`)."""
        return self.window_layers * self.layer_bytes_per_token * self.window_blocks_per_seq * self.block_size

    @property
    def window_pool_blocks(self) -> int:
        """Window-pool blocks: ``max_batch`` sequences and a step's chunks, without the scratch block."""
        return self.max_batch * self.window_blocks_per_seq + self.window_step_blocks

    @property
    def window_pool_bytes(self) -> int:
        """Bytes of the window pool as allocated, its scratch block included (0: no window group)."""
        if not self.window_layers:
            return 0
        return (self.window_pool_blocks + 1) * self.block_size * self.window_layers * self.layer_bytes_per_token

    def kv_bytes(self, context_tokens: int) -> int:
        """KV bytes holding ``context_tokens`` tokens of context (all sequences), the window pool included."""
        return context_tokens * self.bytes_per_token + self.window_pool_bytes

    def context_tokens(self, kv_bytes: int) -> int:
        """Tokens of context (all sequences) that ``kv_bytes`` of KV cache hold once the window pool is paid."""
        return max(0, kv_bytes - self.window_pool_bytes) // self.bytes_per_token if self.bytes_per_token else 0


def kv_sizing(spec: ModelSpec, dtype: torch.dtype, kv_dtype: str, max_model_len: int, max_batch: int,
              token_budget: int, block_size: int) -> KVSizing:
    """The KV cache's split for ``spec`` served with these settings (``token_budget``: the most tokens
    a step computes, EngineConfig.token_budget; see the module docstring)."""
    layers, window = window_group(spec, max_model_len, block_size)
    per_seq = window_blocks_per_seq(window, block_size) if layers else 0
    step = window_step_blocks(token_budget, block_size) if layers else 0
    return KVSizing(spec.num_layers - len(layers), layers, window,
                    layer_bytes_per_token(spec.kv_heads_stored, spec.kv_head_dim_stored, dtype, kv_dtype,
                                          spec.kv_v_dim_stored),
                    per_seq, step, max_batch, block_size)
