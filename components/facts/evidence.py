"""How sure a fact is, and where it comes from: every engine and image fact carries one."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Evidence(str, Enum):
    """The strength of a fact, weakest last."""

    OBSERVED = "observed"  # a user's report on real hardware (an issue, a log)
    CODE = "read from code"  # the engine's source, build files or package metadata, read without a GPU
    UNVERIFIED = "unverified"  # inferred, transcribed, or stated by a pool for a private build


@dataclass(frozen=True)
class Sourced:
    """Where one fact comes from and how strong it is."""

    source: str
    evidence: Evidence

    def __str__(self) -> str:
        return f"{self.source} [{self.evidence.value}]"


def observed(source: str) -> Sourced:
    """A fact seen on real hardware by a user (cite the issue or log)."""
    return Sourced(source, Evidence.OBSERVED)


def code(source: str) -> Sourced:
    """A fact read from the engine's code, build files or package metadata (cite file:line)."""
    return Sourced(source, Evidence.CODE)


def unverified(source: str) -> Sourced:
    """A fact nobody has checked (say who claims it)."""
    return Sourced(source, Evidence.UNVERIFIED)
