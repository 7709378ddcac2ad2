"""Capacity estimator vs real vLLM start-up logs: weights, non-torch memory and KV tokens per log, the
medians and the worst optimistic KV error; then the V1-engine logs (vLLM 0.10 and later) on their own, the
errors per class (engine line, TP, model kind); then the other engines' logs (llama.cpp's KV buffer, TurboMind's
KV blocks), one summary line per engine; and last one line for scripts.

Run: .venv/bin/python -m bench.capacity_accuracy   (figures only; tests/test_capacity.py asserts them)
"""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass
from pathlib import Path

from components.engines.estimate import GIB, EngineEstimate, pool_kind
from components.engines.llamacpp import engine as llamacpp
from components.engines.lmdeploy import engine as lmdeploy
from components.engines.vllm.memory import CapacityEstimate, estimate, kv_estimate_error
from components.facts.hardware import gpu
from components.facts.models import ModelArch, arch_from_config_json, model_arch
from plan.cli import run as run_cli

LOG_DIR = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "vllm-startup-logs"
# The other engines' logs, `<engine>.<...>.log` (SOURCES.md there).
ENGINE_LOG_DIR = LOG_DIR.parent / "engine-startup-logs"
# vLLM writes "GB" in older messages but divides by 2**30, so every figure here is GiB.
_WEIGHTS = [
    re.compile(r"model weights take\s+([\d.]+)\s*GiB"),
    re.compile(r"(?:Loading model weights took|Model loading took)\s+([\d.]+)\s*Gi?B"),
]
_BLOCKS = re.compile(r"# (?:cuda|CUDA|GPU) blocks: (\d+)")
_V1_TOKENS = re.compile(r"GPU KV cache size: ([\d,]+) tokens")
_TOTAL = re.compile(r"total_gpu_memory\s*\(?\s*([\d.]+)\s*GiB")
# The profiler's own breakdown, where the log states it (V0 and V1 up to 0.10 print it at INFO).
_NON_TORCH = re.compile(r"non_torch_memory(?: takes)?\s+([\d.]+)\s*GiB")
_ACTIVATION = re.compile(r"PyTorch activation peak memory(?: takes)?\s+([\d.]+)\s*GiB")
# V1 prints the KV budget it found at INFO (gpu_worker.py, "Available KV cache memory: 5.01 GiB").
_V1_KV_GIB = re.compile(r"Available KV cache memory:\s+(-?[\d.]+)\s*GiB")
LOG_BLOCK_SIZE = 16  # every collected log runs vLLM's default block size
# Case keys that describe the log rather than the estimator's inputs.
# engine: "v0" or "v1" (else read from the file name); vllm: the version the log prints; kv_compared: the
# KV figures are compared although the log does not print the GPU's total memory (the case states it).
# gpu: a GPU of components/facts/hardware.py, whose memory as the planner sees it (and peer-to-peer NVLink) the
# case then takes, as `make plan` would, where the log does not print what torch sees.
_LOG_KEYS = ("derived_kv_tokens", "logged_stage", "engine", "vllm", "kv_compared", "gpu")


@dataclass(frozen=True)
class LogCase:
    """One collected start-up log: its settings, the logged figures, and the source it came from."""

    name: str
    source: str
    arch: ModelArch
    settings: dict[str, object]
    logged_weights_gib: float
    logged_kv_tokens: int | None  # None: the log cannot be compared for KV (weights only)
    logged_non_torch_gib: float | None = None  # the profiler's non-torch figure (first line: the logging rank)
    logged_activation_gib: float | None = None
    logged_stage: int | None = None  # the pipeline stage of the rank whose weights the log states (None: worst)
    logged_kv_gib: float | None = None  # V1's "Available KV cache memory" (GiB per GPU)

    @property
    def engine(self) -> str:
        """The engine line that wrote the log: "v1" or "v0" (the case's `engine`, else the file name)."""
        return str(self.settings.get("engine") or ("v1" if "-v1." in self.name else "v0"))

    @property
    def tp_class(self) -> str:
        return "tp1" if int(self.settings["tp"]) == 1 else "tp>=2"  # type: ignore[call-overload]

    @property
    def kind(self) -> str:
        """dense, moe or mla (MLA first: DeepSeek's MoE models are classed by their attention)."""
        return "mla" if self.arch.uses_mla else "moe" if self.arch.is_moe else "dense"


