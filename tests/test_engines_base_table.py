"""The engine seam's shared code (components/engines/base.py) as tables: the Engine defaults every engine that
does not override them runs (read on a toy engine, so each default is seen alone), the engine-neutral helpers
(credentials in an argv, container names and labels, NCCL settings, endpoints), and the scripts the server
containers run (the readiness gate, the watchdog with its world check), compared as the exact text they write.

No bash here: the gate and the watchdog are run for real against fake servers and sockets in
tests/test_startup_failures.py and tests/test_vllm_watchdog.py (the real-tool tier). Their whole text, for one
set of inputs each way every branch of the generator goes, is committed in tests/fixtures/engines/base-scripts/: a
deliberate change to a generator changes it (`.venv/bin/python -m tests.test_engines_base_table` writes the
new text; the diff in git is the review of what the containers will run)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pytest

from components.engines.base import (
    GIVE_UP_GRACE_S,
    REDACTED,
    WATCHDOG_SCRIPT,
    Engine,
    WorldCheck,
    container_envs,
    container_labels,
    container_name,
    endpoint,
    health_gate_script,
    health_probe_argv,
    instance_watchdog_script,
    masked_secrets,
    native_worker_role,
    nccl_env,
    offline_env,
    planned_capability,
    ready_url,
    secret_positions,
    server_container_name,
    startup_failure_advice,
    supervised_argv,
    watchdog_script,
)
from components.engines.registry import ENGINES
from components.facts.engine_matrix import Cell
from components.facts.evidence import code, observed
from components.facts.startup_failures import COMMON as COMMON_STARTUP_FAILURES
from components.spec import SpecError, StackSpec
from components.spec.engines import Launcher
from components.spec.topology import Instance
from tests.conftest import ROOT, prod_config
from tests.support.engine_stacks import lmdeploy_config, spec_of

FIXTURES = ROOT / "tests" / "fixtures" / "engines" / "base-scripts"
CHAT_IMAGE = "vllm/vllm-openai:v0.19.1"  # the reference stack's image of both pools


# --- a toy engine: the base class's defaults, each seen alone -------------------------------------------------


@dataclass(frozen=True)
class Quant:
    min_capability: int | None


@dataclass(frozen=True)
class Facts:
    """A toy image's facts: what the base class reads of them."""

    metrics: Mapping[str, str] = field(default_factory=dict)
    quantizations: Mapping[str, Quant] = field(default_factory=dict)
    sources: Mapping[str, Any] = field(default_factory=dict)


class Toy(Engine):
    name: ClassVar[str] = "toy"
    title: ClassVar[str] = "Toy Engine"
    server_role: ClassVar[str] = "toy"
    multi_gpu: ClassVar[tuple[str, ...]] = ()
    multi_node: ClassVar[Any] = "native"
    metrics_job: ClassVar[str] = "toy"
    memory_keys: ClassVar[str] = "toy.memory"
    options_key: ClassVar[str] = "toy"
    required_option: ClassVar[str] = "size"
    context_key: ClassVar[str] = "toyContext"
    default_image: ClassVar[str] = "toy/server:2"
    # Each placeholder once and <pool> twice, so a name filled in the wrong place or only once shows.
    typed_flags: ClassVar[Mapping[str, str]] = {
        "--toy-size": "pools.<pool>.toy.size",
        "--served": "models.<model>.servedNames",
        "-a": "nodes.<node>.address (pool <pool>, model <model>, again <pool>)",
        "--max-model-len": "pools.<pool>.toy.len",
    }
    hub_flags: ClassVar[Mapping[str, str]] = {
        "--path": "path",
        "--repo": "always",
        "--lora": "lora",
        "--spec": "json-model",
    }
    table: ClassVar[Mapping[str, Facts]] = {}
    refs: ClassVar[list[str]] = []
    cells: ClassVar[Mapping[tuple[str, int], Cell]] = {}

    def image_table(self) -> Mapping[str, Any]:
        return self.table

    def image_refs(self) -> list[str]:
        return list(self.refs)

    def image_cell(self, ref: str, capability: int) -> Cell | None:
        return self.cells.get((ref, capability))

    def context_length(self, spec: StackSpec, pool: str) -> int:
        return 1

    def serve_argv(self, spec: StackSpec, instance: Instance) -> list[str]:
        return ["toy-serve", instance.name, "--host", spec.node(instance.head).address, "--port", str(instance.port)]

    def serve_env(self, spec: StackSpec, instance: Instance, node: str) -> dict[str, str]:
        return {}

    def capacity(self, spec: StackSpec, pool: str, *, mla: bool | None = None) -> dict[str, object]:
        return {}


TOY = Toy()


def ref_spec(**chat: Any) -> StackSpec:
    """The reference stack, its chat pool's keys changed by `chat` (its vllm block by `vllm`)."""
    config = prod_config()
    pool = config["llm-cluster:pools"]["chat"]
    pool["vllm"].update(chat.pop("vllm", {}))
    pool.update(chat)
    return spec_of(config)


# --- Engine.canonical_flag (LMDeploy's: vLLM and llama.cpp read their own aliases) -------------------------

