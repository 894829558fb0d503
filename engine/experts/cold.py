"""Cold experts: each missing expert of a layer goes over the bus or is computed on the host CPU.

An expert without a device slot can reach the GPU's kernels over the bus (a copy into a slot: its
bytes once; or a direct read: its bytes once per token that uses it), or be computed by the host CPU
straight from the host store (kernels/cpu), while the GPU computes the layer's resident experts.
Host memory is read by the CPU about as fast as the bus carries it, so the two together move about
twice what either does alone. For each layer :func:`split_layer` decides, per missing expert, from
measured rates (:class:`ColdRates`: bus bytes per second, CPU seconds per expert by token count) and
how many of the layer's tokens use it, so that the bus and the CPU finish together:

* every missing expert starts on the bus;
* the expert whose CPU time is smallest against the bus time it frees moves to the CPU, and so on,
  while each move shortens the layer (the slower of the two);
* a step of many tokens per expert (prefill) finds the CPU slower than one copy, and copies.

``cold_experts`` (a live option) is ``auto`` (the cost model), ``bus`` (never the CPU) or ``cpu``
(every missing expert on the CPU). On a CPU device there is no bus: ``auto`` means ``bus`` there.

:class:`ColdShare` is one layer's CPU share as the model computes it: the layer's (token, expert)
pairs split into those the GPU's kernels compute and those the CPU does; the CPU's sum is added to
the GPU's on the device. A decode step with a CPU share runs eagerly (not replayed from a CUDA graph):
the host decides per layer once it has read the layer's ids.

Legend: T tokens, k experts per token, D hidden, P (token, expert) pairs.
"""
from __future__ import annotations

import dataclasses
import math
import time
from collections import Counter
from typing import TYPE_CHECKING, Sequence

import numpy as np
import torch

from engine.errors import ConfigError
from kernels.expert_layout import ExpertLayout

if TYPE_CHECKING:
    from kernels.cpu import CpuExpertCost

COLD_MODES = ("auto", "bus", "cpu")
CPU_LEARN_ALPHA = 0.05           # weight of each CPU measurement in the learnt factor, once 20 are in
CPU_LEARN_CLIP = math.log(2.0)   # one measurement moves the factor's logarithm by at most alpha * this


@dataclasses.dataclass(frozen=True)
class ColdRates:
    """What the cost model weighs: measured once per store and thread count."""

    bus_bytes_per_s: float                      # host -> device, pinned, by the copy engine
    cpu: "CpuExpertCost"                        # CPU seconds per expert by token count
    cpu_call_s: float = 0.0                     # fixed cost of one CPU call (start, barrier, result copy)
    threads: int = 1
    cpu_factor: float = 1.0                     # measured CPU time over the calibration's, learnt as it runs
    # host -> device as the GPU's own kernels read the mapped store, measured with the gather's copy
    # kernel: what a direct-read step's bus side moves at (every missing expert is gathered by default;
    # the MoE kernels' own direct reads ran a little slower still). About 20-24 GB/s on the H100 host
    # against 55 for the copy engine (benchmarks/results/gather_ab_2026-12-05b.json). None: not
    # measured (the copy engine's rate stands in).
    kernel_bus_bytes_per_s: float | None = None

    def bus_s(self, nbytes: int, reads: int = 1, direct: bool = False) -> float:
        """Seconds for ``reads`` crossings of ``nbytes``; ``direct``: read by the GPU's kernels."""
        rate = self.kernel_bus_bytes_per_s if direct and self.kernel_bus_bytes_per_s else self.bus_bytes_per_s
        return nbytes * reads / rate

    def cpu_s(self, tokens: int) -> float:
        return self.cpu.seconds_for(tokens) * self.cpu_factor

    def cpu_s_sum(self, uses: Sequence[int]) -> float:
        """:meth:`cpu_s` summed over experts of ``uses`` tokens each."""
        return sum(map(self.cpu.seconds_for, uses)) * self.cpu_factor


