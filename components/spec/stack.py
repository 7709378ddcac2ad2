"""The whole stack config: sections, cross-references, and loading from Pulumi config."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import Field, ValidationError

from components.facts.servers import REFERENCE_SERVER
from components.spec.base import NAME_RE, Spec, SpecError, SpecIssue, issues_from_validation_error
from components.spec.cluster import (
    FirewallSpec,
    ModelSpec,
    NcclSpec,
    NodeDefaults,
    NodeSpec,
    PoolSpec,
    PreflightSpec,
    SshSpec,
)
from components.spec.gateway import GatewaySpec
from components.spec.images import ImagesSpec
from components.spec.monitoring import MonitoringSpec, monitoring_issues
from components.spec.topology import host_ports, nodes_per_instance

NAMESPACE = "llm-cluster"

# Config keys that may only hold Pulumi secrets (`pulumi config set --secret`).
SECRET_KEYS: dict[str, str] = {
    "sshPrivateKey": "SSH private key (PEM/OpenSSH) used for every node",
    "sshPrivateKeyPassword": "passphrase of sshPrivateKey",
    "gatewayApiKeys": 'JSON object {"<key id>": "<api key>"} for the gateway',
    "gatewayTlsCert": "PEM certificate chain for the gateway's HTTPS listener",
    "gatewayTlsKey": "PEM private key for the gateway's HTTPS listener",
    "grafanaAdminPassword": "Grafana admin password (generated on the host when unset)",
    "alertmanagerConfig": "alertmanager.yml with receivers (its webhooks carry tokens)",
    "registryUsername": "user name for images.registry (the docker provider's registry auth)",
    "registryPassword": "password or token for images.registry",
}


class StackSpec(Spec):
    """Everything one `Pulumi.<stack>.yaml` states about the cluster."""

    ssh: SshSpec = SshSpec()
    node_defaults: NodeDefaults = NodeDefaults()
    nodes: dict[str, NodeSpec] = Field(min_length=1)
    nccl: NcclSpec = NcclSpec()
    models: dict[str, ModelSpec] = Field(default_factory=dict)
    pools: dict[str, PoolSpec] = Field(default_factory=dict)
    gateway: GatewaySpec | None = None
    monitoring: MonitoringSpec | None = None
    firewall: FirewallSpec = FirewallSpec()
    preflight: PreflightSpec = PreflightSpec()
    images: ImagesSpec = ImagesSpec()
    secrets: frozenset[str] = Field(default=frozenset(), exclude=True)
    """Names of the secret config keys the stack provides (values never enter the spec)."""

    def node(self, name: str) -> NodeSpec:
        """The node with nodeDefaults filled in."""
        node = self.nodes[name]
        d = self.node_defaults
        fill = {
            f: getattr(d, f)
            for f in (
                "gpu",
                "hca",
                "interface",
                "driver_min_version",
                "disk_path",
                "min_free_disk_gib",
                "memory_gib",
                "cpu_cores",
            )
            if getattr(node, f) is None
        }
        return node.model_copy(update=fill)

    def node_memory(self, name: str) -> tuple[float, str]:
        """(host RAM in GiB, the stack key that sets it) of a node: its own, nodeDefaults', else the reference
        server's (components.facts.servers), said as the key that would set it."""
        if self.nodes[name].memory_gib is not None:
            return float(self.nodes[name].memory_gib), f"nodes.{name}.memoryGib"
        if self.node_defaults.memory_gib is not None:
            return float(self.node_defaults.memory_gib), "nodeDefaults.memoryGib"
        return float(REFERENCE_SERVER.memory_gib), (
            f"nodes.{name}.memoryGib, unset: {REFERENCE_SERVER.name}' {REFERENCE_SERVER.memory_gib:g} GiB"
        )

    def node_cpus(self, name: str) -> tuple[int, str]:
        """(logical CPUs, the stack key that sets it) of a node: its own, nodeDefaults', else the reference
        server's (components.facts.servers), said as the key that would set it."""
        if self.nodes[name].cpu_cores is not None:
            return self.nodes[name].cpu_cores, f"nodes.{name}.cpuCores"
        if self.node_defaults.cpu_cores is not None:
            return self.node_defaults.cpu_cores, "nodeDefaults.cpuCores"
        return (
            REFERENCE_SERVER.cpu_cores,
            f"nodes.{name}.cpuCores, unset: {REFERENCE_SERVER.name}' {REFERENCE_SERVER.cpu_cores}",
        )

    def served_names(self, model: str) -> list[str]:
        """Names clients use for a model; the model key when none are stated."""
        return list(self.models[model].served_names) or [model]


SECTIONS = [f.alias for f in StackSpec.model_fields.values() if not f.exclude]


