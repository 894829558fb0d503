"""``generate`` and ``chat``: text in, streamed text out."""
from __future__ import annotations

import argparse
import json
import sys

from engine.cli.options import engine_options, model_dir
from engine.config import EngineConfig
from engine.sampling import SamplingParams


def add_sampling_flags(p: argparse.ArgumentParser, temperature: float) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument("--max-tokens", type=int, default=128, help="tokens to generate at most")
    g.add_argument("--temperature", type=float, default=temperature, help="0 = greedy")
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--min-p", type=float, default=0.0)
    g.add_argument("--repetition-penalty", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")


def sampling_params(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                          top_k=args.top_k, min_p=args.min_p, repetition_penalty=args.repetition_penalty,
                          seed=args.seed, stop=tuple(args.stop))


def open_engine(args: argparse.Namespace):
    from engine.engine import LLMEngine
    engine = LLMEngine(EngineConfig(model=model_dir(args), **engine_options(args)))
    info = engine.model_info
    if info.random_weights:
        print(f"note: {info.name} is a demo model with RANDOM weights — its output is gibberish; "
              "pass --model DIR to run a real model", file=sys.stderr)
    return engine


def stream(engine, prompt, params: SamplingParams, echo: bool = True) -> dict:
    """Run one request, writing text as it arrives; returns a summary. Ctrl-C aborts the request."""
    rid = engine.add_request(None, prompt, params)
    summary = {"text": "", "token_ids": [], "finish_reason": None, "ttft_ms": None}
    try:
        while engine.has_unfinished():
            for d in engine.step():
                summary["text"] += d.new_text
                summary["token_ids"] += d.new_token_ids
                summary["ttft_ms"] = summary["ttft_ms"] if d.ttft_ms is None else d.ttft_ms
                if echo and d.new_text:
                    sys.stdout.write(d.new_text)
                    sys.stdout.flush()
                if d.finished:
                    summary["finish_reason"] = d.finish_reason
                    summary["prompt_tokens"], summary["completion_tokens"] = d.prompt_tokens, d.completion_tokens
    except KeyboardInterrupt:
        engine.abort(rid)
        while engine.has_unfinished():
            engine.step()
        summary["finish_reason"] = "abort"
    return summary


def cmd_generate(args: argparse.Namespace) -> int:
    engine = open_engine(args)
    try:
        summary = stream(engine, args.prompt, sampling_params(args), echo=not args.json)
        stats = engine.stats()
    finally:
        engine.close()
    if args.json:
        summary["decode_tok_s"] = round(stats.decode_tok_s, 2)
        summary["model"] = engine.model_info.name
        print(json.dumps(summary, ensure_ascii=False))
    else:
        print()
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    engine = open_engine(args)
    tok = engine.tokenizer
    use_template = tok.has_chat_template and not engine.model_info.completion_only
    params = sampling_params(args)
    messages: list[dict] = [{"role": "system", "content": args.system}] if args.system else []
    transcript = ""
    mode = "chat" if use_template else "completion (a base model: your text is continued as written)"
    print(f"Strata chat — {engine.model_info.name}, {mode}. /reset clears, /exit quits, Ctrl-C stops a reply.")
    try:
        while True:
            try:
                line = input("\n> ")
            except EOFError:
                return 0
            if line.strip() in ("/exit", "/quit"):
                return 0
            if line.strip() == "/reset":
                messages, transcript = messages[:1] if args.system else [], ""
                print("(conversation cleared)")
                continue
            if use_template:
                messages.append({"role": "user", "content": line})
                prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            else:
                transcript += ("\n" if transcript else "") + line
                prompt = transcript
            reply = stream(engine, prompt, params)
            print()
            if reply["finish_reason"] == "abort":
                print("(stopped)")
            if use_template:
                messages.append({"role": "assistant", "content": reply["text"]})
            else:
                transcript += reply["text"]
    finally:
        engine.close()
