"""Engine messages in the workbench's words: a fix that names a CLI flag names what works in the window.

The engine's one-line errors and notes name CLI flags ("lower --expert-pool-size"). In the window a
flag that has a knob becomes the knob ("lower the Expert pool knob"), ``--model`` becomes the menu
that opens a folder, and a flag that only takes effect at start-up keeps a plain name in the sentence
and gets one closing hint that works (``main.py`` accepts every engine flag): "start Strata with
--max-model-len N". Flags of other commands (``convert --weights``) are left as they are: that advice
is for the command it names.

The flags come from the engine's own parser definitions, so a flag added there is covered at once
(with a name made from the flag until it gets its own line in ``FLAG_WORDS``).
"""
from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass

from app.bridge_api import DROP_OLDEST_FIX, add_engine_flags, add_model_flag
from app.knobs import LABELS, knob_name

OPEN_MODEL = "File › Open model folder…"
#: Every flag: what it is called inside a sentence when it only takes effect at start-up (flags with a
#: knob are called by the knob's name instead), and the placeholder written for its value.
FLAG_WORDS: dict[str, tuple[str, str]] = {
    "--model": ("the model folder", "PATH"),
    "--debug": ("debug mode", ""),
    "--device": ("the device", "cpu"),
    "--dtype": ("the dtype", "float16"),
    "--weight-format": ("the expert weight format", "int4"),
    "--group-size": ("the int4 group size", "64"),
    "--resident-weights": ("the resident weights' format", "fp8"),
    "--embeddings": ("where the token embedding table is kept", "host"),
    "--expert-pool-size": ("the expert pool size", "SIZE"),
    "--prefetch-depth": ("the prefetch depth", "N"),
    "--expert-policy": ("the eviction policy", "lru"),
    "--expert-reads": ("how missing experts are read", "copy"),
    "--cold-experts": ("where missing experts are computed", "cpu"),
    "--routing-profile": ("a routing profile", "FILE"),
    "--record-routing": ("a routing recording", "FILE"),
    "--max-batch": ("the batch size", "N"),
    "--max-batch-tokens": ("the token budget per step", "N"),
    "--prefill-chunk": ("the prefill chunk", "N"),
    "--max-model-len": ("the context length", "N"),
    "--kv-cache-dtype": ("the KV cache dtype", "int8"),
    "--kv-cache-size": ("the KV cache size", "SIZE"),
    "--gpu-memory-budget": ("the GPU memory budget", "SIZE"),
    "--cuda-graphs": ("CUDA graphs", ""),
    "--overlap-steps": ("decode steps launched ahead", ""),
    "--verify": ("checksum verification", ""),
    "--cpu-threads": ("the CPU thread count", "N"),
    "--pipeline-parallel": ("the pipeline's GPU count", "N"),
    "--pipeline-microbatches": ("the pipeline's micro-batch count", "M"),
    "--expert-parallel": ("the expert-parallel GPU count", "N"),
}
#: The values a flag without a list of choices takes in a sentence ("use --device cuda:1").
FLAG_VALUES: dict[str, re.Pattern[str]] = {"--device": re.compile(r"auto|cpu|cuda(?::\d+)?")}
_FLAG = re.compile(r"(?<![\w-])--(?P<no>no-)?(?P<name>[a-z][a-z0-9]*(?:-[a-z0-9]+)*)")
_VALUE = re.compile(r" (?P<value>[A-Z][A-Z_]*\b|\d[\w.%:]*(?: [KMGTP]i?B\b| B\b)?|[a-z]+\d[\w:]*)")
_SUBJECT = re.compile(r"(?:^|[.;:]\s+)$")          # a flag that opens a sentence is what it is about
_RULE = re.compile(r"\s*(?:must|needs?|cannot|can't)\b")    # ... unless the sentence says what it has to be
_AT_START = re.compile(r"\b(?:(?:re)?start(?: Strata)? with|no) $")   # the flag is about how Strata starts
_DROP = re.compile(r"\b(?:drop|leave out|remove) $")
_PASS_MODEL = re.compile(r"\b(?:pass|give|use) --model with\b")
_RULE_SUBJECT = re.compile(r"(?:^|(?<=[;:] ))(?P<name>[a-z][a-z0-9_]*)(?= must\b)")   # "max_batch must be ..."


@dataclass(frozen=True)
class Flag:
    """One flag the workbench's command line accepts."""

    name: str                     # "--max-model-len"
    takes_value: bool
    choices: tuple[str, ...] = ()

    @property
    def option(self) -> str:
        """The EngineConfig field it sets: "--max-model-len" -> "max_model_len"."""
        return self.name.removeprefix("--").replace("-", "_")


class _Recorder:
    """Stands in for an argparse parser to list the flags ``add_engine_flags`` defines."""

    def __init__(self) -> None:
        self.flags: dict[str, Flag] = {}

    def add_argument_group(self, *_args, **_kwargs) -> "_Recorder":
        return self

    def add_argument(self, *names: str, **kwargs) -> None:
        action = kwargs.get("action")
        takes_value = action is None or action in ("store", "append")
        choices = tuple(str(c) for c in kwargs.get("choices") or ())
        for name in names:
            if name.startswith("--"):
                self.flags[name] = Flag(name, takes_value, choices)


def engine_flags() -> dict[str, Flag]:
    """Every flag ``main.py`` takes for the workbench's engine: the model flags and the engine flags."""
    rec = _Recorder()
    add_model_flag(rec)
    add_engine_flags(rec)
    return rec.flags


FLAGS = engine_flags()
_FLAG_OF = {flag.option: flag.name for flag in FLAGS.values()}     # "max_batch" -> "--max-batch"
LIVE_KNOBS = frozenset(LABELS)       # the options the knobs panel changes on the running engine


