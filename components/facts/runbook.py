"""The runbook's table of models it says the reference cluster runs (section 2, "可跑模型清单", for 6 x 8
V100-SXM2-32GB), row by row as it writes them, for the placement advisor to judge (plan.advise --runbook).

Every row is the runbook's claim, not a fact: its evidence is `unverified` by construction. The runbook
serves all of them with `vllm/vllm-openai:v0.9.2` and `vllm serve`.
"""

from __future__ import annotations

from dataclasses import dataclass

from components.facts.evidence import Sourced, unverified

RUNBOOK_IMAGE = "vllm/vllm-openai:v0.9.2"
RUNBOOK_SOURCE: Sourced = unverified("the deployment runbook, section 2 (model table) and section 6 (its image)")


@dataclass(frozen=True)
class RunbookRow:
    """One row: the model as the runbook names it, the catalog model it means, and its deployment."""

    written: str  # the model column, as written
    model: str | None  # components.facts.models name; None: not in the catalog
    precision: str  # a CheckpointFormat label: fp16, gptq-int4, fp8
    weights: str  # the weight-size column, as written
    nodes: int | None  # minimum nodes, as written (None: "—")
    tensor_parallel: int | None
    pipeline_parallel: int | None
    note: str = ""  # what the row adds ("TP=4 (leave room for KV)", "not recommended")


RUNBOOK_ROWS: tuple[RunbookRow, ...] = (
    RunbookRow("Qwen3.5-27B", None, "fp16", "55~61G", 1, 8, 1),
    RunbookRow("Qwen3-30B-A3B", "qwen3-30b-a3b", "fp16", "55~61G", 1, 8, 1),
    RunbookRow("Qwen3-32B", "qwen3-32b", "fp16", "65G", 1, 8, 1),
    RunbookRow("Llama-3.3-70B", "llama-3.3-70b", "gptq-int4", "~40G", 1, 4, 1, "TP=4, leaving room for KV"),
    RunbookRow("gpt-oss-120b", "gpt-oss-120b", "gptq-int4", "~65G", 1, 8, 1),
    RunbookRow("Qwen3-235B-A22B", "qwen3-235b-a22b", "gptq-int4", "~130G", 1, 8, 1, "one node runs it"),
    RunbookRow("Llama-3.3-70B", "llama-3.3-70b", "fp16", "~140G", 1, 8, 1),
    RunbookRow("Llama-3.1-405B", "llama-3.1-405b", "gptq-int4", "~230G", 2, 8, 2),
    RunbookRow("DeepSeek-R1/V3 671B", "deepseek-r1", "gptq-int4", "~380~420G", 2, 8, 2),
    RunbookRow("Kimi-K2 1T", "kimi-k2", "gptq-int4", "~550~600G", 3, 8, 3),
    RunbookRow("DeepSeek-R1 671B", "deepseek-r1", "fp16", "~1340G", 6, 8, 6, "KV has almost no room: not recommended"),
    RunbookRow("any model of 671B or more", "deepseek-r1", "fp8", "—", None, None, None, "Volta has no FP8 units"),
    RunbookRow("DeepSeek-R1-Distill-Qwen-32B", "deepseek-r1-distill-qwen-32b", "fp16", "—", 1, 8, 1),
)
