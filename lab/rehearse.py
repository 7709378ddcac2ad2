"""The rehearsal: the lab stack's plan (`--up` mode) carried out against the test hosts, resource by resource.

It is not a Pulumi engine. It takes the registrations the program makes under the plan's mock runtime
(the same run that writes build/plan/<stack>/plan.json; secrets kept in memory, never written out),
and for every custom resource, once all its dependencies are done, does what the provider documents:

- command:remote:Command — ssh with the resource's own connection (host, port, user, host key pinned
  when given, agent or private key, dial retries); `create` as the session's command with `stdin`;
  on a later run nothing unless `triggers` changed (replace: the old `delete`, then `create`) or other
  inputs changed (update: `update`, else `create` again); on destroy the stored `delete`.
- command:local:Command — the same, `/bin/sh -c` on this machine.
- docker:RemoteImage — as the provider's findImage: an image the engine already holds under that name
  (a tarball's load step put it there) is used as it is, else a pull on that host's engine (through
  its registry mirror) with the provider's registryAuth entry for the image's registry as
  X-Registry-Auth (pullImage); a pull that fails to connect (the lab's one
  mirror failed a request) is retried up to PULL_ATTEMPTS times, each retry logged; keepLocally kept.
  With `build` (the default gateway image): a BuildKit build on that host's engine, as the provider
  does on Linux, of the context directory relative to the project, with its build arguments; the docker
  CLI sends the context over the same ssh dial-stdio connections (its base image is pulled by that
  engine through its registry mirror, its apt reads the lab's Debian mirror, lab/debmirror.py).
- docker:Container / docker:Volume — the Docker Engine API through `ssh … docker system dial-stdio`,
  as the docker provider does; every container input maps once (CONTAINER_INPUTS, against the
  provider schema in tests/fixtures/schemas); an input without a mapping stops the rehearsal.
- pulumi:providers:docker — its host and ssh_opts are what the containers and images go through.

Computed outputs the mocks invented (an image id) are replaced by the real ones before a dependent
resource runs. State (inputs and outputs per URN, like a Pulumi state file) is kept in the lab's
state directory so a second `up` can show that nothing re-runs, and `destroy` can undo in reverse.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import os
import resource
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lab.config import REPO, STATE
from lab.debmirror import parse_dockerfile
from lab.dockerapi import DockerAPI, DockerError
from lab.vllm_cpu import IMAGE_SITE_PACKAGES, REAL_ENGINE_LABEL, image_binds

COMMAND_REMOTE = "command:remote:Command"
COMMAND_LOCAL = "command:local:Command"
IMAGE = "docker:index/remoteImage:RemoteImage"
CONTAINER = "docker:index/container:Container"
VOLUME = "docker:index/volume:Volume"
DOCKER_PROVIDER = "pulumi:providers:docker"
SCHEMA = REPO / "tests" / "fixtures" / "schemas" / "docker-5.2.schema.json"
COMMAND_SCHEMA = REPO / "tests" / "fixtures" / "schemas" / "command-1.2.1.schema.json"


PULL_ATTEMPTS = 3
PULL_DIAL_ERRORS = ("dial tcp", "network is unreachable", "connection refused", "i/o timeout", "TLS handshake timeout")


class RehearsalError(RuntimeError):
    """A step failed, or the plan uses something the rehearsal cannot carry out faithfully."""


# --- docker:Container inputs → Engine API (POST /containers/create body, then uploads, then start) ------
# Each entry: provider input (schema name) → how the docker provider (terraform-provider-docker
# resource_docker_container_funcs.go) puts it into the create request. Anything else stops the run.


def _nanos(duration: str) -> int:
    """Go duration strings as the provider parses them ("30s", "5m", "1h30m")."""
    total, num = 0.0, ""
    units = {"h": 3600, "m": 60, "s": 1, "ms": 1e-3}
    i = 0
    while i < len(duration):
        c = duration[i]
        if c.isdigit() or c == ".":
            num += c
            i += 1
            continue
        unit = "ms" if duration[i : i + 2] == "ms" else c
        total += float(num) * units[unit]
        num = ""
        i += len(unit)
    return int(total * 1e9)


def _gpus(value: str) -> list[dict[str, Any]]:
    """docker/cli GpuOpts: "all" → Count -1; "device=0,1" → those DeviceIDs; capabilities [["gpu"]]."""
    req: dict[str, Any] = {"Driver": "", "Count": 0, "DeviceIDs": None, "Capabilities": [["gpu"]], "Options": {}}
    value = value.strip("\"'")
    if value == "all":
        req["Count"] = -1
    elif value.startswith("device="):
        req["DeviceIDs"] = value.split("=", 1)[1].strip("\"'").split(",")
    else:
        req["Count"] = int(value)
    return [req]


def _device_requests(requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The provider's device_requests blocks as the Engine API's DeviceRequests: one request each, its
    capabilities one set (a container asks for GPUs by id when a replica has a subset of the node's)."""
    return [
        {
            "Driver": r.get("driver", ""),
            "Count": int(r.get("count", 0)),
            "DeviceIDs": r.get("deviceIds") or None,
            "Capabilities": [list(r["capabilities"])] if r.get("capabilities") else None,
            "Options": r.get("options") or {},
        }
        for r in requests
    ]


