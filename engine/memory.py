"""The GPU memory budget: what goes where, and how big an expert pool fits.

One budget (``--gpu-memory-budget``, default: the card's free memory) covers resident weights
(embeddings, attention, norms, routers, shared experts, LM head), the expert pool (slots plus
its staging slots), the KV cache and a workspace reserve for activations. On the CPU there is no
budget: every expert stays in the "pool" and the plan only reports sizes.

``plan_memory`` is pure arithmetic so that ``main.py info`` can print it before anything loads.

Sliding-window layers (gpt-oss) keep their KV in a pool of fixed size (:mod:`engine.kv.sizing`): the
plan takes it off the budget first (``window_kv_bytes``) and sizes the rest of the KV cache in tokens of
the full-attention layers (``kv_bytes_per_token`` then counts those layers only).
"""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from engine.config import format_size
from engine.errors import ConfigError

if TYPE_CHECKING:
    from engine.checkpoint.spec import ModelSpec
    from engine.config import EngineConfig

MIN_KV_TOKENS = 4096                     # KV reserve kept before an automatic pool takes the rest
CPU_KV_CAP = 256 << 20                   # bytes of KV cache on the CPU when no size is given
DEFAULT_WORKSPACE = 1 << 30              # activations, logits, kernel scratch



ALLOC_ENV = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


def prefer_expandable_segments(environ=os.environ) -> bool:
    """Have torch's CUDA allocator grow its segments in place rather than reserve new blocks, unless the
    user configured the allocator. With no pool the card then holds what the engine allocates: 1627
    against 1923 MiB after a load, 825 against 1359 MiB after a close (H100, memory_gap,
    ``validate_2026-12-06b.json``), decode graphs included. Returns whether it was set."""
    if any(environ.get(name) for name in ALLOC_ENV):
        return False
    setter = _allocator_setter()
    if setter is None:
        return False
    try:
        setter("expandable_segments:True")
    except Exception:          # a build or driver without them: the allocator's default stands
        return False
    return True


def _allocator_setter():
    """torch's call that changes the allocator's settings at run time (its name moved between versions:
    the older one warns that it is deprecated), or None."""
    setter = getattr(torch._C, "_accelerator_setAllocatorSettings", None)
    if setter is not None:
        return setter
    older = getattr(torch.cuda.memory, "_set_allocator_settings", None)
    if older is None:
        return None

    def quietly(settings: str) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            older(settings)
    return quietly

