"""Where a host-network service listens (policies/rules/bindings.py) as a table: every role's every listen
setting, in each spelling the service reads (`--flag=value`, `--flag value`, a short alias, its env), against
each wildcard and a cluster address, through the analyzer's internal-ports rule, with the whole message; and
the readers of a listen value (host, port, bracketed IPv6) on both sides."""

from __future__ import annotations

from typing import Any

import pytest

from policies.rules.bindings import (
    CLUSTER_ADDRESS,
    LISTENERS,
    Listener,
    binding_problems,
    flag_values,
    listen_host,
    listen_port,
)
from tests.support.policies import analyze

CONTAINER = "docker:index/container:Container"
NO_AUTH = "answer there without authentication"
SERVES = {
    "node-exporter": f"the host's metrics {NO_AUTH}",
    "prometheus": f"every metric, the query API and (with --web.enable-lifecycle) reload and shutdown {NO_AUTH}",
    "alertmanager-web": "its API answers there without authentication (anyone can silence alerts)",
    "alertmanager-cluster": "anyone who reaches it can join Alertmanager's HA gossip and silence alerts",
    "dcgm-exporter": f"the GPUs' metrics {NO_AUTH}",
    "grafana": "its login page and API face every network the node is on",
}
GOSSIP_OFF = ", or --cluster.listen-address= (empty) to turn gossip off: one Alertmanager needs none"
GRAFANA_PUBLIC = (
    ", or list grafana in this policy's publicRoles to serve it beyond the cluster network behind its own login"
)
# Every setting bound to the cluster address, so that a row changes one socket only.
BOUND = {
    "node-exporter": (["--web.listen-address=10.0.0.5:9100"], []),
    "prometheus": (["--web.listen-address=10.0.0.5:9090"], []),
    "alertmanager": (["--web.listen-address=10.0.0.5:9093", "--cluster.listen-address="], []),
    "dcgm-exporter": ([], ["DCGM_EXPORTER_LISTEN=10.0.0.5:9400"]),
    "grafana": ([], ["GF_SERVER_HTTP_ADDR=10.0.0.5"]),
}


def host_service(role: str, command: list[str] | None = None, envs: list[str] | None = None) -> dict[str, Any]:
    bound_command, bound_envs = BOUND[role]
    return {
        "name": role,
        "networkMode": "host",
        "restart": "unless-stopped",
        "labels": [{"label": "llm-cluster.role", "value": role}],
        "command": bound_command if command is None else command,
        "envs": bound_envs if envs is None else envs,
    }


def exposure(props: dict[str, Any]) -> list[str]:
    """internal-ports' messages for one container of no pool (without the policy's description)."""
    return [d[2].split("\n", 1)[1] for d in analyze(CONTAINER, str(props["name"]), props) if d[0] == "internal-ports"]


def opened(role: str, said: str, serves: str, fix: str) -> str:
    return (
        f"{role} on the host network listens on every interface of the node, public ones included ({said}): "
        f"{serves}. Set {fix}."
    )