def _not_one_of(value: str, kind: str, known: Iterable[str]) -> str:
    """The one wording of a dangling reference: what was given, and what exists."""
    return f"{value!r} is not a {kind}; {kind}s are: {', '.join(known) or '(none)'}"


def check_names_and_nodes(s: StackSpec) -> list[SpecIssue]:
    issues: list[SpecIssue] = []
    for section, names in (("nodes", s.nodes), ("pools", s.pools), ("models", s.models)):
        for name in names:
            if not NAME_RE.match(name):
                issues.append(
                    SpecIssue(
                        f"{section}.{name}",
                        f"{name!r} is not allowed as a name: names become "
                        "container and host names, so lowercase letters, digits and '-' "
                        "(a DNS label, at most 63 characters)",
                    )
                )
    seen_addr: dict[str, str] = {}
    for name in s.nodes:
        n = s.node(name)
        if n.address in seen_addr:
            issues.append(
                SpecIssue(f"nodes.{name}.address", f"{n.address} is already the address of {seen_addr[n.address]}")
            )
        seen_addr[n.address] = name
        if n.gpu is None:
            issues.append(SpecIssue(f"nodes.{name}.gpu", "required here or in nodeDefaults (model and count)"))
        if s.ssh.host_key_checking and not n.host_key:
            issues.append(SpecIssue(f"nodes.{name}.hostKey", "required when ssh.hostKeyChecking is true"))
    return issues


def check_pools(s: StackSpec) -> list[SpecIssue]:
    issues: list[SpecIssue] = []
    owner: dict[str, str] = {}
    for pname, p in s.pools.items():
        if p.model not in s.models:
            issues.append(SpecIssue(f"pools.{pname}.model", _not_one_of(p.model, "model", s.models)))
        for i, nname in enumerate(p.nodes):
            if nname not in s.nodes:
                issues.append(SpecIssue(f"pools.{pname}.nodes[{i}]", _not_one_of(nname, "node", s.nodes)))
            elif nname in owner:
                issues.append(
                    SpecIssue(
                        f"pools.{pname}.nodes[{i}]",
                        f"{nname!r} already serves pool {owner[nname]!r}; a node belongs to at most one pool",
                    )
                )
            else:
                owner[nname] = pname
        members = [n for n in p.nodes if n in s.nodes]
        gpus = [s.node(n).gpu for n in members]
        if not members or any(g is None for g in gpus):
            continue
        if len({(g.model, g.count) for g in gpus}) > 1:
            issues.append(
                SpecIssue(
                    f"pools.{pname}.nodes",
                    "all nodes of a pool need the same GPU model and "
                    "count; got " + ", ".join(f"{n}={g.count}x{g.model}" for n, g in zip(members, gpus)),
                )
            )
            continue
        per_node = gpus[0].count
        span = nodes_per_instance(p, per_node)
        if len(p.nodes) % span:
            issues.append(
                SpecIssue(
                    f"pools.{pname}.nodes",
                    f"{len(p.nodes)} nodes do not split into instances of "
                    f"{span} node(s) (tensorParallel {p.tensor_parallel} x pipelineParallel "
                    f"{p.pipeline_parallel} on {per_node} GPUs per node); give a multiple of {span}",
                )
            )
        width = p.tensor_parallel * p.pipeline_parallel
        if p.replicas_per_node > 1 and span > 1:
            issues.append(
                SpecIssue(
                    f"pools.{pname}.replicasPerNode",
                    f"{p.replicas_per_node} replicas per node, but an instance of tensorParallel {p.tensor_parallel} x "
                    f"pipelineParallel {p.pipeline_parallel} spans {span} nodes (each pipeline stage on a node of its "
                    f"own, {per_node} GPUs per node): an instance across nodes is the only one on its nodes; give 1",
                )
            )
        elif p.replicas_per_node > 1 and width * p.replicas_per_node > per_node:
            issues.append(
                SpecIssue(
                    f"pools.{pname}.replicasPerNode",
                    f"{p.replicas_per_node} replicas x "
                    f"tensorParallel {p.tensor_parallel} x pipelineParallel {p.pipeline_parallel} "
                    f"needs more than the {per_node} GPUs of a node",
                )
            )
        if span > 1:
            for nname in members:
                for field in ("hca", "interface"):
                    if getattr(s.node(nname), field) is None:
                        issues.append(
                            SpecIssue(
                                f"nodes.{nname}.{field}",
                                f"required (here or in nodeDefaults): pool {pname!r} spans nodes",
                            )
                        )
        # /dev/shm is a tmpfs: what the pool's containers on a node may put there is RAM of that node.
        shm = p.shm_size_gib * (p.replicas_per_node if span == 1 else 1)
        for nname in members:
            ram, key = s.node_memory(nname)
            if shm > ram:
                issues.append(
                    SpecIssue(
                        f"pools.{pname}.shmSizeGib",
                        f"{p.shm_size_gib} GiB of /dev/shm per "
                        f"container{f' x {p.replicas_per_node} replicas' if shm != p.shm_size_gib else ''}"
                        f" is more than the {ram:g} GiB of RAM of node {nname} ({key}); at most "
                        f"{int(ram // (shm // p.shm_size_gib))} fits",
                    )
                )
                break
    return issues


