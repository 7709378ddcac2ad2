"""Run the Pulumi program under the mock runtime and record every registration as the engine would see it."""

from __future__ import annotations

import asyncio
import hashlib
import json
import runpy
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
from google.protobuf import json_format
from pulumi.runtime import mocks as pulumi_mocks
from pulumi.runtime import rpc, settings
from pulumi.runtime.config import set_all_config
from pulumi.runtime.settings import SETTINGS
from pulumi.runtime.stack import run_pulumi_func
from pulumi.runtime.sync_await import _sync_await

from plan.stackfile import secret_placeholder

# Pulumi's wire-format markers, taken from the pinned SDK rather than copied.
SIG = rpc._special_sig_key
SECRET_SIG = rpc._special_secret_sig
ASSET_SIG = rpc._special_asset_sig
ARCHIVE_SIG = rpc._special_archive_sig
UNKNOWN = rpc.UNKNOWN
SECRET_MARK = "[secret]"


@dataclass
class Registration:
    """One RegisterResource call: what the engine (and so the policy pack) would receive."""

    urn: str
    type: str
    name: str
    parent: str
    custom: bool
    inputs: dict[str, Any]  # wire form: secrets as {SIG: SECRET_SIG, "value": …}
    dependencies: list[str]
    property_dependencies: dict[str, list[str]]
    provider: str
    options: dict[str, Any]
    outputs: dict[str, Any] = field(default_factory=dict)  # register_outputs of components
    resource_id: str = ""  # what the engine answered: "" at preview (unknown until created)
    state: dict[str, Any] = field(default_factory=dict)  # a custom resource's outputs, as the engine answered

    def plain_inputs(self) -> dict[str, Any]:
        """Inputs with secret envelopes replaced by their values (what an Analyze callback sees)."""
        return unwrap(self.inputs, reveal=True)

    def display_inputs(self) -> dict[str, Any]:
        """Inputs with every secret value replaced by "[secret]" (safe to print and store)."""
        return unwrap(self.inputs, reveal=False)


def unwrap(value: Any, *, reveal: bool) -> Any:
    """Strip Pulumi's wire envelopes: secrets (revealed or masked), assets (their text or path)."""
    if isinstance(value, dict):
        sig = value.get(SIG)
        if sig == SECRET_SIG:
            return unwrap(value.get("value"), reveal=reveal) if reveal else SECRET_MARK
        if sig == ASSET_SIG:
            return {"asset": {k: v for k, v in value.items() if k != SIG}}
        if sig == ARCHIVE_SIG:
            return {"archive": {k: unwrap(v, reveal=reveal) for k, v in value.items() if k != SIG}}
        return {k: unwrap(v, reveal=reveal) for k, v in value.items()}
    if isinstance(value, list):
        return [unwrap(v, reveal=reveal) for v in value]
    return value


def _digest(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


# Computed outputs the providers return and the program reads downstream; without them a mock
# resolves those outputs to None and the dependent inputs silently vanish (see README). Only `pulumi
# up` knows them: a preview leaves them out, so they are unknown, as the engine has them before a create.
COMPUTED_OUTPUTS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "docker:index/remoteImage:RemoteImage": lambda inp: {
        "imageId": _digest(str(inp.get("name"))),
        "repoDigest": f"{inp.get('name')}@{_digest(str(inp.get('name')))}",
    },
}
COMMAND_TYPES = frozenset({"command:remote:Command", "command:local:Command"})


def generated_value(urn: str, prop: str) -> str:
    """What a command prints, standing in for a value made on the host (a key, a password) at `pulumi up`.

    It has the shape of a stack secret's placeholder, so the plan's leak check finds it wherever it
    escapes its secret envelope, exactly as it finds a secret from the stack file.
    """
    return secret_placeholder("generated", f"{urn}.{prop}")


def _is_provider(type_: str) -> bool:
    return type_.startswith("pulumi:providers:")


