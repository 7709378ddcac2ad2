"""The security rules that judge one component's settings (the gateway's auth and TLS, a node's host firewall),
called directly as the analyzer calls them: every branch with its exact message, and the reason each gives for
a resource it does not judge."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from components.marks import GATEWAY, GPU_NODE
from policies.rules.security import validate_gateway, validate_gateway_tls, validate_host_firewall

CONTAINER = "docker:index/container:Container"


@dataclass
class Args:
    """What a resource validation reads of its resource, and where it says it does not apply."""

    resource_type: str
    props: dict[str, Any]
    skipped: list[str | None] = field(default_factory=list)

    def not_applicable(self, reason: str | None = None) -> None:
        self.skipped.append(reason)


def judge(rule: Any, resource_type: str, **props: Any) -> tuple[list[str | None], list[tuple[str, str | None]]]:
    """(the not-applicable reasons, the reports) of one rule on one resource."""
    args = Args(resource_type, props)
    reports: list[tuple[str, str | None]] = []
    rule(args, lambda message, urn: reports.append((message, urn)))
    return args.skipped, reports


NO_AUTH = (
    "gateway.auth is false: every model would be open to anyone who reaches the gateway's port. Set gateway.auth: "
    "true (keys in gateway.apiKeys, or none to have one generated on the host), or, for a lab only, lower this "
    "policy's enforcement level."
)
NO_KEY = (
    "no API key: with auth required and no key, the gateway refuses every client. State gateway.apiKeys, or leave "
    "it empty to have a key generated on the host."
)


@pytest.mark.parametrize(
    ("props", "reports"),
    [
        ({"authRequired": True, "apiKeyIds": ["default"]}, []),
        ({"authRequired": True, "apiKeyIds": []}, [(NO_KEY, None)]),
        ({"authRequired": True}, [(NO_KEY, None)]),
        ({"authRequired": False, "apiKeyIds": ["default"]}, [(NO_AUTH, None)]),
        ({}, [(NO_AUTH, None)]),
    ],
)
def test_gateway_auth_and_keys(props: dict[str, Any], reports: list[tuple[str, str | None]]) -> None:
    assert judge(validate_gateway, GATEWAY, **props) == ([], reports)


def clear(keys: str, port: int) -> str:
    return (
        f"gateway.tls is false: {keys} cross the network in clear on port {port}. Leave gateway.tls at true (a "
        "certificate from gatewayTlsCert/gatewayTlsKey, or one made on the gateway host with its CA as the output "
        "gatewayCaCert)."
    )


def redirect(keys: str, port: int) -> str:
    return (
        f"gateway.httpRedirectPort {port} answers plain HTTP: a client that sends its request there has sent its "
        f"{keys} in clear before it is redirected. Unset it unless clients need the redirect."
    )


@pytest.mark.parametrize(
    ("props", "reports"),
    [
        ({"tls": True, "authRequired": True, "port": 443}, []),
        ({"tls": True, "authRequired": True, "port": 443, "httpRedirectPort": None}, []),
        ({"tls": False, "authRequired": True, "port": 80}, [(clear("API keys and prompts", 80), None)]),
        ({"tls": False, "authRequired": False, "port": 8080.0}, [(clear("prompts and answers", 8080), None)]),
        ({"tls": False, "authRequired": True}, [(clear("API keys and prompts", 0), None)]),
        (
            {"tls": True, "authRequired": True, "port": 443, "httpRedirectPort": 80.0},
            [(redirect("API keys and prompts", 80), None)],
        ),
        (
            {"tls": True, "authRequired": False, "port": 443, "httpRedirectPort": 8081},
            [(redirect("prompts and answers", 8081), None)],
        ),
        # Without TLS the whole port is in clear: one report, not a second for the redirect.
        (
            {"tls": False, "authRequired": True, "port": 80, "httpRedirectPort": 81},
            [(clear("API keys and prompts", 80), None)],
        ),
    ],
)
def test_gateway_tls_and_the_plain_redirect(props: dict[str, Any], reports: list[tuple[str, str | None]]) -> None:
    assert judge(validate_gateway_tls, GATEWAY, **props) == ([], reports)


def unmanaged(node: str, ports: str) -> str:
    return (
        f"firewall.managed is false: node {node} relies on your own firewall. Ray's GCS, dashboard and client ports "
        f"run code for anyone who reaches them; let only the cluster's nodes reach TCP {ports} (keep SSH and the "
        "gateway open), or set firewall.managed: true."
    )


@pytest.mark.parametrize(
    ("props", "reports"),
    [
        ({"node": "gpu-01", "firewallClosedPorts": [6379]}, []),  # managed unless it says otherwise
        ({"node": "gpu-01", "firewallManaged": True, "firewallClosedPorts": [6379]}, []),
        (
            {"node": "gpu-04", "firewallManaged": False, "firewallClosedPorts": [6379, 8265, 10001.0]},
            [(unmanaged("gpu-04", "6379, 8265, 10001.0"), None)],
        ),
        ({"node": "gpu-05", "firewallManaged": False}, [(unmanaged("gpu-05", ""), None)]),
    ],
)
def test_host_firewall_left_to_the_operator_names_the_ports(
    props: dict[str, Any], reports: list[tuple[str, str | None]]
) -> None:
    assert judge(validate_host_firewall, GPU_NODE, **props) == ([], reports)


@pytest.mark.parametrize(
    ("rule", "resource_type", "reason"),
    [
        (validate_gateway, CONTAINER, "not a gateway"),
        (validate_gateway, GPU_NODE, "not a gateway"),
        (validate_gateway_tls, CONTAINER, "not a gateway"),
        (validate_host_firewall, GATEWAY, "not a GPU node"),
        (validate_host_firewall, CONTAINER, "not a GPU node"),
    ],
)
def test_each_rule_says_why_it_does_not_judge_another_resource(rule: Any, resource_type: str, reason: str) -> None:
    # Props that would be reported if the rule judged them: nothing is, and the reason is given once.
    props = {"authRequired": False, "tls": False, "firewallManaged": False, "node": "gpu-01"}
    assert judge(rule, resource_type, **props) == ([reason], [])
