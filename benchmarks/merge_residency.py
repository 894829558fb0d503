"""Merge residency results of one routing each (bench_e2e.py --routing R) into one file.

    python benchmarks/merge_residency.py OUT.json uniform.json trained-like.json

Each routing runs in a process of its own (so each fits a 10-minute command); the merged file has
every routing's block and summary, and the pinned bandwidth and copy ceiling each run measured.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def merge(parts: list[dict]) -> dict:
    out = dict(parts[0])
    out["offload"], out["summary"] = {}, []
    for p in parts:
        routing = next(iter(p["offload"]))
        out["offload"][routing] = p["offload"][routing]
        out["summary"] += p["summary"]
        out.setdefault("pinned_h2d_gbs_by_routing", {})[routing] = p["pinned_h2d_gbs"]
        out.setdefault("copy_ceiling_gbs_by_routing", {})[routing] = p.get("copy_ceiling_gbs")
    out["max_memory_allocated_gb"] = max(p.get("max_memory_allocated_gb", 0.0) for p in parts)
    out["note"] = "one process per routing: " + ", ".join(next(iter(p["offload"])) for p in parts)
    return out


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit(__doc__.strip().splitlines()[2].strip())
    parts = [json.loads(Path(f).read_text()) for f in sys.argv[2:] if Path(f).is_file()]
    if not parts:
        sys.exit("none of the input files exists")
    Path(sys.argv[1]).write_text(json.dumps(merge(parts), indent=1))


if __name__ == "__main__":
    main()
