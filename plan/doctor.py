"""`python -m plan.doctor`, the name this command was first published under: it runs ops.doctor."""

import runpy

if __name__ == "__main__":
    runpy.run_module("ops.doctor", run_name="__main__", alter_sys=True)
