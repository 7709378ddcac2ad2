"""Mutants that no test can kill because they do not change behaviour, reviewed one by one: mutant name ->
(the line the mutant writes, why it is equivalent). tests/checks/mutmut_module.py sets them apart from
the score and reports an entry stale when its mutant no longer writes that line (the function changed:
review it again)."""

from __future__ import annotations

EQUIVALENT: dict[str, tuple[str, str]] = {
    # --- plan/redact.py ---------------------------------------------------------------------------------
    "plan.redact.x__found_in__mutmut_11": (
        'if isinstance(holder, dict) and parent.rsplit(".", )[-1] in ENV_MAPS and SECRET_ENV.search(key) and _literal(text):',
        "rsplit's last piece is the same whatever the split count",
    ),
    "plan.redact.x__found_in__mutmut_14": (
        'if isinstance(holder, dict) and parent.rsplit(".", 2)[-1] in ENV_MAPS and SECRET_ENV.search(key) and _literal(text):',
        "rsplit's last piece is the same whatever the split count",
    ),
    "plan.redact.x__found_in__mutmut_36": (
        'if isinstance(holder, list) or path.endswith("]"):',
        "_walk gives a path ending in ] exactly when the holder is a list, so or and and agree",
    ),
    "plan.redact.x__flag_values__mutmut_4": (
        'words = [v if isinstance(v, str) else "XXXX" for v in holder]',
        "a non-string item stands in as a word that is no flag either way; only strings are redacted",
    ),
    "plan.redact.xǁRedactorǁdata__mutmut_1": (
        'def data(self, value: Any, key: str = "XXXX", parent: str = "") -> Any:',
        "the defaults reach the env check only with parent '', which is no env map whatever the key",
    ),
    "plan.redact.xǁRedactorǁdata__mutmut_2": (
        'def data(self, value: Any, key: str = "", parent: str = "XXXX") -> Any:',
        "'XXXX' is no env map name, as '' is not",
    ),
    # --- plan/diff.py -----------------------------------------------------------------------------------
    "plan.diff.x__top__mutmut_4": (
        'return path.split(".", 1)[0].split("[", )[0]',
        "the first piece is the same whatever the split count",
    ),
    "plan.diff.x__top__mutmut_5": (
        'return path.split(".", 1)[0].rsplit("[", 1)[0]',
        "a path's first segment holds at most one [ (_diff_values indexes only lists of objects)",
    ),
    "plan.diff.x__top__mutmut_9": (
        'return path.split(".", )[0].split("[", 1)[0]',
        "the first piece is the same whatever the split count",
    ),
    "plan.diff.x__top__mutmut_12": (
        'return path.split(".", 2)[0].split("[", 1)[0]',
        "the first piece is the same whatever the split count",
    ),
    "plan.diff.x__top__mutmut_15": (
        'return path.split(".", 1)[0].split("[", 2)[0]',
        "the first piece is the same whatever the split count",
    ),
    "plan.diff.x_diff_resources__mutmut_77": (
        'change.changes = _diff_values(prev.get("inputs") or {}, r.get("inputs") or {}, None)',
        "_diff_values treats a false path (None as '') as the root",
    ),
    "plan.diff.x_diff_resources__mutmut_121": (
        'name = _key(via[0]).rsplit("::", )[-1]',
        "rsplit's last piece is the same whatever the split count",
    ),
    "plan.diff.x_diff_resources__mutmut_126": (
        'name = _key(via[0]).rsplit("::", 2)[-1]',
        "rsplit's last piece is the same whatever the split count",
    ),
    "plan.diff.x_diff_resources__mutmut_127": (
        'name = _key(via[0]).rsplit("::", 1)[+1]',
        "a key is project::type::name, so one rsplit gives two pieces and [1] is [-1]",
    ),
    "plan.diff.x_diff_resources__mutmut_158": (
        'with_ = [_key(u).rsplit("::", )[-1] for u in options.get("replaceWith") or [] if _key(u) in replaced]',
        "rsplit's last piece is the same whatever the split count",
    ),
    "plan.diff.x_diff_resources__mutmut_162": (
        'with_ = [_key(u).rsplit("::", 2)[-1] for u in options.get("replaceWith") or [] if _key(u) in replaced]',
        "rsplit's last piece is the same whatever the split count",
    ),
    "plan.diff.x_diff_resources__mutmut_163": (
        'with_ = [_key(u).rsplit("::", 1)[+1] for u in options.get("replaceWith") or [] if _key(u) in replaced]',
        "a key is project::type::name, so one rsplit gives two pieces and [1] is [-1]",
    ),
    # (the rest of plan/diff.py: service impact, the diff section and its text)
    "plan.diff.x__text_change__mutmut_5": (
        "ops = difflib.SequenceMatcher(None, a, b, autojunk=None).get_opcodes()",
        "SequenceMatcher reads autojunk for its truth only: None is False",
    ),
    "plan.diff.x__purpose__mutmut_10": (
        'for line in str((resource.get("inputs") or {}).get("create") or "XXXX").splitlines():',
        "a script-less resource's one line 'XXXX' is no '# llm-cluster: ' line, as '' has none: the name either way",
    ),
    "plan.diff.x_service_impact__mutmut_54": (
        'parent = docs.get(_key(r.get("parent", "XXXX")))',
        "a resource written without a parent finds none under 'XXXX' as under '': every key is a resource's URN",
    ),
    # --- components/planning/gateway ---------------------------------------------------------------------
    "components.planning.gateway.upstreams.x_server_keepalive_seconds__mutmut_5": (
        "value = env.get(server.keepalive_env) if (server.keepalive_env) or True else None",
        "a pool's env has string keys, so env.get(None) is None, as the else gives",
    ),
    # --- components/engines/vllm/serve_args.py ---------------------------------------------------------
    "components.engines.vllm.serve_args.x__human_readable_int_or_auto__mutmut_6": (
        'return -1 if value.strip() in ("XX-1XX", "auto", "AUTO", "Auto") else _human_readable_int(value)',
        'without "-1" in the tuple, human_readable_int reads "-1" as int("-1"), the same -1',
    ),
    "components.engines.vllm.serve_args.x__default_model__mutmut_6": (
        'return next(str(e["default"]).strip("XX\'XX") for e in dump_entries(dump) if "--model" in e.get("opts", ()))',
        "no dump's default model begins or ends with X (facebook/opt-125m, Qwen/Qwen3-0.6B), so stripping X as well as ' changes none",
    ),
    "components.engines.vllm.serve_args.x__drop_option__mutmut_6": (
        "dropping = None  # the values after a dropped `--option` (not after `--option=value`)",
        "dropping is only read for its truth, and None is false as False is",
    ),
    "components.engines.vllm.serve_args.x__drop_option__mutmut_21": (
        "dropping = None",
        "dropping is only read for its truth, and None is false as False is",
    ),
    "components.engines.vllm.serve_args.x_parse_serve__mutmut_10": (
        'dump, version = reader.serve_args or "XXXX", reader.version',
        "reader is the image's facts only when they have a dump, else the fallback, whose dump is asserted at import: the `or` never applies",
    ),
    "components.engines.vllm.serve_args.x_parse_serve__mutmut_22": (
        "for _ in range(len(remaining) + 2):",
        "the loop ends by break: each failed try drops at least one token and an empty argv parses, so it never runs len + 1 times",
    ),
    "components.engines.vllm.serve_args.x_parse_serve__mutmut_34": (
        'remaining = _drop_option(remaining, err.argument_name or "XXXX")',
        "argparse names the argument of every ArgumentError it raises while parsing; '' and 'XXXX' would both name no flag an argv holds",
    ),
    "components.engines.vllm.serve_args.x_parse_serve__mutmut_40": (
        "previous_unknown = None",
        "previous_unknown is only read for its truth, and None is false as False is",
    ),
    "components.engines.vllm.serve_args.x_parse_serve__mutmut_82": (
        "previous_unknown = None  # the value of the unknown flag before it",
        "previous_unknown is only read for its truth, and None is false as False is",
    ),
    "components.engines.vllm.serve_args.x_parse_serve__mutmut_55": (
        "close = difflib.get_close_matches(name, _option_strings(program, dump), )",
        "only the best match is used, and get_close_matches puts the best first whatever n",
    ),
    "components.engines.vllm.serve_args.x_parse_serve__mutmut_60": (
        "close = difflib.get_close_matches(name, _option_strings(program, dump), n=2)",
        "only the best match is used, and get_close_matches puts the best first whatever n",
    ),
    "components.engines.vllm.serve_args.x_parse_serve__mutmut_56": (
        "close = difflib.get_close_matches(name, _option_strings(None, dump), n=1)",
        "a program other than vllm serve builds the api_server's parser, which differs only by the positional, which has no option string",
    ),
    # --- components/engines/vllm/launch.py -------------------------------------------------------------
    "components.engines.vllm.launch.x_server_tokens__mutmut_8": (
        'if argv[i].rsplit("/", )[-1] == "vllm" and argv[i + 1] == "serve":',
        "rsplit's last piece is the same whatever the split count",
    ),
    "components.engines.vllm.launch.x_server_tokens__mutmut_11": (
        'if argv[i].rsplit("/", 2)[-1] == "vllm" and argv[i + 1] == "serve":',
        "rsplit's last piece is the same whatever the split count",
    ),
    "components.engines.vllm.launch.x_server_tokens__mutmut_49": (
        "if module is None or 0 <= serve_at <= module.start():",
        '"vllm serve" and "-m vllm…" start with different characters, so they never start at the same index',
    ),
    # --- components/engines/lmdeploy/rules.py ----------------------------------------------------------
    "components.engines.lmdeploy.rules.x_check_lmdeploy_model__mutmut_19": (
        'model_type = ""',
        "neither '' nor 'None' is a model type HF_ARCHITECTURES names",
    ),
    "components.engines.lmdeploy.rules.x_check_lmdeploy_kv__mutmut_6": (
        'policy = getattr(s.args(), "quant_policy", None) or 0',
        "None or 0 is 0, as the default 0 is",
    ),
    "components.engines.lmdeploy.rules.x_check_lmdeploy_kv__mutmut_12": (
        'policy = getattr(s.args(), "quant_policy", 1) or 0',
        "the policy reads 0 when no --quant-policy parses; policy 0 has kernels from sm_70, the lowest capability in the GPU facts, and a policy LMDeploy does not know (1) is left to its parser: 0, None and 1 give the same verdict",
    ),
    "components.engines.lmdeploy.rules.x_check_lmdeploy_kv__mutmut_13": (
        'policy = getattr(s.args(), "quant_policy", 0) or 1',
        "the policy reads 0 when no --quant-policy parses; policy 0 has kernels from sm_70, the lowest capability in the GPU facts, and a policy LMDeploy does not know (1) is left to its parser: 0, None and 1 give the same verdict",
    ),
    # --- components/engines/llamacpp/rules.py ----------------------------------------------------------
    "components.engines.llamacpp.rules.x_check_llamacpp_split__mutmut_7": (
        'mode = str(getattr(s.args(), "split_mode", None) or "layer")',
        "None or 'layer' is 'layer', as the default is",
    ),
    "components.engines.llamacpp.rules.x_check_llamacpp_split__mutmut_13": (
        'mode = str(getattr(s.args(), "split_mode", "XXlayerXX") or "layer")',
        "layer is a production mode and a mode the facts do not know gives no advice either: the verdict is [] whichever default",
    ),
    "components.engines.llamacpp.rules.x_check_llamacpp_split__mutmut_14": (
        'mode = str(getattr(s.args(), "split_mode", "LAYER") or "layer")',
        "layer is a production mode and a mode the facts do not know gives no advice either: the verdict is [] whichever default",
    ),
    "components.engines.llamacpp.rules.x_check_llamacpp_split__mutmut_15": (
        'mode = str(getattr(s.args(), "split_mode", "layer") or "XXlayerXX")',
        "reached only for an empty mode, which the parser's choices refuse (args() is then None and the getattr default applies)",
    ),
    "components.engines.llamacpp.rules.x_check_llamacpp_split__mutmut_16": (
        'mode = str(getattr(s.args(), "split_mode", "layer") or "LAYER")',
        "reached only for an empty mode, which the parser's choices refuse (args() is then None and the getattr default applies)",
    ),
    "components.engines.llamacpp.rules.x_check_llamacpp_cache__mutmut_8": (
        'v_type = str(getattr(args, "cache_type_v", None) or "f16")',
        "None or 'f16' is 'f16', as the default is",
    ),
    "components.engines.llamacpp.rules.x_check_llamacpp_cache__mutmut_28": (
        'if v_type not in ("f16", "f32", "bf16") and getattr(args, "flash_attn", None) in ("off", "0", "false"):',
        "the parser keeps unset flags out of the namespace; no default but off, 0 or false turns the rule on, and none of these is",
    ),
    "components.engines.llamacpp.rules.x_check_llamacpp_cache__mutmut_34": (
        'if v_type not in ("f16", "f32", "bf16") and getattr(args, "flash_attn", "XXautoXX") in ("off", "0", "false"):',
        "the parser keeps unset flags out of the namespace; no default but off, 0 or false turns the rule on, and none of these is",
    ),
    "components.engines.llamacpp.rules.x_check_llamacpp_cache__mutmut_35": (
        'if v_type not in ("f16", "f32", "bf16") and getattr(args, "flash_attn", "AUTO") in ("off", "0", "false"):',
        "the parser keeps unset flags out of the namespace; no default but off, 0 or false turns the rule on, and none of these is",
    ),
    # --- policies/rules/image.py -----------------------------------------------------------------------
    "policies.rules.image.x_validate_gate__mutmut_7": (
        'if props.get("qualificationGate", None) is not False:',
        "None is not False, as the default True is not: an unset gate is on either way",
    ),
    "policies.rules.image.x_validate_gate__mutmut_9": (
        'if props.get("qualificationGate", ) is not False:',
        "None is not False, as the default True is not: an unset gate is on either way",
    ),
    "policies.rules.image.x_validate_gate__mutmut_26": (
        ")",
        "the report without its urn argument: ReportViolation takes urn=None by default, as the None passed",
    ),
    # --- policies/rules/capacity.py ---------------------------------------------------------------------
    "policies.rules.capacity.x_validate_fit__mutmut_32": (
        "report(message, )",
        "the report without its urn argument: ReportViolation takes urn=None by default, as the None passed",
    ),
    "policies.rules.capacity.x_validate_margin__mutmut_60": (
        ")",
        "the report without its urn argument: ReportViolation takes urn=None by default, as the None passed",
    ),
    "policies.rules.capacity.x_validate_headroom__mutmut_51": (
        ")",
        "the report without its urn argument: ReportViolation takes urn=None by default, as the None passed",
    ),
    # --- policies/rules/bindings.py ---------------------------------------------------------------------
    "policies.rules.bindings.x_listen_host__mutmut_9": (
        'return value[1 : value.rindex("]")] if "]" in value else value[1:]',
        "the first and the last ] differ only in a value with two, which no service reads as a listen address "
        "(an IPv6 address in brackets holds one)",
    ),
    # --- policies/rules/airgap.py -----------------------------------------------------------------------
    "policies.rules.airgap.x__public_source__mutmut_10": (
        'via, source = s.get("via"), str(s.get("source") or "XXXX")',
        "every supply the planner writes states its source (ImageSupply.source, a str): the fallback is never read",
    ),
    "policies.rules.airgap.x_validate_images__mutmut_39": (
        ")",
        "the report without its urn argument: ReportViolation takes urn=None by default, as the None passed",
    ),
    "policies.rules.airgap.x_validate_hub__mutmut_35": (
        ")",
        "the report without its urn argument: ReportViolation takes urn=None by default, as the None passed",
    ),
    "policies.rules.airgap.x_validate_hub__mutmut_50": (
        ")",
        "the report without its urn argument: ReportViolation takes urn=None by default, as the None passed",
    ),
    "policies.rules.airgap.x_validate_hub__mutmut_65": (
        ")",
        "the report without its urn argument: ReportViolation takes urn=None by default, as the None passed",
    ),
    # --- policies/rules/security.py ---------------------------------------------------------------------
    "policies.rules.security.x_ray_start_words__mutmut_13": (
        'for line in str(upload.get("content") or "XXXX").splitlines():',
        "an upload without content starts no Ray: any fallback text without `ray start` in it reads the same",
    ),
    # --- policies/rules/grouped.py ----------------------------------------------------------------------
    "policies.rules.grouped.x_pool_rule__mutmut_18": (
        "owner = _owner(resource) if (found) or True else None",
        "a resource without findings reports nothing whatever its owner; an unknown its owner raises is caught "
        "and skips only that resource, which had nothing to report",
    ),
    # --- policies/rules/common.py -----------------------------------------------------------------------
    "policies.rules.common.x_role_of__mutmut_15": (
        'return ROLE_BY_IMAGE.get(image_parts(ref)[0].rsplit("/", )[-1], "") if ref else ""',
        "the last piece after / is the same whatever the split count",
    ),
    "policies.rules.common.x_role_of__mutmut_20": (
        'return ROLE_BY_IMAGE.get(image_parts(ref)[0].rsplit("/", 2)[-1], "") if ref else ""',
        "the last piece after / is the same whatever the split count",
    ),
    "policies.rules.common.x_is_ray_container__mutmut_12": (
        'argv[i].rsplit("/", )[-1] == "ray" and argv[i + 1] == "start" for i in range(len(argv) - 1)',
        "the last piece after / is the same whatever the split count",
    ),
    "policies.rules.common.x_is_ray_container__mutmut_15": (
        'argv[i].rsplit("/", 2)[-1] == "ray" and argv[i + 1] == "start" for i in range(len(argv) - 1)',
        "the last piece after / is the same whatever the split count",
    ),
    "policies.rules.common.x_name_stack_keys__mutmut_42": (
        "(message.find(phrase), phrase.split(None, 1)[0], key)",
        "the only phrase a ModelServer's stackKeys hold is `image <ref>` (components/engines/registry.py): one space and a ref without any, so every split's first piece is `image`",
    ),
    "policies.rules.common.x_name_stack_keys__mutmut_45": (
        '(message.find(phrase), phrase.split(" ", )[0], key)',
        "the only phrase a ModelServer's stackKeys hold is `image <ref>` (components/engines/registry.py): one space and a ref without any, so every split's first piece is `image`",
    ),
    "policies.rules.common.x_name_stack_keys__mutmut_46": (
        '(message.find(phrase), phrase.rsplit(" ", 1)[0], key)',
        "the only phrase a ModelServer's stackKeys hold is `image <ref>` (components/engines/registry.py): one space and a ref without any, so every split's first piece is `image`",
    ),
    "policies.rules.common.x_name_stack_keys__mutmut_48": (
        '(message.find(phrase), phrase.split(" ", 2)[0], key)',
        "the only phrase a ModelServer's stackKeys hold is `image <ref>` (components/engines/registry.py): one space and a ref without any, so every split's first piece is `image`",
    ),
    "policies.rules.common.x_name_stack_keys__mutmut_55": (
        "for _, token, key in sorted(found, key=None):",
        "two matches at one place are the same token read twice (a variable by its prefix and by its exact name), with the same key: whole tuples sort as their positions do",
    ),
    "policies.rules.common.x_name_stack_keys__mutmut_57": (
        "for _, token, key in sorted(found, ):",
        "two matches at one place are the same token read twice (a variable by its prefix and by its exact name), with the same key: whole tuples sort as their positions do",
    ),
    "policies.rules.common.x_name_stack_keys__mutmut_62": (
        "if key and key.split(None)[0] not in message and key not in edits:",
        "stack keys are written with single spaces (`pools.chat.vllm.extraArgs[2] (given in extraArgs)`): split(None) and split(' ') agree",
    ),
    "policies.rules.common.x_launch_policy__mutmut_36": (
        "messages = rule.check(launch, settings)",
        "messages is empty before the check: = and += agree",
    ),
    "policies.rules.common.x_launch_policy__mutmut_59": (
        "report(message, )",
        "the report without its urn argument: ReportViolation takes urn=None by default, as the None passed",
    ),
    # --- components/spec ---------------------------------------------------------------------------------
    "components.spec.topology.x_instances__mutmut_36": (
        "if span > 2 or pool.replicas_per_node == 1:",
        "the two differ only at span 2 with replicasPerNode > 1, which check_pools refuses (replicas of an "
        "instance spanning nodes) before any instance is planned",
    ),
    "components.spec.topology.x_host_ports__mutmut_9": (
        "elif inst.native_launcher or inst.master_port is not None:",
        "an instance has a master port only from a native launcher across nodes (Launcher.port), so or and and agree",
    ),
    "components.spec.topology.x_resource_suffix__mutmut_16": (
        'return "".join(c if c.isalnum() else "-" for c in last.lower()).strip("XX-XX")',
        "the text is lowercased first: no X is left for strip to take, only the dashes",
    ),
    "components.spec.models.x_model_architecture__mutmut_14": (
        'path = Path(m.config_json or "XXXX")',
        "the branch runs only without arch, and ModelSpec takes exactly one of arch or configJson: the fallback "
        "is for the type checker, never read",
    ),
    "components.planning.gateway.limits.x_budget_zone_kib__mutmut_11": (
        "while size <= need:",
        "need is keys x 0.525 KiB, keys x 2^15 / 21 over 1024: never a whole power of two, so < and <= agree",
    ),
    # --- components/spec/base.py ------------------------------------------------------------------------
    "components.spec.base.x_issues_from_validation_error__mutmut_3": (
        "for e in err.errors(include_url=True):",
        "the url is one more key of each error, and the issues read only its type, location, message, input "
        "and context",
    ),
    # --- components/spec/stack.py -----------------------------------------------------------------------
    "components.spec.stack.x_check_pools__mutmut_82": (
        "width = p.tensor_parallel / p.pipeline_parallel",
        "width is read only where an instance is on one node, and nodes_per_instance is at least "
        "pipelineParallel: there pipelineParallel is 1, so tp / 1 is tp x 1",
    ),
    "components.spec.stack.x_check_pools__mutmut_140": (
        'f"{int(ram / (shm // p.shm_size_gib))} fits",',
        "RAM is positive and the divisor a whole replica count (1 to 16): int() truncates a positive quotient "
        "as // floors it (checked at the float just under every multiple up to 5000 x 16)",
    ),
    "components.spec.stack.x_check_pools__mutmut_141": (
        'f"{int(ram // (shm / p.shm_size_gib))} fits",',
        "shm is shmSizeGib (a whole number) times the replicas: the division is exact, replicas as 2.0 for 2",
    ),
    # --- components/spec/cluster.py ---------------------------------------------------------------
    "components.spec.cluster.x__ssh_strings__mutmut_8": (
        "size = int.from_bytes(blob[at : at + 4], )",
        "int.from_bytes' byte order is big-endian by default (Python 3.11)",
    ),
    "components.spec.cluster.x_ssh_host_key__mutmut_33": (
        'strings = _ssh_strings(base64.b64decode(fields[1] if len(fields) > 1 else "XXXX", validate=True))',
        "a key line of its type alone decodes to too few bytes for two strings whatever the stand-in: 'XXXX' is 3 bytes, '' none; refused with the same words",
    ),
    "components.spec.cluster.x_ssh_host_key__mutmut_35": (
        'strings = ""',
        "'' and None are both no strings: refused with the same words",
    ),
    "components.spec.cluster.x_cidr__mutmut_5": (
        "net = ipaddress.ip_network(v, )",
        "ip_network is strict by default",
    ),
    "components.spec.cluster.x_cidr__mutmut_9": (
        'hint = f"; did you mean {ipaddress.ip_network(v, strict=None)}?"',
        "strict=None is false, as strict=False",
    ),
    "components.spec.cluster.x_image_reference__mutmut_10": (
        'named = v.split("@", )[0]',
        "the first piece is the same whatever the split count",
    ),
    "components.spec.cluster.xǁPoolSpecǁ__getattr____mutmut_4": (
        'if not name.startswith("XX_XX") and name in deployed_engines.DEPLOYED_KEYS:',
        "a name starting with _ is no options key (they are YAML keys), so the in-check refuses it either way",
    ),
    "components.spec.cluster.x_pool_with_options__mutmut_7": (
        'pool = ""',
        "pool is read only when the handler returned it (any error raises first): its first value is never read",
    ),
    "components.spec.cluster.x_pool_with_options__mutmut_11": (
        "errors = _relayed(err)",
        "errors is empty before the handler's errors, so += and = agree",
    ),
    "components.spec.cluster.x_pool_with_options__mutmut_21": (
        "raise ValidationError.from_exception_data(None, errors)",
        "the title is in no error's type, location or message, which are all the spec reads",
    ),
    "components.spec.cluster.x_pool_with_options__mutmut_51": (
        'pool.__pydantic_private__["_options"] = options.get(wanted) if (wanted) or True else None',
        "without a wanted block options holds nothing: options.get(None) is None",
    ),
    "components.spec.cluster.x__relayed__mutmut_25": (
        "for e in err.errors(include_url=True)",
        "the url is a key of each error the relay does not copy",
    ),
    "components.spec.cluster.x_image_reference__mutmut_13": (
        'named = v.split("@", 2)[0]',
        "the first piece is the same whatever the split count",
    ),
    "components.spec.cluster.x_image_reference__mutmut_31": (
        'repo = named.rsplit(":", 1)[0] if ":" in named.rsplit("/", )[-1] else named',
        "the last piece is the same whatever the split count",
    ),
    "components.spec.cluster.x_image_reference__mutmut_34": (
        'repo = named.rsplit(":", 1)[0] if ":" in named.rsplit("/", 2)[-1] else named',
        "the last piece is the same whatever the split count",
    ),
    "components.spec.cluster.x_image_reference__mutmut_60": (
        'path = repo.split("/", 1)[1] if "/" in repo and re.search(r"[.:]|^localhost$", repo.split("/", )[0]) else repo',
        "the first piece is the same whatever the split count",
    ),
    "components.spec.cluster.x_image_reference__mutmut_63": (
        'path = repo.split("/", 1)[1] if "/" in repo and re.search(r"[.:]|^localhost$", repo.split("/", 2)[0]) else repo',
        "the first piece is the same whatever the split count",
    ),
    # --- components/engines/vllm/rules/topology.py ---------------------------------------------------------
    "components.engines.vllm.rules.topology.x_check_parallelism__mutmut_85": (
        "elif not tp_too_wide and nodes >= 1 and pp != nodes:",
        "on one node the branch above takes every pp > 1; only a --pipeline-parallel-size below 1 reaches this "
        "one, which the plan never writes (pipelineParallel >= 1) and vLLM's ParallelConfig refuses at start",
    ),
    "components.engines.vllm.rules.topology.x_check_parallelism__mutmut_109": (
        "divisors = [d for d in range(1, heads + 2) if heads % d == 0 and (per_node is None or d <= per_node)]",
        "heads + 1 never divides heads: the divisors are the same",
    ),
    # --- components/engines/vllm/rules/engine_args.py ------------------------------------------------------
    "components.engines.vllm.rules.engine_args.x_engine_version__mutmut_9": (
        'match = _VERSION.match(tag or "XXXX")',
        "an image without a tag: 'XXXX' no more starts with a version than '' does, both read as the reference line",
    ),
    "components.engines.vllm.rules.engine_args.x_runs_v1__mutmut_6": (
        "return facts.runs_v1(launch.capability or 1) and not (",
        "a GPU not in the table read as capability 1 instead of 0: every image line's V1 minimum is 70 or more, "
        "so both run V0",
    ),
    "components.engines.vllm.rules.engine_args.x_runs_v1__mutmut_26": (
        'return launch.env.get("VLLM_USE_V1") != "0" and (launch.capability or 1) >= 80',
        "a GPU not in the table read as capability 1 instead of 0: both are below 80",
    ),
    # --- components/engines/vllm/rules/hardware.py ---------------------------------------------------------
    "components.engines.vllm.rules.hardware.x__dtype__mutmut_12": (
        "return DTYPE_ALIASES.get(given, None)",
        "DTYPE_ALIASES' keys are every --dtype choice vLLM takes, and a value outside them is an argv error the parser does not store: the fallback is never read",
    ),
    "components.engines.vllm.rules.hardware.x__dtype__mutmut_13": (
        "return DTYPE_ALIASES.get(given)",
        "as _dtype's mutant 12: the fallback is never read",
    ),
    "components.engines.vllm.rules.hardware.x__dtype__mutmut_14": (
        "return DTYPE_ALIASES.get(given, )",
        "as _dtype's mutant 12: the fallback is never read",
    ),
    "components.engines.vllm.rules.hardware.x_check_dtype__mutmut_25": (
        "cap = launch.capability or 1",
        "a GPU not in the table read as capability 1 instead of 0: every minimum this compares against is 0 or 70 and up, so both fall on the same side",
    ),
    "components.engines.vllm.rules.hardware.x_check_v1__mutmut_19": (
        "if facts.runs_v1(launch.capability or 1):",
        "a GPU not in the table read as capability 1 instead of 0: every minimum this compares against is 0 or 70 and up, so both fall on the same side",
    ),
    "components.engines.vllm.rules.hardware.x_check_v1__mutmut_29": (
        'f"{(facts.v1_min_capability or 1) / 10:.1f} and {launch.where()} has less (VLLM_USE_V1=1 raises "',
        "reached only when the line reads VLLM_USE_V1 and V1 does not run: every such line states its V1 minimum (70 or 80), never None",
    ),
    "components.engines.vllm.rules.hardware.x__quantization__mutmut_13": (
        'return None, "XXXX"',
        "with no method the source is never read: every caller reads it only for a method",
    ),
    "components.engines.vllm.rules.hardware.x_check_fp8__mutmut_4": (
        "cap = launch.capability or 1",
        "a GPU not in the table read as capability 1 instead of 0: every minimum this compares against is 0 or 70 and up, so both fall on the same side",
    ),
    "components.engines.vllm.rules.hardware.x_check_fp8__mutmut_9": (
        'kv = str(launch.args.get("kv_cache_dtype", None))',
        "an unset cache dtype read as 'None' instead of 'auto': neither starts with fp8, and the value is shown only when it does",
    ),
    "components.engines.vllm.rules.hardware.x_check_fp8__mutmut_11": (
        'kv = str(launch.args.get("kv_cache_dtype", ))',
        "as check_fp8's mutant 9",
    ),
    "components.engines.vllm.rules.hardware.x_check_fp8__mutmut_14": (
        'kv = str(launch.args.get("kv_cache_dtype", "XXautoXX"))',
        "as check_fp8's mutant 9",
    ),
    "components.engines.vllm.rules.hardware.x_check_fp8__mutmut_15": (
        'kv = str(launch.args.get("kv_cache_dtype", "AUTO"))',
        "as check_fp8's mutant 9",
    ),
    "components.engines.vllm.rules.hardware.x__mla_model__mutmut_9": (
        'name = launch.arch or launch.model_path or "XXXX"',
        "'XXXX' names no MLA model any more than '' does",
    ),
    "components.engines.vllm.rules.hardware.x_check_mla__mutmut_4": (
        "cap = launch.capability or 1",
        "a GPU not in the table read as capability 1 instead of 0: every minimum this compares against is 0 or 70 and up, so both fall on the same side",
    ),
    "components.engines.vllm.rules.hardware.x_check_attention_backend__mutmut_26": (
        "cap = launch.capability or 1",
        "a GPU not in the table read as capability 1 instead of 0: every minimum this compares against is 0 or 70 and up, so both fall on the same side",
    ),
    "components.engines.vllm.rules.hardware.x_triton_kernels__mutmut_4": (
        "cap = launch.capability or 1",
        "a GPU not in the table read as capability 1 instead of 0: every minimum this compares against is 0 or 70 and up, so both fall on the same side",
    ),
    "components.engines.vllm.rules.hardware.x_check_triton__mutmut_4": (
        "cap = launch.capability or 1",
        "a GPU not in the table read as capability 1 instead of 0: every minimum this compares against is 0 or 70 and up, so both fall on the same side",
    ),
    "components.engines.vllm.rules.hardware.x_check_prefill__mutmut_4": (
        "cap = launch.capability or 1",
        "a GPU not in the table read as capability 1 instead of 0: every minimum this compares against is 0 or 70 and up, so both fall on the same side",
    ),
    "components.engines.vllm.rules.hardware.x__float32__mutmut_11": (
        'return (launch.capability or 1) < EVERY_VERSION_MIN["bf16"] and model_type in FP16_REFUSING_MODEL_TYPES',
        "a GPU not in the table read as capability 1 instead of 0: every minimum this compares against is 0 or 70 and up, so both fall on the same side",
    ),
    "components.engines.vllm.rules.hardware.x_check_quantization__mutmut_14": (
        "cap = launch.capability or 1",
        "a GPU not in the table read as capability 1 instead of 0: every minimum this compares against is 0 or 70 and up, so both fall on the same side",
    ),
    "components.engines.vllm.rules.hardware.x_check_quantization_moe__mutmut_46": (
        'if f is not None and f.quantizations.get(method, ) is not None and f.quantizations[method].moe != "none"',
        "get's default is None either way",
    ),
    # --- components/engines/base.py ------------------------------------------------------------------------
    "components.engines.base.xǁEngineǁextra_args_issues__mutmut_9": (
        'key = self.typed_key(flag, pool=pool, model=p.model, node="<node>") if (flag) or True else None',
        "typed_key(None) is None as the guard's None: typed_flags is keyed by flags, never by None",
    ),
    "components.engines.base.xǁEngineǁhub_downloads__mutmut_20": (
        'values = rest[: next((j for j, t in enumerate(rest) if t.startswith("-")), None)]',
        "a slice to None ends where one to len(rest) does: at the end of the list",
    ),
    "components.engines.base.x__fetched__mutmut_16": (
        'path = ""',
        "the path of a lora value that is no JSON object is read only for its truth after isinstance: '' and None are both no download",
    ),
    "components.engines.base.x__fetched__mutmut_38": (
        'model = ""',
        "as _fetched's mutant 16: '' and None are both no download",
    ),
    "components.engines.base.x_watchdog_script__mutmut_12": (
        'probe = " ".join(shlex.quote(a) for a in (probe_argv or health_probe_argv(None))[:-1])',
        'the probe\'s last word, the URL, is dropped ([:-1]: the script gives its own "$url"), so which URL it held never shows',
    ),
    "components.engines.base.x_instance_watchdog_script__mutmut_34": (
        "probe_argv=engine.probe_argv(None),",
        "every engine's probe ends with the URL it is given (python3's or curl's), which watchdog_script drops for its own \"$url\"",
    ),
    # --- components/engines/gate.py ----------------------------------------------------------------------
    "components.engines.gate.x_compile_kernel__mutmut_21": (
        "assert spec is not None or spec.loader is not None",
        "spec_from_file_location of a .py path always gives a spec with its source loader: both sides hold, and or agrees with and",
    ),
    # --- components/engines/weights.py -------------------------------------------------------------------
    "components.engines.weights.x_stage_weight_bytes__mutmut_8": (
        "plain = vocab_slice",
        "the first stage's embedding is the first thing added to plain, which is 0.0 just before: = and += agree",
    ),
    "components.engines.weights.x_checkpoint_bytes__mutmut_20": (
        "mla_enabled=None,",
        "mla_enabled reaches only _attention_params, which reads it for its truth (the absorbed copy): None is False there",
    ),
    # --- components/engines/containers.py ----------------------------------------------------------------
    "components.engines.containers.x_image_parts__mutmut_5": (
        'ref = ref.split("@", )[0]',
        "split's first piece is the same whatever the split count",
    ),
    "components.engines.containers.x_image_parts__mutmut_8": (
        'ref = ref.split("@", 2)[0]',
        "split's first piece is the same whatever the split count",
    ),
    "components.engines.containers.x_image_parts__mutmut_16": (
        'if ":" in ref.rsplit("/", )[-1]:',
        "rsplit's last piece is the same whatever the split count",
    ),
    "components.engines.containers.x_image_parts__mutmut_19": (
        'if ":" in ref.rsplit("/", 2)[-1]:',
        "rsplit's last piece is the same whatever the split count",
    ),
    # --- components/engines/cli_dump.py ------------------------------------------------------------------
    "components.engines.cli_dump.x_build_parser__mutmut_91": (
        'convert = known.get(e.get("type") or "XXXX")',
        'an entry without a type looks up a name no type table holds, as "" is not: no conversion either way',
    ),
    # --- components/engines/vllm/memory.py -----------------------------------------------------------------
    "components.engines.vllm.memory.x_default_max_num_seqs__mutmut_2": (
        'def default_max_num_seqs(*, v1_engine: bool = False, gpu_name: str = "XXXX", gpu_memory_gib: float = 0.0) -> int:',
        "the name is read only for a GPU of 70 GiB and more, and neither '' nor 'XXXX' names an A100",
    ),
    "components.engines.vllm.memory.x_default_max_num_seqs__mutmut_3": (
        'def default_max_num_seqs(*, v1_engine: bool = False, gpu_name: str = "", gpu_memory_gib: float = 1.0) -> int:',
        "a GPU of 0 or 1 GiB is under V1's 70 GiB threshold alike",
    ),
    "components.engines.vllm.memory.x_default_max_num_batched_tokens__mutmut_2": (
        'gpu_name: str = "XXXX",',
        "the name is read only for a GPU of 70 GiB and more, and neither '' nor 'XXXX' names an A100",
    ),
    "components.engines.vllm.memory.x_default_max_num_batched_tokens__mutmut_3": (
        "gpu_memory_gib: float = 1.0,",
        "a GPU of 0 or 1 GiB is under V1's 70 GiB threshold alike",
    ),
    "components.engines.vllm.memory.x_estimate__mutmut_8": (
        'gpu_name: str = "XXXX",',
        "the name only picks vLLM's defaults, and neither '' nor 'XXXX' names an A100",
    ),
    "components.engines.vllm.memory.x_estimate__mutmut_173": (
        "blocks.append(max(0, int(free / (block_size * per_token_layer * n))))",
        "the divisor is a whole number of bytes and k x divisor is exact: a float free below it is at least an ulp "
        "under, whose quotient rounds below k, so int() of the quotient is the floor for free >= 0; below 0 both "
        "give 0 blocks through max",
    ),
    # --- components/engines/vllm/capacity.py ---------------------------------------------------------------
    "components.engines.vllm.capacity.x_with_range__mutmut_10": (
        "assert isinstance(kv, int) and isinstance(conc, (int, float)) or isinstance(gib, (int, float))",
        "its one caller passes CapacityEstimate.to_dict(), whose kv_tokens is an int and whose figures are numbers: "
        "every isinstance holds, so `and` and `or` agree",
    ),
    "components.engines.vllm.capacity.x_with_range__mutmut_11": (
        "assert isinstance(kv, int) or isinstance(conc, (int, float)) and isinstance(gib, (int, float))",
        "its one caller passes CapacityEstimate.to_dict(), whose kv_tokens is an int and whose figures are numbers: "
        "every isinstance holds, so `and` and `or` agree",
    ),
    # --- components/engines/vllm/capacity_cli.py -----------------------------------------------------------
    "components.engines.vllm.capacity_cli.x_run__mutmut_123": (
        'gpu_name=gpu_name or "XXXX",',
        "the fallback stands in only for a GPU given by its memory, which runs V0's defaults (v1_engine False) "
        "with max-num-seqs always given: the name is never read, and neither '' nor 'XXXX' names an A100",
    ),
    # --- components/engines/vllm/engine.py (the rest: $VLLM_REST) -----------------------------------------
    "components.engines.vllm.engine.xǁVllmEngineǁfit_problems__mutmut_3": (
        "return super().fit_problems(capacity, None, model) or check_fit(capacity, pool, model)",
        "Engine.fit_problems reads the capacity alone (advice_fit_problems): the pool it is given is never read",
    ),
    "components.engines.vllm.engine.xǁVllmEngineǁfit_problems__mutmut_4": (
        "return super().fit_problems(capacity, pool, None) or check_fit(capacity, pool, model)",
        "Engine.fit_problems reads the capacity alone (advice_fit_problems): the model it is given is never read",
    ),
    "components.engines.vllm.engine.xǁVllmEngineǁextra_args_issues__mutmut_8": (
        'key = self.typed_key(flag, pool=pool, model=p.model, node="<node>") if (flag) or True else None',
        "typed_key looks the flag up in typed_flags, whose keys are all flags: a value token (flag None) is None either way",
    ),
    # --- components/engines/lmdeploy/engine.py (the rest: $LMDEPLOY_REST) ---------------------------------
    "components.engines.lmdeploy.engine.x_kv_bytes_per_token_per_layer__mutmut_7": (
        "params = 0 if kv_bits == 16 else 2 * 16 / 8",
        "4.0 for 4: the sum it is added to is a float already (kv_bits * head_dim / 8)",
    ),
    "components.engines.lmdeploy.engine.x_kv_bytes_per_token_per_layer__mutmut_10": (
        "params = 0 if kv_bits == 16 else 2 * 17 // 8",
        "34 // 8 is 4, as 32 // 8 is",
    ),
    "components.engines.lmdeploy.engine.x_weights_per_gpu__mutmut_24": (
        "q = arch.num_attention_heads / tp * hd",
        "its one caller (turbomind_estimate) refuses a TP that does not divide the heads first; where TP divides "
        "them / and // give the same number",
    ),
    "components.engines.lmdeploy.engine.x_turbomind_estimate__mutmut_45": (
        "blocks = int(kv_mem / (per_token * cache_block_seq_len))",
        "kv_mem is never negative and a block a whole number of bytes: int() of the quotient floors as // does; they "
        "could part only where the float quotient rounds up to a whole block, which a search over free memories up to "
        "80 GiB, eight block sizes and five cache shares did not meet",
    ),
}
