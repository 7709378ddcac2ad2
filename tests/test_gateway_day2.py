"""Changing a running gateway on real nginx: the host scripts write the files and reload nginx in
place (no restart, nothing lost), pools sharing a model split its traffic by weight and one of them
leaves without a failed request, the certificate a private CA on the host makes, the daily usage
files and their pruning. Loopback only; the scripts run with bash as on the gateway host, with
`docker exec llm-gateway nginx` replaced by this nginx.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import shutil
import ssl
import subprocess
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from components.planning.gateway.layout import NginxControl
from components.planning.gateway.nginx import config_script, render_gateway, usage_dir_script
from components.planning.gateway.tls import tls_from_stdin_script, tls_generate_script
from components.planning.load import load_stack_config
from components.spec import StackSpec
from tests.support.gateway import (
    CHAT,
    WAIT,
    FakeReplica,
    NginxGateway,
    _post,
    gateway_config,
    host_keys,
    nginx_binary,
    own_gateway,
    self_signed,
)


def control(gw: NginxGateway) -> NginxControl:
    """The reload the host scripts do, against this test's nginx instead of `docker exec`."""
    nginx = f"{nginx_binary()} -p {gw.root} -c {gw.conf_dir}/nginx.conf"
    return NginxControl(nginx=nginx, running=f'kill -0 "$(cat {gw.root}/nginx.pid)" 2>/dev/null')


def apply_config(
    gw: NginxGateway, spec: StackSpec, pools: dict[str, list[FakeReplica]]
) -> subprocess.CompletedProcess[str]:
    """Run the host's config script for this spec against the running test nginx (same layout)."""
    files = render_gateway(spec, gw.layout, {p: [("127.0.0.1", r.port) for r in rs] for p, rs in pools.items()})
    script = config_script(spec, files, conf_dir=str(gw.conf_dir), control=control(gw))
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True)


def shared_config(**weights: int) -> dict[str, Any]:
    """The test stack with a second pool (`canary`, gpu-06) serving the chat model."""
    config = gateway_config()
    pools = config["llm-cluster:pools"]
    pools["canary"] = {**pools["chat"], "nodes": ["gpu-06"]}
    pools["chat"]["nodes"] = ["gpu-03", "gpu-04", "gpu-05"]
    config["llm-cluster:gateway"]["poolWeights"] = weights
    return config


def test_config_change_is_written_and_reloaded_without_a_restart(tmp_path: Path) -> None:
    spec = load_stack_config(gateway_config(), set())
    pools = {"chat": [FakeReplica("c")], "reasoning": [FakeReplica("r")]}
    with own_gateway(spec, pools, tmp_path) as (gw, keys):
        master = int((gw.root / "nginx.pid").read_text())
        assert gw.call("POST", "/v1/chat/completions", {"model": "quick"}, keys["default"])[0] == 404
        # A held request is in flight across the reload: it finishes on the old worker.
        from tests.support.gateway import send_held

        replica, client, held = send_held(gw, keys["default"], pools["chat"], "across")
        changed = load_stack_config(gateway_config(aliases={"fast": "chat", "quick": "chat"}), set())
        result = apply_config(gw, changed, pools)
        assert result.returncode == 0, result.stderr
        assert "gateway: nginx reloaded (config changed" in result.stderr
        deadline = time.monotonic() + WAIT
        while gw.call("POST", "/v1/chat/completions", {"model": "quick"}, keys["default"])[0] != 200:
            assert time.monotonic() < deadline, "the new route never answered"
            time.sleep(0.05)
        replica.gates["across"].set()
        client.join(WAIT)
        assert held["result"][0] == 200
        assert int((gw.root / "nginx.pid").read_text()) == master  # the same nginx: reloaded, not restarted

        # A config nginx refuses is not loaded: the script fails, nginx serves on.
        broken = subprocess.run(
            [
                "bash",
                "-c",
                config_script(
                    changed,
                    {**gw.files, "nginx.conf": gw.files["nginx.conf"].replace("events {", "events { bogus;")},
                    conf_dir=str(gw.conf_dir),
                    control=control(gw),
                ),
            ],
            capture_output=True,
            text=True,
        )
        assert broken.returncode == 1 and "nginx -t refuses the new config" in broken.stderr
        assert gw.call("POST", "/v1/chat/completions", {"model": "quick"}, keys["default"])[0] == 200