# The one input the lab cannot pass unchanged: this machine's hard limit on open files (20000 here,
# without CAP_SYS_RESOURCE to raise it) is below what a real node's docker.service allows; runc then
# refuses a larger nofile ulimit. The rehearsal lowers it to the machine's limit and says so.
ADAPTATIONS: list[str] = []


def _ulimit(u: dict[str, Any]) -> dict[str, Any]:
    soft, hard = int(u["soft"]), int(u["hard"])
    if u["name"] == "nofile":
        cap = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        if hard > cap:
            ADAPTATIONS.append(
                f"ulimit nofile {soft}/{hard} lowered to {min(soft, cap)}/{cap}: this machine's "
                "hard limit on open files"
            )
            soft, hard = min(soft, cap), cap
    return {"Name": u["name"], "Soft": soft, "Hard": hard}


def _set(path: str, transform: Callable[[Any], Any] = lambda v: v) -> Callable[[dict, Any], None]:
    keys = path.split(".")

    def apply(body: dict, value: Any) -> None:
        d = body
        for k in keys[:-1]:
            d = d.setdefault(k, {})
        d[keys[-1]] = transform(value)

    return apply


def _binds(body: dict, volumes: list[dict]) -> None:
    binds = body.setdefault("HostConfig", {}).setdefault("Binds", [])
    for v in volumes:
        source = v.get("hostPath") or v.get("volumeName")
        if not source or "fromContainer" in v:
            raise RehearsalError(f"docker:Container volumes entry {v}: only hostPath/volumeName are mapped")
        binds.append(f"{source}:{v['containerPath']}" + (":ro" if v.get("readOnly") else ""))


def _mounts(body: dict, mounts: list[dict]) -> None:
    out = body.setdefault("HostConfig", {}).setdefault("Mounts", [])
    for m in mounts:
        extra = set(m) - {"target", "type", "source", "readOnly", "bindOptions"}
        if extra:
            raise RehearsalError(f"docker:Container mounts entry: no mapping for {sorted(extra)}")
        mount = {
            "Target": m["target"],
            "Source": m.get("source", ""),
            "Type": m["type"],
            "ReadOnly": bool(m.get("readOnly")),
        }
        if m.get("bindOptions"):
            mount["BindOptions"] = {"Propagation": m["bindOptions"].get("propagation", "")}
        out.append(mount)


def _healthcheck(body: dict, h: dict) -> None:
    body["Healthcheck"] = {
        "Test": h["tests"],
        "Interval": _nanos(h.get("interval", "0s")),
        "Timeout": _nanos(h.get("timeout", "0s")),
        "StartPeriod": _nanos(h.get("startPeriod", "0s")),
        "Retries": int(h.get("retries", 0)),
    }


