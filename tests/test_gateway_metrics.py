"""Gateway metrics for real: nginx + njs writes its usage files, the exporter (a subprocess) follows them.

The gateway is the generated config on the real nginx (tests/test_gateway_nginx.py's harness and fake
replicas) with its daily usage files in a directory of the test's own; the exporter is
components/planning/gateway_exporter.py started the way its container starts it. Requests of several
keys, models and outcomes go through; /metrics must then hold exactly their counts, pass `promtool
check metrics`, and hold no API key. The follower is tested on day changes, cut lines and pruning;
the datagram input (`--syslog`, no longer deployed) on datagrams the real nginx sent to a socket of ours.
"""
from __future__ import annotations

import ast
import http.client
import json
import socket
import subprocess
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from components.planning.gateway import EXPORTER_SOURCE, SYSLOG_TAG, exporter_argv
from components.planning.gateway_exporter import Metrics, ParseError, UsageFollower, failed_attempts, parse_datagram
from components.spec import load_stack_config
from tests.test_gateway_nginx import (
    CHAT, R1, WAIT, FakeReplica, NginxGateway, free_port, gateway_config, host_keys,
)
from tests.support import tool


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def samples(text: str) -> dict[str, float]:
    """`name{labels}` -> value of every sample line of an exposition."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, value = line.rsplit(" ", 1)
            out[series] = float(value)
    return out


class Exporter:
    """The exporter program as a subprocess: the argv its container runs, bound to loopback."""

    def __init__(self, usage_dir: Path):
        self.http_port = free_port()
        argv = exporter_argv(load_stack_config(gateway_config(), set()))
        # The container's argv, with the file where it lies here, the test's usage directory and loopback.
        assert argv[:2] == ["python3", "/opt/llm-cluster/gateway_exporter.py"]
        argv = [sys.executable, str(EXPORTER_SOURCE), *argv[2:]]
        argv[argv.index("--usage-dir") + 1] = str(usage_dir)
        argv[argv.index("--listen") + 1] = f"127.0.0.1:{self.http_port}"
        self.proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + WAIT
        while True:
            if self.proc.poll() is not None:
                pytest.fail(f"the exporter exited: {self.proc.stderr.read() if self.proc.stderr else ''}")
            try:
                self.get("/metrics")
                return
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail("the exporter did not serve /metrics")
                time.sleep(0.05)

    def get(self, path: str) -> tuple[int, str, str]:
        conn = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=WAIT)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            return resp.status, resp.getheader("Content-Type") or "", resp.read().decode()
        finally:
            conn.close()

    def scrape(self, log_lines: int) -> str:
        """/metrics once the exporter has read `log_lines` lines (it polls the files every second)."""
        deadline = time.monotonic() + WAIT
        while True:
            text = self.get("/metrics")[2]
            got = samples(text)["llm_gateway_log_lines_total"]
            if got >= log_lines or time.monotonic() > deadline:
                assert got == log_lines, f"the exporter received {got} log lines, expected {log_lines}"
                return text
            time.sleep(0.02)

    def stop(self) -> int:
        """SIGTERM, as `docker stop` sends it; the exit status."""
        self.proc.terminate()
        return self.proc.wait(WAIT)


@dataclass
class Traffic:
    text: str
    keys: dict[str, str]
    reasoning: list[str]
    requests: int
    stop_status: int


@pytest.fixture(scope="module")
def traffic(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Traffic]:
    """One gateway + exporter, a fixed mix of requests, and the /metrics text that followed."""
    spec = load_stack_config(gateway_config(), set())
    keys, digests = host_keys(spec, tmp_path_factory.mktemp("keys"))
    # nginx's workers run as nobody here: a directory they can reach, outside pytest's private tree.
    usage = Path(tempfile.mkdtemp(prefix="llm-usage-"))
    usage.chmod(0o777)
    exporter = Exporter(usage)
    pools = {"chat": [FakeReplica("c0"), FakeReplica("c1")], "reasoning": [FakeReplica("r0"), FakeReplica("r1")]}
    gw = NginxGateway(spec, pools, tmp_path_factory.mktemp("gateway"), digests, usage_dir=usage)
    try:
        sent = [
            gw.call("POST", "/v1/chat/completions", {"model": CHAT}, keys["default"]),
            gw.call("POST", "/v1/chat/completions", {"model": CHAT}, keys["default"]),
            gw.call("POST", "/v1/completions", {"model": CHAT}, keys["default"]),
            gw.call("POST", "/v1/chat/completions", {"model": "fast"}, keys["default"]),  # alias
            gw.call("POST", "/smart/v1/chat/completions",
                    {"model": R1, "stream": True, "stream_options": {"include_usage": True}}, keys["analyst"]),
            gw.call("POST", "/v1/chat/completions", {"model": CHAT}),  # no key
            gw.call("POST", "/v1/chat/completions", {"model": CHAT}, "sk-not-a-key"),
            gw.call("POST", "/v1/chat/completions", {"model": "gpt-4o\"\\\n"}, keys["default"]),  # unknown
            gw.call("POST", "/v1/chat/completions", {"model": CHAT}, keys["analyst"]),  # not allowed
            *[gw.call("GET", "/v1/models", key=keys["limited"]) for _ in range(3)],  # 200, 200, 429
        ]
        assert [s for s, _, _ in sent] == [200, 200, 200, 200, 200, 401, 401, 404, 403, 200, 200, 429]
        # Both reasoning replicas die: each request tries both (502, 502) until max_fails (2) takes
        # them out; the third finds no live replica.
        for r in pools["reasoning"]:
            r.kill()
        failed = [gw.call("POST", "/v1/chat/completions", {"model": R1}, keys["default"]) for _ in range(3)]
        assert [s for s, _, _ in failed] == [502, 502, 502]
        text = exporter.scrape(log_lines=len(sent) + len(failed))
        log = gw.log(at_least=len(sent) + len(failed))
        # (Two workers buffer their own log lines: compare as a multiset, not in request order.)
        assert sorted(line["upstream"].count(", ") for line in log if line["status"] == 502) == [0, 1, 1]
    finally:
        gw.stop()
        status = exporter.stop()
        shutil.rmtree(usage)
        for rs in pools.values():
            for r in rs:
                r.kill()
    yield Traffic(text, keys, [r.addr for r in pools["reasoning"]], len(sent) + len(failed), status)


def test_requests_are_counted_by_key_id_routed_model_pool_and_status(traffic: Traffic) -> None:
    got = {k: v for k, v in samples(traffic.text).items() if k.startswith("llm_gateway_requests_total")}
    assert got == {
        'llm_gateway_requests_total{key_id="",model="",pool="",status="401"}': 2,
        'llm_gateway_requests_total{key_id="analyst",model="",pool="",status="403"}': 1,
        'llm_gateway_requests_total{key_id="analyst",model="deepseek-r1",pool="reasoning",status="200"}': 1,
        # The unknown model's name is the client's: not a label value.
        'llm_gateway_requests_total{key_id="default",model="",pool="",status="404"}': 1,
        'llm_gateway_requests_total{key_id="default",model="deepseek-r1",pool="reasoning",status="502"}': 3,
        'llm_gateway_requests_total{key_id="default",model="fast",pool="chat",status="200"}': 1,
        'llm_gateway_requests_total{key_id="default",model="qwen3-30b-a3b",pool="chat",status="200"}': 3,
        'llm_gateway_requests_total{key_id="limited",model="",pool="",status="200"}': 2,
        'llm_gateway_requests_total{key_id="limited",model="",pool="",status="429"}': 1,
    }


def test_failed_attempts_are_counted_per_replica_and_no_live_replica_as_none(traffic: Traffic) -> None:
    r0, r1 = traffic.reasoning
    got = {k: v for k, v in samples(traffic.text).items() if k.startswith("llm_gateway_upstream_failures_total")}
    assert got == {
        f'llm_gateway_upstream_failures_total{{pool="reasoning",upstream="{r0}"}}': 2,
        f'llm_gateway_upstream_failures_total{{pool="reasoning",upstream="{r1}"}}': 2,
        'llm_gateway_upstream_failures_total{pool="reasoning",upstream="none"}': 1,
    }


def test_tokens_come_from_the_responses_usage_json_and_stream(traffic: Traffic) -> None:
    got = {k: v for k, v in samples(traffic.text).items() if k.startswith("llm_gateway_tokens_total")}
    assert got == {  # 3 x (11, 7) and 1 x (11, 7) from JSON bodies; (5, 3) from the stream's last chunk
        'llm_gateway_tokens_total{key_id="analyst",model="deepseek-r1",kind="completion"}': 3,
        'llm_gateway_tokens_total{key_id="analyst",model="deepseek-r1",kind="prompt"}': 5,
        'llm_gateway_tokens_total{key_id="default",model="fast",kind="completion"}': 7,
        'llm_gateway_tokens_total{key_id="default",model="fast",kind="prompt"}': 11,
        'llm_gateway_tokens_total{key_id="default",model="qwen3-30b-a3b",kind="completion"}': 21,
        'llm_gateway_tokens_total{key_id="default",model="qwen3-30b-a3b",kind="prompt"}': 33,
    }


def test_durations_are_a_histogram_per_pool_and_every_line_is_counted(traffic: Traffic) -> None:
    got = samples(traffic.text)
    name = "llm_gateway_request_duration_seconds"
    # Refused before routing (401, 403, 404, /v1/models, 429): pool "" (Prometheus drops empty labels).
    assert {pool: got[f'{name}_count{{pool="{pool}"}}'] for pool in ("chat", "reasoning", "")} == {
        "chat": 4, "reasoning": 4, "": 7}
    for pool in ("chat", "reasoning", ""):
        buckets = {k: v for k, v in got.items() if k.startswith(f'{name}_bucket{{pool="{pool}",le=')}
        values = list(buckets.values())
        assert len(values) == 16 and values == sorted(values)
        assert values[-1] == buckets[f'{name}_bucket{{pool="{pool}",le="+Inf"}}'] == got[f'{name}_count{{pool="{pool}"}}']
        # Loopback fake replicas answer in well under 5 s: every request is in the 5 s bucket.
        assert buckets[f'{name}_bucket{{pool="{pool}",le="5.0"}}'] == values[-1]
        assert 0 <= got[f'{name}_sum{{pool="{pool}"}}'] < 5 * values[-1]
    assert got["llm_gateway_log_lines_total"] == traffic.requests
    assert got["llm_gateway_log_parse_errors_total"] == 0
    assert got["llm_gateway_series_overflow_total"] == 0


def test_metrics_hold_no_api_key(traffic: Traffic) -> None:
    for key in [*traffic.keys.values(), "sk-not-a-key"]:
        assert key not in traffic.text
    assert "gpt-4o" not in traffic.text


def test_scraped_text_passes_promtool_check_metrics(traffic: Traffic) -> None:
    promtool = tool("promtool")
    out = subprocess.run([promtool, "check", "metrics"], input=traffic.text, capture_output=True, text=True)
    assert (out.returncode, out.stdout + out.stderr) == (0, "")


def test_exporter_stops_at_once_on_sigterm(traffic: Traffic) -> None:
    # PID 1 in a container has no default SIGTERM action: the exporter must exit on its own (status 0).
    assert traffic.stop_status == 0


def test_exporter_answers_404_off_metrics_and_the_text_content_type(tmp_path: Path) -> None:
    exporter = Exporter(tmp_path)
    try:
        assert exporter.get("/")[0] == 404
        status, content_type, text = exporter.get("/metrics")
        assert (status, content_type) == (200, "text/plain; version=0.0.4; charset=utf-8")
        assert samples(text) == {"llm_gateway_log_lines_total": 0, "llm_gateway_log_parse_errors_total": 0,
                                 "llm_gateway_series_overflow_total": 0}
    finally:
        exporter.stop()


# --- the parser, on what nginx really sends ------------------------------------------------------

@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[bytes], list[dict[str, object]]]]:
    """Datagrams the real nginx sent to a socket of ours (the 200, then the 404), and the same requests'
    lines in its file log."""
    spec = load_stack_config(gateway_config(), set())
    keys, digests = host_keys(spec, tmp_path_factory.mktemp("keys"))
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(WAIT)
    pools = {"chat": [FakeReplica("c")], "reasoning": [FakeReplica("r")]}
    gw = NginxGateway(spec, pools, tmp_path_factory.mktemp("gateway"), digests, syslog_port=sock.getsockname()[1])
    try:
        assert gw.call("POST", "/v1/chat/completions", {"model": CHAT}, keys["default"])[0] == 200
        # A client's odd model name: quotes, backslash, newline and non-ASCII reach the log escaped.
        assert gw.call("POST", "/v1/chat/completions", {"model": 'a"b\\c\nd é 模型'}, keys["default"])[0] == 404
        # nginx's two workers may send the two lines in either order: put them in request order by
        # content (the 200 first), so the tests below never depend on which worker was faster.
        datagrams = sorted((sock.recv(65535) for _ in range(2)), key=lambda d: b'"status":200,' not in d)
        assert [b'"status":200,' in d for d in datagrams] == [True, False], datagrams
        log = gw.log(at_least=2)
    finally:
        gw.stop()
        sock.close()
        for rs in pools.values():
            for r in rs:
                r.kill()
    yield datagrams, log


def test_nginx_datagrams_carry_the_file_logs_json_after_a_syslog_header(
        captured: tuple[list[bytes], list[dict[str, object]]]) -> None:
    datagrams, log = captured
    for datagram in datagrams:
        # RFC 3164 as nginx writes it: <local7.info> timestamp, no hostname, our tag.
        assert datagram.startswith(b"<190>") and f" {SYSLOG_TAG}: {{".encode() in datagram
    parsed = [parse_datagram(d) for d in datagrams]
    by_model = {str(line["model"]): line for line in log}
    assert sorted(str(p["model"]) for p in parsed) == sorted(by_model)
    for line in parsed:
        assert line == by_model[str(line["model"])]


def test_the_exporter_counts_captured_datagrams_and_refuses_mangled_ones(
        captured: tuple[list[bytes], list[dict[str, object]]]) -> None:
    datagrams, _ = captured
    metrics = Metrics()
    for datagram in datagrams:
        metrics.record(datagram)
    metrics.record(datagrams[0][:-10])  # cut short: not JSON
    metrics.record(datagrams[0][datagrams[0].index(b"{"):])  # the JSON without its header
    metrics.record(datagrams[0].replace(b'"status":200', b'"status":"200"'))
    got = samples(metrics.render())
    assert got['llm_gateway_requests_total{key_id="default",model="qwen3-30b-a3b",pool="chat",status="200"}'] == 1
    assert got['llm_gateway_requests_total{key_id="default",model="",pool="",status="404"}'] == 1
    assert (got["llm_gateway_log_lines_total"], got["llm_gateway_log_parse_errors_total"]) == (5, 3)
    for bad in (datagrams[0][:-10], datagrams[0][datagrams[0].index(b"{"):]):
        with pytest.raises(ParseError):
            parse_datagram(bad)


def rewritten(datagram: bytes, **fields: object) -> bytes:
    """A captured datagram with fields of its JSON changed; nginx's header kept as it sent it."""
    header = datagram[:datagram.index(b"{")]
    return header + json.dumps({**parse_datagram(datagram), **fields}, ensure_ascii=False).encode()


