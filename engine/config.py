"""Engine configuration: one frozen dataclass that validates itself.

Sizes accept bytes (int) or strings such as ``"10G"``, ``"512M"``, ``"1.5GiB"``. The options in
:data:`engine.options.LIVE_OPTIONS` can change while the engine runs (``LLM.reconfigure``) and are
checked by :func:`engine.options.parse_live`, here as there; the rest need a reload.
"""
from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field

from engine.errors import ConfigError
from engine.options import (EXPERT_POLICIES, EXPERT_READS, KV_DTYPES, LIVE_NAMES, PoolSize, parse_live,
                            parse_size)

__all__ = ["DEFAULT_GROUP_SIZE", "DIRECT_READS", "DTYPES", "EXPERT_POLICIES", "EXPERT_READS", "EngineConfig",
           "GROUP_SIZES", "KV_DTYPES", "LIVE_OPTIONS", "WEIGHT_FORMATS", "format_size", "parse_size"]

WEIGHT_FORMATS = ("auto", "bf16", "int4", "fp8", "mxfp4")
DTYPES = ("auto", "float32", "bfloat16", "float16")
# resident weights on the device: auto = as stored (a converted folder's fp8 / int8 stays so, else the dtype);
# bf16 = the activations' dtype (float32 on the CPU); fp8 / int8 = 8 bits with a scale per output row
RESIDENT_WEIGHTS = ("auto", "bf16", "fp8", "int8")
EMBEDDINGS = ("auto", "device", "host")
DIRECT_READS = {"auto": None, "copy": False, "direct": True}   # expert_reads -> ExpertManager(direct_reads=)
GROUP_SIZES = (32, 64, 128)
DEFAULT_GROUP_SIZE = 128

#: The names of the options ``reconfigure`` applies between engine steps (engine.options describes them).
LIVE_OPTIONS = LIVE_NAMES


def format_size(n: int | None) -> str:
    """Bytes as a short human string: 1.50 GiB, 12.0 MiB."""
    if n is None:
        return "auto"
    for unit, div in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= div:
            return f"{n / div:.2f} {unit}"
    return f"{n} B"


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{name}={value!r} is not supported; choose one of {', '.join(allowed)}")


def _positive(name: str, value: int, minimum: int = 1) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigError(f"{name} must be an integer >= {minimum} (got {value!r})")


def _budget(value: object, cards: int) -> int | tuple[int, ...] | None:
    """A budget in bytes, or one per card ("24G,20G", a list or tuple) of a pipeline over ``cards`` GPUs."""
    if isinstance(value, str) and "," in value:
        value = [v for v in value.split(",")]
    if not isinstance(value, (list, tuple)):
        return parse_size(value, "gpu_memory_budget")
    sizes = tuple(parse_size(v, "gpu_memory_budget") for v in value)
    if None in sizes or len(sizes) != cards:
        raise ConfigError(f"gpu_memory_budget lists {len(sizes)} sizes for {cards} GPU{'s' if cards > 1 else ''}; give "
                          f"one size per GPU (e.g. {','.join(['24G'] * cards)}) or one size for all of them")
    return sizes[0] if cards == 1 else sizes


