"""The spec's shared base (components/spec/base.py) as tables: every kind of pydantic error in the words a
stack's author reads, with its key path; the unknown-key refusal; true/false against numbers and the bound of
a number without one of its own; how values and paths are written."""

from __future__ import annotations

import datetime
import enum
from typing import Annotated, Any, Literal

import pytest
from pydantic import AfterValidator, Field, ValidationError

from components.spec.base import (
    MAX_NUMBER,
    NAME_PATTERN,
    Spec,
    SpecError,
    SpecIssue,
    issues_from_validation_error,
    key_path,
    known_keys_only,
    scalar_checked,
    scalar_kind,
    shown,
)


def _odd(v: int) -> int:
    if v % 2 == 0:
        raise ValueError(f"{v} is even")
    return v


def _positive(v: int) -> int:
    if v <= 0:
        raise AssertionError("must be positive")  # pydantic's assertion_error, as a validator's `assert` raises
    return v


class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Inner(Spec):
    size: int = Field(default=1, ge=0)


class Toy(Spec):
    count: int = Field(default=1, ge=1, le=10)
    above: float = Field(default=1.0, gt=0.5, lt=2)
    free: int = 0
    free_float: float | None = None
    flag: bool = False
    name: str = Field(default="a", pattern=NAME_PATTERN)
    code: str = Field(default="A", pattern=r"^[A-Z]$")
    label: str = Field(default="x", min_length=1, max_length=3)
    link: Literal["ethernet", "infiniband"] = "ethernet"
    items: list[int] = Field(default_factory=lambda: [1], min_length=1, max_length=2)
    pair: list[int] = Field(default_factory=lambda: [1, 2], min_length=2)
    mapping: dict[str, int] = Field(default_factory=dict)
    inner: Inner = Inner()
    inners: list[Inner] = Field(default_factory=list)
    odd: Annotated[int, AfterValidator(_odd)] = 1
    odds: dict[str, Annotated[int, AfterValidator(_odd)]] = Field(default_factory=dict)
    maybe_odd: Annotated[int, AfterValidator(_odd)] | None = None
    colour: Colour = Colour.RED
    positive: Annotated[int, AfterValidator(_positive)] = 1
    when: str = "now"
    spots: tuple[int, int] = (1, 2)


def issues(data: dict[str, Any], prefix: tuple[Any, ...] = ()) -> list[str]:
    with pytest.raises(ValidationError) as err:
        Toy.model_validate(data)
    return [str(i) for i in issues_from_validation_error(err.value, prefix)]


