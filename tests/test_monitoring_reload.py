"""Config reloads without a restart: the generated config command against a real Prometheus and Alertmanager on
loopback (Grafana's admin API against a recording stand-in: Grafana is not packaged for Debian)."""

from __future__ import annotations

import base64
import http.server
import json
import os
import stat
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from components.planning.monitoring.prometheus import (
    config_files_script,
    grafana_reloads,
    lifecycle_reloads,
    written_files,
)
from tests.support import free_port, tool

RULE = "groups:\n- name: g\n  rules:\n  - alert: {name}\n    expr: vector(1) > {threshold}\n"
PROM_CONFIG = "global: {scrape_interval: 15s}\nrule_files: ['rules/*.yml']\nscrape_configs: []\n"
AM_CONFIG = "route: {receiver: %s}\nreceivers:\n- name: %s\n"


def fake_docker(tmp_path: Path, running: bool) -> dict[str, str]:
    """PATH with a `docker` that answers `docker inspect -f '{{.State.Running}}' NAME` as the host's would."""
    bin_dir = tmp_path / ("bin-running" if running else "bin-stopped")
    bin_dir.mkdir(exist_ok=True)
    docker = bin_dir / "docker"
    docker.write_text("#!/bin/sh\n" + ("echo true\n" if running else "echo 'Error: No such object' >&2; exit 1\n"))
    docker.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def run_script(script: str, env: dict[str, str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [tool("bash"), "-c", script], env=env, input=stdin, capture_output=True, text=True, timeout=120
    )


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310 (loopback)
        return json.loads(resp.read())


def wait_ready(url: str, proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"{what} exited: {proc.stderr.read().decode() if proc.stderr else ''}")
        try:
            with urllib.request.urlopen(url, timeout=2):  # noqa: S310 (loopback)
                return
        except OSError:
            time.sleep(0.2)
    pytest.fail(f"{what} not ready at {url} within 60 s")


@pytest.fixture
def spawn() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for p in procs:
        p.terminate()
        p.wait(timeout=30)


def rule_names(port: int) -> list[str]:
    groups = get_json(f"http://127.0.0.1:{port}/api/v1/rules")["data"]["groups"]
    return sorted(r["name"] for g in groups for r in g["rules"])


def test_prometheus_reloads_rules_in_place_and_keeps_them_on_a_bad_config(
    tmp_path: Path, spawn: list[subprocess.Popen[bytes]]
) -> None:
    port, root = free_port(), tmp_path / "etc"
    url = f"http://127.0.0.1:{port}"

    def script(rules: dict[str, str]) -> str:
        files = {"prometheus/prometheus.yml": PROM_CONFIG} | {f"prometheus/rules/{k}": v for k, v in rules.items()}
        return config_files_script("prometheus", "prometheus", files, lifecycle_reloads(url), root=str(root))

    first = run_script(script({"a.yml": RULE.format(name="A", threshold=0)}), fake_docker(tmp_path, running=False))
    assert first.returncode == 0, first.stderr
    assert "prometheus: container prometheus not running yet; it reads these files when it starts" in first.stdout
    config = root / "prometheus" / "prometheus.yml"
    assert config.read_text() == PROM_CONFIG
    st = config.stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (65534, 65534, 0o644)

    proc = subprocess.Popen(
        [
            tool("prometheus"),
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--web.enable-lifecycle",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    spawn.append(proc)
    wait_ready(f"{url}/-/ready", proc, "prometheus")
    assert rule_names(port) == ["A"]

    # a.yml is gone from the config: its file goes, and the running Prometheus drops the rule.
    running = fake_docker(tmp_path, running=True)
    second = run_script(script({"b.yml": RULE.format(name="B", threshold=1)}), running)
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip().endswith("prometheus: config reloaded")
    assert sorted(p.name for p in (root / "prometheus" / "rules").iterdir()) == ["b.yml"]
    assert rule_names(port) == ["B"]

    broken = run_script(script({"b.yml": "groups: [{name: g, rules: [{alert: C, expr: 'vector(('}]}]\n"}), running)
    assert broken.returncode == 1
    assert "prometheus: reload failed (HTTP 500)" in broken.stderr
    assert f"prometheus keeps its previous config; check the files under {root}" in broken.stderr
    assert rule_names(port) == ["B"] and proc.poll() is None  # the same process, still serving


def test_alertmanager_takes_its_secret_config_on_stdin_and_reloads(
    tmp_path: Path, spawn: list[subprocess.Popen[bytes]]
) -> None:
    port, root = free_port(), tmp_path / "etc"
    url = f"http://127.0.0.1:{port}"
    script = config_files_script(
        "alertmanager",
        "alertmanager",
        {},
        lifecycle_reloads(url),
        stdin_file="alertmanager/alertmanager.yml",
        secret=True,
        root=str(root),
    )
    assert "ops" not in script  # the receivers never enter the script: stdin only
    first = run_script(script, fake_docker(tmp_path, running=False), stdin=AM_CONFIG % ("ops", "ops"))
    assert first.returncode == 0, first.stderr
    path = root / "alertmanager" / "alertmanager.yml"
    st = path.stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (65534, 0o600)

    proc = subprocess.Popen(
        [
            tool("prometheus-alertmanager"),
            f"--config.file={path}",
            f"--storage.path={tmp_path / 'am'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    spawn.append(proc)
    wait_ready(f"{url}/-/ready", proc, "alertmanager")
    assert "receiver: ops" in get_json(f"{url}/api/v2/status")["config"]["original"]

    second = run_script(script, fake_docker(tmp_path, running=True), stdin=AM_CONFIG % ("pager", "pager"))
    assert second.returncode == 0, second.stderr
    assert "receiver: pager" in get_json(f"{url}/api/v2/status")["config"]["original"]
    assert proc.poll() is None


class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: list[tuple[str, str, str]] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        type(self).seen.append((self.command, self.path, self.headers.get("Authorization", "")))
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b'{"message":"reloaded"}')

    def log_message(self, *args: object) -> None:
        pass


def test_grafana_reloads_datasources_and_dashboards_as_admin_without_the_password_on_a_command_line(
    tmp_path: Path,
) -> None:
    server = http.server.HTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        password = tmp_path / "admin-password"
        password.write_text('pa"ss\\word')
        url = f"http://127.0.0.1:{server.server_port}"
        files = {
            "grafana/provisioning/datasources/x.yaml": "apiVersion: 1\n",
            "grafana/dashboards/llm-cluster/d.json": '{"uid": "d", "title": "$pool"}\n',
        }
        script = config_files_script(
            "grafana", "grafana", files, grafana_reloads(url, str(password)), root=str(tmp_path / "etc")
        )
        assert 'pa"ss' not in script
        done = run_script(script, fake_docker(tmp_path, running=True))
        assert done.returncode == 0, done.stderr
        auth = "Basic " + base64.b64encode(b'admin:pa"ss\\word').decode()
        assert _Recorder.seen == [
            ("POST", "/api/admin/provisioning/datasources/reload", auth),
            ("POST", "/api/admin/provisioning/dashboards/reload", auth),
        ]
        assert (tmp_path / "etc" / "grafana" / "dashboards" / "llm-cluster" / "d.json").read_text() == files[
            "grafana/dashboards/llm-cluster/d.json"
        ]
    finally:
        server.shutdown()


def test_the_plan_lists_every_file_a_config_script_writes() -> None:
    files = {"prometheus/prometheus.yml": PROM_CONFIG, "prometheus/rules/a.yml": RULE.format(name="A", threshold=0)}
    script = config_files_script("prometheus", "prometheus", files, lifecycle_reloads("http://127.0.0.1:1"), root="/r")
    assert written_files(script) == {f"/r/{k}": v for k, v in files.items()}


def test_config_scripts_pass_shellcheck(tmp_path: Path) -> None:
    for script in (
        config_files_script(
            "prometheus", "prometheus", {"prometheus/p.yml": "a: 1\n"}, lifecycle_reloads("http://127.0.0.1:1")
        ),
        config_files_script("grafana", "grafana", {}, grafana_reloads("http://127.0.0.1:1")),
        config_files_script(
            "alertmanager",
            "alertmanager",
            {},
            lifecycle_reloads("http://127.0.0.1:1"),
            stdin_file="alertmanager/alertmanager.yml",
            secret=True,
        ),
    ):
        path = tmp_path / "s.sh"
        path.write_text(script)
        out = subprocess.run([tool("shellcheck"), "-s", "bash", str(path)], capture_output=True, text=True)
        assert out.returncode == 0, out.stdout