def test_label_values_are_escaped_per_the_exposition_format(
        captured: tuple[list[bytes], list[dict[str, object]]]) -> None:
    metrics = Metrics()
    metrics.record(rewritten(captured[0][0], model='x"y\\z\nw 模型'))
    text = metrics.render()
    assert 'llm_gateway_requests_total{key_id="default",model="x\\"y\\\\z\\nw 模型",pool="chat",status="200"} 1' in text
    promtool = tool("promtool")
    out = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert (out.returncode, out.stdout + out.stderr) == (0, "")


def test_label_sets_are_capped_and_the_overflow_counted(captured: tuple[list[bytes], list[dict[str, object]]]) -> None:
    # The first line makes 4 label sets (request, prompt and completion tokens, duration); the next
    # key's lines need 3 new ones each (the duration's is shared), and only 2 are left.
    metrics = Metrics(max_series=6)
    for key_id in ("a", "b", "c"):
        metrics.record(rewritten(captured[0][0], key_id=key_id))
    got = samples(metrics.render())
    assert [k for k in got if k.startswith("llm_gateway_requests_total")] == [
        'llm_gateway_requests_total{key_id="a",model="qwen3-30b-a3b",pool="chat",status="200"}',
        'llm_gateway_requests_total{key_id="b",model="qwen3-30b-a3b",pool="chat",status="200"}']
    assert [k for k in got if k.startswith("llm_gateway_tokens_total")] == [
        'llm_gateway_tokens_total{key_id="a",model="qwen3-30b-a3b",kind="completion"}',
        'llm_gateway_tokens_total{key_id="a",model="qwen3-30b-a3b",kind="prompt"}',
        'llm_gateway_tokens_total{key_id="b",model="qwen3-30b-a3b",kind="prompt"}']
    # b: its completion tokens dropped (1); c: request and both token kinds (3). Known sets keep counting.
    assert got["llm_gateway_series_overflow_total"] == 4
    assert got['llm_gateway_request_duration_seconds_count{pool="chat"}'] == 3


