"""Multi-node without Ray: a pool with `vllm.multiNode: native` runs vLLM's own launcher, one container per node
(rank 0 serves the API, the others `--headless`), and the firewall, gates, watchdog, rollout and monitoring follow."""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from components.engines.base import WATCHDOG_SCRIPT, WorldCheck, watchdog_script
from components.engines.registry import ENGINES
from components.planning.load import load_stack_config
from components.planning.monitoring.alerts import alert_groups
from components.planning.monitoring.prometheus import scrape_targets
from components.planning.nodes.firewall import guarded_ports, ruleset
from components.spec import SpecError, StackSpec
from components.spec.topology import all_instances, host_ports
from ops.doctor import node_containers, peer_targets
from ops.rollout import rollout_steps
from plan.harness import ProgramRun, Registration
from plan.stackfile import load_stack_file
from tests.conftest import prod_config, run_stack
from tests.support import free_port
from tests.support.expected_argv import R1_SERVE_TAIL, REFERENCE_NCCL_ENV
from tests.support.policies import DESCRIPTIONS, model_server, server
from tests.support.schemas import problems_of, provider_resources
from tests.test_vllm_watchdog import BOUND_S, FAKE_VLLM

ROOT = Path(__file__).resolve().parent.parent
STACK = "vllm-native-multinode"
CONTAINER = "docker:index/container:Container"
P = "llm-cluster:"


def native_config() -> dict[str, Any]:
    """The example stack whose reasoning pool runs TP 8 x PP 2 on vLLM's own launcher (a fresh copy)."""
    return copy.deepcopy(load_stack_file(ROOT / f"Pulumi.{STACK}.yaml", STACK).config)


@pytest.fixture(scope="module")
def spec() -> StackSpec:
    return load_stack_config(native_config(), set())


@pytest.fixture(scope="module")
def run() -> ProgramRun:
    return run_stack(native_config(), stack=STACK)


def named(run: ProgramRun, type_: str, name: str) -> Registration:
    [found] = [r for r in run.registrations if r.type == type_ and r.name == name]
    return found


# Both nodes' argv up to the launcher's flags, and after them: only the rank and --headless differ.
HEAD = [
    "vllm",
    "serve",
    "/data/models/DeepSeek-R1-GPTQ-Int4",
    "--served-model-name",
    "deepseek-r1",
    "--host",
    "192.168.20.11",
    "--port",
    "8000",
    "--tensor-parallel-size",
    "8",
    "--pipeline-parallel-size",
    "2",
    "--distributed-executor-backend",
    "mp",
    "--nnodes",
    "2",
]
RENDEZVOUS = ["--master-addr", "192.168.20.11", "--master-port", "29501"]
RANK0 = [*HEAD, "--node-rank", "0", *RENDEZVOUS, *R1_SERVE_TAIL]
RANK1 = [*HEAD, "--node-rank", "1", *RENDEZVOUS, "--headless", *R1_SERVE_TAIL]


def test_rank_0_serves_the_api_and_the_other_node_joins_it_headless(spec: StackSpec) -> None:
    [inst] = all_instances(spec)
    assert (inst.launcher, inst.uses_ray, inst.native_launcher, inst.master_port) == ("native", False, True, 29501)
    vllm = ENGINES["vllm"]
    assert vllm.node_argv(spec, inst, "gpu-01") == RANK0 == vllm.serve_argv(spec, inst)
    assert vllm.node_argv(spec, inst, "gpu-02") == RANK1
    with pytest.raises(ValueError, match="not one of reasoning-gpu-01's nodes"):
        vllm.node_argv(spec, inst, "gpu-03")


