"""Host store: every routed expert of every MoE layer, one contiguous row each.

``rows`` is ``uint8 [L * E, nbytes]`` with expert ``e`` of MoE layer ``l`` at row ``l * E + e``
(layout: :class:`kernels.expert_layout.ExpertLayout`), so a miss is one copy of one row.

When the compute device is CUDA the rows are page-locked so that copies run as asynchronous DMA
at full bus speed. We allocate ordinary memory and register it (``cudaHostRegister``) rather than
use ``pin_memory=True``: PyTorch's pinned allocator rounds every request up to a power of two (a
58 GB store would take 64 GB), and registering from a thread bound to the GPU's NUMA node places
the pages on that node. If registering fails we fall back to the pinned allocator.

The rows are asked for on transparent huge pages (2 MiB, ``madvise``) where Linux offers them: the
GPU's kernels that read experts straight from the store, the copy engine and the CPU's expert kernels
then translate an address once per 2 MiB instead of once per 4 KiB.
"""
from __future__ import annotations

import mmap
import sys
import time

import torch

from engine.errors import ConfigError
from kernels.expert_layout import ExpertLayout
from engine.experts.numa import NumaPlacement, place_near


# Host rows of at least this many bytes are asked for on transparent huge pages (benchmarks turn it off
# to compare); smaller ones (tiny models) come from the ordinary allocator.
HOST_HUGE_PAGES = True
HUGE_PAGE = 2 << 20
HUGE_MIN_BYTES = 64 << 20


