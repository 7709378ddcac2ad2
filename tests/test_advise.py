"""The placement advisor (plan.advise): deployments enumerated per engine, judged by the spec, the engines'
capacity models and the pack, ranked by goal; the blocks it writes plan clean with the capacity it promised."""

from __future__ import annotations

import importlib.util
import json
import math
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from components.engines.estimate import KV_ERROR_UNMEASURED
from components.engines.registry import ENGINES
from components.engines.weights import GIB, CheckpointFormat, model_params
from components.facts.models import MODELS, model_arch
from components.facts.runbook import RUNBOOK_ROWS
from components.marks import MODEL_SERVER
from plan import advise
from plan.analyze import analyze
from tests.conftest import run_stack

ROOT = Path(__file__).resolve().parents[1]
V100 = "Tesla V100-SXM2-32GB"


@pytest.fixture(scope="module")
def judge() -> advise.Judge:
    """The reference stack's nodes: 6 x 8 V100-SXM2-32GB."""
    return advise.Judge(advise.hardware_of_stack(ROOT / "Pulumi.prod.yaml"))


@pytest.fixture(scope="module")
def catalog(judge: advise.Judge) -> dict[str, advise.ModelAdvice]:
    models = [(name, model_arch(name), None) for name in MODELS]
    return advise.advise_models(judge, models, advise.DEFAULT_CONTEXT, "concurrency")


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = advise.main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_the_reference_nodes_are_read_from_the_stack(judge: advise.Judge) -> None:
    hw = judge.hw
    assert (hw.gpu, hw.gpus_per_node, hw.nodes, hw.capability) == (
        V100,
        8,
        ("gpu-01", "gpu-02", "gpu-03", "gpu-04", "gpu-05", "gpu-06"),
        70,
    )


def test_every_catalog_model_gets_a_verdict_and_the_reference_pools_models_run(
    catalog: dict[str, advise.ModelAdvice],
) -> None:
    assert set(catalog) == set(MODELS)
    assert {m for m, a in catalog.items() if a.verdict == "runs"} == set(MODELS)
    # The chat pool's model fits one node; the 671B needs two nodes even at int4 (the reference layout).
    chat = catalog["qwen3-30b-a3b"].ranked[0].candidate
    assert len(chat.nodes) == 1
    r1 = catalog["deepseek-r1"].ranked[0].candidate
    assert (r1.engine.name, r1.fmt.label, r1.tp, r1.pp) == ("vllm", "gptq-int4", 8, 2)
    assert r1.pool_block()["env"] == {"VLLM_MLA_DISABLE": "1"}


def test_a_layout_across_nodes_offers_vllms_own_launcher_where_the_image_has_it(
    catalog: dict[str, advise.ModelAdvice],
) -> None:
    text = advise.render_model(catalog["deepseek-r1"])
    offer = (
        "         across nodes on Ray as proposed, or without Ray: vllm.multiNode: native (vLLM 0.19.1's own "
        "launcher: one container per node, the others --headless, no Ray ports)"
    )
    assert catalog["deepseek-r1"].ranked[0].candidate.image == "vllm/vllm-openai:v0.19.1"
    assert text.splitlines()[3] == offer
    # One node needs no launcher; an image without one (0.11.0) is offered none.
    assert "without Ray" not in advise.render_model(catalog["qwen3-30b-a3b"])
    assert ENGINES["vllm"].advice_launcher("vllm/vllm-openai:v0.11.0") is None


def test_refused_deployments_keep_the_first_reason_of_the_pack(catalog: dict[str, advise.ModelAdvice]) -> None:
    refused = {j.candidate.describe(): j.refused for j in catalog["qwen3-32b"].refused}
    fp8 = refused["vllm vllm/vllm-openai:v0.19.1 fp8 TP 8 x PP 1 (1 node)"]
    assert fp8 is not None and fp8.startswith("gpu-fp8: --quantization fp8: FP8 weights need sm_75")
    awq = refused["vllm vllm/vllm-openai:v0.19.1 awq-int4 TP 8 x PP 1 (1 node)"]
    assert awq is not None and awq.startswith("gpu-quantization: ")
    fp16_tp1 = refused["vllm vllm/vllm-openai:v0.19.1 fp16 TP 1 x PP 1 (1 node, 8 replicas per node)"]
    assert fp16_tp1 is not None and fp16_tp1.startswith("memory-fit: does not fit")


