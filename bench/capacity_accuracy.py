"""Capacity estimator vs real vLLM start-up logs: weights and KV tokens per log, errors and medians.

Run: .venv/bin/python bench/capacity_accuracy.py   (figures only; tests/test_capacity.py asserts them)
"""
from __future__ import annotations

import json
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from components.facts.models import ModelArch, arch_from_config_json, model_arch  # noqa: E402
from components.planning.capacity import CapacityEstimate, estimate  # noqa: E402
from plan.cli import run as run_cli  # noqa: E402

LOG_DIR = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "vllm-startup-logs"
# vLLM writes "GB" in older messages but divides by 2**30, so every figure here is GiB.
_WEIGHTS = [re.compile(r"model weights take\s+([\d.]+)\s*GiB"),
            re.compile(r"(?:Loading model weights took|Model loading took)\s+([\d.]+)\s*Gi?B")]
_BLOCKS = re.compile(r"# (?:cuda|CUDA|GPU) blocks: (\d+)")
_V1_TOKENS = re.compile(r"GPU KV cache size: ([\d,]+) tokens")
_TOTAL = re.compile(r"total_gpu_memory\s*\(?\s*([\d.]+)\s*GiB")
LOG_BLOCK_SIZE = 16  # every collected log runs vLLM's default block size


@dataclass(frozen=True)
class LogCase:
    """One collected start-up log: its settings, the logged figures, and the source it came from."""

    name: str
    source: str
    arch: ModelArch
    settings: dict[str, object]
    logged_weights_gib: float
    logged_kv_tokens: int | None  # None: the log cannot be compared for KV (weights only)


def _header(lines: list[str], key: str) -> str | None:
    prefix = f"# {key}: "
    return next((ln[len(prefix):] for ln in lines if ln.startswith(prefix)), None)


def load_case(path: Path) -> LogCase:
    """Parse one fixture: `# source/config|catalog/case` headers, then the exact log lines."""
    lines = path.read_text().splitlines()
    text = "\n".join(ln for ln in lines if not ln.startswith("# "))
    config, catalog = _header(lines, "config"), _header(lines, "catalog")
    arch = model_arch(catalog) if catalog else arch_from_config_json(json.loads(config or "{}"), path.stem)
    settings = json.loads(_header(lines, "case") or "{}")
    weights = next(float(m.group(1)) for rx in _WEIGHTS if (m := rx.search(text)))
    kv: int | None = None
    if _TOTAL.search(text):  # only logs that state the GPU memory can be compared for KV
        if m := _BLOCKS.search(text):
            kv = int(m.group(1)) * LOG_BLOCK_SIZE
        elif m := _V1_TOKENS.search(text):
            kv = int(m.group(1).replace(",", ""))
        elif "derived_kv_tokens" in settings:
            kv = int(settings["derived_kv_tokens"])  # type: ignore[arg-type]
    return LogCase(path.name, _header(lines, "source") or "", arch, settings, weights, kv)


def load_cases() -> list[LogCase]:
    """Every collected log, sorted by file name."""
    return [load_case(p) for p in sorted(LOG_DIR.glob("*.log"))]


def estimate_case(case: LogCase) -> CapacityEstimate:
    """The planner's estimate for the settings the log ran with."""
    s = {k: v for k, v in case.settings.items() if k != "derived_kv_tokens"}
    return estimate(case.arch, **s)  # type: ignore[arg-type]


def error_pct(estimated: float, logged: float) -> float:
    """Signed error of an estimate, in percent of the logged value."""
    return (estimated - logged) / logged * 100


def main() -> None:
    """Print the comparison table and the medians."""
    w_errs, kv_errs = [], []
    print(f"{'log':<80} {'weights GiB est/log':>20} {'err%':>7} {'KV tokens est/log':>22} {'err%':>7}")
    for case in load_cases():
        est = estimate_case(case)
        w = error_pct(est.weights_gib_per_gpu, case.logged_weights_gib)
        w_errs.append(abs(w))
        kv_col, kv_err = "-", ""
        if case.logged_kv_tokens:
            e = error_pct(est.kv_tokens, case.logged_kv_tokens)
            kv_errs.append(abs(e))
            kv_col, kv_err = f"{est.kv_tokens}/{case.logged_kv_tokens}", f"{e:+.1f}"
        elif case.logged_kv_tokens == 0:
            kv_col, kv_err = f"{est.kv_tokens}/0", "fits" if est.fits else "no-fit ok"
        print(f"{case.name[:80]:<80} {est.weights_gib_per_gpu:9.2f}/{case.logged_weights_gib:<9.2f} "
              f"{w:+7.1f} {kv_col:>22} {kv_err:>7}")
    print(f"median |error|: weights {statistics.median(w_errs):.1f} % over {len(w_errs)} logs; "
          f"KV tokens {statistics.median(kv_errs):.1f} % over {len(kv_errs)} logs")


if __name__ == "__main__":
    run_cli(main)
