"""The lab's real-engine vLLM image and stack, without namespaces: what the image differs in (a declared list that
may not grow silently), what it carries of the real image, and the lab stack's engines started by the plan's own
argv and env (no lab-side rewriting). The stack on real hosts: tests/lab/test_lab_vllm.py."""

from __future__ import annotations

from lab import images, vllm_cpu
from lab.config import REAL_VLLM_MODELS, REPO, LabConfigError, load_lab_stack

STACK = REPO / "Pulumi.lab-vllm.yaml"


def test_the_real_engine_image_differs_only_in_what_is_declared() -> None:
    # A new difference is a decision: add it here, in lab/vllm_cpu.py IMAGE_DIFFERENCES and lab/README.md.
    assert list(vllm_cpu.IMAGE_DIFFERENCES) == ["base", "python", "site-packages", "ray", "delivery"]
    readme = (REPO / "lab" / "README.md").read_text()
    for what in vllm_cpu.IMAGE_DIFFERENCES:
        assert f"**{what}**" in readme, what
    site = vllm_cpu.VENV / "lib" / "python3.11" / "site-packages"
    assert vllm_cpu.image_binds() == [f"{site}:/usr/local/lib/python3.11/dist-packages:ro"]


def test_the_real_engine_image_carries_the_real_images_entrypoint_and_layout() -> None:
    from components.engines.vllm.facts import IMAGES

    kind = images.KINDS["vllm-real"]
    # The image facts the policy pack reads a raw container with name the same ENTRYPOINT.
    assert kind.entrypoint == IMAGES[vllm_cpu.REAL_IMAGE].entrypoint == ("vllm", "serve")
    assert (kind.workdir, kind.user, kind.cmd) == ("/vllm-workspace", None, None)
    assert kind.env == {"VLLM_USAGE_SOURCE": "production-docker-image"}
    assert 'ENTRYPOINT ["vllm", "serve"]' in kind.source and "WORKDIR /vllm-workspace" in kind.source


def test_the_lab_knows_the_tiny_models_the_engine_makes() -> None:
    assert REAL_VLLM_MODELS == tuple(vllm_cpu.KINDS)


def test_the_stack_serves_the_tiny_models_it_plans_with() -> None:
    stack = load_lab_stack(STACK)
    assert dict(stack.real_vllm) == {"deepseek-v3-tiny": "deepseek-v3-tiny", "qwen3-moe-tiny": "qwen3-moe-tiny"}
    # The committed config.json the plan sizes each model with is the one lab/vllm_cpu_models.py writes
    # (lab/__main__.py real_model_files refuses a difference when it copies the made model).
    for kind in dict(stack.real_vllm).values():
        assert (REPO / "lab" / "models" / kind / "config.json").is_file()


def test_a_real_vllm_model_the_lab_cannot_make_is_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    text = STACK.read_text().replace("qwen3-moe-tiny: qwen3-moe-tiny", "qwen3-moe-tiny: llama-tiny")
    (tmp_path / "Pulumi.x.yaml").write_text(text)
    try:
        load_lab_stack(tmp_path / "Pulumi.x.yaml")
    except LabConfigError as e:
        assert str(e) == (
            "lab:realVllm.models.qwen3-moe-tiny: 'llama-tiny'; the lab makes: qwen3-tiny, qwen3-moe-tiny, "
            "deepseek-v3-tiny"
        )
    else:
        raise AssertionError("accepted a tiny model the lab does not make")


def test_the_cpu_needs_are_the_stacks_own_keys() -> None:
    """What the CPU needs is in the stack file as product keys: the plan writes it, the lab changes nothing."""
    from components.engines.registry import engine_for
    from components.planning.load import load_stack_config
    from components.spec.topology import instances
    from plan.stackfile import load_stack_file

    f = load_stack_file(STACK, "lab-vllm")
    spec = load_stack_config(f.config, f.secret_keys)
    reasoning = instances(spec, "reasoning")[0]
    eng = engine_for(spec.pools["reasoning"])
    head, worker = (eng.node_argv(spec, reasoning, n) for n in reasoning.nodes)
    assert head[:2] == ["vllm", "serve"] and head[2] == "/data/models/deepseek-v3-tiny"
    assert "--quantization" not in head
    for flags in (["--nnodes", "2", "--node-rank", "0", "--master-addr", "198.18.0.11"], ["--enforce-eager"]):
        assert " ".join(flags) in " ".join(head)
    assert "--headless" in worker and "--node-rank 1" in " ".join(worker)
    env = eng.serve_env(spec, reasoning, "gpu-02")
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0|1|0|1" and env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert env["VLLM_HOST_IP"] == "198.18.0.12" and env["GLOO_SOCKET_IFNAME"] == "bond0"
    chat = instances(spec, "chat")[0]
    assert engine_for(spec.pools["chat"]).serve_env(spec, chat, "gpu-03")["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert {p: spec.pools[p].qualification_gate for p in spec.pools} == {"reasoning": False, "chat": False}
