"""Models by short name (`qwen3:8b`, as Ollama names them): the shipped catalog (models/catalog_shipped.py) and the
owner's own (a TOML file of the same shape: EVERYCYCLE_CATALOG, else $EVERYCYCLE_STATE_DIR/catalog.toml), read and
checked by one pydantic model, and a name resolved to the pull source it stands for (hf://OWNER/REPO:QUANT, or
hf://OWNER/REPO/FILE). Pure but for reading the owner's file."""

from __future__ import annotations

import functools
import os
import re
import tomllib
from pathlib import Path
from typing import Annotated, Literal

import pydantic
from pydantic import Field

from host_runtime.models.catalog_shipped import SHIPPED
from host_runtime.models.errors import SourceRefused
from host_runtime.models.hub_search import LIKELY_FITS, by_size

SHORT_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
Ability = Literal["tools", "reasoning", "vision", "embeddings", "rerank", "fim", "speech"]
Quant = Annotated[str, Field(pattern=r"^(I?Q\d\w*|F16|BF16|F32|MXFP4)$")]
DEFAULT_TAG = "latest"


class Entry(pydantic.BaseModel):
    """One catalog model: a name and tag (`qwen3:8b`), where it is, what it can do, its license and why it is in."""
    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    name: Annotated[str, Field(pattern=SHORT_NAME.pattern)]
    tag: Annotated[str, Field(pattern=SHORT_NAME.pattern)]
    repo: Annotated[str, Field(pattern=r"^[\w.-]+/[\w.-]+$")]
    quants: tuple[Quant, ...] = ()
    file: Annotated[str, Field(pattern=r"^[\w./-]+\.(gguf|bin)$")] | None = None
    size_gb: Annotated[float, Field(gt=0)]  # the default file's size, about (the header's verdict is exact)
    context: Annotated[int, Field(ge=0)]
    can: tuple[Ability, ...]
    license: Annotated[str, Field(min_length=1)]
    why: Annotated[str, Field(min_length=10)]

    @pydantic.model_validator(mode="after")
    def _one_way_to_the_file(self) -> "Entry":
        if bool(self.quants) == bool(self.file):
            raise ValueError("give quants (the repository's quantizations, the default first) or file, not both")
        return self

    @property
    def full_name(self) -> str:
        return f"{self.name}:{self.tag}"

    @property
    def store_name(self) -> str:
        """The store's name for it (a store name has no ':'): qwen3-8b; Ollama's handlers read qwen3:8b as it."""
        return store_name(self.full_name)

    def source(self, quant: str | None = None) -> str:
        if self.file:
            return f"hf://{self.repo}/{self.file}"
        chosen = quant or self.quants[0]
        if chosen.upper() not in self.quants:
            raise SourceRefused(f"{self.full_name} comes in {', '.join(self.quants)}, not {chosen}")
        return f"hf://{self.repo}:{chosen.upper()}"


class Catalog(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    model: list[Entry]

    @pydantic.model_validator(mode="after")
    def _names_unique(self) -> "Catalog":
        names = [e.full_name for e in self.model]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"names given twice: {', '.join(twice)}")
        return self


def store_name(name: str) -> str:
    """NAME:TAG as the store names it (NAME-TAG; NAME for the latest tag)."""
    base, _, tag = name.partition(":")
    return base if not tag or tag == DEFAULT_TAG else f"{base}-{tag}"


def catalog_name(stored: str) -> str | None:
    """The catalog name a store name was pulled by (qwen3-8b: qwen3:8b; qwen3-8b-q8_0: qwen3:8b-q8_0), so that
    Ollama's clients list a model under the name they pulled it by; None for a name no entry makes (or where the
    owner's catalog cannot be read: the model is then listed by its store name)."""
    try:
        listed = entries()
    except SourceRefused:
        return None
    for e in listed:
        if stored == e.store_name:
            return e.full_name
        quant = stored[len(e.store_name) + 1:] if stored.startswith(e.store_name + "-") else ""
        if quant and quant.upper() in {q.upper() for q in e.quants}:
            return f"{e.full_name}-{quant}"
    return None


def parse(text: str, where: str) -> list[Entry]:
    """A catalog's entries; SourceRefused naming the entry and field at fault."""
    try:
        return Catalog.model_validate(tomllib.loads(text)).model
    except tomllib.TOMLDecodeError as exc:
        raise SourceRefused(f"{where}: not TOML: {exc}") from None
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        at = ".".join(str(p) for p in first["loc"])
        raise SourceRefused(f"{where}: {at}: {first['msg']}") from None


def owners_file() -> Path | None:
    given = os.environ.get("EVERYCYCLE_CATALOG")
    if given:
        return Path(given)
    state = os.environ.get("EVERYCYCLE_STATE_DIR")
    return Path(state) / "catalog.toml" if state else None


def entries() -> list[Entry]:
    """The shipped entries, then the owner's, whose entry wins on a name both give. Each file is parsed once while
    it is unchanged: Ollama's listing asks for every model it lists."""
    shipped = _parsed(SHIPPED, "the shipped catalog")
    path = owners_file()
    try:
        st = path.stat() if path is not None else None
    except OSError:
        st = None
    if path is None or st is None or not path.is_file():
        return list(shipped)
    own = _owners(str(path), st.st_mtime_ns, st.st_size)
    mine = {e.full_name for e in own}
    return [e for e in shipped if e.full_name not in mine] + list(own)


@functools.lru_cache(maxsize=1)
def _parsed(text: str, where: str) -> tuple[Entry, ...]:
    return tuple(parse(text, where))


@functools.lru_cache(maxsize=4)
def _owners(path: str, mtime_ns: int, size: int) -> tuple[Entry, ...]:
    """The owner's catalog as it is at this modification time and size (a change reads it again)."""
    return tuple(parse(Path(path).read_text(), path))


def resolve(name: str) -> tuple[Entry, str] | None:
    """(the entry, its pull source) for a catalog name: NAME:TAG, NAME (its `latest` tag, else its first), or
    NAME:TAG-QUANT (Ollama's way of asking a quantization: qwen3:8b-q8_0); None where the catalog has no such
    name (it may be a URL or an hf:// source)."""
    if "://" in name or "/" in name:
        return None
    base, _, tag = name.lower().partition(":")
    found = [e for e in entries() if e.name == base]
    if not found:
        return None
    if not tag or tag == DEFAULT_TAG:
        chosen = next((e for e in found if e.tag == DEFAULT_TAG), found[0])
        return chosen, chosen.source()
    for entry in found:
        if tag == entry.tag:
            return entry, entry.source()
        if tag.startswith(entry.tag + "-") and entry.quants:
            return entry, entry.source(tag[len(entry.tag) + 1:])
    raise SourceRefused(f"{name}: the catalog has {base} as {', '.join(e.full_name for e in found)}")


NOT_CHAT = {"embeddings", "rerank", "speech"}


def for_the_wizard(room_bytes: int, listed: list[Entry] | None = None) -> list[Entry]:
    """Pure: the catalog's chat models (what a box serves first) that fit `room_bytes` by their size, the largest
    (the most capable the box can run) first: by the same rule of thumb the Hub's search says "likely fits" by."""
    chat = [e for e in (entries() if listed is None else listed) if not set(e.can) <= NOT_CHAT]
    return sorted((e for e in chat if by_size(int(e.size_gb * 1e9), room_bytes) == LIKELY_FITS),
                  key=lambda e: -e.size_gb)
