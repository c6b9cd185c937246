"""An embedding model's pooling, by name, from its GGUF's `<arch>.pooling_type`: what the engine loads it with
and what the store lists it as (models/gguf_info.py reads it from there)."""

from __future__ import annotations


def pooling_name(value) -> str:
    """An embedding model's pooling ('mean', 'cls', 'last', 'rank'); '' for a generating model (none declared)."""
    import gguf

    if value is None:
        return ""
    try:
        kind = gguf.PoolingType(int(value))
    except ValueError:
        return f"type {value}"
    return "" if kind == gguf.PoolingType.NONE else kind.name.lower()
