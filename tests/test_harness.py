"""plan/harness.py answers as the engine does: a first `pulumi preview` (nothing exists: ids and computed
outputs unknown), `pulumi up` (opaque ids, computed outputs, what commands print), duplicate URNs refused;
and the policy pack judges every resource of a preview, never "can't run during preview"."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pulumi
import pytest
import yaml
from pulumi_command import remote

from plan.analyze import analyze
from plan.harness import UNKNOWN, DuplicateUrnError, ProgramRun, run_program
from plan.secrets import find_leaks, unmarked_outputs
from tests.conftest import ROOT, prod_config, run_stack
from tests.support.policies import ONE_CHANGE

NS = "llm-cluster:"
CONTAINER = "docker:index/container:Container"
COMMAND = "command:remote:Command"
PROVIDER = "pulumi:providers:docker"


def test_a_preview_knows_no_id_and_no_computed_output(prod_preview_run: ProgramRun) -> None:
    custom = [r for r in prod_preview_run.registrations if r.custom]
    assert {r.type for r in custom} >= {CONTAINER, COMMAND, PROVIDER, "docker:index/remoteImage:RemoteImage"}
    # A create answers with no id (the SDK makes it unknown); a new provider's id is the engine's sentinel.
    assert {r.resource_id for r in custom if r.type != PROVIDER} == {""}
    assert {r.resource_id for r in custom if r.type == PROVIDER} == {UNKNOWN}
    # What only the provider computes is absent: unknown to the program…
    for r in prod_preview_run.by_type(COMMAND):
        assert "stdout" not in r.state, r.name
    for r in prod_preview_run.by_type("docker:index/remoteImage:RemoteImage"):
        assert "imageId" not in r.state and r.state["name"] == r.plain_inputs()["name"]
    # …so every input made of it is unknown: images, and triggers on another resource's id.
    for r in prod_preview_run.by_type(CONTAINER):
        assert r.plain_inputs()["image"] == UNKNOWN, r.name
    assert prod_preview_run.get("gateway-ready").plain_inputs()["triggers"] == [UNKNOWN]


def test_up_answers_with_opaque_unique_ids_and_the_computed_outputs(prod_run: ProgramRun) -> None:
    custom = [r for r in prod_run.registrations if r.custom]
    ids = [r.resource_id for r in custom]
    assert all(ids) and len(set(ids)) == len(ids)
    assert not any(r.name in r.resource_id for r in custom)  # nothing a test could guess
    nginx = prod_run.get("gateway-nginx")
    image = prod_run.get("gateway-image")  # built on gpu-01 (components/planning/gateway/image.py)
    assert nginx.plain_inputs()["image"] == image.state["imageId"] != UNKNOWN
    assert prod_run.get("gateway-ready").plain_inputs()["triggers"] == [nginx.resource_id]


def test_up_gives_the_hosts_generated_secrets_to_the_leak_check(prod_run: ProgramRun) -> None:
    made = prod_run.generated_secrets()
    keys, password = prod_run.get("gateway-keys"), prod_run.get("monitoring-grafana-admin-password")
    assert made == {f"{keys.urn}.stdout": keys.state["stdout"], f"{password.urn}.stdout": password.state["stdout"]}
    assert len(set(made.values())) == 2
    # Exported as secrets, so masked where shown…
    assert prod_run.stack_outputs["gatewayApiKeys"] == prod_run.stack_outputs["grafanaAdminPassword"] == "[secret]"
    assert prod_run.secret_output_values == {
        "gatewayApiKeys": keys.state["stdout"],
        "grafanaAdminPassword": password.state["stdout"],
    }
    # …and nowhere in plaintext, the state included.
    assert find_leaks(prod_run.registrations, made) == [] and unmarked_outputs(prod_run) == []


def test_a_preview_knows_no_host_made_secret(prod_preview_run: ProgramRun) -> None:
    assert prod_preview_run.generated_secrets() == {} and prod_preview_run.secret_output_values == {}


def _program_with_a_host_made_secret(*, mark_secret: bool, leak_into: str | None) -> None:
    conn = remote.ConnectionArgs(host="198.18.0.2")
    opts = pulumi.ResourceOptions(additional_secret_outputs=["stdout"] if mark_secret else None)
    made = remote.Command("make-key", connection=conn, create="openssl rand -hex 16", opts=opts)
    pulumi.export("key", pulumi.Output.secret(made.stdout))
    if leak_into is not None:
        remote.Command("use-key", connection=conn, create=made.stdout.apply(lambda k: f"{leak_into} {k}"))


@pytest.mark.parametrize(
    ("mark_secret", "leak_into", "found"),
    [
        (True, None, []),
        # stdout not marked: the engine's state would hold the key in plaintext.
        (False, None, [("make-key", "outputs.stdout (not in additional_secret_outputs)")]),
        # marked, but .apply()'d into another resource's plain input.
        (True, "echo", [("use-key", "inputs.create")]),
    ],
)
def test_the_leak_check_sees_a_host_made_secret_wherever_it_escapes(
    mark_secret: bool, leak_into: str | None, found: list[tuple[str, str]]
) -> None:
    run = run_program(lambda: _program_with_a_host_made_secret(mark_secret=mark_secret, leak_into=leak_into), {}, set())
    made = run.generated_secrets()
    assert list(made) == [f"{run.get('make-key').urn}.stdout"]
    leaks = find_leaks(run.registrations, made) + unmarked_outputs(run)
    assert [(leak.urn.rsplit("::", 1)[1], leak.path) for leak in leaks] == found


def test_the_plan_refuses_to_write_a_host_made_secret_it_would_print(tmp_path: Path) -> None:
    # With keys generated on the gateway host, --up knows them: the plan must still print none.
    out = subprocess.run(
        [sys.executable, "-m", "plan", "--up", "--quiet", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    written = "".join(p.read_text(errors="replace") for p in tmp_path.rglob("*") if p.is_file())
    run = run_stack(prod_config())
    for value in run.generated_secrets().values():
        assert value not in written and value not in out.stdout + out.stderr


def test_a_duplicate_urn_is_refused_as_the_engine_does() -> None:
    def program() -> None:
        remote.Command("same", connection=remote.ConnectionArgs(host="198.18.0.2"), create="true")
        remote.Command("same", connection=remote.ConnectionArgs(host="198.18.0.3"), create="true")

    with pytest.raises(Exception) as err:
        run_program(program, {}, set())
    assert err.errisinstance(DuplicateUrnError) or "Duplicate resource URN" in str(err.value)
    assert (
        "Duplicate resource URN 'urn:pulumi:prod::llm-cluster::command:remote:Command::same'; "
        "try giving it a unique name"
    ) in str(err.value)


def _cant_run(violations: list[Any]) -> list[tuple[str, str]]:
    return sorted((v.policy_name, v.resource_name) for v in violations if "can't run policy" in v.message)


def _with_every_secret(config: dict[str, Any]) -> tuple[dict[str, Any], set[str]]:
    config[NS + "grafanaAdminPassword"] = "plan-secret-0000000000000001"
    config[NS + "alertmanagerConfig"] = "route: {receiver: x}\nreceivers: [{name: x}]\n"
    config[NS + "monitoring"]["alertmanager"] = {"image": "prom/alertmanager:v0.27.0", "port": 9093}
    return config, {NS + "grafanaAdminPassword", NS + "alertmanagerConfig"}


STACKS: dict[str, Callable[[], tuple[dict[str, Any], set[str]]]] = {
    "reference": lambda: (prod_config(), set()),
    "configured-secrets": lambda: _with_every_secret(prod_config()),
}


def _one_change(name: str) -> Callable[[], tuple[dict[str, Any], set[str]]]:
    def make() -> tuple[dict[str, Any], set[str]]:
        config = prod_config()
        ONE_CHANGE[name][0](config)
        return config, set()

    return make


# Stacks the pack refuses, one rule each (tests/test_policy_e2e.py): a violation, too, must be found at preview.
STACKS.update({f"one-change-{n}": _one_change(n) for n in ONE_CHANGE})


@pytest.mark.parametrize("stack", sorted(STACKS))
def test_the_pack_judges_every_resource_at_preview_as_at_up(stack: str) -> None:
    config, secrets = STACKS[stack]()
    preview = analyze(run_stack(config, secrets, preview=True).registrations)
    up = analyze(run_stack(config, secrets).registrations)
    assert _cant_run(preview) == [] and _cant_run(up) == []
    verdicts = lambda vs: sorted((v.policy_name, v.enforcement_level, v.resource_name, v.message) for v in vs)  # noqa: E731
    assert verdicts(preview) == verdicts(up)


def test_a_preview_of_every_example_stack_leaves_no_policy_blind(tmp_path: Path) -> None:
    for path in sorted(ROOT.glob("Pulumi.*.yaml")):
        if path.name == "Pulumi.yaml":
            continue
        doc = yaml.safe_load(path.read_text())
        out = subprocess.run(
            [sys.executable, "-m", "plan", "--quiet", "--config", str(path), "--out", str(tmp_path)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode in (0, 1), (path.name, out.stderr)
        plan = json.loads(
            (tmp_path / path.name.removeprefix("Pulumi.").removesuffix(".yaml") / "plan.json").read_text()
        )
        blind = [v for v in plan["policy"]["violations"] if "can't run policy" in v["message"]]
        assert blind == [], (path.name, doc is not None, blind)


def test_urns_are_the_engines_the_type_qualified_by_every_parent_but_the_stack() -> None:
    def program() -> None:
        outer = pulumi.ComponentResource("t:m:Outer", "outer")
        inner = pulumi.ComponentResource("t:m:Inner", "inner", opts=pulumi.ResourceOptions(parent=outer))
        remote.Command(
            "leaf",
            connection=remote.ConnectionArgs(host="198.18.0.2"),
            create="true",
            opts=pulumi.ResourceOptions(parent=inner),
        )

    run = run_program(program, {}, set(), stack="dev")
    assert [r.urn for r in run.registrations] == [
        "urn:pulumi:dev::llm-cluster::t:m:Outer::outer",
        "urn:pulumi:dev::llm-cluster::t:m:Outer$t:m:Inner::inner",
        "urn:pulumi:dev::llm-cluster::t:m:Outer$t:m:Inner$command:remote:Command::leaf",
    ]


def test_a_run_after_asyncio_run_left_the_thread_without_a_loop_still_runs() -> None:
    import asyncio

    async def nothing() -> None:
        return None

    asyncio.run(nothing())  # leaves the main thread with no current event loop, as real tests do
    run = run_stack(prod_config())
    assert any(r.type == CONTAINER for r in run.registrations)
