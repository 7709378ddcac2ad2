"""What the stack model knows of the deployed engines (components.spec.engines): the registry's refusals,
and every table it derives, compared whole on a registry of toy engines and on the real one."""

from __future__ import annotations

import pytest

import components.engines.registry  # noqa: F401 - registers the deployed engines
from components.facts.other_engines import OTHER_ENGINES
from components.spec import engines as spec_engines
from components.spec.base import Spec
from components.spec.engines import DeployedEngine, Launcher


class ToyOptions(Spec):
    size: int = 1


def toy(name: str, key: str, quantizations: set[str], images: list[str]) -> DeployedEngine:
    return DeployedEngine(
        name, key, ToyOptions, "size", f"{name}/server:1", frozenset(quantizations), lambda: images, images.__contains__
    )


@pytest.fixture
def empty(monkeypatch: pytest.MonkeyPatch) -> None:
    """A registry of no engine, the real one restored afterwards."""
    monkeypatch.setattr(spec_engines, "DEPLOYED", {})
    monkeypatch.setattr(spec_engines, "DEPLOYED_KEYS", {})
    monkeypatch.setattr(spec_engines, "DEFAULT_ENGINE", [])


def test_an_empty_registry_is_a_programming_error(empty: None) -> None:
    with pytest.raises(
        RuntimeError, match=r"^no engine is registered: import components.engines.registry before parsing a stack$"
    ):
        spec_engines.deployed()


def test_the_tables_of_a_registry_of_two_toys(empty: None) -> None:
    a = toy("alpha", "alphaOpts", {"gptq", "awq"}, ["alpha/server:2", "alpha/server:1"])
    b = toy("beta", "betaOpts", {"gguf", "awq"}, ["beta/server:1"])
    spec_engines.register(a)
    assert spec_engines.DEFAULT_ENGINE == []
    spec_engines.register(b, default=True)
    assert spec_engines.DEFAULT_ENGINE == ["beta"]
    assert spec_engines.deployed() == {"alpha": a, "beta": b}
    assert spec_engines.DEPLOYED_KEYS == {"alphaOpts": "alpha", "betaOpts": "beta"}
    assert spec_engines.options_keys() == {"alphaOpts": "alpha", "betaOpts": "beta"}
    assert spec_engines.engine_names() == ("alpha", "beta", *OTHER_ENGINES)
    assert spec_engines.quantization_methods() == frozenset({"gptq", "awq", "gguf"})
    assert spec_engines.declarable_images() == ["alpha/server:1", "alpha/server:2", "beta/server:1"]
    assert [spec_engines.knows_image(r) for r in ("alpha/server:2", "beta/server:1", "beta/server:2")] == [
        True,
        True,
        False,
    ]
    # An engine without a launcher of its own starts multi-node instances on Ray.
    assert a.launcher(None) == Launcher("ray") == Launcher("ray", None, "")
    # Registering an engine again (same name, same key) replaces it.
    a2 = toy("alpha", "alphaOpts", {"fp8"}, [])
    spec_engines.register(a2)
    assert spec_engines.deployed() == {"alpha": a2, "beta": b}
    assert spec_engines.quantization_methods() == frozenset({"fp8", "gguf", "awq"})


def test_register_refuses_a_known_engine_name_and_a_taken_options_key(empty: None) -> None:
    spec_engines.register(toy("alpha", "alphaOpts", set(), []))
    other = next(iter(OTHER_ENGINES))
    with pytest.raises(ValueError) as err:
        spec_engines.register(toy(other, "otherOpts", set(), []))
    assert str(err.value) == f"engine {other!r} is the name of an engine the project does not deploy"
    with pytest.raises(ValueError) as err:
        spec_engines.register(toy("beta", "alphaOpts", set(), []))
    assert str(err.value) == "engine 'beta': options key 'alphaOpts' is taken"
    assert list(spec_engines.deployed()) == ["alpha"]
    assert spec_engines.DEPLOYED_KEYS == {"alphaOpts": "alpha"}


def test_the_deployed_engines_as_the_stack_model_sees_them() -> None:
    assert spec_engines.engine_names() == ("vllm", "lmdeploy", "llamacpp", *OTHER_ENGINES)
    assert spec_engines.options_keys() == {"vllm": "vllm", "lmdeploy": "lmdeploy", "llamacpp": "llamacpp"}
    assert spec_engines.DEFAULT_ENGINE == ["vllm"]
    engines = spec_engines.deployed()
    assert {n: (e.required_option, e.default_image) for n, e in engines.items()} == {
        "vllm": ("maxModelLen", "vllm/vllm-openai:v0.19.1"),
        "lmdeploy": ("sessionLen", "openmmlab/lmdeploy:v0.16.0-cu12.8"),
        "llamacpp": ("contextPerSlot", "ghcr.io/ggml-org/llama.cpp:server-cuda-b11312"),
    }
    assert spec_engines.quantization_methods() == frozenset().union(*(e.quantizations for e in engines.values()))
    assert {"gptq", "awq", "gguf", "fp8"} <= spec_engines.quantization_methods()
    assert spec_engines.declarable_images() == sorted({r for e in engines.values() for r in e.declarable_images()})
    assert spec_engines.knows_image("vllm/vllm-openai:v0.19.1")
    assert not spec_engines.knows_image("nginx:1.27")
