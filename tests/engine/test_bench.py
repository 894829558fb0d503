"""``bench``: the fixed-seed workload, the in-process runner, the report and its JSON file, and the HTTP
runner against a real server (refusals from a plain HTTP server, token counts against Strata's own)."""
from __future__ import annotations

import http.server
import json
import socket
import threading
from pathlib import Path

import pytest

from engine.bench.metrics import RequestRecord, percentile, summarise
from engine.bench.report import write_json
from engine.bench.workload import ID_HIGH, ID_LOW, PRESETS, Fixed, Normal, Uniform, Workload, parse_length
from engine.config import EngineConfig
from engine.errors import ConfigError
from engine.loop import EngineLoop
from main import main

DEMO = Path(__file__).resolve().parents[2] / "resources" / "models" / "demo"
TINY_RUN = ["--requests", "3", "--prompt-len", "6:9", "--output-len", "4", "--concurrency", "2", "--warmup", "0"]


# ---- the workload ---------------------------------------------------------------------------------
def test_the_same_seed_draws_the_same_requests_and_another_seed_others():
    w = Workload(num_requests=20, prompt_len=Uniform(5, 40), output_len=Normal(30, 8), seed=7)
    assert w.requests(4096) == w.requests(4096)
    assert w.replace(seed=8).requests(4096) != w.requests(4096)
    lengths = [(r.prompt_len, r.output_len) for r in w.requests(4096)]
    assert lengths == [(r.prompt_len, r.output_len) for r in w.replace(text_prompts=True).requests(4096)]
    assert len({p for p, _ in lengths}) > 5                  # the uniform range is used, not one value


def test_prompt_ids_stay_in_the_plain_range_and_avoid_special_ids():
    avoid = frozenset(range(ID_LOW, ID_LOW + 40))           # most of a tiny vocabulary is special
    reqs = Workload(num_requests=30, prompt_len=Fixed(50)).requests(60, avoid)
    ids = {t for r in reqs for t in r.prompt}
    assert ids and ids <= set(range(ID_LOW + 40, 60))
    assert all(len(r.prompt) == r.prompt_len == 50 for r in reqs)
    big = Workload(num_requests=5, prompt_len=Fixed(200)).requests(151936)
    assert max(t for r in big for t in r.prompt) < ID_HIGH   # the same ids as a server run that assumes 32000
    assert big == Workload(num_requests=5, prompt_len=Fixed(200)).requests(ID_HIGH)
    assert Workload(num_requests=2).requests(ID_LOW + 1, frozenset({0, 1, 99999}))     # one plain id is enough
    with pytest.raises(ConfigError, match="leaves no plain token ids .* use --text-prompts"):
        Workload(num_requests=2).requests(ID_LOW + 1, frozenset({ID_LOW}))


def test_text_prompts_are_words_of_the_drawn_length():
    reqs = Workload(num_requests=3, prompt_len=Fixed(12), text_prompts=True).requests()
    assert all(isinstance(r.prompt, str) and len(r.prompt.split()) == 12 for r in reqs)


def test_normal_lengths_are_clipped_to_three_sd_and_at_least_one():
    reqs = Workload(num_requests=400, prompt_len=Normal(4, 3), output_len=Normal(100, 5)).requests()
    assert min(r.prompt_len for r in reqs) == 1 and max(r.prompt_len for r in reqs) <= 13
    outs = [r.output_len for r in reqs]
    assert 85 <= min(outs) and max(outs) <= 115 and 98 < sum(outs) / len(outs) < 102


def test_a_request_rate_gives_poisson_arrivals_from_the_seed():
    w = Workload(num_requests=2000, prompt_len=Fixed(1), request_rate=50.0, concurrency=None)
    t = [r.arrival_s for r in w.requests()]
    assert t[0] == 0 and all(b >= a for a, b in zip(t, t[1:]))
    assert 0.018 < t[-1] / (len(t) - 1) < 0.022              # mean gap 1/rate
    assert t == [r.arrival_s for r in w.requests()]
    assert all(r.arrival_s == 0 for r in Workload(num_requests=5).requests())   # closed loop: all at once


