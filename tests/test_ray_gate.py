"""Readiness gates against a real Ray on loopback: a head and a worker, each advertising 8 GPUs.

Ray reaches out when it starts (the cloud-metadata address 169.254.169.254, usage stats disabled or not), so
every Ray process here runs inside a network namespace whose only link is `lo` (RAY_NS, no route out; the
fixture checks it): 127.0.0.1 and 127.0.0.2 are that namespace's loopback, and what Ray tries beyond it fails
at once. Without root (no namespace) the live-Ray tests skip saying so."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from components.planning.fabric.ray import (
    RAY_TEXTFILE_METRICS,
    RayStatus,
    gate_hints,
    parse_ray_status,
    ray_gate_script,
    ray_head_script,
    ray_head_start_argv,
    ray_metrics_writer,
    ray_status_argv,
    ray_textfile,
    ray_worker_argv,
    want_gpus,
)
from components.planning.load import parse_stack
from components.spec import StackSpec
from components.spec.topology import Instance, instances
from lab.loopback import Namespace, namespaces_unavailable
from tests.support import free_ports, tool

FIXTURES = Path(__file__).parent / "fixtures" / "ray"
VENV_BIN = Path(sys.executable).parent
# Upper bounds for waiting on Ray itself: a guard against hanging CI, never a timing assertion. 300 s, not
# 120: a whole cold `make test` (real engines and a llama.cpp build beside it, load 20+) once took longer
# than 120 s between the worker's `ray start` and the head's gate seeing it.
SETTLE_S = 300
WHY_NOT = namespaces_unavailable()
needs_namespace = pytest.mark.skipif(WHY_NOT is not None, reason=f"Ray runs only in a namespace here: {WHY_NOT}")


@pytest.fixture(scope="module")
def ray_ns() -> Iterator[Namespace]:
    """This module's namespace with only loopback; whatever Ray left in it is stopped with it."""
    if WHY_NOT is not None:
        pytest.skip(f"Ray runs only in a namespace here: {WHY_NOT}")
    ns = Namespace(f"ray-gate-{os.getpid()}").create()
    try:
        assert ns.outside_routes() == [] and [link.split("@")[0] for link in ns.links()] == ["lo"]
        yield ns
    finally:
        ns.delete()


def inside(ns: Namespace, argv: list[str]) -> list[str]:
    """`argv` run in the namespace (ip execs it: same pid, same process group, same environment)."""
    return ["ip", "netns", "exec", ns.ns, *argv]


def _ray() -> str:
    found = shutil.which("ray", path=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    if not found:
        pytest.fail("ray is not installed: `.venv/bin/pip install -r requirements-test.txt` (ray==2.60.0)")
    return found


def loopback_spec(ray_port: int, dashboard_port: int, client_port: int) -> StackSpec:
    """A 2-node TP8×PP2 pool whose nodes are 127.0.0.1 (head) and 127.0.0.2 (worker)."""
    return parse_stack(
        {
            "nodeDefaults": {
                "gpu": {"model": "Tesla V100-SXM2-32GB", "count": 8},
                "interface": "lo",
                "hca": {"device": "mlx5_0", "gidIndex": 3},
            },
            "nodes": {"head": {"address": "127.0.0.1"}, "worker": {"address": "127.0.0.2"}},
            "models": {"m": {"arch": "qwen3-30b-a3b", "path": "/data/models/m", "source": {"present": True}}},
            "pools": {
                "loop": {
                    "model": "m",
                    "nodes": ["head", "worker"],
                    "tensorParallel": 8,
                    "pipelineParallel": 2,
                    "rayPort": ray_port,
                    "rayDashboardPort": dashboard_port,
                    "rayClientPort": client_port,
                    "rayGateTimeoutSeconds": 10,
                    "vllm": {"maxModelLen": 4096},
                }
            },
        }
    )


def _env() -> dict[str, str]:
    return {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}", "RAY_USAGE_STATS_ENABLED": "0"}


def _wait_for(predicate, what: str, seen=None) -> None:  # noqa: ANN001
    """Until predicate() holds; fails naming `what` after SETTLE_S (with `seen()`: what there was to see)."""
    deadline = time.monotonic() + SETTLE_S
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"gave up waiting for {what}" + (f"\n{seen()}" if seen else ""))
        time.sleep(0.5)


