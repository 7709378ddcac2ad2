"""What can this cluster run, and how: every deployment of a model the engines, their images and the policy
pack allow on the stack's GPUs, judged as `make plan` judges a pool, and ranked by the goal.

    python -m plan.advise [--stack prod | --gpu "Tesla V100-SXM2-32GB" --gpus-per-node 8 --nodes 6
                           [--memory-gib 768]] [--model NAME | --config-json PATH] [--context 8192]
                          [--goal concurrency|context|nodes] [--runbook] [--format text|json]
                          [--write-pool NAME [--pick N]]

For each model (the catalog's, or one) it tries each registered engine with the image its facts say runs on
the GPU, each form of the weights the engine loads (fp16, GPTQ/AWQ int4, FP8, GGUF quants), each tensor x
pipeline layout the nodes allow, one node's worth of replicas: a one-pool stack on the stack's own nodes,
validated by the spec, sized by the engine's capacity model and judged by the pack's mandatory rules on
its ModelServer. `--runbook` judges the runbook's model table row by row. `--write-pool` prints the models
and pools blocks of the chosen deployment, ready for Pulumi.<stack>.yaml. Exit status 0, 2 on bad input.
"""

from __future__ import annotations

import argparse
import copy
import json
import multiprocessing
import os
import re
import sys
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml
from google.protobuf import struct_pb2
from pulumi.runtime import proto
from pulumi_policy import EnforcementLevel

from components.engines.base import Engine
from components.engines.registry import ENGINES, default_engine
from components.engines.weights import CheckpointFormat
from components.facts.hardware import GPUS, gpu
from components.facts.models import MODELS, ModelArch, arch_from_config_json, context_window, model_arch
from components.facts.runbook import RUNBOOK_IMAGE, RUNBOOK_ROWS, RUNBOOK_SOURCE, RunbookRow
from components.marks import MODEL_SERVER
from components.planning.load import load_stack_config
from components.resources.model_server import server_props
from components.spec import SpecError, StackSpec
from components.spec.topology import instances
from plan.analyze import configured_servicer
from plan.cli import run as run_cli
from plan.stackfile import load_stack_file
from policies.pack import POLICIES
from policies.rules.common import pool_where

POOL = "advice"
GOALS = ("concurrency", "context", "nodes")
DEFAULT_CONTEXT = 8192
PROG = "python -m plan.advise"
# Documentation addresses (RFC 5737) for nodes described on the command line: planned, never contacted.
_CLI_ADDRESSES = "192.0.2."


class UsageError(Exception):
    """Bad command-line input: one line, exit status 2."""


@dataclass(frozen=True)
class Hardware:
    """The GPU nodes deployments are placed on, and the stack config the candidate pools are planned in."""

    gpu: str
    gpus_per_node: int
    nodes: tuple[str, ...]
    config: Mapping[str, Any]
    secret_keys: frozenset[str]

    @property
    def capability(self) -> int:
        return gpu(self.gpu).capability