@pytest.mark.parametrize(
    ("role", "command", "envs", "messages"),
    [
        # Bound to the cluster address: nothing to say.
        *[(role, None, None, []) for role in BOUND],
        # node-exporter: both spellings of its flag, each wildcard form, the port it states or its default.
        (
            "node-exporter",
            ["--web.listen-address=:9100"],
            [],
            [
                opened(
                    "node-exporter",
                    "--web.listen-address=:9100",
                    SERVES["node-exporter"],
                    f"--web.listen-address={CLUSTER_ADDRESS}:9100",
                )
            ],
        ),
        (
            "node-exporter",
            ["--web.listen-address", "0.0.0.0:9200"],
            [],
            [
                opened(
                    "node-exporter",
                    "--web.listen-address=0.0.0.0:9200",
                    SERVES["node-exporter"],
                    f"--web.listen-address={CLUSTER_ADDRESS}:9200",
                )
            ],
        ),
        (
            "node-exporter",
            ["--web.listen-address=[::]:9101"],
            [],
            [
                opened(
                    "node-exporter",
                    "--web.listen-address=[::]:9101",
                    SERVES["node-exporter"],
                    f"--web.listen-address={CLUSTER_ADDRESS}:9101",
                )
            ],
        ),
        (
            "node-exporter",
            ["--web.listen-address=*:9102"],
            [],
            [
                opened(
                    "node-exporter",
                    "--web.listen-address=*:9102",
                    SERVES["node-exporter"],
                    f"--web.listen-address={CLUSTER_ADDRESS}:9102",
                )
            ],
        ),
        # No port in the value: the service's own.
        (
            "node-exporter",
            ["--web.listen-address=0.0.0.0"],
            [],
            [
                opened(
                    "node-exporter",
                    "--web.listen-address=0.0.0.0",
                    SERVES["node-exporter"],
                    f"--web.listen-address={CLUSTER_ADDRESS}:9100",
                )
            ],
        ),
        (
            "node-exporter",
            ["--web.listen-address=[::]"],
            [],
            [
                opened(
                    "node-exporter",
                    "--web.listen-address=[::]",
                    SERVES["node-exporter"],
                    f"--web.listen-address={CLUSTER_ADDRESS}:9100",
                )
            ],
        ),
        (
            "node-exporter",
            ["--web.listen-address=:metrics"],
            [],
            [
                opened(
                    "node-exporter",
                    "--web.listen-address=:metrics",
                    SERVES["node-exporter"],
                    f"--web.listen-address={CLUSTER_ADDRESS}:9100",
                )
            ],
        ),
        (
            "node-exporter",
            ["--web.listen-address="],
            [],
            [
                opened(
                    "node-exporter",
                    '--web.listen-address=""',
                    SERVES["node-exporter"],
                    f"--web.listen-address={CLUSTER_ADDRESS}:9100",
                )
            ],
        ),
        (
            "node-exporter",
            [],
            [],
            [
                opened(
                    "node-exporter",
                    "--web.listen-address unset: the default is :9100",
                    SERVES["node-exporter"],
                    f"--web.listen-address={CLUSTER_ADDRESS}:9100",
                )
            ],
        ),
        # A bracketed address or an address is no wildcard; a flag with no value after it sets nothing.
        ("node-exporter", ["--web.listen-address=[fe80::1]:9100"], [], []),
        ("node-exporter", ["--web.listen-address", "10.0.0.5:9100"], [], []),
        ("node-exporter", ["--web.listen-address-x=0.0.0.0:9100", "--web.listen-address=10.0.0.5:9100"], [], []),
        (
            "node-exporter",
            ["--path.rootfs=/host", "--web.listen-address"],
            [],
            [
                opened(
                    "node-exporter",
                    "--web.listen-address unset: the default is :9100",
                    SERVES["node-exporter"],
                    f"--web.listen-address={CLUSTER_ADDRESS}:9100",
                )
            ],
        ),
        # Taken repeatedly: one message, for the first value that opens it.
        (
            "node-exporter",
            ["--web.listen-address=10.0.0.5:9100", "--web.listen-address=:9101", "--web.listen-address=:9102"],
            [],
            [
                opened(
                    "node-exporter",
                    "--web.listen-address=:9101",
                    SERVES["node-exporter"],
                    f"--web.listen-address={CLUSTER_ADDRESS}:9101",
                )
            ],
        ),
        # Inside a bash -c script, as the monitoring containers run some services.
        (
            "node-exporter",
            ["bash", "-c", "exec node_exporter --web.listen-address=:9100"],
            [],
            [
                opened(
                    "node-exporter",
                    "--web.listen-address=:9100",
                    SERVES["node-exporter"],
                    f"--web.listen-address={CLUSTER_ADDRESS}:9100",
                )
            ],
        ),
        (
            "prometheus",
            [],
            [],
            [
                opened(
                    "prometheus",
                    "--web.listen-address unset: the default is 0.0.0.0:9090",
                    SERVES["prometheus"],
                    f"--web.listen-address={CLUSTER_ADDRESS}:9090",
                )
            ],
        ),
        # Alertmanager: two sockets, each its own message; an empty cluster address turns gossip off.
        (
            "alertmanager",
            ["--web.listen-address=10.0.0.5:9093"],
            [],
            [
                opened(
                    "alertmanager",
                    "--cluster.listen-address unset: the default is 0.0.0.0:9094",
                    SERVES["alertmanager-cluster"],
                    f"--cluster.listen-address={CLUSTER_ADDRESS}:9094{GOSSIP_OFF}",
                )
            ],
        ),
        ("alertmanager", ["--web.listen-address=10.0.0.5:9093", "--cluster.listen-address", ""], [], []),
        (
            "alertmanager",
            ["--web.listen-address=10.0.0.5:9093", "--cluster.listen-address=[::]:9095"],
            [],
            [
                opened(
                    "alertmanager",
                    "--cluster.listen-address=[::]:9095",
                    SERVES["alertmanager-cluster"],
                    f"--cluster.listen-address={CLUSTER_ADDRESS}:9095{GOSSIP_OFF}",
                )
            ],
        ),
        (
            "alertmanager",
            ["--web.listen-address=", "--cluster.listen-address=:9094"],
            [],
            [
                opened(
                    "alertmanager",
                    '--web.listen-address=""',
                    SERVES["alertmanager-web"],
                    f"--web.listen-address={CLUSTER_ADDRESS}:9093",
                ),
                opened(
                    "alertmanager",
                    "--cluster.listen-address=:9094",
                    SERVES["alertmanager-cluster"],
                    f"--cluster.listen-address={CLUSTER_ADDRESS}:9094{GOSSIP_OFF}",
                ),
            ],
        ),
        # dcgm-exporter: its env, or its flag in either spelling, which wins over the env (urfave/cli).
        (
            "dcgm-exporter",
            [],
            ["DCGM_EXPORTER_LISTEN=:9400"],
            [
                opened(
                    "dcgm-exporter",
                    "DCGM_EXPORTER_LISTEN=:9400",
                    SERVES["dcgm-exporter"],
                    f"DCGM_EXPORTER_LISTEN={CLUSTER_ADDRESS}:9400 in its env",
                )
            ],
        ),
        (
            "dcgm-exporter",
            [],
            [],
            [
                opened(
                    "dcgm-exporter",
                    "DCGM_EXPORTER_LISTEN unset: the default is :9400",
                    SERVES["dcgm-exporter"],
                    f"DCGM_EXPORTER_LISTEN={CLUSTER_ADDRESS}:9400 in its env",
                )
            ],
        ),
        (
            "dcgm-exporter",
            [],
            ["DCGM_EXPORTER_LISTEN="],
            [
                opened(
                    "dcgm-exporter",
                    'DCGM_EXPORTER_LISTEN=""',
                    SERVES["dcgm-exporter"],
                    f"DCGM_EXPORTER_LISTEN={CLUSTER_ADDRESS}:9400 in its env",
                )
            ],
        ),
        (
            "dcgm-exporter",
            ["-a", ":9401"],
            ["DCGM_EXPORTER_LISTEN=10.0.0.5:9400"],
            [opened("dcgm-exporter", "-a :9401", SERVES["dcgm-exporter"], f"-a {CLUSTER_ADDRESS}:9401")],
        ),
        (
            "dcgm-exporter",
            ["--address", "0.0.0.0:9402"],
            ["DCGM_EXPORTER_LISTEN=10.0.0.5:9400"],
            [
                opened(
                    "dcgm-exporter",
                    "--address=0.0.0.0:9402",
                    SERVES["dcgm-exporter"],
                    f"--address={CLUSTER_ADDRESS}:9402",
                )
            ],
        ),
        ("dcgm-exporter", ["--address=10.0.0.5:9400"], ["DCGM_EXPORTER_LISTEN=:9400"], []),
        # An assignment in what it runs sets the variable over the container's env; a flag still wins over it.
        (
            "dcgm-exporter",
            ["bash", "-c", "DCGM_EXPORTER_LISTEN=:9400 exec dcgm-exporter"],
            ["DCGM_EXPORTER_LISTEN=10.0.0.5:9400"],
            [
                opened(
                    "dcgm-exporter",
                    "DCGM_EXPORTER_LISTEN=:9400",
                    SERVES["dcgm-exporter"],
                    f"DCGM_EXPORTER_LISTEN={CLUSTER_ADDRESS}:9400 in its env",
                )
            ],
        ),
        (
            "dcgm-exporter",
            ["env", "DCGM_EXPORTER_LISTEN=10.0.0.5:9400", "dcgm-exporter"],
            ["DCGM_EXPORTER_LISTEN=:9400"],
            [],
        ),
        ("dcgm-exporter", ["--address=10.0.0.5:9400", "DCGM_EXPORTER_LISTEN=:9400"], [], []),
        # Its name alone is no assignment, nor is it a flag.
        ("dcgm-exporter", ["DCGM_EXPORTER_LISTEN", ":9400"], ["DCGM_EXPORTER_LISTEN=10.0.0.5:9400"], []),
        # Grafana: an address without a port, the port its own setting.
        (
            "grafana",
            [],
            [],
            [
                opened(
                    "grafana",
                    "GF_SERVER_HTTP_ADDR unset: the default is every interface",
                    SERVES["grafana"],
                    f"GF_SERVER_HTTP_ADDR={CLUSTER_ADDRESS} in its env{GRAFANA_PUBLIC}",
                )
            ],
        ),
        (
            "grafana",
            [],
            ["GF_SERVER_HTTP_ADDR=[::]"],
            [
                opened(
                    "grafana",
                    "GF_SERVER_HTTP_ADDR=[::]",
                    SERVES["grafana"],
                    f"GF_SERVER_HTTP_ADDR={CLUSTER_ADDRESS} in its env{GRAFANA_PUBLIC}",
                )
            ],
        ),
        (
            "grafana",
            [],
            ["GF_SERVER_HTTP_ADDR=*"],
            [
                opened(
                    "grafana",
                    "GF_SERVER_HTTP_ADDR=*",
                    SERVES["grafana"],
                    f"GF_SERVER_HTTP_ADDR={CLUSTER_ADDRESS} in its env{GRAFANA_PUBLIC}",
                )
            ],
        ),
        ("grafana", [], ["GF_SERVER_HTTP_ADDR=::1"], []),
        (
            "grafana",
            ["bash", "-c", "GF_SERVER_HTTP_ADDR= exec grafana server"],
            ["GF_SERVER_HTTP_ADDR=10.0.0.5"],
            [
                opened(
                    "grafana",
                    'GF_SERVER_HTTP_ADDR=""',
                    SERVES["grafana"],
                    f"GF_SERVER_HTTP_ADDR={CLUSTER_ADDRESS} in its env{GRAFANA_PUBLIC}",
                )
            ],
        ),
    ],
)
def test_every_listen_setting_in_every_spelling(
    role: str, command: list[str] | None, envs: list[str] | None, messages: list[str]
) -> None:
    assert exposure(host_service(role, command, envs)) == messages


