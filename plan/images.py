"""`python -m plan.images`, the name this command was first published under: it runs ops.images."""

import runpy

if __name__ == "__main__":
    runpy.run_module("ops.images", run_name="__main__", alter_sys=True)
