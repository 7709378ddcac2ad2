"""Entry point the Pulumi CLI runs (cwd = policies/): build the PolicyPack from policies.pack; it blocks serving."""
import sys
from pathlib import Path

# The CLI runs this file with the pack directory on sys.path; the rules import components.facts from the root.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pulumi_policy import PolicyPack  # noqa: E402

from policies.pack import DEFAULT_LEVEL, PACK_DESCRIPTION, PACK_NAME, POLICIES  # noqa: E402

PolicyPack(name=PACK_NAME, policies=POLICIES, enforcement_level=DEFAULT_LEVEL, description=PACK_DESCRIPTION)
