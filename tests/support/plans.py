"""A stack planned twice by the CLI (`python -m plan`), the second plan's plan.json returned: the diff
the plan shows for a change."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from plan import __main__ as cli


def write_stack(path: Path, config: dict[str, Any], secure: dict[str, str] | None = None) -> Path:
    doc = {"config": {**config, **{k: {"secure": v} for k, v in (secure or {}).items()}}}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def plan_twice(tmp_path: Path, before: dict[str, Any], after: dict[str, Any], *extra: str) -> dict[str, Any]:
    """Plan `before`, then `after` as the same stack; return the second plan.json."""
    stack = tmp_path / "Pulumi.prod.yaml"
    out = tmp_path / "out"
    for config in (before, after):
        write_stack(stack, config)
        assert cli.main(["--config", str(stack), "--out", str(out), "--quiet", *extra]) in (0, 1)
    return json.loads((out / "prod" / "plan.json").read_text())
