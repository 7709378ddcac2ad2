"""`python -m ops.images [--stack NAME | --config FILE]`: where each node gets each image, and the commands
that fill a private registry or write the tarballs an air-gapped stack loads (images.registry / images.tarballs).

Prints a bash script (see components.planning.image_supply.mirror_script) to run on a machine that reaches
the public registries; `--list` prints one line per image instead: image, what the nodes use, how.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from components.planning.image_supply import mirror_script, stack_images, supply
from plan.cli import run as run_cli
from plan.stackfile import load_spec

ROOT = Path(__file__).resolve().parent.parent

EXIT_OK, EXIT_INVALID = 0, 2


def main(argv: list[str] | None = None) -> int:
    """Print the mirror script (or the list) for a stack file."""
    parser = argparse.ArgumentParser(prog="python -m ops.images", description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--stack", default="prod", help="plans Pulumi.<stack>.yaml (default prod)")
    where.add_argument("--config", type=Path, help="any stack file")
    parser.add_argument("--list", action="store_true", help="one line per image instead of the script")
    args = parser.parse_args(argv)
    path = args.config or ROOT / f"Pulumi.{args.stack}.yaml"
    loaded = load_spec(path)
    if loaded is None:
        return EXIT_INVALID
    spec = loaded[1]
    if args.list:
        for image in stack_images(spec):
            s = supply(spec, image)
            print(f"{image}\t{s.ref}\t{s.via}\t{s.source}")
    else:
        sys.stdout.write(mirror_script(spec))
    return EXIT_OK


if __name__ == "__main__":
    run_cli(main)
