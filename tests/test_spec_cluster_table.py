"""The rules of the nodes, SSH, NCCL, models and pools sections (components/spec/cluster.py) as tables: each
rule's function on both sides of its boundary, the refused side with its exact words, and the key path the
stack names for it."""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import pytest

import components.engines.registry  # noqa: F401  (the engines register themselves: the spec reads them)
from components.planning.load import load_stack_config
from components.spec import SpecError
from components.spec.cluster import (
    HOST_KEY_TYPES,
    HcaSpec,
    ImageFactsSpec,
    PoolSpec,
    _ssh_strings,
    absolute_path,
    bandwidth_floor,
    cidr,
    engine_and_image_filled,
    group_size,
    image_reference,
    ipv4_address,
    keys_of_a_registered_engine,
    known_gpu_model,
    known_image,
    listed_once,
    nfs_share,
    not_blank,
    one_architecture,
    one_source,
    port_range,
    posix_user,
    quantization_method,
    registered_engine,
    roce_gid_index,
    served_name,
    source_node,
    ssh_host,
    ssh_host_key,
)
from components.spec.cluster import _fraction as fraction
from tests.conftest import prod_config
from tests.support import host_key

NS = "llm-cluster:"
KEY = host_key("gpu-01")  # ssh-ed25519 AAAA…


def ok(rule: Callable[..., Any], *args: Any) -> Any:
    return rule(*args)


def refused(rule: Callable[..., Any], *args: Any) -> str:
    with pytest.raises(ValueError) as err:
        rule(*args)
    return str(err.value)


def blob(*strings: bytes) -> str:
    return base64.b64encode(b"".join(len(s).to_bytes(4, "big") + s for s in strings)).decode()


# --- addresses, host names, users -------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["192.168.10.11", "10.0.0.1", "0.0.0.0"])
def test_an_ipv4_address_is_taken_as_written(value: str) -> None:
    assert ok(ipv4_address, value) == value


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("192.168.10", "'192.168.10' is not an IPv4 address"),
        ("gpu-01", "'gpu-01' is not an IPv4 address"),
        ("fd00::1", "'fd00::1': IPv6 cluster addresses are not supported yet; give the node's IPv4 address"),
    ],
)
def test_an_address_that_is_no_ipv4_is_refused(value: str, words: str) -> None:
    assert refused(ipv4_address, value) == words


@pytest.mark.parametrize("value", ["gpu-01", "gpu-01.lab.example", "10.0.0.7", "g", "a1.b2"])
def test_an_ssh_address_is_a_host_name_or_ipv4(value: str) -> None:
    assert ok(ssh_host, value) == value


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("10.0.0", "'10.0.0' is not an IPv4 address"),  # all digits: an address, and a wrong one
        ("10.0.0.256", "'10.0.0.256' is not an IPv4 address"),
        ("fd00::1", "'fd00::1': IPv6 cluster addresses are not supported yet; give the node's IPv4 address"),
        ("gpu_01", "'gpu_01' is not a host name or IPv4 address"),
        ("-gpu", "'-gpu' is not a host name or IPv4 address"),
        ("gpu-", "'gpu-' is not a host name or IPv4 address"),
        ("user@gpu", "'user@gpu' is not a host name or IPv4 address"),
    ],
)
def test_an_ssh_address_refused(value: str, words: str) -> None:
    assert refused(ssh_host, value) == words


USER = "is not a POSIX user name (letters, digits, '.', '_', '-', not starting with '-', at most 32 characters)"


@pytest.mark.parametrize("value", ["root", "ubuntu", "_svc", "a.b-c_d", "u" * 32, "0ps"])
def test_a_posix_user_name(value: str) -> None:
    assert ok(posix_user, value) == value


@pytest.mark.parametrize("value", ["-root", "u" * 33, "ro ot", "root;", "", "ad\nmin"])
def test_no_posix_user_name_refused(value: str) -> None:
    assert refused(posix_user, value) == f"{value!r} {USER}"


@pytest.mark.parametrize(
    ("value", "what", "words"),
    [
        ("", "a label", "'' is not allowed: give a label, without spaces around it"),
        ("  ", "a label", "'  ' is not allowed: give a label, without spaces around it"),
        (" x", "a path", "' x' is not allowed: give a path, without spaces around it"),
        ("x\n", "a path", "'x\\n' is not allowed: give a path, without spaces around it"),
    ],
)
def test_not_blank(value: str, what: str, words: str) -> None:
    assert refused(not_blank, value, what) == words
    assert ok(not_blank, "a b", what) == "a b"


