"""Options that change while the engine runs (``LLMEngine.reconfigure``), applied between steps."""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from engine.config import LIVE_OPTIONS, EngineConfig, format_size
from engine.errors import ConfigError, ReconfigureError
from engine.kv.cache import check_kv_format
from engine.options import parse_live
from engine.settings_fit import depth_note, max_prefetch_depth, pool_size_note

if TYPE_CHECKING:
    from engine.engine import LLMEngine
    from engine.loading import LoadedModel

_SCHEDULER = ("max_batch", "max_batch_tokens", "prefill_chunk")
_EXPERTS = ("expert_pool_size", "prefetch_depth", "expert_policy", "expert_reads", "cold_experts")


class LiveSettings:
    def __init__(self, engine: "LLMEngine") -> None:
        self.engine = engine

    def availability(self) -> dict[str, str | None]:
        """Every live option -> None when it can change now, else the reason it cannot."""
        m = self.engine.loaded
        out: dict[str, str | None] = dict.fromkeys(sorted(LIVE_OPTIONS))
        out["cuda_graphs"] = m.graphs_possible
        return out

    def _fit(self, options: dict) -> tuple[dict, dict[str, tuple[str, ...]]]:
        """Live values past the model's limits clamped, as at load; the notes go into the result."""
        notes: dict[str, tuple[str, ...]] = {}
        if "expert_pool_size" in options and (note := self._pool_note(options["expert_pool_size"])):
            notes["expert_pool_size"] = (note,)
        depth = options.get("prefetch_depth")
        if not isinstance(depth, int) or isinstance(depth, bool):
            return options, notes          # absent, or refused by the config's own check
        note = depth_note(depth, self.engine.loaded.spec)
        if note is None:
            return options, notes
        notes["prefetch_depth"] = (note,)
        return {**options, "prefetch_depth": max_prefetch_depth(self.engine.loaded.spec)}, notes

    def _pool_note(self, value: object) -> str | None:
        """What a pool of ``value`` holds where that is not what its size says: no expert (less than one
        takes) or every one (more than all take)."""
        m = self.engine.loaded
        try:
            asked = m.pool_request(value)
        except ConfigError:
            return None                    # refused with its own line below
        return pool_size_note(asked, m.every_expert_bytes, m.layout.nbytes, name="expert pool size")

    def reconfigure(self, options: dict) -> dict[str, str]:
        unknown = set(options) - LIVE_OPTIONS
        if unknown:
            raise ReconfigureError(not_live(sorted(unknown)))
        avail = self.availability()
        for k in options:
            if avail[k] is not None:
                raise ReconfigureError(f"{k}: {avail[k]}")
        options, notes = self._fit(options)
        try:
            new = self.engine.config.replace(**options)
        except ConfigError as e:
            raise ReconfigureError(str(e)) from None
        m = self.engine.loaded
        # a pipeline has every stage check the change before any applies it, so that a refusal leaves all as they were
        applied = apply_to_stage(m, options, notes) if m.pipeline is None else m.pipeline.reconfigure(options, notes)
        for k in options.keys() & set(_EXPERTS):    # each answer names its option's new value, then the setup
            applied[k] = f"{k} = {_shown(k, options[k])}; {applied[k]}"
        if self.engine.runner.graphs is not None and (options.keys() & {*_EXPERTS, "kv_cache_dtype"}) - {"expert_policy"}:
            self.engine.runner.graphs.reset()   # recorded against the old pool views, look-ahead or KV storage
        sched = self.engine.scheduler
        if any(k in options for k in _SCHEDULER):
            sched.max_batch, sched.prefill_chunk, sched.token_budget = new.max_batch, new.prefill_chunk, new.token_budget
            applied.update({k: f"{k} = {'auto' if options[k] is None else options[k]}" for k in _SCHEDULER if k in options})
            blocks = m.allocator.num_blocks
            if "max_batch" in options and new.max_batch > blocks:   # a sequence holds a KV block at least
                applied["max_batch"] += (f" (the KV cache has {blocks} blocks of {m.allocator.block_size} tokens, so at "
                                         f"most {blocks} sequences run at once, fewer the longer they are)")
        if "cuda_graphs" in options:
            runner = self.engine.runner
            if options["cuda_graphs"] and runner.graphs is None:
                runner.graphs = m.make_graphs() if (m := self.engine.loaded) else None
            runner.use_graphs = bool(options["cuda_graphs"]) and runner.graphs is not None
            applied["cuda_graphs"] = "decode steps replay CUDA graphs" if runner.use_graphs else "CUDA graphs off"
        if "expert_pool_size" in options:
            m = self.engine.loaded
            # a pipeline's config keeps the whole model's size: each stage takes its own share of it again
            new = new.replace(expert_pool_size=(parse_live("expert_pool_size", new.expert_pool_size)
                                                if m.pipeline is not None else m.pool_request(new.expert_pool_size)))
        self.engine.config = new
        return applied


