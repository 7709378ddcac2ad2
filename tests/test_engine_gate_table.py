"""The qualification gate's shared pieces (components/engines/gate.py) called at test time: each engine builds
its check program at import, out of mutmut's reach, so the program text is compared whole here and run with
python3; the Triton compile harness is driven by a stand-in `triton` that records what the harness asks of it
(the real Triton releases compile the gate's kernel in tests/test_qualification.py's real-tool tier)."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from components.engines import gate

# A parser as an engine writes it: indented in its source, a first line more indented than the rest (kept
# once dedented), a last line ending in X (no strip of anything but newlines).
PARSER = """
        import argparse
    parser = argparse.ArgumentParser(prog="srv")
    parser.add_argument("--n", type=int)
    X = 1; Y = X
"""


def test_argv_check_is_the_parser_indented_under_its_try_with_the_skip_in_place() -> None:
    assert gate.argv_check(PARSER, 3) == (
        "\n"
        'for argv in facts["argvs"]:\n'
        "    try:\n"
        "            import argparse\n"
        '        parser = argparse.ArgumentParser(prog="srv")\n'
        '        parser.add_argument("--n", type=int)\n'
        "        X = 1; Y = X\n"
        "        def error(message):\n"
        "            raise ValueError(message)\n"
        "        parser.error = error\n"
        "        parser.parse_args(argv[3:])\n"
        '        report("argv-parses", True, " ".join(argv[:3 + 1]) + " ... parses")\n'
        "    except SystemExit as e:\n"
        '        report("argv-parses", False, f"the image\'s parser exited ({e})", "fix the flags the plan named")\n'
        "    except Exception as e:\n"
        '        report("argv-parses", False, f"{type(e).__name__}: {e}", "the planned flags are not this image\'s: fix the "\n'
        '               "image tag, or the flag the message names")\n'
    )


def test_python_check_is_the_preamble_the_parts_in_order_and_the_exit() -> None:
    assert gate.python_check("A = 1\n", "B = 2\n") == gate.PREAMBLE + "A = 1\nB = 2\n" + gate.EXIT
    assert gate.python_check() == gate.PREAMBLE + "\nsys.exit(1 if failed else 0)\n"


def run_check(program: str, facts: dict[str, Any]) -> tuple[int, list[dict[str, Any]]]:
    out = subprocess.run(
        [sys.executable, "-c", program, json.dumps(facts)], capture_output=True, text=True, timeout=60, check=False
    )
    return out.returncode, [json.loads(line) for line in out.stdout.splitlines()]


PARSES = "import argparse\nparser = argparse.ArgumentParser(prog='srv')\nparser.add_argument('--n', type=int)"


def test_the_argv_check_program_parses_each_argv_past_its_skip_and_reports_each() -> None:
    program = gate.python_check(gate.argv_check(PARSES, 2))
    assert run_check(program, {"argvs": [["srv", "serve", "--n", "3"]]}) == (
        0,
        [{"check": "argv-parses", "ok": True, "detail": "srv serve --n ... parses"}],
    )
    code, lines = run_check(program, {"argvs": [["srv", "serve", "--n", "3"], ["srv", "serve", "--n", "x"]]})
    assert code == 1
    assert lines == [
        {"check": "argv-parses", "ok": True, "detail": "srv serve --n ... parses"},
        {
            "check": "argv-parses",
            "ok": False,
            "detail": "ValueError: argument --n: invalid int value: 'x'",
            "fix": "the planned flags are not this image's: fix the image tag, or the flag the message names",
        },
    ]


# --- the Triton compile harness, on a stand-in Triton -------------------------------------------------


class Recorder:
    """What the harness asked of the stand-in Triton."""

    def __init__(self, *, old_api: bool = False, error: Exception | None = None, ptx: str = "") -> None:
        self.old_api, self.error, self.ptx = old_api, error, ptx
        self.sources: list[dict[str, Any]] = []
        self.compiled: list[tuple[Any, Any]] = []


def stand_in_triton(monkeypatch: pytest.MonkeyPatch, rec: Recorder) -> None:
    triton = types.ModuleType("triton")
    triton.__version__ = "9.9.9"  # type: ignore[attr-defined]
    triton.jit = lambda fn: fn  # type: ignore[attr-defined]
    language = types.ModuleType("triton.language")
    language.constexpr = int  # type: ignore[attr-defined]
    triton.language = language  # type: ignore[attr-defined]
    backends, compiler_mod, compiler = (
        types.ModuleType(n) for n in ("triton.backends", "triton.backends.compiler", "triton.compiler")
    )

    class GPUTarget:
        def __init__(self, *args: Any) -> None:
            self.args = args

    class ASTSource:
        def __init__(self, **kwargs: Any) -> None:
            if rec.old_api and "constexprs" in kwargs:
                raise TypeError("ASTSource() got an unexpected keyword argument 'constexprs'")
            self.kwargs = kwargs
            rec.sources.append(kwargs)

    def compile_(source: Any, target: Any) -> Any:
        rec.compiled.append((source, target))
        if rec.error is not None:
            raise rec.error
        return types.SimpleNamespace(asm={"ptx": rec.ptx})

    compiler_mod.GPUTarget = GPUTarget  # type: ignore[attr-defined]
    compiler.ASTSource = ASTSource  # type: ignore[attr-defined]
    triton.compile = compile_  # type: ignore[attr-defined]
    for name, module in {
        "triton": triton,
        "triton.language": language,
        "triton.backends": backends,
        "triton.backends.compiler": compiler_mod,
        "triton.compiler": compiler,
    }.items():
        monkeypatch.setitem(sys.modules, name, module)


KERNEL = "def _matmulX_(a, b, BLOCK):\n    return 'kernel'\n"


def test_a_kernel_is_written_imported_and_compiled_for_the_capability(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    rec = Recorder(ptx="ld.global\nmma.sync.aligned.m16n8k16\n")
    stand_in_triton(monkeypatch, rec)
    got = gate.compile_kernel(
        KERNEL, "_matmulX_", {"a": "*fp16", "BLOCK": "constexpr"}, {"BLOCK": 16}, 75, str(tmp_path)
    )
    assert got == {"ok": True, "triton": "9.9.9", "tensor_cores": True, "error": ""}
    # The file is named after the function less its underscores, and imported under that name.
    assert [p.name for p in tmp_path.iterdir()] == ["llm_cluster_kernel_matmulX.py"]
    assert (tmp_path / "llm_cluster_kernel_matmulX.py").read_text() == KERNEL
    [source] = rec.sources
    assert source["fn"].__name__ == "_matmulX_" and source["fn"].__module__ == "llm_cluster_kernel_matmulX"
    assert source["fn"](1, 2, 3) == "kernel"
    assert {k: v for k, v in source.items() if k != "fn"} == {
        "signature": {"a": "*fp16", "BLOCK": "constexpr"},
        "constexprs": {"BLOCK": 16},
    }
    [(compiled, target)] = rec.compiled
    assert compiled.kwargs is source and target.args == ("cuda", 75, 32)


def test_without_mma_sync_in_the_ptx_there_are_no_tensor_cores(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    stand_in_triton(monkeypatch, Recorder(ptx="fma.rn.f32\nMMA.SYNC\n"))
    got = gate.compile_kernel(KERNEL, "_matmulX_", {"a": "*fp16"}, {}, 70, str(tmp_path))
    assert got == {"ok": True, "triton": "9.9.9", "tensor_cores": False, "error": ""}


def test_a_triton_before_3_3_gets_the_constexprs_as_constants_and_out_of_the_signature(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    rec = Recorder(old_api=True)
    stand_in_triton(monkeypatch, rec)
    got = gate.compile_kernel(
        KERNEL, "_matmulX_", {"a": "*fp16", "BLOCK": "constexpr"}, {"BLOCK": 16}, 70, str(tmp_path)
    )
    assert got == {"ok": True, "triton": "9.9.9", "tensor_cores": False, "error": ""}
    [source] = rec.sources
    assert source["fn"].__name__ == "_matmulX_"
    assert {k: v for k, v in source.items() if k != "fn"} == {"constants": {"BLOCK": 16}, "signature": {"a": "*fp16"}}
    [(compiled, target)] = rec.compiled
    assert compiled.kwargs is source and target.args == ("cuda", 70, 32)


@pytest.mark.parametrize(
    ("error", "said"),
    [
        (RuntimeError("\n  lowering\nPassManager::run failed\n  "), "PassManager::run failed"),
        (RuntimeError(""), "RuntimeError"),
    ],
)
def test_the_compilers_failure_is_its_last_line_or_its_type(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, error: Exception, said: str
) -> None:
    stand_in_triton(monkeypatch, Recorder(error=error, ptx="mma.sync"))
    got = gate.compile_kernel(KERNEL, "_matmulX_", {"a": "*fp16"}, {}, 70, str(tmp_path))
    assert got == {"ok": False, "triton": "9.9.9", "tensor_cores": False, "error": said}


def test_the_dot_kernel_is_compiled_as_the_gate_runs_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    rec = Recorder()
    stand_in_triton(monkeypatch, rec)
    assert gate.compile_dot_kernel(80, str(tmp_path)) == {
        "ok": True,
        "triton": "9.9.9",
        "tensor_cores": False,
        "error": "",
    }
    assert (tmp_path / "llm_cluster_kernel_dot16.py").read_text() == gate.TRITON_DOT_KERNEL
    [source] = rec.sources
    assert source["fn"].__name__ == "_dot16"
    assert {k: v for k, v in source.items() if k != "fn"} == {
        "signature": {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp32", "BLOCK": "constexpr"},
        "constexprs": {"BLOCK": 16},
    }
    assert rec.compiled[0][1].args == ("cuda", 80, 32)
