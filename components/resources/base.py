"""The one component shape every llm-cluster ComponentResource follows."""

from __future__ import annotations

from typing import Any, ClassVar

import pulumi


class Component(pulumi.ComponentResource):
    """Type token `llm-cluster:<module>:<Type>`; props are what the policy pack sees of the component."""

    TYPE: ClassVar[str]
    # Handles for other components (providers, connections, child resources) are annotated in
    # __init__, not on the class: the SDK reads class annotations as the types of the component's
    # props, and a handle named like a prop breaks output resolution.

    def __init__(self, name: str, props: dict[str, Any], opts: pulumi.ResourceOptions | None = None):
        super().__init__(self.TYPE, name, props, opts)
        self._name = name

    def child(self, suffix: str) -> str:
        """Children are named after their component: `<component>-<suffix>`."""
        return f"{self._name}-{suffix}"

    def opts(self, **kwargs: Any) -> pulumi.ResourceOptions:
        """Options for a child: parented to this component (it inherits its providers)."""
        return pulumi.ResourceOptions(parent=self, **kwargs)
