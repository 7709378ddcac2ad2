"""`python -m plan`: the offline plan of a stack — exit 0 clean, 1 mandatory violation, 2 invalid config."""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pulumi

from components.engines.base import REDACTED
from components.engines.credentials import CREDENTIAL_SHAPES
from components.planning.capacity import capacity_report
from components.spec import SpecError
from plan.analyze import PolicyConfigError, analyze
from plan.ci import configured_levels, junit, repo_uri, sarif, write_text
from plan.cli import emit
from plan.cli import run as run_cli
from plan.diff import keep_previous, parse_plan, plan_diff, previous_plan
from plan.graph import component_graph, write_graph
from plan.harness import DuplicateUrnError, run_main_program
from plan.redact import Redactor
from plan.report import PlanResult, artifacts_of, in_stable_order, plan_json, render_text, write_artifacts
from plan.secrets import find_leaks, text_leaks, unmarked_outputs
from plan.stackfile import load_spec, say_invalid

ROOT = Path(__file__).resolve().parent.parent

EXIT_OK, EXIT_VIOLATION, EXIT_INVALID = 0, 1, 2
FORMATS = ("text", "json", "sarif", "junit")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m plan", description=__doc__)
    where = p.add_mutually_exclusive_group()
    where.add_argument("--stack", default="prod", help="plan Pulumi.<stack>.yaml (default: prod)")
    where.add_argument("--config", type=Path, help="plan any stack file")
    p.add_argument("--out", type=Path, default=ROOT / "build" / "plan", help="output root (default: build/plan)")
    p.add_argument(
        "--up", action="store_true", help="model `pulumi up` (computed outputs known) instead of `pulumi preview`"
    )
    p.add_argument("--policy-config", type=Path, help="policy pack config JSON, as --policy-pack-config")
    p.add_argument(
        "--quiet",
        action="store_true",
        help="no progress; with --format text print only the verdict (errors still go to stderr)",
    )
    p.add_argument(
        "--format",
        choices=FORMATS,
        default="text",
        help="what to print on stdout: the readable plan (default), plan.json, SARIF 2.1.0 or JUnit XML",
    )
    p.add_argument("--sarif", type=Path, metavar="FILE", help="also write the policy verdicts as SARIF 2.1.0 to FILE")
    p.add_argument(
        "--junit",
        type=Path,
        metavar="FILE",
        help="also write the policy verdicts as JUnit XML to FILE (one test case per rule and pool)",
    )
    p.add_argument(
        "--against",
        type=Path,
        metavar="PLAN_JSON",
        help="diff against this plan.json (default: the previous plan, kept in <out>/<stack>/previous/)",
    )
    return p


def _progress(quiet: bool) -> Callable[[str], None]:
    """Progress lines on stderr with the elapsed time; none with --quiet."""
    start = time.monotonic()

    def step(msg: str) -> None:
        if not quiet:
            print(f"[{time.monotonic() - start:5.1f}s] {msg}", file=sys.stderr, flush=True)

    return step


def _json_file(path: Path | None, flag: str) -> Any:
    """The JSON document an option names (None when not given); ValueError naming the option when unreadable."""
    if path is None:
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{flag} {path}: {e}") from None


