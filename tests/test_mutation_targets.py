"""`make mutation` plants each known bug by one exact text replacement: a refactor that moves or reformats the
text leaves the mutant stale, and the bug unchecked. Each must still apply exactly once, to tests that exist."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.checks import mutation

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("mutant", mutation.MUTANTS, ids=[m.name for m in mutation.MUTANTS])
def test_each_mutant_applies_once_to_tests_that_exist(mutant: mutation.Mutant) -> None:
    text = (ROOT / mutant.path).read_text()
    assert text.count(mutant.old) == 1, f"{mutant.name}: its text is in {mutant.path} {text.count(mutant.old)} times"
    assert mutant.new != mutant.old
    for test in mutant.tests:
        assert (ROOT / test.split("::")[0]).is_file(), f"{mutant.name}: {test} does not exist"


def test_mutant_names_are_unique() -> None:
    names = [m.name for m in mutation.MUTANTS]
    assert len(names) == len(set(names))


# --- mutmut (make mutation MODULE=…, make mutation-sweep) ----------------------------------------------


def test_every_module_of_the_sweep_exists_and_has_tests_to_select_from() -> None:
    from tests.checks.mutmut_module import SWEEP, tests_naming

    assert SWEEP[:2] == ["plan/redact.py", "plan/diff.py"]
    for module in SWEEP:
        assert (ROOT / module).is_file(), module
        assert tests_naming(module), f"{module}: no test file names it, its package or the policy pack"


def test_the_sweep_takes_every_module_once_in_the_issues_order() -> None:
    from tests.checks.mutmut_module import SWEEP

    assert len(SWEEP) == len(set(SWEEP))
    # Every product module of the areas the issue names, the engines' hand-run tools/ dump scripts aside.
    areas = ["components/planning/gateway", "components/spec", "policies/rules", "components/engines"]
    wanted = {
        str(p.relative_to(ROOT)) for area in areas for p in (ROOT / area).rglob("*.py") if "/tools/" not in str(p)
    }
    assert set(SWEEP) == {"plan/redact.py", "plan/diff.py"} | wanted
    # Redaction, the plan diff, the gateway's Python, spec, policies, engines: each area after the one before.
    rank = [next((i for i, a in enumerate(areas) if m.startswith(a + "/")), -1) for m in SWEEP[2:]]
    assert rank == sorted(rank) and -1 not in rank
    # Of the engines, each one's options and argv builders first.
    engines = [m for m in SWEEP if m.startswith("components/engines/")]
    firsts = len([m for m in engines if m.endswith(("/options.py", "/engine.py")) and m.count("/") == 3])
    assert firsts == 6
    assert all(m.endswith("/options.py") for m in engines[:3]) and all(m.endswith("/engine.py") for m in engines[3:6])
    assert "components/engines/gate.py" in engines[6:] and "components/engines/vllm/rules/hardware.py" in engines[6:]


def test_tests_are_chosen_by_the_module_they_import() -> None:
    from tests.checks.mutmut_module import dotted, tests_naming

    assert dotted("components/spec/__init__.py") == "components.spec"
    assert dotted("plan/redact.py") == "plan.redact"
    assert tests_naming("plan/redact.py") == ["tests/test_credential_tables.py", "tests/test_plan_redaction.py"]
    # components.spec re-exports its modules: a module no test imports by name takes the files importing the
    # package; one a table imports by name takes those files only (make mutation's TESTS adds the others).
    assert "tests/test_spec.py" in tests_naming("components/spec/gateway.py")
    assert tests_naming("components/spec/cluster.py") == ["tests/test_spec_cluster_table.py"]
    assert "tests/test_policies_rules.py" in tests_naming("policies/rules/capacity.py")


def test_each_equivalent_mutant_names_its_line_and_why() -> None:
    from tests.checks.mutmut_equivalents import EQUIVALENT

    for name, (line, why) in EQUIVALENT.items():
        assert re.fullmatch(r"[a-z_.]+\.x\S*__mutmut_\d+", name), name
        assert line.strip() == line and line and len(why) > 20, name


def test_mutmut_copies_what_the_tests_read() -> None:
    import tomllib

    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]
    assert conf["source_paths"] == ["components", "policies", "plan"]
    for path in conf["also_copy"]:
        assert (ROOT / path).exists(), path
    # Every tracked top-level entry (what a clone has) is copied, mutated, or mutmut's own.
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    top = {line.split("/", 1)[0] for line in listed.splitlines()} - {".gitignore"}
    assert top <= {*conf["source_paths"], *conf["also_copy"], "tests", "pyproject.toml"}, top


# Lua handlers nginx calls that have no planted bug yet: this list only shrinks (a handler given one must
# leave it, and a new handler must come with one).
LUA_HANDLERS_WITHOUT_PLANTED_BUGS = {
    "gateway_affinity.done",
    "gateway_metrics.count_route",
    "gateway_metrics.serve",
}


def test_each_lua_handler_nginx_calls_has_a_planted_bug() -> None:
    """The planted Lua bugs, per handler: each handler function nginx.conf calls (package.loaded.M.f) holds
    the text of at least one mutant (the function its replaced text lies in)."""
    nginx = (ROOT / "components/planning/gateway/nginx.py").read_text()
    handlers = set(re.findall(r"package\.loaded\.(\w+\.\w+)", nginx))
    planted = set()
    for m in mutation.MUTANTS:
        if m.path.endswith(".lua"):
            text = (ROOT / m.path).read_text()
            at = text.index(m.old)
            starts = [x for x in re.finditer(r"^(?:local )?function ([\w.]+)", text, re.M) if x.start() < at]
            if starts and starts[-1].group(1).startswith("M."):
                planted.add(f"{Path(m.path).stem}.{starts[-1].group(1)[2:]}")
    assert handlers - planted == LUA_HANDLERS_WITHOUT_PLANTED_BUGS
