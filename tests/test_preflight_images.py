"""Preflight for an air-gapped stack: dockerd trusts the private registry (images.registry), and the
tarball directory (images.tarballs) holds every image the plan loads. The real preflight script, with
a real TLS registry endpoint on loopback and scratch directories for certs.d and the tarballs."""

from __future__ import annotations

import dataclasses
import shutil
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from components.node_programs.preflight import Expectation, insecure, parse_insecure_registries, registry_tls
from components.planning.load import load_stack_config
from components.planning.nodes.scripts import node_expectation
from tests.conftest import prod_config
from tests.support import free_port
from tests.support.preflight import (
    DOCKER_OK,
    IB_ROCE,
    SMI_TABLE,
    TOPO_DGX1,
    cpuinfo,
    fixture,
    meminfo,
    query_csv_from_table,
    run_preflight,
)

LAB_DOCKER_INFO = "docker-info.debian-docker.io-20.10.24.lab-host.txt"
NS = "llm-cluster:"


def test_the_running_dockerds_insecure_registries_are_read_from_docker_info() -> None:
    entries = parse_insecure_registries(fixture(LAB_DOCKER_INFO))
    assert entries == ["ghcr.io", "nvcr.io", "198.18.0.2", "127.0.0.0/8"]
    assert insecure("198.18.0.2", entries) and not insecure("198.18.0.2:5000", entries)  # names match exactly
    assert insecure("127.0.0.1:5000", entries) and insecure("localhost:5000", entries)  # by address, as dockerd
    assert not insecure("registry.example:5000", entries)
    assert parse_insecure_registries(fixture(DOCKER_OK)) == []  # a `docker info | grep` without the section


@dataclasses.dataclass
class TlsRegistry:
    """A TLS endpoint on loopback with a certificate for 127.0.0.1 from a CA of its own (openssl)."""

    address: str
    ca: Path
    other_ca: Path


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def _make_ca(root: Path, name: str) -> tuple[Path, Path]:
    key, crt = root / f"{name}.key", root / f"{name}.crt"
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        str(key),
        "-out",
        str(crt),
        "-days",
        "2",
        "-subj",
        f"/CN=llm-cluster test {name}",
    )
    return key, crt


@pytest.fixture
def tls_registry(tmp_path: Path) -> Iterator[TlsRegistry]:
    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed (apt-get install openssl)")
    ca_key, ca = _make_ca(tmp_path, "ca")
    _, other = _make_ca(tmp_path, "other-ca")
    key, csr, crt, ext = (tmp_path / n for n in ("server.key", "server.csr", "server.crt", "san.cnf"))
    _openssl(
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        str(key),
        "-out",
        str(csr),
        "-subj",
        "/CN=127.0.0.1",
    )
    ext.write_text("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    _openssl(
        "x509",
        "-req",
        "-in",
        str(csr),
        "-CA",
        str(ca),
        "-CAkey",
        str(ca_key),
        "-CAcreateserial",
        "-out",
        str(crt),
        "-days",
        "2",
        "-extfile",
        str(ext),
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(crt), str(key))
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(10)
            try:
                with context.wrap_socket(conn, server_side=True):
                    pass
            except (OSError, ssl.SSLError):  # the client refused our certificate: what the test is about
                conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield TlsRegistry(f"127.0.0.1:{listener.getsockname()[1]}", ca, other)
    finally:
        stop.set()
        thread.join(10)
        listener.close()


def test_the_handshake_verifies_as_dockerd_does_against_certs_d_and_the_system_cas(tls_registry: TlsRegistry) -> None:
    assert registry_tls(tls_registry.address, [str(tls_registry.ca)]) == ("ok", "")
    assert registry_tls(tls_registry.address, []) == ("untrusted", "unable to get local issuer certificate")
    assert registry_tls(tls_registry.address, [str(tls_registry.other_ca)]) == (
        "untrusted",
        "unable to get local issuer certificate",
    )
    state, detail = registry_tls(f"127.0.0.1:{free_port()}", [])
    assert (state, detail) == ("unreachable", "[Errno 111] Connection refused")


def _registry_node(tmp_path: Path, registry: str, docker_info: str) -> tuple[Expectation, dict[str, str]]:
    config = prod_config()
    config[NS + "images"] = {"registry": registry}
    planned = node_expectation(load_stack_config(config, set()), "gpu-02")
    assert planned.registry == registry and planned.docker_certs_dir == "/etc/docker/certs.d"
    exp = dataclasses.replace(
        planned,
        driver_min="535.0",
        disk_path=str(tmp_path),
        min_free_gib=0,
        models=[],
        meminfo_path=meminfo(tmp_path, 376 * 1024 * 1024),
        cpuinfo_path=cpuinfo(tmp_path, 80),
        docker_certs_dir=str(tmp_path / "certs.d"),
    )
    outputs = {
        "gpus": query_csv_from_table(fixture(SMI_TABLE)),
        "topo": fixture(TOPO_DGX1),
        "ibstat": fixture(IB_ROCE),
        "docker": docker_info,
    }
    return exp, outputs