def test_pools_sharing_a_model_split_its_requests_by_weight(tmp_path: Path) -> None:
    spec = load_stack_config(shared_config(chat=9, canary=1), set())
    pools = {
        "chat": [FakeReplica("chat-a"), FakeReplica("chat-b")],
        "canary": [FakeReplica("canary")],
        "reasoning": [FakeReplica("r")],
    }
    with own_gateway(spec, pools, tmp_path) as (gw, keys):
        served = Counter(
            gw.call("POST", "/v1/chat/completions", {"model": CHAT}, keys["default"])[2]["served_by"]
            for _ in range(100)
        )
        # About 90/10 by pool, the chat pool's share spread over its two replicas. Not exactly: least_conn counts
        # a request until nginx has finished it, which under load can be after the client has its answer and
        # sent the next, and a replica still counted busy sends that one elsewhere (whole `make test` runs gave
        # 37/48 between the chat replicas and 16 to the canary). The bounds still refuse a split that ignores the
        # weights (a third each) or inverts them; the exact nginx weights are compared in the conf tables.
        assert sum(served.values()) == 100 and set(served) == {"chat-a", "chat-b", "canary"}, served
        assert 3 <= served["canary"] <= 25, served
        assert min(served["chat-a"], served["chat-b"]) >= (served["chat-a"] + served["chat-b"]) // 4, served
        # /v1/models lists the shared name once.
        names = [m["id"] for m in gw.call("GET", "/v1/models", key=keys["default"])[2]["data"]]
        assert names.count(CHAT) == 1
        line = [entry for entry in gw.log(at_least=100) if entry["model"] == CHAT][0]
        assert line["pool"] == "chat+canary"


def test_removing_one_of_two_pools_of_a_model_fails_no_request(tmp_path: Path) -> None:
    spec = load_stack_config(shared_config(), set())
    pools = {"chat": [FakeReplica("chat-a")], "canary": [FakeReplica("canary")], "reasoning": [FakeReplica("r")]}
    with own_gateway(spec, pools, tmp_path) as (gw, keys):
        results: list[tuple[int, Any]] = []
        sent_at: list[float] = []  # when each of `results` was sent, in the same order
        stop = threading.Event()

        async def load() -> None:
            async def client(n: int) -> None:
                i = 0
                while not stop.is_set() and i < 400:  # bounded: at most 400 requests a client
                    sent = time.monotonic()
                    answer = await _post(gw.port, keys["default"], f"{n}-{i}")
                    results.append(answer)
                    sent_at.append(sent)
                    i += 1

            await asyncio.gather(*(client(n) for n in range(8)))

        runner = threading.Thread(target=lambda: asyncio.run(load()))
        runner.start()
        deadline = time.monotonic() + WAIT
        while sum(1 for _, out in results if isinstance(out, dict) and out.get("served_by") == "canary") < 10:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        # The canary pool leaves the stack: the gateway stops sending to it first (an update of its
        # config command), Pulumi deletes the pool's containers after.
        config = shared_config()
        del config["llm-cluster:pools"]["canary"]
        config["llm-cluster:pools"]["chat"]["nodes"].append("gpu-06")
        del config["llm-cluster:gateway"]["poolWeights"]
        old_workers = gw.workers()
        result = apply_config(
            gw, load_stack_config(config, set()), {"chat": pools["chat"], "reasoning": pools["reasoning"]}
        )
        assert result.returncode == 0, result.stderr
        # The old workers finish what they hold, then exit: from then on only the new config answers.
        deadline = time.monotonic() + WAIT
        while old_workers & gw.workers():
            assert time.monotonic() < deadline, "the old nginx workers did not exit after the reload"
            time.sleep(0.01)
        settled = time.monotonic()
        while sum(t > settled for t in sent_at) < 50:
            assert time.monotonic() < deadline, "fewer than 50 requests after the reload"
            time.sleep(0.01)
        stop.set()
        runner.join(WAIT)
        assert Counter(status for status, _ in results) == {200: len(results)}
        # Sent once the old workers were gone, no request reaches the canary.
        late = [out["served_by"] for (_, out), t in zip(results, sent_at) if t > settled]
        assert len(late) >= 50 and set(late) == {"chat-a"}


