"""Mutation testing of one product module with mutmut (pinned in requirements-test.txt), then its score.

    .venv/bin/python tests/checks/mutmut_module.py plan/redact.py            # the tests that import it
    .venv/bin/python tests/checks/mutmut_module.py plan/diff.py --tests tests/test_plan_diff.py
    .venv/bin/python tests/checks/mutmut_module.py --sweep                    # every module of SWEEP

mutmut (configured in pyproject.toml's [tool.mutmut]) copies the tree into mutants/, rewrites every
function of the module into its mutants (the rest of the product runs as written), runs the chosen tests once to record which tests
reach which function, then per mutant runs only those tests. The chosen tests are the fast-tier files
that name the module (its dotted name or a `from <package> import <module>`), or --tests: a module's run
then takes minutes, not the whole suite per mutant.

Each survivor is either a missing test (write it), dead code (remove it) or an equivalent mutant: those
are listed in tests/checks/mutmut_equivalents.py with the line the mutant writes and why it cannot be
told apart; an entry whose mutant no longer writes that line is reported stale. The score is
killed / (mutants - equivalents); the exit status is 1 when a survivor is left untriaged.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import sys
from datetime import UTC, datetime
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.checks.mutmut_equivalents import EQUIVALENT  # noqa: E402

# `make mutation-sweep`: the product's modules in the order the issue ranks them (redaction, the plan
# diff, the gateway's Python, spec, policies, engines); of the engines, each one's options and argv
# builders first, then every other module of components/engines but the tools/ dump scripts (run by hand
# on an unpacked wheel or a build's --help to write data/, never imported by the program).
_ENGINES_FIRST = [
    *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "components/engines").glob("*/options.py")),
    *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "components/engines").glob("*/engine.py")),
]
SWEEP = [
    "plan/redact.py",
    "plan/diff.py",
    *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "components/planning/gateway").glob("*.py")),
    *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "components/spec").glob("*.py")),
    *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "policies/rules").glob("*.py")),
    *_ENGINES_FIRST,
    *sorted(
        m
        for m in (str(p.relative_to(ROOT)) for p in (ROOT / "components/engines").rglob("*.py"))
        if m not in _ENGINES_FIRST and "/tools/" not in m
    ),
]
# The fast tier: realtool and lab tests start servers and namespaces (mutmut forks per mutant).
FAST = ["-m", "not realtool and not lab"]
# How much longer a timed-out mutant's second run may take than its first.
RETRY_LIMIT_FACTOR = 4


def dotted(module: str) -> str:
    name = module.removesuffix(".py").replace("/", ".")
    return name.removesuffix(".__init__")


def tests_naming(module: str) -> list[str]:
    """The test files that import the module by name; else those importing its package (components.spec
    re-exports its modules' names); for a policy rule, else those importing the pack."""
    name = dotted(module)
    package, _, leaf = name.rpartition(".")
    imports = f"from {package} import"
    # Each pattern with the words a file must hold for it to match: a cheap test before the regex (the sweep
    # asks this of every test file for each of its modules).
    patterns = [
        (re.compile(rf"\b{re.escape(name)}\b|{re.escape(imports)} [^\n]*\b{re.escape(leaf)}\b"), (name, imports)),
        (re.compile(re.escape(imports)), (imports,)),
        # The policy rules are reached through the pack that lists them (and the tests' helpers that run it).
        (
            re.compile(r"from (policies\.pack|tests\.support\.policies) import"),
            ("from policies.pack import", "from tests.support.policies import"),
        )
        if name.startswith("policies.")
        else None,
    ]
    for pattern, words in filter(None, patterns):
        found = sorted(
            path for path, text in _test_files().items() if any(w in text for w in words) and pattern.search(text)
        )
        if found:
            return found
    return []


@cache
def _test_files() -> dict[str, str]:
    """Every test file's text by its path (but this tool's own tests), read once per process."""
    return {
        str(p.relative_to(ROOT)): p.read_text()
        for p in (ROOT / "tests").rglob("test_*.py")
        if p.name != "test_mutation_targets.py"
    }


def run_mutmut(module: str, tests: list[str], functions: list[str], isolation: str = "fork") -> None:
    """mutmut's run over the module's mutants, its stats taken from `tests` only (in this process: mutmut
    reads its settings once, and the test selection is per module)."""
    from mutmut.__main__ import cli
    from mutmut.configuration import ProcessIsolation, config
    from mutmut.stats import status_by_exit_code

    config().pytest_add_cli_args_test_selection = [*FAST, *tests]
    # forkserver: each mutant's process forked from one that imported only pytest (for tests whose
    # setup is not safe to fork from mutmut's own process).
    config().process_isolation = ProcessIsolation(isolation)
    # Only this module is mutated: every other product file runs as written (mutmut copies it plain),
    # without mutmut's trampoline on each call (over the whole product the plan tests crawled).
    config().only_mutate = [module]
    fresh_copy(module)
    mutmut_run(cli, str(os.cpu_count() or 2), names(module, functions))
    # mutmut's wall-clock limit is (the tests' measured time + 1 s) x 15: on a machine others load, a mutant
    # whose tests pass or fail in seconds alone can hit it and read as a timeout, not as killed. Each
    # timed-out mutant runs again, alone, with four times the limit; what times out then counts as not killed.
    timed_out = [k for k, c in exit_codes(module, functions).items() if status_by_exit_code[c] == "timeout"]
    if timed_out:
        config().timeout_multiplier *= RETRY_LIMIT_FACTOR
        mutmut_run(cli, "1", timed_out)


def mutmut_run(cli: object, children: str, patterns: list[str]) -> None:
    try:
        cli.main(["run", "--max-children", children, *patterns], standalone_mode=False)  # type: ignore[attr-defined]
    except SystemExit as e:
        if e.code:
            raise


def names(module: str, functions: list[str]) -> list[str]:
    """mutmut's name patterns for the module's mutants, or for those of the named functions only."""
    if not functions:
        return [dotted(module) + ".*"]
    # mutmut's names: x_<function>, xǁ<Class>ǁ<method>.
    return [f"{dotted(module)}.x{'ǁ' + f.replace('.', 'ǁ') if '.' in f else '_' + f}__mutmut_*" for f in functions]


def fresh_copy(module: str) -> None:
    """Make mutmut mutate `module` again when an earlier run of another module left a plain copy of it in
    mutants/ (mutmut copies the files it does not mutate with a new mtime, which it reads as mutated)."""
    copy = ROOT / "mutants" / module
    if copy.exists() and "mutmut" not in copy.read_text():
        copy.unlink()


def mutant_line(name: str, module: str) -> str:
    """The first line the mutant adds (its diff's + line), to check an equivalent entry still fits."""
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    diff = get_diff_for_mutant(name, path=module)
    return next(
        (line[1:].strip() for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")), ""
    )


def exit_codes(module: str, functions: list[str]) -> dict[str, int | None]:
    """mutmut's exit code of each chosen mutant of the module (None: not run)."""
    meta = json.loads((ROOT / "mutants" / (module + ".meta")).read_text())
    chosen = names(module, functions)
    return {k: c for k, c in meta["exit_code_by_key"].items() if any(fnmatch.fnmatchcase(k, p) for p in chosen)}


def score(module: str, functions: list[str]) -> dict[str, object]:
    codes = exit_codes(module, functions)
    killed = [k for k, c in codes.items() if c in (1, 3)]
    survived = [k for k, c in codes.items() if c not in (1, 3)]
    equivalent, stale = [], []
    for k in list(survived):
        if k in EQUIVALENT:
            line, _why = EQUIVALENT[k]
            (equivalent if mutant_line(k, module) == line else stale).append(k)
    left = [k for k in survived if k not in equivalent]
    counted = len(codes) - len(equivalent)
    return {
        "module": module,
        "mutants": len(codes),
        "killed": len(killed),
        "equivalent": len(equivalent),
        "survived": len(left),
        "score": round(100 * len(killed) / counted, 1) if counted else 100.0,
        "survivors": {k: codes[k] for k in left},
        "stale_equivalents": stale,
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*", help="product modules, as paths (plan/redact.py)")
    parser.add_argument("--tests", nargs="+", help="test files to select from (default: those naming the module)")
    parser.add_argument("--sweep", action="store_true", help="every module of SWEEP")
    parser.add_argument(
        "--functions", nargs="+", default=[], help="only these functions' mutants (diff_resources, Class.method)"
    )
    parser.add_argument(
        "--isolation", choices=["fork", "forkserver"], default="fork", help="mutmut's process_isolation"
    )
    parser.add_argument("--score-only", action="store_true", help="print the score of the last run, run nothing")
    args = parser.parse_args(argv)
    modules = SWEEP if args.sweep else args.modules
    if not modules:
        parser.error("name a module (plan/redact.py) or --sweep")
    os.chdir(ROOT)
    from mutmut.stats import status_by_exit_code

    untriaged = 0
    for module in modules:
        if not (ROOT / module).is_file():
            parser.error(f"{module}: no such file")
        tests = args.tests or tests_naming(module)
        if not args.score_only:
            if not tests:
                print(f"{module}: no test file names it; give --tests", file=sys.stderr)
                return 2
            run_mutmut(module, tests, args.functions, args.isolation)
        result = score(module, args.functions)
        untriaged += int(result["survived"]) + len(result["stale_equivalents"])  # type: ignore[arg-type]
        print(
            f"{module}: {result['mutants']} mutants, {result['killed']} killed, {result['equivalent']} equivalent, "
            f"{result['survived']} survived: {result['score']} % ({datetime.now(UTC):%Y-%m-%d}; tests: {' '.join(tests)}"
            + (f"; functions: {' '.join(args.functions)}" if args.functions else "")
            + ")"
        )
        for name, code in result["survivors"].items():  # type: ignore[union-attr]
            said = "timed out twice" if status_by_exit_code[code] == "timeout" else "survived"
            print(f"  {said} ({code}): {name}  [{mutant_line(name, module)}]")
        for name in result["stale_equivalents"]:  # type: ignore[union-attr]
            print(f"  stale equivalent entry: {name} no longer writes its line")
    return 1 if untriaged else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
