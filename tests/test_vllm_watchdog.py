"""The vLLM watchdog, run for real with bash against a fake server: it turns a hang into an exit."""
from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from components.planning.vllm import watchdog_script

# A stand-in for `vllm serve`: /health answers 200 while the flag file says "ok", 503 otherwise;
# it exits with the code written to the flag file as "exit N".
FAKE_VLLM = r'''
import http.server, sys, threading, os
port, flag = int(sys.argv[1]), sys.argv[2]
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if open(flag).read().strip() == "ok" else 503)
        self.end_headers()
    def log_message(self, *a):
        pass
srv = http.server.HTTPServer(("127.0.0.1", port), H)
threading.Thread(target=srv.serve_forever, daemon=True).start()
import time
while True:
    state = open(flag).read().strip()
    if state.startswith("exit "):
        os._exit(int(state.split()[1]))
    time.sleep(0.1)
'''
# Upper bound so a broken watchdog cannot hang the suite; not a timing assertion.
BOUND_S = 60


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(tmp_path: Path, state: str, *, load_timeout_s: int = 30, unhealthy_after_s: int = 2
          ) -> tuple[subprocess.Popen[str], Path]:
    port = _port()
    flag = tmp_path / "flag"
    flag.write_text(state)
    fake = tmp_path / "fake_vllm.py"
    fake.write_text(FAKE_VLLM)
    script = tmp_path / "vllm-watchdog.sh"
    script.write_text(watchdog_script(f"http://127.0.0.1:{port}/health", load_timeout_s=load_timeout_s,
                                      unhealthy_after_s=unhealthy_after_s, interval_s=1))
    proc = subprocess.Popen(["bash", str(script), sys.executable, str(fake), str(port), str(flag)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, flag


def _fake_running(tmp_path: Path) -> bool:
    return subprocess.run(["pgrep", "-f", str(tmp_path / "fake_vllm.py")], capture_output=True).returncode == 0


def test_script_is_shellcheck_clean() -> None:
    for after in (300, 0):
        text = watchdog_script("http://10.0.0.1:8000/health", load_timeout_s=1800, unhealthy_after_s=after)
        subprocess.run(["bash", "-n"], input=text, text=True, check=True)
        lint = subprocess.run(["shellcheck", "-s", "bash", "-"], input=text, text=True, capture_output=True)
        assert lint.returncode == 0, lint.stdout


def test_a_server_that_hangs_after_serving_is_stopped_so_docker_restarts_it(tmp_path: Path) -> None:
    proc, flag = start(tmp_path, "ok")
    time.sleep(2.5)  # let it be healthy at least once
    assert proc.poll() is None
    flag.write_text("hang")
    _, err = proc.communicate(timeout=BOUND_S)
    assert proc.returncode == 70
    assert "unhealthy for" in err and "after serving; stopping vLLM so docker restarts it" in err
    assert not _fake_running(tmp_path)  # vLLM was stopped, not left behind


def test_a_server_that_never_loads_is_stopped_after_the_load_timeout(tmp_path: Path) -> None:
    proc, _ = start(tmp_path, "loading", load_timeout_s=3)
    _, err = proc.communicate(timeout=BOUND_S)
    assert proc.returncode == 70
    assert "not healthy 3s after start; stopping vLLM so docker restarts it" in err
    assert not _fake_running(tmp_path)


def test_unhealthy_while_loading_is_not_a_hang(tmp_path: Path) -> None:
    proc, flag = start(tmp_path, "loading", load_timeout_s=30, unhealthy_after_s=1)
    time.sleep(4)  # well past unhealthy_after: loading is judged by the load timeout only
    assert proc.poll() is None
    flag.write_text("exit 0")
    proc.communicate(timeout=BOUND_S)
    assert proc.returncode == 0


def test_vllm_exit_status_is_passed_on(tmp_path: Path) -> None:
    proc, flag = start(tmp_path, "ok")
    time.sleep(1.5)
    flag.write_text("exit 3")
    proc.communicate(timeout=BOUND_S)
    assert proc.returncode == 3


def test_docker_stop_reaches_vllm(tmp_path: Path) -> None:
    proc, _ = start(tmp_path, "ok")
    time.sleep(1.5)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=BOUND_S)
    assert proc.returncode == 143
    assert not _fake_running(tmp_path)


def test_zero_turns_the_watchdog_off(tmp_path: Path) -> None:
    script = tmp_path / "w.sh"
    script.write_text(watchdog_script("http://127.0.0.1:9/health", load_timeout_s=1, unhealthy_after_s=0))
    done = subprocess.run(["bash", str(script), "sh", "-c", "exit 5"], capture_output=True, timeout=BOUND_S)
    assert done.returncode == 5
