"""Stub what lmdeploy requires and the stand-in lacks (torch's CUDA stack, fastapi, transformers, ...), so the
real lmdeploy modules import: dump_lmdeploy's stub finder, last on sys.meta_path (every installed package
wins). The package's own __init__ (the whole serving stack) is skipped, as in that tool."""

import os
import sys
from pathlib import Path

SITE = Path(__file__).resolve().parent.parent
# Modules lmdeploy imports that come with its requirements (not required by name) and that the test venv
# dump_lmdeploy.py runs in has anyway: stubbed here too.
TRANSITIVE = {"requests", "urllib3"}


def install() -> None:
    import dump_lmdeploy

    dump_lmdeploy.STUBBED.update(TRANSITIVE)
    dump_lmdeploy._install_stubs(SITE)
    # lmdeploy.turbomind locates its library through the package file, as the real package has one.
    sys.modules["lmdeploy"].__file__ = os.path.join(str(SITE), "lmdeploy", "__init__.py")


install()