def _header(lines: list[str], key: str) -> str | None:
    prefix = f"# {key}: "
    return next((ln[len(prefix) :] for ln in lines if ln.startswith(prefix)), None)


def load_case(path: Path) -> LogCase:
    """Parse one fixture: `# source/config|catalog/case` headers, then the exact log lines."""
    lines = path.read_text().splitlines()
    text = "\n".join(ln for ln in lines if not ln.startswith("# "))
    config, catalog = _header(lines, "config"), _header(lines, "catalog")
    arch = model_arch(catalog) if catalog else arch_from_config_json(json.loads(config or "{}"), path.stem)
    settings = json.loads(_header(lines, "case") or "{}")
    weights = next(float(m.group(1)) for rx in _WEIGHTS if (m := rx.search(text)))
    kv: int | None = None
    if _TOTAL.search(text) or settings.get("kv_compared"):  # the GPU memory must be known to compare KV
        if m := _BLOCKS.search(text):
            kv = int(m.group(1)) * LOG_BLOCK_SIZE
        elif v1_tokens := _V1_TOKENS.findall(text):
            # vLLM 0.10.0 prints one line per TP rank, then gives every rank the fewest blocks of any
            # (kv_cache_utils.unify_kv_cache_configs), so the smallest figure is the one the engine runs with.
            kv = min(int(t.replace(",", "")) for t in v1_tokens)
        elif "derived_kv_tokens" in settings:
            kv = int(settings["derived_kv_tokens"])  # type: ignore[arg-type]
    non_torch, activation = (float(m.group(1)) if (m := rx.search(text)) else None for rx in (_NON_TORCH, _ACTIVATION))
    stage = settings.get("logged_stage")
    kv_gib = min((float(g) for g in _V1_KV_GIB.findall(text)), default=None)  # the fullest rank, as above
    return LogCase(
        path.name,
        _header(lines, "source") or "",
        arch,
        settings,
        weights,
        kv,
        non_torch,
        activation,
        int(stage) if stage is not None else None,
        kv_gib,
    )  # type: ignore[call-overload]


def load_cases() -> list[LogCase]:
    """Every collected log, sorted by file name."""
    return [load_case(p) for p in sorted(LOG_DIR.glob("*.log"))]


def estimate_case(case: LogCase) -> CapacityEstimate:
    """The planner's estimate for the settings the log ran with."""
    s = {k: v for k, v in case.settings.items() if k not in _LOG_KEYS}
    s.setdefault("v1_engine", case.engine == "v1")  # the log's engine line picks its terms
    if name := case.settings.get("gpu"):
        g = gpu(str(name))
        s.update(gpu_memory_gib=g.visible_memory_gib, gpu_name=g.name, nvls=g.nvls)
        s.setdefault("p2p", g.nvlink)
    return estimate(case.arch, **s)  # type: ignore[arg-type]


def estimated_weights_gib(case: LogCase, est: CapacityEstimate) -> float:
    """The estimate for the GPU whose weights the log states: its stage, else the fullest GPU."""
    if case.logged_stage is None:
        return est.weights_gib_per_gpu
    return est.weights_gib_per_stage[case.logged_stage]


def error_pct(estimated: float, logged: float) -> float:
    """Signed error of an estimate, in percent of the logged value (positive: optimistic for KV tokens)."""
    return (estimated - logged) / logged * 100


@dataclass(frozen=True)
class Summary:
    """The figures over all logs: signed errors per log, and the headline numbers."""

    weights: list[float]
    kv_tokens: list[float]
    non_torch: list[tuple[str, float, float]]  # (log, estimated, logged) GiB

    @property
    def kv_median_abs(self) -> float:
        return statistics.median(abs(e) for e in self.kv_tokens)

    @property
    def kv_worst_optimistic(self) -> float:
        """The largest overestimate of KV tokens (the risky side of a fit check), 0 when none."""
        return max([0.0, *self.kv_tokens])


def summarise(cases: list[LogCase]) -> Summary:
    """Signed errors of every comparable figure in every log."""
    w, kv, nt = [], [], []
    for case in cases:
        est = estimate_case(case)
        w.append(error_pct(estimated_weights_gib(case, est), case.logged_weights_gib))
        if case.logged_kv_tokens:
            kv.append(error_pct(est.kv_tokens, case.logged_kv_tokens))
        if case.logged_non_torch_gib is not None:
            nt.append((case.name, est.non_torch_gib, case.logged_non_torch_gib))
    return Summary(w, kv, nt)


