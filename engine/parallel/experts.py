"""Expert parallel: every MoE layer's routed experts spread over the GPUs of one host.

Card ``r`` of ``N`` owns experts ``r, r + N, r + 2N, ...`` of every MoE layer (interleaved, so that a
layer's neighbouring experts, often hot together, land on different cards), in a pool, host store and
budget of its own; it holds nothing else but the routers (for its prefetch predictions). The first
card holds the rest of the model and runs every layer; at each MoE layer it sends the step's tokens
(the normed input, the residual stream its cards predict from, the chosen experts and their weights)
to every card, computes its own experts' share meanwhile, and sums the cards' shares:

    broadcast [T, 2D + 2k] float32 from card 0 -> each card: its pairs (token, expert) -> reduce-sum [T, D]

With one token per step this is the all-to-all exchange of expert parallel with every token sent
to every card; what crosses between cards per layer is ``T (2D + 2k)`` and ``T D`` floats. Each card
fetches its own misses over its own link to host memory, so the cards' links work at once inside
every layer.

Legend: T tokens, D hidden, k experts per token, P the (token, expert) pairs a card owns.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from engine.errors import ConfigError
from engine.host_copy import host_to
from engine.models.moe_transformer import router_logits


def owned(num_experts: int, world: int, rank: int) -> list[int]:
    """The experts of a layer card ``rank`` of ``world`` holds."""
    return list(range(rank, num_experts, world))


@dataclass(frozen=True)
class ExpertShard:
    """Which experts one process holds: those of :func:`owned`."""

    rank: int
    world: int
    num_experts: int                 # of the model, per layer

    @property
    def experts(self) -> list[int]:
        return owned(self.num_experts, self.world, self.rank)

    @property
    def local_experts(self) -> int:
        return len(self.experts)

    def describe(self) -> str:
        return f"expert shard {self.rank} of {self.world} (experts {self.rank}, {self.rank + self.world}, ...)"


def check_shards(num_experts: int, top_k: int, world: int) -> None:
    if world > num_experts:
        raise ConfigError(f"expert_parallel={world} needs at least one expert per card but each MoE layer has "
                          f"{num_experts}; use --expert-parallel {num_experts} or fewer")


def shard_rows(rows: torch.Tensor, num_experts: int, own: list[int]) -> torch.Tensor:
    """The host rows ``uint8 [L * E, nbytes]`` of every layer's experts ``own``, as ``[L * len(own), nbytes]``."""
    nbytes = rows.shape[1]
    return rows.view(-1, num_experts, nbytes)[:, own].reshape(-1, nbytes).contiguous()


def shard_share(experts, moe_fn, layout, moe_index: int, h: torch.Tensor, ids: torch.Tensor, w: torch.Tensor,
                pred, world: int, rank: int) -> torch.Tensor:
    """This card's share [T, D] float32 of a MoE layer: its pairs, each as a one-expert token."""
    T, D = h.shape
    out = torch.zeros(T, D, dtype=torch.float32, device=h.device)
    mine = (ids % world) == rank                                             # [T, k]
    t, j = mine.nonzero(as_tuple=True)                                       # [P]
    if t.numel() == 0:
        return out
    local = (ids[t, j] // world).view(-1, 1)                                 # [P, 1] local expert ids
    slot_of_expert, views, *rest = experts.acquire(moe_index, local, pred)
    extra = {"host": rest[0]} if rest and rest[0] is not None else {}
    wp = w[t, j].view(-1, 1).float()
    passes = rest[2] if len(rest) > 2 else None
    if passes is None:
        y = moe_fn(h[t], local, wp, slot_of_expert, views, layout, **extra)   # [P, D]
        return out.index_add_(0, t, y.float())
    for row, pairs in passes.runs(slot_of_expert):       # more missing experts than slots: a pass each group
        if pairs:
            p = host_to(pairs, torch.int64, h.device)            # no wait for the pass before
            out.index_add_(0, t[p], moe_fn(h[t[p]], local[p], wp[p], row, views, layout).float())
    return out


def pack_tokens(h: torch.Tensor, x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """What card 0 sends its cards at a MoE layer: [T, 2D + 2k] float32 (expert ids are exact in float32)."""
    return torch.cat([h.float(), x.float(), ids.float(), w.float()], 1).contiguous()


def unpack_tokens(msg: torch.Tensor, D: int, k: int, dtype: torch.dtype):
    """(h, x, ids, w) from :func:`pack_tokens`'s tensor."""
    return (msg[:, :D].to(dtype), msg[:, D:2 * D].to(dtype), msg[:, 2 * D:2 * D + k].round().long(),
            msg[:, 2 * D + k:])


class ExpertsOnCards:
    """Card 0's side: the MoE layers of its model, with the other cards' shares (``model.expert_parallel``)."""

    def __init__(self, group) -> None:
        self.group = group                 # the processes (engine/parallel/pipeline.py Pipeline)

    def begin_step(self, tokens: int, prompt: bool = False) -> None:
        """A step of ``tokens`` tokens starts on every card; ``prompt``: it carries a prompt's tokens."""
        for w in self.group.workers:
            self.group.send(w, ("experts_step", tokens, prompt))

    def moe(self, model, m, h: torch.Tensor, x: torch.Tensor, pred) -> torch.Tensor:
        self.group._check()
        with self.group.step_guard():
            return self._moe(model, m, h, x, pred)

    def _moe(self, model, m, h: torch.Tensor, x: torch.Tensor, pred) -> torch.Tensor:
        w, ids = model.route(router_logits(h, m), m.score_bias)              # [T, k] f32, [T, k]
        world = self.group.size
        msg = pack_tokens(h, x, ids, w)
        links = self.group.links
        self.group._wait(dist.broadcast(msg, src=0, group=links, async_op=True))
        share = shard_share(model.experts, model.moe_fn, model.experts.layout, m.moe_index, h, ids, w, pred, world, 0)
        self.group._wait(dist.reduce(share, dst=0, group=links, async_op=True))
        return share.to(h.dtype)
