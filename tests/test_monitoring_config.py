"""Generated Prometheus config, alert rules and Grafana dashboards, checked with the real promtool."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from components.planning.load import load_stack_config
from components.planning.monitoring.alerts import alert_groups, alert_rules
from components.planning.monitoring.files import monitoring_files
from components.planning.monitoring.grafana import (
    dashboards,
    grafana_password_delete_script,
    grafana_password_generate_script,
    grafana_password_store_script,
    grafana_provisioning,
)
from components.planning.monitoring.prometheus import (
    PROMETHEUS_CONFIG,
    PROMETHEUS_RULES,
    prometheus_config,
    scrape_targets,
)
from components.planning.nodes.scripts import bash_command
from components.spec import SpecError, StackSpec
from components.spec.monitoring import monitoring_issues
from tests.support import tool
from tests.support.monitoring import (
    METRICS_DIR,
    Case,
    dashboard_queries,
    metric_names,
    promtool_tests,
    variable_queries,
)

NS = "llm-cluster:"


def run(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, **kw)


def write_files(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


# --- metric names ----------------------------------------------------------------------------------


def known_metrics() -> dict[str, str]:
    """Every exporter metric name from the fixture lists; histograms expanded to their series."""
    names: dict[str, str] = {}
    for f in sorted(METRICS_DIR.glob("*.txt")):
        for line in f.read_text().splitlines():
            if not line.strip() or line.startswith("#"):
                continue
            name, kind = line.split()
            suffixes = ("_bucket", "_sum", "_count") if kind == "histogram" else ("",)
            for s in suffixes:
                names[name + s] = f.name
    return names


def test_tokenizer_finds_metrics_and_skips_labels_functions_and_keywords() -> None:
    expr = (
        'sum by (pool, le) (rate(vllm:x_bucket{job="a", le=~"1|{2}"}[$__rate_interval])) / on (pool) '
        'group_left (node) max(node_load1 offset 5m) > bool 0.5e3 and absent(up{job="b"}) or vector(1)'
    )
    assert metric_names(expr) == {"vllm:x_bucket", "node_load1", "up"}


def test_every_metric_in_rules_and_dashboards_is_exported(prod_spec: StackSpec) -> None:
    known = known_metrics()
    exprs = [r.expr for rules in alert_groups(prod_spec).values() for r in rules]
    exprs += [q for _, _, q in dashboard_queries(prod_spec)] + variable_queries(prod_spec)
    used = set().union(*(metric_names(e) for e in exprs))
    assert used - set(known) == set()
    # The lists are the real ones: names the runbook got wrong are absent from them.
    assert {"vllm:num_generation_tokens_total", "DCGM_FI_DEV_FB_TOTAL"} & set(known) == set()
    assert {
        "vllm:generation_tokens_total",
        "vllm:time_to_first_token_seconds_bucket",
        "DCGM_FI_DEV_XID_ERRORS",
        "node_cpu_seconds_total",
        "llm_gateway_requests_total",
    } <= used


def test_runbook_rule_mistakes_are_corrected(prod_spec: StackSpec) -> None:
    rules = {r.alert: r for rs in alert_groups(prod_spec).values() for r in rs}
    assert metric_names(rules["HighTTFT"].expr) == {"vllm:time_to_first_token_seconds_bucket"}
    assert metric_names(rules["ThroughputDrop"].expr) == {"vllm:generation_tokens_total", "vllm:num_requests_running"}
    assert metric_names(rules["GPUMemoryHigh"].expr) == {"DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"}
    assert "vector(0)" in rules["PoolDown"].expr  # a vanished target set still fires


# --- promtool ----------------------------------------------------------------------------------------


def test_prometheus_config_and_rules_pass_promtool(prod_spec: StackSpec, tmp_path: Path) -> None:
    write_files(tmp_path, monitoring_files(prod_spec))
    config = run([tool("promtool"), "check", "config", str(tmp_path / PROMETHEUS_CONFIG)])
    assert config.returncode == 0, config.stdout + config.stderr
    assert "SUCCESS: 1 rule files found" in config.stdout + config.stderr
    rules = run([tool("promtool"), "check", "rules", str(tmp_path / PROMETHEUS_RULES)])
    assert rules.returncode == 0, rules.stdout + rules.stderr
    count = sum(len(g) for g in alert_groups(prod_spec).values())
    assert f"SUCCESS: {count} rules found" in rules.stdout


def test_dashboard_queries_are_valid_promql(prod_spec: StackSpec, tmp_path: Path) -> None:
    # promtool parses rule expressions: every dashboard query becomes a recording rule, with
    # Grafana's variables replaced by what Grafana would put there.
    subst = {"$__rate_interval": "5m", "$pool": ".*", "$node": ".*"}
    rules = []
    for i, expr in enumerate([q for _, _, q in dashboard_queries(prod_spec)] + variable_queries(prod_spec)):
        for var, value in subst.items():
            expr = expr.replace(var, value)
        assert "$" not in expr, expr
        rules.append({"record": f"dashboard:query_{i}", "expr": expr})
    path = tmp_path / "dashboards.rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    out = run([tool("promtool"), "check", "rules", str(path)])
    assert out.returncode == 0, out.stdout + out.stderr


def test_scrape_config_covers_every_endpoint_of_the_reference_stack(prod_spec: StackSpec) -> None:
    config = yaml.safe_load(prometheus_config(prod_spec))
    jobs = {
        j["job_name"]: [(s["targets"][0], s["labels"]) for s in j["static_configs"]] for j in config["scrape_configs"]
    }
    # No `ray` job: the vLLM image's Ray (ray[cgraph]) exports no metrics; the heads' textfile rides on `node`.
    assert list(jobs) == ["node", "dcgm", "vllm", "gateway", "prometheus"]
    assert [t for t, _ in jobs["node"]] == [f"192.168.10.1{i}:9100" for i in range(1, 7)]
    assert [t for t, _ in jobs["dcgm"]] == [f"192.168.10.1{i}:9400" for i in range(1, 7)]
    assert jobs["dcgm"][0][1] == {"instance": "gpu-01", "node": "gpu-01", "pool": "reasoning"}
    assert jobs["vllm"] == [
        ("192.168.10.11:8000", {"instance": "reasoning-gpu-01", "node": "gpu-01", "pool": "reasoning"})
    ] + [
        (f"192.168.10.1{i}:8000", {"instance": f"chat-gpu-0{i}", "node": f"gpu-0{i}", "pool": "chat"})
        for i in range(3, 7)
    ]
    # nginx's own metrics listener, not the gateway port: that serves only the OpenAI API.
    assert jobs["gateway"] == [("192.168.10.11:9145", {"instance": "gpu-01", "node": "gpu-01"})]
    assert config["global"] == {"scrape_interval": "15s", "evaluation_interval": "15s"}
    assert config["rule_files"] == ["rules/*.yml"]
    assert "alerting" not in config


def test_gateway_is_scraped_at_its_metrics_listener_over_http_even_when_it_serves_tls(config: dict[str, Any]) -> None:
    config[NS + "gateway"].update(tls=True, port=443, metricsPort=9200)
    config[NS + "gatewayTlsCert"] = config[NS + "gatewayTlsKey"] = "[secret]"
    spec = load_stack_config(config, {NS + "gatewayTlsCert", NS + "gatewayTlsKey"})
    (job,) = [j for j in yaml.safe_load(prometheus_config(spec))["scrape_configs"] if j["job_name"] == "gateway"]
    assert job == {
        "job_name": "gateway",
        "scheme": "http",
        "static_configs": [{"targets": ["192.168.10.11:9200"], "labels": {"instance": "gpu-01", "node": "gpu-01"}}],
    }


def with_alertmanager(config: dict[str, Any]) -> StackSpec:
    config[NS + "monitoring"]["alertmanager"] = {"image": "prom/alertmanager:v0.27.0", "port": 9093}
    config[NS + "alertmanagerConfig"] = "route: {receiver: ops}\nreceivers: [{name: ops}]\n"
    return load_stack_config(config, {NS + "alertmanagerConfig"})


def test_alertmanager_is_wired_when_enabled(config: dict[str, Any], tmp_path: Path) -> None:
    spec = with_alertmanager(config)
    prom = yaml.safe_load(prometheus_config(spec))
    assert prom["alerting"] == {"alertmanagers": [{"static_configs": [{"targets": ["192.168.10.11:9093"]}]}]}
    assert prom["scrape_configs"][-1]["job_name"] == "alertmanager"
    write_files(tmp_path, monitoring_files(spec))
    out = run([tool("promtool"), "check", "config", str(tmp_path / PROMETHEUS_CONFIG)])
    assert out.returncode == 0, out.stdout + out.stderr


def test_thresholds_come_from_the_stack(config: dict[str, Any]) -> None:
    config[NS + "monitoring"]["thresholds"] = {"ttftP95Seconds": 3.5, "gpuTemperatureCelsius": 80, "forMinutes": 7}
    rules = {r.alert: r for rs in alert_groups(load_stack_config(config, set())).values() for r in rs}
    assert rules["HighTTFT"].expr.endswith("> 3.5") and rules["HighTTFT"].for_ == "7m"
    assert rules["GPUTemperatureHigh"].expr == 'DCGM_FI_DEV_GPU_TEMP{job="dcgm"} > 80'
    assert rules["GPULowUtilization"].for_ == "14m"
    assert rules["ServiceDown"].for_ == "2m"  # availability windows do not stretch with forMinutes


# --- spec checks of the monitoring section -----------------------------------------------------------


def spec_issues(config: dict[str, Any], secret_keys: set[str] | None = None) -> list[str]:
    """The stack validation's messages (monitoring_issues runs inside load_stack_config)."""
    with pytest.raises(SpecError) as err:
        load_stack_config(config, secret_keys or set())
    return [str(i) for i in err.value.issues]


