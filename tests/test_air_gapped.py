"""Air-gapped clusters: images from a private registry (auth as Pulumi secrets) or tarballs on the nodes,
the hub and telemetry off in every serving container, and the policy pack refusing what would still reach
the internet. Planning functions exactly; the program under Pulumi's mocks against the providers' schemas;
the load script under bash with a recording docker; the real pack through its analyzer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from components.engines.llamacpp.engine import llamacpp_env
from components.engines.lmdeploy.engine import lmdeploy_env
from components.engines.registry import ENGINES
from components.engines.vllm.engine import vllm_env
from components.planning import image_supply as isup
from components.planning.load import load_stack_config
from components.spec import SpecError
from components.spec.topology import instances
from plan.analyze import analyze
from plan.harness import SECRET_SIG, SIG, ProgramRun
from tests.support import tool
from tests.support.schemas import problems_of

NS = "llm-cluster:"
IMAGE = "docker:index/remoteImage:RemoteImage"
CONTAINER = "docker:index/container:Container"
REMOTE = "command:remote:Command"
CREDS = {NS + "registryUsername", NS + "registryPassword"}
VLLM_OFFLINE = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
}


def with_images(config: dict[str, Any], **images: Any) -> dict[str, Any]:
    config[NS + "images"] = images
    return config


def refused(config: dict[str, Any], secrets: set[str] | None = None) -> list[str]:
    with pytest.raises(SpecError) as err:
        load_stack_config(config, secrets or set())
    return [str(i) for i in err.value.issues]


# --- references, as Docker reads them ------------------------------------------------------------


@pytest.mark.parametrize(
    "ref,host,remainder,mirrored,tarball",
    [
        (
            "vllm/vllm-openai:v0.19.1",
            "docker.io",
            "vllm/vllm-openai:v0.19.1",
            "reg.example:5000/vllm/vllm-openai:v0.19.1",
            "vllm_vllm-openai_v0.19.1.tar",
        ),
        (
            "nginx:1.27.5",
            "docker.io",
            "library/nginx:1.27.5",
            "reg.example:5000/library/nginx:1.27.5",
            "nginx_1.27.5.tar",
        ),
        (
            "docker.io/library/nginx:1.27.5",
            "docker.io",
            "library/nginx:1.27.5",
            "reg.example:5000/library/nginx:1.27.5",
            "docker.io_library_nginx_1.27.5.tar",
        ),
        (
            "nvcr.io/nvidia/k8s/dcgm-exporter:3.3.9-3.6.1-ubuntu22.04",
            "nvcr.io",
            "nvidia/k8s/dcgm-exporter:3.3.9-3.6.1-ubuntu22.04",
            "reg.example:5000/nvidia/k8s/dcgm-exporter:3.3.9-3.6.1-ubuntu22.04",
            "nvcr.io_nvidia_k8s_dcgm-exporter_3.3.9-3.6.1-ubuntu22.04.tar",
        ),
        (
            "localhost:5000/team/vllm:dev",
            "localhost:5000",
            "team/vllm:dev",
            "reg.example:5000/team/vllm:dev",
            "localhost_5000_team_vllm_dev.tar",
        ),
        (
            "ghcr.io/ggml-org/llama.cpp:server-cuda-b11312",
            "ghcr.io",
            "ggml-org/llama.cpp:server-cuda-b11312",
            "reg.example:5000/ggml-org/llama.cpp:server-cuda-b11312",
            "ghcr.io_ggml-org_llama.cpp_server-cuda-b11312.tar",
        ),
        (
            "prom/prometheus@sha256:" + "a" * 64,
            "docker.io",
            "prom/prometheus@sha256:" + "a" * 64,
            "reg.example:5000/prom/prometheus@sha256:" + "a" * 64,
            "prom_prometheus_sha256_" + "a" * 64 + ".tar",
        ),
    ],
)
def test_a_reference_is_split_mirrored_and_named_as_docker_reads_it(
    ref: str, host: str, remainder: str, mirrored: str, tarball: str
) -> None:
    assert isup.split_reference(ref) == (host, remainder)
    assert isup.mirrored("reg.example:5000", ref) == mirrored
    assert isup.tarball_name(ref) == tarball


def test_public_registries_are_known_by_host_and_by_cloud_suffix() -> None:
    assert [
        isup.public_registry(h)
        for h in (
            "docker.io",
            "nvcr.io",
            "ghcr.io",
            "quay.io",
            "europe-docker.pkg.dev",
            "123.dkr.ecr.eu-west-1.amazonaws.com",
            "reg.azurecr.io",
        )
    ] == [
        "Docker Hub",
        "NVIDIA NGC",
        "GitHub Container Registry",
        "Quay",
        "Google Artifact Registry",
        "Amazon ECR",
        "Azure Container Registry",
    ]
    assert [
        isup.public_registry(h) for h in ("registry.example:5000", "198.18.0.2:5000", "localhost:5000", "harbor.corp")
    ] == [None] * 4


# --- the spec ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "images,secrets,expected",
    [
        (
            {"registry": "https://reg.example"},
            set(),
            [
                "images.registry: 'https://reg.example' is not a registry address: host[:port][/prefix], e.g. "
                "registry.example:5000 or harbor.example/llm (no scheme, no tag)"
            ],
        ),
        (
            {"registry": "registry"},
            set(),
            [
                "images.registry: 'registry' is not a registry address: host[:port][/prefix], e.g. registry.example:5000 "
                "or harbor.example/llm (no scheme, no tag)"
            ],
        ),
        (
            {"registry": "deploy:s3cret-pass@reg.example:5000"},
            set(),
            [
                "images.registry: holds credentials (user:password@): give host[:port][/prefix] only, and the credentials "
                "as the secrets registryUsername and registryPassword (pulumi config set --secret registryPassword)"
            ],
        ),
        (
            {"registry": "reg.example:5000", "tarballs": "/srv/images"},
            set(),
            ["images: state registry or tarballs, not both: every image comes from one place"],
        ),
        (
            {"tarballs": "srv/images"},
            set(),
            ["images.tarballs: 'srv/images' must be an absolute path on the nodes (starting with /)"],
        ),
        (
            {},
            CREDS,
            [
                "images.registry: the secret registryPassword and registryUsername is set but no registry is: state "
                "images.registry (host[:port][/prefix]) or remove the secret (pulumi config rm registryPassword)"
            ],
        ),
        (
            {"registry": "reg.example:5000"},
            {NS + "registryPassword"},
            [
                "images.registry: the secret registryPassword is set without registryUsername: set both (pulumi config set "
                "--secret registryUsername), or neither for a registry without auth"
            ],
        ),
        ({"airGapped": "yes please"}, set(), ["images.airGapped: 'yes please' is not allowed: expected true or false"]),
    ],
    ids=[
        "scheme",
        "bare name",
        "credentials in the address",
        "both",
        "relative tarballs",
        "secrets without registry",
        "half the pair",
        "not a boolean",
    ],
)
def test_bad_images_sections_are_refused_naming_the_key(
    config: dict[str, Any], images: dict[str, Any], secrets: set[str], expected: list[str]
) -> None:
    with_images(config, **images)
    for key in secrets:
        config[key] = "plan-secret-x"
    assert refused(config, secrets) == expected


def test_registry_credentials_are_accepted_only_as_secrets(config: dict[str, Any]) -> None:
    with_images(config, registry="reg.example:5000")
    config[NS + "registryPassword"] = "s3cret"
    assert refused(config) == [
        "llm-cluster:registryPassword: must be a secret: set it with `pulumi config set "
        "--secret registryPassword` (password or token for images.registry)"
    ]


def test_two_images_with_one_tarball_name_are_refused(config: dict[str, Any]) -> None:
    with_images(config, tarballs="/srv/images")
    # prom_node-exporter:v1.8.2 would be saved to the tarball name of prom/node-exporter:v1.8.2.
    config[NS + "monitoring"]["prometheus"] = {"image": "prom_node-exporter:v1.8.2", "port": 9090}
    assert refused(config) == [
        "images.tarballs: 'prom_node-exporter:v1.8.2' and 'prom/node-exporter:v1.8.2' would both "
        "load from prom_node-exporter_v1.8.2.tar; tag one of them differently or use images.registry"
    ]


# --- a private registry --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def registry_run() -> ProgramRun:
    from tests.conftest import prod_config, run_stack

    config = with_images(prod_config(), airGapped=True, registry="reg.example:5000/llm")
    config[NS + "registryUsername"] = "plan-secret-user-0001"
    config[NS + "registryPassword"] = "plan-secret-pass-0002"
    return run_stack(config, CREDS)


def test_every_image_is_pulled_from_the_registry_and_nothing_is_built(registry_run: ProgramRun) -> None:
    images = registry_run.by_type(IMAGE)
    assert {r.inputs["name"] for r in images} == {
        "reg.example:5000/llm/vllm/vllm-openai:v0.19.1",
        "reg.example:5000/llm/nvidia/k8s/dcgm-exporter:3.3.9-3.6.1-ubuntu22.04",
        "reg.example:5000/llm/prom/node-exporter:v1.8.2",
        "reg.example:5000/llm/prom/prometheus:v2.55.1",
        "reg.example:5000/llm/grafana/grafana:11.3.0",
        # The default gateway image is pulled like the others (the mirror script builds and pushes it).
        "reg.example:5000/llm/llm-cluster/gateway:nginx-1.26.3-3-deb13u12-lua-0.10.28-2",
    }
    assert all("build" not in r.inputs for r in images)
    assert len(images) == 6 * 3 + 3  # per node vLLM, dcgm and node exporters; gpu-01 also gateway, Prometheus, Grafana
    # Every container runs the id of its node's image; labels keep the stack's reference (facts read it).
    by_urn = {r.urn: r for r in images}
    for c in registry_run.by_type(CONTAINER):
        image_deps = [by_urn[u] for u in c.property_dependencies.get("image", []) if u in by_urn]
        assert len(image_deps) == 1, c.name
        label = {x["label"]: x["value"] for x in c.inputs["labels"]}["llm-cluster.image"]
        assert image_deps[0].inputs["name"] == "reg.example:5000/llm/" + isup.split_reference(label)[1], c.name


def test_the_provider_gets_the_registry_auth_as_a_secret(registry_run: ProgramRun) -> None:
    providers = registry_run.by_type("pulumi:providers:docker")
    assert len(providers) == 6
    for p in providers:
        auth = p.inputs["registryAuth"]
        assert auth[SIG] == SECRET_SIG
        # Keyed by host[:port] only, as the provider looks it up (parseImageOptions' Registry).
        assert json.loads(auth["value"]) == [
            {"address": "reg.example:5000", "username": "plan-secret-user-0001", "password": "plan-secret-pass-0002"}
        ]
        assert p.display_inputs()["registryAuth"] == "[secret]"
    assert problems_of(registry_run) == []


def test_the_qualification_gate_runs_the_image_as_the_node_holds_it(registry_run: ProgramRun) -> None:
    checks = [r for r in registry_run.by_type(REMOTE) if r.name.endswith("-check") and "qualify" in r.name]
    assert len(checks) == 6
    for c in checks:
        assert "\nimage=reg.example:5000/llm/vllm/vllm-openai:v0.19.1\n" in c.inputs["create"]


def test_an_open_registry_gets_no_auth(config: dict[str, Any], stack_runner: Callable[..., ProgramRun]) -> None:
    run = stack_runner(with_images(config, registry="198.18.0.2:5000"))
    assert all("registryAuth" not in p.inputs for p in run.by_type("pulumi:providers:docker"))
    assert {r.inputs["name"].split("/")[0] for r in run.by_type(IMAGE)} == {"198.18.0.2:5000"}


# --- tarballs on the nodes -----------------------------------------------------------------------


def test_tarballs_are_loaded_then_found_never_pulled(
    config: dict[str, Any], stack_runner: Callable[..., ProgramRun]
) -> None:
    run = stack_runner(with_images(config, airGapped=True, tarballs="/srv/llm-images"))
    loads = {r.name: r for r in run.by_type(REMOTE) if "-image-load-" in r.name}
    images = run.by_type(IMAGE)
    assert len(loads) == len(images) == 6 * 3 + 3
    by_urn = {r.urn: r for r in loads.values()}
    for img in images:
        load = [by_urn[u] for u in img.dependencies if u in by_urn]
        assert len(load) == 1, img.name  # the RemoteImage waits for its own load step only
        (step,) = load
        assert step.name == img.name.replace("-image-", "-image-load-")
        # The name the tarball holds: the provider's findImage finds it locally and pulls nothing.
        assert f"\nimage={img.inputs['name']}\n" in step.inputs["create"].replace("'", "")
        assert f"\ntarball=/srv/llm-images/{isup.tarball_name(img.inputs['name'])}\n" in step.inputs["create"]
        assert step.inputs["delete"].startswith("bash -c ") or "docker image rm" in step.inputs["delete"]
        assert step.inputs["triggers"]
    gpu01 = sorted(n for n in loads if n.startswith("gpu-01-"))
    assert gpu01 == sorted(
        f"gpu-01-image-load-{s}"
        for s in (
            "vllm-openai-v0-19-1",
            "gateway-nginx-1-26-3-3-deb13u12-lua-0-10-28-2",
            "dcgm-exporter-3-3-9-3-6-1-ubuntu22-04",
            "node-exporter-v1-8-2",
            "prometheus-v2-55-1",
            "grafana-11-3-0",
        )
    )
    assert problems_of(run) == []
    assert [v for v in analyze(run.registrations) if v.policy_name.startswith("air-gapped")] == []


# The load script's docker: images are files under $FAKE/images; a "tarball" lists the names it holds.
FAKE_DOCKER = r"""#!/usr/bin/env bash
set -euo pipefail
echo "$*" >> "$FAKE/calls"
key() { printf '%s' "$1" | tr '/:@' '___'; }
case "$1 $2" in
  "image inspect")
    shift 2
    fmt=""
    if [[ "$1" == --format ]]; then fmt=1; shift 2; fi
    [[ -f "$FAKE/images/$(key "$1")" ]] || { echo "Error: No such image: $1" >&2; exit 1; }
    if [[ -n "$fmt" ]]; then cat "$FAKE/images/$(key "$1")"; fi ;;
  "load -i")
    [[ -s "$3" ]] || { echo "Error: unexpected EOF" >&2; exit 1; }
    while read -r name; do
      echo "sha256:$(printf '%s' "$name" | sha256sum | cut -c1-12)" > "$FAKE/images/$(key "$name")"
      echo "Loaded image: $name"
    done < "$3" ;;
  "image rm")
    [[ ! -f "$FAKE/in-use/$(key "$3")" ]] || { echo "Error: image is being used by a container" >&2; exit 1; }
    rm -f "$FAKE/images/$(key "$3")" ;;
  *) echo "fake docker: unexpected $*" >&2; exit 2 ;;
