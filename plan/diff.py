"""The plan diff: what a stack change does to the deployed cluster, per resource and for service.

Two plan.json documents are compared resource by resource (keyed by URN without its stack part, so
the plan of another branch compares too):
- create / delete: a URN only in the new / the old plan;
- replace: a changed input that the provider replaces on (the provider schemas' own
  `willReplaceOnChanges` — docker's ForceNew fields — and `replaceOnChanges` resource options such as
  pulumi-command's `triggers[*]`, see provider_replace.json for the sources), or a `replaceWith`
  resource that is replaced; inputs under `ignoreChanges` do not count;
- update: any other changed input (the input paths are listed).
A replaced resource gets a new id and new outputs, so every input of a dependent that reads one of
its outputs (propertyDependencies) changes too and is judged the same way: a replaced image replaces
its containers, a replaced container re-runs the gates that trigger on its id. An updated resource
keeps its id; its outputs are taken to change only where its inputs did (which the mocks echo).
Values the plan cannot know (unknown until deployed) compare equal; secrets are masked in plan.json,
so they are masked here too.

Then what it means for service, from the containers' `llm-cluster.*` labels: per pool which instances
go down at once and for about how long (the pool's loadTimeoutMinutes), per service (gateway,
Prometheus, …) whether its container restarts or only reloads (a changed command of the same
component that runs before or after the container, the container itself kept), and which weights are copied.
"""

from __future__ import annotations

import difflib
import json
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from components.resources.model_weights import ModelWeights
from components.spec import StackSpec
from plan.harness import UNKNOWN

REPLACE_DATA = Path(__file__).with_name("provider_replace.json")
CONTAINER = "docker:index/container:Container"
LABEL = "llm-cluster."
OPS = ("create", "update", "replace", "delete")
SYMBOL = {"create": "+", "update": "~", "replace": "+-", "delete": "-"}


def replace_inputs_from_schema(schema: dict[str, Any]) -> dict[str, list[str]]:
    """Resource type -> the inputs a provider schema marks as forcing a replacement."""
    out: dict[str, list[str]] = {}
    for token, res in sorted(schema.get("resources", {}).items()):
        props = sorted(
            k
            for k, v in res.get("inputProperties", {}).items()
            if v.get("willReplaceOnChanges") or v.get("replaceOnChanges")
        )
        if props:
            out[token] = props
    return out


def load_replace_rules(path: Path = REPLACE_DATA) -> dict[str, tuple[frozenset[str], str]]:
    """Resource type -> (inputs that force a replacement, the source that says so)."""
    data = json.loads(path.read_text())
    return {
        token: (
            frozenset(entry["inputs"]) | frozenset(entry.get("added", {})),
            data["sources"][entry["source"]]["cite"],
        )
        for token, entry in data["types"].items()
    }


@dataclass
class InputChange:
    """One changed input path, with short forms of its old and new values (secrets stay "[secret]")."""

    path: str
    before: str | None
    after: str | None
    via: str | None = None  # the replaced (or newly read) resource whose output this input reads


@dataclass
class ResourceChange:
    """One resource the change touches."""

    urn: str
    type: str
    name: str
    op: str
    node: str | None
    parent: str
    changes: list[InputChange] = field(default_factory=list)
    replace_because: list[str] = field(default_factory=list)  # the forcing inputs
    replace_source: str | None = None
    delete_before_replace: bool = False
    custom: bool = True  # False for a component (no provider, nothing on a host)


def _key(urn: str) -> str:
    """The URN without its stack: `urn:pulumi:<stack>::<project>::<type>::<name>` -> project onwards."""
    parts = urn.split("::", 1)
    return parts[1] if len(parts) == 2 else urn


def _short(value: Any) -> str | None:
    """A value as one short line: scripts and documents become a size, long lists a count."""
    if value is None:
        return None
    if isinstance(value, str):
        if "\n" in value or len(value) > 80:
            return f"<text, {value.count(chr(10)) + 1} lines>"
        return value
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 80 else f"<{type(value).__name__}, {len(value)} items>"