def test_alertmanager_without_its_secret_is_refused(config: dict[str, Any]) -> None:
    config[NS + "monitoring"]["alertmanager"] = {"image": "prom/alertmanager:v0.27.0", "port": 9093}
    assert spec_issues(config) == [
        "monitoring.alertmanager: needs the secret alertmanagerConfig holding alertmanager.yml "
        "(pulumi config set --secret alertmanagerConfig < alertmanager.yml)"
    ]
    assert monitoring_issues(with_alertmanager(config)) == []


def test_alertmanager_secret_without_alertmanager_is_refused(config: dict[str, Any]) -> None:
    config[NS + "alertmanagerConfig"] = "route: {receiver: ops}\n"
    assert spec_issues(config, {NS + "alertmanagerConfig"}) == [
        "monitoring.alertmanager: is unset but the secret alertmanagerConfig is given; set "
        "monitoring.alertmanager (image and port) to deploy Alertmanager"
    ]


def test_gpu_memory_threshold_within_vllm_reservation_is_refused(config: dict[str, Any]) -> None:
    # vLLM 0.19.1 starts NCCL before it measures: at TP 8 x PP 2 a GPU's 8 peers' communicators (0.25 GiB
    # each) sit outside gpuMemoryUtilization 0.9 beside the CUDA context: 0.9 + 2.5/32 = 0.9781 in use.
    config[NS + "monitoring"]["thresholds"] = {"gpuMemoryUsedRatio": 0.97}
    assert spec_issues(config) == [
        "monitoring.thresholds.gpuMemoryUsedRatio: 0.97 would fire on every GPU of pool 'reasoning': vLLM "
        "takes gpuMemoryUtilization 0.9 at start, plus its CUDA context (about 0.5 GiB) and NCCL communicators "
        "(about 2.00 GiB at TP 8 x PP 2), of the 32 GiB Tesla V100-SXM2-32GB; set it above 0.9781",
        "monitoring.thresholds.gpuMemoryUsedRatio: 0.97 would fire on every GPU of pool 'chat': vLLM "
        "takes gpuMemoryUtilization 0.9 at start, plus its CUDA context (about 0.5 GiB) and NCCL communicators "
        "(about 1.75 GiB at TP 8 x PP 1), of the 32 GiB Tesla V100-SXM2-32GB; set it above 0.9703",
    ]
    config[NS + "monitoring"]["thresholds"] = {"gpuMemoryUsedRatio": 0.99}  # the default
    assert monitoring_issues(load_stack_config(config, set())) == []
    # 0.92 at TP 8 x PP 2 on 0.19.1 still starts (0.04 GiB to spare) and sits at 0.9981: the default fires.
    config[NS + "pools"]["reasoning"]["vllm"]["gpuMemoryUtilization"] = 0.92
    assert [i for i in spec_issues(config) if "'reasoning'" in i][0].endswith("set it above 0.9981")
    # 0.95 cannot start at all (memory-fit says so, with what starts): no second refusal about the alert.
    config[NS + "pools"]["reasoning"]["vllm"]["gpuMemoryUtilization"] = 0.95
    assert monitoring_issues(load_stack_config(config, set())) == []
    config[NS + "pools"]["reasoning"]["vllm"]["gpuMemoryUtilization"] = 0.9
    # vLLM 0.9.2 measures after NCCL starts: only the CUDA context is outside its budget.
    config[NS + "monitoring"]["thresholds"] = {"gpuMemoryUsedRatio": 0.9}
    for pool in ("reasoning", "chat"):
        config[NS + "pools"][pool]["image"] = "vllm/vllm-openai:v0.9.2"
    assert [i for i in spec_issues(config) if "'chat'" in i] == [
        "monitoring.thresholds.gpuMemoryUsedRatio: 0.9 would fire on every GPU of pool 'chat': vLLM takes "
        "gpuMemoryUtilization 0.9 at start, plus its CUDA context (about 0.5 GiB), of the 32 GiB "
        "Tesla V100-SXM2-32GB; set it above 0.9156"
    ]