# --- host keys -------------------------------------------------------------------------------------------------


def test_ssh_strings_read_a_blob_whole_or_not_at_all() -> None:
    raw = len(b"ssh-ed25519").to_bytes(4, "big") + b"ssh-ed25519" + (3).to_bytes(4, "big") + b"abc"
    assert _ssh_strings(raw) == [b"ssh-ed25519", b"abc"]
    assert _ssh_strings(raw[:-1]) is None  # cut short in the copy
    assert _ssh_strings(b"") == []
    assert _ssh_strings((0).to_bytes(4, "big")) == [b""]


@pytest.mark.parametrize(
    "value",
    [
        KEY,
        KEY + " root@gpu-01",
        f"ssh-rsa {blob(b'ssh-rsa', b'e', b'n')}",
        f"ecdsa-sha2-nistp256 {blob(b'ecdsa-sha2-nistp256', b'nistp256')}",
        *(f"{kind} {blob(kind.encode(), b'k')}" for kind in HOST_KEY_TYPES),
    ],
)
def test_a_host_key_as_known_hosts_holds_it(value: str) -> None:
    assert ok(ssh_host_key, value) == value


WHOLE = "(copy it whole from ssh-keyscan or /etc/ssh/ssh_host_*_key.pub)"


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (
            "",
            "'' is not allowed: give the node's public host key as ssh-keyscan prints it (ssh-ed25519 AAAA…), "
            "without spaces around it",
        ),
        (
            f"gpu-01 {KEY}",
            f"{'gpu-01 ' + KEY!r} is not allowed: it starts with a host name ('gpu-01'); give the key only, the "
            "part after it (ssh-ed25519 AAAA…)",
        ),
        (
            "gpu-01 ssh-ed25519",
            "'gpu-01 ssh-ed25519' is not allowed: it starts with a host name ('gpu-01'); give the key only, the part "
            "after it (ssh-ed25519 AAAA…)",
        ),
        (
            "AAAAC3Nza",
            "'AAAAC3Nza' is not allowed: a host key starts with its type, one of " + ", ".join(HOST_KEY_TYPES),
        ),
        (
            "gpu-01 AAAAC3Nza",
            "'gpu-01 AAAAC3Nza' is not allowed: a host key starts with its type, one of " + ", ".join(HOST_KEY_TYPES),
        ),
        (
            "ssh-ed25519",
            f"'ssh-ed25519' is not allowed: the key after ssh-ed25519 is not an ssh-ed25519 key in base64 {WHOLE}",
        ),
        (
            "ssh-ed25519 !!!!",
            f"'ssh-ed25519 !!!!' is not allowed: the key after ssh-ed25519 is not an ssh-ed25519 key in base64 {WHOLE}",
        ),
        (
            f"ssh-rsa {KEY.split()[1]}",
            f"{'ssh-rsa ' + KEY.split()[1]!r} is not allowed: the key after ssh-rsa is not an ssh-rsa key in base64 "
            f"{WHOLE}",
        ),
        # A character base64 has not: refused, not skipped.
        (
            f"ssh-ed25519 {KEY.split()[1][:20]}*{KEY.split()[1][20:]}",
            f"{'ssh-ed25519 ' + KEY.split()[1][:20] + '*' + KEY.split()[1][20:]!r} is not allowed: the key after "
            f"ssh-ed25519 is not an ssh-ed25519 key in base64 {WHOLE}",
        ),
        # One string only (the type, no key), or cut short.
        (
            f"ssh-ed25519 {blob(b'ssh-ed25519')}",
            f"{'ssh-ed25519 ' + blob(b'ssh-ed25519')!r} is not allowed: the key after ssh-ed25519 is not an "
            f"ssh-ed25519 key in base64 {WHOLE}",
        ),
        (
            f"ssh-ed25519 {KEY.split()[1][:-8]}",
            f"{'ssh-ed25519 ' + KEY.split()[1][:-8]!r} is not allowed: the key after ssh-ed25519 is not an "
            f"ssh-ed25519 key in base64 {WHOLE}",
        ),
    ],
)
def test_a_host_key_refused(value: str, words: str) -> None:
    assert refused(ssh_host_key, value) == words


