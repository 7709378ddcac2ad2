"""The lab's Debian mirror without namespaces: what it reads of the gateway image's Dockerfile, that the
lab stack points the build at it, and the recording proxy on loopback (paths as apt sends them)."""

from __future__ import annotations

import http.server
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from components.planning.gateway.image import (
    BASE_IMAGE,
    CONTEXT_DIR,
    DEBIAN_MIRROR,
    DEBIAN_SECURITY_MIRROR,
    GATEWAY_IMAGE,
    TESTED_PACKAGES,
)
from lab import airgap, debmirror, images
from lab.config import REPO
from lab.hosts import LabError
from lab.rehearse import IMAGE, plan_resources


def test_the_gateway_dockerfile_is_read_as_docker_reads_it() -> None:
    df = debmirror.parse_dockerfile((CONTEXT_DIR / "Dockerfile").read_text())
    assert df.base == BASE_IMAGE
    assert df.mirrors() == {"DEBIAN_MIRROR": DEBIAN_MIRROR, "DEBIAN_SECURITY_MIRROR": DEBIAN_SECURITY_MIRROR}
    assert len(df.runs) == 1
    # Continuation lines joined into one shell command line, as the builder passes it to /bin/sh -c.
    assert "\n" not in df.runs[0]
    assert " ".join(f"{p}={v}" for p, v in TESTED_PACKAGES.items()) in df.runs[0]


def test_a_dockerfile_the_lab_cannot_record_is_refused() -> None:
    with pytest.raises(LabError, match="single-stage"):
        debmirror.parse_dockerfile("FROM debian:trixie-slim AS a\nFROM debian:trixie-slim\n")
    with pytest.raises(LabError, match="shell-form"):
        debmirror.parse_dockerfile('FROM debian:trixie-slim\nRUN ["apt-get", "update"]\n')
    with pytest.raises(LabError, match="needs a path"):
        debmirror.archive_name("http://deb.example")


@pytest.mark.parametrize("stack", ["lab", "lab-engines"])
def test_the_lab_stack_builds_the_gateway_image_from_the_lab_mirror(stack: str) -> None:
    resources, _ = plan_resources(REPO / f"Pulumi.{stack}.yaml", stack)
    build = next(r for r in resources if r.type == IMAGE and r.inputs.get("build")).inputs["build"]
    df = debmirror.parse_dockerfile((REPO / build["context"] / build["dockerfile"]).read_text())
    args = build["buildArgs"]
    assert (
        {k: args[k] for k in df.mirrors()}
        == debmirror.lab_build_args(df)
        == {
            "DEBIAN_MIRROR": "http://198.18.0.2:8080/debian",
            "DEBIAN_SECURITY_MIRROR": "http://198.18.0.2:8080/debian-security",
        }
    )
    # Debian's signatures are checked in the lab as on a node: Valid-Until too.
    assert args["APT_CHECK_VALID_UNTIL"] == "yes"


def test_the_air_gapped_lab_stack_pulls_the_default_gateway_image_the_lab_builds_from_its_dockerfile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(airgap, "STATE", tmp_path)
    path = airgap.airgap_stack(REPO / "Pulumi.lab.yaml", "lab-airgap")
    resources, _ = plan_resources(path, "lab-airgap")
    pulled = sorted(r.inputs["name"] for r in resources if r.type == IMAGE)
    assert not [r for r in resources if r.type == IMAGE and r.inputs.get("build")]  # nothing built on a host
    assert f"{airgap.REGISTRY}/{GATEWAY_IMAGE}" in pulled, pulled
    # The lab's registry gets it as the site's operator makes it: the image itself, not a stand-in.
    refs = airgap.stack_images(path)
    assert {r: images.kind_of(r) for r in refs if r.startswith("llm-cluster/")} == {GATEWAY_IMAGE: "gateway"}
    assert images.registry_path("llm-cluster/gateway") == "llm-cluster/gateway"


class _Archive(http.server.BaseHTTPRequestHandler):
    """A loopback stand-in for an archive: one .deb whose version has a `+`, at its decoded path."""

    def log_message(self, *a: object) -> None:
        pass

    def do_GET(self) -> None:
        if urllib.request.unquote(self.path) == "/debian/pool/main/n/nginx/nginx_1.26.3-3+deb13u12_amd64.deb":
            self.send_response(200)
            self.send_header("Content-Length", "3")
            self.end_headers()
            self.wfile.write(b"deb")
        else:
            self.send_error(404)


