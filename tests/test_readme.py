"""The README's stack-key table is the spec: every section, every key, nested keys where they nest."""

from __future__ import annotations

import os
import re
import types
import typing
from pathlib import Path
from typing import Any

from components.engines.registry import ENGINES  # noqa: F401  (registers the engines' options blocks)
from components.spec import SECRET_KEYS, PoolSpec, StackSpec
from components.spec.base import Spec
from components.spec.engines import deployed
from tests.conftest import ROOT

README = (ROOT / "README.md").read_text()


def _model_in(annotation: Any) -> tuple[type[Spec] | None, str]:
    """The Spec model an annotation holds (directly, optional, a map's values or a list's items) and how."""
    if isinstance(annotation, type) and issubclass(annotation, Spec):
        return annotation, ""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return next(((m, k) for m, k in map(_model_in, args) if m is not None), (None, ""))
    if origin is dict and args and _model_in(args[1])[0] is not None:
        return _model_in(args[1])[0], "map"
    if origin is list and args and _model_in(args[0])[0] is not None:
        return _model_in(args[0])[0], "list"
    return None, ""


def spec_keys(model: type[Spec]) -> dict[str, Any]:
    """key -> None for a value, or the nested keys of an object (or of each list item)."""
    out: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        if field.exclude:
            continue
        nested, _ = _model_in(field.annotation)
        out[field.alias or name] = spec_keys(nested) if nested is not None else None
    if model is PoolSpec:  # each deployed engine's options block, registered by the engine
        for engine in deployed().values():
            out[engine.options_key] = spec_keys(engine.options_model)
    return out


def parse_keys(text: str) -> dict[str, Any]:
    """`a`, `b {c, d}`, `e [{f, g {h}}]` (the README's notation) -> {a: None, b: {c, d}, e: {f, g: {h}}}."""
    out: dict[str, Any] = {}
    i, text = 0, text.strip()
    while i < len(text):
        m = re.compile(r"\s*([A-Za-z0-9]+)\s*").match(text, i)
        assert m, f"cannot read a key at {text[i:]!r}"
        name, i = m.group(1), m.end()
        if text.startswith(("{", "[{"), i):
            opener = "[{" if text.startswith("[{", i) else "{"
            depth, j = 0, i + len(opener) - 1  # at the brace
            while True:
                depth += text[j] == "{"
                depth -= text[j] == "}"
                j += 1
                if depth == 0:
                    break
            out[name] = parse_keys(text[i + len(opener) : j - 1])
            i = j + (1 if opener == "[{" else 0)
        else:
            out[name] = None
        i = text.find(",", i) + 1 if text.find(",", i) >= 0 else len(text)
    return out


def readme_table() -> dict[str, dict[str, Any]]:
    """section -> its keys, from the rows `| \\`section\\` | \\`key\\`, … | notes |` of the stack-file table."""
    rows = re.findall(
        r"^\| `([A-Za-z]+)` \| (`.*?`) \| .* \|$", README.split("## The stack file")[1].split("\n## ")[0], re.M
    )
    return {section: parse_keys(", ".join(re.findall(r"`([^`]+)`", keys))) for section, keys in rows}


def test_the_stack_key_table_lists_exactly_the_specs_keys() -> None:
    table = readme_table()
    sections = {f.alias: f for f in StackSpec.model_fields.values() if not f.exclude}
    assert list(table) == list(sections)
    for section, field in sections.items():
        model, _ = _model_in(field.annotation)
        assert model is not None
        assert table[section] == spec_keys(model), section


def test_the_notation_reads_nested_objects_and_lists() -> None:
    assert parse_keys("a, b {c, d}, e [{f, g {h}}], i") == {
        "a": None,
        "b": {"c": None, "d": None},
        "e": {"f": None, "g": {"h": None}},
        "i": None,
    }


def test_the_readme_names_every_secret_key() -> None:
    listed = README.split("Secrets are separate keys")[1].split("\n\n")[0]
    assert sorted(re.findall(r"`([A-Za-z]+)`", listed)) == sorted(SECRET_KEYS)


DOCS = [ROOT / "README.md", ROOT / "lab" / "README.md", *sorted((ROOT / "docs" / "perf").glob("*.md"))]


def test_the_documents_links_resolve_inside_the_repository() -> None:
    """Every relative link of the README, lab/README.md and docs/perf names a file of the repository."""
    for doc in DOCS:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text()):
            if re.match(r"[a-z]+://", target):
                continue
            path = (doc.parent / target).resolve()
            assert path.is_relative_to(ROOT) and path.exists(), f"{doc.relative_to(ROOT)}: {target}"


def test_the_readme_links_every_performance_topic_and_the_index_lists_it() -> None:
    """The measurements live in docs/perf: each topic file is linked from the README and listed in the index."""
    topics = sorted(p.name for p in (ROOT / "docs" / "perf").glob("*.md") if p.name != "README.md")
    assert topics, "docs/perf has no topic file"
    index = (ROOT / "docs" / "perf" / "README.md").read_text()
    for name in topics:
        assert f"(docs/perf/{name})" in README, name
        assert f"]({name})" in index, name


def test_nothing_points_at_notes_outside_the_repository() -> None:
    """A fact's source is a public URL or a file of the repository, never the team's shared notes."""
    outside = re.compile(r"shared/reference|\.\./shared/|VOLTA-ENGINES|VLLM-VOLTA")
    skip = {".git", ".venv", ".venv-loadtest", "build", "mutants", "node_modules", "__pycache__", ".pytest_cache"}
    found = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in skip]
        for name in files:
            path = Path(folder) / name
            if (
                path.suffix not in {".py", ".md", ".lua", ".sh", ".yaml", ".yml", ".txt", ""}
                or path == Path(__file__).resolve()
                or path.stat().st_size > 2_000_000
            ):
                continue
            try:
                text = path.read_text()
            except (UnicodeDecodeError, OSError):
                continue
            found += [
                f"{path.relative_to(ROOT)}:{n}" for n, line in enumerate(text.splitlines(), 1) if outside.search(line)
            ]
    assert not found, found