@pytest.mark.parametrize(("upstream", "status", "failed"), [
    ("10.0.0.1:8000", "200", []),
    ("10.0.0.1:8000, 10.0.0.2:8000", "502, 200", ["10.0.0.1:8000"]),
    ("10.0.0.1:8000, 10.0.0.2:8000", "504, 502", ["10.0.0.1:8000", "10.0.0.2:8000"]),
    ("llm_pool_chat", "502", ["none"]),  # no live replica: nginx logs the upstream group's name
    ("[fd00::1]:8000 : 10.0.0.2:8000", "502 : 200", ["[fd00::1]:8000"]),  # across an internal redirect
    # The replica answered 500 (an engine error): a failure the gateway retries elsewhere and counts.
    ("10.0.0.1:8000", "500", ["10.0.0.1:8000"]),
    ("", "", []),
])
def test_failed_attempts_are_the_5xx_entries_of_upstream_status(upstream: str, status: str,
                                                                       failed: list[str]) -> None:
    assert failed_attempts(upstream, status) == failed


# --- the program itself ------------------------------------------------------------------------

def test_exporter_is_one_standard_library_file_for_python_3_8_and_later() -> None:
    source = EXPORTER_SOURCE.read_text()
    tree = ast.parse(source, feature_version=(3, 8))
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}
    assert imported - {"__future__"} <= sys.stdlib_module_names, imported - sys.stdlib_module_names
    # Built-in generics (dict[str, int]) at runtime need 3.9: only typing's, or inside annotations.
    assert "from __future__ import annotations" in source


