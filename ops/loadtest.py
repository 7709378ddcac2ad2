"""`python -m ops.loadtest` (`make loadtest STACK=prod [MODEL=… PARALLEL=64 NUMBER=512]`): the runbook's
load test, evalscope's `perf`, against the stack's gateway with a key, one run per model; reports
throughput, TTFT and TPOT p50/p99 per model as text and JSON (build/loadtest/<stack>/report.{txt,json}).

evalscope is an optional dependency: `make loadtest` installs it (requirements-loadtest.txt) into its
own venv, never into the planner's. Requests stream (TTFT needs it) a fixed prompt, so no dataset is
downloaded. The key comes from --key, else $LLM_CLUSTER_API_KEY, else `pulumi stack output
--show-secrets gatewayApiKeys` (the first key). Exit 0 when every model answered every request, 1 when
requests failed, 2 on bad input or when evalscope could not run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from components.spec import StackSpec
from ops.doctor import spec_from_args, stack_options
from plan.cli import run as run_cli

ROOT = Path(__file__).resolve().parent.parent

EXIT_OK, EXIT_FAILED, EXIT_INVALID = 0, 1, 2
PROMPT = "Write a short story of about 200 words about a lighthouse keeper who finds a message in a bottle."
# The figures reported, from evalscope's benchmark_summary.json (summary) and benchmark_percentile.json.
SUMMARY = {
    "requests": "Total Requests",
    "succeeded": "Success Requests",
    "failed": "Failed Requests",
    "duration_s": "Test Duration (s)",
    "request_throughput": "Req Throughput (req/s)",
    "output_tokens_per_s": "Output Throughput (tok/s)",
    "total_tokens_per_s": "Total Throughput (tok/s)",
}
PERCENTILE = {"ttft_ms": "TTFT (ms)", "tpot_ms": "TPOT (ms)", "latency_s": "Latency (s)"}


def gateway_url(spec: StackSpec) -> str:
    """The gateway's base URL from the stack (the `gatewayUrl` stack output is the same)."""
    g = spec.gateway
    assert g is not None  # main() refuses a stack without a gateway first
    return f"{'https' if g.tls else 'http'}://{spec.node(g.node).address}:{g.port}"


def default_models(spec: StackSpec) -> list[str]:
    """The first served name of every pool's model."""
    return list(dict.fromkeys(spec.served_names(p.model)[0] for p in spec.pools.values()))


