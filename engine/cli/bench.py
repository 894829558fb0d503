"""``strata bench``: a fixed-seed serving workload, in-process or against any OpenAI-compatible server."""
from __future__ import annotations

import argparse
import os
import sys

from engine.bench.workload import PRESETS, Fixed, Workload, parse_length
from engine.errors import ConfigError, StrataError

WARMUP_TOKENS = 8           # output tokens of each warm-up request (graphs captured, kernels compiled)


def add_bench_parser(sub, add_model_flag, add_engine_flags) -> None:
    p = sub.add_parser("bench", help="measure throughput and latency of a serving workload",
                       description="Run a fixed-seed workload on the model in this process (the default) or on "
                                   "any OpenAI-compatible server (--url), and report tok/s and latencies.",
                       epilog="With --url, --model names the model field of the requests (default: the first "
                              "model the server lists) and the engine flags are not used.")
    add_model_flag(p)
    w = p.add_argument_group("workload (flags override the preset)")
    w.add_argument("--preset", choices=sorted(PRESETS), default=None,
                   help="offload-batch: 64 requests, prompt 128~16, output 256, concurrency 16; "
                        "four-streams: 4 concurrent streams of 800 tokens (~600 words), prompt 40~4")
    w.add_argument("--requests", type=int, default=None, help="number of requests (default 32)")
    w.add_argument("--prompt-len", default=None, metavar="LEN",
                   help="prompt tokens: N, LOW:HIGH (uniform) or MEAN~SD (normal) (default 128)")
    w.add_argument("--output-len", default=None, metavar="LEN", help="output tokens, as --prompt-len (default 128)")
    w.add_argument("--concurrency", type=int, default=None,
                   help="requests in flight at most (default 8; none when only --request-rate is given)")
    w.add_argument("--request-rate", type=float, default=None, metavar="R",
                   help="send requests at Poisson arrival times, R per second (default: as fast as --concurrency allows)")
    w.add_argument("--seed", type=int, default=None, help="seed of prompts, lengths and arrivals (default 0)")
    w.add_argument("--temperature", type=float, default=None, help="0 = greedy (default 0)")
    w.add_argument("--stop-at-eos", action="store_true", help="end replies at EOS (default: EOS is ignored)")
    w.add_argument("--text-prompts", action="store_true",
                   help="send random words instead of token ids (for servers that take text prompts only)")
    w.add_argument("--warmup", type=int, default=None, metavar="N",
                   help=f"warm-up requests of {WARMUP_TOKENS} tokens before the timed run (default: the concurrency, at most "
                        "--requests)")
    s = p.add_argument_group("server")
    s.add_argument("--url", default=None, help="an OpenAI-compatible server's base address, e.g. http://127.0.0.1:8000")
    s.add_argument("--api-key", default=None, help="the server's API key (default: STRATA_API_KEY)")
    s.add_argument("--vocab-size", type=int, default=None,
                   help="with --url: the model's vocabulary, when smaller than 32000 and the server does not "
                        "list it (a Strata server does); prompt ids stay below it")
    p.add_argument("--json", default=None, metavar="FILE",
                   help="write config, commit, GPU, versions and results; never replaces a file (FILE! does)")
    add_engine_flags(p)
    p.set_defaults(bench_parser=p)


def workload_from(args: argparse.Namespace) -> Workload:
    """The preset (or the default workload) with every flag given laid over it."""
    base = PRESETS[args.preset] if args.preset else Workload()
    changes: dict = {}
    if args.requests is not None:
        changes["num_requests"] = args.requests
    if args.prompt_len is not None:
        changes["prompt_len"] = parse_length(args.prompt_len, "--prompt-len")
    if args.output_len is not None:
        changes["output_len"] = parse_length(args.output_len, "--output-len")
    if args.request_rate is not None:
        changes["request_rate"] = args.request_rate
        changes["concurrency"] = args.concurrency           # a rate alone: no cap
    elif args.concurrency is not None:
        changes["concurrency"] = args.concurrency
    for flag, key in (("seed", "seed"), ("temperature", "temperature")):
        if getattr(args, flag) is not None:
            changes[key] = getattr(args, flag)
    if args.stop_at_eos:
        changes["ignore_eos"] = False
    if args.text_prompts:
        changes["text_prompts"] = True
    if changes and args.preset:
        changes["name"] = f"{args.preset} (changed)"
    return base.replace(**changes)


def warmup_of(workload: Workload, count: int | None) -> Workload | None:
    """Short requests at the run's concurrency (no more than the run sends), with prompts of their own,
    or None for no warm-up."""
    n = min(workload.concurrency or 1, workload.num_requests) if count is None else count
    if n < 0:
        raise ConfigError(f"--warmup must be 0 or more requests (got {n})")
    if n == 0:
        return None
    # replies no longer than the run's own, so that a warm-up never needs more context than the run
    return workload.replace(num_requests=n, output_len=Fixed(min(WARMUP_TOKENS, workload.output_len.largest)),
                            request_rate=None,
                            concurrency=workload.concurrency or n, seed=(workload.seed + 1) % 2 ** 32, name="warm-up")


