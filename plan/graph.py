"""The deployment graph at component level: Mermaid and Graphviz text, an SVG when `dot` is installed."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from plan.harness import Registration


@dataclass(frozen=True)
class ComponentGraph:
    """Components (urn -> label) and prerequisite -> dependent edges between them."""

    nodes: dict[str, str]
    kinds: dict[str, str]
    edges: list[tuple[str, str]]


def component_graph(registrations: list[Registration]) -> ComponentGraph:
    """Fold every resource's dependencies onto the components that own the resources."""
    by_urn = {r.urn: r for r in registrations}

    def owner(urn: str) -> str | None:
        r = by_urn.get(urn)
        while r is not None and r.custom:
            r = by_urn.get(r.parent)
        return r.urn if r is not None else None

    nodes = {r.urn: r.name for r in registrations if not r.custom}
    kinds = {r.urn: r.type.split(":")[-1] for r in registrations if not r.custom}
    edges: set[tuple[str, str]] = set()
    for r in registrations:
        me = owner(r.urn)
        for dep in set(r.dependencies) | {d for ds in r.property_dependencies.values() for d in ds}:
            other = owner(dep)
            if me and other and other != me and not _is_ancestor(by_urn, other, me):
                edges.add((other, me))
    return ComponentGraph(nodes, kinds, sorted(edges))


def _is_ancestor(by_urn: dict[str, Registration], maybe: str, urn: str) -> bool:
    r = by_urn.get(urn)
    while r is not None:
        if r.parent == maybe:
            return True
        r = by_urn.get(r.parent)
    return False


def _ids(graph: ComponentGraph) -> dict[str, str]:
    return {urn: f"c{i}" for i, urn in enumerate(graph.nodes)}


def mermaid(graph: ComponentGraph) -> str:
    """Mermaid flowchart, one box per component, grouped by kind."""
    ids = _ids(graph)
    lines = ["flowchart LR"]
    for kind in dict.fromkeys(graph.kinds.values()):
        lines.append(f"  subgraph {kind}")
        for urn, label in graph.nodes.items():
            if graph.kinds[urn] == kind:
                lines.append(f'    {ids[urn]}["{label}"]')
        lines.append("  end")
    lines += [f"  {ids[a]} --> {ids[b]}" for a, b in graph.edges]
    return "\n".join(lines) + "\n"


# One fill colour per component kind, so the columns read at a glance.
_COLOURS = ["#dbe9f6", "#e3f1dc", "#fbe5c8", "#f6d5d5", "#e6dcf2", "#f2f2c9", "#d9f0ef"]


def dot(graph: ComponentGraph) -> str:
    """Graphviz digraph: one column per component kind, prerequisites on the left."""
    ids = _ids(graph)
    lines = [
        "digraph deployment {",
        "  rankdir=LR; nodesep=0.25; ranksep=1.0;",
        '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=11];',
        '  edge [color="#667788", arrowsize=0.7];',
    ]
    for n, kind in enumerate(dict.fromkeys(graph.kinds.values())):
        members = [u for u in graph.nodes if graph.kinds[u] == kind]
        colour = _COLOURS[n % len(_COLOURS)]
        lines += [f'  {ids[u]} [label="{graph.nodes[u]}\\n({kind})", fillcolor="{colour}"];' for u in members]
        lines.append("  { rank=same; " + " ".join(ids[u] for u in members) + " }")
    lines += [f"  {ids[a]} -> {ids[b]};" for a, b in graph.edges]
    return "\n".join(lines + ["}"]) + "\n"


def write_graph(graph: ComponentGraph, out_dir: Path) -> list[Path]:
    """Write graph.mmd and graph.dot, and graph.svg when Graphviz is installed; return the paths."""
    paths = [out_dir / "graph.mmd", out_dir / "graph.dot"]
    paths[0].write_text(mermaid(graph))
    paths[1].write_text(dot(graph))
    if shutil.which("dot"):
        svg = out_dir / "graph.svg"
        subprocess.run(["dot", "-Tsvg", "-o", str(svg), str(paths[1])], check=True)
        paths.append(svg)
    return paths
