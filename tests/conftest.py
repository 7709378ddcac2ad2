"""Shared fixtures: the reference stack's config and spec, and the program run under Pulumi's mocks."""

from __future__ import annotations

import copy
import hashlib
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from components.planning.load import load_stack_config
from components.spec import StackSpec
from plan.harness import ProgramRun, run_main_program
from plan.stackfile import load_stack_file

# The shared helpers (tests/support) assert as the tests do: their failures show the values compared too.
pytest.register_assert_rewrite("tests.support")

ROOT = Path(__file__).resolve().parent.parent

if TYPE_CHECKING:
    from tests.support.gateway import FakeReplica

PROD = ROOT / "Pulumi.prod.yaml"
TREE_CHANGED = "WARNING: the working tree changed while the suite ran"
_TREE_AT_START = pytest.StashKey[str | None]()


def _tree_state() -> str | None:
    """A digest of HEAD and every uncommitted change to tracked files; None outside a git checkout."""
    try:
        out = [
            subprocess.run(argv, cwd=ROOT, capture_output=True, check=True).stdout
            for argv in (["git", "rev-parse", "HEAD"], ["git", "diff", "HEAD", "--binary"])
        ]
    except (OSError, subprocess.CalledProcessError):
        return None
    return hashlib.sha256(b"\0".join(out)).hexdigest()


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_TREE_AT_START] = _tree_state()


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """Say so when the tree changed under the run (a rebase, an edit): the modules imported at the
    start then meet files read later (Lua modules, scripts, fixtures) of another version, and a failure
    after that point may be that mix, not the code (two "flaky" rollout failures were exactly this)."""
    before = config.stash.get(_TREE_AT_START, None)
    if before is not None and _tree_state() != before:
        terminalreporter.write_line(
            f"{TREE_CHANGED} (HEAD moved or tracked files were edited): failures may "
            "come from a mix of old and new files; run again on a tree left alone",
            red=True,
            bold=True,
        )


def prod_config() -> dict[str, Any]:
    """A fresh deep copy of the reference stack's config (full keys), safe to modify."""
    return copy.deepcopy(load_stack_file(PROD, "prod").config)


def run_stack(
    config: dict[str, Any], secret_keys: set[str] | None = None, *, preview: bool = False, stack: str = "prod"
) -> ProgramRun:
    """Run the real __main__.py under the mock runtime with this config."""
    return run_main_program(config, secret_keys or set(), stack=stack, preview=preview)


@pytest.fixture
def config() -> dict[str, Any]:
    """The reference stack's config, a copy each test may change."""
    return prod_config()


@pytest.fixture(scope="session")
def prod_spec() -> StackSpec:
    """The reference stack, validated."""
    return load_stack_config(prod_config(), set())


@pytest.fixture(scope="session")
def prod_run() -> ProgramRun:
    """The reference stack's registrations, `pulumi up` mode (computed outputs known). Read-only."""
    return run_stack(prod_config())


@pytest.fixture(scope="session")
def prod_preview_run() -> ProgramRun:
    """The reference stack's registrations as `pulumi preview` sees them (computed outputs unknown)."""
    return run_stack(prod_config(), preview=True)


@pytest.fixture
def stack_runner() -> Callable[..., ProgramRun]:
    """run_stack, for tests that plan a changed stack."""
    return run_stack


@pytest.fixture(scope="module")
def replicas() -> Iterator[dict[str, list[FakeReplica]]]:
    """Fake vLLM replicas on loopback for a module's real-nginx gateway: four chat, one reasoning."""
    from tests.support.gateway import FakeReplica  # not at the top: the harness imports this module

    pools = {"chat": [FakeReplica(f"chat-{i}") for i in range(4)], "reasoning": [FakeReplica("reasoning-0")]}
    yield pools
    for rs in pools.values():
        for r in rs:
            r.kill()