@dataclass(frozen=True)
class Candidate:
    """One deployment of one model: engine, image, form of the weights, layout, context."""

    model: str  # catalog name, or the config.json's model name
    arch: ModelArch
    engine: Engine
    image: str
    evidence: str  # the evidence level of the engine x GPU fact behind the image
    fmt: CheckpointFormat
    tp: int
    pp: int
    replicas_per_node: int
    nodes: tuple[str, ...]
    context: int
    capability: int  # the GPU's compute capability
    config_json: str | None = None

    @property
    def model_key(self) -> str:
        """The models.* name of this checkpoint in a stack (a DNS label: `llama-3.3-70b` -> `llama-3-3-70b`)."""
        name = self.model if self.fmt.quantization is None else f"{self.model}-{self.fmt.label}"
        return re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:63]

    def describe(self) -> str:
        """'vllm vllm/vllm-openai:v0.19.1 gptq-int4 TP 8 x PP 2 (2 nodes)'."""
        where = f"{len(self.nodes)} nodes" if len(self.nodes) > 1 else "1 node"
        reps = f", {self.replicas_per_node} replicas per node" if self.replicas_per_node > 1 else ""
        return f"{self.engine.name} {self.image} {self.fmt.label} TP {self.tp} x PP {self.pp} ({where}{reps})"

    def model_block(self) -> dict[str, Any]:
        source = {"configJson": self.config_json} if self.config_json else {"arch": self.model}
        return {
            **source,
            "path": f"/data/models/{self.model_key}",
            **self.fmt.model_keys(self.arch),
            "servedNames": [self.model],
            "source": {"node": self.nodes[0]},
        }

    def pool_block(self) -> dict[str, Any]:
        block: dict[str, Any] = {
            "model": self.model_key,
            "nodes": list(self.nodes),
            "engine": self.engine.name,
            "image": self.image,
            "tensorParallel": self.tp,
        }
        if self.pp > 1:
            block["pipelineParallel"] = self.pp
        if self.replicas_per_node > 1:
            block["replicasPerNode"] = self.replicas_per_node
        block[self.engine.options_key] = self.engine.advice_options(self.context, self.fmt, self.model_key)
        env = self.engine.advice_env(self.arch, self.image, self.capability)
        if env:
            block["env"] = env
        return block


@dataclass
class Judged:
    """A candidate and what planning it said: refused (the first reason) or its capacity figures."""

    candidate: Candidate
    refused: str | None = None
    capacity: dict[str, Any] = field(default_factory=dict)
    advisories: list[str] = field(default_factory=list)

    @property
    def kv_tokens(self) -> int:
        return int(self.capacity.get("kv_tokens") or 0)

    @property
    def error(self) -> float | None:
        """The estimate's measured optimistic error, where its engine has one (the capacity's range)."""
        return self.capacity.get("kv_estimate_error")

    @property
    def kv_tokens_pessimistic(self) -> int:
        """KV tokens at the pessimistic end of the estimate (the capacity's range; unmeasured: as is)."""
        return int(self.capacity.get("kv_tokens_low", self.kv_tokens))

    @property
    def concurrency(self) -> float:
        """Full-context sequences one instance holds at once, at the pessimistic end."""
        return self.kv_tokens_pessimistic / self.candidate.context

    @property
    def concurrency_per_node(self) -> float:
        c = self.candidate
        return self.concurrency * c.replicas_per_node / len(c.nodes)

    @property
    def longest_context(self) -> int:
        """The longest request one instance can hold: its KV tokens (pessimistic), up to the model's window."""
        window = int(self.capacity.get("context_window") or 0) or self.kv_tokens_pessimistic
        return min(self.kv_tokens_pessimistic, window)

    @property
    def tight(self) -> bool:
        """Fits at the central estimate, not at the pessimistic end: one full-context sequence may not fit."""
        return self.kv_tokens >= self.candidate.context > self.kv_tokens_pessimistic

    def figures(self) -> dict[str, Any]:
        c = self.candidate
        return {
            "engine": c.engine.name,
            "image": c.image,
            "evidence": c.evidence,
            "formatEvidence": c.engine.format_evidence(c.image, c.capability),
            "format": c.fmt.label,
            "tensorParallel": c.tp,
            "pipelineParallel": c.pp,
            "replicasPerNode": c.replicas_per_node,
            "nodes": len(c.nodes),
            "weightsGibPerGpu": self.capacity.get("weights_gib_per_gpu"),
            "kvTokens": self.kv_tokens,
            "kvTokensPessimistic": self.kv_tokens_pessimistic,
            "kvEstimateError": self.error,
            "context": c.context,
            "concurrency": round(self.concurrency, 2),
            "concurrencyPerNode": round(self.concurrency_per_node, 2),
            "tight": self.tight,
            "advisories": self.advisories,
        }


# -- hardware ----------------------------------------------------------------------------------------------


