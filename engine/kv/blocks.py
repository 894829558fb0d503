"""Block allocator for the paged KV cache (pure Python; testable without a device)."""
from __future__ import annotations


class BlockAllocator:
    """Hands out fixed-size KV blocks from a free list."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free = list(range(num_blocks - 1, -1, -1))   # pop() yields low ids first

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def blocks_needed(self, tokens: int, have: int) -> int:
        """Extra blocks to hold ``tokens`` tokens when ``have`` blocks are already owned."""
        return max(0, -(-tokens // self.block_size) - have)

    def can_allocate(self, n: int) -> bool:
        return n <= len(self._free)

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise RuntimeError(f"KV cache out of blocks: need {n}, {len(self._free)} free")
        return [self._free.pop() for _ in range(n)]

    def free(self, blocks: list[int]) -> None:
        self._free.extend(reversed(blocks))
