"""Count the CUDA binaries a shared library embeds in its .nv_fatbin section: SASS per sm_XX, PTX per
compute_XX, read from the ELF section table and the fatbin container headers (magic 0xBA55ED50) only.

Plain standard-library Python with no __future__ import, because the qualification gate embeds this file's
text in the check it runs inside an image (LMDeploy: which GPUs _turbomind.so has kernels for);
policies/data/tools/fatbin_archs.py runs it by hand on a wheel's library.
"""
import struct
from collections import Counter

FATBIN_MAGIC = 0xBA55ED50
PTX_KIND = 1  # entry kind 1 is PTX, 2 is an ELF cubin (SASS)


def elf_sections(data):
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


def fatbin_archs(data):
    """Counter of 'sm_70' / 'compute_70' -> how many kernel images of it the library (its bytes) embeds."""
    found = Counter()
    section = elf_sections(data).get(".nv_fatbin")
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