def _served(s: StackSpec) -> dict[str, str]:
    """Served name -> model (the first model claiming it)."""
    served: dict[str, str] = {}
    for mname in s.models:
        for sn in s.served_names(mname):
            served.setdefault(sn, mname)
    return served


UNSTATED_NAME = " (the model's key, its served name while servedNames is unset)"


def check_models(s: StackSpec) -> list[SpecIssue]:
    issues: list[SpecIssue] = []
    for mname, m in s.models.items():
        if m.source.node is not None and m.source.node not in s.nodes:
            issues.append(SpecIssue(f"models.{mname}.source.node", _not_one_of(m.source.node, "node", s.nodes)))
    served = _served(s)
    for mname in s.models:
        # A model without servedNames is served by its key: that key is the one to name.
        stated = bool(s.models[mname].served_names)
        for i, sn in enumerate(s.served_names(mname)):
            if served[sn] != mname:
                issues.append(
                    SpecIssue(
                        f"models.{mname}.servedNames[{i}]" if stated else f"models.{mname}",
                        f"{sn!r}{'' if stated else UNSTATED_NAME} is already a served name of model {served[sn]!r}",
                    )
                )
    return issues


def check_gateway(s: StackSpec) -> list[SpecIssue]:
    g = s.gateway
    if g is None:
        return []
    issues: list[SpecIssue] = []
    add = lambda path, msg: issues.append(SpecIssue(path, msg))  # noqa: E731
    if g.node not in s.nodes:
        add("gateway.node", _not_one_of(g.node, "node", s.nodes))
    if g.default_pool not in s.pools:
        add("gateway.defaultPool", _not_one_of(g.default_pool, "pool", s.pools))
    for prefix, pool in g.path_routes.items():
        if pool not in s.pools:
            add(f"gateway.pathRoutes.{prefix}", _not_one_of(pool, "pool", s.pools))
    served = _served(s)
    for alias, pool in g.aliases.items():
        if pool not in s.pools:
            add(f"gateway.aliases.{alias}", _not_one_of(pool, "pool", s.pools))
        if alias in served:
            add(f"gateway.aliases.{alias}", f"{alias!r} is already a served name of model {served[alias]!r}")
    ids: set[str] = set()
    allowed = set(served) | set(s.pools) | set(g.aliases)
    for i, k in enumerate(g.api_keys):
        if k.id in ids:
            add(f"gateway.apiKeys[{i}].id", f"{k.id!r} is used by another key")
        ids.add(k.id)
        for j, mname in enumerate(k.models):
            if mname not in allowed:
                add(
                    f"gateway.apiKeys[{i}].models[{j}]",
                    f"{mname!r} names no served model, alias or pool; allowed: {', '.join(sorted(allowed))}",
                )
    if not g.auth and "gatewayApiKeys" in s.secrets:
        add(
            "gateway.auth",
            "is false but the secret gatewayApiKeys is set: the keys would never be checked; "
            "remove the secret (pulumi config rm gatewayApiKeys) or set auth: true",
        )
    tls_secrets = {"gatewayTlsCert", "gatewayTlsKey"} & s.secrets
    if len(tls_secrets) == 1:
        add(
            "gateway.tls",
            f"the secret {min(tls_secrets)} is set without its pair: set both gatewayTlsCert and "
            "gatewayTlsKey (pulumi config set --secret gatewayTlsCert < cert.pem), or neither to have a "
            "certificate made on the gateway host",
        )
    if tls_secrets and not g.tls:
        add(
            "gateway.tls", "is false but the secrets gatewayTlsCert/gatewayTlsKey are set: set tls: true or remove them"
        )
    if g.http_redirect_port is not None and not g.tls:
        add("gateway.httpRedirectPort", "redirects to HTTPS, which needs tls: true")
    if g.http_redirect_port == g.port:
        add("gateway.httpRedirectPort", f"is the gateway's own port {g.port}; pick another or leave it unset")
    return issues


