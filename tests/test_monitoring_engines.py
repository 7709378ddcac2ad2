"""Monitoring per engine: LMDeploy and llama.cpp servers scraped under their own job, alerts and panels built
from each engine's own metric names (checked against fixtures of each exporter), alerts an engine cannot feed
omitted with a note, and the rules file accepted by promtool."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from components.engines.llamacpp.facts import IMAGES as LLAMACPP_IMAGES
from components.engines.lmdeploy.facts import IMAGES as LMDEPLOY_IMAGES
from components.planning.monitoring.alerts import alert_groups, alert_rules
from components.planning.monitoring.prometheus import prometheus_config, scrape_targets
from components.spec import StackSpec
from tests.support import tool
from tests.support.engine_stacks import llamacpp_config, lmdeploy_config, spec_of
from tests.support.monitoring import METRICS_DIR, dashboard_queries, metric_names, variable_queries


def listed(fixture: str, *, expand: bool = True) -> set[str]:
    """The series one exporter's fixture lists, histograms expanded to their _bucket/_sum/_count series."""
    out: set[str] = set()
    for line in (METRICS_DIR / fixture).read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, kind = line.split()
            out |= {name + s for s in (("_bucket", "_sum", "_count") if kind == "histogram" and expand else ("",))}
    return out


def used(spec: StackSpec) -> set[str]:
    exprs = [r.expr for rules in alert_groups(spec).values() for r in rules]
    exprs += [q for _, _, q in dashboard_queries(spec)] + variable_queries(spec)
    return set().union(*(metric_names(e) for e in exprs))


def test_every_mapped_engine_metric_is_in_its_exporters_fixture() -> None:
    for image in LMDEPLOY_IMAGES.values():
        assert set(image.metrics.values()) <= listed("lmdeploy-0.16.0.txt", expand=False), image.ref
    for ll in LLAMACPP_IMAGES.values():
        assert set(ll.metrics.values()) <= listed("llama.cpp-b11312.txt", expand=False), ll.ref


@pytest.mark.parametrize(
    "config, job, fixture",
    [
        (lmdeploy_config, "lmdeploy", "lmdeploy-0.16.0.txt"),
        (llamacpp_config, "llamacpp", "llama.cpp-b11312.txt"),
    ],
)
def test_an_engines_pools_are_scraped_and_queried_by_its_own_names(config, job: str, fixture: str) -> None:
    spec = spec_of(config())
    jobs = {t.job for t in scrape_targets(spec) if t.labels.get("pool") == "chat" and t.job not in ("node", "dcgm")}
    assert jobs == {job}
    assert f"job_name: {job}\n" in prometheus_config(spec)
    names = used(spec)
    prefix = job + ":"
    engine_names = {n for n in names if n.startswith(prefix)}
    assert engine_names and engine_names <= listed(fixture)
    # The reasoning pool stays vLLM, queried by vLLM's names under job="vllm".
    assert "vllm:generation_tokens_total" in names


def test_lmdeploy_gets_every_serving_alert_with_its_names() -> None:
    rules = {(r.alert, r.expr) for rs in alert_groups(spec_of(lmdeploy_config())).values() for r in rs}
    exprs = {e for a, e in rules if a == "KVCacheFull"}
    assert 'lmdeploy:gpu_cache_usage_perc{job="lmdeploy"} > 0.98' in exprs
    assert any('lmdeploy:time_to_first_token_seconds_bucket{job="lmdeploy"}' in e for a, e in rules if a == "HighTTFT")
    assert ("PoolDown", '(count(up{job="lmdeploy", pool="chat"} == 1) or vector(0)) == 0') in rules


