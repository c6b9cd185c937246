"""The KV cache's value types, by llama-server's names (--cache-type-k / --cache-type-v): their ggml type and
size, for the planner's arithmetic and llama.cpp's context parameters (pure)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KVType:
    name: str
    ggml_type: int     # ggml.h's enum ggml_type
    block: int         # values per block
    block_bytes: int   # bytes per block

    @property
    def quantized(self) -> bool:
        return self.block > 1

    def row_bytes(self, width: int) -> int:
        """Bytes of `width` values (a quantized row is whole blocks: llama.cpp refuses a width they do not divide)."""
        return -(-width // self.block) * self.block_bytes


# llama-server's allowed values (common/arg.cpp kv_cache_types), with ggml's sizes (ggml.c type_traits).
KV_TYPES = {t.name: t for t in (
    KVType("f32", 0, 1, 4), KVType("f16", 1, 1, 2), KVType("bf16", 30, 1, 2), KVType("q8_0", 8, 32, 34),
    KVType("q4_0", 2, 32, 18), KVType("q4_1", 3, 32, 20), KVType("iq4_nl", 20, 32, 18), KVType("q5_0", 6, 32, 22),
    KVType("q5_1", 7, 32, 24))}
DEFAULT_KV = ("f16", "f16")


def kv_type(name: str) -> KVType:
    try:
        return KV_TYPES[name]
    except KeyError:
        raise ValueError(f"not a KV cache type: {name!r} (one of {', '.join(KV_TYPES)})") from None


def needs_flash_attention(types: tuple[str, str]) -> bool:
    """llama.cpp stores V transposed without flash attention, which a quantized V cannot be; and a quantized K
    is read by flash attention's one per-row kernel on the CPU in every shape (no split over the KV cells, no
    tiles: both need F16 or F32 K and V), which keeps a request's output the same alone or batched."""
    return kv_type(types[0]).quantized or kv_type(types[1]).quantized


def per_row_attention(types: tuple[str, str]) -> bool:
    """Whether llama.cpp's CPU flash attention computes each query row alone, over every KV cell in one pass, in
    every shape (its split over the cells for one query row and its tiles for many both need K and V of the
    same F16 or F32 type): a row's result is then the same whatever else the call holds."""
    return types[0] not in ("f16", "f32") or types[0] != types[1]
