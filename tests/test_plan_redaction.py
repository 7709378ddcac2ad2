"""No credential planted in a stack comes back in any byte the plan prints or writes, and the plan still
says where each one is (plan.redact). The real `python -m plan`, as CI runs it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from plan.harness import Registration
from plan.redact import REDACTED, Redactor
from tests.conftest import ROOT, prod_config

NS = "llm-cluster:"
# Every place a free value enters the stack, each with its own credential (by name, by flag, by shape).
PLANTED = {
    "pools.chat.env HF_TOKEN": "hf_PLANTEDenvA1b2C3d4E5f6G7h8I9j0",
    "pools.chat.env X_TOKEN (short)": "pl4nt",
    "pools.chat.env (harmless name, token shape)": "ghp_PLANTEDshapeA1b2C3d4E5f6G7h8I9j0K1l2",
    "nccl.extraEnv WANDB_API_KEY": "planted-nccl-wandb-key-0001",
    "pools.reasoning.vllm.extraArgs --api-key": "planted-api-key-0002",
    "pools.chat.vllm.extraArgs --hf-token=": "planted-hf-token-0003",
    "pools.reasoning.env (harmless name, OpenAI shape)": "sk-PLANTEDabcdefghijklmnopqrstuv0004",
}


def planted_stack(tmp_path: Path) -> Path:
    config: dict[str, Any] = prod_config()
    chat, reasoning = config[NS + "pools"]["chat"], config[NS + "pools"]["reasoning"]
    chat["env"] = {
        "HF_TOKEN": PLANTED["pools.chat.env HF_TOKEN"],
        "X_TOKEN": PLANTED["pools.chat.env X_TOKEN (short)"],
        "MODEL_MIRROR": PLANTED["pools.chat.env (harmless name, token shape)"],
    }
    config[NS + "nccl"] = {
        **config.get(NS + "nccl", {}),
        "extraEnv": {"WANDB_API_KEY": PLANTED["nccl.extraEnv WANDB_API_KEY"]},
    }
    reasoning["vllm"]["extraArgs"] = ["--api-key", PLANTED["pools.reasoning.vllm.extraArgs --api-key"]]
    chat["vllm"]["extraArgs"] = ["--hf-token=" + PLANTED["pools.chat.vllm.extraArgs --hf-token="]]
    reasoning["env"] = {
        **reasoning.get("env", {}),
        "UPSTREAM": PLANTED["pools.reasoning.env (harmless name, OpenAI shape)"],
    }
    path = tmp_path / "Pulumi.planted.yaml"
    path.write_text(yaml.safe_dump({"config": config}))
    return path


def test_no_planted_credential_is_printed_or_written_and_each_is_located(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "plan",
            "--config",
            str(planted_stack(tmp_path)),
            "--out",
            str(out),
            "--sarif",
            str(out / "verdicts.sarif"),
            "--junit",
            str(out / "verdicts.xml"),
        ],
        cwd=ROOT,
        capture_output=True,
        timeout=300,
    )
    assert done.returncode == 1, done.stderr.decode()  # no-plaintext-secrets refuses them
    written = {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert {"planted/plan.txt", "planted/plan.json", "verdicts.sarif", "verdicts.xml"} <= set(written)
    streams = {"stdout": done.stdout, "stderr": done.stderr, **written}
    for where, value in PLANTED.items():
        for name, data in streams.items():
            assert value.encode() not in data, f"{where}: the planted value is in {name}"
    text = written["planted/plan.txt"].decode()
    # Still said where: in the listing, the redaction list and the policy's own message.
    assert "HF_TOKEN=[redacted]" in text and "WANDB_API_KEY=[redacted]" in text and "X_TOKEN=[redacted]" in text
    assert re.search(r"--api-key\s+\[redacted\]", text) and "--hf-token=[redacted]" in text
    chat = "chat-gpu-03, chat-gpu-04, chat-gpu-05, chat-gpu-06"
    listed = text.split("\nRedacted")[1].split("\nPolicy")[0]
    for line in (
        f"inputs.env.HF_TOKEN (env HF_TOKEN) in {chat}\n",
        f"inputs.env.MODEL_MIRROR (shaped like a credential) in {chat}\n",
        f"inputs.env.WANDB_API_KEY (env WANDB_API_KEY) in {chat}, reasoning-gpu-01\n",
    ):
        assert line in listed, line
    # envs positions move with the product's own variables (sorted); the name is what says where.
    assert re.search(
        r"inputs\.envs\[\d+\] \(env WANDB_API_KEY\) in reasoning-gpu-01-ray-head, "
        r"reasoning-gpu-01-ray-worker-gpu-02\n",
        listed,
    )
    # argv positions move with the typed flags; the flag named is what says where.
    assert re.search(r"inputs\.argv\[\d+\] \(flag --api-key\) in reasoning-gpu-01\n", listed)
    assert re.search(rf"inputs\.argv\[\d+\] \(flag --hf-token\) in {chat}\n", listed)
    # The stack keys the ModelServers carry are not credentials: they stay readable.
    assert '"HF_TOKEN": "pools.chat.env.HF_TOKEN"' in written["planted/plan.json"].decode()
    assert "no-plaintext-secrets" in text and "credential in plain text: env HF_TOKEN" in " ".join(text.split())


def registration(inputs: dict[str, Any]) -> Registration:
    return Registration(
        urn="urn:x",
        type="docker:index/container:Container",
        name="c",
        parent="",
        custom=True,
        inputs=inputs,
        dependencies=[],
        property_dependencies={},
        provider="",
        options={},
    )


def test_values_in_scripts_and_env_lists_are_found_and_the_harmless_are_left() -> None:
    r = Redactor(
        [
            registration(
                {
                    "envs": ["GRAFANA_PASSWORD=letmein99", "NCCL_DEBUG=WARN", "API_KEY_FILE=/etc/k"],
                    "create": '#!/usr/bin/env bash\nexport HF_TOKEN=hf_inScriptValue12345678901\nkey="$(cat /etc/k)"\n',
                    "command": ["vllm", "serve", "/m", "--api-key", "abc12345x"],
                }
            )
        ]
    )
    assert [str(x) for x in r.redactions] == [
        "inputs.envs[0] (env GRAFANA_PASSWORD) in c",
        "inputs.create (script assignment HF_TOKEN) in c",
        "inputs.command[4] (flag --api-key) in c",
    ]
    assert r.text("GRAFANA_PASSWORD=letmein99 NCCL_DEBUG=WARN x=$(cat /f) --api-key abc12345x") == (
        f"GRAFANA_PASSWORD={REDACTED} NCCL_DEBUG=WARN x=$(cat /f) --api-key {REDACTED}"
    )
    assert r.data({"env": {"SOME_TOKEN": "v", "PATH": "/bin"}, "argv": ["--hf-token", "tok"]}) == {
        "env": {"SOME_TOKEN": REDACTED, "PATH": "/bin"},
        "argv": ["--hf-token", REDACTED],
    }
    # Pulumi secrets are already masked; references to files and variables are not credentials.
    assert r.text("X_SECRET=[secret] Y_TOKEN=$TOKEN Z_PASSWORD=/run/secrets/z") == (
        "X_SECRET=[secret] Y_TOKEN=$TOKEN Z_PASSWORD=/run/secrets/z"
    )


def test_a_fault_shared_by_a_pools_containers_is_one_violation_naming_its_instances(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "plan", "--config", str(planted_stack(tmp_path)), "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    policy = done.stdout.split("\nPolicy\n")[1]
    entries = [
        " ".join(e.split())
        for e in re.split(r"\n(?=  \S)", policy)
        if e.startswith("  [mandatory] no-plaintext-secrets")
    ]
    pools = [e for e in entries if "pools." in e]
    # Nothing built from a pool's argv outside its containers carries the credentials (the gates check
    # masked argvs), so every report is at a pool with its keys, none per node.
    assert len(pools) == len(entries) == 2, entries
    # The pack reports once per pool, on its first instance's container, naming every instance and the keys.
    assert [e.split(": ")[0] for e in pools] == [
        "[mandatory] no-plaintext-secrets · reasoning-gpu-01-ray-head",
        "[mandatory] no-plaintext-secrets · chat-gpu-03-vllm",
    ]
    chat = pools[1].split("remote scripts. ", 1)[1]
    assert chat.startswith(
        "pools.chat, 4 instances (chat-gpu-03, chat-gpu-04, chat-gpu-05, chat-gpu-06): "
        "credential in plain text: env HF_TOKEN, env WANDB_API_KEY, env X_TOKEN, --hf-token. "
    )
    assert chat.endswith(
        "Stack keys to edit: pools.chat.env.HF_TOKEN (HF_TOKEN), nccl.extraEnv.WANDB_API_KEY "
        "(WANDB_API_KEY), pools.chat.env.X_TOKEN (X_TOKEN), pools.chat.vllm.extraArgs[0] (given in "
        "extraArgs: --hf-token)."
    )
    # The Ray head also carries --api-key (vLLM runs there): each container's finding is said with its name.
    reasoning = pools[0].split("remote scripts. ", 1)[1]
    assert reasoning.startswith(
        "pools.reasoning, instance reasoning-gpu-01: in reasoning-gpu-01-ray-head: credential in plain text: env "
        "WANDB_API_KEY, --api-key; in reasoning-gpu-01-ray-worker-gpu-02: credential in plain text: env "
        "WANDB_API_KEY. Anyone with docker"
    )
    assert reasoning.endswith(
        "Stack keys to edit: nccl.extraEnv.WANDB_API_KEY (WANDB_API_KEY), "
        "pools.reasoning.vllm.extraArgs[0] (given in extraArgs: --api-key)."
    )


def test_registry_credentials_never_leave_their_secret_envelope(tmp_path: Path) -> None:
    from plan.stackfile import secret_placeholder

    config: dict[str, Any] = prod_config()
    config[NS + "images"] = {"airGapped": True, "registry": "registry.example:5000"}
    for key in ("registryUsername", "registryPassword"):
        config[NS + key] = {"secure": f"v1:ciphertext-of-{key}"}
    path = tmp_path / "Pulumi.registry.yaml"
    path.write_text(yaml.safe_dump({"config": config}))
    out = tmp_path / "out"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "plan",
            "--config",
            str(path),
            "--out",
            str(out),
            "--sarif",
            str(out / "verdicts.sarif"),
            "--junit",
            str(out / "verdicts.xml"),
        ],
        cwd=ROOT,
        capture_output=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()
    written = {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    for key in ("registryUsername", "registryPassword"):
        for value in (secret_placeholder("registry", NS + key), f"ciphertext-of-{key}"):
            for name, data in {"stdout": done.stdout, "stderr": done.stderr, **written}.items():
                assert value.encode() not in data, f"{key} in {name}"
    doc = json.loads(written["registry/plan.json"])
    providers = [r for r in doc["resources"] if r["type"] == "pulumi:providers:docker"]
    assert len(providers) == 6 and all(p["inputs"]["registryAuth"] == "[secret]" for p in providers)


def test_credentials_written_into_the_registry_address_are_refused_and_not_echoed(tmp_path: Path) -> None:
    config: dict[str, Any] = prod_config()
    config[NS + "images"] = {"registry": "deploy:planted-registry-pass-0005@registry.example:5000"}
    path = tmp_path / "Pulumi.inline.yaml"
    path.write_text(yaml.safe_dump({"config": config}))
    done = subprocess.run(
        [sys.executable, "-m", "plan", "--config", str(path), "--out", str(tmp_path / "out")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2
    assert "images.registry: holds credentials (user:password@)" in done.stdout + done.stderr
    assert "planted-registry-pass-0005" not in done.stdout + done.stderr


def test_an_invalid_stack_quoting_a_credential_is_reported_redacted_by_every_planning_cli(tmp_path: Path) -> None:
    # A token pasted into the wrong key: the spec's message quotes the value it refuses. Only the CLIs
    # that stop at the spec run here (doctor and loadtest share plan.stackfile.load_spec, and would
    # reach the nodes of a valid stack).
    config: dict[str, Any] = prod_config()
    token = "hf_" + "plantedaddresstoken0007"
    config[NS + "nodes"]["gpu-01"]["address"] = token
    path = tmp_path / "Pulumi.inline.yaml"
    path.write_text(yaml.safe_dump({"config": config}))
    for module, *extra in (("plan", "--out", str(tmp_path / "out")), ("ops.images",)):
        done = subprocess.run(
            [sys.executable, "-m", module, "--config", str(path), *extra],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 2, (module, done.stderr)
        assert done.stderr == (
            f"invalid stack config {path}:\n  nodes.gpu-01.address: '{REDACTED}' is not an IPv4 address\n"
        ), module
        assert token not in done.stdout + done.stderr


def _pool_of(r: Registration, by_urn: dict[str, Registration]) -> str | None:
    """The pool a resource belongs to as the pack sees it (policies.rules.grouped): its pool label, else
    the nearest ModelServer or RayCluster parent's pool."""
    from components.marks import MODEL_SERVER, RAY_CLUSTER

    labels = {lbl.get("label"): lbl.get("value") for lbl in r.plain_inputs().get("labels") or []}
    if labels.get("llm-cluster.pool"):
        return labels["llm-cluster.pool"]
    at: Registration | None = r
    while at is not None:
        if at.type in (MODEL_SERVER, RAY_CLUSTER):
            return at.outputs.get("pool")
        at = by_urn.get(at.parent)
    return None


