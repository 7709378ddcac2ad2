"""`python -m plan.capacity`, the name this command was first published under: it runs ops.capacity."""

import runpy

if __name__ == "__main__":
    runpy.run_module("ops.capacity", run_name="__main__", alter_sys=True)