# --- Grafana -----------------------------------------------------------------------------------------

REQUIRED_PANELS = {
    "llm-serving.json": [
        "Generation throughput per pool",
        "Time to first token",
        "Time per output token",
        "KV cache usage",
        "Queue depth",
        "Gateway requests by key, model and status",
    ],
    "gpu-nodes.json": [
        "GPU utilization per node",
        "GPU memory used per node",
        "GPU temperature per node (hottest GPU)",
    ],
}


def test_grafana_provisioning_is_valid_and_covers_the_panels(prod_spec: StackSpec) -> None:
    files = grafana_provisioning(prod_spec)
    ds = yaml.safe_load(files["grafana/provisioning/datasources/llm-cluster.yaml"])
    assert ds["datasources"][0] == {
        "name": "Prometheus",
        "uid": "prometheus",
        "type": "prometheus",
        "access": "proxy",
        "url": "http://192.168.10.11:9090",
        "isDefault": True,
        "editable": False,
        "jsonData": {"timeInterval": "15s"},
    }
    provider = yaml.safe_load(files["grafana/provisioning/dashboards/llm-cluster.yaml"])
    assert provider["providers"][0]["options"] == {"path": "/etc/grafana/dashboards/llm-cluster"}
    for fname, titles in REQUIRED_PANELS.items():
        model = json.loads(files[f"grafana/dashboards/llm-cluster/{fname}"])
        panels = {p["title"]: p for p in model["panels"] if p["type"] == "timeseries"}
        assert set(titles) <= set(panels), fname
        ids = [p["id"] for p in model["panels"]]
        assert len(ids) == len(set(ids))
        for p in panels.values():
            assert p["datasource"] == {"type": "prometheus", "uid": "prometheus"}
            assert p["targets"] and all(t["expr"] for t in p["targets"])
    serving = json.loads(files["grafana/dashboards/llm-cluster/llm-serving.json"])
    ttft = next(p for p in serving["panels"] if p["title"] == "Time to first token")
    assert [t["legendFormat"] for t in ttft["targets"]] == ["{{pool}} p50", "{{pool}} p95", "{{pool}} p99"]
    assert [t["expr"].split(",")[0] for t in ttft["targets"]] == [
        "histogram_quantile(0.5",
        "histogram_quantile(0.95",
        "histogram_quantile(0.99",
    ]
    gateway = next(p for p in serving["panels"] if p["title"] == "Gateway requests by key, model and status")
    assert gateway["targets"][0]["expr"].startswith("sum by (key_id, model, status) (")


