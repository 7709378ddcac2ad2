"""llm-cluster lab stand-in for Triton (not Triton): the image's Triton version and its verdict on fp16 dots.

`@triton.jit` kernels launch as `kernel[grid](*tensors, **constexprs)`. The launch first gives the
compile verdict the project's facts record for this Triton release on the GPU (components/facts/
images.py TRITON: below `fp16_dot_min_capability` it fails with that release's observed compiler
message; tests/test_qualification_triton.py compiles the same kernel with the real wheels), then runs
the kernel's own Python body with triton.language on numpy, one program per grid point. It proves
the gate ships a kernel that computes the right thing and that a failure reaches the deploy as
the gate's message; it does not compile for, or run on, a GPU.
"""

import inspect

from torch import FACTS, Tensor, cuda

__version__ = FACTS["triton"]


class CompilationError(RuntimeError):
    pass


class JITFunction:
    def __init__(self, fn):
        self.fn = fn
        self.params = list(inspect.signature(fn).parameters)

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            from triton import language as tl

            major, minor = cuda.get_device_capability(0)
            capability = major * 10 + minor
            if capability < FACTS["fp16_dot_min_capability"]:
                raise CompilationError(
                    "triton %s on sm_%d (llm-cluster lab stand-in, from the facts): %s"
                    % (__version__, capability, FACTS["triton_failure"])
                )
            bound = [tl.pointer(a) if isinstance(a, Tensor) else a for a in args]
            points = grid if isinstance(grid, tuple) else tuple(grid(kwargs))
            for pid in range(points[0] if points else 1):
                tl._program_id = pid
                self.fn(*bound, **kwargs)

        return launch


def jit(fn=None, **options):
    if fn is None:
        return lambda f: JITFunction(f)
    return JITFunction(fn)