def test_each_node_gets_its_own_address_and_the_fabric_settings_a_ray_pool_gets(spec: StackSpec) -> None:
    [inst] = all_instances(spec)
    env = ENGINES["vllm"].serve_env(spec, inst, "gpu-02")
    assert env == {
        "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "RAY_USAGE_STATS_ENABLED": "0",
        **REFERENCE_NCCL_ENV,
        "VLLM_MLA_DISABLE": "1",
        "VLLM_HOST_IP": "192.168.20.12",
    }
    assert ENGINES["vllm"].serve_env(spec, inst, "gpu-01")["VLLM_HOST_IP"] == "192.168.20.11"


def test_ray_stays_the_default_and_the_reference_stack_keeps_it(prod_spec: StackSpec) -> None:
    reasoning = next(i for i in all_instances(prod_spec) if i.pool == "reasoning")
    assert (reasoning.launcher, reasoning.uses_ray, reasoning.master_port) == ("ray", True, None)
    argv = ENGINES["vllm"].serve_argv(prod_spec, reasoning)
    assert argv[argv.index("--distributed-executor-backend") + 1] == "ray"
    assert not {"--nnodes", "--node-rank", "--master-addr", "--master-port", "--headless"} & set(argv)


def issues_of(config: dict[str, Any]) -> list[tuple[str, str]]:
    with pytest.raises(SpecError) as err:
        load_stack_config(config, set())
    return [(i.path, i.message) for i in err.value.issues]


def test_native_on_a_pool_whose_instances_fit_one_node_is_refused_naming_the_key() -> None:
    config = prod_config()
    config[P + "pools"]["chat"]["vllm"]["multiNode"] = "native"
    assert issues_of(config) == [
        (
            "pools.chat.vllm.multiNode",
            "'native' starts vLLM's own launcher across the nodes of one instance, but each instance of pool "
            "'chat' fits on one node (tensorParallel 8 x pipelineParallel 1 on 8 GPUs per node): remove "
            "multiNode (allowed: ray, the default, or native for pools whose instances span nodes)",
        )
    ]


def test_native_without_the_watchdog_is_refused_naming_both_keys() -> None:
    config = native_config()
    config[P + "pools"]["reasoning"]["restartUnhealthyAfterSeconds"] = 0
    assert issues_of(config) == [
        (
            "pools.reasoning.restartUnhealthyAfterSeconds",
            "0 turns the watchdog off, and with multiNode: native it is what stops a headless worker when the first "
            "node stops serving (its workers would wait in a world that is gone instead of rejoining the restarted "
            "one): give it seconds (default 300), or use multiNode: ray",
        )
    ]


def test_an_unknown_launcher_is_refused_with_what_is_allowed() -> None:
    config = native_config()
    config[P + "pools"]["reasoning"]["vllm"]["multiNode"] = "torchrun"
    [(key, message)] = issues_of(config)
    assert (
        key == "pools.reasoning.vllm.multiNode"
        and message == "'torchrun' is not allowed: must be one of 'ray', 'native'"
    )


def test_the_master_port_is_checked_against_the_other_ports_of_the_node() -> None:
    config = native_config()
    config[P + "pools"]["reasoning"]["vllm"]["masterPort"] = 8000
    [(key, message)] = issues_of(config)
    assert "pools.reasoning.vllm.masterPort" in key + message and "pools.reasoning.port" in key + message


def test_launcher_flags_in_extra_args_are_refused_for_the_typed_key() -> None:
    config = native_config()
    config[P + "pools"]["reasoning"]["vllm"]["extraArgs"] = ["--master-port=1234"]
    [(key, message)] = issues_of(config)
    assert key == "pools.reasoning.vllm.extraArgs[0]"
    assert message.startswith("'--master-port=1234' is set by the typed key pools.reasoning.vllm.masterPort: state it")


def native_props(image: str) -> dict[str, Any]:
    """The example's rank-0 ModelServer props as the pack reads them, on `image`."""
    return server(
        pool="reasoning",
        instance="reasoning-gpu-01",
        nodes=["gpu-01", "gpu-02"],
        image=image,
        argv=[a for a in RANK0 if a not in ("--attention-backend", "TRITON_ATTN")],
        model="deepseek-r1",
        modelPath="/data/models/DeepSeek-R1-GPTQ-Int4",
        arch="deepseek-r1",
        quantization="gptq",
        tensorParallel=8.0,
        pipelineParallel=2.0,
    )


