"""``strata serve``: the OpenAI-compatible HTTP server on one engine."""
from __future__ import annotations

import argparse


def add_serve_parser(sub, add_model_flag, add_engine_flags) -> None:
    p = sub.add_parser("serve", help="serve the model over an OpenAI-compatible HTTP API")
    add_model_flag(p)
    add_engine_flags(p)


def cmd_serve(args: argparse.Namespace) -> int:
    raise NotImplementedError
