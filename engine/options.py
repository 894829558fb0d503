"""The live options: the settings that change while the engine runs, each described once.

``LIVE_OPTIONS`` is the one list the CLI's flags, the workbench's knobs, ``EngineConfig`` and the live-change
code read: an option's name (the ``EngineConfig`` field), its label, its kind, the values it takes, its unit
and its help line. ``parse_live`` checks a value once and returns it in its one parsed form; a bad value
raises ``ConfigError`` with one line naming the cause and the fix.

An expert pool size has one parsed form: bytes (``int``), a :class:`PoolShare` of all routed experts
("50%", resolved to bytes by :func:`pool_bytes` once the experts' bytes are known, at load), or None
("every expert that fits").
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from engine.errors import ConfigError

EXPERT_POLICIES = ("lfu", "lru", "adaptive", "static")
EXPERT_READS = ("auto", "copy", "direct")
COLD_EXPERTS = ("auto", "bus", "cpu")
KV_DTYPES = ("auto", "bf16", "int8", "fp8")
KINDS = ("int", "size", "choice", "bool")

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([KMGT]?)(I?B)?\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class LiveOption:
    """One setting that ``reconfigure`` applies between engine steps."""

    name: str                       # the EngineConfig field and the key of a live change
    label: str                      # the knob's name in the workbench (short: the dock is narrow)
    kind: str                       # "int" | "size" | "choice" | "bool"
    help: str                       # one line, for --help and the knob's tooltip
    unit: str = ""                  # what an int counts ("layers", "tokens"); "" for the other kinds
    low: int = 0                    # int: the smallest value accepted
    knob_max: int = 1 << 20         # int: the largest value the knob offers (larger ones are accepted)
    choices: tuple[str, ...] = ()   # choice: the values accepted
    automatic: bool = False         # None is accepted and means "chosen by the engine"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"live option {self.name}: kind {self.kind!r} is not one of {KINDS}")


LIVE_OPTIONS: tuple[LiveOption, ...] = (
    LiveOption("prefetch_depth", "Prefetch depth", "int", "MoE layers to prefetch ahead (0 = off)", unit="layers",
               low=0, knob_max=8),
    LiveOption("expert_pool_size", "Expert pool", "size",
               "GPU expert pool: bytes, e.g. 10G, or a share of the experts, e.g. 50% (default: every expert that "
               "fits)", automatic=True),
    LiveOption("expert_policy", "Eviction policy", "choice", "pool eviction policy", choices=EXPERT_POLICIES),
    LiveOption("expert_reads", "Expert reads", "choice",
               "how decode steps bring missing experts over the bus: read from host memory by the kernels (direct) "
               "or copied into the pool first",
               choices=EXPERT_READS),
    LiveOption("cold_experts", "Cold experts", "choice",
               "missing experts: over the bus or computed by the host CPU, the CPU's share chosen by measured "
               "step times (auto), or always the bus or the CPU", choices=COLD_EXPERTS),
    LiveOption("max_batch", "Max batch", "int", "requests decoded together", unit="requests", low=1, knob_max=1024),
    LiveOption("max_batch_tokens", "Max batch tokens", "int", "token budget per step", unit="tokens", low=1,
               automatic=True),
    LiveOption("prefill_chunk", "Prefill chunk", "int", "longest prompt slice per step", unit="tokens", low=1),
    LiveOption("kv_cache_dtype", "KV cache dtype", "choice", "KV cache storage", choices=KV_DTYPES),
    LiveOption("cuda_graphs", "CUDA graphs", "bool", "capture decode steps in CUDA graphs (default: on a CUDA GPU)",
               automatic=True),
)
LIVE_NAMES: frozenset[str] = frozenset(o.name for o in LIVE_OPTIONS)
_BY_NAME = {o.name: o for o in LIVE_OPTIONS}


def option(name: str) -> LiveOption:
    """The live option called ``name``; ConfigError when there is none."""
    if name not in _BY_NAME:
        raise ConfigError(f"{name} cannot change while running; live options are {', '.join(sorted(LIVE_NAMES))} "
                          "— restart the engine to change the others")
    return _BY_NAME[name]


@dataclass(frozen=True)
class PoolShare:
    """An expert pool of ``percent`` % of all routed experts' bytes; bytes once those are known."""

    percent: float       # 0..100

    def __str__(self) -> str:
        return f"{self.percent:g}%"


