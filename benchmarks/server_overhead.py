"""The HTTP server's own Python time per streamed token and per request, on the CPU, with a fake engine.

    python benchmarks/server_overhead.py --out benchmarks/results/server_overhead_DATE.json
    python benchmarks/server_overhead.py --profile 30        # also the server thread's top functions

The engine is a stand-in (benchmarks/fake_engine.py) whose step costs what the configured shape says:
some milliseconds of pure Python (holding the interpreter lock, as an offloaded step's expert
bookkeeping does), cut by ``syncs`` waits that let the lock go (as waiting on the GPU does), and one
token for every running request. It runs under the real :class:`EngineLoop` with the real server
(:class:`BackgroundServer`, uvicorn on 127.0.0.1) beside it in the same process, as ``main.py serve``
runs them; the clients are another process (benchmarks/server_load.py).

What is measured, per workload:

* ``app_*``: the app alone, requests straight into it on this thread (no uvicorn, no sockets): its
  CPU time per token and per request (the least of the rounds), and the bytecodes it runs per extra
  streamed token and per one-token request, which do not depend on how busy the machine is.

* ``server_cpu_us_per_token``: the CPU time of the server's thread (its own clock, read from outside)
  over the tokens streamed; ``server_cpu_us_per_request`` on a workload of one-token replies.
* ``engine_lost_ms_p50``: per step, its wall time less its own CPU time and the waits it asked for:
  what the engine thread spent waiting for the interpreter lock (and for a core). Against the same
  steps with no server (``alone``), it is what the server takes from the engine.
* tokens per second through HTTP against the engine alone, and the switch interval each ran with.

A CPU measurement: the numbers say how much Python the server runs, not what a GPU run will reach.
"""
from __future__ import annotations

import argparse
import asyncio
import cProfile
import importlib.util
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.fake_engine import FakeEngine, StepShape, calibrate  # noqa: E402
from benchmarks.server_load import OpCounter, asgi_run, usage_tokens  # noqa: E402
from engine.loop import EngineLoop, Job  # noqa: E402
from engine.outputs import RequestDelta  # noqa: E402
from engine.sampling import SamplingParams  # noqa: E402
from engine.server import BackgroundServer, ServerSettings  # noqa: E402
from engine.server.app import create_app  # noqa: E402
from engine.server.asgi import KeepServerSend  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
COUNTED_TOKENS = 33           # tokens per request of the counted streaming run


# ---- the measured process ---------------------------------------------------------------------------
def thread_cpu_s(thread: threading.Thread) -> float:
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


