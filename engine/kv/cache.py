"""Per-layer paged K/V storage: rows ``[num_blocks * block_size, Hkv, hd]`` per layer (V rows ``v_head_dim``
wide where that differs: latent attention keeps its latent in the K plane and its rotary key in the V plane,
engine/models/mla.py).

Block groups: a cache built with ``window_layers`` keeps those sliding-window layers' rows in a
second pool of ``window_blocks`` blocks (``[window_blocks * block_size, Hkv, hd]`` per such layer),
indexed by each sequence's window block table (engine/kv/windows.py); :meth:`KVCache.windowed` says
which group a layer reads. Without window layers there is one pool, as there always was.

Storage formats (``kv_dtype``):

* ``auto`` / ``bf16``: the compute dtype / bfloat16, as written;
* ``int8``: symmetric int8 with one float32 scale per token and KV head (``amax / 127``);
* ``fp8``: e4m3 with one float32 scale per token and KV head (``amax / 448``).

A scale per token (rather than per block) means a row never changes after it is written, so a block
filled over many steps needs no re-quantisation. Readers call :meth:`KVCache.gather`, which returns
rows in the compute dtype. :meth:`KVCache.convert` changes the format in place between steps, so the
running conversations keep their context.
"""
from __future__ import annotations

import torch

from engine.errors import ReconfigureError

QUANTISED = {"int8": (torch.int8, 127.0), "fp8": (torch.float8_e4m3fn, 448.0)}
KV_FORMATS = ("auto", "bf16", "int8", "fp8")


def check_kv_format(kv_dtype: str) -> None:
    """Raise ReconfigureError unless ``kv_dtype`` is a KV storage a cache converts to."""
    if kv_dtype not in KV_FORMATS:
        raise ReconfigureError(f"kv_cache_dtype={kv_dtype!r} is not supported; choose one of {', '.join(KV_FORMATS)}")


def _storage_dtype(kv_dtype: str, compute: torch.dtype) -> torch.dtype:
    if kv_dtype in QUANTISED:
        return QUANTISED[kv_dtype][0]
    return torch.bfloat16 if kv_dtype == "bf16" else compute