def test_generated_certificate_is_trusted_through_the_ca_and_kept_across_runs(tmp_path: Path) -> None:
    spec = load_stack_config(gateway_config(tls=True, port=443, tlsNames=["gw.example.internal", "127.0.0.1"]), set())
    root = tmp_path / "host"
    made = subprocess.run(["bash", "-c", tls_generate_script(spec, str(root))], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    ca_pem = made.stdout
    assert ca_pem.startswith("-----BEGIN CERTIFICATE-----") and "made a private CA" in made.stderr
    assert oct((root / "ca" / "ca.key").stat().st_mode & 0o777) == "0o600"
    text = subprocess.run(
        ["openssl", "x509", "-noout", "-text", "-in", str(root / "tls" / "cert.pem")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "DNS:gpu-01, IP Address:192.168.10.11, DNS:gw.example.internal, IP Address:127.0.0.1" in text
    cert_before = (root / "tls" / "cert.pem").read_text()
    again = subprocess.run(["bash", "-c", tls_generate_script(spec, str(root))], capture_output=True, text=True)
    assert again.returncode == 0 and again.stdout == ca_pem and "new certificate" not in again.stderr
    assert (root / "tls" / "cert.pem").read_text() == cert_before
    (tmp_path / "ca.pem").write_text(ca_pem)
    pools = {"chat": [FakeReplica("c")], "reasoning": [FakeReplica("r")]}
    with own_gateway(spec, pools, tmp_path, tls_dir=root / "tls") as (gw, keys):
        context = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
        status, _, out = gw.call("POST", "/v1/chat/completions", {"model": CHAT}, keys["default"], context=context)
        assert (status, out["served_by"]) == (200, "c")
        # A new name: a new certificate from the same CA, and nginx reloads onto it.
        renamed = load_stack_config(gateway_config(tls=True, port=443, tlsNames=["127.0.0.1", "other.internal"]), set())
        renewed = subprocess.run(
            ["bash", "-c", tls_generate_script(renamed, str(root), control(gw))], capture_output=True, text=True
        )
        assert renewed.returncode == 0 and renewed.stdout == ca_pem, renewed.stderr
        assert "nginx reloaded (certificate changed" in renewed.stderr
        deadline = time.monotonic() + WAIT
        while True:
            der = ssl.get_server_certificate(("127.0.0.1", gw.port))
            if der.strip() == (root / "tls" / "cert.pem").read_text().strip():
                break
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert gw.call("GET", "/v1/models", key=keys["default"], context=context)[0] == 200


def test_certificate_from_secrets_is_checked_against_its_key(tmp_path: Path) -> None:
    good = self_signed(tmp_path / "a")
    other = self_signed(tmp_path / "b")
    root = tmp_path / "host"
    pem = (good / "cert.pem").read_text() + (good / "key.pem").read_text()
    ok = subprocess.run(["bash", "-c", tls_from_stdin_script(str(root))], input=pem, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert (root / "tls" / "cert.pem").read_text() == (good / "cert.pem").read_text()
    assert oct((root / "tls" / "key.pem").stat().st_mode & 0o777) == "0o600"
    mismatched = (good / "cert.pem").read_text() + (other / "key.pem").read_text()
    bad = subprocess.run(
        ["bash", "-c", tls_from_stdin_script(str(root))], input=mismatched, capture_output=True, text=True
    )
    assert bad.returncode == 1 and "gatewayTlsKey is not the key of the certificate" in bad.stderr
    assert (root / "tls" / "key.pem").read_text() == (good / "key.pem").read_text()


def test_usage_log_is_a_file_a_day_on_the_host_volume(tmp_path: Path) -> None:
    spec = load_stack_config(gateway_config(), set())
    keys, digests = host_keys(spec, tmp_path / "keys")
    # The test's workers run as nobody (the host's as nginx's worker user, the directory's owner):
    # a directory they can reach, outside pytest's private temp tree.
    usage = Path(tempfile.mkdtemp(prefix="llm-usage-"))
    usage.chmod(0o777)
    # (On the host the directory comes from usage_dir_script: nginx's worker user's, 0750.)
    made = subprocess.run(["bash", "-c", usage_dir_script(str(usage / "host"))], check=True)
    assert made.returncode == 0 and oct((usage / "host").stat().st_mode & 0o777) == "0o750"
    assert (usage / "host").stat().st_uid == 101
    pools = {"chat": [FakeReplica("c")], "reasoning": [FakeReplica("r")]}
    (tmp_path / "gw").mkdir()
    gw = NginxGateway(spec, pools, tmp_path / "gw", digests, usage_dir=usage)
    try:
        assert gw.call("POST", "/v1/chat/completions?t=daily", {"model": CHAT}, keys["default"])[0] == 200
        today = datetime.datetime.now(datetime.UTC).date().isoformat()
        path = usage / f"usage-{today}.log"
        deadline = time.monotonic() + WAIT
        while not (path.exists() and "?t=daily" in path.read_text()):
            assert time.monotonic() < deadline, sorted(os.listdir(usage))
            time.sleep(0.02)
        line = json.loads(path.read_text().splitlines()[-1])
        assert (line["model"], line["status"], line["completed"]) == (CHAT, 200, "OK")
    finally:
        gw.stop()
        shutil.rmtree(usage)
        for rs in pools.values():
            for r in rs:
                r.kill()