@dataclass(frozen=True)
class ClassSummary:
    """KV-token errors of the logs of one class (engine line, TP, or model kind)."""

    name: str
    errors: list[float]

    @property
    def median_abs(self) -> float:
        return statistics.median(abs(e) for e in self.errors)

    @property
    def worst_optimistic(self) -> float:
        return max([0.0, *self.errors])


def kv_error(case: LogCase) -> float | None:
    """Signed KV-token error of one log, None when the log cannot be compared for KV."""
    if not case.logged_kv_tokens:
        return None
    return error_pct(estimate_case(case).kv_tokens, case.logged_kv_tokens)


CLASSES = (
    ("engine", ("v0", "v1"), lambda c: c.engine),
    ("tp", ("tp1", "tp>=2"), lambda c: c.tp_class),
    ("kind", ("dense", "moe", "mla"), lambda c: c.kind),
)


def class_summaries(cases: list[LogCase]) -> list[ClassSummary]:
    """Per class (V0/V1, TP 1/TP >= 2, dense/MoE/MLA), the KV errors of its logs; classes without logs left out."""
    compared = [(c, e) for c in cases if (e := kv_error(c)) is not None]
    out = []
    for _, values, key in CLASSES:
        for value in values:
            errors = [e for c, e in compared if key(c) == value]
            if errors:
                out.append(ClassSummary(value, errors))
    return out


def pool_classes(cases: list[LogCase]) -> dict[tuple[str, str, str], list[float]]:
    """KV errors per pool class as the planner ranges a capacity (engine line, TP 1 or >= 2, kind together):
    what components/engines/vllm/memory.py's KV_ERROR_BY_CLASS must cover."""
    out: dict[tuple[str, str, str], list[float]] = {}
    for c in cases:
        if (e := kv_error(c)) is not None:
            out.setdefault((c.engine, c.tp_class, c.kind), []).append(e)
    return out


def print_pool_classes(cases: list[LogCase]) -> None:
    """Each pool class's logs, worst optimistic error and the range the planner gives it."""
    print()
    print(f"{'pool class':<22} {'logs':>5} {'worst optimistic%':>18} {'planned range%':>15}")
    for cls, errors in sorted(pool_classes(cases).items()):
        planned, how = kv_estimate_error(cls)
        print(f"{' · '.join(cls):<22} {len(errors):>5} {max([0.0, *errors]):>+18.1f} {planned * 100:>14.1f}  {how}")


def v1_line(cases: list[LogCase]) -> str:
    """The bench's last line, for scripts: V1 logs compared for KV, how many at TP >= 2, median and worst."""
    v1 = [(c, e) for c in cases if c.engine == "v1" and (e := kv_error(c)) is not None]
    errors = [e for _, e in v1]
    median = statistics.median(abs(e) for e in errors) if errors else 0.0
    worst = max([0.0, *errors])
    tp2 = sum(1 for c, _ in v1 if c.tp_class == "tp>=2")
    return f"v1 logs {len(v1)} (tp>=2 {tp2}): kv median {median:.1f}%, worst optimistic {worst:.1f}%"


def print_v1(cases: list[LogCase]) -> None:
    """The V1-engine logs on their own: weights, KV memory and KV tokens, estimated vs logged."""
    print()
    print(
        f"V1 engine logs: {'log':<66} {'weights est/log':>16} {'err%':>6} {'KV GiB est/log':>15} "
        f"{'KV tokens est/log':>22} {'err%':>6}"
    )
    for case in (c for c in cases if c.engine == "v1"):
        est = estimate_case(case)
        w_est = estimated_weights_gib(case, est)
        kv_gib = f"{est.kv_cache_gib_per_gpu:.2f}/{case.logged_kv_gib:.2f}" if case.logged_kv_gib is not None else "-"
        kv_col, kv_err = "-", ""
        if case.logged_kv_tokens:
            kv_col = f"{est.kv_tokens}/{case.logged_kv_tokens}"
            kv_err = f"{error_pct(est.kv_tokens, case.logged_kv_tokens):+.1f}"
        print(
            f"{case.name[:82]:<82} {w_est:7.2f}/{case.logged_weights_gib:<8.2f} "
            f"{error_pct(w_est, case.logged_weights_gib):+6.1f} {kv_gib:>15} {kv_col:>22} {kv_err:>6}"
        )


