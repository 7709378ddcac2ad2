"""`make plan` / `python -m plan`: exit codes, what it prints, plan.json's shape, and no secret anywhere."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from plan.graph import component_graph, mermaid
from plan.harness import SECRET_SIG, SIG, Registration
from plan.secrets import find_leaks
from plan.stackfile import load_stack_file, secret_placeholder

ROOT = Path(__file__).resolve().parent.parent
PROD_TEXT = (ROOT / "Pulumi.prod.yaml").read_text()


def plan(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "plan", "--out", str(tmp_path / "out"), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def stack_file(tmp_path: Path, text: str, name: str = "test") -> Path:
    path = tmp_path / f"Pulumi.{name}.yaml"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def prod_plan(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    tmp = tmp_path_factory.mktemp("prod")
    return plan(tmp, "--stack", "prod"), tmp / "out" / "prod"


def test_reference_stack_plans_clean(prod_plan: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    proc, _ = prod_plan
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    for line in (
        "Nodes",
        "Pools",
        "Gateway",
        "Capacity (as each pool's engine will compute it; weights and KV cache per GPU, "
        "KV tokens and concurrency per instance, rule of thumb for the whole model)",
        "Policy",
    ):
        assert f"\n{line}" in out
    # Each column says what it counts.
    assert "\n                              /GPU      /GPU  /instance  /instance         /model\n" in out
    for i in range(1, 7):
        assert f"  gpu-0{i}  192.168.10.1{i}  8 x Tesla V100-SXM2-32GB" in out
    assert (
        "  reasoning    reasoning-gpu-01       deepseek-r1 · TP8 x PP2 on Ray · gpu-01+gpu-02 → "
        "http://192.168.10.11:8000/v1" in out
    )
    assert out.count("qwen3-30b-a3b · TP8 · gpu-0") == 4
    assert "  path  /smart/v1/ → reasoning" in out
    assert (
        "\n  reasoning  pp3  " in out
        and "\n  pp3: each instance on 3 nodes (pipelineParallel 3), one more than deployed\n" in out
    )
    # The summary tells local from remote commands and counts instances of any engine.
    assert re.search(
        r"\n6 nodes · 2 pools · 5 serving instances · \d+ resources \(\d+ local Command, \d+ remote Command, "
        r"\d+ Container, .* 6 docker provider\)\n",
        out,
    )
    # The weights fan out: each node that has them serves the next (2 rounds for 4 nodes, not 3 copies).
    assert (
        "  qwen3-30b-a3b  /data/models/Qwen3-30B-A3B from gpu-03, verified on every node; round 1: "
        "gpu-03→gpu-04 · round 2: gpu-03→gpu-05, gpu-04→gpu-06" in out
    )
    assert out.rstrip().endswith("→ no mandatory violation")
    assert "Traceback" not in proc.stderr


def test_plan_json_holds_resources_policy_and_capacity(
    prod_plan: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    _, out_dir = prod_plan
    doc = json.loads((out_dir / "plan.json").read_text())
    assert doc["stack"] == "prod" and doc["mode"] == "preview"
    assert {"urn", "type", "name", "parent", "inputs", "dependencies"} <= set(doc["resources"][0])
    assert sum(r["type"] == "llm-cluster:node:GpuNode" for r in doc["resources"]) == 6
    assert doc["policy"]["mandatory"] == 0
    assert set(doc["capacity"]) == {"reasoning", "chat"}
    reasoning = doc["capacity"]["reasoning"]
    # MLA is off on V100 (VLLM_MLA_DISABLE=1); the plan also shows what MLA on would hold.
    assert reasoning["asDeployed"]["mla_enabled"] is False and reasoning["asDeployed"]["fits"] is True
    assert reasoning["mlaOn"]["kv_tokens"] > 5 * reasoning["asDeployed"]["kv_tokens"]
    # And what a third node per instance would give: the weights spread over 24 GPUs, so more KV cache each.
    pp3, deployed = reasoning["pp3"], reasoning["asDeployed"]
    assert pp3["weights_gib_per_gpu"] < deployed["weights_gib_per_gpu"]
    assert (
        pp3["kv_cache_gib_per_gpu"] > deployed["kv_cache_gib_per_gpu"] and pp3["kv_tokens"] > 2 * deployed["kv_tokens"]
    )
    assert set(doc["capacity"]["chat"]) == {"asDeployed"}  # one node per instance: nothing to compare
    assert doc["capacity"]["chat"]["asDeployed"]["fits"] is True
    for rel in doc["artifacts"]:
        assert (out_dir / rel).is_file(), rel
    assert {"graph.mmd", "graph.dot"} <= set(doc["artifacts"])
    assert (out_dir / "graph.mmd").read_text().startswith("flowchart LR\n")


def test_secure_values_stay_secret_everywhere(tmp_path: Path) -> None:
    text = PROD_TEXT + "  llm-cluster:gatewayApiKeys:\n    secure: AAABAHd3...opaque\n"
    path = stack_file(tmp_path, text)
    proc = plan(tmp_path, "--config", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    marker = secret_placeholder("test", "llm-cluster:gatewayApiKeys")
    written = [p.read_text() for p in (tmp_path / "out" / "test").rglob("*") if p.is_file() and p.suffix != ".svg"]
    for text in written + [proc.stdout, proc.stderr]:
        assert marker not in text
        assert "AAABAHd3" not in text
    doc = json.loads((tmp_path / "out" / "test" / "plan.json").read_text())
    assert doc["outputs"]["gatewayApiKeys"] == "[secret]"
    config = [r for r in doc["resources"] if r["name"] == "gateway-config"][0]["inputs"]
    assert config["stdin"] == "[secret]"  # the digests of the given keys travel as a secret


def test_a_leaked_secret_stops_the_plan_before_anything_is_written(tmp_path: Path, monkeypatch, capsys) -> None:
    import plan.__main__ as cli

    stack = load_stack_file(
        stack_file(tmp_path, PROD_TEXT + "  llm-cluster:grafanaAdminPassword:\n    secure: v1:opaque\n")
    )
    marker = stack.secret_values["llm-cluster:grafanaAdminPassword"]
    real = cli.run_main_program

    def leaky(*args, **kwargs):
        run = real(*args, **kwargs)
        run.registrations[0].inputs["note"] = f"password={marker}"
        return run

    monkeypatch.setattr(cli, "run_main_program", leaky)
    assert cli.main(["--config", str(stack.path), "--out", str(tmp_path / "out"), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert (
        "llm-cluster:grafanaAdminPassword: urn:pulumi:test::llm-cluster::llm-cluster:node:GpuNode::gpu-01 "
        "at inputs.note" in err
    )
    assert marker not in err
    assert not (tmp_path / "out").exists()


def test_quiet_prints_only_the_verdict(tmp_path: Path) -> None:
    proc = plan(tmp_path, "--quiet")
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "→ no mandatory violation\n", "")


@pytest.mark.parametrize(
    "edit,expected",
    [
        (
            lambda t: t.replace("tensorParallel: 8         # one replica per node", "tensorParallel: eight"),
            "  pools.chat.tensorParallel: 'eight' is not allowed: expected a whole number",
        ),
        (
            lambda t: t.replace("nodes: [gpu-01, gpu-02]", "nodes: [gpu-01, gpu-20]"),
            "  pools.reasoning.nodes[1]: 'gpu-20' is not a node; nodes are: gpu-01, gpu-02, gpu-03, gpu-04, gpu-05, gpu-06",
        ),
        (
            lambda t: t + "  llm-cluster:sshPrivateKey: not-a-secret\n",
            "  llm-cluster:sshPrivateKey: must be a secret: set it with `pulumi config set --secret sshPrivateKey`",
        ),
        (
            lambda t: t.replace(
                "    gpu-06: {address: 192.168.10.16}",
                "    gpu-06: {address: 192.168.10.16}\n    gpu-06: {address: 192.168.10.17}",
            ),
            "duplicate key 'gpu-06' (the second one would silently win)",
        ),
        (lambda t: t.replace("config:", "config: [", 1), "is not valid YAML"),
        (
            lambda t: t.replace("arch: deepseek-r1", "arch: deepseek-r2"),
            "  models.deepseek-r1.arch: unknown model 'deepseek-r2'; known: deepseek-r1, ",
        ),
    ],
    ids=["bad type", "unknown node", "plaintext secret", "duplicate YAML key", "broken YAML", "unknown architecture"],
)
def test_invalid_stacks_exit_2_naming_the_key(tmp_path: Path, edit, expected: str) -> None:
    proc = plan(tmp_path, "--config", str(stack_file(tmp_path, edit(PROD_TEXT))))
    assert proc.returncode == 2
    assert expected in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()  # nothing is planned from an invalid stack


def test_missing_stack_file_exits_2(tmp_path: Path) -> None:
    proc = plan(tmp_path, "--stack", "staging")
    assert proc.returncode == 2
    assert "Pulumi.staging.yaml: stack file not found" in proc.stderr


def test_make_plan_selects_a_stack_file_with_config(tmp_path: Path) -> None:
    path = stack_file(tmp_path, PROD_TEXT, "lab")
    proc = subprocess.run(
        ["make", "-s", "plan", f"CONFIG={path}", f"PLAN_ARGS=--quiet --out {tmp_path}/o"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "→ no mandatory violation"
    assert json.loads((tmp_path / "o" / "lab" / "plan.json").read_text())["stack"] == "lab"


def test_stack_file_secrets_become_opaque_placeholders(tmp_path: Path) -> None:
    path = stack_file(tmp_path, "config:\n  llm-cluster:gateway: {node: a}\n  grafanaAdminPassword: {secure: v1:abc}\n")
    stack = load_stack_file(path)
    key = "llm-cluster:grafanaAdminPassword"
    assert stack.secret_keys == {key}
    assert stack.config[key] == secret_placeholder("test", key) == stack.secret_values[key]
    assert stack.config["llm-cluster:gateway"] == {"node": "a"}


def _reg(name: str, inputs: dict, parent: str = "", custom: bool = True, deps: list[str] | None = None) -> Registration:
    return Registration(
        f"urn:{name}", "t:m:T" if custom else "llm-cluster:x:C", name, parent, custom, inputs, deps or [], {}, "", {}
    )


def test_leak_check_finds_secrets_outside_their_envelope() -> None:
    secret = {"llm-cluster:sshPrivateKey": secret_placeholder("s", "llm-cluster:sshPrivateKey")}
    marker = secret["llm-cluster:sshPrivateKey"]
    wrapped = _reg("ok", {"connection": {SIG: SECRET_SIG, "value": {"privateKey": marker}}})
    leaked = _reg("bad", {"envs": ["A=1", f"KEY={marker}"]})
    leaks = find_leaks([wrapped, leaked], secret)
    assert [(leak.urn, leak.path, leak.secret_key) for leak in leaks] == [
        ("urn:bad", "inputs.envs[1]", "llm-cluster:sshPrivateKey")
    ]


def test_component_graph_folds_resource_dependencies_onto_components() -> None:
    node = _reg("gpu-01", {}, custom=False)
    hosts = _reg("gpu-01-hosts", {}, parent="urn:gpu-01")
    server = _reg("chat-gpu-01", {}, custom=False)
    container = _reg("chat-gpu-01-vllm", {}, parent="urn:chat-gpu-01", deps=["urn:gpu-01-hosts"])
    graph = component_graph([node, hosts, server, container])
    assert graph.edges == [("urn:gpu-01", "urn:chat-gpu-01")]
    assert mermaid(graph) == (
        'flowchart LR\n  subgraph C\n    c0["gpu-01"]\n    c1["chat-gpu-01"]\n  end\n  c0 --> c1\n'
    )


def test_reference_yaml_has_no_secret_values() -> None:
    config = yaml.safe_load(PROD_TEXT)["config"]
    assert not any(isinstance(v, dict) and "secure" in v for v in config.values())


def test_policy_config_lowers_a_rule_and_bad_config_exits_2(tmp_path: Path) -> None:
    bf16 = stack_file(
        tmp_path, PROD_TEXT.replace("      dtype: half               # V100 has no bf16", "      dtype: bfloat16")
    )
    refused = plan(tmp_path, "--config", str(bf16), "--quiet")
    assert refused.returncode == 1
    lowered = tmp_path / "policy.json"
    # bf16 on V100 is refused twice on the GPTQ pool: the GPU has no bf16, and vLLM's gptq takes float16 only.
    lowered.write_text('{"gpu-dtype": "advisory", "quantization-dtype": "advisory"}')
    assert plan(tmp_path, "--config", str(bf16), "--quiet", "--policy-config", str(lowered)).returncode == 0
    lowered.write_text('{"gpu-dtype": "sometimes"}')
    bad = plan(tmp_path, "--config", str(bf16), "--policy-config", str(lowered))
    assert bad.returncode == 2
    assert "gpu-dtype: enforcement level 'sometimes' is not one of" in bad.stderr


def test_a_config_the_program_refuses_exits_2_without_traceback(tmp_path: Path) -> None:
    # The key file is read when the program runs (its content becomes a secret): a missing one is
    # the program's own RunError, reported like any invalid config.
    text = PROD_TEXT.replace("    agent: true\n", "    agent: false\n    keyPath: /nonexistent/id_ed25519\n")
    proc = plan(tmp_path, "--config", str(stack_file(tmp_path, text)))
    assert proc.returncode == 2, proc.stderr
    assert "ssh.keyPath" in proc.stderr and "/nonexistent/id_ed25519" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_pool_the_planner_cannot_model_still_plans_and_the_pack_names_the_fault(tmp_path: Path) -> None:
    text = PROD_TEXT.replace("tensorParallel: 8         # one replica per node", "tensorParallel: 3")
    proc = plan(tmp_path, "--config", str(stack_file(tmp_path, text)))
    assert proc.returncode == 1, proc.stderr
    assert (
        "  chat       asDeployed  capacity not estimated: qwen3-30b-a3b has 32 attention heads, not "
        "divisible by tensor parallel size 3" in proc.stdout
    )
    assert "[mandatory] parallelism · chat-gpu-03" in proc.stdout
    assert "Traceback" not in proc.stderr


def test_each_run_gets_its_own_root_stack() -> None:
    from tests.conftest import prod_config, run_stack

    for name in ("alpha", "beta"):
        run = run_stack(prod_config(), stack=name)
        assert run.get("gpu-01").parent == f"urn:pulumi:{name}::llm-cluster::pulumi:pulumi:Stack::llm-cluster-{name}"
