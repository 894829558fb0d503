"""Live changes of the expert residency: pool size, prefetch depth, eviction policy and how missing
experts are read — checked first (:func:`check`, which changes nothing), then applied between steps
(:func:`apply`), with the old pool kept when the new one cannot be allocated."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Sequence

import torch

from engine.config import DIRECT_READS
from engine.errors import ConfigError, ReconfigureError
from engine.options import parse_live
from engine.experts.policies import make_policy
from engine.experts.policy import EvictionPolicy, StaticPolicy
from engine.experts.profile import check_routing_profile, read_routing_profile
from engine.experts.residency import Residency
from engine.experts.store import HostExpertStore
from kernels.expert_layout import ExpertLayout


@dataclasses.dataclass(frozen=True)
class Change:
    slots: int                     # pool slots wanted
    depth: int                     # prefetch depth
    policy: EvictionPolicy         # the policy after the change (the current one if unchanged)
    direct: bool | None            # the direct_reads option
    resize: bool                   # the pool is re-created (size, or a new static placement)


def check(r: Residency, direct: bool | None, profile: list[list[int]] | None, lfu_decay: float,
          pool_bytes: int | None, prefetch_depth: int | None, policy: str | None, reads: str | None) -> Change:
    """The change the settings ask for, checked; raises ReconfigureError (nothing changed) if one is bad."""
    depth = r.prefetch_depth if prefetch_depth is None else check_depth(prefetch_depth, ReconfigureError)
    if reads is not None:
        direct = check_reads(reads, r.store, r.device)
    new_policy = r.policy
    if policy is not None and policy != r.policy.name:
        try:
            new_policy = make_policy(policy, profile, lfu_decay)
        except ConfigError as err:
            raise ReconfigureError(str(err)) from None
    slots = r.pool.slots if pool_bytes is None else slots_for(pool_bytes, r.layout, r.books.num_keys)
    static = isinstance(new_policy, StaticPolicy)
    resize = slots != r.pool.slots or (static and new_policy is not r.policy)
    return Change(slots, depth, new_policy, direct, resize)


def apply(r: Residency, change: Change) -> None:
    """Apply a checked change (between steps, every lease released when it resizes)."""
    if change.resize:
        _resize(r, change.slots, change.policy)
    elif change.policy is not r.policy:
        seed(change.policy, r.policy.rank(r.books.resident_keys()))
    r.policy, r.prefetch_depth = change.policy, change.depth


def _resize(r: Residency, slots: int, policy: EvictionPolicy) -> None:
    """Re-create the pool for ``policy``; on failure the old pool and placement stay."""
    old = r.books.resident_keys()
    keep = policy.place(slots) if isinstance(policy, StaticPolicy) else r.policy.rank(old)
    try:
        r.pool.resize(slots, keep)
    except ReconfigureError:
        if isinstance(r.policy, StaticPolicy):
            r.policy.place(r.pool.slots)
        raise
    now = set(r.books.resident_keys())
    for k in old:
        if k not in now:
            r.policy.remove(k)
    r.ledger.waste_all_but(old, now)
    if policy is not r.policy:
        seed(policy, r.policy.rank(list(now)))
    else:
        # Keys a grow placed took slots too: the policy must know them, or after a later shrink
        # it could never pick them as victims and the pool would admit nothing again.
        seed(policy, r.policy.rank(list(now.difference(old))))


def seed(policy: EvictionPolicy, ranked: list[int]) -> None:
    """Tell a fresh policy what is resident, least valuable first (so it goes first)."""
    for k in reversed(ranked):
        policy.insert(k)


def slots_for(pool_bytes: int | None, layout: ExpertLayout, total: int) -> int:
    """Pool slots ``pool_bytes`` buy (None: every expert)."""
    return total if pool_bytes is None else min(int(pool_bytes) // layout.nbytes, total)


def load_profile(profile: str | Path | Sequence[Sequence[int]] | None, num_layers: int,
                 num_experts: int) -> list[list[int]] | None:
    """A routing profile (a file or counts ``[L][E]``), checked against the model."""
    if profile is None:
        return None
    if isinstance(profile, (str, Path)):
        return read_routing_profile(profile, num_layers, num_experts)
    doc = {"format": "strata-routing-profile", "counts": [list(r) for r in profile]}
    return check_routing_profile(doc, num_layers, num_experts)


def check_reads(reads: str, store: HostExpertStore | None, device: torch.device) -> bool | None:
    """``expert_reads`` (auto / copy / direct) as the ``direct_reads`` option, checked (without a host
    store, every expert resident, there is nothing to read directly yet: any choice holds)."""
    if reads not in DIRECT_READS:
        raise ReconfigureError(f"expert_reads={reads!r} is not supported; choose auto, copy or direct")
    if reads == "direct" and store is not None and device.type == "cuda" and not store.direct_readable(device):
        raise ReconfigureError("expert_reads=direct needs a host store the GPU's kernels can read; it is not "
                               "mapped here (use auto or copy)")
    return DIRECT_READS[reads]


def probe_reads(store: HostExpertStore, device: torch.device, direct_reads: bool | None,
                error: type[ConfigError]) -> None:
    """Check a ``direct_reads=True`` request against ``store``, and probe whether the kernels can read it
    (now, outside any graph capture: the answer is cached)."""
    if direct_reads and device.type == "cuda" and not store.direct_readable(device):
        raise error("direct expert reads need pinned host memory mapped for the GPU and Triton; "
                    "this host store is not readable from kernels (leave direct_reads unset)")
    if direct_reads is None and device.type == "cuda":
        store.direct_readable(device)


def give_store(r: Residency, direct_reads: bool | None) -> HostExpertStore:
    """Before a pool that adopted the model's experts first shrinks: a host store of them, which the
    pool takes (:func:`home_store`); checked for direct reads as a store loaded offloaded is."""
    store = home_store(r)
    try:
        probe_reads(store, r.device, direct_reads, ReconfigureError)
    except ReconfigureError:
        store.close()
        raise
    r.pool.give_store(store)
    return store


def home_store(r: Residency) -> HostExpertStore:
    """A host store holding a copy of every expert of a pool that adopted the model's buffer (all
    resident), so that the pool can shrink: page-locked and mapped on CUDA, as if loaded offloaded."""
    pool = r.pool
    cuda = r.device.type == "cuda"
    try:
        store = HostExpertStore.allocate(r.num_layers, r.num_experts, r.layout, pin=cuda, device=r.device)
    except ConfigError as err:
        raise ReconfigureError(f"offloading experts needs a copy of them in host memory: {err}") from None
    pool.copies.synchronize()
    store.rows.copy_(pool.buffer)                 # every expert in its store row (slot k holds key k)
    return store


def check_depth(depth: int, error: type[ConfigError]) -> int:
    """``prefetch_depth`` checked by the live option's own rule (engine/options.py), else ``error``."""
    try:
        return parse_live("prefetch_depth", depth)
    except ConfigError as err:
        raise error(str(err)) from None
