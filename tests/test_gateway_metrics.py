"""Gateway metrics and the usage record for real: gateway_metrics.lua in the deployed nginx + Lua.

The gateway is the generated config on the deployed nginx (the harness and fake replicas of
tests/support/gateway.py, two workers) with its daily usage files in a directory of the test's own and its
/metrics listener on loopback. Requests of several keys, models and outcomes go through (routed,
refused, retried, failed, a stream cut by its client); /metrics must then hold exactly their
counts, pass `promtool check metrics` and hold no API key, and every request must have its usage
line. Then: a reload loses no line and no count, the series cap, the day split and the retention.
"""

from __future__ import annotations

import datetime
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import components.planning.gateway.nginx as gateway_planning
from components.planning.gateway.layout import GatewayLayout
from components.planning.gateway.nginx import (
    BUDGET_SOURCE,
    LOG_FORMAT,
    LUA_SOURCE,
    METRICS_SOURCE,
    METRICS_ZONE,
    NO_USAGE_COUNTS,
    USAGE_LINE_FIELDS,
    _lua_value,
    metrics_settings,
    temp_path_directives,
)
from components.planning.load import load_stack_config
from tests.support import free_port, tool
from tests.support.gateway import (
    CHAT,
    R1,
    WAIT,
    FakeReplica,
    NginxGateway,
    gateway_config,
    host_keys,
    lua_layout,
    lua_reports,
    metric_samples,
    nginx_binary,
)

NGINX_FIELDS = re.findall(r'"(\w+)":', LOG_FORMAT)  # nginx's part of the line, after the request path's
LINE_FIELDS = [*USAGE_LINE_FIELDS, *NGINX_FIELDS]


def get(port: int, path: str) -> tuple[int, str, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.getheader("Content-Type") or "", resp.read().decode()
    finally:
        conn.close()


def scrape(gw: NginxGateway, lines: int) -> str:
    """/metrics once the workers have written `lines` usage lines (they flush once a second). Its
    counts hold those lines' requests: a flush merges its counts before it counts its lines, and
    /metrics reads the lines' total before the counts (gateway_metrics.lua)."""
    deadline = time.monotonic() + WAIT
    while True:
        text = get(gw.metrics_port, "/metrics")[2]
        got = metric_samples(text)["llm_gateway_log_lines_total"]
        if got >= lines or time.monotonic() > deadline:
            assert got == lines, f"the gateway wrote {got} usage lines, expected {lines}"
            return text
        time.sleep(0.05)


def of(text: str, name: str) -> dict[str, float]:
    return {k: v for k, v in metric_samples(text).items() if k.startswith(name + "{")}


def kill_all(pools: dict[str, list[FakeReplica]]) -> None:
    for rs in pools.values():
        for r in rs:
            r.kill()


@dataclass
class Traffic:
    text: str
    keys: dict[str, str]
    reasoning: list[str]
    log: list[dict[str, Any]]
    raw: str
    requests: int


@pytest.fixture(scope="module")
def traffic(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Traffic]:
    """One gateway, a fixed mix of requests, its /metrics and usage lines once both have every request."""
    spec = load_stack_config(gateway_config(), set())
    keys, digests = host_keys(spec, tmp_path_factory.mktemp("keys"))
    pools = {"chat": [FakeReplica("c0"), FakeReplica("c1")], "reasoning": [FakeReplica("r0"), FakeReplica("r1")]}
    gw = NginxGateway(spec, pools, tmp_path_factory.mktemp("gateway"), digests)
    try:
        sent = [
            gw.call("POST", "/v1/chat/completions", {"model": CHAT}, keys["default"]),
            gw.call("POST", "/v1/chat/completions", {"model": CHAT}, keys["default"]),
            gw.call("POST", "/v1/completions", {"model": CHAT}, keys["default"]),
            gw.call("POST", "/v1/chat/completions", {"model": "fast"}, keys["default"]),  # alias
            gw.call(
                "POST",
                "/smart/v1/chat/completions",
                {"model": R1, "stream": True, "stream_options": {"include_usage": True}},
                keys["analyst"],
            ),
            gw.call("POST", "/v1/chat/completions", {"model": CHAT}),  # no key
            gw.call("POST", "/v1/chat/completions", {"model": CHAT}, "sk-not-a-key"),
            # Unknown: its name is the client's, escaped in the line and never a label value.
            gw.call("POST", '/v1/chat/completions?q="\\', {"model": 'gpt-4o"\\\n\t 模型'}, keys["default"]),
            gw.call("POST", "/v1/chat/completions", {"model": CHAT}, keys["analyst"]),  # not allowed
            *[gw.call("GET", "/v1/models", key=keys["limited"]) for _ in range(3)],  # 200, 200, 429
        ]
        assert [s for s, _, _ in sent] == [200, 200, 200, 200, 200, 401, 401, 404, 403, 200, 200, 429]
        # One nginx answers itself, before any Lua ran: a NUL in the path (its 400, as OpenAI JSON).
        with socket.create_connection(("127.0.0.1", gw.port), timeout=WAIT) as raw:
            raw.sendall(b"GET /v1/%00 HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n")
            assert raw.recv(65536).startswith(b"HTTP/1.1 400 ")
        # A stream its client cuts after the first event: a 200, no tokens (they never came).
        conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=WAIT)
        conn.request(
            "POST",
            "/v1/chat/completions?t=cut",
            json.dumps({"model": R1, "stream": True, "stream_options": {"include_usage": True}, "gate": "cut"}),
            {"Authorization": f"Bearer {keys['default']}", "Content-Type": "application/json"},
        )
        resp = conn.getresponse()
        assert b'"t0"' in resp.read1(65536)
        conn.sock.shutdown(socket.SHUT_RDWR)
        conn.close()
        for r in pools["reasoning"]:
            r.gates["cut"].set()
        # Both reasoning replicas die: each request tries both (502, 502: retried, then failed) until
        # max_fails (2) takes them out; the third finds no live replica.
        for r in pools["reasoning"]:
            r.kill()
        failed = [gw.call("POST", "/v1/chat/completions", {"model": R1}, keys["default"]) for _ in range(3)]
        assert [s for s, _, _ in failed] == [502, 502, 502]
        requests = len(sent) + 2 + len(failed)
        text = scrape(gw, requests)
        log = gw.log(at_least=requests)
        raw = "".join(f.read_text() for f in gw.usage_dir.glob("usage-*.log"))
    finally:
        gw.stop()
        kill_all(pools)
    yield Traffic(text, keys, [r.addr for r in pools["reasoning"]], log, raw, requests)


