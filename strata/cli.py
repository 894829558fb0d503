"""Strata's command line: the workbench by default; subcommands generate | chat | info | convert | eval | serve | bench.

What ``main.py``, the installed ``strata`` command and ``python -m strata`` run.

    strata [gui] [--model DIR] [--screenshot PNG [--prompt TEXT] [--screenshot-size WxH]]
    strata generate --prompt TEXT [--json]
    strata chat | info | convert SRC DST | eval --text FILE

A usage mistake prints one line and exits with code 2; ``--help`` (also after a command) gives the full usage.
"""
from __future__ import annotations

import argparse
import importlib.util
import shlex
import signal
import sys
from pathlib import Path


def _interrupted_while_importing(*_) -> None:
    """Ctrl-C while the engine's modules load (torch takes seconds): no traceback out of the imports,
    one line (engine.cli.main.interrupted_at_start's, which cannot be imported yet), exit code 130."""
    what = ("before the reply began; nothing was generated" if sys.argv[1:2] == ["generate"] else
            "while Strata was starting; nothing was done")
    print(f"\nnote: interrupted {what}", file=sys.stderr)
    sys.exit(130)


# While the imports below run, a Ctrl-C ends the start with that line; after them it is the ordinary
# KeyboardInterrupt that each command handles (a Ctrl-C the process was started to ignore stays ignored).
_INHERITED = signal.getsignal(signal.SIGINT)
if _INHERITED is not signal.SIG_IGN:
    signal.signal(signal.SIGINT, _interrupted_while_importing)
from engine.cli.main import (ENGINE_COMMANDS, as_flags, build_parser, interrupted_at_start, parse,  # noqa: E402
                             run_command, unknown_command)
from engine.cli.options import add_engine_flags, add_model_flag, engine_options, model_dir  # noqa: E402
from engine.config import EngineConfig  # noqa: E402
from engine.errors import StrataError  # noqa: E402
if _INHERITED is not signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _add_gui_parser(sub) -> None:
    p = sub.add_parser("gui", help="the desktop workbench (the default)")
    add_model_flag(p)
    p.add_argument("--screenshot", default=None, metavar="FILE",
                   help="open the window in a scratch workspace (your chats and settings untouched), wait for "
                        "--prompt's reply if given, save a picture (PNG, JPEG or BMP, as the name ends) and "
                        "exit; an existing file is kept unless the name ends in ! (shot.png!)")
    p.add_argument("--prompt", default=None,
                   help="a prompt to send once the model has loaded (with --screenshot: before the picture)")
    p.add_argument("--screenshot-size", default="1600x1000", type=_window_size, metavar="WxH",
                   help="with --screenshot: the window's size in pixels, e.g. 1366x768 (default 1600x1000, at "
                        f"least {SMALLEST_WINDOW[0]}x{SMALLEST_WINDOW[1]})")
    add_engine_flags(p)


# the least size a --screenshot window takes on the demo model: the chat, the panels and the knobs side by side
# at their minimum widths, the transcript at its least lines, the demo's notice folded to one line
SMALLEST_WINDOW = (976, 510)


def _window_size(text: str) -> tuple[int, int]:
    """``WxH`` -> (W, H): whole pixels, at least the smallest window the workbench lays out (its chat,
    panels and knobs side by side)."""
    w, x, h = text.lower().partition("x")
    if not x or not w.isdigit() or not h.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a size; write WIDTHxHEIGHT in pixels, e.g. 1366x768")
    least = f"{SMALLEST_WINDOW[0]}x{SMALLEST_WINDOW[1]}"
    if int(w) < SMALLEST_WINDOW[0] or int(h) < SMALLEST_WINDOW[1]:
        raise argparse.ArgumentTypeError(f"{text} is smaller than the workbench lays out; use at least {least}")
    return int(w), int(h)


def _parse(argv: list[str]) -> argparse.Namespace:
    parser, sub = build_parser(prog=_prog())
    _add_gui_parser(sub)
    if argv and not argv[0].startswith("-") and argv[0] not in sub.choices:
        unknown_command(parser, sub, argv[0])      # the workbench takes no words, so this is a mistyped command
    if not argv or (argv[0] not in sub.choices and argv[0] not in ("-h", "--help", "--version")):
        argv = ["gui"] + argv                      # flags alone open the workbench
    return parse(parser, sub, argv)