class PlanMocks(pulumi_mocks.Mocks):
    """The engine's answer to a registration: `pulumi up` (ids and computed outputs known) or a preview.

    A preview is a first `pulumi preview`: nothing exists yet. The engine then answers a create with
    an empty id (the SDK makes it unknown), the inputs it was given, and no computed output (unknown);
    a provider's id is the engine's unknown sentinel. `pulumi up` answers with an opaque id, the
    computed outputs the program reads, and each command's stdout (see generated_value).
    """

    def __init__(self, preview: bool = False):
        self.preview = preview
        # The URN being registered, set by RecordingMonitor on the thread that registers it
        # (MockResourceArgs carries no parent, so no URN).
        self.current = threading.local()

    def new_resource(self, args: pulumi_mocks.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        state = dict(args.inputs)
        if not args.custom:
            return "", state
        if self.preview:
            return (UNKNOWN if _is_provider(args.typ) else ""), state
        urn = getattr(self.current, "urn", f"{args.typ}::{args.name}")
        extra = COMPUTED_OUTPUTS.get(args.typ)
        if extra is not None:
            state.update(extra(args.inputs))
        if args.typ in COMMAND_TYPES:
            state.update(stdout=generated_value(urn, "stdout"), stderr="")
        # Opaque, as a real id is: a test that needs one reads it from the run, never guesses it.
        return hashlib.sha256(urn.encode()).hexdigest()[:32], state

    def call(self, args: pulumi_mocks.MockCallArgs) -> dict[str, Any]:
        return {}


class DuplicateUrnError(RuntimeError):
    """Two resources with one URN: the engine refuses the whole deployment, so the harness does too."""


class RecordingMonitor(pulumi_mocks.MockMonitor):
    """A MockMonitor that keeps each raw RegisterResourceRequest (parent, dependencies, options)."""

    def __init__(self, mocks: PlanMocks):
        super().__init__(mocks)
        self.plan_mocks = mocks
        self.registrations: list[Registration] = []
        self._by_urn: dict[str, Registration] = {}
        self._lock = threading.Lock()

    def make_urn(self, parent: str, type_: str, name: str) -> str:
        # As the engine names it: the type qualified by every parent's type but the root stack's
        # (the SDK's mock keeps the stack's and drops all but the nearest parent's).
        qualified = parent.split("::")[2] if parent else ""
        if qualified and qualified != "pulumi:pulumi:Stack":
            type_ = f"{qualified}${type_}"
        return "urn:pulumi:" + "::".join([settings.get_stack(), settings.get_project(), type_, name])

    def RegisterResource(self, request: Any) -> Any:
        if request.type == "pulumi:pulumi:Stack":
            return super().RegisterResource(request)
        urn = self.make_urn(request.parent, request.type, request.name)
        options = {
            "deleteBeforeReplace": request.deleteBeforeReplace,
            "protect": request.protect,
            "ignoreChanges": list(request.ignoreChanges),
            "replaceOnChanges": list(request.replaceOnChanges),
            "retainOnDelete": request.retainOnDelete,
            "customTimeouts": json_format.MessageToDict(request.customTimeouts),
            "additionalSecretOutputs": list(request.additionalSecretOutputs),
            "deletedWith": request.deletedWith,
            "replaceWith": list(request.replace_with),
        }
        reg = Registration(
            urn=urn,
            type=request.type,
            name=request.name,
            parent=request.parent,
            custom=bool(request.custom),
            inputs=json_format.MessageToDict(request.object),
            dependencies=list(request.dependencies),
            property_dependencies={k: list(v.urns) for k, v in request.propertyDependencies.items()},
            provider=request.provider,
            options=options,
        )
        with self._lock:
            if urn in self._by_urn:
                # The engine's own words (pkg/resource/deploy/step_generator.go).
                raise DuplicateUrnError(f"Duplicate resource URN '{urn}'; try giving it a unique name")
            self.registrations.append(reg)
            self._by_urn[urn] = reg
        self.plan_mocks.current.urn = urn
        response = super().RegisterResource(request)
        if reg.custom:
            reg.resource_id = response.id
            reg.state = json_format.MessageToDict(response.object)
        return response

    def RegisterResourceOutputs(self, request: Any) -> Any:
        reg = self._by_urn.get(request.urn)
        if reg is not None:
            reg.outputs = json_format.MessageToDict(request.outputs)
        return super().RegisterResourceOutputs(request)


@dataclass
class ProgramRun:
    """What one run of the program registered, plus its stack outputs (secrets masked)."""

    registrations: list[Registration]
    stack_outputs: dict[str, Any]
    # The values of the secret stack outputs, revealed: only for the leak check, never to print.
    secret_output_values: dict[str, Any] = field(default_factory=dict)

    def generated_secrets(self) -> dict[str, str]:
        """Values made on the hosts at `pulumi up` that are secrets: "<urn>.stdout" -> the value.

        A command's stdout is a secret when the program says so (additional_secret_outputs) or treats
        it as one: it reaches a secret stack output or a secret input. Empty at preview (unknown).
        """
        secret_text = json.dumps(self.secret_output_values) + json.dumps(
            [_secret_parts(r.inputs) for r in self.registrations]
        )
        found = {}
        for r in self.registrations:
            value = r.state.get("stdout") if r.type in COMMAND_TYPES else None
            if (
                isinstance(value, str)
                and value
                and ("stdout" in r.options.get("additionalSecretOutputs", []) or value in secret_text)
            ):
                found[f"{r.urn}.stdout"] = value
        return found

    def by_type(self, type_: str) -> list[Registration]:
        """Registrations of one resource type, in registration order."""
        return [r for r in self.registrations if r.type == type_]

    def get(self, name: str) -> Registration:
        """The registration with this logical name (names are unique in this program)."""
        found = [r for r in self.registrations if r.name == name]
        if len(found) != 1:
            raise KeyError(f"{len(found)} resources named {name!r}")
        return found[0]


def _secret_parts(value: Any) -> list[Any]:
    """Every value inside a secret envelope."""
    if isinstance(value, dict):
        if value.get(SIG) == SECRET_SIG:
            return [value.get("value")]
        return [p for v in value.values() for p in _secret_parts(v)]
    if isinstance(value, list):
        return [p for v in value for p in _secret_parts(v)]
    return []


def config_for_mocks(config: Mapping[str, Any]) -> dict[str, str]:
    """Pulumi passes every config value to the program as a string; objects travel as JSON."""
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in config.items()}


