"""Entry point the Pulumi CLI runs (cwd = policies/): build the PolicyPack from policies.pack; it blocks serving.

The pack's virtualenv is the project's (PulumiPolicy.yaml), where `pip install -e .` put the project's packages.
"""

from pulumi_policy import PolicyPack

from policies.pack import DEFAULT_LEVEL, PACK_DESCRIPTION, PACK_NAME, POLICIES

PolicyPack(name=PACK_NAME, policies=POLICIES, enforcement_level=DEFAULT_LEVEL, description=PACK_DESCRIPTION)
