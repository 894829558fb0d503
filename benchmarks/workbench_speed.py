"""Decode speed of a chat reply in the workbench against the same engine with no window (offscreen, demo model).

    python benchmarks/workbench_speed.py [--tokens 400] [--repeats 3] [--size 1400x900] [--out FILE]

The window is laid out as a first start lays it out at --size (the panels tabbed; on a large screen two
groups), its plots redrawn by its own timer. Each repeat runs one greedy reply of --tokens in the window,
then the same prompt through the window's engine with the window's event loop not running (what the CLI
sees), so both meet the same load on the machine. Prints the median decode tok/s of each and their ratio.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    from benchmarks.common import ROOT, environment, write_result
    from benchmarks.gui_stall import PROMPT, _run_until, open_window
    from PySide6.QtCore import QSize

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(ROOT / "resources" / "models" / "demo"))
    ap.add_argument("--tokens", type=int, default=400)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--size", default="1400x900")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    width, height = (int(v) for v in args.size.split("x"))
    rows = []
    with tempfile.TemporaryDirectory(prefix="strata-workbench-speed-") as tmp:
        app, window = open_window(args.model, args.tokens, Path(tmp))
        window.resize(width, height)
        window.apply_default_layout(QSize(width, height))
        app.processEvents()
        engine = window.bridge.engine_loop.engine
        prompt = engine.tokenizer.encode(PROMPT)
        from engine import SamplingParams
        params = SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True)
        for i in range(args.repeats):
            finished: list = []
            window.chat.reply_done.connect(finished.append)
            window.chat.send(PROMPT)
            _run_until(lambda: bool(finished), 240_000)
            window.chat.reply_done.disconnect(finished.append)
            windowed = finished[0].decode_tok_s
            # the same engine on its own: the bridge's loop is idle (no request), the GUI's loop not running
            bare = window.bridge.engine_loop.call(
                lambda e: _bare_decode(e, prompt, params)).result(240)
            rows.append({"repeat": i, "window_tok_s": windowed, "bare_tok_s": bare,
                         "window_tokens": finished[0].completion_tokens})
            print(f"repeat {i}: window {windowed:.1f} tok/s, no window {bare:.1f} tok/s", flush=True)
        window.close()
        app.processEvents()
    med_w = statistics.median(r["window_tok_s"] for r in rows)
    med_b = statistics.median(r["bare_tok_s"] for r in rows)
    print(f"median: window {med_w:.1f} tok/s, no window {med_b:.1f} tok/s, ratio {med_w / med_b:.2f}")
    out = args.out or ROOT / "benchmarks" / "results" / f"workbench_speed_{time.strftime('%Y-%m-%d')}.json"
    write_result(out, {"benchmark": "workbench_speed", "environment": environment(),
                       "config": {"model": Path(args.model).name, "tokens": args.tokens, "size": args.size,
                                  "repeats": args.repeats, "cores": os.cpu_count()},
                       "rows": rows, "median_window_tok_s": med_w, "median_bare_tok_s": med_b,
                       "ratio": med_w / med_b})
    print(f"wrote {out}")


def _bare_decode(engine, prompt: list[int], params) -> float:
    """Decode tok/s of one request run to its end on ``engine`` (called on the engine's own thread)."""
    rid = engine.add_request(None, prompt, params)
    first = None
    made = 0
    while engine.has_unfinished():
        for d in engine.step():
            if d.request_id == rid and d.new_token_ids:
                made += len(d.new_token_ids)
                if first is None:
                    first, made = time.perf_counter(), 0
    return made / (time.perf_counter() - first)


if __name__ == "__main__":
    main()