@dataclass
class LoopbackCluster:
    """A running head (started by ray-head.sh) and worker, and what the head script did."""

    spec: StackSpec
    instance: Instance
    head_rc: int
    head_log: str
    exec_marker: str
    textfile: Path
    """Where ray-head.sh's metrics writer puts the node-exporter textfile."""
    textfile_text: str
    """The textfile once it counted both nodes (observed after the exec: later tests stop Ray)."""
    rewritten_after_exec: bool
    """Whether the writer rewrote it after that, the exec'd command being gone."""


def _kill_group(proc: subprocess.Popen[bytes] | None) -> None:
    """SIGKILL a process started with start_new_session=True and everything in its group (Ray's daemons it
    started stay in it), whether or not the leader itself is still running."""
    if proc is None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # the whole group is gone already
    proc.wait(timeout=SETTLE_S)


def _observe(textfile: Path) -> tuple[str, bool]:
    """The head's textfile once it counts both nodes, and whether it is rewritten after that ("" and False on timeout)."""
    deadline = time.monotonic() + SETTLE_S

    def complete() -> bool:
        return textfile.exists() and 'llm_ray_nodes{ray_cluster="loop-head"} 2\n' in textfile.read_text()

    while not complete():
        if time.monotonic() > deadline:
            return (textfile.read_text() if textfile.exists() else ""), False
        time.sleep(0.2)
    text, before = textfile.read_text(), textfile.stat().st_mtime_ns
    while textfile.stat().st_mtime_ns == before and time.monotonic() < deadline:
        time.sleep(0.2)
    return text, textfile.stat().st_mtime_ns != before


def _run(script: str, tmp: Path, name: str, ns: Namespace | None = None) -> subprocess.CompletedProcess[str]:
    """Run `script` with bash; in `ns` when it talks to Ray."""
    path = tmp / name
    path.write_text(script)
    argv = ["bash", str(path)]
    return subprocess.run(
        inside(ns, argv) if ns else argv, capture_output=True, text=True, env=_env(), timeout=SETTLE_S
    )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, ray_ns: Namespace) -> Iterator[LoopbackCluster]:
    """ray-head.sh starts the head and waits; a worker joins; the script then execs its command."""
    _ray()
    tmp = tmp_path_factory.mktemp("ray")
    spec = loopback_spec(*free_ports(3))
    inst = instances(spec, "loop")[0]
    head_script = tmp / "ray-head.sh"
    textfile_dir = tmp / "node-exporter"
    head_script.write_text(
        ray_head_script(spec, inst, interval_s=1, textfile_dir=str(textfile_dir), metrics_interval_s=1)
    )
    marker = tmp / "exec-args"
    log = tmp / "head.log"
    worker_log = tmp / "worker.log"
    head: subprocess.Popen[bytes] | None = None
    worker: subprocess.Popen[bytes] | None = None
    try:
        with log.open("w") as out:
            # The stub stands in for `vllm serve …`: it records the arguments the script exec'd.
            # Its own process group: ray-head.sh polls with no deadline by design, so teardown kills the group.
            head = subprocess.Popen(
                inside(
                    ray_ns,
                    [
                        "bash",
                        str(head_script),
                        "bash",
                        "-c",
                        f'printf "%s\\n" "$@" > {marker}',
                        "_",
                        "vllm",
                        "serve",
                        "/data/models/m",
                    ],
                ),
                stdout=out,
                stderr=subprocess.STDOUT,
                env=_env(),
                start_new_session=True,
            )
        # Start the worker only once the head's gate has seen the head alone, so the log shows both steps.
        _wait_for(
            lambda: "ray: 8/16 GPUs, 1 node(s)" in log.read_text() or head.poll() is not None,
            "the head's first progress line",
        )
        with worker_log.open("wb") as out:
            worker = subprocess.Popen(
                inside(ray_ns, ray_worker_argv(spec, inst, "worker")),
                stdout=out,
                stderr=subprocess.STDOUT,
                env=_env(),
                start_new_session=True,
            )
        try:
            head_rc = head.wait(timeout=SETTLE_S)
        except subprocess.TimeoutExpired:
            pytest.fail(
                f"the head's gate did not see the worker within {SETTLE_S} s\nhead:\n{log.read_text()[-3000:]}"
                f"\nworker:\n{worker_log.read_text(errors='replace')[-3000:]}"
            )
        textfile = Path(ray_textfile(inst, str(textfile_dir)))
        yield LoopbackCluster(
            spec,
            inst,
            head_rc,
            log.read_text(),
            marker.read_text() if marker.exists() else "",
            textfile,
            *_observe(textfile),
        )
    finally:
        # Whatever failed above (a timeout, an assertion in a wait): no ray-head.sh left polling forever.
        # Only our own groups: `ray stop --force` would kill every Ray on the machine, another test's too.
        _kill_group(head)
        _kill_group(worker)