def hardware_of_stack(path: Path) -> Hardware:
    """The GPU nodes of a stack file (those with the first node's GPU model) and its config."""
    stack = load_stack_file(path)
    spec = load_stack_config(stack.config, stack.secret_keys)
    return _hardware(spec, stack.config, stack.secret_keys)


def _hardware(spec: StackSpec, config: Mapping[str, Any], secret_keys: frozenset[str]) -> Hardware:
    first = spec.node(next(iter(spec.nodes))).gpu
    if first is None:
        raise UsageError("the stack's first node states no GPU (nodes.<node>.gpu)")
    nodes = tuple(n for n in spec.nodes if (g := spec.node(n).gpu) is not None and g.model == first.model)
    return Hardware(first.model, first.count, nodes, config, secret_keys)


def hardware_of_cli(gpu_name: str, gpus_per_node: int, nodes: int, memory_gib: float | None) -> Hardware:
    """Nodes described on the command line, planned at documentation addresses."""
    if gpu_name not in GPUS:
        raise UsageError(f"--gpu {gpu_name!r}: not in the facts table; known: {', '.join(sorted(GPUS))}")
    if not 1 <= nodes <= 250 or not 1 <= gpus_per_node <= 16:
        raise UsageError("--nodes must be 1..250 and --gpus-per-node 1..16")
    names = [f"gpu-{i:02d}" for i in range(1, nodes + 1)]
    defaults: dict[str, Any] = {"gpu": {"model": gpu_name, "count": gpus_per_node}}
    if memory_gib is not None:
        defaults["memoryGib"] = memory_gib
    config = {
        "llm-cluster:ssh": {"user": "root", "agent": True},
        "llm-cluster:nodeDefaults": defaults,
        "llm-cluster:nodes": {n: {"address": f"{_CLI_ADDRESSES}{i}"} for i, n in enumerate(names, start=1)},
        "llm-cluster:gateway": {"node": names[0], "apiKeys": [{"id": "default"}]},
    }
    return Hardware(gpu_name, gpus_per_node, tuple(names), config, frozenset())


# -- candidates --------------------------------------------------------------------------------------------