def test_requests_are_counted_by_key_id_routed_model_pool_and_status(traffic: Traffic) -> None:
    assert of(traffic.text, "llm_gateway_requests_total") == {
        'llm_gateway_requests_total{key_id="",model="",pool="",status="400"}': 1,
        'llm_gateway_requests_total{key_id="",model="",pool="",status="401"}': 2,
        'llm_gateway_requests_total{key_id="analyst",model="",pool="",status="403"}': 1,
        'llm_gateway_requests_total{key_id="analyst",model="deepseek-r1",pool="reasoning",status="200"}': 1,
        # The unknown model's name is the client's: not a label value.
        'llm_gateway_requests_total{key_id="default",model="",pool="",status="404"}': 1,
        # The cut stream (200), then the three that failed.
        'llm_gateway_requests_total{key_id="default",model="deepseek-r1",pool="reasoning",status="200"}': 1,
        'llm_gateway_requests_total{key_id="default",model="deepseek-r1",pool="reasoning",status="502"}': 3,
        'llm_gateway_requests_total{key_id="default",model="fast",pool="chat",status="200"}': 1,
        'llm_gateway_requests_total{key_id="default",model="qwen3-30b-a3b",pool="chat",status="200"}': 3,
        'llm_gateway_requests_total{key_id="limited",model="",pool="",status="200"}': 2,
        'llm_gateway_requests_total{key_id="limited",model="",pool="",status="429"}': 1,
    }


