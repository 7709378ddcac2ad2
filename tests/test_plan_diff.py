"""The plan diff: create/update/replace/delete from the providers' own replace rules, and the service impact."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from components.spec import StackSpec
from plan import __main__ as cli
from plan.diff import diff_resources, load_replace_rules, replace_inputs_from_schema, service_impact, summary_line
from plan.harness import UNKNOWN
from plan.stackfile import secret_placeholder
from tests.conftest import prod_config
from tests.support.plans import plan_twice, write_stack

ROOT = Path(__file__).resolve().parent.parent
SCHEMAS = ROOT / "tests" / "fixtures" / "schemas"
NS = "llm-cluster"
CONTAINER_TYPE = "docker:index/container:Container"


def by_name(diff: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in diff["resources"]}


def test_replace_rules_are_the_provider_schemas_own() -> None:
    data = json.loads((ROOT / "plan" / "provider_replace.json").read_text())
    derived = {
        **replace_inputs_from_schema(json.loads((SCHEMAS / "docker-5.2.schema.json").read_text())),
        **replace_inputs_from_schema(json.loads((SCHEMAS / "command-1.2.1.schema.json").read_text())),
    }
    assert {t: e["inputs"] for t, e in data["types"].items()} == derived
    rules = load_replace_rules()
    container, cite = rules["docker:index/container:Container"]
    assert {"image", "envs", "command", "uploads", "labels", "volumes", "deviceCgroupRules"} <= container
    assert not {"restart", "healthcheck", "destroyGraceSeconds", "wait", "mustRun"} & container
    assert cite == "docker provider schema: willReplaceOnChanges"
    assert rules["command:remote:Command"][0] == {"triggers"}


def test_an_unchanged_stack_changes_nothing(tmp_path: Path) -> None:
    plan = plan_twice(tmp_path, prod_config(), prod_config())
    diff = plan["diff"]
    assert diff["resources"] == [] and diff["pools"] == {} and diff["services"] == {}
    assert diff["summary"]["unchanged"] == len(plan["resources"])
    assert diff["against"] == str(tmp_path / "out" / "prod" / "previous" / "plan.json")
    assert json.loads((tmp_path / "out" / "prod" / "previous" / "plan.json").read_text())["stack"] == "prod"
    assert "Resources: " + f"{len(plan['resources'])} unchanged" in (tmp_path / "out" / "prod" / "plan.txt").read_text()


def test_the_first_plan_of_a_stack_says_there_is_nothing_to_compare(tmp_path: Path) -> None:
    write_stack(tmp_path / "Pulumi.prod.yaml", prod_config())
    assert cli.main(["--config", str(tmp_path / "Pulumi.prod.yaml"), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    diff = json.loads((tmp_path / "out" / "prod" / "plan.json").read_text())["diff"]
    assert diff == {"against": None, "note": "no previous plan of this stack: the next plan compares against this one"}


def test_a_new_image_replaces_every_replica_of_the_pool_and_recommends_a_rollout(tmp_path: Path) -> None:
    after = prod_config()
    after[f"{NS}:pools"]["chat"]["image"] = "vllm/vllm-openai:v0.10.2"
    diff = plan_twice(tmp_path, prod_config(), after)["diff"]
    changes = by_name(diff)
    for node in ("gpu-03", "gpu-04", "gpu-05", "gpu-06"):
        vllm = changes[f"chat-{node}-vllm"]
        assert vllm["op"] == "replace" and vllm["delete_before_replace"]
        assert "labels" in vllm["replace_because"] and "image" in vllm["replace_because"]
        assert vllm["replace_source"] == "docker provider schema: willReplaceOnChanges"
        # The gate triggers on the container's id: a new container is checked again.
        health = changes[f"chat-{node}-health"]
        assert health["op"] == "replace" and health["replace_because"] == ["triggers"]
        assert any(c["via"] == f"chat-{node}-vllm" for c in health["changes"])
        assert changes[f"{node}-image-vllm-openai-v0-10-2"]["op"] == "create"
    assert "reasoning-gpu-01-ray-head" not in changes
    chat = diff["pools"]["chat"]
    assert chat["restarted"] == ["chat-gpu-03", "chat-gpu-04", "chat-gpu-05", "chat-gpu-06"]
    assert (chat["downAtOnce"], chat["servingThroughout"], chat["downForMinutes"]) == (4, 0, 30)
    assert "reasoning" not in diff["pools"]
    assert diff["recommendations"][0] == (
        "pool chat: this change restarts 4 of 4 instances at once; roll it out instance by instance instead: "
        "make rollout STACK=prod POOL=chat (maxUnavailable 1)"
    )


def test_a_changed_restart_policy_is_an_update_in_place() -> None:
    before = {
        "mode": "preview",
        "resources": [
            {
                "urn": "urn:pulumi:prod::p::docker:index/container:Container::c",
                "type": "docker:index/container:Container",
                "name": "c",
                "parent": "",
                "custom": True,
                "inputs": {"restart": "no", "image": "x", "labels": [{"label": "llm-cluster.role", "value": "r"}]},
                "dependencies": [],
                "propertyDependencies": {},
                "options": {},
            }
        ],
    }
    after = copy.deepcopy(before)
    after["resources"][0]["inputs"]["restart"] = "unless-stopped"
    [change] = diff_resources(before, after)
    assert (change.op, [c.path for c in change.changes]) == ("update", ["restart"])


def test_a_replaced_resource_replaces_dependents_that_read_its_outputs() -> None:
    image = {
        "urn": "urn:pulumi:a::p::docker:index/remoteImage:RemoteImage::img",
        "type": "docker:index/remoteImage:RemoteImage",
        "name": "img",
        "parent": "",
        "custom": True,
        "inputs": {"name": "repo:1"},
        "dependencies": [],
        "propertyDependencies": {},
        "options": {},
    }
    reader = {
        "urn": "urn:pulumi:a::p::docker:index/container:Container::c",
        "type": "docker:index/container:Container",
        "name": "c",
        "parent": "",
        "custom": True,
        "inputs": {"image": "img-id", "restart": "no"},
        "dependencies": [image["urn"]],
        "propertyDependencies": {"image": [image["urn"]], "restart": []},
        "options": {},
    }
    waiter = {
        **reader,
        "urn": "urn:pulumi:a::p::docker:index/container:Container::w",
        "name": "w",
        "propertyDependencies": {},
    }  # depends_on only: no input reads the image
    before = {"resources": [image, reader, waiter]}
    after = copy.deepcopy(before)
    # Another stack name: the plan of another branch or CI compares as the same resources.
    for r in after["resources"]:
        r["urn"] = r["urn"].replace("urn:pulumi:a::", "urn:pulumi:b::")
    after["resources"][0]["inputs"]["name"] = "repo:2"
    changes = {c.name: c for c in diff_resources(before, after)}
    assert changes["img"].op == "replace" and changes["img"].replace_because == ["name"]
    assert changes["c"].op == "replace" and [(c.path, c.via) for c in changes["c"].changes] == [("image", "img")]
    assert "w" not in changes


def test_the_summary_line_reads_like_pulumi_preview() -> None:
    assert (
        summary_line({"create": 3, "update": 0, "replace": 7, "delete": 5, "unchanged": 84})
        == "Resources: + 3 to create · +- 7 to replace · - 5 to delete · 84 unchanged"
    )


def test_secrets_stay_masked_in_the_diff(tmp_path: Path) -> None:
    before, after = prod_config(), prod_config()
    after[f"{NS}:gateway"]["apiKeys"].append({"id": "team-b"})
    stack, out = tmp_path / "Pulumi.prod.yaml", tmp_path / "out"
    for config in (before, after):
        write_stack(stack, config, {f"{NS}:gatewayApiKeys": "v1:AAAA"})
        assert cli.main(["--config", str(stack), "--out", str(out), "--quiet"]) in (0, 1)
    text = (out / "prod" / "plan.json").read_text() + (out / "prod" / "plan.txt").read_text()
    assert secret_placeholder("prod", f"{NS}:gatewayApiKeys") not in text
    plan = json.loads((out / "prod" / "plan.json").read_text())
    changes = by_name(plan["diff"])
    # A new key is an update of the gateway's config command (it reloads nginx), never a new container.
    assert "gateway-nginx" not in changes
    assert (changes["gateway-config"]["op"], [c["path"] for c in changes["gateway-config"]["changes"]]) == (
        "update",
        ["create"],
    )
    assert plan["diff"]["services"]["gateway"] == {"reload": ["gateway-nginx"]}
    # The digests travel as a secret on stdin: "[secret]" on both sides, so no value to show or compare.
    config = next(r for r in plan["resources"] if r["name"] == "gateway-config")
    assert config["inputs"]["stdin"] == "[secret]"


def test_against_another_plan_and_a_bad_against_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stack = write_stack(tmp_path / "Pulumi.prod.yaml", prod_config())
    assert cli.main(["--config", str(stack), "--out", str(tmp_path / "a"), "--quiet"]) == 0
    base = tmp_path / "a" / "prod" / "plan.json"
    assert cli.main(["--config", str(stack), "--out", str(tmp_path / "b"), "--quiet", "--against", str(base)]) == 0
    assert json.loads((tmp_path / "b" / "prod" / "plan.json").read_text())["diff"]["against"] == str(base)
    assert (
        cli.main(["--config", str(stack), "--out", str(tmp_path / "b"), "--against", str(tmp_path / "nope.json")]) == 2
    )
    assert "--against" in capsys.readouterr().err


def test_a_monitoring_config_change_reloads_prometheus_and_replaces_no_container(tmp_path: Path) -> None:
    after = prod_config()
    after[f"{NS}:monitoring"]["thresholds"] = {"forMinutes": 10}
    after[f"{NS}:monitoring"]["scrapeIntervalSeconds"] = 30
    diff = plan_twice(tmp_path, prod_config(), after)["diff"]
    changed = {c["name"]: c["op"] for c in diff["resources"] if c["custom"]}
    assert changed == {"monitoring-prometheus-config": "update", "monitoring-grafana-config": "update"}
    assert [c["path"] for c in by_name(diff)["monitoring-prometheus-config"]["changes"]] == ["create"]
    assert diff["services"] == {
        "prometheus": {"reload": ["monitoring-gpu-01-prometheus"]},
        "grafana": {"reload": ["monitoring-gpu-01-grafana"]},
    }
    assert diff["pools"] == {} and diff["summary"]["replace"] == 0


def test_a_new_grafana_password_replaces_grafana_through_replace_with(tmp_path: Path) -> None:
    stack, out = tmp_path / "Pulumi.prod.yaml", tmp_path / "out"
    for ciphertext in ("v1:AAAA", "v1:BBBB"):
        write_stack(stack, prod_config(), {f"{NS}:grafanaAdminPassword": ciphertext})
        assert cli.main(["--config", str(stack), "--out", str(out), "--quiet"]) in (0, 1)
    # The plan never sees a secret's value (only a placeholder per key): a new ciphertext is no change here.
    assert json.loads((out / "prod" / "plan.json").read_text())["diff"]["resources"] == []
    before = json.loads((out / "prod" / "plan.json").read_text())
    after = copy.deepcopy(before)
    password = next(r for r in after["resources"] if r["name"] == "monitoring-grafana-admin-password")
    password["inputs"]["triggers"] = ["[secret]", "another"]
    changes = {c.name: c for c in diff_resources(before, after)}
    assert changes["monitoring-grafana-admin-password"].op == "replace"
    grafana = changes["monitoring-gpu-01-grafana"]
    assert (grafana.op, grafana.replace_because, grafana.replace_source) == (
        "replace",
        ["replaceWith monitoring-grafana-admin-password"],
        "the resource's replaceWith option",
    )


def _gpu_container(name: str, node: str, **gpus: Any) -> dict[str, Any]:
    return {
        "urn": f"urn:pulumi:s::p::docker:index/container:Container::{name}",
        "type": "docker:index/container:Container",
        "name": name,
        "parent": "",
        "custom": True,
        "node": node,
        "dependencies": [],
        "propertyDependencies": {},
        "options": {},
        "inputs": {"labels": [{"label": "llm-cluster.instance", "value": name}], **gpus},
    }


@pytest.mark.parametrize(
    ("old", "new", "warned"),
    [
        ({"gpus": "all"}, {"gpus": "all"}, True),
        ({"deviceRequests": [{"deviceIds": ["0", "1"]}]}, {"deviceRequests": [{"deviceIds": ["1", "2"]}]}, True),
        ({"deviceRequests": [{"deviceIds": ["0", "1"]}]}, {"deviceRequests": [{"deviceIds": ["2", "3"]}]}, False),
    ],
)
def test_a_new_server_on_gpus_a_deleted_one_holds_is_flagged(
    old: dict[str, Any], new: dict[str, Any], warned: bool, prod_spec: StackSpec
) -> None:
    before = {"resources": [_gpu_container("blue", "n1", **old)]}
    after = {"resources": [_gpu_container("green", "n1", **new)]}
    impact = service_impact(diff_resources(before, after), before, after, prod_spec)
    flagged = [r for r in impact["recommendations"] if r.startswith("node n1: green would start while blue")]
    assert bool(flagged) is warned


def test_redacted_credentials_compare_as_they_were_written(tmp_path: Path) -> None:
    config = prod_config()
    config[f"{NS}:pools"]["chat"]["env"] = {"HF_TOKEN": "hf_" + "a1B2c3D4e5" * 4}
    plan = plan_twice(tmp_path, config, config)
    assert "hf_a1B2" not in json.dumps(plan)
    assert plan["diff"]["resources"] == []


@pytest.mark.parametrize("order", ["command first", "container first"])
def test_a_changed_sibling_command_with_the_container_kept_is_a_reload(order: str, prod_spec: StackSpec) -> None:
    parent = "urn:pulumi:s::p::llm-cluster:gateway:Gateway::gw"
    cmd = {
        "urn": "urn:pulumi:s::p::command:remote:Command::gw-config",
        "type": "command:remote:Command",
        "name": "gw-config",
        "parent": parent,
        "custom": True,
        "inputs": {"create": "write v1; nginx -s reload"},
        "dependencies": [],
        "propertyDependencies": {},
        "options": {"replaceOnChanges": ["triggers[*]"]},
    }
    nginx = {
        "urn": "urn:pulumi:s::p::docker:index/container:Container::gw-nginx",
        "type": CONTAINER_TYPE,
        "name": "gw-nginx",
        "parent": parent,
        "custom": True,
        "dependencies": [],
        "propertyDependencies": {},
        "options": {},
        "inputs": {"image": "nginx", "labels": [{"label": "llm-cluster.role", "value": "gateway"}]},
    }
    if order == "command first":
        nginx["dependencies"] = [cmd["urn"]]
    else:
        cmd["dependencies"] = [nginx["urn"]]
    before = {"resources": [cmd, nginx]}
    after = copy.deepcopy(before)
    after["resources"][0]["inputs"]["create"] = "write v2; nginx -s reload"
    changes = diff_resources(before, after)
    assert [(c.name, c.op) for c in changes] == [("gw-config", "update")]
    assert service_impact(changes, before, after, prod_spec)["services"] == {"gateway": {"reload": ["gw-nginx"]}}


def test_an_unreadable_previous_plan_is_said_and_replaced(tmp_path: Path) -> None:
    stack = write_stack(tmp_path / "Pulumi.prod.yaml", prod_config())
    out = tmp_path / "out" / "prod"
    out.mkdir(parents=True)
    (out / "plan.json").write_text('{"resources": [')  # cut short
    assert cli.main(["--config", str(stack), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    diff = json.loads((out / "plan.json").read_text())["diff"]
    assert diff == {
        "against": None,
        "note": f"{out / 'previous' / 'plan.json'} is not a plan.json: nothing to compare against",
    }


# --- every replace cause the diff knows, one row each (and the near miss beside it) --------------------

IMG = "docker:index/remoteImage:RemoteImage"
CMD = "command:remote:Command"


def _res(name: str, type_: str, inputs: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "urn": f"urn:pulumi:s::p::{type_}::{name}",
        "type": type_,
        "name": name,
        "parent": "",
        "custom": True,
        "inputs": inputs,
        "dependencies": [],
        "propertyDependencies": {},
        "options": {},
        **extra,
    }


def _img_urn() -> str:
    return f"urn:pulumi:s::p::{IMG}::img"


# name -> (the resource before, its inputs after (None: unchanged), whether the image is replaced too,
#          expected (op, replace_because, replace_source, delete_before_replace, [(path, before, after, via)])).
DOCKER = "docker provider schema: willReplaceOnChanges"
COMMAND = "command provider schema: replaceOnChanges"
REPLACE_CAUSES: dict[str, tuple[dict[str, Any], dict[str, Any] | None, bool, tuple[Any, ...] | None]] = {
    "an input the provider's schema replaces on": (
        _res("c", CONTAINER_TYPE, {"image": "a", "restart": "no"}),
        {"image": "b", "restart": "no"},
        False,
        ("replace", ["image"], DOCKER, False, [("image", "a", "b", None)]),
    ),
    "an input the schema updates in place": (
        _res("c", CONTAINER_TYPE, {"image": "a", "restart": "no"}),
        {"image": "a", "restart": "always"},
        False,
        ("update", [], None, False, [("restart", "no", "always", None)]),
    ),
    "a command's triggers (its schema)": (
        _res("k", CMD, {"create": "x", "triggers": ["h1"]}),
        {"create": "x", "triggers": ["h2"]},
        False,
        ("replace", ["triggers"], COMMAND, False, [("triggers", '["h1"]', '["h2"]', None)]),
    ),
    "a command's script alone (updated in place)": (
        _res("k", CMD, {"create": "x", "triggers": ["h1"]}),
        {"create": "y", "triggers": ["h1"]},
        False,
        ("update", [], None, False, [("create", "x", "y", None)]),
    ),
    "the resource's replaceOnChanges naming the input": (
        _res("c", CONTAINER_TYPE, {"restart": "no"}, options={"replaceOnChanges": ["restart"]}),
        {"restart": "always"},
        False,
        ("replace", ["restart"], "the resource's replaceOnChanges option", False, [("restart", "no", "always", None)]),
    ),
    "replaceOnChanges on a path inside an input (environment.*)": (
        _res("k", CMD, {"environment": {"A": "1"}}, options={"replaceOnChanges": ["environment.*"]}),
        {"environment": {"A": "2"}},
        False,
        (
            "replace",
            ["environment"],
            "the resource's replaceOnChanges option",
            False,
            [("environment.A", "1", "2", None)],
        ),
    ),
    "replaceOnChanges on an input nested two deep": (
        _res("k", CMD, {"connection": {"host": {"name": "a"}}}, options={"replaceOnChanges": ["connection"]}),
        {"connection": {"host": {"name": "b"}}},
        False,
        (
            "replace",
            ["connection"],
            "the resource's replaceOnChanges option",
            False,
            [("connection.host.name", "a", "b", None)],
        ),
    ),
    "an ignored list of objects whose item changed (labels[0].value)": (
        _res("c", CONTAINER_TYPE, {"labels": [{"label": "a", "value": "1"}]}, options={"ignoreChanges": ["labels"]}),
        {"labels": [{"label": "a", "value": "2"}]},
        False,
        None,
    ),
    "reading the output of a resource it did not read before": (
        _res("c", CONTAINER_TYPE, {"image": "img-id"}),
        None,
        False,
        ("replace", ["image"], DOCKER, False, [("image", None, None, "img")]),
    ),
    "replaceOnChanges '*'": (
        _res("c", CONTAINER_TYPE, {"restart": "no"}, options={"replaceOnChanges": ["*"]}),
        {"restart": "always"},
        False,
        ("replace", ["restart"], "the resource's replaceOnChanges option", False, [("restart", "no", "always", None)]),
    ),
    "replaceOnChanges naming another input": (
        _res("c", CONTAINER_TYPE, {"restart": "no"}, options={"replaceOnChanges": ["labels"]}),
        {"restart": "always"},
        False,
        ("update", [], None, False, [("restart", "no", "always", None)]),
    ),
    "deleteBeforeReplace": (
        _res("c", CONTAINER_TYPE, {"image": "a"}, options={"deleteBeforeReplace": True}),
        {"image": "b"},
        False,
        ("replace", ["image"], DOCKER, True, [("image", "a", "b", None)]),
    ),
    "an ignored input that would replace": (
        _res("c", CONTAINER_TYPE, {"image": "a"}, options={"ignoreChanges": ["image"]}),
        {"image": "b"},
        False,
        None,
    ),
    "an input unknown at preview": (_res("c", CONTAINER_TYPE, {"image": "a"}), {"image": UNKNOWN}, False, None),
    "a component (nothing to replace)": (
        _res("g", "llm-cluster:index:Pool", {"image": "a"}, custom=False, options={"replaceOnChanges": ["*"]}),
        {"image": "b"},
        False,
        ("update", [], None, False, [("image", "a", "b", None)]),
    ),
    "replaceWith a replaced resource": (
        _res("c", CONTAINER_TYPE, {"restart": "no"}, options={"replaceWith": [_img_urn()]}),
        None,
        True,
        ("replace", ["replaceWith img"], "the resource's replaceWith option", False, []),
    ),
    "replaceWith a resource that stays": (
        _res("c", CONTAINER_TYPE, {"restart": "no"}, options={"replaceWith": [_img_urn()]}),
        None,
        False,
        None,
    ),
    "reading a replaced resource's output into a forcing input": (
        _res("c", CONTAINER_TYPE, {"image": "img-id"}, propertyDependencies={"image": [_img_urn()]}),
        None,
        True,
        ("replace", ["image"], DOCKER, False, [("image", None, None, "img")]),
    ),
    "reading a replaced resource's output into an in-place input": (
        _res("c", CONTAINER_TYPE, {"restart": "x"}, propertyDependencies={"restart": [_img_urn()]}),
        None,
        True,
        ("update", [], None, False, [("restart", None, None, "img")]),
    ),
    "reading an output of a resource that stays": (
        _res("c", CONTAINER_TYPE, {"image": "img-id"}, propertyDependencies={"image": [_img_urn()]}),
        None,
        False,
        None,
    ),
}


@pytest.mark.parametrize("cause", list(REPLACE_CAUSES))
def test_each_replace_cause_alone(cause: str) -> None:
    resource, inputs_after, image_replaced, expected = REPLACE_CAUSES[cause]
    image = _res("img", IMG, {"name": "repo:1"})
    before = {"resources": [image, resource]}
    after = copy.deepcopy(before)
    if inputs_after is not None:
        after["resources"][1]["inputs"] = inputs_after
    if cause == "reading the output of a resource it did not read before":
        after["resources"][1]["propertyDependencies"] = {"image": [image["urn"]]}
    if image_replaced:
        after["resources"][0]["inputs"]["name"] = "repo:2"
    changes = {c.name: c for c in diff_resources(before, after)}
    assert ("img" in changes) == image_replaced
    got = changes.get(resource["name"])
    assert (
        None
        if got is None
        else (
            got.op,
            got.replace_because,
            got.replace_source,
            got.delete_before_replace,
            [(c.path, c.before, c.after, c.via) for c in got.changes],
        )
    ) == expected


def test_created_and_deleted_resources_keep_their_node_parent_and_kind() -> None:
    kept = _res("k", CMD, {"create": "x"})
    gone = _res("old", "llm-cluster:index:Pool", {}, custom=False, node="gpu-01", parent="urn:p")
    new = _res("new", CONTAINER_TYPE, {}, node="gpu-02", parent="urn:q")
    # Written by an older plan: no parent, no custom (a custom resource at the top).
    bare_new = {k: v for k, v in _res("bare-new", CMD, {}).items() if k not in ("parent", "custom")}
    bare_gone = {k: v for k, v in _res("bare-gone", CMD, {}).items() if k not in ("parent", "custom")}
    changes = diff_resources({"resources": [gone, kept, bare_gone]}, {"resources": [new, kept, bare_new]})
    assert [(c.urn, c.type, c.name, c.op, c.node, c.parent, c.custom) for c in changes] == [
        (new["urn"], CONTAINER_TYPE, "new", "create", "gpu-02", "urn:q", True),
        (bare_new["urn"], CMD, "bare-new", "create", None, "", True),
        (gone["urn"], "llm-cluster:index:Pool", "old", "delete", "gpu-01", "urn:p", False),
        (bare_gone["urn"], CMD, "bare-gone", "delete", None, "", True),
    ]
    # A plan with no resources at all (an empty stack), on either side.
    assert [(c.name, c.op) for c in diff_resources({}, {"resources": [kept]})] == [("k", "create")]
    assert [(c.name, c.op) for c in diff_resources({"resources": [kept]}, {})] == [("k", "delete")]


def test_resources_are_matched_by_type_and_name_whatever_the_stack() -> None:
    # Two resources share a name across types: only the changed one changes. A URN without '::' is its own key.
    a, b = _res("same", CONTAINER_TYPE, {"image": "a"}), _res("same", CMD, {"create": "x"})
    plain = {**_res("p", CMD, {"create": "x"}), "urn": "plain"}
    after = copy.deepcopy([a, b, plain])
    after[1]["inputs"]["create"] = "y"
    after[2]["inputs"]["create"] = "y"
    changes = diff_resources({"resources": [a, b, plain]}, {"resources": after})
    assert [(c.type, c.name, c.op) for c in changes] == [(CMD, "same", "update"), (CMD, "p", "update")]


def test_the_replace_rules_given_are_the_ones_used() -> None:
    before = {"resources": [_res("c", CONTAINER_TYPE, {"image": "a"})]}
    after = {"resources": [_res("c", CONTAINER_TYPE, {"image": "b"})]}
    assert [c.op for c in diff_resources(before, after, rules={})] == ["update"]
    assert [c.op for c in diff_resources(before, after, rules={CONTAINER_TYPE: (frozenset({"image"}), "x")})] == [
        "replace"
    ]


def test_a_schema_without_resources_or_inputs_has_no_replace_inputs() -> None:
    assert replace_inputs_from_schema({}) == {}
    assert replace_inputs_from_schema({"resources": {"t": {}}}) == {}