@pytest.mark.parametrize("text, want", [("128", Fixed(128)), ("96:160", Uniform(96, 160)), ("128~16", Normal(128, 16)),
                                        (" 7 ", Fixed(7)), ("5:5", Uniform(5, 5))])
def test_lengths_parse_from_their_command_line_form(text, want):
    assert parse_length(text) == want and str(want) == text.strip()


@pytest.mark.parametrize("text, says", [("abc", "is not a length"), ("160:96", "ends below its start"),
                                        ("0", ">= 1"), ("12.5", "is not a length"), ("-3", "is not a length")])
def test_bad_lengths_are_refused_with_the_fix(text, says):
    with pytest.raises(ConfigError, match=says) as e:
        parse_length(text, "--prompt-len")
    assert str(e.value).startswith("--prompt-len ")          # named by the flag that gave it


def test_presets_hold_the_articles_workloads():
    batch, four = PRESETS["offload-batch"], PRESETS["four-streams"]
    assert (batch.num_requests, batch.prompt_len, batch.output_len, batch.concurrency) == (64, Normal(128, 16), Fixed(256), 16)
    assert (four.num_requests, four.prompt_len, four.output_len, four.concurrency) == (4, Normal(40, 4), Fixed(800), 4)
    for w in (batch, four):
        assert w.ignore_eos and w.temperature == 0 and w.request_rate is None


def _args(*argv):
    from engine.cli.main import build_parser, parse
    parser, sub = build_parser()
    return parse(parser, sub, ["bench", *argv])


def test_flags_override_the_preset_and_keep_the_rest():
    from engine.cli.bench import workload_from
    w = workload_from(_args("--preset", "offload-batch", "--requests", "8", "--output-len", "32:64"))
    assert (w.num_requests, w.output_len, w.prompt_len, w.concurrency) == (8, Uniform(32, 64), Normal(128, 16), 16)
    rate = workload_from(_args("--preset", "four-streams", "--request-rate", "2"))
    assert rate.request_rate == 2 and rate.concurrency is None         # a rate alone: no cap
    assert workload_from(_args("--preset", "four-streams")) == PRESETS["four-streams"]


@pytest.mark.parametrize("argv, says", [(["--requests", "0"], "--requests must be"),
                                        (["--request-rate", "-1"], "--request-rate must be"),
                                        (["--temperature", "-0.5"], "--temperature must be"),
                                        (["--seed", "-1"], "--seed must be")])
