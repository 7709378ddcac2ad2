"""llm-cluster lab stand-in for PyTorch (not PyTorch): what the qualification gate asks of torch.

It reports the serving image's torch facts (version, CUDA, get_arch_list(): components/engines/vllm/facts.py,
copied into standin.json when the image is built) and the lab hosts' GPU (the captured 8 x Tesla
V100-SXM2-32GB, compute capability 7.0, as the hosts' nvidia-smi shims print it). A container sees
GPUs only when Docker gave it some: NVIDIA_VISIBLE_DEVICES, which dockerd's nvidia device driver sets
from `--gpus`. Tensors are numpy arrays computed on this machine's CPU (fp16 storage, fp32
accumulation as on a GPU's fp16 GEMM). Nothing here runs on a GPU or proves a CUDA kernel.
"""

import json
import os

import numpy as _np

with open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "standin.json")) as _f:
    FACTS = json.load(_f)

__version__ = FACTS["torch"]
float16 = half = _np.dtype("float16")
float32 = float = _np.dtype("float32")


class Tensor:
    """A numpy array that says which device it would live on."""

    def __init__(self, array, device="cpu"):
        self.array = _np.ascontiguousarray(array)
        self.device = device

    def _wrap(self, array):
        return Tensor(array, self.device)

    def float(self):
        return self._wrap(self.array.astype(_np.float32))

    def __matmul__(self, other):
        out = self.array.astype(_np.float32) @ other.array.astype(_np.float32)
        return self._wrap(out.astype(_np.result_type(self.array.dtype, other.array.dtype)))

    def sub(self, other):
        return self._wrap(self.array - other.array)

    def abs(self):
        return self._wrap(_np.abs(self.array))

    def max(self):
        return self._wrap(self.array.max())

    def item(self):
        return self.array.item()

    def numpy(self):
        return self.array

    @property
    def shape(self):
        return self.array.shape

    @property
    def dtype(self):
        return self.array.dtype


def _device(device):
    if str(device).startswith("cuda") and not cuda.is_available():
        raise RuntimeError(
            "Found no NVIDIA driver on your system. (llm-cluster lab stand-in torch: the container was given no GPU)"
        )
    return str(device)


def randn(*shape, device="cpu", dtype=float32):
    return Tensor(_np.random.default_rng(0).standard_normal(shape).astype(dtype), _device(device))


def empty(*shape, device="cpu", dtype=float32):
    return Tensor(_np.zeros(shape, dtype=dtype), _device(device))


from torch import cuda, version  # noqa: E402, F401  (submodules that read FACTS, as torch has them)