# (argv token, the long flag it sets or None for a value)
FLAGS: list[tuple[str, str | None]] = [
    ("--session-len", "--session-len"),
    ("--session_len", "--session-len"),
    ("--session_len=8", "--session-len"),
    ("--a_b_c=x_y", "--a-b-c"),
    ("--x=a=b", "--x"),
    ("--", "--"),
    ("--=v", "--"),
    ("-tp", "-tp"),
    ("-tp=2", "-tp"),
    ("-t_p", "-t_p"),  # a short flag keeps its underscores
    ("-", None),
    ("-1", None),
    ("-1.5", None),
    ("-9x", None),  # a negative number's first digit is enough
    ("x-y", None),
    ("8", None),
    ("", None),
]


@pytest.mark.parametrize(("token", "flag"), FLAGS)
def test_the_default_canonical_flag(token: str, flag: str | None) -> None:
    assert TOY.canonical_flag(token) == flag
    assert ENGINES["lmdeploy"].canonical_flag(token) == flag


def test_typed_key_fills_in_every_name_and_knows_only_its_flags() -> None:
    args = {"pool": "chat", "model": "qwen", "node": "gpu-03"}
    assert TOY.typed_key("--toy-size", **args) == "pools.chat.toy.size"
    assert TOY.typed_key("--served", **args) == "models.qwen.servedNames"
    assert TOY.typed_key("-a", **args) == "nodes.gpu-03.address (pool chat, model qwen, again chat)"
    assert [TOY.typed_key(f, **args) for f in ("--toy_size", "--seed", "", "-A")] == [None] * 4


def test_extra_args_naming_a_typed_flag_are_refused_each_with_its_index() -> None:
    spec = ref_spec(vllm={"extraArgs": ["--seed", "7", "--toy_size=3", "-a", "10.0.0.1", "--served", "-1"]})
    assert TOY.extra_args_issues(spec, "chat") == TOY.spec_issues(spec, "chat")
    assert [(i.path, i.message) for i in TOY.spec_issues(spec, "chat")] == [
        (
            "pools.chat.toy.extraArgs[2]",
            "'--toy_size=3' is set by the typed key pools.chat.toy.size: state it there instead",
        ),
        (
            "pools.chat.toy.extraArgs[3]",
            "'-a' is set by the typed key nodes.<node>.address (pool chat, model qwen3-30b-a3b, again chat): "
            "state it there instead",
        ),
        (
            "pools.chat.toy.extraArgs[5]",
            "'--served' is set by the typed key models.qwen3-30b-a3b.servedNames: state it there instead",
        ),
    ]
    assert TOY.extra_args_issues(ref_spec(vllm={"extraArgs": ["--seed", "7"]}), "chat") == []


def test_lmdeploy_refuses_its_typed_flags_in_extra_args_through_the_base_rule() -> None:
    with pytest.raises(SpecError) as err:
        spec_of(lmdeploy_config(extraArgs=["--log-level", "INFO", "--tp=2", "--model_name", "x"]))
    assert [(i.path, i.message) for i in err.value.issues] == [
        (
            "pools.chat.lmdeploy.extraArgs[2]",
            "'--tp=2' is set by the typed key pools.chat.tensorParallel: state it there instead",
        ),
        (
            "pools.chat.lmdeploy.extraArgs[3]",
            "'--model_name' is set by the typed key models.qwen3-30b-a3b.servedNames: state it there instead",
        ),
    ]


def test_one_node_engines_refuse_pipeline_parallel_above_one_only() -> None:
    spec = spec_of(prod_config())
    assert spec.pools["reasoning"].pipeline_parallel == 2 and spec.pools["chat"].pipeline_parallel == 1
    assert TOY.one_node_issues(spec, "chat", "why") == []
    assert [(i.path, i.message) for i in TOY.one_node_issues(spec, "reasoning", "it has no launcher")] == [
        (
            "pools.reasoning.pipelineParallel",
            "vllm pools run on one node: it has no launcher; serve one replica per node (pipelineParallel 1), or "
            "use engine: vllm for tensor x pipeline parallel across nodes",
        )
    ]


# --- hub downloads -----------------------------------------------------------------------------------------