def print_classes(cases: list[LogCase]) -> None:
    """Median |error| and worst optimistic KV error per class."""
    print()
    print(f"{'class':<8} {'logs':>5} {'KV median |err|%':>17} {'worst optimistic%':>18}")
    for cls in class_summaries(cases):
        print(f"{cls.name:<8} {len(cls.errors):>5} {cls.median_abs:>17.1f} {cls.worst_optimistic:>+18.1f}")


# -- the other engines --------------------------------------------------------------------------------------

# llama.cpp prints each device's KV buffer (one line per cache: an SWA model has two), in MiB.
_KV_BUFFER = re.compile(r"(\w+) KV buffer size =\s+([\d.]+) MiB")
# Where a log names no GPU: llama.cpp's KV buffer does not depend on the GPU's memory, only the fit does.
_UNNAMED_GPU_GIB = 80.0
_MODEL_BUFFER = re.compile(r"(CUDA\d+) model buffer size =\s+([\d.]+) MiB")
# The engines the bench compares besides vLLM, and what their logs state.
ENGINES = ("llamacpp", "lmdeploy")


@dataclass(frozen=True)
class EngineLogCase:
    """One start-up log of an engine other than vLLM: its settings, the logged KV figure and its source."""

    name: str
    source: str
    engine: str
    arch: ModelArch
    settings: dict[str, object]
    logged_kv_mib: float  # llama.cpp: the fullest GPU's KV buffers together
    logged_weights_mib: float | None  # the fullest GPU's model buffer, where the log prints it

    @property
    def gpus(self) -> int:
        return int(self.settings.get("gpus", 1))  # type: ignore[call-overload]


def load_engine_case(path: Path) -> EngineLogCase:
    """Parse one fixture of tests/fixtures/engine-startup-logs: `# source/config/case` headers, then the lines."""
    lines = path.read_text().splitlines()
    text = "\n".join(ln for ln in lines if not ln.startswith("# "))
    settings = json.loads(_header(lines, "case") or "{}")
    per_device: dict[str, float] = {}
    for device, mib in _KV_BUFFER.findall(text):
        if device != "CPU":
            per_device[device] = per_device.get(device, 0.0) + float(mib)
    return EngineLogCase(
        path.name,
        _header(lines, "source") or "",
        str(settings["engine"]),
        arch_from_config_json(json.loads(_header(lines, "config") or "{}"), path.stem),
        settings,
        max(per_device.values()),
        max((float(m) for _, m in _MODEL_BUFFER.findall(text)), default=None),
    )


def load_engine_cases() -> list[EngineLogCase]:
    """Every other engine's log, sorted by file name."""
    return [load_engine_case(p) for p in sorted(ENGINE_LOG_DIR.glob("*.log"))]


def estimate_engine_case(case: EngineLogCase) -> EngineEstimate:
    """What the planner computes for the log's model and settings (llama.cpp: its estimate for the server)."""
    s = case.settings
    name = s.get("gpu")
    memory = gpu(str(name)).memory_gib if name else _UNNAMED_GPU_GIB
    file_gib = float(s.get("file_gib") or 0.0)  # type: ignore[arg-type]
    parallel = int(s["parallel"])  # type: ignore[call-overload]
    return llamacpp.llamacpp_estimate(
        llamacpp.shape_from_arch(case.arch, file_gib * GIB),
        memory,
        gpus=case.gpus,
        split_mode=str(s["split_mode"]),
        ctx_per_slot=int(s["n_ctx"]) // parallel,  # type: ignore[call-overload]
        parallel=parallel,
        cache_type=str(s["cache_type"]),
        flash_attention=bool(s["flash_attention"]),
    )


def engine_kv_error(case: EngineLogCase) -> float:
    """Signed error of the KV buffer estimate in percent of the estimate (positive: optimistic, the engine took
    more than planned), so that the estimate times (1 + error) covers the log."""
    planned = estimate_engine_case(case).kv_cache_gib_per_gpu * 1024
    return (case.logged_kv_mib - planned) / planned * 100


def engine_pool_classes(cases: list[EngineLogCase]) -> dict[tuple[str, str, str], list[float]]:
    """KV errors per pool class as each engine ranges a capacity: what its KV_ERROR_BY_CLASS must cover."""
    out: dict[tuple[str, str, str], list[float]] = {}
    for c in cases:
        cls = llamacpp.kv_error_class(pool_kind(uses_mla=c.arch.uses_mla, is_moe=c.arch.is_moe), c.gpus)
        out.setdefault(cls, []).append(engine_kv_error(c))
    return out