def test_the_gateways_routing_panels_show_outcomes_in_flight_and_drained_replicas(prod_spec: StackSpec) -> None:
    queries = {title: q for _, title, q in dashboard_queries(prod_spec) if "prefix affinity" in title}
    assert queries == {
        "Gateway routing outcomes (prefix affinity)": "sum by (pool, outcome) "
        '(rate(llm_gateway_routing_total{job="gateway"}[$__rate_interval]))',
        "Requests in flight per replica (prefix affinity)": 'llm_gateway_upstream_in_flight{job="gateway"}',
        "Replicas drained at the gateway (prefix affinity; 1 = no new request)": (
            'llm_gateway_upstream_drained{job="gateway"}'
        ),
    }


def test_no_gateway_means_no_gateway_panels_jobs_or_alerts(config: dict[str, Any]) -> None:
    del config[NS + "gateway"]
    spec = load_stack_config(config, set())
    assert "gateway" not in {t.job for t in scrape_targets(spec)}
    assert "llm-gateway" not in alert_groups(spec)
    titles = [p["title"] for p in dashboards(spec)["llm-serving.json"]["panels"]]
    assert not [t for t in titles if "Gateway" in t]


# --- alert unit tests (promtool test rules) ------------------------------------------------------


def in_flight(node: int) -> str:
    """The gateway's in-flight gauge of the chat replica on gpu-<node>."""
    return (
        'llm_gateway_upstream_in_flight{job="gateway", instance="gpu-01", node="gpu-01", pool="chat", '
        f'upstream="192.168.10.{node}:8000"}}'
    )


VLLM03 = 'job="vllm", pool="chat", instance="chat-gpu-03", node="gpu-03"'
VLLM04 = 'job="vllm", pool="chat", instance="chat-gpu-04", node="gpu-04"'
VLLM_R = 'job="vllm", pool="reasoning", instance="reasoning-gpu-01", node="gpu-01"'


def lbl(selector: str) -> dict[str, str]:
    return dict(re.findall(r'(\w+)="([^"]*)"', selector))


def dcgm(node: str, gpu: str, **extra: str) -> str:
    return ", ".join(
        ['job="dcgm"', f'instance="{node}"', f'node="{node}"', f'gpu="{gpu}"']
        + [f'{k}="{v}"' for k, v in extra.items()]
    )


def ttft(sel: str, per_minute: dict[str, str]) -> list[tuple[str, str]]:
    return [(f'vllm:time_to_first_token_seconds_bucket{{{sel}, le="{le}"}}', v) for le, v in per_minute.items()]


def every_up(spec: StackSpec, drop: tuple[str, str] | None = None) -> list[tuple[str, str]]:
    """`up` = 1 for every generated target, except a dropped (job, instance)."""
    out = []
    for t in scrape_targets(spec):
        if drop == (t.job, t.labels["instance"]):
            continue
        sel = ", ".join([f'job="{t.job}"'] + [f'{k}="{v}"' for k, v in t.labels.items()])
        out.append((f"up{{{sel}}}", "1x20"))
    return out


