"""Whether a step_profile variant won: exit 0 when the cells ``BASE+FLAG`` of every named base took less
decode time a step than ``BASE`` (medians of the timed steps), by at least 1% on average; else 1.

    python3 benchmarks/h200_pick.py step_profile.json gemv16 int4 bf16
"""
from __future__ import annotations

import json
import sys


def won(cells: dict[str, dict], flag: str, bases: list[str], margin: float = 0.01) -> bool:
    ratios = []
    for base in bases:
        if base not in cells or f"{base}+{flag}" not in cells:
            return False
        ratios.append(cells[f"{base}+{flag}"]["step_ms"] / cells[base]["step_ms"])
    print(f"{flag}: step time " + ", ".join(f"{b} x{r:.3f}" for b, r in zip(bases, ratios)))
    return all(r < 1.0 for r in ratios) and sum(ratios) / len(ratios) <= 1.0 - margin


def main(argv: list[str]) -> int:
    path, flag, *bases = argv
    try:
        with open(path) as f:
            cells = {c["cell"]: c for c in json.load(f)["cells"] if "step_ms" in c}
    except (OSError, ValueError, KeyError) as e:
        print(f"{flag}: no step_profile result to pick from ({e})")
        return 1
    return 0 if won(cells, flag, bases) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