def test_failed_attempts_are_counted_per_replica_and_no_live_replica_as_none(traffic: Traffic) -> None:
    r0, r1 = traffic.reasoning
    assert of(traffic.text, "llm_gateway_upstream_failures_total") == {
        f'llm_gateway_upstream_failures_total{{pool="reasoning",upstream="{r0}"}}': 2,
        f'llm_gateway_upstream_failures_total{{pool="reasoning",upstream="{r1}"}}': 2,
        'llm_gateway_upstream_failures_total{pool="reasoning",upstream="none"}': 1,
    }
    # What the usage lines say: the first two tried both replicas, the third found none.
    failed = [line for line in traffic.log if line["status"] == 502]
    assert sorted(line["upstream_status"] for line in failed) == ["502", "502, 502", "502, 502"]


def test_tokens_come_from_the_responses_usage_json_and_stream(traffic: Traffic) -> None:
    assert of(traffic.text, "llm_gateway_tokens_total") == {
        # 3 x (11, 7) and 1 x (11, 7) from JSON bodies; (5, 3) from the stream's last chunk; the cut
        # stream never got its usage chunk.
        'llm_gateway_tokens_total{key_id="analyst",model="deepseek-r1",kind="completion"}': 3,
        'llm_gateway_tokens_total{key_id="analyst",model="deepseek-r1",kind="prompt"}': 5,
        'llm_gateway_tokens_total{key_id="default",model="fast",kind="completion"}': 7,
        'llm_gateway_tokens_total{key_id="default",model="fast",kind="prompt"}': 11,
        'llm_gateway_tokens_total{key_id="default",model="qwen3-30b-a3b",kind="completion"}': 21,
        'llm_gateway_tokens_total{key_id="default",model="qwen3-30b-a3b",kind="prompt"}': 33,
    }


def test_durations_are_a_histogram_per_pool_and_every_line_is_counted(traffic: Traffic) -> None:
    got = metric_samples(traffic.text)
    name = "llm_gateway_request_duration_seconds"
    # Refused before routing (400, 401, 403, 404, /v1/models, 429): pool "" (Prometheus drops empty labels).
    assert {pool: got[f'{name}_count{{pool="{pool}"}}'] for pool in ("chat", "reasoning", "")} == {
        "chat": 4,
        "reasoning": 5,
        "": 8,
    }
    for pool in ("chat", "reasoning", ""):
        buckets = {k: v for k, v in got.items() if k.startswith(f'{name}_bucket{{pool="{pool}",le=')}
        assert list(buckets) == [
            f'{name}_bucket{{pool="{pool}",le="{le}"}}'
            for le in (
                "0.05",
                "0.1",
                "0.25",
                "0.5",
                "1.0",
                "2.5",
                "5.0",
                "10.0",
                "20.0",
                "30.0",
                "60.0",
                "120.0",
                "300.0",
                "600.0",
                "900.0",
                "+Inf",
            )
        ]
        values = list(buckets.values())
        assert values == sorted(values) and values[-1] == got[f'{name}_count{{pool="{pool}"}}']
        # Loopback fake replicas answer in well under 5 s: every request is in the 5 s bucket.
        assert buckets[f'{name}_bucket{{pool="{pool}",le="5.0"}}'] == values[-1]
        assert 0 <= got[f'{name}_sum{{pool="{pool}"}}'] < 5 * values[-1]
        # The sum is of the request times the usage lines hold (record() reads them from nginx's text).
        times = [line["request_time"] for line in traffic.log if line["pool"] == pool]
        assert got[f'{name}_sum{{pool="{pool}"}}'] == pytest.approx(sum(times), abs=1e-9)
    assert got["llm_gateway_log_lines_total"] == traffic.requests
    assert got["llm_gateway_log_write_errors_total"] == 0
    assert got["llm_gateway_series_overflow_total"] == 0


def test_the_request_time_is_read_as_the_very_number_tonumber_gives(tmp_path: Path) -> None:
    # record() reads $request_time ("<seconds>.<3 digits>") by its bytes: every millisecond of the
    # first seconds, and longer requests, against LuaJIT's own reading of the same text.
    code = """local seconds_of = require("gateway_metrics").seconds_of
local checked, wrong = 0, {}
local function check(text)
    local line = '"request_time":' .. text .. ',"upstream_status":""'
    local got, want = seconds_of(line, 16, 16 + #text), tonumber(text)
    checked = checked + 1
    if got ~= want and #wrong < 5 then
        wrong[#wrong + 1] = text .. " " .. string.format("%.17g", got)
    end
end
for s = 0, 12 do
    for ms = 0, 999 do
        check(string.format("%d.%03d", s, ms))
    end
end
for _, s in ipairs({59, 123, 899, 4567, 86400, 1234567}) do
    for _, ms in ipairs({0, 1, 5, 50, 99, 100, 333, 500, 999}) do
        check(string.format("%d.%03d", s, ms))
    end
end
ngx.say(checked, " ", table.concat(wrong, "; "))"""
    assert lua_reports(tmp_path, code, METRICS_SOURCE.parent).split(" ", 1) == ["13054", "\n"]


