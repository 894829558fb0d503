"""Paged KV cache: a block allocator (pure Python) and per-layer block storage."""
