"""Wall time of the offline plan for the reference stack and synthetic 60- and 600-node stacks.

Next to each: the floor — a bare Pulumi mock program registering the same number of plain resources
in the same harness — and a second floor registering plain resources with the very same inputs (what
the SDK's per-property serialisation costs, whatever program builds them); the policy pass on its
own. Prints figures and ratios; asserts nothing.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import pulumi

from components.planning.load import load_stack_config
from plan.analyze import analyze
from plan.cli import run as run_cli
from plan.graph import component_graph
from plan.harness import run_main_program, run_program
from plan.report import PlanResult, artifacts_of, plan_json, render_text
from plan.stackfile import load_stack_file

ROOT = Path(__file__).resolve().parent.parent

NS = "llm-cluster:"


def synthetic(nodes: int) -> dict[str, Any]:
    """The reference layout repeated: per 6 nodes a 2-node Ray pool and a 4-node replica pool."""
    base = load_stack_file(ROOT / "Pulumi.prod.yaml", "prod").config
    cfg = copy.deepcopy(base)
    names = [f"gpu-{i:03d}" for i in range(1, nodes + 1)]
    cfg[NS + "nodes"] = {n: {"address": f"10.{i // 250}.{i % 250}.10"} for i, n in enumerate(names)}
    pools: dict[str, Any] = {}
    for k in range(nodes // 6):
        group = names[6 * k : 6 * k + 6]
        pools[f"reasoning-{k}"] = {**copy.deepcopy(base[NS + "pools"]["reasoning"]), "nodes": group[:2]}
        pools[f"chat-{k}"] = {**copy.deepcopy(base[NS + "pools"]["chat"]), "nodes": group[2:]}
    cfg[NS + "pools"] = pools
    cfg[NS + "models"]["deepseek-r1"]["source"] = {"node": names[0]}
    cfg[NS + "models"]["qwen3-30b-a3b"]["source"] = {"node": names[2]}
    cfg[NS + "gateway"].update(node=names[0], defaultPool="chat-0", pathRoutes={"/smart/v1/": "reasoning-0"})
    cfg[NS + "monitoring"]["node"] = names[0]
    return cfg


def floor(inputs: list[dict[str, Any]]) -> float:
    """Seconds for a bare mock program registering one plain resource per inputs dict."""

    def program() -> None:
        for i, props in enumerate(inputs):
            pulumi.CustomResource("bench:index:Plain", f"r{i}", props)

    t = time.perf_counter()
    run_program(program, {}, set(), stack="floor")
    return time.perf_counter() - t


def measure(label: str, config: dict[str, Any]) -> None:
    """Time each phase of the plan for one stack and print it beside the floor."""
    t0 = time.perf_counter()
    spec = load_stack_config(config, set())
    t1 = time.perf_counter()
    run = run_main_program(config, set(), stack=label, preview=True)
    t2 = time.perf_counter()
    violations = analyze(run.registrations)
    t3 = time.perf_counter()
    result = PlanResult(label, "-", True, spec, run, violations, {})
    artifacts_of(run), component_graph(run.registrations), render_text(result), plan_json(result)
    t4 = time.perf_counter()
    n = len(run.registrations)
    bare = floor([{"index": i, "text": "x" * 64} for i in range(n)])
    same = floor([r.plain_inputs() for r in run.registrations])
    total, program = t4 - t0, t2 - t1
    print(
        f"{label:>10}: {len(spec.nodes):4d} nodes {n:6d} resources | validate {t1 - t0:5.2f}s "
        f"program {program:6.2f}s = {program / bare:4.2f}x floor ({bare:5.2f}s), "
        f"{program / same:4.2f}x same-inputs floor ({same:5.2f}s) | policy {t3 - t2:5.2f}s "
        f"report {t4 - t3:5.2f}s | total {total:6.2f}s = {1000 * total / len(spec.nodes):5.1f} ms/node"
    )


def main() -> None:
    """Reference stack, then 60 and 600 nodes."""
    measure("reference", load_stack_file(ROOT / "Pulumi.prod.yaml", "prod").config)
    for nodes in (60, 600):
        measure(f"{nodes}-node", synthetic(nodes))


if __name__ == "__main__":
    run_cli(main)
