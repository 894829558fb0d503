"""Engine configuration: one frozen dataclass that validates itself.

Sizes accept bytes (int) or strings such as ``"10G"``, ``"512M"``, ``"1.5GiB"``. The options named
in :data:`LIVE_OPTIONS` can change while the engine runs (``LLM.reconfigure``); the rest need a
reload.
"""
from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field

from engine.errors import ConfigError

WEIGHT_FORMATS = ("auto", "bf16", "int4", "fp8", "mxfp4")
DTYPES = ("auto", "float32", "bfloat16", "float16")
KV_DTYPES = ("auto", "bf16", "int8", "fp8")
EXPERT_POLICIES = ("lfu", "lru", "adaptive", "static")
EXPERT_READS = ("auto", "copy", "direct")
DIRECT_READS = {"auto": None, "copy": False, "direct": True}   # expert_reads -> OffloadedExperts(direct_reads=)
GROUP_SIZES = (32, 64, 128)
DEFAULT_GROUP_SIZE = 128

#: Options that ``reconfigure`` applies between engine steps without a reload.
LIVE_OPTIONS = frozenset({
    "expert_pool_size", "prefetch_depth", "expert_policy", "expert_reads", "max_batch", "max_batch_tokens",
    "prefill_chunk", "kv_cache_dtype", "cuda_graphs",
})

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([KMGT]?)(I?B)?\s*$", re.IGNORECASE)


def parse_size(value: int | float | str | None, name: str = "size") -> int | None:
    """``"10G"`` -> 10737418240; ints pass through; None stays None (meaning "automatic")."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ConfigError(f"{name} must be a size such as 10G or 512M, not {value!r}")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ConfigError(f"{name} must not be negative (got {value}); use 0 or a size such as 10G")
        return int(value)
    m = _SIZE_RE.match(str(value))
    if not m:
        raise ConfigError(f"{name}={value!r} is not a size; write bytes or a number with K, M, G or T, e.g. 10G")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def parse_pool_size(value: int | float | str | None, total_bytes: int | None = None) -> int | str | None:
    """An expert pool size: bytes, a size string ("10G"), or a share of all experts ("50%").

    Without ``total_bytes`` a share stays the validated string "N%"; with it, it becomes bytes.
    """
    if isinstance(value, str) and value.strip().endswith("%"):
        try:
            share = float(value.strip()[:-1])
        except ValueError:
            share = -1.0
        if not 0.0 <= share <= 100.0:
            raise ConfigError(f"expert_pool_size={value!r} is not a share of the experts; write e.g. 50%")
        return f"{share:g}%" if total_bytes is None else int(total_bytes * share / 100.0)
    return parse_size(value, "expert_pool_size")


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
    expert_pool_size: int | str | None = None  # bytes, "10G" or "50%" of the experts; None = as many as fit
    prefetch_depth: int = 2              # layers ahead to prefetch; 0 = synchronous offload
    expert_policy: str = "adaptive"      # eviction policy of the pool (engine/experts/policy.py)
    # Missing experts of small decode steps at prefetch depth >= 1: "auto" reads them straight from
    # host memory where the kernels can (CUDA), "copy" always copies them in first, "direct" insists.
    expert_reads: str = "auto"
    routing_profile: str | None = None   # JSON of per-layer expert counts for the static policy
    record_routing: str | None = None    # write such a JSON when the engine closes
    max_batch: int = 16                  # running requests decoded together
    max_batch_tokens: int | None = None  # token budget per step; None = max(prefill_chunk, max_batch)
    prefill_chunk: int = 2048            # longest prompt slice prefilled in one step
    kv_cache_dtype: str = "auto"
    kv_block_size: int = 16
    max_model_len: int | None = None     # None = from the checkpoint, capped by the KV budget
    kv_cache_size: int | None = None     # bytes of KV cache; None = what the budget leaves
    gpu_memory_budget: int | None = None  # bytes; None = free memory of the card
    cuda_graphs: bool | None = None      # None = where the device has them (CUDA); True on the CPU is noted and ignored
    cpu_threads: int | None = None       # CPU math threads; None = chosen by model size (engine/cpu_threads.py)
    verify: bool = False                 # check a converted folder's SHA-256 sums even if remembered as good
    seed: int = 0
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        for name in ("gpu_memory_budget", "kv_cache_size"):
            object.__setattr__(self, name, parse_size(getattr(self, name), name))
        object.__setattr__(self, "expert_pool_size", parse_pool_size(self.expert_pool_size))
        _choice("dtype", self.dtype, DTYPES)
        _choice("weight_format", self.weight_format, WEIGHT_FORMATS)
        _choice("kv_cache_dtype", self.kv_cache_dtype, KV_DTYPES)
        _choice("expert_policy", self.expert_policy, EXPERT_POLICIES)
        _choice("expert_reads", self.expert_reads, EXPERT_READS)
        if self.group_size not in GROUP_SIZES:
            raise ConfigError(f"group_size={self.group_size} is not supported; choose 32, 64 or 128")
        _positive("prefetch_depth", self.prefetch_depth, 0)
        _positive("max_batch", self.max_batch)
        _positive("prefill_chunk", self.prefill_chunk)
        _positive("kv_block_size", self.kv_block_size)
        if self.max_batch_tokens is not None:
            _positive("max_batch_tokens", self.max_batch_tokens)
            if self.max_batch_tokens < self.max_batch:
                raise ConfigError(
                    f"max_batch_tokens={self.max_batch_tokens} is below max_batch={self.max_batch}; "
                    "raise max_batch_tokens or lower max_batch")
        if self.max_model_len is not None:
            _positive("max_model_len", self.max_model_len)
        if self.cpu_threads is not None:
            _positive("cpu_threads", self.cpu_threads)
        if self.cuda_graphs not in (None, True, False):
            raise ConfigError(f"cuda_graphs must be true or false (got {self.cuda_graphs!r})")
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
    def token_budget(self) -> int:
        """Tokens one engine step may process (decode tokens + prefill chunk)."""
        return self.max_batch_tokens or max(self.prefill_chunk, self.max_batch)

    def replace(self, **changes) -> "EngineConfig":
        """A validated copy with ``changes`` applied (raises ConfigError on a bad value)."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ConfigError(f"unknown option(s): {', '.join(sorted(unknown))}")
        return dataclasses.replace(self, **changes)
