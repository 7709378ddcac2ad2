"""llm-cluster: stack model, planning functions and the Pulumi components that register them."""
