"""``/metrics``: Prometheus series of one server, in a registry of its own.

Request-side series (requests, tokens, latencies) are updated as requests are answered; engine-side
series (queue, batch, KV use, expert hit rate, bus bytes) are read from one ``EngineStats`` snapshot
per scrape, taken on the loop thread; GPU temperature and power come from NVML where a GPU is read.
"""
from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from engine.gpu_monitor import GpuMonitor, GpuSample, NvmlMonitor
from engine.server.logs import Totals
from engine.telemetry import EngineStats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
ENDPOINTS = ("/v1/models", "/v1/completions", "/v1/chat/completions", "/health", "/metrics",
             "/v1/strata/stats", "/v1/strata/config")
_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_TOKEN_GAP = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.25, 0.5, 1.0)


def endpoint_label(path: str) -> str:
    """A bounded label: known routes by name, a model by its route's pattern, anything else as "other"."""
    if path.startswith("/v1/models/"):
        return "/v1/models/{id}"
    return path if path in ENDPOINTS else "other"


class Latency:
    """A histogram written and read on one thread (the server's event loop), so it needs no lock: one
    bisect and two additions per observation, cheap enough for every token of every stream."""

    def __init__(self, name: str, doc: str, buckets: Sequence[float]) -> None:
        self.name, self.doc = name, doc
        self.bounds = tuple(buckets)                     # upper bounds ("le"), ascending
        self.counts = [0] * (len(self.bounds) + 1)       # the last one is +Inf
        self.sum = 0.0

    def observe(self, seconds: float, times: int = 1) -> None:
        """Note ``times`` observations of ``seconds`` each."""
        self.counts[bisect.bisect_left(self.bounds, seconds)] += times
        self.sum += seconds * times

    def family(self) -> HistogramMetricFamily:
        cumulative = list(itertools.accumulate(self.counts))
        buckets = [(repr(float(b)), c) for b, c in zip(self.bounds, cumulative)] + [("+Inf", cumulative[-1])]
        return HistogramMetricFamily(self.name, self.doc, buckets=buckets, sum_value=self.sum)


class _Latencies(Collector):
    def __init__(self, histograms: Sequence[Latency]) -> None:
        self.histograms = histograms

    def collect(self) -> Iterator:
        for h in self.histograms:
            yield h.family()


class _EngineCollector(Collector):
    """Series read from the latest snapshot (none before the first scrape with a model)."""

    def __init__(self) -> None:
        self.stats: EngineStats | None = None
        self.gpu: GpuSample | None = None

    def collect(self) -> Iterator:
        s = self.stats
        if s is not None:
            yield _gauge("strata_requests_running", "engine requests decoding now", s.running)
            yield _gauge("strata_requests_queued", "engine requests waiting for a batch slot", s.waiting)
            # the engine keeps its last step's size; with nothing running no batch runs, so the gauge reads 0
            yield _gauge("strata_batch_size", "sequences in the running engine step (0 when idle)",
                         s.batch_size if s.running else 0)
            used = s.kv_blocks_used / s.kv_blocks_total if s.kv_blocks_total else 0.0
            yield _gauge("strata_kv_blocks_used_ratio", "share of KV cache blocks in use", used)
            yield _gauge("strata_expert_hit_rate", "share of routed experts found on the GPU since load",
                         s.experts.hit_rate)
            yield _counter("strata_host_to_device_bytes", "expert bytes moved host to GPU since load",
                           s.experts.h2d_bytes)
            yield _counter("strata_engine_generated_tokens", "tokens the engine sampled since load",
                           s.generated_tokens)
            if s.stages:                       # a pipeline over several GPUs: each card's own
                yield from _card_series(s)
        g = self.gpu
        if g is not None and g.available:
            if g.gpu_temp_c is not None:
                yield _gauge("strata_gpu_temperature_celsius", "GPU core temperature", g.gpu_temp_c)
            if g.mem_temp_c is not None:
                yield _gauge("strata_gpu_memory_temperature_celsius", "GPU memory temperature", g.mem_temp_c)
            if g.power_w is not None:
                yield _gauge("strata_gpu_power_watts", "GPU power draw", g.power_w)


def _card_series(s: EngineStats) -> Iterator:
    hit = GaugeMetricFamily("strata_card_expert_hit_rate", "share of routed experts found on the card since load",
                            labels=["card", "layers"])
    bus = CounterMetricFamily("strata_card_host_to_device_bytes", "expert bytes moved host to this card since load",
                              labels=["card", "layers"])
    mem = GaugeMetricFamily("strata_card_memory_bytes", "the card's memory by use", labels=["card", "layers", "use"])
    for st in s.stages:
        card, layers = str(st.rank), f"{st.first_layer}-{st.end_layer - 1}"
        hit.add_metric([card, layers], st.experts.hit_rate)
        bus.add_metric([card, layers], float(st.experts.h2d_bytes))
        m = st.memory
        for use, value in (("resident", m.resident_bytes), ("expert_pool", m.expert_pool_bytes),
                           ("kv_cache", m.kv_cache_bytes), ("workspace", m.workspace_bytes)):
            mem.add_metric([card, layers, use], float(value))
    yield from (hit, bus, mem)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=float(value))


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=float(value))


class ServerMetrics:
    def __init__(self, monitor_factory: Callable[[], GpuMonitor] = NvmlMonitor) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter("strata_http_requests", "HTTP requests answered", ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter("strata_prompt_tokens", "prompt tokens of answered requests", registry=r)
        self.completion_tokens = Counter("strata_completion_tokens", "tokens generated for clients", registry=r)
        self.ttft = Latency("strata_time_to_first_token_seconds", "request arrival to its first token", _LATENCY)
        self.inter_token = Latency("strata_inter_token_latency_seconds", "time between a stream's tokens", _TOKEN_GAP)
        self.e2e = Latency("strata_request_latency_seconds", "request arrival to its last byte", _LATENCY)
        r.register(_Latencies((self.ttft, self.inter_token, self.e2e)))
        self._engine = _EngineCollector()
        r.register(self._engine)
        self._monitor_factory = monitor_factory
        self._monitor: GpuMonitor | None = None
        self._monitor_tried = False
        self.totals = Totals()                  # for the summary line

    def update(self, stats: EngineStats | None) -> None:
        self._engine.stats = stats

    def sample_gpu(self, device: str) -> None:
        """Read the GPU the engine runs on (a few ms of driver calls; run it off the event loop). On the
        CPU, or where NVML reads nothing, there are no GPU series at all rather than zeros."""
        if not device.startswith("cuda"):
            self._engine.gpu = None
            return
        if not self._monitor_tried:
            self._monitor_tried = True
            monitor = self._monitor_factory()
            self._monitor = monitor if monitor.available else None
        self._engine.gpu = self._monitor.sample() if self._monitor is not None else None

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def close(self) -> None:
        """Let NVML go (a restarted server opens it again)."""
        if self._monitor is not None:
            self._monitor.close()
        self._monitor, self._monitor_tried, self._engine.gpu = None, False, None
