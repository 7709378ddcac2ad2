"""What the offline plan prints and writes: the readable plan, plan.json and the generated artifacts."""

from __future__ import annotations

import heapq
import shlex
import textwrap
from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from components.engines.base import endpoint
from components.marks import GPU_NODE
from components.planning.gateway.routing import model_pools, split
from components.planning.monitoring.prometheus import written_files
from components.planning.nodes.scripts import fanout_rounds
from components.spec import StackSpec
from components.spec.topology import all_instances, instances, weights_nodes
from plan.diff import render_diff
from plan.harness import ProgramRun, Registration

CONTAINER = "docker:index/container:Container"
REMOTE_COMMAND = "command:remote:Command"
LOCAL_COMMAND = "command:local:Command"
DOCKER_PROVIDER = "pulumi:providers:docker"


@dataclass
class PlanResult:
    """Everything one plan produced, for printing and for plan.json."""

    stack: str
    config_path: str
    preview: bool
    spec: StackSpec
    run: ProgramRun
    violations: list[Any] = field(default_factory=list)  # plan.analyze.Violation
    capacity: dict[str, Any] = field(default_factory=dict)
    artifacts: list[str] = field(default_factory=list)
    redactions: list[str] = field(default_factory=list)  # where credentials were replaced (plan.redact)
    diff: dict[str, Any] | None = None  # plan.diff.plan_diff, against the previous plan

    @cached_property
    def node_of(self) -> dict[str, str]:
        """urn -> node, computed once for the text and plan.json."""
        return node_index(self.run, self.spec)

    @property
    def mandatory(self) -> list[Any]:
        """Violations that fail `pulumi preview` (remediate counts as mandatory when reporting)."""
        return [v for v in self.violations if v.enforcement_level in ("mandatory", "remediate")]


def in_stable_order(run: ProgramRun) -> ProgramRun:
    """The run with its registrations in one order for every run of the same input.

    The program registers from asyncio callbacks, so the order it happens to register in varies from run
    to run; plans are diffed in CI, so every listing follows this order instead: parents and
    dependencies before what needs them (the order `pulumi up` creates them in), ties by URN. Dependency
    lists, gathered by the SDK as sets, are sorted.
    """
    regs = {r.urn: r for r in run.registrations}
    needs: dict[str, set[str]] = {
        r.urn: ({r.parent} | set(r.dependencies) | {d for ds in r.property_dependencies.values() for d in ds})
        & regs.keys() - {r.urn}
        for r in run.registrations
    }
    users: dict[str, list[str]] = defaultdict(list)
    for urn, deps in needs.items():
        for dep in deps:
            users[dep].append(urn)
    ready = [urn for urn, deps in needs.items() if not deps]
    heapq.heapify(ready)
    ordered: list[Registration] = []
    while ready:
        urn = heapq.heappop(ready)
        r = regs[urn]
        ordered.append(
            replace(
                r,
                dependencies=sorted(r.dependencies),
                property_dependencies={k: sorted(v) for k, v in sorted(r.property_dependencies.items())},
            )
        )
        for user in users[urn]:
            needs[user].discard(urn)
            if not needs[user]:
                heapq.heappush(ready, user)
    return replace(run, registrations=ordered)


def node_index(run: ProgramRun, spec: StackSpec) -> dict[str, str]:
    """urn -> the server a resource acts on: by its Docker provider, or by its SSH connection's host."""
    by_address = {a: name for name, n in spec.nodes.items() for a in (n.address, n.ssh_address) if a}
    node_of_component = {r.urn: r.plain_inputs().get("node") for r in run.registrations if r.type == GPU_NODE}
    node_of_provider = {
        r.urn: node_of_component[r.parent]
        for r in run.registrations
        if r.type == DOCKER_PROVIDER and r.parent in node_of_component
    }
    index: dict[str, str] = {}
    for r in run.registrations:
        if r.type == GPU_NODE:
            node = node_of_component[r.urn]
        elif r.type.startswith("docker:") and r.provider:
            node = node_of_provider.get(r.provider.rsplit("::", 1)[0])
        elif r.type == REMOTE_COMMAND:
            node = by_address.get((r.plain_inputs().get("connection") or {}).get("host"))
        else:
            node = None
        if node is not None:
            index[r.urn] = node
    return index