def test_the_pack_refuses_the_native_launcher_on_an_image_without_it() -> None:
    found = [d for d in model_server(native_props("vllm/vllm-openai:v0.11.0")) if d[0] == "vllm-native-multi-node"]
    assert found == [
        (
            "vllm-native-multi-node",
            "mandatory",
            DESCRIPTIONS["vllm-native-multi-node"]
            + "\npools.reasoning.vllm.multiNode: native starts vLLM's own multi-node launcher (--nnodes, --node-rank, "
            "--master-addr, --master-port, --headless on the other nodes), which vLLM 0.11.0 of pools.reasoning.image "
            "vllm/vllm-openai:v0.11.0 does not have (components/engines/vllm/data/vllm-0.11.0-serve-args.json: no "
            "--nnodes, --node-rank, --master-addr or --master-port (vllm PR #23691, the mp executor across nodes, "
            "is not in this release): multi-node needs Ray [read from code]): it would exit on an unrecognized argument. Keep "
            "multiNode: ray on this image, or use one whose vLLM has the launcher: vllm/vllm-openai:v0.19.1, "
            "vllm/vllm-openai:v0.19.1-ubuntu2404.",
        )
    ]
    assert [d for d in model_server(native_props("vllm/vllm-openai:v0.19.1")) if d[0] == "vllm-native-multi-node"] == []


def test_one_container_per_node_and_no_ray(run: ProgramRun, spec: StackSpec) -> None:
    head = named(run, CONTAINER, "reasoning-gpu-01-vllm")
    worker = named(run, CONTAINER, "reasoning-gpu-01-worker-gpu-02")
    pool_containers = sorted(r.name for r in run.by_type(CONTAINER) if r.name.startswith("reasoning-"))
    assert pool_containers == ["reasoning-gpu-01-vllm", "reasoning-gpu-01-worker-gpu-02"]
    assert not [r for r in run.registrations if "RayCluster" in r.type or "ray" in r.name.split("-")]
    watchdog = ["/bin/bash", WATCHDOG_SCRIPT]
    assert (head.inputs["entrypoints"], head.inputs["command"]) == (watchdog, RANK0)
    assert (worker.inputs["entrypoints"], worker.inputs["command"]) == (watchdog, RANK1)
    assert head.inputs["name"] == "vllm-reasoning-gpu-01" and worker.inputs["name"] == "vllm-worker-reasoning-gpu-01"
    labels = {x["label"]: x["value"] for x in worker.inputs["labels"]}
    assert (labels["llm-cluster.role"], labels["llm-cluster.node"], labels["llm-cluster.instance"]) == (
        "vllm-worker",
        "gpu-02",
        "reasoning-gpu-01",
    )
    assert worker.inputs["restart"] == "unless-stopped" and "healthcheck" not in worker.inputs
    assert "VLLM_HOST_IP=192.168.20.12" in worker.inputs["envs"]
    # The worker's watchdog watches rank 0's API: it exits (and docker restarts it) when rank 0 stops serving.
    [upload] = [u for u in worker.inputs["uploads"] if u["file"] == WATCHDOG_SCRIPT]
    assert "url=http://192.168.20.11:8000/health" in upload["content"]
    # Each node's watchdog also watches its connections with the other node on the rendezvous port (vLLM
    # itself notices a dead node only when a request times out, and a restarted one cannot rejoin that world).
    [head_upload] = [u for u in head.inputs["uploads"] if u["file"] == WATCHDOG_SCRIPT]
    for u, peer in ((head_upload, "192.168.20.12"), (upload, "192.168.20.11")):
        assert u["content"] == watchdog_script(
            "http://192.168.20.11:8000/health",
            load_timeout_s=1800,
            unhealthy_after_s=300,
            world=WorldCheck(29501, (peer,)),
        )
    # Rank 0 first, then the worker on its node's provider; the gate on rank 0's /health waits for both.
    assert head.urn in worker.dependencies and worker.provider != head.provider
    # ib_write_bw between the two nodes before either container starts, as a Ray pool runs it before its head.
    rdma = named(run, "command:remote:Command", "reasoning-gpu-01-rdma")
    assert rdma.urn in head.dependencies
    gate = named(run, "command:remote:Command", "reasoning-gpu-01-health")
    assert {head.urn, worker.urn} <= set(gate.dependencies)
    assert "http://192.168.20.11:8000/health" in gate.inputs["create"]
    assert "also='Also check: docker logs vllm-worker-reasoning-gpu-01 on gpu-02'" in gate.inputs["create"]