def cases(spec: StackSpec) -> list[Case]:
    gw200 = 'job="gateway", instance="gpu-01", node="gpu-01", key_id="default", model="qwen3-30b-a3b", pool="chat"'
    upstream = 'job="gateway", instance="gpu-01", node="gpu-01", pool="chat", upstream="192.168.10.14:8000"'
    # The head's textfile, served by gpu-01's node-exporter.
    ray = 'job="node", instance="gpu-01", node="gpu-01", pool="reasoning", ray_cluster="reasoning-gpu-01"'
    mtime = (
        'node_textfile_mtime_seconds{job="node", instance="gpu-01", node="gpu-01", pool="reasoning", '
        'file="/var/lib/llm-cluster/node-exporter/llm-ray-reasoning-gpu-01.prom"}'
    )
    ray_alert = {"pool": "reasoning", "ray_cluster": "reasoning-gpu-01"}
    return [
        Case(
            "ThroughputDrop",
            "requests running, 1 token/s",
            "15m",
            [
                (f"vllm:generation_tokens_total{{{VLLM03}}}", "0+60x20"),
                (f"vllm:num_requests_running{{{VLLM03}}}", "3x20"),
            ],
            [({"pool": "chat"}, 1.0)],
        ),
        Case(
            "ThroughputDrop",
            "idle by design: no request, no tokens",
            "15m",
            [(f"vllm:generation_tokens_total{{{VLLM03}}}", "0x20"), (f"vllm:num_requests_running{{{VLLM03}}}", "0x20")],
        ),
        Case(
            "ThroughputDrop",
            "healthy: 10 tokens/s with requests",
            "15m",
            [
                (f"vllm:generation_tokens_total{{{VLLM03}}}", "0+600x20"),
                (f"vllm:num_requests_running{{{VLLM03}}}", "3x20"),
            ],
        ),
        Case(
            "HighTTFT",
            "every first token between 2.5 s and 5 s",
            "15m",
            ttft(VLLM03, {"1": "0x20", "2.5": "0x20", "5": "0+10x20", "+Inf": "0+10x20"}),
            [({"pool": "chat"}, 4.875)],
        ),
        Case(
            "HighTTFT",
            "first tokens under 1 s (end-to-end latency is not TTFT)",
            "15m",
            ttft(VLLM03, {"1": "0+10x20", "2.5": "0+10x20", "5": "0+10x20", "+Inf": "0+10x20"})
            + [(f'vllm:e2e_request_latency_seconds_bucket{{{VLLM03}, le="+Inf"}}', "0+10x20")],
        ),
        Case(
            "KVCacheFull",
            "cache at 99 % for 10 minutes",
            "10m",
            [(f"vllm:kv_cache_usage_perc{{{VLLM04}}}", "0.99x20")],
            [(lbl(VLLM04), 0.99)],
        ),
        Case("KVCacheFull", "cache at 90 %", "10m", [(f"vllm:kv_cache_usage_perc{{{VLLM04}}}", "0.9x20")]),
        Case("ServiceDown", "instance down for 5 minutes", "5m", [(f"up{{{VLLM04}}}", "0x10")], [(lbl(VLLM04), 0.0)]),
        Case("ServiceDown", "a one-minute blip", "5m", [(f"up{{{VLLM04}}}", "1 1 1 0 1 1 1 1 1 1")]),
        Case(
            "PoolDown",
            "chat's targets vanished from the scrape",
            "5m",
            [(f"up{{{VLLM_R}}}", "1x10")],
            [({"pool": "chat"}, 0.0)],
        ),
        Case(
            "PoolDown",
            "every chat instance down",
            "5m",
            [(f"up{{{VLLM_R}}}", "1x10"), (f"up{{{VLLM03}}}", "0x10"), (f"up{{{VLLM04}}}", "0x10")],
            [({"pool": "chat"}, 0.0)],
        ),
        Case(
            "PoolDown",
            "one chat instance still up",
            "5m",
            [(f"up{{{VLLM_R}}}", "1x10"), (f"up{{{VLLM03}}}", "0x10"), (f"up{{{VLLM04}}}", "1x10")],
        ),
        Case(
            "GPUMemoryHigh",
            "99.5 % of framebuffer used",
            "10m",
            [
                (f"DCGM_FI_DEV_FB_USED{{{dcgm('gpu-03', '5')}}}", "31340x20"),
                (f"DCGM_FI_DEV_FB_FREE{{{dcgm('gpu-03', '5')}}}", "160x20"),
            ],
            [(lbl(dcgm("gpu-03", "5")), 31340 / 31500)],
        ),
        # A TP 8 GPU on vLLM 0.19.1 at 0.90: the reservation, the CUDA context and NCCL's buffers (97.8 %).
        Case(
            "GPUMemoryHigh",
            "vLLM's own reservation with what sits outside it",
            "10m",
            [
                (f"DCGM_FI_DEV_FB_USED{{{dcgm('gpu-03', '5')}}}", "30810x20"),
                (f"DCGM_FI_DEV_FB_FREE{{{dcgm('gpu-03', '5')}}}", "690x20"),
            ],
        ),
        Case(
            "GPUXidError",
            "Xid 79 reported",
            "3m",
            [(f"DCGM_FI_DEV_XID_ERRORS{{{dcgm('gpu-04', '3')}}}", "0 0 79 79")],
            [(lbl(dcgm("gpu-04", "3")), 79.0)],
        ),
        Case("GPUXidError", "no Xid", "3m", [(f"DCGM_FI_DEV_XID_ERRORS{{{dcgm('gpu-04', '3')}}}", "0 0 0 0")]),
        Case(
            "GPUTemperatureHigh",
            "90 C for 10 minutes",
            "10m",
            [(f"DCGM_FI_DEV_GPU_TEMP{{{dcgm('gpu-02', '0')}}}", "90x20")],
            [(lbl(dcgm("gpu-02", "0")), 90.0)],
        ),
        Case("GPUTemperatureHigh", "80 C", "10m", [(f"DCGM_FI_DEV_GPU_TEMP{{{dcgm('gpu-02', '0')}}}", "80x20")]),
        Case(
            "GPULowUtilization",
            "chat-gpu-04 has requests, its GPUs idle",
            "15m",
            [
                (f"DCGM_FI_DEV_GPU_UTIL{{{dcgm('gpu-04', '0')}}}", "10x20"),
                (f"DCGM_FI_DEV_GPU_UTIL{{{dcgm('gpu-04', '1')}}}", "20x20"),
                (f"vllm:num_requests_running{{{VLLM04}}}", "2x20"),
            ],
            [({"node": "gpu-04", "pool": "chat", "vllm_instance": "chat-gpu-04"}, 15.0)],
        ),
        Case(
            "GPULowUtilization",
            "Ray instance busy, its second node's GPUs idle",
            "15m",
            [
                (f"DCGM_FI_DEV_GPU_UTIL{{{dcgm('gpu-01', '0')}}}", "90x20"),
                (f"DCGM_FI_DEV_GPU_UTIL{{{dcgm('gpu-02', '0')}}}", "5x20"),
                (f"vllm:num_requests_running{{{VLLM_R}}}", "4x20"),
            ],
            [({"node": "gpu-02", "pool": "reasoning", "vllm_instance": "reasoning-gpu-01"}, 5.0)],
        ),
        Case(
            "GPULowUtilization",
            "idle by design: no requests",
            "15m",
            [
                (f"DCGM_FI_DEV_GPU_UTIL{{{dcgm('gpu-04', '0')}}}", "0x20"),
                (f"vllm:num_requests_running{{{VLLM04}}}", "0x20"),
            ],
        ),
        Case(
            "GPULowUtilization",
            "loading weights: no vLLM metrics yet",
            "15m",
            [(f"DCGM_FI_DEV_GPU_UTIL{{{dcgm('gpu-04', '0')}}}", "0x20")],
        ),
        Case(
            "GPULowUtilization",
            "another replica of the pool is busy, this one idle",
            "15m",
            [
                (f"DCGM_FI_DEV_GPU_UTIL{{{dcgm('gpu-04', '0')}}}", "0x20"),
                (f"DCGM_FI_DEV_GPU_UTIL{{{dcgm('gpu-03', '0')}}}", "95x20"),
                (f"vllm:num_requests_running{{{VLLM03}}}", "5x20"),
            ],
        ),
        Case(
            "NodeDown",
            "node-exporter unreachable",
            "5m",
            [('up{job="node", instance="gpu-05", node="gpu-05", pool="chat"}', "0x10")],
            [({"job": "node", "instance": "gpu-05", "node": "gpu-05", "pool": "chat"}, 0.0)],
        ),
        Case("NodeDown", "node up", "5m", [('up{job="node", instance="gpu-05", node="gpu-05", pool="chat"}', "1x10")]),
        Case(
            "DCGMExporterDown",
            "dcgm-exporter down, node up",
            "10m",
            [
                ('up{job="dcgm", instance="gpu-02", node="gpu-02"}', "0x20"),
                ('up{job="node", instance="gpu-02", node="gpu-02"}', "1x20"),
            ],
            [({"job": "dcgm", "instance": "gpu-02", "node": "gpu-02"}, 0.0)],
        ),
        Case(
            "DCGMExporterDown",
            "whole node down: NodeDown says it",
            "10m",
            [
                ('up{job="dcgm", instance="gpu-02", node="gpu-02"}', "0x20"),
                ('up{job="node", instance="gpu-02", node="gpu-02"}', "0x20"),
            ],
        ),
        Case(
            "TargetsMissing",
            "one node-exporter target gone from the config",
            "10m",
            every_up(spec, drop=("node", "gpu-06")),
            [({"job": "node"}, 5.0)],
        ),
        Case("TargetsMissing", "every generated target scraped", "10m", every_up(spec)),
        Case(
            "RayNodesLost",
            "worker gpu-02 gone",
            "5m",
            [(f"llm_ray_nodes{{{ray}}}", "2 2 1x8"), (f"llm_ray_status_up{{{ray}}}", "1x10")],
            [(ray_alert, 1.0)],
        ),
        Case(
            "RayNodesLost",
            "ray status fails on the head: 0 nodes",
            "5m",
            [(f"llm_ray_nodes{{{ray}}}", "0x10"), (f"llm_ray_status_up{{{ray}}}", "0x10")],
            [(ray_alert, 0.0)],
        ),
        Case(
            "RayNodesLost",
            "both Ray nodes in the cluster",
            "5m",
            [(f"llm_ray_nodes{{{ray}}}", "2x10"), (f"llm_ray_status_up{{{ray}}}", "1x10")],
        ),
        Case(
            "RayNodesLost",
            "a worker rejoining within a minute",
            "5m",
            [(f"llm_ray_nodes{{{ray}}}", "2 2 1 2 2 2 2 2 2 2")],
        ),
        Case(
            "RayMetricsStale",
            "the head stopped rewriting its textfile at 1 minute",
            "7m",
            [(f"llm_ray_nodes{{{ray}}}", "2x10"), (mtime, "0 60x10")],
            [(ray_alert, 360.0)],
        ),
        Case(
            "RayMetricsStale",
            "no textfile at all (head never started, or node-exporter lacks the mount)",
            "5m",
            [('up{job="node", instance="gpu-01", node="gpu-01", pool="reasoning"}', "1x10")],
            [(ray_alert, 0.0)],
        ),
        Case(
            "RayMetricsStale", "rewritten every minute", "7m", [(f"llm_ray_nodes{{{ray}}}", "2x10"), (mtime, "0+60x10")]
        ),
        Case(
            "GatewayDown",
            "gateway down",
            "5m",
            [('up{job="gateway", instance="gpu-01", node="gpu-01"}', "0x10")],
            [({"job": "gateway", "instance": "gpu-01", "node": "gpu-01"}, 0.0)],
        ),
        Case("GatewayDown", "gateway up", "5m", [('up{job="gateway", instance="gpu-01", node="gpu-01"}', "1x10")]),
        Case(
            "Gateway5xxRateHigh",
            "10 % of chat requests answered 502",
            "15m",
            [
                (f'llm_gateway_requests_total{{{gw200}, status="200"}}', "0+90x20"),
                (f'llm_gateway_requests_total{{{gw200}, status="502"}}', "0+10x20"),
            ],
            [({"pool": "chat"}, 0.1)],
        ),
        Case(
            "Gateway5xxRateHigh",
            "1 % 502",
            "15m",
            [
                (f'llm_gateway_requests_total{{{gw200}, status="200"}}', "0+99x20"),
                (f'llm_gateway_requests_total{{{gw200}, status="502"}}', "0+1x20"),
            ],
        ),
        Case(
            "GatewayUpstreamFailures",
            "2 failed attempts a minute",
            "15m",
            [(f"llm_gateway_upstream_failures_total{{{upstream}}}", "0+2x20")],
            [({"pool": "chat", "upstream": "192.168.10.14:8000"}, 10.0)],
        ),
        Case(
            "GatewayUpstreamFailures",
            "a single failover",
            "15m",
            [(f"llm_gateway_upstream_failures_total{{{upstream}}}", "0x10 1x10")],
        ),
        # Prefix affinity: the busiest replica above 2 x the pool's mean and above the floor (minInFlight 4).
        Case(
            "GatewayRoutingImbalance",
            "20 in flight on one replica, 2 on the others",
            "15m",
            [(in_flight(n), "20x20" if n == 13 else "2x20") for n in (13, 14, 15, 16)],
            [({"pool": "chat"}, 20.0)],
        ),
        Case(
            "GatewayRoutingImbalance",
            "6 against a mean of 4.5",
            "15m",
            [(in_flight(n), "6x20" if n == 13 else "4x20") for n in (13, 14, 15, 16)],
        ),
        Case(
            "GatewayRoutingImbalance",
            "4 on one replica at low traffic: within the floor",
            "15m",
            [(in_flight(n), "4x20" if n == 13 else "0x20") for n in (13, 14, 15, 16)],
        ),
        *threshold_cases(gw200, upstream),
    ]


