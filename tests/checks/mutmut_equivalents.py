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
}