def test_a_finished_requests_entry_is_reused_with_every_field_the_modules_use_cleared() -> None:
    # record() hands the request's entry to the next request's route_state(): a field it did not
    # clear would reach that request (an error's text, a stream's carry, a not-HTTP mark).
    metrics = METRICS_SOURCE.read_text()
    retire = metrics[metrics.index("local function retire(st)") :]
    retire = retire[: retire.index("\nend\n")]
    cleared = re.findall(r"\bst\.(\w+)", retire)
    assert len(cleared) == len(set(cleared)) and retire.count("nil") == len(cleared)
    used = set()
    for source in (LUA_SOURCE, METRICS_SOURCE, BUDGET_SOURCE):
        text = source.read_text().replace(retire, "")
        used |= set(re.findall(r"\bst\.(\w+)", text))
    assert set(cleared) == used
    assert "        retire(st)  -- read whole: nothing below looks at it\n" in metrics


def test_a_response_without_usage_is_logged_with_the_count_fields_gateway_py_names() -> None:
    # gateway_metrics.lua writes them itself (gateway.py cannot hand it a quoted string).
    assert f"local NO_COUNTS = '{NO_USAGE_COUNTS}'\n" in METRICS_SOURCE.read_text()


def test_every_request_has_its_usage_line_with_todays_fields(traffic: Traffic) -> None:
    assert len(traffic.log) == traffic.requests
    # The request path's fields, then nginx's in the order gateway_metrics.lua reads them (the
    # client's path last): a JSON object's members have none for its readers.
    assert LINE_FIELDS == [
        "request_id",
        "key_id",
        "pool",
        "model",
        "prompt_tokens",
        "completion_tokens",
        "total_tokens",
        "events",
        "time",
        "status",
        "request_time",
        "upstream_status",
        "method",
        "upstream",
        "completed",
        "upstream_time",
        "request_bytes",
        "response_bytes",
        "path",
    ]
    assert all(list(line) == LINE_FIELDS for line in traffic.log)
    cut = next(line for line in traffic.log if line["path"] == "/v1/chat/completions?t=cut")
    assert (cut["status"], cut["completed"], cut["completion_tokens"]) == (200, "", None) and cut["events"] >= 1
    stream = next(line for line in traffic.log if line["key_id"] == "analyst" and line["status"] == 200)
    assert (stream["completed"], stream["prompt_tokens"], stream["completion_tokens"], stream["total_tokens"]) == (
        "OK",
        5,
        3,
        8,
    )


def test_client_text_in_a_usage_line_is_json_escaped(traffic: Traffic) -> None:
    # The client's quote, backslash, newline, tab and non-ASCII come back as sent, from valid JSON.
    odd = next(line for line in traffic.log if line["status"] == 404)
    assert (odd["path"], odd["model"]) == ('/v1/chat/completions?q="\\', 'gpt-4o"\\\n\t 模型')
    assert '"model":"gpt-4o\\"\\\\\\n\\t 模型"' in traffic.raw


def test_metrics_hold_no_api_key(traffic: Traffic) -> None:
    for key in [*traffic.keys.values(), "sk-not-a-key"]:
        assert key not in traffic.text and key not in traffic.raw
    assert "gpt-4o" not in traffic.text


def test_the_metrics_contract_fixture_is_what_nginx_serves(traffic: Traffic) -> None:
    fixture = Path(__file__).parent / "fixtures" / "metrics" / "llm-gateway-contract.txt"
    listed = [line.split() for line in fixture.read_text().splitlines() if line and not line.startswith("#")]
    # The # TYPE lines of the real exposition, not a copy kept beside it (monitoring's rules read the fixture).
    assert listed == [line.split()[2:4] for line in traffic.text.splitlines() if line.startswith("# TYPE ")]