# --- GPUs, HCAs, ranges --------------------------------------------------------------------------------------


def test_a_gpu_model_the_facts_know() -> None:
    assert ok(known_gpu_model, "Tesla V100-SXM2-32GB") == "Tesla V100-SXM2-32GB"
    words = refused(known_gpu_model, "Tesla V100")
    assert words.startswith("unknown GPU model 'Tesla V100'; known: NVIDIA A10, NVIDIA A100 80GB PCIe, ")
    assert words.endswith(", Tesla V100-SXM2-16GB, Tesla V100-SXM2-32GB")


@pytest.mark.parametrize(
    ("stated", "rate", "floor"),
    [(None, 200, 190.0), (None, 100, 95.0), (None, 25, 23.8), (150.0, 200, 150.0), (None, 1, 0.9)],
)
def test_the_rdma_bandwidth_floor(stated: float | None, rate: int, floor: float) -> None:
    assert bandwidth_floor(stated, rate) == floor
    hca = HcaSpec.model_validate(
        {"device": "mlx5_0", "linkLayer": "infiniband", "rateGbps": rate}
        | ({"minWriteBandwidthGbps": stated} if stated else {})
    )
    assert hca.bandwidth_floor_gbps == floor


def test_roce_needs_its_gid_index_infiniband_does_not() -> None:
    assert roce_gid_index("ethernet", 3) is None
    assert roce_gid_index("ethernet", 0) is None
    assert roce_gid_index("infiniband", None) is None
    assert refused(roce_gid_index, "ethernet", None) == (
        "gidIndex is required for RoCE (linkLayer: ethernet); RoCEv2 is usually 3"
    )


@pytest.mark.parametrize("value", [(32768, 60999), (1024, 1024), (1, 65535)])
def test_a_port_range_first_to_last(value: tuple[int, int]) -> None:
    assert ok(port_range, value) == value


def test_a_port_range_backwards_is_refused() -> None:
    assert refused(port_range, (61000, 32768)) == "61000 > 32768: give [first, last] of the range"
    assert refused(port_range, (1025, 1024)) == "1025 > 1024: give [first, last] of the range"


@pytest.mark.parametrize(
    ("value", "network"),
    [("10.0.0.0/8", "10.0.0.0/8"), ("192.168.1.7", "192.168.1.7/32"), ("fd00::/8", "fd00::/8")],
)
def test_a_cidr_network(value: str, network: str) -> None:
    assert ok(cidr, value) == network


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("10.0.0.1/8", "'10.0.0.1/8' is not a CIDR network (10.0.0.1/8 has host bits set); did you mean 10.0.0.0/8?"),
        (
            "10.0.0.0/33",
            "'10.0.0.0/33' is not a CIDR network ('10.0.0.0/33' does not appear to be an IPv4 or IPv6 network)",
        ),
        ("lab", "'lab' is not a CIDR network ('lab' does not appear to be an IPv4 or IPv6 network)"),
    ],
)
def test_no_cidr_network_refused(value: str, words: str) -> None:
    assert refused(cidr, value) == words


# --- the weights' source ---------------------------------------------------------------------------------------

SHARE = (
    "is not an NFS share server:/path (a host name or IPv4 address, then an absolute path of letters, digits and "
    ". _ + / -)"
)
ONE = "state exactly one of node, sharedMount, present (got {})"


def test_a_source_node_is_named() -> None:
    assert ok(source_node, "gpu-01") == "gpu-01"
    for blank in ("", "  ", "\t"):
        assert refused(source_node, blank) == (
            f"{blank!r} is not allowed: name the node that holds the weights, or use sharedMount or present"
        )


@pytest.mark.parametrize("value", ["nfs:/models", "10.0.0.5:/export/models", "nas.lab:/", "n:/a_b+c.d/e-f"])
def test_an_nfs_share(value: str) -> None:
    assert ok(nfs_share, value) == value


@pytest.mark.parametrize("value", ["nfs:models", "/export", "nfs:/a b", "nfs:/a;b", "-nfs:/a", "nfs:/a'b", ":/a"])
def test_no_nfs_share_refused(value: str) -> None:
    assert refused(nfs_share, value) == f"{value!r} {SHARE}"