def test_head_script_waits_for_every_gpu_then_execs_the_command(cluster: LoopbackCluster) -> None:
    assert cluster.head_rc == 0, cluster.head_log
    assert "ray: 8/16 GPUs, 1 node(s)" in cluster.head_log
    assert "ray: 16/16 GPUs, 2 node(s)" in cluster.head_log
    assert "ray: cluster complete, starting: bash -c " in cluster.head_log
    # exec "$@": the container's command reaches vLLM's place unchanged.
    assert cluster.exec_marker == "vllm\nserve\n/data/models/m\n"


def test_head_script_starts_ray_with_the_planned_head_argv(cluster: LoopbackCluster) -> None:
    pool = cluster.spec.pools["loop"]
    assert ray_head_start_argv(cluster.spec, cluster.instance) == [
        "ray",
        "start",
        "--head",
        f"--port={pool.ray_port}",
        "--node-ip-address=127.0.0.1",
        "--num-gpus=8",
        "--dashboard-host=127.0.0.1",
        f"--dashboard-port={pool.ray_dashboard_port}",
        f"--ray-client-server-port={pool.ray_client_port}",
        "--disable-usage-stats",
    ]
    assert ray_worker_argv(cluster.spec, cluster.instance, "worker") == [
        "ray",
        "start",
        "--block",
        f"--address=127.0.0.1:{pool.ray_port}",
        "--node-ip-address=127.0.0.2",
        "--num-gpus=8",
        "--disable-usage-stats",
    ]


def test_gate_passes_when_the_wanted_gpus_are_there(
    cluster: LoopbackCluster, tmp_path: Path, ray_ns: Namespace
) -> None:
    want = want_gpus(cluster.spec, cluster.instance)
    assert want == 16
    script = ray_gate_script(
        ray_status_argv(cluster.spec, cluster.instance), want, 30, "loop-head", want_nodes=2, interval_s=1
    )
    done = _run(script, tmp_path, "gate.sh", ray_ns)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "ray: 16/16 GPUs, 2 node(s)"
    assert lines[-1].startswith("ray gate loop-head: 16 GPUs on 2 node(s) after ")


def test_gate_times_out_naming_what_is_missing(cluster: LoopbackCluster, tmp_path: Path, ray_ns: Namespace) -> None:
    hints = gate_hints(cluster.spec, cluster.instance)
    script = ray_gate_script(
        ray_status_argv(cluster.spec, cluster.instance), 24, 3, "loop-head", want_nodes=3, hints=hints, interval_s=1
    )
    done = _run(script, tmp_path, "gate.sh", ray_ns)
    assert done.returncode == 1
    assert done.stdout.splitlines()[0] == "ray: 16/24 GPUs, 2 node(s)"
    port, client = cluster.spec.pools["loop"].ray_port, cluster.spec.pools["loop"].ray_client_port
    assert done.stderr.strip() == (
        "ray gate loop-head: timed out after 3s with 16 of 24 GPUs on 2/3 node(s): 8 GPUs missing. "
        f"Check: the firewall lets the workers reach 127.0.0.1 on TCP {port} (GCS) and {client} (client) "
        "and the nodes reach each other on Ray's high ports; NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME (lo) "
        "carry the nodes' cluster addresses; the nodes' clocks are in sync (chrony); "
        "docker logs ray-worker-loop-head on worker"
    )


