"""A small mutation check: plant known bugs one at a time in a copy of the tree and run the tests that
must catch each; print which were caught (killed) and which survived, and the score.

    .venv/bin/python tests/checks/mutation.py            # every mutant
    .venv/bin/python tests/checks/mutation.py bearer ttft  # mutants whose name contains a word

Each mutant is one exact text replacement (it must match exactly once, so a mutant that no longer
applies after a refactor is reported as stale instead of silently passing) and the test files that
ought to fail. The bugs are the kind an audit planted: a capability boundary moved, a check removed,
an alert threshold changed, capacity arithmetic off by about 1 %, a secret left unmarked. Not part of
`make test`: it runs the chosen tests once per mutant (about 10 minutes for all of them).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYTHON = ROOT / ".venv" / "bin" / "python"


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]  # pytest node ids or files: at least one must fail
    why: str


MUTANTS: list[Mutant] = [
    # --- GPU capability rules: every boundary, per engine image ---------------------------------------
    Mutant(
        "bf16-on-sm75",
        "components/engines/vllm/rules/hardware.py",
        'if dtype == "bfloat16" and cap < need:',
        'if dtype == "bfloat16" and cap < need - 5:',
        ("tests/test_capability_boundaries.py",),
        "bf16 allowed on T4 (sm_75)",
    ),
    Mutant(
        "bf16-fact-75",
        "components/engines/vllm/facts.py",
        "kv_cache_dtypes=_KV_0191,\n        fp8_kv_min_capability=80,\n        bf16_min_capability=80,",
        "kv_cache_dtypes=_KV_0191,\n        fp8_kv_min_capability=80,\n        bf16_min_capability=75,",
        ("tests/test_capability_boundaries.py",),
        "the 0.19.1 facts say bf16 from sm_75",
    ),
    Mutant(
        "prefix-caching-refused-at-its-threshold",
        "components/engines/vllm/rules/hardware.py",
        "if facts is None or cap >= facts.prefix_prefill_min_capability:",
        "if facts is None or cap > facts.prefix_prefill_min_capability:",
        ("tests/test_capability_boundaries.py",),
        "prefix caching refused on the first GPU whose kernels run it",
    ),
    Mutant(
        "prefix-caching-allowed-below",
        "components/engines/vllm/rules/hardware.py",
        "if facts is None or cap >= facts.prefix_prefill_min_capability:",
        "if facts is None or cap >= facts.prefix_prefill_min_capability - 5:",
        ("tests/test_capability_boundaries.py",),
        "prefix caching allowed on T4 with 0.9.2 (its Triton dies there)",
    ),
    Mutant(
        "fp8-kv-below-threshold",
        "components/engines/vllm/rules/hardware.py",
        'if kv.startswith("fp8") and cap < need_kv:',
        'if kv.startswith("fp8") and cap < need_kv - 5:',
        ("tests/test_capability_boundaries.py",),
        "fp8 KV cache allowed one capability step too low",
    ),
    Mutant(
        "mla-on-sm75",
        "components/engines/vllm/rules/hardware.py",
        "if model is None or cap >= need or not _mla_on(launch):",
        "if model is None or cap >= need - 5 or not _mla_on(launch):",
        ("tests/test_capability_boundaries.py",),
        "MLA allowed on T4",
    ),
    Mutant(
        "v1-boundary",
        "components/engines/vllm/facts.py",
        "return self.v1_min_capability is not None and capability >= self.v1_min_capability",
        "return self.v1_min_capability is not None and capability > self.v1_min_capability",
        ("tests/test_capability_boundaries.py",),
        "VLLM_USE_V1 refused on the first GPU the V1 engine runs on",
    ),
    Mutant(
        "quantization-boundary-off-by-one",
        "components/engines/vllm/rules/hardware.py",
        "    if need <= cap:\n        return []\n    works = sorted(\n",
        "    if need < cap:\n        return []\n    works = sorted(\n",
        ("tests/test_capability_boundaries.py",),
        "a GPU exactly at a method's minimum capability refused",
    ),
    Mutant(
        "awq-fact-on-sm70",
        "components/engines/vllm/facts.py",
        '**{m: QuantMethod(75, "native") for m in ("awq", "torchao")},',
        '**{m: QuantMethod(70, "native") for m in ("awq", "torchao")},',
        ("tests/test_capability_boundaries.py",),
        "the 0.9.2 facts say AWQ runs on V100",
    ),
    Mutant(
        "torch-arch-any-volta",
        "components/engines/vllm/facts.py",
        "return capability in self.torch_arch_list",
        "return capability in self.torch_arch_list or capability >= 70",
        ("tests/test_capability_boundaries.py",),
        "an image whose torch lacks the GPU's arch passes (no kernel image at startup)",
    ),
    Mutant(
        "triton-boundary",
        "components/engines/vllm/facts.py",
        "return None if t is None else capability >= t.fp16_dot_min_capability",
        "return None if t is None else capability > t.fp16_dot_min_capability",
        ("tests/test_capability_boundaries.py",),
        "fp16 MoE refused on the first GPU the image's Triton compiles for",
    ),
    # --- gateway -------------------------------------------------------------------------------------
    Mutant(
        "models-root-is-the-served-name",
        "components/planning/gateway/lua/gateway.lua",
        '"owned_by": "llm-cluster", "root": \' .. json_string(meta[1])',
        '"owned_by": "llm-cluster", "root": \' .. json_string(name)',
        ("tests/test_gateway_nginx.py::test_models_list_is_answered_by_the_gateway_per_key_and_prefix",),
        "GET /v1/models lists each name as its own root, not the model path it serves",
    ),
    Mutant(
        "budget-remaining-is-the-whole-budget",
        "components/planning/gateway/lua/gateway_budget.lua",
        'var.llm_tb_remaining = ("%d"):format(limit - used)',
        'var.llm_tb_remaining = ("%d"):format(limit)',
        ("tests/test_gateway_budgets.py::test_a_used_up_budget_is_a_429_with_the_headers_clients_read",),
        "x-ratelimit-remaining-tokens says the whole budget is left whatever was used",
    ),
    Mutant(
        "usage-ends-at-its-first-brace",
        "components/planning/gateway/lua/gateway.lua",
        "            close = object_end(buf, open)",
        "            close = close",
        ("tests/test_gateway_nginx.py::test_every_engines_usage_shape_is_counted_as_sent",),
        "a llama.cpp usage object (token details sorted before total_tokens) loses its later counts",
    ),
    Mutant(
        "bearer-scheme-unchecked",
        "components/planning/gateway/lua/gateway.lua",
        "    if bor(b, 32) ~= 98 or bor(e, 32) ~= 101 or bor(a, 32) ~= 97 or bor(r, 32) ~= 114 or bor(e2, 32) ~= 101\n"
        "            or bor(r2, 32) ~= 114 or space ~= 32 then",
        "    if false then",
        ("tests/test_gateway_nginx.py",),
        "a Basic (or any) scheme header passes with a valid key",
    ),
    Mutant(
        "usage-carry-dropped",
        "components/planning/gateway/lua/gateway.lua",
        "        st.carry = sub(buf, keep + 1)\n",
        "        st.carry = nil\n",
        ("tests/test_gateway_nginx.py::test_usage_and_events_are_read_whatever_bytes_each_read_brings",),
        "a usage object or `data:` cut by a chunk boundary is missed (no tokens, events short)",
    ),
    Mutant(
        "raw-request-line-proxied",
        "components/planning/gateway/lua/gateway.lua",
        "    if raw_uri ~= endpoint and not (byte(raw_uri, n + 1) == 63 and sub(raw_uri, 1, n) == endpoint) then\n",
        "    if false then\n",
        ("tests/test_gateway_edges.py::test_replicas_get_the_routed_endpoint_never_the_raw_path",),
        "a replica gets the client's raw path (/metrics/../v1/…, %65, a path route's prefix), not the routed endpoint",
    ),
    Mutant(
        "model-escapes-not-decoded",
        "components/planning/gateway/lua/gateway.lua",
        '        if key == \'"model"\' or (find(key, "\\\\", 1, true) and cjson.decode(key) == "model") then',
        "        if key == '\"model\"' then",
        ("tests/test_gateway_nginx.py::test_an_aliased_body_changes_only_in_its_model",),
        "an aliased body whose `model` key is escaped reaches the replica with the alias",
    ),
    Mutant(
        "budget-full-zone-evicts",
        "components/planning/gateway/lua/gateway_budget.lua",
        "        local ok, err = dict:incr(key, tokens)\n",
        "        local ok, err = dict:incr(key, tokens, 0, (ttl_ms + 0.5) / 1000)\n",
        ("tests/test_gateway_budgets.py::test_a_full_zone_fails_open_keeps_every_count_and_says_so",),
        "a full budget zone evicts the least recently charged count: a key refused for its used-up budget",
    ),
    Mutant(
        "budget-charged-where-it-began",
        "components/planning/gateway/lua/gateway_budget.lua",
        "    local t, left = clock(window)\n    local ttl = left - 1\n",
        "    local t, left = clock(window)\n"
        "    if floor(ngx.req.start_time() * 1000 / window) ~= floor(t / window) then\n"
        "        return tokens\n    end\n    local ttl = left - 1\n",
        ("tests/test_gateway_budgets.py::test_a_stream_that_outlasts_its_window_is_charged_in_the_window_it_ends_in",),
        "a stream that outlasts its window costs nothing (charged to the window it began in, which is over)",
    ),
    Mutant(
        "budget-count-keyed-by-id",
        "components/planning/gateway/lua/gateway_budget.lua",
        'id .. "/" .. b[2], ',
        "id, ",
        ("tests/test_gateway_budgets.py::test_a_changed_budget_keeps_its_count_and_a_changed_window_starts_a_new_one",),
        "a key's new window length inherits the old window's count",
    ),
    Mutant(
        "budget-count-per-worker",
        "components/planning/gateway/lua/gateway_budget.lua",
        '    dict = assert(ngx.shared[zone_name], "no lua_shared_dict " .. zone_name)\n',
        "    local counts = {}\n"
        "    dict = {get = function(_, k) return counts[k] end,\n"
        "            incr = function(_, k, n) if counts[k] then counts[k] = counts[k] + n return counts[k] end\n"
        '                return nil, "not found" end,\n'
        "            safe_add = function(_, k, n) counts[k] = n return true end}\n",
        (
            "tests/test_gateway_budgets.py::test_one_count_per_key_for_every_worker",
            "tests/test_gateway_budgets.py::test_counts_outlive_a_reload",
        ),
        "each nginx worker keeps its own counts (a key gets a budget per worker, and a fresh one on reload)",
    ),
    Mutant(
        "usage-path-left-raw",
        "components/planning/gateway/lua/gateway_metrics.lua",
        "    if not plain_paths[sub(tail, path_at, -2)] and not logged_as_is(tail, path_at, #tail - 1) then\n",
        "    if false then\n",
        (
            "tests/test_gateway_metrics.py::test_client_text_in_a_usage_line_is_json_escaped",
            "tests/test_gateway_edges.py::test_a_long_path_is_cut_in_the_log_and_escaped_there",
        ),
        "the client's path goes into the usage line uncut and unescaped: a quote breaks the line's JSON",
    ),
    Mutant(
        "replica-json-error-rewrapped",
        "components/planning/gateway/lua/gateway.lua",
        '    if ctype and find(ctype, "json", 1, true) then\n',
        "    if false then\n",
        ("tests/test_gateway_edges.py::test_a_replicas_json_error_reaches_the_client_as_it_sent_it",),
        "an engine's own JSON error (its message: max_tokens too large) is replaced by the gateway's wrapper",
    ),
    Mutant(
        "replica-text-error-passed",
        "components/planning/gateway/lua/gateway.lua",
        '    st.said, st.status = "", status\n',
        "    do return end\n",
        ("tests/test_gateway_edges.py::test_a_replicas_error_that_is_not_json_reaches_the_client_as_openai_json",),
        "a replica's text/plain or HTML error reaches an OpenAI client as it is, not as OpenAI JSON",
    ),
    Mutant(
        "cut-stream-logged-complete",
        "components/planning/gateway/lua/gateway_metrics.lua",
        "    if st and st.stream ~= nil and not st.whole then\n",
        "    if false then\n",
        ("tests/test_gateway_edges.py::test_a_stream_the_replica_cut_mid_event_is_logged_as_cut",),
        'a stream the replica cut mid-event is logged "completed":"OK"',
    ),
    Mutant(
        "spilled-body-refused",
        "components/planning/gateway/lua/gateway.lua",
        '        raw = file and read(file) or ""\n',
        '        raw = ""\n',
        ("tests/test_gateway_edges.py::test_a_chunked_body_near_the_limit_in_small_chunks_is_routed_whole",),
        "a chunked body nginx wrote to its temp file is refused as empty JSON",
    ),
    Mutant(
        "not-utf8-logged-raw",
        "components/planning/gateway/lua/gateway_metrics.lua",
        "        if b < 32 or b == 34 or b == 92 or b >= 128 then\n            return clean(s, i, true",
        "        if b < 32 or b == 34 or b == 92 then\n            return clean(s, i, true",
        (
            "tests/test_gateway_edges.py::test_bytes_that_are_not_utf8_never_reach_an_error_body_or_a_usage_line_as_they_are",
        ),
        "a model name with bytes that are not UTF-8 makes a usage line JSON readers refuse",
    ),
    Mutant(
        "usage-write-loss-uncounted",
        "components/planning/gateway/lua/gateway_metrics.lua",
        "lost + (last - first + 1 - kept)",
        "lost",
        (
            "tests/test_gateway_metrics.py::test_lines_a_worker_cannot_write_are_counted_lost_and_the_error_log_says_why",
        ),
        "usage lines a worker could not write vanish: llm_gateway_log_write_errors_total stays 0",
    ),
    Mutant(
        "undrain-keeps-replica-out",
        "components/planning/gateway/lua/gateway_affinity.lua",
        "        dict:delete(r.dkeys[k])\n        dict:incr(r.drained_key, -1, 0)\n",
        "        dict:incr(r.drained_key, -1, 0)\n",
        (
            "tests/test_gateway_drain.py::"
            "test_a_drained_replica_finishes_its_requests_gets_no_new_one_and_only_its_conversations_move",
        ),
        "DELETE /admin/drain answers 200 but the replica stays out of rotation after a rollout step",
    ),
    Mutant(
        "drain-counted-as-failure",
        "components/planning/gateway/lua/gateway_affinity.lua",
        'and dict:get(r.dkeys[home]) ~= nil and "drain" or "failure"',
        'and dict:get(r.ekeys[home]) ~= nil and "drain" or "failure"',
        (
            "tests/test_gateway_drain.py::"
            "test_a_drained_replica_finishes_its_requests_gets_no_new_one_and_only_its_conversations_move",
        ),
        "a drained replica's moved conversations counted as failures: the dashboard shows a rollout as an outage",
    ),
    Mutant(
        "metrics-full-zone-evicts",
        "components/planning/gateway/lua/gateway_metrics.lua",
        "    local ok, err = dict:safe_add(key, amount)\n",
        "    local ok, err = dict:add(key, amount)\n",
        ("tests/test_gateway_metrics.py::test_a_full_metrics_zone_drops_new_label_sets_and_never_a_count",),
        "a full metrics zone evicts the least recently used counters: they start again from zero",
    ),
    Mutant(
        "plain-model-object-kept",
        "components/planning/gateway/lua/gateway.lua",
        "                model = false  -- an object or array: not a name\n",
        "",
        ("tests/test_gateway_body.py",),
        '`{"model":"a","model":{}}` routed to a: cjson reads an object there, and the router must refuse it',
    ),
    Mutant(
        "plain-model-trailing-bytes",
        "components/planning/gateway/lua/gateway.lua",
        "                return c == nil and model or nil",
        "                return model",
        ("tests/test_gateway_body.py",),
        "bytes after the body's object (JSON no reader takes) are routed",
    ),
    Mutant(
        "plain-model-escapes-unchecked",
        "components/planning/gateway/lua/gateway.lua",
        "        elseif not ESCAPES[c] then\n",
        "        elseif false then\n",
        (
            "tests/test_gateway_body.py",
            "tests/test_gateway_nginx.py::test_a_body_with_long_strings_is_judged_as_cjson_judges_it",
        ),
        "a string's bad escape (\\x) passes the router's reader and its long-string pass: invalid JSON reaches a replica",
    ),
    Mutant(
        "plain-model-lone-surrogate",
        "components/planning/gateway/lua/gateway.lua",
        "                if LOW[d2] then\n                    return nil\n                end\n",
        "",
        ("tests/test_gateway_body.py",),
        "a lone low surrogate, which cjson refuses, passes the router's own reader",
    ),
    Mutant(
        "plain-model-first-wins",
        "components/planning/gateway/lua/gateway.lua",
        "                model = not escaped and e - i > 2 and sub(s, i + 1, e - 2)",
        "                model = model or (not escaped and e - i > 2 and sub(s, i + 1, e - 2))",
        ("tests/test_gateway_body.py",),
        "of two `model` members the first is routed, where cjson reads the last",
    ),
    Mutant(
        "plain-model-leading-zero",
        "components/planning/gateway/lua/gateway.lua",
        "    if byte(s, i) == 48 then  -- a lone '0' before any fraction\n",
        "    if false then\n",
        ("tests/test_gateway_body.py",),
        "a number with a leading zero (01), which cjson refuses, passes the router's reader",
    ),
    # --- alert thresholds ------------------------------------------------------------------------------
    Mutant(
        "ttft-2s-to-4s",
        "components/spec/monitoring.py",
        "ttft_p95_seconds: float = Field(default=2.0, gt=0)",
        "ttft_p95_seconds: float = Field(default=4.0, gt=0)",
        ("tests/test_monitoring_config.py",),
        "TTFT alert default 2 s -> 4 s",
    ),
    Mutant(
        "kv-cache-098-to-095",
        "components/spec/monitoring.py",
        "kv_cache_usage_ratio: Fraction = 0.98",
        "kv_cache_usage_ratio: Fraction = 0.95",
        ("tests/test_monitoring_config.py",),
        "KV cache alert default 0.98 -> 0.95",
    ),
    Mutant(
        "gpu-temp-85-to-89",
        "components/spec/monitoring.py",
        "gpu_temperature_celsius: float = Field(default=85, gt=0)",
        "gpu_temperature_celsius: float = Field(default=89, gt=0)",
        ("tests/test_monitoring_config.py",),
        "GPU temperature alert default 85 -> 89 C",
    ),
    Mutant(
        "gpu-memory-095-to-097",
        "components/spec/monitoring.py",
        "gpu_memory_used_ratio: Fraction = 0.99",
        "gpu_memory_used_ratio: Fraction = 0.97",
        ("tests/test_monitoring_config.py",),
        "GPU memory alert default 0.95 -> 0.97",
    ),
    Mutant(
        "temperature-ge-not-gt",
        "components/planning/monitoring/alerts.py",
        "f'DCGM_FI_DEV_GPU_TEMP{{job=\"dcgm\"}} > {t.gpu_temperature_celsius:g}',",
        "f'DCGM_FI_DEV_GPU_TEMP{{job=\"dcgm\"}} >= {t.gpu_temperature_celsius:g}',",
        ("tests/test_monitoring_config.py",),
        "the temperature alert fires at the threshold itself",
    ),
    # --- capacity arithmetic ---------------------------------------------------------------------------
    Mutant(
        "kv-bytes-per-token-1pct",
        "components/engines/weights.py",
        "return 2 * kv_heads_per_gpu(arch, tp) * arch.head_dim * kv_bytes",
        "return 2 * kv_heads_per_gpu(arch, tp) * arch.head_dim * kv_bytes * 101 // 100",
        ("tests/test_capacity_pins.py",),
        "GQA KV cache bytes per token ~1 % off",
    ),
    Mutant(
        "mla-kv-bytes-1pct",
        "components/engines/weights.py",
        "return (arch.kv_lora_rank + arch.qk_rope_head_dim) * kv_bytes",
        "return (arch.kv_lora_rank + arch.qk_rope_head_dim) * kv_bytes * 101 // 100",
        ("tests/test_capacity_pins.py",),
        "MLA KV cache bytes per token ~1 % off",
    ),
    Mutant(
        "moe-experts-1pct",
        "components/engines/weights.py",
        "experts = arch.num_experts * 3 * h * arch.moe_intermediate_size / tp",
        "experts = arch.num_experts * 3 * h * arch.moe_intermediate_size / tp * 1.01",
        ("tests/test_capacity_pins.py",),
        "MoE expert weights ~1 % off",
    ),
    Mutant(
        "gptq-scales-dropped",
        "components/engines/weights.py",
        "per_group = (2 + quant_bits / 8) / group_size if group_size > 0 else 0.0",
        "per_group = 2 / group_size if group_size > 0 else 0.0",
        ("tests/test_capacity_pins.py",),
        "GPTQ packed zero points not counted (~0.5 % of the weights)",
    ),
    # --- preview, secrets, triggers --------------------------------------------------------------------
    Mutant(
        "grafana-id-label-back",
        "components/resources/monitoring.py",
        '{"llm-cluster.role": role, "llm-cluster.image": image_ref}.items()\n',
        '{"llm-cluster.role": role, "llm-cluster.image": image_ref,'
        ' **({"w": replace_with[0].id} if replace_with else {})}.items()\n',
        ("tests/test_harness.py",),
        "Grafana labelled with its password command's id (the pack blind at preview)",
    ),
    Mutant(
        "grafana-not-replaced-with-its-password",
        "components/resources/monitoring.py",
        "extra_deps=[password_file, grafana_config],\n            replace_with=[password_file],\n",
        "extra_deps=[password_file, grafana_config],\n",
        ("tests/test_monitoring_component.py",),
        "a new admin password never reaches Grafana",
    ),
    Mutant(
        "gateway-keys-stdout-unmarked",
        "components/resources/gateway.py",
        'opts=self.opts(additional_secret_outputs=["stdout"], depends_on=list(node.ready)),\n'
        "            )\n            self.api_keys = pulumi.Output.secret(keys_cmd.stdout)",
        "opts=self.opts(depends_on=list(node.ready)),\n"
        "            )\n            self.api_keys = pulumi.Output.secret(keys_cmd.stdout)",
        ("tests/test_harness.py", "tests/test_gateway_component.py"),
        "generated API keys kept in plaintext in the state",
    ),
    Mutant(
        "preview-known-ids",
        "plan/harness.py",
        'return (UNKNOWN if _is_provider(args.typ) else ""), state',
        'return f"{args.name}-id", state',
        ("tests/test_harness.py",),
        "the mock answers a preview with known ids",
    ),
    Mutant(
        "script-trigger-not-the-script",
        "components/planning/nodes/scripts.py",
        "return hashlib.sha256(script.encode()).hexdigest()[:16]",
        "return hashlib.sha256(script.strip().encode()).hexdigest()[:16]",
        ("tests/test_gpu_node.py", "tests/test_model_weights.py", "tests/test_pools.py"),
        "a script's trigger hashed from other text than the script that runs",
    ),
    Mutant(
        "duplicate-urns-accepted",
        "plan/harness.py",
        "            if urn in self._by_urn:",
        "            if False:",
        ("tests/test_harness.py",),
        "the harness lets two resources share a URN",
    ),
    Mutant(
        "unmarked-host-secret-unseen",
        "plan/harness.py",
        'and ("stdout" in r.options.get("additionalSecretOutputs", []) or value in secret_text)\n',
        'and ("stdout" in r.options.get("additionalSecretOutputs", []))\n',
        ("tests/test_harness.py",),
        "a host-made secret the program forgot to mark is not leak-checked",
    ),
    Mutant(
        "pp-remainder-to-the-last-stage",
        "components/engines/weights.py",
        "for i in range(2, num_layers % pp + 2):",
        "for i in range(1, num_layers % pp + 1):",
        ("tests/test_capacity_pins.py",),
        "the extra layer of an odd PP split on the last stage",
    ),
    Mutant(
        "ray-gate-one-gpu-short",
        "components/planning/fabric/ray.py",
        "  if (( gpus >= want )); then",
        "  if (( gpus >= want - 1 )); then",
        ("tests/test_ray_gate.py",),
        "the Ray gate passes one GPU short",
    ),
    Mutant(
        "clock-behind-unseen",
        "components/planning/nodes/clock.py",
        "  if (lo > bound || hi < -bound) {{",
        "  if (lo > bound) {{",
        ("tests/test_clock.py",),
        "a node clock behind the operator's is never refused",
    ),
    # --- the policy pack as the CLI starts it ---------------------------------------------------------
    Mutant(
        "pack-serves-fewer-policies",
        "policies/__main__.py",
        "PolicyPack(name=PACK_NAME, policies=POLICIES,",
        "PolicyPack(name=PACK_NAME, policies=POLICIES[1:],",
        ("tests/test_policy_e2e.py::test_the_pack_starts_the_way_the_cli_runs_it",),
        "the pack the CLI starts serves one policy fewer than the one the plan runs",
    ),
    # --- vLLM's own multi-node launcher (pools.<pool>.vllm.multiNode: native) --------------------------
    Mutant(
        "native-worker-not-headless",
        "components/engines/vllm/engine.py",
        '        if rank > 0:\n            argv.append("--headless")\n',
        "",
        ("tests/test_vllm_native_launcher.py",),
        "the other nodes start a second API server instead of joining rank 0 headless",
    ),
    Mutant(
        "native-master-port-open-to-the-cluster",
        "components/planning/nodes/firewall.py",
        "out.append((inst.master_port, [spec.nodes[n].address for n in inst.nodes], key))",
        "out.append((inst.master_port, cluster_sources(spec), key))",
        ("tests/test_vllm_native_launcher.py",),
        "the rendezvous port accepts every cluster node, not the instance's nodes only",
    ),
    Mutant(
        "native-launcher-on-an-image-without-it",
        "components/engines/vllm/rules/topology.py",
        "if facts is None or facts.native_multi_node or not flags:",
        "if facts is None or not flags:",
        ("tests/test_vllm_native_launcher.py",),
        "the pack refuses the native launcher on every image, 0.19.1 (which has it) included",
    ),
]


def copy_tree(dest: Path) -> None:
    """The working tree as it is (tracked and untracked files, not ignored ones), with the venv linked."""
    files = (
        subprocess.run(
            ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True, capture_output=True
        )
        .stdout.decode()
        .split("\0")
    )
    for rel in filter(None, files):
        src = ROOT / rel
        if src.is_file() and not src.is_symlink():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    (dest / ".venv").symlink_to(ROOT / ".venv" if not (ROOT / ".venv").is_symlink() else (ROOT / ".venv").resolve())


def run_mutant(m: Mutant, base: Path) -> tuple[str, float]:
    """'killed', 'SURVIVED', 'stale' (the text to replace is not there exactly once) or an error."""
    target = base / m.path
    text = target.read_text()
    if text.count(m.old) != 1:
        return "stale", 0.0
    target.write_text(text.replace(m.old, m.new))
    start = time.monotonic()
    try:
        out = subprocess.run(
            [str(PYTHON), "-m", "pytest", "-q", "-x", "-p", "no:randomly", "-p", "no:cacheprovider", *m.tests],
            cwd=base,
            capture_output=True,
            text=True,
            timeout=1800,
        )
    finally:
        target.write_text(text)
    # Exit 1 = tests failed (caught). 0 = all passed (survived). Anything else (usage, collection
    # error) also counts as caught only if tests ran and failed: say which.
    verdict = {0: "SURVIVED", 1: "killed"}.get(out.returncode, f"error rc={out.returncode}")
    return verdict, time.monotonic() - start


def passes_unmutated(tests: tuple[str, ...], base: Path) -> bool:
    """A mutant only counts if its tests pass on the tree as it is (else any failure would 'kill' it)."""
    out = subprocess.run(
        [str(PYTHON), "-m", "pytest", "-q", "-x", "-p", "no:randomly", "-p", "no:cacheprovider", *tests],
        cwd=base,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    return out.returncode == 0


def main(words: list[str]) -> int:
    chosen = [m for m in MUTANTS if not words or any(w in m.name for w in words)]
    with tempfile.TemporaryDirectory(prefix="llm-cluster-mutants-") as tmp:
        base = Path(tmp)
        copy_tree(base)
        clean = {tests: passes_unmutated(tests, base) for tests in {m.tests for m in chosen}}
        results = []
        for m in chosen:
            if not clean[m.tests]:
                results.append((m, "stale"))
                print(f"{'invalid':9} {0:6.0f}s  {m.name}: its tests fail without the mutant", flush=True)
                continue
            verdict, took = run_mutant(m, base)
            results.append((m, verdict))
            print(f"{verdict:9} {took:6.0f}s  {m.name}: {m.why}", flush=True)
    killed = sum(v == "killed" for _, v in results)
    counted = [v for _, v in results if v != "stale"]
    print(
        f"mutation score: {killed}/{len(counted)} killed"
        + (f" ({len(results) - len(counted)} stale or invalid, not counted)" if len(counted) != len(results) else "")
    )
    return 0 if killed == len(counted) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