def _prog() -> str:
    """The name the usage lines give: strata where the user ran the installed command or ``python -m strata``,
    else main.py (the README's way, and a caller of :func:`main` from Python)."""
    ran = Path(sys.argv[0])
    return "strata" if ran.name == "strata" or ran.parent.name == "strata" and ran.name == "__main__.py" else "main.py"


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parse(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as done:                     # a usage error (2) or --help (0), already printed
        return int(done.code or 0)
    except KeyboardInterrupt:                      # Ctrl-C while the command starts: no traceback, one line
        words = list(sys.argv[1:] if argv is None else argv)
        print(f"\n{interrupted_at_start(words[0] if words and words[0] in ENGINE_COMMANDS else None)}",
              file=sys.stderr)
        return 130
    if args.command in ENGINE_COMMANDS:
        return run_command(args)
    if _engine_flags_refused(args):
        return 2
    screenshot = _screenshot_path(args.screenshot) if args.screenshot is not None else None
    if screenshot == "":
        return 2
    if _window_cannot_open(list(sys.argv[1:] if argv is None else argv)):
        return 2
    from app.launch import run_gui
    return run_gui(args.model, engine_options(args), screenshot=screenshot, prompt=args.prompt,
                   debug=args.debug, screenshot_size=args.screenshot_size)


def _engine_flags_refused(args: argparse.Namespace) -> bool:
    """Check the engine flags before the window opens, as ``generate`` does before it loads: a value that
    no model takes (``--max-batch 0``) is one line naming the flag, not a window whose load failed. True
    after printing that line."""
    try:
        EngineConfig(model=model_dir(args), **engine_options(args))
    except StrataError as e:
        if args.debug:
            raise
        print(f"error: {as_flags(str(e), args)}", file=sys.stderr)
        return True
    return False


def _screenshot_path(text: str) -> str:
    """Where ``--screenshot`` writes: a file that does not exist yet in a folder that does, or any file
    with ``!`` after its name (replaced). "" after printing one line when it may not be written."""
    replace = text.endswith("!")
    path = Path(text[:-1] if replace else text)
    if not path.name:
        print(f"error: --screenshot {text} names no file; give a file name, e.g. shot.png", file=sys.stderr)
        return ""
    from app.paths import SCREENSHOT_FORMATS               # (Qt-free: the command line stays quick)
    if path.suffix.lower() not in SCREENSHOT_FORMATS:       # a picture's name says what it is
        print(f"error: --screenshot {path}: a picture is written as PNG, JPEG or BMP; end its name in "
              f".png, .jpg or .bmp (e.g. {path.with_suffix('.png').name})", file=sys.stderr)
        return ""
    if not path.parent.is_dir():
        print(f"error: --screenshot {path}: the folder {path.parent} does not exist; create it or choose another",
              file=sys.stderr)
        return ""
    if path.exists() and not replace:
        print(f"error: --screenshot {path} exists and is kept; give another name, or {path}! to replace it",
              file=sys.stderr)
        return ""
    return str(path)


def _window_cannot_open(argv: list[str]) -> bool:
    """Check, before Qt starts, that its platform plugin finds its system libraries and a display.

    Qt aborts the process when they are missing, with a hint that may name the wrong library; the check
    (the bootstrap's own, packaging/system_check.py) prints one line with the install command instead.
    """
    script = Path(__file__).resolve().parents[1] / "packaging" / "system_check.py"
    spec = importlib.util.spec_from_file_location("strata_system_check", script)
    if spec is None or spec.loader is None:
        return False                       # an install without the packaging folder: Qt reports for itself
    check = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = check         # its dataclasses look their module up while they are made
    spec.loader.exec_module(check)
    return check.main(["gui", *argv], command=_command()) == 2


def _command() -> str:
    """How the user started the workbench, to write into a command line they can run again."""
    if _prog() == "strata":
        return "strata"
    from engine.checkpoint.converted import python_command
    return f"{python_command()} {shlex.quote(sys.argv[0]) if sys.argv[0].endswith('main.py') else 'main.py'}"



def run() -> None:
    """The process's entry: exit with :func:`main`'s code (130 after a Ctrl-C between the commands' own handlers)."""
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
