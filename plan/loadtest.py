"""`python -m plan.loadtest`, the name this command was first published under: it runs ops.loadtest."""

import runpy

if __name__ == "__main__":
    runpy.run_module("ops.loadtest", run_name="__main__", alter_sys=True)
