"""The window layers' block tables: out-of-reach blocks go back to their pool as a sequence advances.

A sequence's window table is positional like its full table (entry ``b`` holds positions
``b * block_size ..``), so attention indexes both the same way. Once no future query can see a block
its entry is freed and replaced by the placeholder (the window pool's scratch block), which the
window-skipping attention never reads: every future query sits at a position ``>= num_computed`` and
sees keys from ``position - window + 1`` on, so block ``b`` is out of reach once
``(b + 1) * block_size <= num_computed - window + 1``. Freed entries always form a prefix of the table.

The scheduler releases every running sequence's out-of-reach blocks before a step takes new ones,
so between steps a sequence holds at most :func:`engine.kv.sizing.window_blocks_per_seq` blocks and
a step's chunks add at most :func:`engine.kv.sizing.window_step_blocks` more over all sequences. The
pool holds exactly that for ``max_batch`` sequences and a ``token_budget`` step, so it cannot run out:
preemption stays driven by the full pool alone. (The scheduler keeps its batch and budget within
what the pool was sized for, should they be raised while running.) Pure Python; testable without a
device.
"""
from __future__ import annotations

from engine.kv.blocks import BlockAllocator
from engine.kv.sizing import window_blocks_per_seq, window_step_blocks


class WindowBlocks:
    """Block tables of the window group over their own allocator."""

    def __init__(self, window: int, max_batch: int, token_budget: int, block_size: int) -> None:
        self.window, self.block_size = window, block_size
        self.max_batch, self.token_budget = max_batch, token_budget        # what the pool is sized for
        self.per_seq = window_blocks_per_seq(window, block_size)
        self.allocator = BlockAllocator(max_batch * self.per_seq + window_step_blocks(token_budget, block_size),
                                        block_size)
        self.placeholder = self.allocator.num_blocks       # the scratch block after the pool's own

    @property
    def num_blocks(self) -> int:
        """Blocks of the pool, the scratch block included (what the cache allocates)."""
        return self.allocator.num_blocks + 1

    def blocks_for(self, tokens: int) -> int:
        """The most blocks a sequence holds in a step that adds ``tokens`` tokens to it."""
        return self.per_seq - 1 + -(-tokens // self.block_size)

    def out_of_reach(self, num_computed: int) -> int:
        """How many leading blocks no query at a position ``>= num_computed`` can see."""
        return max(0, num_computed - self.window + 1) // self.block_size

    def advance(self, table: list[int], num_computed: int, tokens: int) -> None:
        """Ready ``table`` (in place) for a step that brings its sequence from ``num_computed`` to
        ``tokens`` tokens: free the blocks now out of reach, then add the blocks the new tokens need."""
        self.release(table, num_computed)
        need = self.allocator.blocks_needed(tokens, len(table))
        if not self.allocator.can_allocate(need):         # the sizing makes this impossible in a step
            raise RuntimeError(f"the window KV pool ran out of blocks: need {need}, {self.allocator.num_free} free")
        table += self.allocator.allocate(need)

    def release(self, table: list[int], num_computed: int) -> None:
        """Free the blocks of ``table`` that fell out of reach; the placeholder takes their entries."""
        b = min(self.out_of_reach(num_computed), len(table)) - 1
        freed = []
        while b >= 0 and table[b] != self.placeholder:     # freed entries form a prefix
            freed.append(table[b])
            table[b] = self.placeholder
            b -= 1
        self.allocator.free(freed[::-1])

    def free(self, table: list[int]) -> None:
        """Give every block of ``table`` back and empty it (finish, abort, preemption)."""
        self.allocator.free([b for b in table if b != self.placeholder])
        table.clear()

    def held(self, table: list[int]) -> int:
        """Blocks ``table`` holds (its placeholders not counted)."""
        return sum(b != self.placeholder for b in table)