@dataclasses.dataclass(frozen=True)
class LayerSplit:
    """One layer's decision: the missing experts the CPU computes, and the predicted seconds of the
    bus (the rest) and of the CPU."""

    cpu: frozenset[int]
    bus_s: float
    cpu_s: float

    @property
    def predicted_s(self) -> float:
        return max(self.bus_s, self.cpu_s)


def split_layer(uses: dict[int, int], nbytes: int, rates: ColdRates | None, mode: str, direct: bool,
                by_kernels: bool = False) -> LayerSplit:
    """``uses``: missing expert -> tokens of the layer routed to it. ``direct``: bus reads are direct
    (one per token) rather than copies (one per expert). ``by_kernels``: the GPU's kernels move the bus's
    bytes (direct reads, the gather's copy kernel), at their rate rather than the copy engine's."""
    reads = (lambda n: n) if direct else (lambda n: 1)  # noqa: E731
    kernels = direct or by_kernels
    if mode == "bus" or rates is None or not uses:
        return LayerSplit(frozenset(), sum(rates.bus_s(nbytes, reads(n), kernels) for n in uses.values())
                          if rates else 0.0, 0.0)
    if mode == "cpu":
        return LayerSplit(frozenset(uses), 0.0, rates.cpu_call_s + sum(rates.cpu_s(n) for n in uses.values()))
    cost = {key: (rates.cpu_s(n), rates.bus_s(nbytes, reads(n), kernels)) for key, n in uses.items()}
    order = sorted(uses, key=lambda key: (cost[key][0] / cost[key][1], key))    # CPU-cheapest first
    bus, cpu, chosen = sum(b for _, b in cost.values()), 0.0, []
    for key in order:
        c, b = cost[key]
        moved_cpu = cpu + c + (0.0 if chosen else rates.cpu_call_s)
        if max(moved_cpu, bus - b) >= max(cpu, bus):
            break
        bus, cpu = bus - b, moved_cpu
        chosen.append(key)
    return LayerSplit(frozenset(chosen), bus, cpu)


