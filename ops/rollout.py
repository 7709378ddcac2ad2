"""`make rollout STACK=prod POOL=chat`: roll a change out to a pool a few instances at a time.

Through Pulumi's Automation API (which drives the `pulumi` CLI on PATH), per step of at most
`maxUnavailable` instances:
0. a pool routed by prefix affinity: the instances are drained at the gateway (POST /admin/drain on its
   metrics listener): no new request reaches them, and the rollout waits until the requests they hold are
   done (at most the pool's readTimeoutSeconds), so stopping their containers cuts no stream;
1. `pulumi up --target <the instances' containers, the images they run on their nodes, the gates that
   check them> --target-dependents`: the old containers go, the new ones start, and the up returns
   only when their health gates (Ray's GPU gate, /health) pass;
2. the gateway's failTimeoutSeconds (+ 1: nginx counts whole seconds), for nginx to take back the
   replicas it shunned while they were down; drained instances are put back in rotation (DELETE
   /admin/drain); then a check through it: three chat completions in a row for the pool's model must answer 200 (the gateway balances over the pool, so this proves the
   pool serves with the new instances in it); a 502/503/504 or no answer is retried for up to
   failTimeoutSeconds + 30 s before the step fails, naming the logs to read;
3. the next step — or, on the first failure, stop and say which instance is left in which state.
The other instances keep serving throughout. What is not an instance (weights, node scripts, the
gateway and monitoring config) is not touched: run a full `pulumi up` after the rollout.

The URNs come from the program itself, run under the mock runtime as `make plan` runs it.
"""

from __future__ import annotations

import argparse
import json
import ssl
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pulumi import automation as auto

from components.node_programs.smoke_client import RETRY_STATUSES
from components.planning.gateway.layout import metrics_address
from components.planning.gateway.nginx import DRAIN_PATH
from components.planning.gateway.routing import upstream_servers
from components.planning.smoke import retry_seconds, where_to_look
from components.spec import StackSpec
from components.spec.topology import affinity_pools, instances
from plan.cli import run as run_cli
from plan.harness import ProgramRun, Registration, run_main_program
from plan.stackfile import load_spec

ROOT = Path(__file__).resolve().parent.parent

CONTAINER = "docker:index/container:Container"
INSTANCE_LABEL = "llm-cluster.instance"
EXIT_OK, EXIT_FAILED, EXIT_INVALID = 0, 1, 2


@dataclass(frozen=True)
class Step:
    """Instances replaced together, and the URNs `pulumi up --target` gets for them."""

    instances: tuple[str, ...]
    targets: tuple[str, ...]


def _labels(r: Registration) -> dict[str, str]:
    return {lbl.get("label"): lbl.get("value") for lbl in r.display_inputs().get("labels") or []}


def instance_targets(run: ProgramRun, instance: str) -> list[str]:
    """URNs of an instance: its containers, what their inputs read from (images), and what reads them (gates)."""
    by_urn = {r.urn: r for r in run.registrations}
    containers = [r for r in run.by_type(CONTAINER) if _labels(r).get(INSTANCE_LABEL) == instance]
    if not containers:
        return []
    picked = {r.urn for r in containers}
    # The image a container runs is a RemoteImage on its node: a new image must be pulled in the same up.
    for r in containers:
        for urns in r.property_dependencies.values():
            picked |= {u for u in urns if u in by_urn and by_urn[u].custom and by_urn[u].provider == r.provider}
    # The instance's gates (children of its components) read the containers' ids: they re-run and
    # must pass before the step counts as done. Cluster-wide checks follow as dependents.
    own = {r.urn for r in run.registrations if not r.custom and r.plain_inputs().get("instance") == instance}
    grew = True
    while grew:
        readers = {
            r.urn
            for r in run.registrations
            if r.custom
            and r.urn not in picked
            and r.parent in own
            and any(u in picked for us in r.property_dependencies.values() for u in us)
        }
        picked |= readers
        grew = bool(readers)
    return [r.urn for r in run.registrations if r.urn in picked]