def test_scraped_text_passes_promtool_check_metrics(traffic: Traffic) -> None:
    out = subprocess.run([tool("promtool"), "check", "metrics"], input=traffic.text, capture_output=True, text=True)
    assert (out.returncode, out.stdout + out.stderr) == (0, "")


def own(tmp_path: Path, **gateway: Any) -> tuple[NginxGateway, dict[str, str], dict[str, list[FakeReplica]]]:
    spec = load_stack_config(gateway_config(**gateway), set())
    keys, digests = host_keys(spec, tmp_path / "keys")
    pools = {"chat": [FakeReplica("c")], "reasoning": [FakeReplica("r")]}
    (tmp_path / "gw").mkdir()
    return NginxGateway(spec, pools, tmp_path / "gw", digests), keys, pools


def test_metrics_listener_answers_404_off_metrics_and_the_text_content_type(tmp_path: Path) -> None:
    gw, _, pools = own(tmp_path)
    try:
        assert get(gw.metrics_port, "/") == (404, "text/plain", "llm-cluster gateway: GET /metrics\n")
        status, content_type, text = get(gw.metrics_port, "/metrics")
        assert (status, content_type) == (200, "text/plain; version=0.0.4; charset=utf-8")
        # A fresh gateway: no label set yet (scrapes are neither counted nor logged); the chat pool's
        # replica (prefix affinity) with nothing in flight.
        assert metric_samples(text) == {
            f'llm_gateway_upstream_in_flight{{pool="chat",upstream="{pools["chat"][0].addr}"}}': 0,
            f'llm_gateway_upstream_drained{{pool="chat",upstream="{pools["chat"][0].addr}"}}': 0,
            "llm_gateway_log_lines_total": 0,
            "llm_gateway_log_write_errors_total": 0,
            "llm_gateway_series_overflow_total": 0,
        }
        # The gateway's own port does not serve them (its 404, in OpenAI's shape).
        assert gw.call("GET", "/metrics")[0] == 404
    finally:
        gw.stop()
        kill_all(pools)


def test_a_reload_loses_no_usage_line_and_no_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The timer an hour away: what the workers hold reaches the file and the counts only as they exit.
    monkeypatch.setattr(gateway_planning, "USAGE_FLUSH_SECONDS", 3600)
    gw, keys, pools = own(tmp_path)
    try:
        for _ in range(20):
            assert gw.call("POST", "/v1/chat/completions", {"model": CHAT}, keys["default"])[0] == 200
        # Requests while the reload goes on land on old or new workers; the old ones exit with what
        # they hold (exit_worker_by_lua), the new ones count in the same shared dict. The second
        # reload returns once every worker that served one of the 40 has exited.
        os.kill(gw.proc.pid, signal.SIGHUP)
        for _ in range(20):
            assert gw.call("POST", "/v1/chat/completions", {"model": CHAT}, keys["default"])[0] == 200
        gw.reload()
        text = scrape(gw, 40)
        assert of(text, "llm_gateway_requests_total") == {
            'llm_gateway_requests_total{key_id="default",model="qwen3-30b-a3b",pool="chat",status="200"}': 40
        }
        assert (
            metric_samples(text)['llm_gateway_tokens_total{key_id="default",model="qwen3-30b-a3b",kind="prompt"}']
            == 440
        )
        assert len(gw.log(at_least=40)) == 40
    finally:
        gw.stop()
        kill_all(pools)