def threshold_cases(gw200: str, upstream: str) -> list[Case]:
    """Cases just either side of each threshold's default, the defaults written out here (not read
    from AlertThresholds): a moved default or a flipped comparison fails one of each pair."""
    ttft_buckets = {"1": "0x20", "2": "0+94x20", "2.5": "0+100x20", "+Inf": "0+100x20"}
    return [
        # min_generation_tokens_per_second 5: 4.9 and 5.1 tokens/s with requests running.
        Case(
            "ThroughputDrop",
            "4.9 tokens/s, just under the 5 floor",
            "15m",
            [
                (f"vllm:generation_tokens_total{{{VLLM03}}}", "0+294x20"),
                (f"vllm:num_requests_running{{{VLLM03}}}", "3x20"),
            ],
            [({"pool": "chat"}, 4.9)],
        ),
        Case(
            "ThroughputDrop",
            "5.1 tokens/s, just over the 5 floor",
            "15m",
            [
                (f"vllm:generation_tokens_total{{{VLLM03}}}", "0+306x20"),
                (f"vllm:num_requests_running{{{VLLM03}}}", "3x20"),
            ],
        ),
        # ttft_p95_seconds 2: p95 2.08 s (94 % under 2 s, the rest under 2.5 s) and 1.95 s.
        Case(
            "HighTTFT",
            "p95 2.08 s, just over 2 s",
            "15m",
            ttft(VLLM03, ttft_buckets),
            [({"pool": "chat"}, 2 + (95 - 94) / (100 - 94) * 0.5)],
        ),
        Case(
            "HighTTFT",
            "p95 1.95 s, just under 2 s",
            "15m",
            ttft(VLLM03, {"1": "0x20", "2": "0+100x20", "2.5": "0+100x20", "+Inf": "0+100x20"}),
        ),
        # kv_cache_usage_ratio 0.98
        Case(
            "KVCacheFull",
            "cache at 98.5 %",
            "10m",
            [(f"vllm:kv_cache_usage_perc{{{VLLM04}}}", "0.985x20")],
            [(lbl(VLLM04), 0.985)],
        ),
        Case("KVCacheFull", "cache at 97.5 %", "10m", [(f"vllm:kv_cache_usage_perc{{{VLLM04}}}", "0.975x20")]),
        # gpu_memory_used_ratio 0.99
        Case(
            "GPUMemoryHigh",
            "99.1 % of framebuffer used",
            "10m",
            [
                (f"DCGM_FI_DEV_FB_USED{{{dcgm('gpu-03', '5')}}}", "9910x20"),
                (f"DCGM_FI_DEV_FB_FREE{{{dcgm('gpu-03', '5')}}}", "90x20"),
            ],
            [(lbl(dcgm("gpu-03", "5")), 0.991)],
        ),
        Case(
            "GPUMemoryHigh",
            "98.9 % of framebuffer used",
            "10m",
            [
                (f"DCGM_FI_DEV_FB_USED{{{dcgm('gpu-03', '5')}}}", "9890x20"),
                (f"DCGM_FI_DEV_FB_FREE{{{dcgm('gpu-03', '5')}}}", "110x20"),
            ],
        ),
        # gpu_temperature_celsius 85: above it fires, at it does not.
        Case(
            "GPUTemperatureHigh",
            "86 C",
            "10m",
            [(f"DCGM_FI_DEV_GPU_TEMP{{{dcgm('gpu-02', '0')}}}", "86x20")],
            [(lbl(dcgm("gpu-02", "0")), 86.0)],
        ),
        Case(
            "GPUTemperatureHigh",
            "85 C, the threshold itself",
            "10m",
            [(f"DCGM_FI_DEV_GPU_TEMP{{{dcgm('gpu-02', '0')}}}", "85x20")],
        ),
        # gpu_low_utilization_percent 30: below it fires, at it does not.
        Case(
            "GPULowUtilization",
            "29 % with requests",
            "15m",
            [
                (f"DCGM_FI_DEV_GPU_UTIL{{{dcgm('gpu-04', '0')}}}", "29x20"),
                (f"vllm:num_requests_running{{{VLLM04}}}", "2x20"),
            ],
            [({"node": "gpu-04", "pool": "chat", "vllm_instance": "chat-gpu-04"}, 29.0)],
        ),
        Case(
            "GPULowUtilization",
            "30 % with requests, the threshold itself",
            "15m",
            [
                (f"DCGM_FI_DEV_GPU_UTIL{{{dcgm('gpu-04', '0')}}}", "30x20"),
                (f"vllm:num_requests_running{{{VLLM04}}}", "2x20"),
            ],
        ),
        # gateway_5xx_ratio 0.05
        Case(
            "Gateway5xxRateHigh",
            "6 % 502",
            "15m",
            [
                (f'llm_gateway_requests_total{{{gw200}, status="200"}}', "0+94x20"),
                (f'llm_gateway_requests_total{{{gw200}, status="502"}}', "0+6x20"),
            ],
            [({"pool": "chat"}, 0.06)],
        ),
        Case(
            "Gateway5xxRateHigh",
            "4 % 502",
            "15m",
            [
                (f'llm_gateway_requests_total{{{gw200}, status="200"}}', "0+96x20"),
                (f'llm_gateway_requests_total{{{gw200}, status="502"}}', "0+4x20"),
            ],
        ),
        # gateway_upstream_failures 3 per 5 minutes: 4 fire, 2.8 do not.
        Case(
            "GatewayUpstreamFailures",
            "4 failed attempts in 5 minutes",
            "15m",
            [(f"llm_gateway_upstream_failures_total{{{upstream}}}", "0+0.8x20")],
            [({"pool": "chat", "upstream": "192.168.10.14:8000"}, 4.0)],
        ),
        Case(
            "GatewayUpstreamFailures",
            "2.8 failed attempts in 5 minutes",
            "15m",
            [(f"llm_gateway_upstream_failures_total{{{upstream}}}", "0+0.56x20")],
        ),
    ]