def test_llamacpp_pools_go_without_ttft_and_kv_alerts_and_the_rules_file_says_so() -> None:
    spec = spec_of(llamacpp_config())
    text = alert_rules(spec)
    assert text.startswith(
        "# not generated: HighTTFT: llama.cpp (job llamacpp, pools chat) exports no time_to_first_token\n"
        "# not generated: KVCacheFull: llama.cpp (job llamacpp, pools chat) exports no kv_cache_usage\n"
    )
    drops = [r.expr for rs in alert_groups(spec).values() for r in rs if r.alert == "ThroughputDrop"]
    assert (
        'sum by (pool) (rate(llamacpp:tokens_predicted_total{job="llamacpp"}[5m])) < 5 and on (pool) '
        'sum by (pool) (llamacpp:requests_processing{job="llamacpp"}) > 0' in drops
    )


@pytest.mark.parametrize("config", [lmdeploy_config, llamacpp_config])
def test_promtool_accepts_the_rules_of_mixed_engine_stacks(config, tmp_path: Path) -> None:
    rules = tmp_path / "rules.yml"
    rules.write_text(alert_rules(spec_of(config())))
    proc = subprocess.run([tool("promtool"), "check", "rules", str(rules)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_llamacpp_fixture_list_is_what_a_real_build_exposes() -> None:
    """The name list equals the # TYPE lines of a real llama-server b11312 (CPU build) exposition, plus the one
    counter it renders only with a draft model."""
    exposition = (METRICS_DIR.parent / "engines" / "llama.cpp-b11312-metrics.txt").read_text()
    seen = {tuple(line.split()[2:4]) for line in exposition.splitlines() if line.startswith("# TYPE ")}
    listed_pairs = {
        tuple(line.split())
        for line in (METRICS_DIR / "llama.cpp-b11312.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert listed_pairs - seen == {("llamacpp:spec_decode_num_accepted_tokens_per_pos_total", "counter")}
    assert seen <= listed_pairs


def test_lmdeploy_fixture_list_is_the_real_exporters() -> None:
    exposition = (METRICS_DIR.parent / "engines" / "lmdeploy-0.16.0-metrics.txt").read_text()
    seen = {tuple(line.split()[2:4]) for line in exposition.splitlines() if line.startswith("# TYPE lmdeploy:")}
    listed_pairs = {
        tuple(line.split())
        for line in (METRICS_DIR / "lmdeploy-0.16.0.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert seen == listed_pairs


def hit_rate_queries(spec: StackSpec) -> list[str]:
    return [q for _, title, q in dashboard_queries(spec) if title == "Prefix cache hit rate per instance"]


def test_every_engines_own_prefix_cache_counters_give_its_hit_rate_per_instance(prod_spec: StackSpec) -> None:
    rate = 'rate({}{{job="{}", pool=~"$pool"}}[$__rate_interval])'
    vllm = (
        f"sum by (instance) ({rate.format('vllm:prefix_cache_hits_total', 'vllm')}) / "
        f"sum by (instance) ({rate.format('vllm:prefix_cache_queries_total', 'vllm')})"
    )
    assert hit_rate_queries(prod_spec) == [vllm]
    # LMDeploy: the cached prompt tokens of finished requests over their whole prompts.
    lmdeploy = (
        f"sum by (instance) ({rate.format('lmdeploy:cached_tokens_total', 'lmdeploy')}) / "
        f"sum by (instance) ({rate.format('lmdeploy:prompt_tokens_total', 'lmdeploy')})"
    )
    assert sorted(hit_rate_queries(spec_of(lmdeploy_config()))) == sorted([lmdeploy, vllm])
    # llama.cpp counts the prompt tokens it computed without the cached ones: hits over both.
    cached = rate.format("llamacpp:prompt_tokens_cached_total", "llamacpp")
    computed = rate.format("llamacpp:prompt_tokens_total", "llamacpp")
    llamacpp = f"sum by (instance) ({cached}) / (sum by (instance) ({cached}) + sum by (instance) ({computed}))"
    assert sorted(hit_rate_queries(spec_of(llamacpp_config()))) == sorted([vllm, llamacpp])
