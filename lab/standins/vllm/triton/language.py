"""triton.language of the lab stand-in: the operations of the gate's kernel, on numpy blocks."""

import numpy as _np

_program_id = 0


class constexpr:  # noqa: N801  (Triton's name; used as an annotation)
    pass


class pointer:  # noqa: N801
    """A tensor's flat storage plus a block of element offsets (what `ptr + offs` makes in Triton)."""

    def __init__(self, tensor, offsets=0, flat=None):
        self.tensor = tensor
        self.flat = tensor.array.reshape(-1) if flat is None else flat
        self.offsets = offsets

    def __add__(self, offsets):
        return pointer(self.tensor, self.offsets + offsets, self.flat)

    __radd__ = __add__


def program_id(axis):
    return _program_id


def arange(start, end):
    return _np.arange(start, end)


def load(ptr, mask=None, other=None):
    return ptr.flat[ptr.offsets]


def store(ptr, value, mask=None):
    ptr.flat[ptr.offsets] = _np.asarray(value).astype(ptr.flat.dtype)


def dot(a, b, acc=None):
    out = a.astype(_np.float32) @ b.astype(_np.float32)
    return out if acc is None else acc + out