def test_every_resource_of_the_native_pool_validates_against_the_provider_schemas(run: ProgramRun) -> None:
    preview = run_stack(native_config(), stack=STACK, preview=True)
    for each in (run, preview):
        checked = {r.name for r in provider_resources(each)}
        assert {"reasoning-gpu-01-vllm", "reasoning-gpu-01-worker-gpu-02", "reasoning-gpu-01-rdma"} <= checked
        assert problems_of(each) == []


def test_the_master_port_is_open_to_the_instances_nodes_only_and_no_ray_port_is_fenced(spec: StackSpec) -> None:
    assert ("gpu-01", 29501, "pools.reasoning.vllm.masterPort") in host_ports(spec)
    head_rules = ruleset(spec, "gpu-01")
    assert (
        'tcp dport 29501 ip saddr { 192.168.20.11, 192.168.20.12 } accept comment "pools.reasoning.vllm.masterPort: '
        'the instance\'s nodes"\n\t\ttcp dport 29501 drop comment "pools.reasoning.vllm.masterPort: the '
        "instance's nodes only\"\n\t\tip saddr @cluster_v4 accept" in head_rules
    )
    assert "29501" not in ruleset(spec, "gpu-02")
    for node in ("gpu-01", "gpu-02"):
        fenced = {(p.first, p.last) for p in guarded_ports(spec, node)}
        assert not fenced & {(6379, 6379), (8265, 8265), (10001, 10001), (10002, 19999)}
    assert (29501, 29501) in {(p.first, p.last) for p in guarded_ports(spec, "gpu-01")}


def test_the_engine_is_scraped_on_rank_0_and_no_ray_alert_watches_the_pool(spec: StackSpec) -> None:
    engine = [(t.job, t.address, t.port, t.labels["instance"]) for t in scrape_targets(spec) if t.job == "vllm"]
    assert engine == [("vllm", "192.168.20.11", 8000, "reasoning-gpu-01")]
    names = [rule.alert for rules in alert_groups(spec).values() for rule in rules]
    assert not [n for n in names if n.startswith("Ray")] and "ThroughputDrop" in names


def test_a_rollout_step_replaces_both_nodes_containers_and_reruns_the_gate(run: ProgramRun, spec: StackSpec) -> None:
    [step] = rollout_steps(run, spec, "reasoning", 1)
    names = [u.rsplit("::", 1)[1] for u in step.targets]
    assert step.instances == ("reasoning-gpu-01",)
    assert {"reasoning-gpu-01-vllm", "reasoning-gpu-01-worker-gpu-02", "reasoning-gpu-01-health"} <= set(names)
    assert {"gpu-01-image-vllm-openai-v0-19-1", "gpu-02-image-vllm-openai-v0-19-1"} <= set(names)


