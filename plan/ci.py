"""Policy verdicts for CI: SARIF 2.1.0 (code-scanning UIs) and JUnit XML (test reports), from plan.json.

Both are built from the plan document as written (credentials already redacted), so they say nothing
plan.json does not. SARIF gives each violation its rule, level and message, and points at the stack
file and the line of the key at fault: the first stack key the message names (`pools.chat.vllm.
maxModelLen`), else the pool's key, found in the YAML as written. JUnit has one test case per rule and
pool, plus one per rule for the rest of the stack (gateway, monitoring, nodes): a mandatory violation
fails it, an advisory one is reported in the suite's system-out, a disabled rule is skipped.
Both are deterministic: no clock is read unless SOURCE_DATE_EPOCH is set (then JUnit's timestamp).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

import yaml

from components.spec import NAMESPACE, SECTIONS
from policies.pack import PACK_NAME, PACK_VERSION, POLICIES

SARIF_SCHEMA = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
SARIF_LEVEL = {"mandatory": "error", "remediate": "error", "advisory": "warning", "disabled": "none"}
# A stack key as messages write it: section.name.key, [i] for list items.
_KEY = re.compile(r"\b(?:" + "|".join(map(re.escape, SECTIONS)) + r")(?:\.[A-Za-z0-9_-]+|\[\d+\])+")
POOL_LABEL = "llm-cluster.pool"
REST = "stack"  # the JUnit subject of what belongs to no pool


def key_lines(stack_file: Path) -> dict[str, int]:
    """Stack key path ('pools.chat.vllm.maxModelLen', 'pools.chat.vllm.extraArgs[0]') -> 1-based line."""
    try:
        root = yaml.compose(stack_file.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return {}
    lines: dict[str, int] = {}

    def walk(node: yaml.Node, path: str) -> None:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                name = str(key.value)
                # The stack's own sections sit under config: as `llm-cluster:<section>` (or bare).
                name = name.removeprefix(NAMESPACE + ":") if not path else name
                here = f"{path}.{name}" if path else name
                lines.setdefault(here, key.start_mark.line + 1)
                walk(value, here)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                here = f"{path}[{i}]"
                lines.setdefault(here, item.start_mark.line + 1)
                walk(item, here)

    if isinstance(root, yaml.MappingNode):
        for key, value in root.value:
            if key.value == "config":
                walk(value, "")
    return lines


_LAST_PART = re.compile(r"(\.[^.\[]+|\[\d+\])$")


def _line_of(key: str, lines: Mapping[str, int]) -> tuple[str, int] | None:
    """The key, or its nearest stated parent, and its line (a default the stack leaves unset has none)."""
    while key:
        if key in lines:
            return key, lines[key]
        last = _LAST_PART.search(key)
        key = key[: last.start()] if last else ""
    return None


def pool_of_resources(doc: Mapping[str, Any]) -> dict[str, str]:
    """urn -> pool, for every resource of a pool: a `pool` input, a llm-cluster.pool label, or its parent's."""
    by_urn = {r["urn"]: r for r in doc.get("resources", [])}
    own: dict[str, str] = {}
    for urn, r in by_urn.items():
        inputs = r.get("inputs") or {}
        labels = {lbl.get("label"): lbl.get("value") for lbl in inputs.get("labels") or [] if isinstance(lbl, dict)}
        pool = inputs.get("pool") if isinstance(inputs.get("pool"), str) else labels.get(POOL_LABEL)
        if pool:
            own[urn] = pool
    out: dict[str, str] = {}
    for urn in by_urn:
        at, seen = urn, set()
        while at and at not in own and at not in seen:
            seen.add(at)
            at = (by_urn.get(at) or {}).get("parent") or ""
        if at in own:
            out[urn] = own[at]
    return out


def _rules() -> list[Any]:
    return sorted(POLICIES, key=lambda p: p.name)