PoolSize = int | PoolShare | None     # bytes, a share of the experts, or None: every expert that fits


def pool_bytes(size: PoolSize, total_bytes: int) -> int | None:
    """A parsed pool size in bytes, a share resolved against ``total_bytes`` (every routed expert's)."""
    if isinstance(size, PoolShare):
        return int(total_bytes * size.percent / 100.0)
    return size


def parse_size(value: int | float | str | None, name: str = "size") -> int | None:
    """``"10G"`` -> 10737418240; ints pass through; None stays None (meaning "automatic")."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ConfigError(f"{name} must be a size such as 10G or 512M, not {value!r}")
    if isinstance(value, (int, float)):
        if value != value:
            raise ConfigError(f"{name}={value!r} is not a size; write bytes or a number with K, M, G or T, e.g. 10G")
        if value < 0:
            raise ConfigError(f"{name} must not be negative (got {value}); use 0 or a size such as 10G")
        return _at_most_max(int(min(value, 2 * MAX_SIZE)), value, name)
    m = _SIZE_RE.match(str(value))
    if not m:
        raise ConfigError(f"{name}={value!r} is not a size; write bytes or a number with K, M, G or T, e.g. 10G")
    return _at_most_max(int(min(float(m.group(1)) * _UNITS[m.group(2).upper()], 2 * MAX_SIZE)), value, name)


MAX_SIZE = 1 << 50          # 1 PiB: more memory than any one machine has


def _at_most_max(n: int, value: object, name: str) -> int:
    if n > MAX_SIZE:
        raise ConfigError(f"{name}={value!r} is more memory than any machine has (over 1 PiB); give a size such "
                          "as 24G")
    return n


def _pool_size(name: str, value: object) -> PoolSize:
    """Bytes, a size string ("10G"), a share of all experts ("50%") or None, in the parsed form."""
    if isinstance(value, PoolShare) or (isinstance(value, str) and value.strip().endswith("%")):
        try:
            share = value.percent if isinstance(value, PoolShare) else float(value.strip()[:-1])
        except ValueError:
            share = -1.0
        if share > 100.0 and share != float("inf"):      # a share past all of them: every expert is all there is
            raise ConfigError(f"{name}={str(value)!r} is more than all the experts; give at most 100%")
        if not 0.0 <= share <= 100.0:
            raise ConfigError(f"{name}={str(value)!r} is not a share of the experts; write e.g. 50%")
        return PoolShare(share)
    return parse_size(value, name)


def _integer(o: LiveOption, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < o.low:
        raise ConfigError(f"{o.name} must be an integer >= {o.low} (got {value!r})")
    return value


def _choice(o: LiveOption, value: object) -> str:
    if value not in o.choices:
        raise ConfigError(f"{o.name}={value!r} is not supported; choose one of {', '.join(o.choices)}")
    return value


def _flag(o: LiveOption, value: object) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{o.name} must be true or false (got {value!r})")
    return value


def parse_live(name: str, value: object) -> object:
    """``value`` of the live option ``name`` checked and in its parsed form (a pool size: see PoolSize).

    Raises ConfigError with one line naming the cause and the fix: an unknown option, a value of the
    wrong type, below the option's smallest value or not one of its choices.
    """
    o = option(name)
    if value is None and o.automatic:
        return None
    if o.kind == "int":
        return _integer(o, value)
    if o.kind == "size":
        return _pool_size(o.name, value)
    if o.kind == "choice":
        return _choice(o, value)
    return _flag(o, value)