class KVCache:
    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype, device: torch.device, kv_dtype: str = "auto", *,
                 window_layers: tuple[int, ...] = (), window_blocks: int = 0, v_head_dim: int | None = None) -> None:
        self.num_blocks, self.block_size, self.dtype = num_blocks, block_size, dtype
        self.num_layers, self.device = num_layers, device
        self.window_blocks = window_blocks if window_layers else 0      # 0: no window group
        self._windowed = frozenset(window_layers) if self.window_blocks else frozenset()
        self.shape = (num_blocks * block_size, num_kv_heads, head_dim)
        self.window_shape = (self.window_blocks * block_size, num_kv_heads, head_dim)
        self.v_head_dim = head_dim if v_head_dim is None else v_head_dim
        self._allocate(kv_dtype)

    def windowed(self, layer: int) -> bool:
        """Whether ``layer``'s rows live in the window pool (read through the window block tables)."""
        return layer in self._windowed

    def layer_shape(self, layer: int) -> tuple[int, int, int]:
        """``[rows, Hkv, hd]`` of ``layer``'s K (and, but for its width, V) storage."""
        return self.window_shape if layer in self._windowed else self.shape

    def _v_shape(self, layer: int) -> tuple[int, int, int]:
        return (*self.layer_shape(layer)[:2], self.v_head_dim)

    def _allocate(self, kv_dtype: str) -> None:
        self.kv_dtype = kv_dtype
        self.storage_dtype = _storage_dtype(kv_dtype, self.dtype)
        shapes = [self.layer_shape(i) for i in range(self.num_layers)]
        z = lambda shape: torch.zeros(shape, dtype=self.storage_dtype, device=self.device)   # noqa: E731
        self.k, self.v = [z(sh) for sh in shapes], [z(self._v_shape(i)) for i in range(self.num_layers)]
        if self.quantised:
            s = lambda shape: torch.zeros(shape[:2], dtype=torch.float32, device=self.device)   # noqa: E731
            self.k_scale, self.v_scale = [s(sh) for sh in shapes], [s(sh) for sh in shapes]
        else:
            self.k_scale = self.v_scale = None

    @property
    def quantised(self) -> bool:
        return self.kv_dtype in QUANTISED

    @staticmethod
    def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                        kv_dtype: str = "auto", v_head_dim: int | None = None) -> int:
        """K and V bytes of one token over all layers, scales included."""
        width = head_dim + (head_dim if v_head_dim is None else v_head_dim)
        per_head = width * torch.empty((), dtype=_storage_dtype(kv_dtype, dtype)).element_size()
        if kv_dtype in QUANTISED:
            per_head += 8                                        # a float32 scale per plane
        return num_layers * num_kv_heads * per_head

    @property
    def nbytes(self) -> int:
        tensors = self.k + self.v + (self.k_scale + self.v_scale if self.quantised else [])
        return sum(t.numel() * t.element_size() for t in tensors)

    @property
    def window_nbytes(self) -> int:
        """Bytes of :attr:`nbytes` in the window pool (0 without a window group)."""
        layers = [i for i in range(self.num_layers) if i in self._windowed]
        tensors = [t[i] for t in (self.k, self.v) + ((self.k_scale, self.v_scale) if self.quantised else ())
                   for i in layers]
        return sum(t.numel() * t.element_size() for t in tensors)

    @property
    def label(self) -> str:
        return self.kv_dtype if self.kv_dtype != "auto" else str(self.dtype).replace("torch.", "")

    def _quantise(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [N, Hkv, hd] -> (values in storage dtype, scales [N, Hkv] f32)."""
        qmax = QUANTISED[self.kv_dtype][1]
        x = x.float()
        scale = (x.abs().amax(-1) / qmax).clamp_min(1e-12)                 # [N, Hkv]
        y = x / scale[..., None]
        if self.kv_dtype == "int8":
            y = y.round().clamp(-qmax, qmax)
        return y.to(self.storage_dtype), scale

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """slots [T] int64, k/v [T, Hkv, hd]."""
        if not self.quantised:
            self.k[layer].index_copy_(0, slots, k.to(self.storage_dtype))
            self.v[layer].index_copy_(0, slots, v.to(self.storage_dtype))
            return
        for x, store, scales in ((k, self.k, self.k_scale), (v, self.v, self.v_scale)):
            q, s = self._quantise(x)
            # byte views: indexed copies of float8 are not implemented on every device
            store[layer].view(torch.uint8).index_copy_(0, slots, q.view(torch.uint8))
            scales[layer].index_copy_(0, slots, s)

    def gather(self, layer: int, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of cache ``rows`` (any shape ``[...]``) as ``[..., Hkv, hd]`` in the compute dtype."""
        if self.quantised:
            raw = lambda t: t.view(torch.uint8)[rows].view(self.storage_dtype).float()   # noqa: E731
            k = (raw(self.k[layer]) * self.k_scale[layer][rows][..., None]).to(self.dtype)
            v = (raw(self.v[layer]) * self.v_scale[layer][rows][..., None]).to(self.dtype)
            return k, v
        k, v = self.k[layer][rows], self.v[layer][rows]
        if self.storage_dtype != self.dtype:
            k, v = k.to(self.dtype), v.to(self.dtype)
        return k, v

    def convert(self, kv_dtype: str) -> None:
        """Re-store every row in ``kv_dtype`` (between steps); on out-of-memory nothing changes."""
        check_kv_format(kv_dtype)
        if kv_dtype == self.kv_dtype:
            return
        rows = [torch.arange(self.layer_shape(i)[0], device=self.device) for i in range(self.num_layers)]
        old = {name: getattr(self, name) for name in ("k", "v", "k_scale", "v_scale", "kv_dtype", "storage_dtype")}
        try:
            values = [self.gather(layer, rows[layer]) for layer in range(self.num_layers)]    # compute dtype
            self._allocate(kv_dtype)
            for layer, (k, v) in enumerate(values):
                self.write(layer, rows[layer], k, v)
        except torch.OutOfMemoryError:
            for name, value in old.items():
                setattr(self, name, value)
            raise ReconfigureError(f"converting the KV cache to {kv_dtype} ran out of device memory; the cache "
                                   "stays as it was — free memory (a smaller expert pool) and try again") from None
