"""The type tokens of llm-cluster's components: part of every resource's URN, read by the policy pack and the plan.

A leaf: it imports nothing, so the resources that register these types and the code that reads them share it.
"""

COMPONENT_PREFIX = "llm-cluster:"
# The ModelServer of every engine keeps the token it had when vLLM was the only engine: the type is part of
# the URN of every server a stack has deployed, and a new one would make `pulumi up` replace them all.
MODEL_SERVER = "llm-cluster:vllm:ModelServer"
RAY_CLUSTER = "llm-cluster:ray:RayCluster"
GATEWAY = "llm-cluster:gateway:Gateway"
GPU_NODE = "llm-cluster:node:GpuNode"
SMOKE_TEST = "llm-cluster:smoke:SmokeTest"
MONITORING = "llm-cluster:monitoring:Monitoring"
MODEL_WEIGHTS = "llm-cluster:weights:ModelWeights"
IMAGE_QUALIFICATION = "llm-cluster:qualification:ImageQualification"
