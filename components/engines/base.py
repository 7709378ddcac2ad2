"""The engine seam: what ModelServer, RayCluster, the gateway, monitoring, capacity and policies ask of an
engine (vLLM, LMDeploy, llama.cpp), and the engine-neutral pieces they share (container names, labels,
the readiness gate, the watchdog).

An engine is one `Engine` subclass in its own module, registered in components.engines.ENGINES
under the `pools.*.engine` value that selects it. Nothing outside the engine modules branches on an
engine's name: callers ask `engine_for(pool)` and use this interface.
"""

from __future__ import annotations

import shlex
import sys
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, TypeVar

from components.engines.gate import GateCheck
from components.engines.http import EngineServer
from components.engines.judged import EngineRule, Launch, LaunchRule, ServerCall, advice_fit_problems
from components.engines.weights import CheckpointFormat
from components.facts.engine_matrix import GENERATIONS, Cell, level
from components.facts.hardware import gpu
from components.facts.models import ModelArch
from components.facts.sourced import image_ref_key
from components.facts.startup_failures import COMMON as COMMON_STARTUP_FAILURES
from components.facts.startup_failures import StartupFailure
from components.spec import SpecIssue, StackSpec
from components.spec.base import Spec
from components.spec.cluster import GpuSpec, PoolSpec
from components.spec.engines import Launcher
from components.spec.topology import Instance

LABEL_PREFIX = "llm-cluster."
# How an engine spans nodes: on a Ray cluster (RayCluster registers head and workers, the server runs
# on the head), with its own launcher on each node, or not at all.
MultiNode = Literal["ray", "native", "none"]
# Ray roles of the containers of a multi-node instance (the head runs the server).
RAY_ROLES = ("ray-head", "ray-worker")
F = TypeVar("F")  # an engine's image-facts type


@dataclass(frozen=True)
class Upload:
    """A file an engine's server container needs, written into it by docker before it starts."""

    path: str
    content: str
    executable: bool = False


