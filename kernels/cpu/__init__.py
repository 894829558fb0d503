"""Cold experts computed on the host CPU from the host store, in their stored format.

* :func:`cpu_expert_forward` / :class:`CpuExpertWork`: the kernel and what it is asked to compute;
* :class:`CpuExpertRunner`: the same for one store, checked once (the decode step's path);
* :func:`cpu_expert_forward_ref`: the plain-torch reference;
* :func:`set_cpu_expert_threads`: how many worker threads, and on which CPUs;
* :func:`calibrate` / :class:`CpuExpertCost`: measured seconds per expert and token count, for the
  scheduler's choice between the CPU and the bus.
"""
from kernels.cpu import cache as _cache
from kernels.cpu.calibrate import CpuExpertCost, calibrate
from kernels.cpu.driver import expert_forward as _example
from kernels.cpu.forward import CpuExpertRunner, CpuExpertWork, cpu_expert_forward, cpu_expert_forward_ref
from kernels.cpu.threads import set_cpu_expert_threads

_cache.sync(_example)            # cached kernels compiled from other sources than these are removed

__all__ = ["CpuExpertCost", "CpuExpertRunner", "CpuExpertWork", "calibrate", "cpu_expert_forward", "cpu_expert_forward_ref",
           "set_cpu_expert_threads"]
