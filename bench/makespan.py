"""Makespan of `pulumi up` for a stack: the dependency graph's critical path vs the runbook's one-after-another.

Run: .venv/bin/python -m bench.makespan [--plan build/plan/prod/plan.json] [--stack-file Pulumi.prod.yaml]
Without --plan it runs the program under the mock runtime itself (a plan.json on disk may be stale).
Figures only: nothing here is asserted by a test.

Step durations (seconds). Sources: the runbook (000_*.txt: "首次启动加载模型 5~15 分钟", the 200G link of
each node); the rest are stated assumptions, changeable with the flags below.
  image pull      compressed image size / --pull-gbps (per node; the vLLM image ~9 GiB: assumption)
  weights copy    model size / the target node's HCA rate (`hca.rateGbps`, "at the link's speed"), or --copy-gbps
  manifest/verify model size / --hash-gibps (sha256 of every file on the source / on the target)
  model load      --load-min .. --load-max minutes (runbook: 5-15 min), one figure per scenario
  containers 10 s, Ray join 30 s, hosts 2 s, preflight 20 s, other commands 5 s
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.planning.load import load_stack_config
from components.planning.nodes.scripts import model_size_bytes
from components.spec import StackSpec
from components.spec.topology import all_instances
from plan.cli import run as run_cli
from plan.stackfile import load_stack_file

ROOT = Path(__file__).resolve().parents[1]

GIB = 1024**3
# Compressed sizes of the images the stack pulls (assumption: registry figures of these lines).
IMAGE_GIB = {"vllm/vllm-openai": 9.0, "nvcr.io/nvidia/k8s/dcgm-exporter": 1.6}
DEFAULT_IMAGE_GIB = 0.2  # nginx, node-exporter, prometheus, grafana: tens to a few hundred MB
FIXED_S = {"container": 10.0, "ray-gate": 30.0, "hosts": 2.0, "preflight": 20.0, "command": 5.0, "volume": 1.0}


@dataclass(frozen=True)
class Step:
    """One resource as a step of the deployment: what it is, how long it takes, what it waits for."""

    urn: str
    name: str
    kind: str
    seconds: float
    after: tuple[str, ...]


@dataclass(frozen=True)
class Rates:
    """The assumptions the durations derive from."""

    pull_gbps: float
    hash_gibps: float
    load_s: float
    copy_gbps: float | None = None  # None: each target's HCA rate


def resources(plan: Path | None, stack_file: Path, stack: str) -> list[dict[str, Any]]:
    """plan.json's resources, or the same fields from a mock run of the program."""
    if plan is not None:
        return json.loads(plan.read_text())["resources"]
    from plan.harness import run_main_program

    config = load_stack_file(stack_file, stack).config
    run = run_main_program(config, set(), stack=stack)
    return [
        {"urn": r.urn, "type": r.type, "name": r.name, "custom": r.custom, "dependencies": r.dependencies}
        for r in run.registrations
    ]


def _image_gib(ref: str) -> float:
    return IMAGE_GIB.get(ref.rsplit(":", 1)[0], DEFAULT_IMAGE_GIB)


def classify(res: dict[str, Any], spec: StackSpec, rates: Rates) -> tuple[str, float]:
    """(kind, seconds) of one resource from its type and name."""
    name, typ = res["name"], res["type"]
    if not res.get("custom", True) or typ.startswith("pulumi:providers:"):
        return "component", 0.0
    if typ == "docker:index/remoteImage:RemoteImage":
        ref = (res.get("inputs") or {}).get("name") or _image_ref_from_name(name, spec)
        return "image pull", _image_gib(ref) * GIB * 8 / (rates.pull_gbps * 1e9)
    if typ == "docker:index/container:Container":
        return "container", FIXED_S["container"]
    if typ == "docker:index/volume:Volume":
        return "volume", FIXED_S["volume"]
    weights = re.match(r"weights-(.+)-(manifest|copy|verify|check|mount)-.*?(gpu-[\w-]+|[\w-]+)$", name)
    if weights and weights.group(1) in spec.models:
        model, step = weights.group(1), weights.group(2)
        size = model_size_bytes(spec, model)
        if step == "copy":
            target = name.rsplit("-to-", 1)[-1]
            hca = spec.node(target).hca
            gbps = rates.copy_gbps or (hca.rate_gbps if hca else 10)
            return "weights copy", size * 8 / (gbps * 1e9)
        if step in ("manifest", "verify"):
            return f"weights {step}", size / (rates.hash_gibps * GIB)
        return f"weights {step}", FIXED_S["command"]
    if name.endswith("-health"):
        return "model load", rates.load_s
    if name.endswith("-ray-gate"):
        return "ray-gate", FIXED_S["ray-gate"]
    for kind in ("hosts", "preflight"):
        if name.endswith(f"-{kind}"):
            return kind, FIXED_S[kind]
    return "command", FIXED_S["command"]