esac
"""


@pytest.fixture
def fake(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(FAKE_DOCKER)
    (bin_dir / "docker").chmod(0o755)
    for d in ("images", "in-use"):
        (tmp_path / d).mkdir()
    return tmp_path, {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE": str(tmp_path)}


def scripts(tmp: Path, image: str = "vllm/vllm-openai:v0.19.1") -> tuple[isup.ImageSupply, str, str]:
    s = isup.ImageSupply(image, image, "tarball", str(tmp / "tarballs" / isup.tarball_name(image)))
    state_dir = str(tmp / "state")
    load = isup.load_script(s).replace(isup.LOAD_STATE_DIR, state_dir)
    return s, load, isup.unload_script(s).replace(isup.LOAD_STATE_DIR, state_dir)


def tarball(s: isup.ImageSupply, content: str) -> None:
    """A fake tarball: the image names the fake docker's `load` gives the engine."""
    Path(s.source).parent.mkdir(exist_ok=True)
    Path(s.source).write_text(content)


def bash(script: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=60)


def test_load_scripts_are_shellcheck_clean(tmp_path: Path) -> None:
    shellcheck = tool("shellcheck")
    _, load, unload = scripts(tmp_path, "nvcr.io/nvidia/k8s/dcgm-exporter:3.3.9-3.6.1-ubuntu22.04")
    for name, text in (
        ("load", load),
        ("unload", unload),
        ("mirror", isup.mirror_script(load_stack_config(with_images(prod_config_copy(), tarballs="/t"), set()))),
    ):
        assert text.startswith("#!/usr/bin/env bash\n") and "\nset -euo pipefail\n" in text, name
        path = tmp_path / f"{name}.sh"
        path.write_text(text)
        done = subprocess.run([shellcheck, "-s", "bash", str(path)], capture_output=True, text=True)
        assert done.returncode == 0, done.stdout