def test_a_pools_credential_reaches_only_that_pools_resources_and_the_gates_check_it_masked(tmp_path: Path) -> None:
    from tests.conftest import run_stack

    config = yaml.safe_load(planted_stack(tmp_path).read_text())["config"]
    run = run_stack(config, preview=True)
    by_urn = {r.urn: r for r in run.registrations}
    argv_values = {
        PLANTED["pools.chat.vllm.extraArgs --hf-token="]: "chat",
        PLANTED["pools.reasoning.vllm.extraArgs --api-key"]: "reasoning",
    }
    holders: dict[str, set[str | None]] = {}
    for r in run.registrations:
        text = json.dumps([r.plain_inputs(), r.outputs])
        for value, pool in argv_values.items():
            if value in text:
                holders.setdefault(pool, set()).add(_pool_of(r, by_urn))
    # Every resource holding a pool's credential is that pool's (the pack reports it there, with its key).
    assert holders == {"chat": {"chat"}, "reasoning": {"reasoning"}}
    gates = [r for r in run.registrations if r.type == "command:remote:Command" and "-qualify-" in r.name]
    chat_gate = next(r for r in gates if r.name == "gpu-03-qualify-vllm-openai-v0-19-1-check")
    assert '"--hf-token=[redacted]"' in chat_gate.plain_inputs()["create"]
    reasoning_gate = next(r for r in gates if r.name.startswith("gpu-01-qualify-"))
    assert '"--api-key", "[redacted]"' in reasoning_gate.plain_inputs()["create"]