def artifacts_of(run: ProgramRun) -> dict[str, str]:
    """Every script and file the program ships to the nodes: relative path -> text (secrets masked)."""
    files: dict[str, str] = {}
    for r in run.registrations:
        inputs = r.display_inputs()
        if r.type in (REMOTE_COMMAND, LOCAL_COMMAND):
            for phase in ("create", "update", "delete"):
                if isinstance(inputs.get(phase), str):
                    files[f"scripts/{r.name}.{phase}.sh"] = inputs[phase]
            # Config files a command writes on its host (monitoring): beside the containers' uploads.
            for path, text in written_files(str(inputs.get("create") or "")).items():
                files[f"files/{r.name}{path}"] = text
        if r.type == CONTAINER:
            for up in inputs.get("uploads") or []:
                if isinstance(up.get("content"), str):
                    files[f"files/{r.name}{up['file']}"] = up["content"]
    return files


def _labels(inputs: dict[str, Any]) -> dict[str, str]:
    return {lbl["label"]: lbl["value"] for lbl in inputs.get("labels") or []}


def _wrap(prefix: str, words: list[str], width: int = 110) -> list[str]:
    text = " ".join(shlex.quote(str(w)) for w in words)
    return textwrap.wrap(
        text,
        width=width,
        initial_indent=prefix,
        subsequent_indent=" " * len(prefix),
        break_on_hyphens=False,
        break_long_words=False,
    ) or [prefix.rstrip()]


def type_label(resource_type: str) -> str:
    """A resource type as the summary counts it: command:local:Command -> "local Command" (local and remote
    commands are different resources), pulumi:providers:docker -> "docker provider", else the type's name."""
    package, module, name = (resource_type.split(":") + ["", ""])[:3]
    if package == "pulumi" and module == "providers":
        return f"{name} provider"
    if package == "command":
        return f"{module} {name}"
    return name