class Engine(ABC):
    """One serving engine: its command line, environment, endpoints, metrics, formats and capacity model."""

    name: ClassVar[str]  # the `pools.*.engine` value
    title: ClassVar[str]  # how messages, alerts and dashboards name it
    matrix_label: ClassVar[str] = ""  # how the engines x GPU table names its images' rows (its title if empty)
    server_role: ClassVar[str]  # role label and container-name prefix of a single-node server
    multi_gpu: ClassVar[tuple[str, ...]]  # parallel modes inside a node ("tensor", "pipeline")
    multi_node: ClassVar[MultiNode]
    health_path: ClassVar[str] = "/health"  # 200 once the server answers
    ready_path: ClassVar[str] = "/health"  # 200 once it serves requests (the readiness gate)
    metrics_path: ClassVar[str] = "/metrics"  # Prometheus exposition
    metrics_job: ClassVar[str]  # the Prometheus job of its servers
    http_server: ClassVar[EngineServer]  # keep-alive and not-ready statuses, as the gateway needs them
    # Under pools.<pool>: what to lower when it runs out of memory.
    memory_keys: ClassVar[str]
    # The fatal errors its own server prints at startup, most specific first
    # (components/facts/startup_failures.py); `startup_failures` adds the ones every engine shares.
    own_startup_failures: ClassVar[tuple[StartupFailure, ...]] = ()
    # The server answers only to its first served name (404 otherwise): the gateway rewrites the others.
    one_served_name: ClassVar[bool] = False

    # Server flags whose value the engine fetches from a model hub (the air-gapped rule refuses them):
    # flag -> how its value names what is fetched: "path" (a hub id unless it is an absolute path on the
    # node), "always" (a repository or URL, always downloaded), "lora" (name=path pairs), "json-model"
    # (a JSON object whose "model" is read like "path").
    hub_flags: ClassVar[Mapping[str, str]] = {}
    # The variables that keep the server off the hub and its telemetry (offline_env; pools.*.offline).
    offline_vars: ClassVar[Mapping[str, str]] = {}
    # Server flags whose values are credentials: flag -> "1" (one value) or "+" (every value up to the
    # next flag). no-plaintext-secrets refuses them as literals, the plan redacts them, and what is
    # built from a pool's argv outside its containers (the qualification gate) gets them masked.
    secret_flags: ClassVar[Mapping[str, str]] = {}
    secret_flag_aliases: ClassVar[Mapping[str, str]] = {}  # a short secret flag -> its long name, for messages

    # -- the stack keys it owns ----------------------------------------------------------------------
    options_key: ClassVar[str]  # its options block: pools.<pool>.<options_key>
    options_model: ClassVar[type[Spec]]  # the model that block validates against
    required_option: ClassVar[str]  # the option its block cannot do without (camelCase), named when it is missing
    context_key: ClassVar[str]  # the option of its block that sets the context length a request may use
    default_image: ClassVar[str]  # pools.*.image when unset
    # Server flags the product sets from typed stack keys: flag -> the key that owns it, with <pool>, <model>
    # and <node> standing for the names. In extraArgs such a flag would come after the product's own and
    # win in the engine while the plan keeps reading the typed key: the spec refuses it.
    typed_flags: ClassVar[Mapping[str, str]] = {}
    # How the policy pack reads its servers' argv (components/engines/judged.py): the program before the
    # arguments, flags the product refuses (flag -> why), and its own rules beside the common ones.
    cli_program: ClassVar[str] = ""
    refused_flags: ClassVar[Mapping[str, str]] = {}
    policy_rules: ClassVar[tuple[EngineRule, ...]] = ()
    common_rules: ClassVar[bool] = True  # judged by judged.COMMON_RULES from its image table
    # Rules over its launches as its own parser reads them, containers added outside the components included
    # (model_server_launch, container_launch); the pack lists each under its topic.
    launch_rules: ClassVar[tuple[LaunchRule, ...]] = ()
    # What its server logs of its memory at start-up, as regular expressions with one group (the number), or
    # alternatives of one group each: "kv_tokens" (per instance), "kv_cache_gib", "weights_gib",
    # "activation_gib", "non_torch_gib" (per GPU); doctor compares them with the plan's estimate.
    capacity_log_lines: ClassVar[Mapping[str, str]] = {}
    # The forms of a model's weights the placement advisor tries with this engine (plan.advise).
    advice_formats: ClassVar[tuple[CheckpointFormat, ...]] = ()
    flag_aliases: ClassVar[Mapping[str, str]] = {}  # a short server flag -> the long one it stands for
    env_prefixes: ClassVar[tuple[str, ...]] = ()  # prefixes of its own environment variables, for messages
    typed_env: ClassVar[Mapping[str, str]] = {}  # environment it sets from typed keys: variable -> key

    def canonical_flag(self, token: str) -> str | None:
        """The long flag a server argv token sets (`--session_len=8` -> `--session-len`), None for a value."""
        if not token.startswith("-") or token == "-" or token[1:2].isdigit():
            return None
        name = token.partition("=")[0]
        return "--" + name[2:].replace("_", "-") if name.startswith("--") else name

    def typed_key(self, flag: str, *, pool: str, model: str, node: str) -> str | None:
        """The stack key that owns a server flag, names filled in; None for flags extraArgs may carry."""
        template = self.typed_flags.get(flag)
        if template is None:
            return None
        return template.replace("<pool>", pool).replace("<model>", model).replace("<node>", node)

    def options(self, pool: PoolSpec) -> Any:
        """The pool's options block (this engine's options_model)."""
        return pool.options

    def checkpoint_quantizations(self) -> frozenset[str]:
        """`models.*.quantization` values its images load."""
        return frozenset()

    def declarable_images(self) -> list[str]:
        """Images whose facts a private build may declare it shares (pools.*.imageFacts.like)."""
        return []

    def image_table(self) -> Mapping[str, Any]:
        """Its images' facts by reference (each with runs_on, note, cite and serve_args), for the policy pack."""
        return {}

    def image_facts_of(self, ref: str) -> Any:
        """The facts of an image reference as image_table() keys them; None for an image it does not know."""
        return self.image_table().get(image_ref_key(ref))

    def cli_value_types(self) -> Mapping[str, Any]:
        """Its CLI's value types by the name its dump gives them, where argparse has no builtin of that name."""
        return {}

    def knows_image(self, ref: str) -> bool:
        """Whether `ref` is one of declarable_images (as the facts table reads references)."""
        return False

    def spec_issues(self, spec: StackSpec, pool: str) -> list[SpecIssue]:
        """What this engine cannot be asked to do in the pool, before any resource exists (stack keys named)."""
        return self.extra_args_issues(spec, pool)

    def file_issues(self, spec: StackSpec, pool: str) -> list[SpecIssue]:
        """Files on the operator's machine the pool names (read at plan time): unreadable or misnamed ones."""
        return []

    def matrix_rows(self) -> list[tuple[str, list[Cell]]]:
        """Its rows of the engines x GPU generations table (components.facts.engine_matrix): one per image."""
        return [
            (f"{self.matrix_label or self.title} `{ref}`", [self.image_cell(ref, cap) for _, cap in GENERATIONS])  # type: ignore[misc]
            for ref in self.image_refs()
        ]

    def image_refs(self) -> list[str]:
        """Its images the facts table knows, in the table's order."""
        return []

    def image_cell(self, ref: str, capability: int) -> Cell | None:
        """What its facts say of an image on a compute capability (a cell of the engines x GPU table, with the
        evidence level behind it); None for an image the table does not know."""
        return None

    def advice_image(self, capability: int) -> tuple[str, Cell] | None:
        """The image the placement advisor proposes on a GPU: the default image where its facts say it runs
        there, else the first known image that does; None when none does."""
        for ref in dict.fromkeys([self.default_image, *self.image_refs()]):
            cell = self.image_cell(ref, capability)
            if cell is not None and cell.verdict != "no":
                return ref, cell
        return None

    def format_evidence(self, ref: str, capability: int) -> str | None:
        """The evidence level of the fact that says which weight formats an image loads (its `model_formats`
        source), None when its facts do not say."""
        # An image it does not know (None) has no sources either.
        source = getattr(self.image_facts_of(ref), "sources", {}).get("model_formats")
        return level(source, capability) if source is not None else None

    def advice_launcher(self, image: str) -> str | None:
        """The pool key (and what it gives) that spans nodes without Ray on this image, for the placement
        advisor to offer beside the Ray layout it proposes; None where the image has no launcher of its own."""
        return None

    def advice_env(self, arch: ModelArch, image: str, capability: int) -> dict[str, str]:
        """Environment a pool the advisor proposes needs for the model to start on the GPU (pools.<pool>.env)."""
        return {}

    def advice_options(self, context: int, fmt: CheckpointFormat, model: str) -> dict[str, Any]:
        """The options block (pools.<pool>.<options_key>, camelCase) of a pool the advisor proposes: serving
        `context` tokens per request, the weights in form `fmt`, of the stack's model `model`."""
        return {self.context_key: context}

    def alert_issues(self, spec: StackSpec, pool: str) -> list[SpecIssue]:
        """Alert thresholds of the monitoring section the pool would make moot (the stack has monitoring)."""
        return []

    def one_node_issues(self, spec: StackSpec, pool: str, why: str) -> list[SpecIssue]:
        """An engine that serves an instance on one node refuses pipelineParallel > 1, saying why."""
        p = spec.pools[pool]
        if p.pipeline_parallel <= 1:
            return []
        return [
            SpecIssue(
                f"pools.{pool}.pipelineParallel",
                f"{p.engine} pools run on one node: {why}; serve one "
                "replica per node (pipelineParallel 1), or use engine: vllm for tensor x pipeline parallel "
                "across nodes",
            )
        ]

    def extra_args_issues(self, spec: StackSpec, pool: str) -> list[SpecIssue]:
        """extraArgs may not carry a flag a typed key owns."""
        p = spec.pools[pool]
        issues = []
        for i, token in enumerate(self.options(p).extra_args):
            flag = self.canonical_flag(token)
            key = self.typed_key(flag, pool=pool, model=p.model, node="<node>") if flag else None
            if key is not None:
                issues.append(
                    SpecIssue(
                        f"pools.{pool}.{self.options_key}.extraArgs[{i}]",
                        f"{token!r} is set by the typed key {key}: state it there instead",
                    )
                )
        return issues

    @property
    def startup_failures(self) -> tuple[StartupFailure, ...]:
        """What the readiness gate stops on and doctor reads in the logs: the engine's own fatal startup
        errors, then the CUDA and NCCL ones every engine shares (the first that matches names the cause)."""
        return self.own_startup_failures + COMMON_STARTUP_FAILURES

    def hub_downloads(self, argv: list[str]) -> list[tuple[str, str]]:
        """(flag, what it would download) for every hub fetch a server argv asks for."""
        out: list[tuple[str, str]] = []
        for i, token in enumerate(argv):
            flag, eq, inline = token.partition("=")
            kind = self.hub_flags.get(flag)
            if kind is None:
                continue
            if eq:
                values = [inline]
            elif kind == "lora":  # nargs="+": every value up to the next flag
                rest = argv[i + 1 :]
                values = rest[: next((j for j, t in enumerate(rest) if t.startswith("-")), len(rest))]
            else:
                values = argv[i + 1 : i + 2]
            out += [(flag, name) for value in values for name in _fetched(kind, value)]
        return out

    # -- facts -------------------------------------------------------------------------------------
    def image_facts(self, spec: StackSpec, pool: str) -> Any:
        """The facts of the pool's image (its engine's facts table entry, a SourcedImage), None when the
        table does not know it (rules then say it cannot be judged)."""
        return self.image_facts_of(spec.pools[pool].image)

    def metric_names(self, spec: StackSpec, pool: str) -> Mapping[str, str]:
        """Logical metric name -> the series this pool's engine version exports ({} when unknown)."""
        facts = self.image_facts(spec, pool)
        return facts.metrics if facts is not None else {}

    def accepted_quantizations(self, spec: StackSpec, pool: str, capability: int) -> frozenset[str]:
        """Checkpoint quantization methods the pool's image loads on this compute capability."""
        facts = self.image_facts(spec, pool)
        if facts is None:
            return frozenset()
        return frozenset(
            m for m, q in facts.quantizations.items() if q.min_capability is not None and q.min_capability <= capability
        )

    def sizing_inputs(self, spec: StackSpec, pool: str, fallback: F | None) -> tuple[F, GpuSpec]:
        """What a capacity estimate starts from: the pool's image facts — for an image the table does not
        know (a private build), `fallback`, the default image's, laid out as it would — and the GPU of its
        nodes."""
        image: F | None = self.image_facts(spec, pool) or fallback  # type: ignore[assignment]
        node_gpu = spec.node(spec.pools[pool].nodes[0]).gpu
        assert (
            image is not None and node_gpu is not None
        )  # the default image is in the table; the spec refuses GPU-less nodes
        return image, node_gpu

    # -- the server --------------------------------------------------------------------------------
    @abstractmethod
    def context_length(self, spec: StackSpec, pool: str) -> int:
        """The longest request (prompt + output, tokens) one server of the pool accepts."""

    def probe_argv(self, url: str) -> list[str]:
        """A command inside the server's image that exits 0 when `url` answers 200 (docker healthcheck,
        watchdog): python3 by default; an image without python3 overrides it."""
        return health_probe_argv(url)

    def stop_timeout_seconds(self, spec: StackSpec, pool: str) -> int | None:
        """Seconds `docker stop` waits before SIGKILL for a server of the pool that drains on SIGTERM (above its
        own drain timeout), or None: docker's default (the engine does not drain)."""
        return None

    @abstractmethod
    def serve_argv(self, spec: StackSpec, instance: Instance) -> list[str]:
        """The server's full command line for one instance."""

    @abstractmethod
    def serve_env(self, spec: StackSpec, instance: Instance, node: str) -> dict[str, str]:
        """Environment of every GPU container of an instance on `node`."""

    def uploads(self, spec: StackSpec, instance: Instance) -> list[Upload]:
        """Files the server container needs besides the watchdog (e.g. tuned kernel configs)."""
        return []

    def launcher(self, options: Spec | None) -> Launcher:
        """How a pool with this options block starts its instances that span nodes (the engine's one way by
        default; an engine with two reads the pool's choice)."""
        return Launcher(self.multi_node)

    def node_argv(self, spec: StackSpec, instance: Instance, node: str) -> list[str]:
        """The command line on one node of an instance its own launcher spans: the head serves the API (the
        server's argv), the others join it. Only engines whose `launcher` can say "native" override it."""
        if node != instance.head:
            raise NotImplementedError(f"{self.title} has no launcher of its own across nodes")
        return self.serve_argv(spec, instance)

    @abstractmethod
    def capacity(self, spec: StackSpec, pool: str, *, mla: bool | None = None) -> dict[str, object]:
        """The pool's capacity estimate as JSON (plan.json `capacity`), {"error": why} when not modelled."""

    # -- what the policy pack reads ------------------------------------------------------------------
    def model_server_launch(self, props: Mapping[str, Any]) -> Launch | None:
        """A ModelServer of this engine as its launch_rules read it (props: the component's outputs)."""
        return None

    def container_launch(self, props: Mapping[str, Any], image: str | None) -> Launch | None:
        """A container that runs this engine's server as its launch_rules read it (`image`: the ref the
        container states); None if it runs none."""
        return None

    def container_server(self, props: Mapping[str, Any], image: str | None) -> ServerCall | None:
        """The server a container starts, read by this engine's parser (for the security rules); None if none."""
        return None

    def fit_problems(self, capacity: Mapping[str, Any], pool: str, model: str) -> list[str]:
        """memory-fit's messages on the pool's capacity estimate (`Engine.capacity`): why it does not fit, and
        what would."""
        return advice_fit_problems(capacity)

    def capacity_cli(self, argv: list[str], prog: str) -> int:
        """Its capacity estimator as a command line (ops.capacity): exit 0 fits, 1 does not, 2 bad input."""
        print(f"error: {prog}: no capacity estimator for {self.name} pools", file=sys.stderr)
        return 2

    # -- the qualification gate ----------------------------------------------------------------------
    def gate_check(self, spec: StackSpec, pool: str, node: str, argvs: tuple[tuple[str, ...], ...]) -> GateCheck | None:
        """What the qualification gate runs in the pool's image on `node` before any server starts there
        (components.planning.qualification), checking the `argvs` planned on it; None: no gate (an image
        without facts gets the policy pack's advisory instead)."""
        return None