def check_monitoring_and_ssh(s: StackSpec) -> list[SpecIssue]:
    issues: list[SpecIssue] = []
    if s.monitoring is not None and s.monitoring.node not in s.nodes:
        issues.append(SpecIssue("monitoring.node", _not_one_of(s.monitoring.node, "node", s.nodes)))
    issues += monitoring_issues(s)  # the engines' own thresholds follow in components.planning.load
    if not s.ssh.agent and not s.ssh.key_path and "sshPrivateKey" not in s.secrets:
        issues.append(
            SpecIssue(
                "ssh.agent",
                "is false but neither ssh.keyPath nor the secret sshPrivateKey is "
                "given: the nodes could not be reached; use the agent, a key file, or the secret key",
            )
        )
    return issues


def check_images(s: StackSpec) -> list[SpecIssue]:
    """Registry credentials come in pairs and only with a registry; tarball file names are unique."""
    given = sorted({"registryUsername", "registryPassword"} & s.secrets)
    if given and s.images.registry is None:
        return [
            SpecIssue(
                "images.registry",
                f"the secret {' and '.join(given)} is set but no registry is: state "
                "images.registry (host[:port][/prefix]) or remove the secret (pulumi config rm "
                f"{given[0]})",
            )
        ]
    if len(given) == 1:
        missing = ({"registryUsername", "registryPassword"} - set(given)).pop()
        return [
            SpecIssue(
                "images.registry",
                f"the secret {given[0]} is set without {missing}: set both "
                f"(pulumi config set --secret {missing}), or neither for a registry without auth",
            )
        ]
    return []


def check_ports(s: StackSpec) -> list[SpecIssue]:
    """Every host-network listener on a node gets its own port."""
    used: dict[str, dict[int, str]] = {n: {} for n in s.nodes}
    issues: list[SpecIssue] = []
    for node, port, key in host_ports(s):
        if port in used[node]:
            issues.append(SpecIssue(key, f"port {port} on {node} is already taken by {used[node][port]}"))
        else:
            used[node][port] = key
    return issues


def validate_sections(sections: Mapping[str, Any], secrets: frozenset[str] = frozenset()) -> StackSpec:
    """The stack's sections (YAML names: ssh, nodes, pools, …) as the model; SpecError lists every issue the
    model itself finds. The cross-section checks follow: components.planning.load.parse_stack runs them all."""
    try:
        return StackSpec.model_validate({**sections, "secrets": secrets})
    except ValidationError as err:
        raise SpecError(issues_from_validation_error(err)) from None


def secret_in_plain_config(at: str, section: str) -> SpecIssue:
    """A `secure:` value where the section is plain config (the whole section, or a value inside it): the
    program would hand it on in clear."""
    return SpecIssue(
        at,
        f"a secret is not allowed here: {section} is plain config, stated in the stack file "
        "(secrets are only " + ", ".join(f"{NAMESPACE}:{k}" for k in SECRET_KEYS) + ")",
    )


def config_sections(
    config: Mapping[str, Any], secret_keys: set[str] | frozenset[str]
) -> tuple[dict[str, Any], frozenset[str]]:
    """The sections and secret names of a Pulumi config (full keys `llm-cluster:<section>`), refusing unknown
    keys and plaintext secrets."""
    issues: list[SpecIssue] = []
    sections: dict[str, Any] = {}
    secrets: set[str] = set()
    prefix = NAMESPACE + ":"
    for full_key, raw in config.items():
        if not full_key.startswith(prefix):
            # Other namespaces are providers' (docker:host); one holding this project's key name is a typo
            # that would otherwise surface as "nodes: required key is missing".
            namespace, _, name = full_key.rpartition(":")
            if namespace and (name in SECTIONS or name in SECRET_KEYS):
                issues.append(
                    SpecIssue(
                        full_key,
                        f"the namespace {namespace!r} is not allowed: this project reads "
                        f"{prefix}{name} (its namespace is the project name, {NAMESPACE})",
                    )
                )
            continue
        key = full_key[len(prefix) :]
        if key in SECRET_KEYS:
            if full_key not in secret_keys:
                issues.append(
                    SpecIssue(
                        full_key,
                        f"must be a secret: set it with `pulumi config set --secret {key}` ({SECRET_KEYS[key]})",
                    )
                )
            secrets.add(key)
        elif key in SECTIONS:
            if full_key in secret_keys:
                # Its value is a ciphertext (plan: a placeholder): saying "not valid JSON" would hide the cause.
                issues.append(secret_in_plain_config(full_key, key))
                continue
            if isinstance(raw, str):
                # The Pulumi engine hands a structured value over as JSON text; any other text is what the
                # user wrote, and the section's model says what it should have been (a mapping).
                try:
                    raw = json.loads(raw)
                except json.JSONDecodeError:
                    pass
            sections[key] = raw
        else:
            issues.append(
                SpecIssue(
                    full_key,
                    "unknown config key; allowed: " + ", ".join(prefix + k for k in SECTIONS + sorted(SECRET_KEYS)),
                )
            )
    if issues:
        raise SpecError(issues)
    return sections, frozenset(secrets)