def test_a_role_the_rule_does_not_know_and_a_bridge_network_have_nothing_to_bind() -> None:
    assert binding_problems("ray-head", ["--web.listen-address=:9100"], {"DCGM_EXPORTER_LISTEN": ":9400"}) == []
    assert exposure({**host_service("node-exporter", [], []), "networkMode": "bridge"}) == []


def test_a_listener_without_a_default_or_a_port(monkeypatch: pytest.MonkeyPatch) -> None:
    # A service that will not start without the setting opens nothing when it is absent; one whose port is
    # unknown is told to add one.
    required = Listener("--listen", None, None, "its API answers")
    monkeypatch.setitem(LISTENERS, "toy", (required,))
    assert binding_problems("toy", [], {}) == []
    assert binding_problems("toy", ["--listen", "0.0.0.0"], {}) == [
        opened("toy", "--listen=0.0.0.0", "its API answers", f"--listen={CLUSTER_ADDRESS}:<port>")
    ]
    assert binding_problems("toy", ["--listen", "0.0.0.0:81"], {}) == [
        opened("toy", "--listen=0.0.0.0:81", "its API answers", f"--listen={CLUSTER_ADDRESS}:81")
    ]
    # A setting the service requires, absent: the role's next socket is still judged.
    second = Listener("--second", ":83", 83, "its second API answers")
    monkeypatch.setitem(LISTENERS, "toy", (required, second))
    assert binding_problems("toy", [], {}) == [
        opened("toy", "--second unset: the default is :83", "its second API answers", f"--second={CLUSTER_ADDRESS}:83")
    ]
    env = Listener("TOY_ADDR", None, 82, "its API answers")
    monkeypatch.setitem(LISTENERS, "toy", (env,))
    assert binding_problems("toy", ["--listen=0.0.0.0"], {}) == []
    assert binding_problems("toy", [], {"TOY_ADDR": ""}) == [
        opened("toy", 'TOY_ADDR=""', "its API answers", f"TOY_ADDR={CLUSTER_ADDRESS}:82 in its env")
    ]