# The other engines' credential flags (their own parsers' names), each planted in the pool's extraArgs.
ENGINE_PLANTS = {
    "Pulumi.lmdeploy-awq.yaml": ("lmdeploy", ["--api-keys", "planted-lmdeploy-key-0008", "planted-lmdeploy-key-0009"]),
    "Pulumi.llamacpp-deepseek-r1.yaml": (
        "llamacpp",
        ["--api-key", "planted-llamacpp-key-0010", "-hft", "planted-llamacpp-hf-0011"],
    ),
}


@pytest.mark.parametrize("stack_file", sorted(ENGINE_PLANTS))
def test_every_engines_credential_flags_are_refused_at_the_pool_and_never_written(
    tmp_path: Path, stack_file: str
) -> None:
    engine, extra = ENGINE_PLANTS[stack_file]
    doc = yaml.safe_load((ROOT / stack_file).read_text())
    ((pool, spec),) = doc["config"][NS + "pools"].items()
    spec[engine]["extraArgs"] = extra
    path = tmp_path / "Pulumi.planted.yaml"
    path.write_text(yaml.safe_dump(doc))
    out = tmp_path / "out"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "plan",
            "--config",
            str(path),
            "--out",
            str(out),
            "--sarif",
            str(out / "verdicts.sarif"),
            "--junit",
            str(out / "verdicts.xml"),
        ],
        cwd=ROOT,
        capture_output=True,
        timeout=300,
    )
    assert done.returncode == 1, done.stderr.decode()
    streams = {
        "stdout": done.stdout,
        "stderr": done.stderr,
        **{str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()},
    }
    for value in (v for v in extra if not v.startswith("-")):
        for name, data in streams.items():
            assert value.encode() not in data, f"{value} is in {name}"
    policy = done.stdout.decode().split("\nPolicy\n")[1]
    entries = [" ".join(e.split()) for e in re.split(r"\n(?=  \S)", policy) if "no-plaintext-secrets" in e]
    assert len(entries) == 1 and f"remote scripts. pools.{pool}, " in entries[0], entries  # at the pool, not per gate
    flags = [{"-hft": "--hf-token"}.get(v, v) for v in extra if v.startswith("-")]  # said by its long name
    assert f"credential in plain text: {', '.join(flags)}. " in entries[0]
    keys = ", ".join(
        f"pools.{pool}.{engine}.extraArgs[{i}] (given in extraArgs: {f})"
        for i, f in zip((k for k, v in enumerate(extra) if v.startswith("-")), flags)
    )
    assert entries[0].endswith(f"Stack key{'s' if len(flags) > 1 else ''} to edit: {keys}."), entries[0]