def planned_capability(spec: StackSpec, node: str) -> int:
    """The compute capability of the GPU the stack names for a node (70 for sm_70)."""
    n = spec.node(node)
    assert n.gpu is not None  # the spec refuses GPU-less nodes
    return gpu(n.gpu.model).capability


# -- engine-neutral helpers --------------------------------------------------------------------------

# What a masked credential reads as: the plan's redaction mark, so no rule or listing takes it for one.
REDACTED = "[redacted]"


def secret_positions(argv: Sequence[str], flags: Mapping[str, str]) -> list[tuple[int, str]]:
    """(index, flag) of every credential a secret flag (Engine.secret_flags) is given in an argv: the
    values after it, or the token itself for `--flag=value`."""
    out: list[tuple[int, str]] = []
    for i, token in enumerate(argv):
        flag, eq, _ = token.partition("=")
        nargs = flags.get(flag)
        if nargs is None:
            continue
        if eq:
            out.append((i, flag))
            continue
        # The values: the next token, or for a many-valued flag every token up to the next flag.
        last = len(argv) if nargs == "+" else min(i + 2, len(argv))
        for j in range(i + 1, last):
            if argv[j].startswith("-"):
                break
            out.append((j, flag))
    return out


def masked_secrets(argv: Sequence[str], flags: Mapping[str, str]) -> list[str]:
    """The argv with every credential a secret flag is given replaced by REDACTED: for what needs its
    shape (flags, how many values) and not its keys, such as the qualification gate's parse."""
    out = list(argv)
    for i, flag in secret_positions(argv, flags):
        out[i] = f"{flag}={REDACTED}" if out[i].startswith(f"{flag}=") else REDACTED
    return out


