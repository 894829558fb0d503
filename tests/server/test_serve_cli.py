"""``main.py serve`` as a user runs it: it serves, stops cleanly on SIGTERM, and refuses a bind it must not
make before loading anything."""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest

from engine.cli.serve import server_settings
from engine.errors import ConfigError
from main import main

ROOT = Path(__file__).resolve().parents[2]
SERVING = re.compile(r"Serving demo at (http://127\.0\.0\.1:\d+)/v1 \(OpenAI-compatible; Ctrl-C stops\)")


def _serve(*flags: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("STRATA_API_KEY", None)
    return subprocess.Popen([sys.executable, str(ROOT / "main.py"), "serve", "--device", "cpu", *flags], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_serve_answers_health_and_requests_and_stops_cleanly_on_sigterm():
    proc = _serve("--port", "0", "--stats-every", "0")
    try:
        line = proc.stdout.readline()
        found = SERVING.fullmatch(line.strip())
        assert found, line + proc.stderr.read() if proc.poll() is not None else line
        url = found.group(1)
        assert httpx.get(url + "/health", timeout=30).json() == {"status": "ok"}
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)
        assert client.completions.create(model="demo", prompt="Hi", max_tokens=3).usage.completion_tokens >= 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    err = proc.stderr.read()
    assert "POST /v1/completions 200" in err and "[Summary] requests=1" in err and "Traceback" not in err


def test_a_stop_with_a_stream_in_flight_says_so_and_a_second_signal_ends_it():
    # SIGTERM while a stream runs: a line says what is in flight and how to end it at once; a second
    # SIGTERM ends the stream (finish reason "abort") and the server exits cleanly.
    import threading
    import time
    proc = _serve("--port", "0", "--stats-every", "0")
    err_lines: list[str] = []
    try:
        found = SERVING.fullmatch(proc.stdout.readline().strip())
        assert found
        reader = threading.Thread(target=lambda: err_lines.extend(iter(proc.stderr.readline, "")), daemon=True)
        reader.start()
        client = openai.OpenAI(base_url=found.group(1) + "/v1", api_key="none", max_retries=0, timeout=60)
        stream = client.completions.create(model="demo", prompt="Once", max_tokens=400, stream=True,
                                           extra_body={"ignore_eos": True})
        reasons = []
        next(iter(stream))                               # the stream is running
        proc.send_signal(signal.SIGTERM)
        for _ in range(600):                             # the line comes before the grace begins
            if any(line.startswith("stopping: 1 request in flight") for line in err_lines):
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        for chunk in stream:
            reasons += [c.finish_reason for c in chunk.choices if c.finish_reason]
        assert proc.wait(60) == 0
        reader.join(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    err = "".join(err_lines)
    assert "stopping: 1 request in flight gets up to 5 s to finish (Ctrl-C again ends them now)" in err
    assert reasons in (["abort"], ["length"]) and "[Summary] requests=1" in err and "Traceback" not in err


def test_an_open_bind_without_a_key_is_refused_in_one_line_before_the_model_loads():
    proc = _serve("--host", "0.0.0.0", "--port", "0", "--model", str(ROOT / "no-such-model"))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and out == ""
    assert err == ("error: refusing to serve on 0.0.0.0 without an API key; give --api-key KEY (or STRATA_API_KEY), "
                   "or --no-api-key to serve it open\n")


def test_a_taken_port_is_one_line_naming_it_and_the_flag(capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "--port", str(port), "--model", str(ROOT / "no-such-model")]) == 2
    err = capsys.readouterr().err
    assert err == f"error: port {port} on 127.0.0.1 is in use by another program; stop it or pick another port with --port N\n"


def test_the_key_comes_from_the_flag_or_the_environment_and_cannot_be_both_given_and_refused():
    from engine.cli.main import build_parser
    parser, _ = build_parser()
    parse = lambda *argv: parser.parse_args(["serve", *argv])     # noqa: E731
    assert server_settings(parse(), environ={"STRATA_API_KEY": "env-key"}).api_key == "env-key"
    assert server_settings(parse("--api-key", "flag-key"), environ={"STRATA_API_KEY": "env-key"}).api_key == "flag-key"
    assert server_settings(parse(), environ={}).api_key is None
    with pytest.raises(ConfigError, match="contradict"):
        server_settings(parse("--no-api-key", "--api-key", "k"), environ={})
    s = server_settings(parse("--host", "0.0.0.0", "--no-api-key", "--max-queued", "3", "--served-model-name", "m"),
                        environ={})
    assert (s.host, s.allow_no_key, s.max_queued, s.served_model_name, s.port) == ("0.0.0.0", True, 3, "m", 8000)
