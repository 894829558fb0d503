#!/usr/bin/env python3
"""Strata: the workbench by default; subcommands generate | chat | info.

    python main.py [gui] [--model DIR] [--screenshot PNG [--prompt TEXT]]
    python main.py generate --prompt TEXT [--json]
    python main.py chat | info
"""
from __future__ import annotations

import sys

from engine.cli.main import ENGINE_COMMANDS, build_parser, run_command
from engine.cli.options import add_engine_flags, add_model_flag, engine_options


def _add_gui_parser(sub) -> None:
    p = sub.add_parser("gui", help="the desktop workbench (the default)")
    add_model_flag(p)
    p.add_argument("--screenshot", default=None, metavar="PNG",
                   help="open the window, wait for --prompt's reply if given, save a PNG and exit")
    p.add_argument("--prompt", default=None, help="with --screenshot: a prompt to send first")
    add_engine_flags(p)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser, sub = build_parser(prog="main.py")
    _add_gui_parser(sub)
    if not argv or (argv[0] not in ENGINE_COMMANDS + ("gui",) and argv[0] not in ("-h", "--help")):
        argv = ["gui"] + argv
    args = parser.parse_args(argv)
    if args.command in ENGINE_COMMANDS:
        return run_command(args)
    from app.launch import run_gui
    return run_gui(args.model, engine_options(args), screenshot=args.screenshot, prompt=args.prompt,
                   debug=args.debug)


if __name__ == "__main__":
    sys.exit(main())