# (server argv, (flag, what it would fetch) for each hub download) with --path: "path", --repo: "always",
# --lora: "lora" (name=path pairs up to the next flag), --spec: "json-model".
HUB: list[tuple[list[str], list[tuple[str, str]]]] = [
    ([], []),
    (["--seed", "org/model"], []),
    (["--path", "org/tok"], [("--path", "org/tok")]),
    (["--path=org/tok"], [("--path", "org/tok")]),
    (["--path", "/data/tok"], []),
    (["--path=/data/tok"], []),
    (["--path", ""], []),
    (["--path"], []),
    (["--path", "a/b", "c/d"], [("--path", "a/b")]),  # one value
    (["x", "--path", "a/b", "--path", "c/d"], [("--path", "a/b"), ("--path", "c/d")]),
    (["--repo", "org/model"], [("--repo", "org/model")]),
    (["--repo", "/abs/too"], [("--repo", "/abs/too")]),  # a repository or URL is always downloaded
    (["--repo="], []),
    (["--lora", "a=org/a", "b=/data/b", "org/c", "--seed", "d=org/d"], [("--lora", "org/a"), ("--lora", "org/c")]),
    (["--lora", "a=org/a", "b=org/b"], [("--lora", "org/a"), ("--lora", "org/b")]),  # to the end of the argv
    (["--lora=a=org/a", "b=org/b"], [("--lora", "org/a")]),  # `=` gives one value
    (["--lora", "--seed", "a=org/a"], []),
    (["--lora", "a="], [("--lora", "a=")]),  # no path after `=`: the whole value
    (["--lora", "moe=org/E=128,N=96"], [("--lora", "org/E=128,N=96")]),  # the name ends at the first `=`
    (["--lora", '{"name": "a", "path": "org/a"}'], [("--lora", "org/a")]),
    (["--lora", ' {"name": "a", "path": "/data/a"}'], []),
    (["--lora", '{"name": "a", "path": 7}'], []),
    (["--lora", '{"name": "a"}'], []),
    (["--lora", '{"name": "a", "path": ""}'], []),
    (["--lora", "{not json"], []),
    (["--lora", "[1]"], [("--lora", "[1]")]),  # not an object: read as a name=path pair without `=`
    (["--lora", '{"path": "org/a"} '], [("--lora", "org/a")]),
    (["--spec", '{"model": "org/draft", "num_speculative_tokens": 3}'], [("--spec", "org/draft")]),
    (["--spec", ' {"model": "org/draft"}'], [("--spec", "org/draft")]),
    (["--spec", '{"model": "/data/draft"}'], []),
    (["--spec", '{"model": ""}'], []),
    (["--spec", '{"model": 3}'], []),
    (["--spec", '{"method": "ngram"}'], []),
    (["--spec", "{broken"], []),
    (["--spec", "org/draft"], []),  # not JSON: nothing to read
    (["--spec", '["model"]'], []),
    (["--spec", '"org/draft"'], []),  # JSON, but no object
    (["--spec", "7"], []),
]


@pytest.mark.parametrize(("argv", "fetched"), HUB)
def test_hub_downloads_of_each_flag_kind(argv: list[str], fetched: list[tuple[str, str]]) -> None:
    assert TOY.hub_downloads(argv) == fetched


# --- facts -------------------------------------------------------------------------------------------------


@pytest.fixture
def toy_images(monkeypatch: pytest.MonkeyPatch) -> None:
    """Toy facts for the reference stack's image and one private one."""
    monkeypatch.setattr(
        Toy,
        "table",
        {
            CHAT_IMAGE: Facts(
                metrics={"requests": "toy_requests_total"},
                quantizations={"a": Quant(70), "b": Quant(None), "c": Quant(71), "d": Quant(60)},
                sources={"model_formats": observed("a report on a V100")},
            ),
            "toy/private:1": Facts(sources={"other": code("x")}),
        },
    )


def test_image_facts_are_read_by_the_tables_key(toy_images: None) -> None:
    assert TOY.image_facts_of(f"docker.io/{CHAT_IMAGE}@sha256:{'a' * 64}") is Toy.table[CHAT_IMAGE]
    assert TOY.image_facts_of("toy/other:1") is None
    spec = spec_of(prod_config())
    assert TOY.image_facts(spec, "chat") is Toy.table[CHAT_IMAGE]
    assert TOY.metric_names(spec, "chat") == {"requests": "toy_requests_total"}
    unknown = ref_spec(image="toy/other:1")
    assert TOY.image_facts(unknown, "chat") is None
    assert TOY.metric_names(unknown, "chat") == {}
    assert TOY.accepted_quantizations(unknown, "chat", 90) == frozenset()


@pytest.mark.parametrize(
    ("capability", "accepted"),
    [(59, set()), (60, {"d"}), (69, {"d"}), (70, {"a", "d"}), (71, {"a", "c", "d"}), (90, {"a", "c", "d"})],
)
def test_accepted_quantizations_from_each_methods_minimum(
    toy_images: None, capability: int, accepted: set[str]
) -> None:
    assert TOY.accepted_quantizations(spec_of(prod_config()), "chat", capability) == frozenset(accepted)


def test_format_evidence_reads_the_model_formats_source(toy_images: None) -> None:
    # An observed fact is observed on the GPU it was seen on (sm_70), read from code elsewhere.
    assert [TOY.format_evidence(CHAT_IMAGE, c) for c in (70, 80)] == ["observed", "read from code"]
    assert TOY.format_evidence("toy/private:1", 70) is None  # its facts do not say
    assert TOY.format_evidence("toy/other:1", 70) is None
    lm = ENGINES["lmdeploy"]
    assert lm.format_evidence("openmmlab/lmdeploy:v0.16.0-cu12.8", 70) == "read from code"
    assert lm.format_evidence("openmmlab/lmdeploy:v9", 70) is None


def test_facts_without_sources_say_nothing_of_formats(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Toy, "table", {"toy/bare:1": object()})
    assert TOY.format_evidence("toy/bare:1", 70) is None


def test_sizing_starts_from_the_pools_facts_or_the_fallback_and_its_nodes_gpu(toy_images: None) -> None:
    fallback = Facts()
    # One node in the pool: the GPU is its first node's.
    spec = ref_spec(nodes=["gpu-04"])
    facts, node_gpu = TOY.sizing_inputs(spec, "chat", fallback)
    assert facts is Toy.table[CHAT_IMAGE] and node_gpu is spec.node("gpu-04").gpu
    assert node_gpu is not None and node_gpu.model == "Tesla V100-SXM2-32GB"
    facts, _ = TOY.sizing_inputs(ref_spec(nodes=["gpu-04"], image="toy/other:1"), "chat", fallback)
    assert facts is fallback
    with pytest.raises(AssertionError):
        TOY.sizing_inputs(ref_spec(image="toy/other:1"), "chat", None)


