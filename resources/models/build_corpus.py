"""Rebuild the demo model's corpus: the World English Bible (public domain) as plain English text.

Source: Debian package `sword-text-web` (SWORD module engWEB2015eb, "World English Bible with
Deuterocanon", Copyright=PUBLIC DOMAIN), read with `diatheke` from Debian package `diatheke`:

    apt-get install sword-text-web diatheke
    python resources/models/build_corpus.py            # writes .carry/demo_corpus/

Output (one chapter per paragraph, verses joined by spaces, chapters separated by a blank line):
    train.txt   85% of chapters: the only text the model is trained on
    val.txt      5% of chapters: early-stopping / model selection only
    test.txt    10% of chapters: held out, never trained on or selected on; perplexity is reported here
The split is fixed: chapters are numbered 0.. in canonical order; number % 10 == 9 goes to test,
number % 20 == 4 goes to val, the rest to train.

It also writes resources/models/demo_heldout.txt: the first ~2 KB of the test split (whole verses),
committed for the fast perplexity test.
"""

from __future__ import annotations

import argparse
import re
import subprocess
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MODULE = "engWEB2015eb"
KEY = "Gen 1:1-Rev 22:21"
GLOSSARY_START = "The following words used in the World English Bible"
VERSE_RE = re.compile(r"^\s*((?:I{1,3}V? )?[A-Z][A-Za-z() ]*?) (\d+):(\d+): ?(.*)$")
# A few OSIS tags (a stale psalm title among them) leak into diatheke's plain output: drop them.
MARKUP_RE = re.compile(r"<title[^>]*>.*?</title>|<[^>]*>")
HELDOUT_CHARS = 2048
# diatheke's range dump repeats two psalm titles after every later verse (each ~10,000 times);
# no genuine line of the text repeats more than a few dozen times.
STALE_REPEATS = 1000


def read_module() -> str:
    """Dump the whole module as diatheke's plain-text rendering."""
    try:
        done = subprocess.run(["diatheke", "-b", MODULE, "-f", "plain", "-k", KEY],
                              check=True, capture_output=True, text=True)
    except FileNotFoundError as exc:
        raise SystemExit("diatheke not found: apt-get install sword-text-web diatheke") from exc
    return done.stdout


def parse_chapters(raw: str) -> list[list[str]]:
    """Group verses (poetry spans several lines) into chapters; drop references and the glossary."""
    lines = [MARKUP_RE.sub("", line) for line in raw.splitlines()]
    counts = Counter(line.strip() for line in lines)
    stale = {text for text, n in counts.items() if text and n > STALE_REPEATS}
    chapters: list[list[list[str]]] = []  # chapter -> verse -> lines
    current_key = None
    for line in lines:
        if line.strip() == f"({MODULE})" or line.strip() in stale:
            continue
        match = VERSE_RE.match(line)
        if match:
            book, chapter, _verse, text = match.groups()
            if (book, chapter) != current_key:
                chapters.append([])
                current_key = (book, chapter)
            chapters[-1].append([text])
        elif chapters:
            chapters[-1][-1].append(line)
    verses = [[" ".join(" ".join(lines).split()) for lines in ch] for ch in chapters]
    last = verses[-1][-1]
    if GLOSSARY_START in last:
        verses[-1][-1] = last[: last.index(GLOSSARY_START)].strip()
    return [[v for v in ch if v] for ch in verses]


def split(chapters: list[list[str]]) -> dict[str, list[str]]:
    parts: dict[str, list[str]] = {"train": [], "val": [], "test": []}
    for number, verses in enumerate(chapters):
        name = "test" if number % 10 == 9 else "val" if number % 20 == 4 else "train"
        parts[name].append(" ".join(verses))
    return parts


def heldout_sample(test_chapters: list[str], limit: int = HELDOUT_CHARS) -> str:
    """Whole sentences from the start of the test split, at most `limit` characters."""
    text = test_chapters[0]
    cut = text[:limit]
    end = max(cut.rfind(". "), cut.rfind("? "), cut.rfind("! "))
    return cut[: end + 1] + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / ".carry" / "demo_corpus")
    parser.add_argument("--heldout", type=Path, default=REPO / "resources" / "models" / "demo_heldout.txt")
    args = parser.parse_args()
    chapters = parse_chapters(read_module())
    parts = split(chapters)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, docs in parts.items():
        text = "\n\n".join(docs) + "\n"
        (args.out / f"{name}.txt").write_text(text, encoding="utf-8")
        print(f"{name}: {len(docs)} chapters, {len(text.encode()):,} bytes")
    args.heldout.write_text(heldout_sample(parts["test"]), encoding="utf-8")
    print(f"held-out sample: {args.heldout}")


if __name__ == "__main__":
    main()