def _text_change(old: str, new: str, path: str) -> InputChange:
    """A changed script or document: how many lines went and came (the artifacts hold both texts)."""
    a, b = old.splitlines(), new.splitlines()
    ops = difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()
    gone = sum(i2 - i1 for tag, i1, i2, _, _ in ops if tag != "equal")
    added = sum(j2 - j1 for tag, _, _, j1, j2 in ops if tag != "equal")
    return InputChange(path, _short(old), f"{_short(new)} (-{gone} +{added} lines)")


def _diff_values(old: Any, new: Any, path: str) -> list[InputChange]:
    """Leaf-level differences between two input values; lists of plain values compare as sets of items."""
    if old == new or UNKNOWN in (old, new):
        return []
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[InputChange] = []
        for k in list(old) + [k for k in new if k not in old]:
            out += _diff_values(old.get(k), new.get(k), f"{path}.{k}" if path else k)
        return out
    if isinstance(old, list) and isinstance(new, list):
        if len(old) == len(new) and all(isinstance(v, dict) for v in old + new):
            return [c for i, (a, b) in enumerate(zip(old, new)) for c in _diff_values(a, b, f"{path}[{i}]")]
        if all(not isinstance(v, (dict, list)) for v in old + new):
            gone = [v for v in old if v not in new]
            added = [v for v in new if v not in old]
            if not gone and not added:  # same items, another order
                return [InputChange(path, "<order>", "<order>")]
            return [InputChange(path, _short(gone) if gone else None, _short(added) if added else None)]
    if isinstance(old, str) and isinstance(new, str) and ("\n" in old or "\n" in new):
        return [_text_change(old, new, path)]
    return [InputChange(path, _short(old), _short(new))]


def _top(path: str) -> str:
    return path.split(".", 1)[0].split("[", 1)[0]


def _option_replace(options: dict[str, Any]) -> set[str]:
    """Top-level inputs named by a resource's replaceOnChanges option (`triggers[*]` -> triggers)."""
    return {_top(p) for p in options.get("replaceOnChanges") or []}


def diff_resources(
    before: dict[str, Any], after: dict[str, Any], rules: dict[str, tuple[frozenset[str], str]] | None = None
) -> list[ResourceChange]:
    """Every resource that changes from plan `before` to plan `after`, in the new plan's order, deletes last."""
    rules = load_replace_rules() if rules is None else rules
    old = {_key(r["urn"]): r for r in before.get("resources", [])}
    new_keys = set()
    replaced: set[str] = set()
    changes: list[ResourceChange] = []
    for r in after.get("resources", []):
        key = _key(r["urn"])
        new_keys.add(key)
        prev = old.get(key)
        change = ResourceChange(
            r["urn"], r["type"], r["name"], "create", r.get("node"), r.get("parent", ""), custom=r.get("custom", True)
        )
        if prev is None:
            changes.append(change)
            continue
        change.changes = _diff_values(prev.get("inputs") or {}, r.get("inputs") or {}, "")
        touched = {_top(c.path) for c in change.changes}
        old_deps = prev.get("propertyDependencies") or {}
        for prop, urns in (r.get("propertyDependencies") or {}).items():
            # Reading a replaced resource's output, or another resource's: the value is new.
            was = {_key(u) for u in old_deps.get(prop, [])}
            via = [u for u in urns if _key(u) in replaced or _key(u) not in was]
            if via and prop not in touched:
                name = _key(via[0]).rsplit("::", 1)[-1]
                change.changes.append(InputChange(prop, None, None, via=name))
                touched.add(prop)
        options = r.get("options") or {}
        ignored = {_top(p) for p in options.get("ignoreChanges") or []}
        change.changes = [c for c in change.changes if _top(c.path) not in ignored]
        touched -= ignored
        # replace_with: replaced whenever one of these is (the engine's own rule, no input involved).
        with_ = [_key(u).rsplit("::", 1)[-1] for u in options.get("replaceWith") or [] if _key(u) in replaced]
        if not change.changes and not with_:
            continue
        forcing, source = rules.get(r["type"], (frozenset(), None))
        by_option = _option_replace(options)
        because = sorted(t for t in touched if t in forcing or t in by_option or "*" in by_option)
        if (because or with_) and change.custom:
            change.op, change.replace_because = "replace", because + [f"replaceWith {n}" for n in with_]
            change.replace_source = (
                source
                if any(t in forcing for t in because)
                else "the resource's replaceOnChanges option"
                if because
                else "the resource's replaceWith option"
            )
            change.delete_before_replace = bool(options.get("deleteBeforeReplace"))
            replaced.add(key)
        else:
            change.op = "update"
        changes.append(change)
    for key, r in old.items():
        if key not in new_keys:
            changes.append(
                ResourceChange(
                    r["urn"],
                    r["type"],
                    r["name"],
                    "delete",
                    r.get("node"),
                    r.get("parent", ""),
                    custom=r.get("custom", True),
                )
            )
    return changes


