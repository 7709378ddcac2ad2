"""The gateway's TLS scripts as text (the real-tool tier runs them with openssl on a host, test_gateway_day2):
the paths, names, lifetimes, renewal window, reload and undo each script writes, compared here whole or line
by line so a changed path, day count or message fails in the fast tier."""

from __future__ import annotations

import pytest

from components.planning.gateway.layout import NginxControl, reload_lines
from components.planning.gateway.tls import (
    CA_DAYS,
    CERT_DAYS,
    CERT_RENEW_DAYS,
    _indent,
    _is_ipv4,
    tls_delete_script,
    tls_from_stdin_script,
    tls_generate_script,
    tls_names,
)
from components.planning.load import load_stack_config
from components.spec import StackSpec
from tests.conftest import prod_config

NS = "llm-cluster:"
CONTROL = NginxControl(nginx="nginx -p /run/gw -c /run/gw/nginx.conf", running="test -e /run/gw/nginx.pid")


def gateway_spec(**gateway: object) -> StackSpec:
    config = prod_config()
    config[NS + "gateway"].update(gateway)
    return load_stack_config(config, set())


def indented(text: str) -> list[str]:
    return [f"  {line}" if line else line for line in text.rstrip("\n").split("\n")]


def test_lifetimes_are_the_browsers_and_a_ten_year_ca() -> None:
    assert (CERT_DAYS, CERT_RENEW_DAYS, CA_DAYS) == (397, 30, 3650)


def test_certificate_names_are_the_node_its_address_then_tls_names_once_each() -> None:
    assert tls_names(gateway_spec()) == ["gpu-01", "192.168.10.11"]
    spec = gateway_spec(tlsNames=["llm.example.com", "gpu-01", "10.0.0.5", "llm.example.com"])
    assert tls_names(spec) == ["gpu-01", "192.168.10.11", "llm.example.com", "10.0.0.5"]


def test_generate_script_paths_names_lifetimes_and_reload() -> None:
    spec = gateway_spec(tlsNames=["llm.example.com", "10.0.0.5"])
    lines = tls_generate_script(spec, root="/srv/gw keys", control=CONTROL).split("\n")
    head = [
        "#!/usr/bin/env bash",
        "# llm-cluster: the gateway's TLS certificate, signed by a private CA made on this host",
        "set -euo pipefail",
        "umask 077",
        "ca='/srv/gw keys/ca'",
        "tls='/srv/gw keys/tls'",
        "san=DNS:gpu-01,IP:192.168.10.11,DNS:llm.example.com,IP:10.0.0.5",
        'mkdir -p "$ca" "$tls"',
    ]
    assert lines[: len(head)] == head
    for line in (
        "  openssl req -x509 -newkey rsa:3072 -nodes -sha256 -days 3650 -subj '/CN=llm-cluster gateway CA (gpu-01)' \\",
        '    openssl x509 -checkend 2592000 -noout -in "$tls/cert.pem" >/dev/null &&',
        '  openssl req -newkey rsa:2048 -nodes -sha256 -subj /CN=gpu-01 -keyout "$tls/key.pem.new" \\',
        '  openssl x509 -req -sha256 -days 397 -in "$tls/req.csr" -CA "$ca/ca.pem" -CAkey "$ca/ca.key" \\',
        '  echo "gateway: new certificate for $san, valid 397 days" >&2',
        '  echo "gateway: made a private CA in $ca" >&2',
    ):
        assert line in lines, line
    # The reload runs only when the certificate was made again, indented inside that `if`, then the CA is printed.
    reload = indented(reload_lines("certificate", CONTROL))
    start = lines.index(reload[0])
    assert lines[start : start + len(reload)] == reload
    assert lines[start + len(reload) :] == ["fi", 'cat "$ca/ca.pem"', ""]


def test_generate_script_defaults_to_the_host_keys_dir_and_docker_exec() -> None:
    script = tls_generate_script(gateway_spec())
    assert "ca=/etc/llm-cluster/gateway/ca\ntls=/etc/llm-cluster/gateway/tls\n" in script
    assert "    docker exec llm-gateway nginx -c /etc/llm-gateway/nginx.conf -s reload\n" in script


def test_stdin_script_paths_messages_and_reload() -> None:
    lines = tls_from_stdin_script(root="/srv/gw", control=CONTROL).split("\n")
    assert lines[:6] == [
        "#!/usr/bin/env bash",
        "# llm-cluster: the gateway's TLS certificate and key from the stack's secrets",
        "set -euo pipefail",
        "umask 077",
        "tls=/srv/gw/tls",
        'mkdir -p "$tls"',
    ]
    for line in (
        '  echo "gateway: gatewayTlsCert must hold a PEM certificate (chain) and gatewayTlsKey its PEM private key" >&2',
        '  echo "gateway: gatewayTlsKey is not the key of the certificate in gatewayTlsCert" >&2',
        '  rm -f "$tls/names"',
    ):
        assert line in lines, line
    reload = indented(reload_lines("certificate", CONTROL))
    start = lines.index(reload[0])
    assert lines[start : start + len(reload)] == reload
    assert lines[start + len(reload) :] == ["fi", ""]
    assert "tls=/etc/llm-cluster/gateway/tls\n" in tls_from_stdin_script()


def test_delete_script_removes_the_certificate_and_the_ca_whole() -> None:
    assert tls_delete_script("/srv/gw keys") == (
        "#!/usr/bin/env bash\n# llm-cluster: remove the gateway's certificate and CA\nset -euo pipefail\n"
        "rm -rf -- '/srv/gw keys/tls' '/srv/gw keys/ca'\n"
    )
    assert tls_delete_script().endswith("rm -rf -- /etc/llm-cluster/gateway/tls /etc/llm-cluster/gateway/ca\n")


@pytest.mark.parametrize(
    ("name", "ipv4"),
    [
        ("192.168.10.11", True),
        ("0.0.0.0", True),
        ("255.255.255.255", True),
        ("256.1.1.1", False),
        ("1.2.3.256", False),
        ("1.2.3", False),
        ("1.2.3.4.5", False),
        ("a.b.c.d", False),
        ("1.2.3.x", False),
        ("gpu-01", False),
        ("llm.example.com", False),
        ("", False),
    ],
)
def test_ipv4_names_go_in_as_ip_the_rest_as_dns(name: str, ipv4: bool) -> None:
    assert _is_ipv4(name) is ipv4


@pytest.mark.parametrize(
    ("text", "block"),
    [
        ("a\nb\n", "  a\n  b"),
        ("a\n\nb", "  a\n\n  b"),  # a blank line stays blank (no trailing spaces in the script)
        ("echo x \n", "  echo x "),  # only the final newline goes, not a line's own trailing space
        ("echo X\n", "  echo X"),
    ],
)
def test_a_block_nested_in_an_if_is_indented_two_spaces(text: str, block: str) -> None:
    assert _indent(text) == block