# --- following the usage files --------------------------------------------------------------------

def usage_line(status: int, key_id: str = "default") -> bytes:
    """One usage log line as nginx writes it (the fields the exporter reads)."""
    return json.dumps({"key_id": key_id, "model": CHAT, "pool": "chat", "upstream": "10.0.0.1:8000",
                       "upstream_status": str(status), "status": status, "request_time": 0.01,
                       "prompt_tokens": 11, "completion_tokens": 7}).encode() + b"\n"


def requests_by_status(metrics: Metrics) -> dict[str, float]:
    return {series.split('status="')[1].rstrip('"}'): value for series, value in samples(metrics.render()).items()
            if series.startswith("llm_gateway_requests_total")}


def test_follower_starts_at_the_end_and_counts_only_whole_lines(tmp_path: Path) -> None:
    today = tmp_path / "usage-2026-12-01.log"
    today.write_bytes(usage_line(200) * 3)  # before the exporter started: not counted again
    metrics = Metrics()
    follower = UsageFollower(str(tmp_path), metrics)
    assert follower.poll() == 0
    line = usage_line(404)
    with today.open("ab") as f:
        f.write(usage_line(200) + line[:20])  # nginx's write of the second line not finished yet
    assert follower.poll() == 1
    with today.open("ab") as f:
        f.write(line[20:])
    assert follower.poll() == 1
    assert requests_by_status(metrics) == {"200": 1, "404": 1}
    assert samples(metrics.render())["llm_gateway_log_parse_errors_total"] == 0


