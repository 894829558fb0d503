"""A usage mistake on the command line is one line naming it and where the full usage is, exit code 2;
``--help`` still prints the full usage."""
from __future__ import annotations

import subprocess
import sys

import pytest

import main as root
from engine.cli import main as strata
from tiny_models import ROOT

# argv, the one line main.py prints for it
MISTAKES = [
    (["generate", "--prompt", "hi", "--max-tokens", "x"],
     "main.py generate: error: argument --max-tokens: invalid int value: 'x' (see main.py generate --help)"),
    (["generate"],
     "main.py generate: error: the following arguments are required: --prompt (see main.py generate --help)"),
    (["generate", "--prompt", "hi", "--temperature", "warm"],
     "main.py generate: error: argument --temperature: invalid float value: 'warm' (see main.py generate --help)"),
    (["chat", "--dtype", "float8"],
     "main.py chat: error: argument --dtype: invalid choice: 'float8' (choose from 'auto', 'float32', 'bfloat16', "
     "'float16') (see main.py chat --help)"),
    (["chat", "--no-such-flag"],
     "main.py chat: error: unrecognized arguments: --no-such-flag (see main.py chat --help)"),
    (["info", "--prefetch-depth", "deep"],
     "main.py info: error: argument --prefetch-depth: invalid int value: 'deep' (see main.py info --help)"),
    (["info", "extra-word"],
     "main.py info: error: unrecognized arguments: extra-word (see main.py info --help)"),
    (["convert", "src"],
     "main.py convert: error: the following arguments are required: dst (see main.py convert --help)"),
    (["convert", "src", "dst", "--group-size", "big"],
     "main.py convert: error: argument --group-size: invalid int value: 'big' (see main.py convert --help)"),
    (["eval", "--window", "0x", "--text", "t.txt"],
     "main.py eval: error: argument --window: invalid int value: '0x' (see main.py eval --help)"),
    (["eval"],
     "main.py eval: error: the following arguments are required: --text (see main.py eval --help)"),
    (["gui", "--cpu-threads", "all"],
     "main.py gui: error: argument --cpu-threads: invalid int value: 'all' (see main.py gui --help)"),
    (["--modle", "m"],                                         # the workbench is the default command
     "main.py gui: error: unrecognized argument --modle; did you mean --model? (see main.py gui --help)"),
    (["generate", "--promt", "hi"],                           # named before the --prompt it leaves missing
     "main.py generate: error: unrecognized argument --promt; did you mean --prompt? (see main.py generate --help)"),
    (["generate", "--prompt", "hi", "--temp", "0.5", "--max-tokens", "abc"],     # --temp: argparse's abbreviation
     "main.py generate: error: argument --max-tokens: invalid int value: 'abc' (see main.py generate --help)"),
    (["chat", "--version"],
     "main.py chat: error: --version is a flag of main.py itself; give it before any command "
     "(see main.py chat --help)"),
    (["--kv-cache-dtype", "int2"],
     "main.py gui: error: argument --kv-cache-dtype: invalid choice: 'int2' (choose from 'auto', 'bf16', 'int8', "
     "'fp8') (see main.py gui --help)"),
    (["genrate", "--prompt", "hi"],
     "main.py: error: unknown command 'genrate'; did you mean 'generate'? Or choose one of generate, chat, info, "
     "convert, eval, serve, bench, gui (see main.py --help)"),
    (["xyzzy"],
     "main.py: error: unknown command 'xyzzy'; choose one of generate, chat, info, convert, eval, serve, bench, gui "
     "(see main.py --help)"),
]


@pytest.mark.parametrize("argv,line", MISTAKES, ids=[" ".join(a) for a, _ in MISTAKES])
def test_main_py_usage_mistake_is_one_line(argv, line, capsys):
    assert root.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err == line + "\n" and captured.out == ""


@pytest.mark.parametrize("argv,line", [
    (["generate", "--max-tokens", "5"],
     "strata generate: error: the following arguments are required: --prompt (see strata generate --help)"),
    (["info", "--expert-policy", "mru"],
     "strata info: error: argument --expert-policy: invalid choice: 'mru' (choose from 'lfu', 'lru', 'adaptive', "
     "'static') (see strata info --help)"),
    (["chat", "--top-k", "1.5"],
     "strata chat: error: argument --top-k: invalid int value: '1.5' (see strata chat --help)"),
    (["serve", "--port", "http"],
     "strata serve: error: argument --port: invalid int value: 'http' (see strata serve --help)"),
    (["sreve"],
     "strata: error: argument COMMAND: invalid choice: 'sreve' (choose from 'generate', 'chat', 'info', 'convert', "
     "'eval', 'serve', 'bench') (see strata --help)"),
    (["--verbose"], "strata: error: unrecognized argument --verbose; did you mean --version (before any command)? "
                    "(see strata --help)"),
    (["--quiet"], "strata: error: unrecognized arguments: --quiet (see strata --help)"),
])
def test_strata_usage_mistake_is_one_line(argv, line, capsys):
    assert strata.main(argv) == 2
    assert capsys.readouterr().err == line + "\n"


@pytest.mark.parametrize("argv", [["--help"], ["generate", "--help"], ["gui", "--help"], ["convert", "-h"]])
def test_help_stays_full(argv, capsys):
    assert root.main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: main.py") and len(out.splitlines()) > 10


def test_the_real_process_prints_one_line_and_exits_2():
    proc = subprocess.run([sys.executable, str(ROOT / "main.py"), "generate", "--prompt", "hi", "--max-tokens", "x"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "main.py generate: error: argument --max-tokens: invalid int value: 'x' (see main.py generate --help)"]


def test_version_names_the_installed_version(capsys):
    from importlib.metadata import version

    assert root.main(["--version"]) == 0
    assert capsys.readouterr().out == f"main.py {version('strata')}\n"


def test_a_parser_used_after_a_command_line_judges_its_own_words(capsys):
    # the words of an earlier command line are not searched for a misspelt flag
    assert root.main(["generate", "--prompt", "hi", "--max-tokns", "3"]) == 2
    capsys.readouterr()
    parser, _ = strata.build_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["chat", "--reasoning-effort", "max"])
    assert "invalid choice: 'max'" in capsys.readouterr().err