# --- the engines x GPU table and the placement advisor's defaults ---------------------------------------------


def test_matrix_rows_are_one_per_image_named_by_label_or_title(monkeypatch: pytest.MonkeyPatch) -> None:
    yes, no = Cell("deployed", "observed"), Cell("no", "read from code")
    monkeypatch.setattr(Toy, "refs", ["toy/server:1", "toy/server:2"])
    monkeypatch.setattr(Toy, "cells", {("toy/server:1", 70): yes, ("toy/server:2", 80): no})
    rows = TOY.matrix_rows()
    assert [name for name, _ in rows] == ["Toy Engine `toy/server:1`", "Toy Engine `toy/server:2`"]
    # One cell per generation of the table, in its order (sm_70 first).
    assert rows[0][1][0] is yes and rows[1][1][0] is None
    assert no in rows[1][1] and yes not in rows[1][1]
    monkeypatch.setattr(Toy, "matrix_label", "Toy TurboMind")
    assert [name for name, _ in TOY.matrix_rows()] == ["Toy TurboMind `toy/server:1`", "Toy TurboMind `toy/server:2`"]


# (known images in the table's order, (image, capability) -> verdict, capability, the image proposed)
ADVICE: list[tuple[list[str], dict[tuple[str, int], str], int, str | None]] = [
    ([], {}, 70, None),
    (["toy/server:1"], {("toy/server:1", 70): "deployed"}, 70, "toy/server:1"),
    (["toy/server:1"], {("toy/server:1", 70): "deployed"}, 80, None),
    # The default image first where it runs, whatever the table's order.
    (
        ["toy/server:1", "toy/server:2"],
        {("toy/server:1", 70): "deployed", ("toy/server:2", 70): "deployed"},
        70,
        "toy/server:2",
    ),
    # Else the first known image that runs: "no" is no, any other verdict runs.
    (
        ["toy/server:1", "toy/server:3", "toy/server:2"],
        {
            ("toy/server:2", 70): "no",
            ("toy/server:3", 70): "deployed (PTX JIT)",
            ("toy/server:1", 70): "runs, not deployed",
        },
        70,
        "toy/server:1",
    ),
    (
        ["toy/server:1", "toy/server:3"],
        {("toy/server:1", 70): "no", ("toy/server:3", 70): "deployed (PTX JIT)"},
        70,
        "toy/server:3",
    ),
    (["toy/server:1", "toy/server:3"], {("toy/server:1", 70): "no", ("toy/server:3", 70): "no"}, 70, None),
]


@pytest.mark.parametrize(("refs", "verdicts", "capability", "proposed"), ADVICE)
def test_advice_image_is_the_default_where_it_runs_else_the_first_that_does(
    monkeypatch: pytest.MonkeyPatch,
    refs: list[str],
    verdicts: dict[tuple[str, int], str],
    capability: int,
    proposed: str | None,
) -> None:
    cells = {k: Cell(v, "read from code") for k, v in verdicts.items()}
    monkeypatch.setattr(Toy, "refs", refs)
    monkeypatch.setattr(Toy, "cells", cells)
    found = TOY.advice_image(capability)
    assert found == (None if proposed is None else (proposed, cells[(proposed, capability)]))


def test_the_defaults_an_engine_without_its_own_gets() -> None:
    url = "http://10.0.0.1:8000/health"
    assert (
        TOY.probe_argv(url)
        == health_probe_argv(url)
        == [
            "python3",
            "-c",
            "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=10)",
            url,
        ]
    )
    assert TOY.launcher(None) == Launcher("native")
    assert TOY.knows_image("toy/server:2") is False
    assert TOY.advice_options(4096, "hf", "m") == {"toyContext": 4096}
    assert TOY.fit_problems({"fits": False, "reason": "too big", "advice": "lower it"}, "chat", "m") == [
        "does not fit: too big. To fit: lower it."
    ]
    assert TOY.fit_problems({"fits": True, "advice": "x"}, "chat", "m") == []


def test_an_engine_without_a_capacity_estimator_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    assert TOY.capacity_cli(["--gpu", "x"], "python -m ops.capacity") == 2
    out = capsys.readouterr()
    assert (out.out, out.err) == ("", "error: python -m ops.capacity: no capacity estimator for toy pools\n")


def test_node_argv_is_the_servers_on_the_head_and_refused_elsewhere() -> None:
    spec = spec_of(prod_config())
    two = Instance("reasoning", "reasoning-x", ("gpu-01", "gpu-02"), 8000, 8, 2, None, "native", 29500)
    assert TOY.node_argv(spec, two, "gpu-01") == [
        "toy-serve",
        "reasoning-x",
        "--host",
        "192.168.10.11",
        "--port",
        "8000",
    ]
    with pytest.raises(NotImplementedError) as err:
        TOY.node_argv(spec, two, "gpu-02")
    assert str(err.value) == "Toy Engine has no launcher of its own across nodes"