CONTAINER_INPUTS: dict[str, Callable[[dict, Any], None] | None] = {
    "name": None,  # the ?name= query of POST /containers/create
    "image": _set("Image"),
    "command": _set("Cmd"),
    "entrypoints": _set("Entrypoint"),
    "envs": _set("Env"),
    "user": _set("User"),
    "labels": _set("Labels", lambda ls: {x["label"]: x["value"] for x in ls}),
    "healthcheck": _healthcheck,
    "networkMode": _set("HostConfig.NetworkMode"),
    "restart": _set("HostConfig.RestartPolicy.Name"),
    "maxRetryCount": _set("HostConfig.RestartPolicy.MaximumRetryCount", int),
    "shmSize": _set("HostConfig.ShmSize", lambda mb: int(mb) * 1024 * 1024),  # the schema's unit is MB
    "init": _set("HostConfig.Init", bool),
    "gpus": _set("HostConfig.DeviceRequests", _gpus),
    "deviceRequests": lambda b, rs: (
        b.setdefault("HostConfig", {}).setdefault("DeviceRequests", []).extend(_device_requests(rs))
    ),
    "pidMode": _set("HostConfig.PidMode"),
    "ipcMode": _set("HostConfig.IpcMode"),
    "capabilities": lambda b, c: b.setdefault("HostConfig", {}).update(
        {"CapAdd": c.get("adds") or None, "CapDrop": c.get("drops") or None}
    ),
    "ulimits": lambda b, us: b.setdefault("HostConfig", {}).update(Ulimits=[_ulimit(u) for u in us]),
    "logDriver": _set("HostConfig.LogConfig.Type"),
    "logOpts": _set("HostConfig.LogConfig.Config"),
    "volumes": _binds,
    "mounts": _mounts,
    "uploads": None,  # PUT /containers/{id}/archive before start
    "stopTimeout": _set("StopTimeout", int),  # what `docker stop` waits before SIGKILL (the engine's drain)
    "destroyGraceSeconds": None,  # POST /containers/{id}/stop?t= on delete
    "mustRun": None,  # checked after start (default true)
    "wait": None,
    "waitTimeout": None,  # wait for healthy after start
}


def container_body(inputs: dict[str, Any]) -> dict[str, Any]:
    """The create request for a container's inputs; RehearsalError naming any input without a mapping."""
    unmapped = sorted(set(inputs) - set(CONTAINER_INPUTS))
    if unmapped:
        raise RehearsalError(
            f"docker:Container input(s) {', '.join(unmapped)} have no mapping in the rehearsal "
            "(lab/rehearse.py CONTAINER_INPUTS): stopping rather than dropping them"
        )
    body: dict[str, Any] = {"HostConfig": {}}
    for key, value in inputs.items():
        mapper = CONTAINER_INPUTS[key]
        if mapper is not None and value is not None:
            mapper(body, value)
    if body["HostConfig"].get("LogConfig") and "Type" not in body["HostConfig"]["LogConfig"]:
        body["HostConfig"]["LogConfig"]["Type"] = "json-file"
    return body


def uploads(inputs: dict[str, Any]) -> list[tuple[str, bytes, int]]:
    """The uploads input as (path, content, mode): 0744 when executable, else 0644 (as the provider)."""
    out = []
    for u in inputs.get("uploads") or []:
        extra = set(u) - {"file", "content", "contentBase64", "executable"}
        if extra:
            raise RehearsalError(f"docker:Container uploads entry: no mapping for {sorted(extra)}")
        data = base64.b64decode(u["contentBase64"]) if u.get("contentBase64") else u.get("content", "").encode()
        out.append((u["file"], data, 0o744 if u.get("executable") else 0o644))
    return out


# --- the plan's resources ---------------------------------------------------------------------------


@dataclass
class Resource:
    urn: str
    type: str
    name: str
    parent: str
    custom: bool
    inputs: dict[str, Any]
    deps: list[str]
    provider: str
    options: dict[str, Any]
    mock_outputs: dict[str, Any] = field(default_factory=dict)
    property_deps: dict[str, list[str]] = field(default_factory=dict)


_PLANS: dict[tuple[str, str, str], tuple[list[Resource], dict[str, Any]]] = {}


def plan_resources(stack_path: Path, stack_name: str) -> tuple[list[Resource], dict[str, Any]]:
    """The program's registrations in `--up` mode, secrets revealed (in memory only), and its stack outputs.
    One run of the program per stack file content and process (the images, the Debian mirror and the
    rehearsal all ask; on a busy machine a run takes tens of seconds); each caller gets its own copy."""
    key = (str(Path(stack_path).resolve()), stack_name, hashlib.sha256(Path(stack_path).read_bytes()).hexdigest())
    if key not in _PLANS:
        _PLANS[key] = _plan_resources(stack_path, stack_name)
    return copy.deepcopy(_PLANS[key])


def _plan_resources(stack_path: Path, stack_name: str) -> tuple[list[Resource], dict[str, Any]]:
    from plan.harness import COMPUTED_OUTPUTS, generated_value, run_main_program
    from plan.stackfile import load_stack_file

    stack = load_stack_file(stack_path, stack_name)
    run = run_main_program(stack.config, stack.secret_keys, stack=stack.name, preview=False)
    out = []
    for r in run.registrations:
        inputs = r.plain_inputs()
        mock = COMPUTED_OUTPUTS.get(r.type, lambda _: {})(inputs)
        if r.type in (COMMAND_REMOTE, COMMAND_LOCAL):
            mock = {"stdout": generated_value(r.urn, "stdout"), "stderr": ""}  # what the plan's mocks print
        out.append(
            Resource(
                r.urn,
                r.type,
                r.name,
                r.parent,
                r.custom,
                inputs,
                list(r.dependencies),
                r.provider,
                r.options,
                mock,
                dict(r.property_dependencies),
            )
        )
    return out, run.stack_outputs