def key_from_pulumi(stack: str) -> str | None:
    """The first gateway key from `pulumi stack output --show-secrets gatewayApiKeys`, when the CLI is there."""
    if shutil.which("pulumi") is None:
        return None
    p = subprocess.run(
        ["pulumi", "stack", "output", "--show-secrets", "--stack", stack, "gatewayApiKeys"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    try:
        keys = json.loads(p.stdout) if p.returncode == 0 else {}
    except ValueError:
        return None
    return next(iter(keys.values()), None) if isinstance(keys, dict) else None


def ca_from_pulumi(stack: str, out: Path) -> Path | None:
    """The private CA the gateway's certificate comes from (stack output gatewayCaCert), as a file."""
    if shutil.which("pulumi") is None:
        return None
    p = subprocess.run(
        ["pulumi", "stack", "output", "--stack", stack, "gatewayCaCert"], capture_output=True, text=True, cwd=ROOT
    )
    if p.returncode != 0 or "BEGIN CERTIFICATE" not in p.stdout:
        return None
    out.mkdir(parents=True, exist_ok=True)
    (out / "gateway-ca.pem").write_text(p.stdout)
    return out / "gateway-ca.pem"


def perf_argv(
    evalscope: str, url: str, model: str, key: str | None, parallel: int, number: int, max_tokens: int, out_dir: Path
) -> list[str]:
    """evalscope perf for one model (the runbook's `evalscope perf --url … --parallel 64 --number 512 --api openai`)."""
    argv = [
        evalscope,
        "perf",
        "--url",
        f"{url}/v1/chat/completions",
        "--api",
        "openai",
        "--model",
        model,
        "--parallel",
        str(parallel),
        "--number",
        str(number),
        "--prompt",
        PROMPT,
        "--max-tokens",
        str(max_tokens),
        "--stream",
        "--outputs-dir",
        str(out_dir),
        "--no-timestamp",
    ]
    if key:
        argv += ["--api-key", key]
    return argv


def _percentile(rows: list[dict[str, Any]], which: str, column: str) -> float | None:
    row = next((r for r in rows if r.get("Percentiles") == which), None)
    value = row.get(column) if row else None
    return float(value) if isinstance(value, (int, float)) else None


def parse_results(out_dir: Path) -> dict[str, Any]:
    """The figures of one evalscope perf run, from the JSON files it writes (wherever under out_dir)."""
    summaries = sorted(out_dir.rglob("benchmark_summary.json"))
    if not summaries:
        raise ValueError(f"evalscope wrote no benchmark_summary.json under {out_dir}")
    summary = json.loads(summaries[-1].read_text())
    pfile = summaries[-1].with_name("benchmark_percentile.json")
    rows = json.loads(pfile.read_text()) if pfile.exists() else []
    result: dict[str, Any] = {k: summary.get(v) for k, v in SUMMARY.items()}
    for key, column in PERCENTILE.items():
        result[key] = {p: _percentile(rows, f"{p[1:]}%", column) for p in ("p50", "p99")}
    return result


def render(stack: str, url: str, parallel: int, number: int, results: dict[str, dict[str, Any]]) -> str:
    """The text report: one row per model."""

    def num(v: Any, fmt: str = "{:.1f}") -> str:
        return "-" if v is None else fmt.format(v)

    lines = [
        f"load test {stack}: {url}, {parallel} in parallel, {number} requests per model (evalscope perf)",
        f"{'model':<36} {'ok/all':>9} {'req/s':>7} {'out tok/s':>10} {'TTFT p50/p99 ms':>17} "
        f"{'TPOT p50/p99 ms':>16} {'latency p50/p99 s':>18}",
    ]
    for model, r in results.items():
        if "error" in r:
            lines.append(f"{model:<36} error: {r['error']}")
            continue
        lines.append(
            f"{model:<36} {num(r['succeeded'], '{:.0f}') + '/' + num(r['requests'], '{:.0f}'):>9} "
            f"{num(r['request_throughput'], '{:.2f}'):>7} {num(r['output_tokens_per_s']):>10} "
            f"{num(r['ttft_ms']['p50']) + '/' + num(r['ttft_ms']['p99']):>17} "
            f"{num(r['tpot_ms']['p50']) + '/' + num(r['tpot_ms']['p99']):>16} "
            f"{num(r['latency_s']['p50'], '{:.2f}') + '/' + num(r['latency_s']['p99'], '{:.2f}'):>18}"
        )
    return "\n".join(lines) + "\n"


def _slug(model: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", model).strip("_") or "model"


def main(argv: list[str] | None = None) -> int:
    """The command line."""
    p = argparse.ArgumentParser(prog="python -m ops.loadtest", description=__doc__.split("\n\n")[0])
    stack_options(p)
    p.add_argument("--model", action="append", help="served name to test (repeatable; default: each pool's first)")
    p.add_argument("--parallel", type=int, default=64)
    p.add_argument("--number", type=int, default=512, help="requests per model")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--url", help="gateway base URL (default: from the stack, as the gatewayUrl output)")
    p.add_argument("--key", help="API key (default: $LLM_CLUSTER_API_KEY, else the stack's gatewayApiKeys output)")
    p.add_argument(
        "--ca-cert",
        type=Path,
        help="CA of the gateway's certificate, for HTTPS (default: the stack "
        "output gatewayCaCert when the CLI can read it; else the system's CAs)",
    )
    p.add_argument("--evalscope", default=str(ROOT / ".venv-loadtest" / "bin" / "evalscope"))
    p.add_argument("--out", type=Path, default=ROOT / "build" / "loadtest")
    args = p.parse_args(argv)
    if args.parallel < 1 or args.number < 1 or args.max_tokens < 1:
        print("loadtest: --parallel, --number and --max-tokens must be at least 1", file=sys.stderr)
        return EXIT_INVALID
    loaded = spec_from_args(args)
    if loaded is None:
        return EXIT_INVALID
    stack, path, spec = loaded
    if spec.gateway is None:
        print(f"loadtest: {path} has no gateway section to test", file=sys.stderr)
        return EXIT_INVALID
    served = {n for p_ in spec.pools.values() for n in spec.served_names(p_.model)} | set(spec.gateway.aliases)
    models = args.model or default_models(spec)
    unknown = [m for m in models if m not in served]
    if unknown:
        print(
            f"loadtest: MODEL {unknown[0]!r} is not served by {stack}; served: {', '.join(sorted(served))}",
            file=sys.stderr,
        )
        return EXIT_INVALID
    if not (Path(args.evalscope).exists() or shutil.which(args.evalscope)):
        print(
            f"loadtest: evalscope not found at {args.evalscope}; `make loadtest` installs it "
            "(requirements-loadtest.txt)",
            file=sys.stderr,
        )
        return EXIT_INVALID
    key = args.key or os.environ.get("LLM_CLUSTER_API_KEY") or (key_from_pulumi(stack) if spec.gateway.auth else None)
    if spec.gateway.auth and not key:
        print(
            "loadtest: no API key: pass --key, set LLM_CLUSTER_API_KEY, or run where `pulumi stack output "
            "--show-secrets gatewayApiKeys` works",
            file=sys.stderr,
        )
        return EXIT_INVALID
    url = (args.url or gateway_url(spec)).rstrip("/")
    out = args.out / stack
    env = dict(os.environ)
    ca = args.ca_cert or (ca_from_pulumi(stack, out) if url.startswith("https:") else None)
    if ca is not None:
        env["SSL_CERT_FILE"] = str(ca)  # evalscope's aiohttp verifies against it (OpenSSL's default paths)
    results: dict[str, dict[str, Any]] = {}
    for model in models:
        run_dir = out / _slug(model)
        shutil.rmtree(run_dir, ignore_errors=True)
        print(
            f"loadtest: {model}: evalscope perf, {args.parallel} in parallel, {args.number} requests",
            file=sys.stderr,
            flush=True,
        )
        done = subprocess.run(
            perf_argv(args.evalscope, url, model, key, args.parallel, args.number, args.max_tokens, run_dir),
            capture_output=True,
            text=True,
            env=env,
        )
        (out / f"{_slug(model)}.evalscope.log").parent.mkdir(parents=True, exist_ok=True)
        (out / f"{_slug(model)}.evalscope.log").write_text(done.stdout + done.stderr)
        try:
            results[model] = parse_results(run_dir)
        except ValueError as e:
            tail = (done.stderr.strip().splitlines() or done.stdout.strip().splitlines() or ["no output"])[-1]
            results[model] = {"error": f"{e} (evalscope exit {done.returncode}: {tail[:200]})"}
    text = render(stack, url, args.parallel, args.number, results)
    out.mkdir(parents=True, exist_ok=True)
    report = {
        "stack": stack,
        "url": url,
        "parallel": args.parallel,
        "number": args.number,
        "max_tokens": args.max_tokens,
        "models": results,
    }
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "report.txt").write_text(text)
    sys.stdout.write(text)
    if any("error" in r for r in results.values()):
        return EXIT_INVALID
    return (
        EXIT_FAILED if any((r.get("failed") or 0) > 0 or not r.get("succeeded") for r in results.values()) else EXIT_OK
    )


if __name__ == "__main__":
    run_cli(main)
