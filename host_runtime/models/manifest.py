"""A model's manifest (pure): what the store knows of one GGUF, kept beside it as JSON. A model is in the store
exactly when its manifest is: the manifest is written last, atomically, after the file is complete and checked."""

from __future__ import annotations

import json
import re
from dataclasses import MISSING, asdict, dataclass, fields
from typing import Annotated

from pydantic import Field

from host_runtime.models.errors import StoreError
from host_runtime.placement.gguf_split import set_stem

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
NAME_WORDS = "a model name (1-128 letters, digits, '.', '_' or '-', starting with a letter or digit)"
ModelName = Annotated[str, Field(pattern=NAME_RE.pattern, description=NAME_WORDS)]  # box.toml's model.name too


def check_name(name: str, what: str = "--name") -> str:
    if not NAME_RE.match(name or "") or name.endswith(".partial"):
        raise StoreError(f"{what}: {name!r} is not {NAME_WORDS}")
    return name


def name_for_file(filename: str) -> str:
    """The default name: the file's name without .gguf or .bin (a Whisper model's), as the served model's id; a
    split GGUF's first part without its -00001-of-0000N."""
    stem = set_stem(filename) if filename.lower().endswith(".gguf") else filename
    for suffix in (".gguf", ".bin"):
        if stem.lower().endswith(suffix):
            stem = stem[: -len(suffix)]
    return re.sub(r"[^A-Za-z0-9._-]", "-", stem).lstrip("._-")[:128] or "model"


@dataclass(frozen=True)
class Manifest:
    name: str
    file: str              # the GGUF's file name inside the model's directory
    sha256: str
    size: int
    architecture: str
    quantization: str      # the GGUF's general.file_type, by name (Q4_1, F16, ...)
    context_length: int    # what the model was trained for (llama's n_ctx_train)
    chat_template: bool    # whether the GGUF carries one (else ChatML is used)
    source: str            # where it came from: a URL, hf://..., a local path, or "image"
    added_at: str          # ISO 8601, UTC
    pinned: bool = False   # never unloaded to make room, never removed without --force
    pooling: str = ""      # an embedding model's pooling (mean, cls, last, rank); '' for a generating model
    projector: str = ""    # its projector's file in the model's directory (serve --mmproj); '' for none
    projector_takes: str = ""  # what the projector takes: vision, audio, or vision,audio
    # A split GGUF's further parts, in order: {"file", "sha256", "size"} each (`file`, `sha256` are the first
    # part's; `size` is all of them together). Empty for a model in one file.
    parts: tuple = ()

    def files(self) -> list[tuple[str, str, int]]:
        """(file, sha256, size) of each of the model's files: one, or a split GGUF's parts in order."""
        rest = [(p["file"], p["sha256"], p["size"]) for p in self.parts]
        return [(self.file, self.sha256, self.size - sum(size for _, _, size in rest)), *rest]

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> "Manifest":
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise StoreError(f"a manifest is not JSON: {exc}") from None
        known = {f.name for f in fields(cls)}
        missing = sorted(f.name for f in fields(cls) if f.name not in doc and f.default is MISSING)
        if not isinstance(doc, dict) or missing:
            raise StoreError(f"a manifest lacks {', '.join(missing) or 'an object'}")
        parts = doc.get("parts", [])
        if not isinstance(parts, list) or not all(
                isinstance(p, dict) and isinstance(p.get("file"), str) and isinstance(p.get("sha256"), str)
                and isinstance(p.get("size"), int) for p in parts):
            raise StoreError("a manifest's parts are not a list of {file, sha256, size}")
        return cls(**{k: v for k, v in doc.items() if k in known and k != "parts"},
                   parts=tuple({"file": p["file"], "sha256": p["sha256"], "size": p["size"]} for p in parts))
