"""An engine's parser rebuilt from its dump (components/engines/cli_dump.py): every kind of entry the dump format
holds (a positional, help and version, store, store_true/false, append, count, an action argparse has no name
for) with its nargs, choices and types, what the rebuilt parser takes and the exact complaint for what it
refuses; then the real dumps' own option lists."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from components.engines import cli_dump
from components.engines.cli_dump import BASE_TYPES, _named, build_parser, options, parse_errors

ENTRIES = [
    {"positional": "model", "nargs": "?"},
    {"opts": ["-h", "--help"], "kind": "_HelpAction", "nargs": 0},
    {"opts": ["--version"], "kind": "_VersionAction", "nargs": 0},
    {"opts": ["--tp", "-tp"], "kind": "_StoreAction", "nargs": None, "choices": None, "type": "int"},
    {"opts": ["--dtype"], "kind": "_StoreAction", "choices": ["auto", "half"], "type": "None"},
    {"opts": ["--level"], "kind": "_StoreAction", "choices": ["1", "2"], "type": "int"},
    {"opts": ["--ratio"], "kind": "_StoreAction", "type": "float"},
    {"opts": ["--cfg"], "kind": "_StoreAction", "type": "loads"},
    {"opts": ["--policy"], "kind": "_StoreAction", "type": "_parse", "choices": ["0", "8"]},
    {"opts": ["--name"], "kind": "_StoreAction", "type": "str"},
    {"opts": ["--eager"], "kind": "_StoreTrueAction", "nargs": 0},
    {"opts": ["--no-x"], "kind": "_StoreFalseAction", "nargs": 0},
    {"opts": ["--lora"], "kind": "_AppendAction", "nargs": "+"},
    {"opts": ["-v"], "kind": "_CountAction", "nargs": 0},
    # An action the rebuilt parser has no name for is stored, with its nargs.
    {"opts": ["--pair"], "kind": "_ExtendAction", "nargs": 2},
]


@pytest.fixture
def parser(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(cli_dump, "_entries", lambda dump: tuple(ENTRIES))
    return build_parser("toy.json", "srv", {"_parse": int})


@pytest.mark.parametrize(
    ("argv", "parsed"),
    [
        ([], {}),  # every default suppressed
        (["m", "--tp", "2", "-tp", "3"], {"model": "m", "tp": 3}),
        (["--level", "2"], {"level": 2}),
        (["--ratio", "0.5"], {"ratio": 0.5}),
        (["--cfg", '{"a": [1]}'], {"cfg": {"a": [1]}}),
        (["--policy", "8"], {"policy": 8}),
        (["--name", "7", "--dtype", "half"], {"name": "7", "dtype": "half"}),
        (["--help", "--version"], {"help": True, "version": True}),
        (["--eager", "--no-x"], {"eager": True, "no_x": False}),
        (["--lora", "a", "b", "--lora", "c"], {"lora": [["a", "b"], ["c"]]}),
        (["-v", "-v"], {"v": 2}),
        (["--pair", "a", "b"], {"pair": ["a", "b"]}),
    ],
)
def test_what_the_rebuilt_parser_takes(parser: Any, argv: list[str], parsed: dict[str, Any]) -> None:
    ns, unknown = parser.parse_known_args(argv)
    assert (vars(ns), unknown) == (parsed, [])
    assert parse_errors(parser, argv) == []


@pytest.mark.parametrize(
    ("argv", "errors"),
    [
        (["--tp", "x"], ["argument --tp/-tp: invalid int value: 'x'"]),
        (["--tp"], ["argument --tp/-tp: expected one argument"]),
        (["--dtype", "bf16"], ["argument --dtype: invalid choice: 'bf16' (choose from 'auto', 'half')"]),
        # Choices are converted by the option's type: an int choice, an int in the message.
        (["--level", "3"], ["argument --level: invalid choice: 3 (choose from 1, 2)"]),
        (["--policy", "4"], ["argument --policy: invalid choice: 4 (choose from 0, 8)"]),
        (["--ratio", "half"], ["argument --ratio: invalid float value: 'half'"]),
        (["--cfg", "{bad"], ["argument --cfg: invalid json value: '{bad'"]),
        (["--pair", "a"], ["argument --pair: expected 2 arguments"]),
        # No abbreviation, nothing unknown, one positional (the value after an unknown flag is taken for it).
        (["--ea"], ["unrecognized arguments: --ea"]),
        (["--eager", "--bogus", "1", "m", "n"], ["unrecognized arguments: --bogus m n"]),
    ],
)
def test_what_the_rebuilt_parser_refuses_in_argparses_words(parser: Any, argv: list[str], errors: list[str]) -> None:
    assert parse_errors(parser, argv) == errors


def test_the_parser_has_no_help_or_abbreviations_and_the_program_name(parser: Any) -> None:
    assert (parser.prog, parser.add_help, parser.allow_abbrev, parser.exit_on_error) == ("srv", False, False, False)


def test_a_missing_positional_is_argparses_error_raised_not_an_exit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli_dump, "_entries", lambda dump: ({"positional": "model_path", "nargs": None},))
    parser = build_parser("toy.json", "srv")
    assert parse_errors(parser, []) == ["the following arguments are required: model_path"]
    with pytest.raises(cli_dump._ParseError, match="^the following arguments are required: model_path$"):
        parser.parse_known_args([])


def test_an_engines_own_type_is_used_and_a_type_nobody_names_is_a_string(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        cli_dump, "_entries", lambda dump: ({"opts": ["--p"], "kind": "_StoreAction", "type": "_parse"},)
    )
    assert vars(build_parser("toy.json", "srv", {"_parse": int}).parse_known_args(["--p", "8"])[0]) == {"p": 8}
    assert vars(build_parser("toy.json", "srv").parse_known_args(["--p", "8"])[0]) == {"p": "8"}


def test_the_base_types_and_the_json_types_name() -> None:
    assert BASE_TYPES["int"] is int and BASE_TYPES["float"] is float
    assert BASE_TYPES["loads"].__name__ == "json"
    assert BASE_TYPES["loads"]('{"k": [1, 2.5, null]}') == {"k": [1, 2.5, None]}


def test_a_type_is_named_for_argparses_messages() -> None:
    # BASE_TYPES is built at import: the naming is called here too, at test time.
    def convert(value: str) -> str:
        return value

    assert _named(convert, "policy") is convert and convert.__name__ == "policy"


def test_the_real_dumps_option_lists() -> None:
    lmdeploy = options("lmdeploy-0.16.0-api_server-args.json")
    assert {"-h", "--help", "--server-name", "--tp", "--disable-metrics", "--quant-policy"} <= lmdeploy
    assert "model_path" not in lmdeploy  # a positional is no option
    llamacpp = options("llama.cpp-b11312-server-args.json")
    assert {"-m", "--model", "-c", "--ctx-size", "--rpc"} <= llamacpp and "--tp" not in llamacpp


def test_a_dump_is_found_in_the_data_of_the_one_engine_that_owns_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # data.parser_dump is cached (@cache: no mutant), so its rule is compared here, uncached.
    from components.engines import data

    find = data.parser_dump.__wrapped__
    assert (
        find("lmdeploy-0.16.0-api_server-args.json")
        == data.ENGINES_DIR / "lmdeploy/data/lmdeploy-0.16.0-api_server-args.json"
    )
    for engine in ("a", "b"):
        (tmp_path / engine / "data").mkdir(parents=True)
        (tmp_path / engine / "data" / "x.json").write_text("[]")
    (tmp_path / "a" / "data" / "y.json").write_text("[]")
    monkeypatch.setattr(data, "ENGINES_DIR", tmp_path)
    assert find("y.json") == tmp_path / "a" / "data" / "y.json"
    with pytest.raises(FileNotFoundError) as two:
        find("x.json")
    assert str(two.value) == f"parser dump 'x.json': 2 files under {tmp_path}/*/data"
    with pytest.raises(FileNotFoundError) as none:
        find("z.json")
    assert str(none.value) == f"parser dump 'z.json': 0 files under {tmp_path}/*/data"
