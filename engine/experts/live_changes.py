"""Live changes of :class:`engine.experts.manager.OffloadedExperts`: pool size, prefetch depth,
eviction policy and how missing experts are read, applied between steps with a rollback on failure."""
from __future__ import annotations

import torch

from engine.config import DIRECT_READS
from engine.errors import ConfigError, ReconfigureError
from engine.experts.policies import make_policy
from engine.experts.policy import EvictionPolicy, StaticPolicy
from engine.experts.store import HostExpertStore


class LiveChanges:
    """``reconfigure`` of :class:`engine.experts.manager.OffloadedExperts` (a mixin over its state)."""

    def reconfigure(self, pool_bytes: int | None = None, prefetch_depth: int | None = None,
                    policy: str | None = None, reads: str | None = None) -> str:
        """Apply new settings between steps; returns a short description of the result.

        Raises ReconfigureError and changes nothing when a setting is invalid, the pool does not
        fit the budget, or its allocation fails.
        """
        if self._in_step:
            raise ReconfigureError("the expert pool can change only between engine steps; apply it after step() returns")
        self.finish_ended()
        depth = self.prefetch_depth if prefetch_depth is None else check_depth(prefetch_depth, ReconfigureError)
        direct = self._direct_opt
        if reads is not None:
            direct = check_reads(reads, self.store, self.device)
        new_policy = self.policy
        if policy is not None and policy != self.policy.name:
            try:
                new_policy = make_policy(policy, self._profile, self._lfu_decay)
            except ConfigError as err:
                raise ReconfigureError(str(err)) from None
        slots = self.pool.slots if pool_bytes is None else self._slots_for(pool_bytes)
        static = isinstance(new_policy, StaticPolicy)
        if slots != self.pool.slots or (static and new_policy is not self.policy):
            self._resize(slots, new_policy)
        elif new_policy is not self.policy:
            self._seed(new_policy, self.policy.rank(self.pool.resident_keys()))
        self.policy, self.prefetch_depth, self._direct_opt = new_policy, depth, direct
        return self.describe()

    def _slots_for(self, pool_bytes: int | None) -> int:
        total = self.num_layers * self.num_experts
        return total if pool_bytes is None else min(int(pool_bytes) // self.layout.nbytes, total)

    def _resize(self, slots: int, policy: EvictionPolicy) -> None:
        """Re-create the pool for ``policy``; on failure the old pool and placement stay."""
        self._release_all()
        self._mode = None                          # the table is rebuilt whole
        old = self.pool.resident_keys()
        if isinstance(policy, StaticPolicy):
            keep = policy.place(slots)
        else:
            keep = self.policy.rank(old)
        try:
            self.pool.resize(slots, keep)
        except ReconfigureError:
            if isinstance(self.policy, StaticPolicy):
                self.policy.place(self.pool.slots)
            raise
        now = set(self.pool.resident_keys())
        for k in old:
            if k not in now:
                self.policy.remove(k)
        self.prefetches.waste_all_but(old, now)
        if policy is not self.policy:
            self._seed(policy, self.policy.rank(list(now)))
        else:
            # Keys a grow placed took slots too: the policy must know them, or after a later shrink
            # it could never pick them as victims and the pool would admit nothing again.
            self._seed(policy, self.policy.rank(list(now.difference(old))))

    @staticmethod
    def _seed(policy: EvictionPolicy, ranked: list[int]) -> None:
        """Tell a fresh policy what is resident, least valuable first (so it goes first)."""
        for k in reversed(ranked):
            policy.insert(k)


def check_reads(reads: str, store: HostExpertStore, device: torch.device) -> bool | None:
    """``expert_reads`` (auto / copy / direct) as the ``direct_reads`` option, checked."""
    if reads not in DIRECT_READS:
        raise ReconfigureError(f"expert_reads={reads!r} is not supported; choose auto, copy or direct")
    if reads == "direct" and device.type == "cuda" and not store.direct_readable(device):
        raise ReconfigureError("expert_reads=direct needs a host store the GPU's kernels can read; it is not "
                               "mapped here (use auto or copy)")
    return DIRECT_READS[reads]


def check_depth(depth: int, error: type[ConfigError]) -> int:
    """``prefetch_depth`` checked: an integer >= 0, else ``error``."""
    if not isinstance(depth, int) or isinstance(depth, bool) or depth < 0:
        raise error(f"prefetch_depth must be an integer >= 0 (got {depth!r}); 0 disables prefetching")
    return depth