def test_bad_workload_flags_are_one_line_before_any_model_loads(argv, says, capsys):
    assert main(["bench", "--model", "/nonexistent/model", *argv]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1 and "Traceback" not in err


# ---- figures ----------------------------------------------------------------------------------------
def test_percentiles_interpolate_between_ranks():
    assert percentile([4, 1, 3, 2], 50) == 2.5
    assert percentile([4, 1, 3, 2], 0) == 1 and percentile([4, 1, 3, 2], 100) == 4
    assert percentile([1, 2, 3, 4], 99) == pytest.approx(3.97)
    assert percentile([5.0], 99) == 5.0 and percentile([], 50) is None
    with pytest.raises(ValueError):
        percentile([1], 101)


def test_a_delta_of_several_tokens_shares_its_gap_and_speeds_span_first_to_last():
    r = RequestRecord(0, sent_at=1.0, prompt_tokens=5, output_tokens=4, arrivals=[(1.5, 1), (1.7, 1), (2.1, 2)],
                      finished_at=2.1)
    assert r.ttft_s == pytest.approx(0.5)
    assert r.inter_token_s() == pytest.approx([0.2, 0.2, 0.2])
    assert r.stream_tok_s() == pytest.approx(3 / 0.6)
    failed = RequestRecord(1, sent_at=1.0, error="boom", finished_at=1.1)
    s = summarise([r, failed], wall_s=2.0)
    assert (s.requests, s.failed, s.output_tokens, s.prompt_tokens, s.first_error) == (2, 1, 4, 5, "boom")
    assert s.output_tok_s == 2.0 and s.ttft_p50_ms == pytest.approx(500) and s.stream_tok_s == pytest.approx(5)


# ---- in-process -------------------------------------------------------------------------------------
class RecordingLoop(EngineLoop):
    """The engine loop, noting the sampling parameters of every job submitted to it."""

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.sent: list = []

    def submit(self, job):
        self.sent.append(job.params)
        return super().submit(job)


@pytest.fixture(scope="module")
def demo_loop():
    from engine.engine import LLMEngine
    engine = LLMEngine(EngineConfig(model=str(DEMO), device="cpu"))
    loop = RecordingLoop(engine, idle_wait_s=0.01)
    loop.start_thread()
    yield loop
    loop.stop()
    loop.join(10)
    engine.close()


def _generated(loop) -> int:
    return loop.call(lambda e: e.counters.generated_tokens).result(10)


def test_an_in_process_run_counts_every_token_the_engine_made(demo_loop):
    from engine.bench.inprocess import run_in_process
    w = Workload(num_requests=5, prompt_len=Uniform(3, 9), output_len=Uniform(2, 6), concurrency=2, seed=3)
    before = _generated(demo_loop)
    run = run_in_process(demo_loop, w)
    wanted = [r.output_len for r in w.requests(4096)]
    assert [r.output_tokens for r in run.records] == wanted
    assert [sum(n for _, n in r.arrivals) for r in run.records] == wanted
    assert [r.prompt_tokens for r in run.records] == [r.prompt_len for r in w.requests(4096)]
    assert run.summary.output_tokens == sum(wanted) == _generated(demo_loop) - before
    assert all(r.finish_reason == "length" and r.ttft_s > 0 for r in run.records)
    e = run.engine
    assert e.steps >= max(wanted) and e.step_p50_ms > 0 and e.expert_hit_rate == 1.0
    assert e.hbm_fraction is None and e.roofline_note == "no roofline on the CPU"
    assert demo_loop.call(lambda eng: eng.has_unfinished()).result(10) is False


def test_eos_is_ignored_unless_asked_for(demo_loop):
    from engine.bench.inprocess import run_in_process
    w = Workload(num_requests=2, prompt_len=Fixed(4), output_len=Fixed(5), concurrency=2)
    demo_loop.sent.clear()
    run_in_process(demo_loop, w)
    run_in_process(demo_loop, w.replace(ignore_eos=False, temperature=0.5))
    assert [(p.ignore_eos, p.temperature, p.max_tokens) for p in demo_loop.sent] == \
        [(True, 0.0, 5)] * 2 + [(False, 0.5, 5)] * 2


def test_given_limits_give_the_roofline_fractions(demo_loop):
    from engine.bench.engine_side import Limits, engine_facts
    from engine.bench.inprocess import run_in_process
    from engine.bench.report import table
    facts = demo_loop.call(engine_facts).result(10)
    run = run_in_process(demo_loop, Workload(num_requests=2, prompt_len=Fixed(4), output_len=Fixed(6), concurrency=2),
                         limits=Limits(hbm_gb_s=1000.0, bus_gb_s=50.0))
    e, s = run.engine, run.summary
    assert facts.hbm_bytes_per_token > 0 and e.hbm_bytes_per_token == facts.hbm_bytes_per_token
    # the least time one token's weights take at HBM speed, over the measured time per token of a stream
    assert e.hbm_fraction == pytest.approx(facts.hbm_bytes_per_token / 1e12 * s.stream_tok_s)
    assert e.bus_fraction == 0.0 and e.h2d_bytes == 0           # every expert resident: nothing crossed the bus
    assert any(line.startswith("roofline           HBM ") and "at 1000 GB/s" in line for line in table(run))


def test_text_prompts_need_a_tokenizer():
    from engine.bench.engine_side import EngineFacts
    from engine.bench.inprocess import check_workload
    facts = EngineFacts("in-memory", "cpu", 1000, frozenset(), False, 512, 16, 1)
    check_workload(Workload(num_requests=1), facts)
    with pytest.raises(ConfigError, match="has no tokenizer, so it cannot take --text-prompts"):
        check_workload(Workload(num_requests=1, text_prompts=True), facts)


def test_the_progress_line_is_drawn_on_a_terminal_only():
    import io
    from engine.bench.report import ProgressLine

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True
    tty, pipe = Terminal(), io.StringIO()
    for stream in (tty, pipe):
        line = ProgressLine("bench", 3, stream)
        line.tokens(5)
        line.done(RequestRecord(0, 0.0))
        line.clear()
    assert "\rbench [########................] 1/3 requests, 5 tokens" in tty.getvalue()
    assert tty.getvalue().endswith("\r\033[K") and pipe.getvalue() == ""


def test_a_workload_longer_than_the_context_is_refused_before_it_runs(demo_loop):
    # the demo allows no longer context than it runs with: the fix offers only what can work
    from engine.bench.inprocess import run_in_process
    with pytest.raises(ConfigError, match="needs 600 tokens .* context holds 512; lower --prompt-len or "
                                          "--output-len$"):
        run_in_process(demo_loop, Workload(num_requests=1, prompt_len=Fixed(100), output_len=Fixed(500)))


def test_a_refusal_quotes_the_run_asked_for_not_its_warm_up(capsys):
    # the warm-up's replies are short (8 tokens), but a run whose prompts do not fit is refused with its
    # own numbers, and a warm-up never asks for longer replies than the run
    from engine.cli.bench import warmup_of
    assert main(["bench", "--model", str(DEMO), "--device", "cpu", "--prompt-len", "600", "--output-len", "5"]) == 2
    assert "needs 605 tokens (prompt up to 600, output up to 5)" in capsys.readouterr().err
    run = Workload(num_requests=4, prompt_len=Fixed(100), output_len=Fixed(3), concurrency=2)
    assert warmup_of(run, None).output_len == Fixed(3)
    # a warm-up at the concurrency, but never more requests than the run itself sends
    assert warmup_of(run, None).num_requests == 2
    assert warmup_of(run.replace(num_requests=1), None).num_requests == 1


def test_a_preset_whose_replies_pass_the_context_gets_shorter_replies_with_a_note(capsys):
    # The README's four-streams (prompts up to 52 tokens, replies of 800) on the demo's 512-token
    # context: replies of 460, said once; replies the user chose are never changed (refused instead).
    from engine.bench.workload import fit_preset_output
    fitted, note = fit_preset_output(PRESETS["four-streams"], 512, "demo")
    assert fitted.output_len == Fixed(460) and fitted.prompt_len == PRESETS["four-streams"].prompt_len
    assert note == ("four-streams: replies of 460 tokens instead of 800, to fit the 512-token context of demo; "
                    "give --output-len to choose")
    assert fit_preset_output(PRESETS["offload-batch"], 512, "demo") == (PRESETS["offload-batch"], None)  # 432 fits
    assert main(["bench", "--model", str(DEMO), "--device", "cpu", "--preset", "four-streams", "--requests", "1",
                 "--warmup", "0"]) == 0
    out, err = capsys.readouterr()
    assert "note: four-streams: replies of 460 tokens instead of 800" in err and "output tok/s" in out
    assert main(["bench", "--model", str(DEMO), "--device", "cpu", "--preset", "four-streams", "--output-len", "800",
                 "--requests", "1", "--warmup", "0"]) == 2
    assert "context holds 512; lower --prompt-len or --output-len" in capsys.readouterr().err


def test_the_cli_writes_config_commit_versions_and_results(tmp_path, capsys):
    out = tmp_path / "run.json"
    assert main(["bench", "--model", str(DEMO), "--device", "cpu", *TINY_RUN, "--json", str(out)]) == 0
    shown = capsys.readouterr().out
    for line in ("output tok/s", "TTFT ms", "inter-token ms", "step ms", "expert hit rate", "roofline"):
        assert line in shown
    assert f"wrote {out}" in shown
    data = json.loads(out.read_text())
    assert data["workload"]["num_requests"] == 3 and data["workload"]["prompt_len"] == "6:9"
    assert data["config"]["device"] == "cpu" and data["engine_config"]["max_batch"] == 16
    env = data["environment"]
    assert env["gpu"] is None and env["versions"]["python"] and env["versions"]["torch"] and "commit" in env
    res = data["results"]
    assert res["output_tokens"] == 12 and res["requests"] == 3 and res["failed"] == 0
    assert res["engine"]["step_p50_ms"] > 0 and res["engine"]["roofline_note"] == "no roofline on the CPU"
    assert [r["output_tokens"] for r in data["requests"]] == [4, 4, 4]


def test_the_cli_never_replaces_a_json_file_unless_the_name_ends_in_a_bang(tmp_path, capsys):
    mine = tmp_path / "mine.json"
    mine.write_text("my notes")
    assert main(["bench", "--model", str(DEMO), *TINY_RUN, "--json", str(mine)]) == 2
    err = capsys.readouterr().err
    assert err == f"error: --json {mine} exists and is kept; give another name, or {mine}! to replace it\n"
    assert mine.read_text() == "my notes"
    assert main(["bench", "--model", str(DEMO), "--device", "cpu", *TINY_RUN, "--json", f"{mine}!"]) == 0
    assert json.loads(mine.read_text())["results"]["output_tokens"] == 12


def test_a_json_file_that_appears_during_a_run_is_kept_and_the_results_go_beside_it(tmp_path):
    path = tmp_path / "r.json"
    path.write_text("theirs")
    written, note = write_json(str(path), {"a": 1})
    assert path.read_text() == "theirs" and written == tmp_path / "r-2.json"
    assert json.loads(written.read_text()) == {"a": 1} and "is kept" in note
    assert write_json(str(tmp_path / "new.json"), {"b": 2}) == (tmp_path / "new.json", None)


@pytest.mark.parametrize("argv, says", [(["--json", "/nonexistent-dir/x.json"], "does not exist; create it"),
                                        (["--vocab-size", "100"], "--vocab-size is for --url runs")])
def test_cli_mistakes_are_one_line(argv, says, capsys):
    assert main(["bench", "--model", str(DEMO), "--device", "cpu", *TINY_RUN, *argv]) == 2
    err = capsys.readouterr().err
    assert says in err and err.startswith("error: ") and "Traceback" not in err


# ---- --url ------------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_url_nobody_listens_on_is_named_with_the_fix(capsys):
    url = f"http://127.0.0.1:{_free_port()}"
    assert main(["bench", "--url", url, *TINY_RUN]) == 2
    err = capsys.readouterr().err
    assert err == f"error: cannot reach {url} (connection refused); start the server (e.g. main.py serve) or fix --url\n"


def test_a_url_that_is_not_an_address_is_refused(capsys):
    assert main(["bench", "--url", "localhost:8000", *TINY_RUN]) == 2
    assert "is not an HTTP address; write http://HOST:PORT" in capsys.readouterr().err


class _Refusing(http.server.BaseHTTPRequestHandler):
    """A server that is not (or not yet) an OpenAI one to this client: 401 with a key check, else 404."""

    def do_GET(self):
        status = 401 if self.server.wants_key and self.headers.get("Authorization") != "Bearer right" else 404
        body = json.dumps({"error": {"message": "invalid API key", "type": "auth", "param": None, "code": None}}
                          if status == 401 else {"detail": "Not Found"}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def refusing_server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Refusing)
    srv.wants_key = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def test_a_wrong_key_and_a_wrong_address_name_their_fix(refusing_server, capsys):
    url = f"http://127.0.0.1:{refusing_server.server_address[1]}"
    assert main(["bench", "--url", url, "--api-key", "wrong", *TINY_RUN]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: {url}/v1/models answered 401 (invalid API key); give the server's API key with "
                   "--api-key KEY\n")
    assert main(["bench", "--url", url + "/v1/", "--api-key", "right", *TINY_RUN]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {url}/v1/models answered 404: no OpenAI-compatible API there; --url takes")


def test_engine_flags_given_with_a_url_are_noted_as_unused(refusing_server, capsys):
    url = f"http://127.0.0.1:{refusing_server.server_address[1]}"
    main(["bench", "--url", url, "--max-batch", "4", "--device", "cpu", *TINY_RUN])
    assert "note: --device, --max-batch are not used with --url" in capsys.readouterr().err


@pytest.fixture(scope="module")
def strata_server(demo_loop):
    from engine.server import BackgroundServer, ServerSettings
    server = BackgroundServer(demo_loop, ServerSettings(port=0))       # any free port; the URL names it
    url = server.start()
    yield url
    server.stop()


def test_a_strata_server_gives_its_vocabulary_and_context_so_the_requests_fit_them(strata_server, capsys):
    # GET /v1/models lists the model's vocab_size and max_model_len: token-id prompts stay below the one,
    # and the README's preset gets replies that fit the other, as in process
    assert main(["bench", "--url", strata_server, "--requests", "2", "--output-len", "2", "--warmup", "1"]) == 0
    assert "output tok/s" in capsys.readouterr().out
    assert main(["bench", "--url", strata_server, "--preset", "four-streams", "--requests", "1", "--warmup", "0"]) == 0
    out, err = capsys.readouterr()
    assert "note: four-streams: replies of 460 tokens instead of 800" in err and "output tok/s" in out


def test_a_workload_longer_than_the_servers_context_is_refused_before_any_request(strata_server, capsys):
    assert main(["bench", "--url", strata_server, "--requests", "2", "--prompt-len", "600", "--output-len", "8"]) == 2
    err = capsys.readouterr().err
    assert "the workload's longest request needs 608 tokens" in err and "lower --prompt-len or --output-len" in err
    assert "warm-up" not in err


def test_prompt_ids_a_server_refuses_end_the_run_at_the_warm_up_with_the_fix(strata_server, capsys):
    # a --vocab-size larger than the model's: the server refuses the ids, and the run ends with the fix
    assert main(["bench", "--url", strata_server, "--vocab-size", "32000", "--requests", "2", "--output-len", "2",
                 "--warmup", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: 1 of 1 warm-up requests failed; the first: ")
    assert "answered 400" in err and "give --vocab-size with the model's vocabulary, or send --text-prompts" in err


@pytest.mark.parametrize("extra", [[], ["--text-prompts"]])
def test_bench_through_the_server_counts_what_the_engine_counts(strata_server, demo_loop, tmp_path, extra):
    from engine.bench.inprocess import run_in_process
    from engine.cli.bench import workload_from
    argv = ["--requests", "4", "--prompt-len", "5:12", "--output-len", "3:7", "--concurrency", "3", "--seed", "5",
            "--warmup", "0", *extra]
    local = run_in_process(demo_loop, workload_from(_args(*argv)))
    out = tmp_path / "http.json"
    assert main(["bench", "--url", strata_server, "--vocab-size", "4096", *argv, "--json", str(out)]) == 0
    remote = json.loads(out.read_text())
    assert remote["model"] == "demo" and remote["results"]["failed"] == 0
    assert [r["output_tokens"] for r in remote["requests"]] == [r.output_tokens for r in local.records]
    assert [r["prompt_tokens"] for r in remote["requests"]] == [r.prompt_tokens for r in local.records]
    assert remote["results"]["output_tokens"] == local.summary.output_tokens > 0
    assert all(r["ttft_ms"] > 0 for r in remote["requests"])


def test_through_a_strata_server_each_chunk_counts_the_tokens_it_carries(strata_server):
    # A Strata server is asked for each chunk's token ids (return_token_ids): a chunk counts the tokens it
    # carries, also those whose text waits for whole UTF-8, so the pieces add up to each reply's tokens and
    # the per-stream speed and inter-token gaps are figures of tokens, not of pieces of text.
    from engine.bench.http import Target, run_http
    from engine.cli.bench import workload_from
    run = run_http(Target(strata_server, vocab_size=4096),
                   workload_from(_args("--requests", "2", "--output-len", "6", "--warmup", "0")))
    assert run.summary.failed == 0
    for r in run.records:
        assert sum(n for _, n in r.arrivals) == r.output_tokens == 6
    assert run.summary.stream_tok_s is not None and run.summary.itl_p50_ms is not None