@pytest.mark.parametrize(
    ("node", "share", "present", "given"),
    [
        (None, None, False, "none"),
        ("gpu-01", "nfs:/m", False, "['node', 'sharedMount']"),
        ("gpu-01", None, True, "['node', 'present']"),
        (None, "nfs:/m", True, "['sharedMount', 'present']"),
        ("gpu-01", "nfs:/m", True, "['node', 'sharedMount', 'present']"),
    ],
)
def test_weights_from_exactly_one_source(node: str | None, share: str | None, present: bool, given: str) -> None:
    assert refused(one_source, node, share, present) == ONE.format(given)


@pytest.mark.parametrize(
    ("node", "share", "present"), [("gpu-01", None, False), (None, "nfs:/m", False), (None, None, True)]
)
def test_one_source_is_enough(node: str | None, share: str | None, present: bool) -> None:
    assert one_source(node, share, present) is None


# --- models: names served, groups, methods, architecture -----------------------------------------------------

SERVED = (
    "is not allowed: a served name is what clients send as `model`: not empty, no leading or trailing whitespace, "
    "no control characters"
)


@pytest.mark.parametrize("value", ["qwen3", "/data/models/Qwen3-30B-A3B", "a b", "Qwen 3 (fast)", "é"])
def test_a_served_name(value: str) -> None:
    assert ok(served_name, value) == value


@pytest.mark.parametrize("value", ["", " ", " qwen", "qwen ", "qw\ten", "qwen\x00", "qw\u200ben"])
def test_no_served_name_refused(value: str) -> None:
    assert refused(served_name, value) == f"{value!r} {SERVED}"


def test_a_group_size_is_never_zero() -> None:
    for v in (-1, 1, 32, 128):
        assert ok(group_size, v) == v
    assert refused(group_size, 0) == (
        "0 is not allowed: a group of 0 weights does not exist; give the checkpoint's group_size (128, 64, 32), or "
        "-1 for per-channel quantization"
    )


def test_a_quantization_method_one_engine_knows() -> None:
    assert ok(quantization_method, "gptq") == "gptq"
    assert ok(quantization_method, "awq") == "awq"
    words = refused(quantization_method, "GPTQ")
    assert words.startswith("unknown quantization 'GPTQ'; the known engine versions know: aqlm, auto-round, awq, ")
    assert ", gptq, " in words


def test_exactly_one_of_arch_and_config_json() -> None:
    assert one_architecture("qwen3-30b-a3b", None) is None
    assert one_architecture(None, "configs/x.json") is None
    for arch, config_json in (("qwen3-30b-a3b", "configs/x.json"), (None, None)):
        assert refused(one_architecture, arch, config_json) == (
            "state exactly one of arch (a catalog name) or configJson (a path)"
        )


# --- fractions, images, lists, paths -------------------------------------------------------------------------


@pytest.mark.parametrize("value", [1.0, 0.9, 1e-9])
def test_a_fraction(value: float) -> None:
    assert ok(fraction, value) == value


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (0.0, "0 is not allowed: this is a fraction, 0 < x <= 1"),
        (-0.5, "-0.5 is not allowed: this is a fraction, 0 < x <= 1"),
        (1.0001, "1.0001 is not allowed: this is a fraction, 0 < x <= 1"),
        (1.5, "1.5 is not allowed: this is a fraction, 0 < x <= 1"),
        (2.0, "2 is not allowed: this is a fraction, 0 < x <= 1; 2% is 0.02"),
        (90.0, "90 is not allowed: this is a fraction, 0 < x <= 1; 90% is 0.9"),
        (100.0, "100 is not allowed: this is a fraction, 0 < x <= 1; 100% is 1"),
        (100.5, "100.5 is not allowed: this is a fraction, 0 < x <= 1"),
        (1.99, "1.99 is not allowed: this is a fraction, 0 < x <= 1"),
    ],
)
def test_a_fraction_refused(value: float, words: str) -> None:
    assert refused(fraction, value) == words


@pytest.mark.parametrize(
    "value",
    [
        "vllm/vllm-openai:v0.19.1",
        "registry.local:5000/vllm/vllm-openai:v0.19.1",
        "localhost/x",
        "reg:5000/x",
        "python:3.12-slim",
        "prom/node-exporter@sha256:" + "a" * 64,
        "Registry.Local:5000/vllm/vllm-openai:v0.19.1",
    ],
)
def test_an_image_reference(value: str) -> None:
    assert ok(image_reference, value) == value