@dataclass(frozen=True)
class BudgetAdvice:
    """What the user can still change when a plan does not fit, so that the fix a message names works."""

    card_free: int | None = None         # bytes free on the card; None: planning for a card not here
    smaller_experts: str = "use --weight-format int4"   # "" when the experts are int4 already
    smaller_resident: str = ""           # e.g. "use --dtype bfloat16" when the resident weights are fp32

    def _raise_budget(self, budget: int) -> list[str]:
        if self.card_free is None:
            return ["raise --gpu-memory-budget"]
        if budget < self.card_free:
            return [f"raise --gpu-memory-budget (the card has {format_size(self.card_free)} free)"]
        return []

    def resident_fix(self, budget: int, shortfall: int = 0, resident: int = 0, workspace: int = 0) -> str:
        """What makes ``resident`` + ``workspace`` bytes fit ``budget``, ``shortfall`` bytes short: only
        the fixes that can close the gap (8-bit or bfloat16 resident weights save at most half of them;
        a shorter prefill chunk shrinks the step workspace, of which about 64 MiB stays)."""
        fixes = self._raise_budget(budget)
        if workspace - (64 << 20) >= shortfall > 0:
            fixes.append(f"lower --prefill-chunk (the step workspace takes {format_size(workspace)})")
        if self.smaller_resident and (shortfall <= 0 or resident // 2 >= shortfall):
            fixes.append(self.smaller_resident)
        return _either(fixes or ["free memory on the GPU (other programs hold it) or use a GPU with more memory"])

    def pool_fix(self, budget: int) -> str:
        fixes = ["lower --expert-pool-size (or leave it out: the pool then takes what fits)"]
        return _either(fixes + self._raise_budget(budget) + ([self.smaller_experts] if self.smaller_experts else []))

    def staging_fix(self, budget: int, batch_bound: bool, workspace: int) -> str:
        """With no expert pooled, the staging (what a layer of a decode step of max_batch sequences can
        miss, at least half a layer's experts) or the step workspace beside it has to shrink:
        ``batch_bound`` when the batch, not the half layer, sizes the staging."""
        fixes = (["lower --max-batch"] if batch_bound else []) + \
            [f"lower --prefill-chunk (the step workspace takes {format_size(workspace)})"] + self._raise_budget(budget)
        return _either(fixes + [f for f in (self.smaller_resident, self.smaller_experts) if f])


def smaller_resident(float32: bool, resident_format: str) -> str:
    """The flag that shrinks the resident weights, for :class:`BudgetAdvice`: bfloat16 from float32, else 8-bit
    matrices from 16-bit ones ("" when they are 8-bit already)."""
    if float32:
        return "use --dtype bfloat16"
    return "use --resident-weights int8" if resident_format == "bf16" else ""


FOUR_BIT = ("int4", "mxfp4")     # expert formats int4 would not make smaller: no budget advice to convert


def _either(fixes: list[str]) -> str:
    return fixes[0] if len(fixes) == 1 else ", ".join(fixes[:-1]) + " or " + fixes[-1]


@dataclass(frozen=True)
class MemoryPlan:
    """Where every byte goes (all sizes in bytes)."""

    budget_bytes: int | None             # None: no budget (CPU)
    resident_bytes: int
    workspace_bytes: int
    expert_bytes: int                    # one routed expert, packed
    num_experts: int                     # routed experts over all MoE layers (L * E)
    pool_slots: int
    staging_slots: int
    kv_bytes: int
    kv_bytes_per_token: int
    active_experts_per_token: int        # routed experts one token reads (MoE layers x top-k)
    window_kv_bytes: int = 0             # the sliding-window layers' KV pool (engine.kv.sizing), fixed size
    host_resident_bytes: int = 0         # resident tensors kept in host memory (the embedding table)
    note: str = ""                       # why the pool is empty though the budget has room for some experts

    @property
    def pool_bytes(self) -> int:
        """Bytes of the pool slots (without staging): what ``--expert-pool-size`` asks for."""
        return self.pool_slots * self.expert_bytes

    @property
    def staging_bytes(self) -> int:
        return self.staging_slots * self.expert_bytes

    @property
    def kv_tokens(self) -> int:
        """Tokens of context the KV cache holds (all sequences together)."""
        return self.kv_bytes // self.kv_bytes_per_token if self.kv_bytes_per_token else 0

    @property
    def host_bytes(self) -> int:
        """Pinned host store: every routed expert (kept even when the pool holds them all)."""
        return self.num_experts * self.expert_bytes

    @property
    def pool_fraction(self) -> float:
        return self.pool_slots / self.num_experts if self.num_experts else 1.0

    def pool_room(self, kv_cache_bytes: int) -> int | None:
        """Bytes the pool and its staging may grow to (a live resize): the budget less everything else on
        the card, ``kv_cache_bytes`` being the full-attention KV as allocated; None without a budget."""
        if self.budget_bytes is None:
            return None
        return (self.budget_bytes - self.resident_bytes - self.workspace_bytes - kv_cache_bytes
                - self.window_kv_bytes)

    @property
    def total_bytes(self) -> int:
        """Device bytes the plan uses."""
        return (self.resident_bytes + self.pool_bytes + self.staging_bytes + self.kv_bytes + self.window_kv_bytes
                + self.workspace_bytes)

    def bus_bytes_per_token(self, hit_rate: float | None = None) -> float:
        """Expected host-to-device bytes per decoded token (one sequence) at ``hit_rate``.

        Default hit rate: the pool fraction, which is what near-uniform routing gives.
        """
        rate = self.pool_fraction if hit_rate is None else hit_rate
        return (1.0 - rate) * self.active_experts_per_token * self.expert_bytes

    def format(self, hit_rate: float | None = None, bus_gb_s: float | None = None) -> list[str]:
        """Lines for ``main.py info``."""
        budget = "none (CPU)" if self.budget_bytes is None else format_size(self.budget_bytes)
        rate = self.pool_fraction if hit_rate is None else hit_rate
        bus = self.bus_bytes_per_token(hit_rate)
        lines = [
            f"GPU memory budget : {budget}",
            f"resident weights  : {format_size(self.resident_bytes)}",
            f"expert pool       : {format_size(self.pool_bytes)} = {self.pool_slots}/{self.num_experts} experts "
            f"({self.pool_fraction:.0%}) of {format_size(self.expert_bytes)}"
            + (f", + {self.staging_slots} staging slots ({format_size(self.staging_bytes)})" if self.staging_slots else ""),
            f"KV cache          : {format_size(self.kv_bytes)} = {self.kv_tokens} tokens"
            + (f" (full-attention layers), + {format_size(self.window_kv_bytes)} for the sliding-window layers"
               if self.window_kv_bytes else ""),
            f"workspace         : {format_size(self.workspace_bytes)}",
            f"device total      : {format_size(self.total_bytes)}",
            f"host store        : {format_size(self.host_bytes)} (pinned on CUDA)"
            + (f", + the embedding table ({format_size(self.host_resident_bytes)})" if self.host_resident_bytes else ""),
            f"bus per token     : {format_size(int(bus))} at a {rate:.0%} hit rate",
        ]
        if bus_gb_s and bus > 0:
            lines.append(f"copy-bound speed  : {bus_gb_s * 1e9 / bus:.1f} tok/s at {bus_gb_s:g} GB/s")
        return lines


def staging_slots(experts_per_layer: int, decode_experts: int | None = None) -> int:
    """Staging slots of a pool that holds fewer than all experts: room for what a layer of a decode step
    can miss, ``decode_experts`` (batch x top-k; the prefetches of the layers ahead take what it leaves),
    at most one layer's worth, and at least half a layer's, so that a
    prefill layer that misses every expert runs in two passes (engine/experts/copy_path.LayerPasses);
    None: one layer's worth."""
    if decode_experts is None:
        return experts_per_layer
    return min(experts_per_layer, max(decode_experts, -(-experts_per_layer // 2)))


def step_workspace_bytes(spec: "ModelSpec", token_budget: int, max_batch: int, elem: int = 2) -> int:
    """Device bytes a step of ``token_budget`` tokens allocates besides the weights, the pool and the KV
    cache (activations, the MoE kernels' per-pair rows, router and prediction logits, the sampled rows'
    logits), with a quarter on top and 64 MiB for kernel scratch and the recorded decode graphs.

    Per token: the MoE's float32 pair outputs and gathered inputs (k x D x (4 + elem)), its gate/up and
    activation rows (2 x k x F x elem), a dozen residual-stream rows, the attention's projections, and
    float32 router and prediction logits; per sequence: float32 logits over the vocabulary, thrice. A
    dense or shared-expert MLP wider than the routed experts' rows counts instead of them.
    Measured on a Qwen3-30B-A3B-shaped model (benchmarks/memory_profile.py) a step allocated about
    0.9 of the unpadded per-token figure.
    """
    d, k = spec.hidden, max(spec.top_k, 1)
    heads, kv_heads, hd = spec.num_heads, spec.num_kv_heads, spec.head_dim
    ffn = max(2 * k * spec.moe_ffn, 3 * spec.dense_ffn, 3 * spec.shared_ffn)        # the widest MLP's rows
    attention, context = (heads + 2 * kv_heads) * hd + 2 * heads * hd, 0
    if spec.mla:     # projections, the latent queries and outputs, the up-projected outputs (engine/models/mla.py)
        from engine.models.mla import DECODE_BYTES, PREFILL_BYTES
        m = spec.mla
        attention = heads * hd + max(m.q_lora_rank, 1) + m.latent_dim + 2 * heads * m.latent_dim + heads * m.v_head_dim
        context = DECODE_BYTES + PREFILL_BYTES       # the bounded chunks of context rows and scores of a layer
    per_token = (k * d * (4 + elem) + ffn * elem + 12 * d * elem + attention * elem + 4 * spec.num_experts * 4)
    per_sequence = 3 * spec.vocab_size * 4
    return int(1.25 * (token_budget * per_token + max_batch * per_sequence + context)) + (64 << 20)


def decode_experts(spec: "ModelSpec", config: "EngineConfig") -> int:
    """The staging slots ``config``'s decode steps are sized for with experts pooled: one layer's misses at
    most (batch x top-k), whatever the prefetch depth. The prefetches of the layers ahead take what that
    layer leaves and give way to its misses (engine/experts/copy_path.py). Depth x batch x top-k held a
    whole layer's worth at batch 8, top-8, depth 2: 128 slots, 1.1 GiB at bf16 on the Qwen3-30B-A3B shape,
    where a step with a quarter of the experts pooled missed about 20 of a layer's experts
    (llamacpp_kit_2026-12-07b.json)."""
    return config.max_batch * spec.top_k


def direct_experts(spec: "ModelSpec", config: "EngineConfig", gpu: bool = True) -> int | None:
    """The staging a decode step of ``config`` needs at no pool when it reads its missing experts directly
    (on a GPU, ``expert_reads`` not ``copy``, every step of at most ``direct_max_tokens`` tokens): one
    layer's distinct experts (batch x top-k), which the step gathers into staging and reuses layer after
    layer; a step at prefetch depth 0 copies as many in. Its claims take what staging is left. None where
    decode steps copy their misses and prefetch the layers ahead (:func:`decode_experts`). Where direct
    reads turn out not to be possible (a host store that is not page-locked) or ``expert_reads`` changes
    to ``copy`` live, copied steps work in that one layer's staging: their prefetches of later layers
    give way to the layer's own misses (engine/experts/copy_path.py), which costs speed, not results."""
    from engine.experts.tuning import ResidencyTuning
    if not gpu or config.expert_reads == "copy" or config.max_batch > ResidencyTuning().direct_max_tokens:
        return None
    return config.max_batch * spec.top_k


def step_sizing(spec: "ModelSpec", config: "EngineConfig", elem: int = 2,
                gpu: bool = True) -> dict[str, int | None]:
    """``plan_memory``'s workspace and staging arguments for ``config``'s steps on ``spec``: what its
    largest step allocates (:func:`step_workspace_bytes` at the token budget), :func:`decode_experts` and
    :func:`direct_experts` (``gpu``: the plan is for a GPU)."""
    return {"workspace_bytes": step_workspace_bytes(spec, config.token_budget, config.max_batch, elem),
            "decode_experts": decode_experts(spec, config), "direct_experts": direct_experts(spec, config, gpu)}


def table_on_host(wanted: str, tied: bool, offloaded: bool) -> bool:
    """Whether the embedding table goes to host memory on a GPU: ``wanted`` (``config.embeddings``) host,
    or auto while the pool holds fewer than all experts; never a table tied to the LM head."""
    return not tied and (wanted == "host" or (wanted == "auto" and offloaded))


def kv_asked_bytes(asked: int | None, window_bytes: int, kv_bytes_per_token: int, context: int,
                   max_batch: int) -> int | None:
    """The full-attention KV bytes ``--kv-cache-size`` (``asked``) allocates, which the budget must hold
    beside the pool: the size less the window layers' pool, at most what a full batch fills (None: not asked)."""
    if not asked:
        return None
    return min(max(0, asked - window_bytes), kv_bytes_per_token * context * max_batch)


def kv_pool_bytes(plan: MemoryPlan, context: int, max_batch: int, asked: int | None = None) -> int:
    """Bytes of the full-attention KV pool: the KV size ``asked`` for (``--kv-cache-size``) less the
    window pool, else what ``plan`` leaves (on the CPU, :data:`CPU_KV_CAP`); either way at most a full
    batch of ``max_batch`` sequences at ``context`` tokens, which is all the scheduler can fill."""
    full = plan.kv_bytes_per_token * context * max_batch
    if asked:
        return min(max(0, asked - plan.window_kv_bytes), full)
    return min(plan.kv_bytes if plan.budget_bytes is not None else CPU_KV_CAP, full)


def fit_context(context: int, explicit: bool, kv_bytes: int, kv_bytes_per_token: int, block: int,
                budget_bytes: int, card: str = "") -> tuple[int, str | None]:
    """The context length a KV cache of ``kv_bytes`` (what the budget leaves it) holds for one sequence:
    ``context`` when it fits; else, for a context the user did not set, the whole blocks that fit, with a
    note; a context the user set that does not fit is a one-line ConfigError naming the fixes. ``card``
    ("GPU 1") names the card whose budget it is, where there are several."""
    tokens = _tokens_held(context, kv_bytes, kv_bytes_per_token, block)
    if tokens is None:
        return context, None
    more = "lower --expert-pool-size or raise --gpu-memory-budget"
    budget, of = format_size(budget_bytes), f" of {card}" if card else ""
    if explicit or tokens < block:
        fix = f"lower --max-model-len to {tokens} or {more}" if tokens >= block else more
        raise ConfigError(f"a context of {context} tokens needs {format_size(context * kv_bytes_per_token)} of KV cache "
                          f"but the {budget} GPU memory budget{of} leaves it {format_size(kv_bytes)}; {fix}")
    return tokens, (f"context length {tokens} tokens (the model allows {context}): that is what the KV cache the "
                    f"{budget} budget{of} leaves holds; {more} for a longer one")


def kv_size_note(asked: int, window_bytes: int, kv_bytes_per_token: int, context: int, max_batch: int) -> str | None:
    """A note when ``--kv-cache-size`` (``asked``) is more than a full batch can fill: what is allocated
    instead (:func:`kv_pool_bytes` caps it), and how to make use of more."""
    full = kv_bytes_per_token * context * max_batch
    if not kv_bytes_per_token or asked - window_bytes <= full:
        return None
    return (f"--kv-cache-size {format_size(asked)} is more than {max_batch} sequences of {context} tokens can fill; "
            f"{format_size(full + window_bytes)} is allocated (raise --max-batch or --max-model-len to use more)")


def fit_context_to_kv_size(context: int, explicit: bool, asked: int, window_bytes: int, kv_bytes_per_token: int,
                           block: int) -> tuple[int, str | None]:
    """:func:`fit_context` for a KV cache whose size the user gave (``asked``, ``--kv-cache-size``, of
    which the window layers' pool takes ``window_bytes`` first): the context it holds for one sequence,
    with a note when the context was not set, else a one-line ConfigError naming a size that fits."""
    tokens = _tokens_held(context, max(0, asked - window_bytes), kv_bytes_per_token, block)
    if tokens is None:
        return context, None
    need = format_size(_round_up(window_bytes + context * kv_bytes_per_token))
    if explicit or tokens < block:
        fix = (f"raise --kv-cache-size to {need}" + (f" or lower --max-model-len to {tokens}" if tokens >= block else ""))
        raise ConfigError(f"a context of {context} tokens needs {need} of KV cache but --kv-cache-size gives "
                          f"{format_size(asked)} (room for {tokens} tokens); {fix}")
    return tokens, (f"context length {tokens} tokens (the model allows {context}): what the {format_size(asked)} "
                    f"KV cache --kv-cache-size gives holds; raise it to {need} for the whole context")


def rope_table_bytes_per_token(spec: ModelSpec, element_size: int) -> int:
    """Bytes of RoPE's cos and sin tables a position of context adds (the model holds both, per position)."""
    return 2 * (spec.mla.qk_rope if spec.mla else spec.head_dim) * element_size


def fit_context_on_host(context: int, explicit: bool, kv_bytes: int, window_bytes: int, kv_bytes_per_token: int,
                        block: int, table_bytes_per_token: int = 0) -> tuple[int, str | None]:
    """The context of a CPU run that set neither a context nor a KV size: what the default KV cache of
    ``kv_bytes`` (:data:`CPU_KV_CAP`, the full-attention layers') holds for one sequence, with a note, where
    the model allows more (a context the user set is kept: the cache grows to hold one sequence of it).
    ``window_bytes``: the sliding-window layers' pool, which a ``--kv-cache-size`` would also hold."""
    tokens = _tokens_held(context, kv_bytes, kv_bytes_per_token, block)
    if tokens is None or explicit:
        return context, None
    tokens = max(tokens, block)
    whole = window_bytes + context * kv_bytes_per_token
    need = format_size(_round_up(whole))
    note = (f"context length {tokens} tokens (the model allows {context}): what the {format_size(kv_bytes)} KV cache "
            f"of a CPU run holds; ")
    free = available_host_bytes()
    if free is not None and whole > free * HOST_ROOM_SHARE:     # the whole context would not fit this machine
        most = (max(0, int(free * HOST_ROOM_SHARE) - window_bytes) // max(1, kv_bytes_per_token + table_bytes_per_token)
                // block * block)
        return tokens, note + (f"the whole context needs {need}, more than this machine's {format_size(free)} of "
                               f"free memory; --max-model-len {most} is about the most it holds")
    return tokens, note + f"pass --max-model-len {context} or --kv-cache-size {need} for the whole context"


HOST_ROOM_SHARE = 0.9       # of the host memory free at load, what a CPU run's context may take


def available_host_bytes() -> int | None:
    """Host memory free for new allocations (Linux's MemAvailable, else the free pages), None where unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


def check_host_room(context: int, kv_bytes: int, window_bytes: int, kv_bytes_per_token: int, table_bytes_per_token: int,
                    block: int, asked_kv: int | None, available: int | None, beside: str = "") -> None:
    """A CPU run's allocations that grow with the context (its KV cache, ``kv_bytes`` for the full-attention
    layers and ``window_bytes`` for the window layers, and the RoPE tables, ``table_bytes_per_token`` a
    position) against ``HOST_ROOM_SHARE`` of the ``available`` host memory: a one-line ConfigError naming
    the largest ``--kv-cache-size`` (when one was given) or ``--max-model-len`` that fits, rather than a
    process the system kills for want of memory part way through the load. ``beside``: what ``available``
    leaves out, for the message (" beside the model's weights")."""
    if available is None:
        return
    room = int(available * HOST_ROOM_SHARE)
    need = kv_bytes + window_bytes + context * table_bytes_per_token
    if need <= room:
        return
    one_sequence = window_bytes + context * (kv_bytes_per_token + table_bytes_per_token)
    if asked_kv and one_sequence <= room:        # a smaller cache still holds one sequence of this context
        most = _round_down(room - context * table_bytes_per_token)
        raise ConfigError(f"--kv-cache-size {format_size(asked_kv)} makes a KV cache of "
                          f"{format_size(kv_bytes + window_bytes)}, more than the {format_size(available)} of memory "
                          f"this machine has free{beside} holds; give --kv-cache-size {format_size(most)} or less")
    tokens = max(0, room - window_bytes) // max(1, kv_bytes_per_token + table_bytes_per_token) // block * block
    if asked_kv and tokens >= block and context * kv_bytes_per_token >= kv_bytes - block * kv_bytes_per_token:
        # the context is what the asked cache holds (the model's own limit is longer): a smaller cache
        # shortens both, so the size to give is the cache's
        most = _round_down(tokens * kv_bytes_per_token)
        raise ConfigError(f"--kv-cache-size {format_size(asked_kv)} holds a context of {context} tokens, whose KV cache "
                          f"and position tables need {format_size(need)}, more than the {format_size(room)} they may "
                          f"take ({HOST_ROOM_SHARE:.0%} of the {format_size(available)} of memory this machine has "
                          f"free{beside}); give --kv-cache-size {format_size(most)} or less")
    fix = f"lower --max-model-len to {tokens} or less" if tokens >= block else "free memory or use a smaller model"
    raise ConfigError(f"a context of {context} tokens needs {format_size(need)} of host memory for its KV cache, but "
                      f"this machine has {format_size(available)} of memory free{beside}; {fix}")


def _tokens_held(context: int, kv_bytes: int, kv_bytes_per_token: int, block: int) -> int | None:
    """None when ``kv_bytes`` of KV cache hold ``context`` tokens, else the whole blocks' tokens they hold."""
    if kv_bytes_per_token <= 0 or kv_bytes >= context * kv_bytes_per_token:
        return None
    return kv_bytes // kv_bytes_per_token // block * block


def _round_up(n: int) -> int:
    """``n`` bytes rounded up to what :func:`format_size` prints (two decimals of its unit), so that the
    size printed, given back, fits: 1.50 MiB where 1.5 MiB is needed, not 2 MiB."""
    div = next((d for d in (1 << 40, 1 << 30, 1 << 20, 1 << 10) if n >= d), 1)
    if div == 1:
        return n
    hundredths = -(-n * 100 // div)
    return -(-hundredths * div // 100)


def _round_down(n: int) -> int:
    """``n`` bytes rounded down to what :func:`format_size` prints (two decimals of its unit), so that the
    size printed, given back, is no more than ``n``."""
    div = next((d for d in (1 << 40, 1 << 30, 1 << 20, 1 << 10) if n >= d), 1)
    return n if div == 1 else n * 100 // div * div // 100


def default_budget(device: torch.device) -> int | None:
    """Free memory of the card (None on the CPU)."""
    if device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    return int(free)


def plan_memory(resident_bytes: int, expert_bytes: int, num_experts: int, kv_bytes_per_token: int,
                budget_bytes: int | None, requested_pool: int | None = None,
                workspace_bytes: int = DEFAULT_WORKSPACE, experts_per_layer: int = 0,
                active_experts_per_token: int = 0, min_kv_tokens: int = MIN_KV_TOKENS,
                advice: BudgetAdvice = BudgetAdvice(), window_kv_bytes: int = 0,
                host_resident_bytes: int = 0, decode_experts: int | None = None,
                direct_experts: int | None = None, kv_asked_bytes: int | None = None,
                kv_share: float = 1.0) -> MemoryPlan:
    """Split ``budget_bytes`` between resident weights, expert pool (+ staging), KV cache, workspace.

    ``num_experts`` counts routed experts over all MoE layers; ``experts_per_layer`` sizes the
    staging slots (one layer's worth and more when the pool holds fewer than all experts).
    ``requested_pool`` (bytes) None means as many experts as fit after a KV reserve of
    ``min_kv_tokens`` tokens. Raises a one-line ConfigError when the resident part alone, or the
    requested pool, does not fit, naming the fixes ``advice`` says are open. ``window_kv_bytes``: the
    sliding-window layers' KV, which does not grow with the context (``kv_bytes_per_token`` then counts
    the full-attention layers only). ``host_resident_bytes``: resident tensors in host memory (reported).
    ``decode_experts`` sizes the staging slots beyond one layer's (:func:`staging_slots`); with no pool
    (asked for, or all the budget leaves), ``direct_experts`` does where it is given: such steps fill no
    slots for the pool to admit. ``kv_asked_bytes``: the full-attention KV cache the user asked for
    (``--kv-cache-size`` less the window pool, at most what a full batch fills), kept out of the pool's room
    instead of the reserve of ``min_kv_tokens``; one that does not fit beside the pool is a ConfigError
    naming the size that does (``kv_share``: the share of ``--kv-cache-size`` this card allocates, a
    pipeline stage's, by which that size is scaled back to the flag's).
    """
    no_pool = requested_pool is not None and requested_pool < expert_bytes
    staging = staging_slots(experts_per_layer, direct_experts if no_pool and direct_experts else decode_experts)
    staging_for = lambda slots: 0 if slots >= num_experts else staging   # noqa: E731
    want = num_experts if requested_pool is None else min(requested_pool // expert_bytes, num_experts)
    if budget_bytes is None:
        slots = want
        return MemoryPlan(None, resident_bytes, workspace_bytes, expert_bytes, num_experts, slots,
                          staging_for(slots), 0, kv_bytes_per_token, active_experts_per_token, window_kv_bytes,
                          host_resident_bytes)
    fixed = resident_bytes + workspace_bytes + window_kv_bytes
    if fixed > budget_bytes:
        window = f", sliding-window KV ({format_size(window_kv_bytes)})" if window_kv_bytes else ""
        raise ConfigError(
            f"the resident weights ({format_size(resident_bytes)}){window} and workspace ({format_size(workspace_bytes)}) "
            f"need {format_size(fixed)} but the GPU memory budget is {format_size(budget_bytes)}; "
            f"{advice.resident_fix(budget_bytes, fixed - budget_bytes, resident_bytes, workspace_bytes)}")
    left = budget_bytes - fixed
    reserve = kv_asked_bytes if kv_asked_bytes is not None else min_kv_tokens * kv_bytes_per_token
    note = ""
    if requested_pool is None:
        room = max(0, left - reserve)
        slots = min(num_experts, room // expert_bytes)
        if slots < num_experts:                 # staging comes out of the same room
            slots = max(0, min(slots, (room - staging * expert_bytes) // expert_bytes))
        if slots == 0 and room >= expert_bytes:
            short = format_size(_round_up((staging + 1) * expert_bytes - room))
            kv = " or lower --kv-cache-size" if kv_asked_bytes is not None else ""
            note = (f"no expert is pooled: the room the budget leaves holds {room // expert_bytes} experts, no more "
                    f"than the {staging} staging slots a pooled step needs beside them, so every expert crosses "
                    f"the bus and the room goes to the KV cache; raise --gpu-memory-budget by {short}{kv} for a pool")
        if slots == 0 and direct_experts:       # the budget leaves no pool: staged as one asked for none
            staging = staging_slots(experts_per_layer, direct_experts)
    else:
        slots = want
    pool = (slots + staging_for(slots)) * expert_bytes
    if pool > left and slots == 0:
        raise ConfigError(
            f"the {staging} staging slots that missing experts pass through ({format_size(staging * expert_bytes)}) "
            f"do not fit the {format_size(left)} left after resident weights and workspace in the "
            f"{format_size(budget_bytes)} budget; "
            f"{advice.staging_fix(budget_bytes, staging > -(-experts_per_layer // 2), workspace_bytes)}")
    if pool > left:
        raise ConfigError(
            f"an expert pool of {format_size(slots * expert_bytes)} (+ {format_size(staging_for(slots) * expert_bytes)} "
            f"staging) does not fit the {format_size(left)} left after resident weights and workspace in the "
            f"{format_size(budget_bytes)} budget; {advice.pool_fix(budget_bytes)}")
    if kv_asked_bytes is not None and pool + kv_asked_bytes > left:
        what = "the expert pool and its staging" if slots else "the staging slots of missing experts"
        pooled = f", {what} ({format_size(pool)})" if pool else ""
        room = _round_down(max(0, left - pool) + window_kv_bytes)
        flag = _round_down(int(room / kv_share))      # the whole size of which this card allocates kv_share
        share = "" if kv_share == 1.0 else f"this card's {kv_share:.0%} share of "
        fixes = ([f"lower --kv-cache-size to {format_size(flag)}"] if flag else []) + \
            (["lower --expert-pool-size"] if requested_pool else []) + advice._raise_budget(budget_bytes) \
            or ["free memory on the GPU (other programs hold it) or use a GPU with more memory"]
        raise ConfigError(
            f"the {format_size(kv_asked_bytes + window_kv_bytes)} KV cache {share}--kv-cache-size allocates (at most "
            f"what a full batch fills) does not fit the {format_size(budget_bytes)} GPU memory budget: the resident "
            f"weights, workspace{pooled} leave it "
            f"{format_size(max(0, left - pool) + window_kv_bytes)}; {_either(fixes)}")
    return MemoryPlan(budget_bytes, resident_bytes, workspace_bytes, expert_bytes, num_experts, slots,
                      staging_for(slots), left - pool, kv_bytes_per_token, active_experts_per_token, window_kv_bytes,
                      host_resident_bytes, note)
