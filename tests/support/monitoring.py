"""What the generated alert rules and dashboards query: the exporters' metric lists (tests/fixtures/metrics,
see its README.md), the metric names a PromQL expression selects, and every query of the dashboards."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components.planning.monitoring.alerts import AlertRule, alert_groups
from components.planning.monitoring.grafana import dashboards
from components.spec import StackSpec

METRICS_DIR = Path(__file__).parent.parent / "fixtures" / "metrics"


AGGREGATORS = {
    "sum",
    "avg",
    "min",
    "max",
    "count",
    "stddev",
    "stdvar",
    "topk",
    "bottomk",
    "quantile",
    "count_values",
    "group",
}
GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}
KEYWORDS = GROUPING | {"and", "or", "unless", "bool", "offset", "atan2"}
IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
NUMBER = re.compile(r"(?:[0-9]+(?:ms|[smhdwy]))+|[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?")  # durations first


def _tokens(expr: str) -> list[str]:
    """PromQL tokens; strings, label matchers `{…}` and ranges `[…]` each become one token."""
    out: list[str] = []
    i = 0
    while i < len(expr):
        c = expr[i]
        if c.isspace():
            i += 1
        elif c in "\"'`":
            j = i + 1
            while expr[j] != c:
                j += 2 if expr[j] == "\\" else 1
            out.append(expr[i : j + 1])
            i = j + 1
        elif c in "{[":
            close, j, quote = "}" if c == "{" else "]", i + 1, None
            while quote or expr[j] != close:
                if quote and expr[j] == "\\":
                    j += 1
                elif expr[j] in "\"'`":
                    quote = None if quote == expr[j] else (quote or expr[j])
                j += 1
            out.append(expr[i : j + 1])
            i = j + 1
        elif m := IDENT.match(expr, i):
            out.append(m.group())
            i = m.end()
        elif m := NUMBER.match(expr, i):
            out.append(m.group())
            i = m.end()
        else:
            out.append(c)
            i += 1
    return out


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects (functions, aggregations, keywords and labels excluded)."""
    toks = _tokens(expr)
    names: set[str] = set()
    k = 0
    while k < len(toks):
        t = toks[k]
        nxt = toks[k + 1] if k + 1 < len(toks) else ""
        if t in GROUPING and nxt == "(":
            k = toks.index(")", k)  # the label list of by/on/…
        elif IDENT.fullmatch(t) and t not in KEYWORDS and t not in AGGREGATORS and nxt != "(":
            names.add(t)
        k += 1
    return names


def dashboard_queries(spec: StackSpec) -> list[tuple[str, str, str]]:
    """(dashboard, panel title, expr) for every panel target."""
    out = []
    for fname, model in dashboards(spec).items():
        for panel in model["panels"]:
            for target in panel.get("targets", []):
                out.append((fname, panel["title"], target["expr"]))
    return out


def variable_queries(spec: StackSpec) -> list[str]:
    """The selectors inside the dashboards' `label_values(<selector>, <label>)` variables."""
    out = []
    for model in dashboards(spec).values():
        for var in model["templating"]["list"]:
            m = re.fullmatch(r"label_values\((.*),\s*\w+\)", var["query"]["query"])
            assert m, var
            out.append(m.group(1))
    return out


# --- promtool test rules: the alert unit tests (tests/test_monitoring_config.py; a real scrape in the lab) ---


@dataclass
class Case:
    """One promtool alert test: input series, an evaluation time, and the alerts expected then."""

    alert: str
    why: str
    eval_time: str
    series: list[tuple[str, str]]
    fires: list[tuple[dict[str, str], float]] = field(default_factory=list)  # (labels, $value)


def go_value(v: float) -> str:
    """A float as Go's text/template prints it (%v: shortest form, no trailing .0)."""
    s = repr(float(v))
    return s[:-2] if s.endswith(".0") else s


def render(template: str, labels: dict[str, str], value: float) -> str:
    """The templates the rules use: {{ $labels.x }}, {{ $value }}, {{ $value | printf "%.Nf" }}."""

    def one(m: re.Match[str]) -> str:
        body = m.group(1).strip()
        if body.startswith("$labels."):
            return labels[body[len("$labels.") :]]
        if body == "$value":
            return go_value(value)
        fmt = re.fullmatch(r'\$value \| printf "%\.(\d)f"', body)
        assert fmt, f"test renderer does not know {body!r}"
        return f"{value:.{fmt.group(1)}f}"

    return re.sub(r"\{\{(.*?)\}\}", one, template)


def rule_for(rules: list[AlertRule], labels: dict[str, str]) -> AlertRule:
    """The rule (of several with one alert name) whose own labels the alert carries."""
    found = [r for r in rules if r.labels.items() <= labels.items()]
    assert len(found) == 1, (labels, [r.labels for r in rules])
    return found[0]


def promtool_tests(spec: StackSpec, rules_file: str, cases: list[Case]) -> dict[str, Any]:
    """promtool's `test rules` file: one test per case, each expected alert with its rule's labels and rendered
    annotations."""
    by_alert: dict[str, list[AlertRule]] = {}
    for rs in alert_groups(spec).values():
        for r in rs:
            by_alert.setdefault(r.alert, []).append(r)
    tests = []
    for c in cases:
        exp = []
        for labels, value in c.fires:
            rule = rule_for(by_alert[c.alert], labels)
            full = {**labels, "severity": rule.severity, **rule.labels}
            exp.append(
                {
                    "exp_labels": full,
                    "exp_annotations": {
                        "summary": render(rule.summary, full, value),
                        "description": render(rule.description, full, value),
                    },
                }
            )
        tests.append(
            {
                "name": f"{c.alert}: {c.why}",
                "interval": "1m",
                "input_series": [{"series": s, "values": v} for s, v in c.series],
                "alert_rule_test": [{"eval_time": c.eval_time, "alertname": c.alert, "exp_alerts": exp}],
            }
        )
    return {"rule_files": [rules_file], "evaluation_interval": "1m", "tests": tests}