def host_rows(rows: int, nbytes: int, huge_pages: bool | None = None) -> torch.Tensor:
    """``uint8 [rows, nbytes]`` of host memory, uninitialised; on transparent huge pages when
    ``huge_pages`` (default :data:`HOST_HUGE_PAGES`), the platform has them and the rows are large."""
    huge = HOST_HUGE_PAGES if huge_pages is None else huge_pages
    total = rows * nbytes
    if not huge or total < HUGE_MIN_BYTES or not sys.platform.startswith("linux") \
            or not hasattr(mmap, "MADV_HUGEPAGE"):
        return torch.empty(rows, nbytes, dtype=torch.uint8)
    try:
        area = mmap.mmap(-1, total + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except (OSError, ValueError) as err:
        raise ConfigError(f"could not reserve {total / 2**30:.1f} GiB of host memory for the experts ({err}); "
                          "free host memory or use --weight-format int4") from None
    try:
        area.madvise(mmap.MADV_HUGEPAGE)
    except OSError:              # a kernel without transparent huge pages: ordinary pages, same memory
        pass
    flat = torch.frombuffer(area, dtype=torch.uint8)   # the tensor keeps the mapping alive
    skip = -flat.data_ptr() % HUGE_PAGE
    return flat[skip:skip + total].view(rows, nbytes)


def mapping_field(t: torch.Tensor, key: str) -> list[str]:
    """The values of field ``key`` (``"AnonHugePages"``, ``"VmFlags"``) of the mapping that holds ``t``,
    from /proc/self/smaps ([] where there is none or it cannot be read: not Linux)."""
    ptr = t.data_ptr()
    try:
        with open("/proc/self/smaps") as f:
            inside = False
            for line in f:
                head = line.split(None, 1)[0]
                if "-" in head and not head.endswith(":"):
                    lo, hi = (int(v, 16) for v in head.split("-"))
                    inside = lo <= ptr < hi
                elif inside and head == key + ":":
                    return line.split()[1:]
    except (OSError, ValueError, IndexError):
        pass
    return []


def huge_page_bytes(t: torch.Tensor) -> int:
    """Bytes of the mapping that holds ``t`` that lie on transparent huge pages, at most its storage's
    (Linux; 0 elsewhere or when it cannot be read). The kernel may merge neighbouring mappings of the
    same kind into one, whose count then includes its neighbours': the bound keeps it to this one's size."""
    kib = mapping_field(t, "AnonHugePages")
    return min(int(kib[0]) * 1024, t.untyped_storage().nbytes()) if kib else 0


class HostExpertStore:
    """The routed experts in host memory, written once by the loader and read by the pool."""

    def __init__(self, rows: torch.Tensor, num_layers: int, num_experts: int, layout: ExpertLayout,
                 pinned: bool, pin_seconds: float, numa: NumaPlacement, registered: bool) -> None:
        self.rows = rows                  # uint8 [L * E, nbytes]
        self.num_layers = num_layers
        self.num_experts = num_experts
        self.layout = layout
        self.pinned = pinned
        self.pin_seconds = pin_seconds
        self.numa = numa
        self._registered = registered
        self._direct: bool | None = None

    @classmethod
    def allocate(cls, num_layers: int, num_experts: int, layout: ExpertLayout, pin: bool,
                 device: torch.device | str | None = None) -> "HostExpertStore":
        """Allocate ``uint8 [num_layers * num_experts, layout.nbytes]`` once, page-locked if ``pin``.

        ``pin`` needs CUDA; ``device`` (default: the current CUDA device when pinning) decides the
        NUMA node the memory is placed on. Contents are uninitialised until :meth:`write`.
        """
        if num_layers < 1 or num_experts < 1:
            raise ConfigError(f"a host store needs at least one layer and one expert (got {num_layers} x {num_experts})")
        dev = torch.device(device) if device is not None else torch.device("cuda" if pin else "cpu")
        if pin and not torch.cuda.is_available():
            raise ConfigError("pinned host memory needs CUDA, which is not available; load on --device cpu")
        numa = place_near(dev) if pin else NumaPlacement(nodes=1, gpu_node=None)
        n_rows = num_layers * num_experts
        t0 = time.perf_counter()
        registered = False
        try:
            rows = host_rows(n_rows, layout.nbytes)
        except RuntimeError as err:
            raise ConfigError(
                f"could not allocate {n_rows * layout.nbytes / 2**30:.1f} GiB of host memory for the experts ({err}); "
                "free host memory or use --weight-format int4") from None
        if pin:
            registered = _register(rows)
            if not registered:
                rows = torch.empty(n_rows, layout.nbytes, dtype=torch.uint8, pin_memory=True)
        seconds = time.perf_counter() - t0 if pin else 0.0
        return cls(rows, num_layers, num_experts, layout, pin, seconds, numa, registered)

    @classmethod
    def from_rows(cls, rows: torch.Tensor, num_experts: int, layout: ExpertLayout, pin: bool,
                  device: torch.device | str | None = None) -> "HostExpertStore":
        """Adopt rows a loader already filled (``uint8 [L * E, nbytes]`` on the CPU), page-locking them
        in place when ``pin`` (no copy; falls back to one pinned copy if registering is refused)."""
        if rows.dtype != torch.uint8 or rows.dim() != 2 or rows.shape[1] != layout.nbytes \
                or rows.shape[0] % num_experts or rows.device.type != "cpu":
            raise ValueError(f"expected CPU uint8 [L * {num_experts}, {layout.nbytes}], got "
                             f"{rows.dtype} {tuple(rows.shape)} on {rows.device}")
        rows = rows.contiguous()
        dev = torch.device(device) if device is not None else torch.device("cuda" if pin else "cpu")
        numa = place_near(dev) if pin else NumaPlacement(nodes=1, gpu_node=None)
        t0 = time.perf_counter()
        registered = pin and not rows.is_pinned() and _register(rows)
        if pin and not registered and not rows.is_pinned():
            rows = rows.pin_memory()
        seconds = time.perf_counter() - t0 if pin else 0.0
        return cls(rows, rows.shape[0] // num_experts, num_experts, layout, pin, seconds, numa, registered)

    @property
    def nbytes(self) -> int:
        """Bytes of the whole store."""
        return self.rows.numel()

    @property
    def pinned_bytes(self) -> int:
        """Page-locked bytes (0 when not pinned)."""
        return self.nbytes if self.pinned else 0

    def row_index(self, layer: int, expert: int) -> int:
        """Row of expert ``expert`` of MoE layer ``layer``."""
        if not (0 <= layer < self.num_layers and 0 <= expert < self.num_experts):
            raise IndexError(f"expert ({layer}, {expert}) outside {self.num_layers} x {self.num_experts}")
        return layer * self.num_experts + expert

    def write(self, layer: int, expert: int, packed: torch.Tensor) -> None:
        """Store one packed expert (``uint8 [nbytes]``, see ``ExpertLayout.pack``)."""
        if packed.dtype != torch.uint8 or packed.numel() != self.layout.nbytes:
            raise ValueError(f"expected uint8 [{self.layout.nbytes}], got {packed.dtype} {tuple(packed.shape)}")
        self.rows[self.row_index(layer, expert)].copy_(packed.reshape(-1))

    def layer_rows(self, layer: int) -> torch.Tensor:
        """``uint8 [E, nbytes]`` view of one layer's experts (a loader may fill it in one copy)."""
        return self.rows[layer * self.num_experts:(layer + 1) * self.num_experts]

    def describe(self) -> str:
        """One line: size, pinning and its cost, NUMA placement."""
        gib = self.nbytes / 2**30
        how = (f"pinned in {self.pin_seconds:.2f} s" if self.pinned else "pageable")
        huge = huge_page_bytes(self.rows)
        if huge:
            how += f", {huge / 2**30:.2f} GiB on 2 MiB pages"
        return f"host store: {self.num_layers} x {self.num_experts} experts, {gib:.2f} GiB {how}; {self.numa.describe()}"

    def direct_readable(self, device: torch.device) -> bool:
        """Whether kernels on ``device`` can read the rows in place (pinned, mapped memory that a
        Triton kernel accepts and reads correctly). Probed once with a tiny copy kernel."""
        if self._direct is None:
            self._direct = device.type == "cuda" and self.pinned and _probe_direct(self.rows, device)
        return self._direct

    def close(self) -> None:
        """Unregister page-locked memory (safe to call twice)."""
        if self._registered:
            torch.cuda.cudart().cudaHostUnregister(self.rows.data_ptr())
            self._registered = False

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: the CUDA runtime may be gone already
            pass


_HOST_REGISTER_PORTABLE, _HOST_REGISTER_MAPPED = 1, 2


def _register(rows: torch.Tensor) -> bool:
    """Page-lock ``rows`` in place, mapped into the GPU's address space (so kernels can read experts
    straight from it); False when the runtime refuses (caller falls back)."""
    try:
        err = torch.cuda.cudart().cudaHostRegister(rows.data_ptr(), rows.numel(),
                                                   _HOST_REGISTER_PORTABLE | _HOST_REGISTER_MAPPED)
    except (AttributeError, RuntimeError):
        return False
    code = int(err.value) if hasattr(err, "value") else int(err)
    return code == 0


def _probe_direct(rows: torch.Tensor, device: torch.device) -> bool:
    """Copy the first bytes of ``rows`` with a Triton kernel that reads host memory; compare."""
    try:
        from kernels.publish_ids import store_ids
        n = min(rows.shape[1], 256) // 8 * 8
        src = rows[0, :n].view(torch.int64)
        out = torch.empty_like(src, device=device)
        store_ids(src, out)
        torch.cuda.synchronize(device)
        return bool(torch.equal(out.cpu(), src))
    except Exception:  # no Triton, or host memory not reachable from kernels: copies only
        return False