def _ensure_event_loop() -> None:
    """The SDK builds its futures on the thread's current loop; an earlier asyncio.run() leaves none."""
    try:
        loop = asyncio.get_event_loop_policy().get_event_loop()
    except RuntimeError:
        loop = None
    if loop is None or loop.is_closed():
        asyncio.set_event_loop(asyncio.new_event_loop())


def run_program(
    program: Callable[[], None],
    config: Mapping[str, Any],
    secret_keys: set[str],
    *,
    project: str = "llm-cluster",
    stack: str = "prod",
    preview: bool = False,
) -> ProgramRun:
    """Run `program` under the mock runtime with this stack config; return every registration."""
    _ensure_event_loop()
    mocks = PlanMocks(preview)
    monitor = RecordingMonitor(mocks)
    # The root Stack resource outlives a run in this process; without a fresh one, a second run
    # under another stack name would parent everything to the first run's stack.
    settings.ROOT.set(None)
    pulumi_mocks.set_mocks(mocks, project=project, stack=stack, preview=preview, monitor=monitor)
    set_all_config(config_for_mocks(config), secret_keys=sorted(secret_keys))
    SETTINGS.rpc_manager.clear()
    SETTINGS.outputs.clear()
    stack_outputs: dict[str, Any] = {}
    original_export = pulumi.export

    def record_export(name: str, value: Any) -> None:
        stack_outputs[name] = value
        original_export(name, value)

    pulumi.export = record_export  # the program exports through the module attribute
    try:
        _sync_await(run_pulumi_func(program))
    finally:
        pulumi.export = original_export
    return ProgramRun(
        monitor.registrations,
        {k: _settle(v) for k, v in stack_outputs.items()},
        {k: _reveal(v) for k, v in stack_outputs.items() if _is_secret(v) and _is_known(v)},
    )


PROGRAM = Path(__file__).resolve().parent.parent / "__main__.py"


def run_main_program(
    config: Mapping[str, Any], secret_keys: set[str] | frozenset[str], *, stack: str = "prod", preview: bool = False
) -> ProgramRun:
    """Run the project's own __main__.py (the program `pulumi up` runs) under the mock runtime."""
    return run_program(
        lambda: runpy.run_path(str(PROGRAM), run_name="__pulumi_main__"),
        config,
        set(secret_keys),
        stack=stack,
        preview=preview,
    )


def _is_secret(value: Any) -> bool:
    return bool(_sync_await(pulumi.Output.from_input(value).is_secret()))


def _is_known(value: Any) -> bool:
    return bool(_sync_await(pulumi.Output.from_input(value).is_known()))


def _reveal(value: Any) -> Any:
    return _sync_await(pulumi.Output.from_input(value).future())


def _settle(value: Any) -> Any:
    """A stack output as `pulumi stack output` would show it: secrets masked, unknowns marked."""
    out = pulumi.Output.from_input(value)
    if _sync_await(out.is_secret()):
        return SECRET_MARK
    if not _sync_await(out.is_known()):
        return "[unknown until deployed]"
    return _sync_await(out.future())
