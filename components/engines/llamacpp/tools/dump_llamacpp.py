"""Turn `llama-server --help` into the CLI dump format of components/engines/<engine>/data (one JSON entry per option).

Not imported by the program: run by hand on a build of the image's source, then commit the output
(components/engines/DATA-SOURCES.md says which build):
    cmake -S <llama.cpp at bNNNN> -B build -DGGML_NATIVE=OFF -DLLAMA_BUILD_NUMBER=NNNN ...
    cmake --build build --target llama-server
    build/bin/llama-server --help | python components/engines/llamacpp/tools/dump_llamacpp.py > components/engines/llamacpp/data/llama.cpp-bNNNN-server-args.json
The help lists each option as `-x,    --long, --other HINT [HINT2]   help...` (common/arg.cpp
common_arg::to_string): options before the first run of two spaces, then up to two value hints. An option
without a hint is a flag; `{a,b,c}` hints are its choices; others take one value each.
"""
from __future__ import annotations

import json
import re
import sys
from typing import Any

_HEAD_END = re.compile(r"\s{2,}|$")


def parse_help(text: str) -> list[dict[str, Any]]:
    """The options of a llama.cpp tool's --help, in the order it prints them."""
    entries = []
    for line in text.splitlines():
        if not line.startswith("-") or line.startswith("-----"):  # "----- common params -----" heads a section
            continue
        # The first option is padded to 7 columns ("-m,    --model FNAME"): close that gap first.
        line = re.sub(r"^(-\S+,) +", r"\1 ", line)
        head = line[:_HEAD_END.search(line).start()]
        *first, last = head.split(", ")
        last_opt, *hints = last.split(" ")
        opts = [o.strip() for o in first] + [last_opt]
        choices = None
        if len(hints) == 1 and re.fullmatch(r"\{[^{}]+\}", hints[0]):
            choices = hints[0][1:-1].split(",")
        entries.append({
            "opts": opts,
            "kind": "_StoreAction" if hints else "_StoreTrueAction",
            "nargs": None if len(hints) == 1 else (len(hints) or 0),
            "choices": choices,
            "default": "None",
            "type": "str" if hints else "None",
            "const": "None",
            "hint": " ".join(hints),
        })
    return entries


if __name__ == "__main__":
    print(json.dumps(parse_help(sys.stdin.read()), indent=1))