def test_a_dockerd_without_the_registrys_ca_stops_preflight_naming_the_file_to_fix(
    tmp_path: Path, tls_registry: TlsRegistry
) -> None:
    # dockerd always adds 127.0.0.0/8 to its insecure registries: this docker info drops that line, so the
    # loopback endpoint is checked as a remote one is (the air-gapped lab proves it on a lab host).
    info = fixture(LAB_DOCKER_INFO).replace("  127.0.0.0/8\n", "")
    exp, outputs = _registry_node(tmp_path, tls_registry.address, info)
    done = run_preflight(tmp_path, exp, **outputs)
    assert done.returncode == 1
    assert done.stdout.strip().splitlines()[-1] == "preflight gpu-02: 1 error(s), 0 warning(s)"
    certs = f"{tmp_path}/certs.d/{tls_registry.address}"
    assert done.stderr == (
        f"ERROR: gpu-02: dockerd does not trust the private registry {tls_registry.address} (images.registry): "
        f"{certs}/ holds no CA (*.crt), {tls_registry.address} is not among docker info's Insecure Registries, and "
        "its certificate does not verify against the system CAs (unable to get local issuer certificate); every "
        "pull from it would fail\n"
        f"    fix: copy the CA that signed {tls_registry.address}'s certificate to {certs}/ca.crt on gpu-02 (dockerd "
        "reads it at the next pull), or add it to the system CAs (update-ca-certificates) and restart docker; a "
        "registry without TLS goes in insecure-registries of /etc/docker/daemon.json\n"
    )
    # A CA that did not sign it: named.
    Path(certs).mkdir(parents=True)
    shutil.copyfile(tls_registry.other_ca, f"{certs}/ca.crt")
    (tmp_path / "bin").rename(tmp_path / "bin-1")
    done = run_preflight(tmp_path, exp, **outputs)
    assert done.returncode == 1
    assert (
        f"(images.registry): its certificate does not verify against {certs}/ca.crt or the system CAs "
        "(unable to get local issuer certificate)"
    ) in done.stderr
    # The CA that signed it: trusted.
    shutil.copyfile(tls_registry.ca, f"{certs}/ca.crt")
    (tmp_path / "bin").rename(tmp_path / "bin-2")
    done = run_preflight(tmp_path, exp, **outputs)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "preflight gpu-02: 0 error(s), 0 warning(s)"


def test_a_registry_dockerd_does_not_verify_needs_no_ca(tmp_path: Path, tls_registry: TlsRegistry) -> None:
    # The real docker info: 127.0.0.0/8 is insecure to dockerd, so no CA is asked for (nor a handshake).
    exp, outputs = _registry_node(tmp_path, tls_registry.address, fixture(LAB_DOCKER_INFO))
    done = run_preflight(tmp_path, exp, **outputs)
    assert done.returncode == 0, done.stderr


def test_an_unreachable_registry_stops_preflight(tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_port()}"
    exp, outputs = _registry_node(tmp_path, address, fixture(LAB_DOCKER_INFO).replace("  127.0.0.0/8\n", ""))
    done = run_preflight(tmp_path, exp, **outputs)
    assert done.returncode == 1
    assert (
        f"ERROR: gpu-02: cannot reach the private registry {address} (images.registry) to check that dockerd "
        "trusts it: [Errno 111] Connection refused\n"
        f"    fix: check images.registry, and that gpu-02 reaches {address} (route, firewall); every image is "
        "pulled from it\n"
    ) == done.stderr


def test_a_tarball_directory_missing_images_the_plan_loads_stops_preflight(tmp_path: Path) -> None:
    folder = tmp_path / "llm-images"
    config: dict[str, Any] = prod_config()
    config[NS + "images"] = {"tarballs": str(folder)}
    planned = node_expectation(load_stack_config(config, set()), "gpu-03")
    names = [
        "vllm_vllm-openai_v0.19.1.tar",
        "nvcr.io_nvidia_k8s_dcgm-exporter_3.3.9-3.6.1-ubuntu22.04.tar",
        "prom_node-exporter_v1.8.2.tar",
    ]
    assert planned.tarballs == [f"{folder}/{n}" for n in names]  # every image gpu-03 runs, as ops.images names them
    exp = dataclasses.replace(
        planned,
        driver_min="535.0",
        disk_path=str(tmp_path),
        min_free_gib=0,
        models=[],
        meminfo_path=meminfo(tmp_path, 376 * 1024 * 1024),
        cpuinfo_path=cpuinfo(tmp_path, 80),
    )
    folder.mkdir()
    (folder / names[0]).write_bytes(b"a docker save tarball")
    (folder / names[2]).write_bytes(b"")  # an interrupted copy
    done = run_preflight(
        tmp_path,
        exp,
        gpus=query_csv_from_table(fixture(SMI_TABLE)),
        topo=fixture(TOPO_DGX1),
        ibstat=fixture(IB_ROCE),
        docker=fixture(DOCKER_OK),
    )
    assert done.returncode == 1
    assert (
        done.stderr
        == (
            f"ERROR: gpu-03: {folder} (images.tarballs) lacks 2 of the 3 image tarball(s) the plan loads here: "
            f"{names[1]}, {names[2]}\n"
            f"    fix: copy them to {folder}/ on gpu-03: `python -m plan.images` prints the script that `docker save`s "  # the shipped preflight keeps the first name; plan.images runs ops.images
            "each under that name on a machine that reaches the registries\n"
        )
    )
    for n in names[1:]:
        (folder / n).write_bytes(b"a docker save tarball")
    (tmp_path / "bin").rename(tmp_path / "bin-1")
    done = run_preflight(
        tmp_path,
        exp,
        gpus=query_csv_from_table(fixture(SMI_TABLE)),
        topo=fixture(TOPO_DGX1),
        ibstat=fixture(IB_ROCE),
        docker=fixture(DOCKER_OK),
    )
    assert done.returncode == 0, done.stderr
