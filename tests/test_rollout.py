"""`make rollout`: the sequencing, through Pulumi's real Automation API driving a recorded stand-in for the CLI.

The stand-in (tests/fixtures/pulumi-standin/pulumi) answers what the Automation API asks in the formats it
parses; the gateway is a loopback HTTP server that records each request and how many `up`s had run by then.
"""

from __future__ import annotations

import http.server
import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from components.spec import StackSpec
from ops import rollout
from plan.harness import ProgramRun

ROOT = Path(__file__).resolve().parent.parent
STANDIN = ROOT / "tests" / "fixtures" / "pulumi-standin"
CHAT = ["chat-gpu-03", "chat-gpu-04", "chat-gpu-05", "chat-gpu-06"]
CHAT_ADDRS = ["192.168.10.13:8000", "192.168.10.14:8000", "192.168.10.15:8000", "192.168.10.16:8000"]


class Gateway(http.server.BaseHTTPRequestHandler):
    """Answers /v1/chat/completions with the next scripted status; records (ups so far, model, auth). Its
    /admin/drain (the metrics listener's, here on the same port) records (ups so far, method, replica) and
    answers GET with the next scripted in-flight count for every replica (0 once none is left)."""

    statuses: list[int] = []
    seen: list[tuple[int, str, str]] = []
    drains: list[tuple[int, str, str | None]] = []
    in_flight: list[int] = []
    drain_status = 200
    log: Path

    def _ups(self) -> int:
        return sum(json.loads(line)["argv"][0] == "up" for line in type(self).log.read_text().splitlines())

    def _admin(self) -> None:
        query = dict(pair.split("=", 1) for pair in self.path.partition("?")[2].split("&"))
        type(self).drains.append((self._ups(), self.command, query.get("replica")))
        status = type(self).drain_status
        count = type(self).in_flight.pop(0) if type(self).in_flight and self.command == "GET" else 0
        body = json.dumps({query["pool"]: {a: {"in_flight": count, "drained": True} for a in CHAT_ADDRS}})
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body.encode() if status == 200 else b'{"error": "no pool here"}')

    do_GET = do_DELETE = _admin  # noqa: N815 (http.server's names)

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        if self.path.startswith("/admin/drain"):
            return self._admin()
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append((self._ups(), body["model"], self.headers.get("Authorization", "")))
        status = type(self).statuses.pop(0) if type(self).statuses else 200
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        if status == 429:
            self.send_header("Retry-After", "0.2")
        self.end_headers()
        self.wfile.write(
            b'{"choices": [{"message": {"content": "OK"}}]}' if status == 200 else b'{"error": "no upstream"}'
        )

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """The stand-in CLI first on PATH, a gateway on loopback, and the scenario they replay."""
    log, scenario = tmp_path / "pulumi-calls.jsonl", tmp_path / "scenario.json"
    log.write_text("")
    server = http.server.HTTPServer(("127.0.0.1", 0), Gateway)
    Gateway.statuses, Gateway.seen, Gateway.log = [], [], log
    Gateway.drains, Gateway.in_flight, Gateway.drain_status = [], [], 200
    # The drain endpoint on loopback (the stack's metrics listener is on the cluster network).
    monkeypatch.setattr(rollout, "metrics_address", lambda spec: f"127.0.0.1:{server.server_port}")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("PATH", f"{STANDIN}:{__import__('os').environ['PATH']}")
    monkeypatch.setenv("PULUMI_STANDIN_LOG", str(log))
    monkeypatch.setenv("PULUMI_STANDIN_SCENARIO", str(scenario))
    state: dict[str, Any] = {"log": log, "scenario": scenario, "url": f"http://127.0.0.1:{server.server_port}"}

    def play(ups: list[dict[str, Any]] | None = None) -> None:
        scenario.write_text(
            json.dumps(
                {
                    "ups": ups or [],
                    "secretOutputs": ["gatewayApiKeys"],
                    "outputs": {"gatewayUrl": state["url"], "gatewayApiKeys": json.dumps({"default": "sk-test-1"})},
                }
            )
        )

    state["play"] = play
    yield state
    server.shutdown()


def calls(log: Path) -> list[list[str]]:
    return [json.loads(line)["argv"] for line in log.read_text().splitlines()]


def up_targets(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == "--target"]


