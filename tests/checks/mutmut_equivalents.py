"""Mutants that no test can kill because they do not change behaviour, reviewed one by one: mutant name ->
(the line the mutant writes, why it is equivalent). tests/checks/mutmut_module.py sets them apart from
the score and reports an entry stale when its mutant no longer writes that line (the function changed:
review it again)."""

from __future__ import annotations

EQUIVALENT: dict[str, tuple[str, str]] = {
    # --- plan/redact.py ---------------------------------------------------------------------------------
    "plan.redact.x__found_in__mutmut_11": (
        'if isinstance(holder, dict) and parent.rsplit(".", )[-1] in ENV_MAPS and SECRET_ENV.search(key) and _literal(text):',
        "rsplit's last piece is the same whatever the split count",
    ),
    "plan.redact.x__found_in__mutmut_14": (
        'if isinstance(holder, dict) and parent.rsplit(".", 2)[-1] in ENV_MAPS and SECRET_ENV.search(key) and _literal(text):',
        "rsplit's last piece is the same whatever the split count",
    ),
    "plan.redact.x__found_in__mutmut_36": (
        'if isinstance(holder, list) or path.endswith("]"):',
        "_walk gives a path ending in ] exactly when the holder is a list, so or and and agree",
    ),
    "plan.redact.x__flag_values__mutmut_4": (
        'words = [v if isinstance(v, str) else "XXXX" for v in holder]',
        "a non-string item stands in as a word that is no flag either way; only strings are redacted",
    ),
    "plan.redact.xǁRedactorǁdata__mutmut_1": (
        'def data(self, value: Any, key: str = "XXXX", parent: str = "") -> Any:',
        "the defaults reach the env check only with parent '', which is no env map whatever the key",
    ),
    "plan.redact.xǁRedactorǁdata__mutmut_2": (
        'def data(self, value: Any, key: str = "", parent: str = "XXXX") -> Any:',
        "'XXXX' is no env map name, as '' is not",
    ),
    # --- plan/diff.py -----------------------------------------------------------------------------------
    "plan.diff.x__top__mutmut_4": (
        'return path.split(".", 1)[0].split("[", )[0]',
        "the first piece is the same whatever the split count",
    ),
    "plan.diff.x__top__mutmut_5": (
        'return path.split(".", 1)[0].rsplit("[", 1)[0]',
        "a path's first segment holds at most one [ (_diff_values indexes only lists of objects)",
    ),
    "plan.diff.x__top__mutmut_9": (
        'return path.split(".", )[0].split("[", 1)[0]',
        "the first piece is the same whatever the split count",
    ),
    "plan.diff.x__top__mutmut_12": (
        'return path.split(".", 2)[0].split("[", 1)[0]',
        "the first piece is the same whatever the split count",
    ),
    "plan.diff.x__top__mutmut_15": (
        'return path.split(".", 1)[0].split("[", 2)[0]',
        "the first piece is the same whatever the split count",
    ),
    "plan.diff.x_diff_resources__mutmut_77": (
        'change.changes = _diff_values(prev.get("inputs") or {}, r.get("inputs") or {}, None)',
        "_diff_values treats a false path (None as '') as the root",
    ),
    "plan.diff.x_diff_resources__mutmut_121": (
        'name = _key(via[0]).rsplit("::", )[-1]',
        "rsplit's last piece is the same whatever the split count",
    ),
    "plan.diff.x_diff_resources__mutmut_126": (
        'name = _key(via[0]).rsplit("::", 2)[-1]',
        "rsplit's last piece is the same whatever the split count",
    ),
    "plan.diff.x_diff_resources__mutmut_127": (
        'name = _key(via[0]).rsplit("::", 1)[+1]',
        "a key is project::type::name, so one rsplit gives two pieces and [1] is [-1]",
    ),
    "plan.diff.x_diff_resources__mutmut_158": (
        'with_ = [_key(u).rsplit("::", )[-1] for u in options.get("replaceWith") or [] if _key(u) in replaced]',
        "rsplit's last piece is the same whatever the split count",
    ),
    "plan.diff.x_diff_resources__mutmut_162": (
        'with_ = [_key(u).rsplit("::", 2)[-1] for u in options.get("replaceWith") or [] if _key(u) in replaced]',
        "rsplit's last piece is the same whatever the split count",
    ),
    "plan.diff.x_diff_resources__mutmut_163": (
        'with_ = [_key(u).rsplit("::", 1)[+1] for u in options.get("replaceWith") or [] if _key(u) in replaced]',
        "a key is project::type::name, so one rsplit gives two pieces and [1] is [-1]",
    ),
    # --- components/planning/gateway ---------------------------------------------------------------------
    "components.planning.gateway.upstreams.x_server_keepalive_seconds__mutmut_5": (
        "value = env.get(server.keepalive_env) if (server.keepalive_env) or True else None",
        "a pool's env has string keys, so env.get(None) is None, as the else gives",
    ),
    # --- components/spec ---------------------------------------------------------------------------------
    "components.spec.topology.x_instances__mutmut_36": (
        "if span > 2 or pool.replicas_per_node == 1:",
        "the two differ only at span 2 with replicasPerNode > 1, which check_pools refuses (replicas of an "
        "instance spanning nodes) before any instance is planned",
    ),
    "components.spec.topology.x_host_ports__mutmut_9": (
        "elif inst.native_launcher or inst.master_port is not None:",
        "an instance has a master port only from a native launcher across nodes (Launcher.port), so or and and agree",
    ),
    "components.spec.topology.x_resource_suffix__mutmut_16": (
        'return "".join(c if c.isalnum() else "-" for c in last.lower()).strip("XX-XX")',
        "the text is lowercased first: no X is left for strip to take, only the dashes",
    ),
    "components.spec.models.x_model_architecture__mutmut_14": (
        'path = Path(m.config_json or "XXXX")',
        "the branch runs only without arch, and ModelSpec takes exactly one of arch or configJson: the fallback "
        "is for the type checker, never read",
    ),
}
