"""The ``strata`` command line: subcommands generate, chat, info, convert, eval, serve, bench."""
from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from engine.cli.options import add_engine_flags, add_model_flag
from engine.errors import StrataError

ENGINE_COMMANDS = ("generate", "chat", "info", "convert", "eval", "serve", "bench")


class OneLineParser(argparse.ArgumentParser):
    """A usage mistake is one line naming it and where the full usage is, exit code 2 (``--help`` stays full)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())} (see {self.prog} --help)\n")


def build_parser(prog: str = "strata") -> tuple[argparse.ArgumentParser, argparse._SubParsersAction]:
    from engine.cli.run import add_sampling_flags
    parser = OneLineParser(prog=prog, description="Run Mixture-of-Experts models on one GPU, and watch them.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    p = sub.add_parser("generate", help="complete one prompt and print the text")
    add_model_flag(p)
    p.add_argument("--prompt", required=True, help="text to complete")
    p.add_argument("--json", action="store_true", help="print one JSON object (text, token ids, timings)")
    add_sampling_flags(p, temperature=0.8)
    add_engine_flags(p)
    p = sub.add_parser("chat", help="chat in the terminal, streaming replies")
    add_model_flag(p)
    p.add_argument("--system", default=None, help="system prompt")
    p.add_argument("--reasoning-effort", choices=("low", "medium", "high"), default="medium",
                   help="how hard a reasoning model (gpt-oss) thinks before it answers; /reasoning changes it")
    add_sampling_flags(p, temperature=0.7)
    add_engine_flags(p)
    from engine.cli.info import add_info_parser
    add_info_parser(sub, add_model_flag, add_engine_flags)
    from engine.cli.convert import add_convert_parser, add_eval_parser
    add_convert_parser(sub)
    add_eval_parser(sub, add_model_flag, add_engine_flags)
    from engine.cli.serve import add_serve_parser
    add_serve_parser(sub, add_model_flag, add_engine_flags)
    from engine.cli.bench import add_bench_parser
    add_bench_parser(sub, add_model_flag, add_engine_flags)
    return parser, sub


def parse(parser: argparse.ArgumentParser, sub: argparse._SubParsersAction, argv: list[str]) -> argparse.Namespace:
    """Parse ``argv``; an unknown flag is reported by the subcommand it was given to, with its help."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        owner = sub.choices.get(args.command, parser)
        owner.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def unknown_command(parser: argparse.ArgumentParser, sub: argparse._SubParsersAction, word: str) -> NoReturn:
    parser.error(f"unknown command '{word}'; choose one of {', '.join(sub.choices)}")


def as_flags(message: str, args: argparse.Namespace) -> str:
    """A message that names a setting by its Python name ("max_tokens must be ...") names the flag
    the user typed instead ("--max-tokens must be ..."), where the command has that flag."""
    name, _, rest = message.partition(" ")
    if rest.startswith("must ") and name.isidentifier() and name in vars(args):
        return "--" + name.replace("_", "-") + " " + rest
    return message


def run_command(args: argparse.Namespace) -> int:
    """Dispatch an engine subcommand; user errors become one line on stderr and exit code 2."""
    from engine.cli import bench, chat, convert, info, run, serve
    handlers = {"generate": run.cmd_generate, "chat": chat.cmd_chat, "info": info.cmd_info,
                "convert": convert.cmd_convert, "eval": convert.cmd_eval, "serve": serve.cmd_serve,
                "bench": bench.cmd_bench}
    try:
        return handlers[args.command](args)
    except StrataError as e:
        if getattr(args, "debug", False):
            raise
        print(f"error: {as_flags(str(e), args)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def main(argv: list[str] | None = None) -> int:
    parser, sub = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parse(parser, sub, argv)
    except SystemExit as done:         # a usage error (2) or --help (0), already printed
        return int(done.code or 0)
    if args.command is None:
        parser.print_help()
        return 0
    return run_command(args)