def expected_targets(run: ProgramRun, instance: str) -> list[str]:
    return rollout.instance_targets(run, instance)


def test_each_instance_is_up_targeted_then_checked_through_the_gateway_before_the_next(
    cli: dict[str, Any], prod_preview_run: ProgramRun, capsys: pytest.CaptureFixture[str]
) -> None:
    cli["play"]()
    assert rollout.main(["--stack", "prod", "--pool", "chat", "--settle-seconds", "0"]) == 0
    argvs = calls(cli["log"])
    assert argvs[0] == ["version"]
    assert argvs[1] == ["stack", "select", "--stack", "prod"]
    assert all(json.loads(line)["nonInteractive"] for line in cli["log"].read_text().splitlines()[1:])
    ups = [a for a in argvs if a[0] == "up"]
    assert [up_targets(a) for a in ups] == [expected_targets(prod_preview_run, i) for i in CHAT]
    first = ups[0]
    assert first[:3] == ["up", "--yes", "--skip-preview"]
    assert "--target-dependents" in first
    assert first[first.index("--policy-pack") + 1] == str(ROOT / "policies")
    assert first[first.index("--stack") + 1] == "prod"
    # Three checks through the gateway after each up and before the next, with the stack's key.
    assert Gateway.seen == [(n, "qwen3-30b-a3b", "Bearer sk-test-1") for n in (1, 2, 3, 4) for _ in range(3)]
    out = capsys.readouterr().out
    assert not out.startswith("warning")
    assert "[1/4] chat-gpu-03: pulumi up --target-dependents with 3 targets" in out
    assert "chat-gpu-06: healthy; the gateway serves qwen3-30b-a3b" in out
    assert "rollout done: 4 instance(s)" in out
    # Each instance drained at the gateway before its up (its in flight read until 0), undrained after it.
    assert Gateway.drains == [
        step
        for n, addr in enumerate(CHAT_ADDRS)
        for step in ((n, "POST", addr), (n, "GET", None), (n + 1, "DELETE", addr))
    ]
    assert "    chat-gpu-03: back in rotation at the gateway" in out


def test_the_drain_of_a_prefix_affinity_pool_names_each_replica_as_the_gateway_does(prod_spec: StackSpec) -> None:
    drain = rollout.pool_drain(prod_spec, "chat")
    assert drain == rollout.Drain(
        "http://192.168.10.11:9145/admin/drain", "chat", dict(zip(CHAT, CHAT_ADDRS, strict=True)), 600
    )
    assert drain.undrain_command("chat-gpu-04") == (
        "curl -X DELETE 'http://192.168.10.11:9145/admin/drain?pool=chat&replica=192.168.10.14:8000'"
    )
    # One instance: nginx's own least_conn upstream, nothing to drain it from.
    assert rollout.pool_drain(prod_spec, "reasoning") is None