@pytest.mark.parametrize(
    ("data", "said"),
    [
        (
            {"cuont": 1},
            [
                "cuont: unknown key 'cuont'; allowed keys here: above, code, colour, count, flag, free, freeFloat, "
                "inner, inners, items, label, link, mapping, maybeOdd, name, odd, odds, pair, positive, spots, when"
            ],
        ),
        ({"inner": {"sise": 1}}, ["inner.sise: unknown key 'sise'; allowed keys here: size"]),
        ({"inners": [{}, {"size": -1}]}, ["inners[1].size: -1 is not allowed: must be at least 0"]),
        ({"count": 0}, ["count: 0 is not allowed: must be at least 1"]),
        ({"count": 11}, ["count: 11 is not allowed: must be at most 10"]),
        ({"count": "ten"}, ["count: 'ten' is not allowed: expected a whole number"]),
        ({"count": 1.5}, ["count: 1.5 is not allowed: expected a whole number, not a fraction"]),
        ({"count": [1]}, ["count: [1] is not allowed: expected a whole number"]),
        ({"free": "9" * 5000}, [f"free: {'9' * 5000!r} is not allowed: expected a whole number, not one this large"]),
        ({"above": 0.5}, ["above: 0.5 is not allowed: must be greater than 0.5"]),
        ({"above": 2}, ["above: 2 is not allowed: must be less than 2"]),
        ({"above": "x"}, ["above: 'x' is not allowed: expected a number"]),
        ({"above": [1]}, ["above: [1] is not allowed: expected a number"]),
        (
            {"freeFloat": float("nan")},
            ["freeFloat: nan is not allowed: expected a finite number (.nan and .inf are not)"],
        ),
        ({"flag": "maybe"}, ["flag: 'maybe' is not allowed: expected true or false"]),
        ({"flag": [True]}, ["flag: [True] is not allowed: expected true or false"]),
        ({"label": 5}, ["label: 5 is not allowed: expected text"]),
        ({"label": ""}, ["label: '' is not allowed: must not be empty"]),
        ({"label": "abcd"}, ["label: 'abcd' is not allowed: must be at most 3 characters"]),
        (
            {"name": "Gpu"},
            [
                "name: 'Gpu' is not allowed: must be lowercase letters, digits and '-' (a DNS label, at most 63 characters)"
            ],
        ),
        ({"code": "ab"}, ["code: 'ab' is not allowed: must be text matching the pattern ^[A-Z]$"]),
        (
            {"link": "Ethernet "},
            ["link: 'Ethernet ' is not allowed: must be one of 'ethernet', 'infiniband' (did you mean 'ethernet'?)"],
        ),
        (
            {"link": "INFINIBAND"},
            ["link: 'INFINIBAND' is not allowed: must be one of 'ethernet', 'infiniband' (did you mean 'infiniband'?)"],
        ),
        ({"link": "roce"}, ["link: 'roce' is not allowed: must be one of 'ethernet', 'infiniband'"]),
        ({"link": 5}, ["link: 5 is not allowed: must be one of 'ethernet', 'infiniband'"]),
        ({"items": []}, ["items: [] is not allowed: must not be empty"]),
        ({"items": [1, 2, 3]}, ["items: [1, 2, 3] is not allowed: takes at most 2 item(s)"]),
        ({"items": "1"}, ["items: '1' is not allowed: expected a list (- item lines)"]),
        ({"items": [1, "x"]}, ["items[1]: 'x' is not allowed: expected a whole number"]),
        ({"pair": [1]}, ["pair: [1] is not allowed: needs at least 2 item(s)"]),
        ({"mapping": "x"}, ["mapping: 'x' is not allowed: expected a mapping (key: value lines)"]),
        ({"mapping": {"a": "b"}}, ["mapping.a: 'b' is not allowed: expected a whole number"]),
        # Only pydantic's own tags (a [ and a ]) leave the path; a key holding one bracket stays.
        ({"mapping": {"a[": "b"}}, ["mapping.a[: 'b' is not allowed: expected a whole number"]),
        ({"mapping": {"]": "b"}}, ["mapping.]: 'b' is not allowed: expected a whole number"]),
        ({"inner": 3}, ["inner: 3 is not allowed: expected a mapping (key: value lines)"]),
        ({"inner": None}, ["inner: null is not allowed: expected a mapping (key: value lines)"]),
        ({"spots": 3}, ["spots: 3 is not allowed: expected a list"]),
        # A validator's own words, without pydantic's "Value error, " or its function tag in the path.
        ({"odd": 2}, ["odd: 2 is even"]),
        ({"odds": {"a": 1, "b": 4}}, ["odds.b: 4 is even"]),
        # A union member's tag (function-after[…]) is pydantic's, not a key.
        ({"maybeOdd": 2}, ["maybeOdd: 2 is even"]),
        # An error kind the spec does not map keeps pydantic's words after the value (an enum's "expected" too).
        ({"colour": "green"}, ["colour: 'green' is not allowed: Input should be 'red' or 'blue'"]),
        ({"positive": 0}, ["positive: Assertion failed, must be positive"]),
        # A date is said as YAML wrote it.
        ({"when": datetime.date(2026, 1, 2)}, ["when: 2026-01-02 is not allowed: expected text"]),
        # true/false and numbers are not each other.
        ({"count": True}, ["count: true is not allowed: expected a number, not true/false"]),
        ({"flag": 1}, ["flag: 1 is not allowed: expected true or false, not a number"]),
        ({"free": 2**31}, [f"free: {2**31} is not allowed: must be at most {MAX_NUMBER}"]),
        # Every issue of the mapping, in order.
        (
            {"count": 0, "flag": 2, "label": ""},
            [
                "count: 0 is not allowed: must be at least 1",
                "flag: 2 is not allowed: expected true or false, not a number",
                "label: '' is not allowed: must not be empty",
            ],
        ),
    ],
)
def test_every_error_in_words_with_its_key(data: dict[str, Any], said: list[str]) -> None:
    assert issues(data) == said


def test_a_missing_key_and_a_prefix() -> None:
    class Needs(Spec):
        address: str
        items: list[int] = Field(default_factory=list)

    with pytest.raises(ValidationError) as err:
        Needs.model_validate({"items": [1, "x"]})
    assert [str(i) for i in issues_from_validation_error(err.value, ("nodes", "gpu-01"))] == [
        "nodes.gpu-01.address: required key is missing",
        "nodes.gpu-01.items[1]: 'x' is not allowed: expected a whole number",
    ]


def test_a_number_for_gt_or_le_is_said_whole() -> None:
    class Bounds(Spec):
        rate: float = Field(default=1.0, ge=0.0, le=100.0)
        step: float = Field(default=1.0, gt=0.25)

    with pytest.raises(ValidationError) as err:
        Bounds.model_validate({"rate": -1, "step": 0.25})
    assert [str(i) for i in issues_from_validation_error(err.value)] == [
        "rate: -1 is not allowed: must be at least 0",
        "step: 0.25 is not allowed: must be greater than 0.25",
    ]
    with pytest.raises(ValidationError) as err:
        Bounds.model_validate({"rate": 100.5})
    assert [str(i) for i in issues_from_validation_error(err.value)] == [
        "rate: 100.5 is not allowed: must be at most 100"
    ]


# --- the unknown-key refusal, true/false against numbers, the bound of an unbounded number ----------------------