@pytest.mark.parametrize(
    ("argv", "flags", "found"),
    [
        (["--a=1", "--b", "2", "--a", "3"], ("--a",), [("--a", "1"), ("--a", "3")]),
        (["--a=1", "--b", "2"], ("--a", "--b"), [("--a", "1"), ("--b", "2")]),
        (["--a"], ("--a",), []),
        (["--a", "x", "--a"], ("--a",), [("--a", "x")]),
        (["--a=x=y"], ("--a",), [("--a", "x=y")]),
        (["--ab=1", "-a", "2"], ("--a",), []),
        (["--a="], ("--a",), [("--a", "")]),
    ],
)
def test_flag_values(argv: list[str], flags: tuple[str, ...], found: list[tuple[str, str]]) -> None:
    assert flag_values(argv, flags) == found


@pytest.mark.parametrize(
    ("value", "host_only", "host", "port"),
    [
        ("[::]:9090", False, "::", 9090),
        ("[::1]:9090", False, "::1", 9090),
        ("[::", False, "::", None),
        ("[::1]", False, "::1", None),
        (":9100", False, "", 9100),
        ("0.0.0.0:9090", False, "0.0.0.0", 9090),
        ("10.0.0.1", False, "10.0.0.1", None),
        ("10.0.0.1:", False, "10.0.0.1", None),
        ("host:http", False, "host", None),
        ("a:b:9000", False, "a:b", 9000),
        ("[::]", True, "::", None),
        ("X", True, "X", None),
        ("[::1]9100", False, "::1", None),
        ("[2001:db8::9100]", False, "2001:db8::9100", None),
        ("10.0.0.1", True, "10.0.0.1", None),
        ("", False, "", None),
    ],
)
def test_listen_host_and_port(value: str, host_only: bool, host: str, port: int | None) -> None:
    assert (listen_host(value, host_only), listen_port(value)) == (host, port)


@pytest.mark.parametrize(
    ("ip", "published"),
    [
        ("", True),
        ("0.0.0.0", True),
        ("::", True),
        ("[::]", True),
        ("*", True),
        ("10.0.0.5", False),
        ("::1", False),
        ("[fe80::1]", False),
    ],
)
def test_a_port_published_on_every_interface(ip: str, published: bool) -> None:
    # A published port's ip is a bare address, IPv6 with or without brackets.
    props = {
        "name": "web",
        "restart": "always",
        "image": "nginx:1.27",
        "ports": [{"internal": 8000.0, "external": 8000.0, "ip": ip}],
    }
    assert exposure(props) == (
        [
            "port 8000 of a unlabelled container is published on every interface: vLLM, Ray and metrics ports serve "
            "without authentication. Publish it on the node's cluster address (ports[].ip) or drop it and let the "
            "gateway/Prometheus reach it over the cluster network."
        ]
        if published
        else []
    )