@dataclass(frozen=True)
class EngineConfig:
    """Everything the engine needs to load and run a model."""

    model: str
    device: str = "auto"                 # "auto" (cuda if present), "cpu", "cuda", "cuda:1"
    dtype: str = "auto"                  # activations/resident weights; auto = bf16 on cuda, fp32 on cpu
    # routed experts: auto = as stored (the dtype for dense experts, mxfp4 as shipped, a converted folder's
    # format); int4 / fp8 / mxfp4 / bf16 quantise (or dequantise) at load
    weight_format: str = "auto"
    group_size: int = DEFAULT_GROUP_SIZE  # int4 group along K when quantising at load
    # attention, dense and shared-expert MLPs and the LM head on the device (RESIDENT_WEIGHTS above)
    resident_weights: str = "auto"
    # the token embedding table (read one row per token): "host" keeps it in page-locked host memory the
    # GPU reads rows from; "auto" does so on a CUDA GPU when experts are offloaded (not when it is tied to
    # the LM head, which reads all of it)
    embeddings: str = "auto"
    # bytes ("10G" is read as bytes), a PoolShare ("50%" of the experts, bytes once loaded); None = as many as fit
    expert_pool_size: PoolSize | str = None
    prefetch_depth: int = 2              # layers ahead to prefetch; 0 = synchronous offload
    expert_policy: str = "adaptive"      # eviction policy of the pool (engine/experts/policy.py)
    # Missing experts of small decode steps at prefetch depth >= 1: "auto" reads them straight from
    # host memory where the kernels can (CUDA), "copy" always copies them in first, "direct" insists.
    expert_reads: str = "auto"
    # Missing experts over the bus or computed by the host CPU (engine/experts/cold.py): "auto" by the
    # cost model (on a CUDA GPU; the bus alone on the CPU, which has none), "bus", "cpu".
    cold_experts: str = "auto"
    routing_profile: str | None = None   # JSON of per-layer expert counts for the static policy
    record_routing: str | None = None    # write such a JSON when the engine closes
    max_batch: int = 16                  # running requests decoded together
    max_batch_tokens: int | None = None  # token budget per step; None = max(prefill_chunk, max_batch)
    prefill_chunk: int = 2048            # longest prompt slice prefilled in one step
    kv_cache_dtype: str = "auto"
    kv_block_size: int = 16
    max_model_len: int | None = None     # None = from the checkpoint, capped by the KV budget
    kv_cache_size: int | None = None     # bytes of KV cache; None = what the budget leaves
    # bytes; None = free memory of the card. With pipeline_parallel N: the cards' total, split evenly,
    # or one value per card ("24G,20G", a list or tuple)
    gpu_memory_budget: int | tuple[int, ...] | None = None
    cuda_graphs: bool | None = None      # None = where the device has them (CUDA); True on the CPU is noted and ignored
    # launch each decode step before reading the last one's tokens back, where every request decodes and
    # every expert is on the device (engine/engine.py LLMEngine.step): the host's work between steps
    # then overlaps the GPU's
    overlap_steps: bool = True
    cpu_threads: int | None = None       # CPU math threads; None = chosen by model size (engine/cpu_threads.py)
    verify: bool = False                 # check a converted folder's SHA-256 sums even if remembered as good
    pipeline_parallel: int = 1           # GPUs of this host the layers are split over, one process each
    # a pipeline's steps in groups of sequences that follow each other down the stages; None = auto
    # (one per stage for decode steps on GPUs, 1 on the CPU)
    pipeline_microbatches: int | None = None
    expert_parallel: int = 1             # GPUs of this host each MoE layer's experts are spread over
    seed: int = 0
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "kv_cache_size", parse_size(self.kv_cache_size, "kv_cache_size"))
        if self.kv_cache_size == 0:
            raise ConfigError("kv_cache_size must be more than 0; leave it out for what the memory budget leaves, "
                              "or give a size such as 2G")
        _positive("pipeline_parallel", self.pipeline_parallel)
        _positive("expert_parallel", self.expert_parallel)
        if self.expert_parallel > 1 and self.pipeline_parallel > 1:
            raise ConfigError(f"pipeline_parallel={self.pipeline_parallel} and expert_parallel={self.expert_parallel} "
                              "cannot be combined yet; choose one of them")
        if self.pipeline_microbatches is not None:
            _positive("pipeline_microbatches", self.pipeline_microbatches)
        object.__setattr__(self, "gpu_memory_budget", _budget(self.gpu_memory_budget, self.cards))
        for name in (f.name for f in dataclasses.fields(self) if f.name in LIVE_NAMES):
            object.__setattr__(self, name, parse_live(name, getattr(self, name)))
        _choice("dtype", self.dtype, DTYPES)
        _choice("weight_format", self.weight_format, WEIGHT_FORMATS)
        _choice("resident_weights", self.resident_weights, RESIDENT_WEIGHTS)
        _choice("embeddings", self.embeddings, EMBEDDINGS)
        if self.group_size not in GROUP_SIZES:
            raise ConfigError(f"group_size={self.group_size} is not supported; choose 32, 64 or 128")
        _positive("kv_block_size", self.kv_block_size)
        if self.max_batch_tokens is not None and self.max_batch_tokens < self.max_batch:
            raise ConfigError(f"max_batch_tokens={self.max_batch_tokens} is below max_batch={self.max_batch}; "
                              "raise max_batch_tokens or lower max_batch")
        if self.max_model_len is not None:
            _positive("max_model_len", self.max_model_len)
        if self.cpu_threads is not None:
            _positive("cpu_threads", self.cpu_threads)
        for name in ("routing_profile", "record_routing"):
            value = getattr(self, name)
            if isinstance(value, os.PathLike):
                object.__setattr__(self, name, os.fspath(value))
            elif not isinstance(value, (str, type(None))):
                raise ConfigError(f"{name} must be a file path (got {value!r})")
        if not (self.device in ("auto", "cpu", "cuda") or re.fullmatch(r"cuda:\d+", self.device)):
            raise ConfigError(f"device={self.device!r} is not supported; use auto, cpu, cuda or cuda:N")
        if self.expert_policy == "static" and not self.routing_profile:
            raise ConfigError("expert_policy=static needs routing_profile=FILE (record one with --record-routing)")

    @property
    def cards(self) -> int:
        """GPUs the model is spread over (pipeline or expert parallel; 1 for one)."""
        return max(self.pipeline_parallel, self.expert_parallel)

    @property
    def token_budget(self) -> int:
        """Tokens one engine step may process (decode tokens + prefill chunk)."""
        return self.max_batch_tokens or max(self.prefill_chunk, self.max_batch)

    def replace(self, **changes) -> "EngineConfig":
        """A validated copy with ``changes`` applied (raises ConfigError on a bad value)."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ConfigError(f"unknown option(s): {', '.join(sorted(unknown))}")
        return dataclasses.replace(self, **changes)