IMAGE = (
    "is not an image reference: [registry/]repository[:tag][@sha256:digest], the repository of lower-case letters, "
    "digits and . _ - separated by /"
)


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (" vllm/x", "' vllm/x': an image reference holds no whitespace"),
        ("vllm /x", "'vllm /x': an image reference holds no whitespace"),
        ("vllm/x\t", "'vllm/x\\t': an image reference holds no whitespace"),
        (
            "vllm/VLLM-openai:v1",
            "'vllm/VLLM-openai:v1': Docker refuses it (repository name must be lowercase): write 'vllm/vllm-openai:v1'",
        ),
        (
            "Vllm/x",
            "'Vllm/x': Docker refuses it (repository name must be lowercase): write 'vllm/x'",
        ),
        # The registry host keeps its case; the path after it is what must be lower-case.
        (
            "Reg.Local:5000/Vllm/X:TAG",
            "'Reg.Local:5000/Vllm/X:TAG': Docker refuses it (repository name must be lowercase): write "
            "'Reg.Local:5000/vllm/x:TAG'",
        ),
        (
            "localhost/Vllm",
            "'localhost/Vllm': Docker refuses it (repository name must be lowercase): write 'localhost/vllm'",
        ),
        (
            "Vllm@sha256:" + "a" * 64,
            f"'Vllm@sha256:{'a' * 64}': Docker refuses it (repository name must be lowercase): write "
            f"'vllm@sha256:{'a' * 64}'",
        ),
        # A first component without a dot or port is no registry: lower-cased with the path.
        ("Lab/vllm:TAG", "'Lab/vllm:TAG': Docker refuses it (repository name must be lowercase): write 'lab/vllm:TAG'"),
        # The registry named like the repository, and a registry's port with a digest: the path is lower-cased.
        ("Lab.io/Lab:1", "'Lab.io/Lab:1': Docker refuses it (repository name must be lowercase): write 'Lab.io/lab:1'"),
        ("Reg.io/X:X", "'Reg.io/X:X': Docker refuses it (repository name must be lowercase): write 'Reg.io/x:X'"),
        (
            f"reg:5000/X@sha256:{'a' * 64}",
            f"'reg:5000/X@sha256:{'a' * 64}': Docker refuses it (repository name must be lowercase): write "
            f"'reg:5000/x@sha256:{'a' * 64}'",
        ),
        # Only `localhost` in lower case is a registry without a dot or port (Docker's rule).
        ("LOCALHOST/X", "'LOCALHOST/X': Docker refuses it (repository name must be lowercase): write 'localhost/x'"),
        # A tag is a ':' in the last segment only; a digest is cut off first, whatever its case.
        ("r.io/a:b/X", "'r.io/a:b/X': Docker refuses it (repository name must be lowercase): write 'r.io/a:b/x'"),
        ("X@Sha256:abc", "'X@Sha256:abc': Docker refuses it (repository name must be lowercase): write 'x@Sha256:abc'"),
        # The first segment alone says whether there is a registry.
        ("Lab/a.b/X", "'Lab/a.b/X': Docker refuses it (repository name must be lowercase): write 'lab/a.b/x'"),
        # The repository ends at the first @.
        ("Lab@X@y", "'Lab@X@y': Docker refuses it (repository name must be lowercase): write 'lab@X@y'"),
        ("vllm/x:", f"'vllm/x:' {IMAGE}"),
        ("vllm//x", f"'vllm//x' {IMAGE}"),
        ("vllm/x@sha256:abc", f"'vllm/x@sha256:abc' {IMAGE}"),
        ("", f"'' {IMAGE}"),
    ],
)
def test_an_image_reference_refused(value: str, words: str) -> None:
    assert refused(image_reference, value) == words