def test_every_alert_has_a_firing_and_a_quiet_case(prod_spec: StackSpec) -> None:
    names = {r.alert for rs in alert_groups(prod_spec).values() for r in rs}
    firing = {c.alert for c in cases(prod_spec) if c.fires}
    quiet = {c.alert for c in cases(prod_spec) if not c.fires}
    assert names == firing == quiet


def test_alerts_fire_when_they_should_and_only_then(prod_spec: StackSpec, tmp_path: Path) -> None:
    (tmp_path / "rules.yml").write_text(alert_rules(prod_spec))
    (tmp_path / "tests.yml").write_text(
        yaml.safe_dump(promtool_tests(prod_spec, "rules.yml", cases(prod_spec)), sort_keys=False)
    )
    out = run([tool("promtool"), "test", "rules", "tests.yml"], cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_a_broken_rule_fails_its_unit_test(prod_spec: StackSpec, tmp_path: Path) -> None:
    # The runbook's HighTTFT (end-to-end latency) must fail the firing TTFT case: the unit tests
    # can tell a wrong query from a right one.
    text = alert_rules(prod_spec).replace(
        "vllm:time_to_first_token_seconds_bucket", "vllm:e2e_request_latency_seconds_bucket"
    )
    (tmp_path / "rules.yml").write_text(text)
    (tmp_path / "tests.yml").write_text(
        yaml.safe_dump(promtool_tests(prod_spec, "rules.yml", cases(prod_spec)), sort_keys=False)
    )
    out = run([tool("promtool"), "test", "rules", "tests.yml"], cwd=tmp_path)
    assert out.returncode != 0
    assert "HighTTFT: every first token between 2.5 s and 5 s" in out.stdout + out.stderr


# --- the Grafana admin password scripts ----------------------------------------------------------


def test_password_scripts_are_shellcheck_clean() -> None:
    for script in (
        grafana_password_generate_script(),
        grafana_password_store_script(),
        grafana_password_delete_script(),
    ):
        out = run([tool("shellcheck"), "-s", "bash", "-"], input=script)
        assert out.returncode == 0, out.stdout


def test_generated_password_is_created_once_private_and_deleted(tmp_path: Path) -> None:
    path = str(tmp_path / "etc" / "grafana" / "admin-password")
    owner = f"{os.getuid()}:{os.getgid()}"
    first = run(["bash", "-c", grafana_password_generate_script(path, owner)])
    second = run(["bash", "-c", grafana_password_generate_script(path, owner)])
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert re.fullmatch(r"[A-Za-z0-9_-]{32}", first.stdout)
    assert second.stdout == first.stdout  # idempotent: the password survives re-runs
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    assert run(["bash", "-c", grafana_password_delete_script(path)]).returncode == 0
    assert not os.path.exists(path) and not os.path.exists(os.path.dirname(path))
    assert run(["bash", "-c", grafana_password_delete_script(path)]).returncode == 0  # twice is fine


def test_password_scripts_run_under_dash_as_the_login_shell(tmp_path: Path) -> None:
    # remote.Command hands `create` to the login shell; on Debian/Ubuntu that may be dash, which has
    # no pipefail: wrapped in bash_command, the scripts run (and stdin still reaches the store script).
    dash = tool("dash")
    path = str(tmp_path / "grafana" / "admin-password")
    owner = f"{os.getuid()}:{os.getgid()}"
    bare = run([dash, "-c", grafana_password_store_script(path, owner)], input="from-config-password-1")
    assert bare.returncode != 0 and "pipefail" in bare.stderr
    stored = run([dash, "-c", bash_command(grafana_password_store_script(path, owner))], input="from-config-password-1")
    assert stored.returncode == 0, stored.stderr
    assert Path(path).read_text() == "from-config-password-1"
    deleted = run([dash, "-c", bash_command(grafana_password_delete_script(path))])
    assert deleted.returncode == 0 and not os.path.exists(path)
    generated = run([dash, "-c", bash_command(grafana_password_generate_script(path, owner))])
    assert generated.returncode == 0 and generated.stdout == Path(path).read_text()


def test_given_password_is_stored_from_stdin_only(tmp_path: Path) -> None:
    path = str(tmp_path / "grafana" / "admin-password")
    script = grafana_password_store_script(path, f"{os.getuid()}:{os.getgid()}")
    for _ in range(2):
        out = run(["bash", "-c", script], input="hunter2-long-password")
        assert out.returncode == 0 and out.stdout == "", out.stderr
    assert Path(path).read_text() == "hunter2-long-password"
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    assert [p.name for p in Path(path).parent.iterdir()] == ["admin-password"]  # no temp file left
