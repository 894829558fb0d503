"""The ``strata`` command line: subcommands generate, chat, info, convert, eval, serve, bench."""
from __future__ import annotations

import argparse
import difflib
import os
import re
import sys
from typing import NoReturn

from engine.cli.options import add_engine_flags, add_model_flag, utf8_text
from engine.errors import StrataError

ENGINE_COMMANDS = ("generate", "chat", "info", "convert", "eval", "serve", "bench")


class OneLineParser(argparse.ArgumentParser):
    """A usage mistake is one line naming it and where the full usage is, exit code 2 (``--help`` stays full)."""

    argv: list[str] = []          # what parse() was given: a misspelt flag is named before what it left missing

    def error(self, message: str) -> NoReturn:
        unknown = message.startswith(("unrecognized arguments", "the following arguments are required"))
        said = (unknown and self._misspelt()) or " ".join(message.split())
        self.exit(2, f"{self.prog}: error: {said} (see {self.prog} --help)\n")

    def _misspelt(self) -> str | None:
        """"unrecognized argument --promt; did you mean --prompt?" for the first flag of the command line
        being parsed that this parser does not know, not even as the start of one it knows, but one it knows
        is close to (argparse would say first that --prompt is missing)."""
        known = [o for o in self._option_string_actions if o.startswith("--")]
        for word in OneLineParser.argv:
            flag = word.split("=", 1)[0]
            if word == "--":
                break
            if not flag.startswith("--") or any(o.startswith(flag) for o in known):
                continue
            if flag == "--version":
                return f"--version is a flag of {self.prog.split()[0]} itself; give it before any command"
            close = difflib.get_close_matches(flag, [*known, "--version"], n=1)
            if close == ["--version"]:
                return f"unrecognized argument {flag}; did you mean --version (before any command)?"
            if close:
                return f"unrecognized argument {flag}; did you mean {close[0]}?"
        return None


def build_parser(prog: str = "strata") -> tuple[argparse.ArgumentParser, argparse._SubParsersAction]:
    from engine.cli.run import add_sampling_flags
    parser = OneLineParser(prog=prog, description="Run Mixture-of-Experts models on one GPU, and watch them.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    p = sub.add_parser("generate", help="complete one prompt and print the text")
    add_model_flag(p)
    p.add_argument("--prompt", required=True, type=utf8_text, help="text to complete")
    p.add_argument("--json", action="store_true", help="print one JSON object (text, token ids, timings)")
    add_sampling_flags(p, temperature=0.8)
    add_engine_flags(p)
    p = sub.add_parser("chat", help="chat in the terminal, streaming replies")
    add_model_flag(p)
    p.add_argument("--system", default=None, type=utf8_text, help="system prompt")
    p.add_argument("--reasoning-effort", choices=("low", "medium", "high"), default=None,
                   help="how hard a reasoning model (gpt-oss) thinks before it answers (default medium); /reasoning "
                        "changes it")
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


def _version() -> str:
    """This installation's version (the package's metadata; a source tree not installed says so)."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("strata")
    except PackageNotFoundError:
        return "(not installed: a source tree)"


_NEGATIVE = re.compile(r"-\d")


def _join_negative_values(argv: list[str]) -> list[str]:
    """``--flag -3G`` as ``--flag=-3G``: argparse reads a value that starts with a dash and is not a
    plain number as a flag, and would say "expected one argument" instead of what is wrong with it."""
    out: list[str] = []
    for a in argv:
        if out and _NEGATIVE.match(a) and out[-1].startswith("--") and "=" not in out[-1] and out[-1] != "--":
            out[-1] = f"{out[-1]}={a}"
        else:
            out.append(a)
    return out


def parse(parser: argparse.ArgumentParser, sub: argparse._SubParsersAction, argv: list[str]) -> argparse.Namespace:
    """Parse ``argv``; an unknown flag is reported by the subcommand it was given to, with its help."""
    OneLineParser.argv = list(argv)
    try:
        args, extra = parser.parse_known_args(_join_negative_values(argv))
        if extra:
            owner = sub.choices.get(args.command, parser)
            owner.error(f"unrecognized arguments: {' '.join(extra)}")
    finally:
        OneLineParser.argv = []           # a parser used directly later judges its own words alone
    return args


def unknown_command(parser: argparse.ArgumentParser, sub: argparse._SubParsersAction, word: str) -> NoReturn:
    close = difflib.get_close_matches(word, list(sub.choices), n=1)
    hint = f"did you mean '{close[0]}'? Or " if close else ""
    parser.error(f"unknown command '{word}'; {hint}choose one of {', '.join(sub.choices)}")


_SETTING = re.compile(r"\b([a-z][a-z0-9_]*)=('[^']*'|\"[^\"]*\"|[^\s,;)]+)")
# a setting's name in prose (not a quoted name, which is a file's field)
_NAME = re.compile(r"(?<![-\w'\"])([a-z][a-z0-9]*(?:_[a-z0-9]+)+)\b(?![='\"])")


def as_flags(message: str, args: argparse.Namespace) -> str:
    """A message that names a setting by its Python name names the flag the user typed instead, where
    the command has that flag: "max_tokens must be ..." reads "--max-tokens must be ...",
    "gpu_memory_budget='12X' is not a size" reads "--gpu-memory-budget 12X is not a size", and "raise
    max_batch_tokens" reads "raise --max-batch-tokens"."""
    known = vars(args)

    def flag(m: re.Match) -> str:
        name, value = m.group(1), m.group(2)
        if name not in known:
            return m.group(0)
        if value[:1] in "'\"" and value[-1:] == value[:1]:
            value = value[1:-1]
        return f"--{name.replace('_', '-')} {value}"

    name, _, rest = message.partition(" ")
    if rest.startswith("must ") and name.isidentifier() and name in known:
        message = "--" + name.replace("_", "-") + " " + rest
    message = _SETTING.sub(flag, message)
    return _NAME.sub(lambda m: "--" + m.group(1).replace("_", "-") if m.group(1) in known else m.group(0), message)


def interrupted_at_start(command: str | None) -> str:
    """The line a Ctrl-C prints when it comes while ``command`` starts (its modules loading, its flags
    read), before the command's own handling: what a script reading the output learns of it."""
    if command == "generate":
        return "note: interrupted before the reply began; nothing was generated"
    return "note: interrupted while Strata was starting; nothing was done"


def run_command(args: argparse.Namespace) -> int:
    """Dispatch an engine subcommand; user errors become one line on stderr and exit code 2."""
    try:
        from engine.cli import bench, chat, convert, info, run, serve
    except KeyboardInterrupt:          # the model code loading (seconds): no traceback, one line
        print(f"\n{interrupted_at_start(args.command)}", file=sys.stderr)
        return 130
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
    except BrokenPipeError:            # the reader of our output went away (| head): stop quietly
        _quiet_stdout()
        return 0


def _quiet_stdout() -> None:
    """Point stdout at the null device, so that the interpreter's last flush at exit does not fail on
    the closed pipe again (and print a second traceback)."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def main(argv: list[str] | None = None) -> int:
    try:
        parser, sub = build_parser()
        argv = list(sys.argv[1:] if argv is None else argv)
        try:
            args = parse(parser, sub, argv)
        except SystemExit as done:         # a usage error (2) or --help (0), already printed
            return int(done.code or 0)
    except KeyboardInterrupt:              # Ctrl-C while the command starts: no traceback, one line
        print(f"\n{interrupted_at_start(argv[0] if argv and argv[0] in ENGINE_COMMANDS else None)}",
              file=sys.stderr)
        return 130
    if args.command is None:
        parser.print_help()
        return 0
    return run_command(args)