def test_listed_once() -> None:
    assert ok(listed_once, ["a", "b"], "node ") == ["a", "b"]
    assert ok(listed_once, [], "") == []
    assert refused(listed_once, ["a", "b", "b", "a"], "node ") == "node 'b' is listed twice"
    assert refused(listed_once, ["a", "a"], "") == "'a' is listed twice"


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("data", "'data' must be an absolute path on the node (starting with /)"),
        ("", "'' must be an absolute path on the node (starting with /)"),
        ("/da ta", "'/da ta': the path may not hold whitespace, quotes or backslashes (found [' '])"),
        (
            "/d'a\"t\\a",
            "'/d\\'a\"t\\\\a': the path may not hold whitespace, quotes or backslashes (found ['\"', \"'\", '\\\\'])",
        ),
        ("/a\tb\nc", "'/a\\tb\\nc': the path may not hold whitespace, quotes or backslashes (found ['\\t', '\\n'])"),
    ],
)
def test_an_absolute_path_refused(value: str, words: str) -> None:
    assert refused(absolute_path, value, "on the node") == words
    for path in ("/data/models/Qwen3-30B-A3B", "/X", "/"):
        assert ok(absolute_path, path, "on the node") == path


# --- images' facts, engines, pools' options blocks -----------------------------------------------------------


def test_image_facts_like_a_known_image() -> None:
    assert ok(known_image, "vllm/vllm-openai:v0.19.1") == "vllm/vllm-openai:v0.19.1"
    assert refused(known_image, "vllm/vllm-openai:v9") == (
        "'vllm/vllm-openai:v9' is not a known image; known: vllm/vllm-openai:v0.11.0, vllm/vllm-openai:v0.19.1, "
        "vllm/vllm-openai:v0.19.1-ubuntu2404, vllm/vllm-openai:v0.9.2"
    )


def test_image_facts_overrides_are_the_stated_facts() -> None:
    facts = ImageFactsSpec.model_validate(
        {"like": "vllm/vllm-openai:v0.19.1", "version": "0.19.2", "torchArchList": [70, 80], "triton": "3.6.0"}
    )
    assert facts.overrides() == {"version": "0.19.2", "torch_arch_list": [70, 80], "triton": "3.6.0"}
    assert ImageFactsSpec.model_validate({"like": "vllm/vllm-openai:v0.19.1"}).overrides() == {}


ENGINES = "'vllm', 'lmdeploy', 'llamacpp', 'sglang', 'tgi', 'tensorrt-llm', 'triton', 'deepspeed-mii', 'xinference' or 'ollama'"


def test_an_engine_the_registry_knows() -> None:
    assert ok(registered_engine, "llamacpp") == "llamacpp"
    assert ok(registered_engine, "sglang") == "sglang"  # known, refused later with the reason for the GPU
    with pytest.raises(Exception) as err:
        registered_engine("vLLM")
    assert err.value.type == "literal_error"  # type: ignore[attr-defined]
    assert err.value.message() == f"Input should be {ENGINES}"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("data", "filled"),
    [
        ({}, {"engine": "vllm", "image": "vllm/vllm-openai:v0.19.1"}),
        ({"engine": ""}, {"engine": "vllm", "image": "vllm/vllm-openai:v0.19.1"}),
        ({"engine": "lmdeploy"}, {"engine": "lmdeploy", "image": "openmmlab/lmdeploy:v0.16.0-cu12.8"}),
        (
            {"engine": "llamacpp", "image": ""},
            {"engine": "llamacpp", "image": "ghcr.io/ggml-org/llama.cpp:server-cuda-b11312"},
        ),
        ({"engine": "vllm", "image": "mine/vllm:1"}, {"engine": "vllm", "image": "mine/vllm:1"}),
        ({"engine": "sglang"}, {"engine": "sglang"}),
        ({"engine": 7}, {"engine": 7}),
        ({"engine": ["vllm"]}, {"engine": ["vllm"]}),  # no engine name: its own type error says so
        ("chat", "chat"),
    ],
)
def test_a_pools_engine_and_image_defaults(data: Any, filled: Any) -> None:
    assert engine_and_image_filled(data) == filled