def test_python_parser_reads_the_live_cluster_like_the_gate(cluster: LoopbackCluster, ray_ns: Namespace) -> None:
    out = subprocess.run(
        inside(ray_ns, ray_status_argv(cluster.spec, cluster.instance)),
        capture_output=True,
        text=True,
        env=_env(),
        timeout=SETTLE_S,
        check=True,
    ).stdout
    assert parse_ray_status(out) == RayStatus(nodes=2, gpus_total=16.0, gpus_used=0.0)


def test_worker_exits_when_its_head_goes_so_docker_restarts_it_to_rejoin(tmp_path: Path, ray_ns: Namespace) -> None:
    """The restart chain's link: `ray start --block` on a worker ends when the head's node dies."""
    _ray()
    spec = loopback_spec(*free_ports(3))
    inst = instances(spec, "loop")[0]
    # A blocking head in its own process group: killing that group by id is what a dying head
    # container (or node) does to every Ray process in it at once. Its output is kept: on a fresh clone
    # the head once never answered within SETTLE_S, and nothing said why.
    head_log = tmp_path / "head.log"
    with head_log.open("wb") as out:
        head = subprocess.Popen(
            inside(ray_ns, [*ray_head_start_argv(spec, inst), "--block"]),
            stdout=out,
            stderr=subprocess.STDOUT,
            env=_env(),
            start_new_session=True,
        )
    worker = None
    try:
        status = inside(ray_ns, ray_status_argv(spec, inst))

        def head_answers() -> bool:
            if head.poll() is not None:
                pytest.fail(
                    f"the Ray head exited ({head.returncode}) before it answered:\n"
                    + head_log.read_text(errors="replace")[-3000:]
                )
            return subprocess.run(status, capture_output=True, env=_env()).returncode == 0

        _wait_for(head_answers, "the head", lambda: head_log.read_text(errors="replace")[-3000:])
        # Ray's default is 60 s of GCS reconnect attempts; 20 s keeps the test short. Not 5 s: the same
        # bound also covers the worker raylet's first connection to the GCS, and at 5 s the worker once
        # never joined in a whole-suite run at load 15-22 (the likely reason; its logs were not kept).
        worker = subprocess.Popen(
            inside(ray_ns, ray_worker_argv(spec, inst, "worker")),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            env={**_env(), "RAY_gcs_rpc_server_reconnect_timeout_s": "20"},
        )
        _wait_for(
            lambda: (
                parse_ray_status(subprocess.run(status, capture_output=True, text=True, env=_env()).stdout).nodes == 2
            ),
            "the worker",
        )
        os.killpg(head.pid, signal.SIGKILL)
        head.wait(timeout=SETTLE_S)
        assert worker.wait(timeout=SETTLE_S) != 0
    finally:
        # This cluster's process groups only (the worker's raylet outlives `ray start`): never
        # `ray stop --force`, which also kills the module's shared cluster and fails later tests.
        _kill_group(head)
        _kill_group(worker)


@pytest.mark.parametrize(
    "fixture,nodes,total,used",
    [
        ("ray-status.2-nodes-16-gpu.verl-docs.txt", 2, 16.0, 0.0),
        ("ray-status.2-nodes-16-gpu-idle.gpustack-issue-2077.txt", 2, 16.0, 0.0),
        ("ray-status.2-nodes-16-gpu-all-reserved-in-placement-groups.vllm-issue-5094.txt", 2, 16.0, 16.0),
    ],
)
def test_parser_and_gate_read_published_ray_status(
    fixture: str, nodes: int, total: float, used: float, tmp_path: Path
) -> None:
    text = (FIXTURES / fixture).read_text()
    assert parse_ray_status(text) == RayStatus(nodes, total, used)
    # The gate's awk on the same text: it passes at 16 and names 1 missing GPU at 17.
    ok = _run(ray_gate_script(["cat", str(FIXTURES / fixture)], 16, 5, "fx"), tmp_path, "ok.sh")
    assert ok.returncode == 0 and ok.stdout.splitlines()[0] == "ray: 16/16 GPUs, 2 node(s)"
    short = _run(ray_gate_script(["cat", str(FIXTURES / fixture)], 17, 1, "fx", interval_s=1), tmp_path, "no.sh")
    assert short.returncode == 1
    assert short.stderr.startswith("ray gate fx: timed out after 1s with 16 of 17 GPUs on 2 node(s): 1 GPUs missing.")