def prod_config_copy() -> dict[str, Any]:
    from tests.conftest import prod_config

    return prod_config()


def test_a_missing_tarball_says_where_it_should_be(fake: tuple[Path, dict[str, str]]) -> None:
    tmp, env = fake
    s, load, _ = scripts(tmp)
    done = bash(load, env)
    assert done.returncode == 1
    assert done.stderr.startswith(f"image-load: {s.source} is not on ")
    assert (
        "copy it there (`python -m ops.images` lists each image's file and the docker save command), or fix "
        "images.tarballs" in done.stderr
    )
    assert not (tmp / "calls").exists()  # docker never ran


def test_load_then_skip_then_reload_when_the_tarball_changes_then_undo(fake: tuple[Path, dict[str, str]]) -> None:
    tmp, env = fake
    s, load, unload = scripts(tmp)
    tarball(s, "vllm/vllm-openai:v0.19.1\n")
    first = bash(load, env)
    assert first.returncode == 0, first.stderr
    assert "Loaded image: vllm/vllm-openai:v0.19.1" in first.stdout
    assert first.stdout.splitlines()[-1].startswith("image-load: vllm/vllm-openai:v0.19.1 loaded in ")
    assert (tmp / "calls").read_text().splitlines()[0] == f"load -i {s.source}"
    second = bash(load, env)  # the same file, the image still there: no multi-GB load again
    assert (second.returncode, second.stdout) == (
        0,
        f"image-load: vllm/vllm-openai:v0.19.1 already loaded from {s.source}\n",
    )
    assert sum(c.startswith("load ") for c in (tmp / "calls").read_text().splitlines()) == 1
    tarball(s, "vllm/vllm-openai:v0.19.1\nvllm/vllm-openai:v0.19.1\n")  # rebuilt: another size
    os.utime(s.source, (1, 1))  # another file: another mtime and size
    third = bash(load, env)
    assert third.returncode == 0 and "Loaded image" in third.stdout
    assert sum(c.startswith("load ") for c in (tmp / "calls").read_text().splitlines()) == 2
    undo = bash(unload, env)
    assert undo.returncode == 0, undo.stderr
    assert not list((tmp / "images").iterdir()) and not list((tmp / "state").iterdir())
    assert bash(unload, env).returncode == 0  # a second delete finds nothing and succeeds