# --- tiers --------------------------------------------------------------------------------------------
# Markers (registered in pytest.ini) name each test's tier, all kept here. `make test` runs every tier;
# `make test-fast` every tier but these two, for the edit loop.
# - lab: everything under tests/lab/ (root, network namespaces, docker, the rehearsal lab).
# - realtool: the test runs a real program in a process of its own: an external tool or server (nginx,
#   promtool, shellcheck, nft, bash scripts run for real, docker, wrk, ray, llama-server, sudo, make, real
#   releases' wheels and binaries, a real server on a real socket), or the project's own CLIs end to end
#   (`python -m plan` as `make plan` runs it, `python -m ops.images`, the policy pack's server). The fakes
#   (tests/support, the pulumi stand-in of tests/fixtures) and the program under Pulumi's mocks are no
#   real program: those tests are the fast tier, which needs no system package and runs in minutes.
# A module whose subject is a real tool or server is marked whole (its few pure checks go with it); a
# module about pure code names its real-tool tests one by one (every parametrized case of each).
TESTS = Path(__file__).resolve().parent
REALTOOL_MODULES = frozenset(
    {
        "test_clock",
        "test_example_stacks",
        "test_gateway_affinity",
        "test_gateway_body",
        "test_gateway_budgets",
        "test_gateway_day2",
        "test_gateway_edges",
        "test_gateway_metrics",
        "test_gateway_nginx",
        "test_gateway_resilience",
        "test_monitoring_reload",
        "test_plan_ci",
        "test_preflight_images",
        "test_ray_gate",
        "test_rollout_under_load",
        "test_startup_failures",
        "test_vllm_watchdog",
    }
)
REALTOOL_TESTS: dict[str, frozenset[str]] = {
    module: frozenset(names)
    for module, names in {
        "test_air_gapped": {
            "test_a_broken_tarball_says_what_to_check",
            "test_a_missing_tarball_says_where_it_should_be",
            "test_a_tarball_of_another_tag_is_refused_naming_the_save_command",
            "test_load_scripts_are_shellcheck_clean",
            "test_load_then_skip_then_reload_when_the_tarball_changes_then_undo",
            "test_the_mirror_script_pushes_or_saves_every_image",
            "test_undo_leaves_an_image_a_container_still_uses",
        },
        "test_bad_stacks": {
            "test_a_bad_file_in_the_stack_exits_2_naming_the_key_not_a_traceback",
        },
        "test_doctor": {
            "test_sections_parse_and_every_probe_is_shellcheck_clean",
        },
        "test_firewall": {
            "test_every_nodes_ruleset_passes_nft_check",
            "test_in_namespaces_outsiders_reach_only_gateway_and_ssh_and_cluster_hosts_reach_everything",
            "test_in_namespaces_the_master_port_answers_the_instances_nodes_only",
            "test_overlapping_sources_still_pass_nft_check",
            "test_scripts_are_shellcheck_clean",
            "test_the_http_redirect_port_is_open_to_allow_from_beside_the_tls_port",
            "test_the_script_refuses_a_node_whose_ephemeral_range_is_wider",
        },
        "test_fp8_bf16_below_sm80": {
            "test_triton_3_6_loads_an_fp8e4nv_cache_only_from_sm_89",
        },
        "test_gateway_config": {
            "test_healthcheck_probe_sends_the_readiness_request_under_sh",
            "test_host_scripts_pass_shellcheck",
            "test_host_scripts_run_when_the_login_shell_is_dash",
            "test_keys_script_makes_keeps_and_drops_keys_and_writes_digests",
            "test_readiness_script_passes_on_401_and_fails_with_a_message_otherwise",
        },
        "test_gateway_image": {
            "test_a_partial_cache_or_another_lua_module_is_not_used",
            "test_a_pin_that_left_the_archive_comes_from_snapshot_checked",
            "test_a_running_nginx_reports_the_pinned_lua_module_luajit_and_resty_core",
            "test_the_dockerfile_writes_the_sources_the_tests_fetch_from",
            "test_the_lua_module_requires_the_nginx_abi_the_image_pins",
            "test_the_tests_run_the_nginx_and_lua_module_the_image_pins",
        },
        "test_harness": {
            "test_a_preview_of_every_example_stack_leaves_no_policy_blind",
            "test_the_plan_refuses_to_write_a_host_made_secret_it_would_print",
        },
        "test_loadtest": {
            "test_an_https_gateway_is_verified_against_the_ca_given",
            "test_failed_requests_fail_the_target",
            "test_make_loadtest_reports_each_model_against_a_real_server",
        },
        "test_monitoring_config": {
            "test_a_broken_rule_fails_its_unit_test",
            "test_alertmanager_is_wired_when_enabled",
            "test_alerts_fire_when_they_should_and_only_then",
            "test_dashboard_queries_are_valid_promql",
            "test_generated_password_is_created_once_private_and_deleted",
            "test_given_password_is_stored_from_stdin_only",
            "test_password_scripts_are_shellcheck_clean",
            "test_password_scripts_run_under_dash_as_the_login_shell",
            "test_prometheus_config_and_rules_pass_promtool",
        },
        "test_monitoring_engines": {
            "test_promtool_accepts_the_rules_of_mixed_engine_stacks",
        },
        "test_nccl_check": {
            "test_on_sockets_the_server_never_starts_and_the_gate_fails",
            "test_over_ib_the_wrapper_keeps_the_verdict_and_execs_the_server",
            "test_scripts_are_shellcheck_clean",
        },
        "test_node_scripts": {
            "test_a_share_is_never_expanded_by_the_shell",
            "test_bash_command_hands_the_script_over_verbatim",
            "test_every_script_is_shellcheck_clean_and_parses",
            "test_fstab_entry_is_removed_once_and_only_it",
            "test_hosts_block_is_written_once_kept_in_place_and_removed",
            "test_hosts_script_runs_through_the_remote_command_wrapper",
            "test_manifest_is_stable_and_rehashes_only_changed_files",
            "test_missing_source_weights_name_the_path",
            "test_operator_key_file_is_0600_from_stdin_and_removed",
            "test_present_check_requires_a_readable_config",
            "test_verify_marks_a_matching_copy_and_refuses_a_corrupt_one",
            "test_verify_removes_a_corrupt_file_so_the_next_copy_sends_it_again",
            "test_verify_without_the_source_manifest_says_the_copy_did_not_finish",
        },
        "test_non_root": {
            "test_gateway_keys_and_grafana_password_are_made_root_only_through_sudo",
            "test_monitoring_config_files_are_written_and_owned_through_sudo",
            "test_mount_hosts_and_firewall_steps_run_as_a_sudo_user_create_delete_create",
            "test_the_access_check_passes_a_prepared_user_and_names_the_fix_for_others",
            "test_the_hosts_block_is_written_and_removed_through_sudo_and_refused_without",
            "test_the_same_steps_without_sudo_are_refused_for_a_non_root_user",
            "test_weights_bookkeeping_runs_as_the_user_in_a_directory_it_owns",
        },
        "test_plan_cli": {
            "test_a_config_the_program_refuses_exits_2_without_traceback",
            "test_a_pool_the_planner_cannot_model_still_plans_and_the_pack_names_the_fault",
            "test_invalid_stacks_exit_2_naming_the_key",
            "test_make_plan_selects_a_stack_file_with_config",
            "test_missing_stack_file_exits_2",
            "test_plan_json_holds_resources_policy_and_capacity",
            "test_policy_config_lowers_a_rule_and_bad_config_exits_2",
            "test_quiet_prints_only_the_verdict",
            "test_reference_stack_plans_clean",
            "test_secure_values_stay_secret_everywhere",
        },
        "test_plan_redaction": {
            "test_a_fault_shared_by_a_pools_containers_is_one_violation_naming_its_instances",
            "test_an_invalid_stack_quoting_a_credential_is_reported_redacted_by_every_planning_cli",
            "test_credentials_written_into_the_registry_address_are_refused_and_not_echoed",
            "test_every_engines_credential_flags_are_refused_at_the_pool_and_never_written",
            "test_no_planted_credential_is_printed_or_written_and_each_is_located",
            "test_registry_credentials_never_leave_their_secret_envelope",
        },
        "test_policy_e2e": {
            "test_a_gateway_without_auth_is_refused_unless_the_lab_lowers_the_rule",
            "test_make_plan_exits_1_naming_the_rule_and_0_on_the_reference",
            "test_the_pack_starts_the_way_the_cli_runs_it",
        },
        "test_pools": {
            "test_every_generated_script_is_valid_shellcheck_clean_bash",
        },
        "test_preflight": {
            "test_a_node_with_fewer_cpus_than_the_stack_says_is_a_warning_naming_the_key",
            "test_a_node_with_less_ram_than_the_stack_says_is_a_warning_naming_the_key",
            "test_df_of_this_machine",
            "test_preflight_script_fails_with_what_to_fix",
            "test_preflight_script_passes_on_a_healthy_node",
        },
        "test_qualification": {
            "test_the_arch_list_check_against_the_real_torch_2_10_wheel",
            "test_the_arch_list_of_the_real_torch_2_8_wheel_is_the_0_11_images_fact",
            "test_the_gate_script_runs_the_image_on_one_gpu_and_is_shellcheck_clean",
            "test_the_gates_triton_kernel_compiles_for_sm70_only_from_triton_3_4",
            "test_the_same_kernel_uses_tensor_cores_on_sm80_with_triton_3_3",
            "test_the_triton_facts_agree_with_the_real_compiles",
        },
        "test_qualification_engines": {
            "test_each_engines_gate_script_is_shellcheck_clean_and_runs_its_entrypoint",
            "test_llamacpp_check_is_shellcheck_clean",
            "test_the_llamacpp_check_refuses_another_build",
            "test_the_llamacpp_check_runs_against_a_real_llama_server",
            "test_the_lmdeploy_check_reads_turbomind_and_lmdeploys_own_parser",
            "test_the_lmdeploy_check_refuses_a_gpu_turbomind_has_no_kernels_for",
            "test_the_vllm_check_runs_against_vllm_0_19_1s_own_code",
        },
        "test_rdma": {
            "test_a_pair_at_the_floor_passes_and_the_server_runs_on_the_peer",
            "test_a_slow_pair_fails_naming_the_pair_the_figure_and_what_to_check",
            "test_the_real_ib_write_bw_without_an_hca_is_reported_with_its_own_words",
            "test_the_script_is_shellcheck_clean",
        },
        "test_smoke": {
            "test_a_bad_answer_fails_the_deploy_naming_model_pool_and_status",
            "test_a_replica_still_held_out_by_nginx_is_retried",
            "test_a_wrong_key_and_no_gateway_are_reported",
            "test_every_served_name_answers_through_a_real_server_with_the_key",
            "test_over_https_with_the_gateways_own_certificate",
            "test_the_script_is_shellcheck_clean",
        },
        "test_vllm_0_11": {
            "test_the_committed_dumps_are_what_the_wheels_own_code_says",
        },
        "test_vllm_native_launcher": {
            "test_a_headless_worker_exits_when_rank_0_stops_serving_and_passes_its_own_death_on",
            "test_the_gate_names_the_workers_log_and_is_shellcheck_clean",
        },
        "test_vllm_argv": {
            "test_health_gate_is_valid_shellcheck_clean_bash",
            "test_health_gate_passes_once_health_answers",
            "test_health_gate_reports_progress_and_times_out_with_what_to_check",
        },
    }.items()
}


@pytest.hookimpl(tryfirst=True)  # before -m deselects by these marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    stale = [f"tests/{m}.py" for m in REALTOOL_MODULES | REALTOOL_TESTS.keys() if not (TESTS / f"{m}.py").is_file()]
    for item in items:
        path = Path(item.path)
        module = path.stem
        if TESTS / "lab" in path.parents:
            item.add_marker(pytest.mark.lab)
        elif path.parent == TESTS and module in REALTOOL_MODULES:
            item.add_marker(pytest.mark.realtool)
        elif path.parent == TESTS and module in REALTOOL_TESTS:
            names = REALTOOL_TESTS[module]
            stale += [f"{module}::{n}" for n in names if not hasattr(getattr(item, "module", None), n)]
            if getattr(item, "originalname", item.name) in names:
                item.add_marker(pytest.mark.realtool)
    if stale:
        raise pytest.UsageError(
            "tests/conftest.py names tiers of tests that are not there (renamed or moved?): "
            + ", ".join(sorted(set(stale)))
        )
