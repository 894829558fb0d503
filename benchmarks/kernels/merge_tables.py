"""Merge tuned MoE launch tables (``bench_moe.py --configs-out``) into one file of kernels/configs/.

    python benchmarks/kernels/merge_tables.py OUT.json TABLE.json [TABLE.json ...]

Each table maps ``format -> token bucket -> setting``; a later table's formats replace an earlier
one's (each format is tuned on the shape that runs it: the 16-bit, fp8 and int4 experts on the
Qwen3 shape, MXFP4 on gpt-oss's). ``OUT`` is written fresh; an existing file is never changed.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def merge(tables: list[dict]) -> dict:
    out: dict = {}
    for table in tables:
        for fmt, buckets in table.items():
            if buckets:                      # a format whose sweep found no correct setting adds nothing
                out[fmt] = buckets
    return out


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    out, parts = Path(argv[0]), [Path(p) for p in argv[1:]]
    if out.exists():
        print(f"{out} exists; name a new file (nothing was written)", file=sys.stderr)
        return 1
    missing = [str(p) for p in parts if not p.is_file()]
    if missing:
        print(f"no table at {', '.join(missing)}; run bench_moe.py --configs-out first", file=sys.stderr)
        return 1
    merged = merge([json.loads(p.read_text()) for p in parts])
    out.write_text(json.dumps(merged, indent=1) + "\n")
    print(f"wrote {out}: " + ", ".join(f"{f} ({', '.join(sorted(b, key=int))})" for f, b in merged.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