def _fetched(kind: str, value: str) -> list[str]:
    """What a hub flag's value would fetch (Engine.hub_flags kinds); nothing for paths on the node."""
    import json

    if kind == "always":
        return [value] if value else []
    if kind == "lora":
        # name=path, or vLLM's JSON form {"name": …, "path": …}
        if value.strip().startswith("{"):
            try:
                path = json.loads(value).get("path")
            except (ValueError, AttributeError):
                path = None
        else:
            path = value.partition("=")[2] or value
        return [path] if isinstance(path, str) and path and not path.startswith("/") else []
    if kind == "json-model":
        try:  # not JSON (ValueError), or JSON but no object (AttributeError): nothing named
            model = json.loads(value).get("model")
        except (ValueError, AttributeError):
            model = None
        return [model] if isinstance(model, str) and model and not model.startswith("/") else []
    return [value] if value and not value.startswith("/") else []


def container_name(instance: Instance, role: str) -> str:
    """The fixed name of an instance's GPU container of `role` (gates, hints and operators use it)."""
    if not role or not role.replace("-", "").isalnum():
        raise ValueError(f"container role {role!r} must be letters, digits and '-'")
    return f"{role}-{instance.name}"


def server_container_name(engine: Engine, instance: Instance) -> str:
    """The container that runs the server: its own (one node, or rank 0 of its own launcher), or the Ray head
    (multi-node on Ray)."""
    return container_name(
        instance, "ray-head" if instance.uses_ray and engine.multi_node == "ray" else engine.server_role
    )