def test_a_tarball_of_another_tag_is_refused_naming_the_save_command(fake: tuple[Path, dict[str, str]]) -> None:
    tmp, env = fake
    s, load, _ = scripts(tmp)
    tarball(s, "vllm/vllm-openai:v0.9.2\n")
    done = bash(load, env)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        f"image-load: {s.source} holds no image named vllm/vllm-openai:v0.19.1 (it loaded: Loaded image: "
        "vllm/vllm-openai:v0.9.2 ). Save it under that name: docker save -o vllm_vllm-openai_v0.19.1.tar "
        "vllm/vllm-openai:v0.19.1"
    )
    assert not (tmp / "state").exists()  # not recorded: the next run loads again


def test_a_broken_tarball_says_what_to_check(fake: tuple[Path, dict[str, str]]) -> None:
    tmp, env = fake
    s, load, _ = scripts(tmp)
    tarball(s, "")
    done = bash(load, env)
    assert done.returncode == 1
    assert f"image-load: docker load -i {s.source} failed: is it a complete `docker save` tarball" in done.stderr


def test_undo_leaves_an_image_a_container_still_uses(fake: tuple[Path, dict[str, str]]) -> None:
    tmp, env = fake
    s, load, unload = scripts(tmp)
    tarball(s, "vllm/vllm-openai:v0.19.1\n")
    assert bash(load, env).returncode == 0
    (tmp / "in-use" / "vllm_vllm-openai_v0.19.1").touch()
    done = bash(unload, env)
    assert done.returncode == 0
    assert "image-load: vllm/vllm-openai:v0.19.1 is still used by a container; left in place" in done.stderr
    assert (tmp / "images" / "vllm_vllm-openai_v0.19.1").exists()


