"""Shared fixtures of the expert-residency tests: a small routed MoE stack run through a provider.

The stack is L MoE layers of router + routed experts with a residual, fp32 on the CPU; enough to
drive the provider the way the model does (begin_step, before_layer, acquire, end_step).
"""
from __future__ import annotations

import torch

from kernels.expert_layout import ExpertLayout
from engine.experts.manager import ExpertManager
from engine.experts.store import HostExpertStore
from engine.experts.tuning import ResidencyTuning
from kernels.fused_moe import fused_moe_ref

L, E, K, D, F = 4, 8, 2, 16, 8


def route(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax top-K, renormalised: logits [T, E] -> (weights [T, K], ids [T, K])."""
    w, ids = torch.topk(torch.softmax(logits.float(), -1), K, dim=-1)
    return w / w.sum(-1, keepdim=True), ids


class ReferenceExperts:
    """An ExpertProvider with nothing to manage, for the residency tests to compare against."""

    static = True
    replay_hooks = None

    def __init__(self, rows: torch.Tensor, layers: int, experts: int, layout: ExpertLayout) -> None:
        self.views = layout.views(rows)
        self.tables = [torch.arange(experts, dtype=torch.int32) + l * experts for l in range(layers)]
        self.counts = torch.zeros(layers, experts, dtype=torch.int64)

    def begin_step(self, prompt: bool = False) -> None:
        pass

    def before_layer(self, moe_index: int, hidden: torch.Tensor) -> None:
        return None

    def acquire(self, moe_index: int, topk_ids: torch.Tensor, predicted=None):
        self.counts[moe_index] += torch.bincount(topk_ids.flatten(), minlength=self.counts.shape[1])
        return self.tables[moe_index], self.views

    def end_step(self) -> None:
        pass

    def activations(self) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(r) for r in self.counts.tolist())


class Stack:
    """Random experts in a host store plus one router per layer."""

    def __init__(self, seed: int = 0, layers: int = L, experts: int = E) -> None:
        g = torch.Generator().manual_seed(seed)
        self.layers, self.experts = layers, experts
        self.layout = ExpertLayout.make("fp32", D, F)
        self.store = HostExpertStore.allocate(layers, experts, self.layout, pin=False)
        for l in range(layers):
            for e in range(experts):
                w13 = torch.randn(2 * F, D, generator=g) / D ** 0.5
                w2 = torch.randn(D, F, generator=g) / F ** 0.5
                self.store.write(l, e, self.layout.pack({"w13": w13, "w2": w2}))
        self.routers = [torch.randn(experts, D, generator=g) for _ in range(layers)]

    def offloaded(self, slots: int | None, depth: int = 0, policy: str = "lru", **kw) -> ExpertManager:
        """A manager with ``slots`` pool slots. Its direct reads gather only the experts two or more tokens
        of a step use (``gather_min_uses`` 2), so that the kernels' own reads of host memory, and the fill
        slots they write, stay under test; pass ``tuning`` for the engine's default (every missing expert
        gathered)."""
        kw.setdefault("tuning", ResidencyTuning(gather_min_uses=2))
        pool = None if slots is None else slots * self.layout.nbytes
        return ExpertManager(self.layout, self.store, self.experts, "cpu", pool, depth, policy,
                                self.routers, route, **kw)

    def resident(self) -> "ReferenceExperts":
        """The oracle: every expert in one buffer, slot k holding store row k, uses counted on the host."""
        return ReferenceExperts(self.store.rows.clone(), self.layers, self.experts, self.layout)

    def adopted(self, depth: int = 0, policy: str = "lru", **kw) -> ExpertManager:
        """The manager as a model whose experts all fit loads it: a full pool over a device buffer."""
        return ExpertManager.resident(self.layout, self.store.rows.clone(), self.experts, depth, policy,
                                      self.routers, route, **kw)

    def step(self, provider, x: torch.Tensor, prompt: bool = False) -> torch.Tensor:
        """One forward over every layer: x [T, D] -> [T, D]; ``prompt``: as a step with a prompt's tokens."""
        provider.begin_step(prompt=prompt)
        try:
            for l in range(self.layers):
                provider.before_layer(l, x)
                w, ids = route(x @ self.routers[l].t())
                slot_of, views, *host = provider.acquire(l, ids)       # host: direct reads of slot -1
                x = x + fused_moe_ref(x, ids, w, slot_of, views, self.layout, *host)
        finally:
            provider.end_step()
        return x

    def run(self, provider, x: torch.Tensor, steps: int, between=None, prompt: bool = False) -> list[torch.Tensor]:
        """``steps`` forwards feeding each output back (like decoding); ``between(i)`` runs after step i."""
        outs = []
        for i in range(steps):
            x = self.step(provider, x, prompt)
            outs.append(x.clone())
            x = torch.tanh(x)
            if between is not None:
                between(i)
        return outs


def generate_with_changes(llm, prompts: list[list[int]], params, change):
    """Generate ``prompts`` step by step, applying the live options ``change(step)`` after every step.
    Returns (token ids per prompt, steps)."""
    eng = llm.engine
    ids = {eng.add_request(None, p, params): i for i, p in enumerate(prompts)}
    out = {i: [] for i in ids.values()}
    step = 0
    while eng.has_unfinished():
        for d in eng.step():
            out[ids[d.request_id]] += d.new_token_ids
        llm.reconfigure(**change(step))
        step += 1
    return [out[i] for i in range(len(prompts))], step


def generate_with_resizes(llm, prompts: list[list[int]], params, pool_slots: list[int], nbytes: int):
    """Generate ``prompts`` step by step, resizing the pool (``pool_slots[i % n]`` slots of ``nbytes``)
    and cycling the prefetch depth 0-2 after every step. Returns (token ids per prompt, steps)."""
    return generate_with_changes(llm, prompts, params, lambda step: dict(
        expert_pool_size=pool_slots[step % len(pool_slots)] * nbytes, prefetch_depth=step % 3))


def run_layers(stack: "Stack", prov, x: torch.Tensor) -> torch.Tensor:
    """Every MoE layer of one step through ``prov`` as the model drives it: predict, route, acquire,
    then the reference MoE over the slots (and host rows) it answered with."""
    for l in range(L):
        prov.before_layer(l, x)
        w, ids = route(x @ stack.routers[l].t())
        slot_of, views, *host = prov.acquire(l, ids)
        x = x + fused_moe_ref(x, ids, w, slot_of, views, stack.layout, *host)
    return x

