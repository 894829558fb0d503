"""``strata bench``: a fixed-seed serving workload, in-process or against any OpenAI-compatible server."""
from __future__ import annotations

import argparse


def add_bench_parser(sub, add_model_flag, add_engine_flags) -> None:
    p = sub.add_parser("bench", help="measure throughput and latency of a serving workload")
    add_model_flag(p)
    add_engine_flags(p)


def cmd_bench(args: argparse.Namespace) -> int:
    raise NotImplementedError