def test_the_startup_failures_are_the_engines_own_then_the_common_ones() -> None:
    lm = ENGINES["lmdeploy"]
    assert lm.startup_failures == lm.own_startup_failures + COMMON_STARTUP_FAILURES
    advice = startup_failure_advice(lm, "chat", "qwen")
    assert len(advice) == len(lm.startup_failures) == 5
    pattern, text = advice[0]
    assert pattern == "No decoding kernel found|No attention kernel found|No feasible kernel found for the problem"
    assert text.startswith(
        "TurboMind has no kernel for this model's shapes on this GPU (on V100: head dim 256 decoding, whose 3-stage "
        "kernel needs more than sm_70's 96 KB of shared memory). Fix: a model whose attention TurboMind runs on sm_70 "
        "(head dim 128) in pools.chat.model, a newer LMDeploy in pools.chat.image (lmdeploy PR #4412), or "
        "pools.chat.engine: vllm ("
    )
    assert [p for p, _ in advice[1:]] == [f.pattern for f in COMMON_STARTUP_FAILURES]
    # The memory keys the advice names are the engine's own.
    assert any("lmdeploy.cacheMaxEntryCount or sessionLen" in t for _, t in advice)
    assert all("lmdeploy.cacheMaxEntryCount" not in t for _, t in startup_failure_advice(TOY, "chat", "qwen"))
    assert any("toy.memory" in t for _, t in startup_failure_advice(TOY, "chat", "qwen"))
    # And the model's stack keys are the model's (vLLM's float32-only fix names its dtype key).
    assert any("models.qwen.dtype: half" in t for _, t in startup_failure_advice(ENGINES["vllm"], "chat", "qwen"))


# --- credentials in an argv ----------------------------------------------------------------------------------

SECRETS = {"--api-key": "+", "--hf-token": "1"}
# (argv, (index, flag) of each credential)
POSITIONS: list[tuple[list[str], list[tuple[int, str]]]] = [
    ([], []),
    (["--seed", "7"], []),
    (["--hf-token", "t1"], [(1, "--hf-token")]),
    (["--hf-token", "t1", "t2"], [(1, "--hf-token")]),  # one value
    (["--hf-token"], []),
    (["--hf-token", "--seed"], []),
    (["--hf-token=t1", "t2"], [(0, "--hf-token")]),
    (["--api-key", "k1", "k2", "--seed", "k3"], [(1, "--api-key"), (2, "--api-key")]),
    (["x", "--api-key", "k1", "k2"], [(2, "--api-key"), (3, "--api-key")]),  # to the end of the argv
    (["--api-key", "--seed", "k1"], []),
    (["--api-key=k1", "k2"], [(0, "--api-key")]),
    (
        ["--api-key", "k1", "--hf-token", "t1", "--api-key", "k2"],
        [(1, "--api-key"), (3, "--hf-token"), (5, "--api-key")],
    ),
    (["--api_key", "k1", "--api-keys", "k2"], []),
    # A credential given with `=` and then another.
    (["--api-key=k1", "--hf-token", "t1"], [(0, "--api-key"), (2, "--hf-token")]),
    (["--hf-token=t1", "--api-key", "k1", "k2"], [(0, "--hf-token"), (2, "--api-key"), (3, "--api-key")]),
]


@pytest.mark.parametrize(("argv", "positions"), POSITIONS)
def test_secret_positions(argv: list[str], positions: list[tuple[int, str]]) -> None:
    assert secret_positions(argv, SECRETS) == positions


# (argv, the argv masked)
MASKED: list[tuple[list[str], list[str]]] = [
    (["--seed", "7"], ["--seed", "7"]),
    (["--hf-token", "t1", "t2"], ["--hf-token", REDACTED, "t2"]),
    (["--hf-token=t1", "x"], [f"--hf-token={REDACTED}", "x"]),
    (["--api-key", "k1", "k2", "--seed", "7"], ["--api-key", REDACTED, REDACTED, "--seed", "7"]),
    (["--api-key=k1", "k2"], [f"--api-key={REDACTED}", "k2"]),
]


@pytest.mark.parametrize(("argv", "masked"), MASKED)
def test_masked_secrets(argv: list[str], masked: list[str]) -> None:
    assert REDACTED == "[redacted]"
    given = tuple(argv)
    assert masked_secrets(given, SECRETS) == masked
    assert masked_secrets(list(argv), {}) == argv


# --- containers: names, labels, env --------------------------------------------------------------------------

ONE = Instance("chat", "chat-gpu-03", ("gpu-03",), 8000, 8, 1, None)
RAY = Instance("reasoning", "reasoning-gpu-01", ("gpu-01", "gpu-02"), 8000, 8, 2, None, "ray")
NATIVE = Instance("reasoning", "reasoning-gpu-01", ("gpu-01", "gpu-02"), 8000, 8, 2, None, "native", 29500)
# A one-node instance that names Ray (no instance the planner makes): it spans no node, so no Ray head.
ONE_RAY = Instance("chat", "chat-gpu-03", ("gpu-03",), 8000, 8, 1, None, "ray")


@pytest.mark.parametrize(
    ("role", "name"),
    [
        ("vllm", "vllm-chat-gpu-03"),
        ("ray-head", "ray-head-chat-gpu-03"),
        ("a1-b2-", "a1-b2--chat-gpu-03"),
        ("7", "7-chat-gpu-03"),
    ],
)
def test_container_name_of_a_role(role: str, name: str) -> None:
    assert container_name(ONE, role) == name


