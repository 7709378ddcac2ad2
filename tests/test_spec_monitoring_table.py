"""The monitoring section's secrets, every combination: monitoring on or off, Alertmanager set or not, the
secret alertmanagerConfig given or not; each refusal with its exact message naming the key."""

from __future__ import annotations

import pytest

from components.planning.load import load_stack_config
from components.spec import SpecError
from components.spec.monitoring import monitoring_issues
from tests.conftest import prod_config

NS = "llm-cluster:"
ALERTMANAGER = {"image": "prom/alertmanager:v0.27.0", "port": 9093}


@pytest.mark.parametrize(
    ("monitoring", "alertmanager", "secret", "issues"),
    [
        (True, False, False, []),
        (True, True, True, []),
        (
            True,
            True,
            False,
            [
                "monitoring.alertmanager: needs the secret alertmanagerConfig holding alertmanager.yml "
                "(pulumi config set --secret alertmanagerConfig < alertmanager.yml)"
            ],
        ),
        (
            True,
            False,
            True,
            [
                "monitoring.alertmanager: is unset but the secret alertmanagerConfig is given; set "
                "monitoring.alertmanager (image and port) to deploy Alertmanager"
            ],
        ),
        (False, False, False, []),
        (
            False,
            False,
            True,
            [
                "alertmanagerConfig: is set but monitoring is not configured; add monitoring.alertmanager (image "
                "and port) or remove the secret"
            ],
        ),
    ],
)
def test_alertmanager_and_its_secret(monitoring: bool, alertmanager: bool, secret: bool, issues: list[str]) -> None:
    config = prod_config()
    if not monitoring:
        del config[NS + "monitoring"]
    elif alertmanager:
        config[NS + "monitoring"]["alertmanager"] = ALERTMANAGER
    secrets: set[str] = set()
    if secret:
        config[NS + "alertmanagerConfig"] = "route: {receiver: x}\nreceivers: [{name: x}]\n"
        secrets.add(NS + "alertmanagerConfig")
    if not issues:
        spec = load_stack_config(config, secrets)
        assert monitoring_issues(spec) == []
        assert (spec.monitoring is not None and spec.monitoring.alertmanager is not None) == alertmanager
        return
    with pytest.raises(SpecError) as err:
        load_stack_config(config, secrets)
    assert [str(i) for i in err.value.issues] == issues
