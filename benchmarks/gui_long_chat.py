"""How late the workbench's event loop runs while a long chat opens, while its earlier messages go on screen
("Show earlier messages") and while a reply streams below them (offscreen, no model).

    python benchmarks/gui_long_chat.py [--messages 800] [--baseline REV] [--out FILE]

A chat of --messages alternating questions and Markdown answers (paragraphs, a list, a code block) is saved,
opened, and "Show earlier messages" pressed until every message is on screen; then a reply streams 30
paragraphs into a new bubble. A timer on the GUI thread ticks every 5 ms and records how late each tick
fires. --baseline REV measures the transcript of that commit too, in the same run, from a copy of its tree
(``git archive``). Prints p50/p90/max lateness per phase; writes them with the machine, the load average and
the versions to --out (default: results/gui_long_chat_<date>.json).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# runs inside the tree measured (its app/ and tests/app/chat_fakes.py), printing one JSON line
CHILD = r'''
import json, sys, tempfile, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from PySide6.QtCore import QEventLoop, Qt, QTimer
from PySide6.QtWidgets import QApplication
app = QApplication([])
from app.chat_pane import ChatPane
from app.conversation_list import ConversationList
from app.chat_controller import ChatController
from app.conversations import ConversationStore, Conversation, StoredMessage
from tests.app.chat_fakes import FakeBridge, CHAT_MODEL
n = int(sys.argv[2])
para = "Here is a **paragraph** with `code` and some words that wrap across the bubble's width, " * 3
def text(i):
    if i % 2 == 0:
        return f"question {i}: " + para[:120]
    return f"answer {i}\n\n{para}\n\n- item one\n- item two\n\n```python\nprint('x')\n```\n\n{para}"
pane, sidebar = ChatPane(), ConversationList()
chat = ChatController(pane, sidebar, ConversationStore(Path(tempfile.mkdtemp())), FakeBridge(), None)
pane.resize(1000, 700); pane.show(); sidebar.show(); chat.set_model(CHAT_MODEL)
conv = Conversation(messages=[StoredMessage("user" if i % 2 == 0 else "assistant", text(i)) for i in range(n)])
chat.library.save(conv)
late, last = [], [0.0]
def tick():
    now = time.perf_counter(); late.append((now - last[0]) * 1e3 - 5); last[0] = now
timer = QTimer(); timer.setTimerType(Qt.TimerType.PreciseTimer); timer.timeout.connect(tick)
def settle(ms):
    loop = QEventLoop(); QTimer.singleShot(ms, loop.quit); loop.exec()
def until(cond, limit=300.0):
    end = time.perf_counter() + limit
    while not cond() and time.perf_counter() < end:
        settle(5)
view = pane.view
def phase(run, cond):
    late.clear(); t = time.perf_counter(); last[0] = t; timer.start(5)
    run(); until(cond); settle(200); timer.stop()
    gaps = sorted(late[1:]) or [0.0]
    return {"seconds": time.perf_counter() - t - 0.2, "bubbles": len(view.bubbles), "ticks": len(gaps),
            "p50_ms": gaps[len(gaps) // 2], "p90_ms": gaps[int(len(gaps) * 0.9)], "max_ms": gaps[-1]}
out = {"open": phase(lambda: chat.open(conv.id), lambda: len(view.bubbles) >= min(n, 200)
                     and (not view.earlier_button.isVisible() or len(view.bubbles) >= 200)), "earlier": []}
while view.earlier_button.isVisible():
    shown = len(view.bubbles)
    out["earlier"].append(phase(view.earlier_button.click, lambda: len(view.bubbles) >= min(n, shown + 200)))
view.verticalScrollBar().setValue(view.verticalScrollBar().maximum())
bubble = view.add("assistant", "", streaming=True)
settle(100)
def stream():
    for _ in range(30):
        bubble.append(para + "\n\n"); settle(10)
out["stream"] = phase(stream, lambda: True)
print(json.dumps(out))
'''


def measure(tree: Path, messages: int) -> dict:
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    done = subprocess.run([sys.executable, "-c", CHILD, str(tree), str(messages)], cwd=tree, env=env,
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=800)
    ap.add_argument("--baseline", default=None, help="a commit whose transcript is measured too, in this run")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from benchmarks.common import write_result
    trees = {"this tree": ROOT}
    with tempfile.TemporaryDirectory(prefix="strata-long-chat-") as tmp:
        if args.baseline:
            base = Path(tmp) / "baseline"
            base.mkdir()
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.baseline], capture_output=True,
                                     check=True).stdout
            subprocess.run(["tar", "-x", "-C", str(base)], input=archive, check=True)
            trees[f"baseline {args.baseline}"] = base
        results = {}
        for name, tree in trees.items():
            results[name] = measure(tree, args.messages)
            r = results[name]
            for label, p in [("open", r["open"]), *[(f"earlier {i + 1}", e) for i, e in enumerate(r["earlier"])],
                             ("stream", r["stream"])]:
                print(f"{name:>22} {label:>10}: {p['bubbles']:4d} messages on screen, {p['seconds']:5.2f} s, "
                      f"late p50 {p['p50_ms']:6.1f} p90 {p['p90_ms']:6.1f} max {p['max_ms']:6.1f} ms")
    default = ROOT / "benchmarks" / "results" / f"gui_long_chat_{time.strftime('%Y-%m-%d')}.json"
    out = Path(args.out) if args.out else default
    if out.exists():
        sys.exit(f"{out} exists; pass --out with a new name")
    write_result(out, {"benchmark": "gui_long_chat", "load_average": os.getloadavg(), "cpus": os.cpu_count(),
                       "config": {"messages": args.messages, "baseline": args.baseline}, "results": results})
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