def rollout_steps(run: ProgramRun, spec: StackSpec, pool: str, max_unavailable: int) -> list[Step]:
    """The pool's instances in stack order, `max_unavailable` per step, each with its target URNs."""
    names = [i.name for i in instances(spec, pool)]
    return [
        Step(tuple(batch), tuple(u for name in batch for u in instance_targets(run, name)))
        for batch in (names[k : k + max_unavailable] for k in range(0, len(names), max_unavailable))
    ]


@dataclass(frozen=True)
class Drain:
    """How the rollout takes a step's instances out of the gateway before replacing them."""

    url: str  # the gateway's drain endpoint, on its metrics listener
    pool: str
    replicas: Mapping[str, str]  # instance -> its replica as the gateway names it (host:port)
    timeout_s: float  # the pool's readTimeoutSeconds: no request it holds lasts longer
    poll_s: float = 0.5

    def undrain_command(self, name: str) -> str:
        return f"curl -X DELETE '{self.url}?pool={self.pool}&replica={self.replicas[name]}'"


def pool_drain(spec: StackSpec, pool: str, url: str | None = None) -> Drain | None:
    """The pool's Drain (its replicas at the gateway's /admin/drain), or None where the gateway cannot drain it:
    no gateway, or a pool nginx balances itself (least_conn, one instance)."""
    if spec.gateway is None or pool not in affinity_pools(spec):
        return None
    names = [i.name for i in instances(spec, pool)]
    addrs = [f"{host}:{port}" for host, port in upstream_servers(spec, pool)]
    return Drain(
        url or f"http://{metrics_address(spec)}{DRAIN_PATH}",
        pool,
        dict(zip(names, addrs, strict=True)),
        spec.pools[pool].read_timeout_seconds,
    )