def test_every_value_a_credential_flag_takes_is_found_and_the_gate_masks_each() -> None:
    from components.engines.base import masked_secrets
    from components.engines.registry import SECRET_FLAGS

    argv = ["vllm", "serve", "/m", "--api-key", "key-one-0012", "key-two-0013", "--port", "8000", "--hf-token=tok-0014"]
    r = Redactor([registration({"command": argv})])
    assert [str(x) for x in r.redactions] == [
        "inputs.command[4] (flag --api-key) in c",
        "inputs.command[5] (flag --api-key) in c",
        "inputs.command[8] (flag --hf-token) in c",
    ]
    assert r.data({"argv": argv})["argv"] == [*argv[:4], REDACTED, REDACTED, "--port", "8000", f"--hf-token={REDACTED}"]
    assert masked_secrets(argv, SECRET_FLAGS) == r.data({"argv": argv})["argv"]
    # llama.cpp's short spelling takes one value; the next word is the server's own.
    assert masked_secrets(["llama-server", "-hft", "tok", "-m", "/w.gguf"], SECRET_FLAGS) == [
        "llama-server",
        "-hft",
        REDACTED,
        "-m",
        "/w.gguf",
    ]


def test_a_credential_in_a_scripts_json_argv_is_found_and_the_mask_is_not() -> None:
    from policies.rules.security import secret_findings

    script = 'python3 -c "$CHECK" \'{"argvs": [["serve", "/m", "--api-key", "%s", "--hf-token=%s"]]}\''
    assert secret_findings(None, {}, [script % ("abc123", "tok9")], set()) == ["script --api-key", "script --hf-token"]
    assert secret_findings(None, {}, [script % (REDACTED, REDACTED)], set()) == []