def native_worker_role(engine: Engine) -> str:
    """Role (and container-name prefix) of the containers on an instance's other nodes when the engine's own
    launcher spans them: they run no API server, only the engine's workers that join rank 0."""
    return f"{engine.server_role}-worker"


def startup_failure_advice(engine: Engine, pool: str, model: str) -> list[tuple[str, str]]:
    """(pattern, cause and fix) of each fatal startup error of the engine, naming the pool's and model's
    stack keys: what health_gate_script's `failures` takes."""
    return [(f.pattern, f.advice(pool, model, engine.memory_keys)) for f in engine.startup_failures]


def endpoint(spec: StackSpec, instance: Instance) -> str:
    """The instance's OpenAI-compatible base URL (what the gateway proxies to)."""
    return f"http://{spec.node(instance.head).address}:{instance.port}"


def ready_url(engine: Engine, spec: StackSpec, instance: Instance) -> str:
    """The instance's readiness endpoint on its cluster address."""
    return f"{endpoint(spec, instance)}{engine.ready_path}"


def nccl_env(spec: StackSpec, node: str) -> dict[str, str]:
    """NCCL/GLOO settings of a node's GPU containers (HCA, GID index, bootstrap interface, debug)."""
    n = spec.node(node)
    env = {"NCCL_IB_DISABLE": "1" if spec.nccl.ib_disable else "0"}
    if n.hca is not None:
        # NCCL takes `dev:port`; the bare device means every port, which is port 1 on these NICs.
        env["NCCL_IB_HCA"] = n.hca.device if n.hca.port == 1 else f"{n.hca.device}:{n.hca.port}"
        if n.hca.link_layer == "ethernet" and n.hca.gid_index is not None:
            env["NCCL_IB_GID_INDEX"] = str(n.hca.gid_index)  # RoCEv2; IB needs none
    if n.interface is not None:
        # Ray copies only the engine's own variables to its workers, so each container needs these itself.
        env["NCCL_SOCKET_IFNAME"] = n.interface
        env["GLOO_SOCKET_IFNAME"] = n.interface
    env["NCCL_DEBUG"] = spec.nccl.debug
    env.update(spec.nccl.extra_env)
    return env


def offline_env(spec: StackSpec, pool: str, variables: Mapping[str, str]) -> dict[str, str]:
    """An engine's offline variables (hub and telemetry off) unless `pools.<pool>.offline` is false;
    callers apply the pool's env after them, so one variable can still be overridden."""
    return dict(variables) if spec.pools[pool].offline else {}


def container_envs(env: dict[str, str]) -> list[str]:
    """Docker's `KEY=value` list, sorted: the provider stores a set, so order must not cause diffs."""
    return [f"{k}={v}" for k, v in sorted(env.items())]


def container_labels(spec: StackSpec, instance: Instance, node: str, role: str) -> dict[str, str]:
    """Labels of a GPU container: what it is, for people, monitoring and policies (known at preview)."""
    pool = spec.pools[instance.pool]
    n = spec.node(node)
    assert n.gpu is not None
    return {
        LABEL_PREFIX + "role": role,
        LABEL_PREFIX + "pool": instance.pool,
        LABEL_PREFIX + "instance": instance.name,
        LABEL_PREFIX + "node": node,
        LABEL_PREFIX + "gpu-model": n.gpu.model,
        # The container's `image` is an image id, unknown during preview; the reference is not.
        LABEL_PREFIX + "image": pool.image,
        LABEL_PREFIX + "engine": pool.engine,
    }


