"""Read the stack spec from the running Pulumi program's config (real engine or mock runtime)."""

from __future__ import annotations

import pulumi
from pulumi.runtime.config import _SECRET_KEYS, CONFIG, get_config_env

from components.planning.load import load_stack_config
from components.spec.base import SpecError
from components.spec.stack import StackSpec


def spec_from_pulumi() -> StackSpec:
    """The validated spec; a bad config stops the program with the list of issues, no traceback."""
    config = {**get_config_env(), **CONFIG.get()}
    try:
        return load_stack_config(config, _SECRET_KEYS.get())
    except SpecError as err:
        raise pulumi.RunError("invalid stack config:\n" + "\n".join(f"  {i}" for i in err.issues)) from None