def main(argv: list[str] | None = None) -> int:
    """Validate, run the program under mocks, check policies and secrets, print and write the plan."""
    args = _parser().parse_args(argv)
    step = _progress(args.quiet)
    path = args.config or ROOT / f"Pulumi.{args.stack}.yaml"
    loaded = load_spec(path, None if args.config else args.stack)
    if loaded is None:
        return EXIT_INVALID
    stack, spec = loaded
    try:
        capacity = capacity_report(spec)
    except SpecError as err:  # a key the spec let through that planning cannot use: still the config's fault
        say_invalid(path, err)
        return EXIT_INVALID
    try:
        policy_config = _json_file(args.policy_config, "--policy-config")
        against = _json_file(args.against, "--against")
    except ValueError as err:
        print(err, file=sys.stderr)
        return EXIT_INVALID
    step(f"stack {stack.name}: config valid ({len(spec.nodes)} nodes, {len(spec.pools)} pools)")

    try:
        run = run_main_program(stack.config, stack.secret_keys, stack=stack.name, preview=not args.up)
    except pulumi.RunError as err:  # what the program raises for a config it cannot deploy
        print(f"invalid stack config {path}:\n  {CREDENTIAL_SHAPES.sub(REDACTED, str(err))}", file=sys.stderr)
        return EXIT_INVALID
    except SpecError as err:  # raised by planning code inside the program, past the spec's checks
        say_invalid(path, err)
        return EXIT_INVALID
    except DuplicateUrnError as err:  # the engine would refuse the whole preview
        print(f"the program cannot be deployed from {path}:\n  {err}", file=sys.stderr)
        return EXIT_INVALID
    run = in_stable_order(run)
    redactor = Redactor(run.registrations)
    step(f"program registered {len(run.registrations)} resources")

    # The stack's secrets, and (with --up) the keys and passwords the program has the hosts make.
    secrets = {**stack.secret_values, **run.generated_secrets()}
    leaks = find_leaks(run.registrations, secrets) + unmarked_outputs(run)
    files = {rel: redactor.text(text) for rel, text in artifacts_of(run).items()}
    leaked_files = sorted(rel for rel, text in files.items() if text_leaks(text, secrets))
    if leaks or leaked_files:
        # Nothing is written: the plan's files would carry the secret too.
        print(
            "refusing to write the plan: secret config values appear in plaintext (keep them Outputs from "
            "pulumi.Config().require_secret; never .apply() them into plain strings):",
            file=sys.stderr,
        )
        for leak in leaks:
            print(f"  {leak.secret_key}: {leak.urn} at {leak.path}", file=sys.stderr)
        for rel in leaked_files:
            print(f"  in the generated file {rel}", file=sys.stderr)
        return EXIT_VIOLATION

    try:
        violations = analyze(run.registrations, policy_config)
    except PolicyConfigError as err:
        print(f"--policy-config {args.policy_config}: {err}", file=sys.stderr)
        return EXIT_INVALID
    # Messages may quote what they refuse; cleaned before anything wraps or copies them.
    violations = [dataclasses.replace(v, message=redactor.text(v.message)) for v in violations]
    step(f"policy pack: {len(violations)} violation(s)")

    out_dir = args.out / stack.name
    previous = previous_plan(out_dir)
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    previous_path = keep_previous(out_dir, previous)
    result = PlanResult(
        stack.name,
        str(path),
        not args.up,
        spec,
        run,
        violations,
        capacity,
        redactions=[str(r) for r in redactor.redactions],
    )
    result.artifacts = write_artifacts(files, out_dir)
    result.artifacts += [str(p.relative_to(out_dir)) for p in write_graph(component_graph(run.registrations), out_dir)]
    if against is None and previous is not None:
        against, args.against = parse_plan(previous), previous_path
    # Against the plan as written (redacted), as the previous one was.
    result.diff = plan_diff(
        against, redactor.data(plan_json(result)), spec, str(args.against) if args.against else None
    )
    text = redactor.text(render_text(result))
    data = redactor.data(plan_json(result))
    doc = json.dumps(data, indent=2, sort_keys=False)
    # Built from the redacted plan.json: they say nothing it does not.
    verdicts = {
        "sarif": json.dumps(sarif(data, path, repo_uri(path, ROOT)), indent=2) + "\n"
        if args.sarif or args.format == "sarif"
        else "",
        "junit": junit(data, path, configured_levels(policy_config)) if args.junit or args.format == "junit" else "",
    }
    leaked = text_leaks(text + doc + "".join(verdicts.values()), secrets) + redactor.leftovers(
        [text, doc, *verdicts.values()]
    )
    if leaked:  # belt and braces: the report itself must never carry a secret
        shutil.rmtree(out_dir, ignore_errors=True)
        print(f"refusing to write the plan: it would contain the secret(s) {', '.join(leaked)}", file=sys.stderr)
        return EXIT_VIOLATION
    (out_dir / "plan.json").write_text(doc)
    (out_dir / "plan.txt").write_text(text)
    for option, name in ((args.sarif, "sarif"), (args.junit, "junit")):
        if option is not None:
            write_text(option, verdicts[name])
    shown = {"text": text if not args.quiet else text.splitlines()[-1].strip(), "json": doc, **verdicts}
    emit(shown[args.format])
    step(f"wrote {out_dir / 'plan.json'}, plan.txt, {len(result.artifacts)} artifacts")
    return EXIT_VIOLATION if result.mandatory else EXIT_OK


if __name__ == "__main__":
    run_cli(main)