def summary(changes: list[ResourceChange], total_after: int) -> dict[str, int]:
    """Counts per operation and unchanged resources, as `pulumi preview` ends with."""
    counts = {op: sum(c.op == op for c in changes) for op in OPS}
    counts["unchanged"] = total_after - counts["create"] - counts["update"] - counts["replace"]
    return counts


def summary_line(counts: dict[str, int]) -> str:
    """`Resources: + 1 to create · ~ 2 to update · +- 3 to replace · - 1 to delete · 90 unchanged`."""
    parts = [f"{SYMBOL[op]} {counts[op]} to {op}" for op in OPS if counts[op]]
    return "Resources: " + " · ".join(parts + [f"{counts['unchanged']} unchanged"])


# --- what it means for service ---------------------------------------------------------------------


def _labels(resource: dict[str, Any]) -> dict[str, str]:
    return {
        lbl.get("label"): lbl.get("value")
        for lbl in (resource.get("inputs") or {}).get("labels") or []
        if isinstance(lbl, dict)
    }


def _purpose(resource: dict[str, Any]) -> str:
    """What a command's script says it does (its `# llm-cluster: …` line), else its name."""
    for line in str((resource.get("inputs") or {}).get("create") or "").splitlines():
        if line.startswith("# llm-cluster: "):
            return line.removeprefix("# llm-cluster: ")
    return resource["name"]


def _down_minutes(spec: StackSpec, pool: str) -> int | None:
    p = spec.pools.get(pool)
    return p.load_timeout_minutes if p is not None else None


def _max_unavailable(spec: StackSpec, pool: str) -> int:
    p = spec.pools.get(pool)
    return p.max_unavailable if p is not None else 1