@pytest.mark.parametrize(
    ("data", "read"),
    [
        # A registered engine: every key is read (the unknown one is refused next).
        (
            {"engine": "vllm", "vllm": {}, "sglang": {}, "tensorParalel": 8},
            {"engine": "vllm", "vllm": {}, "sglang": {}, "tensorParalel": 8},
        ),
        # An engine that is not deployed: its block and any other unknown key are left to the engine's refusal.
        ({"engine": "vLLM", "sglang": {}, "vllm": {}, "model": "m"}, {"engine": "vLLM", "vllm": {}, "model": "m"}),
        # An engine the project knows but does not deploy: its keys are read, and refused with the engine.
        ({"engine": "sglang", "sglang": {}}, {"engine": "sglang", "sglang": {}}),
        ({"engine": 8, "sglang": {}}, {"engine": 8, "sglang": {}}),
        ({"sglang": {}}, {"sglang": {}}),
        (["engine"], ["engine"]),
    ],
)
def test_the_keys_read_of_a_pool_on_each_kind_of_engine(data: Any, read: Any) -> None:
    assert keys_of_a_registered_engine(data, PoolSpec._allowed_keys()) == read


def test_a_pools_allowed_keys_are_its_own_and_every_options_block() -> None:
    allowed = PoolSpec._allowed_keys()
    assert {"vllm", "lmdeploy", "llamacpp", "tensorParallel", "shmSizeGib", "engine"} <= allowed
    assert "sglang" not in allowed and "tensor_parallel" not in allowed


def pool_config(**values: Any) -> dict[str, Any]:
    config = prod_config()
    config[NS + "pools"]["chat"].update(values)
    return config


def test_a_pools_options_block_read_as_an_attribute() -> None:
    spec = load_stack_config(prod_config(), set())
    chat = spec.pools["chat"]
    assert chat.options is chat.vllm
    assert chat.vllm.max_model_len == 32768
    assert chat.lmdeploy is None and chat.llamacpp is None
    with pytest.raises(AttributeError):
        chat.sglang  # noqa: B018  (no engine of that key is deployed: no attribute)
    with pytest.raises(AttributeError):
        chat._vllm  # noqa: B018


@pytest.mark.parametrize(
    ("values", "issues"),
    [
        (
            {"engine": "lmdeploy"},
            ["pools.chat: engine lmdeploy needs its options block `lmdeploy` (e.g. lmdeploy: {sessionLen: ...})"],
        ),
        (
            {"engine": "lmdeploy", "lmdeploy": {"sessionLen": 4096}},
            ["pools.chat: `vllm` options do not apply to engine lmdeploy; state `lmdeploy` instead"],
        ),
        (
            {"lmdeploy": {"sessionLen": 4096}},
            ["pools.chat: `lmdeploy` options do not apply to engine vllm; state `vllm` instead"],
        ),
        (
            {"engine": "sglang", "image": "lmsysorg/sglang:v0.5"},
            ["pools.chat: `vllm` options do not apply to engine sglang; remove them"],
        ),
        # Errors in the pool and in its block come together, each with its key.
        (
            {"tensorParallel": 0, "vllm": {"maxModelLen": "x"}},
            [
                "pools.chat.tensorParallel: 0 is not allowed: must be at least 1",
                "pools.chat.vllm.maxModelLen: 'x' is not allowed: expected a whole number",
            ],
        ),
        ({"vllm": {"maxModelLen": "x"}}, ["pools.chat.vllm.maxModelLen: 'x' is not allowed: expected a whole number"]),
        ({"tensorParallel": 0}, ["pools.chat.tensorParallel: 0 is not allowed: must be at least 1"]),
        ({"vllm": "x"}, ["pools.chat.vllm: 'x' is not allowed: expected a mapping (key: value lines)"]),
        # A relayed message quoting braces the user wrote keeps them (not read as a template).
        (
            {"image": "{x}"},
            [
                "pools.chat.image: '{x}' is not an image reference: [registry/]repository[:tag][@sha256:digest], "
                "the repository of lower-case letters, digits and . _ - separated by /"
            ],
        ),
    ],
)
def test_a_pools_options_block_refused(values: dict[str, Any], issues: list[str]) -> None:
    with pytest.raises(SpecError) as err:
        load_stack_config(pool_config(**values), set())
    assert [str(i) for i in err.value.issues] == issues


def test_a_pool_on_another_engine_has_no_options() -> None:
    pool = PoolSpec.model_validate(
        {"model": "m", "nodes": ["n"], "engine": "sglang", "image": "lmsysorg/sglang:v0.5", "tensorParallel": 1}
    )
    assert pool.options is None and pool.vllm is None
    chat = load_stack_config(prod_config(), set()).pools["chat"]
    assert type(chat.options).__name__ == "VllmOptions"
