"""vLLM's policy rules as pure checks of a `Launch` (components/engines/vllm/launch.py) and the policy's
config: hardware, image, flags, engine args, topology, host memory and memory fit. The policy pack
(policies/rules/<same module>.py) makes them policies with their names, levels and config schemas."""
