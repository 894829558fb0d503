"""Which NUMA node a GPU hangs off, and binding host work to that node's CPUs.

On a multi-socket host a pinned buffer on the far socket crosses the inter-socket link on every
copy; allocating (first touch) and copying from a thread bound to the GPU's node keeps host memory
and DMA on the same socket. A single-node host needs nothing, and we only report what we saw.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

SYS_NODES = Path("/sys/devices/system/node")
SYS_PCI = Path("/sys/bus/pci/devices")


@dataclass(frozen=True)
class NumaPlacement:
    """What was detected and whether the calling thread was bound."""

    nodes: int                     # NUMA nodes with CPUs on this host (1 on a single-socket host)
    gpu_node: int | None           # node of the GPU's PCI device; None: unknown or CPU run
    cpus: tuple[int, ...] = ()     # CPUs of gpu_node
    bound: bool = False            # the allocating / copying thread was bound to `cpus`

    def describe(self) -> str:
        """One line for logs and ``main.py info``."""
        if self.gpu_node is None:
            return f"NUMA: {self.nodes} node(s), GPU node unknown, no binding"
        state = f"bound to CPUs {_ranges(self.cpus)}" if self.bound else "no binding needed"
        return f"NUMA: {self.nodes} node(s), GPU on node {self.gpu_node}, {state}"


def parse_cpulist(text: str) -> tuple[int, ...]:
    """``"0-3,8,10-11"`` -> (0, 1, 2, 3, 8, 10, 11)."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return tuple(cpus)


def _ranges(cpus: tuple[int, ...]) -> str:
    if len(cpus) <= 4:
        return ",".join(map(str, cpus))
    return f"{cpus[0]}..{cpus[-1]} ({len(cpus)})"


def cpu_nodes(root: Path = SYS_NODES) -> dict[int, tuple[int, ...]]:
    """NUMA node -> its CPUs, for nodes that have CPUs; {} when sysfs has no node information."""
    out: dict[int, tuple[int, ...]] = {}
    for node_dir in sorted(root.glob("node[0-9]*")):
        try:
            cpus = parse_cpulist((node_dir / "cpulist").read_text())
        except OSError:
            continue
        if cpus:
            out[int(node_dir.name[4:])] = cpus
    return out


def gpu_bus_id(device: torch.device) -> str | None:
    """PCI bus id of a CUDA device in sysfs form (``0000:18:00.0``), or None."""
    if device.type != "cuda":
        return None
    props = torch.cuda.get_device_properties(device)
    domain, bus, dev = (getattr(props, k, None) for k in ("pci_domain_id", "pci_bus_id", "pci_device_id"))
    if bus is None or dev is None:
        return None
    return f"{domain or 0:04x}:{bus:02x}:{dev:02x}.0"


def gpu_numa_node(bus_id: str | None, root: Path = SYS_PCI) -> int | None:
    """NUMA node of a PCI device from sysfs; None when unknown (sysfs reports -1 then)."""
    if bus_id is None:
        return None
    try:
        node = int((root / bus_id.lower() / "numa_node").read_text().strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def place_near(device: torch.device) -> NumaPlacement:
    """Detect the topology and, on a multi-node host, bind the calling thread to the GPU's node.

    The binding stays in force for the calling thread, so host memory it touches afterwards (the
    pinned store) lands on that node and copies it issues start from there.
    """
    nodes = cpu_nodes()
    node = gpu_numa_node(gpu_bus_id(device))
    if node is None or node not in nodes:
        return NumaPlacement(nodes=max(len(nodes), 1), gpu_node=node)
    if len(nodes) == 1:
        return NumaPlacement(nodes=1, gpu_node=node, cpus=nodes[node])
    try:
        os.sched_setaffinity(0, nodes[node])
        bound = True
    except OSError:
        bound = False
    return NumaPlacement(nodes=len(nodes), gpu_node=node, cpus=nodes[node], bound=bound)