def _admin(drain: Drain, method: str, replica: str | None = None) -> dict[str, Any]:
    """One call of the drain endpoint: its JSON answer, or OSError with what it said."""
    query = f"pool={drain.pool}" + (f"&replica={replica}" if replica else "")
    request = urllib.request.Request(f"{drain.url}?{query}", method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:  # noqa: S310 (the stack's own gateway)
            answer: dict[str, Any] = json.loads(resp.read())
            return answer
    except urllib.error.HTTPError as e:
        detail = e.read()[:300].decode(errors="replace")
        raise OSError(f"{method} {drain.url}?{query} answered {e.code}: {detail}") from None
    except (OSError, ValueError) as e:
        raise OSError(f"{method} {drain.url}?{query} failed: {e}") from None


def drain_step(drain: Drain, names: tuple[str, ...], say: Callable[[str], None]) -> None:
    """Drain the instances at the gateway and wait until none holds a request (at most drain.timeout_s); OSError
    when the gateway cannot be asked."""
    for name in names:
        _admin(drain, "POST", drain.replicas[name])
    start = time.monotonic()
    while True:
        replicas = _admin(drain, "GET").get(drain.pool, {})
        left = {n: replicas.get(drain.replicas[n], {}).get("in_flight", 0) for n in names}
        waited = time.monotonic() - start
        if not any(left.values()):
            say(f"    {', '.join(names)}: drained at the gateway, nothing in flight after {waited:.1f} s")
            return
        if waited >= drain.timeout_s:
            busy = ", ".join(f"{n} ({c})" for n, c in left.items() if c)
            say(
                f"    drained at the gateway, but still in flight after {drain.timeout_s:g} s "
                f"(pools.{drain.pool}.readTimeoutSeconds): {busy}; replacing all the same"
            )
            return
        time.sleep(drain.poll_s)


def _left_drained(drain: Drain, names: tuple[str, ...]) -> str:
    """What a failed step leaves drained at the gateway, and how to put each back."""
    return "\n".join(
        [f"  left drained at the gateway (no new request reaches them): {', '.join(names)}; once they serve, undrain:"]
        + [f"    {drain.undrain_command(n)}" for n in names]
    )


def gateway_check(
    url: str,
    api_key: str | None,
    model: str,
    *,
    attempts: int = 3,
    timeout_s: float = 300,
    wait_s: float = 60,
    pause_s: float = 1,
    insecure: bool = False,
    say: Callable[[str], None] | None = None,
) -> str | None:
    """None once `attempts` chat completions for `model` in a row answer 200 through the gateway; else what failed.

    A pool that just became healthy may still be refused for a while: nginx keeps a replica that
    failed during its replacement out for failTimeoutSeconds (502 once none is left), the engine
    queues (503), a 429 asks to wait. Those answers and unreachable connections are retried,
    `pause_s` apart (a 429 as its Retry-After says), until `wait_s` has passed; any other answer
    (401, 404, …) fails at once, since waiting does not change it.
    """
    body = json.dumps(
        {"model": model, "messages": [{"role": "user", "content": "Say OK."}], "max_tokens": 1, "stream": False}
    ).encode()
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {api_key}"} if api_key else {})
    context = ssl._create_unverified_context() if insecure else None  # noqa: S323 (the operator's choice)
    where = f"for model {model!r} through {url}"
    start = time.monotonic()
    in_a_row = sent = 0
    retrying = False
    while in_a_row < attempts:
        sent += 1
        request = urllib.request.Request(f"{url.rstrip('/')}/v1/chat/completions", data=body, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout_s, context=context) as resp:  # noqa: S310
                resp.read()
            in_a_row += 1
            continue
        except urllib.error.HTTPError as e:
            status, seen = e.code, f"answered {e.code}: {e.read()[:300].decode(errors='replace')}"
            retry_after = e.headers.get("Retry-After")
        except OSError as e:
            status, seen = 0, f"failed: {e}"
        if status == 429:
            pause = _retry_after(retry_after)  # the key's limit, shared with the clients the cluster serves
        elif status in RETRY_STATUSES or status == 0:
            in_a_row, pause = 0, pause_s
        else:
            return f"request {sent} {where} {seen}"
        waited = time.monotonic() - start
        if waited + pause > wait_s:
            return f"request {sent} {where} {seen}; retried for {waited:.0f} s (at most {wait_s:g} s)"
        if say is not None and not retrying and status != 429:
            say(f"    the gateway {seen.split(':')[0]}; retrying for up to {wait_s:g} s")
            retrying = True
        time.sleep(pause)
    return None


def _retry_after(value: str | None) -> float | None:
    """Seconds a 429's Retry-After asks for (1 when absent or not a number), at most a minute."""
    try:
        return min(max(float(value or 1), 0.1), 60.0)
    except ValueError:
        return 1.0


def _first_key(outputs: dict[str, Any]) -> str | None:
    """The first API key of the stack output gatewayApiKeys ({"<id>": "<key>"}), None without auth."""
    value = outputs.get("gatewayApiKeys")
    raw = getattr(value, "value", value)
    if not raw:
        return None
    keys = json.loads(raw) if isinstance(raw, str) else raw
    return next(iter(keys.values()), None)


def _output(outputs: dict[str, Any], name: str) -> Any:
    value = outputs.get(name)
    return getattr(value, "value", value)


def _states(steps: list[Step], at: int, failed: str) -> list[str]:
    """Which instance is left in which state when step `at` failed."""
    lines = []
    for k, step in enumerate(steps):
        for name in step.instances:
            if k < at:
                lines.append(f"  {name}: rolled out, healthy and serving through the gateway")
            elif k == at:
                lines.append(f"  {name}: {failed}")
            else:
                lines.append(f"  {name}: not touched (still the previous version, serving)")
    return lines


def settle_seconds(spec: StackSpec) -> float:
    """The wait after each step: nginx keeps a replica that failed out failTimeoutSeconds after its last
    failure, counted in whole seconds (least_conn: `now - checked <= fail_timeout`), so one more."""
    return spec.gateway.fail_timeout_seconds + 1 if spec.gateway is not None else 0


def rollout(
    stack: Any,
    steps: list[Step],
    model: str,
    *,
    check: Callable[..., str | None] = gateway_check,
    say: Callable[[str], None] = print,
    policy_pack: Path | None = ROOT / "policies",
    insecure: bool = False,
    settle_s: float = 0,
    gateway_wait_s: float = 60,
    look_at: str = "the gateway's error log",
    drain: Drain | None = None,
) -> int:
    """Run the steps on an Automation API stack; stop at the first failure, naming each instance's state.

    `settle_s` (settle_seconds) is waited after each step: nginx keeps a replica that failed while it
    was being replaced out of rotation that long, so the next step would otherwise take a second
    replica out while the first is still shunned. The gateway check then retries for up to
    `gateway_wait_s`; `look_at` says what to read when it still fails. With `drain`, each step's instances are
    drained at the gateway first (drain_step) and undrained once healthy, before the check.
    """
    total = sum(len(s.instances) for s in steps)
    if any(len(s.instances) == total for s in steps):
        say(
            f"warning: a step replaces all {total} instance(s) of the pool: it serves nothing until that step's "
            "instances are healthy (a second pool of the model, blue/green, keeps it serving)"
        )
    for k, step in enumerate(steps):
        names = ", ".join(step.instances)
        say(f"[{k + 1}/{len(steps)}] {names}: pulumi up --target-dependents with {len(step.targets)} targets")
        if not step.targets:
            say(f"rollout stopped: the program registers no container for {names}")
            return EXIT_FAILED
        # A step of every instance is not drained: the gateway would have no replica left to send to.
        drained = drain if drain is not None and len(step.instances) < total else None
        if drain is not None and drained is None:
            say(f"    {names}: not drained at the gateway (the step replaces every instance of the pool)")
        if drained is not None:
            try:
                drain_step(drained, step.instances, say)
            except OSError as e:
                say(f"rollout stopped at {names}: the gateway could not drain it ({e}); nothing replaced")
                try:
                    for name in step.instances:
                        _admin(drained, "DELETE", drained.replicas[name])
                except OSError:
                    say(_left_drained(drained, step.instances))
                say("\n".join(_states(steps, k, "not replaced (still the previous version)")))
                return EXIT_FAILED
        try:
            result = stack.up(
                target=list(step.targets),
                target_dependents=True,
                policy_packs=[str(policy_pack)] if policy_pack else None,
                on_output=lambda line: say(f"    {line.rstrip()}"),
            )
        except auto.errors.CommandError as e:
            say(
                f"rollout stopped at {names}: pulumi up failed ({str(e).strip().splitlines()[-1] if str(e).strip() else e})"
            )
            say(
                "\n".join(
                    _states(
                        steps,
                        k,
                        "replaced by a failed up: its containers or health gate did not come "
                        "up; see the up output above, `docker ps -a` and `docker logs` on its nodes",
                    )
                )
            )
            if drained is not None:
                say(_left_drained(drained, step.instances))
            return EXIT_FAILED
        if settle_s:
            say(
                f"    {names}: healthy; {settle_s:g} s for the gateway to take it back (failTimeoutSeconds, "
                "in nginx's whole seconds)"
            )
            time.sleep(settle_s)
        if drained is not None:
            try:
                for name in step.instances:
                    _admin(drained, "DELETE", drained.replicas[name])
            except OSError as e:
                say(f"rollout stopped at {names}: healthy, but the gateway could not undrain it ({e})")
                say(_left_drained(drained, step.instances))
                return EXIT_FAILED
            say(f"    {names}: back in rotation at the gateway")
        url = _output(result.outputs, "gatewayUrl")
        if url:
            problem = check(url, _first_key(result.outputs), model, insecure=insecure, wait_s=gateway_wait_s, say=say)
            if problem:
                say(f"rollout stopped at {names}: healthy, but the gateway check failed: {problem}")
                say(
                    "\n".join(
                        _states(
                            steps,
                            k,
                            "replaced and healthy (its gates passed), but the pool does not "
                            f"serve through the gateway; check: {look_at}",
                        )
                    )
                )
                return EXIT_FAILED
            say(f"    {names}: healthy; the gateway serves {model}")
        else:
            say(f"    {names}: healthy (the stack has no gateway to check through)")
    say(
        f"rollout done: {total} instance(s); run `pulumi up` for anything else "
        "the change touches (config reloads, weights, node scripts)"
    )
    return EXIT_OK


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ops.rollout", description=__doc__.split("\n\n")[0])
    p.add_argument("--stack", default="prod", help="the Pulumi stack (Pulumi.<stack>.yaml; default: prod)")
    p.add_argument("--pool", required=True, help="the pool to roll out")
    p.add_argument("--max-unavailable", type=int, help="instances per step (default: the pool's maxUnavailable)")
    p.add_argument("--insecure", action="store_true", help="do not verify the gateway's TLS certificate")
    p.add_argument(
        "--settle-seconds",
        type=float,
        help="wait after each step before the gateway check (default: gateway.failTimeoutSeconds + 1)",
    )
    p.add_argument(
        "--gateway-wait-seconds",
        type=float,
        help="how long the gateway check retries a pool that does not answer yet "
        "(default: gateway.failTimeoutSeconds + 30)",
    )
    p.add_argument(
        "--gateway-admin",
        help="the gateway's drain endpoint (default: http://<gateway node>:<gateway.metricsPort>/admin/drain, "
        "on the cluster network)",
    )
    p.add_argument("--dry-run", action="store_true", help="print the steps and their targets, change nothing")
    return p


def main(argv: list[str] | None = None) -> int:
    """Plan the steps from the program, then run them through the Automation API."""
    args = _parser().parse_args(argv)
    path = ROOT / f"Pulumi.{args.stack}.yaml"
    loaded = load_spec(path, args.stack)
    if loaded is None:
        return EXIT_INVALID
    stack_file, spec = loaded
    if args.pool not in spec.pools:
        print(f"--pool {args.pool!r}: the stack's pools are {', '.join(spec.pools)}", file=sys.stderr)
        return EXIT_INVALID
    limit = args.max_unavailable or spec.pools[args.pool].max_unavailable
    if limit < 1:
        print("--max-unavailable must be at least 1", file=sys.stderr)
        return EXIT_INVALID
    run = run_main_program(stack_file.config, stack_file.secret_keys, stack=stack_file.name, preview=True)
    steps = rollout_steps(run, spec, args.pool, limit)
    model = spec.served_names(spec.pools[args.pool].model)[0]
    if args.dry_run:
        for k, step in enumerate(steps, 1):
            print(f"[{k}/{len(steps)}] {', '.join(step.instances)}")
            print("\n".join(f"    --target {u}" for u in step.targets))
        return EXIT_OK
    stack = auto.select_stack(stack_name=args.stack, work_dir=str(ROOT))
    settle = args.settle_seconds if args.settle_seconds is not None else settle_seconds(spec)
    if spec.gateway is None:
        return rollout(stack, steps, model, settle_s=settle)
    wait = args.gateway_wait_seconds if args.gateway_wait_seconds is not None else retry_seconds(spec)
    drain = pool_drain(spec, args.pool, args.gateway_admin)
    if drain is None:
        print(
            f"note: pool {args.pool!r} is not routed by prefix affinity: it is not drained at the gateway, and the "
            "streams its replaced instances are sending when they stop are cut",
            file=sys.stderr,
        )
    return rollout(
        stack,
        steps,
        model,
        insecure=args.insecure,
        settle_s=settle,
        gateway_wait_s=wait,
        look_at=where_to_look(spec, args.pool),
        drain=drain,
    )


if __name__ == "__main__":
    run_cli(main)