def test_label_sets_are_capped_and_the_overflow_counted(tmp_path: Path) -> None:
    # least_conn: the label sets below are requests', tokens' and durations' only (a pool routed by prefix
    # affinity adds its routing outcomes, counted against the same cap; tests/test_gateway_affinity.py).
    gw, keys, pools = own(tmp_path, metricsMaxSeries=6, routing={"policy": "least_conn"})
    try:
        # 4 label sets (requests, prompt and completion tokens, the chat histogram), then 2 (requests
        # of `limited`, the histogram of pool ""): the cap. Each waits for its merge.
        assert gw.call("POST", "/v1/chat/completions", {"model": CHAT}, keys["default"])[0] == 200
        scrape(gw, 1)
        assert gw.call("GET", "/v1/models", key=keys["limited"])[0] == 200
        scrape(gw, 2)
        # The analyst's stream would make 4 more (requests, two token kinds, the reasoning histogram):
        # all dropped and counted; a known label set keeps counting.
        assert (
            gw.call(
                "POST",
                "/smart/v1/chat/completions",
                {"model": R1, "stream": True, "stream_options": {"include_usage": True}},
                keys["analyst"],
            )[0]
            == 200
        )
        assert gw.call("POST", "/v1/chat/completions", {"model": CHAT}, keys["default"])[0] == 200
        got = metric_samples(scrape(gw, 4))
    finally:
        gw.stop()
        kill_all(pools)
    assert {k: v for k, v in got.items() if not k.startswith("llm_gateway_request_duration_seconds_bucket")} == {
        'llm_gateway_requests_total{key_id="default",model="qwen3-30b-a3b",pool="chat",status="200"}': 2,
        'llm_gateway_requests_total{key_id="limited",model="",pool="",status="200"}': 1,
        'llm_gateway_tokens_total{key_id="default",model="qwen3-30b-a3b",kind="completion"}': 14,
        'llm_gateway_tokens_total{key_id="default",model="qwen3-30b-a3b",kind="prompt"}': 22,
        'llm_gateway_request_duration_seconds_sum{pool="chat"}': got[
            'llm_gateway_request_duration_seconds_sum{pool="chat"}'
        ],
        'llm_gateway_request_duration_seconds_count{pool="chat"}': 2,
        'llm_gateway_request_duration_seconds_sum{pool=""}': got['llm_gateway_request_duration_seconds_sum{pool=""}'],
        'llm_gateway_request_duration_seconds_count{pool=""}': 1,
        "llm_gateway_log_lines_total": 4,
        "llm_gateway_log_write_errors_total": 0,
        "llm_gateway_series_overflow_total": 4,
    }