def cmd_bench(args: argparse.Namespace) -> int:
    from engine.bench.report import check_json_target
    workload = workload_from(args)             # a bad flag is refused before anything loads
    warmup = warmup_of(workload, args.warmup)
    if args.json:
        check_json_target(args.json)
    run = _run_url(args, workload, warmup) if args.url else _run_local(args, workload, warmup)
    return _report(args, run, 0 if warmup is None else warmup.num_requests)


def _run_local(args: argparse.Namespace, workload: Workload, warmup: Workload | None):
    from engine.bench.engine_side import engine_facts, measure_limits
    from engine.bench.inprocess import check_workload, run_in_process
    from engine.cli.run import open_engine
    from engine.loop import EngineLoop
    if args.vocab_size is not None:
        raise ConfigError("--vocab-size is for --url runs; in-process prompts follow the model's vocabulary")
    engine = open_engine(args)
    loop = EngineLoop(engine)
    loop.start_thread("strata-bench")
    try:
        if args.preset and args.output_len is None:          # the preset's replies, not the user's
            facts = loop.call(engine_facts).result()
            workload = _fitted(workload, facts.context_tokens, facts.model)
        check_workload(workload, loop.call(engine_facts).result())     # the run's own numbers, before a warm-up
        limits = loop.call(lambda e: measure_limits(e.loaded.device)).result()
        if warmup is not None:
            _warm_up(_with_progress("warm-up", warmup, lambda p: run_in_process(loop, warmup, p, limits)))
        return _with_progress("bench", workload, lambda p: run_in_process(loop, workload, p, limits))
    finally:
        loop.stop()
        loop.join(30)
        engine.close()


def _run_url(args: argparse.Namespace, workload: Workload, warmup: Workload | None):
    from engine.bench.http import Target, run_http, served_model
    from engine.cli.options import engine_options
    given = [f"--{k.replace('_', '-')}" for k, v in engine_options(args, environ={}).items()
             if v != args.bench_parser.get_default(k)]
    if given:
        print(f"note: {', '.join(given)} {'is' if len(given) == 1 else 'are'} not used with --url; the server runs "
              "with its own settings", file=sys.stderr)
    if args.vocab_size is not None and args.vocab_size < 1:
        raise ConfigError(f"--vocab-size must be a whole number >= 1 (got {args.vocab_size})")
    target = Target(args.url, args.api_key or os.environ.get("STRATA_API_KEY") or None, args.model,
                    args.vocab_size)
    served = served_model(target)
    if served.context_tokens:
        if args.preset and args.output_len is None:          # the preset's replies, not the user's
            workload = _fitted(workload, served.context_tokens, served.model)
        if workload.longest > served.context_tokens:         # refused before a request is sent
            raise ConfigError(f"the workload's longest request needs {workload.longest} tokens (prompt up to "
                              f"{workload.prompt_len.largest}, output up to {workload.output_len.largest}) but "
                              f"{served.model} on the server holds {served.context_tokens}; lower --prompt-len or "
                              "--output-len")
    if warmup is not None:
        _warm_up(_with_progress("warm-up", warmup, lambda p: run_http(target, warmup, p)))
    return _with_progress("bench", workload, lambda p: run_http(target, workload, p))


def _fitted(workload: Workload, context_tokens: int, model: str) -> Workload:
    """``workload`` with a preset's replies fitted to the context (engine.bench.inprocess), noted."""
    from engine.bench.workload import fit_preset_output
    workload, note = fit_preset_output(workload, context_tokens, model)
    if note:
        print(f"note: {note}", file=sys.stderr)
    return workload


def _warm_up(run) -> None:
    """A warm-up whose requests failed ends the command before the timed run repeats the failure."""
    if run.summary.failed:
        raise StrataError(f"{run.summary.failed} of {run.summary.requests} warm-up requests failed; the first: "
                          f"{run.summary.first_error}")


def _with_progress(label: str, workload: Workload, run):
    from engine.bench.report import ProgressLine
    progress = ProgressLine(label, workload.num_requests)
    try:
        return run(progress)
    finally:
        progress.clear()


def _used_flags(args: argparse.Namespace, workload: Workload, warmup: int) -> dict:
    """The command's flags with the workload's as the run used them (a flag left out: the preset's or the
    default value; a preset's replies fitted to the context), so that they read as the header does."""
    config = {k: v for k, v in vars(args).items() if k not in ("bench_parser", "api_key", "debug")}
    config.update(requests=workload.num_requests, prompt_len=str(workload.prompt_len),
                  output_len=str(workload.output_len), concurrency=workload.concurrency,
                  request_rate=workload.request_rate, seed=workload.seed, temperature=workload.temperature,
                  stop_at_eos=not workload.ignore_eos, text_prompts=workload.text_prompts, warmup=warmup)
    return config


def _report(args: argparse.Namespace, run, warmup: int) -> int:
    from engine.bench.report import payload, table, write_json
    print("\n".join(table(run)))
    if args.json:
        config = _used_flags(args, run.workload, warmup)
        try:
            path, note = write_json(args.json, payload(run, config))
        except OSError as e:
            raise ConfigError(f"cannot write --json {args.json} ({e.strerror or e}); the table above is all that "
                              "was kept; give a writable path") from None
        print(f"note: {note}" if note else f"wrote {path}", file=sys.stderr if note else sys.stdout)
    s = run.summary
    if s.failed:
        print(f"error: {s.failed} of {s.requests} requests failed; the first: {s.first_error}", file=sys.stderr)
        return 2
    return 0