@pytest.mark.parametrize("role", ["", "ray head", "ray_head", "-", "--", "a.b", "a/b", "é-x"])
def test_container_name_refuses_a_role_that_is_not_letters_digits_and_dashes(role: str) -> None:
    if role == "é-x":  # isalnum takes any letter: docker's own check refuses it later
        assert container_name(ONE, role) == "é-x-chat-gpu-03"
        return
    with pytest.raises(ValueError) as err:
        container_name(ONE, role)
    assert str(err.value) == f"container role {role!r} must be letters, digits and '-'"


@pytest.mark.parametrize(
    ("engine", "instance", "name"),
    [
        ("vllm", ONE, "vllm-chat-gpu-03"),
        ("vllm", RAY, "ray-head-reasoning-gpu-01"),
        ("vllm", NATIVE, "vllm-reasoning-gpu-01"),
        ("vllm", ONE_RAY, "vllm-chat-gpu-03"),
        ("lmdeploy", ONE, "lmdeploy-chat-gpu-03"),
        ("lmdeploy", RAY, "lmdeploy-reasoning-gpu-01"),  # an engine not on Ray runs its own server anyway
        ("llamacpp", ONE, "llamacpp-chat-gpu-03"),
    ],
)
def test_the_server_container(engine: str, instance: Instance, name: str) -> None:
    assert server_container_name(ENGINES[engine], instance) == name


def test_native_worker_role() -> None:
    assert [native_worker_role(e) for e in (ENGINES["vllm"], TOY)] == ["vllm-worker", "toy-worker"]


def test_endpoint_and_ready_url_are_on_the_heads_address() -> None:
    spec = spec_of(prod_config())
    assert endpoint(spec, ONE) == "http://192.168.10.13:8000"
    assert endpoint(spec, RAY) == "http://192.168.10.11:8000"
    assert ready_url(ENGINES["vllm"], spec, RAY) == "http://192.168.10.11:8000/health"

    class Ready(Toy):
        ready_path: ClassVar[str] = "/v1/models"

    assert ready_url(Ready(), spec, ONE) == "http://192.168.10.13:8000/v1/models"


def test_container_labels() -> None:
    spec = spec_of(prod_config())
    assert container_labels(spec, RAY, "gpu-02", "ray-worker") == {
        "llm-cluster.role": "ray-worker",
        "llm-cluster.pool": "reasoning",
        "llm-cluster.instance": "reasoning-gpu-01",
        "llm-cluster.node": "gpu-02",
        "llm-cluster.gpu-model": "Tesla V100-SXM2-32GB",
        "llm-cluster.image": CHAT_IMAGE,
        "llm-cluster.engine": "vllm",
    }
    mixed = prod_config()
    mixed["llm-cluster:nodes"]["gpu-04"]["gpu"] = {"model": "NVIDIA A100-SXM4-80GB", "count": 8}
    mixed["llm-cluster:pools"]["chat"]["nodes"] = ["gpu-04"]
    one = Instance("chat", "chat-gpu-04", ("gpu-04",), 8000, 8, 1, None)
    assert container_labels(spec_of(mixed), one, "gpu-04", "vllm")["llm-cluster.gpu-model"] == "NVIDIA A100-SXM4-80GB"
    assert planned_capability(spec_of(mixed), "gpu-04") == 80
    assert planned_capability(spec, "gpu-01") == 70


@pytest.mark.parametrize("offline", [True, False])
def test_offline_env_unless_the_pool_says_offline_false(offline: bool) -> None:
    variables = {"HF_HUB_OFFLINE": "1", "DO_NOT_TRACK": "1"}
    got = offline_env(ref_spec(offline=offline), "chat", variables)
    assert got == (variables if offline else {})
    got["X"] = "1"  # a copy: the engine's table stays as it was
    assert variables == {"HF_HUB_OFFLINE": "1", "DO_NOT_TRACK": "1"}


def test_container_envs_are_sorted_key_value_pairs() -> None:
    assert container_envs({"b": "2", "A": "x=y", "a": ""}) == ["A=x=y", "a=", "b=2"]
    assert container_envs({}) == []


# --- NCCL settings per node ------------------------------------------------------------------------------------

