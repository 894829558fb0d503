"""Reading routing ids back to the host without the copy engines.

A device-to-host ``.cpu()`` of the ids is a DMA, and DMA queues can be shared with the expert
copies in flight: the read of a few bytes then waits behind megabytes of prefetch traffic. On CUDA
we instead let a tiny kernel store the ids straight into mapped pinned host memory, wait for that
kernel's event (a counted sync on the compute stream only), and copy them out. If the kernel
cannot run here the reader falls back to a DMA into the same pinned buffer for good. On the CPU
it is ``.cpu()``. A decode step replayed from CUDA graphs records the store kernel inside its
graphs (``publish``), so the host only waits (``wait``) and reads.
"""
from __future__ import annotations

import torch

_BLOCK = 1024


def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def _store_ids_kernel(src, dst, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(dst + offs, tl.load(src + offs, mask=mask), mask=mask)

    return _store_ids_kernel


def _publish_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def _publish_direct_kernel(table_row, snap_row, ids, pred, region, fill_row, fill_free, fill_meta, progress,
                               pad, layer, E, N, NP, K, BLOCK_E: tl.constexpr, BLOCK_N: tl.constexpr,
                               BLOCK_P: tl.constexpr, PROGRESS: tl.constexpr, PAD: tl.constexpr):
        # One program: snapshot the slot-table row (and clear the fill row), then publish the ids and
        # the slot each id found in that snapshot (after a barrier: the snapshot is what the MoE
        # kernels will read); give each missing expert, at its first occurrence, the next of the
        # step's fill slots while any are left; publish each id's fill slot and the predicted ids.
        # With PAD, the ids of a padding row (pad[row], K ids a row) become row 0's, in place.
        i = tl.arange(0, BLOCK_N)
        i_ok = i < N
        if PAD:
            padded = tl.load(pad + i // K, mask=i_ok, other=0) != 0
            tl.store(ids + i, tl.load(ids + i % K, mask=i_ok, other=0), mask=i_ok & padded)
        e = tl.arange(0, BLOCK_E)
        tl.store(snap_row + e, tl.load(table_row + e, mask=e < E, other=-1), mask=e < E)
        tl.store(fill_row + e, tl.full([BLOCK_E], -1, tl.int32), mask=e < E)
        tl.debug_barrier()
        idv = tl.load(ids + i, mask=i_ok, other=0)
        seen = tl.load(snap_row + idv, mask=i_ok, other=-1)
        tl.store(region + i, idv.to(tl.int64), mask=i_ok)
        tl.store(region + N + i, seen.to(tl.int64), mask=i_ok)
        j = tl.arange(0, BLOCK_N)
        idj = tl.load(ids + j, mask=j < N, other=-1)
        earlier = (idj[None, :] == idv[:, None]) & (j[None, :] < i[:, None])          # [N, N]
        first = i_ok & (seen < 0) & (tl.sum(earlier.to(tl.int32), axis=1) == 0)
        nfirst = first.to(tl.int32)
        pos = tl.load(fill_meta) + tl.cumsum(nfirst, axis=0) - nfirst
        got = first & (pos < tl.load(fill_meta + 1))
        tl.store(fill_row + idv, tl.load(fill_free + pos, mask=got, other=-1), mask=got)
        tl.store(fill_meta, tl.minimum(tl.load(fill_meta) + tl.sum(nfirst, axis=0), tl.load(fill_meta + 1)))
        tl.debug_barrier()
        tl.store(region + 2 * N + i, tl.load(fill_row + idv, mask=i_ok, other=-1).to(tl.int64), mask=i_ok)
        p = tl.arange(0, BLOCK_P)
        tl.store(region + 3 * N + p, tl.load(pred + p, mask=p < NP, other=0).to(tl.int64), mask=p < NP)
        if PROGRESS:   # for the GPU-side prefetch: this layer's snapshot is taken
            tl.store(progress, layer)

    return _publish_direct_kernel


_PUBLISH = None


def publish_direct(table_row: torch.Tensor, snap_row: torch.Tensor, ids: torch.Tensor,
                   pred: torch.Tensor | None, region: torch.Tensor, fill_row: torch.Tensor,
                   fill_free: torch.Tensor, fill_meta: torch.Tensor, progress: torch.Tensor | None = None,
                   layer: int = 0, pad: torch.Tensor | None = None) -> None:
    """Device work only (graph-capturable): ``snap_row <- table_row`` ([E] int32); ``fill_row`` [E]
    int32 <- for each expert of ``ids`` missing from the snapshot, at its first occurrence, the next
    slot of ``fill_free`` (from ``fill_meta = [next, count]``, advanced) or -1; then into the pinned
    int64 ``region``: ``ids`` [N], the slot each found in the snapshot [N], the fill slot of each [N],
    and ``pred`` [NP] if given. ``progress`` (int32 [1], optional) <- ``layer`` once the snapshot is taken.

    ``pad`` (bool [T], optional; ``ids`` is then [T, k] flattened): first, in place, the ids of each
    padding row become row 0's, so padding adds no reads of its own (one launch instead of a
    ``where`` and a copy per layer)."""
    global _PUBLISH
    if _PUBLISH is None:
        _PUBLISH = _publish_kernel()
    import triton
    e, n = table_row.numel(), ids.numel()
    np_ = 0 if pred is None else pred.numel()
    k = n // pad.numel() if pad is not None and pad.numel() else 1
    _PUBLISH[(1,)](table_row, snap_row, ids, ids if pred is None else pred, region, fill_row, fill_free, fill_meta,
                   fill_meta if progress is None else progress, ids if pad is None else pad, layer, e, n, np_, k,
                   BLOCK_E=triton.next_power_of_2(e), BLOCK_N=triton.next_power_of_2(max(n, 1)),
                   BLOCK_P=triton.next_power_of_2(max(np_, 1)), PROGRESS=progress is not None,
                   PAD=pad is not None)


def copy_kernel(src: torch.Tensor, dst: torch.Tensor) -> None:
    """``dst <- src`` (int64, 1-D) by a kernel: either side may be mapped host memory."""
    n = src.numel()
    _kernel()[(triton_cdiv(n, _BLOCK),)](src, dst, n, BLOCK=_BLOCK)


class HostReader:
    """``read(t)``: an int64 device tensor ``[N]`` as a CPU tensor, synchronising the compute stream only.

    ``publish(t, region)`` is the device half alone (it can be recorded in a CUDA graph): ``t`` lands
    in the pinned host tensor ``region``; ``wait()`` is the host half, after which it can be read.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.zero_copy = device.type == "cuda"
        self._buf: torch.Tensor | None = None       # int64 [capacity], pinned and mapped
        self._fn = None
        self._done: torch.cuda.Event | None = None

    def read(self, t: torch.Tensor) -> torch.Tensor:
        """Copy of ``t`` (int64, contiguous, 1-D) on the host."""
        if self.device.type != "cuda":
            return t.cpu()
        n = t.numel()
        if self._buf is None or self._buf.numel() < n:
            self._buf = pinned_ids(max(n, 4096))
        self.publish(t, self._buf)
        self.wait()
        return self._buf[:n].clone()

    def publish(self, t: torch.Tensor, region: torch.Tensor) -> None:
        """Write ``t`` (int64 [N], on the device) into ``region`` (pinned int64, at least N) without a sync."""
        n = t.numel()
        if self.zero_copy:
            try:
                if self._fn is None:
                    self._fn = _kernel()
                self._fn[(triton_cdiv(n, _BLOCK),)](t, region, n, BLOCK=_BLOCK)
                return
            except Exception:   # no Triton, or mapped host memory refused: the DMA still works
                self.zero_copy = False
        region[:n].copy_(t, non_blocking=True)

    def wait(self) -> None:
        """Block the host until the compute stream's work so far (the last publish included) is done."""
        if self.device.type == "cuda":
            if self._done is None:
                self._done = torch.cuda.Event()    # one event, recorded again each time
            self._done.record()
            self._done.synchronize()


def pinned_ids(n: int) -> torch.Tensor:
    """int64 [n] page-locked host memory (mapped into the GPU's address space under UVA)."""
    return torch.empty(n, dtype=torch.int64, pin_memory=True)


def triton_cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b
