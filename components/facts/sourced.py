"""What every image-facts table entry shares: a source for each fact field, its reference, its citations."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import ClassVar

from components.facts.evidence import Sourced


class SourcedImage:
    """Mixin of the frozen image-facts dataclasses (vLLM, LMDeploy, llama.cpp): an entry that leaves a fact
    field without a source is refused when the table is built."""

    # Fields that identify an entry rather than state a fact about it.
    IDENTITY: ClassVar[frozenset[str]] = frozenset(
        {"engine", "version", "build", "repo", "tag", "variant", "sources", "note"}
    )
    repo: str
    tag: str
    sources: Mapping[str, Sourced]

    def __post_init__(self) -> None:
        missing = [
            f.name
            for f in fields(self)
            if f.name not in self.IDENTITY  # type: ignore[arg-type]
            and f.name not in self.sources
        ]
        if missing:
            raise ValueError(f"image facts {self.ref}: no source for {', '.join(missing)}")

    @property
    def ref(self) -> str:
        """The image reference, `repo:tag` (`repo` alone for an untagged one)."""
        return f"{self.repo}:{self.tag}" if self.tag else self.repo

    def source(self, name: str) -> Sourced:
        """Where the fact `name` comes from."""
        return self.sources[name]

    def cite(self, name: str) -> str:
        """'<source> [evidence]' of a fact, for messages."""
        return str(self.sources[name])


def image_ref_key(ref: str) -> str:
    """'docker.io/vllm/vllm-openai:v0.19.1@sha256:…' -> 'vllm/vllm-openai:v0.19.1' (the table's key)."""
    ref = ref.split("@", 1)[0]
    for prefix in ("docker.io/", "index.docker.io/", "registry-1.docker.io/"):
        if ref.startswith(prefix):
            ref = ref[len(prefix) :]
    return ref.removeprefix("library/")


def split_tag(ref: str) -> tuple[str, str]:
    """'registry.local:5000/vllm-volta:v1' -> ('registry.local:5000/vllm-volta', 'v1'); an untagged reference
    has the tag '' (a registry's port is not a tag)."""
    repo, sep, tag = ref.rpartition(":")
    return (repo, tag) if sep and "/" not in tag else (ref, "")