def words_of(flag: Flag) -> tuple[str, str]:
    """(name inside a sentence, value placeholder); a flag without a line of its own gets a plain one."""
    if flag.name in FLAG_WORDS:
        return FLAG_WORDS[flag.name]
    return f"the {flag.name.removeprefix('--').replace('-', ' ')} setting", ("VALUE" if flag.takes_value else "")


def gui_wording(text: str, knobs: Collection[str] | None = None) -> str:
    """``text`` with every engine flag it names replaced by what does that in the workbench.

    ``knobs``: the live options whose knobs can make the change now (None: every knob). A message about
    a load (a load that failed, a note on what a load clamped) passes none: its fixes take effect at
    the next start, whatever the running model's knobs do.
    """
    text = _knob_names(text)
    if "--" not in text:
        return text
    text = _PASS_MODEL.sub(f"use {OPEN_MODEL} on", text)
    usable = frozenset(LIVE_KNOBS if knobs is None else knobs)
    out: list[str] = []
    hints: list[str] = []
    pos = 0
    for m in _FLAG.finditer(text):
        flag = FLAGS.get(f"--{m['name']}")
        if flag is None:                      # another command's flag: its advice stands as written
            continue
        value, end = _value_after(text, m.end(), flag)
        written = f"--no-{flag.name[2:]}" if m["no"] else flag.name
        before, instead = _replace(text[pos:m.start()], flag, written, value, usable, hints,
                                   aside=text[m.start() - 1:m.start()] == "(" and text[end:end + 1] == ")",
                                   rule=_RULE.match(text, end) is not None)
        out += [before, instead]
        pos = end
    out.append(text[pos:])
    result = "".join(out)
    if hints:
        result = result.rstrip(". ") + f" (start Strata with {' or '.join(dict.fromkeys(hints))})"
    return result


def load_wording(text: str) -> str:
    """A message about a load (why it failed, what it clamped) in the workbench's words.

    Its fixes take effect at the next start, whatever the running model's knobs do; and the options a
    load was given are the flags Strata was started with, so an option that a rule is about ("max_batch
    must be an integer >= 1") is named as that flag ("the batch size must be an integer >= 1 (start
    Strata with --max-batch N)"), never by the engine's name for it.
    """
    text = _RULE_SUBJECT.sub(lambda m: _FLAG_OF.get(m["name"], m["name"]), text)
    return gui_wording(text, knobs=())


# the chat settings' words for what the engine's messages call the request options they name
_CHAT_WORDS = ((DROP_OLDEST_FIX,
                "set Chat too long (in the chat settings) to drop the oldest turns"),)


def _knob_names(text: str) -> str:
    """The engine's option names (``max_batch_tokens=1``, "raise max_batch_tokens") as the knobs' labels,
    and the chat settings' words for a request option's advice."""
    for engine_words, chat_words in _CHAT_WORDS:
        text = text.replace(engine_words, chat_words)
    for flag, (words, _) in FLAG_WORDS.items():          # a start-up setting by its words: "the device cuda"
        name = flag[2:].replace("-", "_")
        if name not in LABELS and f"{name}" in text:
            text = re.sub(rf"(?<![\w-]){name} ?= ?(?=\S)", f"{words} ", text)
    for name in sorted(LABELS, key=len, reverse=True):
        if name not in text:
            continue
        label = LABELS[name]
        text = re.sub(rf"(?<![\w-]){name} ?= ?", f"{label} ", text)
        text = re.sub(rf"\b(raise|lower|set|change) {name}\b", rf"\1 the {label} knob", text)
    return text


def _replace(before: str, flag: Flag, written: str, value: str, knobs: frozenset[str], hints: list[str],
             aside: bool, rule: bool = False) -> tuple[str, str]:
    """(the text before the flag, what stands for the flag); a start-up flag adds to ``hints``."""
    at_start = _AT_START.search(before)
    startup = f"{written} {value or words_of(flag)[1]}".rstrip()
    if flag.name == "--model":
        return before, OPEN_MODEL
    if at_start is not None:
        if at_start.group(0).startswith("no"):          # "no --x was given": how Strata was started
            return before, written
        # "restart with --x": already a start-up instruction; say it the way that works from here
        return before[:at_start.start()] + "restart Strata with ", startup
    drop = _DROP.search(before)
    if drop is not None:
        return before[:drop.start()], f"start Strata without {written}"
    if flag.option in knobs:
        shown = "off" if written.startswith("--no-") else value
        return before, f"the {knob_name(flag.option)} knob" + (f" ({shown})" if shown and not shown.isupper() else "")
    if aside:                                 # "(--x)": a reference, not part of the sentence
        return before, f"start Strata with {startup}"
    name = words_of(flag)[0]
    if _SUBJECT.search(before) and not rule:  # "--x 5 is more than ...": a fact about the setting, no advice
        said = name + (f" {value}" if value and not value.isupper() else "")
        return before, said[0].upper() + said[1:] if not before.strip() else said
    hints.append(startup)
    return before, name + (f" {value}" if value and not value.isupper() else "")   # a METAVAR says nothing here


def _value_after(text: str, at: int, flag: Flag) -> tuple[str, int]:
    """The value written right after a flag (a number, size, choice or METAVAR) and where it ends."""
    if not flag.takes_value:
        return "", at
    m = _VALUE.match(text, at)
    if m is not None:
        return m["value"], m.end()
    word = re.match(r" ([\w:.-]+?)(?=[\s,;)]|\.?$|\.\s)", text[at:])
    known = FLAG_VALUES.get(flag.name)
    if word is None or not (word.group(1) in flag.choices or (known is not None and known.fullmatch(word.group(1)))):
        return "", at
    return word.group(1), at + word.end()