def test_gate_counts_nothing_while_ray_is_unreachable(tmp_path: Path) -> None:
    # A failing status command (GCS not up yet) is "0 GPUs", not a crash of the gate under set -e.
    done = _run(ray_gate_script(["false"], 8, 1, "down", interval_s=1), tmp_path, "down.sh")
    assert done.returncode == 1
    assert done.stdout.splitlines()[0] == "ray: 0/8 GPUs, 0 node(s)"
    assert "with 0 of 8 GPUs on 0 node(s): 8 GPUs missing" in done.stderr


# --- the head's node-exporter textfile ---------------------------------------------------------------

METRICS_FIXTURE = Path(__file__).parent / "fixtures" / "metrics" / "llm-ray-textfile.txt"


def _samples(text: str) -> dict[str, str]:
    """`series value` lines of a Prometheus text file, by series."""
    return dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))


def test_head_publishes_the_cluster_for_node_exporter_and_keeps_on_after_the_exec(cluster: LoopbackCluster) -> None:
    assert cluster.head_rc == 0, cluster.head_log
    assert _samples(cluster.textfile_text) == {
        'llm_ray_nodes{ray_cluster="loop-head"}': "2",
        'llm_ray_gpus{ray_cluster="loop-head"}': "16",
        'llm_ray_status_up{ray_cluster="loop-head"}': "1",
    }
    # node-exporter runs as nobody and reads what root wrote in the head container.
    assert oct(cluster.textfile.stat().st_mode & 0o777) == "0o644"
    assert [p.name for p in cluster.textfile.parent.glob("*.prom")] == ["llm-ray-loop-head.prom"]
    # The exec'd command (the stub) was gone, and the file was still rewritten: the writer outlives the exec.
    assert cluster.rewritten_after_exec


def test_the_textfile_passes_promtool_and_matches_the_metrics_fixture(cluster: LoopbackCluster) -> None:
    text = cluster.textfile_text
    out = subprocess.run(
        [tool("promtool"), "check", "metrics"], input=text, capture_output=True, text=True, timeout=SETTLE_S
    )
    assert out.returncode == 0, out.stdout + out.stderr
    types = {line.split()[2]: line.split()[3] for line in text.splitlines() if line.startswith("# TYPE ")}
    listed = dict(
        line.split() for line in METRICS_FIXTURE.read_text().splitlines() if line and not line.startswith("#")
    )
    assert types == listed == {name: "gauge" for name in RAY_TEXTFILE_METRICS}


def test_writer_says_down_when_ray_status_fails_and_cleans_up_after_a_killed_writer(tmp_path: Path) -> None:
    published = FIXTURES / "ray-status.2-nodes-16-gpu.verl-docs.txt"
    for name, cmd, want in (("down", ["false"], ("0", "0", "0")), ("fx", ["cat", str(published)], ("2", "16", "1"))):
        textfile = tmp_path / name / f"llm-ray-{name}.prom"
        textfile.parent.mkdir()
        leftover = textfile.parent / f".{textfile.name}.Ab12Cd"  # a writer killed between write and rename
        leftover.write_text("llm_ray_nodes 1\n")
        script = tmp_path / f"{name}.sh"
        script.write_text(
            "#!/usr/bin/env bash\nset -euo pipefail\n" + ray_metrics_writer(cmd, name, str(textfile), 1) + "\nwait\n"
        )
        writer = subprocess.Popen(
            ["bash", str(script)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        try:
            _wait_for(textfile.exists, f"the {name} textfile")
            label = f'{{ray_cluster="{name}"}}'
            assert _samples(textfile.read_text()) == {
                f"llm_ray_nodes{label}": want[0],
                f"llm_ray_gpus{label}": want[1],
                f"llm_ray_status_up{label}": want[2],
            }
            assert not leftover.exists()
        finally:
            _kill_group(writer)