def test_every_pool_block_it_writes_plans_clean_with_the_capacity_it_promised(
    judge: advise.Judge, catalog: dict[str, advise.ModelAdvice]
) -> None:
    for name, advice in catalog.items():
        best = advice.ranked[0]
        written = yaml.safe_load(advise.write_pool(advice, "advice", 1))["config"]
        config = judge.config(best.candidate)
        config["llm-cluster:models"] = written["llm-cluster:models"]
        config["llm-cluster:pools"] = written["llm-cluster:pools"]
        run = run_stack(config, set(judge.hw.secret_keys))
        mandatory = [v for v in analyze(run.registrations) if v.enforcement_level == "mandatory"]
        assert mandatory == [], name
        [server] = [r for r in run.registrations if r.type == MODEL_SERVER][:1]
        capacity = server.inputs["capacity"]
        assert capacity["kv_tokens"] == best.kv_tokens, name
        assert capacity["weights_gib_per_gpu"] == best.capacity["weights_gib_per_gpu"], name


def test_write_pool_prints_the_models_and_pools_blocks(capsys: pytest.CaptureFixture[str]) -> None:
    # The vLLM deployment's rank (LMDeploy's AWQ and GPTQ hold more KV on V100s once V1's buffers are counted).
    status, ranked, _ = run_cli(capsys, "--model", "llama-3.3-70b")
    rows = [ln for ln in ranked.splitlines() if re.match(r"\s+(best|#\d+)\s", ln)]
    assert status == 0
    pick = next(i for i, ln in enumerate(rows, 1) if "vllm/vllm-openai:v0.19.1 gptq-int4 TP 8 x PP 1" in ln)
    status, out, _ = run_cli(capsys, "--model", "llama-3.3-70b", "--write-pool", "big", "--pick", str(pick))
    assert status == 0
    doc = yaml.safe_load(out)["config"]
    [(key, model)] = doc["llm-cluster:models"].items()
    assert key == "llama-3-3-70b-gptq-int4"  # a DNS label: the catalog name's dots would be refused
    assert model == {
        "arch": "llama-3.3-70b",
        "path": "/data/models/llama-3-3-70b-gptq-int4",
        "quantization": "gptq",
        "quantBits": 4,
        "groupSize": 128,
        "dtype": "half",
        "servedNames": ["llama-3.3-70b"],
        "source": {"node": "gpu-01"},
    }
    assert doc["llm-cluster:pools"]["big"] == {
        "model": "llama-3-3-70b-gptq-int4",
        "nodes": ["gpu-01"],
        "engine": "vllm",
        "image": "vllm/vllm-openai:v0.19.1",
        "tensorParallel": 8,
        "vllm": {"maxModelLen": 8192},
    }


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--gpu", "Tesla Z999"], "error: --gpu 'Tesla Z999': not in the facts table; known: "),
        (["--gpu", V100, "--nodes", "0"], "error: --nodes must be 1..250 and --gpus-per-node 1..16"),
        (["--model", "nope"], "error: --model 'nope': not in the catalog; known: "),
        (["--write-pool", "x"], "error: --write-pool needs --model or --config-json"),
        (["--model", "qwen3-32b", "--write-pool", "x", "--pick", "99"], "error: --pick 99: choose 1.."),
        (["--context", "8"], "error: --context 8: at least 16 tokens"),
        (["--config-json", "/nonexistent/config.json"], "error: --config-json /nonexistent/config.json: "),
    ],
)
def test_bad_input_is_one_line_and_status_2(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    status, out, err = run_cli(capsys, *argv)
    assert (status, out) == (2, "")
    assert err.startswith(message) and err.count("\n") == 1


def test_nodes_described_on_the_command_line_give_json_for_scripts(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run_cli(
        capsys, "--gpu", V100, "--gpus-per-node", "4", "--nodes", "1", "--model", "qwen3-32b", "--format", "json"
    )
    assert status == 0
    [entry] = json.loads(out)
    assert (entry["model"], entry["verdict"]) == ("qwen3-32b", "runs")
    best = entry["best"]
    assert best["pool"]["nodes"] == ["gpu-01"] and best["tensorParallel"] * best["replicasPerNode"] == 4
    assert best["kvTokensPessimistic"] <= best["kvTokens"]
    assert {r["reason"].split(":")[0] for r in entry["refused"]} >= {"gpu-fp8", "memory-fit"}


def test_a_model_from_its_config_json(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = tmp_path / "tiny" / "config.json"
    config.parent.mkdir()
    config.write_text(
        json.dumps(
            {
                "model_type": "qwen3",
                "num_hidden_layers": 4,
                "hidden_size": 512,
                "num_attention_heads": 8,
                "num_key_value_heads": 8,
                "head_dim": 64,
                "vocab_size": 32000,
                "intermediate_size": 1024,
                "max_position_embeddings": 4096,
            }
        )
    )
    status, out, _ = run_cli(capsys, "--config-json", str(config), "--context", "4096", "--format", "json")
    assert status == 0
    [entry] = json.loads(out)
    assert entry["verdict"] == "runs"
    [(key, block)] = entry["best"]["modelBlock"].items()
    assert key.startswith("tiny") and block["configJson"] == str(config) and "arch" not in block


def test_the_runbook_table_has_a_verdict_for_every_row(judge: advise.Judge, catalog: dict[str, Any]) -> None:
    rows = {
        (v.row.written, v.row.precision): v
        for v in (advise.judge_row(judge, row, catalog.get(row.model or ""), 8192) for row in RUNBOOK_ROWS)
    }
    assert len(rows) == len(RUNBOOK_ROWS)
    assert rows[("Qwen3.5-27B", "fp16")].verdict == "not in the catalog"
    # The runbook's image has no sm_70 kernels: no row runs as written.
    assert {v.verdict for v in rows.values()} == {"not in the catalog", "runs differently"}
    r1 = rows[("DeepSeek-R1/V3 671B", "gptq-int4")]
    assert r1.why.startswith("quantization-moe: --quantization gptq on deepseek-r1")
    assert r1.changes == [
        "image vllm/vllm-openai:v0.19.1 (not vllm/vllm-openai:v0.9.2)",
        "env VLLM_MLA_DISABLE=1",
    ]
    fp16 = rows[("DeepSeek-R1 671B", "fp16")]
    assert fp16.why_on_image.startswith("memory-fit: does not fit: the weights alone need")
    assert "weights gptq-int4 (not fp16)" in fp16.changes
    fp8 = rows[("any model of 671B or more", "fp8")]
    assert fp8.why_on_image.startswith("gpu-fp8: ")


def test_the_readme_shows_the_runbook_table_the_advisor_prints(judge: advise.Judge, catalog: dict[str, Any]) -> None:
    rows = [advise.judge_row(judge, row, catalog.get(row.model or ""), 8192) for row in RUNBOOK_ROWS]
    assert advise.runbook_markdown(rows) in (ROOT / "README.md").read_text()


def test_ranking_by_goal_and_the_price_of_spanning_nodes() -> None:
    engine = ENGINES["vllm"]
    arch = model_arch("qwen3-32b")

    def option(pp: int, kv: int, reps: int = 1) -> advise.Judged:
        nodes = tuple(f"gpu-0{i}" for i in range(1, pp + 1))
        c = advise.Candidate("m", arch, engine, "img", "code", engine.advice_formats[0], 8, pp, reps, nodes, 1000, 70)
        low = math.floor(kv * (1 - KV_ERROR_UNMEASURED))  # the range vLLM's capacity carries (no class measured)
        capacity = {"kv_tokens": kv, "kv_tokens_low": low, "kv_estimate_error": KV_ERROR_UNMEASURED}
        return advise.Judged(c, capacity={**capacity, "context_window": 400_000})

    one, two_less, two_more = option(1, 100_000), option(2, 300_000), option(2, 500_000)
    # Per node (pessimistic, -3.4 %): 96.6; 144.9 halved for the extra node = 72.5; 241.5 halved = 120.8.
    assert advise.rank([two_less, one], "concurrency") == [one, two_less]
    assert advise.rank([one, two_more], "concurrency") == [two_more, one]
    assert advise.rank([two_more, one], "nodes") == [one, two_more]
    assert advise.rank([one, two_less], "context") == [two_less, one]
    # The longest request stops at the model's window: then the fewer nodes win.
    wide, narrow = option(2, 900_000), option(1, 500_000)
    assert (wide.longest_context, narrow.longest_context) == (400_000, 400_000)
    assert advise.rank([wide, narrow], "context") == [narrow, wide]


def test_gguf_checkpoints_are_sized_from_the_bits_of_their_blocks() -> None:
    arch = model_arch("qwen3-32b")
    q8 = next(f for f in ENGINES["llamacpp"].advice_formats if f.label == "gguf-q8_0")
    assert q8 == CheckpointFormat("gguf-q8_0", "gguf", 8, bits_per_weight=8.5)
    assert q8.model_keys(arch) == {"quantization": "gguf", "sizeGib": round(model_params(arch) * 8.5 / 8 / GIB, 1)}


def test_the_pessimistic_end_covers_the_accuracy_bench() -> None:
    spec = importlib.util.spec_from_file_location("capacity_accuracy_advise", ROOT / "bench" / "capacity_accuracy.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    sys.modules["capacity_accuracy_advise"] = bench
    spec.loader.exec_module(bench)
    # The advisor ranks on the capacity's own range; where no class is measured it is the widest error.
    worst = bench.summarise(bench.load_cases()).kv_worst_optimistic / 100
    assert worst <= KV_ERROR_UNMEASURED < worst + 0.01