class ColdShare:
    """One layer's pairs split between the GPU's kernels and the CPU (``keys``: the CPU's experts,
    store rows). Used by the model as: ``start(x, w)`` (before the GPU's launches: the layer's inputs
    to the host), the GPU's part on ``gpu_inputs``, then ``finish()`` adds the CPU's sum."""

    def __init__(self, cold: "ColdExperts", store_rows: torch.Tensor, base: int, ids: Sequence[int], k: int,
                 split: LayerSplit) -> None:
        self.cold, self.rows, self.split = cold, store_rows, split
        self.keys = split.cpu
        self.k = k
        self.tokens = len(ids) // k
        by_key: dict[int, list[int]] = {}
        gpu: list[int] = []
        for p, e in enumerate(ids):
            if base + e in self.keys:
                by_key.setdefault(base + e, []).append(p)
            else:
                gpu.append(p)
        self.by_key, self.gpu = by_key, gpu
        self._host: torch.Tensor | None = None
        self._ready: torch.cuda.Event | None = None
        self._t0 = time.perf_counter()

    def start(self, x: torch.Tensor, w: torch.Tensor) -> None:
        """Queue the layer's ``x [T, D]`` and routing weights ``w [T, k]`` to the host (no wait)."""
        flat = torch.cat([x.float().reshape(-1), w.float().reshape(-1)])
        if x.device.type == "cuda":
            self._host = torch.empty(flat.shape, dtype=torch.float32, pin_memory=True)
            self._host.copy_(flat, non_blocking=True)
            self._ready = torch.cuda.Event()
            self._ready.record()
        else:
            self._host = flat
        self._device, self._dtype, self._dim = x.device, x.dtype, x.shape[1]

    def gpu_inputs(self, x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """The GPU's pairs as tokens of one expert each: ``(x [P', D], ids [P', 1], w [P', 1], pairs [P'])``;
        None when the CPU computes every pair."""
        if not self.gpu:
            return None
        pairs = torch.tensor(self.gpu, dtype=torch.int64).to(x.device, non_blocking=True)
        return x[pairs // self.k], ids.reshape(-1)[pairs].view(-1, 1), w.reshape(-1)[pairs].view(-1, 1), pairs

    def scatter(self, y: torch.Tensor | None, pairs: torch.Tensor | None) -> torch.Tensor:
        """The GPU's per-pair outputs ``y [P', D]`` summed per token: ``[T, D]`` (zeros without pairs)."""
        t, k = self.tokens, self.k
        if y is None:
            return torch.zeros(t, self._dim, dtype=self._dtype, device=self._device)
        buf = torch.zeros(t * k, y.shape[1], dtype=y.dtype, device=y.device)
        buf[pairs] = y
        return buf.view(t, k, -1).sum(dim=1)

    in_graph = False            # the eager kind (engine/experts/cold_graph.py has the replayed one)

    def add_to(self, out: torch.Tensor) -> torch.Tensor:
        """``out`` plus the CPU's sum (see :meth:`finish`)."""
        return out + self.finish()

    def finish(self) -> torch.Tensor:
        """The CPU's sum ``[T, D]`` on the device, in the model's dtype (computed now, by this thread,
        while the GPU computes its part)."""
        from kernels.cpu import CpuExpertWork, cpu_expert_forward
        if self._ready is not None:
            self._ready.synchronize()              # the inputs only, not the GPU's part queued after them
        t, d, k = self.tokens, self._dim, self.k
        host = self._host
        x, w = host[:t * d].view(t, d), host[t * d:].numpy()
        rows = np.fromiter(self.by_key, dtype=np.int64, count=len(self.by_key))
        pairs = [self.by_key[int(r)] for r in rows]
        starts = np.cumsum([0] + [len(p) for p in pairs], dtype=np.int64)
        flat = np.fromiter((p for ps in pairs for p in ps), dtype=np.int64, count=int(starts[-1]))
        work = CpuExpertWork(rows, starts, flat // k, w[flat].astype(np.float32))
        cuda = self._device.type == "cuda"
        out = torch.empty(t, d, dtype=torch.float32, pin_memory=cuda)
        t0 = time.perf_counter()
        cpu_expert_forward(self.rows, self.cold.layout, work, x, out, self.cold.threads)
        done = time.perf_counter()
        self.cold.note(self, (done - t0) * 1e3, (done - self._t0) * 1e3)
        self.cold.learn_cpu(done - t0, [len(p) for p in pairs])
        return out.to(self._device, non_blocking=cuda).to(self._dtype)


class StepArms:
    """``auto``'s choice per decode step size: eager steps (the host splits each layer between the bus
    and the CPU) or replayed CUDA graphs (the bus alone, no host work per layer). Which is faster
    depends on what the cost model cannot see (an eager step's launches and waits per layer: measured
    on the H200 host about 1-2 ms a layer more than a replay), so both are measured: each size tries
    each arm for ``trials`` steps (the first step of an arm not counted: it may record a graph or
    compile), then takes the faster by a moving average, trying the other again every ``probe_every``
    steps, since routing and the pool change."""

    def __init__(self, trials: int = 3, probe_every: int = 256, alpha: float = 0.25) -> None:
        self.trials, self.probe_every, self.alpha = trials, probe_every, alpha
        self._avg: dict[tuple[int, bool], float] = {}
        self._seen: dict[tuple[int, bool], int] = {}
        self._steps: dict[int, int] = {}

    def choose(self, tokens: int) -> bool:
        for arm in (False, True):
            if self._seen.get((tokens, arm), 0) <= self.trials:
                return arm
        eager = self._avg[(tokens, True)] < self._avg[(tokens, False)]
        if self._steps.get(tokens, 0) % self.probe_every == self.probe_every - 1:
            return not eager
        return eager

    def observe(self, tokens: int, eager: bool, seconds: float) -> None:
        key = (tokens, eager)
        n = self._seen.get(key, 0)
        self._seen[key] = n + 1
        self._steps[tokens] = self._steps.get(tokens, 0) + 1
        if n == 0:
            return                        # an arm's first step records a graph or compiles
        old = self._avg.get(key)
        self._avg[key] = seconds if old is None else old + self.alpha * (seconds - old)

    def state(self) -> dict[int, tuple[float | None, float | None]]:
        """Step size -> (average seconds replayed, eager)."""
        sizes = sorted({t for t, _ in self._seen})
        return {t: (self._avg.get((t, False)), self._avg.get((t, True))) for t in sizes}

    def reset(self) -> None:
        self._avg.clear()
        self._seen.clear()
        self._steps.clear()


class ColdExperts:
    """The ``cold_experts`` setting, the measured rates and the counts of what ran where."""

    def __init__(self, layout: ExpertLayout, mode: str = "auto", threads: int | None = None,
                 cpus: Sequence[int] | None = None) -> None:
        self.layout = layout
        self.mode = check_mode(mode, ConfigError)
        self.threads = threads or _default_threads(cpus)
        self.cpus = tuple(cpus) if cpus else None
        self.rates: ColdRates | None = None
        self._pinned = False
        self._holds_torch_threads = False  # measure() set torch's CPU threads to 1 for this engine
        # cumulative counts
        self.cpu_experts = 0              # missing experts computed on the CPU
        self.cpu_ms = 0.0                 # time in the CPU kernels
        self.predicted_ms = 0.0           # what the cost model predicted for those layers
        self.measured_ms = 0.0            # from the decision to the CPU's result, for those layers
        self.layers = 0                   # layers with a CPU share
        self.last_step: tuple[int, int] = (0, 0)   # (CPU, bus) experts of the last step
        self._step_cpu = 0
        self.arms = StepArms()          # auto: eager steps with a CPU share, or replayed ones without
        self._cpu_samples = 0

    def learn_cpu(self, seconds: float, uses: Sequence[int]) -> None:
        """The CPU kernels took ``seconds`` for experts of ``uses`` tokens each: move the rates' CPU
        factor toward what that says (a moving average of the ratio's logarithm, less the fixed call
        cost, which the factor does not scale). The calibration at load takes a fraction of a second
        and can meet a host that is busy for that moment (it read int4 8x slow on the H200 host
        once); the steps themselves say what the kernels take. One measurement moves the factor by at
        most ``alpha`` times a factor of 2, so a layer hit by a scheduler's time slice barely counts."""
        self.learn_cpu_layers([(seconds, uses)])

    def learn_cpu_layers(self, samples: Sequence[tuple[float, Sequence[int]]]) -> None:
        """:meth:`learn_cpu` for each ``(seconds, uses)`` in turn, the rates replaced once."""
        rates = self.rates
        if rates is None:
            return
        log_f = math.log(rates.cpu_factor)
        moved = False
        for seconds, uses in samples:
            if not uses or seconds <= 0:
                continue
            base = sum(map(rates.cpu.seconds_for, uses))     # what the factor scales (not the call)
            if base <= 0:
                continue
            ratio = max(seconds - rates.cpu_call_s, 0.05 * seconds) / base
            self._cpu_samples += 1
            alpha = max(CPU_LEARN_ALPHA, 1 / (self._cpu_samples + 1))  # the calibration counts as one sample
            log_f += alpha * min(max(math.log(ratio) - log_f, -CPU_LEARN_CLIP), CPU_LEARN_CLIP)
            moved = True
        if moved:
            self.rates = dataclasses.replace(rates, cpu_factor=math.exp(log_f))

    def enabled_on(self, device: torch.device) -> bool:
        return self.mode == "cpu" or (self.mode == "auto" and device.type == "cuda")

    def measure(self, store_rows: torch.Tensor, device: torch.device) -> ColdRates:
        """Time the bus and the CPU kernels on this store (once; a few hundred milliseconds after the
        kernels are compiled, which happens once per machine and is then cached on disk)."""
        from kernels.cpu import calibrate, set_cpu_expert_threads
        if not self._pinned:
            self.threads = set_cpu_expert_threads(self.threads, self.cpus)
            self._pinned = True
            if device.type == "cuda":
                # The thread that follows the steps runs only small torch ops on the CPU; torch's own
                # intra-op threads would spin after each of them on the cores the expert kernels use
                # (batch 1, no pool, all on the CPU: 99.7 against 120.5 tok/s with one torch thread,
                # validate_2026-12-06b.json). :meth:`close` sets the count back, for a later load.
                _torch_threads_taken()
                self._holds_torch_threads = True
        n = store_rows.shape[0]
        sample = list(range(0, n, max(1, n // 16)))[:16]
        cost = calibrate(store_rows, self.layout, sample, tokens=(1, 2, 4, 8), threads=self.threads, repeats=3)
        bus = _bus_rate(store_rows, device)
        call = _call_cost(store_rows, self.layout, cost.seconds[0], self.threads)
        kernels = _kernel_bus_rate(store_rows, device)
        self.rates = ColdRates(bus, cost, call, self.threads, kernel_bus_bytes_per_s=kernels)
        self._cpu_samples = 0
        return self.rates

    def close(self) -> None:
        """Give torch back the CPU threads it had before the first measurement (a later load, on the CPU
        or copying into a host store, uses them)."""
        if self._holds_torch_threads:
            self._holds_torch_threads = False
            _torch_threads_given_back()

    def eager_for(self, tokens: int) -> bool:
        """Whether a decode step of ``tokens`` tokens should run eagerly, so that the host can give the
        CPU its share: always under ``cpu``, never under ``bus``; under ``auto`` the arm
        (:class:`StepArms`) whose recent steps of that size were faster."""
        if self.mode != "auto":
            return self.mode == "cpu"
        return self.arms.choose(tokens)

    def observe(self, tokens: int, eager: bool, seconds: float) -> None:
        """A decode step of ``tokens`` tokens took ``seconds`` (launch to sampled tokens on the host)."""
        if self.mode == "auto":
            self.arms.observe(tokens, eager, seconds)

    def split(self, store_rows: torch.Tensor, device: torch.device, moe_index: int, num_experts: int,
              ids: Sequence[int], missing: Sequence[bool], k: int, direct: bool,
              by_kernels: bool = False) -> ColdShare | None:
        """Layer ``moe_index``'s CPU share (None: none): ``ids`` its T*k expert ids, ``missing`` per
        pair whether the expert has no device slot; ``direct``, ``by_kernels``: as :func:`split_layer`."""
        base = moe_index * num_experts
        uses = Counter(base + e for e, m in zip(ids, missing) if m)
        if not uses:
            return None
        if self.rates is None:
            self.measure(store_rows, device)
        split = split_layer(dict(uses), self.layout.nbytes, self.rates, self.mode, direct, by_kernels)
        self._step_cpu += len(split.cpu)
        if not split.cpu:
            return None
        self.cpu_experts += len(split.cpu)
        return ColdShare(self, store_rows, base, ids, k, split)

    def note_graph(self, experts: int, cpu_ms: float, measured_ms: float, predicted_ms: float) -> None:
        """A replayed step's layer had ``experts`` missing experts computed on the host CPU
        (engine/experts/cold_graph.py)."""
        self.cpu_experts += experts
        self._step_cpu += experts
        self.layers += 1
        self.cpu_ms += cpu_ms
        self.measured_ms += measured_ms
        self.predicted_ms += predicted_ms

    def note(self, share: ColdShare, cpu_ms: float, measured_ms: float) -> None:
        self.layers += 1
        self.cpu_ms += cpu_ms
        self.measured_ms += measured_ms
        self.predicted_ms += share.split.predicted_s * 1e3

    def end_step(self, misses: int) -> None:
        """The step is over; it had ``misses`` missing experts (distinct per layer) in all."""
        self.last_step, self._step_cpu = (self._step_cpu, max(0, misses - self._step_cpu)), 0


def check_mode(mode: object, error: type[Exception]) -> str:
    if mode not in COLD_MODES:
        raise error(f"cold_experts={mode!r} is not supported; choose {', '.join(COLD_MODES)}")
    return str(mode)


_torch_threads = {"users": 0, "before": 0}     # engines that set torch's CPU threads to 1, and the count before


def _torch_threads_taken() -> None:
    if _torch_threads["users"] == 0:
        _torch_threads["before"] = torch.get_num_threads()
        torch.set_num_threads(1)
    _torch_threads["users"] += 1


def _torch_threads_given_back() -> None:
    """The last engine that set torch's CPU threads to 1 closed: the count it found comes back."""
    _torch_threads["users"] -= 1
    if _torch_threads["users"] == 0 and _torch_threads["before"]:
        torch.set_num_threads(_torch_threads["before"])


def _default_threads(cpus: Sequence[int] | None) -> int:
    """Every core the process may use (of the GPU's node when given) but one, left to the thread
    that feeds the GPU and the rest of the machine."""
    from engine.cpu_threads import available_cores
    n = len(cpus) if cpus else available_cores()
    return max(1, n - 1)


def _bus_rate(store_rows: torch.Tensor, device: torch.device) -> float:
    """Bytes per second of one copy of up to 8 contiguous store rows to ``device`` (best of 3)."""
    rows = store_rows[:min(8, store_rows.shape[0])]
    dst = torch.empty(rows.shape, dtype=torch.uint8, device=device)
    best = float("inf")
    for _ in range(3):
        if device.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            dst.copy_(rows, non_blocking=True)
            b.record()
            b.synchronize()
            best = min(best, a.elapsed_time(b) / 1e3)
        else:
            t0 = time.perf_counter()
            dst.copy_(rows)
            best = min(best, time.perf_counter() - t0)
    del dst
    return rows.numel() / max(best, 1e-9)


def _kernel_bus_rate(store_rows: torch.Tensor, device: torch.device) -> float | None:
    """Bytes per second of the gather's copy kernel (kernels/publish_ids.gather_copy) moving up to 8 store
    rows from mapped host memory into device memory (best of 3 after one untimed run); None where the
    kernels cannot read the store (not a CUDA GPU, not page-locked) or the kernel fails."""
    from kernels._triton import HAS_TRITON
    if device.type != "cuda" or not HAS_TRITON or not store_rows.is_pinned() or store_rows.shape[1] % 4:
        return None
    from kernels.publish_ids import gather_copy
    n = min(8, store_rows.shape[0])
    pairs = [v for j in range(n) for v in (j, j)]                      # slot j <- store row j
    work = torch.tensor([n] + pairs, dtype=torch.int64, device=device)
    dst = torch.empty(n, store_rows.shape[1], dtype=torch.uint8, device=device)
    best = float("inf")
    try:
        for i in range(4):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            gather_copy(work, store_rows, dst)
            b.record()
            b.synchronize()
            if i:
                best = min(best, a.elapsed_time(b) / 1e3)
    except Exception:  # noqa: BLE001 - a store the kernels cannot read: the copy engine's rate stands in
        return None
    finally:
        del dst
    return n * store_rows.shape[1] / max(best, 1e-9)


def _call_cost(store_rows: torch.Tensor, layout: ExpertLayout, per_expert_s: float, threads: int) -> float:
    """Fixed seconds of one CPU call: a call of one expert at one token, less one expert's share of a
    call of many (``per_expert_s``)."""
    from kernels.cpu import calibrate
    one = calibrate(store_rows, layout, [store_rows.shape[0] - 1], tokens=(1,), threads=threads, repeats=5)
    return max(0.0, one.seconds[0] - per_expert_s)