def dockerfile_of(build: dict[str, Any]) -> Path:
    """The Dockerfile of a RemoteImage `build`: its context is relative to the project (where Pulumi runs
    the program), its dockerfile relative to the context (the provider's resolveDockerfilePath)."""
    return (REPO / build["context"]).resolve() / build.get("dockerfile", "Dockerfile")


def _hash(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


@dataclass
class StepLog:
    """What the rehearsal did, per resource: for tests and the figures."""

    urn: str
    name: str
    type: str
    action: str  # create | update | replace | same | delete
    seconds: float
    stdout: str = ""
    stderr: str = ""


class Rehearsal:
    """Carry out (or undo) a plan's resources on the lab hosts."""

    def __init__(
        self, stack_path: Path, stack_name: str, agent_sock: str, log: Callable[[str], None] = print, parallel: int = 8
    ):
        self.stack_path, self.stack_name = stack_path, stack_name
        self.env = {**os.environ, "SSH_AUTH_SOCK": agent_sock}
        self.log = log
        self.parallel = parallel
        self.state_path = STATE / "rehearsal" / f"{stack_name}.json"
        self.state: dict[str, dict[str, Any]] = (
            json.loads(self.state_path.read_text()) if self.state_path.exists() else {}
        )
        self.lock = threading.Lock()
        self.steps: list[StepLog] = []
        self.real: dict[str, dict[str, Any]] = {u: s.get("outputs", {}) for u, s in self.state.items()}
        self.apis: dict[str, DockerAPI] = {}
        self.retries: list[str] = []  # pulls the lab retried (PULL_ATTEMPTS), each with its first error

    # ---- state
    def _save(self) -> None:
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state))
        tmp.chmod(0o600)
        tmp.rename(self.state_path)

    # ---- ordering
    def _expand(self, resources: list[Resource]) -> dict[str, set[str]]:
        """Each custom resource's dependencies on custom resources (a component stands for its children)."""
        by_urn = {r.urn: r for r in resources}
        children: dict[str, list[str]] = {}
        for r in resources:
            children.setdefault(r.parent, []).append(r.urn)

        def customs_under(urn: str) -> set[str]:
            out: set[str] = set()
            for c in children.get(urn, []):
                out |= {c} if by_urn[c].custom else customs_under(c)
            return out

        deps: dict[str, set[str]] = {}
        for r in resources:
            if not r.custom:
                continue
            d: set[str] = set()
            for dep in r.deps:
                if dep in by_urn:
                    d |= {dep} if by_urn[dep].custom else customs_under(dep)
            prov = r.provider.rsplit("::", 1)[0] if r.provider else ""
            if prov in by_urn:
                d.add(prov)
            deps[r.urn] = d - {r.urn}
        return deps

    # ---- up
    def up(self) -> list[StepLog]:
        """Create or update every resource of the plan; delete what the plan no longer has."""
        try:
            return self._up()
        finally:
            self.close()

    def _up(self) -> list[StepLog]:
        resources, self.outputs = plan_resources(self.stack_path, self.stack_name)
        self.resources = {r.urn: r for r in resources}
        deps = self._expand(resources)
        customs = [r for r in resources if r.custom]
        done: set[str] = set()
        failed: list[str] = []
        running: dict[Future, str] = {}
        pending = [r.urn for r in customs]
        with ThreadPoolExecutor(self.parallel) as pool:
            while pending or running:
                for urn in list(pending):
                    if deps[urn] <= done and not failed:
                        pending.remove(urn)
                        running[pool.submit(self._apply, self.resources[urn])] = urn
                if not running:
                    break
                finished, _ = wait(list(running), return_when=FIRST_COMPLETED)
                for f in finished:
                    urn = running.pop(f)
                    err = f.exception()
                    if err is not None:
                        failed.append(f"{self.resources[urn].name}: {err}")
                    else:
                        done.add(urn)
        if failed:
            raise RehearsalError("up failed:\n  " + "\n  ".join(failed))
        # Resources the plan no longer has are deleted, as `pulumi up` does.
        gone = [u for u in self.state if u not in self.resources]
        for urn in reversed(sorted(gone, key=lambda u: self.state[u]["order"])):
            self._delete(urn)
        return self.steps

    def _resolve(self, res: Resource) -> dict[str, Any]:
        """Inputs with the mocks' invented outputs of their dependencies replaced by the real ones.

        Per input, only the outputs of the resources that input depends on (its property dependencies)
        are swapped: a whole value equal to a mock output (even "", a command's mock stdout), or a
        string inside it equal to a non-empty one (an image id inside a list)."""

        def swaps_for(deps: list[str]) -> dict[str, Any]:
            swaps: dict[str, Any] = {}
            for dep in deps:
                mock = self.resources[dep].mock_outputs if dep in self.resources else {}
                real = self.real.get(dep, {})
                for k, v in mock.items():
                    if isinstance(v, str) and k in real:
                        swaps[v] = real[k]
            return swaps

        def sub(value: Any, swaps: dict[str, Any], top: bool) -> Any:
            if isinstance(value, str):
                return swaps[value] if value in swaps and (value or top) else value
            if isinstance(value, list):
                return [sub(v, swaps, False) for v in value]
            if isinstance(value, dict):
                return {k: sub(v, swaps, False) for k, v in value.items()}
            return value

        return {k: sub(v, swaps_for(res.property_deps.get(k, [])), True) for k, v in res.inputs.items()}

    def _apply(self, r: Resource) -> None:
        inputs = self._resolve(r)
        old = self.state.get(r.urn)
        started = time.monotonic()
        action = "create"
        outputs: dict[str, Any]
        if old is not None:
            if _hash(old["inputs"]) == _hash(inputs):
                self._record(r, "same", 0.0)
                return
            action = self._change_kind(r, old["inputs"], inputs)
        if r.type == DOCKER_PROVIDER:
            outputs = {}
        elif action == "replace":
            self._delete(r.urn)
            outputs = self._create(r, inputs)
        elif action == "update":
            outputs = self._update(r, inputs, old)
        else:
            outputs = self._create(r, inputs)
        with self.lock:
            self.real[r.urn] = outputs
            self.state[r.urn] = {
                "type": r.type,
                "name": r.name,
                "inputs": inputs,
                "outputs": outputs,
                "provider": self._provider_config(r) if r.type in (IMAGE, CONTAINER, VOLUME) else None,
                "order": len(self.state) if r.urn not in self.state else self.state[r.urn]["order"],
            }
            self._save()
        self._record(r, action, time.monotonic() - started, outputs)

    def _record(self, r: Resource, action: str, seconds: float, outputs: dict[str, Any] | None = None) -> None:
        outputs = outputs or {}
        step = StepLog(
            r.urn,
            r.name,
            r.type.split(":")[-1],
            action,
            seconds,
            str(outputs.get("stdout", "")),
            str(outputs.get("stderr", "")),
        )
        with self.lock:
            self.steps.append(step)
        if action != "same":
            self.log(f"  {action:8} {step.type:14} {r.name}  ({seconds:.1f}s)")

    def _change_kind(self, r: Resource, old: dict[str, Any], new: dict[str, Any]) -> str:
        if r.type in (COMMAND_REMOTE, COMMAND_LOCAL):
            return "replace" if old.get("triggers") != new.get("triggers") else "update"
        if r.type == IMAGE:
            return "replace"
        return "replace"  # containers and volumes: the inputs the plan sets are ForceNew in the schema

    def _provider_config(self, r: Resource) -> dict[str, Any]:
        prov = r.provider.rsplit("::", 1)[0]
        p = self.resources[prov].inputs
        return {"host": p["host"], "sshOpts": json.loads(p.get("sshOpts") or "[]")}

    def _registry_auth(self, r: Resource, ref: str) -> dict[str, str] | None:
        """The provider's registryAuth entry for the registry of `ref` (kept in memory, never in the state):
        keyed by the reference's first component when it is a registry host, as parseImageOptions reads it."""
        first, sep, _ = ref.partition("/")
        if not (sep and ("." in first or ":" in first or first == "localhost")):
            return None
        raw = self.resources[r.provider.rsplit("::", 1)[0]].inputs.get("registryAuth")
        for entry in json.loads(raw) if isinstance(raw, str) else (raw or []):
            if entry.get("address") == first:
                extra = set(entry) - {"address", "username", "password"}
                if extra:
                    raise RehearsalError(f"docker provider registryAuth field(s) {sorted(extra)} have no mapping")
                return {
                    "username": entry.get("username", ""),
                    "password": entry.get("password", ""),
                    "serveraddress": first,
                }
        return None

    def _docker(self, config: dict[str, Any]) -> DockerAPI:
        """One client per provider configuration, its connections kept as the provider keeps them."""
        key = json.dumps(config, sort_keys=True)
        with self.lock:
            if key not in self.apis:
                self.apis[key] = DockerAPI(config["host"], config["sshOpts"], self.env)
            return self.apis[key]

    def close(self) -> None:
        for api in self.apis.values():
            api.close()

    # ---- create / update / delete per type
    def _create(self, r: Resource, inputs: dict[str, Any]) -> dict[str, Any]:
        if r.type == COMMAND_REMOTE:
            return self._command(inputs, inputs["create"], inputs["connection"], r.name)
        if r.type == COMMAND_LOCAL:
            return self._command(inputs, inputs["create"], None, r.name)
        if r.type == IMAGE:
            extra = set(inputs) - {
                "name",
                "keepLocally",
                "pullTriggers",
                "triggers",
                "forceRemove",
                "platform",
                "build",
            }
            if extra:
                raise RehearsalError(f"docker:RemoteImage input(s) {sorted(extra)} have no mapping")
            api = self._docker(self._provider_config(r))
            if inputs.get("build"):
                return self._build(r, api, inputs["name"], inputs["build"])
            image_id = api.local_image(inputs["name"])
            for attempt in range(1, PULL_ATTEMPTS + 1):
                if image_id:
                    break
                try:
                    image_id = api.pull(inputs["name"], self._registry_auth(r, inputs["name"]))
                except DockerError as err:
                    # The lab has one registry mirror, a process on a busy machine: when it fails a request,
                    # dockerd falls back to the image's own registry, which no lab host can reach (a dial
                    # error). A real node would have got the image from there; the lab retries and says so.
                    # A refusal (credentials, unknown image) is not retried.
                    if attempt == PULL_ATTEMPTS or not any(m in str(err) for m in PULL_DIAL_ERRORS):
                        raise
                    note = f"{r.name}: pull attempt {attempt} failed ({err}); retrying"
                    with self.lock:
                        self.retries.append(note)
                    self.log(f"  {note}")
                    time.sleep(2 * attempt)
            return {"imageId": image_id, "repoDigest": inputs["name"]}
        if r.type == VOLUME:
            extra = set(inputs) - {"name", "driver", "labels"}
            if extra:
                raise RehearsalError(f"docker:Volume input(s) {sorted(extra)} have no mapping")
            api = self._docker(self._provider_config(r))
            api.call("POST", "/volumes/create", body={"Name": inputs["name"], "Driver": inputs.get("driver", "local")})
            return {"name": inputs["name"]}
        if r.type == CONTAINER:
            return self._container(r, inputs)
        if r.type == DOCKER_PROVIDER:
            return {}
        raise RehearsalError(f"{r.type} ({r.name}): the rehearsal has no implementation for this type")

    def _build(self, r: Resource, api: DockerAPI, name: str, build: dict[str, Any]) -> dict[str, Any]:
        """RemoteImage with `build`, as the provider does it on Linux: a BuildKit build on the provider's engine
        (its buildx path, or the legacy path with a BuildKit session: the engine's API is 1.41 >= 1.39) of the
        context directory, relative to the project (where Pulumi runs the program), tagged `name`; then
        findImage for its id. The docker CLI's BuildKit client sends the context through the same ssh
        dial-stdio connections the provider's client uses."""
        extra = set(build) - {"context", "dockerfile", "buildArgs"}
        if extra:
            raise RehearsalError(f"docker:RemoteImage build input(s) {sorted(extra)} have no mapping")
        context, dockerfile = (REPO / build["context"]).resolve(), dockerfile_of(build)
        base = parse_dockerfile(dockerfile.read_text()).base
        if not api.local_image(base):
            # BuildKit in Debian's dockerd 20.10 does not use a plain-HTTP registry mirror (it dials
            # https://<mirror>:443, whatever --insecure-registry says), and the lab's mirror is plain HTTP. The
            # engine's own pull does; BuildKit then uses the local image (its default: prefer local).
            api.pull(base, self._registry_auth(r, base))
            ADAPTATIONS.append(
                f"{base} (the FROM of {name}) pulled by the engine before the build: BuildKit in "
                "dockerd 20.10 does not use a plain-HTTP registry mirror"
            )
        argv = ["build", "--progress=plain", "-t", name, "-f", str(dockerfile)]
        for k, v in sorted((build.get("buildArgs") or {}).items()):
            argv += ["--build-arg", f"{k}={v}"]
        with api.local_socket() as sock:
            p = subprocess.run(
                ["/usr/bin/docker", "-H", f"unix://{sock}", *argv, str(context)],
                capture_output=True,
                text=True,
                env={**self.env, "DOCKER_BUILDKIT": "1"},
                timeout=1800,
            )
        if p.returncode:
            raise RehearsalError(
                f"building {name} on {api.target} failed ({p.returncode}):\n{(p.stdout + p.stderr).strip()[-3000:]}"
            )
        image_id = api.local_image(name)
        if not image_id:
            raise RehearsalError(f"built {name} on {api.target}, but its engine does not hold it")
        return {"imageId": image_id, "repoDigest": "", "buildLog": (p.stdout + p.stderr).strip()}

    def _update(self, r: Resource, inputs: dict[str, Any], old: dict[str, Any]) -> dict[str, Any]:
        script = inputs.get("update") or inputs["create"]
        conn = inputs.get("connection") if r.type == COMMAND_REMOTE else None
        return self._command(inputs, script, conn, r.name)

    def _container(self, r: Resource, inputs: dict[str, Any]) -> dict[str, Any]:
        body = container_body(inputs)
        files = uploads(inputs)
        api = self._docker(self._provider_config(r))
        if inputs.get("image") and REAL_ENGINE_LABEL in (
            (api.call("GET", f"/images/{inputs['image']}/json").get("Config") or {}).get("Labels") or {}
        ):
            # The lab's real-engine image carries no engine of its own: this machine's, read-only
            # (lab/vllm_cpu.py IMAGE_DIFFERENCES: site-packages), the one input the lab adds.
            body["HostConfig"].setdefault("Binds", []).extend(image_binds())
            ADAPTATIONS.append(
                f"containers of the real-engine image get this machine's vLLM at {IMAGE_SITE_PACKAGES} (read-only bind)"
            )
        created = api.call("POST", "/containers/create", query={"name": inputs["name"]}, body=body)
        cid = created["Id"]
        try:
            if files:
                api.upload(cid, files)
            api.call("POST", f"/containers/{cid}/start")
        except DockerError:
            # A container that never started is not in the state: remove it, so a new run can create it.
            api.call("DELETE", f"/containers/{cid}", ok=(204, 404), query={"force": "true"})
            raise
        if inputs.get("mustRun", True):
            time.sleep(0.5)
            state = api.call("GET", f"/containers/{cid}/json")["State"]
            if not state["Running"] and state.get("ExitCode", 0) != 0 and inputs.get("restart") in (None, "no"):
                raise RehearsalError(f"container {inputs['name']} exited {state['ExitCode']} right after start")
        if inputs.get("wait"):
            deadline = time.monotonic() + float(inputs.get("waitTimeout", 60))
            while api.call("GET", f"/containers/{cid}/json")["State"].get("Health", {}).get("Status") != "healthy":
                if time.monotonic() > deadline:
                    raise RehearsalError(f"container {inputs['name']} not healthy within waitTimeout")
                time.sleep(1)
        return {"id": cid}

    def _command(self, inputs: dict[str, Any], script: str, conn: dict[str, Any] | None, name: str) -> dict[str, Any]:
        known = {
            "connection",
            "create",
            "update",
            "delete",
            "triggers",
            "stdin",
            "logging",
            "environment",
            "addPreviousOutputInEnv",
            "interpreter",
            "dir",
        }
        extra = set(inputs) - known
        if extra:
            raise RehearsalError(f"{name}: command input(s) {sorted(extra)} have no mapping")
        stdin = inputs.get("stdin")
        env = dict(inputs.get("environment") or {})
        if conn is None:
            argv = list(inputs.get("interpreter") or ["/bin/sh", "-c"]) + [script]
            p = subprocess.run(
                argv,
                input=stdin,
                capture_output=True,
                text=True,
                cwd=inputs.get("dir"),
                env={**self.env, **env},
                timeout=3600,
            )
        else:
            p = self._ssh(conn, script, stdin, env)
        if p.returncode != 0:
            raise RehearsalError(
                f"exit status {p.returncode}\n    stdout: {p.stdout.strip()[-1500:]}"
                f"\n    stderr: {p.stderr.strip()[-1500:]}"
            )
        return {"stdout": p.stdout.rstrip("\n"), "stderr": p.stderr.rstrip("\n")}

    def _ssh(
        self, conn: dict[str, Any], script: str, stdin: str | None, env: dict[str, str]
    ) -> subprocess.CompletedProcess:
        """One SSH session with the resource's own connection, retried on dial errors like the provider."""
        extra = set(conn) - {
            "host",
            "port",
            "user",
            "hostKey",
            "privateKey",
            "privateKeyPassword",
            "dialErrorLimit",
            "perDialTimeout",
            "agentSocketPath",
        }
        if extra:
            raise RehearsalError(f"connection field(s) {sorted(extra)} have no mapping")
        if conn.get("privateKeyPassword"):
            raise RehearsalError("connection.privateKeyPassword: the rehearsal's ssh cannot take a passphrase")
        with tempfile.TemporaryDirectory(prefix="lab-ssh-") as tmp:
            opts = [
                "-o",
                "BatchMode=yes",
                "-p",
                str(int(conn.get("port", 22))),
                "-o",
                f"ConnectTimeout={int(conn.get('perDialTimeout', 15))}",
            ]
            if conn.get("hostKey"):
                kh = Path(tmp) / "known_hosts"
                kh.write_text(
                    f"{conn['host']} {conn['hostKey'].strip()}\n"
                    if int(conn.get("port", 22)) == 22
                    else f"[{conn['host']}]:{conn['port']} {conn['hostKey'].strip()}\n"
                )
                opts += ["-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={kh}"]
            else:
                # The provider checks no host key when none is given.
                opts += ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"]
            if conn.get("privateKey"):
                key = Path(tmp) / "key"
                key.write_text(conn["privateKey"])
                key.chmod(0o600)
                opts += ["-i", str(key), "-o", "IdentitiesOnly=yes"]
            for k, v in env.items():
                opts += ["-o", f"SetEnv={k}={v}"]
            env_ssh = dict(self.env)
            if conn.get("agentSocketPath"):
                env_ssh["SSH_AUTH_SOCK"] = conn["agentSocketPath"]
            argv = ["ssh", *opts, "-l", conn.get("user", "root"), conn["host"], script]
            limit = int(conn.get("dialErrorLimit", 10))
            attempt = 0
            while True:
                p = subprocess.run(
                    argv,
                    input=stdin if stdin is not None else "",
                    capture_output=True,
                    text=True,
                    env=env_ssh,
                    timeout=3600,
                )
                # 255: ssh itself failed (dial, auth, host key); the provider retries dials only.
                dial_error = p.returncode == 255 and ("Connection refused" in p.stderr or "timed out" in p.stderr)
                attempt += 1
                if not dial_error or (limit >= 0 and attempt >= limit):
                    return p
                time.sleep(min(2 * attempt, 10))

    # ---- destroy
    def destroy(self) -> list[StepLog]:
        """Delete every resource in the state, dependents first (reverse creation order)."""
        try:
            for urn in sorted(self.state, key=lambda u: self.state[u]["order"], reverse=True):
                self._delete(urn)
        finally:
            self.close()
        return self.steps

    def _delete(self, urn: str) -> None:
        s = self.state[urn]
        started = time.monotonic()
        inputs, t = s["inputs"], s["type"]
        if t in (COMMAND_REMOTE, COMMAND_LOCAL) and inputs.get("delete"):
            conn = inputs.get("connection") if t == COMMAND_REMOTE else None
            self._command(inputs, inputs["delete"], conn, s["name"])
        elif t == CONTAINER:
            api = self._docker(s["provider"])
            cid = s["outputs"]["id"]
            grace = inputs.get("destroyGraceSeconds")
            try:
                if grace is not None:
                    api.call(
                        "POST",
                        f"/containers/{cid}/stop",
                        ok=(204, 304),
                        query={"t": int(grace)},
                        timeout=int(grace) + 60,
                    )
                api.call("DELETE", f"/containers/{cid}", query={"force": "true", "v": "false"})
            except DockerError as e:
                if "No such container" not in str(e):
                    raise
        elif t == IMAGE and not inputs.get("keepLocally"):
            self._docker(s["provider"]).call("DELETE", f"/images/{s['outputs']['imageId']}", ok=(200, 404, 409))
        elif t == VOLUME:
            self._docker(s["provider"]).call("DELETE", f"/volumes/{inputs['name']}", ok=(204, 404))
        with self.lock:
            del self.state[urn]
            self.real.pop(urn, None)
            self._save()
        self.steps.append(StepLog(urn, s["name"], t.split(":")[-1], "delete", time.monotonic() - started))
        self.log(f"  delete   {t.split(':')[-1]:14} {s['name']}  ({time.monotonic() - started:.1f}s)")