def service_impact(
    changes: list[ResourceChange], before: dict[str, Any], after: dict[str, Any], spec: StackSpec
) -> dict[str, Any]:
    """Per pool the instances down at once and for how long; per service restart or reload; weights copied."""
    op = {_key(c.urn): c.op for c in changes}
    docs = {_key(r["urn"]): r for r in before.get("resources", [])} | {
        _key(r["urn"]): r for r in after.get("resources", [])
    }
    new_keys = {_key(r["urn"]) for r in after.get("resources", [])}
    old_keys = {_key(r["urn"]) for r in before.get("resources", [])}

    weights: list[dict[str, Any]] = []
    for key, o in op.items():
        r = docs[key]
        parent = docs.get(_key(r.get("parent", "")))
        if o in ("create", "replace") and parent is not None and parent["type"] == ModelWeights.TYPE:
            weights.append(
                {
                    "model": (parent.get("inputs") or {}).get("model"),
                    "resource": r["name"],
                    "urn": r["urn"],
                    "node": r.get("node"),
                    "op": o,
                    "does": _purpose(r),
                }
            )
    copying = {_key(urn) for w in weights for urn in [w["urn"]]}

    # Pools: an instance is every container labelled with it (vLLM server, Ray head and workers, the
    # native launcher's workers on the other nodes).
    # Per instance: whether a container of it is in the old plan, in the new one, goes down; the copies it waits for.
    was: set[str] = set()
    stays: set[str] = set()
    restarts: set[str] = set()
    waits: dict[str, set[str]] = defaultdict(set)
    pool_of: dict[str, str] = {}
    for key, r in docs.items():
        lbl = _labels(r)
        if r["type"] != CONTAINER or LABEL + "instance" not in lbl:
            continue
        inst, pool = lbl[LABEL + "instance"], lbl.get(LABEL + "pool", "")
        pool_of[inst] = pool
        if key in old_keys:
            was.add(inst)
        if key in new_keys:
            stays.add(inst)
        if op.get(key) in ("replace", "delete", "create"):
            restarts.add(inst)
            # A container starts only after the weights it depends on are in place: hours for a copy.
            waits[inst] |= {_key(d) for d in r.get("dependencies") or [] if _key(d) in copying}
    pools: dict[str, Any] = {}
    for inst in sorted(pool_of):
        entry = pools.setdefault(
            pool_of[inst],
            {
                "instancesBefore": 0,
                "instancesAfter": 0,
                "added": [],
                "removed": [],
                "restarted": [],
                "waitsForWeights": [],
            },
        )
        entry["instancesBefore"] += inst in was
        entry["instancesAfter"] += inst in stays
        if inst not in was:
            entry["added"].append(inst)
        elif inst not in stays:
            entry["removed"].append(inst)
        elif inst in restarts:
            entry["restarted"].append(inst)
            # Instances on one node (replicasPerNode) wait for the same copy: it is named once.
            entry["waitsForWeights"] = sorted(set(entry["waitsForWeights"]) | {docs[k]["name"] for k in waits[inst]})
    recommendations: list[str] = []
    pools = {p: e for p, e in pools.items() if e["added"] or e["removed"] or e["restarted"]}
    for pool, entry in pools.items():
        down = len(entry["restarted"]) + len(entry["removed"])
        entry["downAtOnce"] = down
        entry["servingThroughout"] = entry["instancesBefore"] - down
        entry["downForMinutes"] = _down_minutes(spec, pool) if entry["restarted"] else None
        limit = _max_unavailable(spec, pool)
        if len(entry["restarted"]) > limit:  # limit >= 1: so the pool had two instances or more
            recommendations.append(
                f"pool {pool}: this change restarts {len(entry['restarted'])} of {entry['instancesBefore']} instances "
                f"at once; roll it out instance by instance instead: make rollout STACK={after.get('stack', '<stack>')} "
                f"POOL={pool} (maxUnavailable {limit})"
            )
        elif entry["restarted"] and entry["servingThroughout"] == 0:
            what = (
                "its only instance restarts"
                if entry["instancesBefore"] == 1
                else f"no instance serves throughout ({len(entry['restarted'])} restart, "
                f"{len(entry['removed'])} removed)"
            )
            recommendations.append(
                f"pool {pool}: {what}, so the pool serves nothing while it reloads; a second "
                "pool of the same model (blue/green, see the README) keeps it serving"
            )
        if entry["waitsForWeights"]:
            recommendations.append(
                f"pool {pool}: {', '.join(entry['restarted'])} goes down when the change starts but serves again only "
                f"after the weights copy ({', '.join(entry['waitsForWeights'])}); copy first: pulumi up with a "
                "--target for each URN in plan.json diff.weights, then the whole change"
            )

    recommendations += _gpu_handovers(changes, docs)

    # Services outside the pools: by the role label of their containers.
    services: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    commands_changed = {
        key
        for key, o in op.items()
        if o in ("create", "update", "replace") and docs[key]["type"].startswith("command:")
    }
    for key, r in docs.items():
        lbl = _labels(r)
        if r["type"] != CONTAINER or LABEL + "instance" in lbl or LABEL + "role" not in lbl:
            continue
        role, o = lbl[LABEL + "role"], op.get(key)
        if o == "replace":
            services[role]["restart"].append(r["name"])
        elif o in ("create", "delete"):
            services[role][o].append(r["name"])
        else:
            # A changed command of the same component, run before the container (writes what it
            # reads) or after it (tells it to re-read), while the container itself stays: a reload.
            before_it = {_key(d) for d in r.get("dependencies") or []}
            reloads = [
                c
                for c in commands_changed
                if docs[c].get("parent") == r.get("parent")
                and (c in before_it or _key(r["urn"]) in {_key(d) for d in docs[c].get("dependencies") or []})
            ]
            if reloads:
                services[role]["reload"].append(r["name"])
            elif o == "update":
                services[role]["update in place"].append(r["name"])

    return {
        "pools": pools,
        "services": {k: dict(v) for k, v in sorted(services.items())},
        "weights": weights,
        "recommendations": recommendations,
    }


