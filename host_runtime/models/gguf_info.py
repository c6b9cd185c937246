"""What a GGUF says about itself (architecture, quantization, context, chat template, pooling), read with ggml's
own reader (or the `gguf` package's) without loading weights; a file that is not a GGUF, or is cut short, is refused here."""

from __future__ import annotations

from pathlib import Path

from host_runtime.models.errors import StoreError


def read_info(path: Path) -> dict:
    import gguf

    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as exc:
        raise StoreError(f"{path}: {exc.strerror or exc}") from None
    if magic != b"GGUF":
        raise StoreError(f"{path.name} is not a GGUF file (it starts with {magic!r})")
    from host_runtime.placement import gguf_c

    try:
        if gguf_c.available():  # ggml's own reader: milliseconds, where the gguf package takes seconds
            with gguf_c.GGUFTable(path) as table:
                arch, file_type, context, pooling, has_template = _facts(table.value)
                end = table.data_end()
        else:
            from host_runtime.placement.model_table import _field

            reader = gguf.GGUFReader(str(path), "r")
            arch, file_type, context, pooling, has_template = _facts(lambda key: _field(reader, key))
            end = max((int(t.data_offset) + int(t.n_bytes) for t in reader.tensors), default=0)
    except (ValueError, KeyError, IndexError, OSError) as exc:
        raise StoreError(f"{path.name} is not a readable GGUF file: {exc}") from None
    if not arch:
        raise StoreError(f"{path.name} has no general.architecture: not a model GGUF")
    if end > path.stat().st_size:
        raise StoreError(f"{path.name} is cut short: its tensors end at byte {end}, the file has "
                         f"{path.stat().st_size}")
    try:
        quant = gguf.LlamaFileType(int(file_type)).name.removeprefix("MOSTLY_") if file_type is not None else "unknown"
    except ValueError:
        quant = f"type {file_type}"
    return {"architecture": str(arch), "quantization": quant, "context_length": int(context or 0),
            "chat_template": has_template, "pooling": pooling_name(pooling)}


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


def _facts(value) -> tuple:
    """(architecture, file type, trained context, pooling type, chat template present) through value(key)."""
    arch = value("general.architecture")
    return (arch, value("general.file_type"), value(f"{arch}.context_length") if arch else None,
            value(f"{arch}.pooling_type") if arch else None, value("tokenizer.chat_template") is not None)
