"""Which layers each pipeline stage holds.

Every stage owns a contiguous run of layers and at least one MoE layer; the first also holds the
embedding, the final norm and the LM head (it samples). The split minimises the largest share of
a card's budget that its stage owns, counting resident weights and routed experts: with equal
budgets every card keeps the same share of its experts in its pool, so the bus traffic of the
misses (and the time a stage spends on them) is spread as evenly as the layers allow.

Legend: L layers, S stages.
"""
from __future__ import annotations

from dataclasses import dataclass

from engine.checkpoint.plan import TensorEntry, quantisable, tensor_plan
from engine.checkpoint.spec import ModelSpec
from engine.config import format_size
from engine.errors import ConfigError


@dataclass(frozen=True)
class Stage:
    rank: int                        # process (and GPU) index; 0 is the engine's own process
    start: int                       # first layer
    end: int                         # one past the last layer
    moe_start: int                   # MoE layers before ``start`` (the stage's first MoE layer's global index)
    moe_layers: int                  # MoE layers in the stage
    resident_bytes: int              # its resident weights on its GPU (the first stage: with embedding and LM head)
    expert_bytes: int                # its routed experts, packed

    @property
    def head(self) -> bool:
        """Holds the embedding, final norm and LM head."""
        return self.rank == 0

    @property
    def layers(self) -> str:
        return f"{self.start}-{self.end - 1}" if self.end - self.start > 1 else str(self.start)


@dataclass(frozen=True)
class PipelinePlan:
    stages: tuple[Stage, ...]

    @property
    def size(self) -> int:
        return len(self.stages)

    @property
    def expert_bytes(self) -> int:
        return sum(s.expert_bytes for s in self.stages)

    def pool_fraction(self, rank: int) -> float:
        """The share of the routed experts' bytes stage ``rank`` holds (how a pool size in bytes is split)."""
        total = self.expert_bytes
        return self.stages[rank].expert_bytes / total if total else 1.0 / self.size

    def kv_fraction(self, rank: int) -> float:
        """The share of an explicit ``--kv-cache-size`` stage ``rank`` allocates: its share of the layers."""
        layers = sum(s.end - s.start for s in self.stages)
        s = self.stages[rank]
        return (s.end - s.start) / layers if layers else 1.0 / self.size

    def lines(self) -> list[str]:
        """One line per stage, as ``info`` and the load log print them."""
        return [f"stage {s.rank} (GPU {s.rank}): layers {s.layers} ({_count(s.end - s.start, 'layer')}, {s.moe_layers} MoE), "
                f"resident {format_size(s.resident_bytes)}{' with embedding and LM head' if s.head else ''}, "
                f"routed experts {format_size(s.expert_bytes)}" for s in self.stages]


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _entry_bytes(t: TensorEntry, elem: int, resident: str) -> int:
    n = 1
    for d in t.shape:
        n *= d
    return n + 4 * t.shape[0] if resident in ("fp8", "int8") and quantisable(t) else n * elem


def layer_costs(spec: ModelSpec, elem: int, resident: str, expert_bytes: int) -> tuple[list[int], list[int], int]:
    """(resident bytes per layer, routed expert bytes per layer, bytes of the embedding, final norm
    and LM head) of ``spec`` with ``elem`` bytes per resident value and ``expert_bytes`` per expert."""
    res = [0] * spec.num_layers
    head = 0
    for t in tensor_plan(spec):
        if t.category == "routed_experts":
            continue
        if t.layer < 0:
            head += _entry_bytes(t, elem, resident)
        else:
            res[t.layer] += _entry_bytes(t, elem, resident)
    experts = [spec.num_experts * expert_bytes if moe else 0 for moe in spec.moe_layers]
    return res, experts, head


def plan_pipeline(spec: ModelSpec, size: int, elem: int, resident: str, expert_bytes: int,
                  budgets: tuple[int | None, ...] | None = None) -> PipelinePlan:
    """The split of ``spec`` over ``size`` stages (see the module docstring); ``budgets`` per card
    weigh the stages (None: equal cards)."""
    moe_layers = spec.num_moe_layers
    if size > moe_layers:
        raise ConfigError(f"pipeline_parallel={size} needs at least one MoE layer per stage but the model has "
                          f"{moe_layers}; use --pipeline-parallel {max(1, moe_layers)} or fewer")
    res, exp, head = layer_costs(spec, elem, resident, expert_bytes)
    weights = [1.0] * size
    if budgets and all(b for b in budgets):
        top = max(budgets)
        weights = [top / b for b in budgets]
    L = spec.num_layers
    pre = [0]
    for r, e in zip(res, exp):
        pre.append(pre[-1] + r + e)
    moe_pre = [0]
    for m in spec.moe_layers:
        moe_pre.append(moe_pre[-1] + int(m))
    inf = float("inf")
    # best[s][j]: the smallest largest weighted cost splitting layers [0, j) into stages 0..s
    best = [[inf] * (L + 1) for _ in range(size)]
    cut = [[0] * (L + 1) for _ in range(size)]
    for j in range(1, L + 1):
        if moe_pre[j] >= 1:
            best[0][j] = (pre[j] + head) * weights[0]
    for s in range(1, size):
        for j in range(1, L + 1):
            for i in range(1, j):
                if best[s - 1][i] == inf or moe_pre[j] - moe_pre[i] < 1:
                    continue
                cost = max(best[s - 1][i], (pre[j] - pre[i]) * weights[s])
                if cost < best[s][j]:
                    best[s][j], cut[s][j] = cost, i
    bounds, j = [L], L
    for s in range(size - 1, 0, -1):
        j = cut[s][j]
        bounds.append(j)
    bounds.append(0)
    bounds.reverse()
    stages = []
    for rank in range(size):
        a, b = bounds[rank], bounds[rank + 1]
        stages.append(Stage(rank, a, b, moe_pre[a], moe_pre[b] - moe_pre[a],
                            sum(res[a:b]) + (head if rank == 0 else 0), sum(exp[a:b])))
    return PipelinePlan(tuple(stages))
