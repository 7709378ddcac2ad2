"""Count the CUDA binaries (SASS per sm_XX, PTX per compute_XX) a shared library carries in .nv_fatbin.

Not imported by the program: the check behind the engine facts "this wheel has sm_70 kernels", run by
hand on a library unpacked from a PyPI wheel, e.g.
    python -m ops.fatbin_archs /tmp/lmd/lmdeploy/lib/_turbomind.cpython-311-x86_64-linux-gnu.so
The parser is components/node_programs/fatbin.py, which the qualification gate also runs in the image.
"""

from __future__ import annotations

import sys
from pathlib import Path

from components.node_programs.fatbin import fatbin_archs

if __name__ == "__main__":
    for name in sys.argv[1:]:
        print(name, dict(sorted(fatbin_archs(Path(name).read_bytes()).items(), key=lambda kv: kv[0])))