def test_the_gate_names_the_workers_log_and_is_shellcheck_clean(run: ProgramRun, tmp_path: Path) -> None:
    script = named(run, "command:remote:Command", "reasoning-gpu-01-health").inputs["create"]
    # bash_command: `bash -c "$(cat <<'HEREDOC' … HEREDOC)"`: the script is the heredoc's body.
    text = script.split("\n", 1)[1].rsplit("\n", 2)[0]
    path = tmp_path / "gate.sh"
    path.write_text(text)
    subprocess.run(["bash", "-n", str(path)], check=True)
    lint = subprocess.run(["shellcheck", "-s", "bash", str(path)], capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout
    assert text.count('echo "$also" >&2') == 2


# --- the headless worker's watchdog, run for real: rank 0 is a fake server, the worker a sleeping process ---

HEADLESS = "import time\nwhile True:\n    time.sleep(0.2)\n"


def test_a_headless_worker_exits_when_rank_0_stops_serving_and_passes_its_own_death_on(tmp_path: Path) -> None:
    port = free_port()
    flag, log = tmp_path / "flag", tmp_path / "requests.log"
    flag.write_text("ok")
    (tmp_path / "rank0.py").write_text(FAKE_VLLM)
    (tmp_path / "headless.py").write_text(HEADLESS)
    script = tmp_path / "vllm-watchdog.sh"
    script.write_text(
        watchdog_script(f"http://127.0.0.1:{port}/health", load_timeout_s=30, unhealthy_after_s=2, interval_s=1)
    )
    rank0 = subprocess.Popen([sys.executable, str(tmp_path / "rank0.py"), str(port), str(flag), str(log)])
    procs: list[subprocess.Popen[str]] = []

    def worker() -> subprocess.Popen[str]:
        argv = ["bash", str(script), sys.executable, str(tmp_path / "headless.py")]
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        procs.append(p)
        return p

    def probed_ok() -> None:
        deadline = time.monotonic() + BOUND_S
        while "/health 200" not in (log.read_text() if log.exists() else ""):
            assert time.monotonic() < deadline, "the worker's watchdog never saw rank 0 healthy"
            time.sleep(0.1)

    try:
        w = worker()
        probed_ok()
        flag.write_text("hang")  # rank 0 stops serving (its engine died or hangs)
        _, err = w.communicate(timeout=BOUND_S)
        assert w.returncode == 70 and "after serving; stopping vLLM so docker restarts it" in err
        gone = subprocess.run(["pgrep", "-f", str(tmp_path / "headless.py")], capture_output=True)
        assert gone.returncode == 1  # the headless process was stopped with it, not left joined to a dead world
        # The worker's own death: its exit status is the container's, so docker restarts it.
        flag.write_text("ok")
        log.unlink()
        w = worker()
        probed_ok()
        found = subprocess.run(["pgrep", "-P", str(w.pid), "-f", "headless.py"], capture_output=True, text=True)
        [pid] = found.stdout.split()
        os.kill(int(pid), signal.SIGKILL)
        w.communicate(timeout=BOUND_S)
        assert w.returncode == 128 + signal.SIGKILL
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.communicate(timeout=BOUND_S)
        rank0.kill()
        rank0.wait(timeout=BOUND_S)


def test_doctor_reads_each_nodes_own_container(spec: StackSpec) -> None:
    assert [(name, role) for _, name, role in node_containers(spec, "gpu-01")] == [("vllm-reasoning-gpu-01", "server")]
    assert [(name, role) for _, name, role in node_containers(spec, "gpu-02")] == [
        ("vllm-worker-reasoning-gpu-01", "vllm-worker")
    ]


def test_doctor_checks_the_master_port_from_the_instances_nodes_only() -> None:
    config = native_config()
    config[P + "nodes"]["gpu-03"] = {"address": "192.168.20.13"}
    spec = load_stack_config(config, set())
    assert ("gpu-01", "192.168.20.11", 29501, "pools.reasoning.vllm.masterPort") in peer_targets(spec, "gpu-02")
    assert [t for t in peer_targets(spec, "gpu-03") if t[2] == 29501] == []
    assert ("gpu-01", "192.168.20.11", 8000, "pools.reasoning.port") in peer_targets(spec, "gpu-03")
