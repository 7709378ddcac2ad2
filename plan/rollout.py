"""`python -m plan.rollout`, the name this command was first published under: it runs ops.rollout."""

import runpy

if __name__ == "__main__":
    runpy.run_module("ops.rollout", run_name="__main__", alter_sys=True)