def health_gate_script(
    url: str,
    timeout_s: int,
    container_hint: str,
    *,
    server: str,
    memory_keys: str,
    interval_s: int = 5,
    progress_every_s: int = 30,
    failures: Sequence[tuple[str, str]] = (),
    max_deaths: int = 3,
    also_check: Sequence[str] = (),
) -> str:
    """Bash that polls a server's readiness URL until 200, printing elapsed time; times out with what to check.

    When docker is there, it also watches the container: once the server has died since the gate began
    (docker's restart count went up, or the container stopped), the log lines written since then are
    searched for `failures` ((ERE, what it means and what to do) pairs, in order: the engine's
    startup_failures) and the first found stops the gate with that line and its advice; a server that
    died `max_deaths` times with none of them in its log stops it with the log's last lines. Either
    way, long before the timeout, which then only means a load that is slow or stuck. `also_check` names what
    else to read when it fails (the other nodes' containers of an instance on the engine's own launcher)."""
    # Only when given, so that every other gate's text (and hash: its trigger) stays as it was.
    also = f"Also check: {'; '.join(also_check)}" if also_check else ""
    also_line = f"also={shlex.quote(also)}\n" if also else ""
    say_also = '\n    echo "$also" >&2' if also else ""
    q_url, q_hint, q_server = shlex.quote(url), shlex.quote(container_hint), shlex.quote(server)
    patterns = "".join(f"\n  {shlex.quote(pattern)}" for pattern, _ in failures)
    advice = "".join(f"\n  {shlex.quote(text)}" for _, text in failures)
    return f"""#!/usr/bin/env bash
# Readiness gate: wait until {server} answers {url} (weights load for 5-15 minutes).
set -euo pipefail
url={q_url}
container={q_hint}
server={q_server}
timeout={int(timeout_s)}
max_deaths={int(max_deaths)}
{also_line}# Fatal startup errors {server} prints (components/facts/startup_failures.py), and what each means:
# literal text, nothing in it is to expand.
# shellcheck disable=SC2016
patterns=({patterns}
)
# shellcheck disable=SC2016
advice=({advice}
)
start=$SECONDS
since=$(date +%s)
next_report=0
docker_ok=false
restarts=0
if command -v docker >/dev/null 2>&1 && restarts=$(docker inspect -f '{{{{.RestartCount}}}}' "$container" 2>/dev/null); then
  docker_ok=true
fi

# How often the server died since the gate began: docker restarted it, or it stopped.
deaths() {{
  local state count status
  state=$(docker inspect -f '{{{{.RestartCount}}}} {{{{.State.Status}}}}' "$container" 2>/dev/null) || {{ echo 0; return; }}
  count=${{state%% *}}
  status=${{state#* }}
  case $status in
    exited | dead) echo $((count - restarts + 1)) ;;
    *) echo $((count - restarts)) ;;
  esac
}}

# Once it died: stop on the first known fatal error in what it logged since the gate began, or after
# max_deaths deaths without one.
check_deaths() {{
  local died logs i line
  died=$(deaths)
  (( died > 0 )) || return 0
  logs=$(docker logs --since "$since" "$container" 2>&1 | tail -n 5000) || true
  for i in "${{!patterns[@]}}"; do
    if line=$(grep -E -m 1 -e "${{patterns[$i]}}" <<<"$logs"); then
      echo "$server: $container died at startup (${{died}}x since the gate began): ${{line:0:400}}" >&2
      echo "Cause: ${{advice[$i]}}" >&2
      exit 1
    fi
  done
  if (( died >= max_deaths )); then
    echo "$server: $container died ${{died}}x since the gate began, with no fatal error this gate knows in" \\
      "its log; its last lines:" >&2
    tail -n 30 <<<"$logs" >&2{say_also}
    exit 1
  fi
}}

# -s without -S: a refused connection every 5 s for 15 minutes is noise, the progress line says it.
until curl -fs -o /dev/null --max-time 5 "$url"; do
  elapsed=$((SECONDS - start))
  if [[ $docker_ok == true ]]; then
    check_deaths
  fi
  # Reported before the timeout's check: the first line says what it waits for however slow the host.
  if (( elapsed >= next_report )); then
    echo "$server: waiting for $url: ${{elapsed}}s elapsed (timeout ${{timeout}}s)"
    next_report=$((next_report + {int(progress_every_s)}))
  fi
  if (( elapsed >= timeout )); then
    echo "$server: $url not healthy after ${{elapsed}}s (timeout ${{timeout}}s)." \\
      "Check \\`docker logs $container\\` (weights path mounted and complete, out of GPU memory:" \\
      "lower {memory_keys}), \\`nvidia-smi\\` for GPU memory held by another process." >&2
    if [[ $docker_ok == true ]]; then
      docker logs --tail 30 "$container" >&2 2>&1 || true
    fi{say_also}
    exit 1
  fi
  sleep {int(interval_s)}
done
echo "$server: $url healthy after $((SECONDS - start))s"
"""