def render_text(result: PlanResult) -> str:
    """The plan as a person reads it: nodes, containers, commands, pools, routes, capacity, policy."""
    spec, run = result.spec, result.run
    out: list[str] = []
    counts = Counter(r.type for r in run.registrations)
    out.append(
        f"llm-cluster plan · stack {result.stack} ({result.config_path}) · {'preview' if result.preview else 'up'} mode"
    )
    out.append(
        f"{len(spec.nodes)} nodes · {len(spec.pools)} pools · {len(all_instances(spec))} serving instances · "
        f"{len(run.registrations)} resources ("
        + ", ".join(f"{n} {type_label(t)}" for t, n in sorted(counts.items()))
        + ")"
    )

    per_node: dict[str, list[Registration]] = defaultdict(list)
    for r in run.registrations:
        if r.urn in result.node_of and r.type in (CONTAINER, REMOTE_COMMAND):
            per_node[result.node_of[r.urn]].append(r)
    out.append("\nNodes")
    for name in spec.nodes:
        node = spec.node(name)
        gpu = f"{node.gpu.count} x {node.gpu.model}" if node.gpu else "no GPUs"
        out.append(f"  {name}  {node.address}  {gpu}")
        for r in per_node.get(name, []):
            inp = r.display_inputs()
            if r.type == REMOTE_COMMAND:
                first = (inp.get("create") or "").strip().splitlines()
                desc = next((ln[2:] for ln in first if ln.startswith("# ") and not ln.startswith("#!")), "")
                out.append(f"    command    {r.name}" + (f"  — {desc}" if desc else ""))
                continue
            labels = _labels(inp)
            image = labels.get("llm-cluster.image") or inp.get("image")
            out.append(
                f"    container  {inp.get('name', r.name)}  {image}  restart={inp.get('restart', 'no')} "
                f"network={inp.get('networkMode', 'bridge')}"
            )
            argv = list(inp.get("entrypoints") or []) + list(inp.get("command") or [])
            if argv:
                out += _wrap("        argv  ", argv)
            env = sorted(inp.get("envs") or [])
            if env:
                out += _wrap("        env   ", env)

    out.append("\nPools")
    for pname, pool in spec.pools.items():
        for inst in instances(spec, pname):
            how = (
                f"TP{inst.tensor_parallel} x PP{inst.pipeline_parallel} on Ray"
                if inst.uses_ray
                else f"TP{inst.tensor_parallel} x PP{inst.pipeline_parallel} on the engine's own launcher "
                f"(rank 0 serves, {len(inst.nodes) - 1} headless)"
                if inst.native_launcher
                else f"TP{inst.tensor_parallel}"
            )
            out.append(
                f"  {pname:<12} {inst.name:<22} {pool.model} · {how} · {'+'.join(inst.nodes)} → "
                f"{endpoint(spec, inst)}/v1"
            )
        if not pool.qualification_gate:
            out.append(
                f"  {pname:<12} starts WITHOUT the qualification gate (pools.{pname}.qualificationGate: false; "
                "refused by the policy pack's qualification-gate unless its config lowers it)"
            )

    out.append("\nWeights")
    for model in dict.fromkeys(p.model for p in spec.pools.values()):
        m = spec.models[model]
        where = weights_nodes(spec, model)
        if m.source.node:
            rounds = fanout_rounds(m.source.node, where)
            how = (
                " · ".join(
                    f"round {i}: " + ", ".join(f"{a}→{b}" for a, b in pairs) for i, pairs in enumerate(rounds, 1)
                )
                or "no copy (one node)"
            )
            out.append(f"  {model:<14} {m.path} from {m.source.node}, verified on every node; {how}")
        elif m.source.shared_mount:
            out.append(f"  {model:<14} {m.path} mounted from {m.source.shared_mount} on {', '.join(where)}")
        else:
            out.append(f"  {model:<14} {m.path} already on {', '.join(where)} (verified)")

    if spec.gateway is not None:
        g = spec.gateway
        auth = "API keys required" if g.auth else "NO API keys: auth is false, lab only"
        scheme = "https" if g.tls else "http"
        out.append(
            f"\nGateway  {scheme}://{spec.node(g.node).address}:{g.port}  ({auth}) · metrics on "
            f":{g.metrics_port}/metrics"
        )
        if g.tls:
            out.append(
                "  TLS: "
                + (
                    "certificate from gatewayTlsCert/gatewayTlsKey"
                    if "gatewayTlsCert" in spec.secrets
                    else "certificate made on the host by its private CA (output gatewayCaCert)"
                )
                + (
                    f"; :{g.http_redirect_port} redirects to HTTPS (a key sent there travels in clear first)"
                    if g.http_redirect_port
                    else "; no plain-HTTP port"
                )
            )
        else:
            out.append("  TLS: OFF — API keys and prompts cross the network in clear")
        shares = split(spec)
        for model, pools in model_pools(spec).items():
            names = spec.served_names(model)
            to = " · ".join(f"{p} {shares[model][p]:g}%" for p in pools) if model in shares else pools[0]
            out.append(f"  model {', '.join(names)} → {to}")
        for alias, pname in g.aliases.items():
            out.append(f"  model {alias} → {pname} (alias)")
        for prefix, pname in g.path_routes.items():
            out.append(f"  path  {prefix} → {pname}")
        out.append(
            f"  path  /v1/ → the pool serving the body's model (unknown model: 404); "
            f"GET /v1/models lists {g.default_pool} first"
        )

    if result.capacity:
        out.append(
            "\nCapacity (as each pool's engine will compute it; weights and KV cache per GPU, KV tokens and concurrency "
            "per instance, rule of thumb for the whole model)"
        )
        out.append(
            f"  {'pool':<11}{'setting':<12}{'weights':>9}{'KV cache':>10}{'KV tokens':>11}"
            f"{'max conc.':>11}{'rule of thumb':>15}  fits"
        )
        out.append(f"  {'':<23}{'/GPU':>9}{'/GPU':>10}{'/instance':>11}{'/instance':>11}{'/model':>15}")
        for pname, entry in result.capacity.items():
            for setting, est in entry.items():
                if "error" in est:
                    out.append(f"  {pname:<11}{setting:<12}{est['error']}")
                    continue
                out.append(
                    f"  {pname:<11}{setting:<12}{est['weights_gib_per_gpu']:>8.1f}G"
                    f"{est['kv_cache_gib_per_gpu']:>9.1f}G{est['kv_tokens']:>11}"
                    f"{est['max_concurrency']:>10.1f}x{est['rule_of_thumb_gib_total']:>13.0f}G  "
                    + ("yes" if est["fits"] else "NO — " + est["reason"])
                )
                if "kv_tokens_low" in est and est["fits"]:
                    # llama.cpp's KV tokens are its -c: what may be larger there is the buffer holding them.
                    kv_gib = (
                        f"{est['kv_cache_gib_per_gpu_high']:.1f}G KV cache/GPU at most"
                        if "kv_cache_gib_per_gpu_high" in est
                        else f"{est['kv_cache_gib_per_gpu_low']:.1f}G KV cache/GPU"
                    )
                    out.append(
                        f"  {'':<23}pessimistic end: {est['kv_tokens_low']} KV tokens, "
                        f"{kv_gib}, {est['max_concurrency_low']:.1f}x "
                        f"(class {est['kv_error_class']}: {est['kv_estimate_error']:.1%} optimistic at worst)"
                    )
        notes = {
            "mlaOn": "with MLA's compressed KV cache (VLLM_MLA_DISABLE unset), for comparison: the policy pack says "
            "whether this GPU and image can run it",
            "mlaOff": "with MLA off (VLLM_MLA_DISABLE=1)",
        }
        for setting in sorted({s for entry in result.capacity.values() for s in entry} - {"asDeployed"}):
            what = notes.get(setting) or (
                f"each instance on {setting[2:]} nodes (pipelineParallel {setting[2:]}), one more than deployed"
            )
            out.append(f"  {setting}: {what}")

    if result.diff is not None:
        out += render_diff(result.diff)

    if result.redactions:
        out.append("\nRedacted (credentials in plain text, shown as [redacted] here and in every file of this plan)")
        out += [f"  {where}" for where in result.redactions]

    out.append("\nPolicy")
    if not result.violations:
        out.append("  no violations")
    # One entry per rule and message, naming every resource it concerns. The pack already reports a pool's
    # fault once (ModelServer rules per pool, container rules as stack policies: policies.rules.grouped);
    # what still repeats is a fault of resources of no pool (an exporter on every node), listed once here.
    grouped: dict[tuple[bool, str, str, str], list[str]] = {}
    for v in sorted(
        result.violations, key=lambda v: (v.enforcement_level != "mandatory", v.policy_name, v.urn, v.message)
    ):
        key = (v.enforcement_level != "mandatory", v.policy_name, v.enforcement_level, v.message)
        grouped.setdefault(key, []).append(v.resource_name)
    for (_, policy, level, message), resources in grouped.items():
        out += textwrap.wrap(
            f"[{level}] {policy} · {', '.join(resources)}: {message}",
            width=110,
            initial_indent="  ",
            subsequent_indent="      ",
        )
    verdict = (
        f"{len(result.mandatory)} mandatory violation(s): `pulumi preview --policy-pack policies` would fail"
        if result.mandatory
        else "no mandatory violation"
    )
    out.append(f"  → {verdict}")
    return "\n".join(out) + "\n"