def _gpus(resource: dict[str, Any]) -> set[str] | None:
    """The GPUs a serving container claims: {"all"} or its device ids; None for any other container."""
    inputs = resource.get("inputs") or {}
    if LABEL + "instance" not in _labels(resource):
        return None  # exporters see the GPUs but take no memory
    if inputs.get("gpus"):
        return {"all"}
    ids = {str(i) for req in inputs.get("deviceRequests") or [] for i in req.get("deviceIds") or []}
    return ids or ({"all"} if inputs.get("deviceRequests") else None)


def _gpu_handovers(changes: list[ResourceChange], docs: dict[str, dict[str, Any]]) -> list[str]:
    """New GPU containers on a node whose GPUs a container deleted in the same up still holds.

    The engine creates new resources before it deletes removed ones, so the new server would start
    (and fail to get its GPU memory) while the old one still runs.
    """
    out = []
    created = [c for c in changes if c.op == "create" and c.type == CONTAINER]
    deleted = [c for c in changes if c.op == "delete" and c.type == CONTAINER]
    for new in created:
        claims = _gpus(docs[_key(new.urn)])
        if not claims:
            continue
        holders = [
            old.name
            for old in deleted
            if old.node == new.node
            and (old_claims := _gpus(docs[_key(old.urn)]))
            and ("all" in claims or "all" in old_claims or claims & old_claims)
        ]
        if holders:
            out.append(
                f"node {new.node}: {new.name} would start while {', '.join(holders)} still holds its GPUs "
                "(an up creates new resources before it deletes removed ones); free the node first: one up "
                "with the node out of its old pool, then the up that gives it to the new one"
            )
    return out


# --- the section plan.json and plan.txt carry -------------------------------------------------------


def plan_diff(
    before: dict[str, Any] | None, after: dict[str, Any], spec: StackSpec, against: str | None
) -> dict[str, Any]:
    """plan.json's `diff`: resources changed, the summary, and the service impact."""
    if before is None:
        note = (
            "no previous plan of this stack: the next plan compares against this one"
            if against is None
            else f"{against} is not a plan.json: nothing to compare against"
        )
        return {"against": None, "note": note}
    changes = diff_resources(before, after)
    out: dict[str, Any] = {
        "against": against,
        "summary": summary(changes, len(after.get("resources", []))),
        "resources": [asdict(c) for c in changes],
        **service_impact(changes, before, after, spec),
    }
    if before.get("mode") != after.get("mode"):
        out["note"] = (
            f"the previous plan ran in {before.get('mode')} mode, this one in {after.get('mode')}: "
            "values known in one and unknown in the other are not compared"
        )
    return out


