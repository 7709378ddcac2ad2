"""Count the CUDA binaries (SASS per sm_XX, PTX per compute_XX) a shared library carries in .nv_fatbin.

Not imported by the program: the check behind the engine facts "this wheel has sm_70 kernels", run by
hand on a library unpacked from a PyPI wheel, e.g.
    python policies/data/tools/fatbin_archs.py /tmp/lmd/lmdeploy/lib/_turbomind.cpython-311-x86_64-linux-gnu.so
It reads the ELF section table and the fatbin container headers (magic 0xBA55ED50) only; no CUDA needed.
"""
from __future__ import annotations

import struct
import sys
from collections import Counter
from pathlib import Path

FATBIN_MAGIC = 0xBA55ED50
PTX_KIND = 1  # entry kind 1 is PTX, 2 is an ELF cubin (SASS)


def _sections(data: bytes) -> dict[str, tuple[int, int]]:
    """ELF64 section name -> (file offset, size)."""
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    entsize, count, names_index = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * entsize) for i in range(count)]
    names_at = headers[names_index][4]
    out = {}
    for h in headers:
        start = names_at + h[0]
        out[data[start:data.index(b"\0", start)].decode()] = (h[4], h[5])
    return out


def fatbin_archs(path: Path) -> Counter[str]:
    """'sm_70' / 'compute_70' -> how many kernels images of it the library embeds."""
    data = path.read_bytes()
    found: Counter[str] = Counter()
    section = _sections(data).get(".nv_fatbin")
    if section is None:
        return found
    pos, end = section[0], section[0] + section[1]
    while pos < end:
        magic, _version, header_size, body_size = struct.unpack_from("<IHHQ", data, pos)
        if magic != FATBIN_MAGIC:
            pos += 8  # containers are 8-byte aligned
            continue
        entry, body_end = pos + header_size, pos + header_size + body_size
        while entry < body_end:
            kind, _, entry_header, payload = struct.unpack_from("<HHIQ", data, entry)
            arch = struct.unpack_from("<I", data, entry + 28)[0]
            found[f"{'compute' if kind == PTX_KIND else 'sm'}_{arch}"] += 1
            entry += entry_header + payload
        pos = body_end
    return found


if __name__ == "__main__":
    for name in sys.argv[1:]:
        print(name, dict(sorted(fatbin_archs(Path(name)).items(), key=lambda kv: kv[0])))