def test_the_rollout_waits_for_the_drained_replicas_requests_to_finish(
    cli: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    cli["play"]()
    Gateway.in_flight = [2, 1, 1, 0]
    assert rollout.main(["--stack", "prod", "--pool", "chat", "--settle-seconds", "0"]) == 0
    first = [d for d in Gateway.drains if d[0] == 0]
    assert first == [(0, "POST", CHAT_ADDRS[0])] + [(0, "GET", None)] * 4
    assert re.search(
        r"^    chat-gpu-03: drained at the gateway, nothing in flight after \d+\.\d s$", capsys.readouterr().out, re.M
    )


def test_a_gateway_that_cannot_drain_stops_the_rollout_before_any_up(
    cli: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    cli["play"]()
    Gateway.drain_status = 404
    assert rollout.main(["--stack", "prod", "--pool", "chat", "--settle-seconds", "0"]) == 1
    assert not [a for a in calls(cli["log"]) if a[0] == "up"]
    out = capsys.readouterr().out
    url = cli["url"] + "/admin/drain"
    assert (
        f"rollout stopped at chat-gpu-03: the gateway could not drain it (POST {url}?pool=chat&replica="
        f'{CHAT_ADDRS[0]} answered 404: {{"error": "no pool here"}}); nothing replaced\n' in out
    )
    assert "  chat-gpu-03: not replaced (still the previous version)" in out


def test_an_instance_targets_its_container_its_image_on_that_node_and_its_gate(prod_preview_run: ProgramRun) -> None:
    names = [u.rsplit("::", 1)[1] for u in rollout.instance_targets(prod_preview_run, "chat-gpu-04")]
    assert names == ["gpu-04-image-" + names[0].split("gpu-04-image-")[1], "chat-gpu-04-vllm", "chat-gpu-04-health"]
    urns = rollout.instance_targets(prod_preview_run, "reasoning-gpu-01")
    ray = [u.rsplit("::", 1)[1] for u in urns]
    assert {
        "reasoning-gpu-01-health",
        "reasoning-gpu-01-ray-gate",
        "reasoning-gpu-01-ray-head",
        "reasoning-gpu-01-ray-worker-gpu-02",
    } <= set(ray)
    assert sorted(n.split("-image-")[0] for n in ray if "-image-" in n) == ["gpu-01", "gpu-02"]
    # Everything else is the instance's own: children of its ModelServer and RayCluster.
    parents = {r.urn: r.parent.rsplit("::", 1)[1] for r in prod_preview_run.registrations}
    assert {parents[u] for u in urns if "-image-" not in u} == {"reasoning-gpu-01", "reasoning-gpu-01-ray"}


def test_the_first_failed_up_stops_the_rollout_and_names_each_instance_state(
    cli: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    cli["play"](
        [
            {"exit": 0},
            {
                "exit": 255,
                "stderr": "error: update failed: chat-gpu-04-health: "
                "http://192.168.10.14:8000/health not healthy after 1800s\n",
            },
        ]
    )
    assert rollout.main(["--stack", "prod", "--pool", "chat", "--settle-seconds", "0"]) == 1
    assert sum(a[0] == "up" for a in calls(cli["log"])) == 2  # no third up
    assert [n for n, _, _ in Gateway.seen] == [1, 1, 1]  # checked after the first only
    out = capsys.readouterr().out
    assert "rollout stopped at chat-gpu-04: pulumi up failed" in out
    assert "  chat-gpu-03: rolled out, healthy and serving through the gateway" in out
    assert "  chat-gpu-04: replaced by a failed up: its containers or health gate did not come up" in out
    assert "  chat-gpu-05: not touched (still the previous version, serving)" in out
    assert "  chat-gpu-06: not touched (still the previous version, serving)" in out
    url = cli["url"] + "/admin/drain"
    assert (
        "  left drained at the gateway (no new request reaches them): chat-gpu-04; once they serve, undrain:\n"
        f"    curl -X DELETE '{url}?pool=chat&replica={CHAT_ADDRS[1]}'\n" in out
    )
    assert Gateway.drains[-1] == (1, "GET", None)  # chat-gpu-04 never undrained


def test_a_pool_that_does_not_serve_through_the_gateway_stops_the_rollout(
    cli: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    cli["play"]()
    Gateway.statuses = [200] + [502] * 100
    assert (
        rollout.main(["--stack", "prod", "--pool", "chat", "--settle-seconds", "0", "--gateway-wait-seconds", "2"]) == 1
    )
    assert sum(a[0] == "up" for a in calls(cli["log"])) == 1
    assert len(Gateway.seen) >= 3  # retried, one second apart, until the 2 s were spent
    out = capsys.readouterr().out
    assert "    the gateway answered 502; retrying for up to 2 s\n" in out
    assert re.search(
        r"^rollout stopped at chat-gpu-03: healthy, but the gateway check failed: request \d+ for model "
        f"'qwen3-30b-a3b' through {re.escape(cli['url'])} answered 502: "
        r'\{"error": "no upstream"\}; retried for \d+ s \(at most 2 s\)$',
        out,
        re.M,
    ), out
    assert (
        "  chat-gpu-03: replaced and healthy (its gates passed), but the pool does not serve through the "
        "gateway; check: docker logs llm-gateway on gpu-01 (the usage line names the upstream); docker logs "
        "vllm-chat-gpu-03 on gpu-03; docker logs vllm-chat-gpu-04 on gpu-04; docker logs vllm-chat-gpu-05 on "
        "gpu-05; docker logs vllm-chat-gpu-06 on gpu-06\n" in out
    )
    assert "  chat-gpu-04: not touched" in out


def test_a_pool_the_gateway_still_shuns_is_waited_out_until_it_serves(
    cli: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    # nginx answers 502 while it keeps the pool's replicas out (failTimeoutSeconds); then it serves.
    cli["play"]()
    Gateway.statuses = [502, 502, 200, 502]
    assert (
        rollout.main(["--stack", "prod", "--pool", "chat", "--settle-seconds", "0", "--gateway-wait-seconds", "60"])
        == 0
    )
    # Three answers of 200 in a row count: the 502 after the first 200 starts the count again.
    assert [n for n, _, _ in Gateway.seen[:7]] == [1] * 7
    assert Gateway.seen[7][0] == 2
    out = capsys.readouterr().out
    assert out.count("the gateway answered 502; retrying for up to 60 s") == 1
    assert "chat-gpu-03: healthy; the gateway serves qwen3-30b-a3b" in out
    assert "rollout done: 4 instance(s)" in out


def test_an_answer_waiting_cannot_change_stops_the_rollout_at_once(
    cli: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    cli["play"]()
    Gateway.statuses = [404]
    assert (
        rollout.main(["--stack", "prod", "--pool", "chat", "--settle-seconds", "0", "--gateway-wait-seconds", "600"])
        == 1
    )
    assert len(Gateway.seen) == 1
    assert (
        "the gateway check failed: request 1 for model 'qwen3-30b-a3b' through "
        f'{cli["url"]} answered 404: {{"error": "no upstream"}}\n' in capsys.readouterr().out
    )


def test_a_rate_limited_check_waits_as_the_gateway_says(
    cli: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    cli["play"]()
    Gateway.statuses = [200, 429, 200, 200]
    assert (
        rollout.main(["--stack", "prod", "--pool", "chat", "--settle-seconds", "0", "--gateway-wait-seconds", "60"])
        == 0
    )
    # A 429 is the key's limit, not the pool: the two 200s around it still count as in a row.
    assert [n for n, _, _ in Gateway.seen[:5]] == [1, 1, 1, 1, 2]
    assert "retrying" not in capsys.readouterr().out


def test_max_unavailable_replaces_that_many_instances_per_step(
    cli: dict[str, Any], prod_preview_run: ProgramRun
) -> None:
    cli["play"]()
    assert rollout.main(["--stack", "prod", "--pool", "chat", "--max-unavailable", "2", "--settle-seconds", "0"]) == 0
    ups = [up_targets(a) for a in calls(cli["log"]) if a[0] == "up"]
    pairs = [CHAT[:2], CHAT[2:]]
    assert ups == [[u for i in pair for u in expected_targets(prod_preview_run, i)] for pair in pairs]


def test_the_pool_default_comes_from_max_unavailable_in_the_stack(
    prod_spec: StackSpec, prod_preview_run: ProgramRun
) -> None:
    assert prod_spec.pools["chat"].max_unavailable == 1
    steps = rollout.rollout_steps(prod_preview_run, prod_spec, "chat", 3)
    assert [s.instances for s in steps] == [tuple(CHAT[:3]), tuple(CHAT[3:])]


def test_an_unknown_pool_exits_2_naming_the_pools(capsys: pytest.CaptureFixture[str]) -> None:
    assert rollout.main(["--stack", "prod", "--pool", "nope"]) == 2
    assert "--pool 'nope': the stack's pools are reasoning, chat" in capsys.readouterr().err


def test_a_single_instance_pool_is_rolled_with_a_warning(
    cli: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    cli["play"]()
    assert rollout.main(["--stack", "prod", "--pool", "reasoning", "--settle-seconds", "0"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("warning: a step replaces all 1 instance(s) of the pool: it serves nothing until")
    assert [n for n, _, _ in Gateway.seen] == [1, 1, 1]
    assert {model for _, model, _ in Gateway.seen} == {"deepseek-r1"}
    assert Gateway.drains == []  # one replica, nginx's own upstream: nothing to drain


def test_a_step_of_every_instance_is_not_drained(cli: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    # Drained all at once, the pool would have no replica left: the gateway sends to them all the same, and the
    # wait for their in flight would last readTimeoutSeconds.
    cli["play"]()
    assert rollout.main(["--stack", "prod", "--pool", "chat", "--max-unavailable", "4", "--settle-seconds", "0"]) == 0
    assert Gateway.drains == []
    out = capsys.readouterr().out
    assert (
        "    chat-gpu-03, chat-gpu-04, chat-gpu-05, chat-gpu-06: not drained at the gateway (the step replaces "
        "every instance of the pool)\n" in out
    )