def test_follower_goes_on_to_the_next_day_and_still_reads_lines_written_late_into_yesterday(tmp_path: Path) -> None:
    yesterday, today = tmp_path / "usage-2026-11-30.log", tmp_path / "usage-2026-12-01.log"
    yesterday.write_bytes(b"")
    metrics = Metrics()
    follower = UsageFollower(str(tmp_path), metrics)
    today.write_bytes(usage_line(200))  # a new file: read from its start
    with yesterday.open("ab") as f:
        f.write(usage_line(502))  # a request nginx logged just before midnight, written just after
    assert follower.poll() == 2
    (tmp_path / "usage-2026-12-02.log").write_bytes(usage_line(429))
    with yesterday.open("ab") as f:
        f.write(usage_line(500))  # two days old now: nginx never writes there; not read
    assert follower.poll() == 1
    assert requests_by_status(metrics) == {"200": 1, "502": 1, "429": 1}


def test_follower_reads_a_replaced_or_truncated_file_anew_and_survives_pruning(tmp_path: Path) -> None:
    today = tmp_path / "usage-2026-12-01.log"
    today.write_bytes(usage_line(200) * 2)
    metrics = Metrics()
    follower = UsageFollower(str(tmp_path), metrics)
    today.write_bytes(usage_line(404))  # truncated and rewritten: shorter than what was read
    assert follower.poll() == 1
    today.unlink()
    assert follower.poll() == 0
    today.write_bytes(usage_line(401))  # a new file of the same name (another inode)
    assert follower.poll() == 1
    assert requests_by_status(metrics) == {"404": 1, "401": 1}