def engine_line(engine: str, cases: list[EngineLogCase]) -> str:
    """One engine's summary: logs compared, median |error| and worst optimistic error, and the range it plans."""
    errors = [engine_kv_error(c) for c in cases if c.engine == engine]
    if engine == "lmdeploy":
        error, _ = lmdeploy.kv_estimate_error(("turbomind", "tp1", "dense"))
        return (
            f"lmdeploy (TurboMind) logs {len(errors)}: no public log states its settings, GPU and block figures "
            f"(tests/fixtures/engine-startup-logs/SOURCES.md); planned range {error:.1%}, the widest measured"
        )
    median = statistics.median(abs(e) for e in errors) if errors else 0.0
    return f"{engine} logs {len(errors)}: kv buffer median {median:.1f}%, worst optimistic {max([0.0, *errors]):.1f}%"


def print_engines(cases: list[EngineLogCase]) -> None:
    """The other engines' logs: the KV figure per log, estimated vs logged, then each engine's summary line."""
    print()
    print(f"{'other engines: log':<78} {'KV MiB/GPU est/log':>20} {'err%':>7} {'weights GiB/GPU est/log':>24}")
    for case in cases:
        est = estimate_engine_case(case)
        kv = f"{est.kv_cache_gib_per_gpu * 1024:.0f}/{case.logged_kv_mib:.0f}"
        weights = "-"  # a log without the GGUF's size or its model buffer line is compared for KV only
        if case.settings.get("file_gib") and case.logged_weights_mib is not None:
            weights = f"{est.weights_gib_per_gpu:.2f}/{case.logged_weights_mib / 1024:.2f}"
        print(f"{case.name[:78]:<78} {kv:>20} {engine_kv_error(case):+7.1f} {weights:>24}")
    print()
    print(f"{'pool class':<30} {'logs':>5} {'worst optimistic%':>18} {'planned range%':>15}")
    for cls, errors in sorted(engine_pool_classes(cases).items()):
        planned, how = llamacpp.kv_estimate_error(cls)
        print(f"{' · '.join(cls):<30} {len(errors):>5} {max([0.0, *errors]):>+18.1f} {planned * 100:>14.1f}  {how}")
    for engine in ENGINES:
        print(engine_line(engine, cases))


def main() -> None:
    """Print the comparison table, the medians and the worst optimistic KV error, then the V1 logs, the
    classes and the line for scripts (last)."""
    cases = load_cases()
    print(
        f"{'log':<72} {'weights GiB est/log':>20} {'err%':>6} {'non-torch est/log':>18} "
        f"{'KV tokens est/log':>22} {'err%':>6}"
    )
    for case in cases:
        est = estimate_case(case)
        w_est = estimated_weights_gib(case, est)
        nt = (
            f"{est.non_torch_gib:.2f}/{case.logged_non_torch_gib:.2f}" if case.logged_non_torch_gib is not None else "-"
        )
        kv_col, kv_err = "-", ""
        if case.logged_kv_tokens:
            kv_col, kv_err = (
                f"{est.kv_tokens}/{case.logged_kv_tokens}",
                f"{error_pct(est.kv_tokens, case.logged_kv_tokens):+.1f}",
            )
        elif case.logged_kv_tokens == 0:
            kv_col, kv_err = f"{est.kv_tokens}/0", "fits" if est.fits else "no-fit ok"
        print(
            f"{case.name[:72]:<72} {w_est:9.2f}/{case.logged_weights_gib:<9.2f} "
            f"{error_pct(w_est, case.logged_weights_gib):+6.1f} {nt:>18} {kv_col:>22} {kv_err:>6}"
        )
    s = summarise(cases)
    print(f"weights: median |error| {statistics.median(abs(e) for e in s.weights):.1f} % over {len(s.weights)} logs")
    print(
        f"KV tokens: median |error| {s.kv_median_abs:.1f} % over {len(s.kv_tokens)} logs; worst optimistic "
        f"{s.kv_worst_optimistic:+.1f} %"
    )
    if s.non_torch:
        print("non-torch GiB est/log: " + ", ".join(f"{e:.2f}/{lg:.2f}" for _, e, lg in s.non_torch))
    print_v1(cases)
    print_classes(cases)
    print_pool_classes(cases)
    print_engines(load_engine_cases())
    print(v1_line(cases))


if __name__ == "__main__":
    run_cli(main)