def test_the_recorder_keeps_what_apt_fetched_where_http_server_serves_it(tmp_path: Path) -> None:
    archive = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Archive)
    threading.Thread(target=archive.serve_forever, daemon=True).start()
    recorder = debmirror._Recorder(tmp_path, {"debian": f"http://127.0.0.1:{archive.server_address[1]}/debian"})
    threading.Thread(target=recorder.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{recorder.server_address[1]}"
        # apt quotes `+` as %2b; http.server decodes the path before it looks for the file.
        with urllib.request.urlopen(f"{base}/debian/pool/main/n/nginx/nginx_1.26.3-3%2bdeb13u12_amd64.deb") as r:
            assert r.read() == b"deb"
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(f"{base}/debian/dists/trixie/Release")
        assert missing.value.code == 404  # apt's fallback (InRelease, then Release) sees the archive's answer
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(f"{base}/ubuntu/dists/noble/InRelease")  # an archive no build argument names
    finally:
        recorder.shutdown()
        archive.shutdown()
    assert (tmp_path / "debian/pool/main/n/nginx/nginx_1.26.3-3+deb13u12_amd64.deb").read_bytes() == b"deb"
    assert recorder.fetched == ["debian/pool/main/n/nginx/nginx_1.26.3-3+deb13u12_amd64.deb"]
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["nginx_1.26.3-3+deb13u12_amd64.deb"]


def test_an_expiring_recording_is_found(tmp_path: Path) -> None:
    (tmp_path / "debian/dists/trixie").mkdir(parents=True)
    (tmp_path / "debian/dists/trixie/InRelease").write_text("Origin: Debian\nSuite: stable\n")
    assert debmirror._valid_until(tmp_path) is None  # stable's Release has no Valid-Until
    (tmp_path / "debian-security/dists/trixie-security").mkdir(parents=True)
    (tmp_path / "debian-security/dists/trixie-security/InRelease").write_text(
        "Origin: Debian\nValid-Until: Tue, 08 Dec 2026 09:00:00 UTC\n"
    )
    assert debmirror._valid_until(tmp_path) == 1796720400.0  # 2026-12-08 09:00 UTC


def test_a_changed_dockerfile_is_recorded_again_not_served_from_the_old_recording(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A recording is kept under a key of the Dockerfile's text: new pins are a new recording, or the lab's
    # build would ask the mirror for packages it never recorded.
    monkeypatch.setattr(debmirror, "CACHE", tmp_path / "cache")
    base = tmp_path / "debian-trixie-slim.tar"
    base.write_bytes(b"rootfs")
    committed = (CONTEXT_DIR / "Dockerfile").read_text()
    old = tmp_path / "old" / "Dockerfile"
    old.parent.mkdir()
    old.write_text(committed)
    recorded = tmp_path / "cache" / "debian" / debmirror.recording_key(committed, base)
    recorded.mkdir(parents=True)
    (recorded / "recorded.json").write_text("{}")  # no InRelease: nothing expires
    assert debmirror.record(old, base) == recorded
    # The same Dockerfile with another pin (and, to stop before any chroot, no mirror ARG): not the old one.
    pin = f" lua-cjson={TESTED_PACKAGES['lua-cjson']} "
    assert committed.count(pin) == 1
    repinned = committed.replace(pin, " lua-cjson=2.1.0+dfsg-3 ")
    assert debmirror.recording_key(repinned, base) != recorded.name
    changed = tmp_path / "new" / "Dockerfile"
    changed.parent.mkdir()
    changed.write_text(
        "".join(line for line in repinned.splitlines(keepends=True) if not line.startswith("ARG DEBIAN_"))
    )
    with pytest.raises(LabError) as err:
        debmirror.record(changed, base)
    assert str(err.value) == (
        f"{changed}: no ARG names an archive URL, so the lab cannot point its apt at the lab's mirror"
    )
    assert (recorded / "recorded.json").exists()  # the old recording is left as it was