def sarif(doc: Mapping[str, Any], stack_file: Path, uri: str) -> dict[str, Any]:
    """The SARIF 2.1.0 log of one plan's policy verdicts (`uri`: the stack file as the repository names it)."""
    rules = _rules()
    index = {p.name: i for i, p in enumerate(rules)}
    lines = key_lines(stack_file)
    pools = pool_of_resources(doc)
    results = []
    for v in doc["policy"]["violations"]:
        message = v["message"]
        keys = _KEY.findall(message) + ([f"pools.{pools[v['urn']]}"] if v["urn"] in pools else [])
        # The most specific key that the file states: `models.x.dtype` rather than the `pools.chat` prefix.
        hits = [hit for hit in (_line_of(k, lines) for k in keys) if hit]
        found = max(hits, key=lambda hit: hit[0].count(".") + hit[0].count("["), default=None)
        physical: dict[str, Any] = {"artifactLocation": {"uri": uri}}
        if found is not None:
            physical["region"] = {"startLine": found[1]}
        location: dict[str, Any] = {"physicalLocation": physical}
        if v.get("urn"):
            location["logicalLocations"] = [{"name": v["resource"], "fullyQualifiedName": v["urn"], "kind": "resource"}]
        result: dict[str, Any] = {
            "ruleId": v["policy"],
            "level": SARIF_LEVEL[v["enforcementLevel"]],
            "message": {"text": message},
            "locations": [location],
            "properties": {"enforcementLevel": v["enforcementLevel"], **({"stackKey": found[0]} if found else {})},
        }
        if v["policy"] in index:
            result["ruleIndex"] = index[v["policy"]]
        results.append(result)
    return {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": PACK_NAME,
                        "version": PACK_VERSION,
                        "semanticVersion": PACK_VERSION,
                        "informationUri": "https://www.pulumi.com/docs/using-pulumi/crossguard/",
                        "rules": [
                            {
                                "id": p.name,
                                "name": p.name,
                                "shortDescription": {"text": p.description},
                                "defaultConfiguration": {
                                    "level": SARIF_LEVEL[
                                        (p.enforcement_level.value if p.enforcement_level else "mandatory")
                                    ]
                                },
                            }
                            for p in rules
                        ],
                    }
                },
                "artifacts": [{"location": {"uri": uri}, "roles": ["analysisTarget"]}],
                "results": results,
                "properties": {"stack": doc["stack"], "mode": doc["mode"], "mandatory": doc["policy"]["mandatory"]},
            }
        ],
    }


def _timestamp(stack_file: Path) -> str:
    """SOURCE_DATE_EPOCH (reproducible builds) when set, else the stack file's modification time."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    try:
        seconds = int(epoch) if epoch else int(stack_file.stat().st_mtime)
    except (OSError, ValueError):
        seconds = 0
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S")


def junit(doc: Mapping[str, Any], stack_file: Path, levels: Mapping[str, str]) -> str:
    """JUnit XML (Apache Ant's schema): one test case per rule and pool, and per rule for the rest of the stack.

    `levels`: each policy's configured enforcement level (disabled rules are skipped)."""
    pools = pool_of_resources(doc)
    subjects = [f"pools.{p}" for p in doc.get("capacity", {})] or []
    subjects += [REST]
    by_case: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for v in doc["policy"]["violations"]:
        subject = f"pools.{pools[v['urn']]}" if v["urn"] in pools else REST
        by_case.setdefault((v["policy"], subject), []).append(v)
    stack = doc["stack"]
    cases, advisories, failures, skipped = [], [], 0, 0
    for rule in _rules():
        for subject in subjects:
            case = ET.Element(
                "testcase", name=f"{rule.name} {subject}", classname=f"llm-cluster.{stack}.{rule.name}", time="0"
            )
            found = by_case.get((rule.name, subject), [])
            failing = [v for v in found if v["enforcementLevel"] in ("mandatory", "remediate")]
            if levels.get(rule.name) == "disabled":
                ET.SubElement(case, "skipped", message="disabled in the policy config")
                skipped += 1
            elif failing:
                failure = ET.SubElement(
                    case,
                    "failure",
                    message=failing[0]["message"].splitlines()[-1][:500],
                    type=failing[0]["enforcementLevel"],
                )
                failure.text = "\n\n".join(f"{v['resource']} ({v['urn']}):\n{v['message']}" for v in failing)
                failures += 1
            advisories += [
                f"[{v['enforcementLevel']}] {rule.name} {subject} {v['resource']}: {v['message']}"
                for v in found
                if v not in failing
            ]
            cases.append(case)
    suite = ET.Element(
        "testsuite",
        name=f"llm-cluster.{stack}",
        timestamp=_timestamp(stack_file),
        hostname="localhost",
        tests=str(len(cases)),
        failures=str(failures),
        errors="0",
        skipped=str(skipped),
        time="0",
    )
    properties = ET.SubElement(suite, "properties")
    for name, value in (
        ("stack", stack),
        ("mode", doc["mode"]),
        ("config", str(doc.get("config", ""))),
        ("policyPack", f"{PACK_NAME}@{PACK_VERSION}"),
    ):
        ET.SubElement(properties, "property", name=name, value=value)
    suite.extend(cases)
    ET.SubElement(suite, "system-out").text = "\n\n".join(advisories)
    ET.SubElement(suite, "system-err").text = ""
    suites = ET.Element("testsuites")
    suite.set("package", "llm-cluster")
    suite.set("id", "0")
    suites.append(suite)
    ET.indent(suites)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


def configured_levels(policy_config: Mapping[str, Any] | None) -> dict[str, str]:
    """Each policy's enforcement level as the engine resolves it for this policy config."""
    from plan.analyze import LEVEL_NAMES, configure_request

    request = configure_request(policy_config)
    return {name: LEVEL_NAMES[cfg.enforcementLevel] for name, cfg in request.policyConfig.items()}


def repo_uri(path: Path, root: Path) -> str:
    """The stack file as a repository-relative URI when it lies in the repository, else its absolute path."""
    resolved = path.resolve()
    try:
        return resolved.relative_to(root).as_posix()
    except ValueError:
        return resolved.as_uri()


def write_text(path: Path, text: str) -> None:
    """Write an output file the user named, creating its directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
