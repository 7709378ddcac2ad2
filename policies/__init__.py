"""llm-cluster's CrossGuard policy pack: hardware-aware rules checked at `pulumi preview` and by `make plan`."""
