"""What a GGUF file's header says about its model: the architecture llama.cpp will build and its tensor bytes.

Read with the `gguf` package (the reader llama.cpp's own Python tooling uses), not a parser of ours. Only
the header is needed: the reader below keeps the package's parsing of the key/value metadata and the
tensor infos and skips mapping the tensor data, so a header-only copy of a file (`head -c 64M
model.gguf > header.gguf`) reads the same as the whole file.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, ReaderField, ReaderTensor

# The architectures whose attention this module can size, by the GGUF `general.architecture` name.
KNOWN_ARCHS = frozenset({"llama", "qwen2", "qwen2moe", "qwen3", "qwen3moe", "deepseek2", "mistral3"})


class _HeaderReader(GGUFReader):
    """GGUFReader that builds tensor infos without mapping their data (the file may be only its header)."""

    def _build_tensors(self, start_offs: int, fields: list[ReaderField]) -> None:
        tensors = []
        for fld in fields:
            _name_len, name_data, _n_dims, dims, raw_dtype, offset_tensor = fld.parts
            ggml_type = GGMLQuantizationType(raw_dtype[0])
            n_elems = int(np.prod(dims))
            block_size, type_size = GGML_QUANT_SIZES[ggml_type]
            tensors.append(
                ReaderTensor(
                    name=str(bytes(name_data), encoding="utf-8"),
                    tensor_type=ggml_type,
                    shape=dims,
                    n_elements=n_elems,
                    n_bytes=n_elems * type_size // block_size,
                    data_offset=int(start_offs + offset_tensor[0]),
                    data=np.empty(0, np.uint8),
                    field=fld,
                )
            )
        self.tensors = tensors


@dataclass(frozen=True)
class GgufModel:
    """The header of one GGUF file (or the first shard of a split model)."""

    path: str
    arch: str  # general.architecture
    name: str
    file_type: int | None  # general.file_type (llama_ftype), None when absent
    split_count: int  # split.count: shards of the model (1: one file)
    block_count: int
    embedding_length: int
    context_length: int
    head_count: int
    head_count_kv: int
    key_length: int  # per-head K width in the cache ({arch}.attention.key_length)
    value_length: int  # per-head V width in the cache
    mla: bool  # key_length_mla present: llama.cpp caches only K (the latent + rope key), no V
    feed_forward_length: int  # dense MLP width
    expert_count: int
    expert_used_count: int
    expert_feed_forward_length: int  # width of one routed expert (0: not MoE)
    vocab_size: int
    tensor_bytes: Mapping[str, int]  # tensor name -> bytes in this file

    def kv_bytes_per_token_per_layer(self, element_bytes: float) -> float:
        """KV cache bytes of one token in one layer, as llama.cpp's kv cache allocates it
        (src/llama-kv-cache.cpp: K of head_count_kv x key_length, and V only without MLA)."""
        k = self.head_count_kv * self.key_length
        v = 0 if self.mla else self.head_count_kv * self.value_length
        return (k + v) * element_bytes

    @property
    def total_bytes(self) -> int:
        """Tensor bytes in this file (all of the model's when split_count is 1)."""
        return sum(self.tensor_bytes.values())

    def layer_bytes(self, index: int) -> int:
        """Bytes of decoder block `index` (tensors named blk.<index>.*)."""
        prefix = f"blk.{index}."
        return sum(b for n, b in self.tensor_bytes.items() if n.startswith(prefix))

    def bytes_named(self, *names: str) -> int:
        """Bytes of the tensors with exactly these names (e.g. token_embd.weight, output.weight)."""
        return sum(self.tensor_bytes.get(n, 0) for n in names)


def _scalar(fields: Mapping[str, ReaderField], key: str, default: Any = None) -> Any:
    f = fields.get(key)
    if f is None:
        return default
    value = f.contents()
    # Per-layer arrays (e.g. head_count_kv of models with uneven layers): the largest is what sizes the cache.
    return max(value) if isinstance(value, list) and value and isinstance(value[0], (int, float)) else value


def read_gguf(path: str | Path) -> GgufModel:
    """The model a GGUF header describes; ValueError when it is not a GGUF or not an architecture we size."""
    try:
        reader = _HeaderReader(str(path))
    except (ValueError, OSError, IndexError, KeyError) as err:
        raise ValueError(f"{path}: not a readable GGUF file ({err})") from None
    f = reader.fields
    arch = str(_scalar(f, "general.architecture", ""))
    if arch not in KNOWN_ARCHS:
        raise ValueError(
            f"{path}: GGUF architecture {arch!r} is not one the planner sizes; known: {', '.join(sorted(KNOWN_ARCHS))}"
        )

    def key(name: str, default: Any = None) -> Any:
        return _scalar(f, f"{arch}.{name}", default)

    heads = int(key("attention.head_count"))
    embd = int(key("embedding_length"))
    head_dim = embd // heads
    vocab = f.get("tokenizer.ggml.tokens")
    tokens = len(vocab.data) if vocab is not None else int(key("vocab_size", 0))
    return GgufModel(
        path=str(path),
        arch=arch,
        name=str(_scalar(f, "general.name", "")),
        file_type=None if f.get("general.file_type") is None else int(_scalar(f, "general.file_type")),
        split_count=int(_scalar(f, "split.count", 1)),
        block_count=int(key("block_count")),
        embedding_length=embd,
        context_length=int(key("context_length", 0)),
        head_count=heads,
        head_count_kv=int(key("attention.head_count_kv", heads)),
        key_length=int(key("attention.key_length", head_dim)),
        value_length=int(key("attention.value_length", head_dim)),
        mla=f.get(f"{arch}.attention.key_length_mla") is not None,
        feed_forward_length=int(key("feed_forward_length", 0)),
        expert_count=int(key("expert_count", 0)),
        expert_used_count=int(key("expert_used_count", 0)),
        expert_feed_forward_length=int(key("expert_feed_forward_length", 0)),
        vocab_size=tokens,
        tensor_bytes={t.name: int(t.n_bytes) for t in reader.tensors},
    )