# Uploaded beside ray-head.sh into every server container; ray-head.sh finds it next to itself.
WATCHDOG_SCRIPT = "/opt/llm-cluster/vllm-watchdog.sh"
# Seconds the watchdog lets vLLM shut down after SIGTERM when it gives up on it, then SIGKILL.
GIVE_UP_GRACE_S = 30
# A probe that needs nothing the image might lack beyond python3 (every engine image here has it).
_PROBE = "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=10)"


def health_probe_argv(url: str) -> list[str]:
    """A command that exits 0 when the server's readiness URL answers 200 (docker healthcheck, watchdog)."""
    return ["python3", "-c", _PROBE, url]


@dataclass(frozen=True)
class WorldCheck:
    """What a node of an instance on vLLM's own multi-node launcher watches of the others: its TCP connections
    with their addresses on the rendezvous port (--master-port, torch.distributed's store on rank 0, which
    every rank keeps open while it lives). vLLM 0.19.1 does not notice a dead node: its head keeps answering
    /health and a request hangs with no answer and no engine death, past VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS
    (the lab's figures: docs/perf/lab.md), and a restarted headless node cannot join a world that formed
    without it (Gloo's connectFullMesh refused by the dead ranks' addresses)."""

    port: int
    peers: tuple[str, ...]  # the instance's other nodes' addresses


# The established TCP connections between this host and the peers on the port: "<peer> <local port>
# <remote port>" lines, read from /proc/net (the image need not have ss or netstat; IPv4 in tcp6 is ::ffff:).
_LINKS_PY = """import socket, sys
port, peers = int(sys.argv[1]), set(sys.argv[2:])
def ip(h):
    b = bytes.fromhex(h)
    if sys.byteorder == "little":
        b = b"".join(b[i:i + 4][::-1] for i in range(0, len(b), 4))
    if len(b) == 16 and b[:12] == bytes(10) + b"\\xff\\xff":
        b = b[12:]
    return socket.inet_ntop(socket.AF_INET if len(b) == 4 else socket.AF_INET6, b)
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    try:
        rows = open(table).read().splitlines()[1:]
    except OSError:
        continue
    for row in rows:
        f = row.split()
        (_, lp), (ra, rp) = f[1].split(":"), f[2].split(":")
        if f[3] == "01" and ip(ra) in peers and port in (int(lp, 16), int(rp, 16)):
            print(ip(ra), int(lp, 16), int(rp, 16))
"""


def _world_check_bash(world: WorldCheck) -> tuple[str, str, str]:
    """(definitions, on each healthy probe, each round) of the watchdog's world check."""
    peers = " ".join(shlex.quote(p) for p in world.peers)
    defs = f"""world_port={world.port}
world_peers=({peers})
world=""  # each other node's connections, recorded the first time vLLM served with them open
warned=" "
joined=" "  # the other nodes this one has had a connection with, served or not
links() {{
  python3 - "$world_port" "${{world_peers[@]}}" <<'LINKS_PY'
{_LINKS_PY}LINKS_PY
}}
of() {{ awk -v p="$1" '$1 == p'; }}
# A node restarted while the old world still serves connects only later: it is recorded when it does.
record() {{
  local now peer seen
  now=$(links || true)
  for peer in "${{world_peers[@]}}"; do
    if [[ -z "$(of "$peer" <<<"$world")" ]]; then
      seen=$(of "$peer" <<<"$now")
      if [[ -n "$seen" ]]; then
        world=$(printf '%s\\n%s\\n' "$world" "$seen" | sed '/^$/d')
      elif [[ "$warned" != *" $peer "* ]]; then
        echo "watchdog: no connection with $peer on port $world_port while vLLM serves: a restart of that" \\
          "node goes unnoticed here until one opens" >&2
        warned+="$peer "
      fi
    fi
  done
}}
"""
    first = """    record
"""
    each = """  now=$(links || true)
  for peer in "${world_peers[@]}"; do
    was=$(of "$peer" <<<"$world")
    # One of the connections vLLM served with gone is a rank of that node gone: the world cannot serve without it.
    if [[ -n "$was" ]] && grep -qvxF -f <(printf '%s\\n' "$now") <<<"$was"; then
      echo "watchdog: a connection with $peer on port $world_port closed (a node of this instance died" \\
        "or restarted; vLLM itself does not notice: requests would hang); stopping vLLM so docker restarts" \\
        "it and the instance forms again" >&2
      give_up
      exit 70
    fi
    # Before vLLM serves too: a node that restarts while the node it joins is still going down connects to the
    # old rendezvous, which then dies under it, and both wait for each other until loadTimeoutMinutes (seen in
    # the lab). Every connection with a node gone, after there were some, is that.
    if [[ -n "$(of "$peer" <<<"$now")" ]]; then
      [[ "$joined" == *" $peer "* ]] || joined+="$peer "
    elif [[ "$joined" == *" $peer "* ]]; then
      echo "watchdog: every connection with $peer on port $world_port closed (its vLLM ended, or the one this" \\
        "node had joined); stopping vLLM so docker restarts it and the instance forms again" >&2
      give_up
      exit 70
    fi
  done
"""
    return defs, first, each