def test_every_place_a_credential_is_found_with_its_value_path_and_reason() -> None:
    """The whole table of places (mutation testing found reasons and paths no other test compared): an env
    map at any depth, NAME=value with '=' in the value and a lower-case name, a flag's value deep in a
    list past index 9, --flag=value, one-line and no-space scripts, a shape, a component's outputs; and
    beside each, the look-alike that is no credential."""
    deep = ["serve", "/m", "--port", 8000, *["-v"] * 7, "--api-key", "deep-flag-value-01"]
    one = registration(
        {
            "container": {"env": {"MY_API_KEY": "env-map-value-02", "PATH": "/bin", "X_TOKEN": "$FROM_ENV"}},
            "labels": {"X_TOKEN": "label-not-env-03"},
            "envs": ["db_password=a=b=c-value-04", "NCCL_DEBUG=WARN"],
            "containers": [{"command": deep}],
            "args": ["--hf-token=flag-eq-value-05", "--hf-token=$HF"],
            "oneline": "export HF_TOKEN=one-line-value-06 && NCCL_DEBUG=INFO run",
            "nospace": "A=1\nGRAFANA_PASSWORD=no-space-value-07",
            "flagged": "vllm serve /m --api-key script-flag-value-08",
            "mirror": "ghp_SHAPEDa1b2C3d4E5f6G7h8I9j0K1l2M3n4",
        }
    )
    one.outputs = {"token": "xoxb-OUTPUTshape-1234567890-abcdefghij"}
    other = registration({"container": {"env": {"MY_API_KEY": "env-map-value-02"}}})
    other.name = "d"
    r = Redactor([one, other])
    assert [(x.resource, x.path, x.why) for x in r.redactions] == [
        ("c, d", "inputs.container.env.MY_API_KEY", "env MY_API_KEY"),
        ("c", "inputs.envs[0]", "env db_password"),
        ("c", "inputs.containers[0].command[12]", "flag --api-key"),
        ("c", "inputs.args[0]", "flag --hf-token"),
        ("c", "inputs.oneline", "script assignment HF_TOKEN"),
        ("c", "inputs.nospace", "script assignment GRAFANA_PASSWORD"),
        ("c", "inputs.flagged", "script flag --api-key"),
        ("c", "inputs.mirror", "shaped like a credential"),
        ("c", "outputs.token", "shaped like a credential"),
    ]
    assert r.values == {
        "env-map-value-02",
        "a=b=c-value-04",
        "deep-flag-value-01",
        "flag-eq-value-05",
        "one-line-value-06",
        "no-space-value-07",
        "script-flag-value-08",
        "ghp_SHAPEDa1b2C3d4E5f6G7h8I9j0K1l2M3n4",
        "xoxb-OUTPUTshape-1234567890-abcdefghij",
    }
    assert r.leftovers(["clean", "at no-space-value-07 here", "and env-map-value-02"]) == ["env-…", "no-s…"]
    assert r.leftovers([r.text("at no-space-value-07 here")]) == []


