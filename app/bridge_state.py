"""Snapshots the bridge takes of the engine for the GUI: the model, the knobs, synthetic prompts.

Called on the bridge thread only, with the live engine object.
"""
from __future__ import annotations

from typing import Any, Callable

from app.messages import KnobState, ModelDescription
from app.paths import read_demo_marker

Wording = Callable[[str], str]      # an engine message in the words of the window that shows it

_FILLER = ("The expert pool keeps hot experts on the GPU while cold ones stream over the bus. "
           "Every token is routed to a few experts in each layer. ")


def describe_model(engine: Any, wording: Wording = str) -> ModelDescription:
    """The loaded model as the window shows it; its load notes (settings the engine clamped or ignored)
    in ``wording``."""
    info = engine.model_info
    marker = read_demo_marker(info.path)
    return ModelDescription(
        name=str(info.name), path=str(info.path), family=str(info.family),
        device=str(engine.stats().device), num_layers=int(info.num_layers),
        num_experts=int(info.num_experts), top_k=int(info.top_k), params=int(info.params),
        is_demo=info.is_demo or marker is not None, random_weights=info.random_weights,
        has_chat_template=bool(engine.tokenizer.has_chat_template) and not info.completion_only,
        notes=tuple(wording(note) for note in info.notes), context_tokens=int(engine.loaded.max_model_len),
        reasons=engine.tokenizer.harmony is not None and not info.completion_only,
        completion_only=bool(info.completion_only), template_broken=engine.tokenizer.template_error is not None)


def all_expert_bytes(engine: Any) -> int:
    """Bytes of every routed expert of every MoE layer."""
    return int(engine.model_info.routed_expert_bytes)


def pool_bounds(engine: Any, stats: Any) -> tuple[int, int]:
    """(slider maximum, current pool bytes): the budget on a GPU, every expert's bytes without one."""
    mem, experts = stats.memory, stats.experts
    current = int(experts.pool_bytes or mem.expert_pool_bytes)
    if mem.budget_bytes:
        return int(mem.budget_bytes), current
    return max(all_expert_bytes(engine), mem.pinned_host_bytes, current), current


def offered_choices(engine: Any, choices: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    """The values each combo box offers for this load: the static placement only where the model was
    loaded with a routing profile (it places the experts from one, which no knob can give)."""
    offered = dict(choices)
    if "expert_policy" in offered and not engine.config.routing_profile:
        offered["expert_policy"] = tuple(c for c in offered["expert_policy"] if c != "static")
    return offered


def knob_state(engine: Any, defaults: dict[str, object], choices: dict[str, tuple[str, ...]],
               wording: Wording = str) -> KnobState:
    """Current live values, the reasons (in ``wording``) some cannot change, the pool bounds and the
    values the combo boxes offer (:func:`offered_choices`)."""
    cfg = engine.config
    reasons = engine.live_options()
    max_bytes, current = pool_bounds(engine, engine.stats())
    return KnobState(
        values=tuple((name, getattr(cfg, name)) for name in sorted(defaults)),
        unsupported=tuple((name, wording(why)) for name, why in sorted(reasons.items()) if why),
        defaults=tuple(sorted(defaults.items())), pool_max_bytes=max_bytes, pool_bytes=current,
        choices=tuple(sorted(offered_choices(engine, choices).items())),
        automatic=(("max_batch_tokens", int(cfg.token_budget)),) if "max_batch_tokens" in defaults else (),
        most=_most(engine, defaults), expert_bytes=int(engine.model_info.expert_bytes or 0))


def _most(engine: Any, defaults: dict[str, object]) -> tuple[tuple[str, int], ...]:
    """The largest values this load takes where the model bounds them: a prefetch depth reaches the last MoE
    layer from the first at most (a deeper one is capped, engine/live.py)."""
    from app.bridge_api import max_prefetch_depth
    spec = getattr(getattr(engine, "loaded", None), "spec", None)
    if "prefetch_depth" not in defaults or spec is None:
        return ()
    return (("prefetch_depth", max_prefetch_depth(spec)),)


def synthetic_prompt(tokenizer: Any, n_tokens: int) -> list[int]:
    """Exactly ``n_tokens`` token ids of ordinary text (for the load test)."""
    ids = list(tokenizer.encode(_FILLER, add_special_tokens=False)) or [0]
    reps = n_tokens // len(ids) + 1
    return (ids * reps)[:n_tokens]
