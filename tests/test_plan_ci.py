"""The plan in CI: byte-identical outputs across runs of the same input, SARIF 2.1.0 and JUnit XML
verdicts valid against their published schemas, and no BrokenPipe traceback from any CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from lxml import etree

from policies.pack import POLICIES
from tests.conftest import ROOT, prod_config


def plan_files(out: Path, seed: str, *args: str) -> dict[str, bytes]:
    """Every file one `python -m plan` run writes, under a given hash seed (set and dict order differ)."""
    env = {**os.environ, "PYTHONHASHSEED": seed}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "plan",
            "--quiet",
            "--out",
            str(out),
            "--sarif",
            str(out / "v.sarif"),
            "--junit",
            str(out / "v.xml"),
            *args,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr.decode()
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def test_two_runs_of_the_same_stack_write_byte_identical_plans(tmp_path: Path) -> None:
    for mode in ([], ["--up"]):
        first = plan_files(tmp_path / f"a{len(mode)}", "1", *mode)
        second = plan_files(tmp_path / f"b{len(mode)}", "2", *mode)
        assert {"prod/plan.txt", "prod/plan.json", "v.sarif", "v.xml"} <= set(first)
        assert sorted(first) == sorted(second)
        assert [name for name in first if first[name] != second[name]] == []


SCHEMAS = ROOT / "tests" / "fixtures" / "ci"
NS = "llm-cluster:"


def run_plan(
    tmp_path: Path,
    config: dict[str, Any],
    *args: str,
    name: str = "changed",
    policy_config: dict[str, Any] | None = None,
) -> subprocess.CompletedProcess[bytes]:
    stack = tmp_path / f"Pulumi.{name}.yaml"
    stack.write_text(yaml.safe_dump({"config": config}, sort_keys=False))
    extra = []
    if policy_config is not None:
        (tmp_path / "policy.json").write_text(json.dumps(policy_config))
        extra = ["--policy-config", str(tmp_path / "policy.json")]
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "plan",
            "--quiet",
            "--config",
            str(stack),
            "--out",
            str(tmp_path / "out"),
            *extra,
            *args,
        ],
        cwd=ROOT,
        capture_output=True,
        timeout=300,
    )


def faulty_stack() -> dict[str, Any]:
    """The reference with a mandatory fault on the chat pool and the gateway, and its MLA advisory."""
    config = prod_config()
    config[NS + "models"]["qwen3-30b-a3b"]["dtype"] = "bfloat16"
    config[NS + "gateway"].update(auth=False, apiKeys=[])
    return config


def test_sarif_is_valid_2_1_0_and_points_at_the_key_at_fault(tmp_path: Path) -> None:
    done = run_plan(tmp_path, faulty_stack(), "--sarif", str(tmp_path / "verdicts.sarif"))
    assert done.returncode == 1, done.stderr.decode()
    log = json.loads((tmp_path / "verdicts.sarif").read_text())
    schema = json.loads((SCHEMAS / "sarif-schema-2.1.0.json").read_text())
    jsonschema.Draft4Validator(schema).validate(log)
    results = {(r["ruleId"], r["level"]): r for r in log["runs"][0]["results"]}
    assert set(results) == {("gpu-dtype", "error"), ("gateway-auth", "error"), ("memory-headroom", "warning")}
    lines = (tmp_path / "Pulumi.changed.yaml").read_text().splitlines()
    dtype = results[("gpu-dtype", "error")]
    where = dtype["locations"][0]
    assert where["physicalLocation"]["artifactLocation"]["uri"].endswith("Pulumi.changed.yaml")
    assert lines[where["physicalLocation"]["region"]["startLine"] - 1].strip() == "dtype: bfloat16"
    assert dtype["properties"]["stackKey"] == "models.qwen3-30b-a3b.dtype"
    assert where["logicalLocations"][0]["name"] == "chat-gpu-03"
    auth = results[("gateway-auth", "error")]["locations"][0]["physicalLocation"]
    assert lines[auth["region"]["startLine"] - 1].strip() == "auth: false"
    rules = log["runs"][0]["tool"]["driver"]["rules"]
    assert [r["id"] for r in rules] == sorted(r["id"] for r in rules)
    assert all(rules[r["ruleIndex"]]["id"] == r["ruleId"] for r in log["runs"][0]["results"])


def test_junit_is_valid_with_one_case_per_rule_and_pool(tmp_path: Path) -> None:
    done = run_plan(
        tmp_path, faulty_stack(), "--junit", str(tmp_path / "verdicts.xml"), policy_config={"pinned-images": "disabled"}
    )
    assert done.returncode == 1, done.stderr.decode()
    xml = etree.parse(str(tmp_path / "verdicts.xml"))
    etree.XMLSchema(etree.parse(str(SCHEMAS / "JUnit.xsd"))).assertValid(xml)
    suite = xml.getroot()[0]
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    rules = sorted(p.name for p in POLICIES)
    assert sorted(cases) == sorted(f"{r} {s}" for r in rules for s in ("pools.reasoning", "pools.chat", "stack"))
    failed = sorted(name for name, c in cases.items() if c.find("failure") is not None)
    assert failed == ["gateway-auth stack", "gpu-dtype pools.chat"]
    assert (suite.get("tests"), suite.get("failures")) == (str(len(cases)), "2")
    assert sorted(n for n, c in cases.items() if c.find("skipped") is not None) == [
        "pinned-images pools.chat",
        "pinned-images pools.reasoning",
        "pinned-images stack",
    ]
    failure = cases["gpu-dtype pools.chat"].find("failure")
    assert "bfloat16 needs compute capability 8.0" in failure.text and failure.get("type") == "mandatory"
    assert "[advisory] memory-headroom pools.reasoning reasoning-gpu-01" in suite.find("system-out").text


def test_format_prints_the_chosen_document_on_stdout(tmp_path: Path) -> None:
    done = run_plan(tmp_path, prod_config(), "--format", "junit", name="prod")
    assert done.returncode == 0 and done.stdout.startswith(b"<?xml")
    done = run_plan(tmp_path, prod_config(), "--format", "json", name="prod")
    assert json.loads(done.stdout)["policy"]["mandatory"] == 0


CLIS = [
    ["-m", "plan"],
    ["-m", "plan", "--format", "json"],
    ["-m", "ops.capacity", "--list"],
    [
        "-m",
        "ops.capacity",
        "--model",
        "qwen3-30b-a3b",
        "--gpu",
        "Tesla V100-SXM2-32GB",
        "--tp",
        "8",
        "--max-model-len",
        "32768",
    ],
    ["-m", "ops.rollout", "--pool", "chat", "--dry-run"],
    ["-m", "ops.doctor", "--help"],
    ["-m", "bench.capacity_accuracy"],
]


@pytest.mark.parametrize("argv", CLIS, ids=[" ".join(a) for a in CLIS])
def test_a_reader_that_stops_early_gets_no_traceback(argv: list[str], tmp_path: Path) -> None:
    """`… | head`: the reader is gone before the first write (its end is closed at once)."""
    read, write = os.pipe()
    os.close(read)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, *argv], cwd=ROOT, stdout=write, stderr=subprocess.PIPE, env=env, timeout=300)
    os.close(write)
    assert b"Traceback" not in done.stderr and b"BrokenPipeError" not in done.stderr, done.stderr.decode()
    assert done.returncode in (0, 1, 141)