def test_the_mirror_script_pushes_or_saves_every_image(config: dict[str, Any]) -> None:
    spec = load_stack_config(with_images(config, registry="reg.example:5000"), set())
    text = isup.mirror_script(spec)
    assert (
        "docker build -t llm-cluster/gateway:nginx-1.26.3-3-deb13u12-lua-0.10.28-2 components/planning/gateway_image\n"
        "docker tag llm-cluster/gateway:nginx-1.26.3-3-deb13u12-lua-0.10.28-2 "
        "reg.example:5000/llm-cluster/gateway:nginx-1.26.3-3-deb13u12-lua-0.10.28-2\n" in text
    )
    assert (
        "# nvcr.io/nvidia/k8s/dcgm-exporter:3.3.9-3.6.1-ubuntu22.04 (every node)\n"
        "docker pull nvcr.io/nvidia/k8s/dcgm-exporter:3.3.9-3.6.1-ubuntu22.04\n" in text
    )
    assert text.count("docker push ") == 6
    spec = load_stack_config(with_images(config, tarballs="/srv/llm-images"), set())
    text = isup.mirror_script(spec)
    assert text.count("docker save -o ") == 6
    assert 'docker save -o "$out"/prom_prometheus_v2.55.1.tar prom/prometheus:v2.55.1\n' in text
    done = subprocess.run(
        [sys.executable, "-m", "ops.images", "--list"],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert done.returncode == 0
    assert done.stdout.splitlines()[0] == "vllm/vllm-openai:v0.19.1\tvllm/vllm-openai:v0.19.1\torigin\tdocker.io"


# --- offline serving containers --------------------------------------------------------------------


def test_vllm_and_ray_containers_run_with_the_hub_and_telemetry_off(prod_run: ProgramRun) -> None:
    servers = [
        c
        for c in prod_run.by_type(CONTAINER)
        if {x["label"]: x["value"] for x in c.inputs["labels"]}.get("llm-cluster.role")
        in ("vllm", "ray-head", "ray-worker")
    ]
    assert len(servers) == 4 + 2
    for c in servers:
        env = dict(e.split("=", 1) for e in c.inputs["envs"])
        assert {k: env.get(k) for k in VLLM_OFFLINE} == VLLM_OFFLINE, c.name


def test_offline_false_and_one_env_override_per_pool(config: dict[str, Any]) -> None:
    config[NS + "pools"]["chat"]["offline"] = False
    config[NS + "pools"]["reasoning"]["env"]["HF_HUB_OFFLINE"] = "0"
    spec = load_stack_config(config, set())
    chat = vllm_env(spec, instances(spec, "chat")[0], "gpu-03")
    assert not set(VLLM_OFFLINE) & set(chat)
    reasoning = vllm_env(spec, instances(spec, "reasoning")[0], "gpu-01")
    assert {k: reasoning[k] for k in VLLM_OFFLINE} == {**VLLM_OFFLINE, "HF_HUB_OFFLINE": "0"}


def test_each_engine_sets_its_own_offline_variables() -> None:
    from tests.support.engine_stacks import llamacpp_config, lmdeploy_config, spec_of

    lm = spec_of(lmdeploy_config())
    assert {
        k: v
        for k, v in lmdeploy_env(lm, instances(lm, "chat")[0], "gpu-03").items()
        if not k.startswith(("NCCL_", "GLOO_"))
    } == {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    ll = spec_of(llamacpp_config())
    assert llamacpp_env(ll, instances(ll, "chat")[0]) == {"LLAMA_ARG_OFFLINE": "1"}
    assert {e: dict(ENGINES[e].offline_vars) for e in ENGINES} == {
        "vllm": VLLM_OFFLINE,
        "lmdeploy": {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
        "llamacpp": {"LLAMA_ARG_OFFLINE": "1"},
    }


@pytest.mark.parametrize(
    "engine,argv,expected",
    [
        ("vllm", ["vllm", "serve", "/m", "--tokenizer", "Qwen/Qwen3-30B-A3B"], [("--tokenizer", "Qwen/Qwen3-30B-A3B")]),
        ("vllm", ["vllm", "serve", "/m", "--tokenizer=/data/tok", "--hf-config-path", "/data/cfg"], []),
        (
            "vllm",
            ["vllm", "serve", "/m", "--speculative-config", '{"model": "org/draft", "num_speculative_tokens": 3}'],
            [("--speculative-config", "org/draft")],
        ),
        # nargs="+": every value up to the next flag, name=path or the JSON form.
        (
            "vllm",
            [
                "vllm",
                "serve",
                "/m",
                "--lora-modules",
                "sql=/data/lora/sql",
                "chat=org/chat-lora",
                '{"name": "x", "path": "org/x-lora"}',
                "--port",
                "8000",
            ],
            [("--lora-modules", "org/chat-lora"), ("--lora-modules", "org/x-lora")],
        ),
        (
            "lmdeploy",
            ["lmdeploy", "serve", "api_server", "/m", "--speculative-draft-model", "org/eagle"],
            [("--speculative-draft-model", "org/eagle")],
        ),
        (
            "llamacpp",
            ["llama-server", "-hf", "unsloth/DeepSeek-R1-GGUF:Q2_K", "--model-url=https://x/m.gguf"],
            [("-hf", "unsloth/DeepSeek-R1-GGUF:Q2_K"), ("--model-url", "https://x/m.gguf")],
        ),
    ],
    ids=[
        "vllm tokenizer id",
        "vllm local paths",
        "vllm draft model",
        "vllm lora",
        "lmdeploy draft",
        "llama.cpp repo and url",
    ],
)
def test_each_engine_names_the_flags_that_download(
    engine: str, argv: list[str], expected: list[tuple[str, str]]
) -> None:
    assert ENGINES[engine].hub_downloads(argv) == expected


# --- the policy pack -----------------------------------------------------------------------------


def verdicts(run: ProgramRun) -> list[tuple[str, str, str]]:
    # The analyzer leads each message with the policy's description line.
    return [
        (v.policy_name, v.enforcement_level, v.message.split("\n", 1)[1])
        for v in analyze(run.registrations)
        if v.policy_name.startswith("air-gapped")
    ]


WAY_OUT = (
    "Set images.registry to the private registry that holds them (every image is then pulled as "
    "<registry>/<repository>:<tag>; `python -m ops.images` lists each one and the commands that mirror it), "
    "or images.tarballs to a directory of `docker save` tarballs on every node (loaded with docker load); "
    "or, if the nodes do reach these registries, set images.airGapped: false."
)


def test_an_air_gapped_stack_pulling_from_public_registries_is_refused(
    config: dict[str, Any], stack_runner: Callable[..., ProgramRun]
) -> None:
    assert verdicts(stack_runner(config)) == []  # not air-gapped: nothing to say
    run = stack_runner(with_images(config, airGapped=True))
    assert verdicts(run) == [
        (
            "air-gapped-images",
            "mandatory",
            "images.airGapped is true, but 6 images would still come from a public registry the nodes cannot reach: "
            "vllm/vllm-openai:v0.19.1 from Docker Hub (docker.io) on every node; "
            "nvcr.io/nvidia/k8s/dcgm-exporter:3.3.9-3.6.1-ubuntu22.04 from NVIDIA NGC (nvcr.io) on every node; "
            "prom/node-exporter:v1.8.2 from Docker Hub (docker.io) on every node; "
            "prom/prometheus:v2.55.1 from Docker Hub (docker.io) on gpu-01; "
            "grafana/grafana:11.3.0 from Docker Hub (docker.io) on gpu-01; "
            "llm-cluster/gateway:nginx-1.26.3-3-deb13u12-lua-0.10.28-2 built on its node from debian:trixie-slim "
            "(Docker Hub) and the Debian archive on gpu-01. " + WAY_OUT,
        )
    ]


def test_images_named_in_a_private_registry_pass_and_the_rest_are_listed(
    config: dict[str, Any], stack_runner: Callable[..., ProgramRun]
) -> None:
    with_images(config, airGapped=True)
    for pool in config[NS + "pools"].values():
        pool["image"] = "harbor.corp/llm/vllm-openai:v0.19.1"
        pool["imageFacts"] = {"like": "vllm/vllm-openai:v0.19.1"}
    config[NS + "gateway"]["image"] = "harbor.corp/llm/nginx:1.27.5"
    config[NS + "monitoring"] = {
        "node": "gpu-01",
        **{
            k: {"image": f"harbor.corp/llm/{k.lower()}:1", "port": port}
            for k, port in (("dcgmExporter", 9400), ("nodeExporter", 9100), ("prometheus", 9090))
        },
        "grafana": {"image": "ghcr.io/grafana/grafana:11.3.0", "port": 3000},
    }
    ((policy, level, message),) = verdicts(stack_runner(config))
    assert (policy, level) == ("air-gapped-images", "mandatory")
    assert message.startswith(
        "images.airGapped is true, but 1 image would still come from a public registry the "
        "nodes cannot reach: ghcr.io/grafana/grafana:11.3.0 from GitHub Container Registry "
        "(ghcr.io) on gpu-01. Set images.registry"
    )


def test_a_public_registry_named_as_the_private_one_is_refused(
    config: dict[str, Any], stack_runner: Callable[..., ProgramRun]
) -> None:
    ((_, _, message),) = verdicts(stack_runner(with_images(config, airGapped=True, registry="docker.io/myorg")))
    assert message.startswith(
        "images.airGapped is true, but 6 images would still come from a public registry the "
        "nodes cannot reach: vllm/vllm-openai:v0.19.1 from Docker Hub (docker.io), the registry "
        "images.registry names on every node;"
    )


def test_an_air_gapped_registry_stack_passes(registry_run: ProgramRun) -> None:
    assert verdicts(registry_run) == []


def test_servers_that_would_reach_the_hub_are_refused_per_pool(
    config: dict[str, Any], stack_runner: Callable[..., ProgramRun]
) -> None:
    with_images(config, airGapped=True, registry="reg.example:5000")
    config[NS + "pools"]["chat"]["vllm"]["extraArgs"] = ["--tokenizer", "Qwen/Qwen3-30B-A3B"]
    config[NS + "pools"]["reasoning"]["env"]["TRANSFORMERS_OFFLINE"] = "0"
    assert verdicts(stack_runner(config)) == [
        (
            "air-gapped-hub",
            "mandatory",
            "pools.reasoning, instance reasoning-gpu-01: images.airGapped is true, but TRANSFORMERS_OFFLINE=0 turns back "
            "on what pools.reasoning.offline turns off (TRANSFORMERS_OFFLINE=1): remove "
            "pools.reasoning.env.TRANSFORMERS_OFFLINE.",
        ),
        (
            "air-gapped-hub",
            "mandatory",
            "pools.chat, 4 instances (chat-gpu-03, chat-gpu-04, chat-gpu-05, chat-gpu-06): images.airGapped is true, but "
            "--tokenizer Qwen/Qwen3-30B-A3B would make vLLM download 'Qwen/Qwen3-30B-A3B' from a hub the nodes cannot "
            "reach: copy it to the nodes (beside the weights) and give its absolute path, or remove the flag. Stack key "
            "to edit: pools.chat.vllm.extraArgs[0] (given in extraArgs: --tokenizer).",
        ),
    ]
    config[NS + "pools"]["chat"]["vllm"]["extraArgs"] = []
    config[NS + "pools"]["reasoning"]["env"].pop("TRANSFORMERS_OFFLINE")
    config[NS + "pools"]["chat"]["offline"] = False
    assert verdicts(stack_runner(config)) == [
        (
            "air-gapped-hub",
            "mandatory",
            "pools.chat, 4 instances (chat-gpu-03, chat-gpu-04, chat-gpu-05, chat-gpu-06): images.airGapped is true, but "
            "pools.chat.offline is false: vLLM would try the model hub and send usage statistics to hosts the nodes "
            "cannot reach. Remove pools.chat.offline (it defaults to true).",
        )
    ]
    config[NS + "pools"]["chat"].pop("offline")
    assert verdicts(stack_runner(config)) == []


def test_the_rehearsal_pulls_with_the_providers_auth_for_the_images_registry() -> None:
    # lab/rehearse.py follows the provider's pullImage: the registryAuth entry whose address is the image's
    # registry host goes as X-Registry-Auth; an image on another registry gets none.
    from lab.rehearse import Rehearsal, Resource

    r = Rehearsal.__new__(Rehearsal)
    auth = json.dumps([{"address": "198.18.0.2:5000", "username": "u", "password": "p"}])
    prov = Resource(
        "urn:prov", "pulumi:providers:docker", "gpu-01-docker", "", True, {"registryAuth": auth}, [], "", {}
    )
    img = Resource("urn:img", IMAGE, "gpu-01-image-x", "", True, {}, [], "urn:prov::id", {})
    r.resources = {prov.urn: prov, img.urn: img}
    assert r._registry_auth(img, "198.18.0.2:5000/vllm/vllm-openai:v0.19.1") == {
        "username": "u",
        "password": "p",
        "serveraddress": "198.18.0.2:5000",
    }
    assert r._registry_auth(img, "vllm/vllm-openai:v0.19.1") is None
    assert r._registry_auth(img, "nvcr.io/nvidia/k8s/dcgm-exporter:3.3.9-3.6.1-ubuntu22.04") is None