BOND = {"NCCL_SOCKET_IFNAME": "bond0", "GLOO_SOCKET_IFNAME": "bond0"}
# (nodeDefaults changes (None drops a key), nccl section, the env of a node)
NCCL: list[tuple[dict[str, Any], dict[str, Any], dict[str, str]]] = [
    (
        {},
        {},
        {"NCCL_IB_DISABLE": "0", "NCCL_IB_HCA": "mlx5_0", "NCCL_IB_GID_INDEX": "3", **BOND, "NCCL_DEBUG": "WARN"},
    ),
    (
        {"hca": {"device": "mlx5_1", "port": 2, "linkLayer": "ethernet", "gidIndex": 0}},
        {"ibDisable": True, "debug": "INFO"},
        {"NCCL_IB_DISABLE": "1", "NCCL_IB_HCA": "mlx5_1:2", "NCCL_IB_GID_INDEX": "0", **BOND, "NCCL_DEBUG": "INFO"},
    ),
    # InfiniBand needs no GID index, even one given.
    (
        {"hca": {"device": "mlx5_0", "port": 1, "linkLayer": "infiniband", "gidIndex": 3}},
        {},
        {"NCCL_IB_DISABLE": "0", "NCCL_IB_HCA": "mlx5_0", **BOND, "NCCL_DEBUG": "WARN"},
    ),
    (
        {"hca": {"device": "mlx5_0", "port": 3, "linkLayer": "infiniband"}},
        {},
        {"NCCL_IB_DISABLE": "0", "NCCL_IB_HCA": "mlx5_0:3", **BOND, "NCCL_DEBUG": "WARN"},
    ),
    ({"hca": None}, {}, {"NCCL_IB_DISABLE": "0", **BOND, "NCCL_DEBUG": "WARN"}),
    ({"hca": None, "interface": None}, {}, {"NCCL_IB_DISABLE": "0", "NCCL_DEBUG": "WARN"}),
    # The extra variables last, over the product's own.
    (
        {"hca": None, "interface": "eth1"},
        {"extraEnv": {"NCCL_DEBUG": "TRACE", "NCCL_P2P_LEVEL": "NVL"}},
        {
            "NCCL_IB_DISABLE": "0",
            "NCCL_SOCKET_IFNAME": "eth1",
            "GLOO_SOCKET_IFNAME": "eth1",
            "NCCL_DEBUG": "TRACE",
            "NCCL_P2P_LEVEL": "NVL",
        },
    ),
]


@pytest.mark.parametrize(("defaults", "nccl", "env"), NCCL)
def test_nccl_env_of_a_node(defaults: dict[str, Any], nccl: dict[str, Any], env: dict[str, str]) -> None:
    config = prod_config()
    node_defaults = config["llm-cluster:nodeDefaults"]
    for key, value in defaults.items():
        if value is None:
            node_defaults.pop(key)
        else:
            node_defaults[key] = value
    config["llm-cluster:nccl"].update(nccl)
    if "hca" not in node_defaults:  # only nodes of a pool that spans nodes need one
        config["llm-cluster:pools"]["reasoning"]["pipelineParallel"] = 1
    got = nccl_env(spec_of(config), "gpu-03")
    assert got == env
    assert list(got) == list(env)  # the order docker's sorted list does not need, but a reader of the code does


# --- the scripts ---------------------------------------------------------------------------------------------

URL = "http://192.168.10.13:8000/health"

# name -> the script, for the committed fixtures (tests/fixtures/engines/base-scripts/<name>).
SCRIPTS: dict[str, Callable[[], str]] = {
    # The gate as the defaults write it: no failures to look for, nothing else to check.
    "gate-defaults.sh": lambda: health_gate_script(
        URL, 1800, "vllm-chat-gpu-03", server="vLLM", memory_keys="vllm.gpuMemoryUtilization or maxModelLen"
    ),
    # Every argument given: two failures (quotes and brackets in them), two other containers to check.
    "gate-all.sh": lambda: health_gate_script(
        "http://[fd00::1]:8001/v1/models?x=1&y=2",
        900,
        "lmdeploy-chat gpu-03's",
        server="LMDeploy TurboMind",
        memory_keys="lmdeploy.cacheMaxEntryCount or sessionLen",
        interval_s=7,
        progress_every_s=45,
        failures=[
            ("CUDA out of memory|OOM \\[x\\]", "lower 'it' in \"pools\""),
            ("no kernel (sm_70)", "$HOME is kept"),
        ],
        max_deaths=4,
        also_check=["docker logs vllm-worker-reasoning-gpu-02 on gpu-02", "its NCCL log"],
    ),
    "gate-one-also.sh": lambda: health_gate_script(
        URL, 60, "c", server="s", memory_keys="k", also_check=["docker logs w on n"], failures=[("a", "b")]
    ),
    "watchdog-off.sh": lambda: watchdog_script(URL, load_timeout_s=1800, unhealthy_after_s=0),
    "watchdog-negative.sh": lambda: watchdog_script(URL, load_timeout_s=1800, unhealthy_after_s=-5),
    # The defaults: python3's probe, 15 s rounds, GIVE_UP_GRACE_S, no world.
    "watchdog-defaults.sh": lambda: watchdog_script(URL, load_timeout_s=1800, unhealthy_after_s=1),
    "watchdog-all.sh": lambda: watchdog_script(
        "http://h:1/ready?a='b'",
        load_timeout_s=600,
        unhealthy_after_s=120,
        interval_s=3,
        probe_argv=["curl", "-fsS", "--max-time", "10", "http://h:1/ready?a='b'"],
        world=WorldCheck(29500, ("192.168.10.12", "fd00::2")),
        give_up_grace_s=9,
    ),
    "watchdog-world-one.sh": lambda: watchdog_script(
        URL, load_timeout_s=60, unhealthy_after_s=30, world=WorldCheck(1234, ("10.0.0.2",))
    ),
}


def _fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_each_script_is_its_committed_text(name: str) -> None:
    assert SCRIPTS[name]() == _fixture(name)


def test_the_fixtures_are_the_scripts_and_nothing_else() -> None:
    assert sorted(p.name for p in FIXTURES.iterdir()) == sorted(SCRIPTS)