def check_stage(m: "LoadedModel", options: dict) -> None:
    """Raise ReconfigureError when one model's card would refuse the live ``options`` that concern it
    (a bad value, a pool over its budget); changes nothing. A pipeline checks every stage so before it
    applies a change to any."""
    exp = {k: options[k] for k in _EXPERTS if k in options}
    if exp:
        m.experts.check_reconfigure(**_expert_settings(m, exp))
    if "kv_cache_dtype" in options:
        check_kv_format(options["kv_cache_dtype"])


def apply_to_stage(m: "LoadedModel", options: dict, notes: dict[str, tuple[str, ...]] | None = None) -> dict[str, str]:
    """The live options that concern one model's own card (its expert pool and prefetch, its KV
    cache) applied to ``m``; what each became. A pipeline applies them so to every stage."""
    notes = notes or {}
    applied: dict[str, str] = {}
    exp = {k: options[k] for k in _EXPERTS if k in options}
    if exp:
        msg = m.experts.reconfigure(**_expert_settings(m, exp))
        applied.update({k: "; ".join([str(msg or "applied"), *notes.get(k, ())]) for k in exp})
    if "kv_cache_dtype" in options:
        m.cache.convert(options["kv_cache_dtype"])           # in place: running requests keep their context
        applied["kv_cache_dtype"] = f"KV cache now {m.cache.label} ({m.cache.nbytes / 2**20:.1f} MiB)"
    return applied


def _shown(option: str, value: object) -> str:
    """A live value as an answer names it: None is auto, a pool size in bytes reads as a size."""
    if value is None:
        return "auto"
    if option == "expert_pool_size" and isinstance(value, int) and not isinstance(value, bool):
        return format_size(value)
    return str(value)


def _expert_settings(m: "LoadedModel", exp: dict) -> dict:
    """The expert options ``exp`` as ``ExpertManager.reconfigure`` takes them (a pool size in bytes)."""
    pool = None                                  # unchanged
    if "expert_pool_size" in exp:                # None (automatic): every expert that fits, as at load
        pool = m.pool_request(exp["expert_pool_size"])
        pool = m.plan.pool_slots * m.plan.expert_bytes if pool is None else pool
    return dict(pool_bytes=pool, prefetch_depth=exp.get("prefetch_depth"), policy=exp.get("expert_policy"),
                reads=exp.get("expert_reads"), cold=exp.get("cold_experts"))


def not_live(names: list[str]) -> str:
    """One line for ``names`` that cannot change while the engine runs: options that need a restart,
    and names that are no option at all."""
    known = {f.name for f in dataclasses.fields(EngineConfig)}
    restart, none = [n for n in names if n in known], [n for n in names if n not in known]
    parts = ([f"{', '.join(none)}: no such option"] if none else []) + \
        ([f"{', '.join(restart)} cannot change while running"] if restart else [])
    tail = " — restart the engine to change the others" if restart else ""
    return f"{'; '.join(parts)}; live options are {', '.join(sorted(LIVE_OPTIONS))}{tail}"
