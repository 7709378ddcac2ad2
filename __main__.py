"""llm-cluster: load the stack spec, build the components, export the outputs."""

import pulumi

from components.resources.cluster import deploy
from components.resources.config import spec_from_pulumi

for _name, _value in deploy(spec_from_pulumi()).items():
    pulumi.export(_name, _value)
