"""What the generated alert rules and dashboards query: the exporters' metric lists (tests/fixtures/metrics,
see its README.md), the metric names a PromQL expression selects, and every query of the dashboards."""

from __future__ import annotations

import re
from pathlib import Path

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