def watchdog_script(
    url: str,
    *,
    load_timeout_s: int,
    unhealthy_after_s: int,
    interval_s: int = 15,
    probe_argv: list[str] | None = None,
    world: WorldCheck | None = None,
    give_up_grace_s: int = GIVE_UP_GRACE_S,
) -> str:
    """vllm-watchdog.sh: run the server; exit, so docker restarts the container, when it hangs.

    docker restarts a container whose process exits, not one that is merely unhealthy: a server that
    never finishes loading, or whose engine hangs (an NCCL peer gone), would stay down until a person
    notices. The watchdog turns both into an exit; with `world` (a node of an instance on vLLM's own
    launcher), also the loss of another node of the instance. `unhealthy_after_s` 0 turns it off (plain exec).
    """
    if unhealthy_after_s <= 0:
        return '#!/usr/bin/env bash\n# vLLM watchdog disabled (restartUnhealthyAfterSeconds: 0).\nexec "$@"\n'
    probe = " ".join(shlex.quote(a) for a in (probe_argv or health_probe_argv(url))[:-1])
    defs, first, each = _world_check_bash(world) if world is not None else ("", "", "")
    return f"""#!/usr/bin/env bash
# vLLM watchdog: run the server; exit when it is not healthy {load_timeout_s}s after start, or stays
# unhealthy for {unhealthy_after_s}s after having served, so that docker (restart unless-stopped) starts
# it again. docker itself never restarts a container that is only unhealthy.
set -euo pipefail
url={shlex.quote(url)}
if (( $# == 0 )); then
  echo "usage: vllm-watchdog.sh <vllm command>..." >&2
  exit 2
fi
healthy() {{ {probe} "$url" >/dev/null 2>&1; }}
{defs}"$@" &
child=$!
stop() {{
  kill -TERM "$child" 2>/dev/null || true
  wait "$child" 2>/dev/null || true
}}
alive() {{ [[ -e /proc/$child && "$(sed 's/.*) //' "/proc/$child/stat" 2>/dev/null | cut -d' ' -f1)" != Z ]]; }}
# The watchdog's own stop, bounded: vLLM's API server waits on SIGTERM for its open connections to close,
# and requests hung on a dead engine never do (docker stop, above, has its own bound and lets a drain finish).
give_up() {{
  kill -TERM "$child" 2>/dev/null || true
  local waited=0
  while alive && (( waited < {int(give_up_grace_s)} )); do
    sleep 1 &
    wait $!
    waited=$((waited + 1))
  done
  kill -KILL "$child" 2>/dev/null || true
  wait "$child" 2>/dev/null || true
}}
trap 'stop; exit 143' TERM INT
started=$SECONDS
last_ok=""
while kill -0 "$child" 2>/dev/null; do
  sleep {int(interval_s)} &
  wait $!
  if healthy; then
{first}    last_ok=$SECONDS
  elif [[ -z "$last_ok" ]] && (( SECONDS - started >= {int(load_timeout_s)} )); then
    echo "watchdog: $url not healthy {load_timeout_s}s after start; stopping vLLM so docker restarts it" \\
      "(check this container's log above: weights, GPU memory; or raise loadTimeoutMinutes)" >&2
    give_up
    exit 70
  elif [[ -n "$last_ok" ]] && (( SECONDS - last_ok >= {int(unhealthy_after_s)} )); then
    echo "watchdog: $url unhealthy for $((SECONDS - last_ok))s after serving; stopping vLLM so docker" \\
      "restarts it (look for NCCL errors and Xid events: dmesg, nvidia-smi)" >&2
    give_up
    exit 70
  fi
{each}done
# vLLM exited by itself: pass its status on.
wait "$child"
"""


def instance_watchdog_script(engine: Engine, spec: StackSpec, instance: Instance, node: str | None = None) -> str:
    """The watchdog for one instance (on `node`, default its head), with its pool's load timeout and unhealthy
    limit; on vLLM's own multi-node launcher, watching the instance's other nodes too (WorldCheck)."""
    pool = spec.pools[instance.pool]
    url = ready_url(engine, spec, instance)
    node = node or instance.head
    world = None
    if instance.native_launcher and instance.master_port is not None:
        world = WorldCheck(instance.master_port, tuple(spec.node(n).address for n in instance.nodes if n != node))
    return watchdog_script(
        url,
        load_timeout_s=pool.load_timeout_minutes * 60,
        unhealthy_after_s=pool.restart_unhealthy_after_seconds,
        probe_argv=engine.probe_argv(url),
        world=world,
    )


def supervised_argv(engine: Engine, spec: StackSpec, instance: Instance) -> list[str]:
    """What a server container runs: the watchdog, then the engine's argv it supervises."""
    return ["/bin/bash", WATCHDOG_SCRIPT, *engine.serve_argv(spec, instance)]
