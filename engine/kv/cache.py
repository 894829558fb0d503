"""Per-layer paged K/V storage: ``[num_blocks * block_size, Hkv, hd]`` per layer."""
from __future__ import annotations

import torch

KV_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


class KVCache:
    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype, device: torch.device) -> None:
        self.num_blocks, self.block_size, self.dtype = num_blocks, block_size, dtype
        shape = (num_blocks * block_size, num_kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]

    @staticmethod
    def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return 2 * num_layers * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """slots [T] int64, k/v [T, Hkv, hd]."""
        self.k[layer].index_copy_(0, slots, k.to(self.dtype))
        self.v[layer].index_copy_(0, slots, v.to(self.dtype))