def test_known_keys_only() -> None:
    allowed = lambda: {"port", "address", "hostKey"}  # noqa: E731
    assert known_keys_only({"port": 1, "address": "a"}, allowed) == {"port": 1, "address": "a"}
    assert known_keys_only({}, allowed) == {}
    assert known_keys_only("x", allowed) == "x"  # not a mapping: the model's own type error says so
    for data, first in (({"zeta": 1, "alpha": 2, "port": 3}, "alpha"), ({7: 1}, "7")):
        with pytest.raises(Exception) as err:
            known_keys_only(data, allowed)
        e = err.value
        assert e.type == "unknown_key"  # type: ignore[attr-defined]
        assert e.context == {"key": first, "quoted": repr(first), "allowed": "address, hostKey, port"}  # type: ignore[attr-defined]
        assert e.message() == f"unknown key {first!r}; allowed keys here: address, hostKey, port"  # type: ignore[attr-defined]


def test_allowed_keys_are_the_yaml_names() -> None:
    assert Inner._allowed_keys() == {"size"}
    assert {"freeFloat", "free"} <= Toy._allowed_keys() and "free_float" not in Toy._allowed_keys()


@pytest.mark.parametrize(
    ("annotation", "kind"),
    [
        (int, "number"),
        (float, "number"),
        (bool, "bool"),
        (int | None, "number"),
        (float | None, "number"),
        (bool | None, "bool"),
        (int | float, "number"),
        (int | str, None),
        (int | bool, None),
        (str, None),
        (list[int], None),
        (None, None),
    ],
)
def test_scalar_kind(annotation: Any, kind: str | None) -> None:
    assert scalar_kind(annotation) == kind


F = Toy.model_fields


@pytest.mark.parametrize(
    ("value", "field"),
    [
        (5, "count"),
        (0, "free"),
        (MAX_NUMBER, "free"),
        (-(2**40), "free"),  # no lower bound of MAX_NUMBER's: the field's own ge says
        (2**40, "count"),  # a field with its own upper bound: pydantic's le says
        (2**40, "above"),  # a field with its own lt bound: pydantic's lt says
        (float(MAX_NUMBER), "free_float"),
        (float("inf"), "free_float"),  # not finite: pydantic's finite_number says
        (True, "flag"),
        (False, "flag"),
        ("1", "flag"),  # text: pydantic's own bool parsing
        (True, "label"),  # not a number or bool field
        (1, "label"),
        (None, "free_float"),
        (2**40, "missing"),  # no field of that name
    ],
)
def test_scalar_checked_lets_through(value: Any, field: str) -> None:
    assert scalar_checked(value, F.get(field)) is value


@pytest.mark.parametrize(
    ("value", "field", "kind", "message"),
    [
        (True, "count", "bool_for_number", "expected a number, not true/false"),
        (False, "free_float", "bool_for_number", "expected a number, not true/false"),
        (1, "flag", "number_for_bool", "expected true or false, not a number"),
        (0, "flag", "number_for_bool", "expected true or false, not a number"),
        (1.0, "flag", "number_for_bool", "expected true or false, not a number"),
        (MAX_NUMBER + 1, "free", "less_than_equal", f"must be at most {MAX_NUMBER}"),
        (float(MAX_NUMBER) + 1, "free_float", "less_than_equal", f"must be at most {MAX_NUMBER}"),
        (1e18, "free", "less_than_equal", f"must be at most {MAX_NUMBER}"),
    ],
)
def test_scalar_checked_refuses(value: Any, field: str, kind: str, message: str) -> None:
    with pytest.raises(Exception) as err:
        scalar_checked(value, F[field])
    assert (err.value.type, err.value.message()) == (kind, message)  # type: ignore[attr-defined]


# --- how paths, values and issues are written ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("loc", "path"),
    [
        ((), ""),
        (("pools",), "pools"),
        (("pools", "reasoning", "nodes", 1), "pools.reasoning.nodes[1]"),
        ((0,), "[0]"),
        (("a", 0, 2, "b"), "a[0][2].b"),
    ],
)
def test_key_path(loc: tuple[Any, ...], path: str) -> None:
    assert key_path(loc) == path


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (True, "true"),
        (False, "false"),
        (None, "null"),
        (0, "0"),
        ("", "''"),
        ("x", "'x'"),
        (datetime.date(2026, 1, 2), "2026-01-02"),
        (datetime.datetime(2026, 1, 2, 3, 4, 5), "2026-01-02T03:04:05"),
        ([1], "[1]"),
    ],
)
def test_shown(value: Any, text: str) -> None:
    assert shown(value) == text


def test_issues_and_the_error_that_carries_them() -> None:
    assert str(SpecIssue("pools.chat", "is wrong")) == "pools.chat: is wrong"
    assert str(SpecIssue("", "the stack is empty")) == "the stack is empty"
    issues = [SpecIssue("a", "one"), SpecIssue("b", "two")]
    err = SpecError(issues)
    assert err.issues is issues
    assert str(err) == "a: one\nb: two"
