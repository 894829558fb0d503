"""Live options on every card of a pipeline (or of expert parallel), all or none, in two phases.

1. check: every stage checks the change against its own card (engine/live.py ``check_stage``: a bad
   value, a pool its budget cannot hold), changing nothing; the other stages check while the first
   one does. A refusal anywhere ends the change there, every stage as it was.
2. apply: once all accepted it, the other stages apply it, then the first stage. A card that fails
   to apply a change it accepted (an allocation that fails) has the stages that applied it given
   their previous values back; the first stage, applying last, has not changed.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from engine.config import EngineConfig
from engine.errors import ReconfigureError, StrataError

if TYPE_CHECKING:
    from engine.parallel.pipeline import Pipeline

# the live options each stage applies to its own card (engine/live.py apply_to_stage)
STAGE_OPTIONS = ("expert_pool_size", "prefetch_depth", "expert_policy", "expert_reads", "cold_experts",
                 "kv_cache_dtype")


class StageChanges:
    """The stages' live options as they stand (what an undone change puts back)."""

    def __init__(self, config: EngineConfig) -> None:
        self.live = {k: getattr(config, k) for k in STAGE_OPTIONS}

    def apply(self, group: "Pipeline", options: dict, notes: dict) -> dict[str, str]:
        """``options``' stage options on every stage of ``group`` (see the module docstring); what each
        became (the other stages' answers join where they differ from the first's). One
        ReconfigureError names the stages that refused."""
        from engine.live import apply_to_stage
        stage_options = {k: v for k, v in options.items() if k in STAGE_OPTIONS}
        if not stage_options:
            return {}
        _check_all(group, stage_options)
        answers = group.ask_all(("reconfigure", stage_options, notes), "reconfigured")
        failed = [(w.rank, got[1]) for w, got in zip(group.workers, answers) if got[1] is not None]
        if failed:
            self._undo(group, list(stage_options))
            raise ReconfigureError(f"{_by_reason(failed)}; no stage changed")
        try:
            applied = apply_to_stage(group.first, stage_options, notes)
        except StrataError as e:
            self._undo(group, list(stage_options))
            raise ReconfigureError(f"stage 0: {e}; no stage changed") from None
        self.live.update(stage_options)
        for w, got in zip(group.workers, answers):
            for k, text in got[2].items():
                if applied.get(k) != text:
                    applied[k] = f"{applied.get(k, '')}; stage {w.rank}: {text}".lstrip("; ")
        return applied

    def _undo(self, group: "Pipeline", names: list[str]) -> None:
        """Put the live options ``names`` back to their values before a change a card failed to apply,
        on every other stage (the first stage has not applied it)."""
        before = {k: self.live[k] for k in names}
        answers = group.ask_all(("reconfigure", before, {}), "reconfigured")
        failed = [f"stage {w.rank}: {got[1]}" for w, got in zip(group.workers, answers) if got[1] is not None]
        if failed:
            group.fail(f"a refused live change could not be undone ({'; '.join(failed)}); every stage was stopped "
                        "— load the model again")


def _check_all(group: "Pipeline", stage_options: dict) -> None:
    """Every stage checks the change; one ReconfigureError names those that refused (nothing changed)."""
    from engine.live import check_stage
    for w in group.workers:
        group.send(w, ("check", stage_options))
    refused = []
    try:
        check_stage(group.first, stage_options)
    except StrataError as e:
        refused.append((0, str(e)))
    answers = [group.expect(w, "checked") for w in group.workers]
    refused += [(w.rank, got[1]) for w, got in zip(group.workers, answers) if got[1] is not None]
    if refused:
        raise ReconfigureError(f"{_by_reason(refused)}; no stage changed")


def _by_reason(refusals: list[tuple[int, str]]) -> str:
    """``stage 1: why; stage 2: why not``: stages that give the same reason are named once together."""
    reasons: dict[str, list[str]] = {}
    for rank, why in refusals:
        reasons.setdefault(why, []).append(str(rank))
    return "; ".join(f"stage {ranks[0]}: {why}" if len(ranks) == 1 else
                     f"stages {', '.join(ranks[:-1])} and {ranks[-1]}: {why}" for why, ranks in reasons.items())
