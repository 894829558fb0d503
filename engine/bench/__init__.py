"""``strata bench``: a fixed-seed serving workload, run in-process or against an OpenAI-compatible server.

    from engine.bench import PRESETS, run_in_process, run_http, Target
    run = run_in_process(loop, PRESETS["four-streams"])          # loop: an EngineLoop on its thread
    run = run_http(Target("http://127.0.0.1:8000"), PRESETS["four-streams"])

``run_http`` needs no engine; ``run_in_process`` (and the engine it drives) is imported on first use.
"""
from engine.bench.http import ServerError, Target, run_http
from engine.bench.metrics import RequestRecord, Summary, percentile, summarise
from engine.bench.result import BenchRun
from engine.bench.workload import PRESETS, BenchRequest, Fixed, Normal, Uniform, Workload, parse_length

__all__ = ["PRESETS", "BenchRequest", "BenchRun", "Fixed", "Normal", "RequestRecord", "ServerError", "Summary",
           "Target", "Uniform", "Workload", "parse_length", "percentile", "run_http", "run_in_process", "summarise"]


def __getattr__(name: str):
    if name == "run_in_process":
        from engine.bench.inprocess import run_in_process
        return run_in_process
    raise AttributeError(name)