def test_a_full_metrics_zone_drops_new_label_sets_and_never_a_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A zone too small for its label sets (the gateway sizes it from maxSeries; 12k is the least
    lua_shared_dict takes): a label set that does not fit is dropped and counted as overflow, and
    no counter that fit is evicted (an evicting add or incr drops the least recently used ones, and
    the next merge starts them again from zero)."""
    monkeypatch.setattr(gateway_planning, "metrics_zone_kib", lambda spec: 12)
    ids = [f"k{i:02d}" for i in range(40)]
    gw, keys, pools = own(tmp_path, apiKeys=[{"id": i} for i in ids])
    try:
        assert "    lua_shared_dict llm_metrics 12k;\n" in gw.files["nginx.conf"]
        for round_ in (1, 2):
            for i in ids:
                assert gw.call("GET", "/v1/models", key=keys[i])[0] == 200
            got = metric_samples(scrape(gw, 40 * round_))
    finally:
        gw.stop()
        kill_all(pools)
    counted = {k: v for k, v in got.items() if k.startswith("llm_gateway_requests_total{")}
    assert 0 < len(counted) < len(ids), counted
    # Every counter the zone holds has both of its key's requests; each key it could not hold is overflow.
    assert set(counted.values()) == {2}, counted
    assert got["llm_gateway_series_overflow_total"] >= 2 * (len(ids) - len(counted))
    said = (
        (gw.root / "error.log")
        .read_text()
        .count(
            "the metrics zone llm_metrics is full: new label sets are "
            "dropped and counted in llm_gateway_series_overflow_total"
        )
    )
    assert 1 <= said <= 2  # once per worker


def test_usage_files_past_their_retention_or_the_size_cap_are_pruned_oldest_first(tmp_path: Path) -> None:
    usage = Path(tempfile.mkdtemp(prefix="llm-usage-"))
    usage.chmod(0o777)
    today = datetime.date.today()  # nginx's (local) date, as the files are named
    day = {n: (today - datetime.timedelta(days=n)).isoformat() for n in (10, 3, 2, 1, 0)}
    for n, size in ((10, 10), (3, 10), (2, 30), (1, 30), (0, 50)):
        (usage / f"usage-{day[n]}.log").write_bytes(b"x" * size)
    (usage / "notes.txt").write_text("not ours")
    # 2 days: the 10- and 3-day-old files go; a 100-byte cap then takes the oldest until the rest fit.
    spec = load_stack_config(gateway_config(usageLog={"retentionDays": 2, "maxTotalGib": 100 / 2**30}), set())
    keys, digests = host_keys(spec, tmp_path / "keys")
    pools = {"chat": [FakeReplica("c")], "reasoning": [FakeReplica("r")]}
    (tmp_path / "gw").mkdir()
    gw = NginxGateway(spec, pools, tmp_path / "gw", digests, usage_dir=usage)
    try:
        deadline = time.monotonic() + WAIT
        while len(os.listdir(usage)) > 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sorted(os.listdir(usage)) == ["notes.txt", f"usage-{day[1]}.log", f"usage-{day[0]}.log"]
        # Today's file is never deleted, even alone over the cap (the prune runs hourly; not again here).
        error_log = (tmp_path / "gw" / "error.log").read_text()
        for n in (10, 3, 2):
            assert f"llm-cluster gateway: deleted usage log usage-{day[n]}.log" in error_log
    finally:
        gw.stop()
        kill_all(pools)
        shutil.rmtree(usage)


# nginx's part of a usage line, as a request of the record harness carries it (X-Line).
HARNESS_LINE = {
    "time": "",
    "method": "POST",
    "path": "/v1/completions",
    "upstream": "127.0.0.1:1",
    "status": 200,
    "upstream_status": "200",
    "completed": "OK",
    "request_time": 0.01,
    "upstream_time": "0.01",
    "request_bytes": 10,
    "response_bytes": 20,
}


class RecordHarness:
    """gateway_metrics.lua in nginx with the line nginx composes replaced by one each request carries
    (the clock cannot be moved): record() for every request of one server, serve() on another."""

    def __init__(self, root: Path, usage: Path) -> None:
        spec = load_stack_config(gateway_config(), set())
        layout = GatewayLayout(port=free_port(), usage_dir=str(usage))
        settings = metrics_settings(spec, layout)
        lua = lua_layout()
        self.port, self.metrics_port, self.root = layout.port, free_port(), root
        (root / "llm").mkdir()
        shutil.copy(METRICS_SOURCE, root / "llm" / "gateway_metrics.lua")
        (root / "nginx.conf").write_text(
            "\n".join(
                [
                    *(f"load_module {m};" for m in lua["load_modules"]),
                    "worker_processes 1;",
                    f"pid {root}/nginx.pid;",
                    f"error_log {root}/error.log notice;",
                    "events {}",
                    "http {",
                    *(f"    {line}" for line in temp_path_directives(root)),
                    f'    lua_package_path "{root}/llm/?.lua;{lua["lua_path"]};;";',
                    '    init_by_lua_block { require("gateway_metrics") }',
                    f"    lua_shared_dict {METRICS_ZONE} 1m;",
                    f'    init_worker_by_lua_block {{ require("gateway_metrics").start({_lua_value(settings)}) }}',
                    '    exit_worker_by_lua_block { require("gateway_metrics").stop() }',
                    "    map $http_x_line $llm_usage_line { default $http_x_line; }",
                    '    map "" $llm_key_id { default default; }',
                    "    access_log off;",
                    f"    server {{ listen 127.0.0.1:{self.port}; log_by_lua_block {{ require('gateway_metrics').record() }}",
                    "        location / { return 204; } }",
                    f"    server {{ listen 127.0.0.1:{self.metrics_port}; log_by_lua_block {{ return }}",
                    "        location = /metrics { content_by_lua_block { require('gateway_metrics').serve() } } }",
                    "}",
                    "",
                ]
            )
        )
        self.proc = subprocess.Popen(
            [nginx_binary(), "-p", str(root), "-c", str(root / "nginx.conf"), "-g", "daemon off;"],
            stderr=subprocess.PIPE,
        )

    def send(self, time_iso: str) -> None:
        """One request whose usage line is HARNESS_LINE at this time."""
        line = {**HARNESS_LINE, "time": time_iso}
        # In LOG_FORMAT's order (record() reads it by position), without its braces.
        tail = json.dumps({name: line[name] for name in NGINX_FIELDS}, separators=(",", ":"))[1:-1]
        deadline = time.monotonic() + WAIT
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=WAIT)
                conn.request("GET", "/", headers={"X-Line": tail})
                assert conn.getresponse().status == 204
                conn.close()
                return
            except ConnectionRefusedError:
                assert time.monotonic() < deadline and self.proc.poll() is None, "nginx did not listen"
                time.sleep(0.05)

    def metrics(self) -> dict[str, float]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=WAIT) as r:
            return metric_samples(r.read().decode())

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGQUIT)  # graceful: the worker writes what it holds as it exits
        self.proc.wait(WAIT)


def test_each_line_goes_to_the_file_of_its_own_day(tmp_path: Path) -> None:
    """Lines of two days written in one flush land in their own files."""
    usage = Path(tempfile.mkdtemp(prefix="llm-usage-"))
    usage.chmod(0o777)
    harness = RecordHarness(tmp_path, usage)
    times = [
        "2026-11-30T23:59:59+00:00",
        "2026-11-30T23:59:59+00:00",
        "2026-12-01T00:00:00+00:00",
        "2026-11-30T23:59:59+00:00",
    ]  # the last: a long request logged after midnight, of the day before
    try:
        for t in times:
            harness.send(t)
    finally:
        harness.stop()
    files = {f.name: [json.loads(x)["time"] for x in f.read_text().splitlines()] for f in usage.glob("usage-*.log")}
    shutil.rmtree(usage)
    assert files == {"usage-2026-11-30.log": [times[0], times[1], times[3]], "usage-2026-12-01.log": [times[2]]}


def test_lines_a_worker_cannot_write_are_counted_lost_and_the_error_log_says_why(tmp_path: Path) -> None:
    usage = tmp_path / "usage"
    usage.mkdir()
    usage.chmod(0o555)  # nobody may write here but root, and nginx's workers are never root
    harness = RecordHarness(tmp_path, usage)
    try:
        for _ in range(3):
            harness.send("2026-12-01T12:00:00+00:00")
        deadline = time.monotonic() + WAIT
        while (got := harness.metrics())["llm_gateway_log_write_errors_total"] < 3:
            assert time.monotonic() < deadline, got
            time.sleep(0.2)
    finally:
        harness.stop()
    assert (got["llm_gateway_log_write_errors_total"], got["llm_gateway_log_lines_total"]) == (3, 0)
    assert f"cannot open {usage}/usage-2026-12-01.log: Permission denied" in (tmp_path / "error.log").read_text()
    assert list(usage.iterdir()) == []


def test_a_worker_writes_its_lines_once_it_holds_max_pending_without_waiting_for_its_timer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The timer an hour away: lines can only reach the file through the bound on what a worker holds.
    monkeypatch.setattr(gateway_planning, "USAGE_FLUSH_SECONDS", 3600)
    monkeypatch.setattr(gateway_planning, "USAGE_MAX_PENDING", 5)
    gw, keys, pools = own(tmp_path)
    # One keep-alive connection: one of the two workers serves every request and holds every line.
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=WAIT)

    def chat() -> int:
        conn.request(
            "POST",
            "/v1/chat/completions",
            body=json.dumps({"model": CHAT}),
            headers={"Authorization": f"Bearer {keys['default']}", "Content-Type": "application/json"},
        )
        response = conn.getresponse()
        response.read()
        return response.status

    try:
        assert [chat() for _ in range(5)] == [200] * 5
        assert len(gw.log(at_least=5)) == 5
        # Their counts go out with them (the lines' total moves after the counts it stands for).
        assert of(scrape(gw, 5), "llm_gateway_requests_total") == {
            'llm_gateway_requests_total{key_id="default",model="qwen3-30b-a3b",pool="chat",status="200"}': 5
        }
        assert [chat() for _ in range(4)] == [200] * 4
        # Held, not lost: the tenth line makes five again, and the five go out together.
        assert len(gw.log()) == 5
        assert chat() == 200
        assert len(gw.log(at_least=10)) == 10
    finally:
        conn.close()
        gw.stop()
        kill_all(pools)