def test_the_watchdogs_defaults_are_named_ones() -> None:
    assert GIVE_UP_GRACE_S == 30
    text = _fixture("watchdog-defaults.sh")
    assert "while alive && (( waited < 30 )); do" in text
    assert "  sleep 15 &\n" in text
    assert (
        "healthy() { python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=10)' " in text
    )
    assert "world_port" not in text and "record" not in text
    assert (
        _fixture("watchdog-off.sh")
        == _fixture("watchdog-negative.sh")
        == ('#!/usr/bin/env bash\n# vLLM watchdog disabled (restartUnhealthyAfterSeconds: 0).\nexec "$@"\n')
    )


def test_the_world_check_lists_each_peer_quoted_and_walks_them_each_round() -> None:
    text = _fixture("watchdog-all.sh")
    assert "world_port=29500\nworld_peers=(192.168.10.12 fd00::2)\n" in text
    assert "  if healthy; then\n    record\n    last_ok=$SECONDS\n" in text
    assert text.count("give_up\n      exit 70") == 2  # a recorded connection gone, a joined node gone
    assert "world_peers=(10.0.0.2)\n" in _fixture("watchdog-world-one.sh")
    assert "world_peers=('a b' 'c;d')\n" in watchdog_script(
        URL, load_timeout_s=60, unhealthy_after_s=30, world=WorldCheck(1, ("a b", "c;d"))
    )


def test_the_gate_quotes_its_failures_and_says_what_else_to_check() -> None:
    text = _fixture("gate-all.sh")
    assert "patterns=(\n  'CUDA out of memory|OOM \\[x\\]'\n  'no kernel (sm_70)'\n)\n" in text
    assert "advice=(\n  'lower '\"'\"'it'\"'\"' in \"pools\"'\n  '$HOME is kept'\n)\n" in text
    assert "also='Also check: docker logs vllm-worker-reasoning-gpu-02 on gpu-02; its NCCL log'\n" in text
    assert text.count('echo "$also" >&2') == 2
    assert "also" not in _fixture("gate-defaults.sh")
    assert "patterns=(\n)\n" in _fixture("gate-defaults.sh")


def test_the_instance_watchdog_of_each_layout() -> None:
    config = prod_config()
    config["llm-cluster:pools"]["reasoning"].update(loadTimeoutMinutes=25, restartUnhealthyAfterSeconds=240)
    spec = spec_of(config)
    vllm, url = ENGINES["vllm"], "http://192.168.10.11:8000/health"
    plain = watchdog_script(url, load_timeout_s=1500, unhealthy_after_s=240, probe_argv=vllm.probe_argv(url))
    three = Instance("reasoning", "reasoning-gpu-01", ("gpu-01", "gpu-02", "gpu-03"), 8000, 8, 3, None, "native", 29500)

    def world(*peers: str) -> str:
        return watchdog_script(
            url,
            load_timeout_s=1500,
            unhealthy_after_s=240,
            probe_argv=vllm.probe_argv(url),
            world=WorldCheck(29500, peers),
        )

    assert instance_watchdog_script(vllm, spec, RAY) == plain
    assert instance_watchdog_script(vllm, spec, RAY, "gpu-02") == plain
    # The native launcher: each node watches the others, by address.
    assert instance_watchdog_script(vllm, spec, three) == world("192.168.10.12", "192.168.10.13")
    assert instance_watchdog_script(vllm, spec, three, "gpu-01") == world("192.168.10.12", "192.168.10.13")
    assert instance_watchdog_script(vllm, spec, three, "gpu-02") == world("192.168.10.11", "192.168.10.13")
    assert instance_watchdog_script(vllm, spec, three, "gpu-03") == world("192.168.10.11", "192.168.10.12")
    # Without its port (no instance the planner makes) or on one node: no world to watch.
    no_port = Instance("reasoning", "reasoning-gpu-01", ("gpu-01", "gpu-02"), 8000, 8, 2, None, "native")
    assert instance_watchdog_script(vllm, spec, no_port) == plain
    one_native = Instance("reasoning", "reasoning-gpu-01", ("gpu-01",), 8000, 8, 1, None, "native", 29500)
    assert instance_watchdog_script(vllm, spec, one_native) == plain
    # The engine's own probe (llama.cpp's image has curl, not python3), the instance's ready URL.
    chat_url = "http://192.168.10.13:8000/health"
    assert instance_watchdog_script(ENGINES["llamacpp"], spec, ONE) == watchdog_script(
        chat_url,
        load_timeout_s=30 * 60,
        unhealthy_after_s=300,
        probe_argv=["curl", "-fsS", "-o", "/dev/null", "--max-time", "10", chat_url],
    )


def test_a_server_container_runs_the_watchdog_then_the_engines_argv() -> None:
    assert WATCHDOG_SCRIPT == "/opt/llm-cluster/vllm-watchdog.sh"
    assert supervised_argv(TOY, spec_of(prod_config()), ONE) == [
        "/bin/bash",
        "/opt/llm-cluster/vllm-watchdog.sh",
        "toy-serve",
        "chat-gpu-03",
        "--host",
        "192.168.10.13",
        "--port",
        "8000",
    ]


def write_fixtures() -> None:
    """Write each script's current text as its fixture (a deliberate change to a generator)."""
    FIXTURES.mkdir(parents=True, exist_ok=True)
    for name, script in SCRIPTS.items():
        (FIXTURES / name).write_text(script())
        print(f"wrote {(FIXTURES / name).relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    write_fixtures()