def node_layouts(engine: Engine, hw: Hardware) -> list[tuple[int, int, int]]:
    """(TP, PP 1, replicas per node): a node filled with replicas at each tensor-parallel size."""
    sizes = sorted({t for t in (1, 2, 4, 8, 16) if t <= hw.gpus_per_node} | {hw.gpus_per_node})
    if "tensor" not in engine.multi_gpu:
        sizes = [1]
    return [(tp, 1, hw.gpus_per_node // tp) for tp in sizes]


def pipeline_layouts(engine: Engine, hw: Hardware) -> list[tuple[int, int, int]]:
    """(TP = a node, PP, 1) for PP = 2 .. the nodes: instances across nodes, for engines that span them."""
    if engine.multi_node == "none" or not {"tensor", "pipeline"} <= set(engine.multi_gpu):
        return []
    return [(hw.gpus_per_node, pp, 1) for pp in range(2, len(hw.nodes) + 1)]


def candidate(
    model: str,
    arch: ModelArch,
    engine: Engine,
    image: tuple[str, Any],
    fmt: CheckpointFormat,
    layout: tuple[int, int, int],
    hw: Hardware,
    context: int,
    config_json: str | None,
) -> Candidate:
    (ref, cell), (tp, pp, reps) = image, layout
    return Candidate(
        model, arch, engine, ref, cell.evidence, fmt, tp, pp, reps, hw.nodes[:pp], context, hw.capability, config_json
    )


# -- judging -----------------------------------------------------------------------------------------------


class Judge:
    """Plans one-pool stacks on the hardware and asks the pack about their ModelServer."""

    def __init__(self, hw: Hardware):
        self.hw = hw
        self.servicer = configured_servicer()
        self.mandatory = {
            p.name
            for p in POLICIES
            if (p.enforcement_level or EnforcementLevel.MANDATORY) is EnforcementLevel.MANDATORY
        }

    def config(self, c: Candidate) -> dict[str, Any]:
        config = copy.deepcopy(dict(self.hw.config))
        config["llm-cluster:models"] = {c.model_key: c.model_block()}
        config["llm-cluster:pools"] = {POOL: c.pool_block()}
        gateway = dict(config.get("llm-cluster:gateway") or {})
        gateway["defaultPool"] = POOL
        gateway.pop("pathRoutes", None)
        gateway["apiKeys"] = [
            {k: v for k, v in key.items() if k not in ("pools", "models")} for key in gateway.get("apiKeys") or []
        ]
        config["llm-cluster:gateway"] = gateway
        return config

    def judge(self, c: Candidate) -> Judged:
        try:
            spec = load_stack_config(self.config(c), self.hw.secret_keys)
        except SpecError as err:
            return Judged(c, refused=f"spec: {err.issues[0]}")
        props = server_props(spec, instances(spec, POOL)[0])
        capacity = dict(props.get("capacity") or {})
        window = context_window(c.arch)
        capacity["context_window"] = window[0] if window else None
        found = self.analyze(props)
        refusals = [f"{name}: {message}" for name, message in found if name in self.mandatory]
        if refusals:
            return Judged(c, refused=refusals[0], capacity=capacity)
        return Judged(c, capacity=capacity, advisories=[name for name, _ in found if name not in self.mandatory])

    def analyze(self, props: Mapping[str, Any]) -> list[tuple[str, str]]:
        """(policy, message without its description) for each violation the pack finds on the ModelServer."""
        s = struct_pb2.Struct()
        s.update(json.loads(json.dumps(props, default=str)))
        urn = f"urn:pulumi:advice::llm-cluster::{MODEL_SERVER}::{POOL}"
        request = proto.AnalyzeRequest(urn=urn, type=MODEL_SERVER, name=POOL, properties=s)
        # Each message is the policy's description, then the pool's subject (per_pool), then what it says.
        subject = f"{pool_where(POOL, [str(m) for m in props.get('poolInstances') or []])}: "
        return [
            (d.policyName, d.message.split("\n", 1)[-1].removeprefix(subject))
            for d in self.servicer.Analyze(request, None).diagnostics
        ]


# -- ranking -----------------------------------------------------------------------------------------------


def rank(passed: list[Judged], goal: str) -> list[Judged]:
    """Best first: `concurrency` (full-context sequences per node, pessimistic), `context` (the longest request
    an instance holds), `nodes` (fewest nodes, then concurrency); ties to fewer GPUs, then the engine order.

    Each node an instance spans beyond the fewest any deployment needs halves its concurrency score: a pipeline
    stage across nodes adds a network hop per token, which KV figures do not show, so a wider instance must hold
    twice as much per node to rank first."""
    order = list(ENGINES)
    fewest = min((len(j.candidate.nodes) for j in passed), default=1)

    def key(j: Judged) -> tuple[Any, ...]:
        c = j.candidate
        tail = (c.tp * c.pp, order.index(c.engine.name), c.fmt.label)
        score = j.concurrency_per_node / 2 ** (len(c.nodes) - fewest)
        if goal == "nodes":
            return (len(c.nodes), -j.concurrency_per_node, *tail)
        if goal == "context":
            return (-j.longest_context, len(c.nodes), *tail)
        return (-score, len(c.nodes), *tail)

    return sorted(passed, key=key)


@dataclass
class ModelAdvice:
    """A model's verdict: its ranked deployments, and each refused one with its first reason."""

    model: str
    arch: ModelArch
    ranked: list[Judged]
    refused: list[Judged]

    @property
    def verdict(self) -> str:
        return "runs" if self.ranked else "cannot run"

    def to_json(self) -> dict[str, Any]:
        best = self.ranked[0] if self.ranked else None
        return {
            "model": self.model,
            "verdict": self.verdict,
            "best": (
                {
                    **best.figures(),
                    "pool": best.candidate.pool_block(),
                    "modelBlock": {best.candidate.model_key: best.candidate.model_block()},
                }
                if best
                else None
            ),
            "options": [j.figures() for j in self.ranked[1:]],
            "refused": [{"option": j.candidate.describe(), "reason": j.refused} for j in self.refused],
        }


def advise_model(
    judge: Judge, model: str, arch: ModelArch, context: int, goal: str, config_json: str | None = None
) -> ModelAdvice:
    """Every engine x form of the weights: each node layout, and the pipeline layout over the fewest nodes that
    starts (from 2 nodes up; more stages than that only add network hops per token)."""
    hw = judge.hw
    judged: list[Judged] = []
    for engine in ENGINES.values():
        image = engine.advice_image(hw.capability)
        if image is None:
            continue
        for fmt in engine.advice_formats:
            on_a_node = [
                judge.judge(candidate(model, arch, engine, image, fmt, lay, hw, context, config_json))
                for lay in node_layouts(engine, hw)
            ]
            judged += on_a_node
            for lay in pipeline_layouts(engine, hw):
                j = judge.judge(candidate(model, arch, engine, image, fmt, lay, hw, context, config_json))
                judged.append(j)
                if j.refused is None:
                    break
    return ModelAdvice(
        model,
        arch,
        rank([j for j in judged if j.refused is None], goal),
        [j for j in judged if j.refused is not None],
    )


_WORKER_JUDGE: list[Judge] = []  # the judge a forked worker inherits


def _advise(judge: Judge, job: tuple[str, ModelArch, str | None, int, str]) -> ModelAdvice:
    model, arch, config_json, context, goal = job
    return advise_model(judge, model, arch, context, goal, config_json)


def _advise_in_worker(job: tuple[str, ModelArch, str | None, int, str]) -> ModelAdvice:
    return _advise(_WORKER_JUDGE[0], job)


def advise_models(
    judge: Judge, models: list[tuple[str, ModelArch, str | None]], context: int, goal: str
) -> dict[str, ModelAdvice]:
    """advise_model for each model, one model per CPU at a time (forked workers share the loaded pack)."""
    jobs = [(m, arch, cj, context, goal) for m, arch, cj in models]
    workers = min(len(jobs), os.cpu_count() or 1)
    if workers < 2 or "fork" not in multiprocessing.get_all_start_methods():
        return {job[0]: _advise(judge, job) for job in jobs}
    _WORKER_JUDGE[:] = [judge]
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
        return {job[0]: advice for job, advice in zip(jobs, pool.map(_advise_in_worker, jobs))}


# -- the runbook's table -----------------------------------------------------------------------------------


@dataclass
class RowVerdict:
    """A runbook row judged: as written, the nearest deployment that starts (what changes) and the best."""

    row: RunbookRow
    verdict: str  # "runs as written" | "runs differently" | "cannot run" | "not in the catalog"
    why: str  # why it does not start as written (the pack's or the spec's first reason, with its source)
    nearest: Judged | None = None
    changes: list[str] = field(default_factory=list)
    best: Judged | None = None
    why_on_image: str = ""  # why the written layout does not start on the engine's image for the GPU either


def nearest(advice: ModelAdvice, written: Candidate) -> Judged | None:
    """The deployment that starts with the fewest changes to the written one: same form of the weights, then
    same engine, then same layout; the better ranked first among equals."""

    def changes(j: Judged) -> tuple[bool, bool, bool, int]:
        c = j.candidate
        return (
            c.fmt.label != written.fmt.label,
            c.engine.name != written.engine.name,
            (c.tp, c.pp) != (written.tp, written.pp),
            advice.ranked.index(j),
        )

    return min(advice.ranked, key=changes) if advice.ranked else None


def changes_from(written: Candidate, to: Candidate) -> list[str]:
    """What differs, as a person edits it: 'image vllm/vllm-openai:v0.19.1 (not v0.9.2)'."""
    out = []
    if to.engine.name != written.engine.name:
        out.append(f"engine {to.engine.name} (not {written.engine.name})")
    if to.image != written.image:
        out.append(f"image {to.image} (not {written.image})")
    if to.fmt.label != written.fmt.label:
        out.append(f"weights {to.fmt.label} (not {written.fmt.label})")
    if (to.tp, to.pp, to.replicas_per_node) != (written.tp, written.pp, written.replicas_per_node):
        reps = f", {to.replicas_per_node} replicas per node" if to.replicas_per_node > 1 else ""
        out.append(f"TP {to.tp} x PP {to.pp}{reps} (not TP {written.tp} x PP {written.pp})")
    if to.pool_block().get("env"):
        out.append(", ".join(f"env {k}={v}" for k, v in to.pool_block()["env"].items()))
    return out


def judge_row(judge: Judge, row: RunbookRow, advice: ModelAdvice | None, context: int) -> RowVerdict:
    """The row as written (the default engine, the runbook's image, its precision and layout), then the
    nearest deployment that starts and the best the project knows."""
    if row.model is None or advice is None:
        return RowVerdict(row, "not in the catalog", "the model catalog has no such model (components/facts/models.py)")
    best = advice.ranked[0] if advice.ranked else None
    engine = default_engine()
    fmt = next((f for f in engine.advice_formats if f.label == row.precision), None)
    tp = row.tensor_parallel or judge.hw.gpus_per_node
    pp = row.pipeline_parallel or 1
    if fmt is None or pp > len(judge.hw.nodes):
        why = f"{engine.name} loads no {row.precision} checkpoint" if fmt is None else f"PP {pp} needs {pp} nodes"
        return RowVerdict(row, "runs differently" if best else "cannot run", why, best, [], best)
    reps = judge.hw.gpus_per_node // tp if pp == 1 else 1
    written = Candidate(
        row.model,
        advice.arch,
        engine,
        RUNBOOK_IMAGE,
        RUNBOOK_SOURCE.evidence.value,
        fmt,
        tp,
        pp,
        reps,
        judge.hw.nodes[:pp],
        context,
        judge.hw.capability,
    )
    as_written = judge.judge(written)
    if as_written.refused is None:
        return RowVerdict(row, "runs as written", "", as_written, [], best)
    # The written deployment on the image the engine's facts give for the GPU, else the nearest that starts.
    image = engine.advice_image(judge.hw.capability)
    on_image = judge.judge(replace(written, image=image[0], evidence=image[1].evidence)) if image else None
    near = on_image if on_image is not None and on_image.refused is None else nearest(advice, written)
    still = on_image.refused or "" if on_image is not None else ""
    if near is None:
        return RowVerdict(row, "cannot run", as_written.refused, why_on_image=still)
    changes = changes_from(written, near.candidate)
    return RowVerdict(row, "runs differently", as_written.refused, near, changes, best, why_on_image=still)


# -- output ------------------------------------------------------------------------------------------------


def render_model(a: ModelAdvice, top: int = 3) -> str:
    lines = [f"{a.model} ({a.arch.hf_id}): {a.verdict}"]
    for i, j in enumerate(a.ranked[:top]):
        lines.append(
            f"  {'best' if i == 0 else f'#{i + 1} '}  {j.candidate.describe()}  [image {j.candidate.evidence}]"
        )
        lines.append("         " + _figures_line(j))
        launcher = j.candidate.engine.advice_launcher(j.candidate.image) if j.candidate.pp > 1 else None
        if launcher:
            lines.append(f"         across nodes on Ray as proposed, or without Ray: {launcher}")
    if not a.ranked:
        reasons = dict.fromkeys(j.refused for j in a.refused if j.refused)
        for reason in list(reasons)[:3]:
            lines.append(f"  refused: {reason}")
    else:
        lines.append(f"  {len(a.ranked)} deployments start, {len(a.refused)} refused")
    return "\n".join(lines)


def _figures_line(j: Judged) -> str:
    c = j.candidate
    err = f", -{j.error:.1%} pessimistic" if j.error else ", error unmeasured"
    formats = c.engine.format_evidence(c.image, c.capability)
    tight = "  TIGHT: one full-context sequence fits only at the central estimate" if j.tight else ""
    return (
        f"weights {float(j.capacity.get('weights_gib_per_gpu') or 0):.1f} GiB/GPU, KV {j.kv_tokens:,} tokens "
        f"({j.kv_tokens_pessimistic:,}{err}), {j.concurrency:.1f} x {j.candidate.context} tokens per instance, "
        f"{j.concurrency_per_node:.1f} per node; weight formats [{formats or 'unknown'}]{tight}"
    )


def render_runbook(rows: list[RowVerdict], hw: Hardware, context: int) -> str:
    head = (
        f"The runbook's model table on {len(hw.nodes)} x {hw.gpus_per_node} {hw.gpu}, at {context} tokens per "
        f"request; each row as written is vLLM {RUNBOOK_IMAGE} ({RUNBOOK_SOURCE})"
    )
    lines = [head]
    for v in rows:
        layout = f"TP {v.row.tensor_parallel} x PP {v.row.pipeline_parallel}" if v.row.tensor_parallel else "—"
        lines += ["", f"{v.row.written} {v.row.precision} ({v.row.weights}, {layout}): {v.verdict}"]
        if v.changes:
            lines.append(f"    change: {'; '.join(v.changes)}")
        if v.why:
            lines.append(f"    as written: {v.why}")
        if v.why_on_image:
            lines.append(f"    on the engine's image for this GPU too: {v.why_on_image}")
        if v.nearest is not None:
            lines.append(f"    nearest: {v.nearest.candidate.describe()} [image {v.nearest.candidate.evidence}]")
            lines.append(f"             {_figures_line(v.nearest)}")
        if v.best is not None and (v.nearest is None or v.best.candidate.describe() != v.nearest.candidate.describe()):
            lines.append(f"    best:    {v.best.candidate.describe()} [image {v.best.candidate.evidence}]")
            lines.append(f"             {_figures_line(v.best)}")
    return "\n".join(lines)


def runbook_markdown(rows: list[RowVerdict]) -> str:
    """The runbook table as the README shows it: one line per row, the verdict, what changes, and the best."""
    out = [
        "| runbook row | as written | verdict | what changes | best deployment | full-context sequences per node | evidence |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for v in rows:
        r = v.row
        layout = f"TP {r.tensor_parallel} × PP {r.pipeline_parallel}" if r.tensor_parallel else "—"
        why = v.why.split(":", 1)[0] if v.verdict != "not in the catalog" else "not in the catalog"
        best = v.best or v.nearest
        out.append(
            " | ".join(
                [
                    f"| {r.written} {r.precision}",
                    f"{r.weights}, {layout}",
                    f"{v.verdict} (`{why}`)" if v.verdict != "not in the catalog" else v.verdict,
                    "; ".join(v.changes) or "—",
                    best.candidate.describe().replace(" x ", " × ") if best else "—",
                    f"{best.concurrency_per_node:.1f}" if best else "—",
                    best.candidate.evidence if best else "—",
                ]
            )
            + " |"
        )
    return "\n".join(out)


def write_pool(a: ModelAdvice, name: str, pick: int) -> str:
    if not a.ranked:
        raise UsageError(f"{a.model}: no deployment starts on this hardware, nothing to write")
    if not 1 <= pick <= len(a.ranked):
        raise UsageError(f"--pick {pick}: choose 1..{len(a.ranked)}")
    c = a.ranked[pick - 1].candidate
    doc = {
        "config": {"llm-cluster:models": {c.model_key: c.model_block()}, "llm-cluster:pools": {name: c.pool_block()}}
    }
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=None)


# -- command line ------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    where = p.add_mutually_exclusive_group()
    where.add_argument("--stack", default=None, help="plan on the GPU nodes of Pulumi.<stack>.yaml (default prod)")
    where.add_argument("--gpu", help="or describe the nodes: GPU model as nvidia-smi names it")
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--memory-gib", type=float, default=None, help="host RAM per node, GiB")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--model", help=f"one catalog model ({', '.join(sorted(MODELS))})")
    which.add_argument("--config-json", help="one model from its config.json (path)")
    p.add_argument("--context", type=int, default=DEFAULT_CONTEXT, help="tokens per request (prompt + output)")
    p.add_argument("--goal", choices=GOALS, default="concurrency")
    p.add_argument("--runbook", action="store_true", help="judge the runbook's model table row by row")
    p.add_argument("--format", choices=("text", "json", "markdown"), default="text", help="markdown: --runbook only")
    p.add_argument("--write-pool", metavar="NAME", help="print the models and pools blocks of --model's choice")
    p.add_argument("--pick", type=int, default=1, help="with --write-pool: the N-th ranked deployment")
    return p


def _models(args: argparse.Namespace) -> list[tuple[str, ModelArch, str | None]]:
    if args.config_json:
        path = Path(args.config_json)
        try:
            arch = arch_from_config_json(json.loads(path.read_text()), path.parent.name or path.stem)
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise UsageError(f"--config-json {path}: {e}") from None
        return [(arch.name, arch, str(path.resolve()))]
    if args.model:
        if args.model not in MODELS:
            raise UsageError(f"--model {args.model!r}: not in the catalog; known: {', '.join(sorted(MODELS))}")
        return [(args.model, model_arch(args.model), None)]
    return [(name, model_arch(name), None) for name in MODELS]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:
        return 0 if e.code == 0 else 2
    try:
        if args.context < 16:
            raise UsageError(f"--context {args.context}: at least 16 tokens")
        if args.gpu:
            hw = hardware_of_cli(args.gpu, args.gpus_per_node, args.nodes, args.memory_gib)
        else:
            hw = hardware_of_stack(Path(f"Pulumi.{args.stack or 'prod'}.yaml"))
        if args.write_pool and not (args.model or args.config_json):
            raise UsageError("--write-pool needs --model or --config-json")
        judge = Judge(hw)
        advice = advise_models(judge, _models(args), args.context, args.goal)
        if args.write_pool:
            print(write_pool(next(iter(advice.values())), args.write_pool, args.pick), end="")
            return 0
        if args.runbook:
            rows = [judge_row(judge, row, advice.get(row.model or ""), args.context) for row in RUNBOOK_ROWS]
            if args.format == "json":
                print(json.dumps([_row_json(v) for v in rows], indent=2))
            elif args.format == "markdown":
                print(runbook_markdown(rows))
            else:
                print(render_runbook(rows, hw, args.context))
            return 0
        if args.format == "json":
            print(json.dumps([a.to_json() for a in advice.values()], indent=2))
        else:
            print(
                f"{len(hw.nodes)} x {hw.gpus_per_node} {hw.gpu}, {args.context} tokens per request, goal {args.goal}\n"
            )
            print("\n\n".join(render_model(a) for a in advice.values()))
    except (UsageError, SpecError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def _row_json(v: RowVerdict) -> dict[str, Any]:
    return {
        "model": v.row.written,
        "catalog": v.row.model,
        "precision": v.row.precision,
        "asWritten": {"tensorParallel": v.row.tensor_parallel, "pipelineParallel": v.row.pipeline_parallel},
        "verdict": v.verdict,
        "changes": v.changes,
        "why": v.why,
        "whyOnImage": v.why_on_image,
        "nearest": v.nearest.figures() if v.nearest else None,
        "best": v.best.figures() if v.best else None,
    }


if __name__ == "__main__":
    run_cli(main)