def plan_json(result: PlanResult) -> dict[str, Any]:
    """The machine-readable plan (contract: resources, policy, capacity — secrets masked)."""
    run = result.run
    return {
        "stack": result.stack,
        "config": result.config_path,
        "mode": "preview" if result.preview else "up",
        "resources": [
            {
                "urn": r.urn,
                "type": r.type,
                "name": r.name,
                "parent": r.parent,
                "custom": r.custom,
                "node": result.node_of.get(r.urn),
                "inputs": r.display_inputs(),
                "dependencies": r.dependencies,
                "propertyDependencies": r.property_dependencies,
                "provider": r.provider,
                "options": r.options,
            }
            for r in run.registrations
        ],
        "outputs": run.stack_outputs,
        "policy": {
            "violations": [
                {
                    "policy": v.policy_name,
                    "enforcementLevel": v.enforcement_level,
                    "urn": v.urn,
                    "resource": v.resource_name,
                    "type": v.resource_type,
                    "message": v.message,
                }
                for v in result.violations
            ],
            "mandatory": len(result.mandatory),
        },
        "capacity": result.capacity,
        "artifacts": result.artifacts,
        "redactions": result.redactions,
        **({"diff": result.diff} if result.diff is not None else {}),
    }


def write_artifacts(files: dict[str, str], out_dir: Path) -> list[str]:
    """Write each artifact under out_dir; return their relative paths."""
    for rel, text in files.items():
        path = out_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return sorted(files)