def _image_ref_from_name(name: str, spec: StackSpec) -> str:
    """A mock run's resources carry no inputs here: recover the image from the resource name."""
    return "vllm/vllm-openai" if "vllm-openai" in name else name


def steps_of(res: list[dict[str, Any]], spec: StackSpec, rates: Rates) -> dict[str, Step]:
    """Every resource as a Step keyed by URN."""
    out = {}
    for r in res:
        kind, seconds = classify(r, spec, rates)
        out[r["urn"]] = Step(r["urn"], r["name"], kind, seconds, tuple(r.get("dependencies") or ()))
    return out


def critical_path(steps: dict[str, Step]) -> tuple[float, list[Step]]:
    """Longest chain of durations through the dependency graph (what `pulumi up` waits for at best)."""
    finish: dict[str, float] = {}
    via: dict[str, str | None] = {}

    def end(urn: str) -> float:
        if urn not in finish:
            step = steps[urn]
            before = [(end(d), d) for d in step.after if d in steps]
            start, prev = max(before, default=(0.0, None))
            finish[urn], via[urn] = start + step.seconds, prev
        return finish[urn]

    last = max(steps, key=end)
    chain: list[Step] = []
    cur: str | None = last
    while cur is not None:
        chain.append(steps[cur])
        cur = via[cur]
    return finish[last], chain[::-1]


def _fmt(seconds: float) -> str:
    return f"{seconds / 60:6.1f} min"


def main(argv: list[str] | None = None) -> int:
    """Print both makespans and their ratio for a fast and a slow model load."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--plan",
        type=Path,
        help="read this plan.json (default: run the program under mocks, so the figures never come from a stale plan)",
    )
    p.add_argument("--stack", default="prod")
    p.add_argument("--stack-file", type=Path, default=ROOT / "Pulumi.prod.yaml")
    p.add_argument("--pull-gbps", type=float, default=1.0, help="registry bandwidth per node (Gbit/s)")
    p.add_argument("--hash-gibps", type=float, default=1.0, help="sha256 over the weights (GiB/s)")
    p.add_argument(
        "--copy-gbps",
        type=float,
        help="weights copy rate (Gbit/s; default: the HCA's rate; "
        "a single rsync over SSH is disk- and CPU-bound, often 5-10)",
    )
    p.add_argument("--load-min", type=float, default=5.0, help="fast model load (minutes)")
    p.add_argument("--load-max", type=float, default=15.0, help="slow model load (minutes)")
    args = p.parse_args(argv)
    if args.plan is not None and not args.plan.exists():
        p.error(f"{args.plan} does not exist (run `make plan`, or leave --plan out)")
    spec = load_stack_config(load_stack_file(args.stack_file, args.stack).config, set())
    res = resources(args.plan, args.stack_file, args.stack)
    print(
        f"stack {args.stack}: {sum(1 for r in res if r.get('custom', True))} resources from "
        f"{args.plan or 'a mock run of the program'}; {len(all_instances(spec))} serving instances"
    )
    copy = f"{args.copy_gbps:g} Gbit/s" if args.copy_gbps else "each target's HCA rate"
    print(
        f"assumptions: pull {args.pull_gbps:g} Gbit/s per node, sha256 {args.hash_gibps:g} GiB/s, copies at {copy}, "
        + ", ".join(f"{m} {model_size_bytes(spec, m) / GIB:.0f} GiB" for m in spec.models)
    )
    for label, minutes in (("fast load", args.load_min), ("slow load", args.load_max)):
        steps = steps_of(res, spec, Rates(args.pull_gbps, args.hash_gibps, minutes * 60, args.copy_gbps))
        path_s, chain = critical_path(steps)
        serial_s = sum(s.seconds for s in steps.values())
        print(f"\n{label} ({minutes:g} min per model load)")
        print(f"  pulumi up, critical path   {_fmt(path_s)}")
        print(f"  runbook, one after another {_fmt(serial_s)}")
        print(f"  ratio                      {serial_s / path_s:6.1f}x")
        print("  critical path: " + " -> ".join(f"{s.name} ({s.seconds:.0f}s)" for s in chain if s.seconds))
    return 0


if __name__ == "__main__":
    run_cli(main)
