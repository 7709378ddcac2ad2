"""Load test: evalscope perf's argv, its JSON results parsed, and `make loadtest` run for real (evalscope
1.14.1 in its own venv, cached under /var/cache/llm-cluster/loadtest) against a loopback OpenAI server."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from ops.loadtest import PROMPT, main, parse_results, perf_argv
from tests.support import LOADTEST_VENV, tool
from tests.support.fake_openai import Behaviour, FakeOpenAI, serving

ROOT = Path(__file__).resolve().parent.parent
RECORDED = Path(__file__).parent / "fixtures" / "ops" / "evalscope-1.14.1"


def test_the_runbooks_command_with_a_key_and_streaming() -> None:
    assert perf_argv("evalscope", "http://192.168.10.11:80", "qwen3-30b-a3b", "sk-1", 64, 512, 256, Path("/o")) == [
        "evalscope",
        "perf",
        "--url",
        "http://192.168.10.11:80/v1/chat/completions",
        "--api",
        "openai",
        "--model",
        "qwen3-30b-a3b",
        "--parallel",
        "64",
        "--number",
        "512",
        "--prompt",
        PROMPT,
        "--max-tokens",
        "256",
        "--stream",
        "--outputs-dir",
        "/o",
        "--no-timestamp",
        "--api-key",
        "sk-1",
    ]


def test_evalscopes_own_result_files_are_read(tmp_path: Path) -> None:
    run = tmp_path / "qwen3-30b-a3b" / "parallel_4_number_16"
    run.mkdir(parents=True)
    for f in RECORDED.iterdir():
        (run / f.name).write_text(f.read_text())
    assert parse_results(tmp_path) == {
        "requests": 16,
        "succeeded": 16,
        "failed": 0,
        "duration_s": 0.3542,
        "request_throughput": 45.1719,
        "output_tokens_per_s": 361.3753,
        "total_tokens_per_s": 903.4381,
        "ttft_ms": {"p50": 45.2014, "p99": 47.3568},
        "tpot_ms": {"p50": 5.874, "p99": 10.3292},
        "latency_s": {"p50": 0.0863, "p99": 0.0915},
    }
    with pytest.raises(ValueError, match="wrote no benchmark_summary.json"):
        parse_results(tmp_path / "nothing")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model", "gpt-4"], "MODEL 'gpt-4' is not served by prod; served: /data/models/DeepSeek-R1-GPTQ-Int4"),
        (["--evalscope", "/nonexistent/evalscope"], "evalscope not found at /nonexistent/evalscope"),
        (["--parallel", "0"], "--parallel, --number and --max-tokens must be at least 1"),
    ],
)
def test_bad_input_exits_2_saying_why(argv: list[str], message: str, capsys: Any) -> None:
    assert main(["--stack", "prod", "--key", "k", "--evalscope", "/bin/true", *argv]) == 2
    assert message in capsys.readouterr().err


def test_no_key_exits_2(capsys: Any, monkeypatch: Any) -> None:
    monkeypatch.delenv("LLM_CLUSTER_API_KEY", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")  # no pulumi CLI either
    assert main(["--stack", "prod", "--evalscope", "/bin/true"]) == 2
    assert "no API key" in capsys.readouterr().err


def make_loadtest(url: str, out: Path, extra: str = "", **make: str) -> subprocess.CompletedProcess[str]:
    args = f"--url {url} --key sk-load --max-tokens 8 --out {out} {extra}".strip()
    settings = {"STACK": "prod", "PARALLEL": "4", "NUMBER": "16", "LOADTEST_VENV": LOADTEST_VENV, **make}
    cmd = [tool("make"), "-s", "loadtest", f"LOADTEST_ARGS={args}", *(f"{k}={v}" for k, v in settings.items())]
    # Bounded: evalscope starts in a few seconds; installing it when the cache is missing takes minutes.
    return subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, timeout=1500, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )


def test_make_loadtest_reports_each_model_against_a_real_server(tmp_path: Path) -> None:
    models = {
        "deepseek-r1": Behaviour(reply="a b c d e f g h", token_delay_s=0.01),
        "qwen3-30b-a3b": Behaviour(reply="one two three four five six seven eight", token_delay_s=0.005),
    }
    with serving(FakeOpenAI(keys={"sk-load"}, models=models)) as state:
        done = make_loadtest(state.url, tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads((tmp_path / "prod" / "report.json").read_text())
    assert report["parallel"] == 4 and report["number"] == 16 and report["url"] == state.url
    assert list(report["models"]) == ["deepseek-r1", "qwen3-30b-a3b"]
    for r in report["models"].values():
        assert (r["requests"], r["succeeded"], r["failed"]) == (16, 16, 0)
        assert r["ttft_ms"]["p50"] > 0 and r["ttft_ms"]["p99"] >= r["ttft_ms"]["p50"]
        assert r["tpot_ms"]["p99"] >= r["tpot_ms"]["p50"] > 0 and r["output_tokens_per_s"] > 0
    lines = done.stdout.splitlines()
    assert lines[0] == f"load test prod: {state.url}, 4 in parallel, 16 requests per model (evalscope perf)"
    assert lines[2].startswith("deepseek-r1 ") and "16/16" in lines[2]
    assert (tmp_path / "prod" / "report.txt").read_text() == done.stdout
    # Every request carried the key and streamed.
    assert {r["authorization"] for r in state.requests} == {"Bearer sk-load"}
    assert all(r["body"]["stream"] for r in state.requests)


def test_failed_requests_fail_the_target(tmp_path: Path) -> None:
    # evalscope retries its first (connection) request until it answers; then every 4th request fails.
    models = {"qwen3-30b-a3b": Behaviour(fail_every=4, fail_status=502)}
    with serving(FakeOpenAI(keys={"sk-load"}, models=models)) as state:
        done = make_loadtest(state.url, tmp_path, MODEL="qwen3-30b-a3b")
    assert done.returncode != 0 and "Error 1" in done.stderr  # make's words for the planner's exit 1
    r = json.loads((tmp_path / "prod" / "report.json").read_text())["models"]["qwen3-30b-a3b"]
    assert r["failed"] == 4 and r["succeeded"] == 12


def test_an_https_gateway_is_verified_against_the_ca_given(tmp_path: Path) -> None:
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        [
            tool("openssl"),
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    state = FakeOpenAI(keys={"sk-load"}, models={"qwen3-30b-a3b": Behaviour()})
    with serving(state, tls=(str(cert), str(key))):
        url = state.url.replace("http:", "https:")
        done = make_loadtest(url, tmp_path, f"--ca-cert {cert}", MODEL="qwen3-30b-a3b", NUMBER="4")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    r = json.loads((tmp_path / "prod" / "report.json").read_text())["models"]["qwen3-30b-a3b"]
    assert (r["succeeded"], r["failed"]) == (4, 0)
