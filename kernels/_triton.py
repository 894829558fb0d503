"""Triton, when it is installed; otherwise stand-ins that let kernel modules import.

Kernel modules define their ``@jit`` functions at import time. On machines without Triton (macOS,
Windows, CPU-only wheels) the engine runs the plain-torch references, so importing a kernel module
must still work there; launching a kernel then raises a clear error.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any, Callable

from kernels.errors import ConfigError

__all__ = ["HAS_TRITON", "cdiv", "gdc_launch_dependents", "gdc_wait", "jit", "next_pow2", "pdl_launch", "pdl_supported",
           "tl", "triton"]

try:
    import triton
    import triton.language as tl
    HAS_TRITON = True
except ImportError:  # pragma: no cover - exercised only where Triton is absent
    triton = None
    HAS_TRITON = False

    class _MissingLanguage:
        """Answers attribute look-ups of kernel signatures (``tl.constexpr``) while Triton is absent."""

        def __getattr__(self, name: str) -> Any:
            return object

    tl = _MissingLanguage()


class _Unavailable:
    """A kernel that cannot run because Triton is not installed."""

    def __init__(self, fn: Callable) -> None:
        self.__name__ = fn.__name__

    def __getitem__(self, grid: Any) -> Callable:
        raise ConfigError(f"the Triton kernel {self.__name__} needs the triton package; install it "
                          "or run the engine on CPU, which uses the plain-torch path")


def jit(fn: Callable) -> Any:
    """``triton.jit`` where Triton is installed, else a stand-in that raises when launched."""
    return triton.jit(fn) if HAS_TRITON else _Unavailable(fn)


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative integers."""
    return (a + b - 1) // b


def next_pow2(n: int) -> int:
    """Smallest power of two that is at least ``n`` (and at least 1)."""
    p = 1
    while p < n:
        p *= 2
    return p


PDL_ENABLED = True      # benchmarks set False to time launches without programmatic dependents
gdc_launch_dependents = gdc_wait = None
if HAS_TRITON:
    try:  # grid dependency control (Hopper+): the next kernel launches while this one runs
        from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
    except ImportError:  # older Triton: launches stay serial
        pass


def pdl_supported(device: Any) -> bool:
    """Programmatic dependent launch: a Hopper-or-later GPU and a Triton that exposes it. A kernel
    launched so (``launch_pdl=True``) starts while its predecessor finishes; it must call ``gdc_wait()``
    before it reads anything a kernel before it wrote."""
    return PDL_ENABLED and getattr(device, "type", None) == "cuda" and gdc_wait is not None and _hopper(device)


@lru_cache(maxsize=None)
def _hopper(device: Any) -> bool:
    import torch
    return torch.cuda.get_device_capability(device)[0] >= 9


def pdl_launch(on: bool) -> dict:
    """The launch options of a programmatic dependent (empty when off: older Triton lacks the option)."""
    return {"launch_pdl": True} if on else {}