def render_diff(diff: dict[str, Any]) -> list[str]:
    """The diff as the plan prints it (secrets are "[secret]" in plan.json already)."""
    if diff.get("against") is None:
        return ["\nChanges", f"  {diff.get('note')}"]
    out = [f"\nChanges against {diff['against']}"]
    if diff.get("note"):
        out.append(f"  note: {diff['note']}")
    for c in diff["resources"]:
        if not c.get("custom", True):
            # Components carry no state of their own (their children say what happens): one line each.
            props = sorted({_top(ch["path"]) for ch in c["changes"]})
            out.append(
                f"  {SYMBOL[c['op']]:<2} {c['op']:<7} {c['type'].split(':')[-1]:<12} {c['name']}"
                + (f"  ({', '.join(props)})" if props else "")
            )
            continue
        where = f" on {c['node']}" if c.get("node") else ""
        out.append(f"  {SYMBOL[c['op']]:<2} {c['op']:<7} {c['type'].split(':')[-1]:<12} {c['name']}{where}")
        for ch in c["changes"]:
            forced = " (forces replacement)" if _top(ch["path"]) in c["replace_because"] else ""
            if ch["via"]:
                out.append(f"        {ch['path']}: new output of {ch['via']}{forced}")
            else:
                out.append(f"        {ch['path']}: {ch['before'] or '∅'} → {ch['after'] or '∅'}{forced}")
        if c["op"] == "replace":
            order = "old one deleted first" if c["delete_before_replace"] else "new one created first"
            out.append(f"        replaced because of {', '.join(c['replace_because'])}: {c['replace_source']}; {order}")
    out.append("  " + summary_line(diff["summary"]))
    out.append("\nService impact")
    if not (diff["pools"] or diff["services"] or diff["weights"]):
        out.append("  none: no container restarts, nothing reloads")
    for pool, e in diff["pools"].items():
        parts = []
        if e["restarted"]:
            wait = f", after the weights copy ({', '.join(e['waitsForWeights'])})" if e["waitsForWeights"] else ""
            parts.append(
                f"{len(e['restarted'])} of {e['instancesBefore']} instances down at once "
                f"({', '.join(e['restarted'])}) for up to {e['downForMinutes']} min each "
                f"(loadTimeoutMinutes: weights load, then /health){wait}"
            )
        if e["removed"]:
            parts.append(f"removed: {', '.join(e['removed'])}")
        if e["added"]:
            parts.append(f"new: {', '.join(e['added'])} (serve once loaded)")
        serving = (
            [f"{e['servingThroughout']} of {e['instancesBefore']} serving throughout"] if e["instancesBefore"] else []
        )
        out.append(f"  pool {pool}: " + "; ".join(parts + serving))
    for role, what in diff["services"].items():
        out.append(f"  {role}: " + "; ".join(f"{how} {', '.join(names)}" for how, names in what.items()))
    for w in diff["weights"]:
        out.append(f"  weights {w['model']}: {w['resource']} on {w['node']} ({w['op']}) — {w['does']}")
    for rec in diff["recommendations"]:
        out.append(f"  recommended: {rec}")
    return out


def previous_plan(out_dir: Path) -> bytes | None:
    """The plan.json the last run of this stack wrote (read before the plan directory is emptied)."""
    path = out_dir / "plan.json"
    return path.read_bytes() if path.is_file() else None


def parse_plan(raw: bytes) -> dict[str, Any] | None:
    """A kept plan.json as a document; None when it is not one (truncated, or written by hand)."""
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("resources"), list) else None


def keep_previous(out_dir: Path, previous: bytes | None) -> str | None:
    """Store the last run's plan under previous/; return its path for the diff, None when there was none."""
    if previous is None:
        return None
    target = out_dir / "previous" / "plan.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(previous)
    return str(target)
