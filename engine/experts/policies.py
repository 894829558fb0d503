"""``make_policy``: an eviction policy by its name (the ``--expert-policy`` values)."""
from __future__ import annotations

from typing import Sequence

from engine.errors import ConfigError
from engine.experts.adaptive_policy import AdaptiveLFUPolicy
from engine.experts.policy import DEFAULT_LFU_DECAY, POLICIES, EvictionPolicy, LFUPolicy, LRUPolicy, StaticPolicy


def make_policy(name: str, profile: Sequence[Sequence[int]] | None = None,
                lfu_decay: float = DEFAULT_LFU_DECAY) -> EvictionPolicy:
    """Build the policy called ``name``; ``static`` needs the profile's counts ``[L][E]``."""
    if name == "lru":
        return LRUPolicy()
    if name == "lfu":
        return LFUPolicy(lfu_decay)
    if name == "adaptive":
        return AdaptiveLFUPolicy()
    if name == "static":
        if profile is None:
            raise ConfigError("expert_policy=static needs a routing profile; record one with --record-routing FILE "
                              "and pass it with --routing-profile FILE")
        return StaticPolicy(profile)
    raise ConfigError(f"expert policy {name!r} is not supported; choose one of {', '.join(POLICIES)}")
