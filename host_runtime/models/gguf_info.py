"""What a GGUF says about itself (architecture, quantization, context, chat template, pooling), read with ggml's
own reader (or the `gguf` package's) without loading weights; a file that is not a GGUF, or is cut short, is refused here.

A GGUF is anyone's file (a download, a USB stick), and ggml's reader is C: run by root (`models pull` or `models
add` from a root shell), it reads in a child process as an unprivileged user, from the file root opened, so a
crafted header that breaks the reader breaks nothing root holds (hardening #35, item 6)."""

from __future__ import annotations

import json
import os
import pwd
import select
import time
from pathlib import Path

from host_runtime.common.service_user import service_ids
from host_runtime.models.errors import StoreError
from host_runtime.placement import gguf_c

CHILD_TIMEOUT_S = 120.0  # the header of a large model reads in well under a second; a stuck reader is a refusal


def read_info(path: Path) -> dict:
    import gguf

    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as exc:
        raise StoreError(f"{path}: {exc.strerror or exc}") from None
    if magic != b"GGUF":
        raise StoreError(f"{path.name} is not a GGUF file (it starts with {magic!r})")

    try:
        if gguf_c.available() and os.geteuid() == 0:
            doc = _facts_unprivileged(path)
            arch, file_type, context, pooling, has_template, end = (
                doc["architecture"], doc["file_type"], doc["context_length"], doc["pooling"], doc["chat_template"],
                doc["data_end"])
        elif gguf_c.available():  # ggml's own reader: milliseconds, where the gguf package takes seconds
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


def unprivileged_ids() -> tuple[int, int]:
    """Who reads for root: the services' user, or nobody where that does not exist (a developer's machine)."""
    ids = service_ids()
    if ids is None:
        entry = pwd.getpwnam("nobody")
        ids = (entry.pw_uid, entry.pw_gid)
    return ids


def _facts_unprivileged(path: Path) -> dict:
    """_facts, the data's end and the reader's uid, read by a forked child that has become an unprivileged user, from the file root
    opened (the child need not be able to open it). Forked, not executed: the child needs no interpreter it can
    run, only the reader already loaded."""
    uid, gid = unprivileged_ids()
    with open(path, "rb") as file:
        readable, writable = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            code = 1
            try:
                os.close(readable)
                os.setgroups([])
                os.setgid(gid)
                os.setuid(uid)
                with gguf_c.GGUFTable(fd=file.fileno()) as table:
                    arch, file_type, context, pooling, has_template = _facts(table.value)
                    doc = {"architecture": arch, "file_type": file_type, "context_length": context,
                           "pooling": pooling, "chat_template": has_template, "data_end": table.data_end(),
                           "reader_uid": os.getuid()}
                os.write(writable, json.dumps(doc).encode())
                code = 0
            except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent as text
                os.write(writable, f"!{exc}".encode(errors="replace")[:4000])
            finally:
                os._exit(code)
        os.close(writable)
        try:
            answer = _read_all(readable, CHILD_TIMEOUT_S)
        finally:
            os.close(readable)
            if answer is None:
                os.kill(pid, 9)
            _, status = os.waitpid(pid, 0)
    if answer is None:
        raise StoreError(f"{path.name}: ggml's reader took over {CHILD_TIMEOUT_S:.0f} s on its header: not a "
                         "readable GGUF file")
    if os.WIFSIGNALED(status):
        raise StoreError(f"{path.name} is not a readable GGUF file: ggml's reader died on it (signal "
                         f"{os.WTERMSIG(status)})")
    text = answer.decode(errors="replace")
    if text.startswith("!") or os.WEXITSTATUS(status) != 0:
        raise StoreError(f"{path.name} is not a readable GGUF file: {text.lstrip('!') or 'no reason given'}")
    doc = json.loads(text)
    if doc["reader_uid"] == 0:  # the child did not give up root: do not trust that it ran as asked
        raise StoreError(f"{path.name}: the GGUF reader still ran as root; refusing to read it")
    return doc


def _read_all(fd: int, timeout_s: float) -> bytes | None:
    """Everything written to the pipe until its writer closes it; None past the timeout."""
    deadline = time.monotonic() + timeout_s
    parts = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return None
        chunk = os.read(fd, 65536)
        if not chunk:
            return b"".join(parts)
        parts.append(chunk)
