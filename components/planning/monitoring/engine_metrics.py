"""The serving metrics monitoring reads, per engine: which Prometheus job scrapes a pool's servers and what
each logical metric (generation tokens, requests running, KV cache usage, ...) is called there.

Pools whose engine and version export the same names share one group, so a stack of one engine gets one
set of alert rules and panel queries, and a mixed stack one per engine version. Monitoring builds its
rules and dashboards from these groups: no engine name appears there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from components.engines.registry import engine_for
from components.spec import StackSpec


@dataclass(frozen=True)
class ServingMetrics:
    """Pools whose servers export the same series under one Prometheus job."""

    job: str
    title: str  # the engine's name for people ("vLLM")
    names: Mapping[str, str]  # logical metric -> series
    pools: tuple[str, ...]

    def has(self, *logical: str) -> bool:
        """Whether every one of these logical metrics is exported."""
        return all(k in self.names for k in logical)

    def __getitem__(self, logical: str) -> str:
        return self.names[logical]


def serving_metrics(spec: StackSpec) -> list[ServingMetrics]:
    """One group per (job, metric names), pools in stack order."""
    groups: dict[tuple[str, tuple[tuple[str, str], ...]], list[str]] = {}
    titles: dict[str, str] = {}
    for pname, pool in spec.pools.items():
        engine = engine_for(pool)
        names = tuple(sorted(engine.metric_names(spec, pname).items()))
        groups.setdefault((engine.metrics_job, names), []).append(pname)
        titles[engine.metrics_job] = engine.title
    return [
        ServingMetrics(job, titles[job], MappingProxyType(dict(names)), tuple(pools))
        for (job, names), pools in groups.items()
    ]


def pool_metrics(spec: StackSpec, pool: str) -> ServingMetrics:
    """The group a pool's servers belong to."""
    return next(g for g in serving_metrics(spec) if pool in g.pools)


def omitted(groups: list[ServingMetrics], needs: Mapping[str, tuple[str, ...]]) -> list[str]:
    """'<alert or panel>: <engine> exports no <metric>' for each rule a group cannot have (said in the files)."""
    out = []
    for g in groups:
        for what, logical in needs.items():
            missing = [k for k in logical if k not in g.names]
            if missing:
                out.append(
                    f"{what}: {g.title} (job {g.job}, pools {', '.join(g.pools)}) exports no {' or '.join(missing)}"
                )
    return out