def thread_user_sys_s(thread: threading.Thread) -> tuple[float, float]:
    """(user, system) CPU seconds of ``thread`` (Linux; clock ticks, so good to about 10 ms): user time is
    the interpreter running, with the lock held; system time is mostly socket calls, made without it."""
    fields = Path(f"/proc/self/task/{thread.native_id}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def _named(name: str) -> threading.Thread:
    return next(t for t in threading.enumerate() if t.name == name)


def run_alone(engine: FakeEngine, loop: EngineLoop, requests: int, tokens: int) -> dict:
    """The same steps with nobody listening: each sink only counts."""
    done = threading.Event()
    left = [requests]

    def sink(d: RequestDelta) -> None:
        if d.finished:
            left[0] -= 1
            if not left[0]:
                done.set()
    n = len(engine.log.wall)
    t0 = time.perf_counter()
    for i in range(requests):
        loop.submit(Job(f"alone-{time.perf_counter_ns()}-{i}", [10] * 16, SamplingParams(max_tokens=tokens), sink))
    done.wait()
    wall = time.perf_counter() - t0
    return {"tok_s": requests * tokens / wall, **_steps(engine, n)}


def _steps(engine: FakeEngine, n: int) -> dict:
    wall, lost = engine.log.wall[n:], engine.log.lost_ms()[n:]
    return {"steps": len(wall), "step_ms_p50": statistics.median(wall), "engine_lost_ms_p50": statistics.median(lost),
            "engine_lost_ms_mean": statistics.fmean(lost)}


def run_http(engine: FakeEngine, url: str, server_thread: threading.Thread, args, requests: int, tokens: int) -> dict:
    n = len(engine.log.wall)
    cmd = [sys.executable, str(ROOT / "benchmarks" / "server_load.py"), url, str(args.streams), str(requests),
           str(tokens)] + (["--chat"] if args.chat else [])
    cpu0, (user0, sys0) = thread_cpu_s(server_thread), thread_user_sys_s(server_thread)
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    cpu, (user1, sys1) = thread_cpu_s(server_thread) - cpu0, thread_user_sys_s(server_thread)
    if done.returncode != 0:
        raise RuntimeError(f"the clients failed: {done.stderr[-2000:]}")
    got = json.loads(done.stdout)
    return {"tok_s": got["tokens"] / got["wall_s"], "tokens": got["tokens"], "events": got["events"],
            "all_complete": got["all_complete"], "server_cpu_s": cpu,
            "server_cpu_us_per_token": cpu / got["tokens"] * 1e6, "server_cpu_us_per_request": cpu / requests * 1e6,
            "server_user_us_per_token": (user1 - user0) / got["tokens"] * 1e6,
            "server_sys_us_per_token": (sys1 - sys0) / got["tokens"] * 1e6,
            "server_user_us_per_request": (user1 - user0) / requests * 1e6,
            **_steps(engine, n)}


def measure_app(args, per_ms: float) -> dict:
    """The app's own Python (no uvicorn, no sockets) per streamed token and per request, on this thread; the
    engine thread's fake steps only wait (2 ms), so every step's tokens are taken before the next. Then
    the same counted (:class:`OpCounter`; steps of 60 ms then, for the slowed interpreter to keep up)."""
    engine = FakeEngine(StepShape(0.0, 2.0, 1), per_ms, args.streams)
    loop = EngineLoop(engine, idle_wait_s=0.005)
    loop.start_thread("overhead-engine")
    app = create_app(loop, ServerSettings(port=0, served_model_name="fake", stats_every=0))

    async def run() -> dict:
        out: dict = {"stream": [], "one_token": []}
        async with app.router.lifespan_context(app):
            served = KeepServerSend(app)
            await asgi_run(served, args.streams, args.streams, 8, args.chat)          # first-use costs
            for _ in range(args.rounds):
                for key, n, k in (("stream", args.requests, args.tokens), ("one_token", args.short_requests, 1)):
                    cpu, got = await asgi_run(served, args.streams, n, k, args.chat)
                    out[key].append({"cpu_us_per_token": cpu / (n * k) * 1e6, "cpu_us_per_request": cpu / n * 1e6,
                                     "all_complete": all(usage_tokens(c) == k for c in got)})
            engine.shape = StepShape(0.0, 60.0, 1)
            for key, n, k in (("stream", args.streams, COUNTED_TOKENS), ("one_token", args.streams, 1)):
                counter = OpCounter(by_function=bool(args.opcodes_by_function))
                await asgi_run(served, args.streams, n, k, args.chat, counter)
                if args.opcodes_by_function:
                    top = counter.top(args.opcodes_by_function, n * k)
                    print(f"--- {key}: bytecodes per token, by function\n{top}")
                out[f"{key}_counted"] = {"opcodes_per_token": counter.opcodes / (n * k),
                                         "c_calls_per_token": counter.c_calls / (n * k),
                                         "opcodes_per_request": counter.opcodes / n, "c_calls_per_request":
                                         counter.c_calls / n}
        return out
    try:
        return asyncio.run(run())
    finally:
        loop.stop()
        loop.join(10)


def measure(args, switch_ms: float | None, per_ms: float) -> dict:
    shape = StepShape(args.python_ms, args.wait_ms, args.syncs)
    engine = FakeEngine(shape, per_ms, args.streams)
    loop = EngineLoop(engine, idle_wait_s=0.005)
    loop.start_thread("overhead-engine")
    server = BackgroundServer(loop, ServerSettings(port=0, served_model_name="fake", stats_every=0))
    url = server.start()
    if switch_ms is not None:
        sys.setswitchinterval(switch_ms / 1e3)
    server_thread = _named("strata-http")
    out: dict = {"switch_interval_ms": sys.getswitchinterval() * 1e3}
    try:
        run_http(engine, url, server_thread, args, args.streams, 8)          # first-use costs
        for rnd in range(args.rounds):
            out.setdefault("alone", []).append(run_alone(engine, loop, args.requests, args.tokens))
            out.setdefault("stream", []).append(run_http(engine, url, server_thread, args, args.requests,
                                                         args.tokens))
            out.setdefault("one_token", []).append(run_http(engine, url, server_thread, args, args.short_requests,
                                                            1))
    finally:
        server.stop()
        loop.stop()
        loop.join(10)
    return out


def profile_server(args, per_ms: float) -> str:
    """The server thread's top functions (cProfile on that thread only) over one streaming workload."""
    engine = FakeEngine(StepShape(args.python_ms, args.wait_ms, args.syncs), per_ms, args.streams)
    loop = EngineLoop(engine, idle_wait_s=0.005)
    loop.start_thread("overhead-engine")
    server = BackgroundServer(loop, ServerSettings(port=0, served_model_name="fake", stats_every=0))
    url = server.start()
    prof = cProfile.Profile(time.thread_time)          # CPU time of the server thread, not wall time
    aloop = server.app.state.strata.client.aloop
    try:
        run_http(engine, url, _named("strata-http"), args, args.streams, 8)
        aloop.call_soon_threadsafe(prof.enable)
        run_http(engine, url, _named("strata-http"), args, args.requests, args.tokens)
        done = threading.Event()
        aloop.call_soon_threadsafe(lambda: (prof.disable(), done.set()))
        done.wait(10)
    finally:
        server.stop()
        loop.stop()
        loop.join(10)
    text = io.StringIO()
    stats = pstats.Stats(prof, stream=text)
    tokens = args.requests * args.tokens
    text.write(f"{stats.total_calls / tokens:.1f} Python calls and {stats.total_tt / tokens * 1e6:.1f} us (profiled) "
               f"of the server thread per streamed token\n")
    stats.sort_stats(args.sort).print_stats(args.profile)
    return text.getvalue()


def _marginal(app: dict, what: str) -> float:
    """Counted work of one more streamed token: a request of COUNTED_TOKENS less one of 1, per token between."""
    many, one = app["stream_counted"][f"{what}_per_request"], app["one_token_counted"][f"{what}_per_request"]
    return (many - one) / (COUNTED_TOKENS - 1)


def summary(block: dict) -> dict:
    med = lambda rows, k: statistics.median(r[k] for r in rows)      # noqa: E731
    a, s, o = block["alone"], block["stream"], block["one_token"]
    return {"switch_interval_ms": block["switch_interval_ms"],
            "server_cpu_us_per_token": med(s, "server_cpu_us_per_token"),
            "server_user_us_per_token": med(s, "server_user_us_per_token"),
            "server_sys_us_per_token": med(s, "server_sys_us_per_token"),
            "server_cpu_us_per_request_1_token": med(o, "server_cpu_us_per_request"),
            "server_user_us_per_request_1_token": med(o, "server_user_us_per_request"),
            "tok_s_alone": med(a, "tok_s"), "tok_s_http": med(s, "tok_s"),
            "http_over_alone_tok_s": med(s, "tok_s") / med(a, "tok_s"),
            "step_ms_p50_alone": med(a, "step_ms_p50"), "step_ms_p50_http": med(s, "step_ms_p50"),
            "engine_lost_ms_p50_alone": med(a, "engine_lost_ms_p50"),
            "engine_lost_ms_p50_http": med(s, "engine_lost_ms_p50"),
            "engine_lost_ms_mean_http": med(s, "engine_lost_ms_mean"),
            "tokens_complete": all(r["all_complete"] for r in s + o)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--short-requests", type=int, default=128, help="requests of the one-token workload")
    ap.add_argument("--python-ms", type=float, default=3.0, help="Python under the lock per fake step")
    ap.add_argument("--wait-ms", type=float, default=6.0, help="waits without the lock per fake step")
    ap.add_argument("--syncs", type=int, default=3, help="how many waits the step's Python is cut by")
    ap.add_argument("--switch-ms", default="server,5", help="switch intervals to run with (ms; 'server': "
                                                           "what the server sets)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--chat", action="store_true", help="stream /v1/chat/completions (needs a chat template)")
    ap.add_argument("--profile", type=int, default=0, help="print the server thread's top N functions")
    ap.add_argument("--sort", default="tottime", help="how --profile orders functions (a pstats key)")
    ap.add_argument("--opcodes-by-function", type=int, default=0, help="print the N functions of the app that run "
                                                                      "the most bytecodes per token")
    ap.add_argument("--app-only", action="store_true", help="only the app without server or sockets (quick, steady)")
    ap.add_argument("--label", default="", help="what this run measures (kept in the result file)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    per_ms = calibrate()
    if args.profile:
        print(profile_server(args, per_ms))
        return
    app = measure_app(args, per_ms)
    app_summary = {"app_cpu_us_per_token": min(r["cpu_us_per_token"] for r in app["stream"]),
                   "app_cpu_us_per_request_1_token": min(r["cpu_us_per_request"] for r in app["one_token"]),
                   "app_opcodes_per_token": _marginal(app, "opcodes"),
                   "app_c_calls_per_token": _marginal(app, "c_calls"),
                   "app_opcodes_per_request_1_token": app["one_token_counted"]["opcodes_per_request"],
                   "app_c_calls_per_request_1_token": app["one_token_counted"]["c_calls_per_request"],
                   "tokens_complete": all(r["all_complete"] for r in app["stream"] + app["one_token"])}
    print(json.dumps({"app": app_summary}, indent=1), flush=True)
    if args.app_only:
        return
    result: dict = {"benchmark": "server_overhead", "label": args.label,
                    "machine": "CPU only (no GPU): a fake engine step; the figures measure the server's Python",
                    "http_stack": {name: importlib.util.find_spec(name) is not None
                                   for name in ("httptools", "uvloop")},
                    "shape": vars(StepShape(args.python_ms, args.wait_ms, args.syncs)),
                    "workload": {"streams": args.streams, "requests": args.requests, "tokens": args.tokens,
                                 "short_requests": args.short_requests, "endpoint": "chat" if args.chat else
                                 "completions"}, "app": {"rounds": app, "summary": app_summary}, "runs": {},
                    "summary": {}}
    base = sys.getswitchinterval()
    for sw in args.switch_ms.split(","):
        sys.setswitchinterval(base)
        block = measure(args, None if sw == "server" else float(sw), per_ms)
        result["runs"][sw] = block
        result["summary"][sw] = summary(block)
        print(json.dumps({sw: result["summary"][sw]}, indent=1), flush=True)
    if args.out:
        from benchmarks.common import write_result
        write_result(args.out, result)


if __name__ == "__main__":
    main()
