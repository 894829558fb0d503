"""Rows of a table that lives in mapped host memory, gathered by the GPU: the embedding off the card.

An embedding of V rows is read one row per token, so a table kept in page-locked host memory mapped
into the GPU's address space costs the card nothing and the bus ``T x D x 2`` bytes a step. The
gather is one kernel (graph-capturable: no host sync, no copy engine), each program copying one
token's row in blocks of the row.

Legend: V rows, D the row width, T tokens.
"""
from __future__ import annotations

import torch

from kernels._triton import cdiv, jit, next_pow2, tl

_BLOCK = 1024


@jit
def _gather_rows_kernel(table, ids, out, D, BLOCK: tl.constexpr):
    t = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < D
    row = tl.load(ids + t).to(tl.int64)
    tl.store(out + t.to(tl.int64) * D + offs, tl.load(table + row * D + offs, mask=mask), mask=mask)


def gather_rows(table: torch.Tensor, ids: torch.Tensor, out: torch.Tensor | None = None,
                device: torch.device | None = None) -> torch.Tensor:
    """``table[ids]`` into ``out [T, D]`` on the GPU, ``table [V, D]`` contiguous (mapped host memory or
    device memory), ``ids [T]`` int32/int64 on the device of ``out``."""
    if table.dim() != 2 or not table.is_contiguous() or ids.dim() != 1:
        raise ValueError(f"gather_rows takes a contiguous [V, D] table and [T] ids; got {tuple(table.shape)} "
                         f"and {tuple(ids.shape)}")
    t, d = ids.numel(), table.shape[1]
    if out is None:
        out = torch.empty(t, d, dtype=table.dtype, device=device or ids.device)
    if t:
        block = min(_BLOCK, next_pow2(d))
        _gather_rows_kernel[(t, cdiv(d, block))](table, ids, out, d, BLOCK=block)
    return out


def gather_rows_ref(table: torch.Tensor, ids: torch.Tensor, device: torch.device | None = None) -> torch.Tensor:
    return table[ids.to(table.device)].to(device or ids.device)


def host_rows_readable(table: torch.Tensor, device: torch.device) -> bool:
    """Whether the kernel on ``device`` reads ``table``'s rows correctly where it lies (page-locked
    memory mapped into the GPU's address space); probed with its first and last rows."""
    if device.type != "cuda":
        return True
    try:
        ids = torch.tensor([0, table.shape[0] - 1], dtype=torch.int64, device=device)
        got = gather_rows(table, ids)
        torch.cuda.synchronize(device)
        return bool(torch.equal(got.cpu(), table[[0, -1]]))
    except Exception:  # no Triton, or host memory not reachable from kernels
        return False
