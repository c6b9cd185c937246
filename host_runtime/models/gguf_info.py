"""What a GGUF says about itself (architecture, quantization, context, chat template, pooling), read with ggml's
own reader (or the `gguf` package's) without loading weights; a file that is not a GGUF, or is cut short, is refused here.

A GGUF is anyone's file (a download, a USB stick, a client's pull), and ggml's reader is C: it reads in a forked
child, from the file its caller opened, as an unprivileged user where the caller is root (`models pull`, `models
add`, the console's verdicts), so a crafted header that breaks the reader breaks nothing root or the API's worker
holds (hardening #35, item 6; #56, item 3). Forked, not executed: the child needs no interpreter it can run (a
developer's Python may sit in root's home), only the reader already loaded. The child calls ggml's reader, json
and os.write, no lock another thread of a threaded caller (the console, the API worker) could hold; a child that
hangs all the same is killed at CHILD_TIMEOUT_S."""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import pwd
import select
import time
from pathlib import Path

from host_runtime.common.service_user import service_ids
from host_runtime.engine.pooling import pooling_name
from host_runtime.models.errors import StoreError
from host_runtime.placement import gguf_c
from host_runtime.placement.gguf_split import SPLIT_COUNT, SPLIT_NO
from host_runtime.placement.model_table import ModelTable, ModelTableError, open_parts, read_table_fd
from host_runtime.placement.whisper_file import read_shape

CHILD_TIMEOUT_S = 120.0  # the header of a large model reads in well under a second; a stuck reader is a refusal


def read_info(path: Path) -> dict:
    import gguf

    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as exc:
        raise StoreError(f"{path}: {exc.strerror or exc}") from None
    if magic == WHISPER_MAGIC:
        return _whisper_info(path)
    if magic != b"GGUF":
        # Its bytes are not said: through /api/pull they would tell a client what a server it cannot reach holds.
        raise StoreError(f"{path.name} is not a GGUF file (it does not begin with GGUF's magic: a web page or "
                         "another kind of file?)")

    try:
        doc = _header(path)
        arch, file_type, context, pooling, has_template, end = (
            doc["architecture"], doc["file_type"], doc["context_length"], doc["pooling"], doc["chat_template"],
            doc["data_end"])
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


WHISPER_MAGIC = b"lmgg"  # whisper.cpp's model file: ggml's legacy magic, little-endian


def _whisper_info(path: Path) -> dict:
    """A Whisper model's facts (a speech model: no context, template or pooling of a chat model's). A file cut
    short is whisper.cpp's to find at load (its tensors' sizes follow a vocabulary of varying length)."""
    shape = read_shape(path)
    if shape is None:
        raise StoreError(f"{path.name} begins as a whisper.cpp model but its header is not one")
    return {"architecture": "whisper", "quantization": shape.quantization, "context_length": 0,
            "chat_template": False, "pooling": ""}


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


def _facts_doc(value, data_end: int) -> dict:
    """_facts, the data's end and the split keys through value(key), as JSON types."""
    arch, file_type, context, pooling, has_template = _facts(value)
    return {"architecture": arch, "file_type": file_type, "context_length": context, "pooling": pooling,
            "chat_template": has_template, "data_end": data_end,
            "split_no": value(SPLIT_NO), "split_count": value(SPLIT_COUNT)}


def facts_from_fd(fd: int) -> dict:
    """_facts_doc of the GGUF open at `fd` (read from its start)."""
    with gguf_c.GGUFTable(fd=fd) as table:
        return _facts_doc(table.value, table.data_end())


def _header(path: Path) -> dict:
    """_facts_doc of the GGUF at `path`: through ggml's own reader in its isolated child (milliseconds), or the
    gguf package's where libggml-base cannot be loaded (seconds)."""
    if gguf_c.available():
        return read_isolated(path, "facts")
    import gguf

    from host_runtime.placement.model_table import _field

    reader = gguf.GGUFReader(str(path), "r")
    return _facts_doc(lambda key: _field(reader, key),
                      max((int(t.data_offset) + int(t.n_bytes) for t in reader.tensors), default=0))


def check_part(path: Path, number: int, count: int) -> None:
    """A further part of a split GGUF (number from 2): it says it is that part of that many, and is whole.
    StoreError otherwise."""
    try:
        doc = _header(path)
    except (ValueError, KeyError, IndexError, OSError) as exc:
        raise StoreError(f"{path.name} is not a readable GGUF file: {exc}") from None
    no, total, end = doc["split_no"], doc["split_count"], doc["data_end"]
    if no != number - 1 or total != count:
        raise StoreError(f"{path.name} is not part {number} of {count} of a split GGUF")
    if end > path.stat().st_size:
        raise StoreError(f"{path.name} is cut short: its tensors end at byte {end}, the file has "
                         f"{path.stat().st_size}")


def read_table_isolated(path: Path) -> ModelTable:
    """The tensor table of a GGUF someone supplied (a client, the network, a USB stick), read in the reader's own
    process; StoreError where it is not one."""
    try:
        return ModelTable.from_json(read_isolated(path, "table"))
    except ModelTableError as exc:
        raise StoreError(str(exc)) from None


def read_isolated(path: Path, what: str) -> dict:
    """facts_from_fd (`what` "facts") or the tensor table's to_json ("table") of the file at `path`, opened here
    and read by a forked child, with the uid it read as; the child becomes an unprivileged user (unprivileged_ids)
    where this process is root. Its answer is JSON, checked here: never pickle from a process that read untrusted
    bytes."""
    ids = unprivileged_ids() if os.geteuid() == 0 else None
    try:
        file = open(path, "rb")
    except OSError as exc:
        raise StoreError(f"{path.name}: {exc.strerror or exc}") from None
    with file, contextlib.ExitStack() as stack:
        parts: list = []
        if what == "table":  # a split GGUF's further parts, opened here too (the child opens nothing)
            try:
                parts = stack.enter_context(open_parts(path))[1:]
            except ModelTableError as exc:
                raise StoreError(str(exc)) from None
        readable, writable = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            code = 1
            try:
                faulthandler.disable()  # a reader that dies is the answer (a refusal), not a traceback to print
                os.close(readable)
                if ids is not None:
                    os.setgroups([])
                    os.setgid(ids[1])
                    os.setuid(ids[0])
                doc = facts_from_fd(file.fileno()) if what == "facts" else \
                    read_table_fd(file.fileno(), path.name, tuple(f.fileno() for f in parts)).to_json()
                os.write(writable, json.dumps({**doc, "reader_uid": os.getuid()}).encode())
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
    try:
        doc = json.loads(text)
    except ValueError:
        raise StoreError(f"{path.name}: the GGUF reader's answer is not JSON") from None
    if not isinstance(doc, dict) or (ids is not None and doc.get("reader_uid") != ids[0]):
        # the child did not become the user it was made: do not trust that it ran as asked
        raise StoreError(f"{path.name}: the GGUF reader did not run as the unprivileged user; refusing to read it")
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
