"""Where host-network services listen: per role, the flag or env that binds each socket, its default, the fix.

A container on the host network has no port mapping between its sockets and the node's interfaces:
a service that listens on 0.0.0.0, [::] or "" is reachable on every interface of the node, public
ones included. These services answer without authentication (metrics, Prometheus' query and
lifecycle API, Alertmanager's gossip), so each must bind the node's cluster address. Defaults are
the images' own (node-exporter/Prometheus/Alertmanager flags, dcgm-exporter's urfave/cli flag and
env, Grafana's [server] http_addr); Ray's GCS and raylet ports are not here: Ray 2.x has no flag
that binds them to one address (see policies/README.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

CLUSTER_ADDRESS = "<the node's cluster address>"
WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "*"})


@dataclass(frozen=True)
class Listener:
    """One listening socket of a service and the setting that binds it."""

    setting: str
    """The flag (starts with -) or env name that sets the address."""
    default: str | None
    """What the service binds when the setting is absent; None: the service requires it (no start, no exposure)."""
    port: int | None
    """The port the fix suggests when the value states none."""
    serves: str
    """What an outsider gets there (the message's middle clause)."""
    aliases: tuple[str, ...] = ()
    """Further flags that set the same address; a flag wins over the env, as in urfave/cli."""
    host_only: bool = False
    """The value is an address without a port (GF_SERVER_HTTP_ADDR; the port is another setting)."""
    may_be_empty: bool = False
    """An empty value turns the listener off (Alertmanager's --cluster.listen-address=)."""
    alternative: str = ""
    """A second way out, appended to the fix."""

    @property
    def is_env(self) -> bool:
        """Whether the setting is an environment variable rather than a flag."""
        return not self.setting.startswith("-")


_NO_AUTH = "answer there without authentication"
LISTENERS: dict[str, tuple[Listener, ...]] = {
    "node-exporter": (Listener("--web.listen-address", ":9100", 9100, f"the host's metrics {_NO_AUTH}"),),
    "prometheus": (
        Listener(
            "--web.listen-address",
            "0.0.0.0:9090",
            9090,
            f"every metric, the query API and (with --web.enable-lifecycle) reload and shutdown {_NO_AUTH}",
        ),
    ),
    "alertmanager": (
        Listener(
            "--web.listen-address",
            ":9093",
            9093,
            "its API answers there without authentication (anyone can silence alerts)",
        ),
        Listener(
            "--cluster.listen-address",
            "0.0.0.0:9094",
            9094,
            "anyone who reaches it can join Alertmanager's HA gossip and silence alerts",
            may_be_empty=True,
            alternative=", or --cluster.listen-address= (empty) to turn gossip off: one Alertmanager needs none",
        ),
    ),
    "dcgm-exporter": (
        Listener("DCGM_EXPORTER_LISTEN", ":9400", 9400, f"the GPUs' metrics {_NO_AUTH}", aliases=("-a", "--address")),
    ),
    "grafana": (
        Listener(
            "GF_SERVER_HTTP_ADDR",
            "",
            None,
            "its login page and API face every network the node is on",
            host_only=True,
            alternative=", or list grafana in this policy's publicRoles to serve it beyond the "
            "cluster network behind its own login",
        ),
    ),
}


def flag_values(argv: list[str], flags: tuple[str, ...]) -> list[tuple[str, str]]:
    """Every (flag, value) of these flags in an argv, `--flag=value` or `--flag value`, in order."""
    found = []
    for i, token in enumerate(argv):
        name, eq, value = token.partition("=")
        if name in flags and eq:
            found.append((name, value))
        elif token in flags and i + 1 < len(argv):
            found.append((token, argv[i + 1]))
    return found


def listen_host(value: str, host_only: bool) -> str:
    """The address part of a listen value: '[::]:9090' -> '::', ':9100' -> '', '10.0.0.1' (host only) as is."""
    if host_only:
        return value.strip("[]")
    if value.startswith("["):
        return value[1 : value.index("]")] if "]" in value else value[1:]
    host, sep, _ = value.rpartition(":")
    return host if sep else value


def every_interface(address: str) -> bool:
    """Whether a bind address (bare, or in brackets) is the wildcard or empty: every interface of the node."""
    return listen_host(address, host_only=True) in WILDCARD_HOSTS


def listen_port(value: str) -> int | None:
    """The port of a `host:port` listen value, None when it has none."""
    # A bracketed IPv6 address's colons come before its `]`: a port is digits after the last colon only.
    _, sep, port = value.rpartition(":")
    return int(port) if sep and port.isdigit() else None


def _written(name: str, value: str) -> str:
    """A setting as it is written: `--flag=value`, `-f value`, `NAME=value` ("" when empty)."""
    joiner = " " if name.startswith("-") and not name.startswith("--") else "="
    shown = value or '""'
    return f"{name}{joiner}{shown}"


def _fix(listener: Listener, name: str, port: int | None) -> str:
    """The setting that opened the socket (a flag wins over the env) written with the value to use."""
    value = CLUSTER_ADDRESS if listener.host_only else f"{CLUSTER_ADDRESS}:{port if port else '<port>'}"
    return _written(name, value) + (" in its env" if not name.startswith("-") else "")


def binding_problems(role: str, argv: list[str], env: Mapping[str, str]) -> list[str]:
    """Why a host-network container of this role is reachable beyond the cluster network; [] when it is not."""
    out = []
    for listener in LISTENERS.get(role, ()):
        flags = listener.aliases if listener.is_env else (listener.setting, *listener.aliases)
        stated = flag_values(argv, flags)
        if not stated and listener.is_env:
            # An assignment in what it runs (`bash -c 'GF_SERVER_HTTP_ADDR=:: grafana …'`, `env NAME=value`) sets
            # the variable over the container's env (a word: a script's own token is split into words too).
            prefix = listener.setting + "="
            stated = [
                (listener.setting, w[len(prefix) :]) for w in argv if w.startswith(prefix) and len(w.split()) == 1
            ]
            if not stated and listener.setting in env:
                stated = [(listener.setting, env[listener.setting])]
        if stated:
            checks = [
                (name, _written(name, value), value)
                for name, value in stated
                if not (listener.may_be_empty and value == "")
            ]
        elif listener.default is None:
            continue
        else:
            checks = [
                (
                    listener.setting,
                    f"{listener.setting} unset: the default is {listener.default or 'every interface'}",
                    listener.default,
                )
            ]
        # One message per socket: the first value that opens it (node-exporter takes the flag repeatedly).
        for name, said, value in checks:
            if listen_host(value, listener.host_only) in WILDCARD_HOSTS:
                port = listen_port(value) or listener.port  # (_fix writes none for a host-only setting)
                out.append(
                    f"{role} on the host network listens on every interface of the node, public ones "
                    f"included ({said}): {listener.serves}. Set "
                    f"{_fix(listener, name, port)}{listener.alternative}."
                )
                break
    return out
