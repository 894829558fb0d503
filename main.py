#!/usr/bin/env python3
"""Strata: the workbench by default; subcommands generate | chat | info | convert | eval | serve | bench.

    python main.py [gui] [--model DIR] [--screenshot PNG [--prompt TEXT] [--screenshot-size WxH]]
    python main.py generate --prompt TEXT [--json]
    python main.py chat | info | convert SRC DST | eval --text FILE

The same as the installed ``strata`` command and ``python -m strata`` (strata/cli.py).
"""
from strata.cli import main, run

__all__ = ["main", "run"]          # main(argv): what scripts and tests call

if __name__ == "__main__":
    run()