def test_known_values_are_replaced_longest_first_and_from_six_characters() -> None:
    # "zz-secret" sorts before the longer value that holds it in reverse text order, not by length.
    r = Redactor([registration({"env": {"A_TOKEN": "zz-secret", "B_TOKEN": "aa-zz-secret-bb", "C_TOKEN": "six666"}})])
    r6 = Redactor([registration({"env": {"C_TOKEN": "five5"}})])
    assert r.text("x aa-zz-secret-bb y zz-secret z six666") == f"x {REDACTED} y {REDACTED} z {REDACTED}"
    # Five characters are redacted only where they sit (NAME=…), not wherever they occur.
    assert r6.text("five5 C_TOKEN=five5") == f"five5 C_TOKEN={REDACTED}"


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("--api-key abc12345", f"--api-key {REDACTED}"),
        ("--api-key=abc12345", f"--api-key={REDACTED}"),
        ("--api-key 'abc12345'", f"--api-key '{REDACTED}'"),
        ("--api-key $KEY", "--api-key $KEY"),
        ("--api-key /run/key", "--api-key /run/key"),
    ],
)
def test_an_unknown_flag_value_is_masked_in_text_with_its_flag_and_quote_kept(text: str, masked: str) -> None:
    assert Redactor([]).text(text) == masked
