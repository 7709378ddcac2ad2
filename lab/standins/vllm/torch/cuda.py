"""torch.cuda of the lab stand-in: the GPUs Docker gave the container, as the lab hosts' shims describe them."""

import os

from torch import FACTS


def _visible():
    value = os.environ.get("NVIDIA_VISIBLE_DEVICES", "").strip()
    if value in ("", "void", "none"):
        return []
    if value == "all":
        return list(range(FACTS["gpu"]["count"]))
    return [v for v in value.split(",") if v]


def is_available():
    return bool(_visible())


def device_count():
    return len(_visible())


def _check(device):
    if not 0 <= int(device) < device_count():
        raise RuntimeError("CUDA error: invalid device ordinal")


def get_device_name(device=0):
    _check(device)
    return FACTS["gpu"]["name"]


def get_device_capability(device=0):
    _check(device)
    return tuple(FACTS["gpu"]["capability"])


def get_arch_list():
    return ["sm_%d" % a for a in FACTS["torch_arch_list"]] if is_available() else []


def synchronize(device=None):
    pass
